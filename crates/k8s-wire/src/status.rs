//! Error responses: every failure of every endpoint is rendered here as a Kubernetes
//! `metav1.Status` (`kind: Status`, `apiVersion: v1`, `status: Failure`), with the HTTP status,
//! `reason`, `details` and message wording of kube-apiserver (`apimachinery/pkg/api/errors`),
//! always as `application/json` and with `Retry-After` when a retry delay is known
//! (docs/wire.md, "Errors").

use std::fmt;

use http::{HeaderValue, StatusCode, header};
use serde::Serialize;

/// A resource qualified by its API group (`schema.GroupResource`), as error messages name it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct GroupResource {
    /// API group (`stats.une-tasse-de.cafe`); empty for the core group.
    pub group: String,
    /// Plural resource name (`podmetricssummaries`).
    pub resource: String,
}

impl GroupResource {
    /// Builds a group-qualified resource.
    pub fn new(group: impl Into<String>, resource: impl Into<String>) -> Self {
        Self { group: group.into(), resource: resource.into() }
    }

    fn is_empty(&self) -> bool {
        self.group.is_empty() && self.resource.is_empty()
    }
}

impl fmt::Display for GroupResource {
    /// `<resource>.<group>`, or `<resource>` for the core group (`GroupResource.String()`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.group.is_empty() {
            f.write_str(&self.resource)
        } else {
            write!(f, "{}.{}", self.resource, self.group)
        }
    }
}

/// Message of a 500: the detail goes to the log, never to the client.
const INTERNAL_MESSAGE: &str =
    "Internal error occurred: the server could not complete the request; the details are in its log";

/// Every error the HTTP layer answers, each rendered as a `metav1.Status`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ApiError {
    /// 400 `BadRequest`: a client mistake, the message says exactly what was wrong.
    #[error("{0}")]
    BadRequest(String),
    /// 404 `NotFound` for a named object: `<plural>.<group> "<name>" not found`.
    #[error("{resource} {} not found", go_quote(.name))]
    NotFound {
        /// The resource that was looked up.
        resource: GroupResource,
        /// The name that does not exist.
        name: String,
    },
    /// 404 `NotFound` for a path nothing is served at (go-restful's wording).
    #[error("the server could not find the requested resource")]
    PathNotFound,
    /// 405 `MethodNotAllowed` for a verb a resource does not support:
    /// `<verb> is not supported on resources of kind "<plural>.<group>"`.
    #[error("{verb} is not supported on resources of kind {}", go_quote(&.resource.to_string()))]
    MethodNotAllowed {
        /// The Kubernetes verb (`create`, `update`, `patch`, `delete`, `deletecollection`, `watch`).
        verb: String,
        /// The resource it was attempted on.
        resource: GroupResource,
    },
    /// 405 `MethodNotAllowed` for an HTTP method on a non-resource path (`POST /apis`).
    #[error("the server does not allow this method on the requested resource")]
    PathMethodNotAllowed,
    /// 406 `NotAcceptable`: no acceptable representation (message from content negotiation).
    #[error("{0}")]
    NotAcceptable(String),
    /// 410 `Gone`.
    #[error("{0}")]
    Gone(String),
    /// 410 `Expired` (an expired continue token or resourceVersion).
    #[error("{0}")]
    Expired(String),
    /// 429 `TooManyRequests` with a `Retry-After` delay in seconds.
    #[error("Too many requests, please try again later.")]
    TooManyRequests {
        /// Seconds the client should wait.
        retry_after: u32,
    },
    /// 414 with reason `""` (`StatusReasonUnknown`: Kubernetes has no reason for it): the
    /// request URI is longer than the server accepts.
    #[error("{0}")]
    UriTooLong(String),
    /// 431 with reason `""` (Kubernetes has no reason for it either): the request's header
    /// fields are larger than the server accepts.
    #[error("{0}")]
    HeaderFieldsTooLarge(String),
    /// 504 `Timeout` (`errors.NewTimeoutError`): `Timeout: <message>`, with
    /// `details.retryAfterSeconds` when non-zero (`details: {}` otherwise).
    #[error("Timeout: {message}")]
    Timeout {
        /// What timed out.
        message: String,
        /// Seconds the client should wait; 0 for none.
        retry_after: u32,
    },
    /// 500 `InternalError`. The detail is logged once when the response is rendered; the
    /// client gets a generic message.
    #[error("{INTERNAL_MESSAGE}")]
    Internal(String),
    /// 503 `ServiceUnavailable`, with `Retry-After` when a delay is known.
    #[error("{message}")]
    ServiceUnavailable {
        /// What is unavailable.
        message: String,
        /// Seconds the client should wait, when known.
        retry_after: Option<u32>,
    },
    /// 401 `Unauthorized` (message `Unauthorized`, as the generic server words it).
    #[error("Unauthorized")]
    Unauthorized,
    /// 403 `Forbidden`, worded like `errors.NewForbidden`:
    /// `<plural>.<group> "<name>" is forbidden: <reason>`, `<plural>.<group> is forbidden:
    /// <reason>` without a name, `forbidden: <reason>` for non-resource paths.
    #[error("{}", forbidden_message(.resource, .name, .reason))]
    Forbidden {
        /// The resource; empty for a non-resource request.
        resource: GroupResource,
        /// The object name, empty when the request has none.
        name: String,
        /// The authorizer's explanation (`User "alice" cannot list resource ...`).
        reason: String,
    },
}

