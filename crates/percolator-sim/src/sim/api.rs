//! The simulated Kubernetes API (HTTPS): discovery (`/version`, `/api`, `/api/v1`, `/apis`,
//! `/apis/apps/v1`, `/apis/authentication.k8s.io/v1`, `/apis/authorization.k8s.io/v1`), nodes,
//! pods, config maps, services (`/api/v1/…/services`) and the `apps/v1` deployments,
//! replicasets, statefulsets and daemonsets (`/apis/apps/v1/[namespaces/{ns}/]{resource}`,
//! [`super::controllers`]) with get, list (`limit`/`continue`, label and field selectors) and watch
//! (resourceVersion replay from a bounded history, 410 Expired past it, bookmarks, and the
//! injected faults of [`super::faults`]: watches aborted, or expired once), and the
//! TokenReview and SubjectAccessReview endpoints ([`super::reviews`]), all behind the
//! service-account bearer token. Errors are `metav1.Status` objects.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{FromRequestParts, Path, RawQuery, Request, State};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use bytes::Bytes;
use futures::StreamExt as _;
use http::request::Parts;
use http::{StatusCode, header};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, WatchEvent};
use serde::{Deserialize, Serialize};
use tokio::sync::{broadcast, mpsc};

use super::cluster::{Cluster, Event, EventType, Expired, Object, WatchStart, Watched};
use super::controllers::{Controller, Resource};
use super::kubelet::has_token;
use super::objects::{self, Status, bookmark_line, error_line, event_line};
use super::policy::Policy;
use super::reviews;
use super::selector::{FieldSelector, LabelSelector};
use super::text::{base64_url, base64_url_decode};
use super::workload::{SimNode, SimPod};

/// How often a watch that allows bookmarks gets one.
pub(crate) const BOOKMARK_INTERVAL: Duration = Duration::from_secs(5);

/// Watch duration when the client sends no `timeoutSeconds` (kube-apiserver picks 30–60 min).
const DEFAULT_WATCH_TIMEOUT: Duration = Duration::from_secs(1800);

/// Items serialised per body chunk of a list.
const ITEMS_PER_CHUNK: usize = 256;

/// State of the API router.
#[derive(Clone)]
pub(crate) struct ApiState {
    pub(crate) cluster: Arc<Cluster>,
    /// `host:port` the API listens on (for `/api`).
    pub(crate) address: String,
    /// Tokens and rules for TokenReview and SubjectAccessReview.
    pub(crate) policy: Arc<Policy>,
}

/// An API error: always rendered as a `metav1.Status`.
struct ApiError(Box<Status>);

fn err(status: Status) -> ApiError {
    ApiError(Box::new(status))
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let code = StatusCode::from_u16(self.0.code()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
        (code, Json(*self.0)).into_response()
    }
}

fn bad_request(message: impl Into<String>) -> ApiError {
    err(Status::failure(400, "BadRequest", message))
}

/// The router of the API listener.
pub(crate) fn router(state: ApiState) -> axum::Router {
    axum::Router::new()
        .route("/version", get(version).fallback(method_not_allowed))
        .route("/api", get(api_versions).fallback(method_not_allowed))
        .route("/api/v1", get(api_resources).fallback(method_not_allowed))
        .route("/apis", get(api_groups).fallback(method_not_allowed))
        .route("/api/v1/nodes", get(list_nodes).fallback(method_not_allowed))
        .route("/api/v1/nodes/{name}", get(get_node).fallback(method_not_allowed))
        .route("/api/v1/pods", get(pods).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/pods", get(pods).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/pods/{name}", get(get_pod).fallback(method_not_allowed))
        .route("/api/v1/configmaps", get(config_maps).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/configmaps", get(config_maps).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/configmaps/{name}", get(get_config_map).fallback(method_not_allowed))
        .route("/api/v1/services", get(services).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/services", get(services).fallback(method_not_allowed))
        .route("/api/v1/namespaces/{ns}/services/{name}", get(get_service).fallback(method_not_allowed))
        .route("/apis/apps/v1", get(apps_resources).fallback(method_not_allowed))
        .route("/apis/apps/v1/{resource}", get(apps_list).fallback(method_not_allowed))
        .route(
            "/apis/apps/v1/namespaces/{ns}/{resource}",
            get(apps_list_namespaced).fallback(method_not_allowed),
        )
        .route("/apis/apps/v1/namespaces/{ns}/{resource}/{name}", get(apps_get).fallback(method_not_allowed))
        .route("/apis/{group}", get(api_group).fallback(method_not_allowed))
        .route("/apis/{group}/{version}", get(api_group_resources).fallback(method_not_allowed))
        .route(
            "/apis/authentication.k8s.io/v1/tokenreviews",
            post(reviews::token_review).fallback(method_not_allowed),
        )
        .route(
            "/apis/authorization.k8s.io/v1/subjectaccessreviews",
            post(reviews::subject_access_review).fallback(method_not_allowed),
        )
        .fallback(not_found)
        .layer(axum::middleware::from_fn_with_state(state.clone(), authenticate))
        .with_state(state)
}

/// The service-account token may do everything served here; a user of the policy (kubectl in
/// the demo) may read (`GET`) everything, without RBAC: only the aggregated groups, whose
/// server asks SubjectAccessReviews, apply the policy's rules.
async fn authenticate(State(state): State<ApiState>, request: Request, next: Next) -> Response {
    let policy_user = request.method() == http::Method::GET
        && request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .is_some_and(|t| state.policy.authenticate(t.trim()).is_some());
    if policy_user || has_token(&request, &state.cluster.token) {
        next.run(request).await
    } else {
        state.cluster.stats.api("unauthorized");
        err(Status::failure(401, "Unauthorized", "Unauthorized")).into_response()
    }
}

fn not_found_status() -> Status {
    Status::failure(404, "NotFound", "the server could not find the requested resource")
}

async fn not_found() -> ApiError {
    err(not_found_status())
}

async fn method_not_allowed(request: Request) -> ApiError {
    err(Status::failure(
        405,
        "MethodNotAllowed",
        format!("the server does not allow this method on the requested resource ({})", request.method()),
    ))
}

async fn version(State(state): State<ApiState>) -> Response {
    state.cluster.stats.api("get version");
    Json(serde_json::json!({
        "major": "1",
        "minor": "33",
        "emulationMajor": "1",
        "emulationMinor": "33",
        "minCompatibilityMajor": "1",
        "minCompatibilityMinor": "32",
        "gitVersion": "v1.33.0",
        "gitCommit": "60a317eadfcb839692a5551a7ed5a8ef1e8c8f52",
        "gitTreeState": "clean",
        "buildDate": "2025-04-23T13:07:17Z",
        "goVersion": "go1.24.2",
        "compiler": "gc",
        "platform": "linux/amd64"
    }))
    .into_response()
}

async fn api_versions(State(state): State<ApiState>) -> Response {
    state.cluster.stats.api("get discovery");
    Json(serde_json::json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": state.address}]
    }))
    .into_response()
}

