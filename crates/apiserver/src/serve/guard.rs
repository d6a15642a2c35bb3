//! Overload and abuse protection in front of every handler, in the order kube-apiserver's
//! generic filter chain applies it:
//!
//! 1. size limits checked before anything else (before authentication calls a webhook): a
//!    request URI over [`MAX_URI_BYTES`] is a 414, a `labelSelector` or `fieldSelector` over
//!    [`MAX_SELECTOR_BYTES`] a 400 (headers are bounded by hyper, see [`crate::server`]);
//! 2. the request deadline (`WithRequestDeadline` + `WithTimeoutForNonLongRunningRequests`):
//!    `--request-timeout`, shortened by a valid `?timeout=`; a request still running then is
//!    dropped and answered `504 Timeout`;
//! 3. the in-flight limit (`WithMaxInFlightLimit`): at most `--max-requests-inflight`
//!    requests are served at once; beyond it a request is answered at once with
//!    `429 TooManyRequests` and `Retry-After: 1`, never queued. Health, discovery, OpenAPI,
//!    `/version` and `/metrics` are exempt ([`is_exempt`]): they are precomputed, never touch
//!    an upstream, and must keep answering (kube-aggregator's availability check, probes,
//!    scrapes) while the server is saturated.
//!
//! Panics are caught one level further out, in the router's `observe` layer ([`recover`]).

use std::any::Any;
use std::sync::Arc;
use std::time::Duration;

use axum::response::{IntoResponse, Response};
use http::{Method, Uri};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use k8s_wire::{ApiError, go_quote};
use k8s_wire::{QueryParams, split_path};

/// Longest request URI (path and query) accepted: 8 KiB, the usual front-proxy limit. Longer
/// ones are answered 414 before authentication. (hyper itself refuses URIs over 64 KiB on
/// HTTP/1.1, and header blocks over the limit set in [`crate::server`].)
pub const MAX_URI_BYTES: usize = 8 * 1024;
/// Longest `labelSelector` / `fieldSelector` accepted (after percent-decoding): 4 KiB.
pub const MAX_SELECTOR_BYTES: usize = 4 * 1024;
/// Default of `--max-requests-inflight` (kube-apiserver's default).
pub const DEFAULT_MAX_IN_FLIGHT: u32 = 400;
/// Default of `--request-timeout` (kube-apiserver's default).
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// `Retry-After` of a 429 from the in-flight limit (kube-apiserver sends 1).
pub const TOO_MANY_REQUESTS_RETRY_AFTER_SECONDS: u32 = 1;

/// The limits in force and the in-flight semaphore.
#[derive(Debug)]
pub struct Guard {
    in_flight: Option<Arc<Semaphore>>,
    max_in_flight: u32,
    request_timeout: Duration,
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
        }
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

/// Whether a request is exempt from the in-flight limit: `GET`/`HEAD` of health, discovery
/// (`/api`, `/apis`, `/apis/<g>`, `/apis/<g>/<v>`), OpenAPI, `/version` and `/metrics`.
pub fn is_exempt(method: &Method, path: &str) -> bool {
    if method != Method::GET && method != Method::HEAD {
        return false;
    }
    let segments = split_path(path);
    let segs: Vec<&str> = segments.iter().map(AsRef::as_ref).collect();
    matches!(
        segs.as_slice(),
        ["healthz" | "livez" | "readyz" | "version" | "metrics" | "api" | "apis"]
            | ["healthz" | "livez" | "readyz", _]
            | ["apis", _]
            | ["apis", _, _]
            | ["openapi", ..]
    )
}

/// A request let in: its in-flight permit (when it counts against the limit), released when
/// this is dropped, and its deadline.
#[derive(Debug)]
pub struct Admission {
    _permit: Option<OwnedSemaphorePermit>,
    /// How long the request may take.
    pub timeout: Duration,
}

/// The size checks, the deadline and the in-flight limit (module documentation): the
/// request's [`Admission`], or the Status to answer. `query` is the request's parsed query.
pub fn admit(guard: &Guard, method: &Method, uri: &Uri, query: &QueryParams) -> Result<Admission, ApiError> {
    let uri_len = uri.path_and_query().map_or(0, |pq| pq.as_str().len());
    if uri_len > MAX_URI_BYTES {
        return Err(ApiError::UriTooLong(format!(
            "the request URI is {uri_len} bytes long; the maximum is {MAX_URI_BYTES}"
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
    let permit = match &guard.in_flight {
        Some(semaphore) if !is_exempt(method, uri.path()) => {
            match Arc::clone(semaphore).try_acquire_owned() {
                Ok(permit) => Some(permit),
                Err(_) => {
                    tracing::debug!(limit = guard.max_in_flight, "in-flight limit reached: 429");
                    return Err(ApiError::TooManyRequests {
                        retry_after: TOO_MANY_REQUESTS_RETRY_AFTER_SECONDS,
                    });
                }
            }
        }
        _ => None,
    };
    Ok(Admission { _permit: permit, timeout })
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

    #[test]
    fn exempt_paths() {
        for path in [
            "/healthz",
            "/livez",
            "/readyz",
            "/readyz/ping",
            "/version",
            "/metrics",
            "/api",
            "/apis",
            "/apis/stats.une-tasse-de.cafe",
            "/apis/stats.une-tasse-de.cafe/v1alpha1/",
            "/openapi/v2",
            "/openapi/v3/apis/stats.une-tasse-de.cafe/v1alpha1",
        ] {
            assert!(is_exempt(&Method::GET, path), "{path}");
        }
        for path in ["/apis/g/v/widgets", "/apis/g/v/namespaces/a/widgets", "/nope", "/api/v1/pods"] {
            assert!(!is_exempt(&Method::GET, path), "{path}");
        }
        assert!(!is_exempt(&Method::POST, "/healthz"));
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
