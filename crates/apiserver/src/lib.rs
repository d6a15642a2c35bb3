//! What a Kubernetes aggregated API server needs whatever it serves, as k8s.io/apiserver gives
//! a Go extension server: the generic server's flags ([`ServingArgs`], [`AuthArgs`]), serving
//! TLS with reloaded certificates ([`server_config_reloading`]), delegated authentication and
//! authorization ([`Auth`], [`admit`]), the serving loop with its bounds on hostile clients,
//! the request guard, HTTP/2 fairness and write batching ([`serve`]), TTL caches with single
//! flight ([`TtlCache`]) and the server's own metrics and logs ([`Metrics`], [`init_logging`]).
//! Its modules are private but for [`serve`]; the root re-exports what a server uses.
//!
//! It names no resource a server serves, nor the server: the layers above bring the kinds, the
//! metric APIs and the router, and choose the names users see (the metrics' namespace,
//! [`Metrics::new`]; the flags' environment variables, [`env_named`]). Below it only `k8s-wire`.

mod auth;
mod cache;
mod options;
mod process;
pub mod serve;
mod telemetry;
mod tls;

// The modules are private; the crate's API is what the layers above use, re-exported here.
// `serve`'s parts stay modules: a server runs `listener::serve` and reaches the others through
// their names (`guard::admit`, `fairness::CHUNK`, `batch::split`).
pub use auth::x509::not_after;
pub use auth::{Auth, AuthError, ClientAddr, PeerCertificates, admit};
pub use cache::{CacheSettings, TtlCache};
pub use options::{AuthArgs, ServingArgs, env_named, kubernetes_style, parse_positive_duration};
pub use telemetry::{
    ADAPTER_CONFIG_FILE, AuthMetrics, CONFIG_FILE, LatencyLabels, Metrics, NoopObserver, Probe,
    RequestLabels, ReviewMetrics, UpstreamObserver, init_logging, outcome,
};
pub use tls::{
    AnyServerCert, CaBoundSessions, ReloadingCert, TlsError, WatchedCaFile, WatchedRootsVerifier, read_certs,
    server_config, server_config_reloading,
};

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
