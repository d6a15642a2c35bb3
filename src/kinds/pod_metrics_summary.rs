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

use super::registry::{Builtin, QuerySpec};
use super::{
    API_VERSION, Cell, Column, ComputeError, Item, KindInfo, Listing, Meta, ObjectMeta, ServedKind, Sources,
    Computation, index_by_pod, kind_schema, rfc3339, schema_name, to_raw,
};
use crate::sources::{ContainerUsage, PodInfo, PodKey, PromSample};
use crate::k8s::{duration, quantity};

static INFO: KindInfo = KindInfo {
    plural: "podmetricssummaries",
    singular: "podmetricssummary",
    kind: "PodMetricsSummary",
    list_kind: "PodMetricsSummaryList",
    short_names: &["pms"],
    categories: &["percolator"],
    namespaced: true,
    description: "PodMetricsSummary is the live resource usage and traffic of one running pod, computed at \
                  request time: CPU and memory from the kubelet, request and error rates from Prometheus. \
                  Fields whose source has no data are omitted.",
};

/// The kind in the registry.
pub static KIND: Builtin = Builtin {
    info: &INFO,
    section: "podMetricsSummary",
    queries: &[REQUESTS, ERRORS],
    build: |sources| Arc::new(PodMetricsSummaries::new(sources)),
};

/// Requests per second per pod; the result keeps the `namespace` and `pod` labels.
const REQUESTS: QuerySpec = QuerySpec {
    field: "requests",
    default: "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))",
};

/// Error (5xx) responses per second per pod; the result keeps `namespace` and `pod`.
const ERRORS: QuerySpec = QuerySpec {
    field: "errors",
    default: "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))",
};

static COLUMNS: &[Column] = &[
    Column { name: "Name", type_: "string", format: "name", description: "Name of the pod.", priority: 0 },
    Column {
        name: "CPU",
        type_: "string",
        format: "quantity",
        description: "CPU usage in cores (kubelet).",
        priority: 0,
    },
    Column {
        name: "Memory",
        type_: "string",
        format: "quantity",
        description: "Memory working set (kubelet).",
        priority: 0,
    },
    Column {
        name: "Req/s",
        type_: "string",
        format: "",
        description: "HTTP requests per second over the window (Prometheus).",
        priority: 0,
    },
    Column {
        name: "Err/s",
        type_: "string",
        format: "",
        description: "HTTP 5xx responses per second over the window (Prometheus).",
        priority: 0,
    },
    Column {
        name: "Error%",
        type_: "string",
        format: "",
        description: "Errors as a percentage of requests.",
        priority: 0,
    },
    Column {
        name: "Age",
        type_: "string",
        format: "",
        description: "Time since the pod was created.",
        priority: 0,
    },
    Column {
        name: "Window",
        type_: "string",
        format: "duration",
        description: "Range the rates are computed over.",
        priority: 1,
    },
    Column {
        name: "Containers",
        type_: "string",
        format: "",
        description: "Number of containers in the pod.",
        priority: 1,
    },
    Column { name: "Node", type_: "string", format: "", description: "Node the pod runs on.", priority: 1 },
];

/// Computes PodMetricsSummaries from the sources.
#[derive(Debug)]
pub struct PodMetricsSummaries {
    sources: Sources,
}

impl PodMetricsSummaries {
    /// Builds the kind from its sources (queries come from `sources.config`).
    pub fn new(sources: Sources) -> Self {
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
        let items = pods
            .iter()
            .map(|pod| {
                let key = PodKey { namespace: pod.namespace.clone(), name: pod.name.clone() };
                Arc::new(self.item(pod, usage.get(&key), requests.get(&key), errors.get(&key), &window))
            })
            .collect();
        Ok(Arc::new(Listing { items, warnings, resource_version, ..Listing::default() }))
    }

    fn item(
        &self,
        pod: &PodInfo,
        containers: Option<&Vec<ContainerUsage>>,
        requests: Option<&PromSample>,
        errors: Option<&PromSample>,
        window: &Arc<str>,
    ) -> Item {
        let containers = containers.map(Vec::as_slice).unwrap_or_default();
        // The pod's usage is the sum of its containers, and only when every container has it,
        // so `containers` always adds up to the pod.
        let sum = |get: fn(&ContainerUsage) -> Option<f64>| -> Option<f64> {
            if containers.is_empty() {
                return None;
            }
            containers.iter().map(get).sum()
        };
        let cpu = sum(|c| c.cpu_cores).map(round_cpu);
        let memory = sum(|c| c.memory_bytes);
        let requests_value = requests.map(|s| s.value).filter(|v| v.is_finite());
        let errors_value = errors.map(|s| s.value).filter(|v| v.is_finite());
        let error_ratio = match (requests_value, errors_value) {
            (Some(r), Some(e)) if r > 0.0 => Some(round_to(e / r, RATIO_STEP)),
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

        let meta = Meta::of_pod(pod);
        let object = to_raw(&PodMetricsSummary {
            api_version: API_VERSION,
            kind: INFO.kind,
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
                    cpu: c.cpu_cores.map(round_cpu).map(quantity::decimal_si),
                    memory: c.memory_bytes.map(quantity::binary_si),
                })
                .collect(),
        });
        let text = |v: Option<String>| v.map_or(Cell::None, |v| Cell::text(&v));
        let cells = vec![
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
        Item { meta, object, cells }
    }
}

/// Rates are published to the milli-unit (0.001/s): finer digits are floating-point noise of
/// `rate()`, and they make Quantities unreadable (`15840230907n`).
const RATE_STEP: f64 = 1e-3;
/// Ratios to the micro-unit, so small error ratios keep three significant digits.
const RATIO_STEP: f64 = 1e-6;
/// CPU to the micro-core: two cumulative samples in seconds carry no more precision.
const CPU_STEP: f64 = 1e-6;

fn round_to(value: f64, step: f64) -> f64 {
    (value / step).round() * step
}

fn round_cpu(cores: f64) -> f64 {
    round_to(cores, CPU_STEP)
}

impl ServedKind for PodMetricsSummaries {
    fn info(&self) -> &'static KindInfo {
        &INFO
    }

    fn columns(&self) -> &'static [Column] {
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
                "containers": {"type": "array", "description": "Usage of each container, from the kubelet; their sum is the pod's cpu and memory.", "items": {"$ref": format!("#/components/schemas/{}", schema_name("PodMetricsSummaryContainer"))}},
            }),
        );
        vec![(schema_name(INFO.kind), object), (schema_name("PodMetricsSummaryContainer"), container)]
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
