//! Middleware tests: the authenticator branches with rcgen-minted certificates, header handling,
//! the 401/403/429/500/503 matrix with exact Status bodies, always-allow paths and groups,
//! caching (call counts) by outcome, the bounds on reviews (rate, outstanding, each client's
//! share, kube-apiserver's 429), shared reviews cancelled when no request waits any more
//! (a hold and a call counter), stale-if-error and its window, the exported metrics, and the
//! trust ConfigMap read and watched through a local fake API server (kept when deleted), which
//! also checks the real TokenReview/SubjectAccessReview clients' wire format.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::Request;
use axum::response::{IntoResponse, Response};
use clap::Parser;
use futures::future::BoxFuture;
use http::{HeaderMap, StatusCode};
use http_body_util::BodyExt;
use k8s_openapi::api::authentication::v1::{TokenReviewStatus, UserInfo as K8sUser};
use k8s_openapi::api::authorization::v1::{SubjectAccessReviewSpec, SubjectAccessReviewStatus};
use rcgen::ExtendedKeyUsagePurpose::{ClientAuth, ServerAuth};
use rustls::pki_types::CertificateDer;
use serde_json::{Value, json};
use tower::ServiceExt;

use super::limit::{REVIEW_TIMEOUT, ReviewContext};
use super::review::ReviewError;
use super::trust::{RequestHeaderConfig, TrustMaterial};
use super::*;
use test_support::all_at_once;
use test_support::{MkCa, mk_ca, mk_cert, mk_leaf};

/// Authenticates and authorizes the request, then calls `next` with the [`UserInfo`] in the
/// extensions and without credentials in the headers; or answers 401/403/500 as a
/// `metav1.Status`. [`admit`] as an axum
/// middleware, as the tests install it (`axum::middleware::from_fn_with_state(auth, middleware)`).
async fn middleware(
    axum::extract::State(auth): axum::extract::State<Arc<Auth>>,
    mut request: Request,
    next: axum::middleware::Next,
) -> Response {
    match admit(&auth, &mut request).await {
        Ok(()) => next.run(request).await,
        Err(response) => response,
    }
}

const G: &str = "stats.une-tasse-de.cafe";
const PMS_SHOP: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries";

/// The auth flags of a command line, parsed as the binary parses them.
fn mk_args(flags: &[&str]) -> AuthArgs {
    let args = std::iter::once("apiserver").chain(flags.iter().copied());
    crate::options::TestFlags::try_parse_from(args).unwrap().auth
}

// ---------------------------------------------------------------- fakes

/// Holds the reviews of a fake until released, and records how each ended: run to the end,
/// or dropped on the way (cancelled).
struct Hold {
    open: tokio::sync::Semaphore,
    running: AtomicUsize,
    finished: AtomicUsize,
    cancelled: AtomicUsize,
}

impl Hold {
    fn new() -> Arc<Self> {
        Arc::new(Self {
            open: tokio::sync::Semaphore::new(0),
            running: AtomicUsize::new(0),
            finished: AtomicUsize::new(0),
            cancelled: AtomicUsize::new(0),
        })
    }

    /// Waits until [`Hold::release`], counting a drop before then as a cancellation.
    async fn pass(&self) {
        /// Counts the review out when it ends, either way.
        struct Running<'a>(&'a Hold, bool);
        impl Drop for Running<'_> {
            fn drop(&mut self) {
                self.0.running.fetch_sub(1, Ordering::SeqCst);
                let ended = if self.1 { &self.0.finished } else { &self.0.cancelled };
                ended.fetch_add(1, Ordering::SeqCst);
            }
        }
        self.running.fetch_add(1, Ordering::SeqCst);
        let mut running = Running(self, false);
        // Closed: every review passes.
        let _ = self.open.acquire().await;
        running.1 = true;
    }

    /// Lets every review held, and every later one, pass.
    fn release(&self) {
        self.open.close();
    }

    fn running(&self) -> usize {
        self.running.load(Ordering::SeqCst)
    }
}

/// Tokens: `<name>-token` is user `<name>`; `expired` is rejected with an error; `broken`
/// fails the call; `slow` is answered 429 (Retry-After 1 s); anything else is unauthenticated
/// without a reason. With a [`Hold`], every review waits for it first.
#[derive(Default)]
struct FakeTokens {
    calls: AtomicUsize,
    hold: Option<Arc<Hold>>,
}

impl TokenReviewer for FakeTokens {
    fn review(&self, token: String) -> BoxFuture<'_, Result<TokenReviewStatus, ReviewError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if let Some(hold) = &self.hold {
                hold.pass().await;
            }
            if token == "broken" {
                return Err(ReviewError::Other("connection refused".into()));
            }
            if token == "slow" {
                return Err(ReviewError::SlowDown { retry_after: Duration::from_secs(1) });
            }
            if token == "expired" {
                return Ok(TokenReviewStatus {
                    authenticated: Some(false),
                    error: Some("token has expired".into()),
                    ..Default::default()
                });
            }
            match token.strip_suffix("-token") {
                Some(name) => Ok(TokenReviewStatus {
                    authenticated: Some(true),
                    user: Some(K8sUser {
                        username: Some(name.to_owned()),
                        uid: Some(format!("uid-{name}")),
                        groups: Some(if name == "root" { vec!["system:masters".into()] } else { vec![] }),
                        extra: None,
                    }),
                    ..Default::default()
                }),
                None => Ok(TokenReviewStatus { authenticated: Some(false), ..Default::default() }),
            }
        })
    }
}

type Rule = Box<dyn Fn(&SubjectAccessReviewSpec) -> Result<SubjectAccessReviewStatus, String> + Send + Sync>;

struct FakeAccess {
    calls: AtomicUsize,
    /// kube-apiserver unreachable: every review fails as a timed-out call would.
    down: std::sync::atomic::AtomicBool,
    /// The next reviews answered 429 with this Retry-After, and how many.
    slow_downs: AtomicUsize,
    retry_after: Duration,
    /// When each review call was made.
    called_at: Mutex<Vec<tokio::time::Instant>>,
    specs: Mutex<Vec<SubjectAccessReviewSpec>>,
    delay: Duration,
    hold: Option<Arc<Hold>>,
    rule: Rule,
}

impl FakeAccess {
    /// A fake answering by `rule`, at once, never down.
    fn with_rule(
        rule: impl Fn(&SubjectAccessReviewSpec) -> Result<SubjectAccessReviewStatus, String>
        + Send
        + Sync
        + 'static,
    ) -> Self {
        Self {
            calls: AtomicUsize::new(0),
            down: Default::default(),
            slow_downs: AtomicUsize::new(0),
            retry_after: Duration::from_secs(1),
            called_at: Mutex::default(),
            specs: Mutex::default(),
            delay: Duration::ZERO,
            hold: None,
            rule: Box::new(rule),
        }
    }

    fn new(
        rule: impl Fn(&SubjectAccessReviewSpec) -> Result<SubjectAccessReviewStatus, String>
        + Send
        + Sync
        + 'static,
    ) -> Arc<Self> {
        Arc::new(Self::with_rule(rule))
    }

    /// Allows user `alice` (and `system:anonymous` on `/public`), denies everybody else.
    fn standard() -> Arc<Self> {
        Self::new(standard_rule)
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

fn standard_rule(spec: &SubjectAccessReviewSpec) -> Result<SubjectAccessReviewStatus, String> {
    let public = spec.non_resource_attributes.as_ref().and_then(|n| n.path.as_deref()) == Some("/public");
    let allowed = spec.user.as_deref() == Some("alice") || public;
    Ok(SubjectAccessReviewStatus { allowed, ..Default::default() })
}

impl AccessReviewer for FakeAccess {
    fn review(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> BoxFuture<'_, Result<SubjectAccessReviewStatus, ReviewError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        self.called_at.lock().unwrap().push(tokio::time::Instant::now());
        Box::pin(async move {
            if let Some(hold) = &self.hold {
                hold.pass().await;
            }
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(ReviewError::Timeout(REVIEW_TIMEOUT));
            }
            let slowed =
                self.slow_downs.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1));
            if slowed.is_ok() {
                return Err(ReviewError::SlowDown { retry_after: self.retry_after });
            }
            self.specs.lock().unwrap().push(spec.clone());
            (self.rule)(&spec).map_err(ReviewError::Other)
        })
    }
}

// ---------------------------------------------------------------- the world

struct World {
    front_proxy_ca: MkCa,
    client_ca: MkCa,
    other_ca: MkCa,
}

fn mk_world() -> World {
    World {
        front_proxy_ca: mk_ca("front-proxy-ca"),
        client_ca: mk_ca("client-ca"),
        other_ca: mk_ca("other-ca"),
    }
}

impl World {
    fn material(&self, allowed_names: &[&str]) -> TrustMaterial {
        let mut rh = RequestHeaderConfig::with_defaults(
            CaBundle::from_pem(self.front_proxy_ca.pem.as_bytes()).unwrap().unwrap(),
        );
        rh.allowed_names = allowed_names.iter().map(|s| s.to_string()).collect();
        TrustMaterial {
            client_ca: CaBundle::from_pem(self.client_ca.pem.as_bytes()).unwrap(),
            request_header: Some(rh),
        }
    }

    fn front_proxy(&self) -> Vec<CertificateDer<'static>> {
        vec![mk_leaf(&self.front_proxy_ca, "front-proxy-client", &[], ClientAuth, false).der]
    }
}

fn mk_auth(material: TrustMaterial, flags: &[&str], access: Arc<FakeAccess>) -> (Arc<Auth>, Arc<FakeTokens>) {
    let tokens = Arc::new(FakeTokens::default());
    let auth = Auth::new(&mk_args(flags), Trust::fixed(material), tokens.clone(), access).unwrap();
    (auth, tokens)
}

/// [`mk_auth`] with no trust material and the standard access rule, returned with its fakes.
fn mk_plain_auth(flags: &[&str]) -> (Arc<Auth>, Arc<FakeTokens>, Arc<FakeAccess>) {
    let access = FakeAccess::standard();
    let (auth, tokens) = mk_auth(TrustMaterial::default(), flags, access.clone());
    (auth, tokens, access)
}

/// What the handler behind the middleware saw.
async fn echo(request: Request) -> Response {
    let user = request.extensions().get::<Arc<UserInfo>>().map(|u| (**u).clone()).unwrap_or_default();
    let headers: Vec<String> = request.headers().keys().map(|k| k.to_string()).collect();
    axum::Json(json!({
        "user": user.name, "uid": user.uid, "groups": user.groups, "extra": user.extra, "headers": headers,
    }))
    .into_response()
}

fn mk_req(
    path: &str,
    headers: &[(&str, &str)],
    peer: Option<Vec<CertificateDer<'static>>>,
) -> http::Request<Body> {
    let mut builder = http::Request::builder().uri(path);
    for (k, v) in headers {
        builder = builder.header(*k, *v);
    }
    if let Some(chain) = peer {
        builder = builder.extension(PeerCertificates::new(chain));
    }
    // As the router's outermost layer does for every request.
    let uri: http::Uri = path.parse().unwrap();
    let parsed = k8s_wire::ParsedRequest::new(&http::Method::GET, uri.path(), uri.query());
    builder.extension(Arc::new(parsed)).body(Body::empty()).unwrap()
}

