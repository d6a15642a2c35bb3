//! Hostile input (RELIABILITY.md, "Hostile input"): property tests (proptest) of everything
//! that parses client or operator input.
//!
//! - the label selector and field selector parsers, `RequestInfo` and the query parser: never
//!   panic; whatever the label selector accepts is a valid key and value;
//! - the whole router (`router(state).oneshot`, fake kinds, the external metrics API on a fake
//!   Prometheus): arbitrary methods, paths, queries and headers are answered 2xx/4xx, never
//!   5xx, never a panic;
//! - PromQL: every matcher value, whatever its characters, is written as a PromQL string
//!   literal that Go's `strconv.Unquote` (what Prometheus' parser applies) reads back to
//!   exactly that value; set matches are regexes whose only alternatives are the literal
//!   values; every query the router sends to Prometheus has only well-formed literals;
//! - the kubelet parser (mutations of a real `/metrics/resource` body, and arbitrary text) and
//!   the configuration loader (`QueryFile::from_yaml`, then rendering every template): never
//!   panic.
//!
//! Each property first runs a fixed seed corpus, then random cases: a CI-sized number by
//! default (the whole file takes seconds), `PROPTEST_CASES` for the long run documented in
//! RELIABILITY.md. A failure prints the minimal input; `PROPTEST_RNG_SEED` replays a run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use kube::core::Expression;
use percolator::k8s::request_info::{QueryParams, RequestInfo, split_path};
use percolator::k8s::selectors::{FieldSelector, LabelSelector, Requirement};
use percolator::k8s::validation::{is_qualified_name, is_valid_label_value};
use percolator::cache::CacheSettings;
use percolator::config::{ExternalMetricConfig, LiveConfig, QueryFile};
use percolator::kinds::{Cell, Column, ComputeError, Item, KindInfo, Kinds, Listing, Meta, ServedKind};
use percolator::sources::prometheus::{MatchOp, Matcher, render, validate_template};
use percolator::sources::{PromError, PromSample, PromSource};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};
use tower::ServiceExt;

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// `ci` random cases unless `PROPTEST_CASES` says otherwise.
fn config(ci: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci;
    }
    // Integration tests have no source file proptest could place a regressions file next to.
    config.failure_persistence = None;
    config
}

/// Runs the corpus, then `strategy` through `check`; panics with the minimal failing input.
fn run<S: Strategy>(
    ci: u32,
    corpus: impl IntoIterator<Item = S::Value>,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Clone + std::fmt::Debug,
{
    for seed in corpus {
        if let Err(e) = check(seed.clone()) {
            panic!("corpus input {seed:?}: {e}");
        }
    }
    let mut runner = TestRunner::new(config(ci));
    if let Err(e) = runner.run(&strategy, check) {
        panic!("{e}");
    }
}

/// Arbitrary text: any Unicode, or printable ASCII (more likely to get past the first check).
fn text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..max).prop_map(|c| c.into_iter().collect()),
        proptest::string::string_regex(&format!("[ -~]{{0,{max}}}")).unwrap(),
    ]
    .boxed()
}

/// Strings assembled from `vocabulary` and arbitrary text.
fn assembled(vocabulary: &'static [&'static str], parts: usize) -> BoxedStrategy<String> {
    let piece = prop_oneof![
        4 => proptest::sample::select(vocabulary).prop_map(str::to_owned),
        1 => text(8),
    ];
    proptest::collection::vec(piece, 0..parts).prop_map(|p| p.concat()).boxed()
}

// ---------------------------------------------------------------------------------------------
// Selectors, RequestInfo, query parsing
// ---------------------------------------------------------------------------------------------

const SELECTOR_TOKENS: &[&str] = &[
    "app",
    "tier",
    "a.b/c",
    "example.com/x",
    "-a",
    "a-",
    "_x",
    "é",
    "in",
    "notin",
    "=",
    "==",
    "!=",
    "!",
    ">",
    "<",
    "(",
    ")",
    ",",
    " ",
    "\t",
    "web",
    "db",
    "1",
    "-1",
    "9223372036854775808",
    "\"",
    "\\",
    "}",
    "{",
    "|",
    "*",
    ".",
    "..",
    "/",
    "a\"}",
    "x\\\"",
    "metadata.name",
    "metadata.namespace",
    "%",
    "\u{0}",
];

const LABEL_SELECTOR_CORPUS: &[&str] = &[
    "",
    "app=web",
    "app==web,tier!=front",
    "app in (web,db)",
    "app notin (,)",
    "!app",
    "app",
    "x>1,y<-3",
    "a in (((",
    "a=\"}",
    "a=b\"}),x=~\".*",
    "app in (web\"}) or vector(1) #)",
    "example.com/app=v",
    ",",
    "!",
    "a!=",
    "a in ()",
    "a in (,,)",
    "x>9223372036854775808",
];

