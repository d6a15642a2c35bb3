//! Upstream data sources, each behind a narrow trait so that the HTTP layer and the served kinds
//! can be tested with fakes while the real clients are tested against real servers:
//!
//! - [`Inventory`]: pods and nodes known to the cluster (watch-backed, local reads);
//! - [`KubeletSource`]: per-node container CPU and memory from kubelet `/metrics/resource`;
//! - [`UsageSource`]: the CPU and memory of sets of pods and nodes, whichever upstream has them
//!   (`--resource-source`: the kubelets through a [`KubeletSource`], or Prometheus' cAdvisor
//!   series through [`resources::PromUsage`]);
//! - [`PromSource`]: PromQL vector queries against Prometheus;
//! - [`workloads::WorkloadSource`]: the pod selection of Deployments, StatefulSets, ReplicaSets,
//!   DaemonSets and Services (read one by one, cached).

pub(crate) mod inventory;
pub(crate) mod kubelet;
pub(crate) mod prometheus;
pub(crate) mod resource_source;
pub(crate) mod resources;
pub(crate) mod workloads;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

pub(crate) use apiserver::series_labels::{JsonStr, SeriesLabels};
use futures::future::BoxFuture;
use jiff::Timestamp;

/// A pod as the inventory knows it: only what the served kinds need.
#[derive(Debug, Clone, PartialEq)]
pub struct PodInfo {
    /// Namespace of the pod (shared by every pod of the namespace).
    pub namespace: Arc<str>,
    /// Name of the pod.
    pub name: Arc<str>,
    /// UID of the pod.
    pub uid: Arc<str>,
    /// Labels of the pod (label selectors filter on them); equal label sets are shared.
    pub labels: Arc<Labels>,
    /// Creation time of the pod.
    pub creation_timestamp: Option<Timestamp>,
    /// Node the pod is scheduled on (shared by the pods of the node).
    pub node_name: Option<Arc<str>>,
    /// Names of the pod's containers, in spec order (equal lists are shared).
    pub containers: Arc<[String]>,
}

/// A label set.
pub(crate) type Labels = BTreeMap<String, String>;

/// A node as the inventory knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct NodeInfo {
    /// Node name (shared by the objects computed for the node).
    pub name: Arc<str>,
    /// `status.addresses` as (type, address) pairs, in the node's order.
    pub addresses: Vec<(String, String)>,
    /// `status.daemonEndpoints.kubeletEndpoint.port`, when set.
    pub kubelet_port: Option<u16>,
    /// Labels of the node (label selectors of `metrics.k8s.io` filter on them), shared by the
    /// objects computed for the node.
    pub labels: Arc<Labels>,
}

/// Read access to the cluster's pods and nodes.
pub trait Inventory: Send + Sync {
    /// Running pods, in one namespace or in all of them (`None`), sorted by namespace then name.
    fn running_pods(&self, namespace: Option<&str>) -> Vec<Arc<PodInfo>>;
    /// A node by name.
    fn node(&self, name: &str) -> Option<Arc<NodeInfo>>;
    /// Every node, sorted by name.
    fn nodes(&self) -> Vec<Arc<NodeInfo>>;
    /// Whether the initial list of pods and nodes has completed.
    fn is_synced(&self) -> bool;
    /// An opaque version that changes whenever the inventory changes.
    fn resource_version(&self) -> String;
}

/// Identifies a pod across sources.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PodKey {
    /// Namespace of the pod.
    pub namespace: Arc<str>,
    /// Name of the pod.
    pub name: Arc<str>,
}

