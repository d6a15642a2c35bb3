//! The opt-in custom metrics API, `custom.metrics.k8s.io` `v1beta2` and `v1beta1` (docs/reference/custom-metrics.md,
//! docs/wire.md, "Custom metrics"): the HorizontalPodAutoscaler's `Pods` and `Object` metrics. Served only
//! with `--enable-custom-metrics`; the router hands it every path under
//! `/apis/custom.metrics.k8s.io/`.
//! This module keeps the routes and the wire types; the shared steps (errors, checks,
//! selector → matchers, the query cache, the two providers) are [`super::core`]'s and
//! [`super::provider`]'s.
//!
//! Endpoints (the adapter library's routes, both versions):
//!
//! - `namespaces/NS/pods/*/METRIC?labelSelector=SEL`: one value per running pod of NS that SEL
//!   selects and that has a value, sorted by name;
//! - `namespaces/NS/pods/NAME/METRIC`: that pod (404 when it is not running or has no value);
//! - `namespaces/NS/{deployments.apps,statefulsets.apps,replicasets.apps,daemonsets.apps,services}/NAME/METRIC`:
//!   the `aggregate` of the values of the running pods the object's selector selects;
//! - `namespaces/NS/metrics/METRIC` (and the root-scoped `namespaces/NS/METRIC`): the aggregate
//!   over the namespace's running pods, described as the `Namespace`.
//!
//! Every one of them runs one PromQL vector query per (metric, namespace, metricLabelSelector),
//! with `SCOPE` = `namespace="NS"` plus the escaped matchers of `metricLabelSelector` (only on
//! the metric's declared `labels`), cached for `--cache-ttl` with single flight; the pods come
//! from the inventory (no LIST per request, no regex of pod names in PromQL) and the objects'
//! selectors from [`WorkloadSource`] (one cached GET per object).
//!
//! Unknown metric or resource: 404 worded like the adapter library; bad selector: 400;
//! Prometheus failing: 503 with `Retry-After`; never a 500 for client input.

use std::collections::HashMap;
use std::sync::Arc;

use axum::response::Response;
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderMap, Method};
use jiff::Timestamp;
use serde::Serialize;
use serde_json::Value;

use super::core::declared;
use super::core::{
    Api, Declared, MAX_ENTRIES, MetricsError, PROMETHEUS_RETRY_AFTER_SECONDS, Result, adapter_query_error,
    answer, check_name, check_read, discovery_resource, json_response, metric_quantity, scoped_query,
};
use super::provider::{Backend, CacheKey, Provider};
use crate::adapter::{Discovered, LiveAdapter, resources};
use crate::config::{Aggregate, CustomMetricConfig, Invalid, LiveConfig, QueryFile, Snapshot};
use crate::sources::prometheus::{Matcher, Template};
use crate::sources::workloads::{Workload, WorkloadError, WorkloadSource};
use crate::sources::{Inventory, PodInfo, PromSample, PromSource};
use apiserver::{CacheSettings, TtlCache};
use apiserver::{DynamicGroupVersions, GroupService};
use k8s_wire::GroupVersionResources;
use k8s_wire::LabelSelector;
use k8s_wire::{ApiError, GroupResource};
use k8s_wire::{Endpoint, negotiate_headers};
use k8s_wire::{ParsedRequest, RequestInfo};
use k8s_wire::{is_dns1123_label, is_dns1123_subdomain};

/// API group of custom metrics.
pub(crate) const GROUP: &str = Api::Custom.group();
/// The versions served, preferred first (the HPA picks the preferred one).
pub(crate) const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];
/// Kind of the responses, and of every resource in discovery.
pub(crate) const LIST_KIND: &str = "MetricValueList";

/// Name of the rendered answers' cache in `percolator_cache_requests_total`.
const RESPONSES_CACHE_NAME: &str = "custom.metrics.k8s.io responses";
/// Seconds a client is asked to wait while the inventory is not synced.
const NOT_SYNCED_RETRY_AFTER_SECONDS: u32 = 1;

/// The labels every custom metric's query must keep: they place each value on a pod.
const POD_LABELS: [&str; 2] = ["namespace", "pod"];

/// What a request asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target<'a> {
    /// Pods of the namespace: all that a label selector selects (`*`), or one by name.
    Pods(Option<&'a str>),
    /// A workload object, by name.
    Object(Workload, &'a str),
    /// The namespace itself.
    Namespace,
    /// Another object (`resource` as the path spells it), served only by an adapter rule
    /// whose series carry a label for that resource; `namespaced` unless root-scoped.
    Other { resource: &'a str, name: &'a str, namespaced: bool },
}

impl<'a> Target<'a> {
    /// The group-resource string of errors and discovery.
    fn resource(&self) -> &'a str {
        match self {
            Self::Pods(_) => "pods",
            Self::Object(workload, _) => workload.resource(),
            Self::Namespace => "namespaces",
            Self::Other { resource, .. } => resource,
        }
    }
}

