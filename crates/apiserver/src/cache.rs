//! TTL caches with single-flight misses, generic over what they cache: every cache of
//! computed results (served kinds' listings, metric values, an upstream's samples per node)
//! is a [`TtlCache`] built from the one `--cache-ttl` ([`CacheSettings`]).
//!
//! Concurrent misses of one key share one computation (moka's entry API), so N simultaneous
//! cold requests cost one set of upstream calls; errors are not cached. An entry may carry its
//! own expiry (a view shares the expiry of the entry it was taken from), never later than the
//! TTL.

use std::borrow::Cow;
use std::hash::Hash;
use std::sync::Arc;
use std::time::{Duration, Instant};

use moka::Expiry;
use moka::future::Cache;

use crate::telemetry::Metrics;

/// How every cache of computed results is built (`--cache-ttl`).
#[derive(Debug, Clone)]
pub struct CacheSettings {
    /// How long a computed result is served.
    pub ttl: Duration,
    /// Where lookups are counted (`<namespace>_cache_requests_total`); none in some tests.
    pub metrics: Option<Arc<Metrics>>,
}

impl CacheSettings {
    /// Results live `ttl`; lookups are counted in `metrics`.
    pub fn new(ttl: Duration, metrics: Arc<Metrics>) -> Self {
        Self { ttl, metrics: Some(metrics) }
    }

    /// Results live `ttl`; lookups are not counted.
    pub fn uncounted(ttl: Duration) -> Self {
        Self { ttl, metrics: None }
    }
}

/// A cached value and when it stops being served.
#[derive(Clone)]
struct Entry<V> {
    value: V,
    expires_at: Instant,
}

struct UntilExpiry;

/// An entry lives until its own `expires_at`, whether it was inserted or replaced (moka's
/// default keeps a replaced entry's earlier expiry: a value refreshed before it expired would
/// then be dropped at the old time, its new `expires_at` notwithstanding).
impl<K, V> Expiry<K, Entry<V>> for UntilExpiry {
    fn expire_after_create(&self, _key: &K, entry: &Entry<V>, created_at: Instant) -> Option<Duration> {
        Some(entry.expires_at.saturating_duration_since(created_at))
    }

    fn expire_after_update(
        &self,
        _key: &K,
        entry: &Entry<V>,
        updated_at: Instant,
        _until_now: Option<Duration>,
    ) -> Option<Duration> {
        Some(entry.expires_at.saturating_duration_since(updated_at))
    }
}

/// A TTL cache whose misses are single-flight.
pub struct TtlCache<K, V> {
    name: Cow<'static, str>,
    cache: Cache<K, Entry<V>>,
    settings: CacheSettings,
    /// Its entry count for the `cache_entries` gauge, while the cache lives.
    _entries: Option<Arc<crate::telemetry::Probe>>,
}

impl<K, V> std::fmt::Debug for TtlCache<K, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TtlCache").field("name", &self.name).field("ttl", &self.settings.ttl).finish()
    }
}

