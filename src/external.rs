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
use http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use kube::core::Expression;
use moka::future::Cache;
use serde::Serialize;

use crate::api::discovery::{DiscoveryResource, DynamicGroupVersions, GroupVersionResources};
use crate::api::negotiate::{Endpoint, negotiate_headers};
use crate::api::request_info::{QueryParams, RequestInfo, split_path};
use crate::api::selectors::{LabelSelector, Requirement};
use crate::api::status::go_quote;
use crate::api::validation::is_dns1123_label;
use crate::api::{ApiError, GroupResource};
use crate::config::{ExternalMetricConfig, LiveConfig};
use crate::sources::prometheus::{Matcher, render};
use crate::sources::{PromError, PromSample, PromSource};
use crate::telemetry::Metrics;

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

/// Errors of the external metrics endpoints, each rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExternalError {
    /// Any error the generic HTTP layer knows how to render.
    #[error(transparent)]
    Api(#[from] ApiError),
    /// 404 for a metric that is not configured, worded like the adapter library's
    /// `NewMetricNotFoundError(resource, metric)` with the resource `namespaces/<ns>`.
    #[error("the server could not find the metric {metric} for namespaces/{namespace}")]
    MetricNotFound {
        /// The metric asked for.
        metric: String,
        /// The namespace of the request.
        namespace: String,
    },
}

/// Result alias for this module.
pub type Result<T, E = ExternalError> = std::result::Result<T, E>;

impl IntoResponse for ExternalError {
    fn into_response(self) -> Response {
        match self {
            Self::Api(error) => error.into_response(),
            Self::MetricNotFound { .. } => {
                // The library's Status has no details.
                let body = serde_json::json!({
                    "kind": "Status",
                    "apiVersion": "v1",
                    "metadata": {},
                    "status": "Failure",
                    "message": self.to_string(),
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
    cache: Cache<CacheKey, Bytes>,
    metrics: Arc<Metrics>,
}

impl std::fmt::Debug for ExternalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExternalMetrics").field("config", &self.config).finish_non_exhaustive()
    }
}

impl ExternalMetrics {
    /// Serves the `externalMetrics` of `config` from `prometheus`, caching results for `ttl`;
    /// cache lookups are counted in `metrics`.
    pub fn new(
        prometheus: Arc<dyn PromSource>,
        config: Arc<LiveConfig>,
        ttl: Duration,
        metrics: Arc<Metrics>,
    ) -> Self {
        let cache = Cache::builder().time_to_live(ttl).max_capacity(MAX_ENTRIES).build();
        Self { prometheus, config, cache, metrics }
    }

    /// The discovery entry of `definitions`: one namespaced, get-only resource per metric,
    /// as the adapter library lists them.
    pub fn group_version_resources(definitions: &[ExternalMetricConfig]) -> GroupVersionResources {
        let resources = definitions
            .iter()
            .map(|d| DiscoveryResource {
                name: d.name.clone(),
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

    /// Whether `info` is a request for a configured metric, whose name may then label the
    /// request metrics (a bounded set, unlike arbitrary paths).
    pub fn is_metric_request(&self, info: &RequestInfo) -> bool {
        info.api_group == GROUP
            && info.api_version == VERSION
            && self.config.current().queries.external_metrics.iter().any(|m| m.name == info.resource)
    }

    /// Answers any request under `/apis/external.metrics.k8s.io/`.
    pub async fn serve(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Response {
        match self.handle(method, uri, headers).await {
            Ok(response) => response,
            Err(error) => error.into_response(),
        }
    }

    async fn handle(&self, method: &Method, uri: &Uri, headers: &HeaderMap) -> Result<Response> {
        let info = RequestInfo::new(method, uri.path(), uri.query()).map_err(|_| ApiError::PathNotFound)?;
        let segments = split_path(uri.path());
        let (namespace, metric) = match segments.as_slice() {
            [_, _, version, namespaces, namespace, metric]
                if version == VERSION && namespaces == "namespaces" =>
            {
                (namespace.as_ref(), metric.as_ref())
            }
            // Only the namespaced route exists, as in the adapter library.
            _ => return Err(ApiError::PathNotFound.into()),
        };
        if method != Method::GET && method != Method::HEAD {
            let verb =
                if info.verb.is_empty() { method.as_str().to_ascii_lowercase() } else { info.verb.clone() };
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
        let definition =
            snapshot.queries.external_metrics.iter().find(|m| m.name == metric).ok_or_else(|| {
                ExternalError::MetricNotFound { metric: metric.to_owned(), namespace: namespace.to_owned() }
            })?;
        let query = QueryParams::parse(uri.query());
        let selector =
            LabelSelector::parse(query.get("labelSelector").unwrap_or_default()).map_err(ApiError::from)?;
        let matchers = selector_matchers(definition, &selector)?;
        negotiate_headers(headers, Endpoint::Plain)?;

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

        let key = CacheKey {
            generation: snapshot.generation,
            metric: metric.to_owned(),
            namespace: namespace.to_owned(),
            selector: canonical.join(","),
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
        let entry = self.cache.entry(key).or_try_insert_with(fetch).await.map_err(|error| {
            let what = match *error {
                PromError::Unreachable(_) => "Prometheus is unreachable",
                PromError::Query(_) => "the Prometheus query failed",
            };
            ApiError::ServiceUnavailable {
                message: format!("unable to fetch the external metric {metric}: {what}"),
                retry_after: Some(PROMETHEUS_RETRY_AFTER_SECONDS),
            }
        })?;
        self.metrics.cache_lookup(CACHE_NAME, !entry.is_fresh());
        Ok(([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], entry.into_value())
            .into_response())
    }
}

impl DynamicGroupVersions for ExternalMetrics {
    fn generation(&self) -> u64 {
        self.config.current().generation
    }

    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>) {
        let snapshot = self.config.current();
        (snapshot.generation, vec![Self::group_version_resources(&snapshot.queries.external_metrics)])
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
    selector
        .requirements()
        .iter()
        .map(|requirement| {
            let key = requirement.key();
            if !definition.labels.iter().any(|l| l == key) {
                let accepted = if definition.labels.is_empty() {
                    "it accepts no label selector".to_owned()
                } else {
                    format!("it accepts: {}", definition.labels.join(", "))
                };
                return Err(ApiError::BadRequest(format!(
                    "label {} is not accepted by the external metric {}; {accepted}",
                    go_quote(key),
                    definition.name
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
                        "label {}: the operators gt and lt are not supported by external metrics; use \
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
/// is whole seconds, `value` a Quantity string.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ExternalMetricValue<'a> {
    metric_name: &'a str,
    metric_labels: BTreeMap<String, String>,
    timestamp: String,
    window: u64,
    value: String,
}

/// `value` rounded to micro units: PromQL arithmetic leaves float noise in the last digits
/// (`rate() * 60` of an exact rate), which nano precision would print as `8400000001n`; the HPA
/// reads milli-units, so micro loses nothing it uses.
fn round_to_micro(value: f64) -> f64 {
    let scaled = value * 1e6;
    if scaled.is_finite() { scaled.round() / 1e6 } else { value }
}

/// The `ExternalMetricValueList` JSON of a query result: one item per series with a finite
/// value (NaN, e.g. a ratio over no requests, and infinities have no Quantity form and are
/// left out, as no data), sorted by labels.
pub fn value_list(metric: &str, window: Duration, samples: Vec<PromSample>) -> Vec<u8> {
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
            timestamp: crate::resources::rfc3339(s.timestamp),
            window: window.as_secs(),
            value: crate::quantity::decimal_si(round_to_micro(s.value)),
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

#[cfg(test)]
mod tests;
