//! Delegated authentication and authorization (docs/wire.md, "Delegated authentication and authorization"), as the generic Kubernetes API
//! server does them for an aggregated server, in one call per request ([`admit`]):
//!
//! 1. authenticate ([`authn`]): front proxy (request-header) certificate + `X-Remote-*`
//!    headers, x509 client certificate, bearer token through TokenReview; else anonymous;
//! 2. strip `Authorization` and the identity headers;
//! 3. authorize ([`authz`]): always-allow groups and paths, else SubjectAccessReview;
//! 4. put the [`UserInfo`] (as an `Arc`) into the request's extensions and go on, or answer the
//!    `metav1.Status` (401 `Unauthorized`, 403 `Forbidden`, 429 `TooManyRequests` with
//!    `Retry-After` when a review could not be made in time because of the bounds of
//!    [`limit`] or because kube-apiserver asked to slow down, 503 `ServiceUnavailable` when
//!    kube-apiserver cannot be reached for a SubjectAccessReview and no recent decision is known
//!    ([`authz`]'s stale-if-error), 500 `InternalError`).
//!
//! Trust material (client CA, front proxy CA and header names) comes from flags or the
//! `kube-system/extension-apiserver-authentication` ConfigMap, watched ([`trust`]). The TLS
//! listener requests a client certificate without verifying its chain ([`tls`]); the TLS accept
//! loop hands the chain to [`admit`] as a [`PeerCertificates`] extension; a chain is
//! verified against the current CAs on the first request of its connection and again whenever
//! those CAs change or the chain's validity ends. The upstream calls are behind
//! [`TokenReviewer`] and [`AccessReviewer`], bounded per kind ([`limit`]: rate, outstanding
//! reviews, each client's share of them), shared by concurrent requests and cancelled when no
//! request waits for them any more ([`flight`]). The serving loop gives each request its
//! client's address ([`ClientAddr`]), which TokenReviews are shared out by. The metrics
//! ([`AuthMetrics`]) are the authenticator's from its start ([`Auth::metrics`]).

pub(crate) mod authn;
pub(crate) mod authz;
pub(crate) mod flight;
pub(crate) mod limit;
pub(crate) mod review;
pub(crate) mod tls;
pub(crate) mod trust;
pub(crate) mod x509;

#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::extract::Request;
use axum::response::Response;
use http::{HeaderValue, header};
use rustls::pki_types::CertificateDer;

use crate::StatusResponse;
pub(crate) use crate::options::AuthArgs;
use authn::TokenAuthenticator;
use authz::{AlwaysAllowPaths, Authorizer, Decision, DecisionTtls, PathPatternError};
use k8s_wire::{ApiError, GroupResource};
use k8s_wire::{ParsedRequest, RequestInfo, percent_decode};
use limit::{Limits, RetryPolicy, ReviewContext, ReviewGate};
pub(crate) use review::{AccessReviewer, KubeAccessReviewer, KubeTokenReviewer, TokenReviewer};
pub(crate) use trust::Trust;
pub(crate) use x509::CaBundle;

use crate::telemetry::AuthMetrics;

/// The address of the client a request came from, put into every request's extensions by
/// the serving loop (the TCP peer). TokenReviews, whose identity is unknown until reviewed,
/// are shared out by it; without it, all such clients share one share.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientAddr(pub SocketAddr);

/// The authenticated user of a request (`user.Info`), found in the request's extensions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct UserInfo {
    /// User name.
    pub name: String,
    /// UID, empty when unknown.
    pub uid: String,
    /// Groups, `system:authenticated` included for authenticated users.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

/// The certificate chain the TLS peer presented (leaf first), put into every request's
/// extensions by the TLS accept loop; absent when the peer presented none. Not verified by the
/// handshake: the authenticators verify it against the current CAs ([`PeerCertificates::verify`]),
/// once per connection and CA bundle while the chain is valid.
#[derive(Clone)]
pub struct PeerCertificates(Arc<x509::PeerChain>);

impl std::fmt::Debug for PeerCertificates {
    /// Only the length: certificate material is never logged.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCertificates").field("len", &self.chain().len()).finish()
    }
}

impl PeerCertificates {
    /// A presented chain, leaf first.
    pub fn new(chain: Vec<CertificateDer<'static>>) -> Self {
        Self(Arc::new(x509::PeerChain::new(chain)))
    }

