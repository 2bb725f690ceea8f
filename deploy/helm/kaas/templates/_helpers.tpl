{{/* Names and labels shared by every template. */}}
{{- define "kaas.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.fullname" -}}
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

{{- define "kaas.headless" -}}
{{- printf "%s-brokers" (include "kaas.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.operatorName" -}}
{{- printf "%s-operator" (include "kaas.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "kaas.dataClaim" -}}
{{- default (printf "%s-data" (include "kaas.fullname" .)) .Values.storage.data.existingClaim -}}
{{- end -}}

{{- define "kaas.controlPlaneClaim" -}}
{{- default (printf "%s-control-plane" (include "kaas.fullname" .)) .Values.storage.controlPlane.existingClaim -}}
{{- end -}}

{{- define "kaas.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "kaas.brokerSelector" -}}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: broker
{{- end -}}

{{- define "kaas.operatorSelector" -}}
app.kubernetes.io/name: {{ include "kaas.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kaas.image" -}}
{{- printf "%s:%s" .image.repository (default .chart.AppVersion .image.tag) -}}
{{- end -}}

{{/* terminationGracePeriodSeconds: above the controlled-shutdown timeout. */}}
{{- define "kaas.gracePeriod" -}}
{{- $shutdown := div (add .Values.broker.shutdownTimeoutMs 999) 1000 -}}
{{- if kindIs "invalid" .Values.broker.terminationGracePeriodSeconds -}}
{{- add $shutdown 15 -}}
{{- else -}}
{{- $g := int .Values.broker.terminationGracePeriodSeconds -}}
{{- if le $g $shutdown -}}
{{- fail (printf "broker.terminationGracePeriodSeconds (%d) must exceed broker.shutdownTimeoutMs (%d ms): the kubelet would SIGKILL the broker in the middle of its partition hand-off" $g (int .Values.broker.shutdownTimeoutMs)) -}}
{{- end -}}
{{- $g -}}
{{- end -}}
{{- end -}}
