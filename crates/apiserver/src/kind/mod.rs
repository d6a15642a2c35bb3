//! The kind abstraction: what a served resource is ([`KindInfo`], [`Column`], its OpenAPI
//! schemas) and how it is computed ([`ServedKind::list`] into a [`Listing`] of [`Item`]s, each
//! serialized once), the TTL cache with single flight that any kind can sit behind
//! ([`CachedKind`]), and the set of kinds a server serves, fixed or swapped at runtime
//! ([`KindSet`], [`LiveKinds`]). The HTTP layer ([`crate::router`]) is generic over
//! [`ServedKind`] and never names a concrete kind.

mod cached;
mod listing;
mod set;

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use jiff::Timestamp;
use serde::Serialize;

pub use cached::{CachedKind, Generation};
pub(crate) use listing::push_list_head;
pub use listing::{CellRef, Item, Items, ListBody, Listing, ListingBuilder};
pub use set::{KindSet, KindSource, LiveKinds};

/// A label set, as objects carry them and label selectors match them.
pub type Labels = BTreeMap<String, String>;

/// The API group and version a kind is served under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GroupVersion {
    /// API group (`metrics.k8s.io`).
    pub group: &'static str,
    /// API version (`v1alpha1`).
    pub version: &'static str,
    /// `<group>/<version>`, the `apiVersion` of its objects.
    pub api_version: &'static str,
}

/// Text of a kind's description: borrowed for the built-in kinds, owned for declared ones.
pub type Text = Cow<'static, str>;
/// A list of [`Text`].
pub type Texts = Cow<'static, [Text]>;

/// Description of a served kind: what discovery and OpenAPI publish.
#[derive(Debug, Clone, PartialEq)]
pub struct KindInfo {
    /// The group-version it is served under.
    pub gv: GroupVersion,
    /// Plural resource name (`podmetricssummaries`).
    pub plural: Text,
    /// Singular resource name (`podmetricssummary`).
    pub singular: Text,
    /// Kind of one object (`PodMetricsSummary`).
    pub kind: Text,
    /// Kind of the list (`PodMetricsSummaryList`).
    pub list_kind: Text,
    /// Short names (`pms`).
    pub short_names: Texts,
    /// Categories (`all`, or the server's own).
    pub categories: Texts,
    /// Whether the kind is namespaced.
    pub namespaced: bool,
    /// One-paragraph description of the kind, used in OpenAPI.
    pub description: Text,
    /// Whether the items of a list carry `kind` and `apiVersion`, as custom resources' do;
    /// compiled-in API types' lists (metrics-server's `PodMetricsList`) leave them out.
    pub typed_list_items: bool,
}

impl KindInfo {
    /// A kind named `kind` of `gv`: plural lowercase `kind` + `s`, singular lowercase `kind`,
    /// list kind `kind` + `List`, no short names, no categories.
    pub fn new(gv: GroupVersion, kind: &str, namespaced: bool, description: &str) -> Self {
        let lower = kind.to_ascii_lowercase();
        Self {
            gv,
            plural: Text::Owned(format!("{lower}s")),
            singular: Text::Owned(lower),
            kind: Text::Owned(kind.to_owned()),
            list_kind: Text::Owned(format!("{kind}List")),
            short_names: Texts::Owned(Vec::new()),
            categories: Texts::Owned(Vec::new()),
            namespaced,
            description: Text::Owned(description.to_owned()),
            typed_list_items: true,
        }
    }

    /// The same kind with these short names.
    pub fn with_short_names(self, names: &[&str]) -> Self {
        Self { short_names: names.iter().map(|n| Text::Owned((*n).to_owned())).collect(), ..self }
    }

    /// The same kind in these categories.
    pub fn with_categories(self, categories: &[&str]) -> Self {
        Self { categories: categories.iter().map(|c| Text::Owned((*c).to_owned())).collect(), ..self }
    }

    /// `<plural>.<group>`, as Kubernetes error messages name a resource.
    pub fn qualified(&self) -> String {
        format!("{}.{}", self.plural, self.gv.group)
    }
}

