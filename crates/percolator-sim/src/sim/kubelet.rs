//! Simulated kubelets: one HTTPS listener per node at `<InternalIP>:<kubelet port>` serving
//! `GET /metrics/resource` in the exact shape of a real kubelet (see
//! `fixtures/kubelet-metrics-resource.txt`), behind the service-account bearer token.
//!
//! Samples are taken at the node's housekeeping ticks (`period`, offset by a per-node
//! phase), like cAdvisor's: two fetches inside one period return the same timestamp and
//! values, each computed at that tick.

use std::convert::Infallible;
use std::fmt::Write as _;
use std::sync::Arc;

use axum::body::Body;
use bytes::Bytes;
use futures::StreamExt as _;
use http::{Request, Response, StatusCode, header};
use hyper::body::Incoming;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use super::cluster::{Cluster, now};
use super::faults::{KubeletFault, huge_padding};
use super::pki::Pki;
use super::serve::{Shutdown, accept_loop, serve_connection};
use super::text::{push_go_float, push_label_value};
use super::workload::{SimNode, SimPod, counter_origin, linear};

/// Content type of the Prometheus text format, as the kubelet sends it.
pub(crate) const TEXT_FORMAT: &str = "text/plain; version=0.0.4";

/// The sample time (ms since the epoch) of `node` at wall time `now_ms`: the last
/// housekeeping tick.
pub(crate) fn sample_time_ms(node: &SimNode, period_ms: u64, now_ms: u64) -> u64 {
    let phase = node.housekeeping_phase_ms % period_ms;
    let since = now_ms.saturating_sub(phase);
    since - since % period_ms + phase
}

/// `seconds` rounded to whole nanoseconds, as a kubelet derives it from
/// `usageCoreNanoSeconds` (keeps values short: `61.113554999`, not `61.11355499935151`).
fn nanos(seconds: f64) -> f64 {
    (seconds * 1e9).round() / 1e9
}

/// The CPU seconds at `t` of a sum of counters `(cores, start)` (each `cores × (t − start)`,
/// 0 before `start`), as a kubelet reports it: each counter rounded to whole nanoseconds,
/// then their sum. Every CPU value the simulator reports (the kubelets' and the cAdvisor
/// series', see `cadvisor`) is computed here, so the same counters give the same bits.
pub(crate) fn cpu_seconds(terms: impl IntoIterator<Item = (f64, f64)>, t: f64) -> f64 {
    nanos(terms.into_iter().map(|(cores, start)| nanos(linear(cores, start, t))).sum())
}

/// The working set at `t` of a sum of `(bytes, start)` terms: those started by `t`.
pub(crate) fn working_set_bytes(terms: impl IntoIterator<Item = (f64, f64)>, t: f64) -> f64 {
    terms.into_iter().filter(|(_, start)| *start <= t).map(|(bytes, _)| bytes).sum()
}

/// The CPU counters a kubelet sums into `node_cpu_usage_seconds_total` (see [`cpu_seconds`]):
/// every container of the node's Running `pods`, in order, then the system's (from the
/// node's creation). Each counts from its counter start (`max(origin, start)`), so at any
/// `t` after the origin the sum is what the kubelet reports at `t`, whichever containers
/// have started by then.
pub(crate) fn node_cpu_terms<'a>(
    node: &SimNode,
    pods: &'a [Arc<SimPod>],
    origin: f64,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    let system = (node.system_cpu_cores, counter_origin(origin, node.created));
    pods.iter()
        .filter(|p| p.is_running())
        .flat_map(move |p| p.containers.iter().map(move |c| (c.cpu_cores, counter_origin(origin, c.started))))
        .chain(std::iter::once(system))
}

