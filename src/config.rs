//! Configuration: command-line flags (spelled as metrics-server and the generic Kubernetes API
//! server spell them) and the YAML query file (`--config`) with compiled-in defaults.
//!
//! Every bad flag or file fails at start with a message naming the flag or field.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser};
use serde::Deserialize;

use crate::duration;
use crate::sources::prometheus::{is_valid_label_name, validate_template};

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("--config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed or has unknown fields.
    #[error("--config {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What serde said (names the field and position).
        message: String,
    },
    /// A field has an invalid value.
    #[error("--config {path}: field {field}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// The field path, e.g. `podMetricsSummary.requests`.
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// Result alias for this module.
pub type Result<T> = std::result::Result<T, ConfigError>;

/// All flags of the `percolator` binary.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "percolator",
    version,
    about = "Read-only Kubernetes aggregated API for live pod and cafe metrics"
)]
pub struct Args {
    /// Serving (HTTPS listener and certificates).
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Cluster access.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Kubelet scraping.
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    /// Prometheus and the query configuration.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// Delegated authentication and authorization.
    #[command(flatten)]
    pub auth: crate::auth::AuthArgs,
    /// The opt-in external metrics API.
    #[command(flatten)]
    pub external_metrics: ExternalMetricsArgs,
    /// Log verbosity, as Kubernetes components count it: 0 warnings and errors, 1-2 info,
    /// 3-4 debug, 5+ trace.
    #[arg(short = 'v', long = "v", default_value_t = 1, env = "PERCOLATOR_V")]
    pub verbosity: u8,
}

/// Flags of the HTTPS listener.
#[derive(Debug, Clone, ClapArgs)]
pub struct ServingArgs {
    /// Port of the HTTPS listener (0 picks a free port and logs it).
    #[arg(long, default_value_t = 10250, env = "PERCOLATOR_SECURE_PORT")]
    pub secure_port: u16,
    /// Address of the HTTPS listener.
    #[arg(long, default_value = "0.0.0.0", env = "PERCOLATOR_BIND_ADDRESS")]
    pub bind_address: std::net::IpAddr,
    /// Directory where the self-signed serving certificate is written when --tls-cert-file is
    /// not given.
    #[arg(long, default_value = "apiserver.local.config/certificates", env = "PERCOLATOR_CERT_DIR")]
    pub cert_dir: PathBuf,
    /// PEM serving certificate (with intermediates). Requires --tls-private-key-file.
    #[arg(long, requires = "tls_private_key_file", env = "PERCOLATOR_TLS_CERT_FILE")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file", env = "PERCOLATOR_TLS_PRIVATE_KEY_FILE")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13.
    #[arg(long, default_value = "VersionTLS12", value_parser = ["VersionTLS12", "VersionTLS13"], env = "PERCOLATOR_TLS_MIN_VERSION")]
    pub tls_min_version: String,
    /// Maximum concurrent HTTP/2 streams per connection (kube-apiserver multiplexes every
    /// proxied request over one connection).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(100..), env = "PERCOLATOR_HTTP2_MAX_STREAMS_PER_CONNECTION")]
    pub http2_max_streams_per_connection: u32,
    /// Maximum number of requests served at once (kube-apiserver's flag). Beyond it requests
    /// are answered at once with 429 TooManyRequests and Retry-After: 1 instead of queueing.
    /// Health, discovery, OpenAPI, /version and /metrics are exempt: they are precomputed,
    /// cheap, and must keep answering under overload. 0 disables the limit.
    #[arg(long, default_value_t = 400, env = "PERCOLATOR_MAX_REQUESTS_INFLIGHT")]
    pub max_requests_inflight: u32,
    /// Longest time a request may take (kube-apiserver's flag, e.g. 60s); a request still
    /// running then is answered 504 Timeout. A request's `?timeout=` can only shorten it.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration, env = "PERCOLATOR_REQUEST_TIMEOUT")]
    pub request_timeout: Duration,
    /// After SIGTERM, how long /readyz fails while requests are still served normally, so that
    /// endpoints and load balancers stop sending traffic before the listener closes
    /// (kube-apiserver's flag). In-flight requests are then drained. A second signal skips it.
    #[arg(long, default_value = "5s", value_parser = duration::parse, env = "PERCOLATOR_SHUTDOWN_DELAY_DURATION")]
    pub shutdown_delay_duration: Duration,
    /// How often --tls-cert-file and --tls-private-key-file (or the self-signed pair in
    /// --cert-dir) are checked for changes; a changed pair is served to new connections
    /// without a restart.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration, env = "PERCOLATOR_TLS_RELOAD_INTERVAL")]
    pub tls_reload_interval: Duration,
}

