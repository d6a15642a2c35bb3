//! Kubelet `GET /metrics/resource`: fetching it over HTTPS, parsing it, and turning two
//! cumulative CPU samples into a rate (CONTRACT §8).
//!
//! - [`parse_resource_metrics`] decodes one body into a [`ParsedBatch`], following
//!   metrics-server's `decodeBatch`: `pod_*` series are ignored (a pod is the sum of its
//!   containers), a sample without a timestamp gets the scrape time, and a container whose CPU or
//!   memory is 0 or missing (it has just started) is dropped. metrics-server drops the whole pod
//!   then; we drop only that container, so the pod reports fewer containers instead of none (a
//!   field is omitted, never faked; the served kinds decide what a partial pod means).
//! - [`NodeSamples`] keeps, per container, the newest and the previous *distinct* sample and
//!   computes `Δcpu / Δt` between them (metrics-server `pkg/storage`). A single sample, a restart
//!   or a decreasing counter gives no CPU rate. Unlike metrics-server we do not synthesize a
//!   zero sample at the start time of a fresh container: a first sample is never a usage.
//!   Older kubelets send no sample timestamps: the scrape time stands in, and an unchanged
//!   counter is then the same sample read again, not an idle period.
//! - [`KubeletClient`] implements [`KubeletSource`]: per-node TTL cache whose misses share one
//!   fetch, a semaphore bounding concurrent fetches, caps on body size and container count
//!   (so one broken kubelet cannot take the memory), bearer-token auth (token
//!   files are re-read at most once a minute, since service-account tokens rotate), and
//!   verification against `--kubelet-certificate-authority` or, with `--kubelet-insecure-tls`,
//!   none.
//!
//! # Why our own parser
//!
//! `prometheus-parse` (the usual crate) was evaluated and rejected: it splits label pairs on `,`
//! and `=` and strips quotes without unescaping, so a label value containing `,`, `=`, `}` or
//! `\"` is silently mangled; it pulls `regex`, `chrono`, `itertools` and `once_cell` for that;
//! and it allocates every label of every series, while we need three labels of five families.
//! The text format subset we read is small, so this module has a line parser that borrows from
//! the body, unescapes `\\`, `\"` and `\n`, skips (and counts) other families and malformed
//! lines, and never panics on arbitrary input.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use moka::future::Cache;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use tokio::sync::Semaphore;

use super::{
    ContainerUsage, Inventory, KubeletError, KubeletSource, NodeInfo, NodeUsage, PodKey, UpstreamObserver,
    outcome,
};

/// The kubelet's default secure port.
pub const DEFAULT_PORT: u16 = 10250;

/// Path of the resource metrics endpoint.
pub const RESOURCE_METRICS_PATH: &str = "/metrics/resource";

/// Largest body we read from a kubelet. A node with 110 pods answers about 100 KiB and one with
/// 500 pods of 3 containers about 1.2 MiB, so 8 MiB only stops a broken or hostile endpoint.
/// Every concurrent fetch may hold this much (a 64 MiB cap let one 10 MB body take percolator
/// from 27 to 240 MiB resident).
pub const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Most containers accepted from one kubelet. Far above what a node runs (kubelets default
/// to 110 pods), it bounds the rate state kept per node, which a dense body under the size
/// cap could otherwise fill with tens of thousands of phantom containers.
pub const DEFAULT_MAX_CONTAINERS: usize = 10_000;

/// metrics-server's default `--kubelet-preferred-address-types` order.
pub const DEFAULT_PREFERRED_ADDRESS_TYPES: [&str; 5] =
    ["Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP"];

/// The `source` passed to the [`UpstreamObserver`].
const SOURCE: &str = "kubelet";

/// How long a token read from a file is used before the file is read again: kubelet-projected
/// service-account tokens are refreshed well before they expire, so a minute is plenty.
const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// How much of an error response body is quoted in an error message.
const ERROR_BODY_SNIPPET: usize = 256;

/// Blanks of the text format.
const BLANK: [char; 2] = [' ', '\t'];

/// Errors of this module: decoding a body and building a client.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The body holds no line of the families we read (an HTML error page, another endpoint).
    #[error(
        "no resource metrics in the body ({malformed_lines} malformed lines, \
         {unknown_lines} samples of other families)"
    )]
    NoMetrics {
        /// Lines that are not valid samples.
        malformed_lines: usize,
        /// Valid samples of families we do not read.
        unknown_lines: usize,
    },
    /// The certificate authority bundle is unusable, or none was given without insecure TLS.
    #[error("kubelet certificate authority: {0}")]
    CertificateAuthority(String),
    /// The TLS configuration could not be built.
    #[error("kubelet TLS configuration: {0}")]
    Tls(String),
    /// The HTTP client could not be built.
    #[error("kubelet HTTP client: {0}")]
    HttpClient(String),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

// ---------------------------------------------------------------------------------------------
// Parsing
// ---------------------------------------------------------------------------------------------

/// Identifies a container on a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerKey {
    /// Namespace of the pod.
    pub namespace: Arc<str>,
    /// Name of the pod.
    pub pod: Arc<str>,
    /// Name of the container.
    pub container: Arc<str>,
}

/// One sample value with the time it was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The value, in the series' unit (core-seconds or bytes).
    pub value: f64,
    /// When the kubelet took it (its sample timestamp, or the scrape time if it had none).
    pub timestamp: Timestamp,
}

/// What one fetch says about one container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContainerSample {
    /// `container_cpu_usage_seconds_total`: cumulative core-seconds, above 0.
    pub cpu: Sample,
    /// `container_memory_working_set_bytes`, above 0.
    pub memory: Sample,
    /// `container_start_time_seconds`, when present and sensible (after 1970).
    pub start_time: Option<Timestamp>,
    /// Whether the CPU sample carried its own timestamp (older kubelets send none: the
    /// scrape time stands in, see [`NodeSamples`]).
    pub cpu_stamped: bool,
}

/// One decoded `/metrics/resource` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedBatch {
    /// Containers with both a CPU and a memory sample above 0.
    pub containers: HashMap<ContainerKey, ContainerSample>,
    /// `node_cpu_usage_seconds_total`, when present and above 0.
    pub node_cpu: Option<Sample>,
    /// `node_memory_working_set_bytes`, when present and above 0.
    pub node_memory: Option<Sample>,
    /// `resource_scrape_error` (or the older `scrape_error`) was non-zero: the kubelet could not
    /// collect its summary.
    pub scrape_error: bool,
    /// When the body was requested; samples without a timestamp carry it.
    pub scrape_time: Timestamp,
    /// Containers left out because their CPU or memory was 0 or missing.
    pub dropped_containers: usize,
    /// Lines that are not valid samples, or samples of our families with unusable values.
    pub malformed_lines: usize,
    /// Valid samples of families we do not read (`pod_*`, swap, …).
    pub unknown_lines: usize,
}

/// The families we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    ContainerCpu,
    ContainerMemory,
    ContainerStart,
    NodeCpu,
    NodeMemory,
    ScrapeError,
}

impl Family {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "container_cpu_usage_seconds_total" => Self::ContainerCpu,
            "container_memory_working_set_bytes" => Self::ContainerMemory,
            "container_start_time_seconds" => Self::ContainerStart,
            "node_cpu_usage_seconds_total" => Self::NodeCpu,
            "node_memory_working_set_bytes" => Self::NodeMemory,
            "resource_scrape_error" | "scrape_error" => Self::ScrapeError,
            _ => return None,
        })
    }
}

