//! Single flight for reviews, with cancellation: concurrent requests that need the same review
//! (same key) share one call, and the call is dropped, cancelling it, when the last request
//! waiting for it goes away (its client reset the stream, its deadline passed).
//!
//! A flight is a [`Shared`] future: whichever waiter is polled drives it, so the first waiter
//! leaving hands nothing over and restarts nothing; the map keeps only a weak reference, so
//! it never keeps a flight alive. (moka's `try_get_with` was not kept for this: when the
//! waiter running the init is dropped, another waiter starts the init again, a second call,
//! and a waiter that sees 200 such aborts in a row panics.)

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

use futures::FutureExt;
use futures::future::{BoxFuture, Shared, WeakShared};
use openmetrics::metrics::counter::Counter;

/// A shared review: the future every waiter of one key awaits.
pub(crate) type Flight<V> = Shared<BoxFuture<'static, V>>;

type Map<K, V> = Mutex<HashMap<K, Entry<V>>>;

struct Entry<V> {
    id: u64,
    flight: WeakShared<BoxFuture<'static, V>>,
}

/// The flights under way, by key (at most one per key).
pub(crate) struct Flights<K, V> {
    map: Arc<Map<K, V>>,
    next: AtomicU64,
    /// Counts the flights dropped before they completed.
    cancelled: Counter,
}

impl<K, V> Flights<K, V>
where
    K: Hash + Eq + Clone + Send + Sync + 'static,
    V: Clone + Send + Sync + 'static,
{
    /// No flight yet; `cancelled` counts the flights nobody waited for to the end.
    pub(crate) fn new(cancelled: Counter) -> Self {
        Self { map: Arc::default(), next: AtomicU64::new(0), cancelled }
    }

    /// The flight of `key`, joined if one is under way, else started with `start`'s future
    /// (`start` may refuse: its error is returned and nothing starts). `start` runs under the
    /// map's lock, so two requests never start two flights of one key; it must not block.
    pub(crate) fn join_or_start<E>(
        &self,
        key: &K,
        start: impl FnOnce() -> Result<BoxFuture<'static, V>, E>,
    ) -> Result<Flight<V>, E> {
        let mut map = self.map.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(flight) = map.get(key).and_then(|entry| entry.flight.upgrade()) {
            return Ok(flight);
        }
        let work = start()?;
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut guard = Landing {
            map: Arc::downgrade(&self.map),
            key: key.clone(),
            id,
            landed: false,
            cancelled: self.cancelled.clone(),
        };
        let flight = async move {
            let value = work.await;
            guard.landed = true;
            drop(guard);
            value
        }
        .boxed()
        .shared();
        // A flight not yet polled has not completed, so it can be downgraded.
        if let Some(weak) = flight.downgrade() {
            map.insert(key.clone(), Entry { id, flight: weak });
        }
        Ok(flight)
    }

    /// Flights under way (tests).
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.map.lock().unwrap_or_else(PoisonError::into_inner).len()
    }
}

/// Removes its flight's entry when the flight completes or is dropped, and counts a drop
/// before completion as a cancellation. Dropped with the flight's future: never while the
/// map's lock is held by the same thread (a flight is dropped by its last waiter, outside
/// [`Flights::join_or_start`]).
struct Landing<K: Hash + Eq, V> {
    map: Weak<Map<K, V>>,
    key: K,
    id: u64,
    landed: bool,
    cancelled: Counter,
}

impl<K: Hash + Eq, V> Drop for Landing<K, V> {
    fn drop(&mut self) {
        if let Some(map) = self.map.upgrade() {
            let mut map = map.lock().unwrap_or_else(PoisonError::into_inner);
            // A newer flight of the key may have replaced this one already.
            if map.get(&self.key).is_some_and(|entry| entry.id == self.id) {
                map.remove(&self.key);
            }
        }
        if !self.landed {
            self.cancelled.inc();
        }
    }
}