/// A duration flag that must be greater than zero.
fn parse_positive_duration(text: &str) -> std::result::Result<Duration, String> {
    match duration::parse(text) {
        Ok(d) if d.is_zero() => Err("must be greater than 0".to_owned()),
        Ok(d) => Ok(d),
        Err(e) => Err(e.to_string()),
    }
}

/// Flags of cluster access.
#[derive(Debug, Clone, ClapArgs)]
pub struct ClusterArgs {
    /// kubeconfig used to watch pods and nodes; in-cluster configuration when unset.
    #[arg(long, env = "PERCOLATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Flags of kubelet scraping.
#[derive(Debug, Clone, ClapArgs)]
pub struct KubeletArgs {
    /// Port of the kubelets' HTTPS endpoint.
    #[arg(long, default_value_t = 10250, env = "PERCOLATOR_KUBELET_PORT")]
    pub kubelet_port: u16,
    /// Use the port in node.status.daemonEndpoints.kubeletEndpoint instead of --kubelet-port.
    #[arg(long, env = "PERCOLATOR_KUBELET_USE_NODE_STATUS_PORT")]
    pub kubelet_use_node_status_port: bool,
    /// Do not verify the kubelets' serving certificates (for clusters with self-signed kubelet
    /// certificates; prefer --kubelet-certificate-authority).
    #[arg(long, env = "PERCOLATOR_KUBELET_INSECURE_TLS")]
    pub kubelet_insecure_tls: bool,
    /// CA bundle (PEM) that signs the kubelets' serving certificates; the cluster CA of the
    /// kubeconfig when unset.
    #[arg(long, env = "PERCOLATOR_KUBELET_CERTIFICATE_AUTHORITY")]
    pub kubelet_certificate_authority: Option<PathBuf>,
    /// Node address types to try, in order.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP",
        env = "PERCOLATOR_KUBELET_PREFERRED_ADDRESS_TYPES"
    )]
    pub kubelet_preferred_address_types: Vec<String>,
    /// Timeout of one kubelet request (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_KUBELET_REQUEST_TIMEOUT")]
    pub kubelet_request_timeout: Duration,
}

/// Flags of Prometheus and caching.
#[derive(Debug, Clone, ClapArgs)]
pub struct PrometheusArgs {
    /// Base URL of the Prometheus HTTP API.
    #[arg(long, default_value = "http://localhost:9090", env = "PERCOLATOR_PROMETHEUS_URL")]
    pub prometheus_url: url::Url,
    /// Timeout of one PromQL query (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_PROMETHEUS_TIMEOUT")]
    pub prometheus_timeout: Duration,
    /// How long computed objects are cached (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = duration::parse, env = "PERCOLATOR_CACHE_TTL")]
    pub cache_ttl: Duration,
    /// Range the Prometheus rates are computed over (e.g. 5m); overrides the file's `window`.
    #[arg(long, value_parser = duration::parse, env = "PERCOLATOR_WINDOW")]
    pub window: Option<Duration>,
    /// YAML file with the PromQL of each field; compiled-in defaults when unset.
    #[arg(long, env = "PERCOLATOR_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Flags of the external metrics API (`external.metrics.k8s.io/v1beta1`).
#[derive(Debug, Clone, ClapArgs)]
pub struct ExternalMetricsArgs {
    /// Serve and advertise external.metrics.k8s.io/v1beta1 (HPA external metrics) with the
    /// `externalMetrics` of --config. Only one server per cluster may own that group (KEDA and
    /// prometheus-adapter claim it too), so it is off by default.
    #[arg(long, env = "PERCOLATOR_ENABLE_EXTERNAL_METRICS")]
    pub enable_external_metrics: bool,
}

/// Default range of rates.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The query configuration file (`--config`).
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct QueryConfig {
    /// Range the rates are computed over (Go duration); `--window` overrides it.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
    /// PromQL of the PodMetricsSummary fields.
    #[serde(default)]
    pub pod_metrics_summary: PodMetricsQueries,
    /// PromQL of the CafeBrewStats fields.
    #[serde(default)]
    pub cafe_brew_stats: CafeQueries,
    /// The metrics of `external.metrics.k8s.io/v1beta1` (served with
    /// `--enable-external-metrics`); [`default_external_metrics`] when the key is absent. Never
    /// empty: an empty resource list makes every kubectl discovery report an error.
    #[serde(default = "default_external_metrics")]
    pub external_metrics: Vec<ExternalMetricConfig>,
}

impl Default for QueryConfig {
    fn default() -> Self {
        Self {
            window: None,
            pod_metrics_summary: PodMetricsQueries::default(),
            cafe_brew_stats: CafeQueries::default(),
            external_metrics: default_external_metrics(),
        }
    }
}

/// One external metric: `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/<name>`
/// runs `query` with `SCOPE` = `namespace="NS"` plus the request's label selector, which may
/// only name the `labels` listed here.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExternalMetricConfig {
    /// Metric name, the resource of its URL: lowercase letters, digits, `_`, `.` and `-`.
    pub name: String,
    /// PromQL template (`SCOPE`, `WINDOW` placeholders as for the other queries). Each series
    /// of the result becomes one item; its labels are the item's `metricLabels`.
    pub query: String,
    /// Labels a selector may constrain (Prometheus label names, never `namespace`): each
    /// requirement becomes a matcher in `SCOPE`. A selector on any other label is a 400.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Range of this metric's rates (Go duration); the configuration's window when unset.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
}

