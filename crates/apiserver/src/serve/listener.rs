//! The serving loop: accepts TCP connections on an already-bound listener ([`bind`] gives it
//! the kernel's largest accept queue), bounds them, runs the TLS handshake, and serves
//! HTTP/1.1 or HTTP/2 (by ALPN) with hyper until the server shuts down ([`serve`]). Every
//! request carries the client's certificate chain
//! ([`crate::PeerCertificates`]), its address ([`crate::auth::ClientAddr`]) and its
//! connection's body slots ([`super::fairness::ConnectionSlots`]).
//!
//! Written for a client that means harm (anyone who can reach the port, not only
//! kube-apiserver); each bound has a flag in [`crate::ServingArgs`] where an operator may need
//! to change it ([`ServeConfig::from_args`]):
//!
//! | what | bound |
//! | --- | --- |
//! | connections | `--max-connections` in all, `--max-connections-per-ip` from one address: beyond, a connection is closed as soon as it is accepted, counted (`http_connections_rejected_total`) and logged at most once a second |
//! | TCP connect, then nothing | the TLS handshake must end within [`HANDSHAKE_TIMEOUT`] |
//! | no request in progress | `--connection-idle-timeout` (90 s): from the handshake to the first request, between HTTP/1.1 requests, while an HTTP/2 connection has no open stream; then a graceful close (HTTP/2 GOAWAY) and, if the peer does not finish it within `--http2-ping-timeout`, the connection is dropped |
//! | HTTP/1.1 request head | complete within [`HEADER_READ_TIMEOUT`] from the end of the previous response (so an idle keep-alive connection is closed after it), at most [`MAX_HEADER_BYTES`] |
//! | HTTP/2 dead peer | a PING after `--http2-read-idle-timeout` without a frame received; no answer within `--http2-ping-timeout` closes the connection |
//! | HTTP/2 frames | `--http2-max-streams-per-connection` concurrent streams; a header list of at most [`MAX_HEADER_BYTES`]; [`MAX_PENDING_ACCEPT_RESET_STREAMS`] streams reset by the peer before they were served (rapid reset, CVE-2023-44487) and [`MAX_LOCAL_ERROR_RESET_STREAMS`] streams reset for the peer's errors, beyond which the connection gets a GOAWAY (`ENHANCE_YOUR_CALM`); CONTINUATION frames: h2 itself refuses a header block in more frames than the header list limit needs (5 at 64 KiB) with a GOAWAY, and one whose decoded size exceeds the limit |
//! | a peer that stops reading | no byte written for `--write-timeout` while bytes wait: the connection fails ([`super::stall`]) |
//! | a response not taken | HTTP/2: a stream lives at most `--request-timeout` + `--write-timeout`, then it is reset (a zero flow-control window; [`super::fairness::StreamExecutor::bounded`]); HTTP/1.1: a response body not written by then ends the connection |
//!
//! What an HTTP/2 stream holds while its response waits is bounded too: its send buffer
//! ([`super::fairness::STREAM_SEND_BUFFER`]) and its body (shared with the caches for an
//! unfiltered list); a response waiting for one of its connection's body slots holds no
//! in-flight seat ([`super::guard`]).
//!
//! Shutdown: once `shutdown` resolves the listener is closed, every connection is closed
//! gracefully (HTTP/1.1 after its current response, HTTP/2 with a GOAWAY that lets its open
//! streams finish) and [`serve`] returns when all have ended, or after [`DRAIN_TIMEOUT`].

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};
use tokio::time::{Instant, Sleep};
use tokio_rustls::TlsAcceptor;

use super::batch;
use super::fairness::{self, ConnectionSlots, StreamExecutor};
pub use super::guard::MAX_HEADER_BYTES;
use super::stall::StallGuard;
use crate::auth::ClientAddr;
use crate::telemetry::ConnectionLabels;
use crate::{Metrics, PeerCertificates, ServingArgs};

/// A client that has not finished its TLS handshake by then is dropped.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// A client must send a complete HTTP/1.1 request head within this time (slow-loris); hyper
/// runs it from the end of the previous response, so it also closes idle keep-alive
/// connections. 32 s, kube-apiserver's `ReadHeaderTimeout`.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(32);
/// Streams the peer may reset before hyper has served them; beyond, a GOAWAY
/// (`ENHANCE_YOUR_CALM`). h2's own default, set here so that it is a decision.
pub const MAX_PENDING_ACCEPT_RESET_STREAMS: usize = 20;
/// Streams the server may reset because of the peer's errors (malformed frames, headers
/// over the limit) per connection; beyond, a GOAWAY. hyper's own default, set here.
pub const MAX_LOCAL_ERROR_RESET_STREAMS: usize = 1024;
/// How long shutdown waits for open connections once the listener is closed (with the
/// default 5s `--shutdown-delay-duration`, within a Pod's default 30s termination grace period).
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(20);
/// At most one log line a second about refused connections (a flood would otherwise write
/// one per connection).
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(1);

