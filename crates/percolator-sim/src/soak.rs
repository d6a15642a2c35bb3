//! The soak run (RELIABILITY.md, "Soak"; `scripts/soak.sh`, `percolator-sim soak`): hours of
//! churn and faults against a real percolator, checking that nothing grows.
//!
//! [`run`] starts the simulator (pods with churn), a real Prometheus scraping it (history
//! backfilled), and percolator with every API enabled (the kinds, a declared kind from its
//! `--config` file, `metrics.k8s.io`, custom and external metrics), its serving certificate
//! from files and the front proxy's CA; then, for [`Options::duration`]:
//!
//! - steady clients over HTTP/2 with the front proxy's client certificate and
//!   `X-Remote-User`/`X-Remote-Group`, as kube-aggregator sends them: lists of each kind, in
//!   every namespace and in each, JSON and Table, with and without a label selector
//!   ([`load`]); HPA-like gets of custom and external metrics, every target once per 15 s;
//!   `kubectl top` lists of `metrics.k8s.io`;
//! - faults on a [`Schedule`] scaled with the duration: Prometheus stopped and restarted, one
//!   kubelet down one period in five, the `--config` file edited (a valid edit, then an invalid
//!   one, in turn), the serving certificate rotated once, the simulator's watches expired
//!   (`410`, `gone-once`) once; after each, the time until the first complete answer;
//! - a [`Sample`] every [`Schedule::sample_every`]: resident memory, descriptors and threads
//!   (`/proc/<pid>`), tokio tasks alive, cache entries and parked kubelet connections
//!   (percolator's `/metrics`), latency percentiles and answers by code.
//!
//! The [`Report`] judges the goals ([`Report::failures`]) and is written to the directory as
//! `report.md`, `samples.csv` and `soak.svg` ([`plot`]).

mod load;
mod plot;
pub mod stats;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::process::{Child, Command};
use tokio::sync::Mutex;

use crate::devenv::{self, Prometheus, PrometheusOptions, ScrapeJob};
use crate::{launch, procfs};
pub use load::{Class, Record, Records};
use load::{Clients, Run, Target};
pub use stats::{Cycle, Slope, Trend};

/// Errors of the soak run (a goal missed is not one: see [`Report::failures`]).
#[derive(Debug, thiserror::Error)]
pub enum SoakError {
    /// Something could not be started or prepared.
    #[error("{0}")]
    Setup(String),
    /// File I/O.
    #[error(transparent)]
    Io(#[from] std::io::Error),
    /// Prometheus.
    #[error(transparent)]
    DevEnv(#[from] devenv::DevEnvError),
    /// The HTTP client could not be built or the simulator's control port failed.
    #[error("HTTP: {0}")]
    Http(#[from] reqwest::Error),
    /// The picture.
    #[error("picture: {0}")]
    Plot(String),
}

/// Result alias of this module.
pub type Result<T> = std::result::Result<T, SoakError>;

const PODS_PER_NODE: u32 = 30;
const NAMESPACES: usize = 10;
const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
const CUSTOM: &str = "/apis/custom.metrics.k8s.io/v1beta2";
const EXTERNAL: &str = "/apis/external.metrics.k8s.io/v1beta1";
const RESOURCE: &str = "/apis/metrics.k8s.io/v1beta1";
/// The kinds listed: the two built-in ones and the one the `--config` file declares.
const KINDS: [&str; 3] = ["podmetricssummaries", "cafebrewstats", "podtraffics"];

/// `percolator-sim soak`: the flags of `scripts/soak.sh`.
#[derive(Debug, Clone, clap::Args)]
pub struct SoakArgs {
    /// How long the load and the faults run, in minutes (the warm-up, the fault periods and
    /// the sampling scale with it).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(3..=1440))]
    pub minutes: u64,
    /// Pods of the simulator (30 per node).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u32).range(30..=150_000))]
    pub pods: u32,
    /// Where the report (report.md, samples.csv, soak.svg) and the processes' files (run/) go.
    #[arg(long, default_value = "target/soak")]
    pub out: PathBuf,
    /// The percolator binary (default: `percolator` beside this binary).
    #[arg(long)]
    pub percolator: Option<PathBuf>,
    /// The faults to schedule, comma-separated (default: every one); `none` runs the load and
    /// the churn alone. To tell which fault a growth follows.
    #[arg(long, value_delimiter = ',', default_value = "prometheus,kubelet,config,certificate,watch")]
    pub faults: Vec<FaultClass>,
    /// One running pod replaced this often (the simulator's `--churn-interval`). At the default
    /// 2 s, 10,000 pods are all replaced in 5.5 hours; a shorter interval replaces them within
    /// the run, to tell memory that follows the pods' turnover from a leak.
    #[arg(long, default_value = "2s", value_parser = k8s_wire::duration::parse)]
    pub churn_interval: Duration,
}

/// A fault of the schedule, as `--faults` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum FaultClass {
    /// Prometheus restarted every cycle.
    Prometheus,
    /// One kubelet hanging a fifth of each flap cycle.
    Kubelet,
    /// The `--config` file edited, valid and invalid in turn.
    Config,
    /// The serving certificate rotated once.
    Certificate,
    /// The watches expired (410) once.
    Watch,
    /// No fault at all (alone).
    None,
}

impl SoakArgs {
    /// The options of the run these flags ask for.
    pub fn options(&self) -> Result<Options> {
        let percolator = match &self.percolator {
            Some(path) => path.clone(),
            None => {
                std::env::current_exe()?.with_file_name(format!("percolator{}", std::env::consts::EXE_SUFFIX))
            }
        };
        if !percolator.is_file() {
            return Err(SoakError::Setup(format!(
                "no percolator binary at {}: build it (`cargo build --release --bin percolator`) or pass --percolator",
                percolator.display()
            )));
        }
        std::fs::create_dir_all(&self.out)?;
        let dir = std::fs::canonicalize(&self.out)?;
        let mut options = Options::new(percolator, dir, Duration::from_secs(self.minutes * 60), self.pods);
        options.schedule.faults = self.faults.iter().copied().filter(|f| *f != FaultClass::None).collect();
        if self.churn_interval.is_zero() {
            return Err(SoakError::Setup(
                "--churn-interval must be more than 0: the soak runs with pod churn".into(),
            ));
        }
        options.churn = self.churn_interval;
        Ok(options)
    }
}

/// What one soak run does.
#[derive(Debug, Clone)]
pub struct Options {
    /// The percolator binary.
    pub percolator: PathBuf,
    /// Where the processes keep their files (`run/`) and the report is written.
    pub dir: PathBuf,
    /// How long the clients and faults run.
    pub duration: Duration,
    /// Pods of the simulator (30 per node).
    pub pods: u32,
    /// percolator's `--cache-ttl`: also the recovery goal.
    pub cache_ttl: Duration,
    /// percolator's `--request-timeout`: no request may take longer.
    pub request_timeout: Duration,
    /// percolator's `--tls-reload-interval` (the serving certificate and the `--config` file
    /// are polled at it).
    pub reload_interval: Duration,
    /// Prometheus' scrape interval.
    pub scrape: Duration,
    /// The rates' window (the `--config` file's `window`).
    pub window: String,
    /// The simulator's `--churn-interval` (one pod replaced each time).
    pub churn: Duration,
    /// Each list worker sends one list this often.
    pub list_every: Duration,
    /// List workers (each on its own HTTP/2 connection).
    pub list_workers: usize,
    /// HPA-like targets (half custom, half external metrics), each asked once per 15 s.
    pub hpa_targets: usize,
    /// One `kubectl top` request this often.
    pub top_every: Duration,
    /// The fault schedule and sampling.
    pub schedule: Schedule,
}

impl Options {
    /// The soak of `scripts/soak.sh`: `duration` (one hour by default) at `pods` (10,000), with
    /// percolator's defaults (`--cache-ttl 15s`, `--request-timeout 60s`,
    /// `--tls-reload-interval 10s`, a 5-minute window), pod churn every 2 s, four list workers
    /// each listing every 2 s, 50 HPA targets, `kubectl top` every 5 s.
    pub fn new(percolator: PathBuf, dir: PathBuf, duration: Duration, pods: u32) -> Self {
        let cache_ttl = Duration::from_secs(15);
        Self {
            percolator,
            dir,
            duration,
            pods,
            cache_ttl,
            request_timeout: Duration::from_secs(60),
            reload_interval: Duration::from_secs(10),
            scrape: Duration::from_secs(15),
            window: "5m".to_owned(),
            churn: Duration::from_secs(2),
            list_every: Duration::from_secs(2),
            list_workers: 4,
            hpa_targets: 50,
            top_every: Duration::from_secs(5),
            schedule: Schedule::for_duration(duration, cache_ttl),
        }
    }

    /// The few minutes' version of the test suite: `pods` pods, `--cache-ttl 5s`,
    /// `--tls-reload-interval 2s`, a 1-minute window scraped every 5 s, lighter clients, and
    /// the first half of the run (whole fault cycles) as the warm-up: in a few minutes the
    /// caches and the allocator are still reaching the sizes they keep.
    pub fn short(percolator: PathBuf, dir: PathBuf, duration: Duration, pods: u32) -> Self {
        let cache_ttl = Duration::from_secs(5);
        let mut schedule = Schedule::for_duration(duration, cache_ttl);
        let cycle = schedule.cycle().as_secs().max(1);
        schedule.warm_up = Duration::from_secs(duration.as_secs() / 2 / cycle * cycle).max(schedule.warm_up);
        Self {
            cache_ttl,
            reload_interval: Duration::from_secs(2),
            scrape: Duration::from_secs(5),
            window: "1m".to_owned(),
            list_every: Duration::from_secs(2),
            list_workers: 2,
            top_every: Duration::from_secs(5),
            schedule,
            ..Self::new(percolator, dir, duration, pods)
        }
    }
}

impl Options {
    /// The simulated nodes: `pods` at `PODS_PER_NODE` each, at least one.
    pub fn nodes(&self) -> u32 {
        self.pods.div_ceil(PODS_PER_NODE).max(1)
    }

    /// Seconds within which `kind` must have recovered: one cache TTL, plus 1 s because the
    /// probes poll every half second; for a hanging kubelet also `--kubelet-request-timeout`,
    /// since a fetch sent while the kubelet hung runs out its timeout after the kubelet is
    /// back, and the node is sampled again (every TTL) only then.
    pub fn recovery_goal(&self, kind: FaultKind) -> f64 {
        let goal = self.cache_ttl.as_secs_f64() + 1.0;
        if kind == FaultKind::Kubelet { goal + KUBELET_REQUEST_TIMEOUT.as_secs_f64() } else { goal }
    }
}

/// percolator's `--kubelet-request-timeout` in the soak (its default, passed explicitly).
const KUBELET_REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the simulator and percolator may take to say they are ready (a cluster of
/// thousands of pods takes seconds; a hang fails the run instead of stalling it).
const START_TIMEOUT: Duration = Duration::from_secs(600);

/// When the faults happen and samples are taken, scaled with the run's length: the hour's
/// values times `minutes / 60`, with floors so that a short run still has each fault. A run
/// longer than the hour keeps the hour's values (the rates: Prometheus restarted every
/// 10 minutes, a kubelet flap every 5, an edit every 5, a sample every 30 s, a 10-minute
/// warm-up), so that whether memory levels off over hours is measured under the same load.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Samples before this are not fitted (10 minutes for the hour; at least one minute).
    pub warm_up: Duration,
    /// Sampling period (30 s for the hour; at least 5 s).
    pub sample_every: Duration,
    /// Prometheus is stopped this often (10 minutes for the hour; at least a minute)…
    pub prometheus_every: Duration,
    /// …for this long (30 s; at least 10 s).
    pub prometheus_down: Duration,
    /// One kubelet is down the middle fifth of each such period (5 minutes; at least a minute).
    pub flap_cycle: Duration,
    /// The `--config` file is edited this often, half a period in (5 minutes; at least 30 s).
    pub config_every: Duration,
    /// When the serving certificate is rotated (55% of the run).
    pub rotate_at: Duration,
    /// When the watches are expired (near 45% of the run, at 80% of a kubelet flap cycle).
    pub watch_at: Duration,
    /// No fault starts in the run's last stretch this long, so that every recovery is seen.
    pub quiet_tail: Duration,
    /// The faults scheduled (every one unless `--faults` says otherwise).
    pub faults: Vec<FaultClass>,
}

impl Schedule {
    /// The schedule of a run of `duration` with `--cache-ttl` `ttl`.
    pub fn for_duration(duration: Duration, ttl: Duration) -> Self {
        let scale = (duration.as_secs_f64() / 3600.0).min(1.0);
        let scaled = |hour_value: u64, floor: u64| {
            Duration::from_secs_f64((hour_value as f64 * scale).max(floor as f64))
        };
        Self {
            warm_up: scaled(600, 60).min(duration / 3),
            sample_every: scaled(30, 5),
            prometheus_every: scaled(600, 60),
            prometheus_down: scaled(30, 10),
            flap_cycle: scaled(300, 60),
            config_every: scaled(300, 30),
            rotate_at: duration.mul_f64(0.55),
            // In the kubelet's quiet part of a flap cycle (it hangs from 40% to 60% of each),
            // so that the re-list after the 410 is not timed waiting on the hung kubelet.
            watch_at: {
                let cycle = scaled(300, 60);
                cycle.mul_f64((duration.as_secs_f64() * 0.45 / cycle.as_secs_f64()).floor() + 0.8)
            },
            quiet_tail: ttl * 3 + Duration::from_secs(10),
            faults: vec![
                FaultClass::Prometheus,
                FaultClass::Kubelet,
                FaultClass::Config,
                FaultClass::Certificate,
                FaultClass::Watch,
            ],
        }
    }

    /// The period on which the recurring faults repeat (Prometheus' restarts; the kubelet's
    /// flap and the edits divide it in the hour's schedule and its scalings): the slopes are
    /// fitted with its profile taken out ([`Slope::fit_deseasonalized`]), from the end of the
    /// warm-up, which is a whole number of cycles.
    pub fn cycle(&self) -> Duration {
        self.prometheus_every
    }

    /// The end of the warm-up, the cycle and the sampling period, in hours: the time base of
    /// the fits ([`Trend::fit`], [`Cycle::of`]).
    fn fit_hours(&self) -> (f64, f64, f64) {
        (
            self.warm_up.as_secs_f64() / 3600.0,
            self.cycle().as_secs_f64() / 3600.0,
            self.sample_every.as_secs_f64() / 3600.0,
        )
    }

    /// Every fault of a run of `duration`, by start time.
    fn events(&self, duration: Duration) -> Vec<(Duration, Event)> {
        let last = duration.saturating_sub(self.quiet_tail);
        let mut events = Vec::new();
        let mut at = self.prometheus_every;
        while at <= last {
            events.push((at, Event::Prometheus));
            at += self.prometheus_every;
        }
        let mut at = self.flap_cycle.mul_f64(0.4);
        while at <= last {
            events.push((at, Event::Kubelet(self.flap_cycle / 5)));
            at += self.flap_cycle;
        }
        let (mut at, mut edit) = (self.config_every / 2, 0u32);
        while at <= last {
            events.push((at, Event::Config { edit, valid: edit.is_multiple_of(2) }));
            at += self.config_every;
            edit += 1;
        }
        events.push((self.rotate_at, Event::Certificate));
        events.push((self.watch_at, Event::WatchGone));
        events.retain(|(_, event)| self.faults.contains(&event.class()));
        events.sort_by_key(|(at, _)| *at);
        events
    }
}

#[derive(Debug, Clone, Copy)]
enum Event {
    Prometheus,
    Kubelet(Duration),
    Config { edit: u32, valid: bool },
    Certificate,
    WatchGone,
}

impl Event {
    fn class(self) -> FaultClass {
        match self {
            Event::Prometheus => FaultClass::Prometheus,
            Event::Kubelet(_) => FaultClass::Kubelet,
            Event::Config { .. } => FaultClass::Config,
            Event::Certificate => FaultClass::Certificate,
            Event::WatchGone => FaultClass::Watch,
        }
    }
}

/// The kind of a fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum FaultKind {
    /// Prometheus stopped, then started again on the same data.
    Prometheus,
    /// One kubelet hanging (requests read, never answered).
    Kubelet,
    /// A valid edit of the `--config` file (a custom metric added).
    ConfigValid,
    /// An invalid edit of the `--config` file (a query that does not parse).
    ConfigInvalid,
    /// The serving certificate replaced by one of another CA.
    Certificate,
    /// Every watch dropped and the next resuming ones answered `410 Expired`.
    WatchGone,
}

impl FaultKind {
    /// The `--faults` class that schedules it.
    fn class(self) -> FaultClass {
        match self {
            FaultKind::Prometheus => FaultClass::Prometheus,
            FaultKind::Kubelet => FaultClass::Kubelet,
            FaultKind::ConfigValid | FaultKind::ConfigInvalid => FaultClass::Config,
            FaultKind::Certificate => FaultClass::Certificate,
            FaultKind::WatchGone => FaultClass::Watch,
        }
    }

