//! Wiring and serving: builds the sources, kinds and router from the flags ([`run`]), and
//! serves the router on an already-bound listener with the generic server's serving loop
//! (`apiserver::serve::listener`: TLS, HTTP/1.1 and HTTP/2, the bounds on connections and
//! the graceful close; [`serve`] runs it with the flags' defaults, for tests).
//!
//! Shutdown, as kube-apiserver does it: on SIGTERM (or Ctrl-C) `/readyz` fails at once while
//! requests are still served for `--shutdown-delay-duration` (so endpoints and load balancers
//! stop sending new traffic), then the listener closes, open connections are drained (at
//! most `apiserver::serve::listener::DRAIN_TIMEOUT`) and the process exits 0. A second signal
//! skips the delay.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::adapter::LiveAdapter;
use crate::adapter::live::AdapterResourceQueries;
use crate::api::{self, ApiState};
use crate::config::{Args, Check, KubeletArgs, LiveConfig, QueryFile, ResourceSource};
use crate::kinds::{Sources, registry};
use crate::metrics::custom::CustomMetrics;
use crate::metrics::external::ExternalMetrics;
use crate::sources::inventory::KubeInventory;
use crate::sources::kubelet::{BearerToken, KubeletClient, KubeletConfig};
use crate::sources::prometheus::{ConnectionSettings, PromClient, Template};
use crate::sources::resources::{
    ConfigQueries, KubeletUsage, PromUsage, ResourceQuery, ResourceQueryError, ResourceQueryPlan,
};
use crate::sources::workloads::KubeWorkloads;
use crate::sources::{Inventory, KubeletSource, PromSource, UpstreamObserver, UsageSource};
use apiserver::CacheSettings;
use apiserver::Metrics;
use apiserver::serve::listener::{self, ServeConfig};

/// How often `--config` is checked for changes (a ConfigMap volume updates within about a
/// minute; polling a small file this often costs nothing).
const CONFIG_POLL_INTERVAL: Duration = Duration::from_secs(2);

