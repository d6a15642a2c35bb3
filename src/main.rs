//! The `percolator` binary: parse flags, install the crypto provider, run the server.

use clap::Parser;

/// mimalloc: fewer cycles per allocation than glibc's malloc on the request path, and less
/// fragmentation across worker threads. Version 2 (the `v2` feature): it returns freed pages
/// after 10 ms where version 3 waits a second and until it is next busy, which left ~15% of
/// the resident memory at 150,000 pods freed but kept (docs/benchmarks-history.md, issue 18 third step).
/// The `system-allocator` feature leaves it out, for heap profilers that intercept `malloc`.
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    apiserver::install_crypto_provider();
    let args = percolator::config::Args::parse();
    apiserver::init_logging(args.verbosity, &["percolator"]);
    percolator::run(args).await?;
    Ok(())
}