/// One Table column.
#[derive(Debug, Clone, PartialEq)]
pub struct Column {
    /// Column name as printed (kubectl upper-cases it).
    pub name: Text,
    /// OpenAPI type of the cells (`string`, `integer`, `number`, `boolean`).
    pub type_: Text,
    /// Format hint (`name` for the name column, `quantity`, `duration`, or empty).
    pub format: Text,
    /// What the column shows.
    pub description: Text,
    /// 0 for default columns, 1 for `-o wide`.
    pub priority: i32,
}

impl Column {
    /// The first column of a kind: the object's name.
    pub const fn object_name(description: &'static str) -> Self {
        Self::of("Name", "name", description)
    }

    /// A column of text.
    pub const fn text(name: &'static str, description: &'static str) -> Self {
        Self::of(name, "", description)
    }

    /// A column of Kubernetes quantities (`250m`, `64Mi`).
    pub const fn quantity(name: &'static str, description: &'static str) -> Self {
        Self::of(name, "quantity", description)
    }

    /// A column of durations (`5m`).
    pub const fn duration(name: &'static str, description: &'static str) -> Self {
        Self::of(name, "duration", description)
    }

    const fn of(name: &'static str, format: &'static str, description: &'static str) -> Self {
        Self {
            name: Cow::Borrowed(name),
            type_: Cow::Borrowed("string"),
            format: Cow::Borrowed(format),
            description: Cow::Borrowed(description),
            priority: 0,
        }
    }

    /// The same column, shown only with `-o wide`.
    pub const fn wide(mut self) -> Self {
        self.priority = 1;
        self
    }
}

/// A Table cell as a kind computes it; stored packed with its object ([`Item::cells`] reads it
/// back) and rendered at response time (ages move on while the object sits in the cache).
#[derive(Debug, Clone, PartialEq)]
pub enum Cell {
    /// Printed as is (shared with the object's metadata where it can be).
    Text(Arc<str>),
    /// A short text (a quantity, a count) held inline, without an allocation per cell.
    Short(ShortText),
    /// Printed as a kubectl-style age (`5m12s`) relative to the response time.
    Age(Timestamp),
    /// The field is absent: printed `<none>`.
    None,
}

impl Cell {
    /// A computed text: inline when short, else shared.
    pub fn text(text: &str) -> Self {
        ShortText::new(text).map_or_else(|| Self::Text(text.into()), Self::Short)
    }
}

/// Text of at most [`ShortText::CAPACITY`] bytes, stored inline.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct ShortText {
    len: u8,
    bytes: [u8; ShortText::CAPACITY],
}

impl ShortText {
    /// Longest text held inline (a [`Cell`] stays 24 bytes).
    pub const CAPACITY: usize = 22;

    /// `text` inline, or `None` when it is too long.
    pub fn new(text: &str) -> Option<Self> {
        let len = u8::try_from(text.len()).ok().filter(|n| usize::from(*n) <= Self::CAPACITY)?;
        let mut bytes = [0; Self::CAPACITY];
        bytes[..text.len()].copy_from_slice(text.as_bytes());
        Some(Self { len, bytes })
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        // Copied from a &str whole, so always UTF-8.
        std::str::from_utf8(&self.bytes[..usize::from(self.len)]).unwrap_or_default()
    }
}

impl std::fmt::Debug for ShortText {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.as_str().fmt(f)
    }
}

/// Metadata of a served object, as published in `metadata`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Meta {
    /// Object name.
    pub name: Arc<str>,
    /// Object namespace.
    pub namespace: Arc<str>,
    /// Object UID.
    pub uid: Option<Arc<str>>,
    /// Creation time.
    pub creation_timestamp: Option<Timestamp>,
    /// Labels (label selectors filter on them).
    pub labels: Arc<Labels>,
}

impl Meta {
    /// The namespace of a cluster-scoped object: one empty string shared by all of them, not
    /// an allocation per object per refresh.
    pub fn cluster_scoped() -> Arc<str> {
        static EMPTY: std::sync::LazyLock<Arc<str>> = std::sync::LazyLock::new(|| Arc::from(""));
        EMPTY.clone()
    }
}

