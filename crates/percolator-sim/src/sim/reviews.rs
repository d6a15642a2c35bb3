//! kube-apiserver's side of delegated authentication and authorization (docs/wire.md, "Delegated authentication and authorization"):
//! `POST /apis/authentication.k8s.io/v1/tokenreviews` and
//! `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`, answered from the
//! [`Policy`](super::policy::Policy) with `201 Created` and the posted object echoed plus
//! `status`, as kube-apiserver does. Both sit behind the API's service-account token (a
//! caller without it gets 401 before reaching them).
//!
//! The `spec` of each SubjectAccessReview is kept as posted (the last ones, in `/sim/stats`
//! under `subjectAccessReviews`), so tests see exactly what a client sent, selector
//! attributes included.
//!
//! A fault (`{"reviews": "too-many-requests"}`, [`super::faults`]) makes both answer `429
//! TooManyRequests` with `Retry-After: 1`, as kube-apiserver's priority and fairness does when
//! it pushes back; a user whose grants are revoked (`/sim/grants`) is denied everything.
//!
//! Field presence follows kube-apiserver's Go types: `status.authenticated` and
//! `status.error` are `omitempty` (an unknown token gives `"status":{"user":{},"error":…}`),
//! `status.allowed` is always present, `status.denied` is never set (RBAC has no deny) and
//! `status.reason` only accompanies an allow.

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, StatusCode, header};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewStatus, UserInfo};
use k8s_openapi::api::authorization::v1::{SubjectAccessReview, SubjectAccessReviewStatus};
use serde::Serialize;
use serde::de::DeserializeOwned;

use super::api::ApiState;
use super::faults::ReviewFault;
use super::objects::Status;
use super::policy::{self, Decision, Identity, Request};
use super::rng::SplitMix64;

const DOMAIN_SA_UID: u64 = 13;

fn respond(status: &Status) -> Response {
    (StatusCode::from_u16(status.code()).unwrap_or(StatusCode::BAD_REQUEST), Json(status)).into_response()
}

fn failure(code: u16, reason: &'static str, message: impl Into<String>) -> Response {
    respond(&Status::failure(code, reason, message))
}

/// kube-apiserver's 429 when its priority and fairness rejects a request
/// (`apierrors.NewTooManyRequests`): `Retry-After: 1` and `details.retryAfterSeconds: 1`.
fn too_many_requests() -> Response {
    let body = serde_json::json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
        "details": {"retryAfterSeconds": 1}, "code": 429
    });
    (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, "1")], Json(body)).into_response()
}

fn rejected(code: u16, reason: &'static str, message: impl Into<String>) -> Box<Status> {
    Box::new(Status::failure(code, reason, message))
}

/// Decodes a posted `kind` object of `api_version`, as kube-apiserver's JSON decoder
/// would: missing `apiVersion`/`kind` default to the endpoint's, others are a 400.
fn decode<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
    api_version: &str,
    kind: &str,
) -> Result<T, Box<Status>> {
    let content_type = headers.get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if !content_type.is_empty()
        && !content_type.starts_with("application/json")
        && !content_type.starts_with("*/*")
    {
        return Err(rejected(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: \
                 application/json (got {content_type:?})"
            ),
        ));
    }
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| rejected(400, "BadRequest", format!("the object provided is unrecognized: {e}")))?;
    let Some(object) = value.as_object() else {
        return Err(rejected(400, "BadRequest", "the object provided is unrecognized (not a JSON object)"));
    };
    if let Some(v) = object.get("apiVersion").and_then(|v| v.as_str())
        && v != api_version
    {
        return Err(rejected(
            400,
            "BadRequest",
            format!(
                "the API version in the data ({v}) does not match the expected API version ({api_version})"
            ),
        ));
    }
    if let Some(k) = object.get("kind").and_then(|v| v.as_str())
        && k != kind
    {
        return Err(rejected(400, "BadRequest", format!("the kind in the data ({k}) does not match {kind}")));
    }
    serde_json::from_value(value)
        .map_err(|e| rejected(400, "BadRequest", format!("unable to decode {kind}: {e}")))
}

