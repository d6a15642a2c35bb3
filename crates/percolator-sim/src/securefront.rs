//! A test front for a metrics engine ([`SecureFront`]): what a managed Prometheus, a Thanos
//! querier behind an auth proxy or a Grafana Mimir gateway asks of a client, on a loopback
//! port. HTTPS with its own CA, a client certificate signed by a second CA, `Authorization:
//! Bearer` checked against a token file read on every request (so a test rotates it by
//! rewriting the file), and a tenant header `X-Scope-OrgID`. A request passing every check is
//! forwarded to the engine over plain HTTP and its answer streamed back; every request is
//! counted, accepted or rejected by reason ([`FrontCounts`]).
//!
//! Rejections, with a plain-text body: a client without a certificate from the client CA fails
//! the TLS handshake; a missing or wrong bearer token gets `401` `invalid bearer token`; a
//! missing `X-Scope-OrgID` gets `401` `no org id` (Mimir's answer), another tenant than the
//! front's `403` `tenant not allowed`.
//!
//! Test machinery: the end-to-end tests include this file by path, and `percolator-sim`'s own
//! tests declare it; nothing else compiles it.

use std::convert::Infallible;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt as _, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use rcgen::{ExtendedKeyUsagePurpose, KeyPair};
use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::pki::{Ca, PkiError};

/// The tenant header (Cortex, Mimir, Loki).
pub const TENANT_HEADER: &str = "X-Scope-OrgID";

