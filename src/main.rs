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
    keep_the_heap_in_small_pages();
    percolator::run(args).await?;
    Ok(())
}

/// Turns transparent huge pages off for this process (`prctl(PR_SET_THP_DISABLE)`), unless
/// `MIMALLOC_ALLOW_THP` is set (then mimalloc's own option decides).
///
/// mimalloc asks for huge pages on its arena (`MADV_HUGEPAGE`), and Linux' khugepaged, scanning
/// a few MiB every 10 s, collapses any 2 MiB range of it that has pages in use into one huge
/// page, faulting in the rest: pages mimalloc had freed and given back, which it does not give
/// back again, since for it they are gone. Under the soak at 10,000 pods resident memory rose
/// with each collapse (12 MiB of huge pages at once, the floor 7–10 MiB higher from then on)
/// and nowhere else (RELIABILITY.md, "Soak"). A heap of tens of MiB gains nothing from them.
fn keep_the_heap_in_small_pages() {
    if std::env::var_os("MIMALLOC_ALLOW_THP").is_some() {
        return;
    }
    if let Err(error) = rustix::thread::disable_transparent_huge_pages(true) {
        tracing::warn!(
            %error,
            "could not turn transparent huge pages off (prctl PR_SET_THP_DISABLE): resident memory may grow as the kernel collapses the heap into huge pages"
        );
    }
}
