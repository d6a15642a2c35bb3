//! The pod and node inventory: a watch of the cluster's pods and nodes (kube-rs watchers with
//! backoff) folded into a compact local store that keeps only what the served kinds need
//! ([`PodInfo`], [`NodeInfo`]), never whole objects. Only running pods are kept.
//!
//! Reads are local and never block on the Kubernetes API; readiness waits for the first full
//! list of both resources. While the API cannot be reached the last known state is served;
//! the watches are retried at most [`MAX_REWATCH_DELAY`] apart (jitter included), so the
//! inventory catches up that soon after the API is back; a watch whose connection went silent
//! is given up [`WATCH_TIMEOUT_SECONDS`] + 5 s after its last event at most.
//!
//! Memory: values most pods share with others (their namespace, node, label set and container
//! names; pods of one ReplicaSet have identical labels) are interned, and the served objects
//! computed from a pod share its strings and labels instead of copying them.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use crate::sources::{Inventory, Labels, NodeInfo, PodInfo};
use apiserver::intern::Interner;
use apiserver::mirror::Mirror;

/// The longest wait between two attempts to watch again after a failure, jitter included.
pub(crate) const MAX_REWATCH_DELAY: std::time::Duration = std::time::Duration::from_secs(4);

/// The server-side timeout of each watch request, in seconds (`timeoutSeconds`). kube-rs
/// gives a watch up as dead when nothing (event or bookmark) arrives for this long plus 5 s,
/// and watches again. Its default, 290 s, left the inventory stale for five minutes when a
/// watch's connection went silent (packets dropped, the server's reset lost: a network
/// partition, a kube-apiserver replaced behind a load balancer that drops its flows): a watch
/// that ends normally after a minute costs one request per minute per resource, resumed from
/// its resource version.
pub(crate) const WATCH_TIMEOUT_SECONDS: u32 = 60;

/// The delays between attempts to list and watch again after a failure: a step of 0.8 s
/// doubling up to half [`MAX_REWATCH_DELAY`], each wait the step plus a random part of up to
/// the step itself (backon's jitter), so 0.8–1.6 s, 1.6–3.2 s, then 2–4 s; back to the first
/// step after any event. client-go's reflectors (and kube-rs' default) go up to 30 s, which after an outage
/// of kube-apiserver of half a minute leaves the inventory up to 30 s behind once it is back;
/// percolator's two watches per replica can retry more often than that (issue 33).
fn rewatch_backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(800))
        .with_max_delay(MAX_REWATCH_DELAY / 2)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}

/// A pod's key: namespace, name.
type PodKey = (Arc<str>, Arc<str>);

/// The watch-backed inventory.
#[derive(Default)]
pub(crate) struct KubeInventory {
    pods: Mirror<PodKey, PodInfo>,
    nodes: Mirror<String, NodeInfo>,
    version: AtomicU64,
    strings: Interner<str>,
    label_sets: Interner<Labels>,
    container_lists: Interner<[String]>,
    /// Reports the tasks of the runtime the watches run on ([`KubeInventory::start`]) to
    /// `/metrics` while the inventory lives.
    _tasks_probe: std::sync::OnceLock<Arc<apiserver::Probe>>,
}

impl std::fmt::Debug for KubeInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeInventory").field("version", &self.version).finish_non_exhaustive()
    }
}

