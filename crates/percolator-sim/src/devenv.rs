//! The local development environment shared by the demo, the end-to-end tests and the
//! benchmarks: a real Prometheus (Debian's `prometheus` package) started on a loopback port
//! with history backfilled by `promtool`, so that `rate()` over the whole window is exact from
//! the first query — and a fault-injecting proxy ([`FaultProxy`]) to put in front of it. The
//! same scrape jobs and history can be served by VictoriaMetrics instead ([`VictoriaMetrics`],
//! Debian's `victoria-metrics`); [`MetricsEngine`] is either.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::process::{Child, Command};

/// Errors of the development environment.
#[derive(Debug, thiserror::Error)]
pub enum DevEnvError {
    /// A program could not be run.
    #[error("{program}: {message}")]
    Program {
        /// The program.
        program: String,
        /// What went wrong.
        message: String,
    },
    /// Something did not become ready in time.
    #[error("{0} did not become ready in time")]
    Timeout(String),
    /// File I/O.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, DevEnvError>;

/// One scrape job of the test Prometheus.
#[derive(Debug, Clone)]
pub struct ScrapeJob {
    /// Job name (becomes the `job` label).
    pub job: String,
    /// `host:port` of the target (becomes the `instance` label). Empty when the targets come
    /// from [`ScrapeJob::targets_file`].
    pub target: String,
    /// A file_sd JSON file to read targets from instead (written later, e.g. once the scraped
    /// server has bound its port; Prometheus watches the file).
    pub targets_file: Option<PathBuf>,
    /// `http` or `https` (https skips verification: test targets are self-signed).
    pub scheme: String,
    /// Bearer token to send, if any.
    pub bearer_token: Option<String>,
}

impl ScrapeJob {
    /// A job scraping plain-HTTP `target` without a token.
    pub fn http(job: &str, target: impl Into<String>) -> Self {
        Self {
            job: job.into(),
            target: target.into(),
            targets_file: None,
            scheme: "http".into(),
            bearer_token: None,
        }
    }
}

/// How to start Prometheus.
#[derive(Debug, Clone)]
pub struct PrometheusOptions {
    /// Working directory (config, data, logs, query log).
    pub dir: PathBuf,
    /// Scrape jobs.
    pub jobs: Vec<ScrapeJob>,
    /// Scrape interval (also the backfill step).
    pub scrape_interval: Duration,
    /// OpenMetrics text to backfill with `promtool` before the first start, if any.
    pub backfill: Option<String>,
}

/// A running Prometheus, killed on drop.
#[derive(Debug)]
pub struct Prometheus {
    child: Option<Child>,
    port: u16,
    options: PrometheusOptions,
}

/// The Prometheus binary (`PROMETHEUS_BIN` overrides).
fn prometheus_bin() -> String {
    std::env::var("PROMETHEUS_BIN").unwrap_or_else(|_| "prometheus".to_string())
}

/// The promtool binary (`PROMTOOL_BIN` overrides).
fn promtool_bin() -> String {
    std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".to_string())
}

impl Prometheus {
    /// Writes the configuration, backfills history, starts Prometheus on a free loopback port
    /// and waits until it is ready.
    pub async fn start(options: PrometheusOptions) -> Result<Self> {
        apiserver::install_crypto_provider();
        std::fs::create_dir_all(options.dir.join("data"))?;
        if let Some(history) = &options.backfill {
            let file = options.dir.join("history.om");
            std::fs::write(&file, history)?;
            let output = Command::new(promtool_bin())
                .args(["tsdb", "create-blocks-from", "openmetrics"])
                .arg(&file)
                .arg(options.dir.join("data"))
                .output()
                .await
                .map_err(|e| DevEnvError::Program { program: promtool_bin(), message: e.to_string() })?;
            if !output.status.success() {
                return Err(DevEnvError::Program {
                    program: promtool_bin(),
                    message: String::from_utf8_lossy(&output.stderr).into_owned(),
                });
            }
        }
        std::fs::write(options.dir.join("prometheus.yml"), config_yaml(&options))?;
        let mut prometheus = Self { child: None, port: 0, options };
        prometheus.spawn_on_free_port().await?;
        Ok(prometheus)
    }

