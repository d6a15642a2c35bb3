//! The simulated applications' metrics and the simulator's control endpoints, served over
//! plain HTTP (what a real Prometheus scrapes):
//!
//! - `GET /metrics`: every [`Exporter`]'s series at request time (text format 0.0.4);
//! - `GET /sim/history?start=&end=&step=&job=&instance=`: the same series as OpenMetrics
//!   samples over a range, for `promtool tsdb create-blocks-from openmetrics`;
//! - `GET /sim/truth`: the ground truth (pods with their node and usage, nodes with their
//!   usage as their kubelets report it, rates, cafes, and the Running pods each workload
//!   object selects) as JSON;
//! - `GET /sim/stats`: kubelet fetches per node and API requests per kind;
//! - `POST /sim/churn`: delete one running pod and create its replacement now.
//!
//! Exporters are pluggable: [`HTTP_REQUESTS`] (`http_requests_total`) and
//! [`cafe::EXPORTER`] (the cafe metric contract); more are added by writing an [`Exporter`]
//! and listing it in [`EXPORTERS`]. With `--cadvisor`, [`cadvisor::EXPORTER`] comes on top
//! ([`exporters`]): the series a real cluster's Prometheus has from the kubelets' cAdvisor and
//! `/metrics/resource` jobs (`container_cpu_usage_seconds_total`,
//! `container_memory_working_set_bytes`, `node_cpu_usage_seconds_total`,
//! `node_memory_working_set_bytes`), equal to what the kubelets serve, history included.
//!
//! An exporter writes series per Running pod and, optionally, per node: in each family's
//! section the pods' series come first, then the nodes' (one family's samples stay
//! contiguous, as OpenMetrics requires).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Json;
use axum::body::Body;
use axum::extract::{RawQuery, State};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures::StreamExt as _;
use http::{StatusCode, header};
use serde::Serialize;

use super::cadvisor;
use super::cafe::{self, Cafe, StepCurve, TEMPERATURE_STEP_SECONDS};
use super::cluster::{Cluster, now};
use super::controllers;
use super::kubelet::{self, cpu_seconds, working_set_bytes};
use super::objects::rfc3339;
use super::text::{push_go_float, push_label_value};
use super::workload::{SimNode, SimPod, counter_origin, linear};

/// How a simulated series' value depends on time.
#[derive(Debug, Clone, PartialEq)]
pub(super) enum SeriesValue {
    /// `rate × (t − start)`, 0 before `start`.
    Linear {
        /// Per second.
        rate: f64,
        /// Unix seconds.
        start: f64,
    },
    /// The unix time of the last whole event of a linear counter of events:
    /// `start + floor(rate × (t − start)) / rate` (`start` before the first one).
    LastEvent {
        /// Events per second.
        rate: f64,
        /// Unix seconds.
        start: f64,
    },
    /// A curve constant within steps of wall time.
    Steps(StepCurve),
    /// CPU seconds as a kubelet reports a sum of linear counters `(cores, start)`, in whole
    /// nanoseconds ([`kubelet::cpu_seconds`]). No sample before the first `start`.
    CpuSeconds(Arc<[(f64, f64)]>),
    /// A working set: the sum of the `(bytes, start)` started by `t`
    /// ([`kubelet::working_set_bytes`]). No sample before the first `start`.
    WorkingSet(Arc<[(f64, f64)]>),
}

impl SeriesValue {
    /// The value at unix time `t`.
    pub(super) fn at(&self, t: f64) -> f64 {
        match self {
            SeriesValue::Linear { rate, start } => linear(*rate, *start, t),
            SeriesValue::LastEvent { rate, start } if *rate > 0.0 => {
                start + linear(*rate, *start, t).floor() / rate
            }
            SeriesValue::LastEvent { start, .. } => *start,
            SeriesValue::Steps(curve) => curve.at(t),
            SeriesValue::CpuSeconds(terms) => cpu_seconds(terms.iter().copied(), t),
            SeriesValue::WorkingSet(terms) => working_set_bytes(terms.iter().copied(), t),
        }
    }

    /// Whether the series has a sample at `t`: a sum of usage terms once its first term has
    /// started (a container's series appear when it starts, as on a kubelet); the others
    /// always.
    pub(super) fn exists_at(&self, t: f64) -> bool {
        match self {
            SeriesValue::CpuSeconds(terms) | SeriesValue::WorkingSet(terms) => {
                terms.iter().any(|(_, start)| *start <= t)
            }
            SeriesValue::Linear { .. } | SeriesValue::LastEvent { .. } | SeriesValue::Steps(_) => true,
        }
    }
}

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum FamilyType {
    /// A counter: its samples are named `<name>_total`.
    Counter,
    /// A gauge.
    Gauge,
    /// A histogram: samples `<name>_bucket{le}`, `<name>_sum` and `<name>_count`.
    Histogram,
}

/// One metric family an exporter writes.
#[derive(Debug, Clone, Copy)]
pub(super) struct Family {
    /// OpenMetrics family name (without `_total`).
    pub name: &'static str,
    /// `# HELP` text.
    pub help: &'static str,
    /// Counter, gauge or histogram.
    pub kind: FamilyType,
}

impl Family {
    fn sample_name(&self) -> String {
        match self.kind {
            FamilyType::Counter => format!("{}_total", self.name),
            FamilyType::Gauge | FamilyType::Histogram => self.name.to_owned(),
        }
    }

    fn type_str(&self) -> &'static str {
        match self.kind {
            FamilyType::Counter => "counter",
            FamilyType::Gauge => "gauge",
            FamilyType::Histogram => "histogram",
        }
    }
}

/// Receives the series of one pod (or node), one call per series: the suffix appended to the
/// family's sample name (`""`, or `_bucket`, `_sum`, `_count` for a histogram), its labels
/// (sorted by name) and its value function. The series of one histogram come in exposition
/// order: the buckets by increasing `le` (`+Inf` last), then `_sum` and `_count`.
pub(super) type SeriesSink<'a> = dyn FnMut(&'static str, &[(&str, &str)], SeriesValue) + 'a;

