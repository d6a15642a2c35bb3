//! `PodMetricsSummary`: one object per running pod, joining kubelet CPU and memory with
//! Prometheus request and error rates. Its type, discovery entry, OpenAPI schema, table columns
//! and computation all live here.
//!
//! A field whose source has no data for a pod is omitted, never faked; a failing source removes
//! fields, not objects, and adds a warning.

use std::sync::Arc;

use futures::future::BoxFuture;
use serde::Serialize;
use serde_json::json;

use super::inputs::{RATE_STEP, RATIO_STEP, round_cpu, round_to};
use super::{
    API_VERSION, Builtin, Cell, Column, Computation, ComputeError, KindInfo, Listing, ListingBuilder,
    ObjectMeta, QuerySpec, ServedKind, Sources, Text, Texts, index_by_pod, kind_schema, rfc3339, schema_name,
};
use crate::sources::{ContainerUsage, Containers, PodInfo, PodKey, PromSample};
use k8s_wire::{duration, quantity};

static INFO: KindInfo = KindInfo {
    gv: super::STATS,
    plural: Text::Borrowed("podmetricssummaries"),
    singular: Text::Borrowed("podmetricssummary"),
    kind: Text::Borrowed("PodMetricsSummary"),
    list_kind: Text::Borrowed("PodMetricsSummaryList"),
    short_names: Texts::Borrowed(&[Text::Borrowed("pms")]),
    categories: Texts::Borrowed(&[Text::Borrowed("percolator")]),
    namespaced: true,
    description: Text::Borrowed(
        "PodMetricsSummary is the live resource usage and traffic of one running pod, computed at \
                  request time: CPU and memory from the kubelet, request and error rates from Prometheus. \
                  Fields whose source has no data are omitted.",
    ),
    typed_list_items: true,
};

/// The kind in the registry.
pub(crate) static KIND: Builtin = Builtin {
    info: &INFO,
    section: "podMetricsSummary",
    queries: &[&REQUESTS, &ERRORS],
    build: |sources| Arc::new(PodMetricsSummaries::new(sources)),
};

/// Requests per second per pod; the result keeps the `namespace` and `pod` labels.
static REQUESTS: QuerySpec =
    QuerySpec::new("requests", "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))");

/// Error (5xx) responses per second per pod; the result keeps `namespace` and `pod`.
static ERRORS: QuerySpec = QuerySpec::new(
    "errors",
    "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))",
);

static COLUMNS: &[Column] = &[
    Column::object_name("Name of the pod."),
    Column::quantity("CPU", "CPU usage in cores (kubelet)."),
    Column::quantity("Memory", "Memory working set (kubelet)."),
    Column::text("Req/s", "HTTP requests per second over the window (Prometheus)."),
    Column::text("Err/s", "HTTP 5xx responses per second over the window (Prometheus)."),
    Column::text("Error%", "Errors as a percentage of requests."),
    Column::text("Age", "Time since the pod was created."),
    Column::duration("Window", "Range the rates are computed over.").wide(),
    Column::text("Containers", "Number of containers in the pod.").wide(),
    Column::text("Node", "Node the pod runs on.").wide(),
];

/// Computes PodMetricsSummaries from the sources.
#[derive(Debug)]
pub(crate) struct PodMetricsSummaries {
    sources: Sources,
}

impl PodMetricsSummaries {
    /// Builds the kind from its sources (queries come from `sources.config`).
    pub(crate) fn new(sources: Sources) -> Self {
        Self { sources }
    }

    async fn compute(&self, namespace: Option<&str>) -> Result<Arc<Listing>, ComputeError> {
        let Computation { pods, resource_version, config } = self.sources.begin(namespace)?;
        let mut warnings = Vec::new();
        let window = config.window;
        let (usage, requests, errors) = futures::join!(
            self.sources.pod_usage(&pods),
            self.sources.query("requests", KIND.query(&config, &REQUESTS), namespace, window),
            self.sources.query("errors", KIND.query(&config, &ERRORS), namespace, window),
        );
        let (usage, usage_warning) = usage;
        warnings.extend(usage_warning);
        let requests = index_by_pod(requests, "requests", &mut warnings);
        let errors = index_by_pod(errors, "errors", &mut warnings);

        let window: Arc<str> = duration::go_string(window).into();
        let mut list = ListingBuilder::new(&INFO, resource_version);
        list.reserve(pods.len());
        for pod in &pods {
            let key = PodKey { namespace: pod.namespace.clone(), name: pod.name.clone() };
            self.item(&mut list, pod, usage.get(&key), requests.get(&key), errors.get(&key), &window);
        }
        Ok(Arc::new(list.finish(warnings)))
    }