/// A sample line split into its parts, borrowing from the body.
struct RawSample<'a> {
    name: &'a str,
    labels: &'a str,
    value: &'a str,
    timestamp: Option<&'a str>,
}

/// A container's series as they are found, before the completeness check.
#[derive(Default)]
struct PartialContainer {
    cpu: Option<Sample>,
    cpu_stamped: bool,
    memory: Option<Sample>,
    start_time: Option<Timestamp>,
}

type BorrowedKey<'a> = (Cow<'a, str>, Cow<'a, str>, Cow<'a, str>);

/// Decodes a kubelet `/metrics/resource` body (Prometheus text format 0.0.4).
///
/// Unknown families and malformed lines are skipped and counted; a nonsense
/// `container_start_time_seconds` (negative, year 1) only loses that start time. Fails only when
/// no line of a family we read is usable, which means the body is not resource metrics.
pub fn parse_resource_metrics(body: &str, scrape_time: Timestamp) -> Result<ParsedBatch> {
    let mut batch = ParsedBatch {
        containers: HashMap::new(),
        node_cpu: None,
        node_memory: None,
        scrape_error: false,
        scrape_time,
        dropped_containers: 0,
        malformed_lines: 0,
        unknown_lines: 0,
    };
    let mut partial: HashMap<BorrowedKey<'_>, PartialContainer> = HashMap::new();
    let mut recognized = 0usize;

    for line in body.lines() {
        let line = line.trim_start_matches(BLANK);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(raw) = split_sample(line) else {
            batch.malformed_lines += 1;
            continue;
        };
        let Some(family) = Family::from_name(raw.name) else {
            batch.unknown_lines += 1;
            continue;
        };
        if apply_sample(&mut batch, &mut partial, family, &raw).is_some() {
            recognized += 1;
        } else {
            batch.malformed_lines += 1;
        }
    }

    if recognized == 0 {
        return Err(Error::NoMetrics {
            malformed_lines: batch.malformed_lines,
            unknown_lines: batch.unknown_lines,
        });
    }

    batch.containers.reserve(partial.len());
    for ((namespace, pod, container), found) in partial {
        match (found.cpu, found.memory) {
            (Some(cpu), Some(memory)) if cpu.value > 0.0 && memory.value > 0.0 => {
                let key = ContainerKey {
                    namespace: Arc::from(&*namespace),
                    pod: Arc::from(&*pod),
                    container: Arc::from(&*container),
                };
                let sample = ContainerSample {
                    cpu,
                    memory,
                    start_time: found.start_time,
                    cpu_stamped: found.cpu_stamped,
                };
                batch.containers.insert(key, sample);
            }
            _ => batch.dropped_containers += 1,
        }
    }
    Ok(batch)
}

/// Records one sample of a family we read; `None` when it is unusable.
fn apply_sample<'a>(
    batch: &mut ParsedBatch,
    partial: &mut HashMap<BorrowedKey<'a>, PartialContainer>,
    family: Family,
    raw: &RawSample<'a>,
) -> Option<()> {
    let value: f64 = raw.value.parse().ok().filter(|v: &f64| v.is_finite())?;
    match family {
        Family::ScrapeError => {
            batch.scrape_error |= value != 0.0;
        }
        Family::NodeCpu | Family::NodeMemory => {
            if !raw.labels.trim_matches(BLANK).is_empty() {
                // A labelled node series is not what the kubelet sends; do not guess.
                return None;
            }
            let sample = Sample { value, timestamp: sample_time(raw.timestamp, batch.scrape_time)? };
            let slot = if family == Family::NodeCpu { &mut batch.node_cpu } else { &mut batch.node_memory };
            *slot = (value > 0.0).then_some(sample);
        }
        Family::ContainerCpu | Family::ContainerMemory | Family::ContainerStart => {
            let key = container_labels(raw.labels)?;
            if family == Family::ContainerStart {
                // The sample's own timestamp is irrelevant (and sometimes nonsense): only the
                // value, the start time in seconds, matters.
                let start_time = start_time(value);
                partial.entry(key).or_default().start_time = start_time;
                return Some(());
            }
            let sample = Sample { value, timestamp: sample_time(raw.timestamp, batch.scrape_time)? };
            let entry = partial.entry(key).or_default();
            if family == Family::ContainerCpu {
                entry.cpu = Some(sample);
                entry.cpu_stamped = raw.timestamp.is_some();
            } else {
                entry.memory = Some(sample);
            }
        }
    }
    Some(())
}

/// The timestamp of a sample: milliseconds since the epoch, or the scrape time when absent.
/// `None` for a timestamp that is not a positive integer in range.
fn sample_time(timestamp: Option<&str>, scrape_time: Timestamp) -> Option<Timestamp> {
    match timestamp {
        None => Some(scrape_time),
        Some(text) => {
            text.parse::<i64>().ok().filter(|ms| *ms > 0).and_then(|ms| Timestamp::from_millisecond(ms).ok())
        }
    }
}

/// A start time from `container_start_time_seconds`; `None` when not after the epoch.
fn start_time(seconds: f64) -> Option<Timestamp> {
    if seconds <= 0.0 || seconds > 1e12 {
        return None;
    }
    Timestamp::from_millisecond((seconds * 1000.0).round() as i64).ok()
}

/// The (namespace, pod, container) labels of a container series, all non-empty.
fn container_labels(labels: &str) -> Option<BorrowedKey<'_>> {
    let (mut namespace, mut pod, mut container) = (None, None, None);
    for_each_label(labels, |name, value| match name {
        "namespace" => namespace = Some(value),
        "pod" => pod = Some(value),
        "container" => container = Some(value),
        _ => {}
    })?;
    Some((non_empty(namespace)?, non_empty(pod)?, non_empty(container)?))
}

/// A label value that is present and not empty.
fn non_empty(value: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    value.filter(|v| !v.is_empty())
}

/// Splits `name[{labels}] value [timestamp]`.
fn split_sample(line: &str) -> Option<RawSample<'_>> {
    let name_len = line.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':').count();
    if name_len == 0 || line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let (name, after_name) = line.split_at(name_len);
    let trimmed = after_name.trim_start_matches(BLANK);
    let (labels, rest) = if let Some(inner) = trimmed.strip_prefix('{') {
        let end = closing_brace(inner)?;
        (inner.get(..end)?, inner.get(end + 1..)?)
    } else if trimmed.len() == after_name.len() {
        // The name must be followed by a blank or `{`.
        return None;
    } else {
        ("", trimmed)
    };
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next()?;
    let timestamp = fields.next();
    if fields.next().is_some() {
        return None;
    }
    Some(RawSample { name, labels, value, timestamp })
}

