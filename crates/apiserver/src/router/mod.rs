//! The HTTP layer, generic over [`ServedKind`]s. [`router`] serves:
//!
//! - discovery: `/api`, `/apis` (legacy and aggregated v2/v2beta1), `/apis/<g>`, `/apis/<g>/<v>`,
//!   `/version` ([`discovery`]);
//! - OpenAPI: `/openapi/v2`, `/openapi/v3`, `/openapi/v3/apis/<g>/<v>` ([`openapi`]);
//! - health: `/healthz`, `/livez` (always `ok`), `/readyz` (`ok` once ready), and each
//!   check alone: `/healthz/ping`, `/livez/ping`, `/readyz/<check>`;
//! - own metrics: `/metrics` (the [`Metrics`] registry; every request is counted there by
//!   resource or route template, verb and code);
//! - resources, for every served kind: `GET /apis/<g>/<v>/<plural>`,
//!   `GET /apis/<g>/<v>/namespaces/<ns>/<plural>` and
//!   `GET /apis/<g>/<v>/namespaces/<ns>/<plural>/<name>` (`labelSelector`, `fieldSelector`,
//!   JSON / Table / PartialObjectMetadata by `Accept`); `watch` and every write verb are a 405;
//! - with [`ApiState::with_group`], everything under `/apis/<group>/` of that group's service
//!   (`external.metrics.k8s.io`: [`crate::metrics::external`]; `custom.metrics.k8s.io`:
//!   [`crate::metrics::custom`]), whose discovery follows the reloadable configuration.
//!
//! Every error is a `metav1.Status` ([`status`]); paths and queries are parsed here from the raw
//! URI, so no extractor can answer with a plain-text rejection. Handlers never name a concrete
//! kind.

//! The request chain and the dispatch of every endpoint of a read-only aggregated API server,
//! generic over [`ServedKind`]s and [`GroupService`]s. [`router`] serves:
//!
//! - discovery: `/api`, `/apis` (legacy and aggregated v2/v2beta1), `/apis/<g>`, `/apis/<g>/<v>`,
//!   `/version` ([`crate::discovery`]);
//! - OpenAPI: `/openapi/v2`, `/openapi/v3`, `/openapi/v3/apis/<g>/<v>` ([`crate::openapi`]);
//! - health: `/healthz`, `/livez` (always `ok`), `/readyz` (`ok` once ready), and each
//!   check alone: `/healthz/ping`, `/livez/ping`, `/readyz/<check>`;
//! - own metrics: `/metrics` (the [`Metrics`] registry; every request is counted there by
//!   resource or route template, verb and code);
//! - resources, for every served kind: `GET /apis/<g>/<v>/<plural>`,
//!   `GET /apis/<g>/<v>/namespaces/<ns>/<plural>` and
//!   `GET /apis/<g>/<v>/namespaces/<ns>/<plural>/<name>` (`labelSelector`, `fieldSelector`,
//!   JSON / Table / PartialObjectMetadata by `Accept`); `watch` and every write verb are a 405;
//! - with [`ApiState::with_group`], everything under `/apis/<group>/` of that group's
//!   [`GroupService`] (an API group served by its own code, e.g. `external.metrics.k8s.io`),
//!   whose discovery may follow a reloadable configuration.
//!
//! Every error is a `metav1.Status`; paths and queries are parsed here from the raw URI, so no
//! extractor can answer with a plain-text rejection. Handlers never name a concrete kind.

mod selections;
#[cfg(any(test, feature = "testing"))]
#[allow(missing_docs, clippy::unwrap_used, clippy::expect_used, clippy::panic)]
pub mod testutil;

use std::borrow::Cow;
use std::fmt;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::FutureExt;
use futures::future::BoxFuture;
use http::{HeaderValue, Method, StatusCode, header};

use crate::StatusResponse;
use crate::discovery::{self, Discovery, DynamicGroupVersions, LiveDiscovery, ServerInfo};
use crate::kind::{ComputeError, Item, KindSet, Listing, LiveKinds, ServedKind};
use crate::openapi::{LiveOpenApi, OpenApi};
use crate::render::{self, IncludeObject, RenderContext, render_list, render_object};
use crate::serve::App;
use crate::serve::fairness::{self, ConnectionSlots};
use crate::serve::guard::{self, ExemptPaths, Guard};
use crate::{LatencyLabels, Metrics, RequestLabels};
use k8s_wire::GroupVersionResources;
use k8s_wire::{ApiError, GroupResource};
use k8s_wire::{Endpoint, Representation, negotiate_headers};
use k8s_wire::{FIELD_NAMESPACE, FieldSelector, LabelSelector};
use k8s_wire::{ParsedRequest, QueryParams, RequestInfo};
use k8s_wire::{is_dns1123_label, is_dns1123_subdomain};

