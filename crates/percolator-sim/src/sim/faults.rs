//! Fault injection for the reliability tests (issue 8), switchable at runtime through the
//! control port: `POST /sim/faults` sets faults, `GET /sim/faults` reads them.
//!
//! ```json
//! {"kubelet": {"node-0": "hang", "*": "ok"}, "watch": "gone-once"}
//! ```
//!
//! Kubelet faults, per node (`"*"` is every node, applied before the named ones):
//! - `ok`: normal answers;
//! - `hang`: the request is read and never answered;
//! - `stall`: status, headers and the first KiB of the body, then nothing;
//! - `reset`: new connections are reset (TCP RST) before the TLS handshake;
//! - `truncate`: a `Content-Length` for the whole body, half of it, then the stream is aborted;
//! - `huge`: the body followed by 10 MiB of extra container series (a node
//!   with tens of thousands of containers), streamed without a `Content-Length`;
//! - `old-format`: the body of an older kubelet: `[ALPHA]` help texts, `scrape_error` instead of
//!   `resource_scrape_error`, no sample timestamps, no start times and no `pod_*` series;
//! - `error500`: `500 Internal Server Error`.
//!
//! Changing a node's fault closes its open connections, so a client's pooled connection meets
//! the new fault on its next request.
//!
//! Watch faults are one-shot actions (the state reads `ok` again afterwards):
//! - `drop`: every open watch is aborted mid-stream (the body ends with an error, as when a
//!   connection breaks); clients re-watch from their last resourceVersion;
//! - `gone-once`: like `drop`, and the next watch of each kind (pods, nodes, config maps) that
//!   resumes from a resourceVersion gets a `410 Expired` ERROR event, so clients re-list.
//!
//! `GET` also reports how many watches were dropped and how many 410s were sent.
//!
//! The Kubernetes API itself (an outage of kube-apiserver, issue 33):
//! - `{"api": "down"}`: every open connection of the API listener is aborted (watches end
//!   mid-stream, requests in flight get no answer) and every new one is reset (TCP RST) before
//!   the TLS handshake, so clients see the API unreachable (TokenReview, SubjectAccessReview,
//!   lists and watches alike);
//! - `{"api": "up"}`: new connections are served again.
//!
//! `GET` reports the state (`"api": "up"`) and how many connections were reset while down
//! (`apiConnectionsReset`).
//!
//! Delegated reviews (issue 53), answered by [`super::reviews`]:
//! - `{"reviews": "too-many-requests"}`: every TokenReview and SubjectAccessReview is answered
//!   `429 TooManyRequests` with `Retry-After: 1` (kube-apiserver's priority and fairness
//!   pushing back), still counted in `/sim/stats`;
//! - `{"reviews": "ok"}`: answered again.
//!
//! Grants (`/sim/grants`, for revocation tests): `POST {"revoke": ["carol"], "restore": ["dora"]}`
//! takes every permission away from the named users (every SubjectAccessReview of theirs is
//! denied, whatever their groups, as if their bindings were deleted) or gives them back;
//! `GET` (and the `POST`) answers `{"revoked": [...]}`. It is served by the control listener,
//! so it works while the API is down.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::StatusCode;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use super::cluster::Cluster;

/// Extra bytes a `huge` kubelet body carries.
pub(crate) const HUGE_PADDING_BYTES: usize = 10 * 1024 * 1024;

/// What a simulated kubelet does with `GET /metrics/resource`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum KubeletFault {
    /// Normal answers.
    #[default]
    Ok,
    /// Never answers.
    Hang,
    /// Headers and the first bytes of the body, then nothing.
    Stall,
    /// Connections reset before the TLS handshake.
    Reset,
    /// Half of the declared body, then an aborted stream.
    Truncate,
    /// About 10 MB of body.
    Huge,
    /// An older kubelet's body (no timestamps, `scrape_error`).
    OldFormat,
    /// `500 Internal Server Error`.
    Error500,
}

/// A one-shot action on the Kubernetes watches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum WatchFault {
    /// Nothing.
    Ok,
    /// Abort every open watch.
    Drop,
    /// Abort every open watch and answer the next resuming watch of each kind with 410.
    GoneOnce,
}

