//! The opt-in external metrics API, `external.metrics.k8s.io/v1beta1` (CONTRACT §6), through
//! which a HorizontalPodAutoscaler scales on Prometheus data. Served only with
//! `--enable-external-metrics`; the router hands it every path under
//! `/apis/external.metrics.k8s.io/`.
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

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use kube::core::Expression;
use serde::Serialize;

use crate::adapter::{LiveAdapter, QueryError};
use crate::config::{Invalid, QueryFile, Snapshot};
use apiserver::cache::{CacheSettings, TtlCache};

use crate::config::{ExternalMetricConfig, LiveConfig};
use crate::sources::prometheus::{Matcher, is_valid_label_name, render, validate_template};
use crate::sources::{PromError, PromSample, PromSource};
use k8s_wire::discovery::{DiscoveryResource, DynamicGroupVersions, GroupService, GroupVersionResources};
use k8s_wire::negotiate::{Endpoint, negotiate_headers};
use k8s_wire::request_info::{ParsedRequest, RequestInfo, lower_case_method};
use k8s_wire::selectors::{LabelSelector, Requirement};
use k8s_wire::status::go_quote;
use k8s_wire::validation::is_dns1123_label;
use k8s_wire::{ApiError, GroupResource};

/// API group of external metrics.
pub const GROUP: &str = "external.metrics.k8s.io";
/// The one version served.
pub const VERSION: &str = "v1beta1";
/// `apiVersion` of the responses.
pub const API_VERSION: &str = "external.metrics.k8s.io/v1beta1";
/// Kind of the responses, and of every metric in discovery (as the adapter library lists them).
pub const LIST_KIND: &str = "ExternalMetricValueList";

/// Seconds a client is asked to wait when Prometheus fails. client-go retries a 503 carrying
/// `Retry-After` up to 10 times, so a short delay keeps an HPA sync (every 15 s) from blocking
/// long on an outage, while single-flight keeps the retries from multiplying queries.
pub const PROMETHEUS_RETRY_AFTER_SECONDS: u32 = 1;

/// Name of the cache in `percolator_cache_requests_total`.
const CACHE_NAME: &str = "external.metrics.k8s.io";

/// Entries kept at most: one per (metric, namespace, selector) asked for within a TTL.
const MAX_ENTRIES: u64 = 10_000;

/// Errors of the metric APIs' endpoints (external and custom), each rendered as a
/// `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum MetricsError {
    /// Any error the generic HTTP layer knows how to render.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// 404 for a metric that is not configured or has no value for what was asked, worded like
    /// the adapter library's `NewMetricNotFoundError` / `NewMetricNotFoundForError`.
    #[error("{0}")]
    MetricNotFound(String),
}

impl MetricsError {
    /// `the server could not find the metric <metric> for <resource>`.
    pub fn not_found(metric: &str, resource: &str) -> Self {
        Self::MetricNotFound(format!("the server could not find the metric {metric} for {resource}"))
    }

    /// `the server could not find the metric <metric> for <resource> <name>`.
    pub fn not_found_for(metric: &str, resource: &str, name: &str) -> Self {
        Self::MetricNotFound(format!("the server could not find the metric {metric} for {resource} {name}"))
    }
}

/// Result alias for this module.
pub type Result<T, E = MetricsError> = std::result::Result<T, E>;

impl IntoResponse for MetricsError {
    fn into_response(self) -> Response {
        match self {
            Self::Api(error) => error.into_response(),
            Self::MetricNotFound(message) => {
                // The library's Status has no details.
                let body = serde_json::json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": message,
                    "reason": "NotFound",
                    "code": 404,
                });
                (
                    StatusCode::NOT_FOUND,
                    [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
                    body.to_string(),
                )
                    .into_response()
            }
        }
    }
}

/// What a cached result is found by. The generation keeps results of a replaced configuration
/// from being served after a reload.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct CacheKey {
    generation: u64,
    /// The adapter configuration's generation (0 without one).
    adapter_generation: u64,
    metric: String,
    namespace: String,
    /// The selector's matchers, rendered, sorted and deduplicated: selectors that differ only
    /// in order or spelling (`=` / `==`) share an entry.
    selector: String,
}

/// The external metrics service: definitions from the reloadable configuration, PromQL through
/// a [`PromSource`], results in a TTL cache with single-flight misses.
pub struct ExternalMetrics {
    prometheus: Arc<dyn PromSource>,
    config: Arc<LiveConfig>,
    cache: TtlCache<CacheKey, Bytes>,
    /// The `externalRules` of an adapter configuration, served beside the own metrics.
    adapter: Option<Arc<LiveAdapter>>,
}

impl std::fmt::Debug for ExternalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMetrics").field("config", &self.config).finish_non_exhaustive()
    }
}

