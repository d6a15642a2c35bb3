//! metrics.k8s.io (`--enable-resource-metrics`) against the simulator, in both resource source
//! modes (the kubelets, and Prometheus' cAdvisor series with `--resource-source=prometheus`):
//! real `kubectl top pods` prints the numbers `kubectl get pms` prints for the same pods, the raw
//! objects have exactly metrics-server's fields and values (against the simulator's truth), and
//! one set of samples serves every kind (no extra kubelet fetch; in Prometheus mode, none at all).
//! With Prometheus down in Prometheus mode, lists stay up with a Warning.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::devenv::ProxyFault;
use common::{Env, Options, assert_close, assert_usage_close, kubelet_fetches, q, running_pods, table};
use serde_json::Value;

const MGV: &str = "/apis/metrics.k8s.io/v1beta1";
const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";

/// Where CPU and memory come from.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Kubelet,
    Prometheus,
}

fn options(mode: Mode) -> Options {
    let mut extra_args = vec!["--enable-resource-metrics".to_owned()];
    match mode {
        Mode::Prometheus => extra_args.push("--resource-source=prometheus".to_owned()),
        // On demand only, so the fetches counted are the requests' own.
        Mode::Kubelet => extra_args.push("--idle-after=0s".to_owned()),
    }
    Options { extra_args, cadvisor: mode == Mode::Prometheus, ..Options::default() }
}

/// The sorted keys of a JSON object.
fn keys(v: &Value) -> Vec<&str> {
    let mut keys: Vec<&str> =
        v.as_object().unwrap_or_else(|| panic!("not an object: {v}")).keys().map(String::as_str).collect();
    keys.sort_unstable();
    keys
}
/// `kubectl top pods` rows by pod name: (CPU, MEMORY) as printed.
fn top_rows(out: &str) -> BTreeMap<String, (String, String)> {
    let (header, rows) = table(out);
    let at = |name: &str| {
        header.iter().position(|h| h.starts_with(name)).unwrap_or_else(|| panic!("{name} in {header:?}"))
    };
    let (name, cpu, memory) = (at("NAME"), at("CPU"), at("MEMORY"));
    rows.into_iter().map(|r| (r[name].clone(), (r[cpu].clone(), r[memory].clone()))).collect()
}