impl KubeInventory {
    /// Starts watching pods and nodes with `client`; the returned inventory fills in the
    /// background (see [`Inventory::is_synced`]).
    ///
    /// The watches run on a thread of their own (a single-threaded runtime, named
    /// `inventory`), not on the server's workers: what the inventory keeps lives as long as its
    /// pod (hours) and is allocated there, in that thread's allocator heap, instead of among the
    /// short-lived allocations of the requests and refreshes, whose pages it would hold
    /// resident after they are freed (RELIABILITY.md, "Soak"). The thread ends when the runtime
    /// that called `start` shuts down. Its tasks count in `tokio_tasks_alive` (`metrics`).
    pub(crate) fn start(client: Client, metrics: Option<&apiserver::Metrics>) -> std::io::Result<Arc<Self>> {
        let inventory = Arc::new(Self::default());
        // Asking the API server for running pods only keeps the stream small; phases are
        // re-checked locally in case a server ignores the field selector.
        let pods = watcher::watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields("status.phase=Running").timeout(WATCH_TIMEOUT_SECONDS),
        );
        let nodes = watcher::watcher(
            Api::<Node>::all(client),
            watcher::Config::default().timeout(WATCH_TIMEOUT_SECONDS),
        );
        let watches = futures::future::join(
            Self::drive(inventory.clone(), pods, Self::apply_pods),
            Self::drive(inventory.clone(), nodes, Self::apply_nodes),
        );
        let runtime = run_apart("inventory", async move {
            watches.await;
        })?;
        if let Some(metrics) = metrics {
            let probe: Arc<apiserver::Probe> = Arc::new(move || runtime.metrics().num_alive_tasks() as u64);
            metrics.sampled.runtime_tasks(&probe);
            let _ = inventory._tasks_probe.set(probe);
        }
        Ok(inventory)
    }

    async fn drive<K, S>(self: Arc<Self>, stream: S, apply: fn(&Self, Event<K>))
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        let mut stream = std::pin::pin!(stream.backoff(rewatch_backoff()));
        while let Some(event) = stream.next().await {
            match event {
                Ok(event) => apply(&self, event),
                Err(error) => tracing::warn!(%error, "inventory watch failed; retrying with backoff"),
            }
        }
    }

    fn bump(&self) {
        self.version.fetch_add(1, Ordering::Relaxed);
    }

    /// Folds one pod watch event into the store.
    pub(crate) fn apply_pods(&self, event: Event<Pod>) {
        let view =
            |pod: &Pod| self.pod_info(pod).map(|info| ((info.namespace.clone(), info.name.clone()), info));
        if self.pods.apply(event, pod_key, view) {
            self.bump();
        }
    }

    /// Folds one node watch event into the store.
    pub(crate) fn apply_nodes(&self, event: Event<Node>) {
        let key = |node: &Node| node.metadata.name.clone().unwrap_or_default();
        let view = |node: &Node| Some((key(node), node_info(node)));
        if self.nodes.apply(event, key, view) {
            self.bump();
        }
    }
}

impl Inventory for KubeInventory {
    fn running_pods(&self, namespace: Option<&str>) -> Vec<Arc<PodInfo>> {
        let Some(pods) = self.pods.read() else { return Vec::new() };
        match namespace {
            None => pods.values().cloned().collect(),
            Some(ns) => pods
                .range((Arc::from(ns), Arc::from(""))..)
                .take_while(|((pod_ns, _), _)| &**pod_ns == ns)
                .map(|(_, pod)| pod.clone())
                .collect(),
        }
    }

    fn node(&self, name: &str) -> Option<Arc<NodeInfo>> {
        self.nodes.read()?.get(name).cloned()
    }

    fn nodes(&self) -> Vec<Arc<NodeInfo>> {
        self.nodes.read().map(|nodes| nodes.values().cloned().collect()).unwrap_or_default()
    }

    fn is_synced(&self) -> bool {
        self.pods.is_synced() && self.nodes.is_synced()
    }

    fn resource_version(&self) -> String {
        self.version.load(Ordering::Relaxed).to_string()
    }
}

/// Runs `work` on a new thread named `name`, on a single-threaded runtime of its own, until it
/// ends or the runtime `run_apart` is called on shuts down; returns that runtime's handle.
fn run_apart(
    name: &str,
    work: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<tokio::runtime::Handle> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let handle = runtime.handle().clone();
    let (keep, stopped) = tokio::sync::oneshot::channel::<()>();
    let apart = std::thread::Builder::new().name(name.to_owned()).spawn(move || {
        runtime.block_on(async move {
            tokio::select! {
                () = work => {}
                _ = stopped => {}
            }
        });
    })?;
    // Dropped, with `keep`, when the calling runtime shuts down, which stops the thread.
    tokio::spawn(async move {
        let _keep = keep;
        std::future::pending::<()>().await;
    });
    tracing::debug!(thread = ?apart.thread().id(), name, "started a thread of its own");
    Ok(handle)
}

