//! Kubelet connections: one HTTP/1.1 exchange at a time per connection, over the TLS (or, for
//! simulators, plain TCP) stream hyper-rustls' connector makes, and a pool of idle streams.
//!
//! A connection kept between fetches is parked as its bare stream. hyper's per-connection
//! state (an 8 KiB read and an 8 KiB write buffer, the dispatcher and its channel) lives only
//! for an exchange: each exchange runs hyper's HTTP/1.1 client on the stream and takes the
//! stream back once the response has been read to its end (`without_shutdown`). An idle
//! connection then holds what rustls keeps between records (a 4 KiB record buffer, the keys,
//! the peer's certificate) and the socket: at 150,000 pods on 4,750 nodes, 0.55 KiB per pod
//! less than hyper's pool kept (docs/benchmarks-history.md, issue 18, fourth step).
//!
//! A stream is parked only when the exchange ended cleanly, on a persistent HTTP/1.1 response
//! read to its end with nothing left over; before reuse it is checked for a close from the
//! kubelet (a non-blocking `MSG_PEEK`); a request that fails on a reused stream before its
//! response arrives is sent once more on a new connection (a GET is safe to repeat); streams
//! idle for [`IDLE_TIMEOUT`] are closed.

use std::collections::HashMap;
use std::mem::MaybeUninit;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::header::{CONNECTION, HOST, HeaderMap, HeaderValue};
use http::{Request, Response, Uri, Version};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper::client::conn::http1;
use hyper::rt::Write as _;
use hyper_rustls::{HttpsConnector, MaybeHttpsStream};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioIo;
use socket2::SockRef;
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tower::ServiceExt as _;

use super::lock;

/// How long an idle connection is kept: less than the kubelet's own idle timeout (90 s, its
/// server's `IdleTimeout`), so that a kept connection is rarely one the kubelet is closing.
pub(super) const IDLE_TIMEOUT: Duration = Duration::from_secs(75);

/// hyper's read buffer during an exchange, its smallest allowed size. Left adaptive, it grows
/// to the size of a node's answer (tens of KiB); the body is copied out into a buffer of its
/// announced length anyway.
const READ_BUFFER_BYTES: usize = 8192;

/// Most idle connections kept per kubelet. Fetches of one node share one request (the
/// node cache's single flight), so one is the rule; a few cover overlapping fetches.
const MAX_IDLE_PER_KUBELET: usize = 4;

/// A kubelet connection between exchanges.
type Stream = MaybeHttpsStream<TokioIo<TcpStream>>;