    /// Its name in the report and the picture.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Prometheus => "Prometheus restart",
            FaultKind::Kubelet => "kubelet down",
            FaultKind::ConfigValid => "--config valid edit",
            FaultKind::ConfigInvalid => "--config invalid edit",
            FaultKind::Certificate => "certificate rotation",
            FaultKind::WatchGone => "watches expired (410)",
        }
    }

    /// What "recovered" means for it.
    pub fn recovery(self) -> &'static str {
        match self {
            FaultKind::Prometheus => "custom and external metrics 200, declared kind with its values",
            FaultKind::Kubelet => "the node's pods listed with their memory again",
            FaultKind::ConfigValid => "the added custom metric served",
            FaultKind::ConfigInvalid => "rejection reported (reload gauge 0), previous metrics still served",
            FaultKind::Certificate => "a new connection gets the new certificate",
            FaultKind::WatchGone => "a pod created after the 410 is listed",
        }
    }
}

/// One fault and its recovery.
#[derive(Debug, Clone)]
pub struct Fault {
    /// What it was.
    pub kind: FaultKind,
    /// Seconds since the start when it began.
    pub start: f64,
    /// Seconds since the start when it ended (the same as `start` for instant faults).
    pub end: f64,
    /// Seconds from its end (for the watches: from the first pod created after it) to the
    /// first complete answer; `None` when none came before the probe gave up.
    pub recovered_after: Option<f64>,
    /// `503` answers sent while it lasted.
    pub answers_503: usize,
    /// What it touched (a node, an edit number).
    pub detail: String,
}

