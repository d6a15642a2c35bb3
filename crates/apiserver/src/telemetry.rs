//! Own telemetry: the metrics a server exports on `/metrics` as OpenMetrics text (one registry
//! passed down, no globals; label sets as typed structs) and structured logging with
//! Kubernetes-style `-v` levels.
//!
//! Metric names follow `<namespace>_<subsystem>_<name>_<unit>`, the namespace being the
//! server's choice ([`Metrics::new`]); the process metrics keep their usual `process_*` names.
//! A server adds families of its own to the same registry ([`Metrics::register`],
//! [`Metrics::register_collector`]).

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError, Weak};

use openmetrics::metrics::counter::Counter;
use openmetrics::metrics::family::Family;
use openmetrics::metrics::gauge::Gauge;
use openmetrics::metrics::histogram::Histogram;
use openmetrics::registry::{Registry, Unit};

use crate::process::ProcessCollector;

/// Implements `EncodeLabelSet` for a struct of labels, each field a label of its name, in
/// order (what the library's derive does; the derive names the library by its published
/// name, which this crate does not use).
macro_rules! label_set {
    ($($ty:ident { $($field:ident),+ })+) => {$(
        impl openmetrics::encoding::EncodeLabelSet for $ty {
            fn encode(&self, encoder: &mut openmetrics::encoding::LabelSetEncoder<'_>) -> std::fmt::Result {
                use openmetrics::encoding::{EncodeLabelKey, EncodeLabelValue};
                $(
                    let mut label = encoder.encode_label();
                    let mut key = label.encode_label_key()?;
                    EncodeLabelKey::encode(&stringify!($field), &mut key)?;
                    let mut value = key.encode_label_value()?;
                    EncodeLabelValue::encode(&self.$field, &mut value)?;
                    value.finish()?;
                )+
                Ok(())
            }
        }
    )+};
}

label_set! {
    RequestLabels { resource, verb, code }
    LatencyLabels { resource, verb }
    CacheLabels { cache, result }
    UpstreamLabels { source, outcome }
    SourceLabels { source }
    ConnectionLabels { reason }
    SkipLabels { resource, reason }
    FileLabels { file }
    ReloadLabels { file, result }
    ReviewOutcomeLabels { outcome }
    ReviewRefusalLabels { reason }
    StaleDecisionLabels { decision }
    CacheNameLabels { cache }
}

/// Labels of served requests. `resource` is the plural resource name, or the route template
/// for non-resource paths (`/apis`, `/openapi/v2`, …), never a raw path.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct RequestLabels {
    /// Resource or route template.
    pub resource: Cow<'static, str>,
    /// Kubernetes verb (`get`, `list`, `watch`, `create`, …) or the HTTP method lower-cased for
    /// non-resource paths.
    pub verb: &'static str,
    /// HTTP status code.
    pub code: u16,
}

/// Labels of request latency (no code, to bound cardinality).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct LatencyLabels {
    /// Resource or route template.
    pub resource: Cow<'static, str>,
    /// Verb.
    pub verb: &'static str,
}

/// Labels of cache lookups.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct CacheLabels {
    /// Cache name (the plural resource, or the name of an upstream's cache).
    pub cache: Cow<'static, str>,
    /// `hit` or `miss`.
    pub result: &'static str,
}

/// Labels of upstream calls.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct UpstreamLabels {
    /// The upstream, as the server names it.
    pub source: &'static str,
    /// `success` or a short error class (`timeout`, `error`, …).
    pub outcome: &'static str,
}

/// Labels of upstream latency.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct SourceLabels {
    /// The upstream, as the server names it.
    pub source: &'static str,
}

