//! Faults the simulator cannot make (issue 53, part 5): packets silently dropped on a real
//! network path. The simulated kube-apiserver and kubelets and a real Prometheus run in a
//! network namespace of their own, percolator and the test in another, joined by one veth pair
//! (`tests/common/netns.rs`); a fault drops packets on that veth (a `blackhole` queue, so a
//! SYN is never answered, never refused, and nothing is reset):
//!
//! - node-0's kubelet, then Prometheus, blackholed in both directions, each in turn;
//! - kube-apiserver blackholed (reviews, watches), a pod replaced meanwhile;
//! - kube-apiserver blackholed and its end of every connection closed (`ss -K`, the resets
//!   dropped), a pod replaced meanwhile: percolator's watches left on dead connections that
//!   nothing resets once the fault is lifted;
//! - a one-way partition: what kube-apiserver, Prometheus and node-0's kubelet send is
//!   dropped, what percolator sends them arrives.
//!
//! For each, under a steady load that does not wait for its answers, the test asserts the
//! documented behaviour: the upstream timeouts are honoured (`--kubelet-request-timeout`,
//! `--prometheus-timeout`, the 10 s budget of a review); lists keep every object and omit the
//! fields of the silent source with a `Warning` that says it timed out; known identities keep
//! their last decisions (allowed and denied alike), a new one gets `503` with `Retry-After`,
//! at once once the API is known to be unreachable; discovery, health and `/readyz` stay 200
//! and fast; nothing piles up while the fault lasts (requests in flight, tokio tasks and open
//! descriptors, read from `/metrics`, against the same load without a fault; calls to the
//! silent upstream no more frequent than without a fault); and everything comes back within a
//! bound once the fault is lifted, leaving no task or descriptor behind. For the watches on
//! dead connections, without a load: the inventory served as last known, then the replaced
//! pod listed within the bound of a silent watch (`docs/reference/flags.md`: given up 65 s
//! after its last event at most, then watched again within the re-watch backoff).
//!
//! Needs root, `ip` and `tc` (network namespaces, veth, HTB, u32, blackhole), and `ss -K` for
//! the dead connections: where the machine does not allow them each test prints `SKIPPED: …`
//! on stderr, past the harness' capture, and returns. `cargo test --test e2e_netns --
//! --nocapture` prints the figures of RELIABILITY.md.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use common::netns::{self, ADMIN, Answer, Direction, Endpoint, NetEnv, Observed, Sampler, Side, Who};
use serde_json::Value;

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
const PMS: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries";
const PMS_SHOP: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries";
const BREWS: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/cafebrewstats";
/// Paths that never touch an upstream, read as [`ADMIN`] (no review): kube-aggregator's
/// availability check and the probes.
const STATIC_PATHS: [&str; 7] = ["/healthz", "/readyz", "/livez", "/apis", GV, "/openapi/v2", "/openapi/v3"];

/// The load's identity, and the one whose decisions are reviewed: group `viewers` may read
/// every resource of the group (the simulator's policy).
const TESTER: Who<'static> = ("tester", &["viewers"]);
/// Denied everything by the simulator's policy.
const BOB: Who<'static> = ("bob", &[]);

/// `--kubelet-request-timeout` and `--prometheus-timeout`.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// `--cache-ttl`.
const TTL: Duration = Duration::from_secs(1);
/// The budget of one SubjectAccessReview, retries included (`docs/reference/flags.md`).
const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// What an answer may take beyond the timeout it waits out (TLS, the join, a loaded machine).
const SLACK: Duration = Duration::from_millis(1500);
/// Bound on discovery, OpenAPI and health, whatever the upstreams do.
const FAST: Duration = Duration::from_secs(1);
/// How long each fault lasts once percolator shows it.
const HOLD: Duration = Duration::from_secs(8);
/// The load: one request every 100 ms, never waiting for the answers.
const LOAD_EVERY: Duration = Duration::from_millis(100);
/// A watch whose connection went silent is given up this long after its last event at most:
/// it asks the server to end it after 60 s and is given 5 s more (`docs/reference/flags.md`).
const SILENT_WATCH_GIVEN_UP: Duration = Duration::from_secs(65);
/// The longest wait between two attempts to list and watch again (`docs/reference/flags.md`).
const MAX_REWATCH_DELAY: Duration = Duration::from_secs(4);

/// Flags of every environment here.
const FLAGS: &[&str] = &[
    "--cache-ttl=1s",
    "--window=1m",
    "--kubelet-request-timeout=2s",
    "--prometheus-timeout=2s",
    "--authorization-webhook-cache-authorized-ttl=2s",
    "--authorization-webhook-cache-unauthorized-ttl=2s",
];

/// A runtime for the part of a test that runs inside its namespace (the outer part needs none).
fn mk_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap()
}

/// Requests in flight that the load alone may keep while each answer takes up to `wait`, plus
/// the test's own requests (sampler, probes, checks).
fn in_flight_bound(wait: Duration) -> f64 {
    (wait.as_secs_f64() / LOAD_EVERY.as_secs_f64()).ceil() + 4.0
}