/// The working sets a kubelet sums into `node_memory_working_set_bytes` (see
/// [`working_set_bytes`]): every container of the node's Running `pods` from its counter
/// start, then the system's (from the node's creation, like its CPU counter).
pub(crate) fn node_memory_terms<'a>(
    node: &SimNode,
    pods: &'a [Arc<SimPod>],
    origin: f64,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    let system = (node.system_memory_bytes, counter_origin(origin, node.created));
    pods.iter()
        .filter(|p| p.is_running())
        .flat_map(move |p| {
            p.containers.iter().map(move |c| (c.memory_bytes, counter_origin(origin, c.started)))
        })
        .chain(std::iter::once(system))
}

struct ContainerSample<'a> {
    pod: &'a SimPod,
    container: &'static str,
    cpu: f64,
    memory: f64,
    started: i64,
}

fn push_labels(out: &mut String, container: Option<&str>, pod: &SimPod) {
    out.push('{');
    if let Some(c) = container {
        out.push_str("container=\"");
        push_label_value(out, c);
        out.push_str("\",");
    }
    out.push_str("namespace=\"");
    push_label_value(out, &pod.namespace);
    out.push_str("\",pod=\"");
    push_label_value(out, &pod.name);
    out.push_str("\"}");
}

fn push_sample(out: &mut String, value: f64, ts_ms: Option<u64>) {
    out.push(' ');
    push_go_float(out, value);
    match ts_ms {
        Some(ts) => {
            let _ = writeln!(out, " {ts}");
        }
        None => out.push('\n'),
    }
}

/// The shape of a `/metrics/resource` body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// A current kubelet (1.29+): `[STABLE]` families with sample timestamps, start times,
    /// swap, `pod_*` series and `resource_scrape_error`.
    Current,
    /// An older kubelet: `[ALPHA]` help texts, no sample timestamps, no start times, swap or
    /// `pod_*` series, and `scrape_error` instead of `resource_scrape_error`.
    Old,
}

/// Renders the `/metrics/resource` body of `node` hosting `pods`, sampled at `ts_ms`.
#[cfg(test)]
pub(crate) fn render(node: &SimNode, pods: &[Arc<SimPod>], origin: f64, ts_ms: u64) -> String {
    render_as(Format::Current, node, pods, origin, ts_ms)
}

