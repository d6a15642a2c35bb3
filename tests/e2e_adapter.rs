//! `--adapter-config`: a prometheus-adapter configuration file, written the way adapter users
//! write it, against the simulator and a real Prometheus: its `rules` and `externalRules`
//! discovered through Prometheus' series API and served by `custom.metrics.k8s.io` and
//! `external.metrics.k8s.io` with values against the simulator's truth, the PromQL that ran (Prometheus' query log) being the template's
//! expansion with escaped matchers; reload without restart; a bad file or a name declared twice
//! stops the start with the rule, field and construct named. Its `resourceRules` serve
//! `metrics.k8s.io` from Prometheus without `--resource-source` (as in the adapter), unless
//! `--resource-source=kubelet` is given.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{
    Env, Options, assert_close, assert_usage_close, configmap_write, kubelet_fetches, launch, mk_dir,
    mk_percolator, percolator_command, q, running_pods,
};
use serde_json::Value;

const EM: &str = "/apis/external.metrics.k8s.io/v1beta1";

/// An adapter user's rules: the walkthrough's per-pod request rate (`_total` →
/// `_per_second`, the name of one of percolator's default custom metrics, which yields it), and
/// an external rule summing every namespaced request counter by status code.
const ADAPTER: &str = include_str!("fixtures/adapter-config/rules.yaml");

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

fn sum(list: &Value) -> f64 {
    list["items"].as_array().unwrap().iter().map(|i| q(&i["value"])).sum()
}