/// Emits the series of family number `family` (an index into [`Exporter::families`]) for
/// `pod`, a Running pod whose counters start at unix time `start` ([`counter_origin`]).
pub(super) type PodSeries = fn(family: usize, pod: &SimPod, start: f64, sink: &mut SeriesSink<'_>);

/// Emits the series of family number `family` for `node`, which hosts `pods` (every pod
/// scheduled on it, in the order its kubelet lists them; Running or not), with counters from
/// the cluster's `origin`.
pub(super) type NodeSeries =
    fn(family: usize, node: &SimNode, pods: &[Arc<SimPod>], origin: f64, sink: &mut SeriesSink<'_>);

/// A simulated exporter: metric families with per-pod series and, optionally, per-node
/// series (written after the pods' in each family).
#[derive(Clone, Copy)]
pub(super) struct Exporter {
    /// The families it exports, in output order.
    pub families: &'static [Family],
    /// Its series of one pod.
    pub pod_series: PodSeries,
    /// Its series of one node, if it has any.
    pub node_series: Option<NodeSeries>,
}

/// `http_requests_total{code,namespace,pod}` of the pods with HTTP series.
pub(super) const HTTP_REQUESTS: Exporter = Exporter {
    families: &[Family {
        name: "http_requests",
        help: "Total number of HTTP requests by status code.",
        kind: FamilyType::Counter,
    }],
    pod_series: http_requests_series,
    node_series: None,
};

fn http_requests_series(_family: usize, pod: &SimPod, start: f64, sink: &mut SeriesSink<'_>) {
    let Some(http) = &pod.http else { return };
    for (code, rate) in http.series() {
        sink(
            "",
            &[("code", code), ("namespace", &pod.namespace), ("pod", &pod.name)],
            SeriesValue::Linear { rate, start },
        );
    }
}

/// The exporters `/metrics` and `/sim/history` serve, in output order.
pub(crate) const EXPORTERS: &[Exporter] = &[HTTP_REQUESTS, cafe::EXPORTER];

/// [`EXPORTERS`] and the cAdvisor series ([`cadvisor::EXPORTER`]).
pub(crate) const EXPORTERS_WITH_CADVISOR: &[Exporter] = &[HTTP_REQUESTS, cafe::EXPORTER, cadvisor::EXPORTER];

/// The exporters to serve: [`EXPORTERS`], with the cAdvisor series when `cadvisor`
/// (`--cadvisor`).
pub(crate) fn exporters(cadvisor: bool) -> &'static [Exporter] {
    if cadvisor { EXPORTERS_WITH_CADVISOR } else { EXPORTERS }
}

/// State of the metrics/control router.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) exporters: &'static [Exporter],
    /// Default `instance` label of `/sim/history` (the metrics listener's `host:port`).
    pub(crate) instance: String,
}

/// The router of the metrics/control listener.
pub(crate) fn router(state: AppState) -> axum::Router {
    axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/sim/history", get(history))
        .route("/sim/truth", get(truth))
        .route("/sim/stats", get(stats))
        .route("/sim/churn", post(churn))
        .with_state(state)
}

/// Pods rendered per body chunk: bounds memory per step of a streamed body.
const PODS_PER_CHUNK: usize = 1024;

/// Nodes rendered per body chunk (a node's series sum its pods').
const NODES_PER_CHUNK: usize = 64;

enum Step {
    Header(usize, usize),
    Pods(usize, usize, usize),
    Nodes(usize, usize, usize),
    Eof,
}

/// What one series contributes: its samples, at one time or over a range.
enum Mode {
    Now(f64),
    History { start: f64, end: f64, step: f64, job: String, instance: String },
}

/// What a body is rendered from.
struct Snapshot {
    /// The Running pods whose series are written.
    pods: Vec<Arc<SimPod>>,
    /// Every node with the pods scheduled on it, when an exporter writes node series (empty
    /// otherwise).
    nodes: Vec<(Arc<SimNode>, Vec<Arc<SimPod>>)>,
}

/// Appends `<suffix>{labels}` (the caller has written the family's sample name).
fn push_series_name(out: &mut String, suffix: &str, labels: &[(&str, &str)]) {
    out.push_str(suffix);
    out.push('{');
    for (i, (k, v)) in labels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(k);
        out.push_str("=\"");
        push_label_value(out, v);
        out.push('"');
    }
    out.push('}');
}