/// An API group served by its own code beside the kinds (`external.metrics.k8s.io`,
/// `custom.metrics.k8s.io`): the router hands it every request under `/apis/<group>/`, and
/// discovery lists its group-versions.
pub trait GroupService: DynamicGroupVersions {
    /// The API group it owns.
    fn group(&self) -> &'static str;
    /// The `resource` label of the request metrics for `info` when it names something served
    /// (a bounded set, unlike arbitrary paths); `None` otherwise.
    fn metric_resource(&self, info: &RequestInfo) -> Option<String>;
    /// Answers a request under `/apis/<group>/` (parsed once on arrival).
    fn serve<'a>(
        &'a self,
        request: &'a ParsedRequest,
        method: &'a http::Method,
        headers: &'a http::HeaderMap,
    ) -> BoxFuture<'a, Response>;
}

/// Seconds a client is asked to wait while a kind is not ready ([`ComputeError::NotReady`]).
/// client-go retries a 503 with `Retry-After` up to 10 times, so `kubectl` waits out a short
/// startup instead of failing.
pub const NOT_READY_RETRY_AFTER_SECONDS: u32 = 1;

/// A readiness check: whether what it watches is ready (an inventory synced).
pub type ReadyFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// Shared state of the router: the kinds and every precomputed document.
#[derive(Clone)]
pub struct ApiState {
    kinds: Arc<LiveKinds>,
    extra: Vec<GroupVersionResources>,
    discovery: Arc<LiveDiscovery>,
    openapi: Arc<LiveOpenApi>,
    ready: ReadyFn,
    metrics: Arc<Metrics>,
    server: Arc<ServerInfo>,
    auth: Option<Arc<crate::Auth>>,
    groups: Vec<Arc<dyn GroupService>>,
    guard: Arc<Guard>,
    shutting_down: Arc<AtomicBool>,
    /// Named checks `/readyz` reports after `informer-sync` ([`ApiState::with_readiness_check`]).
    checks: Vec<(&'static str, ReadyFn)>,
    selections: selections::SelectedLists,
}

impl fmt::Debug for ApiState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApiState").field("kinds", &self.kinds).finish_non_exhaustive()
    }
}

impl ApiState {
    /// Serves `kinds` (a fixed list, or [`LiveKinds`] that follow a configuration), with
    /// discovery and OpenAPI precomputed for the kinds in force; `ready` is the `/readyz` check
    /// `informer-sync` (the server's inputs are synced), `metrics` counts requests and is served
    /// on `/metrics`.
    pub fn new(kinds: impl Into<LiveKinds>, ready: ReadyFn, metrics: Arc<Metrics>) -> Self {
        let kinds = Arc::new(kinds.into());
        let server = Arc::new(ServerInfo::default());
        let discovery = Arc::new(LiveDiscovery::new(server.clone(), kinds.clone(), Vec::new(), Vec::new()));
        let openapi = Arc::new(LiveOpenApi::new(server.clone(), kinds.clone()));
        Self {
            kinds,
            extra: Vec::new(),
            discovery,
            openapi,
            ready,
            metrics,
            server,
            auth: None,
            groups: Vec::new(),
            guard: Arc::new(Guard::default()),
            shutting_down: Arc::new(AtomicBool::new(false)),
            checks: Vec::new(),
            selections: selections::SelectedLists::default(),
        }
    }

    /// Names the server in its documents (the OpenAPI title, `/version`) and gives it its own
    /// group-version ([`ServerInfo`]).
    pub fn with_server_info(mut self, server: ServerInfo) -> Self {
        self.server = Arc::new(server);
        self.openapi = Arc::new(LiveOpenApi::new(self.server.clone(), self.kinds.clone()));
        self.rebuild_discovery();
        self
    }

    /// Adds a check `name` to `/readyz` (e.g. the first samples of an upstream): readiness
    /// fails while it does.
    pub fn with_readiness_check(mut self, name: &'static str, check: ReadyFn) -> Self {
        self.checks.push((name, check));
        self
    }