/// Index of the `}` closing a label set, skipping quoted values and their escapes.
fn closing_brace(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match b {
            b'\\' if in_quotes => escaped = true,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Calls `f` with every `name="value"` pair (values unescaped); `None` if the set is malformed.
fn for_each_label<'a>(mut s: &'a str, mut f: impl FnMut(&'a str, Cow<'a, str>)) -> Option<()> {
    loop {
        s = s.trim_start_matches(BLANK);
        if s.is_empty() {
            return Some(());
        }
        let name_len = s.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
        if name_len == 0 {
            return None;
        }
        let (name, rest) = s.split_at(name_len);
        let rest =
            rest.trim_start_matches(BLANK).strip_prefix('=')?.trim_start_matches(BLANK).strip_prefix('"')?;
        let (value, rest) = read_quoted(rest)?;
        f(name, value);
        let rest = rest.trim_start_matches(BLANK);
        if rest.is_empty() {
            return Some(());
        }
        s = rest.strip_prefix(',')?;
    }
}

/// Reads a label value up to its closing quote (`s` starts after the opening one), unescaping
/// `\\`, `\"` and `\n`; borrows when there is nothing to unescape.
fn read_quoted(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = s.as_bytes();
    let mut owned: Option<String> = None;
    let mut run_start = 0;
    let mut i = 0;
    // Only ASCII bytes are matched, and those never occur inside a multi-byte character, so
    // every slice below is on a character boundary.
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                let run = s.get(run_start..i)?;
                let value = match owned {
                    Some(mut text) => {
                        text.push_str(run);
                        Cow::Owned(text)
                    }
                    None => Cow::Borrowed(run),
                };
                return Some((value, s.get(i + 1..)?));
            }
            b'\\' => {
                let text = owned.get_or_insert_with(String::new);
                text.push_str(s.get(run_start..i)?);
                text.push(match bytes.get(i + 1)? {
                    b'\\' => '\\',
                    b'"' => '"',
                    b'n' => '\n',
                    _ => return None,
                });
                i += 2;
                run_start = i;
            }
            _ => i += 1,
        }
    }
    None
}

// ---------------------------------------------------------------------------------------------
// CPU rates
// ---------------------------------------------------------------------------------------------

/// One container's point: what a fetch said about it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    cpu: Sample,
    memory: Sample,
    start_time: Option<Timestamp>,
    /// The CPU timestamp is the kubelet's own, not the scrape time.
    cpu_stamped: bool,
}

/// How long an unchanged CPU counter without a sample timestamp is taken for the sample
/// already seen (the kubelet samples every housekeeping period, 10–15 s); past this the
/// container is idle and its rate 0.
const UNSTAMPED_REPEAT_WINDOW: jiff::SignedDuration = jiff::SignedDuration::from_secs(60);

/// The newest point and the previous distinct one.
#[derive(Debug, Clone, Copy, PartialEq)]
struct History {
    last: Point,
    prev: Option<Point>,
}

impl History {
    /// Moves the history forward with a new point.
    fn advance(self, new: Point) -> Self {
        let restarted = match (self.last.start_time, new.start_time) {
            (Some(old), Some(start)) => start != old || start > self.last.cpu.timestamp,
            (None, Some(start)) => start > self.last.cpu.timestamp,
            _ => false,
        };
        if restarted || new.cpu.value < self.last.cpu.value {
            return Self { last: new, prev: None };
        }
        let unstamped_repeat = !new.cpu_stamped
            && new.cpu.value == self.last.cpu.value
            && new.cpu.timestamp.duration_since(self.last.cpu.timestamp) < UNSTAMPED_REPEAT_WINDOW;
        if new.cpu.timestamp <= self.last.cpu.timestamp || unstamped_repeat {
            // A fetch inside the same housekeeping period returns the same sample: keep the
            // pair we have (a newer memory reading is still worth taking). Without sample
            // timestamps (older kubelets) the scrape time stands in, so the same sample read
            // twice looks newer: an unchanged counter is that sample again, and it keeps the
            // time it was first seen. Taken as new it would make a zero rate.
            let mut kept = self;
            if new.memory.timestamp > kept.last.memory.timestamp {
                kept.last.memory = new.memory;
            }
            return kept;
        }
        Self { last: new, prev: Some(self.last) }
    }

    /// The usage this history supports.
    fn usage(&self, name: &Arc<str>) -> ContainerUsage {
        let last = &self.last;
        let rate = self.prev.and_then(|prev| {
            let nanos = last.cpu.timestamp.as_nanosecond() - prev.cpu.timestamp.as_nanosecond();
            let window = nanos as f64 / 1e9;
            let used = last.cpu.value - prev.cpu.value;
            (window > 0.0 && used >= 0.0).then(|| (used / window, window))
        });
        let timestamp = match rate {
            Some(_) => last.cpu.timestamp.max(last.memory.timestamp),
            None => last.memory.timestamp,
        };
        ContainerUsage {
            name: name.clone(),
            cpu_cores: rate.map(|(cores, _)| cores),
            memory_bytes: Some(last.memory.value),
            timestamp: Some(timestamp),
            window_seconds: rate.map(|(_, window)| window),
        }
    }
}

/// The rate state of one node: per container, the newest and the previous distinct sample.
///
/// Pure and synchronous so that the rate rules are tested without HTTP. Containers missing from
/// a batch are forgotten (they ended, or were dropped as just started).
#[derive(Debug, Default)]
pub struct NodeSamples {
    containers: HashMap<ContainerKey, History>,
}

impl NodeSamples {
    /// An empty state.
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of containers tracked.
    pub fn len(&self) -> usize {
        self.containers.len()
    }

    /// Whether no container is tracked.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// Takes a new batch and returns the node's usage: CPU is the rate between the previous and
    /// the newest distinct sample (absent after a single sample, a restart, or a decreasing
    /// counter), memory the newest working set. Containers are sorted by name within a pod.
    pub fn update(&mut self, batch: ParsedBatch) -> NodeUsage {
        let mut next = HashMap::with_capacity(batch.containers.len());
        let mut usage = NodeUsage::default();
        for (key, sample) in batch.containers {
            let point = Point {
                cpu: sample.cpu,
                memory: sample.memory,
                start_time: sample.start_time,
                cpu_stamped: sample.cpu_stamped,
            };
            // The key already held keeps its strings (shared with the usage below), so the
            // state of a container does not move in memory from fetch to fetch.
            let (key, history) = match self.containers.remove_entry(&key) {
                Some((held, old)) => (held, old.advance(point)),
                None => (key, History { last: point, prev: None }),
            };
            let pod = PodKey { namespace: key.namespace.clone(), name: key.pod.clone() };
            usage.pods.entry(pod).or_default().push(history.usage(&key.container));
            next.insert(key, history);
        }
        for containers in usage.pods.values_mut() {
            containers.sort_by(|a, b| a.name.cmp(&b.name));
        }
        self.containers = next;
        usage
    }
}

// ---------------------------------------------------------------------------------------------
// Client
// ---------------------------------------------------------------------------------------------

/// Where the bearer token sent to kubelets comes from.
#[derive(Clone)]
pub enum BearerToken {
    /// A fixed token.
    Static(String),
    /// A file holding the token (a projected service-account token), re-read at most once a
    /// minute so rotations are picked up.
    File(PathBuf),
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Static(_) => f.write_str("Static(<redacted>)"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// URL scheme used to reach kubelets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Scheme {
    /// HTTPS, as every real kubelet serves.
    #[default]
    Https,
    /// Plain HTTP, for simulators and tests only: the bearer token travels in clear.
    Http,
}

/// How to reach and read kubelets (metrics-server's `--kubelet-*` flags).
#[derive(Debug, Clone)]
pub struct KubeletConfig {
    /// `--kubelet-port`, used unless the node status gives one and
    /// [`use_node_status_port`](Self::use_node_status_port) is set.
    pub port: u16,
    /// `--kubelet-preferred-address-types`: the node address types to try, in order.
    /// Defaults to metrics-server's `Hostname, InternalDNS, InternalIP, ExternalDNS, ExternalIP`.
    pub preferred_address_types: Vec<String>,
    /// `--kubelet-insecure-tls`: do not verify kubelet serving certificates.
    pub insecure_tls: bool,
    /// `--kubelet-certificate-authority`: PEM bundle that kubelet certificates must chain to
    /// (usually the cluster CA). Required unless `insecure_tls`.
    pub ca_pem: Option<Vec<u8>>,
    /// The bearer token sent to kubelets, if any.
    pub bearer_token: Option<BearerToken>,
    /// `--kubelet-request-timeout`: bound on one fetch, and on the wait for a fetch slot.
    pub request_timeout: Duration,
    /// How long a node's usage is served from the cache.
    pub cache_ttl: Duration,
    /// `--kubelet-use-node-status-port`: use `status.daemonEndpoints.kubeletEndpoint.port`.
    pub use_node_status_port: bool,
    /// Most fetches in flight at once.
    pub max_concurrency: usize,
    /// Largest body read; see [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Most containers accepted from one body; see [`DEFAULT_MAX_CONTAINERS`].
    pub max_containers: usize,
    /// HTTPS unless talking to a simulator.
    pub scheme: Scheme,
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            preferred_address_types: DEFAULT_PREFERRED_ADDRESS_TYPES
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            insecure_tls: false,
            ca_pem: None,
            bearer_token: None,
            request_timeout: Duration::from_secs(10),
            cache_ttl: Duration::from_secs(10),
            use_node_status_port: false,
            max_concurrency: 64,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_containers: DEFAULT_MAX_CONTAINERS,
            scheme: Scheme::Https,
        }
    }
}

