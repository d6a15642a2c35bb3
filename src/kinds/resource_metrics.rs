//! `metrics.k8s.io/v1beta1` `PodMetrics` and `NodeMetrics` (docs/reference/resource-metrics.md), served as
//! metrics-server serves them (`pkg/api`, `pkg/storage`), from the kubelet samples every other
//! kind already takes: one scrape of each kubelet serves PodMetricsSummary, CafeBrewStats and
//! `kubectl top` alike.
//!
//! Semantics, as metrics-server's:
//! - a pod is listed only when every container of its kubelet sample has a CPU rate (two
//!   distinct samples); its `timestamp` and `window` are those of its container with the
//!   earliest sample; containers' `usage.cpu` in nanocores (`2051777n`, truncated as
//!   metrics-server's `uint64` conversion does), `usage.memory` the working set in BinarySI;
//! - a node is listed when its `node_cpu_usage_seconds_total` has two samples and
//!   `node_memory_working_set_bytes` one;
//! - `metadata` carries the pod's (node's) name, namespace and labels (label selectors filter
//!   on them) and `creationTimestamp` the time of the computation;
//! - Table columns `Name`, `cpu`, `memory`, `Window`, singular name empty, no short names.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;

use super::{
    Cell, Column, Computation, ComputeError, GroupVersion, KindInfo, Listing, ListingBuilder, Meta,
    ObjectMeta, Sources, Text, Texts, kind_schema, rfc3339, schema_name,
};
use crate::sources::{ContainerUsage, NodeInfo, PodKey};
use k8s_wire::{duration, quantity};

/// `metrics.k8s.io/v1beta1`.
pub(crate) const METRICS: GroupVersion =
    GroupVersion { group: "metrics.k8s.io", version: "v1beta1", api_version: "metrics.k8s.io/v1beta1" };

/// A kind of `metrics.k8s.io`: singular name empty, no short names, no categories, as
/// metrics-server lists them.
const fn metrics_kind(
    plural: &'static str,
    kind: &'static str,
    list_kind: &'static str,
    namespaced: bool,
    description: &'static str,
) -> KindInfo {
    KindInfo {
        gv: METRICS,
        plural: Text::Borrowed(plural),
        singular: Text::Borrowed(""),
        kind: Text::Borrowed(kind),
        list_kind: Text::Borrowed(list_kind),
        short_names: Texts::Borrowed(&[]),
        categories: Texts::Borrowed(&[]),
        namespaced,
        description: Text::Borrowed(description),
        typed_list_items: false,
    }
}

static POD_INFO: KindInfo = metrics_kind(
    "pods",
    "PodMetrics",
    "PodMetricsList",
    true,
    "PodMetrics sets resource usage metrics of a pod: the CPU rate and memory working set of each of \
     its containers, from the kubelet (or Prometheus' cAdvisor series).",
);

static NODE_INFO: KindInfo = metrics_kind(
    "nodes",
    "NodeMetrics",
    "NodeMetricsList",
    false,
    "NodeMetrics sets resource usage metrics of a node: its CPU rate and memory working set, from the \
     kubelet (or Prometheus' node series).",
);

/// metrics-server's table columns.
static COLUMNS: &[Column] = &[
    Column::object_name("Name of the resource"),
    Column::quantity("cpu", "CPU usage (cores)."),
    Column::quantity("memory", "Memory working set (bytes)."),
    Column::duration("Window", "Interval between the two samples the CPU rate comes from."),
];

/// The two kinds, uncached (the registry puts them behind their caches).
pub(crate) fn kinds(sources: &Sources) -> [Arc<dyn super::ServedKind>; 2] {
    [Resource::Pods, Resource::Nodes].map(|resource| {
        Arc::new(ResourceMetrics { resource, sources: sources.clone() }) as Arc<dyn super::ServedKind>
    })
}

/// CPU as metrics-server publishes it: whole nanocores (the rate is rounded to them where it
/// is computed).
fn cpu_quantity(nanocores: u64) -> String {
    quantity::format_decimal_nanos(i128::from(nanocores))
}

/// Memory as metrics-server publishes it: whole bytes, BinarySI.
fn memory_quantity(bytes: f64) -> String {
    quantity::binary_si(bytes.floor())
}

/// `usage` of a container or node.
#[derive(Serialize)]
struct Usage {
    cpu: String,
    memory: String,
}

/// The usage of `sample`, its timestamp and window, when it has both resources.
fn usage_of(sample: &ContainerUsage) -> Option<(Usage, Timestamp, Duration)> {
    let (cpu, memory) = (sample.cpu_nanocores?, sample.memory_bytes?);
    Some((
        Usage { cpu: cpu_quantity(cpu), memory: memory_quantity(memory) },
        sample.timestamp?,
        sample.window?,
    ))
}

