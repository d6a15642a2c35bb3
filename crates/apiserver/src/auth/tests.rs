//! Middleware tests: the authenticator branches with rcgen-minted certificates, header handling,
//! the 401/403/500 matrix with exact Status bodies, always-allow paths and groups, caching
//! (call counts), and the trust ConfigMap read and watched through a local fake API server,
//! which also checks the real TokenReview/SubjectAccessReview clients' wire format.

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

/// Tokens: `<name>-token` is user `<name>`; `expired` is rejected with an error; `broken`
/// fails the call; anything else is unauthenticated without a reason.
#[derive(Default)]
struct FakeTokens {
    calls: AtomicUsize,
}

impl TokenReviewer for FakeTokens {
    fn review(&self, token: String) -> BoxFuture<'_, Result<TokenReviewStatus, ReviewError>> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        Box::pin(async move {
            if token == "broken" {
                return Err(ReviewError::Other("connection refused".into()));
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
    specs: Mutex<Vec<SubjectAccessReviewSpec>>,
    delay: Duration,
    rule: Rule,
}

impl FakeAccess {
    fn new(
        rule: impl Fn(&SubjectAccessReviewSpec) -> Result<SubjectAccessReviewStatus, String>
        + Send
        + Sync
        + 'static,
    ) -> Arc<Self> {
        Arc::new(Self {
            calls: AtomicUsize::new(0),
            down: Default::default(),
            specs: Mutex::default(),
            delay: Duration::ZERO,
            rule: Box::new(rule),
        })
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
        Box::pin(async move {
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            if self.down.load(Ordering::SeqCst) {
                return Err(ReviewError::Timeout(review::REVIEW_TIMEOUT));
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

#[tokio::test]
async fn stale_decisions_are_served_only_within_the_bound_and_only_for_unreachability() {
    let access = FakeAccess::standard();
    let ttl = Duration::from_millis(100);
    let authorizer =
        authz::Authorizer::new(access.clone(), Vec::new(), AlwaysAllowPaths::default(), ttl, ttl)
            .with_stale_if_error(Duration::from_millis(600));
    let alice = UserInfo { name: "alice".into(), ..Default::default() };
    let info = RequestInfo::new(&http::Method::GET, PMS_SHOP, None).unwrap();
    let decide = || authorizer.authorize(&alice, &info, PMS_SHOP);
    assert_eq!(decide().await.unwrap(), Decision::Allow);
    access.down.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(decide().await.unwrap(), Decision::Allow, "within the bound: the last decision");
    // Past the bound (600 ms after the last successful review): no decision.
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(matches!(decide().await, Err(authz::AuthorizeError::Unavailable(_))));

    // Only unreachability is covered by a stale decision (other failures stay 500s, see
    // review_failures_are_500_and_not_cached).
    assert!(!ReviewError::NoStatus.is_unreachable() && !ReviewError::Other("x".into()).is_unreachable());
    assert!(ReviewError::Timeout(review::REVIEW_TIMEOUT).is_unreachable());
}

#[tokio::test]
async fn unreachability_outlives_a_cancelled_request_and_an_answered_error_ends_it() {
    let access = Arc::new(FakeAccess {
        calls: AtomicUsize::new(0),
        down: std::sync::atomic::AtomicBool::new(true),
        specs: Mutex::default(),
        delay: Duration::from_millis(300),
        rule: Box::new(|spec: &SubjectAccessReviewSpec| match spec.user.as_deref() {
            Some("carol") => Err("the review was refused".into()),
            _ => standard_rule(spec),
        }),
    });
    let ttl = Duration::from_secs(10);
    let authorizer =
        authz::Authorizer::new(access.clone(), Vec::new(), AlwaysAllowPaths::default(), ttl, ttl);
    let info = RequestInfo::new(&http::Method::GET, PMS_SHOP, None).unwrap();
    let user = |name: &str| UserInfo { name: name.into(), ..Default::default() };
    let (alice, bob, carol, dave) = (user("alice"), user("bob"), user("carol"), user("dave"));

    // A request whose deadline ends before its review: the review runs on and is recorded.
    let cancelled =
        tokio::time::timeout(Duration::from_millis(100), authorizer.authorize(&alice, &info, PMS_SHOP));
    assert!(cancelled.await.is_err());
    tokio::time::sleep(Duration::from_millis(400)).await;
    // kube-apiserver is known to be unreachable: a decision not known is a 503 at once.
    let started = std::time::Instant::now();
    assert!(matches!(
        authorizer.authorize(&bob, &info, PMS_SHOP).await,
        Err(authz::AuthorizeError::Unavailable(_))
    ));
    assert!(started.elapsed() < Duration::from_millis(150), "{:?}", started.elapsed());
    tokio::time::sleep(Duration::from_millis(400)).await;

    // The API answers again, with an error for carol's review (run by the background probe):
    // an answer ends the unreachable state, so dave is reviewed again (a denial, not a 503).
    access.down.store(false, Ordering::SeqCst);
    assert!(matches!(
        authorizer.authorize(&carol, &info, PMS_SHOP).await,
        Err(authz::AuthorizeError::Unavailable(_))
    ));
    tokio::time::sleep(Duration::from_millis(400)).await;
    let calls = access.calls();
    assert_eq!(authorizer.authorize(&dave, &info, PMS_SHOP).await.unwrap(), Decision::Forbid(String::new()));
    assert_eq!(access.calls(), calls + 1, "dave's decision was reviewed");
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
    let access = Arc::new(FakeAccess {
        calls: AtomicUsize::new(0),
        down: Default::default(),
        specs: Mutex::default(),
        delay: Duration::from_millis(200),
        rule: Box::new(standard_rule),
    });
    let (auth, _) = mk_auth(TrustMaterial::default(), &[], access.clone());
    let statuses = all_at_once(16, |_| {
        let auth = auth.clone();
        async move { call(&auth, mk_req(PMS_SHOP, &[("Authorization", "Bearer alice-token")], None)).await.0 }
    });
    assert_eq!(statuses.await, [StatusCode::OK; 16]);
    assert_eq!(access.calls(), 1);
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

#[tokio::test]
async fn configmap_is_read_at_start_and_watched() {
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

    // Deletion withdraws the trust.
    tx.send(json!({"type": "DELETED", "object": mk_cm(&bad, "4")})).unwrap();
    tokio::time::timeout(Duration::from_secs(10), async {
        while auth.trust().current().client_ca.is_some() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap();
    assert!(auth.trust().current().request_header.is_none());
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