    /// The chain of an established server connection, if the client sent one.
    pub fn from_server_connection(connection: &rustls::ServerConnection) -> Option<Self> {
        connection
            .peer_certificates()
            .filter(|chain| !chain.is_empty())
            .map(|chain| Self::new(chain.iter().map(|c| c.clone().into_owned()).collect()))
    }

    /// The chain, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        self.0.chain()
    }

    /// Verifies the chain against `ca` for client authentication now. A success is
    /// remembered for this connection and this bundle (by content) until the first
    /// certificate of the chain expires: a request on the same connection skips the
    /// signature checks, a changed bundle verifies again, an expired chain fails as before.
    pub fn verify(&self, ca: &CaBundle) -> Result<Arc<x509::VerifiedChain>, x509::CertificateError> {
        self.0.verify(ca)
    }
}

/// Errors setting up authentication and authorization.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A kubeconfig flag names a file that cannot be used.
    #[error("{flag} {}: {message}", .path.display())]
    Kubeconfig {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A CA file flag names a file that cannot be used.
    #[error("{flag} {}: {message}", .path.display())]
    File {
        /// The flag.
        flag: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// A CA file flag names a file that cannot be read or holds no usable certificate.
    #[error(transparent)]
    CaFile(#[from] crate::tls::TlsError),
    /// The trust ConfigMap is invalid.
    #[error("ConfigMap {}/{}: {}", trust::CONFIGMAP_NAMESPACE, trust::CONFIGMAP_NAME, .0)]
    InvalidConfigMap(trust::ConfigMapError),
    /// The trust ConfigMap could not be read (the message names the RBAC needed).
    #[error(
        "unable to read ConfigMap {}/{}: {}; {}",
        trust::CONFIGMAP_NAMESPACE,
        trust::CONFIGMAP_NAME,
        .0,
        trust::RBAC_HINT
    )]
    UnreadableConfigMap(kube::Error),
    /// The Kubernetes client could not be built.
    #[error("building the Kubernetes client for {what}: {message}")]
    Client {
        /// Which client.
        what: &'static str,
        /// What went wrong.
        message: String,
    },
    /// `--authorization-always-allow-paths` is malformed.
    #[error(transparent)]
    Paths(#[from] PathPatternError),
}

/// Authentication and authorization state shared by every request.
pub struct Auth {
    trust: Arc<Trust>,
    tokens: TokenAuthenticator,
    authorizer: Authorizer,
    anonymous: bool,
    metrics: AuthMetrics,
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Auth")
            .field("trust", &self.trust)
            .field("anonymous", &self.anonymous)
            .finish_non_exhaustive()
    }
}

impl Auth {
    /// Sets everything up from the flags: the clients (`--authentication-kubeconfig`,
    /// `--authorization-kubeconfig`, else `default_config`), the trust material (ConfigMap read
    /// and watched when needed) and the caches.
    pub async fn start(args: &AuthArgs, default_config: &kube::Config) -> Result<Arc<Self>, AuthError> {
        let authn_config = config_for(
            args.authentication_kubeconfig.as_deref(),
            "--authentication-kubeconfig",
            default_config,
        )
        .await?;
        let authz_config = config_for(
            args.authorization_kubeconfig.as_deref(),
            "--authorization-kubeconfig",
            default_config,
        )
        .await?;
        let client = |config: kube::Config, what| {
            kube::Client::try_from(config).map_err(|e| AuthError::Client { what, message: e.to_string() })
        };
        // The reviews' own clients retry nothing themselves: every request they send goes
        // through the rate limit ([`limit`]).
        let token_client = client(review::review_client_config(authn_config.clone()), "authentication")?;
        let access_client = client(review::review_client_config(authz_config), "authorization")?;
        let trust = Trust::start(args, client(authn_config, "authentication")?).await?;
        Self::new(
            args,
            trust,
            Arc::new(KubeTokenReviewer::new(token_client)),
            Arc::new(KubeAccessReviewer::new(access_client)),
        )
    }

    /// Assembles the state from parts (tests use fixed trust and fake reviewers); the flags
    /// give the anonymous switch, the TTLs, the reviews' bounds and the always-allow lists.
    pub fn new(
        args: &AuthArgs,
        trust: Arc<Trust>,
        tokens: Arc<dyn TokenReviewer>,
        access: Arc<dyn AccessReviewer>,
    ) -> Result<Arc<Self>, AuthError> {
        Self::with_retries(args, trust, tokens, access, RetryPolicy::default())
    }

