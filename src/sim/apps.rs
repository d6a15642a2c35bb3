//! The simulated applications' metrics and the simulator's control endpoints, served over
//! plain HTTP (what a real Prometheus scrapes):
//!
//! - `GET /metrics`: every [`Exporter`]'s series at request time (text format 0.0.4);
//! - `GET /sim/history?start=&end=&step=&job=&instance=`: the same series as OpenMetrics
//!   samples over a range, for `promtool tsdb create-blocks-from openmetrics`;
//! - `GET /sim/truth`: the ground truth (pods, usage, rates) as JSON;
//! - `GET /sim/stats`: kubelet fetches per node and API requests per kind;
//! - `POST /sim/churn`: delete one running pod and create its replacement now.
//!
//! Exporters are pluggable: the HTTP-requests exporter is the first; more (cafes) are added
//! by implementing [`Exporter`] and listing it in [`default_exporters`].

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

use super::cluster::{Cluster, now};
use super::objects::rfc3339;
use super::text::{push_go_float, push_label_value};
use super::workload::{SimPod, counter_origin, linear};

/// How a simulated series' value depends on time.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum SeriesValue {
    /// `rate × (t − start)`, 0 before `start`.
    Linear {
        /// Per second.
        rate: f64,
        /// Unix seconds.
        start: f64,
    },
    /// Always the same value.
    Constant(f64),
}

impl SeriesValue {
    /// The value at unix time `t`.
    pub fn at(self, t: f64) -> f64 {
        match self {
            SeriesValue::Linear { rate, start } => linear(rate, start, t),
            SeriesValue::Constant(v) => v,
        }
    }
}

/// The type of a metric family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FamilyType {
    /// A counter: its samples are named `<name>_total`.
    Counter,
    /// A gauge.
    Gauge,
}

/// One metric family an exporter writes.
#[derive(Debug, Clone, Copy)]
pub struct Family {
    /// OpenMetrics family name (without `_total`).
    pub name: &'static str,
    /// `# HELP` text.
    pub help: &'static str,
    /// Counter or gauge.
    pub kind: FamilyType,
}

impl Family {
    fn sample_name(&self) -> String {
        match self.kind {
            FamilyType::Counter => format!("{}_total", self.name),
            FamilyType::Gauge => self.name.to_owned(),
        }
    }

    fn type_str(&self) -> &'static str {
        match self.kind {
            FamilyType::Counter => "counter",
            FamilyType::Gauge => "gauge",
        }
    }
}

/// Receives the series of one pod: its labels (sorted by name) and value function.
pub type SeriesSink<'a> = dyn FnMut(&[(&str, &str)], SeriesValue) + 'a;

/// A simulated application exporter: metric families with per-pod series.
pub trait Exporter: Send + Sync {
    /// The families it exports, in output order.
    fn families(&self) -> &'static [Family];

    /// Emits the series of family number `family` for `pod` (only called for Running pods).
    /// `origin` is the simulator's counter origin (unix seconds).
    fn pod_series(&self, family: usize, pod: &SimPod, origin: f64, sink: &mut SeriesSink<'_>);
}

/// `http_requests_total{code,namespace,pod}` of the pods with HTTP series.
#[derive(Debug, Default)]
pub struct HttpRequestsExporter;

const HTTP_FAMILIES: &[Family] = &[Family {
    name: "http_requests",
    help: "Total number of HTTP requests by status code.",
    kind: FamilyType::Counter,
}];

impl Exporter for HttpRequestsExporter {
    fn families(&self) -> &'static [Family] {
        HTTP_FAMILIES
    }

    fn pod_series(&self, _family: usize, pod: &SimPod, origin: f64, sink: &mut SeriesSink<'_>) {
        let Some(http) = &pod.http else { return };
        let start = counter_origin(origin, pod.started());
        for (code, rate) in http.series() {
            sink(
                &[("code", code), ("namespace", &pod.namespace), ("pod", &pod.name)],
                SeriesValue::Linear { rate, start },
            );
        }
    }
}