/// How [`serve`] bounds its clients (module documentation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServeConfig {
    /// `--http2-max-streams-per-connection`.
    pub max_streams: u32,
    /// `--request-timeout`: with `write_timeout`, the longest a response may take.
    pub request_timeout: Duration,
    /// `--connection-idle-timeout`.
    pub idle_timeout: Duration,
    /// `--http2-read-idle-timeout` (`None`: no PING).
    pub read_idle_timeout: Option<Duration>,
    /// `--http2-ping-timeout`; also how long a graceful close after the idle timeout may take.
    pub ping_timeout: Duration,
    /// `--write-timeout`.
    pub write_timeout: Duration,
    /// `--max-connections` (`None`: no limit).
    pub max_connections: Option<usize>,
    /// `--max-connections-per-ip` (`None`: no limit).
    pub max_connections_per_ip: Option<usize>,
    /// [`HANDSHAKE_TIMEOUT`].
    pub handshake_timeout: Duration,
    /// [`DRAIN_TIMEOUT`].
    pub drain_timeout: Duration,
}

impl Default for ServeConfig {
    /// The bounds the flags give by default.
    fn default() -> Self {
        Self {
            max_streams: 1000,
            request_timeout: Duration::from_secs(60),
            idle_timeout: Duration::from_secs(90),
            read_idle_timeout: Some(Duration::from_secs(30)),
            ping_timeout: Duration::from_secs(15),
            write_timeout: Duration::from_secs(60),
            max_connections: Some(4096),
            max_connections_per_ip: Some(2048),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
        }
    }
}

impl ServeConfig {
    /// The bounds the flags give.
    pub fn from_args(args: &ServingArgs) -> Self {
        let limit = |n: u32| (n > 0).then(|| usize::try_from(n).unwrap_or(usize::MAX));
        Self {
            max_streams: args.http2_max_streams_per_connection,
            request_timeout: args.request_timeout,
            idle_timeout: args.connection_idle_timeout,
            read_idle_timeout: (!args.http2_read_idle_timeout.is_zero())
                .then_some(args.http2_read_idle_timeout),
            ping_timeout: args.http2_ping_timeout,
            write_timeout: args.write_timeout,
            max_connections: limit(args.max_connections),
            max_connections_per_ip: limit(args.max_connections_per_ip),
            handshake_timeout: HANDSHAKE_TIMEOUT,
            drain_timeout: DRAIN_TIMEOUT,
        }
    }

    /// The longest a response may take from its request's arrival to its last byte handed to
    /// the connection.
    pub fn response_lifetime(&self) -> Duration {
        self.request_timeout.saturating_add(self.write_timeout)
    }
}

/// Binds the listener [`serve`] serves on, with the accept queue Go's `net.Listen` gives (the
/// kernel's `somaxconn`, 4096 if it cannot be read) rather than the 128 of Rust's standard
/// library: a burst of new connections (kube-apiserver reconnecting, a rolling restart, an
/// attack) waits in the kernel's queue instead of overflowing it, which would make clients
/// retry their handshake seconds later.
pub fn bind(address: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = match address {
        SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(listen_backlog())
}

/// The kernel's largest accept queue (Go's `maxListenerBacklog`), at most 65,535.
fn listen_backlog() -> u32 {
    std::fs::read_to_string("/proc/sys/net/core/somaxconn")
        .ok()
        .and_then(|text| text.trim().parse::<u32>().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4096)
        .min(65_535)
}

/// Serves `app` over TLS on `listener` until `shutdown` resolves, then closes every connection
/// gracefully (module documentation); counts connections in `metrics`.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    config: &ServeConfig,
    metrics: &Arc<Metrics>,
    shutdown: impl Future<Output = ()> + Send,
) {
    let executor = StreamExecutor::bounded(config.response_lifetime(), metrics.stream_write_timeouts.clone());
    let mut auto = auto::Builder::new(executor);
    auto.http1()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEADER_BYTES)
        .keep_alive(true);
    auto.http2()
        .timer(TokioTimer::new())
        .max_concurrent_streams(config.max_streams)
        .max_send_buf_size(fairness::STREAM_SEND_BUFFER)
        .max_header_list_size(u32::try_from(MAX_HEADER_BYTES).unwrap_or(u32::MAX))
        .max_pending_accept_reset_streams(MAX_PENDING_ACCEPT_RESET_STREAMS)
        .max_local_error_reset_streams(MAX_LOCAL_ERROR_RESET_STREAMS)
        .keep_alive_interval(config.read_idle_timeout)
        .keep_alive_timeout(config.ping_timeout);
    let (stopping, stop) = watch::channel(false);
    let shared = Arc::new(Shared {
        acceptor: TlsAcceptor::from(tls),
        // With ALPN the protocol is known: no waiting for a preface to tell them apart.
        http1: auto.clone().http1_only(),
        http2: auto.clone().http2_only(),
        auto,
        app,
        config: config.clone(),
        metrics: Arc::clone(metrics),
        limits: Limits::new(config.max_connections, config.max_connections_per_ip),
        refusals: RefusalLog::default(),
        stop,
    });
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (tcp, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(error) => {
                    // Typically EMFILE: back off instead of spinning.
                    tracing::warn!(%error, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = &mut shutdown => break,
        };
        let Some(slot) = shared.admit(peer.ip()) else { continue };
        let _ = tcp.set_nodelay(true);
        tokio::spawn(connection(Arc::clone(&shared), tcp, peer, slot));
    }
    // New connections are refused from here on.
    drop(listener);
    tracing::info!(open = shared.limits.open(), "shutting down: listener closed, draining open connections");
    let _ = stopping.send(true);
    if tokio::time::timeout(config.drain_timeout, shared.limits.drained()).await.is_err() {
        tracing::warn!(
            open = shared.limits.open(),
            "connections still open after {:?}; exiting anyway",
            config.drain_timeout
        );
    }
}

