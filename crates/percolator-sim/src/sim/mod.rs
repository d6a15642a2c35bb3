//! `percolator-sim`: a simulated Kubernetes cluster on loopback, in the real wire formats,
//! for the demo, the tests and the benchmarks (docs/design.md, "The simulated cluster").
//!
//! It serves, from one deterministic workload ([`workload`]):
//! - a Kubernetes API subset over HTTPS (`api`): nodes, pods and the workload objects
//!   derived from the pods (Deployments, ReplicaSets, StatefulSets, DaemonSets, Services;
//!   `controllers`), get/list/watch;
//! - one kubelet per node over HTTPS (`kubelet`): `GET /metrics/resource`;
//! - the apps' and cafes' ([`cafe`]) metrics and the control endpoints over HTTP (`apps`): `/metrics`,
//!   `/sim/history`, `/sim/truth`, `/sim/stats`, `POST /sim/churn`,
//!   `POST /sim/rotate-front-proxy-ca`, `GET`/`POST /sim/faults` (fault injection, [`faults`]);
//!   with `--cadvisor`, `/metrics` and `/sim/history` also carry the cAdvisor and node series
//!   a real cluster's Prometheus scrapes from the kubelets ([`cadvisor`]), equal to what the
//!   simulated kubelets serve;
//! - kube-apiserver's part in delegated authentication and authorization (docs/wire.md, "Delegated authentication and authorization"): the
//!   trust ConfigMap `kube-system/extension-apiserver-authentication` (get/list/watch) built
//!   from a generated client CA and front-proxy CA (`trust`), and TokenReview and
//!   SubjectAccessReview answered from a [`policy::Policy`] (`reviews`).
//! - kube-aggregator's part (`aggregator`): once percolator is registered
//!   ([`RunningSim::register_api_service`]), its groups are proxied with the front-proxy
//!   client certificate and the caller's identity, and discovery (`/apis`, `/openapi/v3`) is
//!   merged, so kubectl talks to the simulated API as to a real cluster (the demo).
//!
//! [`start`] binds everything, writes `ca.crt`, `token`, `kubeconfig`, `sim.json` and the
//! authentication PKI (`client-ca.*`, `front-proxy-*`, `users/*`, `bad/*`; see `trust`) into
//! the state directory and returns a [`RunningSim`]; [`run`] also prints the ready line and
//! serves until its shutdown future resolves.

mod aggregator;
mod api;
mod apps;
mod cadvisor;
mod cafe;
mod cluster;
mod controllers;
mod faults;
mod kubelet;
mod objects;
mod pki;
mod policy;
mod reviews;
mod rng;
mod selector;
mod serve;
#[cfg(test)]
mod testutil;
mod text;
mod trust;
mod workload;

use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

pub use self::aggregator::AggregationError;
pub use self::pki::PkiError;
pub use self::policy::{Policy, PolicyError};

use self::cluster::Cluster;
use self::serve::Shutdown;
use self::workload::{ORIGIN_OFFSET_SECONDS, Workload, WorkloadParams};

/// Flags of `percolator-sim`.
#[derive(Debug, Clone, clap::Args)]
pub struct SimConfig {
    /// Seed of the workload: the same seed gives the same nodes, pods, names and rates.
    #[arg(long, env = "PERCOLATOR_SIM_SEED", default_value_t = 1)]
    pub seed: u64,

    /// Number of simulated nodes (each gets a kubelet on its own 127.1.x.y address).
    #[arg(long, env = "PERCOLATOR_SIM_NODES", default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=64_000))]
    pub nodes: u32,

    /// Pods per node.
    #[arg(long, env = "PERCOLATOR_SIM_PODS_PER_NODE", default_value_t = 4)]
    pub pods_per_node: u32,

    /// Cafes (apps that brew coffee and export the cafe metrics) per namespace, each with 1–3
    /// serving pods on top of the pods per node (0: none).
    #[arg(long, env = "PERCOLATOR_SIM_CAFES_PER_NAMESPACE", default_value_t = 2, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub cafes_per_namespace: u32,