/// Why percolator could not start: each variant names the step that failed, and the cause
/// (when there is one) is its [`source`](std::error::Error::source).
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// `--config` cannot be read or is invalid.
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// `--adapter-config` cannot be read or is invalid.
    #[error(transparent)]
    Adapter(#[from] crate::adapter::AdapterError),
    /// `--kubeconfig` cannot be read or used.
    #[error("--kubeconfig {}", .path.display())]
    Kubeconfig {
        /// The file.
        path: std::path::PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Neither `--kubeconfig` nor an in-cluster configuration (nor a default kubeconfig).
    #[error("no --kubeconfig and no in-cluster configuration")]
    NoClusterConfig(#[source] kube::config::InferConfigError),
    /// Delegated authentication or authorization could not be set up.
    #[error(transparent)]
    Auth(#[from] apiserver::AuthError),
    /// The serving certificate or a CA file cannot be used.
    #[error(transparent)]
    Tls(#[from] apiserver::TlsError),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client")]
    KubeClient(#[source] kube::Error),
    /// The inventory's thread could not be started.
    #[error("starting the inventory's watch thread")]
    Inventory(#[source] std::io::Error),
    /// The Prometheus client could not be built.
    #[error("connecting to Prometheus")]
    Prometheus(#[source] crate::sources::prometheus::Error),
    /// The kubelet client could not be built.
    #[error("building the kubelet client")]
    Kubelet(#[source] crate::sources::kubelet::Error),
    /// A metric name both `--config` and `--adapter-config` serve.
    #[error(
        "{api} metric {name:?} is declared twice: by --config ({section}) and by --adapter-config {} ({rule}); rename one",
        .path.display()
    )]
    DeclaredTwice {
        /// `external` or `custom`.
        api: &'static str,
        /// The metric.
        name: String,
        /// The section of `--config` declaring it.
        section: &'static str,
        /// The adapter configuration.
        path: std::path::PathBuf,
        /// The adapter rule serving it (`externalRules[0]`).
        rule: String,
    },
    /// The serving address cannot be bound.
    #[error("binding {address}:{port}")]
    Bind {
        /// `--bind-address`.
        address: std::net::IpAddr,
        /// `--secure-port`.
        port: u16,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The bound listener has no local address.
    #[error(transparent)]
    LocalAddress(std::io::Error),
}

/// A configured server, bound but not yet serving.
pub struct Prepared {
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    serving: ServeConfig,
    shutdown_delay: Duration,
    shutting_down: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for Prepared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Prepared").field("listener", &self.listener).finish_non_exhaustive()
    }
}

impl Prepared {
    /// The bound address.
    pub fn local_addr(&self) -> std::io::Result<std::net::SocketAddr> {
        self.listener.local_addr()
    }

    /// Serves until `shutdown` resolves; then `/readyz` fails while requests are still served
    /// for `--shutdown-delay-duration` (cut short by another SIGTERM or Ctrl-C), then the
    /// listener closes and in-flight requests are drained.
    pub async fn serve(self, shutdown: impl Future<Output = ()> + Send) {
        let Prepared { listener, tls, app, serving, shutdown_delay, shutting_down, metrics } = self;
        let counted = metrics.clone();
        let staged = async move {
            shutdown.await;
            shutting_down.store(true, Ordering::SeqCst);
            metrics.ready.set(0);
            tracing::info!(
                delay = %k8s_wire::duration::go_string(shutdown_delay),
                "shutting down: /readyz fails; still serving until the delay ends (signal again to skip it)"
            );
            tokio::select! {
                () = tokio::time::sleep(shutdown_delay) => {}
                () = shutdown_signal() => tracing::info!("second signal: skipping the shutdown delay"),
            }
        };
        listener::serve(listener, tls, app, &serving, &counted, staged).await;
    }
}

/// Runs percolator with `args` until SIGTERM or Ctrl-C.
pub async fn run(args: Args) -> Result<(), StartError> {
    let prepared = prepare(args).await?;
    prepared.serve(shutdown_signal()).await;
    Ok(())
}

/// Builds everything from `args` and binds the listener; logs the address it serves on.
pub async fn prepare(args: Args) -> Result<Prepared, StartError> {
    let config = LiveConfig::load(args.queries.config.as_deref(), args.queries.window, config_check())?;
    // Read first: a bad file stops the start at once, and its resourceRules decide the
    // default resource source. It is read once: start_adapter serves what was read here.
    let adapter_loaded = match &args.adapter.adapter_config {
        Some(path) => Some((path.as_path(), crate::adapter::live::load(path)?)),
        None => None,
    };
    let adapter_file =
        adapter_loaded.as_ref().map(|(path, (_, config))| (*path, config.resource_rules.is_some()));
    let resource_source = ResourceSourceChoice::resolve(
        args.kubelet.resource_source,
        adapter_file,
        args.queries.config.is_some(),
    );
    tracing::info!(
        source = %resource_source.source,
        "resource source: {} ({})",
        resource_source.source,
        resource_source.reason
    );

    let kube_config = match &args.cluster.kubeconfig {
        Some(path) => {
            let error = |source| StartError::Kubeconfig { path: path.clone(), source };
            let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(error)?;
            kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default()).await.map_err(error)?
        }
        None => kube::Config::infer().await.map_err(StartError::NoClusterConfig)?,
    };
    let auth = apiserver::Auth::start(&args.auth, &kube_config).await?;
    auth.trust().spawn_file_poller(args.serving.tls_reload_interval);
    let (tls, serving_cert) =
        apiserver::server_config_reloading(&args.serving, Some(auth.client_cert_verifier()))?;
    serving_cert.spawn_reloader(args.serving.tls_reload_interval);
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    // Authentication starts before the registry exists (the trust is read first): its
    // metrics join the registry here.
    metrics.export_auth(auth.metrics());
    export_serving_certificate_expiry(&serving_cert, &metrics);
    let cache = CacheSettings::new(args.cache.cache_ttl, metrics.clone());
    let observer: Arc<dyn UpstreamObserver> = metrics.clone();
    let client = kube::Client::try_from(kube_config.clone()).map_err(StartError::KubeClient)?;
    let inventory: Arc<dyn Inventory> =
        KubeInventory::start(client.clone(), Some(&metrics)).map_err(StartError::Inventory)?;

    let prometheus_settings =
        ConnectionSettings::from_args(&args.prometheus, args.serving.tls_reload_interval);
    let prometheus: Arc<dyn PromSource> = Arc::new(
        PromClient::connect(&prometheus_settings, observer.clone()).map_err(StartError::Prometheus)?,
    );
    tracing::info!(
        url = %prometheus_settings.display_url(),
        ca_file = ?prometheus_settings.ca_file,
        client_certificate = prometheus_settings.client_cert.is_some(),
        insecure_skip_tls_verify = prometheus_settings.insecure_skip_tls_verify,
        token_file = ?prometheus_settings.token_file,
        basic_auth = prometheus_settings.basic_auth.is_some(),
        headers = ?prometheus_settings.headers.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        max_response_bytes = prometheus_settings.max_response_bytes,
        "Prometheus connection"
    );
    let resource_plan = Arc::new(PlanSlot::new(Arc::new(ConfigQueries(config.clone()))));
    // Set once every node's kubelet has given a CPU rate ([`warm_up_kubelets`]); `/readyz`
    // waits for it when usage comes from the kubelets.
    let kubelet_samples = Arc::new(AtomicBool::new(false));
    let usage: Arc<dyn UsageSource> = match resource_source.source {
        ResourceSource::Kubelet => {
            // Watched: a rotated file applies to the next kubelet connection.
            let kubelet_ca = match &args.kubelet.kubelet_certificate_authority {
                Some(path) => {
                    let file = apiserver::WatchedCaFile::load(path, "--kubelet-certificate-authority")?;
                    if !args.kubelet.kubelet_insecure_tls {
                        file.spawn_reloader(args.serving.tls_reload_interval);
                    }
                    Some(file)
                }
                None => None,
            };
            let kubelet: Arc<dyn KubeletSource> = Arc::new(
                KubeletClient::new(
                    kubelet_config(&args.kubelet, &kube_config, kubelet_ca, &cache),
                    inventory.clone(),
                    observer,
                )
                .map_err(StartError::Kubelet)?,
            );
            let sampling = kubelet.sampling();
            tracing::info!(
                max_rate_window = ?sampling.max_window,
                interval = ?sampling.interval,
                idle_after = ?sampling.idle_after,
                "kubelet sampling: nodes asked for are sampled every interval until idle_after without a request (the start-up warm-up counts as one)"
            );
            tokio::spawn(warm_up_kubelets(inventory.clone(), kubelet.clone(), kubelet_samples.clone()));
            Arc::new(KubeletUsage::new(kubelet))
        }
        ResourceSource::Prometheus => {
            // The adapter configuration is loaded below; its resourceRules are read through a
            // slot filled then.
            Arc::new(PromUsage::with_plan(prometheus.clone(), resource_plan.clone(), &cache))
        }
    };

    let sources = Sources {
        inventory: inventory.clone(),
        usage,
        prometheus: prometheus.clone(),
        config: config.clone(),
    };
    let mut kinds = registry::LiveKinds::new(&sources, &cache);
    if args.metric_apis.enable_resource_metrics {
        tracing::info!("serving metrics.k8s.io/v1beta1 (PodMetrics, NodeMetrics)");
        kinds = kinds.with_resource_metrics(&sources, &cache);
    }
    let reload_metrics = metrics.clone();
    config.spawn_reloader(CONFIG_POLL_INTERVAL, move |applied| {
        reload_metrics.config_reload(apiserver::CONFIG_FILE, applied);
    });

    let inventory_for_custom = inventory.clone();
    let ready_metrics = metrics.clone();
    let shutting_down = Arc::new(AtomicBool::new(false));
    let stopping = shutting_down.clone();
    // `/readyz` reports the shutdown check itself; the gauge covers both.
    let samples = kubelet_samples.clone();
    let needs_samples = resource_source.source == ResourceSource::Kubelet;
    let ready = Arc::new(move || {
        let synced = inventory.is_synced();
        let sampled = !needs_samples || samples.load(Ordering::SeqCst);
        ready_metrics.ready.set(i64::from(synced && sampled && !stopping.load(Ordering::SeqCst)));
        synced
    });
    let mut state = ApiState::new(kinds, ready, metrics.clone())
        .with_auth(auth)
        .with_limits(args.serving.max_requests_inflight, args.serving.request_timeout)
        .with_shutdown_flag(shutting_down.clone());
    if resource_source.source == ResourceSource::Kubelet {
        let samples = kubelet_samples.clone();
        state = state
            .with_readiness_check("metric-storage-ready", Arc::new(move || samples.load(Ordering::SeqCst)));
    }
    let adapter = match adapter_loaded {
        Some((path, loaded)) => {
            Some(start_adapter(path, loaded, &args.adapter, prometheus.clone(), &config, &metrics).await?)
        }
        None => None,
    };
    if let (Some(adapter), Some((path, had_rules))) = (&adapter, adapter_file) {
        resource_plan.set(Arc::new(AdapterResourceQueries {
            adapter: adapter.clone(),
            fallback: Arc::new(ConfigQueries(config.clone())),
        }));
        watch_resource_rules(adapter.clone(), path.to_path_buf(), resource_source.clone(), had_rules);
    }
    if args.metric_apis.enable_external_metrics {
        let names: Vec<String> =
            crate::metrics::external::metrics_of(&config.current()).iter().map(|m| m.name.clone()).collect();
        tracing::info!(metrics = ?names, "serving external.metrics.k8s.io/v1beta1");
        let mut external = ExternalMetrics::new(prometheus.clone(), config.clone(), &cache);
        if let Some(adapter) = &adapter {
            let names: Vec<String> = adapter.current().external.iter().map(|m| m.name.clone()).collect();
            tracing::info!(metrics = ?names, "serving the externalRules of --adapter-config");
            external = external.with_adapter(adapter.clone());
        }
        state = state.with_group(Arc::new(external));
    }
    if args.metric_apis.enable_custom_metrics {
        let names: Vec<String> =
            crate::metrics::custom::metrics_of(&config.current()).iter().map(|m| m.name.clone()).collect();
        tracing::info!(metrics = ?names, "serving custom.metrics.k8s.io v1beta2 and v1beta1");
        let workloads = Arc::new(KubeWorkloads::new(client, &cache));
        let mut custom =
            CustomMetrics::new(prometheus, inventory_for_custom, workloads, config.clone(), &cache);
        if let Some(adapter) = &adapter {
            let names: Vec<String> = adapter.current().custom.iter().map(|m| m.name.clone()).collect();
            tracing::info!(metrics = ?names, "serving the rules of --adapter-config");
            custom = custom.with_adapter(adapter.clone());
        }
        state = state.with_group(Arc::new(custom));
    }
    let app = api::router(state);

    let listener =
        listener::bind((args.serving.bind_address, args.serving.secure_port).into()).map_err(|source| {
            StartError::Bind { address: args.serving.bind_address, port: args.serving.secure_port, source }
        })?;
    let address = listener.local_addr().map_err(StartError::LocalAddress)?;
    tracing::info!(%address, window = %k8s_wire::duration::go_string(config.current().window), "serving");
    Ok(Prepared {
        listener,
        tls,
        app,
        serving: ServeConfig::from_args(&args.serving),
        shutdown_delay: args.serving.shutdown_delay_duration,
        shutting_down,
        metrics,
    })
}

/// Keeps `percolator_tls_serving_certificate_expiration_timestamp_seconds` on the `notAfter`
/// of the serving leaf in force: set now, and after every reload that changes the pair.
fn export_serving_certificate_expiry(cert: &apiserver::ReloadingCert, metrics: &Arc<Metrics>) {
    let metrics = Arc::clone(metrics);
    cert.on_change(move |chain| {
        let not_after = match chain.first().map(|leaf| apiserver::not_after(leaf.as_ref())) {
            Some(Ok(not_after)) => Some(not_after),
            Some(Err(error)) => {
                tracing::warn!(%error, "cannot read the expiry of the serving certificate");
                None
            }
            None => {
                tracing::warn!(error = "empty chain", "cannot read the expiry of the serving certificate");
                None
            }
        };
        metrics.serving_certificate_expires(not_after);
    });
}

/// Which source serves pod, container and node CPU and memory (metrics.k8s.io and
/// PodMetricsSummary alike), and why: decided once at start, logged, never switched by a
/// reload.
#[derive(Debug, Clone, PartialEq, Eq)]
struct ResourceSourceChoice {
    /// The source.
    source: ResourceSource,
    /// Whether `--resource-source` (or `PERCOLATOR_RESOURCE_SOURCE`) was given.
    explicit: bool,
    /// Why, for the start-up log: `resource source: SOURCE (REASON)`.
    reason: String,
    /// What the Prometheus source falls back to without resourceRules.
    config_queries: &'static str,
}

impl ResourceSourceChoice {
    /// `--resource-source` when given; otherwise `prometheus` when the `--adapter-config` file
    /// (`adapter`: its path and whether it has `resourceRules`) has resourceRules, as in
    /// prometheus-adapter where they mean Prometheus serves metrics.k8s.io; `kubelet` else.
    /// `config_given`: whether `--config` is (only for the wording of the reason).
    fn resolve(
        flag: Option<ResourceSource>,
        adapter: Option<(&std::path::Path, bool)>,
        config_given: bool,
    ) -> Self {
        let config_queries = if config_given {
            "the resourceQueries of --config"
        } else {
            "the default resourceQueries (no --config)"
        };
        let rules = adapter
            .filter(|(_, has_rules)| *has_rules)
            .map(|(path, _)| format!("the resourceRules of --adapter-config {}", path.display()));
        let (source, reason) = match (flag, rules) {
            (None, None) => (ResourceSource::Kubelet, "the default".to_owned()),
            (None, Some(rules)) => {
                (ResourceSource::Prometheus, format!("{rules}; --resource-source not given"))
            }
            (Some(ResourceSource::Kubelet), None) => {
                (ResourceSource::Kubelet, "--resource-source=kubelet given explicitly".to_owned())
            }
            (Some(ResourceSource::Kubelet), Some(rules)) => (
                ResourceSource::Kubelet,
                format!("--resource-source=kubelet given explicitly; {rules} are unused"),
            ),
            (Some(ResourceSource::Prometheus), None) => (
                ResourceSource::Prometheus,
                format!("--resource-source=prometheus given explicitly; {config_queries}"),
            ),
            (Some(ResourceSource::Prometheus), Some(rules)) => (
                ResourceSource::Prometheus,
                format!("--resource-source=prometheus given explicitly; {rules}"),
            ),
        };
        Self { source, explicit: flag.is_some(), reason, config_queries }
    }

    /// What a reload that adds (`has_rules`) or removes the resourceRules of `path` means,
    /// and whether it deserves a warning: the source stays; with Prometheus the queries follow
    /// the file (`AdapterResourceQueries` falls back to `resourceQueries:` without rules).
    fn on_rules_change(&self, path: &std::path::Path, has_rules: bool) -> (bool, String) {
        let file = format!("--adapter-config {}", path.display());
        match (self.source, has_rules) {
            (ResourceSource::Kubelet, true) if self.explicit => (
                false,
                format!("resourceRules added to {file}: unused, --resource-source=kubelet given explicitly"),
            ),
            (ResourceSource::Kubelet, true) => (
                true,
                format!(
                    "resourceRules added to {file}: restart percolator to read CPU and memory from Prometheus with them (the resource source is decided at start: still kubelet)"
                ),
            ),
            (ResourceSource::Kubelet, false) => {
                (false, format!("resourceRules removed from {file}: unused, the resource source is kubelet"))
            }
            (ResourceSource::Prometheus, true) => {
                (false, format!("resourceRules added to {file}: CPU and memory now from them"))
            }
            (ResourceSource::Prometheus, false) => {
                let restart = if self.explicit {
                    ""
                } else {
                    "; after a restart, the kubelets (--resource-source not given)"
                };
                (
                    true,
                    format!(
                        "resourceRules removed from {file}: CPU and memory now from {}{restart}",
                        self.config_queries
                    ),
                )
            }
        }
    }
}

/// Logs, as reloads and relists publish new adapter configurations, when the resourceRules of
/// `path` appear or disappear (`had_rules`: at start), with what that means for the resource
/// source (which stays what start decided). It keeps the adapter, and so its reloads, alive for
/// the process's life even when no API serves from it (the kubelet source without custom or
/// external metrics): a reload adding resourceRules is then still heard of.
fn watch_resource_rules(
    adapter: Arc<LiveAdapter>,
    path: std::path::PathBuf,
    choice: ResourceSourceChoice,
    mut had_rules: bool,
) {
    tokio::spawn(async move {
        // 0: the first look compares too (a reload may have come before this task runs).
        let mut seen = 0;
        loop {
            let generation = adapter.generation();
            if generation != seen {
                seen = generation;
                let has_rules = adapter.current().config.resource_rules.is_some();
                if has_rules != had_rules {
                    had_rules = has_rules;
                    match choice.on_rules_change(&path, has_rules) {
                        (true, message) => tracing::warn!("{message}"),
                        (false, message) => tracing::info!("{message}"),
                    }
                }
            }
            tokio::time::sleep(CONFIG_POLL_INTERVAL).await;
        }
    });
}

/// A [`ResourceQueryPlan`] set once the adapter configuration is loaded (the resource source
/// is built before it).
struct PlanSlot(std::sync::RwLock<Arc<dyn ResourceQueryPlan>>);

impl PlanSlot {
    fn new(plan: Arc<dyn ResourceQueryPlan>) -> Self {
        Self(std::sync::RwLock::new(plan))
    }

    fn set(&self, plan: Arc<dyn ResourceQueryPlan>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
    }

    fn get(&self) -> Arc<dyn ResourceQueryPlan> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl ResourceQueryPlan for PlanSlot {
    fn generation(&self) -> u64 {
        self.get().generation()
    }

    fn pods(&self, namespace: &str) -> Result<ResourceQuery, ResourceQueryError> {
        self.get().pods(namespace)
    }

    fn nodes(&self, nodes: &[&str]) -> Result<ResourceQuery, ResourceQueryError> {
        self.get().nodes(nodes)
    }
}

/// Loads `--adapter-config`, lists its rules' series and starts its reload and relist loop.
/// A metric name both the adapter's rules and `--config` serve stops the start, naming both.
async fn start_adapter(
    path: &std::path::Path,
    loaded: (String, crate::adapter::AdapterConfig),
    args: &crate::config::AdapterArgs,
    prometheus: Arc<dyn PromSource>,
    config: &LiveConfig<Template>,
    metrics: &Arc<Metrics>,
) -> Result<Arc<LiveAdapter>, StartError> {
    let max_age =
        args.metrics_max_age.unwrap_or(args.metrics_relist_interval).max(args.metrics_relist_interval);
    let adapter = LiveAdapter::start(path, loaded, prometheus, max_age).await;
    let current = adapter.current();
    let snapshot = config.current();
    // A name --config declares cannot be taken; a default metric's can (the adapter's wins).
    for metric in &current.external {
        let declared = snapshot.file.declares.external_metrics;
        if declared && crate::metrics::external::metrics_of(&snapshot).iter().any(|m| m.name == metric.name) {
            return Err(StartError::DeclaredTwice {
                api: "external",
                name: metric.name.clone(),
                section: "externalMetrics",
                path: path.to_path_buf(),
                rule: current.config.external_rules.get(metric.rule).map(|r| r.field()).unwrap_or_default(),
            });
        }
    }
    for metric in &current.custom {
        let declared = snapshot.file.declares.custom_metrics;
        if declared && crate::metrics::custom::metrics_of(&snapshot).iter().any(|m| m.name == metric.name) {
            return Err(StartError::DeclaredTwice {
                api: "custom",
                name: metric.name.clone(),
                section: "customMetrics",
                path: path.to_path_buf(),
                rule: current.config.rules.get(metric.rule).map(|r| r.field()).unwrap_or_default(),
            });
        }
    }
    let file = apiserver::ADAPTER_CONFIG_FILE;
    metrics.config_loaded(file);
    let reload_metrics = metrics.clone();
    adapter.spawn(CONFIG_POLL_INTERVAL, args.metrics_relist_interval, move |applied| {
        reload_metrics.config_reload(file, applied);
    });
    Ok(adapter)
}

/// Fetches every node's kubelet after the inventory has synced, and again every half
/// sampling interval until each node that answers has a CPU rate (two distinct samples), then
/// sets `done`: `/readyz` waits for it (check `metric-storage-ready`, as metrics-server's), so
/// a replica starting during a rolling restart enters the Service's rotation with CPU for
/// `kubectl top` and the HPA rather than empty lists. A node whose kubelet fails does not hold
/// readiness (requests fetch it again on demand and say what failed), and neither does the
/// whole warm-up past `--max-rate-window`: a kubelet that never publishes a second sample
/// leaves that node's CPU out, as it would on any replica.
async fn warm_up_kubelets(
    inventory: Arc<dyn Inventory>,
    kubelet: Arc<dyn KubeletSource>,
    done: Arc<AtomicBool>,
) {
    while !inventory.is_synced() {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sampling = kubelet.sampling();
    let deadline = tokio::time::Instant::now() + sampling.max_window;
    let mut waiting: std::collections::BTreeSet<String> = inventory
        .running_pods(None)
        .iter()
        .filter_map(|p| p.node_name.as_deref().map(str::to_owned))
        .collect();
    let nodes = waiting.len();
    let mut errors: Vec<String> = Vec::new();
    loop {
        let fetches = futures::future::join_all(waiting.iter().map(|node| kubelet.node_usage(node))).await;
        let mut still = std::collections::BTreeSet::new();
        for (node, fetch) in waiting.iter().zip(fetches) {
            match fetch {
                Ok(usage) if !has_cpu_rate(&usage) => {
                    still.insert(node.clone());
                }
                Ok(_) => {}
                Err(e) => errors.push(e.to_string()),
            }
        }
        waiting = still;
        if waiting.is_empty() || tokio::time::Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep((sampling.interval / 2).max(Duration::from_millis(100))).await;
    }
    done.store(true, Ordering::SeqCst);
    match errors.first() {
        None if waiting.is_empty() => {
            tracing::info!(nodes, "kubelet warm-up done: every node has a CPU rate")
        }
        None => tracing::warn!(
            nodes,
            without_cpu = waiting.len(),
            "kubelet warm-up gave up waiting for a second sample after --max-rate-window"
        ),
        Some(first) => {
            tracing::warn!(nodes, failed = errors.len(), first = %first, "kubelet warm-up done with errors")
        }
    }
}

/// Whether a node's usage carries a CPU rate: the node's own, or any container's (a kubelet
/// may publish no node series; a node without running containers has nothing to wait for).
fn has_cpu_rate(usage: &crate::sources::NodeUsage) -> bool {
    let containers = || usage.pods.values().flat_map(|c| c.iter());
    usage.node.as_ref().is_some_and(|n| n.cpu_nanocores.is_some())
        || containers().any(|c| c.cpu_nanocores.is_some())
        || (usage.node.is_none() && containers().next().is_none())
}

/// The check of the query file: every section's owner checks its own (the kinds their
/// queries, the external and custom metrics APIs their metrics), whether or not that API is
/// enabled, so a file that is valid today stays valid when it is.
pub fn config_check() -> Check<Template> {
    Arc::new(|file: &mut QueryFile<Template>| {
        registry::check_kinds(file)?;
        crate::sources::resources::check_resource_queries(file)?;
        crate::metrics::external::check_metrics(file)?;
        crate::metrics::custom::check_metrics(file)
    })
}

/// The kubelet client configuration: flags, plus the cluster's credentials and CA from the
/// kubeconfig (the service account's token and the cluster CA in-cluster), as metrics-server
/// does. `ca_file` is `--kubelet-certificate-authority` (then the cluster CA is not used).
fn kubelet_config(
    args: &KubeletArgs,
    kube_config: &kube::Config,
    ca_file: Option<Arc<apiserver::WatchedCaFile>>,
    cache: &CacheSettings,
) -> KubeletConfig {
    use base64::Engine;
    use secrecy::ExposeSecret;
    let auth = &kube_config.auth_info;
    let bearer_token = match (&auth.token_file, &auth.token) {
        (Some(file), _) => Some(BearerToken::File(file.into())),
        (None, Some(token)) => Some(BearerToken::Static(token.expose_secret().to_string())),
        _ => None,
    };
    let cluster_ca = kube_config.root_cert.as_ref().filter(|_| ca_file.is_none()).map(|ders| {
        let engine = base64::engine::general_purpose::STANDARD;
        ders.iter()
            .map(|der| {
                format!("-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n", engine.encode(der))
            })
            .collect::<String>()
            .into_bytes()
    });
    KubeletConfig {
        port: args.kubelet_port,
        preferred_address_types: args.kubelet_preferred_address_types.clone(),
        insecure_tls: args.kubelet_insecure_tls,
        ca_file,
        ca_pem: cluster_ca,
        bearer_token,
        request_timeout: args.kubelet_request_timeout,
        cache: cache.clone(),
        use_node_status_port: args.kubelet_use_node_status_port,
        reuse_connections: args.kubelet_reuse_connections,
        max_rate_window: args.max_rate_window,
        idle_after: args.idle_after,
        ..KubeletConfig::default()
    }
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, with the serving flags'
/// defaults but `max_streams` concurrent HTTP/2 streams per connection, its connections
/// counted in a registry of its own (tests serve a router of their own with it).
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    max_streams: u32,
    shutdown: impl Future<Output = ()> + Send,
) {
    let config = ServeConfig { max_streams, ..ServeConfig::default() };
    listener::serve(listener, tls, app, &config, &Metrics::new(crate::METRICS_NAMESPACE), shutdown).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Writes a self-signed pair for `name` valid until `not_after` (Unix seconds).
    fn mk_pair(dir: &std::path::Path, name: &str, not_after: u64) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    fn expiry(metrics: &Metrics) -> String {
        let name = "percolator_tls_serving_certificate_expiration_timestamp_seconds ";
        let text = metrics.encode();
        text.lines().find_map(|l| l.strip_prefix(name)).unwrap().to_owned()
    }

    /// `--resource-source` given or not × the adapter file absent, without or with
    /// resourceRules: the source and the reason the start-up log gives.
    #[test]
    fn the_resource_source_is_the_flag_else_prometheus_for_resource_rules_else_kubelet() {
        use ResourceSource::{Kubelet, Prometheus};
        let file = std::path::Path::new("/etc/adapter/config.yaml");
        let rules = "the resourceRules of --adapter-config /etc/adapter/config.yaml";
        for (flag, adapter, source, reason) in [
            (None, None, Kubelet, "the default".to_owned()),
            (None, Some((file, false)), Kubelet, "the default".to_owned()),
            (None, Some((file, true)), Prometheus, format!("{rules}; --resource-source not given")),
            (Some(Kubelet), None, Kubelet, "--resource-source=kubelet given explicitly".to_owned()),
            (
                Some(Kubelet),
                Some((file, false)),
                Kubelet,
                "--resource-source=kubelet given explicitly".to_owned(),
            ),
            (
                Some(Kubelet),
                Some((file, true)),
                Kubelet,
                format!("--resource-source=kubelet given explicitly; {rules} are unused"),
            ),
            (
                Some(Prometheus),
                None,
                Prometheus,
                "--resource-source=prometheus given explicitly; the resourceQueries of --config".to_owned(),
            ),
            (
                Some(Prometheus),
                Some((file, false)),
                Prometheus,
                "--resource-source=prometheus given explicitly; the resourceQueries of --config".to_owned(),
            ),
            (
                Some(Prometheus),
                Some((file, true)),
                Prometheus,
                format!("--resource-source=prometheus given explicitly; {rules}"),
            ),
        ] {
            let choice = ResourceSourceChoice::resolve(flag, adapter, true);
            assert_eq!(
                (choice.source, choice.reason.as_str()),
                (source, reason.as_str()),
                "{flag:?} {adapter:?}"
            );
            assert_eq!(choice.explicit, flag.is_some());
        }
        let without_config = ResourceSourceChoice::resolve(Some(Prometheus), None, false);
        assert_eq!(
            without_config.reason,
            "--resource-source=prometheus given explicitly; the default resourceQueries (no --config)"
        );
    }

    /// A reload never switches the source; what it changes is logged (a warning when a
    /// restart would change something, or the queries left are the fallback).
    #[test]
    fn a_reload_adding_or_removing_resource_rules_says_what_it_changes() {
        use ResourceSource::{Kubelet, Prometheus};
        let file = std::path::Path::new("a.yaml");
        let change = |flag, at_start, has_rules| {
            ResourceSourceChoice::resolve(flag, Some((file, at_start)), true).on_rules_change(file, has_rules)
        };
        let m = |warn: bool, text: &str| (warn, text.to_owned());
        for (flag, at_start, has_rules, expected) in [
            (
                None,
                false,
                true,
                m(
                    true,
                    "resourceRules added to --adapter-config a.yaml: restart percolator to read CPU and memory from Prometheus with them (the resource source is decided at start: still kubelet)",
                ),
            ),
            (
                Some(Kubelet),
                true,
                true,
                m(
                    false,
                    "resourceRules added to --adapter-config a.yaml: unused, --resource-source=kubelet given explicitly",
                ),
            ),
            (
                Some(Kubelet),
                true,
                false,
                m(
                    false,
                    "resourceRules removed from --adapter-config a.yaml: unused, the resource source is kubelet",
                ),
            ),
            (
                None,
                true,
                false,
                m(
                    true,
                    "resourceRules removed from --adapter-config a.yaml: CPU and memory now from the resourceQueries of --config; after a restart, the kubelets (--resource-source not given)",
                ),
            ),
            (
                Some(Prometheus),
                true,
                false,
                m(
                    true,
                    "resourceRules removed from --adapter-config a.yaml: CPU and memory now from the resourceQueries of --config",
                ),
            ),
            (
                Some(Prometheus),
                false,
                true,
                m(false, "resourceRules added to --adapter-config a.yaml: CPU and memory now from them"),
            ),
        ] {
            assert_eq!(change(flag, at_start, has_rules), expected, "{flag:?} {at_start} {has_rules}");
        }
    }

    #[test]
    fn the_serving_certificate_expiry_follows_the_pair_in_force() {
        apiserver::install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("percolator-server-expiry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 2031-01-02T00:00:00Z, then 2032-03-04T05:06:07Z.
        mk_pair(&dir, "first", 1_925_078_400);
        let cert = apiserver::ReloadingCert::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
        let metrics = Metrics::new(crate::METRICS_NAMESPACE);
        assert_eq!(expiry(&metrics), "0");
        export_serving_certificate_expiry(&cert, &metrics);
        assert_eq!(expiry(&metrics), "1925078400");
        mk_pair(&dir, "second", 1_961_989_567);
        assert!(cert.reload().unwrap());
        assert_eq!(expiry(&metrics), "1961989567");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