    /// Serves at most `max_in_flight` requests at once (0: no limit; the exact health,
    /// discovery and OpenAPI paths of what is served are exempt, [`ApiState::exempt_paths`])
    /// and answers 504 to any still running after `request_timeout` ([`guard`]). Defaults:
    /// 400 and 60s, as kube-apiserver's.
    pub fn with_limits(mut self, max_in_flight: u32, request_timeout: Duration) -> Self {
        self.guard = Arc::new(Guard::new(max_in_flight, request_timeout));
        self
    }

    /// `/readyz` fails (check `shutdown`) once `flag` is set: the server sets it on SIGTERM,
    /// before it stops accepting connections.
    pub fn with_shutdown_flag(mut self, flag: Arc<AtomicBool>) -> Self {
        self.shutting_down = flag;
        self
    }

    /// Authenticates and authorizes every request with `auth` (delegated to the cluster).
    /// Without it every request is served, which only tests should do.
    pub fn with_auth(mut self, auth: Arc<crate::Auth>) -> Self {
        self.auth = Some(auth);
        self
    }

    /// Adds discovery entries for group-versions served by routers merged in later (e.g.
    /// `external.metrics.k8s.io/v1beta1`), after the kinds' own group-version.
    pub fn with_extra_group_versions(mut self, extra: Vec<GroupVersionResources>) -> Self {
        self.extra = extra;
        self.rebuild_discovery();
        self
    }

    /// Serves the API group of `service` (`external.metrics.k8s.io`, `custom.metrics.k8s.io`)
    /// and advertises it in discovery, whose resource list follows configuration reloads.
    pub fn with_group(mut self, service: Arc<dyn GroupService>) -> Self {
        self.groups.push(service);
        self.rebuild_discovery();
        self
    }

    fn rebuild_discovery(&mut self) {
        let dynamic = self.groups.iter().map(|g| g.clone() as Arc<dyn DynamicGroupVersions>).collect();
        self.discovery = Arc::new(LiveDiscovery::new(
            self.server.clone(),
            self.kinds.clone(),
            self.extra.clone(),
            dynamic,
        ));
    }

    /// The kinds in force.
    pub fn kinds(&self) -> Arc<KindSet> {
        self.kinds.current()
    }

    /// The discovery documents in force.
    pub fn discovery(&self) -> Arc<Discovery> {
        self.discovery.current()
    }

    /// The OpenAPI documents in force.
    pub fn openapi(&self) -> Arc<OpenApi> {
        self.openapi.current()
    }

    /// The `/readyz` checks, in the order it reports them.
    fn readiness_checks(&self) -> Vec<(&'static str, bool)> {
        let mut checks = vec![("ping", true), ("informer-sync", (self.ready)())];
        checks.extend(self.checks.iter().map(|(name, check)| (*name, check())));
        checks.push(("shutdown", !self.shutting_down.load(Ordering::SeqCst)));
        checks
    }

    /// The paths exempt from the in-flight limit: health and its checks, and the discovery
    /// and OpenAPI documents of every group-version served. The group-versions are fixed once
    /// the state is built: a reload may change the kinds and resources within them, never the
    /// set.
    pub fn exempt_paths(&self) -> ExemptPaths {
        let mut served = discovery::kinds_group_versions(self.server.home, self.kinds.current().kinds());
        served.extend(self.extra.iter().cloned());
        for group in &self.groups {
            served.extend(group.group_versions().1);
        }
        let checks = self.readiness_checks().into_iter().map(|(name, _)| ("readyz", name));
        let ping = [("healthz", "ping"), ("livez", "ping")];
        ExemptPaths::new(served.iter().map(|gv| (&gv.group, &gv.version)), checks.chain(ping))
    }
}

/// The router of every endpoint listed in the module header: one dispatcher parses every
/// path itself, so unknown paths get a 404 `Status` (and no route table is matched per
/// request). Every request goes through [`handle`]'s chain; its guard exempts exactly
/// [`ApiState::exempt_paths`].
pub fn router(state: ApiState) -> Router {
    app(state).router()
}

/// The [`App`] of `state`: its [`router`], shutdown flag and metrics.
pub fn app(mut state: ApiState) -> App {
    state.guard = Arc::new(state.guard.with_exempt(state.exempt_paths()));
    let (shutting_down, metrics) = (state.shutting_down.clone(), state.metrics.clone());
    App::new(Router::new().fallback(handle).with_state(Arc::new(state)), shutting_down, metrics)
}

