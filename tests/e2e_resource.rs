//! metrics.k8s.io (`--enable-resource-metrics`) in kubelet mode against the simulator: real
//! `kubectl top pods|nodes` prints the numbers `kubectl get pms` prints for the same pods, the
//! raw objects have metrics-server's fields and values (against the simulator's truth), and
//! enabling the API adds no kubelet fetch.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Env, Options, assert_close, q, table};
use serde_json::Value;

const MGV: &str = "/apis/metrics.k8s.io/v1beta1";

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

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_top_prints_what_get_pms_prints_and_the_truth() {
    let env = Env::start(
        "resource",
        Options { extra_args: vec!["--enable-resource-metrics".into()], ..Options::default() },
    )
    .await;
    env.wait_for_cpu(Some("shop")).await;
    let truth = env.truth().await;
    let running: Vec<&Value> = truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["namespace"] == "shop" && p["phase"] == "Running")
        .collect();
    let list = wait_for_pod_metrics(&env, "shop", running.len()).await;

    // The raw list: metrics-server's kinds and fields, values against the truth.
    assert_eq!(list["kind"], "PodMetricsList");
    assert_eq!(list["apiVersion"], "metrics.k8s.io/v1beta1");
    for item in list["items"].as_array().unwrap() {
        let name = item["metadata"]["name"].as_str().unwrap();
        let pod =
            running.iter().find(|p| p["name"] == name).unwrap_or_else(|| panic!("{name} is not running"));
        assert_eq!(item["metadata"]["namespace"], "shop");
        assert_eq!(item["metadata"]["labels"], pod["labels"], "{name}");
        assert!(item["metadata"].get("uid").is_none(), "metrics-server sets no uid");
        assert!(item["timestamp"].as_str().unwrap().ends_with('Z'));
        let window = item["window"].as_str().unwrap();
        assert!(window.ends_with('s') && percolator::k8s::duration::parse(window).is_ok(), "{window}");
        let containers = item["containers"].as_array().unwrap();
        let expected = pod["containers"].as_array().unwrap();
        assert_eq!(containers.len(), expected.len(), "{name}");
        for c in containers {
            let truth = expected.iter().find(|t| t["name"] == c["name"]).unwrap();
            assert_close(q(&c["usage"]["cpu"]), truth["cpuCores"].as_f64().unwrap(), 0.02, "container cpu");
            assert_close(
                q(&c["usage"]["memory"]),
                truth["memoryBytes"].as_f64().unwrap(),
                0.001,
                "container memory",
            );
        }
    }
    let first = list["items"][0]["metadata"]["name"].as_str().unwrap().to_owned();
    let one = env.get_json(&format!("{MGV}/namespaces/shop/pods/{first}")).await;
    assert_eq!(
        (one["kind"].as_str(), one["metadata"]["name"].as_str()),
        (Some("PodMetrics"), Some(first.as_str()))
    );
    let (code, _, _) = env.get(&format!("{MGV}/namespaces/shop/pods/no-such-pod"), None).await;
    assert_eq!(code, 404);

    // kubectl top pods prints the numbers kubectl get pms prints, for the same pods. The two
    // reads may straddle a kubelet sample; the simulator's rates are constant, so they agree.
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
    let sorted = env.kubectl_ok(&["top", "pods", "-n", "shop", "--sort-by=cpu", "--no-headers"]);
    let millis: Vec<u64> = sorted
        .lines()
        .map(|l| l.split_whitespace().nth(1).unwrap().trim_end_matches('m').parse().unwrap())
        .collect();
    assert!(millis.windows(2).all(|w| w[0] >= w[1]), "sorted by cpu: {sorted}");
    let all = env.kubectl_ok(&["top", "pods", "-A", "--no-headers"]);
    assert!(all.lines().count() > running.len(), "{all}");

    // Nodes: every node with its own series, with its labels; kubectl top nodes lists them.
    let nodes = env.get_json(&format!("{MGV}/nodes")).await;
    let names: Vec<&str> =
        nodes["items"].as_array().unwrap().iter().map(|n| n["metadata"]["name"].as_str().unwrap()).collect();
    let truth_nodes: Vec<&str> =
        truth["nodes"].as_array().unwrap().iter().map(|n| n["name"].as_str().unwrap()).collect();
    assert_eq!(names, truth_nodes);
    for node in nodes["items"].as_array().unwrap() {
        let name = node["metadata"]["name"].as_str().unwrap();
        let pods_cpu: f64 = truth["pods"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|p| p["node"] == name && p["phase"] == "Running")
            .flat_map(|p| p["containers"].as_array().unwrap().iter().map(|c| c["cpuCores"].as_f64().unwrap()))
            .sum();
        assert!(
            q(&node["usage"]["cpu"]) >= pods_cpu * 0.98,
            "{name}: the node uses at least what its pods use"
        );
        assert_eq!(node["kind"], "NodeMetrics");
    }
    // `kubectl top nodes` also lists the core nodes (for their allocatable), which this
    // harness's kubeconfig (percolator itself, no kube-apiserver in front) does not serve; the
    // Table of the same objects is what it would print beside them.
    let (header, rows) = table(&env.kubectl_ok(&["get", "nodes.metrics.k8s.io"]));
    assert_eq!(header, ["NAME", "CPU", "MEMORY", "WINDOW"]);
    assert_eq!(rows.iter().map(|r| r[0].as_str()).collect::<Vec<_>>(), truth_nodes);

    // One scrape serves all: the kubelet fetches of PodMetricsSummary and PodMetrics are the
    // same ones (within one cache TTL, a second kind adds no fetch).
    tokio::time::sleep(Duration::from_secs(3)).await;
    let fetches = |stats: &Value| {
        stats["kubeletFetches"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum::<u64>()
    };
    let before = fetches(&env.sim_stats().await);
    env.get_json("/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries").await;
    let after_pms = fetches(&env.sim_stats().await);
    env.get_json(&format!("{MGV}/pods")).await;
    env.get_json(&format!("{MGV}/nodes")).await;
    let after_all = fetches(&env.sim_stats().await);
    assert!(after_pms > before, "the cold list fetched the kubelets");
    assert_eq!(after_all, after_pms, "metrics.k8s.io reused the samples PodMetricsSummary took");
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