/// Why an exchange failed before its response head arrived.
#[derive(Debug, thiserror::Error)]
pub(super) enum Error {
    /// No connection could be made (TCP or TLS).
    #[error("connect: {0}")]
    Connect(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// The request failed, or the response head did.
    #[error(transparent)]
    Http(#[from] hyper::Error),
}

/// Kubelet connections, kept between fetches unless told not to.
pub(super) struct Transport {
    connector: HttpsConnector<HttpConnector>,
    /// `None` when connections are closed after each fetch.
    pool: Option<Arc<Pool>>,
    /// The pool's size for `percolator_kubelet_connections_parked`, while the transport lives.
    _parked: Option<Arc<apiserver::Probe>>,
}

/// A response whose body is being read: hand it back with [`Exchange::finish`] so that its
/// connection can be kept; dropped, the connection is closed.
pub(super) struct Exchange {
    /// Held until the exchange ends: hyper's dispatcher runs while it exists.
    _sender: http1::SendRequest<Empty<Bytes>>,
    /// Tells the connection's task whether to park the stream once hyper lets go of it.
    keep: oneshot::Sender<bool>,
    persistent: bool,
}

impl Exchange {
    /// Ends the exchange; `read_to_end` says the body was read to its end, the condition for
    /// keeping the connection.
    pub(super) fn finish(self, read_to_end: bool) {
        let _ = self.keep.send(read_to_end && self.persistent);
        // Dropping the sender lets hyper's dispatcher end, handing the stream to the task.
    }
}

impl Transport {
    /// A transport over `connector`, keeping connections if `reuse`; the kept ones are counted
    /// in `metrics` when given.
    pub(super) fn new(
        connector: HttpsConnector<HttpConnector>,
        reuse: bool,
        metrics: Option<&apiserver::Metrics>,
    ) -> Self {
        let pool = reuse.then(|| Arc::new(Pool::default()));
        let parked = pool.as_ref().zip(metrics).map(|(pool, metrics)| {
            let pool = Arc::downgrade(pool);
            let probe: Arc<apiserver::Probe> =
                Arc::new(move || pool.upgrade().map_or(0, |pool| pool.len() as u64));
            crate::telemetry::count_parked(metrics, &probe);
            probe
        });
        Self { connector, pool, _parked: parked }
    }

    /// Sends `GET uri` with `headers` on a kept connection to that kubelet or a new one, and
    /// returns the response head and body; `deadline` bounds how long the connection may
    /// live for this exchange.
    pub(super) async fn get(
        &self,
        uri: &Uri,
        headers: &HeaderMap,
        deadline: tokio::time::Instant,
    ) -> Result<(Response<Incoming>, Exchange), Error> {
        let key = self.pool.as_ref().and_then(|_| pool_key(uri));
        let parked = match (&self.pool, &key) {
            (Some(pool), Some(key)) => pool.take(key),
            _ => None,
        };
        if let Some(stream) = parked {
            match self.send(stream, uri, headers, key.clone(), deadline).await {
                Ok(sent) => return Ok(sent),
                // The kubelet closed it as it was taken: a GET is safe to send again.
                Err(Error::Http(e)) if is_closed_connection(&e) => {
                    tracing::debug!(%uri, error = %e, "kept kubelet connection was closed; reconnecting");
                }
                Err(e) => return Err(e),
            }
        }
        let stream = self.connector.clone().oneshot(uri.clone()).await.map_err(Error::Connect)?;
        self.send(stream, uri, headers, key, deadline).await
    }

    async fn send(
        &self,
        stream: Stream,
        uri: &Uri,
        headers: &HeaderMap,
        key: Option<String>,
        deadline: tokio::time::Instant,
    ) -> Result<(Response<Incoming>, Exchange), Error> {
        let (mut sender, connection) =
            http1::Builder::new().max_buf_size(READ_BUFFER_BYTES).handshake(stream).await?;
        let (keep, kept) = oneshot::channel();
        let pool = self.pool.as_ref().map(Arc::downgrade);
        tokio::spawn(async move {
            // Runs the connection until the exchange is over and hyper lets go of the stream.
            let Ok(Ok(parts)) = tokio::time::timeout_at(deadline, connection.without_shutdown()).await else {
                return;
            };
            let mut stream = parts.io;
            if kept.await == Ok(true)
                && parts.read_buf.is_empty()
                && nothing_pending(&mut stream)
                && let (Some(pool), Some(key)) = (pool.and_then(|pool| pool.upgrade()), key)
            {
                Pool::put(&pool, key, stream);
                return;
            }
            // Not kept: closed as hyper would (TLS close_notify, then FIN).
            let shutdown = std::future::poll_fn(|cx| Pin::new(&mut stream).poll_shutdown(cx));
            let _ = tokio::time::timeout_at(deadline, shutdown).await;
        });
        // hyper's connection-level client sends the URI as given: origin form, and the Host
        // header an HTTP/1.1 server requires.
        let mut request = Request::new(Empty::new());
        *request.uri_mut() = uri.path_and_query().cloned().map_or_else(|| Uri::from_static("/"), Uri::from);
        *request.headers_mut() = headers.clone();
        if let Some(host) = uri.authority().and_then(|a| HeaderValue::from_str(a.as_str()).ok()) {
            request.headers_mut().insert(HOST, host);
        }
        let response = sender.send_request(request).await?;
        let persistent = is_persistent(&response);
        Ok((response, Exchange { _sender: sender, keep, persistent }))
    }
}

/// Whether a request failed because its connection was closed or broken before any answer,
/// rather than on what the kubelet answered.
fn is_closed_connection(error: &hyper::Error) -> bool {
    error.is_incomplete_message()
        || error.is_canceled()
        || error.is_closed()
        || std::error::Error::source(error).is_some_and(|cause| cause.is::<std::io::Error>())
}

/// Whether the kubelet keeps the connection open after this response (HTTP/1.1 without
/// `Connection: close`; HTTP/1.0 is not kept).
fn is_persistent(response: &Response<Incoming>) -> bool {
    response.version() == Version::HTTP_11
        && !response.headers().get_all(CONNECTION).iter().any(|value| {
            value.to_str().is_ok_and(|v| v.split(',').any(|token| token.trim().eq_ignore_ascii_case("close")))
        })
}

/// The pool's key of a URI: its scheme and authority.
fn pool_key(uri: &Uri) -> Option<String> {
    Some(format!("{}://{}", uri.scheme_str()?, uri.authority()?))
}

/// Idle streams per kubelet, each with when it was parked.
#[derive(Default)]
struct Pool {
    idle: Mutex<HashMap<String, Vec<(Stream, Instant)>>>,
    /// Whether the task closing expired streams runs.
    sweeping: AtomicBool,
    /// Tests: reuse streams without the check, as when the kubelet's close is still in flight.
    #[cfg(test)]
    skip_open_check: AtomicBool,
}

impl Pool {
    /// The most recently parked stream of a kubelet that is still open and not expired.
    fn take(&self, key: &str) -> Option<Stream> {
        let mut idle = lock(&self.idle);
        let streams = idle.get_mut(key)?;
        let found = std::iter::from_fn(|| streams.pop())
            .find(|(stream, since)| self.usable(stream, *since))
            .map(|(stream, _)| stream);
        if streams.is_empty() {
            idle.remove(key);
        }
        found
    }

    /// Parks a stream, and starts the sweeper on first use.
    fn put(pool: &Arc<Self>, key: String, stream: Stream) {
        {
            let mut idle = lock(&pool.idle);
            let streams = idle.entry(key).or_default();
            if streams.len() >= MAX_IDLE_PER_KUBELET {
                return;
            }
            streams.push((stream, Instant::now()));
        }
        if !pool.sweeping.swap(true, Ordering::Relaxed) {
            tokio::spawn(sweep(Arc::downgrade(pool)));
        }
    }

    /// Closes expired streams and those the kubelet has closed.
    fn sweep(&self) {
        let mut idle = lock(&self.idle);
        idle.retain(|_, streams| {
            streams.retain(|(stream, since)| self.usable(stream, *since));
            !streams.is_empty()
        });
    }

    /// Whether a stream parked `since` may still be used: not expired, and open.
    fn usable(&self, stream: &Stream, since: Instant) -> bool {
        since.elapsed() < IDLE_TIMEOUT && (self.skips_open_check() || is_open(stream))
    }

    #[cfg(not(test))]
    fn skips_open_check(&self) -> bool {
        false
    }

    #[cfg(test)]
    fn skips_open_check(&self) -> bool {
        self.skip_open_check.load(Ordering::Relaxed)
    }

    /// Streams parked now.
    fn len(&self) -> usize {
        lock(&self.idle).values().map(Vec::len).sum()
    }
}

/// Sweeps the pool every third of [`IDLE_TIMEOUT`] while it exists.
async fn sweep(pool: Weak<Pool>) {
    // However the task ends (the pool dropped, or the runtime shut down with the task), the
    // next parked stream starts another.
    struct Running(Weak<Pool>);
    impl Drop for Running {
        fn drop(&mut self) {
            if let Some(pool) = self.0.upgrade() {
                pool.sweeping.store(false, Ordering::Relaxed);
            }
        }
    }
    let _running = Running(pool.clone());
    let mut ticks = tokio::time::interval(IDLE_TIMEOUT / 3);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        match pool.upgrade() {
            Some(pool) => pool.sweep(),
            None => return,
        }
    }
}

/// Whether a stream hyper let go of may be parked: nothing decrypted and left unread in
/// rustls, and no close from the kubelet.
fn nothing_pending(stream: &mut Stream) -> bool {
    let MaybeHttpsStream::Https(io) = stream else { return true };
    let (_, tls) = io.inner_mut().get_mut();
    tls.process_new_packets()
        .is_ok_and(|state| state.plaintext_bytes_to_read() == 0 && !state.peer_has_closed())
}

/// Whether an idle stream is still open: nothing to read, not even the end of the stream (a
/// kubelet closing an idle connection sends TLS close_notify and FIN, which make it readable).
/// A non-blocking `MSG_PEEK` on the socket itself: tokio's cached readiness may not have seen
/// the close yet.
fn is_open(stream: &Stream) -> bool {
    let tcp: &TcpStream = match stream {
        MaybeHttpsStream::Http(io) => io.inner(),
        MaybeHttpsStream::Https(io) => io.inner().get_ref().0.inner().inner(),
    };
    let mut byte = [MaybeUninit::uninit()];
    matches!(SockRef::from(tcp).peek(&mut byte), Err(e) if e.kind() == std::io::ErrorKind::WouldBlock)
}

#[cfg(test)]
impl Transport {
    /// Idle connections kept.
    pub(super) fn idle_connections(&self) -> usize {
        self.pool.as_ref().map_or(0, |pool| pool.len())
    }

    /// Reuses kept connections without checking them first.
    pub(super) fn skip_open_check(&self) {
        if let Some(pool) = &self.pool {
            pool.skip_open_check.store(true, Ordering::Relaxed);
        }
    }
}
