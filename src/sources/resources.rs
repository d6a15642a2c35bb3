//! The two [`UsageSource`]s (`--resource-source`):
//!
//! - [`KubeletUsage`]: each node's kubelet, through a [`KubeletSource`] (one cached fetch per
//!   node serves every pod of the node and the node itself);
//! - [`PromUsage`]: PromQL over the series Prometheus already holds, the `resourceQueries:` of
//!   the configuration, with defaults on cAdvisor's `container_cpu_usage_seconds_total` and
//!   `container_memory_working_set_bytes` and the kubelet's `node_*` series. Pods are read per
//!   namespace (`SCOPE`), a list of several namespaces a few namespaces at a time; answers are
//!   cached per namespace and configuration generation, with concurrent requests sharing one
//!   query.
//!
//! [`check_resource_queries`] owns the `resourceQueries:` section: it fills in the defaults
//! and rejects a query that could read every namespace or whose result loses the labels that
//! place a value.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;

use super::prometheus::{self, Matcher, Template};
use super::{
    ContainerUsage, Containers, KubeletSource, NodeInfo, NodesUsage, PodInfo, PodKey, PodsUsage, PromError,
    PromSample, PromSource, UsageSource,
};
use crate::config::{Invalid, LiveConfig, QueryFile};
use apiserver::{CacheSettings, TtlCache};

/// Failed nodes named in one warning; the rest are counted.
const LISTED: usize = 5;

/// CPU and memory from the kubelets.
pub(crate) struct KubeletUsage {
    kubelet: Arc<dyn KubeletSource>,
}

impl KubeletUsage {
    /// Reads usage through `kubelet`.
    pub(crate) fn new(kubelet: Arc<dyn KubeletSource>) -> Self {
        Self { kubelet }
    }

    /// Why `count` pods or nodes have no CPU after an idle period, and when to ask again. (A
    /// container seen once has no CPU either, as in metrics-server, without a warning: every
    /// new pod would raise one.)
    fn cpu_waiting(&self, count: usize, what: &str) -> String {
        let sampling = self.kubelet.sampling();
        let plural = if count == 1 { "" } else { "s" };
        format!(
            "cpu omitted for {count} {what}{plural}: their two newest kubelet samples are further apart \
             than --max-rate-window ({}), as on the first request after an idle period; ask again in {}",
            k8s_wire::duration::go_string(sampling.max_window),
            k8s_wire::duration::go_string(sampling.retry_after),
        )
    }
}

/// The warnings that are there, in one line.
fn join_warnings<const N: usize>(warnings: [Option<String>; N]) -> Option<String> {
    let warnings: Vec<String> = warnings.into_iter().flatten().collect();
    (!warnings.is_empty()).then(|| warnings.join("; "))
}

/// `failed` (error messages naming their node) as the tail of a warning.
fn listed(failed: &BTreeSet<String>) -> String {
    let mut text = failed.iter().take(LISTED).cloned().collect::<Vec<_>>().join("; ");
    if failed.len() > LISTED {
        text.push_str(&format!("; and {} more", failed.len() - LISTED));
    }
    text
}

impl UsageSource for KubeletUsage {
    fn pod_usage<'a>(&'a self, pods: &'a [Arc<PodInfo>]) -> BoxFuture<'a, PodsUsage> {
        Box::pin(async move {
            // Only the nodes that run the pods, in parallel (each node is cached and single
            // flight in the kubelet source).
            let nodes: BTreeSet<&str> = pods.iter().filter_map(|p| p.node_name.as_deref()).collect();
            let results =
                futures::future::join_all(nodes.iter().map(|node| self.kubelet.node_usage(node))).await;
            let mut usage = PodsUsage::default();
            let mut failed = BTreeSet::new();
            for result in results {
                match result {
                    Ok(node) => usage.pods.extend(node.pods.iter().map(|(k, v)| (k.clone(), v.clone()))),
                    Err(error) => {
                        failed.insert(error.to_string());
                    }
                }
            }
            let failed = match failed.len() {
                0 => None,
                1 => Some(format!("cpu and memory omitted for pods on 1 node: {}", listed(&failed))),
                n => Some(format!("cpu and memory omitted for pods on {n} nodes: {}", listed(&failed))),
            };
            let waiting = pods
                .iter()
                .filter(|p| {
                    let key = PodKey { namespace: p.namespace.clone(), name: p.name.clone() };
                    usage.pods.get(&key).is_some_and(|c| c.iter().any(|c| c.cpu_stale))
                })
                .count();
            let waiting = (waiting > 0).then(|| self.cpu_waiting(waiting, "pod"));
            usage.warning = join_warnings([failed, waiting]);
            usage
        })
    }

