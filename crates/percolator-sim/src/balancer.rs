//! A front balancing HTTP/2 streams over replicas of an aggregated API server ([`Balancer`]),
//! as kube-aggregator reaches an APIService's Service, for the rolling-restart tests
//! (issue 33).
//!
//! Clients talk to it over plain HTTP on a loopback port (HTTP/2 with prior knowledge, or
//! HTTP/1.1), several at once. Each request (each HTTP/2 stream) goes to the next replica in
//! rotation, round robin, over one long-lived TLS + HTTP/2 connection per replica, with the
//! front-proxy client certificate and the caller's identity in `X-Remote-User` /
//! `X-Remote-Group` (the client's own headers of those names, which stand for what the
//! aggregator authenticated, else the balancer's default identity); `Authorization` is not
//! forwarded.
//!
//! Why this is what a Service gives kube-aggregator: the endpoints controller lists a pod in
//! the Service's ready addresses while its readiness probe passes, and kube-aggregator with
//! `--enable-aggregator-routing` picks one of those addresses for each request (without it,
//! kube-proxy balances its connections over them, a coarser version of the same). Here every replica's `/readyz` is probed every
//! [`BalancerOptions::probe_interval`] (a probe times out after one second, the kubelet's
//! default); one failure or refusal takes the replica out of rotation, one success puts it
//! back (`failureThreshold` and `successThreshold` 1). Requests already sent to a replica that
//! leaves the rotation run to their end on its connection. A replica that is gone, a broken
//! connection or a failed request is never retried elsewhere: the client gets the error (a
//! `502`, or `503` when no replica is in rotation), so a test counting failed requests sees
//! every loss a real front would cause.

use std::convert::Infallible;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::header::{self, HeaderName};
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::SendRequest;
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::ServerName;
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;

/// How long a readiness probe may take (the kubelet's default `timeoutSeconds`).
const PROBE_TIMEOUT: Duration = Duration::from_secs(1);
/// How long connecting to a replica (TCP, TLS and HTTP/2 handshakes) may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Errors starting a [`Balancer`].
#[derive(Debug, thiserror::Error)]
pub enum BalancerError {
    /// The certificates or the TLS configuration are unusable.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// A replica address is not `https://host:port`.
    #[error("replica {0:?} is not an https://host:port URL")]
    Replica(String),
    /// The listener could not be bound.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// What a [`Balancer`] fronts and how.
#[derive(Debug, Clone)]
pub struct BalancerOptions {
    /// The replicas, `https://host:port` each.
    pub replicas: Vec<String>,
    /// PEM of the CA (or self-signed certificate) the replicas' serving certificates verify
    /// against.
    pub ca_pem: Vec<u8>,
    /// PEM of the front-proxy client certificate (chain).
    pub client_cert_pem: Vec<u8>,
    /// PEM of its private key.
    pub client_key_pem: Vec<u8>,
    /// `X-Remote-User` of requests that carry none.
    pub default_user: String,
    /// `X-Remote-Group`s of requests that carry no `X-Remote-User`.
    pub default_groups: Vec<String>,
    /// How often each replica's `/readyz` is probed.
    pub probe_interval: Duration,
}

/// One change of a replica's place in the rotation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RotationChange {
    /// When the probe that changed it completed.
    pub at: Instant,
    /// The replica (index in [`BalancerOptions::replicas`]).
    pub replica: usize,
    /// Whether it is now in rotation.
    pub ready: bool,
}

/// A running balancer; stops when dropped.
pub struct Balancer {
    url: String,
    shared: Arc<Shared>,
    _tasks: JoinSet<()>,
}

impl std::fmt::Debug for Balancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Balancer").field("url", &self.url).finish_non_exhaustive()
    }
}

struct Shared {
    upstreams: Vec<Upstream>,
    tls: tokio_rustls::TlsConnector,
    default_user: HeaderValue,
    default_groups: Vec<HeaderValue>,
    next: AtomicUsize,
    changes: Mutex<Vec<RotationChange>>,
}

