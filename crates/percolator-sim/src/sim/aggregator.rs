//! kube-aggregator's part of the simulated API: once an extension API server is registered
//! ([`Registry::register`], like an `APIService` per group/version it serves, read from its
//! `/apis` discovery), the simulated kube-apiserver
//!
//! - proxies everything under `/apis/<group>` and `/openapi/v3/apis/<group>/…` of those groups
//!   to it over TLS, presenting the front-proxy client certificate (`front-proxy-client.*` of
//!   the state directory, [`super::trust`]) with the caller's identity in `X-Remote-User` and
//!   `X-Remote-Group` (the caller is authenticated here, from the policy's token table or the
//!   service-account token, as TokenReview does; incoming `X-Remote-*` headers are dropped).
//!   Bodies stream both ways; status codes and headers (`Warning` included) pass through;
//! - merges discovery: `/apis` (an `APIGroupList`, or, when the client's `Accept` asks for it,
//!   the aggregated `APIGroupDiscoveryList` of `apidiscovery.k8s.io/v2`) lists the local
//!   groups and then the extension server's; `/openapi/v3` lists the extension server's
//!   group/versions (the simulated API publishes no OpenAPI of its own).
//!
//! An unreachable extension server gives 503 for its groups and drops out of the merged
//! discovery (logged), as an unavailable `APIService` does.

use std::collections::BTreeSet;
use std::sync::{Arc, RwLock};

use axum::Json;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use http::{HeaderMap, HeaderName, HeaderValue, Method, StatusCode, Uri, Version, header};
use http_body_util::BodyExt as _;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use super::api::{self, ApiState};
use super::objects::Status;
use super::policy::Identity;

/// The media type of aggregated discovery (kubectl ≥ 1.30 asks for it first).
const AGGREGATED_V2: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";

/// The user the aggregator itself reads the extension server's discovery as.
const AGGREGATOR_USER: &str = "system:kube-aggregator";

/// Largest discovery or OpenAPI index read from the extension server.
const MAX_DISCOVERY_BYTES: usize = 16 << 20;

/// Headers that belong to one hop and are never forwarded (RFC 9110 §7.6.1; h2 forbids them).
const HOP_BY_HOP: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade"];

/// An aggregation error.
#[derive(Debug, thiserror::Error)]
pub enum AggregationError {
    /// A certificate or key file is unreadable or invalid.
    #[error("{0}")]
    Tls(String),
    /// The extension server's discovery could not be read.
    #[error("reading {url}/apis: {message}")]
    Discovery {
        /// The extension server.
        url: String,
        /// What failed.
        message: String,
    },
}

type HttpsClient = Client<HttpsConnector<HttpConnector>, Body>;

/// A registered extension API server.
struct Upstream {
    /// `https://host:port`, no trailing slash.
    base: String,
    /// The API groups it serves.
    groups: BTreeSet<String>,
    client: HttpsClient,
}

/// The registered extension API server, if any (one is all the demo needs).
#[derive(Default)]
pub(crate) struct Registry {
    upstream: RwLock<Option<Arc<Upstream>>>,
}

impl Registry {
    fn get(&self) -> Option<Arc<Upstream>> {
        // A poisoned lock still holds a valid Option.
        self.upstream.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }

    /// Registers the extension API server at `url` (`https://host:port`), whose serving
    /// certificate `ca_pem` verifies, and which trusts the front-proxy client certificate
    /// `client_cert_pem`/`client_key_pem`: reads its `/apis` and aggregates the groups listed
    /// there. Returns them.
    pub(crate) async fn register(
        &self,
        url: &str,
        ca_pem: &[u8],
        client_cert_pem: &[u8],
        client_key_pem: &[u8],
    ) -> Result<Vec<String>, AggregationError> {
        let config = crate::pki::client_config(ca_pem, client_cert_pem, client_key_pem)
            .map_err(AggregationError::Tls)?;
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(config)
            .https_only()
            .enable_http1()
            .build();
        let mut upstream = Upstream {
            base: url.trim_end_matches('/').to_owned(),
            groups: BTreeSet::new(),
            client: Client::builder(TokioExecutor::new()).build(connector),
        };
        let aggregator = Identity {
            username: AGGREGATOR_USER.into(),
            uid: String::new(),
            groups: vec!["system:authenticated".into()],
            audiences: Vec::new(),
        };
        let discovery_error = |message: String| AggregationError::Discovery { url: url.to_owned(), message };
        let list =
            upstream.get_json("/apis", "application/json", &aggregator).await.map_err(discovery_error)?;
        upstream.groups = list["groups"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|g| g["name"].as_str().map(str::to_owned))
            .collect();
        if upstream.groups.is_empty() {
            return Err(discovery_error("it lists no API group".into()));
        }
        let groups = upstream.groups.iter().cloned().collect();
        *self.upstream.write().unwrap_or_else(std::sync::PoisonError::into_inner) = Some(Arc::new(upstream));
        Ok(groups)
    }
}

impl Upstream {
    /// Forwards `parts` and `body` as `identity`; the extension server's answer, or a 503.
    async fn forward(&self, parts: http::request::Parts, body: Body, identity: &Identity) -> Response {
        let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
        let Ok(uri) = format!("{}{path}", self.base).parse::<Uri>() else {
            return status(Status::failure(400, "BadRequest", "invalid request path"));
        };
        let mut request = http::Request::new(body);
        *request.method_mut() = parts.method;
        *request.uri_mut() = uri;
        *request.version_mut() = Version::HTTP_11;
        *request.headers_mut() = forwarded_headers(&parts.headers, identity);
        match self.client.request(request).await {
            Ok(response) => {
                let (mut parts, body) = response.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                parts.version = Version::default();
                Response::from_parts(parts, Body::new(body))
            }
            Err(e) => {
                tracing::warn!(upstream = %self.base, error = %e, "aggregated API server unreachable");
                status(Status::failure(
                    503,
                    "ServiceUnavailable",
                    "the server is currently unable to handle the request",
                ))
            }
        }
    }

    /// `GET path` as `identity`, with `accept`: the JSON body of a 200 answer.
    async fn get_json(
        &self,
        path: &str,
        accept: &str,
        identity: &Identity,
    ) -> Result<serde_json::Value, String> {
        let (mut parts, ()) = http::Request::new(()).into_parts();
        parts.uri = path.parse::<Uri>().map_err(|e| e.to_string())?;
        parts.headers.insert(header::ACCEPT, HeaderValue::from_str(accept).map_err(|e| e.to_string())?);
        let response = self.forward(parts, Body::empty(), identity).await;
        if response.status() != StatusCode::OK {
            return Err(format!("status {}", response.status()));
        }
        let content_type = response
            .headers()
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_owned();
        if accept == AGGREGATED_V2 && !content_type.contains("apidiscovery.k8s.io") {
            return Err(format!("not aggregated discovery: {content_type}"));
        }
        let body = http_body_util::Limited::new(response.into_body(), MAX_DISCOVERY_BYTES)
            .collect()
            .await
            .map_err(|e| e.to_string())?
            .to_bytes();
        serde_json::from_slice(&body).map_err(|e| e.to_string())
    }
}

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in HOP_BY_HOP {
        headers.remove(*name);
    }
}