/// One pod's value of a metric.
#[derive(Debug, Clone, Copy, PartialEq)]
struct PodValue {
    value: f64,
    timestamp: Timestamp,
}

/// The values of one metric in one namespace, by pod name: the names in one buffer and the
/// values sorted by name, two allocations however many pods. They live as long as the cached
/// answer, among its query's short-lived blocks: one string per pod would hold the allocator's
/// pages (RELIABILITY.md, "Soak").
#[derive(Debug, Default)]
struct PodValues {
    names: String,
    /// (where the name is in `names`, its value), sorted by name.
    values: Vec<(u32, u32, PodValue)>,
}

impl PodValues {
    /// The value of the pod `name`.
    fn get(&self, name: &str) -> Option<&PodValue> {
        let name_of = |(start, end, _): &(u32, u32, PodValue)| self.names.get(*start as usize..*end as usize);
        let at = self.values.binary_search_by(|entry| name_of(entry).unwrap_or_default().cmp(name)).ok()?;
        self.values.get(at).map(|(_, _, value)| value)
    }
}

/// The custom metrics service: the `customMetrics` of the reloadable configuration and the
/// `rules` of an adapter configuration, values through a [`PromSource`], pods from the
/// [`Inventory`], objects from a [`WorkloadSource`].
pub(crate) struct CustomMetrics {
    backend: Backend<CustomMetricConfig<Template>, Arc<PodValues>>,
    inventory: Arc<dyn Inventory>,
    workloads: Arc<dyn WorkloadSource>,
    /// Rendered answers, by request (version, path, both selectors), each kept until the
    /// values it was built from expire: a warm request is a lookup.
    responses: TtlCache<(u64, String), Bytes>,
}

impl std::fmt::Debug for CustomMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CustomMetrics").field("backend", &self.backend).finish_non_exhaustive()
    }
}

impl CustomMetrics {
    /// Serves the `customMetrics` of `config` (checked by [`check_metrics`]).
    pub(crate) fn new(
        prometheus: Arc<dyn PromSource>,
        inventory: Arc<dyn Inventory>,
        workloads: Arc<dyn WorkloadSource>,
        config: Arc<LiveConfig<Template>>,
        cache: &CacheSettings,
    ) -> Self {
        let responses = TtlCache::new(RESPONSES_CACHE_NAME, cache, MAX_ENTRIES);
        Self { backend: Backend::new(prometheus, config, cache), inventory, workloads, responses }
    }

    /// Also serves the `rules` of `adapter` (after the own metrics: a name both declare is the
    /// own metric's, for the resources the own metric serves).
    #[must_use]
    pub(crate) fn with_adapter(mut self, adapter: Arc<LiveAdapter>) -> Self {
        self.backend.set_adapter(adapter);
        self
    }

    /// The discovery entries of `definitions`, one per version: per metric, `pods/M`, each
    /// workload resource's `R/M` (namespaced) and `namespaces/M` (cluster), get only, as the
    /// adapter library lists them.
    pub(crate) fn group_version_resources(
        definitions: &[CustomMetricConfig<Template>],
    ) -> Vec<GroupVersionResources> {
        let resource = |name: String, namespaced: bool| discovery_resource(name, namespaced, LIST_KIND);
        let mut resources = Vec::new();
        for d in definitions {
            resources.push(resource(format!("pods/{}", d.name), true));
            for workload in Workload::ALL {
                resources.push(resource(format!("{}/{}", workload.resource(), d.name), true));
            }
            resources.push(resource(format!("namespaces/{}", d.name), false));
        }
        VERSIONS
            .iter()
            .map(|version| GroupVersionResources {
                group: GROUP.to_owned(),
                version: (*version).to_owned(),
                resources: resources.clone(),
            })
            .collect()
    }