    async fn spawn(&mut self, port: u16) -> Result<()> {
        let dir = &self.options.dir;
        let log = std::fs::File::create(dir.join(format!("prometheus-{port}.log")))?;
        let mut child = Command::new(prometheus_bin())
            .arg(format!("--config.file={}", dir.join("prometheus.yml").display()))
            .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .arg("--storage.tsdb.retention.time=1d")
            .arg("--log.level=warn")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| DevEnvError::Program { program: prometheus_bin(), message: e.to_string() })?;
        // Another test's Prometheus may hold the port while ours exits with "address already
        // in use": its data directory says.
        let data = dir.join("data");
        wait_until_ours(&mut child, &prometheus_bin(), port, "api/v1/status/flags", |flags| {
            let path = flags
                .and_then(|text| serde_json::from_str::<serde_json::Value>(text).ok())
                .and_then(|f| f["data"]["storage.tsdb.path"].as_str().map(PathBuf::from));
            path.is_none_or(|path| path == data)
        })
        .await?;
        self.port = port;
        self.child = Some(child);
        Ok(())
    }
}

/// The process side both engines share: a loopback port picked free, a kill, a restart on
/// the same port. Each engine says how to start itself on a port ([`EngineProcess::spawn`]).
trait EngineProcess {
    /// The program, for messages.
    fn program() -> String;
    /// Starts the engine on `port` and returns once it is ready and known to be ours.
    async fn spawn(&mut self, port: u16) -> Result<()>;
    /// The port it serves on.
    fn port(&self) -> u16;
    /// Its process, while it runs.
    fn child(&mut self) -> &mut Option<Child>;

    /// The engine cannot bind port 0 and report it: the kernel picks a free port for a
    /// listener we drop at once, and the engine binds it. A port taken in between makes it
    /// exit (or, if another engine answers there, fail the identity check of `spawn`), and we
    /// try another one.
    async fn spawn_on_free_port(&mut self) -> Result<()> {
        for _ in 0..20 {
            let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
            match self.spawn(port).await {
                Ok(()) => return Ok(()),
                Err(error) => {
                    tracing::debug!(port, %error, program = Self::program(), "did not start; trying another port");
                }
            }
        }
        Err(DevEnvError::Timeout(format!("{} (no free port)", Self::program())))
    }

    /// Kills the process (SIGKILL; the data directory stays).
    async fn kill(&mut self) {
        if let Some(mut child) = self.child().take() {
            let _ = child.kill().await;
        }
    }

    /// Kills the process and starts it again on the same port with the same data.
    async fn respawn(&mut self) -> Result<()> {
        self.kill().await;
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match self.spawn(self.port()).await {
                Ok(()) => return Ok(()),
                Err(error) if Instant::now() < deadline => {
                    tracing::debug!(%error, program = Self::program(), "restart failed; retrying");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
                Err(error) => return Err(error),
            }
        }
    }
}

/// Implements [`EngineProcess`] for an engine with `child`, `port` and `options` fields, its own
/// `spawn` and the function naming its program, and the HTTP side both engines share.
macro_rules! engine_process {
    ($engine:ident, $program:ident) => {
        #[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
        impl $engine {
            /// Base URL of the HTTP API.
            pub fn url(&self) -> String {
                format!("http://127.0.0.1:{}", self.port)
            }

            /// Waits until every job has been scraped successfully at least once.
            pub async fn wait_for_targets(&self, timeout: Duration) -> Result<()> {
                wait_for_jobs(&self.url(), &self.options.jobs, timeout).await
            }

            /// Waits until `job` has been scraped successfully at least once.
            pub async fn wait_for_job(&self, job: &str, timeout: Duration) -> Result<()> {
                wait_for_up(&self.url(), job, timeout).await
            }
        }

        impl EngineProcess for $engine {
            fn program() -> String {
                $program()
            }

            async fn spawn(&mut self, port: u16) -> Result<()> {
                $engine::spawn(self, port).await
            }

            fn port(&self) -> u16 {
                self.port
            }

            fn child(&mut self) -> &mut Option<Child> {
                &mut self.child
            }
        }
    };
}

engine_process!(Prometheus, prometheus_bin);
engine_process!(VictoriaMetrics, victoria_metrics_bin);

