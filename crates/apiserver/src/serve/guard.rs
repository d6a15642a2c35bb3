//! Overload and abuse protection in front of every handler, in the order kube-apiserver's
//! generic filter chain applies it:
//!
//! 1. size limits checked before anything else (before authentication calls a webhook): a
//!    request URI over [`MAX_URI_BYTES`] is a 414, a `labelSelector` or `fieldSelector` over
//!    [`MAX_SELECTOR_BYTES`] a 400, header fields over [`MAX_HEADER_BYTES`] (counted as HTTP/2
//!    counts a header list) a 431 (hyper refuses most such heads first, see
//!    [`super::listener`], but an HTTP/1.1 head read at once can pass its buffer's bound);
//! 2. the request deadline (`WithRequestDeadline` + `WithTimeoutForNonLongRunningRequests`):
//!    `--request-timeout`, shortened by a valid `?timeout=`; a request still running then is
//!    dropped and answered `504 Timeout`;
//! 3. the in-flight limit (`WithMaxInFlightLimit`): at most `--max-requests-inflight`
//!    requests are served at once; beyond it a request is answered at once with
//!    `429 TooManyRequests` and `Retry-After: 1`, never queued. The exact paths of health,
//!    discovery and OpenAPI of the groups served, `/version` and `/metrics` are exempt
//!    ([`is_exempt`], [`ExemptPaths`]): they are precomputed, never touch an upstream, and must
//!    keep answering (kube-aggregator's availability check, probes, scrapes) while the server
//!    is saturated. Only exact paths, and only of what is served: every other path (an unknown
//!    group, `/openapi/v3/apis/<anything>`, `//apis`, a trailing slash) counts, so that a
//!    client cannot make unbounded unique requests (each one a review to authorize) outside
//!    the limit. A request whose answer is ready but waits for its connection's body slot
//!    gives its seat back ([`Seat`], `super::fairness::ConnectionSlots`): what it holds then
//!    is its answer, not work, and a client that never reads must not hold the seats of
//!    others.
//!
//! Panics are caught one level further out, in the router's `observe` layer ([`recover`]).

use std::any::Any;
use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::response::Response;
use http::{HeaderMap, Method, Uri};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::StatusResponse;
use k8s_wire::QueryParams;

use k8s_wire::{ApiError, go_quote};

/// Largest request head accepted: the HTTP/1.1 read buffer (request line and headers) and the
/// HTTP/2 header list (`SETTINGS_MAX_HEADER_LIST_SIZE`, path included). Beyond it hyper (the
/// serving loop) or [`admit`] answers 431. 64 KiB leaves room for the `X-Remote-Group` headers of users in many groups, which
/// kube-aggregator forwards.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;

/// Longest request URI (path and query) accepted: 8 KiB, the usual front-proxy limit. Longer
/// ones are answered 414 before authentication. (hyper itself refuses URIs over 64 KiB on
/// HTTP/1.1, and header blocks over the limit set in [`super::listener`].)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Longest `labelSelector` / `fieldSelector` accepted (after percent-decoding): 4 KiB.
pub const MAX_SELECTOR_BYTES: usize = 4 * 1024;
/// Default of `--max-requests-inflight` (kube-apiserver's default).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 400;
/// Default of `--request-timeout` (kube-apiserver's default).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// `Retry-After` of a 429 from the in-flight limit (kube-apiserver sends 1).
pub const TOO_MANY_REQUESTS_RETRY_AFTER_SECONDS: u32 = 1;

/// The health endpoints (their sub-checks are the server's: [`ExemptPaths::new`]).
const HEALTH: [&str; 3] = ["/healthz", "/livez", "/readyz"];
/// The other documents every server serves whatever its groups.
const GENERIC_DOCUMENTS: [&str; 6] = ["/api", "/apis", "/openapi/v2", "/openapi/v3", "/version", "/metrics"];