async fn api_resources(State(state): State<ApiState>) -> Response {
    state.cluster.stats.api("get discovery");
    Json(serde_json::json!({
        "kind": "APIResourceList",
        "groupVersion": "v1",
        "resources": [
            {"name": "nodes", "singularName": "node", "namespaced": false, "kind": "Node",
             "verbs": ["get", "list", "watch"], "shortNames": ["no"]},
            {"name": "pods", "singularName": "pod", "namespaced": true, "kind": "Pod",
             "verbs": ["get", "list", "watch"], "shortNames": ["po"], "categories": ["all"]},
            {"name": "configmaps", "singularName": "configmap", "namespaced": true, "kind": "ConfigMap",
             "verbs": ["get", "list", "watch"], "shortNames": ["cm"]},
            Resource::Services.discovery()
        ]
    }))
    .into_response()
}

/// The API groups besides core, in kube-apiserver's order: `(group, version)`.
const GROUPS: &[(&str, &str)] =
    &[("apps", "v1"), ("authentication.k8s.io", "v1"), ("authorization.k8s.io", "v1")];

/// The `APIResourceList` entries of `group`: the workload resources of `apps`, one
/// create-only review resource for the others.
fn group_resources(group: &str) -> Vec<serde_json::Value> {
    let review = |name: &str, kind: &str| {
        serde_json::json!({"name": name, "singularName": kind.to_lowercase(), "namespaced": false,
                           "kind": kind, "verbs": ["create"]})
    };
    match group {
        "authentication.k8s.io" => vec![review("tokenreviews", "TokenReview")],
        "authorization.k8s.io" => vec![review("subjectaccessreviews", "SubjectAccessReview")],
        _ => Resource::of_group(group).map(Resource::discovery).collect(),
    }
}

fn group_json(group: &str, version: &str) -> serde_json::Value {
    let gv = serde_json::json!({"groupVersion": format!("{group}/{version}"), "version": version});
    serde_json::json!({"name": group, "versions": [gv.clone()], "preferredVersion": gv})
}

/// The `APIGroup` entries of `/apis`.
pub(crate) fn legacy_groups() -> Vec<serde_json::Value> {
    GROUPS.iter().map(|(g, v)| group_json(g, v)).collect()
}

/// The `APIGroupDiscovery` entries (`apidiscovery.k8s.io/v2`) of the same groups.
pub(crate) fn aggregated_groups() -> Vec<serde_json::Value> {
    GROUPS
        .iter()
        .map(|(group, version)| {
            let resources: Vec<serde_json::Value> = group_resources(group)
                .iter()
                .map(|r| {
                    let mut resource = serde_json::json!({
                        "resource": r["name"],
                        "responseKind": {"group": group, "version": version, "kind": r["kind"]},
                        "scope": if r["namespaced"] == true { "Namespaced" } else { "Cluster" },
                        "singularResource": r["singularName"],
                        "verbs": r["verbs"],
                    });
                    for key in ["shortNames", "categories"] {
                        if let (Some(value), Some(object)) = (r.get(key), resource.as_object_mut()) {
                            object.insert(key.into(), value.clone());
                        }
                    }
                    resource
                })
                .collect();
            serde_json::json!({
                "metadata": {"name": group, "creationTimestamp": null},
                "versions": [{"version": version, "resources": resources, "freshness": "Current"}],
            })
        })
        .collect()
}

async fn api_groups(State(state): State<ApiState>) -> Response {
    state.cluster.stats.api("get discovery");
    Json(serde_json::json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": legacy_groups()}))
        .into_response()
}

async fn api_group(State(state): State<ApiState>, Path(group): Path<String>) -> Result<Response, ApiError> {
    let (g, v) = GROUPS.iter().find(|(g, _)| *g == group).ok_or_else(|| err(not_found_status()))?;
    state.cluster.stats.api("get discovery");
    let mut body = group_json(g, v);
    if let Some(object) = body.as_object_mut() {
        object.insert("kind".into(), "APIGroup".into());
        object.insert("apiVersion".into(), "v1".into());
    }
    Ok(Json(body).into_response())
}

async fn api_group_resources(
    State(state): State<ApiState>,
    Path((group, version)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let (g, v) =
        GROUPS.iter().find(|(g, v)| *g == group && *v == version).ok_or_else(|| err(not_found_status()))?;
    state.cluster.stats.api("get discovery");
    Ok(Json(serde_json::json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": format!("{g}/{v}"),
        "resources": group_resources(g)
    }))
    .into_response())
}

/// `/apis/apps/v1` (a route of its own: the `apps/v1` resource routes share its prefix).
async fn apps_resources(state: State<ApiState>) -> Result<Response, ApiError> {
    api_group_resources(state, Path(("apps".to_owned(), "v1".to_owned()))).await
}

/// The list/watch query parameters we honour.
#[derive(Default)]
struct ListQuery {
    watch: bool,
    resource_version: Option<String>,
    timeout: Option<Duration>,
    bookmarks: bool,
    send_initial_events: bool,
    limit: Option<usize>,
    continue_token: Option<String>,
    labels: LabelSelector,
    field_text: String,
}

fn parse_query(raw: Option<&str>) -> Result<ListQuery, ApiError> {
    let mut q = ListQuery::default();
    let raw = raw.unwrap_or_default();
    for (key, value) in url::form_urlencoded::parse(raw.as_bytes()) {
        let truthy = matches!(value.as_ref(), "true" | "1" | "True" | "TRUE");
        match key.as_ref() {
            "watch" => q.watch = truthy,
            "resourceVersion" => q.resource_version = Some(value.into_owned()),
            "timeoutSeconds" => {
                let secs: u64 =
                    value.parse().map_err(|_| bad_request(format!("invalid timeoutSeconds {value:?}")))?;
                q.timeout = Some(Duration::from_secs(secs));
            }
            "allowWatchBookmarks" => q.bookmarks = truthy,
            "sendInitialEvents" => q.send_initial_events = truthy,
            "limit" => {
                let limit: i64 =
                    value.parse().map_err(|_| bad_request(format!("invalid limit {value:?}")))?;
                q.limit = (limit > 0).then_some(limit as usize);
            }
            "continue" if !value.is_empty() => q.continue_token = Some(value.into_owned()),
            "labelSelector" => {
                q.labels = LabelSelector::parse(&value)
                    .map_err(|e| bad_request(format!("unable to parse labelSelector: {e}")))?;
            }
            "fieldSelector" => q.field_text = value.into_owned(),
            _ => {}
        }
    }
    if q.send_initial_events {
        return Err(err(Status::failure(
            400,
            "BadRequest",
            "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
        )));
    }
    Ok(q)
}

impl ListQuery {
    /// The field selector, keeping the fields in `known`.
    fn fields(&self, known: &[&str]) -> Result<FieldSelector, ApiError> {
        FieldSelector::parse(&self.field_text, known).map_err(|e| bad_request(e.to_string()))
    }
}

