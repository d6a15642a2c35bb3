//! Authentication (docs/wire.md, "Authentication"), as `DelegatingAuthenticatorConfig.New` chains it:
//! `union(request-header, x509 client CA, bearer token → TokenReview)`, the first success wins,
//! `system:authenticated` is added; if nobody succeeded, any authenticator error is a 401, and
//! otherwise the user is anonymous (or a 401 without `--anonymous-auth`).
//!
//! The identity headers and `Authorization` are then removed from the request
//! ([`strip_credentials`]), whatever the outcome.
//!
//! TokenReviews are cached by outcome, authenticated and rejected tokens each in a cache of
//! their own, so that a flood of random tokens evicts only rejected ones; concurrent reviews
//! of one token share one call ([`super::flight`]), cancelled when no request waits for it
//! any more; reviews are bounded by [`super::limit`], one client address holding at most its
//! share (a refused review is a 429, [`AuthnError::Throttled`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use http::{HeaderMap, HeaderName, header};
use k8s_openapi::api::authentication::v1::TokenReviewStatus;
use moka::future::Cache;

use super::flight::Flights;
use super::limit::{ReviewContext, ReviewGate};
use super::review::{ReviewError, TokenReviewer};
use super::trust::{RequestHeaderConfig, TrustMaterial};
use super::x509::{CaBundle, CertificateError, ClientCertificateError, VerifiedChain};
use super::{PeerCertificates, UserInfo};

/// `user.Anonymous`.
pub(crate) const ANONYMOUS_USER: &str = "system:anonymous";
/// `user.AllUnauthenticated`.
pub(crate) const UNAUTHENTICATED_GROUP: &str = "system:unauthenticated";
/// `user.AllAuthenticated`.
pub(crate) const AUTHENTICATED_GROUP: &str = "system:authenticated";
/// `user.CredentialIDKey`: extra set by the x509 authenticator.
const CREDENTIAL_ID_KEY: &str = "authentication.kubernetes.io/credential-id";

/// Token review results kept at most, authenticated and rejected each.
const MAX_TOKENS: u64 = 10_000;

/// Identity headers always removed, whatever the configuration (kube-apiserver's names).
const DEFAULT_IDENTITY_HEADERS: &[&str] = &["x-remote-user", "x-remote-uid", "x-remote-group"];
const DEFAULT_EXTRA_PREFIX: &str = "x-remote-extra-";

/// Why a request could not be authenticated (logged at debug, never sent).
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AuthnError {
    /// The front proxy certificate did not verify or its CN is not allowed.
    #[error("request-header: {0}")]
    RequestHeader(RequestHeaderError),
    /// The client certificate did not verify against the client CA or does not make a user.
    #[error("x509: {0}")]
    X509(ClientCertificateError),
    /// The token was rejected or could not be reviewed.
    #[error("token: {0}")]
    Token(String),
    /// The token could not be reviewed now: a bound refused the review, or kube-apiserver
    /// asked to slow down (the request is answered 429).
    #[error("token: {error}")]
    Throttled {
        /// Why.
        error: Arc<ReviewError>,
        /// When to try again.
        retry_after: Duration,
    },
}

impl AuthnError {
    /// A TokenReview that could not be made.
    fn review_failed(error: Arc<ReviewError>) -> Self {
        match error.retry_after() {
            Some(retry_after) => Self::Throttled { error, retry_after },
            None => Self::Token(format!("TokenReview failed: {error}")),
        }
    }
}

/// Why the front proxy authenticator refused a request.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RequestHeaderError {
    /// The peer chain did not verify against the request-header CA.
    #[error(transparent)]
    Certificate(#[from] CertificateError),
    /// The chain verified but its CN is not in `requestheader-allowed-names`.
    #[error("x509: subject with cn={0} is not in the allowed list")]
    NameNotAllowed(String),
}

