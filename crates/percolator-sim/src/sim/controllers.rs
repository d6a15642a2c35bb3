//! The workload objects the simulated API serves beside the pods (`apps/v1` Deployments,
//! ReplicaSets, StatefulSets, DaemonSets and `v1` Services, as k8s-openapi objects), derived
//! from the pods deterministically (never drawn at random), and which pods each selects.
//!
//! - per namespace and app of the regular pods (`web`, `api`, `worker`, `cache`): the
//!   Deployment and the Service `<app>`, selecting `app: <app>`;
//! - per cafe: the Deployment and the Service `<cafe>`, selecting `app: cafe` and
//!   `une-tasse-de.cafe/cafe: <cafe>`;
//! - per ReplicaSet the pods name (`<app>-<hash>`, `<cafe>-<hash>`): a ReplicaSet whose
//!   `matchLabels` are exactly its pods' `app`, `pod-template-hash` (and cafe) labels, owned
//!   by its Deployment, with the uid the pods' ownerReferences carry;
//! - per namespace: the StatefulSet `tiered` (`matchExpressions`: `tier` Exists and `app` In
//!   (web, api)), the DaemonSet `node-agent` (`app: node-agent`: selects no pod) and the
//!   Service `headless-external` (no selector: selects no pod, as in Kubernetes).
//!
//! An object selects the pods of its namespace that its own selector (as served) matches;
//! `spec.replicas` and the status counts are those pods, whatever their phase (the Running
//! ones are ready). A churn whose replacement differs from its predecessor in what
//! [`derive`] reads ([`same_footprint`]; today's replacements never do) derives the objects
//! again, and [`reconcile`] swaps them in: an unchanged object keeps its resourceVersion, a
//! changed one keeps its uid and creationTimestamp and its watchers see a MODIFIED event.
//! [`Resource`] is one served kind: its names, discovery entry and list kind.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::apps::v1::{
    DaemonSet, DaemonSetSpec, DaemonSetStatus, DaemonSetUpdateStrategy, Deployment, DeploymentSpec,
    DeploymentStatus, DeploymentStrategy, ReplicaSet, ReplicaSetSpec, ReplicaSetStatus,
    RollingUpdateDaemonSet, RollingUpdateDeployment, RollingUpdateStatefulSetStrategy, StatefulSet,
    StatefulSetSpec, StatefulSetStatus, StatefulSetUpdateStrategy,
};
use k8s_openapi::api::core::v1::{
    PodSpec, PodTemplateSpec, Service, ServicePort, ServiceSpec, ServiceStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{
    LabelSelector as K8sSelector, LabelSelectorRequirement, ObjectMeta, OwnerReference,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use serde::Serialize;

use super::cafe::CAFE_LABEL;
use super::objects::{container, replica_set_uid, time};
use super::rng::{SplitMix64, mix64};
use super::selector::LabelSelector;
use super::workload::{SimPod, uuid};

const DOMAIN_CONTROLLER_UID: u64 = 30;

/// The StatefulSet every namespace has, selecting with `matchExpressions`.
pub(crate) const STATEFUL_SET: &str = "tiered";
/// The DaemonSet every namespace has, selecting no pod.
pub(crate) const DAEMON_SET: &str = "node-agent";
/// The Service without selector every namespace has.
pub(crate) const HEADLESS_SERVICE: &str = "headless-external";

/// A served workload resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) enum Resource {
    /// `deployments.apps`
    Deployments,
    /// `replicasets.apps`
    ReplicaSets,
    /// `statefulsets.apps`
    StatefulSets,
    /// `daemonsets.apps`
    DaemonSets,
    /// `services` (core)
    Services,
}

impl Resource {
    /// Every resource, in the order the truth lists them.
    pub(crate) const ALL: [Resource; 5] = [
        Resource::Deployments,
        Resource::ReplicaSets,
        Resource::StatefulSets,
        Resource::DaemonSets,
        Resource::Services,
    ];

    /// The plural resource name (`deployments`), as in paths and counters.
    pub(crate) fn plural(self) -> &'static str {
        match self {
            Resource::Deployments => "deployments",
            Resource::ReplicaSets => "replicasets",
            Resource::StatefulSets => "statefulsets",
            Resource::DaemonSets => "daemonsets",
            Resource::Services => "services",
        }
    }

    /// The API group (`""`: core).
    pub(crate) fn group(self) -> &'static str {
        match self {
            Resource::Services => "",
            _ => "apps",
        }
    }

    /// The objects' `apiVersion`.
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Resource::Services => "v1",
            _ => "apps/v1",
        }
    }

    /// The objects' `kind`.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Resource::Deployments => "Deployment",
            Resource::ReplicaSets => "ReplicaSet",
            Resource::StatefulSets => "StatefulSet",
            Resource::DaemonSets => "DaemonSet",
            Resource::Services => "Service",
        }
    }

    /// The `kind` of a list.
    pub(crate) fn list_kind(self) -> &'static str {
        match self {
            Resource::Deployments => "DeploymentList",
            Resource::ReplicaSets => "ReplicaSetList",
            Resource::StatefulSets => "StatefulSetList",
            Resource::DaemonSets => "DaemonSetList",
            Resource::Services => "ServiceList",
        }
    }

    fn short_name(self) -> &'static str {
        match self {
            Resource::Deployments => "deploy",
            Resource::ReplicaSets => "rs",
            Resource::StatefulSets => "sts",
            Resource::DaemonSets => "ds",
            Resource::Services => "svc",
        }
    }

    /// `deployments.apps`, `services`: the resource as errors and the truth name it.
    pub(crate) fn qualified(self) -> String {
        match self.group() {
            "" => self.plural().to_owned(),
            group => format!("{}.{group}", self.plural()),
        }
    }

    /// The resource `plural` of API group `group`, if served.
    pub(crate) fn find(group: &str, plural: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.group() == group && r.plural() == plural)
    }

    /// The resources of API group `group`.
    pub(crate) fn of_group(group: &str) -> impl Iterator<Item = Resource> + '_ {
        Self::ALL.into_iter().filter(move |r| r.group() == group)
    }

    /// Its entry in an `APIResourceList` (read-only: the simulator serves get, list, watch).
    pub(crate) fn discovery(self) -> serde_json::Value {
        serde_json::json!({
            "name": self.plural(),
            "singularName": self.kind().to_lowercase(),
            "namespaced": true,
            "kind": self.kind(),
            "verbs": ["get", "list", "watch"],
            "shortNames": [self.short_name()],
            "categories": ["all"],
        })
    }
}

