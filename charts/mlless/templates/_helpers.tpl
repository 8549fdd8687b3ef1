{{/*
Names and labels shared by every template. Resource names are `<fullname>-<component>`.
*/}}

{{/* The chart name, or nameOverride. */}}
{{- define "mlless.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The release-scoped name prefix: fullnameOverride, else the release name when it already contains
the chart name (`helm install mlless charts/mlless` gives `mlless`), else `<release>-<chart>`.
Truncated to leave room for the longest component suffix ("-operator-metrics", 17 characters).
*/}}
{{- define "mlless.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 46 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 46 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{/* Name of the operator's Deployment (and of its Role objects). */}}
{{- define "mlless.operator.fullname" -}}
{{- printf "%s-operator" (include "mlless.fullname" .) }}
{{- end }}

{{/* Chart name and version, for the helm.sh/chart label. */}}
{{- define "mlless.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Labels on every object of the release. */}}
{{- define "mlless.labels" -}}
helm.sh/chart: {{ include "mlless.chart" . }}
{{ include "mlless.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: mlless
{{- end }}

{{/* Selector labels of the operator pod. They never change across upgrades. */}}
{{- define "mlless.selectorLabels" -}}
app.kubernetes.io/name: {{ include "mlless.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "mlless.operator.selectorLabels" -}}
{{ include "mlless.selectorLabels" . }}
app.kubernetes.io/component: operator
{{- end }}

{{/* The operator's ServiceAccount. */}}
{{- define "mlless.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "mlless.operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* The image reference: an empty tag means the chart's appVersion; a digest is appended with @. */}}
{{- define "mlless.image" -}}
{{- $tag := default .Chart.AppVersion .Values.image.tag }}
{{- if hasPrefix "sha256:" $tag }}
{{- printf "%s@%s" .Values.image.repository $tag }}
{{- else if hasPrefix "@" $tag }}
{{- printf "%s%s" .Values.image.repository $tag }}
{{- else }}
{{- printf "%s:%s" .Values.image.repository $tag }}
{{- end }}
{{- end }}