/// The exporters `/metrics` and `/sim/history` serve.
pub fn default_exporters() -> Vec<Box<dyn Exporter>> {
    vec![Box::new(HttpRequestsExporter)]
}

/// State of the metrics/control router.
#[derive(Clone)]
pub(crate) struct AppState {
    pub(crate) cluster: Arc<Cluster>,
    pub(crate) exporters: Arc<Vec<Box<dyn Exporter>>>,
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

enum Step {
    Header(usize, usize),
    Pods(usize, usize, usize),
    Eof,
}

/// What one pod contributes: its samples of one family, at one time or over a range.
enum Mode {
    Now(f64),
    History { start: f64, end: f64, step: f64, job: String, instance: String },
}

fn push_series_name(out: &mut String, name: &str, labels: &[(&str, &str)]) {
    out.push_str(name);
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

fn render_step(state: &AppState, pods: &[Arc<SimPod>], mode: &Mode, step: &Step) -> String {
    let mut out = String::new();
    match step {
        Step::Header(e, f) => {
            let Some(family) = state.exporters.get(*e).and_then(|x| x.families().get(*f)) else {
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
            let Some(family) = exporter.families().get(*f) else {
                return out;
            };
            let name = family.sample_name();
            let origin = state.cluster.origin;
            let lo = chunk * PODS_PER_CHUNK;
            let hi = (lo + PODS_PER_CHUNK).min(pods.len());
            for pod in pods.get(lo..hi).unwrap_or_default() {
                match mode {
                    Mode::Now(t) => exporter.pod_series(*f, pod, origin, &mut |labels, value| {
                        push_series_name(&mut out, &name, labels);
                        out.push(' ');
                        push_go_float(&mut out, value.at(*t));
                        out.push('\n');
                    }),
                    Mode::History { start, end, step, job, instance } => {
                        exporter.pod_series(*f, pod, origin, &mut |labels, value| {
                            let mut all: Vec<(&str, &str)> = labels.to_vec();
                            all.push(("instance", instance));
                            all.push(("job", job));
                            all.sort_by(|a, b| a.0.cmp(b.0));
                            let mut head = String::new();
                            push_series_name(&mut head, &name, &all);
                            let mut k = 0u64;
                            loop {
                                let t = start + k as f64 * step;
                                if t > *end {
                                    break;
                                }
                                out.push_str(&head);
                                out.push(' ');
                                push_go_float(&mut out, value.at(t));
                                let _ = writeln!(out, " {t}");
                                k += 1;
                            }
                        })
                    }
                }
            }
        }
        Step::Eof => out.push_str("# EOF\n"),
    }
    out
}

fn streamed(state: AppState, pods: Vec<Arc<SimPod>>, mode: Mode, content_type: &'static str) -> Response {
    let chunks = pods.len().div_ceil(PODS_PER_CHUNK);
    let mut steps = Vec::new();
    for (e, exporter) in state.exporters.iter().enumerate() {
        for f in 0..exporter.families().len() {
            steps.push(Step::Header(e, f));
            steps.extend((0..chunks).map(|c| Step::Pods(e, f, c)));
        }
    }
    if matches!(mode, Mode::History { .. }) {
        steps.push(Step::Eof);
    }
    let stream = futures::stream::iter(steps).map(move |step| {
        Ok::<_, std::convert::Infallible>(Bytes::from(render_step(&state, &pods, &mode, &step)))
    });
    ([(header::CONTENT_TYPE, content_type)], Body::from_stream(stream)).into_response()
}

fn running_pods(cluster: &Cluster) -> Vec<Arc<SimPod>> {
    let mut pods = cluster.all_pods();
    pods.retain(|p| p.is_running());
    pods
}

async fn metrics(State(state): State<AppState>) -> Response {
    let pods = running_pods(&state.cluster);
    let t = now();
    streamed(state, pods, Mode::Now(t), super::kubelet::TEXT_FORMAT)
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
    // Only pods that were running over the whole range.
    pods.retain(|p| counter_origin(origin, p.started()) <= start);
    let mode = Mode::History { start, end, step, job, instance };
    streamed(state, pods, mode, "application/openmetrics-text; version=1.0.0; charset=utf-8")
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct TruthNode<'a> {
    name: &'a str,
    address: String,
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
#[serde(rename_all = "camelCase")]
struct Truth<'a> {
    time: f64,
    origin: f64,
    housekeeping_seconds: f64,
    nodes: Vec<TruthNode<'a>>,
    pods: Vec<TruthPod<'a>>,
}

/// The ground truth document at time `t`.
pub(crate) fn truth_json(cluster: &Cluster, t: f64) -> Vec<u8> {
    let pods = cluster.all_pods();
    let truth = Truth {
        time: t,
        origin: cluster.origin,
        housekeeping_seconds: cluster.housekeeping_ms as f64 / 1000.0,
        nodes: cluster.nodes.iter().map(|n| TruthNode { name: &n.name, address: n.ip.to_string() }).collect(),
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
    Json(serde_json::json!({ "kubeletFetches": fetches, "apiRequests": api })).into_response()
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
    use crate::sim::workload::{Workload, WorkloadParams};
    use axum::body::to_bytes;
    use tower::ServiceExt as _;

    pub(crate) fn mk_state() -> AppState {
        let start = 1_764_000_000;
        let w = Workload::generate(
            &WorkloadParams {
                seed: 1,
                nodes: 3,
                pods_per_node: 4,
                namespaces: vec!["shop".into(), "api".into(), "default".into()],
            },
            start,
        );
        AppState {
            cluster: Arc::new(Cluster::new(w, 1, (start - 3600) as f64, 10_000, 10250)),
            exporters: Arc::new(default_exporters()),
            instance: "127.0.0.1:9999".into(),
        }
    }

    async fn get_text(state: &AppState, uri: &str) -> (StatusCode, String) {
        let response = router(state.clone())
            .oneshot(http::Request::get(uri).body(Body::empty()).unwrap())
            .await
            .unwrap();
        let status = response.status();
        let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, String::from_utf8(body.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn history_matches_truth() {
        let state = mk_state();
        let (_, truth) = get_text(&state, "/sim/truth").await;
        let truth: serde_json::Value = serde_json::from_str(&truth).unwrap();
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
        for line in body.lines().filter(|l| !l.starts_with('#')) {
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

    #[tokio::test]
    async fn promtool_accepts_history() {
        let promtool = std::path::Path::new("/usr/bin/promtool");
        if !promtool.exists() {
            eprintln!("skipped: no {}", promtool.display());
            return;
        }
        let state = mk_state();
        let origin = state.cluster.origin;
        let (status, body) = get_text(
            &state,
            &format!("/sim/history?start={}&end={}&step=15", origin + 60.0, origin + 3600.0),
        )
        .await;
        assert_eq!(status, StatusCode::OK);
        let dir = std::env::temp_dir().join(format!("percolator-sim-promtool-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("history.om");
        std::fs::write(&file, body).unwrap();
        let out = std::process::Command::new(promtool)
            .args(["tsdb", "create-blocks-from", "openmetrics"])
            .arg(&file)
            .arg(dir.join("tsdb"))
            .output()
            .unwrap();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    }

    #[tokio::test]
    async fn metrics_lists_running_http_pods() {
        let state = mk_state();
        let (status, body) = get_text(&state, "/metrics").await;
        assert_eq!(status, StatusCode::OK);
        assert!(body.starts_with("# HELP http_requests_total "));
        assert!(body.contains("# TYPE http_requests_total counter\n"));
        for pod in state.cluster.all_pods() {
            let present = body.contains(&format!("pod=\"{}\"", pod.name));
            assert_eq!(present, pod.is_running() && pod.http.is_some(), "{}", pod.name);
        }
    }
}