struct Upstream {
    authority: String,
    host: ServerName<'static>,
    ready: AtomicBool,
    connection: tokio::sync::Mutex<Option<SendRequest<Body>>>,
    sent: AtomicU64,
    last_probe_error: Mutex<String>,
}

impl Balancer {
    /// Binds a loopback port, starts probing the replicas (none is in rotation before its
    /// first successful probe) and serves.
    ///
    /// # Errors
    /// Unusable certificates, a malformed replica URL, or a port that cannot be bound.
    pub async fn start(options: BalancerOptions) -> Result<Self, BalancerError> {
        let mut config =
            crate::pki::client_config(&options.ca_pem, &options.client_cert_pem, &options.client_key_pem)
                .map_err(BalancerError::Tls)?;
        config.alpn_protocols = vec![b"h2".to_vec()];
        let mut upstreams = Vec::new();
        for replica in &options.replicas {
            let authority = replica
                .strip_prefix("https://")
                .map(|a| a.trim_end_matches('/'))
                .ok_or_else(|| BalancerError::Replica(replica.clone()))?;
            let parsed = authority
                .parse::<http::uri::Authority>()
                .ok()
                .filter(|a| a.port_u16().is_some())
                .ok_or_else(|| BalancerError::Replica(replica.clone()))?;
            let host = parsed.host().trim_start_matches('[').trim_end_matches(']').to_owned();
            let host = ServerName::try_from(host).map_err(|_| BalancerError::Replica(replica.clone()))?;
            upstreams.push(Upstream {
                authority: authority.to_owned(),
                host,
                ready: AtomicBool::new(false),
                connection: tokio::sync::Mutex::new(None),
                sent: AtomicU64::new(0),
                last_probe_error: Mutex::new(String::new()),
            });
        }
        let header = |v: &str| HeaderValue::from_str(v).map_err(|e| BalancerError::Tls(e.to_string()));
        let shared = Arc::new(Shared {
            upstreams,
            tls: tokio_rustls::TlsConnector::from(Arc::new(config)),
            default_user: header(&options.default_user)?,
            default_groups: options.default_groups.iter().map(|g| header(g)).collect::<Result<_, _>>()?,
            next: AtomicUsize::new(0),
            changes: Mutex::new(Vec::new()),
        });
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let url = format!("http://{}", listener.local_addr()?);
        let mut tasks = JoinSet::new();
        for index in 0..shared.upstreams.len() {
            tasks.spawn(probe_loop(Arc::clone(&shared), index, options.probe_interval));
        }
        tasks.spawn(accept_loop(listener, Arc::clone(&shared)));
        Ok(Self { url, shared, _tasks: tasks })
    }

    /// The URL clients send their requests to, `http://127.0.0.1:P`.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Whether each replica is in rotation now.
    pub fn in_rotation(&self) -> Vec<bool> {
        self.shared.upstreams.iter().map(|u| u.ready.load(Ordering::SeqCst)).collect()
    }

    /// Requests sent to each replica so far (probes not counted).
    pub fn sent(&self) -> Vec<u64> {
        self.shared.upstreams.iter().map(|u| u.sent.load(Ordering::Relaxed)).collect()
    }

    /// The last failed probe of each replica (empty when none failed yet).
    pub fn last_probe_errors(&self) -> Vec<String> {
        self.shared
            .upstreams
            .iter()
            .map(|u| u.last_probe_error.lock().map(|e| e.clone()).unwrap_or_default())
            .collect()
    }

    /// Every change of the rotation so far, in order.
    pub fn rotation_changes(&self) -> Vec<RotationChange> {
        self.shared.changes.lock().map(|c| c.clone()).unwrap_or_default()
    }

    /// Waits (up to `within`) until every replica is in rotation; whether they are.
    pub async fn wait_all_ready(&self, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            if self.in_rotation().iter().all(|r| *r) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        false
    }
}