fn check_label_selector(input: String) -> Result<(), TestCaseError> {
    if let Ok(selector) = LabelSelector::parse(&input) {
        for requirement in selector.requirements() {
            prop_assert!(is_qualified_name(requirement.key()).is_empty(), "key {:?}", requirement.key());
            let values: Vec<&String> = match requirement {
                Requirement::Expr(Expression::Equal(_, v) | Expression::NotEqual(_, v)) => vec![v],
                Requirement::Expr(Expression::In(_, vs) | Expression::NotIn(_, vs)) => vs.iter().collect(),
                _ => vec![],
            };
            for v in values {
                prop_assert!(is_valid_label_value(v).is_empty(), "value {v:?} of {input:?}");
            }
        }
        let labels = BTreeMap::from([("app".to_owned(), "web".to_owned()), ("x".to_owned(), "5".to_owned())]);
        let _ = selector.matches(&labels);
    }
    Ok(())
}

#[test]
fn label_selector_parser() {
    run(
        10000,
        LABEL_SELECTOR_CORPUS.iter().map(|s| (*s).to_owned()),
        prop_oneof![assembled(SELECTOR_TOKENS, 12), text(64)],
        check_label_selector,
    );
}

const FIELD_SELECTOR_CORPUS: &[&str] = &[
    "",
    "metadata.name=x",
    "metadata.name==x,metadata.namespace!=y",
    "metadata.name=a\\,b",
    "metadata.name=\\",
    "metadata.name=\\x",
    "spec.nodeName=n",
    "=",
    ",,,",
    "metadata.name",
];

#[test]
fn field_selector_parser() {
    run(
        10000,
        FIELD_SELECTOR_CORPUS.iter().map(|s| (*s).to_owned()),
        prop_oneof![
            assembled(
                &["metadata.name", "metadata.namespace", "=", "==", "!=", ",", "\\", "x", "é", " "],
                10
            ),
            text(64)
        ],
        |input| {
            if let Ok(selector) = FieldSelector::parse(&input) {
                let _ = selector.matches("x", "y");
                let _ = selector.requires_exact_match("metadata.namespace");
            }
            let _ = FieldSelector::parse_supported(&input);
            Ok(())
        },
    );
}

const PATH_SEGMENTS: &[&str] = &[
    "apis",
    "api",
    "v1",
    "stats.une-tasse-de.cafe",
    "v1alpha1",
    "external.metrics.k8s.io",
    "v1beta1",
    "namespaces",
    "shop",
    "default",
    "widgets",
    "gadgets",
    "w1",
    "cafe_brews_per_minute",
    "http_requests_per_second",
    "watch",
    "proxy",
    "status",
    "finalize",
    "openapi",
    "v2",
    "v3",
    "healthz",
    "readyz",
    "livez",
    "metrics",
    "version",
    "..",
    ".",
    "",
    "%2F",
    "%2e%2e",
    "%00",
    "%ff",
    "%",
    "%C3%A9",
    "UPPER",
];

fn segment() -> BoxedStrategy<String> {
    prop_oneof![
        6 => proptest::sample::select(PATH_SEGMENTS).prop_map(str::to_owned),
        1 => proptest::string::string_regex("[a-zA-Z0-9._~%-]{0,12}").unwrap(),
        1 => text(12).prop_map(|t| percent_encode(&t)),
    ]
    .boxed()
}

/// Mostly well-formed resource and external metric paths (so that requests reach the
/// handlers), with a random segment swapped in now and then; and free-form paths.
fn path() -> BoxedStrategy<String> {
    let name = || prop_oneof![3 => proptest::sample::select(&["w1", "w2", "shop", "x"][..]).prop_map(str::to_owned), 1 => segment()];
    const TARGETS: &[(&str, &str, bool)] = &[
        ("stats.une-tasse-de.cafe/v1alpha1", "widgets", true),
        ("stats.une-tasse-de.cafe/v1alpha1", "gadgets", false),
        ("external.metrics.k8s.io/v1beta1", "cafe_brews_per_minute", true),
        ("external.metrics.k8s.io/v1beta1", "http_requests_per_second", true),
        ("external.metrics.k8s.io/v1beta1", "nope", true),
    ];
    let resource = (
        proptest::sample::select(TARGETS),
        proptest::option::weighted(
            0.1,
            prop_oneof![Just("watch".to_owned()), Just("proxy".to_owned()), segment()],
        ),
        any::<bool>(),
        name(),
        proptest::option::weighted(0.1, segment()),
        proptest::option::weighted(0.4, name()),
        proptest::option::weighted(0.05, segment()),
    )
        .prop_map(|((gv, plural, namespaced), prefix, flip, ns, other_plural, name, sub)| {
            // The scope that fits the kind, mostly.
            let with_ns = namespaced != (flip && ns.len() % 5 == 0);
            let mut p = format!("/apis/{gv}");
            for part in [
                prefix,
                with_ns.then(|| format!("namespaces/{ns}")),
                Some(other_plural.unwrap_or(plural.to_owned())),
                name,
                sub,
            ]
            .into_iter()
            .flatten()
            {
                p.push('/');
                p.push_str(&part);
            }
            p
        });
    prop_oneof![
        6 => resource,
        4 => proptest::collection::vec(segment(), 0..9).prop_map(|s| format!("/{}", s.join("/"))),
        1 => proptest::string::string_regex("/[!-~]{0,40}").unwrap(),
    ]
    .boxed()
}