async fn call(auth: &Arc<Auth>, request: http::Request<Body>) -> (StatusCode, HeaderMap, Value) {
    let app =
        Router::new().fallback(echo).layer(axum::middleware::from_fn_with_state(auth.clone(), middleware));
    let response = app.oneshot(request).await.unwrap();
    let status = response.status();
    let headers = response.headers().clone();
    let bytes = response.into_body().collect().await.unwrap().to_bytes();
    (status, headers, serde_json::from_slice(&bytes).unwrap_or(Value::Null))
}

fn unauthorized() -> Value {
    json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": "Unauthorized", "reason": "Unauthorized", "code": 401
    })
}

/// Alice's identity headers as the aggregator sends them.
const ALICE_HEADERS: &[(&str, &str)] = &[
    ("X-Remote-User", "alice"),
    ("X-Remote-Uid", "u-123"),
    ("X-Remote-Group", "devs"),
    ("X-Remote-Group", "ops"),
    ("X-Remote-Extra-Acme.com%2fproject", "p1"),
    ("X-Remote-Extra-Acme.com%2fproject", "p2"),
    ("X-Remote-Extra-Scopes", "s"),
    ("X-Remote-Extra-Bad%zz", "raw"),
];

// ---------------------------------------------------------------- request-header

#[tokio::test]
async fn front_proxy_headers_make_the_user_and_are_stripped() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&["front-proxy-client"]), &[], FakeAccess::standard());
    let mut headers = ALICE_HEADERS.to_vec();
    headers.push(("Authorization", "Bearer whatever"));
    headers.push(("Accept", "application/json"));
    let (status, _, body) = call(&auth, mk_req(PMS_SHOP, &headers, Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        body,
        json!({
            "user": "alice", "uid": "u-123",
            "groups": ["devs", "ops", "system:authenticated"],
            "extra": {"acme.com/project": ["p1", "p2"], "scopes": ["s"], "bad%zz": ["raw"]},
            "headers": ["accept"],
        })
    );
}

#[tokio::test]
async fn front_proxy_first_non_empty_username_header_wins() {
    let w = mk_world();
    let mut material = w.material(&[]);
    if let Some(rh) = material.request_header.as_mut() {
        rh.username_headers = vec!["X-Remote-User".into(), "X-Other-User".into()];
        rh.group_headers = vec!["X-Remote-Group".into(), "X-Other-Group".into()];
        rh.extra_header_prefixes = vec!["X-Remote-Extra-".into(), "X-Other-Extra-".into()];
    }
    let (auth, _) = mk_auth(material, &[], FakeAccess::standard());
    let headers = [
        ("X-Remote-User", ""),
        ("X-Other-User", "alice"),
        ("X-Remote-Group", "a"),
        ("X-Remote-Group", ""),
        ("X-Other-Group", "b"),
        ("X-Other-Extra-K", "v"),
    ];
    let (status, _, body) = call(&auth, mk_req(PMS_SHOP, &headers, Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["user"], "alice");
    assert_eq!(body["groups"], json!(["a", "b", "system:authenticated"]));
    assert_eq!(body["extra"], json!({"k": ["v"]}));
    assert_eq!(body["headers"], json!([]));
}

#[tokio::test]
async fn front_proxy_certificate_failures_are_401() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&["front-proxy-client"]), &[], FakeAccess::standard());
    let cases = [
        ("other CA", mk_leaf(&w.other_ca, "front-proxy-client", &[], ClientAuth, false)),
        ("wrong CN", mk_leaf(&w.front_proxy_ca, "someone-else", &[], ClientAuth, false)),
        ("expired", mk_leaf(&w.front_proxy_ca, "front-proxy-client", &[], ClientAuth, true)),
        ("serverAuth only", mk_leaf(&w.front_proxy_ca, "front-proxy-client", &[], ServerAuth, false)),
    ];
    for (what, leaf) in cases {
        let (status, _, body) = call(&auth, mk_req(PMS_SHOP, ALICE_HEADERS, Some(vec![leaf.der]))).await;
        assert_eq!((status, &body), (StatusCode::UNAUTHORIZED, &unauthorized()), "{what}");
    }
}

#[tokio::test]
async fn any_cn_when_no_allowed_names() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    let leaf = mk_leaf(&w.front_proxy_ca, "someone-else", &[], ClientAuth, false);
    let (status, _, body) = call(&auth, mk_req(PMS_SHOP, ALICE_HEADERS, Some(vec![leaf.der]))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("alice")));
}

#[tokio::test]
async fn front_proxy_without_username_falls_through() {
    let w = mk_world();
    // The x509 authenticator then fails (the front proxy CA is not the client CA): 401.
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("X-Remote-Group", "g")], Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    // Without a client CA nothing fails: anonymous.
    let mut material = w.material(&[]);
    material.client_ca = None;
    let (auth, _) = mk_auth(material, &[], FakeAccess::standard());
    let (status, _, body) =
        call(&auth, mk_req("/healthz", &[("X-Remote-Group", "g")], Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["user"], "system:anonymous");
    assert_eq!(body["headers"], json!([]));
}

#[tokio::test]
async fn identity_headers_without_a_certificate_are_ignored_and_stripped() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    let (status, _, body) = call(&auth, mk_req("/healthz", ALICE_HEADERS, None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["user"], "system:anonymous");
    assert_eq!(body["groups"], json!(["system:unauthenticated"]));
    assert_eq!(body["headers"], json!([]));
    // Same with no request-header configuration at all: kube-apiserver's names are stripped.
    let (auth, _, _) = mk_plain_auth(&[]);
    let (_, _, body) = call(&auth, mk_req("/healthz", ALICE_HEADERS, None)).await;
    assert_eq!(body["headers"], json!([]));
}

// ---------------------------------------------------------------- x509

#[tokio::test]
async fn client_certificate_gives_cn_and_o() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&["front-proxy-client"]), &[], FakeAccess::standard());
    let leaf = mk_leaf(&w.client_ca, "alice", &["devs", "system:masters"], ClientAuth, false);
    let fingerprint: String = ring::digest::digest(&ring::digest::SHA256, leaf.der.as_ref())
        .as_ref()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    // Identity headers are not trusted from a client certificate.
    let (status, _, body) = call(&auth, mk_req(PMS_SHOP, ALICE_HEADERS, Some(vec![leaf.der]))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["user"], "alice");
    assert_eq!(body["uid"], "");
    assert_eq!(body["groups"], json!(["devs", "system:masters", "system:authenticated"]));
    assert_eq!(
        body["extra"],
        json!({"authentication.kubernetes.io/credential-id": [format!("X509SHA256={fingerprint}")]})
    );
    assert_eq!(body["headers"], json!([]));
}

#[tokio::test]
async fn client_certificate_failures() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    for (what, leaf) in [
        ("expired", mk_leaf(&w.client_ca, "alice", &[], ClientAuth, true)),
        ("other CA", mk_leaf(&w.other_ca, "alice", &[], ClientAuth, false)),
        ("serverAuth only", mk_leaf(&w.client_ca, "alice", &[], ServerAuth, false)),
    ] {
        let (status, _, _) = call(&auth, mk_req("/healthz", &[], Some(vec![leaf.der]))).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
    }
    // An empty CN is "not mine": anonymous (when no other authenticator failed).
    let mut material = w.material(&[]);
    material.request_header = None;
    let (auth, _) = mk_auth(material, &[], FakeAccess::standard());
    let leaf = mk_leaf(&w.client_ca, "", &["devs"], ClientAuth, false);
    let (status, _, body) = call(&auth, mk_req("/healthz", &[], Some(vec![leaf.der]))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("system:anonymous")));
}

#[tokio::test]
async fn client_certificate_through_an_intermediate_and_with_a_uid() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    let leaf = mk_cert(&w.client_ca, |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::CommonName, "alice");
        p.distinguished_name.push(rcgen::DnType::CustomDnType(vec![1, 3, 6, 1, 4, 1, 57683, 2]), "uid-9");
    });
    let (status, _, body) =
        call(&auth, mk_req(PMS_SHOP, &[], Some(vec![leaf.der, w.client_ca.der.clone()]))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["uid"], "uid-9");
}

#[test]
fn subject_parsing() {
    let ca = mk_ca("ca");
    let leaf = mk_cert(&ca, |p| {
        p.distinguished_name = rcgen::DistinguishedName::new();
        p.distinguished_name.push(rcgen::DnType::OrganizationName, "o1");
        p.distinguished_name
            .push(rcgen::DnType::CommonName, rcgen::DnValue::BmpString("bé".try_into().unwrap()));
        p.distinguished_name.push(
            rcgen::DnType::CustomDnType(vec![2, 5, 4, 10]),
            rcgen::DnValue::PrintableString("o2".try_into().unwrap()),
        );
    });
    let subject = x509::subject(leaf.der.as_ref()).unwrap();
    assert_eq!(subject.common_name, "bé");
    assert_eq!(subject.organizations, ["o1", "o2"]);
    assert!(x509::subject(b"\x30\x03\x02\x01").is_err());
    assert!(x509::subject(b"").is_err());
}

// ---------------------------------------------------------------- tokens and anonymous

#[tokio::test]
async fn bearer_tokens() {
    let (auth, tokens, _) = mk_plain_auth(&[]);
    let (status, _, body) =
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["user"], "alice");
    assert_eq!(body["uid"], "uid-alice");
    assert_eq!(body["groups"], json!(["system:authenticated"]));
    assert_eq!(body["headers"], json!([]));
    for bad in ["Bearer nobody", "Bearer expired", "Bearer broken"] {
        let (status, _, body) = call(&auth, mk_req("/healthz", &[("Authorization", bad)], None)).await;
        assert_eq!((status, body), (StatusCode::UNAUTHORIZED, unauthorized()), "{bad}");
    }
    // Not a bearer token: ignored, anonymous.
    let (status, _, body) = call(&auth, mk_req("/healthz", &[("Authorization", "Basic eDp5")], None)).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("system:anonymous")));
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 4);
}

#[tokio::test]
async fn a_valid_token_wins_over_a_failing_certificate() {
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], FakeAccess::standard());
    let leaf = mk_leaf(&w.other_ca, "mallory", &[], ClientAuth, false);
    let headers = [("Authorization", "Bearer alice-token")];
    let (status, _, body) = call(&auth, mk_req(PMS_SHOP, &headers, Some(vec![leaf.der]))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("alice")));
}

#[tokio::test]
async fn token_reviews_are_cached_for_both_outcomes_but_not_failures() {
    let (auth, tokens, _) = mk_plain_auth(&["--authentication-token-webhook-cache-ttl=300ms"]);
    for _ in 0..3 {
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await;
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer nobody")], None)).await;
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer broken")], None)).await;
    }
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 2 + 3);
    tokio::time::sleep(Duration::from_millis(400)).await;
    call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await;
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 6);
}

