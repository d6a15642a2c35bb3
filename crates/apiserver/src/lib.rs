//! What a Kubernetes aggregated API server needs whatever it serves, as k8s.io/apiserver gives
//! a Go extension server: the generic server's flags ([`options`]), serving TLS with reloaded
//! certificates ([`tls`]), delegated authentication and authorization ([`auth`]), the request
//! guard, HTTP/2 fairness and write batching of the connection loop ([`serve`]), TTL caches
//! with single flight ([`cache`]) and the server's own metrics and logs ([`telemetry`]).
//!
//! It names no resource a server serves: the layers above (the `percolator` crate) bring the
//! kinds, the metric APIs and the router. Below it only `k8s-wire`.

pub mod auth;
pub mod cache;
pub mod options;
pub mod serve;
pub mod telemetry;
pub mod tls;

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