const QUERY_KEYS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "watch",
    "limit",
    "timeout",
    "timeoutSeconds",
    "includeObject",
    "continue",
    "resourceVersion",
    "verbose",
    "pretty",
    "x",
];

fn query() -> BoxedStrategy<Option<String>> {
    let value = prop_oneof![
        assembled(SELECTOR_TOKENS, 8),
        proptest::sample::select(
            &[
                "",
                "0",
                "1",
                "true",
                "false",
                "-1",
                "5s",
                "1ms",
                "soon",
                "Object",
                "None",
                "Metadata",
                "99999999999999999999"
            ][..]
        )
        .prop_map(str::to_owned),
        text(16),
    ];
    let pair = (proptest::sample::select(QUERY_KEYS), value).prop_map(|(k, v)| {
        format!("{k}={}", url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>())
    });
    prop_oneof![
        1 => Just(None),
        4 => proptest::collection::vec(pair, 0..4).prop_map(|p| Some(p.join("&"))),
        1 => proptest::string::string_regex("[!-~]{0,40}").unwrap().prop_map(Some),
    ]
    .boxed()
}

fn method() -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just("GET".to_owned()),
        4 => proptest::sample::select(&["HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "get"][..])
            .prop_map(str::to_owned),
        1 => proptest::string::string_regex("[A-Z]{1,10}").unwrap(),
    ]
    .boxed()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

#[test]
fn request_info_and_query_parsing() {
    let http_methods = ["GET", "POST", "DELETE", "PATCH", "PUT", "HEAD"];
    run(
        10000,
        [
            ("GET".to_owned(), "/apis/g/v/watch".to_owned(), None),
            ("GET".to_owned(), "/".to_owned(), Some("%".to_owned())),
        ],
        (method(), prop_oneof![path(), text(64)], query()),
        |(method, path, query)| {
            let method = http::Method::from_bytes(method.as_bytes()).unwrap_or(http::Method::GET);
            let _ = RequestInfo::new(&method, &path, query.as_deref());
            let params = QueryParams::parse(query.as_deref());
            let _ = params.watch();
            let _ = split_path(&path);
            for m in http_methods {
                let _ = RequestInfo::new(
                    &http::Method::from_bytes(m.as_bytes()).unwrap(),
                    &path,
                    query.as_deref(),
                );
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// The router
// ---------------------------------------------------------------------------------------------

static WIDGET: KindInfo = KindInfo {
    plural: "widgets",
    singular: "widget",
    kind: "Widget",
    list_kind: "WidgetList",
    short_names: &["wd"],
    categories: &["percolator"],
    namespaced: true,
    description: "Widget is a test kind.",
};

static GADGET: KindInfo = KindInfo {
    plural: "gadgets",
    singular: "gadget",
    kind: "Gadget",
    list_kind: "GadgetList",
    short_names: &[],
    categories: &[],
    namespaced: false,
    description: "Gadget is a cluster-scoped test kind.",
};

const COLUMNS: &[Column] = &[
    Column { name: "Name", type_: "string", format: "name", description: "Name.", priority: 0 },
    Column { name: "Age", type_: "string", format: "", description: "Age.", priority: 0 },
];

struct FakeKind(&'static KindInfo);

impl ServedKind for FakeKind {
    fn info(&self) -> &'static KindInfo {
        self.0
    }
    fn columns(&self) -> &'static [Column] {
        COLUMNS
    }
    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        vec![(
            format!("cafe.une-tasse-de.stats.v1alpha1.{}", self.0.kind),
            serde_json::json!({"type": "object", "description": self.0.description, "properties": {}}),
        )]
    }
    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            let namespaced = self.0.namespaced;
            let items = [("shop", "w1", "web"), ("shop", "w2", "db"), ("default", "w3", "web")]
                .into_iter()
                .filter(|(ns, _, _)| !namespaced || namespace.is_none_or(|n| n == *ns))
                .map(|(ns, name, app)| {
                    let ns = if namespaced { ns } else { "" };
                    let object = serde_json::json!({
                        "kind": self.0.kind, "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                        "metadata": {"name": name, "namespace": ns, "labels": {"app": app}},
                    });
                    Arc::new(Item {
                        meta: Meta {
                            name: name.into(),
                            namespace: ns.into(),
                            labels: BTreeMap::from([("app".to_owned(), app.to_owned())]).into(),
                            ..Meta::default()
                        },
                        object: serde_json::value::RawValue::from_string(object.to_string()).unwrap(),
                        cells: vec![Cell::Text(name.into()), Cell::None],
                    })
                })
                .collect();
            Ok(Arc::new(Listing {
                items,
                warnings: vec!["a \"warning\"\n".to_owned()],
                resource_version: "1".to_owned(),
                ..Listing::default()
            }))
        })
    }
}

/// A Prometheus that answers every query with one sample and records the PromQL.
#[derive(Default)]
struct RecordingProm(Mutex<Vec<String>>);

