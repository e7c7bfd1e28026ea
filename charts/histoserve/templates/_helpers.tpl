{{/*
Names. The InferenceService is named <fullname>; KServe appends "-predictor"
(and Knative a revision suffix), so the name is kept to 45 characters.
*/}}
{{- define "histoserve.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 45 | trimSuffix "-" -}}
{{- end -}}

{{- define "histoserve.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 45 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 45 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Name of KServe's predictor component (Deployment/Service/Knative Service). */}}
{{- define "histoserve.predictorName" -}}
{{- printf "%s-predictor" (include "histoserve.fullname" .) -}}
{{- end -}}

{{- define "histoserve.selectorLabels" -}}
app.kubernetes.io/name: {{ include "histoserve.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "histoserve.labels" -}}
helm.sh/chart: {{ include "histoserve.chart" . }}
{{ include "histoserve.selectorLabels" . }}
app.kubernetes.io/version: {{ (include "histoserve.imageTag" .) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: histoserve
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Labels KServe puts on every predictor pod: what PDB, NetworkPolicy and PodMonitor select. */}}
{{- define "histoserve.predictorPodSelector" -}}
serving.kserve.io/inferenceservice: {{ include "histoserve.fullname" . }}
component: predictor
{{- end -}}

{{- define "histoserve.commonAnnotations" -}}
{{- with .Values.commonAnnotations }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Metadata block shared by every object: labels and common annotations. */}}
{{- define "histoserve.metadata" -}}
namespace: {{ .Release.Namespace }}
labels:
  {{- include "histoserve.labels" . | nindent 2 }}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* Images. */}}
{{- define "histoserve.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{- define "histoserve.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "histoserve.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.testImage" -}}
{{- if .Values.tests.image.repository -}}
{{- printf "%s:%s" .Values.tests.image.repository (default "latest" .Values.tests.image.tag) -}}
{{- else if .Values.tests.image.tag -}}
{{- printf "%s:%s" .Values.image.repository .Values.tests.image.tag -}}
{{- else -}}
{{- include "histoserve.image" . -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.imagePullSecrets" -}}
{{- if .Values.imagePullSecrets }}
imagePullSecrets:
{{- range .Values.imagePullSecrets }}
{{- if kindIs "string" . }}
  - name: {{ . }}
{{- else }}
  - name: {{ .name }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{- define "histoserve.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "histoserve.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.runtimeName" -}}
{{- default "histoserve" .Values.servingRuntime.name -}}
{{- end -}}

{{/* The metrics KEDA scales on, declared once (the schema's enums list them too). */}}
{{- define "histoserve.kedaMetrics" -}}
gpu-utilization queue-depth interactive-queue-depth prometheus
{{- end -}}

{{/*
Autoscaler class actually used ("kpa", "hpa", "keda", "none", "external").
*/}}
{{- define "histoserve.autoscalerClass" -}}
{{- $a := .Values.autoscaling -}}
{{- if $a.class -}}
{{- $a.class -}}
{{- else if eq .Values.deploymentMode "Knative" -}}
kpa
{{- else if has $a.metric (splitList " " (include "histoserve.kedaMetrics" .)) -}}
keda
{{- else if has $a.metric (list "cpu" "memory") -}}
hpa
{{- else if eq (int $a.minReplicas) (int $a.maxReplicas) -}}
none
{{- else -}}
hpa
{{- end -}}
{{- end -}}

{{/* Scaling metric actually used ("" when the class takes none). */}}
{{- define "histoserve.autoscalerMetric" -}}
{{- $class := include "histoserve.autoscalerClass" . -}}
{{- $m := .Values.autoscaling.metric -}}
{{- if $m -}}
{{- $m -}}
{{- else if eq $class "kpa" -}}
concurrency
{{- else if eq $class "hpa" -}}
cpu
{{- else if eq $class "keda" -}}
queue-depth
{{- end -}}
{{- end -}}

{{/* Target per replica, with per-metric defaults. */}}
{{- define "histoserve.autoscalerTarget" -}}
{{- $metric := include "histoserve.autoscalerMetric" . -}}
{{- $defaults := dict "concurrency" 4 "rps" 50 "cpu" 80 "memory" 80 "gpu-utilization" 80 "queue-depth" 64 "interactive-queue-depth" 16 "prometheus" 1 -}}
{{- if ne .Values.autoscaling.target nil -}}
{{- .Values.autoscaling.target -}}
{{- else -}}
{{- get $defaults $metric -}}
{{- end -}}
{{- end -}}

{{/*
PromQL for the KEDA presets. Each aggregates with sum(...) over this
predictor's pods; KEDA divides by the target (AverageValue) to get replicas.
*/}}
{{- define "histoserve.kedaQuery" -}}
{{- $k := .Values.autoscaling.keda -}}
{{- $metric := include "histoserve.autoscalerMetric" . -}}
{{- $sel := printf "%s=%q, %s=~%q" $k.namespaceLabel .Release.Namespace $k.podLabel (printf "%s-.*" (include "histoserve.predictorName" .)) -}}
{{- /* max by pod (and GPU) first: a pod scraped by two jobs (PodMonitor and
       ServiceMonitor, or annotations) has two series, and a plain sum would
       double the load and the replicas. */ -}}
{{- if eq $metric "gpu-utilization" -}}
{{- /* per replica, i.e. averaged over a replica's GPUs */ -}}
{{- $gpus := int .Values.gpu.count -}}
{{- printf "sum(max by (%s, gpu) (DCGM_FI_DEV_GPU_UTIL{%s}))%s" $k.podLabel $sel (ternary (printf " / %d" $gpus) "" (gt $gpus 1)) -}}
{{- else if eq $metric "queue-depth" -}}
{{- printf "sum(max by (%s, model, priority) (histoserve_queue_depth{%s}))" $k.podLabel $sel -}}
{{- else if eq $metric "interactive-queue-depth" -}}
{{- /* the most urgent class of service (a request's V2 priority 1) alone */ -}}
{{- printf "sum(max by (%s, model) (histoserve_queue_depth{%s, priority=\"1\"}))" $k.podLabel $sel -}}
{{- else -}}
{{- $k.query -}}
{{- end -}}
{{- end -}}

{{/* Where the server reads checkpoints (--model_dir). */}}
{{- define "histoserve.modelDir" -}}
{{- $uri := include "histoserve.storageUri" . -}}
{{- if and $uri (or (hasPrefix "oci://" $uri) (eq .Values.storage.storageUriMode "env")) -}}
/mnt/models
{{- else -}}
{{- .Values.storage.mountPath -}}
{{- end -}}
{{- end -}}

{{/*
The storage URI handed to KServe's storage initializer: storage.storageUri,
except a pvc:// one. KServe mounts a pvc:// entry of storageUris by its claim
alone (the path is dropped: the claim's root would land at the model dir and
the loader find no *.pt2), so the chart mounts such a claim itself, its path
as the subPath (histoserve.pvcUri).
*/}}
{{- define "histoserve.storageUri" -}}
{{- if not (hasPrefix "pvc://" .Values.storage.storageUri) -}}
{{- .Values.storage.storageUri -}}
{{- end -}}
{{- end -}}

{{/* A pvc://claim[/path] storageUri as "claim" and "path" (empty dict otherwise). */}}
{{- define "histoserve.pvcUri" -}}
{{- if hasPrefix "pvc://" .Values.storage.storageUri -}}
{{- $parts := splitn "/" 2 (trimPrefix "pvc://" .Values.storage.storageUri) -}}
{{- toJson (dict "claim" $parts._0 "path" (trimSuffix "/" (default "" $parts._1))) -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{- define "histoserve.pvcName" -}}
{{- $uri := include "histoserve.pvcUri" . | fromJson -}}
{{- if $uri.claim -}}
{{- $uri.claim -}}
{{- else if .Values.storage.pvc.existingClaim -}}
{{- .Values.storage.pvc.existingClaim -}}
{{- else -}}
{{- default (printf "%s-models" (include "histoserve.fullname" .)) .Values.storage.pvc.name -}}
{{- end -}}
{{- end -}}

{{/* subPath of the model-store mount: a pvc:// URI's path, else storage.pvc.subPath. */}}
{{- define "histoserve.pvcSubPath" -}}
{{- $uri := include "histoserve.pvcUri" . | fromJson -}}
{{- if $uri.claim -}}
{{- $uri.path -}}
{{- else -}}
{{- .Values.storage.pvc.subPath -}}
{{- end -}}
{{- end -}}

{{/* True ("true") when checkpoints come from a PVC volume the chart mounts. */}}
{{- define "histoserve.usesPvc" -}}
{{- if hasPrefix "pvc://" .Values.storage.storageUri -}}
true
{{- else if and (not .Values.storage.storageUri) (or .Values.storage.pvc.existingClaim .Values.storage.pvc.create) -}}
true
{{- end -}}
{{- end -}}

{{/* The model-store volume mount (read-only, with its subPath). */}}
{{- define "histoserve.modelStoreMount" -}}
- name: model-store
  mountPath: {{ .Values.storage.mountPath }}
  readOnly: true
  {{- with include "histoserve.pvcSubPath" . }}
  subPath: {{ . }}
  {{- end }}
{{- end -}}

{{/* Container port the HTTP endpoint listens on, and gRPC. */}}
{{- define "histoserve.httpPort" -}}8080{{- end -}}
{{- define "histoserve.grpcPort" -}}8081{{- end -}}

{{/*
Container ports. Knative exposes exactly one port, named http1 or h2c;
Standard exposes both (KServe maps the first to Service port 80 and names
the h2c one with appProtocol kubernetes.io/h2c).
*/}}
{{- define "histoserve.containerPorts" -}}
{{- if eq .Values.deploymentMode "Knative" }}
{{- if eq .Values.knative.protocol "grpc" }}
- name: h2c
  containerPort: {{ include "histoserve.grpcPort" . }}
  protocol: TCP
{{- else }}
- name: http1
  containerPort: {{ include "histoserve.httpPort" . }}
  protocol: TCP
{{- end }}
{{- else }}
- name: http1
  containerPort: {{ include "histoserve.httpPort" . }}
  protocol: TCP
- name: h2c
  containerPort: {{ include "histoserve.grpcPort" . }}
  protocol: TCP
{{- include "histoserve.metricsContainerPort" . }}
{{- end }}
{{- end -}}

{{/* The metrics listener's container port (Standard; KServe adds it to the Service). */}}
{{- define "histoserve.metricsContainerPort" -}}
{{- if gt (int .Values.metrics.port) 0 }}
- name: metrics
  containerPort: {{ int .Values.metrics.port }}
  protocol: TCP
{{- end }}
{{- end -}}

{{/* Port the server's /metrics is scraped on: metrics.port, else the HTTP port. */}}
{{- define "histoserve.metricsPort" -}}
{{- if gt (int .Values.metrics.port) 0 -}}
{{- int .Values.metrics.port -}}
{{- else -}}
{{- include "histoserve.httpPort" . -}}
{{- end -}}
{{- end -}}

{{/*
Whole CPUs of resources.requests.cpu, rounded up ("4", 4, "2.5", "500m"); 0 when
no CPU is requested. What sizes the decode threads and OpenMP: no CPU limit is
set, so the server would otherwise count every CPU of the node.
*/}}
{{- define "histoserve.cpuCores" -}}
{{- $cpu := toString (dig "requests" "cpu" "0" (.Values.resources | default dict)) -}}
{{- if hasSuffix "m" $cpu -}}
{{- div (add (atoi (trimSuffix "m" $cpu)) 999) 1000 -}}
{{- else -}}
{{- ceil (float64 $cpu) | int -}}
{{- end -}}
{{- end -}}

{{/*
OMP_NUM_THREADS and MKL_NUM_THREADS from the CPU request (torch sizes its
intra-op pool from them), split between the CPU device workers when the model
runs on the CPU; left out when there is no CPU request or server.extraEnv sets them.
*/}}
{{- define "histoserve.threadEnv" -}}
{{- $cores := include "histoserve.cpuCores" . | int -}}
{{- $user := list -}}
{{- range .Values.server.extraEnv }}{{ $user = append $user .name }}{{ end -}}
{{- if gt $cores 0 -}}
{{- $threads := $cores -}}
{{- if eq .Values.model.device "cpu" -}}
{{- $instances := .Values.batching.instancesPerDevice | default 2 | int -}}
{{- $threads = max 1 (div $cores $instances) -}}
{{- end -}}
{{- range list "OMP_NUM_THREADS" "MKL_NUM_THREADS" }}
{{- if not (has . $user) }}
- name: {{ . }}
  value: {{ $threads | quote }}
{{- end }}
{{- end }}
{{- end -}}
{{- end -}}

{{/* Server flags that do not depend on the model (shared with the ServingRuntime). */}}
{{- define "histoserve.serverArgs" -}}
- --http_port={{ include "histoserve.httpPort" . }}
- --grpc_port={{ include "histoserve.grpcPort" . }}
- --drain_timeout_s={{ .Values.server.drainTimeoutSeconds }}
- --grpc_max_receive_message_length={{ int64 .Values.server.grpcMaxMessageBytes }}
{{- if gt (int .Values.metrics.port) 0 }}
- --metrics_port={{ int .Values.metrics.port }}
{{- end }}
{{- with .Values.server.maxTilesPerRequest }}
- --max_tiles_per_request={{ int64 . }}
{{- end }}
{{- with .Values.server.maxBodyBytes }}
- --max_body_bytes={{ int64 . }}
{{- end }}
{{- with .Values.tracing }}
{{- if .endpoint }}
- --otel_endpoint={{ .endpoint }}
{{- with .protocol }}
- --otel_protocol={{ . }}
{{- end }}
{{- if ne .sampleRatio nil }}
- --otel_sample_ratio={{ .sampleRatio }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}

{{/* Model-specific flags (the InferenceService's own). */}}
{{- define "histoserve.modelArgs" -}}
{{- if .Values.models }}
- --model_dir={{ include "histoserve.modelDir" . }}
- --models={{ include "histoserve.modelNames" . }}
- --model_settings={{ include "histoserve.modelSettingsDir" . }}
{{- else }}
- --model_name={{ .Values.model.name }}
- --model_dir={{ include "histoserve.modelDir" . }}
{{- with .Values.model.checkpoint }}
- --checkpoint={{ . }}
{{- end }}
{{- with .Values.model.spec }}
- --spec={{ . }}
{{- end }}
{{- with .Values.model.modelClass }}
- --model_class={{ . }}
{{- end }}
{{- end }}
- --device={{ .Values.model.device }}
{{- $b := .Values.batching }}
{{- if ne $b.maxBatchSize nil }}
- --max_batch_size={{ $b.maxBatchSize }}
{{- end }}
{{- if ne $b.maxLatencyMs nil }}
- --max_latency_ms={{ $b.maxLatencyMs }}
{{- end }}
{{- if ne $b.maxQueueSize nil }}
- --max_queue_size={{ $b.maxQueueSize }}
{{- end }}
{{- if ne $b.preprocessWorkers nil }}
- --preprocess_workers={{ $b.preprocessWorkers }}
{{- else if gt (include "histoserve.cpuCores" . | int) 0 }}
- --preprocess_workers={{ include "histoserve.cpuCores" . }}
{{- end }}
{{- if ne $b.instancesPerDevice nil }}
- --instances_per_device={{ $b.instancesPerDevice }}
{{- end }}
{{- $frontends := include "histoserve.frontends" . | int }}
{{- if gt $frontends 1 }}
- --frontends={{ $frontends }}
{{- end }}
{{- range .Values.server.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/*
Front-end processes (--frontends): server.frontends, or for "auto" the CPU
request's whole cores less one for the device owner, at least 1.
*/}}
{{- define "histoserve.frontends" -}}
{{- $f := .Values.server.frontends -}}
{{- if eq (toString $f) "auto" -}}
{{- $cpu := toString (dig "requests" "cpu" "1" (.Values.resources | default dict)) -}}
{{- $cores := 0 -}}
{{- if hasSuffix "m" $cpu -}}
{{- $cores = div (atoi (trimSuffix "m" $cpu)) 1000 -}}
{{- else -}}
{{- $cores = int (float64 $cpu) -}}
{{- end -}}
{{- max 1 (sub $cores 1) -}}
{{- else -}}
{{- $f -}}
{{- end -}}
{{- end -}}

{{/*
Environment. The root filesystem is read-only: every path torch writes goes
to an emptyDir. aoti_load_package extracts the package (weights included)
under TMPDIR; torch._inductor probes the CPU ISA and caches kernels under
TORCHINDUCTOR_CACHE_DIR; Triton and the CUDA JIT cache go under the cache dir.
*/}}
{{- define "histoserve.env" -}}
- name: HOME
  value: /home/histoserve
- name: TMPDIR
  value: /tmp
- name: XDG_CACHE_HOME
  value: /var/cache/histoserve
- name: TORCHINDUCTOR_CACHE_DIR
  value: /var/cache/histoserve/torchinductor
- name: TRITON_CACHE_DIR
  value: /var/cache/histoserve/triton
- name: CUDA_CACHE_PATH
  value: /var/cache/histoserve/nv
- name: TORCH_HOME
  value: /var/cache/histoserve/torch
- name: USER
  value: histoserve
- name: PYTHONDONTWRITEBYTECODE
  value: "1"
- name: PYTHONUNBUFFERED
  value: "1"
- name: PYTORCH_CUDA_ALLOC_CONF
  value: expandable_segments:True
{{- end -}}

{{/* Scratch volume mounts for the server container. */}}
{{- define "histoserve.scratchMounts" -}}
- name: tmp
  mountPath: /tmp
- name: cache
  mountPath: /var/cache/histoserve
- name: home
  mountPath: /home/histoserve
{{- if .Values.shm.enabled }}
- name: dshm
  mountPath: /dev/shm
{{- end }}
{{- end -}}

{{- define "histoserve.scratchVolumes" -}}
- name: tmp
  emptyDir:
    {{- with .Values.scratch.tmp.medium }}
    medium: {{ . }}
    {{- end }}
    sizeLimit: {{ .Values.scratch.tmp.sizeLimit }}
- name: cache
  emptyDir:
    sizeLimit: {{ .Values.scratch.cache.sizeLimit }}
- name: home
  emptyDir:
    sizeLimit: {{ .Values.scratch.home.sizeLimit }}
{{- if .Values.shm.enabled }}
- name: dshm
  emptyDir:
    medium: Memory
    sizeLimit: {{ include "histoserve.shmSizeLimit" . }}
{{- end }}
{{- end -}}

{{/*
/dev/shm: shm.sizeLimit, or 2Gi plus every front end's slabs, one per model (the
server's predictor/multiprocess/supervisor.py:slot_layout: 2 x (queue x priority
levels + batch x workers) slots, 164 KiB each for a 224-px tile and up to 1,536
float64 outputs; 2 priority levels, the server's default; workers counted as 2,
the CPU's auto and more than a GPU's 1). With models:, each entry's batching
over batching.*.
*/}}
{{- define "histoserve.shmSizeLimit" -}}
{{- $fe := include "histoserve.frontends" . | int -}}
{{- if .Values.shm.sizeLimit -}}
{{- .Values.shm.sizeLimit -}}
{{- else if le $fe 1 -}}
2Gi
{{- else -}}
{{- $entries := .Values.models | default (list dict) -}}
{{- $perFrontEnd := 0 -}}
{{- range $entries -}}
{{- $own := default dict .batching -}}
{{- $b := merge (deepCopy $own) (deepCopy $.Values.batching) -}}
{{- $queue := 1024 -}}
{{- if ne $b.maxQueueSize nil }}{{ $queue = int $b.maxQueueSize }}{{ end -}}
{{- $batch := 32 -}}
{{- if ne $b.maxBatchSize nil }}{{ $batch = int $b.maxBatchSize }}{{ end -}}
{{- $workers := 2 -}}
{{- if ne $b.instancesPerDevice nil }}{{ $workers = max 2 (int $b.instancesPerDevice) }}{{ end -}}
{{- $slots := mul 2 (add (mul $queue 2) (mul $batch $workers)) -}}
{{- $perFrontEnd = add $perFrontEnd (add1 (div (mul $slots 164) 1024)) -}}
{{- end -}}
{{- add 2048 (mul $fe $perFrontEnd) }}Mi
{{- end -}}
{{- end -}}

{{/*
Resources with the GPU merged into requests and limits, and an ephemeral-storage
request for the on-disk scratch volumes unless one is given.
*/}}
{{- define "histoserve.resources" -}}
{{- $res := deepCopy (default dict .Values.resources) -}}
{{- $req := deepCopy (default dict $res.requests) -}}
{{- $lim := deepCopy (default dict $res.limits) -}}
{{- if gt (int .Values.gpu.count) 0 -}}
{{- $_ := set $req .Values.gpu.resourceName (int .Values.gpu.count) -}}
{{- $_ := set $lim .Values.gpu.resourceName (int .Values.gpu.count) -}}
{{- end -}}
{{- if not (hasKey $req "ephemeral-storage") -}}
{{- $_ := set $req "ephemeral-storage" (printf "%dMi" (include "histoserve.scratchDiskMi" . | int)) -}}
{{- end -}}
{{- $_ := set $res "requests" $req -}}
{{- if $lim }}{{ $_ := set $res "limits" $lim }}{{ end -}}
{{- toYaml $res -}}
{{- end -}}

{{/* MiB the on-disk emptyDirs may fill (their sizeLimits; a Memory /tmp counts as memory). */}}
{{- define "histoserve.scratchDiskMi" -}}
{{- $sizes := list .Values.scratch.cache.sizeLimit .Values.scratch.home.sizeLimit -}}
{{- if ne .Values.scratch.tmp.medium "Memory" }}{{ $sizes = append $sizes .Values.scratch.tmp.sizeLimit }}{{ end -}}
{{- $total := 0 -}}
{{- range $sizes }}{{ $total = add $total (include "histoserve.quantityMi" . | int) }}{{ end -}}
{{- $total -}}
{{- end -}}

{{/* A storage quantity (Ki, Mi, Gi, Ti, k, M, G, T or bytes) in MiB, rounded up. */}}
{{- define "histoserve.quantityMi" -}}
{{- $q := toString . -}}
{{- $units := list (list "Ki" 1024) (list "Mi" 1048576) (list "Gi" 1073741824) (list "Ti" 1099511627776) (list "k" 1000) (list "M" 1000000) (list "G" 1000000000) (list "T" 1000000000000) -}}
{{- $bytes := 0 -}}
{{- $found := false -}}
{{- range $units -}}
{{- if and (not $found) (hasSuffix (index . 0) $q) -}}
{{- $bytes = mul (int64 (trimSuffix (index . 0) $q)) (index . 1) -}}
{{- $found = true -}}
{{- end -}}
{{- end -}}
{{- if not $found }}{{ $bytes = int64 $q }}{{ end -}}
{{- div (add $bytes 1048575) 1048576 -}}
{{- end -}}

{{/* Readiness path on the HTTP port. */}}
{{- define "histoserve.readyPath" -}}
{{- printf "/v2/models/%s/ready" (include "histoserve.servedName" .) -}}
{{- end -}}

{{- define "histoserve.probes" -}}
{{- $p := .Values.probes -}}
{{- if $p.startup.enabled }}
startupProbe:
  httpGet:
    path: {{ include "histoserve.readyPath" . }}
    port: {{ include "histoserve.httpPort" . }}
  periodSeconds: {{ $p.startup.periodSeconds }}
  failureThreshold: {{ $p.startup.failureThreshold }}
  timeoutSeconds: {{ $p.startup.timeoutSeconds }}
{{- end }}
{{- if $p.readiness.enabled }}
readinessProbe:
  httpGet:
    path: {{ include "histoserve.readyPath" . }}
    port: {{ include "histoserve.httpPort" . }}
  periodSeconds: {{ $p.readiness.periodSeconds }}
  failureThreshold: {{ $p.readiness.failureThreshold }}
  timeoutSeconds: {{ $p.readiness.timeoutSeconds }}
{{- end }}
{{- if $p.liveness.enabled }}
livenessProbe:
  {{- if and (eq .Values.deploymentMode "Knative") (eq .Values.knative.protocol "grpc") }}
  {{- include "histoserve.execLiveness" . | nindent 2 }}
  {{- else }}
  httpGet:
    path: /v2/health/live
    port: {{ include "histoserve.httpPort" . }}
  {{- end }}
  periodSeconds: {{ $p.liveness.periodSeconds }}
  failureThreshold: {{ $p.liveness.failureThreshold }}
  timeoutSeconds: {{ $p.liveness.timeoutSeconds }}
{{- end }}
{{- end -}}

{{/*
Liveness that no port rewrite can move: Knative rewrites an httpGet (or
tcpSocket) liveness probe to its one serving port (unconditionally up to 1.21;
1.22+ keeps a custom port only with multi-container-probing), which for gRPC is
the gRPC port; an exec probe runs inside the container, where the HTTP server
still listens on 8080. A 503 (device lost) or no answer exits non-zero.
*/}}
{{- define "histoserve.execLiveness" -}}
exec:
  command:
    - python
    - -c
    - import urllib.request as u; u.urlopen('http://127.0.0.1:{{ include "histoserve.httpPort" . }}/v2/health/live', timeout={{ max 1 (sub (int .Values.probes.liveness.timeoutSeconds) 1) }})
{{- end -}}

{{/* Knative rejects lifecycle hooks (its queue-proxy drains the pod itself). */}}
{{- define "histoserve.lifecycle" -}}
{{- if and (gt (int .Values.server.preStopSleepSeconds) 0) (ne .Values.deploymentMode "Knative") }}
lifecycle:
  preStop:
    sleep:
      seconds: {{ int .Values.server.preStopSleepSeconds }}
{{- end }}
{{- end -}}

{{/*
Pod security context. Knative only accepts runAsUser/Group/NonRoot, fsGroup,
supplementalGroups and seccompProfile (with its kubernetes.podspec-securitycontext
feature flag): fsGroupChangePolicy and the rest are dropped in that mode.
*/}}
{{- define "histoserve.podSecurityContext" -}}
{{- $psc := deepCopy (default dict .Values.podSecurityContext) -}}
{{- if eq .Values.deploymentMode "Knative" -}}
{{- $psc = pick $psc "runAsUser" "runAsGroup" "runAsNonRoot" "fsGroup" "supplementalGroups" "seccompProfile" -}}
{{- end -}}
{{- if $psc -}}
{{- toYaml $psc -}}
{{- end -}}
{{- end -}}

{{/*
Container security context. Knative before 1.17 refuses the privileged key
(even false): dropped in Knative mode (privileged true is refused by validate).
*/}}
{{- define "histoserve.securityContext" -}}
{{- $sc := deepCopy (default dict .Values.securityContext) -}}
{{- if eq .Values.deploymentMode "Knative" -}}
{{- $sc = omit $sc "privileged" -}}
{{- end -}}
{{- if $sc -}}
{{- toYaml $sc -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.terminationGracePeriodSeconds" -}}
{{- if ne .Values.server.terminationGracePeriodSeconds nil -}}
{{- .Values.server.terminationGracePeriodSeconds -}}
{{- else -}}
{{- add (int .Values.server.drainTimeoutSeconds) (int .Values.server.preStopSleepSeconds) 15 -}}
{{- end -}}
{{- end -}}

{{/* Node selector: user's, plus the GPU product when set. */}}
{{- define "histoserve.nodeSelector" -}}
{{- $ns := deepCopy (default dict .Values.nodeSelector) -}}
{{- if and .Values.gpu.product (gt (int .Values.gpu.count) 0) -}}
{{- $_ := set $ns "nvidia.com/gpu.product" .Values.gpu.product -}}
{{- end -}}
{{- if $ns -}}
{{- toYaml $ns -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.tolerations" -}}
{{- $t := list -}}
{{- if and .Values.gpu.tolerateTaint (gt (int .Values.gpu.count) 0) -}}
{{- $t = append $t (dict "key" "nvidia.com/gpu" "operator" "Exists" "effect" "NoSchedule") -}}
{{- end -}}
{{- range .Values.tolerations -}}
{{- $t = append $t . -}}
{{- end -}}
{{- if $t -}}
{{- toYaml $t -}}
{{- end -}}
{{- end -}}

{{/* Base URL of the predictor from inside the cluster. */}}
{{- define "histoserve.clusterUrl" -}}
{{- printf "http://%s.%s.svc" (include "histoserve.predictorName" .) .Release.Namespace -}}
{{- end -}}

{{/*
Checks the schema cannot express (it cannot compare two values).
*/}}
{{- define "histoserve.validate" -}}
{{- $a := .Values.autoscaling -}}
{{- if gt (int $a.minReplicas) (int $a.maxReplicas) -}}
{{- fail (printf "autoscaling.minReplicas (%d) must be <= autoscaling.maxReplicas (%d)" (int $a.minReplicas) (int $a.maxReplicas)) -}}
{{- end -}}
{{- $class := include "histoserve.autoscalerClass" . -}}
{{- $metric := include "histoserve.autoscalerMetric" . -}}
{{- if and (eq .Values.deploymentMode "Knative") (ne $class "kpa") -}}
{{- fail (printf "deploymentMode Knative scales with autoscaling.class kpa, not %q" $class) -}}
{{- end -}}
{{- if and (eq .Values.deploymentMode "Standard") (eq $class "kpa") -}}
{{- fail "autoscaling.class kpa needs deploymentMode Knative; Standard uses hpa, keda, none or external" -}}
{{- end -}}
{{- if and (eq $class "kpa") (not (has $metric (list "concurrency" "rps"))) -}}
{{- fail (printf "autoscaling.metric %q does not work with KPA: use concurrency or rps" $metric) -}}
{{- end -}}
{{- if and (eq $class "hpa") (not (has $metric (list "cpu" "memory"))) -}}
{{- fail (printf "autoscaling.metric %q does not work with HPA: use cpu or memory (or class keda)" $metric) -}}
{{- end -}}
{{- $keda := splitList " " (include "histoserve.kedaMetrics" .) -}}
{{- if and (eq $class "keda") (not (has $metric $keda)) -}}
{{- fail (printf "autoscaling.metric %q does not work with KEDA: use one of %s" $metric (join ", " $keda)) -}}
{{- end -}}
{{- if and (eq (int $a.minReplicas) 0) (ne $class "kpa") -}}
{{- fail "autoscaling.minReplicas 0 (scale to zero) needs deploymentMode Knative (KPA): a scaled-to-zero Deployment never reports the load that would wake it" -}}
{{- end -}}
{{- if and (eq $metric "gpu-utilization") (eq (int .Values.gpu.count) 0) -}}
{{- fail "autoscaling.metric gpu-utilization needs gpu.count > 0" -}}
{{- end -}}
{{- if and (gt (int .Values.gpu.count) 1) (ne .Values.model.device "auto") -}}
{{- fail (printf "gpu.count %d but model.device %q serves one GPU: use model.device auto (one worker per GPU)" (int .Values.gpu.count) .Values.model.device) -}}
{{- end -}}
{{- include "histoserve.validateCluster" . -}}
{{- end -}}

{{/*
What a cluster would refuse or break on, though every object is valid:
checks of values against each other and against the live object.
*/}}
{{- define "histoserve.validateCluster" -}}
{{- $a := .Values.autoscaling -}}
{{- $knative := eq .Values.deploymentMode "Knative" -}}
{{- if and $knative (dig "privileged" false (.Values.securityContext | default dict)) -}}
{{- fail "securityContext.privileged true: Knative never admits a privileged container (and before 1.17 refuses the key at all)" -}}
{{- end -}}
{{- $timeout := .Values.knative.timeoutSeconds -}}
{{- if and $knative (ne $timeout nil) (gt (int $timeout) (int .Values.knative.maxRevisionTimeoutSeconds)) -}}
{{- fail (printf "knative.timeoutSeconds %d > knative.maxRevisionTimeoutSeconds %d: Knative refuses it; raise max-revision-timeout-seconds in knative-serving's config-defaults and set knative.maxRevisionTimeoutSeconds to match" (int $timeout) (int .Values.knative.maxRevisionTimeoutSeconds)) -}}
{{- end -}}
{{- $pvc := .Values.storage.pvc -}}
{{- $created := and (not .Values.storage.storageUri) (not $pvc.existingClaim) $pvc.create -}}
{{- $oneNode := not (or (has "ReadOnlyMany" $pvc.accessModes) (has "ReadWriteMany" $pvc.accessModes)) -}}
{{- if and $created $oneNode (gt (int $a.maxReplicas) 1) -}}
{{- fail (printf "storage.pvc.accessModes %v with autoscaling.maxReplicas %d: a ReadWriteOnce volume attaches to one node, replicas elsewhere fail with Multi-Attach errors; use ReadOnlyMany or ReadWriteMany, an existingClaim that several nodes can mount, or storageUri" $pvc.accessModes (int $a.maxReplicas)) -}}
{{- end -}}
{{- if and (hasPrefix "pvc://" .Values.storage.storageUri) (not (include "histoserve.pvcUri" . | fromJson).claim) -}}
{{- fail (printf "storage.storageUri %q names no claim: use pvc://<claim>/<path>" .Values.storage.storageUri) -}}
{{- end -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled (not $np.allowExternal) (not $np.metricsFrom) (eq (int .Values.metrics.port) 0) -}}
{{- fail "networkPolicy: metrics.port 0 serves /metrics on the inference port 8080, so an empty metricsFrom (scrapers from anywhere) would open the model to anyone despite allowExternal false: set metrics.port (e.g. 8082) or networkPolicy.metricsFrom" -}}
{{- end -}}
{{- include "histoserve.validatePdb" . -}}
{{- include "histoserve.validateUpgrade" . -}}
{{- end -}}

{{/* A PDB that allows no eviction at minReplicas blocks every node drain. */}}
{{- define "histoserve.validatePdb" -}}
{{- $pdb := .Values.podDisruptionBudget -}}
{{- $min := int .Values.autoscaling.minReplicas -}}
{{- if $pdb.enabled -}}
{{- $blocks := false -}}
{{- if ne $pdb.minAvailable nil -}}
{{- $m := toString $pdb.minAvailable -}}
{{- if hasSuffix "%" $m -}}
{{- /* Kubernetes rounds a percentage up: ceil(p x minReplicas / 100) >= minReplicas */ -}}
{{- $blocks = gt (mul (atoi (trimSuffix "%" $m)) $min) (mul 100 (sub $min 1)) -}}
{{- else -}}
{{- $blocks = ge (atoi $m) $min -}}
{{- end -}}
{{- else -}}
{{- $blocks = has (toString $pdb.maxUnavailable) (list "0" "0%") -}}
{{- end -}}
{{- if $blocks -}}
{{- fail (printf "podDisruptionBudget (minAvailable %v, maxUnavailable %v) with autoscaling.minReplicas %d allows no eviction at minReplicas: node drains would block. Use maxUnavailable: 1, or a minAvailable below minReplicas" $pdb.minAvailable $pdb.maxUnavailable $min) -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/*
KServe's webhook refuses to change an InferenceService's deploymentMode
("update rejected: deploymentMode cannot be changed"): say so before the
upgrade half-applies. lookup finds nothing under `helm template`.
*/}}
{{- define "histoserve.validateUpgrade" -}}
{{- $old := lookup "serving.kserve.io/v1beta1" "InferenceService" .Release.Namespace (include "histoserve.fullname" .) -}}
{{- $was := dig "status" "deploymentMode" "" ($old | default dict) -}}
{{- $was = get (dict "RawDeployment" "Standard" "Serverless" "Knative") $was | default $was -}}
{{- if and $was (ne $was .Values.deploymentMode) -}}
{{- fail (printf "deploymentMode %s, but InferenceService %s runs as %s and KServe refuses to change it: keep %s, or helm uninstall and install again" .Values.deploymentMode (include "histoserve.fullname" .) $was $was) -}}
{{- end -}}
{{- end -}}
