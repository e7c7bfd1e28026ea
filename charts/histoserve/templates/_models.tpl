{{/*
models: several models in one server (docs/deployment.md, "Several models in one
server"). Each entry is a folder <model dir>/<name>/ of the model volume; the
server runs --models with their names, and each entry's settings reach it as
<name>.json in the ConfigMap mounted at histoserve.modelSettingsDir
(--model_settings), over the folder's own histoserve.json.
*/}}
{{- define "histoserve.modelSettingsDir" -}}/etc/histoserve/models{{- end -}}

{{/* --models: the entries' names, comma-separated. */}}
{{- define "histoserve.modelNames" -}}
{{- $names := list -}}
{{- range .Values.models }}{{ $names = append $names .name }}{{ end -}}
{{- join "," $names -}}
{{- end -}}

{{- define "histoserve.modelSettingsMount" -}}
- name: model-settings
  mountPath: {{ include "histoserve.modelSettingsDir" . }}
  readOnly: true
{{- end -}}

{{/* The name the probes, NOTES and helm test ask for: the first model's. */}}
{{- define "histoserve.servedName" -}}
{{- if .Values.models -}}
{{- (first .Values.models).name -}}
{{- else -}}
{{- .Values.model.name -}}
{{- end -}}
{{- end -}}

{{- define "histoserve.servedSpec" -}}
{{- if .Values.models -}}
{{- default "" (first .Values.models).spec -}}
{{- else -}}
{{- .Values.model.spec -}}
{{- end -}}
{{- end -}}

{{/* One entry's settings file (JSON): the server flags its values set. */}}
{{- define "histoserve.modelSettings" -}}
{{- $s := dict -}}
{{- with .spec }}{{ $_ := set $s "spec" . }}{{ end -}}
{{- with .modelClass }}{{ $_ := set $s "model_class" . }}{{ end -}}
{{- if ne .weight nil }}{{ $_ := set $s "weight" .weight }}{{ end -}}
{{- $b := default dict .batching -}}
{{- if ne $b.maxBatchSize nil }}{{ $_ := set $s "max_batch_size" (int $b.maxBatchSize) }}{{ end -}}
{{- if ne $b.maxLatencyMs nil }}{{ $_ := set $s "max_latency_ms" $b.maxLatencyMs }}{{ end -}}
{{- if ne $b.maxQueueSize nil }}{{ $_ := set $s "max_queue_size" (int $b.maxQueueSize) }}{{ end -}}
{{- if ne $b.instancesPerDevice nil }}{{ $_ := set $s "instances_per_device" (int $b.instancesPerDevice) }}{{ end -}}
{{- toJson $s -}}
{{- end -}}

{{/* The entries with build.enabled as a JSON list of {index, name, spec, build}: build is
the entry's values over model.build's (image, timeouts and scratch are model.build's). */}}
{{- define "histoserve.modelBuilds" -}}
{{- $out := list -}}
{{- range $i, $m := .Values.models -}}
{{- $own := default dict $m.build -}}
{{- if $own.enabled -}}
{{- $b := merge (deepCopy $own) (deepCopy $.Values.model.build) -}}
{{- $out = append $out (dict "index" $i "name" $m.name "spec" (default "" $m.spec) "build" $b) -}}
{{- end -}}
{{- end -}}
{{- toJson $out -}}
{{- end -}}

{{/* What models: cannot be combined with, refused at render time with what to do instead. */}}
{{- define "histoserve.validateModels" -}}
{{- if .Values.models -}}
{{- $names := list -}}
{{- range .Values.models -}}
{{- if has .name $names -}}
{{- fail (printf "models: %q is listed twice (one folder, one model)" .name) -}}
{{- end -}}
{{- $names = append $names .name -}}
{{- end -}}
{{- if .Values.model.build.enabled -}}
{{- fail "model.build.enabled with models: set build.enabled on each models: entry that needs an export (model.build keeps the image, timeouts and scratch)" -}}
{{- end -}}
{{- if or .Values.model.checkpoint .Values.model.spec .Values.model.modelClass -}}
{{- fail "model.checkpoint, model.spec and model.modelClass are one model's: with models, set spec and modelClass on each entry (each folder's package is chosen in it)" -}}
{{- end -}}
{{- if and (include "histoserve.modelBuilds" . | fromJsonArray) (not (include "histoserve.usesPvc" .)) -}}
{{- fail (printf "models: build needs the model volume on a PVC the pod may write (storage.pvc or a pvc:// storageUri): storage.storageUri %q arrives read-only; ship each model's folder in it instead" .Values.storage.storageUri) -}}
{{- end -}}
{{- range (include "histoserve.modelBuilds" . | fromJsonArray) -}}
{{- if not (default .spec .build.spec) -}}
{{- fail (printf "models: %s: build needs a spec (build.spec or spec)" .name) -}}
{{- end -}}
{{- if eq (empty .build.timm) (empty .build.module) -}}
{{- fail (printf "models: %s: build needs one weights source: build.timm (ARCH) or build.module (MODULE:FACTORY)" .name) -}}
{{- end -}}
{{- if and .build.timm (not .build.weights) -}}
{{- fail (printf "models: %s: build.timm needs build.weights (the weights file in the model volume)" .name) -}}
{{- end -}}
{{- if has ".." (splitList "/" (toString .build.weights)) -}}
{{- fail (printf "models: %s: build.weights %q must stay inside the model volume" .name .build.weights) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
