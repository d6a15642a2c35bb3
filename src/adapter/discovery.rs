//! Discovery (prometheus-adapter's `SetSeries` in `series_registry.go` and
//! `filterAndStoreMetrics` in `external_series_registry.go`): from the series Prometheus'
//! `/api/v1/series` returns for each rule's `seriesQuery`, the metrics the rules serve.
//!
//! For each rule in file order, each series it keeps (`seriesFilters` and `name.matches`)
//! gets its API name; a custom rule serves that name on every resource its labels name
//! (namespaced unless the resource is namespaces, nodes or persistentvolumes), an external
//! rule serves the name. When two series, of one rule or of two, give the same metric (same
//! name and resource, or same external name), the adapter keeps the last one written, and so
//! does this: the later rule in the file wins, and within a rule the later series. A series
//! whose API name is empty (a group that matched nothing) serves nothing.

use std::collections::BTreeMap;

use super::config::Rule;
use k8s_wire::GroupResource;

/// One series from the series API: its labels, with `__name__`.
pub(crate) type Series = BTreeMap<String, String>;

/// A rule whose `seriesQuery` has no result in the map given to discovery.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("no series listed for query {0:?}")]
pub(crate) struct MissingSeries(pub String);

/// A custom metric a rule serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CustomMetric {
    /// The API name.
    pub name: String,
    /// The resource it is served on.
    pub resource: GroupResource,
    /// Whether it is served per namespace (false for namespaces, nodes, persistentvolumes).
    pub namespaced: bool,
    /// The Prometheus series name (`.Series` of its queries).
    pub series_name: String,
    /// The index of its rule in `rules`.
    pub rule: usize,
}

/// An external metric a rule serves.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ExternalMetric {
    /// The API name.
    pub name: String,
    /// The Prometheus series name (`.Series` of its query).
    pub series_name: String,
    /// The index of its rule in `externalRules`.
    pub rule: usize,
}

fn series_name(series: &Series) -> &str {
    series.get("__name__").map_or("", String::as_str)
}

/// The series of a rule that pass its filters, with their API names.
fn named<'a>(rule: &Rule, series: &'a [Series]) -> impl Iterator<Item = (&'a Series, String)> {
    series
        .iter()
        .filter(|s| rule.keeps_series(series_name(s)))
        .filter_map(|s| rule.api_name(series_name(s)).filter(|name| !name.is_empty()).map(|name| (s, name)))
}

fn listed<'a>(rule: &Rule, series: &'a BTreeMap<String, Vec<Series>>) -> Result<&'a [Series], MissingSeries> {
    series.get(&rule.series_query).map(Vec::as_slice).ok_or_else(|| MissingSeries(rule.series_query.clone()))
}

/// The custom metrics of `rules`, given the series listed for each `seriesQuery` (every rule's
/// query must be in the map, as the adapter fails the whole relist otherwise); sorted by name,
/// then resource.
pub(crate) fn custom_metrics(
    rules: &[Rule],
    series: &BTreeMap<String, Vec<Series>>,
) -> Result<Vec<CustomMetric>, MissingSeries> {
    let mut found: BTreeMap<(String, String, String), CustomMetric> = BTreeMap::new();
    for (index, rule) in rules.iter().enumerate() {
        for (one, name) in named(rule, listed(rule, series)?) {
            let (resources, namespaced) = rule.resources.resources_for_series(one.keys().map(String::as_str));
            for resource in resources {
                let metric = CustomMetric {
                    name: name.clone(),
                    namespaced: namespaced && !super::resources::is_root_scoped(&resource),
                    resource,
                    series_name: series_name(one).to_owned(),
                    rule: index,
                };
                let key =
                    (metric.name.clone(), metric.resource.resource.clone(), metric.resource.group.clone());
                found.insert(key, metric);
            }
        }
    }
    Ok(found.into_values().collect())
}

/// The external metrics of `rules`, given the series listed for each `seriesQuery`; sorted by
/// name.
pub(crate) fn external_metrics(
    rules: &[Rule],
    series: &BTreeMap<String, Vec<Series>>,
) -> Result<Vec<ExternalMetric>, MissingSeries> {
    let mut found: BTreeMap<String, ExternalMetric> = BTreeMap::new();
    for (index, rule) in rules.iter().enumerate() {
        for (one, name) in named(rule, listed(rule, series)?) {
            let metric =
                ExternalMetric { name: name.clone(), series_name: series_name(one).to_owned(), rule: index };
            found.insert(name, metric);
        }
    }
    Ok(found.into_values().collect())
}
