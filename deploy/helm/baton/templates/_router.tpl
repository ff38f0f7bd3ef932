{{/* ---------------------------------------------------------------------------------------------
The router pods' pieces: spreading over nodes, and the probes of the router container.
--------------------------------------------------------------------------------------------- */}}

{{/* Router pods spread over nodes: a preferred anti-affinity to this release's other router pods. */}}
{{- define "baton.routerSpread" -}}
podAntiAffinity:
  preferredDuringSchedulingIgnoredDuringExecution:
    - weight: 100
      podAffinityTerm:
        topologyKey: kubernetes.io/hostname
        labelSelector:
          matchLabels:
            {{- include "baton.selectorLabels" . | nindent 12 }}
            app.kubernetes.io/component: router
{{- end }}

{{/* The router's startup probe: the pod's Ray node (raylet) is up, as KubeRay checks it; not the job. */}}
{{- define "baton.routerStartupProbe" -}}
{{- $cfg := .Values.router.probes.startup -}}
exec:
  command: ["bash", "-c", "wget -T 2 -q -O- http://localhost:52365/api/local_raylet_healthz | grep success"]
periodSeconds: {{ $cfg.periodSeconds }}
failureThreshold: {{ $cfg.failureThreshold }}
timeoutSeconds: {{ $cfg.timeoutSeconds }}
{{- end }}

{{/* The HTTP/gRPC probe handler for the router container: args (dict "root" $ "kind" "readiness" "path" "/ready"). */}}
{{- define "baton.routerProbe" -}}
{{- $p := .root.Values.router.probes -}}
{{- $cfg := index $p .kind -}}
{{- if eq $p.grpc .kind }}
grpc:
  port: {{ .root.Values.router.ports.grpc }}
{{- else }}
httpGet:
  path: {{ .path }}
  port: http
{{- end }}
periodSeconds: {{ $cfg.periodSeconds }}
failureThreshold: {{ $cfg.failureThreshold }}
timeoutSeconds: {{ $cfg.timeoutSeconds }}
{{- end }}