/// A workload object as served (k8s-openapi adds `apiVersion` and `kind`).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub(crate) enum Manifest {
    /// A Deployment.
    Deployment(Deployment),
    /// A ReplicaSet.
    ReplicaSet(ReplicaSet),
    /// A StatefulSet.
    StatefulSet(StatefulSet),
    /// A DaemonSet.
    DaemonSet(DaemonSet),
    /// A Service.
    Service(Service),
}

impl Manifest {
    /// The object's metadata.
    pub(crate) fn metadata(&self) -> &ObjectMeta {
        match self {
            Manifest::Deployment(o) => &o.metadata,
            Manifest::ReplicaSet(o) => &o.metadata,
            Manifest::StatefulSet(o) => &o.metadata,
            Manifest::DaemonSet(o) => &o.metadata,
            Manifest::Service(o) => &o.metadata,
        }
    }

    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        match self {
            Manifest::Deployment(o) => &mut o.metadata,
            Manifest::ReplicaSet(o) => &mut o.metadata,
            Manifest::StatefulSet(o) => &mut o.metadata,
            Manifest::DaemonSet(o) => &mut o.metadata,
            Manifest::Service(o) => &mut o.metadata,
        }
    }

    /// What the object's own selector selects: `None` selects nothing (a Service without
    /// selector, or a selector kube-apiserver would reject).
    fn selector(&self) -> Option<LabelSelector> {
        let spec_selector = match self {
            Manifest::Deployment(o) => o.spec.as_ref().map(|s| &s.selector),
            Manifest::ReplicaSet(o) => o.spec.as_ref().map(|s| &s.selector),
            Manifest::StatefulSet(o) => o.spec.as_ref().map(|s| &s.selector),
            Manifest::DaemonSet(o) => o.spec.as_ref().map(|s| &s.selector),
            Manifest::Service(o) => {
                return LabelSelector::from_map(o.spec.as_ref().and_then(|s| s.selector.as_ref()));
            }
        };
        spec_selector.and_then(|s| LabelSelector::from_k8s(s).ok())
    }

    /// Sets `spec.replicas` and the status counts: `total` pods selected, `ready` of them
    /// Running (zero counts are omitted, as kube-apiserver omits them).
    fn set_counts(&mut self, total: i32, ready: i32) {
        let some = |n: i32| (n > 0).then_some(n);
        match self {
            Manifest::Deployment(o) => {
                if let Some(spec) = o.spec.as_mut() {
                    spec.replicas = Some(total);
                }
                o.status = Some(DeploymentStatus {
                    observed_generation: Some(1),
                    replicas: some(total),
                    updated_replicas: some(total),
                    ready_replicas: some(ready),
                    available_replicas: some(ready),
                    unavailable_replicas: some(total - ready),
                    ..Default::default()
                });
            }
            Manifest::ReplicaSet(o) => {
                if let Some(spec) = o.spec.as_mut() {
                    spec.replicas = Some(total);
                }
                o.status = Some(ReplicaSetStatus {
                    observed_generation: Some(1),
                    replicas: total,
                    fully_labeled_replicas: some(total),
                    ready_replicas: some(ready),
                    available_replicas: some(ready),
                    ..Default::default()
                });
            }
            Manifest::StatefulSet(o) => {
                let spec = o.spec.get_or_insert_with(Default::default);
                spec.replicas = Some(total);
                o.status = Some(StatefulSetStatus {
                    observed_generation: Some(1),
                    replicas: total,
                    current_replicas: some(total),
                    updated_replicas: some(total),
                    ready_replicas: some(ready),
                    available_replicas: some(ready),
                    ..Default::default()
                });
            }
            Manifest::DaemonSet(o) => {
                o.status = Some(DaemonSetStatus {
                    observed_generation: Some(1),
                    current_number_scheduled: total,
                    desired_number_scheduled: total,
                    number_misscheduled: 0,
                    number_ready: ready,
                    number_available: some(ready),
                    updated_number_scheduled: some(total),
                    ..Default::default()
                });
            }
            Manifest::Service(_) => {}
        }
    }
}

