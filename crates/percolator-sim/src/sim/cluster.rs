//! The simulated cluster's mutable state: pods, nodes, config maps and the workload objects
//! derived from the pods ([`controllers`]) with resourceVersions, the bounded watch-event
//! history and its broadcast, churn, and the call counters behind `/sim/stats`.
//!
//! One `RwLock` guards the state; it is never held across an `.await`. Writers append to the
//! history and broadcast while holding it, and a watcher subscribes while holding it, so a
//! watch neither misses nor duplicates an event between its replay and its live part.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::ops::Bound;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use tokio::sync::broadcast;

use super::cafe::Cafe;
use super::controllers::{self, Controller, Resource};
use super::faults::Faults;
use super::rng::SplitMix64;
use super::workload::{self, SimNode, SimPod, Workload};

/// Events kept for watches resuming from an older resourceVersion (kube-apiserver's watch
/// cache keeps a comparable window); older ones get a 410 Expired.
pub(crate) const HISTORY_LIMIT: usize = 10_000;

/// Capacity of the live-event broadcast; a watcher lagging this far behind gets a 410.
const BROADCAST_CAPACITY: usize = 16_384;

const DOMAIN_CHURN_PICK: u64 = 10;
const DOMAIN_CONFIG_MAP_UID: u64 = 11;

/// The current time as unix seconds.
pub(crate) fn now() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

/// The type of a watch event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum EventType {
    /// An object was created.
    Added,
    /// An object was replaced (the object is its new state).
    Modified,
    /// An object was deleted (the object is its last state).
    Deleted,
}

/// The object of a watch event.
#[derive(Debug, Clone)]
pub(crate) enum Object {
    /// A pod.
    Pod(Arc<SimPod>),
    /// A config map (its `metadata.resourceVersion` is set).
    ConfigMap(Arc<ConfigMap>),
    /// A workload object (its `metadata.resourceVersion` is set).
    Controller(Arc<Controller>),
}

/// A change of one object, at resourceVersion `rv`.
#[derive(Debug)]
pub(crate) struct Event {
    pub(crate) rv: u64,
    pub(crate) kind: EventType,
    pub(crate) object: Object,
}

/// Key of a namespaced object in the ordered stores: `(namespace, name)`, kube-apiserver's
/// key order.
pub(crate) type PodKey = (String, String);

/// What a watch is about: decides what its snapshot (watch without resourceVersion) holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watched {
    /// Pods: the snapshot is every pod.
    Pods,
    /// Config maps: the snapshot is every config map.
    ConfigMaps,
    /// Workload objects of one resource: the snapshot is every one of them.
    Controllers(Resource),
    /// Anything else (nodes never change): an empty snapshot.
    Other,
}

struct Inner {
    rv: u64,
    pods: BTreeMap<PodKey, Arc<SimPod>>,
    by_node: Vec<Vec<Arc<SimPod>>>,
    config_maps: BTreeMap<PodKey, Arc<ConfigMap>>,
    /// Derived from `pods` (after every change of them).
    controllers: BTreeMap<controllers::Key, Arc<Controller>>,
    history: VecDeque<Arc<Event>>,
    /// Watches from a resourceVersion `>= floor` can be served from `history`.
    floor: u64,
    churns: u64,
    ip_slots: Vec<u32>,
}

/// How many SubjectAccessReview specs `/sim/stats` keeps (the most recent ones).
pub(crate) const KEPT_ACCESS_REVIEWS: usize = 64;

/// Call counters for `/sim/stats`, and the last SubjectAccessReview specs received.
pub(crate) struct Stats {
    pub(crate) kubelet_fetches: Vec<AtomicU64>,
    pub(crate) api_requests: Mutex<BTreeMap<String, u64>>,
    /// The `spec` of the last [`KEPT_ACCESS_REVIEWS`] SubjectAccessReviews, as posted (the
    /// JSON received, not re-encoded), oldest first.
    pub(crate) access_reviews: Mutex<std::collections::VecDeque<serde_json::Value>>,
}

impl Stats {
    /// Counts one API request of `what` (e.g. `list pods`).
    pub(crate) fn api(&self, what: &str) {
        if let Ok(mut map) = self.api_requests.lock() {
            *map.entry(what.to_owned()).or_default() += 1;
        }
    }