/// The exact paths exempt from the in-flight limit: health (and the sub-checks named), the
/// generic documents, and the discovery and OpenAPI documents of each group-version served.
/// Compared with the raw path, byte for byte: `/apis/g/` or `//apis` count against the limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExemptPaths(HashSet<Box<str>>);

impl Default for ExemptPaths {
    /// Health and the generic documents, no group.
    fn default() -> Self {
        Self(HEALTH.iter().chain(&GENERIC_DOCUMENTS).map(|p| Box::from(*p)).collect())
    }
}

impl ExemptPaths {
    /// [`ExemptPaths::default`], plus `/apis/<g>`, `/apis/<g>/<v>` and
    /// `/openapi/v3/apis/<g>/<v>` for each served `(g, v)` of `group_versions`, and
    /// `/<endpoint>/<check>` for each sub-check served, `(endpoint, check)` of `checks`
    /// (`("readyz", "ping")`).
    pub fn new<G, V, C>(
        group_versions: impl IntoIterator<Item = (G, V)>,
        checks: impl IntoIterator<Item = (&'static str, C)>,
    ) -> Self
    where
        G: AsRef<str>,
        V: AsRef<str>,
        C: AsRef<str>,
    {
        let mut paths = Self::default().0;
        for (group, version) in group_versions {
            let (group, version) = (group.as_ref(), version.as_ref());
            paths.insert(format!("/apis/{group}").into());
            paths.insert(format!("/apis/{group}/{version}").into());
            paths.insert(format!("/openapi/v3/apis/{group}/{version}").into());
        }
        for (endpoint, check) in checks {
            paths.insert(format!("/{endpoint}/{}", check.as_ref()).into());
        }
        Self(paths)
    }

    /// Whether `path` is one of them.
    pub fn contains(&self, path: &str) -> bool {
        self.0.contains(path)
    }
}

/// The limits in force and the in-flight semaphore.
#[derive(Debug)]
pub struct Guard {
    in_flight: Option<Arc<Semaphore>>,
    max_in_flight: u32,
    request_timeout: Duration,
    exempt: ExemptPaths,
}

impl Default for Guard {
    fn default() -> Self {
        Self::new(DEFAULT_MAX_IN_FLIGHT, DEFAULT_REQUEST_TIMEOUT)
    }
}

impl Guard {
    /// At most `max_in_flight` requests at once (0: no limit), each at most `request_timeout`.
    pub fn new(max_in_flight: u32, request_timeout: Duration) -> Self {
        let permits =
            usize::try_from(max_in_flight).unwrap_or(Semaphore::MAX_PERMITS).min(Semaphore::MAX_PERMITS);
        Self {
            in_flight: (max_in_flight > 0).then(|| Arc::new(Semaphore::new(permits))),
            max_in_flight,
            request_timeout,
            exempt: ExemptPaths::default(),
        }
    }

    /// The same limits, sharing the same seats, with `exempt` as the exempt paths (the server
    /// knows which groups it serves once its router is built).
    pub fn with_exempt(&self, exempt: ExemptPaths) -> Self {
        Self {
            in_flight: self.in_flight.clone(),
            max_in_flight: self.max_in_flight,
            request_timeout: self.request_timeout,
            exempt,
        }
    }

    /// The paths exempt from the in-flight limit.
    pub fn exempt(&self) -> &ExemptPaths {
        &self.exempt
    }

    /// `--max-requests-inflight` (0: unlimited).
    pub fn max_in_flight(&self) -> u32 {
        self.max_in_flight
    }

    /// `--request-timeout`.
    pub fn request_timeout(&self) -> Duration {
        self.request_timeout
    }
}

/// Whether a request is exempt from the in-flight limit: a `GET` or `HEAD` of one of the
/// `exempt` paths, exactly.
pub fn is_exempt(exempt: &ExemptPaths, method: &Method, path: &str) -> bool {
    (method == Method::GET || method == Method::HEAD) && exempt.contains(path)
}

/// A request's in-flight seat, shared between the request and its connection's body slots:
/// given back when the request ends, or earlier by [`Seat::release`]. The default holds none.
#[derive(Debug, Clone, Default)]
pub struct Seat(Option<Arc<Mutex<Option<OwnedSemaphorePermit>>>>);

impl Seat {
    /// Gives the seat back now (idempotent): the request no longer counts against the limit.
    pub fn release(&self) {
        if let Some(permit) = &self.0 {
            permit.lock().unwrap_or_else(PoisonError::into_inner).take();
        }
    }

