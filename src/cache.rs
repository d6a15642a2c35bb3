//! The computed-object cache: a decorator that gives any [`ServedKind`] a TTL cache keyed by
//! namespace (or all namespaces) with single-flight misses — concurrent identical misses share
//! one computation, so N simultaneous cold lists cost one set of upstream calls.
//!
//! Errors are not cached; partial results (a source missing, with warnings) are, for the TTL.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use moka::future::Cache;

use crate::config::LiveConfig;
use crate::resources::{Column, ComputeError, KindInfo, Listing, ServedKind};
use crate::telemetry::Metrics;

/// Entries kept at most (one per namespace plus the all-namespaces entry).
const MAX_ENTRIES: u64 = 10_000;

/// A [`ServedKind`] whose lists are cached for a TTL.
pub struct CachedKind {
    inner: Arc<dyn ServedKind>,
    // Keyed by configuration generation too: a reloaded configuration never serves results
    // computed with the old queries.
    cache: Cache<(u64, Option<String>), Arc<Listing>>,
    metrics: Arc<Metrics>,
    config: Arc<LiveConfig>,
}

impl std::fmt::Debug for CachedKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedKind").field("kind", &self.inner.info().kind).finish_non_exhaustive()
    }
}

impl CachedKind {
    /// Wraps `inner` with a cache of `ttl`.
    pub fn new(
        inner: Arc<dyn ServedKind>,
        ttl: Duration,
        metrics: Arc<Metrics>,
        config: Arc<LiveConfig>,
    ) -> Self {
        let cache = Cache::builder().time_to_live(ttl).max_capacity(MAX_ENTRIES).build();
        Self { inner, cache, metrics, config }
    }
}

impl ServedKind for CachedKind {
    fn info(&self) -> &'static KindInfo {
        self.inner.info()
    }

    fn columns(&self) -> &'static [Column] {
        self.inner.columns()
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        self.inner.schemas()
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            let key = (self.config.current().generation, namespace.map(str::to_string));
            let entry = self
                .cache
                .entry(key)
                .or_try_insert_with(self.inner.list(namespace))
                .await
                .map_err(|e| (*e).clone())?;
            self.metrics.cache_lookup(self.inner.info().plural, !entry.is_fresh());
            Ok(entry.into_value())
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    static INFO: KindInfo = KindInfo {
        plural: "things",
        singular: "thing",
        kind: "Thing",
        list_kind: "ThingList",
        short_names: &[],
        categories: &[],
        namespaced: true,
        description: "test",
    };

    struct Slow(AtomicUsize);

    impl ServedKind for Slow {
        fn info(&self) -> &'static KindInfo {
            &INFO
        }
        fn columns(&self) -> &'static [Column] {
            &[]
        }
        fn schemas(&self) -> Vec<(String, serde_json::Value)> {
            Vec::new()
        }
        fn list<'a>(&'a self, _: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
            Box::pin(async move {
                self.0.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
                Ok(Arc::new(Listing::default()))
            })
        }
    }

    #[tokio::test]
    async fn concurrent_misses_share_one_computation_and_expire() {
        let slow = Arc::new(Slow(AtomicUsize::new(0)));
        let metrics = Metrics::new();
        let config = LiveConfig::fixed(Default::default(), None);
        let cached =
            Arc::new(CachedKind::new(slow.clone(), Duration::from_millis(300), metrics.clone(), config));
        let barrier = Arc::new(tokio::sync::Barrier::new(50));
        let tasks: Vec<_> = (0..50)
            .map(|_| {
                let (cached, barrier) = (cached.clone(), barrier.clone());
                tokio::spawn(async move {
                    barrier.wait().await;
                    cached.list(Some("shop")).await.map(|_| ())
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap().unwrap();
        }
        assert_eq!(slow.0.load(Ordering::SeqCst), 1);
        cached.list(Some("other")).await.unwrap();
        assert_eq!(slow.0.load(Ordering::SeqCst), 2, "namespaces are cached separately");
        tokio::time::sleep(Duration::from_millis(400)).await;
        cached.list(Some("shop")).await.unwrap();
        assert_eq!(slow.0.load(Ordering::SeqCst), 3, "entries expire after the TTL");
        assert!(metrics.encode().contains("result=\"hit\"} 49"));
    }
}
