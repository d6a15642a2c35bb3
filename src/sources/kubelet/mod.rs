//! Kubelet `GET /metrics/resource` (docs/wire.md, "Kubelets"): [`KubeletClient`], the [`KubeletSource`]
//! that fetches it over HTTPS, with its configuration ([`KubeletConfig`], [`BearerToken`]) and
//! errors ([`Error`]). The other concerns have their own files, re-exported
//! here:
//!
//! - `parse`: decoding one body ([`parse_resource_metrics`] → [`ParsedBatch`]);
//! - `rates`: the rate state of a node, CPU rates from two cumulative samples ([`NodeSamples`])
//!   at most `--max-rate-window` apart ([`RateRules`]);
//! - `sampler`: background sampling of the nodes asked for within `--idle-after`
//!   ([`Sampling`]), so a pair stays fresh while requests come and nothing runs when idle;
//! - `tls`: the rustls client configuration (`--kubelet-certificate-authority`, watched, or
//!   the cluster CA; `--kubelet-insecure-tls`).
//!
//! [`KubeletClient`] caches each node's fetch in the crate's [`TtlCache`] (named `kubelet`),
//! whose misses share one fetch; a semaphore bounds concurrent fetches; caps on body size and
//! container count keep one broken kubelet from taking the memory; bearer-token files are
//! re-read at most once a minute, since service-account tokens rotate. Kubelets are read over
//! HTTP/1.1 with hyper's connection-level client; `transport` keeps one connection per node
//! between fetches as its bare TLS stream, without hyper's buffers.

mod parse;
mod rates;
mod sampler;
mod tls;
mod transport;
mod warmup;

use std::collections::HashMap;
use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use http_body_util::BodyExt;
use hyper::body::{Body as _, Incoming};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use jiff::Timestamp;
use tokio::sync::Semaphore;
use tokio::time::timeout_at;

use super::{Inventory, KubeletSource, NodeInfo, NodeUsage, UpstreamObserver, outcome};
use apiserver::WatchedCaFile;
use apiserver::{CacheSettings, TtlCache};
use transport::Transport;

pub(crate) use super::KubeletError;
pub use parse::parse_resource_metrics;
pub(crate) use parse::{ParsedBatch, parse_resource_metrics_with};
pub use rates::NodeSamples;
pub(crate) use rates::RateRules;
pub(crate) use sampler::Sampling;
pub(crate) use warmup::{kubelet_config, warm_up_kubelets};

/// The kubelet's default secure port.
pub(crate) const DEFAULT_PORT: u16 = 10250;

/// Path of the resource metrics endpoint.
pub(crate) const RESOURCE_METRICS_PATH: &str = "/metrics/resource";

/// Largest body we read from a kubelet. A node with 110 pods answers about 100 KiB and one with
/// 500 pods of 3 containers about 1.2 MiB, so 8 MiB only stops a broken or hostile endpoint.
/// Every concurrent fetch may hold this much (a 64 MiB cap let one 10 MB body take percolator
/// from 27 to 240 MiB resident).
pub(crate) const DEFAULT_MAX_BODY_BYTES: usize = 8 * 1024 * 1024;

/// Most containers accepted from one kubelet. Far above what a node runs (kubelets default
/// to 110 pods), it bounds the rate state kept per node, which a dense body under the size
/// cap could otherwise fill with tens of thousands of phantom containers.
pub(crate) const DEFAULT_MAX_CONTAINERS: usize = 10_000;

/// metrics-server's default `--kubelet-preferred-address-types` order.
pub(crate) const DEFAULT_PREFERRED_ADDRESS_TYPES: [&str; 5] =
    ["Hostname", "InternalDNS", "InternalIP", "ExternalDNS", "ExternalIP"];

/// The `source` passed to the [`UpstreamObserver`].
const SOURCE: &str = "kubelet";

/// How long a token read from a file is used before the file is read again: kubelet-projected
/// service-account tokens are refreshed well before they expire, so a minute is plenty.
const TOKEN_REFRESH: Duration = Duration::from_secs(60);

/// How much of an error response body is quoted in an error message.
const ERROR_BODY_SNIPPET: usize = 256;

/// Name of the per-node cache in `percolator_cache_requests_total`.
const CACHE_NAME: &str = "kubelet";

/// Most nodes whose usage is cached at once.
const MAX_CACHED_NODES: u64 = 1_000_000;

/// The TCP keep-alive probe interval of kubelet connections (Go's `net.Dialer` default).
const TCP_KEEPALIVE: Duration = Duration::from_secs(15);

/// Errors of this module: decoding a body and building a client.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The body holds no line of the families we read (an HTML error page, another endpoint).
    #[error(
        "no resource metrics in the body ({malformed_lines} malformed lines, \
         {unknown_lines} samples of other families)"
    )]
    NoMetrics {
        /// Lines that are not valid samples.
        malformed_lines: usize,
        /// Valid samples of families we do not read.
        unknown_lines: usize,
    },
    /// The certificate authority bundle is unusable, or none was given without insecure TLS.
    #[error("kubelet certificate authority: {0}")]
    CertificateAuthority(String),
    /// The TLS configuration could not be built.
    #[error("kubelet TLS configuration: {0}")]
    Tls(String),
}

/// Result alias for this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Where the bearer token sent to kubelets comes from.
#[derive(Clone)]
pub(crate) enum BearerToken {
    /// A fixed token.
    Static(String),
    /// A file holding the token (a projected service-account token), re-read at most once a
    /// minute so rotations are picked up.
    File(PathBuf),
}

impl fmt::Debug for BearerToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Static(_) => f.write_str("Static(<redacted>)"),
            Self::File(path) => f.debug_tuple("File").field(path).finish(),
        }
    }
}

