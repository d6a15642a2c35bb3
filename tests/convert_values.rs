//! `scripts/convert-values.py`, which turns the values of prometheus-adapter's chart (5.3.0) or
//! metrics-server's (3.13.1) into percolator's chart values (docs/migrating-values.md), run on
//! each anchor chart's own default values and on a typical override of each
//! (`tests/fixtures/anchors/`):
//! - exactly the expected keys are reported as not carried (none for the defaults: a value
//!   equal to what percolator does anyway is carried without a line), and the settings
//!   percolator replaces on purpose are named in notes;
//! - the output validates against percolator's `values.schema.json` and renders with Helm's
//!   engine (`tests/python/helm_chart.py`); every object validates against the Kubernetes
//!   schemas, the container's flags parse with percolator's own parser and the configuration
//!   files load in percolator's loaders;
//! - the rendering has the settings of the anchor's own rendering of the same values
//!   (`tests/fixtures/anchors/*.rendered.json`): the adapter configuration, the metric
//!   APIServices, the Prometheus URL, the pod's placement and resources, the budget, the
//!   certificates, each flag the anchor runs with that percolator has;
//! - `--strict` fails on a key not carried and passes without one; a malformed file is named;
//!   an unknown key or a value of the wrong type is reported, never dropped silently; several
//!   files merge as helm merges them;
//! - the converter's tables agree with the anchors' values files, percolator's flags and chart,
//!   and the document.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, Parser};
use common::manifests::{self, find};
use serde_json::{Value, json};

const ADAPTER: &str = "prometheus-adapter";
const METRICS_SERVER: &str = "metrics-server";
const FIXTURES: &str = "tests/fixtures/anchors";
/// A cluster with cert-manager's and the Prometheus Operator's CRDs: both overrides need them.
const API_VERSIONS: [&str; 2] = ["cert-manager.io/v1", "monitoring.coreos.com/v1"];

/// A file of `tests/fixtures/anchors/`.
fn fixture(name: &str) -> PathBuf {
    manifests::repo_path(FIXTURES).join(name)
}

/// One run of the converter.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Run {
    /// The keys of the report lines of `what` ("not carried" or "note").
    fn keys(&self, what: &str) -> BTreeSet<String> {
        let marker = format!(": {what}: ");
        self.stderr.lines().filter_map(|l| l.split_once(&marker)).map(|(key, _)| key.to_owned()).collect()
    }

    /// The reason given for `key`'s line of `what`.
    fn why(&self, key: &str, what: &str) -> String {
        let prefix = format!("{key}: {what}: ");
        let line = self.stderr.lines().find(|l| l.starts_with(&prefix));
        line.unwrap_or_else(|| panic!("no {prefix:?} in:\n{}", self.stderr))[prefix.len()..].to_owned()
    }

    /// The values written, parsed.
    fn values(&self) -> Value {
        assert_eq!(self.code, 0, "the converter failed:\n{}", self.stderr);
        serde_saphyr::from_str(&self.stdout).unwrap_or_else(|e| panic!("{e}:\n{}", self.stdout))
    }
}

/// Runs `scripts/convert-values.py ARGS` (from the repository's root).
fn mk_convert(args: &[&str]) -> Run {
    let out = std::process::Command::new(manifests::helm_python())
        .arg(manifests::repo_path("scripts/convert-values.py"))
        .args(args)
        .current_dir(manifests::repo_path(""))
        .output()
        .expect("the venv's python (scripts/install-deps.sh; PERCOLATOR_PYTHON overrides)");
    Run {
        code: out.status.code().unwrap_or(-1),
        stdout: String::from_utf8(out.stdout).unwrap(),
        stderr: String::from_utf8(out.stderr).unwrap(),
    }
}

/// Converts the fixture `file` of `anchor`.
fn mk_convert_fixture(anchor: &str, file: &str) -> Run {
    let path = fixture(file);
    mk_convert(&["--from", anchor, path.to_str().unwrap()])
}

/// A file holding `text`, in a directory of its own.
fn mk_file(name: &str, text: &str) -> PathBuf {
    let path = common::mk_dir("convert-values").join(name);
    std::fs::write(&path, text).unwrap();
    path
}

/// percolator's chart.
fn chart() -> PathBuf {
    manifests::repo_path("charts/percolator")
}

/// Checks `values` against percolator's values.schema.json.
fn mk_validate(values: &Value, what: &str) {
    manifests::helm_chart("validate", &chart(), &json!({"values": values}))
        .unwrap_or_else(|e| panic!("{what}: {e}\n{values}"));
}