/// Every metric a server exports through this crate.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// Served requests by resource, verb and code.
    pub requests: Family<RequestLabels, Counter>,
    /// Served request latency.
    pub request_duration: Family<LatencyLabels, Histogram, fn() -> Histogram>,
    /// Requests being served now.
    pub in_flight: Gauge,
    /// Cache lookups by cache and result.
    pub cache: Family<CacheLabels, Counter>,
    /// Upstream calls by source and outcome.
    pub upstream: Family<UpstreamLabels, Counter>,
    /// Upstream call latency by source.
    pub upstream_duration: Family<SourceLabels, Histogram, fn() -> Histogram>,
    /// 1 when the server is ready (inventory synced).
    pub ready: Gauge,
    /// Configuration reload attempts by file and result (`success` or `failure`).
    pub config_reloads: Family<ReloadLabels, Counter>,
    /// 1 when the last reload attempt of a file succeeded (or none was needed), 0 when its last
    /// content was rejected.
    pub config_last_reload_successful: Family<FileLabels, Gauge>,
    /// Objects not served, by resource and reason (a declared kind's name label value that is
    /// not a valid object name).
    pub skipped_objects: Family<SkipLabels, Counter>,
    /// `notAfter` of the serving certificate in force (the leaf), in Unix seconds; 0 until one
    /// is loaded, or when it cannot be read.
    pub serving_certificate_expiration: Gauge,
    /// Gauges read when `/metrics` is scraped ([`Sampled`]).
    pub sampled: Sampled,
    /// Client connections open now (TLS handshakes included).
    pub connections: Gauge,
    /// Client connections closed at accept, by limit (`max_connections`,
    /// `max_connections_per_ip`).
    pub connections_rejected: Family<ConnectionLabels, Counter>,
    /// Client connections ended, by reason (`crate::serve::listener`).
    pub connections_closed: Family<ConnectionLabels, Counter>,
    /// HTTP/2 streams reset because their response was not written within `--request-timeout`
    /// plus `--write-timeout`.
    pub stream_write_timeouts: Counter,
    /// The delegated authentication and authorization metrics, once [`Metrics::export_auth`]
    /// is given them.
    auth: Arc<AuthExport>,
    /// The server's own families ([`Metrics::register`]), under the same namespace.
    extra: Mutex<Extra>,
}

/// The families a server registers after the registry is built.
#[derive(Debug)]
struct Extra {
    registry: Registry,
    /// The [`ProbeSum`]s registered by name, to be found again ([`Metrics::probe_sum`]).
    sums: BTreeMap<String, ProbeSum>,
}

/// Labels of the connection counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ConnectionLabels {
    /// Why the connection was refused or ended.
    pub reason: &'static str,
}

/// Labels of objects not served.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct SkipLabels {
    /// The plural resource name.
    pub resource: Cow<'static, str>,
    /// Why the object was not served (`invalid_name`).
    pub reason: &'static str,
}

/// The configuration file a reload read (the server names its files).
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct FileLabels {
    /// Which file.
    pub file: &'static str,
}

/// Labels of configuration reloads.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ReloadLabels {
    /// Which file.
    pub file: &'static str,
    /// `success` or `failure`.
    pub result: &'static str,
}

fn latency_buckets() -> Histogram {
    // From 1 ms to ~16 s: request and upstream latencies both live in that range.
    Histogram::new([0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 16.0])
}