    async fn handle(
        &self,
        request: &ParsedRequest,
        method: &Method,
        headers: &HeaderMap,
    ) -> Result<Response> {
        let info = request.info.as_ref().ok_or(ApiError::PathNotFound)?;
        let segs = request.segs();
        let (version, rest) = match segs.as_slice() {
            [_, _, version, rest @ ..] if VERSIONS.contains(version) => (*version, rest),
            _ => return Err(ApiError::PathNotFound.into()),
        };
        let (namespace, target, metric) = match rest {
            ["namespaces", ns, "pods", name, metric] => {
                (*ns, Target::Pods((*name != "*").then_some(*name)), *metric)
            }
            ["namespaces", ns, "metrics", metric] | ["namespaces", ns, metric] => {
                (*ns, Target::Namespace, *metric)
            }
            ["namespaces", ns, resource, name, metric] => match Workload::from_resource(resource) {
                Some(workload) => (*ns, Target::Object(workload, name), *metric),
                None => (*ns, Target::Other { resource, name, namespaced: true }, *metric),
            },
            // A root-scoped object other than a namespace: only an adapter rule serves one.
            [resource, name, metric] => ("", Target::Other { resource, name, namespaced: false }, *metric),
            _ => return Err(ApiError::PathNotFound.into()),
        };
        check_read(info, method, GroupResource::new(GROUP, target.resource()))?;
        if !matches!(target, Target::Other { namespaced: false, .. }) {
            check_name("namespace", namespace, is_dns1123_label)?;
        }
        match target {
            Target::Object(_, "*") | Target::Other { name: "*", .. } => {
                return Err(ApiError::BadRequest(format!(
                    "{} are only served by name; a label selector is accepted for pods/*",
                    target.resource()
                ))
                .into());
            }
            Target::Pods(Some(name)) | Target::Object(_, name) | Target::Other { name, .. } => {
                check_name("name", name, is_dns1123_subdomain)?
            }
            Target::Pods(None) | Target::Namespace => {}
        }

        // One snapshot of each configuration for the whole request: a reload mid-request
        // changes nothing here.
        let snapshot = self.backend.config.current();
        let discovered = self.backend.adapter.as_ref().map(|a| a.current());
        let own = match target {
            Target::Other { .. } => None,
            _ => self.backend.own(&snapshot, discovered.as_deref(), metric),
        };
        let Some(definition) = own else {
            let ask = (version, namespace, target, metric);
            return self.handle_adapter(request, headers, discovered.as_deref(), ask).await;
        };
        let (pod_selector, metric_selector) = selectors(request, target)?;
        let matchers =
            Backend::<CustomMetricConfig<Template>, Arc<PodValues>>::matchers(definition, &metric_selector)?;
        negotiate_headers(headers, Endpoint::Plain)?;
        if !self.inventory.is_synced() {
            return Err(ApiError::ServiceUnavailable {
                message: "the pod inventory is not synced yet".to_owned(),
                retry_after: Some(NOT_SYNCED_RETRY_AFTER_SECONDS),
            }
            .into());
        }

        // The answer to this exact request, while the values it was built from are fresh.
        let response_key = (
            snapshot.generation,
            format!(
                "{}?{}&{}",
                request.segs().join("/"),
                request.query.get("labelSelector").unwrap_or_default(),
                request.query.get("metricLabelSelector").unwrap_or_default()
            ),
        );
        if let Some((body, _)) = self.responses.peek(&response_key).await {
            self.responses.count(true);
            return Ok(json_response(body));
        }
        self.responses.count(false);
        let (values, expires_at) = self.values(&snapshot, definition, namespace, matchers).await?;
        let window = Some(definition.window.unwrap_or(snapshot.window).as_secs());
        let pods = self.inventory.running_pods(Some(namespace));
        let items = match target {
            Target::Pods(None) => pods
                .iter()
                .filter(|p| pod_selector.matches(&p.labels))
                .filter_map(|p| {
                    Some(Item {
                        object: Described::pod(namespace, &p.name),
                        value: *values.get(&p.name)?,
                        window,
                    })
                })
                .collect(),
            Target::Pods(Some(name)) => {
                let value = pods
                    .iter()
                    .find(|p| &*p.name == name)
                    .and_then(|p| values.get(&p.name))
                    .ok_or_else(|| MetricsError::not_found_for(metric, "pods", name))?;
                vec![Item { object: Described::pod(namespace, name), value: *value, window }]
            }
            Target::Object(workload, name) => {
                let selection = self
                    .workloads
                    .selection(workload, namespace, name)
                    .await
                    .map_err(|e| workload_unavailable(&e))?
                    .ok_or_else(|| {
                        let (resource, group) =
                            workload.resource().split_once('.').unwrap_or((workload.resource(), ""));
                        ApiError::NotFound {
                            resource: GroupResource::new(group, resource),
                            name: name.to_owned(),
                        }
                    })?;
                let selected = pods.iter().filter(|p| selection.selects(&p.labels));
                let value = aggregate(definition.aggregate, selected, &values)
                    .ok_or_else(|| MetricsError::not_found_for(metric, workload.resource(), name))?;
                let object = Described {
                    kind: workload.kind(),
                    api_version: workload.api_version(),
                    namespace: Some(namespace),
                    name,
                };
                vec![Item { object, value, window }]
            }
            Target::Namespace => {
                let value = aggregate(definition.aggregate, pods.iter(), &values)
                    .ok_or_else(|| MetricsError::not_found_for(metric, "namespaces", namespace))?;
                let object =
                    Described { kind: "Namespace", api_version: "/v1", namespace: None, name: namespace };
                vec![Item { object, value, window }]
            }
            // Own metrics serve pods, workloads and namespaces only (`own` is `None` here).
            Target::Other { resource, .. } => return Err(MetricsError::not_found(metric, resource)),
        };
        let body = Bytes::from(value_list(version, metric, &metric_selector, &items));
        self.responses.insert_until(response_key, body.clone(), expires_at).await;
        Ok(json_response(body))
    }

