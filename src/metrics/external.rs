//! The opt-in external metrics API, `external.metrics.k8s.io/v1beta1` (docs/wire.md, "External metrics"), through
//! which a HorizontalPodAutoscaler scales on Prometheus data. Served only with
//! `--enable-external-metrics`; the router hands it every path under
//! `/apis/external.metrics.k8s.io/`.
//! This module keeps the routes and the wire types; the shared steps (errors, checks,
//! selector → matchers, the query cache, the two providers) are [`super::core`]'s and
//! [`super::provider`]'s.
//!
//! Endpoints (the one route the custom-metrics-apiserver library registers, and what it
//! answers around it):
//!
//! - `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/<ns>/<metric>?labelSelector=…` →
//!   `ExternalMetricValueList`, one item per series of the metric's PromQL, run with
//!   `SCOPE` = `namespace="<ns>"` plus one matcher per selector requirement;
//! - any other path under the group → 404, a write verb or `watch` on the route → 405;
//! - discovery (`/apis/external.metrics.k8s.io/v1beta1` and the group's entries in `/apis`)
//!   lists one resource per configured metric, via [`DynamicGroupVersions`], and follows
//!   configuration reloads.
//!
//! Results are cached per (configuration generation, metric, namespace, canonical selector)
//! for `--cache-ttl`; concurrent identical misses share one PromQL query and errors are not
//! cached. A Prometheus failure is a 503 with `Retry-After` (the HPA then keeps its scale),
//! never a 500.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, Method};
use serde::Serialize;

use super::core::declared;
use super::core::{
    Api, Declared, MetricsError, Result, adapter_query_error, answer, check_name, check_read,
    discovery_resource, json_response, metric_quantity, scoped_query,
};
use super::provider::{Backend, CacheKey, Provider};
use crate::adapter::LiveAdapter;
use crate::config::{ExternalMetricConfig, Invalid, LiveConfig, QueryFile, Snapshot};
use crate::sources::prometheus::{Matcher, Template};
use crate::sources::{PromSample, PromSource};
use apiserver::CacheSettings;
use apiserver::{DynamicGroupVersions, GroupService};
use k8s_wire::GroupVersionResources;
use k8s_wire::LabelSelector;
use k8s_wire::is_dns1123_label;
use k8s_wire::{ApiError, GroupResource};
use k8s_wire::{Endpoint, negotiate_headers};
use k8s_wire::{ParsedRequest, RequestInfo};

/// API group of external metrics.
pub(crate) const GROUP: &str = Api::External.group();
/// The one version served.
pub(crate) const VERSION: &str = "v1beta1";
/// `apiVersion` of the responses.
pub(crate) const API_VERSION: &str = "external.metrics.k8s.io/v1beta1";
/// Kind of the responses, and of every metric in discovery (as the adapter library lists them).
pub(crate) const LIST_KIND: &str = "ExternalMetricValueList";

/// The external metrics service: the `externalMetrics` of the reloadable configuration and the
/// `externalRules` of an adapter configuration, PromQL through a [`PromSource`], rendered
/// answers in the query cache.
#[derive(Debug)]
pub(crate) struct ExternalMetrics {
    backend: Backend<ExternalMetricConfig<Template>, Bytes>,
}

impl ExternalMetrics {
    /// Serves the `externalMetrics` of `config` (checked by [`check_metrics`]) from
    /// `prometheus`, with a cache built from `cache`.
    pub(crate) fn new(
        prometheus: Arc<dyn PromSource>,
        config: Arc<LiveConfig<Template>>,
        cache: &CacheSettings,
    ) -> Self {
        Self { backend: Backend::new(prometheus, config, cache) }
    }

    /// Also serves the `externalRules` of `adapter` (after the own metrics: a name both
    /// declare is the own metric's).
    #[must_use]
    pub(crate) fn with_adapter(mut self, adapter: Arc<LiveAdapter>) -> Self {
        self.backend.set_adapter(adapter);
        self
    }