impl PromSource for RecordingProm {
    fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>> {
        self.0.lock().unwrap().push(promql);
        Box::pin(async {
            Ok(vec![PromSample {
                labels: [("namespace", "shop"), ("cafe", "c\"}"), ("type", "x")]
                    .into_iter()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
                value: 1.5,
                timestamp: jiff::Timestamp::UNIX_EPOCH,
            }])
        })
    }
}

const ACCEPTS: &[&str] = &[
    "",
    "application/json",
    "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json",
    "application/json;as=PartialObjectMetadataList;v=v1;g=meta.k8s.io",
    "application/json;as=PartialObjectMetadata;v=v1;g=meta.k8s.io",
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json",
    "application/com.github.proto-openapi.spec.v2@v1.0+protobuf",
    "application/yaml",
    "*/*",
    "*/*;q=x",
    ",,,;;;",
    "application/json;as=;g=;v=",
    "text/html;q=0.9, application/json;q=0.1",
];

#[derive(Debug, Clone)]
struct FuzzRequest {
    method: String,
    path: String,
    query: Option<String>,
    accept: String,
    extra: Vec<(String, String)>,
}

fn fuzz_request() -> BoxedStrategy<FuzzRequest> {
    let accept = prop_oneof![4 => proptest::sample::select(ACCEPTS).prop_map(str::to_owned), 1 => text(40)];
    let header =
        (
            proptest::sample::select(
                &[
                    "content-type",
                    "x-remote-user",
                    "impersonate-user",
                    "authorization",
                    "x-a",
                    "if-none-match",
                ][..],
            )
            .prop_map(str::to_owned),
            text(24),
        );
    (method(), path(), query(), accept, proptest::collection::vec(header, 0..3))
        .prop_map(|(method, path, query, accept, extra)| FuzzRequest { method, path, query, accept, extra })
        .boxed()
}

#[test]
fn router_answers_client_faults_with_4xx_and_sends_only_well_formed_promql() {
    percolator::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let prometheus = Arc::new(RecordingProm::default());
    let app = runtime.block_on(async {
        let kinds: Kinds = vec![Arc::new(FakeKind(&WIDGET)), Arc::new(FakeKind(&GADGET))];
        let metrics = percolator::telemetry::Metrics::new();
        let defaults = QueryFile::from_yaml("", "defaults", &percolator::server::config_check()).unwrap();
        let config = LiveConfig::fixed(defaults, None);
        let cache = CacheSettings::new(Duration::from_millis(1), metrics.clone());
        let external = percolator::external::ExternalMetrics::new(prometheus.clone(), config, &cache);
        let state = percolator::api::ApiState::new(kinds, Arc::new(|| true), metrics)
            .with_external_metrics(Arc::new(external));
        percolator::api::router(state)
    });
    let corpus = [
        (
            "GET",
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute",
            Some("labelSelector=cafe%20in%20(a,b),type!=x"),
        ),
        (
            "GET",
            "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/widgets",
            Some("labelSelector=app%3D%22%7D"),
        ),
        ("GET", "/apis/stats.une-tasse-de.cafe/v1alpha1/gadgets/w1", None),
        ("DELETE", "/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/widgets", None),
        ("GET", "/apis/stats.une-tasse-de.cafe/v1alpha1/watch/namespaces", None),
        ("GET", "/openapi/v3/apis/stats.une-tasse-de.cafe/v1alpha1", Some("hash=x")),
    ]
    .map(|(m, p, q)| FuzzRequest {
        method: m.to_owned(),
        path: p.to_owned(),
        query: q.map(str::to_owned),
        accept: String::new(),
        extra: vec![],
    });
    let codes = Mutex::new(BTreeMap::<u16, usize>::new());
    let queries = std::cell::Cell::new(0usize);
    run(3000, corpus, fuzz_request(), |r| {
        let uri = match &r.query {
            Some(q) => format!("{}?{q}", r.path),
            None => r.path.clone(),
        };
        let mut builder = http::Request::builder().method(r.method.as_str()).uri(uri.as_str());
        // Header values http cannot carry never reach a server; leave them out.
        let valid = |v: &str| http::HeaderValue::from_str(v).is_ok();
        if !r.accept.is_empty() && valid(&r.accept) {
            builder = builder.header("accept", r.accept.as_str());
        }
        for (k, v) in r.extra.iter().filter(|(_, v)| valid(v)) {
            builder = builder.header(k.as_str(), v.as_str());
        }
        // What http cannot represent, hyper refuses with a 400 before the router.
        let Ok(request) = builder.body(axum::body::Body::empty()) else {
            *codes.lock().unwrap().entry(0).or_default() += 1;
            return Ok(());
        };
        let (status, body) = runtime.block_on(async {
            let response = app.clone().oneshot(request).await.unwrap();
            let status = response.status();
            let body = axum::body::to_bytes(response.into_body(), usize::MAX).await.unwrap();
            (status, body)
        });
        prop_assert!(
            status.as_u16() < 500,
            "{} {uri} [{}]: {status} {}",
            r.method,
            r.accept,
            String::from_utf8_lossy(&body)
        );
        *codes.lock().unwrap().entry(status.as_u16()).or_default() += 1;
        for promql in prometheus.0.lock().unwrap().drain(..) {
            queries.set(queries.get() + 1);
            check_promql_literals(&promql)
                .map_err(|e| TestCaseError::fail(format!("{uri}: {promql}: {e}")))?;
        }
        Ok(())
    });
    // The inputs reach the handlers, not only the 404 of an unknown path.
    let codes = codes.into_inner().unwrap();
    println!("router: answers by code {codes:?}; {} PromQL queries checked", queries.get());
    assert!(codes.get(&200).copied().unwrap_or_default() > 20, "{codes:?}");
    assert!(codes.keys().filter(|c| (400..500).contains(*c)).count() >= 4, "{codes:?}");
    assert!(queries.get() > 0);
}

