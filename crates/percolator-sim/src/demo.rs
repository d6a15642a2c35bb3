//! The local demo (`percolator-sim demo`): a simulated cluster, a real Prometheus scraping it
//! with backfilled history, and percolator itself, all on loopback, with a `--config` file that
//! declares one kind of its own ([`DEMO_CONFIG`]) and serves resource, custom and external
//! metrics. The simulated kube-apiserver aggregates percolator's groups (as `APIService`s do),
//! so kubectl talks to it as to a real cluster (`kubectl top nodes` needs both). Once the data
//! is there it prints one block of commands (checked by `tests/e2e_demo.rs`); logs go to files
//! in the demo directory and the terminal only shows warnings and errors. Ctrl-C stops
//! everything.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::devenv::{Prometheus, PrometheusOptions, ScrapeJob};

/// The demo's `--config`: the compiled-in queries, plus the kind `AppTraffic` declared here
/// (docs/reference/kinds.md), served as `kubectl get apptraffics`. The file is re-read while the demo runs.
pub const DEMO_CONFIG: &str = r#"# percolator's --config in the demo. Edit it while the demo runs: percolator re-reads it
# within seconds (an invalid edit is rejected and logged, and the last good one stays).
kinds:
- kind: AppTraffic                 # kubectl get apptraffics (or atr)
  shortNames: [atr]
  nameLabel: pod                   # one object per value of this label in the results
  description: HTTP traffic per pod, from Prometheus.
  fields:
  - name: requestsPerSecond
    query: sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))
    column: REQ/S
    description: Requests per second over the window.
  - name: errorsPerSecond
    query: sum by (namespace, pod) (rate(http_requests_total{code=~"5..",SCOPE}[WINDOW]))
    column: ERR/S
    description: 5xx responses per second over the window.
  - name: errorRatio
    query: sum by (namespace, pod) (rate(http_requests_total{code=~"5..",SCOPE}[WINDOW])) / sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))
    format: percent
    column: ERROR%
    wide: true
    description: 5xx responses over all responses.
"#;

/// Where the demo's metrics of pods and nodes come from (percolator's `--resource-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ResourceSource {
    /// percolator scrapes the simulated kubelets' `/metrics/resource`.
    Kubelet,
    /// percolator queries Prometheus, which scrapes the simulator's cAdvisor series.
    Prometheus,
}

impl ResourceSource {
    fn flag(self) -> &'static str {
        match self {
            Self::Kubelet => "kubelet",
            Self::Prometheus => "prometheus",
        }
    }
}

/// Flags of the demo.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Directory for the demo's state (simulator PKI, Prometheus data, kubeconfig, logs).
    #[arg(long, default_value = ".demo")]
    pub dir: PathBuf,
    /// Simulated nodes.
    #[arg(long, default_value_t = 3)]
    pub nodes: u32,
    /// Pods per simulated node.
    #[arg(long, default_value_t = 5)]
    pub pods_per_node: u32,
    /// Workload seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// HTTPS port of percolator (0 picks one).
    #[arg(long, default_value_t = 8443)]
    pub port: u16,
    /// HTTPS port of the simulated kube-apiserver, which kubectl talks to (0 picks one).
    #[arg(long, default_value_t = 6443)]
    pub api_port: u16,
    /// Source of the pods' and nodes' CPU and memory (`kubectl top`, PodMetricsSummary).
    #[arg(long, value_enum, default_value_t = ResourceSource::Kubelet)]
    pub resource_source: ResourceSource,
    /// Log verbosity of the log files, as percolator's `--v` (0 warnings, 1-2 info, 3-4 debug).
    #[arg(long = "v", default_value_t = 2)]
    pub verbosity: u8,
}

/// Empties `--dir` (Prometheus data from an earlier run would not match the new simulator's
/// counters) and returns its absolute path.
///
/// # Errors
/// The directory cannot be made.
pub fn prepare_dir(args: &DemoArgs) -> anyhow::Result<PathBuf> {
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
    Ok(std::fs::canonicalize(&args.dir)?)
}