fn cells(name: &Arc<str>, cpu: &str, memory: &str, window: &str) -> [Cell; 4] {
    [Cell::Text(name.clone()), Cell::text(cpu), Cell::text(memory), Cell::text(window)]
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct PodMetrics<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    timestamp: String,
    window: String,
    containers: Vec<ContainerMetrics<'a>>,
}

#[derive(Serialize)]
struct ContainerMetrics<'a> {
    name: &'a str,
    usage: Usage,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct NodeMetrics<'a> {
    kind: &'static str,
    api_version: &'static str,
    metadata: ObjectMeta<'a>,
    timestamp: String,
    window: String,
    usage: Usage,
}

/// Which of the two kinds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Resource {
    /// `PodMetrics`, namespaced.
    Pods,
    /// `NodeMetrics`, cluster-scoped.
    Nodes,
}

/// `PodMetrics` or `NodeMetrics`, from the same sources.
#[derive(Debug)]
struct ResourceMetrics {
    resource: Resource,
    sources: Sources,
}

impl ResourceMetrics {
    async fn pods(&self, namespace: Option<&str>) -> Result<Arc<Listing>, ComputeError> {
        // metrics-server's lists carry no resourceVersion (`"metadata":{}`): neither do these.
        let Computation { pods, .. } = self.sources.begin(namespace)?;
        let (usage, warning) = self.sources.pod_usage(&pods).await;
        let now = Timestamp::now();
        let mut list = ListingBuilder::new(&POD_INFO, String::new());
        list.reserve(pods.len());
        for pod in &pods {
            let key = PodKey { namespace: pod.namespace.clone(), name: pod.name.clone() };
            let Some(containers) = usage.get(&key).filter(|c| !c.is_empty()) else { continue };
            // Every container needs its rate, or the pod is absent (metrics-server).
            let Some(usages) =
                containers.iter().map(usage_of).collect::<Option<Vec<(Usage, Timestamp, Duration)>>>()
            else {
                continue;
            };
            let Some((_, timestamp, window)) = usages.iter().min_by_key(|(_, at, _)| *at) else { continue };
            let (timestamp, window) = (*timestamp, duration::go_string(*window));
            // Summed as metrics-server sums Quantities: whole nanocores and whole bytes.
            let (cpu, memory) = containers.iter().fold((0u64, 0.0), |(cpu, memory), c| {
                let bytes = c.memory_bytes.unwrap_or_default().floor();
                (cpu.saturating_add(c.cpu_nanocores.unwrap_or_default()), memory + bytes)
            });
            let mut meta = super::meta_of_pod(pod);
            meta.uid = None;
            meta.creation_timestamp = Some(now);
            let cells = cells(&meta.name, &cpu_quantity(cpu), &memory_quantity(memory), &window);
            let object = PodMetrics {
                kind: "PodMetrics",
                api_version: METRICS.api_version,
                metadata: ObjectMeta::from(&meta),
                timestamp: rfc3339(timestamp),
                window,
                containers: containers
                    .iter()
                    .zip(usages)
                    .map(|(c, (usage, _, _))| ContainerMetrics { name: &c.name, usage })
                    .collect(),
            };
            list.push(&meta, &object, &cells);
        }
        Ok(Arc::new(list.finish(warning.into_iter().collect())))
    }
}

impl ResourceMetrics {
    fn pod_schemas() -> Vec<(String, serde_json::Value)> {
        let container = json!({
            "type": "object",
            "description": "ContainerMetrics sets resource usage metrics of a container.",
            "required": ["name", "usage"],
            "properties": {
                "name": {"type": "string", "description": "Container name corresponding to the one from pod.spec.containers."},
                "usage": usage_schema("The memory and CPU usage of the container."),
            },
        });
        let containers = json!({"type": "array", "description": "Metrics for all containers are collected within the same time window.", "items": {"$ref": format!("#/components/schemas/{}", schema_name(METRICS, "ContainerMetrics"))}});
        let object =
            metrics_schema(&POD_INFO, "the pod's name, namespace and labels", ("containers", containers));
        vec![
            (schema_name(METRICS, "PodMetrics"), object),
            (schema_name(METRICS, "ContainerMetrics"), container),
        ]
    }
}