    fn item(
        &self,
        list: &mut ListingBuilder,
        pod: &PodInfo,
        containers: Option<&Containers>,
        requests: Option<&PromSample>,
        errors: Option<&PromSample>,
        window: &Arc<str>,
    ) {
        let containers: &[ContainerUsage] = containers.map(|c| &**c).unwrap_or_default();
        // The pod's usage is the sum of its containers, and only when every container has it,
        // so `containers` always adds up to the pod.
        let sum = |get: fn(&ContainerUsage) -> Option<f64>| -> Option<f64> {
            if containers.is_empty() {
                return None;
            }
            containers.iter().map(get).sum()
        };
        // Each container's CPU is published rounded; the pod's is the sum of those, so the
        // published containers add up to the published pod exactly.
        let cpu = sum(|c| c.cpu_cores().map(round_cpu)).map(round_cpu);
        let memory = sum(|c| c.memory_bytes);
        let requests_value = requests.map(|s| s.value).filter(|v| v.is_finite());
        let errors_value = errors.map(|s| s.value).filter(|v| v.is_finite());
        let error_ratio = match (requests_value, errors_value) {
            // Only when the published `requests` is above 0 (a rate under 0.0005/s reads "0").
            (Some(r), Some(e)) if round_to(r, RATE_STEP) > 0.0 => Some(round_to(e / r, RATIO_STEP)),
            _ => None,
        };
        let requests_value = requests_value.map(|v| round_to(v, RATE_STEP));
        let errors_value = errors_value.map(|v| round_to(v, RATE_STEP));
        let newest = containers
            .iter()
            .filter_map(|c| c.timestamp)
            .chain(requests.map(|s| s.timestamp))
            .chain(errors.map(|s| s.timestamp))
            .max();

        let meta = super::meta_of_pod(pod);
        let object = PodMetricsSummary {
            api_version: API_VERSION,
            kind: &INFO.kind,
            metadata: ObjectMeta::from(&meta),
            timestamp: newest.map(rfc3339),
            window,
            cpu: cpu.map(quantity::decimal_si),
            memory: memory.map(quantity::binary_si),
            requests: requests_value.map(quantity::decimal_si),
            errors: errors_value.map(quantity::decimal_si),
            error_ratio: error_ratio.map(quantity::decimal_si),
            containers: containers
                .iter()
                .map(|c| ContainerMetrics {
                    name: &c.name,
                    cpu: c.cpu_cores().map(round_cpu).map(quantity::decimal_si),
                    memory: c.memory_bytes.map(quantity::binary_si),
                })
                .collect(),
        };
        let text = |v: Option<String>| v.map_or(Cell::None, |v| Cell::text(&v));
        let cells = [
            Cell::Text(pod.name.clone()),
            text(cpu.map(quantity::cpu_cell)),
            text(memory.map(quantity::memory_cell)),
            text(requests_value.map(quantity::rate_cell)),
            text(errors_value.map(quantity::rate_cell)),
            text(error_ratio.map(quantity::percent_cell)),
            pod.creation_timestamp.map_or(Cell::None, Cell::Age),
            Cell::Text(window.clone()),
            Cell::text(&pod.containers.len().to_string()),
            pod.node_name.clone().map_or(Cell::None, Cell::Text),
        ];
        list.push(&meta, &object, &cells);
    }
}

impl ServedKind for PodMetricsSummaries {
    fn info(&self) -> &KindInfo {
        &INFO
    }