/// A `201 Created` echo of `object`, with `metadata.creationTimestamp: null` as the Go
/// structs serialise it.
fn created(object: &impl Serialize) -> Response {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.entry("creationTimestamp").or_insert(serde_json::Value::Null);
    }
    (StatusCode::CREATED, Json(value)).into_response()
}

/// The uid of the simulator's service account (stable per seed).
pub(crate) fn service_account_uid(seed: u64) -> String {
    super::workload::uuid(&mut SplitMix64::stream(seed, DOMAIN_SA_UID, 0))
}

/// Who `token` is: the service account, a policy user, or nobody.
pub(crate) fn identify(state: &ApiState, token: &str) -> Option<Identity> {
    if token == state.cluster.token {
        return Some(policy::service_account(service_account_uid(state.cluster.seed)));
    }
    state.policy.authenticate(token)
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`.
pub(crate) async fn token_review(State(state): State<ApiState>, headers: HeaderMap, body: Bytes) -> Response {
    state.cluster.stats.api("create tokenreviews");
    if state.cluster.faults.reviews() == ReviewFault::TooManyRequests {
        return too_many_requests();
    }
    let mut review: TokenReview = match decode(&headers, &body, "authentication.k8s.io/v1", "TokenReview") {
        Ok(r) => r,
        Err(status) => return respond(&status),
    };
    let token = review.spec.token.clone().unwrap_or_default();
    if token.is_empty() {
        return failure(400, "BadRequest", "token is required for TokenReview in authentication");
    }
    let requested = review.spec.audiences.clone().unwrap_or_default();
    let identity = identify(&state, &token);
    // Static tokens are audience-agnostic in kube-apiserver: valid for the API audiences;
    // a review asking for other audiences gets none (and no authentication).
    let outcome = identity.and_then(|who| {
        let audiences: Vec<String> = if requested.is_empty() {
            who.audiences.clone()
        } else {
            requested.iter().filter(|a| who.audiences.contains(a)).cloned().collect()
        };
        (!audiences.is_empty()).then_some((who, audiences))
    });
    review.status = Some(match outcome {
        Some((who, audiences)) => TokenReviewStatus {
            authenticated: Some(true),
            user: Some(UserInfo {
                username: Some(who.username),
                uid: Some(who.uid),
                groups: Some(who.groups),
                extra: None,
            }),
            audiences: Some(audiences),
            error: None,
        },
        None => TokenReviewStatus {
            authenticated: None,
            user: Some(UserInfo::default()),
            audiences: None,
            error: Some("invalid bearer token".to_owned()),
        },
    });
    created(&review)
}

fn invalid(errors: &[String]) -> Response {
    let joined = match errors {
        [one] => one.clone(),
        many => format!("[{}]", many.join(", ")),
    };
    failure(422, "Invalid", format!("SubjectAccessReview.authorization.k8s.io \"\" is invalid: {joined}"))
}

/// `POST /apis/authorization.k8s.io/v1/subjectaccessreviews`.
pub(crate) async fn subject_access_review(
    State(state): State<ApiState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    state.cluster.stats.api("create subjectaccessreviews");
    if state.cluster.faults.reviews() == ReviewFault::TooManyRequests {
        return too_many_requests();
    }
    let mut review: SubjectAccessReview =
        match decode(&headers, &body, "authorization.k8s.io/v1", "SubjectAccessReview") {
            Ok(r) => r,
            Err(status) => return respond(&status),
        };
    // As posted: the decode above accepted the body as a JSON object.
    let posted = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|mut v| v.get_mut("spec").map(serde_json::Value::take));
    state.cluster.stats.access_review(posted.unwrap_or(serde_json::Value::Null));
    let spec = &review.spec;
    let user = spec.user.clone().unwrap_or_default();
    let groups = spec.groups.clone().unwrap_or_default();
    let mut errors = Vec::new();
    match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(_), Some(_)) => errors.push(
            "spec.nonResourceAttributes: Invalid value: \"null\": cannot be specified in combination \
             with resourceAttributes"
                .to_owned(),
        ),
        (None, None) => errors.push(
            "spec.resourceAttributes: Invalid value: \"null\": exactly one of nonResourceAttributes or \
             resourceAttributes must be specified"
                .to_owned(),
        ),
        _ => {}
    }
    if user.is_empty() && groups.is_empty() {
        errors.push(
            "spec.user: Invalid value: \"\": at least one of user or group must be specified".to_owned(),
        );
    }
    if !errors.is_empty() {
        return invalid(&errors);
    }
    let request = match (&spec.resource_attributes, &spec.non_resource_attributes) {
        (Some(r), _) => Request::Resource {
            namespace: r.namespace.clone().unwrap_or_default(),
            verb: r.verb.clone().unwrap_or_default(),
            group: r.group.clone().unwrap_or_default(),
            resource: r.resource.clone().unwrap_or_default(),
            subresource: r.subresource.clone().unwrap_or_default(),
            name: r.name.clone().unwrap_or_default(),
        },
        (None, Some(n)) => Request::NonResource {
            path: n.path.clone().unwrap_or_default(),
            verb: n.verb.clone().unwrap_or_default(),
        },
        (None, None) => Request::Nothing,
    };
    let Decision { allowed, reason } = if state.cluster.faults.is_revoked(&user) {
        Decision { allowed: false, reason: String::new() }
    } else {
        state.policy.authorize(&user, &groups, &request)
    };
    tracing::debug!(user, ?groups, ?request, allowed, reason, "subject access review");
    review.status = Some(SubjectAccessReviewStatus {
        allowed,
        denied: None,
        evaluation_error: None,
        reason: (!reason.is_empty()).then_some(reason),
    });
    created(&review)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::api::router;
    use crate::sim::testutil::api_state;
    use axum::body::{Body, to_bytes};
    use tower::ServiceExt as _;

    async fn post(
        state: &ApiState,
        uri: &str,
        token: &str,
        body: serde_json::Value,
    ) -> (StatusCode, serde_json::Value) {
        let request = http::Request::post(uri)
            .header("authorization", format!("Bearer {token}"))
            .header("content-type", "application/json")
            .body(Body::from(body.to_string()))
            .unwrap();
        let response = router(state.clone()).oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null))
    }

    const TR: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
    const SAR: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

    fn tr(token: &str) -> serde_json::Value {
        serde_json::json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "spec": {"token": token}})
    }

    #[tokio::test]
    async fn token_reviews() {
        let state = api_state();
        let sa = state.cluster.token.clone();
        let (code, body) = post(&state, TR, &sa, tr("alice-token")).await;
        assert_eq!(code, StatusCode::CREATED, "{body}");
        assert_eq!(body["kind"], "TokenReview");
        assert_eq!(body["apiVersion"], "authentication.k8s.io/v1");
        assert_eq!(body["metadata"]["creationTimestamp"], serde_json::Value::Null);
        assert_eq!(body["spec"]["token"], "alice-token");
        let status = &body["status"];
        assert_eq!(status["authenticated"], true);
        assert_eq!(status["user"]["username"], "alice");
        assert_eq!(status["user"]["uid"], policy::derived_uid("alice"));
        assert_eq!(status["user"]["groups"], serde_json::json!(["devs", "system:authenticated"]));
        assert_eq!(status["audiences"], serde_json::json!(policy::API_AUDIENCES));
        assert!(status.get("error").is_none());

        let (_, body) = post(&state, TR, &sa, tr("bob-token")).await;
        assert_eq!(body["status"]["user"]["groups"], serde_json::json!(["system:authenticated"]));

        // The service-account token is a user too.
        let (_, body) = post(&state, TR, &sa, tr(&sa)).await;
        assert_eq!(body["status"]["user"]["username"], "system:serviceaccount:kube-system:percolator");
        assert_eq!(
            body["status"]["user"]["groups"],
            serde_json::json!([
                "system:serviceaccounts",
                "system:serviceaccounts:kube-system",
                "system:authenticated"
            ])
        );

        // Unknown token: not authenticated (field omitted, as Go's omitempty), an error, user {}.
        let (code, body) = post(&state, TR, &sa, tr("nope")).await;
        assert_eq!(code, StatusCode::CREATED);
        assert!(body["status"].get("authenticated").is_none(), "{body}");
        assert_eq!(body["status"]["user"], serde_json::json!({}));
        assert!(body["status"]["error"].as_str().unwrap().contains("invalid"));
        let back: TokenReview = serde_json::from_value(body).unwrap();
        assert_ne!(back.status.unwrap().authenticated, Some(true));

        // Audiences: the API audience is fine, others are not.
        let mut with_aud = tr("carol-token");
        with_aud["spec"]["audiences"] =
            serde_json::json!(["https://kubernetes.default.svc.cluster.local", "x"]);
        let (_, body) = post(&state, TR, &sa, with_aud.clone()).await;
        assert_eq!(body["status"]["authenticated"], true);
        assert_eq!(
            body["status"]["audiences"],
            serde_json::json!(["https://kubernetes.default.svc.cluster.local"])
        );
        with_aud["spec"]["audiences"] = serde_json::json!(["x"]);
        let (_, body) = post(&state, TR, &sa, with_aud).await;
        assert!(body["status"].get("authenticated").is_none());

        // Errors: no token, wrong kind, no SA token (401), a user token is not the SA token.
        let (code, body) = post(&state, TR, &sa, tr("")).await;
        assert_eq!((code, body["reason"].as_str()), (StatusCode::BAD_REQUEST, Some("BadRequest")));
        let (code, _) =
            post(&state, TR, &sa, serde_json::json!({"kind": "Pod", "spec": {"token": "x"}})).await;
        assert_eq!(code, StatusCode::BAD_REQUEST);
        let (code, body) = post(&state, TR, "alice-token", tr("alice-token")).await;
        assert_eq!((code, body["reason"].as_str()), (StatusCode::UNAUTHORIZED, Some("Unauthorized")));
        // Without apiVersion/kind the endpoint's are assumed.
        let (code, body) = post(&state, TR, &sa, serde_json::json!({"spec": {"token": "admin-token"}})).await;
        assert_eq!(code, StatusCode::CREATED);
        assert_eq!(body["status"]["user"]["username"], "admin");

        let counts = state.cluster.stats.api_requests.lock().unwrap().clone();
        assert_eq!(counts["create tokenreviews"], 9);
    }

    #[tokio::test]
    async fn subject_access_reviews() {
        let state = api_state();
        let sa = state.cluster.token.clone();
        let body = serde_json::json!({
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {
                "resourceAttributes": {
                    "namespace": "shop", "verb": "list", "group": "stats.une-tasse-de.cafe",
                    "version": "v1alpha1", "resource": "podmetricssummaries",
                    "labelSelector": {"requirements": [{"key": "app", "operator": "In", "values": ["x"]}]}
                },
                "user": "alice", "uid": "u-1", "groups": ["devs", "system:authenticated"],
                "extra": {"scopes": ["a"]}
            }
        });
        let (code, out) = post(&state, SAR, &sa, body.clone()).await;
        assert_eq!(code, StatusCode::CREATED, "{out}");
        assert_eq!(out["kind"], "SubjectAccessReview");
        assert_eq!(
            out["spec"]["resourceAttributes"]["labelSelector"],
            body["spec"]["resourceAttributes"]["labelSelector"]
        );
        assert_eq!(out["spec"]["extra"], body["spec"]["extra"]);
        assert_eq!(
            out["status"],
            serde_json::json!({"allowed": true, "reason": "RBAC: allowed by RoleBinding \"alice-stats-reader/shop\" of ClusterRole \"alice-stats-reader\" to User \"alice\""})
        );

        let mut denied = body.clone();
        denied["spec"]["resourceAttributes"]["namespace"] = "api".into();
        let (_, out) = post(&state, SAR, &sa, denied).await;
        assert_eq!(out["status"], serde_json::json!({"allowed": false}));

        let non_resource = serde_json::json!({"spec": {
            "nonResourceAttributes": {"path": "/metrics", "verb": "get"},
            "user": "carol", "groups": ["viewers", "system:authenticated"]}});
        let (_, out) = post(&state, SAR, &sa, non_resource).await;
        assert_eq!(out["status"]["allowed"], true);

        let (code, out) = post(&state, SAR, &sa, serde_json::json!({"spec": {"user": "x"}})).await;
        assert_eq!((code, out["reason"].as_str()), (StatusCode::UNPROCESSABLE_ENTITY, Some("Invalid")));
        let (code, out) = post(
            &state,
            SAR,
            &sa,
            serde_json::json!({"spec": {"nonResourceAttributes": {"path": "/", "verb": "get"}}}),
        )
        .await;
        assert_eq!(code, StatusCode::UNPROCESSABLE_ENTITY);
        assert!(out["message"].as_str().unwrap().contains("at least one of user or group"));
        let (code, _) = post(&state, SAR, "carol-token", body.clone()).await;
        assert_eq!(code, StatusCode::UNAUTHORIZED);

        let counts = state.cluster.stats.api_requests.lock().unwrap().clone();
        assert_eq!(counts["create subjectaccessreviews"], 5);
        // The specs of the decoded reviews are kept as posted, oldest first; the one posted
        // without the service account's token never got there.
        let kept: Vec<serde_json::Value> =
            state.cluster.stats.access_reviews.lock().unwrap().iter().cloned().collect();
        assert_eq!(kept.len(), 5);
        assert_eq!(kept[0], body["spec"]);
        assert_eq!(kept[3], serde_json::json!({"user": "x"}));
        for i in 0..crate::sim::cluster::KEPT_ACCESS_REVIEWS {
            state.cluster.stats.access_review(serde_json::json!(i));
        }
        let kept = state.cluster.stats.access_reviews.lock().unwrap().clone();
        assert_eq!(kept.len(), crate::sim::cluster::KEPT_ACCESS_REVIEWS);
        assert_eq!(kept.front(), Some(&serde_json::json!(0)));
    }

    #[tokio::test]
    async fn a_fault_answers_429_and_revoked_users_are_denied_everything() {
        let state = api_state();
        let sa = state.cluster.token.clone();
        let sar = |user: &str, groups: &[&str]| {
            serde_json::json!({"spec": {
                "resourceAttributes": {"namespace": "shop", "verb": "list", "group": "stats.une-tasse-de.cafe",
                    "version": "v1alpha1", "resource": "podmetricssummaries"},
                "user": user, "groups": groups}})
        };
        // Revoked: denied whatever the groups would allow; restored: allowed again.
        state.cluster.faults.set_reviews_for_tests(ReviewFault::Ok, &["carol"]);
        let (code, out) = post(&state, SAR, &sa, sar("carol", &["viewers", "system:authenticated"])).await;
        assert_eq!((code, &out["status"]), (StatusCode::CREATED, &serde_json::json!({"allowed": false})));
        let (_, out) = post(&state, SAR, &sa, sar("tester", &["viewers", "system:authenticated"])).await;
        assert_eq!(out["status"]["allowed"], true);

        // Pushing back: 429 with Retry-After, as kube-apiserver's priority and fairness does; still counted.
        state.cluster.faults.set_reviews_for_tests(ReviewFault::TooManyRequests, &[]);
        for (uri, body) in [(SAR, sar("tester", &["viewers"])), (TR, tr("alice-token"))] {
            let request = http::Request::post(uri)
                .header("authorization", format!("Bearer {sa}"))
                .header("content-type", "application/json")
                .body(Body::from(body.to_string()))
                .unwrap();
            let response = router(state.clone()).oneshot(request).await.unwrap();
            assert_eq!(response.status(), StatusCode::TOO_MANY_REQUESTS, "{uri}");
            assert_eq!(response.headers()["retry-after"], "1");
            let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
            let status: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
            assert_eq!(
                (status["reason"].as_str(), status["details"]["retryAfterSeconds"].as_u64()),
                (Some("TooManyRequests"), Some(1))
            );
        }
        let counts = state.cluster.stats.api_requests.lock().unwrap().clone();
        assert_eq!((counts["create subjectaccessreviews"], counts["create tokenreviews"]), (3, 1));
    }
}