impl ResourceMetrics {
    async fn nodes(&self) -> Result<Arc<Listing>, ComputeError> {
        if !self.sources.inventory.is_synced() {
            return Err(super::not_synced());
        }
        let nodes: Vec<Arc<NodeInfo>> = self.sources.inventory.nodes();
        let mut usage = self.sources.usage.node_usage(&nodes).await;
        let now = Timestamp::now();
        let mut list = ListingBuilder::new(&NODE_INFO, String::new());
        list.reserve(nodes.len());
        for node in &nodes {
            let Some((usage, timestamp, window)) = usage.nodes.get(&*node.name).and_then(usage_of) else {
                continue;
            };
            let window = duration::go_string(window);
            let meta = Meta {
                name: node.name.clone(),
                namespace: Meta::cluster_scoped(),
                uid: None,
                creation_timestamp: Some(now),
                labels: node.labels.clone(),
            };
            let cells = cells(&meta.name, &usage.cpu, &usage.memory, &window);
            let object = NodeMetrics {
                kind: "NodeMetrics",
                api_version: METRICS.api_version,
                metadata: ObjectMeta::from(&meta),
                timestamp: rfc3339(timestamp),
                window,
                usage,
            };
            list.push(&meta, &object, &cells);
        }
        let warnings = usage.warning.take().into_iter().collect();
        Ok(Arc::new(list.finish(warnings)))
    }
}

impl ResourceMetrics {
    fn node_schemas() -> Vec<(String, serde_json::Value)> {
        let usage = usage_schema("The memory and CPU usage of the node.");
        let object = metrics_schema(&NODE_INFO, "the node's name and labels", ("usage", usage));
        vec![(schema_name(METRICS, "NodeMetrics"), object)]
    }
}

impl super::ServedKind for ResourceMetrics {
    fn info(&self) -> &KindInfo {
        match self.resource {
            Resource::Pods => &POD_INFO,
            Resource::Nodes => &NODE_INFO,
        }
    }

    fn columns(&self) -> &[Column] {
        COLUMNS
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        match self.resource {
            Resource::Pods => Self::pod_schemas(),
            Resource::Nodes => Self::node_schemas(),
        }
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        match self.resource {
            Resource::Pods => Box::pin(self.pods(namespace)),
            Resource::Nodes => Box::pin(self.nodes()),
        }
    }
}

/// The schema of a `metrics.k8s.io` object: `timestamp`, `window` and its own `field`.
fn metrics_schema(info: &KindInfo, metadata: &str, field: (&str, serde_json::Value)) -> serde_json::Value {
    let mut properties = json!({
        "timestamp": {"type": "string", "format": "date-time", "description": "The following fields define time interval from which metrics were collected from the interval [Timestamp-Window, Timestamp]."},
        "window": {"type": "string", "description": "Interval between the two samples the CPU rates come from (a Go duration)."},
    });
    if let Some(map) = properties.as_object_mut() {
        map.insert(field.0.to_owned(), field.1);
    }
    kind_schema(info, &format!("Standard object's metadata: {metadata}."), properties)
}