    /// Keeps the `spec` of a SubjectAccessReview, dropping the oldest beyond
    /// [`KEPT_ACCESS_REVIEWS`].
    pub(crate) fn access_review(&self, spec: serde_json::Value) {
        if let Ok(mut kept) = self.access_reviews.lock() {
            if kept.len() == KEPT_ACCESS_REVIEWS {
                kept.pop_front();
            }
            kept.push_back(spec);
        }
    }
}

/// What a watch starts with.
pub(crate) enum WatchStart {
    /// Events after the requested resourceVersion, from the history.
    Replay(Vec<Arc<Event>>),
    /// No resourceVersion (or `0`): every current object of the watched kind, as ADDED.
    Snapshot(Vec<Object>),
}

/// A subscription to object events.
pub(crate) struct Subscription {
    pub(crate) start: WatchStart,
    pub(crate) rv: u64,
    pub(crate) live: broadcast::Receiver<Arc<Event>>,
}

/// The requested resourceVersion is older than the history.
#[derive(Debug)]
pub(crate) struct Expired {
    pub(crate) requested: u64,
    pub(crate) oldest: u64,
}

/// The simulated cluster.
pub(crate) struct Cluster {
    pub(crate) seed: u64,
    /// Counters' origin, unix seconds (one hour before start).
    pub(crate) origin: f64,
    pub(crate) housekeeping_ms: u64,
    pub(crate) token: String,
    pub(crate) kubelet_port: u16,
    pub(crate) nodes: Vec<Arc<SimNode>>,
    /// Node indices in name order (`node-0, node-1, node-10, …`, as the apiserver lists).
    pub(crate) nodes_by_name: Vec<u32>,
    node_index: HashMap<String, u32>,
    /// The cafes (fixed: churn never replaces their serving pods).
    pub(crate) cafes: Vec<Arc<Cafe>>,
    inner: RwLock<Inner>,
    events: broadcast::Sender<Arc<Event>>,
    pub(crate) stats: Stats,
    /// Injected faults (`/sim/faults`).
    pub(crate) faults: Faults,
}