/// Renders each (values, namespace) as release `percolator` in one run of the driver: the
/// objects of each.
fn mk_render_all(cases: &[(&Value, &str)]) -> Vec<Vec<Value>> {
    let request: Vec<Value> = cases
        .iter()
        .map(|(values, namespace)| {
            json!({"values": values, "name": "percolator", "namespace": namespace, "api_versions": API_VERSIONS})
        })
        .collect();
    let answer = manifests::helm_chart("render", &chart(), &Value::Array(request))
        .unwrap_or_else(|e| panic!("render: {e}"));
    answer
        .as_array()
        .unwrap()
        .iter()
        .map(|one| {
            one["manifests"]
                .as_object()
                .unwrap()
                .iter()
                .filter(|(template, _)| !template.ends_with("NOTES.txt"))
                .flat_map(|(_, text)| manifests::parse_stream(text.as_str().unwrap()))
                .collect()
        })
        .collect()
}

/// The anchor's own rendering `NAME.rendered.json`: its objects, after checking it was rendered
/// from `values` (the fixture it converts), so that it cannot go stale.
fn mk_anchor_rendering(name: &str, values: &Value) -> Vec<Value> {
    let text = std::fs::read_to_string(fixture(&format!("{name}.rendered.json"))).unwrap();
    let rendering: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(
        &rendering["values"], values,
        "{name}.rendered.json was rendered from other values: render it again ({FIXTURES}/README.md)"
    );
    rendering["objects"].as_array().unwrap().clone()
}

/// A YAML fixture, parsed.
fn yaml_file(name: &str) -> Value {
    serde_saphyr::from_str(&std::fs::read_to_string(fixture(name)).unwrap()).unwrap()
}

/// The (only) Deployment of a rendering.
fn deployment(objects: &[Value]) -> &Value {
    objects.iter().find(|o| o["kind"] == "Deployment").expect("a Deployment")
}

/// Its pod template.
fn pod(objects: &[Value]) -> &Value {
    &deployment(objects)["spec"]["template"]
}

/// Its first container (the server's: metrics-server's addon resizer comes second).
fn container(objects: &[Value]) -> &Value {
    &pod(objects)["spec"]["containers"][0]
}

/// That container's arguments.
fn args_of(objects: &[Value]) -> Vec<String> {
    container(objects)["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap().to_owned()).collect()
}

/// The flags of a container as pflag reads them: the last of a name wins (`--name` alone is
/// None); the binary's path (the adapter's `/adapter`) is left out.
fn flags_of(objects: &[Value]) -> BTreeMap<String, Option<String>> {
    args_of(objects)
        .iter()
        .filter(|a| a.starts_with('-'))
        .map(|a| {
            let (name, value) = a
                .trim_start_matches('-')
                .split_once('=')
                .map_or((a.trim_start_matches('-'), None), |(n, v)| (n, Some(v)));
            (name.to_owned(), value.map(str::to_owned))
        })
        .collect()
}

/// The values of a repeatable flag, in order.
fn all_of(objects: &[Value], name: &str) -> Vec<String> {
    let prefix = format!("--{name}=");
    args_of(objects).iter().filter_map(|a| a.strip_prefix(&prefix)).map(str::to_owned).collect()
}

/// Parses the container's flags with percolator's own parser.
fn parse_flags(objects: &[Value], what: &str) -> percolator::config::Args {
    let args = args_of(objects);
    percolator::config::Args::try_parse_from(std::iter::once("percolator".to_owned()).chain(args.clone()))
        .unwrap_or_else(|e| panic!("{what}: percolator refuses {args:?}: {e}"))
}

/// The names of the APIServices of the metric APIs (percolator's own group left out).
fn metric_apis(objects: &[Value]) -> BTreeSet<String> {
    objects
        .iter()
        .filter(|o| o["kind"] == "APIService")
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .filter(|name| name.contains("metrics.k8s.io"))
        .collect()
}

/// What percolator registers for the APIServices an anchor registers: the same, with
/// custom.metrics.k8s.io's v1beta2 beside its v1beta1.
fn percolator_apis(anchor: &BTreeSet<String>) -> BTreeSet<String> {
    let mut apis = anchor.clone();
    if anchor.contains("v1beta1.custom.metrics.k8s.io") {
        apis.insert("v1beta2.custom.metrics.k8s.io".to_owned());
    }
    apis
}

/// The parsed `config.yaml` of a ConfigMap.
fn config_of(objects: &[Value], name: &str) -> (String, Value) {
    let text = find(objects, "ConfigMap", name)["data"]["config.yaml"].as_str().unwrap().to_owned();
    let parsed = serde_saphyr::from_str(&text).unwrap();
    (text, parsed)
}

/// The converter's tables (`--tables json`), read once.
fn mk_tables() -> &'static Value {
    static TABLES: std::sync::OnceLock<Value> = std::sync::OnceLock::new();
    TABLES.get_or_init(|| {
        let run = mk_convert(&["--tables", "json"]);
        assert_eq!(run.code, 0, "{}", run.stderr);
        serde_json::from_str(&run.stdout).unwrap()
    })
}

