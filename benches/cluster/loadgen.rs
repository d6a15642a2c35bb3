//! A lean HTTPS load generator for B2 (BENCHMARKS.md), because h2load cannot present a client
//! certificate: hyper 1 client connections (HTTP/1.1 or HTTP/2) over tokio-rustls, optionally
//! with a client certificate, on one thread of its own (like `h2load -t 1`), so it competes
//! with the server for the two cores the way h2load does and never shares the bench's runtime
//! with the bare baseline server.
//!
//! Every connection is opened (TCP, TLS, HTTP handshake) before the clock starts; requests are
//! then sent back to back on each connection (HTTP/1.1: one at a time; HTTP/2: `streams` at
//! once) from a prepared template, and every body is read and dropped. Requests completed in
//! the warm-up are not counted; the rate and the latency percentiles are those of the requests
//! completed in the measured window. Any failure (connection, status other than 200, body of
//! another length), at any time, fails the run.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Request, Uri, Version};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};

/// h2load's default flow-control windows (`-w 30 -W 30`): 2^30 − 1 bytes.
const WINDOW: u32 = (1 << 30) - 1;

/// One load run.
#[derive(Debug, Clone)]
pub(crate) struct Options {
    /// `https://host:port/path?query`.
    pub url: String,
    /// HTTP/2 (ALPN `h2`) rather than HTTP/1.1.
    pub h2: bool,
    /// Connections opened.
    pub connections: usize,
    /// Requests in flight per connection (HTTP/1.1: 1).
    pub streams: usize,
    /// Time before the measured window (its requests are not counted).
    pub warm_up: Duration,
    /// The measured window.
    pub duration: Duration,
    /// Headers sent with every request (a name may repeat).
    pub headers: Vec<(String, String)>,
    /// Client certificate chain and key (PEM files), presented in every handshake.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// The CA(s) of the server's certificate (PEM).
    pub ca_pem: Vec<u8>,
    /// The length every response body must have.
    pub expected_len: usize,
}

impl Options {
    /// The bench's usual shape (as its h2load calls): 16 connections, 1 stream each over
    /// HTTP/1.1 and 16 over HTTP/2, 1 s of warm-up then 8 s measured, no extra headers.
    pub(crate) fn new(url: &str, h2: bool, ca_pem: Vec<u8>, expected_len: usize) -> Self {
        Self {
            url: url.to_owned(),
            h2,
            connections: 16,
            streams: if h2 { 16 } else { 1 },
            warm_up: Duration::from_secs(1),
            duration: Duration::from_secs(8),
            headers: Vec::new(),
            client_cert: None,
            ca_pem,
            expected_len,
        }
    }
}

/// What one run measured.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Outcome {
    /// Requests completed per second in the measured window.
    pub rps: f64,
    /// Median latency (ms) of the requests completed in the window.
    pub p50_ms: f64,
    /// 99th percentile latency (ms) of the same.
    pub p99_ms: f64,
    /// Requests completed in the window.
    pub requests: usize,
}

/// Runs the load on a thread of its own (a current-thread runtime) and returns what it
/// measured; panics on any failure.
pub(crate) async fn run(options: Options) -> Outcome {
    tokio::task::spawn_blocking(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        runtime.block_on(drive(options))
    })
    .await
    .unwrap()
}

/// The request every worker sends, prepared once.
struct Template {
    uri: Uri,
    version: Version,
    headers: HeaderMap,
}

impl Template {
    fn new(options: &Options, uri: &Uri) -> Self {
        let mut headers = HeaderMap::new();
        // HTTP/1.1 sends the origin form with a Host header; HTTP/2 the absolute URI (its
        // :scheme and :authority).
        let (uri, version) = if options.h2 {
            (uri.clone(), Version::HTTP_2)
        } else {
            let authority = uri.authority().unwrap().as_str();
            headers.insert(http::header::HOST, HeaderValue::from_str(authority).unwrap());
            let path = uri.path_and_query().map_or("/", |p| p.as_str());
            (path.parse().unwrap(), Version::HTTP_11)
        };
        for (name, value) in &options.headers {
            headers.append(
                HeaderName::from_bytes(name.as_bytes()).unwrap(),
                HeaderValue::from_str(value).unwrap(),
            );
        }
        Self { uri, version, headers }
    }

    fn request(&self) -> Request<Empty<Bytes>> {
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = self.uri.clone();
        *request.version_mut() = self.version;
        *request.headers_mut() = self.headers.clone();
        request
    }
}