    fn columns(&self) -> &[Column] {
        COLUMNS
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        let quantity = |description: &str| json!({"type": "string", "description": description});
        let container = json!({
            "type": "object",
            "description": "Usage of one container of the pod, from the kubelet.",
            "required": ["name"],
            "properties": {
                "name": {"type": "string", "description": "Name of the container, as in the pod spec."},
                "cpu": quantity("CPU usage of the container in cores (a Quantity such as 240m): the rate between the kubelet's two most recent cumulative CPU samples. Omitted until two samples exist."),
                "memory": quantity("Memory working set of the container in bytes (a Quantity such as 120Mi), as the kubelet reports it."),
            }
        });
        let object = kind_schema(
            &INFO,
            "Standard object metadata, copied from the pod: name, namespace, uid, labels and creationTimestamp.",
            json!({
                "timestamp": {"type": "string", "format": "date-time", "description": "When the newest input sample (kubelet or Prometheus) was taken, RFC 3339."},
                "window": {"type": "string", "description": "Range the request and error rates are computed over, as a duration (5m0s)."},
                "cpu": quantity("CPU usage of the pod in cores (a Quantity such as 250m): the sum of its containers' CPU. Omitted when any container has no CPU rate yet or the kubelet is unreachable."),
                "memory": quantity("Memory working set of the pod in bytes (a Quantity such as 128Mi): the sum of its containers' working sets."),
                "requests": quantity("HTTP requests per second served by the pod over the window (a Quantity such as 12500m for 12.5/s), from Prometheus. Omitted when Prometheus has no series for the pod."),
                "errors": quantity("HTTP 5xx responses per second over the window (a Quantity), from Prometheus. Omitted when Prometheus has no error series for the pod."),
                "errorRatio": quantity("errors divided by requests (a Quantity such as 20m for 2%). Omitted when requests is absent or 0, or errors is absent."),
                "containers": {"type": "array", "description": "Usage of each container, from the kubelet; their sum is the pod's cpu and memory.", "items": {"$ref": format!("#/components/schemas/{}", schema_name(super::STATS, "PodMetricsSummaryContainer"))}},
            }),
        );
        vec![
            (schema_name(super::STATS, &INFO.kind), object),
            (schema_name(super::STATS, "PodMetricsSummaryContainer"), container),
        ]
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(self.compute(namespace))
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PodMetricsSummary<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta<'a>,
    #[serde(skip_serializing_if = "Option::is_none")]
    timestamp: Option<String>,
    window: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    requests: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    errors: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error_ratio: Option<String>,
    containers: Vec<ContainerMetrics<'a>>,
}

#[derive(Serialize)]
struct ContainerMetrics<'a> {
    name: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use serde_json::{Value, json};

    use super::KIND;
    use crate::kinds::testkit::*;
    use crate::kinds::{ComputeError, Listing, ServedKind};
    use crate::sources::{KubeletError, PromError};

    fn mk_kind(
        inventory: Arc<FakeInventory>,
        kubelet: Arc<FakeKubelet>,
        prom: Arc<FakeProm>,
    ) -> Arc<dyn ServedKind> {
        (KIND.build)(mk_sources(inventory, kubelet, prom))
    }

    /// Two pods of `ns` on node-a (web-1 with two containers and traffic, web-2 without
    /// series) and one of `other` on node-c.
    fn mk_shop() -> (Arc<FakeInventory>, Arc<FakeKubelet>, Arc<FakeProm>) {
        let inventory = FakeInventory::with(vec![
            mk_pod("ns", "web-2", "node-a", &[("app", "web")], &["app"], "2026-07-01T09:30:00Z"),
            mk_pod("ns", "web-1", "node-a", &[("app", "web")], &["app", "sidecar"], "2026-07-01T09:00:00Z"),
            mk_pod("other", "api-1", "node-c", &[("app", "api")], &["api"], "2026-07-01T08:00:00Z"),
        ]);
        let kubelet = FakeKubelet::default()
            .node(
                "node-a",
                vec![
                    (
                        "ns",
                        "web-1",
                        vec![
                            mk_container("app", Some(0.2405), Some(120.0 * MI), "2026-07-01T10:00:00Z"),
                            mk_container(
                                "sidecar",
                                Some(0.010_000_4),
                                Some(8.0 * MI),
                                "2026-07-01T10:00:05Z",
                            ),
                        ],
                    ),
                    (
                        "ns",
                        "web-2",
                        vec![mk_container("app", Some(0.1), Some(64.0 * MI), "2026-07-01T10:00:01Z")],
                    ),
                ],
            )
            .node(
                "node-c",
                vec![(
                    "other",
                    "api-1",
                    vec![mk_container("api", Some(0.5), Some(256.0 * MI), "2026-07-01T10:00:02Z")],
                )],
            );
        let prom = FakeProm::default()
            .answer(
                "code=~",
                vec![
                    mk_sample(&[("namespace", "ns"), ("pod", "web-1")], 0.25, "2026-07-01T10:00:20Z"),
                    mk_sample(&[("namespace", "other"), ("pod", "api-1")], 0.5, "2026-07-01T10:00:20Z"),
                ],
            )
            .answer(
                "http_requests_total",
                vec![
                    mk_sample(&[("namespace", "ns"), ("pod", "web-1")], 12.5004, "2026-07-01T10:00:10Z"),
                    mk_sample(&[("namespace", "other"), ("pod", "api-1")], 10.0, "2026-07-01T10:00:10Z"),
                ],
            );
        (inventory, Arc::new(kubelet), Arc::new(prom))
    }

