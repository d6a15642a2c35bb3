//! Fake sources for the kinds' unit tests: an in-memory [`Inventory`], a [`KubeletSource`]
//! answering per node (usage or an error) and counting calls, and a [`PromSource`] answering
//! each PromQL by the first pattern it contains and recording every query. [`mk_sources`]
//! joins them with the default query configuration and the default 5m window;
//! [`mk_cafe_inventory`] holds the pods the cafe kinds' tests join.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;

use super::cafe_brew_stats::CAFE_LABEL;
use super::{CellRef, Item, Sources};
use crate::config::{Check, LiveConfig, QueryFile};
use crate::sources::prometheus::Template;
use crate::sources::resources::KubeletUsage;
use crate::sources::{
    ContainerUsage, Inventory, KubeletError, KubeletSource, NodeInfo, NodeUsage, PodInfo, PodKey, PromError,
    PromSample, PromSource,
};

/// One mebibyte, in bytes.
pub(crate) const MI: f64 = 1024.0 * 1024.0;
/// When the fake sources' samples were taken.
pub(crate) const AT: &str = "2026-07-01T10:00:00Z";

/// `2026-07-01T10:00:00Z`-style text as a timestamp.
pub(crate) fn mk_time(text: &str) -> Timestamp {
    text.parse().unwrap_or_else(|e| panic!("timestamp {text}: {e}"))
}

/// A running pod with uid `uid-<name>`, created at `created` (RFC 3339).
pub(crate) fn mk_pod(
    namespace: &str,
    name: &str,
    node: &str,
    labels: &[(&str, &str)],
    containers: &[&str],
    created: &str,
) -> Arc<PodInfo> {
    Arc::new(PodInfo {
        namespace: namespace.into(),
        name: name.into(),
        uid: format!("uid-{name}").into(),
        labels: Arc::new(labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
        creation_timestamp: Some(mk_time(created)),
        node_name: Some(node.into()),
        containers: containers.iter().map(|c| (*c).to_owned()).collect(),
    })
}

/// The usage of one container: CPU in cores, memory in bytes, sampled at `at`.
pub(crate) fn mk_container(name: &str, cpu: Option<f64>, memory: Option<f64>, at: &str) -> ContainerUsage {
    ContainerUsage {
        name: name.into(),
        cpu_nanocores: cpu.map(|cores| (cores * 1e9).round() as u64),
        memory_bytes: memory,
        timestamp: Some(mk_time(at)),
        window: cpu.map(|_| std::time::Duration::from_secs(15)),
        cpu_stale: false,
    }
}

/// One sample with `labels`, taken at `at`.
pub(crate) fn mk_sample(labels: &[(&str, &str)], value: f64, at: &str) -> PromSample {
    PromSample {
        labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
        value,
        timestamp: mk_time(at),
    }
}

/// The pods of the cafe fixtures: in `ns`, espresso-du-matin's brew-1 and brew-2 (node-a),
/// lungo-froid's cold-1 (node-b), Bad_Name's bad-1 (node-a, not a valid object name) and
/// web-1 (node-c, serving no cafe); in `other`, espresso-du-soir's brew-9 (node-d). Serving
/// pods carry the cafe label and `app: brew`; every pod has one container, `app`.
pub(crate) fn mk_cafe_inventory() -> Arc<FakeInventory> {
    // (namespace, pod, node, cafe, created)
    let serving = [
        ("ns", "brew-1", "node-a", "espresso-du-matin", "2026-07-01T09:00:00Z"),
        ("ns", "brew-2", "node-a", "espresso-du-matin", "2026-07-01T08:00:00Z"),
        ("ns", "cold-1", "node-b", "lungo-froid", "2026-07-01T07:00:00Z"),
        ("ns", "bad-1", "node-a", "Bad_Name", "2026-07-01T07:00:00Z"),
        ("other", "brew-9", "node-d", "espresso-du-soir", "2026-07-01T06:00:00Z"),
    ];
    let mut pods: Vec<_> = serving
        .into_iter()
        .map(|(namespace, pod, node, cafe, created)| {
            mk_pod(namespace, pod, node, &[(CAFE_LABEL, cafe), ("app", "brew")], &["app"], created)
        })
        .collect();
    pods.push(mk_pod("ns", "web-1", "node-c", &[("app", "web")], &["app"], "2026-07-01T07:00:00Z"));
    FakeInventory::with(pods)
}

/// An inventory of fixed pods.
#[derive(Debug)]
pub(crate) struct FakeInventory {
    /// Every running pod, any order.
    pub(crate) pods: Vec<Arc<PodInfo>>,
    /// What `is_synced` answers.
    pub(crate) synced: bool,
    /// What `resource_version` answers.
    pub(crate) version: String,
    /// Every node.
    pub(crate) nodes: Vec<Arc<NodeInfo>>,
}

impl FakeInventory {
    /// A synced inventory of `pods` at resource version `42`.
    pub(crate) fn with(pods: Vec<Arc<PodInfo>>) -> Arc<Self> {
        Arc::new(Self { pods, synced: true, version: "42".to_owned(), nodes: Vec::new() })
    }
}

impl Inventory for FakeInventory {
    fn running_pods(&self, namespace: Option<&str>) -> Vec<Arc<PodInfo>> {
        let mut pods: Vec<_> =
            self.pods.iter().filter(|p| namespace.is_none_or(|ns| &*p.namespace == ns)).cloned().collect();
        pods.sort_by(|a, b| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)));
        pods
    }

    fn node(&self, name: &str) -> Option<Arc<NodeInfo>> {
        self.nodes.iter().find(|n| &*n.name == name).cloned()
    }

    fn nodes(&self) -> Vec<Arc<NodeInfo>> {
        let mut nodes = self.nodes.clone();
        nodes.sort_by(|a, b| a.name.cmp(&b.name));
        nodes
    }

    fn is_synced(&self) -> bool {
        self.synced
    }

    fn resource_version(&self) -> String {
        self.version.clone()
    }
}