fn client_config(options: &Options) -> rustls::ClientConfig {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&options.ca_pem) {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(roots);
    let mut config = match &options.client_cert {
        Some((cert, key)) => {
            let chain: Vec<_> = CertificateDer::pem_file_iter(cert).unwrap().map(Result::unwrap).collect();
            let key = PrivateKeyDer::from_pem_file(key).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![if options.h2 { b"h2".to_vec() } else { b"http/1.1".to_vec() }];
    config
}

/// One connection's request sender (HTTP/2: one clone per stream).
enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Empty<Bytes>>),
    H2(hyper::client::conn::http2::SendRequest<Empty<Bytes>>),
}

async fn connect(options: &Options, tls: &tokio_rustls::TlsConnector, uri: &Uri) -> Sender {
    let host = uri.host().unwrap().trim_start_matches('[').trim_end_matches(']');
    let port = uri.port_u16().unwrap_or(443);
    let tcp = tokio::net::TcpStream::connect((host, port)).await.unwrap();
    tcp.set_nodelay(true).unwrap();
    let name = ServerName::try_from(host.to_owned()).unwrap();
    let stream = tls.connect(name, tcp).await.unwrap();
    let io = TokioIo::new(stream);
    if options.h2 {
        let (send, connection) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
            .initial_stream_window_size(WINDOW)
            .initial_connection_window_size(WINDOW)
            .handshake(io)
            .await
            .unwrap();
        tokio::spawn(connection);
        Sender::H2(send)
    } else {
        let (send, connection) = hyper::client::conn::http1::handshake(io).await.unwrap();
        tokio::spawn(connection);
        Sender::H1(send)
    }
}

/// Sends one request and reads its body; returns the status and the body's length.
async fn exchange(sender: &mut Sender, request: Request<Empty<Bytes>>) -> Result<(u16, usize), String> {
    let response = match sender {
        Sender::H1(send) => {
            send.ready().await.map_err(|e| e.to_string())?;
            send.send_request(request).await.map_err(|e| e.to_string())?
        }
        Sender::H2(send) => {
            send.ready().await.map_err(|e| e.to_string())?;
            send.send_request(request).await.map_err(|e| e.to_string())?
        }
    };
    let status = response.status().as_u16();
    let mut body = response.into_body();
    let mut len = 0;
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame.map_err(|e| e.to_string())?.data_ref() {
            len += data.len();
        }
    }
    Ok((status, len))
}

/// What one worker saw.
#[derive(Default)]
struct Tally {
    /// Latencies (ms) of the requests completed in the measured window.
    latencies: Vec<f64>,
    failures: usize,
    first_failure: Option<String>,
}

async fn worker(
    mut sender: Sender,
    template: Arc<Template>,
    expected_len: usize,
    window: (Instant, Instant),
) -> Tally {
    let (from, until) = window;
    let mut tally = Tally::default();
    while Instant::now() < until {
        let started = Instant::now();
        let result = exchange(&mut sender, template.request()).await;
        let ended = Instant::now();
        match result {
            Ok((200, len)) if len == expected_len => {
                if ended >= from && ended <= until {
                    tally.latencies.push((ended - started).as_secs_f64() * 1000.0);
                }
            }
            other => {
                tally.failures += 1;
                let broken = other.is_err();
                tally.first_failure.get_or_insert_with(|| match other {
                    Ok((status, len)) => {
                        format!("status {status}, body {len} B (expected 200, {expected_len} B)")
                    }
                    Err(e) => e,
                });
                if broken {
                    // The connection is gone: stop rather than spin on it.
                    break;
                }
            }
        }
    }
    tally
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

async fn drive(options: Options) -> Outcome {
    let uri: Uri = options.url.parse().unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(client_config(&options)));
    let template = Arc::new(Template::new(&options, &uri));
    let mut senders = Vec::with_capacity(options.connections);
    for _ in 0..options.connections {
        senders.push(connect(&options, &tls, &uri).await);
    }
    let from = Instant::now() + options.warm_up;
    let until = from + options.duration;
    let mut workers = Vec::new();
    let mut spawn = |sender| {
        workers.push(tokio::spawn(worker(sender, template.clone(), options.expected_len, (from, until))));
    };
    for sender in senders {
        match sender {
            Sender::H2(send) => {
                for _ in 0..options.streams.max(1) {
                    spawn(Sender::H2(send.clone()));
                }
            }
            h1 => spawn(h1),
        }
    }
    let mut latencies = Vec::new();
    let (mut failures, mut first_failure) = (0, None);
    for w in workers {
        let tally = w.await.unwrap();
        latencies.extend(tally.latencies);
        failures += tally.failures;
        first_failure = first_failure.or(tally.first_failure);
    }
    assert_eq!(failures, 0, "loadgen {}: {failures} failed requests, first: {first_failure:?}", options.url);
    latencies.sort_by(f64::total_cmp);
    Outcome {
        rps: latencies.len() as f64 / options.duration.as_secs_f64(),
        p50_ms: percentile(&latencies, 0.5),
        p99_ms: percentile(&latencies, 0.99),
        requests: latencies.len(),
    }
}
