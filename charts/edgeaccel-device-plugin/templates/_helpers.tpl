{{/* The objects' name: the same as the kustomize manifests' unless nameOverride is set. */}}
{{- define "edgeaccel.name" -}}
{{- default "edgeaccel-device-plugin" .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* What every object carries; the pod template and selector carry only the first two. */}}
{{- define "edgeaccel.selectorLabels" -}}
app.kubernetes.io/name: {{ include "edgeaccel.name" . }}
{{- end -}}

{{- define "edgeaccel.labels" -}}
{{ include "edgeaccel.selectorLabels" . }}
app.kubernetes.io/part-of: edgeaccel
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{/* The kubelet's --root-dir on the host, from the preset. */}}
{{- define "edgeaccel.kubeletRoot" -}}
{{- $preset := .Values.kubelet.preset -}}
{{- if eq $preset "microk8s" -}}
/var/snap/microk8s/common/var/lib/kubelet
{{- else if eq $preset "custom" -}}
{{- required "kubelet.rootDir is required with kubelet.preset=custom" .Values.kubelet.rootDir -}}
{{- else -}}
/var/lib/kubelet
{{- end -}}
{{- end -}}

{{- define "edgeaccel.image" -}}
{{ .Values.image.repository }}:{{ default .Chart.AppVersion .Values.image.tag }}
{{- end -}}
