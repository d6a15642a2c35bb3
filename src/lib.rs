//! percolator: a read-only Kubernetes aggregated API server that computes live pod and cafe
//! metrics at request time from kubelets and Prometheus.
//!
//! This crate is the top of the workspace's layers (`docs/architecture.md` is the map): what
//! percolator serves and from where. Below it, the `apiserver` crate (TLS, delegated auth,
//! request limits, caches, telemetry) and the `k8s-wire` crate (Kubernetes wire types); the
//! simulated cluster, the demo and the test machinery are the `percolator-sim` crate's. Its
//! modules, top to bottom (a module imports only from its own layer or below;
//! `tests/architecture.rs` checks it):
//!
//! - [`server`]: wiring (sources, kinds, APIs, auth, TLS) and serving;
//! - [`api`]: routing, discovery, OpenAPI and rendering of the served kinds and groups;
//! - [`metrics`]: the opt-in `external.metrics.k8s.io` and `custom.metrics.k8s.io` APIs for
//!   the HPA, over one core;
//! - [`kinds`]: the served kinds, one unit each, and their registry;
//! - [`adapter`]: prometheus-adapter configuration files;
//! - [`sources`]: the upstreams (inventory, kubelets, Prometheus) behind narrow traits;
//! - [`config`]: flags and the query file.

pub mod adapter;
pub mod api;
pub mod config;
pub mod kinds;
pub mod metrics;
pub mod server;
pub mod sources;

pub use server::run;