/// Decrements the in-flight gauge even when the request future is dropped.
struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// The request chain, in one function instead of a stack of middleware (each layer boxed its
/// future and cloned a service per request), outermost first:
///
/// 1. catch a panic anywhere below (limits, authentication, routing, handlers, rendering) and
///    answer it with a 500 `InternalError` Status, so one bad request never takes its
///    connection or the process down; count and time every request by resource (or route
///    template), verb and code — refused requests included;
/// 2. the limits ([`guard`]): sizes, deadline, in-flight limit, before any webhook is called;
/// 3. authentication and authorization ([`crate::admit`]), when configured;
/// 4. [`dispatch`].
async fn handle(State(state): State<Arc<ApiState>>, mut request: Request) -> Response {
    // The request is parsed once, here; authentication, authorization, dispatch and the
    // handlers read it from the extensions.
    let parsed = std::panic::catch_unwind(AssertUnwindSafe(|| {
        let (method, uri) = (request.method(), request.uri());
        let parsed = Arc::new(ParsedRequest::new(method, uri.path(), uri.query()));
        let labels = metric_labels(&state, method, &parsed, uri.path());
        (parsed, labels)
    }));
    let (parsed, (resource, verb)) = match parsed {
        Ok((parsed, labels)) => (Some(parsed), labels),
        Err(_) => (None, (Cow::Borrowed("other"), "other")),
    };
    let metrics = Arc::clone(&state.metrics);
    metrics.in_flight.inc();
    let in_flight = InFlight(&metrics);
    let start = Instant::now();
    let (method, uri) = (request.method().clone(), request.uri().clone());
    let chain = async {
        let admission = match &parsed {
            Some(parsed) => guard::admit(&state.guard, &method, &uri, request.headers(), &parsed.query),
            None => {
                guard::admit(&state.guard, &method, &uri, request.headers(), &QueryParams::parse(uri.query()))
            }
        };
        let admission = match admission {
            Ok(admission) => admission,
            Err(error) => return error.into_response(),
        };
        if let Some(parsed) = parsed {
            request.extensions_mut().insert(parsed);
        }
        // A list whose answer waits for a body slot of its connection gives its seat back.
        if let Some(slots) = request.extensions().get::<ConnectionSlots>() {
            let slots = slots.with_seat(admission.seat());
            request.extensions_mut().insert(slots);
        }
        let response = guard::within_deadline(admission.timeout, uri.path(), async {
            if let Some(auth) = &state.auth
                && let Err(response) = crate::admit(auth, &mut request).await
            {
                return response;
            }
            dispatch(&state, request).await
        })
        .await;
        drop(admission);
        response
    };
    let response = match AssertUnwindSafe(chain).catch_unwind().await {
        Ok(response) => response,
        Err(payload) => guard::recover(&method, uri.path(), payload.as_ref()),
    };
    drop(in_flight);
    metrics
        .request_duration
        .get_or_create(&LatencyLabels { resource: resource.clone(), verb })
        .observe(start.elapsed().as_secs_f64());
    metrics.requests.get_or_create(&RequestLabels { resource, verb, code: response.status().as_u16() }).inc();
    response
}

/// On HTTP/2, lets the request go on as a task of its own before it computes, rather than on
/// its connection's task: a first poll that yields makes [`fairness::StreamExecutor`] spawn
/// it. HTTP/1.1 serves one request at a time per connection and goes straight on.
async fn before_computing(version: http::Version) {
    if version == http::Version::HTTP_2 {
        tokio::task::yield_now().await;
    }
}

/// The listing of `target` in `namespace`: the cached one, or one computed after
/// [`before_computing`].
async fn listing(
    target: &Target,
    namespace: Option<&str>,
    version: http::Version,
) -> Result<Arc<Listing>, ApiError> {
    if let Some(listing) = target.kind.cached(namespace).await {
        return Ok(listing);
    }
    before_computing(version).await;
    compute(&target.kind, namespace).await
}