/// A list or watch request: the namespace of a namespaced path (`None` on a cluster-wide
/// one, e.g. `/api/v1/pods` as opposed to `/api/v1/namespaces/{ns}/pods`) and the query.
struct ListRequest {
    namespace: Option<String>,
    query: ListQuery,
}

impl<S: Send + Sync> FromRequestParts<S> for ListRequest {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Response> {
        let namespace = Option::<Path<String>>::from_request_parts(parts, state)
            .await
            .map_err(IntoResponse::into_response)?
            .map(|Path(ns)| ns);
        let query = parse_query(parts.uri.query()).map_err(IntoResponse::into_response)?;
        Ok(Self { namespace, query })
    }
}

/// A continue token: the list's resourceVersion and the last key returned.
#[derive(Serialize, Deserialize)]
struct ContinueToken {
    v: String,
    rv: u64,
    start: String,
}

fn encode_continue(rv: u64, start: String) -> String {
    let token = ContinueToken { v: "meta.k8s.io/v1".to_owned(), rv, start };
    base64_url(&serde_json::to_vec(&token).unwrap_or_default())
}

fn decode_continue(cluster: &Cluster, token: &str) -> Result<(u64, String), ApiError> {
    let bad = || bad_request("invalid value for continue: the continue token is malformed");
    let bytes = base64_url_decode(token).ok_or_else(bad)?;
    let token: ContinueToken = serde_json::from_slice(&bytes).map_err(|_| bad())?;
    if token.rv < cluster.floor() {
        return Err(err(Status::failure(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. \
             You can start a new list without the continue parameter.",
        )));
    }
    Ok((token.rv, token.start))
}

fn pod_field<'a>(cluster: &'a Cluster, pod: &'a SimPod, field: &str) -> Option<&'a str> {
    match field {
        "metadata.name" => Some(&pod.name),
        "metadata.namespace" => Some(&pod.namespace),
        "spec.nodeName" => cluster.node_of(pod).map(|n| n.name.as_str()),
        "status.phase" => Some(pod.phase.as_str()),
        _ => None,
    }
}

const POD_FIELDS: &[&str] = &["metadata.name", "metadata.namespace", "spec.nodeName", "status.phase"];
const META_FIELDS: &[&str] = &["metadata.name", "metadata.namespace"];
const NODE_FIELDS: &[&str] = &["metadata.name"];

fn node_label<'a>(node: &'a SimNode, key: &str) -> Option<&'a str> {
    match key {
        "kubernetes.io/hostname" => Some(&node.name),
        "topology.kubernetes.io/region" => Some(node.topology().0),
        "topology.kubernetes.io/zone" => Some(node.topology().1),
        "kubernetes.io/os" | "beta.kubernetes.io/os" => Some("linux"),
        "kubernetes.io/arch" | "beta.kubernetes.io/arch" => Some("amd64"),
        _ => None,
    }
}

/// A list body, streamed in chunks: `{"kind","apiVersion","metadata","items":[…]}`.
fn list_response(
    kind: &'static str,
    api_version: &'static str,
    rv: u64,
    continue_token: Option<String>,
    count: usize,
    item: impl Fn(usize, &mut Vec<u8>) + Send + Sync + 'static,
) -> Response {
    let mut meta = serde_json::Map::new();
    meta.insert("resourceVersion".into(), rv.to_string().into());
    if let Some(token) = continue_token {
        meta.insert("continue".into(), token.into());
    }
    let prefix = format!(
        "{{\"kind\":\"{kind}\",\"apiVersion\":\"{api_version}\",\"metadata\":{},\"items\":[",
        serde_json::Value::Object(meta)
    );
    let chunks = count.div_ceil(ITEMS_PER_CHUNK);
    let stream = futures::stream::iter(0..=chunks).map(move |chunk| {
        let mut buf = Vec::new();
        if chunk == 0 {
            buf.extend_from_slice(prefix.as_bytes());
        }
        if chunk == chunks {
            buf.extend_from_slice(b"]}");
        } else {
            let lo = chunk * ITEMS_PER_CHUNK;
            for i in lo..(lo + ITEMS_PER_CHUNK).min(count) {
                if i > 0 {
                    buf.push(b',');
                }
                item(i, &mut buf);
            }
        }
        Ok::<_, Infallible>(Bytes::from(buf))
    });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}

fn write_json(buf: &mut Vec<u8>, value: &impl Serialize) {
    // Serialising k8s-openapi objects into a Vec cannot fail.
    let _ = serde_json::to_writer(buf, value);
}

/// Lists or watches the pods of one namespace or of all.
async fn pods(State(state): State<ApiState>, list: ListRequest) -> Result<Response, ApiError> {
    let ListRequest { namespace, query: q } = list;
    let fields = q.fields(POD_FIELDS)?;
    let cluster = Arc::clone(&state.cluster);
    if q.watch {
        cluster.stats.api("watch pods");
        let filter = PodFilter { namespace, labels: q.labels, fields };
        return Ok(watch(cluster, WatchKind::Pods(filter), &q.resource_version, q.timeout, q.bookmarks));
    }
    cluster.stats.api("list pods");
    let (list_rv, after) = match &q.continue_token {
        Some(token) => {
            let (rv, start) = decode_continue(&cluster, token)?;
            let key = start
                .split_once('/')
                .map(|(ns, name)| (ns.to_owned(), name.to_owned()))
                .ok_or_else(|| bad_request("invalid value for continue"))?;
            (Some(rv), Some(key))
        }
        None => (None, None),
    };
    let filter = PodFilter { namespace: namespace.clone(), labels: q.labels, fields };
    let (items, rv, more) =
        cluster.list_pods(namespace.as_deref(), after.as_ref(), q.limit.unwrap_or(usize::MAX), |p| {
            filter.matches(&cluster, p)
        });
    let rv = list_rv.unwrap_or(rv);
    let token = match (more, items.last()) {
        (true, Some(last)) => Some(encode_continue(rv, format!("{}/{}", last.namespace, last.name))),
        _ => None,
    };
    Ok(list_response("PodList", "v1", rv, token, items.len(), move |i, buf| {
        if let Some(pod) = items.get(i) {
            write_json(buf, &objects::pod(pod, cluster.node_of(pod)));
        }
    }))
}

/// The answer to a get of `name` of `resource` (plural): `object`, or a 404 without it.
fn get_response(
    state: &ApiState,
    resource: &'static str,
    name: &str,
    object: Option<impl Serialize>,
) -> Result<Response, ApiError> {
    state.cluster.stats.api(&format!("get {resource}"));
    let object = object.ok_or_else(|| err(Status::not_found(resource, name)))?;
    Ok(Json(object).into_response())
}

async fn get_pod(
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let cluster = &state.cluster;
    let pod = cluster.pod(&ns, &name).map(|pod| objects::pod(&pod, cluster.node_of(&pod)));
    get_response(&state, "pods", &name, pod)
}