/// Key of a workload object: `(resource, namespace, name)`, the order lists use.
pub(crate) type Key = (Resource, String, String);

/// A served workload object and what it selects.
#[derive(Debug, Clone)]
pub(crate) struct Controller {
    /// Its resource.
    pub(crate) resource: Resource,
    /// Its namespace.
    pub(crate) namespace: String,
    /// Its name.
    pub(crate) name: String,
    /// The object as served.
    pub(crate) object: Manifest,
    /// Parsed from the object's selector; `None` selects nothing.
    selector: Option<LabelSelector>,
}

impl Controller {
    fn new(resource: Resource, object: Manifest) -> Self {
        let meta = object.metadata();
        Self {
            resource,
            namespace: meta.namespace.clone().unwrap_or_default(),
            name: meta.name.clone().unwrap_or_default(),
            selector: object.selector(),
            object,
        }
    }

    /// Its key.
    pub(crate) fn key(&self) -> Key {
        (self.resource, self.namespace.clone(), self.name.clone())
    }

    /// Its metadata.
    pub(crate) fn metadata(&self) -> &ObjectMeta {
        self.object.metadata()
    }

    /// Whether it selects `pod` (of any phase).
    pub(crate) fn selects(&self, pod: &SimPod) -> bool {
        pod.namespace == self.namespace && self.selector.as_ref().is_some_and(|s| s.matches(|k| pod.label(k)))
    }
}

/// The pods of one namespace, and by label value for lookups by pinned selector terms.
#[derive(Default)]
struct NamespacePods<'a> {
    all: Vec<&'a SimPod>,
    by_label: HashMap<&'static str, HashMap<&'a str, Vec<&'a SimPod>>>,
}

/// Pods indexed by namespace and label, so selecting costs the candidates of the
/// selector's narrowest `k=v` / `k in (…)` term rather than every pod.
struct PodIndex<'a>(HashMap<&'a str, NamespacePods<'a>>);

impl<'a> PodIndex<'a> {
    fn new(pods: impl IntoIterator<Item = &'a SimPod>) -> Self {
        let mut index: HashMap<&'a str, NamespacePods<'a>> = HashMap::new();
        for pod in pods {
            let ns = index.entry(pod.namespace.as_str()).or_default();
            ns.all.push(pod);
            for (key, value) in pod.labels() {
                ns.by_label.entry(key).or_default().entry(value).or_default().push(pod);
            }
        }
        Self(index)
    }

    /// The indexed pods `controller` selects, in index order.
    fn select(&self, controller: &Controller) -> Vec<&'a SimPod> {
        let (Some(selector), Some(ns)) = (&controller.selector, self.0.get(controller.namespace.as_str()))
        else {
            return Vec::new();
        };
        let with = |key: &str, value: &str| -> &[&'a SimPod] {
            ns.by_label.get(key).and_then(|values| values.get(value)).map_or(&[], Vec::as_slice)
        };
        let narrowest = selector
            .pinned()
            .map(|(key, values)| (key, values.iter().map(String::as_str).collect::<BTreeSet<&str>>()))
            .min_by_key(|(key, values)| values.iter().map(|v| with(key, v).len()).sum::<usize>());
        let candidates: Vec<&'a SimPod> = match narrowest {
            Some((key, values)) => values.iter().flat_map(|v| with(key, v)).copied().collect(),
            None => ns.all.clone(),
        };
        candidates.into_iter().filter(|p| controller.selects(p)).collect()
    }
}

