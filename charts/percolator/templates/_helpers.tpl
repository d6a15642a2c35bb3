{{/*
The chart name, or nameOverride.
*/}}
{{- define "percolator.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The full name of the objects: fullnameOverride, else the release name when it contains the
chart name, else <release>-<chart>. With release "percolator" every object has the name the
kustomize manifests (deploy/) give it.
*/}}
{{- define "percolator.fullname" -}}
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

{{/*
A text made a valid label value: characters other than letters, digits, '-', '_' and '.'
become '_' (a digest-pinned 0.2.0@sha256:... or a build 0.2.0+1), at most 63 characters,
beginning and ending with a letter or digit.
*/}}
{{- define "percolator.labelValue" -}}
{{- regexReplaceAll "[^-A-Za-z0-9_.]" (toString .) "_" | trunc 63 | trimAll "-_." }}
{{- end }}

{{- define "percolator.chart" -}}
{{- include "percolator.labelValue" (printf "%s-%s" .Chart.Name .Chart.Version) }}
{{- end }}

{{/*
The chart's own labels of every object: the version is the chart's appVersion (never
image.tag, which may be pinned by digest), as a label value.
*/}}
{{- define "percolator.ownLabels" -}}
helm.sh/chart: {{ include "percolator.chart" . | quote }}
{{ include "percolator.selectorLabels" . }}
{{- with include "percolator.labelValue" (.Chart.AppVersion | default "") }}
app.kubernetes.io/version: {{ . | quote }}
{{- end }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: percolator
{{- end }}

{{/*
Labels of an object, from (dict "ctx" $ "extra" (list MAP...)): commonLabels, then each extra
map (e.g. serviceMonitor.labels), then the chart's own labels, a later one winning: no key
twice, and the selector labels never overridden.
*/}}
{{- define "percolator.labelsWith" -}}
{{- $labels := dict }}
{{- range (prepend (.extra | default list) (.ctx.Values.commonLabels | default dict)) }}
{{- range $key, $value := . }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- end }}
{{- range $key, $value := include "percolator.ownLabels" .ctx | fromYaml }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- toYaml $labels }}
{{- end }}

{{/*
Labels of every object: commonLabels and the chart's own labels.
*/}}
{{- define "percolator.labels" -}}
{{- include "percolator.labelsWith" (dict "ctx" . "extra" list) }}
{{- end }}

{{/*
Selector labels: the Deployment's, the Service's, the PodDisruptionBudget's, the
NetworkPolicy's and the default anti-affinity's.
*/}}
{{- define "percolator.selectorLabels" -}}
app.kubernetes.io/name: {{ include "percolator.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{/*
The pod template's labels: the selector labels and podLabels, nothing that changes with the
chart's version (a chart-only upgrade rolls no pod). podLabels never override the selector's.
*/}}
{{- define "percolator.podLabels" -}}
{{- $labels := dict }}
{{- range $key, $value := include "percolator.selectorLabels" . | fromYaml }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- range $key, $value := .Values.podLabels }}
{{- if not (hasKey $labels $key) }}
{{- $_ := set $labels $key (toString $value) }}
{{- end }}
{{- end }}
{{- toYaml $labels }}
{{- end }}

{{/*
The image: repository:tag, the tag being the chart's appVersion when empty. A tag given as a
number (--set image.tag=20240101, or unquoted in a values file, which YAML reads as a float)
is written as the digits.
*/}}
{{- define "percolator.image" -}}
{{- $tag := .Values.image.tag }}
{{- if kindIs "float64" $tag }}
{{- if eq $tag (float64 (int64 $tag)) }}{{ $tag = int64 $tag }}{{ end }}
{{- end }}
{{- $tag = ternary "" (toString $tag) (kindIs "invalid" $tag) }}
{{- printf "%s:%s" .Values.image.repository ($tag | default .Chart.AppVersion) }}
{{- end }}

