{{/*
The name of every object: the release name when it already says routewarden
(`helm install routewarden ...` gives deploy/'s names), else `<release>-routewarden`.
*/}}
{{- define "routewarden.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{/*
Selector labels. `app.kubernetes.io/name` is always `routewarden`: the PodMonitor's jobLabel
makes it job="routewarden", which the alert rules and dashboard select on. The instance label
keeps two releases (say one for legacy-kernel nodes) from selecting each other's pods.
*/}}
{{- define "routewarden.selectorLabels" -}}
app.kubernetes.io/name: routewarden
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{/* Labels of every object: deploy/'s `app.kubernetes.io/name` plus Helm's usual ones. */}}
{{- define "routewarden.labels" -}}
{{ include "routewarden.selectorLabels" . }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "routewarden.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "routewarden.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/*
The subjects of every binding: the agent's ServiceAccount.
*/}}
{{- define "routewarden.subjects" -}}
- kind: ServiceAccount
  name: {{ include "routewarden.serviceAccountName" . }}
  namespace: {{ .Release.Namespace }}
{{- end -}}

{{/*
RBAC: every ClusterRole of the chart starts with "routewarden.clusterRoleMeta" and every one
the agent itself holds is bound with "routewarden.clusterRoleBinding", both called with
(dict "root" $ "name" <name>). A further role (a user-facing status role reading the agents'
pods, an events writer for the agent) is then one template with its rules behind an
`rbac.<role>.create` toggle, and a binding only where the agent holds it.
*/}}
{{- define "routewarden.clusterRoleMeta" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata:
  name: {{ .name }}
  labels:
    {{- include "routewarden.labels" .root | nindent 4 }}
{{- end -}}

{{- define "routewarden.clusterRoleBinding" -}}
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata:
  name: {{ .name }}
  labels:
    {{- include "routewarden.labels" .root | nindent 4 }}
roleRef:
  apiGroup: rbac.authorization.k8s.io
  kind: ClusterRole
  name: {{ .name }}
subjects:
  {{- include "routewarden.subjects" .root | nindent 2 }}
{{- end -}}

{{/* The namespaces whose calico-node DaemonSet env the agent reads. */}}
{{- define "routewarden.calicoNodeEnvNamespaces" -}}
{{- $ns := .Values.rbac.calicoNodeEnvNamespaces -}}
{{- if .Values.operator.enabled -}}
{{- $ns = append $ns .Values.operator.namespace -}}
{{- end -}}
{{- toJson (uniq $ns) -}}
{{- end -}}

{{/*
The container's resources: `resources`, with `largeCluster.resources` merged over them when
that variant is on (only memory changes there, as in deploy/large-cluster).
*/}}
{{- define "routewarden.resources" -}}
{{- $r := deepCopy .Values.resources -}}
{{- if .Values.largeCluster.enabled -}}
{{- $r = mustMergeOverwrite $r (deepCopy .Values.largeCluster.resources) -}}
{{- end -}}
{{- toYaml $r -}}
{{- end -}}