/// Names a metric may not take: they are namespace subresources in a Kubernetes URL
/// (`/namespaces/NS/status`), so requests for them would be authorized as such.
const RESERVED_METRIC_NAMES: [&str; 4] = [".", "..", "status", "finalize"];

fn external(name: &str, query: &str, labels: &[&str]) -> ExternalMetricConfig {
    ExternalMetricConfig {
        name: name.to_owned(),
        query: query.to_owned(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        window: None,
    }
}

/// The compiled-in external metrics: `cafe_brews_per_minute`, `cafe_brew_duration_p95_seconds`,
/// `http_requests_per_second` and `http_error_ratio`.
pub fn default_external_metrics() -> Vec<ExternalMetricConfig> {
    vec![
        external(
            "cafe_brews_per_minute",
            "sum by (namespace, cafe, type) (rate(cafe_brews_total{SCOPE}[WINDOW])) * 60",
            &["cafe", "type"],
        ),
        external(
            "cafe_brew_duration_p95_seconds",
            "histogram_quantile(0.95, sum by (namespace, cafe, type, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
            &["cafe", "type"],
        ),
        external(
            "http_requests_per_second",
            "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
            &["pod", "code"],
        ),
        external(
            "http_error_ratio",
            "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW])) / sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
            &["pod"],
        ),
    ]
}

/// PromQL templates of PodMetricsSummary. `SCOPE` stands for the namespace matcher (empty
/// across all namespaces) and `WINDOW` for the range; results must keep the `namespace` and
/// `pod` labels.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodMetricsQueries {
    /// Requests per second per pod.
    #[serde(default = "default_requests")]
    pub requests: String,
    /// Error responses per second per pod.
    #[serde(default = "default_errors")]
    pub errors: String,
}

impl Default for PodMetricsQueries {
    fn default() -> Self {
        Self { requests: default_requests(), errors: default_errors() }
    }
}

fn default_requests() -> String {
    "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))".to_string()
}

fn default_errors() -> String {
    "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))".to_string()
}

/// PromQL templates of CafeBrewStats (same placeholders). Results must keep the `namespace`
/// and `cafe` labels; `brews` also keeps `type`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CafeQueries {
    /// Completed brews in the window, per cafe and type.
    #[serde(default = "default_brews")]
    pub brews: String,
    /// Failed brews in the window, per cafe.
    #[serde(default = "default_failures")]
    pub failures: String,
    /// Median brew time in seconds, per cafe.
    #[serde(default = "default_p50")]
    pub p50: String,
    /// 95th percentile brew time in seconds, per cafe.
    #[serde(default = "default_p95")]
    pub p95: String,
    /// 99th percentile brew time in seconds, per cafe.
    #[serde(default = "default_p99")]
    pub p99: String,
    /// Current temperature in °C, per cafe.
    #[serde(default = "default_temperature")]
    pub temperature: String,
    /// Unix time of the last completed brew, per cafe.
    #[serde(default = "default_last_brewed")]
    pub last_brewed: String,
}

