{{/* The vcuda image: repository with the digest when set, else the tag (default appVersion). */}}
{{- define "vcuda.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end -}}

{{/* The cluster's version as major.minor.patch, without a provider's suffix (v1.33.5-gke.1). */}}
{{- define "vcuda.clusterVersion" -}}
{{- $v := semver .Capabilities.KubeVersion.Version -}}
{{ printf "v%d.%d.%d" $v.Major $v.Minor $v.Patch }}
{{- end -}}

{{/* Refuses values that cannot work on this cluster, each with what to do. */}}
{{- define "vcuda.refuse" -}}
{{- $cluster := semver .Capabilities.KubeVersion.Version -}}
{{- if and (eq .Values.path "dra") (lt $cluster.Minor 34) -}}
{{- fail (printf "vcuda: path dra needs Kubernetes 1.34 or later (resource.k8s.io/v1); this cluster is %s: use path nvidia-device-plugin or placement" (include "vcuda.clusterVersion" .)) -}}
{{- end -}}
{{- with .Values.placement.kubeScheduler.tag -}}
{{- if eq $.Values.path "placement" -}}
{{- $want := semver . -}}
{{- if or (ne $want.Major $cluster.Major) (gt $want.Minor $cluster.Minor) (lt $want.Minor (sub $cluster.Minor 1)) -}}
{{- fail (printf "vcuda: placement.kubeScheduler.tag %s does not fit this cluster (%s): kube-scheduler may be the API server's minor version or one older; leave the tag empty to take the cluster's" . (include "vcuda.clusterVersion" $)) -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- if and .Values.networkPolicy.enabled (not .Values.networkPolicy.from) -}}
{{- fail "vcuda: networkPolicy.enabled needs networkPolicy.from: the peers from which the API server reaches the webhook on your network (manifests/webhook-networkpolicy/networkpolicy.yaml says which fit which network); a policy without them blocks the API server and so every vcuda pod" -}}
{{- end -}}
{{- if and (ne .Values.path "placement") (ne .Values.placement.scheduler "second-scheduler") -}}
{{- fail (printf "vcuda: placement.scheduler %s is for path placement, not %s: set path placement or leave placement.scheduler alone" .Values.placement.scheduler .Values.path) -}}
{{- end -}}
{{- end -}}
