//! End-to-end tests of the simulator over real TLS: kube-rs against the API (list + watch
//! through `kube::runtime::watcher`), reqwest against a kubelet and the control endpoints.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::{StreamExt as _, TryStreamExt as _};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::api::{Api, ListParams};
use kube::runtime::watcher::{self, Event};

use super::*;

fn mk_state_dir() -> PathBuf {
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "percolator-sim-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

fn mk_config(dir: PathBuf) -> SimConfig {
    SimConfig::with_state_dir(dir)
}

async fn mk_kube_client(sim: &RunningSim) -> kube::Client {
    let kubeconfig = kube::config::Kubeconfig::read_from(&sim.kubeconfig).unwrap();
    let config =
        kube::Config::from_custom_kubeconfig(kubeconfig, &kube::config::KubeConfigOptions::default())
            .await
            .unwrap();
    kube::Client::try_from(config).unwrap()
}

fn mk_http_client(sim: &RunningSim) -> reqwest::Client {
    let ca = std::fs::read(sim.ready.state_dir.join("ca.crt")).unwrap();
    reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()]).build().unwrap()
}

#[test]
fn flags_are_consistent() {
    use clap::{CommandFactory as _, Parser};
    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimConfig,
    }
    Cli::command().debug_assert();
    let cli = Cli::try_parse_from([
        "percolator-sim",
        "--state-dir",
        "/tmp/x",
        "--namespaces",
        "a,b",
        "--churn-interval",
        "1m",
    ])
    .unwrap();
    assert_eq!(cli.sim.namespaces, ["a", "b"]);
    assert_eq!(cli.sim.churn_interval, Duration::from_secs(60));
    assert_eq!(cli.sim.housekeeping, Duration::from_secs(10));
    assert_eq!(cli.sim.nodes, 3);
    assert!(Cli::try_parse_from(["percolator-sim"]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watcher_sees_list_and_churn() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = mk_state_dir();
    let sim = start(mk_config(dir.clone())).await.unwrap();
    for file in ["ca.crt", "token", "kubeconfig", "sim.json"] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    let announced: Ready = serde_json::from_slice(&std::fs::read(dir.join("sim.json")).unwrap()).unwrap();
    assert_eq!(announced, sim.ready);

    let client = mk_kube_client(&sim).await;
    let nodes = Api::<Node>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    assert_eq!(nodes.items.len(), 3);
    let port = nodes.items[0].status.as_ref().unwrap().daemon_endpoints.as_ref().unwrap();
    assert_eq!(port.kubelet_endpoint.as_ref().unwrap().port, i32::from(sim.ready.kubelet_port));

    let mut nodes_stream =
        watcher::watcher(Api::<Node>::all(client.clone()), watcher::Config::default()).boxed();
    let mut node_names = Vec::new();
    loop {
        let event = tokio::time::timeout(Duration::from_secs(5), nodes_stream.try_next())
            .await
            .unwrap()
            .unwrap()
            .unwrap();
        match event {
            Event::Init => {}
            Event::InitApply(node) => node_names.push(node.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected node event: {other:?}"),
        }
    }
    assert_eq!(node_names, ["node-0", "node-1", "node-2"]);

    let mut stream = watcher::watcher(Api::<Pod>::all(client.clone()), watcher::Config::default()).boxed();
    let mut initial = Vec::new();
    let deadline = Duration::from_secs(5);
    loop {
        let event = tokio::time::timeout(deadline, stream.try_next()).await.unwrap().unwrap().unwrap();
        match event {
            Event::Init => {}
            Event::InitApply(pod) => initial.push(pod.metadata.name.unwrap()),
            Event::InitDone => break,
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial.len(), 12);

    let (deleted, created) = sim.churn().unwrap();
    let mut saw_delete = false;
    let mut saw_apply = false;
    while !(saw_delete && saw_apply) {
        let event = tokio::time::timeout(deadline, stream.try_next()).await.unwrap().unwrap().unwrap();
        match event {
            Event::Delete(pod) => {
                assert_eq!(
                    format!("{}/{}", pod.metadata.namespace.unwrap(), pod.metadata.name.unwrap()),
                    deleted
                );
                saw_delete = true;
            }
            Event::Apply(pod) => {
                assert_eq!(
                    format!("{}/{}", pod.metadata.namespace.unwrap(), pod.metadata.name.unwrap()),
                    created
                );
                assert_eq!(pod.status.unwrap().phase.as_deref(), Some("Running"));
                saw_apply = true;
            }
            other => panic!("unexpected event: {other:?}"),
        }
    }

    // A kubelet, over TLS with the sim CA, with and without the token.
    let http = mk_http_client(&sim);
    let url = format!("https://127.1.0.1:{}/metrics/resource", sim.ready.kubelet_port);
    let response = http.get(&url).send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::UNAUTHORIZED);
    let response = http.get(&url).bearer_auth(&sim.token).send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/plain; version=0.0.4");
    let body = response.text().await.unwrap();
    assert!(body.starts_with("# HELP container_cpu_usage_seconds_total [STABLE]"));
    assert!(body.ends_with("resource_scrape_error 0\n"));

    let stats: serde_json::Value =
        http.get(format!("{}/sim/stats", sim.ready.metrics)).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["kubeletFetches"]["node-0"], 1);
    assert_eq!(stats["kubeletFetches"]["node-1"], 0);
    assert!(stats["apiRequests"]["watch pods"].as_u64().unwrap() >= 1);
    assert!(stats["apiRequests"]["list pods"].as_u64().unwrap() >= 1);

    let churned: serde_json::Value =
        http.post(format!("{}/sim/churn", sim.ready.metrics)).send().await.unwrap().json().await.unwrap();
    assert!(churned["created"]["name"].is_string());

    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}