    /// Whether a seat is still held.
    pub fn is_held(&self) -> bool {
        self.0.as_ref().is_some_and(|permit| permit.lock().unwrap_or_else(PoisonError::into_inner).is_some())
    }
}

/// A request let in: its in-flight seat (when it counts against the limit), given back when
/// this is dropped, and its deadline.
#[derive(Debug)]
pub struct Admission {
    seat: Seat,
    /// How long the request may take.
    pub timeout: Duration,
}

impl Admission {
    /// The request's seat, for its connection's body slots (`ConnectionSlots::with_seat`).
    pub fn seat(&self) -> Seat {
        self.seat.clone()
    }
}

impl Drop for Admission {
    fn drop(&mut self) {
        self.seat.release();
    }
}

/// The size checks, the deadline and the in-flight limit (module documentation): the
/// request's [`Admission`], or the Status to answer. `query` is the request's parsed query.
pub fn admit(
    guard: &Guard,
    method: &Method,
    uri: &Uri,
    headers: &HeaderMap,
    query: &QueryParams,
) -> Result<Admission, ApiError> {
    let uri_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return Err(ApiError::UriTooLong(format!(
            "the request URI is {uri_len} bytes long; the maximum is {MAX_URI_BYTES}"
        )));
    }
    // hyper bounds an HTTP/1.1 head by its read buffer, which one read may fill past the
    // limit with a whole head; HTTP/2's SETTINGS_MAX_HEADER_LIST_SIZE is exact. The same
    // count for both (an HTTP/2 field's name and value plus 32 bytes), before any webhook.
    let header_bytes: usize =
        headers.iter().map(|(name, value)| name.as_str().len() + value.len() + 32).sum();
    if header_bytes > MAX_HEADER_BYTES {
        return Err(ApiError::HeaderFieldsTooLarge(format!(
            "the request's header fields are {header_bytes} bytes long; the maximum is {MAX_HEADER_BYTES}"
        )));
    }
    for name in ["labelSelector", "fieldSelector"] {
        if let Some(value) = query.get(name)
            && value.len() > MAX_SELECTOR_BYTES
        {
            return Err(ApiError::BadRequest(format!(
                "{name} is {} bytes long; the maximum is {MAX_SELECTOR_BYTES}",
                value.len()
            )));
        }
    }
    let timeout = deadline(query.get("timeout"), guard.request_timeout)?;
    let seat = match &guard.in_flight {
        Some(semaphore) if !is_exempt(&guard.exempt, method, uri.path()) => {
            match Arc::clone(semaphore).try_acquire_owned() {
                Ok(permit) => Seat(Some(Arc::new(Mutex::new(Some(permit))))),
                Err(_) => {
                    tracing::debug!(limit = guard.max_in_flight, "in-flight limit reached: 429");
                    return Err(ApiError::TooManyRequests {
                        retry_after: TOO_MANY_REQUESTS_RETRY_AFTER_SECONDS,
                    });
                }
            }
        }
        _ => Seat::default(),
    };
    Ok(Admission { seat, timeout })
}

/// `work`'s response, or the 504 Status when it takes longer than `timeout` (`path` is
/// logged).
pub async fn within_deadline(
    timeout: Duration,
    path: &str,
    work: impl Future<Output = Response>,
) -> Response {
    match tokio::time::timeout(timeout, work).await {
        Ok(response) => response,
        Err(_) => {
            tracing::warn!(path = %truncate(path, 256), ?timeout, "request timed out: 504");
            ApiError::Timeout {
                message: "request did not complete within requested timeout - context deadline exceeded"
                    .to_owned(),
                retry_after: 0,
            }
            .into_response()
        }
    }
}

