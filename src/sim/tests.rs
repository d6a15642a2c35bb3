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
    assert_eq!(cli.sim.cafes_per_namespace, 2);
    let cli = Cli::try_parse_from(["percolator-sim", "--state-dir", "/tmp/x", "--cafes-per-namespace", "0"])
        .unwrap();
    assert_eq!(cli.sim.cafes_per_namespace, 0);
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
    let cafe_pods = sim.cluster.all_pods().iter().filter(|p| p.cafe.is_some()).count();
    assert!(cafe_pods >= 6);
    assert_eq!(initial.len(), 12 + cafe_pods);

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_config_map_watch_sees_rotation_and_reviews_work() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;

    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = mk_state_dir();
    let sim = start(mk_config(dir.clone())).await.unwrap();
    for file in [
        "client-ca.crt",
        "client-ca.key",
        "front-proxy-ca.crt",
        "front-proxy-ca.key",
        "front-proxy-client.crt",
        "front-proxy-client.key",
        "users/alice.crt",
        "users/carol.key",
        "users/admin.crt",
        "bad/other-ca-client.crt",
        "bad/wrong-cn-front-proxy.key",
        "bad/expired-front-proxy.crt",
        "bad/server-eku-front-proxy.crt",
    ] {
        assert!(dir.join(file).is_file(), "{file}");
    }
    let client = mk_kube_client(&sim).await;
    let cms = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let cm = cms.get("extension-apiserver-authentication").await.unwrap();
    let data = cm.data.unwrap();
    let ca1 = std::fs::read_to_string(dir.join("front-proxy-ca.crt")).unwrap();
    assert_eq!(data["requestheader-client-ca-file"], ca1);
    assert_eq!(data["client-ca-file"], std::fs::read_to_string(dir.join("client-ca.crt")).unwrap());
    assert_eq!(data["requestheader-allowed-names"], r#"["front-proxy-client"]"#);
    let err = cms.get("nope").await.unwrap_err();
    assert!(matches!(err, kube::Error::Api(ref s) if s.code == 404), "{err:?}");

    let config = watcher::Config::default().fields("metadata.name=extension-apiserver-authentication");
    let mut stream = watcher::watcher(cms.clone(), config).boxed();
    let deadline = Duration::from_secs(5);
    let mut initial = Vec::new();
    loop {
        match tokio::time::timeout(deadline, stream.try_next()).await.unwrap().unwrap().unwrap() {
            Event::Init => {}
            Event::InitApply(cm) => initial.push(cm),
            Event::InitDone => break,
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial.len(), 1);

    // Rotate through the control endpoint: the watch gets the new CA.
    let http = mk_http_client(&sim);
    let rotated: serde_json::Value = http
        .post(format!("{}/sim/rotate-front-proxy-ca", sim.ready.metrics))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let rv = rotated["resourceVersion"].as_str().unwrap().to_owned();
    let ca2 = std::fs::read_to_string(dir.join("front-proxy-ca.crt")).unwrap();
    assert_ne!(ca1, ca2);
    match tokio::time::timeout(deadline, stream.try_next()).await.unwrap().unwrap().unwrap() {
        Event::Apply(cm) => {
            assert_eq!(cm.metadata.resource_version.as_deref(), Some(rv.as_str()));
            assert_eq!(cm.data.unwrap()["requestheader-client-ca-file"], ca2);
        }
        other => panic!("expected the rotated ConfigMap, got {other:?}"),
    }
    // In-process rotation works the same way.
    let rv3 = sim.rotate_front_proxy_ca().unwrap();
    match tokio::time::timeout(deadline, stream.try_next()).await.unwrap().unwrap().unwrap() {
        Event::Apply(cm) => assert_eq!(cm.metadata.resource_version, Some(rv3.to_string())),
        other => panic!("expected the rotated ConfigMap, got {other:?}"),
    }

    // TokenReview and SubjectAccessReview through kube-rs's typed client.
    let review = TokenReview {
        spec: TokenReviewSpec { token: Some("tester-token".into()), audiences: None },
        ..Default::default()
    };
    let done = Api::<TokenReview>::all(client.clone()).create(&PostParams::default(), &review).await.unwrap();
    let status = done.status.unwrap();
    assert_eq!(status.authenticated, Some(true));
    let user = status.user.unwrap();
    assert_eq!(user.username.as_deref(), Some("tester"));
    assert_eq!(user.groups.unwrap(), ["viewers", "system:authenticated"]);

    let sar = |attributes: Option<ResourceAttributes>, path: Option<&str>, user: &str, groups: &[&str]| {
        SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                resource_attributes: attributes,
                non_resource_attributes: path
                    .map(|p| NonResourceAttributes { path: Some(p.into()), verb: Some("get".into()) }),
                user: Some(user.into()),
                groups: Some(groups.iter().map(|g| (*g).to_owned()).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    };
    let sars = Api::<SubjectAccessReview>::all(client.clone());
    let list_shop = ResourceAttributes {
        namespace: Some("shop".into()),
        verb: Some("list".into()),
        group: Some("stats.une-tasse-de.cafe".into()),
        version: Some("v1alpha1".into()),
        resource: Some("podmetricssummaries".into()),
        ..Default::default()
    };
    let allowed = sars
        .create(
            &PostParams::default(),
            &sar(Some(list_shop.clone()), None, "alice", &["devs", "system:authenticated"]),
        )
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(allowed.allowed);
    assert!(allowed.reason.unwrap().starts_with("RBAC: allowed by RoleBinding"));
    assert_eq!(allowed.denied, None);
    let denied = sars
        .create(&PostParams::default(), &sar(Some(list_shop), None, "bob", &["system:authenticated"]))
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(!denied.allowed);
    assert_eq!(denied.reason, None);
    let anonymous = sars
        .create(
            &PostParams::default(),
            &sar(None, Some("/healthz"), "system:anonymous", &["system:unauthenticated"]),
        )
        .await
        .unwrap()
        .status
        .unwrap();
    assert!(anonymous.allowed);

    let stats: serde_json::Value =
        http.get(format!("{}/sim/stats", sim.ready.metrics)).send().await.unwrap().json().await.unwrap();
    assert_eq!(stats["apiRequests"]["create tokenreviews"], 1);
    assert_eq!(stats["apiRequests"]["create subjectaccessreviews"], 3);
    assert!(stats["apiRequests"]["watch configmaps"].as_u64().unwrap() >= 1);
    assert!(stats["apiRequests"]["list configmaps"].as_u64().unwrap() >= 1);
    assert_eq!(stats["apiRequests"]["get configmaps"], 2);

    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}

#[tokio::test]
async fn invalid_policy_file_is_an_error() {
    let dir = mk_state_dir();
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("policy.yaml");
    std::fs::write(&path, "rules: [{users: [x]}]").unwrap();
    let mut config = mk_config(dir.join("state"));
    config.policy = Some(path.clone());
    let Err(e) = start(config).await else { panic!("an invalid policy must fail the start") };
    assert!(matches!(e, Error::Policy(_)), "{e}");
    let custom = "tokens: [{token: zed-token, username: zed}]\n";
    std::fs::write(&path, custom).unwrap();
    let mut config = mk_config(dir.join("state"));
    config.policy = Some(path);
    let sim = start(config).await.unwrap();
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
}