/// Kubelets: per node, its usage or its error; a node not set answers `NoAddress`.
#[derive(Debug, Default)]
pub(crate) struct FakeKubelet {
    nodes: HashMap<String, Result<Arc<NodeUsage>, KubeletError>>,
    /// The node of every call, in call order.
    calls: Mutex<Vec<String>>,
}

impl FakeKubelet {
    /// `node` reports `pods`: (namespace, pod, its containers).
    pub(crate) fn node(mut self, node: &str, pods: Vec<(&str, &str, Vec<ContainerUsage>)>) -> Self {
        let pods = pods
            .into_iter()
            .map(|(namespace, name, containers)| {
                (PodKey { namespace: namespace.into(), name: name.into() }, containers.into())
            })
            .collect();
        self.nodes.insert(node.to_owned(), Ok(Arc::new(NodeUsage { pods, node: None })));
        self
    }

    /// `node` also reports its own usage (`node_*` series).
    pub(crate) fn node_total(mut self, node: &str, total: ContainerUsage) -> Self {
        if let Some(Ok(usage)) = self.nodes.get_mut(node) {
            Arc::make_mut(usage).node = Some(total);
        }
        self
    }

    /// `node` fails with `error`.
    pub(crate) fn down(mut self, node: &str, error: KubeletError) -> Self {
        self.nodes.insert(node.to_owned(), Err(error));
        self
    }

    /// The nodes called, sorted (calls run concurrently).
    pub(crate) fn called(&self) -> Vec<String> {
        let mut calls = self.calls.lock().map(|c| c.clone()).unwrap_or_default();
        calls.sort();
        calls
    }
}

impl KubeletSource for FakeKubelet {
    fn node_usage(&self, node: &str) -> BoxFuture<'_, Result<Arc<NodeUsage>, KubeletError>> {
        if let Ok(mut calls) = self.calls.lock() {
            calls.push(node.to_owned());
        }
        let answer = self.nodes.get(node).cloned().unwrap_or_else(|| {
            Err(KubeletError::NoAddress { node: node.to_owned(), reason: "not in the fake".to_owned() })
        });
        Box::pin(async move { answer })
    }
}