/// Bounded metric labels: the plural of a served kind or the route template (never a raw
/// path), and a Kubernetes verb or a standard method.
fn metric_labels(
    state: &ApiState,
    method: &Method,
    parsed: &ParsedRequest,
    path: &str,
) -> (Cow<'static, str>, &'static str) {
    let info = parsed.info.as_ref();
    const VERBS: &[&str] = &[
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "proxy",
        "head",
        "post",
        "put",
        "options",
        "trace",
        "connect",
    ];
    let verb = info
        .and_then(|i| VERBS.iter().copied().find(|v| *v == i.verb))
        .or_else(|| {
            let m = method.as_str();
            VERBS.iter().copied().find(|v| v.eq_ignore_ascii_case(m))
        })
        .unwrap_or("other");
    let resource = info.filter(|i| i.is_resource_request).and_then(|i| {
        let kinds = state.kinds.current();
        if let Some(kind) = kinds.find(&i.api_group, &i.api_version, &i.resource) {
            Some(kind.info().plural.clone())
        } else {
            state.groups.iter().find(|g| g.group() == i.api_group)?.metric_resource(i).map(Cow::Owned)
        }
    });
    let resource = resource
        .or_else(|| route_template(path, &parsed.segs()).map(Cow::Borrowed))
        .unwrap_or(Cow::Borrowed("other"));
    (resource, verb)
}

/// The route template of a non-resource path (with its segments), as a bounded metric label.
fn route_template(path: &str, segs: &[&str]) -> Option<&'static str> {
    if path == "/" {
        return Some("/");
    }
    if path.ends_with('/') {
        return None;
    }
    Some(match segs {
        ["healthz"] => "/healthz",
        ["livez"] => "/livez",
        ["readyz"] => "/readyz",
        ["healthz", _] => "/healthz/{check}",
        ["livez", _] => "/livez/{check}",
        ["readyz", _] => "/readyz/{check}",
        ["version"] => "/version",
        ["metrics"] => "/metrics",
        ["api"] => "/api",
        ["apis"] => "/apis",
        ["apis", _] => "/apis/{group}",
        ["apis", _, _] => "/apis/{group}/{version}",
        ["apis", _, _, ..] => "/apis/{group}/{version}/{*rest}",
        ["openapi", "v2"] => "/openapi/v2",
        ["openapi", "v3"] => "/openapi/v3",
        ["openapi", "v3", ..] => "/openapi/v3/{*rest}",
        _ => return None,
    })
}

async fn dispatch(state: &ApiState, request: Request) -> Response {
    let (parts, _body) = request.into_parts();
    let Some(parsed) = parts.extensions.get::<Arc<ParsedRequest>>().cloned() else {
        // `observe` parses every request; only a panic there leaves none.
        return ApiError::Internal("the request could not be parsed".to_owned()).into_response();
    };
    let segs = parsed.segs();

    if let ["apis", group, _, _, ..] = segs.as_slice() {
        if let Some(service) = state.groups.iter().find(|g| g.group() == *group) {
            // Custom and external metrics queries select over many objects.
            before_computing(parts.version).await;
            return service.serve(&parsed, &parts.method, &parts.headers).await;
        }
        return match serve_resource(state, &parts, &parsed).await {
            Ok(response) => response,
            Err(e) => e.into_response(),
        };
    }

    let known = matches!(
        segs.as_slice(),
        ["healthz" | "livez" | "readyz" | "version" | "api" | "apis" | "metrics"]
            | ["healthz" | "livez" | "readyz", _]
            | ["apis", _]
            | ["apis", _, _]
            | ["openapi", "v2" | "v3"]
            | ["openapi", "v3", _, ..]
    );
    if !known {
        return ApiError::PathNotFound.into_response();
    }
    if parts.method != Method::GET && parts.method != Method::HEAD {
        return ApiError::PathMethodNotAllowed.into_response();
    }
    let headers = &parts.headers;
    match segs.as_slice() {
        ["healthz" | "livez"] => text(StatusCode::OK, "ok"),
        ["readyz"] => readyz(state, &parsed.query),
        ["healthz" | "livez", "ping"] => text(StatusCode::OK, "ok"),
        ["readyz", check] => readyz_check(state, check),
        ["version"] => state.discovery().version(),
        ["metrics"] => (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/openmetrics-text; version=1.0.0; charset=utf-8"),
            )],
            state.metrics.encode(),
        )
            .into_response(),
        ["api"] => state.discovery().api(headers),
        ["apis"] => state.discovery().apis(headers),
        ["apis", group] => state.discovery().group(group, headers),
        ["apis", group, version] => state.discovery().group_version(group, version, headers),
        ["openapi", "v2"] => state.openapi().v2(headers),
        ["openapi", "v3"] => state.openapi().v3_root(headers),
        ["openapi", "v3", rest @ ..] => state
            .openapi()
            .v3_doc(&rest.join("/"), &parsed.query, headers)
            .unwrap_or_else(|| ApiError::PathNotFound.into_response()),
        _ => ApiError::PathNotFound.into_response(),
    }
}

