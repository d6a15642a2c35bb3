//! The local demo (`percolator-sim demo`): a simulated cluster, a real Prometheus scraping it
//! with backfilled history, and percolator itself, all on loopback, with a `--config` file that
//! declares one kind of its own ([`DEMO_CONFIG`]); prints the kubeconfig and the kubectl
//! commands to try, and stops everything on Ctrl-C.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Parser;

use crate::devenv::{Prometheus, PrometheusOptions, ScrapeJob};

/// The demo's `--config`: the compiled-in queries, plus the kind `AppTraffic` declared here
/// (DESIGN §6.1), served as `kubectl get apptraffics`. The file is re-read while the demo runs.
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

/// Flags of the demo.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Directory for the demo's state (simulator PKI, Prometheus data, kubeconfig).
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
}

/// Runs the demo until `shutdown` resolves.
pub async fn run(
    args: DemoArgs,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    percolator::install_crypto_provider();
    // Start from a clean directory: Prometheus data from an earlier run would not match the
    // new simulator's counters.
    let _ = std::fs::remove_dir_all(&args.dir);
    std::fs::create_dir_all(&args.dir).with_context(|| format!("--dir {}", args.dir.display()))?;
    let dir = std::fs::canonicalize(&args.dir)?;

    let mut sim_config = crate::sim::SimConfig::with_state_dir(dir.join("sim"));
    sim_config.seed = args.seed;
    sim_config.nodes = args.nodes;
    sim_config.pods_per_node = args.pods_per_node;
    sim_config.churn_interval = Duration::from_secs(60);
    let sim = crate::sim::start(sim_config).await.context("starting the simulated cluster")?;
    eprintln!("simulated cluster: API {}, app metrics {}", sim.ready.api, sim.ready.metrics);

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
        jobs: vec![ScrapeJob {
            job: "sim-apps".into(),
            target,
            scheme: "http".into(),
            bearer_token: None,
            targets_file: None,
        }],
        scrape_interval: scrape,
        backfill: Some(history),
    })
    .await
    .context("starting Prometheus (install Debian's prometheus package)")?;
    prometheus.wait_for_targets(Duration::from_secs(60)).await?;
    eprintln!("prometheus: {}", prometheus.url());

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
        // Simulated nodes' Hostname addresses do not resolve; their InternalIPs do.
        "--kubelet-preferred-address-types=InternalIP".to_string(),
        "--kubelet-use-node-status-port".to_string(),
        // The demo cluster has no other external metrics provider.
        "--enable-external-metrics".to_string(),
        // Nothing balances traffic away from the demo: stop at once on Ctrl-C.
        "--shutdown-delay-duration=0s".to_string(),
    ];
    let percolator = percolator::server::prepare(percolator::config::Args::parse_from(flags)).await?;
    let address = percolator.local_addr()?;
    let kubeconfig = dir.join("kubeconfig");
    std::fs::write(
        &kubeconfig,
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: percolator-demo\n  cluster:\n    server: https://{address}\n    certificate-authority: {}\ncontexts:\n- name: percolator-demo\n  context: {{cluster: percolator-demo, user: demo}}\ncurrent-context: percolator-demo\nusers:\n- name: demo\n  user: {{token: carol-token}}\n",
            dir.join("certs/apiserver.crt").display()
        ),
    )?;
    let server = tokio::spawn(percolator.serve(shutdown));
    println!(
        "\npercolator is serving on https://{address}\n\nTry (CPU shows <none> for the first 20-30 s: it is a rate between two kubelet samples, taken ~10 s apart, and lists are cached 15 s):\n\n  export KUBECONFIG={kc}\n  kubectl get podmetricssummaries -A\n  kubectl get pms -n shop -o wide\n  kubectl get pms -A -l 'app in (web,api)'\n  kubectl get pms -n shop -o yaml\n  kubectl get brews -A -o wide\n  kubectl get percolator -A\n  kubectl explain pms.containers\n  kubectl explain cafebrewstats.brewDuration\n\nA kind declared in {config} (edit it: percolator reloads it within seconds):\n\n  kubectl get apptraffics -n shop\n  kubectl get atr -A -o wide\n  kubectl explain apptraffics.requestsPerSecond\n\nRaw API:\n\n  kubectl get --raw /apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries\n  kubectl get --raw /apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute\n\nOther users of the simulated cluster: alice-token (namespace shop only), bob-token (nothing),\nadmin-token (system:masters); e.g. kubectl --token=alice-token get pms -n api → Forbidden.\n\nGround truth of the simulator: curl -s {truth}/sim/truth\nPrometheus: {prom}\n\nCtrl-C stops everything.\n",
        kc = kubeconfig.display(),
        config = config.display(),
        truth = sim.ready.metrics,
        prom = prometheus.url(),
    );
    let _ = server.await;
    sim.shutdown().await;
    drop(prometheus);
    Ok(())
}

#[cfg(test)]
mod tests {
    use percolator::config::QueryFile;

    #[test]
    fn the_demo_configuration_declares_one_valid_kind() {
        let file =
            QueryFile::from_yaml(super::DEMO_CONFIG, "demo", &percolator::server::config_check()).unwrap();
        let kinds: Vec<(&str, Option<&str>)> =
            file.kinds.iter().map(|k| (k.kind.as_str(), k.plural.as_deref())).collect();
        assert_eq!(kinds, [("AppTraffic", Some("apptraffics"))]);
    }
}
