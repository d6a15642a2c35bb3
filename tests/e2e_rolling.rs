//! Rolling restarts, configuration reloads and a kube-apiserver outage under steady load
//! (issue 33 §2; RELIABILITY.md, "Rolling restarts, reload and kube-apiserver outage").
//!
//! Two replicas of the real percolator (same flags, one shared serving certificate) sit behind
//! the [`Balancer`] of the simulator's library, which balances HTTP/2 streams over the replicas
//! in rotation and follows their `/readyz` as the endpoints controller does, reaching them over
//! TLS + HTTP/2 with the front-proxy client certificate and `X-Remote-User`/`X-Remote-Group`,
//! as kube-aggregator reaches a Service. Several clients send lists of the kinds,
//! metrics.k8s.io, custom and external metrics through it without pause; every answer must be a
//! 200 with a complete body (the kind's list, the number of items of the first answer) while:
//! - each replica in turn gets SIGTERM, exits 0 and is started again on its port;
//! - the `--config` file changes (a kind added, a custom metric's query changed, an invalid
//!   edit kept out);
//! - (one replica, no balancer) the simulated kube-apiserver is unreachable for 30 s: known
//!   identities keep being served, a new one gets a 503 Status, and the inventory catches up.
//!
//! Figures (latency percentiles, reload and recovery times) are printed:
//! `cargo build -p percolator-sim && cargo test --test e2e_rolling -- --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Env, Options, Replica, ServingPair, configmap_write, serving_pair};
use percolator_sim::balancer::{Balancer, BalancerOptions};
use serde_json::Value;

const STATS: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
const PMS_ALL: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries";
const PMS_SHOP: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries";
const CAFES_SHOP: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/cafebrewstats";
const POD_METRICS: &str = "/apis/metrics.k8s.io/v1beta1/pods";
const NODE_METRICS: &str = "/apis/metrics.k8s.io/v1beta1/nodes";
const CUSTOM_RPS: &str =
    "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/http_requests_per_second";
const EXTERNAL_BREWS: &str = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute";
/// The identity the load runs as (the aggregator's X-Remote-* headers): group `viewers` may
/// read every group percolator serves in the simulator's policy.
const USER: &str = "dora";
const GROUP: &str = "viewers";
/// Concurrent clients of the load, and each one's pause between two requests.
const CLIENTS: usize = 6;
const PAUSE: Duration = Duration::from_millis(25);

// ---------------------------------------------------------------- the load

/// A path the load asks for and what its answer must hold.
#[derive(Debug, Clone)]
struct Target {
    path: String,
    kind: String,
    /// The number of items every answer must have (None: at least one).
    items: Option<usize>,
    /// metrics.k8s.io, as metrics-server: a pod or node is listed once it has CPU, which takes
    /// two kubelet samples; a replica is ready only once it has them, so the rolling restart
    /// asserts no short list, while the other tests only count them.
    partial_allowed: bool,
}

/// One answer.
#[derive(Debug, Clone)]
struct Sample {
    at: Instant,
    latency: Duration,
    /// `Err` says how the answer failed.
    outcome: Result<(), String>,
    /// A metrics.k8s.io list with fewer items than the steady state ([`Target::partial_allowed`]).
    partial: bool,
}

/// Checks one answer against its target: whether it is partial, or how it failed.
fn check(target: &Target, status: u16, body: &str) -> Result<bool, String> {
    let short = || body.chars().take(300).collect::<String>();
    if status != 200 {
        return Err(format!("{} → {status}: {}", target.path, short()));
    }
    let v: Value = serde_json::from_str(body)
        .map_err(|e| format!("{} → incomplete body ({e}): {}", target.path, short()))?;
    if v["kind"] != target.kind.as_str() {
        return Err(format!("{} → kind {} instead of {}", target.path, v["kind"], target.kind));
    }
    let Some(items) = v["items"].as_array().map(Vec::len) else {
        return Err(format!("{} → no items array: {}", target.path, short()));
    };
    match target.items {
        Some(n) if target.partial_allowed && items < n => Ok(true),
        Some(n) if items != n => Err(format!("{} → {items} items instead of {n}", target.path)),
        None if items == 0 => Err(format!("{} → no items", target.path)),
        _ => Ok(false),
    }
}

