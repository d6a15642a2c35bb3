//! Kubernetes wire objects built from the compact simulator state: `Pod`, `Node` (via
//! k8s-openapi, so field names and shapes are exact), `metav1.Status` and watch-event lines.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{
    Container, ContainerState, ContainerStateRunning, ContainerStateTerminated, ContainerStateWaiting,
    ContainerStatus, DaemonEndpoint, HostIP, Node, NodeAddress, NodeCondition, NodeDaemonEndpoints, NodeSpec,
    NodeStatus, NodeSystemInfo, Pod, PodCondition, PodIP, PodSpec, PodStatus,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference, Time, WatchEvent};
use serde::Serialize;

use super::rng::SplitMix64;
use super::workload::{Phase, SimNode, SimPod, uuid};

/// A k8s `Time` for unix seconds `s` (the epoch if out of range).
pub(crate) fn time(s: i64) -> Time {
    Time(k8s_openapi::jiff::Timestamp::from_second(s).unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH))
}

/// RFC 3339 text of unix seconds `s`, as Kubernetes writes timestamps.
pub(crate) fn rfc3339(s: i64) -> String {
    time(s).0.to_string()
}

fn condition(type_: &str, ok: bool, at: i64) -> PodCondition {
    PodCondition {
        type_: type_.to_owned(),
        status: if ok { "True" } else { "False" }.to_owned(),
        last_transition_time: Some(time(at)),
        ..Default::default()
    }
}

/// The `Pod` object for `pod` on `node`.
pub(crate) fn pod(pod: &SimPod, node: Option<&SimNode>) -> Pod {
    let labels: BTreeMap<String, String> =
        pod.labels().into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
    let running = pod.phase == Phase::Running;
    let started = pod.started();
    let container_statuses = pod
        .containers
        .iter()
        .enumerate()
        .map(|(k, c)| {
            let state = match pod.phase {
                Phase::Running => ContainerState {
                    running: Some(ContainerStateRunning { started_at: Some(time(c.started)) }),
                    ..Default::default()
                },
                Phase::Pending => ContainerState {
                    waiting: Some(ContainerStateWaiting {
                        reason: Some("ContainerCreating".to_owned()),
                        message: None,
                    }),
                    ..Default::default()
                },
                Phase::Succeeded => ContainerState {
                    terminated: Some(ContainerStateTerminated {
                        exit_code: 0,
                        reason: Some("Completed".to_owned()),
                        started_at: Some(time(c.started)),
                        finished_at: Some(time(c.started + 300)),
                        container_id: Some(container_id(pod, k)),
                        ..Default::default()
                    }),
                    ..Default::default()
                },
            };
            ContainerStatus {
                name: c.name.to_owned(),
                image: c.image.to_owned(),
                image_id: if pod.phase == Phase::Pending {
                    String::new()
                } else {
                    let hex: String = pod.uid.chars().filter(|c| *c != '-').collect();
                    format!("{}@sha256:{hex}{hex}", c.image.split(':').next().unwrap_or(c.image))
                },
                container_id: (pod.phase != Phase::Pending).then(|| container_id(pod, k)),
                ready: running,
                started: Some(running),
                restart_count: 0,
                state: Some(state),
                ..Default::default()
            }
        })
        .collect();
    let host_ip = node.map(|n| n.ip.to_string());
    Pod {
        metadata: ObjectMeta {
            name: Some(pod.name.clone()),
            generate_name: Some(format!("{}-", pod.replica_set())),
            namespace: Some(pod.namespace.clone()),
            uid: Some(pod.uid.clone()),
            resource_version: Some(pod.resource_version.to_string()),
            creation_timestamp: Some(time(pod.created)),
            deletion_timestamp: pod.deleted.map(time),
            deletion_grace_period_seconds: pod.deleted.map(|_| 0),
            labels: Some(labels),
            owner_references: Some(vec![OwnerReference {
                api_version: "apps/v1".to_owned(),
                kind: "ReplicaSet".to_owned(),
                name: pod.replica_set(),
                uid: replica_set_uid(&pod.template_hash),
                controller: Some(true),
                block_owner_deletion: Some(true),
            }]),
            ..Default::default()
        },
        spec: Some(PodSpec {
            node_name: node.map(|n| n.name.clone()),
            containers: pod.containers.iter().map(|c| container(c.name, c.image)).collect(),
            restart_policy: Some("Always".to_owned()),
            dns_policy: Some("ClusterFirst".to_owned()),
            scheduler_name: Some("default-scheduler".to_owned()),
            service_account_name: Some("default".to_owned()),
            termination_grace_period_seconds: Some(30),
            enable_service_links: Some(true),
            priority: Some(0),
            ..Default::default()
        }),
        status: Some(PodStatus {
            phase: Some(pod.phase.as_str().to_owned()),
            conditions: Some(vec![
                condition("PodReadyToStartContainers", pod.phase != Phase::Pending, started),
                condition("Initialized", true, pod.created),
                condition("Ready", running, started),
                condition("ContainersReady", running, started),
                condition("PodScheduled", true, pod.created),
            ]),
            host_ip: host_ip.clone(),
            host_ips: host_ip.map(|ip| vec![HostIP { ip }]),
            pod_ip: (pod.phase != Phase::Pending).then(|| pod.ip.to_string()),
            pod_ips: (pod.phase != Phase::Pending).then(|| vec![PodIP { ip: pod.ip.to_string() }]),
            start_time: Some(time(pod.created + 1)),
            qos_class: Some("BestEffort".to_owned()),
            container_statuses: Some(container_statuses),
            ..Default::default()
        }),
    }
}

