{{/*
model.build: the init container that exports the package this node needs when
none in the model volume fits (docs/deployment.md, "Package sets"). It runs
the export image (the serving image's export twin: docker build --target export) on the pod's own device (the server's resources,
GPU included: the kubelet hands the init container's GPU on to the server),
`--package_set <model dir> --if_missing`: the server's own fit rule decides
whether anything is missing; a lock per build key on the volume makes pods
starting together export once. `timeout` bounds the export (SIGTERM, then
SIGKILL 30 s later); a killed export leaves no package (stage, then rename)
and the kubelet retries the init container.
*/}}
{{/* The export image: model.build.image, else the serving image's tag with "-export"
(`docker build --target export`: the same torch and CUDA, a compiler, the export extra). */}}
{{- define "histoserve.buildImage" -}}
{{- if .Values.model.build.image -}}
{{- .Values.model.build.image -}}
{{- else -}}
{{- printf "%s:%s-export" .Values.image.repository (include "histoserve.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.buildEnabled" -}}
{{- if .Values.models -}}
{{- if include "histoserve.modelBuilds" . | fromJsonArray }}true{{ end -}}
{{- else if .Values.model.build.enabled }}true{{ end -}}
{{- end -}}

{{/* One export's args: a dict of root (the chart's context), b (the build values), spec
(the spec when b.spec is empty) and dir (the package set's folder). */}}
{{- define "histoserve.buildArgs" -}}
{{- $b := .b -}}
{{- $dir := include "histoserve.modelDir" .root -}}
- --spec={{ default .spec $b.spec }}
{{- if $b.timm }}
- --timm={{ $b.timm }}
{{- else }}
- --module={{ $b.module }}
{{- end }}
{{- with $b.weights }}
- --weights={{ $dir }}/{{ . }}
{{- end }}
- --dtype={{ $b.dtype }}
{{- if gt (int $b.maxBatch) 0 }}
- --max_batch={{ int $b.maxBatch }}
{{- end }}
{{- if gt (int .root.Values.gpu.count) 0 }}
- --device=cuda
{{- else }}
- --device=cpu
- --cpu_target={{ $b.cpuTarget }}
{{- end }}
{{- if ne $b.weightsLayout "auto" }}
- --weights_layout={{ $b.weightsLayout }}
{{- end }}
- --package_set={{ .dir }}
- --if_missing
- --lock_timeout_s={{ int $b.lockTimeoutSeconds }}
{{- end -}}

{{/* The init containers: model.build's, or one per models: entry with build.enabled
(histoserve.modelBuilds), each exporting into its own folder. */}}
{{- define "histoserve.buildInitContainers" -}}
{{- $dir := include "histoserve.modelDir" . -}}
{{- if .Values.models -}}
{{- range (include "histoserve.modelBuilds" . | fromJsonArray) }}
{{- $container := printf "build-%d-%s" (int .index) (regexReplaceAll "[^a-z0-9-]" (lower .name) "-") | trunc 63 | trimSuffix "-" }}
{{ include "histoserve.buildInitContainer" (dict "root" $ "b" .build "spec" .spec "dir" (printf "%s/%s" $dir .name) "name" $container) }}
{{- end -}}
{{- else -}}
{{ include "histoserve.buildInitContainer" (dict "root" . "b" .Values.model.build "spec" .Values.model.spec "dir" $dir "name" "build-package") }}
{{- end -}}
{{- end -}}

{{- define "histoserve.buildInitContainer" -}}
{{- $root := .root -}}
- name: {{ .name }}
  image: {{ include "histoserve.buildImage" $root }}
  imagePullPolicy: {{ $root.Values.image.pullPolicy }}
  command:
    - timeout
    - --kill-after=30
    - {{ int .b.timeoutSeconds | quote }}
    - python
    - -m
    - predictor.export
  args:
    {{- include "histoserve.buildArgs" . | nindent 4 }}
  env:
    {{- include "histoserve.env" $root | trim | nindent 4 }}
    {{- with $root.Values.server.extraEnv }}
    {{- toYaml . | nindent 4 }}
    {{- end }}
  resources:
    {{- include "histoserve.resources" $root | nindent 4 }}
  {{- with (include "histoserve.securityContext" $root) }}
  securityContext:
    {{- . | nindent 4 }}
  {{- end }}
  volumeMounts:
    - name: model-store
      mountPath: {{ $root.Values.storage.mountPath }}
      {{- with include "histoserve.pvcSubPath" $root }}
      subPath: {{ . }}
      {{- end }}
    - name: build-scratch
      mountPath: /tmp
      subPath: tmp
    - name: build-scratch
      mountPath: /var/cache/histoserve
      subPath: cache
    - name: build-scratch
      mountPath: /home/histoserve
      subPath: home
{{- end -}}

{{- define "histoserve.buildVolume" -}}
- name: build-scratch
  emptyDir:
    sizeLimit: {{ .Values.model.build.scratchSizeLimit }}
{{- end -}}

{{/* What model.build cannot work with, refused at render time with what to do instead. */}}
{{- define "histoserve.validateBuild" -}}
{{- $b := .Values.model.build -}}
{{- if $b.enabled -}}
{{- if not (include "histoserve.usesPvc" .) -}}
{{- fail (printf "model.build needs the model volume on a PVC the pod may write (storage.pvc or a pvc:// storageUri): storage.storageUri %q arrives in a volume KServe adds at admission (read-only for an oci:// modelcar), which the chart cannot mount into its init container; ship the package set in it instead (docs/deployment.md, \"Package sets\")" .Values.storage.storageUri) -}}
{{- end -}}
{{- if not (default .Values.model.spec $b.spec) -}}
{{- fail "model.build needs a spec: model.build.spec or model.spec" -}}
{{- end -}}
{{- if eq (empty $b.timm) (empty $b.module) -}}
{{- fail "model.build needs one weights source: model.build.timm (ARCH) or model.build.module (MODULE:FACTORY)" -}}
{{- end -}}
{{- if and $b.timm (not $b.weights) -}}
{{- fail "model.build.timm needs model.build.weights (the weights file in the model volume)" -}}
{{- end -}}
{{- if has ".." (splitList "/" $b.weights) -}}
{{- fail (printf "model.build.weights %q must stay inside the model volume" $b.weights) -}}
{{- end -}}
{{- if lt (int $b.lockTimeoutSeconds) (int $b.timeoutSeconds) -}}
{{- fail (printf "model.build.lockTimeoutSeconds (%d) must be >= model.build.timeoutSeconds (%d): a pod waiting for another's export must outlast its bound" (int $b.lockTimeoutSeconds) (int $b.timeoutSeconds)) -}}
{{- end -}}
{{- $batch := 32 -}}
{{- if ne .Values.batching.maxBatchSize nil }}{{ $batch = int .Values.batching.maxBatchSize }}{{ end -}}
{{- if and (gt (int $b.maxBatch) 0) (gt $batch (int $b.maxBatch)) -}}
{{- fail (printf "batching.maxBatchSize %d (32 when unset) is above model.build.maxBatch %d: the package would not fit the server's flags" $batch (int $b.maxBatch)) -}}
{{- end -}}
{{- if and .Values.image.digest (not $b.image) -}}
{{- fail "model.build with image.digest: the export image cannot be derived from a digest; set model.build.image to the export image built beside it (docker build --target export), by digest too" -}}
{{- end -}}
{{- if .Values.model.checkpoint -}}
{{- fail (printf "model.build with model.checkpoint %q: the server would serve that file, not the build that fits; leave model.checkpoint empty" .Values.model.checkpoint) -}}
{{- end -}}
{{- end -}}
{{- end -}}
