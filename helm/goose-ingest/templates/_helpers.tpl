{{/* Chart name, truncated to a DNS label. */}}
{{- define "goose-ingest.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: release-name + chart name unless the release name already contains it. */}}
{{- define "goose-ingest.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "goose-ingest.selectorLabels" -}}
app.kubernetes.io/name: {{ include "goose-ingest.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: worker
{{- end -}}

{{- define "goose-ingest.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "goose-ingest.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: goose-ingest
{{- end -}}

{{- define "goose-ingest.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "goose-ingest.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* Defaults mirror services/settings.py. */}}
{{- define "goose-ingest.shards" -}}{{ int (default (ternary 16 4 (.Values.settings.redis_cluster | default false)) .Values.settings.shards) }}{{- end -}}
{{- define "goose-ingest.group" -}}{{ default "goose-ingest" .Values.settings.group }}{{- end -}}

{{/* Raw shard stream name i: [<namespace>:]<raw_stream_prefix>.<i>, or .{s<i>} in cluster mode (KeyLayout.raw_stream). */}}
{{- define "goose-ingest.rawStream" -}}
{{- $prefix := default "goose.raw" .root.Values.settings.raw_stream_prefix -}}
{{- $name := ternary (printf "%s.{s%d}" $prefix (int .shard)) (printf "%s.%d" $prefix (int .shard)) (.root.Values.settings.redis_cluster | default false) -}}
{{- if .root.Values.settings.namespace -}}{{ printf "%s:%s" .root.Values.settings.namespace $name }}{{- else -}}{{ $name }}{{- end -}}
{{- end -}}