fn text(status: StatusCode, body: impl Into<String>) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, HeaderValue::from_static("text/plain; charset=utf-8")),
            (header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff")),
        ],
        body.into(),
    )
        .into_response()
}

/// `/readyz` worded like kube's health checks: `ok`, or every check and a 500. `shutdown`
/// fails from SIGTERM on, while requests are still served.
fn readyz(state: &ApiState, query: &QueryParams) -> Response {
    let verbose = query.get("verbose").is_some();
    let checks = state.readiness_checks();
    let passed = checks.iter().all(|(_, ok)| *ok);
    if passed && !verbose {
        return text(StatusCode::OK, "ok");
    }
    let mut body = String::new();
    for (name, ok) in checks {
        if ok {
            body.push_str(&format!("[+]{name} ok\n"));
        } else {
            body.push_str(&format!("[-]{name} failed: reason withheld\n"));
        }
    }
    if passed {
        body.push_str("readyz check passed\n");
        text(StatusCode::OK, body)
    } else {
        body.push_str("readyz check failed\n");
        text(StatusCode::INTERNAL_SERVER_ERROR, body)
    }
}

/// `/readyz/<check>`: `ok`, or a 500 saying which check failed (kube's wording for one
/// check, the reason withheld); an unknown check is a 404.
fn readyz_check(state: &ApiState, name: &str) -> Response {
    match state.readiness_checks().into_iter().find(|(check, _)| *check == name) {
        Some((_, true)) => text(StatusCode::OK, "ok"),
        Some((check, false)) => text(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("internal server error: {check} failed: reason withheld\n"),
        ),
        None => ApiError::PathNotFound.into_response(),
    }
}

/// A resource request after its path has been checked against the kinds.
struct Target {
    kind: Arc<dyn ServedKind>,
    resource: GroupResource,
    /// Namespace from a `/namespaces/<ns>/` path.
    namespace: Option<String>,
    /// Name from the path.
    name: Option<String>,
}

async fn serve_resource(
    state: &ApiState,
    parts: &http::request::Parts,
    parsed: &ParsedRequest,
) -> Result<Response, ApiError> {
    let (method, headers) = (&parts.method, &parts.headers);
    let info = parsed.info.as_ref().ok_or(ApiError::PathNotFound)?;
    // Only HTTP/2 multiplexes: an HTTP/1.1 connection has one response at a time.
    let slots = parts.extensions.get::<ConnectionSlots>().filter(|_| parts.version == http::Version::HTTP_2);
    let target = resolve(state, info, &parsed.segs())?;

    match &*info.verb {
        "get" | "list" | "watch" => {}
        "proxy" => return Err(ApiError::PathNotFound),
        "" => {
            return Err(ApiError::MethodNotAllowed {
                verb: method.as_str().to_ascii_lowercase(),
                resource: target.resource,
            });
        }
        verb => {
            return Err(ApiError::MethodNotAllowed { verb: verb.to_owned(), resource: target.resource });
        }
    }

    if let Some(ns) = &target.namespace {
        valid("namespace", ns, is_dns1123_label(ns))?;
    }
    if let Some(name) = &target.name {
        valid("name", name, is_dns1123_subdomain(name))?;
    }
    if info.verb == "watch" {
        return Err(ApiError::MethodNotAllowed { verb: "watch".to_owned(), resource: target.resource });
    }

    let query = &parsed.query;
    for int_param in ["limit", "timeoutSeconds"] {
        if let Some(v) = query.get(int_param)
            && v.parse::<i64>().is_err()
        {
            return Err(ApiError::BadRequest(format!(
                "strconv.ParseInt: parsing {}: invalid syntax",
                k8s_wire::go_quote(v)
            )));
        }
    }
    let repr = negotiate_headers(headers, Endpoint::Resource)?;
    let include_object = match repr {
        Representation::Table { .. } => IncludeObject::parse(query.get("includeObject"))?,
        _ => IncludeObject::Metadata,
    };

    match &target.name {
        Some(name) => get_one(&target, name, repr, include_object, parts.version).await,
        None => list(&state.selections, &target, query, repr, include_object, parts.version, slots).await,
    }
}

