{{/* Standard names and labels, as `helm create` and kube-prometheus-stack spell them. */}}

{{- define "kuberl-operator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Full name: <release>-<chart>, or the release name alone when it already contains the chart name. */}}
{{- define "kuberl-operator.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "kuberl-operator.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{- end }}

{{- define "kuberl-operator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuberl-operator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end }}

{{- define "kuberl-operator.labels" -}}
helm.sh/chart: {{ include "kuberl-operator.chart" . }}
{{ include "kuberl-operator.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kuberl
{{- end }}

{{- define "kuberl-operator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "kuberl-operator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{- define "kuberl-operator.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) }}
{{- end }}

{{- define "kuberl-operator.trainerImage" -}}
{{- with .Values.jobDefaults.trainerImage }}
{{- printf "%s:%s" .repository (default $.Chart.AppVersion .tag) }}
{{- end }}
{{- end }}

{{- define "kuberl-operator.rolloutImage" -}}
{{- with .Values.jobDefaults.rolloutImage }}
{{- printf "%s:%s" .repository (default $.Chart.AppVersion .tag) }}
{{- end }}
{{- end }}

{{/* "true" when the operator watches every namespace (no operator.watchNamespace). */}}
{{- define "kuberl-operator.clusterWide" -}}
{{- if not .Values.operator.watchNamespace }}true{{ end }}
{{- end }}
