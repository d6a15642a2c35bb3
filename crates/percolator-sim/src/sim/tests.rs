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

/// Starts the default simulator in a fresh state directory; returns both.
async fn start_default() -> (RunningSim, PathBuf) {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = mk_state_dir();
    let sim = start(mk_config(dir.clone())).await.unwrap();
    (sim, dir)
}

/// Stops `sim` and removes its state directory `dir`.
async fn stop(sim: RunningSim, dir: PathBuf) {
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(dir);
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

/// Sends `request` (to a control endpoint) and parses its answer, which must be a 200.
async fn control_json(request: reqwest::RequestBuilder) -> serde_json::Value {
    let response = request.send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    response.json().await.unwrap()
}

/// Deletes one running pod and creates its replacement now, as `POST /sim/churn` does;
/// returns the deleted and the created pod's `namespace/name`.
fn churn(sim: &RunningSim) -> (String, String) {
    let (gone, fresh) = sim.cluster.churn(cluster::now()).unwrap();
    (format!("{}/{}", gone.namespace, gone.name), format!("{}/{}", fresh.namespace, fresh.name))
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
    assert!(!cli.sim.cadvisor);
    assert_eq!(cli.sim.bind_address, std::net::Ipv4Addr::LOCALHOST);
    assert_eq!(cli.sim.node_ip_start, None);
    let cli = Cli::try_parse_from(["percolator-sim", "--state-dir", "/tmp/x", "--cadvisor"]).unwrap();
    assert!(cli.sim.cadvisor);
    let cli = Cli::try_parse_from(["percolator-sim", "--state-dir", "/tmp/x", "--cafes-per-namespace", "0"])
        .unwrap();
    assert_eq!(cli.sim.cafes_per_namespace, 0);
    assert!(Cli::try_parse_from(["percolator-sim"]).is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_watcher_sees_list_and_churn() {
    let (sim, dir) = start_default().await;
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

    let (deleted, created) = churn(&sim);
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
    let response = http.get(&url).bearer_auth(&sim.cluster.token).send().await.unwrap();
    assert_eq!(response.status(), reqwest::StatusCode::OK);
    assert_eq!(response.headers()["content-type"], "text/plain; version=0.0.4");
    let body = response.text().await.unwrap();
    assert!(body.starts_with("# HELP container_cpu_usage_seconds_total [STABLE]"));
    assert!(body.ends_with("resource_scrape_error 0\n"));

    let stats = control_json(http.get(format!("{}/sim/stats", sim.ready.metrics))).await;
    assert_eq!(stats["kubeletFetches"]["node-0"], 1);
    assert_eq!(stats["kubeletFetches"]["node-1"], 0);
    assert!(stats["apiRequests"]["watch pods"].as_u64().unwrap() >= 1);
    assert!(stats["apiRequests"]["list pods"].as_u64().unwrap() >= 1);

    let churned = control_json(http.post(format!("{}/sim/churn", sim.ready.metrics))).await;
    assert!(churned["created"]["name"].is_string());

    stop(sim, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_config_map_watch_sees_rotation_and_reviews_work() {
    use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
    use k8s_openapi::api::authorization::v1::{
        NonResourceAttributes, ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::PostParams;

    let (sim, dir) = start_default().await;
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
    let rotated = control_json(http.post(format!("{}/sim/rotate-front-proxy-ca", sim.ready.metrics))).await;
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
    let rv3 = sim.trust.rotate(&sim.cluster).unwrap();
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

    let stats = control_json(http.get(format!("{}/sim/stats", sim.ready.metrics))).await;
    assert_eq!(stats["apiRequests"]["create tokenreviews"], 1);
    assert_eq!(stats["apiRequests"]["create subjectaccessreviews"], 3);
    assert!(stats["apiRequests"]["watch configmaps"].as_u64().unwrap() >= 1);
    assert!(stats["apiRequests"]["list configmaps"].as_u64().unwrap() >= 1);
    assert_eq!(stats["apiRequests"]["get configmaps"], 2);

    stop(sim, dir).await;
}

/// The metadata of `ns/name`, read with kube-rs's typed client for `K`.
async fn get_meta<K>(
    client: &kube::Client,
    ns: &str,
    name: &str,
) -> k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope, DynamicType = ()>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    let object = Api::<K>::namespaced(client.clone(), ns).get(name).await.unwrap();
    object.meta().clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kube_rs_reads_workload_objects() {
    use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
    use k8s_openapi::api::core::v1::Service;
    use kube::ResourceExt as _;

    let (sim, dir) = start_default().await;
    let client = mk_kube_client(&sim).await;
    let http = mk_http_client(&sim);
    let truth = control_json(http.get(format!("{}/sim/truth", sim.ready.metrics))).await;
    let workloads = truth["workloads"].as_array().unwrap();
    // Every object of the truth, through its typed client (k8s-openapi checks kind and
    // apiVersion).
    for w in workloads {
        let (ns, name) = (w["namespace"].as_str().unwrap(), w["name"].as_str().unwrap());
        let meta = match w["resource"].as_str().unwrap() {
            "deployments.apps" => get_meta::<Deployment>(&client, ns, name).await,
            "replicasets.apps" => get_meta::<ReplicaSet>(&client, ns, name).await,
            "statefulsets.apps" => get_meta::<StatefulSet>(&client, ns, name).await,
            "daemonsets.apps" => get_meta::<DaemonSet>(&client, ns, name).await,
            "services" => get_meta::<Service>(&client, ns, name).await,
            other => panic!("resource {other}"),
        };
        assert_eq!((meta.namespace.as_deref(), meta.name.as_deref()), (Some(ns), Some(name)));
    }
    let count = |resource: &str| workloads.iter().filter(|w| w["resource"] == resource).count();

    let webs =
        Api::<Deployment>::all(client.clone()).list(&ListParams::default().labels("app=web")).await.unwrap();
    assert!(!webs.items.is_empty());
    assert!(webs.items.iter().all(|d| d.metadata.name.as_deref() == Some("web")));
    let tiered = Api::<StatefulSet>::namespaced(client.clone(), "shop").get("tiered").await.unwrap();
    let expressions = tiered.spec.unwrap().selector.match_expressions.unwrap();
    assert_eq!(expressions.len(), 2);
    let services = Api::<Service>::all(client.clone()).list(&ListParams::default()).await.unwrap();
    assert_eq!(services.items.len(), count("services"));

    let err = Api::<Deployment>::namespaced(client.clone(), "shop").get("nope").await.unwrap_err();
    match err {
        kube::Error::Api(s) => {
            assert_eq!((s.code, s.reason.as_str()), (404, "NotFound"));
            assert_eq!(s.message, "deployments.apps \"nope\" not found");
        }
        other => panic!("{other:?}"),
    }

    // A watcher lists, then watches.
    let mut stream =
        watcher::watcher(Api::<ReplicaSet>::all(client.clone()), watcher::Config::default()).boxed();
    let mut initial = 0;
    loop {
        match tokio::time::timeout(Duration::from_secs(5), stream.try_next()).await.unwrap().unwrap().unwrap()
        {
            Event::Init => {}
            Event::InitApply(rs) => {
                assert_eq!(rs.owner_references().len(), 1);
                initial += 1;
            }
            Event::InitDone => break,
            other => panic!("unexpected event before InitDone: {other:?}"),
        }
    }
    assert_eq!(initial, count("replicasets.apps"));

    let stats = control_json(http.get(format!("{}/sim/stats", sim.ready.metrics))).await;
    let api = &stats["apiRequests"];
    assert_eq!(api["get deployments"], count("deployments.apps") + 1);
    assert_eq!(api["get statefulsets"], count("statefulsets.apps") + 1);
    assert_eq!(api["get services"], count("services"));
    assert_eq!(api["list deployments"], 1);
    assert_eq!(api["list services"], 1);
    assert!(api["list replicasets"].as_u64().unwrap() >= 1);
    stop(sim, dir).await;
}

/// Another bind address and node addresses (here other loopback addresses, which need no
/// network namespace): every URL, the kubeconfig, the API's certificate, the nodes'
/// InternalIPs and the kubelets follow them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bind_address_and_node_ips_move_every_listener() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = mk_state_dir();
    let config = SimConfig {
        bind_address: Ipv4Addr::new(127, 0, 0, 2),
        node_ip_start: Some(Ipv4Addr::new(127, 3, 0, 254)),
        ..mk_config(dir.clone())
    };
    let sim = start(config).await.unwrap();
    assert!(sim.ready.api.starts_with("https://127.0.0.2:"), "{}", sim.ready.api);
    assert!(sim.ready.metrics.starts_with("http://127.0.0.2:"), "{}", sim.ready.metrics);
    // Verified against the certificate's SAN 127.0.0.2 through the written kubeconfig.
    let client = mk_kube_client(&sim).await;
    let nodes = Api::<Node>::all(client).list(&ListParams::default()).await.unwrap();
    let internal: Vec<String> = nodes
        .items
        .iter()
        .map(|n| {
            let addresses = n.status.as_ref().unwrap().addresses.as_ref().unwrap();
            addresses.iter().find(|a| a.type_ == "InternalIP").unwrap().address.clone()
        })
        .collect();
    // Counted on past the end of a byte.
    assert_eq!(internal, ["127.3.0.254", "127.3.0.255", "127.3.1.0"]);
    let http = mk_http_client(&sim);
    for ip in &internal {
        let url = format!("https://{ip}:{}/metrics/resource", sim.ready.kubelet_port);
        let response = http.get(&url).bearer_auth(&sim.cluster.token).send().await.unwrap();
        assert_eq!(response.status(), reqwest::StatusCode::OK, "{url}");
    }
    let stats = control_json(http.get(format!("{}/sim/stats", sim.ready.metrics))).await;
    assert_eq!(stats["kubeletFetches"], serde_json::json!({"node-0": 1, "node-1": 1, "node-2": 1}));
    stop(sim, dir).await;

    let last =
        SimConfig { node_ip_start: Some(Ipv4Addr::new(255, 255, 255, 254)), ..mk_config(mk_state_dir()) };
    let Err(Error::Config(message)) = start(last).await else { panic!("three nodes from 255.255.255.254") };
    assert_eq!(message, "--node-ip-start: 255.255.255.254 leaves no address for the last of 3 nodes");
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
    stop(sim, dir).await;
}

fn pod_key(pod: &Pod) -> String {
    format!("{}/{}", pod.metadata.namespace.as_deref().unwrap(), pod.metadata.name.as_deref().unwrap())
}

async fn set_faults(sim: &RunningSim, http: &reqwest::Client, body: &str) -> serde_json::Value {
    let request = http
        .post(format!("{}/sim/faults", sim.ready.metrics))
        .header("content-type", "application/json")
        .body(body.to_owned());
    control_json(request).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubelet_faults_over_tls() {
    let (sim, dir) = start_default().await;
    let control = mk_http_client(&sim);
    let ca = std::fs::read(sim.ready.state_dir.join("ca.crt")).unwrap();
    // Short timeouts, and a pooled connection opened before each fault.
    let http = reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(&ca).unwrap()])
        .timeout(Duration::from_millis(700))
        .build()
        .unwrap();
    let url = format!("https://127.1.0.1:{}/metrics/resource", sim.ready.kubelet_port);
    let fetch = || async {
        let response = http
            .get(&url)
            .bearer_auth(&sim.cluster.token)
            .send()
            .await
            .map_err(|e| format!("send: {e:?}"))?;
        let status = response.status().as_u16();
        let body = response.bytes().await.map_err(|e| format!("body: {e:?}"))?;
        Ok::<_, String>((status, body))
    };
    let (status, normal) = fetch().await.unwrap();
    assert_eq!(status, 200);
    let normal = String::from_utf8(normal.to_vec()).unwrap();

    for (fault, check) in [("hang", "send"), ("stall", "body"), ("reset", "send"), ("truncate", "body")] {
        fetch().await.unwrap();
        set_faults(&sim, &control, &format!(r#"{{"kubelet": {{"node-0": "{fault}"}}}}"#)).await;
        let started = std::time::Instant::now();
        let error = fetch().await.unwrap_err();
        assert!(error.starts_with(check), "{fault}: {error}");
        assert!(started.elapsed() < Duration::from_secs(2), "{fault}");
        set_faults(&sim, &control, r#"{"kubelet": {"node-0": "ok"}}"#).await;
    }

    set_faults(&sim, &control, r#"{"kubelet": {"*": "error500"}}"#).await;
    assert_eq!(fetch().await.unwrap().0, 500);

    set_faults(&sim, &control, r#"{"kubelet": {"*": "ok", "node-0": "huge"}}"#).await;
    let (status, huge) = fetch().await.unwrap();
    assert_eq!(status, 200);
    assert!(huge.len() > faults::HUGE_PADDING_BYTES, "{}", huge.len());

    set_faults(&sim, &control, r#"{"kubelet": {"node-0": "old-format"}}"#).await;
    let (status, old) = fetch().await.unwrap();
    assert_eq!(status, 200);
    let old = String::from_utf8(old.to_vec()).unwrap();
    assert!(old.contains("# HELP container_cpu_usage_seconds_total [ALPHA]"));
    assert!(!old.contains("[STABLE]") && !old.contains("resource_scrape_error"));
    assert!(old.ends_with("scrape_error 0\n"));
    let scrape_time = jiff::Timestamp::from_second(2_000_000_000).unwrap();
    let parsed = percolator::parse_resource_metrics(&old, scrape_time).unwrap();
    let current = percolator::parse_resource_metrics(&normal, scrape_time).unwrap();
    assert_eq!(parsed.containers.len(), current.containers.len());
    assert!(!parsed.scrape_error);
    assert_eq!(parsed.malformed_lines, 0);
    for sample in parsed.containers.values() {
        assert_eq!(sample.cpu.timestamp, scrape_time, "no timestamps: the scrape time");
        assert_eq!(sample.start_time, None);
    }
    assert_eq!(parsed.node_memory.unwrap().timestamp, scrape_time);

    let state = set_faults(&sim, &control, r#"{"kubelet": {"node-0": "ok"}}"#).await;
    assert_eq!(state["kubelet"]["node-0"], "ok");
    assert_eq!(fetch().await.unwrap().0, 200);
    stop(sim, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_drop_and_gone_make_kube_rs_rewatch_and_relist() {
    let (sim, dir) = start_default().await;
    let control = mk_http_client(&sim);
    let client = mk_kube_client(&sim).await;
    // No backoff: every event is checked, errors included. A task keeps polling the watcher,
    // so its watch is open whenever a fault is injected.
    let mut stream = watcher::watcher(Api::<Pod>::all(client), watcher::Config::default()).boxed();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let pump = tokio::spawn(async move {
        while let Some(item) = stream.next().await {
            if tx.send(item).is_err() {
                break;
            }
        }
    });
    let mut next = async || tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap().unwrap();
    let watches = async || -> u64 {
        let stats = control_json(control.get(format!("{}/sim/stats", sim.ready.metrics))).await;
        stats["apiRequests"]["watch pods"].as_u64().unwrap_or(0)
    };
    let wait_for_watches = async |n: u64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while watches().await < n {
            assert!(std::time::Instant::now() < deadline, "no watch {n}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        // The request is counted before its task subscribes to the fault signal.
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    while !matches!(next().await, Ok(Event::InitDone)) {}
    wait_for_watches(1).await;

    // Dropped: kube-rs takes the broken body for an end of stream (or reports it), watches
    // again from its resourceVersion and sees later changes.
    let state = set_faults(&sim, &control, r#"{"watch": "drop"}"#).await;
    assert_eq!(state["watch"], "ok");
    wait_for_watches(2).await;
    let (_, created) = churn(&sim);
    let mut saw = false;
    while !saw {
        match next().await {
            Ok(Event::Apply(pod)) => {
                saw = pod_key(&pod) == created;
            }
            Ok(Event::Delete(_)) | Err(watcher::Error::WatchFailed(_)) => {}
            other => panic!("after a drop: {other:?}"),
        }
    }

    // Gone: the resumed watch gets 410 and the watcher lists again.
    set_faults(&sim, &control, r#"{"watch": "gone-once"}"#).await;
    loop {
        match next().await {
            Err(watcher::Error::WatchFailed(_)) => {}
            Err(watcher::Error::WatchError(status)) if status.code == 410 => break,
            other => panic!("expected a 410, got {other:?}"),
        }
    }
    let mut relisted = Vec::new();
    loop {
        match next().await.unwrap() {
            Event::Init => {}
            Event::InitApply(pod) => {
                relisted.push(pod_key(&pod));
            }
            Event::InitDone => break,
            other => panic!("during the re-list: {other:?}"),
        }
    }
    let current: Vec<String> =
        sim.cluster.all_pods().iter().map(|p| format!("{}/{}", p.namespace, p.name)).collect();
    assert_eq!(relisted, current);
    // And it watches again after the re-list.
    let (_, created) = churn(&sim);
    loop {
        match next().await.unwrap() {
            Event::Apply(pod) if pod_key(&pod) == created => break,
            Event::Apply(_) | Event::Delete(_) => {}
            other => panic!("after the re-list: {other:?}"),
        }
    }
    let state = control_json(control.get(format!("{}/sim/faults", sim.ready.metrics))).await;
    assert_eq!(state["watchDropped"], 2);
    assert_eq!(state["watchExpired"], 1);

    pump.abort();
    stop(sim, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadvisor_flag_serves_the_kubelets_usage() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let dir = mk_state_dir();
    let (sim, off) = {
        let off = start(mk_config(dir.join("off"))).await.unwrap();
        let mut config = mk_config(dir.join("on"));
        config.cadvisor = true;
        (start(config).await.unwrap(), off)
    };
    let http = mk_http_client(&sim);
    let get = |url: String| {
        let http = http.clone();
        async move { http.get(url).send().await.unwrap().text().await.unwrap() }
    };
    let without = get(format!("{}/metrics", off.ready.metrics)).await;
    assert!(!without.contains("node_memory_working_set_bytes") && !without.contains("container_"));
    let with = get(format!("{}/metrics", sim.ready.metrics)).await;
    // Memory does not change with time: the node-0 kubelet's value, as its own and its root
    // cgroup's series.
    let kubelet = http
        .get(format!("https://127.1.0.1:{}/metrics/resource", sim.ready.kubelet_port))
        .bearer_auth(&sim.cluster.token)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let memory = kubelet
        .lines()
        .find_map(|l| l.strip_prefix("node_memory_working_set_bytes "))
        .and_then(|rest| rest.split(' ').next())
        .unwrap();
    assert!(
        with.contains(&format!("\nnode_memory_working_set_bytes{{node=\"node-0\"}} {memory}\n")),
        "{with}"
    );
    assert!(
        with.contains(&format!(
            "\ncontainer_memory_working_set_bytes{{id=\"/\",node=\"node-0\"}} {memory}\n"
        ))
    );
    assert!(with.contains("container=\"POD\",id=\"/kubepods/burstable/pod"));
    stop(off, dir.join("off")).await;
    stop(sim, dir).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_down_aborts_watches_and_resets_connections_until_up() {
    let (sim, dir) = start_default().await;
    let control = mk_http_client(&sim);
    let client = mk_kube_client(&sim).await;
    let pods: Api<Pod> = Api::all(client.clone());
    let listed = pods.list(&Default::default()).await.unwrap();
    assert!(!listed.items.is_empty());
    // A watch open on a pooled connection.
    let version = listed.metadata.resource_version.clone().unwrap();
    let mut watch = pods.watch(&kube::api::WatchParams::default(), &version).await.unwrap().boxed();

    let state = set_faults(&sim, &control, r#"{"api": "down"}"#).await;
    assert_eq!(state["api"], "down");
    // The open watch ends (an error or the end of the stream), within seconds.
    let ended = tokio::time::timeout(Duration::from_secs(5), async {
        loop {
            match watch.next().await {
                None | Some(Err(_)) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(ended.is_ok(), "the watch outlived the outage");
    // New requests fail fast: the connection is reset before any answer.
    let t = std::time::Instant::now();
    assert!(pods.list(&Default::default()).await.is_err());
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    let state = control_json(control.get(format!("{}/sim/faults", sim.ready.metrics))).await;
    assert!(state["apiConnectionsReset"].as_u64().unwrap() >= 1, "{state}");

    let state = set_faults(&sim, &control, r#"{"api": "up"}"#).await;
    assert_eq!(state["api"], "up");
    assert_eq!(pods.list(&Default::default()).await.unwrap().items.len(), listed.items.len());
    stop(sim, dir).await;
}