{{/*
The ServiceAccount percolator runs as.
*/}}
{{- define "percolator.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (include "percolator.fullname" .) .Values.serviceAccount.name }}
{{- else }}
{{- default "default" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/*
The ServiceAccount the ServiceMonitor's scrapes authenticate as.
*/}}
{{- define "percolator.scraperName" -}}
{{- printf "%s-metrics-scraper" (include "percolator.fullname" .) | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/*
The Service's DNS name, which the serving certificate is for.
*/}}
{{- define "percolator.serviceDNSName" -}}
{{- printf "%s.%s.svc" (include "percolator.fullname" .) .Release.Namespace }}
{{- end }}

{{/*
tls.type, with metrics-server's spelling existingSecret read as existing-secret.
*/}}
{{- define "percolator.tlsType" -}}
{{- $type := .Values.tls.type }}
{{- if eq $type "existingSecret" }}existing-secret{{ else }}{{ $type }}{{ end }}
{{- end }}

{{/*
The Secret holding the serving certificate (tls.crt, tls.key): cert-manager's is
<fullname>-serving-cert (as deploy/overlays/cert-manager), the chart's own (tls.type=helm)
<fullname>-tls, another name, so that switching between the two in an upgrade never has Helm
and cert-manager fight over one Secret.
*/}}
{{- define "percolator.servingSecretName" -}}
{{- $type := include "percolator.tlsType" . }}
{{- if eq $type "existing-secret" }}
{{- required "tls.existingSecret.name is required with tls.type=existing-secret: a kubernetes.io/tls Secret valid for the Service's DNS name" .Values.tls.existingSecret.name }}
{{- else if eq $type "cert-manager" }}
{{- printf "%s-serving-cert" (include "percolator.fullname" .) }}
{{- else }}
{{- printf "%s-tls" (include "percolator.fullname" .) }}
{{- end }}
{{- end }}

{{/*
The APIService NAME as the cluster holds it, as JSON: {} when there is none, and offline
(helm template, --dry-run=client, lint), where lookup returns nothing.
*/}}
{{- define "percolator.currentAPIService" -}}
{{- toJson (lookup "apiregistration.k8s.io/v1" "APIService" "" .) }}
{{- end }}

{{/*
Whether an adapter configuration is given (rules.*): "true" or "".
*/}}
{{- define "percolator.hasAdapterConfig" -}}
{{- $r := .Values.rules }}
{{- if or $r.existing $r.default $r.custom $r.external $r.resource }}true{{ end }}
{{- end }}

{{/*
The port Prometheus is reached at: prometheus.port, else the URL scheme's.
*/}}
{{- define "percolator.prometheusPort" -}}
{{- if .Values.prometheus.port }}
{{- .Values.prometheus.port }}
{{- else if hasPrefix "https://" (tpl .Values.prometheus.url .) }}443
{{- else }}80
{{- end }}
{{- end }}

{{/*
--prometheus-url: URL:PORT/PATH, as prometheus-adapter's chart builds it.
*/}}
{{- define "percolator.prometheusURL" -}}
{{- $url := tpl .Values.prometheus.url . | trimSuffix "/" }}
{{- $path := .Values.prometheus.path | default "" }}
{{- if and $path (not (hasPrefix "/" $path)) }}{{ $path = printf "/%s" $path }}{{ end }}
{{- if .Values.prometheus.port }}
{{- printf "%s:%v%s" $url .Values.prometheus.port $path }}
{{- else }}
{{- printf "%s%s" $url $path }}
{{- end }}
{{- end }}

{{/*
The environment variable carrying the value of secret header NAME.
*/}}
{{- define "percolator.secretHeaderEnv" -}}
{{- printf "PROMETHEUS_HEADER_%s" (. | upper | replace "-" "_") }}
{{- end }}

{{/*
Refusals of inconsistent values, with a message naming them. Included by the Deployment.
*/}}
{{- define "percolator.validate" -}}
{{- if and .Values.hostNetwork.enabled (eq (int .Values.containerPort) 10250) }}
{{- fail "hostNetwork.enabled: containerPort 10250 is the kubelet's port on every node; set containerPort to a free node port (e.g. 4443)" }}
{{- end }}
{{- $p := .Values.prometheus }}
{{- if and $p.bearerToken.secretName $p.bearerToken.serviceAccountToken }}
{{- fail "prometheus.bearerToken: set secretName or serviceAccountToken, not both" }}
{{- end }}
{{- if and (or $p.bearerToken.secretName $p.bearerToken.serviceAccountToken) $p.basicAuth.secretName }}
{{- fail "prometheus: bearerToken and basicAuth are exclusive (one Authorization header)" }}
{{- end }}
{{- range $name, $ref := $p.secretHeaders }}
{{- if hasKey $p.headers $name }}
{{- fail (printf "prometheus.secretHeaders.%s: also in prometheus.headers; give a header once" $name) }}
{{- end }}
{{- if not (regexMatch "^[A-Za-z0-9-]+$" $name) }}
{{- fail (printf "prometheus.secretHeaders.%s: a header name is letters, digits and '-'" $name) }}
{{- end }}
{{- end }}
{{- $type := include "percolator.tlsType" . }}
{{- if eq $type "existing-secret" }}
{{- $_ := include "percolator.servingSecretName" . }}
{{- end }}
{{- if and (eq $type "existing-secret") (not .Values.apiService.caBundle) (not .Values.apiService.insecureSkipTLSVerify) (not .Values.apiService.annotations) }}
{{- fail "tls.type=existing-secret: set apiService.caBundle to the PEM CA that signed the Secret's certificate (or apiService.annotations for an injector such as cert-manager's)" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget.enabled: set minAvailable or maxUnavailable" }}
{{- end }}
{{- if not (kindIs "invalid" .Values.logLevel) }}
{{- range concat (.Values.defaultArgs | default list) (.Values.args | default list) }}
{{- if or (eq . "-v") (eq . "--v") (hasPrefix "-v=" .) (hasPrefix "--v=" .) }}
{{- fail (printf "logLevel is --v=%v: remove %s from args/defaultArgs (a flag may be given once)" $.Values.logLevel .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}
