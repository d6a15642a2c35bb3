//! Accept loops shared by the simulator's listeners: plain HTTP or TLS, HTTP/1.1 and h2, and
//! a shutdown signal that stops accepting and aborts open connections (watch streams
//! included), so `run` returns promptly.

use std::convert::Infallible;
use std::future::Future;
use std::sync::Arc;

use axum::body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;

use super::faults::ApiFault;

/// Resolves once the simulator shuts down.
#[derive(Clone)]
pub(crate) struct Shutdown(watch::Receiver<bool>);

impl Shutdown {
    /// A shutdown signal and its trigger.
    pub(crate) fn new() -> (watch::Sender<bool>, Self) {
        let (tx, rx) = watch::channel(false);
        (tx, Self(rx))
    }

    /// Waits for the shutdown (also when the trigger is dropped).
    pub(crate) async fn wait(&mut self) {
        let _ = self.0.wait_for(|down| *down).await;
    }
}

/// Serves one connection with hyper (HTTP/1.1 or h2, chosen by the client).
pub(crate) async fn serve_connection<I, S>(io: I, service: S)
where
    I: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    S: hyper::service::Service<http::Request<Incoming>, Response = http::Response<Body>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
    let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    if let Err(e) = builder.serve_connection_with_upgrades(TokioIo::new(io), service).await {
        tracing::debug!(error = %e, "connection ended with an error");
    }
}

/// Accepts on `listener` until `shutdown`, handing each connection to `handle`.
pub(crate) async fn accept_loop<F, Fut>(listener: TcpListener, mut shutdown: Shutdown, handle: F)
where
    F: Fn(TcpStream) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = shutdown.wait() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    connections.spawn(handle(stream));
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
            },
        }
    }
    // Dropping the JoinSet aborts the open connections.
}

/// Serves `router` over TLS on `listener` until `shutdown`, as a server that can be made
/// unreachable: while `api` is [`ApiFault::Down`], new connections are reset (TCP RST) before the
/// handshake and counted with `on_reset`, and a change to down aborts every open connection
/// (watch streams and requests in flight included).
pub(crate) async fn serve_tls_unless_down(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: axum::Router,
    shutdown: Shutdown,
    api: watch::Receiver<ApiFault>,
    on_reset: Arc<dyn Fn() + Send + Sync>,
) {
    let acceptor = TlsAcceptor::from(tls);
    accept_loop(listener, shutdown, move |stream| {
        let acceptor = acceptor.clone();
        let service = TowerToHyperService::new(router.clone());
        let mut api = api.clone();
        let on_reset = Arc::clone(&on_reset);
        async move {
            if *api.borrow_and_update() == ApiFault::Down {
                // SO_LINGER 0: closing sends RST instead of FIN.
                let _ = stream.set_zero_linger();
                on_reset();
                return;
            }
            let serve = async {
                match acceptor.accept(stream).await {
                    Ok(tls) => serve_connection(tls, service).await,
                    Err(e) => tracing::debug!(error = %e, "TLS handshake failed"),
                }
            };
            tokio::select! {
                () = serve => {}
                _ = api.wait_for(|api| *api == ApiFault::Down) => tracing::debug!("API down: connection aborted"),
            }
        }
    })
    .await;
}

/// Serves `router` over plain HTTP on `listener` until `shutdown`.
pub(crate) async fn serve_plain(listener: TcpListener, router: axum::Router, shutdown: Shutdown) {
    accept_loop(listener, shutdown, move |stream| {
        let service = TowerToHyperService::new(router.clone());
        serve_connection(stream, service)
    })
    .await;
}