/// The deadline of a request: `max` unless `?timeout=` asks for a shorter positive one
/// (kube's `WithRequestDeadline`: `0`, negative or longer values leave `max`; a value that is
/// not a duration is a 400).
fn deadline(param: Option<&str>, max: Duration) -> Result<Duration, ApiError> {
    let Some(text) = param.filter(|t| !t.is_empty()) else { return Ok(max) };
    let negative = text.strip_prefix('-');
    match k8s_wire::duration::parse(negative.unwrap_or(text)) {
        Ok(_) if negative.is_some() => Ok(max),
        Ok(asked) if !asked.is_zero() && asked < max => Ok(asked),
        Ok(_) => Ok(max),
        Err(_) => Err(ApiError::BadRequest(format!(
            "invalid timeout specified in the request URL - time: invalid duration {}",
            go_quote(text)
        ))),
    }
}

/// The 500 answered for a request whose handling panicked; the panic message goes to the log
/// only.
pub fn recover(method: &Method, path: &str, payload: &(dyn Any + Send)) -> Response {
    let message = payload
        .downcast_ref::<&str>()
        .map(|s| (*s).to_owned())
        .or_else(|| payload.downcast_ref::<String>().cloned())
        .unwrap_or_else(|| "non-string panic payload".to_owned());
    ApiError::Internal(format!("panic serving {method} {}: {message}", truncate(path, 256))).into_response()
}