    /// [`Auth::new`] with another retry policy (tests shorten the backoff).
    pub(crate) fn with_retries(
        args: &AuthArgs,
        trust: Arc<Trust>,
        tokens: Arc<dyn TokenReviewer>,
        access: Arc<dyn AccessReviewer>,
        retry: RetryPolicy,
    ) -> Result<Arc<Self>, AuthError> {
        let metrics =
            AuthMetrics { trust_configmap_missing: trust.missing_gauge(), ..AuthMetrics::default() };
        let paths = AlwaysAllowPaths::new(&non_empty(&args.authorization_always_allow_paths))?;
        let access_gate = ReviewGate::new(
            Limits {
                qps: args.authorization_webhook_qps,
                burst: args.authorization_webhook_burst,
                max_in_flight: args.authorization_webhook_max_inflight,
            },
            retry,
            metrics.access_reviews.clone(),
        );
        let authorizer = Authorizer::new(
            access,
            access_gate,
            non_empty(&args.authorization_always_allow_groups),
            paths,
            DecisionTtls {
                authorized: args.authorization_webhook_cache_authorized_ttl,
                unauthorized: args.authorization_webhook_cache_unauthorized_ttl,
                stale_if_error: args.authorization_webhook_stale_if_error,
            },
            &metrics,
        );
        let token_gate = ReviewGate::new(
            Limits {
                qps: args.authentication_token_webhook_qps,
                burst: args.authentication_token_webhook_burst,
                max_in_flight: args.authentication_token_webhook_max_inflight,
            },
            retry,
            metrics.token_reviews.clone(),
        );
        let tokens = TokenAuthenticator::new(
            tokens,
            token_gate,
            args.authentication_token_webhook_cache_ttl,
            metrics.token_reviews.cancelled.clone(),
        );
        Ok(Arc::new(Self { trust, tokens, authorizer, anonymous: args.anonymous_auth, metrics }))
    }

    /// The metrics of authentication and authorization, counted from the start; a server
    /// exports them with `Metrics::export_auth`.
    pub fn metrics(&self) -> &AuthMetrics {
        &self.metrics
    }

    /// The handshake-time client certificate verifier for the serving TLS configuration
    /// (see [`tls::client_cert_verifier`]).
    pub fn client_cert_verifier(&self) -> Arc<dyn rustls::server::danger::ClientCertVerifier> {
        tls::client_cert_verifier()
    }

    /// The trust material holder.
    pub fn trust(&self) -> &Arc<Trust> {
        &self.trust
    }
}

async fn config_for(
    path: Option<&Path>,
    flag: &'static str,
    default_config: &kube::Config,
) -> Result<kube::Config, AuthError> {
    let Some(path) = path else {
        return Ok(default_config.clone());
    };
    let error = |message: String| AuthError::Kubeconfig { flag, path: path.to_path_buf(), message };
    let kubeconfig = kube::config::Kubeconfig::read_from(path).map_err(|e| error(e.to_string()))?;
    kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .map_err(|e| error(e.to_string()))
}