/// Clients sending requests for the targets in turn, as fast as their pause lets them.
struct Load {
    samples: Arc<Mutex<Vec<Sample>>>,
    stop: Arc<AtomicBool>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Load {
    /// `clients` clients of `base`, each `make_client()`'s own connection.
    fn start(
        base: &str,
        targets: &[Target],
        clients: usize,
        make_client: impl Fn() -> reqwest::Client,
    ) -> Load {
        let samples = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let tasks = (0..clients)
            .map(|n| {
                let (client, samples, stop) = (make_client(), samples.clone(), stop.clone());
                let (base, targets) = (base.to_owned(), targets.to_vec());
                tokio::spawn(async move {
                    let mut i = n;
                    while !stop.load(Ordering::SeqCst) {
                        let target = &targets[i % targets.len()];
                        i += 1;
                        let at = Instant::now();
                        let outcome = match client.get(format!("{base}{}", target.path)).send().await {
                            Ok(r) => {
                                let status = r.status().as_u16();
                                match r.text().await {
                                    Ok(body) => check(target, status, &body),
                                    Err(e) => Err(format!("{} → body broken: {e}", target.path)),
                                }
                            }
                            Err(e) => Err(format!("{} → request failed: {e:?}", target.path)),
                        };
                        let partial = outcome.as_ref().is_ok_and(|p| *p);
                        let outcome = outcome.map(|_| ());
                        samples.lock().unwrap().push(Sample { at, latency: at.elapsed(), outcome, partial });
                        tokio::time::sleep(PAUSE).await;
                    }
                })
            })
            .collect();
        Load { samples, stop, tasks }
    }

    /// Stops the clients (each finishes its request) and returns every answer.
    async fn stop(self) -> Vec<Sample> {
        self.stop.store(true, Ordering::SeqCst);
        for task in self.tasks {
            task.await.unwrap();
        }
        self.samples.lock().unwrap().clone()
    }
}

/// Requests, failures, p50 and p99 of the samples started in `[from, to)`.
fn summary(samples: &[Sample], from: Instant, to: Instant) -> (usize, usize, Duration, Duration) {
    let window: Vec<&Sample> = samples.iter().filter(|s| s.at >= from && s.at < to).collect();
    let failures = window.iter().filter(|s| s.outcome.is_err()).count();
    let mut latencies: Vec<Duration> = window.iter().map(|s| s.latency).collect();
    latencies.sort();
    let pct = |p: f64| {
        latencies
            .get(((latencies.len() as f64 * p).ceil() as usize).saturating_sub(1))
            .copied()
            .unwrap_or_default()
    };
    (window.len(), failures, pct(0.50), pct(0.99))
}

#[track_caller]
fn assert_no_failures(samples: &[Sample]) {
    let failures: Vec<&String> = samples.iter().filter_map(|s| s.outcome.as_ref().err()).collect();
    assert!(
        failures.is_empty(),
        "{} of {} requests failed; the first ones:\n{}",
        failures.len(),
        samples.len(),
        failures.iter().take(10).map(|f| f.as_str()).collect::<Vec<_>>().join("\n")
    );
}

/// How many answers were partial metrics.k8s.io lists.
fn partials(samples: &[Sample]) -> usize {
    samples.iter().filter(|s| s.partial).count()
}

fn fmt(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1000.0)
}

// ---------------------------------------------------------------- replicas and balancer

/// A client of the balancer: HTTP/2 with prior knowledge, as the identity [`USER`].
fn balancer_client() -> reqwest::Client {
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-remote-user", USER.parse().unwrap());
    headers.insert("x-remote-group", GROUP.parse().unwrap());
    reqwest::Client::builder().http2_prior_knowledge().default_headers(headers).build().unwrap()
}

/// A client of a percolator whose serving certificate `ca` verifies, as the aggregator: the
/// front-proxy certificate, and the identity [`USER`] unless the request names another.
fn aggregator_client(env: &Env, ca: &[u8]) -> reqwest::Client {
    let state = env.dir.join("sim");
    let mut pem = std::fs::read(state.join("front-proxy-client.crt")).unwrap();
    pem.extend(std::fs::read(state.join("front-proxy-client.key")).unwrap());
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("x-remote-user", USER.parse().unwrap());
    headers.insert("x-remote-group", GROUP.parse().unwrap());
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
        .identity(reqwest::Identity::from_pem(&pem).unwrap())
        .default_headers(headers)
        .build()
        .unwrap()
}