/// `Ok` when `errs` (the validation messages of `value`, a path's `what`) is empty; else the
/// 400 kube-apiserver answers for it.
fn valid(what: &str, value: &str, errs: Vec<String>) -> Result<(), ApiError> {
    if errs.is_empty() {
        return Ok(());
    }
    Err(ApiError::BadRequest(format!("invalid {what} {}: {}", k8s_wire::go_quote(value), errs.join("; "))))
}

/// Maps the path to a served kind and checks the scope; anything else is a 404.
fn resolve(state: &ApiState, info: &RequestInfo, segments: &[&str]) -> Result<Target, ApiError> {
    if !info.is_resource_request || info.api_prefix != "apis" || !info.subresource.is_empty() {
        return Err(ApiError::PathNotFound);
    }
    let kind = state
        .kinds
        .current()
        .find(&info.api_group, &info.api_version, &info.resource)
        .ok_or(ApiError::PathNotFound)?
        .clone();
    let kind_info = kind.info();

    // Segments after /apis/<g>/<v>, without a `watch`/`proxy` prefix.
    let mut rest: &[&str] = segments.get(3..).unwrap_or_default();
    if rest.first().is_some_and(|s| *s == "watch" || *s == "proxy") {
        rest = &rest[1..];
    }
    let namespaced_path = rest.len() >= 3 && rest[0] == "namespaces";
    if namespaced_path != kind_info.namespaced && (namespaced_path || info.named_in_path) {
        // A namespaced path for a cluster-scoped kind, or a named get of a namespaced kind
        // without its namespace: kube registers neither route.
        return Err(ApiError::PathNotFound);
    }
    let resource = GroupResource::new(kind_info.gv.group, kind_info.plural.as_ref());
    let namespace = namespaced_path.then(|| info.namespace.clone());
    Ok(Target { kind, resource, namespace, name: info.named_in_path.then(|| info.name.clone()) })
}

async fn compute(kind: &Arc<dyn ServedKind>, namespace: Option<&str>) -> Result<Arc<Listing>, ApiError> {
    match AssertUnwindSafe(kind.list(namespace)).catch_unwind().await {
        Ok(Ok(listing)) => Ok(listing),
        Ok(Err(ComputeError::NotReady(message))) => Err(ApiError::ServiceUnavailable {
            message: message.into_owned(),
            retry_after: Some(NOT_READY_RETRY_AFTER_SECONDS),
        }),
        Ok(Err(ComputeError::Upstream(error))) => {
            Err(ApiError::Internal(format!("computing {}: {error}", kind.info().plural)))
        }
        Err(_) => Err(ApiError::Internal(format!("computing {} panicked", kind.info().plural))),
    }
}

async fn list(
    selections: &selections::SelectedLists,
    target: &Target,
    query: &QueryParams,
    repr: Representation,
    include_object: IncludeObject,
    version: http::Version,
    slots: Option<&ConnectionSlots>,
) -> Result<Response, ApiError> {
    let labels = match query.get("labelSelector") {
        Some(s) => LabelSelector::parse(s)?,
        None => LabelSelector::everything(),
    };
    let fields = match query.get("fieldSelector") {
        Some(s) => FieldSelector::parse_supported(s)?,
        None => FieldSelector::default(),
    };
    if let Representation::PartialObjectMetadata { .. } = repr {
        // Decided before computing anything: the answer can only be this 406.
        return Err(ApiError::NotAcceptable(
            "you requested PartialObjectMetadata, but the requested object is a list".to_owned(),
        ));
    }
    // A cluster-wide list pinned to one namespace by the field selector only computes that
    // namespace; the selector still filters below.
    let namespace = target.namespace.clone().or_else(|| {
        if !target.kind.info().namespaced {
            return None;
        }
        fields
            .requires_exact_match(FIELD_NAMESPACE)
            .filter(|ns| is_dns1123_label(ns).is_empty())
            .map(str::to_owned)
    });
    let listing = listing(target, namespace.as_deref(), version).await?;
    let ctx = render_context(target, &listing, include_object);
    if repr == Representation::Json && labels.is_empty() && fields.is_empty() {
        // The whole listing: rendered once per cache entry, then shared.
        if listing.rendered_list.get().is_none() {
            before_computing(version).await;
        }
        let body = render::list_json(&ctx, &listing);
        return Ok(json_response(render::list_body(body, slots).await, &listing.warnings));
    }
    // A selected JSON list is rendered once per listing and selectors (`selections`).
    let selection = (repr == Representation::Json).then(|| {
        let info = target.kind.info();
        selections::SelectionKey::new(
            info.gv.group,
            &info.plural,
            namespace.as_deref(),
            query.get("labelSelector").unwrap_or_default(),
            query.get("fieldSelector").unwrap_or_default(),
        )
    });
    if let Some(key) = &selection
        && let Some(body) = selections.get(key, &listing).await
    {
        return Ok(json_response(list_body(body, slots).await, &listing.warnings));
    }
    before_computing(version).await;
    let items: Vec<&Item> = listing
        .items
        .iter()
        .filter(|item| {
            namespace.as_deref().is_none_or(|ns| *item.meta.namespace == *ns)
                && labels.matches(&item.meta.labels)
                && fields.matches(&item.meta.name, &item.meta.namespace)
        })
        .collect();
    let body = Bytes::from(render_list(&ctx, &items, repr)?);
    if let Some(key) = selection {
        selections.insert(key, &listing, body.clone()).await;
    }
    Ok(json_response(list_body(body, slots).await, &listing.warnings))
}

