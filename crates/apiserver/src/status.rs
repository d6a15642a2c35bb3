//! `metav1.Status` errors as HTTP responses of the serving layer: [`StatusResponse`] gives
//! [`ApiError`] (a wire type, which knows no web framework) the `into_response` every handler
//! calls, and logs the detail of an internal error, which the answer withholds.

use axum::body::Body;
use axum::response::Response;
use k8s_wire::ApiError;

/// A Kubernetes error answered as a `metav1.Status` response.
pub trait StatusResponse {
    /// The response: the Status' code, its JSON body, `Retry-After` when known.
    fn into_response(self) -> Response;
}

impl StatusResponse for ApiError {
    fn into_response(self) -> Response {
        status_response(&self)
    }
}

/// The response of `error` ([`ApiError::to_http_response`]); an internal error's detail is
/// logged here, as the body withholds it.
pub fn status_response(error: &ApiError) -> Response {
    if let ApiError::Internal(detail) = error {
        tracing::error!(error = %detail, "internal error answered with a 500");
    }
    error.to_http_response().map(Body::from)
}