/// How to reach and read kubelets (metrics-server's `--kubelet-*` flags).
#[derive(Debug, Clone)]
pub(crate) struct KubeletConfig {
    /// `--kubelet-port`, used unless the node status gives one and
    /// [`use_node_status_port`](Self::use_node_status_port) is set.
    pub port: u16,
    /// `--kubelet-preferred-address-types`: the node address types to try, in order.
    /// Defaults to metrics-server's `Hostname, InternalDNS, InternalIP, ExternalDNS, ExternalIP`.
    pub preferred_address_types: Vec<String>,
    /// `--kubelet-insecure-tls`: do not verify kubelet serving certificates.
    pub insecure_tls: bool,
    /// `--kubelet-certificate-authority`, watched: kubelet certificates must chain to the
    /// bundle the file holds when a connection is made (a rotated file applies to the next
    /// connection). Takes precedence over [`ca_pem`](Self::ca_pem).
    pub ca_file: Option<Arc<WatchedCaFile>>,
    /// A fixed PEM bundle kubelet certificates must chain to (the cluster CA of the
    /// kubeconfig), used when there is no [`ca_file`](Self::ca_file). One of them is required
    /// unless `insecure_tls`.
    pub ca_pem: Option<Vec<u8>>,
    /// The bearer token sent to kubelets, if any.
    pub bearer_token: Option<BearerToken>,
    /// `--kubelet-request-timeout`: bound on one fetch, and on the wait for a fetch slot.
    pub request_timeout: Duration,
    /// The cache of each node's usage (how long it is served, where lookups are counted).
    pub cache: CacheSettings,
    /// `--kubelet-use-node-status-port`: use `status.daemonEndpoints.kubeletEndpoint.port`.
    pub use_node_status_port: bool,
    /// Most fetches in flight at once.
    pub max_concurrency: usize,
    /// Largest body read; see [`DEFAULT_MAX_BODY_BYTES`].
    pub max_body_bytes: usize,
    /// Most containers accepted from one body; see [`DEFAULT_MAX_CONTAINERS`].
    pub max_containers: usize,
    /// `--kubelet-reuse-connections`: keep each kubelet's connection open between fetches
    /// (parked without hyper's buffers: about 16 KiB resident per node), or close it after
    /// each fetch (one TCP and TLS handshake per node per fetch).
    pub reuse_connections: bool,
    /// `--max-rate-window`: two samples further apart give no CPU rate.
    pub max_rate_window: Duration,
    /// `--idle-after`: how long after a request needed a node's data the node is still sampled
    /// in the background; zero: fetched on demand only.
    pub idle_after: Duration,
}

impl KubeletConfig {
    /// The background sampling these settings give.
    pub(crate) fn sampling(&self) -> Sampling {
        Sampling::new(self.cache.ttl, self.max_rate_window, self.idle_after)
    }
}

impl Default for KubeletConfig {
    fn default() -> Self {
        Self {
            port: DEFAULT_PORT,
            preferred_address_types: DEFAULT_PREFERRED_ADDRESS_TYPES
                .iter()
                .map(|t| (*t).to_owned())
                .collect(),
            insecure_tls: false,
            ca_file: None,
            ca_pem: None,
            bearer_token: None,
            request_timeout: Duration::from_secs(10),
            cache: CacheSettings::uncounted(Duration::from_secs(10)),
            use_node_status_port: false,
            max_concurrency: 64,
            max_body_bytes: DEFAULT_MAX_BODY_BYTES,
            max_containers: DEFAULT_MAX_CONTAINERS,
            reuse_connections: true,
            max_rate_window: RateRules::DEFAULT_MAX_WINDOW,
            idle_after: Sampling::DEFAULT_IDLE_AFTER,
        }
    }
}

/// Reads kubelets' `/metrics/resource` and keeps their CPU rate state.
pub(crate) struct KubeletClient {
    inner: Arc<Inner>,
    /// The background sampler, started by the first request that needs a node.
    sampler: OnceLock<AbortOnDrop>,
}

/// A task aborted when its owner is dropped.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

struct Inner {
    /// Per node, its rate state as of its last fetch: the usage is read from it on each call
    /// (cheap), so no second copy of every pod's usage is kept for the TTL.
    cache: TtlCache<String, Arc<Mutex<NodeSamples>>>,
    /// When each node's data was last asked for.
    demand: sampler::Demand,
    sampling: Sampling,
    transport: Transport,
    config: KubeletConfig,
    inventory: Arc<dyn Inventory>,
    observer: Arc<dyn UpstreamObserver>,
    token: Option<TokenProvider>,
    slots: Semaphore,
    /// Rate state per node, each behind its own lock so nodes update independently.
    samples: Mutex<HashMap<String, Arc<Mutex<NodeSamples>>>>,
}

/// A failed fetch with the outcome to record.
struct Failure {
    outcome: &'static str,
    error: KubeletError,
}