/// What every connection task shares.
struct Shared {
    acceptor: TlsAcceptor,
    auto: auto::Builder<StreamExecutor>,
    http1: auto::Builder<StreamExecutor>,
    http2: auto::Builder<StreamExecutor>,
    app: Router,
    config: ServeConfig,
    metrics: Arc<Metrics>,
    limits: Limits,
    refusals: RefusalLog,
    /// Becomes true when the server shuts down.
    stop: watch::Receiver<bool>,
}

impl Shared {
    /// The connection's place within the limits, or `None` (counted and logged) when it is
    /// refused.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionSlot> {
        match self.limits.admit(ip) {
            Ok(()) => {
                self.metrics.connections.inc();
                Some(ConnectionSlot { shared: Arc::clone(self), ip })
            }
            Err(reason) => {
                self.metrics.connections_rejected.get_or_create(&ConnectionLabels { reason }).inc();
                self.refusals.refused(reason, ip);
                None
            }
        }
    }
}

/// A connection's place within the limits, given back when the connection ends.
struct ConnectionSlot {
    shared: Arc<Shared>,
    ip: IpAddr,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.shared.limits.release(self.ip);
        self.shared.metrics.connections.dec();
    }
}

/// The open connections, in all and per client address.
struct Limits {
    max: Option<usize>,
    max_per_ip: Option<usize>,
    open: Mutex<Open>,
    /// Notified when the last connection ends.
    drained: Notify,
}

#[derive(Default)]
struct Open {
    total: usize,
    per_ip: HashMap<IpAddr, usize>,
}

impl Limits {
    fn new(max: Option<usize>, max_per_ip: Option<usize>) -> Self {
        Self { max, max_per_ip, open: Mutex::default(), drained: Notify::new() }
    }

    fn lock(&self) -> MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Counts a new connection from `ip`, or names the limit it would exceed.
    fn admit(&self, ip: IpAddr) -> Result<(), &'static str> {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        if self.max.is_some_and(|max| open.total >= max) {
            return Err("max_connections");
        }
        let from_ip = open.per_ip.get(&ip).copied().unwrap_or(0);
        if self.max_per_ip.is_some_and(|max| from_ip >= max) {
            return Err("max_connections_per_ip");
        }
        open.total += 1;
        open.per_ip.insert(ip, from_ip + 1);
        Ok(())
    }

    fn release(&self, ip: IpAddr) {
        let ip = ip.to_canonical();
        let mut open = self.lock();
        open.total = open.total.saturating_sub(1);
        if let Some(n) = open.per_ip.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                open.per_ip.remove(&ip);
            }
        }
        if open.total == 0 {
            self.drained.notify_waiters();
        }
    }

    fn open(&self) -> usize {
        self.lock().total
    }

    /// Resolves once no connection is open.
    async fn drained(&self) {
        loop {
            let notified = self.drained.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            if self.open() == 0 {
                return;
            }
            notified.await;
        }
    }
}