impl ExternalMetrics {
    /// Serves the `externalMetrics` of `config` (checked by [`check_metrics`]) from
    /// `prometheus`, with a cache built from `cache`.
    pub fn new(prometheus: Arc<dyn PromSource>, config: Arc<LiveConfig>, cache: &CacheSettings) -> Self {
        let cache = TtlCache::new(CACHE_NAME, cache, MAX_ENTRIES);
        Self { prometheus, config, cache, adapter: None }
    }

    /// Also serves the `externalRules` of `adapter` (after the own metrics: a name both
    /// declare is the own metric's).
    #[must_use]
    pub fn with_adapter(mut self, adapter: Arc<LiveAdapter>) -> Self {
        self.adapter = Some(adapter);
        self
    }

    /// The names served: the own metrics', then the adapter rules' others.
    fn names(&self, snapshot: &Snapshot) -> Vec<String> {
        let mut names: Vec<String> = metrics_of(snapshot).iter().map(|m| m.name.clone()).collect();
        if let Some(adapter) = &self.adapter {
            let own = names.len();
            for metric in &adapter.current().external {
                if !names[..own].contains(&metric.name) {
                    names.push(metric.name.clone());
                }
            }
        }
        names
    }

    /// The discovery entry of `definitions`: one namespaced, get-only resource per metric,
    /// as the adapter library lists them.
    pub fn group_version_resources<S: AsRef<str>>(names: &[S]) -> GroupVersionResources {
        let resources = names
            .iter()
            .map(|name| DiscoveryResource {
                name: name.as_ref().to_owned(),
                singular_name: String::new(),
                namespaced: true,
                kind: LIST_KIND.to_owned(),
                verbs: vec!["get".to_owned()],
                short_names: Vec::new(),
                categories: Vec::new(),
            })
            .collect();
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
        if method != Method::GET && method != Method::HEAD {
            let verb =
                if info.verb.is_empty() { lower_case_method(method) } else { info.verb.clone() }.into_owned();
            return Err(
                ApiError::MethodNotAllowed { verb, resource: GroupResource::new(GROUP, metric) }.into()
            );
        }
        if info.verb == "watch" {
            return Err(ApiError::MethodNotAllowed {
                verb: "watch".to_owned(),
                resource: GroupResource::new(GROUP, metric),
            }
            .into());
        }
        let errs = is_dns1123_label(namespace);
        if !errs.is_empty() {
            return Err(ApiError::BadRequest(format!(
                "invalid namespace {}: {}",
                go_quote(namespace),
                errs.join("; ")
            ))
            .into());
        }

        // One snapshot for the whole request: a reload mid-request changes nothing here.
        let snapshot = self.config.current();
        let selector = LabelSelector::parse(request.query.get("labelSelector").unwrap_or_default())
            .map_err(ApiError::from)?;
        let adapter = self.adapter.as_ref().map(|a| a.current());
        // A default metric yields its name to an adapter rule; a declared one keeps it.
        let yields = !snapshot.file.declares.external_metrics
            && adapter.as_deref().is_some_and(|d| d.external_metric(metric).is_some());
        let own = metrics_of(&snapshot).iter().find(|m| m.name == metric).filter(|_| !yields);
        let (promql, window, canonical) = match own {
            Some(definition) => {
                let matchers = selector_matchers(definition, &selector)?;
                let mut canonical: Vec<String> = matchers.iter().map(ToString::to_string).collect();
                canonical.sort();
                canonical.dedup();
                let mut scope = vec![
                    Matcher::eq("namespace", namespace)
                        .map_err(|e| ApiError::Internal(format!("external metric {metric}: {e}")))?,
                ];
                scope.extend(matchers);
                let window = definition.window.unwrap_or(snapshot.window);
                let promql = render(&definition.query, &scope, window)
                    .map_err(|e| ApiError::Internal(format!("external metric {metric}: {e}")))?;
                (promql, Some(window), canonical.join(","))
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
        let fetch = async {
            match self.prometheus.query(promql).await {
                Ok(samples) => Ok(Bytes::from(value_list(metric, window, samples))),
                Err(error) => {
                    // Logged here, once per failed query, not once per waiting request.
                    tracing::warn!(%error, metric, namespace, "external metric query failed");
                    Err(error)
                }
            }
        };
        let (body, _, _) = self
            .cache
            .get_or_try_compute(key, fetch)
            .await
            .map_err(|error| prometheus_unavailable(&format!("the external metric {metric}"), &error))?;
        Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response())
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
            && (metrics_of(&self.config.current()).iter().any(|m| m.name == info.resource)
                || self
                    .adapter
                    .as_ref()
                    .is_some_and(|a| a.current().external_metric(&info.resource).is_some()));
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
    /// Both generations only grow, so their sum changes whenever either does.
    fn generation(&self) -> u64 {
        self.config.current().generation + self.adapter.as_ref().map_or(0, |a| a.generation())
    }

    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>) {
        let generation = self.generation();
        let snapshot = self.config.current();
        (generation, vec![Self::group_version_resources(&self.names(&snapshot))])
    }
}

/// The Status of an adapter rule's query that could not be built for a request: the request's
/// fault (a selector Prometheus cannot express) is a 400, the rule's a 500 naming it.
pub fn adapter_query_error(metric: &str, rule: &str, error: QueryError) -> ApiError {
    match error {
        QueryError::UnsupportedOperator(_) | QueryError::Matcher(_) | QueryError::UnsafeRawValue { .. } => {
            ApiError::BadRequest(format!("metric {metric}: {error}"))
        }
        QueryError::NoLabel(_) | QueryError::NoNamespace | QueryError::NoNames | QueryError::Empty => {
            ApiError::Internal(format!("metric {metric} ({rule} of --adapter-config): {error}"))
        }
    }
}

/// The response of a metric API's handler: its answer, or its error as a `metav1.Status`.
pub fn answer<'a>(handled: impl Future<Output = Result<Response>> + Send + 'a) -> BoxFuture<'a, Response> {
    Box::pin(async move { handled.await.unwrap_or_else(IntoResponse::into_response) })
}

