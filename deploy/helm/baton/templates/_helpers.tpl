{{/* ---------------------------------------------------------------------------------------------
Names and labels
--------------------------------------------------------------------------------------------- */}}

{{- define "baton.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" }}
{{- end }}

{{/* The release's base name; at most 40 characters, so that KubeRay's derived names
(<name>-head-svc, <name>-prefill-worker-xxxxx) stay within 63. */}}
{{- define "baton.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 40 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 40 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "baton.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "baton.selectorLabels" -}}
app.kubernetes.io/name: {{ include "baton.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "baton.labels" -}}
helm.sh/chart: {{ include "baton.chart" . }}
{{ include "baton.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: baton
{{- end }}

{{- define "baton.image" -}}
{{- $tag := .Values.image.tag | default (printf "%s%s" .Chart.AppVersion (ternary "-gpu" "" (eq (.Values.image.variant | default "cpu") "gpu"))) }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------
Derived settings
--------------------------------------------------------------------------------------------- */}}

{{/* Whether the model lives on the claim model.pvc.claimName: source pvc, or one the chart fills
(hf://..., pvc://...). */}}
{{- define "baton.modelOnPvc" -}}
{{- if or (eq .Values.model.source "pvc") (hasPrefix "hf://" .Values.model.source) (hasPrefix "pvc://" .Values.model.source) }}true{{ end }}
{{- end }}

{{/* Whether an init container fills the model claim first. */}}
{{- define "baton.modelFetch" -}}
{{- if or (hasPrefix "hf://" .Values.model.source) (hasPrefix "pvc://" .Values.model.source) }}true{{ end }}
{{- end }}

{{/* The model path Baton loads (config model.path). */}}
{{- define "baton.modelPath" -}}
{{- if include "baton.modelOnPvc" . }}
{{- $p := trimPrefix "/" (toString .Values.model.path) }}
{{- if or (eq $p "") (eq $p ".") }}{{ .Values.model.pvc.mountPath }}{{ else }}{{ printf "%s/%s" (trimSuffix "/" .Values.model.pvc.mountPath) $p }}{{ end }}
{{- else }}
{{- .Values.model.path }}
{{- end }}
{{- end }}

{{/* The router's drain_timeout_s (Baton's default when baton.router.drain_timeout_s is unset). */}}
{{- define "baton.drainSeconds" -}}
{{- $r := (.Values.baton | default dict).router | default dict }}
{{- if hasKey $r "drain_timeout_s" }}{{ $r.drain_timeout_s | ceil | int }}{{ else }}30{{ end }}
{{- end }}

{{/* RAY_JOB_STOP_WAIT_TIME_S: how long Ray waits between SIGTERM and SIGKILL of `baton cluster`. */}}
{{- define "baton.stopWaitSeconds" -}}
{{- if kindIs "invalid" .Values.launcher.stopWaitSeconds }}{{ add (include "baton.drainSeconds" . | int) 30 }}{{ else }}{{ .Values.launcher.stopWaitSeconds | int }}{{ end }}
{{- end }}

{{- define "baton.redisSecretName" -}}
{{- if .Values.redis.auth.existingSecret }}{{ .Values.redis.auth.existingSecret }}{{ else }}{{ include "baton.fullname" . }}-redis{{ end }}
{{- end }}

{{- define "baton.redisUrl" -}}
{{- if eq .Values.redis.mode "external" }}{{ .Values.redis.url }}{{ else }}{{ printf "redis://%s-redis:6379/0" (include "baton.fullname" .) }}{{ end }}
{{- end }}

{{/* Replicas and autoscaler bounds of a group: {replicas, min, max}, as a YAML dict. */}}
{{- define "baton.groupSize" -}}
{{- $g := . }}
{{- $min := $g.replicas }}{{ if not (kindIs "invalid" $g.minReplicas) }}{{ $min = $g.minReplicas }}{{ end }}
{{- $max := $g.replicas }}{{ if not (kindIs "invalid" $g.maxReplicas) }}{{ $max = $g.maxReplicas }}{{ end }}
replicas: {{ $g.replicas | int }}
min: {{ $min | int }}
max: {{ $max | int }}
{{- end }}

{{/* The ranks one worker of a pool spans: (list .Values role) -> its tensorParallelSize, else
baton.engine.tensor_parallel_size (the pools' default in Baton's config), else 1. */}}
{{- define "baton.tensorParallelSize" -}}
{{- $v := index . 0 }}{{ $g := index $v (index . 1) }}
{{- $engine := index ($v.baton | default dict) "engine" | default dict }}
{{- $size := 1 }}
{{- if not (kindIs "invalid" $g.tensorParallelSize) }}{{ $size = $g.tensorParallelSize }}
{{- else if kindIs "map" $engine }}{{ with index $engine "tensor_parallel_size" }}{{ $size = . }}{{ end }}
{{- end }}
{{- $size | int }}
{{- end }}

{{/* Ray resources one pod of a pool offers: {cpus, gpus} (integers; `ray start` takes no fractions). */}}
{{- define "baton.poolPodResources" -}}
{{- $g := . }}
cpus: {{ mulf $g.workersPerPod $g.cpusPerWorker | ceil | int }}
gpus: {{ mulf $g.workersPerPod $g.gpusPerWorker | ceil | int }}
{{- end }}

{{/* A Kubernetes CPU quantity in millicores, as a float's text (read it back with `float64`): a number
(2, 0.5), or a string the schema's pattern allows: "500m", "1", "1.5", "2e3", "1k". */}}
{{- define "baton.cpuMillis" -}}
{{- if kindIs "string" . }}
{{- $q := trim . }}
{{- $num := regexFind "^[0-9]+(\\.[0-9]+)?" $q }}
{{- $suffix := trimPrefix $num $q }}
{{- $unit := dict "" 1000.0 "m" 1.0 "k" 1000000.0 "M" 1000000000.0 "G" 1000000000000.0 "T" 1000000000000000.0 "P" 1000000000000000000.0 "E" 1000000000000000000000.0 "Ki" 1024000.0 "Mi" 1048576000.0 "Gi" 1073741824000.0 "Ti" 1099511627776000.0 "Pi" 1125899906842624000.0 "Ei" 1152921504606846976000.0 }}
{{- if hasKey $unit $suffix }}{{ mulf (float64 $num) (get $unit $suffix) }}{{ else }}{{ mulf (float64 $q) 1000.0 }}{{ end }}
{{- else }}
{{- mulf (float64 .) 1000.0 }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------
Checks the JSON schema cannot express; each fails with a message naming the values.
--------------------------------------------------------------------------------------------- */}}
{{- define "baton.validate" -}}
{{- $v := .Values }}
{{- range $role := list "router" "prefill" "decode" }}
{{- $g := index $v $role }}
{{- $s := include "baton.groupSize" $g | fromYaml }}
{{- if gt (int $s.min) (int $s.replicas) }}{{ fail (printf "%s.minReplicas (%d) is larger than %s.replicas (%d)" $role (int $s.min) $role (int $s.replicas)) }}{{ end }}
{{- if lt (int $s.max) (int $s.replicas) }}{{ fail (printf "%s.maxReplicas (%d) is smaller than %s.replicas (%d)" $role (int $s.max) $role (int $s.replicas)) }}{{ end }}
{{- end }}
{{- if include "baton.modelOnPvc" . }}
{{- if not $v.model.pvc.claimName }}{{ fail (printf "model.source is %s but model.pvc.claimName is empty: name the PersistentVolumeClaim that holds the model" $v.model.source) }}{{ end }}
{{- if and (include "baton.modelFetch" .) (eq (trimPrefix "/" (toString $v.model.path)) "") }}{{ fail (printf "model.source is %s: set model.path to the directory on the claim to fill (e.g. the model's name)" $v.model.source) }}{{ end }}
{{- if hasPrefix "pvc://" $v.model.source }}
{{- $claim := index (splitList "/" (trimPrefix "pvc://" $v.model.source)) 0 }}
{{- if eq $claim $v.model.pvc.claimName }}{{ fail (printf "model.source %s copies from model.pvc.claimName itself: use model.source: pvc and model.path for a model already on that claim" $v.model.source) }}{{ end }}
{{- end }}
{{- else }}
{{- if $v.model.pvc.claimName }}{{ fail "model.pvc.claimName is set but model.source is image: set model.source: pvc to mount the claim" }}{{ end }}
{{- end }}
{{- if eq $v.redis.mode "external" }}
{{- if not $v.redis.url }}{{ fail "redis.mode is external but redis.url is empty: give redis://host:port/db" }}{{ end }}
{{- if and $v.redis.auth.enabled (not $v.redis.auth.existingSecret) }}{{ fail "redis.mode is external with redis.auth.enabled: name the Secret holding the password in redis.auth.existingSecret (key redis.auth.secretKey)" }}{{ end }}
{{- else if $v.redis.url }}{{ fail "redis.url is set but redis.mode is bundled: set redis.mode: external to use your own Redis" }}{{ end }}
{{- if and (ne $v.head.serviceType "ClusterIP") (not $v.head.exposeDashboard) }}{{ fail (printf "head.serviceType is %s, which would expose the Ray head (its dashboard and Jobs API run any code on the cluster) outside it: keep ClusterIP and use kubectl port-forward, or set head.exposeDashboard: true if you really mean it" $v.head.serviceType) }}{{ end }}
{{- if $v.rayAuth.enabled }}
{{- if eq $v.launcher.mode "rayjob" }}{{ fail "launcher.mode rayjob with rayAuth.enabled: KubeRay's operator reads the RayJob's status from the Ray dashboard without the chart's token, so the job would never be seen running; use launcher.mode head, or set rayAuth.enabled: false (the NetworkPolicies still keep Ray's ports to this release's pods)" }}{{ end }}
{{- if semverCompare "<2.52.0-0" (toString $v.rayVersion) }}{{ fail (printf "rayAuth.enabled needs Ray 2.52 or newer (token authentication); rayVersion is %s: upgrade the image or set rayAuth.enabled: false" (toString $v.rayVersion)) }}{{ end }}
{{- end }}
{{- if eq (int $v.router.ports.http) (int $v.router.ports.grpc) }}{{ fail (printf "router.ports.http and router.ports.grpc are both %d: the router serves HTTP and gRPC on a port each; give them different ports" (int $v.router.ports.http)) }}{{ end }}
{{- range $g := list "prefill" "decode" }}
{{- $p := index $v $g }}
{{- $gpw := float64 $p.gpusPerWorker }}
{{- if and (gt $gpw 0.0) (not $v.image.tag) (ne ($v.image.variant | default "cpu") "gpu") }}{{ fail (printf "%s.gpusPerWorker is %v but the image is the CPU build: set image.variant: gpu (the -gpu tag), or an image.tag of a CUDA build" $g $p.gpusPerWorker) }}{{ end }}
{{- if and (gt $gpw 1.0) (ne $gpw (float64 (int $gpw))) }}{{ fail (printf "%s.gpusPerWorker (%v) must be a whole number of GPUs, or a fraction of one" $g $p.gpusPerWorker) }}{{ end }}
{{- /* A TP worker's gpusPerWorker is its ranks' total (one GPU each, on its pod: STRICT_PACK). */}}
{{- $tp := include "baton.tensorParallelSize" (list $v $g) | int }}
{{- if and (gt $gpw 0.0) (lt $gpw (float64 $tp)) }}{{ fail (printf "%s.gpusPerWorker (%v) is less than its tensor-parallel size (%d): a worker's ranks take a GPU each, all on its pod; set %s.gpusPerWorker to %d (the pod then requests workersPerPod x %d GPUs), or lower %s.tensorParallelSize" $g $p.gpusPerWorker $tp $g $tp $tp $g) }}{{ end }}
{{- if and (gt $gpw 0.0) (gt $tp 1) (ne (mod (int $gpw) $tp) 0) }}{{ fail (printf "%s.gpusPerWorker (%v) does not split into whole GPUs across its %d tensor-parallel ranks" $g $p.gpusPerWorker $tp) }}{{ end }}
{{- range $kind := list "requests" "limits" }}
{{- if hasKey (index ($p.resources | default dict) $kind | default dict) $v.gpuResourceName }}{{ fail (printf "%s.resources.%s sets %s: the chart requests workersPerPod x gpusPerWorker GPUs itself; set %s.gpusPerWorker instead" $g $kind $v.gpuResourceName $g) }}{{ end }}
{{- end }}
{{- end }}
{{- /* CPU: a pod's Kubernetes CPU must cover what its Baton actors take from Ray, and a CPU pool's
limit its torch threads; otherwise Ray places more work than the pod gets and the kubelet throttles it.
An unset request or limit is not checked (with no request, Kubernetes requests the limit). */}}
{{- range $role := list "router" "prefill" "decode" }}
{{- $g := index $v $role }}
{{- $res := $g.resources | default dict }}
{{- $rayCpus := 0.0 }}{{ $why := "" }}{{ $lower := "" }}
{{- if eq $role "router" }}
{{- $rayCpus = float64 $g.cpusPerReplica }}
{{- $why = printf "router.cpusPerReplica (%v), the CPUs each router actor takes from Ray" $g.cpusPerReplica }}
{{- $lower = "router.cpusPerReplica" }}
{{- else }}
{{- $rayCpus = round (mulf $g.workersPerPod $g.cpusPerWorker) 3 }}
{{- $why = printf "the %v CPUs the pod's workers take from Ray (%s.workersPerPod %v x %s.cpusPerWorker %v)" $rayCpus $role $g.workersPerPod $role $g.cpusPerWorker }}
{{- $lower = printf "%s.workersPerPod or %s.cpusPerWorker" $role $role }}
{{- end }}
{{- range $kind := list "requests" "limits" }}
{{- $q := index (index $res $kind | default dict) "cpu" }}
{{- if not (kindIs "invalid" $q) }}
{{- $have := include "baton.cpuMillis" $q | float64 }}
{{- if lt (addf $have 0.001) (mulf $rayCpus 1000.0) }}{{ fail (printf "%s.resources.%s.cpu (%v) is less than %s: Ray would place more work on the pod than Kubernetes %s; set %s.resources.%s.cpu to at least %v%s, or lower %s" $role $kind $q $why (ternary "reserves for it" "lets it use (it would be throttled)" (eq $kind "requests")) $role $kind $rayCpus (ternary "" " (or remove it)" (eq $kind "requests")) $lower) }}{{ end }}
{{- if and (eq $kind "limits") (ne $role "router") (eq (float64 $g.gpusPerWorker) 0.0) }}
{{- $ranks := include "baton.tensorParallelSize" (list $v $role) | int }}
{{- $threads := mul ($g.workersPerPod | int) ($g.threadsPerWorker | default 1 | int) $ranks }}
{{- $perRank := ternary (printf " x %d tensor-parallel ranks" $ranks) "" (gt $ranks 1) }}
{{- if lt (addf $have 0.001) (mulf $threads 1000.0) }}{{ fail (printf "%s.resources.limits.cpu (%v) is less than the %d torch threads the pod's CPU workers run (%s.workersPerPod %v x %s.threadsPerWorker %v%s): Kubernetes would throttle them to %v CPUs; set %s.resources.limits.cpu to at least %d (or remove it), or lower %s.threadsPerWorker" $role $q $threads $role $g.workersPerPod $role ($g.threadsPerWorker | default 1) $perRank (round (divf $have 1000.0) 3) $role $threads $role) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
{{- $owned := dict "head" (list "num-cpus" "num-gpus" "resources" "dashboard-host") "router" (list "num-cpus" "resources") "prefill" (list "num-cpus" "num-gpus" "resources") "decode" (list "num-cpus" "num-gpus" "resources") }}
{{- range $g, $keys := $owned }}
{{- range $k := $keys }}
{{- if hasKey ((index $v $g).rayStartParams | default dict) $k }}{{ fail (printf "%s.rayStartParams.%s is set by the chart (from %s); remove it" $g $k (ternary "the group's CPU/GPU values and its Baton Ray resource" "Baton's head settings: no actors on the head, dashboard on loopback unless head.exposeDashboard" (ne $g "head"))) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------
Baton's config.yaml: the user's `baton:` section plus the keys the deployment determines.
--------------------------------------------------------------------------------------------- */}}
{{- define "baton.config" -}}
{{- $v := .Values }}
{{- $cfg := deepCopy ($v.baton | default dict) }}
{{- $owned := dict "model" (list "path") "router" (list "replicas" "host" "http_port" "grpc_port") "pools" (list "prefill" "decode") "redis" (list "url" "password") "cluster" (list "router_resource" "prefill_resource" "decode_resource" "router_cpus" "ray_address") }}
{{- range $section, $keys := $owned }}
{{- $sec := get $cfg $section }}
{{- if kindIs "map" $sec }}
{{- range $k := $keys }}
{{- if hasKey $sec $k }}{{ fail (printf "baton.%s.%s is set by the chart (see the comment above `baton:` in values.yaml); remove it" $section $k) }}{{ end }}
{{- end }}
{{- end }}
{{- end }}
{{- $model := get $cfg "model" | default dict }}
{{- $_ := set $model "path" (include "baton.modelPath" .) }}
{{- $_ := set $cfg "model" $model }}
{{- $router := get $cfg "router" | default dict }}
{{- $_ := set $router "replicas" ($v.router.replicas | int) }}
{{- $_ := set $router "host" "0.0.0.0" }}
{{- $_ := set $router "http_port" ($v.router.ports.http | int) }}
{{- $_ := set $router "grpc_port" ($v.router.ports.grpc | int) }}
{{- $_ := set $cfg "router" $router }}
{{- $pools := get $cfg "pools" | default dict }}
{{- range $role := list "prefill" "decode" }}
{{- $g := index $v $role }}
{{- $pool := dict "workers" (mul $g.replicas $g.workersPerPod) "cpus" $g.cpusPerWorker "gpus" $g.gpusPerWorker "threads" ($g.threadsPerWorker | int) }}
{{- if not (kindIs "invalid" $g.tensorParallelSize) }}{{ $_ := set $pool "tensor_parallel_size" ($g.tensorParallelSize | int) }}{{ end }}
{{- $_ := set $pools $role $pool }}
{{- end }}
{{- $_ := set $cfg "pools" $pools }}
{{- $redis := get $cfg "redis" | default dict }}
{{- $_ := set $redis "url" (include "baton.redisUrl" .) }}
{{- if $v.redis.auth.enabled }}{{ $_ := set $redis "password" (dict "env" "REDIS_PASSWORD") }}{{ end }}
{{- if not (hasKey $redis "cluster_name") }}{{ $_ := set $redis "cluster_name" (regexReplaceAll "[^A-Za-z0-9_-]" .Release.Name "-") }}{{ end }}
{{- $_ := set $cfg "redis" $redis }}
{{- $cluster := get $cfg "cluster" | default dict }}
{{- $_ := set $cluster "router_resource" "baton_router" }}
{{- $_ := set $cluster "prefill_resource" "baton_prefill" }}
{{- $_ := set $cluster "decode_resource" "baton_decode" }}
{{- $_ := set $cluster "router_cpus" $v.router.cpusPerReplica }}
{{- $_ := set $cfg "cluster" $cluster }}
{{- toYaml $cfg }}
{{- end }}

{{/* ---------------------------------------------------------------------------------------------
Pod pieces shared by the Ray groups
--------------------------------------------------------------------------------------------- */}}

{{/* Environment of every Baton container. */}}
{{- define "baton.env" -}}
- name: BATON_NODE_IP
  valueFrom:
    fieldRef:
      fieldPath: status.podIP
- name: BATON_CACHE_DIR   # models Baton imports or builds (default, tiny, .gguf): a writable emptyDir
  value: /var/cache/baton/models
- name: BATON_KERNEL_CACHE   # CPU kernels compiled at first use: an emptyDir
  value: /var/cache/baton-kernels
- name: HOME   # ~/.cache and the like: an emptyDir (the root filesystem is read-only)
  value: /home/baton
{{- include "baton.rayAuthEnv" . }}
{{- if .Values.redis.auth.enabled }}
- name: REDIS_PASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "baton.redisSecretName" . }}
      key: {{ .Values.redis.auth.secretKey }}
{{- end }}
{{- range .Values.secretEnv }}
- name: {{ .name }}
  valueFrom:
    secretKeyRef:
      name: {{ .secretName }}
      key: {{ .key }}
{{- end }}
{{- with .Values.extraEnv }}
{{ toYaml . }}
{{- end }}
{{- end }}

{{- define "baton.envFrom" -}}
{{- range .Values.envFromSecrets }}
- secretRef:
    name: {{ . }}
{{- end }}
{{- end }}

{{- define "baton.volumes" -}}
- name: baton-config
  configMap:
    name: {{ include "baton.fullname" . }}-config
- name: baton-cache
  emptyDir:
    {{- with .Values.modelCacheSizeLimit }}
    sizeLimit: {{ . }}
    {{- else }} {}
    {{- end }}
{{- include "baton.scratchVolumes" . }}
{{- if include "baton.modelOnPvc" . }}
- name: model
  persistentVolumeClaim:
    claimName: {{ .Values.model.pvc.claimName }}
    readOnly: true
{{- end }}
{{- end }}

{{- define "baton.volumeMounts" -}}
- name: baton-config
  mountPath: /etc/baton
  readOnly: true
- name: baton-cache
  mountPath: /var/cache/baton
{{ include "baton.scratchMounts" . }}
{{- if include "baton.modelOnPvc" . }}
- name: model
  mountPath: {{ .Values.model.pvc.mountPath }}
  readOnly: true
{{- end }}
{{- end }}

{{/* Pod-level scheduling and metadata: args (dict "root" $ "group" $groupValues "component" "router"). */}}
{{- define "baton.podMeta" -}}
{{- $d := .root.Values.podDefaults -}}
labels:
  {{- include "baton.selectorLabels" .root | nindent 2 }}
  app.kubernetes.io/component: {{ .component }}
  app.kubernetes.io/part-of: baton
  {{- with merge (deepCopy (.group.labels | default dict)) $d.labels }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- with merge (deepCopy (.group.annotations | default dict)) $d.annotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{- define "baton.podScheduling" -}}
{{- $d := .root.Values.podDefaults -}}
{{- with merge (deepCopy (.group.nodeSelector | default dict)) $d.nodeSelector }}
nodeSelector:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with concat (.group.tolerations | default list) $d.tolerations }}
tolerations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with (.group.affinity | default $d.affinity | default .spread) }}
affinity:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with $d.priorityClassName }}
priorityClassName: {{ . }}
{{- end }}
{{- with $d.securityContext }}
securityContext:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- with .root.Values.serviceAccountName }}
serviceAccountName: {{ . }}
{{- end }}
{{- with .root.Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* rayStartParams values must be strings. Args: (dict "base" $dict "extra" $userDict). */}}
{{- define "baton.rayStartParams" -}}
{{- $all := deepCopy .base -}}
{{- range $k, $val := (.extra | default dict) }}{{ $_ := set $all $k (toString $val) }}{{ end -}}
{{- toYaml $all }}
{{- end }}
