//! Cluster-scale benchmarks (BENCHMARKS.md): starts `percolator-sim` at a given size, a real
//! Prometheus scraping it (history backfilled with promtool), and percolator (release
//! builds), then measures B1–B9 with baselines taken in the same run:
//!
//! - B1 cold `list` latency (one namespace, all namespaces) vs the same upstream work done
//!   directly (the PromQL queries plus the kubelet fetches);
//! - B2 warm `get`, namespaced `list` and namespaced `list` with a `labelSelector` (`app=worker`,
//!   1/12 of the pods) throughput and p50/p99 over HTTPS keep-alive (HTTP/1.1, HTTP/2), each
//!   with a bearer token (h2load) and with the front proxy's client certificate carrying
//!   `X-Remote-User`/`X-Remote-Group` as the aggregator sends them (`cluster/loadgen.rs`: h2load cannot
//!   present a client certificate), vs a bare rustls+hyper server returning the same bytes
//!   with the same client identity method (for the certificate rows it requires a client
//!   certificate from the same CA); medians of alternating rounds (percolator, then bare);
//!   each side's CPU time per request too (percolator's process; the bare server's only on
//!   the h2load rows, since on the loadgen rows the bench process also drives the load): how
//!   much more work a request is for percolator than for the bare server (on a loaded 2-core
//!   machine it moves by ±30% between runs, as scheduling changes how requests batch);
//! - B3 resident memory per pod after the inventory and caches are full, and the marginal
//!   cost per pod over a minimal cluster (1 node × 30 pods) measured in the same run;
//! - B4 upstream calls for 1, 10, 100 identical concurrent cold requests;
//! - B5 aggregated discovery p99 while 1,000 cold lists share one HTTP/2 connection;
//! - B6 CPU seconds per cache refresh (a cold all-namespaces list);
//! - B7 a custom metrics `Pods` request over every pod of a namespace, cold vs its PromQL
//!   query done directly, and warm throughput (B2's method);
//! - B8 a declared kind's cold list of every namespace vs its PromQL queries done directly;
//! - B9 CPU seconds per minute of the percolator process (utime + stime) on a server of its
//!   own (default `--cache-ttl`, 15s; `--idle-after=1m` when the binary has the flag): while
//!   a client lists every namespace's PodMetricsSummary every 15 s for 3 minutes ("asked"),
//!   then, the client stopped and `--idle-after` + 30 s (90 s, for a binary without the flag
//!   too) passed, over 2 minutes ("idle"); with the kubelet fetches of each phase, and the
//!   same of `PERCOLATOR_BASELINE_BIN` in the same run when set (about 7 minutes a binary).
//!
//! B1, B4, B5, B6, B7 (cold) and B8 run on a server with a 2 s `--cache-ttl`, and, when the
//! binary has `--idle-after` (background kubelet sampling while requests need kubelet data),
//! with `--idle-after=0s`: kubelets fetched on demand only, so that "cold" is the requests' own
//! work (a sampler would fetch between the bench's requests, and B4's counts would not be
//! exact). The warm server of B2, B3 and B7 (warm) runs with the defaults, as shipped (with
//! `--idle-after`, it samples every node in the background while it is measured). Whether the
//! binary has the flag is read from its `--help`; the report's first line says so.
//!
//! `cargo bench --bench cluster -- [SWITCHES] 1000 10000 150000` (sizes in pods; default 1000
//! 10000). Switches:
//!
//! - `--only=b1,b2,...` runs only the named sections (default all of b1–b9); `--memory-only` is
//!   `--only=b3`;
//! - `--rounds N` (default 3): alternating rounds per B2/B7 throughput row, each measuring
//!   percolator then the bare server; the row reports the medians (the upper one for an even
//!   N), the median ratio and every round's ratio;
//! - `--duration SECS` (default 3): measured seconds per throughput measurement, after 1 s of
//!   warm-up that is not counted (the B2 section of one size takes about 6 minutes);
//! - `--loadgen-check`: also measures every token row with `cluster/loadgen.rs` (rows `B2 check` and
//!   `B7 check`), to compare its ratio with h2load's;
//! - `--resource-source=prometheus` measures, in that mode (the simulator with `--cadvisor`,
//!   no kubelet connection), B1 against the raw PromQL of the same list and B3.
//!
//! The environment variable `PERCOLATOR_BIN` names the percolator binary to measure (default:
//! this build's); the report's first line names it. `PERCOLATOR_BASELINE_BIN` names B9's
//! baseline binary (e.g. a build of an older commit), measured after it in the same run: the
//! B9 rows then give both figures and the ratio. percolator runs with the environment the
//! container image gives it (the Dockerfile's `ENV` lines, e.g. `MIMALLOC_PURGE_DELAY=0`)
//! unless the bench's own environment sets the same variable.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The load generator of the client-certificate rows.
#[path = "cluster/loadgen.rs"]
mod loadgen;

use percolator_sim::devenv::{self, Prometheus, PrometheusOptions, ScrapeJob};
use percolator_sim::{launch, procfs};
use serde_json::Value;
use tokio::process::{Child, Command};

/// The bare baseline server runs in this process: same allocator as percolator's binary.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

const PODS_PER_NODE: u32 = 30;
/// Above this size, Prometheus gets three minutes of backfilled history instead of ten.
const LARGE_PODS: u32 = 20_000;
const NAMESPACES: usize = 10;
const SCRAPE: Duration = Duration::from_secs(15);
const TOKEN: &str = "tester-token";
/// How long the simulator and percolator may take to be ready (20,000 pods take minutes).
const START_TIMEOUT: Duration = Duration::from_secs(600);
/// The user and group the simulator's TokenReview gives [`TOKEN`] (its built-in policy lets the
/// group `viewers` get and list every served API): what the front proxy rows send as
/// `X-Remote-User`/`X-Remote-Group`.
const TOKEN_USER: &str = "tester";
const TOKEN_GROUP: &str = "viewers";
/// The CN of the front proxy's client certificate, allowed by `--requestheader-allowed-names`.
const FRONT_PROXY_CN: &str = "front-proxy-client";
/// B2's selected list: `app=worker` is one pod in twelve (the simulator's workload).
const SELECTOR: &str = "app%3Dworker";
const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
/// The kind B8 declares: one object per pod with PodMetricsSummary's request and error rates.
const DECLARED_KIND: &str = "kinds:
- kind: PodTraffic
  nameLabel: pod
  fields:
  - name: requests
    query: sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))
    column: REQ/S
  - name: errors
    query: sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))
    column: ERR/S
";

struct Sim {
    /// Killed on drop.
    _child: Child,
    state: PathBuf,
    metrics: String,
}

struct Server {
    /// Killed on drop.
    _child: Child,
    url: String,
    pid: u32,
}

/// B7's request: the HPA's `Pods` metric over every pod of `ns`.
fn pods_metric(base: &str, ns: &str) -> String {
    format!("{base}/apis/custom.metrics.k8s.io/v1beta2/namespaces/{ns}/pods/*/http_requests_per_second")
}

/// The percolator binary measured: `PERCOLATOR_BIN`, or this build's.
fn percolator_bin() -> PathBuf {
    std::env::var_os("PERCOLATOR_BIN")
        .map_or_else(|| PathBuf::from(env!("CARGO_BIN_EXE_percolator")), PathBuf::from)
}

/// B9's baseline binary, measured in the same run after the measured one: `PERCOLATOR_BASELINE_BIN`.
fn baseline_bin() -> Option<PathBuf> {
    std::env::var_os("PERCOLATOR_BASELINE_BIN").filter(|v| !v.is_empty()).map(PathBuf::from)
}

/// Whether `bin` has `--idle-after` (background kubelet sampling while requests need kubelet
/// data), read from its `--help`: commits before it fetch only on demand.
fn supports_idle_after(bin: &Path) -> bool {
    let out = std::process::Command::new(bin)
        .arg("--help")
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", bin.display()));
    assert!(
        out.status.success(),
        "{} --help failed: {}",
        bin.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).contains("--idle-after")
}