/// Reads kubelets' `/metrics/resource` and keeps their CPU rate state.
pub struct KubeletClient {
    inner: Arc<Inner>,
    cache: Cache<String, Arc<NodeUsage>>,
}

struct Inner {
    http: reqwest::Client,
    config: KubeletConfig,
    inventory: Arc<dyn Inventory>,
    observer: Arc<dyn UpstreamObserver>,
    token: Option<TokenProvider>,
    slots: Semaphore,
    /// Rate state per node, each behind its own lock so nodes update independently.
    samples: Mutex<HashMap<String, Arc<Mutex<NodeSamples>>>>,
}

/// A failed fetch with the outcome to record.
struct Failure {
    outcome: &'static str,
    error: KubeletError,
}

impl KubeletClient {
    /// Builds a client. Fails when the TLS settings are unusable (no CA and not insecure, a CA
    /// bundle without certificates).
    pub fn new(
        config: KubeletConfig,
        inventory: Arc<dyn Inventory>,
        observer: Arc<dyn UpstreamObserver>,
    ) -> Result<Self> {
        let tls = tls_config(&config)?;
        let http = reqwest::Client::builder()
            .tls_backend_preconfigured(tls)
            .timeout(config.request_timeout)
            .connect_timeout(config.request_timeout)
            // Kubelets are reached directly, as metrics-server does; an HTTP(S)_PROXY meant for
            // egress must not see the token.
            .no_proxy()
            .pool_idle_timeout(Duration::from_secs(90))
            .build()
            .map_err(|e| Error::HttpClient(error_chain(&e)))?;
        let cache = Cache::builder().time_to_live(config.cache_ttl).max_capacity(1_000_000).build();
        let token = config.bearer_token.clone().map(TokenProvider::new);
        let slots = Semaphore::new(config.max_concurrency.max(1));
        Ok(Self {
            inner: Arc::new(Inner {
                http,
                config,
                inventory,
                observer,
                token,
                slots,
                samples: Mutex::new(HashMap::new()),
            }),
            cache,
        })
    }
}

impl KubeletSource for KubeletClient {
    fn node_usage(&self, node: &str) -> BoxFuture<'_, Result<Arc<NodeUsage>, KubeletError>> {
        let node = node.to_owned();
        Box::pin(async move {
            let inner = Arc::clone(&self.inner);
            let fetch_node = node.clone();
            self.cache
                .try_get_with(node, async move { inner.fetch(&fetch_node).await.map(Arc::new) })
                .await
                .map_err(|e| (*e).clone())
        })
    }
}

impl Inner {
    /// One fetch, recorded by the observer.
    async fn fetch(&self, node: &str) -> Result<NodeUsage, KubeletError> {
        let info = match self.inventory.node(node) {
            Some(info) => info,
            None => {
                // The node is gone: so is its rate state.
                lock(&self.samples).remove(node);
                return Err(KubeletError::NoAddress {
                    node: node.to_owned(),
                    reason: "node not in the inventory".to_owned(),
                });
            }
        };
        let url = self.url(&info)?;
        let started = Instant::now();
        let result = self.fetch_batch(node, &url).await;
        let result = match result {
            Ok(batch) if batch.scrape_error && batch.containers.is_empty() => Err(Failure {
                outcome: outcome::ERROR,
                error: KubeletError::ScrapeError { node: node.to_owned() },
            }),
            other => other,
        };
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(batch) => {
                self.observer.observe(SOURCE, outcome::SUCCESS, seconds);
                let state = Arc::clone(lock(&self.samples).entry(node.to_owned()).or_default());
                let usage = lock(&state).update(batch);
                Ok(usage)
            }
            Err(failure) => {
                self.observer.observe(SOURCE, failure.outcome, seconds);
                Err(failure.error)
            }
        }
    }

    /// The URL of a node's resource metrics.
    fn url(&self, node: &NodeInfo) -> Result<String, KubeletError> {
        let no_address = |reason: String| KubeletError::NoAddress { node: node.name.clone(), reason };
        let address = select_address(node, &self.config.preferred_address_types).ok_or_else(|| {
            no_address(format!("no address of type {}", self.config.preferred_address_types.join(", ")))
        })?;
        let host = url_host(address)
            .ok_or_else(|| no_address(format!("address {address:?} is not a host name or IP")))?;
        let port = match node.kubelet_port {
            Some(port) if self.config.use_node_status_port && port != 0 => port,
            _ => self.config.port,
        };
        let scheme = match self.config.scheme {
            Scheme::Https => "https",
            Scheme::Http => "http",
        };
        Ok(format!("{scheme}://{host}:{port}{RESOURCE_METRICS_PATH}"))
    }

    /// Requests, reads and decodes one body.
    async fn fetch_batch(&self, node: &str, url: &str) -> Result<ParsedBatch, Failure> {
        let request_error = |outcome: &'static str, reason: String| Failure {
            outcome,
            error: KubeletError::Request { node: node.to_owned(), reason },
        };
        let timeout = self.config.request_timeout;
        let _slot = match tokio::time::timeout(timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(request_error(outcome::ERROR, "client closed".to_owned())),
            Err(_) => {
                return Err(request_error(
                    outcome::TIMEOUT,
                    format!("no fetch slot free within {timeout:?}"),
                ));
            }
        };

        let mut request = self.http.get(url).header(http::header::ACCEPT, "text/plain;version=0.0.4");
        let mut token = None;
        if let Some(provider) = &self.token {
            let value = provider.get().await.map_err(|reason| request_error(outcome::ERROR, reason))?;
            let mut header = http::HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| {
                request_error(outcome::ERROR, "the bearer token is not a valid header value".to_owned())
            })?;
            header.set_sensitive(true);
            request = request.header(http::header::AUTHORIZATION, header);
            token = Some(value);
        }
        let redact = |reason: String| redact(reason, token.as_deref());

        let scrape_time = Timestamp::now();
        let mut response = request.send().await.map_err(|e| {
            let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::UNREACHABLE };
            request_error(outcome, redact(error_chain(&e)))
        })?;

        let status = response.status();
        if !status.is_success() {
            let snippet = read_capped(&mut response, ERROR_BODY_SNIPPET)
                .await
                .map(|(bytes, _)| String::from_utf8_lossy(&bytes).trim().to_owned())
                .unwrap_or_default();
            return Err(request_error(
                outcome::ERROR,
                redact(format!("GET {url}: HTTP {status}: {snippet}")),
            ));
        }
        let max = self.config.max_body_bytes;
        if response.content_length().is_some_and(|len| len > max as u64) {
            return Err(request_error(outcome::ERROR, format!("GET {url}: body exceeds {max} bytes")));
        }
        let (body, truncated) = read_capped(&mut response, max).await.map_err(|e| {
            let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::ERROR };
            request_error(outcome, redact(error_chain(&e)))
        })?;
        if truncated {
            return Err(request_error(outcome::ERROR, format!("GET {url}: body exceeds {max} bytes")));
        }
        let text = String::from_utf8_lossy(&body);
        let batch = parse_resource_metrics(&text, scrape_time)
            .map_err(|e| request_error(outcome::ERROR, format!("GET {url}: {e}")))?;
        let limit = self.config.max_containers;
        if batch.containers.len() > limit {
            return Err(request_error(
                outcome::ERROR,
                format!("GET {url}: {} containers, more than the {limit} accepted", batch.containers.len()),
            ));
        }
        Ok(batch)
    }
}