/// Prometheus: each query gets the answer of the first pattern it contains, else `otherwise`
/// (no series by default). Like Prometheus, a `namespace="…"` matcher in the query keeps only
/// the samples of that namespace.
#[derive(Debug)]
pub(crate) struct FakeProm {
    answers: Vec<(String, Result<Vec<PromSample>, PromError>)>,
    otherwise: Result<Vec<PromSample>, PromError>,
    /// Every query received, in arrival order.
    queries: Mutex<Vec<String>>,
}

impl Default for FakeProm {
    fn default() -> Self {
        Self { answers: Vec::new(), otherwise: Ok(Vec::new()), queries: Mutex::new(Vec::new()) }
    }
}

impl FakeProm {
    /// A Prometheus that fails every query with `error`.
    pub(crate) fn down(error: PromError) -> Self {
        Self { otherwise: Err(error), ..Self::default() }
    }

    /// Queries containing `pattern` (and no earlier pattern) return `samples`.
    pub(crate) fn answer(mut self, pattern: &str, samples: Vec<PromSample>) -> Self {
        self.answers.push((pattern.to_owned(), Ok(samples)));
        self
    }

    /// Queries containing `pattern` (and no earlier pattern) fail with `error`.
    pub(crate) fn fail(mut self, pattern: &str, error: PromError) -> Self {
        self.answers.push((pattern.to_owned(), Err(error)));
        self
    }

    /// The queries received, sorted (queries run concurrently).
    pub(crate) fn received(&self) -> Vec<String> {
        let mut queries = self.queries.lock().map(|q| q.clone()).unwrap_or_default();
        queries.sort();
        queries
    }
}

impl PromSource for FakeProm {
    fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>> {
        let answer = self.answers.iter().find(|(pattern, _)| promql.contains(pattern.as_str()));
        let answer = answer.map_or_else(|| self.otherwise.clone(), |(_, a)| a.clone());
        let answer = match scope(&promql) {
            Some(ns) => answer.map(|all| {
                all.into_iter().filter(|s| s.labels.get("namespace").is_some_and(|n| *n == ns)).collect()
            }),
            None => answer,
        };
        if let Ok(mut queries) = self.queries.lock() {
            queries.push(promql);
        }
        Box::pin(async move { answer })
    }
}

/// The value of the query's `namespace="…"` matcher, if any.
fn scope(promql: &str) -> Option<String> {
    let (_, rest) = promql.split_once("namespace=\"")?;
    rest.split('"').next().map(str::to_owned)
}

/// The sources of a kind: the fakes, the default queries (checked as the server checks them)
/// and a fixed 5m window.
pub(crate) fn mk_sources(
    inventory: Arc<FakeInventory>,
    kubelet: Arc<FakeKubelet>,
    prom: Arc<FakeProm>,
) -> Sources {
    let check: Check<Template> =
        Arc::new(|file: &mut QueryFile<Template>| crate::kinds::registry::check_queries(file));
    let file = QueryFile::from_yaml("", "defaults", &check).unwrap_or_else(|e| panic!("defaults: {e}"));
    Sources {
        inventory,
        usage: Arc::new(KubeletUsage::new(kubelet)),
        prometheus: prom,
        config: LiveConfig::fixed(file, Some(Duration::from_secs(300))),
    }
}

/// The served JSON of an item of a kind whose list items are typed (as its list writes it).
pub(crate) fn mk_json(item: &Item) -> serde_json::Value {
    serde_json::from_slice(item.list_json()).unwrap_or_else(|e| panic!("item JSON: {e}"))
}

/// The JSON of an item of `info` as a single-object response writes it.
pub(crate) fn mk_object(info: &super::KindInfo, item: &Item) -> serde_json::Value {
    serde_json::from_slice(&item.object(info)).unwrap_or_else(|e| panic!("object JSON: {e}"))
}

/// An item's cells as text: ages as `age:<time>`, absent as `<none>`.
pub(crate) fn mk_cells(item: &Item) -> Vec<String> {
    item.cells()
        .map(|cell| match cell {
            CellRef::Text(text) => text.to_owned(),
            CellRef::Age(at) => format!("age:{at}"),
            CellRef::None => "<none>".to_owned(),
        })
        .collect()
}
