//! percolator: a read-only Kubernetes aggregated API server that computes live pod and cafe
//! metrics at request time from kubelets and Prometheus.
//!
//! The binary is thin; everything lives here so tests can reach it:
//! [`config`] (flags and the query file), [`tls`] (serving certificates), [`inventory`] (pods and
//! nodes from the cluster), [`sources`] (kubelets, Prometheus), [`resources`] (the served
//! kinds), [`external`] (the opt-in `external.metrics.k8s.io` API for the HPA), [`cache`]
//! (TTL + single-flight), [`api`] (the HTTP surface), [`telemetry`] (own metrics and logs),
//! [`server`] (wiring and serving), [`sim`] (the simulated cluster used by the demo, the tests
//! and the benchmarks) and [`devenv`] (the local Prometheus they run).

pub mod api;
pub mod auth;
pub mod cache;
pub mod config;
pub mod demo;
pub mod devenv;
pub mod duration;
pub mod external;
pub mod inventory;
pub mod quantity;
pub mod resources;
pub mod server;
pub mod sim;
pub mod sources;
pub mod telemetry;
pub mod tls;

pub use server::run;

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