/// One sample of percolator's process and answers.
#[derive(Debug, Clone, Default)]
pub struct Sample {
    /// Seconds since the start.
    pub at: f64,
    /// Resident memory (`VmRSS`).
    pub rss_bytes: u64,
    /// Open file descriptors.
    pub fds: u64,
    /// Threads.
    pub threads: u64,
    /// `percolator_tokio_tasks_alive`.
    pub tasks: u64,
    /// Sum of `percolator_cache_entries`.
    pub cache_entries: u64,
    /// `percolator_kubelet_connections_parked`.
    pub parked: u64,
    /// `process_resident_memory_bytes` as percolator exports it (read just before `rss_bytes`).
    pub exported_rss_bytes: u64,
    /// `process_open_fds` as percolator exports it.
    pub exported_fds: u64,
    /// Requests sent in the period before this sample that were answered.
    pub requests: usize,
    /// Latency percentiles and maximum of those (seconds).
    pub p50_seconds: f64,
    /// 99th percentile.
    pub p99_seconds: f64,
    /// Longest.
    pub max_seconds: f64,
    /// Answers by code in the period (0: failed without an answer).
    pub codes: BTreeMap<u16, usize>,
    /// Kubelet fetches percolator ended in the period, whatever their outcome.
    pub kubelet_fetches: u64,
    /// Of those, the ones that timed out (the kubelet, or waiting for a fetch slot).
    pub kubelet_timeouts: u64,
    /// Their mean duration, slot wait included (seconds; 0 without fetches).
    pub kubelet_fetch_seconds: f64,
    /// CPU percolator used in the period, in cores.
    pub cpu_percolator: f64,
    /// CPU the simulator (every kubelet, kube-apiserver, the apps) used, in cores.
    pub cpu_sim: f64,
    /// Of the resident memory, what transparent huge pages hold (`AnonHugePages`): 0 unless
    /// they are allowed (percolator turns them off; `MIMALLOC_ALLOW_THP` leaves it to mimalloc).
    pub huge_pages_bytes: u64,
}

/// What a soak run measured and whether the goals were met.
#[derive(Debug, Clone)]
pub struct Report {
    /// The options of the run.
    pub options: Options,
    /// Every sample.
    pub samples: Vec<Sample>,
    /// Every fault, by start.
    pub faults: Vec<Fault>,
    /// Trends after the warm-up: (what, unit, fit).
    pub slopes: Vec<(&'static str, &'static str, Option<Trend>)>,
    /// Answers by class and code over the whole run.
    pub codes: BTreeMap<(Class, u16), usize>,
    /// Answers 5xx other than the documented 503s while Prometheus is down, and failed
    /// requests (no answer).
    pub unexpected: usize,
    /// The first few of those, described.
    pub unexpected_examples: Vec<String>,
    /// The longest request, seconds.
    pub max_latency: f64,
    /// Requests sent.
    pub requests: usize,
    /// How percolator ended (SIGTERM after the load).
    pub exit: Exit,
    /// The goals missed (empty: all met).
    pub failures: Vec<String>,
    /// The report as markdown.
    pub markdown: String,
}

impl Report {
    /// Kubelet fetches after the warm-up per node and per background sampling interval
    /// (`--cache-ttl`, at most a third of percolator's default 60 s `--max-rate-window`): 1
    /// when each node is sampled once an interval and no request fetched a node itself; more
    /// when requests fetch nodes whose sample expired; less when the sampler falls behind or a
    /// kubelet hangs. `None` without two samples after the warm-up.
    pub fn kubelet_fetches_per_interval(&self) -> Option<f64> {
        let warm_up = self.options.schedule.warm_up.as_secs_f64();
        let after: Vec<&Sample> = self.samples.iter().filter(|s| s.at >= warm_up).collect();
        let (first, last) = (after.first()?, after.last()?);
        let elapsed = last.at - first.at;
        if elapsed <= 0.0 {
            return None;
        }
        // The first sample's period began before it: counted from its end.
        let fetches: u64 = after[1..].iter().map(|s| s.kubelet_fetches).sum();
        let interval = self.options.cache_ttl.min(Duration::from_secs(20)).as_secs_f64();
        let nodes = f64::from(self.options.nodes());
        Some(fetches as f64 / (nodes * elapsed / interval))
    }
}

struct Sim {
    _child: Child,
    pid: u32,
    state: PathBuf,
    metrics: String,
}

struct Percolator {
    child: Child,
    pid: u32,
    url: String,
}

/// The serving certificate files, as a Secret volume lays them out (`..data` a symlink to the
/// version in force, `tls.crt`/`tls.key` links through it), so that a rotation is atomic.
struct Serving {
    dir: PathBuf,
}

impl Serving {
    fn write(&self, version: &str, pair: &(String, String)) -> Result<()> {
        let dir = self.dir.join(version);
        std::fs::create_dir_all(&dir)?;
        std::fs::write(dir.join("tls.crt"), &pair.0)?;
        std::fs::write(dir.join("tls.key"), &pair.1)?;
        let tmp = self.dir.join("..data_tmp");
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink(version, &tmp)?;
        std::fs::rename(tmp, self.dir.join("..data"))?;
        for file in ["tls.crt", "tls.key"] {
            let link = self.dir.join(file);
            if std::fs::symlink_metadata(&link).is_err() {
                std::os::unix::fs::symlink(format!("..data/{file}"), link)?;
            }
        }
        Ok(())
    }
}

/// The `--config` file: a declared kind (`PodTraffic`), the custom metrics (with
/// `soak_edit_N` after edit N), and for an invalid edit one more whose query does not parse.
fn config_yaml(window: &str, edit: Option<u32>, valid: bool) -> String {
    let rate = "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))";
    let mut yaml = format!(
        "window: {window}\nkinds:\n- kind: PodTraffic\n  nameLabel: pod\n  fields:\n  - name: requests\n    query: {rate}\n    column: REQ/S\n  - name: errors\n    query: sum by (namespace, pod) (rate(http_requests_total{{code=~\"5..\",SCOPE}}[WINDOW]))\n    column: ERR/S\ncustomMetrics:\n- name: http_requests_per_second\n  query: {rate}\n  labels: [code]\n"
    );
    if let Some(n) = edit {
        let _ = write!(yaml, "- name: soak_edit_{n}\n  query: {rate}\n");
    }
    if !valid {
        yaml.push_str(
            "- name: broken\n  query: sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW])\n",
        );
    }
    yaml
}

fn write_atomically(path: &Path, text: &str) -> Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)?;
    Ok(())
}

async fn start_sim(options: &Options, run: &Path) -> Result<Sim> {
    let nodes = options.nodes();
    let namespaces: Vec<String> = (0..NAMESPACES).map(|i| format!("ns-{i}")).collect();
    let churn = format!("{}ms", options.churn.as_millis());
    let mut command = crate::command(run)?;
    command
        .args(["--nodes", &nodes.to_string(), "--pods-per-node", &PODS_PER_NODE.to_string()])
        .args(["--namespaces", &namespaces.join(","), "--cafes-per-namespace", "2"])
        .args(["--housekeeping", "10s", "--churn-interval", &churn]);
    let (child, ready) = launch::start_sim(command, START_TIMEOUT)
        .await
        .map_err(|e| SoakError::Setup(format!("{e}\n(see {})", run.join("sim.log").display())))?;
    let field = |name: &str| ready[name].as_str().unwrap_or_default().to_owned();
    let pid = child.id().unwrap_or(0);
    Ok(Sim { _child: child, pid, state: run.join("sim"), metrics: field("metrics") })
}

async fn start_prometheus(options: &Options, run: &Path, sim: &Sim) -> Result<Prometheus> {
    let target = sim.metrics.trim_start_matches("http://").to_owned();
    let window = k8s_wire::duration::parse(&options.window).unwrap_or(Duration::from_secs(300));
    let history = devenv::sim_history(&sim.metrics, "sim-apps", &target, window * 2, options.scrape).await?;
    let prometheus = Prometheus::start(PrometheusOptions {
        dir: run.join("prometheus"),
        jobs: vec![ScrapeJob::http("sim-apps", target)],
        scrape_interval: options.scrape,
        backfill: Some(history),
    })
    .await?;
    prometheus.wait_for_targets(Duration::from_secs(300)).await?;
    Ok(prometheus)
}