async fn get_node(State(state): State<ApiState>, Path(name): Path<String>) -> Result<Response, ApiError> {
    let node = state.cluster.node_by_name(&name).map(|node| objects::node(node, state.cluster.kubelet_port));
    get_response(&state, "nodes", &name, node)
}

/// Lists or watches the nodes.
async fn list_nodes(State(state): State<ApiState>, list: ListRequest) -> Result<Response, ApiError> {
    let q = list.query;
    let fields = q.fields(NODE_FIELDS)?;
    let cluster = Arc::clone(&state.cluster);
    let filter = NodeFilter { labels: q.labels, fields };
    if q.watch {
        cluster.stats.api("watch nodes");
        return Ok(watch(cluster, WatchKind::Nodes(filter), &q.resource_version, q.timeout, q.bookmarks));
    }
    cluster.stats.api("list nodes");
    let (list_rv, after) = match &q.continue_token {
        Some(token) => {
            let (rv, start) = decode_continue(&cluster, token)?;
            (Some(rv), Some(start))
        }
        None => (None, None),
    };
    let rv = list_rv.unwrap_or_else(|| cluster.resource_version());
    let limit = q.limit.unwrap_or(usize::MAX);
    let mut candidates = cluster
        .nodes_by_name
        .iter()
        .filter_map(|i| cluster.nodes.get(*i as usize))
        .filter(|n| after.as_ref().is_none_or(|a| n.name.as_str() > a.as_str()));
    let mut items: Vec<Arc<SimNode>> = Vec::new();
    let mut more = false;
    for node in candidates.by_ref() {
        if filter.matches(node) {
            items.push(Arc::clone(node));
            if items.len() >= limit {
                more = candidates.next().is_some();
                break;
            }
        }
    }
    let token = match (more, items.last()) {
        (true, Some(last)) => Some(encode_continue(rv, last.name.clone())),
        _ => None,
    };
    let port = cluster.kubelet_port;
    Ok(list_response("NodeList", "v1", rv, token, items.len(), move |i, buf| {
        if let Some(node) = items.get(i) {
            write_json(buf, &objects::node(node, port));
        }
    }))
}

/// Lists or watches the config maps of one namespace or of all.
async fn config_maps(State(state): State<ApiState>, list: ListRequest) -> Result<Response, ApiError> {
    let ListRequest { namespace, query: q } = list;
    let fields = q.fields(META_FIELDS)?;
    let cluster = Arc::clone(&state.cluster);
    let filter = MetaFilter { namespace, labels: q.labels, fields };
    if q.watch {
        cluster.stats.api("watch configmaps");
        return Ok(watch(
            cluster,
            WatchKind::ConfigMaps(filter),
            &q.resource_version,
            q.timeout,
            q.bookmarks,
        ));
    }
    cluster.stats.api("list configmaps");
    let after = match &q.continue_token {
        Some(token) => Some(decode_continue(&cluster, token)?),
        None => None,
    };
    let (mut items, rv) = cluster.list_config_maps(filter.namespace.as_deref(), |cm| {
        filter.matches(&cm.metadata) && after.as_ref().is_none_or(|(_, start)| config_map_key(cm) > *start)
    });
    // Config maps are few: a continue token resumes after a key, at the current revision.
    let rv = after.as_ref().map_or(rv, |(rv, _)| *rv);
    let limit = q.limit.unwrap_or(usize::MAX);
    let token = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|last| encode_continue(rv, config_map_key(last)))
    } else {
        None
    };
    Ok(list_response("ConfigMapList", "v1", rv, token, items.len(), move |i, buf| {
        if let Some(cm) = items.get(i) {
            // k8s-openapi adds `kind` and `apiVersion`.
            write_json(buf, cm.as_ref());
        }
    }))
}

fn config_map_key(cm: &ConfigMap) -> String {
    format!(
        "{}/{}",
        cm.metadata.namespace.as_deref().unwrap_or_default(),
        cm.metadata.name.as_deref().unwrap_or_default()
    )
}

async fn get_config_map(
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    // k8s-openapi adds `kind` and `apiVersion`.
    let cm = state.cluster.config_map(&ns, &name);
    get_response(&state, "configmaps", &name, cm.as_deref())
}

/// A filter on metadata only (config maps, workload objects): namespace, labels, and the
/// `metadata.name` and `metadata.namespace` fields.
struct MetaFilter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl MetaFilter {
    fn matches(&self, meta: &ObjectMeta) -> bool {
        self.namespace.as_deref().is_none_or(|ns| meta.namespace.as_deref() == Some(ns))
            && self.labels.matches(|k| meta.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str))
            && self.fields.matches(|f| match f {
                "metadata.name" => meta.name.as_deref(),
                "metadata.namespace" => meta.namespace.as_deref(),
                _ => None,
            })
    }
}

/// Lists or watches the workload objects of `resource`, in one namespace or in all.
fn controllers(
    state: &ApiState,
    resource: Resource,
    namespace: Option<String>,
    raw_query: Option<&str>,
) -> Result<Response, ApiError> {
    let q = parse_query(raw_query)?;
    let fields = q.fields(META_FIELDS)?;
    let cluster = Arc::clone(&state.cluster);
    let filter = MetaFilter { namespace, labels: q.labels, fields };
    if q.watch {
        cluster.stats.api(&format!("watch {}", resource.plural()));
        let kind = WatchKind::Controllers(resource, filter);
        return Ok(watch(cluster, kind, &q.resource_version, q.timeout, q.bookmarks));
    }
    cluster.stats.api(&format!("list {}", resource.plural()));
    let after = match &q.continue_token {
        Some(token) => {
            let (rv, start) = decode_continue(&cluster, token)?;
            let (ns, name) =
                start.split_once('/').ok_or_else(|| bad_request("invalid value for continue"))?;
            Some((rv, (ns.to_owned(), name.to_owned())))
        }
        None => None,
    };
    let key = |c: &Controller| format!("{}/{}", c.namespace, c.name);
    // In key order: `(namespace, name)`, as the objects are stored.
    let (mut items, rv) = cluster.list_controllers(resource, filter.namespace.as_deref(), |c| {
        filter.matches(c.metadata())
            && after.as_ref().is_none_or(|(_, (ns, name))| (&c.namespace, &c.name) > (ns, name))
    });
    // Workload objects are few: a continue token resumes after a key, at the current revision.
    let rv = after.as_ref().map_or(rv, |(rv, _)| *rv);
    let limit = q.limit.unwrap_or(usize::MAX);
    let token = if items.len() > limit {
        items.truncate(limit);
        items.last().map(|last| encode_continue(rv, key(last)))
    } else {
        None
    };
    Ok(list_response(resource.list_kind(), resource.api_version(), rv, token, items.len(), move |i, buf| {
        if let Some(c) = items.get(i) {
            // k8s-openapi adds `kind` and `apiVersion`.
            write_json(buf, &c.object);
        }
    }))
}