/// Usage of one container, from a kubelet.
#[derive(Debug, Clone, PartialEq)]
pub struct ContainerUsage {
    /// Container name.
    pub name: Arc<str>,
    /// CPU usage in whole nanocores, the rate between two cumulative samples; `None` until
    /// two distinct samples at most `--max-rate-window` apart have been seen (a single sample
    /// is never reported as a usage).
    pub cpu_nanocores: Option<u64>,
    /// Memory working set in bytes.
    pub memory_bytes: Option<f64>,
    /// Time of the newest sample used.
    pub timestamp: Option<Timestamp>,
    /// Time span between the two CPU samples (the range of a Prometheus `rate()`).
    pub window: Option<std::time::Duration>,
    /// CPU is absent because the two newest samples are further apart than
    /// `--max-rate-window` (the first request after an idle period), not because there is
    /// only one.
    pub cpu_stale: bool,
}

impl ContainerUsage {
    /// The CPU usage in cores.
    pub fn cpu_cores(&self) -> Option<f64> {
        self.cpu_nanocores.map(|n| n as f64 / 1e9)
    }
}

/// A pod's containers' usage, in name order (a slice of it: `Deref`). Shared, not copied, by
/// every answer that uses it: a node's usage is computed once per fetch, all its pods'
/// containers in one allocation ([`Containers::of_node`]), and each list joins it by reference.
/// One allocation per node rather than per pod matters: these live until the node's next
/// fetch, among the fetch's short-lived blocks, and would hold the allocator's pages
/// (RELIABILITY.md, "Soak").
#[derive(Clone, Default)]
pub struct Containers {
    all: Arc<[ContainerUsage]>,
    start: u32,
    end: u32,
}

impl Containers {
    /// The pods of one node: `all` their containers, and each pod's range of them.
    pub fn of_node<K>(
        all: Vec<ContainerUsage>,
        pods: impl IntoIterator<Item = (K, std::ops::Range<usize>)>,
    ) -> impl Iterator<Item = (K, Self)> {
        let all: Arc<[ContainerUsage]> = all.into();
        let as_u32 = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
        pods.into_iter().map(move |(key, range)| {
            let end = range.end.min(all.len());
            let start = range.start.min(end);
            (key, Self { all: all.clone(), start: as_u32(start), end: as_u32(end) })
        })
    }
}

impl std::ops::Deref for Containers {
    type Target = [ContainerUsage];

    fn deref(&self) -> &[ContainerUsage] {
        self.all.get(self.start as usize..self.end as usize).unwrap_or_default()
    }
}

impl From<Vec<ContainerUsage>> for Containers {
    fn from(containers: Vec<ContainerUsage>) -> Self {
        let end = u32::try_from(containers.len()).unwrap_or(u32::MAX);
        Self { all: containers.into(), start: 0, end }
    }
}

impl FromIterator<ContainerUsage> for Containers {
    fn from_iter<I: IntoIterator<Item = ContainerUsage>>(iter: I) -> Self {
        Self::from(iter.into_iter().collect::<Vec<_>>())
    }
}

impl PartialEq for Containers {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}

impl std::fmt::Debug for Containers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

/// Usage of every pod on one node, from one kubelet fetch.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct NodeUsage {
    /// Per pod, its containers' usage.
    pub pods: HashMap<PodKey, Containers>,
    /// The node's own usage (`node_cpu_usage_seconds_total`, `node_memory_working_set_bytes`),
    /// with the same rate rules as a container's (`name` is empty); `None` when the kubelet
    /// does not publish both.
    pub node: Option<ContainerUsage>,
}

/// Errors from a kubelet.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum KubeletError {
    /// The node is not in the inventory or has no usable address.
    #[error("node {node}: no usable address ({reason})")]
    NoAddress {
        /// Node name.
        node: String,
        /// What was missing.
        reason: String,
    },
    /// The HTTP request failed or timed out.
    #[error("kubelet on node {node}: {reason}")]
    Request {
        /// Node name.
        node: String,
        /// What went wrong, without secrets.
        reason: String,
    },
    /// The kubelet reported that it could not collect the summary.
    #[error("kubelet on node {node} reported a scrape error")]
    ScrapeError {
        /// Node name.
        node: String,
    },
}