/// Probes replica `index` every `interval`, moving it in and out of rotation.
async fn probe_loop(shared: Arc<Shared>, index: usize, interval: Duration) {
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(upstream) = shared.upstreams.get(index) else { return };
        let outcome = tokio::time::timeout(PROBE_TIMEOUT, probe(&shared, upstream))
            .await
            .unwrap_or_else(|_| Err("/readyz: no answer within 1s".to_owned()));
        let ok = outcome.is_ok();
        if let Err(e) = outcome
            && let Ok(mut last) = upstream.last_probe_error.lock()
        {
            *last = e;
        }
        if !ok {
            // A fresh connection for the next probe: this one may be broken or draining.
            *upstream.connection.lock().await = None;
        }
        if upstream.ready.swap(ok, Ordering::SeqCst) != ok {
            tracing::info!(replica = %upstream.authority, ready = ok, "rotation changed");
            if let Ok(mut changes) = shared.changes.lock() {
                changes.push(RotationChange { at: Instant::now(), replica: index, ready: ok });
            }
        }
    }
}

/// One `GET /readyz`: `Ok` when it answered 200, else what happened.
async fn probe(shared: &Shared, upstream: &Upstream) -> Result<(), String> {
    let mut sender = connection(shared, upstream).await?;
    let uri = format!("https://{}/readyz", upstream.authority).parse::<Uri>().map_err(|e| e.to_string())?;
    let mut request = Request::new(Body::empty());
    *request.uri_mut() = uri;
    // The connection presents the front-proxy certificate, so the request names a user (the
    // default identity): a front-proxy certificate without one is a 401.
    request.headers_mut().insert("x-remote-user", shared.default_user.clone());
    let response = sender.send_request(request).await.map_err(|e| format!("/readyz: {e}"))?;
    let status = response.status();
    // Read the body so the stream ends cleanly.
    let _ = axum::body::to_bytes(Body::new(response.into_body()), 1 << 20).await;
    if status == StatusCode::OK { Ok(()) } else { Err(format!("/readyz answered {status}")) }
}

/// The replica's HTTP/2 connection, opened when there is none or it has closed.
async fn connection(shared: &Shared, upstream: &Upstream) -> Result<SendRequest<Body>, String> {
    let mut slot = upstream.connection.lock().await;
    if let Some(sender) = slot.as_ref()
        && !sender.is_closed()
    {
        return Ok(sender.clone());
    }
    let connect = async {
        let tcp = TcpStream::connect(&upstream.authority).await.map_err(|e| e.to_string())?;
        let _ = tcp.set_nodelay(true);
        let tls = shared.tls.connect(upstream.host.clone(), tcp).await.map_err(|e| e.to_string())?;
        let (sender, connection) =
            hyper::client::conn::http2::handshake(TokioExecutor::new(), TokioIo::new(tls))
                .await
                .map_err(|e| e.to_string())?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "replica connection ended");
            }
        });
        Ok::<_, String>(sender)
    };
    let sender =
        tokio::time::timeout(CONNECT_TIMEOUT, connect).await.map_err(|_| "connect timeout".to_owned())??;
    *slot = Some(sender.clone());
    Ok(sender)
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let _ = stream.set_nodelay(true);
        let shared = Arc::clone(&shared);
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |request: Request<Incoming>| {
                let shared = Arc::clone(&shared);
                async move { Ok::<_, Infallible>(forward(&shared, request).await) }
            });
            let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            if let Err(e) = builder.serve_connection(TokioIo::new(stream), service).await {
                tracing::debug!(error = %e, "client connection ended with an error");
            }
        });
    }
}

/// Headers a proxy never forwards (RFC 9110 §7.6.1), plus the client's credentials.
fn dropped(name: &HeaderName) -> bool {
    matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "proxy-authenticate"
            | "proxy-authorization"
            | "te"
            | "trailer"
            | "transfer-encoding"
            | "upgrade"
            | "host"
            | "authorization"
    )
}

