//! `percolator-sim`: a simulated Kubernetes cluster (API, kubelets, app metrics) on
//! loopback. Prints one `{"event":"ready",…}` JSON line on stdout once serving; logs go to
//! stderr. `percolator-sim demo` runs the whole local demo (simulator, Prometheus,
//! percolator). The modules are the `percolator_sim` library's.

use clap::{Parser, Subcommand};
use percolator_sim::{demo, sim, soak};

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
    /// Run the soak: percolator under churn, load and faults for an hour (`--minutes`), and a
    /// report of whether anything grows (RELIABILITY.md, "Soak"; `scripts/soak.sh`).
    Soak(soak::SoakArgs),
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
        (Some(Command::Soak(args)), _) => {
            init_stderr_logging();
            let options = args.options()?;
            let dir = options.dir.clone();
            let report = soak::run(options).await?;
            println!("{}", report.markdown);
            println!("report: {0}/report.md, picture: {0}/soak.svg", dir.display());
            if !report.failures.is_empty() {
                anyhow::bail!("{} soak goal(s) missed", report.failures.len());
            }
            Ok(())
        }
        (None, Some(sim)) => {
            init_stderr_logging();
            Ok(sim::run(sim, percolator::shutdown_signal()).await?)
        }
        (None, None) => anyhow::bail!("--state-dir is required (or use `percolator-sim demo`)"),
    }
}

/// Logs to stderr at `RUST_LOG`'s level (`info` when unset): the simulator's and the soak's.
fn init_stderr_logging() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
}
