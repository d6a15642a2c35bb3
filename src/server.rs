//! The composition root: builds the sources, kinds, metric APIs, auth and TLS from the flags
//! ([`prepare`]) and serves them with the generic server (`apiserver::serve::serve`: TLS,
//! HTTP/1.1 and HTTP/2, the bounds on connections, the graceful shutdown on SIGTERM as
//! kube-apiserver's; [`serve`] runs the serving loop with the flags' defaults, for tests).

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use axum::Router;
use tokio::net::TcpListener;

use crate::adapter::LiveAdapter;
use crate::adapter::live::AdapterResourceQueries;
use crate::config::{Args, Check, LiveConfig, QueryFile, ResourceSource};
use crate::kinds::{Sources, registry};
use crate::metrics::custom::CustomMetrics;
use crate::metrics::external::ExternalMetrics;
use crate::sources::inventory::KubeInventory;
use crate::sources::kubelet::{KubeletClient, kubelet_config, warm_up_kubelets};
use crate::sources::prometheus::{ConnectionSettings, PromClient, Template};
use crate::sources::resource_source::{PlanSlot, ResourceSourceChoice};
use crate::sources::resources::{ConfigQueries, KubeletUsage, PromUsage};
use crate::sources::workloads::KubeWorkloads;
use crate::sources::{Inventory, KubeletSource, PromSource, UpstreamObserver, UsageSource};
use apiserver::serve::listener::{self, ServeConfig};
use apiserver::{ApiState, App, CacheSettings, Metrics, ServingArgs};

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
    app: App,
    serving: ServingArgs,
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
        apiserver::serve::serve(self.listener, self.tls, self.app, &self.serving, shutdown).await;
    }
}

/// Runs percolator with `args` until SIGTERM or Ctrl-C.
pub async fn run(args: Args) -> Result<(), StartError> {
    let prepared = prepare(args).await?;
    prepared.serve(apiserver::shutdown_signal()).await;
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
    crate::telemetry::register(&metrics);
    // Authentication starts before the registry exists (the trust is read first): its
    // metrics join the registry here.
    metrics.export_auth(auth.metrics());
    apiserver::export_serving_certificate_expiry(&serving_cert, &metrics);
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
    let mut kinds = registry::KindRegistry::new(&sources, &cache);
    if args.metric_apis.enable_resource_metrics {
        tracing::info!("serving metrics.k8s.io/v1beta1 (PodMetrics, NodeMetrics)");
        kinds = kinds.with_resource_metrics(&sources, &cache);
    }
    let reload_metrics = metrics.clone();
    config.spawn_reloader(CONFIG_POLL_INTERVAL, move |applied| {
        reload_metrics.config_reload(crate::telemetry::CONFIG_FILE, applied);
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
        .with_server_info(crate::kinds::server_info())
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
        crate::adapter::live::watch_resource_rules(
            adapter.clone(),
            path.to_path_buf(),
            resource_source.clone(),
            CONFIG_POLL_INTERVAL,
            had_rules,
        );
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
    let app = apiserver::app(state);

    let listener =
        listener::bind((args.serving.bind_address, args.serving.secure_port).into()).map_err(|source| {
            StartError::Bind { address: args.serving.bind_address, port: args.serving.secure_port, source }
        })?;
    let address = listener.local_addr().map_err(StartError::LocalAddress)?;
    tracing::info!(%address, window = %k8s_wire::duration::go_string(config.current().window), "serving");
    Ok(Prepared { listener, tls, app, serving: args.serving })
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
    let file = crate::telemetry::ADAPTER_CONFIG_FILE;
    metrics.config_loaded(file);
    let reload_metrics = metrics.clone();
    adapter.spawn(CONFIG_POLL_INTERVAL, args.metrics_relist_interval, move |applied| {
        reload_metrics.config_reload(file, applied);
    });
    Ok(adapter)
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
