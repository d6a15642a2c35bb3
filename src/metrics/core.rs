//! What the metric APIs share: their errors and the Status wording of each, the request's
//! checks (verb, namespace and names), selector → matchers (through the adapter's one mapping,
//! [`requirement_matcher`]), the 503 of a failed query, the checks of the `--config` file's
//! metric definitions ([`Declared`], [`check_metrics`]), discovery entries and the Quantity a
//! value is published as.

use std::time::Duration;

use apiserver::StatusResponse;
use axum::response::{IntoResponse, Response};

use crate::adapter::QueryError;
use crate::adapter::query::requirement_matcher;
use crate::config::{Invalid, QueryFile, Snapshot};
use crate::sources::PromError;
use crate::sources::prometheus::{Matcher, Template, is_valid_label_name};
use k8s_wire::ApiError;
use k8s_wire::LabelSelector;
use k8s_wire::go_quote;

/// Seconds a client is asked to wait when Prometheus fails. client-go retries a 503 carrying
/// `Retry-After` up to 10 times, so a short delay keeps an HPA sync (every 15 s) from blocking
/// long on an outage, while single-flight keeps the retries from multiplying queries.
pub(crate) const PROMETHEUS_RETRY_AFTER_SECONDS: u32 = 1;

/// Entries a metric API's query cache keeps at most: one per (metric, namespace, selector)
/// asked for within a TTL.
pub(crate) const MAX_ENTRIES: u64 = 10_000;

/// Names a metric may not take: they are namespace subresources in a Kubernetes URL
/// (`/namespaces/NS/status`), so requests for them would be authorized as such.
const RESERVED_METRIC_NAMES: [&str; 4] = [".", "..", "status", "finalize"];

/// Errors of the metric APIs' endpoints (external and custom), each rendered as a
/// `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum MetricsError {
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
    pub(crate) fn not_found(metric: &str, resource: &str) -> Self {
        Self::MetricNotFound(format!("the server could not find the metric {metric} for {resource}"))
    }

    /// `the server could not find the metric <metric> for <resource> <name>`.
    pub(crate) fn not_found_for(metric: &str, resource: &str, name: &str) -> Self {
        Self::MetricNotFound(format!("the server could not find the metric {metric} for {resource} {name}"))
    }
}

/// Result alias of the metric APIs.
pub(crate) type Result<T, E = MetricsError> = std::result::Result<T, E>;

impl IntoResponse for MetricsError {
    fn into_response(self) -> Response {
        match self {
            Self::Api(error) => error.into_response(),
            // The adapter library's Status has no details.
            Self::MetricNotFound(message) => apiserver::group::not_found(&message),
        }
    }
}

/// A metric name the `--config` file may not use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum MetricNameError {
    /// Not 1 to 253 characters among lowercase letters, digits, `_`, `.` and `-`.
    #[error(
        "{0:?} is not a valid metric name: 1 to 253 characters among lowercase letters, digits, \
         '_', '.' and '-'"
    )]
    Invalid(String),
    /// A reserved URL segment ([`RESERVED_METRIC_NAMES`]).
    #[error("{0:?} is reserved in Kubernetes URLs")]
    Reserved(String),
}

/// The two metric APIs, for what their shared steps say differently.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Api {
    /// `external.metrics.k8s.io`.
    External,
    /// `custom.metrics.k8s.io`.
    Custom,
}

impl Api {
    /// How errors and logs name the API's metrics: `external`, `custom`.
    pub(crate) fn word(self) -> &'static str {
        match self {
            Self::External => "external",
            Self::Custom => "custom",
        }
    }

    /// The API group.
    pub(crate) const fn group(self) -> &'static str {
        match self {
            Self::External => "external.metrics.k8s.io",
            Self::Custom => "custom.metrics.k8s.io",
        }
    }

    /// The key of the API's metrics in the `--config` file.
    pub(crate) fn key(self) -> &'static str {
        match self {
            Self::External => "externalMetrics",
            Self::Custom => "customMetrics",
        }
    }
}