#[tokio::test]
async fn zero_ttls_disable_the_caches() {
    let (auth, tokens, access) = mk_plain_auth(&[
        "--authentication-token-webhook-cache-ttl=0",
        "--authorization-webhook-cache-authorized-ttl=0",
        "--authorization-webhook-cache-unauthorized-ttl=0",
    ]);
    for _ in 0..2 {
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await;
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer bob-token")], None)).await;
    }
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 4);
    assert_eq!(access.calls(), 4);
}

#[tokio::test]
async fn anonymous_on_and_off() {
    let (auth, _, _) = mk_plain_auth(&[]);
    let (status, _, body) = call(&auth, mk_req("/healthz", &[], None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(
        (body["user"].as_str(), &body["groups"]),
        (Some("system:anonymous"), &json!(["system:unauthenticated"]))
    );
    let (auth, _, _) = mk_plain_auth(&["--anonymous-auth=false"]);
    let (status, headers, body) = call(&auth, mk_req("/healthz", &[], None)).await;
    assert_eq!((status, body), (StatusCode::UNAUTHORIZED, unauthorized()));
    assert_eq!(headers[http::header::CONTENT_TYPE], "application/json");
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("Authorization", "Bearer alice-token")], None)).await;
    assert_eq!(status, StatusCode::OK);
}

// ---------------------------------------------------------------- authorization

#[tokio::test]
async fn the_401_403_matrix() {
    let (auth, _, _) = mk_plain_auth(&[]);
    let cases: &[(&str, Option<&str>, StatusCode)] = &[
        (PMS_SHOP, None, StatusCode::FORBIDDEN), // anonymous, denied
        (PMS_SHOP, Some("Bearer nobody"), StatusCode::UNAUTHORIZED), // bad token
        (PMS_SHOP, Some("Bearer bob-token"), StatusCode::FORBIDDEN), // denied
        (PMS_SHOP, Some("Bearer alice-token"), StatusCode::OK), // allowed
        ("/public", None, StatusCode::OK),       // anonymous, allowed
        ("/healthz", None, StatusCode::OK),      // always allowed
        ("/healthz", Some("Bearer nobody"), StatusCode::UNAUTHORIZED),
    ];
    for (path, authz, want) in cases {
        let headers: Vec<(&str, &str)> = authz.iter().map(|v| ("Authorization", *v)).collect();
        let (status, _, body) = call(&auth, mk_req(path, &headers, None)).await;
        assert_eq!(status, *want, "{path} {authz:?}: {body}");
    }
}

#[tokio::test]
async fn forbidden_messages_are_kubes() {
    let access = FakeAccess::new(|spec| {
        let reason =
            if spec.resource_attributes.as_ref().and_then(|r| r.namespace.as_deref()) == Some("other") {
                Some("no RBAC policy matched".to_owned())
            } else {
                None
            };
        Ok(SubjectAccessReviewStatus { allowed: false, reason, ..Default::default() })
    });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access);
    let bob = [("Authorization", "Bearer bob-token")];
    let pms = "podmetricssummaries.stats.une-tasse-de.cafe";
    let cases: &[(&str, &str, Value)] = &[
        (
            PMS_SHOP,
            "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"bob\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
            json!({"group": G, "kind": "podmetricssummaries"}),
        ),
        (
            "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries/x",
            "podmetricssummaries.stats.une-tasse-de.cafe \"x\" is forbidden: User \"bob\" cannot get resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
            json!({"group": G, "kind": "podmetricssummaries", "name": "x"}),
        ),
        (
            "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries",
            "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"bob\" cannot list resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" at the cluster scope",
            json!({"group": G, "kind": "podmetricssummaries"}),
        ),
        (
            "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/other/podmetricssummaries?watch=true",
            "podmetricssummaries.stats.une-tasse-de.cafe is forbidden: User \"bob\" cannot watch resource \"podmetricssummaries\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"other\": no RBAC policy matched",
            json!({"group": G, "kind": "podmetricssummaries"}),
        ),
        (
            "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries/x/status",
            "podmetricssummaries.stats.une-tasse-de.cafe \"x\" is forbidden: User \"bob\" cannot get resource \"podmetricssummaries/status\" in API group \"stats.une-tasse-de.cafe\" in the namespace \"shop\"",
            json!({"group": G, "kind": "podmetricssummaries", "name": "x"}),
        ),
        ("/foo", "forbidden: User \"bob\" cannot get path \"/foo\"", json!({})),
    ];
    for (path, message, details) in cases {
        let (status, headers, body) = call(&auth, mk_req(path, &bob, None)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
        assert_eq!(
            body,
            json!({
                "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": message, "reason": "Forbidden", "details": details, "code": 403
            }),
            "{path}"
        );
        assert_eq!(headers[http::header::CONTENT_TYPE], "application/json");
        assert_eq!(headers[http::header::X_CONTENT_TYPE_OPTIONS], "nosniff");
    }
    assert!(pms.starts_with("podmetricssummaries."));
}

