#!/usr/bin/env python3
"""Converts the values of prometheus-adapter's or metrics-server's Helm chart into the values of
percolator's chart (charts/percolator), for an operator replacing one of them with percolator.

usage: scripts/convert-values.py --from prometheus-adapter|metrics-server [-o OUT] [--strict]
                                 VALUES.yaml [VALUES.yaml ...]
       scripts/convert-values.py --from ANCHOR [-o OUT] [--strict] -f VALUES.yaml [-f ...]
       scripts/convert-values.py --tables markdown|json

The values are those of prometheus-adapter's chart 5.3.0 (prometheus-community/helm-charts) and
metrics-server's chart 3.13.1 (kubernetes-sigs/metrics-server). Several files are merged in
order, as `helm install -f a.yaml -f b.yaml` merges them: maps key by key, a later value
winning, null removing a default. `-` reads standard input (`helm get values RELEASE -o yaml |`).

Writes percolator's values as YAML (on stdout, or to OUT), with a comment header saying what
they came from, and on stderr a report of one line per key:
  KEY: not carried: WHY    a setting percolator's chart cannot express, a key the anchor's
                           chart does not have, or a value of the wrong type
  KEY: note: WHAT          carried with a changed meaning, or left to percolator's own default
Keys of a list name the flag (args[--kubelet-insecure-tls]). A value equal to what percolator
does anyway is carried without a line.

--strict   any key not carried is an error: the report is printed, nothing is written, exit 1.
--tables   prints the mapping tables (docs/migrating-values.md embeds the markdown ones).

Exit status: 0; 1 on an unreadable or malformed values file (the message names it) or, with
--strict, on a key not carried; 2 on a bad command line.

Needs Python 3.9+ and PyYAML (Debian: apt-get install python3-yaml; the test environment .venv
has it). Reads percolator's defaults from charts/percolator/values.yaml of the checkout it is
in. The mapping, key by key: docs/migrating-values.md.
"""
import argparse
import copy
import json
import re
import sys
from pathlib import Path

try:
    import yaml
except ImportError:  # pragma: no cover - depends on the machine
    sys.exit(
        "convert-values.py needs PyYAML: apt-get install python3-yaml (Debian), or run it with "
        "the test environment's .venv/bin/python"
    )

CHART_VALUES = Path(__file__).resolve().parent.parent / "charts" / "percolator" / "values.yaml"
ANCHORS = {
    "prometheus-adapter": "prometheus-adapter's chart 5.3.0",
    "metrics-server": "metrics-server's chart 3.13.1",
}
# The path of the ServiceAccount token in a pod (what --prometheus-auth-incluster sends).
SA_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
# Not in values.yaml, but read by the chart's templates (commented examples there).
ABSENT = object()


class Loader(yaml.SafeLoader):
    """YAML as Helm reads it: no timestamps (an unquoted date stays the text it is)."""


Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}


class Dumper(yaml.SafeDumper):
    """Multi-line strings (PromQL, PEM) as literal blocks, lists indented under their key."""

    def increase_indent(self, flow=False, indentless=False):
        return super().increase_indent(flow, False)


def _str(dumper, text):
    style = "|" if "\n" in text and not re.search(r"[ \t]\n|\t", text) else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


Dumper.add_representer(str, _str)


class Key:
    """One value of an anchor's chart: its path, its default there (ABSENT: read by the
    templates, not in values.yaml), where it goes in percolator's chart, and why. `free` marks
    a map the operator fills (labels, a Probe): its keys are not the chart's."""

    def __init__(self, path, default, target, why, free=False):
        self.path, self.default, self.target, self.why, self.free = path, default, target, why, free


K = Key
NONE = "not carried"

PROBE_WHY = (
    "timings that differ from the chart's default are carried; percolator probes its own "
    "`/livez` and `/readyz`; another handler is carried when percolator serves it (`tcpSocket`, "
    "`httpGet` of `/healthz`, `/livez`, `/readyz` on `https`)"
)

def probe(name, path, **timings):
    """A probe of the anchor's chart: `httpGet` of `path` on `https` with `timings`."""
    handler = {"httpGet": {"path": path, "port": "https", "scheme": "HTTPS"}}
    return K(name, {**handler, **timings}, name, PROBE_WHY, True)


MERGED_WHY = "the fields that differ from the chart's default, merged into percolator's restricted context"