impl KubeletClient {
    /// Builds a client. Fails when the TLS settings are unusable (no CA and not insecure, a CA
    /// bundle without certificates).
    pub(crate) fn new(
        config: KubeletConfig,
        inventory: Arc<dyn Inventory>,
        observer: Arc<dyn UpstreamObserver>,
    ) -> Result<Self> {
        let tls = tls::tls_config(&config)?;
        // Kubelets are reached directly, as metrics-server does (no HTTP(S)_PROXY, meant for
        // egress, sees the token); the timeout covers the TCP connect, `fetch_batch` the rest.
        let mut tcp = HttpConnector::new();
        tcp.enforce_http(false);
        tcp.set_nodelay(true);
        tcp.set_connect_timeout(Some(config.request_timeout));
        // A kept connection to a node that vanished without a reset is found dead by the
        // kernel instead of lasting until a fetch times out on it (Go's dialer does the same).
        tcp.set_keepalive(Some(TCP_KEEPALIVE));
        let https = HttpsConnector::from((tcp, tls));
        let transport = Transport::new(https, config.reuse_connections, config.cache.metrics.as_deref());
        let sampling = config.sampling();
        let cache_settings =
            CacheSettings { ttl: sampling.sample_ttl(config.cache.ttl), ..config.cache.clone() };
        let cache = TtlCache::new(CACHE_NAME, &cache_settings, MAX_CACHED_NODES);
        let token = config.bearer_token.clone().map(TokenProvider::new);
        let slots = Semaphore::new(config.max_concurrency.max(1));
        Ok(Self {
            inner: Arc::new(Inner {
                cache,
                demand: sampler::Demand::default(),
                sampling,
                transport,
                config,
                inventory,
                observer,
                token,
                slots,
                samples: Mutex::new(HashMap::new()),
            }),
            sampler: OnceLock::new(),
        })
    }

    /// Notes that `node`'s data is wanted, starting the background sampler on first use.
    fn ask(&self, node: &str) {
        if self.inner.sampling.idle_after.is_zero() {
            return;
        }
        self.inner.demand.ask(node);
        self.sampler.get_or_init(|| {
            let inner = Arc::clone(&self.inner);
            AbortOnDrop(tokio::spawn(async move {
                let limit = inner.config.max_concurrency;
                sampler::run(Arc::clone(&inner), &inner.demand, inner.sampling, limit).await
            }))
        });
    }
}

impl KubeletSource for KubeletClient {
    fn node_usage(&self, node: &str) -> BoxFuture<'_, Result<Arc<NodeUsage>, KubeletError>> {
        let node = node.to_owned();
        Box::pin(async move {
            self.ask(&node);
            let fetch = self.inner.fetch(&node);
            self.inner
                .cache
                .get_or_try_compute(node.clone(), fetch)
                .await
                .map(|(state, _, _)| lock(&state).shared_usage())
                .map_err(|e| (*e).clone())
        })
    }

    fn sampling(&self) -> Sampling {
        self.inner.sampling
    }
}

impl sampler::Sampler for Inner {
    async fn refresh(&self, node: &str, age: Duration) {
        // A failure is recorded by the observer; the next request fetches on demand and says
        // what failed.
        let key = node.to_owned();
        match self.cache.peek(&key).await {
            // An entry's creation is its expiry less the TTL (entries here never carry their
            // own): one younger than `age` is left alone.
            Some((_, expires_at)) => {
                if expires_at.checked_sub(self.cache.ttl()).is_some_and(|at| at.elapsed() < age) {
                    return;
                }
                // Still served while the new sample is taken.
                if let Ok(state) = self.fetch(node).await {
                    self.cache.insert_until(key, state, Instant::now() + self.cache.ttl()).await;
                }
            }
            // None cached: through the cache, so a request fetching it now is joined, not
            // doubled.
            None => {
                let _ = self.cache.get_or_try_compute_uncounted(key, self.fetch(node)).await;
            }
        }
    }
}