/// Logs refused connections at most once per [`REFUSAL_LOG_INTERVAL`], with how many there
/// were since the last line.
#[derive(Default)]
struct RefusalLog {
    last: Mutex<Option<std::time::Instant>>,
    since: AtomicU64,
}

impl RefusalLog {
    fn refused(&self, limit: &'static str, ip: IpAddr) {
        self.since.fetch_add(1, Ordering::Relaxed);
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        if last.is_some_and(|at| at.elapsed() < REFUSAL_LOG_INTERVAL) {
            return;
        }
        *last = Some(std::time::Instant::now());
        // This one included: how many since the last line.
        let refused = self.since.swap(0, Ordering::Relaxed);
        tracing::warn!(limit, client = %ip, refused, "connections refused at accept: limit reached");
    }
}

/// Serves one accepted connection until it ends, then counts why it ended.
async fn connection(shared: Arc<Shared>, tcp: TcpStream, peer: SocketAddr, slot: ConnectionSlot) {
    let stalled = Arc::new(AtomicBool::new(false));
    let io = StallGuard::new(tcp, shared.config.write_timeout, Arc::clone(&stalled));
    let reason = match tokio::time::timeout(shared.config.handshake_timeout, shared.acceptor.accept(io)).await
    {
        Ok(Ok(stream)) => serve_tls(&shared, stream, peer, &stalled).await,
        Ok(Err(error)) => {
            tracing::debug!(%peer, %error, "TLS handshake failed");
            if stalled.load(Ordering::SeqCst) { "write_timeout" } else { "handshake_error" }
        }
        Err(_) => {
            tracing::debug!(%peer, "TLS handshake timed out");
            "handshake_timeout"
        }
    };
    shared.metrics.connections_closed.get_or_create(&ConnectionLabels { reason }).inc();
    drop(slot);
}

/// Serves HTTP on an established TLS stream; why the connection ended.
async fn serve_tls(
    shared: &Shared,
    stream: tokio_rustls::server::TlsStream<StallGuard<TcpStream>>,
    peer: SocketAddr,
    stalled: &AtomicBool,
) -> &'static str {
    let connection = stream.get_ref().1;
    // The client certificate chain (if any) travels with every request of the connection,
    // for the authenticators.
    let chain = PeerCertificates::from_server_connection(connection);
    let alpn = connection.alpn_protocol().map(<[u8]>::to_vec);
    let activity = Arc::new(Activity::new());
    let service = ConnService {
        app: shared.app.clone(),
        chain,
        client: ClientAddr(peer),
        slots: ConnectionSlots::default(),
        activity: Arc::clone(&activity),
        // HTTP/2 streams are bounded by the executor, which sees them all.
        body_deadline: (alpn.as_deref() != Some(b"h2")).then(|| shared.config.response_lifetime()),
    };
    let ended = match alpn.as_deref() {
        // On HTTP/2, what hyper writes in one turn of this task is sent together
        // (`super::batch`); an HTTP/1.1 connection writes one response per turn.
        Some(b"h2") => {
            let (io, flusher) = batch::split(stream);
            let serving = shared.http2.serve_connection(TokioIo::new(io), service);
            flusher.around(Supervised::new(serving, shared, &activity)).await
        }
        Some(b"http/1.1") => {
            Supervised::new(shared.http1.serve_connection(TokioIo::new(stream), service), shared, &activity)
                .await
        }
        _ => {
            Supervised::new(shared.auto.serve_connection(TokioIo::new(stream), service), shared, &activity)
                .await
        }
    };
    let h2 = alpn.as_deref() == Some(b"h2");
    if stalled.load(Ordering::SeqCst) || activity.body_timed_out.load(Ordering::SeqCst) {
        return "write_timeout";
    }
    match ended {
        Ended::Closed(reason) => reason,
        Ended::Served(Ok(())) => "closed",
        Ended::Served(Err(error)) => {
            let timeout = error.downcast_ref::<hyper::Error>().is_some_and(hyper::Error::is_timeout);
            tracing::debug!(%peer, %error, "connection ended with an error");
            match (timeout, h2) {
                (true, true) => "ping_timeout",
                (true, false) => "header_timeout",
                (false, _) => "error",
            }
        }
    }
}

/// Resolves once the server shuts down.
async fn stopped(mut stop: watch::Receiver<bool>) {
    // An error means the server is gone: stop as well.
    let _ = stop.wait_for(|stopping| *stopping).await;
}