/// Whether the simulated kube-apiserver can be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum ApiFault {
    /// Served normally.
    #[default]
    Up,
    /// Open connections aborted, new ones reset.
    Down,
}

/// How the simulated kube-apiserver answers reviews.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(super) enum ReviewFault {
    /// Answered from the policy.
    #[default]
    Ok,
    /// `429 TooManyRequests`, `Retry-After: 1`.
    TooManyRequests,
}

/// Kinds whose next resuming watch `gone-once` expires (`WatchKind::kind` names).
const WATCHED_KINDS: [&str; 3] = ["Pod", "Node", "ConfigMap"];

/// The fault state of the simulator.
pub(crate) struct Faults {
    kubelets: Vec<watch::Sender<KubeletFault>>,
    drops: watch::Sender<u64>,
    gone: Mutex<BTreeSet<&'static str>>,
    dropped: AtomicU64,
    expired: AtomicU64,
    api: watch::Sender<ApiFault>,
    api_resets: AtomicU64,
    reviews: Mutex<ReviewFault>,
    revoked: Mutex<BTreeSet<String>>,
}

impl Faults {
    /// No faults, for `nodes` kubelets.
    pub(crate) fn new(nodes: usize) -> Self {
        Self {
            kubelets: (0..nodes).map(|_| watch::Sender::new(KubeletFault::Ok)).collect(),
            drops: watch::Sender::new(0),
            gone: Mutex::new(BTreeSet::new()),
            dropped: AtomicU64::new(0),
            expired: AtomicU64::new(0),
            api: watch::Sender::new(ApiFault::Up),
            api_resets: AtomicU64::new(0),
            reviews: Mutex::new(ReviewFault::Ok),
            revoked: Mutex::new(BTreeSet::new()),
        }
    }

    /// How reviews are answered now.
    pub(crate) fn reviews(&self) -> ReviewFault {
        self.reviews.lock().map_or(ReviewFault::Ok, |r| *r)
    }

    /// Whether every permission of `user` is revoked.
    pub(crate) fn is_revoked(&self, user: &str) -> bool {
        self.revoked.lock().is_ok_and(|revoked| revoked.contains(user))
    }

    /// Sets the review fault and the revoked users at once (tests of the review endpoints).
    #[cfg(test)]
    pub(crate) fn set_reviews_for_tests(&self, fault: ReviewFault, revoked: &[&str]) {
        if let Ok(mut current) = self.reviews.lock() {
            *current = fault;
        }
        if let Ok(mut current) = self.revoked.lock() {
            *current = revoked.iter().map(|u| (*u).to_owned()).collect();
        }
    }

    /// The users whose permissions are revoked.
    fn revoked(&self) -> Vec<String> {
        self.revoked.lock().map(|r| r.iter().cloned().collect()).unwrap_or_default()
    }

    /// The current fault of node `index`'s kubelet.
    pub(crate) fn kubelet(&self, index: u32) -> KubeletFault {
        self.kubelets.get(index as usize).map_or(KubeletFault::Ok, |s| *s.borrow())
    }

    /// Changes of node `index`'s fault, from now on.
    pub(crate) fn kubelet_changes(&self, index: u32) -> Option<watch::Receiver<KubeletFault>> {
        self.kubelets.get(index as usize).map(watch::Sender::subscribe)
    }

    /// Sets node `index`'s fault; subscribers hear of it only when it changes.
    pub(crate) fn set_kubelet(&self, index: u32, fault: KubeletFault) {
        if let Some(sender) = self.kubelets.get(index as usize) {
            sender.send_if_modified(|current| {
                let changed = *current != fault;
                *current = fault;
                changed
            });
        }
    }

    /// The API's current state.
    pub(crate) fn api(&self) -> ApiFault {
        *self.api.borrow()
    }

    /// Changes of the API's state, from now on.
    pub(crate) fn api_changes(&self) -> watch::Receiver<ApiFault> {
        self.api.subscribe()
    }

    /// Sets the API's state; subscribers hear of it only when it changes.
    pub(crate) fn set_api(&self, fault: ApiFault) {
        self.api.send_if_modified(|current| {
            let changed = *current != fault;
            *current = fault;
            changed
        });
    }

    /// Counts one API connection reset while the API is down.
    pub(crate) fn count_api_reset(&self) {
        self.api_resets.fetch_add(1, Ordering::Relaxed);
    }