fn forbidden_message(resource: &GroupResource, name: &str, reason: &str) -> String {
    if resource.is_empty() {
        format!("forbidden: {reason}")
    } else if name.is_empty() {
        format!("{resource} is forbidden: {reason}")
    } else {
        format!("{resource} {} is forbidden: {reason}", go_quote(name))
    }
}

impl ApiError {
    /// The HTTP status code (equal to `code` in the body).
    pub fn status_code(&self) -> StatusCode {
        match self {
            Self::BadRequest(_) => StatusCode::BAD_REQUEST,
            Self::NotFound { .. } | Self::PathNotFound => StatusCode::NOT_FOUND,
            Self::MethodNotAllowed { .. } | Self::PathMethodNotAllowed => StatusCode::METHOD_NOT_ALLOWED,
            Self::NotAcceptable(_) => StatusCode::NOT_ACCEPTABLE,
            Self::Gone(_) | Self::Expired(_) => StatusCode::GONE,
            Self::TooManyRequests { .. } => StatusCode::TOO_MANY_REQUESTS,
            Self::UriTooLong(_) => StatusCode::URI_TOO_LONG,
            Self::HeaderFieldsTooLarge(_) => StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            Self::Timeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            Self::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
            Self::ServiceUnavailable { .. } => StatusCode::SERVICE_UNAVAILABLE,
            Self::Unauthorized => StatusCode::UNAUTHORIZED,
            Self::Forbidden { .. } => StatusCode::FORBIDDEN,
        }
    }

    /// The `metav1.StatusReason`.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "BadRequest",
            Self::NotFound { .. } | Self::PathNotFound => "NotFound",
            Self::MethodNotAllowed { .. } | Self::PathMethodNotAllowed => "MethodNotAllowed",
            Self::NotAcceptable(_) => "NotAcceptable",
            Self::Gone(_) => "Gone",
            Self::Expired(_) => "Expired",
            Self::TooManyRequests { .. } => "TooManyRequests",
            Self::UriTooLong(_) | Self::HeaderFieldsTooLarge(_) => "",
            Self::Timeout { .. } => "Timeout",
            Self::Internal(_) => "InternalError",
            Self::ServiceUnavailable { .. } => "ServiceUnavailable",
            Self::Unauthorized => "Unauthorized",
            Self::Forbidden { .. } => "Forbidden",
        }
    }

    /// Seconds for `Retry-After` / `details.retryAfterSeconds`, when known.
    pub fn retry_after(&self) -> Option<u32> {
        match self {
            Self::TooManyRequests { retry_after } => Some(*retry_after),
            Self::Timeout { retry_after, .. } => Some(*retry_after),
            Self::ServiceUnavailable { retry_after, .. } => *retry_after,
            _ => None,
        }
    }

    fn details(&self) -> Option<Details> {
        let retry_after_seconds = self.retry_after().unwrap_or(0);
        match self {
            Self::NotFound { resource, name } => Some(Details {
                name: name.clone(),
                group: resource.group.clone(),
                kind: resource.resource.clone(),
                ..Details::default()
            }),
            // go-restful's 404 and NewForbidden without a resource both carry `details: {}`.
            Self::PathNotFound => Some(Details::default()),
            Self::MethodNotAllowed { resource, .. } => Some(Details {
                group: resource.group.clone(),
                kind: resource.resource.clone(),
                ..Details::default()
            }),
            Self::Forbidden { resource, name, .. } => Some(Details {
                name: name.clone(),
                group: resource.group.clone(),
                kind: resource.resource.clone(),
                ..Details::default()
            }),
            Self::Internal(_) => {
                Some(Details { causes: vec![Cause { message: INTERNAL_MESSAGE }], ..Details::default() })
            }
            Self::TooManyRequests { .. } | Self::Timeout { .. } => {
                Some(Details { retry_after_seconds, ..Details::default() })
            }
            Self::ServiceUnavailable { .. } if retry_after_seconds > 0 => {
                Some(Details { retry_after_seconds, ..Details::default() })
            }
            _ => None,
        }
    }

    /// The `metav1.Status` body.
    pub fn to_status_json(&self) -> Vec<u8> {
        let code = self.status_code().as_u16();
        let status = Status {
            kind: "Status",
            api_version: "v1",
            metadata: Empty {},
            status: "Failure",
            message: self.to_string(),
            reason: self.reason(),
            details: self.details(),
            code,
        };
        // Serializing plain strings and integers cannot fail; keep a literal fallback anyway.
        serde_json::to_vec(&status).unwrap_or_else(|_| {
            format!(
                r#"{{"kind":"Status","apiVersion":"v1","metadata":{{}},"status":"Failure","code":{code}}}"#
            )
            .into_bytes()
        })
    }
}