/// Renders the `/metrics/resource` body of `node` hosting `pods` in `format`, sampled at
/// `ts_ms` (the values are those of the sample either way).
pub(crate) fn render_as(
    format: Format,
    node: &SimNode,
    pods: &[Arc<SimPod>],
    origin: f64,
    ts_ms: u64,
) -> String {
    let old = format == Format::Old;
    let stamp = (!old).then_some(ts_ms);
    // Old kubelets tagged every family ALPHA.
    let help = |text: &'static str| -> std::borrow::Cow<'static, str> {
        if old { text.replace("[STABLE]", "[ALPHA]").into() } else { text.into() }
    };
    let t = ts_ms as f64 / 1000.0;
    let mut containers: Vec<ContainerSample<'_>> = Vec::with_capacity(pods.len() * 2);
    for pod in pods.iter().filter(|p| p.is_running()) {
        for c in pod.containers.iter().filter(|c| (c.started as f64) <= t) {
            containers.push(ContainerSample {
                pod,
                container: c.name,
                cpu: cpu_seconds([(c.cpu_cores, counter_origin(origin, c.started))], t),
                memory: c.memory_bytes,
                started: c.started,
            });
        }
    }
    // Pod totals, in pod order (containers of one pod are adjacent).
    let mut pod_totals: Vec<(&SimPod, f64, f64)> = Vec::with_capacity(pods.len());
    for s in &containers {
        match pod_totals.last_mut() {
            Some((p, cpu, mem)) if std::ptr::eq(*p, s.pod) => {
                *cpu += s.cpu;
                *mem += s.memory;
            }
            _ => pod_totals.push((s.pod, s.cpu, s.memory)),
        }
    }
    for total in &mut pod_totals {
        total.1 = nanos(total.1);
    }
    let node_cpu = cpu_seconds(node_cpu_terms(node, pods, origin), t);
    let node_mem = working_set_bytes(node_memory_terms(node, pods, origin), t);

    let mut out = String::with_capacity(1024 + containers.len() * 4 * 140 + pod_totals.len() * 3 * 120);
    let container_family = |out: &mut String,
                            name: &str,
                            help: &str,
                            kind: &str,
                            value: &dyn Fn(&ContainerSample<'_>) -> f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for s in &containers {
            out.push_str(name);
            push_labels(out, Some(s.container), s.pod);
            push_sample(out, value(s), stamp);
        }
    };
    container_family(
        &mut out,
        "container_cpu_usage_seconds_total",
        &help("[STABLE] Cumulative cpu time consumed by the container in core-seconds"),
        "counter",
        &|s| s.cpu,
    );
    container_family(
        &mut out,
        "container_memory_working_set_bytes",
        &help("[STABLE] Current working set of the container in bytes"),
        "gauge",
        &|s| s.memory,
    );
    if old {
        for (name, help, value) in [
            (
                "node_cpu_usage_seconds_total",
                "[ALPHA] Cumulative cpu time consumed by the node in core-seconds",
                node_cpu,
            ),
            ("node_memory_working_set_bytes", "[ALPHA] Current working set of the node in bytes", node_mem),
        ] {
            let kind = if name.ends_with("_total") { "counter" } else { "gauge" };
            let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
            out.push_str(name);
            push_sample(&mut out, value, None);
        }
        out.push_str(
            "# HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE scrape_error gauge\nscrape_error 0\n",
        );
        return out;
    }
    container_family(
        &mut out,
        "container_start_time_seconds",
        "[STABLE] Start time of the container since unix epoch in seconds",
        "gauge",
        &|s| s.started as f64,
    );
    container_family(
        &mut out,
        "container_swap_usage_bytes",
        "[ALPHA] Current amount of the container swap usage in bytes. Reported only on non-windows systems",
        "gauge",
        &|_| 0.0,
    );
    for (name, help, kind, value) in [
        (
            "node_cpu_usage_seconds_total",
            "[STABLE] Cumulative cpu time consumed by the node in core-seconds",
            "counter",
            node_cpu,
        ),
        (
            "node_memory_working_set_bytes",
            "[STABLE] Current working set of the node in bytes",
            "gauge",
            node_mem,
        ),
        (
            "node_swap_usage_bytes",
            "[ALPHA] Current swap usage of the node in bytes. Reported only on non-windows systems",
            "gauge",
            0.0,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        out.push_str(name);
        push_sample(&mut out, value, stamp);
    }
    for (name, help, kind, which) in [
        (
            "pod_cpu_usage_seconds_total",
            "[STABLE] Cumulative cpu time consumed by the pod in core-seconds",
            "counter",
            0,
        ),
        ("pod_memory_working_set_bytes", "[STABLE] Current working set of the pod in bytes", "gauge", 1),
        (
            "pod_swap_usage_bytes",
            "[ALPHA] Current amount of the pod swap usage in bytes. Reported only on non-windows systems",
            "gauge",
            2,
        ),
    ] {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
        for (pod, cpu, mem) in &pod_totals {
            out.push_str(name);
            push_labels(&mut out, None, pod);
            let value = match which {
                0 => *cpu,
                1 => *mem,
                _ => 0.0,
            };
            push_sample(&mut out, value, stamp);
        }
    }
    out.push_str(
        "# HELP resource_scrape_error [STABLE] 1 if there was an error while getting container metrics, 0 otherwise\n\
         # TYPE resource_scrape_error gauge\nresource_scrape_error 0\n",
    );
    out
}

fn text_response(status: StatusCode, body: &'static str) -> Response<Body> {
    let mut response = Response::new(Body::from(body));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Whether `request` carries `Authorization: Bearer <token>`.
pub(crate) fn has_token<B>(request: &Request<B>, token: &str) -> bool {
    request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .is_some_and(|t| t.trim() == token)
}

/// How much of the body a `stall`ing kubelet sends before it stops.
const STALL_BYTES: usize = 1024;

/// Chunk size of a streamed `huge` body.
const HUGE_CHUNK: usize = 64 * 1024;

/// A body that sends `first` and then fails, which makes hyper abort the response (HTTP/2
/// `RST_STREAM`, HTTP/1.1 connection closed mid-body).
fn aborted_body(first: Bytes) -> Body {
    let abort = async {
        // Let the status, headers and first bytes reach the client before the abort.
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "kubelet fault injection"))
    };
    let stream = futures::stream::once(async move { Ok(first) }).chain(futures::stream::once(abort));
    Body::from_stream(stream)
}

