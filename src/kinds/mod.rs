//! The served kinds. Each kind is one self-contained unit (its Rust type, its discovery entry,
//! its OpenAPI schema, its table columns, its default queries and how it is computed);
//! [`registry`] lists them and puts each behind a TTL cache (`apiserver::kind::CachedKind`),
//! and the HTTP layer (`apiserver::router`) is generic over [`ServedKind`] and never names a
//! concrete kind.
//!
//! Adding a built-in kind: one new file here exporting a [`Builtin`], its `mod` line below and
//! one line in [`registry::BUILTIN`].

pub(crate) mod declared;
pub(crate) mod inputs;
pub(crate) mod registry;

pub(crate) mod cafe_brew_stats;
pub(crate) mod pod_metrics_summary;
pub(crate) mod resource_metrics;

#[cfg(test)]
mod served_tests;
#[cfg(test)]
pub(crate) mod testkit;

use std::sync::{Arc, OnceLock};

pub(crate) use apiserver::kind::{
    Cell, Column, ComputeError, GroupVersion, KindInfo, Kinds, Listing, ListingBuilder, Meta, ObjectMeta,
    ServedKind, Text, Texts, kind_schema, rfc3339, schema_name,
};
#[cfg(test)]
pub(crate) use apiserver::kind::{CellRef, Item};
pub(crate) use inputs::{Computation, Duplicates, QueryError, SamplesBy, Sources, index_by, index_by_pod};

use crate::config::Snapshot;
use crate::sources::prometheus::Template;
use crate::sources::{Labels, PodInfo, PodKey};

/// API group of percolator's own kinds.
pub(crate) const GROUP: &str = "stats.une-tasse-de.cafe";
/// API version of percolator's own kinds.
pub(crate) const VERSION: &str = "v1alpha1";
/// `apiVersion` of percolator's own kinds.
pub(crate) const API_VERSION: &str = "stats.une-tasse-de.cafe/v1alpha1";

/// percolator's own group-version, of the built-in and declared kinds.
pub const STATS: GroupVersion = GroupVersion { group: GROUP, version: VERSION, api_version: API_VERSION };

/// percolator as its documents name it: the OpenAPI title, `/version`, and [`STATS`] listed
/// in discovery even while no kind of it is served.
pub(crate) fn server_info() -> apiserver::discovery::ServerInfo {
    apiserver::discovery::ServerInfo::new("percolator", env!("CARGO_PKG_VERSION")).with_home(STATS)
}

/// Why a kind cannot compute yet: the inventory has not synced (a 503 with `Retry-After`).
pub(crate) fn not_synced() -> ComputeError {
    ComputeError::NotReady("the pod inventory is not synced yet".into())
}

impl From<QueryError> for ComputeError {
    /// A query the kind cannot do without failed: an upstream failure, its message kept.
    fn from(error: QueryError) -> Self {
        ComputeError::Upstream(error.to_string())
    }
}

/// The metadata of the object computed for `pod`: every field shared with the inventory.
pub(crate) fn meta_of_pod(pod: &PodInfo) -> Meta {
    Meta {
        name: pod.name.clone(),
        namespace: pod.namespace.clone(),
        uid: Some(pod.uid.clone()).filter(|u| !u.is_empty()),
        creation_timestamp: pod.creation_timestamp,
        labels: pod.labels.clone(),
    }
}

/// The metadata of the object `key` computed for a group of pods (a cafe): no UID, and
/// created when its oldest pod was.
pub(crate) fn meta_of_group(key: &PodKey, pods: &[&PodInfo], labels: Arc<Labels>) -> Meta {
    Meta {
        name: key.name.clone(),
        namespace: key.namespace.clone(),
        uid: None,
        creation_timestamp: pods.iter().filter_map(|p| p.creation_timestamp).min(),
        labels,
    }
}

/// A built-in kind: what it is, the queries the file may override, and how it is built.
#[derive(Debug)]
pub struct Builtin {
    /// Names, scope and description.
    pub info: &'static KindInfo,
    /// Key of the kind's section in the query file (`podMetricsSummary`).
    pub section: &'static str,
    /// Its PromQL templates, each overridable in the section.
    pub queries: &'static [&'static QuerySpec],
    /// Builds the (uncached) kind from its sources.
    pub build: fn(Sources) -> Arc<dyn ServedKind>,
}

/// One PromQL template of a kind (a `static`: its default is compiled once). `SCOPE` stands
/// for the namespace matcher (empty across all namespaces) and `WINDOW` for the range.
#[derive(Debug)]
pub struct QuerySpec {
    /// Its key in the kind's section of the file (`requests`).
    pub field: &'static str,
    /// The compiled-in template.
    pub default: &'static str,
    /// `default` compiled, when the first configuration is checked.
    compiled: OnceLock<Template>,
}

impl QuerySpec {
    /// The template `default` for the file key `field`.
    pub const fn new(field: &'static str, default: &'static str) -> Self {
        Self { field, default, compiled: OnceLock::new() }
    }

    /// The default, compiled (once).
    pub fn default_template(&self) -> &Template {
        self.compiled.get_or_init(|| Template::new(self.default))
    }
}

impl Builtin {
    /// The template of `spec` in force: the file's override, else the default; both compiled
    /// when the configuration was read and checked.
    pub fn query<'a>(&self, config: &'a Snapshot<Template>, spec: &'a QuerySpec) -> &'a Template {
        match config.file.kind_query(self.section, spec.field) {
            Some(template) => template,
            None => spec.default_template(),
        }
    }
}