/// The 503 (with `Retry-After`) of a failed Prometheus query for `what` (`the external metric x`).
pub fn prometheus_unavailable(what: &str, error: &PromError) -> ApiError {
    let cause = match error {
        PromError::Unreachable(_) => "Prometheus is unreachable",
        PromError::Query(_) => "the Prometheus query failed",
        PromError::TooLarge { .. } => "the Prometheus answer exceeded --prometheus-max-response-bytes",
    };
    ApiError::ServiceUnavailable {
        message: format!("unable to fetch {what}: {cause}"),
        retry_after: Some(PROMETHEUS_RETRY_AFTER_SECONDS),
    }
}

/// The matchers of a label selector for `definition`: `=`/`==` → `l="v"`, `!=` → `l!="v"`,
/// `in` → `l=~"v1|v2"`, `notin` → `l!~"v1|v2"` (values regex-escaped), exists → `l!=""`,
/// does-not-exist → `l=""`. A label the metric does not accept, or `gt`/`lt`, is a 400.
/// Values passed the selector parser's label-value validation and are escaped again here.
pub fn selector_matchers(
    definition: &ExternalMetricConfig,
    selector: &LabelSelector,
) -> Result<Vec<Matcher>, ApiError> {
    label_matchers(&format!("the external metric {}", definition.name), &definition.labels, selector)
}

