//! `percolator-sim`: a simulated Kubernetes cluster (API, kubelets, app metrics) on
//! loopback. Prints one `{"event":"ready",…}` JSON line on stdout once serving; logs go to
//! stderr. `percolator-sim demo` runs the whole local demo (simulator, Prometheus,
//! percolator). The modules are the `percolator_sim` library's.

use clap::{Parser, Subcommand};
use percolator_sim::{demo, sim};

/// mimalloc: fewer cycles per allocation than glibc's malloc on the request path, and less
/// fragmentation across worker threads (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// A simulated Kubernetes cluster for percolator's demo, tests and benchmarks.
#[derive(Debug, Parser)]
#[command(name = "percolator-sim", version, args_conflicts_with_subcommands = true)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    sim: Option<sim::SimConfig>,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the local demo: the simulator, a real Prometheus and percolator, on loopback.
    Demo(demo::DemoArgs),
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver::install_crypto_provider();
    let cli = Cli::parse();
    match (cli.command, cli.sim) {
        (Some(Command::Demo(args)), _) => {
            // The demo logs to files in its directory (see `demo::init_logging`).
            let dir = demo::prepare_dir(&args)?;
            demo::init_logging(&dir, args.verbosity)?;
            demo::run(args, dir, percolator::shutdown_signal()).await
        }
        (None, Some(sim)) => {
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                .with_env_filter(
                    tracing_subscriber::EnvFilter::try_from_default_env()
                        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
                )
                .init();
            Ok(sim::run(sim, percolator::shutdown_signal()).await?)
        }
        (None, None) => anyhow::bail!("--state-dir is required (or use `percolator-sim demo`)"),
    }
}