fn pod_key(pod: &Pod) -> PodKey {
    let field = |v: &Option<String>| Arc::from(v.as_deref().unwrap_or_default());
    (field(&pod.metadata.namespace), field(&pod.metadata.name))
}

impl KubeInventory {
    /// The served view of a pod, or `None` when it is not running.
    fn pod_info(&self, pod: &Pod) -> Option<PodInfo> {
        let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
        if !running {
            return None;
        }
        let meta = &pod.metadata;
        let spec = pod.spec.as_ref();
        let containers: Vec<String> =
            spec.map(|s| s.containers.iter().map(|c| c.name.clone()).collect()).unwrap_or_default();
        Some(PodInfo {
            namespace: self.strings.intern(meta.namespace.as_deref().unwrap_or_default()),
            name: Arc::from(meta.name.as_deref().unwrap_or_default()),
            uid: Arc::from(meta.uid.as_deref().unwrap_or_default()),
            labels: self.label_sets.intern(meta.labels.as_ref().unwrap_or(&Labels::new())),
            creation_timestamp: meta.creation_timestamp.as_ref().map(|t| t.0),
            node_name: spec.and_then(|s| s.node_name.as_deref()).map(|n| self.strings.intern(n)),
            containers: self.container_lists.intern(&containers),
        })
    }
}

