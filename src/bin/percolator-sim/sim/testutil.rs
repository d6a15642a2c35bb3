//! Fixtures shared by the simulator's unit tests: the default cluster and the router states
//! over it.

use std::sync::Arc;

use super::SimConfig;
use super::api::ApiState;
use super::apps::{AppState, EXPORTERS};
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

/// A metrics/control state over the default cluster with every exporter.
pub(crate) fn app_state() -> AppState {
    AppState {
        cluster: Arc::new(cluster(&params())),
        exporters: EXPORTERS,
        instance: "127.0.0.1:9999".into(),
    }
}