/// Per-node kubelet usage.
pub(crate) trait KubeletSource: Send + Sync {
    /// Container usage of every pod on `node`. Implementations cache per node and make
    /// concurrent calls for the same node share one fetch.
    fn node_usage(&self, node: &str) -> BoxFuture<'_, Result<Arc<NodeUsage>, KubeletError>>;

    /// How CPU rates are kept current (the largest window, how often nodes are sampled),
    /// for the warning of an answer with CPU still missing.
    fn sampling(&self) -> kubelet::Sampling {
        kubelet::KubeletConfig::default().sampling()
    }
}

/// The usage of a set of pods: per pod, its containers' usage (a pod without usage is absent),
/// and one warning naming what failed, if anything did.
#[derive(Debug, Clone, Default)]
pub struct PodsUsage {
    /// Per pod, its containers' usage.
    pub pods: HashMap<PodKey, Containers>,
    /// Why some pods have no usage (failed nodes, a failed query), ready for a `Warning` header.
    pub warning: Option<String>,
}

/// The usage of a set of nodes: per node name, its own usage (`name` empty), and one warning
/// naming what failed, if anything did.
#[derive(Debug, Clone, Default)]
pub struct NodesUsage {
    /// Per node, its usage; a node without both CPU and memory data is absent.
    pub nodes: HashMap<Arc<str>, ContainerUsage>,
    /// Why some nodes have no usage, ready for a `Warning` header.
    pub warning: Option<String>,
}

/// CPU and memory of pods and nodes: what PodMetricsSummary, CafeBrewStats and
/// `metrics.k8s.io` compute from, whatever the upstream (`--resource-source`).
pub trait UsageSource: Send + Sync {
    /// Usage of `pods` (one namespace or several). Implementations cache and make concurrent
    /// calls share one fetch; failures become the warning, never an error.
    fn pod_usage<'a>(&'a self, pods: &'a [Arc<PodInfo>]) -> BoxFuture<'a, PodsUsage>;
    /// Usage of `nodes`, with the same rules.
    fn node_usage<'a>(&'a self, nodes: &'a [Arc<NodeInfo>]) -> BoxFuture<'a, NodesUsage>;
}

/// One sample of a PromQL instant vector.
#[derive(Debug, Clone, PartialEq)]
pub struct PromSample {
    /// The series labels.
    pub labels: SeriesLabels,
    /// The sample value.
    pub value: f64,
    /// The sample time.
    pub timestamp: Timestamp,
}

/// Errors from Prometheus.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PromError {
    /// The query could not be sent or timed out.
    #[error("prometheus unreachable: {0}")]
    Unreachable(String),
    /// Prometheus answered with an error.
    #[error("prometheus query failed: {0}")]
    Query(String),
    /// The answer was larger than the limit (`--prometheus-max-response-bytes`) and was
    /// aborted while streaming in.
    #[error("prometheus answer larger than {limit} bytes (--prometheus-max-response-bytes): aborted")]
    TooLarge {
        /// The limit in bytes.
        limit: u64,
    },
}

/// PromQL instant queries.
pub trait PromSource: Send + Sync {
    /// Runs one instant query and returns its vector result (scalars become one unlabelled
    /// sample; other result types are an error).
    fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>>;

    /// The series matching the series selector `selector` that had samples between `start`
    /// and `end` (`/api/v1/series`), each as its label set (`__name__` included). Sources
    /// that cannot list series answer an error.
    fn series(
        &self,
        selector: String,
        start: Timestamp,
        end: Timestamp,
    ) -> BoxFuture<'_, Result<Vec<BTreeMap<String, String>>, PromError>> {
        let _ = (selector, start, end);
        Box::pin(async { Err(PromError::Query("this Prometheus source cannot list series".to_owned())) })
    }
}

pub(crate) use apiserver::{UpstreamObserver, outcome};