impl Metrics {
    /// Creates and registers every metric, each name prefixed with `namespace_` (a server's
    /// own name: `example` exports `example_requests_total`), and the unprefixed `process_*`
    /// metrics every OpenMetrics client library exports (`process_resident_memory_bytes`, …).
    pub fn new(namespace: &str) -> Arc<Self> {
        let mut m = Self {
            registry: Registry::default(),
            requests: Family::default(),
            request_duration: Family::new_with_constructor(latency_buckets),
            in_flight: Gauge::default(),
            cache: Family::default(),
            upstream: Family::default(),
            upstream_duration: Family::new_with_constructor(latency_buckets),
            ready: Gauge::default(),
            config_reloads: Family::default(),
            config_last_reload_successful: Family::default(),
            skipped_objects: Family::default(),
            serving_certificate_expiration: Gauge::default(),
            sampled: Sampled::default(),
            connections: Gauge::default(),
            connections_rejected: Family::default(),
            connections_closed: Family::default(),
            stream_write_timeouts: Counter::default(),
            auth: Arc::default(),
            extra: Mutex::new(Extra { registry: Registry::with_prefix(namespace), sums: BTreeMap::new() }),
        };
        let r = m.registry.sub_registry_with_prefix(namespace);
        r.register(
            "config_reloads",
            "Configuration reload attempts, by file (config, adapter-config) and result",
            m.config_reloads.clone(),
        );
        r.register(
            "config_last_reload_successful",
            "1 when the last reload attempt of a configuration file succeeded, 0 when its content was rejected",
            m.config_last_reload_successful.clone(),
        );
        r.register("http_requests", "Requests served, by resource, verb and HTTP code", m.requests.clone());
        let help = "Latency of served requests, by resource and verb";
        r.register_with_unit("http_request_duration", help, Unit::Seconds, m.request_duration.clone());
        r.register("http_requests_in_flight", "Requests being served", m.in_flight.clone());
        r.register("cache_requests", "Cache lookups, by cache and result (hit or miss)", m.cache.clone());
        r.register(
            "upstream_requests",
            "Calls to upstream sources, by source and outcome",
            m.upstream.clone(),
        );
        let help = "Latency of calls to upstream sources, by source";
        r.register_with_unit("upstream_request_duration", help, Unit::Seconds, m.upstream_duration.clone());
        r.register("ready", "1 when the server is ready to serve (inventory synced)", m.ready.clone());
        r.register(
            "skipped_objects",
            "Objects not served, by resource and reason",
            m.skipped_objects.clone(),
        );
        r.register_with_unit(
            "tls_serving_certificate_expiration_timestamp",
            "Expiration (notAfter, Unix time) of the serving certificate in force; 0 when unknown",
            Unit::Seconds,
            m.serving_certificate_expiration.clone(),
        );
        m.sampled.register(r);
        r.register(
            "http_connections",
            "Client connections open (TLS handshakes included)",
            m.connections.clone(),
        );
        r.register(
            "http_connections_rejected",
            "Client connections closed at accept, by limit (max_connections, max_connections_per_ip)",
            m.connections_rejected.clone(),
        );
        r.register(
            "http_connections_closed",
            "Client connections ended, by reason (closed, idle_timeout, write_timeout, ping_timeout, header_timeout, handshake_timeout, handshake_error, error, shutdown)",
            m.connections_closed.clone(),
        );
        r.register(
            "http2_stream_write_timeouts",
            "HTTP/2 streams reset because their response was not written within --request-timeout plus --write-timeout",
            m.stream_write_timeouts.clone(),
        );
        r.register_collector(Box::new(Arc::clone(&m.auth)));
        // Unprefixed, under the names every client library gives them.
        m.registry.register_collector(Box::new(ProcessCollector));
        Arc::new(m)
    }

    /// The registry in the OpenMetrics text format: this crate's families, then the server's.
    pub fn encode(&self) -> String {
        self.sampled.refresh();
        let mut out = String::new();
        // Encoding into a String cannot fail.
        let _ = openmetrics::encoding::text::encode_registry(&mut out, &self.registry);
        let _ = openmetrics::encoding::text::encode_registry(&mut out, &self.lock_extra().registry);
        let _ = openmetrics::encoding::text::encode_eof(&mut out);
        out
    }

    fn lock_extra(&self) -> std::sync::MutexGuard<'_, Extra> {
        self.extra.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a family of the server's own as `<namespace>_<name>` (a counter's `_total`
    /// added), exported with the rest from now on.
    pub fn register(&self, name: &str, help: &str, metric: impl openmetrics::registry::Metric) {
        self.lock_extra().registry.register(name, help, metric);
    }

    /// Registers a collector of the server's own, whose families are named under the
    /// namespace, encoded at every scrape.
    pub fn register_collector(&self, collector: Box<dyn openmetrics::collector::Collector>) {
        self.lock_extra().registry.register_collector(collector);
    }

    /// The [`ProbeSum`] gauge `<namespace>_<name>`: registered with `help` on the first call,
    /// the same one afterwards (clones share their probes).
    pub fn probe_sum(&self, name: &str, help: &str) -> ProbeSum {
        let mut extra = self.lock_extra();
        if let Some(sum) = extra.sums.get(name) {
            return sum.clone();
        }
        let sum = ProbeSum::default();
        extra.registry.register(name, help, sum.clone());
        extra.sums.insert(name.to_owned(), sum.clone());
        sum
    }

