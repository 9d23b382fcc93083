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

{{/*
"true" where the own-node ValidatingAdmissionPolicy is rendered: with the node labels, when
admissionPolicy.enabled, on an API server that serves admissionregistration.k8s.io/v1
ValidatingAdmissionPolicy (Kubernetes 1.30+). `helm template` without a cluster knows only the
API groups and its --kube-version, hence the version test beside the kind.
*/}}
{{- define "edgeaccel.ownNodePolicy" -}}
{{- $served := or (.Capabilities.APIVersions.Has "admissionregistration.k8s.io/v1/ValidatingAdmissionPolicy") (semverCompare ">=1.30.0-0" .Capabilities.KubeVersion.Version) -}}
{{- if and .Values.nodeLabels.enabled .Values.admissionPolicy.enabled $served -}}
true
{{- end -}}
{{- end -}}

{{/*
Refuses the node labels without the own-node policy: RBAC's patch on nodes is every Node, and
without the policy every node's pod could taint, cordon or relabel all of them. Only an explicit
nodeLabels.allowPatchingAnyNode=true accepts that.
*/}}
{{- define "edgeaccel.checkNodeWrites" -}}
{{- if and .Values.nodeLabels.enabled (not (include "edgeaccel.ownNodePolicy" .)) (not .Values.nodeLabels.allowPatchingAnyNode) -}}
{{- $why := "admissionPolicy.enabled=false" -}}
{{- if .Values.admissionPolicy.enabled -}}
{{- $why = printf "the API server (Kubernetes %s) serves no ValidatingAdmissionPolicy (1.30+)" .Capabilities.KubeVersion.Version -}}
{{- end -}}
{{- fail (printf "nodeLabels.enabled=true without the admission policy (%s) would let every node's pod patch every Node: taint, cordon or relabel the whole cluster. Where Node Feature Discovery runs, set nfd.enabled=true and nodeLabels.enabled=false (no API access at all); or set nodeLabels.allowPatchingAnyNode=true to accept that risk." $why) -}}
{{- end -}}
{{- end -}}

{{/*
The DRA drivers that publish dra.families' devices (include/edgeaccel/dra/dra_driver.h), as a JSON
list of their names' first part: edgetpu (coral-pcie, coral-usb), gpu (tegra, nvidia).
*/}}
{{- define "edgeaccel.draDrivers" -}}
{{- $families := splitList "," .Values.dra.families -}}
{{- $drivers := list -}}
{{- if or (has "all" $families) (has "coral-pcie" $families) (has "coral-usb" $families) -}}
{{- $drivers = append $drivers "edgetpu" -}}
{{- end -}}
{{- if or (has "all" $families) (has "tegra" $families) (has "nvidia" $families) -}}
{{- $drivers = append $drivers "gpu" -}}
{{- end -}}
{{- toJson $drivers -}}
{{- end -}}