    /// The names served: the own metrics', then the adapter rules' others.
    fn names(&self) -> Vec<String> {
        let mut names = self.backend.config.names();
        if let Some(adapter) = &self.backend.adapter {
            let own = names.len();
            for name in adapter.names() {
                if !names[..own].contains(&name) {
                    names.push(name);
                }
            }
        }
        names
    }

    /// The discovery entry of `names`: one namespaced, get-only resource per metric, as the
    /// adapter library lists them.
    pub(crate) fn group_version_resources<S: AsRef<str>>(names: &[S]) -> GroupVersionResources {
        let resources =
            names.iter().map(|name| discovery_resource(name.as_ref().to_owned(), true, LIST_KIND)).collect();
        GroupVersionResources { group: GROUP.to_owned(), version: VERSION.to_owned(), resources }
    }

    async fn handle(
        &self,
        request: &ParsedRequest,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<Response> {
        let info = request.info.as_ref().ok_or(ApiError::PathNotFound)?;
        let (namespace, metric) = match request.segs().as_slice() {
            [_, _, version, "namespaces", namespace, metric] if *version == VERSION => (*namespace, *metric),
            // Only the namespaced route exists, as in the adapter library.
            _ => return Err(ApiError::PathNotFound.into()),
        };
        check_read(info, method, GroupResource::new(GROUP, metric))?;
        check_name("namespace", namespace, is_dns1123_label)?;

        // One snapshot of each configuration for the whole request: a reload mid-request
        // changes nothing here.
        let snapshot = self.backend.config.current();
        let selector = LabelSelector::parse(request.query.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::from)?;
        let adapter = self.backend.adapter.as_ref().map(|a| a.current());
        let (promql, window, canonical) = match self.backend.own(&snapshot, adapter.as_deref(), metric) {
            Some(definition) => {
                let matchers = selector_matchers(definition, &selector)?;
                let window = definition.window.unwrap_or(snapshot.window);
                let (promql, canonical) = scoped_query(definition, namespace, matchers, window)?;
                (promql, Some(window), canonical)
            }
            None => {
                let (found, rule) = adapter
                    .as_deref()
                    .and_then(|d| d.external_metric(metric))
                    .ok_or_else(|| MetricsError::not_found(metric, &format!("namespaces/{namespace}")))?;
                let promql = rule
                    .external_query(&found.series_name, namespace, &selector)
                    .map_err(|e| adapter_query_error(metric, &rule.field(), e))?;
                // The adapter's query is the whole key: selectors that render alike share it.
                (promql.clone(), None, promql)
            }
        };
        negotiate_headers(headers, Endpoint::Plain)?;

        let key = CacheKey {
            generation: snapshot.generation,
            adapter_generation: adapter.as_ref().map_or(0, |d| d.generation),
            metric: metric.to_owned(),
            namespace: namespace.to_owned(),
            selector: canonical,
        };
        let (body, _) = self
            .backend
            .fetch(key, promql, metric, |samples| Bytes::from(value_list(metric, window, samples)))
            .await?;
        Ok(json_response(body))
    }
}

impl GroupService for ExternalMetrics {
    fn group(&self) -> &'static str {
        GROUP
    }

    /// A configured metric's name.
    fn metric_resource(&self, info: &RequestInfo) -> Option<String> {
        let known = info.api_group == GROUP
            && info.api_version == VERSION
            && (self.backend.config.serves(&info.resource)
                || self.backend.adapter.as_ref().is_some_and(|a| a.serves(&info.resource)));
        known.then(|| info.resource.clone())
    }

    fn serve<'a>(
        &'a self,
        request: &'a ParsedRequest,
        method: &'a Method,
        headers: &'a HeaderMap,
    ) -> BoxFuture<'a, Response> {
        answer(self.handle(request, method, headers))
    }
}

impl DynamicGroupVersions for ExternalMetrics {
    fn generation(&self) -> u64 {
        self.backend.generation()
    }

    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>) {
        let generation = self.generation();
        (generation, vec![Self::group_version_resources(&self.names())])
    }
}

