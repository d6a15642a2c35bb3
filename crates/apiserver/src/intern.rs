//! Interning: one shared copy of values many objects hold equal, kept from one computation to
//! the next. A store of cluster objects shares their namespaces, label sets and names this
//! way, and a kind computed on every refresh shares its objects' names and label sets
//! ([`ObjectStrings`]), so a refresh allocates a label set only when it is new, not one per
//! object per refresh: blocks that live as long as a cached listing, allocated among the
//! refresh's short-lived ones, would otherwise pin the allocator's pages.

use std::cell::Cell;
use std::collections::{BTreeMap, HashMap};
use std::hash::Hash;
use std::sync::{Arc, Mutex};

/// A label set, as objects carry it.
pub type Labels = BTreeMap<String, String>;

/// The empty string, shared: the namespace of every cluster-scoped object, not an allocation
/// each.
pub fn empty_str() -> Arc<str> {
    static EMPTY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
    EMPTY.clone()
}

/// Shares equal values: `intern` returns the one `Arc` held for a value. A sweep, once the calls
/// since the last one reach [`Interner::SWEEP_EVERY`] or the number of values it kept,
/// whichever is more (amortised O(1) per call), drops the values nobody else holds that were
/// not asked for since the sweep before: a value stays shared across a moment when nothing
/// holds it (a cached listing expired before the next refresh asks for its objects' names),
/// and the values kept are at most those held plus those of one period's calls.
pub struct Interner<T: ?Sized> {
    inner: Mutex<InternerState<T>>,
}

impl<T: ?Sized> std::fmt::Debug for Interner<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Interner").finish_non_exhaustive()
    }
}

struct InternerState<T: ?Sized> {
    /// Each value, with the period (sweeps so far) it was last asked for in.
    values: HashMap<Arc<T>, Cell<u64>>,
    period: u64,
    calls: usize,
    kept: usize,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Self { inner: Mutex::new(InternerState { values: HashMap::new(), period: 0, calls: 0, kept: 0 }) }
    }
}

/// A value an [`Interner`] can make its shared copy of.
pub trait Share {
    /// A new shared copy of the value.
    fn share(&self) -> Arc<Self>;
}

impl Share for str {
    fn share(&self) -> Arc<str> {
        Arc::from(self)
    }
}

impl Share for [String] {
    fn share(&self) -> Arc<[String]> {
        Arc::from(self)
    }
}

impl Share for Labels {
    fn share(&self) -> Arc<Labels> {
        Arc::new(self.clone())
    }
}

impl<T: ?Sized + Eq + Hash + Share> Interner<T> {
    /// Calls between two sweeps at least.
    pub const SWEEP_EVERY: usize = 4096;

    /// The shared copy of `value` (made now when there is none).
    pub fn intern(&self, value: &T) -> Arc<T> {
        let Ok(mut guard) = self.inner.lock() else { return value.share() };
        let state = &mut *guard;
        state.calls += 1;
        if state.calls >= Self::SWEEP_EVERY.max(state.kept) {
            let ended = state.period;
            state.values.retain(|v, asked| Arc::strong_count(v) > 1 || asked.get() == ended);
            state.period += 1;
            state.calls = 0;
            state.kept = state.values.len();
        }
        if let Some((shared, asked)) = state.values.get_key_value(value) {
            asked.set(state.period);
            return shared.clone();
        }
        let shared = value.share();
        state.values.insert(shared.clone(), Cell::new(state.period));
        shared
    }
}

/// What the objects of one computed kind share from one refresh to the next: their names and
/// namespaces, and their label sets.
#[derive(Default)]
pub struct ObjectStrings {
    strings: Interner<str>,
    label_sets: Interner<Labels>,
}

impl std::fmt::Debug for ObjectStrings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStrings").finish_non_exhaustive()
    }
}

impl ObjectStrings {
    /// The shared copy of a name or namespace.
    pub fn name(&self, name: &str) -> Arc<str> {
        self.strings.intern(name)
    }

    /// The shared copy of a label set.
    pub fn labels(&self, labels: &Labels) -> Arc<Labels> {
        self.label_sets.intern(labels)
    }
}
#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_interner_forgets_values_nobody_holds() {
        let interner = Interner::<str>::default();
        let kept = interner.intern("kept");
        for i in 0..3 * Interner::<str>::SWEEP_EVERY {
            drop(interner.intern(&format!("gone-{i}")));
        }
        let set_len = interner.inner.lock().unwrap().values.len();
        assert!(set_len <= 2 * Interner::<str>::SWEEP_EVERY, "{set_len} values still held");
        assert!(Arc::ptr_eq(&kept, &interner.intern("kept")));
    }

    #[test]
    fn a_value_asked_for_in_the_last_period_survives_a_moment_nobody_holds_it() {
        // A refresh interns an object's name; its listing expires; the next refresh, after a
        // sweep, gets the same copy, not a new allocation.
        let interner = Interner::<str>::default();
        let first = interner.intern("web-1");
        let address = Arc::as_ptr(&first);
        drop(first);
        for i in 0..Interner::<str>::SWEEP_EVERY {
            let _held = interner.intern(&format!("other-{i}"));
        }
        let again = interner.intern("web-1");
        assert_eq!(Arc::as_ptr(&again), address, "kept across one sweep");
        drop(again);
        // Not asked for during two whole periods and held by nobody: forgotten.
        for round in 0..3 {
            for i in 0..Interner::<str>::SWEEP_EVERY {
                let _held = interner.intern(&format!("round-{round}-{i}"));
            }
        }
        assert!(!interner.inner.lock().unwrap().values.contains_key("web-1"));
    }
}
