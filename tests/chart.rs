//! The Helm chart `charts/percolator`, rendered and linted by Helm's own engine
//! (helm-python-sdk: Helm v4 as a library, no helm binary, no cluster) through
//! `tests/python/helm_chart.py`:
//! - `helm lint --strict` is clean, every object validates against the Kubernetes schemas
//!   (kubernetes-validate) and the container's flags parse with percolator's own parser, for
//!   the defaults and a matrix of values (each API, each TLS type, adapter rules, the
//!   Prometheus connection settings, ServiceMonitor, PrometheusRule, NetworkPolicy,
//!   hostNetwork); the custom resources' essential fields are checked by hand;
//! - the defaults are a highly available install meeting the restricted Pod Security Standard;
//! - for the same settings the chart and the kustomize overlays (deploy/) give the same
//!   objects: names, labels, RBAC, APIServices, certificates, flags (as sets; each file flag
//!   also by the ConfigMap or Secret key it reads), volumes, probes, security contexts,
//!   resources, configuration;
//! - the rendered `--config` and `--adapter-config` files load in percolator's own loaders;
//! - the certificate `tls.type=helm` generates is trusted for the Service's name by its CA,
//!   which every APIService carries;
//! - the schema refuses a wrong type or an unknown key, naming it, and inconsistent values
//!   fail with a message naming them; metrics-server's and prometheus-adapter's value names
//!   the chart supports render with their meaning;
//! - every label value is valid (a digest-pinned image tag included) and the pod template does
//!   not change with the chart's version;
//! - what only a cluster's `lookup` answers shows (an APIService of another owner refused with
//!   what to do, the previous Secret name's pair kept), through a copy of the chart whose lookups
//!   answer as a cluster would;
//! - the custom resources need their CRDs: without cert-manager's or the Prometheus Operator's
//!   API versions (`.Capabilities.APIVersions`) the values that render them fail naming the CRD;
//! - no PodDisruptionBudget that would block every node drain, a probe handler given in values
//!   replacing the default's, no namespace-wide Pod Security advice, the PrometheusRule's
//!   absent-job alert only with the ServiceMonitor that makes the job;
//! - `rules.default` is prometheus-adapter's six default rules as its own chart renders them
//!   (tests/fixtures/prometheus-adapter/), and they load in percolator;
//! - the values of the anchor charts added to this one (namespaceOverride, customAnnotations,
//!   extraManifests, apiService.create, service.type/port, tls.certManager, dashboards) render
//!   with their meaning, the dashboards' copies are dashboards/*.json byte for byte, and
//!   Chart.yaml carries Artifact Hub's metadata for this appVersion.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use clap::Parser;
use common::manifests::{self, find};
use serde_json::{Value, json};

const CHART: &str = "charts/percolator";
/// The release every comparison with deploy/ uses: its objects then have deploy/'s names.
const RELEASE: &str = "percolator";
/// kube-system, as deploy/ and metrics-server: the pods' system-cluster-critical priority class
/// is admitted only there on GKE.
const NAMESPACE: &str = "kube-system";
const SERVICE_DNS: &str = "percolator.kube-system.svc";

/// The API versions of cert-manager's and the Prometheus Operator's CRDs, as a cluster's
/// discovery lists them (GROUP/VERSION and GROUP/VERSION/KIND).
const CERT_MANAGER_APIS: &[&str] =
    &["cert-manager.io/v1", "cert-manager.io/v1/Certificate", "cert-manager.io/v1/Issuer"];
const PROMETHEUS_OPERATOR_APIS: &[&str] = &[
    "monitoring.coreos.com/v1",
    "monitoring.coreos.com/v1/ServiceMonitor",
    "monitoring.coreos.com/v1/PrometheusRule",
];

/// Every APIService percolator may register.
const ALL_APISERVICES: [&str; 5] = [
    "v1alpha1.stats.une-tasse-de.cafe",
    "v1beta1.metrics.k8s.io",
    "v1beta2.custom.metrics.k8s.io",
    "v1beta1.custom.metrics.k8s.io",
    "v1beta1.external.metrics.k8s.io",
];

/// Runs `helm_chart.py COMMAND charts/percolator` with `request` on its standard input: its
/// JSON answer, or its error message.
fn helm(command: &str, request: &Value) -> Result<Value, String> {
    helm_in(&manifests::repo_path(CHART), command, request)
}

/// [`helm`] with the chart at `chart`.
fn helm_in(chart: &std::path::Path, command: &str, request: &Value) -> Result<Value, String> {
    manifests::helm_chart(command, chart, request)
}

/// One rendering: its objects, in template order, and NOTES.txt.
struct Rendered {
    objects: Vec<Value>,
    notes: String,
}

fn rendered(answer: &Value) -> Rendered {
    let mut objects = Vec::new();
    let mut notes = String::new();
    for (template, text) in answer["manifests"].as_object().unwrap() {
        if template.ends_with("/NOTES.txt") {
            notes = text.as_str().unwrap().to_owned();
        } else {
            objects.extend(manifests::parse_stream(text.as_str().unwrap()));
        }
    }
    Rendered { objects, notes }
}

/// The API versions of a cluster that has the CRDs `values` need: cert-manager's with
/// tls.type=cert-manager, the Prometheus Operator's with a ServiceMonitor or a PrometheusRule
/// (the chart refuses these values where the cluster lacks them).
fn mk_api_versions(values: &Value) -> Vec<&'static str> {
    let mut apis = Vec::new();
    if values["tls"]["type"] == "cert-manager" {
        apis.extend(CERT_MANAGER_APIS);
    }
    if values["serviceMonitor"]["enabled"] == true || values["prometheusRule"]["enabled"] == true {
        apis.extend(PROMETHEUS_OPERATOR_APIS);
    }
    apis
}

/// A render request of `values` as release `name` in `namespace`, on a cluster with the CRDs
/// they need ([`mk_api_versions`]).
fn mk_request(values: &Value, name: &str, namespace: &str) -> Value {
    json!({"values": values, "name": name, "namespace": namespace, "api_versions": mk_api_versions(values)})
}

/// Renders `values` as release [`RELEASE`] in [`NAMESPACE`].
fn mk_render(values: Value) -> Rendered {
    mk_render_as(values, RELEASE, NAMESPACE)
}

/// Renders `values` as release `name` in `namespace`.
fn mk_render_as(values: Value, name: &str, namespace: &str) -> Rendered {
    let request = mk_request(&values, name, namespace);
    rendered(&helm("render", &request).unwrap_or_else(|e| panic!("render {values}: {e}")))
}

/// Renders each case's values in one run of the driver.
fn mk_render_all(cases: &[(&str, Value)]) -> Vec<Rendered> {
    let request: Vec<Value> = cases.iter().map(|(_, v)| mk_request(v, RELEASE, NAMESPACE)).collect();
    let answer = helm("render", &Value::Array(request)).unwrap_or_else(|e| panic!("render: {e}"));
    answer.as_array().unwrap().iter().map(rendered).collect()
}

/// A copy of the chart, changed by `edit` (given the copy's directory), for what the chart's
/// own files cannot render offline: another chart version, a cluster's answers to lookup.
fn mk_chart_copy(name: &str, edit: impl FnOnce(&std::path::Path)) -> std::path::PathBuf {
    fn copy(from: &std::path::Path, to: &std::path::Path) {
        std::fs::create_dir_all(to).unwrap();
        for entry in std::fs::read_dir(from).unwrap() {
            let entry = entry.unwrap();
            if entry.file_type().unwrap().is_dir() {
                copy(&entry.path(), &to.join(entry.file_name()));
            } else {
                std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
            }
        }
    }
    let chart = common::mk_dir(name).join("percolator");
    copy(&manifests::repo_path(CHART), &chart);
    edit(&chart);
    chart
}

/// Replaces `from` (which must be there) by `to` in the file `path`.
fn mk_edit(path: &std::path::Path, from: &str, to: &str) {
    let text = std::fs::read_to_string(path).unwrap();
    assert!(text.contains(from), "{from:?} not in {}", path.display());
    std::fs::write(path, text.replace(from, to)).unwrap();
}

/// The error of a rendering that must fail.
fn mk_render_error(values: Value) -> String {
    match helm("render", &mk_request(&values, RELEASE, NAMESPACE)) {
        Ok(_) => panic!("{values} renders"),
        Err(message) => message,
    }
}

fn deployment(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment")
}

fn pod_spec(objects: &[Value]) -> &Value {
    &deployment(objects)["spec"]["template"]["spec"]
}

fn container(objects: &[Value]) -> &Value {
    &pod_spec(objects)["containers"][0]
}

