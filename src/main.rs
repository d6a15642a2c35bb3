//! The `percolator` binary: parse flags, install the crypto provider, run the server.

use clap::Parser;

/// mimalloc: fewer cycles per allocation than glibc's malloc on the request path, and less
/// fragmentation across worker threads (BENCHMARKS.md).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    percolator::install_crypto_provider();
    let args = percolator::config::Args::parse();
    percolator::telemetry::init_logging(args.verbosity);
    percolator::run(args).await
}