/// Errors of the front.
#[derive(Debug, thiserror::Error)]
pub enum FrontError {
    /// Key or certificate generation failed.
    #[error("{0}")]
    Pki(#[from] PkiError),
    /// rustls refused the certificates or configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// File or socket I/O.
    #[error("{0}")]
    Io(#[from] std::io::Error),
}

/// Result alias for this module.
pub type Result<T, E = FrontError> = std::result::Result<T, E>;

/// Requests a [`SecureFront`] has seen, by outcome.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct FrontCounts {
    /// Passed every check and forwarded.
    pub accepted: u64,
    /// Connections whose TLS handshake failed (no client certificate, or one of another CA).
    pub rejected_tls: u64,
    /// Requests without the current bearer token (`401`).
    pub rejected_token: u64,
    /// Requests without the tenant header or with another tenant (`401`/`403`).
    pub rejected_tenant: u64,
}

impl FrontCounts {
    /// Every rejection, whatever its reason.
    pub fn rejected(&self) -> u64 {
        self.rejected_tls + self.rejected_token + self.rejected_tenant
    }
}

/// The files a client of the front needs, written in the front's directory.
#[derive(Debug, Clone)]
pub struct FrontFiles {
    /// The CA of the front's serving certificate (PEM), for `--prometheus-ca-file`.
    pub ca: PathBuf,
    /// A client certificate the front accepts (PEM), for `--prometheus-client-tls-cert-file`.
    pub client_cert: PathBuf,
    /// Its private key (PKCS#8 PEM), for `--prometheus-client-tls-key-file`.
    pub client_key: PathBuf,
    /// The bearer token file, read by the front on every request, for
    /// `--prometheus-token-file`.
    pub token: PathBuf,
}

/// What the request handler shares.
#[derive(Debug)]
struct FrontState {
    upstream: String,
    token_file: PathBuf,
    tenant: tokio::sync::watch::Sender<String>,
    client: reqwest::Client,
    accepted: AtomicU64,
    rejected_tls: AtomicU64,
    rejected_token: AtomicU64,
    rejected_tenant: AtomicU64,
}

/// An HTTPS front checking a client certificate, a bearer token and a tenant header before
/// forwarding to a plain-HTTP upstream. Stops when dropped.
#[derive(Debug)]
pub struct SecureFront {
    port: u16,
    files: FrontFiles,
    state: Arc<FrontState>,
    task: tokio::task::JoinHandle<()>,
}

impl SecureFront {
    /// Makes the two CAs, the serving and client certificates and the token file (holding
    /// `token`) in `dir`, and starts serving on a free loopback port, forwarding to `upstream`
    /// (`host:port`) what carries the token and `tenant`.
    pub async fn start(dir: &Path, upstream: &str, token: &str, tenant: &str) -> Result<Self> {
        std::fs::create_dir_all(dir)?;
        let server_ca = Ca::new("secure-front-server-ca")?;
        let client_ca = Ca::new("secure-front-client-ca")?;
        let server_key = KeyPair::generate().map_err(PkiError::from)?;
        let server_cert = server_ca.sign(
            &server_key,
            "secure-front",
            vec!["127.0.0.1".into(), "localhost".into()],
            ExtendedKeyUsagePurpose::ServerAuth,
            |_| {},
        )?;
        let client = client_ca.leaf("percolator", Vec::new(), ExtendedKeyUsagePurpose::ClientAuth, |_| {})?;
        let files = FrontFiles {
            ca: dir.join("front-ca.crt"),
            client_cert: dir.join("front-client.crt"),
            client_key: dir.join("front-client.key"),
            token: dir.join("front-token"),
        };
        std::fs::write(&files.ca, &server_ca.pem)?;
        std::fs::write(&files.client_cert, &client.pem)?;
        std::fs::write(&files.client_key, &client.key_pem)?;
        write_atomically(&files.token, token)?;

        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.der.clone())?;
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(roots),
            Arc::clone(&provider),
        )
        .build()
        .map_err(|e| rustls::Error::General(e.to_string()))?;
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_client_cert_verifier(verifier)
            .with_single_cert(
                vec![server_cert.der().clone(), server_ca.der.clone()],
                PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(server_key.serialize_der())),
            )?;
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];

        let listener = tokio::net::TcpListener::bind((std::net::Ipv4Addr::LOCALHOST, 0)).await?;
        let port = listener.local_addr()?.port();
        let state = Arc::new(FrontState {
            upstream: upstream.to_owned(),
            token_file: files.token.clone(),
            tenant: tokio::sync::watch::Sender::new(tenant.to_owned()),
            client: reqwest::Client::new(),
            accepted: AtomicU64::new(0),
            rejected_tls: AtomicU64::new(0),
            rejected_token: AtomicU64::new(0),
            rejected_tenant: AtomicU64::new(0),
        });
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let task = tokio::spawn(accept_loop(listener, acceptor, Arc::clone(&state)));
        Ok(Self { port, files, state, task })
    }

    /// Base URL of the front (`https://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// The CA, client certificate, key and token files.
    pub fn files(&self) -> &FrontFiles {
        &self.files
    }

    /// The tenant the front accepts.
    pub fn tenant(&self) -> String {
        self.state.tenant.borrow().clone()
    }

    /// Accepts `tenant` from now on (and no other).
    pub fn set_tenant(&self, tenant: &str) {
        self.state.tenant.send_replace(tenant.to_owned());
    }

    /// Replaces the token in the token file (a new file renamed over the old one, as a
    /// projected volume swaps it): the front accepts only `token` from its next request.
    pub fn rotate_token(&self, token: &str) -> std::io::Result<()> {
        write_atomically(&self.files.token, token)
    }

    /// The requests seen so far.
    pub fn counts(&self) -> FrontCounts {
        let state = &self.state;
        FrontCounts {
            accepted: state.accepted.load(Ordering::Relaxed),
            rejected_tls: state.rejected_tls.load(Ordering::Relaxed),
            rejected_token: state.rejected_token.load(Ordering::Relaxed),
            rejected_tenant: state.rejected_tenant.load(Ordering::Relaxed),
        }
    }
}

impl Drop for SecureFront {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Writes `text` to a temporary file beside `path`, then renames it over `path`, so that a
/// reader sees the old content or the new, never a part.
fn write_atomically(path: &Path, text: &str) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(tmp, path)
}