/// How a connection ended.
enum Ended {
    /// hyper ended it (the peer closed it, an error, or a graceful close that completed).
    Served(Result<(), Box<dyn std::error::Error + Send + Sync>>),
    /// The server closed it (gracefully, or dropped it when that took too long), for this
    /// reason.
    Closed(&'static str),
}

/// A hyper connection closed gracefully when the server shuts down or when it has been idle
/// for the idle timeout; after an idle close has begun, dropped if the peer has not let it
/// finish within `grace` (an HTTP/2 GOAWAY waits for the answer to a PING).
struct Supervised<C> {
    serving: Pin<Box<C>>,
    idle: Pin<Box<dyn Future<Output = ()> + Send>>,
    stop: Pin<Box<dyn Future<Output = ()> + Send>>,
    grace: Duration,
    /// Why the close began, and its deadline (none on shutdown: the drain has its own).
    closing: Option<(&'static str, Option<Pin<Box<Sleep>>>)>,
}

impl<C> Supervised<C> {
    /// Supervises `serving`, whose requests `activity` counts, with `shared`'s bounds.
    fn new(serving: C, shared: &Shared, activity: &Arc<Activity>) -> Self {
        Self {
            serving: Box::pin(serving),
            idle: Box::pin(idle(Arc::clone(activity), shared.config.idle_timeout)),
            stop: Box::pin(stopped(shared.stop.clone())),
            grace: shared.config.ping_timeout,
            closing: None,
        }
    }
}

/// A connection that can be closed gracefully (hyper-util's).
trait Graceful: Future<Output = Result<(), Box<dyn std::error::Error + Send + Sync>>> {
    fn close(self: Pin<&mut Self>);
}

impl<I> Graceful for auto::Connection<'_, I, ConnService, StreamExecutor>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    fn close(self: Pin<&mut Self>) {
        self.graceful_shutdown();
    }
}

impl<C: Graceful> Future for Supervised<C> {
    type Output = Ended;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Ended> {
        let this = &mut *self;
        if this.closing.is_none() {
            if this.stop.as_mut().poll(cx).is_ready() {
                this.serving.as_mut().close();
                this.closing = Some(("shutdown", None));
            } else if this.idle.as_mut().poll(cx).is_ready() {
                this.serving.as_mut().close();
                this.closing = Some(("idle_timeout", Some(Box::pin(tokio::time::sleep(this.grace)))));
            }
        }
        if let Poll::Ready(result) = this.serving.as_mut().poll(cx) {
            return Poll::Ready(match (&this.closing, result) {
                (Some((reason, _)), result) => {
                    if let Err(error) = result {
                        tracing::debug!(reason, %error, "a connection closed by the server ended with an error");
                    }
                    Ended::Closed(reason)
                }
                (None, result) => Ended::Served(result),
            });
        }
        if let Some((reason, Some(deadline))) = &mut this.closing
            && deadline.as_mut().poll(cx).is_ready()
        {
            tracing::debug!(reason, "a graceful close did not finish in time: connection dropped");
            return Poll::Ready(Ended::Closed(reason));
        }
        Poll::Pending
    }
}

/// Requests in progress on one connection, and when the last one ended.
struct Activity {
    started: Instant,
    active: AtomicUsize,
    /// Milliseconds from `started` to the end of the last request.
    last_end: AtomicU64,
    /// An HTTP/1.1 response body was not written in time.
    body_timed_out: AtomicBool,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            active: AtomicUsize::new(0),
            last_end: AtomicU64::new(0),
            body_timed_out: AtomicBool::new(false),
        }
    }

    fn begin(self: &Arc<Self>) -> Busy {
        self.active.fetch_add(1, Ordering::SeqCst);
        Busy(Arc::clone(self))
    }

    fn last_end(&self) -> Instant {
        self.started + Duration::from_millis(self.last_end.load(Ordering::SeqCst))
    }
}

/// A request in progress: from its head to the end (or drop) of its response body.
struct Busy(Arc<Activity>);

