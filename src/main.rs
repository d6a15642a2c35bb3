//! The `percolator` binary: parse flags, install the crypto provider, run the server.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    percolator::install_crypto_provider();
    let args = percolator::config::Args::parse();
    percolator::telemetry::init_logging(args.verbosity);
    percolator::run(args).await
}
