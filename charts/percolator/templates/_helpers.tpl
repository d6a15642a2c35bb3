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
The namespace of every namespaced object: namespaceOverride, else the release's.
*/}}
{{- define "percolator.namespace" -}}
{{- default .Release.Namespace .Values.namespaceOverride }}
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
The annotations of an object, from (dict "ctx" $ "extra" (list MAP...)): customAnnotations,
then each extra map (the object's own values, then what the chart itself needs), a later one
winning. Empty when there are none, so that no object carries an empty annotations map.
*/}}
{{- define "percolator.annotations" -}}
{{- $annotations := dict }}
{{- range (prepend (.extra | default list) (.ctx.Values.customAnnotations | default dict)) }}
{{- range $key, $value := (. | default dict) }}
{{- $_ := set $annotations $key (toString $value) }}
{{- end }}
{{- end }}
{{- if $annotations }}
{{- toYaml $annotations }}
{{- end }}
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
{{- printf "%s.%s.svc" (include "percolator.fullname" .) (include "percolator.namespace" .) }}
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
{{- if and (eq $type "existing-secret") .Values.apiService.create (not .Values.apiService.caBundle) (not .Values.apiService.insecureSkipTLSVerify) (not .Values.apiService.annotations) }}
{{- fail "tls.type=existing-secret: set apiService.caBundle to the PEM CA that signed the Secret's certificate (or apiService.annotations for an injector such as cert-manager's)" }}
{{- end }}
{{- $pdb := .Values.podDisruptionBudget }}
{{- if and $pdb.enabled (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget.enabled: set minAvailable or maxUnavailable" }}
{{- end }}
{{- if eq $type "cert-manager" }}
{{- include "percolator.requireAPI" (dict "ctx" . "groupVersion" "cert-manager.io/v1" "kind" "Certificate" "crd" "certificates.cert-manager.io" "value" "tls.type=cert-manager" "provider" "cert-manager (https://cert-manager.io/docs/installation/)" "off" "choose another tls.type (helm, the default, needs nothing)") }}
{{- $issuer := .Values.tls.certManager.existingIssuer }}
{{- if and $issuer.enabled (not $issuer.name) }}
{{- fail "tls.certManager.existingIssuer.enabled: set tls.certManager.existingIssuer.name (and kind: Issuer in percolator's namespace, or ClusterIssuer)" }}
{{- end }}
{{- end }}
{{- if .Values.serviceMonitor.enabled }}
{{- include "percolator.requireAPI" (dict "ctx" . "groupVersion" "monitoring.coreos.com/v1" "kind" "ServiceMonitor" "crd" "servicemonitors.monitoring.coreos.com" "value" "serviceMonitor.enabled" "provider" "the Prometheus Operator's CRDs (kube-prometheus-stack or prometheus-operator-crds)" "off" "set serviceMonitor.enabled=false") }}
{{- end }}
{{- if .Values.prometheusRule.enabled }}
{{- include "percolator.requireAPI" (dict "ctx" . "groupVersion" "monitoring.coreos.com/v1" "kind" "PrometheusRule" "crd" "prometheusrules.monitoring.coreos.com" "value" "prometheusRule.enabled" "provider" "the Prometheus Operator's CRDs (kube-prometheus-stack or prometheus-operator-crds)" "off" "set prometheusRule.enabled=false") }}
{{- end }}
{{- if not (kindIs "invalid" .Values.logLevel) }}
{{- range concat (.Values.defaultArgs | default list) (.Values.args | default list) }}
{{- if or (eq . "-v") (eq . "--v") (hasPrefix "-v=" .) (hasPrefix "--v=" .) }}
{{- fail (printf "logLevel is --v=%v: remove %s from args/defaultArgs (a flag may be given once)" $.Values.logLevel .) }}
{{- end }}
{{- end }}
{{- end }}
{{- end }}

{{/*
Fails, naming the CRD and what to do, when the cluster does not serve a kind of custom resource
the values ask for. From (dict "ctx" $ "groupVersion" GV "kind" KIND "crd" CRD_NAME "value"
VALUE "provider" WHO "off" HOW_TO_TURN_IT_OFF). A cluster's discovery lists GV/KIND; `helm
template --api-versions GV` lists GV alone: either is enough.
*/}}
{{- define "percolator.requireAPI" -}}
{{- $apis := .ctx.Capabilities.APIVersions }}
{{- if not (or ($apis.Has (printf "%s/%s" .groupVersion .kind)) ($apis.Has .groupVersion)) }}
{{- fail (printf "%s renders a %s (%s), but the cluster has no CRD %s: install %s first, or %s. With helm template (no cluster), pass --api-versions %s." .value .kind .groupVersion .crd .provider .off .groupVersion) }}
{{- end }}
{{- end }}

{{/*
Why the PodDisruptionBudget the values ask for would block every voluntary eviction, and so
every node drain (an empty text when it would not): as the disruption controller counts, a
percentage rounded up. Fails on a budget Kubernetes would refuse.
*/}}
{{- define "percolator.pdbBlocks" -}}
{{- $pdb := .Values.podDisruptionBudget }}
{{- $replicas := int .Values.replicas }}
{{- if and (kindIs "invalid" $pdb.minAvailable) (kindIs "invalid" $pdb.maxUnavailable) }}
{{- fail "podDisruptionBudget.enabled: set minAvailable or maxUnavailable" }}
{{- end }}
{{- if not (kindIs "invalid" $pdb.maxUnavailable) }}
{{- $max := toString $pdb.maxUnavailable }}
{{- if not (regexMatch "^[0-9]+%?$" $max) }}
{{- fail (printf "podDisruptionBudget.maxUnavailable %s: a number of pods or a percentage (25%%)" $max) }}
{{- end }}
{{- if eq (int (trimSuffix "%" $max)) 0 }}maxUnavailable {{ $max }} lets no pod be evicted
{{- else if lt $replicas 1 }}replicas {{ $replicas }} leaves no pod to protect
{{- end }}
{{- else }}
{{- $min := toString $pdb.minAvailable }}
{{- if not (regexMatch "^[0-9]+%?$" $min) }}
{{- fail (printf "podDisruptionBudget.minAvailable %s: a number of pods or a percentage (50%%)" $min) }}
{{- end }}
{{- if hasSuffix "%" $min }}
{{- /* ceil(percent * replicas / 100) >= replicas */}}
{{- if gt (mul (int (trimSuffix "%" $min)) $replicas) (mul 100 (sub $replicas 1)) }}minAvailable {{ $min }} of replicas {{ $replicas }} keeps every pod
{{- end }}
{{- else if ge (int $min) $replicas }}minAvailable {{ $min }} with replicas {{ $replicas }} keeps every pod
{{- end }}
{{- end }}
{{- end }}

{{/*
A probe of the container from (dict "name" VALUE_NAME "probe" VALUE): the default's httpGet is
replaced by a handler given in values (Helm merges a map given in values with the default one,
so {tcpSocket: ...} would otherwise come with the default's httpGet, which kube-apiserver
refuses: one handler per probe); timings given alone keep the default's handler. Fails on a
probe with no handler.
*/}}
{{- define "percolator.probe" -}}
{{- $probe := deepCopy .probe }}
{{- $given := list }}
{{- range list "exec" "tcpSocket" "grpc" }}
{{- if hasKey $probe . }}{{ $given = append $given . }}{{ end }}
{{- end }}
{{- if $given }}
{{- $_ := unset $probe "httpGet" }}
{{- end }}
{{- if gt (len $given) 1 }}
{{- fail (printf "%s: one handler per probe, not %s" .name (join " and " $given)) }}
{{- end }}
{{- if not (or $given (hasKey $probe "httpGet")) }}
{{- fail (printf "%s: give a handler (httpGet, exec, tcpSocket or grpc) beside its timings, or set it to null for no probe" .name) }}
{{- end }}
{{- toYaml $probe }}
{{- end }}