    /// Namespaces the pods are spread over (comma-separated).
    #[arg(
        long,
        env = "PERCOLATOR_SIM_NAMESPACES",
        value_delimiter = ',',
        default_value = "shop,api,default"
    )]
    pub namespaces: Vec<String>,

    /// Directory for ca.crt, token, kubeconfig and sim.json (created if missing).
    #[arg(long, env = "PERCOLATOR_SIM_STATE_DIR")]
    pub state_dir: PathBuf,

    /// Address the Kubernetes API and the metrics/control listener bind (the API's serving
    /// certificate names it too). Loopback by default; an interface's address lets the
    /// simulator be reached from another network namespace.
    #[arg(long, env = "PERCOLATOR_SIM_BIND_ADDRESS", default_value_t = Ipv4Addr::LOCALHOST)]
    pub bind_address: Ipv4Addr,

    /// InternalIP of node-0; node i gets this address plus i, and its kubelet listens there.
    /// Unset: `127.1.(i/250).(i%250+1)`, on loopback.
    #[arg(long, env = "PERCOLATOR_SIM_NODE_IP_START")]
    pub node_ip_start: Option<Ipv4Addr>,

    /// Port of the Kubernetes API on --bind-address (0: pick a free one).
    #[arg(long, env = "PERCOLATOR_SIM_API_PORT", default_value_t = 0)]
    pub api_port: u16,

    /// Port of every kubelet, each on its node's InternalIP (0: pick a free one).
    #[arg(long, env = "PERCOLATOR_SIM_KUBELET_PORT", default_value_t = 0)]
    pub kubelet_port: u16,

    /// Port of the apps' /metrics and the /sim/* control endpoints on --bind-address (0: pick).
    #[arg(long, env = "PERCOLATOR_SIM_METRICS_PORT", default_value_t = 0)]
    pub metrics_port: u16,

    /// Kubelet sampling period (cAdvisor housekeeping), e.g. 10s.
    #[arg(long, env = "PERCOLATOR_SIM_HOUSEKEEPING", default_value = "10s", value_parser = k8s_wire::duration::parse)]
    pub housekeeping: Duration,

    /// Every interval, delete one running pod and create a replacement (0: never).
    #[arg(long, env = "PERCOLATOR_SIM_CHURN_INTERVAL", default_value = "0", value_parser = k8s_wire::duration::parse)]
    pub churn_interval: Duration,

    /// YAML file of tokens and authorization rules for TokenReview and SubjectAccessReview
    /// (default: the built-in policy; format in crates/percolator-sim/src/sim/policy.rs).
    #[arg(long, env = "PERCOLATOR_SIM_POLICY")]
    pub policy: Option<PathBuf>,

    /// Also serve the cAdvisor and node usage series on the metrics listener's /metrics and
    /// /sim/history (for percolator's --resource-source=prometheus).
    ///
    /// The series a real cluster's Prometheus has from the kubelets' cAdvisor and
    /// /metrics/resource jobs, equal to what the simulated kubelets serve:
    /// container_cpu_usage_seconds_total and container_memory_working_set_bytes per container,
    /// pod sandbox (container="POD"), pod cgroup and node root cgroup (id="/");
    /// node_cpu_usage_seconds_total and node_memory_working_set_bytes per node. Off by default:
    /// it adds 6 to 8 series per pod.
    #[arg(long, env = "PERCOLATOR_SIM_CADVISOR")]
    pub cadvisor: bool,
}

impl SimConfig {
    /// The default configuration (as with no flags) writing into `state_dir`: 3 nodes × 4
    /// pods, 2 cafes per namespace, seed 1, on loopback, ports picked by the system, churn off,
    /// no cAdvisor series. Handy for in-process tests.
    pub fn with_state_dir(state_dir: impl Into<PathBuf>) -> Self {
        Self {
            seed: 1,
            nodes: 3,
            pods_per_node: 4,
            cafes_per_namespace: 2,
            namespaces: vec!["shop".into(), "api".into(), "default".into()],
            state_dir: state_dir.into(),
            bind_address: Ipv4Addr::LOCALHOST,
            node_ip_start: None,
            api_port: 0,
            kubelet_port: 0,
            metrics_port: 0,
            housekeeping: Duration::from_secs(10),
            churn_interval: Duration::ZERO,
            policy: None,
            cadvisor: false,
        }
    }

    /// The workload these flags ask for.
    fn workload_params(&self) -> WorkloadParams {
        WorkloadParams {
            seed: self.seed,
            nodes: self.nodes,
            pods_per_node: self.pods_per_node,
            namespaces: self.namespaces.clone(),
            cafes_per_namespace: self.cafes_per_namespace,
        }
    }
}