/// A metric the `--config` file declares for an API (its `externalMetrics` or
/// `customMetrics`), with the compiled-in defaults used when the key is absent.
pub(crate) trait Declared: Sized + Send + Sync + 'static {
    /// The API that serves it.
    const API: Api;
    /// The file's list, `None` before the defaults are filled in.
    fn slot(file: &mut QueryFile<Template>) -> &mut Option<Vec<Self>>;
    /// The metrics in force: [`check_metrics`] filled the defaults in when the file has none,
    /// so this is never empty.
    fn of(snapshot: &Snapshot<Template>) -> &[Self];
    /// Whether the file declares the list (rather than taking the defaults).
    fn declared(snapshot: &Snapshot<Template>) -> bool;
    /// The compiled-in metrics.
    fn defaults() -> Vec<Self>;
    /// Its name.
    fn name(&self) -> &str;
    /// Its PromQL template, compiled when the file was read.
    fn query(&self) -> &Template;
    /// The labels its selector may constrain.
    fn labels(&self) -> &[String];
    /// Its window, when it sets its own.
    fn window(&self) -> Option<Duration>;
    /// What the API requires of the query beyond a valid template (`field` is its path).
    fn check_query(&self, _field: &str) -> std::result::Result<(), Invalid> {
        Ok(())
    }
}

/// Implements [`Declared`] for a `--config` list's type: `$field` is where the file holds it
/// (`external_metrics`), `$defaults` its compiled-in metrics; further tokens go into the impl
/// (a [`Declared::check_query`]).
macro_rules! declared {
    ($type:ty, $api:ident, $field:ident, $defaults:path $(; $($extra:tt)*)?) => {
        impl $crate::metrics::core::Declared for $type {
            const API: $crate::metrics::core::Api = $crate::metrics::core::Api::$api;

            fn slot(
                file: &mut $crate::config::QueryFile<$crate::sources::prometheus::Template>,
            ) -> &mut Option<Vec<Self>> {
                &mut file.$field
            }

            fn of(snapshot: &$crate::config::Snapshot<$crate::sources::prometheus::Template>) -> &[Self] {
                snapshot.file.$field.as_deref().unwrap_or_default()
            }

            fn declared(snapshot: &$crate::config::Snapshot<$crate::sources::prometheus::Template>) -> bool {
                snapshot.file.declares.$field
            }

            fn defaults() -> Vec<Self> {
                $defaults()
            }

            fn name(&self) -> &str {
                &self.name
            }

            fn query(&self) -> &$crate::sources::prometheus::Template {
                &self.query
            }

            fn labels(&self) -> &[String] {
                &self.labels
            }

            fn window(&self) -> Option<std::time::Duration> {
                self.window
            }

            $($($extra)*)?
        }
    };
}
pub(crate) use declared;

/// Checks the file's metrics for `D`'s API and fills in its defaults when the key is absent.
/// Never empty: an empty resource list makes every kubectl discovery report an error.
pub(crate) fn check_metrics<D: Declared>(file: &mut QueryFile<Template>) -> std::result::Result<(), Invalid> {
    let key = D::API.key();
    let metrics = D::slot(file).get_or_insert_with(D::defaults);
    if metrics.is_empty() {
        return Err(Invalid::new(
            key,
            format!(
                "must list at least one metric (an empty {} resource list makes every kubectl \
                 discovery report an error); leave the key out for the defaults",
                D::API.group()
            ),
        ));
    }
    for (i, metric) in metrics.iter().enumerate() {
        let at = format!("{key}[{i}]");
        let field = |name: &str| format!("{at}.{name}");
        let name = metric.name();
        check_metric_name(name).map_err(|error| Invalid::new(field("name"), error.to_string()))?;
        if let Some(first) = metrics[..i].iter().position(|m| m.name() == name) {
            return Err(Invalid::new(
                field("name"),
                format!("duplicate name {name:?} (also {key}[{first}])"),
            ));
        }
        metric.query().check_scoped().map_err(|e| Invalid::new(field("query"), e.to_string()))?;
        metric.check_query(&field("query"))?;
        check_metric_labels(metric.labels(), &at)?;
        if metric.window().is_some_and(|w| w < Duration::from_secs(1)) {
            return Err(Invalid::new(field("window"), "must be at least 1s"));
        }
    }
    Ok(())
}