    fn node_usage<'a>(&'a self, nodes: &'a [Arc<NodeInfo>]) -> BoxFuture<'a, NodesUsage> {
        Box::pin(async move {
            let results =
                futures::future::join_all(nodes.iter().map(|n| self.kubelet.node_usage(&n.name))).await;
            let mut usage = NodesUsage::default();
            let mut failed = BTreeSet::new();
            for (node, result) in nodes.iter().zip(results) {
                match result {
                    Ok(fetched) => {
                        if let Some(own) = &fetched.node {
                            usage.nodes.insert(node.name.clone(), own.clone());
                        }
                    }
                    Err(error) => {
                        failed.insert(error.to_string());
                    }
                }
            }
            let failed = (!failed.is_empty()).then(|| {
                format!("{} node(s) omitted, their kubelets failed: {}", failed.len(), listed(&failed))
            });
            let waiting = usage.nodes.values().filter(|n| n.cpu_stale).count();
            let waiting = (waiting > 0).then(|| self.cpu_waiting(waiting, "node"));
            usage.warning = join_warnings([failed, waiting]);
            usage
        })
    }
}

/// Default of `resourceQueries.containerCPU`: cAdvisor's per-container counter. Its series
/// for the pod's cgroup (`container=""`) and sandbox (`container="POD"`) are left out.
pub(crate) const DEFAULT_CONTAINER_CPU: &str = r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD",SCOPE}[WINDOW]))"#;
/// Default of `resourceQueries.containerMemory`.
pub(crate) const DEFAULT_CONTAINER_MEMORY: &str = r#"sum by (namespace, pod, container) (container_memory_working_set_bytes{container!="",container!="POD",SCOPE})"#;
/// Default of `resourceQueries.nodeCPU`: the kubelet's `/metrics/resource` node counter, with
/// the `node` label Prometheus Operator (and most kubelet scrape configurations) attach.
pub(crate) const DEFAULT_NODE_CPU: &str = "sum by (node) (rate(node_cpu_usage_seconds_total[WINDOW]))";
/// Default of `resourceQueries.nodeMemory`.
pub(crate) const DEFAULT_NODE_MEMORY: &str = "sum by (node) (node_memory_working_set_bytes)";
/// Default of `resourceQueries.window`: four scrapes at Prometheus' usual 15s interval.
pub(crate) const DEFAULT_RESOURCE_WINDOW: Duration = Duration::from_secs(60);

/// CPU rates are rounded to the micro-core: `rate()` over float counters leaves noise in the
/// last digits (`0.0090000012`), which would put a value on the wrong side of a millicore when
/// `kubectl top` rounds it up.
const NANOCORES_PER_MICROCORE: u64 = 1_000;

/// A `rate()` of core-seconds as whole nanocores, rounded to the micro-core (the value is
/// finite and not negative; `as` saturates).
fn rounded_nanocores(cores: f64) -> u64 {
    ((cores * 1e6).round() as u64).saturating_mul(NANOCORES_PER_MICROCORE)
}

/// Labels a container query's result keeps.
const CONTAINER_LABELS: [&str; 3] = ["namespace", "pod", "container"];
/// The label a node query's result keeps.
const NODE_LABEL: &str = "node";