    /// Records one reload attempt of `file`.
    pub fn config_reload(&self, file: &'static str, applied: bool) {
        let result = if applied { "success" } else { "failure" };
        self.config_reloads.get_or_create(&ReloadLabels { file, result }).inc();
        self.config_last_reload_successful.get_or_create(&FileLabels { file }).set(i64::from(applied));
    }

    /// Records that `file` was read at start: its last reload is successful until one fails.
    pub fn config_loaded(&self, file: &'static str) {
        self.config_last_reload_successful.get_or_create(&FileLabels { file }).set(1);
    }

    /// Records the `notAfter` (Unix seconds) of the serving certificate now in force, `None`
    /// when it could not be read (the gauge then reads 0, which the alert rules ignore, rather
    /// than keeping the date of a certificate no longer served).
    pub fn serving_certificate_expires(&self, not_after: Option<u64>) {
        let seconds = not_after.map_or(0, |t| i64::try_from(t).unwrap_or(i64::MAX));
        self.serving_certificate_expiration.set(seconds);
    }

    /// Records one cache lookup.
    #[expect(clippy::ptr_arg, reason = "cloning the Cow keeps a borrowed plural borrowed: no allocation")]
    pub fn cache_lookup(&self, cache: &Cow<'static, str>, hit: bool) {
        self.cache
            .get_or_create(&CacheLabels { cache: cache.clone(), result: if hit { "hit" } else { "miss" } })
            .inc();
    }

    /// Records one object of `resource` not served, for `reason` (`invalid_name`).
    #[expect(clippy::ptr_arg, reason = "cloning the Cow keeps a borrowed plural borrowed: no allocation")]
    pub fn skipped_object(&self, resource: &Cow<'static, str>, reason: &'static str) {
        self.skipped_objects.get_or_create(&SkipLabels { resource: resource.clone(), reason }).inc();
    }
}

impl UpstreamObserver for Metrics {
    fn observe(&self, source: &'static str, outcome: &'static str, seconds: f64) {
        self.upstream.get_or_create(&UpstreamLabels { source, outcome }).inc();
        self.upstream_duration.get_or_create(&SourceLabels { source }).observe(seconds);
    }
}

/// Labels of the reviews sent to kube-apiserver: one per request, retries included.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ReviewOutcomeLabels {
    /// `success` (answered), `throttled` (kube-apiserver answered 429), `error` (another
    /// answered error) or `unreachable` (no connection, no answer within the budget, or 5xx).
    pub outcome: &'static str,
}

/// Labels of the reviews not made because of a bound.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct ReviewRefusalLabels {
    /// `inflight` (the kind's outstanding reviews at their bound), `per_client` (the client's
    /// share of them taken), `rate` (no token of the rate limit in time) or `apiserver`
    /// (kube-apiserver still answered 429 at the end of the review's budget).
    pub reason: &'static str,
}

/// Labels of the authorization decisions served stale.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub struct StaleDecisionLabels {
    /// `allowed` or `denied`.
    pub decision: &'static str,
}

/// The metrics of one kind of delegated review (TokenReview or SubjectAccessReview). Clones
/// share their values.
#[derive(Clone, Debug, Default)]
pub struct ReviewMetrics {
    /// Requests sent to kube-apiserver, by outcome.
    pub sent: Family<ReviewOutcomeLabels, Counter>,
    /// Reviews not made (the request answered 429), by reason.
    pub refused: Family<ReviewRefusalLabels, Counter>,
    /// Reviews outstanding: waiting for the rate limit or sent and not yet answered.
    pub in_flight: Gauge,
    /// Reviews dropped because no request waited for them any more.
    pub cancelled: Counter,
}

