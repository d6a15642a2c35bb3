//! percolator: a read-only Kubernetes aggregated API server that computes live pod and cafe
//! metrics at request time from kubelets and Prometheus.
//!
//! This crate is the top of the workspace's layers (`docs/architecture.md` is the map): what
//! percolator serves and from where. Below it, the `apiserver` crate (the library of
//! aggregated API servers: serving, the request chain, the kind abstraction, discovery,
//! OpenAPI, rendering, auth, caches, telemetry) and the `k8s-wire` crate (wire types); the
//! simulated cluster, the demo and the test machinery are the `percolator-sim` crate's. Its
//! modules, private but for [`config`], top to bottom (a module imports only from its own
//! layer or below; `tests/architecture.rs` checks it):
//!
//! - `server`: the composition root (sources, kinds, APIs, auth, TLS) and serving;
//! - `telemetry`: the names of percolator's own metrics and files;
//! - `metrics`: the opt-in `external.metrics.k8s.io` and `custom.metrics.k8s.io` APIs for
//!   the HPA, over one core;
//! - `kinds`: the served kinds, one unit each, and their registry;
//! - `adapter`: prometheus-adapter configuration files;
//! - `sources`: the upstreams (inventory, kubelets, Prometheus) behind narrow traits;
//! - [`config`]: flags and the query file.

mod adapter;
pub mod config;
mod kinds;
mod metrics;
mod server;
mod sources;
mod telemetry;

// The modules are private. The crate's API is what the `percolator` binary and the
// `percolator-sim` crate use: the flags and the query file ([`config`]), running the server
// ([`run`], or [`prepare`] then serving), the start-up check of a configuration
// ([`config_check`]), the shutdown signal, and the kubelet's resource metrics parser (the
// simulator's faults check what it serves with it). What only tests and benchmarks reach is in
// [`testing`].
pub use apiserver::shutdown_signal;
pub use server::{config_check, prepare, run};
pub use sources::kubelet::{NodeSamples, parse_resource_metrics};
pub use telemetry::{ADAPTER_CONFIG_FILE, CONFIG_FILE};

/// The namespace of the metrics percolator exports (`percolator_requests_total`, …), which the
/// dashboards and alert rules name: `apiserver::Metrics::new` takes it from here.
pub const METRICS_NAMESPACE: &str = "percolator";

/// Internals reached by the integration tests, the fuzz targets and the benchmarks, not an API:
/// a kind served through the real router (`e2e_lifecycle`), the PromQL template functions and
/// selector mapping (`fuzz`), the built-in kinds and default metrics a chart or a manifest
/// must agree with (`deploy`, `chart`).
#[doc(hidden)]
pub mod testing {
    pub use crate::adapter::AdapterConfig;
    pub use crate::kinds::STATS;
    pub use crate::kinds::declared::DeclaredSpec;
    pub use crate::kinds::registry::BUILTIN;
    pub use crate::metrics::custom::default_metrics as default_custom_metrics;
    pub use crate::metrics::external::{default_metrics as default_external_metrics, selector_matchers};
    pub use crate::server::serve;
    pub use crate::sources::prometheus::{
        MatchOp, Matcher, Template, keeps_label, validate_template, validate_unscoped_template,
    };
    pub use apiserver::kind::{Column, ComputeError, KindInfo, Kinds, Listing, ServedKind, Text, Texts};
    pub use apiserver::{ApiState, router};
}