/// Errors computing a kind. A source that fails should remove fields (with a warning), not
/// the listing, so only these end a computation.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ComputeError {
    /// The kind's inputs are not ready yet (an inventory not synced): a 503 with
    /// `Retry-After`, whose message is this text.
    #[error("{0}")]
    NotReady(Cow<'static, str>),
    /// An upstream the kind cannot do without failed: a 500 whose message stays in the log.
    #[error("{0}")]
    Upstream(String),
}

/// A kind a server serves. The HTTP layer only talks to this trait.
pub trait ServedKind: Send + Sync {
    /// Its description (names, scope, description).
    fn info(&self) -> &KindInfo;
    /// Table columns.
    fn columns(&self) -> &[Column];
    /// OpenAPI v3 component schemas this kind defines, by name (the object schema first).
    /// References to other schemas use `#/components/schemas/<name>`; the ObjectMeta schema
    /// is provided by the OpenAPI module under [`OBJECT_META_SCHEMA`].
    fn schemas(&self) -> Vec<(String, serde_json::Value)>;
    /// Computes every object in `namespace` (or all namespaces when `None`).
    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>>;
    /// The listing [`ServedKind::list`] would return without computing anything (a cached
    /// one), or `None`: for a caller that must not compute where it runs.
    fn cached<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Option<Arc<Listing>>> {
        let _ = namespace;
        Box::pin(std::future::ready(None))
    }
}

/// Name of the shared ObjectMeta schema in OpenAPI documents.
pub const OBJECT_META_SCHEMA: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The kinds served, shared by the router, discovery and OpenAPI.
pub type Kinds = Vec<Arc<dyn ServedKind>>;

/// Name of a component schema in OpenAPI documents: the group reversed, as Kubernetes names
/// its own (`io.k8s.metrics.v1beta1.PodMetrics`).
pub fn schema_name(gv: GroupVersion, kind: &str) -> String {
    let mut reversed: Vec<&str> = gv.group.split('.').collect();
    reversed.reverse();
    format!("{}.{}.{kind}", reversed.join("."), gv.version)
}

/// The OpenAPI v3 schema of a kind: `properties` plus the `apiVersion`, `kind` and `metadata`
/// every object has, the kind's description and its group-version-kind.
pub fn kind_schema(
    info: &KindInfo,
    metadata_description: &str,
    properties: serde_json::Value,
) -> serde_json::Value {
    let mut all = serde_json::json!({
        "apiVersion": {"type": "string", "description": format!("APIVersion defines the versioned schema of this representation of an object: {}.", info.gv.api_version)},
        "kind": {"type": "string", "description": format!("Kind is a string value representing the REST resource this object represents: {}.", info.kind)},
        "metadata": {"$ref": format!("#/components/schemas/{OBJECT_META_SCHEMA}"), "description": metadata_description},
    });
    if let (Some(all), serde_json::Value::Object(properties)) = (all.as_object_mut(), properties) {
        all.extend(properties);
    }
    serde_json::json!({
        "type": "object",
        "description": info.description,
        "properties": all,
        "x-kubernetes-group-version-kind": [{"group": info.gv.group, "version": info.gv.version, "kind": info.kind}],
    })
}

/// RFC 3339, UTC, whole seconds, as `metav1.Time` serializes.
pub fn rfc3339(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// `metadata` of a served object, borrowed from [`Meta`]. A cluster-scoped object (empty
/// namespace) has no `namespace`, as kube-apiserver serializes it.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectMeta<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    namespace: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    uid: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    creation_timestamp: Option<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    labels: &'a std::collections::BTreeMap<String, String>,
}

impl<'a> From<&'a Meta> for ObjectMeta<'a> {
    fn from(meta: &'a Meta) -> Self {
        Self {
            name: &meta.name,
            namespace: &meta.namespace,
            uid: meta.uid.as_deref(),
            creation_timestamp: meta.creation_timestamp.map(rfc3339),
            labels: &meta.labels,
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::GroupVersion;

    /// The group-version of the test kinds.
    pub(crate) const EXAMPLE: GroupVersion = GroupVersion {
        group: "stats.example.com",
        version: "v1alpha1",
        api_version: "stats.example.com/v1alpha1",
    };
}
