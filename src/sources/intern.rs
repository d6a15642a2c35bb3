//! Interning: one shared copy of values many objects hold equal, kept from one computation to
//! the next. The inventory shares pods' namespaces, label sets and container names this way;
//! the kinds computed from Prometheus series share their objects' label sets, so a refresh
//! allocates a label set only when it is new, not one per object per refresh (blocks that live
//! as long as the cached listing, among the refresh's short-lived ones, hold the allocator's
//! pages: RELIABILITY.md, "Soak").

use std::collections::HashSet;
use std::hash::Hash;
use std::sync::{Arc, Mutex};

use crate::sources::Labels;

/// Shares equal values: `intern` returns the one `Arc` held for a value. Values nobody else
/// holds any more are dropped once the calls since the last sweep reach
/// [`Interner::SWEEP_EVERY`] or the number of values it kept, whichever is more (amortised
/// O(1) per call).
pub(crate) struct Interner<T: ?Sized> {
    inner: Mutex<InternerState<T>>,
}

struct InternerState<T: ?Sized> {
    values: HashSet<Arc<T>>,
    calls: usize,
    kept: usize,
}

impl<T: ?Sized> Default for Interner<T> {
    fn default() -> Self {
        Self { inner: Mutex::new(InternerState { values: HashSet::new(), calls: 0, kept: 0 }) }
    }
}

/// A value an [`Interner`] can make its shared copy of.
pub(crate) trait Share {
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
    const SWEEP_EVERY: usize = 4096;

    /// The shared copy of `value` (made now when there is none).
    pub(crate) fn intern(&self, value: &T) -> Arc<T> {
        let Ok(mut guard) = self.inner.lock() else { return value.share() };
        let state = &mut *guard;
        state.calls += 1;
        if state.calls >= Self::SWEEP_EVERY.max(state.kept) {
            state.values.retain(|v| Arc::strong_count(v) > 1);
            state.calls = 0;
            state.kept = state.values.len();
        }
        if let Some(shared) = state.values.get(value) {
            return shared.clone();
        }
        let shared = value.share();
        state.values.insert(shared.clone());
        shared
    }
}

/// What the objects of one computed kind share from one refresh to the next: their names and
/// namespaces, and their label sets.
#[derive(Default)]
pub(crate) struct ObjectStrings {
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
    pub(crate) fn name(&self, name: &str) -> Arc<str> {
        self.strings.intern(name)
    }

    /// The shared copy of a label set.
    pub(crate) fn labels(&self, labels: &Labels) -> Arc<Labels> {
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
        assert!(set_len <= Interner::<str>::SWEEP_EVERY, "{set_len} values still held");
        assert!(Arc::ptr_eq(&kept, &interner.intern("kept")));
    }
}
