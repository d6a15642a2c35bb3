//! Helpers shared by the unit tests of every layer (compiled only for tests).

use std::future::Future;
use std::sync::Arc;

/// Runs `task(0)`, …, `task(n - 1)` on `n` tasks released together by a barrier and returns
/// their results in order: how the single-flight tests make identical calls overlap.
pub(crate) async fn all_at_once<F, Fut, T>(n: usize, task: F) -> Vec<T>
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