/// What the pods of one Deployment or ReplicaSet have in common.
struct Group<'a> {
    /// The selector's labels (`app`, and the cafe's, and `pod-template-hash` for a
    /// ReplicaSet).
    labels: Vec<(&'static str, &'a str)>,
    /// Container name → image over the pods (a churn keeps this set).
    containers: BTreeMap<&'static str, &'static str>,
    /// The oldest pod's creationTimestamp.
    created: i64,
}

impl<'a> Group<'a> {
    /// Adds `pod` to group `key` of `groups` (created with `labels()`).
    fn add<K: Ord>(
        groups: &mut BTreeMap<K, Group<'a>>,
        key: K,
        pod: &'a SimPod,
        labels: impl FnOnce() -> Vec<(&'static str, &'a str)>,
    ) {
        let group = groups.entry(key).or_insert_with(|| Group {
            labels: labels(),
            containers: BTreeMap::new(),
            created: pod.created,
        });
        group.created = group.created.min(pod.created);
        group.containers.extend(pod.containers.iter().map(|c| (c.name, c.image)));
    }

    fn template(&self) -> PodTemplateSpec {
        template(&self.labels, self.containers.iter().map(|(n, i)| (*n, *i)))
    }
}

fn label_map<'a>(pairs: impl IntoIterator<Item = (&'a str, &'a str)>) -> BTreeMap<String, String> {
    pairs.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect()
}

fn match_labels(labels: &[(&str, &str)]) -> K8sSelector {
    K8sSelector { match_labels: Some(label_map(labels.iter().copied())), match_expressions: None }
}

fn template<'a>(
    labels: &[(&str, &str)],
    containers: impl IntoIterator<Item = (&'a str, &'a str)>,
) -> PodTemplateSpec {
    PodTemplateSpec {
        metadata: Some(ObjectMeta { labels: Some(label_map(labels.iter().copied())), ..Default::default() }),
        spec: Some(PodSpec {
            containers: containers.into_iter().map(|(name, image)| container(name, image)).collect(),
            restart_policy: Some("Always".to_owned()),
            dns_policy: Some("ClusterFirst".to_owned()),
            scheduler_name: Some("default-scheduler".to_owned()),
            termination_grace_period_seconds: Some(30),
            ..Default::default()
        }),
    }
}

/// A deterministic hash of object `name` of `resource` in `namespace`.
fn object_hash(seed: u64, resource: Resource, namespace: &str, name: &str) -> u64 {
    let key = format!("{}/{namespace}/{name}", resource.plural());
    key.bytes().fold(mix64(seed), |h, b| mix64(h ^ u64::from(b)))
}

/// A deterministic uid for object `name` of `resource` in `namespace`.
fn object_uid(seed: u64, resource: Resource, namespace: &str, name: &str) -> String {
    uuid(&mut SplitMix64::stream(object_hash(seed, resource, namespace, name), DOMAIN_CONTROLLER_UID, 0))
}

/// The metadata of a derived object (its resourceVersion comes with [`reconcile`]).
fn meta(
    seed: u64,
    resource: Resource,
    namespace: &str,
    name: &str,
    labels: &[(&str, &str)],
    created: i64,
) -> ObjectMeta {
    let uid = match (resource, labels.iter().find(|(k, _)| *k == "pod-template-hash")) {
        (Resource::ReplicaSets, Some((_, hash))) => replica_set_uid(hash),
        _ => object_uid(seed, resource, namespace, name),
    };
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: Some(namespace.to_owned()),
        uid: Some(uid),
        creation_timestamp: Some(time(created)),
        // Services have no generation.
        generation: (resource != Resource::Services).then_some(1),
        labels: Some(label_map(labels.iter().copied())),
        ..Default::default()
    }
}

fn revision_one() -> Option<BTreeMap<String, String>> {
    Some(BTreeMap::from([("deployment.kubernetes.io/revision".to_owned(), "1".to_owned())]))
}

fn deployment(seed: u64, namespace: &str, name: &str, group: &Group<'_>) -> Manifest {
    Manifest::Deployment(Deployment {
        metadata: ObjectMeta {
            annotations: revision_one(),
            ..meta(seed, Resource::Deployments, namespace, name, &group.labels, group.created - 60)
        },
        spec: Some(DeploymentSpec {
            selector: match_labels(&group.labels),
            template: group.template(),
            strategy: Some(DeploymentStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDeployment {
                    max_surge: Some(IntOrString::String("25%".to_owned())),
                    max_unavailable: Some(IntOrString::String("25%".to_owned())),
                }),
            }),
            revision_history_limit: Some(10),
            progress_deadline_seconds: Some(600),
            ..Default::default()
        }),
        status: None,
    })
}