/// Logs of percolator (`<dir>/percolator.log`) and of the simulator (`<dir>/sim.log`) at
/// `verbosity`; the terminal only gets warnings and errors (coloured on a terminal), so the
/// instructions stay readable.
///
/// # Errors
/// A log file cannot be created.
pub fn init_logging(dir: &Path, verbosity: u8) -> anyhow::Result<()> {
    use std::io::IsTerminal as _;
    use tracing_subscriber::Layer as _;
    use tracing_subscriber::filter::{LevelFilter, Targets};
    use tracing_subscriber::layer::SubscriberExt as _;
    use tracing_subscriber::util::SubscriberInitExt as _;

    let level = match verbosity {
        0 => LevelFilter::WARN,
        1 | 2 => LevelFilter::INFO,
        3 | 4 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    };
    let file = |name: &str| -> anyhow::Result<Arc<std::fs::File>> {
        let path = dir.join(name);
        Ok(Arc::new(std::fs::File::create(&path).with_context(|| format!("creating {}", path.display()))?))
    };
    // "percolator" is also a prefix of "percolator_sim": the longer target wins.
    let percolator = Targets::new()
        .with_default(LevelFilter::WARN)
        .with_target("percolator", level)
        .with_target("apiserver", level)
        .with_target("k8s_wire", level)
        .with_target("percolator_sim", LevelFilter::OFF);
    let sim = Targets::new().with_default(LevelFilter::OFF).with_target("percolator_sim", level);
    tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(false)
                .with_writer(file(PERCOLATOR_LOG)?)
                .with_filter(percolator),
        )
        .with(tracing_subscriber::fmt::layer().with_ansi(false).with_writer(file(SIM_LOG)?).with_filter(sim))
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(std::io::stderr().is_terminal())
                .with_writer(std::io::stderr)
                .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
                    *meta.level() <= tracing::Level::WARN && !STOPPING.load(Ordering::Relaxed)
                })),
        )
        .try_init()?;
    Ok(())
}

/// Set once the demo stops: the complaints of parts losing each other while going down
/// (watches cut, connections refused) then go to the log files only.
static STOPPING: AtomicBool = AtomicBool::new(false);

/// percolator's log file in the demo directory.
const PERCOLATOR_LOG: &str = "percolator.log";
/// The simulator's log file in the demo directory.
const SIM_LOG: &str = "sim.log";

/// How long the demo waits for the first data before printing the commands anyway.
const DATA_TIMEOUT: Duration = Duration::from_secs(120);