/// The matchers of `selector` on a metric that accepts `labels` (`what` names it in errors:
/// `the external metric x`), as [`selector_matchers`] describes.
pub fn label_matchers(
    what: &str,
    labels: &[String],
    selector: &LabelSelector,
) -> Result<Vec<Matcher>, ApiError> {
    selector
        .requirements()
        .iter()
        .map(|requirement| {
            let key = requirement.key();
            if !labels.iter().any(|l| l == key) {
                let accepted = if labels.is_empty() {
                    "it accepts no label selector".to_owned()
                } else {
                    format!("it accepts: {}", labels.join(", "))
                };
                return Err(ApiError::BadRequest(format!(
                    "label {} is not accepted by {what}; {accepted}",
                    go_quote(key),
                )));
            }
            let matcher = match requirement {
                Requirement::Expr(Expression::Equal(k, v)) => Matcher::eq(k, v),
                Requirement::Expr(Expression::NotEqual(k, v)) => Matcher::ne(k, v),
                Requirement::Expr(Expression::In(k, values)) => {
                    Matcher::any_of(k, &values.iter().collect::<Vec<_>>())
                }
                Requirement::Expr(Expression::NotIn(k, values)) => {
                    Matcher::none_of(k, &values.iter().collect::<Vec<_>>())
                }
                Requirement::Expr(Expression::Exists(k)) => Matcher::ne(k, ""),
                Requirement::Expr(Expression::DoesNotExist(k)) => Matcher::eq(k, ""),
                Requirement::GreaterThan { .. } | Requirement::LessThan { .. } => {
                    return Err(ApiError::BadRequest(format!(
                        "label {}: the operators gt and lt are not supported by metric selectors; use \
                         =, ==, !=, in, notin, exists or !exists",
                        go_quote(key)
                    )));
                }
            };
            matcher.map_err(|e| ApiError::BadRequest(e.to_string()))
        })
        .collect()
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

/// `value` rounded to micro units: PromQL arithmetic leaves float noise in the last digits
/// (`rate() * 60` of an exact rate), which nano precision would print as `8400000001n`; the HPA
/// reads milli-units, so micro loses nothing it uses.
fn round_to_micro(value: f64) -> f64 {
    let scaled = value * 1e6;
    if scaled.is_finite() { scaled.round() / 1e6 } else { value }
}

/// A metric value as the metric APIs publish it: a Quantity of `value` rounded to micro units.
pub fn metric_quantity(value: f64) -> String {
    k8s_wire::quantity::decimal_si(round_to_micro(value))
}

/// The `ExternalMetricValueList` JSON of a query result: one item per series with a finite
/// value (NaN, e.g. a ratio over no requests, and infinities have no Quantity form and are
/// left out, as no data), sorted by labels.
pub fn value_list(metric: &str, window: Option<Duration>, samples: Vec<PromSample>) -> Vec<u8> {
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
            metric_labels: s.labels.into_iter().filter(|(k, _)| k != "__name__").collect(),
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
pub fn metrics_of(snapshot: &Snapshot) -> &[ExternalMetricConfig] {
    snapshot.file.external_metrics.as_deref().unwrap_or_default()
}

/// Names a metric may not take: they are namespace subresources in a Kubernetes URL
/// (`/namespaces/NS/status`), so requests for them would be authorized as such.
const RESERVED_METRIC_NAMES: [&str; 4] = [".", "..", "status", "finalize"];

fn external(name: &str, query: &str, labels: &[&str]) -> ExternalMetricConfig {
    ExternalMetricConfig {
        name: name.to_owned(),
        query: query.to_owned(),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        window: None,
    }
}

/// The compiled-in external metrics: `cafe_brews_per_minute`, `cafe_brew_duration_p95_seconds`,
/// `http_requests_per_second` and `http_error_ratio`.
pub fn default_metrics() -> Vec<ExternalMetricConfig> {
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

/// Checks the file's `externalMetrics` and fills in [`default_metrics`] when the key is
/// absent. Never empty: an empty resource list makes every kubectl discovery report an error.
pub fn check_metrics(file: &mut QueryFile) -> std::result::Result<(), Invalid> {
    let metrics = file.external_metrics.get_or_insert_with(default_metrics);
    if metrics.is_empty() {
        return Err(Invalid::new(
            "externalMetrics",
            "must list at least one metric (an empty external.metrics.k8s.io resource list makes \
             every kubectl discovery report an error); leave the key out for the defaults",
        ));
    }
    for (i, metric) in metrics.iter().enumerate() {
        let field = |name: &str| format!("externalMetrics[{i}].{name}");
        let name = &metric.name;
        check_metric_name(name).map_err(|message| Invalid::new(field("name"), message))?;
        if let Some(first) = metrics[..i].iter().position(|m| m.name == *name) {
            return Err(Invalid::new(
                field("name"),
                format!("duplicate name {name:?} (also externalMetrics[{first}])"),
            ));
        }
        validate_template(&metric.query).map_err(|e| Invalid::new(field("query"), e.to_string()))?;
        check_metric_labels(&metric.labels, &format!("externalMetrics[{i}]"))?;
        if metric.window.is_some_and(|w| w < Duration::from_secs(1)) {
            return Err(Invalid::new(field("window"), "must be at least 1s"));
        }
    }
    Ok(())
}

/// Checks a metric's name: lowercase letters, digits, `_`, `.` and `-`, and not a reserved
/// URL segment.
pub fn check_metric_name(name: &str) -> std::result::Result<(), String> {
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if !name_ok {
        return Err(format!(
            "{name:?} is not a valid metric name: 1 to 253 characters among lowercase letters, \
             digits, '_', '.' and '-'"
        ));
    }
    if RESERVED_METRIC_NAMES.contains(&name) {
        return Err(format!("{name:?} is reserved in Kubernetes URLs"));
    }
    Ok(())
}

/// Checks the `labels` a metric's selector may constrain (`at` is the metric's field path):
/// Prometheus label names, not `namespace` (the request's namespace always scopes the query),
/// not reserved, no duplicates.
pub fn check_metric_labels(labels: &[String], at: &str) -> std::result::Result<(), Invalid> {
    for (j, label) in labels.iter().enumerate() {
        let label_field = format!("{at}.labels[{j}]");
        if !is_valid_label_name(label) {
            return Err(Invalid::new(
                label_field,
                format!("{label:?} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ));
        }
        if label == "namespace" {
            return Err(Invalid::new(
                label_field,
                "\"namespace\" cannot be selected: the request's namespace always scopes the query",
            ));
        }
        if label.starts_with("__") {
            return Err(Invalid::new(label_field, format!("{label:?} is reserved by Prometheus")));
        }
        if labels[..j].contains(label) {
            return Err(Invalid::new(label_field, format!("duplicate label {label:?}")));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(yaml: &str) -> std::result::Result<QueryFile, String> {
        let check: crate::config::Check = Arc::new(check_metrics);
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
