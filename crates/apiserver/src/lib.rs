//! A library for read-only Kubernetes aggregated API servers: what k8s.io/apiserver gives a Go
//! extension server, for a server written in Rust. A server brings its resources (kinds that
//! compute their objects) and, if it has any, API groups served by its own code; this crate
//! serves them as kube-apiserver's aggregation layer and `kubectl` expect.
//!
//! # The parts
//!
//! - [`kind`]: what a served resource is ([`kind::KindInfo`], Table [`kind::Column`]s, OpenAPI
//!   schemas) and how it is computed ([`kind::ServedKind::list`] into a [`kind::Listing`],
//!   each object serialized once), a TTL cache with single flight in front of any kind
//!   ([`kind::CachedKind`]) and the set of kinds in force, fixed or swapped at runtime
//!   ([`kind::LiveKinds`]);
//! - [`router`]: the request chain (panic catch, in-flight accounting, the guard's limits and
//!   deadline, delegated authentication and authorization) over one dispatcher of every
//!   endpoint: the kinds' resources (JSON, `Table`, `PartialObjectMetadata`, label and field
//!   selectors), the [`GroupService`]s, [`discovery`] (legacy and aggregated v2/v2beta1, with
//!   ETags), [`openapi`] (v2 and v3, from the kinds' schemas), health (`/healthz`, `/livez`,
//!   `/readyz` and named checks) and `/metrics`;
//! - [`serve`]: the serving loop (TLS, HTTP/1.1 and HTTP/2, bounds on hostile clients, HTTP/2
//!   fairness, write batching) and [`serve::serve`], which runs an [`App`] until the shutdown
//!   future it is given resolves (SIGTERM: [`shutdown_signal`]), then shuts down gracefully;
//! - serving TLS with reloaded certificates ([`server_config_reloading`]), delegated
//!   authentication and authorization ([`Auth`]), TTL caches ([`TtlCache`]), the generic
//!   server's flags ([`ServingArgs`], [`AuthArgs`]), its metrics ([`Metrics`], which takes the
//!   server's own families from outside) and logs ([`init_logging`]);
//! - what a server reads and keeps while it runs: configuration files reloaded with a check
//!   and credentials re-read on change ([`files`]), YAML read as the Go components read it
//!   ([`yaml`]), local copies of watched resources ([`mirror`]), shared strings and label
//!   sets ([`intern`], [`series_labels`]), the steps of a [`GroupService`]'s handlers
//!   ([`group`]) and the process' set-up ([`init_process`]).
//!
//! It names no resource a server serves, nor the server: the server brings the kinds and the
//! groups, and chooses the names users see (the metrics' namespace, [`Metrics::new`]; the
//! flags' environment variables, [`env_named`]; its title and group-version,
//! [`discovery::ServerInfo`]). Below it only `k8s-wire`, the wire types.
//!
//! # A server
//!
//! A kind, a state over it, and the serving loop:
//!
//! ```no_run
//! use std::sync::Arc;
//!
//! use apiserver::kind::{
//!     Cell, Column, ComputeError, GroupVersion, KindInfo, Listing, ListingBuilder, Meta, ServedKind,
//! };
//! use apiserver::{ApiState, Metrics, ServingArgs, discovery::ServerInfo};
//! use futures::future::BoxFuture;
//!
//! const GV: GroupVersion =
//!     GroupVersion { group: "example.com", version: "v1", api_version: "example.com/v1" };
//!
//! /// One cluster-scoped object, `hello`.
//! struct Greetings(KindInfo);
//!
//! impl ServedKind for Greetings {
//!     fn info(&self) -> &KindInfo {
//!         &self.0
//!     }
//!     fn columns(&self) -> &[Column] {
//!         const COLUMNS: &[Column] = &[Column::object_name("Name of the greeting.")];
//!         COLUMNS
//!     }
//!     fn schemas(&self) -> Vec<(String, serde_json::Value)> {
//!         let schema = apiserver::kind::kind_schema(&self.0, "Standard metadata.", serde_json::json!({}));
//!         vec![(apiserver::kind::schema_name(GV, "Greeting"), schema)]
//!     }
//!     fn list<'a>(&'a self, _: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
//!         Box::pin(async move {
//!             let mut list = ListingBuilder::new(&self.0, String::new());
//!             let meta = Meta { name: "hello".into(), namespace: Meta::cluster_scoped(), ..Meta::default() };
//!             let object = serde_json::json!({"kind": "Greeting", "apiVersion": GV.api_version,
//!                 "metadata": apiserver::kind::ObjectMeta::from(&meta)});
//!             list.push(&meta, &object, &[Cell::text("hello")]);
//!             Ok(Arc::new(list.finish(Vec::new())))
//!         })
//!     }
//! }
//!
//! # async fn run(args: ServingArgs) -> Result<(), Box<dyn std::error::Error>> {
//! apiserver::install_crypto_provider();
//! let tls = apiserver::server_config(&args, None)?;
//! let kind = Greetings(KindInfo::new(GV, "Greeting", false, "A greeting."));
//! let metrics = Metrics::new("example");
//! let state = ApiState::new(vec![Arc::new(kind) as Arc<dyn ServedKind>], Arc::new(|| true), metrics)
//!     .with_server_info(ServerInfo::new("example", "0.1.0").with_home(GV));
//! let listener = apiserver::serve::listener::bind((args.bind_address, args.secure_port).into())?;
//! apiserver::serve::serve(listener, tls, apiserver::router::app(state), &args, apiserver::serve::shutdown_signal()).await;
//! # Ok(())
//! # }
//! ```
//!
//! A real server adds [`ApiState::with_auth`] (delegated to the cluster), its limits
//! ([`ApiState::with_limits`]), readiness checks, [`GroupService`]s, and [`kind::CachedKind`]
//! in front of kinds that are costly to compute.