fn plain(status: StatusCode, message: &str) -> Response<Body> {
    let mut response = Response::new(Body::from(message.to_owned()));
    *response.status_mut() = status;
    response.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    response
}

/// Sends `request` to the next replica in rotation; its answer, or the balancer's error.
async fn forward(shared: &Shared, request: Request<Incoming>) -> Response<Body> {
    let ready: Vec<&Upstream> = shared.upstreams.iter().filter(|u| u.ready.load(Ordering::SeqCst)).collect();
    if ready.is_empty() {
        return plain(StatusCode::SERVICE_UNAVAILABLE, "balancer: no replica in rotation");
    }
    let upstream = ready[shared.next.fetch_add(1, Ordering::Relaxed) % ready.len()];
    upstream.sent.fetch_add(1, Ordering::Relaxed);
    let (parts, body) = request.into_parts();
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("https://{}{path}", upstream.authority).parse::<Uri>() else {
        return plain(StatusCode::BAD_REQUEST, "balancer: invalid request path");
    };
    let mut headers = HeaderMap::new();
    for (name, value) in &parts.headers {
        if !dropped(name) {
            headers.append(name.clone(), value.clone());
        }
    }
    if !headers.contains_key("x-remote-user") {
        headers.insert("x-remote-user", shared.default_user.clone());
        headers.remove("x-remote-group");
        for group in &shared.default_groups {
            headers.append("x-remote-group", group.clone());
        }
    }
    let mut upstream_request = Request::new(Body::new(body));
    *upstream_request.method_mut() = parts.method;
    *upstream_request.uri_mut() = uri;
    *upstream_request.headers_mut() = headers;
    let mut sender = match connection(shared, upstream).await {
        Ok(sender) => sender,
        Err(e) => return plain(StatusCode::BAD_GATEWAY, &format!("balancer: {}: {e}", upstream.authority)),
    };
    match sender.send_request(upstream_request).await {
        Ok(response) => {
            let (mut parts, body) = response.into_parts();
            for name in ["connection", "keep-alive", "transfer-encoding", "upgrade"] {
                parts.headers.remove(name);
            }
            parts.version = http::Version::default();
            Response::from_parts(parts, Body::new(body))
        }
        Err(e) => plain(StatusCode::BAD_GATEWAY, &format!("balancer: {}: {e}", upstream.authority)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn malformed_replicas_are_refused() {
        apiserver::install_crypto_provider();
        let ca = crate::pki::Ca::new("balancer-test-ca").unwrap();
        let client = ca.leaf("u", Vec::new(), rcgen::ExtendedKeyUsagePurpose::ClientAuth, |_| {}).unwrap();
        let options = |replica: &str| BalancerOptions {
            replicas: vec![replica.to_owned()],
            ca_pem: ca.pem.clone().into_bytes(),
            client_cert_pem: client.pem.clone().into_bytes(),
            client_key_pem: client.key_pem.clone().into_bytes(),
            default_user: "u".into(),
            default_groups: vec![],
            probe_interval: Duration::from_secs(1),
        };
        for bad in ["http://127.0.0.1:1", "https://127.0.0.1", "127.0.0.1:1"] {
            let err = Balancer::start(options(bad)).await.unwrap_err();
            assert_eq!(err.to_string(), format!("replica {bad:?} is not an https://host:port URL"));
        }
        let balancer = Balancer::start(options("https://127.0.0.1:1")).await.unwrap();
        assert_eq!(balancer.in_rotation(), [false]);
        // Nothing in rotation (nothing listens on port 1): 503 from the balancer itself.
        let response = reqwest::get(format!("{}/apis", balancer.url())).await.unwrap();
        assert_eq!(response.status(), 503);
        assert_eq!(response.text().await.unwrap(), "balancer: no replica in rotation");
        assert_eq!(balancer.sent(), [0]);
    }
}