/// Gets workload object `ns/name` of `resource`, or a 404 naming it (`deployments.apps "x"
/// not found`).
fn get_controller(state: &ApiState, resource: Resource, ns: &str, name: &str) -> Result<Response, ApiError> {
    state.cluster.stats.api(&format!("get {}", resource.plural()));
    let object = state
        .cluster
        .controller(resource, ns, name)
        .ok_or_else(|| err(Status::not_found_in(resource.group(), resource.plural(), name)))?;
    Ok(Json(&object.object).into_response())
}

/// An `apps/v1` resource of the path, or the 404 of an unknown path.
fn apps_resource(plural: &str) -> Result<Resource, ApiError> {
    Resource::find("apps", plural).ok_or_else(|| err(not_found_status()))
}

async fn apps_list(
    State(state): State<ApiState>,
    Path(resource): Path<String>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    controllers(&state, apps_resource(&resource)?, None, query.as_deref())
}

async fn apps_list_namespaced(
    State(state): State<ApiState>,
    Path((ns, resource)): Path<(String, String)>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    controllers(&state, apps_resource(&resource)?, Some(ns), query.as_deref())
}

async fn apps_get(
    State(state): State<ApiState>,
    Path((ns, resource, name)): Path<(String, String, String)>,
) -> Result<Response, ApiError> {
    get_controller(&state, apps_resource(&resource)?, &ns, &name)
}

/// Lists or watches the services of one namespace or of all.
async fn services(
    State(state): State<ApiState>,
    namespace: Option<Path<String>>,
    RawQuery(query): RawQuery,
) -> Result<Response, ApiError> {
    controllers(&state, Resource::Services, namespace.map(|Path(ns)| ns), query.as_deref())
}

async fn get_service(
    State(state): State<ApiState>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    get_controller(&state, Resource::Services, &ns, &name)
}

struct PodFilter {
    namespace: Option<String>,
    labels: LabelSelector,
    fields: FieldSelector,
}

impl PodFilter {
    fn matches(&self, cluster: &Cluster, pod: &SimPod) -> bool {
        self.namespace.as_deref().is_none_or(|ns| ns == pod.namespace)
            && self.labels.matches(|k| pod.label(k))
            && self.fields.matches(|f| pod_field(cluster, pod, f))
    }
}

struct NodeFilter {
    labels: LabelSelector,
    fields: FieldSelector,
}

impl NodeFilter {
    fn matches(&self, node: &SimNode) -> bool {
        self.labels.matches(|k| node_label(node, k))
            && self.fields.matches(|f| (f == "metadata.name").then_some(node.name.as_str()))
    }
}

enum WatchKind {
    Pods(PodFilter),
    Nodes(NodeFilter),
    ConfigMaps(MetaFilter),
    Controllers(Resource, MetaFilter),
}

fn typed_line<T: Serialize>(kind: EventType, object: T) -> Vec<u8> {
    event_line(&match kind {
        EventType::Added => WatchEvent::Added(object),
        EventType::Modified => WatchEvent::Modified(object),
        EventType::Deleted => WatchEvent::Deleted(object),
    })
}

impl WatchKind {
    fn kind(&self) -> &'static str {
        match self {
            WatchKind::Pods(_) => "Pod",
            WatchKind::Nodes(_) => "Node",
            WatchKind::ConfigMaps(_) => "ConfigMap",
            WatchKind::Controllers(resource, _) => resource.kind(),
        }
    }

    fn api_version(&self) -> &'static str {
        match self {
            WatchKind::Controllers(resource, _) => resource.api_version(),
            _ => "v1",
        }
    }

    fn watched(&self) -> Watched {
        match self {
            WatchKind::Pods(_) => Watched::Pods,
            WatchKind::Nodes(_) => Watched::Other,
            WatchKind::ConfigMaps(_) => Watched::ConfigMaps,
            WatchKind::Controllers(resource, _) => Watched::Controllers(*resource),
        }
    }

    /// The line for `object` changing by `kind`, if this watch wants it.
    fn line(&self, cluster: &Cluster, kind: EventType, object: &Object) -> Option<Vec<u8>> {
        match (self, object) {
            (WatchKind::Pods(filter), Object::Pod(pod)) => filter
                .matches(cluster, pod)
                .then(|| typed_line(kind, objects::pod(pod, cluster.node_of(pod)))),
            (WatchKind::ConfigMaps(filter), Object::ConfigMap(cm)) => {
                filter.matches(&cm.metadata).then(|| typed_line(kind, cm.as_ref()))
            }
            (WatchKind::Controllers(resource, filter), Object::Controller(c)) => {
                (c.resource == *resource && filter.matches(c.metadata())).then(|| typed_line(kind, &c.object))
            }
            _ => None,
        }
    }

    /// The line for an event, if this watch wants it.
    fn event_line(&self, cluster: &Cluster, event: &Event) -> Option<Vec<u8>> {
        self.line(cluster, event.kind, &event.object)
    }
}

fn expired_line(e: &Expired) -> Vec<u8> {
    error_line(&Status::failure(
        410,
        "Expired",
        format!("too old resource version: {} ({})", e.requested, e.oldest),
    ))
}

/// A watch response: a chunked stream of newline-delimited watch events.
fn watch(
    cluster: Arc<Cluster>,
    kind: WatchKind,
    resource_version: &Option<String>,
    timeout: Option<Duration>,
    bookmarks: bool,
) -> Response {
    let from = match resource_version.as_deref() {
        None | Some("") | Some("0") => None,
        Some(v) => match v.parse::<u64>() {
            Ok(rv) => Some(rv),
            Err(_) => {
                return bad_request(format!("invalid resource version: {v:?}")).into_response();
            }
        },
    };
    if let Some(rv) = from
        && cluster.faults.take_gone(kind.kind())
    {
        // Fault injection (`gone-once`): this resumption is too old, as after a compaction.
        let line = expired_line(&Expired { requested: rv, oldest: cluster.resource_version() + 1 });
        return ([(header::CONTENT_TYPE, "application/json")], line).into_response();
    }
    let (tx, mut rx) = mpsc::channel::<Chunk>(64);
    let timeout = timeout.unwrap_or(DEFAULT_WATCH_TIMEOUT);
    tokio::spawn(async move {
        let _ = run_watch(&cluster, &kind, from, timeout, bookmarks, &tx).await;
    });
    let stream = futures::stream::poll_fn(move |cx| rx.poll_recv(cx)).map(|chunk| match chunk {
        Chunk::Line(line) => Ok(Bytes::from(line)),
        // An error ends the body abruptly: HTTP/2 RST_STREAM, HTTP/1.1 connection closed.
        Chunk::Abort => Err(std::io::Error::new(std::io::ErrorKind::ConnectionAborted, "watch dropped")),
    });
    ([(header::CONTENT_TYPE, "application/json")], Body::from_stream(stream)).into_response()
}