/// Reads at most `max` bytes of a body; the flag says whether more was left.
async fn read_capped(
    response: &mut reqwest::Response,
    max: usize,
) -> Result<(Vec<u8>, bool), reqwest::Error> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        let room = max - body.len();
        if chunk.len() > room {
            body.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return Ok((body, true));
        }
        body.extend_from_slice(&chunk);
    }
    Ok((body, false))
}

/// The first address of the first preferred type that the node has.
fn select_address<'a>(node: &'a NodeInfo, preferred: &[String]) -> Option<&'a str> {
    preferred.iter().find_map(|wanted| {
        node.addresses
            .iter()
            .find(|(kind, address)| kind == wanted && !address.is_empty())
            .map(|(_, address)| address.as_str())
    })
}

/// The URL host for an address: IPv6 in brackets, an IP or DNS name as is, anything else
/// (which could smuggle a path or userinfo into the URL) rejected.
fn url_host(address: &str) -> Option<String> {
    if let Ok(ip) = address.parse::<IpAddr>() {
        return Some(match ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        });
    }
    if !address.is_empty()
        && address.len() <= 253
        && address.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !address.starts_with(['-', '.'])
    {
        return Some(address.to_owned());
    }
    None
}

/// A message with every cause, since reqwest's own message omits them.
fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// Removes the token from a message, whatever produced it.
fn redact(message: String, token: Option<&str>) -> String {
    match token {
        Some(token) if token.len() >= 4 && message.contains(token) => message.replace(token, "<redacted>"),
        _ => message,
    }
}

/// Locks a mutex, taking the data even if a panic poisoned it (the state stays consistent:
/// every update replaces whole values).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Supplies the bearer token, re-reading a token file at most every [`TOKEN_REFRESH`].
struct TokenProvider {
    source: BearerToken,
    cached: Mutex<Option<(String, Instant)>>,
}

impl TokenProvider {
    fn new(source: BearerToken) -> Self {
        Self { source, cached: Mutex::new(None) }
    }

    /// The current token; the error names the file, never the token.
    async fn get(&self) -> Result<String, String> {
        let path = match &self.source {
            BearerToken::Static(token) => return Ok(token.clone()),
            BearerToken::File(path) => path,
        };
        if let Some((token, read_at)) = lock(&self.cached).as_ref()
            && read_at.elapsed() < TOKEN_REFRESH
        {
            return Ok(token.clone());
        }
        match tokio::fs::read_to_string(path).await {
            Ok(text) => {
                let token = text.trim().to_owned();
                *lock(&self.cached) = Some((token.clone(), Instant::now()));
                Ok(token)
            }
            // Keep using the last token: it is likely still valid for a while.
            Err(e) => lock(&self.cached)
                .as_ref()
                .map(|(token, _)| token.clone())
                .ok_or_else(|| format!("reading bearer token file {}: {e}", path.display())),
        }
    }
}

/// Builds the rustls configuration for kubelet connections.
fn tls_config(config: &KubeletConfig) -> Result<rustls::ClientConfig> {
    // main installs ring process-wide; fall back to it explicitly rather than panic.
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| Error::Tls(e.to_string()))?;
    let mut tls = if config.insecure_tls {
        builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(AnyServerCert { provider }))
            .with_no_client_auth()
    } else {
        let mut roots = RootCertStore::empty();
        match config.ca_pem.as_deref() {
            Some(pem) => {
                for cert in CertificateDer::pem_slice_iter(pem) {
                    let cert = cert.map_err(|e| Error::CertificateAuthority(e.to_string()))?;
                    roots.add(cert).map_err(|e| Error::CertificateAuthority(e.to_string()))?;
                }
                if roots.is_empty() {
                    return Err(Error::CertificateAuthority("no certificate in the PEM bundle".to_owned()));
                }
            }
            None if config.scheme == Scheme::Https => {
                return Err(Error::CertificateAuthority(
                    "none given: set --kubelet-certificate-authority or --kubelet-insecure-tls".to_owned(),
                ));
            }
            None => {}
        }
        builder.with_root_certificates(roots).with_no_client_auth()
    };
    tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(tls)
}

/// `--kubelet-insecure-tls`: accepts any certificate, but still checks that the server holds
/// the key of the one it presented.
#[derive(Debug)]
struct AnyServerCert {
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for AnyServerCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::PrivatePkcs8KeyDer;

    use super::*;

    const FIXTURE: &str = include_str!("../../tests/fixtures/kubelet-metrics-resource.txt");

    fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

    fn key(namespace: &str, pod: &str, container: &str) -> ContainerKey {
        ContainerKey { namespace: namespace.into(), pod: pod.into(), container: container.into() }
    }

    fn mk_container(cpu: f64, cpu_ms: i64, memory: f64, mem_ms: i64, start_s: f64) -> ContainerSample {
        ContainerSample {
            cpu: Sample { value: cpu, timestamp: ts(cpu_ms) },
            memory: Sample { value: memory, timestamp: ts(mem_ms) },
            start_time: start_time(start_s),
            cpu_stamped: true,
        }
    }

    #[test]
    fn shared_fixture_parses_to_exact_values() {
        let scrape = ts(1_764_496_815_000);
        let batch = parse_resource_metrics(FIXTURE, scrape).unwrap();
        let mut want = HashMap::new();
        want.insert(
            key("kube-system", "coredns-76f75df574-8xk2p", "coredns"),
            mk_container(812.403127, 1_764_496_812_125, 17_223_680.0, 1_764_496_812_125, 1_764_401_112.0),
        );
        want.insert(
            key("shop", "web-7d4b9c6f5-x2x4z", "app"),
            mk_container(15234.998811, 1_764_496_810_460, 134_217_728.0, 1_764_496_810_460, 1_764_452_100.0),
        );
        want.insert(
            key("shop", "web-7d4b9c6f5-x2x4z", "envoy"),
            mk_container(2210.117302, 1_764_496_811_983, 41_943_040.0, 1_764_496_811_983, 1_764_452_101.0),
        );
        want.insert(
            key("default", "espresso-du-matin-5c9f8-qq7tn", "brewer"),
            mk_container(98.551009, 1_764_496_809_876, 25_165_824.0, 1_764_496_809_876, 1_764_491_100.0),
        );
        assert_eq!(batch.containers, want);
        assert_eq!(batch.node_cpu, Some(Sample { value: 357_354.910_27, timestamp: ts(1_764_496_809_720) }));
        assert_eq!(
            batch.node_memory,
            Some(Sample { value: 6_616_273_408.0, timestamp: ts(1_764_496_809_720) })
        );
        assert!(!batch.scrape_error);
        assert_eq!(batch.scrape_time, scrape);
        assert_eq!(batch.dropped_containers, 0);
        assert_eq!(batch.malformed_lines, 0);
        // 4 container swap + 1 node swap + 9 pod_* samples.
        assert_eq!(batch.unknown_lines, 14);
        let start = batch.containers[&key("shop", "web-7d4b9c6f5-x2x4z", "app")].start_time;
        assert_eq!(start.unwrap().to_string(), "2025-11-29T21:35:00Z");
    }