/// Waits up to 30 s until the engine `child` started on `port` is ready (`/-/ready`) and
/// `ours` accepts the body of its flags page (`None` when it could not be read); kills it
/// and fails otherwise, or when it exits first.
async fn wait_until_ours(
    child: &mut Child,
    program: &str,
    port: u16,
    flags_path: &str,
    ours: impl Fn(Option<&str>) -> bool,
) -> Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Ok(Some(status)) = child.try_wait() {
            return Err(DevEnvError::Program {
                program: program.to_owned(),
                message: format!("exited with {status} on port {port}"),
            });
        }
        if let Ok(response) = client.get(format!("http://127.0.0.1:{port}/-/ready")).send().await
            && response.status().is_success()
        {
            let flags = match client.get(format!("http://127.0.0.1:{port}/{flags_path}")).send().await {
                Ok(response) => response.text().await.ok(),
                Err(_) => None,
            };
            if !ours(flags.as_deref()) {
                let _ = child.kill().await;
                return Err(DevEnvError::Program {
                    program: program.to_owned(),
                    message: format!("port {port} is another server's"),
                });
            }
            return Ok(());
        }
        if Instant::now() > deadline {
            let _ = child.kill().await;
            return Err(DevEnvError::Timeout(program.to_owned()));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until every job of `jobs` has been scraped successfully at least once.
async fn wait_for_jobs(url: &str, jobs: &[ScrapeJob], timeout: Duration) -> Result<()> {
    for job in jobs {
        wait_for_up(url, &job.job, timeout).await?;
    }
    Ok(())
}

/// Waits until the engine at `url` answers `up{job="<job>"}` with 1: `job` has been scraped
/// successfully at least once (and the engine shows it to queries).
async fn wait_for_up(url: &str, job: &str, timeout: Duration) -> Result<()> {
    let client = reqwest::Client::new();
    let deadline = Instant::now() + timeout;
    loop {
        let response = client
            .get(format!("{url}/api/v1/query"))
            .query(&[("query", format!("up{{job=\"{job}\"}}"))])
            .send()
            .await;
        if let Ok(response) = response
            && let Ok(body) = response.json::<serde_json::Value>().await
            && body["data"]["result"][0]["value"][1] == "1"
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(DevEnvError::Timeout(format!("scrape of job {job}")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[allow(
    dead_code,
    reason = "for the end-to-end tests and the benchmark, which include this file too; the demo does not use them"
)]
impl Prometheus {
    /// File where Prometheus logs every query it runs.
    pub fn query_log(&self) -> PathBuf {
        self.options.dir.join("query.log")
    }

    /// Every PromQL expression Prometheus has run so far, in order.
    pub fn queries(&self) -> Vec<String> {
        read_query_log(&self.query_log())
    }

    /// Stops Prometheus (SIGKILL; the data directory stays).
    pub async fn stop(&mut self) {
        self.kill().await;
    }

    /// Starts Prometheus again on the same port with the same data.
    pub async fn restart(&mut self) -> Result<()> {
        self.respawn().await
    }
}

pub(crate) fn config_yaml(options: &PrometheusOptions) -> String {
    let interval = k8s_wire::duration::promql(options.scrape_interval);
    let mut out = format!(
        "global:\n  scrape_interval: {interval}\n  evaluation_interval: {interval}\n  query_log_file: {}\n",
        options.dir.join("query.log").display()
    );
    out.push_str(&scrape_configs_yaml(options, true));
    out
}

/// The `scrape_configs:` section of `options`; `file_sd_refresh` sets each file_sd's
/// `refresh_interval` to 1s (a field Prometheus has and VictoriaMetrics refuses: it takes
/// `-promscrape.fileSDCheckInterval` instead).
fn scrape_configs_yaml(options: &PrometheusOptions, file_sd_refresh: bool) -> String {
    let mut out = String::from("scrape_configs:\n");
    for job in &options.jobs {
        out.push_str(&format!(
            "  - job_name: {}\n    honor_labels: true\n    scheme: {}\n    tls_config:\n      insecure_skip_verify: true\n",
            job.job, job.scheme
        ));
        if let Some(token) = &job.bearer_token {
            out.push_str(&format!("    authorization:\n      credentials: {token}\n"));
        }
        match &job.targets_file {
            Some(file) => {
                out.push_str(&format!("    file_sd_configs:\n      - files: ['{}']\n", file.display()));
                if file_sd_refresh {
                    out.push_str("        refresh_interval: 1s\n");
                }
            }
            None => out.push_str(&format!("    static_configs:\n      - targets: ['{}']\n", job.target)),
        }
    }
    out
}

/// Fetches `span` of the simulator's history, ending one `step` ago, as OpenMetrics text for
/// [`PrometheusOptions::backfill`]. `job` and `instance` must be the labels Prometheus will
/// give the live scrapes of `sim_metrics`, so that backfilled and scraped samples form one
/// series and `rate()` is exact over the whole window from the first query.
pub async fn sim_history(
    sim_metrics: &str,
    job: &str,
    instance: &str,
    span: Duration,
    step: Duration,
) -> Result<String> {
    apiserver::install_crypto_provider();
    let fail = |e: reqwest::Error| DevEnvError::Program {
        program: "percolator-sim /sim/history".into(),
        message: e.to_string(),
    };
    let end = jiff::Timestamp::now().as_second() - step.as_secs() as i64;
    let start = end - span.as_secs() as i64;
    reqwest::Client::new()
        .get(format!("{sim_metrics}/sim/history"))
        .query(&[
            ("start", start.to_string()),
            ("end", end.to_string()),
            ("step", step.as_secs().max(1).to_string()),
            ("job", job.to_string()),
            ("instance", instance.to_string()),
        ])
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(fail)?
        .text()
        .await
        .map_err(fail)
}

/// Writes a file_sd targets file for one `host:port` target.
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub fn write_targets_file(path: &Path, target: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, serde_json::json!([{ "targets": [target] }]).to_string())?;
    std::fs::rename(tmp, path)
}

/// Reads the PromQL expressions of a Prometheus query log.
pub fn read_query_log(path: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read_to_string(path) else { return Vec::new() };
    text.lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .filter_map(|entry| entry["params"]["query"].as_str().map(str::to_string))
        .collect()
}

// ---------------------------------------------------------------------------------------------
// A fake Prometheus
// ---------------------------------------------------------------------------------------------

/// What a [`FakePrometheus`] answers: an instant query's empty vector.
pub const EMPTY_VECTOR: &str = r#"{"status":"success","data":{"resultType":"vector","result":[]}}"#;

/// A stand-in for Prometheus on a free loopback port, where a test needs an upstream whose
/// answers are known and take a chosen time rather than real series: every request, whatever
/// its method and path, is answered `200` with [`EMPTY_VECTOR`] after `delay`. Stops when
/// dropped.
#[derive(Debug)]
pub struct FakePrometheus {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

impl FakePrometheus {
    /// Starts it on the current tokio runtime.
    pub async fn start(delay: Duration) -> Result<Self> {
        let app = axum::Router::new().fallback(move || async move {
            tokio::time::sleep(delay).await;
            ([(http::header::CONTENT_TYPE, "application/json")], EMPTY_VECTOR)
        });
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        Ok(Self { port, task })
    }

    /// `127.0.0.1:<port>`, as a [`FaultProxy`] names its upstream.
    pub fn address(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// Base URL (`http://127.0.0.1:<port>`), as percolator's `--prometheus-url`.
    pub fn url(&self) -> String {
        format!("http://{}", self.address())
    }
}

impl Drop for FakePrometheus {
    fn drop(&mut self) {
        self.task.abort();
    }
}

// ---------------------------------------------------------------------------------------------
// Fault-injecting proxy
// ---------------------------------------------------------------------------------------------

/// What a [`FaultProxy`] does with the requests it receives.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(dead_code, reason = "set by the end-to-end tests, which include this file too, and devenv_tests")]
pub enum ProxyFault {
    /// Forward every byte to the upstream and back.
    #[default]
    Pass,
    /// Nothing listens on the port: connections are refused.
    Down,
    /// Wait this long, then forward.
    Slow(Duration),
    /// Read the request, answer `200` with headers promising a JSON body, then send nothing.
    HangAfterHeaders,
    /// Read the request, answer `200` with `Content-Type: application/json` and a body that is
    /// not JSON.
    Garbage,
    /// Read the request, answer `500 Internal Server Error` with a plain-text body (what a
    /// proxy or load balancer in front of a broken Prometheus sends).
    Error500,
    /// Read the request, answer `200` with a well-formed vector answer that streams series
    /// (chunked) until the client hangs up or [`FLOOD_BYTES`] are sent: a Prometheus asked a
    /// query that matches far too many series.
    Flood,
}

/// What a [`ProxyFault::Flood`] answer sends at most per request: 4 GiB.
pub const FLOOD_BYTES: u64 = 4 << 30;

/// A TCP proxy on a loopback port in front of an HTTP server (the test Prometheus) that
/// injects [`ProxyFault`]s, switchable at any time with [`FaultProxy::set`]. A change of fault
/// closes the connections open through the proxy, so pooled client connections meet the new
/// fault on their next request. Stops when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    port: u16,
    fault: Arc<tokio::sync::watch::Sender<ProxyFault>>,
    task: tokio::task::JoinHandle<()>,
}

/// Body of [`ProxyFault::Garbage`] answers.
const GARBAGE_BODY: &str =
    "<html><body><h1>502 Bad Gateway</h1>\u{0}\u{1}\u{2}{\"status\":\"succ</body></html>\n";

#[allow(dead_code, reason = "for the end-to-end tests, which include this file too, and devenv_tests")]
impl FaultProxy {
    /// Starts a proxy on a free loopback port forwarding to `upstream` (`host:port`), on the
    /// current tokio runtime.
    pub async fn start(upstream: &str) -> Result<Self> {
        let upstream = upstream.to_owned();
        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let fault = Arc::new(tokio::sync::watch::Sender::new(ProxyFault::Pass));
        let task = tokio::spawn(proxy_loop(listener, port, upstream, Arc::clone(&fault)));
        Ok(Self { port, fault, task })
    }

    /// Base URL of the proxy (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The fault in force.
    pub fn fault(&self) -> ProxyFault {
        *self.fault.borrow()
    }

    /// Switches to `fault` (closing the open connections when it changes).
    pub fn set(&self, fault: ProxyFault) {
        self.fault.send_if_modified(|current| {
            let changed = *current != fault;
            *current = fault;
            changed
        });
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Accepts connections (or, while [`ProxyFault::Down`], holds no listener at all) until the
/// task is aborted; aborting it drops the connections too.
async fn proxy_loop(
    listener: tokio::net::TcpListener,
    port: u16,
    upstream: String,
    fault: Arc<tokio::sync::watch::Sender<ProxyFault>>,
) {
    let mut listener = Some(listener);
    let mut changes = fault.subscribe();
    let mut connections = tokio::task::JoinSet::new();
    loop {
        let current = *changes.borrow_and_update();
        if current == ProxyFault::Down {
            // Refused: close the listening socket until the fault changes.
            listener = None;
            if changes.changed().await.is_err() {
                return;
            }
            continue;
        }
        let Some(bound) = listener.as_ref() else {
            match tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, port)).await {
                Ok(l) => listener = Some(l),
                Err(error) => {
                    tracing::debug!(%error, port, "fault proxy cannot bind its port again; retrying");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
            continue;
        };
        tokio::select! {
            _ = changes.changed() => {}
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = bound.accept() => match accepted {
                Ok((client, _)) => {
                    let _ = client.set_nodelay(true);
                    connections.spawn(proxy_connection(client, upstream.clone(), current, fault.subscribe()));
                }
                Err(error) => {
                    tracing::debug!(%error, "fault proxy accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Serves one client connection under `fault`, until the connection ends or the fault changes.
async fn proxy_connection(
    mut client: tokio::net::TcpStream,
    upstream: String,
    fault: ProxyFault,
    mut changes: tokio::sync::watch::Receiver<ProxyFault>,
) {
    let work = async {
        match fault {
            ProxyFault::Pass | ProxyFault::Down => forward(&mut client, &upstream).await,
            ProxyFault::Slow(delay) => {
                tokio::time::sleep(delay).await;
                forward(&mut client, &upstream).await;
            }
            ProxyFault::HangAfterHeaders => {
                if read_request(&mut client).await.is_ok() {
                    let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 4096\r\n\r\n{\"status\":";
                    let _ = client.write_all(head.as_bytes()).await;
                    std::future::pending::<()>().await;
                }
            }
            ProxyFault::Garbage => respond(&mut client, "200 OK", "application/json", GARBAGE_BODY).await,
            ProxyFault::Error500 => {
                respond(&mut client, "500 Internal Server Error", "text/plain", "upstream unavailable\n")
                    .await;
            }
            ProxyFault::Flood => flood(&mut client).await,
        }
    };
    tokio::select! {
        () = work => {}
        _ = changes.changed() => {}
    }
}

/// Answers requests with endless vector answers ([`ProxyFault::Flood`]).
async fn flood(client: &mut tokio::net::TcpStream) {
    while read_request(client).await.is_ok() {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
        if client.write_all(head.as_bytes()).await.is_err() {
            return;
        }
        let series = r#"{"metric":{"__name__":"flood","namespace":"shop","pod":"flood-0000000000"},"value":[1700000000,"1"]},"#;
        let mut payload = String::from(r#"{"status":"success","data":{"resultType":"vector","result":["#);
        let mut sent = 0u64;
        while sent < FLOOD_BYTES {
            while payload.len() < 256 * 1024 {
                payload.push_str(series);
            }
            let frame = format!("{:x}\r\n{payload}\r\n", payload.len());
            if client.write_all(frame.as_bytes()).await.is_err() {
                return;
            }
            sent += payload.len() as u64;
            payload.clear();
        }
        // Close the array and the answer, so a client without a limit could read it whole.
        let tail = r#"{"metric":{},"value":[1700000000,"1"]}]}}"#;
        let frame = format!("{:x}\r\n{tail}\r\n0\r\n\r\n", tail.len());
        if client.write_all(frame.as_bytes()).await.is_err() {
            return;
        }
    }
}

/// Copies bytes both ways between `client` and `upstream` until either side closes.
async fn forward(client: &mut tokio::net::TcpStream, upstream: &str) {
    match tokio::net::TcpStream::connect(upstream).await {
        Ok(mut server) => {
            let _ = server.set_nodelay(true);
            let _ = tokio::io::copy_bidirectional(client, &mut server).await;
        }
        Err(error) => tracing::debug!(%error, upstream, "fault proxy cannot reach its upstream"),
    }
}

/// Answers one request with `status` and `body`, then closes the connection.
async fn respond(client: &mut tokio::net::TcpStream, status: &str, content_type: &str, body: &str) {
    if read_request(client).await.is_err() {
        return;
    }
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let _ = client.write_all(response.as_bytes()).await;
    let _ = client.shutdown().await;
}

/// Reads one HTTP/1.1 request (head and `Content-Length` body), so that closing afterwards
/// sends FIN rather than RST (unread data makes the kernel reset the connection).
pub(crate) async fn read_request(client: &mut tokio::net::TcpStream) -> std::io::Result<()> {
    const MAX_HEAD: usize = 64 * 1024;
    let mut buf = Vec::with_capacity(4096);
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break at + 4;
        }
        if buf.len() > MAX_HEAD {
            return Err(std::io::Error::other("request head too large"));
        }
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(chunk.get(..n).unwrap_or_default());
    };
    let head = String::from_utf8_lossy(buf.get(..head_end).unwrap_or_default()).to_ascii_lowercase();
    let length: usize = head
        .lines()
        .find_map(|line| line.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut remaining = length.saturating_sub(buf.len() - head_end);
    while remaining > 0 {
        let n = client.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        remaining = remaining.saturating_sub(n);
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// VictoriaMetrics, and either engine
// ---------------------------------------------------------------------------------------------

/// `-search.latencyOffset` of the test VictoriaMetrics. Its default, 30s, hides every sample
/// younger than that from queries, even one with an explicit `time=now`: values would trail the
/// truth by 30 s (a gauge shows its value of 30 s ago) and a series younger than 30 s would be
/// missing. 1s leaves VictoriaMetrics the second it needs to make freshly scraped samples
/// searchable.
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub const VICTORIA_METRICS_LATENCY_OFFSET: &str = "1s";

/// A running VictoriaMetrics (single node), killed on drop: it scrapes the same
/// [`PrometheusOptions::jobs`] (its own `-promscrape.config`), its history is imported through
/// `/api/v1/import/prometheus` before the first query, and it serves the Prometheus query API.
/// It keeps no query log.
#[derive(Debug)]
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub struct VictoriaMetrics {
    child: Option<Child>,
    port: u16,
    options: PrometheusOptions,
}

/// The VictoriaMetrics binary (`VICTORIA_METRICS_BIN` overrides).
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
fn victoria_metrics_bin() -> String {
    std::env::var("VICTORIA_METRICS_BIN").unwrap_or_else(|_| "victoria-metrics".to_string())
}

#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
impl VictoriaMetrics {
    /// Writes the scrape configuration, starts VictoriaMetrics on a free loopback port, imports
    /// the backfill history and waits until it is searchable.
    pub async fn start(options: PrometheusOptions) -> Result<Self> {
        apiserver::install_crypto_provider();
        std::fs::create_dir_all(options.dir.join("data"))?;
        std::fs::write(options.dir.join("scrape.yml"), victoria_metrics_config_yaml(&options))?;
        let history = options.backfill.clone();
        let mut vm = Self { child: None, port: 0, options };
        vm.spawn_on_free_port().await?;
        if let Some(history) = history {
            vm.import(&history).await?;
        }
        Ok(vm)
    }

    /// Imports OpenMetrics `history` (timestamps in seconds) through the Prometheus text import
    /// (timestamps in milliseconds), then flushes it to searchable storage.
    async fn import(&self, history: &str) -> Result<()> {
        let fail = |message: String| DevEnvError::Program { program: victoria_metrics_bin(), message };
        let client = reqwest::Client::new();
        let response = client
            .post(format!("{}/api/v1/import/prometheus", self.url()))
            .body(prometheus_text_in_milliseconds(history))
            .send()
            .await
            .map_err(|e| fail(format!("import: {e}")))?;
        if !response.status().is_success() {
            let status = response.status();
            let body = response.text().await.unwrap_or_default();
            return Err(fail(format!("import: HTTP {status}: {body}")));
        }
        // Imported samples become searchable within a few seconds; the flush makes it now.
        let response = client
            .get(format!("{}/internal/force_flush", self.url()))
            .send()
            .await
            .map_err(|e| fail(format!("force_flush: {e}")))?;
        if !response.status().is_success() {
            return Err(fail(format!("force_flush: HTTP {}", response.status())));
        }
        // Even flushed, the samples can take a moment to reach queries: wait until some do.
        let deadline = Instant::now() + Duration::from_secs(15);
        while Instant::now() < deadline {
            let answer: serde_json::Value = client
                .post(format!("{}/api/v1/query", self.url()))
                .form(&[("query", "count(count_over_time({__name__=~\".+\"}[1h]))")])
                .send()
                .await
                .map_err(|e| fail(format!("query after import: {e}")))?
                .json()
                .await
                .map_err(|e| fail(format!("query after import: {e}")))?;
            if answer["data"]["result"].as_array().is_some_and(|r| !r.is_empty()) {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Err(DevEnvError::Timeout("victoria-metrics imported history".into()))
    }

    async fn spawn(&mut self, port: u16) -> Result<()> {
        let dir = &self.options.dir;
        let data = dir.join("data");
        let log = std::fs::File::create(dir.join(format!("victoria-metrics-{port}.log")))?;
        let mut child = Command::new(victoria_metrics_bin())
            .arg(format!("-storageDataPath={}", data.display()))
            .arg(format!("-httpListenAddr=127.0.0.1:{port}"))
            .arg(format!("-promscrape.config={}", dir.join("scrape.yml").display()))
            // Targets written later (percolator's, once it has bound its port) are seen within
            // a second (the default is 5 minutes).
            .arg("-promscrape.fileSDCheckInterval=1s")
            .arg(format!("-search.latencyOffset={VICTORIA_METRICS_LATENCY_OFFSET}"))
            .arg("-retentionPeriod=1d")
            // History is imported after start: a response cached before it reaches queries
            // would hide it for good (VictoriaMetrics' advice while backfilling).
            .arg("-search.disableCache")
            .arg("-loggerLevel=WARN")
            .stdout(Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| DevEnvError::Program { program: victoria_metrics_bin(), message: e.to_string() })?;
        // Ready, but is it ours? Its flags name its data directory.
        let ours = format!("-storageDataPath={:?}", data.display().to_string());
        wait_until_ours(&mut child, &victoria_metrics_bin(), port, "flags", |flags| {
            flags.is_some_and(|text| text.contains(&ours))
        })
        .await?;
        self.port = port;
        self.child = Some(child);
        Ok(())
    }

    /// Stops VictoriaMetrics (SIGKILL; the data directory stays, without the samples of the
    /// last seconds that were not flushed yet).
    pub async fn stop(&mut self) {
        self.kill().await;
    }

    /// Starts VictoriaMetrics again on the same port with the same data.
    pub async fn restart(&mut self) -> Result<()> {
        self.respawn().await
    }
}

/// VictoriaMetrics' `-promscrape.config`: the jobs of `options` in the Prometheus format, less
/// the fields it refuses (`evaluation_interval`, `query_log_file`, file_sd's
/// `refresh_interval`).
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub(crate) fn victoria_metrics_config_yaml(options: &PrometheusOptions) -> String {
    let interval = k8s_wire::duration::promql(options.scrape_interval);
    format!("global:\n  scrape_interval: {interval}\n{}", scrape_configs_yaml(options, false))
}

/// OpenMetrics text (sample timestamps in seconds, possibly fractional) as Prometheus text
/// exposition, whose timestamps are whole milliseconds: what `/api/v1/import/prometheus` reads.
/// Comment lines (`# TYPE`, `# EOF`) and samples without a timestamp pass unchanged.
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub(crate) fn prometheus_text_in_milliseconds(openmetrics: &str) -> String {
    let mut out = String::with_capacity(openmetrics.len() + openmetrics.len() / 16);
    for line in openmetrics.lines() {
        // The labels end at the last `}`; a label value may hold spaces, the value and the
        // timestamp after it do not.
        let labels_end =
            if line.starts_with('#') { None } else { line.rfind('}').or_else(|| line.find(' ')) };
        let converted = labels_end.and_then(|at| {
            let (series, rest) = line.split_at(at + 1);
            let mut fields = rest.split_whitespace();
            let value = fields.next()?;
            let seconds: f64 = fields.next()?.parse().ok()?;
            Some(format!("{} {value} {}", series.trim_end(), (seconds * 1000.0).round() as i64))
        });
        out.push_str(converted.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// Which time-series engine serves the PromQL API of a development environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub enum Engine {
    /// Prometheus (Debian's `prometheus`).
    #[default]
    Prometheus,
    /// VictoriaMetrics single node (Debian's `victoria-metrics`).
    VictoriaMetrics,
}

/// A running [`Engine`], for tests that do not care which.
#[derive(Debug)]
#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
pub enum MetricsEngine {
    /// A [`Prometheus`].
    Prometheus(Prometheus),
    /// A [`VictoriaMetrics`].
    VictoriaMetrics(VictoriaMetrics),
}

#[allow(dead_code, reason = "for the end-to-end tests, which include this file too")]
impl MetricsEngine {
    /// Starts `engine` with `options` (history backfilled, ready to query).
    pub async fn start(engine: Engine, options: PrometheusOptions) -> Result<Self> {
        Ok(match engine {
            Engine::Prometheus => Self::Prometheus(Prometheus::start(options).await?),
            Engine::VictoriaMetrics => Self::VictoriaMetrics(VictoriaMetrics::start(options).await?),
        })
    }

    /// Which engine this is.
    pub fn engine(&self) -> Engine {
        match self {
            Self::Prometheus(_) => Engine::Prometheus,
            Self::VictoriaMetrics(_) => Engine::VictoriaMetrics,
        }
    }

    /// Base URL of the HTTP API.
    pub fn url(&self) -> String {
        match self {
            Self::Prometheus(p) => p.url(),
            Self::VictoriaMetrics(v) => v.url(),
        }
    }

    /// Waits until every job has been scraped successfully at least once.
    pub async fn wait_for_targets(&self, timeout: Duration) -> Result<()> {
        match self {
            Self::Prometheus(p) => p.wait_for_targets(timeout).await,
            Self::VictoriaMetrics(v) => v.wait_for_targets(timeout).await,
        }
    }

    /// Waits until `job` has been scraped successfully at least once.
    pub async fn wait_for_job(&self, job: &str, timeout: Duration) -> Result<()> {
        match self {
            Self::Prometheus(p) => p.wait_for_job(job, timeout).await,
            Self::VictoriaMetrics(v) => v.wait_for_job(job, timeout).await,
        }
    }

    /// Every PromQL expression the engine has run so far, in order; `None` when the engine
    /// keeps no query log (VictoriaMetrics).
    pub fn logged_queries(&self) -> Option<Vec<String>> {
        match self {
            Self::Prometheus(p) => Some(p.queries()),
            Self::VictoriaMetrics(_) => None,
        }
    }

    /// Stops the engine (SIGKILL; the data directory stays).
    pub async fn stop(&mut self) {
        match self {
            Self::Prometheus(p) => p.stop().await,
            Self::VictoriaMetrics(v) => v.stop().await,
        }
    }

    /// Starts the engine again on the same port with the same data.
    pub async fn restart(&mut self) -> Result<()> {
        match self {
            Self::Prometheus(p) => p.restart().await,
            Self::VictoriaMetrics(v) => v.restart().await,
        }
    }
}
