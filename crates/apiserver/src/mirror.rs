//! A local copy of a watched Kubernetes resource ([`Mirror`]), folded from kube-rs' watcher
//! events: what a server keeps of each object (a view of it, never the whole object), replaced
//! whole when a (re-)list completes, so a reader never sees half a list.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, RwLockReadGuard};

use kube::runtime::watcher::Event;

/// The local copy of one watched resource: the map readers see, the one a (re-)list fills until
/// it completes (then it replaces the first whole, so a reader never sees half a list), and
/// whether a first list has completed.
pub struct Mirror<K, V> {
    live: RwLock<BTreeMap<K, Arc<V>>>,
    relist: Mutex<Option<BTreeMap<K, Arc<V>>>>,
    synced: AtomicBool,
}

impl<K, V> Default for Mirror<K, V> {
    fn default() -> Self {
        Self { live: RwLock::default(), relist: Mutex::default(), synced: AtomicBool::new(false) }
    }
}

impl<K: Ord, V: PartialEq> Mirror<K, V> {
    /// Folds one watch event. `view` is what is kept of an object and under which key (`None`:
    /// nothing, e.g. a pod that is not running); `key` finds an object's entry to remove.
    /// Returns whether what readers see changed.
    ///
    /// An object whose kept view is unchanged (an update of its status alone, or the same
    /// object listed again after a watch expired) keeps its entry: nothing is allocated again
    /// for it, and what is kept for an object's lifetime is not re-made among the decoding's
    /// short-lived blocks at every event.
    pub fn apply<T>(
        &self,
        event: Event<T>,
        key: impl Fn(&T) -> K,
        view: impl Fn(&T) -> Option<(K, V)>,
    ) -> bool {
        match event {
            Event::Init => {
                if let Ok(mut relist) = self.relist.lock() {
                    *relist = Some(BTreeMap::new());
                }
                false
            }
            Event::InitApply(object) => {
                if let Some((k, v)) = view(&object) {
                    let kept = self.unchanged(&k, &v).unwrap_or_else(|| Arc::new(v));
                    if let Ok(mut relist) = self.relist.lock()
                        && let Some(map) = relist.as_mut()
                    {
                        map.insert(k, kept);
                    }
                }
                false
            }
            Event::InitDone => {
                let fresh = self.relist.lock().ok().and_then(|mut r| r.take()).unwrap_or_default();
                // Built again from its sorted entries: a map filled in key order (as lists come)
                // leaves its nodes half empty, one built in bulk fills them.
                let fresh: BTreeMap<K, Arc<V>> = fresh.into_iter().collect();
                if let Ok(mut live) = self.live.write() {
                    *live = fresh;
                }
                self.synced.store(true, Ordering::Release);
                true
            }
            Event::Apply(object) => {
                let kept = view(&object);
                let Ok(mut live) = self.live.write() else { return true };
                match kept {
                    Some((k, v)) if live.get(&k).is_some_and(|old| **old == v) => false,
                    Some((k, v)) => {
                        live.insert(k, Arc::new(v));
                        true
                    }
                    None => {
                        live.remove(&key(&object));
                        true
                    }
                }
            }
            Event::Delete(object) => {
                if let Ok(mut live) = self.live.write() {
                    live.remove(&key(&object));
                }
                true
            }
        }
    }

    /// The map readers see (`None` when its lock is poisoned).
    pub fn read(&self) -> Option<RwLockReadGuard<'_, BTreeMap<K, Arc<V>>>> {
        self.live.read().ok()
    }

    /// The entry readers see for `k`, when it is `v` already.
    fn unchanged(&self, k: &K, v: &V) -> Option<Arc<V>> {
        self.live.read().ok()?.get(k).filter(|old| ***old == *v).cloned()
    }

    /// Whether a first list has completed.
    pub fn is_synced(&self) -> bool {
        self.synced.load(Ordering::Acquire)
    }
}