/// Checks `resourceQueries:` and fills in its defaults (whatever `--resource-source` is, so a
/// file valid today stays valid when the flag changes).
pub(crate) fn check_resource_queries(file: &mut QueryFile<Template>) -> Result<(), Invalid> {
    let queries = &mut file.resource_queries;
    let field = |name: &str| format!("resourceQueries.{name}");
    for (name, query, default) in [
        ("containerCPU", &mut queries.container_cpu, DEFAULT_CONTAINER_CPU),
        ("containerMemory", &mut queries.container_memory, DEFAULT_CONTAINER_MEMORY),
    ] {
        let query = query.get_or_insert_with(|| Template::new(default));
        // SCOPE in every selector: a namespaced request never reads another namespace.
        query.check_scoped().map_err(|e| Invalid::new(field(name), e.to_string()))?;
        for label in CONTAINER_LABELS {
            query.keeps_label(label).map_err(|message| {
                Invalid::new(field(name), format!("{message}, which places each value on a container"))
            })?;
        }
    }
    for (name, query, default) in [
        ("nodeCPU", &mut queries.node_cpu, DEFAULT_NODE_CPU),
        ("nodeMemory", &mut queries.node_memory, DEFAULT_NODE_MEMORY),
    ] {
        let query = query.get_or_insert_with(|| Template::new(default));
        query.check().map_err(|e| Invalid::new(field(name), e.to_string()))?;
        query.keeps_label(NODE_LABEL).map_err(|message| {
            Invalid::new(field(name), format!("{message}, which names the node of each value"))
        })?;
    }
    if queries.window.is_some_and(|w| w < Duration::from_secs(1)) {
        return Err(Invalid::new(field("window"), "must be at least 1s"));
    }
    queries.window.get_or_insert(DEFAULT_RESOURCE_WINDOW);
    Ok(())
}

/// Namespaces queried at once for a list of several.
const NAMESPACE_QUERIES_AT_ONCE: usize = 8;

/// Names of the caches in `percolator_cache_requests_total`.
const POD_CACHE: &str = "resource-usage-pods";
const NODE_CACHE: &str = "resource-usage-nodes";
/// Namespaces cached at once.
const MAX_CACHED_SCOPES: u64 = 100_000;

/// Containers' usage per pod, from one scope's queries.
type PodTable = HashMap<PodKey, Containers>;

/// One namespace's usage, or why it is missing.
type ScopeResult = Result<Arc<PodTable>, Arc<PromError>>;

/// The rendered CPU and memory queries of one namespace's pods or of the nodes, and how to
/// read their results.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceQuery {
    /// CPU cores per object (and container).
    pub cpu: String,
    /// Memory working set bytes per object (and container).
    pub memory: String,
    /// The rate range, served as `window`.
    pub window: Duration,
    /// The result label naming the pod or the node.
    pub object_label: String,
    /// The result label naming the container (pod queries).
    pub container_label: String,
}

/// Why the resource queries could not be made.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ResourceQueryError {
    /// A `resourceQueries:` template does not render for the scope asked for.
    #[error(transparent)]
    Template(#[from] super::prometheus::Error),
    /// An adapter configuration's `resourceRules` do not give a query; the message names the
    /// rule.
    #[error("{0}")]
    Rule(String),
}

/// The adapter's rule errors are worded (and name their field) where the rules live.
impl From<String> for ResourceQueryError {
    fn from(message: String) -> Self {
        Self::Rule(message)
    }
}

/// Where `--resource-source=prometheus` takes its queries from: the `resourceQueries:` of
/// `--config` ([`ConfigQueries`]), or an adapter configuration's `resourceRules`.
pub(crate) trait ResourceQueryPlan: Send + Sync {
    /// Changes whenever the queries may have.
    fn generation(&self) -> u64;
    /// The queries of the pods of `namespace` (never reading another namespace).
    fn pods(&self, namespace: &str) -> Result<ResourceQuery, ResourceQueryError>;
    /// The queries of `nodes`.
    fn nodes(&self, nodes: &[&str]) -> Result<ResourceQuery, ResourceQueryError>;
}

/// Renders a `resourceQueries:` template, which [`check_resource_queries`] compiled or filled in.
fn render(
    query: Option<&Template>,
    scope: &[Matcher],
    window: Duration,
) -> Result<String, prometheus::Error> {
    let unset =
        || prometheus::Error::Template { at: 0, reason: "no query: the file was not checked".to_owned() };
    query.ok_or_else(unset)?.render(scope, window)
}

/// The `resourceQueries:` of `--config`.
pub(crate) struct ConfigQueries(pub Arc<LiveConfig<Template>>);

impl ResourceQueryPlan for ConfigQueries {
    fn generation(&self) -> u64 {
        self.0.current().generation
    }