/// The caller's headers minus its credentials, the hop-by-hop ones and any `X-Remote-*` it
/// sent, plus the identity this server vouches for.
fn forwarded_headers(incoming: &HeaderMap, identity: &Identity) -> HeaderMap {
    let mut headers = HeaderMap::with_capacity(incoming.len() + 1 + identity.groups.len());
    for (name, value) in incoming {
        let dropped = name == header::AUTHORIZATION
            || name == header::HOST
            || HOP_BY_HOP.contains(&name.as_str())
            || name.as_str().starts_with("x-remote-");
        if !dropped {
            headers.append(name.clone(), value.clone());
        }
    }
    let remote = |value: &str| HeaderValue::from_str(value).ok();
    if let Some(user) = remote(&identity.username) {
        headers.insert(HeaderName::from_static("x-remote-user"), user);
    }
    for group in identity.groups.iter().filter_map(|g| remote(g)) {
        headers.append(HeaderName::from_static("x-remote-group"), group);
    }
    headers
}

fn status(status: Status) -> Response {
    let code = StatusCode::from_u16(status.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    (code, Json(status)).into_response()
}

/// The caller, from its bearer token: a user of the policy or the service account.
fn caller(state: &ApiState, headers: &HeaderMap) -> Option<Identity> {
    let token = headers.get(header::AUTHORIZATION)?.to_str().ok()?.strip_prefix("Bearer ")?.trim();
    super::reviews::identify(state, token)
}

/// What the aggregation layer does with a request.
enum Route {
    /// `GET /apis`: merged discovery.
    Groups,
    /// `GET /openapi/v3`: the extension server's index.
    OpenApiIndex,
    /// A path of an aggregated group.
    Proxy,
    /// Anything else: the local API.
    Local,
}

fn route(upstream: &Upstream, method: &Method, path: &str) -> Route {
    let path = path.trim_end_matches('/');
    let group_of = |rest: &str| rest.split('/').next().is_some_and(|g| upstream.groups.contains(g));
    if path == "/apis" && method == Method::GET {
        Route::Groups
    } else if path == "/openapi/v3" && method == Method::GET {
        Route::OpenApiIndex
    } else if let Some(rest) = path.strip_prefix("/apis/")
        && group_of(rest)
    {
        Route::Proxy
    } else if let Some(rest) = path.strip_prefix("/openapi/v3/apis/")
        && group_of(rest)
    {
        Route::Proxy
    } else {
        Route::Local
    }
}

/// What the aggregation layer reads: the registered server, and the API it stands in front of
/// (its callers' identities, its counters).
#[derive(Clone)]
struct Aggregation {
    registry: Arc<Registry>,
    api: ApiState,
}

/// `api_router` (the API of `api`) behind the aggregation layer: outside its authentication,
/// the paths of `registry`'s groups go to the registered server.
pub(crate) fn layer(api_router: axum::Router, api: ApiState, registry: Arc<Registry>) -> axum::Router {
    api_router.layer(axum::middleware::from_fn_with_state(Aggregation { registry, api }, aggregate))
}

/// The aggregation middleware.
async fn aggregate(
    State(Aggregation { registry, api: state }): State<Aggregation>,
    request: Request,
    next: Next,
) -> Response {
    let Some(upstream) = registry.get() else {
        return next.run(request).await;
    };
    let route = route(&upstream, request.method(), request.uri().path());
    if matches!(route, Route::Local) {
        return next.run(request).await;
    }
    let Some(identity) = caller(&state, request.headers()) else {
        state.cluster.stats.api("unauthorized");
        return status(Status::failure(401, "Unauthorized", "Unauthorized"));
    };
    state.cluster.stats.api("aggregated");
    let (parts, body) = request.into_parts();
    match route {
        Route::Groups => groups(&upstream, &parts.headers, &identity).await,
        Route::OpenApiIndex => openapi_index(&upstream, &identity).await,
        Route::Proxy | Route::Local => upstream.forward(parts, body, &identity).await,
    }
}

/// Whether `accept` asks for aggregated discovery v2 (kubectl lists it first, then
/// `v2beta1`, then plain JSON).
fn wants_aggregated(headers: &HeaderMap) -> bool {
    headers.get_all(header::ACCEPT).iter().filter_map(|v| v.to_str().ok()).any(|accept| {
        accept.split(',').any(|media| {
            let params: Vec<&str> = media.split(';').map(str::trim).collect();
            params.contains(&"g=apidiscovery.k8s.io") && params.contains(&"v=v2")
        })
    })
}

async fn groups(upstream: &Upstream, headers: &HeaderMap, identity: &Identity) -> Response {
    if wants_aggregated(headers) {
        match upstream.get_json("/apis", AGGREGATED_V2, identity).await {
            Ok(theirs) => {
                let mut items = api::aggregated_groups();
                items.extend(theirs["items"].as_array().into_iter().flatten().cloned());
                let list = serde_json::json!({
                    "kind": "APIGroupDiscoveryList",
                    "apiVersion": "apidiscovery.k8s.io/v2",
                    "metadata": {},
                    "items": items,
                });
                return ([(header::CONTENT_TYPE, AGGREGATED_V2)], Json(list)).into_response();
            }
            Err(e) => {
                tracing::warn!(upstream = %upstream.base, error = %e, "aggregated discovery unavailable")
            }
        }
    }
    let mut groups = api::legacy_groups();
    match upstream.get_json("/apis", "application/json", identity).await {
        Ok(theirs) => groups.extend(theirs["groups"].as_array().into_iter().flatten().cloned()),
        Err(e) => tracing::warn!(upstream = %upstream.base, error = %e, "discovery unavailable"),
    }
    Json(serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})).into_response()
}