/// The environment the container image gives percolator: the Dockerfile's `ENV` lines.
/// percolator runs with it, so that it is measured as it ships, except where the bench's own
/// environment (which percolator inherits) sets the same variable, e.g.
/// `MIMALLOC_PURGE_DELAY=10` to measure mimalloc's default.
fn image_env() -> Vec<(String, String)> {
    include_str!("../Dockerfile")
        .lines()
        .filter_map(|line| line.trim().strip_prefix("ENV "))
        .filter_map(|assignment| assignment.split_once('='))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().trim_matches('"').to_owned()))
        .collect()
}

/// The image's variables the bench's environment does not set itself.
fn shipped_env() -> Vec<(String, String)> {
    image_env().into_iter().filter(|(name, _)| std::env::var_os(name).is_none()).collect()
}

/// The report's account of the image's environment in this run.
fn describe_env() -> String {
    let described: Vec<String> = image_env()
        .into_iter()
        .map(|(name, image)| match std::env::var(&name) {
            Ok(own) => format!("`{name}={own}` (set by the bench's environment; the image sets `{image}`)"),
            Err(_) => format!("`{name}={image}` (as the image sets it)"),
        })
        .collect();
    if described.is_empty() { "none from the image".to_owned() } else { described.join(", ") }
}

fn namespaces() -> String {
    (0..NAMESPACES).map(|i| format!("ns-{i}")).collect::<Vec<_>>().join(",")
}

/// Where percolator reads CPU and memory in a run.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Mode {
    Kubelet,
    Prometheus,
}

/// The default `resourceQueries` container queries for `namespace` (all when `None`).
fn resource_queries(namespace: Option<&str>) -> [String; 2] {
    let scope = namespace.map(|ns| format!(",namespace=\"{ns}\"")).unwrap_or_default();
    [
        format!(
            "sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{{container!=\"\",container!=\"POD\"{scope}}}[1m]))"
        ),
        format!(
            "sum by (namespace, pod, container) (container_memory_working_set_bytes{{container!=\"\",container!=\"POD\"{scope}}})"
        ),
    ]
}

async fn start_sim(dir: &Path, pods: u32, mode: Mode) -> Sim {
    let nodes = pods.div_ceil(PODS_PER_NODE);
    let state = dir.join("sim");
    let mut command = percolator_sim::command(dir).unwrap();
    command
        .args(["--nodes", &nodes.to_string(), "--pods-per-node", &PODS_PER_NODE.to_string()])
        .args(["--namespaces", &namespaces(), "--cafes-per-namespace", "2", "--housekeeping", "10s"])
        .args((mode == Mode::Prometheus).then_some("--cadvisor"));
    let (child, ready) = launch::start_sim(command, START_TIMEOUT).await.unwrap_or_else(|e| panic!("{e}"));
    Sim { _child: child, state, metrics: ready["metrics"].as_str().unwrap().to_string() }
}

async fn start_prometheus(dir: &Path, sim: &Sim, pods: u32) -> Prometheus {
    let target = sim.metrics.trim_start_matches("http://").to_string();
    // Ten minutes of history, three at sizes where backfilling ten would take longest (two
    // samples are enough for every rate over the 5-minute window).
    let span = Duration::from_secs(if pods > LARGE_PODS { 180 } else { 600 });
    let history = devenv::sim_history(&sim.metrics, "sim-apps", &target, span, SCRAPE).await.unwrap();
    let prometheus = Prometheus::start(PrometheusOptions {
        dir: dir.join("prometheus"),
        jobs: vec![ScrapeJob::http("sim-apps", target)],
        scrape_interval: SCRAPE,
        backfill: Some(history),
    })
    .await
    .unwrap();
    prometheus.wait_for_targets(Duration::from_secs(300)).await.unwrap();
    prometheus
}

/// Starts the percolator binary `bin` ([`percolator_bin`], or B9's baseline) on the simulator.
async fn start_percolator(
    bin: &Path,
    dir: &Path,
    sim: &Sim,
    prometheus: &Prometheus,
    cache_ttl: &str,
    tag: &str,
    extra: &[String],
) -> Server {
    let log = dir.join(format!("percolator-{tag}.log"));
    let mut command = launch::percolator_command(bin, 0, &sim.state.join("kubeconfig"), &prometheus.url());
    command
        .envs(shipped_env())
        .args(["-v", "1", "--cert-dir"])
        .arg(dir.join("certs"))
        .args(["--cache-ttl", cache_ttl])
        // B5 puts 1,000 lists on one connection on purpose: no in-flight limit here.
        .args(["--max-requests-inflight", "0", "--http2-max-streams-per-connection", "2000"])
        .args(extra);
    let launch::Started { child, pid, address } =
        launch::start(command, tag, START_TIMEOUT, launch::log_file(&log))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
    let server = Server { _child: child, url: format!("https://{address}"), pid };
    let client = mk_client(dir);
    assert!(launch::wait_ready(&client, &server.url, START_TIMEOUT).await, "percolator never became ready");
    server
}

fn mk_client(dir: &Path) -> reqwest::Client {
    let ca = std::fs::read(dir.join("certs/apiserver.crt")).unwrap();
    let mut headers = reqwest::header::HeaderMap::new();
    headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
    reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
        .default_headers(headers)
        .timeout(Duration::from_secs(300))
        .build()
        .unwrap()
}

/// `field` (KiB) of `/proc/<pid>/status`; 0 once the process is gone.
fn proc_status_kb(pid: u32, field: &str) -> u64 {
    procfs::status_number(pid, field).unwrap_or(0)
}

/// CPU seconds (user and system) `pid` has used; 0 once it is gone.
fn cpu_seconds(pid: u32) -> f64 {
    procfs::cpu_seconds(pid).unwrap_or(0.0)
}

async fn timed_get(client: &reqwest::Client, url: &str) -> (Duration, usize) {
    let started = Instant::now();
    let response = client.get(url).send().await.unwrap();
    assert!(response.status().is_success(), "{url}: {}", response.status());
    let body = response.bytes().await.unwrap();
    (started.elapsed(), body.len())
}

/// Five rounds, each once the cache entry of `url` has expired (`ttl`): a cold GET of `url`,
/// then the upstream work it stands for done directly (`direct`). The medians in ms (cold,
/// direct) and the size of the last answer.
async fn cold_against_direct<F: Future<Output = Duration>>(
    client: &reqwest::Client,
    url: &str,
    ttl: Duration,
    direct: impl Fn() -> F,
) -> (f64, f64, usize) {
    let (mut cold, mut directs, mut size) = (vec![], vec![], 0);
    for _ in 0..5 {
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        let (elapsed, bytes) = timed_get(client, url).await;
        size = bytes;
        cold.push(elapsed.as_secs_f64() * 1000.0);
        directs.push(direct().await.as_secs_f64() * 1000.0);
    }
    (median(cold), median(directs), size)
}

fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    values[values.len() / 2]
}

fn percentile(values: &mut [f64], p: f64) -> f64 {
    values.sort_by(f64::total_cmp);
    let index = ((values.len() as f64 - 1.0) * p).round() as usize;
    values[index]
}