fn go_duration(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

async fn start_percolator(
    options: &Options,
    run: &Path,
    sim: &Sim,
    prometheus_url: &str,
) -> Result<Percolator> {
    let path = |p: PathBuf| p.to_string_lossy().into_owned();
    let mut command =
        launch::percolator_command(&options.percolator, 0, &sim.state.join("kubeconfig"), prometheus_url);
    command
        // As the container image runs it (the Dockerfile's ENV).
        .env("MIMALLOC_PURGE_DELAY", "0")
        .args(["-v", "1"])
        .args(["--cache-ttl", &go_duration(options.cache_ttl)])
        .args(["--request-timeout", &go_duration(options.request_timeout)])
        .args(["--kubelet-request-timeout", &go_duration(KUBELET_REQUEST_TIMEOUT)])
        .args(["--tls-reload-interval", &go_duration(options.reload_interval)])
        .args(["--tls-cert-file", &path(run.join("serving/tls.crt"))])
        .args(["--tls-private-key-file", &path(run.join("serving/tls.key"))])
        .args(["--config", &path(run.join("config.yaml"))])
        .args(["--enable-custom-metrics", "--enable-external-metrics", "--enable-resource-metrics"])
        .args(["--requestheader-client-ca-file", &path(run.join("front-proxy/ca.crt"))])
        .args(["--requestheader-allowed-names", load::FRONT_PROXY_CN])
        .args(["--requestheader-username-headers", "X-Remote-User"])
        .args(["--requestheader-group-headers", "X-Remote-Group"])
        .args(["--requestheader-extra-headers-prefix", "X-Remote-Extra-"]);
    let log = run.join("percolator.log");
    let what = options.percolator.display().to_string();
    let launch::Started { child, pid, address } =
        launch::start(command, &what, START_TIMEOUT, launch::log_file(&log))
            .await
            .map_err(|e| SoakError::Setup(format!("{e}\n(see {})", log.display())))?;
    Ok(Percolator { child, pid, url: format!("https://{address}") })
}

/// What the simulator says it runs: namespaces with their apps, cafes, pods by node.
struct Truth(Value);

impl Truth {
    async fn fetch(sim: &Sim) -> Result<Self> {
        Ok(Self(reqwest::get(format!("{}/sim/truth", sim.metrics)).await?.error_for_status()?.json().await?))
    }

    fn items(&self, key: &str) -> &[Value] {
        self.0[key].as_array().map_or(&[], Vec::as_slice)
    }

    /// (namespace, app) of the running pods, each pair once.
    fn apps(&self) -> Vec<(String, String)> {
        let mut apps: Vec<(String, String)> = self
            .items("pods")
            .iter()
            .filter_map(|p| {
                Some((p["namespace"].as_str()?.to_owned(), p["labels"]["app"].as_str()?.to_owned()))
            })
            .collect();
        apps.sort();
        apps.dedup();
        apps
    }

    fn cafes(&self) -> Vec<(String, String)> {
        self.items("cafes")
            .iter()
            .filter_map(|c| Some((c["namespace"].as_str()?.to_owned(), c["name"].as_str()?.to_owned())))
            .collect()
    }

    /// (namespace, name) of the running pods on `node`.
    fn pods_on(&self, node: &str) -> Vec<(String, String)> {
        self.items("pods")
            .iter()
            .filter(|p| p["node"] == node && p["phase"] == "Running")
            .filter_map(|p| Some((p["namespace"].as_str()?.to_owned(), p["name"].as_str()?.to_owned())))
            .collect()
    }
}

fn enc(selector: &str) -> String {
    selector.replace('=', "%3D").replace(',', "%2C")
}

/// The lists the list workers send in turn.
fn list_targets() -> Vec<Target> {
    let mut targets = Vec::new();
    for kind in KINDS {
        let mut scopes = vec![format!("{GV}/{kind}")];
        scopes.extend((0..NAMESPACES).map(|i| format!("{GV}/namespaces/ns-{i}/{kind}")));
        for path in scopes {
            for accept in [None, Some(load::TABLE)] {
                targets.push(Target { path: path.clone(), accept, class: Class::List });
            }
        }
        if kind != "cafebrewstats" {
            for i in 0..NAMESPACES {
                let path = format!("{GV}/namespaces/ns-{i}/{kind}?labelSelector={}", enc("app=web"));
                targets.push(Target::json(path, Class::List));
            }
        }
    }
    targets
}

/// `count` HPA-like targets: half `Pods` custom metrics of an app's pods, half external
/// metrics of a cafe.
fn hpa_targets(truth: &Truth, count: usize) -> Vec<Target> {
    let apps = truth.apps();
    let cafes = truth.cafes();
    let mut targets = Vec::new();
    for i in 0..count {
        if i % 2 == 0 && !apps.is_empty() {
            let (ns, app) = &apps[(i / 2) % apps.len()];
            let path = format!(
                "{CUSTOM}/namespaces/{ns}/pods/*/http_requests_per_second?labelSelector={}",
                enc(&format!("app={app}"))
            );
            targets.push(Target::json(path, Class::Custom));
        } else if !cafes.is_empty() {
            let (ns, cafe) = &cafes[(i / 2) % cafes.len()];
            let metric = if (i / 2 / cafes.len()).is_multiple_of(2) {
                "cafe_brews_per_minute"
            } else {
                "cafe_brew_duration_p95_seconds"
            };
            let path =
                format!("{EXTERNAL}/namespaces/{ns}/{metric}?labelSelector={}", enc(&format!("cafe={cafe}")));
            targets.push(Target::json(path, Class::External));
        }
    }
    targets
}

/// What `kubectl top` sends: pods of every namespace, of one namespace with a selector, nodes.
fn top_targets() -> Vec<Target> {
    let mut targets = vec![Target::json(format!("{RESOURCE}/pods"), Class::Top)];
    for i in 0..NAMESPACES {
        targets.push(Target::json(
            format!("{RESOURCE}/namespaces/ns-{i}/pods?labelSelector={}", enc("app=web")),
            Class::Top,
        ));
        if i % 3 == 0 {
            targets.push(Target::json(format!("{RESOURCE}/nodes"), Class::Top));
        }
    }
    targets
}

/// Reads `name`'s value (the sum over its series) from a Prometheus text exposition.
fn metric_value(text: &str, name: &str) -> Option<f64> {
    metric_value_with(text, name, &[])
}

/// The sum of `name`'s series whose labels include every one of `labels` (`key="value"`).
fn metric_value_with(text: &str, name: &str, labels: &[&str]) -> Option<f64> {
    let mut found = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some(rest) = line.strip_prefix(name) else { continue };
        if !(rest.starts_with(' ') || rest.starts_with('{')) {
            continue;
        }
        let series = rest.split_once('}').map_or("", |(labels, _)| labels);
        if !labels.iter().all(|label| series.contains(label)) {
            continue;
        }
        if let Some(value) = line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok()) {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

/// Shared by the scheduler's tasks.
struct Context {
    options: Options,
    run: Run,
    clients: Clients,
    /// A client of the probes (its own connection).
    probe: reqwest::Client,
    sim: Sim,
    prometheus: Mutex<Prometheus>,
    serving: Serving,
    /// The serving pair swapped in by the rotation, signed by the second CA.
    next_pair: (String, String),
    /// The second CA (PEM): what a client trusting only the rotated certificate trusts.
    next_ca: String,
    config: PathBuf,
}

impl Context {
    fn since_start(&self) -> f64 {
        self.run.started.elapsed().as_secs_f64()
    }

    async fn get(&self, path: &str) -> Option<(u16, Value)> {
        let response =
            load::identified(self.probe.get(format!("{}{path}", self.run.base))).send().await.ok()?;
        let code = response.status().as_u16();
        Some((code, response.json().await.unwrap_or(Value::Null)))
    }

    async fn get_text(&self, path: &str) -> Option<String> {
        let response =
            load::identified(self.probe.get(format!("{}{path}", self.run.base))).send().await.ok()?;
        response.text().await.ok()
    }

    async fn sim_faults(&self, body: Value) -> Result<()> {
        reqwest::Client::new()
            .post(format!("{}/sim/faults", self.sim.metrics))
            .json(&body)
            .send()
            .await?
            .error_for_status()?;
        Ok(())
    }

    /// Polls `check` every half second until it holds or four TTLs pass; seconds from `from`.
    async fn recovery<F: Future<Output = bool>>(&self, from: Instant, check: impl Fn() -> F) -> Option<f64> {
        let deadline = from + self.options.cache_ttl * 4 + Duration::from_secs(10);
        loop {
            if check().await {
                return Some(from.elapsed().as_secs_f64());
            }
            if Instant::now() > deadline {
                return None;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    async fn fault(self: Arc<Self>, event: Event) -> Result<Fault> {
        let start = self.since_start();
        let began = Instant::now();
        let (kind, detail, ended, from) = match event {
            Event::Prometheus => {
                self.prometheus.lock().await.stop().await;
                tokio::time::sleep(self.options.schedule.prometheus_down).await;
                self.prometheus.lock().await.restart().await?;
                let ended = Instant::now();
                (FaultKind::Prometheus, String::new(), ended, ended)
            }
            Event::Kubelet(down) => {
                let node = "node-0";
                self.sim_faults(kubelet_fault(node, "hang")).await?;
                tokio::time::sleep(down).await;
                self.sim_faults(kubelet_fault(node, "ok")).await?;
                let ended = Instant::now();
                (FaultKind::Kubelet, node.to_owned(), ended, ended)
            }
            Event::Config { edit, valid } => {
                // An invalid edit keeps the previous edit's metric and adds a broken one.
                let shown = if valid { edit } else { edit.saturating_sub(1) };
                write_atomically(&self.config, &config_yaml(&self.options.window, Some(shown), valid))?;
                let now = Instant::now();
                let kind = if valid { FaultKind::ConfigValid } else { FaultKind::ConfigInvalid };
                (kind, format!("edit {edit}"), now, now)
            }
            Event::Certificate => {
                self.serving.write("..v2", &self.next_pair)?;
                let now = Instant::now();
                (FaultKind::Certificate, String::new(), now, now)
            }
            Event::WatchGone => {
                self.sim_faults(serde_json::json!({"watch": "gone-once"})).await?;
                let now = Instant::now();
                (FaultKind::WatchGone, String::new(), now, now)
            }
        };
        let end = start + (ended - began).as_secs_f64();
        let recovered_after = match (kind, event) {
            (FaultKind::Prometheus, _) => self.recovery(from, || self.prometheus_answers()).await,
            (FaultKind::Kubelet, _) => {
                let pods = Truth::fetch(&self.sim).await?.pods_on(&detail);
                self.recovery(from, || self.node_pods_have_memory(&pods)).await
            }
            (FaultKind::ConfigValid, Event::Config { edit, .. }) => {
                let path = format!("{CUSTOM}/namespaces/ns-0/pods/*/soak_edit_{edit}");
                self.recovery(from, || async { self.get(&path).await.is_some_and(|(code, _)| code == 200) })
                    .await
            }
            (FaultKind::ConfigInvalid, Event::Config { edit, .. }) => {
                let path = format!("{CUSTOM}/namespaces/ns-0/pods/*/soak_edit_{}", edit.saturating_sub(1));
                self.recovery(from, || async {
                    let text = self.get_text("/metrics").await.unwrap_or_default();
                    let rejected =
                        metric_value(&text, "percolator_config_last_reload_successful") == Some(0.0);
                    rejected && self.get(&path).await.is_some_and(|(code, _)| code == 200)
                })
                .await
            }
            (FaultKind::Certificate, _) => {
                let only_new = self.clients.client_trusting(&[self.next_ca_pem()])?;
                let url = format!("{}/healthz", self.run.base);
                self.recovery(from, || async {
                    load::identified(only_new.get(&url)).send().await.is_ok_and(|r| r.status().is_success())
                })
                .await
            }
            (FaultKind::WatchGone, _) => {
                // A pod created after the 410: listed once the watches have resumed (re-listed).
                let churned: Value = reqwest::Client::new()
                    .post(format!("{}/sim/churn", self.sim.metrics))
                    .send()
                    .await?
                    .error_for_status()?
                    .json()
                    .await?;
                let created = Instant::now();
                let ns = churned["created"]["namespace"].as_str().unwrap_or_default().to_owned();
                let name = churned["created"]["name"].as_str().unwrap_or_default().to_owned();
                let path = format!("{GV}/namespaces/{ns}/podmetricssummaries");
                self.recovery(created, || async {
                    self.get(&path).await.is_some_and(|(code, list)| {
                        code == 200 && items(&list).iter().any(|i| i["metadata"]["name"] == name.as_str())
                    })
                })
                .await
            }
            _ => None,
        };
        Ok(Fault { kind, start, end, recovered_after, answers_503: 0, detail })
    }

    /// The second CA, not the rotated leaf: a leaf is no trust anchor for rustls/webpki, so a
    /// client trusting the leaf itself never completes a handshake.
    fn next_ca_pem(&self) -> Vec<u8> {
        self.next_ca.clone().into_bytes()
    }

    /// Custom and external metrics answer, and the declared kind has its Prometheus values.
    async fn prometheus_answers(&self) -> bool {
        let custom = format!("{CUSTOM}/namespaces/ns-0/pods/*/http_requests_per_second");
        let external = format!("{EXTERNAL}/namespaces/ns-0/cafe_brews_per_minute");
        let declared = format!("{GV}/namespaces/ns-0/podtraffics");
        let ok = |answer: Option<(u16, Value)>| answer.is_some_and(|(code, _)| code == 200);
        ok(self.get(&custom).await)
            && ok(self.get(&external).await)
            && self.get(&declared).await.is_some_and(|(code, list)| {
                code == 200 && items(&list).iter().any(|i| i.get("requests").is_some())
            })
    }

    /// One of `pods` (on the node that was down) is listed with its memory.
    async fn node_pods_have_memory(&self, pods: &[(String, String)]) -> bool {
        let Some((ns, _)) = pods.first() else { return true };
        let Some((200, list)) = self.get(&format!("{GV}/namespaces/{ns}/podmetricssummaries")).await else {
            return false;
        };
        items(&list).iter().any(|item| {
            let name = item["metadata"]["name"].as_str().unwrap_or_default();
            pods.iter().any(|(pns, pname)| pns == ns && pname == name) && item.get("memory").is_some()
        })
    }
}

/// `POST /sim/faults` setting `node`'s kubelet to `mode`.
fn kubelet_fault(node: &str, mode: &str) -> Value {
    let mut nodes = serde_json::Map::new();
    nodes.insert(node.to_owned(), Value::from(mode));
    serde_json::json!({ "kubelet": nodes })
}

fn items(list: &Value) -> &[Value] {
    list["items"].as_array().map_or(&[], Vec::as_slice)
}

/// Samples the process and the answers every `every` until the run ends; `sim` is the
/// simulator's process, whose CPU is sampled too.
async fn sampler(ctx: Arc<Context>, pid: u32, sim: u32) -> Vec<Sample> {
    let every = ctx.options.schedule.sample_every;
    let mut ticks = tokio::time::interval(every);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut samples = Vec::new();
    let mut seen = 0;
    let mut last = Counters::default();
    let mut last_at = ctx.since_start();
    loop {
        ticks.tick().await;
        if Instant::now() >= ctx.run.until {
            return samples;
        }
        let text = ctx.get_text("/metrics").await.unwrap_or_default();
        let at = ctx.since_start();
        let now = Counters::read(&text, pid, sim);
        let period = (at - last_at).max(f64::EPSILON);
        let fetches = now.kubelet_fetches.saturating_sub(last.kubelet_fetches);
        let records = ctx.run.records.snapshot();
        let fresh = &records[seen.min(records.len())..];
        seen = records.len();
        let mut latencies: Vec<f64> = fresh.iter().filter(|r| r.code != 0).map(|r| r.took).collect();
        latencies.sort_by(f64::total_cmp);
        let mut codes = BTreeMap::new();
        for record in fresh {
            *codes.entry(record.code).or_insert(0) += 1;
        }
        let gauge = |name| metric_value(&text, name).unwrap_or(0.0) as u64;
        samples.push(Sample {
            at,
            rss_bytes: procfs::status_number(pid, "VmRSS").unwrap_or(0) * 1024,
            fds: procfs::open_fds(pid).unwrap_or(0),
            threads: procfs::status_number(pid, "Threads").unwrap_or(0),
            tasks: gauge("percolator_tokio_tasks_alive"),
            cache_entries: gauge("percolator_cache_entries"),
            parked: gauge("percolator_kubelet_connections_parked"),
            exported_rss_bytes: gauge("process_resident_memory_bytes"),
            exported_fds: gauge("process_open_fds"),
            requests: latencies.len(),
            p50_seconds: stats::quantile(&latencies, 0.5),
            p99_seconds: stats::quantile(&latencies, 0.99),
            max_seconds: latencies.last().copied().unwrap_or(0.0),
            codes,
            kubelet_fetches: fetches,
            kubelet_timeouts: now.kubelet_timeouts.saturating_sub(last.kubelet_timeouts),
            kubelet_fetch_seconds: if fetches == 0 {
                0.0
            } else {
                (now.kubelet_fetch_seconds - last.kubelet_fetch_seconds).max(0.0) / fetches as f64
            },
            cpu_percolator: (now.cpu_percolator - last.cpu_percolator).max(0.0) / period,
            cpu_sim: (now.cpu_sim - last.cpu_sim).max(0.0) / period,
            huge_pages_bytes: procfs::anon_huge_pages_bytes(pid).unwrap_or(0),
        });
        (last, last_at) = (now, at);
    }
}

/// Running totals a sample's period values are the differences of.
#[derive(Debug, Default, Clone, Copy)]
struct Counters {
    kubelet_fetches: u64,
    kubelet_timeouts: u64,
    kubelet_fetch_seconds: f64,
    /// CPU seconds, user and system.
    cpu_percolator: f64,
    cpu_sim: f64,
}

impl Counters {
    fn read(metrics: &str, percolator: u32, sim: u32) -> Self {
        let kubelet = |name, labels: &[&str]| {
            metric_value_with(metrics, name, &[&["source=\"kubelet\""], labels].concat()).unwrap_or(0.0)
        };
        Self {
            kubelet_fetches: kubelet("percolator_upstream_requests_total", &[]) as u64,
            kubelet_timeouts: kubelet("percolator_upstream_requests_total", &["outcome=\"timeout\""]) as u64,
            kubelet_fetch_seconds: kubelet("percolator_upstream_request_duration_seconds_sum", &[]),
            cpu_percolator: procfs::cpu_seconds(percolator).unwrap_or(0.0),
            cpu_sim: procfs::cpu_seconds(sim).unwrap_or(0.0),
        }
    }
}

/// Runs the soak; the goals missed are in [`Report::failures`].
pub async fn run(options: Options) -> Result<Report> {
    apiserver::install_crypto_provider();
    let run_dir = options.dir.join("run");
    if run_dir.exists() {
        std::fs::remove_dir_all(&run_dir)?;
    }
    std::fs::create_dir_all(run_dir.join("front-proxy"))?;
    // Serving: two CAs, the second's certificate swapped in once; the clients trust both.
    let first_ca = load::pki::ca("soak-serving-ca-1")?;
    let second_ca = load::pki::ca("soak-serving-ca-2")?;
    let serving = Serving { dir: run_dir.join("serving") };
    serving.write("..v1", &load::pki::leaf(&first_ca, "percolator", true)?)?;
    let next = load::pki::leaf(&second_ca, "percolator", true)?;
    let front_ca = load::pki::ca("soak-front-proxy-ca")?;
    let (cert, key) = load::pki::leaf(&front_ca, load::FRONT_PROXY_CN, false)?;
    std::fs::write(run_dir.join("front-proxy/ca.crt"), &front_ca.pem)?;
    std::fs::write(run_dir.join("front-proxy/client.crt"), cert)?;
    std::fs::write(run_dir.join("front-proxy/client.key"), key)?;
    let config = run_dir.join("config.yaml");
    write_atomically(&config, &config_yaml(&options.window, None, true))?;

    let sim = start_sim(&options, &run_dir).await?;
    let prometheus = start_prometheus(&options, &run_dir, &sim).await?;
    let mut percolator = start_percolator(&options, &run_dir, &sim, &prometheus.url()).await?;
    let clients = Clients::new(
        vec![first_ca.pem.clone().into_bytes(), second_ca.pem.clone().into_bytes()],
        &run_dir.join("front-proxy/client.crt"),
        &run_dir.join("front-proxy/client.key"),
        options.request_timeout + Duration::from_secs(30),
    )?;
    let probe = clients.client()?;
    // Every request with the front proxy's certificate carries the identity headers, `/readyz`
    // too: without `X-Remote-User` the request-header authenticator passes, and the x509 one
    // then rejects the certificate (the front proxy's CA is not the client CA): 401, forever.
    let ready_by = Instant::now() + Duration::from_secs(600);
    loop {
        let last = match load::identified(probe.get(format!("{}/readyz", percolator.url))).send().await {
            Ok(r) if r.status().is_success() => break,
            Ok(r) => r.status().to_string(),
            Err(e) => e.to_string(),
        };
        tracing::debug!(%last, "soak: percolator not ready yet");
        if Instant::now() > ready_by {
            return Err(SoakError::Setup(format!("percolator not ready within 10 minutes (last: {last})")));
        }
        if let Ok(Some(status)) = percolator.child.try_wait() {
            return Err(SoakError::Setup(format!(
                "percolator exited ({status}): see {}",
                run_dir.join("percolator.log").display()
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tracing::info!(url = %percolator.url, "soak: percolator ready");
    let truth = Truth::fetch(&sim).await?;
    let started = Instant::now();
    let run = Run {
        base: percolator.url.clone(),
        started,
        until: started + options.duration,
        records: Arc::new(Records::default()),
    };
    tracing::info!(url = %run.base, pods = options.pods, duration = ?options.duration, "soak started");
    let ctx = Arc::new(Context {
        options: options.clone(),
        run: run.clone(),
        clients: clients.clone(),
        probe,
        sim,
        prometheus: Mutex::new(prometheus),
        serving,
        next_pair: next,
        next_ca: second_ca.pem.clone(),
        config,
    });

    let mut traffic = tokio::task::JoinSet::new();
    {
        let (clients, run, every, workers) =
            (clients.clone(), run.clone(), options.list_every, options.list_workers);
        let targets = Arc::new(list_targets());
        traffic.spawn(async move { load::steady(&clients, &run, targets, workers, every).await });
    }
    let hpa = hpa_targets(&truth, options.hpa_targets);
    let (client, hpa_run) = (clients.client()?, run.clone());
    traffic.spawn(async move {
        load::periodic(client, hpa_run, hpa, Duration::from_secs(15)).await;
        Ok(())
    });
    let top = top_targets();
    let period = options.top_every * top.len() as u32;
    let (client, top_run) = (clients.client()?, run.clone());
    traffic.spawn(async move {
        load::periodic(client, top_run, top, period).await;
        Ok(())
    });
    let sampling = tokio::spawn(sampler(ctx.clone(), percolator.pid, ctx.sim.pid));

    let mut faults = tokio::task::JoinSet::new();
    for (at, event) in options.schedule.events(options.duration) {
        tokio::time::sleep_until((started + at).into()).await;
        tracing::info!(?event, at = ?at, "soak fault");
        faults.spawn(ctx.clone().fault(event));
    }
    let mut done = Vec::new();
    while let Some(joined) = faults.join_next().await {
        match joined {
            Ok(fault) => done.push(fault?),
            Err(e) => return Err(SoakError::Setup(format!("a fault task failed: {e}"))),
        }
    }
    while let Some(joined) = traffic.join_next().await {
        if let Ok(Err(e)) = joined {
            return Err(e);
        }
    }
    let samples = sampling.await.map_err(|e| SoakError::Setup(format!("the sampler failed: {e}")))?;
    let exit = stop(percolator).await;
    done.sort_by(|a, b| a.start.total_cmp(&b.start));
    let report = judge(options, samples, done, run.records.snapshot(), exit);
    std::fs::write(report.options.dir.join("report.md"), &report.markdown)?;
    std::fs::write(report.options.dir.join("samples.csv"), samples_csv(&report.samples))?;
    let title = format!(
        "percolator soak: {} pods, {} min, --cache-ttl {:?}",
        report.options.pods,
        report.options.duration.as_secs() / 60,
        report.options.cache_ttl
    );
    let warm_up = report.options.schedule.warm_up.as_secs_f64() / 60.0;
    std::fs::write(
        report.options.dir.join("soak.svg"),
        plot::svg(&report.samples, &report.faults, warm_up, &title)?,
    )?;
    Ok(report)
}

fn samples_csv(samples: &[Sample]) -> String {
    let mut csv = String::from(
        "seconds,rss_bytes,fds,threads,tasks,cache_entries,parked,requests,p50_ms,p99_ms,max_ms,codes,exported_rss_bytes,exported_fds,kubelet_fetches,kubelet_timeouts,kubelet_fetch_ms,cpu_percolator,cpu_sim,huge_pages_bytes\n",
    );
    for s in samples {
        let codes: Vec<String> = s.codes.iter().map(|(code, n)| format!("{code}:{n}")).collect();
        let _ = writeln!(
            csv,
            "{:.1},{},{},{},{},{},{},{},{:.1},{:.1},{:.1},{},{},{},{},{},{:.1},{:.3},{:.3},{}",
            s.at,
            s.rss_bytes,
            s.fds,
            s.threads,
            s.tasks,
            s.cache_entries,
            s.parked,
            s.requests,
            s.p50_seconds * 1000.0,
            s.p99_seconds * 1000.0,
            s.max_seconds * 1000.0,
            codes.join(" "),
            s.exported_rss_bytes,
            s.exported_fds,
            s.kubelet_fetches,
            s.kubelet_timeouts,
            s.kubelet_fetch_seconds * 1000.0,
            s.cpu_percolator,
            s.cpu_sim,
            s.huge_pages_bytes
        );
    }
    csv
}

/// Grace after Prometheus is back during which a 503 computed while it was down may still
/// arrive.
const GRACE: f64 = 2.0;

/// Checks the goals and writes the markdown.
/// Ends percolator as a Pod's termination does: SIGTERM, then SIGKILL if it has not exited
/// within [`EXIT_GOAL`]. How it ended, for the report: the soak's last check is a graceful exit.
async fn stop(mut percolator: Percolator) -> Exit {
    let started = std::time::Instant::now();
    let signalled = Command::new("kill").args(["-TERM", &percolator.pid.to_string()]).status().await;
    if !signalled.is_ok_and(|s| s.success()) {
        let _ = percolator.child.kill().await;
        return Exit::Unsignalled;
    }
    match tokio::time::timeout(EXIT_GOAL, percolator.child.wait()).await {
        Ok(Ok(status)) => Exit::Exited { status, after: started.elapsed() },
        Ok(Err(_)) | Err(_) => {
            let _ = percolator.child.kill().await;
            Exit::Killed
        }
    }
}

/// percolator must exit this soon after SIGTERM: its `--shutdown-delay-duration` (5 s) and
/// the drain of requests in flight, which the load's end has already let finish.
const EXIT_GOAL: Duration = Duration::from_secs(30);

/// How percolator ended after the soak.
#[derive(Debug, Clone, Copy)]
pub enum Exit {
    /// It exited on SIGTERM, with this status, this long after it.
    Exited {
        /// Its exit status.
        status: std::process::ExitStatus,
        /// Time from SIGTERM to exit.
        after: Duration,
    },
    /// It had not exited [`EXIT_GOAL`] after SIGTERM and was killed.
    Killed,
    /// SIGTERM could not be sent (`kill` failed); it was killed.
    Unsignalled,
}

impl Exit {
    fn describe(&self) -> String {
        match self {
            Exit::Exited { status, after } => {
                format!("percolator exited {:.1} s after SIGTERM ({status})", after.as_secs_f64())
            }
            Exit::Killed => format!("percolator had not exited {EXIT_GOAL:?} after SIGTERM and was killed"),
            Exit::Unsignalled => "SIGTERM could not be sent to percolator; it was killed".to_owned(),
        }
    }

    fn graceful(&self) -> bool {
        matches!(self, Exit::Exited { status, .. } if status.success())
    }
}

fn judge(
    options: Options,
    samples: Vec<Sample>,
    mut faults: Vec<Fault>,
    records: Vec<Record>,
    exit: Exit,
) -> Report {
    let warm_up = options.schedule.warm_up.as_secs_f64();
    let fitted: Vec<&Sample> = samples.iter().filter(|s| s.at >= warm_up).collect();
    let (start, period, step) = options.schedule.fit_hours();
    let fit = |value: fn(&Sample) -> f64| {
        Trend::fit(&fitted.iter().map(|s| (s.at / 3600.0, value(s))).collect::<Vec<_>>(), start, period, step)
    };
    let slopes: Vec<(&'static str, &'static str, Option<Trend>)> = vec![
        (
            "resident memory",
            "MiB",
            fit(|s| s.rss_bytes as f64 / (1024.0 * 1024.0)).map(Trend::in_resident_mib),
        ),
        ("open file descriptors", "", fit(|s| s.fds as f64).map(Trend::counting)),
        ("tokio tasks alive", "", fit(|s| s.tasks as f64).map(Trend::counting)),
        ("cache entries", "", fit(|s| s.cache_entries as f64).map(Trend::counting)),
    ];
    let mut failures = Vec::new();
    for (what, _, slope) in &slopes {
        match slope {
            Some(trend) if !trend.within_noise() => failures.push(format!(
                "{what} grows beyond noise: {:+.2}/h ± {:.2} (95% CI), {:+.2} over the {:.0} min measured, residual sd {:.2}, floor {:+.2}",
                trend.slope.per_hour,
                trend.slope.ci95,
                trend.slope.growth_over_span(),
                trend.slope.span_hours * 60.0,
                trend.slope.residual_sd,
                trend.floor_rise()
            )),
            Some(_) => {}
            None => failures.push(format!("{what}: too few samples after the warm-up to fit a slope")),
        }
    }
    let prometheus_down: Vec<(f64, f64)> =
        faults.iter().filter(|f| f.kind == FaultKind::Prometheus).map(|f| (f.start, f.end + GRACE)).collect();
    let mut codes = BTreeMap::new();
    let (mut unexpected, mut examples) = (0, Vec::new());
    for r in &records {
        *codes.entry((r.class, r.code)).or_insert(0) += 1;
        if r.code == 503 {
            let end = r.at + r.took;
            for fault in faults.iter_mut().filter(|f| r.at <= f.end + GRACE && end >= f.start) {
                fault.answers_503 += 1;
            }
        }
        let documented =
            r.code == 503 && prometheus_down.iter().any(|(from, to)| r.at <= *to && r.at + r.took >= *from);
        if (r.code >= 500 && !documented) || r.code == 0 {
            unexpected += 1;
            if examples.len() < 5 {
                examples.push(format!("{} at {:.1}s: {} after {:.2}s", r.class.name(), r.at, r.code, r.took));
            }
        }
    }
    if unexpected > 0 {
        failures.push(format!(
            "{unexpected} answers 5xx (other than 503 while Prometheus was down) or failed: {examples:?}"
        ));
    }
    let max_latency = records.iter().map(|r| r.took).fold(0.0, f64::max);
    if max_latency > options.request_timeout.as_secs_f64() {
        failures.push(format!(
            "a request took {max_latency:.1}s, longer than --request-timeout {:?}",
            options.request_timeout
        ));
    }
    for fault in &faults {
        let goal = options.recovery_goal(fault.kind);
        match fault.recovered_after {
            Some(after) if after <= goal => {}
            Some(after) => failures.push(format!(
                "{} at {:.0}s recovered after {after:.1}s, more than its goal ({goal:.1}s)",
                fault.kind.name(),
                fault.start
            )),
            None => failures.push(format!("{} at {:.0}s never recovered", fault.kind.name(), fault.start)),
        }
    }
    for kind in [
        FaultKind::Prometheus,
        FaultKind::Kubelet,
        FaultKind::ConfigValid,
        FaultKind::ConfigInvalid,
        FaultKind::Certificate,
        FaultKind::WatchGone,
    ] {
        if options.schedule.faults.contains(&kind.class()) && !faults.iter().any(|f| f.kind == kind) {
            failures.push(format!("the schedule had no {}", kind.name()));
        }
    }
    if records.is_empty() {
        failures.push("no request was sent".to_owned());
    }
    if !exit.graceful() {
        failures.push(exit.describe());
    }
    let mut report = Report {
        options,
        samples,
        faults,
        slopes,
        codes,
        unexpected,
        unexpected_examples: examples,
        max_latency,
        requests: records.len(),
        failures,
        exit,
        markdown: String::new(),
    };
    report.markdown = markdown(&report);
    report
}

/// A trend's floor, first → last whole cycle, or "–" without two.
fn floor_text(trend: &Trend) -> String {
    trend.floor.map_or_else(|| "–".to_owned(), |(a, b)| format!("{a:.1} → {b:.1}"))
}

fn markdown(report: &Report) -> String {
    let o = &report.options;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "Soak: {} pods ({} nodes, churn one pod every {:?}), {} minutes, `--cache-ttl {:?}`, `--request-timeout {:?}`, `--tls-reload-interval {:?}`; warm-up {} s; a sample every {:?}; {} requests.\n",
        o.pods,
        o.nodes(),
        o.churn,
        o.duration.as_secs() / 60,
        o.cache_ttl,
        o.request_timeout,
        o.reload_interval,
        o.schedule.warm_up.as_secs(),
        o.schedule.sample_every,
        report.requests
    );
    let verdict = |ok: bool| if ok { "yes" } else { "**no**" };
    let _ = writeln!(
        md,
        "Slopes are fitted from the end of the warm-up over whole fault cycles of {} s, with the cycle's profile taken out (one level per phase of the cycle); the interval is widened for the residuals' lag-one autocorrelation r₁ (by √((1 + r₁)/(1 − r₁))); the floor is the lowest value of the first and of the last cycle. A series grows when its slope is beyond noise (the 95% interval excludes 0 and the growth exceeds twice the residual sd) **and** its floor rose by more than twice the residual sd and by more than its resolution (one for a count, {} MiB for memory).\n",
        o.schedule.cycle().as_secs(),
        stats::MEMORY_RESOLUTION_MIB
    );
    md.push_str("| after the warm-up | first | last | slope per hour ± 95% CI (SE; r₁) | growth over the span vs 2 × residual sd | floor, first → last cycle | within noise |\n|---|---|---|---|---|---|---|\n");
    let warm_up = o.schedule.warm_up.as_secs_f64();
    let after: Vec<&Sample> = report.samples.iter().filter(|s| s.at >= warm_up).collect();
    let values: [fn(&Sample) -> f64; 4] = [
        |s| s.rss_bytes as f64 / (1024.0 * 1024.0),
        |s| s.fds as f64,
        |s| s.tasks as f64,
        |s| s.cache_entries as f64,
    ];
    for ((what, unit, trend), value) in report.slopes.iter().zip(values) {
        let first = after.first().map_or(0.0, |s| value(s));
        let last = after.last().map_or(0.0, |s| value(s));
        match trend {
            Some(t) => {
                let s = &t.slope;
                let floor = floor_text(t);
                let _ = writeln!(
                    md,
                    "| {what} {unit} | {first:.1} | {last:.1} | {:+.2} ± {:.2} ({:.2}; {:.2}) | {:+.2} vs {:.2} | {floor} | {} |",
                    s.per_hour,
                    s.ci95,
                    s.std_error,
                    s.lag1,
                    s.growth_over_span(),
                    2.0 * s.residual_sd,
                    verdict(t.within_noise())
                );
            }
            None => {
                let _ =
                    writeln!(md, "| {what} {unit} | {first:.1} | {last:.1} | too few samples | | | **no** |");
            }
        }
    }
    let memory: Vec<(f64, f64)> =
        after.iter().map(|s| (s.at / 3600.0, s.rss_bytes as f64 / (1024.0 * 1024.0))).collect();
    let (start, period, step) = o.schedule.fit_hours();
    let cycles = Cycle::of(&memory, start, period, step);
    let cycles: Vec<String> =
        cycles.iter().map(|c| format!("{:.1} / {:.1} / {:.1}", c.low, c.mean, c.high)).collect();
    let _ = writeln!(
        md,
        "\nResident memory per whole cycle after the warm-up, low / mean / high (MiB): {}.",
        if cycles.is_empty() { "none".to_owned() } else { cycles.join("; ") }
    );
    // Reported, not judged: whether memory that rose early has settled since.
    if let Some((from, later)) = Trend::of_second_half(&memory, start, period, step) {
        let later = later.in_resident_mib();
        let _ = writeln!(
            md,
            "Resident memory over the second half of those cycles (from minute {:.0}; reported, not a goal): {:+.2}/h ± {:.2} (95% CI; r₁ {:.2}), floor {} MiB: {}.",
            from * 60.0,
            later.slope.per_hour,
            later.slope.ci95,
            later.slope.lag1,
            floor_text(&later),
            if later.within_noise() { "within noise" } else { "grows" }
        );
    }
    let threads: Vec<u64> = after.iter().map(|s| s.threads).collect();
    let parked: Vec<u64> = after.iter().map(|s| s.parked).collect();
    let range = |v: &[u64]| format!("{}–{}", v.iter().min().unwrap_or(&0), v.iter().max().unwrap_or(&0));
    let huge = after.iter().map(|s| s.huge_pages_bytes).max().unwrap_or(0);
    let _ = writeln!(
        md,
        "\nThreads after the warm-up: {}; kubelet connections parked: {}; transparent huge pages in resident memory, at most: {:.1} MiB.",
        range(&threads),
        range(&parked),
        huge as f64 / (1024.0 * 1024.0)
    );
    let median_worst = |value: fn(&Sample) -> f64, scale: f64| {
        let mut v: Vec<f64> = after.iter().map(|s| value(s) * scale).collect();
        v.sort_by(f64::total_cmp);
        (stats::quantile(&v, 0.5), v.last().copied().unwrap_or(0.0))
    };
    let (fetches, _) = median_worst(|s| s.kubelet_fetches as f64, 1.0);
    let (fetch_ms, worst_fetch_ms) = median_worst(|s| s.kubelet_fetch_seconds, 1000.0);
    let (cpu, worst_cpu) = median_worst(|s| s.cpu_percolator, 1.0);
    let (cpu_sim, worst_cpu_sim) = median_worst(|s| s.cpu_sim, 1.0);
    let _ = writeln!(
        md,
        "Kubelet fetches per sample period after the warm-up: median {fetches:.0} ({} per node per sampling interval; 1: each node sampled once and fetched by no request), {} timed out in all; their mean duration (a fetch slot's wait included) per period: median {fetch_ms:.1} ms, worst {worst_fetch_ms:.1} ms. CPU per period, in cores, median / worst: percolator {cpu:.2} / {worst_cpu:.2}, simulator {cpu_sim:.2} / {worst_cpu_sim:.2}.\n",
        report.kubelet_fetches_per_interval().map_or_else(|| "none".to_owned(), |r| format!("{r:.2}")),
        after.iter().map(|s| s.kubelet_timeouts).sum::<u64>(),
    );

    let mut p99: Vec<f64> = report.samples.iter().map(|s| s.p99_seconds).collect();
    p99.sort_by(f64::total_cmp);
    let _ = writeln!(
        md,
        "Longest request {:.2} s (`--request-timeout` {:?}); p99 per sample period: median {:.0} ms, worst {:.0} ms. Answers 5xx other than the documented 503s, or failed: {}. After the load, {}.\n",
        report.max_latency,
        o.request_timeout,
        stats::quantile(&p99, 0.5) * 1000.0,
        p99.last().copied().unwrap_or(0.0) * 1000.0,
        report.unexpected,
        report.exit.describe()
    );
    md.push_str("| answers | ");
    let codes: std::collections::BTreeSet<u16> = report.codes.keys().map(|(_, c)| *c).collect();
    let classes: std::collections::BTreeSet<Class> = report.codes.keys().map(|(c, _)| *c).collect();
    for code in &codes {
        let _ = write!(md, "{} | ", if *code == 0 { "failed".to_owned() } else { code.to_string() });
    }
    md.push('\n');
    md.push_str(&"|---".repeat(codes.len() + 1));
    md.push_str("|\n");
    for class in classes {
        let _ = write!(md, "| {} | ", class.name());
        for code in &codes {
            let _ = write!(md, "{} | ", report.codes.get(&(class, *code)).unwrap_or(&0));
        }
        md.push('\n');
    }
    let _ = writeln!(
        md,
        "\n| fault | at (s) | lasted (s) | recovered after (s) | within goal (TTL {:?} + 1 s; kubelet + {:?}) | 503s in it | recovered means |\n|---|---|---|---|---|---|---|",
        o.cache_ttl, KUBELET_REQUEST_TIMEOUT
    );
    for f in &report.faults {
        let recovered = f.recovered_after.map_or("never".to_owned(), |s| format!("{s:.1}"));
        let met = f.recovered_after.is_some_and(|s| s <= o.recovery_goal(f.kind));
        let name = if f.detail.is_empty() {
            f.kind.name().to_owned()
        } else {
            format!("{} ({})", f.kind.name(), f.detail)
        };
        let _ = writeln!(
            md,
            "| {name} | {:.0} | {:.0} | {recovered} | {} | {} | {} |",
            f.start,
            f.end - f.start,
            verdict(met),
            f.answers_503,
            f.kind.recovery()
        );
    }
    if report.failures.is_empty() {
        md.push_str("\nEvery goal met.\n");
    } else {
        md.push_str("\nGoals missed:\n");
        for failure in &report.failures {
            let _ = writeln!(md, "- {failure}");
        }
    }
    md
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_hour_has_every_fault_on_its_period_and_a_short_run_has_each_at_least_once() {
        let hour = Schedule::for_duration(Duration::from_secs(3600), Duration::from_secs(15));
        assert_eq!(hour.warm_up, Duration::from_secs(600));
        assert_eq!(hour.sample_every, Duration::from_secs(30));
        let events = hour.events(Duration::from_secs(3600));
        let at = |f: fn(&Event) -> bool| -> Vec<u64> {
            events.iter().filter(|(_, e)| f(e)).map(|(at, _)| at.as_secs()).collect()
        };
        assert_eq!(at(|e| matches!(e, Event::Prometheus)), [600, 1200, 1800, 2400, 3000]);
        assert_eq!(at(|e| matches!(e, Event::Kubelet(d) if d.as_secs() == 60)).len(), 12);
        assert_eq!(
            at(|e| matches!(e, Event::Config { valid: true, .. })),
            [150, 750, 1350, 1950, 2550, 3150]
        );
        assert_eq!(
            at(|e| matches!(e, Event::Config { valid: false, .. })),
            [450, 1050, 1650, 2250, 2850, 3450]
        );
        assert_eq!(at(|e| matches!(e, Event::Certificate)), [1980]);
        assert_eq!(at(|e| matches!(e, Event::WatchGone)), [1740]);

        let short = Schedule::for_duration(Duration::from_secs(180), Duration::from_secs(5));
        assert_eq!(short.warm_up, Duration::from_secs(60));
        assert_eq!(short.sample_every, Duration::from_secs(5));
        let events = short.events(Duration::from_secs(180));
        assert_eq!(short.watch_at, Duration::from_secs(108));
        let last_start = events.iter().map(|(at, _)| *at).max().unwrap();
        assert!(last_start <= Duration::from_secs(180) - short.quiet_tail, "{events:?}");
        for kind in ["Prometheus", "Kubelet", "valid: true", "valid: false", "Certificate", "WatchGone"] {
            assert!(events.iter().any(|(_, e)| format!("{e:?}").contains(kind)), "{kind}: {events:?}");
        }
    }

    #[test]
    fn the_recurring_faults_repeat_on_the_cycle_and_the_fit_starts_on_one() {
        for (seconds, ttl) in [(4 * 3600, 15), (3600, 15), (1800, 15), (180, 5)] {
            let duration = Duration::from_secs(seconds);
            let schedule = Schedule::for_duration(duration, Duration::from_secs(ttl));
            let cycle = schedule.cycle().as_secs();
            let whole = |d: Duration| d.as_secs().is_multiple_of(cycle);
            assert!(whole(schedule.warm_up), "{seconds}: {schedule:?}");
            assert!(cycle.is_multiple_of(schedule.sample_every.as_secs()), "{seconds}: {schedule:?}");
            assert!(cycle.is_multiple_of(schedule.flap_cycle.as_secs()), "{seconds}: {schedule:?}");
            // Valid and invalid edits alternate: the pair repeats every two edits.
            assert!(cycle.is_multiple_of(2 * schedule.config_every.as_secs()), "{seconds}: {schedule:?}");
            // At least two whole cycles after the warm-up, so the profile is not the trend.
            assert!(duration - schedule.warm_up >= schedule.cycle() * 2, "{seconds}: {schedule:?}");
        }
    }

    #[test]
    fn a_run_of_hours_keeps_the_hours_rates_rather_than_stretching_them() {
        let two_hours = Duration::from_secs(7200);
        let schedule = Schedule::for_duration(two_hours, Duration::from_secs(15));
        let hour = Schedule::for_duration(Duration::from_secs(3600), Duration::from_secs(15));
        let rates = |s: &Schedule| {
            (s.warm_up, s.sample_every, s.prometheus_every, s.prometheus_down, s.flap_cycle, s.config_every)
        };
        assert_eq!(rates(&schedule), rates(&hour));
        let events = schedule.events(two_hours);
        let count = |f: fn(&Event) -> bool| events.iter().filter(|(_, e)| f(e)).count();
        assert_eq!(count(|e| matches!(e, Event::Prometheus)), 11);
        assert_eq!(count(|e| matches!(e, Event::Kubelet(d) if d.as_secs() == 60)), 24);
        assert_eq!(count(|e| matches!(e, Event::Config { .. })), 24);
        // Still once each, in the fitted stretch.
        assert_eq!(count(|e| matches!(e, Event::Certificate)), 1);
        assert_eq!(count(|e| matches!(e, Event::WatchGone)), 1);
        assert!(schedule.watch_at > schedule.warm_up && schedule.rotate_at > schedule.warm_up);
    }

    #[test]
    fn the_short_run_warms_up_for_its_first_half_and_fits_two_whole_cycles() {
        let short = Options::short(PathBuf::new(), PathBuf::new(), Duration::from_secs(240), 1000);
        let schedule = &short.schedule;
        assert_eq!((schedule.cycle(), schedule.warm_up), (Duration::from_secs(60), Duration::from_secs(120)));
        let events = schedule.events(Duration::from_secs(240));
        for kind in ["Prometheus", "Kubelet", "valid: true", "valid: false", "Certificate", "WatchGone"] {
            assert!(events.iter().any(|(_, e)| format!("{e:?}").contains(kind)), "{kind}: {events:?}");
        }
        // The rotation falls in the fitted half, so that its effect on the series is judged.
        assert!(schedule.rotate_at >= schedule.warm_up, "{schedule:?}");
    }

    #[test]
    fn faults_left_out_are_neither_scheduled_nor_required() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            soak: SoakArgs,
        }
        let args = |faults: &str| {
            <Cli as clap::Parser>::try_parse_from(["soak", "--faults", faults]).map(|cli| cli.soak.faults)
        };
        assert_eq!(args("none").unwrap(), [FaultClass::None]);
        assert!(args("prometheus,bogus").is_err());
        let mut schedule = Schedule::for_duration(Duration::from_secs(3600), Duration::from_secs(15));
        let hour = Duration::from_secs(3600);
        assert!(schedule.events(hour).iter().any(|(_, e)| matches!(e, Event::Certificate)));
        schedule.faults = vec![FaultClass::Config, FaultClass::Watch];
        let events = schedule.events(hour);
        assert!(!events.is_empty(), "{events:?}");
        assert!(
            events.iter().all(|(_, e)| matches!(e, Event::Config { .. } | Event::WatchGone)),
            "{events:?}"
        );
        schedule.faults.clear();
        assert!(schedule.events(hour).is_empty());

        // A run without faults is judged on its load alone: no "the schedule had no …".
        let mut options = Options::new(PathBuf::new(), PathBuf::new(), Duration::from_secs(180), 1000);
        options.schedule.faults.clear();
        let exit =
            Exit::Exited { status: std::process::ExitStatus::default(), after: Duration::from_secs(5) };
        let report = judge(options.clone(), Vec::new(), Vec::new(), Vec::new(), exit);
        assert!(report.failures.iter().all(|f| !f.contains("the schedule had no")), "{:?}", report.failures);
        assert!(report.markdown.contains("percolator exited 5.0 s after SIGTERM"), "{}", report.markdown);
        // Every fault is required when scheduled, and an exit that was not graceful is a miss.
        let report = judge(
            Options {
                schedule: Schedule::for_duration(Duration::from_secs(180), Duration::from_secs(15)),
                ..options
            },
            Vec::new(),
            Vec::new(),
            Vec::new(),
            Exit::Killed,
        );
        assert!(
            report.failures.iter().any(|f| f.contains("the schedule had no Prometheus restart")),
            "{:?}",
            report.failures
        );
        assert!(
            report.failures.iter().any(|f| f.contains("had not exited 30s after SIGTERM")),
            "{:?}",
            report.failures
        );
    }

    #[test]
    fn metric_values_add_up_their_series() {
        let text = "# TYPE percolator_cache_entries gauge\npercolator_cache_entries{cache=\"a\"} 3\npercolator_cache_entries{cache=\"b\"} 4\npercolator_cache_entries_other 9\npercolator_tokio_tasks_alive 120\n";
        assert_eq!(metric_value(text, "percolator_cache_entries"), Some(7.0));
        assert_eq!(metric_value(text, "percolator_tokio_tasks_alive"), Some(120.0));
        assert_eq!(metric_value(text, "percolator_missing"), None);
        let text = "percolator_upstream_requests_total{source=\"kubelet\",outcome=\"success\"} 30\n\
                    percolator_upstream_requests_total{source=\"kubelet\",outcome=\"timeout\"} 2\n\
                    percolator_upstream_requests_total{source=\"prometheus\",outcome=\"timeout\"} 5\n";
        let kubelet = ["source=\"kubelet\""];
        assert_eq!(metric_value_with(text, "percolator_upstream_requests_total", &kubelet), Some(32.0));
        let timeouts = ["source=\"kubelet\"", "outcome=\"timeout\""];
        assert_eq!(metric_value_with(text, "percolator_upstream_requests_total", &timeouts), Some(2.0));
    }

    #[test]
    fn the_config_edits_parse_as_percolator_reads_them() {
        for (edit, valid) in [(None, true), (Some(3), true), (Some(3), false)] {
            let yaml = config_yaml("1m", edit, valid);
            let loaded =
                percolator::config::QueryFile::from_yaml(&yaml, "soak.yaml", &percolator::config_check());
            assert_eq!(loaded.is_ok(), valid, "{yaml}\n{loaded:?}");
        }
    }
}