fn usage_schema(description: &str) -> serde_json::Value {
    json!({
        "type": "object",
        "description": description,
        "properties": {
            "cpu": {"type": "string", "description": "CPU usage in cores (a Quantity, nanocores)."},
            "memory": {"type": "string", "description": "Memory working set in bytes (a Quantity)."},
        },
    })
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::kinds::ServedKind;
    use crate::kinds::testkit::{
        AT, FakeInventory, FakeKubelet, FakeProm, MI, mk_container, mk_object, mk_pod, mk_sources,
    };
    use crate::sources::KubeletError;

    const EARLIER: &str = "2026-07-01T09:59:50Z";

    fn mk_node(name: &str, labels: &[(&str, &str)]) -> Arc<NodeInfo> {
        Arc::new(NodeInfo {
            name: name.into(),
            addresses: Vec::new(),
            kubelet_port: None,
            labels: labels
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<crate::sources::Labels>()
                .into(),
        })
    }

    /// web-1 (two containers with rates), web-2 (one container without a rate yet), db-1 on
    /// node-b; node-a publishes its own usage, node-b none, node-c is down.
    fn mk_kinds() -> [Arc<dyn ServedKind>; 2] {
        let pods = vec![
            mk_pod("shop", "web-1", "node-a", &[("app", "web")], &["app", "sidecar"], AT),
            mk_pod("shop", "web-2", "node-a", &[("app", "web")], &["app"], AT),
            mk_pod("shop", "db-1", "node-b", &[("app", "db")], &["db"], AT),
        ];
        let mut inventory = FakeInventory::with(pods);
        Arc::get_mut(&mut inventory).unwrap().nodes =
            vec![mk_node("node-b", &[]), mk_node("node-a", &[("zone", "a")]), mk_node("node-c", &[])];
        let mut sidecar = mk_container("sidecar", Some(0.000_5), Some(10.0 * MI + 3.0), EARLIER);
        sidecar.window = Some(Duration::from_millis(10_405));
        let kubelet = FakeKubelet::default()
            .node(
                "node-a",
                vec![
                    ("shop", "web-1", vec![mk_container("app", Some(0.25), Some(128.0 * MI), AT), sidecar]),
                    ("shop", "web-2", vec![mk_container("app", None, Some(MI), AT)]),
                ],
            )
            .node_total("node-a", mk_container("", Some(1.5), Some(4096.0 * MI), AT))
            .node("node-b", vec![("shop", "db-1", vec![mk_container("db", Some(2.0), Some(1e9), AT)])])
            .down("node-c", KubeletError::Request { node: "node-c".into(), reason: "refused".into() });
        kinds(&mk_sources(inventory, Arc::new(kubelet), Arc::new(FakeProm::default())))
    }

    #[tokio::test]
    async fn pods_as_metrics_server_serves_them() {
        let [pods, _] = mk_kinds();
        let listing = pods.list(Some("shop")).await.unwrap();
        let names: Vec<&str> = listing.items.iter().map(|i| &*i.meta.name).collect();
        assert_eq!(names, ["db-1", "web-1"], "web-2 has a container without two samples: absent");
        let web = mk_object(pods.info(), &listing.items[1]);
        // The list writes it without `kind` and `apiVersion` (metrics-server's list items).
        let list_item = std::str::from_utf8(listing.items[1].list_json()).unwrap();
        let object = listing.items[1].object(pods.info());
        let prefix = r#"{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1","#;
        assert_eq!(std::str::from_utf8(&object).unwrap(), format!("{prefix}{}", &list_item[1..]));
        assert!(list_item.starts_with(r#"{"metadata":{"name":"web-1","#), "{list_item}");
        let created = web["metadata"]["creationTimestamp"].as_str().unwrap().to_owned();
        assert_eq!(
            web,
            json!({
                "kind": "PodMetrics",
                "apiVersion": "metrics.k8s.io/v1beta1",
                "metadata": {"name": "web-1", "namespace": "shop", "creationTimestamp": created, "labels": {"app": "web"}},
                // The container sampled earliest gives timestamp and window.
                "timestamp": "2026-07-01T09:59:50Z",
                "window": "10.405s",
                "containers": [
                    {"name": "app", "usage": {"cpu": "250m", "memory": "128Mi"}},
                    {"name": "sidecar", "usage": {"cpu": "500u", "memory": "10485763"}},
                ],
            })
        );
        let cells: Vec<String> = crate::kinds::testkit::mk_cells(&listing.items[1]);
        assert_eq!(cells, ["web-1", "250500u", "144703491", "10.405s"]);
        let columns: Vec<&str> = pods.columns().iter().map(|c| c.name.as_ref()).collect();
        assert_eq!(columns, ["Name", "cpu", "memory", "Window"]);
        assert_eq!(pods.info().gv, METRICS);
        assert_eq!((pods.info().plural.as_ref(), pods.info().singular.as_ref()), ("pods", ""));
    }

    #[tokio::test]
    async fn nodes_come_from_the_node_series_and_a_failed_kubelet_is_a_warning() {
        let [_, nodes] = mk_kinds();
        let listing = nodes.list(None).await.unwrap();
        assert_eq!(listing.items.len(), 1, "node-b publishes no node series, node-c is down");
        let node: Value = mk_object(nodes.info(), &listing.items[0]);
        assert_eq!(
            (node["kind"].as_str(), node["apiVersion"].as_str()),
            (Some("NodeMetrics"), Some(METRICS.api_version))
        );
        assert!(std::str::from_utf8(listing.items[0].list_json()).unwrap().starts_with(r#"{"metadata":"#));
        assert_eq!(node["metadata"]["name"], "node-a");
        assert_eq!(node["metadata"]["labels"], json!({"zone": "a"}));
        assert!(node["metadata"].get("namespace").is_none());
        assert_eq!(node["usage"], json!({"cpu": "1500m", "memory": "4Gi"}));
        assert_eq!(node["window"], "15s");
        // The object shares the inventory's name and labels: a refresh copies neither.
        let again = nodes.list(None).await.unwrap();
        assert!(!std::ptr::eq(&listing.items[0], &again.items[0]), "two computations");
        assert!(Arc::ptr_eq(&listing.items[0].meta.labels, &again.items[0].meta.labels));
        assert!(Arc::ptr_eq(&listing.items[0].meta.name, &again.items[0].meta.name));
        assert_eq!(listing.warnings.len(), 1, "{:?}", listing.warnings);
        assert!(listing.warnings[0].contains("node-c"), "{:?}", listing.warnings);
        assert!(!nodes.info().namespaced);
    }
}