fn node_info(node: &Node) -> NodeInfo {
    let status = node.status.as_ref();
    NodeInfo {
        name: node.metadata.name.as_deref().unwrap_or_default().into(),
        addresses: status
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect())
            .unwrap_or_default(),
        kubelet_port: status
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .and_then(|e| u16::try_from(e.port).ok()),
        labels: Arc::new(node.metadata.labels.clone().unwrap_or_default()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PodSpec, PodStatus};
    use kube::api::ObjectMeta;

    fn mk_pod(ns: &str, name: &str, phase: &str) -> Pod {
        Pod {
            metadata: ObjectMeta {
                namespace: Some(ns.into()),
                name: Some(name.into()),
                labels: Some([("app".to_string(), "web".to_string())].into()),
                ..Default::default()
            },
            spec: Some(PodSpec { node_name: Some("node-0".into()), ..Default::default() }),
            status: Some(PodStatus { phase: Some(phase.into()), ..Default::default() }),
        }
    }

    #[test]
    fn keeps_only_running_pods_and_follows_events() {
        let inv = KubeInventory::default();
        inv.apply_pods(Event::Init);
        inv.apply_pods(Event::InitApply(mk_pod("shop", "a", "Running")));
        inv.apply_pods(Event::InitApply(mk_pod("shop", "b", "Pending")));
        inv.apply_pods(Event::InitApply(mk_pod("api", "c", "Running")));
        assert!(inv.running_pods(None).is_empty(), "nothing visible before InitDone");
        inv.apply_pods(Event::InitDone);
        let names = |ns| inv.running_pods(ns).iter().map(|p| p.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(None), ["c", "a"]);
        assert_eq!(names(Some("shop")), ["a"]);
        inv.apply_pods(Event::Apply(mk_pod("shop", "b", "Running")));
        assert_eq!(names(Some("shop")), ["a", "b"]);
        inv.apply_pods(Event::Apply(mk_pod("shop", "a", "Succeeded")));
        assert_eq!(names(Some("shop")), ["b"]);
        inv.apply_pods(Event::Delete(mk_pod("shop", "b", "Running")));
        assert!(names(Some("shop")).is_empty());
        assert!(names(Some("sho")).is_empty());
    }

    #[test]
    fn nodes_follow_events_and_readiness_waits_for_both_lists() {
        let inv = KubeInventory::default();
        let node = |name: &str| Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            ..Default::default()
        };
        inv.apply_pods(Event::Init);
        inv.apply_pods(Event::InitDone);
        inv.apply_nodes(Event::Init);
        inv.apply_nodes(Event::InitApply(node("n1")));
        assert!(!inv.is_synced(), "the node list is not complete");
        assert!(inv.node("n1").is_none(), "nothing visible before InitDone");
        let before = inv.resource_version();
        inv.apply_nodes(Event::InitDone);
        assert!(inv.is_synced());
        assert_ne!(inv.resource_version(), before);
        assert_eq!(inv.node("n1").unwrap().name, "n1".into());
        inv.apply_nodes(Event::Apply(node("n2")));
        inv.apply_nodes(Event::Delete(node("n1")));
        assert!(inv.node("n1").is_none());
        assert_eq!(inv.node("n2").unwrap().name, "n2".into());
        // A re-list replaces the whole set.
        inv.apply_nodes(Event::Init);
        inv.apply_nodes(Event::InitApply(node("n3")));
        inv.apply_nodes(Event::InitDone);
        assert!(inv.node("n2").is_none());
        assert!(inv.node("n3").is_some());
    }

    #[test]
    fn pods_share_namespaces_nodes_label_sets_and_container_lists() {
        let inv = KubeInventory::default();
        inv.apply_pods(Event::Init);
        for name in ["a", "b", "c"] {
            inv.apply_pods(Event::InitApply(mk_pod("shop", name, "Running")));
        }
        inv.apply_pods(Event::InitDone);
        let pods = inv.running_pods(Some("shop"));
        assert_eq!(pods.len(), 3);
        for pod in &pods[1..] {
            assert!(Arc::ptr_eq(&pod.namespace, &pods[0].namespace));
            assert!(Arc::ptr_eq(&pod.labels, &pods[0].labels));
            assert!(Arc::ptr_eq(pod.node_name.as_ref().unwrap(), pods[0].node_name.as_ref().unwrap()));
            assert!(Arc::ptr_eq(&pod.containers, &pods[0].containers));
        }
        assert_eq!(*pods[0].labels, Labels::from([("app".to_owned(), "web".to_owned())]));
    }

    #[test]
    fn an_event_that_changes_nothing_kept_keeps_the_entry() {
        let inv = KubeInventory::default();
        inv.apply_pods(Event::Init);
        inv.apply_pods(Event::InitApply(mk_pod("shop", "a", "Running")));
        inv.apply_pods(Event::InitDone);
        let first = inv.running_pods(None).remove(0);
        let version = inv.resource_version();
        // A status update: nothing the inventory keeps changed, so neither does the entry.
        let mut updated = mk_pod("shop", "a", "Running");
        updated.status.as_mut().unwrap().pod_ip = Some("10.0.0.7".into());
        inv.apply_pods(Event::Apply(updated));
        assert!(Arc::ptr_eq(&inv.running_pods(None)[0], &first), "the same entry, not a copy");
        assert_eq!(inv.resource_version(), version, "readers see no change");
        // Listed again after a watch expired: the same entry too.
        inv.apply_pods(Event::Init);
        inv.apply_pods(Event::InitApply(mk_pod("shop", "a", "Running")));
        inv.apply_pods(Event::InitDone);
        assert!(Arc::ptr_eq(&inv.running_pods(None)[0], &first), "a re-list keeps it");
        // A change of what is kept replaces it.
        let mut relabelled = mk_pod("shop", "a", "Running");
        relabelled.metadata.labels = Some([("app".to_string(), "api".to_string())].into());
        inv.apply_pods(Event::Apply(relabelled));
        let now = inv.running_pods(None).remove(0);
        assert!(!Arc::ptr_eq(&now, &first));
        assert_eq!(now.labels.get("app").map(String::as_str), Some("api"));
        assert_ne!(inv.resource_version(), version);
    }
}