/// A simulator error.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A flag value is invalid.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// Binding a listener failed.
    #[error("cannot listen on {addr}: {source}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        source: std::io::Error,
        /// Advice (e.g. raise `ulimit -n`).
        hint: &'static str,
    },
    /// Writing a state file failed.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// Generating certificates or TLS configuration failed.
    #[error(transparent)]
    Pki(#[from] PkiError),
    /// The `--policy` file is unreadable or invalid.
    #[error("--policy: {0}")]
    Policy(#[from] PolicyError),
}

/// Result of simulator operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// What the simulator announces once it serves (printed as one JSON line and written to
/// `<state-dir>/sim.json`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Ready {
    /// Always `ready`.
    pub event: String,
    /// The state directory.
    pub state_dir: PathBuf,
    /// Kubernetes API base URL, `https://<bind address>:P`.
    pub api: String,
    /// Metrics/control base URL, `http://<bind address>:M`.
    pub metrics: String,
    /// The port every kubelet listens on.
    pub kubelet_port: u16,
}

/// A started simulator: listeners bound, files written, serving in background tasks.
pub struct RunningSim {
    /// Addresses and paths.
    pub ready: Ready,
    /// Path of the written kubeconfig.
    pub kubeconfig: PathBuf,
    /// The cluster, for in-process tests.
    #[cfg(test)]
    cluster: Arc<Cluster>,
    /// The trust material, for in-process tests.
    #[cfg(test)]
    trust: Arc<trust::Trust>,
    aggregation: Arc<aggregator::Registry>,
    trigger: watch::Sender<bool>,
    tasks: JoinSet<()>,
}

impl RunningSim {
    /// Aggregates the extension API server at `url` (`https://host:port`, its serving
    /// certificate verified by `ca_pem`) into the simulated API, as an `APIService` for each
    /// group its `/apis` lists does in kube-apiserver ([`aggregator`]); returns the groups.
    /// The server must trust the state directory's front-proxy CA (as percolator does through
    /// the `extension-apiserver-authentication` ConfigMap).
    ///
    /// # Errors
    /// The front-proxy client files or `ca_pem` are invalid, or the server's `/apis` cannot be
    /// read.
    pub async fn register_api_service(
        &self,
        url: &str,
        ca_pem: &[u8],
    ) -> Result<Vec<String>, AggregationError> {
        let dir = &self.ready.state_dir;
        let read = |name: &str| {
            std::fs::read(dir.join(name))
                .map_err(|e| AggregationError::Tls(format!("{}: {e}", dir.join(name).display())))
        };
        let (cert, key) = (read("front-proxy-client.crt")?, read("front-proxy-client.key")?);
        self.aggregation.register(url, ca_pem, &cert, &key).await
    }

    /// Stops serving and waits for the listeners to close.
    pub async fn shutdown(mut self) {
        let _ = self.trigger.send(true);
        while self.tasks.join_next().await.is_some() {}
    }
}

fn validate(config: &SimConfig) -> Result<()> {
    if config.namespaces.is_empty() {
        return Err(Error::Config("--namespaces must name at least one namespace".into()));
    }
    for ns in &config.namespaces {
        let ok = !ns.is_empty()
            && ns.len() <= 63
            && ns.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !ns.starts_with('-')
            && !ns.ends_with('-');
        if !ok {
            return Err(Error::Config(format!("--namespaces: {ns:?} is not a valid DNS-1123 label")));
        }
    }
    let mut unique = config.namespaces.clone();
    unique.sort();
    unique.dedup();
    if unique.len() != config.namespaces.len() {
        return Err(Error::Config("--namespaces lists a namespace twice".into()));
    }
    if config.housekeeping < Duration::from_millis(1) {
        return Err(Error::Config("--housekeeping must be at least 1ms".into()));
    }
    if let Some(first) = config.node_ip_start
        && u32::from(first).checked_add(config.nodes.saturating_sub(1)).is_none()
    {
        return Err(Error::Config(format!(
            "--node-ip-start: {first} leaves no address for the last of {} nodes",
            config.nodes
        )));
    }
    Ok(())
}