/// The served external metric names.
async fn names(env: &Env) -> Vec<String> {
    let discovery = env.get_json(EM).await;
    discovery["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test(flavor = "multi_thread")]
async fn rules_and_external_rules_serve_the_truth_through_the_templates_expansion() {
    let config_dir = mk_dir("adapter-config");
    configmap_write(&config_dir, 1, ADAPTER);
    let env = Env::start(
        "adapter",
        Options {
            extra_args: vec![
                "--enable-external-metrics".into(),
                "--enable-custom-metrics".into(),
                "--adapter-config".into(),
                config_dir.join("config.yaml").display().to_string(),
                "--metrics-relist-interval".into(),
                "2s".into(),
            ],
            ..Options::default()
        },
    )
    .await;
    let served = names(&env).await;
    assert!(served.contains(&"http_requests_rate".to_owned()), "{served:?}");
    assert!(served.contains(&"cafe_brews_per_minute".to_owned()), "the own metrics stay: {served:?}");

    let truth = env.truth().await;
    let running = |ns: &str| -> Vec<Value> { running_pods(&truth, ns).into_iter().cloned().collect() };
    for ns in ["shop", "api"] {
        let requests: f64 = running(ns).iter().filter_map(|p| p["requestsPerSecond"].as_f64()).sum();
        let errors: f64 = running(ns).iter().filter_map(|p| p["errorsPerSecond"].as_f64()).sum();
        let list = env.get_json(&format!("{EM}/namespaces/{ns}/http_requests_rate")).await;
        assert_eq!(list["kind"], "ExternalMetricValueList");
        let item = &list["items"][0];
        assert_eq!(item["metricName"], "http_requests_rate");
        assert!(item.get("window").is_none(), "the adapter writes no window: {item}");
        assert!(item["metricLabels"].get("code").is_some(), "{item}");
        assert_close(sum(&list), requests, 0.02, &format!("{ns}: all codes"));
        let path =
            format!("{EM}/namespaces/{ns}/http_requests_rate?labelSelector={}", enc("code in (500,503)"));
        let list = env.get_json(&path).await;
        assert_close(sum(&list), errors, 0.02, &format!("{ns}: 5xx"));
    }
    // What ran is the template's expansion: the selector's matchers, then the namespace's.
    let queries = env.prometheus.queries();
    for expected in [
        r#"sum by (code) (rate(http_requests_total{namespace="shop"}[1m]))"#,
        r#"sum by (code) (rate(http_requests_total{code=~"500|503",namespace="api"}[1m]))"#,
    ] {
        assert!(queries.iter().any(|q| q == expected), "{expected} not in {queries:#?}");
    }
    // The rules: per pod (pods picked from the inventory, no regex of pod names in the query)
    // and per namespace, against the truth; no window, as the adapter writes its values.
    let cm = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop";
    let list = env.get_json(&format!("{cm}/pods/*/http_requests_per_second")).await;
    let with_http: Vec<Value> =
        running("shop").into_iter().filter(|p| p["requestsPerSecond"].is_number()).collect();
    assert_eq!(list["items"].as_array().unwrap().len(), with_http.len(), "{list}");
    for item in list["items"].as_array().unwrap() {
        let name = item["describedObject"]["name"].as_str().unwrap();
        let pod = with_http.iter().find(|p| p["name"] == name).unwrap();
        assert_eq!(item["describedObject"]["kind"], "Pod");
        assert!(item.get("windowSeconds").is_none(), "{item}");
        assert_close(q(&item["value"]), pod["requestsPerSecond"].as_f64().unwrap(), 0.02, name);
    }
    let web =
        env.get_json(&format!("{cm}/pods/*/http_requests_per_second?labelSelector={}", enc("app=web"))).await;
    let web_truth = with_http.iter().filter(|p| p["labels"]["app"] == "web").count();
    assert_eq!(web["items"].as_array().unwrap().len(), web_truth, "{web}");
    let namespace = env.get_json(&format!("{cm}/metrics/http_requests_per_second")).await;
    let total: f64 = with_http.iter().map(|p| p["requestsPerSecond"].as_f64().unwrap()).sum();
    assert_eq!(namespace["items"][0]["describedObject"]["kind"], "Namespace");
    assert_close(q(&namespace["items"][0]["value"]), total, 0.02, "namespace");
    let queries = env.prometheus.queries();
    for expected in [
        r#"sum(rate(http_requests_total{namespace="shop"}[1m])) by (pod)"#,
        r#"sum(rate(http_requests_total{namespace="shop"}[1m])) by (namespace)"#,
    ] {
        assert!(queries.iter().any(|q| q == expected), "{expected} not in {queries:#?}");
    }
    let (code, _, body) = env.get(&format!("{cm}/services/web/http_requests_per_second"), None).await;
    assert_eq!(code, 404, "the series carry no service label: {body}");

    // A selector Prometheus cannot express is the client's error.
    let (code, _, body) = env
        .get(&format!("{EM}/namespaces/shop/http_requests_rate?labelSelector={}", enc("code>5")), None)
        .await;
    assert_eq!(code, 400, "{body}");

    // An invalid edit is rejected and the last good rules keep serving; a valid one applies.
    configmap_write(&config_dir, 2, &ADAPTER.replace("sum by (code)", "<<range .GroupBySlice>>x<<end>>"));
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(names(&env).await.contains(&"http_requests_rate".to_owned()));
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    assert!(
        log.contains("externalRules[0].metricsQuery") && log.contains("range"),
        "the rejection names the rule, field and action"
    );
    // Counted, per file, as --config's rejections are (the PercolatorConfigReloadFailed alert).
    let (_, _, metrics) = env.get("/metrics", None).await;
    for sample in [
        "percolator_config_reloads_total{file=\"adapter-config\",result=\"failure\"} 1",
        "percolator_config_last_reload_successful{file=\"adapter-config\"} 0",
        "percolator_config_last_reload_successful{file=\"config\"} 1",
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }
    configmap_write(&config_dir, 3, &ADAPTER.replace("_rate", "_per_sec"));
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let served = names(&env).await;
        if served.contains(&"http_requests_per_sec".to_owned())
            && !served.contains(&"http_requests_rate".to_owned())
        {
            break;
        }
        assert!(Instant::now() < deadline, "the reload never applied: {served:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, _, metrics) = env.get("/metrics", None).await;
    for sample in [
        "percolator_config_reloads_total{file=\"adapter-config\",result=\"success\"} 1",
        "percolator_config_last_reload_successful{file=\"adapter-config\"} 1",
    ] {
        assert!(metrics.contains(sample), "{sample} in\n{metrics}");
    }
    let (code, _, _) = env.get(&format!("{EM}/namespaces/shop/http_requests_rate"), None).await;
    assert_eq!(code, 404);
    let list = env.get_json(&format!("{EM}/namespaces/shop/http_requests_per_sec")).await;
    assert!(!list["items"].as_array().unwrap().is_empty());
}

/// Starts percolator against `env`'s cluster and Prometheus with `args`, expecting it to exit
/// at start; returns its stderr.
async fn failed_start(env: &Env, args: &[String]) -> String {
    let mut command = percolator_command(0, &env.dir.join("sim/kubeconfig"), &env.prometheus.url());
    let child = command.arg("--cert-dir").arg(env.dir.join("certs-2")).args(args).spawn().unwrap();
    let output = tokio::time::timeout(Duration::from_secs(30), child.wait_with_output())
        .await
        .expect("percolator exits at start")
        .unwrap();
    assert!(!output.status.success());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_bad_file_or_a_name_declared_twice_stops_the_start() {
    let env = Env::start("adapter-bad", Options::default()).await;
    let dir = mk_dir("adapter-bad-config");
    let bad = dir.join("bad.yaml");
    std::fs::write(&bad, ADAPTER.replace("matches:", "matchs:")).unwrap();
    let stderr = failed_start(&env, &["--adapter-config".into(), bad.display().to_string()]).await;
    assert!(stderr.contains("bad.yaml") && stderr.contains("matchs"), "{stderr}");

    // The adapter's rule names a metric --config declares (a default one it may take).
    let twice = dir.join("twice.yaml");
    std::fs::write(&twice, ADAPTER.replace("http_${1}_rate", "http_${1}_per_second")).unwrap();
    let declared = dir.join("config.yaml");
    std::fs::write(
        &declared,
        "externalMetrics:\n- name: http_requests_per_second\n  query: sum by (namespace) (rate(http_requests_total{SCOPE}[WINDOW]))\n",
    )
    .unwrap();
    let stderr = failed_start(
        &env,
        &[
            "--enable-external-metrics".into(),
            "--config".into(),
            declared.display().to_string(),
            "--adapter-config".into(),
            twice.display().to_string(),
        ],
    )
    .await;
    assert!(
        stderr.contains("http_requests_per_second")
            && stderr.contains("--config")
            && stderr.contains("externalRules[0]"),
        "{stderr}"
    );
}

/// kube-prometheus-style `resourceRules` over cAdvisor's and the kubelet's series.
const RESOURCE_RULES: &str = include_str!("fixtures/adapter-config/resource-rules.yaml");

/// A second percolator against an [`Env`]'s simulator and Prometheus (cheaper than a second
/// `Env`), at the default verbosity; killed when dropped.
struct Beside {
    url: String,
    client: reqwest::Client,
    log: PathBuf,
    _process: tokio::process::Child,
}

impl Beside {
    async fn start(env: &Env, name: &str, args: &[String], vars: &[(&str, &str)]) -> Beside {
        let dir = env.dir.join(name);
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("percolator.log");
        let mut command = percolator_command(0, &env.dir.join("sim/kubeconfig"), &env.prometheus.url());
        command
            .arg("--cert-dir")
            .arg(dir.join("certs"))
            .args(["--cache-ttl", "2s", "--window", "1m"])
            .args(args)
            // The default verbosity (-v=1), whatever the test runner's RUST_LOG.
            .env_remove("RUST_LOG")
            .envs(vars.iter().copied());
        let started = mk_percolator(command, name, &log).await;
        let client = common::mk_percolator_client(&dir.join("certs"));
        let beside = Beside { url: started.url(), client, log, _process: started.child };
        let ready = launch::wait_ready(&beside.client, &beside.url, Duration::from_secs(30)).await;
        assert!(ready, "{name} never became ready");
        beside
    }

    async fn get_json(&self, path: &str) -> Value {
        let response = self.client.get(format!("{}{path}", self.url)).send().await.unwrap();
        let status = response.status();
        let body = response.text().await.unwrap();
        assert!(status.is_success(), "GET {path}: {status} {body}");
        serde_json::from_str(&body).unwrap()
    }
}

/// The logged fields of the first line of `log` whose message `pick` accepts, waiting for it
/// (10 s at most: the log is copied from a pipe).
async fn log_line(log: &Path, pick: impl Fn(&str) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        let found = text
            .lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .find(|v| v["fields"]["message"].as_str().is_some_and(&pick));
        if let Some(line) = found {
            return line["fields"].clone();
        }
        assert!(Instant::now() < deadline, "no such line in {}:\n{text}", log.display());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The start-up line naming the resource source and why.
async fn resource_source_line(log: &Path) -> String {
    let fields = log_line(log, |m| m.starts_with("resource source: ")).await;
    fields["message"].as_str().unwrap().to_owned()
}

/// An adapter user's file unchanged: its `resourceRules` alone make Prometheus the resource
/// source (no `--resource-source`, as in prometheus-adapter); an explicit
/// `--resource-source=kubelet` beside it reads the kubelets and leaves the rules unused. A
/// reload removing the rules falls back to `resourceQueries:` without switching the source.
#[tokio::test(flavor = "multi_thread")]
async fn resource_rules_serve_kubectl_top_from_cadvisor_series() {
    let config_dir = mk_dir("adapter-resource-config");
    configmap_write(&config_dir, 1, RESOURCE_RULES);
    let file = config_dir.join("config.yaml").display().to_string();
    let env = Env::start(
        "adapter-resource",
        Options {
            cadvisor: true,
            extra_args: vec!["--enable-resource-metrics".into(), "--adapter-config".into(), file.clone()],
            ..Options::default()
        },
    )
    .await;
    assert_eq!(
        resource_source_line(&env.stderr_log).await,
        format!(
            "resource source: prometheus (the resourceRules of --adapter-config {file}; --resource-source not given)"
        )
    );
    let truth = env.truth().await;
    let running = running_pods(&truth, "shop");
    let mgv = "/apis/metrics.k8s.io/v1beta1";
    let list = env.get_json(&format!("{mgv}/namespaces/shop/pods")).await;
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), running.len(), "{list}");
    for item in items {
        let name = item["metadata"]["name"].as_str().unwrap();
        let pod = running.iter().find(|p| p["name"] == name).unwrap();
        assert_eq!(item["window"], "1m0s");
        let containers = item["containers"].as_array().unwrap();
        assert_eq!(containers.len(), pod["containers"].as_array().unwrap().len(), "{name}");
        for c in containers {
            let truth =
                pod["containers"].as_array().unwrap().iter().find(|t| t["name"] == c["name"]).unwrap();
            assert_usage_close(&c["usage"], truth, (0.02, 0.001), "container");
        }
    }
    let nodes = env.get_json(&format!("{mgv}/nodes")).await;
    for node in nodes["items"].as_array().unwrap() {
        let name = node["metadata"]["name"].as_str().unwrap();
        let truth = truth["nodes"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap();
        assert_usage_close(&node["usage"], truth, (0.02, 0.05), "node");
    }
    assert_eq!(nodes["items"].as_array().unwrap().len(), truth["nodes"].as_array().unwrap().len());
    // The templates' expansions: the namespace's matcher, grouped by the pod and container
    // labels; the nodes by name, grouped by the node label. No kubelet connection.
    let queries = env.prometheus.queries();
    let expected = "sum by (pod,container) (container_memory_working_set_bytes{namespace=\"shop\",container!=\"\",container!=\"POD\",pod!=\"\"})";
    assert!(queries.iter().any(|q| q == expected), "{expected} not in {queries:#?}");
    assert!(
        queries
            .iter()
            .any(|q| q == "sum by (node) (node_memory_working_set_bytes{node=~\"node-0|node-1|node-2\"})"),
        "{queries:#?}"
    );
    let fetches = kubelet_fetches(&env.sim_stats().await);
    assert_eq!(fetches, 0);

    // The same file with an explicit --resource-source=kubelet: the kubelets serve (their
    // samples' window, the simulator's fetch count), no resourceRules query runs. Its
    // Prometheus headers come from PERCOLATOR_PROMETHEUS_HEADER, one per line.
    let queried_before = env.prometheus.queries().len();
    let beside = Beside::start(
        &env,
        "explicit-kubelet",
        &[
            "--enable-resource-metrics".into(),
            "--resource-source=kubelet".into(),
            "--adapter-config".into(),
            file.clone(),
        ],
        &[("PERCOLATOR_PROMETHEUS_HEADER", "X-Percolator-Test=a,b\nX-Scope-OrgID=tenant-a")],
    )
    .await;
    assert_eq!(
        resource_source_line(&beside.log).await,
        format!(
            "resource source: kubelet (--resource-source=kubelet given explicitly; the resourceRules of --adapter-config {file} are unused)"
        )
    );
    let connection = log_line(&beside.log, |m| m == "Prometheus connection").await;
    assert_eq!(connection["headers"], r#"["x-percolator-test", "x-scope-orgid"]"#, "{connection}");
    let deadline = Instant::now() + Duration::from_secs(60);
    let list = loop {
        let list = beside.get_json(&format!("{mgv}/namespaces/shop/pods")).await;
        if list["items"].as_array().unwrap().len() == running.len() {
            break list;
        }
        assert!(Instant::now() < deadline, "the kubelets never covered the running pods: {list}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    for item in list["items"].as_array().unwrap() {
        let name = item["metadata"]["name"].as_str().unwrap();
        let pod = running.iter().find(|p| p["name"] == name).unwrap();
        // Two kubelet samples a few housekeeping periods (2 s) apart, not the rules' 1m.
        assert_ne!(item["window"], "1m0s", "{item}");
        for c in item["containers"].as_array().unwrap() {
            let truth =
                pod["containers"].as_array().unwrap().iter().find(|t| t["name"] == c["name"]).unwrap();
            assert_usage_close(&c["usage"], truth, (0.02, 0.001), "kubelet");
        }
    }
    let nodes = beside.get_json(&format!("{mgv}/nodes")).await;
    assert_eq!(nodes["items"].as_array().unwrap().len(), truth["nodes"].as_array().unwrap().len());
    assert!(kubelet_fetches(&env.sim_stats().await) > 0, "{}", env.sim_stats().await);
    let queries = env.prometheus.queries();
    let usage_series = ["container_cpu_usage", "container_memory", "node_cpu_usage", "node_memory"];
    let resource_queries: Vec<&String> =
        queries[queried_before..].iter().filter(|q| usage_series.iter().any(|s| q.contains(s))).collect();
    assert!(resource_queries.is_empty(), "{resource_queries:#?}");

    // A reload removing the rules: the first falls back to resourceQueries (the defaults
    // here) and says a restart would read the kubelets; the second notes they were unused.
    configmap_write(&config_dir, 2, "rules: []\n");
    let removed = log_line(&env.stderr_log, |m| m.starts_with("resourceRules removed")).await;
    assert_eq!(
        removed["message"],
        format!(
            "resourceRules removed from --adapter-config {file}: CPU and memory now from the default resourceQueries (no --config); after a restart, the kubelets (--resource-source not given)"
        )
    );
    let unused = log_line(&beside.log, |m| m.starts_with("resourceRules removed")).await;
    assert_eq!(
        unused["message"],
        format!("resourceRules removed from --adapter-config {file}: unused, the resource source is kubelet")
    );
    let default_query = r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD",namespace="shop"}[1m]))"#;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !env.prometheus.queries().iter().any(|q| q == default_query) {
        assert!(Instant::now() < deadline, "the default resourceQueries never ran");
        env.get_json(&format!("{mgv}/namespaces/shop/pods")).await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