/// At most `max` bytes of `s`, cut on a character boundary.
fn truncate(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The exempt set of a server serving `g.example/v1` and `g.example/v2`, with the sub-check
    /// `ping` of `/readyz` and `/livez`.
    fn mk_exempt() -> ExemptPaths {
        ExemptPaths::new([("g.example", "v1"), ("g.example", "v2")], [("readyz", "ping"), ("livez", "ping")])
    }

    #[test]
    fn only_the_exact_paths_of_what_is_served_are_exempt() {
        let exempt = mk_exempt();
        for path in [
            "/healthz",
            "/livez",
            "/readyz",
            "/readyz/ping",
            "/livez/ping",
            "/version",
            "/metrics",
            "/api",
            "/apis",
            "/apis/g.example",
            "/apis/g.example/v1",
            "/apis/g.example/v2",
            "/openapi/v2",
            "/openapi/v3",
            "/openapi/v3/apis/g.example/v1",
        ] {
            assert!(is_exempt(&exempt, &Method::GET, path), "{path}");
            assert!(is_exempt(&exempt, &Method::HEAD, path), "{path}");
        }
        for path in [
            // Not served: a group, a version, an OpenAPI document, a sub-check.
            "/apis/other.example",
            "/apis/other.example/v1",
            "/apis/g.example/v3",
            "/openapi/v3/apis/other.example/v1",
            "/openapi/v3/apis/g.example/v3",
            "/openapi/v3/apis/g.example",
            "/openapi/v4",
            "/readyz/informer-sync",
            "/healthz/ping",
            // Spellings of a served path: each would be a path of its own to authorize.
            "/apis/g.example/v1/",
            "//apis/g.example/v1",
            "/apis//g.example",
            "/apis/g%2Eexample",
            "/healthz/",
            // Resources.
            "/apis/g.example/v1/widgets",
            "/apis/g.example/v1/namespaces/a/widgets",
            "/api/v1/pods",
            "/nope",
        ] {
            assert!(!is_exempt(&exempt, &Method::GET, path), "{path}");
        }
        assert!(!is_exempt(&exempt, &Method::POST, "/healthz"));
        // Without groups: health and the generic documents only.
        let generic = ExemptPaths::default();
        assert!(is_exempt(&generic, &Method::GET, "/openapi/v2"));
        assert!(!is_exempt(&generic, &Method::GET, "/apis/g.example"));
    }

    /// A unique path (as a flood of them would send) takes a seat, so the limit refuses it;
    /// the exact served paths still answer.
    #[test]
    fn unique_paths_count_against_the_limit() {
        let guard = Guard::new(1, DEFAULT_REQUEST_TIMEOUT).with_exempt(mk_exempt());
        let get = |path: &str| {
            let uri: Uri = path.parse().unwrap();
            admit(&guard, &Method::GET, &uri, &HeaderMap::new(), &QueryParams::parse(uri.query()))
        };
        let held = get("/apis/g.example/v1/widgets").unwrap();
        assert!(held.seat().is_held());
        for unique in ["/apis/x7f3a9c", "/apis/x7f3a9c/v1", "/openapi/v3/apis/x7f3a9c/v1", "/openapi/x7f3a9c"]
        {
            assert!(matches!(get(unique), Err(ApiError::TooManyRequests { retry_after: 1 })), "{unique}");
        }
        for served in ["/apis/g.example", "/apis/g.example/v1", "/openapi/v3/apis/g.example/v2", "/readyz"] {
            let admission = get(served).unwrap();
            assert!(!admission.seat().is_held(), "{served} takes no seat");
        }
        drop(held);
        assert!(get("/apis/x7f3a9c").is_ok(), "the seat is back");
    }

    /// A seat given back early (the answer waits for its connection) lets the next request
    /// in; dropping the admission afterwards gives nothing back twice.
    #[test]
    fn a_released_seat_lets_the_next_request_in() {
        let guard = Guard::new(1, DEFAULT_REQUEST_TIMEOUT);
        let uri: Uri = "/apis/g.example/v1/widgets".parse().unwrap();
        let admit = || admit(&guard, &Method::GET, &uri, &HeaderMap::new(), &QueryParams::default());
        let first = admit().unwrap();
        assert!(admit().is_err());
        first.seat().release();
        assert!(!first.seat().is_held());
        let second = admit().unwrap();
        drop(first);
        assert!(admit().is_err(), "the second request still holds the only seat");
        drop(second);
        assert!(admit().is_ok());
    }

    /// Header fields are counted as an HTTP/2 header list (name, value, 32 bytes each):
    /// one byte past the limit is a 431 naming both sizes, the limit itself passes.
    #[test]
    fn header_fields_over_the_limit_are_431() {
        let guard = Guard::default();
        let uri: Uri = "/apis".parse().unwrap();
        let head = |value_len: usize| {
            let mut headers = HeaderMap::new();
            headers.insert("x-big", http::HeaderValue::from_str(&"b".repeat(value_len)).unwrap());
            headers
        };
        let fits = MAX_HEADER_BYTES - "x-big".len() - 32;
        assert!(admit(&guard, &Method::GET, &uri, &head(fits), &QueryParams::default()).is_ok());
        let err = admit(&guard, &Method::GET, &uri, &head(fits + 1), &QueryParams::default()).unwrap_err();
        assert_eq!(err.status_code(), http::StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        assert_eq!(
            err.to_string(),
            format!(
                "the request's header fields are {} bytes long; the maximum is {MAX_HEADER_BYTES}",
                MAX_HEADER_BYTES + 1
            )
        );
    }

    #[test]
    fn deadline_follows_kube() {
        let max = Duration::from_secs(60);
        assert_eq!(deadline(None, max).unwrap(), max);
        assert_eq!(deadline(Some(""), max).unwrap(), max);
        assert_eq!(deadline(Some("5s"), max).unwrap(), Duration::from_secs(5));
        assert_eq!(deadline(Some("0"), max).unwrap(), max);
        assert_eq!(deadline(Some("-1s"), max).unwrap(), max);
        assert_eq!(deadline(Some("2h"), max).unwrap(), max);
        let err = deadline(Some("soon"), max).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid timeout specified in the request URL - time: invalid duration \"soon\""
        );
    }

    #[test]
    fn truncate_respects_char_boundaries() {
        assert_eq!(truncate("abc", 2), "ab");
        assert_eq!(truncate("éé", 3), "é");
        assert_eq!(truncate("ab", 5), "ab");
    }
}