/// Runs the demo in `dir` (from [`prepare_dir`]) until `shutdown` resolves.
pub async fn run(
    args: DemoArgs,
    dir: PathBuf,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    apiserver::install_crypto_provider();
    let mut sim_config = crate::sim::SimConfig::with_state_dir(dir.join("sim"));
    sim_config.seed = args.seed;
    sim_config.nodes = args.nodes;
    sim_config.pods_per_node = args.pods_per_node;
    sim_config.api_port = args.api_port;
    sim_config.churn_interval = Duration::from_secs(60);
    sim_config.cadvisor = args.resource_source == ResourceSource::Prometheus;
    let sim = crate::sim::start(sim_config).await.context("starting the simulated cluster")?;

    let scrape = Duration::from_secs(5);
    let target = sim.ready.metrics.trim_start_matches("http://").to_string();
    let history = crate::devenv::sim_history(
        &sim.ready.metrics,
        "sim-apps",
        &target,
        Duration::from_secs(1800),
        scrape,
    )
    .await?;
    let prometheus = Prometheus::start(PrometheusOptions {
        dir: dir.join("prometheus"),
        jobs: vec![ScrapeJob::http("sim-apps", target)],
        scrape_interval: scrape,
        backfill: Some(history),
    })
    .await
    .context("starting Prometheus (install Debian's prometheus package)")?;
    prometheus.wait_for_targets(Duration::from_secs(60)).await?;

    let config = dir.join("config.yaml");
    std::fs::write(&config, DEMO_CONFIG).with_context(|| format!("writing {}", config.display()))?;
    let flags = [
        "percolator".to_string(),
        format!("--secure-port={}", args.port),
        "--bind-address=127.0.0.1".to_string(),
        format!("--cert-dir={}", dir.join("certs").display()),
        format!("--kubeconfig={}", sim.kubeconfig.display()),
        format!("--prometheus-url={}", prometheus.url()),
        format!("--config={}", config.display()),
        format!("--v={}", args.verbosity),
        // Simulated nodes' Hostname addresses do not resolve; their InternalIPs do.
        "--kubelet-preferred-address-types=InternalIP".to_string(),
        "--kubelet-use-node-status-port".to_string(),
        format!("--resource-source={}", args.resource_source.flag()),
        // The demo cluster has no metrics-server, prometheus-adapter or KEDA: percolator
        // serves all three metrics APIs.
        "--enable-resource-metrics".to_string(),
        "--enable-custom-metrics".to_string(),
        "--enable-external-metrics".to_string(),
        // Nothing balances traffic away from the demo: stop at once on Ctrl-C.
        "--shutdown-delay-duration=0s".to_string(),
    ];
    let percolator = percolator::prepare(percolator::config::Args::parse_from(flags)).await?;
    let address = percolator.local_addr()?;
    let server = tokio::spawn(percolator.serve(async move {
        shutdown.await;
        STOPPING.store(true, Ordering::Relaxed);
    }));

    // The simulated kube-apiserver aggregates percolator's groups, as an APIService would.
    let ca = std::fs::read(dir.join("certs/apiserver.crt")).context("percolator's serving certificate")?;
    let percolator_url = format!("https://{address}");
    let mut attempt = 0;
    let groups = loop {
        match sim.register_api_service(&percolator_url, &ca).await {
            Ok(groups) => break groups,
            Err(e) if attempt < 50 => {
                tracing::debug!(error = %e, "percolator not ready yet");
                attempt += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e).context("aggregating percolator's API groups"),
        }
    };
    tracing::info!(?groups, percolator = %percolator_url, "aggregated");

    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: percolator-demo\n  cluster:\n    server: {api}\n    certificate-authority: {ca}\ncontexts:\n- name: percolator-demo\n  context: {{cluster: percolator-demo, user: demo}}\ncurrent-context: percolator-demo\nusers:\n- name: demo\n  user: {{token: carol-token}}\n",
            api = sim.ready.api,
            ca = sim.ready.state_dir.join("ca.crt").display(),
        ),
    )?;

    let names = demo_names(&sim.ready.metrics).await?;
    if let Err(e) = wait_for_data(&sim.ready, &names, args.nodes).await {
        tracing::warn!("{e}; the commands below may show no data yet");
    }
    let prometheus_log = std::fs::read_dir(dir.join("prometheus"))
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        // Prometheus' own log (prometheus-<port>.log), not its query log (query.log).
        .find(|p| {
            p.extension().is_some_and(|x| x == "log")
                && p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("prometheus-"))
        })
        .unwrap_or_else(|| dir.join("prometheus"));
    let block = commands(&kubeconfig, &names);
    println!(
        "\npercolator demo: a simulated cluster whose kube-apiserver ({api}) aggregates percolator ({percolator_url}),\nwith Prometheus ({prom}). Logs: {plog}, {slog}, {prometheus_log}.\nAs user carol (a viewer), then as alice (may read namespace shop only: the second command is refused)\nand bob (may read nothing: refused):\n\n{block}\n\nEdit {config}: percolator reloads its kinds and queries within seconds. Ctrl-C stops everything.",
        api = sim.ready.api,
        prom = prometheus.url(),
        plog = dir.join(PERCOLATOR_LOG).display(),
        slog = dir.join(SIM_LOG).display(),
        prometheus_log = prometheus_log.display(),
        config = config.display(),
    );
    {
        use std::io::Write as _;
        let _ = std::io::stdout().flush();
    }
    let _ = server.await;
    sim.shutdown().await;
    drop(prometheus);
    Ok(())
}

/// Names the printed commands use, taken from the simulator's ground truth so they exist.
struct DemoNames {
    /// A Deployment of `shop` that serves HTTP (not a cafe).
    deployment: String,
}