/// The upstream work of one cold list, done directly: the two PromQL queries and the kubelet
/// fetches of the nodes involved, all in parallel (64 kubelets at a time, like percolator).
async fn direct_upstream(
    prometheus: &str,
    namespace: Option<&str>,
    kubelets: &[String],
    token: &str,
    ca: &[u8],
    extra_queries: &[String],
) -> Duration {
    let prom = reqwest::Client::new();
    let kubelet = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca).unwrap())
        .build()
        .unwrap();
    let scope = namespace.map(|ns| format!("namespace=\"{ns}\"")).unwrap_or_default();
    let mut queries = vec![
        format!("sum by (namespace, pod) (rate(http_requests_total{{{scope}}}[5m]))"),
        format!("sum by (namespace, pod) (rate(http_requests_total{{code=~\"5..\",{scope}}}[5m]))"),
    ];
    queries.extend(extra_queries.iter().cloned());
    let started = Instant::now();
    let semaphore = Arc::new(tokio::sync::Semaphore::new(64));
    let fetches = kubelets.iter().map(|url| {
        let (kubelet, semaphore) = (kubelet.clone(), semaphore.clone());
        let url = url.clone();
        let token = token.to_string();
        async move {
            let _permit = semaphore.acquire().await.unwrap();
            kubelet.get(url).bearer_auth(token).send().await.unwrap().bytes().await.unwrap().len()
        }
    });
    let promql = queries.iter().map(|q| {
        let prom = prom.clone();
        let url = format!("{prometheus}/api/v1/query");
        async move {
            prom.get(url).query(&[("query", q.as_str())]).send().await.unwrap().bytes().await.unwrap().len()
        }
    });
    let (_, _) = futures::join!(futures::future::join_all(fetches), futures::future::join_all(promql));
    started.elapsed()
}

/// One PromQL instant query done directly, its body read whole.
async fn direct_promql(prometheus: &str, query: &str) -> Duration {
    let prom = reqwest::Client::new();
    let started = Instant::now();
    let response =
        prom.get(format!("{prometheus}/api/v1/query")).query(&[("query", query)]).send().await.unwrap();
    response.bytes().await.unwrap();
    started.elapsed()
}

/// (requests per second, p50 ms, p99 ms) of one throughput measurement.
type Load = (f64, f64, f64);

/// Runs h2load against `url` with a bearer token (16 connections; HTTP/2: 16 streams each) for
/// `seconds` after 1 s of warm-up, and returns what it measured; asserts that no request
/// failed and every answer was 2xx.
async fn h2load(url: &str, h1: bool, seconds: u64, dir: &Path, tag: &str) -> Load {
    let log = dir.join(format!("h2load-{}.log", tag.replace(['/', ' ', ',', '='], "-")));
    let _ = std::fs::remove_file(&log);
    let mut cmd = Command::new("h2load");
    cmd.args(["-D", &seconds.to_string(), "--warm-up-time=1", "-c", "16", "-m", if h1 { "1" } else { "16" }])
        .args(["-t", "1", "-H", &format!("authorization: Bearer {TOKEN}")])
        .arg("--log-file")
        .arg(&log);
    if h1 {
        cmd.arg("--h1");
    }
    let out = cmd.arg(url).output().await.expect("h2load (Debian nghttp2-client) is installed");
    let text = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    let rps = text
        .lines()
        .find(|l| l.starts_with("finished in"))
        .and_then(|l| l.split(", ").nth(1))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0);
    let failed = text.lines().find(|l| l.starts_with("requests:")).unwrap_or("").to_string();
    assert!(failed.contains(" 0 failed"), "h2load {tag}: {failed}\n{text}");
    let codes = text.lines().find(|l| l.starts_with("status codes:")).unwrap_or("").to_string();
    assert!(codes.contains(" 0 3xx, 0 4xx, 0 5xx"), "h2load {tag}: {codes}\n{text}");
    // Log lines: start-time(us) status duration(us).
    let mut latencies: Vec<f64> = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(2).and_then(|d| d.parse::<f64>().ok()))
        .map(|us| us / 1000.0)
        .collect();
    if latencies.is_empty() {
        return (rps, 0.0, 0.0);
    }
    let p50 = percentile(&mut latencies, 0.5);
    let p99 = percentile(&mut latencies, 0.99);
    (rps, p50, p99)
}

/// A bare rustls + hyper server answering every request with `body`, the ceiling for B2. With
/// `client_ca`, it requires a client certificate signed by that CA (PEM file).
async fn bare_server(dir: &Path, body: bytes::Bytes, client_ca: Option<&Path>) -> String {
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let args: percolator::config::Args =
        clap::Parser::parse_from(["percolator", "--cert-dir", dir.join("certs").to_str().unwrap()]);
    let verifier = client_ca.map(|path| {
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(path).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let verifier: Arc<dyn rustls::server::danger::ClientCertVerifier> =
            rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().unwrap();
        verifier
    });
    let tls = apiserver::server_config(&args.serving, verifier).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else { continue };
            // As percolator's listener does: without it, a large body's last partial segment
            // waits for the client's delayed ACK.
            let _ = tcp.set_nodelay(true);
            let (acceptor, body) = (acceptor.clone(), body.clone());
            tokio::spawn(async move {
                let Ok(stream) = acceptor.accept(tcp).await else { return };
                let service = hyper::service::service_fn(move |_req| {
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            hyper::Response::builder()
                                .header("content-type", "application/json")
                                .body(http_body_util::Full::new(body))
                                .unwrap(),
                        )
                    }
                });
                let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                builder.http2().max_concurrent_streams(1000);
                let _ = builder.serve_connection(TokioIo::new(stream), service).await;
            });
        }
    });
    url
}

/// The front proxy's trust material, made by the bench: a CA and the client certificate the
/// aggregator presents (CN `front-proxy-client`, EKU clientAuth), PEM files.
struct FrontProxy {
    ca: PathBuf,
    cert: PathBuf,
    key: PathBuf,
}

fn mk_front_proxy(dir: &Path) -> FrontProxy {
    let dir = dir.join("front-proxy");
    std::fs::create_dir_all(&dir).unwrap();
    let ca = test_support::mk_ca("bench-front-proxy-ca");
    let client = test_support::mk_cert(&ca, |params| {
        params.distinguished_name.push(rcgen::DnType::CommonName, FRONT_PROXY_CN);
        params.is_ca = rcgen::IsCa::ExplicitNoCa;
        params.key_usages.push(rcgen::KeyUsagePurpose::KeyEncipherment);
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
        params.use_authority_key_identifier_extension = true;
    });
    let front_proxy =
        FrontProxy { ca: dir.join("ca.crt"), cert: dir.join("client.crt"), key: dir.join("client.key") };
    std::fs::write(&front_proxy.ca, &ca.pem).unwrap();
    std::fs::write(&front_proxy.cert, &client.pem).unwrap();
    std::fs::write(&front_proxy.key, &client.key_pem).unwrap();
    front_proxy
}

/// percolator's request-header flags trusting `front_proxy` (as kube-apiserver's aggregator
/// is configured: its CN allowed, the usual headers).
fn request_header_flags(front_proxy: &FrontProxy) -> Vec<String> {
    vec![
        format!("--requestheader-client-ca-file={}", front_proxy.ca.display()),
        format!("--requestheader-allowed-names={FRONT_PROXY_CN}"),
        "--requestheader-username-headers=X-Remote-User".to_owned(),
        "--requestheader-group-headers=X-Remote-Group".to_owned(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".to_owned(),
    ]
}

/// How a B2 client identifies itself.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Identity {
    /// `Authorization: Bearer tester-token` (a TokenReview, cached).
    Token,
    /// The front proxy's client certificate with `X-Remote-User: tester` and the groups
    /// `viewers` and `system:authenticated` in `X-Remote-Group`: what the aggregator sends for
    /// the user behind the token.
    FrontProxy,
}

impl Identity {
    fn describe(self) -> &'static str {
        match self {
            Identity::Token => "token",
            Identity::FrontProxy => "client certificate + X-Remote-*",
        }
    }
}

/// Which load generator measures.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Tool {
    H2load,
    Loadgen,
}

/// What the throughput measurements of one size share.
struct Throughput<'a> {
    dir: &'a Path,
    /// The serving certificate of percolator and the bare servers (PEM).
    server_ca: Vec<u8>,
    front_proxy: &'a FrontProxy,
    rounds: usize,
    seconds: u64,
    /// percolator's process, whose CPU time each of its rounds reads.
    pid: u32,
}

