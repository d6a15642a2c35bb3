//! The series a real cluster's Prometheus has from its kubelets' cAdvisor job
//! (`/metrics/cadvisor`) and `/metrics/resource` job, exported by the metrics listener with
//! `--cadvisor` (percolator's `--resource-source=prometheus` reads them).
//!
//! [`EXPORTER`] writes, consistent with the truth and with what the simulated kubelets serve
//! (`kubelet::render_as`) at every time, history included:
//! - `container_cpu_usage_seconds_total` (counter) and `container_memory_working_set_bytes`
//!   (gauge), per Running pod:
//!   - per started container, `{container,id,image,name,namespace,node,pod}` with
//!     `id="/kubepods/burstable/pod<uid>/<container id>"` and `name="<container id>"` (64 hex
//!     digits, deterministic), the kubelet's values of the container;
//!   - its sandbox, `container="POD"`, image [`SANDBOX_IMAGE`], its own id, a small constant
//!     usage ([`SANDBOX_CPU_CORES`], [`SANDBOX_MEMORY_BYTES`]) that is part of no container's
//!     truth;
//!   - its cgroup, `{id="/kubepods/burstable/pod<uid>",namespace,node,pod}` (cAdvisor's empty
//!     `container`, `image` and `name` left out, as Prometheus stores them): the sum of its
//!     containers and its sandbox;
//!
//!   and per node the root cgroup `{id="/",node}`: the node's usage as its kubelet reports it;
//! - `node_cpu_usage_seconds_total` (counter) and `node_memory_working_set_bytes` (gauge) per
//!   node, `{node}`: the kubelet's values (its Running pods' started containers and the
//!   system's; the sandboxes are not in them).
//!
//! CPU counters are in whole nanoseconds and computed by the kubelet's own functions
//! (`kubelet::cpu_seconds`), so a series here and its kubelet counterpart agree to the bit at
//! any time.

use std::fmt::Write as _;
use std::sync::Arc;

use super::apps::{Exporter, Family, FamilyType, SeriesSink, SeriesValue};
use super::kubelet::{node_cpu_terms, node_memory_terms};
use super::rng::SplitMix64;
use super::workload::{SimNode, SimPod, counter_origin, node_name};

const DOMAIN_RUNTIME_ID: u64 = 30;

/// Image of every pod's sandbox (`container="POD"`).
pub(super) const SANDBOX_IMAGE: &str = "registry.k8s.io/pause:3.9";

/// CPU usage of a pod's sandbox, cores.
pub(super) const SANDBOX_CPU_CORES: f64 = 0.0001;

/// Working set of a pod's sandbox, bytes.
pub(super) const SANDBOX_MEMORY_BYTES: f64 = 450_560.0;

/// The cAdvisor and node series: per-pod series of the containers, sandbox and pod cgroup,
/// per-node series of the root cgroup and the node.
pub(super) const EXPORTER: Exporter =
    Exporter { families: FAMILIES, pod_series, node_series: Some(node_series) };

const CONTAINER_CPU: usize = 0;
const CONTAINER_MEMORY: usize = 1;
const NODE_CPU: usize = 2;
const NODE_MEMORY: usize = 3;

const FAMILIES: &[Family] = &[
    Family {
        name: "container_cpu_usage_seconds",
        help: "Cumulative cpu time consumed in seconds.",
        kind: FamilyType::Counter,
    },
    Family {
        name: "container_memory_working_set_bytes",
        help: "Current working set in bytes.",
        kind: FamilyType::Gauge,
    },
    Family {
        name: "node_cpu_usage_seconds",
        help: "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
        kind: FamilyType::Counter,
    },
    Family {
        name: "node_memory_working_set_bytes",
        help: "[STABLE] Current working set of the node in bytes",
        kind: FamilyType::Gauge,
    },
];

/// Which slot of a pod a runtime id is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Slot {
    /// Container number `k` of the pod.
    Container(usize),
    /// The pod's sandbox.
    Sandbox,
}