async fn bind(addr: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(addr).await.map_err(|source| {
        let hint = if source.raw_os_error() == Some(24) {
            " (too many open files: raise `ulimit -n` above the node count plus connections)"
        } else {
            ""
        };
        Error::Bind { addr, source, hint }
    })
}

/// Binds one listener per node on `port` (0: a port free on every node's address).
async fn bind_kubelets(ips: &[Ipv4Addr], port: u16) -> Result<(Vec<TcpListener>, u16)> {
    // With port 0 the kernel picks a port free on node-0's address; another process may
    // hold it on another 127.1.x.y, so retry with a fresh port a few times.
    let attempts = if port == 0 { 8 } else { 1 };
    let mut last_error = None;
    for _ in 0..attempts {
        let Some(first_ip) = ips.first() else {
            return Ok((Vec::new(), port));
        };
        let first = bind(SocketAddr::from((*first_ip, port))).await?;
        let chosen = first.local_addr().map(|a| a.port()).unwrap_or(port);
        let mut listeners = Vec::with_capacity(ips.len());
        listeners.push(first);
        let mut failed = None;
        for ip in ips.iter().skip(1) {
            match bind(SocketAddr::from((*ip, chosen))).await {
                Ok(l) => listeners.push(l),
                Err(e) => {
                    failed = Some(e);
                    break;
                }
            }
        }
        match failed {
            None => return Ok((listeners, chosen)),
            Some(e @ Error::Bind { hint, .. }) if !hint.is_empty() => return Err(e),
            Some(e) => last_error = Some(e),
        }
    }
    Err(last_error.unwrap_or_else(|| Error::Config("cannot bind the kubelets".into())))
}

/// Writes `contents` to `path` atomically (a sibling temporary file, then a rename), mode
/// 0600 when `private`.
pub(crate) fn write_file(path: &Path, contents: &[u8], private: bool) -> Result<()> {
    let err = |source| Error::Write { path: path.to_owned(), source };
    // Write then rename, so a reader polling for the file never sees half of it. The
    // temporary name keeps the whole file name: `a.crt` and `a.key` never share one.
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.tmp"));
    std::fs::write(&tmp, contents).map_err(err)?;
    if private {
        use std::os::unix::fs::PermissionsExt as _;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
    }
    std::fs::rename(&tmp, path).map_err(err)
}