/// A list body; on an HTTP/2 connection, one more than a frame long waits for a body slot of
/// the connection ([`fairness`]).
async fn list_body(bytes: Bytes, slots: Option<&ConnectionSlots>) -> Body {
    match slots {
        Some(slots) if bytes.len() > fairness::CHUNK => Body::new(slots.body(bytes).await),
        _ => Body::from(bytes),
    }
}

async fn get_one(
    target: &Target,
    name: &str,
    repr: Representation,
    include_object: IncludeObject,
    version: http::Version,
) -> Result<Response, ApiError> {
    if let Representation::PartialObjectMetadataList { .. } = repr {
        return Err(ApiError::NotAcceptable(
            "you requested PartialObjectMetadataList, but the requested object is not a list".to_owned(),
        ));
    }
    let listing = listing(target, target.namespace.as_deref(), version).await?;
    let namespace = target.namespace.as_deref().unwrap_or_default();
    let wanted = |i: &&Item| *i.meta.name == *name && *i.meta.namespace == *namespace;
    // Listings are sorted by namespace then name; the scan only runs when the search misses.
    let item = listing
        .items
        .binary_search_by(|i| (&*i.meta.namespace, &*i.meta.name).cmp(&(namespace, name)))
        .ok()
        .and_then(|at| listing.items.get(at))
        .or_else(|| listing.items.iter().find(wanted))
        .ok_or_else(|| ApiError::NotFound { resource: target.resource.clone(), name: name.to_owned() })?;
    let ctx = render_context(target, &listing, include_object);
    let body = render_object(&ctx, item, repr)?;
    Ok(json_response(body, &listing.warnings))
}

fn render_context<'a>(
    target: &'a Target,
    listing: &'a Listing,
    include_object: IncludeObject,
) -> RenderContext<'a> {
    RenderContext {
        info: target.kind.info(),
        columns: target.kind.columns(),
        resource_version: &listing.resource_version,
        include_object,
        now: jiff::Timestamp::now(),
    }
}

fn json_response(body: impl Into<Body>, warnings: &[String]) -> Response {
    let mut response =
        ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body.into()).into_response();
    let mut seen: Vec<&str> = Vec::new();
    for w in warnings {
        if seen.contains(&w.as_str()) {
            continue;
        }
        seen.push(w);
        if let Some(v) = warning_header(w) {
            response.headers_mut().append(header::WARNING, v);
        }
    }
    response
}

/// `Warning: 299 - "<text>"` (quotes and backslashes escaped, control characters blanked).
pub(crate) fn warning_header(text: &str) -> Option<HeaderValue> {
    let mut value = String::with_capacity(text.len() + 9);
    value.push_str("299 - \"");
    for c in text.chars() {
        match c {
            '"' | '\\' => {
                value.push('\\');
                value.push(c);
            }
            c if c.is_control() => value.push(' '),
            c => value.push(c),
        }
    }
    value.push('"');
    HeaderValue::from_bytes(value.as_bytes()).ok()
}

#[cfg(test)]
mod tests;