/// Waits until every running pod of `namespace` has its PodMetrics (two kubelet samples).
async fn wait_for_pod_metrics(env: &Env, namespace: &str, running: usize) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let list = env.get_json(&format!("{MGV}/namespaces/{namespace}/pods")).await;
        if list["items"].as_array().unwrap().len() == running {
            return list;
        }
        assert!(Instant::now() < deadline, "pod metrics never covered the {running} running pods: {list}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The start-up line that names the resource source and why (logged before "serving", which
/// the harness waits for; the copy from the pipe may lag a little).
async fn resource_source_line(env: &Env) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let log = std::fs::read_to_string(&env.stderr_log).unwrap_or_default();
        let line = log.lines().filter_map(|l| serde_json::from_str::<Value>(l).ok()).find_map(|v| {
            v["fields"]["message"].as_str().filter(|m| m.starts_with("resource source: ")).map(str::to_owned)
        });
        if let Some(line) = line {
            return line;
        }
        assert!(Instant::now() < deadline, "no resource source line in\n{log}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn kubectl_top_prints_what_get_pms_prints_and_the_truth(mode: Mode) {
    let env = Env::start(&format!("resource-{mode:?}").to_lowercase(), options(mode)).await;
    let expected = match mode {
        Mode::Kubelet => "resource source: kubelet (the default)",
        Mode::Prometheus => {
            "resource source: prometheus (--resource-source=prometheus given explicitly; the default resourceQueries (no --config))"
        }
    };
    assert_eq!(resource_source_line(&env).await, expected);
    env.wait_for_cpu(Some("shop")).await;
    let truth = env.truth().await;
    let running = running_pods(&truth, "shop");
    let list = wait_for_pod_metrics(&env, "shop", running.len()).await;

    // The raw list, field by field as metrics-server writes it (k8s.io/metrics v1beta1 types
    // through the generic API server: list items without kind and apiVersion, list metadata
    // empty, object metadata with name, namespace, creationTimestamp and labels only), with
    // values against the truth.
    assert_eq!(keys(&list), ["apiVersion", "items", "kind", "metadata"]);
    assert_eq!(list["kind"], "PodMetricsList");
    assert_eq!(list["apiVersion"], "metrics.k8s.io/v1beta1");
    assert_eq!(list["metadata"], serde_json::json!({}));
    // The window is the time between the two samples the rate is made of.
    let window_ok = |window: &str| match mode {
        // Two kubelet samples a whole number of housekeeping periods (2 s) apart: one period,
        // or a few when a fetch came late under load (metrics-server reports the actual span).
        Mode::Kubelet => window
            .strip_suffix('s')
            .and_then(|s| s.parse::<u64>().ok())
            .is_some_and(|s| s > 0 && s % 2 == 0 && s <= 10),
        // The rate range of the default resourceQueries.
        Mode::Prometheus => window == "1m0s",
    };
    for item in list["items"].as_array().unwrap() {
        assert_eq!(keys(item), ["containers", "metadata", "timestamp", "window"], "{item}");
        let name = item["metadata"]["name"].as_str().unwrap();
        let pod =
            running.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} is not running"));
        assert_eq!(keys(&item["metadata"]), ["creationTimestamp", "labels", "name", "namespace"], "{name}");
        assert_eq!(item["metadata"]["namespace"], "shop");
        assert_eq!(item["metadata"]["labels"], pod["labels"], "{name}");
        item["metadata"]["creationTimestamp"].as_str().unwrap().parse::<jiff::Timestamp>().unwrap();
        let timestamp: jiff::Timestamp = item["timestamp"].as_str().unwrap().parse().unwrap();
        let age = jiff::Timestamp::now().duration_since(timestamp).as_secs_f64();
        assert!((-1.0..30.0).contains(&age), "{name}: sample taken {age}s ago");
        assert!(window_ok(item["window"].as_str().unwrap()), "{name}: window {}", item["window"]);
        let containers = item["containers"].as_array().unwrap();
        let expected = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), expected.len(), "{name}");
        for c in containers {
            assert_eq!(keys(c), ["name", "usage"]);
            assert_eq!(keys(&c["usage"]), ["cpu", "memory"]);
            let truth = expected.iter().find(|t| t["name"] == c["name"]).unwrap();
            assert_usage_close(&c["usage"], truth, (0.02, 0.001), "container");
            // metrics-server's units: CPU from nanocores (canonical: n, u or m), memory BinarySI.
            let cpu = c["usage"]["cpu"].as_str().unwrap();
            assert!(cpu.ends_with(['n', 'u', 'm']) || cpu.bytes().all(|b| b.is_ascii_digit()), "{cpu}");
            let memory = c["usage"]["memory"].as_str().unwrap();
            assert!(
                memory.ends_with("Ki")
                    || memory.ends_with("Mi")
                    || memory.bytes().all(|b| b.is_ascii_digit()),
                "{memory}"
            );
        }
    }
    let first = list["items"][0]["metadata"]["name"].as_str().unwrap().to_owned();
    let one = env.get_json(&format!("{MGV}/namespaces/shop/pods/{first}")).await;
    assert_eq!(keys(&one), ["apiVersion", "containers", "kind", "metadata", "timestamp", "window"]);
    assert_eq!(
        (one["kind"].as_str(), one["metadata"]["name"].as_str()),
        (Some("PodMetrics"), Some(first.as_str()))
    );
    let (code, _, _) = env.get(&format!("{MGV}/namespaces/shop/pods/no-such-pod"), None).await;
    assert_eq!(code, 404);

    // kubectl top pods prints the numbers kubectl get pms prints, for the same pods. The two
    // reads may straddle a sample; the simulator's rates are constant, so they agree.
    let top = top_rows(&env.kubectl_ok(&["top", "pods", "-n", "shop"]));
    let (header, rows) = table(&env.kubectl_ok(&["get", "pms", "-n", "shop"]));
    let col = |name: &str| header.iter().position(|h| h == name).unwrap();
    let pms: BTreeMap<String, (String, String)> =
        rows.iter().map(|r| (r[0].clone(), (r[col("CPU")].clone(), r[col("MEMORY")].clone()))).collect();
    assert_eq!(top, pms, "kubectl top pods vs kubectl get pms");

    // -l, --containers, --sort-by, -A.
    let web = top_rows(&env.kubectl_ok(&["top", "pods", "-n", "shop", "-l", "app=web"]));
    let web_truth: Vec<&str> =
        running.iter().filter(|p| p["labels"]["app"] == "web").map(|p| p["name"].as_str().unwrap()).collect();
    assert_eq!(web.keys().map(String::as_str).collect::<Vec<_>>(), web_truth);
    let containers = env.kubectl_ok(&["top", "pods", "-n", "shop", "--containers"]);
    let total_containers: usize = running.iter().map(|p| p["containers"].as_array().unwrap().len()).sum();
    assert_eq!(table(&containers).1.len(), total_containers, "{containers}");
    for (sort, column) in [("cpu", 1), ("memory", 2)] {
        let sorted =
            env.kubectl_ok(&["top", "pods", "-n", "shop", &format!("--sort-by={sort}"), "--no-headers"]);
        let values: Vec<f64> = sorted
            .lines()
            .map(|l| {
                let cell = l.split_whitespace().nth(column).unwrap();
                k8s_wire::quantity::parse(cell).unwrap_or_else(|e| panic!("{cell}: {e}"))
            })
            .collect();
        assert!(values.windows(2).all(|w| w[0] >= w[1]), "sorted by {sort}: {sorted}");
    }
    let all = env.kubectl_ok(&["top", "pods", "-A", "--no-headers"]);
    let all_running = truth["pods"].as_array().unwrap().iter().filter(|p| p["phase"] == "Running").count();
    assert_eq!(all.lines().count(), all_running, "{all}");

    // Nodes: every node, its own usage against the truth, metrics-server's fields.
    let nodes = env.get_json(&format!("{MGV}/nodes")).await;
    assert_eq!(nodes["metadata"], serde_json::json!({}));
    let names: Vec<&str> =
        nodes["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
    let truth_nodes: Vec<&str> =
        truth["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, truth_nodes);
    for node in nodes["items"].as_array().unwrap() {
        assert_eq!(keys(node), ["metadata", "timestamp", "usage", "window"], "{node}");
        assert_eq!(keys(&node["metadata"]), ["creationTimestamp", "labels", "name"], "{node}");
        assert!(
            window_ok(node["window"].as_str().unwrap()),
            "{name}: window {}",
            node["window"],
            name = node["metadata"]["name"]
        );
        let name = node["metadata"]["name"].as_str().unwrap();
        let truth = truth["nodes"].as_array().unwrap().iter().find(|n| n["name"] == name).unwrap();
        // Pods started or stopped since the truth was read change it: within 5%.
        assert_usage_close(&node["usage"], truth, (0.02, 0.05), "node");
    }
    let one = env.get_json(&format!("{MGV}/nodes/{}", truth_nodes[0])).await;
    assert_eq!(one["kind"], "NodeMetrics");
    // `kubectl top nodes` also lists the core nodes (for their allocatable), which this
    // harness's kubeconfig (percolator itself, no kube-apiserver in front) does not serve; the
    // Table of the same objects is what it would print beside them.
    let (header, rows) = table(&env.kubectl_ok(&["get", "nodes.metrics.k8s.io"]));
    assert_eq!(header, ["NAME", "CPU", "MEMORY", "WINDOW"]);
    assert_eq!(rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), truth_nodes);

    // CafeBrewStats read the same source: their pods' usage against the truth.
    let cafes = env.get_json(&format!("{GV}/cafebrewstats")).await;
    for item in cafes["items"].as_array().unwrap() {
        let (ns, name) = (&item["metadata"]["namespace"], &item["metadata"]["name"]);
        let cafe = truth["cafes"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| &c["namespace"] == ns && &c["name"] == name)
            .unwrap();
        if cafe["pods"].as_array().unwrap().is_empty() {
            continue;
        }
        assert_usage_close(item, cafe, (0.05, 0.05), "cafe");
    }

    let fetches = kubelet_fetches;
    match mode {
        Mode::Kubelet => {
            // One scrape serves all: the kubelet fetches of PodMetricsSummary and PodMetrics are
            // the same ones (within one cache TTL, a second kind adds no fetch).
            tokio::time::sleep(Duration::from_secs(3)).await;
            let before = fetches(&env.sim_stats().await);
            env.get_json(&format!("{GV}/podmetricssummaries")).await;
            let after_pms = fetches(&env.sim_stats().await);
            env.get_json(&format!("{MGV}/pods")).await;
            env.get_json(&format!("{MGV}/nodes")).await;
            let after_all = fetches(&env.sim_stats().await);
            assert!(after_pms > before, "the cold list fetched the kubelets");
            assert_eq!(after_all, after_pms, "metrics.k8s.io reused the samples PodMetricsSummary took");
        }
        Mode::Prometheus => {
            // No kubelet connection at all, and the namespaced reads ran the default queries
            // scoped to their namespace.
            assert_eq!(fetches(&env.sim_stats().await), 0, "{}", env.sim_stats().await);
            let queries = env.prometheus.queries();
            let scoped = r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD",namespace="shop"}[1m]))"#;
            assert!(queries.iter().any(|q| q == scoped), "{queries:#?}");
            assert!(
                queries.iter().any(|q| q == "sum by (node) (rate(node_cpu_usage_seconds_total[1m]))"),
                "{queries:#?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn kubelet_mode_kubectl_top_prints_what_get_pms_prints_and_the_truth() {
    kubectl_top_prints_what_get_pms_prints_and_the_truth(Mode::Kubelet).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn prometheus_mode_kubectl_top_prints_what_get_pms_prints_and_the_truth() {
    kubectl_top_prints_what_get_pms_prints_and_the_truth(Mode::Prometheus).await;
}

/// The seconds of a Go duration as percolator writes a window (`4s`, `2.5s`, `1m0s`).
fn window_seconds(window: &str) -> f64 {
    let (minutes, seconds) = match window.split_once('m') {
        Some((m, s)) => (m.parse::<f64>().unwrap(), s),
        None => (0.0, window),
    };
    minutes * 60.0
        + seconds.strip_suffix('s').unwrap_or_else(|| panic!("window {window}")).parse::<f64>().unwrap()
}

/// Every CPU rate of a PodMetrics or NodeMetrics list spans at most `max` seconds.
fn assert_windows_within(list: &Value, max: f64) {
    for item in list["items"].as_array().unwrap() {
        let window = window_seconds(item["window"].as_str().unwrap());
        assert!(window > 0.0 && window <= max, "window {window}s over {max}s: {item}");
    }
}

/// The kubelet samples while percolator is idle: once no request has needed kubelet data for
/// `--idle-after`, nothing fetches the kubelets; the first answer after an idle period longer
/// than `--max-rate-window` has no CPU averaged over that period (pods without CPU, a Warning
/// saying when to ask again), and a few seconds later the rates are current again and match
/// the truth; no answer ever has a window over `--max-rate-window`.
#[tokio::test(flavor = "multi_thread")]
async fn after_an_idle_period_cpu_is_current_or_absent_never_a_stale_average() {
    let max_window = 6.0;
    let mut options = options(Mode::Kubelet);
    options.extra_args = vec![
        "--enable-resource-metrics".to_owned(),
        format!("--max-rate-window={max_window}s"),
        "--idle-after=3s".to_owned(),
    ];
    let env = Env::start("resource-idle", options).await;
    env.wait_for_cpu(Some("shop")).await;
    let running = running_pods(&env.truth().await, "shop").len();
    let list = wait_for_pod_metrics(&env, "shop", running).await;
    assert_windows_within(&list, max_window);
    assert_windows_within(&env.get_json(&format!("{MGV}/nodes")).await, max_window);

    // While asked for, the nodes are sampled in the background (every --cache-ttl, 2s): a
    // round starts within the interval, and is seen before --idle-after (3s) has passed since
    // the last request (the margin is for a loaded machine's timers).
    let fetched = kubelet_fetches(&env.sim_stats().await);
    let asked = Instant::now();
    loop {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if kubelet_fetches(&env.sim_stats().await) > fetched {
            break;
        }
        assert!(
            asked.elapsed() < Duration::from_secs(3),
            "no background sample within the sampling interval"
        );
    }

    // Idle: after --idle-after (3s) and the round under way, nothing fetches any more.
    tokio::time::sleep(Duration::from_secs(6)).await;
    let idle = kubelet_fetches(&env.sim_stats().await);
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert_eq!(kubelet_fetches(&env.sim_stats().await), idle, "kubelets fetched while idle");

    // About 10 s since the last sample, more than the largest window: the first answer has no
    // rate for any pod (each pod's pair spans the idle period) and says when to ask again
    // (the answer's TTL, 2s, then a sampling interval, 2s).
    let (status, headers, body) = env.get(&format!("{MGV}/namespaces/shop/pods"), None).await;
    assert_eq!(status, 200, "{body}");
    let first: Value = serde_json::from_str(&body).unwrap();
    assert_windows_within(&first, max_window);
    assert_eq!(first["items"].as_array().unwrap().len(), 0, "a stale average was served: {first}");
    let warnings: Vec<&str> = headers.get_all("warning").iter().map(|w| w.to_str().unwrap()).collect();
    let expected = format!(
        "cpu omitted for {running} pods: their two newest kubelet samples are further apart than \
         --max-rate-window (6s), as on the first request after an idle period; ask again in 4s"
    );
    assert!(warnings.iter().any(|w| w.contains(&expected)), "{warnings:?}");
    // PodMetricsSummary omits the CPU the same way, and keeps the memory.
    let pms = env.get_json(&format!("{GV}/namespaces/shop/podmetricssummaries")).await;
    for item in pms["items"].as_array().unwrap() {
        assert!(item.get("cpu").is_none() && item.get("memory").is_some(), "{item}");
    }

    // Asked again as the Warning says: current rates, from samples within the window, that
    // match the truth.
    let list = wait_for_pod_metrics(&env, "shop", running).await;
    assert_windows_within(&list, max_window);
    let truth = env.truth().await;
    let pods = running_pods(&truth, "shop");
    for item in list["items"].as_array().unwrap() {
        let pod = pods.iter().find(|p| p["name"] == item["metadata"]["name"]).unwrap();
        for c in item["containers"].as_array().unwrap() {
            let t = pod["containers"].as_array().unwrap().iter().find(|t| t["name"] == c["name"]).unwrap();
            assert_close(q(&c["usage"]["cpu"]), t["cpuCores"].as_f64().unwrap(), 0.02, "container cpu");
        }
    }
}

/// In Prometheus mode with Prometheus down, every list still answers (the objects from the
/// inventory, their usage omitted) with a Warning naming Prometheus; discovery is untouched;
/// usage returns when Prometheus does.
#[tokio::test(flavor = "multi_thread")]
async fn prometheus_mode_with_prometheus_down_gives_partial_data_with_a_warning() {
    let env = Env::start(
        "resource-prom-down",
        Options { prometheus_proxy: true, cache_ttl: "1s", ..options(Mode::Prometheus) },
    )
    .await;
    env.wait_for_cpu(Some("shop")).await;
    let running = running_pods(&env.truth().await, "shop").len();
    wait_for_pod_metrics(&env, "shop", running).await;

    env.proxy().set(ProxyFault::Down);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let warning = |headers: &reqwest::header::HeaderMap| -> String {
        headers
            .get_all("warning")
            .iter()
            .map(|v| v.to_str().unwrap().to_owned())
            .collect::<Vec<_>>()
            .join(" | ")
    };
    let (code, headers, body) = env.get(&format!("{GV}/namespaces/shop/podmetricssummaries"), None).await;
    assert_eq!(code, 200, "{body}");
    let pms: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(pms["items"].as_array().unwrap().len(), running, "objects kept: {body}");
    assert!(
        pms["items"].as_array().unwrap().iter().all(|i| i.get("cpu").is_none() && i.get("memory").is_none())
    );
    let text = warning(&headers);
    assert!(text.contains("cpu and memory omitted: resource usage from Prometheus: prometheus"), "{text}");

    let (code, headers, body) = env.get(&format!("{MGV}/namespaces/shop/pods"), None).await;
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(list["items"], serde_json::json!([]), "no usage, no PodMetrics (as metrics-server)");
    assert!(warning(&headers).contains("resource usage from Prometheus"), "{}", warning(&headers));
    let (code, headers, _) = env.get(&format!("{MGV}/nodes"), None).await;
    assert_eq!(code, 200);
    assert!(
        warning(&headers).contains("nodes omitted: resource usage from Prometheus"),
        "{}",
        warning(&headers)
    );

    // Discovery never depends on Prometheus.
    for path in ["/apis", MGV, "/apis/metrics.k8s.io"] {
        let (code, _, body) = env.get(path, None).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    let (code, _, body) =
        env.get("/apis", Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")).await;
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"metrics.k8s.io\""), "{body}");
    let out = env.kubectl(&["top", "pods", "-n", "shop"]);
    assert!(!String::from_utf8_lossy(&out.stderr).contains("Metrics API not available"), "{out:?}");

    // Back: usage returns.
    env.proxy().set(ProxyFault::Pass);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, headers, body) = env.get(&format!("{MGV}/namespaces/shop/pods"), None).await;
        let list: Value = serde_json::from_str(&body).unwrap();
        if list["items"].as_array().unwrap().len() == running && warning(&headers).is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "usage never returned: {body}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_flag_metrics_k8s_io_is_absent() {
    let env = Env::start("resource-off", Options::default()).await;
    let apis = env.get_json("/apis").await;
    assert!(!apis["groups"].as_array().unwrap().iter().any(|g| g["name"] == "metrics.k8s.io"), "{apis}");
    let (code, _, _) = env.get(&format!("{MGV}/pods"), None).await;
    assert_eq!(code, 404);
    let out = env.kubectl(&["top", "pods", "-n", "shop"]);
    assert!(!out.status.success());
}