impl Inner {
    /// One fetch, recorded by the observer: the node's rate state, moved on by it.
    async fn fetch(&self, node: &str) -> Result<Arc<Mutex<NodeSamples>>, KubeletError> {
        let info = match self.inventory.node(node) {
            Some(info) => info,
            None => {
                // The node is gone: so is its rate state, and its sampling.
                lock(&self.samples).remove(node);
                self.demand.forget(node);
                return Err(KubeletError::NoAddress {
                    node: node.to_owned(),
                    reason: "node not in the inventory".to_owned(),
                });
            }
        };
        let url = self.url(&info)?;
        let started = Instant::now();
        let known = lock(&self.samples).get(node).cloned();
        let result = self.fetch_batch(node, &url, known.as_deref()).await;
        let result = match result {
            Ok(batch) if batch.scrape_error && batch.containers.is_empty() => Err(Failure {
                outcome: outcome::ERROR,
                error: KubeletError::ScrapeError { node: node.to_owned() },
            }),
            other => other,
        };
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(batch) => {
                self.observer.observe(SOURCE, outcome::SUCCESS, seconds);
                let rules = RateRules { max_window: self.config.max_rate_window };
                let state = Arc::clone(
                    lock(&self.samples)
                        .entry(node.to_owned())
                        .or_insert_with(|| Arc::new(Mutex::new(NodeSamples::with_rules(rules)))),
                );
                lock(&state).take(batch);
                Ok(state)
            }
            Err(failure) => {
                self.observer.observe(SOURCE, failure.outcome, seconds);
                Err(failure.error)
            }
        }
    }

    /// The URL of a node's resource metrics.
    fn url(&self, node: &NodeInfo) -> Result<String, KubeletError> {
        let no_address = |reason: String| KubeletError::NoAddress { node: node.name.to_string(), reason };
        let address = select_address(node, &self.config.preferred_address_types).ok_or_else(|| {
            no_address(format!("no address of type {}", self.config.preferred_address_types.join(", ")))
        })?;
        let host = url_host(address)
            .ok_or_else(|| no_address(format!("address {address:?} is not a host name or IP")))?;
        let port = match node.kubelet_port {
            Some(port) if self.config.use_node_status_port && port != 0 => port,
            _ => self.config.port,
        };
        Ok(format!("https://{host}:{port}{RESOURCE_METRICS_PATH}"))
    }

    /// Requests, reads and decodes one body.
    /// `known`: the node's rate state, whose keys the batch takes for the containers it tracks.
    async fn fetch_batch(
        &self,
        node: &str,
        url: &str,
        known: Option<&Mutex<NodeSamples>>,
    ) -> Result<ParsedBatch, Failure> {
        let request_error = |outcome: &'static str, reason: String| Failure {
            outcome,
            error: KubeletError::Request { node: node.to_owned(), reason },
        };
        let timeout = self.config.request_timeout;
        let _slot = match tokio::time::timeout(timeout, self.slots.acquire()).await {
            Ok(Ok(permit)) => permit,
            Ok(Err(_)) => return Err(request_error(outcome::ERROR, "client closed".to_owned())),
            Err(_) => {
                return Err(request_error(
                    outcome::TIMEOUT,
                    format!("no fetch slot free within {timeout:?}"),
                ));
            }
        };

        let uri: http::Uri =
            url.parse().map_err(|e| request_error(outcome::ERROR, format!("GET {url}: {e}")))?;
        let mut headers = http::HeaderMap::new();
        headers.insert(http::header::ACCEPT, http::HeaderValue::from_static("text/plain;version=0.0.4"));
        let mut token = None;
        if let Some(provider) = &self.token {
            let value = provider.get().await.map_err(|e| request_error(outcome::ERROR, e.to_string()))?;
            let mut header = http::HeaderValue::from_str(&format!("Bearer {value}")).map_err(|_| {
                request_error(outcome::ERROR, "the bearer token is not a valid header value".to_owned())
            })?;
            header.set_sensitive(true);
            headers.insert(http::header::AUTHORIZATION, header);
            token = Some(value);
        }
        let redact = |reason: String| redact(reason, token.as_deref());

        // One deadline for the request and its body, as a whole-request timeout.
        let deadline = tokio::time::Instant::now() + timeout;
        let timed_out =
            || request_error(outcome::TIMEOUT, format!("GET {url}: no answer within {timeout:?}"));
        let scrape_time = Timestamp::now();
        let (response, exchange) = timeout_at(deadline, self.transport.get(&uri, &headers, deadline))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| {
                request_error(outcome::UNREACHABLE, redact(format!("GET {url}: {}", error_chain(&e))))
            })?;
        let (head, mut body) = response.into_parts();

        let status = head.status;
        if !status.is_success() {
            let read = timeout_at(deadline, read_capped(&mut body, ERROR_BODY_SNIPPET))
                .await
                .ok()
                .and_then(Result::ok);
            let snippet = read.map(|(bytes, truncated)| {
                // A short error body read to its end leaves the connection usable.
                exchange.finish(!truncated);
                String::from_utf8_lossy(&bytes).trim().to_owned()
            });
            return Err(request_error(
                outcome::ERROR,
                redact(format!("GET {url}: HTTP {status}: {}", snippet.unwrap_or_default())),
            ));
        }
        let max = self.config.max_body_bytes;
        if body.size_hint().exact().is_some_and(|len| len > max as u64) {
            return Err(request_error(outcome::ERROR, format!("GET {url}: body exceeds {max} bytes")));
        }
        let (body, truncated) = timeout_at(deadline, read_capped(&mut body, max))
            .await
            .map_err(|_| timed_out())?
            .map_err(|e| request_error(outcome::ERROR, redact(format!("GET {url}: {}", error_chain(&e)))))?;
        if truncated {
            return Err(request_error(outcome::ERROR, format!("GET {url}: body exceeds {max} bytes")));
        }
        // Read to its end: the connection may be kept.
        exchange.finish(true);
        let text = String::from_utf8_lossy(&body);
        let batch = {
            let known = known.map(lock);
            parse_resource_metrics_with(&text, scrape_time, |namespace, pod, container| {
                known.as_ref().and_then(|state| state.key(namespace, pod, container))
            })
        }
        .map_err(|e| request_error(outcome::ERROR, format!("GET {url}: {e}")))?;
        let limit = self.config.max_containers;
        if batch.containers.len() > limit {
            return Err(request_error(
                outcome::ERROR,
                format!("GET {url}: {} containers, more than the {limit} accepted", batch.containers.len()),
            ));
        }
        Ok(batch)
    }
}

/// Reads at most `max` bytes of a body; the flag says whether more was left.
async fn read_capped(body: &mut Incoming, max: usize) -> Result<(Vec<u8>, bool), hyper::Error> {
    // The announced length, when there is one, so the body is not grown by copying.
    let announced = body.size_hint().exact().and_then(|len| usize::try_from(len).ok()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(announced.min(max));
    while let Some(frame) = body.frame().await {
        let Ok(chunk) = frame?.into_data() else { continue };
        let room = max - bytes.len();
        if chunk.len() > room {
            bytes.extend_from_slice(chunk.get(..room).unwrap_or_default());
            return Ok((bytes, true));
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok((bytes, false))
}

/// The first address of the first preferred type that the node has.
fn select_address<'a>(node: &'a NodeInfo, preferred: &[String]) -> Option<&'a str> {
    preferred.iter().find_map(|wanted| {
        node.addresses
            .iter()
            .find(|(kind, address)| kind == wanted && !address.is_empty())
            .map(|(_, address)| address.as_str())
    })
}

/// The URL host for an address: IPv6 in brackets, an IP or DNS name as is, anything else
/// (which could smuggle a path or userinfo into the URL) rejected.
fn url_host(address: &str) -> Option<String> {
    if let Ok(ip) = address.parse::<IpAddr>() {
        return Some(match ip {
            IpAddr::V6(v6) => format!("[{v6}]"),
            IpAddr::V4(v4) => v4.to_string(),
        });
    }
    if !address.is_empty()
        && address.len() <= 253
        && address.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
        && !address.starts_with(['-', '.'])
    {
        return Some(address.to_owned());
    }
    None
}

/// A message with every cause, since reqwest's and hyper's own messages omit them (shared
/// with the Prometheus client).
pub(crate) fn error_chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        let message = cause.to_string();
        if !text.contains(&message) {
            text.push_str(": ");
            text.push_str(&message);
        }
        source = cause.source();
    }
    text
}