/// Asserts every flag the anchor runs with that the converter says percolator has (same name,
/// or --metric-resolution as --cache-ttl) is in percolator's args with the same value, and that
/// none it says is not carried is there; `except` are flags each side's chart sets on purpose.
fn assert_flags_carried(anchor: &[Value], percolator: &[Value], except: &[&str], what: &str) {
    let tables = mk_tables();
    let theirs = flags_of(anchor);
    let ours = flags_of(percolator);
    let mut checked = 0;
    for (name, value) in &theirs {
        if except.contains(&name.as_str()) {
            continue;
        }
        let action = tables["flags"][name]["action"].as_str().unwrap_or("unknown");
        match (action, name.as_str()) {
            ("args", "metric-resolution") => assert_eq!(ours["cache-ttl"], *value, "{what}: --cache-ttl"),
            ("args" | "value", "prometheus-header") => {
                assert_eq!(all_of(percolator, name), all_of(anchor, name), "{what}: --{name}")
            }
            ("args" | "value", _) => assert_eq!(ours.get(name), Some(value), "{what}: --{name}"),
            ("chart", _) => continue,
            _ => assert!(!ours.contains_key(name), "{what}: --{name} ({action}) is in percolator's args"),
        }
        checked += 1;
    }
    assert!(checked >= 2, "{what}: only {checked} flags compared: {theirs:?}");
}

/// The placement and resources of the pod, compared field by field.
fn assert_same_pod(anchor: &[Value], percolator: &[Value], what: &str) {
    for field in ["tolerations", "nodeSelector", "priorityClassName", "imagePullSecrets", "hostNetwork"] {
        assert_eq!(pod(percolator)["spec"][field], pod(anchor)["spec"][field], "{what}: {field}");
    }
    assert_eq!(container(percolator)["resources"], container(anchor)["resources"], "{what}: resources");
    assert_eq!(
        deployment(percolator)["spec"]["replicas"],
        deployment(anchor)["spec"]["replicas"],
        "{what}: replicas"
    );
}

#[test]
fn the_anchors_defaults_convert_with_nothing_left_out() {
    let adapter = mk_convert_fixture(ADAPTER, "prometheus-adapter-5.3.0.values.yaml");
    let metrics_server = mk_convert_fixture(METRICS_SERVER, "metrics-server-3.13.1.values.yaml");
    // Every default is either carried or replaced by percolator's on purpose, said in a note.
    assert_eq!(adapter.keys("not carried"), BTreeSet::new(), "{}", adapter.stderr);
    assert_eq!(metrics_server.keys("not carried"), BTreeSet::new(), "{}", metrics_server.stderr);
    let notes: BTreeSet<String> = [
        "logLevel",
        "priorityClassName",
        "replicas",
        "podSecurityContext",
        "securityContext",
        "resources",
        "livenessProbe",
        "readinessProbe",
        "rules.default",
        "rules",
        "tls.enable",
        "strategy",
    ]
    .map(String::from)
    .into();
    assert_eq!(adapter.keys("note"), notes, "{}", adapter.stderr);
    assert!(adapter.why("tls.enable", "note").contains("skip TLS verification"), "{}", adapter.stderr);
    let notes: BTreeSet<String> = [
        "replicas",
        "securityContext",
        "resources",
        "livenessProbe",
        "readinessProbe",
        "tls.type",
        "defaultArgs[--cert-dir]",
        "defaultArgs[--metric-resolution]",
    ]
    .map(String::from)
    .into();
    assert_eq!(metrics_server.keys("note"), notes, "{}", metrics_server.stderr);
    assert!(
        metrics_server
            .why("defaultArgs[--metric-resolution]", "note")
            .starts_with("carried as --cache-ttl=15s"),
        "{}",
        metrics_server.stderr
    );

    let (adapter_values, metrics_server_values) = (adapter.values(), metrics_server.values());
    assert!(adapter.stdout.starts_with(
        "# percolator's chart values, converted by scripts/convert-values.py from prometheus-adapter's chart 5.3.0\n"
    ));
    // The adapter's rules.default is true and percolator's false: written out, with the API.
    assert_eq!(
        adapter_values,
        json!({
            "prometheus": {"url": "http://prometheus.default.svc", "port": 9090},
            "customMetrics": {"enabled": true},
            "rules": {"default": true},
            "metricsRelistInterval": "1m",
        })
    );
    assert_eq!(metrics_server_values, json!({"resourceMetrics": {"enabled": true}}));
    mk_validate(&adapter_values, "the adapter's defaults");
    mk_validate(&metrics_server_values, "metrics-server's defaults");

    let renders = mk_render_all(&[(&adapter_values, "monitoring"), (&metrics_server_values, "kube-system")]);
    let everything: Vec<Value> = renders.iter().flatten().cloned().collect();
    manifests::kubernetes_validate(&everything, "converted anchor defaults");

    // prometheus-adapter: the same six default rules, APIServices, Prometheus and relist.
    let theirs = mk_anchor_rendering("prometheus-adapter-5.3.0.values", &json!({}));
    let ours = &renders[0];
    let (text, config) = config_of(ours, "percolator-adapter-config");
    assert_eq!(config, config_of(&theirs, "prometheus-adapter").1, "the adapter's default rules");
    assert_eq!(config["rules"].as_array().unwrap().len(), 6);
    percolator::testing::AdapterConfig::from_yaml(&text, "default rules")
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!(metric_apis(&theirs), BTreeSet::from(["v1beta1.custom.metrics.k8s.io".to_owned()]));
    assert_eq!(metric_apis(ours), percolator_apis(&metric_apis(&theirs)));
    assert_flags_carried(&theirs, ours, &["secure-port", "v", "config", "cert-dir"], "adapter defaults");
    let flags = parse_flags(ours, "adapter defaults");
    assert_eq!(flags.prometheus.prometheus_url.as_str(), "http://prometheus.default.svc:9090/");
    assert_eq!(flags.adapter.metrics_relist_interval, Duration::from_secs(60));
    let file = percolator::config::QueryFile::from_yaml(
        &config_of(ours, "percolator-config").0,
        "adapter defaults",
        &percolator::config_check(),
    )
    .unwrap();
    // config declares no metric: its defaults yield to a rule of the same name (a declared one
    // would stop the start).
    assert!(!file.declares.custom_metrics && !file.declares.external_metrics);

    // metrics-server: metrics.k8s.io, the kubelet flags, --metric-resolution as --cache-ttl.
    let theirs = mk_anchor_rendering("metrics-server-3.13.1.values", &json!({}));
    let ours = &renders[1];
    assert_eq!(metric_apis(&theirs), BTreeSet::from(["v1beta1.metrics.k8s.io".to_owned()]));
    assert_eq!(metric_apis(ours), metric_apis(&theirs));
    assert_flags_carried(&theirs, ours, &["cert-dir"], "metrics-server defaults");
    let flags = parse_flags(ours, "metrics-server defaults");
    assert_eq!(flags.cache.cache_ttl, Duration::from_secs(15));
    assert!(flags.metric_apis.enable_resource_metrics);
    assert!(flags.kubelet.kubelet_use_node_status_port);
    assert_eq!(flags.serving.secure_port, 10250);
}