    fn pods(&self, namespace: &str) -> Result<ResourceQuery, ResourceQueryError> {
        let snapshot = self.0.current();
        let queries = &snapshot.file.resource_queries;
        let window = queries.window.unwrap_or(DEFAULT_RESOURCE_WINDOW);
        let scope = [Matcher::eq("namespace", namespace)?];
        let render = |q: &Option<Template>| render(q.as_ref(), &scope, window);
        Ok(ResourceQuery {
            cpu: render(&queries.container_cpu)?,
            memory: render(&queries.container_memory)?,
            window,
            object_label: "pod".to_owned(),
            container_label: "container".to_owned(),
        })
    }

    fn nodes(&self, _nodes: &[&str]) -> Result<ResourceQuery, ResourceQueryError> {
        let snapshot = self.0.current();
        let queries = &snapshot.file.resource_queries;
        let window = queries.window.unwrap_or(DEFAULT_RESOURCE_WINDOW);
        let render = |q: &Option<Template>| render(q.as_ref(), &[], window);
        Ok(ResourceQuery {
            cpu: render(&queries.node_cpu)?,
            memory: render(&queries.node_memory)?,
            window,
            object_label: NODE_LABEL.to_owned(),
            container_label: String::new(),
        })
    }
}

/// CPU and memory from Prometheus (`--resource-source=prometheus`).
pub(crate) struct PromUsage {
    prometheus: Arc<dyn PromSource>,
    plan: Arc<dyn ResourceQueryPlan>,
    /// Per (configuration generation, namespace), the usage of its pods.
    pods: TtlCache<(u64, Arc<str>), Arc<PodTable>>,
    /// Per configuration generation, the usage of every node.
    nodes: TtlCache<u64, Arc<HashMap<String, ContainerUsage>>>,
}

impl PromUsage {
    /// Reads usage through `prometheus`, with the `resourceQueries` of `config` in force.
    #[cfg(test)]
    pub(crate) fn new(
        prometheus: Arc<dyn PromSource>,
        config: Arc<LiveConfig<Template>>,
        cache: &CacheSettings,
    ) -> Self {
        Self::with_plan(prometheus, Arc::new(ConfigQueries(config)), cache)
    }

    /// Reads usage through `prometheus` with the queries of `plan`.
    pub(crate) fn with_plan(
        prometheus: Arc<dyn PromSource>,
        plan: Arc<dyn ResourceQueryPlan>,
        cache: &CacheSettings,
    ) -> Self {
        Self {
            prometheus,
            plan,
            pods: TtlCache::new(POD_CACHE, cache, MAX_CACHED_SCOPES),
            nodes: TtlCache::new(NODE_CACHE, cache, 4),
        }
    }

    /// Runs the CPU and memory queries of one scope and joins them by `key`.
    async fn run_pair<K: std::hash::Hash + Eq>(
        &self,
        query: ResourceQuery,
        key: impl Fn(&PromSample) -> Option<(K, Arc<str>)>,
    ) -> Result<HashMap<K, Vec<ContainerUsage>>, PromError> {
        let window = query.window;
        let (cpu, memory) =
            futures::join!(self.prometheus.query(query.cpu), self.prometheus.query(query.memory));
        let (cpu, memory) = (cpu?, memory?);
        let mut table: HashMap<K, Vec<ContainerUsage>> = HashMap::new();
        for sample in cpu.iter().filter(|s| s.value.is_finite() && s.value >= 0.0) {
            if let Some((key, name)) = key(sample)
                && let Some(usage) = container(table.entry(key).or_default(), name, sample)
            {
                usage.cpu_nanocores = Some(rounded_nanocores(sample.value));
                usage.window = Some(window);
            }
        }
        for sample in memory.iter().filter(|s| s.value.is_finite() && s.value >= 0.0) {
            if let Some((key, name)) = key(sample)
                && let Some(usage) = container(table.entry(key).or_default(), name, sample)
            {
                usage.memory_bytes = Some(sample.value);
            }
        }
        for containers in table.values_mut() {
            // In name order, as kubelets list them.
            containers.sort_by(|a, b| a.name.cmp(&b.name));
        }
        Ok(table)
    }