/// The TokenReview authenticator with its caches (keyed by the SHA-256 of the token, each
/// outcome kept for the TTL in a cache of its own, call failures not kept; concurrent reviews
/// of a token share one call).
pub(crate) struct TokenAuthenticator {
    reviewer: Arc<dyn TokenReviewer>,
    gate: Arc<ReviewGate>,
    authenticated: Cache<[u8; 32], Arc<UserInfo>>,
    rejected: Cache<[u8; 32], Arc<str>>,
    flights: Flights<[u8; 32], Result<TokenOutcome, Arc<ReviewError>>>,
}

#[derive(Clone)]
enum TokenOutcome {
    Authenticated(Arc<UserInfo>),
    Rejected(Arc<str>),
}

impl TokenAuthenticator {
    /// Reviews with `reviewer` within `gate`'s bounds, caching for `ttl`; `cancelled` counts
    /// the reviews nobody waited for to the end.
    pub(crate) fn new(
        reviewer: Arc<dyn TokenReviewer>,
        gate: Arc<ReviewGate>,
        ttl: Duration,
        cancelled: openmetrics::metrics::counter::Counter,
    ) -> Self {
        Self {
            reviewer,
            gate,
            authenticated: Cache::builder().time_to_live(ttl).max_capacity(MAX_TOKENS).build(),
            rejected: Cache::builder().time_to_live(ttl).max_capacity(MAX_TOKENS).build(),
            flights: Flights::new(cancelled),
        }
    }

    async fn cached(&self, key: &[u8; 32]) -> Option<TokenOutcome> {
        if let Some(user) = self.authenticated.get(key).await {
            return Some(TokenOutcome::Authenticated(user));
        }
        self.rejected.get(key).await.map(TokenOutcome::Rejected)
    }

    async fn authenticate(&self, token: &str, context: &ReviewContext) -> Result<Arc<UserInfo>, AuthnError> {
        let mut key = [0u8; 32];
        key.copy_from_slice(ring::digest::digest(&ring::digest::SHA256, token.as_bytes()).as_ref());
        let outcome = match self.cached(&key).await {
            Some(outcome) => outcome,
            None => {
                let flight = self
                    .flights
                    .join_or_start(&key, || {
                        let slot = self.gate.admit(context.client())?;
                        let (reviewer, gate) = (Arc::clone(&self.reviewer), Arc::clone(&self.gate));
                        let (authenticated, rejected) = (self.authenticated.clone(), self.rejected.clone());
                        let (token, wait) = (token.to_owned(), context.wait);
                        Ok::<_, ReviewError>(
                            async move {
                                let status = gate.send(&slot, wait, || reviewer.review(token.clone())).await;
                                drop(slot);
                                let outcome = token_outcome(status.map_err(Arc::new)?);
                                match &outcome {
                                    TokenOutcome::Authenticated(user) => {
                                        authenticated.insert(key, Arc::clone(user)).await;
                                    }
                                    TokenOutcome::Rejected(reason) => {
                                        rejected.insert(key, Arc::clone(reason)).await
                                    }
                                }
                                Ok(outcome)
                            }
                            .boxed(),
                        )
                    })
                    .map_err(|error| AuthnError::review_failed(Arc::new(error)))?;
                flight.await.map_err(AuthnError::review_failed)?
            }
        };
        match outcome {
            TokenOutcome::Authenticated(user) => Ok(user),
            TokenOutcome::Rejected(reason) => Err(AuthnError::Token(reason.to_string())),
        }
    }
}

#[cfg(test)]
impl TokenAuthenticator {
    /// Runs the caches' pending evictions (tests).
    pub(crate) async fn run_pending_tasks(&self) {
        self.authenticated.run_pending_tasks().await;
        self.rejected.run_pending_tasks().await;
    }
}