/// The `Container` `name` running `image` of a pod spec (or of a workload's pod template).
pub(crate) fn container(name: &str, image: &str) -> Container {
    Container {
        name: name.to_owned(),
        image: Some(image.to_owned()),
        image_pull_policy: Some("IfNotPresent".to_owned()),
        termination_message_path: Some("/dev/termination-log".to_owned()),
        termination_message_policy: Some("File".to_owned()),
        ..Default::default()
    }
}

fn container_id(pod: &SimPod, k: usize) -> String {
    let hex: String = pod.uid.chars().filter(|c| *c != '-').collect();
    format!("containerd://{hex}{hex}{k:02x}")
}

/// The uid of the ReplicaSet whose pods have `pod-template-hash` `template_hash` (the pods'
/// ownerReference and the ReplicaSet object agree on it).
pub(crate) fn replica_set_uid(template_hash: &str) -> String {
    // Stable per ReplicaSet: derived from the template hash.
    let hash = u64::from_str_radix(template_hash, 16).unwrap_or(0);
    uuid(&mut SplitMix64::stream(hash, 6, 0))
}

/// The `Node` object for `node` with kubelet port `kubelet_port`.
pub(crate) fn node(node: &SimNode, kubelet_port: u16) -> Node {
    let capacity: BTreeMap<String, Quantity> =
        [("cpu", "8"), ("memory", "32803620Ki"), ("pods", "110"), ("ephemeral-storage", "102626232Ki")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), Quantity(v.to_owned())))
            .collect();
    let mut allocatable = capacity.clone();
    allocatable.insert("memory".to_owned(), Quantity("32701220Ki".to_owned()));
    let (region, zone) = node.topology();
    let labels: BTreeMap<String, String> = [
        ("kubernetes.io/hostname", node.name.as_str()),
        ("topology.kubernetes.io/region", region),
        ("topology.kubernetes.io/zone", zone),
        ("kubernetes.io/os", "linux"),
        ("kubernetes.io/arch", "amd64"),
        ("beta.kubernetes.io/os", "linux"),
        ("beta.kubernetes.io/arch", "amd64"),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_owned(), v.to_owned()))
    .collect();
    Node {
        metadata: ObjectMeta {
            name: Some(node.name.clone()),
            uid: Some(node.uid.clone()),
            resource_version: Some(node.resource_version.to_string()),
            creation_timestamp: Some(time(node.created)),
            labels: Some(labels),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: Some(format!("10.{}.{}.0/24", 128 + node.index / 256, node.index % 256)),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                NodeAddress { type_: "InternalIP".to_owned(), address: node.ip.to_string() },
                NodeAddress { type_: "Hostname".to_owned(), address: node.name.clone() },
            ]),
            daemon_endpoints: Some(NodeDaemonEndpoints {
                kubelet_endpoint: Some(DaemonEndpoint { port: i32::from(kubelet_port) }),
            }),
            capacity: Some(capacity),
            allocatable: Some(allocatable),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".to_owned(),
                status: "True".to_owned(),
                reason: Some("KubeletReady".to_owned()),
                message: Some("kubelet is posting ready status".to_owned()),
                last_transition_time: Some(time(node.created + 30)),
                last_heartbeat_time: Some(time(node.created + 30)),
            }]),
            node_info: Some(NodeSystemInfo {
                architecture: "amd64".to_owned(),
                boot_id: node.uid.clone(),
                container_runtime_version: "containerd://2.0.5".to_owned(),
                kernel_version: "6.12.0-sim".to_owned(),
                kube_proxy_version: String::new(),
                kubelet_version: "v1.33.0".to_owned(),
                machine_id: node.uid.replace('-', ""),
                operating_system: "linux".to_owned(),
                os_image: "percolator-sim".to_owned(),
                system_uuid: node.uid.clone(),
                swap: None,
            }),
            ..Default::default()
        }),
    }
}

/// A `metav1.Status` body, fields in kube-apiserver's order.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Status {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: serde_json::Map<String, serde_json::Value>,
    status: &'static str,
    message: String,
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<StatusDetails>,
    code: u16,
}

/// `metav1.StatusDetails` (name, API group and kind of the object concerned).
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StatusDetails {
    name: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    group: &'static str,
    kind: &'static str,
}