    /// A metric of the adapter configuration's `rules` (`--adapter-config`), served with the
    /// adapter's semantics: pods selected locally from the inventory (`.LabelMatchers` holds
    /// the namespace and the metric selector, no regex of pod names), other objects and
    /// namespaces by their label in the series.
    async fn handle_adapter(
        &self,
        request: &ParsedRequest,
        headers: &HeaderMap,
        discovered: Option<&Discovered>,
        (version, namespace, target, metric): (&str, &str, Target<'_>, &str),
    ) -> Result<Response> {
        let not_found = || MetricsError::not_found(metric, target.resource());
        let discovered = discovered.ok_or_else(not_found)?;
        let (resource, names): (GroupResource, Option<Vec<&str>>) = match target {
            Target::Pods(_) => (GroupResource::new("", "pods"), None),
            Target::Namespace => (resources::namespaces(), Some(vec![namespace])),
            Target::Object(_, name) | Target::Other { name, .. } => {
                let (plural, group) = target.resource().split_once('.').unwrap_or((target.resource(), ""));
                (resources::normalize(group, plural).ok_or_else(not_found)?, Some(vec![name]))
            }
        };
        let (found, rule) = discovered.custom_metric(metric, &resource).ok_or_else(not_found)?;
        if found.namespaced != !matches!(target, Target::Namespace | Target::Other { namespaced: false, .. })
        {
            return Err(not_found());
        }
        let (pod_selector, metric_selector) = selectors(request, target)?;
        negotiate_headers(headers, Endpoint::Plain)?;
        // Namespaces are root-scoped: their query names them and carries no namespace of its own.
        let query_namespace = (found.namespaced && !namespace.is_empty()).then_some(namespace);
        let promql = rule
            .query(&found.series_name, &resource, query_namespace, &metric_selector, names.as_deref())
            .map_err(|e| adapter_query_error(metric, &rule.field(), e))?;
        let label = rule
            .resources
            .label_for_resource(&resource)
            .map_err(|e| ApiError::Internal(format!("metric {metric} ({}): {e}", rule.field())))?;
        let key = CacheKey {
            generation: discovered.generation,
            adapter_generation: 0,
            metric: format!("adapter:{metric}"),
            namespace: namespace.to_owned(),
            selector: promql.clone(),
        };
        // One value per object, by its label.
        let (values, _) = self
            .backend
            .fetch(key, promql, metric, |samples| pod_values(&samples, |sample| sample.labels.get(&label)))
            .await?;
        let items = match target {
            Target::Pods(None) => {
                if !self.inventory.is_synced() {
                    return Err(ApiError::ServiceUnavailable {
                        message: "the pod inventory is not synced yet".to_owned(),
                        retry_after: Some(NOT_SYNCED_RETRY_AFTER_SECONDS),
                    }
                    .into());
                }
                let pods = self.inventory.running_pods(Some(namespace));
                let items: Vec<(String, PodValue)> = pods
                    .iter()
                    .filter(|p| pod_selector.matches(&p.labels))
                    .filter_map(|p| Some((p.name.to_string(), *values.get(&p.name)?)))
                    .collect();
                if items.is_empty() {
                    // The adapter's answer when no series matched.
                    return Err(not_found());
                }
                items
            }
            Target::Pods(Some(name)) | Target::Object(_, name) | Target::Other { name, .. } => {
                let value = values
                    .get(name)
                    .ok_or_else(|| MetricsError::not_found_for(metric, target.resource(), name))?;
                vec![(name.to_owned(), *value)]
            }
            Target::Namespace => {
                let value = values
                    .get(namespace)
                    .ok_or_else(|| MetricsError::not_found_for(metric, "namespaces", namespace))?;
                vec![(namespace.to_owned(), *value)]
            }
        };
        let (kind, api_version) = resources::kind_and_api_version(&resource);
        let described_namespace = found.namespaced.then_some(namespace);
        let items: Vec<Item<'_>> = items
            .iter()
            .map(|(name, value)| Item {
                object: Described { kind, api_version, namespace: described_namespace, name },
                value: *value,
                window: None,
            })
            .collect();
        Ok(json_response(Bytes::from(value_list(version, metric, &metric_selector, &items))))
    }

    /// The values of `definition` in `namespace` under `matchers`: cached, one query for every
    /// concurrent miss; with when they expire.
    async fn values(
        &self,
        snapshot: &Snapshot<Template>,
        definition: &CustomMetricConfig<Template>,
        namespace: &str,
        matchers: Vec<Matcher>,
    ) -> Result<(Arc<PodValues>, std::time::Instant)> {
        let metric = &definition.name;
        let window = definition.window.unwrap_or(snapshot.window);
        let (promql, selector) = scoped_query(definition, namespace, matchers, window)?;
        let key = CacheKey {
            generation: snapshot.generation,
            adapter_generation: 0,
            metric: metric.clone(),
            namespace: namespace.to_owned(),
            selector,
        };
        self.backend
            .fetch(key, promql, metric, |samples| {
                pod_values(&samples, |sample| {
                    let (ns, pod) = (sample.labels.get("namespace")?, sample.labels.get("pod")?);
                    (ns == namespace).then_some(pod)
                })
            })
            .await
    }
}

impl GroupService for CustomMetrics {
    fn group(&self) -> &'static str {
        GROUP
    }

