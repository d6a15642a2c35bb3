//! The computed-object cache of a kind: a decorator that gives any [`ServedKind`] a
//! [`TtlCache`] keyed by namespace (or all namespaces), so N simultaneous cold lists cost one
//! set of upstream calls.
//!
//! A listing of all namespaces holds every namespace's objects, so it also answers the
//! namespaces: once computed, each namespace's entry is replaced by a view of it (the same
//! objects, shared, not copied), and a namespace missing from the cache while the
//! all-namespaces entry is there is answered from it. A view expires with the listing it was
//! taken from, so nothing is served older than the TTL.
//!
//! Errors are not cached; partial results (a source missing, with warnings) are, for the TTL.

use std::sync::Arc;

use futures::future::BoxFuture;

use super::{Column, ComputeError, KindInfo, Listing, ServedKind};
use crate::{CacheSettings, TtlCache};

/// Entries kept at most (one per namespace plus the all-namespaces entry).
const MAX_ENTRIES: u64 = 10_000;

/// Keyed by configuration generation too: a reloaded configuration never serves results
/// computed with the old one.
type Key = (u64, Option<Arc<str>>);

/// The generation of what a kind is computed from (a configuration that is reloaded): part of
/// every cache key, so a new generation never serves results of an old one. `|| 0` for a kind
/// whose inputs never change.
pub type Generation = Arc<dyn Fn() -> u64 + Send + Sync>;

/// A [`ServedKind`] whose lists are cached for the TTL.
pub struct CachedKind {
    inner: Arc<dyn ServedKind>,
    cache: TtlCache<Key, Arc<Listing>>,
    generation: Generation,
}

impl std::fmt::Debug for CachedKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CachedKind").field("kind", &self.inner.info().kind).finish_non_exhaustive()
    }
}

impl CachedKind {
    /// Wraps `inner` with a cache built from `settings` (named by the kind's plural); the
    /// `generation` is part of every key.
    pub fn new(inner: Arc<dyn ServedKind>, settings: &CacheSettings, generation: Generation) -> Self {
        let cache = TtlCache::new(inner.info().plural.clone(), settings, MAX_ENTRIES);
        Self { inner, cache, generation }
    }

    /// The listing of `key`, cached or computed, and whether this call computed it.
    async fn compute(&self, key: Key) -> Result<(Arc<Listing>, std::time::Instant, bool), ComputeError> {
        let namespace = key.1.clone();
        self.cache
            .get_or_try_compute(key, self.inner.list(namespace.as_deref()))
            .await
            .map_err(|e| (*e).clone())
    }

    /// Replaces every namespace's entry by a view of `all`.
    async fn share(&self, generation: u64, all: &Listing, expires_at: std::time::Instant) {
        for (namespace, view) in all.namespace_views() {
            self.cache.insert_until((generation, Some(namespace)), Arc::new(view), expires_at).await;
        }
    }
}

impl ServedKind for CachedKind {
    fn info(&self) -> &KindInfo {
        self.inner.info()
    }

