{{/* ---------------------------------------------------------------------------------------------
Security pieces: secrets the chart writes (never generated), Ray token authentication, the
dashboard's address, the router's drain socket, and the emptyDirs under a read-only root filesystem.
--------------------------------------------------------------------------------------------- */}}

{{/* A Secret's value the chart writes: the given one, else the live Secret's (an upgrade), else fail.
Never generated: `helm template` (GitOps) sees no live Secret, so a generated value would change on
every render and break whatever started with the old one. Args (dict "root" $ "name" secretName
"key" dataKey "given" value "what" "the Redis password" "values" "redis.auth" "field" "password"). */}}
{{- define "baton.keptSecret" -}}
{{- if .given }}{{ .given }}{{ else }}
{{- $live := lookup "v1" "Secret" .root.Release.Namespace .name }}
{{- if and $live $live.data (hasKey $live.data .key) }}{{ index $live.data .key | b64dec }}
{{- else }}{{ fail (printf "%s: give %s: set %s.existingSecret (a Secret you manage, key %s.secretKey) or %s.%s. The chart does not generate it: under `helm template` and GitOps tools (Argo CD, Flux) it cannot read the live Secret, so a generated value would change on every render and break authentication after the next pod restart" .values .what .values .values .values .field) }}
{{- end }}
{{- end }}
{{- end }}

{{- define "baton.rayAuthSecretName" -}}
{{- if .Values.rayAuth.existingSecret }}{{ .Values.rayAuth.existingSecret }}{{ else }}{{ include "baton.fullname" . }}-ray-auth{{ end }}
{{- end }}

{{/* RAY_AUTH_MODE and RAY_AUTH_TOKEN for every container that runs Ray or talks to it. */}}
{{- define "baton.rayAuthEnv" -}}
{{- if .Values.rayAuth.enabled }}
- name: RAY_AUTH_MODE
  value: token
- name: RAY_AUTH_TOKEN
  valueFrom:
    secretKeyRef:
      name: {{ include "baton.rayAuthSecretName" . }}
      key: {{ .Values.rayAuth.secretKey }}
{{- end }}
{{- end }}

{{/* The dashboard's bind address: loopback unless exposed, or KubeRay submits through the head Service. */}}
{{- define "baton.dashboardHost" -}}
{{- if or .Values.head.exposeDashboard (eq .Values.launcher.mode "rayjob") }}0.0.0.0{{ else }}127.0.0.1{{ end }}
{{- end }}

{{/* The local socket a router replica drains on (the router pod's preStop hook). */}}
{{- define "baton.drainSocket" -}}/tmp/baton/router-drain.sock{{- end }}

{{/* Writable emptyDirs under a read-only root filesystem: /tmp, Ray's session directory /tmp/ray,
the kernel cache and $HOME. */}}
{{- define "baton.scratchVolumes" -}}
{{- range $name := list "tmp" "ray-tmp" "kernel-cache" "home" }}
- name: {{ $name }}
  emptyDir:
    {{- if and (has $name (list "tmp" "ray-tmp")) $.Values.podDefaults.tmpSizeLimit }}
    sizeLimit: {{ $.Values.podDefaults.tmpSizeLimit }}
    {{- else }} {}
    {{- end }}
{{- end }}
{{- end }}

{{- define "baton.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: ray-tmp
  mountPath: /tmp/ray
- name: kernel-cache
  mountPath: /var/cache/baton-kernels
- name: home
  mountPath: /home/baton
{{- end }}