/// The 64-hex-digit runtime id of `slot` of `pod` (cAdvisor's `name` and the last segment of
/// its `id`), deterministic from the pod's uid.
pub(super) fn runtime_id(pod: &SimPod, slot: Slot) -> String {
    // FNV-1a of the uid: the id follows the pod, whatever created it.
    let uid = pod
        .uid
        .bytes()
        .fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3));
    let index = match slot {
        Slot::Container(k) => k as u64,
        Slot::Sandbox => u64::MAX,
    };
    let mut rng = SplitMix64::stream(uid, DOMAIN_RUNTIME_ID, index);
    let mut out = String::with_capacity(64);
    for _ in 0..4 {
        let _ = write!(out, "{:016x}", rng.next_u64());
    }
    out
}

/// The cgroup of `pod`: `/kubepods/burstable/pod<uid>`.
pub(super) fn pod_cgroup(pod: &SimPod) -> String {
    format!("/kubepods/burstable/pod{}", pod.uid)
}

/// The series of family `family` of [`FAMILIES`] for a Running pod whose counters start at
/// `start`: its cgroup, its sandbox and its containers.
fn pod_series(family: usize, pod: &SimPod, start: f64, sink: &mut SeriesSink<'_>) {
    // A container starts no earlier than its pod, so its counters start at
    // `counter_origin(origin, c.started) == counter_origin(start, c.started)`.
    let usage: fn(&[(f64, f64)]) -> SeriesValue = match family {
        CONTAINER_CPU => |terms| SeriesValue::CpuSeconds(Arc::from(terms)),
        CONTAINER_MEMORY => |terms| SeriesValue::WorkingSet(Arc::from(terms)),
        _ => return,
    };
    let amount = |cores: f64, bytes: f64| if family == CONTAINER_CPU { cores } else { bytes };
    let sandbox = (amount(SANDBOX_CPU_CORES, SANDBOX_MEMORY_BYTES), start);
    let containers: Vec<(f64, f64)> = pod
        .containers
        .iter()
        .map(|c| (amount(c.cpu_cores, c.memory_bytes), counter_origin(start, c.started)))
        .collect();
    let (ns, name) = (pod.namespace.as_str(), pod.name.as_str());
    let node = node_name(pod.node);
    let cgroup = pod_cgroup(pod);

    let mut all = containers.clone();
    all.push(sandbox);
    sink("", &[("id", &cgroup), ("namespace", ns), ("node", &node), ("pod", name)], usage(&all));

    let id = runtime_id(pod, Slot::Sandbox);
    sink(
        "",
        &[
            ("container", "POD"),
            ("id", &format!("{cgroup}/{id}")),
            ("image", SANDBOX_IMAGE),
            ("name", &id),
            ("namespace", ns),
            ("node", &node),
            ("pod", name),
        ],
        usage(&[sandbox]),
    );

    for (k, (c, term)) in pod.containers.iter().zip(&containers).enumerate() {
        let id = runtime_id(pod, Slot::Container(k));
        sink(
            "",
            &[
                ("container", c.name),
                ("id", &format!("{cgroup}/{id}")),
                ("image", c.image),
                ("name", &id),
                ("namespace", ns),
                ("node", &node),
                ("pod", name),
            ],
            usage(std::slice::from_ref(term)),
        );
    }
}