    /// A signal that changes whenever open watches must be aborted.
    pub(crate) fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drops.subscribe()
    }

    /// Applies a watch action.
    pub(crate) fn apply_watch(&self, fault: WatchFault) {
        match fault {
            WatchFault::Ok => {}
            WatchFault::Drop => {
                self.drops.send_modify(|generation| *generation += 1);
            }
            WatchFault::GoneOnce => {
                if let Ok(mut gone) = self.gone.lock() {
                    gone.extend(WATCHED_KINDS);
                }
                self.drops.send_modify(|generation| *generation += 1);
            }
        }
    }

    /// Whether the next resuming watch of `kind` must be expired (and disarms it).
    pub(crate) fn take_gone(&self, kind: &str) -> bool {
        let taken = self.gone.lock().is_ok_and(|mut gone| gone.remove(kind));
        if taken {
            self.expired.fetch_add(1, Ordering::Relaxed);
        }
        taken
    }

    /// Counts one watch aborted by `drop` or `gone-once`.
    pub(crate) fn count_dropped(&self) {
        self.dropped.fetch_add(1, Ordering::Relaxed);
    }

    fn state(&self, cluster: &Cluster) -> serde_json::Value {
        let kubelet: BTreeMap<&str, KubeletFault> =
            cluster.nodes.iter().map(|n| (n.name.as_str(), self.kubelet(n.index))).collect();
        serde_json::json!({
            "kubelet": kubelet,
            "watch": "ok",
            "watchDropped": self.dropped.load(Ordering::Relaxed),
            "watchExpired": self.expired.load(Ordering::Relaxed),
            "api": self.api(),
            "apiConnectionsReset": self.api_resets.load(Ordering::Relaxed),
            "reviews": self.reviews(),
        })
    }
}

/// The padding of a `huge` body: container series of fake pods, built once.
pub(crate) fn huge_padding() -> Bytes {
    static PADDING: OnceLock<Bytes> = OnceLock::new();
    PADDING
        .get_or_init(|| {
            let mut out = String::with_capacity(HUGE_PADDING_BYTES + 256);
            let mut i = 0u64;
            while out.len() < HUGE_PADDING_BYTES {
                use std::fmt::Write as _;
                let _ = writeln!(
                    out,
                    "container_cpu_usage_seconds_total{{container=\"c\",namespace=\"padding\",pod=\"pad-{i}\"}} 1.5"
                );
                let _ = writeln!(
                    out,
                    "container_memory_working_set_bytes{{container=\"c\",namespace=\"padding\",pod=\"pad-{i}\"}} 1048576"
                );
                i += 1;
            }
            Bytes::from(out)
        })
        .clone()
}

/// What `POST /sim/faults` accepts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct FaultRequest {
    #[serde(default)]
    kubelet: BTreeMap<String, KubeletFault>,
    #[serde(default)]
    watch: Option<WatchFault>,
    #[serde(default)]
    api: Option<ApiFault>,
    #[serde(default)]
    reviews: Option<ReviewFault>,
}

/// What `POST /sim/grants` accepts.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsRequest {
    #[serde(default)]
    revoke: Vec<String>,
    #[serde(default)]
    restore: Vec<String>,
}

/// The `/sim/faults` and `/sim/grants` endpoints.
pub(crate) fn control_router(cluster: Arc<Cluster>) -> axum::Router {
    axum::Router::new()
        .route("/sim/faults", axum::routing::get(get_faults).post(set_faults))
        .route("/sim/grants", axum::routing::get(get_grants).post(set_grants))
        .with_state(cluster)
}

async fn get_grants(State(cluster): State<Arc<Cluster>>) -> Response {
    Json(serde_json::json!({ "revoked": cluster.faults.revoked() })).into_response()
}

async fn set_grants(State(cluster): State<Arc<Cluster>>, body: Bytes) -> Response {
    let request: GrantsRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("invalid grants request: {e}")),
    };
    if let Some(name) = request.revoke.iter().chain(&request.restore).find(|n| n.is_empty()) {
        return bad_request(format!("a user name must not be empty (got {name:?})"));
    }
    if let Ok(mut revoked) = cluster.faults.revoked.lock() {
        revoked.extend(request.revoke.iter().cloned());
        for name in &request.restore {
            revoked.remove(name);
        }
    }
    tracing::info!(revoke = ?request.revoke, restore = ?request.restore, "grants changed");
    get_grants(State(cluster)).await
}

