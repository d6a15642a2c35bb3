//! Fixtures shared by the simulator's unit tests: the default cluster, the router states
//! over it, and requests to the metrics/control router.

use std::sync::Arc;

use axum::body::{Body, to_bytes};
use http::StatusCode;
use tower::ServiceExt as _;

use super::SimConfig;
use super::api::ApiState;
use super::apps::{AppState, EXPORTERS, EXPORTERS_WITH_CADVISOR, router};
use super::cluster::Cluster;
use super::policy::Policy;
use super::workload::{ORIGIN_OFFSET_SECONDS, Workload, WorkloadParams};

/// When the fixtures' simulator started (unix seconds).
pub(crate) const START: i64 = 1_764_000_000;

/// The workload of the default configuration: seed 1, 3 nodes × 4 pods over `shop`, `api`
/// and `default`, 2 cafes per namespace.
pub(crate) fn params() -> WorkloadParams {
    SimConfig::with_state_dir("").workload_params()
}

/// The cluster of `params`, generated at [`START`] (counters from an hour before), with 10 s
/// housekeeping and kubelets on port 10250.
pub(crate) fn cluster(params: &WorkloadParams) -> Cluster {
    let workload = Workload::generate(params, START);
    Cluster::new(workload, params.seed, (START - ORIGIN_OFFSET_SECONDS) as f64, 10_000, 10250)
}

/// The default cluster without cafes: 12 pods.
pub(crate) fn cluster_without_cafes() -> Cluster {
    cluster(&WorkloadParams { cafes_per_namespace: 0, ..params() })
}

/// An API state over the default cluster, the built-in policy and no trust ConfigMap.
pub(crate) fn api_state() -> ApiState {
    ApiState {
        cluster: Arc::new(cluster(&params())),
        address: "127.0.0.1:6443".into(),
        policy: Arc::new(Policy::builtin()),
    }
}

/// A metrics/control state over the default cluster with the default exporters (no
/// cAdvisor series).
pub(crate) fn app_state() -> AppState {
    AppState {
        cluster: Arc::new(cluster(&params())),
        exporters: EXPORTERS,
        instance: "127.0.0.1:9999".into(),
    }
}

/// [`app_state`] with the cAdvisor series too (`--cadvisor`).
pub(crate) fn app_state_with_cadvisor() -> AppState {
    AppState { exporters: EXPORTERS_WITH_CADVISOR, ..app_state() }
}

/// `GET uri` from the metrics/control router over `state`: the status and the body.
pub(crate) async fn get_text(state: &AppState, uri: &str) -> (StatusCode, String) {
    let response =
        router(state.clone()).oneshot(http::Request::get(uri).body(Body::empty()).unwrap()).await.unwrap();
    let status = response.status();
    let body = to_bytes(response.into_body(), usize::MAX).await.unwrap();
    (status, String::from_utf8(body.to_vec()).unwrap())
}

/// Builds TSDB blocks from an hour of `state`'s `/sim/history` with promtool (which must
/// accept it) and returns their `promtool tsdb dump`; `None` without promtool.
pub(crate) async fn promtool_dump(state: &AppState, tag: &str) -> Option<String> {
    let promtool = std::path::Path::new("/usr/bin/promtool");
    if !promtool.exists() {
        eprintln!("skipped: no {}", promtool.display());
        return None;
    }
    let origin = state.cluster.origin;
    let (status, body) =
        get_text(state, &format!("/sim/history?start={}&end={}&step=15", origin + 60.0, origin + 3600.0))
            .await;
    assert_eq!(status, StatusCode::OK);
    let dir = std::env::temp_dir().join(format!("percolator-sim-promtool-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("history.om");
    std::fs::write(&file, body).unwrap();
    let out = std::process::Command::new(promtool)
        .args(["tsdb", "create-blocks-from", "openmetrics"])
        .arg(&file)
        .arg(dir.join("tsdb"))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    // `dump` opens the directory as a TSDB, which needs a WAL directory.
    std::fs::create_dir_all(dir.join("tsdb").join("wal")).unwrap();
    let dump =
        std::process::Command::new(promtool).args(["tsdb", "dump"]).arg(dir.join("tsdb")).output().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(dump.status.success(), "{}", String::from_utf8_lossy(&dump.stderr));
    Some(String::from_utf8_lossy(&dump.stdout).into_owned())
}