/// The metrics of delegated authentication and authorization, owned by the authenticator
/// from its start and exported by [`Metrics::export_auth`]. Clones share their values.
#[derive(Clone, Debug, Default)]
pub struct AuthMetrics {
    /// TokenReviews.
    pub token_reviews: ReviewMetrics,
    /// SubjectAccessReviews.
    pub access_reviews: ReviewMetrics,
    /// Authorization decisions served stale while kube-apiserver was unreachable, by decision.
    pub stale_decisions: Family<StaleDecisionLabels, Counter>,
    /// 1 while kube-apiserver is taken as unreachable for SubjectAccessReviews (the
    /// stale-if-error state), else 0.
    pub authorizer_unreachable: Gauge,
    /// 1 while the trust ConfigMap (`kube-system/extension-apiserver-authentication`) is read
    /// from the cluster and missing (the last good trust stays in force), else 0.
    pub trust_configmap_missing: Gauge,
}

/// The [`AuthMetrics`] given to [`Metrics::export_auth`], encoded with the registry's metrics
/// (their families exist before the registry does: the authenticator starts first).
#[derive(Debug, Default)]
struct AuthExport(Mutex<Option<AuthMetrics>>);

impl openmetrics::collector::Collector for AuthExport {
    fn encode(&self, mut encoder: openmetrics::encoding::DescriptorEncoder) -> std::fmt::Result {
        use openmetrics::encoding::EncodeMetric;
        let Some(auth) = self.0.lock().unwrap_or_else(PoisonError::into_inner).clone() else {
            return Ok(());
        };
        let mut families: Vec<(String, String, &dyn EncodeMetric)> = Vec::new();
        for (subsystem, kind, reviews) in [
            ("authentication_token_reviews", "TokenReview", &auth.token_reviews),
            ("authorization_subject_access_reviews", "SubjectAccessReview", &auth.access_reviews),
        ] {
            families.extend([
                (
                    subsystem.to_owned(),
                    format!("{kind} requests sent to kube-apiserver, retries included, by outcome (success, throttled: answered 429, error, unreachable)"),
                    &reviews.sent as &dyn EncodeMetric,
                ),
                (
                    format!("{subsystem}_refused"),
                    format!("{kind}s not made, the request answered 429, by reason (inflight, per_client, rate, apiserver)"),
                    &reviews.refused,
                ),
                (
                    format!("{subsystem}_in_flight"),
                    format!("{kind}s outstanding: waiting for the rate limit or sent and not yet answered"),
                    &reviews.in_flight,
                ),
                (
                    format!("{subsystem}_cancelled"),
                    format!("{kind}s dropped because no request waited for them any more"),
                    &reviews.cancelled,
                ),
            ]);
        }
        families.extend([
            (
                "authorization_stale_decisions".to_owned(),
                "Authorization decisions served stale (stale-if-error) while kube-apiserver was unreachable, by decision".to_owned(),
                &auth.stale_decisions as &dyn EncodeMetric,
            ),
            (
                "authorization_webhook_unreachable".to_owned(),
                "1 while kube-apiserver is taken as unreachable for SubjectAccessReviews (stale-if-error in force), else 0".to_owned(),
                &auth.authorizer_unreachable,
            ),
            (
                "authentication_trust_configmap_missing".to_owned(),
                "1 while the ConfigMap kube-system/extension-apiserver-authentication is missing (the last good trust stays in force), else 0".to_owned(),
                &auth.trust_configmap_missing,
            ),
        ]);
        for (name, help, metric) in families {
            metric.encode(encoder.encode_descriptor(&name, &help, None, metric.metric_type())?)?;
        }
        Ok(())
    }
}

impl Metrics {
    /// Exports the authenticator's metrics (`apiserver::Auth::metrics`) under this registry's
    /// namespace from now on: `<namespace>_authentication_*`, `<namespace>_authorization_*`.
    pub fn export_auth(&self, auth: &AuthMetrics) {
        *self.auth.0.lock().unwrap_or_else(PoisonError::into_inner) = Some(auth.clone());
    }
}

/// A value read at scrape time, e.g. a cache's entry count. Its owner keeps the `Arc`; the
/// metrics keep a `Weak`, so a dropped owner (a cache replaced by a reload) stops counting.
pub type Probe = dyn Fn() -> u64 + Send + Sync;