/// Removes the token from a message, whatever produced it.
fn redact(message: String, token: Option<&str>) -> String {
    match token {
        Some(token) if token.len() >= 4 && message.contains(token) => message.replace(token, "<redacted>"),
        _ => message,
    }
}

/// Locks a mutex, taking the data even if a panic poisoned it (the state stays consistent:
/// every update replaces whole values).
fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bearer token file cannot be read and no token was read from it before.
#[derive(Debug, thiserror::Error)]
#[error("reading bearer token file {}: {error}", .path.display())]
struct TokenFileError {
    path: std::path::PathBuf,
    error: std::io::Error,
}

/// Supplies the bearer token, re-reading a token file at most every [`TOKEN_REFRESH`].
struct TokenProvider {
    source: BearerToken,
    cached: Mutex<Option<(String, Instant)>>,
}

impl TokenProvider {
    fn new(source: BearerToken) -> Self {
        Self { source, cached: Mutex::new(None) }
    }

    /// The current token; the error names the file, never the token.
    async fn get(&self) -> Result<String, TokenFileError> {
        let path = match &self.source {
            BearerToken::Static(token) => return Ok(token.clone()),
            BearerToken::File(path) => path,
        };
        if let Some((token, read_at)) = lock(&self.cached).as_ref()
            && read_at.elapsed() < TOKEN_REFRESH
        {
            return Ok(token.clone());
        }
        match tokio::fs::read_to_string(path).await {
            Ok(text) => {
                let token = text.trim().to_owned();
                *lock(&self.cached) = Some((token.clone(), Instant::now()));
                Ok(token)
            }
            // Keep using the last token: it is likely still valid for a while.
            Err(e) => lock(&self.cached)
                .as_ref()
                .map(|(token, _)| token.clone())
                .ok_or_else(|| TokenFileError { path: path.clone(), error: e }),
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

    use axum::extract::State;
    use axum::http::{HeaderMap, StatusCode};
    use axum::response::IntoResponse;
    use hyper_util::rt::{TokioExecutor, TokioIo};
    use hyper_util::server::conn::auto;
    use hyper_util::service::TowerToHyperService;
    use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};
    use rustls::pki_types::PrivatePkcs8KeyDer;

    use super::parse::tests::{FIXTURE, ts};
    use super::*;
    use crate::sources::PodKey;
    use test_support::all_at_once;

    // ---- addresses ----

    fn mk_node(addresses: &[(&str, &str)], kubelet_port: Option<u16>) -> NodeInfo {
        NodeInfo {
            name: "node-a".into(),
            addresses: addresses.iter().map(|(t, a)| ((*t).to_owned(), (*a).to_owned())).collect(),
            kubelet_port,
            labels: Default::default(),
        }
    }

    #[test]
    fn address_preference_and_url() {
        let node = mk_node(
            &[("InternalIP", "10.0.0.7"), ("Hostname", "node-a"), ("ExternalIP", "2001:db8::7")],
            Some(10255),
        );
        let defaults = KubeletConfig::default().preferred_address_types;
        assert_eq!(select_address(&node, &defaults), Some("node-a"));
        let ip_first = vec!["InternalIP".to_owned(), "Hostname".to_owned()];
        assert_eq!(select_address(&node, &ip_first), Some("10.0.0.7"));
        assert_eq!(select_address(&node, &["InternalDNS".to_owned()]), None);
        assert_eq!(url_host("2001:db8::7").as_deref(), Some("[2001:db8::7]"));
        assert_eq!(url_host("10.0.0.7").as_deref(), Some("10.0.0.7"));
        assert_eq!(url_host("node-a.example").as_deref(), Some("node-a.example"));
        for bad in ["evil.example/x?", "user@host", "a b", "-x", ""] {
            assert_eq!(url_host(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn redaction_and_debug_hide_the_token() {
        let message = redact("denied for Bearer s3cr3t-token".to_owned(), Some("s3cr3t-token"));
        assert_eq!(message, "denied for Bearer <redacted>");
        let config = KubeletConfig {
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        assert!(!format!("{config:?}").contains("s3cr3t"));
    }

    #[test]
    fn https_without_a_trust_anchor_is_refused() {
        let inventory: Arc<dyn Inventory> = Arc::new(MkInventory::default());
        let err = KubeletClient::new(KubeletConfig::default(), inventory, Arc::new(apiserver::NoopObserver))
            .err()
            .unwrap();
        assert!(matches!(err, Error::CertificateAuthority(_)), "{err}");
    }

    // ---- HTTP against a local rustls server ----

    #[derive(Default)]
    struct MkInventory {
        nodes: HashMap<String, Arc<NodeInfo>>,
    }

    impl Inventory for MkInventory {
        fn running_pods(&self, _namespace: Option<&str>) -> Vec<Arc<super::super::PodInfo>> {
            Vec::new()
        }
        fn node(&self, name: &str) -> Option<Arc<NodeInfo>> {
            self.nodes.get(name).cloned()
        }
        fn nodes(&self) -> Vec<Arc<NodeInfo>> {
            self.nodes.values().cloned().collect()
        }
        fn is_synced(&self) -> bool {
            true
        }
        fn resource_version(&self) -> String {
            "1".to_owned()
        }
    }

    /// Records every observation (the Prometheus client's tests use it too).
    #[derive(Default)]
    pub(in crate::sources) struct MkObserver {
        pub(in crate::sources) calls: Mutex<Vec<(&'static str, &'static str)>>,
    }

    impl UpstreamObserver for MkObserver {
        fn observe(&self, source: &'static str, outcome: &'static str, _seconds: f64) {
            self.calls.lock().unwrap().push((source, outcome));
        }
    }

    #[derive(Default)]
    struct ServerState {
        body: Mutex<String>,
        hits: AtomicUsize,
        connections: AtomicUsize,
        authorizations: Mutex<Vec<Option<String>>>,
        delay: Mutex<Duration>,
        /// Answer with `Connection: close`.
        close: AtomicBool,
        /// Wakes every connection's task to drop its connection, as a kubelet closing idle
        /// connections does.
        drop_connections: tokio::sync::Notify,
    }

    async fn kubelet_handler(State(state): State<Arc<ServerState>>, headers: HeaderMap) -> impl IntoResponse {
        state.hits.fetch_add(1, Ordering::SeqCst);
        let auth = headers.get(http::header::AUTHORIZATION).map(|v| v.to_str().unwrap().to_owned());
        state.authorizations.lock().unwrap().push(auth.clone());
        let delay = *state.delay.lock().unwrap();
        tokio::time::sleep(delay).await;
        if auth.as_deref() == Some("Bearer wrong") {
            return (StatusCode::UNAUTHORIZED, HeaderMap::new(), "Unauthorized".to_owned());
        }
        let mut headers = HeaderMap::new();
        if state.close.load(Ordering::SeqCst) {
            headers.insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
        }
        (StatusCode::OK, headers, state.body.lock().unwrap().clone())
    }

    struct MkServer {
        port: u16,
        ca_pem: String,
        state: Arc<ServerState>,
    }

    fn mk_ca() -> (CertifiedIssuer<'static, KeyPair>, String) {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(rcgen::DnType::CommonName, "test kubelet CA");
        let ca = CertifiedIssuer::self_signed(params, KeyPair::generate().unwrap()).unwrap();
        let pem = ca.pem();
        (ca, pem)
    }

    async fn mk_server() -> MkServer {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let (ca, ca_pem) = mk_ca();
        let leaf_key = KeyPair::generate().unwrap();
        let leaf = CertificateParams::new(vec!["127.0.0.1".to_owned(), "localhost".to_owned()])
            .unwrap()
            .signed_by(&leaf_key, &ca)
            .unwrap();
        let mut tls = rustls::ServerConfig::builder()
            .with_no_client_auth()
            .with_single_cert(
                vec![leaf.der().clone()],
                PrivatePkcs8KeyDer::from(leaf_key.serialize_der()).into(),
            )
            .unwrap();
        tls.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(tls));

        let state = Arc::new(ServerState::default());
        *state.body.lock().unwrap() = FIXTURE.to_owned();
        let router = axum::Router::new()
            .route(RESOURCE_METRICS_PATH, axum::routing::get(kubelet_handler))
            .with_state(Arc::clone(&state));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let accepted = Arc::clone(&state);
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                accepted.connections.fetch_add(1, Ordering::SeqCst);
                let acceptor = acceptor.clone();
                let service = TowerToHyperService::new(router.clone());
                let state = Arc::clone(&accepted);
                tokio::spawn(async move {
                    if let Ok(stream) = acceptor.accept(tcp).await {
                        let builder = auto::Builder::new(TokioExecutor::new());
                        let serve = builder.serve_connection(TokioIo::new(stream), service);
                        tokio::select! {
                            _ = serve => {}
                            () = state.drop_connections.notified() => {}
                        }
                    }
                });
            }
        });
        MkServer { port, ca_pem, state }
    }

    /// A client of `server` as node-a, fetching on demand only (the tests count fetches) unless
    /// `config` says otherwise.
    fn mk_client(server: &MkServer, config: KubeletConfig, observer: Arc<MkObserver>) -> KubeletClient {
        mk_sampling_client(server, KubeletConfig { idle_after: Duration::ZERO, ..config }, observer)
    }

    fn mk_sampling_client(
        server: &MkServer,
        config: KubeletConfig,
        observer: Arc<MkObserver>,
    ) -> KubeletClient {
        let mut inventory = MkInventory::default();
        inventory.nodes.insert("node-a".to_owned(), Arc::new(mk_node(&[("InternalIP", "127.0.0.1")], None)));
        let config = KubeletConfig {
            port: server.port,
            preferred_address_types: vec!["InternalIP".to_owned()],
            request_timeout: Duration::from_secs(5),
            ..config
        };
        KubeletClient::new(config, Arc::new(inventory), observer).unwrap()
    }

    #[tokio::test]
    async fn fetch_sends_the_token_and_verifies_the_kubelet_ca() {
        let server = mk_server().await;
        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let usage = client.node_usage("node-a").await.unwrap();
        assert_eq!(usage.pods.len(), 3);
        let app = &usage.pods[&PodKey { namespace: "shop".into(), name: "web-7d4b9c6f5-x2x4z".into() }][0];
        assert_eq!(app.memory_bytes, Some(134_217_728.0));
        assert_eq!(app.cpu_nanocores, None);
        assert_eq!(
            *server.state.authorizations.lock().unwrap(),
            vec![Some("Bearer s3cr3t-token".to_owned())]
        );
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "success")]);