impl Drop for Busy {
    fn drop(&mut self) {
        let since = u64::try_from(self.0.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        // The end is recorded before the count drops, so that a watcher seeing no request
        // in progress sees this end too.
        self.0.last_end.fetch_max(since, Ordering::SeqCst);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Resolves once the connection has had no request in progress for `timeout` (counted from
/// its start when it has had none yet).
async fn idle(activity: Arc<Activity>, timeout: Duration) {
    loop {
        let deadline = if activity.active.load(Ordering::SeqCst) == 0 {
            activity.last_end() + timeout
        } else {
            Instant::now() + timeout
        };
        tokio::time::sleep_until(deadline).await;
        if activity.active.load(Ordering::SeqCst) == 0 && activity.last_end() + timeout <= Instant::now() {
            return;
        }
    }
}

/// The service of one connection: the router, with the connection's extensions put into each
/// request and each response tracked until its body ends.
#[derive(Clone)]
struct ConnService {
    app: Router,
    chain: Option<PeerCertificates>,
    client: ClientAddr,
    slots: ConnectionSlots,
    activity: Arc<Activity>,
    /// HTTP/1.1: the longest a response may take from its request's arrival.
    body_deadline: Option<Duration>,
}

impl hyper::service::Service<http::Request<Incoming>> for ConnService {
    type Response = http::Response<Tracked>;
    type Error = Infallible;
    type Future = Respond;

    fn call(&self, mut request: http::Request<Incoming>) -> Respond {
        let busy = self.activity.begin();
        let deadline = self.body_deadline.map(|lifetime| Instant::now() + lifetime);
        let extensions = request.extensions_mut();
        if let Some(chain) = &self.chain {
            extensions.insert(chain.clone());
        }
        extensions.insert(self.client);
        extensions.insert(self.slots.clone());
        let routed = tower::Service::call(&mut self.app.clone(), request);
        Respond { routed, busy: Some(busy), deadline }
    }
}

/// The router's answer to a request, tracked.
struct Respond {
    routed: axum::routing::future::RouteFuture<Infallible>,
    busy: Option<Busy>,
    deadline: Option<Instant>,
}

impl Future for Respond {
    type Output = Result<http::Response<Tracked>, Infallible>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let response = match Pin::new(&mut self.routed).poll(cx) {
            Poll::Ready(Ok(response)) => response,
            Poll::Ready(Err(never)) => match never {},
            Poll::Pending => return Poll::Pending,
        };
        let (busy, deadline) = (self.busy.take(), self.deadline);
        Poll::Ready(Ok(response.map(|body| Tracked { body, busy, deadline })))
    }
}

/// A response body that keeps its request counted as in progress until it ends, and on
/// HTTP/1.1 fails (ending the connection) once its deadline has passed.
pub(crate) struct Tracked {
    body: axum::body::Body,
    busy: Option<Busy>,
    deadline: Option<Instant>,
}

impl Body for Tracked {
    type Data = Bytes;
    type Error = Box<dyn std::error::Error + Send + Sync>;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
        if self.deadline.is_some_and(|deadline| Instant::now() >= deadline) {
            if let Some(busy) = &self.busy {
                busy.0.body_timed_out.store(true, Ordering::SeqCst);
            }
            return Poll::Ready(Some(Err(
                "the response was not written within the request and write timeouts".into(),
            )));
        }
        let frame = std::task::ready!(Pin::new(&mut self.body).poll_frame(cx));
        if frame.is_none() {
            self.busy = None;
        }
        Poll::Ready(frame.map(|frame| frame.map_err(Into::into)))
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use rustls::pki_types::pem::PemObject;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[test]
    fn the_default_config_is_the_flags_defaults() {
        let flags = crate::options::TestFlags::parse_from(["apiserver"]);
        assert_eq!(ServeConfig::from_args(&flags.serving), ServeConfig::default());
        let flags = crate::options::TestFlags::parse_from([
            "apiserver",
            "--http2-read-idle-timeout=0s",
            "--max-connections=0",
            "--max-connections-per-ip=3",
        ]);
        let config = ServeConfig::from_args(&flags.serving);
        assert_eq!(
            (config.read_idle_timeout, config.max_connections, config.max_connections_per_ip),
            (None, None, Some(3))
        );
    }

    #[tokio::test]
    async fn connections_are_bounded_in_all_and_per_address() {
        let limits = Limits::new(Some(3), Some(2));
        let (a, b, c): (IpAddr, IpAddr, IpAddr) =
            ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap(), "::ffff:10.0.0.1".parse().unwrap());
        assert_eq!(limits.admit(a), Ok(()));
        assert_eq!(limits.admit(c), Ok(()), "the same address, IPv4-mapped");
        assert_eq!(limits.admit(a), Err("max_connections_per_ip"));
        assert_eq!(limits.admit(b), Ok(()));
        assert_eq!(limits.admit(b), Err("max_connections"));
        limits.release(a);
        assert_eq!(limits.admit(b), Ok(()), "a place came back");
        let drained = tokio::spawn(async move {
            limits.release(c);
            limits.release(b);
            limits.release(b);
            limits.drained().await;
            limits.open()
        });
        assert_eq!(tokio::time::timeout(Duration::from_secs(5), drained).await.unwrap().unwrap(), 0);
        let unlimited = Limits::new(None, None);
        for _ in 0..10_000 {
            assert_eq!(unlimited.admit(a), Ok(()));
        }
    }

    /// A running [`serve`] of a router answering `/` at once, `/slow` after 600 ms and `/big`
    /// with 64 MiB.
    struct Server {
        address: SocketAddr,
        metrics: Arc<Metrics>,
        stop: Option<tokio::sync::oneshot::Sender<()>>,
        served: tokio::task::JoinHandle<()>,
        connector: tokio_rustls::TlsConnector,
        _dir: TempDir,
    }

    struct TempDir(std::path::PathBuf);

    impl Drop for TempDir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    async fn mk_server(name: &str, config: ServeConfig) -> Server {
        crate::install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("apiserver-listener-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let flags = crate::options::TestFlags::parse_from(["apiserver", "--cert-dir", dir.to_str().unwrap()]);
        let tls = crate::server_config(&flags.serving, None).unwrap();
        let mut roots = rustls::RootCertStore::empty();
        for cert in rustls::pki_types::CertificateDer::pem_file_iter(dir.join("apiserver.crt")).unwrap() {
            roots.add(cert.unwrap()).unwrap();
        }
        let client = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
        let app = Router::new()
            .route("/", axum::routing::get(|| async { "ok" }))
            .route(
                "/slow",
                axum::routing::get(|| async {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    "slow"
                }),
            )
            .route("/big", axum::routing::get(|| async { vec![b'x'; 64 << 20] }));
        let listener = bind("127.0.0.1:0".parse().unwrap()).unwrap();
        let address = listener.local_addr().unwrap();
        let metrics = Metrics::new("test");
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn({
            let metrics = Arc::clone(&metrics);
            async move {
                serve(listener, tls, app, &config, &metrics, async {
                    let _ = stopped.await;
                })
                .await
            }
        });
        Server {
            address,
            metrics,
            stop: Some(stop),
            served,
            connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
            _dir: TempDir(dir),
        }
    }

    impl Server {
        /// A TLS connection offering `alpn`.
        async fn connect(&self, alpn: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
            let tcp = TcpStream::connect(self.address).await.unwrap();
            let mut config = rustls::ClientConfig::clone(self.connector.config());
            config.alpn_protocols = vec![alpn.to_vec()];
            let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
            connector.connect("localhost".try_into().unwrap(), tcp).await.unwrap()
        }

        /// The value of a series of the registry, 0 when absent.
        fn value(&self, series: &str) -> u64 {
            let text = self.metrics.encode();
            text.lines()
                .find_map(|l| l.strip_prefix(series).and_then(|v| v.strip_prefix(' ')))
                .map_or(0, |v| v.trim().parse().unwrap())
        }

        async fn stop(mut self) {
            let _ = self.stop.take().map(|stop| stop.send(()));
            tokio::time::timeout(Duration::from_secs(10), &mut self.served).await.unwrap().unwrap();
        }
    }

    /// Reads until the peer closes; how long that took.
    async fn mk_wait_closed(stream: &mut (impl tokio::io::AsyncRead + Unpin)) -> Duration {
        let start = std::time::Instant::now();
        let mut buf = [0u8; 4096];
        loop {
            match tokio::time::timeout(Duration::from_secs(10), stream.read(&mut buf)).await {
                Ok(Ok(0) | Err(_)) => return start.elapsed(),
                Ok(Ok(_)) => {}
                Err(_) => panic!("still open after 10 s"),
            }
        }
    }

    fn mk_config() -> ServeConfig {
        ServeConfig {
            idle_timeout: Duration::from_millis(400),
            ping_timeout: Duration::from_millis(300),
            max_connections_per_ip: Some(3),
            ..ServeConfig::default()
        }
    }

    /// A connection that sends nothing after its handshake (HTTP/2 by ALPN, HTTP/1.1, none) is
    /// closed after the idle timeout, and counted so.
    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_idle_timeout() {
        let server = mk_server("idle", mk_config()).await;
        for alpn in [&b"h2"[..], b"http/1.1"] {
            let mut stream = server.connect(alpn).await;
            let took = mk_wait_closed(&mut stream).await;
            assert!(
                took >= Duration::from_millis(350) && took < Duration::from_secs(3),
                "{alpn:?}: {took:?}"
            );
        }
        assert_eq!(server.value("test_http_connections_closed_total{reason=\"idle_timeout\"}"), 2);
        assert_eq!(server.value("test_http_connections"), 0);
        server.stop().await;
    }

    /// A request in progress keeps its connection open past the idle timeout; the idle time
    /// counts from its end.
    #[tokio::test]
    async fn a_request_in_progress_is_not_idle() {
        let server = mk_server("busy", mk_config()).await;
        let mut stream = server.connect(b"http/1.1").await;
        stream.write_all(b"GET /slow HTTP/1.1\r\nhost: localhost\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        let mut buf = [0u8; 4096];
        while !answer.ends_with(b"slow") {
            let n =
                tokio::time::timeout(Duration::from_secs(5), stream.read(&mut buf)).await.unwrap().unwrap();
            assert!(n > 0, "closed before the answer: {}", String::from_utf8_lossy(&answer));
            answer.extend_from_slice(&buf[..n]);
        }
        assert!(answer.starts_with(b"HTTP/1.1 200 OK"), "{}", String::from_utf8_lossy(&answer));
        let took = mk_wait_closed(&mut stream).await;
        assert!(took >= Duration::from_millis(350), "closed {took:?} after the answer");
        server.stop().await;
    }

    /// Connections beyond the per-address bound are closed at once, before any handshake, and
    /// counted; the others are served.
    #[tokio::test]
    async fn connections_beyond_the_bound_are_closed_at_accept() {
        let server = mk_server("limit", mk_config()).await;
        let mut held = Vec::new();
        for _ in 0..3 {
            held.push(TcpStream::connect(server.address).await.unwrap());
        }
        let mut refused = TcpStream::connect(server.address).await.unwrap();
        let took = mk_wait_closed(&mut refused).await;
        assert!(took < Duration::from_secs(1), "{took:?}");
        assert_eq!(
            server.value("test_http_connections_rejected_total{reason=\"max_connections_per_ip\"}"),
            1
        );
        assert_eq!(server.value("test_http_connections"), 3);
        drop(held);
        // The places come back as the server sees the connections end.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while server.value("test_http_connections") > 0 {
            assert!(std::time::Instant::now() < deadline, "the closed connections are still counted");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let mut stream = server.connect(b"http/1.1").await;
        stream.write_all(b"GET / HTTP/1.1\r\nhost: localhost\r\nconnection: close\r\n\r\n").await.unwrap();
        let mut answer = Vec::new();
        stream.read_to_end(&mut answer).await.unwrap();
        assert!(answer.starts_with(b"HTTP/1.1 200 OK") && answer.ends_with(b"ok"), "{answer:?}");
        server.stop().await;
    }

    /// A peer that finishes no TLS handshake is dropped after the handshake timeout.
    #[tokio::test]
    async fn a_connection_without_handshake_is_dropped() {
        let config = ServeConfig { handshake_timeout: Duration::from_millis(300), ..mk_config() };
        let server = mk_server("handshake", config).await;
        let mut tcp = TcpStream::connect(server.address).await.unwrap();
        let took = mk_wait_closed(&mut tcp).await;
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(3), "{took:?}");
        assert_eq!(server.value("test_http_connections_closed_total{reason=\"handshake_timeout\"}"), 1);
        server.stop().await;
    }

    /// HTTP/1.1: a client that asks for a large answer and never reads it is cut by the
    /// write timeout (nothing written for that long); one that reads it too slowly, by the
    /// response deadline (request timeout plus write timeout). Both are counted so.
    #[tokio::test]
    async fn an_answer_not_taken_in_time_ends_its_connection() {
        let config = ServeConfig {
            request_timeout: Duration::from_millis(300),
            write_timeout: Duration::from_millis(400),
            ..mk_config()
        };
        let server = mk_server("write", config).await;
        let request = b"GET /big HTTP/1.1\r\nhost: localhost\r\n\r\n";

        let mut stalled = server.connect(b"http/1.1").await;
        stalled.write_all(request).await.unwrap();
        tokio::time::sleep(Duration::from_millis(1500)).await;
        let mut read = 0;
        let mut buf = vec![0u8; 1 << 16];
        // What the buffers held, then the end.
        while let Ok(Ok(n @ 1..)) = tokio::time::timeout(Duration::from_secs(5), stalled.read(&mut buf)).await
        {
            read += n;
        }
        assert!(read < 64 << 20, "the whole answer came through ({read} bytes)");

        let mut slow = server.connect(b"http/1.1").await;
        slow.write_all(request).await.unwrap();
        let start = std::time::Instant::now();
        let mut read = 0;
        let mut buf = vec![0u8; 16 << 10];
        loop {
            // About 1.6 MB/s: the 64 MiB would take 40 s.
            tokio::time::sleep(Duration::from_millis(10)).await;
            match tokio::time::timeout(Duration::from_secs(5), slow.read(&mut buf)).await.unwrap() {
                Ok(0) | Err(_) => break,
                Ok(n) => read += n,
            }
        }
        let took = start.elapsed();
        assert!(read > 0 && read < 64 << 20, "{read} bytes");
        assert!(took >= Duration::from_millis(650) && took < Duration::from_secs(3), "cut after {took:?}");
        assert_eq!(server.value("test_http_connections_closed_total{reason=\"write_timeout\"}"), 2);
        server.stop().await;
    }
}
