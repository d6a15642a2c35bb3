//! The pod and node inventory: a watch of the cluster's pods and nodes (kube-rs watchers with
//! backoff) folded into a compact local store that keeps only what the served kinds need
//! ([`PodInfo`], [`NodeInfo`]), never whole objects. Only running pods are kept.
//!
//! Reads are local and never block on the Kubernetes API; readiness waits for the first full
//! list of both resources.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Node, Pod};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client};

use crate::sources::{Inventory, NodeInfo, PodInfo};

type PodMap = BTreeMap<(String, String), Arc<PodInfo>>;
type NodeMap = HashMap<String, Arc<NodeInfo>>;

/// The watch-backed inventory.
#[derive(Default)]
pub struct KubeInventory {
    pods: RwLock<PodMap>,
    nodes: RwLock<NodeMap>,
    pod_buffer: Mutex<Option<PodMap>>,
    node_buffer: Mutex<Option<NodeMap>>,
    pods_synced: AtomicBool,
    nodes_synced: AtomicBool,
    version: AtomicU64,
}

impl std::fmt::Debug for KubeInventory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeInventory").field("version", &self.version).finish_non_exhaustive()
    }
}

impl KubeInventory {
    /// Starts watching pods and nodes with `client`; the returned inventory fills in the
    /// background (see [`Inventory::is_synced`]).
    pub fn start(client: Client) -> Arc<Self> {
        let inventory = Arc::new(Self::default());
        // Asking the API server for running pods only keeps the stream small; phases are
        // re-checked locally in case a server ignores the field selector.
        let pods = watcher::watcher(
            Api::<Pod>::all(client.clone()),
            watcher::Config::default().fields("status.phase=Running"),
        );
        let nodes = watcher::watcher(Api::<Node>::all(client), watcher::Config::default());
        tokio::spawn(Self::drive(inventory.clone(), pods, Self::apply_pods));
        tokio::spawn(Self::drive(inventory.clone(), nodes, Self::apply_nodes));
        inventory
    }

    async fn drive<K, S>(self: Arc<Self>, stream: S, apply: fn(&Self, Event<K>))
    where
        S: Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static,
    {
        let mut stream = std::pin::pin!(stream.default_backoff());
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
    pub fn apply_pods(&self, event: Event<Pod>) {
        match event {
            Event::Init => {
                if let Ok(mut b) = self.pod_buffer.lock() {
                    *b = Some(PodMap::new());
                }
            }
            Event::InitApply(pod) => {
                if let Some(info) = pod_info(&pod)
                    && let Ok(mut b) = self.pod_buffer.lock()
                    && let Some(buf) = b.as_mut()
                {
                    buf.insert((info.namespace.clone(), info.name.clone()), Arc::new(info));
                }
            }
            Event::InitDone => {
                let fresh = self.pod_buffer.lock().ok().and_then(|mut b| b.take()).unwrap_or_default();
                if let Ok(mut pods) = self.pods.write() {
                    *pods = fresh;
                }
                self.pods_synced.store(true, Ordering::Release);
                self.bump();
            }
            Event::Apply(pod) => {
                let key = pod_key(&pod);
                if let Ok(mut pods) = self.pods.write() {
                    match pod_info(&pod) {
                        Some(info) => pods.insert(key, Arc::new(info)),
                        None => pods.remove(&key),
                    };
                }
                self.bump();
            }
            Event::Delete(pod) => {
                if let Ok(mut pods) = self.pods.write() {
                    pods.remove(&pod_key(&pod));
                }
                self.bump();
            }
        }
    }

    /// Folds one node watch event into the store.
    pub fn apply_nodes(&self, event: Event<Node>) {
        match event {
            Event::Init => {
                if let Ok(mut b) = self.node_buffer.lock() {
                    *b = Some(NodeMap::new());
                }
            }
            Event::InitApply(node) => {
                let info = node_info(&node);
                if let Ok(mut b) = self.node_buffer.lock()
                    && let Some(buf) = b.as_mut()
                {
                    buf.insert(info.name.clone(), Arc::new(info));
                }
            }
            Event::InitDone => {
                let fresh = self.node_buffer.lock().ok().and_then(|mut b| b.take()).unwrap_or_default();
                if let Ok(mut nodes) = self.nodes.write() {
                    *nodes = fresh;
                }
                self.nodes_synced.store(true, Ordering::Release);
                self.bump();
            }
            Event::Apply(node) => {
                let info = node_info(&node);
                if let Ok(mut nodes) = self.nodes.write() {
                    nodes.insert(info.name.clone(), Arc::new(info));
                }
                self.bump();
            }
            Event::Delete(node) => {
                if let Ok(mut nodes) = self.nodes.write() {
                    nodes.remove(node.metadata.name.as_deref().unwrap_or_default());
                }
                self.bump();
            }
        }
    }
}

impl Inventory for KubeInventory {
    fn running_pods(&self, namespace: Option<&str>) -> Vec<Arc<PodInfo>> {
        let Ok(pods) = self.pods.read() else { return Vec::new() };
        match namespace {
            None => pods.values().cloned().collect(),
            Some(ns) => pods
                .range((ns.to_string(), String::new())..)
                .take_while(|((pod_ns, _), _)| pod_ns == ns)
                .map(|(_, pod)| pod.clone())
                .collect(),
        }
    }

    fn node(&self, name: &str) -> Option<Arc<NodeInfo>> {
        self.nodes.read().ok()?.get(name).cloned()
    }

    fn is_synced(&self) -> bool {
        self.pods_synced.load(Ordering::Acquire) && self.nodes_synced.load(Ordering::Acquire)
    }

    fn resource_version(&self) -> String {
        self.version.load(Ordering::Relaxed).to_string()
    }
}

fn pod_key(pod: &Pod) -> (String, String) {
    (pod.metadata.namespace.clone().unwrap_or_default(), pod.metadata.name.clone().unwrap_or_default())
}

/// The served view of a pod, or `None` when it is not running.
fn pod_info(pod: &Pod) -> Option<PodInfo> {
    let running = pod.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running");
    if !running {
        return None;
    }
    let (namespace, name) = pod_key(pod);
    Some(PodInfo {
        namespace,
        name,
        uid: pod.metadata.uid.clone().unwrap_or_default(),
        labels: pod.metadata.labels.clone().unwrap_or_default(),
        creation_timestamp: pod.metadata.creation_timestamp.as_ref().map(|t| t.0),
        node_name: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        containers: pod
            .spec
            .as_ref()
            .map(|s| s.containers.iter().map(|c| c.name.clone()).collect())
            .unwrap_or_default(),
    })
}

fn node_info(node: &Node) -> NodeInfo {
    let status = node.status.as_ref();
    NodeInfo {
        name: node.metadata.name.clone().unwrap_or_default(),
        addresses: status
            .and_then(|s| s.addresses.as_ref())
            .map(|a| a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect())
            .unwrap_or_default(),
        kubelet_port: status
            .and_then(|s| s.daemon_endpoints.as_ref())
            .and_then(|d| d.kubelet_endpoint.as_ref())
            .and_then(|e| u16::try_from(e.port).ok()),
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
        let names = |ns| inv.running_pods(ns).iter().map(|p| p.name.clone()).collect::<Vec<_>>();
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
}