    /// `<resource>/<metric>` of a configured metric on a served resource (a bounded set).
    fn metric_resource(&self, info: &RequestInfo) -> Option<String> {
        if info.api_group != GROUP || !VERSIONS.contains(&info.api_version.as_str()) {
            return None;
        }
        let (resource, metric) = match (info.resource.as_str(), info.subresource.as_str()) {
            ("namespaces", "") => return None,
            // `namespaces/NS/metrics/M` parses as resource `metrics`, name `M`.
            ("metrics", "") => ("namespaces", info.name.as_str()),
            ("namespaces", metric) => ("namespaces", metric),
            (resource, metric) => (resource, metric),
        };
        let served =
            resource == "pods" || Workload::from_resource(resource).is_some() || resource == "namespaces";
        let own = served && self.backend.config.serves(metric);
        let adapter = || {
            self.backend.adapter.as_ref().is_some_and(|a| {
                a.current()
                    .custom
                    .iter()
                    .any(|m| m.name == metric && resources::path_name(&m.resource) == resource)
            })
        };
        (own || adapter()).then(|| format!("{resource}/{metric}"))
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

impl DynamicGroupVersions for CustomMetrics {
    fn generation(&self) -> u64 {
        self.backend.generation()
    }

    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>) {
        let generation = self.generation();
        let snapshot = self.backend.config.current();
        let mut versions = Self::group_version_resources(metrics_of(&snapshot));
        if let Some(adapter) = &self.backend.adapter {
            let discovered = adapter.current();
            for version in &mut versions {
                for metric in &discovered.custom {
                    let name = format!("{}/{}", resources::path_name(&metric.resource), metric.name);
                    if version.resources.iter().any(|r| r.name == name) {
                        continue;
                    }
                    version.resources.push(discovery_resource(name, metric.namespaced, LIST_KIND));
                }
            }
        }
        (generation, versions)
    }
}

/// The request's pod selector (`labelSelector`, for `pods/*` only) and metric selector
/// (`metricLabelSelector`).
fn selectors(
    request: &ParsedRequest,
    target: Target<'_>,
) -> Result<(LabelSelector, LabelSelector), ApiError> {
    let parse = |name: &str| LabelSelector::parse(request.query.get(name).unwrap_or_default());
    let pods = match target {
        Target::Pods(None) => parse("labelSelector")?,
        _ => LabelSelector::everything(),
    };
    Ok((pods, parse("metricLabelSelector")?))
}

/// The values of `samples` per object `name_of` names (samples it names none of are left
/// out): the series of one object added up (the newest sample time wins), non-finite values
/// left out.
fn pod_values(samples: &[PromSample], name_of: impl Fn(&PromSample) -> Option<&str>) -> Arc<PodValues> {
    let mut by_name: HashMap<&str, PodValue> = HashMap::new();
    for sample in samples.iter().filter(|s| s.value.is_finite()) {
        if let Some(name) = name_of(sample) {
            let entry = by_name.entry(name).or_insert(PodValue { value: 0.0, timestamp: sample.timestamp });
            entry.value += sample.value;
            entry.timestamp = entry.timestamp.max(sample.timestamp);
        }
    }
    let mut sorted: Vec<(&str, PodValue)> = by_name.into_iter().collect();
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    let mut values = PodValues {
        names: String::with_capacity(sorted.iter().map(|(name, _)| name.len()).sum()),
        values: Vec::with_capacity(sorted.len()),
    };
    let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    for (name, value) in sorted {
        let start = as_u32(values.names.len());
        values.names.push_str(name);
        values.values.push((start, as_u32(values.names.len()), value));
    }
    Arc::new(values)
}

/// 503 (with `Retry-After`) when a workload object could not be read.
fn workload_unavailable(error: &WorkloadError) -> ApiError {
    tracing::warn!(%error, "reading a workload object for a custom metric failed");
    ApiError::ServiceUnavailable {
        message: format!("unable to read the object the metric describes: {error}"),
        retry_after: Some(PROMETHEUS_RETRY_AFTER_SECONDS),
    }
}

/// The `aggregate` of the values of `pods` that have one; `None` when none has.
fn aggregate<'a>(
    how: Aggregate,
    pods: impl Iterator<Item = &'a Arc<PodInfo>>,
    values: &PodValues,
) -> Option<PodValue> {
    let mut found = pods.filter_map(|p| values.get(&p.name)).peekable();
    let first = *found.peek()?;
    let (mut sum, mut max, mut count, mut timestamp) = (0.0, f64::NEG_INFINITY, 0u32, first.timestamp);
    for v in found {
        sum += v.value;
        max = max.max(v.value);
        count += 1;
        timestamp = timestamp.max(v.timestamp);
    }
    let value = match how {
        Aggregate::Sum => sum,
        Aggregate::Avg => sum / f64::from(count),
        Aggregate::Max => max,
    };
    Some(PodValue { value, timestamp })
}

