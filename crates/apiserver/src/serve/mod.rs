//! The serving loop and its parts, which know no resource: the [`listener`] (accept, bounds on
//! connections, TLS, HTTP/1.1 and HTTP/2, idle and write timeouts, graceful shutdown), the
//! request [`guard`] (size limits, timeout, in-flight limit), HTTP/2 stream [`fairness`], the
//! [`batch`]ing of what one turn of a connection writes and the bound on a peer that stops
//! reading ([`stall`]); and [`serve`], which runs a server's [`App`] with them until its
//! shutdown, as kube-apiserver shuts down.
//!
//! Shutdown: when the `shutdown` future resolves (SIGTERM or Ctrl-C: [`shutdown_signal`]),
//! `/readyz` fails at once while requests are still served for `--shutdown-delay-duration` (so
//! endpoints and load balancers stop sending new traffic), then the listener closes, open
//! connections are drained (at most [`listener::DRAIN_TIMEOUT`]) and `serve` returns. A second
//! signal skips the delay.

pub mod batch;
pub mod fairness;
pub mod guard;
pub mod listener;
pub mod stall;

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use tokio::net::TcpListener;

use axum::Router;

use crate::{Metrics, ServingArgs};

/// What [`serve`] runs: a server's router (`crate::router::app` builds it from a state), with
/// the shutdown flag its `/readyz` reports and the metrics its connections are counted in.
#[derive(Debug, Clone)]
pub struct App {
    router: Router,
    shutting_down: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
}

impl App {
    /// `router`, whose `/readyz` fails once `shutting_down` is set, counted in `metrics`.
    pub fn new(router: Router, shutting_down: Arc<AtomicBool>, metrics: Arc<Metrics>) -> Self {
        Self { router, shutting_down, metrics }
    }

    /// The router alone (to serve it by other means, or call it in tests).
    pub fn router(&self) -> Router {
        self.router.clone()
    }

    fn into_parts(self) -> (Router, Arc<AtomicBool>, Arc<Metrics>) {
        (self.router, self.shutting_down, self.metrics)
    }
}

/// Serves `app` over TLS on `listener` with the serving flags `args` until `shutdown`
/// resolves; then `/readyz` fails while requests are still served for
/// `--shutdown-delay-duration` (cut short by another SIGTERM or Ctrl-C), then the listener
/// closes and in-flight requests are drained.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    app: App,
    args: &ServingArgs,
    shutdown: impl Future<Output = ()> + Send,
) {
    let (router, shutting_down, metrics) = app.into_parts();
    let delay = args.shutdown_delay_duration;
    let counted = metrics.clone();
    let staged = async move {
        shutdown.await;
        shutting_down.store(true, Ordering::SeqCst);
        metrics.ready.set(0);
        tracing::info!(
            delay = %k8s_wire::duration::go_string(delay),
            "shutting down: /readyz fails; still serving until the delay ends (signal again to skip it)"
        );
        tokio::select! {
            () = tokio::time::sleep(delay) => {}
            () = shutdown_signal() => tracing::info!("second signal: skipping the shutdown delay"),
        }
    };
    listener::serve(listener, tls, router, &listener::ServeConfig::from_args(args), &counted, staged).await;
}

/// Resolves on SIGTERM or Ctrl-C.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(term) => term,
            Err(error) => {
                tracing::warn!(%error, "cannot listen for SIGTERM");
                let _ = ctrl_c.await;
                return;
            }
        };
        tokio::select! {
            _ = ctrl_c => {}
            _ = term.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
}