/// Extra tokio tasks one request in flight may hold (its stream's task, its share of a review
/// or fetch; about one measured): a task left behind per request or per attempt exceeds it.
const TASKS_PER_REQUEST: f64 = 2.0;
/// Extra descriptors a fault may hold at once: connection attempts to the silent upstream
/// still waiting out their timeout (a few measured). The test's requests share one HTTP/2
/// connection, so a descriptor left behind per request or per attempt exceeds it.
const FD_ALLOWANCE: f64 = 12.0;

/// Peaks of (tokio tasks alive, open descriptors, requests in flight) over a span.
type Peaks = (f64, f64, f64);

/// The environment under its load before any fault: a complete list, the peaks of its gauges
/// and how often it calls each data source.
struct Calm {
    list: Observed,
    peaks: Peaks,
    /// Calls per second to the kubelets (all nodes) and to Prometheus.
    kubelet_rate: f64,
    prometheus_rate: f64,
}

/// Waits for a complete list, then lets the load run for 4 s without a fault ([`Calm`]).
async fn mk_calm(env: &NetEnv, sampler: &Sampler) -> Calm {
    let (list, _) = list_until(env, "warm-up", REVIEW_TIMEOUT, Duration::from_secs(40), complete).await;
    let (from, metrics) = (Instant::now(), env.metrics_text().await);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (to, now) = (Instant::now(), env.metrics_text().await);
    let rate = |source: &str| {
        (upstream_calls(&now, source) - upstream_calls(&metrics, source)) / (to - from).as_secs_f64()
    };
    Calm {
        list,
        peaks: sampler.peak(from, to).await,
        kubelet_rate: rate("kubelet"),
        prometheus_rate: rate("prometheus"),
    }
}

/// Pods running on `node` (`namespace/name`), from the simulator's truth.
async fn pods_on(env: &NetEnv, node: &str) -> BTreeSet<String> {
    let truth: Value =
        reqwest::get(format!("{}/sim/truth", env.control)).await.unwrap().json().await.unwrap();
    truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["phase"] == "Running" && p["node"] == node)
        .map(|p| format!("{}/{}", p["namespace"].as_str().unwrap(), p["name"].as_str().unwrap()))
        .collect()
}

fn key(item: &Value) -> String {
    format!(
        "{}/{}",
        item["metadata"]["namespace"].as_str().unwrap(),
        item["metadata"]["name"].as_str().unwrap()
    )
}

/// The PodMetricsSummary list of namespace `ns`.
fn pms_in(ns: &str) -> String {
    format!("{GV}/namespaces/{ns}/podmetricssummaries")
}

/// Names of a list's objects.
fn names(got: &Observed) -> BTreeSet<String> {
    got.items().iter().map(|i| i["metadata"]["name"].as_str().unwrap().to_owned()).collect()
}

/// Whether a `Warning` says its source timed out (a dropped packet is never refused): the
/// kubelet client's "no answer within 2s" on a kept connection or "deadline has elapsed"
/// while connecting, the Prometheus client's "operation timed out".
fn timed_out(warning: &str) -> bool {
    ["no answer within 2s", "deadline has elapsed", "operation timed out"].iter().any(|t| warning.contains(t))
        && !warning.contains("refused")
}

/// The start of node-0's warning when its kubelet cannot be read.
const NODE0_WARNING: &str = "cpu and memory omitted for pods on 1 node: kubelet on node node-0:";

/// node-0's kubelet shows as silent: its pods without cpu or memory, the others with both,
/// and a `Warning` that says the fetch timed out.
#[track_caller]
fn assert_node0_silent(got: &Observed, node0: &BTreeSet<String>) {
    let warning = got.warnings.iter().find(|w| w.contains(NODE0_WARNING));
    assert!(warning.is_some_and(|w| timed_out(w)), "node-0's warning: {:?}", got.warnings);
    for item in got.items() {
        let silent = node0.contains(&key(item));
        assert_eq!(item.get("cpu").is_none(), silent, "{item}");
        assert_eq!(item.get("memory").is_none(), silent, "{item}");
    }
}

/// Prometheus shows as silent: no pod with `requests` or `errors`, and a `Warning` for each
/// that says the query timed out.
#[track_caller]
fn assert_prometheus_silent(got: &Observed) {
    for field in ["requests", "errors"] {
        let warning =
            got.warnings.iter().find(|w| w.contains(&format!("{field} omitted: prometheus unreachable: ")));
        assert!(warning.is_some_and(|w| timed_out(w)), "{field}: {:?}", got.warnings);
    }
    for item in got.items() {
        assert!(item.get("requests").is_none() && item.get("errors").is_none(), "{item}");
    }
}

/// A complete list: no warning, every pod with cpu and memory, some with request rates.
fn complete(got: &Observed) -> bool {
    got.code == 200
        && got.warnings.is_empty()
        && !got.items().is_empty()
        && got.items().iter().all(|i| i.get("cpu").is_some() && i.get("memory").is_some())
        && got.items().iter().any(|i| i.get("requests").is_some())
}