    /// The usage of every pod of `namespace`.
    async fn scope(&self, namespace: Arc<str>) -> ScopeResult {
        let generation = self.plan.generation();
        let compute = async {
            let query = self.plan.pods(&namespace).map_err(|e| PromError::Query(e.to_string()))?;
            let (pod_label, container_label) = (query.object_label.clone(), query.container_label.clone());
            // Scoped to the namespace: every result belongs to it, whether or not the query
            // keeps the label (one that names another namespace is not this one's).
            let key = |s: &PromSample| {
                if s.labels.get("namespace").is_some_and(|ns| ns != &*namespace) {
                    return None;
                }
                let pod = PodKey { namespace: namespace.clone(), name: s.labels.get(&pod_label)?.into() };
                Some((pod, s.labels.get(&container_label)?.into()))
            };
            let table = self.run_pair(query, key).await?;
            let table: PodTable =
                table.into_iter().map(|(pod, containers)| (pod, containers.into())).collect();
            Ok::<_, PromError>(Arc::new(table))
        };
        self.pods
            .get_or_try_compute((generation, namespace.clone()), compute)
            .await
            .map(|(table, _, _)| table)
    }

    /// The usage of `nodes`.
    async fn all_nodes(
        &self,
        nodes: &[Arc<NodeInfo>],
    ) -> Result<Arc<HashMap<String, ContainerUsage>>, Arc<PromError>> {
        let generation = self.plan.generation();
        let compute = async {
            let names: Vec<&str> = nodes.iter().map(|n| &*n.name).collect();
            let query = self.plan.nodes(&names).map_err(|e| PromError::Query(e.to_string()))?;
            let node_label = query.object_label.clone();
            let key = |s: &PromSample| Some((s.labels.get(&node_label)?.to_owned(), Arc::<str>::from("")));
            let table = self.run_pair(query, key).await?;
            let nodes =
                table.into_iter().filter_map(|(node, mut usage)| Some((node, usage.pop()?))).collect();
            Ok::<_, PromError>(Arc::new(nodes))
        };
        self.nodes.get_or_try_compute(generation, compute).await.map(|(nodes, _, _)| nodes)
    }
}

/// The entry of container `name` in `containers`, added (without values, at the sample's
/// time) when absent.
fn container<'a>(
    containers: &'a mut Vec<ContainerUsage>,
    name: Arc<str>,
    sample: &PromSample,
) -> Option<&'a mut ContainerUsage> {
    if let Some(at) = containers.iter().position(|c| c.name == name) {
        return containers.get_mut(at);
    }
    containers.push(ContainerUsage {
        name,
        cpu_nanocores: None,
        memory_bytes: None,
        timestamp: Some(sample.timestamp),
        window: None,
        cpu_stale: false,
    });
    containers.last_mut()
}

impl UsageSource for PromUsage {
    fn pod_usage<'a>(&'a self, pods: &'a [Arc<PodInfo>]) -> BoxFuture<'a, PodsUsage> {
        Box::pin(async move {
            // One query pair per namespace, each cached on its own: an all-namespaces list
            // reuses what namespaced requests fetched, and no single query has to cover the
            // whole cluster (at 150,000 pods a cluster-wide cAdvisor query outlasts a 10s
            // Prometheus timeout where ten namespaced ones do not).
            let mut namespaces: Vec<Arc<str>> = pods.iter().map(|p| p.namespace.clone()).collect();
            namespaces.sort_unstable();
            namespaces.dedup();
            let tables: Vec<(Arc<str>, ScopeResult)> = futures::stream::iter(namespaces)
                .map(|ns| {
                    let table = self.scope(ns.clone());
                    async move { (ns, table.await) }
                })
                .buffer_unordered(NAMESPACE_QUERIES_AT_ONCE)
                .collect()
                .await;
            let mut found: HashMap<&str, Arc<PodTable>> = HashMap::new();
            let mut failed: BTreeSet<String> = BTreeSet::new();
            let mut first_error = None;
            for (namespace, table) in &tables {
                match table {
                    Ok(table) => {
                        found.insert(namespace, table.clone());
                    }
                    Err(error) => {
                        failed.insert(namespace.to_string());
                        first_error.get_or_insert_with(|| error.to_string());
                    }
                }
            }
            let usage = pods
                .iter()
                .filter_map(|p| {
                    let key = PodKey { namespace: p.namespace.clone(), name: p.name.clone() };
                    let containers = found.get(&*p.namespace)?.get(&key)?.clone();
                    Some((key, containers))
                })
                .collect();
            let warning = first_error.map(|error| {
                let scope = match failed.len() {
                    1 => String::new(),
                    n => format!(" (pods of {n} namespaces: {})", listed(&failed)),
                };
                format!("cpu and memory omitted: resource usage from Prometheus: {error}{scope}")
            });
            PodsUsage { pods: usage, warning }
        })
    }