/// The matchers of a label selector for `definition`: `=`/`==` → `l="v"`, `!=` → `l!="v"`,
/// `in` → `l=~"v1|v2"`, `notin` → `l!~"v1|v2"` (values regex-escaped), exists → `l!=""`,
/// does-not-exist → `l=""`. A label the metric does not accept, or `gt`/`lt`, is a 400.
pub fn selector_matchers(
    definition: &ExternalMetricConfig<Template>,
    selector: &LabelSelector,
) -> Result<Vec<Matcher>, ApiError> {
    Backend::<ExternalMetricConfig<Template>, Bytes>::matchers(definition, selector)
}

/// `metav1.ListMeta` of the list: always `{}`.
#[derive(Serialize)]
struct Empty {}

/// `ExternalMetricValueList` (`metrics/pkg/apis/external_metrics/v1beta1/types.go`).
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExternalMetricValueList<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: Empty,
    items: Vec<ExternalMetricValue<'a>>,
}

/// `ExternalMetricValue`: `metricLabels` is never omitted (`{}` rather than `null`), `window`
/// is whole seconds (omitted for the adapter's rules, as the adapter omits it), `value` a
/// Quantity string.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExternalMetricValue<'a> {
    metric_name: &'a str,
    metric_labels: BTreeMap<String, String>,
    timestamp: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<u64>,
    value: String,
}