    /// The object of a pod without any kubelet or Prometheus data.
    fn mk_bare(name: &str, created: &str) -> Value {
        json!({
            "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
            "kind": "PodMetricsSummary",
            "metadata": {"name": name, "namespace": "ns", "uid": format!("uid-{name}"), "creationTimestamp": created},
            "window": "5m0s",
            "containers": [],
        })
    }

    fn mk_objects(listing: &Listing) -> Vec<Value> {
        listing.items.iter().map(mk_json).collect()
    }

    fn mk_web_1() -> Value {
        json!({
            "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
            "kind": "PodMetricsSummary",
            "metadata": {
                "name": "web-1",
                "namespace": "ns",
                "uid": "uid-web-1",
                "creationTimestamp": "2026-07-01T09:00:00Z",
                "labels": {"app": "web"},
            },
            "timestamp": "2026-07-01T10:00:20Z",
            "window": "5m0s",
            "cpu": "250500u",
            "memory": "128Mi",
            "requests": "12500m",
            "errors": "250m",
            "errorRatio": "19999u",
            "containers": [
                {"name": "app", "cpu": "240500u", "memory": "120Mi"},
                {"name": "sidecar", "cpu": "10m", "memory": "8Mi"},
            ],
        })
    }

    #[tokio::test]
    async fn normal_pod_sums_its_containers_and_joins_its_rates() {
        let (inventory, kubelet, prom) = mk_shop();
        let kind = mk_kind(inventory, kubelet.clone(), prom);
        let listing = kind.list(Some("ns")).await.unwrap();
        let web_1 = &listing.items[0];
        // cpu 0.2405 + 0.0100004 to the micro-core; errorRatio 0.25 / 12.5004 before rounding.
        assert_eq!(mk_json(web_1), mk_web_1());
        assert_eq!(
            mk_cells(web_1),
            [
                "web-1",
                "251m",
                "128Mi",
                "12.5",
                "0.25",
                "2.0%",
                "age:2026-07-01T09:00:00Z",
                "5m0s",
                "2",
                "node-a"
            ]
        );
        assert_eq!(listing.warnings, Vec::<String>::new());
        assert_eq!(listing.resource_version, "42");
        assert_eq!(kubelet.called(), ["node-a"], "only the nodes of the namespace's pods");
    }