    fn columns(&self) -> &[Column] {
        self.inner.columns()
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        self.inner.schemas()
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            let generation = (self.generation)();
            let Some(namespace) = namespace.filter(|_| self.inner.info().namespaced) else {
                let (all, expires_at, computed) = self.compute((generation, None)).await?;
                if computed && self.inner.info().namespaced {
                    self.share(generation, &all, expires_at).await;
                }
                return Ok(all);
            };
            let key: Key = (generation, Some(Arc::from(namespace)));
            if let Some((listing, _)) = self.cache.peek(&key).await {
                self.cache.count(true);
                return Ok(listing);
            }
            if let Some((all, expires_at)) = self.cache.peek(&(generation, None)).await {
                let view = Arc::new(all.namespace_view(namespace));
                self.cache.insert_until(key, view.clone(), expires_at).await;
                self.cache.count(true);
                return Ok(view);
            }
            Ok(self.compute(key).await?.0)
        })
    }

    fn cached<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Option<Arc<Listing>>> {
        Box::pin(async move {
            let generation = (self.generation)();
            let namespace = namespace.filter(|_| self.inner.info().namespaced);
            let (listing, _) = self.cache.peek(&(generation, namespace.map(Arc::from))).await?;
            self.cache.count(true);
            Some(listing)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Metrics;
    use std::sync::LazyLock;
    use std::time::Duration;
    use test_support::all_at_once;

    static INFO: LazyLock<KindInfo> =
        LazyLock::new(|| KindInfo::new(crate::kind::tests::EXAMPLE, "Thing", true, "test"));

    #[tokio::test]
    async fn concurrent_misses_share_one_computation_and_expire() {
        let pods = Pods::new(Duration::from_millis(50));
        let metrics = Metrics::new("example");
        let settings = CacheSettings::new(Duration::from_millis(300), metrics.clone());
        let cached = Arc::new(CachedKind::new(pods.clone(), &settings, Arc::new(|| 0)));
        let lists = all_at_once(50, |_| {
            let cached = cached.clone();
            async move { cached.list(Some("shop")).await.map(|_| ()) }
        });
        assert!(lists.await.iter().all(Result::is_ok));
        assert_eq!(pods.calls(), 1);
        cached.list(Some("other")).await.unwrap();
        assert_eq!(pods.calls(), 2, "namespaces are cached separately");
        tokio::time::sleep(Duration::from_millis(400)).await;
        cached.list(Some("shop")).await.unwrap();
        assert_eq!(pods.calls(), 3, "entries expire after the TTL");
        assert!(metrics.encode().contains("result=\"hit\"} 49"));
    }

    #[tokio::test]
    async fn a_cached_listing_is_given_without_computing_and_only_while_cached() {
        let (pods, cached) = instant_pods(Duration::from_millis(200));
        assert!(cached.cached(Some("shop")).await.is_none());
        assert_eq!(pods.calls(), 0, "asking what is cached computes nothing");
        let listing = cached.list(Some("shop")).await.unwrap();
        let at_hand = cached.cached(Some("shop")).await.unwrap();
        assert!(Arc::ptr_eq(&listing, &at_hand));
        assert!(cached.cached(Some("api")).await.is_none(), "another namespace is not cached");
        assert!(cached.cached(None).await.is_none());
        assert_eq!(pods.calls(), 1);
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(cached.cached(Some("shop")).await.is_none(), "an expired entry is not at hand");
    }

    /// [`Pods`] computed at once, cached for `ttl`.
    fn instant_pods(ttl: Duration) -> (Arc<Pods>, CachedKind) {
        let pods = Pods::new(Duration::ZERO);
        let cached =
            CachedKind::new(pods.clone(), &CacheSettings::new(ttl, Metrics::new("example")), Arc::new(|| 0));
        (pods, cached)
    }

    /// Objects in two namespaces, computed in `delay`; records which namespaces it was asked
    /// for.
    struct Pods {
        asked: std::sync::Mutex<Vec<Option<String>>>,
        delay: Duration,
    }

    impl Pods {
        fn new(delay: Duration) -> Arc<Self> {
            Arc::new(Self { asked: std::sync::Mutex::new(Vec::new()), delay })
        }

        fn asked(&self) -> Vec<Option<String>> {
            self.asked.lock().unwrap().clone()
        }

        fn calls(&self) -> usize {
            self.asked.lock().unwrap().len()
        }
    }

    impl ServedKind for Pods {
        fn info(&self) -> &KindInfo {
            &INFO
        }
        fn columns(&self) -> &[Column] {
            &[]
        }
        fn schemas(&self) -> Vec<(String, serde_json::Value)> {
            Vec::new()
        }
        fn list<'a>(
            &'a self,
            namespace: Option<&'a str>,
        ) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
            Box::pin(async move {
                self.asked.lock().unwrap().push(namespace.map(str::to_owned));
                tokio::time::sleep(self.delay).await;
                let items = [("api", "a"), ("shop", "b"), ("shop", "c")]
                    .into_iter()
                    .filter(|(ns, _)| namespace.is_none_or(|n| n == *ns))
                    .map(|(ns, name)| {
                        let meta = crate::kind::Meta {
                            name: name.into(),
                            namespace: ns.into(),
                            ..Default::default()
                        };
                        crate::kind::Item::new(&INFO, meta, &serde_json::json!({"name": name}), &[])
                    })
                    .collect();
                Ok(Arc::new(Listing { items, resource_version: "7".into(), ..Listing::default() }))
            })
        }
    }

    #[tokio::test]
    async fn namespaces_are_answered_by_views_of_the_all_namespaces_listing() {
        let (pods, cached) = instant_pods(Duration::from_millis(400));
        let names = |l: &Listing| l.items.iter().map(|i| i.meta.name.to_string()).collect::<Vec<_>>();

        // A namespace computed on its own is replaced by a view once all namespaces are.
        let own = cached.list(Some("shop")).await.unwrap();
        let all = cached.list(None).await.unwrap();
        let shop = cached.list(Some("shop")).await.unwrap();
        assert_eq!(names(&shop), ["b", "c"]);
        assert!(!std::ptr::eq(&own.items[0], &shop.items[0]), "the namespace's own copy is gone");
        assert!(std::ptr::eq(&all.items[1], &shop.items[0]), "objects are shared, not copied");
        // A namespace not cached yet, or empty, is answered from the all-namespaces entry.
        assert_eq!(names(&cached.list(Some("api")).await.unwrap()), ["a"]);
        assert!(cached.list(Some("empty")).await.unwrap().items.is_empty());
        assert_eq!(cached.list(Some("api")).await.unwrap().resource_version, "7");
        assert_eq!(pods.asked(), [Some("shop".to_owned()), None]);

        // Views expire with the listing they came from.
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(names(&cached.list(Some("api")).await.unwrap()), ["a"]);
        assert_eq!(pods.asked(), [Some("shop".to_owned()), None, Some("api".to_owned())]);
    }
}