fn replica_set(
    seed: u64,
    namespace: &str,
    name: &str,
    group: &Group<'_>,
    owner: Option<(&str, String)>,
) -> Manifest {
    Manifest::ReplicaSet(ReplicaSet {
        metadata: ObjectMeta {
            annotations: revision_one(),
            owner_references: owner.map(|(name, uid)| {
                vec![OwnerReference {
                    api_version: "apps/v1".to_owned(),
                    kind: "Deployment".to_owned(),
                    name: name.to_owned(),
                    uid,
                    controller: Some(true),
                    block_owner_deletion: Some(true),
                }]
            }),
            ..meta(seed, Resource::ReplicaSets, namespace, name, &group.labels, group.created - 30)
        },
        spec: Some(ReplicaSetSpec {
            selector: match_labels(&group.labels),
            template: Some(group.template()),
            ..Default::default()
        }),
        status: None,
    })
}

fn service(
    seed: u64,
    namespace: &str,
    name: &str,
    selector: Option<&[(&str, &str)]>,
    created: i64,
) -> Manifest {
    let bits = object_hash(seed, Resource::Services, namespace, name);
    let cluster_ip = match selector {
        Some(_) => format!("10.96.{}.{}", (bits >> 8) & 0xff, (bits & 0xff) % 254 + 1),
        None => "None".to_owned(),
    };
    let labels = [("app", name)];
    Manifest::Service(Service {
        metadata: meta(seed, Resource::Services, namespace, name, &labels, created),
        spec: Some(ServiceSpec {
            selector: selector.map(|s| label_map(s.iter().copied())),
            ports: Some(vec![ServicePort {
                name: Some("http".to_owned()),
                port: 80,
                target_port: Some(IntOrString::Int(if selector.is_some() { 8080 } else { 80 })),
                protocol: Some("TCP".to_owned()),
                ..Default::default()
            }]),
            cluster_ip: Some(cluster_ip.clone()),
            cluster_ips: Some(vec![cluster_ip]),
            type_: Some("ClusterIP".to_owned()),
            session_affinity: Some("None".to_owned()),
            ip_families: Some(vec!["IPv4".to_owned()]),
            ip_family_policy: Some("SingleStack".to_owned()),
            internal_traffic_policy: Some("Cluster".to_owned()),
            ..Default::default()
        }),
        status: Some(ServiceStatus { load_balancer: Some(Default::default()), ..Default::default() }),
    })
}

fn stateful_set(seed: u64, namespace: &str, created: i64) -> Manifest {
    let expression = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
        key: key.to_owned(),
        operator: operator.to_owned(),
        values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
    };
    let labels = [("app", STATEFUL_SET)];
    Manifest::StatefulSet(StatefulSet {
        metadata: meta(seed, Resource::StatefulSets, namespace, STATEFUL_SET, &labels, created),
        spec: Some(StatefulSetSpec {
            service_name: Some(STATEFUL_SET.to_owned()),
            selector: K8sSelector {
                match_labels: None,
                match_expressions: Some(vec![
                    expression("tier", "Exists", &[]),
                    expression("app", "In", &["web", "api"]),
                ]),
            },
            template: template(
                &[("app", "web"), ("tier", "frontend")],
                [("app", "registry.example.com/shop/web:1.8.2")],
            ),
            pod_management_policy: Some("OrderedReady".to_owned()),
            update_strategy: Some(StatefulSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateStatefulSetStrategy {
                    partition: Some(0),
                    max_unavailable: None,
                }),
            }),
            revision_history_limit: Some(10),
            ..Default::default()
        }),
        status: None,
    })
}

fn daemon_set(seed: u64, namespace: &str, created: i64) -> Manifest {
    let labels = [("app", DAEMON_SET)];
    Manifest::DaemonSet(DaemonSet {
        metadata: meta(seed, Resource::DaemonSets, namespace, DAEMON_SET, &labels, created),
        spec: Some(DaemonSetSpec {
            selector: match_labels(&labels),
            template: template(&labels, [("agent", "registry.example.com/platform/node-agent:0.4.1")]),
            update_strategy: Some(DaemonSetUpdateStrategy {
                type_: Some("RollingUpdate".to_owned()),
                rolling_update: Some(RollingUpdateDaemonSet {
                    max_surge: Some(IntOrString::Int(0)),
                    max_unavailable: Some(IntOrString::Int(1)),
                }),
            }),
            revision_history_limit: Some(10),
            ..Default::default()
        }),
        status: None,
    })
}