impl Throughput<'_> {
    /// One measurement of `url`; `len` is the body length every answer must have.
    async fn measure(
        &self,
        tool: Tool,
        identity: Identity,
        url: &str,
        h1: bool,
        len: usize,
        tag: &str,
    ) -> Load {
        match tool {
            Tool::H2load => {
                assert_eq!(identity, Identity::Token, "h2load cannot present a client certificate");
                h2load(url, h1, self.seconds, self.dir, tag).await
            }
            Tool::Loadgen => {
                let mut options = loadgen::Options::new(url, !h1, self.server_ca.clone(), len);
                options.duration = Duration::from_secs(self.seconds);
                match identity {
                    Identity::Token => {
                        options.headers.push(("authorization".into(), format!("Bearer {TOKEN}")))
                    }
                    Identity::FrontProxy => {
                        options.client_cert =
                            Some((self.front_proxy.cert.clone(), self.front_proxy.key.clone()));
                        options.headers.extend([
                            ("X-Remote-User".to_owned(), TOKEN_USER.to_owned()),
                            ("X-Remote-Group".to_owned(), TOKEN_GROUP.to_owned()),
                            ("X-Remote-Group".to_owned(), "system:authenticated".to_owned()),
                        ]);
                    }
                }
                let outcome = loadgen::run(options).await;
                eprintln!("loadgen {tag}: {} requests in {} s", outcome.requests, self.seconds);
                (outcome.rps, outcome.p50_ms, outcome.p99_ms)
            }
        }
    }

    /// CPU time per request in microseconds: `seconds` of a process's user + system time over
    /// a whole run (the warm-up second included) over that run's requests (the measured rate
    /// times the run's length), so both sides of a comparison carry the same approximation.
    fn cpu_per_request(&self, seconds: f64, load: Load) -> f64 {
        seconds * 1e6 / (load.0 * (self.seconds + 1) as f64).max(1.0)
    }

    /// `rounds` alternating rounds of percolator's `url` then the bare server's `bare`.
    async fn compare(
        &self,
        tool: Tool,
        identity: Identity,
        urls: (&str, &str),
        h1: bool,
        len: usize,
        tag: &str,
    ) -> Compared {
        let (url, bare) = urls;
        let (mut ours, mut theirs, mut ratios) = (vec![], vec![], vec![]);
        let (mut cpu, mut bare_cpu) = (vec![], vec![]);
        // The bare server runs in this process, which with the loadgen also drives the load:
        // its CPU per request is the bare server's only with h2load.
        let own = std::process::id();
        for round in 0..self.rounds {
            let before = cpu_seconds(self.pid);
            let a = self.measure(tool, identity, url, h1, len, &format!("{tag}-{round}")).await;
            cpu.push(self.cpu_per_request(cpu_seconds(self.pid) - before, a));
            let before = cpu_seconds(own);
            let b = self.measure(tool, identity, bare, h1, len, &format!("bare-{tag}-{round}")).await;
            bare_cpu.push(self.cpu_per_request(cpu_seconds(own) - before, b));
            ratios.push(a.0 / b.0);
            ours.push(a);
            theirs.push(b);
        }
        let medians = |loads: &[Load]| {
            (
                median(loads.iter().map(|l| l.0).collect()),
                median(loads.iter().map(|l| l.1).collect()),
                median(loads.iter().map(|l| l.2).collect()),
            )
        };
        Compared {
            ours: medians(&ours),
            bare: medians(&theirs),
            ratio: median(ratios.clone()),
            ratios,
            cpu_us: median(cpu),
            bare_cpu_us: (tool == Tool::H2load).then(|| median(bare_cpu)),
        }
    }
}

/// Medians over alternating rounds: each side's (req/s, p50, p99) and the rounds' ratios.
struct Compared {
    ours: Load,
    bare: Load,
    ratio: f64,
    ratios: Vec<f64>,
    /// percolator's CPU time per request (µs, median of the rounds).
    cpu_us: f64,
    /// The bare server's, when it can be told apart from the load generator's (h2load rows).
    bare_cpu_us: Option<f64>,
}

impl Compared {
    /// A report row: `measure` is the row's description.
    fn row(&self, section: &str, pods: u32, measure: &str) -> String {
        let ratios = self.ratios.iter().map(|r| format!("{r:.2}")).collect::<Vec<_>>().join(", ");
        let ((rps, p50, p99), (brps, bp50, bp99)) = (self.ours, self.bare);
        let cpu = self.cpu_us;
        let bare_cpu = self.bare_cpu_us.map(|us| format!(", {us:.1} µs CPU/req")).unwrap_or_default();
        format!(
            "| {section} | {pods} | {measure} (round ratios {ratios}) | {rps:.0} req/s, p50 {p50:.2} ms, p99 {p99:.2} ms, {cpu:.1} µs CPU/req | bare {brps:.0} req/s, p50 {bp50:.2} ms, p99 {bp99:.2} ms{bare_cpu} | **{:.2}** |",
            self.ratio
        )
    }
}

async fn kubelet_urls(sim: &Sim) -> Vec<String> {
    let truth: Value =
        reqwest::get(format!("{}/sim/truth", sim.metrics)).await.unwrap().json().await.unwrap();
    let port: Value =
        serde_json::from_str(&std::fs::read_to_string(sim.state.join("sim.json")).unwrap()).unwrap();
    let port = port["kubeletPort"].as_u64().unwrap();
    truth["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| format!("https://{}:{port}/metrics/resource", n["address"].as_str().unwrap()))
        .collect()
}

async fn kubelet_fetches(sim: &Sim) -> u64 {
    let stats: Value =
        reqwest::get(format!("{}/sim/stats", sim.metrics)).await.unwrap().json().await.unwrap();
    stats["kubeletFetches"].as_object().unwrap().values().map(|v| v.as_u64().unwrap()).sum()
}

/// The command line: sizes in pods and switches (see the file header).
struct Settings {
    sizes: Vec<u32>,
    only: BTreeSet<String>,
    rounds: usize,
    seconds: u64,
    loadgen_check: bool,
    prometheus_mode: bool,
}

/// Every section, the default of `--only`.
const SECTIONS: [&str; 9] = ["b1", "b2", "b3", "b4", "b5", "b6", "b7", "b8", "b9"];

impl Settings {
    fn parse(args: impl IntoIterator<Item = String>) -> Self {
        let mut settings = Settings {
            sizes: vec![],
            only: SECTIONS.iter().map(|s| (*s).to_owned()).collect(),
            rounds: 3,
            seconds: 3,
            loadgen_check: false,
            prometheus_mode: false,
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((flag, value)) => (flag.to_owned(), Some(value.to_owned())),
                None => (arg.clone(), None),
            };
            let mut value =
                || inline.clone().or_else(|| args.next()).unwrap_or_else(|| panic!("{flag} needs a value"));
            match flag.as_str() {
                // cargo passes --bench to a bench without the libtest harness.
                "--bench" => {}
                "--memory-only" => settings.only = BTreeSet::from(["b3".to_owned()]),
                "--resource-source" => {
                    assert_eq!(value(), "prometheus", "--resource-source: only prometheus is a switch here");
                    settings.prometheus_mode = true;
                }
                "--only" => {
                    settings.only =
                        value().split(',').filter(|s| !s.is_empty()).map(str::to_lowercase).collect();
                    for s in &settings.only {
                        assert!(SECTIONS.contains(&s.as_str()), "--only: unknown section {s} (b1..b9)");
                    }
                }
                "--rounds" => {
                    settings.rounds = value().parse().expect("--rounds N");
                    assert!(settings.rounds > 0, "--rounds must be at least 1");
                }
                "--duration" => settings.seconds = value().parse().expect("--duration SECS"),
                "--loadgen-check" => settings.loadgen_check = true,
                size if !size.starts_with('-') => settings.sizes.push(size.parse().expect("a size in pods")),
                other => panic!("unknown switch {other}"),
            }
        }
        if settings.sizes.is_empty() {
            settings.sizes = vec![1000, 10000];
        }
        settings
    }

    fn runs(&self, section: &str) -> bool {
        self.only.contains(section)
    }
}