fn metrics_response(body: Body) -> Response<Body> {
    let mut response = Response::new(body);
    response.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static(TEXT_FORMAT));
    response
}

async fn handle(cluster: Arc<Cluster>, index: u32, request: Request<Incoming>) -> Response<Body> {
    if request.uri().path() == "/healthz" {
        return text_response(StatusCode::OK, "ok");
    }
    if !has_token(&request, &cluster.token) {
        return text_response(StatusCode::UNAUTHORIZED, "Unauthorized");
    }
    if request.uri().path() != "/metrics/resource" {
        return text_response(StatusCode::NOT_FOUND, "404 page not found\n");
    }
    if request.method() != http::Method::GET && request.method() != http::Method::HEAD {
        return text_response(StatusCode::METHOD_NOT_ALLOWED, "Method Not Allowed\n");
    }
    let Some(node) = cluster.nodes.get(index as usize) else {
        return text_response(StatusCode::NOT_FOUND, "404 page not found\n");
    };
    cluster.count_kubelet_fetch(index);
    let now_ms = (now() * 1000.0) as u64;
    let ts = sample_time_ms(node, cluster.housekeeping_ms, now_ms);
    let fault = cluster.faults.kubelet(index);
    let format = if fault == KubeletFault::OldFormat { Format::Old } else { Format::Current };
    let body = render_as(format, node, &cluster.pods_on(index), cluster.origin, ts);
    match fault {
        KubeletFault::Ok | KubeletFault::OldFormat => metrics_response(Body::from(body)),
        KubeletFault::Error500 => text_response(StatusCode::INTERNAL_SERVER_ERROR, "Internal Server Error\n"),
        // The connection task ends when the fault changes or the client goes away.
        KubeletFault::Hang => std::future::pending().await,
        KubeletFault::Stall => {
            let mut body = body.into_bytes();
            body.truncate(STALL_BYTES);
            let first = futures::stream::once(async move { Ok::<_, Infallible>(Bytes::from(body)) });
            metrics_response(Body::from_stream(first.chain(futures::stream::pending())))
        }
        // New connections are reset before the handshake (see `serve`); a request that still
        // arrives on an older connection has its response aborted.
        KubeletFault::Reset => metrics_response(aborted_body(Bytes::new())),
        KubeletFault::Truncate => {
            let full = body.len();
            let mut body = body.into_bytes();
            body.truncate(full / 2);
            let mut response = metrics_response(aborted_body(Bytes::from(body)));
            response.headers_mut().insert(header::CONTENT_LENGTH, http::HeaderValue::from(full));
            response
        }
        KubeletFault::Huge => {
            let padding = huge_padding();
            let chunks = (0..padding.len().div_ceil(HUGE_CHUNK)).map(move |i| {
                let end = ((i + 1) * HUGE_CHUNK).min(padding.len());
                Ok::<_, Infallible>(padding.slice(i * HUGE_CHUNK..end))
            });
            let stream = futures::stream::once(async move { Ok(Bytes::from(body)) })
                .chain(futures::stream::iter(chunks));
            metrics_response(Body::from_stream(stream))
        }
    }
}