/// The workload objects of `pods` (every namespace), without resourceVersions: see the
/// module documentation. The same pods give the same objects; pods that differ only in
/// names and ages give the same objects once [`reconcile`]d.
pub(crate) fn derive<'a>(pods: impl IntoIterator<Item = &'a SimPod>, seed: u64) -> Vec<Controller> {
    let pods: Vec<&SimPod> = pods.into_iter().collect();
    // Deployments by (namespace, name); ReplicaSets by (namespace, Deployment, hash).
    let mut deployments: BTreeMap<(&str, &str), Group<'_>> = BTreeMap::new();
    let mut replica_sets: BTreeMap<(&str, &str, &str), Group<'_>> = BTreeMap::new();
    let mut namespaces: BTreeMap<&str, i64> = BTreeMap::new();
    for pod in &pods {
        let ns = pod.namespace.as_str();
        let (name, selector) = match &pod.cafe {
            Some(cafe) => (cafe.name.as_str(), Some((CAFE_LABEL, cafe.name.as_str()))),
            None => (pod.app.as_str(), None),
        };
        let labels = || [("app", pod.app.as_str())].into_iter().chain(selector);
        Group::add(&mut deployments, (ns, name), pod, || labels().collect());
        Group::add(&mut replica_sets, (ns, name, pod.template_hash.as_str()), pod, || {
            let mut all: Vec<_> =
                labels().chain([("pod-template-hash", pod.template_hash.as_str())]).collect();
            all.sort_unstable();
            all
        });
        let oldest = namespaces.entry(ns).or_insert(pod.created);
        *oldest = (*oldest).min(pod.created);
    }

    let mut out = Vec::new();
    for ((ns, name), group) in &deployments {
        out.push(Controller::new(Resource::Deployments, deployment(seed, ns, name, group)));
        out.push(Controller::new(
            Resource::Services,
            service(seed, ns, name, Some(&group.labels), group.created - 60),
        ));
    }
    for ((ns, owner, hash), group) in &replica_sets {
        // `<app>-<hash>` / `<cafe>-<hash>`, as the pods' `replica_set()`, owned by the
        // Deployment whose selector is the ReplicaSet's without the hash.
        let name = format!("{owner}-{hash}");
        let owner = (*owner, object_uid(seed, Resource::Deployments, ns, owner));
        out.push(Controller::new(Resource::ReplicaSets, replica_set(seed, ns, &name, group, Some(owner))));
    }
    for (ns, oldest) in &namespaces {
        let created = oldest - 120;
        out.push(Controller::new(Resource::StatefulSets, stateful_set(seed, ns, created)));
        out.push(Controller::new(Resource::DaemonSets, daemon_set(seed, ns, created)));
        out.push(Controller::new(Resource::Services, service(seed, ns, HEADLESS_SERVICE, None, created)));
    }

    let index = PodIndex::new(pods.iter().copied());
    for controller in &mut out {
        let selected = index.select(controller);
        let ready = selected.iter().filter(|p| p.is_running()).count();
        let count = |n: usize| i32::try_from(n).unwrap_or(i32::MAX);
        controller.object.set_counts(count(selected.len()), count(ready));
    }
    out
}

/// Whether replacing pod `a` by `b` leaves the derived objects as they are. [`derive`] reads
/// a pod's namespace, labels, phase and containers, and its age only for the
/// creationTimestamp of an object, which [`reconcile`] keeps once the object exists.
pub(crate) fn same_footprint(a: &SimPod, b: &SimPod) -> bool {
    let containers = |p: &SimPod| p.containers.iter().map(|c| (c.name, c.image)).collect::<Vec<_>>();
    a.namespace == b.namespace
        && a.phase == b.phase
        && a.labels() == b.labels()
        && containers(a) == containers(b)
}

/// How a workload object changed, for the watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Change {
    /// It is new.
    Added,
    /// It differs (the object is its new state).
    Modified,
    /// It is gone (the object is its last state).
    Deleted,
}

/// Makes `current` the `derived` objects. An unchanged object stays as it is (same
/// resourceVersion); a changed one keeps its uid and creationTimestamp and gets a
/// resourceVersion from `next_rv`, as does a new one; one no longer derived is deleted at
/// `now` (unix seconds). Returns the changes, each with its new resourceVersion.
pub(crate) fn reconcile(
    current: &mut BTreeMap<Key, Arc<Controller>>,
    derived: Vec<Controller>,
    now: i64,
    mut next_rv: impl FnMut() -> u64,
) -> Vec<(Change, Arc<Controller>)> {
    let mut changes = Vec::new();
    let mut next = BTreeMap::new();
    for mut controller in derived {
        let key = controller.key();
        let kind = match current.remove(&key) {
            Some(old) => {
                let meta = controller.object.metadata_mut();
                let old_meta = old.metadata();
                meta.uid.clone_from(&old_meta.uid);
                meta.creation_timestamp.clone_from(&old_meta.creation_timestamp);
                meta.resource_version.clone_from(&old_meta.resource_version);
                if controller.object == old.object {
                    next.insert(key, old);
                    continue;
                }
                Change::Modified
            }
            None => Change::Added,
        };
        controller.object.metadata_mut().resource_version = Some(next_rv().to_string());
        let controller = Arc::new(controller);
        changes.push((kind, Arc::clone(&controller)));
        next.insert(key, controller);
    }
    for old in std::mem::take(current).into_values() {
        let mut gone = (*old).clone();
        let meta = gone.object.metadata_mut();
        meta.resource_version = Some(next_rv().to_string());
        meta.deletion_timestamp = Some(time(now));
        changes.push((Change::Deleted, Arc::new(gone)));
    }
    *current = next;
    changes
}