async fn start_balancer(env: &Env, pair: &ServingPair, replicas: &[&Replica]) -> Balancer {
    let state = env.dir.join("sim");
    let balancer = Balancer::start(BalancerOptions {
        replicas: replicas.iter().map(|r| r.url.clone()).collect(),
        ca_pem: pair.pem.clone(),
        client_cert_pem: std::fs::read(state.join("front-proxy-client.crt")).unwrap(),
        client_key_pem: std::fs::read(state.join("front-proxy-client.key")).unwrap(),
        default_user: "system:kube-aggregator".into(),
        default_groups: vec!["system:masters".into()],
        probe_interval: Duration::from_secs(1),
    })
    .await
    .unwrap();
    assert!(
        balancer.wait_all_ready(Duration::from_secs(15)).await,
        "replicas never in rotation: {:?}",
        balancer.last_probe_errors()
    );
    balancer
}

/// The targets for `paths`, each with the kind and item count of its answer once it has
/// items (within 30 s: metrics.k8s.io needs two kubelet samples).
async fn targets_of(client: &reqwest::Client, base: &str, paths: &[&str], exact: bool) -> Vec<Target> {
    let mut targets = Vec::new();
    for path in paths {
        let deadline = Instant::now() + Duration::from_secs(30);
        let v = loop {
            let r = client.get(format!("{base}{path}")).send().await.unwrap();
            let status = r.status().as_u16();
            let body = r.text().await.unwrap();
            assert_eq!(status, 200, "{path}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            if v["items"].as_array().is_some_and(|i| !i.is_empty()) {
                break v;
            }
            assert!(Instant::now() < deadline, "{path}: no items: {body}");
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        targets.push(Target {
            path: (*path).to_owned(),
            kind: v["kind"].as_str().unwrap().to_owned(),
            items: exact.then(|| v["items"].as_array().map_or(0, Vec::len)),
            partial_allowed: path.starts_with("/apis/metrics.k8s.io/"),
        });
    }
    targets
}

fn options(extra: &[&str]) -> Options {
    let mut args: Vec<String> =
        ["--enable-custom-metrics", "--enable-external-metrics", "--enable-resource-metrics"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    Options { extra_args: args, scrape_percolator: false, ..Options::default() }
}

// ---------------------------------------------------------------- rolling restart

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_under_load_loses_no_request() {
    let env = Env::start("rolling", options(&[])).await;
    let pair = serving_pair(&env.dir.join("serving"));
    let replica_flags = ["--shutdown-delay-duration", "3s"];
    let mut a = env.replica("replica-a", &pair, &replica_flags).await;
    let mut b = env.replica("replica-b", &pair, &replica_flags).await;
    let balancer = start_balancer(&env, &pair, &[&a, &b]).await;
    let paths = [PMS_ALL, PMS_SHOP, CAFES_SHOP, POD_METRICS, NODE_METRICS, CUSTOM_RPS, EXTERNAL_BREWS];
    let targets = targets_of(&balancer_client(), balancer.url(), &paths, true).await;

    let load = Load::start(balancer.url(), &targets, CLIENTS, balancer_client);
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let restart_began = Instant::now();
    let mut timeline = Vec::new();
    for replica in [&mut a, &mut b] {
        let sent_before = balancer.sent();
        let t = Instant::now();
        let exit = replica.terminate().await;
        assert_eq!(exit.code(), Some(0), "{} exit status {exit:?}", replica.name);
        let exited = t.elapsed();
        replica.start_again().await;
        let ready = t.elapsed();
        assert!(
            balancer.wait_all_ready(Duration::from_secs(15)).await,
            "{} never back in rotation: {:?}",
            replica.name,
            balancer.last_probe_errors()
        );
        timeline.push(format!(
            "{}: exit 0 {exited:.1?} after SIGTERM, ready again {ready:.1?}, in rotation {:.1?}",
            replica.name,
            t.elapsed()
        ));
        let sent_after = balancer.sent();
        assert!(sent_after.iter().zip(&sent_before).all(|(after, before)| after > before), "{sent_after:?}");
    }
    let restart_ended = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    let samples = load.stop().await;
    let ended = Instant::now();

    // The rotation followed readiness: each replica left it once (SIGTERM fails /readyz first)
    // and came back once, A before B.
    let mut changes: Vec<(usize, bool)> =
        balancer.rotation_changes().iter().map(|c| (c.replica, c.ready)).collect();
    changes[..2].sort(); // both joined at the start, in either order
    assert_eq!(changes, [(0, true), (1, true), (0, false), (0, true), (1, false), (1, true)]);
    assert_no_failures(&samples);
    // A replica enters the rotation only once it has CPU rates (`/readyz` check
    // `metric-storage-ready`): no metrics.k8s.io list is short, before, during or after.
    let short: Vec<&Sample> = samples.iter().filter(|s| s.partial).take(3).collect();
    assert!(short.is_empty(), "{} partial metrics.k8s.io lists, e.g. {short:?}", partials(&samples));
    let (n_before, _, p50_before, p99_before) = summary(&samples, started, restart_began);
    let (n_during, _, p50_during, p99_during) = summary(&samples, restart_began, restart_ended);
    let (n_all, ..) = summary(&samples, started, ended);
    assert!(n_before > 50 && n_during > 100, "the load ran: {n_before} before, {n_during} during");
    println!(
        "\nrolling restart, {CLIENTS} clients over HTTP/2 through the balancer, --shutdown-delay-duration 3s:\n  {}\n  requests: {n_all}, failed: 0, partial metrics.k8s.io lists: {}\n  before: {n_before} requests, p50 {}, p99 {}\n  during the restarts ({:.1?}): {n_during} requests, p50 {}, p99 {}\n  sent per replica: {:?}\n",
        timeline.join("\n  "),
        partials(&samples),
        fmt(p50_before),
        fmt(p99_before),
        restart_ended - restart_began,
        fmt(p50_during),
        fmt(p99_during),
        balancer.sent(),
    );
}

// ---------------------------------------------------------------- reload under load

/// The `--config` file the replicas start with.
const CONFIG_START: &str = include_str!("fixtures/rolling/config-start.yaml");

/// A kind added, the custom metric's query changed (per minute instead of per second).
const CONFIG_EDITED: &str = include_str!("fixtures/rolling/config-edited.yaml");

/// Sum of the custom metric's values over the pods of shop, on one replica.
async fn custom_sum(client: &reqwest::Client, replica: &Replica) -> f64 {
    let v: Value =
        client.get(format!("{}{CUSTOM_RPS}", replica.url)).send().await.unwrap().json().await.unwrap();
    v["items"].as_array().unwrap().iter().map(|i| common::q(&i["value"])).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn configuration_reloads_under_load_lose_no_request() {
    let config_dir = common::mk_dir("rolling-reload-config");
    configmap_write(&config_dir, 1, CONFIG_START);
    let config = config_dir.join("config.yaml").display().to_string();
    let env = Env::start("rolling-reload", options(&["--config", &config])).await;
    let pair = serving_pair(&env.dir.join("serving"));
    let a = env.replica("replica-a", &pair, &[]).await;
    let b = env.replica("replica-b", &pair, &[]).await;
    let balancer = start_balancer(&env, &pair, &[&a, &b]).await;
    let app_traffic = format!("{STATS}/namespaces/shop/apptraffics");
    let paths = [PMS_ALL, CAFES_SHOP, POD_METRICS, CUSTOM_RPS, EXTERNAL_BREWS, app_traffic.as_str()];
    let targets = targets_of(&balancer_client(), balancer.url(), &paths, true).await;
    let direct = aggregator_client(&env, &pair.pem);
    let per_second = [custom_sum(&direct, &a).await, custom_sum(&direct, &b).await];
    assert!(per_second.iter().all(|v| *v > 0.0), "{per_second:?}");

    let load = Load::start(balancer.url(), &targets, CLIENTS, balancer_client);
    tokio::time::sleep(Duration::from_secs(4)).await;

    // A kind added and a query changed: served by both replicas within the reload period.
    configmap_write(&config_dir, 2, CONFIG_EDITED);
    let written = Instant::now();
    let error_traffic = format!("{STATS}/namespaces/shop/errortraffics");
    let mut served_after = Vec::new();
    for replica in [&a, &b] {
        loop {
            let discovery: Value =
                direct.get(format!("{}{STATS}", replica.url)).send().await.unwrap().json().await.unwrap();
            let listed =
                discovery["resources"].as_array().unwrap().iter().any(|r| r["name"] == "errortraffics");
            let r = direct.get(format!("{}{error_traffic}", replica.url)).send().await.unwrap();
            if listed && r.status() == 200 {
                let list: Value = r.json().await.unwrap();
                assert_eq!(list["kind"], "ErrorTrafficList");
                break;
            }
            assert!(written.elapsed() < Duration::from_secs(15), "{}: ErrorTraffic not served", replica.name);
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        served_after.push(written.elapsed());
    }
    // The changed query: 60 times the value (rates move a little between two reads).
    let mut per_minute = Vec::new();
    for (replica, before) in [&a, &b].into_iter().zip(per_second) {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let now = custom_sum(&direct, replica).await;
            if (now / before - 60.0).abs() < 6.0 {
                per_minute.push(now);
                break;
            }
            assert!(Instant::now() < deadline, "{}: {now} is not 60 × {before}", replica.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Both replicas now, through the balancer too.
    let added = targets_of(&balancer_client(), balancer.url(), &[error_traffic.as_str()], false).await;
    assert_eq!(added[0].kind, "ErrorTrafficList");

    // An invalid edit: rejected on both replicas, the last good configuration stays.
    configmap_write(&config_dir, 3, &CONFIG_EDITED.replace("* 60", "* on(")); // PromQL syntax error
    for replica in [&a, &b] {
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let metrics =
                direct.get(format!("{}/metrics", replica.url)).send().await.unwrap().text().await.unwrap();
            if metrics.contains("percolator_config_reloads_total{file=\"config\",result=\"failure\"} 1") {
                assert!(metrics.contains("percolator_config_last_reload_successful{file=\"config\"} 0"));
                break;
            }
            assert!(Instant::now() < deadline, "{}: the invalid file was not rejected", replica.name);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        assert_eq!(direct.get(format!("{}{error_traffic}", replica.url)).send().await.unwrap().status(), 200);
        let now = custom_sum(&direct, replica).await;
        assert!(now > 30.0 * per_second[0], "{}: the changed query stays in force ({now})", replica.name);
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = load.stop().await;
    assert_no_failures(&samples);
    let (n, _, p50, p99) = summary(&samples, written - Duration::from_secs(4), Instant::now());
    println!(
        "\nreload under load ({CLIENTS} clients, two replicas, --config polled every 2 s):\n  ErrorTraffic served (discovery + list) by replica-a {:.1?}, replica-b {:.1?} after the write\n  custom metric sum in shop: {:.3}/s → {:.1}/min (a), {:.3}/s → {:.1}/min (b)\n  invalid edit rejected on both, last good kept\n  requests: {n}, failed: 0, partial metrics.k8s.io lists: {}, p50 {}, p99 {}\n",
        served_after[0],
        served_after[1],
        per_second[0],
        per_minute[0],
        per_second[1],
        per_minute[1],
        partials(&samples),
        fmt(p50),
        fmt(p99),
    );
    // The reload period is 2 s: both within it and some slack for the loaded machine.
    assert!(served_after.iter().all(|t| *t < Duration::from_secs(8)), "{served_after:?}");
}

// ---------------------------------------------------------------- kube-apiserver outage

/// A GET as `user` (group viewers) through the front-proxy client; status, body and how long
/// it took.
async fn get_as(client: &reqwest::Client, url: &str, user: &str) -> (u16, Value, Duration) {
    let t = Instant::now();
    let r =
        client.get(url).header("x-remote-user", user).header("x-remote-group", GROUP).send().await.unwrap();
    let status = r.status().as_u16();
    let body = r.text().await.unwrap();
    (status, serde_json::from_str(&body).unwrap_or(Value::String(body)), t.elapsed())
}

/// The names of the items of a list.
fn names(list: &Value) -> Vec<String> {
    let mut names: Vec<String> = list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread")]
async fn a_kube_apiserver_outage_keeps_known_identities_served() {
    const OUTAGE: Duration = Duration::from_secs(30);
    let env = Env::start(
        "rolling-outage",
        options(&[
            "--authorization-webhook-cache-authorized-ttl=5s",
            "--authorization-webhook-cache-unauthorized-ttl=5s",
            "--request-timeout=20s",
        ]),
    )
    .await;
    let ca = std::fs::read(env.dir.join("certs/apiserver.crt")).unwrap();
    // One client for the load's identity, another for the requests naming other identities.
    let known = aggregator_client(&env, &ca);
    let front = aggregator_client(&env, &ca);
    let paths = [PMS_ALL, CAFES_SHOP, POD_METRICS, NODE_METRICS, CUSTOM_RPS, EXTERNAL_BREWS];
    let targets = targets_of(&known, &env.url, &paths, false).await;
    let ns_list = |ns: &str| format!("{}{STATS}/namespaces/{ns}/podmetricssummaries", env.url);
    // The namespaces' lists too (the churned pod's namespace is read during the outage): a
    // decision made before the outage is one percolator knows.
    let namespaced: Vec<String> = ["shop", "api", "default"]
        .iter()
        .map(|ns| format!("{STATS}/namespaces/{ns}/podmetricssummaries"))
        .collect();
    let mut targets = targets;
    targets.extend(
        targets_of(&known, &env.url, &namespaced.iter().map(String::as_str).collect::<Vec<_>>(), false).await,
    );
    let known_client = known.clone();
    let load = Load::start(&env.url, &targets, 3, move || known_client.clone());
    tokio::time::sleep(Duration::from_secs(3)).await;

    env.set_faults(r#"{"api": "down"}"#).await;
    let down = Instant::now();
    // A pod replaced while the API is unreachable: percolator cannot know yet.
    let churn = env.churn().await;
    let (ns, created) =
        (churn["created"]["namespace"].as_str().unwrap(), churn["created"]["name"].as_str().unwrap());
    let deleted = churn["deleted"]["name"].as_str().unwrap();
    let mut new_identities = Vec::new();
    let mut n = 0;
    while down.elapsed() < OUTAGE {
        n += 1;
        // Someone percolator never authorized: 503, never a 500 or a hang.
        let (status, body, took) =
            get_as(&front, &format!("{}{PMS_SHOP}", env.url), &format!("newcomer-{n}")).await;
        assert_eq!(status, 503, "{body}");
        assert_eq!(body["kind"], "Status");
        assert_eq!(body["reason"], "ServiceUnavailable");
        assert_eq!(
            body["message"],
            "the authorizer is unavailable: kube-apiserver cannot be reached for a SubjectAccessReview of this request; try again later"
        );
        assert!(took < Duration::from_secs(15), "a new identity waited {took:?}");
        new_identities.push(took);
        // Still ready and alive: an outage of the API is no reason to leave the rotation.
        let anonymous = env.client_as(None);
        assert_eq!(anonymous.get(format!("{}/readyz", env.url)).send().await.unwrap().status(), 200);
        // The last known state: the deleted pod still listed, the new one not yet.
        let (status, list, _) = get_as(&front, &ns_list(ns), USER).await;
        assert_eq!(status, 200, "{list}");
        assert!(names(&list).contains(&deleted.to_owned()) && !names(&list).contains(&created.to_owned()));
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let sim_state = env.set_faults(r#"{"api": "up"}"#).await;
    let up = Instant::now();
    assert!(sim_state["apiConnectionsReset"].as_u64().unwrap() > 0, "{sim_state}");

    // The inventory catches up: the replaced pod gone, its replacement listed.
    let caught_up = loop {
        let (status, list, _) = get_as(&front, &ns_list(ns), USER).await;
        assert_eq!(status, 200, "{list}");
        let listed = names(&list);
        if listed.contains(&created.to_owned()) && !listed.contains(&deleted.to_owned()) {
            break up.elapsed();
        }
        assert!(up.elapsed() < Duration::from_secs(20), "the inventory did not catch up: {listed:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    // A new identity is authorized again.
    let authorized = loop {
        let (status, body, _) = get_as(&front, &format!("{}{PMS_SHOP}", env.url), "newcomer-after").await;
        if status == 200 {
            break up.elapsed();
        }
        assert_eq!(status, 503, "{body}");
        assert!(up.elapsed() < Duration::from_secs(20), "new identities still refused: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let samples = load.stop().await;
    assert_no_failures(&samples);
    let (n_during, _, p50, p99) = summary(&samples, down, up);
    assert!(n_during > 100, "the load ran during the outage: {n_during}");
    let slowest = new_identities.iter().max().unwrap();
    println!(
        "\nkube-apiserver unreachable for {OUTAGE:?} (SubjectAccessReview TTL 5 s, cache TTL 2 s):\n  known identity: {n_during} requests during the outage, failed: 0, partial metrics.k8s.io lists: {}, p50 {}, p99 {}\n  new identities: {} refused 503 ServiceUnavailable, slowest answer {slowest:.1?}\n  after the API returned: replaced pod listed {caught_up:.1?}, new identity authorized {authorized:.1?}\n",
        partials(&samples),
        fmt(p50),
        fmt(p99),
        new_identities.len(),
    );
    // Caught up within the re-watch backoff's cap (4 s, plus jitter) and one cache TTL.
    assert!(caught_up < Duration::from_secs(10), "{caught_up:?}");
}