        let err = client.node_usage("node-b").await.unwrap_err();
        assert!(matches!(err, KubeletError::NoAddress { .. }), "{err}");
    }

    #[tokio::test]
    async fn another_ca_is_rejected_and_the_error_hides_the_token() {
        let server = mk_server().await;
        let (_, other_ca) = mk_ca();
        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            ca_pem: Some(other_ca.into_bytes()),
            bearer_token: Some(BearerToken::Static("s3cr3t-token".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let err = client.node_usage("node-a").await.unwrap_err();
        let message = err.to_string();
        assert!(matches!(err, KubeletError::Request { .. }), "{message}");
        assert!(message.contains("certificate"), "{message}");
        assert!(!message.contains("s3cr3t"), "{message}");
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 0);
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "unreachable")]);
    }

    #[tokio::test]
    async fn a_rotated_ca_file_applies_to_the_next_connection() {
        let server = mk_server().await;
        let (_, other_ca) = mk_ca();
        let dir = std::env::temp_dir().join(format!("percolator-kubelet-ca-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("ca.crt");
        std::fs::write(&path, &other_ca).unwrap();
        let file = WatchedCaFile::load(&path, "--kubelet-certificate-authority").unwrap();
        let observer = Arc::new(MkObserver::default());
        // The file wins over the cluster CA, which would verify this kubelet.
        let config = KubeletConfig {
            ca_file: Some(Arc::clone(&file)),
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let message = client.node_usage("node-a").await.unwrap_err().to_string();
        // Both test CAs have one subject: the kubelet's chain is checked against the wrong key.
        assert!(message.contains("invalid peer certificate: BadSignature"), "{message}");
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 0);

        // The kubelet's CA lands in the file: the next connection verifies against it, with
        // the same client.
        std::fs::write(&path, &server.ca_pem).unwrap();
        assert!(file.reload().unwrap());
        let usage = client.node_usage("node-a").await.unwrap();
        assert_eq!(usage.pods.len(), 3);
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 1);
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "unreachable"), ("kubelet", "success")]);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[tokio::test]
    async fn insecure_tls_and_token_file_and_http_errors() {
        let server = mk_server().await;
        let dir = std::env::temp_dir().join(format!("percolator-kubelet-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "file-token\n").unwrap();
        let config = KubeletConfig {
            insecure_tls: true,
            bearer_token: Some(BearerToken::File(token_file.clone())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        client.node_usage("node-a").await.unwrap();
        assert_eq!(
            server.state.authorizations.lock().unwrap().last().cloned().flatten().as_deref(),
            Some("Bearer file-token")
        );
        std::fs::remove_dir_all(&dir).unwrap();

        let observer = Arc::new(MkObserver::default());
        let config = KubeletConfig {
            insecure_tls: true,
            bearer_token: Some(BearerToken::Static("wrong".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::clone(&observer));
        let message = client.node_usage("node-a").await.unwrap_err().to_string();
        assert!(message.contains("401") && message.contains("Unauthorized"), "{message}");
        assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "error")]);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_calls_share_one_fetch() {
        let server = mk_server().await;
        *server.state.delay.lock().unwrap() = Duration::from_millis(300);
        let config =
            KubeletConfig { ca_pem: Some(server.ca_pem.clone().into_bytes()), ..KubeletConfig::default() };
        let client = Arc::new(mk_client(&server, config, Arc::new(MkObserver::default())));
        let calls = all_at_once(20, |_| {
            let client = Arc::clone(&client);
            async move { client.node_usage("node-a").await }
        });
        for usage in calls.await {
            assert_eq!(usage.unwrap().pods.len(), 3);
        }
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn expired_cache_refetches_and_reports_rates() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            cache: CacheSettings::uncounted(Duration::from_millis(50)),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        client.node_usage("node-a").await.unwrap();
        // Ten seconds later the brewer used 2.5 more core-seconds.
        *server.state.body.lock().unwrap() = FIXTURE
            .replace("98.551009 1764496809876", "101.051009 1764496819876")
            .replace("2.5165824e+07 1764496809876", "2.5165824e+07 1764496819876");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let usage = client.node_usage("node-a").await.unwrap();
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 2);
        let pod = PodKey { namespace: "default".into(), name: "espresso-du-matin-5c9f8-qq7tn".into() };
        let brewer = &usage.pods[&pod][0];
        assert_eq!(brewer.cpu_nanocores, Some(250_000_000), "{brewer:?}");
        assert_eq!(brewer.window, Some(Duration::from_secs(10)));
        assert_eq!(brewer.timestamp, Some(ts(1_764_496_819_876)));
        // The other containers' samples did not move: no rate yet.
        let coredns = PodKey { namespace: "kube-system".into(), name: "coredns-76f75df574-8xk2p".into() };
        assert_eq!(usage.pods[&coredns][0].cpu_nanocores, None);
    }

    #[tokio::test]
    async fn a_node_asked_for_is_sampled_in_the_background_until_idle() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            cache: CacheSettings::uncounted(Duration::from_millis(200)),
            idle_after: Duration::from_millis(1_000),
            ..KubeletConfig::default()
        };
        let client = mk_sampling_client(&server, config, Arc::new(MkObserver::default()));
        let hits = || server.state.hits.load(Ordering::SeqCst);
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(hits(), 0, "nothing is sampled before a request asks");
        client.node_usage("node-a").await.unwrap();
        // The sampler woken by the request joined the request's fetch instead of doubling it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(hits(), 1, "one fetch for the request and the sampler it woke");
        // Sampled every 200 ms for a second after the request.
        tokio::time::sleep(Duration::from_millis(2_450)).await;
        let sampled = hits();
        assert!((4..=8).contains(&sampled), "{sampled} fetches");
        // Idle: no more fetches.
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        assert_eq!(hits(), sampled);
        // A request after the idle period resumes sampling.
        client.node_usage("node-a").await.unwrap();
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(hits() >= sampled + 3, "{} fetches", hits());
    }

    #[tokio::test]
    async fn connections_are_kept_between_fetches_unless_told_not_to() {
        for (reuse, want) in [(true, 1), (false, 3)] {
            let server = mk_server().await;
            let config = KubeletConfig {
                ca_pem: Some(server.ca_pem.clone().into_bytes()),
                cache: CacheSettings::uncounted(Duration::from_millis(20)),
                reuse_connections: reuse,
                ..KubeletConfig::default()
            };
            let client = mk_client(&server, config, Arc::new(MkObserver::default()));
            for _ in 0..3 {
                assert_eq!(client.node_usage("node-a").await.unwrap().pods.len(), 3);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            assert_eq!(server.state.hits.load(Ordering::SeqCst), 3);
            assert_eq!(server.state.connections.load(Ordering::SeqCst), want, "reuse_connections: {reuse}");
            assert_eq!(idle_connections(&client, usize::from(reuse)).await, usize::from(reuse));
        }
    }

    #[tokio::test]
    async fn a_connection_kept_after_a_large_answer_serves_the_next_fetch() {
        // An answer of many TLS records grows rustls' record buffer, which is shrunk before the
        // connection is parked; the kept connection must read the next answer whole.
        let server = mk_server().await;
        let padding = "# padding to span many TLS records\n".repeat(4096);
        *server.state.body.lock().unwrap() = format!("{padding}{FIXTURE}");
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            cache: CacheSettings::uncounted(Duration::from_millis(20)),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        for fetch in 1..=3 {
            let usage = client.node_usage("node-a").await.unwrap();
            assert_eq!(usage.pods.len(), 3, "fetch {fetch}");
            assert_eq!(idle_connections(&client, 1).await, 1, "fetch {fetch}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 3);
        assert_eq!(server.state.connections.load(Ordering::SeqCst), 1);
    }

    /// Waits until the client keeps `want` idle connections (they are parked by the exchange's
    /// connection task just after the fetch returns).
    async fn idle_connections(client: &KubeletClient, want: usize) -> usize {
        for _ in 0..100 {
            if client.inner.transport.idle_connections() == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        client.inner.transport.idle_connections()
    }

    #[tokio::test]
    async fn a_connection_the_kubelet_closed_is_replaced_without_a_failure() {
        // Seen closed before reuse, or reused (as when the close is still in flight): the request
        // fails on the kept connection and is sent again on a new one.
        for check in [true, false] {
            let server = mk_server().await;
            let observer = Arc::new(MkObserver::default());
            let config = KubeletConfig {
                ca_pem: Some(server.ca_pem.clone().into_bytes()),
                cache: CacheSettings::uncounted(Duration::from_millis(1)),
                ..KubeletConfig::default()
            };
            let client = mk_client(&server, config, Arc::clone(&observer));
            if !check {
                client.inner.transport.skip_open_check();
            }
            client.node_usage("node-a").await.unwrap();
            assert_eq!(idle_connections(&client, 1).await, 1);
            server.state.drop_connections.notify_waiters();
            tokio::time::sleep(Duration::from_millis(50)).await;
            assert_eq!(client.node_usage("node-a").await.unwrap().pods.len(), 3, "check {check}");
            assert_eq!(server.state.connections.load(Ordering::SeqCst), 2, "check {check}");
            assert_eq!(server.state.hits.load(Ordering::SeqCst), 2, "check {check}");
            assert_eq!(*observer.calls.lock().unwrap(), vec![("kubelet", "success"); 2], "check {check}");
            assert_eq!(idle_connections(&client, 1).await, 1, "the new connection is kept");
        }
    }

    #[tokio::test]
    async fn an_error_answer_read_to_its_end_keeps_its_connection() {
        let server = mk_server().await;
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            bearer_token: Some(BearerToken::Static("wrong".to_owned())),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        for _ in 0..2 {
            let message = client.node_usage("node-a").await.unwrap_err().to_string();
            assert!(message.contains("HTTP 401 Unauthorized: Unauthorized"), "{message}");
            assert_eq!(idle_connections(&client, 1).await, 1);
        }
        assert_eq!(server.state.hits.load(Ordering::SeqCst), 2);
        assert_eq!(server.state.connections.load(Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn connections_are_not_kept_after_connection_close_or_an_unread_body() {
        let server = mk_server().await;
        server.state.close.store(true, Ordering::SeqCst);
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            cache: CacheSettings::uncounted(Duration::from_millis(1)),
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        for _ in 0..2 {
            assert_eq!(client.node_usage("node-a").await.unwrap().pods.len(), 3);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert_eq!(server.state.connections.load(Ordering::SeqCst), 2, "Connection: close is honoured");
        assert_eq!(idle_connections(&client, 0).await, 0);

        // A body left unread (over the cap) leaves its connection unusable: closed.
        server.state.close.store(false, Ordering::SeqCst);
        let config = KubeletConfig {
            ca_pem: Some(server.ca_pem.clone().into_bytes()),
            max_body_bytes: 1024,
            ..KubeletConfig::default()
        };
        let client = mk_client(&server, config, Arc::new(MkObserver::default()));
        client.node_usage("node-a").await.unwrap_err();
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(client.inner.transport.idle_connections(), 0);
    }

    #[tokio::test]
    async fn too_many_containers_or_an_oversized_body_are_refused() {
        let server = mk_server().await;
        let too_many = KubeletConfig { max_containers: 1, ..KubeletConfig::default() };
        let too_big = KubeletConfig { max_body_bytes: 1024, ..KubeletConfig::default() };
        for (config, want) in
            [(too_many, "containers, more than the 1 accepted"), (too_big, "exceeds 1024 bytes")]
        {
            let config = KubeletConfig { ca_pem: Some(server.ca_pem.clone().into_bytes()), ..config };
            let client = mk_client(&server, config, Arc::new(MkObserver::default()));
            let message = client.node_usage("node-a").await.unwrap_err().to_string();
            assert!(message.contains(want), "{message}");
        }
    }
}