/// The object a value describes (`describedObject`, a `v1.ObjectReference`).
#[derive(Debug, Clone, Copy, Serialize)]
#[serde(rename_all = "camelCase")]
struct Described<'a> {
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    namespace: Option<&'a str>,
    name: &'a str,
    api_version: &'static str,
}

impl<'a> Described<'a> {
    fn pod(namespace: &'a str, name: &'a str) -> Self {
        Self { kind: "Pod", api_version: "/v1", namespace: Some(namespace), name }
    }
}

/// One value to publish.
struct Item<'a> {
    object: Described<'a>,
    value: PodValue,
    /// Seconds; `None` for an adapter rule's value (the adapter writes none).
    window: Option<u64>,
}

/// `MetricValueList`'s `metadata`: always `{}`.
#[derive(Serialize)]
struct ListMeta {}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct MetricValueList<'a, T> {
    kind: &'static str,
    api_version: &'a str,
    metadata: ListMeta,
    items: Vec<T>,
}

/// v1beta2 `MetricValue`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ValueV2<'a> {
    described_object: Described<'a>,
    metric: MetricIdentifier<'a>,
    timestamp: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    window_seconds: Option<u64>,
    value: String,
}

/// v1beta2 `MetricIdentifier`.
#[derive(Serialize, Clone, Copy)]
struct MetricIdentifier<'a> {
    name: &'a str,
    selector: &'a Value,
}

/// v1beta1 `MetricValue`.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ValueV1<'a> {
    described_object: Described<'a>,
    metric_name: &'a str,
    timestamp: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    window: Option<u64>,
    value: String,
    selector: &'a Value,
}