impl Default for CafeQueries {
    fn default() -> Self {
        Self {
            brews: default_brews(),
            failures: default_failures(),
            p50: default_p50(),
            p95: default_p95(),
            p99: default_p99(),
            temperature: default_temperature(),
            last_brewed: default_last_brewed(),
        }
    }
}

fn default_brews() -> String {
    "sum by (namespace, cafe, type) (increase(cafe_brews_total{SCOPE}[WINDOW]))".to_string()
}

fn default_failures() -> String {
    "sum by (namespace, cafe) (increase(cafe_brew_failures_total{SCOPE}[WINDOW]))".to_string()
}

fn quantile(q: &str) -> String {
    format!(
        "histogram_quantile({q}, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{{SCOPE}}[WINDOW])))"
    )
}

fn default_p50() -> String {
    quantile("0.5")
}

fn default_p95() -> String {
    quantile("0.95")
}

fn default_p99() -> String {
    quantile("0.99")
}

fn default_temperature() -> String {
    "max by (namespace, cafe) (cafe_temperature_celsius{SCOPE})".to_string()
}

fn default_last_brewed() -> String {
    "max by (namespace, cafe) (cafe_last_brew_timestamp_seconds{SCOPE})".to_string()
}

fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    let text: Option<String> = Option::deserialize(d)?;
    text.map(|t| duration::parse(&t).map_err(serde::de::Error::custom)).transpose()
}

impl QueryConfig {
    /// Parses and validates a configuration document; `path` only names it in errors.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self> {
        let config: QueryConfig = if text.trim().is_empty() {
            QueryConfig::default()
        } else {
            serde_yaml::from_str(text)
                .map_err(|e| ConfigError::Parse { path: path.to_string(), message: e.to_string() })?
        };
        config.validate(path)?;
        Ok(config)
    }

    /// Reads `path`, or returns the defaults when `None`.
    pub fn load(path: Option<&Path>) -> Result<Self> {
        match path {
            None => Ok(Self::default()),
            Some(p) => {
                let shown = p.display().to_string();
                let text = std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
                Self::from_yaml(&text, &shown)
            }
        }
    }

    fn validate(&self, path: &str) -> Result<()> {
        let cafe = &self.cafe_brew_stats;
        let fields = [
            ("podMetricsSummary.requests", &self.pod_metrics_summary.requests),
            ("podMetricsSummary.errors", &self.pod_metrics_summary.errors),
            ("cafeBrewStats.brews", &cafe.brews),
            ("cafeBrewStats.failures", &cafe.failures),
            ("cafeBrewStats.p50", &cafe.p50),
            ("cafeBrewStats.p95", &cafe.p95),
            ("cafeBrewStats.p99", &cafe.p99),
            ("cafeBrewStats.temperature", &cafe.temperature),
            ("cafeBrewStats.lastBrewed", &cafe.last_brewed),
        ];
        for (field, template) in fields {
            validate_template(template).map_err(|e| ConfigError::Invalid {
                path: path.to_string(),
                field: field.to_string(),
                message: e.to_string(),
            })?;
        }
        if self.window.is_some_and(|w| w < Duration::from_secs(1)) {
            return Err(ConfigError::Invalid {
                path: path.to_string(),
                field: "window".to_string(),
                message: "must be at least 1s".to_string(),
            });
        }
        self.validate_external_metrics(path)
    }

    fn validate_external_metrics(&self, path: &str) -> Result<()> {
        let invalid =
            |field: String, message: String| ConfigError::Invalid { path: path.to_string(), field, message };
        if self.external_metrics.is_empty() {
            return Err(invalid(
                "externalMetrics".to_string(),
                "must list at least one metric (an empty external.metrics.k8s.io resource list makes \
                 every kubectl discovery report an error); leave the key out for the defaults"
                    .to_string(),
            ));
        }
        for (i, metric) in self.external_metrics.iter().enumerate() {
            let field = |name: &str| format!("externalMetrics[{i}].{name}");
            let name = &metric.name;
            let name_ok = !name.is_empty()
                && name.len() <= 253
                && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
            if !name_ok {
                return Err(invalid(
                    field("name"),
                    format!(
                        "{name:?} is not a valid metric name: 1 to 253 characters among lowercase \
                         letters, digits, '_', '.' and '-'"
                    ),
                ));
            }
            if RESERVED_METRIC_NAMES.contains(&name.as_str()) {
                return Err(invalid(field("name"), format!("{name:?} is reserved in Kubernetes URLs")));
            }
            if let Some(first) = self.external_metrics[..i].iter().position(|m| m.name == *name) {
                return Err(invalid(
                    field("name"),
                    format!("duplicate name {name:?} (also externalMetrics[{first}])"),
                ));
            }
            validate_template(&metric.query).map_err(|e| invalid(field("query"), e.to_string()))?;
            for (j, label) in metric.labels.iter().enumerate() {
                let label_field = format!("externalMetrics[{i}].labels[{j}]");
                if !is_valid_label_name(label) {
                    return Err(invalid(
                        label_field,
                        format!("{label:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
                    ));
                }
                if label == "namespace" {
                    return Err(invalid(
                        label_field,
                        "\"namespace\" cannot be selected: the request's namespace always scopes the query"
                            .to_string(),
                    ));
                }
                if label.starts_with("__") {
                    return Err(invalid(label_field, format!("{label:?} is reserved by Prometheus")));
                }
                if metric.labels[..j].contains(label) {
                    return Err(invalid(label_field, format!("duplicate label {label:?}")));
                }
            }
            if metric.window.is_some_and(|w| w < Duration::from_secs(1)) {
                return Err(invalid(field("window"), "must be at least 1s".to_string()));
            }
        }
        Ok(())
    }
}