impl ApiError {
    /// The whole HTTP response: the Status' code, its JSON body as `application/json`, and
    /// `Retry-After` when a retry delay is known. The serving layer converts it to its body
    /// type (and logs internal errors, whose detail the body withholds).
    pub fn to_http_response(&self) -> http::Response<Vec<u8>> {
        let mut response = http::Response::new(self.to_status_json());
        *response.status_mut() = self.status_code();
        let headers = response.headers_mut();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if let Some(seconds) = self.retry_after().filter(|s| *s > 0) {
            headers.insert(header::RETRY_AFTER, HeaderValue::from(seconds));
        }
        response
    }
}

#[derive(Serialize)]
struct Empty {}

#[derive(Serialize)]
struct Status {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: Empty,
    status: &'static str,
    message: String,
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    details: Option<Details>,
    code: u16,
}

#[derive(Serialize, Default)]
struct Details {
    #[serde(skip_serializing_if = "String::is_empty")]
    name: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    group: String,
    #[serde(skip_serializing_if = "String::is_empty")]
    kind: String,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    causes: Vec<Cause>,
    #[serde(rename = "retryAfterSeconds", skip_serializing_if = "is_zero")]
    retry_after_seconds: u32,
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

#[derive(Serialize)]
struct Cause {
    message: &'static str,
}

/// Quotes a string the way Go's `%q` / `strconv.Quote` does, so messages read exactly like
/// kube-apiserver's (`podmetricssummaries.stats.une-tasse-de.cafe "x" not found`).
pub fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            '\u{fffd}' => out.push_str("\\ufffd"),
            c if c.is_control() => {
                out.push_str(&format!("\\u{:04x}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    fn body(err: &ApiError) -> Value {
        serde_json::from_slice(&err.to_status_json()).unwrap()
    }

    fn pms() -> GroupResource {
        GroupResource::new("stats.une-tasse-de.cafe", "podmetricssummaries")
    }

    #[test]
    fn not_found_is_worded_like_kube() {
        let err = ApiError::NotFound { resource: pms(), name: "x".into() };
        assert_eq!(
            body(&err),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "podmetricssummaries.stats.une-tasse-de.cafe \"x\" not found",
                "reason": "NotFound",
                "details": {"name": "x", "group": "stats.une-tasse-de.cafe", "kind": "podmetricssummaries"},
                "code": 404
            })
        );
    }