#[test]
fn the_checkers_reject_what_prometheus_rejects() {
    assert_eq!(go_unquote(r#""a\"b\\""#).unwrap(), b"a\"b\\");
    assert!(go_unquote(r#""a"b""#).is_err());
    assert!(go_unquote(r#""a\'""#).is_err());
    assert!(go_unquote("\"a\nb\"").is_err());
    assert!(go_unquote(r#""\ud800""#).is_err());
    assert_eq!(go_unquote(r#""\x41\101\u00e9""#).unwrap(), "AAé".as_bytes());
    assert!(parse_matcher(r#"l="a"} or vector(1) #""#).is_err());
    assert!(parse_matcher(r#"l="a\""#).is_err());
    assert_eq!(literal_alternatives(r"a\.b|c").unwrap(), ["a.b", "c"]);
    assert!(literal_alternatives("a.b").is_err());
    assert!(literal_alternatives("(a)").is_err());
    assert!(check_promql_literals(r#"x{a="\q"}"#).is_err());
}

// ---------------------------------------------------------------------------------------------
// PromQL escaping
// ---------------------------------------------------------------------------------------------

/// Go's `strconv.Unquote` for a double-quoted literal (what Prometheus' parser applies to a
/// string token): the bytes it stands for, or why Go would reject it.
fn go_unquote(literal: &str) -> Result<Vec<u8>, String> {
    let inner = literal
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| format!("not a double-quoted literal: {literal:?}"))?;
    if inner.contains('\n') {
        return Err("raw newline".into());
    }
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| -> Result<u32, String> {
        let mut v = 0u32;
        for _ in 0..n {
            let c = chars.next().ok_or("short escape")?;
            v = v * 16 + c.to_digit(16).ok_or_else(|| format!("bad hex digit {c:?}"))?;
        }
        Ok(v)
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => return Err("unescaped quote inside the literal".into()),
            '\\' => {
                let e = chars.next().ok_or("trailing backslash")?;
                let simple = match e {
                    'a' => Some(0x07u8),
                    'b' => Some(0x08),
                    'f' => Some(0x0c),
                    'n' => Some(b'\n'),
                    'r' => Some(b'\r'),
                    't' => Some(b'\t'),
                    'v' => Some(0x0b),
                    '\\' => Some(b'\\'),
                    '"' => Some(b'"'),
                    _ => None,
                };
                if let Some(b) = simple {
                    out.push(b);
                    continue;
                }
                match e {
                    'x' => out.push(u8::try_from(hex(&mut chars, 2)?).unwrap()),
                    'u' | 'U' => {
                        let v = hex(&mut chars, if e == 'u' { 4 } else { 8 })?;
                        let c = char::from_u32(v).ok_or_else(|| format!("invalid rune {v:#x}"))?;
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    '0'..='7' => {
                        let mut v = e.to_digit(8).unwrap();
                        for _ in 0..2 {
                            let d = chars.next().and_then(|c| c.to_digit(8)).ok_or("bad octal escape")?;
                            v = v * 8 + d;
                        }
                        out.push(u8::try_from(v).map_err(|_| "octal escape > 255")?);
                    }
                    other => return Err(format!("unknown escape \\{other}")),
                }
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    Ok(out)
}

/// Parses `name op "literal"` as PromQL's lexer would: the literal ends at the first
/// unescaped quote, which must be the last character.
fn parse_matcher(text: &str) -> Result<(String, &'static str, Vec<u8>), String> {
    let name_end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).ok_or("no operator")?;
    let (name, rest) = text.split_at(name_end);
    let op = ["=~", "!~", "!=", "="].into_iter().find(|op| rest.starts_with(op)).ok_or("no operator")?;
    let literal = &rest[op.len()..];
    let end = literal_end(literal)?;
    if end != literal.len() {
        return Err(format!("text after the literal: {:?}", &literal[end..]));
    }
    Ok((name.to_owned(), op, go_unquote(literal)?))
}

/// Byte length of the string literal at the start of `s` (quotes included).
fn literal_end(s: &str) -> Result<usize, String> {
    let mut chars = s.char_indices();
    if chars.next().map(|(_, c)| c) != Some('"') {
        return Err(format!("no literal at {s:?}"));
    }
    let mut escaped = false;
    for (i, c) in chars {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Ok(i + 1),
            _ => {}
        }
    }
    Err("unterminated literal".into())
}

/// Every string literal of a rendered query (outside comments, which templates do not have)
/// must unquote.
fn check_promql_literals(promql: &str) -> Result<(), String> {
    let mut rest = promql;
    while let Some(start) = rest.find('"') {
        let end = literal_end(&rest[start..])?;
        go_unquote(&rest[start..start + end])?;
        rest = &rest[start + end..];
    }
    Ok(())
}

/// The alternatives of an RE2 pattern made only of literals (`a|b\.c`), or why it is not one.
fn literal_alternatives(pattern: &str) -> Result<Vec<String>, String> {
    use regex_syntax::ast::{Ast, LiteralKind};
    fn literal(ast: &Ast) -> Result<String, String> {
        match ast {
            Ast::Empty(_) => Ok(String::new()),
            Ast::Literal(l) if matches!(l.kind, LiteralKind::Verbatim | LiteralKind::Meta) => {
                Ok(l.c.to_string())
            }
            Ast::Concat(c) => c.asts.iter().map(literal).collect(),
            other => Err(format!("not a literal: {other:?}")),
        }
    }
    let ast = regex_syntax::ast::parse::Parser::new().parse(pattern).map_err(|e| e.to_string())?;
    match &ast {
        Ast::Alternation(a) => a.asts.iter().map(literal).collect(),
        other => Ok(vec![literal(other)?]),
    }
}

fn op() -> impl Strategy<Value = MatchOp> {
    proptest::sample::select(vec![MatchOp::Eq, MatchOp::Ne, MatchOp::Re, MatchOp::Nre])
}

const HOSTILE_VALUES: &[&str] = &[
    "",
    "\"",
    "\\",
    "\\\"",
    "\"}",
    "\"} or vector(1) #",
    "a\nb",
    "\r\t\u{0}\u{7f}\u{85}\u{2028}",
    "\u{1b}[31m",
    "é😀",
    "\u{feff}",
    "\\x41",
    "\\u0041",
    "'",
    "`",
    ".*|x",
    "${SCOPE}",
    "SCOPE",
];

#[test]
fn matcher_values_round_trip_through_promql_literals() {
    let corpus: Vec<(String, MatchOp)> = HOSTILE_VALUES
        .iter()
        .flat_map(|v| [MatchOp::Eq, MatchOp::Ne, MatchOp::Re, MatchOp::Nre].map(|op| ((*v).to_owned(), op)))
        .collect();
    let values = prop_oneof![
        text(48),
        proptest::collection::vec(proptest::sample::select(HOSTILE_VALUES), 0..6).prop_map(|v| v.concat()),
    ];
    run(10000, corpus, (values, op()), |(value, op)| {
        let matcher = Matcher::new("label_x", op, &value).unwrap();
        let written = matcher.to_string();
        let (name, written_op, unquoted) = parse_matcher(&written).map_err(TestCaseError::fail)?;
        prop_assert_eq!(name, "label_x");
        prop_assert_eq!(written_op, op.as_str());
        prop_assert_eq!(unquoted, value.as_bytes().to_vec(), "{}", written);
        Ok(())
    });
}

#[test]
fn set_matchers_are_exactly_their_literal_values() {
    let corpus = vec![
        HOSTILE_VALUES.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>(),
        vec![String::new()],
        vec!["a|b".into()],
    ];
    run(
        5000,
        corpus,
        proptest::collection::vec(
            prop_oneof![text(16), proptest::sample::select(HOSTILE_VALUES).prop_map(str::to_owned)],
            1..6,
        ),
        |values| {
            for matcher in [Matcher::any_of("l", &values).unwrap(), Matcher::none_of("l", &values).unwrap()] {
                let (_, _, unquoted) = parse_matcher(&matcher.to_string()).map_err(TestCaseError::fail)?;
                let pattern = String::from_utf8(unquoted).unwrap();
                prop_assert_eq!(&pattern, matcher.value());
                let alternatives = literal_alternatives(&pattern).map_err(TestCaseError::fail)?;
                prop_assert_eq!(&alternatives, &values, "{}", pattern);
            }
            Ok(())
        },
    );
}

/// The label selector of an external metric request, as the router turns it into PromQL:
/// whatever passes the parser and reaches `render` comes out as matchers that unquote to
/// exactly the selector's values.
#[test]
fn selectors_reaching_render_yield_exact_promql_literals() {
    let corpus = [
        "cafe=a,type!=b",
        "cafe in (a,b.c,-x_),!type",
        "cafe notin (,)",
        "type",
        "cafe=\"}",
        "cafe in (a|b)",
    ]
    .map(str::to_owned);
    let value = prop_oneof![
        proptest::string::string_regex("[A-Za-z0-9_.-]{0,10}").unwrap(),
        proptest::sample::select(HOSTILE_VALUES).prop_map(str::to_owned),
    ];
    let requirement = (
        proptest::sample::select(&["cafe", "type", "pod", "code"][..]),
        proptest::sample::select(&["=", "==", "!=", " in ", " notin ", "exists", "!"][..]),
        proptest::collection::vec(value, 1..4),
    )
        .prop_map(|(key, op, values)| match op {
            "exists" => key.to_owned(),
            "!" => format!("!{key}"),
            " in " | " notin " => format!("{key}{op}({})", values.join(",")),
            _ => format!("{key}{op}{}", values[0]),
        });
    let selector = prop_oneof![
        4 => proptest::collection::vec(requirement, 1..4).prop_map(|r| r.join(",")),
        1 => assembled(SELECTOR_TOKENS, 10),
    ];
    let definition = ExternalMetricConfig {
        name: "m".to_owned(),
        query: "sum(rate(m{SCOPE}[WINDOW]))".to_owned(),
        labels: ["cafe", "type", "pod", "code"].map(str::to_owned).to_vec(),
        window: None,
    };
    let reached = std::cell::Cell::new(0usize);
    run(5000, corpus, selector, |input| {
        let Ok(selector) = LabelSelector::parse(&input) else { return Ok(()) };
        let Ok(matchers) = percolator::external::selector_matchers(&definition, &selector) else {
            return Ok(());
        };
        let promql = render(&definition.query, &matchers, Duration::from_secs(60)).unwrap();
        let block = promql
            .strip_prefix("sum(rate(m{")
            .and_then(|s| s.strip_suffix("}[1m]))"))
            .ok_or_else(|| TestCaseError::fail(format!("shape: {promql}")))?;
        // Split the block on the commas between matchers (outside literals).
        let mut written = Vec::new();
        let mut rest = block;
        while !rest.is_empty() {
            let quote = rest.find('"').ok_or_else(|| TestCaseError::fail(format!("no literal: {promql}")))?;
            let end = quote + literal_end(&rest[quote..]).map_err(TestCaseError::fail)?;
            written.push(parse_matcher(&rest[..end]).map_err(TestCaseError::fail)?);
            rest = rest[end..].strip_prefix(',').unwrap_or(&rest[end..]);
            prop_assert!(rest.is_empty() || !rest.starts_with(','), "{promql}");
        }
        let mut expected: Vec<(String, &str, Vec<u8>)> = Vec::new();
        for requirement in selector.requirements() {
            let (key, op, value) = match requirement {
                Requirement::Expr(Expression::Equal(k, v)) => (k, "=", v.clone()),
                Requirement::Expr(Expression::NotEqual(k, v)) => (k, "!=", v.clone()),
                Requirement::Expr(Expression::In(k, vs)) => (k, "=~", regex_of(vs)),
                Requirement::Expr(Expression::NotIn(k, vs)) => (k, "!~", regex_of(vs)),
                Requirement::Expr(Expression::Exists(k)) => (k, "!=", String::new()),
                Requirement::Expr(Expression::DoesNotExist(k)) => (k, "=", String::new()),
                _ => return Ok(()),
            };
            expected.push((key.clone(), op, value.into_bytes()));
        }
        prop_assert_eq!(written, expected, "{} -> {}", input, promql);
        reached.set(reached.get() + 1);
        Ok(())
    });
    assert!(reached.get() > 100, "too few selectors reached render: {}", reached.get());
}

/// The regex a set of values must become: the values, regex-escaped, joined with `|`.
fn regex_of(values: &BTreeSet<String>) -> String {
    values
        .iter()
        .map(|v| {
            v.chars()
                .flat_map(|c| if "\\.+*?()|[]{}^$".contains(c) { vec!['\\', c] } else { vec![c] })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

// ---------------------------------------------------------------------------------------------
// Kubelet parser
// ---------------------------------------------------------------------------------------------

const KUBELET_TOKENS: &[&str] = &[
    "{",
    "}",
    "\"",
    "\\",
    ",",
    "=",
    "\n",
    " ",
    "NaN",
    "+Inf",
    "-Inf",
    "1e999",
    "-1",
    "0x10",
    "1_000",
    "99999999999999999999999",
    "# TYPE x counter\n",
    "# HELP\n",
    "container=\"\"",
    "namespace=",
    "pod=\"p\"",
    "\u{0}",
    "é",
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    "container_start_time_seconds",
    "scrape_error 1\n",
    "node_cpu_usage_seconds_total 1 1\n",
];

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, String),
    DuplicateLine(usize),
}

fn mutate(base: &str, mutations: &[Mutation]) -> String {
    let mut bytes = base.as_bytes().to_vec();
    for m in mutations {
        let at = |p: usize| if bytes.is_empty() { 0 } else { p % (bytes.len() + 1) };
        match m {
            Mutation::Truncate(p) => {
                let p = at(*p);
                bytes.truncate(p);
            }
            Mutation::Delete(p, n) => {
                let p = at(*p);
                let end = (p + n).min(bytes.len());
                bytes.drain(p..end);
            }
            Mutation::Insert(p, s) => {
                let p = at(*p);
                bytes.splice(p..p, s.bytes());
            }
            Mutation::DuplicateLine(p) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                if !lines.is_empty() {
                    let line = lines[p % lines.len()].to_owned();
                    bytes.extend_from_slice(b"\n");
                    bytes.extend_from_slice(line.as_bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<usize>().prop_map(Mutation::Truncate),
        3 => (any::<usize>(), 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        5 => (any::<usize>(), prop_oneof![proptest::sample::select(KUBELET_TOKENS).prop_map(str::to_owned), text(12)])
            .prop_map(|(p, s)| Mutation::Insert(p, s)),
        2 => any::<usize>().prop_map(Mutation::DuplicateLine),
    ]
}

#[test]
fn kubelet_parser() {
    let fixture = include_str!("fixtures/kubelet-metrics-resource.txt");
    let corpus = [
        String::new(),
        fixture.to_owned(),
        "scrape_error 1\n".to_owned(),
        // The old format: no timestamps.
        fixture
            .lines()
            .map(|l| l.rsplit_once(' ').map_or(l, |(head, _)| head))
            .collect::<Vec<_>>()
            .join("\n"),
        "container_cpu_usage_seconds_total{container=\"a\",namespace=\"n\",pod=\"p\"} NaN 1\n".to_owned(),
        "container_cpu_usage_seconds_total{container=\"a\\\"\",namespace=\"n\",pod=\"p\"} 1e999 -1\n"
            .to_owned(),
    ]
    .map(|s| (s.clone(), s));
    let body = || {
        prop_oneof![
            4 => proptest::collection::vec(mutation(), 1..8).prop_map(move |m| mutate(fixture, &m)),
            1 => text(200),
            1 => assembled(KUBELET_TOKENS, 30),
        ]
    };
    let scrape = jiff::Timestamp::from_second(1_764_496_812).unwrap();
    run(3000, corpus, (body(), body()), |(first, second)| {
        let mut node = percolator::sources::kubelet::NodeSamples::new();
        for (i, body) in [first, second].iter().enumerate() {
            let at = scrape + jiff::SignedDuration::from_secs(i as i64 * 10);
            if let Ok(batch) = percolator::sources::kubelet::parse_resource_metrics(body, at) {
                let _ = node.update(batch);
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Configuration loader
// ---------------------------------------------------------------------------------------------

const YAML_TOKENS: &[&str] = &[
    "window: ",
    "podMetricsSummary:\n",
    "  requests: ",
    "  errors: ",
    "cafeBrewStats:\n",
    "  brews: ",
    "  p95: ",
    "  temperature: ",
    "externalMetrics:\n",
    "- name: ",
    "  query: ",
    "  labels: [",
    "]",
    "  window: ",
    "\n",
    "5m",
    "1s",
    "0s",
    "10ms",
    "-1m",
    "99999999h",
    "sum(rate(x{SCOPE}[WINDOW]))",
    "x{SCOPE}",
    "{SCOPE}",
    "SCOPE",
    "WINDOW",
    "[WINDOW:1m]",
    "by (namespace, pod)",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "(",
    ")",
    "#",
    "&a",
    "*a",
    "!!str",
    "~",
    "null",
    "- ",
    ": ",
    "cafe",
    "namespace",
    "__name__",
    "status",
    "é",
    "\t",
    "---\n",
];

#[test]
fn configuration_loader() {
    let corpus = [
        String::new(),
        "window: 2m\n".to_owned(),
        "externalMetrics: []\n".to_owned(),
        "externalMetrics:\n- name: a\n  query: x{SCOPE}\n  labels: [cafe, cafe]\n".to_owned(),
        "podMetricsSummary:\n  requests: 'sum(x{SCOPE}[WINDOW]'\n".to_owned(),
        "a: &a [*a, *a]\n".to_owned(),
        "window: 99999999999999999999h\n".to_owned(),
    ];
    let window = Duration::from_secs(300);
    let check = percolator::server::config_check();
    run(5000, corpus, prop_oneof![assembled(YAML_TOKENS, 24), text(120)], |yaml| {
        if let Ok(config) = QueryFile::from_yaml(&yaml, "fuzz.yaml", &check) {
            let scope = [Matcher::eq("namespace", "shop\"}").unwrap()];
            let window = config.window.unwrap_or(window);
            let templates = config
                .kind_queries
                .values()
                .flat_map(|queries| queries.values())
                .chain(config.external_metrics.iter().flatten().map(|m| &m.query));
            for template in templates {
                let _ = render(template, &scope, window);
                let _ = render(template, &[], window);
            }
        }
        Ok(())
    });
}

#[test]
fn promql_templates() {
    run(
        5000,
        [
            "x{SCOPE}".to_owned(),
            "{SCOPE,}".to_owned(),
            "x{SCOPE}[WINDOW:WINDOW]".to_owned(),
            "\"SCOPE\"{SCOPE}".to_owned(),
        ],
        prop_oneof![assembled(YAML_TOKENS, 12), text(60)],
        |template| {
            if validate_template(&template).is_ok() {
                let scope =
                    [Matcher::eq("namespace", "a\"b").unwrap(), Matcher::any_of("pod", &["x|y"]).unwrap()];
                let _ = render(&template, &scope, Duration::from_millis(1500));
            }
            Ok(())
        },
    );
}