/// A gauge read when `/metrics` is scraped: the sum of what its live probes report (e.g. the
/// idle connections of every pool of an upstream). Clones share their probes.
#[derive(Clone, Default)]
pub struct ProbeSum(Arc<Mutex<Vec<Weak<Probe>>>>);

impl std::fmt::Debug for ProbeSum {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("ProbeSum").field(&self.sum()).finish()
    }
}

impl ProbeSum {
    /// Adds what `probe` reports while it lives.
    pub fn add(&self, probe: &Arc<Probe>) {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).push(Arc::downgrade(probe));
    }

    /// The sum of the live probes (dropped ones are forgotten).
    pub fn sum(&self) -> u64 {
        let mut sum = 0;
        self.0
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|p| p.upgrade().map(|p| sum += p()).is_some());
        sum
    }
}

impl openmetrics::encoding::EncodeMetric for ProbeSum {
    fn encode(&self, mut encoder: openmetrics::encoding::MetricEncoder<'_>) -> std::fmt::Result {
        encoder.encode_gauge(&gauge_value(self.sum()))
    }

    fn metric_type(&self) -> openmetrics::metrics::MetricType {
        openmetrics::metrics::MetricType::Gauge
    }
}

/// Labels of the cache entry gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq)]
pub(crate) struct CacheNameLabels {
    /// Cache name (as in [`CacheLabels`]).
    pub cache: Cow<'static, str>,
}

/// Gauges read when `/metrics` is scraped: the tokio runtime's (tasks alive, workers, global
/// queue depth: stable and cheap, a few atomic loads) and the entries of every TTL cache. What
/// grows over hours shows here (RELIABILITY.md, "Soak").
#[derive(Default)]
pub struct Sampled {
    tasks_alive: Gauge,
    workers: Gauge,
    global_queue_depth: Gauge,
    cache_entries: Family<CacheNameLabels, Gauge>,
    probes: Mutex<Probes>,
}

#[derive(Default)]
struct Probes {
    caches: Vec<(Cow<'static, str>, Weak<Probe>)>,
    tasks: Vec<Weak<Probe>>,
}

impl std::fmt::Debug for Sampled {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sampled").finish_non_exhaustive()
    }
}