    #[test]
    fn method_not_allowed_is_worded_like_kube() {
        let err = ApiError::MethodNotAllowed { verb: "create".into(), resource: pms() };
        assert_eq!(
            body(&err),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "create is not supported on resources of kind \"podmetricssummaries.stats.une-tasse-de.cafe\"",
                "reason": "MethodNotAllowed",
                "details": {"group": "stats.une-tasse-de.cafe", "kind": "podmetricssummaries"},
                "code": 405
            })
        );
    }

    #[test]
    fn path_not_found_has_empty_details() {
        assert_eq!(
            body(&ApiError::PathNotFound),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "the server could not find the requested resource",
                "reason": "NotFound", "details": {}, "code": 404
            })
        );
    }

    #[test]
    fn bad_request_and_not_acceptable_have_no_details() {
        let b = body(&ApiError::BadRequest("nope".into()));
        assert_eq!(b["code"], 400);
        assert_eq!(b["reason"], "BadRequest");
        assert!(b.get("details").is_none());
        let n = body(&ApiError::NotAcceptable(
            "only the following media types are accepted: application/json".into(),
        ));
        assert_eq!(n["code"], 406);
        assert_eq!(n["reason"], "NotAcceptable");
    }

    #[test]
    fn internal_hides_the_detail() {
        let err = ApiError::Internal("the upstream said: secret".into());
        let b = body(&err);
        assert_eq!(b["code"], 500);
        assert_eq!(b["reason"], "InternalError");
        assert!(!b.to_string().contains("secret"));
        assert_eq!(b["details"]["causes"][0]["message"], INTERNAL_MESSAGE);
    }

    #[test]
    fn retry_after_header_and_details() {
        let err = ApiError::ServiceUnavailable { message: "not synced".into(), retry_after: Some(3) };
        assert_eq!(
            body(&err),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "not synced", "reason": "ServiceUnavailable",
                "details": {"retryAfterSeconds": 3}, "code": 503
            })
        );
        let resp = err.to_http_response();
        assert_eq!(resp.status(), StatusCode::SERVICE_UNAVAILABLE);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "3");
        assert_eq!(resp.headers()[header::CONTENT_TYPE], "application/json");

        let resp = ApiError::TooManyRequests { retry_after: 1 }.to_http_response();
        assert_eq!(resp.status(), StatusCode::TOO_MANY_REQUESTS);
        assert_eq!(resp.headers()[header::RETRY_AFTER], "1");

        let resp = ApiError::ServiceUnavailable { message: "x".into(), retry_after: None }.to_http_response();
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
    }

    #[test]
    fn timeout_and_uri_too_long() {
        let err = ApiError::Timeout {
            message: "request did not complete within requested timeout - context deadline exceeded".into(),
            retry_after: 0,
        };
        assert_eq!(
            body(&err),
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "Timeout: request did not complete within requested timeout - context deadline exceeded",
                "reason": "Timeout", "details": {}, "code": 504
            })
        );
        let resp = err.to_http_response();
        assert_eq!(resp.status(), StatusCode::GATEWAY_TIMEOUT);
        assert!(resp.headers().get(header::RETRY_AFTER).is_none());
        let b = body(&ApiError::UriTooLong("too long".into()));
        assert_eq!(b["code"], 414);
        assert!(b.get("reason").is_none(), "{b}");
        let err = ApiError::HeaderFieldsTooLarge("too large".into());
        assert_eq!(err.status_code(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let b = body(&err);
        assert_eq!((b["code"].as_u64(), b["message"].as_str()), (Some(431), Some("too large")));
        assert!(b.get("reason").is_none(), "{b}");
    }

    #[test]
    fn forbidden_forms() {
        let reason = "User \"alice\" cannot get resource \"podmetricssummaries\"";
        let with_name = ApiError::Forbidden { resource: pms(), name: "w1".into(), reason: reason.into() };
        assert_eq!(
            with_name.to_string(),
            format!("podmetricssummaries.stats.une-tasse-de.cafe \"w1\" is forbidden: {reason}")
        );
        let b = body(&with_name);
        assert_eq!(b["code"], 403);
        assert_eq!(b["details"]["name"], "w1");
        let no_name = ApiError::Forbidden { resource: pms(), name: String::new(), reason: "r".into() };
        assert_eq!(no_name.to_string(), "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: r");
        let path = ApiError::Forbidden {
            resource: GroupResource::default(),
            name: String::new(),
            reason: "User \"x\" cannot get path \"/foo\"".into(),
        };
        assert_eq!(path.to_string(), "forbidden: User \"x\" cannot get path \"/foo\"");
        assert_eq!(body(&path)["details"], json!({}));
    }

    #[test]
    fn unauthorized_gone_expired() {
        assert_eq!(body(&ApiError::Unauthorized)["message"], "Unauthorized");
        assert_eq!(body(&ApiError::Unauthorized)["code"], 401);
        assert_eq!(body(&ApiError::Gone("g".into()))["reason"], "Gone");
        assert_eq!(body(&ApiError::Expired("e".into()))["reason"], "Expired");
        assert_eq!(body(&ApiError::Expired("e".into()))["code"], 410);
    }

    #[test]
    fn go_quote_matches_strconv_quote() {
        assert_eq!(go_quote("x"), "\"x\"");
        assert_eq!(go_quote("a\"b\\c"), "\"a\\\"b\\\\c\"");
        assert_eq!(go_quote("a\nb\u{1}"), "\"a\\nb\\x01\"");
        assert_eq!(go_quote("café"), "\"café\"");
    }

    #[test]
    fn group_resource_display() {
        assert_eq!(GroupResource::new("", "pods").to_string(), "pods");
        assert_eq!(pms().to_string(), "podmetricssummaries.stats.une-tasse-de.cafe");
    }
}