    fn node_usage<'a>(&'a self, nodes: &'a [Arc<NodeInfo>]) -> BoxFuture<'a, NodesUsage> {
        Box::pin(async move {
            if nodes.is_empty() {
                return NodesUsage::default();
            }
            match self.all_nodes(nodes).await {
                Ok(all) => NodesUsage {
                    nodes: nodes
                        .iter()
                        .filter_map(|n| Some((n.name.clone(), all.get(&*n.name)?.clone())))
                        .collect(),
                    warning: None,
                },
                Err(error) => NodesUsage {
                    nodes: HashMap::new(),
                    warning: Some(format!("nodes omitted: resource usage from Prometheus: {error}")),
                },
            }
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Mutex;

    use jiff::Timestamp;

    use super::*;
    use crate::config::Check;
    use test_support::all_at_once;

    const AT: &str = "2026-07-01T10:00:00Z";

    /// Answers each PromQL by the first pattern it contains; records every query.
    #[derive(Default)]
    struct Prom {
        answers: Vec<(&'static str, Result<Vec<PromSample>, PromError>)>,
        queries: Mutex<Vec<String>>,
    }

    impl PromSource for Prom {
        fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>> {
            Box::pin(async move {
                tokio::task::yield_now().await;
                self.queries.lock().unwrap().push(promql.clone());
                self.answers
                    .iter()
                    .find(|(pattern, _)| promql.contains(pattern))
                    .map_or_else(|| Ok(Vec::new()), |(_, answer)| answer.clone())
            })
        }
    }

    fn sample(labels: &[(&str, &str)], value: f64) -> PromSample {
        PromSample {
            labels: labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect(),
            value,
            timestamp: AT.parse().unwrap(),
        }
    }

    fn check() -> Check<Template> {
        Arc::new(check_resource_queries)
    }

    fn config(yaml: &str) -> Arc<LiveConfig<Template>> {
        LiveConfig::fixed(QueryFile::from_yaml(yaml, "config.yaml", &check()).unwrap(), None)
    }

    fn pod(namespace: &str, name: &str) -> Arc<PodInfo> {
        Arc::new(PodInfo {
            namespace: namespace.into(),
            name: name.into(),
            uid: format!("uid-{name}").into(),
            labels: Arc::default(),
            creation_timestamp: None,
            node_name: Some("node-a".into()),
            containers: vec!["app".to_owned(), "sidecar".to_owned()].into(),
        })
    }

    fn node(name: &str) -> Arc<NodeInfo> {
        Arc::new(NodeInfo {
            name: name.into(),
            addresses: Vec::new(),
            kubelet_port: None,
            labels: Default::default(),
        })
    }

    fn usage_of(prom: Prom, yaml: &str) -> (Arc<Prom>, PromUsage) {
        let prom = Arc::new(prom);
        let usage =
            PromUsage::new(prom.clone(), config(yaml), &CacheSettings::uncounted(Duration::from_secs(60)));
        (prom, usage)
    }

    fn shop_answers() -> Prom {
        Prom {
            answers: vec![
                (
                    "container_cpu_usage_seconds_total",
                    Ok(vec![
                        sample(&[("namespace", "shop"), ("pod", "web-1"), ("container", "sidecar")], 0.01),
                        sample(&[("namespace", "shop"), ("pod", "web-1"), ("container", "app")], 0.25),
                        sample(
                            &[("namespace", "shop"), ("pod", "web-2"), ("container", "app")],
                            0.500_000_001_2,
                        ),
                        // Without the labels that place it: ignored.
                        sample(&[("namespace", "shop"), ("container", "app")], 9.0),
                        sample(&[("namespace", "shop"), ("pod", "web-2"), ("container", "nan")], f64::NAN),
                    ]),
                ),
                (
                    "container_memory_working_set_bytes",
                    Ok(vec![
                        sample(&[("namespace", "shop"), ("pod", "web-1"), ("container", "app")], 1000.0),
                        sample(&[("namespace", "shop"), ("pod", "web-1"), ("container", "sidecar")], 10.0),
                        // Memory without CPU (one sample so far): present, CPU unknown.
                        sample(&[("namespace", "shop"), ("pod", "web-3"), ("container", "app")], 30.0),
                    ]),
                ),
            ],
            ..Prom::default()
        }
    }

    #[tokio::test]
    async fn pods_of_one_namespace_read_that_namespace_with_the_default_queries() {
        let (prom, source) = usage_of(shop_answers(), "");
        let pods = [pod("shop", "web-1"), pod("shop", "web-2"), pod("shop", "web-3"), pod("shop", "gone")];
        let usage = source.pod_usage(&pods).await;
        assert_eq!(usage.warning, None);
        let queries = prom.queries.lock().unwrap().clone();
        assert_eq!(
            queries,
            [
                r#"sum by (namespace, pod, container) (rate(container_cpu_usage_seconds_total{container!="",container!="POD",namespace="shop"}[1m]))"#,
                r#"sum by (namespace, pod, container) (container_memory_working_set_bytes{container!="",container!="POD",namespace="shop"})"#,
            ]
        );
        let key = |name: &str| PodKey { namespace: "shop".into(), name: name.into() };
        let at: Timestamp = AT.parse().unwrap();
        let web1 = &usage.pods[&key("web-1")];
        assert_eq!(web1.len(), 2);
        assert_eq!(
            web1[0],
            ContainerUsage {
                name: "app".into(),
                cpu_nanocores: Some(250_000_000),
                memory_bytes: Some(1000.0),
                timestamp: Some(at),
                window: Some(Duration::from_secs(60)),
                cpu_stale: false,
            }
        );
        assert_eq!(
            (&*web1[1].name, web1[1].cpu_nanocores, web1[1].memory_bytes),
            ("sidecar", Some(10_000_000), Some(10.0))
        );
        let web2 = &usage.pods[&key("web-2")];
        assert_eq!(web2.len(), 1, "the NaN sample is dropped");
        assert_eq!((web2[0].cpu_nanocores, web2[0].memory_bytes), (Some(500_000_000), None));
        let web3 = &usage.pods[&key("web-3")];
        assert_eq!((web3[0].cpu_nanocores, web3[0].memory_bytes, web3[0].window), (None, Some(30.0), None));
        assert!(!usage.pods.contains_key(&key("gone")));
        assert_eq!(usage.pods.len(), 3);
    }

    #[tokio::test]
    async fn pods_of_several_namespaces_are_read_per_namespace_and_concurrent_calls_share_queries() {
        let (prom, source) = usage_of(shop_answers(), "");
        let source = Arc::new(source);
        let pods: Arc<[Arc<PodInfo>]> = vec![pod("shop", "web-1"), pod("api", "web-1")].into();
        let results = all_at_once(8, |_| {
            let (source, pods) = (source.clone(), pods.clone());
            async move { source.pod_usage(&pods).await }
        })
        .await;
        for usage in results {
            assert_eq!(usage.pods.len(), 1, "only shop/web-1 has usage");
        }
        let mut queries = prom.queries.lock().unwrap().clone();
        queries.sort();
        assert_eq!(queries.len(), 4, "one pair per namespace, shared by the 8 calls: {queries:?}");
        assert!(
            queries[0].contains(r#"namespace="api""#) && queries[1].contains(r#"namespace="shop""#),
            "{queries:?}"
        );
        // A namespaced call reuses its namespace's entry.
        source.pod_usage(&[pod("shop", "web-1")]).await;
        assert_eq!(prom.queries.lock().unwrap().len(), 4);
        assert!(source.pod_usage(&[]).await.pods.is_empty());
        assert_eq!(prom.queries.lock().unwrap().len(), 4, "no pods, no query");
    }

    #[tokio::test]
    async fn a_namespace_value_is_escaped_and_configured_queries_and_window_apply() {
        let yaml = r#"
resourceQueries:
  containerCPU: 'sum by (namespace, pod, container) (irate(cpu_total{SCOPE}[WINDOW]))'
  containerMemory: 'sum by (namespace, pod, container) (mem{SCOPE})'
  window: 2m
"#;
        let (prom, source) = usage_of(Prom::default(), yaml);
        source.pod_usage(&[pod("a\"b", "x")]).await;
        let queries = prom.queries.lock().unwrap().clone();
        assert_eq!(
            queries,
            [
                r#"sum by (namespace, pod, container) (irate(cpu_total{namespace="a\"b"}[2m]))"#,
                r#"sum by (namespace, pod, container) (mem{namespace="a\"b"})"#,
            ]
        );
    }

    #[tokio::test]
    async fn a_failed_query_omits_every_pod_with_one_warning() {
        let prom = Prom {
            answers: vec![("memory", Err(PromError::Unreachable("connection refused".into())))],
            ..Prom::default()
        };
        let (_, source) = usage_of(prom, "");
        let usage = source.pod_usage(&[pod("shop", "web-1")]).await;
        assert!(usage.pods.is_empty());
        assert_eq!(
            usage.warning.as_deref(),
            Some(
                "cpu and memory omitted: resource usage from Prometheus: prometheus unreachable: connection refused"
            )
        );
        let nodes = source.node_usage(&[node("node-a")]).await;
        assert!(nodes.nodes.is_empty());
        assert_eq!(
            nodes.warning.as_deref(),
            Some("nodes omitted: resource usage from Prometheus: prometheus unreachable: connection refused")
        );
    }

    #[tokio::test]
    async fn nodes_come_from_the_node_queries_by_their_node_label() {
        let prom = Prom {
            answers: vec![
                (
                    "node_cpu_usage_seconds_total",
                    Ok(vec![sample(&[("node", "node-a")], 1.5), sample(&[("node", "node-b")], 0.5)]),
                ),
                (
                    "node_memory_working_set_bytes",
                    Ok(vec![sample(&[("node", "node-a")], 4096.0), sample(&[("instance", "10.0.0.1")], 1.0)]),
                ),
            ],
            ..Prom::default()
        };
        let (prom, source) = usage_of(prom, "");
        let usage = source.node_usage(&[node("node-a"), node("node-b"), node("node-c")]).await;
        assert_eq!(usage.warning, None);
        assert_eq!(
            prom.queries.lock().unwrap().clone(),
            [
                "sum by (node) (rate(node_cpu_usage_seconds_total[1m]))",
                "sum by (node) (node_memory_working_set_bytes)"
            ]
        );
        let a = &usage.nodes["node-a"];
        assert_eq!(
            (a.cpu_nanocores, a.memory_bytes, a.window),
            (Some(1_500_000_000), Some(4096.0), Some(Duration::from_secs(60)))
        );
        let b = &usage.nodes["node-b"];
        assert_eq!((b.cpu_nanocores, b.memory_bytes), (Some(500_000_000), None));
        assert_eq!(usage.nodes.len(), 2);
    }

    #[test]
    fn the_section_is_checked_with_the_field_named() {
        let cases = [
            (
                "resourceQueries:\n  containerCPU: 'sum by (namespace, pod, container) (rate(x[WINDOW]))'\n",
                "resourceQueries.containerCPU",
                "SCOPE",
            ),
            (
                "resourceQueries:\n  containerMemory: 'sum by (namespace, pod) (x{SCOPE})'\n",
                "resourceQueries.containerMemory",
                "container",
            ),
            ("resourceQueries:\n  nodeCPU: 'sum(rate(x[WINDOW]))'\n", "resourceQueries.nodeCPU", "node"),
            ("resourceQueries:\n  nodeMemory: 'sum by (node) (x{'\n", "resourceQueries.nodeMemory", "PromQL"),
            ("resourceQueries:\n  window: 500ms\n", "resourceQueries.window", "at least 1s"),
        ];
        for (yaml, field, words) in cases {
            let error = QueryFile::from_yaml(yaml, "config.yaml", &check()).unwrap_err().to_string();
            assert!(error.contains(&format!("field {field}:")) && error.contains(words), "{yaml}: {error}");
        }
        let error =
            QueryFile::from_yaml("resourceQueries:\n  podCPU: x\n", "c", &check()).unwrap_err().to_string();
        assert!(error.contains("unknown field `podCPU`") && error.contains("containerCPU"), "{error}");
        let file = QueryFile::from_yaml("", "c", &check()).unwrap();
        assert_eq!(
            file.resource_queries.container_cpu.as_ref().map(Template::text),
            Some(DEFAULT_CONTAINER_CPU)
        );
        assert_eq!(file.resource_queries.node_memory.as_ref().map(Template::text), Some(DEFAULT_NODE_MEMORY));
        assert_eq!(file.resource_queries.window, Some(DEFAULT_RESOURCE_WINDOW));
    }
}