impl Cluster {
    /// Builds the cluster from a generated workload; every object gets a resourceVersion.
    pub(crate) fn new(
        workload: Workload,
        seed: u64,
        origin: f64,
        housekeeping_ms: u64,
        kubelet_port: u16,
    ) -> Self {
        // Start at a plausible etcd revision rather than 1.
        let mut rv = 100_000u64;
        let nodes: Vec<Arc<SimNode>> = workload
            .nodes
            .into_iter()
            .map(|mut n| {
                rv += 1;
                n.resource_version = rv;
                Arc::new(n)
            })
            .collect();
        let mut nodes_by_name: Vec<u32> = (0..nodes.len() as u32).collect();
        nodes_by_name.sort_by(|a, b| nodes[*a as usize].name.cmp(&nodes[*b as usize].name));
        let node_index = nodes.iter().map(|n| (n.name.clone(), n.index)).collect();
        let mut by_node = vec![Vec::new(); nodes.len()];
        let mut ip_slots = vec![0u32; nodes.len()];
        let mut pods = BTreeMap::new();
        for mut p in workload.pods {
            rv += 1;
            p.resource_version = rv;
            let p = Arc::new(p);
            if let Some(list) = by_node.get_mut(p.node as usize) {
                list.push(Arc::clone(&p));
            }
            if let Some(slot) = ip_slots.get_mut(p.node as usize) {
                *slot += 1;
            }
            pods.insert((p.namespace.clone(), p.name.clone()), p);
        }
        // The workload objects, each with its own resourceVersion after the pods'.
        let mut workload_objects = BTreeMap::new();
        let derived = controllers::derive(pods.values().map(|p| p.as_ref()), seed);
        controllers::reconcile(&mut workload_objects, derived, 0, || {
            rv += 1;
            rv
        });
        let kubelet_fetches = nodes.iter().map(|_| AtomicU64::new(0)).collect();
        let (events, _) = broadcast::channel(BROADCAST_CAPACITY);
        let faults = Faults::new(nodes.len());
        Self {
            seed,
            origin,
            housekeeping_ms: housekeeping_ms.max(1),
            token: workload.token,
            kubelet_port,
            nodes,
            nodes_by_name,
            node_index,
            cafes: workload.cafes,
            inner: RwLock::new(Inner {
                rv,
                pods,
                by_node,
                config_maps: BTreeMap::new(),
                controllers: workload_objects,
                history: VecDeque::new(),
                floor: rv,
                churns: 0,
                ip_slots,
            }),
            events,
            stats: Stats {
                kubelet_fetches,
                api_requests: Mutex::new(BTreeMap::new()),
                access_reviews: Mutex::default(),
            },
            faults,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        // A poisoned lock only means a panic elsewhere; the data is still consistent
        // because every writer finishes its update before anything can panic.
        self.inner.read().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Inner> {
        self.inner.write().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The node named `name`.
    pub(crate) fn node_by_name(&self, name: &str) -> Option<&Arc<SimNode>> {
        self.node_index.get(name).and_then(|i| self.nodes.get(*i as usize))
    }

    /// The node a pod runs on.
    pub(crate) fn node_of(&self, pod: &SimPod) -> Option<&SimNode> {
        self.nodes.get(pod.node as usize).map(|n| n.as_ref())
    }

    /// The current (latest) resourceVersion.
    pub(crate) fn resource_version(&self) -> u64 {
        self.read().rv
    }

    /// The oldest resourceVersion a watch or continue token may still start from.
    pub(crate) fn floor(&self) -> u64 {
        self.read().floor
    }

    /// Pod `namespace/name`.
    pub(crate) fn pod(&self, namespace: &str, name: &str) -> Option<Arc<SimPod>> {
        self.read().pods.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// Up to `limit` pods (in key order, optionally in one namespace, strictly after key
    /// `after`) accepted by `keep`; also the current resourceVersion and whether keys remain.
    pub(crate) fn list_pods(
        &self,
        namespace: Option<&str>,
        after: Option<&PodKey>,
        limit: usize,
        keep: impl Fn(&SimPod) -> bool,
    ) -> (Vec<Arc<SimPod>>, u64, bool) {
        let inner = self.read();
        let lower = match (after, namespace) {
            (Some(key), _) => Bound::Excluded(key.clone()),
            (None, Some(ns)) => Bound::Included((ns.to_owned(), String::new())),
            (None, None) => Bound::Unbounded,
        };
        let mut iter = inner
            .pods
            .range((lower, Bound::Unbounded))
            .take_while(|((ns, _), _)| namespace.is_none_or(|want| want == ns))
            .map(|(_, p)| p);
        let mut out = Vec::new();
        let mut more = false;
        for pod in iter.by_ref() {
            if keep(pod) {
                out.push(Arc::clone(pod));
                if out.len() >= limit {
                    more = iter.next().is_some();
                    break;
                }
            }
        }
        (out, inner.rv, more)
    }

    /// Every pod, in key order.
    pub(crate) fn all_pods(&self) -> Vec<Arc<SimPod>> {
        self.read().pods.values().cloned().collect()
    }

    /// The pods scheduled on node `index`.
    pub(crate) fn pods_on(&self, index: u32) -> Vec<Arc<SimPod>> {
        self.read().by_node.get(index as usize).cloned().unwrap_or_default()
    }

    /// Subscribes to events after resourceVersion `from` (`None`: a snapshot of the
    /// `watched` kind's current objects).
    pub(crate) fn subscribe(&self, from: Option<u64>, watched: Watched) -> Result<Subscription, Expired> {
        let inner = self.read();
        let live = self.events.subscribe();
        let start = match from {
            None => WatchStart::Snapshot(match watched {
                Watched::Pods => inner.pods.values().cloned().map(Object::Pod).collect(),
                Watched::ConfigMaps => inner.config_maps.values().cloned().map(Object::ConfigMap).collect(),
                Watched::Controllers(resource) => inner
                    .controllers
                    .values()
                    .filter(|c| c.resource == resource)
                    .cloned()
                    .map(Object::Controller)
                    .collect(),
                Watched::Other => Vec::new(),
            }),
            Some(rv) if rv < inner.floor => {
                return Err(Expired { requested: rv, oldest: inner.floor });
            }
            Some(rv) => WatchStart::Replay(inner.history.iter().filter(|e| e.rv > rv).cloned().collect()),
        };
        Ok(Subscription { start, rv: inner.rv, live })
    }

    fn push_event(&self, inner: &mut Inner, kind: EventType, rv: u64, object: Object) {
        let event = Arc::new(Event { rv, kind, object });
        inner.history.push_back(Arc::clone(&event));
        while inner.history.len() > HISTORY_LIMIT {
            if let Some(old) = inner.history.pop_front() {
                inner.floor = old.rv;
            }
        }
        // No receivers is fine.
        let _ = self.events.send(event);
    }

    /// Deletes one running pod and creates its replacement at time `now` (unix seconds);
    /// both changes are watch events. `None` when no pod is running. Cafes' serving pods are
    /// left alone, so every cafe keeps its pods and its metrics.
    pub(crate) fn churn(&self, now: f64) -> Option<(Arc<SimPod>, Arc<SimPod>)> {
        let now_s = now.floor() as i64;
        let mut guard = self.write();
        let inner = &mut *guard;
        let n = inner.churns;
        let running: Vec<&PodKey> =
            inner.pods.iter().filter(|(_, p)| p.is_running() && p.cafe.is_none()).map(|(k, _)| k).collect();
        if running.is_empty() {
            return None;
        }
        let mut rng = SplitMix64::stream(self.seed, DOMAIN_CHURN_PICK, n);
        let pick = rng.range(0, running.len() as u64 - 1) as usize;
        let key = running.get(pick).map(|k| (*k).clone())?;
        let old = inner.pods.remove(&key)?;
        inner.churns += 1;

        inner.rv += 1;
        let mut gone = (*old).clone();
        gone.resource_version = inner.rv;
        gone.deleted = Some(now_s);
        let gone = Arc::new(gone);
        if let Some(list) = inner.by_node.get_mut(old.node as usize) {
            list.retain(|p| p.uid != old.uid);
        }
        self.push_event(inner, EventType::Deleted, gone.resource_version, Object::Pod(Arc::clone(&gone)));

        let slot = inner.ip_slots.get(old.node as usize).copied().unwrap_or(0);
        if let Some(s) = inner.ip_slots.get_mut(old.node as usize) {
            *s += 1;
        }
        let pods = &inner.pods;
        let mut fresh = workload::replacement(
            self.seed,
            n,
            &old,
            slot,
            |name| pods.contains_key(&(old.namespace.clone(), name.to_owned())),
            now_s,
        );
        inner.rv += 1;
        fresh.resource_version = inner.rv;
        let fresh = Arc::new(fresh);
        inner.pods.insert((fresh.namespace.clone(), fresh.name.clone()), Arc::clone(&fresh));
        if let Some(list) = inner.by_node.get_mut(fresh.node as usize) {
            list.push(Arc::clone(&fresh));
        }
        self.push_event(inner, EventType::Added, fresh.resource_version, Object::Pod(Arc::clone(&fresh)));
        // A replacement like its predecessor changes no workload object: no need to scan
        // every pod again.
        if !controllers::same_footprint(&old, &fresh) {
            self.rederive(inner, now_s);
        }
        Some((gone, fresh))
    }

    /// Derives the workload objects from the pods again; the objects that changed get new
    /// resourceVersions and watch events.
    fn rederive(&self, inner: &mut Inner, now: i64) {
        let derived = controllers::derive(inner.pods.values().map(|p| p.as_ref()), self.seed);
        let rv = &mut inner.rv;
        let changes = controllers::reconcile(&mut inner.controllers, derived, now, || {
            *rv += 1;
            *rv
        });
        for (change, controller) in changes {
            let kind = match change {
                controllers::Change::Added => EventType::Added,
                controllers::Change::Modified => EventType::Modified,
                controllers::Change::Deleted => EventType::Deleted,
            };
            let rv = controller.metadata().resource_version.as_deref().and_then(|v| v.parse().ok());
            self.push_event(inner, kind, rv.unwrap_or(inner.rv), Object::Controller(controller));
        }
    }

    /// Workload object `namespace/name` of `resource`.
    pub(crate) fn controller(
        &self,
        resource: Resource,
        namespace: &str,
        name: &str,
    ) -> Option<Arc<Controller>> {
        self.read().controllers.get(&(resource, namespace.to_owned(), name.to_owned())).cloned()
    }

    /// The workload objects of `resource` (in key order, optionally in one namespace)
    /// accepted by `keep`, and the current resourceVersion.
    pub(crate) fn list_controllers(
        &self,
        resource: Resource,
        namespace: Option<&str>,
        keep: impl Fn(&Controller) -> bool,
    ) -> (Vec<Arc<Controller>>, u64) {
        let inner = self.read();
        let items = inner
            .controllers
            .values()
            .filter(|c| c.resource == resource && namespace.is_none_or(|ns| ns == c.namespace) && keep(c))
            .cloned()
            .collect();
        (items, inner.rv)
    }

    /// Every pod and every workload object (both in key order), as of one moment.
    pub(crate) fn pods_and_controllers(&self) -> (Vec<Arc<SimPod>>, Vec<Arc<Controller>>) {
        let inner = self.read();
        (inner.pods.values().cloned().collect(), inner.controllers.values().cloned().collect())
    }

    /// Config map `namespace/name`.
    pub(crate) fn config_map(&self, namespace: &str, name: &str) -> Option<Arc<ConfigMap>> {
        self.read().config_maps.get(&(namespace.to_owned(), name.to_owned())).cloned()
    }

    /// The config maps (in key order, optionally in one namespace) accepted by `keep`, and
    /// the current resourceVersion.
    pub(crate) fn list_config_maps(
        &self,
        namespace: Option<&str>,
        keep: impl Fn(&ConfigMap) -> bool,
    ) -> (Vec<Arc<ConfigMap>>, u64) {
        let inner = self.read();
        let items = inner
            .config_maps
            .iter()
            .filter(|((ns, _), cm)| namespace.is_none_or(|want| want == ns) && keep(cm))
            .map(|(_, cm)| Arc::clone(cm))
            .collect();
        (items, inner.rv)
    }

    /// Creates or replaces config map `namespace/name` with `data` at time `now` (unix
    /// seconds): a new resourceVersion and an ADDED or MODIFIED watch event. The uid and
    /// creationTimestamp survive a replacement. Returns the new resourceVersion.
    pub(crate) fn put_config_map(
        &self,
        namespace: &str,
        name: &str,
        data: BTreeMap<String, String>,
        now: f64,
    ) -> u64 {
        let mut guard = self.write();
        let inner = &mut *guard;
        let key = (namespace.to_owned(), name.to_owned());
        let previous = inner.config_maps.get(&key).map(|cm| cm.metadata.clone());
        inner.rv += 1;
        let rv = inner.rv;
        let metadata = match previous {
            Some(meta) => ObjectMeta { resource_version: Some(rv.to_string()), ..meta },
            None => {
                let index = inner.config_maps.len() as u64;
                let mut rng = SplitMix64::stream(self.seed, DOMAIN_CONFIG_MAP_UID, index);
                ObjectMeta {
                    name: Some(name.to_owned()),
                    namespace: Some(namespace.to_owned()),
                    uid: Some(workload::uuid(&mut rng)),
                    resource_version: Some(rv.to_string()),
                    creation_timestamp: Some(super::objects::time(now.floor() as i64)),
                    ..Default::default()
                }
            }
        };
        let kind = if inner.config_maps.contains_key(&key) { EventType::Modified } else { EventType::Added };
        let cm = Arc::new(ConfigMap { metadata, data: Some(data), ..Default::default() });
        inner.config_maps.insert(key, Arc::clone(&cm));
        self.push_event(inner, kind, rv, Object::ConfigMap(cm));
        rv
    }

    /// Counts a kubelet fetch of node `index`.
    pub(crate) fn count_kubelet_fetch(&self, index: u32) {
        if let Some(c) = self.stats.kubelet_fetches.get(index as usize) {
            c.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::{self, cluster_without_cafes};

    #[test]
    fn churn_leaves_cafes_alone() {
        let c = testutil::cluster(&testutil::params());
        let cafe_pods = |c: &Cluster| -> Vec<String> {
            c.all_pods().iter().filter(|p| p.cafe.is_some()).map(|p| p.uid.clone()).collect()
        };
        let before = cafe_pods(&c);
        assert!(before.len() >= 6);
        for k in 0..50 {
            let (gone, fresh) = c.churn(1_764_000_100.0 + f64::from(k)).unwrap();
            assert!(gone.cafe.is_none() && fresh.cafe.is_none());
        }
        assert_eq!(cafe_pods(&c), before);
        assert_eq!(c.cafes.len(), 6);
    }

    #[test]
    fn churn_emits_events_and_keeps_counts() {
        let c = cluster_without_cafes();
        let rv0 = c.resource_version();
        let sub = c.subscribe(Some(rv0), Watched::Pods).unwrap();
        let mut live = sub.live;
        let (gone, fresh) = c.churn(1_764_000_100.0).unwrap();
        assert!(c.pod(&gone.namespace, &gone.name).is_none());
        assert!(c.pod(&fresh.namespace, &fresh.name).is_some());
        assert_eq!(c.all_pods().len(), 12);
        assert_eq!(c.pods_on(gone.node).len(), 4);
        let e1 = live.try_recv().unwrap();
        let e2 = live.try_recv().unwrap();
        assert_eq!((e1.kind, e1.rv), (EventType::Deleted, rv0 + 1));
        assert_eq!((e2.kind, e2.rv), (EventType::Added, rv0 + 2));
        match c.subscribe(Some(rv0), Watched::Pods).unwrap().start {
            WatchStart::Replay(events) => assert_eq!(events.len(), 2),
            WatchStart::Snapshot(_) => panic!("expected a replay"),
        }
        assert!(c.subscribe(Some(rv0 - 1), Watched::Pods).is_err());
    }

    #[test]
    fn config_maps_are_added_then_modified() {
        let c = cluster_without_cafes();
        let rv0 = c.resource_version();
        let rv1 = c.put_config_map("kube-system", "x", BTreeMap::from([("a".into(), "1".into())]), 1.0e9);
        let rv2 = c.put_config_map("kube-system", "x", BTreeMap::from([("a".into(), "2".into())]), 2.0e9);
        assert_eq!((rv1, rv2), (rv0 + 1, rv0 + 2));
        let cm = c.config_map("kube-system", "x").unwrap();
        assert_eq!(cm.metadata.resource_version.as_deref(), Some(rv2.to_string().as_str()));
        assert_eq!(cm.data.as_ref().unwrap()["a"], "2");
        assert_eq!(cm.metadata.creation_timestamp, Some(crate::sim::objects::time(1_000_000_000)));
        let WatchStart::Replay(events) = c.subscribe(Some(rv0), Watched::ConfigMaps).unwrap().start else {
            panic!("expected a replay");
        };
        let kinds: Vec<EventType> = events.iter().map(|e| e.kind).collect();
        assert_eq!(kinds, [EventType::Added, EventType::Modified]);
        let WatchStart::Snapshot(objects) = c.subscribe(None, Watched::ConfigMaps).unwrap().start else {
            panic!("expected a snapshot");
        };
        assert_eq!(objects.len(), 1);
        assert_eq!(c.list_config_maps(Some("default"), |_| true).0.len(), 0);
    }

    #[test]
    fn paging_and_namespaces() {
        let c = cluster_without_cafes();
        let (page, _, more) = c.list_pods(None, None, 5, |_| true);
        assert_eq!(page.len(), 5);
        assert!(more);
        let last = page.last().map(|p| (p.namespace.clone(), p.name.clone())).unwrap();
        let (rest, _, more) = c.list_pods(None, Some(&last), 100, |_| true);
        assert_eq!(rest.len(), 7);
        assert!(!more);
        let (shop, _, _) = c.list_pods(Some("shop"), None, 100, |_| true);
        assert_eq!(shop.len(), 4);
        assert!(shop.iter().all(|p| p.namespace == "shop"));
    }
}
