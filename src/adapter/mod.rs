//! prometheus-adapter configuration (`--adapter-config`, docs/migrating-from-prometheus-adapter.md): the file format, its
//! checks, and the pure core of its semantics (discovery, naming, association, query
//! building), read from the adapter's documentation and sources. Only [`live`] does I/O (the
//! file, Prometheus' series API); the API modules run the queries and answer requests.
//!
//! - [`file`]: the YAML format, keys and shapes (`pkg/config/config.go`), unknown keys
//!   rejected as the adapter's strict unmarshalling rejects them;
//! - [`config`]: [`AdapterConfig::from_yaml`] checks and compiles a file; the compiled
//!   [`Rule`]s and [`ResourceRule`]s build the PromQL of requests (`metrics_query.go`);
//! - [`template`]: the `<<` `>>` Go-template subset of `metricsQuery`, `containerQuery`,
//!   `nodeQuery` and `resources.template`;
//! - [`naming`]: `seriesFilters`, `name.matches` and `name.as` (`metric_namer.go`);
//! - [`resources`]: overrides, templates and the fixed resource table (`resource_converter.go`,
//!   `lbl_res.go`);
//! - [`query`]: label-selector requirements to escaped matchers, template arguments;
//! - [`discovery`]: the metrics the rules serve, from the series Prometheus lists
//!   (`series_registry.go`, `external_series_registry.go`);
//! - [`live`]: the configuration in force, reloaded when the file changes, and its series
//!   listed at start, every `--metrics-relist-interval` and after a reload.
//!
//! # What is supported, what is rejected
//!
//! A file is accepted whole or rejected whole, at start (and on reload), with the path, the
//! rule, the field and the construct: `--adapter-config a.yaml: rules[1].seriesFilters[0]:
//! both is and isNot`. Nothing is silently ignored.
//!
//! | Construct | Status |
//! | --- | --- |
//! | `rules`, `externalRules`, `resourceRules`; an unknown key anywhere | supported; unknown key rejected (the adapter's strict unmarshalling) |
//! | `seriesQuery` | supported, passed to `/api/v1/series` as is; empty: rejected |
//! | `seriesFilters` `is` / `isNot` | supported (RE2 syntax, unanchored); both or neither in one entry, invalid regex: rejected |
//! | `name.matches` (default `.*`, also an implicit `is` filter) | supported |
//! | `name.as` (`$1`, `${1}`, `$name`, `${name}`, `$$`; default `$0` / `$1`) | supported with Go's `Regexp.Expand`; missing with 2+ groups: rejected; a reference to a group `matches` lacks (`$1_per_second` is the group `1_per_second`) expands to nothing in the adapter: rejected |
//! | `resources.overrides` (`{resource: pod}`, `{group: apps, resource: deployment}`, plural or singular) | supported for the resources of [`resources::KNOWN_RESOURCES`]; another resource, a label that is not a Prometheus label name, two labels for one resource: rejected |
//! | `resources.template` with `<<.Group>>`, `<<.Resource>>` | supported, reversed into a regex as the adapter does; without `.Resource`, other fields, not reversible, rendering no label name: rejected |
//! | `resources.namespaced` | supported in `externalRules`; `false` in `rules` or `resourceRules` (where the adapter ignores it): rejected |
//! | `rules` without overrides or template | rejected (would serve nothing) |
//! | namespaced `externalRules` without a label for namespaces | rejected (every request fails in the adapter) |
//! | `metricsQuery`, `containerQuery`, `nodeQuery` | supported; empty: rejected (the adapter has no default, its empty query fails every request) |
//! | template fields `.Series`, `.LabelMatchers`, `.GroupBy`, `.GroupBySlice`, `.LabelValuesByName` | supported in queries; `.Group`, `.Resource` only in `resources.template` |
//! | `<<index .LabelValuesByName "label">>`, `<<.LabelValuesByName.label>>` | supported (missing key: empty, and `<no value>`, as Go) |
//! | trim markers `<<- ` ` ->>`, comments `<</* */>>` | supported |
//! | `if`, `range`, `with`, `define`, `template`, `block`, `else`, `end`, variables, pipelines, parentheses, constants, functions other than `index`, unknown fields, fields of fields | rejected, naming the action |
//! | a query selector without `<<.LabelMatchers>>` (`rules`, namespaced `externalRules`, `containerQuery`) | rejected: a request must not read another namespace (`nodeQuery` and non-namespaced external rules are not checked) |
//! | `resourceRules.cpu` / `memory` | supported; queries, a label for pods, namespaces and nodes, and `containerLabel` required |
//! | `resourceRules.window` (`30s`, `1m`, `1h30m`, `1d`, `500ms`) | supported (Prometheus duration); invalid: rejected |
//!
//! Request values are always escaped (docs/design.md, "Data flow"): namespace, object names and selector values
//! become escaped PromQL strings, set matches regexes of literal alternatives (the adapter
//! passes a single `in` value, and every `=~` value, through as a raw regex). Selector `>` and
//! `<` are rejected per request, as in the adapter. `.LabelValuesByName` keeps the adapter's
//! raw values joined by `|`, and refuses a value with a quote, a backslash or a control
//! character.
//!
//! There is no RESTMapper: resources come from a fixed table (core `pods`, `namespaces`,
//! `nodes`, `services`, `persistentvolumes`, `persistentvolumeclaims`, `configmaps`,
//! `secrets`, `serviceaccounts`, `endpoints`, `replicationcontrollers`; `apps` `deployments`,
//! `statefulsets`, `replicasets`, `daemonsets`; `batch` `jobs`, `cronjobs`;
//! `networking.k8s.io` `ingresses`; `autoscaling` `horizontalpodautoscalers`; `policy`
//! `poddisruptionbudgets`), an empty group meaning whichever group has the resource.
//!
//! Kept from the adapter on purpose: a label that names no resource makes a series
//! namespaced; the template's group is matched lazily and never un-sanitized (so
//! `kube_<<.Group>>_<<.Resource>>` finds `kube_apps_deployment` but not dotted or core
//! groups); `<<.Resource>>` alone reads every label as a resource (`job` is `jobs.batch`);
//! when two rules serve the same metric, the later one wins.

pub(crate) mod config;
pub(crate) mod discovery;
pub(crate) mod file;
pub(crate) mod live;
pub(crate) mod naming;
pub(crate) mod query;
pub(crate) mod resources;
pub(crate) mod template;

pub use config::AdapterConfig;
pub(crate) use config::{AdapterError, Rule};
pub(crate) use discovery::{CustomMetric, ExternalMetric, Series, custom_metrics, external_metrics};
pub(crate) use live::{Discovered, LiveAdapter};
pub(crate) use query::QueryError;

#[cfg(test)]
mod tests;