/// Accepts connections until the task is aborted (which drops the connections too).
async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<FrontState>,
) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(serve_connection(stream, acceptor.clone(), Arc::clone(&state)));
                }
                Err(error) => {
                    tracing::debug!(%error, "secure front accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
}

/// Completes the TLS handshake (counting a failure) and serves HTTP/1.1 or HTTP/2 on it.
async fn serve_connection(
    stream: tokio::net::TcpStream,
    acceptor: tokio_rustls::TlsAcceptor,
    state: Arc<FrontState>,
) {
    let tls = match acceptor.accept(stream).await {
        Ok(tls) => tls,
        Err(error) => {
            tracing::debug!(%error, "secure front: TLS handshake failed");
            state.rejected_tls.fetch_add(1, Ordering::Relaxed);
            return;
        }
    };
    let service = hyper::service::service_fn(move |request| {
        let state = Arc::clone(&state);
        async move { Ok::<_, Infallible>(handle(&state, request).await) }
    });
    let builder = hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
    if let Err(error) = builder.serve_connection(hyper_util::rt::TokioIo::new(tls), service).await {
        tracing::debug!(%error, "secure front connection ended");
    }
}

/// The body of the front's answers: a fixed text, or the upstream's body as it streams in.
type FrontBody = UnsyncBoxBody<Bytes, std::io::Error>;

/// Checks one request and forwards it, or says why not.
async fn handle(state: &FrontState, request: Request<Incoming>) -> Response<FrontBody> {
    let expected = tokio::fs::read_to_string(&state.token_file).await.unwrap_or_default();
    let expected = expected.trim();
    let bearer =
        header_str(request.headers(), header::AUTHORIZATION.as_str()).and_then(|v| v.strip_prefix("Bearer "));
    if expected.is_empty() || bearer != Some(expected) {
        state.rejected_token.fetch_add(1, Ordering::Relaxed);
        return text(StatusCode::UNAUTHORIZED, "invalid bearer token\n");
    }
    let tenant = state.tenant.borrow().clone();
    match header_str(request.headers(), TENANT_HEADER) {
        None => {
            state.rejected_tenant.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::UNAUTHORIZED, "no org id\n");
        }
        Some(got) if got != tenant => {
            state.rejected_tenant.fetch_add(1, Ordering::Relaxed);
            return text(StatusCode::FORBIDDEN, "tenant not allowed\n");
        }
        Some(_) => {}
    }
    state.accepted.fetch_add(1, Ordering::Relaxed);
    match forward(state, request).await {
        Ok(response) => response,
        Err(error) => {
            tracing::debug!(%error, "secure front cannot reach its upstream");
            text(StatusCode::BAD_GATEWAY, "upstream unreachable\n")
        }
    }
}

fn header_str<'a>(headers: &'a HeaderMap, name: &str) -> Option<&'a str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn text(status: StatusCode, body: &'static str) -> Response<FrontBody> {
    let mut response =
        Response::new(Full::new(Bytes::from_static(body.as_bytes())).map_err(|e| match e {}).boxed_unsync());
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8"));
    response
}

/// Headers that describe one hop, not the message (RFC 9110 §7.6.1), and `Host`, which the
/// upstream request sets for itself. `Authorization` stays behind, as a gateway keeps the
/// credentials it checked.
fn end_to_end(name: &header::HeaderName) -> bool {
    !matches!(
        name.as_str(),
        "connection"
            | "keep-alive"
            | "proxy-connection"
            | "transfer-encoding"
            | "te"
            | "trailer"
            | "upgrade"
            | "host"
            | "authorization"
    )
}

/// Sends `request` (its whole body: PromQL forms are small) to the upstream and streams the
/// answer back.
async fn forward(
    state: &FrontState,
    request: Request<Incoming>,
) -> Result<Response<FrontBody>, reqwest::Error> {
    let (parts, body) = request.into_parts();
    let body = match body.collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(error) => {
            tracing::debug!(%error, "secure front: request body");
            return Ok(text(StatusCode::BAD_REQUEST, "unreadable request body\n"));
        }
    };
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let mut upstream =
        state.client.request(parts.method, format!("http://{}{path}", state.upstream)).body(body);
    for (name, value) in parts.headers.iter().filter(|(name, _)| end_to_end(name)) {
        upstream = upstream.header(name, value);
    }
    let answer = upstream.send().await?;
    let mut response = Response::builder().status(answer.status());
    for (name, value) in answer.headers().iter().filter(|(name, _)| end_to_end(name)) {
        response = response.header(name, value);
    }
    let chunks = futures::stream::unfold(Some(answer), |answer| async move {
        let mut answer = answer?;
        match answer.chunk().await {
            Ok(Some(chunk)) => Some((Ok(Frame::data(chunk)), Some(answer))),
            Ok(None) => None,
            Err(error) => Some((Err(std::io::Error::other(error)), None)),
        }
    });
    Ok(response
        .body(StreamBody::new(chunks).boxed_unsync())
        .unwrap_or_else(|_| text(StatusCode::BAD_GATEWAY, "upstream answer not forwardable\n")))
}