impl<K, V> TtlCache<K, V>
where
    K: Hash + Eq + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// A cache named `name` in the lookup metric, holding at most `max_entries`.
    pub fn new(name: impl Into<Cow<'static, str>>, settings: &CacheSettings, max_entries: u64) -> Self {
        let cache: Cache<K, Entry<V>> =
            Cache::builder().expire_after(UntilExpiry).max_capacity(max_entries).build();
        let name = name.into();
        let entries = settings.metrics.as_ref().map(|metrics| {
            let counted = cache.clone();
            let probe: Arc<crate::telemetry::Probe> = Arc::new(move || counted.entry_count());
            metrics.sampled.cache_entries(name.clone(), &probe);
            probe
        });
        Self { name, cache, settings: settings.clone(), _entries: entries }
    }

    /// The value of `key`, from the cache or from `compute` (shared with every concurrent miss
    /// of the same key), and whether it was computed by this call. Errors are not cached.
    pub async fn get_or_try_compute<E, F>(&self, key: K, compute: F) -> Result<(V, Instant, bool), Arc<E>>
    where
        F: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        let found = self.get_or_try_compute_uncounted(key, compute).await?;
        self.count(!found.2);
        Ok(found)
    }

    /// [`get_or_try_compute`](Self::get_or_try_compute) without counting a lookup: for
    /// background refreshes, which are not requests.
    pub async fn get_or_try_compute_uncounted<E, F>(
        &self,
        key: K,
        compute: F,
    ) -> Result<(V, Instant, bool), Arc<E>>
    where
        F: Future<Output = Result<V, E>>,
        E: Send + Sync + 'static,
    {
        let ttl = self.settings.ttl;
        let entry = self
            .cache
            .entry(key)
            .or_try_insert_with(async move {
                let value = compute.await?;
                Ok::<_, E>(Entry { value, expires_at: Instant::now() + ttl })
            })
            .await?;
        let computed = entry.is_fresh();
        let entry = entry.into_value();
        Ok((entry.value, entry.expires_at, computed))
    }

    /// The value of `key` when cached, with its expiry (not counted: callers count the lookup
    /// they answer).
    pub async fn peek(&self, key: &K) -> Option<(V, Instant)> {
        self.cache.get(key).await.map(|e| (e.value, e.expires_at))
    }

    /// How long a computed value is served.
    pub fn ttl(&self) -> Duration {
        self.settings.ttl
    }

    /// Caches `value` for `key` until `expires_at` (at most the TTL from now).
    pub async fn insert_until(&self, key: K, value: V, expires_at: Instant) {
        let expires_at = expires_at.min(Instant::now() + self.settings.ttl);
        self.cache.insert(key, Entry { value, expires_at }).await;
    }

    /// Counts one lookup answered from the cache (`hit`) or not.
    pub fn count(&self, hit: bool) {
        if let Some(metrics) = &self.settings.metrics {
            metrics.cache_lookup(&self.name, hit);
        }
    }

    /// Drops every entry.
    pub fn clear(&self) {
        self.cache.invalidate_all();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use test_support::all_at_once;

    #[tokio::test]
    async fn concurrent_misses_share_one_computation_and_errors_are_not_cached() {
        let metrics = Metrics::new("example");
        let cache: Arc<TtlCache<u32, u32>> = Arc::new(TtlCache::new(
            "test",
            &CacheSettings::new(Duration::from_millis(200), metrics.clone()),
            10,
        ));
        let calls = Arc::new(AtomicUsize::new(0));
        let values = all_at_once(20, |_| {
            let (cache, calls) = (cache.clone(), calls.clone());
            async move {
                let compute = async {
                    calls.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(30)).await;
                    Ok::<_, String>(7)
                };
                cache.get_or_try_compute(1, compute).await.map(|(v, _, _)| v)
            }
        })
        .await;
        assert!(values.iter().all(|v| v.as_ref().ok() == Some(&7)), "{values:?}");
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        assert!(metrics.encode().contains("result=\"hit\"} 19"), "{}", metrics.encode());

        let failed = cache.get_or_try_compute(2, async { Err::<u32, _>("down".to_owned()) }).await;
        assert_eq!(*failed.unwrap_err(), "down");
        let (value, _, computed) = cache.get_or_try_compute(2, async { Ok::<_, String>(3) }).await.unwrap();
        assert_eq!((value, computed), (3, true), "errors are not cached");

        tokio::time::sleep(Duration::from_millis(250)).await;
        assert!(cache.peek(&1).await.is_none(), "entries expire after the TTL");
    }

    #[tokio::test]
    async fn an_entry_never_outlives_the_ttl() {
        let cache: TtlCache<u32, u32> =
            TtlCache::new("t", &CacheSettings::uncounted(Duration::from_millis(50)), 10);
        cache.insert_until(1, 1, Instant::now() + Duration::from_secs(3600)).await;
        assert!(cache.peek(&1).await.is_some());
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(cache.peek(&1).await.is_none());
    }

    #[tokio::test]
    async fn a_replaced_entry_lives_until_its_new_expiry_not_the_old_one() {
        let cache: TtlCache<u32, u32> =
            TtlCache::new("t", &CacheSettings::uncounted(Duration::from_millis(400)), 10);
        cache.insert_until(1, 1, Instant::now() + Duration::from_millis(200)).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        // Refreshed before it expires, as a sampler of an upstream does: served for the new TTL.
        cache.insert_until(1, 2, Instant::now() + Duration::from_millis(400)).await;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let (value, expires_at) = cache.peek(&1).await.expect("past the first expiry, within the second");
        assert_eq!(value, 2);
        assert!(expires_at > Instant::now(), "the expiry served is the one the cache keeps");
        // And shortened, when the new expiry is earlier.
        cache.insert_until(1, 3, Instant::now() + Duration::from_millis(20)).await;
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(cache.peek(&1).await.is_none());
    }
}
