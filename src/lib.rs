//! percolator: a read-only Kubernetes aggregated API server that computes live pod and cafe
//! metrics at request time from kubelets and Prometheus.
//!
//! The binary is thin; everything lives here so tests can reach it. Modules by layer, top to
//! bottom (a module imports only from its own layer or below; `tests/architecture.rs` checks
//! it, `docs/architecture.md` is the map):
//!
//! - [`server`]: wiring (sources, kinds, APIs, auth, TLS) and serving;
//! - [`api`] (routing, negotiation, discovery, OpenAPI, rendering) and [`auth`] (delegated
//!   authentication and authorization);
//! - [`external`] and [`custom`]: the opt-in `external.metrics.k8s.io` and
//!   `custom.metrics.k8s.io` APIs for the HPA;
//! - [`kinds`]: the served kinds, one unit each, and their registry;
//! - [`adapter`]: prometheus-adapter configuration files: format, checks, discovery, naming and
//!   query building (pure);
//! - [`cache`]: TTL + single flight, generic over what it caches;
//! - [`sources`]: the upstreams (inventory, kubelets, Prometheus) behind narrow traits;
//! - [`config`] (flags and the query file), [`tls`] (serving certificates), [`telemetry`]
//!   (own metrics and logs);
//! - [`k8s`]: Kubernetes wire types (Status errors, RequestInfo, selectors, names, Quantity,
//!   durations).
//!
//! The simulated cluster, the demo and the local Prometheus helper live with the
//! `percolator-sim` binary (`src/bin/percolator-sim/`), not here.

pub mod adapter;
pub mod api;
pub mod auth;
pub mod cache;
pub mod config;
pub mod custom;
pub mod external;
pub mod k8s;
pub mod kinds;
pub mod server;
pub mod sources;
pub mod telemetry;
pub mod tls;

#[cfg(test)]
pub(crate) mod testutil;

pub use server::run;

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