impl Status {
    /// A failure Status.
    pub(crate) fn failure(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            kind: "Status",
            api_version: "v1",
            metadata: serde_json::Map::new(),
            status: "Failure",
            message: message.into(),
            reason,
            details: None,
            code,
        }
    }

    /// A 404 for object `name` of core resource `kind` (plural, e.g. `pods`).
    pub(crate) fn not_found(kind: &'static str, name: &str) -> Self {
        Self::not_found_in("", kind, name)
    }

    /// A 404 for object `name` of resource `kind` (plural) of API group `group` (`""`: core):
    /// `deployments.apps "x" not found`, as kube-apiserver words it.
    pub(crate) fn not_found_in(group: &'static str, kind: &'static str, name: &str) -> Self {
        let resource = if group.is_empty() { kind.to_owned() } else { format!("{kind}.{group}") };
        let mut s = Self::failure(404, "NotFound", format!("{resource} \"{name}\" not found"));
        s.details = Some(StatusDetails { name: name.to_owned(), group, kind });
        s
    }

    /// The HTTP status code.
    pub(crate) fn code(&self) -> u16 {
        self.code
    }
}

#[derive(Serialize)]
struct BookmarkMeta {
    #[serde(rename = "resourceVersion")]
    resource_version: String,
}

#[derive(Serialize)]
struct BookmarkObject<'a> {
    kind: &'a str,
    #[serde(rename = "apiVersion")]
    api_version: &'a str,
    metadata: BookmarkMeta,
}

#[derive(Serialize)]
struct Line<'a, T> {
    #[serde(rename = "type")]
    type_: &'static str,
    object: &'a T,
}

fn finish_line(result: serde_json::Result<Vec<u8>>) -> Vec<u8> {
    // Serialising these types cannot fail (no maps with non-string keys).
    let mut bytes = result.unwrap_or_default();
    bytes.push(b'\n');
    bytes
}

/// The watch-stream line (with trailing newline) of an ADDED / MODIFIED / DELETED event,
/// via k8s-openapi's `WatchEvent`.
pub(crate) fn event_line<T: Serialize>(event: &WatchEvent<T>) -> Vec<u8> {
    finish_line(serde_json::to_vec(event))
}

/// A BOOKMARK line for `kind` of `api_version` (`v1`, `apps/v1`) at resourceVersion `rv`,
/// with `kind` and `apiVersion` as kube-apiserver sends them (kube-rs requires both).
pub(crate) fn bookmark_line(kind: &str, api_version: &str, rv: u64) -> Vec<u8> {
    finish_line(serde_json::to_vec(&Line {
        type_: "BOOKMARK",
        object: &BookmarkObject {
            kind,
            api_version,
            metadata: BookmarkMeta { resource_version: rv.to_string() },
        },
    }))
}

/// An ERROR line carrying `status` (e.g. 410 Expired).
pub(crate) fn error_line(status: &Status) -> Vec<u8> {
    finish_line(serde_json::to_vec(&Line { type_: "ERROR", object: status }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::workload::{Workload, WorkloadParams};

    #[test]
    fn status_401_is_exact() {
        let s = Status::failure(401, "Unauthorized", "Unauthorized");
        assert_eq!(
            serde_json::to_string(&s).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"Unauthorized","reason":"Unauthorized","code":401}"#
        );
    }

    #[test]
    fn not_found_names_the_group() {
        assert_eq!(
            serde_json::to_string(&Status::not_found_in("apps", "deployments", "x")).unwrap(),
            r#"{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"deployments.apps \"x\" not found","reason":"NotFound","details":{"name":"x","group":"apps","kind":"deployments"},"code":404}"#
        );
        let core = serde_json::to_value(Status::not_found("pods", "p")).unwrap();
        assert_eq!(core["message"], "pods \"p\" not found");
        assert_eq!(core["details"], serde_json::json!({"name": "p", "kind": "pods"}));
    }

    #[test]
    fn objects_round_trip() {
        let w = Workload::generate(
            &WorkloadParams {
                seed: 3,
                nodes: 2,
                pods_per_node: 12,
                namespaces: vec!["shop".into()],
                cafes_per_namespace: 2,
            },
            1_764_000_000,
        );
        for p in &w.pods {
            let obj = pod(p, w.nodes.get(p.node as usize));
            let json = serde_json::to_value(&obj).unwrap();
            assert_eq!(json["kind"], "Pod");
            assert_eq!(json["status"]["phase"], p.phase.as_str());
            let back: Pod = serde_json::from_value(json).unwrap();
            assert_eq!(back.metadata.name.as_deref(), Some(p.name.as_str()));
        }
        let n = serde_json::to_value(node(&w.nodes[1], 4242)).unwrap();
        assert_eq!(n["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"], 4242);
        assert_eq!(n["status"]["addresses"][0]["address"], "127.1.0.2");
        let line = bookmark_line("Pod", "v1", 12);
        assert_eq!(
            String::from_utf8(line).unwrap(),
            "{\"type\":\"BOOKMARK\",\"object\":{\"kind\":\"Pod\",\"apiVersion\":\"v1\",\"metadata\":{\"resourceVersion\":\"12\"}}}\n"
        );
    }
}