/// One validated configuration in force, with its effective window.
#[derive(Debug)]
pub struct Snapshot {
    /// The queries.
    pub queries: QueryConfig,
    /// Range of the rates: `--window`, else the file's `window`, else [`DEFAULT_WINDOW`].
    pub window: Duration,
    /// Increases by one at every successful reload.
    pub generation: u64,
}

/// The query configuration in force, reloaded from `--config` when the file changes (a
/// ConfigMap volume update is a symlink swap, so the content is compared, not the inode).
/// Readers take a [`Snapshot`] per request, so a reload never disturbs requests in flight; an
/// invalid new file is rejected with a log line and a metric, and the last good configuration
/// stays in force.
#[derive(Debug)]
pub struct LiveConfig {
    path: Option<PathBuf>,
    window_flag: Option<Duration>,
    current: std::sync::RwLock<Arc<Snapshot>>,
    changes: tokio::sync::watch::Sender<u64>,
    last_text: std::sync::Mutex<Option<String>>,
}

impl LiveConfig {
    /// Loads `path` (defaults when `None`); `window_flag` is `--window`.
    pub fn load(path: Option<&Path>, window_flag: Option<Duration>) -> Result<Arc<Self>> {
        let (queries, text) = match path {
            None => (QueryConfig::default(), None),
            Some(p) => {
                let shown = p.display().to_string();
                let text = std::fs::read_to_string(p)
                    .map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
                (QueryConfig::from_yaml(&text, &shown)?, Some(text))
            }
        };
        Ok(Arc::new(Self::with(queries, path.map(Path::to_path_buf), window_flag, text)))
    }

    /// A fixed configuration (tests, or no `--config`).
    pub fn fixed(queries: QueryConfig, window_flag: Option<Duration>) -> Arc<Self> {
        Arc::new(Self::with(queries, None, window_flag, None))
    }