/// What a watch task sends to its response body.
enum Chunk {
    /// One event line.
    Line(Vec<u8>),
    /// Break the connection (fault injection).
    Abort,
}

/// The client went away.
struct Gone;

async fn run_watch(
    cluster: &Cluster,
    kind: &WatchKind,
    from: Option<u64>,
    timeout: Duration,
    bookmarks: bool,
    tx: &mpsc::Sender<Chunk>,
) -> Result<(), Gone> {
    let send = |line: Vec<u8>| async move { tx.send(Chunk::Line(line)).await.map_err(|_| Gone) };
    let mut drops = cluster.faults.watch_drops();
    let subscription = match cluster.subscribe(from, kind.watched()) {
        Ok(s) => s,
        Err(e) => return send(expired_line(&e)).await,
    };
    let mut last_rv = subscription.rv;
    match subscription.start {
        WatchStart::Snapshot(snapshot) => match kind {
            WatchKind::Pods(_) | WatchKind::ConfigMaps(_) | WatchKind::Controllers(..) => {
                for object in &snapshot {
                    if let Some(line) = kind.line(cluster, EventType::Added, object) {
                        send(line).await?;
                    }
                }
            }
            WatchKind::Nodes(filter) => {
                for node in cluster.nodes_by_name.iter().filter_map(|i| cluster.nodes.get(*i as usize)) {
                    if filter.matches(node) {
                        let object = objects::node(node, cluster.kubelet_port);
                        send(event_line(&WatchEvent::Added(object))).await?;
                    }
                }
            }
        },
        WatchStart::Replay(events) => {
            for event in &events {
                if let Some(line) = kind.event_line(cluster, event) {
                    send(line).await?;
                }
            }
        }
    }
    let mut live = subscription.live;
    let deadline = tokio::time::sleep(timeout);
    tokio::pin!(deadline);
    let mut ticker =
        tokio::time::interval_at(tokio::time::Instant::now() + BOOKMARK_INTERVAL, BOOKMARK_INTERVAL);
    loop {
        tokio::select! {
            () = &mut deadline => return Ok(()),
            () = tx.closed() => return Err(Gone),
            _ = drops.changed() => {
                cluster.faults.count_dropped();
                return tx.send(Chunk::Abort).await.map_err(|_| Gone);
            }
            _ = ticker.tick(), if bookmarks => {
                send(bookmark_line(kind.kind(), kind.api_version(), last_rv)).await?;
            }
            received = live.recv() => match received {
                Ok(event) => {
                    if event.rv <= last_rv {
                        continue;
                    }
                    last_rv = event.rv;
                    if let Some(line) = kind.event_line(cluster, &event) {
                        send(line).await?;
                    }
                }
                Err(broadcast::error::RecvError::Lagged(_)) => {
                    // Too slow to keep up: make the client relist, as kube-apiserver does.
                    let e = Expired { requested: last_rv, oldest: cluster.floor() };
                    return send(expired_line(&e)).await;
                }
                Err(broadcast::error::RecvError::Closed) => return Ok(()),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::api_state;
    use axum::body::to_bytes;
    use std::collections::BTreeMap;
    use tower::ServiceExt as _;

    fn api_counts(cluster: &Cluster) -> BTreeMap<String, u64> {
        cluster.stats.api_requests.lock().map(|m| m.clone()).unwrap_or_default()
    }

    /// GETs `uri` (with `token` as the bearer, if any): the status and the raw body.
    async fn call_raw(state: &ApiState, uri: &str, token: Option<&str>) -> (StatusCode, axum::body::Bytes) {
        let mut request = http::Request::get(uri);
        if let Some(t) = token {
            request = request.header("authorization", format!("Bearer {t}"));
        }
        let response = router(state.clone()).oneshot(request.body(Body::empty()).unwrap()).await.unwrap();
        let status = response.status();
        (status, to_bytes(response.into_body(), usize::MAX).await.unwrap())
    }

    async fn call(state: &ApiState, uri: &str, token: Option<&str>) -> (StatusCode, serde_json::Value) {
        let (status, body) = call_raw(state, uri, token).await;
        (status, serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null))
    }

    #[tokio::test]
    async fn unauthorized_is_a_status() {
        let state = api_state();
        let (status, body) = call(&state, "/api/v1/pods", None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
        assert_eq!(body["reason"], "Unauthorized");
        let (status, _) = call(&state, "/api/v1/pods", Some("nope")).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED);
    }

    #[tokio::test]
    async fn list_paginates_and_filters() {
        let state = api_state();
        let token = state.cluster.token.clone();
        let mut names = Vec::new();
        let mut uri = "/api/v1/pods?limit=5".to_owned();
        let mut rvs = Vec::new();
        loop {
            let (status, body) = call(&state, &uri, Some(&token)).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            assert_eq!(body["kind"], "PodList");
            rvs.push(body["metadata"]["resourceVersion"].as_str().unwrap().to_owned());
            for item in body["items"].as_array().unwrap() {
                names.push(item["metadata"]["name"].as_str().unwrap().to_owned());
            }
            match body["metadata"]["continue"].as_str() {
                Some(c) => uri = format!("/api/v1/pods?limit=5&continue={c}"),
                None => break,
            }
        }
        let cafe_pods = state.cluster.all_pods().iter().filter(|p| p.cafe.is_some()).count();
        assert!(cafe_pods >= 6);
        assert_eq!(names.len(), 12 + cafe_pods);
        assert!(rvs.windows(2).all(|w| w[0] == w[1]));
        let all: Vec<String> = state.cluster.all_pods().iter().map(|p| p.name.clone()).collect();
        assert_eq!(names, all);

        let (_, body) =
            call(&state, "/api/v1/namespaces/shop/pods?labelSelector=app%3Dweb", Some(&token)).await;
        for item in body["items"].as_array().unwrap() {
            assert_eq!(item["metadata"]["namespace"], "shop");
            assert_eq!(item["metadata"]["labels"]["app"], "web");
        }
        let (_, body) = call(&state, "/api/v1/pods?fieldSelector=spec.nodeName%3Dnode-1", Some(&token)).await;
        assert_eq!(body["items"].as_array().unwrap().len(), state.cluster.pods_on(1).len());
        assert!(state.cluster.pods_on(1).len() > 4);
        let latte = state.cluster.cafes.iter().find(|c| c.kind.as_str() == "latte").unwrap();
        let uri = format!(
            "/api/v1/namespaces/{}/pods?labelSelector=app%3Dcafe%2Cune-tasse-de.cafe%2Fcafe%3D{}",
            latte.namespace, latte.name
        );
        let (_, body) = call(&state, &uri, Some(&token)).await;
        assert_eq!(body["items"].as_array().unwrap().len(), latte.pods as usize);
        let (_, body) =
            call(&state, "/api/v1/pods?labelSelector=une-tasse-de.cafe%2Fcafe", Some(&token)).await;
        assert_eq!(body["items"].as_array().unwrap().len(), cafe_pods);
        for item in body["items"].as_array().unwrap() {
            assert_eq!(item["metadata"]["labels"]["app"], "cafe");
            assert_eq!(item["status"]["phase"], "Running");
        }
        let (status, body) = call(&state, "/api/v1/namespaces/shop/pods/nope", Some(&token)).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["reason"], "NotFound");
        let (status, body) = call(&state, "/api/v1/nodes?limit=2", Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["items"].as_array().unwrap().len(), 2);
        assert!(body["metadata"]["continue"].is_string());
        let (status, body) =
            call(&state, "/api/v1/pods?watch=true&sendInitialEvents=true", Some(&token)).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        assert_eq!(body["kind"], "Status");
        let counts = api_counts(&state.cluster);
        assert!(counts["list pods"] >= 3);
        assert_eq!(counts["list nodes"], 1);
    }

    #[tokio::test]
    async fn workload_discovery() {
        let state = api_state();
        let token = state.cluster.token.clone();
        let (status, body) = call(&state, "/apis", Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
        let groups: Vec<&str> =
            body["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
        assert_eq!(groups, ["apps", "authentication.k8s.io", "authorization.k8s.io"]);
        assert_eq!(body["groups"][0]["preferredVersion"]["groupVersion"], "apps/v1");
        let (_, body) = call(&state, "/apis/apps", Some(&token)).await;
        assert_eq!((body["kind"].as_str(), body["name"].as_str()), (Some("APIGroup"), Some("apps")));
        let (status, body) = call(&state, "/apis/apps/v1", Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(body["kind"], "APIResourceList");
        assert_eq!(body["groupVersion"], "apps/v1");
        let resources = body["resources"].as_array().unwrap();
        let names: Vec<(&str, &str)> =
            resources.iter().map(|r| (r["name"].as_str().unwrap(), r["kind"].as_str().unwrap())).collect();
        assert_eq!(
            names,
            [
                ("deployments", "Deployment"),
                ("replicasets", "ReplicaSet"),
                ("statefulsets", "StatefulSet"),
                ("daemonsets", "DaemonSet")
            ]
        );
        for r in resources {
            assert_eq!(r["verbs"], serde_json::json!(["get", "list", "watch"]));
            assert_eq!(r["namespaced"], true);
        }
        let (_, body) = call(&state, "/apis/authentication.k8s.io/v1", Some(&token)).await;
        assert_eq!(body["resources"][0]["name"], "tokenreviews");
        assert_eq!(body["resources"][0]["verbs"], serde_json::json!(["create"]));
        let (_, body) = call(&state, "/api/v1", Some(&token)).await;
        let services =
            body["resources"].as_array().unwrap().iter().find(|r| r["name"] == "services").unwrap();
        assert_eq!(services["kind"], "Service");
        assert_eq!(services["shortNames"], serde_json::json!(["svc"]));
        let (status, _) = call(&state, "/apis/apps/v2", Some(&token)).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
    }

    #[tokio::test]
    async fn workload_objects_are_served() {
        let state = api_state();
        let token = state.cluster.token.clone();
        let get = |uri: String| {
            let state = state.clone();
            let token = token.clone();
            async move { call(&state, &uri, Some(&token)).await }
        };
        let pods = state.cluster.all_pods();
        let web = pods.iter().find(|p| p.app.as_str() == "web").unwrap();
        let ns = web.namespace.as_str();
        let app_pods =
            |app: &str| pods.iter().filter(|p| p.namespace == ns && p.label("app") == Some(app)).count();

        let (status, d) = get(format!("/apis/apps/v1/namespaces/{ns}/deployments/web")).await;
        assert_eq!(status, StatusCode::OK, "{d}");
        assert_eq!((d["apiVersion"].as_str(), d["kind"].as_str()), (Some("apps/v1"), Some("Deployment")));
        assert_eq!(d["metadata"]["name"], "web");
        assert_eq!(d["metadata"]["namespace"], ns);
        assert_eq!(d["metadata"]["uid"].as_str().unwrap().len(), 36);
        assert!(d["metadata"]["resourceVersion"].as_str().unwrap().parse::<u64>().is_ok());
        assert!(d["metadata"]["creationTimestamp"].as_str().unwrap().ends_with('Z'));
        assert_eq!(d["metadata"]["labels"], serde_json::json!({"app": "web"}));
        assert_eq!(d["spec"]["selector"], serde_json::json!({"matchLabels": {"app": "web"}}));
        assert_eq!(d["spec"]["replicas"], app_pods("web"));
        assert_eq!(d["spec"]["template"]["metadata"]["labels"], serde_json::json!({"app": "web"}));

        let rs_name = web.replica_set();
        let (status, rs) = get(format!("/apis/apps/v1/namespaces/{ns}/replicasets/{rs_name}")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((rs["apiVersion"].as_str(), rs["kind"].as_str()), (Some("apps/v1"), Some("ReplicaSet")));
        assert_eq!(
            rs["spec"]["selector"],
            serde_json::json!({"matchLabels": {"app": "web", "pod-template-hash": web.template_hash}})
        );
        let owner = &rs["metadata"]["ownerReferences"][0];
        assert_eq!((owner["kind"].as_str(), owner["name"].as_str()), (Some("Deployment"), Some("web")));
        assert_eq!(owner["uid"], d["metadata"]["uid"]);
        // The pods' ownerReference points at this ReplicaSet.
        let (_, pod) = get(format!("/api/v1/namespaces/{ns}/pods/{}", web.name)).await;
        assert_eq!(pod["metadata"]["ownerReferences"][0]["uid"], rs["metadata"]["uid"]);

        let (status, sts) = get(format!("/apis/apps/v1/namespaces/{ns}/statefulsets/tiered")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (sts["apiVersion"].as_str(), sts["kind"].as_str()),
            (Some("apps/v1"), Some("StatefulSet"))
        );
        assert_eq!(
            sts["spec"]["selector"],
            serde_json::json!({"matchExpressions": [
                {"key": "tier", "operator": "Exists"},
                {"key": "app", "operator": "In", "values": ["web", "api"]}
            ]})
        );
        let (status, ds) = get(format!("/apis/apps/v1/namespaces/{ns}/daemonsets/node-agent")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((ds["apiVersion"].as_str(), ds["kind"].as_str()), (Some("apps/v1"), Some("DaemonSet")));
        assert_eq!(ds["spec"]["selector"], serde_json::json!({"matchLabels": {"app": "node-agent"}}));
        assert_eq!(ds["status"]["numberReady"], 0);

        let (status, svc) = get(format!("/api/v1/namespaces/{ns}/services/web")).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!((svc["apiVersion"].as_str(), svc["kind"].as_str()), (Some("v1"), Some("Service")));
        assert_eq!(svc["spec"]["selector"], serde_json::json!({"app": "web"}));
        assert_eq!(svc["spec"]["type"], "ClusterIP");
        assert_eq!(svc["spec"]["ports"][0]["port"], 80);
        let (status, headless) = get(format!("/api/v1/namespaces/{ns}/services/headless-external")).await;
        assert_eq!(status, StatusCode::OK);
        assert!(headless["spec"].get("selector").is_none(), "{headless}");
        assert_eq!(headless["spec"]["clusterIP"], "None");

        let cafe = state.cluster.cafes.first().unwrap();
        let (status, cd) =
            get(format!("/apis/apps/v1/namespaces/{}/deployments/{}", cafe.namespace, cafe.name)).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            cd["spec"]["selector"],
            serde_json::json!({"matchLabels": {"app": "cafe", "une-tasse-de.cafe/cafe": cafe.name}})
        );
        assert_eq!(cd["spec"]["replicas"], cafe.pods);

        // Unknown names: kube-apiserver's 404 Status.
        let (status, body) = get(format!("/apis/apps/v1/namespaces/{ns}/deployments/nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(
            body,
            serde_json::json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "deployments.apps \"nope\" not found", "reason": "NotFound",
                "details": {"name": "nope", "group": "apps", "kind": "deployments"}, "code": 404})
        );
        let (status, body) = get(format!("/api/v1/namespaces/{ns}/services/nope")).await;
        assert_eq!(status, StatusCode::NOT_FOUND);
        assert_eq!(body["message"], "services \"nope\" not found");
        assert_eq!(body["details"], serde_json::json!({"name": "nope", "kind": "services"}));
        let (status, body) = get("/apis/apps/v1/namespaces/shop/statefulsets/web".to_owned()).await;
        assert_eq!(
            (status, body["message"].as_str()),
            (StatusCode::NOT_FOUND, Some("statefulsets.apps \"web\" not found"))
        );
        // Unknown resources: the generic 404.
        for uri in [
            "/apis/apps/v1/widgets",
            "/apis/apps/v1/namespaces/shop/widgets",
            "/apis/apps/v1/namespaces/shop/widgets/x",
        ] {
            let (status, body) = get(uri.to_owned()).await;
            assert_eq!(status, StatusCode::NOT_FOUND, "{uri}");
            assert_eq!(body["message"], "the server could not find the requested resource", "{uri}");
        }

        // Lists: cluster-wide, per namespace, by label, paginated.
        let (status, list) = get("/apis/apps/v1/deployments".to_owned()).await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(
            (list["apiVersion"].as_str(), list["kind"].as_str()),
            (Some("apps/v1"), Some("DeploymentList"))
        );
        let deployments = list["items"].as_array().unwrap();
        let mut expected: Vec<(String, String)> = pods
            .iter()
            .map(|p| {
                (p.namespace.clone(), p.cafe.as_ref().map_or(p.app.as_str().to_owned(), |c| c.name.clone()))
            })
            .collect();
        expected.sort();
        expected.dedup();
        let listed: Vec<(String, String)> = deployments
            .iter()
            .map(|d| {
                (
                    d["metadata"]["namespace"].as_str().unwrap().to_owned(),
                    d["metadata"]["name"].as_str().unwrap().to_owned(),
                )
            })
            .collect();
        assert_eq!(listed, expected);
        let (_, list) = get("/apis/apps/v1/namespaces/api/statefulsets".to_owned()).await;
        assert_eq!(list["kind"], "StatefulSetList");
        assert_eq!(list["items"].as_array().unwrap().len(), 1);
        assert_eq!(list["items"][0]["metadata"]["namespace"], "api");
        let (_, list) = get("/api/v1/services?labelSelector=app%3Dweb".to_owned()).await;
        assert_eq!((list["apiVersion"].as_str(), list["kind"].as_str()), (Some("v1"), Some("ServiceList")));
        assert!(!list["items"].as_array().unwrap().is_empty());
        assert!(list["items"].as_array().unwrap().iter().all(|s| s["metadata"]["name"] == "web"));
        let (_, list) =
            get(format!("/api/v1/namespaces/{ns}/services?fieldSelector=metadata.name%3Dheadless-external"))
                .await;
        assert_eq!(list["items"].as_array().unwrap().len(), 1);
        let (_, all) = get("/apis/apps/v1/replicasets".to_owned()).await;
        let mut paged = Vec::new();
        let mut uri = "/apis/apps/v1/replicasets?limit=4".to_owned();
        loop {
            let (status, page) = get(uri.clone()).await;
            assert_eq!(status, StatusCode::OK);
            paged.extend(page["items"].as_array().unwrap().iter().cloned());
            match page["metadata"]["continue"].as_str() {
                Some(c) => uri = format!("/apis/apps/v1/replicasets?limit=4&continue={c}"),
                None => break,
            }
        }
        assert_eq!(&paged, all["items"].as_array().unwrap());

        let counts = api_counts(&state.cluster);
        for (what, n) in [
            ("get deployments", 3),
            ("get replicasets", 1),
            ("get statefulsets", 2),
            ("get daemonsets", 1),
            ("get services", 3),
            ("list deployments", 1),
            ("list statefulsets", 1),
            ("list services", 2),
        ] {
            assert_eq!(counts.get(what), Some(&n), "{what}: {counts:?}");
        }
        assert!(counts["list replicasets"] >= 3);
    }

    #[tokio::test]
    async fn workload_watch_starts_with_every_object() {
        let state = api_state();
        let token = state.cluster.token.clone();
        let uri = "/apis/apps/v1/namespaces/shop/deployments?watch=1&timeoutSeconds=0";
        let (status, body) = call_raw(&state, uri, Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
        let names: Vec<String> = body
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .map(|l| {
                let line: serde_json::Value = serde_json::from_slice(l).unwrap();
                assert_eq!(line["type"], "ADDED");
                assert_eq!(line["object"]["apiVersion"], "apps/v1");
                assert_eq!(line["object"]["kind"], "Deployment");
                line["object"]["metadata"]["name"].as_str().unwrap().to_owned()
            })
            .collect();
        let (listed, _) = state.cluster.list_controllers(Resource::Deployments, Some("shop"), |_| true);
        assert!(!names.is_empty());
        assert_eq!(names, listed.iter().map(|c| c.name.clone()).collect::<Vec<_>>());
        assert_eq!(api_counts(&state.cluster)["watch deployments"], 1);
    }

    #[tokio::test]
    async fn watch_from_old_rv_is_expired() {
        let state = api_state();
        let token = state.cluster.token.clone();
        let old = state.cluster.floor() - 1;
        let uri = format!("/api/v1/pods?watch=1&resourceVersion={old}");
        let (status, body) = call_raw(&state, &uri, Some(&token)).await;
        assert_eq!(status, StatusCode::OK);
        let line: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(line["type"], "ERROR");
        assert_eq!(line["object"]["code"], 410);
        assert_eq!(line["object"]["reason"], "Expired");
    }
}
