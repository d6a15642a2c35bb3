//! Helpers shared by the tests of every crate of the workspace (a dev-dependency only):
//! [`all_at_once`] makes identical calls overlap, [`mk_ca`], [`mk_leaf`], [`mk_serving`] and
//! [`mk_cert`] mint CAs and certificates (the one place the tests and the benchmark do), [`fuzz`] (a module: its strategies and checkers are named through it) is
//! the proptest harness with its request strategies and PromQL literal checkers.

// Test code: a failed expectation is a panic, as in the tests that use it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

pub mod fuzz;
mod pki;

pub use pki::{MkCa, MkLeaf, mk_ca, mk_cert, mk_leaf, mk_serving};

use std::future::Future;
use std::sync::Arc;

/// Runs `task(0)`, …, `task(n - 1)` on `n` tasks released together by a barrier and returns
/// their results in order: how the single-flight tests make identical calls overlap.
pub async fn all_at_once<F, Fut, T>(n: usize, task: F) -> Vec<T>
where
    F: Fn(usize) -> Fut,
    Fut: Future<Output = T> + Send + 'static,
    T: Send + 'static,
{
    let barrier = Arc::new(tokio::sync::Barrier::new(n));
    let handles: Vec<_> = (0..n)
        .map(|i| {
            let (barrier, call) = (barrier.clone(), task(i));
            tokio::spawn(async move {
                barrier.wait().await;
                call.await
            })
        })
        .collect();
    let mut results = Vec::with_capacity(n);
    for handle in handles {
        results.push(handle.await.expect("a task panicked"));
    }
    results
}

/// Makes `version` (a directory holding `ca.crt` with `pem`) the `..data` of the Secret-like
/// volume `dir`, whose `ca.crt` is the symlink `..data/ca.crt`: `dir/ca.crt -> ..data/ca.crt`,
/// `..data -> version`, swapped in one rename as the kubelet updates a Secret volume.
pub fn volume_swap(dir: &std::path::Path, version: &str, pem: &str) {
    std::fs::create_dir_all(dir.join(version)).unwrap();
    std::fs::write(dir.join(version).join("ca.crt"), pem).unwrap();
    let _ = std::fs::remove_file(dir.join("..data_tmp"));
    std::os::unix::fs::symlink(version, dir.join("..data_tmp")).unwrap();
    std::fs::rename(dir.join("..data_tmp"), dir.join("..data")).unwrap();
    if std::fs::symlink_metadata(dir.join("ca.crt")).is_err() {
        std::os::unix::fs::symlink("..data/ca.crt", dir.join("ca.crt")).unwrap();
    }
}
