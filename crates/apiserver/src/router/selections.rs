//! Rendered selected lists: a list with a `labelSelector` or `fieldSelector` is filtered from
//! its cached listing and rendered once; later requests with the same selectors against the
//! same listing get the same bytes. The HPA's and dashboards' selected lists repeat every few
//! seconds, and each used to filter and render the whole listing again.
//!
//! An answer belongs to the listing it was rendered from (compared by identity: the entry
//! holds a `Weak` to it, so its address cannot be reused while the entry lives), so nothing is
//! served from a listing that has been recomputed since. The cache is bounded by bytes, and an
//! answer larger than a quarter of the bound is not kept.

use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::Bytes;
use moka::future::Cache;

use crate::kind::Listing;

/// Bytes of rendered answers kept at most, all kinds together.
const MAX_BYTES: u64 = 64 << 20;
/// An entry outlives the listing it was rendered from by at most this long (listings live
/// `--cache-ttl`; the identity check already refuses answers of older listings).
const MAX_AGE: Duration = Duration::from_secs(120);

/// What identifies a selected list: the kind (group and plural), the namespace the listing was
/// filtered to, and both selectors as sent.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) struct SelectionKey(Box<str>);

impl SelectionKey {
    /// The key of a selected list of `group`/`plural`.
    pub(super) fn new(
        group: &str,
        plural: &str,
        namespace: Option<&str>,
        labels: &str,
        fields: &str,
    ) -> Self {
        let parts = [group, plural, namespace.unwrap_or_default(), labels, fields];
        let mut key = String::with_capacity(parts.iter().map(|p| p.len() + 1).sum());
        for part in parts {
            // NUL cannot occur in any of them (paths and selectors are validated text).
            key.push_str(part);
            key.push('\0');
        }
        Self(key.into_boxed_str())
    }
}

#[derive(Clone)]
struct Entry {
    listing: Weak<Listing>,
    body: Bytes,
}

/// The rendered selected lists (module documentation). Clones share the cache.
#[derive(Clone)]
pub(super) struct SelectedLists {
    cache: Cache<SelectionKey, Entry>,
}

impl std::fmt::Debug for SelectedLists {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SelectedLists").field("entries", &self.cache.entry_count()).finish()
    }
}

impl Default for SelectedLists {
    fn default() -> Self {
        let cache = Cache::builder()
            .max_capacity(MAX_BYTES)
            .weigher(|key: &SelectionKey, entry: &Entry| {
                u32::try_from(key.0.len() + entry.body.len() + 64).unwrap_or(u32::MAX)
            })
            .time_to_live(MAX_AGE)
            .build();
        Self { cache }
    }
}

impl SelectedLists {
    /// The answer rendered for `key` from this very `listing`, if any.
    pub(super) async fn get(&self, key: &SelectionKey, listing: &Arc<Listing>) -> Option<Bytes> {
        let entry = self.cache.get(key).await?;
        std::ptr::eq(entry.listing.as_ptr(), Arc::as_ptr(listing)).then_some(entry.body)
    }

    /// Keeps `body`, rendered for `key` from `listing` (unless it is too large to keep).
    pub(super) async fn insert(&self, key: SelectionKey, listing: &Arc<Listing>, body: Bytes) {
        if body.len() as u64 > MAX_BYTES / 4 {
            return;
        }
        self.cache.insert(key, Entry { listing: Arc::downgrade(listing), body }).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn an_answer_is_only_served_for_the_listing_it_came_from() {
        let lists = SelectedLists::default();
        let (first, second) = (Arc::new(Listing::default()), Arc::new(Listing::default()));
        let key = SelectionKey::new("g", "things", Some("ns"), "app=a", "");
        assert_eq!(lists.get(&key, &first).await, None);
        lists.insert(key.clone(), &first, Bytes::from_static(b"rendered")).await;
        assert_eq!(lists.get(&key, &first).await, Some(Bytes::from_static(b"rendered")));
        // A recomputed listing does not see the answer of the old one.
        assert_eq!(lists.get(&key, &second).await, None);
        // Other selectors, namespaces or kinds are other answers.
        for other in [
            SelectionKey::new("g", "things", Some("ns"), "app=b", ""),
            SelectionKey::new("g", "things", Some("ns"), "", "app=a"),
            SelectionKey::new("g", "things", None, "app=a", ""),
            SelectionKey::new("g", "others", Some("ns"), "app=a", ""),
            SelectionKey::new("h", "things", Some("ns"), "app=a", ""),
        ] {
            assert_eq!(lists.get(&other, &first).await, None, "{other:?}");
        }
        // Too large to keep.
        let big = Bytes::from(vec![b' '; usize::try_from(MAX_BYTES / 4 + 1).unwrap()]);
        let key = SelectionKey::new("g", "things", Some("ns"), "app=big", "");
        lists.insert(key.clone(), &first, big).await;
        assert_eq!(lists.get(&key, &first).await, None);
    }
}