/// The minimal cluster of `mode` first, alone on the machine (when B3 runs and it is not
/// measured yet), then a fresh directory with the simulator of `pods` pods and Prometheus.
async fn start_size(
    settings: &Settings,
    pods: u32,
    mode: Mode,
    min_rss: &mut Option<Rss>,
) -> (PathBuf, Sim, Prometheus) {
    if settings.runs("b3") && min_rss.is_none() {
        *min_rss = Some(minimal_rss(mode).await);
    }
    let (tag, label) = match mode {
        Mode::Kubelet => ("", ""),
        Mode::Prometheus => ("prom-", ", prometheus"),
    };
    let dir = std::env::temp_dir().join(format!("percolator-bench-{tag}{pods}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let started = Instant::now();
    let sim = start_sim(&dir, pods, mode).await;
    let prometheus = start_prometheus(&dir, &sim, pods).await;
    eprintln!("[{pods}{label}] simulator + prometheus ready in {:.0?}", started.elapsed());
    (dir, sim, prometheus)
}

async fn run_size(settings: &Settings, pods: u32, min_rss: &mut Option<Rss>, report: &mut Vec<String>) {
    let (dir, sim, prometheus) = start_size(settings, pods, Mode::Kubelet, min_rss).await;
    let truth: Value =
        reqwest::get(format!("{}/sim/truth", sim.metrics)).await.unwrap().json().await.unwrap();
    let size = Size { settings, dir: &dir, sim: &sim, prometheus: &prometheus, pods, truth: &truth };
    if ["b1", "b4", "b5", "b6", "b7", "b8"].iter().any(|s| settings.runs(s)) {
        cold(size, report).await;
    }
    if ["b2", "b3", "b7"].iter().any(|s| settings.runs(s)) {
        warm(size, min_rss.as_ref(), report).await;
    }
    if settings.runs("b9") {
        b9(&dir, &sim, &prometheus, pods, report).await;
    }
    drop(prometheus);
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}

/// One size's cluster, which the cold and warm sections measure on.
#[derive(Clone, Copy)]
struct Size<'a> {
    settings: &'a Settings,
    dir: &'a Path,
    sim: &'a Sim,
    prometheus: &'a Prometheus,
    pods: u32,
    /// The simulator's truth when the sections start.
    truth: &'a Value,
}

/// B3 (with the marginal rows over `min_rss`), B2 and B7's warm row on the warm server.
async fn warm(size: Size<'_>, min_rss: Option<&Rss>, report: &mut Vec<String>) {
    let Size { settings, dir, sim, prometheus, pods, truth } = size;
    let ns = "ns-3";
    let front_proxy = mk_front_proxy(dir);
    let (server, rss) = warm_server(
        dir,
        sim,
        prometheus,
        Mode::Kubelet,
        &request_header_flags(&front_proxy),
        settings.runs("b3"),
    )
    .await;
    if let Some(rss) = rss {
        report_memory(pods, Mode::Kubelet, &rss, min_rss, report);
    }
    let client = mk_client(dir);
    let throughput = Throughput {
        dir,
        server_ca: std::fs::read(dir.join("certs/apiserver.crt")).unwrap(),
        front_proxy: &front_proxy,
        rounds: settings.rounds,
        seconds: settings.seconds,
        pid: server.pid,
    };

    // B2 on the same server: warm get, namespaced list and selected namespaced list, with a
    // token and with the front proxy's certificate, HTTP/1.1 and HTTP/2, vs a bare server.
    let pod = truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["namespace"] == ns && p["phase"] == "Running")
        .unwrap();
    let list_url = format!("{}{GV}/namespaces/{ns}/podmetricssummaries", server.url);
    let get_url = format!("{list_url}/{}", pod["name"].as_str().unwrap());
    let selected_url = format!("{list_url}?labelSelector={SELECTOR}");
    let mut rows = vec![];
    if settings.runs("b2") {
        let identities = [Identity::Token, Identity::FrontProxy];
        rows.push(("B2", "get".to_owned(), get_url, identities.to_vec()));
        rows.push(("B2", "namespaced list".to_owned(), list_url, identities.to_vec()));
        rows.push((
            "B2",
            "namespaced list, labelSelector app=worker".to_owned(),
            selected_url,
            identities.to_vec(),
        ));
    }
    if settings.runs("b7") {
        // B7's warm row: the Pods metric request of its cold row, answered from the cache.
        rows.push((
            "B7",
            "custom metric, Pods form".to_owned(),
            pods_metric(&server.url, ns),
            vec![Identity::Token],
        ));
    }
    for (section, what, url, identities) in rows {
        let body = client.get(&url).send().await.unwrap().bytes().await.unwrap();
        let len = body.len();
        for identity in identities {
            let bare = match identity {
                Identity::Token => bare_server(dir, body.clone(), None).await,
                Identity::FrontProxy => bare_server(dir, body.clone(), Some(&front_proxy.ca)).await,
            };
            let bare = format!("{bare}/x");
            let tool = if identity == Identity::Token { Tool::H2load } else { Tool::Loadgen };
            for h1 in [true, false] {
                let proto = if h1 { "HTTP/1.1" } else { "HTTP/2" };
                let tag = format!("{what}-{}-{proto}", identity.describe());
                let compared = throughput.compare(tool, identity, (&url, &bare), h1, len, &tag).await;
                let generator = if tool == Tool::H2load { "h2load" } else { "loadgen" };
                let measure =
                    format!("warm {what} ({len} B), {}, {proto}, 16 conns, {generator}", identity.describe());
                report.push(compared.row(section, pods, &measure));
                eprintln!("{}", report.last().unwrap());
                if settings.loadgen_check && tool == Tool::H2load {
                    let compared = throughput
                        .compare(Tool::Loadgen, identity, (&url, &bare), h1, len, &format!("check-{tag}"))
                        .await;
                    let measure =
                        format!("the same with loadgen: warm {what}, {}, {proto}", identity.describe());
                    report.push(compared.row(&format!("{section} check"), pods, &measure));
                    eprintln!("{}", report.last().unwrap());
                }
            }
        }
    }
    drop(server);
}