/// Starts the simulator: generates the workload and PKI, binds every listener, writes the
/// state files and serves in background tasks.
///
/// # Errors
/// Invalid flags, a port that cannot be bound, or a state file that cannot be written.
pub async fn start(config: SimConfig) -> Result<RunningSim> {
    validate(&config)?;
    let policy = Arc::new(Policy::load(config.policy.as_deref())?);
    let start_s = cluster::now().floor() as i64;
    let origin = (start_s - ORIGIN_OFFSET_SECONDS) as f64;
    let mut workload = Workload::generate(&config.workload_params(), start_s);
    if let Some(first) = config.node_ip_start {
        // `validate` made sure the last node's address exists.
        for node in &mut workload.nodes {
            node.ip = Ipv4Addr::from(u32::from(first).saturating_add(node.index));
        }
    }
    let pki = Arc::new(pki::Pki::new(workload.nodes.len())?);

    let api_listener = bind(SocketAddr::from((config.bind_address, config.api_port))).await?;
    let metrics_listener = bind(SocketAddr::from((config.bind_address, config.metrics_port))).await?;
    let ips: Vec<Ipv4Addr> = workload.nodes.iter().map(|n| n.ip).collect();
    let (kubelet_listeners, kubelet_port) = bind_kubelets(&ips, config.kubelet_port).await?;
    let local = |l: &TcpListener| {
        l.local_addr().map_err(|source| Error::Bind {
            addr: SocketAddr::from((config.bind_address, 0)),
            source,
            hint: "",
        })
    };
    let api_addr = local(&api_listener)?;
    let metrics_addr = local(&metrics_listener)?;

    let housekeeping_ms = u64::try_from(config.housekeeping.as_millis()).unwrap_or(u64::MAX);
    let cluster = Arc::new(Cluster::new(workload, config.seed, origin, housekeeping_ms, kubelet_port));

    // State files, before anything is announced.
    let dir_error = |source| Error::Write { path: config.state_dir.clone(), source };
    std::fs::create_dir_all(&config.state_dir).map_err(dir_error)?;
    let dir = &std::fs::canonicalize(&config.state_dir).map_err(dir_error)?;
    let api_url = format!("https://{api_addr}");
    let kubeconfig = dir.join("kubeconfig");
    write_file(&dir.join("ca.crt"), pki.ca_pem().as_bytes(), false)?;
    write_file(&dir.join("token"), cluster.token.as_bytes(), true)?;
    write_file(&kubeconfig, pki::kubeconfig(&api_url, pki.ca_pem(), &cluster.token).as_bytes(), true)?;
    let trust = Arc::new(trust::Trust::create(dir)?);
    trust.publish(&cluster);
    let ready = Ready {
        event: "ready".into(),
        state_dir: dir.to_path_buf(),
        api: api_url,
        metrics: format!("http://{metrics_addr}"),
        kubelet_port,
    };
    let ready_json = serde_json::to_vec(&ready).unwrap_or_default();
    write_file(&dir.join("sim.json"), &ready_json, false)?;

    // Serve.
    let (trigger, shutdown) = Shutdown::new();
    let mut tasks = JoinSet::new();
    let aggregation = Arc::new(aggregator::Registry::default());
    let api_state = api::ApiState {
        cluster: Arc::clone(&cluster),
        address: api_addr.to_string(),
        policy: Arc::clone(&policy),
    };
    let api_router = aggregator::layer(api::router(api_state.clone()), api_state, Arc::clone(&aggregation));
    // The API can be made unreachable (`{"api": "down"}`, [`faults`]).
    let resets = Arc::clone(&cluster);
    tasks.spawn(serve::serve_tls_unless_down(
        api_listener,
        pki.api_config(config.bind_address)?,
        api_router,
        shutdown.clone(),
        cluster.faults.api_changes(),
        Arc::new(move || resets.faults.count_api_reset()),
    ));
    let apps_router = apps::router(apps::AppState {
        cluster: Arc::clone(&cluster),
        exporters: apps::exporters(config.cadvisor),
        instance: metrics_addr.to_string(),
    })
    .merge(trust::control_router(Arc::clone(&cluster), Arc::clone(&trust)))
    .merge(faults::control_router(Arc::clone(&cluster)));
    tasks.spawn(serve::serve_plain(metrics_listener, apps_router, shutdown.clone()));
    for (index, listener) in kubelet_listeners.into_iter().enumerate() {
        tasks.spawn(kubelet::serve(
            listener,
            index as u32,
            Arc::clone(&cluster),
            Arc::clone(&pki),
            shutdown.clone(),
        ));
    }
    if !config.churn_interval.is_zero() {
        let cluster = Arc::clone(&cluster);
        let every = config.churn_interval;
        let mut shutdown = shutdown.clone();
        tasks.spawn(async move {
            let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
            loop {
                tokio::select! {
                    () = shutdown.wait() => break,
                    _ = ticker.tick() => {
                        let _ = apps::churn_json(&cluster);
                    }
                }
            }
        });
    }
    tracing::info!(
        api = %ready.api,
        metrics = %ready.metrics,
        kubelet_port,
        nodes = cluster.nodes.len(),
        pods = cluster.all_pods().len(),
        cafes = cluster.cafes.len(),
        "percolator-sim serving"
    );
    Ok(RunningSim {
        ready,
        kubeconfig,
        #[cfg(test)]
        cluster,
        #[cfg(test)]
        trust,
        aggregation,
        trigger,
        tasks,
    })
}

/// Runs the simulator until `shutdown` resolves: [`start`], then prints the ready line
/// (`{"event":"ready",…}`) on stdout.
///
/// # Errors
/// As [`start`].
pub async fn run(config: SimConfig, shutdown: impl Future<Output = ()>) -> Result<()> {
    let sim = start(config).await?;
    let line = serde_json::to_string(&sim.ready).unwrap_or_default();
    {
        use std::io::Write as _;
        let mut stdout = std::io::stdout().lock();
        // Nothing useful to do if stdout is closed: the files carry the same information.
        let _ = writeln!(stdout, "{line}");
        let _ = stdout.flush();
    }
    shutdown.await;
    tracing::info!("percolator-sim shutting down");
    sim.shutdown().await;
    Ok(())
}

#[cfg(test)]
mod tests;
