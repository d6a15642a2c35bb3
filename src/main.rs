//! The `percolator` binary: parse the flags, set the process up, run the server.

use clap::Parser;

/// mimalloc: fewer cycles per allocation than glibc's malloc on the request path, and less
/// fragmentation across worker threads. Version 2 (the `v2` feature): it returns freed pages
/// after 10 ms where version 3 waits a second and until it is next busy, which left ~15% of
/// the resident memory at 150,000 pods freed but kept (docs/benchmarks-history.md, issue 18 third step).
/// The `system-allocator` feature leaves it out, for heap profilers that intercept `malloc`.
/// Transparent huge pages are kept off its arena (`apiserver::keep_the_heap_in_small_pages`:
/// under the soak at 10,000 pods, khugepaged's collapses raised the resident floor 7–10 MiB;
/// RELIABILITY.md, "Soak").
#[cfg(not(feature = "system-allocator"))]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = percolator::config::Args::parse();
    apiserver::init_process(args.verbosity, &["percolator"]);
    percolator::run(args).await?;
    Ok(())
}