/// Checks a metric's name: lowercase letters, digits, `_`, `.` and `-`, and not a reserved
/// URL segment.
pub(crate) fn check_metric_name(name: &str) -> std::result::Result<(), MetricNameError> {
    let name_ok = !name.is_empty()
        && name.len() <= 253
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"_.-".contains(&b));
    if !name_ok {
        return Err(MetricNameError::Invalid(name.to_owned()));
    }
    if RESERVED_METRIC_NAMES.contains(&name) {
        return Err(MetricNameError::Reserved(name.to_owned()));
    }
    Ok(())
}

/// Checks the `labels` a metric's selector may constrain (`at` is the metric's field path):
/// Prometheus label names, not `namespace` (the request's namespace always scopes the query),
/// not reserved, no duplicates.
pub(crate) fn check_metric_labels(labels: &[String], at: &str) -> std::result::Result<(), Invalid> {
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

/// The matchers of `selector` on a metric that accepts `labels` (`what` names it in errors:
/// `the external metric x`), each requirement mapped by [`requirement_matcher`]. A label the
/// metric does not accept, or `gt`/`lt`, is a 400. Values passed the selector parser's
/// label-value validation and are escaped again here.
pub(crate) fn label_matchers(
    what: &str,
    labels: &[String],
    selector: &LabelSelector,
) -> std::result::Result<Vec<Matcher>, ApiError> {
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
            requirement_matcher(requirement).map_err(|error| match error {
                QueryError::UnsupportedOperator(_) => ApiError::BadRequest(format!(
                    "label {}: the operators gt and lt are not supported by metric selectors; use \
                     =, ==, !=, in, notin, exists or !exists",
                    go_quote(key)
                )),
                other => ApiError::BadRequest(other.to_string()),
            })
        })
        .collect()
}

/// A declared metric's query for one request: its template rendered with `SCOPE` =
/// `namespace="<namespace>"` plus `matchers`, and the cache key's selector part (the matchers
/// rendered, sorted and deduplicated: selectors that differ only in order or spelling, `=` /
/// `==`, share an entry).
pub(crate) fn scoped_query<D: Declared>(
    definition: &D,
    namespace: &str,
    matchers: Vec<Matcher>,
    window: Duration,
) -> std::result::Result<(String, String), ApiError> {
    let internal = |e: crate::sources::prometheus::Error| {
        ApiError::Internal(format!("{} metric {}: {e}", D::API.word(), definition.name()))
    };
    let mut canonical: Vec<String> = matchers.iter().map(ToString::to_string).collect();
    canonical.sort();
    canonical.dedup();
    let mut scope = vec![Matcher::eq("namespace", namespace).map_err(internal)?];
    scope.extend(matchers);
    let promql = definition.query().render(&scope, window).map_err(internal)?;
    Ok((promql, canonical.join(",")))
}

pub(crate) use apiserver::group::{answer, check_name, check_read, discovery_resource, json_response};

/// The Status of an adapter rule's query that could not be built for a request: the request's
/// fault (a selector Prometheus cannot express) is a 400, the rule's a 500 naming it.
pub(crate) fn adapter_query_error(metric: &str, rule: &str, error: QueryError) -> ApiError {
    match error {
        QueryError::UnsupportedOperator(_) | QueryError::Matcher(_) | QueryError::UnsafeRawValue { .. } => {
            ApiError::BadRequest(format!("metric {metric}: {error}"))
        }
        QueryError::NoLabel(_) | QueryError::NoNamespace | QueryError::NoNames | QueryError::Empty => {
            ApiError::Internal(format!("metric {metric} ({rule} of --adapter-config): {error}"))
        }
    }
}

/// The 503 (with `Retry-After`) of a failed Prometheus query for `what` (`the external metric x`).
pub(crate) fn prometheus_unavailable(what: &str, error: &PromError) -> ApiError {
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

/// `value` rounded to micro units: PromQL arithmetic leaves float noise in the last digits
/// (`rate() * 60` of an exact rate), which nano precision would print as `8400000001n`; the HPA
/// reads milli-units, so micro loses nothing it uses.
fn round_to_micro(value: f64) -> f64 {
    let scaled = value * 1e6;
    if scaled.is_finite() { scaled.round() / 1e6 } else { value }
}

/// A metric value as the metric APIs publish it: a Quantity of `value` rounded to micro units.
pub(crate) fn metric_quantity(value: f64) -> String {
    k8s_wire::quantity::decimal_si(round_to_micro(value))
}