/// Lists pods as [`TESTER`] until `done` holds (within `within`), each answer 200 within
/// `bound`; the last list and how long it took.
async fn list_until(
    env: &NetEnv,
    what: &str,
    bound: Duration,
    within: Duration,
    done: impl Fn(&Observed) -> bool,
) -> (Observed, Duration) {
    let started = Instant::now();
    loop {
        let got = env.get_as(TESTER, PMS).await;
        assert_eq!(got.code, 200, "{what}: {}", got.body);
        assert!(got.latency <= bound, "{what}: a list took {:?} (bound {bound:?})", got.latency);
        if done(&got) {
            return (got, started.elapsed());
        }
        if started.elapsed() > within {
            let body = got.body.to_string();
            panic!(
                "{what}: not within {within:?}; last list: {:?} {}",
                got.warnings,
                &body[..body.len().min(1500)]
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Discovery, OpenAPI and health as [`ADMIN`]: every path 200 within [`FAST`]; the slowest.
async fn assert_static_fast(env: &NetEnv, what: &str) -> Duration {
    let mut slowest = Duration::ZERO;
    for path in STATIC_PATHS {
        let got = env.get_as(ADMIN, path).await;
        assert_eq!(got.code, 200, "{what}: {path}: {}", got.body);
        assert!(got.latency < FAST, "{what}: {path} took {:?}", got.latency);
        slowest = slowest.max(got.latency);
    }
    slowest
}

/// Calls to `source` so far, every outcome (`percolator_upstream_requests_total`).
fn upstream_calls(metrics: &str, source: &str) -> f64 {
    ["success", "timeout", "error", "unreachable"]
        .iter()
        .map(|o| {
            netns::series(
                metrics,
                &format!("percolator_upstream_requests_total{{source=\"{source}\",outcome=\"{o}\"}}"),
            )
        })
        .sum()
}

/// SubjectAccessReviews kube-apiserver has answered so far (the simulator's count).
async fn reviews(env: &NetEnv) -> u64 {
    env.sim_stats().await["apiRequests"]["create subjectaccessreviews"].as_u64().unwrap_or(0)
}

/// The load's answers to requests sent from `from` to `to`.
fn sent_between(answers: &[Answer], from: Instant, to: Instant) -> Vec<&Answer> {
    answers.iter().filter(|a| a.at >= from && a.at < to).collect()
}

/// Every answer of the load 200 within `bound`, each pod list with `count` objects; the
/// slowest.
#[track_caller]
fn assert_answers(what: &str, answers: &[&Answer], bound: Duration, count: usize) -> Duration {
    assert!(!answers.is_empty(), "{what}: the load sent nothing");
    let mut slowest = Duration::ZERO;
    for a in answers {
        assert_eq!(a.got.code, 200, "{what}: {} answered {}", a.path, a.got.body);
        assert!(a.got.latency <= bound, "{what}: {} took {:?} (bound {bound:?})", a.path, a.got.latency);
        if a.path == PMS {
            assert_eq!(a.got.items().len(), count, "{what}: objects kept: {:?}", a.got.warnings);
        }
        slowest = slowest.max(a.got.latency);
    }
    slowest
}

/// Peaks while a fault lasted against the calm ones: no pile-up of requests in flight, tasks
/// or descriptors. `wait` is the longest an answer may wait during the fault.
#[track_caller]
fn assert_no_pile_up(what: &str, calm: Peaks, fault: Peaks, wait: Duration) {
    let (calm_tasks, calm_fds, _) = calm;
    let (tasks, fds, in_flight) = fault;
    let requests = in_flight_bound(wait);
    assert!(in_flight <= requests, "{what}: {in_flight} requests in flight (bound {requests})");
    let task_bound = calm_tasks + TASKS_PER_REQUEST * requests;
    assert!(tasks <= task_bound, "{what}: {tasks} tasks alive (calm {calm_tasks}, bound {task_bound})");
    let fd_bound = calm_fds + FD_ALLOWANCE;
    assert!(fds <= fd_bound, "{what}: {fds} descriptors open (calm {calm_fds}, bound {fd_bound})");
}

/// After a fault and its recovery, under the same load: tasks and descriptors no higher than
/// their calm peaks (and a little: pooled connections come and go). The peaks over 2 s.
async fn assert_nothing_left(what: &str, sampler: &Sampler, calm: Peaks) -> Peaks {
    tokio::time::sleep(Duration::from_secs(1)).await;
    let from = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sampler.peak(from, Instant::now()).await;
    assert!(after.0 <= calm.0 + 4.0, "{what}: {} tasks alive after recovery (calm peak {})", after.0, calm.0);
    assert!(
        after.1 <= calm.1 + 4.0,
        "{what}: {} descriptors open after recovery (calm peak {})",
        after.1,
        calm.1
    );
    after
}

/// While kube-apiserver is known to be unreachable: a new identity gets the 503 at once, a
/// known one its last decision (here bob's denial) at once.
async fn assert_last_decisions(env: &NetEnv, what: &str, n: usize) {
    let user = format!("{what}-{n}");
    let got = env.get_as((&user, &["viewers"]), PMS_SHOP).await;
    assert_authorizer_unavailable(&got);
    assert!(got.latency < FAST, "{what}: a new identity waited {:?}", got.latency);
    let got = env.get_as(BOB, PMS_SHOP).await;
    assert_eq!(got.code, 403, "{what}: bob's last decision: {}", got.body);
    assert!(got.latency < FAST, "{what}: bob waited {:?}", got.latency);
}

/// The 503 a request gets when its decision cannot be reviewed and none is known
/// (`docs/reference/flags.md`).
#[track_caller]
fn assert_authorizer_unavailable(got: &Observed) {
    assert_eq!(got.code, 503, "{}", got.body);
    assert_eq!(got.body["kind"], "Status", "{}", got.body);
    assert_eq!(got.body["reason"], "ServiceUnavailable", "{}", got.body);
    assert_eq!(
        got.body["message"],
        "the authorizer is unavailable: kube-apiserver cannot be reached for a SubjectAccessReview of \
         this request; try again later"
    );
    assert_eq!(got.retry_after.as_deref(), Some("1"), "{}", got.body);
}

/// Asks as new identities (group `viewers`, never reviewed) until one is reviewed (200),
/// within `within`, every answer before it the 503; how long it took.
async fn until_reviewed_again(env: &NetEnv, what: &str, within: Duration) -> Duration {
    let started = Instant::now();
    for n in 0.. {
        let user = format!("{what}-after-{n}");
        let got = env.get_as((&user, &["viewers"]), PMS_SHOP).await;
        if got.code == 200 {
            return started.elapsed();
        }
        assert_authorizer_unavailable(&got);
        assert!(got.latency <= REVIEW_TIMEOUT + SLACK, "{what}: {user} waited {:?}", got.latency);
        assert!(started.elapsed() < within, "{what}: new identities still refused after {within:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    unreachable!()
}

/// The figures of one fault, for RELIABILITY.md.
struct Row {
    fault: String,
    /// From the fault to percolator showing it.
    shown: Duration,
    served: String,
    slowest: Duration,
    slowest_static: Duration,
    calm: Peaks,
    peaks: Peaks,
    upstream: String,
    recovered: String,
}

/// The gauges' peaks after the recovery, against the calm ones.
fn print_after(after: Peaks, calm: Peaks) {
    println!("after: {} tasks, {} descriptors at most (calm peaks {}, {})", after.0, after.1, calm.0, calm.1);
}

fn print_table(title: &str, rows: &[Row]) {
    let mut out = format!(
        "\n{title}\n| fault | shown after | answers while it lasts | slowest answer | \
         discovery/health slowest | peak in flight / tasks / fds (calm) | reaching the upstream | \
         recovery after the lift |\n| --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for r in rows {
        out.push_str(&format!(
            "| {} | {:.1} s | {} | {:.2} s | {} ms | {} / {} / {} ({} / {} / {}) | {} | {} |\n",
            r.fault,
            r.shown.as_secs_f64(),
            r.served,
            r.slowest.as_secs_f64(),
            r.slowest_static.as_millis(),
            r.peaks.2,
            r.peaks.0,
            r.peaks.1,
            r.calm.2,
            r.calm.0,
            r.calm.1,
            r.upstream,
            r.recovered
        ));
    }
    println!("{out}");
}

/// What one blackhole of a data source measured.
struct Blackholed {
    start: Instant,
    lifted: Instant,
    shown: Duration,
    slowest_static: Duration,
    peaks: Peaks,
    /// Calls percolator made to that kind of source while it lasted.
    calls: f64,
    recovered: Duration,
}

/// One blackhole of a data source (node-0's kubelet or Prometheus), both ways: waits until
/// lists show it (`shown`), checks them (`check`) and the static paths for [`HOLD`], lifts it
/// and waits for a complete list. Asserts the bounds every such fault shares.
async fn blackhole_source(
    env: &NetEnv,
    sampler: &Sampler,
    calm: &Calm,
    (endpoint, source): (Endpoint, &str),
    shown: impl Fn(&Observed) -> bool,
    check: impl Fn(&Observed),
) -> Blackholed {
    let list_bound = UPSTREAM_TIMEOUT + SLACK;
    let calls_before = upstream_calls(&env.metrics_text().await, source);
    let (client_drops_before, _) = env.layout.dropped();

    let start = Instant::now();
    let dropping = env.layout.drop_flows(&[endpoint], Direction::Both);
    // A complete list may still be cached for one TTL; the next one waits out the timeout.
    let (first, detected) = list_until(env, source, list_bound, TTL + UPSTREAM_TIMEOUT + SLACK, &shown).await;
    check(&first);
    let mut slowest_static = Duration::ZERO;
    while start.elapsed() < detected + HOLD {
        let got = env.get_as(TESTER, PMS).await;
        assert_eq!(got.code, 200, "{source}: {}", got.body);
        assert!(got.latency <= list_bound, "{source}: a list took {:?}", got.latency);
        assert!(shown(&got), "{source}: a list no longer shows the fault: {:?}", got.warnings);
        check(&got);
        slowest_static = slowest_static.max(assert_static_fast(env, source).await);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let end = Instant::now();
    let calls = upstream_calls(&env.metrics_text().await, source) - calls_before;
    let (client_drops, _) = env.layout.dropped();
    dropping.lift();
    let lifted = Instant::now();
    let (_, recovered) = list_until(env, source, list_bound, TTL + UPSTREAM_TIMEOUT + SLACK, complete).await;

    assert!(client_drops > client_drops_before, "{source}: no packet was dropped");
    let peaks = sampler.peak(start, end).await;
    assert_no_pile_up(source, calm.peaks, peaks, list_bound);
    // No retry storm: the silent source is called no more often than without a fault.
    let (span, rate) = (
        (lifted - start).as_secs_f64(),
        if source == "kubelet" { calm.kubelet_rate } else { calm.prometheus_rate },
    );
    assert!(
        calls <= rate * span * 1.2 + 4.0,
        "{source}: {calls} calls in {span:.1} s, {rate:.1}/s without a fault"
    );
    Blackholed { start, lifted, shown: detected, slowest_static, peaks, calls, recovered }
}

#[test]
fn kubelet_then_prometheus_blackholed() {
    let Some(layout) = netns::mk_inside("kubelet_then_prometheus_blackholed") else { return };
    mk_runtime().block_on(async {
        let env = NetEnv::start("netns-blackholes", layout, FLAGS).await;
        let sampler = env.mk_sampler(Duration::from_millis(200));
        let load = env.mk_load(TESTER, &[PMS, BREWS], LOAD_EVERY);
        let calm = mk_calm(&env, &sampler).await;
        let count = calm.list.items().len();
        let node0 = pods_on(&env, "node-0").await;
        assert!(!node0.is_empty() && node0.len() < count, "node-0 runs some of the pods: {node0:?}");

        let kubelet = blackhole_source(
            &env,
            &sampler,
            &calm,
            (netns::KUBELET_0, "kubelet"),
            |got| got.warned(NODE0_WARNING),
            |got| {
                assert_node0_silent(got, &node0);
                assert!(got.items().iter().any(|i| i.get("requests").is_some()), "Prometheus' fields kept");
            },
        )
        .await;
        let prometheus = blackhole_source(
            &env,
            &sampler,
            &calm,
            (netns::PROMETHEUS, "prometheus"),
            |got| got.warned("requests omitted") && got.warned("errors omitted"),
            |got| {
                assert_prometheus_silent(got);
                assert!(got.items().iter().all(|i| i.get("cpu").is_some() && i.get("memory").is_some()));
            },
        )
        .await;
        let after = assert_nothing_left("after both blackholes", &sampler, calm.peaks).await;
        let answers = load.stop().await;

        let mut rows = Vec::new();
        for (fault, run, rate, served) in [
            (
                "node-0's kubelet blackholed",
                &kubelet,
                calm.kubelet_rate,
                "node-0's pods without cpu/memory, `Warning: cpu and memory omitted for pods on 1 \
                 node: kubelet on node node-0: …` (no answer within 2s / connect deadline elapsed)",
            ),
            (
                "Prometheus blackholed",
                &prometheus,
                calm.prometheus_rate,
                "`requests`/`errors` omitted, `Warning: requests omitted: prometheus unreachable: … \
                 operation timed out`",
            ),
        ] {
            let during = sent_between(&answers, run.start, run.lifted);
            let slowest = assert_answers(fault, &during, UPSTREAM_TIMEOUT + SLACK, count);
            rows.push(Row {
                fault: fault.into(),
                shown: run.shown,
                served: format!("{} answers to the load, all 200 with every object; {served}", during.len()),
                slowest,
                slowest_static: run.slowest_static,
                calm: calm.peaks,
                peaks: run.peaks,
                upstream: format!(
                    "percolator's calls to that kind of source: {} in {:.1} s ({rate:.1}/s without a fault)",
                    run.calls,
                    (run.lifted - run.start).as_secs_f64()
                ),
                recovered: format!("complete list {:.1} s", run.recovered.as_secs_f64()),
            });
        }
        print_after(after, calm.peaks);
        print_table("Blackholes (both directions) of one kubelet, then of Prometheus", &rows);
    });
}

#[test]
fn kube_apiserver_blackholed() {
    let Some(layout) = netns::mk_inside("kube_apiserver_blackholed") else { return };
    mk_runtime().block_on(async {
        let env = NetEnv::start("netns-apiserver", layout, FLAGS).await;
        let sampler = env.mk_sampler(Duration::from_millis(200));
        let load = env.mk_load(TESTER, &[PMS, BREWS], LOAD_EVERY);
        let calm = mk_calm(&env, &sampler).await;
        // Decisions percolator has made before the fault: tester may read each namespace, bob
        // may not.
        let mut known = std::collections::BTreeMap::new();
        for ns in ["shop", "api", "default"] {
            let got = env.get_as(TESTER, &pms_in(ns)).await;
            assert_eq!(got.code, 200, "{}", got.body);
            known.insert(ns.to_owned(), got);
        }
        assert_eq!(env.get_as(BOB, PMS_SHOP).await.code, 403);
        let (client_drops_before, _) = env.layout.dropped();

        let start = Instant::now();
        let dropping = env.layout.drop_flows(&[netns::API], Direction::Both);
        // A pod replaced meanwhile (through the control port, which the fault spares): its
        // watch events are dropped with everything else kube-apiserver sends.
        let (ns, deleted, created) = env.churn().await;
        let reviews_from = reviews(&env).await;
        // The first review after the fault waits out its budget; then percolator knows.
        let first = env.get_as(("newcomer-first", &["viewers"]), PMS_SHOP).await;
        assert_authorizer_unavailable(&first);
        assert!(first.latency <= REVIEW_TIMEOUT + SLACK, "the first new identity waited {:?}", first.latency);
        let shown = start.elapsed();
        let mut slowest_static = Duration::ZERO;
        let mut n = 0;
        while start.elapsed() < shown + HOLD {
            n += 1;
            assert_last_decisions(&env, "newcomer", n).await;
            // The last known state: the deleted pod still listed, the new one not.
            let got = env.get_as(TESTER, &pms_in(&ns)).await;
            assert_eq!(got.code, 200, "{}", got.body);
            assert!(got.latency < FAST, "a known identity waited {:?}", got.latency);
            assert_eq!(names(&got), names(&known[&ns]), "{ns}'s pods as last known");
            assert!(names(&got).contains(&deleted) && !names(&got).contains(&created));
            slowest_static = slowest_static.max(assert_static_fast(&env, "kube-apiserver blackholed").await);
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let end = Instant::now();
        let reviews_during = reviews(&env).await - reviews_from;
        let (client_drops, _) = env.layout.dropped();
        dropping.lift();
        let lifted = Instant::now();

        // A probe under way when the fault is lifted may still wait out its budget.
        let reviewed = until_reviewed_again(&env, "newcomer", REVIEW_TIMEOUT + SLACK + TTL).await;
        let caught_up = loop {
            let got = env.get_as(TESTER, &pms_in(&ns)).await;
            assert_eq!(got.code, 200, "{}", got.body);
            let listed = names(&got);
            if listed.contains(&created) && !listed.contains(&deleted) {
                break lifted.elapsed();
            }
            assert!(lifted.elapsed() < Duration::from_secs(40), "the inventory never caught up: {listed:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let after = assert_nothing_left("after the blackhole", &sampler, calm.peaks).await;
        let answers = load.stop().await;

        assert!(client_drops > client_drops_before, "no packet was dropped");
        assert_eq!(reviews_during, 0, "kube-apiserver received reviews through a blackhole");
        // The watches were never broken, only silent: the events sent during the fault arrive
        // with TCP's next retransmission, whose interval doubles with each one lost, so at
        // most as long after the lift as the fault lasted since the pod was replaced (and one
        // first interval), then a list's TTL. Not within the re-watch backoff: nothing failed
        // that a re-watch would follow.
        let outage = lifted - start;
        let bound = outage + TTL + SLACK;
        assert!(caught_up <= bound, "the replaced pod was listed {caught_up:?} after a fault of {outage:?}");
        // The load: all 200 (the last decisions, every object); the requests sent before
        // percolator knew waited one review budget at most, those after it nothing.
        let count = calm.list.items().len();
        let during = sent_between(&answers, start, lifted);
        let slowest = assert_answers("kube-apiserver blackholed", &during, REVIEW_TIMEOUT + SLACK, count);
        let known_state = sent_between(&answers, start + shown + Duration::from_secs(1), lifted);
        assert_answers("kube-apiserver known unreachable", &known_state, FAST, count);
        let peaks = sampler.peak(start, end).await;
        assert_no_pile_up("kube-apiserver blackholed", calm.peaks, peaks, REVIEW_TIMEOUT + SLACK);
        print_after(after, calm.peaks);
        print_table(
            "kube-apiserver blackholed (both directions), a pod replaced at the start",
            &[Row {
                fault: "kube-apiserver blackholed".into(),
                shown,
                served: format!(
                    "{} answers to the load, all 200 (last decisions; every object, the inventory as \
                     last known); the first new identity 503 after {:.1} s, then {n} new identities 503 \
                     `Retry-After: 1` at once, bob's 403 at once",
                    during.len(),
                    first.latency.as_secs_f64()
                ),
                slowest,
                slowest_static,
                calm: calm.peaks,
                peaks,
                upstream: format!("{reviews_during} reviews"),
                recovered: format!(
                    "new identity reviewed {:.1} s; replaced pod listed {:.1} s (the fault lasted {:.1} s)",
                    reviewed.as_secs_f64(),
                    caught_up.as_secs_f64(),
                    outage.as_secs_f64()
                ),
            }],
        );
    });
}

/// The pods of an all-namespaces list (`namespace/name`).
fn keys(got: &Observed) -> BTreeSet<String> {
    got.items().iter().map(key).collect()
}

// Named to sort first: the harness starts tests in name order, and this one waits longest.
#[test]
fn apiserver_connections_killed_in_blackhole() {
    let Some(layout) = netns::mk_inside_killing("apiserver_connections_killed_in_blackhole") else {
        return;
    };
    mk_runtime().block_on(async {
        let env = NetEnv::start("netns-killed", layout, FLAGS).await;
        list_until(&env, "warm-up", REVIEW_TIMEOUT, Duration::from_secs(40), complete).await;
        // Read as ADMIN from here on: no review, so nothing waits on kube-apiserver but the
        // inventory.
        let known = env.get_as(ADMIN, PMS).await;
        assert_eq!(known.code, 200, "{}", known.body);
        let known = keys(&known);
        let open = env.layout.connections(Side::Upstream, netns::API);
        // The pod and node watches at least.
        assert!(open.len() >= 2, "kube-apiserver's connections before the fault: {open:?}");
        let (_, upstream_drops_before) = env.layout.dropped();

        let dropping = env.layout.drop_flows(&[netns::API], Direction::Both);
        // Nothing kube-apiserver sends arrives from here on: each watch's last event was
        // received before this instant.
        let blackholed = Instant::now();
        let killed = env.layout.kill_connections(netns::API);
        let left = env.layout.connections(Side::Upstream, netns::API);
        assert!(left.is_empty(), "kube-apiserver's connections still open after `ss -K`: {left:?}");
        let (_, upstream_drops) = env.layout.dropped();
        assert!(
            upstream_drops >= upstream_drops_before + killed.len() as u64,
            "the resets of {} connections closed were not all dropped ({upstream_drops_before} → \
             {upstream_drops} packets)",
            killed.len()
        );
        // percolator's ends of those connections, which no reset reached: its watches among them.
        let percolator_ends = env.layout.connections(Side::Client, netns::API);
        let dead: Vec<_> = killed
            .iter()
            .filter(|k| percolator_ends.iter().any(|p| p.state == "ESTAB" && p.local == k.peer))
            .collect();
        assert!(
            dead.len() >= 2,
            "percolator's ends of the connections closed ({killed:?}) not open: {percolator_ends:?}"
        );
        let (ns, deleted, created) = env.churn().await;
        let mut replaced = known.clone();
        assert!(replaced.remove(&format!("{ns}/{deleted}")), "{ns}/{deleted} was not listed: {known:?}");
        assert!(replaced.insert(format!("{ns}/{created}")), "{ns}/{created} was listed already");

        // While kube-apiserver is silent, and after: the inventory as last known, until a watch
        // is given up and the pods listed again.
        let stale = |what: &str, got: &Observed| {
            assert_eq!(got.code, 200, "{what}: {}", got.body);
            assert!(got.latency < FAST, "{what}: a list took {:?}", got.latency);
            keys(got)
        };
        while blackholed.elapsed() < HOLD {
            let listed = stale("kube-apiserver's connections killed", &env.get_as(ADMIN, PMS).await);
            assert_eq!(listed, known, "the pods while kube-apiserver is silent");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        dropping.lift();
        let lifted = Instant::now();
        let bound = SILENT_WATCH_GIVEN_UP + MAX_REWATCH_DELAY + TTL + SLACK;
        let (mut served_stale, mut slowest) = (0, Duration::ZERO);
        let caught_up = loop {
            let got = env.get_as(ADMIN, PMS).await;
            slowest = slowest.max(got.latency);
            let listed = stale("after the lift", &got);
            if listed == replaced {
                break blackholed.elapsed();
            }
            assert_eq!(listed, known, "the pods after the lift: neither as last known nor as replaced");
            served_stale += 1;
            assert!(
                blackholed.elapsed() <= bound,
                "{ns}/{created} not listed {:.1} s after the blackhole ({:.1} s after it was lifted): a \
                 silent watch should be given up {SILENT_WATCH_GIVEN_UP:?} after its last event, and \
                 watched again within {MAX_REWATCH_DELAY:?}; see {}",
                blackholed.elapsed().as_secs_f64(),
                lifted.elapsed().as_secs_f64(),
                env.dir.join("percolator.log").display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        let reopened = env.layout.connections(Side::Upstream, netns::API);
        assert!(!reopened.is_empty(), "the inventory caught up with no connection to kube-apiserver");
        println!(
            "\nkube-apiserver blackholed, its end of {} connections closed (`ss -K`, the resets \
             dropped; {} of percolator's ends still open), a pod replaced; lifted after {:.1} s: \
             {served_stale} lists after the lift served the inventory as last known (all 200, \
             slowest {} ms); the replaced pod listed {:.1} s after the blackhole, {:.1} s after the \
             lift (bound {:.1} s after the blackhole)",
            killed.len(),
            dead.len(),
            (lifted - blackholed).as_secs_f64(),
            slowest.as_millis(),
            caught_up.as_secs_f64(),
            (caught_up.saturating_sub(lifted - blackholed)).as_secs_f64(),
            bound.as_secs_f64()
        );
    });
}

#[test]
fn one_way_partition() {
    let Some(layout) = netns::mk_inside("one_way_partition") else { return };
    mk_runtime().block_on(async {
        let env = NetEnv::start("netns-one-way", layout, FLAGS).await;
        let sampler = env.mk_sampler(Duration::from_millis(200));
        let load = env.mk_load(TESTER, &[PMS, BREWS], LOAD_EVERY);
        let calm = mk_calm(&env, &sampler).await;
        let count = calm.list.items().len();
        let node0 = pods_on(&env, "node-0").await;
        assert_eq!(env.get_as(TESTER, PMS_SHOP).await.code, 200);
        assert_eq!(env.get_as(BOB, PMS_SHOP).await.code, 403);
        let node0_fetches = |stats: &Value| stats["kubeletFetches"]["node-0"].as_u64().unwrap();
        let before = (reviews(&env).await, node0_fetches(&env.sim_stats().await), env.prometheus_queries());
        let (_, upstream_drops_before) = env.layout.dropped();

        // What kube-apiserver, Prometheus and node-0's kubelet send is lost; what they are sent
        // arrives (on the connections already open: a new one never gets its SYN-ACK).
        let start = Instant::now();
        let dropping =
            env.layout.drop_flows(&[netns::API, netns::PROMETHEUS, netns::KUBELET_0], Direction::RepliesOnly);
        let first = env.get_as(("one-way-first", &["viewers"]), PMS_SHOP).await;
        assert_authorizer_unavailable(&first);
        assert!(first.latency <= REVIEW_TIMEOUT + SLACK, "the first new identity waited {:?}", first.latency);
        let list_bound = UPSTREAM_TIMEOUT + SLACK;
        let silent = |got: &Observed| got.warned(NODE0_WARNING) && got.warned("requests omitted");
        let within = TTL + UPSTREAM_TIMEOUT + SLACK;
        let (_, shown_lists) = list_until(&env, "one-way", list_bound, within, silent).await;
        let shown = start.elapsed();
        let mut slowest_static = Duration::ZERO;
        let mut n = 0;
        while start.elapsed() < shown + HOLD {
            n += 1;
            assert_last_decisions(&env, "one-way", n).await;
            let got = env.get_as(TESTER, PMS).await;
            assert_eq!(got.code, 200, "{}", got.body);
            assert!(got.latency <= list_bound, "a list took {:?}", got.latency);
            assert_eq!(got.items().len(), count, "objects kept");
            assert_node0_silent(&got, &node0);
            assert_prometheus_silent(&got);
            slowest_static = slowest_static.max(assert_static_fast(&env, "one-way").await);
            tokio::time::sleep(Duration::from_millis(400)).await;
        }
        let end = Instant::now();
        let delivered = (
            reviews(&env).await - before.0,
            node0_fetches(&env.sim_stats().await) - before.1,
            env.prometheus_queries() - before.2,
        );
        let (client_drops, upstream_drops) = env.layout.dropped();
        dropping.lift();
        let lifted = Instant::now();

        let reviewed = until_reviewed_again(&env, "one-way", REVIEW_TIMEOUT + SLACK + TTL).await;
        list_until(&env, "after the one-way partition", list_bound, within, complete).await;
        let recovered = lifted.elapsed();
        let after = assert_nothing_left("after the one-way partition", &sampler, calm.peaks).await;
        let answers = load.stop().await;

        assert!(upstream_drops > upstream_drops_before, "no answer was dropped");
        assert_eq!(client_drops, 0, "a request was dropped in a partition of the answers only");
        // Requests arrived (Prometheus logged queries it answered in vain), but only on the
        // connections open when the partition began, one request each before percolator gave
        // up on it: at most one round of queries, one review per pooled connection, one
        // fetch on node-0's kept connection. No retry reaches a source whose answers are lost.
        let (reviews_delivered, fetches_delivered, queries_delivered) = delivered;
        let one_round = (calm.prometheus_rate * TTL.as_secs_f64()).ceil() as usize;
        assert!(queries_delivered >= 1, "no query reached Prometheus: the partition was not one-way");
        let most = 2 * one_round;
        assert!(
            queries_delivered <= most,
            "{queries_delivered} queries reached Prometheus (a round: {one_round})"
        );
        assert!(reviews_delivered <= 4, "{reviews_delivered} reviews reached kube-apiserver");
        assert!(fetches_delivered <= 2, "{fetches_delivered} fetches reached node-0's kubelet");
        // Before percolator knows, a list waits out the review budget, then its sources'.
        let during = sent_between(&answers, start, lifted);
        let slowest = assert_answers("one-way", &during, REVIEW_TIMEOUT + UPSTREAM_TIMEOUT + SLACK, count);
        let peaks = sampler.peak(start, end).await;
        assert_no_pile_up("one-way", calm.peaks, peaks, REVIEW_TIMEOUT + UPSTREAM_TIMEOUT + SLACK);
        print_after(after, calm.peaks);
        print_table(
            "One-way partition: what kube-apiserver, Prometheus and node-0's kubelet send is dropped",
            &[Row {
                fault: "one-way (answers dropped)".into(),
                shown,
                served: format!(
                    "{} answers to the load, all 200 with every object; after the first new \
                     identity's 503 ({:.1} s), lists without node-0's cpu/memory and without \
                     `requests`/`errors` (timeouts) within {:.1} s, {n} new identities 503 at once, \
                     bob's 403 at once",
                    during.len(),
                    first.latency.as_secs_f64(),
                    shown_lists.as_secs_f64()
                ),
                slowest,
                slowest_static,
                calm: calm.peaks,
                peaks,
                upstream: format!(
                    "received: {reviews_delivered} reviews, {fetches_delivered} node-0 fetches, \
                     {queries_delivered} queries (a round: {one_round})"
                ),
                recovered: format!(
                    "new identity reviewed {:.1} s; complete list {:.1} s",
                    reviewed.as_secs_f64(),
                    recovered.as_secs_f64()
                ),
            }],
        );
    });
}