/// B1, B4, B5, B6, B7 (cold) and B8 on a server with a short TTL: every measurement is cold.
/// A binary with `--idle-after` runs with `--idle-after=0s` (no background sampling: kubelets
/// are fetched only on demand, as before that flag), so that the work measured is the
/// requests' own.
async fn cold(size: Size<'_>, report: &mut Vec<String>) {
    let Size { settings, dir, sim, prometheus, pods, truth } = size;
    let token = std::fs::read_to_string(sim.state.join("token")).unwrap();
    let sim_ca = std::fs::read(sim.state.join("ca.crt")).unwrap();
    let kubelets = kubelet_urls(sim).await;
    let ns = "ns-3";
    let ttl = Duration::from_secs(2);
    // B8's declared kind: PodMetricsSummary's two request-rate fields, per pod, without the
    // kubelet join.
    let config = dir.join("config.yaml");
    std::fs::write(&config, DECLARED_KIND).unwrap();
    let mut declared =
        vec!["--config".to_owned(), config.display().to_string(), "--enable-custom-metrics".to_owned()];
    // Cold means request-driven work: no background sampling, which would fetch kubelets
    // between the requests measured here (and break B4's exact counts).
    if supports_idle_after(&percolator_bin()) {
        declared.push("--idle-after=0s".to_owned());
    }
    let server = start_percolator(&percolator_bin(), dir, sim, prometheus, "2s", "cold", &declared).await;
    let client = mk_client(dir);
    // Let the warm-up fetch finish and the second kubelet sample exist.
    tokio::time::sleep(Duration::from_secs(12)).await;
    let ns_url = format!("{}{GV}/namespaces/{ns}/podmetricssummaries", server.url);
    let all_url = format!("{}{GV}/podmetricssummaries", server.url);
    let ns_nodes: std::collections::BTreeSet<String> = truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["namespace"] == ns && p["phase"] == "Running")
        .map(|p| p["node"].as_str().unwrap().to_string())
        .collect();
    let node_address: BTreeMap<String, String> = truth["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .zip(&kubelets)
        .map(|(n, url)| (n["name"].as_str().unwrap().to_string(), url.clone()))
        .collect();
    let ns_kubelets: Vec<String> = ns_nodes.iter().map(|n| node_address[n].clone()).collect();
    // B8's last row compares the built-in all-namespaces list with B8's PromQL.
    let call = if ["b1", "b6", "b8"].iter().any(|s| settings.runs(s)) {
        let (mut cold_ns, mut cold_all, mut direct_ns, mut direct_all, mut cpu) =
            (vec![], vec![], vec![], vec![], vec![]);
        let mut all_bytes = 0;
        for _ in 0..5 {
            tokio::time::sleep(ttl + Duration::from_millis(300)).await;
            cold_ns.push(timed_get(&client, &ns_url).await.0.as_secs_f64() * 1000.0);
            direct_ns.push(
                direct_upstream(&prometheus.url(), Some(ns), &ns_kubelets, token.trim(), &sim_ca, &[])
                    .await
                    .as_secs_f64()
                    * 1000.0,
            );
            tokio::time::sleep(ttl + Duration::from_millis(300)).await;
            let before = cpu_seconds(server.pid);
            let (elapsed, bytes) = timed_get(&client, &all_url).await;
            cpu.push(cpu_seconds(server.pid) - before);
            all_bytes = bytes;
            cold_all.push(elapsed.as_secs_f64() * 1000.0);
            direct_all.push(
                direct_upstream(&prometheus.url(), None, &kubelets, token.trim(), &sim_ca, &[])
                    .await
                    .as_secs_f64()
                    * 1000.0,
            );
        }
        let (cns, dns, call, dall) =
            (median(cold_ns), median(direct_ns), median(cold_all), median(direct_all));
        if settings.runs("b1") {
            report.push(format!("| B1 | {pods} | cold list, 1 namespace ({} pods) | {cns:.1} ms | direct upstream {dns:.1} ms | **{:.2}** |", pods as usize / NAMESPACES, cns / dns));
            report.push(format!("| B1 | {pods} | cold list, all namespaces ({all_bytes} B) | {call:.1} ms | direct upstream {dall:.1} ms | **{:.2}** |", call / dall));
        }
        if settings.runs("b6") {
            report.push(format!(
                "| B6 | {pods} | CPU per cache refresh (cold all-namespaces list) | {:.3} s | | |",
                median(cpu)
            ));
        }
        call
    } else {
        0.0
    };

    if settings.runs("b8") {
        // B8: a declared kind's cold list of every namespace (one object per pod) vs its two
        // PromQL queries done directly.
        let declared_url = format!("{}{GV}/podtraffics", server.url);
        let prometheus_url = prometheus.url();
        let direct = || direct_upstream(&prometheus_url, None, &[], token.trim(), &sim_ca, &[]);
        let (cd, dq, declared_bytes) = cold_against_direct(&client, &declared_url, ttl, direct).await;
        report.push(format!("| B8 | {pods} | declared kind, cold list, all namespaces ({declared_bytes} B) | {cd:.1} ms | direct PromQL {dq:.1} ms | **{:.2}** |", cd / dq));
        // The built-in kind's list of the same pods (B1 above) against the same raw PromQL.
        report.push(format!("| B8 | {pods} | built-in PodMetricsSummary, cold list, all namespaces (B1) | {call:.1} ms | direct PromQL {dq:.1} ms | **{:.2}** |", call / dq));
    }

    if settings.runs("b7") {
        // B7: the HPA's Pods metric over every pod of one namespace (1/10 of the pods), cold, vs
        // the one PromQL query it needs done directly.
        let custom_url = pods_metric(&server.url, ns);
        let query = format!("sum by (namespace, pod) (rate(http_requests_total{{namespace=\"{ns}\"}}[5m]))");
        let prometheus_url = prometheus.url();
        let direct = || direct_promql(&prometheus_url, &query);
        let (cc, dc, custom_bytes) = cold_against_direct(&client, &custom_url, ttl, direct).await;
        report.push(format!("| B7 | {pods} | custom metric, Pods form, cold, {} pods of {ns} ({custom_bytes} B) | {cc:.1} ms | direct PromQL {dc:.1} ms | **{:.2}** |", pods as usize / NAMESPACES, cc / dc));
    }

    if settings.runs("b4") {
        // B4: N identical concurrent cold requests → upstream calls.
        for n in [1usize, 10, 100] {
            tokio::time::sleep(ttl + Duration::from_millis(300)).await;
            let (queries_before, fetches_before) = (prometheus.queries().len(), kubelet_fetches(sim).await);
            let tasks: Vec<_> = (0..n)
                .map(|_| {
                    let (client, url) = (client.clone(), ns_url.clone());
                    tokio::spawn(async move { client.get(url).send().await.unwrap().status() })
                })
                .collect();
            for t in tasks {
                assert!(t.await.unwrap().is_success());
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
            let queries = prometheus.queries()[queries_before..]
                .iter()
                .filter(|q| q.contains("http_requests_total"))
                .count();
            let fetches = kubelet_fetches(sim).await - fetches_before;
            report.push(format!(
            "| B4 | {pods} | {n} concurrent cold lists of {ns} | {queries} PromQL queries, {fetches} kubelet fetches | 2 queries, {} nodes | {} |",
            ns_nodes.len(),
            if queries == 2 && fetches as usize == ns_nodes.len() { "exact" } else { "MORE" }
        ));
        }
    }

    if settings.runs("b5") {
        // B5: discovery p99 on one HTTP/2 connection while 1,000 cold namespaced lists share it
        // (their computation waits on Prometheus and the kubelets: "slow lists").
        let ca = std::fs::read(dir.join("certs/apiserver.crt")).unwrap();
        let mut headers = reqwest::header::HeaderMap::new();
        headers.insert("authorization", format!("Bearer {TOKEN}").parse().unwrap());
        let h2 = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .default_headers(headers)
            .http2_prior_knowledge()
            .build()
            .unwrap();
        tokio::time::sleep(ttl + Duration::from_millis(300)).await;
        let lists: Vec<_> = (0..1000)
            .map(|_| {
                let (h2, url) = (h2.clone(), ns_url.clone());
                tokio::spawn(async move {
                    // Read and drop (at 150,000 pods the 1,000 bodies are 6 GB).
                    match h2.get(url).send().await {
                        Ok(mut r) => loop {
                            match r.chunk().await {
                                Ok(Some(_)) => {}
                                Ok(None) => break true,
                                Err(_) => break false,
                            }
                        },
                        Err(_) => false,
                    }
                })
            })
            .collect();
        let mut discovery = Vec::new();
        let accept = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
        for _ in 0..200 {
            let started = Instant::now();
            let answered = match h2.get(format!("{}/apis", server.url)).header("accept", accept).send().await
            {
                Ok(r) => r.bytes().await.is_ok(),
                Err(_) => false,
            };
            assert!(answered, "discovery failed during B5");
            discovery.push(started.elapsed().as_secs_f64() * 1000.0);
        }
        let mut failed = 0;
        for l in lists {
            failed += usize::from(!l.await.unwrap());
        }
        let p99 = percentile(&mut discovery, 0.99);
        report.push(format!(
        "| B5 | {pods} | aggregated discovery p99 during 1,000 cold namespaced lists on one h2 connection ({failed} lists failed) | {p99:.2} ms | goal 5 ms | |"
    ));
    }
    drop(server);
}

/// B9's `--idle-after` (when the binary has it): short enough for the idle phase to come
/// within the run.
const B9_IDLE_AFTER: Duration = Duration::from_secs(60);
/// B9's request period (an HPA's sync period), the length of its asked phase, the wait after
/// the client stops (`--idle-after` + 30 s, for a binary without the flag too: the same
/// schedule for both) and the length of its idle phase.
const B9_PERIOD: Duration = Duration::from_secs(15);
const B9_ASKED: Duration = Duration::from_secs(180);
const B9_WAIT: Duration = Duration::from_secs(B9_IDLE_AFTER.as_secs() + 30);
const B9_IDLE: Duration = Duration::from_secs(120);

/// One B9 phase of one binary: CPU seconds per minute and the kubelet fetches it made.
#[derive(Debug, Clone, Copy)]
struct Phase {
    cpu_per_minute: f64,
    fetches: u64,
}

/// B9's two phases on a server of its own running `bin` (default `--cache-ttl`, 15s, and
/// `--idle-after=1m` when it has the flag): one all-namespaces PodMetricsSummary list every
/// 15 s for 3 minutes, then, the client stopped, `--idle-after` + 30 s of waiting and 2
/// minutes idle. Returns (asked, idle).
async fn b9_phases(bin: &Path, tag: &str, dir: &Path, sim: &Sim, prometheus: &Prometheus) -> (Phase, Phase) {
    let mut extra = vec![];
    if supports_idle_after(bin) {
        extra.push(format!("--idle-after={}s", B9_IDLE_AFTER.as_secs()));
    }
    let server = start_percolator(bin, dir, sim, prometheus, "15s", tag, &extra).await;
    let pid = server.pid;
    // Past the start's own work: the inventory's sync and the kubelet warm-up fetch.
    tokio::time::sleep(Duration::from_secs(20)).await;
    let measure = |from: (f64, u64, tokio::time::Instant)| async move {
        let (cpu, fetches, at) = from;
        let minutes = at.elapsed().as_secs_f64() / 60.0;
        Phase {
            cpu_per_minute: (cpu_seconds(pid) - cpu) / minutes,
            fetches: kubelet_fetches(sim).await - fetches,
        }
    };
    let start = || async { (cpu_seconds(pid), kubelet_fetches(sim).await, tokio::time::Instant::now()) };

    let client = mk_client(dir);
    let url = format!("{}{GV}/podmetricssummaries", server.url);
    let from = start().await;
    let mut requests = 0u32;
    while B9_PERIOD * requests < B9_ASKED {
        tokio::time::sleep_until(from.2 + B9_PERIOD * requests).await;
        timed_get(&client, &url).await;
        requests += 1;
    }
    tokio::time::sleep_until(from.2 + B9_ASKED).await;
    let asked = measure(from).await;
    drop(client);
    eprintln!("[{tag}] B9 asked ({requests} lists): {asked:?}");

    tokio::time::sleep(B9_WAIT).await;
    let from = start().await;
    tokio::time::sleep(B9_IDLE).await;
    let idle = measure(from).await;
    eprintln!("[{tag}] B9 idle: {idle:?}");
    drop(server);
    (asked, idle)
}

/// B9: CPU per minute of percolator asked every 15 s, then idle, and of the baseline binary
/// (`PERCOLATOR_BASELINE_BIN`) in the same run, one server at a time.
async fn b9(dir: &Path, sim: &Sim, prometheus: &Prometheus, pods: u32, report: &mut Vec<String>) {
    let ours = b9_phases(&percolator_bin(), "b9", dir, sim, prometheus).await;
    let baseline = match baseline_bin() {
        Some(bin) => Some(b9_phases(&bin, "b9-baseline", dir, sim, prometheus).await),
        None => None,
    };
    let cell = |p: Phase| format!("{:.3} s ({} kubelet fetches)", p.cpu_per_minute, p.fetches);
    let what = [
        format!("CPU per minute, asked every {} s ({} min)", B9_PERIOD.as_secs(), B9_ASKED.as_secs() / 60),
        format!("CPU per minute, idle after --idle-after ({} min)", B9_IDLE.as_secs() / 60),
    ];
    let phases = [(ours.0, baseline.map(|b| b.0)), (ours.1, baseline.map(|b| b.1))];
    for (what, (ours, baseline)) in what.iter().zip(phases) {
        let (base, ratio) = match baseline {
            None => (String::new(), String::new()),
            Some(b) => {
                let ratio = if b.cpu_per_minute > 0.0 {
                    format!("**{:.2}**", ours.cpu_per_minute / b.cpu_per_minute)
                } else if ours.cpu_per_minute > 0.0 {
                    "baseline 0".to_owned()
                } else {
                    "both 0".to_owned()
                };
                (format!("baseline {}", cell(b)), ratio)
            }
        };
        report.push(format!("| B9 | {pods} | {what} | {} | {base} | {ratio} |", cell(ours)));
        eprintln!("{}", report.last().unwrap());
    }
}

/// Resident memory (KiB) after each of B3's steps, and the peak.
#[derive(Debug, Clone, Copy)]
struct Rss {
    base: f64,
    namespaces: f64,
    all: f64,
    peak: f64,
}

/// The warm server of B2 and B3: a fresh server with a long TTL (nothing expires while it is
/// measured), every API on, plus `extra` flags (every caller passes the request-header flags,
/// so the minimal cluster's base is the same configuration); the inventory synced (and, with
/// kubelets, every node's sample state warm), then every namespace's lists cached
/// (PodMetricsSummary, CafeBrewStats, PodMetrics), then the all-namespaces lists too (and
/// NodeMetrics). With `measure`, B3: the resident memory after each step. Returns the server.
async fn warm_server(
    dir: &Path,
    sim: &Sim,
    prometheus: &Prometheus,
    mode: Mode,
    extra: &[String],
    measure: bool,
) -> (Server, Option<Rss>) {
    let mut args = vec!["--enable-custom-metrics".to_owned(), "--enable-resource-metrics".to_owned()];
    if mode == Mode::Prometheus {
        args.push("--resource-source=prometheus".to_owned());
    }
    args.extend_from_slice(extra);
    let server = start_percolator(&percolator_bin(), dir, sim, prometheus, "10m", "warm", &args).await;
    let client = mk_client(dir);
    tokio::time::sleep(Duration::from_secs(12)).await;
    timed_get(&client, &format!("{}/readyz", server.url)).await;
    // Read after a pause: the allocator returns freed pages to the system lazily.
    let rss_kib = || async {
        if !measure {
            return 0.0;
        }
        tokio::time::sleep(Duration::from_secs(3)).await;
        proc_status_kb(server.pid, "VmRSS") as f64
    };
    let base = rss_kib().await;
    for i in 0..NAMESPACES {
        for path in [
            format!("{GV}/namespaces/ns-{i}/podmetricssummaries"),
            format!("{GV}/namespaces/ns-{i}/cafebrewstats"),
            format!("/apis/metrics.k8s.io/v1beta1/namespaces/ns-{i}/pods"),
        ] {
            timed_get(&client, &format!("{}{path}", server.url)).await;
        }
    }
    let namespaces = rss_kib().await;
    for path in [
        format!("{GV}/podmetricssummaries"),
        format!("{GV}/cafebrewstats"),
        "/apis/metrics.k8s.io/v1beta1/pods".to_owned(),
        "/apis/metrics.k8s.io/v1beta1/nodes".to_owned(),
    ] {
        timed_get(&client, &format!("{}{path}", server.url)).await;
    }
    let all = rss_kib().await;
    let rss =
        measure.then(|| Rss { base, namespaces, all, peak: proc_status_kb(server.pid, "VmHWM") as f64 });
    (server, rss)
}

/// B3 of a minimal cluster (1 node × [`PODS_PER_NODE`] pods, its own simulator and
/// Prometheus): the fixed base the marginal rows subtract.
async fn minimal_rss(mode: Mode) -> Rss {
    let pods = PODS_PER_NODE;
    let dir = std::env::temp_dir().join(format!("percolator-bench-min-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let sim = start_sim(&dir, pods, mode).await;
    let prometheus = start_prometheus(&dir, &sim, pods).await;
    let flags = request_header_flags(&mk_front_proxy(&dir));
    let (server, rss) = warm_server(&dir, &sim, &prometheus, mode, &flags, true).await;
    drop(server);
    drop(prometheus);
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
    let rss = rss.unwrap();
    eprintln!("[{pods}, minimal cluster] B3 {rss:?} KiB");
    rss
}

/// B3's rows: resident memory after each step per pod, and, over the minimal cluster `min`,
/// the marginal cost per pod of each step.
fn report_memory(pods: u32, mode: Mode, rss: &Rss, min: Option<&Rss>, report: &mut Vec<String>) {
    let per_pod = |kib: f64| kib / f64::from(pods);
    let (measure, state) = match mode {
        Mode::Kubelet => ("B3", "inventory + kubelet state"),
        Mode::Prometheus => ("B3 (prometheus)", "inventory, no kubelet state"),
    };
    report.push(format!(
        "| {measure} | {pods} | resident memory, {state} | {:.1} MiB | {:.2} KiB per pod | |",
        rss.base / 1024.0,
        per_pod(rss.base)
    ));
    report.push(format!(
        "| {measure} | {pods} | + every namespace's lists cached (pms, cafes, PodMetrics) | {:.1} MiB | +{:.2} KiB per pod | |",
        rss.namespaces / 1024.0,
        per_pod(rss.namespaces - rss.base)
    ));
    report.push(format!(
        "| {measure} | {pods} | + all-namespaces lists cached (peak {:.1} MiB) | {:.1} MiB | {:.2} KiB per pod in all, +{:.2} KiB | |",
        rss.peak / 1024.0,
        rss.all / 1024.0,
        per_pod(rss.all),
        per_pod(rss.all - rss.namespaces)
    ));
    let Some(min) = min else { return };
    if pods <= PODS_PER_NODE {
        return;
    }
    let marginal = |n: f64, m: f64| (n - m) / f64::from(pods - PODS_PER_NODE);
    for (step, n, m) in [
        (state, rss.base, min.base),
        ("+ every namespace's lists cached", rss.namespaces, min.namespaces),
        ("+ all-namespaces lists cached", rss.all, min.all),
    ] {
        report.push(format!(
            "| {measure} | {pods} | marginal per pod over {PODS_PER_NODE} pods, {step} | {:.1} MiB − {:.1} MiB | **{:.2} KiB per pod** | |",
            n / 1024.0,
            m / 1024.0,
            marginal(n, m)
        ));
    }
}

/// `--resource-source=prometheus`: B1 (cold lists of PodMetricsSummary and PodMetrics against
/// the raw PromQL of the same list) and B3.
async fn run_size_prometheus(
    settings: &Settings,
    pods: u32,
    min_rss: &mut Option<Rss>,
    report: &mut Vec<String>,
) {
    let (dir, sim, prometheus) = start_size(settings, pods, Mode::Prometheus, min_rss).await;
    if settings.runs("b1") {
        cold_prometheus(&dir, &sim, &prometheus, pods, report).await;
    }
    if settings.runs("b3") {
        let flags = request_header_flags(&mk_front_proxy(&dir));
        let (server, rss) = warm_server(&dir, &sim, &prometheus, Mode::Prometheus, &flags, true).await;
        drop(server);
        report_memory(pods, Mode::Prometheus, &rss.unwrap(), min_rss.as_ref(), report);
    }
    drop(prometheus);
    drop(sim);
    let _ = std::fs::remove_dir_all(&dir);
}

/// B1 in `--resource-source=prometheus` mode.
async fn cold_prometheus(
    dir: &Path,
    sim: &Sim,
    prometheus: &Prometheus,
    pods: u32,
    report: &mut Vec<String>,
) {
    let token = std::fs::read_to_string(sim.state.join("token")).unwrap();
    let sim_ca = std::fs::read(sim.state.join("ca.crt")).unwrap();
    let ns = "ns-3";
    let ttl = Duration::from_secs(2);
    let args = ["--enable-resource-metrics".to_owned(), "--resource-source=prometheus".to_owned()];
    let server = start_percolator(&percolator_bin(), dir, sim, prometheus, "2s", "cold-prom", &args).await;
    let client = mk_client(dir);
    tokio::time::sleep(Duration::from_secs(3)).await;
    let pms = |scope: &str| format!("{}{GV}/{scope}podmetricssummaries", server.url);
    let pod_metrics = |scope: &str| format!("{}/apis/metrics.k8s.io/v1beta1/{scope}pods", server.url);
    let ns_scope = format!("namespaces/{ns}/");
    let rows = [
        ("PodMetricsSummary", "1 namespace", pms(&ns_scope), Some(ns), true),
        ("PodMetricsSummary", "all namespaces", pms(""), None, true),
        ("PodMetrics", "1 namespace", pod_metrics(&ns_scope), Some(ns), false),
        ("PodMetrics", "all namespaces", pod_metrics(""), None, false),
    ];
    for (kind, scope, url, namespace, with_rates) in rows {
        let (mut cold, mut direct) = (vec![], vec![]);
        let mut bytes = 0;
        for _ in 0..5 {
            tokio::time::sleep(ttl + Duration::from_millis(300)).await;
            let (elapsed, size) = timed_get(&client, &url).await;
            bytes = size;
            cold.push(elapsed.as_secs_f64() * 1000.0);
            let queries = resource_queries(namespace);
            let took = if with_rates {
                direct_upstream(&prometheus.url(), namespace, &[], token.trim(), &sim_ca, &queries).await
            } else {
                let (url, started) = (prometheus.url(), Instant::now());
                futures::join!(direct_promql(&url, &queries[0]), direct_promql(&url, &queries[1]));
                started.elapsed()
            };
            direct.push(took.as_secs_f64() * 1000.0);
        }
        let (c, d) = (median(cold), median(direct));
        report.push(format!("| B1 (prometheus) | {pods} | {kind}, cold list, {scope} ({bytes} B) | {c:.1} ms | direct PromQL {d:.1} ms | **{:.2}** |", c / d));
    }
    assert_eq!(kubelet_fetches(sim).await, 0, "no kubelet connection in prometheus mode");
    drop(server);
}

#[tokio::main]
async fn main() {
    apiserver::install_crypto_provider();
    let settings = Settings::parse(std::env::args().skip(1));
    let sections = settings.only.iter().map(String::as_str).collect::<Vec<_>>().join(",");
    let idle_after = |bin: &Path| if supports_idle_after(bin) { "has" } else { "has no" };
    let bin = percolator_bin();
    let baseline = baseline_bin()
        .filter(|_| settings.runs("b9"))
        .map(|b| format!("; B9 baseline binary: `{}` ({} `--idle-after`)", b.display(), idle_after(&b)))
        .unwrap_or_default();
    let mut report = vec![
        format!(
            "percolator binary: `{}` ({} `--idle-after`){baseline}; sections {sections}; {} rounds of {} s \
             per throughput row; environment: {}",
            bin.display(),
            idle_after(&bin),
            settings.rounds,
            settings.seconds,
            describe_env(),
        ),
        String::new(),
        "| | pods | measure | percolator | baseline (same run) | ratio |".to_string(),
        "| --- | --- | --- | --- | --- | --- |".to_string(),
    ];
    let mut min_rss = None;
    for &pods in &settings.sizes {
        if settings.prometheus_mode {
            run_size_prometheus(&settings, pods, &mut min_rss, &mut report).await;
        } else {
            run_size(&settings, pods, &mut min_rss, &mut report).await;
        }
        for line in &report {
            println!("{line}");
        }
    }
    // Beside the build (CARGO_TARGET_DIR may be elsewhere than ./target).
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target"), PathBuf::from);
    std::fs::create_dir_all(&target).unwrap();
    let out = target.join("bench-report.md");
    std::fs::write(&out, report.join("\n") + "\n").unwrap();
    eprintln!("report written to {}", out.display());
}