    #[tokio::test]
    async fn pod_without_series_omits_requests_errors_and_ratio() {
        let (inventory, kubelet, prom) = mk_shop();
        let listing = mk_kind(inventory, kubelet, prom).list(Some("ns")).await.unwrap();
        assert_eq!(listing.items.len(), 2);
        let web_2 = &listing.items[1];
        assert_eq!(
            mk_json(web_2),
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "PodMetricsSummary",
                "metadata": {
                    "name": "web-2",
                    "namespace": "ns",
                    "uid": "uid-web-2",
                    "creationTimestamp": "2026-07-01T09:30:00Z",
                    "labels": {"app": "web"},
                },
                "timestamp": "2026-07-01T10:00:01Z",
                "window": "5m0s",
                "cpu": "100m",
                "memory": "64Mi",
                "containers": [{"name": "app", "cpu": "100m", "memory": "64Mi"}],
            })
        );
        assert_eq!(
            mk_cells(web_2),
            [
                "web-2",
                "100m",
                "64Mi",
                "<none>",
                "<none>",
                "<none>",
                "age:2026-07-01T09:30:00Z",
                "5m0s",
                "1",
                "node-a"
            ]
        );
        assert_eq!(listing.warnings, Vec::<String>::new());
    }

    #[tokio::test]
    async fn kubelet_node_down_omits_usage_of_its_pods_only() {
        let inventory = FakeInventory::with(vec![
            mk_pod("ns", "db-1", "node-b", &[], &["db"], "2026-07-01T09:00:00Z"),
            mk_pod("ns", "web-1", "node-a", &[], &["app"], "2026-07-01T09:00:00Z"),
        ]);
        let kubelet = FakeKubelet::default()
            .node(
                "node-a",
                vec![("ns", "web-1", vec![mk_container("app", Some(0.25), Some(128.0 * MI), AT)])],
            )
            .down(
                "node-b",
                KubeletError::Request { node: "node-b".into(), reason: "connection refused".into() },
            );
        let listing = mk_kind(inventory, Arc::new(kubelet), Arc::default()).list(Some("ns")).await.unwrap();
        let objects = mk_objects(&listing);
        assert_eq!(objects[0], mk_bare("db-1", "2026-07-01T09:00:00Z"));
        assert_eq!(objects[1]["cpu"], "250m");
        assert_eq!(objects[1]["memory"], "128Mi");
        assert_eq!(
            mk_cells(&listing.items[0]),
            [
                "db-1",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "age:2026-07-01T09:00:00Z",
                "5m0s",
                "1",
                "node-b"
            ]
        );
        assert_eq!(
            listing.warnings,
            ["cpu and memory omitted for pods on 1 node: kubelet on node node-b: connection refused"]
        );
    }

    #[tokio::test]
    async fn failed_nodes_are_named_in_one_bounded_warning() {
        // Seven nodes, none known to the kubelet fake: two named by kind of error, five by default.
        let pods =
            (1..=7).map(|i| mk_pod("ns", &format!("p{i}"), &format!("n{i}"), &[], &["c"], AT)).collect();
        let kubelet = FakeKubelet::default()
            .down("n1", KubeletError::ScrapeError { node: "n1".into() })
            .down("n2", KubeletError::Request { node: "n2".into(), reason: "timed out".into() });
        let listing = mk_kind(FakeInventory::with(pods), Arc::new(kubelet), Arc::default())
            .list(Some("ns"))
            .await
            .unwrap();
        assert_eq!(listing.items.len(), 7);
        assert_eq!(
            listing.warnings,
            ["cpu and memory omitted for pods on 7 nodes: kubelet on node n1 reported a scrape error; \
              kubelet on node n2: timed out; node n3: no usable address (not in the fake); \
              node n4: no usable address (not in the fake); node n5: no usable address (not in the fake); \
              and 2 more"]
        );
    }

    #[tokio::test]
    async fn prometheus_down_omits_requests_and_errors_with_warnings() {
        let (inventory, kubelet, _) = mk_shop();
        let prom = Arc::new(FakeProm::down(PromError::Unreachable("connection refused".into())));
        let listing = mk_kind(inventory, kubelet, prom).list(Some("ns")).await.unwrap();
        let mut expected = mk_web_1();
        for field in ["requests", "errors", "errorRatio"] {
            expected.as_object_mut().unwrap().remove(field);
        }
        expected["timestamp"] = json!("2026-07-01T10:00:05Z");
        assert_eq!(mk_json(&listing.items[0]), expected);
        assert_eq!(
            listing.warnings,
            [
                "requests omitted: prometheus unreachable: connection refused",
                "errors omitted: prometheus unreachable: connection refused",
            ]
        );
    }

    #[tokio::test]
    async fn one_failed_query_omits_only_its_field() {
        let (inventory, kubelet, _) = mk_shop();
        let prom =
            FakeProm::default().fail("code=~", PromError::Query("bad_data: parse error".into())).answer(
                "http_requests_total",
                vec![mk_sample(&[("namespace", "ns"), ("pod", "web-1")], 2.0, AT)],
            );
        let listing = mk_kind(inventory, kubelet, Arc::new(prom)).list(Some("ns")).await.unwrap();
        let web_1 = mk_json(&listing.items[0]);
        assert_eq!(web_1["requests"], "2");
        assert_eq!(web_1.get("errors"), None);
        assert_eq!(web_1.get("errorRatio"), None);
        assert_eq!(listing.warnings, ["errors omitted: prometheus query failed: bad_data: parse error"]);
    }

    #[tokio::test]
    async fn error_ratio_edge_cases() {
        let names = ["p-nan", "p-noerr", "p-noreq", "p-round", "p-third", "p-tiny", "p-zero"];
        let pods = names.iter().map(|n| mk_pod("ns", n, "node-a", &[], &["c"], AT)).collect();
        let sample = |pod: &str, value: f64| mk_sample(&[("namespace", "ns"), ("pod", pod)], value, AT);
        let prom = FakeProm::default()
            .answer(
                "code=~",
                vec![
                    sample("p-nan", 0.0),
                    sample("p-noreq", 1.0),
                    sample("p-round", 0.0006),
                    sample("p-third", 1.0),
                    sample("p-tiny", 0.0001),
                    sample("p-zero", 0.0),
                ],
            )
            .answer(
                "http_requests_total",
                vec![
                    sample("p-nan", f64::NAN),
                    sample("p-noerr", 3.0),
                    sample("p-round", 2.0004),
                    sample("p-third", 3.0),
                    sample("p-tiny", 0.0004),
                    sample("p-zero", 0.0),
                ],
            );
        let kubelet = FakeKubelet::default().node("node-a", vec![]);
        let listing = mk_kind(FakeInventory::with(pods), Arc::new(kubelet), Arc::new(prom))
            .list(Some("ns"))
            .await
            .unwrap();
        // (requests, errors, errorRatio) as published, then the three cells.
        let expected = [
            ("p-nan", None, Some("0"), None, ["<none>", "0", "<none>"]),
            ("p-noerr", Some("3"), None, None, ["3", "<none>", "<none>"]),
            ("p-noreq", None, Some("1"), None, ["<none>", "1", "<none>"]),
            // 0.0006 / 2.0004 = 0.00029994… → 300u; the error rate itself rounds to 1m.
            ("p-round", Some("2"), Some("1m"), Some("300u"), ["2", "0", "0.0%"]),
            ("p-third", Some("3"), Some("1"), Some("333333u"), ["3", "1", "33.3%"]),
            // 0.0004/s is published as 0: no ratio of a published 0.
            ("p-tiny", Some("0"), Some("0"), None, ["0", "0", "<none>"]),
            ("p-zero", Some("0"), Some("0"), None, ["0", "0", "<none>"]),
        ];
        assert_eq!(listing.items.len(), expected.len());
        for (item, (name, requests, errors, ratio, cells)) in listing.items.iter().zip(expected) {
            let mut object = mk_bare(name, AT);
            object["timestamp"] = json!(AT);
            for (field, value) in [("requests", requests), ("errors", errors), ("errorRatio", ratio)] {
                if let Some(value) = value {
                    object[field] = json!(value);
                }
            }
            assert_eq!(mk_json(item), object, "{name}");
            assert_eq!(mk_cells(item)[3..6], cells, "{name}");
        }
        assert_eq!(listing.warnings, Vec::<String>::new());
    }

    #[tokio::test]
    async fn container_without_cpu_rate_omits_pod_cpu() {
        let inventory = FakeInventory::with(vec![mk_pod(
            "ns",
            "web-1",
            "node-a",
            &[],
            &["app", "sidecar"],
            "2026-07-01T09:00:00Z",
        )]);
        let kubelet = FakeKubelet::default().node(
            "node-a",
            vec![(
                "ns",
                "web-1",
                vec![
                    mk_container("app", Some(0.1), Some(100.0 * MI), AT),
                    mk_container("sidecar", None, Some(4.0 * MI), AT),
                ],
            )],
        );
        let listing = mk_kind(inventory, Arc::new(kubelet), Arc::default()).list(Some("ns")).await.unwrap();
        let mut expected = mk_bare("web-1", "2026-07-01T09:00:00Z");
        expected["timestamp"] = json!(AT);
        expected["memory"] = json!("104Mi");
        expected["containers"] =
            json!([{"name": "app", "cpu": "100m", "memory": "100Mi"}, {"name": "sidecar", "memory": "4Mi"}]);
        assert_eq!(mk_json(&listing.items[0]), expected);
        assert_eq!(mk_cells(&listing.items[0])[1..3], ["<none>", "104Mi"]);
        assert_eq!(listing.warnings, Vec::<String>::new(), "a new container's missing CPU is no fault");
    }

    #[tokio::test]
    async fn published_container_cpus_add_up_to_the_pod() {
        let inventory = FakeInventory::with(vec![mk_pod("ns", "web-1", "node-a", &[], &["a", "b"], AT)]);
        // 1.4µ each: published as 1u each, so the pod is 2u (not the 3u of 2.8µ rounded).
        let containers = vec![
            mk_container("a", Some(0.000_001_4), Some(MI), AT),
            mk_container("b", Some(0.000_001_4), Some(MI), AT),
        ];
        let kubelet = FakeKubelet::default().node("node-a", vec![("ns", "web-1", containers)]);
        let listing = mk_kind(inventory, Arc::new(kubelet), Arc::default()).list(Some("ns")).await.unwrap();
        let object = mk_json(&listing.items[0]);
        assert_eq!(object["cpu"], "2u");
        assert_eq!(object["containers"][0]["cpu"], "1u");
        assert_eq!(object["containers"][1]["cpu"], "1u");
    }

    #[tokio::test]
    async fn inventory_not_synced_is_not_ready_and_asks_no_upstream() {
        let (_, kubelet, prom) = mk_shop();
        let inventory =
            Arc::new(FakeInventory { pods: vec![], synced: false, version: String::new(), nodes: vec![] });
        let result = mk_kind(inventory, kubelet.clone(), prom.clone()).list(Some("ns")).await;
        assert!(matches!(result, Err(ComputeError::NotReady(_))), "{result:?}");
        assert_eq!(kubelet.called(), Vec::<String>::new());
        assert_eq!(prom.received(), Vec::<String>::new());
    }

    #[tokio::test]
    async fn namespace_list_sends_scoped_promql() {
        let (inventory, kubelet, prom) = mk_shop();
        mk_kind(inventory, kubelet, prom.clone()).list(Some("ns")).await.unwrap();
        assert_eq!(
            prom.received(),
            [
                r#"sum by (namespace, pod) (rate(http_requests_total{code=~"5..",namespace="ns"}[5m]))"#,
                r#"sum by (namespace, pod) (rate(http_requests_total{namespace="ns"}[5m]))"#,
            ]
        );
    }

    #[tokio::test]
    async fn all_namespaces_list_every_pod_with_unscoped_promql() {
        let (inventory, kubelet, prom) = mk_shop();
        let listing = mk_kind(inventory, kubelet.clone(), prom.clone()).list(None).await.unwrap();
        let objects = mk_objects(&listing);
        // Sorted by namespace then name: ns/web-1, ns/web-2, other/api-1.
        assert_eq!(objects.len(), 3);
        assert_eq!(objects[0], mk_web_1());
        assert_eq!(objects[1]["metadata"]["name"], "web-2");
        assert_eq!(
            objects[2],
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "PodMetricsSummary",
                "metadata": {
                    "name": "api-1",
                    "namespace": "other",
                    "uid": "uid-api-1",
                    "creationTimestamp": "2026-07-01T08:00:00Z",
                    "labels": {"app": "api"},
                },
                "timestamp": "2026-07-01T10:00:20Z",
                "window": "5m0s",
                "cpu": "500m",
                "memory": "256Mi",
                "requests": "10",
                "errors": "500m",
                "errorRatio": "50m",
                "containers": [{"name": "api", "cpu": "500m", "memory": "256Mi"}],
            })
        );
        assert_eq!(
            mk_cells(&listing.items[2]),
            [
                "api-1",
                "500m",
                "256Mi",
                "10",
                "0.5",
                "5.0%",
                "age:2026-07-01T08:00:00Z",
                "5m0s",
                "1",
                "node-c"
            ]
        );
        assert_eq!(listing.warnings, Vec::<String>::new());
        assert_eq!(kubelet.called(), ["node-a", "node-c"]);
        assert_eq!(
            prom.received(),
            [
                r#"sum by (namespace, pod) (rate(http_requests_total{code=~"5.."}[5m]))"#,
                r#"sum by (namespace, pod) (rate(http_requests_total{}[5m]))"#,
            ]
        );
    }
}