/// The series of family `family` of [`FAMILIES`] for `node` hosting `pods`: its root cgroup
/// (`container_*`) or the node itself (`node_*`), the kubelet's sums either way.
fn node_series(family: usize, node: &SimNode, pods: &[Arc<SimPod>], origin: f64, sink: &mut SeriesSink<'_>) {
    let cpu = || SeriesValue::CpuSeconds(node_cpu_terms(node, pods, origin).collect());
    let memory = || SeriesValue::WorkingSet(node_memory_terms(node, pods, origin).collect());
    let root = [("id", "/"), ("node", node.name.as_str())];
    let labels = [("node", node.name.as_str())];
    match family {
        CONTAINER_CPU => sink("", &root, cpu()),
        CONTAINER_MEMORY => sink("", &root, memory()),
        NODE_CPU => sink("", &labels, cpu()),
        NODE_MEMORY => sink("", &labels, memory()),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, BTreeSet};

    use axum::body::to_bytes;
    use http::StatusCode;

    use super::*;
    use crate::sim::apps::{AppState, metrics_at, truth_json};
    use crate::sim::kubelet::render;
    use crate::sim::testutil::{START, app_state, app_state_with_cadvisor, get_text, promtool_dump};

    /// The sample names of [`FAMILIES`].
    const SERIES: [&str; 4] = [
        "container_cpu_usage_seconds_total",
        "container_memory_working_set_bytes",
        "node_cpu_usage_seconds_total",
        "node_memory_working_set_bytes",
    ];

    /// One sample of an exposition, its value and timestamp as written.
    #[derive(Debug, Clone, PartialEq)]
    struct Sample {
        name: String,
        labels: BTreeMap<String, String>,
        value: String,
        ts: Option<String>,
    }

    impl Sample {
        fn label(&self, key: &str) -> Option<&str> {
            self.labels.get(key).map(String::as_str)
        }

        fn number(&self) -> f64 {
            self.value.parse().unwrap()
        }
    }

    /// The samples of a text exposition or OpenMetrics body (no label value here holds `,`,
    /// `"` or `\`), without the `instance` and `job` labels.
    fn parse(body: &str) -> Vec<Sample> {
        let mut out = Vec::new();
        for line in body.lines().filter(|l| !l.starts_with('#')) {
            let (name, labels, rest) = match line.split_once('{') {
                Some((name, after)) => {
                    let (labels, rest) = after.split_once("} ").unwrap();
                    (name, labels, rest)
                }
                None => {
                    let (name, rest) = line.split_once(' ').unwrap();
                    (name, "", rest)
                }
            };
            assert!(!labels.contains('\\'), "{line}");
            let labels = labels
                .split(',')
                .filter(|kv| !kv.is_empty())
                .map(|kv| {
                    let (k, v) = kv.split_once('=').unwrap();
                    (k.to_owned(), v.strip_prefix('"').unwrap().strip_suffix('"').unwrap().to_owned())
                })
                .filter(|(k, _)| k != "instance" && k != "job")
                .collect();
            let mut fields = rest.split(' ');
            let value = fields.next().unwrap().to_owned();
            let ts = fields.next().map(str::to_owned);
            assert!(fields.next().is_none(), "{line}");
            out.push(Sample { name: name.to_owned(), labels, value, ts });
        }
        out
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// The `/metrics` body of `state` at `ts_ms` (a kubelet sample time), parsed: only the
    /// cAdvisor families.
    async fn metrics(state: &AppState, ts_ms: u64) -> Vec<Sample> {
        let response = metrics_at(state.clone(), ts_ms as f64 / 1000.0);
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let mut samples = parse(std::str::from_utf8(&body).unwrap());
        samples.retain(|s| SERIES.contains(&s.name.as_str()));
        samples
    }

    /// The one sample of `samples` named `name` with exactly `labels`.
    fn one<'a>(samples: &[&'a Sample], name: &str, labels: &BTreeMap<String, String>) -> &'a Sample {
        let found: Vec<&&Sample> = samples.iter().filter(|s| s.name == name && s.labels == *labels).collect();
        assert_eq!(found.len(), 1, "{name}{labels:?}");
        found[0]
    }

    fn is_hex64(s: &str) -> bool {
        s.len() == 64 && s.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }

    /// Checks that `samples` (cAdvisor series at `ts_ms`) hold, for node `index`, what its
    /// kubelet serves at `ts_ms` to the bit: the same started containers with the same CPU and
    /// memory, and the node's usage as its root cgroup and as `node_*`. Returns the kubelet's
    /// samples.
    fn assert_node_matches_kubelet(
        state: &AppState,
        samples: &[Sample],
        index: u32,
        ts_ms: u64,
    ) -> Vec<Sample> {
        let cluster = &state.cluster;
        let node = &cluster.nodes[index as usize];
        let kubelet = parse(&render(node, &cluster.pods_on(index), cluster.origin, ts_ms));
        let on_node: Vec<&Sample> = samples.iter().filter(|s| s.label("node") == Some(&node.name)).collect();
        let key = |s: &Sample| {
            let label = |k: &str| s.label(k).unwrap().to_owned();
            (label("namespace"), label("pod"), label("container"))
        };
        for (family, node_family) in [
            ("container_cpu_usage_seconds_total", "node_cpu_usage_seconds_total"),
            ("container_memory_working_set_bytes", "node_memory_working_set_bytes"),
        ] {
            let want: BTreeMap<_, String> =
                kubelet.iter().filter(|s| s.name == family).map(|s| (key(s), s.value.clone())).collect();
            let got: BTreeMap<_, String> = on_node
                .iter()
                .filter(|s| s.name == family && s.label("container").is_some_and(|c| c != "POD"))
                .map(|s| (key(s), s.value.clone()))
                .collect();
            assert!(!want.is_empty());
            assert_eq!(got, want, "{} {family} at {ts_ms}", node.name);
            let node_value = &kubelet.iter().find(|s| s.name == node_family).unwrap().value;
            let root = one(&on_node, family, &labels(&[("id", "/"), ("node", &node.name)]));
            assert_eq!(&root.value, node_value, "{} root cgroup {family} at {ts_ms}", node.name);
            let own = one(&on_node, node_family, &labels(&[("node", &node.name)]));
            assert_eq!(&own.value, node_value, "{} {node_family} at {ts_ms}", node.name);
        }
        kubelet
    }

    #[tokio::test]
    async fn metrics_match_the_kubelets() {
        let state = app_state_with_cadvisor();
        let cluster = &state.cluster;
        let origin = cluster.origin;
        let ts_ms = (START as u64 + 60) * 1000 + 1234;
        let t = ts_ms as f64 / 1000.0;
        let response = metrics_at(state.clone(), t);
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        let body = std::str::from_utf8(&body).unwrap();
        for (name, kind, help) in [
            ("container_cpu_usage_seconds_total", "counter", "Cumulative cpu time consumed in seconds."),
            ("container_memory_working_set_bytes", "gauge", "Current working set in bytes."),
            (
                "node_cpu_usage_seconds_total",
                "counter",
                "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            ),
            ("node_memory_working_set_bytes", "gauge", "[STABLE] Current working set of the node in bytes"),
        ] {
            assert!(body.contains(&format!("\n# HELP {name} {help}\n# TYPE {name} {kind}\n")), "{name}");
        }
        let samples = metrics(&state, ts_ms).await;
        let mut ids = BTreeSet::new();
        let mut expected = 0;
        for node in &cluster.nodes {
            let kubelet = assert_node_matches_kubelet(&state, &samples, node.index, ts_ms);
            let on_node: Vec<&Sample> =
                samples.iter().filter(|s| s.label("node") == Some(&node.name)).collect();
            expected += 4; // root cgroup cpu and memory, node cpu and memory
            for pod in cluster.pods_on(node.index).iter().filter(|p| p.is_running()) {
                let start = counter_origin(origin, pod.started());
                let (ns, name) = (pod.namespace.as_str(), pod.name.as_str());
                let cgroup = format!("/kubepods/burstable/pod{}", pod.uid);
                let of_pod: Vec<&Sample> = on_node
                    .iter()
                    .copied()
                    .filter(|s| s.label("namespace") == Some(ns) && s.label("pod") == Some(name))
                    .collect();
                // Every container has started: its series, the sandbox's and the cgroup's.
                assert!(pod.containers.iter().all(|c| (c.started as f64) <= t));
                expected += 2 * (pod.containers.len() + 2);
                assert_eq!(of_pod.len(), 2 * (pod.containers.len() + 2), "{name}");
                let kubelet_value = |family: &str, container: &str| {
                    kubelet
                        .iter()
                        .find(|s| {
                            s.name == family
                                && s.label("pod") == Some(name)
                                && s.label("namespace") == Some(ns)
                                && s.label("container") == Some(container)
                        })
                        .unwrap()
                        .number()
                };
                for (k, c) in pod.containers.iter().enumerate() {
                    let id = runtime_id(pod, Slot::Container(k));
                    assert!(is_hex64(&id));
                    assert!(ids.insert(id.clone()), "{id} twice");
                    let l = labels(&[
                        ("container", c.name),
                        ("id", &format!("{cgroup}/{id}")),
                        ("image", c.image),
                        ("name", &id),
                        ("namespace", ns),
                        ("node", &node.name),
                        ("pod", name),
                    ]);
                    one(&of_pod, "container_cpu_usage_seconds_total", &l);
                    one(&of_pod, "container_memory_working_set_bytes", &l);
                }
                let sandbox_id = runtime_id(pod, Slot::Sandbox);
                assert!(is_hex64(&sandbox_id) && ids.insert(sandbox_id.clone()));
                let sandbox = labels(&[
                    ("container", "POD"),
                    ("id", &format!("{cgroup}/{sandbox_id}")),
                    ("image", "registry.k8s.io/pause:3.9"),
                    ("name", &sandbox_id),
                    ("namespace", ns),
                    ("node", &node.name),
                    ("pod", name),
                ]);
                let sandbox_cpu = one(&of_pod, "container_cpu_usage_seconds_total", &sandbox).number();
                assert!((sandbox_cpu - 0.0001 * (t - start)).abs() < 1e-9, "{name}: {sandbox_cpu}");
                assert_eq!(one(&of_pod, "container_memory_working_set_bytes", &sandbox).value, "450560");
                let pod_cgroup =
                    labels(&[("id", &cgroup), ("namespace", ns), ("node", &node.name), ("pod", name)]);
                let cpu = one(&of_pod, "container_cpu_usage_seconds_total", &pod_cgroup).number();
                let containers_cpu: f64 = pod
                    .containers
                    .iter()
                    .map(|c| kubelet_value("container_cpu_usage_seconds_total", c.name))
                    .sum();
                assert!((cpu - containers_cpu - sandbox_cpu).abs() < 1e-8, "{name}: {cpu}");
                let memory = one(&of_pod, "container_memory_working_set_bytes", &pod_cgroup).number();
                let containers_memory: f64 = pod
                    .containers
                    .iter()
                    .map(|c| kubelet_value("container_memory_working_set_bytes", c.name))
                    .sum();
                assert_eq!(memory, containers_memory + 450_560.0, "{name}");
            }
        }
        // Nothing else: every series is a node's or a Running pod's.
        assert_eq!(samples.len(), expected);

        // The route serves them at request time.
        let (status, body) = get_text(&state, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.contains("\ncontainer_cpu_usage_seconds_total{container=\""));
        assert!(body.contains("\ncontainer_memory_working_set_bytes{id=\"/\",node=\"node-0\"} "));
        assert!(body.contains("\nnode_cpu_usage_seconds_total{node=\"node-2\"} "));
    }

    #[tokio::test]
    async fn without_the_flag_there_are_none() {
        let state = app_state();
        let origin = state.cluster.origin;
        let (_, metrics) = get_text(&state, "/metrics").await;
        let (_, history) = get_text(
            &state,
            &format!("/sim/history?start={}&end={}&step=15", origin + 600.0, origin + 660.0),
        )
        .await;
        for body in [metrics, history] {
            assert!(body.contains("http_requests_total{"));
            for line in body.lines() {
                let name = line.trim_start_matches("# HELP ").trim_start_matches("# TYPE ");
                assert!(!name.starts_with("container_") && !name.starts_with("node_"), "{line}");
            }
        }
    }

    /// Churns until a replacement pod has a sidecar (which starts a second after its main
    /// container); returns it.
    fn churn_to_a_sidecar(state: &AppState, at: f64) -> Arc<SimPod> {
        for k in 0..50 {
            let (_, fresh) = state.cluster.churn(at + f64::from(k)).unwrap();
            if fresh.containers.len() > 1 {
                return fresh;
            }
        }
        panic!("no replacement with a sidecar");
    }

    #[tokio::test]
    async fn series_follow_container_starts() {
        let state = app_state_with_cadvisor();
        let fresh = churn_to_a_sidecar(&state, START as f64 + 100.0);
        let (first, second) = (fresh.containers[0].started, fresh.containers[1].started);
        assert_eq!(second, first + 1);
        let sidecar = fresh.containers[1].name;
        let present = |samples: &[Sample], container: &str| {
            samples
                .iter()
                .any(|s| s.label("pod") == Some(&fresh.name) && s.label("container") == Some(container))
        };
        // Between the two starts only the main container has series, as on the kubelet; then
        // both.
        for (ts_ms, with_sidecar) in [(first as u64 * 1000 + 500, false), (second as u64 * 1000 + 500, true)]
        {
            let samples = metrics(&state, ts_ms).await;
            assert_node_matches_kubelet(&state, &samples, fresh.node, ts_ms);
            assert!(present(&samples, fresh.containers[0].name));
            assert!(present(&samples, "POD"));
            assert_eq!(present(&samples, sidecar), with_sidecar, "at {ts_ms}");
        }
        // The node's history across the churns is the kubelet's at every point.
        let (from, to) = (START - 30, second + 30);
        let (status, body) = get_text(&state, &format!("/sim/history?start={from}&end={to}&step=1")).await;
        assert_eq!(status, StatusCode::OK);
        let samples = parse(&body);
        for t in from..=to {
            let at: Vec<Sample> =
                samples.iter().filter(|s| s.ts.as_deref() == Some(&t.to_string())).cloned().collect();
            for node in &state.cluster.nodes {
                let node_only: Vec<Sample> = at
                    .iter()
                    .filter(|s| s.label("pod").is_none() && s.label("node") == Some(&node.name))
                    .cloned()
                    .collect();
                assert_eq!(node_only.len(), 4, "{} at {t}", node.name);
                let kubelet = parse(&render(
                    node,
                    &state.cluster.pods_on(node.index),
                    state.cluster.origin,
                    t as u64 * 1000,
                ));
                for (family, node_family) in [
                    ("container_cpu_usage_seconds_total", "node_cpu_usage_seconds_total"),
                    ("container_memory_working_set_bytes", "node_memory_working_set_bytes"),
                ] {
                    let want = &kubelet.iter().find(|s| s.name == node_family).unwrap().value;
                    for s in node_only.iter().filter(|s| s.name == family || s.name == node_family) {
                        assert_eq!(&s.value, want, "{}{:?} at {t}", s.name, s.labels);
                    }
                }
            }
        }
    }

    #[tokio::test]
    async fn history_has_the_kubelets_values_and_exact_rates() {
        let state = app_state_with_cadvisor();
        let cluster = &state.cluster;
        let origin = cluster.origin;
        let start = origin + 600.0;
        let end = start + 120.0;
        let (status, body) =
            get_text(&state, &format!("/sim/history?start={start}&end={end}&step=15&job=sim&instance=a:1"))
                .await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.ends_with("# EOF\n"));
        for family in [
            "container_cpu_usage_seconds counter",
            "container_memory_working_set_bytes gauge",
            "node_cpu_usage_seconds counter",
            "node_memory_working_set_bytes gauge",
        ] {
            assert!(body.contains(&format!("\n# TYPE {family}\n")), "{family}");
        }
        // Each family's samples follow its header, all together.
        let mut families = BTreeSet::new();
        let mut current = "";
        for line in body.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap();
                assert!(families.insert(current), "{current} twice");
            } else if !line.starts_with('#') {
                assert!(line.starts_with(current), "{line} outside {current}");
                assert!(
                    line.contains(",instance=\"a:1\",job=\"sim\"")
                        || line.contains("{instance=\"a:1\",job=\"sim\""),
                    "{line}"
                );
            }
        }
        let mut samples = parse(&body);
        samples.retain(|s| SERIES.contains(&s.name.as_str()));
        let at = |t: f64| -> Vec<Sample> {
            samples.iter().filter(|s| s.ts.as_deref() == Some(&t.to_string())).cloned().collect()
        };
        // At every point, what the kubelets serve then.
        let mut t = start;
        while t <= end {
            let now = at(t);
            for node in &cluster.nodes {
                assert_node_matches_kubelet(&state, &now, node.index, t as u64 * 1000);
            }
            t += 15.0;
        }
        // Two samples of a counter give exactly its rate: a container's, a node's.
        let (t1, t2) = (start + 30.0, start + 90.0);
        let (before, after) = (at(t1), at(t2));
        let value = |samples: &[Sample], name: &str, l: &BTreeMap<String, String>| {
            samples.iter().find(|s| s.name == name && s.labels == *l).unwrap().number()
        };
        let truth: serde_json::Value = serde_json::from_slice(&truth_json(cluster, t2)).unwrap();
        let cpu = "container_cpu_usage_seconds_total";
        let mut checked = 0;
        for s in before.iter().filter(|s| s.name == cpu && s.label("container").is_some_and(|c| c != "POD")) {
            let pod = truth["pods"]
                .as_array()
                .unwrap()
                .iter()
                .find(|p| {
                    p["name"] == s.label("pod").unwrap() && p["namespace"] == s.label("namespace").unwrap()
                })
                .unwrap();
            let container = pod["containers"]
                .as_array()
                .unwrap()
                .iter()
                .find(|c| c["name"] == s.label("container").unwrap())
                .unwrap();
            let rate = (value(&after, cpu, &s.labels) - s.number()) / (t2 - t1);
            let cores = container["cpuCores"].as_f64().unwrap();
            assert!((rate - cores).abs() < 1e-9, "{:?}: {rate} vs {cores}", s.labels);
            let memory = value(&after, "container_memory_working_set_bytes", &s.labels);
            assert_eq!(memory, container["memoryBytes"].as_f64().unwrap());
            checked += 1;
        }
        assert!(checked >= 10, "{checked}");
        for node in truth["nodes"].as_array().unwrap() {
            let l = labels(&[("node", node["name"].as_str().unwrap())]);
            let name = "node_cpu_usage_seconds_total";
            let rate = (value(&after, name, &l) - value(&before, name, &l)) / (t2 - t1);
            let cores = node["cpuCores"].as_f64().unwrap();
            assert!((rate - cores).abs() < 1e-9, "{l:?}: {rate} vs {cores}");
            assert_eq!(
                value(&after, "node_memory_working_set_bytes", &l),
                node["memoryBytes"].as_f64().unwrap()
            );
        }
    }

    #[tokio::test]
    async fn promtool_accepts_the_history() {
        let Some(dump) = promtool_dump(&app_state_with_cadvisor(), "cadvisor").await else { return };
        for name in SERIES.iter().chain(&["http_requests_total", "cafe_brews_total"]) {
            assert!(dump.contains(&format!("{{__name__=\"{name}\"")), "{name} missing from the blocks");
        }
        assert!(dump.contains("container=\"POD\""));
        assert!(dump.contains("id=\"/\""));
    }
}