fn args_of(objects: &[Value]) -> Vec<String> {
    container(objects)["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

/// The flags that name a file the pod reads.
fn is_file_flag(flag: &str) -> bool {
    flag == "--config" || flag == "--adapter-config" || flag.ends_with("-file")
}

/// Where the file at `path` comes from in the pod: `configMap NAME KEY`, `secret NAME KEY`, or
/// the path itself when no volume holds it (the ServiceAccount token): the innermost mount
/// holding it.
fn file_source(pod: &Value, path: &str) -> String {
    let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
    let mount = mounts
        .iter()
        .filter(|m| path.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
        .max_by_key(|m| m["mountPath"].as_str().unwrap().len());
    let Some(mount) = mount else { return path.to_owned() };
    let volume = pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount["name"]).unwrap();
    let key = &path[mount["mountPath"].as_str().unwrap().len() + 1..];
    if let Some(config_map) = volume.get("configMap") {
        format!("configMap {} {key}", config_map["name"].as_str().unwrap())
    } else if let Some(secret) = volume.get("secret") {
        format!("secret {} {key}", secret["secretName"].as_str().unwrap())
    } else {
        panic!("{path} is in volume {volume}")
    }
}

/// The container's flags as a set, each file flag's path replaced by [`file_source`].
fn normalized_args(objects: &[Value]) -> BTreeSet<String> {
    let pod = pod_spec(objects);
    args_of(objects)
        .into_iter()
        .map(|arg| match arg.split_once('=') {
            Some((flag, path)) if is_file_flag(flag) => format!("{flag}={}", file_source(pod, path)),
            _ => arg,
        })
        .collect()
}

/// Parses the container's flags with percolator's own flag parser (what starts the process).
fn parse_flags(objects: &[Value], what: &str) -> percolator::config::Args {
    let args = args_of(objects);
    percolator::config::Args::try_parse_from(std::iter::once("percolator".to_owned()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("{what}: percolator refuses {args:?}: {e}"))
}

/// The identities (kind, namespace, name) of objects.
fn identities(objects: &[Value]) -> BTreeSet<(String, String, String)> {
    objects
        .iter()
        .map(|o| {
            (
                o["kind"].as_str().unwrap().to_owned(),
                o["metadata"]["namespace"].as_str().unwrap_or_default().to_owned(),
                o["metadata"]["name"].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Parses a YAML text to JSON.
fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap()
}

fn config_text(objects: &[Value], name: &str) -> String {
    find(objects, "ConfigMap", name)["data"]["config.yaml"].as_str().unwrap().to_owned()
}

/// A PEM certificate, for the CA bundle of `tls.type=existing-secret`.
fn mk_ca_pem() -> String {
    test_support::mk_ca("percolator-ca").pem
}

/// Adapter rules of each kind: a per-pod request rate, an external sum by status code, and
/// CPU and memory from cAdvisor's series.
fn mk_rules() -> Value {
    json!({
        "custom": [{
            "seriesQuery": "http_requests_total{namespace!=\"\",pod!=\"\"}",
            "resources": {"overrides": {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
            "name": {"matches": "^(.*)_total$", "as": "${1}_rate"},
            "metricsQuery": "sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)",
        }],
        "external": [{
            "seriesQuery": "{__name__=\"http_requests_total\",namespace!=\"\"}",
            "resources": {"overrides": {"namespace": {"resource": "namespace"}}},
            "name": {"matches": "^http_requests_total$", "as": "http_requests_by_code"},
            "metricsQuery": "sum by (code) (rate(<<.Series>>{<<.LabelMatchers>>}[2m]))",
        }],
        "resource": {
            "cpu": {
                "containerQuery": "sum by (<<.GroupBy>>) (rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>,container!=\"\",container!=\"POD\"}[2m]))",
                "nodeQuery": "sum by (<<.GroupBy>>) (rate(node_cpu_usage_seconds_total{<<.LabelMatchers>>}[2m]))",
                "resources": {"overrides": {
                    "node": {"resource": "node"}, "namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "containerLabel": "container",
            },
            "memory": {
                "containerQuery": "sum by (<<.GroupBy>>) (container_memory_working_set_bytes{<<.LabelMatchers>>,container!=\"\",container!=\"POD\"})",
                "nodeQuery": "sum by (<<.GroupBy>>) (node_memory_working_set_bytes{<<.LabelMatchers>>})",
                "resources": {"overrides": {
                    "node": {"resource": "node"}, "namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}},
                "containerLabel": "container",
            },
            "window": "2m",
        },
    })
}

/// Every Prometheus connection setting at once (bearer token from a Secret).
fn mk_prometheus_connection() -> Value {
    json!({
        "url": "https://thanos-query.monitoring.svc",
        "port": 10902,
        "path": "prometheus",
        "timeout": "30s",
        "maxResponseBytes": "64Mi",
        "tls": {
            "ca": {"secretName": "prometheus-ca"},
            "clientCert": {"secretName": "percolator-client"},
            "insecureSkipVerify": false,
        },
        "bearerToken": {"secretName": "prometheus-token", "key": "jwt"},
        "headers": {"X-Scope-OrgID": "team-cafe", "X-Plain": "a,b=c"},
        "secretHeaders": {"X-Api-Key": {"secretName": "prometheus-api-key", "key": "key"}},
    })
}

/// The matrix every check of `lint_is_clean_and_every_object_validates` runs over.
fn mk_matrix() -> Vec<(&'static str, Value)> {
    let all_apis = json!({
        "externalMetrics": {"enabled": true},
        "customMetrics": {"enabled": true},
        "resourceMetrics": {"enabled": true},
    });
    let mut rules = all_apis.clone();
    rules["rules"] = mk_rules();
    rules["rules"]["default"] = json!(true);
    let mut existing = all_apis.clone();
    existing["rules"] = json!({"existing": "my-adapter-config"});
    vec![
        ("defaults", json!({})),
        ("cert-manager", json!({"tls": {"type": "cert-manager"}})),
        (
            "existing-secret",
            json!({"tls": {"type": "existing-secret", "existingSecret": {"name": "percolator-tls"}},
                   "apiService": {"caBundle": mk_ca_pem()}}),
        ),
        (
            "existingSecret",
            json!({"tls": {"type": "existingSecret", "existingSecret": {"name": "percolator-tls"}},
                   "apiService": {"annotations": {"cert-manager.io/inject-ca-from": "percolator/x"}}}),
        ),
        ("insecure", json!({"apiService": {"insecureSkipTLSVerify": true}})),
        ("external", json!({"externalMetrics": {"enabled": true}})),
        ("custom", json!({"customMetrics": {"enabled": true}})),
        ("resource", json!({"resourceMetrics": {"enabled": true}})),
        ("all-apis-cert-manager", {
            let mut v = all_apis.clone();
            v["tls"] = json!({"type": "cert-manager"});
            v
        }),
        ("rules", rules),
        ("rules-existing", existing),
        (
            "monitoring",
            json!({
                "serviceMonitor": {"enabled": true, "labels": {"release": "kps"}, "additionalLabels": {"team": "cafe"},
                                   "relabelings": [{"action": "replace", "targetLabel": "cluster", "replacement": "prod"}]},
                "prometheusRule": {"enabled": true, "additionalLabels": {"release": "kps"}},
                "networkPolicy": {"enabled": true,
                                  "ingress": {"extraRules": [{"ports": [{"port": 9999}]}]},
                                  "egress": {"kubeAPIServer": {"cidr": "10.0.0.1/32"},
                                             "prometheus": {"to": [{"namespaceSelector": {"matchLabels": {
                                                 "kubernetes.io/metadata.name": "monitoring"}}}]}}},
            }),
        ),
        (
            "monitoring-cert-manager",
            json!({"tls": {"type": "cert-manager"}, "serviceMonitor": {"enabled": true}}),
        ),
        (
            "host-network",
            json!({"hostNetwork": {"enabled": true}, "containerPort": 4443, "networkPolicy": {"enabled": true}}),
        ),
        ("prometheus-connection", json!({"prometheus": mk_prometheus_connection()})),
        (
            "prometheus-basic-auth",
            json!({"prometheus": {"port": null, "url": "https://prometheus.example.com",
                                  "basicAuth": {"secretName": "prometheus-basic-auth"},
                                  "tls": {"insecureSkipVerify": true}}, "networkPolicy": {"enabled": true}}),
        ),
        (
            "prometheus-serviceaccount-token",
            json!({"prometheus": {"bearerToken": {"serviceAccountToken": true}}}),
        ),
        (
            // metrics-server's and prometheus-adapter's value names.
            "their-values",
            json!({"commonLabels": {"team": "cafe"}, "revisionHistoryLimit": 3,
                   "deploymentAnnotations": {"a": "b"}, "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
                   "schedulerName": "custom-scheduler", "service": {"annotations": {"a": "b"}, "labels": {"c": "d"}},
                   "livenessProbe": {"initialDelaySeconds": 5}, "startupProbe": {"tcpSocket": {"port": "https"}},
                   "podDisruptionBudget": {"unhealthyPodEvictionPolicy": "AlwaysAllow"},
                   "env": [{"name": "RUST_BACKTRACE", "value": "1"}], "logLevel": 3, "image": {"tag": 20240101},
                   "updateStrategy": {"type": "Recreate"},
                   "networkPolicy": {"enabled": true, "egress": {"dns": {"ports": [5353]},
                                                               "prometheus": {"ports": [9090, "web"]}}}}),
        ),
        (
            "lean",
            json!({"rbac": {"create": false}, "serviceAccount": {"create": false, "name": "percolator-sa"},
                   "podDisruptionBudget": {"maxUnavailable": 1}, "priorityClassName": "", "affinity": null,
                   "replicas": 3, "args": ["-v=3", "--kubelet-insecure-tls"],
                   "topologySpreadConstraints": [{"maxSkew": 1, "topologyKey": "topology.kubernetes.io/zone",
                       "whenUnsatisfiable": "ScheduleAnyway",
                       "labelSelector": {"matchLabels": {"app.kubernetes.io/instance": "{{ .Release.Name }}"}}}],
                   "config": "window: 2m\n# kept as written\n"}),
        ),
        (
            // The values the anchor charts' users expect, added to this one.
            "anchor-values",
            json!({"customAnnotations": {"team": "cafe"}, "service": {"type": "NodePort", "port": 8443},
                   "dashboards": {"enabled": true, "annotations": {"grafana_folder": "percolator"}},
                   "resourceMetrics": {"enabled": true}}),
        ),
        (
            "cert-manager-existing-issuer",
            json!({"tls": {"type": "cert-manager", "certManager": {
                       "existingIssuer": {"enabled": true, "kind": "ClusterIssuer", "name": "corp-ca"},
                       "duration": "720h", "renewBefore": "240h",
                       "labels": {"team": "cafe"}, "annotations": {"note": "corp"}}},
                   "serviceMonitor": {"enabled": true}, "customMetrics": {"enabled": true}}),
        ),
        ("no-apiservice", json!({"apiService": {"create": false}, "externalMetrics": {"enabled": true}})),
        ("single-replica", json!({"replicas": 1})),
    ]
}

/// The essential fields of the custom resources (outside the Kubernetes schemas).
fn check_custom_resources(objects: &[Value], what: &str) {
    let names = identities(objects);
    let has = |kind: &str, name: &str| names.iter().any(|(k, _, n)| k == kind && n == name);
    let secrets_made: BTreeSet<&str> = objects
        .iter()
        .filter(|o| o["kind"] == "Certificate")
        .map(|o| o["spec"]["secretName"].as_str().unwrap())
        .chain(
            objects.iter().filter(|o| o["kind"] == "Secret").map(|o| o["metadata"]["name"].as_str().unwrap()),
        )
        .collect();
    for object in objects.iter().filter(|o| manifests::is_custom_resource(o)) {
        let kind = object["kind"].as_str().unwrap();
        assert!(
            object["metadata"]["name"].is_string() && object["metadata"]["namespace"].is_string(),
            "{what}: {object}"
        );
        match (object["apiVersion"].as_str().unwrap(), kind) {
            ("cert-manager.io/v1", "Issuer") => {
                assert!(
                    object["spec"]["selfSigned"].is_object()
                        || object["spec"]["ca"]["secretName"].is_string()
                );
                if let Some(secret) = object["spec"]["ca"]["secretName"].as_str() {
                    assert!(secrets_made.contains(secret), "{what}: CA Issuer reads {secret}");
                }
            }
            ("cert-manager.io/v1", "Certificate") => {
                assert!(object["spec"]["secretName"].is_string(), "{what}: {object}");
                let issuer = object["spec"]["issuerRef"]["name"].as_str().unwrap();
                if what.contains("existing-issuer") {
                    // The operator's own issuer: only the serving certificate, signed by it.
                    assert_eq!(object["metadata"]["name"], "percolator-serving", "{what}");
                    assert!(!has("Issuer", issuer), "{what}: {issuer} is the operator's");
                } else {
                    assert_eq!(object["spec"]["issuerRef"]["kind"], "Issuer", "{what}");
                    assert!(has("Issuer", issuer), "{what}: Certificate names Issuer {issuer}");
                }
            }
            ("monitoring.coreos.com/v1", "ServiceMonitor") => {
                let endpoint = &object["spec"]["endpoints"][0];
                assert_eq!(endpoint["port"], "https", "{what}");
                assert_eq!(endpoint["scheme"], "https", "{what}");
                assert_eq!(endpoint["path"], "/metrics", "{what}");
                assert_eq!(endpoint["authorization"]["type"], "Bearer", "{what}");
                let token = endpoint["authorization"]["credentials"]["name"].as_str().unwrap();
                let secret = find(objects, "Secret", token);
                assert_eq!(secret["type"], "kubernetes.io/service-account-token", "{what}");
                assert!(endpoint.get("bearerTokenFile").is_none(), "{what}: no deprecated bearerTokenFile");
                if let Some(ca) = endpoint["tlsConfig"]["ca"]["secret"]["name"].as_str() {
                    assert!(
                        secrets_made.contains(ca) || what.starts_with("existing"),
                        "{what}: CA from {ca}"
                    );
                }
                let service = objects.iter().find(|o| o["kind"] == "Service").unwrap();
                for (label, value) in object["spec"]["selector"]["matchLabels"].as_object().unwrap() {
                    assert_eq!(&service["metadata"]["labels"][label], value, "{what}: selects the Service");
                }
            }
            ("monitoring.coreos.com/v1", "PrometheusRule") => {
                // The alerts themselves: the_prometheus_rule_is_the_alerts_file_fitted_to_the_release.
                let groups = object["spec"]["groups"].as_array().unwrap();
                assert!(groups.iter().any(|g| g["name"] == "percolator"), "{what}: {object}");
            }
            (api_version, kind) => panic!("{what}: unexpected custom resource {api_version} {kind}"),
        }
    }
}

#[test]
fn lint_is_clean_and_every_object_validates() {
    let matrix = mk_matrix();
    let renders = mk_render_all(&matrix);
    let lints: Vec<Value> = matrix
        .iter()
        .map(|(name, values)| {
            helm("lint", &json!({"values": values, "namespace": NAMESPACE, "kube_version": "v1.33.0"}))
                .unwrap_or_else(|e| panic!("{name}: lint: {e}"))
        })
        .collect();
    let mut everything = Vec::new();
    for (((name, values), render), lint) in matrix.iter().zip(&renders).zip(&lints) {
        // helm lint --strict: warnings are errors; only informational messages (icon) remain.
        assert_eq!(lint["errors"], json!([]), "{name}: {lint}");
        for message in lint["messages"].as_array().unwrap() {
            assert!(message["severity"].as_u64().unwrap() <= 1, "{name}: {message}");
        }
        let objects = &render.objects;
        assert!(objects.len() >= 6, "{name}: {} objects", objects.len());
        // Unique identities, every namespaced object in the release's namespace (but the
        // RoleBinding to kube-system's authentication reader).
        assert_eq!(identities(objects).len(), objects.len(), "{name}: duplicate objects");
        for object in objects {
            let namespace = object["metadata"]["namespace"].as_str();
            assert!(
                namespace.is_none_or(
                    |ns| ns == NAMESPACE || (ns == "kube-system" && object["kind"] == "RoleBinding")
                ),
                "{name}: {object}"
            );
            assert_eq!(
                object["metadata"]["labels"]["app.kubernetes.io/managed-by"], "Helm",
                "{name}: {object}"
            );
        }
        // percolator accepts its flags, and every file a flag names is in a volume of the pod.
        let flags = parse_flags(objects, name);
        assert_eq!(
            flags.serving.secure_port,
            values["containerPort"].as_u64().unwrap_or(10250) as u16,
            "{name}"
        );
        let pod = pod_spec(objects);
        for arg in args_of(objects) {
            if let Some((flag, path)) = arg.split_once('=')
                && is_file_flag(flag)
                && path != "/var/run/secrets/kubernetes.io/serviceaccount/token"
            {
                let source = file_source(pod, path);
                assert!(!source.starts_with('/'), "{name}: {arg} is in no volume");
            }
        }
        // A mount inside another is inside a ConfigMap or Secret volume, where the kubelet makes
        // the mount point (the container cannot: they are read-only).
        let mounts = pod["containers"][0]["volumeMounts"].as_array().unwrap();
        for inner in mounts {
            let path = inner["mountPath"].as_str().unwrap();
            for outer in
                mounts.iter().filter(|m| path.starts_with(&format!("{}/", m["mountPath"].as_str().unwrap())))
            {
                let volume =
                    pod["volumes"].as_array().unwrap().iter().find(|v| v["name"] == outer["name"]).unwrap();
                assert!(
                    volume.get("configMap").is_some() || volume.get("secret").is_some(),
                    "{name}: {path} in {volume}"
                );
            }
        }
        if values["hostNetwork"]["enabled"] != true {
            manifests::assert_restricted_pod_spec(pod, name);
        }
        check_custom_resources(objects, name);
        // No pod restart for configuration changes: no checksum annotation.
        let annotations = &deployment(objects)["spec"]["template"]["metadata"]["annotations"];
        assert!(
            annotations.as_object().is_none_or(|a| a.keys().all(|k| !k.starts_with("checksum/"))),
            "{name}: {annotations}"
        );
        everything.extend(objects.iter().cloned());
    }
    let names: Vec<&str> = matrix.iter().map(|(n, _)| *n).collect();
    manifests::kubernetes_validate(&everything, &format!("chart {}", names.join(",")));
}

#[test]
fn the_defaults_are_a_restricted_highly_available_install() {
    let Rendered { objects, notes } = mk_render(json!({}));
    let expected: BTreeSet<(String, String, String)> = [
        ("ServiceAccount", NAMESPACE, "percolator"),
        ("Secret", NAMESPACE, "percolator-tls"),
        ("ConfigMap", NAMESPACE, "percolator-config"),
        ("ClusterRole", "", "system:percolator"),
        ("ClusterRole", "", "system:percolator-aggregated-reader"),
        ("ClusterRole", "", "system:percolator-metrics-reader"),
        ("ClusterRoleBinding", "", "system:percolator"),
        ("ClusterRoleBinding", "", "percolator:system:auth-delegator"),
        ("RoleBinding", "kube-system", "percolator-auth-reader"),
        ("Service", NAMESPACE, "percolator"),
        ("Deployment", NAMESPACE, "percolator"),
        ("PodDisruptionBudget", NAMESPACE, "percolator"),
        ("APIService", "", "v1alpha1.stats.une-tasse-de.cafe"),
    ]
    .iter()
    .map(|(k, ns, n)| (k.to_string(), ns.to_string(), n.to_string()))
    .collect();
    assert_eq!(identities(&objects), expected);

    let deployment = deployment(&objects);
    assert_eq!(deployment["spec"]["replicas"], 2, "highly available");
    assert_eq!(deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"], 0);
    assert_eq!(find(&objects, "PodDisruptionBudget", "percolator")["spec"]["minAvailable"], 1);
    let pod = pod_spec(&objects);
    manifests::assert_restricted_pod_spec(pod, "chart defaults");
    assert_eq!(pod["priorityClassName"], "system-cluster-critical");
    assert_eq!(
        container(&objects)["image"],
        format!("ghcr.io/une-tasse-de/percolator:{}", env!("CARGO_PKG_VERSION"))
    );
    // The selector, the Service, the PodDisruptionBudget and the default anti-affinity all
    // select the pods, with the standard selector labels.
    let selector = json!({"app.kubernetes.io/name": "percolator", "app.kubernetes.io/instance": RELEASE});
    assert_eq!(deployment["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(find(&objects, "Service", "percolator")["spec"]["selector"], selector);
    assert_eq!(
        find(&objects, "PodDisruptionBudget", "percolator")["spec"]["selector"]["matchLabels"],
        selector
    );
    let term = &pod["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0];
    assert_eq!(term["podAffinityTerm"]["labelSelector"]["matchLabels"], selector);
    assert_eq!(term["podAffinityTerm"]["topologyKey"], "kubernetes.io/hostname");
    let pod_labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (label, value) in selector.as_object().unwrap() {
        assert_eq!(&pod_labels[label], value);
    }
    for object in &objects {
        let labels = &object["metadata"]["labels"];
        for label in [
            "app.kubernetes.io/name",
            "app.kubernetes.io/instance",
            "app.kubernetes.io/version",
            "helm.sh/chart",
        ] {
            assert!(labels[label].is_string(), "{label} on {object}");
        }
    }
    // The metric APIs are off: only one server per cluster may own each group.
    let args = args_of(&objects);
    assert!(
        !args.iter().any(|a| a.starts_with("--enable-") || a.starts_with("--adapter-config")),
        "{args:?}"
    );
    let values = std::fs::read_to_string(manifests::repo_path("charts/percolator/values.yaml")).unwrap();
    assert!(values.contains("Only ONE server per cluster can own each group"));
    assert!(values.contains("GKE's default ResourceQuota"));

    // The configuration shipped is deploy/base's, and no checksum restarts pods on its change.
    let shipped = config_text(&manifests::kustomize("deploy/base"), "percolator-config");
    assert_eq!(yaml(&config_text(&objects, "percolator-config")), yaml(&shipped));
    assert!(deployment["spec"]["template"]["metadata"].get("annotations").is_none());
    let volumes = pod["volumes"].as_array().unwrap();
    let config = volumes.iter().find(|v| v["configMap"]["name"] == "percolator-config").unwrap();
    let mount =
        pod["containers"][0]["volumeMounts"].as_array().unwrap().iter().find(|m| m["name"] == config["name"]);
    assert!(mount.unwrap().get("subPath").is_none(), "a directory mount: the kubelet updates it in place");

    // NOTES.txt: the commands that show it works.
    assert!(notes.contains("kubectl get apiservices v1alpha1.stats.une-tasse-de.cafe"), "{notes}");
    assert!(notes.contains("kubectl get pms -A"), "{notes}");
    assert!(notes.contains("The pod meets the restricted Pod Security Standard."), "{notes}");
    assert!(!notes.contains("WARNING") && !notes.contains("NOTE"), "{notes}");
    assert!(!notes.contains("kubectl top"), "{notes}");
}

/// The overlays, and the metric APIs the chart enables for the same install.
const PAIRS: &[(&str, &[&str])] = &[
    ("deploy/overlays/cert-manager", &[]),
    ("deploy/overlays/external-metrics", &["externalMetrics"]),
    ("deploy/overlays/custom-metrics", &["customMetrics"]),
    ("deploy/overlays/custom-metrics/with-external", &["customMetrics", "externalMetrics"]),
    ("deploy/overlays/resource-metrics", &["resourceMetrics"]),
    ("deploy/overlays/all-metrics", &["resourceMetrics", "customMetrics", "externalMetrics"]),
];

#[test]
fn the_chart_gives_the_kustomize_objects() {
    for (dir, _) in PAIRS {
        assert!(manifests::repo_path(dir).join("kustomization.yaml").exists(), "{dir} is an overlay");
    }
    let cases: Vec<(&str, Value)> = PAIRS
        .iter()
        .map(|(dir, apis)| {
            let mut values = json!({"tls": {"type": "cert-manager"}});
            for api in *apis {
                values[*api] = json!({"enabled": true});
            }
            (*dir, values)
        })
        .collect();
    let renders = mk_render_all(&cases);
    for ((dir, _), render) in cases.iter().zip(renders) {
        let chart = render.objects;
        let kustomize: Vec<Value> =
            manifests::kustomize(dir).into_iter().filter(|o| o["kind"] != "Namespace").collect();
        assert_eq!(identities(&chart), identities(&kustomize), "{dir}: kinds and names");
        for theirs in &kustomize {
            let kind = theirs["kind"].as_str().unwrap();
            let name = theirs["metadata"]["name"].as_str().unwrap();
            let ours = find(&chart, kind, name);
            let what = format!("{dir} {kind}/{name}");
            // deploy/'s labels (name, part-of) are the chart's too.
            for (label, value) in theirs["metadata"]["labels"].as_object().into_iter().flatten() {
                assert_eq!(&ours["metadata"]["labels"][label], value, "{what}: label {label}");
            }
            match kind {
                "ClusterRole" | "Role" => assert_eq!(ours["rules"], theirs["rules"], "{what}"),
                "ClusterRoleBinding" | "RoleBinding" => {
                    assert_eq!(ours["roleRef"], theirs["roleRef"], "{what}");
                    assert_eq!(ours["subjects"], theirs["subjects"], "{what}");
                }
                "APIService" | "Issuer" | "Certificate" => {
                    assert_eq!(ours["spec"], theirs["spec"], "{what}");
                    assert_eq!(ours["metadata"]["annotations"], theirs["metadata"]["annotations"], "{what}");
                }
                "Service" => {
                    assert_eq!(ours["spec"]["ports"], theirs["spec"]["ports"], "{what}");
                    for (label, value) in theirs["spec"]["selector"].as_object().unwrap() {
                        assert_eq!(&ours["spec"]["selector"][label], value, "{what}: selector");
                    }
                }
                "PodDisruptionBudget" => {
                    assert_eq!(ours["spec"]["minAvailable"], theirs["spec"]["minAvailable"], "{what}")
                }
                "ConfigMap" => {
                    let text = |o: &Value| yaml(o["data"]["config.yaml"].as_str().unwrap());
                    assert_eq!(text(ours), text(theirs), "{what}");
                }
                "ServiceAccount" => {}
                "Deployment" => {
                    for field in ["replicas", "strategy"] {
                        assert_eq!(ours["spec"][field], theirs["spec"][field], "{what}: {field}");
                    }
                    let (our_pod, their_pod) =
                        (&ours["spec"]["template"]["spec"], &theirs["spec"]["template"]["spec"]);
                    for field in ["serviceAccountName", "priorityClassName", "securityContext", "volumes"] {
                        assert_eq!(our_pod[field], their_pod[field], "{what}: {field}");
                    }
                    let (our_container, their_container) =
                        (&our_pod["containers"][0], &their_pod["containers"][0]);
                    for field in [
                        "name",
                        "image",
                        "imagePullPolicy",
                        "ports",
                        "livenessProbe",
                        "readinessProbe",
                        "resources",
                        "securityContext",
                        "volumeMounts",
                    ] {
                        assert_eq!(our_container[field], their_container[field], "{what}: {field}");
                    }
                    // The same flags; each file flag reads the same key of the same ConfigMap or
                    // Secret, wherever it is mounted.
                    assert_eq!(normalized_args(&chart), normalized_args(&kustomize), "{what}: flags");
                    let set = |objects: &[Value]| args_of(objects).into_iter().collect::<BTreeSet<_>>();
                    assert_eq!(set(&chart), set(&kustomize), "{what}: the same file paths too");
                }
                other => panic!("{what}: {other} not compared"),
            }
        }
    }
}

/// The names of `names` the serving certificate of the `kubernetes.io/tls` Secret `secret` is
/// trusted for, as kube-apiserver checks it (the chain to its `ca.crt`, which every APIService's
/// caBundle holds), once percolator has loaded the pair (the key matches the certificate).
fn mk_trusted_names(secret: &Value, names: &[String]) -> Vec<String> {
    use base64::Engine as _;
    use rustls::client::danger::ServerCertVerifier;
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();
    let dir = common::mk_dir("chart-tls");
    for key in ["tls.crt", "tls.key", "ca.crt"] {
        std::fs::write(dir.join(key), b64(&secret["data"][key])).unwrap();
    }
    apiserver::ReloadingCert::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in apiserver::read_certs(&dir.join("ca.crt"), "ca.crt").unwrap() {
        roots.add(cert).unwrap();
    }
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider)
        .build()
        .unwrap();
    let chain = apiserver::read_certs(&dir.join("tls.crt"), "tls.crt").unwrap();
    std::fs::remove_dir_all(&dir).unwrap();
    names
        .iter()
        .filter(|server| {
            let name = rustls::pki_types::ServerName::try_from(server.as_str()).unwrap();
            verifier
                .verify_server_cert(&chain[0], &chain[1..], &name, &[], rustls::pki_types::UnixTime::now())
                .is_ok()
        })
        .cloned()
        .collect()
}

#[test]
fn the_generated_certificate_is_trusted_for_the_service() {
    use base64::Engine as _;
    let b64 = |v: &Value| base64::engine::general_purpose::STANDARD.decode(v.as_str().unwrap()).unwrap();

    let objects = mk_render(json!({"resourceMetrics": {"enabled": true}, "customMetrics": {"enabled": true},
                                   "externalMetrics": {"enabled": true}}))
    .objects;
    // Not cert-manager's Secret name (<fullname>-serving-cert): an upgrade may switch types.
    let secret = find(&objects, "Secret", "percolator-tls");
    assert_eq!(secret["type"], "kubernetes.io/tls");
    assert_eq!(
        file_source(pod_spec(&objects), "/etc/percolator/tls/tls.crt"),
        "secret percolator-tls tls.crt"
    );
    let ca = b64(&secret["data"]["ca.crt"]);
    for name in ALL_APISERVICES {
        let api = find(&objects, "APIService", name);
        assert_eq!(b64(&api["spec"]["caBundle"]), ca, "{name} trusts the CA of the Secret");
        // Explicit: taking over an APIService that had it true never leaves it true.
        assert_eq!(api["spec"]["insecureSkipTLSVerify"], false, "{name}");
    }
    // percolator loads the pair, and kube-apiserver's check passes for the Service's names only.
    let other = "percolator.default.svc".to_owned();
    let names = [SERVICE_DNS.to_owned(), format!("{SERVICE_DNS}.cluster.local"), other];
    assert_eq!(mk_trusted_names(secret, &names), names[..2]);

    // existing-secret: the operator's Secret, and the CA bundle given as PEM.
    let pem = mk_ca_pem();
    let objects = mk_render(json!({"tls": {"type": "existing-secret", "existingSecret": {"name": "my-tls"}},
                                   "apiService": {"caBundle": pem}}))
    .objects;
    assert!(!objects.iter().any(|o| o["kind"] == "Secret" || manifests::is_custom_resource(o)));
    let api = find(&objects, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    assert_eq!(String::from_utf8(b64(&api["spec"]["caBundle"])).unwrap(), pem);
    assert_eq!(file_source(pod_spec(&objects), "/etc/percolator/tls/tls.crt"), "secret my-tls tls.crt");

    // insecureSkipTLSVerify: only when asked, then no caBundle and no injection, and a warning.
    let Rendered { objects, notes } =
        mk_render(json!({"apiService": {"insecureSkipTLSVerify": true}, "tls": {"type": "cert-manager"}}));
    let api = find(&objects, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    assert_eq!(api["spec"]["insecureSkipTLSVerify"], true);
    assert!(api["spec"].get("caBundle").is_none() && api["metadata"].get("annotations").is_none(), "{api}");
    assert!(notes.contains("WARNING: apiService.insecureSkipTLSVerify is on"), "{notes}");
}

#[test]
fn rendered_configuration_files_load_in_percolator() {
    let check = percolator::config_check();
    // The defaults, a declared kind with custom and external metrics, and a string kept as is.
    let declared = json!({
        "window": "2m",
        "kinds": [{
            "kind": "AppTraffic",
            "shortNames": ["atr"],
            "nameLabel": "pod",
            "description": "HTTP traffic per pod.",
            "fields": [{"name": "requestsPerSecond", "column": "REQ/S",
                        "query": "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))"}],
        }],
        "customMetrics": [{"name": "queue_depth", "aggregate": "max",
                           "query": "max by (namespace, pod) (queue_depth{SCOPE})"}],
        "externalMetrics": [{"name": "orders_per_minute", "labels": ["shop"],
                             "query": "sum by (namespace, shop) (rate(orders_total{SCOPE}[WINDOW])) * 60"}],
    });
    let text = "window: 3m # kept as written\n";
    let mut with_rules = json!({"customMetrics": {"enabled": true}, "externalMetrics": {"enabled": true},
                                "resourceMetrics": {"enabled": true}, "config": declared});
    with_rules["rules"] = mk_rules();
    with_rules["rules"]["default"] = json!(true);
    let cases = [
        ("defaults", json!({})),
        ("declared", with_rules),
        ("string", json!({"config": text})),
        ("default-rules", json!({"rules": {"default": true}})),
        (
            "existing-rules",
            json!({"rules": {"existing": "adapter-rules"}, "customMetrics": {"enabled": true}}),
        ),
    ];
    let renders = mk_render_all(&cases);

    let defaults = &renders[0].objects;
    let file = percolator::config::QueryFile::from_yaml(
        &config_text(defaults, "percolator-config"),
        "defaults",
        &check,
    )
    .unwrap();
    assert!(file.kinds.is_empty());
    assert!(!defaults.iter().any(|o| o["metadata"]["name"] == "percolator-adapter-config"));

    let declared = &renders[1].objects;
    let file = percolator::config::QueryFile::from_yaml(
        &config_text(declared, "percolator-config"),
        "declared",
        &check,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let kinds: Vec<&str> = file.kinds.iter().map(|k| k.kind.as_str()).collect();
    assert_eq!(kinds, ["AppTraffic"]);
    assert_eq!(file.custom_metrics.unwrap()[0].name, "queue_depth");
    assert_eq!(file.external_metrics.unwrap()[0].name, "orders_per_minute");
    // The adapter configuration: every rule source, loaded as percolator loads it.
    let adapter = config_text(declared, "percolator-adapter-config");
    let config = percolator::testing::AdapterConfig::from_yaml(&adapter, "rules")
        .unwrap_or_else(|e| panic!("{e}\n{adapter}"));
    assert_eq!(config.rules.len(), 7, "prometheus-adapter's six default rules, then rules.custom");
    assert_eq!(config.rules[6].api_name("http_requests_total").as_deref(), Some("http_requests_rate"));
    assert_eq!(config.external_rules.len(), 1);
    assert!(config.resource_rules.is_some());
    let args = args_of(declared);
    for flag in ["--adapter-config=/etc/percolator/adapter/config.yaml", "--resource-source=prometheus"] {
        assert!(args.iter().any(|a| a == flag), "{flag} in {args:?}");
    }
    assert_eq!(
        file_source(pod_spec(declared), "/etc/percolator/adapter/config.yaml"),
        "configMap percolator-adapter-config config.yaml"
    );
    let flags = parse_flags(declared, "declared");
    assert_eq!(flags.kubelet.resource_source, Some(percolator::config::ResourceSource::Prometheus));
    // prometheus-adapter's default relist interval, with an adapter configuration only.
    assert_eq!(flags.adapter.metrics_relist_interval, std::time::Duration::from_secs(60));
    assert!(!args_of(defaults).iter().any(|a| a.starts_with("--metrics-relist-interval")));

    assert_eq!(config_text(&renders[2].objects, "percolator-config"), text);

    // prometheus-adapter's default rules, read as the adapter reads them: each rule's filters
    // and name (a series each serves, and one its filters leave to another rule).
    let only_default = config_text(&renders[3].objects, "percolator-adapter-config");
    let config = percolator::testing::AdapterConfig::from_yaml(&only_default, "default")
        .unwrap_or_else(|e| panic!("{e}\n{only_default}"));
    assert_eq!((config.rules.len(), config.external_rules.len()), (6, 0));
    assert!(config.resource_rules.is_none());
    for (index, series, name, left_out) in [
        (0, "container_cpu_usage_seconds_total", "cpu_usage", "container_memory_working_set_bytes"),
        (
            1,
            "container_network_receive_bytes_total",
            "network_receive_bytes",
            "container_cpu_usage_seconds_total",
        ),
        (
            2,
            "container_memory_working_set_bytes",
            "memory_working_set_bytes",
            "container_network_receive_bytes_total",
        ),
        (3, "queue_depth", "queue_depth", "http_requests_total"),
        (4, "http_requests_total", "http_requests", "process_cpu_seconds_total"),
        (5, "process_cpu_seconds_total", "process_cpu", "queue_depth"),
    ] {
        let rule = &config.rules[index];
        assert!(rule.keeps_series(series), "rules[{index}] keeps {series}");
        assert_eq!(rule.api_name(series).as_deref(), Some(name), "rules[{index}] names {series}");
        assert!(
            !rule.keeps_series(left_out) || rule.api_name(left_out).is_none(),
            "rules[{index}] leaves {left_out} out"
        );
    }
    // With the default configuration, which declares no customMetrics: its default metrics
    // (http_requests_per_second, ...) yield their names to a rule's, so together they start.
    let file = percolator::config::QueryFile::from_yaml(
        &config_text(&renders[3].objects, "percolator-config"),
        "default-rules",
        &check,
    )
    .unwrap();
    assert!(!file.declares.custom_metrics && !file.declares.external_metrics);
    assert!(!args_of(&renders[3].objects).iter().any(|a| a.starts_with("--resource-source")));

    // rules.existing: the operator's ConfigMap, no rendered one.
    let existing = &renders[4].objects;
    assert!(!existing.iter().any(|o| o["metadata"]["name"] == "percolator-adapter-config"));
    assert_eq!(
        file_source(pod_spec(existing), "/etc/percolator/adapter/config.yaml"),
        "configMap adapter-rules config.yaml"
    );
}

#[test]
fn prometheus_values_become_percolator_s_flags() {
    let objects = mk_render(json!({"prometheus": mk_prometheus_connection()})).objects;
    let pod = pod_spec(&objects);
    let flags = parse_flags(&objects, "prometheus-connection");
    let p = &flags.prometheus;
    assert_eq!(p.prometheus_url.as_str(), "https://thanos-query.monitoring.svc:10902/prometheus");
    assert_eq!(p.prometheus_timeout, std::time::Duration::from_secs(30));
    assert_eq!(p.prometheus_max_response_bytes, 64 * 1024 * 1024);
    assert!(!p.prometheus_insecure_skip_tls_verify);
    let source =
        |path: &Option<std::path::PathBuf>| file_source(pod, path.as_ref().unwrap().to_str().unwrap());
    assert_eq!(source(&p.prometheus_ca_file), "secret prometheus-ca ca.crt");
    assert_eq!(source(&p.prometheus_client_tls_cert_file), "secret percolator-client tls.crt");
    assert_eq!(source(&p.prometheus_client_tls_key_file), "secret percolator-client tls.key");
    assert_eq!(source(&p.prometheus_token_file), "secret prometheus-token jwt");
    let headers: BTreeMap<&str, &str> =
        p.prometheus_headers.iter().map(|h| (h.name.as_str(), h.value.to_str().unwrap())).collect();
    // A secret header's value is expanded by the kubelet from an environment variable that
    // reads the Secret; it is in no Kubernetes object.
    assert_eq!(
        headers,
        BTreeMap::from([
            ("x-scope-orgid", "team-cafe"),
            ("x-plain", "a,b=c"),
            ("x-api-key", "$(PROMETHEUS_HEADER_X_API_KEY)"),
        ])
    );
    assert_eq!(
        container(&objects)["env"],
        json!([{"name": "PROMETHEUS_HEADER_X_API_KEY",
                "valueFrom": {"secretKeyRef": {"name": "prometheus-api-key", "key": "key"}}}])
    );

    let objects = mk_render(json!({"prometheus": {"basicAuth": {"secretName": "prom-auth"}, "port": null,
                                                  "url": "https://prometheus.example.com/",
                                                  "tls": {"insecureSkipVerify": true}}}))
    .objects;
    let p = parse_flags(&objects, "basic-auth").prometheus;
    assert_eq!(p.prometheus_url.as_str(), "https://prometheus.example.com/");
    assert!(p.prometheus_insecure_skip_tls_verify);
    let pod = pod_spec(&objects);
    let source =
        |path: &Option<std::path::PathBuf>| file_source(pod, path.as_ref().unwrap().to_str().unwrap());
    assert_eq!(source(&p.prometheus_basic_auth_username_file), "secret prom-auth username");
    assert_eq!(source(&p.prometheus_basic_auth_password_file), "secret prom-auth password");

    let objects = mk_render(json!({"prometheus": {"bearerToken": {"serviceAccountToken": true}}})).objects;
    let p = parse_flags(&objects, "sa-token").prometheus;
    assert_eq!(p.prometheus_url.as_str(), "http://prometheus.monitoring.svc:9090/");
    assert_eq!(
        p.prometheus_token_file.unwrap().to_str().unwrap(),
        "/var/run/secrets/kubernetes.io/serviceaccount/token"
    );
}

#[test]
fn optional_objects_follow_their_values() {
    let cases = [
        (
            "all-apis",
            json!({"externalMetrics": {"enabled": true}, "customMetrics": {"enabled": true},
                            "resourceMetrics": {"enabled": true}}),
        ),
        (
            "monitoring",
            json!({"serviceMonitor": {"enabled": true, "labels": {"release": "kps"},
                                                 "additionalLabels": {"team": "cafe"}, "interval": "30s"},
                              "prometheusRule": {"enabled": true, "namespace": "monitoring", "labels": {"release": "kps"}},
                              "networkPolicy": {"enabled": true}}),
        ),
        (
            "lean",
            json!({"rbac": {"create": false}, "serviceAccount": {"create": false, "name": "sa"},
                        "podDisruptionBudget": {"maxUnavailable": 1}, "affinity": null, "priorityClassName": ""}),
        ),
        ("host-network", json!({"hostNetwork": {"enabled": true}, "containerPort": 4443})),
    ];
    let renders = mk_render_all(&cases);

    // Each API: its APIServices, flag, RBAC, and NOTES commands.
    let Rendered { objects, notes } = &renders[0];
    for name in ALL_APISERVICES {
        find(objects, "APIService", name);
    }
    for role in [
        "system:percolator-external-metrics-reader",
        "system:percolator-custom-metrics-reader",
        "system:percolator-aggregated-metrics-reader",
    ] {
        find(objects, "ClusterRole", role);
    }
    assert!(!objects.iter().any(|o| o["metadata"]["name"] == "system:aggregated-metrics-reader"));
    for binding in ["percolator:hpa-controller-external-metrics", "percolator:hpa-controller-custom-metrics"]
    {
        let binding = find(objects, "ClusterRoleBinding", binding);
        assert_eq!(
            binding["subjects"],
            json!([{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}])
        );
    }
    let args = args_of(objects);
    for flag in ["--enable-external-metrics", "--enable-custom-metrics", "--enable-resource-metrics"] {
        assert!(args.iter().any(|a| a == flag), "{flag}");
    }
    for command in [
        "kubectl top pods -A",
        "kubectl get --raw /apis/custom.metrics.k8s.io/v1beta2",
        "kubectl get --raw /apis/external.metrics.k8s.io/v1beta1",
        "v1beta1.metrics.k8s.io v1beta2.custom.metrics.k8s.io v1beta1.custom.metrics.k8s.io v1beta1.external.metrics.k8s.io",
    ] {
        assert!(notes.contains(command), "{command}: {notes}");
    }

    // ServiceMonitor: its scraper's identity is bound to the metrics reader role; TLS from the CA.
    let objects = &renders[1].objects;
    let monitor = find(objects, "ServiceMonitor", "percolator");
    assert_eq!(monitor["metadata"]["labels"]["release"], "kps");
    assert_eq!(monitor["metadata"]["labels"]["team"], "cafe");
    // The job label is the chart's name, as the alert rules (dashboards/percolator-alerts.yaml)
    // select job="percolator", whatever the release's name.
    assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name");
    assert_eq!(
        find(objects, "Service", "percolator")["metadata"]["labels"]["app.kubernetes.io/name"],
        "percolator"
    );
    let endpoint = &monitor["spec"]["endpoints"][0];
    assert_eq!(endpoint["interval"], "30s");
    assert_eq!(
        endpoint["tlsConfig"],
        json!({"serverName": SERVICE_DNS, "ca": {"secret": {"name": "percolator-tls", "key": "ca.crt"}}})
    );
    let token = find(objects, "Secret", endpoint["authorization"]["credentials"]["name"].as_str().unwrap());
    let scraper = token["metadata"]["annotations"]["kubernetes.io/service-account.name"].as_str().unwrap();
    find(objects, "ServiceAccount", scraper);
    let binding = find(objects, "ClusterRoleBinding", "percolator:metrics-scraper");
    assert_eq!(binding["roleRef"]["name"], "system:percolator-metrics-reader");
    assert_eq!(
        binding["subjects"],
        json!([{"kind": "ServiceAccount", "name": scraper, "namespace": NAMESPACE}])
    );
    let rule = find(objects, "PrometheusRule", "percolator");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "kps");
    // NetworkPolicy: in to the secure port from anywhere; out to DNS, kube-apiserver, the
    // kubelets and Prometheus only.
    let policy = find(objects, "NetworkPolicy", "percolator");
    assert_eq!(policy["spec"]["ingress"], json!([{"ports": [{"port": "https", "protocol": "TCP"}]}]));
    let egress: BTreeSet<(u64, &str)> = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().unwrap())
        .map(|p| (p["port"].as_u64().unwrap(), p["protocol"].as_str().unwrap()))
        .collect();
    assert_eq!(
        egress,
        BTreeSet::from([
            (53, "UDP"),
            (53, "TCP"),
            (443, "TCP"),
            (6443, "TCP"),
            (10250, "TCP"),
            (9090, "TCP")
        ])
    );

    // rbac.create false, an existing ServiceAccount, a PDB by maxUnavailable, no anti-affinity.
    let objects = &renders[2].objects;
    assert!(!objects.iter().any(|o| {
        let kind = o["kind"].as_str().unwrap();
        kind.contains("Role") || kind == "ServiceAccount"
    }));
    let pod = pod_spec(objects);
    assert_eq!(pod["serviceAccountName"], "sa");
    assert!(pod.get("affinity").is_none() && pod.get("priorityClassName").is_none(), "{pod}");
    assert_eq!(find(objects, "PodDisruptionBudget", "percolator")["spec"]["maxUnavailable"], 1);
    assert!(find(objects, "PodDisruptionBudget", "percolator")["spec"].get("minAvailable").is_none());

    // hostNetwork: the node's network, DNS through the cluster, another port than the kubelet's.
    let Rendered { objects, notes } = &renders[3];
    let pod = pod_spec(objects);
    assert_eq!(pod["hostNetwork"], true);
    assert_eq!(pod["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(container(objects)["ports"][0]["containerPort"], 4443);
    assert!(args_of(objects).iter().any(|a| a == "--secure-port=4443"));
    assert!(
        notes.contains("forbid: namespace kube-system must admit privileged pods")
            && !notes.contains("meets the restricted"),
        "{notes}"
    );

    // Another release name: every name derives from the full name, cluster-wide ones included.
    let objects = mk_render_as(json!({"tls": {"type": "cert-manager"}}), "metrics", "monitoring").objects;
    let service = find(&objects, "Service", "metrics-percolator");
    assert_eq!(service["metadata"]["namespace"], "monitoring");
    find(&objects, "ClusterRole", "system:metrics-percolator");
    find(&objects, "RoleBinding", "metrics-percolator-auth-reader");
    let serving = find(&objects, "Certificate", "metrics-percolator-serving");
    assert_eq!(serving["spec"]["dnsNames"][0], "metrics-percolator.monitoring.svc");
    let api = find(&objects, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    assert_eq!(
        api["spec"]["service"],
        json!({"name": "metrics-percolator", "namespace": "monitoring", "port": 443})
    );
    assert_eq!(
        api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "monitoring/metrics-percolator-serving"
    );
}

#[test]
fn the_schema_refuses_wrong_types_and_unknown_keys() {
    for (values, expected) in [
        (json!({"replicas": "two"}), &["/replicas", "want integer"][..]),
        (json!({"externalMetrics": {"enabled": "yes"}}), &["/externalMetrics/enabled", "want boolean"]),
        (json!({"replica": 3}), &["additional properties 'replica' not allowed"]),
        (json!({"tls": {"type": "vault"}}), &["/tls/type"]),
        (
            json!({"prometheus": {"bearerToken": {"secretNme": "t"}}}),
            &["/prometheus/bearerToken", "'secretNme'"],
        ),
        (json!({"config": 3}), &["/config"]),
        // Only what makes sense of their charts' values: a Service kube-apiserver can reach.
        (json!({"service": {"type": "ExternalName"}}), &["/service/type"]),
        (json!({"service": {"port": 0}}), &["/service/port"]),
        // A budget is a number of pods or a percentage.
        (json!({"podDisruptionBudget": {"minAvailable": "half"}}), &["/podDisruptionBudget/minAvailable"]),
        // One handler per probe (the default's httpGet gives way to any other).
        (
            json!({"livenessProbe": {"exec": {"command": ["true"]}, "tcpSocket": {"port": "https"}}}),
            &["/livenessProbe/tcpSocket"],
        ),
        (
            json!({"readinessProbe": {"tcpSocket": {"port": "https"}, "grpc": {"port": 10250}}}),
            &["/readinessProbe/grpc"],
        ),
        (
            json!({"startupProbe": {"httpGet": {"path": "/livez", "port": "https"}, "exec": {"command": ["true"]}}}),
            &["/startupProbe/exec"],
        ),
        (
            json!({"tls": {"certManager": {"existingIssuer": {"enabled": true, "kind": "Vault", "name": "v"}}}}),
            &["/tls/certManager/existingIssuer/kind"],
        ),
        (json!({"tls": {"certManager": {"duration": "90d"}}}), &["/tls/certManager/duration"]),
        (json!({"dashboards": {"folder": "percolator"}}), &["/dashboards", "'folder'"]),
        (json!({"extraManifests": [3]}), &["/extraManifests/0"]),
        (json!({"image": {"tag": true}}), &["/image/tag"]),
        (json!({"podDisruptionBudget": {"unhealthyPodEvictionPolicy": "Never"}}), &["/podDisruptionBudget"]),
        // No rule allowing every port.
        (json!({"networkPolicy": {"egress": {"dns": {"ports": []}}}}), &["/networkPolicy/egress/dns/ports"]),
    ] {
        let message = helm("validate", &json!({"values": values})).expect_err(&values.to_string());
        for part in expected {
            assert!(message.contains(part), "{values}: {part:?} not in {message}");
        }
        // Rendering refuses them as well (Helm validates before rendering).
        let message = mk_render_error(values.clone());
        assert!(message.contains(expected[0]), "{values}: {message}");
    }
    assert_eq!(helm("validate", &json!({"values": {}})).unwrap(), json!({"valid": true}));
    for values in [json!({"image": {"tag": 20240101}}), json!({"image": {"tag": "0.2.0@sha256:abc"}})] {
        assert_eq!(helm("validate", &json!({"values": values})).unwrap(), json!({"valid": true}), "{values}");
    }
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(manifests::repo_path("charts/percolator/values.schema.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(schema["$schema"], "http://json-schema.org/draft-07/schema#");
    assert_eq!(schema["additionalProperties"], false);
    // Every top-level value has a type.
    let values =
        yaml(&std::fs::read_to_string(manifests::repo_path("charts/percolator/values.yaml")).unwrap());
    for key in values.as_object().unwrap().keys() {
        assert!(
            schema["properties"][key]["type"].is_string() || schema["properties"][key]["type"].is_array(),
            "{key}"
        );
    }
}

#[test]
fn inconsistent_values_fail_with_a_message() {
    for (values, expected) in [
        (json!({"hostNetwork": {"enabled": true}}), "containerPort 10250 is the kubelet's port"),
        (
            json!({"prometheus": {"bearerToken": {"secretName": "t"}, "basicAuth": {"secretName": "b"}}}),
            "bearerToken and basicAuth are exclusive",
        ),
        (json!({"tls": {"type": "existing-secret"}}), "tls.existingSecret.name is required"),
        (
            json!({"tls": {"type": "existing-secret", "existingSecret": {"name": "x"}}}),
            "set apiService.caBundle",
        ),
        (
            json!({"prometheus": {"headers": {"X-Key": "a"}, "secretHeaders": {"X-Key": {"secretName": "s", "key": "k"}}}}),
            "prometheus.secretHeaders.X-Key: also in prometheus.headers",
        ),
        (json!({"logLevel": 4, "args": ["-v=2"]}), "logLevel is --v=4: remove -v=2 from args/defaultArgs"),
    ] {
        let message = mk_render_error(values.clone());
        assert!(message.contains(expected), "{values}: {message}");
    }
}

/// The chart's PrometheusRule is `dashboards/percolator-alerts.yaml` (the plain rules file,
/// each alert unit-tested with promtool in tests/alerts.rs), fitted to the release: with every
/// API and the ServiceMonitor on, the same groups exactly; with fewer APIs, the APIService alert
/// names only the APIServices the release registers; the rules load in the real Prometheus
/// (promtool).
#[test]
fn the_prometheus_rule_is_the_alerts_file_fitted_to_the_release() {
    let plain = std::fs::read_to_string(manifests::repo_path("dashboards/percolator-alerts.yaml")).unwrap();
    let copy =
        std::fs::read_to_string(manifests::repo_path("charts/percolator/files/percolator-alerts.yaml"))
            .unwrap();
    assert!(
        plain == copy,
        "charts/percolator/files/percolator-alerts.yaml is a copy of dashboards/percolator-alerts.yaml: \
         cp dashboards/percolator-alerts.yaml charts/percolator/files/"
    );
    let plain = yaml(&plain);
    let rule = |values: Value| -> Value {
        let objects = mk_render(values).objects;
        let rules: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "PrometheusRule").collect();
        assert_eq!(rules.len(), 1);
        rules[0].clone()
    };
    let all = rule(json!({
        "prometheusRule": {"enabled": true, "labels": {"release": "kube-prometheus-stack"}},
        "serviceMonitor": {"enabled": true},
        "resourceMetrics": {"enabled": true},
        "customMetrics": {"enabled": true},
        "externalMetrics": {"enabled": true},
    }));
    assert_eq!(
        all["spec"]["groups"], plain["groups"],
        "every API and the ServiceMonitor on: the plain file's groups"
    );
    assert_eq!(all["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(all["metadata"]["namespace"], NAMESPACE);

    let expr_of = |rule: &Value, alert: &str| -> String {
        rule["spec"]["groups"][0]["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["alert"] == alert)
            .unwrap_or_else(|| panic!("{alert} missing"))["expr"]
            .as_str()
            .unwrap()
            .to_owned()
    };
    let alternation = |expr: &str| -> Vec<String> {
        let start = expr.find("name=~\"").unwrap() + "name=~\"".len();
        let end = start + expr[start..].find('"').unwrap();
        expr[start..end].split('|').map(|n| n.replace("\\\\.", ".")).collect()
    };
    assert_eq!(alternation(&expr_of(&all, "PercolatorAPIServiceUnavailable")), ALL_APISERVICES);
    for (values, expected) in [
        (json!({}), vec!["v1alpha1.stats.une-tasse-de.cafe"]),
        (
            json!({"resourceMetrics": {"enabled": true}}),
            vec!["v1alpha1.stats.une-tasse-de.cafe", "v1beta1.metrics.k8s.io"],
        ),
        (
            json!({"customMetrics": {"enabled": true}}),
            vec![
                "v1alpha1.stats.une-tasse-de.cafe",
                "v1beta2.custom.metrics.k8s.io",
                "v1beta1.custom.metrics.k8s.io",
            ],
        ),
        (
            json!({"externalMetrics": {"enabled": true}}),
            vec!["v1alpha1.stats.une-tasse-de.cafe", "v1beta1.external.metrics.k8s.io"],
        ),
    ] {
        let mut values = values;
        values["prometheusRule"] = json!({"enabled": true});
        values["serviceMonitor"] = json!({"enabled": true});
        let rule = rule(values.clone());
        assert_eq!(alternation(&expr_of(&rule, "PercolatorAPIServiceUnavailable")), expected, "{values}");
        // Everything but that alternation is the plain file's.
        let mut fitted = rule["spec"]["groups"].clone();
        let mut original = plain["groups"].clone();
        for groups in [&mut fitted, &mut original] {
            for r in groups[0]["rules"].as_array_mut().unwrap() {
                if r["alert"] == "PercolatorAPIServiceUnavailable" {
                    r["expr"] = Value::Null;
                }
            }
        }
        assert_eq!(fitted, original, "{values}");
    }

    // Another job name (nameOverride): every job matcher follows it, and the groups still load
    // in Prometheus.
    let renamed = rule(json!({"prometheusRule": {"enabled": true}, "nameOverride": "metrics-api"}));
    let text = serde_json::to_string(&renamed["spec"]["groups"]).unwrap();
    assert!(!text.contains("job=\\\"percolator\\\""), "{text}");
    assert!(text.contains("job=\\\"metrics-api\\\""), "{text}");
    let file = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("percolator-chart-rules-{}.yaml", std::process::id()));
    std::fs::write(&file, serde_json::to_string(&json!({"groups": renamed["spec"]["groups"]})).unwrap())
        .unwrap();
    let out = std::process::Command::new(std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".into()))
        .args(["check", "rules"])
        .arg(&file)
        .output()
        .expect("promtool (Debian's prometheus package; scripts/install-deps.sh)");
    let _ = std::fs::remove_file(&file);
    assert!(out.status.success(), "promtool check rules: {}", String::from_utf8_lossy(&out.stdout));
    let found =
        format!("SUCCESS: {} rules found", renamed["spec"]["groups"][0]["rules"].as_array().unwrap().len());
    assert!(
        String::from_utf8_lossy(&out.stdout).contains(&found),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Every `helm install`, `helm upgrade` or `helm template` command the documents show, as
/// written: command lines (with their `\` continuations; in YAML comments too) and commands
/// quoted inline in prose.
fn mk_documented_helm_commands() -> Vec<(String, String)> {
    let mut commands = Vec::new();
    for doc in [
        "README.md",
        "docs/deploy.md",
        "docs/operations.md",
        "charts/percolator/README.md",
        "charts/percolator/values.yaml",
        "CHANGELOG.md",
    ] {
        let text = std::fs::read_to_string(manifests::repo_path(doc)).unwrap();
        let mut pending: Option<String> = None;
        for line in text.lines() {
            // Commands quoted inline in prose: `helm upgrade ...`.
            for span in line.split('`').skip(1).step_by(2) {
                if ["helm install ", "helm upgrade ", "helm template "].iter().any(|c| span.starts_with(c)) {
                    commands.push((doc.to_owned(), span.to_owned()));
                }
            }
            let line = line.trim_start().trim_start_matches('#').trim();
            let continued = match pending.take() {
                Some(start) => Some(start + " " + line),
                None if ["helm install ", "helm upgrade ", "helm template "]
                    .iter()
                    .any(|c| line.starts_with(c)) =>
                {
                    Some(line.to_owned())
                }
                None => None,
            };
            if let Some(command) = continued {
                match command.strip_suffix('\\') {
                    Some(open) => pending = Some(open.trim_end().to_owned()),
                    None => commands.push((doc.to_owned(), command)),
                }
            }
        }
    }
    commands
}

/// The Helm commands of the README, docs/deploy.md, the operations guide, the chart's README
/// and values do what they say: Helm parses them (no flag it would refuse), the schema accepts
/// their values, and they render an install whose objects validate, with the Prometheus URL
/// and the APIServices their `--set`s ask for.
#[test]
fn documented_helm_commands_render() {
    let commands = mk_documented_helm_commands();
    let docs: BTreeSet<&str> = commands.iter().map(|(doc, _)| doc.as_str()).collect();
    for doc in ["README.md", "docs/deploy.md", "docs/operations.md", "charts/percolator/README.md"] {
        assert!(docs.contains(doc), "{doc} shows a helm command ({commands:?})");
    }
    for (doc, command) in &commands {
        // An install or upgrade runs against a cluster, which a document may assume has
        // cert-manager's and the Prometheus Operator's CRDs; `helm template` has none but those
        // its --api-versions name.
        let cluster: Vec<&str> = if command.starts_with("helm template ") {
            Vec::new()
        } else {
            CERT_MANAGER_APIS.iter().chain(PROMETHEUS_OPERATOR_APIS).copied().collect()
        };
        let answer = helm("command", &json!({"command": command, "api_versions": cluster}))
            .unwrap_or_else(|e| panic!("{doc}: `{command}`: {e}"));
        let what = format!("{doc}: `{command}`");
        let values = &answer["values"];
        let Rendered { objects, .. } = rendered(&answer);
        manifests::kubernetes_validate(&objects, &what);
        let args = args_of(&objects);
        if let Some(url) = values["prometheus"]["url"].as_str() {
            let port = values["prometheus"]["port"].as_u64().unwrap_or(9090);
            let path = values["prometheus"]["path"].as_str().unwrap_or("");
            let flag = format!("--prometheus-url={url}:{port}{path}");
            assert!(args.contains(&flag), "{what}: {flag} in {args:?}");
        }
        for (name, value) in values["prometheus"]["headers"].as_object().into_iter().flatten() {
            let flag = format!("--prometheus-header={name}={}", value.as_str().unwrap());
            assert!(args.contains(&flag), "{what}: {flag} in {args:?}");
        }
        let mut expected = vec!["v1alpha1.stats.une-tasse-de.cafe"];
        for (api, names) in [
            ("resourceMetrics", &["v1beta1.metrics.k8s.io"][..]),
            ("customMetrics", &["v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"][..]),
            ("externalMetrics", &["v1beta1.external.metrics.k8s.io"][..]),
        ] {
            if values[api]["enabled"] == true {
                expected.extend(names);
            }
        }
        let mut registered: Vec<&str> = objects
            .iter()
            .filter(|o| o["kind"] == "APIService")
            .map(|o| o["metadata"]["name"].as_str().unwrap())
            .collect();
        registered.sort_unstable();
        expected.sort_unstable();
        assert_eq!(registered, expected, "{what}");
        let namespace = answer["namespace"].as_str().unwrap();
        assert!(
            namespace == "kube-system" || values["priorityClassName"] == "",
            "{what}: system-cluster-critical outside kube-system (GKE refuses it): set priorityClassName="
        );
    }
}

/// Before registering an APIService the chart looks it up: one another owner registered
/// (metrics-server's Helm release, a kustomize install, a managed add-on) is refused with a
/// message naming it, the Service it points to, and what to do; this release's own passes, and
/// so does any with `apiService.takeOwnership` (for `helm --take-ownership`). Offline, lookup
/// finds nothing: a copy of the chart answers it as a cluster would.
#[test]
fn an_apiservice_of_another_owner_is_refused_with_what_to_do() {
    let owned_by = |release: &str, namespace: &str| json!({"meta.helm.sh/release-name": release, "meta.helm.sh/release-namespace": namespace});
    let cluster = json!({
        // metrics-server's chart: its Helm release, insecureSkipTLSVerify true.
        "v1beta1.metrics.k8s.io": {
            "metadata": {"name": "v1beta1.metrics.k8s.io", "annotations": owned_by("metrics-server", "kube-system")},
            "spec": {"service": {"name": "metrics-server", "namespace": "kube-system", "port": 443},
                     "insecureSkipTLSVerify": true},
        },
        // This release's own (an upgrade).
        "v1beta2.custom.metrics.k8s.io": {
            "metadata": {"name": "v1beta2.custom.metrics.k8s.io", "annotations": owned_by(RELEASE, NAMESPACE)},
            "spec": {"service": {"name": "percolator", "namespace": NAMESPACE, "port": 443}},
        },
        "v1beta1.custom.metrics.k8s.io": {
            "metadata": {"name": "v1beta1.custom.metrics.k8s.io", "annotations": owned_by(RELEASE, NAMESPACE)},
            "spec": {"service": {"name": "percolator", "namespace": NAMESPACE, "port": 443}},
        },
        // Applied by an add-on manager, not by Helm.
        "v1beta1.external.metrics.k8s.io": {
            "metadata": {"name": "v1beta1.external.metrics.k8s.io",
                         "labels": {"addonmanager.kubernetes.io/mode": "Reconcile"}},
            "spec": {"service": {"name": "keda-operator-metrics-apiserver", "namespace": "keda", "port": 443}},
        },
    });
    let chart = mk_chart_copy("chart-lookup", |chart| {
        mk_edit(
            &chart.join("templates/_helpers.tpl"),
            r#"toJson (lookup "apiregistration.k8s.io/v1" "APIService" "" .)"#,
            &format!("toJson (get (fromJson `{cluster}`) . | default dict)"),
        );
    });
    let render = |values: Value, name: &str| helm_in(&chart, "render", &mk_request(&values, name, NAMESPACE));

    // Absent (the stats APIService) or this release's: rendered.
    let answer =
        render(json!({"customMetrics": {"enabled": true}}), RELEASE).unwrap_or_else(|e| panic!("{e}"));
    let objects = rendered(&answer).objects;
    for name in
        ["v1alpha1.stats.une-tasse-de.cafe", "v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"]
    {
        assert_eq!(find(&objects, "APIService", name)["spec"]["insecureSkipTLSVerify"], false, "{name}");
    }

    // metrics-server's: refused, naming it, its Service and owner, and the ways out.
    let message =
        render(json!({"resourceMetrics": {"enabled": true}}), RELEASE).expect_err("metrics-server's");
    for part in [
        "APIService v1beta1.metrics.k8s.io already exists",
        "Service kube-system/metrics-server",
        "Helm release kube-system/metrics-server",
        "kubectl delete apiservice v1beta1.metrics.k8s.io",
        "uninstall it",
        "Helm >= 3.17",
        "--take-ownership --set apiService.takeOwnership=true",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }
    // Taken over on purpose: rendered, and verified (insecureSkipTLSVerify false, a caBundle).
    let answer =
        render(json!({"resourceMetrics": {"enabled": true}, "apiService": {"takeOwnership": true}}), RELEASE)
            .unwrap_or_else(|e| panic!("{e}"));
    let api = find(&rendered(&answer).objects, "APIService", "v1beta1.metrics.k8s.io").clone();
    assert_eq!(api["spec"]["insecureSkipTLSVerify"], false);
    assert!(api["spec"]["caBundle"].is_string(), "{api}");

    // An add-on manager's: refused, saying it cannot be replaced.
    let message = render(json!({"externalMetrics": {"enabled": true}}), RELEASE).expect_err("an add-on's");
    for part in [
        "Service keda/keda-operator-metrics-apiserver",
        "no Helm release of this name",
        "managed add-on",
        "cannot be replaced",
    ] {
        assert!(message.contains(part), "{part:?} not in {message}");
    }

    // Another release of percolator does not own this one's.
    let message =
        render(json!({"customMetrics": {"enabled": true}}), "metrics").expect_err("another release's");
    assert!(
        message.contains(&format!(
            "owned by Helm release {NAMESPACE}/percolator, not by release {NAMESPACE}/metrics"
        )),
        "{message}"
    );

    // apiService.create=false: the APIServices are managed outside the chart, so none is
    // rendered and none is looked up, whoever owns it.
    for values in [
        json!({"resourceMetrics": {"enabled": true}, "apiService": {"create": false}}),
        json!({"externalMetrics": {"enabled": true}, "apiService": {"create": false}}),
    ] {
        let answer = render(values.clone(), RELEASE).unwrap_or_else(|e| panic!("{values}: {e}"));
        let objects = rendered(&answer).objects;
        assert!(!objects.iter().any(|o| o["kind"] == "APIService"), "{values}");
        find(&objects, "Secret", "percolator-tls");
    }
    std::fs::remove_dir_all(chart.parent().unwrap()).unwrap();
}

/// Every label value is a valid one, whatever the image tag (a digest-pinned tag once made every
/// object invalid): the version label is the chart's appVersion. The pod template carries only
/// the selector labels and podLabels, so a chart-only release rolls no pod.
#[test]
fn labels_are_valid_and_the_pods_do_not_follow_the_chart() {
    let label_value = regex::Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").unwrap();
    let digest = format!("{}@sha256:{}", env!("CARGO_PKG_VERSION"), "0123456789abcdef".repeat(4));
    let values = json!({
        "image": {"tag": digest},
        "commonLabels": {"cost-center": "42"},
        "podLabels": {"team": "cafe"},
        "resourceMetrics": {"enabled": true}, "customMetrics": {"enabled": true}, "externalMetrics": {"enabled": true},
        "rules": {"default": true},
        "serviceMonitor": {"enabled": true, "labels": {"release": "kps"}},
        "prometheusRule": {"enabled": true},
        "networkPolicy": {"enabled": true},
        "service": {"labels": {"kubernetes.io/cluster-service": "true"}},
    });
    let check = |objects: &[Value], what: &str| {
        for object in objects {
            let pod_labels = &object["spec"]["template"]["metadata"]["labels"];
            for labels in [&object["metadata"]["labels"], pod_labels] {
                for (label, value) in labels.as_object().into_iter().flatten() {
                    let value = value.as_str().unwrap_or_else(|| panic!("{what}: {label} is not a string"));
                    assert!(
                        value.len() <= 63 && label_value.is_match(value),
                        "{what}: {label}={value:?} on {}",
                        object["metadata"]["name"]
                    );
                }
            }
        }
    };
    let Rendered { objects, .. } = mk_render(values.clone());
    check(&objects, "digest-pinned tag");
    assert_eq!(container(&objects)["image"], format!("ghcr.io/une-tasse-de/percolator:{digest}"));
    for object in &objects {
        let labels = &object["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/version"], env!("CARGO_PKG_VERSION"), "{object}");
        assert_eq!(labels["cost-center"], "42", "commonLabels on {object}");
    }
    let service = find(&objects, "Service", "percolator");
    assert_eq!(service["metadata"]["labels"]["kubernetes.io/cluster-service"], "true");
    assert_eq!(find(&objects, "ServiceMonitor", "percolator")["metadata"]["labels"]["release"], "kps");
    let pod_labels = deployment(&objects)["spec"]["template"]["metadata"]["labels"].clone();
    assert_eq!(
        pod_labels,
        json!({"app.kubernetes.io/name": "percolator", "app.kubernetes.io/instance": RELEASE, "team": "cafe"}),
        "the selector labels and podLabels only"
    );
    // commonLabels and podLabels never override the selector's.
    let objects = mk_render(json!({"commonLabels": {"app.kubernetes.io/name": "other"},
                                   "podLabels": {"app.kubernetes.io/instance": "other"}}))
    .objects;
    let deployment_ = deployment(&objects);
    assert_eq!(deployment_["metadata"]["labels"]["app.kubernetes.io/name"], "percolator");
    assert_eq!(deployment_["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/instance"], RELEASE);

    // Another chart version and appVersion, with characters a label refuses and longer than a
    // label: the labels are sanitised (the 63rd character, a '_', trimmed), and the pod
    // template is the same, so the upgrade rolls no pod.
    let prefix = format!("{}_build.7_sha256_", env!("CARGO_PKG_VERSION"));
    let kept = "a".repeat(62 - prefix.len());
    let app_version = format!("{}+build.7@sha256:{kept}:{}", env!("CARGO_PKG_VERSION"), "b".repeat(20));
    let chart = mk_chart_copy("chart-version", |chart| {
        let path = chart.join("Chart.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let text: String = text
            .lines()
            .map(|line| {
                if line.starts_with("version:") {
                    "version: 0.3.0-rc.1+build.7".to_owned()
                } else if line.starts_with("appVersion:") {
                    format!("appVersion: \"{app_version}\"")
                } else {
                    line.to_owned()
                }
            })
            .map(|line| line + "\n")
            .collect();
        std::fs::write(&path, text).unwrap();
    });
    let mut pinned = values.clone();
    pinned["image"] = json!({"tag": env!("CARGO_PKG_VERSION")});
    let answer =
        helm_in(&chart, "render", &mk_request(&values, RELEASE, NAMESPACE)).unwrap_or_else(|e| panic!("{e}"));
    let other = rendered(&answer).objects;
    check(&other, "another chart version");
    let labels = &deployment(&other)["metadata"]["labels"];
    assert_eq!(labels["helm.sh/chart"], "percolator-0.3.0-rc.1_build.7");
    assert_eq!(labels["app.kubernetes.io/version"], format!("{prefix}{kept}"));
    let this = mk_render(pinned.clone()).objects;
    let answer =
        helm_in(&chart, "render", &mk_request(&pinned, RELEASE, NAMESPACE)).unwrap_or_else(|e| panic!("{e}"));
    let other = rendered(&answer).objects;
    assert_eq!(
        deployment(&this)["spec"]["template"]["metadata"],
        deployment(&other)["spec"]["template"]["metadata"],
        "the pod template's labels and annotations do not follow the chart's version"
    );
    assert_ne!(deployment(&this)["metadata"]["labels"], deployment(&other)["metadata"]["labels"]);
    std::fs::remove_dir_all(chart.parent().unwrap()).unwrap();
}

/// Values of metrics-server's and prometheus-adapter's charts, under their names and with their
/// meaning.
#[test]
fn values_of_the_metrics_server_and_prometheus_adapter_charts_render() {
    let cases = [
        (
            "deployment",
            json!({
                "revisionHistoryLimit": 3,
                "deploymentAnnotations": {"reloader.stakater.com/auto": "true"},
                "dnsConfig": {"options": [{"name": "ndots", "value": "2"}]},
                "schedulerName": "custom-scheduler",
                "service": {"annotations": {"a": "b"}, "labels": {"kubernetes.io/cluster-service": "true"}},
                "livenessProbe": {"initialDelaySeconds": 5},
                "readinessProbe": null,
                "startupProbe": {"httpGet": {"path": "/livez", "port": "https", "scheme": "HTTPS"}, "failureThreshold": 30},
                "podDisruptionBudget": {"unhealthyPodEvictionPolicy": "AlwaysAllow"},
                "env": [{"name": "RUST_BACKTRACE", "value": "1"}],
                "prometheus": {"secretHeaders": {"X-Api-Key": {"secretName": "k", "key": "key"}}},
                "logLevel": 4,
                "updateStrategy": {"type": "Recreate"},
            }),
        ),
        ("numeric-tag", json!({"image": {"tag": 20240101}})),
        (
            "network-policy",
            json!({"prometheus": {"url": "http://prometheus-server.monitoring.svc", "port": 80},
                   "networkPolicy": {"enabled": true, "egress": {"dns": {"ports": [5353]},
                                                               "prometheus": {"ports": [9090, "web"]}}}}),
        ),
    ];
    let renders = mk_render_all(&cases);
    let mut everything = Vec::new();
    for ((name, _), render) in cases.iter().zip(&renders) {
        if *name != "deployment" {
            // (That one drops the readiness probe the check requires.)
            manifests::assert_restricted_pod_spec(pod_spec(&render.objects), name);
        }
        parse_flags(&render.objects, name);
        everything.extend(render.objects.iter().cloned());
    }
    manifests::kubernetes_validate(&everything, "metrics-server and prometheus-adapter values");

    let objects = &renders[0].objects;
    let deployment_ = deployment(objects);
    assert_eq!(deployment_["spec"]["revisionHistoryLimit"], 3);
    assert_eq!(deployment_["metadata"]["annotations"], json!({"reloader.stakater.com/auto": "true"}));
    assert!(deployment_["spec"]["template"]["metadata"].get("annotations").is_none());
    // Recreate without the default's rollingUpdate, which kube-apiserver refuses with it.
    assert_eq!(deployment_["spec"]["strategy"], json!({"type": "Recreate"}));
    let pod = pod_spec(objects);
    assert_eq!(pod["dnsConfig"], json!({"options": [{"name": "ndots", "value": "2"}]}));
    assert_eq!(pod["schedulerName"], "custom-scheduler");
    let service = find(objects, "Service", "percolator");
    assert_eq!(service["metadata"]["annotations"], json!({"a": "b"}));
    assert_eq!(service["metadata"]["labels"]["kubernetes.io/cluster-service"], "true");
    assert_eq!(service["metadata"]["labels"]["app.kubernetes.io/name"], "percolator");
    let container_ = container(objects);
    // A probe given in part is merged with the default one; null drops it.
    assert_eq!(
        container_["livenessProbe"],
        json!({"httpGet": {"path": "/livez", "port": "https", "scheme": "HTTPS"},
               "initialDelaySeconds": 5, "periodSeconds": 10, "failureThreshold": 3})
    );
    assert!(container_.get("readinessProbe").is_none(), "{container_}");
    assert_eq!(container_["startupProbe"]["failureThreshold"], 30);
    assert_eq!(
        find(objects, "PodDisruptionBudget", "percolator")["spec"]["unhealthyPodEvictionPolicy"],
        "AlwaysAllow"
    );
    let env: Vec<&str> =
        container_["env"].as_array().unwrap().iter().map(|e| e["name"].as_str().unwrap()).collect();
    assert_eq!(env, ["PROMETHEUS_HEADER_X_API_KEY", "RUST_BACKTRACE"]);
    assert_eq!(parse_flags(objects, "logLevel").verbosity, 4);
    assert!(args_of(objects).contains(&"--v=4".to_owned()));

    // A numeric tag (--set image.tag=20240101) is written as its digits.
    assert_eq!(container(&renders[1].objects)["image"], "ghcr.io/une-tasse-de/percolator:20240101");
    let answer = helm(
        "command",
        &json!({"command": "helm install percolator charts/percolator --set image.tag=20240101"}),
    )
    .unwrap();
    assert_eq!(container(&rendered(&answer).objects)["image"], "ghcr.io/une-tasse-de/percolator:20240101");
    // helm upgrade's --reset-then-reuse-values and --take-ownership (Helm >= 3.17) take no value
    // and change nothing rendered.
    let plain = "helm upgrade --install percolator charts/percolator -n kube-system --set image.tag=20240101";
    let flagged = format!("{plain} --reset-then-reuse-values --take-ownership");
    let [plain, flagged] = [plain, flagged.as_str()].map(|command| {
        let answer =
            helm("command", &json!({"command": command})).unwrap_or_else(|e| panic!("{command}: {e}"));
        (answer["values"].clone(), deployment(&rendered(&answer).objects).clone())
    });
    assert_eq!(plain, flagged);
    // Unquoted in a values file, YAML reads it as a float: still the digits.
    let file = std::env::temp_dir().join(format!("percolator-chart-tag-{}.yaml", std::process::id()));
    std::fs::write(&file, "image:\n  tag: 20240101\n").unwrap();
    let answer = helm(
        "command",
        &json!({"command": format!("helm install percolator charts/percolator -f {}", file.display())}),
    );
    let _ = std::fs::remove_file(&file);
    assert_eq!(
        container(&rendered(&answer.unwrap()).objects)["image"],
        "ghcr.io/une-tasse-de/percolator:20240101"
    );

    // NetworkPolicy: the Prometheus pods' ports (after the Service's DNAT), not the Service's
    // port 80; OpenShift's DNS port.
    let policy = find(&renders[2].objects, "NetworkPolicy", "percolator");
    let egress: BTreeSet<String> = policy["spec"]["egress"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|rule| rule["ports"].as_array().unwrap())
        .map(|p| format!("{}/{}", p["port"].to_string().trim_matches('"'), p["protocol"].as_str().unwrap()))
        .collect();
    let expected: BTreeSet<String> =
        ["5353/UDP", "5353/TCP", "443/TCP", "6443/TCP", "10250/TCP", "9090/TCP", "web/TCP"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(egress, expected);
}

/// NOTES.txt says what values do not do: scrapes refused without RBAC, rules for an API that is
/// off.
#[test]
fn notes_warn_of_values_that_do_nothing() {
    let cases = [
        ("no-rbac", json!({"serviceMonitor": {"enabled": true}, "rbac": {"create": false}})),
        (
            "rules-without-apis",
            json!({"rules": {"default": true, "external": mk_rules()["external"],
                                                "resource": mk_rules()["resource"]}}),
        ),
        ("rules-with-apis", {
            let mut values = json!({"customMetrics": {"enabled": true}, "externalMetrics": {"enabled": true},
                                    "resourceMetrics": {"enabled": true}, "serviceMonitor": {"enabled": true}});
            values["rules"] = mk_rules();
            values
        }),
    ];
    let renders = mk_render_all(&cases);
    let notes = &renders[0].notes;
    for part in [
        "WARNING: serviceMonitor.enabled with rbac.create=false",
        "they get 403",
        format!("--serviceaccount={NAMESPACE}:percolator-metrics-scraper").as_str(),
    ] {
        assert!(notes.contains(part), "{part:?} not in {notes}");
    }
    let notes = &renders[1].notes;
    for part in [
        "rules.default/rules.custom are unused",
        "customMetrics.enabled=true",
        "rules.external is unused",
        "externalMetrics.enabled=true",
        "rules.resource without resourceMetrics.enabled",
    ] {
        assert!(notes.contains(part), "{part:?} not in {notes}");
    }
    let notes = &renders[2].notes;
    assert!(
        !notes.contains("unused") && !notes.contains("WARNING") && !notes.contains("rules.resource"),
        "{notes}"
    );
}

/// A PodDisruptionBudget that lets no pod be evicted blocks every node drain (minAvailable 1 of
/// 1 replica, a percentage that rounds up to every pod, maxUnavailable 0): the chart renders none
/// then, and NOTES.txt says why; a budget that leaves a pod evictable is rendered as given.
#[test]
fn a_budget_that_would_block_every_drain_is_not_rendered() {
    let blocked = [
        ("replicas-1", json!({"replicas": 1}), "minAvailable 1 with replicas 1 keeps every pod"),
        (
            "min-100%",
            json!({"replicas": 3, "podDisruptionBudget": {"minAvailable": "100%"}}),
            "minAvailable 100% of replicas 3 keeps every pod",
        ),
        (
            // 67% of 3 pods is 2.01, rounded up to 3.
            "min-67%-of-3",
            json!({"replicas": 3, "podDisruptionBudget": {"minAvailable": "67%"}}),
            "minAvailable 67% of replicas 3 keeps every pod",
        ),
        (
            "max-0",
            json!({"podDisruptionBudget": {"maxUnavailable": 0}}),
            "maxUnavailable 0 lets no pod be evicted",
        ),
        (
            "max-0%",
            json!({"podDisruptionBudget": {"maxUnavailable": "0%"}}),
            "maxUnavailable 0% lets no pod be evicted",
        ),
    ];
    let kept = [
        ("defaults", json!({}), ("minAvailable", json!(1))),
        (
            "min-2-of-3",
            json!({"replicas": 3, "podDisruptionBudget": {"minAvailable": 2}}),
            ("minAvailable", json!(2)),
        ),
        (
            // 66% of 3 pods is 1.98, rounded up to 2: one may go.
            "min-66%-of-3",
            json!({"replicas": 3, "podDisruptionBudget": {"minAvailable": "66%"}}),
            ("minAvailable", json!("66%")),
        ),
        (
            "max-1-of-1",
            json!({"replicas": 1, "podDisruptionBudget": {"maxUnavailable": 1}}),
            ("maxUnavailable", json!(1)),
        ),
        (
            "max-50%",
            json!({"podDisruptionBudget": {"maxUnavailable": "50%"}}),
            ("maxUnavailable", json!("50%")),
        ),
    ];
    let mut cases: Vec<(&str, Value)> = blocked.iter().map(|(n, v, _)| (*n, v.clone())).collect();
    cases.extend(kept.iter().map(|(n, v, _)| (*n, v.clone())));
    cases.push(("disabled-1", json!({"replicas": 1, "podDisruptionBudget": {"enabled": false}})));
    let renders = mk_render_all(&cases);
    let pdbs = |render: &Rendered| -> Vec<Value> {
        render.objects.iter().filter(|o| o["kind"] == "PodDisruptionBudget").cloned().collect()
    };
    for ((name, values, reason), render) in blocked.iter().zip(&renders) {
        assert_eq!(pdbs(render), Vec::<Value>::new(), "{name}: no budget");
        let note =
            format!("NOTE: no PodDisruptionBudget rendered: {reason}, so it would block every node drain.");
        assert!(render.notes.contains(&note), "{name}: {note:?} not in {}", render.notes);
        // The way out fits the case: more replicas help only a single one.
        let advice = if values["replicas"].as_u64().unwrap_or(2) < 2 {
            "Run 2 replicas (the default)"
        } else {
            "Let one pod go at a time (minAvailable below replicas, or maxUnavailable 1)"
        };
        assert!(render.notes.contains(advice), "{name}: {advice:?} not in {}", render.notes);
    }
    let mut everything = Vec::new();
    for ((name, _, (field, value)), render) in kept.iter().zip(&renders[blocked.len()..]) {
        let pdb = pdbs(render);
        assert_eq!(pdb.len(), 1, "{name}");
        let other = if *field == "minAvailable" { "maxUnavailable" } else { "minAvailable" };
        assert_eq!(&pdb[0]["spec"][field], value, "{name}");
        assert!(pdb[0]["spec"].get(other).is_none(), "{name}: {}", pdb[0]);
        assert!(!render.notes.contains("PodDisruptionBudget"), "{name}: {}", render.notes);
        everything.extend(pdb);
    }
    let disabled = renders.last().unwrap();
    assert!(
        pdbs(disabled).is_empty() && !disabled.notes.contains("PodDisruptionBudget"),
        "{}",
        disabled.notes
    );
    manifests::kubernetes_validate(&everything, "chart budgets");
}

/// A probe handler given in values replaces the default's httpGet: Helm merges a map given in
/// values with the default one, so `livenessProbe: {tcpSocket: ...}` once rendered httpGet and
/// tcpSocket, which kube-apiserver refuses ("may not specify more than 1 handler type"). Each
/// handler type, in each probe, renders exactly that handler beside the default's timings, and
/// validates; timings given alone keep the default handler; a probe left without a handler fails
/// naming it.
#[test]
fn a_probe_handler_given_replaces_the_default_one() {
    let handlers = [
        ("httpGet", json!({"path": "/healthz", "port": 8080, "scheme": "HTTP"})),
        ("exec", json!({"command": ["/bin/true"]})),
        ("tcpSocket", json!({"port": "https"})),
        ("grpc", json!({"port": 10250})),
    ];
    let probes = ["livenessProbe", "readinessProbe", "startupProbe"];
    let mut cases: Vec<(String, Value)> = Vec::new();
    for probe in probes {
        for (handler, spec) in &handlers {
            let mut values = json!({});
            values[probe] = json!({"failureThreshold": 7});
            values[probe][*handler] = spec.clone();
            cases.push((format!("{probe}.{handler}"), values));
        }
    }
    for probe in ["livenessProbe", "readinessProbe"] {
        let mut values = json!({});
        values[probe] = json!({"periodSeconds": 20});
        cases.push((format!("{probe}-timings"), values));
    }
    let named: Vec<(&str, Value)> = cases.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    let renders = mk_render_all(&named);
    let defaults = mk_render(json!({})).objects;
    let default_of = |probe: &str| container(&defaults)[probe].clone();
    let mut everything = Vec::new();
    for ((name, values), render) in cases.iter().zip(&renders) {
        let rendered = container(&render.objects);
        for probe in probes {
            let (given, default) = (&values[probe], default_of(probe));
            let rendered = &rendered[probe];
            if given.is_null() {
                assert_eq!(rendered, &default, "{name}: {probe} untouched");
                continue;
            }
            let kinds: Vec<&str> = rendered
                .as_object()
                .unwrap()
                .keys()
                .map(String::as_str)
                .filter(|k| ["httpGet", "exec", "tcpSocket", "grpc"].contains(k))
                .collect();
            let handler =
                handlers.iter().map(|(h, _)| *h).find(|h| given.get(*h).is_some()).unwrap_or("httpGet");
            assert_eq!(kinds, [handler], "{name}: exactly one handler in {rendered}");
            if given.get(handler).is_some() {
                assert_eq!(rendered[handler], given[handler], "{name}: the handler given");
                assert_eq!(rendered["failureThreshold"], 7, "{name}");
            } else {
                assert_eq!(rendered["httpGet"], default["httpGet"], "{name}: the default's handler kept");
                assert_eq!(rendered["periodSeconds"], 20, "{name}");
            }
            // The default's timings stay beside the handler given.
            if let Some(period) =
                default.get("periodSeconds").filter(|_| given.get("periodSeconds").is_none())
            {
                assert_eq!(&rendered["periodSeconds"], period, "{name}");
            }
        }
        everything.push(deployment(&render.objects).clone());
    }
    manifests::kubernetes_validate(&everything, "chart probes");

    // A probe left without a handler: a message naming it, not a pod kube-apiserver refuses.
    for (values, expected) in [
        (json!({"startupProbe": {"failureThreshold": 30}}), "startupProbe: give a handler"),
        (json!({"livenessProbe": {"httpGet": null, "periodSeconds": 5}}), "livenessProbe: give a handler"),
    ] {
        let message = mk_render_error(values.clone());
        assert!(message.contains(expected), "{values}: {message}");
    }
}

/// NOTES.txt and values.yaml never advise a namespace-wide Pod Security label (in a namespace
/// shared with other workloads, such as monitoring, enforce=restricted would reject their pods):
/// NOTES says the pod meets the restricted standard, whatever the namespace.
#[test]
fn no_namespace_wide_pod_security_advice() {
    for namespace in ["monitoring", "percolator", "kube-system"] {
        let notes = mk_render_as(json!({}), RELEASE, namespace).notes;
        assert!(
            notes.contains("The pod meets the restricted Pod Security Standard."),
            "{namespace}: {notes}"
        );
        for advice in ["kubectl label namespace", "pod-security.kubernetes.io/enforce", "enforce=restricted"]
        {
            assert!(!notes.contains(advice), "{namespace}: {advice:?} in {notes}");
        }
    }
    let values = std::fs::read_to_string(manifests::repo_path("charts/percolator/values.yaml")).unwrap();
    for advice in ["kubectl label namespace", "pod-security.kubernetes.io/enforce", "enforce=restricted"] {
        assert!(!values.contains(advice), "values.yaml advises {advice:?}");
    }
}

/// `rules.default` renders prometheus-adapter's six default rules exactly as its own chart
/// does: for the same `rules` values, percolator's adapter configuration is, as data, what
/// prometheus-adapter's chart 5.3.0 renders (tests/fixtures/prometheus-adapter/, with its
/// provenance), the default rules alone and beside custom, external and resource rules; both
/// load in percolator's loader; metricsRelistInterval defaults to that chart's 1m.
#[test]
fn default_rules_are_prometheus_adapter_s_own() {
    let dir = manifests::repo_path("tests/fixtures/prometheus-adapter");
    let read = |file: &str| std::fs::read_to_string(dir.join(file)).unwrap();
    let cases: Vec<(&str, Value)> = ["default", "all-rules"]
        .iter()
        .map(|name| (*name, yaml(&read(&format!("values-{name}.yaml")))))
        .collect();
    let renders = mk_render_all(&cases);
    for ((name, values), render) in cases.iter().zip(&renders) {
        let theirs = yaml(&read(&format!("{name}.config.yaml")));
        let text = config_text(&render.objects, "percolator-adapter-config");
        assert_eq!(yaml(&text), theirs, "{name}: prometheus-adapter's chart renders the same values so");
        let config =
            percolator::testing::AdapterConfig::from_yaml(&text, name).unwrap_or_else(|e| panic!("{e}"));
        let custom = values["rules"]["custom"].as_array().map_or(0, Vec::len);
        assert_eq!(config.rules.len(), 6 + custom, "{name}");
        assert!(args_of(&render.objects).contains(&"--metrics-relist-interval=1m".to_owned()), "{name}");
    }
    assert_eq!(yaml(&read("default.config.yaml"))["rules"].as_array().unwrap().len(), 6);
    let values =
        yaml(&std::fs::read_to_string(manifests::repo_path("charts/percolator/values.yaml")).unwrap());
    assert_eq!(values["metricsRelistInterval"], "1m");
    assert_eq!(values["rules"]["default"], false, "off by default: they list every series of Prometheus");
}

/// Without their CRDs (a cluster without cert-manager or the Prometheus Operator, or `helm
/// template` without `--api-versions`) the values that render custom resources fail with a
/// message naming the CRD and what to do, not with Kubernetes' "no matches for kind" at apply
/// time; with the group version (as `helm template --api-versions` gives it) or the kind (as a
/// cluster's discovery lists it) they render.
#[test]
fn custom_resources_without_their_crds_fail_naming_them() {
    for (values, kind, crd, group_version, value) in [
        (
            json!({"tls": {"type": "cert-manager"}}),
            "Certificate",
            "certificates.cert-manager.io",
            "cert-manager.io/v1",
            "tls.type=cert-manager",
        ),
        (
            json!({"serviceMonitor": {"enabled": true}}),
            "ServiceMonitor",
            "servicemonitors.monitoring.coreos.com",
            "monitoring.coreos.com/v1",
            "serviceMonitor.enabled",
        ),
        (
            json!({"prometheusRule": {"enabled": true}}),
            "PrometheusRule",
            "prometheusrules.monitoring.coreos.com",
            "monitoring.coreos.com/v1",
            "prometheusRule.enabled",
        ),
    ] {
        let render = |apis: Vec<String>| {
            helm(
                "render",
                &json!({"values": values, "name": RELEASE, "namespace": NAMESPACE, "api_versions": apis}),
            )
        };
        let message = render(Vec::new()).expect_err(&format!("{values} renders without {crd}"));
        for part in [
            format!("{value} renders a {kind} ({group_version}), but the cluster has no CRD {crd}: install "),
            "first, or ".to_owned(),
            format!("With helm template (no cluster), pass --api-versions {group_version}."),
        ] {
            assert!(message.contains(&part), "{values}: {part:?} not in {message}");
        }
        for apis in [vec![group_version.to_owned()], vec![format!("{group_version}/{kind}")]] {
            let answer = render(apis.clone()).unwrap_or_else(|e| panic!("{values} with {apis:?}: {e}"));
            assert!(rendered(&answer).objects.iter().any(|o| o["kind"] == kind), "{values} with {apis:?}");
        }
    }
    // A cluster with the Prometheus Operator's ServiceMonitor CRD but not its PrometheusRule one.
    let message = helm(
        "render",
        &json!({"values": {"prometheusRule": {"enabled": true}}, "name": RELEASE, "namespace": NAMESPACE,
                "api_versions": ["monitoring.coreos.com/v1/ServiceMonitor"]}),
    )
    .expect_err("no PrometheusRule CRD");
    assert!(message.contains("no CRD prometheusrules.monitoring.coreos.com"), "{message}");
    // helm template, as the message says.
    let command =
        "helm template percolator charts/percolator -n kube-system --set serviceMonitor.enabled=true";
    let message = helm("command", &json!({"command": command})).expect_err(command);
    assert!(message.contains("pass --api-versions monitoring.coreos.com/v1"), "{message}");
    let command = format!("{command} --api-versions monitoring.coreos.com/v1");
    let answer = helm("command", &json!({"command": command})).unwrap_or_else(|e| panic!("{command}: {e}"));
    find(&rendered(&answer).objects, "ServiceMonitor", "percolator");
}

/// The alert on an absent scrape job (`absent(up{job=...})`: PercolatorAbsent) fires forever
/// where nothing scrapes percolator under that job: the PrometheusRule has it only with
/// serviceMonitor.enabled, whose scrapes make the job (the chart's name), and then with the
/// release's job; every other alert of the rules file is there either way.
#[test]
fn the_absent_job_alert_comes_only_with_the_service_monitor() {
    let cases = [
        ("rule-only", json!({"prometheusRule": {"enabled": true}})),
        ("both", json!({"prometheusRule": {"enabled": true}, "serviceMonitor": {"enabled": true}})),
        (
            "both-renamed",
            json!({"prometheusRule": {"enabled": true}, "serviceMonitor": {"enabled": true}, "nameOverride": "metrics-api"}),
        ),
    ];
    let renders = mk_render_all(&cases);
    let rules_of = |render: &Rendered| -> Vec<Value> {
        let rule = render.objects.iter().find(|o| o["kind"] == "PrometheusRule").unwrap();
        rule["spec"]["groups"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|g| g["rules"].as_array().unwrap().clone())
            .collect()
    };
    let plain =
        yaml(&std::fs::read_to_string(manifests::repo_path("dashboards/percolator-alerts.yaml")).unwrap());
    let plain_rules: Vec<&Value> =
        plain["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()).collect();
    let is_absent_alone = |rule: &Value| rule["expr"].as_str().unwrap().trim().starts_with("absent(");
    let alerts = |rules: &[&Value]| -> Vec<String> {
        rules.iter().map(|r| r["alert"].as_str().unwrap().to_owned()).collect()
    };

    let rule_only = rules_of(&renders[0]);
    for rule in &rule_only {
        assert!(
            !rule["expr"].as_str().unwrap().contains("absent("),
            "no absent job alert without the ServiceMonitor: {rule}"
        );
    }
    let without: Vec<&Value> = plain_rules.iter().copied().filter(|r| !is_absent_alone(r)).collect();
    assert_eq!(alerts(&rule_only.iter().collect::<Vec<_>>()), alerts(&without), "every other alert");

    for (render, (name, values)) in renders[1..].iter().zip(&cases[1..]) {
        let job = values["nameOverride"].as_str().unwrap_or("percolator");
        let rules = rules_of(render);
        assert_eq!(alerts(&rules.iter().collect::<Vec<_>>()), alerts(&plain_rules), "{name}: every alert");
        let absent: Vec<&Value> =
            rules.iter().filter(|r| r["expr"].as_str().unwrap().contains("absent(")).collect();
        assert_eq!(absent.len(), 1, "{name}: {absent:?}");
        let expected = format!("absent(up{{job=\"{job}\"}})");
        assert!(
            absent[0]["expr"].as_str().unwrap().contains(&expected),
            "{name}: {expected} in {}",
            absent[0]
        );
        if plain_rules.iter().any(|r| r["alert"] == "PercolatorAbsent") {
            assert_eq!(absent[0]["alert"], "PercolatorAbsent", "{name}");
        }
        // The job the ServiceMonitor's scrapes get: the Service's app.kubernetes.io/name.
        let monitor = render.objects.iter().find(|o| o["kind"] == "ServiceMonitor").unwrap();
        assert_eq!(monitor["spec"]["jobLabel"], "app.kubernetes.io/name");
        let service = render.objects.iter().find(|o| o["kind"] == "Service").unwrap();
        assert_eq!(service["metadata"]["labels"]["app.kubernetes.io/name"], job, "{name}");
    }
}

/// namespaceOverride (both anchor charts' name) puts every namespaced object in its namespace,
/// and every reference follows: the APIServices' Service, the RBAC subjects, the serving
/// certificate's names (cert-manager's and the generated one, trusted for them), cert-manager's
/// CA injection, the ServiceMonitor's namespace and TLS name, the PrometheusRule, the
/// dashboards, NOTES.txt. Only the RoleBinding to kube-system's authentication reader stays
/// there.
#[test]
fn namespace_override_moves_every_namespaced_object_and_reference() {
    let everything = json!({"namespaceOverride": "monitoring", "tls": {"type": "cert-manager"},
                            "serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true},
                            "dashboards": {"enabled": true}, "networkPolicy": {"enabled": true},
                            "resourceMetrics": {"enabled": true}, "customMetrics": {"enabled": true}});
    let Rendered { objects, notes } = mk_render_as(everything, "metrics", "default");
    let fullname = "metrics-percolator";
    for object in &objects {
        let namespace = object["metadata"]["namespace"].as_str();
        let kind = object["kind"].as_str().unwrap();
        match kind {
            "ClusterRole" | "ClusterRoleBinding" | "APIService" => assert!(namespace.is_none(), "{object}"),
            "RoleBinding" => assert_eq!(namespace, Some("kube-system"), "{object}"),
            _ => assert_eq!(namespace, Some("monitoring"), "{kind} {}", object["metadata"]["name"]),
        }
        for subject in object["subjects"].as_array().into_iter().flatten() {
            // The HPA controller's grants name its own ServiceAccount, in kube-system.
            let expected =
                if subject["name"] == "horizontal-pod-autoscaler" { "kube-system" } else { "monitoring" };
            assert_eq!(subject["namespace"], expected, "{object}");
        }
        if kind == "APIService" {
            assert_eq!(
                object["spec"]["service"],
                json!({"name": fullname, "namespace": "monitoring", "port": 443})
            );
            assert_eq!(
                object["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
                format!("monitoring/{fullname}-serving")
            );
        }
    }
    let serving = find(&objects, "Certificate", &format!("{fullname}-serving"));
    assert_eq!(
        serving["spec"]["dnsNames"],
        json!([format!("{fullname}.monitoring.svc"), format!("{fullname}.monitoring.svc.cluster.local")])
    );
    let monitor = find(&objects, "ServiceMonitor", fullname);
    assert_eq!(monitor["spec"]["namespaceSelector"]["matchNames"], json!(["monitoring"]));
    assert_eq!(
        monitor["spec"]["endpoints"][0]["tlsConfig"]["serverName"],
        format!("{fullname}.monitoring.svc")
    );
    assert!(notes.contains("installed as metrics-percolator in namespace monitoring"), "{notes}");
    assert!(notes.contains("kubectl -n monitoring get pods"), "{notes}");
    assert!(notes.contains("ConfigMaps in namespace monitoring"), "{notes}");
    manifests::kubernetes_validate(&objects, "chart namespaceOverride");

    // The generated certificate is for the Service in that namespace.
    let objects = mk_render_as(json!({"namespaceOverride": "monitoring"}), "metrics", "default").objects;
    let secret = find(&objects, "Secret", &format!("{fullname}-tls"));
    assert_eq!(secret["metadata"]["namespace"], "monitoring");
    let names = [format!("{fullname}.monitoring.svc"), format!("{fullname}.default.svc")];
    assert_eq!(mk_trusted_names(secret, &names), names[..1]);
}

/// customAnnotations (prometheus-adapter's name) are on every object the chart renders, not on
/// the pods (podAnnotations, which would roll them); an object's own annotations win over them,
/// and the chart's own (cert-manager's CA injection, the scraper token's ServiceAccount) over both.
#[test]
fn custom_annotations_are_on_every_object_but_the_pods() {
    let values = json!({
        "customAnnotations": {"team": "cafe", "a": "custom", "cert-manager.io/inject-ca-from": "x/y",
                              "kubernetes.io/service-account.name": "nobody"},
        "service": {"annotations": {"a": "service"}},
        "deploymentAnnotations": {"a": "deployment"},
        "podAnnotations": {"p": "pod"},
        "tls": {"type": "cert-manager"}, "serviceMonitor": {"enabled": true}, "prometheusRule": {"enabled": true},
        "networkPolicy": {"enabled": true}, "dashboards": {"enabled": true},
        "resourceMetrics": {"enabled": true}, "customMetrics": {"enabled": true}, "externalMetrics": {"enabled": true},
        "rules": {"default": true},
    });
    let objects = mk_render(values.clone()).objects;
    let kinds: BTreeSet<&str> = objects.iter().map(|o| o["kind"].as_str().unwrap()).collect();
    for kind in [
        "APIService",
        "Certificate",
        "Issuer",
        "ConfigMap",
        "Deployment",
        "PodDisruptionBudget",
        "ServiceMonitor",
        "PrometheusRule",
        "NetworkPolicy",
        "ClusterRole",
        "ClusterRoleBinding",
        "RoleBinding",
        "Service",
        "ServiceAccount",
        "Secret",
    ] {
        assert!(kinds.contains(kind), "{kind} rendered");
    }
    for object in &objects {
        let annotations = &object["metadata"]["annotations"];
        assert_eq!(annotations["team"], "cafe", "{} {}", object["kind"], object["metadata"]["name"]);
    }
    assert_eq!(find(&objects, "Service", "percolator")["metadata"]["annotations"]["a"], "service");
    let deployment_ = deployment(&objects);
    assert_eq!(deployment_["metadata"]["annotations"]["a"], "deployment");
    assert_eq!(find(&objects, "ConfigMap", "percolator-config")["metadata"]["annotations"]["a"], "custom");
    assert_eq!(deployment_["spec"]["template"]["metadata"]["annotations"], json!({"p": "pod"}));
    for api in objects.iter().filter(|o| o["kind"] == "APIService") {
        assert_eq!(
            api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
            "kube-system/percolator-serving"
        );
    }
    let token = find(&objects, "Secret", "percolator-metrics-scraper-token");
    assert_eq!(
        token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
        "percolator-metrics-scraper"
    );
    manifests::kubernetes_validate(&objects, "chart customAnnotations");
    // None of them: no annotations map at all where the chart puts none.
    let objects = mk_render(json!({})).objects;
    assert!(objects.iter().all(|o| o["metadata"].get("annotations").is_none()), "no empty annotations");
}

/// extraManifests (prometheus-adapter's name): each entry, a map or a YAML string, is rendered
/// with the release, templated with the chart's context, as given.
#[test]
fn extra_manifests_are_rendered_templated() {
    let values = json!({"extraManifests": [
        {"apiVersion": "v1", "kind": "ConfigMap",
         "metadata": {"name": "{{ .Release.Name }}-extra", "namespace": "{{ include \"percolator.namespace\" . }}"},
         "data": {"prometheus": "{{ .Values.prometheus.url }}"}},
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {{ include \"percolator.fullname\" . }}-extra\nstringData:\n  release: {{ .Release.Name | quote }}\n",
    ]});
    let objects = mk_render_as(values, "metrics", "monitoring").objects;
    let config = find(&objects, "ConfigMap", "metrics-extra");
    assert_eq!(
        config,
        &json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": "metrics-extra", "namespace": "monitoring"},
                "data": {"prometheus": "http://prometheus.monitoring.svc"}})
    );
    let secret = find(&objects, "Secret", "metrics-percolator-extra");
    assert_eq!(secret["stringData"], json!({"release": "metrics"}));
    assert!(secret["metadata"].get("labels").is_none(), "rendered as given: {secret}");
    manifests::kubernetes_validate(&[config.clone(), secret.clone()], "chart extraManifests");
}

/// apiService.create=false (metrics-server's name) renders no APIService (managed outside the
/// chart) but the serving certificate, and NOTES.txt says what to register; service.type and
/// service.port (both anchors' names) make the Service, and every APIService names that port.
#[test]
fn api_service_create_and_the_service_s_type_and_port() {
    let cases = [
        ("no-apiservice", json!({"apiService": {"create": false}, "resourceMetrics": {"enabled": true}})),
        (
            "service",
            json!({"service": {"type": "LoadBalancer", "port": 8443}, "resourceMetrics": {"enabled": true},
                   "customMetrics": {"enabled": true}, "externalMetrics": {"enabled": true}}),
        ),
        // Without APIServices, no caBundle to give them: the operator's Secret alone.
        (
            "existing-secret",
            json!({"apiService": {"create": false},
                   "tls": {"type": "existing-secret", "existingSecret": {"name": "my-tls"}}}),
        ),
        // cert-manager's CA reaches no APIService of the chart: NOTES says how to inject it.
        ("cert-manager", json!({"apiService": {"create": false}, "tls": {"type": "cert-manager"}})),
    ];
    let renders = mk_render_all(&cases);
    let Rendered { objects, .. } = &renders[2];
    assert!(!objects.iter().any(|o| o["kind"] == "APIService"));
    let volumes = &deployment(objects)["spec"]["template"]["spec"]["volumes"];
    assert!(volumes.to_string().contains("\"secretName\":\"my-tls\""), "{volumes}");
    let Rendered { objects, notes } = &renders[3];
    assert!(!objects.iter().any(|o| o["kind"] == "APIService"));
    let inject = "the annotation cert-manager.io/inject-ca-from: kube-system/percolator-serving";
    assert!(notes.contains(inject), "{inject:?} not in {notes}");
    assert!(!notes.contains("injected its CA"), "{notes}");
    let Rendered { objects, notes } = &renders[0];
    assert!(!objects.iter().any(|o| o["kind"] == "APIService"));
    find(objects, "Secret", "percolator-tls");
    for part in [
        "apiService.create=false: the chart registers no APIService.",
        "Register v1alpha1.stats.une-tasse-de.cafe, v1beta1.metrics.k8s.io",
        "pointing to the Service kube-system/percolator port 443",
        "Secret kube-system/percolator-tls",
    ] {
        assert!(notes.contains(part), "{part:?} not in {notes}");
    }
    let objects = &renders[1].objects;
    let service = find(objects, "Service", "percolator");
    assert_eq!(service["spec"]["type"], "LoadBalancer");
    assert_eq!(
        service["spec"]["ports"],
        json!([{"name": "https", "port": 8443, "protocol": "TCP", "targetPort": "https"}])
    );
    for name in ALL_APISERVICES {
        assert_eq!(find(objects, "APIService", name)["spec"]["service"]["port"], 8443, "{name}");
    }
    // The defaults: metrics-server's.
    let service = find(&mk_render(json!({})).objects, "Service", "percolator").clone();
    assert_eq!(
        (service["spec"]["type"].as_str(), service["spec"]["ports"][0]["port"].as_u64()),
        (Some("ClusterIP"), Some(443))
    );
}

/// tls.certManager (metrics-server's names): the serving certificate's duration and renewal,
/// the CA's duration, labels and annotations on the Certificates, and existingIssuer: the
/// operator's Issuer or ClusterIssuer signs the serving certificate, and the chart creates no
/// issuer and no CA of its own; enabled without a name, a message naming it.
#[test]
fn cert_manager_settings_shape_the_certificates() {
    let defaults = mk_render(json!({"tls": {"type": "cert-manager"}})).objects;
    let ca = find(&defaults, "Certificate", "percolator-ca");
    let serving = find(&defaults, "Certificate", "percolator-serving");
    assert_eq!(
        (ca["spec"]["duration"].as_str(), serving["spec"]["duration"].as_str()),
        (Some("8760h"), Some("2160h"))
    );
    assert_eq!(serving["spec"]["renewBefore"], "360h");
    let values = json!({"tls": {"type": "cert-manager", "certManager": {
        "duration": "720h", "renewBefore": "240h", "caDuration": "43800h",
        "labels": {"team": "cafe"}, "annotations": {"note": "corp"}}}});
    let objects = mk_render(values).objects;
    let ca = find(&objects, "Certificate", "percolator-ca");
    let serving = find(&objects, "Certificate", "percolator-serving");
    assert_eq!(ca["spec"]["duration"], "43800h");
    assert_eq!(
        (serving["spec"]["duration"].as_str(), serving["spec"]["renewBefore"].as_str()),
        (Some("720h"), Some("240h"))
    );
    for certificate in [ca, serving] {
        assert_eq!(certificate["metadata"]["labels"]["team"], "cafe");
        assert_eq!(certificate["metadata"]["labels"]["app.kubernetes.io/name"], "percolator");
        assert_eq!(certificate["metadata"]["annotations"], json!({"note": "corp"}));
    }
    for issuer in objects.iter().filter(|o| o["kind"] == "Issuer") {
        assert!(issuer["metadata"]["labels"].get("team").is_none(), "on the Certificates only: {issuer}");
    }
    // Empty, as metrics-server's defaults: cert-manager's own.
    let empty = json!({"tls": {"type": "cert-manager", "certManager": {"duration": "", "renewBefore": "", "caDuration": ""}}});
    let objects = mk_render(empty).objects;
    for name in ["percolator-ca", "percolator-serving"] {
        let spec = &find(&objects, "Certificate", name)["spec"];
        assert!(spec.get("duration").is_none() && spec.get("renewBefore").is_none(), "{name}: {spec}");
    }

    let issued = json!({"tls": {"type": "cert-manager", "certManager": {
        "existingIssuer": {"enabled": true, "kind": "ClusterIssuer", "name": "corp-ca"}}}});
    let objects = mk_render(issued).objects;
    let custom: Vec<String> = objects
        .iter()
        .filter(|o| manifests::is_custom_resource(o))
        .map(|o| format!("{}/{}", o["kind"].as_str().unwrap(), o["metadata"]["name"].as_str().unwrap()))
        .collect();
    assert_eq!(custom, ["Certificate/percolator-serving"]);
    let serving = find(&objects, "Certificate", "percolator-serving");
    assert_eq!(
        serving["spec"]["issuerRef"],
        json!({"name": "corp-ca", "kind": "ClusterIssuer", "group": "cert-manager.io"})
    );
    assert_eq!(serving["spec"]["secretName"], "percolator-serving-cert");
    let api = find(&objects, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    assert_eq!(
        api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "kube-system/percolator-serving"
    );

    let message = mk_render_error(
        json!({"tls": {"type": "cert-manager", "certManager": {"existingIssuer": {"enabled": true}}}}),
    );
    assert!(
        message.contains("tls.certManager.existingIssuer.enabled: set tls.certManager.existingIssuer.name"),
        "{message}"
    );
}

/// dashboards.enabled: one ConfigMap per Grafana dashboard of dashboards/, holding it as it is,
/// with the label Grafana's sidecar watches (dashboards.labels), dashboards.annotations, in
/// dashboards.namespace (percolator's when empty); the chart's copies are dashboards/*.json byte
/// for byte; none by default.
#[test]
fn dashboards_are_config_maps_for_grafana_s_sidecar() {
    let json_files = |dir: &str| -> BTreeMap<String, Vec<u8>> {
        std::fs::read_dir(manifests::repo_path(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| p.extension().is_some_and(|e| e == "json"))
            .map(|p| (p.file_name().unwrap().to_str().unwrap().to_owned(), std::fs::read(&p).unwrap()))
            .collect()
    };
    let dashboards = json_files("dashboards");
    assert!(dashboards.len() >= 2, "{:?}", dashboards.keys());
    assert!(
        json_files("charts/percolator/files/dashboards") == dashboards,
        "charts/percolator/files/dashboards/ holds copies of dashboards/*.json: cp dashboards/*.json charts/percolator/files/dashboards/"
    );

    let cases = [
        ("off", json!({})),
        ("on", json!({"dashboards": {"enabled": true}})),
        (
            "elsewhere",
            json!({"dashboards": {"enabled": true, "namespace": "grafana", "labels": {"grafana_dashboard": "percolator"},
                                  "annotations": {"grafana_folder": "percolator"}}}),
        ),
    ];
    let renders = mk_render_all(&cases);
    let of = |render: &Rendered| -> Vec<Value> {
        render
            .objects
            .iter()
            .filter(|o| o["metadata"]["name"].as_str().unwrap().starts_with("percolator-dashboard-"))
            .cloned()
            .collect()
    };
    assert!(of(&renders[0]).is_empty());
    for ((name, values), render) in cases[1..].iter().zip(&renders[1..]) {
        let maps = of(render);
        assert_eq!(maps.len(), dashboards.len(), "{name}");
        for (file, text) in &dashboards {
            let map_name = format!("percolator-dashboard-{}", file.trim_end_matches(".json"));
            let map = maps
                .iter()
                .find(|m| m["metadata"]["name"] == map_name)
                .unwrap_or_else(|| panic!("{name}: {map_name}"));
            assert_eq!(map["kind"], "ConfigMap");
            assert_eq!(
                map["data"],
                json!({file.clone(): String::from_utf8(text.clone()).unwrap()}),
                "{name}: {file} as it is"
            );
            let namespace = values["dashboards"]["namespace"].as_str().unwrap_or(NAMESPACE);
            assert_eq!(map["metadata"]["namespace"], namespace, "{name}");
            let label = values["dashboards"]["labels"]["grafana_dashboard"].as_str().unwrap_or("1");
            assert_eq!(map["metadata"]["labels"]["grafana_dashboard"], label, "{name}");
            assert_eq!(map["metadata"]["labels"]["app.kubernetes.io/name"], "percolator", "{name}");
            assert_eq!(map["metadata"].get("annotations"), values["dashboards"].get("annotations"), "{name}");
        }
        manifests::kubernetes_validate(&maps, &format!("chart dashboards {name}"));
    }
}

/// Every value added for the anchor charts' users is documented: a `# --` comment in
/// values.yaml, a row of the chart README's table, and a type in values.schema.json.
#[test]
fn the_values_added_are_documented() {
    let values = std::fs::read_to_string(manifests::repo_path(CHART).join("values.yaml")).unwrap();
    let readme = std::fs::read_to_string(manifests::repo_path(CHART).join("README.md")).unwrap();
    let schema: Value = serde_json::from_str(
        &std::fs::read_to_string(manifests::repo_path(CHART).join("values.schema.json")).unwrap(),
    )
    .unwrap();
    let rows: Vec<&str> = readme.lines().filter(|l| l.starts_with("| `")).collect();
    for path in [
        "namespaceOverride",
        "customAnnotations",
        "extraManifests",
        "apiService.create",
        "service.type",
        "service.port",
        "tls.certManager.existingIssuer.enabled",
        "tls.certManager.existingIssuer.kind",
        "tls.certManager.existingIssuer.name",
        "tls.certManager.duration",
        "tls.certManager.renewBefore",
        "tls.certManager.caDuration",
        "tls.certManager.annotations",
        "tls.certManager.labels",
        "dashboards.enabled",
        "dashboards.labels",
        "dashboards.annotations",
        "dashboards.namespace",
    ] {
        let (parent, leaf) = path.rsplit_once('.').unwrap_or(("", path));
        // values.yaml: the key, with a `# --` comment right above it.
        let lines: Vec<&str> = values.lines().collect();
        let documented = lines.windows(2).any(|w| {
            w[1].trim_start().starts_with(&format!("{leaf}:")) && w[0].trim_start().starts_with('#')
        }) || lines.iter().enumerate().any(|(i, l)| {
            l.trim_start().starts_with(&format!("{leaf}:"))
                && lines[..i]
                    .iter()
                    .rev()
                    .take_while(|p| p.trim_start().starts_with('#'))
                    .any(|p| p.contains("# --"))
        });
        assert!(documented, "values.yaml documents {path} with a `# --` comment");
        // The README's table names it (`a.b.c`, or `.c` after its parent in the same cell).
        let named = rows.iter().any(|row| {
            row.contains(&format!("`{path}`"))
                || (row.contains(&format!("`{parent}.")) && row.contains(&format!("`.{leaf}`")))
        });
        assert!(named, "charts/percolator/README.md's table names {path}");
        let mut node = &schema;
        for key in path.split('.') {
            node = &node["properties"][key];
        }
        assert!(node["type"].is_string() || node["type"].is_array(), "values.schema.json types {path}");
    }
}

/// Chart.yaml carries Artifact Hub's metadata: the image of this appVersion (read, never
/// written here: the release bumps it), the changes of this version, links, the maintainer.
#[test]
fn chart_yaml_carries_artifact_hub_metadata() {
    let chart = yaml(&std::fs::read_to_string(manifests::repo_path(CHART).join("Chart.yaml")).unwrap());
    let values = yaml(&std::fs::read_to_string(manifests::repo_path(CHART).join("values.yaml")).unwrap());
    let app_version = chart["appVersion"].as_str().unwrap();
    let annotation =
        |name: &str| yaml(chart["annotations"][name].as_str().unwrap_or_else(|| panic!("{name}")));
    let image = format!("{}:{app_version}", values["image"]["repository"].as_str().unwrap());
    assert_eq!(
        annotation("artifacthub.io/images"),
        json!([{"name": "percolator", "image": image, "platforms": ["linux/amd64", "linux/arm64"]}])
    );
    assert_eq!(container(&mk_render(json!({})).objects)["image"], image, "the image the chart deploys");
    let changes = annotation("artifacthub.io/changes");
    assert!(!changes.as_array().unwrap().is_empty());
    for change in changes.as_array().unwrap() {
        let kind = change["kind"].as_str().unwrap_or_default();
        assert!(
            ["added", "changed", "deprecated", "removed", "fixed", "security"].contains(&kind),
            "{change}"
        );
        assert!(change["description"].as_str().is_some_and(|d| d.len() > 20), "{change}");
    }
    for link in annotation("artifacthub.io/links").as_array().unwrap() {
        assert!(link["name"].is_string(), "{link}");
        assert!(
            link["url"].as_str().unwrap().starts_with("https://github.com/une-tasse-de/percolator"),
            "{link}"
        );
    }
    assert_eq!(
        chart["maintainers"],
        json!([{"name": "une-tasse-de", "url": "https://github.com/une-tasse-de"}])
    );
    assert_eq!(chart["annotations"]["artifacthub.io/license"], "Apache-2.0");
}

/// The queue example of `deploy/examples/`: its chart values (`values-queue-external.yaml`)
/// serve the External metric its HPA (`hpa-queue-external.yaml`) reads: the external metrics
/// API registered and enabled, the metric declared in a configuration percolator loads, every
/// label the HPA selects on accepted by the metric, and the metric alone (declaring external
/// metrics replaces the defaults, as the values file warns).
#[test]
fn the_queue_example_s_values_serve_its_hpa_s_metric() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let read = |name: &str| std::fs::read_to_string(root.join("deploy/examples").join(name)).unwrap();
    let values: Value = yaml(&read("values-queue-external.yaml"));
    let hpa: Value = yaml(&read("hpa-queue-external.yaml"));
    let rendered = mk_render(values);
    let objects = &rendered.objects;
    assert!(args_of(objects).contains(&"--enable-external-metrics".to_owned()), "{:?}", args_of(objects));
    find(objects, "APIService", "v1beta1.external.metrics.k8s.io");

    let check = percolator::config_check();
    let file = percolator::config::QueryFile::from_yaml(
        &config_text(objects, "percolator-config"),
        "values-queue-external.yaml",
        &check,
    )
    .unwrap_or_else(|e| panic!("{e}"));
    let metrics = file.external_metrics.expect("the values declare external metrics");
    let external = &hpa["spec"]["metrics"][0]["external"];
    let name = external["metric"]["name"].as_str().unwrap();
    assert_eq!(metrics.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), [name]);
    let selected: BTreeSet<&str> = external["metric"]["selector"]["matchLabels"]
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(selected, BTreeSet::from(["queue"]));
    // The HPA controller turns the selector into a label selector first: every value must be
    // a valid label value (RabbitMQ's default vhost, "/", is not).
    let label_value = regex::Regex::new(r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$").unwrap();
    for (key, value) in external["metric"]["selector"]["matchLabels"].as_object().unwrap() {
        let value = value.as_str().unwrap();
        assert!(label_value.is_match(value) && value.len() <= 63, "{key}={value:?}: not a label value");
    }
    let accepted: BTreeSet<&str> = metrics[0].labels.iter().map(String::as_str).collect();
    assert!(
        selected.is_subset(&accepted),
        "the HPA selects on {selected:?}, the metric accepts {accepted:?}"
    );
    assert_eq!(external["target"], json!({"type": "AverageValue", "averageValue": "100"}));
}
