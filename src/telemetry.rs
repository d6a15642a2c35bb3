//! The names of percolator's own metrics beyond the generic server's: the configuration files
//! a reload reads (the `file` label of `percolator_config_*`), the kubelet connections kept
//! for reuse, and the memory limit of the cgroup percolator runs in. [`register`] adds them to
//! the registry `apiserver::Metrics` builds.

use std::sync::Arc;

use apiserver::{Metrics, Probe, ProbeSum};

/// `file` of the `--config` file's reloads.
pub const CONFIG_FILE: &str = "config";
/// `file` of the `--adapter-config` file's reloads.
pub const ADAPTER_CONFIG_FILE: &str = "adapter-config";

/// Registers percolator's own families in `metrics`: the kubelet connections parked (0 until a
/// kubelet client counts some) and the memory limit; and marks `--config` as read, since it
/// always is (its compiled-in defaults at least): `--adapter-config`'s series appears when that
/// file is given.
pub(crate) fn register(metrics: &Metrics) {
    kubelet_parked(metrics);
    metrics.register_collector(Box::new(apiserver::MemoryLimit {
        help: "Memory limit of the cgroup percolator runs in (its container's limit); absent when unlimited.",
    }));
    metrics.config_loaded(CONFIG_FILE);
}

/// The gauge of idle kubelet connections kept for reuse, which the kubelet transports' pools
/// report to while they live ([`ProbeSum::add`]).
pub(crate) fn kubelet_parked(metrics: &Metrics) -> ProbeSum {
    metrics.probe_sum(
        "kubelet_connections_parked",
        "Idle kubelet connections kept for reuse (--kubelet-reuse-connections)",
    )
}

/// Counts the parked connections `probe` reports while it lives.
pub(crate) fn count_parked(metrics: &Metrics, probe: &Arc<Probe>) {
    kubelet_parked(metrics).add(probe);
}