async fn get_faults(State(cluster): State<Arc<Cluster>>) -> Response {
    Json(cluster.faults.state(&cluster)).into_response()
}

fn bad_request(message: String) -> Response {
    (StatusCode::BAD_REQUEST, Json(serde_json::json!({ "error": message }))).into_response()
}

async fn set_faults(State(cluster): State<Arc<Cluster>>, body: Bytes) -> Response {
    let request: FaultRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return bad_request(format!("invalid fault request: {e}")),
    };
    // Validate everything before changing anything.
    let mut named = Vec::new();
    for (node, fault) in &request.kubelet {
        if node == "*" {
            continue;
        }
        match cluster.node_by_name(node) {
            Some(n) => named.push((n.index, *fault)),
            None => return bad_request(format!("no node named {node:?}")),
        }
    }
    if let Some(all) = request.kubelet.get("*") {
        for node in &cluster.nodes {
            cluster.faults.set_kubelet(node.index, *all);
        }
    }
    for (index, fault) in named {
        cluster.faults.set_kubelet(index, fault);
    }
    if let Some(watch) = request.watch {
        cluster.faults.apply_watch(watch);
    }
    if let Some(api) = request.api {
        cluster.faults.set_api(api);
    }
    if let Some(reviews) = request.reviews
        && let Ok(mut current) = cluster.faults.reviews.lock()
    {
        *current = reviews;
    }
    tracing::info!(kubelet = ?request.kubelet, watch = ?request.watch, api = ?request.api, reviews = ?request.reviews, "faults set");
    Json(cluster.faults.state(&cluster)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::testutil::cluster_without_cafes;
    use axum::body::{Body, to_bytes};
    use tower::ServiceExt as _;

    async fn call(router: &axum::Router, method: &str, body: &str) -> (StatusCode, serde_json::Value) {
        call_at(router, method, "/sim/faults", body).await
    }

    #[tokio::test]
    async fn faults_are_set_validated_and_reported() {
        let cluster = Arc::new(cluster_without_cafes());
        let router = control_router(Arc::clone(&cluster));
        let (status, state) = call(&router, "GET", "").await;
        assert_eq!(status, StatusCode::OK);
        assert_eq!(state["kubelet"]["node-0"], "ok");
        assert_eq!(state["watch"], "ok");

        let mut changes = cluster.faults.kubelet_changes(1).unwrap();
        let (status, state) =
            call(&router, "POST", r#"{"kubelet": {"*": "hang", "node-1": "old-format"}}"#).await;
        assert_eq!(status, StatusCode::OK, "{state}");
        assert_eq!(state["kubelet"]["node-0"], "hang");
        assert_eq!(state["kubelet"]["node-1"], "old-format");
        assert_eq!(state["kubelet"]["node-2"], "hang");
        assert!(changes.has_changed().unwrap());
        changes.borrow_and_update();
        // Setting the same fault again is not a change (connections stay open).
        call(&router, "POST", r#"{"kubelet": {"node-1": "old-format"}}"#).await;
        assert!(!changes.has_changed().unwrap());

        for bad in [
            r#"{"kubelet": {"node-9": "hang"}}"#,
            r#"{"kubelet": {"node-0": "sleepy"}}"#,
            r#"{"watch": "maybe"}"#,
            r#"{"api": "sideways"}"#,
            r#"{"nodes": {}}"#,
            "not json",
        ] {
            let (status, body) = call(&router, "POST", bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }
        // A rejected request changes nothing.
        assert_eq!(cluster.faults.kubelet(0), KubeletFault::Hang);

        let mut drops = cluster.faults.watch_drops();
        let (status, _) = call(&router, "POST", r#"{"watch": "gone-once"}"#).await;
        assert_eq!(status, StatusCode::OK);
        assert!(drops.has_changed().unwrap());
        drops.borrow_and_update();
        assert!(cluster.faults.take_gone("Pod"));
        assert!(!cluster.faults.take_gone("Pod"));
        call(&router, "POST", r#"{"watch": "drop"}"#).await;
        assert!(drops.has_changed().unwrap());
        assert!(!cluster.faults.take_gone("Pod"));
        let (_, state) = call(&router, "GET", "").await;
        assert_eq!(state["watchExpired"], 1);
        assert_eq!(state["api"], "up");

        let mut api = cluster.faults.api_changes();
        let (status, state) = call(&router, "POST", r#"{"api": "down"}"#).await;
        assert_eq!(status, StatusCode::OK, "{state}");
        assert_eq!(state["api"], "down");
        assert_eq!(cluster.faults.api(), ApiFault::Down);
        assert!(api.has_changed().unwrap());
        api.borrow_and_update();
        // Down again is no change; up is.
        call(&router, "POST", r#"{"api": "down"}"#).await;
        assert!(!api.has_changed().unwrap());
        let (_, state) = call(&router, "POST", r#"{"api": "up"}"#).await;
        assert_eq!(state["api"], "up");
        assert!(api.has_changed().unwrap());
        assert_eq!(*api.borrow_and_update(), ApiFault::Up);
    }

    async fn call_at(
        router: &axum::Router,
        method: &str,
        uri: &str,
        body: &str,
    ) -> (StatusCode, serde_json::Value) {
        let request = http::Request::builder()
            .method(method)
            .uri(uri)
            .header("content-type", "application/json")
            .body(Body::from(body.to_owned()))
            .unwrap();
        let response = router.clone().oneshot(request).await.unwrap();
        let status = response.status();
        let bytes = to_bytes(response.into_body(), usize::MAX).await.unwrap();
        (status, serde_json::from_slice(&bytes).unwrap())
    }

    #[tokio::test]
    async fn review_faults_and_grants_are_set_validated_and_reported() {
        let cluster = Arc::new(cluster_without_cafes());
        let router = control_router(Arc::clone(&cluster));
        let (_, state) = call(&router, "GET", "").await;
        assert_eq!(state["reviews"], "ok");
        let (status, state) = call(&router, "POST", r#"{"reviews": "too-many-requests"}"#).await;
        assert_eq!((status, &state["reviews"]), (StatusCode::OK, &serde_json::json!("too-many-requests")));
        assert_eq!(cluster.faults.reviews(), ReviewFault::TooManyRequests);
        let (status, _) = call(&router, "POST", r#"{"reviews": "sometimes"}"#).await;
        assert_eq!(status, StatusCode::BAD_REQUEST);
        call(&router, "POST", r#"{"reviews": "ok"}"#).await;
        assert_eq!(cluster.faults.reviews(), ReviewFault::Ok);

        let (status, body) = call_at(&router, "GET", "/sim/grants", "").await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!({"revoked": []})));
        let (status, body) =
            call_at(&router, "POST", "/sim/grants", r#"{"revoke": ["carol", "dora"]}"#).await;
        assert_eq!((status, body), (StatusCode::OK, serde_json::json!({"revoked": ["carol", "dora"]})));
        assert!(cluster.faults.is_revoked("carol") && !cluster.faults.is_revoked("alice"));
        let (_, body) = call_at(&router, "POST", "/sim/grants", r#"{"restore": ["carol"]}"#).await;
        assert_eq!(body, serde_json::json!({"revoked": ["dora"]}));
        for bad in [r#"{"revoke": [""]}"#, r#"{"grant": ["x"]}"#, r#"{"revoke": "carol"}"#, "no"] {
            let (status, body) = call_at(&router, "POST", "/sim/grants", bad).await;
            assert_eq!(status, StatusCode::BAD_REQUEST, "{bad}: {body}");
        }
        assert_eq!(cluster.faults.revoked(), ["dora"]);
    }

    #[test]
    fn huge_padding_is_ten_megabytes_of_parsable_series() {
        let padding = huge_padding();
        assert!(padding.len() >= HUGE_PADDING_BYTES && padding.len() < HUGE_PADDING_BYTES + 1024);
        let text = std::str::from_utf8(&padding).unwrap();
        assert!(text.ends_with('\n'));
        let batch = percolator::parse_resource_metrics(text, jiff::Timestamp::UNIX_EPOCH).unwrap();
        assert!(batch.containers.len() > 50_000);
        assert_eq!(batch.malformed_lines, 0);
    }
}