/// The webhook token authenticator's reading of a TokenReview status; an unauthenticated
/// token is always an error (`bearertoken`: "invalid bearer token").
fn token_outcome(status: TokenReviewStatus) -> TokenOutcome {
    if status.authenticated != Some(true) {
        let reason =
            status.error.filter(|e| !e.is_empty()).unwrap_or_else(|| "invalid bearer token".to_owned());
        return TokenOutcome::Rejected(reason.into());
    }
    let user = status.user.unwrap_or_default();
    TokenOutcome::Authenticated(Arc::new(add_authenticated(UserInfo {
        name: user.username.unwrap_or_default(),
        uid: user.uid.unwrap_or_default(),
        groups: user.groups.unwrap_or_default(),
        extra: user.extra.unwrap_or_default(),
    })))
}

/// Runs the chain. `Ok(None)`: nobody authenticated the request and nobody failed.
pub(crate) async fn authenticate(
    material: &TrustMaterial,
    tokens: &TokenAuthenticator,
    peer: Option<&PeerCertificates>,
    headers: &HeaderMap,
    context: &ReviewContext,
) -> Result<Option<Arc<UserInfo>>, Vec<AuthnError>> {
    let peer = peer.filter(|p| !p.chain().is_empty());
    let mut errors = Vec::new();

    if let (Some(peer), Some(config)) = (peer, &material.request_header) {
        match request_header(config, peer, headers) {
            Ok(Some(user)) => return Ok(Some(Arc::new(add_authenticated(user)))),
            Ok(None) => {}
            Err(e) => errors.push(AuthnError::RequestHeader(e)),
        }
    }
    if let (Some(peer), Some(ca)) = (peer, &material.client_ca) {
        match client_certificate(ca, peer) {
            Ok(Some(user)) => return Ok(Some(user)),
            Ok(None) => {}
            Err(e) => errors.push(AuthnError::X509(e)),
        }
    }
    if let Some(token) = bearer_token(headers) {
        match tokens.authenticate(&token, context).await {
            // Cached with `system:authenticated` already added.
            Ok(user) => return Ok(Some(user)),
            Err(e) => errors.push(e),
        }
    }
    if errors.is_empty() { Ok(None) } else { Err(errors) }
}

/// The anonymous user.
pub(crate) fn anonymous() -> UserInfo {
    UserInfo {
        name: ANONYMOUS_USER.to_owned(),
        groups: vec![UNAUTHENTICATED_GROUP.to_owned()],
        ..UserInfo::default()
    }
}

/// `AuthenticatedGroupAdder`: adds `system:authenticated` unless the user is anonymous or
/// already in `system:authenticated` / `system:unauthenticated`.
fn add_authenticated(mut user: UserInfo) -> UserInfo {
    if user.name != ANONYMOUS_USER
        && !user.groups.iter().any(|g| g == AUTHENTICATED_GROUP || g == UNAUTHENTICATED_GROUP)
    {
        user.groups.push(AUTHENTICATED_GROUP.to_owned());
    }
    user
}

/// The front proxy authenticator: the peer chain must verify against the request-header CA
/// (clientAuth) and carry an allowed CN; then the user comes from the headers.
fn request_header(
    config: &RequestHeaderConfig,
    peer: &PeerCertificates,
    headers: &HeaderMap,
) -> Result<Option<UserInfo>, RequestHeaderError> {
    let verified = peer.verify(&config.ca)?;
    if !config.allowed_names.is_empty() {
        let cn = &verified.subject.common_name;
        if !config.allowed_names.contains(cn) {
            return Err(RequestHeaderError::NameNotAllowed(cn.clone()));
        }
    }
    let Some(name) = first_value(headers, &config.username_headers) else {
        return Ok(None);
    };
    let uid = first_value(headers, &config.uid_headers).unwrap_or_default();
    let groups = config
        .group_headers
        .iter()
        .flat_map(|h| headers.get_all(h.as_str()).iter())
        .map(header_text)
        .filter(|g| !g.is_empty())
        .collect();
    Ok(Some(UserInfo { name, uid, groups, extra: extras(headers, &config.extra_header_prefixes) }))
}