fn gauge_value(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Sampled {
    fn register(&self, r: &mut Registry) {
        let tasks = "Tasks alive in the tokio runtimes (spawned, not yet finished)";
        r.register("tokio_tasks_alive", tasks, self.tasks_alive.clone());
        r.register("tokio_workers", "Worker threads of the tokio runtime", self.workers.clone());
        let queue = "Tasks waiting in the tokio runtime's global queue";
        r.register("tokio_global_queue_depth", queue, self.global_queue_depth.clone());
        let entries = "Entries held by each TTL cache (approximate: expired entries leave on the cache's next maintenance)";
        r.register("cache_entries", entries, self.cache_entries.clone());
    }

    /// Counts the entries of cache `cache` while `probe` lives (caches of one name add up).
    pub fn cache_entries(&self, cache: Cow<'static, str>, probe: &Arc<Probe>) {
        self.lock().caches.push((cache, Arc::downgrade(probe)));
    }

    /// Adds the tasks alive `probe` reports (a runtime of its own, on a thread of its own) to
    /// the main runtime's while it lives.
    pub fn runtime_tasks(&self, probe: &Arc<Probe>) {
        self.lock().tasks.push(Arc::downgrade(probe));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Probes> {
        self.probes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Reads the runtime and every live probe into the gauges.
    fn refresh(&self) {
        let mut probes = self.lock();
        let mut tasks = 0;
        probes.tasks.retain(|probe| probe.upgrade().map(|p| tasks += p()).is_some());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            let runtime = handle.metrics();
            tasks += runtime.num_alive_tasks() as u64;
            self.workers.set(gauge_value(runtime.num_workers() as u64));
            self.global_queue_depth.set(gauge_value(runtime.global_queue_depth() as u64));
        }
        self.tasks_alive.set(gauge_value(tasks));
        // A name whose caches are all gone reads 0 rather than its last count.
        let mut entries: BTreeMap<Cow<'static, str>, u64> = BTreeMap::new();
        probes.caches.retain(|(name, probe)| {
            let count = entries.entry(name.clone()).or_default();
            probe.upgrade().map(|p| *count += p()).is_some()
        });
        for (cache, count) in entries {
            self.cache_entries.get_or_create(&CacheNameLabels { cache }).set(gauge_value(count));
        }
    }
}

/// Initialises logging: JSON lines on stderr; `verbosity` maps Kubernetes `-v` levels onto
/// tracing levels (0 warn, 1-2 info, 3-4 debug, 5+ trace) for the server's own crates (`own`,
/// plus this crate and `k8s_wire`); other dependencies log warnings and errors only, unless
/// tracing. `RUST_LOG` overrides it.
pub fn init_logging(verbosity: u8, own: &[&str]) {
    let level = match verbosity {
        0 => "warn",
        1 | 2 => "info",
        3 | 4 => "debug",
        _ => "trace",
    };
    let default = if verbosity >= 5 {
        level.to_string()
    } else {
        let crates = own.iter().copied().chain(["apiserver", "k8s_wire"]);
        std::iter::once("warn".to_owned())
            .chain(crates.map(|c| format!("{c}={level}")))
            .collect::<Vec<_>>()
            .join(",")
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_current_span(false)
        .try_init();
}

/// Records the latency and outcome of every upstream call (fetches, queries), so
/// the server can export them as its own metrics without the sources knowing the registry.
pub trait UpstreamObserver: Send + Sync {
    /// One finished call: `source` names the upstream (a small fixed set), `outcome` one of the
    /// [`outcome`] constants, `seconds` the wall time of the call.
    fn observe(&self, source: &'static str, outcome: &'static str, seconds: f64);
}

/// An [`UpstreamObserver`] that records nothing.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoopObserver;

impl UpstreamObserver for NoopObserver {
    fn observe(&self, _source: &'static str, _outcome: &'static str, _seconds: f64) {}
}

/// The `outcome` values passed to [`UpstreamObserver::observe`] (a small closed set, so they
/// can be metric label values).
pub mod outcome {
    /// The call succeeded.
    pub const SUCCESS: &str = "success";
    /// The call did not finish within its timeout.
    pub const TIMEOUT: &str = "timeout";
    /// The upstream answered with an error (HTTP status, query error, scrape error) or
    /// an unusable body.
    pub const ERROR: &str = "error";
    /// The upstream could not be reached (connection, TLS, DNS).
    pub const UNREACHABLE: &str = "unreachable";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_named_metrics() {
        let metrics = Metrics::new("example");
        metrics.cache_lookup(&"podmetricssummaries".into(), true);
        metrics.observe("upstream", "success", 0.01);
        let text = metrics.encode();
        assert!(
            text.contains("example_cache_requests_total{cache=\"podmetricssummaries\",result=\"hit\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("example_upstream_requests_total{source=\"upstream\",outcome=\"success\"} 1"),
            "{text}"
        );
        assert!(text.contains("example_upstream_request_duration_seconds_bucket"), "{text}");
        // The process metrics keep their usual names, with this process' values.
        #[cfg(target_os = "linux")]
        {
            let fds = std::fs::read_dir("/proc/self/fd").unwrap().count() as f64;
            let exported: f64 = value(&text, "process_open_fds").unwrap().parse().unwrap();
            // The directory listing held one descriptor of its own.
            assert!((exported - fds).abs() <= 2.0, "{exported} vs {fds}\n{text}");
            for name in ["process_resident_memory_bytes", "process_start_time_seconds", "process_threads"] {
                let v: f64 = value(&text, name).unwrap_or_else(|| panic!("{name}\n{text}")).parse().unwrap();
                assert!(v > 0.0, "{name} {v}");
            }
            let cpu: f64 = value(&text, "process_cpu_seconds_total").unwrap().parse().unwrap();
            assert!(cpu >= 0.0, "{text}");
            assert!(!text.contains("example_process_"), "{text}");
        }
    }

    fn value(text: &str, series: &str) -> Option<String> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ').map(str::to_owned))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn sampled_gauges_read_the_runtime_and_live_probes_at_scrape_time() {
        let metrics = Metrics::new("example");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let _ = stopped.await;
        });
        let text = metrics.encode();
        let alive: i64 = value(&text, "example_tokio_tasks_alive").unwrap().parse().unwrap();
        assert!(alive >= 1, "the spawned task is alive: {text}");
        assert_eq!(value(&text, "example_tokio_workers").as_deref(), Some("2"));
        let _ = stop.send(());
        task.await.unwrap();
        // The join handle wakes before the worker releases the finished task from the runtime's
        // list, so the count drops a moment after `await` returns: wait for it, within a second.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(1);
        let after = loop {
            let now: i64 = value(&metrics.encode(), "example_tokio_tasks_alive").unwrap().parse().unwrap();
            if now == alive - 1 || std::time::Instant::now() > deadline {
                break now;
            }
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        };
        assert_eq!(after, alive - 1, "the finished task is no longer counted");

        // Another runtime's tasks add to the main runtime's while its probe lives.
        let other: Arc<Probe> = Arc::new(|| 10);
        metrics.sampled.runtime_tasks(&other);
        let with: i64 = value(&metrics.encode(), "example_tokio_tasks_alive").unwrap().parse().unwrap();
        drop(other);
        let without: i64 = value(&metrics.encode(), "example_tokio_tasks_alive").unwrap().parse().unwrap();
        assert_eq!(with - without, 10);

        let a: Arc<Probe> = Arc::new(|| 3);
        let b: Arc<Probe> = Arc::new(|| 4);
        metrics.sampled.cache_entries("nodes".into(), &a);
        metrics.sampled.cache_entries("nodes".into(), &b);
        // A server's own gauge of probes, found again by name.
        let parked: Arc<Probe> = Arc::new(|| 5);
        metrics.probe_sum("pool_connections_idle", "Idle connections").add(&parked);
        let other: Arc<Probe> = Arc::new(|| 1);
        metrics.probe_sum("pool_connections_idle", "ignored: registered already").add(&other);
        let text = metrics.encode();
        assert_eq!(value(&text, "example_cache_entries{cache=\"nodes\"}").as_deref(), Some("7"));
        assert_eq!(value(&text, "example_pool_connections_idle").as_deref(), Some("6"));
        assert!(text.contains("# HELP example_pool_connections_idle Idle connections.\n"), "{text}");
        assert!(text.ends_with("# EOF\n"), "one end, after the server's families: {text}");
        drop((a, parked));
        let text = metrics.encode();
        assert_eq!(value(&text, "example_cache_entries{cache=\"nodes\"}").as_deref(), Some("4"));
        assert_eq!(value(&text, "example_pool_connections_idle").as_deref(), Some("1"));
        drop((b, other));
        let text = metrics.encode();
        assert_eq!(value(&text, "example_cache_entries{cache=\"nodes\"}").as_deref(), Some("0"));
        assert_eq!(value(&text, "example_pool_connections_idle").as_deref(), Some("0"));
    }

    #[test]
    fn serving_certificate_expiration_is_a_timestamp_gauge() {
        let metrics = Metrics::new("example");
        let line = |text: &str| {
            text.lines()
                .find(|l| l.starts_with("example_tls_serving_certificate_expiration_timestamp_seconds "))
                .map(str::to_owned)
        };
        let name = "example_tls_serving_certificate_expiration_timestamp_seconds";
        assert_eq!(line(&metrics.encode()).as_deref(), Some(format!("{name} 0").as_str()));
        assert!(metrics.encode().contains(&format!("# TYPE {name} gauge")));
        // 2031-01-02T00:00:00Z
        metrics.serving_certificate_expires(Some(1_925_078_400));
        assert_eq!(line(&metrics.encode()).as_deref(), Some(format!("{name} 1925078400").as_str()));
        metrics.serving_certificate_expires(None);
        assert_eq!(line(&metrics.encode()).as_deref(), Some(format!("{name} 0").as_str()));
    }
}