/// Appends the samples in `mode` of the series `emit` writes into its sink, whose sample name
/// is `name`.
fn push_series(out: &mut String, name: &str, mode: &Mode, emit: impl FnOnce(&mut SeriesSink<'_>)) {
    match mode {
        Mode::Now(t) => emit(&mut |suffix, labels, value| {
            if !value.exists_at(*t) {
                return;
            }
            out.push_str(name);
            push_series_name(out, suffix, labels);
            out.push(' ');
            push_go_float(out, value.at(*t));
            out.push('\n');
        }),
        Mode::History { start: from, end, step, job, instance } => {
            // OpenMetrics: the points of one metric (a label set, `le` aside) are consecutive
            // and in time order, each point with all its samples.
            let mut samples: Vec<(String, String, SeriesValue)> = Vec::new();
            emit(&mut |suffix, labels, value| {
                let mut all: Vec<(&str, &str)> = labels.to_vec();
                all.push(("instance", instance));
                all.push(("job", job));
                all.sort_by(|a, b| a.0.cmp(b.0));
                let mut head = name.to_owned();
                push_series_name(&mut head, suffix, &all);
                let mut metric = String::new();
                for (k, v) in all.iter().filter(|(k, _)| *k != "le") {
                    let _ = write!(metric, "{k}={v:?},");
                }
                samples.push((metric, head, value));
            });
            for group in samples.chunk_by(|a, b| a.0 == b.0) {
                let mut k = 0u64;
                loop {
                    let t = from + k as f64 * step;
                    if t > *end {
                        break;
                    }
                    for (_, head, value) in group.iter().filter(|(_, _, v)| v.exists_at(t)) {
                        out.push_str(head);
                        out.push(' ');
                        push_go_float(out, value.at(t));
                        let _ = writeln!(out, " {t}");
                    }
                    k += 1;
                }
            }
        }
    }
}

fn render_step(state: &AppState, snapshot: &Snapshot, mode: &Mode, step: &Step) -> String {
    let mut out = String::new();
    match step {
        Step::Header(e, f) => {
            let Some(family) = state.exporters.get(*e).and_then(|x| x.families.get(*f)) else {
                return out;
            };
            match mode {
                Mode::Now(_) => {
                    let name = family.sample_name();
                    let _ =
                        writeln!(out, "# HELP {name} {}\n# TYPE {name} {}", family.help, family.type_str());
                }
                Mode::History { .. } => {
                    let _ = writeln!(
                        out,
                        "# HELP {} {}\n# TYPE {} {}",
                        family.name,
                        family.help,
                        family.name,
                        family.type_str()
                    );
                }
            }
        }
        Step::Pods(e, f, chunk) => {
            let Some(exporter) = state.exporters.get(*e) else {
                return out;
            };
            let Some(family) = exporter.families.get(*f) else {
                return out;
            };
            let name = family.sample_name();
            let origin = state.cluster.origin;
            let lo = chunk * PODS_PER_CHUNK;
            let hi = (lo + PODS_PER_CHUNK).min(snapshot.pods.len());
            for pod in snapshot.pods.get(lo..hi).unwrap_or_default() {
                let start = counter_origin(origin, pod.started());
                push_series(&mut out, &name, mode, |sink| (exporter.pod_series)(*f, pod, start, sink));
            }
        }
        Step::Nodes(e, f, chunk) => {
            let Some(exporter) = state.exporters.get(*e) else {
                return out;
            };
            let (Some(family), Some(node_series)) = (exporter.families.get(*f), exporter.node_series) else {
                return out;
            };
            let name = family.sample_name();
            let origin = state.cluster.origin;
            let lo = chunk * NODES_PER_CHUNK;
            let hi = (lo + NODES_PER_CHUNK).min(snapshot.nodes.len());
            for (node, pods) in snapshot.nodes.get(lo..hi).unwrap_or_default() {
                push_series(&mut out, &name, mode, |sink| node_series(*f, node, pods, origin, sink));
            }
        }
        Step::Eof => out.push_str("# EOF\n"),
    }
    out
}

/// Streams the series of `state`'s exporters for `pods` (and, for the exporters with node
/// series, of every node) in `mode`: each family's header, then its pods' series chunk by
/// chunk, then its nodes'.
fn streamed(state: AppState, pods: Vec<Arc<SimPod>>, mode: Mode, content_type: &'static str) -> Response {
    let with_nodes = state.exporters.iter().any(|x| x.node_series.is_some());
    let nodes = if with_nodes {
        let cluster = &state.cluster;
        cluster.nodes.iter().map(|n| (Arc::clone(n), cluster.pods_on(n.index))).collect()
    } else {
        Vec::new()
    };
    let pod_chunks = pods.len().div_ceil(PODS_PER_CHUNK);
    let node_chunks = nodes.len().div_ceil(NODES_PER_CHUNK);
    let mut steps = Vec::new();
    for (e, exporter) in state.exporters.iter().enumerate() {
        for f in 0..exporter.families.len() {
            steps.push(Step::Header(e, f));
            steps.extend((0..pod_chunks).map(|c| Step::Pods(e, f, c)));
            if exporter.node_series.is_some() {
                steps.extend((0..node_chunks).map(|c| Step::Nodes(e, f, c)));
            }
        }
    }
    if matches!(mode, Mode::History { .. }) {
        steps.push(Step::Eof);
    }
    let snapshot = Snapshot { pods, nodes };
    let stream = futures::stream::iter(steps).map(move |step| {
        Ok::<_, std::convert::Infallible>(Bytes::from(render_step(&state, &snapshot, &mode, &step)))
    });
    ([(header::CONTENT_TYPE, content_type)], Body::from_stream(stream)).into_response()
}

fn running_pods(cluster: &Cluster) -> Vec<Arc<SimPod>> {
    let mut pods = cluster.all_pods();
    pods.retain(|p| p.is_running());
    pods
}

async fn metrics(State(state): State<AppState>) -> Response {
    metrics_at(state, now())
}

/// The `/metrics` response with the values at unix time `t`.
pub(crate) fn metrics_at(state: AppState, t: f64) -> Response {
    let pods = running_pods(&state.cluster);
    streamed(state, pods, Mode::Now(t), kubelet::TEXT_FORMAT)
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": message }))).into_response()
}

/// Most samples per series `/sim/history` renders.
const MAX_POINTS: f64 = 200_000.0;

async fn history(State(state): State<AppState>, RawQuery(query): RawQuery) -> Response {
    let params: BTreeMap<String, String> =
        url::form_urlencoded::parse(query.unwrap_or_default().as_bytes()).into_owned().collect();
    let number = |key: &str| -> Result<f64, String> {
        params
            .get(key)
            .ok_or_else(|| format!("missing query parameter {key:?}"))?
            .parse::<f64>()
            .map_err(|e| format!("query parameter {key:?}: {e}"))
            .and_then(|v| {
                if v.is_finite() { Ok(v) } else { Err(format!("query parameter {key:?} is not finite")) }
            })
    };
    let (start, end, step) = match (number("start"), number("end"), number("step")) {
        (Ok(a), Ok(b), Ok(c)) => (a, b, c),
        (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => return bad_request(e),
    };
    if step <= 0.0 || end < start {
        return bad_request("need step > 0 and end >= start".to_owned());
    }
    if (end - start) / step > MAX_POINTS {
        return bad_request(format!("more than {MAX_POINTS} points per series; increase step"));
    }
    let job = params.get("job").cloned().unwrap_or_else(|| "percolator-sim".to_owned());
    let instance = params.get("instance").cloned().unwrap_or_else(|| state.instance.clone());
    let origin = state.cluster.origin;
    let mut pods = running_pods(&state.cluster);
    // Only pods that were running over the whole range. Node series (`--cadvisor`) sum every
    // pod running now, each from its start: at any time of the range, what its kubelet
    // reports then (if no pod was deleted since).
    pods.retain(|p| counter_origin(origin, p.started()) <= start);
    let mode = Mode::History { start, end, step, job, instance };
    streamed(state, pods, mode, "application/openmetrics-text; version=1.0.0; charset=utf-8")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TruthNode<'a> {
    name: &'a str,
    address: String,
    /// Its CPU usage, as its kubelet's `node_cpu_usage_seconds_total` grows: its Running pods'
    /// started containers and the system's.
    cpu_cores: f64,
    /// Its working set, as its kubelet's `node_memory_working_set_bytes`: its Running pods'
    /// started containers and the system's.
    memory_bytes: f64,
    /// The part of `cpuCores` outside pods.
    system_cpu_cores: f64,
    /// The part of `memoryBytes` outside pods.
    system_memory_bytes: f64,
}

/// The truth of `node`, which hosts `pods`, at `t`.
fn truth_node<'a>(node: &'a SimNode, pods: &[Arc<SimPod>], origin: f64, t: f64) -> TruthNode<'a> {
    TruthNode {
        name: &node.name,
        address: node.ip.to_string(),
        cpu_cores: kubelet::node_cpu_terms(node, pods, origin)
            .filter(|(_, start)| *start <= t)
            .map(|(cores, _)| cores)
            .sum(),
        memory_bytes: working_set_bytes(kubelet::node_memory_terms(node, pods, origin), t),
        system_cpu_cores: node.system_cpu_cores,
        system_memory_bytes: node.system_memory_bytes,
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TruthContainer<'a> {
    name: &'a str,
    cpu_cores: f64,
    memory_bytes: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TruthPod<'a> {
    namespace: &'a str,
    name: &'a str,
    uid: &'a str,
    node: &'a str,
    phase: &'a str,
    labels: BTreeMap<&'a str, &'a str>,
    creation_timestamp: String,
    containers: Vec<TruthContainer<'a>>,
    requests_per_second: Option<f64>,
    errors_per_second: Option<f64>,
    /// Where this pod's counters start (`max(origin, pod start)`).
    counter_origin: f64,
}

#[derive(Serialize)]
struct TruthDuration {
    min: f64,
    max: f64,
    p50: f64,
    p95: f64,
    p99: f64,
}

#[derive(Serialize)]
struct TruthRange {
    min: f64,
    max: f64,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TruthCafe<'a> {
    namespace: &'a str,
    name: &'a str,
    #[serde(rename = "type")]
    type_: &'static str,
    /// Its running serving pods.
    pods: Vec<&'a str>,
    brews_per_minute: f64,
    failures_per_minute: f64,
    /// `failures / (brews + failures)`.
    failure_ratio: f64,
    duration: TruthDuration,
    /// The current step's value.
    temperature: f64,
    temperature_step_seconds: i64,
    temperature_step_start: i64,
    /// The lowest and highest temperature the curve ever takes.
    temperature_range: TruthRange,
    /// Unix seconds of the last completed brew (the latest over its pods).
    last_brewed: Option<f64>,
    cpu_cores: f64,
    memory_bytes: f64,
}

/// A workload object and the Running pods its selector selects.
#[derive(Serialize)]
struct TruthWorkload<'a> {
    /// `deployments.apps`, `replicasets.apps`, `statefulsets.apps`, `daemonsets.apps`,
    /// `services`.
    resource: String,
    namespace: &'a str,
    name: &'a str,
    /// Names, sorted.
    pods: Vec<&'a str>,
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct Truth<'a> {
    time: f64,
    origin: f64,
    housekeeping_seconds: f64,
    nodes: Vec<TruthNode<'a>>,
    pods: Vec<TruthPod<'a>>,
    cafes: Vec<TruthCafe<'a>>,
    workloads: Vec<TruthWorkload<'a>>,
}