/// Serves node `index`'s kubelet on `listener` until `shutdown`. In `reset`, open connections
/// are closed and new ones reset at once.
pub(crate) async fn serve(
    listener: TcpListener,
    index: u32,
    cluster: Arc<Cluster>,
    pki: Arc<Pki>,
    shutdown: Shutdown,
) {
    accept_loop(listener, shutdown, move |stream| {
        let cluster = Arc::clone(&cluster);
        let pki = Arc::clone(&pki);
        async move {
            let Some(node) = cluster.nodes.get(index as usize).cloned() else {
                return;
            };
            if cluster.faults.kubelet(index) == KubeletFault::Reset {
                // SO_LINGER 0: closing sends RST instead of FIN.
                let _ = stream.set_zero_linger();
                return;
            }
            let Some(mut changes) = cluster.faults.kubelet_changes(index) else {
                return;
            };
            let tls = match pki.kubelet_config(index, &node.name, node.ip) {
                Ok(tls) => tls,
                Err(e) => {
                    tracing::error!(error = %e, node = %node.name, "kubelet certificate");
                    return;
                }
            };
            let stream = match TlsAcceptor::from(tls).accept(stream).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::debug!(error = %e, "kubelet TLS handshake failed");
                    return;
                }
            };
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let cluster = Arc::clone(&cluster);
                async move { Ok::<_, Infallible>(handle(cluster, index, request).await) }
            });
            // Only `reset` needs the connection gone; other faults apply per request.
            tokio::select! {
                () = serve_connection(stream, service) => {}
                _ = changes.wait_for(|f| *f == KubeletFault::Reset) => {
                    tracing::debug!(node = %node.name, "kubelet fault: connection reset");
                }
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::{self, START};

    #[test]
    fn body_has_the_kubelet_shape() {
        let cluster = testutil::cluster(&testutil::params());
        let origin = cluster.origin;
        let node = &cluster.nodes[0];
        let pods = cluster.pods_on(0);
        let ts = sample_time_ms(node, 10_000, (START as u64 + 60) * 1000 + 1234);
        assert_eq!((ts - node.housekeeping_phase_ms) % 10_000, 0);
        assert!(ts <= (START as u64 + 60) * 1000 + 1234);
        let body = render(node, &pods, origin, ts);
        let t = ts as f64 / 1000.0;
        let mut seen = 0;
        let mut containers = 0;
        for line in body.lines() {
            if line.starts_with('#') {
                assert!(line.starts_with("# HELP ") || line.starts_with("# TYPE "), "{line}");
                if line.starts_with("# HELP ") {
                    assert!(line.contains("[STABLE]") || line.contains("[ALPHA]"), "{line}");
                }
                continue;
            }
            let (series, rest) = line
                .rsplit_once('}')
                .map_or_else(|| line.split_once(' ').unwrap(), |(s, r)| (s, r.trim_start()));
            let fields: Vec<&str> = rest.split(' ').collect();
            let value: f64 = fields[0].parse().unwrap();
            if series == "resource_scrape_error" {
                assert_eq!(fields.len(), 1);
                continue;
            }
            assert_eq!(fields[1].parse::<u64>().unwrap(), ts);
            if let Some(labels) = series.strip_prefix("container_cpu_usage_seconds_total{") {
                containers += 1;
                let parts: Vec<&str> = labels.split(',').collect();
                assert!(parts[0].starts_with("container=\""));
                assert!(parts[1].starts_with("namespace=\""));
                assert!(parts[2].starts_with("pod=\""));
                let pod_name = parts[2].trim_start_matches("pod=\"").trim_end_matches('"');
                let cname = parts[0].trim_start_matches("container=\"").trim_end_matches('"');
                let pod = pods.iter().find(|p| p.name == pod_name).unwrap();
                assert!(pod.is_running());
                let c = pod.containers.iter().find(|c| c.name == cname).unwrap();
                assert!((value - c.cpu_cores * (t - origin)).abs() < 1e-6);
            }
            seen += 1;
        }
        let running: usize = pods.iter().filter(|p| p.is_running()).map(|p| p.containers.len()).sum();
        assert_eq!(containers, running);
        assert!(seen > 0);
        assert!(body.ends_with("resource_scrape_error 0\n"));
        // Same tick, same body.
        assert_eq!(render(node, &pods, origin, ts), body);
    }
}