/// The `MetricValueList` JSON of `items` in `version`: `v1beta2` has `metric: {name, selector}`
/// and `windowSeconds`; `v1beta1` has `metricName`, `selector` and `window` (both seconds).
/// `selector` is never omitted (`null` when empty), as the Go types serialize it.
fn value_list(version: &str, metric: &str, selector: &LabelSelector, items: &[Item<'_>]) -> Vec<u8> {
    let selector = selector.to_metav1_json();
    let api_version = format!("{GROUP}/{version}");
    // The values of one query share their sample time: format each distinct time once.
    let mut times: Vec<(Timestamp, String)> = Vec::new();
    for item in items {
        if !times.iter().any(|(t, _)| *t == item.value.timestamp) {
            times.push((item.value.timestamp, crate::kinds::rfc3339(item.value.timestamp)));
        }
    }
    let time = |t: Timestamp| times.iter().find(|(at, _)| *at == t).map_or("", |(_, s)| s.as_str());
    let rows = items.iter().map(|item| {
        (item.object, time(item.value.timestamp), item.window, metric_quantity(item.value.value))
    });
    let written = if version == "v1beta1" {
        let items = rows
            .map(|(described_object, timestamp, window, value)| {
                let selector = &selector;
                ValueV1 { described_object, metric_name: metric, timestamp, window, value, selector }
            })
            .collect();
        serde_json::to_vec(&MetricValueList {
            kind: LIST_KIND,
            api_version: &api_version,
            metadata: ListMeta {},
            items,
        })
    } else {
        let metric = MetricIdentifier { name: metric, selector: &selector };
        let items: Vec<ValueV2<'_>> = rows
            .map(|(described_object, timestamp, window_seconds, value)| ValueV2 {
                described_object,
                metric,
                timestamp,
                window_seconds,
                value,
            })
            .collect();
        let list =
            MetricValueList { kind: LIST_KIND, api_version: &api_version, metadata: ListMeta {}, items };
        serde_json::to_vec(&list)
    };
    written.unwrap_or_else(|error| {
        // Only maps with non-string keys fail, which these types do not have.
        tracing::error!(%error, "serializing a MetricValueList");
        format!(r#"{{"kind":"{LIST_KIND}","apiVersion":"{api_version}","metadata":{{}},"items":[]}}"#)
            .into_bytes()
    })
}

/// The metrics in force. [`check_metrics`] filled the defaults in when the file has none, so
/// this is never empty.
pub(crate) fn metrics_of(snapshot: &Snapshot<Template>) -> &[CustomMetricConfig<Template>] {
    CustomMetricConfig::<Template>::of(snapshot)
}

/// Checks the file's `customMetrics` and fills in [`default_metrics`] when the key is absent.
/// Never empty: an empty resource list makes every kubectl discovery report an error.
pub(crate) fn check_metrics(file: &mut QueryFile<Template>) -> std::result::Result<(), Invalid> {
    super::core::check_metrics::<CustomMetricConfig<Template>>(file)
}

declared!(CustomMetricConfig<Template>, Custom, custom_metrics, default_metrics;
    /// The query keeps the labels that place each value on a pod ([`POD_LABELS`]).
    fn check_query(&self, field: &str) -> std::result::Result<(), Invalid> {
        for label in POD_LABELS {
            self.query.keeps_label(label).map_err(|message| {
                Invalid::new(field, format!("{message}, which places each value on a pod"))
            })?;
        }
        Ok(())
    }
);

fn custom(name: &str, query: &str, labels: &[&str]) -> CustomMetricConfig<Template> {
    CustomMetricConfig {
        name: name.to_owned(),
        query: Template::new(query),
        labels: labels.iter().map(|l| (*l).to_owned()).collect(),
        aggregate: Aggregate::Sum,
        window: None,
    }
}

/// The compiled-in custom metrics: `http_requests_per_second` and `http_errors_per_second`
/// (5xx), per pod.
pub fn default_metrics() -> Vec<CustomMetricConfig<Template>> {
    vec![
        custom(
            "http_requests_per_second",
            "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
            &["code"],
        ),
        custom(
            "http_errors_per_second",
            "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))",
            &[],
        ),
    ]
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn load(yaml: &str) -> std::result::Result<QueryFile<Template>, String> {
        let check: crate::config::Check<Template> = Arc::new(check_metrics);
        QueryFile::from_yaml(yaml, "f.yaml", &check).map_err(|e| e.to_string())
    }

    #[test]
    fn pod_values_add_up_a_pods_series_and_are_found_by_name() {
        use crate::kinds::testkit::mk_sample;
        let samples = [
            mk_sample(&[("pod", "web-2")], 2.0, "2026-07-01T10:00:00Z"),
            mk_sample(&[("pod", "web-10")], 1.0, "2026-07-01T10:00:00Z"),
            mk_sample(&[("pod", "web-2")], 0.5, "2026-07-01T10:00:05Z"),
            mk_sample(&[("pod", "web-1")], f64::NAN, "2026-07-01T10:00:00Z"),
            mk_sample(&[("other", "x")], 9.0, "2026-07-01T10:00:00Z"),
            mk_sample(&[("pod", "a")], 3.0, "2026-07-01T10:00:00Z"),
        ];
        let values = pod_values(&samples, |s| s.labels.get("pod"));
        let at = |t: &str| t.parse::<Timestamp>().unwrap();
        assert_eq!(
            values.get("web-2"),
            Some(&PodValue { value: 2.5, timestamp: at("2026-07-01T10:00:05Z") })
        );
        assert_eq!(values.get("web-10").map(|v| v.value), Some(1.0));
        assert_eq!(values.get("a").map(|v| v.value), Some(3.0));
        for absent in ["web-1", "web", "x", "", "web-20", "zz"] {
            assert_eq!(values.get(absent), None, "{absent}");
        }
        assert_eq!(values.names, "aweb-10web-2", "one buffer, in name order");
        assert_eq!(PodValues::default().get("a"), None);
    }

    #[test]
    fn defaults_when_absent_and_declared_metrics_replace_them() {
        let file = load("window: 2m\n").unwrap();
        assert_eq!(file.custom_metrics, Some(default_metrics()));
        let names: Vec<String> = default_metrics().into_iter().map(|m| m.name).collect();
        assert_eq!(names, ["http_requests_per_second", "http_errors_per_second"]);

        let file = load(
            "customMetrics:\n- name: queue_depth\n  query: max by (namespace, pod) (q{SCOPE})\n  aggregate: max\n  labels: [queue]\n",
        )
        .unwrap();
        let metric = &file.custom_metrics.unwrap()[0];
        assert_eq!(metric.aggregate, Aggregate::Max);
        assert_eq!(metric.labels, ["queue"]);
    }

    #[test]
    fn metrics_are_validated_with_the_field_named() {
        let ok = "  query: sum by (namespace, pod) (x{SCOPE})\n";
        for (yaml, field, says) in [
            ("customMetrics: []\n".to_owned(), "customMetrics", "at least one metric"),
            (format!("customMetrics:\n- name: Rps\n{ok}"), "customMetrics[0].name", "lowercase"),
            (format!("customMetrics:\n- name: status\n{ok}"), "customMetrics[0].name", "reserved"),
            (
                format!("customMetrics:\n- name: a\n{ok}- name: a\n{ok}"),
                "customMetrics[1].name",
                "duplicate name \"a\" (also customMetrics[0])",
            ),
            (
                "customMetrics:\n- name: a\n  query: sum by (pod) (rate(x[5m]))\n".to_owned(),
                "customMetrics[0].query",
                "would read every namespace",
            ),
            (
                "customMetrics:\n- name: a\n  query: sum by (namespace) (x{SCOPE})\n".to_owned(),
                "customMetrics[0].query",
                "which places each value on a pod",
            ),
            (
                "customMetrics:\n- name: a\n  query: sum by (pod) (x{SCOPE})\n".to_owned(),
                "customMetrics[0].query",
                "which places each value on a pod",
            ),
            (
                format!("customMetrics:\n- name: a\n{ok}  labels: [namespace]\n"),
                "customMetrics[0].labels[0]",
                "always scopes",
            ),
            (
                format!("customMetrics:\n- name: a\n{ok}  labels: [a-b]\n"),
                "customMetrics[0].labels[0]",
                "not a Prometheus label",
            ),
            (format!("customMetrics:\n- name: a\n{ok}  window: 10ms\n"), "customMetrics[0].window", "1s"),
        ] {
            let err = load(&yaml).unwrap_err();
            assert!(err.starts_with(&format!("--config f.yaml: field {field}: ")), "{yaml}: {err}");
            assert!(err.contains(says), "{yaml}: {err}");
        }
        let err = load("customMetrics:\n- name: a\n  query: x{SCOPE}\n  aggregate: median\n").unwrap_err();
        assert!(err.contains("median") && err.contains("sum"), "{err}");
    }

    #[test]
    fn metric_selectors_become_label_selectors_as_parse_to_label_selector_builds_them() {
        let json = |s: &str| LabelSelector::parse(s).unwrap().to_metav1_json();
        assert_eq!(json(""), Value::Null);
        assert_eq!(
            json("tier=front,code!=500,a in (y,x),b notin (z),c,!d"),
            json!({
                "matchLabels": {"tier": "front"},
                "matchExpressions": [
                    {"key": "a", "operator": "In", "values": ["x", "y"]},
                    {"key": "b", "operator": "NotIn", "values": ["z"]},
                    {"key": "c", "operator": "Exists"},
                    {"key": "code", "operator": "NotIn", "values": ["500"]},
                    {"key": "d", "operator": "DoesNotExist"},
                ],
            })
        );
    }
}