async fn demo_names(sim_metrics: &str) -> anyhow::Result<DemoNames> {
    let truth: serde_json::Value =
        reqwest::get(format!("{sim_metrics}/sim/truth")).await?.error_for_status()?.json().await?;
    let cafes: Vec<&str> =
        truth["cafes"].as_array().into_iter().flatten().filter_map(|c| c["name"].as_str()).collect();
    let deployment = truth["workloads"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|w| w["resource"] == "deployments.apps" && w["namespace"] == "shop")
        .filter(|w| w["pods"].as_array().is_some_and(|p| !p.is_empty()))
        .filter_map(|w| w["name"].as_str())
        .find(|name| !cafes.contains(name))
        .context("the simulated cluster has no Deployment in namespace shop")?;
    Ok(DemoNames { deployment: deployment.to_owned() })
}

/// The commands to try, one per line, runnable as printed.
fn commands(kubeconfig: &Path, names: &DemoNames) -> String {
    let lines = [
        format!("export KUBECONFIG={}", kubeconfig.display()),
        "kubectl top pods -A".into(),
        "kubectl top nodes".into(),
        "kubectl get pms -n shop -o wide".into(),
        "kubectl get pms -A -l 'app in (web,api)'".into(),
        "kubectl get apptraffics -n shop".into(),
        "kubectl explain pms.containers".into(),
        format!(
            "kubectl get --raw /apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/deployments.apps/{}/http_requests_per_second",
            names.deployment
        ),
        "kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute"
            .into(),
        "kubectl --token=alice-token get pms -n shop".into(),
        "kubectl --token=alice-token get pms -n api || true".into(),
        "kubectl --token=bob-token get pms -n shop || true".into(),
    ];
    lines.iter().map(|l| format!("  {l}")).collect::<Vec<_>>().join("\n")
}

/// Waits until what the commands show is there: CPU of every node (two kubelet samples),
/// pods of shop, the custom and the external metric.
async fn wait_for_data(ready: &crate::sim::Ready, names: &DemoNames, nodes: u32) -> anyhow::Result<()> {
    let ca = std::fs::read(ready.state_dir.join("ca.crt"))?;
    let client = reqwest::Client::builder().tls_certs_only([reqwest::Certificate::from_pem(&ca)?]).build()?;
    let get = |path: String| {
        let request = client.get(format!("{}{path}", ready.api)).bearer_auth("carol-token");
        async move {
            let response = request.send().await.ok()?;
            if !response.status().is_success() {
                return None;
            }
            response.json::<serde_json::Value>().await.ok()
        }
    };
    let count =
        |v: Option<serde_json::Value>| v.and_then(|v| v["items"].as_array().map(Vec::len)).unwrap_or(0);
    let deadline = tokio::time::Instant::now() + DATA_TIMEOUT;
    loop {
        let nodes_ok = count(get("/apis/metrics.k8s.io/v1beta1/nodes".into()).await) >= nodes as usize;
        let pods_ok = count(get("/apis/metrics.k8s.io/v1beta1/namespaces/shop/pods".into()).await) > 0;
        let custom_ok = get(format!(
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/deployments.apps/{}/http_requests_per_second",
            names.deployment
        ))
        .await
        .is_some();
        let external_ok = count(
            get("/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute".into()).await,
        ) > 0;
        if nodes_ok && pods_ok && custom_ok && external_ok {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "no complete data after {}s (node metrics {nodes_ok}, pod metrics {pods_ok}, custom {custom_ok}, external {external_ok})",
                DATA_TIMEOUT.as_secs()
            );
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

#[cfg(test)]
mod tests {
    use percolator::config::QueryFile;

    #[test]
    fn the_demo_configuration_declares_one_valid_kind() {
        let file = QueryFile::from_yaml(super::DEMO_CONFIG, "demo", &percolator::config_check()).unwrap();
        let kinds: Vec<(&str, Option<&str>)> =
            file.kinds.iter().map(|k| (k.kind.as_str(), k.plural.as_deref())).collect();
        assert_eq!(kinds, [("AppTraffic", Some("apptraffics"))]);
    }
}