#![warn(missing_docs)]

mod auth;
mod cache;
pub mod discovery;
pub mod files;
pub mod group;
pub mod intern;
pub mod kind;
pub mod mirror;
pub mod openapi;
mod options;
mod process;
mod render;
pub mod router;
pub mod series_labels;
pub mod serve;
mod status;
mod telemetry;
mod tls;
pub mod yaml;

// The root re-exports what a server uses most; `kind`, `router`, `discovery`, `openapi` and
// `serve` are modules of their own (`serve`'s parts are reached through their names:
// `guard::admit`, `fairness::CHUNK`, `batch::split`).
pub use auth::x509::not_after;
pub use auth::{Auth, AuthError, ClientAddr, PeerCertificates, admit};
pub use cache::{CacheSettings, TtlCache};
pub use discovery::DynamicGroupVersions;
pub use openmetrics;
pub use options::{
    AuthArgs, FlagValueError, HeaderArg, HeaderParser, ServingArgs, env_named, kubernetes_style,
    parse_byte_size, parse_positive_duration,
};
pub use process::{MemoryLimit, keep_the_heap_in_small_pages, memory_limit};
/// Fake kinds and a request helper for router tests (the cargo feature `testing`).
#[cfg(any(test, feature = "testing"))]
#[doc(hidden)]
pub use router::testutil as testing;
pub use router::{ApiState, GroupService, ReadyFn, app, router};
pub use serve::{App, shutdown_signal};
pub use status::{StatusResponse, status_response};
pub use telemetry::{
    AuthMetrics, LatencyLabels, Metrics, NoopObserver, Probe, ProbeSum, RequestLabels, ReviewMetrics,
    UpstreamObserver, init_logging, outcome,
};
pub use tls::{
    AnyServerCert, CaBoundSessions, ReloadingCert, TlsError, WatchedCaFile, WatchedRootsVerifier, read_certs,
    server_config, server_config_reloading,
};

/// Sets the process up as a server runs: the rustls crypto provider, JSON logs at `verbosity`
/// for the crates `own` ([`init_logging`]), and the heap in small pages
/// ([`keep_the_heap_in_small_pages`]).
pub fn init_process(verbosity: u8, own: &[&str]) {
    install_crypto_provider();
    init_logging(verbosity, own);
    keep_the_heap_in_small_pages();
}

/// Installs the process-wide rustls crypto provider (ring). Idempotent.
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// Keeps the `<namespace>_tls_serving_certificate_expiration_timestamp_seconds` gauge of
/// `metrics` on the `notAfter` of the serving leaf in force: set now, and after every reload
/// that changes the pair.
pub fn export_serving_certificate_expiry(cert: &ReloadingCert, metrics: &std::sync::Arc<Metrics>) {
    let metrics = std::sync::Arc::clone(metrics);
    cert.on_change(move |chain| {
        let not_after = match chain.first().map(|leaf| not_after(leaf.as_ref())) {
            Some(Ok(not_after)) => Some(not_after),
            Some(Err(error)) => {
                tracing::warn!(%error, "cannot read the expiry of the serving certificate");
                None
            }
            None => {
                tracing::warn!(error = "empty chain", "cannot read the expiry of the serving certificate");
                None
            }
        };
        metrics.serving_certificate_expires(not_after);
    });
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// Writes a self-signed pair for `name` valid until `not_after` (Unix seconds).
    fn mk_pair(dir: &std::path::Path, name: &str, not_after: u64) {
        let key = rcgen::KeyPair::generate().unwrap();
        let mut params = rcgen::CertificateParams::new(vec![name.to_owned()]).unwrap();
        params.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(not_after);
        let cert = params.self_signed(&key).unwrap();
        std::fs::write(dir.join("tls.crt"), cert.pem()).unwrap();
        std::fs::write(dir.join("tls.key"), key.serialize_pem()).unwrap();
    }

    /// The expiry gauge's value in `metrics`' exposition.
    fn mk_expiry(metrics: &Metrics) -> String {
        let name = "example_tls_serving_certificate_expiration_timestamp_seconds ";
        let text = metrics.encode();
        text.lines().find_map(|l| l.strip_prefix(name)).unwrap().to_owned()
    }

    /// The gauge follows the leaf in force: 0 before, then its `notAfter`, then the reloaded one's.
    #[test]
    fn the_serving_certificate_expiry_follows_the_pair_in_force() {
        install_crypto_provider();
        let dir = std::env::temp_dir().join(format!("apiserver-expiry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        // 2031-01-02T00:00:00Z, then 2032-03-04T05:06:07Z.
        mk_pair(&dir, "first", 1_925_078_400);
        let cert = ReloadingCert::load(dir.join("tls.crt"), dir.join("tls.key")).unwrap();
        let metrics = Metrics::new("example");
        assert_eq!(mk_expiry(&metrics), "0");
        export_serving_certificate_expiry(&cert, &metrics);
        assert_eq!(mk_expiry(&metrics), "1925078400");
        mk_pair(&dir, "second", 1_961_989_567);
        assert!(cert.reload().unwrap());
        assert_eq!(mk_expiry(&metrics), "1961989567");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