async fn openapi_index(upstream: &Upstream, identity: &Identity) -> Response {
    match upstream.get_json("/openapi/v3", "application/json", identity).await {
        Ok(theirs) => {
            let paths: serde_json::Map<String, serde_json::Value> = theirs["paths"]
                .as_object()
                .into_iter()
                .flatten()
                .filter(|(path, _)| {
                    path.strip_prefix("apis/")
                        .and_then(|rest| rest.split('/').next())
                        .is_some_and(|g| upstream.groups.contains(g))
                })
                .map(|(path, value)| (path.clone(), value.clone()))
                .collect();
            Json(serde_json::json!({"paths": paths})).into_response()
        }
        Err(e) => {
            tracing::warn!(upstream = %upstream.base, error = %e, "OpenAPI index unavailable");
            Json(serde_json::json!({"paths": {}})).into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kubectls_accept_header_asks_for_aggregated_discovery() {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::ACCEPT,
            HeaderValue::from_static(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json",
            ),
        );
        assert!(wants_aggregated(&headers));
        headers.insert(header::ACCEPT, HeaderValue::from_static("application/json, */*"));
        assert!(!wants_aggregated(&headers));
    }

    #[test]
    fn the_callers_credentials_and_remote_headers_are_not_forwarded() {
        let mut incoming = HeaderMap::new();
        incoming.insert(header::AUTHORIZATION, HeaderValue::from_static("Bearer alice-token"));
        incoming.insert("x-remote-user", HeaderValue::from_static("admin"));
        incoming.insert("x-remote-group", HeaderValue::from_static("system:masters"));
        incoming.insert(header::ACCEPT, HeaderValue::from_static("application/json"));
        incoming.insert(header::CONNECTION, HeaderValue::from_static("keep-alive"));
        let identity = Identity {
            username: "alice".into(),
            uid: String::new(),
            groups: vec!["devs".into(), "system:authenticated".into()],
            audiences: Vec::new(),
        };
        let headers = forwarded_headers(&incoming, &identity);
        assert_eq!(headers.get(header::AUTHORIZATION), None);
        assert_eq!(headers.get(header::CONNECTION), None);
        assert_eq!(headers.get(header::ACCEPT).unwrap(), "application/json");
        assert_eq!(headers.get_all("x-remote-user").iter().collect::<Vec<_>>(), ["alice"]);
        assert_eq!(
            headers.get_all("x-remote-group").iter().collect::<Vec<_>>(),
            ["devs", "system:authenticated"]
        );
    }
}