/// The first header among `names` whose first value is non-empty (`headerValue`).
fn first_value(headers: &HeaderMap, names: &[String]) -> Option<String> {
    names.iter().filter_map(|h| headers.get(h.as_str())).map(header_text).find(|v| !v.is_empty())
}

/// `newExtra`: for each prefix, each header starting with it (case-insensitively) gives the
/// key = rest of the name, lower-cased then percent-decoded (raw on a bad escape); values are
/// appended in order.
fn extras(headers: &HeaderMap, prefixes: &[String]) -> BTreeMap<String, Vec<String>> {
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for prefix in prefixes {
        let prefix = prefix.to_ascii_lowercase();
        for name in headers.keys() {
            // `HeaderName`s are lower-case already.
            let Some(rest) = name.as_str().strip_prefix(prefix.as_str()) else { continue };
            let key = path_unescape(rest).unwrap_or_else(|| rest.to_owned());
            extra.entry(key).or_default().extend(headers.get_all(name).iter().map(header_text));
        }
    }
    extra
}

/// Go's `url.PathUnescape`: `%XX` decoded, `None` on a malformed escape.
fn path_unescape(s: &str) -> Option<String> {
    if !s.contains('%') {
        return Some(s.to_owned());
    }
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = |b: Option<&u8>| b.and_then(|c| char::from(*c).to_digit(16));
            let (h, l) = (hex(bytes.get(i + 1))?, hex(bytes.get(i + 2))?);
            out.push(u8::try_from(h * 16 + l).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(String::from_utf8_lossy(&out).into_owned())
}

fn header_text(value: &http::HeaderValue) -> String {
    String::from_utf8_lossy(value.as_bytes()).into_owned()
}

/// The x509 authenticator: the chain must verify against the client CA (clientAuth); user =
/// CN (an empty CN is "not mine"), groups = O, UID from the Kubernetes UID attribute. The user
/// (with `system:authenticated`) is built once per verified chain.
fn client_certificate(
    ca: &CaBundle,
    peer: &PeerCertificates,
) -> Result<Option<Arc<UserInfo>>, ClientCertificateError> {
    let verified = peer.verify(ca)?;
    verified.x509_user.get_or_init(|| x509_user(&verified)).clone()
}

fn x509_user(verified: &VerifiedChain) -> Result<Option<Arc<UserInfo>>, ClientCertificateError> {
    let subject = &verified.subject;
    if subject.common_name.is_empty() {
        return Ok(None);
    }
    let uid = match subject.uids.as_slice() {
        [] => String::new(),
        [uid] if uid.is_empty() => return Err(ClientCertificateError::EmptyUid),
        [uid] => uid.clone(),
        many => return Err(ClientCertificateError::MultipleUids(many.to_vec())),
    };
    let id: String = verified.leaf_sha256.iter().map(|b| format!("{b:02x}")).collect();
    Ok(Some(Arc::new(add_authenticated(UserInfo {
        name: subject.common_name.clone(),
        uid,
        groups: subject.organizations.clone(),
        extra: BTreeMap::from([(CREDENTIAL_ID_KEY.to_owned(), vec![format!("X509SHA256={id}")])]),
    }))))
}

/// `Authorization: Bearer <token>` (scheme case-insensitive; `bearertoken.Authenticator`).
fn bearer_token(headers: &HeaderMap) -> Option<String> {
    let value = header_text(headers.get(header::AUTHORIZATION)?);
    let mut parts = value.trim().splitn(3, ' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then(|| token.to_owned())
}

/// Removes `Authorization` and every identity header (configured names and prefixes, and
/// kube-apiserver's defaults) so nothing downstream can read or forward them. Allocates only
/// when an identity header other than `Authorization` is present.
pub(crate) fn strip_credentials(material: &TrustMaterial, headers: &mut HeaderMap) {
    headers.remove(header::AUTHORIZATION);
    let rh = material.request_header.as_ref();
    let is_identity = |name: &HeaderName| {
        // `HeaderName`s are lower-case; the configured names may not be.
        let k = name.as_str();
        DEFAULT_IDENTITY_HEADERS.contains(&k)
            || k.starts_with(DEFAULT_EXTRA_PREFIX)
            || rh.is_some_and(|rh| {
                rh.username_headers
                    .iter()
                    .chain(&rh.uid_headers)
                    .chain(&rh.group_headers)
                    .any(|n| n.eq_ignore_ascii_case(k))
                    || rh.extra_header_prefixes.iter().any(|p| {
                        k.len() >= p.len() && k.as_bytes()[..p.len()].eq_ignore_ascii_case(p.as_bytes())
                    })
            })
    };
    let doomed: Vec<HeaderName> = headers.keys().filter(|k| is_identity(k)).cloned().collect();
    for name in doomed {
        headers.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_unescape_is_gos() {
        assert_eq!(path_unescape("acme.com%2fproject").as_deref(), Some("acme.com/project"));
        assert_eq!(path_unescape("a+b").as_deref(), Some("a+b"));
        assert_eq!(path_unescape("bad%zz"), None);
        assert_eq!(path_unescape("trailing%2"), None);
        assert_eq!(path_unescape("%25"), Some("%".to_owned()));
    }

    #[test]
    fn bearer_parsing() {
        let mk = |v: &str| {
            let mut h = HeaderMap::new();
            h.insert(header::AUTHORIZATION, v.parse().unwrap());
            bearer_token(&h)
        };
        assert_eq!(mk("Bearer abc").as_deref(), Some("abc"));
        assert_eq!(mk("bearer abc").as_deref(), Some("abc"));
        assert_eq!(mk("BEARER abc extra").as_deref(), Some("abc"));
        assert_eq!(mk("Basic abc"), None);
        assert_eq!(mk("Bearer"), None);
        assert_eq!(mk("Bearer  abc"), None);
        assert_eq!(bearer_token(&HeaderMap::new()), None);
    }

    #[test]
    fn authenticated_group_is_added_once() {
        let u =
            add_authenticated(UserInfo { name: "a".into(), groups: vec!["x".into()], ..Default::default() });
        assert_eq!(u.groups, ["x", AUTHENTICATED_GROUP]);
        let u = add_authenticated(u);
        assert_eq!(u.groups, ["x", AUTHENTICATED_GROUP]);
        let u = add_authenticated(UserInfo {
            name: "a".into(),
            groups: vec![UNAUTHENTICATED_GROUP.into()],
            ..Default::default()
        });
        assert_eq!(u.groups, [UNAUTHENTICATED_GROUP]);
        assert_eq!(add_authenticated(anonymous()), anonymous());
    }

    #[test]
    fn token_outcomes() {
        use k8s_openapi::api::authentication::v1::UserInfo as K8sUser;
        let ok = token_outcome(TokenReviewStatus {
            authenticated: Some(true),
            user: Some(K8sUser {
                username: Some("system:serviceaccount:ns:sa".into()),
                uid: Some("u1".into()),
                groups: Some(vec!["system:serviceaccounts".into()]),
                extra: Some(BTreeMap::from([("k".to_owned(), vec!["v".to_owned()])])),
            }),
            ..Default::default()
        });
        let TokenOutcome::Authenticated(user) = ok else { panic!("not authenticated") };
        assert_eq!(user.name, "system:serviceaccount:ns:sa");
        assert_eq!(user.uid, "u1");
        assert_eq!(user.extra["k"], ["v"]);
        let TokenOutcome::Rejected(r) = token_outcome(TokenReviewStatus::default()) else { panic!() };
        assert_eq!(&*r, "invalid bearer token");
        let TokenOutcome::Rejected(r) = token_outcome(TokenReviewStatus {
            authenticated: Some(false),
            error: Some("token expired".into()),
            ..Default::default()
        }) else {
            panic!()
        };
        assert_eq!(&*r, "token expired");
    }
}
