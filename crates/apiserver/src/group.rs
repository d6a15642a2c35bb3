//! Steps the handlers of a [`crate::GroupService`] share: the checks of a read request (verb,
//! names), the answer or its error as a `metav1.Status`, a JSON body, and the get-only entries
//! of its discovery.

use std::future::Future;

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::future::BoxFuture;
use http::{HeaderValue, Method, StatusCode, header};
use k8s_wire::{ApiError, DiscoveryResource, GroupResource, RequestInfo, go_quote, lower_case_method};

/// 405 for anything but a `get` (`GET` or `HEAD`, not `watch`) of `resource`.
pub fn check_read(info: &RequestInfo, method: &Method, resource: GroupResource) -> Result<(), ApiError> {
    if (method != Method::GET && method != Method::HEAD) || info.verb == "watch" {
        let verb =
            if info.verb.is_empty() { lower_case_method(method) } else { info.verb.clone() }.into_owned();
        return Err(ApiError::MethodNotAllowed { verb, resource });
    }
    Ok(())
}

/// 400 for a namespace or name that is not a valid Kubernetes name.
pub fn check_name(what: &str, value: &str, valid: fn(&str) -> Vec<String>) -> Result<(), ApiError> {
    let errors = valid(value);
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("invalid {what} {}: {}", go_quote(value), errors.join("; "))))
    }
}

/// The response of a group's handler: its answer, or its error as a `metav1.Status`.
pub fn answer<'a, E: IntoResponse>(
    handled: impl Future<Output = Result<Response, E>> + Send + 'a,
) -> BoxFuture<'a, Response> {
    Box::pin(async move { handled.await.unwrap_or_else(IntoResponse::into_response) })
}

/// A 200 with a JSON body.
pub fn json_response(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

/// A resource of a group's discovery: get only, of `kind`, as the Kubernetes adapter libraries
/// list theirs.
pub fn discovery_resource(name: String, namespaced: bool, kind: &str) -> DiscoveryResource {
    DiscoveryResource {
        name,
        singular_name: String::new(),
        namespaced,
        kind: kind.to_owned(),
        verbs: vec!["get".to_owned()],
        short_names: Vec::new(),
        categories: Vec::new(),
    }
}

/// A 404 `metav1.Status` saying `message`, without details (as the Kubernetes adapter
/// libraries word a metric that is not found).
pub fn not_found(message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": "NotFound",
        "code": 404,
    });
    (
        StatusCode::NOT_FOUND,
        [(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))],
        body.to_string(),
    )
        .into_response()
}