/// The pods among `pods` each of `controllers` selects (in `pods`' order).
pub(crate) fn selections<'a, 'c>(
    controllers: &'c [Arc<Controller>],
    pods: impl IntoIterator<Item = &'a SimPod>,
) -> Vec<(&'c Controller, Vec<&'a SimPod>)> {
    let index = PodIndex::new(pods);
    controllers.iter().map(|c| (c.as_ref(), index.select(c))).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil;
    use crate::sim::workload::{SimContainer, Workload};

    fn mk_objects() -> (Workload, Vec<Controller>) {
        let w = Workload::generate(&testutil::params(), testutil::START);
        let objects = derive(&w.pods, 1);
        (w, objects)
    }

    fn find<'a>(objects: &'a [Controller], resource: Resource, ns: &str, name: &str) -> &'a Controller {
        objects
            .iter()
            .find(|c| c.resource == resource && c.namespace == ns && c.name == name)
            .unwrap_or_else(|| panic!("no {resource:?} {ns}/{name}"))
    }

    #[test]
    fn objects_follow_the_pods() {
        let (w, objects) = mk_objects();
        assert_eq!(
            derive(&w.pods, 1).iter().map(|c| &c.object).collect::<Vec<_>>(),
            objects.iter().map(|c| &c.object).collect::<Vec<_>>()
        );
        for pod in &w.pods {
            let deployment = pod.cafe.as_ref().map_or(pod.app.as_str(), |c| c.name.as_str());
            for (resource, name) in [
                (Resource::Deployments, deployment),
                (Resource::Services, deployment),
                (Resource::ReplicaSets, pod.replica_set().as_str()),
            ] {
                let c = find(&objects, resource, &pod.namespace, name);
                assert!(c.selects(pod), "{resource:?} {name} / {}", pod.name);
            }
            let rs = find(&objects, Resource::ReplicaSets, &pod.namespace, &pod.replica_set());
            let Manifest::ReplicaSet(o) = &rs.object else { panic!() };
            // The pod's ownerReference names this ReplicaSet.
            assert_eq!(o.metadata.uid.as_deref(), Some(replica_set_uid(&pod.template_hash).as_str()));
            let selector = o.spec.as_ref().unwrap().selector.match_labels.clone().unwrap();
            let pod_labels: BTreeMap<String, String> = pod
                .labels()
                .into_iter()
                .filter(|(k, _)| *k != "tier")
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect();
            assert_eq!(selector, pod_labels);
            let owner = &o.metadata.owner_references.as_ref().unwrap()[0];
            let deploy = find(&objects, Resource::Deployments, &pod.namespace, deployment);
            assert_eq!((owner.name.as_str(), Some(&owner.uid)), (deployment, deploy.metadata().uid.as_ref()));
            assert!(
                find(&objects, Resource::StatefulSets, &pod.namespace, STATEFUL_SET).selects(pod)
                    == (pod.tier.is_some() && matches!(pod.app.as_str(), "web" | "api"))
            );
            assert!(!find(&objects, Resource::DaemonSets, &pod.namespace, DAEMON_SET).selects(pod));
            assert!(!find(&objects, Resource::Services, &pod.namespace, HEADLESS_SERVICE).selects(pod));
        }
        // Replicas: the selected pods, any phase.
        for c in &objects {
            let selected = w.pods.iter().filter(|p| c.selects(p)).count() as i32;
            let replicas = match &c.object {
                Manifest::Deployment(o) => o.spec.as_ref().unwrap().replicas,
                Manifest::ReplicaSet(o) => o.spec.as_ref().unwrap().replicas,
                Manifest::StatefulSet(o) => o.spec.as_ref().unwrap().replicas,
                Manifest::DaemonSet(o) => Some(o.status.as_ref().unwrap().desired_number_scheduled),
                Manifest::Service(_) => continue,
            };
            assert_eq!(replicas, Some(selected), "{:?}", c.key());
        }
        let namespaces = 3;
        let count = |r: Resource| objects.iter().filter(|c| c.resource == r).count();
        assert_eq!(count(Resource::StatefulSets), namespaces);
        assert_eq!(count(Resource::DaemonSets), namespaces);
        assert_eq!(count(Resource::Services), count(Resource::Deployments) + namespaces);
        assert_eq!(count(Resource::ReplicaSets), count(Resource::Deployments));
    }

    #[test]
    fn reconcile_keeps_identity() {
        let (w, objects) = mk_objects();
        let mut rv = 500;
        let mut current = BTreeMap::new();
        let changes = reconcile(&mut current, objects, 0, || {
            rv += 1;
            rv
        });
        assert_eq!(changes.len(), current.len());
        assert!(changes.iter().all(|(kind, _)| *kind == Change::Added));
        let before = current.clone();
        // The same pods: nothing changes.
        assert!(reconcile(&mut current, derive(&w.pods, 1), 0, || unreachable!()).is_empty());
        // One web pod fewer: its Deployment, ReplicaSet and maybe the StatefulSet change.
        let gone = w
            .pods
            .iter()
            .position(|p| {
                let same = |q: &&SimPod| q.namespace == p.namespace && q.app.as_str() == "web";
                p.app.as_str() == "web" && w.pods.iter().filter(same).count() > 1
            })
            .unwrap();
        let mut fewer = w.pods.clone();
        let removed = fewer.remove(gone);
        let changes = reconcile(&mut current, derive(&fewer, 1), 1_764_000_000, || {
            rv += 1;
            rv
        });
        assert!(changes.iter().all(|(kind, _)| *kind == Change::Modified));
        let names: Vec<(Resource, &str)> =
            changes.iter().map(|(_, c)| (c.resource, c.name.as_str())).collect();
        assert!(names.contains(&(Resource::Deployments, "web")));
        assert!(names.contains(&(Resource::ReplicaSets, removed.replica_set().as_str())));
        for (_, c) in &changes {
            let old = &before[&c.key()];
            assert_eq!(c.metadata().uid, old.metadata().uid);
            assert_eq!(c.metadata().creation_timestamp, old.metadata().creation_timestamp);
            assert!(c.metadata().resource_version > old.metadata().resource_version);
        }
        // A namespace without pods: its objects are deleted.
        let mut rest = w.pods.clone();
        rest.retain(|p| p.namespace != "default");
        let changes = reconcile(&mut current, derive(&rest, 1), 1_764_000_000, || {
            rv += 1;
            rv
        });
        let deleted: Vec<&Arc<Controller>> =
            changes.iter().filter(|(k, _)| *k == Change::Deleted).map(|(_, c)| c).collect();
        assert!(
            deleted.iter().all(|c| c.namespace == "default" && c.metadata().deletion_timestamp.is_some())
        );
        assert!(deleted.iter().any(|c| c.resource == Resource::DaemonSets));
        assert!(current.keys().all(|(_, ns, _)| ns != "default"));
    }

    #[test]
    fn churn_replacements_change_no_object() {
        let (w, _) = mk_objects();
        // Churn replaces Running pods only.
        for (n, old) in w.pods.iter().enumerate().filter(|(_, p)| p.is_running()) {
            let fresh = crate::sim::workload::replacement(1, n as u64, old, 99, |_| false, testutil::START);
            assert!(same_footprint(old, &fresh), "{}", old.name);
        }
        let pod = w.pods.iter().find(|p| p.is_running() && p.tier.is_some()).unwrap();
        let pending = SimPod { phase: crate::sim::workload::Phase::Pending, ..pod.clone() };
        let untiered = SimPod { tier: None, ..pod.clone() };
        let elsewhere = SimPod { namespace: "elsewhere".into(), ..pod.clone() };
        let mut sidecar = pod.clone();
        sidecar.containers.push(SimContainer { name: "extra", ..pod.containers[0].clone() });
        for other in [pending, untiered, elsewhere, sidecar] {
            assert!(!same_footprint(pod, &other));
            // And deriving tells the difference.
            let mut changed: Vec<SimPod> = w.pods.iter().filter(|p| p.uid != pod.uid).cloned().collect();
            changed.push(other);
            let mut current = BTreeMap::new();
            reconcile(&mut current, derive(&w.pods, 1), 0, || 1);
            assert!(!reconcile(&mut current, derive(&changed, 1), 0, || 2).is_empty());
        }
    }

    #[test]
    fn resources_name_themselves() {
        assert_eq!(Resource::Deployments.qualified(), "deployments.apps");
        assert_eq!(Resource::Services.qualified(), "services");
        assert_eq!(Resource::find("apps", "statefulsets"), Some(Resource::StatefulSets));
        assert_eq!(Resource::find("", "deployments"), None);
        assert_eq!(Resource::of_group("apps").count(), 4);
        let d = Resource::DaemonSets.discovery();
        assert_eq!(d["kind"], "DaemonSet");
        assert_eq!(d["singularName"], "daemonset");
        assert_eq!(d["shortNames"], serde_json::json!(["ds"]));
    }
}