#[test]
fn the_adapter_override_keeps_the_operators_settings() {
    let run = mk_convert_fixture(ADAPTER, "prometheus-adapter.override.yaml");
    assert_eq!(
        run.keys("not carried"),
        ["image.repository", "image.tag", "extraArguments[--tls-cipher-suites]"].map(String::from).into(),
        "{}",
        run.stderr
    );
    assert!(run.why("image.repository", "not carried").contains("ghcr.io/une-tasse-de/percolator"));
    assert!(run.stdout.contains(
        "# Not carried (the converter's report says why): image.repository, image.tag, extraArguments[--tls-cipher-suites].\n"
    ));
    let values = run.values();
    mk_validate(&values, "the adapter override");
    // The private registry is not carried: percolator's own image.
    assert!(values.get("image").is_none(), "{values}");
    let ours = mk_render_all(&[(&values, "monitoring")]).remove(0);
    manifests::kubernetes_validate(&ours, "converted adapter override");
    let theirs =
        mk_anchor_rendering("prometheus-adapter.override", &yaml_file("prometheus-adapter.override.yaml"));

    // The rules, as the adapter's chart writes them, and the APIServices it registers for them.
    let (text, config) = config_of(&ours, "percolator-adapter-config");
    assert_eq!(config, config_of(&theirs, "prometheus-adapter").1, "the adapter configuration");
    let loaded = percolator::testing::AdapterConfig::from_yaml(&text, "override")
        .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert_eq!((loaded.rules.len(), loaded.external_rules.len()), (1, 1));
    assert!(loaded.resource_rules.is_some());
    assert_eq!(metric_apis(&theirs).len(), 3);
    assert_eq!(metric_apis(&ours), percolator_apis(&metric_apis(&theirs)));
    let file = percolator::config::QueryFile::from_yaml(
        &config_of(&ours, "percolator-config").0,
        "override",
        &percolator::config_check(),
    )
    .unwrap();
    assert!(!file.declares.custom_metrics && !file.declares.external_metrics);

    // The pod.
    assert_same_pod(&theirs, &ours, "adapter override");
    let (our_pod, their_pod) = (pod(&ours), pod(&theirs));
    assert_eq!(our_pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"], "true");
    assert_eq!(
        their_pod["metadata"]["annotations"]["cluster-autoscaler.kubernetes.io/safe-to-evict"],
        "true"
    );
    // customLabels are on every object and the pods, as the adapter's chart puts them.
    assert_eq!(our_pod["metadata"]["labels"]["team"], their_pod["metadata"]["labels"]["team"]);
    assert_eq!(find(&ours, "Service", "percolator")["metadata"]["labels"]["team"], "platform");
    assert_eq!(
        find(&ours, "PodDisruptionBudget", "percolator")["spec"]["maxUnavailable"],
        find(&theirs, "PodDisruptionBudget", "prometheus-adapter")["spec"]["maxUnavailable"]
    );

    // The certificates: cert-manager's, with the adapter's durations.
    for (our, their) in
        [("percolator-serving", "prometheus-adapter-cert"), ("percolator-ca", "prometheus-adapter-root-cert")]
    {
        assert_eq!(
            find(&ours, "Certificate", our)["spec"]["duration"],
            find(&theirs, "Certificate", their)["spec"]["duration"],
            "{our}"
        );
    }
    assert_eq!(find(&ours, "Certificate", "percolator-serving")["spec"]["duration"], "2160h0m0s");

    // The flags: the Prometheus URL, the relist, --v, --tls-min-version, --metrics-max-age and the
    // header as the adapter runs with them; not the cipher suites.
    assert_flags_carried(
        &theirs,
        &ours,
        &["secure-port", "config", "cert-dir", "tls-cert-file", "tls-private-key-file"],
        "adapter override",
    );
    let flags = parse_flags(&ours, "adapter override");
    assert_eq!(
        flags.prometheus.prometheus_url.as_str(),
        "http://kube-prometheus-stack-prometheus.monitoring.svc:9090/"
    );
    assert_eq!(flags.verbosity, 3);
    assert_eq!(flags.serving.tls_min_version, "VersionTLS13");
    assert_eq!(flags.adapter.metrics_relist_interval, Duration::from_secs(120));
    assert_eq!(flags.adapter.metrics_max_age, Some(Duration::from_secs(300)));
    let headers: Vec<&str> = flags.prometheus.prometheus_headers.iter().map(|h| h.name.as_str()).collect();
    assert_eq!(headers, ["x-scope-orgid"]);
    assert!(flags.metric_apis.enable_custom_metrics && flags.metric_apis.enable_external_metrics);
    assert!(flags.metric_apis.enable_resource_metrics);
    assert_eq!(flags.kubelet.resource_source, Some(percolator::config::ResourceSource::Prometheus));
}

#[test]
fn the_metrics_server_override_keeps_the_operators_settings() {
    let run = mk_convert_fixture(METRICS_SERVER, "metrics-server.override.yaml");
    assert_eq!(
        run.keys("not carried"),
        ["image.repository", "image.tag", "addonResizer.enabled", "addonResizer.nanny.extraMemory"]
            .map(String::from)
            .into(),
        "{}",
        run.stderr
    );
    assert!(run.why("metrics.enabled", "note").contains("/metrics"));
    let values = run.values();
    mk_validate(&values, "the metrics-server override");
    let ours = mk_render_all(&[(&values, "kube-system")]).remove(0);
    manifests::kubernetes_validate(&ours, "converted metrics-server override");
    let theirs = mk_anchor_rendering("metrics-server.override", &yaml_file("metrics-server.override.yaml"));

    // metrics.k8s.io, its CA injected by cert-manager and verified.
    assert_eq!(metric_apis(&ours), metric_apis(&theirs));
    let (our_api, their_api) = (
        find(&ours, "APIService", "v1beta1.metrics.k8s.io"),
        find(&theirs, "APIService", "v1beta1.metrics.k8s.io"),
    );
    for api in [our_api, their_api] {
        assert!(api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"].is_string(), "{api}");
        assert_ne!(api["spec"]["insecureSkipTLSVerify"], true, "{api}");
    }
    for field in ["duration", "renewBefore"] {
        assert_eq!(
            find(&ours, "Certificate", "percolator-serving")["spec"][field],
            find(&theirs, "Certificate", "metrics-server")["spec"][field],
            "{field}"
        );
    }

    // The pod: on the node's network at port 4443, placed and sized as metrics-server's.
    assert_same_pod(&theirs, &ours, "metrics-server override");
    assert_eq!(pod(&ours)["spec"]["hostNetwork"], true);
    assert_eq!(pod(&ours)["spec"]["dnsPolicy"], "ClusterFirstWithHostNet");
    assert_eq!(
        container(&ours)["ports"][0]["containerPort"],
        container(&theirs)["ports"][0]["containerPort"]
    );
    assert_eq!(pod(&ours)["metadata"]["annotations"], pod(&theirs)["metadata"]["annotations"]);
    assert_eq!(deployment(&ours)["spec"]["strategy"], deployment(&theirs)["spec"]["strategy"]);
    assert_eq!(
        find(&ours, "PodDisruptionBudget", "percolator")["spec"]["minAvailable"],
        find(&theirs, "PodDisruptionBudget", "metrics-server")["spec"]["minAvailable"]
    );
    // The ServiceMonitor kube-prometheus-stack picks.
    let (our_monitor, their_monitor) =
        (find(&ours, "ServiceMonitor", "percolator"), find(&theirs, "ServiceMonitor", "metrics-server"));
    assert_eq!(our_monitor["metadata"]["labels"]["release"], their_monitor["metadata"]["labels"]["release"]);
    assert_eq!(
        our_monitor["spec"]["endpoints"][0]["interval"],
        their_monitor["spec"]["endpoints"][0]["interval"]
    );

    // The flags metrics-server runs with: the kubelet's, --v, --secure-port, --metric-resolution
    // as --cache-ttl; /metrics always allowed (with the health paths percolator allows).
    assert_flags_carried(
        &theirs,
        &ours,
        &["cert-dir", "tls-cert-file", "tls-private-key-file", "authorization-always-allow-paths"],
        "metrics-server override",
    );
    let flags = parse_flags(&ours, "metrics-server override");
    assert!(flags.kubelet.kubelet_insecure_tls && flags.kubelet.kubelet_use_node_status_port);
    assert_eq!(flags.kubelet.kubelet_preferred_address_types, ["InternalIP", "Hostname", "ExternalIP"]);
    assert_eq!(flags.cache.cache_ttl, Duration::from_secs(30));
    assert_eq!(flags.verbosity, 2);
    assert_eq!(flags.serving.secure_port, 4443);
    assert_eq!(flags_of(&theirs)["authorization-always-allow-paths"].as_deref(), Some("/metrics"));
    assert_eq!(flags.auth.authorization_always_allow_paths, ["/healthz", "/readyz", "/livez", "/metrics"]);
}

#[test]
fn strict_fails_on_a_key_not_carried() {
    let out = common::mk_dir("convert-values-strict").join("out.yaml");
    let override_ = fixture("prometheus-adapter.override.yaml");
    let run = mk_convert(&[
        "--from",
        ADAPTER,
        "--strict",
        "-o",
        out.to_str().unwrap(),
        override_.to_str().unwrap(),
    ]);
    assert_eq!(run.code, 1, "{}", run.stderr);
    assert!(
        run.stderr.ends_with("error: --strict: 3 key(s) not carried; nothing written\n"),
        "{}",
        run.stderr
    );
    assert_eq!(run.keys("not carried").len(), 3);
    assert!(!out.exists(), "--strict wrote {}", out.display());
    // Without a key not carried (notes are no error), it writes the values.
    let defaults = fixture("prometheus-adapter-5.3.0.values.yaml");
    let run =
        mk_convert(&["--from", ADAPTER, "--strict", "-o", out.to_str().unwrap(), defaults.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert!(!run.keys("note").is_empty());
    let written: Value = serde_saphyr::from_str(&std::fs::read_to_string(&out).unwrap()).unwrap();
    assert_eq!(written["rules"]["default"], true);
}

#[test]
fn malformed_files_are_named() {
    let cases = [
        ("not-yaml.yaml", "prometheus:\n  url: [unclosed\n", "not YAML (line 3, column 1): "),
        ("list.yaml", "- replicas: 2\n", "expected a map of values at the top, got a list"),
        ("scalar.yaml", "replicas\n", "expected a map of values at the top, got a string"),
    ];
    for (name, text, message) in cases {
        let file = mk_file(name, text);
        let run = mk_convert(&["--from", METRICS_SERVER, file.to_str().unwrap()]);
        assert_eq!(run.code, 1, "{name}: {}", run.stderr);
        assert!(
            run.stderr.starts_with(&format!("error: {}: {message}", file.display())),
            "{name}: {}",
            run.stderr
        );
        assert!(run.stdout.is_empty(), "{name}: {}", run.stdout);
    }
    let missing = common::mk_dir("convert-values-missing").join("missing.yaml");
    let run = mk_convert(&["--from", METRICS_SERVER, missing.to_str().unwrap()]);
    assert_eq!(
        (run.code, run.stderr.as_str()),
        (1, format!("error: {}: cannot read: No such file or directory\n", missing.display()).as_str())
    );
    // An empty file is no values, as for helm.
    let empty = mk_file("empty.yaml", "# nothing set\n");
    assert_eq!(
        mk_convert(&["--from", METRICS_SERVER, empty.to_str().unwrap()]).values()["resourceMetrics"]["enabled"],
        true
    );
    // A bad command line.
    let run = mk_convert(&["--from", "keda", empty.to_str().unwrap()]);
    assert_eq!(run.code, 2);
    assert!(run.stderr.contains("invalid choice: 'keda'"), "{}", run.stderr);
}

#[test]
fn unknown_keys_and_wrong_types_are_reported() {
    let file = mk_file(
        "unknown.yaml",
        "replicaCount: 3\nprometheus:\n  url: http://thanos-query.monitoring.svc\n  bogus: 1\nrules:\n  default: yes please\n\
         extraArguments: --v=2\nhostNetwork: true\ntolerations:\n  - {key: a, operator: Exists}\n",
    );
    let run = mk_convert(&["--from", ADAPTER, file.to_str().unwrap()]);
    let expected: BTreeSet<String> =
        ["replicaCount", "prometheus.bogus", "rules.default", "extraArguments", "hostNetwork"]
            .map(String::from)
            .into();
    assert_eq!(run.keys("not carried"), expected, "{}", run.stderr);
    assert_eq!(run.why("replicaCount", "not carried"), "not a value of prometheus-adapter's chart 5.3.0");
    assert_eq!(run.why("rules.default", "not carried"), "expected a boolean, got a string");
    assert_eq!(run.why("extraArguments", "not carried"), "expected a list, got a string");
    assert_eq!(run.why("hostNetwork", "not carried"), "expected a map, got a boolean");
    // The rest is carried; a refused value leaves the anchor's default in force.
    let values = run.values();
    assert_eq!(values["prometheus"]["url"], "http://thanos-query.monitoring.svc");
    assert_eq!(values["tolerations"], json!([{"key": "a", "operator": "Exists"}]));
    assert_eq!(values["rules"]["default"], true);
    assert!(values.get("replicaCount").is_none() && values.get("logLevel").is_none(), "{values}");
    let run = mk_convert(&["--from", ADAPTER, "--strict", file.to_str().unwrap()]);
    assert_eq!(run.code, 1);
    assert!(run.stdout.is_empty());
    // A metrics-server flag percolator does not have is named by its list and flag.
    let file = mk_file(
        "flags.yaml",
        "args:\n  - --kubelet-client-certificate=/c.pem\n  - --node-selector\n  - role=infra\n  - --kubelet-port=10255\n",
    );
    let run = mk_convert(&["--from", METRICS_SERVER, file.to_str().unwrap()]);
    assert_eq!(
        run.keys("not carried"),
        ["args[--kubelet-client-certificate]", "args[--node-selector]"].map(String::from).into(),
        "{}",
        run.stderr
    );
    assert_eq!(run.values()["args"], json!(["--kubelet-port=10255"]));
    // A null port, a flag without its value, and a Secret's certificate whose CA the
    // APIServices would not have: each named, none carried half-way.
    let file = mk_file("values-missing.yaml", "listenPort: null\nhostNetwork:\n  enabled: true\n");
    let run = mk_convert(&["--from", ADAPTER, file.to_str().unwrap()]);
    assert_eq!(run.code, 0, "{}", run.stderr);
    assert_eq!(run.why("listenPort", "not carried"), "a port number (1-65535), got None");
    assert!(run.values().get("containerPort").is_none(), "{}", run.stdout);
    let file = mk_file(
        "no-ca.yaml",
        "args:\n  - --metric-resolution\ntls:\n  type: existingSecret\n  existingSecret:\n    name: my-tls\n\
         apiService:\n  insecureSkipTLSVerify: false\n",
    );
    let run = mk_convert(&["--from", METRICS_SERVER, file.to_str().unwrap()]);
    assert_eq!(
        run.keys("not carried"),
        ["args[--metric-resolution]", "tls.existingSecret.lookup"].map(String::from).into(),
        "{}",
        run.stderr
    );
    assert!(!run.stderr.contains("--cache-ttl=None"), "{}", run.stderr);
    assert!(run.values().get("args").is_none_or(|a| !a.to_string().contains("cache-ttl")), "{}", run.stdout);
}

#[test]
fn several_files_merge_as_helm_merges_them() {
    let first = [
        "logLevel: 6",
        "prometheus:",
        "  url: http://mimir.monitoring.svc",
        "  port: 8080",
        "  path: /prometheus",
        "rules:",
        "  default: false",
        "  external:",
        "    - seriesQuery: '{__name__=\"queue_depth\",namespace!=\"\"}'",
        "      resources: {overrides: {namespace: {resource: namespace}}}",
        "      name: {as: queue_depth}",
        "      metricsQuery: max(<<.Series>>{<<.LabelMatchers>>}) by (queue)",
    ];
    let first = mk_file("first.yaml", &(first.join("\n") + "\n"));
    let second = mk_file("second.yaml", "logLevel: null\nprometheus:\n  port: 9009\nlivenessProbe: null\n");
    let [first, second] = [first.to_str().unwrap(), second.to_str().unwrap()];
    let positional = mk_convert(&["--from", ADAPTER, first, second]);
    let flagged = mk_convert(&["--from", ADAPTER, "-f", first, "-f", second]);
    assert_eq!(positional.stdout, flagged.stdout);
    let values = positional.values();
    // The later file wins key by key; null removes a value (logLevel: percolator's default).
    assert_eq!(
        values["prometheus"],
        json!({"url": "http://mimir.monitoring.svc", "port": 9009, "path": "/prometheus"})
    );
    assert!(values.get("logLevel").is_none(), "{values}");
    assert!(positional.keys("note").contains("logLevel"));
    // null removes the chart's default: no liveness probe, as in the adapter's rendering.
    assert_eq!(values["livenessProbe"], Value::Null);
    assert!(values.as_object().unwrap().contains_key("livenessProbe"));
    assert_eq!(positional.why("livenessProbe", "note"), "carried as null: the container has no such probe");
    assert_eq!(values["rules"]["default"], false);
    assert_eq!(values["externalMetrics"]["enabled"], true);
    assert!(values.get("customMetrics").is_none(), "no rules: the adapter registers no custom API: {values}");
    assert!(positional.stdout.contains(&format!("# values: {first}, {second}.\n")));
    let mixed = mk_convert(&["--from", ADAPTER, "-f", first, second]);
    assert_eq!(mixed.code, 2, "{}", mixed.stderr);
}

#[test]
fn the_tables_agree_with_the_anchors_percolator_and_the_doc() {
    let tables = mk_tables();
    // Each anchor's table is its values.yaml, key by key with its default.
    for (anchor, file) in [
        (ADAPTER, "prometheus-adapter-5.3.0.values.yaml"),
        (METRICS_SERVER, "metrics-server-3.13.1.values.yaml"),
    ] {
        let keys = tables["keys"][anchor].as_array().unwrap();
        let free: BTreeSet<&str> =
            keys.iter().filter(|k| k["free"] == true).map(|k| k["path"].as_str().unwrap()).collect();
        let mut file_leaves = BTreeMap::new();
        fn walk(node: &Value, prefix: &str, free: &BTreeSet<&str>, out: &mut BTreeMap<String, Value>) {
            for (key, value) in node.as_object().unwrap() {
                let path = if prefix.is_empty() { key.clone() } else { format!("{prefix}.{key}") };
                if value.is_object() && !free.contains(path.as_str()) {
                    walk(value, &path, free, out);
                } else {
                    out.insert(path, value.clone());
                }
            }
        }
        walk(&yaml_file(file), "", &free, &mut file_leaves);
        let table_leaves: BTreeMap<String, Value> = keys
            .iter()
            .filter(|k| k["inValuesFile"] == true)
            .map(|k| (k["path"].as_str().unwrap().to_owned(), k["default"].clone()))
            .collect();
        assert_eq!(table_leaves, file_leaves, "{anchor}: the converter's table and {file}");
    }

    // The flags it carries under their name are percolator's; those its chart sets itself it
    // never carries into args (percolator refuses a flag given twice).
    let command = percolator::config::Args::command();
    let longs: BTreeSet<String> =
        command.get_arguments().filter_map(|a| a.get_long()).map(String::from).collect();
    let chart_values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap()).unwrap();
    for (name, flag) in tables["flags"].as_object().unwrap() {
        let target = flag["target"].as_str().unwrap();
        match flag["action"].as_str().unwrap() {
            "args" => assert!(
                longs.contains(target.trim_start_matches("--")),
                "--{name} is carried as {target}, which percolator does not have"
            ),
            "value" => {
                // A value of percolator's chart; the chart's flag of the same name, if any, is
                // percolator's.
                let pointer = format!("/{}", target.replace('.', "/"));
                assert!(
                    chart_values.pointer(&pointer).is_some(),
                    "--{name} becomes {target}, not in values.yaml"
                );
                assert!(name == "prometheus-auth-incluster" || longs.contains(name), "--{name}");
            }
            _ => {}
        }
    }
    let defaults = mk_render_all(&[(
        &json!({"rules": {"default": true}, "customMetrics": {"enabled": true}}),
        "percolator",
    )])
    .remove(0);
    let default_args: BTreeSet<String> = chart_values["defaultArgs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().trim_start_matches('-').split('=').next().unwrap().to_owned())
        .collect();
    let chart_set: Vec<String> =
        flags_of(&defaults).into_keys().filter(|name| !default_args.contains(name)).collect();
    assert!(
        chart_set.contains(&"secure-port".to_owned()) && chart_set.contains(&"prometheus-url".to_owned()),
        "{chart_set:?}"
    );
    for name in &chart_set {
        assert_ne!(tables["flags"][name]["action"], "args", "--{name} is set by percolator's chart");
    }

    // docs/migrating-values.md embeds the tables as generated.
    let run = mk_convert(&["--tables", "markdown"]);
    let doc = std::fs::read_to_string(manifests::repo_path("docs/migrating-values.md")).unwrap();
    for table in run.stdout.split("\n\n") {
        assert!(
            doc.contains(table.trim_end()),
            "docs/migrating-values.md lacks the table:\n{table}\n(regenerate: scripts/convert-values.py --tables markdown)"
        );
    }
}
