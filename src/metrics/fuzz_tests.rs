//! Hostile input to the whole router (RELIABILITY.md, "Hostile input"): `router(state).oneshot`
//! on the fake kinds of `testutil` and the external metrics API on its recording fake
//! Prometheus. Arbitrary methods, paths, queries and headers (the strategies of
//! `test_support::fuzz`, shared with `tests/fuzz.rs`) are answered 2xx/4xx, never 5xx, never a
//! panic; every query the router sends to Prometheus has only well-formed PromQL string
//! literals.
//!
//! A unit test rather than a part of `tests/fuzz.rs` because the fake kinds are test machinery,
//! which the public library does not export.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use proptest::prelude::*;
use tower::ServiceExt;

use super::testutil::{
    Behavior, FakeKind, FakeWorkloads, GADGET, WIDGET, mk_defaults, mk_item, mk_prom, mk_sample,
};
use crate::config::LiveConfig;
use crate::kinds::{KindInfo, Kinds};
use crate::metrics::custom::CustomMetrics;
use crate::metrics::external::ExternalMetrics;
use apiserver::CacheSettings;
use apiserver::Metrics;
use apiserver::{ApiState, router};
use test_support::fuzz::{check_promql_literals, method, path, query, run, text};

/// A fake kind with the names the path strategy favours (`w1`, `w2`) and a warning that needs
/// escaping.
fn fuzz_kind(info: &'static KindInfo) -> Arc<FakeKind> {
    let items =
        [("shop", "w1", "web"), ("shop", "w2", "db"), ("default", "w3", "web")].map(|(ns, name, app)| {
            mk_item(info, if info.namespaced { ns } else { "" }, name, &[("app", app)], "1")
        });
    FakeKind::new(info, items.into(), Behavior::Ok, &["a \"warning\"\n"])
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
    apiserver::install_crypto_provider();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    // One sample per query, with labels that need escaping.
    let sample = mk_sample(&[("namespace", "shop"), ("cafe", "c\"}"), ("type", "x")], 1.5);
    let prometheus = mk_prom(Ok(vec![sample]), Duration::ZERO);
    let app = runtime.block_on(async {
        let kinds: Kinds = vec![fuzz_kind(&WIDGET), fuzz_kind(&GADGET)];
        let metrics = Metrics::new(crate::METRICS_NAMESPACE);
        let config = LiveConfig::fixed(mk_defaults(), None);
        let cache = CacheSettings::new(Duration::from_millis(1), metrics.clone());
        let external = ExternalMetrics::new(prometheus.clone(), config.clone(), &cache);
        let pods = vec![crate::kinds::testkit::mk_pod(
            "shop",
            "w1",
            "n",
            &[("app", "w")],
            &["c"],
            "2026-07-01T10:00:00Z",
        )];
        let custom = CustomMetrics::new(
            prometheus.clone(),
            crate::kinds::testkit::FakeInventory::with(pods),
            Arc::new(FakeWorkloads::default()),
            config,
            &cache,
        );
        let state = ApiState::new(kinds, Arc::new(|| true), metrics)
            .with_server_info(crate::kinds::server_info())
            .with_group(Arc::new(external))
            .with_group(Arc::new(custom));
        router(state)
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
        (
            "GET",
            "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/pods/*/http_requests_per_second",
            Some("labelSelector=app%3Dw&metricLabelSelector=code%20notin%20(%22%7D)"),
        ),
        ("GET", "/apis/custom.metrics.k8s.io/v1beta1/namespaces/shop/deployments.apps/w1/http_requests_per_second", None),
        ("GET", "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop/metrics/http_errors_per_second", Some("metricLabelSelector=code")),
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
        for promql in prometheus.queries.lock().unwrap().drain(..) {
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