def restricted(run_as_user):
    """The restricted container security context both anchors' charts default to."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": run_as_user,
        "seccompProfile": {"type": "RuntimeDefault"},
        "capabilities": {"drop": ["ALL"]},
    }


def image(repository, whose):
    """The anchor's image keys: `whose` image (`the adapter's`), which percolator's replaces."""
    return [
        K("image.repository", repository, NONE,
          f"{whose} image; percolator's chart runs its own (ghcr.io/une-tasse-de/percolator): "
          "mirror that one and set image.repository"),
        K("image.tag", "", NONE, f"{whose} version, not percolator's"),
        K("image.pullPolicy", "IfNotPresent", "image.pullPolicy", "same meaning"),
    ]


def budget(max_unavailable):
    """The anchor's PodDisruptionBudget keys (both charts have the same four)."""
    pdb = "podDisruptionBudget"
    return [
        K(f"{pdb}.enabled", False, f"{pdb}.enabled",
          "when true; percolator's budget (minAvailable 1) stays otherwise"),
        K(f"{pdb}.minAvailable", None, f"{pdb}.minAvailable", f"with {pdb}.enabled"),
        K(f"{pdb}.maxUnavailable", max_unavailable, f"{pdb}.maxUnavailable", f"with {pdb}.enabled"),
        K(f"{pdb}.unhealthyPodEvictionPolicy", None, f"{pdb}.unhealthyPodEvictionPolicy", "same meaning"),
    ]


ADAPTER = [
    K("affinity", {}, "affinity", "merged with percolator's default anti-affinity (replicas spread over nodes)", True),
    K("topologySpreadConstraints", [], "topologySpreadConstraints", "same meaning"),
    K("nameOverride", "", "nameOverride", "same meaning"),
    K("fullnameOverride", "", "fullnameOverride", "same meaning"),
    *image("registry.k8s.io/prometheus-adapter/prometheus-adapter", "the adapter's"),
    K("image.pullSecrets", [], "imagePullSecrets", "names become `{name: NAME}` entries"),
    K("logLevel", 4, "logLevel", "when not the chart's default 4 (percolator's default is 1)"),
    K("metricsRelistInterval", "1m", "metricsRelistInterval", "same meaning, always written"),
    K("listenPort", 6443, "containerPort", "when not 6443, or with hostNetwork.enabled (a port of the node)"),
    K("nodeSelector", {}, "nodeSelector", "same meaning", True),
    K("priorityClassName", "", "priorityClassName",
      "when set; empty keeps percolator's system-cluster-critical"),
    K("namespaceOverride", "", "namespaceOverride", "same meaning"),
    K("customAnnotations", {}, "customAnnotations, podAnnotations",
      "annotations of every object and of the pods, as the adapter's chart puts them", True),
    K("customLabels", {}, "commonLabels, podLabels",
      "labels of every object and of the pods, as the adapter's chart puts them", True),
    K("prometheus.url", "http://prometheus.default.svc", "prometheus.url", "same meaning (templated), always written"),
    K("prometheus.port", 9090, "prometheus.port", "same meaning, always written"),
    K("prometheus.path", "", "prometheus.path", "same meaning"),
    K("replicas", 1, "replicas", "when not 1 (percolator runs 2 with a PodDisruptionBudget)"),
    K("podSecurityContext", {"fsGroup": 10001}, "podSecurityContext", MERGED_WHY, True),
    K("securityContext", restricted(10001), "securityContext", MERGED_WHY, True),
    K("rbac.create", True, "rbac.create", "same meaning"),
    K("rbac.useAuthReaderClusterRole", False, NONE,
      "true: percolator binds the Role extension-apiserver-authentication-reader in kube-system"),
    K("rbac.externalMetrics.resources", ["*"], NONE,
      "other than [\"*\"]: percolator grants the HPA controller every resource of the group"),
    K("rbac.customMetrics.resources", ["*"], NONE,
      "other than [\"*\"]: percolator grants the HPA controller every resource of the group"),
    K("automountServiceAccountToken", True, NONE,
      "false: percolator needs its token (pods and nodes watch, delegated authentication)"),
    K("serviceAccount.create", True, "serviceAccount.create", "same meaning"),
    K("serviceAccount.name", None, "serviceAccount.name", "same meaning"),
    K("serviceAccount.annotations", {}, "serviceAccount.annotations", "same meaning", True),
    K("serviceAccount.automountServiceAccountToken", True, NONE,
      "false: percolator needs its token (pods and nodes watch, delegated authentication)"),
    K("dnsConfig", {}, "dnsConfig", "same meaning", True),
    K("resources", {}, "resources", "when set: replaces percolator's sizing whole", True),
    *(probe(name, "/healthz", initialDelaySeconds=30, timeoutSeconds=5)
      for name in ("livenessProbe", "readinessProbe")),
    K("startupProbe", {}, "startupProbe", PROBE_WHY, True),
    K("rules.default", True, "rules.default, customMetrics.enabled",
      "always written (percolator's default is false); the same six rules"),
    K("rules.custom", [], "rules.custom, customMetrics.enabled", "same rules"),
    K("rules.existing", None, "rules.existing", "same ConfigMap (key config.yaml)"),
    K("rules.external", [], "rules.external, externalMetrics.enabled", "same rules"),
    K("rules.resource", ABSENT, "rules.resource, resourceMetrics.enabled",
      "same rules; CPU and memory then come from Prometheus", True),
    K("service.annotations", {}, "service.annotations", "same meaning", True),
    K("service.port", 443, "service.port", "same meaning"),
    K("service.type", "ClusterIP", "service.type", "same meaning"),
    K("service.clusterIP", ABSENT, NONE, "percolator's Service takes the address the cluster gives it"),
    K("service.ipDualStack.enabled", False, NONE,
      "true: percolator's Service has the cluster's default IP family"),
    K("service.ipDualStack.ipFamilies", ["IPv6", "IPv4"], NONE, "with service.ipDualStack.enabled"),
    K("service.ipDualStack.ipFamilyPolicy", "PreferDualStack", NONE, "with service.ipDualStack.enabled"),
    K("tls.enable", False, NONE,
      "true: percolator reads the pair from a Secret: create one (kubectl create secret tls) and set "
      "tls.type=existing-secret, tls.existingSecret.name and apiService.caBundle (tls.ca)"),
    K("tls.ca", "# Public CA file that signed the APIService", NONE, "with tls.enable"),
    K("tls.key", "# Private key of the APIService", NONE, "with tls.enable"),
    K("tls.certificate", "# Public key of the APIService", NONE, "with tls.enable"),
    K("env", [], "env", "same meaning"),
    K("extraArguments", [], "args, defaultArgs, chart values", "flag by flag: see the flags table"),
    K("extraContainers", [], NONE, "percolator's chart has no sidecar containers"),
    K("extraVolumes", [], "extraVolumes", "same meaning"),
    K("extraVolumeMounts", [], "extraVolumeMounts", "same meaning"),
    K("tolerations", [], "tolerations", "same meaning"),
    K("podLabels", {}, "podLabels", "same meaning", True),
    K("podAnnotations", {}, "podAnnotations", "same meaning", True),
    K("deploymentAnnotations", {}, "deploymentAnnotations", "same meaning", True),
    K("hostNetwork.enabled", False, "hostNetwork.enabled", "same meaning (dnsPolicy ClusterFirstWithHostNet)"),
    K("dnsPolicy", ABSENT, NONE,
      "other than ClusterFirstWithHostNet with hostNetwork, which percolator's chart sets itself"),
    K("strategy", {"type": "RollingUpdate", "rollingUpdate": {"maxUnavailable": "25%", "maxSurge": "25%"}},
      "updateStrategy", "when not the chart's default (percolator never takes a replica down first)", True),
    *budget(1),
    K("certManager.enabled", False, "tls.type: cert-manager",
      "same issuers: self-signed, a CA, the serving certificate"),
    K("certManager.caCertDuration", "43800h0m0s", "tls.certManager.caDuration", "with certManager.enabled"),
    K("certManager.certDuration", "8760h0m0s", "tls.certManager.duration", "with certManager.enabled"),
    K("certManager.caCertRevisionHistoryLimit", None, NONE, "percolator's Certificates keep cert-manager's default"),
    K("certManager.certRevisionHistoryLimit", None, NONE, "percolator's Certificates keep cert-manager's default"),
    K("extraManifests", [], "extraManifests", "same meaning"),
    K("revisionHistoryLimit", 10, "revisionHistoryLimit", "when not 10 (Kubernetes' default, percolator's too)"),
]

METRICS_SERVER = [
    *image("registry.k8s.io/metrics-server/metrics-server", "metrics-server's"),
    K("imagePullSecrets", [], "imagePullSecrets", "same meaning"),
    K("nameOverride", "", "nameOverride", "same meaning"),
    K("fullnameOverride", "", "fullnameOverride", "same meaning"),
    K("serviceAccount.create", True, "serviceAccount.create", "same meaning"),
    K("serviceAccount.annotations", {}, "serviceAccount.annotations", "same meaning", True),
    K("serviceAccount.name", "", "serviceAccount.name", "same meaning"),
    K("serviceAccount.secrets", [], NONE, "percolator's ServiceAccount lists no mountable secrets"),
    K("rbac.create", True, "rbac.create", "same meaning"),
    K("rbac.pspEnabled", False, NONE, "true: PodSecurityPolicy is gone since Kubernetes 1.25"),
    K("apiService.create", True, "apiService.create", "same meaning"),
    K("apiService.annotations", {}, "apiService.annotations", "same meaning", True),
    K("apiService.insecureSkipTLSVerify", True, "apiService.insecureSkipTLSVerify",
      "true is carried with a tls.type other than metrics-server; with metrics-server's self-signed "
      "certificate percolator's chart makes a CA the APIService verifies instead"),
    K("apiService.caBundle", "", "apiService.caBundle", "same meaning"),
    K("commonLabels", {}, "commonLabels", "same meaning (not on the pods, as in metrics-server's chart)", True),
    K("podLabels", {}, "podLabels", "same meaning", True),
    K("podAnnotations", {}, "podAnnotations", "same meaning", True),
    K("podSecurityContext", {}, "podSecurityContext", MERGED_WHY, True),
    K("securityContext", restricted(1000), "securityContext", MERGED_WHY, True),
    K("priorityClassName", "system-cluster-critical", "priorityClassName", "same meaning"),
    K("containerPort", 10250, "containerPort", "same meaning"),
    K("hostNetwork.enabled", False, "hostNetwork.enabled", "same meaning"),
    K("replicas", 1, "replicas", "when not 1 (percolator runs 2 with a PodDisruptionBudget)"),
    K("revisionHistoryLimit", None, "revisionHistoryLimit", "same meaning"),
    K("updateStrategy", {}, "updateStrategy", "when set: replaces percolator's (never a replica down first)", True),
    *budget(None),
    K("defaultArgs", [
        "--cert-dir=/tmp",
        "--kubelet-preferred-address-types=InternalIP,ExternalIP,Hostname",
        "--kubelet-use-node-status-port",
        "--metric-resolution=15s",
    ], "defaultArgs, args, chart values", "flag by flag: see the flags table"),
    K("args", [], "args, defaultArgs, chart values", "flag by flag: see the flags table"),
    probe("livenessProbe", "/livez", initialDelaySeconds=0, periodSeconds=10, failureThreshold=3),
    probe("readinessProbe", "/readyz", initialDelaySeconds=20, periodSeconds=10, failureThreshold=3),
    K("service.type", "ClusterIP", "service.type", "same meaning"),
    K("service.port", 443, "service.port", "same meaning"),
    K("service.annotations", {}, "service.annotations", "same meaning", True),
    K("service.labels", {}, "service.labels", "same meaning", True),
    K("addonResizer.enabled", False, NONE,
      "true: percolator's memory grows with the pods (about 2 KiB each): size resources for the cluster instead"),
    K("addonResizer.image.repository", "registry.k8s.io/autoscaling/addon-resizer", NONE, "with addonResizer.enabled"),
    K("addonResizer.image.tag", "1.8.23", NONE, "with addonResizer.enabled"),
    K("addonResizer.securityContext", restricted(1000), NONE, "with addonResizer.enabled", True),
    K("addonResizer.resources", {
        "requests": {"cpu": "40m", "memory": "25Mi"},
        "limits": {"cpu": "40m", "memory": "25Mi"},
    }, NONE, "with addonResizer.enabled", True),
    K("addonResizer.nanny.cpu", "0m", NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.extraCpu", "1m", NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.memory", "0Mi", NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.extraMemory", "2Mi", NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.minClusterSize", 100, NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.pollPeriod", 300000, NONE, "with addonResizer.enabled"),
    K("addonResizer.nanny.threshold", 5, NONE, "with addonResizer.enabled"),
    K("metrics.enabled", False, "args: --authorization-always-allow-paths",
      "/metrics served without authorization, as metrics-server's flag does (health paths kept)"),
    K("serviceMonitor.enabled", False, "serviceMonitor.enabled",
      "with metrics.enabled, as metrics-server's chart renders it; percolator's scrapes with a token"),
    K("serviceMonitor.additionalLabels", {}, "serviceMonitor.additionalLabels", "same meaning", True),
    K("serviceMonitor.interval", "1m", "serviceMonitor.interval", "same meaning"),
    K("serviceMonitor.scrapeTimeout", "10s", "serviceMonitor.scrapeTimeout", "same meaning"),
    K("serviceMonitor.metricRelabelings", [], "serviceMonitor.metricRelabelings", "same meaning"),
    K("serviceMonitor.relabelings", [], "serviceMonitor.relabelings", "same meaning"),
    K("resources", {"requests": {"cpu": "100m", "memory": "200Mi"}}, "resources",
      "when not the chart's default: replaces percolator's sizing whole", True),
    K("extraVolumeMounts", [], "extraVolumeMounts", "same meaning"),
    K("extraVolumes", [], "extraVolumes", "same meaning"),
    K("nodeSelector", {}, "nodeSelector", "same meaning", True),
    K("tolerations", [], "tolerations", "same meaning"),
    K("affinity", {}, "affinity", "merged with percolator's default anti-affinity (replicas spread over nodes)", True),
    K("topologySpreadConstraints", [], "topologySpreadConstraints", "same meaning"),
    K("dnsConfig", {}, "dnsConfig", "same meaning", True),
    K("deploymentAnnotations", {}, "deploymentAnnotations", "same meaning", True),
    K("schedulerName", "", "schedulerName", "same meaning"),
    K("tmpVolume", {"emptyDir": {}}, NONE, "other than an emptyDir: percolator's /tmp is an emptyDir", True),
    K("tls.type", "metrics-server", "tls.type",
      "metrics-server becomes helm (the chart's CA, verified); helm, cert-manager, existingSecret carried"),
    K("tls.clusterDomain", "cluster.local", "tls.clusterDomain", "same meaning"),
    K("tls.certManager.addInjectorAnnotations", True, NONE,
      "false: percolator's chart always has cert-manager inject the CA (unless apiService.insecureSkipTLSVerify)"),
    K("tls.certManager.existingIssuer.enabled", False, "tls.certManager.existingIssuer.enabled", "same meaning"),
    K("tls.certManager.existingIssuer.kind", "Issuer", "tls.certManager.existingIssuer.kind", "same meaning"),
    K("tls.certManager.existingIssuer.name", "my-issuer", "tls.certManager.existingIssuer.name", "same meaning"),
    K("tls.certManager.duration", "", "tls.certManager.duration", "same meaning"),
    K("tls.certManager.renewBefore", "", "tls.certManager.renewBefore", "same meaning"),
    K("tls.certManager.annotations", {}, "tls.certManager.annotations", "same meaning", True),
    K("tls.certManager.labels", {}, "tls.certManager.labels", "same meaning", True),
    K("tls.helm.lookup", True, "tls.helm.lookup", "same meaning"),
    K("tls.helm.certDurationDays", 365, "tls.helm.certDurationDays",
      "when not 365 (percolator's default is 3650: it renews only when its Secret is deleted)"),
    K("tls.existingSecret.name", "", "tls.existingSecret.name", "same meaning"),
    K("tls.existingSecret.lookup", True, "apiService.caBundle",
      "not needed: chart 3.13.1's lookup never fills the caBundle (its variable is redeclared "
      "inside the if); percolator takes apiService.caBundle"),
    K("additionalAnnotations", ABSENT, NONE,
      "annotations of the self-signed Issuer only; customAnnotations put annotations on every object", True),
]

TABLES = {"prometheus-adapter": ADAPTER, "metrics-server": METRICS_SERVER}

# Flags: anchor's name -> (what becomes of it, where it goes, why). Kinds: "args" (percolator
# has the flag: appended to args or, for its defaultArgs' flags, written there), "value" (a value
# of percolator's chart), "chart" (percolator's chart sets it itself: not needed), NONE.
SAME = "same flag and meaning"


def not_carried(why, *names):
    """Flags percolator's chart cannot carry, for one reason."""
    return {name: (NONE, "", why) for name in names}


FLAGS = {
    # Same name and meaning (percolator's flags follow the generic Kubernetes API server's,
    # metrics-server's and prometheus-adapter's).
    **{name: ("args", f"--{name}", SAME) for name in (
        "bind-address", "tls-min-version", "http2-max-streams-per-connection", "max-requests-inflight",
        "request-timeout", "shutdown-delay-duration", "kubeconfig",
        "kubelet-port", "kubelet-use-node-status-port", "kubelet-insecure-tls",
        "kubelet-certificate-authority", "kubelet-preferred-address-types", "kubelet-request-timeout",
        "prometheus-ca-file", "prometheus-client-tls-cert-file", "prometheus-client-tls-key-file",
        "metrics-max-age",
        "authentication-kubeconfig", "authorization-kubeconfig", "client-ca-file",
        "requestheader-client-ca-file", "requestheader-allowed-names", "requestheader-username-headers",
        "requestheader-group-headers", "requestheader-extra-headers-prefix", "requestheader-uid-headers",
        "authentication-skip-lookup", "authentication-tolerate-lookup-failure", "anonymous-auth",
        "authentication-token-webhook-cache-ttl", "authorization-webhook-cache-authorized-ttl",
        "authorization-webhook-cache-unauthorized-ttl", "authorization-always-allow-paths",
        "authorization-always-allow-groups",
    )},
    "tls-min-version": ("args", "--tls-min-version", "same flag; VersionTLS12 or VersionTLS13"),
    "http2-max-streams-per-connection": ("args", "--http2-max-streams-per-connection", "same flag; 100 or more"),
    "prometheus-token-file": ("args", "--prometheus-token-file",
                              f"same flag; {SA_TOKEN} becomes prometheus.bearerToken.serviceAccountToken"),
    "metric-resolution": ("args", "--cache-ttl", "how often a node's kubelet sample is renewed while requests "
                                                 "need it, and how long answers are cached"),
    "v": ("value", "logLevel", "same level"),
    "secure-port": ("value", "containerPort", "the port inside the pod"),
    "prometheus-url": ("value", "prometheus.url", "port and path left empty: the flag wins, as in the adapter"),
    "prometheus-header": ("value", "prometheus.headers", "NAME=VALUE, one entry each"),
    "prometheus-auth-incluster": ("value", "prometheus.bearerToken.serviceAccountToken",
                                  "the pod's token; Prometheus' certificate is checked with the system's CAs or "
                                  "prometheus.tls.ca"),
    "metrics-relist-interval": ("value", "metricsRelistInterval", "same meaning"),
    "cert-dir": ("chart", "", "not needed: the chart always gives percolator its serving certificate files"),
    "tls-cert-file": (NONE, "", "percolator's chart sets it from tls.type: use tls.type=existing-secret with "
                                "tls.existingSecret.name (the Secret these files come from)"),
    "tls-private-key-file": (NONE, "", "percolator's chart sets it from tls.type: use tls.type=existing-secret "
                                       "with tls.existingSecret.name (the Secret these files come from)"),
    "config": (NONE, "", "percolator's chart sets --adapter-config from rules.*: put the file in a ConfigMap "
                         "(key config.yaml) and set rules.existing"),
    "tls-cipher-suites": (NONE, "", "percolator's TLS (rustls) offers its own suites: ECDHE with AES-GCM or "
                                    "ChaCha20-Poly1305"),
    "tls-sni-cert-key": (NONE, "", "percolator serves one certificate"),
    **not_carried("percolator authenticates to the kubelets with its ServiceAccount token",
                  "kubelet-client-certificate", "kubelet-client-key"),
    "deprecated-kubelet-completely-insecure": (NONE, "", "percolator always reaches the kubelets over TLS "
                                                         "(--kubelet-insecure-tls skips the verification)"),
    "node-selector": (NONE, "", "percolator reads every node's kubelet"),
    "prometheus-auth-config": (NONE, "", "give the CA, token or client certificate as files: prometheus.tls.*, "
                                         "prometheus.bearerToken, prometheus.basicAuth"),
    "prometheus-verb": (NONE, "", "percolator always POSTs its queries"),
    "disable-http2": (NONE, "", "percolator serves HTTP/2 (kube-apiserver multiplexes its requests over it)"),
    **not_carried("percolator serves no profiling endpoints", "profiling", "contention-profiling"),
    **not_carried("percolator logs JSON on stderr",
                  "logging-format", "logtostderr", "alsologtostderr", "log-file", "log-dir"),
    "vmodule": (NONE, "", "percolator's verbosity is one level (logLevel)"),
    **not_carried("percolator binds its port alone", "permit-port-sharing", "permit-address-sharing"),
    "feature-gates": (NONE, "", "percolator has no Kubernetes feature gates"),
}
# Flags of prometheus-adapter, metrics-server and the generic server that take no value.
BOOL_FLAGS = {
    "kubelet-use-node-status-port", "kubelet-insecure-tls", "authentication-skip-lookup",
    "authentication-tolerate-lookup-failure", "anonymous-auth", "prometheus-auth-incluster",
    "disable-http2", "profiling", "contention-profiling", "logtostderr", "alsologtostderr",
    "permit-port-sharing", "permit-address-sharing", "deprecated-kubelet-completely-insecure",
    "version", "help",
}
# What metrics-server's binary does without the flag, where percolator's chart passes it.
METRICS_SERVER_FLAG_DEFAULTS = {"metric-resolution": "60s"}
# The generic Kubernetes API server's always-allowed paths (the default metrics.enabled replaces).
HEALTH_PATHS = "/healthz,/readyz,/livez"
TLS_VERSIONS = {"VersionTLS12", "VersionTLS13"}
TIMINGS = {"initialDelaySeconds", "periodSeconds", "timeoutSeconds", "failureThreshold", "successThreshold",
           "terminationGracePeriodSeconds"}
HANDLERS = ("httpGet", "tcpSocket", "exec", "grpc")


class InputError(Exception):
    """A values file that cannot be read as values; the message names it."""


def load(path):
    """The values of one file: a map (an empty file is no values, as for helm)."""
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text()
    except OSError as error:
        raise InputError(f"{path}: cannot read: {error.strerror or error}") from None
    try:
        values = yaml.load(text, Loader=Loader)
    except yaml.YAMLError as error:
        where = getattr(error, "problem_mark", None)
        at = f" (line {where.line + 1}, column {where.column + 1})" if where else ""
        problem = getattr(error, "problem", None) or str(error).splitlines()[0]
        raise InputError(f"{path}: not YAML{at}: {problem}") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise InputError(f"{path}: expected a map of values at the top, got {kind(values)}")
    return values


def kind(value):
    """A value's type in words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return "a number"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "a list"
    if isinstance(value, dict):
        return "a map"
    return "null" if value is None else type(value).__name__


def merge(into, values, keep_nulls=False):
    """Helm's coalescing of values into the values so far: maps merge key by key, a later value
    wins, and null removes the key (with `keep_nulls`, the null is kept, to remove the chart's
    default when the user's files are merged into it)."""
    for key, value in values.items():
        if value is None and not keep_nulls:
            into.pop(key, None)
        elif isinstance(value, dict) and isinstance(into.get(key), dict):
            merge(into[key], value, keep_nulls)
        else:
            into[key] = copy.deepcopy(value)
    return into


def get(tree, path, default=None):
    node = tree
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return default
        node = node[part]
    return node


def put(tree, path, value):
    parts = path.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value


def tree_of(table):
    """The anchor's default values, from its table."""
    tree = {}
    for key in table:
        if key.default is not ABSENT:
            put(tree, key.path, copy.deepcopy(key.default))
    return tree


def replacing(default, value):
    """`value`, with null for each key of percolator's `default` it does not have, so that Helm's
    merge with percolator's default gives exactly `value`."""
    if not (isinstance(default, dict) and isinstance(value, dict)):
        return copy.deepcopy(value)
    out = {key: replacing(default.get(key), item) for key, item in value.items()}
    for key in default:
        if key not in value:
            out[key] = None
    return out


def differing(default, value):
    """The parts of map `value` that differ from map `default` (a key `value` lacks is left out:
    Helm's merge keeps percolator's there)."""
    out = {}
    for key, item in value.items():
        if isinstance(item, dict) and isinstance(default.get(key), dict):
            inner = differing(default[key], item)
            if inner:
                out[key] = inner
        elif key not in default or default[key] != item:
            out[key] = copy.deepcopy(item)
    return out


class Flag:
    """One flag of an anchor's argument lists: its name, its value (None when given alone) and
    the list it came from (`args`), which names it in the report."""

    def __init__(self, name, value, origin):
        self.name, self.value, self.origin = name, value, origin

    @property
    def key(self):
        return f"{self.origin}[--{self.name}]"

    def text(self):
        return f"--{self.name}" if self.value is None else f"--{self.name}={self.value}"


def parse_flags(entries, origin, conversion):
    """The flags of one argument list, as pflag reads them: `--name=value`, `--name value`
    (two entries), `--name` (a boolean), `-v=N`."""
    flags = []
    pending = None
    for index, entry in enumerate(entries):
        if not isinstance(entry, (str, int, float)) or isinstance(entry, bool):
            conversion.not_carried(f"{origin}[{index}]", f"expected a flag, got {kind(entry)}")
            pending = None
            continue
        entry = str(entry)
        if not entry.startswith("-"):
            if pending is not None and pending.value is None and pending.name not in BOOL_FLAGS:
                pending.value = entry
            else:
                conversion.not_carried(f"{origin}[{index}]", f"not a flag: {entry!r}")
            pending = None
            continue
        name, eq, value = entry.lstrip("-").partition("=")
        flag = Flag(name, value if eq else None, origin)
        flags.append(flag)
        pending = flag
    return flags


class Conversion:
    """The conversion of one anchor's effective values into percolator's values and a report."""

    def __init__(self, anchor, user, percolator):
        self.anchor = anchor
        self.table = TABLES[anchor]
        self.keys = {key.path: key for key in self.table}
        self.percolator = percolator
        self.out = {}
        self.lines = []
        self.values = merge(tree_of(self.table), self.checked(user))

    # The report.
    def not_carried(self, key, why):
        self.lines.append((key, "not carried", why))

    def note(self, key, text):
        self.lines.append((key, "note", text))

    def report(self):
        return [f"{key}: {what}: {why}" for key, what, why in self.lines]

    def not_carried_keys(self):
        return [key for key, what, _ in self.lines if what == "not carried"]

    # Values.
    def get(self, path, default=None):
        return get(self.values, path, default)

    def default(self, path):
        value = self.keys[path].default
        return None if value is ABSENT else value

    def changed(self, path):
        return self.get(path) != self.default(path)

    def put(self, path, value):
        put(self.out, path, copy.deepcopy(value))

    def carry(self, path, target=None):
        """The value at `path` to `target` (the same name), when it is not the anchor's default."""
        if self.changed(path) and self.get(path) is not None:
            self.put(target or path, self.get(path))

    def refuse_changed(self, *paths):
        """Each of `paths` whose value is not the anchor's default: not carried, with the table's why."""
        for path in paths:
            if self.changed(path):
                self.not_carried(path, self.keys[path].why)

    def checked(self, user):
        """The user's values, each key unknown to the anchor's chart or of the wrong type reported
        and left out (the anchor's default applies to it)."""
        interiors = {".".join(key.path.split(".")[:i]) for key in self.table for i in range(1, key.path.count(".") + 1)}
        name = ANCHORS[self.anchor]

        def walk(node, prefix):
            kept = {}
            for key, value in node.items():
                path = f"{prefix}{key}"
                entry = self.keys.get(path)
                if entry is not None:
                    problem = type_problem(entry, value)
                    if problem:
                        self.not_carried(path, problem)
                    elif isinstance(entry.default, int) and not isinstance(entry.default, bool) \
                            and isinstance(value, str):
                        kept[key] = int(value)
                    elif isinstance(entry.default, str) and isinstance(value, (int, float)):
                        # Helm prints it as the text percolator's schema wants (`1m` or `2`).
                        kept[key] = str(value)
                    else:
                        kept[key] = value
                elif path in interiors:
                    if isinstance(value, dict):
                        kept[key] = walk(value, f"{path}.")
                    else:
                        self.not_carried(path, f"expected a map, got {kind(value)}")
                else:
                    self.not_carried(path, f"not a value of {name}")
            return kept

        return walk(user, "")

    # Helpers shared by both anchors.
    def image(self):
        for path in ("image.repository", "image.tag"):
            if self.get(path) not in (None, "") and self.changed(path):
                self.not_carried(path, self.keys[path].why)
        self.carry("image.pullPolicy")

    def security_contexts(self):
        for path in ("podSecurityContext", "securityContext"):
            value = self.get(path) or {}
            diff = differing(self.default(path), value)
            if diff:
                self.put(path, diff)
                self.note(path, "carried as what differs from the chart's default, merged into "
                                "percolator's restricted context (runAsUser 65532)")
            elif value:
                self.note(path, "the chart's default gives way to percolator's restricted context "
                                "(runAsUser 65532, the image's user)")

    def probes(self, names):
        for name in names:
            default = self.default(name) or {}
            value = self.get(name)
            if not value:
                if default:
                    self.put(name, None)
                    self.note(name, "carried as null: the container has no such probe")
                continue
            handler = {k: v for k, v in value.items() if k in HANDLERS}
            default_handler = {k: v for k, v in default.items() if k in HANDLERS}
            carried = {k: v for k, v in value.items() if k in TIMINGS and default.get(k) != v}
            others = sorted(k for k in value if k not in TIMINGS and k not in HANDLERS)
            if others:
                self.not_carried(name, f"not fields of a Probe: {', '.join(others)}")
            if handler and handler != default_handler:
                if served(handler):
                    carried.update(handler)
                else:
                    self.not_carried(name, "its handler is not one percolator serves: percolator probes "
                                           "/livez and /readyz on port https (tcpSocket also works)")
            if carried:
                self.put(name, carried)
                self.note(name, "carried: " + ", ".join(sorted(carried)) + "; the rest is percolator's probe")
            elif default and name != "startupProbe":
                self.note(name, "the chart's default gives way to percolator's probe (/livez, /readyz)")

    def replicas_and_budget(self):
        if self.changed("replicas"):
            self.put("replicas", self.get("replicas"))
        else:
            self.note("replicas", "the chart's 1 gives way to percolator's 2 replicas spread over nodes, "
                                  "with a PodDisruptionBudget (minAvailable 1)")
        budget = "podDisruptionBudget"
        if self.get(f"{budget}.enabled"):
            self.put(f"{budget}.enabled", True)
            minimum, maximum = self.get(f"{budget}.minAvailable"), self.get(f"{budget}.maxUnavailable")
            for name, value in (("minAvailable", minimum), ("maxUnavailable", maximum)):
                if value is not None:
                    self.put(f"{budget}.{name}", value)
            if minimum is not None and maximum is not None:
                self.note(budget, "both minAvailable and maxUnavailable: percolator's chart uses maxUnavailable")
            elif minimum is None and maximum is None:
                self.note(budget, "neither minAvailable nor maxUnavailable: percolator's minAvailable 1 applies")
        elif self.changed(f"{budget}.minAvailable") or self.changed(f"{budget}.maxUnavailable"):
            self.note(budget, "unused with enabled false, as in the anchor's chart; percolator's budget stays")
        self.carry(f"{budget}.unhealthyPodEvictionPolicy")

    def resources(self):
        value = self.get("resources")
        if value and self.changed("resources"):
            self.put("resources", replacing(self.percolator.get("resources"), value))
            self.note("resources", "carried whole, replacing percolator's sizing (about 35 MiB plus 2 KiB "
                                   "per pod: BENCHMARKS.md)")
        elif not value and self.changed("resources"):
            self.put("resources", None)
            self.note("resources", "carried as none: percolator's requests and memory limit are dropped")
        elif value or self.anchor == "prometheus-adapter":
            self.note("resources", "the chart's default gives way to percolator's (100m CPU and 128Mi "
                                   "requested, 512Mi memory limit)")

    def pod_placement(self):
        for path in ("nodeSelector", "tolerations", "topologySpreadConstraints", "dnsConfig",
                     "podAnnotations", "deploymentAnnotations", "env", "extraVolumes", "extraVolumeMounts",
                     "serviceAccount.annotations", "service.annotations"):
            if self.get(path):
                self.put(path, self.get(path))
        affinity = self.get("affinity")
        if affinity:
            self.put("affinity", affinity)
            self.note("affinity", "merged with percolator's default anti-affinity (Helm merges maps); "
                                  "set affinity.podAntiAffinity: null to drop the spread")
        for path in ("nameOverride", "fullnameOverride", "serviceAccount.name"):
            if self.get(path):
                self.put(path, self.get(path))
        self.carry("serviceAccount.create")
        self.carry("rbac.create")
        self.carry("hostNetwork.enabled")
        self.carry("revisionHistoryLimit")
        self.carry("service.type")
        self.carry("service.port")
        if self.get("env"):
            self.note("env", "environment variables of the anchor's process: percolator reads PERCOLATOR_<FLAG> "
                             "(its flags) and the usual proxy and TLS variables; check the others")

    def flags(self, flags, default_args):
        """Carries the anchor's effective flags (pflag's last one wins) into percolator's
        defaultArgs (those of its defaultArgs' names, written whole when they change), args and
        values."""
        percolator_defaults = [parse_flags([a], "defaultArgs", self)[0] for a in default_args]
        wanted = {f.name: f for f in percolator_defaults}
        last = {}
        for flag in flags:
            if flag.name in ("v", "prometheus-header"):
                continue
            last[flag.name] = flag
        args = []
        for flag in flags:
            name = flag.name
            if name == "v":
                self.log_level(flag)
                continue
            if name == "prometheus-header":
                header, eq, text = (flag.value or "").partition("=")
                if not eq or not header.strip():
                    self.not_carried(flag.key, "expected NAME=VALUE")
                else:
                    headers = self.out.setdefault("prometheus", {}).setdefault("headers", {})
                    headers[header.strip()] = text.strip()
                continue
            if last.get(name) is not flag:
                continue
            action, _, why = FLAGS.get(name, (None, None, None))
            if name == "metric-resolution":
                ttl = Flag("cache-ttl", flag.value, flag.origin)
                if flag.value is None:
                    self.not_carried(flag.key, "needs a duration")
                    continue
                if "cache-ttl" in wanted:
                    wanted["cache-ttl"] = ttl
                else:
                    args.append(ttl)
                self.note(flag.key, f"carried as --cache-ttl={flag.value}: how often a node's kubelet sample is "
                                    "renewed while requests need it (at most a third of --max-rate-window) and "
                                    "how long answers are cached")
            elif action == "args":
                problem = value_problem(flag)
                if problem:
                    self.not_carried(flag.key, problem)
                elif name == "prometheus-token-file" and flag.value == SA_TOKEN:
                    self.put("prometheus.bearerToken.serviceAccountToken", True)
                elif name in wanted:
                    wanted[name] = flag
                else:
                    args.append(flag)
                if name == "authorization-always-allow-paths" and flag.origin == "metrics.enabled":
                    self.note("metrics.enabled", f"carried as {flag.text()}: /metrics without authorization, "
                                                 "the health paths too (percolator's default)")
            elif action == "value":
                self.flag_value(flag)
            elif action == "chart":
                self.note(flag.key, why)
            elif action == NONE:
                self.not_carried(flag.key, why)
            else:
                self.not_carried(flag.key, "percolator has no such flag (docs/reference/flags.md lists them)")
        new_defaults = [f.text() for f in wanted.values()]
        if new_defaults != default_args:
            self.put("defaultArgs", new_defaults)
        if args:
            self.put("args", [f.text() for f in args])

    def flag_value(self, flag):
        name, value = flag.name, flag.value
        if name == "secure-port":
            if not (value or "").isdigit():
                self.not_carried(flag.key, "expected a port number")
            else:
                self.put("containerPort", int(value))
        elif name == "prometheus-url":
            if not value:
                self.not_carried(flag.key, "expected a URL")
            else:
                self.put("prometheus.url", value)
                self.put("prometheus.port", None)
                self.put("prometheus.path", "")
                self.note(flag.key, "carried as prometheus.url (the flag wins over the chart's prometheus.*, "
                                    "as in the anchor)")
        elif name == "prometheus-auth-incluster":
            if value in (None, "true", "True", "1"):
                self.put("prometheus.bearerToken.serviceAccountToken", True)
                self.note(flag.key, "carried as prometheus.bearerToken.serviceAccountToken: the pod's token; "
                                    "Prometheus' certificate is checked with the system's CAs (or prometheus.tls.ca), "
                                    "not the cluster's")
        elif name == "metrics-relist-interval":
            if not value:
                self.not_carried(flag.key, "expected a duration")
            else:
                self.put("metricsRelistInterval", value)

    def log_level(self, flag):
        if flag.value is None or not flag.value.isdigit():
            self.not_carried(flag.key, "expected --v=N")
        else:
            self.put("logLevel", int(flag.value))

    def header(self, files):
        source = ", ".join(str(f) for f in files)
        lines = [
            f"# percolator's chart values, converted by scripts/convert-values.py from {ANCHORS[self.anchor]}",
            f"# values: {source}.",
            "# The key-by-key mapping: docs/migrating-values.md.",
        ]
        missing = self.not_carried_keys()
        if missing:
            lines.append("# Not carried (the converter's report says why): " + ", ".join(missing) + ".")
        if self.anchor == "metrics-server":
            lines.append("# percolator's own kinds read Prometheus at prometheus.url: set it, or they serve "
                         "CPU and memory only.")
        return "\n".join(lines) + "\n"


def served(handler):
    """Whether a probe handler asks what percolator answers."""
    if "tcpSocket" in handler and len(handler) == 1:
        return True
    get_ = handler.get("httpGet")
    return (len(handler) == 1 and isinstance(get_, dict) and get_.get("path") in ("/healthz", "/livez", "/readyz")
            and get_.get("port") in ("https", None) and str(get_.get("scheme", "HTTPS")).upper() == "HTTPS")


def type_problem(entry, value):
    """Why a value cannot be the key's (None when it can): booleans, lists and maps are checked."""
    default = entry.default
    if value is None or default is ABSENT or default is None:
        return None
    for type_, words in ((bool, "a boolean"), (list, "a list"), (dict, "a map")):
        if isinstance(default, type_) and not isinstance(value, type_):
            return f"expected {words}, got {kind(value)}"
    if isinstance(default, int) and not isinstance(default, bool):
        if isinstance(value, bool) or not (isinstance(value, int) or (isinstance(value, str) and value.isdigit())):
            return f"expected a number, got {kind(value)}"
    if isinstance(default, str) and isinstance(value, (list, dict, bool)):
        return f"expected a string, got {kind(value)}"
    return None


def value_problem(flag):
    """Why percolator would refuse a same-named flag's value (None when it takes it)."""
    if flag.name in BOOL_FLAGS:
        if flag.value not in (None, "true", "false", "True", "False", "1", "0"):
            return f"expected true or false, got {flag.value!r}"
        return None
    if flag.value in (None, ""):
        return "needs a value"
    if flag.name == "tls-min-version" and flag.value not in TLS_VERSIONS:
        return f"percolator accepts VersionTLS12 or VersionTLS13, not {flag.value}"
    if flag.name == "http2-max-streams-per-connection" and (not flag.value.isdigit() or int(flag.value) < 100):
        return "percolator takes 100 or more streams per connection"
    return None


def normalized(flag):
    """A boolean flag as percolator reads it: `--name` for true, `--name=false`."""
    if flag.name in BOOL_FLAGS and flag.value is not None:
        value = flag.value.lower() in ("true", "1")
        return Flag(flag.name, None if value else "false", flag.origin)
    return flag


def convert_adapter(c):
    for path in ("namespaceOverride",):
        if c.get(path):
            c.put(path, c.get(path))
    c.image()
    secrets = c.get("image.pullSecrets") or []
    if secrets:
        c.put("imagePullSecrets", [s if isinstance(s, dict) else {"name": str(s)} for s in secrets])
    flags = [normalized(f) for f in parse_flags(c.get("extraArguments") or [], "extraArguments", c)]
    if c.changed("logLevel") and c.get("logLevel") is not None:
        c.put("logLevel", int(c.get("logLevel")))
    elif not any(f.name == "v" for f in flags):
        c.note("logLevel", "the chart's 4 gives way to percolator's 1 (info); set logLevel for debug logs")
    c.put("metricsRelistInterval", c.get("metricsRelistInterval"))
    if c.changed("listenPort") or c.get("hostNetwork.enabled"):
        port = c.get("listenPort")
        if isinstance(port, str) and port.isdigit():
            port = int(port)
        if isinstance(port, int) and not isinstance(port, bool) and 0 < port < 65536:
            c.put("containerPort", port)
        else:
            c.not_carried("listenPort", f"a port number (1-65535), got {port!r}")
    if c.get("priorityClassName"):
        c.put("priorityClassName", c.get("priorityClassName"))
    else:
        c.note("priorityClassName", "empty gives way to percolator's system-cluster-critical, which GKE admits "
                                    "only in kube-system: set priorityClassName: \"\" to install elsewhere there")
    annotations = c.get("customAnnotations") or {}
    if annotations:
        c.put("customAnnotations", annotations)
    labels = c.get("customLabels") or {}
    if labels:
        c.put("commonLabels", labels)
    pod_labels = {**labels, **(c.get("podLabels") or {})}
    if pod_labels:
        c.put("podLabels", pod_labels)
    c.put("prometheus.url", c.get("prometheus.url"))
    c.put("prometheus.port", c.get("prometheus.port"))
    if c.get("prometheus.path"):
        c.put("prometheus.path", c.get("prometheus.path"))
    c.replicas_and_budget()
    c.security_contexts()
    c.pod_placement()
    # The adapter's chart puts customAnnotations on the pods too; percolator's does not.
    pod_annotations = {**annotations, **(c.get("podAnnotations") or {})}
    if pod_annotations:
        c.put("podAnnotations", pod_annotations)
    c.refuse_changed("rbac.useAuthReaderClusterRole", "rbac.externalMetrics.resources",
                     "rbac.customMetrics.resources", "automountServiceAccountToken",
                     "serviceAccount.automountServiceAccountToken")
    c.resources()
    c.probes(("livenessProbe", "readinessProbe", "startupProbe"))

    # The rules, and the APIServices the adapter's chart registers for them.
    rules = {key: c.get(f"rules.{key}") for key in ("default", "custom", "existing", "external", "resource")}
    c.put("rules.default", bool(rules["default"]))
    for key in ("custom", "external", "resource", "existing"):
        if rules[key]:
            c.put(f"rules.{key}", rules[key])
    custom = bool(rules["default"] or rules["custom"])
    apis = {"customMetrics": custom, "externalMetrics": bool(rules["external"]),
            "resourceMetrics": bool(rules["resource"])}
    for api, enabled in apis.items():
        if enabled:
            c.put(f"{api}.enabled", True)
    if custom:
        c.note("rules.default" if rules["default"] else "rules.custom",
               "customMetrics.enabled: percolator registers custom.metrics.k8s.io v1beta2 and v1beta1 "
               "(the adapter's chart v1beta1 only)")
    if apis["customMetrics"] or apis["externalMetrics"]:
        # An empty config.customMetrics/externalMetrics is refused (kubectl's discovery fails on
        # an empty resource list), so percolator's default metrics stay beside the rules.
        c.note("rules", "percolator's own default metrics (config's: http_requests_per_second and "
                        "http_errors_per_second, and its external ones) are served beside the rules; a rule's "
                        "metric of the same name takes the name")
    if rules["existing"] and rules["resource"]:
        c.note("rules.resource", "with rules.existing, the ConfigMap's resourceRules are served "
                                 "(--resource-source=prometheus is percolator's default when the file has them)")

    if c.get("service.clusterIP"):
        c.not_carried("service.clusterIP", c.keys["service.clusterIP"].why)
    if c.get("service.ipDualStack.enabled"):
        c.not_carried("service.ipDualStack.enabled", c.keys["service.ipDualStack.enabled"].why)
        c.refuse_changed("service.ipDualStack.ipFamilies", "service.ipDualStack.ipFamilyPolicy")

    # The serving certificate.
    if c.get("certManager.enabled"):
        c.put("tls.type", "cert-manager")
        c.put("tls.certManager.caDuration", c.get("certManager.caCertDuration"))
        c.put("tls.certManager.duration", c.get("certManager.certDuration"))
        if c.get("tls.enable"):
            c.note("tls.enable", "with certManager.enabled: cert-manager's certificate is used, as in the adapter")
    elif c.get("tls.enable"):
        for path in ("tls.enable", "tls.ca", "tls.key", "tls.certificate"):
            c.not_carried(path, c.keys[path].why)
    else:
        c.note("tls.enable", "false: the adapter's APIServices skip TLS verification; percolator's chart "
                             "makes a CA (tls.type=helm) that kube-apiserver verifies")
    for path in ("certManager.caCertRevisionHistoryLimit", "certManager.certRevisionHistoryLimit"):
        if c.get(path) is not None:
            c.not_carried(path, c.keys[path].why)

    if c.get("extraContainers"):
        c.not_carried("extraContainers", c.keys["extraContainers"].why)
    policy = c.get("dnsPolicy")
    if policy and not (policy == "ClusterFirstWithHostNet" and c.get("hostNetwork.enabled")):
        c.not_carried("dnsPolicy", c.keys["dnsPolicy"].why)

    strategy = c.get("strategy")
    if c.changed("strategy"):
        c.put("updateStrategy", replacing(c.percolator.get("updateStrategy"), strategy or {}))
        c.note("strategy", "carried whole as updateStrategy, replacing percolator's maxUnavailable 0")
    else:
        c.note("strategy", "the chart's 25%/25% gives way to percolator's (maxUnavailable 0: never a replica "
                           "down before its replacement is ready)")

    manifests = c.get("extraManifests")
    if manifests:
        c.put("extraManifests", manifests)
        if "{{" in json.dumps(manifests):
            c.note("extraManifests", "templated with percolator's values: a .Values reference names the adapter's "
                                     "keys, check it")

    c.flags(flags, c.percolator.get("defaultArgs") or [])


def convert_metrics_server(c):
    c.image()
    if c.get("imagePullSecrets"):
        c.put("imagePullSecrets", c.get("imagePullSecrets"))
    c.refuse_changed("serviceAccount.secrets", "rbac.pspEnabled")
    c.carry("apiService.create")
    for path in ("apiService.annotations", "commonLabels", "podLabels", "service.labels"):
        if c.get(path):
            c.put(path, c.get(path))
    c.put("resourceMetrics.enabled", True)
    c.carry("priorityClassName")
    c.carry("containerPort")
    if c.get("hostNetwork.enabled") and not c.changed("containerPort"):
        c.note("containerPort", "10250 is the kubelet's port on the node: percolator's chart refuses it with "
                                "hostNetwork, set containerPort (e.g. 4443)")
    c.carry("schedulerName")
    c.replicas_and_budget()
    c.security_contexts()
    c.pod_placement()
    c.resources()
    c.probes(("livenessProbe", "readinessProbe"))
    if c.get("updateStrategy"):
        c.put("updateStrategy", replacing(c.percolator.get("updateStrategy"), c.get("updateStrategy")))
        c.note("updateStrategy", "carried whole, replacing percolator's maxUnavailable 0")

    if c.get("addonResizer.enabled"):
        c.not_carried("addonResizer.enabled", c.keys["addonResizer.enabled"].why)
        for key in c.table:
            if key.path.startswith("addonResizer.") and key.path != "addonResizer.enabled" and c.changed(key.path):
                c.not_carried(key.path, c.keys[key.path].why)
    if c.changed("tmpVolume"):
        c.not_carried("tmpVolume", c.keys["tmpVolume"].why)
    if c.get("additionalAnnotations"):
        c.not_carried("additionalAnnotations", c.keys["additionalAnnotations"].why)

    # /metrics and the ServiceMonitor (rendered by metrics-server's chart only with both).
    monitor = c.get("serviceMonitor.enabled")
    if monitor and c.get("metrics.enabled"):
        c.put("serviceMonitor.enabled", True)
        for key in ("additionalLabels", "relabelings", "metricRelabelings"):
            if c.get(f"serviceMonitor.{key}"):
                c.put(f"serviceMonitor.{key}", c.get(f"serviceMonitor.{key}"))
        c.carry("serviceMonitor.interval")
        c.carry("serviceMonitor.scrapeTimeout")
        c.note("serviceMonitor.enabled", "percolator's ServiceMonitor scrapes with a ServiceAccount token and "
                                         "verifies the serving CA (metrics-server's skips verification)")
    elif monitor:
        c.note("serviceMonitor.enabled", "without metrics.enabled metrics-server's chart renders no ServiceMonitor: "
                                         "none is carried")

    # The serving certificate and how kube-apiserver trusts it.
    tls_type = c.get("tls.type")
    insecure = c.get("apiService.insecureSkipTLSVerify")
    if tls_type == "metrics-server":
        if insecure:
            c.note("tls.type", "metrics-server's self-signed certificate, not verified by kube-apiserver, becomes "
                               "percolator's tls.type=helm: a CA in the chart, verified")
        else:
            c.note("tls.type", "metrics-server's self-signed certificate becomes percolator's tls.type=helm "
                               "(a CA in the chart, verified)")
    elif tls_type in ("helm", "cert-manager", "existingSecret"):
        c.put("tls.type", "existing-secret" if tls_type == "existingSecret" else tls_type)
        if insecure:
            c.put("apiService.insecureSkipTLSVerify", True)
            c.note("apiService.insecureSkipTLSVerify", "carried: kube-apiserver does not verify percolator's "
                                                       "certificate (set false: the chart gives the CA)")
    else:
        c.not_carried("tls.type", f"expected metrics-server, helm, cert-manager or existingSecret, got {tls_type!r}")
    if c.get("apiService.caBundle"):
        c.put("apiService.caBundle", c.get("apiService.caBundle"))
    c.carry("tls.clusterDomain")
    if tls_type == "helm":
        c.carry("tls.helm.lookup")
        if c.changed("tls.helm.certDurationDays"):
            c.put("tls.helm.certDurationDays", c.get("tls.helm.certDurationDays"))
        else:
            c.note("tls.helm.certDurationDays", "the chart's 365 gives way to percolator's 3650 (renewed when "
                                                "its Secret is deleted and the release upgraded)")
    if tls_type == "cert-manager":
        c.refuse_changed("tls.certManager.addInjectorAnnotations")
        if c.get("tls.certManager.existingIssuer.enabled"):
            for key in ("enabled", "kind", "name"):
                c.put(f"tls.certManager.existingIssuer.{key}", c.get(f"tls.certManager.existingIssuer.{key}"))
        for key in ("duration", "renewBefore", "annotations", "labels"):
            if c.get(f"tls.certManager.{key}"):
                c.put(f"tls.certManager.{key}", c.get(f"tls.certManager.{key}"))
    if tls_type == "existingSecret":
        if c.get("tls.existingSecret.name"):
            c.put("tls.existingSecret.name", c.get("tls.existingSecret.name"))
        if c.get("tls.existingSecret.lookup") and not c.get("apiService.caBundle"):
            why = (c.keys["tls.existingSecret.lookup"].why
                   + ": set apiService.caBundle (or a cert-manager.io/inject-ca-from annotation)")
            # Without a CA the chart refuses to register APIServices it cannot verify.
            if c.get("apiService.create") is not False and not insecure and not c.get("apiService.annotations"):
                c.not_carried("tls.existingSecret.lookup",
                              "percolator's chart reads no CA from the Secret, and refuses APIServices it cannot "
                              "verify: set apiService.caBundle (or a cert-manager.io/inject-ca-from annotation)")
            else:
                c.note("tls.existingSecret.lookup", why)

    # The flags: defaultArgs then metrics.enabled's then args, as the chart writes them.
    flags = parse_flags(c.get("defaultArgs") or [], "defaultArgs", c)
    if c.get("metrics.enabled"):
        flags.append(Flag("authorization-always-allow-paths", f"{HEALTH_PATHS},/metrics", "metrics.enabled"))
    flags += parse_flags(c.get("args") or [], "args", c)
    flags = [normalized(f) for f in flags]
    names = {f.name for f in flags}
    # Without the flag, metrics-server's binary default applies: for percolator's defaultArgs
    # that means the binary's value (or the flag left out where both binaries agree).
    for name, value in METRICS_SERVER_FLAG_DEFAULTS.items():
        if name not in names:
            flags.insert(0, Flag(name, value, "defaultArgs"))
    default_args = c.percolator.get("defaultArgs") or []
    given = {f.name for f in flags} | {"cache-ttl"}
    kept = [a for a in default_args if a.lstrip("-").partition("=")[0] in given | {"cert-dir"}]
    dropped = [a for a in default_args if a not in kept]
    c.flags(flags, kept)
    if dropped and "defaultArgs" not in c.out:
        c.put("defaultArgs", kept)
    for text in dropped:
        c.note(f"defaultArgs[{text.partition('=')[0]}]", "left out of percolator's defaultArgs: metrics-server's "
                                                        "defaultArgs do not have it (both binaries' default applies)")


def convert(anchor, user, percolator):
    c = Conversion(anchor, user, percolator)
    (convert_adapter if anchor == "prometheus-adapter" else convert_metrics_server)(c)
    return c


def ordered(out, percolator):
    """`out` with its top-level keys in the order of percolator's values.yaml (new keys last)."""
    order = list(percolator)
    return dict(sorted(out.items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)))


def tables(form):
    """The mapping tables (markdown for docs/migrating-values.md, or JSON for tests)."""
    if form == "json":
        return json.dumps({
            "keys": {anchor: [{"path": k.path, "default": None if k.default is ABSENT else k.default,
                               "inValuesFile": k.default is not ABSENT, "free": k.free,
                               "target": k.target, "why": k.why} for k in table]
                     for anchor, table in TABLES.items()},
            "flags": {name: {"action": action, "target": target, "why": why}
                      for name, (action, target, why) in FLAGS.items()},
            "boolFlags": sorted(BOOL_FLAGS),
        }, indent=1) + "\n"
    out = []
    for anchor, table in TABLES.items():
        out.append(f"<!-- {anchor} keys: generated by scripts/convert-values.py --tables markdown -->")
        out.append(f"| {anchor} | percolator | how |")
        out.append("| --- | --- | --- |")
        for k in table:
            target = "not carried" if k.target == NONE else ", ".join(
                t if " " in t and ": " not in t else f"`{t}`" for t in k.target.split(", "))
            path = f"`{k.path}`" + (" (template only)" if k.default is ABSENT else "")
            out.append(f"| {path} | {target} | {k.why} |")
        out.append("")
    out.append("<!-- flags: generated by scripts/convert-values.py --tables markdown -->")
    out.append("| flag | percolator | how |")
    out.append("| --- | --- | --- |")
    for name, (action, target, why) in sorted(FLAGS.items()):
        where = {"args": f"`{target}`", "value": f"`{target}`", "chart": "set by the chart"}.get(action, NONE)
        out.append(f"| `--{name}` | {where} | {why} |")
    out.append("| any other | not carried | percolator has no such flag |")
    return "\n".join(out) + "\n"


def main(argv):
    # The module's docstring but its usage lines, which argparse writes itself.
    paragraphs = __doc__.strip().split("\n\n")
    parser = argparse.ArgumentParser(
        prog="scripts/convert-values.py",
        description="\n\n".join(p for p in paragraphs if not p.startswith("usage:")),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--from", dest="anchor", choices=sorted(ANCHORS), help="the chart the values are for")
    parser.add_argument("-o", "--output", help="write percolator's values here (default: stdout)")
    parser.add_argument("-f", "--values", action="append", default=[], metavar="VALUES.yaml",
                        help="a values file (repeatable, merged in order as helm does)")
    parser.add_argument("--strict", action="store_true", help="exit 1, writing nothing, if a key is not carried")
    parser.add_argument("--tables", choices=("markdown", "json"), help="print the mapping tables")
    parser.add_argument("files", nargs="*", metavar="VALUES.yaml", help="values files, merged in order")
    args = parser.parse_args(argv)
    if args.tables:
        sys.stdout.write(tables(args.tables))
        return 0
    if not args.anchor:
        parser.error("--from prometheus-adapter|metrics-server is required")
    if args.files and args.values:
        parser.error("give the values files either as arguments or with -f, not both")
    files = args.files or args.values
    if not files:
        parser.error("no values file (give one or more, or - for stdin)")
    try:
        percolator = yaml.load(CHART_VALUES.read_text(), Loader=Loader)
    except OSError as error:
        print(f"error: cannot read percolator's chart values {CHART_VALUES}: {error.strerror}; run the script "
              "from a checkout of percolator", file=sys.stderr)
        return 1
    user = {}
    try:
        for path in files:
            merge(user, load(path), keep_nulls=True)
    except InputError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    conversion = convert(args.anchor, user, percolator)
    for line in conversion.report():
        print(line, file=sys.stderr)
    if args.strict and conversion.not_carried_keys():
        print(f"error: --strict: {len(conversion.not_carried_keys())} key(s) not carried; nothing written",
              file=sys.stderr)
        return 1
    text = conversion.header(files) + yaml.dump(ordered(conversion.out, percolator), Dumper=Dumper,
                                                sort_keys=False, default_flow_style=False, width=4096)
    if args.output:
        Path(args.output).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