/// The `ExternalMetricValueList` JSON of a query result: one item per series with a finite
/// value (NaN, e.g. a ratio over no requests, and infinities have no Quantity form and are
/// left out, as no data), sorted by labels.
pub(crate) fn value_list(metric: &str, window: Option<Duration>, samples: Vec<PromSample>) -> Vec<u8> {
    let mut items: Vec<ExternalMetricValue<'_>> = samples
        .into_iter()
        .filter(|s| {
            let finite = s.value.is_finite();
            if !finite {
                tracing::debug!(metric, value = s.value, "series without a finite value left out");
            }
            finite
        })
        .map(|s| ExternalMetricValue {
            metric_name: metric,
            metric_labels: s
                .labels
                .iter()
                .filter(|(k, _)| *k != "__name__")
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            timestamp: crate::kinds::rfc3339(s.timestamp),
            window: window.map(|w| w.as_secs()),
            value: metric_quantity(s.value),
        })
        .collect();
    items.sort_by(|a, b| a.metric_labels.cmp(&b.metric_labels));
    let list =
        ExternalMetricValueList { kind: LIST_KIND, api_version: API_VERSION, metadata: Empty {}, items };
    serde_json::to_vec(&list).unwrap_or_else(|error| {
        // Only maps with non-string keys fail, which these types do not have.
        tracing::error!(%error, "serializing an ExternalMetricValueList");
        format!(r#"{{"kind":"{LIST_KIND}","apiVersion":"{API_VERSION}","metadata":{{}},"items":[]}}"#)
            .into_bytes()
    })
}

/// The metrics in force. [`check_metrics`] filled the defaults in when the file has none, so
/// this is never empty.
pub(crate) fn metrics_of(snapshot: &Snapshot<Template>) -> &[ExternalMetricConfig<Template>] {
    ExternalMetricConfig::<Template>::of(snapshot)
}

/// Checks the file's `externalMetrics` and fills in [`default_metrics`] when the key is
/// absent. Never empty: an empty resource list makes every kubectl discovery report an error.
pub(crate) fn check_metrics(file: &mut QueryFile<Template>) -> std::result::Result<(), Invalid> {
    super::core::check_metrics::<ExternalMetricConfig<Template>>(file)
}

declared!(ExternalMetricConfig<Template>, External, external_metrics, default_metrics);

fn external(name: &str, query: &str, labels: &[&str]) -> ExternalMetricConfig<Template> {
    ExternalMetricConfig {
        name: name.to_owned(),
        query: Template::new(query),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        window: None,
    }
}

/// The compiled-in external metrics: `cafe_brews_per_minute`, `cafe_brew_duration_p95_seconds`,
/// `http_requests_per_second` and `http_error_ratio`.
pub fn default_metrics() -> Vec<ExternalMetricConfig<Template>> {
    vec![
        external(
            "cafe_brews_per_minute",
            "sum by (namespace, cafe, type) (rate(cafe_brews_total{SCOPE}[WINDOW])) * 60",
            &["cafe", "type"],
        ),
        external(
            "cafe_brew_duration_p95_seconds",
            "histogram_quantile(0.95, sum by (namespace, cafe, type, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
            &["cafe", "type"],
        ),
        external(
            "http_requests_per_second",
            "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
            &["pod", "code"],
        ),
        external(
            "http_error_ratio",
            "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW])) / sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
            &["pod"],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> std::result::Result<QueryFile<Template>, String> {
        let check: crate::config::Check<Template> = Arc::new(check_metrics);
        QueryFile::from_yaml(yaml, "f.yaml", &check).map_err(|e| e.to_string())
    }

    #[test]
    fn defaults_when_absent() {
        let file = load("window: 2m\n").unwrap();
        let metrics = file.external_metrics.unwrap();
        let names: Vec<&str> = metrics.iter().map(|m| m.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "cafe_brews_per_minute",
                "cafe_brew_duration_p95_seconds",
                "http_requests_per_second",
                "http_error_ratio"
            ]
        );
        assert_eq!(metrics[0].labels, ["cafe", "type"]);
        assert_eq!(metrics[2].labels, ["pod", "code"]);
        assert_eq!(metrics[3].labels, ["pod"]);
    }

    #[test]
    fn declared_metrics_replace_the_defaults() {
        let file = load("externalMetrics:\n- name: x.y-z\n  query: sum(rate(x{SCOPE}[WINDOW]))\n").unwrap();
        assert_eq!(
            file.external_metrics,
            Some(vec![ExternalMetricConfig {
                name: "x.y-z".into(),
                query: "sum(rate(x{SCOPE}[WINDOW]))".into(),
                labels: vec![],
                window: None,
            }])
        );
    }

    #[test]
    fn metrics_are_validated_with_the_field_named() {
        let ok = "  query: x{SCOPE}\n";
        for (yaml, field, says) in [
            ("externalMetrics: []\n".to_owned(), "externalMetrics", "at least one metric"),
            (format!("externalMetrics:\n- name: Brews\n{ok}"), "externalMetrics[0].name", "lowercase"),
            (format!("externalMetrics:\n- name: a/b\n{ok}"), "externalMetrics[0].name", "\"a/b\""),
            (format!("externalMetrics:\n- name: \"\"\n{ok}"), "externalMetrics[0].name", "1 to 253"),
            (format!("externalMetrics:\n- name: status\n{ok}"), "externalMetrics[0].name", "reserved"),
            (
                format!("externalMetrics:\n- name: a\n{ok}- name: a\n{ok}"),
                "externalMetrics[1].name",
                "duplicate name \"a\" (also externalMetrics[0])",
            ),
            (
                "externalMetrics:\n- name: a\n  query: sum(rate(x[5m]))\n".to_owned(),
                "externalMetrics[0].query",
                "would read every namespace",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [ok, app.kubernetes.io/name]\n"),
                "externalMetrics[0].labels[1]",
                "not a Prometheus label name",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [namespace]\n"),
                "externalMetrics[0].labels[0]",
                "always scopes",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [__name__]\n"),
                "externalMetrics[0].labels[0]",
                "reserved",
            ),
            (
                format!("externalMetrics:\n- name: a\n{ok}  labels: [pod, pod]\n"),
                "externalMetrics[0].labels[1]",
                "duplicate label",
            ),
            (format!("externalMetrics:\n- name: a\n{ok}  window: 10ms\n"), "externalMetrics[0].window", "1s"),
        ] {
            let err = load(&yaml).unwrap_err();
            assert!(err.starts_with(&format!("--config f.yaml: field {field}: ")), "{yaml}: {err}");
            assert!(err.contains(says), "{yaml}: {err}");
        }
        let err = load("externalMetrics:\n- name: a\n  query: x{SCOPE}\n  label: [a]\n").unwrap_err();
        assert!(err.contains("label"), "{err}");
        let err = load("externalMetrics:\n- name: a\n").unwrap_err();
        assert!(err.contains("query"), "{err}");
    }
}