/// The truth of `cafe` at `t`, served by the running pods among `pods`.
fn truth_cafe<'a>(cafe: &'a Cafe, pods: &[&'a SimPod], origin: f64, t: f64) -> TruthCafe<'a> {
    let serving: Vec<&SimPod> = pods
        .iter()
        .copied()
        .filter(|p| p.is_running() && p.cafe.as_ref().is_some_and(|c| c.name == cafe.name))
        .collect();
    let running = serving.len() as u32;
    // The nominal rates when every pod serves (no rounding), pro rata otherwise.
    let share = |v: f64| if running == cafe.pods { v } else { v * f64::from(running) / f64::from(cafe.pods) };
    let rate = cafe.brews_per_second_per_pod();
    let last_brewed = serving
        .iter()
        .map(|p| SeriesValue::LastEvent { rate, start: counter_origin(origin, p.started()) }.at(t))
        .reduce(f64::max);
    let containers = || serving.iter().flat_map(|p| p.containers.iter());
    let (temperature_min, temperature_max) = cafe.temperature.range();
    TruthCafe {
        namespace: &cafe.namespace,
        name: &cafe.name,
        type_: cafe.kind.as_str(),
        pods: serving.iter().map(|p| p.name.as_str()).collect(),
        brews_per_minute: share(cafe.brews_per_minute),
        failures_per_minute: share(cafe.failures_per_minute()),
        failure_ratio: cafe.failure_ratio(),
        duration: TruthDuration {
            min: cafe.duration_min,
            max: cafe.duration_max,
            p50: cafe.duration_quantile(0.5),
            p95: cafe.duration_quantile(0.95),
            p99: cafe.duration_quantile(0.99),
        },
        temperature: cafe.temperature.at(t),
        temperature_step_seconds: TEMPERATURE_STEP_SECONDS,
        temperature_step_start: StepCurve::step_start(t),
        temperature_range: TruthRange { min: temperature_min, max: temperature_max },
        last_brewed,
        cpu_cores: containers().map(|c| c.cpu_cores).sum(),
        memory_bytes: containers().map(|c| c.memory_bytes).sum(),
    }
}

/// The ground truth document at time `t`.
pub(crate) fn truth_json(cluster: &Cluster, t: f64) -> Vec<u8> {
    let (pods, workloads) = cluster.pods_and_controllers();
    let mut by_cafe: BTreeMap<(&str, &str), Vec<&SimPod>> = BTreeMap::new();
    for pod in &pods {
        if let Some(cafe) = &pod.cafe {
            by_cafe.entry((cafe.namespace.as_str(), cafe.name.as_str())).or_default().push(pod);
        }
    }
    let truth = Truth {
        time: t,
        origin: cluster.origin,
        housekeeping_seconds: cluster.housekeeping_ms as f64 / 1000.0,
        nodes: cluster
            .nodes
            .iter()
            .map(|n| truth_node(n, &cluster.pods_on(n.index), cluster.origin, t))
            .collect(),
        pods: pods
            .iter()
            .map(|p| {
                let running = p.is_running();
                let http = p.http.as_ref().filter(|_| running);
                TruthPod {
                    namespace: &p.namespace,
                    name: &p.name,
                    uid: &p.uid,
                    node: cluster.node_of(p).map_or("", |n| n.name.as_str()),
                    phase: p.phase.as_str(),
                    labels: p.labels().into_iter().collect(),
                    creation_timestamp: rfc3339(p.created),
                    containers: if running {
                        p.containers
                            .iter()
                            .map(|c| TruthContainer {
                                name: c.name,
                                cpu_cores: c.cpu_cores,
                                memory_bytes: c.memory_bytes,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    },
                    requests_per_second: http.map(|h| h.requests_per_second()),
                    errors_per_second: http.and_then(|h| h.errors_per_second()),
                    counter_origin: counter_origin(cluster.origin, p.started()),
                }
            })
            .collect(),
        cafes: cluster
            .cafes
            .iter()
            .map(|c| {
                let serving = by_cafe.get(&(c.namespace.as_str(), c.name.as_str()));
                truth_cafe(c, serving.map_or(&[][..], Vec::as_slice), cluster.origin, t)
            })
            .collect(),
        workloads: controllers::selections(
            &workloads,
            pods.iter().map(|p| p.as_ref()).filter(|p| p.is_running()),
        )
        .into_iter()
        .map(|(c, selected)| {
            let mut names: Vec<&str> = selected.iter().map(|p| p.name.as_str()).collect();
            names.sort_unstable();
            TruthWorkload {
                resource: c.resource.qualified(),
                namespace: &c.namespace,
                name: &c.name,
                pods: names,
            }
        })
        .collect(),
    };
    serde_json::to_vec(&truth).unwrap_or_default()
}

fn json_bytes(body: Vec<u8>) -> Response {
    ([(header::CONTENT_TYPE, "application/json")], body).into_response()
}

async fn truth(State(state): State<AppState>) -> Response {
    json_bytes(truth_json(&state.cluster, now()))
}

async fn stats(State(state): State<AppState>) -> Response {
    let cluster = &state.cluster;
    let fetches: BTreeMap<&str, u64> = cluster
        .nodes
        .iter()
        .zip(&cluster.stats.kubelet_fetches)
        .map(|(n, c)| (n.name.as_str(), c.load(Ordering::Relaxed)))
        .collect();
    let api = cluster.stats.api_requests.lock().map(|m| m.clone()).unwrap_or_default();
    let reviews: Vec<serde_json::Value> =
        cluster.stats.access_reviews.lock().map(|kept| kept.iter().cloned().collect()).unwrap_or_default();
    Json(serde_json::json!({
        "kubeletFetches": fetches,
        "apiRequests": api,
        "subjectAccessReviews": reviews,
    }))
    .into_response()
}

/// Result of a churn, as `POST /sim/churn` returns it.
pub(crate) fn churn_json(cluster: &Cluster) -> Option<serde_json::Value> {
    let (gone, fresh) = cluster.churn(now())?;
    let describe = |p: &SimPod| {
        serde_json::json!({
            "namespace": p.namespace,
            "name": p.name,
            "uid": p.uid,
            "node": cluster.node_of(p).map(|n| n.name.clone()),
            "resourceVersion": p.resource_version.to_string(),
        })
    };
    tracing::info!(deleted = %gone.name, created = %fresh.name, "churn");
    Some(serde_json::json!({ "deleted": describe(&gone), "created": describe(&fresh) }))
}

async fn churn(State(state): State<AppState>) -> Response {
    match churn_json(&state.cluster) {
        Some(v) => Json(v).into_response(),
        None => (StatusCode::CONFLICT, Json(serde_json::json!({ "error": "no running pod to churn" })))
            .into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::{app_state, get_text, promtool_dump};

    /// `GET /sim/truth`, parsed.
    async fn get_truth(state: &AppState) -> serde_json::Value {
        serde_json::from_str(&get_text(state, "/sim/truth").await.1).unwrap()
    }

    /// Whether a served `selector` (a `metav1.LabelSelector`, or a Service's map when
    /// `service`) selects a pod with `labels`: Kubernetes' rules, written out independently.
    fn selects(selector: &serde_json::Value, service: bool, labels: &serde_json::Value) -> bool {
        let has = |key: &str, value: &serde_json::Value| labels.get(key) == Some(value);
        if service {
            let map = selector.as_object();
            return map.is_some_and(|m| !m.is_empty() && m.iter().all(|(k, v)| has(k, v)));
        }
        let match_labels = selector["matchLabels"].as_object().into_iter().flatten().all(|(k, v)| has(k, v));
        let expressions = selector["matchExpressions"].as_array().into_iter().flatten().all(|e| {
            let value = labels.get(e["key"].as_str().unwrap());
            let listed = || e["values"].as_array().unwrap().iter().any(|v| Some(v) == value);
            match e["operator"].as_str().unwrap() {
                "In" => listed(),
                "NotIn" => !listed(),
                "Exists" => value.is_some(),
                "DoesNotExist" => value.is_none(),
                other => panic!("operator {other}"),
            }
        });
        match_labels && expressions
    }

    /// The truth's workloads by `(resource, namespace, name)`, each with its pods.
    fn truth_workloads(truth: &serde_json::Value) -> BTreeMap<(String, String, String), Vec<String>> {
        truth["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .map(|w| {
                let key = |k: &str| w[k].as_str().unwrap().to_owned();
                let pods =
                    w["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap().to_owned()).collect();
                ((key("resource"), key("namespace"), key("name")), pods)
            })
            .collect()
    }

    #[tokio::test]
    async fn truth_lists_what_each_workload_selects() {
        let state = app_state();
        let truth = get_truth(&state).await;
        let pods = truth["pods"].as_array().unwrap();
        let workloads = truth_workloads(&truth);
        let (_, objects) = state.cluster.pods_and_controllers();
        assert_eq!(workloads.len(), objects.len());
        let resources: std::collections::BTreeSet<&str> =
            workloads.keys().map(|(r, _, _)| r.as_str()).collect();
        assert_eq!(
            resources.into_iter().collect::<Vec<_>>(),
            ["daemonsets.apps", "deployments.apps", "replicasets.apps", "services", "statefulsets.apps"]
        );
        for object in &objects {
            let json = serde_json::to_value(&object.object).unwrap();
            let service = json["kind"] == "Service";
            let resource = match json["kind"].as_str().unwrap() {
                "Service" => "services".to_owned(),
                kind => format!("{}s.apps", kind.to_lowercase()),
            };
            let ns = json["metadata"]["namespace"].as_str().unwrap();
            let name = json["metadata"]["name"].as_str().unwrap();
            let mut expected: Vec<String> = pods
                .iter()
                .filter(|p| p["namespace"] == ns && p["phase"] == "Running")
                .filter(|p| selects(&json["spec"]["selector"], service, &p["labels"]))
                .map(|p| p["name"].as_str().unwrap().to_owned())
                .collect();
            expected.sort();
            let key = (resource, ns.to_owned(), name.to_owned());
            assert_eq!(workloads.get(&key), Some(&expected), "{key:?}");
            if matches!(name, "node-agent" | "headless-external") {
                assert!(expected.is_empty(), "{key:?}");
            }
        }
        // The StatefulSet: exactly the Running web and api pods with a tier.
        let mut tiered_total = 0;
        for ns in ["shop", "api", "default"] {
            let mut expected: Vec<&str> = pods
                .iter()
                .filter(|p| p["namespace"] == ns && p["phase"] == "Running")
                .filter(|p| {
                    p["labels"].get("tier").is_some()
                        && ["web", "api"].contains(&p["labels"]["app"].as_str().unwrap())
                })
                .map(|p| p["name"].as_str().unwrap())
                .collect();
            expected.sort_unstable();
            tiered_total += expected.len();
            let key = ("statefulsets.apps".to_owned(), ns.to_owned(), "tiered".to_owned());
            assert_eq!(workloads[&key], expected);
        }
        assert!(tiered_total > 0);
        // Every Running pod: its Deployment, ReplicaSet and Service select it.
        for pod in pods.iter().filter(|p| p["phase"] == "Running") {
            let (ns, name) = (pod["namespace"].as_str().unwrap(), pod["name"].as_str().unwrap());
            let labels = &pod["labels"];
            let deployment = labels.get("une-tasse-de.cafe/cafe").unwrap_or(&labels["app"]).as_str().unwrap();
            let replica_set = format!("{deployment}-{}", labels["pod-template-hash"].as_str().unwrap());
            for (resource, object) in [
                ("deployments.apps", deployment),
                ("services", deployment),
                ("replicasets.apps", replica_set.as_str()),
            ] {
                let key = (resource.to_owned(), ns.to_owned(), object.to_owned());
                assert!(workloads[&key].iter().any(|p| p == name), "{key:?} misses {name}");
            }
        }
        // Pods that are not Running are in no workload.
        for pod in pods.iter().filter(|p| p["phase"] != "Running") {
            let name = pod["name"].as_str().unwrap();
            assert!(workloads.values().all(|selected| !selected.iter().any(|p| p == name)), "{name}");
        }
    }

    #[tokio::test]
    async fn churn_keeps_workloads_consistent() {
        let state = app_state();
        let before_truth = truth_workloads(&get_truth(&state).await);
        let (_, before) = state.cluster.pods_and_controllers();
        for k in 0..10 {
            let (gone, fresh) = state.cluster.churn(1_764_000_100.0 + f64::from(k)).unwrap();
            let truth = truth_workloads(&get_truth(&state).await);
            assert_eq!(truth.keys().collect::<Vec<_>>(), before_truth.keys().collect::<Vec<_>>());
            let deployment = gone.app.as_str();
            for (resource, name) in [
                ("deployments.apps", deployment.to_owned()),
                ("services", deployment.to_owned()),
                ("replicasets.apps", gone.replica_set()),
            ] {
                let selected = &truth[&(resource.to_owned(), gone.namespace.clone(), name.clone())];
                assert!(
                    !selected.contains(&gone.name) && selected.contains(&fresh.name),
                    "{resource} {name}"
                );
            }
            assert!(truth.values().all(|selected| !selected.contains(&gone.name)));
        }
        // The objects are the same (same resourceVersions): a churn keeps the counts.
        let (pods, after) = state.cluster.pods_and_controllers();
        assert_eq!(after.len(), before.len());
        for (a, b) in after.iter().zip(&before) {
            assert_eq!(a.object, b.object, "{:?}", a.key());
        }
        for c in &after {
            if let controllers::Manifest::Deployment(d) = &c.object {
                let selected = pods.iter().filter(|p| c.selects(p)).count() as i32;
                assert_eq!(d.spec.as_ref().unwrap().replicas, Some(selected));
            }
        }
    }

    #[tokio::test]
    async fn history_matches_truth() {
        let state = app_state();
        let truth = get_truth(&state).await;
        let origin = truth["origin"].as_f64().unwrap();
        let start = origin + 600.0;
        let (status, body) = get_text(
            &state,
            &format!("/sim/history?start={start}&end={}&step=15&job=sim&instance=a:1", start + 60.0),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("# HELP http_requests "), "{body}");
        assert!(body.contains("# TYPE http_requests counter\n"));
        assert!(body.ends_with("# EOF\n"));
        // Sum the samples at `start + 30` per pod and compare with the truth's rates.
        let t = start + 30.0;
        let mut totals: BTreeMap<String, f64> = BTreeMap::new();
        let mut errors: BTreeMap<String, f64> = BTreeMap::new();
        for line in body.lines().filter(|l| l.starts_with("http_")) {
            let (series, rest) = line.split_once("} ").unwrap();
            let mut fields = rest.split(' ');
            let value: f64 = fields.next().unwrap().parse().unwrap();
            let ts: f64 = fields.next().unwrap().parse().unwrap();
            assert!(series.starts_with("http_requests_total{code=\""));
            assert!(series.contains(",instance=\"a:1\",job=\"sim\",namespace=\""));
            if ts != t {
                continue;
            }
            let pod = series.split("pod=\"").nth(1).unwrap().trim_end_matches('"').to_owned();
            *totals.entry(pod.clone()).or_default() += value;
            if series.contains("code=\"5") {
                *errors.entry(pod).or_default() += value;
            }
        }
        let mut checked = 0;
        for pod in truth["pods"].as_array().unwrap() {
            let name = pod["name"].as_str().unwrap();
            match pod["requestsPerSecond"].as_f64() {
                Some(rps) => {
                    let want = rps * (t - origin);
                    assert!((totals[name] - want).abs() < 1e-6 * want, "{name}");
                    match pod["errorsPerSecond"].as_f64() {
                        Some(eps) => assert!((errors[name] - eps * (t - origin)).abs() < 1e-6 * want),
                        None => assert!(!errors.contains_key(name)),
                    }
                    checked += 1;
                }
                None => assert!(!totals.contains_key(name), "{name} has series"),
            }
        }
        assert!(checked >= 5);
        let (status, _) = get_text(&state, "/sim/history?start=10&end=5&step=1").await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
    }

    /// The families of the default exporters, as `promtool tsdb dump` names their series.
    const DEFAULT_SERIES: [&str; 8] = [
        "http_requests_total",
        "cafe_brews_total",
        "cafe_brew_failures_total",
        "cafe_brew_duration_seconds_bucket",
        "cafe_brew_duration_seconds_sum",
        "cafe_brew_duration_seconds_count",
        "cafe_temperature_celsius",
        "cafe_last_brew_timestamp_seconds",
    ];

    #[tokio::test]
    async fn promtool_accepts_history() {
        let Some(dump) = promtool_dump(&app_state(), "default").await else { return };
        // Every family made it into the blocks, the histogram's samples included.
        for name in DEFAULT_SERIES {
            assert!(dump.contains(&format!("{{__name__=\"{name}\"")), "{name} missing from the blocks");
        }
        assert!(dump.contains("le=\"+Inf\""));
        assert!(!dump.contains("{__name__=\"container_") && !dump.contains("{__name__=\"node_"));
    }

    #[tokio::test]
    async fn metrics_lists_running_http_pods() {
        let state = app_state();
        let (status, body) = get_text(&state, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("# HELP http_requests_total "));
        assert!(body.contains("# TYPE http_requests_total counter\n"));
        let http: Vec<&str> = body.lines().filter(|l| l.starts_with("http_requests_total{")).collect();
        let cafe: Vec<&str> = body.lines().filter(|l| l.starts_with("cafe_")).collect();
        for pod in state.cluster.all_pods() {
            let label = format!("pod=\"{}\"", pod.name);
            let present = http.iter().any(|l| l.contains(&label));
            assert_eq!(present, pod.is_running() && pod.http.is_some(), "{}", pod.name);
            let cafe_series = cafe.iter().filter(|l| l.contains(&label)).count();
            // brews, 2 failure reasons, 11 buckets + sum + count, temperature, last brew.
            assert_eq!(cafe_series, if pod.cafe.is_some() { 18 } else { 0 }, "{}", pod.name);
        }
        for (name, kind) in [
            ("cafe_brews_total", "counter"),
            ("cafe_brew_failures_total", "counter"),
            ("cafe_brew_duration_seconds", "histogram"),
            ("cafe_temperature_celsius", "gauge"),
            ("cafe_last_brew_timestamp_seconds", "gauge"),
        ] {
            assert!(body.contains(&format!("\n# TYPE {name} {kind}\n")), "{name}");
        }
        let bucket = cafe.iter().find(|l| l.starts_with("cafe_brew_duration_seconds_bucket{")).unwrap();
        assert!(bucket.starts_with("cafe_brew_duration_seconds_bucket{cafe=\""), "{bucket}");
        assert!(bucket.contains(",le=\"5\",namespace=\""), "{bucket}");
        assert!(cafe.iter().any(|l| l.contains(",le=\"+Inf\",")));
        assert!(
            cafe.iter().any(|l| l.starts_with("cafe_brew_failures_total{") && l.contains("reason=\"grind\""))
        );
    }

    /// `/sim/history` samples: `(series name, labels without instance/job, timestamp) → value`.
    type Samples = BTreeMap<(String, BTreeMap<String, String>, i64), f64>;

    fn parse_history(body: &str) -> Samples {
        let mut out = Samples::new();
        for line in body.lines().filter(|l| l.starts_with("cafe_")) {
            let (head, rest) = line.split_once("} ").unwrap();
            let (name, labels) = head.split_once('{').unwrap();
            let labels: BTreeMap<String, String> = labels
                .split(',')
                .map(|kv| kv.split_once('=').unwrap())
                .filter(|(k, _)| *k != "instance" && *k != "job")
                .map(|(k, v)| (k.to_owned(), v.trim_matches('"').to_owned()))
                .collect();
            let mut fields = rest.split(' ');
            let value: f64 = fields.next().unwrap().parse().unwrap();
            let ts: f64 = fields.next().unwrap().parse().unwrap();
            assert!(out.insert((name.to_owned(), labels, (ts * 1000.0).round() as i64), value).is_none());
        }
        out
    }

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    /// Prometheus' `histogram_quantile` over cumulative `(le, count)` buckets (`+Inf` last).
    fn histogram_quantile(q: f64, buckets: &[(f64, f64)]) -> f64 {
        let total = buckets.last().unwrap().1;
        let rank = q * total;
        let i = buckets.iter().position(|(_, c)| *c >= rank).unwrap();
        if i == buckets.len() - 1 {
            return buckets[i - 1].0;
        }
        let (upper, count) = buckets[i];
        let (lower, below) = if i == 0 { (0.0, 0.0) } else { buckets[i - 1] };
        lower + (upper - lower) * (rank - below) / (count - below)
    }

    #[tokio::test]
    async fn cafe_history_matches_truth() {
        let state = app_state();
        let truth = get_truth(&state).await;
        let origin = truth["origin"].as_f64().unwrap();
        let cafes = truth["cafes"].as_array().unwrap();
        assert_eq!(cafes.len(), 6);
        let start = origin + 600.0;
        let (status, body) =
            get_text(&state, &format!("/sim/history?start={start}&end={}&step=15", start + 120.0)).await;
        assert_eq!(status, StatusCode::OK);
        for family in
            ["cafe_brews counter", "cafe_brew_failures counter", "cafe_brew_duration_seconds histogram"]
        {
            assert!(body.contains(&format!("\n# TYPE {family}\n")), "{family}");
        }
        let samples = parse_history(&body);
        let at = |name: &str, l: &BTreeMap<String, String>, t: f64| -> f64 {
            *samples
                .get(&(name.to_owned(), l.clone(), (t * 1000.0).round() as i64))
                .unwrap_or_else(|| panic!("no {name}{l:?} at {t}"))
        };
        let les = ["5", "10", "15", "20", "25", "30", "35", "40", "50", "60", "+Inf"];
        let mut temperatures = Vec::new();
        for cafe in cafes {
            let (name, ns, ty) = (
                cafe["name"].as_str().unwrap(),
                cafe["namespace"].as_str().unwrap(),
                cafe["type"].as_str().unwrap(),
            );
            let pods: Vec<&str> =
                cafe["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
            assert!((1..=3).contains(&pods.len()));
            let bpm = cafe["brewsPerMinute"].as_f64().unwrap();
            let fpm = cafe["failuresPerMinute"].as_f64().unwrap();
            assert!((2.0..=12.0).contains(&bpm));
            assert!(fpm <= 0.12 * bpm + 1e-12);
            let ratio = cafe["failureRatio"].as_f64().unwrap();
            assert!((ratio - fpm / (bpm + fpm)).abs() < 1e-12, "{name}");
            let d = &cafe["duration"];
            let (min, max) = (d["min"].as_f64().unwrap(), d["max"].as_f64().unwrap());
            for (q, key) in [(0.5, "p50"), (0.95, "p95"), (0.99, "p99")] {
                assert!((d[key].as_f64().unwrap() - (min + q * (max - min))).abs() < 1e-9, "{name} {key}");
            }
            let t = start + 60.0;
            let dt = t - origin;
            let (mut brews, mut failures) = (0.0, 0.0);
            let mut buckets = vec![0.0; les.len()];
            let mut temperature = None;
            for pod in &pods {
                let base = labels(&[("cafe", name), ("namespace", ns), ("pod", pod), ("type", ty)]);
                let count = at("cafe_brews_total", &base, t);
                // Linear from the origin, split evenly over the pods.
                assert!((count - bpm / 60.0 / pods.len() as f64 * dt).abs() < 1e-9 * count, "{name}/{pod}");
                let later = at("cafe_brews_total", &base, t + 60.0);
                assert!((later - count - bpm / pods.len() as f64).abs() < 1e-9 * later);
                brews += count;
                for reason in ["grind", "pressure"] {
                    let mut l = base.clone();
                    l.insert("reason".into(), reason.into());
                    let v = at("cafe_brew_failures_total", &l, t);
                    assert!(v >= 0.0);
                    failures += v;
                }
                let hist_count = at("cafe_brew_duration_seconds_count", &base, t);
                assert_eq!(hist_count, count);
                let mut previous = 0.0;
                for (k, le) in les.iter().enumerate() {
                    let mut l = base.clone();
                    l.insert("le".into(), (*le).into());
                    let v = at("cafe_brew_duration_seconds_bucket", &l, t);
                    assert!(v >= previous, "{name}/{pod} buckets must grow with le");
                    previous = v;
                    let bound: f64 = if *le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                    let cdf = ((bound - min) / (max - min)).clamp(0.0, 1.0);
                    assert!((v - count * cdf).abs() < 1e-9 * count, "{name}/{pod} le={le}");
                    buckets[k] += v;
                }
                assert_eq!(previous, count, "+Inf bucket = count");
                let sum = at("cafe_brew_duration_seconds_sum", &base, t);
                assert!((sum - count * (min + max) / 2.0).abs() < 1e-9 * sum);
                let temp = at("cafe_temperature_celsius", &base, t);
                assert_eq!(*temperature.get_or_insert(temp), temp, "pods of {name} disagree");
                let last = at("cafe_last_brew_timestamp_seconds", &base, t);
                let rate = bpm / 60.0 / pods.len() as f64;
                assert!(last <= t && last > t - 1.0 / rate - 1e-6, "{name}/{pod}: {last} at {t}");
                assert!((last - (origin + (rate * dt).floor() / rate)).abs() < 1e-6);
            }
            assert!((brews / dt * 60.0 - bpm).abs() < 1e-9 * bpm, "{name} brews/min");
            assert!((failures / dt * 60.0 - fpm).abs() < 1e-9 * bpm, "{name} failures/min");
            // histogram_quantile (linear within buckets) is exact for uniform durations whose
            // bounds are bucket bounds.
            let bounds: Vec<(f64, f64)> = les
                .iter()
                .map(|le| if *le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() })
                .zip(buckets)
                .collect();
            for key in ["p50", "p95", "p99"] {
                let q = key[1..].parse::<f64>().unwrap() / 100.0;
                let got = histogram_quantile(q, &bounds);
                assert!((got - d[key].as_f64().unwrap()).abs() < 1e-6, "{name} {key}: {got}");
            }
            temperatures.push(temperature.unwrap());
        }
        assert!(cafes.iter().any(|c| c["failuresPerMinute"] == 0.0));

        // At the truth's own time: the current temperature step and the last brew.
        let now = truth["time"].as_f64().unwrap();
        let (_, body) = get_text(&state, &format!("/sim/history?start={now}&end={now}&step=1")).await;
        let samples_now = parse_history(&body);
        let step_start = cafes[0]["temperatureStepStart"].as_f64().unwrap();
        assert!(step_start <= now && now < step_start + 30.0);
        for cafe in cafes {
            assert_eq!(cafe["temperatureStepSeconds"], 30);
            let name = cafe["name"].as_str().unwrap();
            let mut last_brewed = f64::MIN;
            let mut temps = Vec::new();
            for ((metric, l, _), v) in &samples_now {
                if l["cafe"] != name || l["namespace"] != cafe["namespace"].as_str().unwrap() {
                    continue;
                }
                match metric.as_str() {
                    "cafe_last_brew_timestamp_seconds" => last_brewed = last_brewed.max(*v),
                    "cafe_temperature_celsius" => temps.push(*v),
                    _ => {}
                }
            }
            // serde_json's default float parsing may be one ulp off.
            let truth_last = cafe["lastBrewed"].as_f64().unwrap();
            assert!((last_brewed - truth_last).abs() < 1e-6, "{name}: {last_brewed} vs {truth_last}");
            assert!(!temps.is_empty() && temps.iter().all(|t| *t == cafe["temperature"].as_f64().unwrap()));
            let range = &cafe["temperatureRange"];
            let t = cafe["temperature"].as_f64().unwrap();
            assert!(range["min"].as_f64().unwrap() <= t && t <= range["max"].as_f64().unwrap());
        }
        // Within one 30 s step the temperature is constant, whatever the scrape times.
        let (_, body) =
            get_text(&state, &format!("/sim/history?start={step_start}&end={}&step=1", step_start + 29.0))
                .await;
        let stepped = parse_history(&body);
        let mut per_series: BTreeMap<&BTreeMap<String, String>, Vec<f64>> = BTreeMap::new();
        for ((metric, l, _), v) in &stepped {
            if metric == "cafe_temperature_celsius" {
                per_series.entry(l).or_default().push(*v);
            }
        }
        assert!(!per_series.is_empty());
        for (l, values) in per_series {
            assert_eq!(values.len(), 30);
            assert!(values.iter().all(|v| *v == values[0]), "{l:?}: {values:?}");
        }
    }

    #[test]
    fn truth_nodes_carry_the_kubelets_usage() {
        let state = app_state();
        let cluster = &state.cluster;
        let ts = (crate::sim::testutil::START as u64 + 60) * 1000;
        let t = ts as f64 / 1000.0;
        let truth: serde_json::Value = serde_json::from_slice(&truth_json(cluster, t)).unwrap();
        let nodes = truth["nodes"].as_array().unwrap();
        assert_eq!(nodes.len(), cluster.nodes.len());
        for (node, json) in cluster.nodes.iter().zip(nodes) {
            assert_eq!(json["name"], node.name.as_str());
            // The kubelet's node series at two times: their rate and the working set.
            let kubelet_value = |ts: u64, name: &str| -> f64 {
                let body = kubelet::render(node, &cluster.pods_on(node.index), cluster.origin, ts);
                let line = body.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap();
                line.split(' ').nth(1).unwrap().parse().unwrap()
            };
            let rate = (kubelet_value(ts + 60_000, "node_cpu_usage_seconds_total")
                - kubelet_value(ts, "node_cpu_usage_seconds_total"))
                / 60.0;
            let cores = json["cpuCores"].as_f64().unwrap();
            assert!((rate - cores).abs() < 1e-9, "{}: {rate} vs {cores}", node.name);
            assert_eq!(
                json["memoryBytes"].as_f64().unwrap(),
                kubelet_value(ts, "node_memory_working_set_bytes")
            );
            // The pods' part is what the truth's pods on the node use.
            let on_node =
                truth["pods"].as_array().unwrap().iter().filter(|p| p["node"] == node.name.as_str());
            let (mut cpu, mut memory) = (json["systemCpuCores"].as_f64().unwrap(), 0.0);
            for pod in on_node {
                for c in pod["containers"].as_array().unwrap() {
                    cpu += c["cpuCores"].as_f64().unwrap();
                    memory += c["memoryBytes"].as_f64().unwrap();
                }
            }
            assert!((cpu - cores).abs() < 1e-9, "{}", node.name);
            assert_eq!(
                memory + json["systemMemoryBytes"].as_f64().unwrap(),
                json["memoryBytes"].as_f64().unwrap()
            );
        }
        for pod in truth["pods"].as_array().unwrap() {
            assert!(nodes.iter().any(|n| n["name"] == pod["node"]), "{pod}");
        }
    }

    #[tokio::test]
    async fn truth_lists_cafes_with_their_pods_and_usage() {
        let state = app_state();
        let truth = get_truth(&state).await;
        let pods = truth["pods"].as_array().unwrap();
        let mut in_band = 0;
        let mut out_of_band = 0;
        for cafe in truth["cafes"].as_array().unwrap() {
            let names: Vec<&str> =
                cafe["pods"].as_array().unwrap().iter().map(|p| p.as_str().unwrap()).collect();
            let serving: Vec<&serde_json::Value> = pods
                .iter()
                .filter(|p| {
                    p["namespace"] == cafe["namespace"]
                        && p["labels"]["une-tasse-de.cafe/cafe"] == cafe["name"]
                })
                .collect();
            assert_eq!(serving.len(), names.len());
            let (mut cpu, mut memory) = (0.0, 0.0);
            for pod in &serving {
                assert!(names.contains(&pod["name"].as_str().unwrap()));
                assert_eq!(pod["phase"], "Running");
                assert_eq!(pod["labels"]["app"], "cafe");
                assert!(pod["labels"]["pod-template-hash"].is_string());
                assert!(pod["requestsPerSecond"].is_null());
                for c in pod["containers"].as_array().unwrap() {
                    cpu += c["cpuCores"].as_f64().unwrap();
                    memory += c["memoryBytes"].as_f64().unwrap();
                }
            }
            assert!((cafe["cpuCores"].as_f64().unwrap() - cpu).abs() < 1e-9);
            assert_eq!(cafe["memoryBytes"].as_f64().unwrap(), memory);
            let range = &cafe["temperatureRange"];
            let (lo, hi) = (range["min"].as_f64().unwrap(), range["max"].as_f64().unwrap());
            if (60.0..=95.0).contains(&lo) && (60.0..=95.0).contains(&hi) {
                in_band += 1;
            } else if hi < 60.0 || lo > 95.0 {
                out_of_band += 1;
            }
        }
        assert!(in_band >= 1 && out_of_band >= 1);
    }
}