#[tokio::test]
async fn review_specs_carry_the_user_and_the_attributes() {
    let access = FakeAccess::standard();
    let w = mk_world();
    let (auth, _) = mk_auth(w.material(&[]), &[], access.clone());
    let path = "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries?fieldSelector=metadata.name%3Dweb-1";
    let (status, _, _) = call(&auth, mk_req(path, ALICE_HEADERS, Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::OK);
    call(&auth, mk_req("/openapi/v2", &[("X-Remote-User", "alice")], Some(w.front_proxy()))).await;
    let specs = access.specs.lock().unwrap().clone();
    assert_eq!(
        serde_json::to_value(&specs[0]).unwrap(),
        json!({
            "user": "alice", "uid": "u-123", "groups": ["devs", "ops", "system:authenticated"],
            "extra": {"acme.com/project": ["p1", "p2"], "bad%zz": ["raw"], "scopes": ["s"]},
            "resourceAttributes": {
                "namespace": "shop", "verb": "list", "group": G, "version": "v1alpha1",
                "resource": "podmetricssummaries", "name": "web-1",
                "fieldSelector": {"requirements": [{"key": "metadata.name", "operator": "In", "values": ["web-1"]}]}
            }
        })
    );
    assert_eq!(
        serde_json::to_value(&specs[1]).unwrap(),
        json!({
            "user": "alice", "groups": ["system:authenticated"],
            "nonResourceAttributes": {"path": "/openapi/v2", "verb": "get"}
        })
    );
}

#[tokio::test]
async fn always_allow_paths_skip_the_review_only_when_exact() {
    let (auth, _, access) = mk_plain_auth(&[]);
    for path in ["/healthz", "/readyz", "/livez", "/livez?verbose"] {
        let (status, _, _) = call(&auth, mk_req(path, &[], None)).await;
        assert_eq!(status, StatusCode::OK, "{path}");
    }
    assert_eq!(access.calls(), 0);
    let (status, _, body) = call(&auth, mk_req("/livez/ping", &[], None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(body["message"], "forbidden: User \"system:anonymous\" cannot get path \"/livez/ping\"");
    assert_eq!(access.calls(), 1);

    let (auth, _, access) = mk_plain_auth(&["--authorization-always-allow-paths=/metrics*"]);
    let (status, _, _) = call(&auth, mk_req("/metrics/x", &[], None)).await;
    assert_eq!(status, StatusCode::OK);
    let (status, _, _) = call(&auth, mk_req("/healthz", &[], None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(access.calls(), 1);

    let err = Auth::new(
        &mk_args(&["--authorization-always-allow-paths=/a*b"]),
        Trust::fixed(TrustMaterial::default()),
        Arc::new(FakeTokens::default()),
        FakeAccess::standard(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("only trailing *"), "{err}");
}

#[tokio::test]
async fn always_allow_paths_do_not_cover_resources() {
    let (auth, _, access) = mk_plain_auth(&["--authorization-always-allow-paths=/apis*"]);
    let (status, _, _) = call(&auth, mk_req(PMS_SHOP, &[], None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, _, _) = call(&auth, mk_req("/apis/stats.une-tasse-de.cafe/v1alpha1", &[], None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(access.calls(), 1);
}

#[tokio::test]
async fn masters_bypass_the_review() {
    let access = FakeAccess::new(|_| Ok(SubjectAccessReviewStatus::default()));
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    let (status, _, body) =
        call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer root-token")], None)).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(body["groups"], json!(["system:masters", "system:authenticated"]));
    assert_eq!(access.calls(), 0);
    // Configurable: with another list, masters get reviewed.
    let (auth, _) =
        mk_auth(TrustMaterial::default(), &["--authorization-always-allow-groups=admins"], access.clone());
    let (status, _, _) = call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer root-token")], None)).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    assert_eq!(access.calls(), 1);
}

#[tokio::test]
async fn review_failures_are_500_and_not_cached() {
    let access = FakeAccess::new(|spec| match spec.user.as_deref() {
        Some("alice") => Err("connection refused to 10.0.0.1".into()),
        _ => Ok(SubjectAccessReviewStatus { allowed: true, denied: Some(true), ..Default::default() }),
    });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    for _ in 0..2 {
        let (status, _, body) =
            call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await;
        assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
        assert_eq!(body["reason"], "InternalError");
        assert!(!body.to_string().contains("10.0.0.1"), "{body}");
    }
    assert_eq!(access.calls(), 2);
    // Allowed and denied at once: an error too.
    let (status, _, _) = call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer bob-token")], None)).await;
    assert_eq!(status, StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn an_unreachable_authorizer_is_503_for_unknown_decisions_and_stale_for_known_ones() {
    let access = FakeAccess::standard();
    let (auth, _) = mk_auth(
        TrustMaterial::default(),
        &[
            "--authorization-webhook-cache-authorized-ttl=200ms",
            "--authorization-webhook-cache-unauthorized-ttl=200ms",
        ],
        access.clone(),
    );
    let alice = [("Authorization", "Bearer alice-token")];
    let bob = [("Authorization", "Bearer bob-token")];
    let all = "/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries";
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &bob, None)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(access.calls(), 2);

    // kube-apiserver goes away and both decisions expire: the last known ones still apply.
    access.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    for _ in 0..5 {
        assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
        let (status, _, body) = call(&auth, mk_req(PMS_SHOP, &bob, None)).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "a stale denial stays a denial: {body}");
    }
    assert!(access.calls() > 2, "the expired decisions were reviewed again");
    // A decision never made is a 503 naming the authorizer, with a Retry-After.
    let (status, headers, body) = call(&auth, mk_req(all, &alice, None)).await;
    assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert_eq!(
        body,
        json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": AUTHORIZER_UNAVAILABLE, "reason": "ServiceUnavailable",
            "details": {"retryAfterSeconds": 1}, "code": 503
        })
    );
    assert_eq!(headers["retry-after"], "1");

    // Back: the next reviews answer, the new decision is made, the old ones are fresh again.
    access.down.store(false, Ordering::SeqCst);
    // Let a background review started by the last stale answer end first.
    tokio::time::sleep(Duration::from_millis(50)).await;
    let before = access.calls();
    assert_eq!(call(&auth, mk_req(all, &alice, None)).await.0, StatusCode::OK);
    assert_eq!(access.calls(), before + 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
    assert_eq!(access.calls(), before + 2, "reviewed synchronously again once reachable");
}

/// The context of a request without `?timeout=` from no known address.
fn mk_context() -> ReviewContext {
    ReviewContext::new(None, None)
}

/// A user of the given name, without groups.
fn mk_user(name: &str) -> UserInfo {
    UserInfo { name: name.into(), ..Default::default() }
}

/// The value of the series `series` (name and labels) in a text exposition.
fn mk_metric(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `auth`'s metrics as the server exports them, under the namespace `example`.
fn mk_exported(auth: &Auth) -> String {
    let metrics = crate::Metrics::new("example");
    metrics.export_auth(auth.metrics());
    metrics.encode()
}

#[tokio::test]
async fn stale_decisions_are_served_only_within_the_window_and_only_for_unreachability() {
    let access = FakeAccess::standard();
    let (auth, _) = mk_auth(
        TrustMaterial::default(),
        &[
            "--authorization-webhook-cache-authorized-ttl=100ms",
            "--authorization-webhook-stale-if-error=600ms",
        ],
        access.clone(),
    );
    let (alice, context) = (mk_user("alice"), mk_context());
    let info = RequestInfo::new(&http::Method::GET, PMS_SHOP, None).unwrap();
    let decide = || auth.authorizer.authorize(&alice, &info, PMS_SHOP, &context);
    assert_eq!(decide().await.unwrap(), Decision::Allow);
    let exported = mk_exported(&auth);
    assert_eq!(mk_metric(&exported, "example_authorization_webhook_unreachable"), Some(0.0), "{exported}");
    access.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(decide().await.unwrap(), Decision::Allow, "within the window: the last decision");
    let exported = mk_exported(&auth);
    assert_eq!(mk_metric(&exported, "example_authorization_webhook_unreachable"), Some(1.0));
    assert_eq!(
        mk_metric(&exported, "example_authorization_stale_decisions_total{decision=\"allowed\"}"),
        Some(1.0),
        "{exported}"
    );
    // Past the window (600 ms after the last successful review): no decision.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(matches!(decide().await, Err(authz::AuthorizeError::Unavailable(_))));

    // Only unreachability is covered by a stale decision (other failures stay 500s, see
    // review_failures_are_500_and_not_cached; a 429 is a 429, see
    // kube_apiserver_429_asks_to_slow_down_and_is_no_outage).
    assert!(!ReviewError::NoStatus.is_unreachable() && !ReviewError::Other("x".into()).is_unreachable());
    assert!(!ReviewError::SlowDown { retry_after: Duration::from_secs(1) }.is_unreachable());
    assert!(ReviewError::Timeout(REVIEW_TIMEOUT).is_unreachable());

    // 0 turns stale-if-error off: a decision known a moment ago is not served.
    let access = FakeAccess::standard();
    let (auth, _) = mk_auth(
        TrustMaterial::default(),
        &["--authorization-webhook-cache-authorized-ttl=0", "--authorization-webhook-stale-if-error=0"],
        access.clone(),
    );
    let decide = || auth.authorizer.authorize(&alice, &info, PMS_SHOP, &context);
    assert_eq!(decide().await.unwrap(), Decision::Allow);
    access.down.store(true, Ordering::SeqCst);
    assert!(matches!(decide().await, Err(authz::AuthorizeError::Unavailable(_))));
}

#[tokio::test]
async fn a_permission_revoked_during_an_outage_ends_with_the_window() {
    // The policy can change while kube-apiserver is away: alice loses her rights.
    let revoked = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let access = {
        let revoked = Arc::clone(&revoked);
        FakeAccess::new(move |spec| {
            let allowed = spec.user.as_deref() == Some("alice") && !revoked.load(Ordering::SeqCst);
            Ok(SubjectAccessReviewStatus { allowed, ..Default::default() })
        })
    };
    let (auth, _) = mk_auth(
        TrustMaterial::default(),
        &[
            "--authorization-webhook-cache-authorized-ttl=100ms",
            "--authorization-webhook-cache-unauthorized-ttl=100ms",
            "--authorization-webhook-stale-if-error=700ms",
        ],
        access.clone(),
    );
    let alice = [("Authorization", "Bearer alice-token")];
    let reviewed = std::time::Instant::now();
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
    access.down.store(true, Ordering::SeqCst);
    revoked.store(true, Ordering::SeqCst);
    // Until the window ends the last decision stands; from then on she is refused.
    let mut seen = Vec::new();
    while reviewed.elapsed() < Duration::from_millis(1100) {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let status = call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0;
        let at = reviewed.elapsed();
        if at > Duration::from_millis(750) {
            assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE, "at {at:?}, past the window");
        }
        seen.push(status);
    }
    assert_eq!(seen.first(), Some(&StatusCode::OK), "within the window: {seen:?}");
    // kube-apiserver back: the revocation is reviewed and applies.
    access.down.store(false, Ordering::SeqCst);
    let back = std::time::Instant::now();
    loop {
        let status = call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0;
        if status == StatusCode::FORBIDDEN {
            break;
        }
        assert_eq!(status, StatusCode::SERVICE_UNAVAILABLE);
        assert!(back.elapsed() < Duration::from_secs(2), "no 403 after kube-apiserver came back");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test]
async fn a_cancelled_review_records_nothing_and_an_answered_error_ends_unreachability() {
    let access = Arc::new(FakeAccess {
        down: std::sync::atomic::AtomicBool::new(true),
        delay: Duration::from_millis(300),
        ..FakeAccess::with_rule(|spec: &SubjectAccessReviewSpec| match spec.user.as_deref() {
            Some("carol") => Err("the review was refused".into()),
            _ => standard_rule(spec),
        })
    });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    let info = RequestInfo::new(&http::Method::GET, PMS_SHOP, None).unwrap();
    let context = mk_context();
    let authorize = |user: &str| {
        let user = mk_user(user);
        let (auth, info, context) = (auth.clone(), info.clone(), context.clone());
        async move { auth.authorizer.authorize(&user, &info, PMS_SHOP, &context).await }
    };

    // A request whose deadline ends before its review: nobody waits for the review any more,
    // so it is dropped, and what it would have found is not recorded.
    assert!(tokio::time::timeout(Duration::from_millis(100), authorize("alice")).await.is_err());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((access.calls(), auth.authorizer.flights()), (1, 0));
    assert_eq!(
        mk_metric(&mk_exported(&auth), "example_authorization_subject_access_reviews_cancelled_total"),
        Some(1.0)
    );
    // So the next request waits for its own review, which finds kube-apiserver unreachable.
    let started = std::time::Instant::now();
    assert!(matches!(authorize("bob").await, Err(authz::AuthorizeError::Unavailable(_))));
    assert!(started.elapsed() >= Duration::from_millis(300), "{:?}", started.elapsed());
    // kube-apiserver is now known to be unreachable: a decision not known is a 503 at once.
    let started = std::time::Instant::now();
    assert!(matches!(authorize("dave").await, Err(authz::AuthorizeError::Unavailable(_))));
    assert!(started.elapsed() < Duration::from_millis(150), "{:?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The API answers again, with an error for carol's review (run by the background probe):
    // an answer ends the unreachable state, so erin is reviewed again (a denial, not a 503).
    access.down.store(false, Ordering::SeqCst);
    assert!(matches!(authorize("carol").await, Err(authz::AuthorizeError::Unavailable(_))));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let calls = access.calls();
    assert_eq!(authorize("erin").await.unwrap(), Decision::Forbid(String::new()));
    assert_eq!(access.calls(), calls + 1, "erin's decision was reviewed");
}

#[tokio::test]
async fn decisions_are_cached_separately_by_outcome() {
    let (auth, _, access) = mk_plain_auth(&[
        "--authorization-webhook-cache-authorized-ttl=10s",
        "--authorization-webhook-cache-unauthorized-ttl=300ms",
    ]);
    let alice = [("Authorization", "Bearer alice-token")];
    let bob = [("Authorization", "Bearer bob-token")];
    for _ in 0..3 {
        assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
        assert_eq!(call(&auth, mk_req(PMS_SHOP, &bob, None)).await.0, StatusCode::FORBIDDEN);
    }
    assert_eq!(access.calls(), 2);
    // Another request is another key.
    call(&auth, mk_req("/apis/stats.une-tasse-de.cafe/v1alpha1/podmetricssummaries", &alice, None)).await;
    assert_eq!(access.calls(), 3);
    // The denial expires, the allowance does not.
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
    assert_eq!(access.calls(), 3);
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &bob, None)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(access.calls(), 4);

    // And the other way round.
    let (auth, _, access) = mk_plain_auth(&[
        "--authorization-webhook-cache-authorized-ttl=300ms",
        "--authorization-webhook-cache-unauthorized-ttl=10s",
    ]);
    call(&auth, mk_req(PMS_SHOP, &alice, None)).await;
    call(&auth, mk_req(PMS_SHOP, &bob, None)).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    call(&auth, mk_req(PMS_SHOP, &alice, None)).await;
    call(&auth, mk_req(PMS_SHOP, &bob, None)).await;
    assert_eq!(access.calls(), 3);
}

#[tokio::test]
async fn selector_attributes_are_sent_and_key_the_cache() {
    let (auth, _, access) = mk_plain_auth(&[]);
    let alice = [("Authorization", "Bearer alice-token")];
    let get = |query: &str| mk_req(&format!("{PMS_SHOP}?{query}"), &alice, None);
    // Three spellings of one requirement: one review.
    for query in ["labelSelector=app%3Dx", "labelSelector=app%3D%3Dx&limit=500", "labelSelector=app+in+(x)"] {
        assert_eq!(call(&auth, get(query)).await.0, StatusCode::OK, "{query}");
    }
    assert_eq!(access.calls(), 1);
    // Another value, another operator, a field selector: other reviews.
    for query in [
        "labelSelector=app%3Dy",
        "labelSelector=app!%3Dx",
        "labelSelector=app%3Dx&fieldSelector=metadata.namespace%3Dshop",
    ] {
        assert_eq!(call(&auth, get(query)).await.0, StatusCode::OK, "{query}");
    }
    assert_eq!(access.calls(), 4);
    // A requirement that is dropped (`>`) is the plain list's review.
    call(&auth, mk_req(PMS_SHOP, &alice, None)).await;
    call(&auth, get("labelSelector=replicas%3E1")).await;
    assert_eq!(access.calls(), 5);
    let specs = access.specs.lock().unwrap().clone();
    let sent: Vec<Value> =
        specs.iter().map(|s| serde_json::to_value(&s.resource_attributes).unwrap()).collect();
    let attributes = |extra: Value| {
        let mut a = json!({"namespace": "shop", "verb": "list", "group": G, "version": "v1alpha1", "resource": "podmetricssummaries"});
        a.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        a
    };
    let label = |op: &str, v: &str| json!({"labelSelector": {"requirements": [{"key": "app", "operator": op, "values": [v]}]}});
    assert_eq!(
        sent,
        [
            attributes(label("In", "x")),
            attributes(label("In", "y")),
            attributes(label("NotIn", "x")),
            attributes(json!({
                "labelSelector": {"requirements": [{"key": "app", "operator": "In", "values": ["x"]}]},
                "fieldSelector": {"requirements": [{"key": "metadata.namespace", "operator": "In", "values": ["shop"]}]}
            })),
            attributes(json!({})),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_identical_reviews_make_one_call() {
    let access =
        Arc::new(FakeAccess { delay: Duration::from_millis(200), ..FakeAccess::with_rule(standard_rule) });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    let statuses = all_at_once(16, |_| {
        let auth = auth.clone();
        async move { call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await.0 }
    });
    assert_eq!(statuses.await, [StatusCode::OK; 16]);
    assert_eq!(access.calls(), 1);
}

// ---------------------------------------------------------------- bounds on reviews

/// [`mk_req`] from the client address `addr` (as the serving loop marks every request).
fn mk_req_from(path: &str, headers: &[(&str, &str)], addr: &str) -> http::Request<Body> {
    let mut request = mk_req(path, headers, None);
    request.extensions_mut().insert(ClientAddr(addr.parse().unwrap()));
    request
}

/// Waits (5 s at most) until `hold` holds `n` reviews.
async fn mk_held(hold: &Hold, n: usize) {
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while hold.running() != n {
        assert!(std::time::Instant::now() < deadline, "{} reviews held, not {n}", hold.running());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// Asserts `at` is within `[due, due + 150 ms)`: timers fire late, never early.
#[track_caller]
fn assert_at(at: Duration, due: Duration, what: &str) {
    assert!(at >= due && at < due + Duration::from_millis(150), "{what} at {at:?}, due {due:?}");
}

#[tokio::test]
async fn reviews_wait_their_turn_for_the_rate_and_are_refused_past_the_wait() {
    // 2.2 per second (a token every 455 ms from the start), 3 at once: of 20 requests arriving
    // together, 3 are reviewed at once, the next 2 when their token comes within the second
    // a review may wait, in arrival order; the other 15 get a 429 after that second.
    let created = std::time::Instant::now();
    let (auth, _, access) =
        mk_plain_auth(&["--authorization-webhook-qps=2.2", "--authorization-webhook-burst=3"]);
    let tasks: Vec<_> = (0..20)
        .map(|i| {
            let auth = auth.clone();
            tokio::spawn(async move {
                let (status, headers, body) = call(&auth, mk_req(&format!("/unique/{i}"), &[], None)).await;
                (status, headers.get("retry-after").cloned(), body, created.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.push(task.await.unwrap());
    }
    let dues = [0, 0, 0, 455, 910];
    for (i, (status, retry_after, body, at)) in answers.iter().enumerate() {
        if let Some(due) = dues.get(i) {
            assert_eq!(*status, StatusCode::FORBIDDEN, "request {i}: {body}");
            assert_at(*at, Duration::from_millis(*due), &format!("request {i}"));
        } else {
            assert_eq!(*status, StatusCode::TOO_MANY_REQUESTS, "request {i}: {body}");
            assert_eq!(retry_after.as_ref().map(|v| v.to_str().unwrap()), Some("1"));
            assert_eq!(
                *body,
                json!({
                    "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                    "message": "Too many requests, please try again later.", "reason": "TooManyRequests",
                    "details": {"retryAfterSeconds": 1}, "code": 429
                })
            );
            assert_at(*at, Duration::from_secs(1), &format!("request {i}, refused after the longest wait,"));
        }
    }
    assert_eq!(access.calls(), 5);
    let exported = mk_exported(&auth);
    for (series, value) in [
        ("example_authorization_subject_access_reviews_total{outcome=\"success\"}", 5.0),
        ("example_authorization_subject_access_reviews_refused_total{reason=\"rate\"}", 15.0),
        ("example_authorization_subject_access_reviews_in_flight", 0.0),
    ] {
        assert_eq!(mk_metric(&exported, series), Some(value), "{series}\n{exported}");
    }

    // A request's own ?timeout= shortens the wait: half of 400 ms, then a 429.
    let (auth, _, access) =
        mk_plain_auth(&["--authorization-webhook-qps=1", "--authorization-webhook-burst=1"]);
    assert_eq!(call(&auth, mk_req("/first", &[], None)).await.0, StatusCode::FORBIDDEN);
    let started = std::time::Instant::now();
    assert_eq!(
        call(&auth, mk_req("/second?timeout=400ms", &[], None)).await.0,
        StatusCode::TOO_MANY_REQUESTS
    );
    assert_at(started.elapsed(), Duration::from_millis(200), "the refusal");
    assert_eq!(access.calls(), 1);
}

#[tokio::test]
async fn outstanding_reviews_are_bounded_and_one_identity_holds_a_quarter() {
    let hold = Hold::new();
    let access = Arc::new(FakeAccess { hold: Some(hold.clone()), ..FakeAccess::with_rule(standard_rule) });
    let (auth, _) =
        mk_auth(TrustMaterial::default(), &["--authorization-webhook-max-inflight=8"], access.clone());
    let spawn = |path: String, token: Option<&'static str>| {
        let auth = auth.clone();
        tokio::spawn(async move {
            let headers: Vec<(&str, String)> =
                token.map(|t| ("Authorization", format!("Bearer {t}"))).into_iter().collect();
            let headers: Vec<(&str, &str)> = headers.iter().map(|(k, v)| (*k, v.as_str())).collect();
            call(&auth, mk_req(&path, &headers, None)).await.0
        })
    };
    // Anonymous (one identity, whoever sends it): two reviews of 8, the third refused at once.
    let mut held = vec![spawn("/unique/1".into(), None), spawn("/unique/2".into(), None)];
    mk_held(&hold, 2).await;
    let (status, headers, _) = call(&auth, mk_req("/unique/3", &[], None)).await;
    assert_eq!((status, headers["retry-after"].to_str().unwrap()), (StatusCode::TOO_MANY_REQUESTS, "1"));
    // The other identities still get theirs, up to the bound.
    for token in ["alice-token", "bob-token", "carol-token"] {
        held.extend((0..2).map(|i| spawn(format!("{PMS_SHOP}/{token}-{i}"), Some(token))));
    }
    mk_held(&hold, 8).await;
    let (status, _, _) = call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer dave-token")], None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);
    let exported = mk_exported(&auth);
    for (series, value) in [
        ("example_authorization_subject_access_reviews_in_flight", 8.0),
        ("example_authorization_subject_access_reviews_refused_total{reason=\"per_client\"}", 1.0),
        ("example_authorization_subject_access_reviews_refused_total{reason=\"inflight\"}", 1.0),
    ] {
        assert_eq!(mk_metric(&exported, series), Some(value), "{series}\n{exported}");
    }
    hold.release();
    let mut statuses = Vec::new();
    for task in held {
        statuses.push(task.await.unwrap().as_u16());
    }
    assert_eq!(statuses, [403, 403, 200, 200, 403, 403, 403, 403]);
    assert_eq!((access.calls(), auth.authorizer.gate_outstanding()), (8, 0));
    assert_eq!(
        mk_metric(&mk_exported(&auth), "example_authorization_subject_access_reviews_in_flight"),
        Some(0.0)
    );
}

#[tokio::test]
async fn token_reviews_are_shared_out_by_client_address() {
    let hold = Hold::new();
    let tokens = Arc::new(FakeTokens { hold: Some(hold.clone()), ..FakeTokens::default() });
    let auth = Auth::new(
        &mk_args(&["--authentication-token-webhook-max-inflight=8"]),
        Trust::fixed(TrustMaterial::default()),
        tokens.clone(),
        FakeAccess::standard(),
    )
    .unwrap();
    let spawn = |token: String, addr: Option<&'static str>| {
        let auth = auth.clone();
        tokio::spawn(async move {
            let header = [("Authorization", format!("Bearer {token}"))];
            let headers: Vec<(&str, &str)> = header.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let request = match addr {
                Some(addr) => mk_req_from(PMS_SHOP, &headers, addr),
                None => mk_req(PMS_SHOP, &headers, None),
            };
            let (status, headers, _) = call(&auth, request).await;
            (status.as_u16(), headers.get("retry-after").map(|v| v.to_str().unwrap().to_owned()))
        })
    };
    // Random tokens from one pod: two reviews (a quarter of 8), then 429s; another pod, and
    // the clients whose address is unknown (one share between them), still get theirs.
    let mut held: Vec<_> = (0..2).map(|i| spawn(format!("random-{i}"), Some("10.0.0.1:40000"))).collect();
    mk_held(&hold, 2).await;
    assert_eq!(spawn("random-2".into(), Some("10.0.0.1:40001")).await.unwrap(), (429, Some("1".to_owned())));
    held.push(spawn("random-3".into(), Some("10.0.0.2:40000")));
    held.extend((4..6).map(|i| spawn(format!("random-{i}"), None)));
    mk_held(&hold, 5).await;
    assert_eq!(spawn("random-6".into(), None).await.unwrap().0, 429);
    hold.release();
    for task in held {
        assert_eq!(task.await.unwrap(), (401, None));
    }
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 5);
    let exported = mk_exported(&auth);
    assert_eq!(
        mk_metric(&exported, "example_authentication_token_reviews_refused_total{reason=\"per_client\"}"),
        Some(2.0),
        "{exported}"
    );
    assert_eq!(
        mk_metric(&exported, "example_authentication_token_reviews_total{outcome=\"success\"}"),
        Some(5.0)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_review_is_shared_while_a_request_waits_and_cancelled_when_none_does() {
    let hold = Hold::new();
    let access = Arc::new(FakeAccess { hold: Some(hold.clone()), ..FakeAccess::with_rule(standard_rule) });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    let alice = || mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None);
    // Eight requests of one decision, started together: one review.
    let barrier = Arc::new(tokio::sync::Barrier::new(8));
    let mut waiters: Vec<_> = (0..8)
        .map(|_| {
            let (auth, barrier, request) = (auth.clone(), barrier.clone(), alice());
            tokio::spawn(async move {
                barrier.wait().await;
                call(&auth, request).await.0
            })
        })
        .collect();
    mk_held(&hold, 1).await;
    // Let every waiter join the review before the first ones leave.
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(access.calls(), 1);
    // The first five go away (the one driving the review among them): the review goes on for
    // the other three, neither restarted nor dropped.
    for waiter in waiters.drain(..5) {
        waiter.abort();
        assert!(waiter.await.unwrap_err().is_cancelled());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((hold.running(), hold.cancelled.load(Ordering::SeqCst)), (1, 0));
    hold.release();
    for waiter in waiters {
        assert_eq!(waiter.await.unwrap(), StatusCode::OK);
    }
    assert_eq!((access.calls(), hold.finished.load(Ordering::SeqCst)), (1, 1));
    assert_eq!(
        mk_metric(&mk_exported(&auth), "example_authorization_subject_access_reviews_cancelled_total"),
        Some(0.0)
    );

    // Every request of a review goes away: the review is dropped, nothing keeps running, and
    // its slot is free again.
    let hold = Hold::new();
    let access = Arc::new(FakeAccess { hold: Some(hold.clone()), ..FakeAccess::with_rule(standard_rule) });
    let tokens = Arc::new(FakeTokens { hold: Some(hold.clone()), ..FakeTokens::default() });
    let auth =
        Auth::new(&mk_args(&[]), Trust::fixed(TrustMaterial::default()), tokens.clone(), access.clone())
            .unwrap();
    let waiters: Vec<_> = (0..4)
        .map(|i| {
            let auth = auth.clone();
            // Two of a SubjectAccessReview (anonymous), two of a TokenReview.
            let request = if i < 2 {
                mk_req("/held", &[], None)
            } else {
                mk_req(PMS_SHOP, &[("Authorization", "Bearer held-token")], None)
            };
            tokio::spawn(async move { call(&auth, request).await.0 })
        })
        .collect();
    mk_held(&hold, 2).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    for waiter in waiters {
        waiter.abort();
        let _ = waiter.await;
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!((hold.running(), hold.cancelled.load(Ordering::SeqCst)), (0, 2), "both reviews dropped");
    assert_eq!((access.calls(), tokens.calls.load(Ordering::SeqCst)), (1, 1));
    assert_eq!((auth.authorizer.flights(), auth.authorizer.gate_outstanding()), (0, 0));
    let exported = mk_exported(&auth);
    for series in [
        "example_authorization_subject_access_reviews_cancelled_total",
        "example_authentication_token_reviews_cancelled_total",
    ] {
        assert_eq!(mk_metric(&exported, series), Some(1.0), "{series}\n{exported}");
    }
    for series in [
        "example_authorization_subject_access_reviews_in_flight",
        "example_authentication_token_reviews_in_flight",
    ] {
        assert_eq!(mk_metric(&exported, series), Some(0.0), "{series}\n{exported}");
    }
    // The next request reviews anew.
    hold.release();
    assert_eq!(call(&auth, mk_req("/held", &[], None)).await.0, StatusCode::FORBIDDEN);
    assert_eq!(access.calls(), 2);
}

#[tokio::test]
async fn unique_denied_keys_and_random_tokens_leave_the_allowed_ones_cached() {
    let (auth, tokens, access) = mk_plain_auth(&[
        "--authorization-webhook-qps=1000000",
        "--authorization-webhook-burst=1000000",
        "--authentication-token-webhook-qps=1000000",
        "--authentication-token-webhook-burst=1000000",
        "--authorization-webhook-cache-authorized-ttl=10m",
        "--authorization-webhook-cache-unauthorized-ttl=10m",
        "--authentication-token-webhook-cache-ttl=10m",
    ]);
    // Allowed decisions and authenticated tokens of the identities served.
    let known = |i: usize| {
        let token = format!("Bearer user{}-token", i % 50);
        let path = format!("{PMS_SHOP}/pod-{i}");
        (token, path)
    };
    let alice = [("Authorization", "Bearer alice-token")];
    for i in 0..100 {
        assert_eq!(call(&auth, mk_req(&format!("{PMS_SHOP}/pod-{i}"), &alice, None)).await.0, StatusCode::OK);
        let (token, path) = known(i);
        assert_eq!(
            call(&auth, mk_req(&path, &[("Authorization", &token)], None)).await.0,
            StatusCode::FORBIDDEN
        );
    }
    let (reviews, token_reviews) = (access.calls(), tokens.calls.load(Ordering::SeqCst));
    assert_eq!((reviews, token_reviews), (200, 51));
    // A flood: 20,000 unique denied keys (anonymous, unique paths) and 20,000 random tokens.
    for i in 0..20_000 {
        assert_eq!(call(&auth, mk_req(&format!("/unique/{i}"), &[], None)).await.0, StatusCode::FORBIDDEN);
        let token = format!("Bearer random-{i}");
        assert_eq!(
            call(&auth, mk_req(PMS_SHOP, &[("Authorization", &token)], None)).await.0,
            StatusCode::UNAUTHORIZED
        );
    }
    auth.authorizer.run_pending_tasks().await;
    auth.tokens.run_pending_tasks().await;
    assert_eq!(
        (access.calls(), tokens.calls.load(Ordering::SeqCst)),
        (reviews + 20_000, token_reviews + 20_000)
    );
    // Every allowed decision and authenticated token is still cached: no new review.
    for i in 0..100 {
        assert_eq!(call(&auth, mk_req(&format!("{PMS_SHOP}/pod-{i}"), &alice, None)).await.0, StatusCode::OK);
    }
    assert_eq!(access.calls(), reviews + 20_000, "allowed decisions were evicted");
    for i in 0..50 {
        let (token, _) = known(i);
        call(&auth, mk_req("/healthz", &[("Authorization", &token)], None)).await;
    }
    assert_eq!(
        tokens.calls.load(Ordering::SeqCst),
        token_reviews + 20_000,
        "authenticated tokens were evicted"
    );
}

#[tokio::test]
async fn kube_apiserver_429_asks_to_slow_down_and_is_no_outage() {
    let access =
        Arc::new(FakeAccess { slow_downs: AtomicUsize::new(1), ..FakeAccess::with_rule(standard_rule) });
    // A 2.5 s budget: attempts 1 s apart (kube-apiserver's Retry-After) fit three times.
    let retry = super::limit::RetryPolicy { budget: Duration::from_millis(2500), ..Default::default() };
    let auth = Auth::with_retries(
        &mk_args(&[
            "--authorization-webhook-cache-authorized-ttl=0",
            "--authorization-webhook-cache-unauthorized-ttl=0",
        ]),
        Trust::fixed(TrustMaterial::default()),
        Arc::new(FakeTokens::default()),
        access.clone(),
        retry,
    )
    .unwrap();
    let alice = [("Authorization", "Bearer alice-token")];
    // Once: the review is made again after the Retry-After, and the request is served.
    let started = std::time::Instant::now();
    assert_eq!(call(&auth, mk_req(PMS_SHOP, &alice, None)).await.0, StatusCode::OK);
    assert_at(started.elapsed(), Duration::from_secs(1), "the answer");
    assert_eq!(access.calls(), 2);
    let times = access.called_at.lock().unwrap().clone();
    assert_at(times[1] - times[0], Duration::from_secs(1), "the second attempt");

    // To the end of the review's budget: 429 with kube-apiserver's Retry-After, not 503, and
    // no stale-if-error: alice's decision of a moment ago is not served.
    access.slow_downs.store(usize::MAX, Ordering::SeqCst);
    let calls = access.calls();
    let started = std::time::Instant::now();
    let (status, headers, body) = call(&auth, mk_req(PMS_SHOP, &alice, None)).await;
    assert_eq!(
        (status, headers["retry-after"].to_str().unwrap()),
        (StatusCode::TOO_MANY_REQUESTS, "1"),
        "{body}"
    );
    assert_eq!(body["details"]["retryAfterSeconds"], 1);
    // Attempts at 0, 1 and 2 s; a fourth would come after the budget.
    assert_eq!(access.calls() - calls, 3);
    assert_at(started.elapsed(), Duration::from_secs(2), "the 429");
    let exported = mk_exported(&auth);
    for (series, value) in [
        ("example_authorization_webhook_unreachable", 0.0),
        ("example_authorization_subject_access_reviews_total{outcome=\"throttled\"}", 4.0),
        ("example_authorization_subject_access_reviews_total{outcome=\"success\"}", 1.0),
        ("example_authorization_subject_access_reviews_refused_total{reason=\"apiserver\"}", 1.0),
    ] {
        assert_eq!(mk_metric(&exported, series), Some(value), "{series}\n{exported}");
    }
    assert!(!exported.contains("example_authorization_stale_decisions_total{"), "{exported}");
    // Nor for the next identity: a 429, never the 503 of an unreachable authorizer.
    let (status, _, _) = call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer bob-token")], None)).await;
    assert_eq!(status, StatusCode::TOO_MANY_REQUESTS);

    // A TokenReview answered 429 to the end: 429, not 401 (nothing says the token is bad).
    let tokens = Arc::new(FakeTokens::default());
    let auth = Auth::with_retries(
        &mk_args(&[]),
        Trust::fixed(TrustMaterial::default()),
        tokens.clone(),
        FakeAccess::standard(),
        retry,
    )
    .unwrap();
    let started = std::time::Instant::now();
    let (status, headers, _) = call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer slow")], None)).await;
    assert_eq!((status, headers["retry-after"].to_str().unwrap()), (StatusCode::TOO_MANY_REQUESTS, "1"));
    assert_eq!(tokens.calls.load(Ordering::SeqCst), 3);
    assert_at(started.elapsed(), Duration::from_secs(2), "the 429");
    let exported = mk_exported(&auth);
    assert_eq!(
        mk_metric(&exported, "example_authentication_token_reviews_refused_total{reason=\"apiserver\"}"),
        Some(1.0),
        "{exported}"
    );
}

#[test]
fn the_rate_flags_refuse_what_is_not_a_rate() {
    let args = mk_args(&[]);
    assert_eq!(
        (
            args.authorization_webhook_qps,
            args.authorization_webhook_burst,
            args.authorization_webhook_max_inflight
        ),
        (200.0, 400, 400)
    );
    assert_eq!(
        (
            args.authentication_token_webhook_qps,
            args.authentication_token_webhook_burst,
            args.authentication_token_webhook_max_inflight
        ),
        (200.0, 400, 400)
    );
    assert_eq!(args.authorization_webhook_stale_if_error, Duration::from_secs(300));
    let args = mk_args(&["--authorization-webhook-qps=0.5", "--authorization-webhook-stale-if-error=0"]);
    assert_eq!(
        (args.authorization_webhook_qps, args.authorization_webhook_stale_if_error),
        (0.5, Duration::ZERO)
    );
    let error =
        |flag: &str| crate::options::TestFlags::try_parse_from(["apiserver", flag]).unwrap_err().to_string();
    for (flag, message) in [
        ("--authorization-webhook-qps=0", "must be a finite number greater than 0 (got 0)"),
        ("--authentication-token-webhook-qps=-3", "must be a finite number greater than 0 (got -3)"),
        ("--authorization-webhook-qps=fast", "\"fast\" is not a number of reviews per second"),
        ("--authorization-webhook-qps=inf", "must be a finite number greater than 0 (got inf)"),
        ("--authorization-webhook-burst=0", "0 is not in 1..=4294967295"),
        ("--authentication-token-webhook-max-inflight=0", "0 is not in 1..=4294967295"),
        ("--authorization-webhook-stale-if-error=5", "invalid duration \"5\""),
    ] {
        let text = error(flag);
        assert!(text.contains(message), "{flag}: {text}");
        let name = flag.split('=').next().unwrap();
        assert!(text.contains(name), "{flag}: {text}");
    }
}

#[tokio::test]
async fn unparseable_resource_paths_are_404_after_authentication() {
    let (auth, _, _) = mk_plain_auth(&["--anonymous-auth=false"]);
    let (status, _, _) = call(&auth, mk_req("/apis/g/v/watch", &[], None)).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let (status, _, body) =
        call(&auth, mk_req("/apis/g/v/watch", &[("Authorization", "Bearer alice-token")], None)).await;
    assert_eq!((status, body["reason"].as_str()), (StatusCode::NOT_FOUND, Some("NotFound")));
}

// ---------------------------------------------------------------- trust material

fn mk_cm_data(w: &World, fp_ca: &MkCa) -> BTreeMap<String, String> {
    BTreeMap::from([
        ("client-ca-file".to_owned(), w.client_ca.pem.clone()),
        ("requestheader-client-ca-file".to_owned(), fp_ca.pem.clone()),
        ("requestheader-allowed-names".to_owned(), r#"["front-proxy-client"]"#.to_owned()),
        ("requestheader-username-headers".to_owned(), r#"["X-Remote-User"]"#.to_owned()),
        ("requestheader-uid-headers".to_owned(), "[]".to_owned()),
        ("requestheader-group-headers".to_owned(), r#"["X-Remote-Group"]"#.to_owned()),
        ("requestheader-extra-headers-prefix".to_owned(), r#"["X-Remote-Extra-"]"#.to_owned()),
    ])
}

#[test]
fn configmap_data_is_read_like_the_generic_server() {
    let w = mk_world();
    let m = trust::material_from_configmap(&mk_cm_data(&w, &w.front_proxy_ca)).unwrap();
    assert_eq!(m.client_ca.as_ref().map(CaBundle::len), Some(1));
    let rh = m.request_header.unwrap();
    assert_eq!(rh.allowed_names, ["front-proxy-client"]);
    assert_eq!(rh.username_headers, ["X-Remote-User"]);
    assert!(rh.uid_headers.is_empty());
    assert_eq!(rh.extra_header_prefixes, ["X-Remote-Extra-"]);

    // Only a client CA: no request-header authenticator.
    let only_client = BTreeMap::from([("client-ca-file".to_owned(), w.client_ca.pem.clone())]);
    let m = trust::material_from_configmap(&only_client).unwrap();
    assert!(m.client_ca.is_some() && m.request_header.is_none());
    // Missing lists are empty.
    let rh_only = BTreeMap::from([("requestheader-client-ca-file".to_owned(), w.front_proxy_ca.pem.clone())]);
    let rh = trust::material_from_configmap(&rh_only).unwrap().request_header.unwrap();
    assert!(rh.username_headers.is_empty() && rh.allowed_names.is_empty());

    let mut bad = mk_cm_data(&w, &w.front_proxy_ca);
    bad.insert("requestheader-group-headers".into(), "X-Remote-Group".into());
    let err = trust::material_from_configmap(&bad).unwrap_err().to_string();
    assert!(err.starts_with("requestheader-group-headers: not a JSON array of strings"), "{err}");
    let mut bad = mk_cm_data(&w, &w.front_proxy_ca);
    bad.insert(
        "client-ca-file".into(),
        "-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n".into(),
    );
    assert!(trust::material_from_configmap(&bad).unwrap_err().to_string().starts_with("client-ca-file"));
}

// ---------------------------------------------------------------- a local fake API server

#[derive(Default)]
struct FakeApi {
    configmap: Mutex<Option<Value>>,
    forbid_configmap: bool,
    events: Mutex<Option<tokio::sync::broadcast::Sender<Value>>>,
    bodies: Mutex<Vec<(String, Value)>>,
}

fn mk_cm(data: &BTreeMap<String, String>, rv: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "extension-apiserver-authentication", "namespace": "kube-system", "resourceVersion": rv},
        "data": data,
    })
}

fn status_body(code: u16, reason: &str) -> Response {
    let body = json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": reason, "reason": reason, "code": code});
    (StatusCode::from_u16(code).unwrap(), axum::Json(body)).into_response()
}

async fn fake_api(state: axum::extract::State<Arc<FakeApi>>, request: Request) -> Response {
    let path = request.uri().path().to_owned();
    let query = request.uri().query().unwrap_or_default().to_owned();
    let method = request.method().clone();
    if method == http::Method::POST {
        let bytes = request.into_body().collect().await.unwrap().to_bytes();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        state.bodies.lock().unwrap().push((path.clone(), body.clone()));
        let mut answer = body.clone();
        answer["status"] = if path.ends_with("/tokenreviews") {
            json!({"authenticated": true, "user": {"username": "sa", "groups": ["g"], "extra": {"k": ["v"]}}})
        } else {
            json!({"allowed": false, "reason": "nope"})
        };
        return (StatusCode::CREATED, axum::Json(answer)).into_response();
    }
    if state.forbid_configmap {
        return status_body(403, "Forbidden");
    }
    let cm = state.configmap.lock().unwrap().clone();
    if path.ends_with("/configmaps/extension-apiserver-authentication") {
        return match cm {
            Some(cm) => axum::Json(cm).into_response(),
            None => status_body(404, "NotFound"),
        };
    }
    if query.contains("watch=true") || query.contains("watch=1") {
        let Some(rx) = state.events.lock().unwrap().as_ref().map(|tx| tx.subscribe()) else {
            return status_body(500, "InternalError");
        };
        let stream = futures::stream::unfold(rx, |mut rx| async move {
            let event = rx.recv().await.ok()?;
            let line = format!("{event}\n");
            Some((Ok::<_, Infallible>(bytes::Bytes::from(line)), rx))
        });
        return Body::from_stream(stream).into_response();
    }
    let items: Vec<Value> = cm.into_iter().collect();
    axum::Json(json!({"apiVersion": "v1", "kind": "ConfigMapList", "metadata": {"resourceVersion": "1"}, "items": items}))
        .into_response()
}

async fn mk_fake_api(state: Arc<FakeApi>) -> kube::Config {
    crate::install_crypto_provider();
    let app = Router::new().fallback(fake_api).with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await });
    kube::Config::new(format!("http://{addr}").parse().unwrap())
}

/// Captures this thread's log lines (the current-thread runtime of a `#[tokio::test]` runs
/// every task on it) until the guard is dropped.
fn mk_log_capture() -> (Arc<Mutex<String>>, tracing::subscriber::DefaultGuard) {
    #[derive(Clone)]
    struct Sink(Arc<Mutex<String>>);
    impl std::io::Write for Sink {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().push_str(&String::from_utf8_lossy(buf));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let logs = Arc::new(Mutex::new(String::new()));
    let sink = Sink(logs.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || sink.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    (logs, tracing::subscriber::set_default(subscriber))
}

#[tokio::test]
async fn configmap_is_read_at_start_and_watched() {
    let (logs, _capture) = mk_log_capture();
    let w = mk_world();
    let (tx, _) = tokio::sync::broadcast::channel(16);
    let state = Arc::new(FakeApi {
        configmap: Mutex::new(Some(mk_cm(&mk_cm_data(&w, &w.front_proxy_ca), "1"))),
        events: Mutex::new(Some(tx.clone())),
        ..FakeApi::default()
    });
    let config = mk_fake_api(state.clone()).await;
    let auth = Auth::start(&mk_args(&[]), &config).await.unwrap();
    let first = auth.trust().current();
    assert_eq!(first.request_header.as_ref().unwrap().allowed_names, ["front-proxy-client"]);

    // Requests from the current front proxy pass; the one from the next CA does not yet.
    let next_ca = mk_ca("front-proxy-ca-2");
    let next_proxy = mk_leaf(&next_ca, "front-proxy-client", &[], ClientAuth, false);
    let (status, _, body) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(w.front_proxy()))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("alice")));
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(vec![next_proxy.der.clone()])))
            .await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // Rotate: the watch delivers the new CA, the next request uses it.
    tokio::time::timeout(Duration::from_secs(10), async {
        while tx.receiver_count() == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    tx.send(json!({"type": "MODIFIED", "object": mk_cm(&mk_cm_data(&w, &next_ca), "2")})).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while *auth.trust().current() == *first {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let (status, _, body) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(vec![next_proxy.der]))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("alice")));
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(w.front_proxy()))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);

    // An invalid update keeps the current material.
    let current = auth.trust().current();
    let mut bad = mk_cm_data(&w, &next_ca);
    bad.insert("requestheader-allowed-names".into(), "nope".into());
    tx.send(json!({"type": "MODIFIED", "object": mk_cm(&bad, "3")})).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(*auth.trust().current(), *current);

    // Deletion keeps the last good trust (the requests of the current front proxy still pass),
    // says so once (a gauge, one warning), and a re-created ConfigMap applies again.
    let exported = mk_exported(&auth);
    assert_eq!(
        mk_metric(&exported, "example_authentication_trust_configmap_missing"),
        Some(0.0),
        "{exported}"
    );
    for rv in ["4", "5"] {
        tx.send(json!({"type": "DELETED", "object": mk_cm(&bad, rv)})).unwrap();
    }
    tokio::time::timeout(Duration::from_secs(10), async {
        while !auth.trust().is_configmap_missing() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(*auth.trust().current(), *current);
    let proxy = mk_leaf(&next_ca, "front-proxy-client", &[], ClientAuth, false);
    let (status, _, body) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(vec![proxy.der.clone()]))).await;
    assert_eq!((status, body["user"].as_str()), (StatusCode::OK, Some("alice")));
    assert_eq!(mk_metric(&mk_exported(&auth), "example_authentication_trust_configmap_missing"), Some(1.0));
    let warnings =
        logs.lock().unwrap().lines().filter(|l| l.contains("WARN") && l.contains("deleted")).count();
    assert_eq!(warnings, 1, "{}", logs.lock().unwrap());
    let last = mk_ca("front-proxy-ca-3");
    tx.send(json!({"type": "ADDED", "object": mk_cm(&mk_cm_data(&w, &last), "6")})).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while auth.trust().is_configmap_missing() || *auth.trust().current() == *current {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(vec![proxy.der]))).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "the re-created ConfigMap's CA replaced the old one");
    let proxy = mk_leaf(&last, "front-proxy-client", &[], ClientAuth, false);
    let (status, _, _) =
        call(&auth, mk_req("/healthz", &[("X-Remote-User", "alice")], Some(vec![proxy.der]))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(mk_metric(&mk_exported(&auth), "example_authentication_trust_configmap_missing"), Some(0.0));
}

#[tokio::test]
async fn flags_pin_their_part_and_skip_lookup_skips_the_configmap() {
    let w = mk_world();
    let dir = std::env::temp_dir().join(format!("apiserver-auth-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let fp = dir.join("front-proxy-ca.crt");
    std::fs::write(&fp, &w.other_ca.pem).unwrap();
    let state = Arc::new(FakeApi {
        configmap: Mutex::new(Some(mk_cm(&mk_cm_data(&w, &w.front_proxy_ca), "1"))),
        events: Mutex::new(Some(tokio::sync::broadcast::channel(4).0)),
        ..FakeApi::default()
    });
    let config = mk_fake_api(state).await;
    let fp_flag = format!("--requestheader-client-ca-file={}", fp.display());
    let args =
        mk_args(&[&fp_flag, "--requestheader-allowed-names=aggregator", "--requestheader-uid-headers="]);
    let auth = Auth::start(&args, &config).await.unwrap();
    let m = auth.trust().current();
    // Client CA from the ConfigMap, request-header from the flags.
    assert_eq!(m.client_ca, CaBundle::from_pem(w.client_ca.pem.as_bytes()).unwrap());
    let rh = m.request_header.as_ref().unwrap();
    assert_eq!(rh.ca, CaBundle::from_pem(w.other_ca.pem.as_bytes()).unwrap().unwrap());
    assert_eq!(rh.allowed_names, ["aggregator"]);
    assert!(rh.uid_headers.is_empty());

    // A rotated flag file changes its part only: the ConfigMap's part and the other
    // request-header settings stay.
    std::fs::write(&fp, &w.front_proxy_ca.pem).unwrap();
    assert!(auth.trust().reload_files());
    let m = auth.trust().current();
    assert_eq!(m.client_ca, CaBundle::from_pem(w.client_ca.pem.as_bytes()).unwrap());
    let rh = m.request_header.as_ref().unwrap();
    assert_eq!(rh.ca, CaBundle::from_pem(w.front_proxy_ca.pem.as_bytes()).unwrap().unwrap());
    assert_eq!(rh.allowed_names, ["aggregator"]);
    assert!(!auth.trust().reload_files(), "nothing changed since");

    let args = mk_args(&[&fp_flag, "--authentication-skip-lookup"]);
    let auth = Auth::start(&args, &config).await.unwrap();
    assert!(auth.trust().current().client_ca.is_none());

    let args = mk_args(&["--client-ca-file=/nonexistent/ca.crt"]);
    let err = Auth::start(&args, &config).await.unwrap_err().to_string();
    assert!(err.starts_with("--client-ca-file /nonexistent/ca.crt: "), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn rotated_ca_files_apply_to_the_next_request_and_bad_ones_keep_the_last_good() {
    let w = mk_world();
    let (client_ca_2, front_proxy_ca_2) = (mk_ca("client-ca-2"), mk_ca("front-proxy-ca-2"));
    let dir = std::env::temp_dir().join(format!("apiserver-auth-files-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let volume = dir.join("client-ca");
    std::fs::create_dir_all(&volume).unwrap();
    test_support::volume_swap(&volume, "..v1", &w.client_ca.pem);
    let fp = dir.join("front-proxy-ca.crt");
    std::fs::write(&fp, &w.front_proxy_ca.pem).unwrap();
    let args = mk_args(&[
        &format!("--client-ca-file={}", volume.join("ca.crt").display()),
        &format!("--requestheader-client-ca-file={}", fp.display()),
        "--requestheader-allowed-names=front-proxy-client",
    ]);
    // Both parts come from flags: the client is never called.
    let client = kube::Client::try_from(kube::Config::new("http://127.0.0.1:9".parse().unwrap())).unwrap();
    let trust = Trust::start(&args, client).await.unwrap();
    let tokens = Arc::new(FakeTokens::default());
    let auth = Auth::new(&args, trust.clone(), tokens, FakeAccess::standard()).unwrap();

    let alice = |ca: &MkCa| vec![mk_leaf(ca, "alice", &[], ClientAuth, false).der];
    let proxy = |ca: &MkCa, cn: &str| vec![mk_leaf(ca, cn, &[], ClientAuth, false).der];
    let as_alice = [("X-Remote-User", "alice")];
    // (client CA 1, client CA 2, front proxy CA 1, front proxy CA 2, CA 2 with a CN not allowed)
    let statuses = || async {
        [
            call(&auth, mk_req(PMS_SHOP, &[], Some(alice(&w.client_ca)))).await.0.as_u16(),
            call(&auth, mk_req(PMS_SHOP, &[], Some(alice(&client_ca_2)))).await.0.as_u16(),
            call(&auth, mk_req(PMS_SHOP, &as_alice, Some(proxy(&w.front_proxy_ca, "front-proxy-client"))))
                .await
                .0
                .as_u16(),
            call(&auth, mk_req(PMS_SHOP, &as_alice, Some(proxy(&front_proxy_ca_2, "front-proxy-client"))))
                .await
                .0
                .as_u16(),
            call(&auth, mk_req(PMS_SHOP, &as_alice, Some(proxy(&front_proxy_ca_2, "intruder"))))
                .await
                .0
                .as_u16(),
        ]
    };
    assert_eq!(statuses().await, [200, 401, 200, 401, 401]);
    assert!(!trust.reload_files(), "unchanged files");

    // Rotation: the client CA by a symlink swap, the front proxy CA rewritten in place.
    test_support::volume_swap(&volume, "..v2", &client_ca_2.pem);
    std::fs::write(&fp, &front_proxy_ca_2.pem).unwrap();
    assert!(trust.reload_files());
    assert_eq!(statuses().await, [401, 200, 401, 200, 401]);

    // Unusable changes are refused: the last good bundles stay.
    test_support::volume_swap(&volume, "..v3", "");
    std::fs::write(&fp, "garbage").unwrap();
    assert!(!trust.reload_files());
    assert_eq!(statuses().await, [401, 200, 401, 200, 401]);
    std::fs::remove_file(&fp).unwrap();
    assert!(!trust.reload_files());
    assert_eq!(statuses().await, [401, 200, 401, 200, 401]);

    // The poller applies the next change by itself.
    trust.spawn_file_poller(Duration::from_millis(20));
    std::fs::write(&fp, &w.front_proxy_ca.pem).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while statuses().await != [401, 200, 200, 401, 401] {
        assert!(std::time::Instant::now() < deadline, "the poller did not apply the change");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The poller does not keep the trust alive.
    let weak = Arc::downgrade(&trust);
    drop((auth, trust));
    assert!(weak.upgrade().is_none());
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn lookup_failure_stops_the_start_unless_tolerated() {
    let state = Arc::new(FakeApi { forbid_configmap: true, ..FakeApi::default() });
    let config = mk_fake_api(state).await;
    let err = Auth::start(&mk_args(&[]), &config).await.unwrap_err().to_string();
    assert!(
        err.starts_with("unable to read ConfigMap kube-system/extension-apiserver-authentication: "),
        "{err}"
    );
    assert!(err.contains("--role=extension-apiserver-authentication-reader"), "{err}");
    let auth = Auth::start(&mk_args(&["--authentication-tolerate-lookup-failure"]), &config).await.unwrap();
    assert_eq!(*auth.trust().current(), TrustMaterial::default());

    // Not found is not a failure: nothing is trusted until it appears.
    let state = Arc::new(FakeApi {
        events: Mutex::new(Some(tokio::sync::broadcast::channel(4).0)),
        ..FakeApi::default()
    });
    let config = mk_fake_api(state).await;
    let auth = Auth::start(&mk_args(&[]), &config).await.unwrap();
    assert_eq!(*auth.trust().current(), TrustMaterial::default());
    assert_eq!(mk_metric(&mk_exported(&auth), "example_authentication_trust_configmap_missing"), Some(1.0));
}

#[tokio::test]
async fn kube_reviewers_speak_the_wire_format() {
    let state = Arc::new(FakeApi::default());
    let config = mk_fake_api(state.clone()).await;
    let client = kube::Client::try_from(config).unwrap();
    let status = KubeTokenReviewer::new(client.clone()).review("secret".into()).await.unwrap();
    assert_eq!(status.authenticated, Some(true));
    assert_eq!(status.user.unwrap().username.as_deref(), Some("sa"));

    let info = RequestInfo::new(&http::Method::GET, PMS_SHOP, None).unwrap();
    let user = UserInfo { name: "bob".into(), groups: vec!["g".into()], ..Default::default() };
    let spec = authz::review_spec(&user, &info, PMS_SHOP);
    let status = KubeAccessReviewer::new(client).review(spec).await.unwrap();
    assert_eq!((status.allowed, status.reason.as_deref()), (false, Some("nope")));

    let bodies = state.bodies.lock().unwrap().clone();
    assert_eq!(bodies[0].0, "/apis/authentication.k8s.io/v1/tokenreviews");
    assert_eq!(
        bodies[0].1,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview", "metadata": {}, "spec": {"token": "secret"}})
    );
    assert_eq!(bodies[1].0, "/apis/authorization.k8s.io/v1/subjectaccessreviews");
    assert_eq!(
        bodies[1].1,
        json!({
            "apiVersion": "authorization.k8s.io/v1", "kind": "SubjectAccessReview", "metadata": {},
            "spec": {
                "user": "bob", "groups": ["g"],
                "resourceAttributes": {"namespace": "shop", "verb": "list", "group": G, "version": "v1alpha1", "resource": "podmetricssummaries"}
            }
        })
    );
}

// ------------------------------------------------------- verification once per connection

#[test]
fn not_after_reads_both_time_forms() {
    // RFC 5280: UTCTime through 2049, GeneralizedTime from 2050 on (rcgen writes both).
    let ca = mk_ca("ca");
    for ((y, m, d, h, min, s), want) in
        [((2030, 6, 15, 12, 30, 45), 1_907_757_045), ((2051, 1, 1, 0, 0, 0), 2_556_144_000)]
    {
        let leaf = mk_cert(&ca, |p| {
            p.not_after = rcgen::date_time_ymd(y, m, d) + Duration::from_secs(h * 3600 + min * 60 + s);
        });
        assert_eq!(x509::not_after(leaf.der.as_ref()), Ok(want), "{y}-{m}-{d}");
    }
    assert_eq!(x509::not_after(b"\x30\x00"), Err(x509::DerError::Malformed));
}

#[test]
fn a_chain_is_verified_once_per_bundle_until_it_expires() {
    let (ca1, ca2) = (mk_ca("ca-1"), mk_ca("ca-2"));
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    // Valid for the next 2 to 3 seconds (validity is kept in whole seconds).
    let leaf = mk_cert(&ca1, |p| {
        p.distinguished_name.push(rcgen::DnType::CommonName, "alice");
        p.extended_key_usages = vec![ClientAuth];
        p.not_after = rcgen::date_time_ymd(1970, 1, 1) + Duration::from_secs(now.as_secs() + 3);
    });
    let peer = PeerCertificates::new(vec![leaf.der.clone()]);
    let bundle = |pem: &str| CaBundle::from_pem(pem.as_bytes()).unwrap().unwrap();
    let (only_1, only_2, both) =
        (bundle(&ca1.pem), bundle(&ca2.pem), bundle(&format!("{}{}", ca2.pem, ca1.pem)));

    let first = peer.verify(&only_1).unwrap();
    assert_eq!(first.subject.common_name, "alice");
    assert!(Arc::ptr_eq(&first, &peer.verify(&only_1).unwrap()), "the second request reuses the verdict");
    // Another bundle (a rotation) verifies again: refused by one without the issuer...
    let refused = peer.verify(&only_2).unwrap_err().to_string();
    assert!(refused.contains("UnknownIssuer"), "{refused}");
    // ...and accepted, as a new verdict, by one that holds it.
    assert!(!Arc::ptr_eq(&first, &peer.verify(&both).unwrap()));
    // A bundle equal by content to a remembered one keeps its verdict.
    assert!(Arc::ptr_eq(&first, &peer.verify(&bundle(&ca1.pem)).unwrap()));

    // Past the leaf's notAfter the remembered verdict no longer counts.
    std::thread::sleep(Duration::from_millis(4100));
    for ca in [&only_1, &both] {
        let expired = peer.verify(ca).unwrap_err().to_string();
        assert!(expired.contains("expired"), "{expired}");
    }
}