    fn with(
        queries: QueryConfig,
        path: Option<PathBuf>,
        window_flag: Option<Duration>,
        text: Option<String>,
    ) -> Self {
        let window = window_flag.or(queries.window).unwrap_or(DEFAULT_WINDOW);
        let snapshot = Arc::new(Snapshot { queries, window, generation: 0 });
        let (changes, _) = tokio::sync::watch::channel(0);
        Self {
            path,
            window_flag,
            current: std::sync::RwLock::new(snapshot),
            changes,
            last_text: std::sync::Mutex::new(text),
        }
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Snapshot> {
        match self.current.read() {
            Ok(current) => current.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Notified with the new generation after each successful reload.
    pub fn subscribe(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Re-reads the file; `Ok(true)` when a new configuration took effect, `Ok(false)` when
    /// the content is unchanged (or there is no file), `Err` when the new file is invalid (the
    /// old configuration stays).
    pub fn reload(&self) -> Result<bool> {
        let Some(path) = &self.path else { return Ok(false) };
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: shown.clone(), source })?;
        let Ok(mut last) = self.last_text.lock() else { return Ok(false) };
        if last.as_deref() == Some(text.as_str()) {
            return Ok(false);
        }
        // Remember the rejected text too, so an invalid file is reported once, not every poll.
        *last = Some(text.clone());
        let queries = QueryConfig::from_yaml(&text, &shown)?;
        let generation = self.current().generation + 1;
        let window = self.window_flag.or(queries.window).unwrap_or(DEFAULT_WINDOW);
        let snapshot = Arc::new(Snapshot { queries, window, generation });
        if let Ok(mut current) = self.current.write() {
            *current = snapshot;
        }
        self.changes.send_replace(generation);
        Ok(true)
    }

    /// Polls the file every `interval` and reloads it when it changed; `observe` is told the
    /// outcome of every attempted reload (`true` = applied).
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, observe: impl Fn(bool) + Send + 'static) {
        if self.path.is_none() {
            return;
        }
        let live = Arc::clone(self);
        tokio::spawn(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                ticker.tick().await;
                match live.reload() {
                    Ok(false) => {}
                    Ok(true) => {
                        tracing::info!(generation = live.current().generation, "configuration reloaded");
                        observe(true);
                    }
                    Err(error) => {
                        tracing::error!(%error, "configuration rejected; the previous one stays in force");
                        observe(false);
                    }
                }
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    #[test]
    fn defaults_parse() {
        let args = Args::try_parse_from(["percolator"]).unwrap();
        assert_eq!(args.prometheus.cache_ttl, Duration::from_secs(15));
        assert_eq!(args.serving.http2_max_streams_per_connection, 1000);
        assert_eq!(args.serving.max_requests_inflight, 400);
        assert_eq!(args.serving.request_timeout, Duration::from_secs(60));
        assert_eq!(args.serving.shutdown_delay_duration, Duration::from_secs(5));
        assert_eq!(args.serving.tls_reload_interval, Duration::from_secs(10));
        assert_eq!(args.kubelet.kubelet_preferred_address_types[0], "Hostname");
    }

    #[test]
    fn bad_flags_are_named() {
        let err = Args::try_parse_from(["percolator", "--cache-ttl", "fast"]).unwrap_err().to_string();
        assert!(err.contains("--cache-ttl"), "{err}");
        let err = Args::try_parse_from(["percolator", "--request-timeout", "0s"]).unwrap_err().to_string();
        assert!(err.contains("--request-timeout") && err.contains("greater than 0"), "{err}");
        let err = Args::try_parse_from(["percolator", "--tls-cert-file", "x"]).unwrap_err().to_string();
        assert!(err.contains("--tls-private-key-file"), "{err}");
    }

    #[test]
    fn reload_applies_valid_files_and_keeps_the_last_good_one() {
        let dir = std::env::temp_dir().join(format!("percolator-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.yaml");
        std::fs::write(&file, "window: 2m\n").unwrap();
        let live = LiveConfig::load(Some(&file), None).unwrap();
        assert_eq!(live.current().window, Duration::from_secs(120));
        assert!(!live.reload().unwrap(), "unchanged content is not a reload");
        std::fs::write(&file, "window: 3m\n").unwrap();
        assert!(live.reload().unwrap());
        assert_eq!(live.current().window, Duration::from_secs(180));
        assert_eq!(live.current().generation, 1);
        std::fs::write(&file, "window: 3m\nbogus: 1\n").unwrap();
        assert!(live.reload().is_err());
        assert_eq!(live.current().window, Duration::from_secs(180), "the last good configuration stays");
        assert!(!live.reload().unwrap(), "a rejected file is reported once");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn window_flag_wins_over_the_file() {
        let live = LiveConfig::fixed(
            QueryConfig::from_yaml("window: 2m\n", "f").unwrap(),
            Some(Duration::from_secs(30)),
        );
        assert_eq!(live.current().window, Duration::from_secs(30));
    }

    #[test]
    fn default_templates_are_valid() {
        QueryConfig::default().validate("defaults").unwrap();
    }

    #[test]
    fn empty_file_is_defaults() {
        assert_eq!(QueryConfig::from_yaml("", "f").unwrap(), QueryConfig::default());
    }

    #[test]
    fn unknown_field_is_named() {
        let err =
            QueryConfig::from_yaml("podMetricsSummary:\n  request: x\n", "f.yaml").unwrap_err().to_string();
        assert!(err.contains("request"), "{err}");
    }

    #[test]
    fn window_is_parsed_and_validated() {
        let c = QueryConfig::from_yaml("window: 2m\n", "f").unwrap();
        assert_eq!(c.window, Some(Duration::from_secs(120)));
        let err = QueryConfig::from_yaml("window: soon\n", "f").unwrap_err().to_string();
        assert!(err.contains("soon"), "{err}");
    }

    #[test]
    fn external_metrics_default_when_absent() {
        let c = QueryConfig::from_yaml("window: 2m\n", "f").unwrap();
        let names: Vec<&str> = c.external_metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cafe_brews_per_minute",
                "cafe_brew_duration_p95_seconds",
                "http_requests_per_second",
                "http_error_ratio"
            ]
        );
        assert_eq!(c.external_metrics[0].labels, ["cafe", "type"]);
        assert_eq!(c.external_metrics[2].labels, ["pod", "code"]);
        assert_eq!(c.external_metrics[3].labels, ["pod"]);
        assert!(!Args::try_parse_from(["percolator"]).unwrap().external_metrics.enable_external_metrics);
        let args = Args::try_parse_from(["percolator", "--enable-external-metrics"]).unwrap();
        assert!(args.external_metrics.enable_external_metrics);
    }

    #[test]
    fn external_metrics_parse() {
        let c = QueryConfig::from_yaml(
            "externalMetrics:\n- name: queue_depth\n  query: max by (namespace, queue) (q{SCOPE})\n  labels: [queue]\n  window: 1m\n- name: x.y-z\n  query: sum(rate(x{SCOPE}[WINDOW]))\n",
            "f",
        )
        .unwrap();
        assert_eq!(
            c.external_metrics,
            vec![
                ExternalMetricConfig {
                    name: "queue_depth".into(),
                    query: "max by (namespace, queue) (q{SCOPE})".into(),
                    labels: vec!["queue".into()],
                    window: Some(Duration::from_secs(60)),
                },
                ExternalMetricConfig {
                    name: "x.y-z".into(),
                    query: "sum(rate(x{SCOPE}[WINDOW]))".into(),
                    labels: vec![],
                    window: None,
                },
            ]
        );
    }

    #[test]
    fn external_metrics_are_validated_with_the_field_named() {
        let ok = "  query: x{SCOPE}\n";
        for (yaml, field, says) in [
            ("externalMetrics: []\n".to_owned(), "externalMetrics", "at least one metric"),
            (format!("externalMetrics:\n- name: Brews\n{ok}"), "externalMetrics[0].name", "lowercase"),
            (format!("externalMetrics:\n- name: a/b\n{ok}"), "externalMetrics[0].name", "\"a/b\""),
            (format!("externalMetrics:\n- name: \"\"\n{ok}"), "externalMetrics[0].name", "1 to 253"),
            (format!("externalMetrics:\n- name: status\n{ok}"), "externalMetrics[0].name", "reserved"),
            (
                format!("externalMetrics:\n- name: a\n{ok}- name: a\n{ok}"),
                "externalMetrics[1].name",
                "duplicate name \"a\" (also externalMetrics[0])",
            ),
            (
                "externalMetrics:\n- name: a\n  query: sum(rate(x[5m]))\n".to_owned(),
                "externalMetrics[0].query",
                "would read every namespace",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [ok, app.kubernetes.io/name]\n"),
                "externalMetrics[0].labels[1]",
                "not a Prometheus label name",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [namespace]\n"),
                "externalMetrics[0].labels[0]",
                "always scopes",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [__name__]\n"),
                "externalMetrics[0].labels[0]",
                "reserved",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [pod, pod]\n"),
                "externalMetrics[0].labels[1]",
                "duplicate label",
            ),
            (format!("externalMetrics:\n- name: a\n{ok}  window: 10ms\n"), "externalMetrics[0].window", "1s"),
        ] {
            let err = QueryConfig::from_yaml(&yaml, "f.yaml").unwrap_err().to_string();
            assert!(err.starts_with(&format!("--config f.yaml: field {field}: ")), "{yaml}: {err}");
            assert!(err.contains(says), "{yaml}: {err}");
        }
        let err =
            QueryConfig::from_yaml("externalMetrics:\n- name: a\n  query: x{SCOPE}\n  label: [a]\n", "f")
                .unwrap_err()
                .to_string();
        assert!(err.contains("label"), "{err}");
        let err = QueryConfig::from_yaml("externalMetrics:\n- name: a\n", "f").unwrap_err().to_string();
        assert!(err.contains("query"), "{err}");
    }
}