    #[test]
    fn survives_what_real_kubelets_send() {
        let body = "\
# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds\r
# TYPE container_cpu_usage_seconds_total counter\r
container_cpu_usage_seconds_total{container=\"a\",namespace=\"ns\",pod=\"p\"} 4.710169\r
container_cpu_usage_seconds_total{pod=\"p\",namespace=\"ns\",container=\"b\",extra=\"x,y=}\"} 1.5e+01 1633253812125
container_cpu_usage_seconds_total{container=\"new\",namespace=\"ns\",pod=\"p\"} 0 1633253812125
container_cpu_usage_seconds_total{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\",} 2 1633253812125
container_cpu_usage_seconds_total{container=\"nan\",namespace=\"ns\",pod=\"p\"} NaN 1633253812125
container_cpu_usage_seconds_total{container=\"badts\",namespace=\"ns\",pod=\"p\"} 3 -5
container_memory_working_set_bytes{container=\"a\",namespace=\"ns\",pod=\"p\"} 1.253376e+07
container_memory_working_set_bytes{container=\"b\",namespace=\"ns\",pod=\"p\"} 1000 1633253812000
container_memory_working_set_bytes{container=\"new\",namespace=\"ns\",pod=\"p\"} 5 1633253812125
container_memory_working_set_bytes{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_memory_working_set_bytes{container=\"nan\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_memory_working_set_bytes{container=\"badts\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_start_time_seconds{container=\"a\",namespace=\"ns\",pod=\"p\"} -6.21355968e+10 -62135596800000
container_start_time_seconds{container=\"b\",namespace=\"ns\",pod=\"p\"} -1
container_start_time_seconds{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\"} 1.633252712e+09
container_start_time_seconds{container=\"gone\",namespace=\"ns\",pod=\"p\"} 1.633252712e+09
container_cpu_usage_seconds_total{container=\"\",namespace=\"ns\",pod=\"p\"} 2
container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\"
container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\"} 1 2 3
container_cpu_usage_seconds_total{container=\"c\\t\",namespace=\"ns\",pod=\"p\"} 1
pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"p\"} 99 1633253803935
node_cpu_usage_seconds_total 357.35491 1633253809720
node_memory_working_set_bytes 0 1633253809720
scrape_error 0
resource_scrape_error 1

   \t
garbage line
";
        let scrape = ts(1_633_253_815_000);
        let batch = parse_resource_metrics(body, scrape).unwrap();
        let want_a = ContainerSample {
            cpu_stamped: false,
            ..mk_container(4.710169, 1_633_253_815_000, 12_533_760.0, 1_633_253_815_000, 0.0)
        };
        assert_eq!(want_a.start_time, None);
        assert_eq!(batch.containers[&key("ns", "p", "a")], want_a);
        let want_b = mk_container(15.0, 1_633_253_812_125, 1000.0, 1_633_253_812_000, -1.0);
        assert_eq!(batch.containers[&key("ns", "p", "b")], want_b);
        let quoted = &batch.containers[&key("ns", "p", "q\"uo\\te\nd")];
        assert_eq!(quoted.start_time, Some(ts(1_633_252_712_000)));
        // `new` has CPU 0, `nan` and `badts` have no usable CPU, `gone` only a start time.
        assert_eq!(batch.containers.len(), 3);
        assert_eq!(batch.dropped_containers, 4);
        assert_eq!(batch.node_cpu, Some(Sample { value: 357.35491, timestamp: ts(1_633_253_809_720) }));
        assert_eq!(batch.node_memory, None);
        assert!(batch.scrape_error);
        // `pod_*`, and `garbage line`, which is a well-formed sample of an unknown family.
        assert_eq!(batch.unknown_lines, 2);
        // NaN, bad timestamp, empty container, unterminated labels, extra field, bad escape.
        assert_eq!(batch.malformed_lines, 6);
    }

    #[test]
    fn a_body_without_resource_metrics_is_an_error() {
        for body in ["", "<html><body>502 Bad Gateway</body></html>", "# only comments\n", "up 1\n"] {
            let err = parse_resource_metrics(body, ts(1)).unwrap_err();
            assert!(matches!(err, Error::NoMetrics { .. }), "{body:?}: {err}");
        }
        // A node with no pods is fine.
        let batch = parse_resource_metrics("resource_scrape_error 0\n", ts(1)).unwrap();
        assert!(batch.containers.is_empty());
    }

    #[test]
    fn garbage_and_truncation_never_panic() {
        for end in 0..=FIXTURE.len() {
            if let Some(prefix) = FIXTURE.get(..end) {
                let _ = parse_resource_metrics(prefix, ts(1));
            }
        }
        // A deterministic pseudo-random mix of the characters that matter to the grammar.
        let alphabet = b"a_{}=\",\\n \t#\n0123456789.e+-:\xc3\xa9";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut bytes = b"container_cpu_usage_seconds_total{".to_vec();
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_resource_metrics(&text, ts(1));
        }
    }

    // ---- rates ----

    fn mk_batch(containers: &[(&str, f64, i64, f64, f64)]) -> ParsedBatch {
        ParsedBatch {
            containers: containers
                .iter()
                .map(|(name, cpu, ms, memory, start)| {
                    (key("ns", "p", name), mk_container(*cpu, *ms, *memory, *ms, *start))
                })
                .collect(),
            node_cpu: None,
            node_memory: None,
            scrape_error: false,
            scrape_time: ts(1),
            dropped_containers: 0,
            malformed_lines: 0,
            unknown_lines: 0,
        }
    }

    fn usage_of(usage: &NodeUsage, container: &str) -> ContainerUsage {
        let pod = PodKey { namespace: "ns".into(), name: "p".into() };
        usage.pods[&pod].iter().find(|c| &*c.name == container).unwrap().clone()
    }

    const T0: i64 = 1_764_496_800_000;
    const START: f64 = 1_764_490_000.0;

    #[test]
    fn a_containers_strings_are_kept_from_fetch_to_fetch_and_shared_with_its_usage() {
        let mut state = NodeSamples::new();
        let first = usage_of(&state.update(mk_batch(&[("app", 1.0, T0, 10.0, START)])), "app");
        let usage = state.update(mk_batch(&[("app", 2.0, T0 + 10_000, 10.0, START)]));
        let (pod, containers) = usage.pods.iter().next().unwrap();
        assert!(Arc::ptr_eq(&containers[0].name, &first.name), "the held key's name is reused");
        let (held, _) = state.containers.iter().next().unwrap();
        assert!(Arc::ptr_eq(&pod.namespace, &held.namespace) && Arc::ptr_eq(&pod.name, &held.pod));
    }

    #[test]
    fn a_single_sample_is_not_a_usage() {
        let mut samples = NodeSamples::new();
        let usage = samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_cores, None);
        assert_eq!(app.window_seconds, None);
        assert_eq!(app.memory_bytes, Some(5e6));
        assert_eq!(app.timestamp, Some(ts(T0)));
    }

    #[test]
    fn rate_between_distinct_samples_and_same_period_refetch() {
        let mut samples = NodeSamples::new();
        samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let second = mk_batch(&[("app", 102.5, T0 + 10_000, 6e6, START)]);
        let usage = samples.update(second.clone());
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_cores, Some(0.25));
        assert_eq!(app.window_seconds, Some(10.0));
        assert_eq!(app.memory_bytes, Some(6e6));
        assert_eq!(app.timestamp, Some(ts(T0 + 10_000)));

        // A fetch inside the same housekeeping period returns the same sample: same answer.
        let usage = samples.update(second);
        assert_eq!(usage_of(&usage, "app"), app);

        let usage = samples.update(mk_batch(&[("app", 107.5, T0 + 20_000, 7e6, START)]));
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_cores, Some(0.5));
        assert_eq!(app.window_seconds, Some(10.0));
    }

    /// An older kubelet's body: no sample timestamps, `scrape_error`.
    fn unstamped(cpu: f64, memory: f64) -> String {
        format!(
            "# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {cpu}\n\
             # HELP container_memory_working_set_bytes [ALPHA] Current working set of the container in bytes\n\
             # TYPE container_memory_working_set_bytes gauge\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {memory}\n\
             # HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE scrape_error gauge\nscrape_error 0\n"
        )
    }

    #[test]
    fn unstamped_samples_rate_on_first_sight_and_a_repeat_is_not_idle() {
        let mut samples = NodeSamples::new();
        let mut fetch = |body: String, ms: i64| {
            let batch = parse_resource_metrics(&body, ts(ms)).unwrap();
            assert!(batch.containers.values().all(|c| !c.cpu_stamped && c.cpu.timestamp == ts(ms)));
            usage_of(&samples.update(batch), "app")
        };
        assert_eq!(fetch(unstamped(100.0, 5e6), T0).cpu_cores, None);
        // The kubelet has not sampled again: same counter, later scrape. Not a zero rate.
        let again = fetch(unstamped(100.0, 5e6), T0 + 4_000);
        assert_eq!(again.cpu_cores, None);
        assert_eq!(again.memory_bytes, Some(5e6));
        // A new sample: the rate runs from when each value was first seen.
        let app = fetch(unstamped(102.5, 6e6), T0 + 10_000);
        assert_eq!(app.cpu_cores, Some(0.25));
        assert_eq!(app.window_seconds, Some(10.0));
        // Read again within the housekeeping period: the same rate, not 0.
        let app = fetch(unstamped(102.5, 6e6), T0 + 13_000);
        assert_eq!(app.cpu_cores, Some(0.25));
        assert_eq!(app.memory_bytes, Some(6e6));
        assert_eq!(app.timestamp, Some(ts(T0 + 13_000)));
        // Unchanged for more than a minute: the container is idle.
        let app = fetch(unstamped(102.5, 6e6), T0 + 75_000);
        assert_eq!(app.cpu_cores, Some(0.0));
        // Stamped samples keep their meaning: the same value at a later time is idle time.
        let mut stamped = NodeSamples::new();
        stamped.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let usage = stamped.update(mk_batch(&[("app", 100.0, T0 + 10_000, 5e6, START)]));
        assert_eq!(usage_of(&usage, "app").cpu_cores, Some(0.0));
    }

    #[test]
    fn restart_and_counter_decrease_reset_the_rate() {
        let mut samples = NodeSamples::new();
        samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START), ("side", 50.0, T0, 1e6, START)]));
        samples.update(mk_batch(&[
            ("app", 101.0, T0 + 10_000, 5e6, START),
            ("side", 51.0, T0 + 10_000, 1e6, START),
        ]));
        // `app` restarted (new start time, counter from zero); `side`'s counter went down.
        let restarted = (T0 + 15_000) as f64 / 1000.0;
        let usage = samples.update(mk_batch(&[
            ("app", 0.5, T0 + 20_000, 5e6, restarted),
            ("side", 40.0, T0 + 20_000, 1e6, START),
        ]));
        assert_eq!(usage_of(&usage, "app").cpu_cores, None);
        assert_eq!(usage_of(&usage, "side").cpu_cores, None);
        // The next samples rate from the new baseline.
        let usage = samples.update(mk_batch(&[
            ("app", 1.5, T0 + 30_000, 5e6, restarted),
            ("side", 42.0, T0 + 30_000, 1e6, START),
        ]));
        assert_eq!(usage_of(&usage, "app").cpu_cores, Some(0.1));
        assert_eq!(usage_of(&usage, "side").cpu_cores, Some(0.2));
        // A restart whose counter happens to be higher is caught by the start time alone.
        let usage =
            samples.update(mk_batch(&[("app", 9.0, T0 + 40_000, 5e6, (T0 + 35_000) as f64 / 1000.0)]));
        assert_eq!(usage_of(&usage, "app").cpu_cores, None);
        // `side` vanished from the batch, so it is forgotten.
        assert_eq!(samples.len(), 1);
    }

    #[test]
    fn update_groups_containers_by_pod_sorted_by_name() {
        let mut samples = NodeSamples::new();
        let batch = parse_resource_metrics(FIXTURE, ts(1)).unwrap();
        let usage = samples.update(batch);
        assert_eq!(usage.pods.len(), 3);
        let web = PodKey { namespace: "shop".into(), name: "web-7d4b9c6f5-x2x4z".into() };
        let names: Vec<_> = usage.pods[&web].iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["app", "envoy"]);
    }

    // ---- addresses ----

    fn mk_node(addresses: &[(&str, &str)], kubelet_port: Option<u16>) -> NodeInfo {
        NodeInfo {
            name: "node-a".to_owned(),
            addresses: addresses.iter().map(|(t, a)| ((*t).to_owned(), (*a).to_owned())).collect(),
            kubelet_port,
        }
    }

    #[test]
    fn address_preference_and_url() {
        let node = mk_node(
            &[("InternalIP", "10.0.0.7"), ("Hostname", "node-a"), ("ExternalIP", "2001:db8::7")],
            Some(10255),
        );
        let defaults = KubeletConfig::default().preferred_address_types;
        assert_eq!(select_address(&node, &defaults), Some("node-a"));
        let ip_first = vec!["InternalIP".to_owned(), "Hostname".to_owned()];
        assert_eq!(select_address(&node, &ip_first), Some("10.0.0.7"));
        assert_eq!(select_address(&node, &["InternalDNS".to_owned()]), None);
        assert_eq!(url_host("2001:db8::7").as_deref(), Some("[2001:db8::7]"));
        assert_eq!(url_host("10.0.0.7").as_deref(), Some("10.0.0.7"));
        assert_eq!(url_host("node-a.example").as_deref(), Some("node-a.example"));
        for bad in ["evil.example/x?", "user@host", "a b", "-x", ""] {
            assert_eq!(url_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn redaction_and_debug_hide_the_token() {
        let message = redact("denied for Bearer s3cr3t-token".to_owned(), Some("s3cr3t-token"));
        assert_eq!(message, "denied for Bearer <redacted>");
        let config = KubeletConfig {
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }

    #[test]
    fn https_without_a_trust_anchor_is_refused() {
        let inventory: Arc<dyn Inventory> = Arc::new(MkInventory::default());
        let err =
            KubeletClient::new(KubeletConfig::default(), inventory, Arc::new(super::super::NoopObserver))
                .err()
                .unwrap();
        assert!(matches!(err, Error::CertificateAuthority(_)), "{err}");
    }

    // ---- HTTP against a local rustls server ----

    #[derive(Default)]
    struct MkInventory {
        nodes: HashMap<String, Arc<NodeInfo>>,
    }

    impl Inventory for MkInventory {
        fn running_pods(&self, _namespace: Option<&str>) -> Vec<Arc<super::super::PodInfo>> {
            Vec::new()
        }
        fn node(&self, name: &str) -> Option<Arc<NodeInfo>> {
            self.nodes.get(name).cloned()
        }
        fn is_synced(&self) -> bool {
            true
        }
        fn resource_version(&self) -> String {
            "1".to_owned()
        }
    }

    #[derive(Default)]
    struct MkObserver {
        calls: Mutex<Vec<(&'static str, &'static str)>>,
    }

    impl UpstreamObserver for MkObserver {
        fn observe(&self, source: &'static str, outcome: &'static str, _seconds: f64) {
            self.calls.lock().unwrap().push((source, outcome));
        }
    }

    #[derive(Default)]
    struct ServerState {
        body: Mutex<String>,
        hits: AtomicUsize,
        authorizations: Mutex<Vec<Option<String>>>,
        delay: Mutex<Duration>,
    }

    async fn kubelet_handler(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> impl IntoResponse {
        state.hits.fetch_add(1, Ordering::SeqCst);
        let auth = headers.get(http::header::AUTHORIZATION).map(|v| v.to_str().unwrap().to_owned());
        state.authorizations.lock().unwrap().push(auth.clone());
        let delay = *state.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if auth.as_deref() == Some("Bearer wrong") {
            return (StatusCode::UNAUTHORIZED, "Unauthorized".to_owned());
        }
        (StatusCode::OK, state.body.lock().unwrap().clone())
    }

    struct MkServer {
        port: u16,
        ca_pem: String,
        state: Arc<ServerState>,
    }

    fn mk_ca() -> (CertifiedIssuer<'static, KeyPair>, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "test kubelet CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = ca.pem();
        (ca, pem)
    }

    async fn mk_server() -> MkServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ca, ca_pem) = mk_ca();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let state = Arc::new(ServerState::default());
        *state.body.lock().unwrap() = FIXTURE.to_owned();
        let router = axum::Router::new()
            .route(RESOURCE_METRICS_PATH, axum::routing::get(kubelet_handler))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        let _ = auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                });
            }
        });
        MkServer { port, ca_pem, state }
    }

    fn mk_client(server: &MkServer, config: KubeletConfig, observer: Arc<MkObserver>) -> KubeletClient {
        let mut inventory = MkInventory::default();
        inventory.nodes.insert("node-a".to_owned(), Arc::new(mk_node(&[("InternalIP", "127.0.0.1")], None)));
        let config = KubeletConfig {
            port: server.port,
            preferred_address_types: vec!["InternalIP".to_owned()],
            request_timeout: Duration::from_secs(5),
            ..config
        };
        KubeletClient::new(config, Arc::new(inventory), observer).unwrap()
    }

    #[tokio::test]
    async fn fetch_sends_the_token_and_verifies_the_kubelet_ca() {
        let server = mk_server().await;
        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let usage = client.node_usage("node-a").await.unwrap();
        assert_eq!(usage.pods.len(), 3);
        let app = &usage.pods[&PodKey { namespace: "shop".into(), name: "web-7d4b9c6f5-x2x4z".into() }][0];
        assert_eq!(app.memory_bytes, Some(134_217_728.0));
        assert_eq!(app.cpu_cores, None);
        assert_eq!(
            *server.state.authorizations.lock().unwrap(),
            vec![Some("Bearer s3cr3t-token".to_owned())]
        );
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "success")]);

        let err = client.node_usage("node-b").await.unwrap_err();
        assert!(matches!(err, KubeletError::NoAddress { .. }), "{err}");
    }

    #[tokio::test]
    async fn another_ca_is_rejected_and_the_error_hides_the_token() {
        let server = mk_server().await;
        let (_, other_ca) = mk_ca();
        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            ca_pem: Some(other_ca.into_bytes()),
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let err = client.node_usage("node-a").await.unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, KubeletError::Request { .. }), "{message}");
        assert!(message.contains("certificate"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 0);
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "unreachable")]);
    }

    #[tokio::test]
    async fn insecure_tls_and_token_file_and_http_errors() {
        let server = mk_server().await;
        let dir = std::env::temp_dir().join(format!("percolator-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "file-token\n").unwrap();
        let config = KubeletConfig {
            insecure_tls: true,
            bearer_token: Some(BearerToken::File(token_file.clone())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        client.node_usage("node-a").await.unwrap();
        assert_eq!(
            server.state.authorizations.lock().unwrap().last().cloned().flatten().as_deref(),
            Some("Bearer file-token")
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            insecure_tls: true,
            bearer_token: Some(BearerToken::Static("wrong".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let message = client.node_usage("node-a").await.unwrap_err().to_string();
        assert!(message.contains("401") && message.contains("Unauthorized"), "{message}");
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "error")]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_one_fetch() {
        let server = mk_server().await;
        *server.state.delay.lock().unwrap() = Duration::from_millis(300);
        let config =
            KubeletConfig { ca_pem: Some(server.ca_pem.clone().into_bytes()), ..KubeletConfig::default() };
        let client = Arc::new(mk_client(&server, config, Arc::new(MkObserver::default())));
        let barrier = Arc::new(tokio::sync::Barrier::new(20));
        let calls: Vec<_> = (0..20)
            .map(|_| {
                let client = Arc::clone(&client);
                let barrier = Arc::clone(&barrier);
                tokio::spawn(async move {
                    barrier.wait().await;
                    client.node_usage("node-a").await
                })
            })
            .collect();
        for call in calls {
            assert_eq!(call.await.unwrap().unwrap().pods.len(), 3);
        }
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn expired_cache_refetches_and_reports_rates() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            cache_ttl: Duration::from_millis(50),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        client.node_usage("node-a").await.unwrap();
        // Ten seconds later the brewer used 2.5 more core-seconds.
        *server.state.body.lock().unwrap() = FIXTURE
            .replace("98.551009 1764496809876", "101.051009 1764496819876")
            .replace("2.5165824e+07 1764496809876", "2.5165824e+07 1764496819876");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let usage = client.node_usage("node-a").await.unwrap();
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 2);
        let pod = PodKey { namespace: "default".into(), name: "espresso-du-matin-5c9f8-qq7tn".into() };
        let brewer = &usage.pods[&pod][0];
        assert!((brewer.cpu_cores.unwrap() - 0.25).abs() < 1e-9, "{brewer:?}");
        assert_eq!(brewer.window_seconds, Some(10.0));
        assert_eq!(brewer.timestamp, Some(ts(1_764_496_819_876)));
        // The other containers' samples did not move: no rate yet.
        let coredns = PodKey { namespace: "kube-system".into(), name: "coredns-76f75df574-8xk2p".into() };
        assert_eq!(usage.pods[&coredns][0].cpu_cores, None);
    }

    #[tokio::test]
    async fn too_many_containers_are_refused() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            max_containers: 1,
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        let message = client.node_usage("node-a").await.unwrap_err().to_string();
        assert!(message.contains("containers, more than the 1 accepted"), "{message}");
    }

    #[tokio::test]
    async fn oversized_body_is_refused() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            max_body_bytes: 1024,
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        let message = client.node_usage("node-a").await.unwrap_err().to_string();
        assert!(message.contains("exceeds 1024 bytes"), "{message}");
    }
}