/// Authenticates and authorizes `request`: on success the [`UserInfo`] is in its extensions
/// and no credential is left in its headers; otherwise the 401/403/429/503/500
/// `metav1.Status` to answer.
pub async fn admit(auth: &Auth, request: &mut Request) -> Result<(), Response> {
    let material = auth.trust.current();
    let peer = request.extensions().get::<PeerCertificates>().cloned();
    let context = review_context(request);
    let outcome =
        authn::authenticate(&material, &auth.tokens, peer.as_ref(), request.headers(), &context).await;
    authn::strip_credentials(&material, request.headers_mut());

    let user = match outcome {
        Ok(Some(user)) => user,
        Ok(None) if auth.anonymous => Arc::new(authn::anonymous()),
        Ok(None) => {
            tracing::debug!("unauthorized: no credentials and anonymous access is disabled");
            return Err(ApiError::Unauthorized.into_response());
        }
        Err(errors) => {
            if let Some(retry_after) = throttled(&errors) {
                let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
                tracing::debug!(reasons = ?reasons, "TokenReview not made: 429");
                return Err(too_many_requests(retry_after));
            }
            let cn = peer
                .as_ref()
                .and_then(|p| p.chain().first())
                .and_then(|leaf| x509::subject(leaf.as_ref()).ok());
            let reasons: Vec<String> = errors.iter().map(ToString::to_string).collect();
            tracing::debug!(
                peer_cn = cn.as_ref().map(|s| s.common_name.as_str()),
                reasons = ?reasons,
                "unauthorized: authentication failed"
            );
            return Err(ApiError::Unauthorized.into_response());
        }
    };

    let uri = request.uri();
    // Parsed once by the router's outermost layer; a request without it was never parsed,
    // which is a wiring fault, not a client's.
    let Some(parsed) = request.extensions().get::<Arc<ParsedRequest>>().cloned() else {
        return Err(
            ApiError::Internal("the request was not parsed before authorization".to_owned()).into_response()
        );
    };
    let Some(info) = parsed.info.as_ref() else { return Err(ApiError::PathNotFound.into_response()) };
    // Go authorizes `URL.Path`, which is decoded.
    let path = percent_decode(uri.path());
    match auth.authorizer.authorize(&user, info, &path, &context).await {
        Ok(Decision::Allow) => {}
        Ok(Decision::Forbid(reason)) => {
            tracing::debug!(user = %user.name, verb = %info.verb, %path, %reason, "forbidden");
            return Err(forbidden(&user, info, &path, &reason));
        }
        Err(authz::AuthorizeError::Unavailable(error)) => {
            tracing::warn!(user = %user.name, verb = %info.verb, %path, %error, "authorizer unreachable: 503");
            return Err(ApiError::ServiceUnavailable {
                message: AUTHORIZER_UNAVAILABLE.to_owned(),
                retry_after: Some(1),
            }
            .into_response());
        }
        Err(authz::AuthorizeError::Throttled { error, retry_after }) => {
            tracing::debug!(user = %user.name, verb = %info.verb, %path, %error, "SubjectAccessReview not made: 429");
            return Err(too_many_requests(retry_after));
        }
        Err(detail) => return Err(ApiError::Internal(detail.to_string()).into_response()),
    }
    request.extensions_mut().insert(user);
    Ok(())
}

/// What `request` brings to its reviews: its client's address ([`ClientAddr`]) and its
/// `?timeout=` (the guard has refused a malformed one already).
fn review_context(request: &Request) -> ReviewContext {
    let address = request.extensions().get::<ClientAddr>().map(|a| a.0.ip());
    let timeout = request
        .extensions()
        .get::<Arc<ParsedRequest>>()
        .and_then(|parsed| parsed.query.get("timeout").and_then(|t| k8s_wire::duration::parse(t).ok()));
    ReviewContext::new(address, timeout)
}

/// The longest `Retry-After` among the authenticators' refusals to review a token now, if any
/// refused: the request is answered 429 rather than 401, as nothing said the token is bad.
fn throttled(errors: &[authn::AuthnError]) -> Option<Duration> {
    errors
        .iter()
        .filter_map(|e| match e {
            authn::AuthnError::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        })
        .max()
}

/// The 429 `TooManyRequests` of a review that could not be made now.
fn too_many_requests(retry_after: Duration) -> Response {
    let seconds = u32::try_from(retry_after.as_secs().max(1)).unwrap_or(u32::MAX);
    ApiError::TooManyRequests { retry_after: seconds }.into_response()
}

/// The message of the 503 answered when no authorization decision can be made because
/// kube-apiserver, which answers SubjectAccessReviews, cannot be reached.
pub(crate) const AUTHORIZER_UNAVAILABLE: &str = "the authorizer is unavailable: kube-apiserver cannot be reached for a SubjectAccessReview of this request; try again later";

/// The 403 of `responsewriters.Forbidden`.
fn forbidden(user: &UserInfo, info: &RequestInfo, path: &str, reason: &str) -> Response {
    let (resource, name) = if info.is_resource_request {
        (GroupResource::new(info.api_group.clone(), info.resource.clone()), info.name.clone())
    } else {
        (GroupResource::default(), String::new())
    };
    let reason = authz::forbidden_reason(user, info, path, reason);
    let mut response = ApiError::Forbidden { resource, name, reason }.into_response();
    response.headers_mut().insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    response
}

/// Drops empty entries (`--flag=` gives one empty string).
pub(crate) fn non_empty(values: &[String]) -> Vec<String> {
    values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()).map(str::to_owned).collect()
}
