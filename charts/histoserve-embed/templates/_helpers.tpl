{{/*
Names. The Job is named <fullname>; its pods' host names are <fullname>-<index>,
so the name is kept to 52 characters.
*/}}
{{- define "embed.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 52 | trimSuffix "-" -}}
{{- end -}}

{{- define "embed.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 52 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 52 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "embed.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "embed.imageTag" -}}
{{- default .Chart.AppVersion .Values.image.tag -}}
{{- end -}}

{{- define "embed.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (include "embed.imageTag" .) -}}
{{- end -}}
{{- end -}}

{{- define "embed.selectorLabels" -}}
app.kubernetes.io/name: {{ include "embed.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "embed.labels" -}}
helm.sh/chart: {{ include "embed.chart" . }}
{{ include "embed.selectorLabels" . }}
app.kubernetes.io/version: {{ (include "embed.imageTag" .) | trunc 63 | trimSuffix "-" | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: histoserve
app.kubernetes.io/component: embed
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{- define "embed.metadata" -}}
namespace: {{ .Release.Namespace }}
labels:
  {{- include "embed.labels" . | nindent 2 }}
{{- with .Values.commonAnnotations }}
annotations:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end -}}

{{/* The container's name: podFailurePolicy rules name it. */}}
{{- define "embed.containerName" -}}embed{{- end -}}

{{- define "embed.manifestConfigMap" -}}
{{- printf "%s-manifest" (include "embed.fullname" .) -}}
{{- end -}}

{{/* Where the manifest ConfigMap is mounted. */}}
{{- define "embed.manifestDir" -}}/etc/histoserve-embed{{- end -}}

{{/* The --manifest path inside the pod. */}}
{{- define "embed.manifestFile" -}}
{{- if .Values.slides.manifest -}}
{{- printf "%s/slides.csv" (include "embed.manifestDir" .) -}}
{{- else if hasPrefix "/" .Values.slides.manifestPath -}}
{{- .Values.slides.manifestPath -}}
{{- else -}}
{{- printf "%s/%s" (trimSuffix "/" .Values.slides.mountPath) .Values.slides.manifestPath -}}
{{- end -}}
{{- end -}}

{{/*
The InferenceService URL(s) as a list, one per line. Derived as KServe names
its services: the predictor is <isvc>-predictor in both modes (Standard: a
ClusterIP Service, port 80 -> container 8080, gRPC on 8081; Knative: the
Knative Service's cluster-local name through the local gateway, port 80, one
protocol).
*/}}
{{- define "embed.urls" -}}
{{- $i := .Values.inferenceService -}}
{{- if $i.url -}}
{{- if kindIs "string" $i.url -}}
{{- $i.url -}}
{{- else -}}
{{- join "\n" $i.url -}}
{{- end -}}
{{- else -}}
{{- $ns := default .Release.Namespace $i.namespace -}}
{{- $host := printf "%s-predictor.%s.svc.%s" $i.name $ns $i.clusterDomain -}}
{{- if eq $i.protocol "grpc" -}}
{{- printf "grpc://%s:%s" $host (ternary "80" "8081" (eq $i.deploymentMode "Knative")) -}}
{{- else -}}
{{- printf "http://%s" $host -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* `histoserve embed` flags, one per line, --flag=value. */}}
{{- define "embed.args" -}}
{{- $e := .Values.embed -}}
- embed
- --manifest={{ include "embed.manifestFile" . }}
{{- range splitList "\n" (include "embed.urls" .) }}
- --url={{ . }}
{{- end }}
- --out={{ .Values.output.mountPath }}
- --shard=$(JOB_COMPLETION_INDEX)/{{ int .Values.completions }}
- --concurrency={{ int .Values.concurrency }}
{{- with .Values.inferenceService.model }}
- --model={{ . }}
{{- end }}
{{- with $e.mode }}
- --mode={{ . }}
{{- end }}
{{- if ne $e.targetMpp nil }}
- --target-mpp={{ $e.targetMpp }}
{{- end }}
{{- if ne $e.mppOverride nil }}
- --mpp-override={{ $e.mppOverride }}
{{- end }}
{{- if ne $e.mppTolerance nil }}
- --mpp-tolerance={{ $e.mppTolerance }}
{{- end }}
{{- with $e.tissue }}
- --tissue={{ . }}
{{- end }}
{{- if ne $e.minTissue nil }}
- --min-tissue={{ $e.minTissue }}
{{- end }}
{{- with $e.slideModel }}
- --slide-model={{ . }}
{{- end }}
{{- range $e.slideUrls }}
- --slide-url={{ . }}
{{- end }}
{{- if ne $e.batchSize nil }}
- --batch-size={{ int $e.batchSize }}
{{- end }}
{{- if ne $e.readWorkers nil }}
- --read-workers={{ int $e.readWorkers }}
{{- end }}
{{- if $e.force }}
- --force
{{- end }}
- --progress={{ $e.progress }}
{{- range $e.extraArgs }}
- {{ . | quote }}
{{- end }}
{{- end -}}

{{/* sidecar.istio.io/inject as a label (Istio's preferred form; the Job also
carries it as an annotation for older Istio): "false" unless istio.sidecar native. */}}
{{- define "embed.istioInject" -}}
sidecar.istio.io/inject: {{ ternary "true" "false" (eq .Values.istio.sidecar "native") | quote }}
{{- end -}}

{{- define "embed.prepareContainerName" -}}prepare-output{{- end -}}

{{/*
The init container making sure output.mountPath is writable by the pods' user
(output.prepare). fsGroup is not applied to ReadWriteMany CSI volumes under the
default fsGroupPolicy, and NFS ignores it: without this the first write of every
pod fails, one retry after another. check: a probe file as the pods' user, else
exit 2 (the podFailurePolicy fails the Job). chown: first, as root with
CAP_CHOWN only, chown the folder itself to runAsUser:runAsGroup.
*/}}
{{- define "embed.prepareContainer" -}}
{{- $mode := .Values.output.prepare -}}
{{- if ne $mode "none" -}}
{{- $psc := .Values.podSecurityContext | default dict -}}
{{- $uid := int (dig "runAsUser" 10001 $psc) -}}
{{- $gid := int (dig "runAsGroup" 10001 $psc) -}}
{{- $out := .Values.output.mountPath -}}
{{- if eq $mode "chown" }}
- name: chown-output
  image: {{ include "embed.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command: [chown, "{{ $uid }}:{{ $gid }}", {{ $out | quote }}]
  securityContext:
    runAsUser: 0
    runAsGroup: 0
    runAsNonRoot: false
    allowPrivilegeEscalation: false
    readOnlyRootFilesystem: true
    capabilities:
      drop: [ALL]
      add: [CHOWN]
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "embed.outputMount" . | nindent 4 }}
{{- end }}
- name: {{ include "embed.prepareContainerName" . }}
  image: {{ include "embed.image" . | quote }}
  imagePullPolicy: {{ .Values.image.pullPolicy }}
  command:
    - python
    - -c
    - |
      import os, sys, tempfile
      out = sys.argv[1]
      try:
          tempfile.NamedTemporaryFile(dir=out, prefix=".write-check-").close()
      except OSError as exc:
          print(f"histoserve-embed: {out} is not writable by uid {os.getuid()} gid {os.getgid()} "
                f"groups {os.getgroups()}: {exc}. fsGroup does not apply to NFS or ReadWriteMany CSI "
                "volumes: chown the folder to that uid (or set output.prepare=chown), or set "
                "podSecurityContext.runAsUser/runAsGroup/supplementalGroups to its owner", file=sys.stderr)
          sys.exit(2)
    - {{ $out }}
  env:
    - name: PYTHONDONTWRITEBYTECODE
      value: "1"
  {{- with .Values.securityContext }}
  securityContext:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  {{- with .Values.resources }}
  resources:
    {{- toYaml . | nindent 4 }}
  {{- end }}
  volumeMounts:
    {{- include "embed.outputMount" . | nindent 4 }}
{{- end -}}
{{- end -}}

{{/* The output volume's mount (the Job's container and its init containers). */}}
{{- define "embed.outputMount" -}}
- name: output
  mountPath: {{ .Values.output.mountPath }}
  {{- with .Values.output.pvc.subPath }}
  subPath: {{ . }}
  {{- end }}
{{- end -}}

{{/* Checks the schema cannot express. */}}
{{- define "embed.validate" -}}
{{- $i := .Values.inferenceService -}}
{{- if and (not $i.name) (not $i.url) -}}
{{- fail "set inferenceService.name (the histoserve InferenceService, e.g. h0-histoserve) or inferenceService.url" -}}
{{- end -}}
{{- if not .Values.slides.pvc.claimName -}}
{{- fail "set slides.pvc.claimName: the PVC holding the slides (mounted read-only)" -}}
{{- end -}}
{{- if not .Values.output.pvc.claimName -}}
{{- fail "set output.pvc.claimName: the PVC the feature files are written to" -}}
{{- end -}}
{{- if and (not .Values.slides.manifest) (not .Values.slides.manifestPath) -}}
{{- fail "set slides.manifest (--set-file slides.manifest=cohort.csv) or slides.manifestPath (a CSV on the slides volume)" -}}
{{- end -}}
{{- if .Values.slides.manifest -}}
{{- include "embed.checkManifest" . -}}
{{- end -}}
{{- if gt (len .Values.slides.manifest) 1000000 -}}
{{- fail (printf "slides.manifest is %d bytes; a ConfigMap holds at most 1 MiB: put the CSV on the slides volume and set slides.manifestPath" (len .Values.slides.manifest)) -}}
{{- end -}}
{{- if gt (int .Values.parallelism) (int .Values.completions) -}}
{{- fail (printf "parallelism (%d) > completions (%d): the extra pods would have no shard" (int .Values.parallelism) (int .Values.completions)) -}}
{{- end -}}
{{- if and (ne .Values.maxFailedIndexes nil) (gt (int .Values.maxFailedIndexes) (int .Values.completions)) -}}
{{- fail (printf "maxFailedIndexes (%d) must be <= completions (%d)" (int .Values.maxFailedIndexes) (int .Values.completions)) -}}
{{- end -}}
{{- if eq .Values.output.mountPath .Values.slides.mountPath -}}
{{- fail "output.mountPath and slides.mountPath must differ" -}}
{{- end -}}
{{- end -}}

{{/*
An inline manifest lives in a ConfigMap at /etc/histoserve-embed/slides.csv and
the client resolves relative paths against the manifest's folder: so every
path (and bulk_rna, mask) there must be absolute. Checked here, at install, rather
than as every slide failing in the pods. Lines with quotes are left to the
client's CSV parser.
*/}}
{{- define "embed.checkManifest" -}}
{{- $lines := splitList "\n" (.Values.slides.manifest | replace "\r" "") -}}
{{- $header := splitList "," (first $lines | trimPrefix "\ufeff") -}}
{{- $cols := dict -}}
{{- range $i, $h := $header -}}
{{- $_ := set $cols (trim $h) $i -}}
{{- end -}}
{{- if not (hasKey $cols "path") -}}
{{- fail (printf "slides.manifest: the first line must be the header slide_id,path[,mpp][,bulk_rna][,mask], got %q" (first $lines)) -}}
{{- end -}}
{{- $mount := trimSuffix "/" .Values.slides.mountPath -}}
{{- range $n, $line := rest $lines -}}
{{- if and (trim $line) (not (contains "\"" $line)) -}}
{{- $fields := splitList "," $line -}}
{{- range $col := list "path" "bulk_rna" "mask" -}}
{{- if hasKey $cols $col -}}
{{- $i := int (get $cols $col) -}}
{{- $p := "" -}}
{{- if lt $i (len $fields) }}{{ $p = trim (index $fields $i) }}{{ end -}}
{{- if and $p (not (hasPrefix "/" $p)) -}}
{{- fail (printf "slides.manifest line %d: %s %q is relative; a manifest in a ConfigMap needs absolute paths as the pod sees them, e.g. %s/%s (or put the CSV on the slides volume and set slides.manifestPath: relative paths resolve against its folder)" (add $n 2) $col $p $mount $p) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- end -}}
