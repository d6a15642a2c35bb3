//! Handler tests of the external metrics API: `router(state_with_fakes).oneshot(request)`
//! against the counting fake Prometheus of `testutil` (`MkProm`), with exact JSON and exact
//! PromQL comparison.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use http::StatusCode;
use serde_json::{Value, json};

use super::testutil::{MkProm, Reply, call_with, mk_check, mk_defaults, mk_prom, mk_sample};
use crate::config::{ExternalMetricConfig, LiveConfig, QueryFile};
use crate::metrics::external::*;
use crate::sources::PromError;
use crate::sources::prometheus::Template;
use apiserver::CacheSettings;
use apiserver::Metrics;
use apiserver::{ApiState, router};
use k8s_wire::ApiError;
use k8s_wire::LabelSelector;
use test_support::all_at_once;

const HPA_ACCEPT: &str = "application/vnd.kubernetes.protobuf, */*";
const V2_ACCEPT: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const BREWS: &str = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute";

fn mk_app_with(prom: Arc<MkProm>, config: Arc<LiveConfig<Template>>, ttl: Duration) -> Router {
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let external = ExternalMetrics::new(prom, config, &CacheSettings::new(ttl, metrics.clone()));
    router(
        ApiState::new(Vec::new(), Arc::new(|| true), metrics)
            .with_server_info(crate::kinds::server_info())
            .with_group(Arc::new(external)),
    )
}

fn mk_app(prom: Arc<MkProm>) -> Router {
    mk_app_with(prom, LiveConfig::fixed(mk_defaults(), None), Duration::from_secs(60))
}

async fn call(app: &Router, method: &str, uri: &str, accept: Option<&str>) -> Reply {
    let accept: Vec<(&str, &str)> = accept.map(|a| ("accept", a)).into_iter().collect();
    call_with(app, method, uri, &accept).await
}

async fn get(app: &Router, uri: &str) -> Reply {
    call(app, "GET", uri, Some(HPA_ACCEPT)).await
}

fn with_selector(path: &str, selector: &str) -> String {
    let encoded: String = url::form_urlencoded::byte_serialize(selector.as_bytes()).collect();
    format!("{path}?labelSelector={encoded}")
}

fn assert_status(r: &Reply, code: u16, reason: &str, message: &str) {
    assert_eq!(r.status.as_u16(), code, "{}", String::from_utf8_lossy(&r.body));
    assert_eq!(r.header("content-type"), "application/json");
    let v = r.json();
    assert_eq!(v["kind"], "Status");
    assert_eq!(v["status"], "Failure");
    assert_eq!(v["reason"], reason);
    assert_eq!(v["code"], code);
    assert_eq!(v["message"], message);
}

// ---- values ----

#[tokio::test]
async fn values_map_to_an_external_metric_value_list() {
    let prom = mk_prom(
        Ok(vec![
            mk_sample(&[("namespace", "shop"), ("cafe", "lungo-bar"), ("type", "lungo")], 3.0),
            // rate() * 60 float noise is rounded to micro units.
            mk_sample(
                &[("__name__", "x"), ("namespace", "shop"), ("cafe", "espresso-bar"), ("type", "espresso")],
                8.400000000001,
            ),
            mk_sample(&[], 0.0000123456),
            // A ratio over no requests has no value: no item, rather than a made-up one.
            mk_sample(&[("namespace", "shop"), ("cafe", "empty")], f64::NAN),
            mk_sample(&[("namespace", "shop"), ("cafe", "inf")], f64::INFINITY),
        ]),
        Duration::ZERO,
    );
    let app = mk_app(prom.clone());
    let r = get(&app, BREWS).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(
        r.json(),
        json!({
            "kind": "ExternalMetricValueList",
            "apiVersion": "external.metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": [
                {"metricName": "cafe_brews_per_minute", "metricLabels": {},
                 "timestamp": "2026-07-01T10:00:00Z", "window": 300, "value": "12u"},
                {"metricName": "cafe_brews_per_minute",
                 "metricLabels": {"cafe": "espresso-bar", "namespace": "shop", "type": "espresso"},
                 "timestamp": "2026-07-01T10:00:00Z", "window": 300, "value": "8400m"},
                {"metricName": "cafe_brews_per_minute",
                 "metricLabels": {"cafe": "lungo-bar", "namespace": "shop", "type": "lungo"},
                 "timestamp": "2026-07-01T10:00:00Z", "window": 300, "value": "3"},
            ],
        })
    );
    assert_eq!(
        prom.last_query(),
        r#"sum by (namespace, cafe, type) (rate(cafe_brews_total{namespace="shop"}[5m])) * 60"#
    );
}

#[tokio::test]
async fn empty_results_are_an_empty_list() {
    let app = mk_app(mk_prom(Ok(vec![]), Duration::ZERO));
    let r = get(&app, &with_selector(BREWS, "cafe=nowhere")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1",
               "metadata": {}, "items": []})
    );
}

#[tokio::test]
async fn window_comes_from_the_metric_then_the_configuration() {
    let config = QueryFile::from_yaml(
        "window: 2m\nexternalMetrics:\n- name: fast\n  query: sum by (namespace) (rate(x{SCOPE}[WINDOW]))\n  window: 30s\n- name: slow\n  query: sum by (namespace) (rate(x{SCOPE}[WINDOW]))\n",
        "f",
        &mk_check(),
    )
    .unwrap();
    let prom = mk_prom(Ok(vec![mk_sample(&[("namespace", "shop")], 1.0)]), Duration::ZERO);
    let app = mk_app_with(prom.clone(), LiveConfig::fixed(config, None), Duration::from_secs(60));
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/fast").await;
    assert_eq!(r.json()["items"][0]["window"], 30);
    assert_eq!(prom.last_query(), r#"sum by (namespace) (rate(x{namespace="shop"}[30s]))"#);
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/slow").await;
    assert_eq!(r.json()["items"][0]["window"], 120);
    assert_eq!(prom.last_query(), r#"sum by (namespace) (rate(x{namespace="shop"}[2m]))"#);
}

// ---- selectors → matchers ----

#[tokio::test]
async fn selectors_become_escaped_matchers() {
    let prom = mk_prom(Ok(vec![]), Duration::ZERO);
    let app = mk_app(prom.clone());
    let brews = |scope: &str| {
        format!(
            "sum by (namespace, cafe, type) (rate(cafe_brews_total{{namespace=\"shop\",{scope}}}[5m])) * 60"
        )
    };
    for (selector, scope) in [
        ("cafe=espresso-bar", r#"cafe="espresso-bar""#),
        ("cafe==espresso-bar", r#"cafe="espresso-bar""#),
        ("type!=latte", r#"type!="latte""#),
        ("cafe in (lungo,a.b)", r#"cafe=~"a\\.b|lungo""#),
        ("type notin (latte,lungo)", r#"type!~"latte|lungo""#),
        ("cafe", r#"cafe!="""#),
        ("!cafe", r#"cafe="""#),
        ("type in (x),cafe=a", r#"cafe="a",type=~"x""#),
    ] {
        let r = get(&app, &with_selector(BREWS, selector)).await;
        assert_eq!(r.status, StatusCode::OK, "{selector}: {}", String::from_utf8_lossy(&r.body));
        assert_eq!(prom.last_query(), brews(scope), "{selector}");
    }
    // Every SCOPE of the template gets the namespace and the selector.
    let r = get(
        &app,
        &with_selector("/apis/external.metrics.k8s.io/v1beta1/namespaces/web/http_error_ratio", "pod=web-1"),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        prom.last_query(),
        r#"sum by (namespace, pod) (rate(http_requests_total{code=~"5..",namespace="web",pod="web-1"}[5m])) / sum by (namespace, pod) (rate(http_requests_total{namespace="web",pod="web-1"}[5m]))"#
    );
}

#[test]
fn matchers_for_each_operator() {
    let definition = ExternalMetricConfig {
        name: "m".into(),
        query: "x{SCOPE}".into(),
        labels: vec!["a".into(), "b".into()],
        window: None,
    };
    let rendered = |selector: &str| {
        selector_matchers(&definition, &LabelSelector::parse(selector).unwrap())
            .map(|ms| ms.iter().map(ToString::to_string).collect::<Vec<_>>().join(","))
    };
    assert_eq!(rendered("").unwrap(), "");
    assert_eq!(rendered("a=1,b!=2").unwrap(), r#"a="1",b!="2""#);
    assert_eq!(rendered("a in (x,y),b notin (z)").unwrap(), r#"a=~"x|y",b!~"z""#);
    assert_eq!(rendered("a,!b").unwrap(), r#"a!="",b="""#);
    assert_eq!(rendered("a=1,a!=2").unwrap(), r#"a="1",a!="2""#);
    assert_eq!(
        rendered("a>1"),
        Err(ApiError::BadRequest(
            "label \"a\": the operators gt and lt are not supported by metric selectors; use =, ==, !=, in, notin, exists or !exists".into()
        ))
    );
    let none = ExternalMetricConfig { labels: vec![], ..definition.clone() };
    assert_eq!(
        selector_matchers(&none, &LabelSelector::parse("a=1").unwrap()),
        Err(ApiError::BadRequest(
            "label \"a\" is not accepted by the external metric m; it accepts no label selector".into()
        ))
    );
}

#[tokio::test]
async fn selector_errors_are_400s_that_say_why() {
    let prom = mk_prom(Ok(vec![]), Duration::ZERO);
    let app = mk_app(prom.clone());
    let r = get(&app, &with_selector(BREWS, "cafe=a,pod=web-1")).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "label \"pod\" is not accepted by the external metric cafe_brews_per_minute; it accepts: cafe, type",
    );
    // A selector can never widen the namespace.
    let r = get(&app, &with_selector(BREWS, "namespace=other")).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "label \"namespace\" is not accepted by the external metric cafe_brews_per_minute; it accepts: cafe, type",
    );
    let r = get(&app, &with_selector(BREWS, "cafe in (a")).await;
    assert_status(&r, 400, "BadRequest", "unable to parse requirement: found '', expected: ',' or ')'");
    let r = get(&app, &with_selector(BREWS, "cafe=a\"b")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["message"].as_str().unwrap().starts_with("unable to parse requirement: values[0][cafe]")
    );
    let r = get(&app, &with_selector(BREWS, "cafe>1")).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "label \"cafe\": the operators gt and lt are not supported by metric selectors; use =, ==, !=, in, notin, exists or !exists",
    );
    assert_eq!(prom.calls.load(Ordering::SeqCst), 0, "no rejected request reaches Prometheus");
}

// ---- errors and routes ----

#[tokio::test]
async fn unknown_metrics_and_other_paths_are_404s() {
    let prom = mk_prom(Ok(vec![]), Duration::ZERO);
    let app = mk_app(prom.clone());
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/nope").await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "the server could not find the metric nope for namespaces/shop",
               "reason": "NotFound", "code": 404})
    );
    for path in [
        "/apis/external.metrics.k8s.io/v1beta1/cafe_brews_per_minute",
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop",
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute/x",
        "/apis/external.metrics.k8s.io/v1beta2/namespaces/shop/cafe_brews_per_minute",
        "/apis/external.metrics.k8s.io/v1beta1/watch/namespaces/shop/cafe_brews_per_minute",
    ] {
        let r = get(&app, path).await;
        assert_status(&r, 404, "NotFound", "the server could not find the requested resource");
    }
    assert_eq!(prom.calls.load(Ordering::SeqCst), 0);
}

#[tokio::test]
async fn bad_namespaces_write_verbs_and_watch_are_refused() {
    let app = mk_app(mk_prom(Ok(vec![]), Duration::ZERO));
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/Shop_1/cafe_brews_per_minute").await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(
        r.json()["message"].as_str().unwrap().starts_with("invalid namespace \"Shop_1\": "),
        "{:?}",
        r.json()
    );
    for (method, verb) in
        [("POST", "create"), ("PUT", "update"), ("PATCH", "patch"), ("DELETE", "deletecollection")]
    {
        let r = call(&app, method, BREWS, None).await;
        assert_status(
            &r,
            405,
            "MethodNotAllowed",
            &format!(
                "{verb} is not supported on resources of kind \"cafe_brews_per_minute.external.metrics.k8s.io\""
            ),
        );
    }
    let r = get(&app, &format!("{BREWS}?watch=true")).await;
    assert_status(
        &r,
        405,
        "MethodNotAllowed",
        "watch is not supported on resources of kind \"cafe_brews_per_minute.external.metrics.k8s.io\"",
    );
}

#[tokio::test]
async fn content_negotiation_answers_json() {
    let app = mk_app(mk_prom(Ok(vec![]), Duration::ZERO));
    for accept in [None, Some(HPA_ACCEPT), Some("application/json"), Some("*/*")] {
        let r = call(&app, "GET", BREWS, accept).await;
        assert_eq!(r.status, StatusCode::OK, "{accept:?}");
        assert_eq!(r.header("content-type"), "application/json");
    }
    let r = call(&app, "GET", BREWS, Some("application/vnd.kubernetes.protobuf")).await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn prometheus_failures_are_503s_with_retry_after_and_are_not_cached() {
    let prom = mk_prom(Err(PromError::Unreachable("connection refused to 10.0.0.9".into())), Duration::ZERO);
    let app = mk_app(prom.clone());
    let r = get(&app, BREWS).await;
    assert_status(
        &r,
        503,
        "ServiceUnavailable",
        "unable to fetch the external metric cafe_brews_per_minute: Prometheus is unreachable",
    );
    assert_eq!(r.header("retry-after"), "1");
    assert_eq!(r.json()["details"], json!({"retryAfterSeconds": 1}));

    prom.set_reply(Err(PromError::Query("execution: query timed out".into())));
    let r = get(&app, BREWS).await;
    assert_status(
        &r,
        503,
        "ServiceUnavailable",
        "unable to fetch the external metric cafe_brews_per_minute: the Prometheus query failed",
    );
    assert_eq!(r.header("retry-after"), "1");

    prom.set_reply(Ok(vec![mk_sample(&[("namespace", "shop")], 2.0)]));
    let r = get(&app, BREWS).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(prom.calls.load(Ordering::SeqCst), 3, "errors are not cached");
}

// ---- caching ----

#[tokio::test]
async fn concurrent_identical_requests_share_one_query() {
    let prom = mk_prom(Ok(vec![mk_sample(&[("namespace", "shop")], 1.0)]), Duration::from_millis(100));
    let app = mk_app(prom.clone());
    let replies = all_at_once(100, |i| {
        let app = app.clone();
        // Two spellings of one selector share the entry.
        let selector = if i % 2 == 0 { "type in (lungo),cafe=a" } else { "cafe==a,type in (lungo)" };
        async move { get(&app, &with_selector(BREWS, selector)).await }
    });
    for r in replies.await {
        assert_eq!(r.status, StatusCode::OK);
        assert_eq!(r.json()["items"][0]["value"], "1");
    }
    assert_eq!(prom.calls.load(Ordering::SeqCst), 1);
    get(&app, &with_selector(BREWS, "cafe=a")).await;
    get(
        &app,
        &with_selector(
            "/apis/external.metrics.k8s.io/v1beta1/namespaces/other/cafe_brews_per_minute",
            "cafe=a,type in (lungo)",
        ),
    )
    .await;
    assert_eq!(prom.calls.load(Ordering::SeqCst), 3, "other selectors and namespaces are other entries");
    let metrics = get(&app, "/metrics").await;
    let text = String::from_utf8_lossy(&metrics.body);
    assert!(text.contains("cache=\"external.metrics.k8s.io\",result=\"hit\"} 99"), "{text}");
    assert!(text.contains("resource=\"cafe_brews_per_minute\",verb=\"list\",code=\"200\"} 102"), "{text}");
}

#[tokio::test]
async fn entries_expire_after_the_ttl() {
    let prom = mk_prom(Ok(vec![]), Duration::ZERO);
    let app = mk_app_with(prom.clone(), LiveConfig::fixed(mk_defaults(), None), Duration::from_millis(200));
    get(&app, BREWS).await;
    get(&app, BREWS).await;
    assert_eq!(prom.calls.load(Ordering::SeqCst), 1);
    tokio::time::sleep(Duration::from_millis(300)).await;
    get(&app, BREWS).await;
    assert_eq!(prom.calls.load(Ordering::SeqCst), 2);
}

// ---- discovery ----

#[tokio::test]
async fn discovery_lists_one_resource_per_metric() {
    let app = mk_app(mk_prom(Ok(vec![]), Duration::ZERO));
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1").await;
    assert_eq!(r.status, StatusCode::OK);
    let resource = |name: &str| json!({"name": name, "singularName": "", "namespaced": true, "kind": "ExternalMetricValueList", "verbs": ["get"]});
    assert_eq!(
        r.json(),
        json!({
            "kind": "APIResourceList", "apiVersion": "v1", "groupVersion": "external.metrics.k8s.io/v1beta1",
            "resources": [
                resource("cafe_brews_per_minute"),
                resource("cafe_brew_duration_p95_seconds"),
                resource("http_requests_per_second"),
                resource("http_error_ratio"),
            ],
        })
    );
    let gv = json!({"groupVersion": "external.metrics.k8s.io/v1beta1", "version": "v1beta1"});
    assert_eq!(
        get(&app, "/apis/external.metrics.k8s.io").await.json(),
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": "external.metrics.k8s.io",
               "versions": [gv], "preferredVersion": gv})
    );
    let groups = get(&app, "/apis").await.json();
    assert_eq!(
        groups["groups"][1],
        json!({"name": "external.metrics.k8s.io", "versions": [gv], "preferredVersion": gv})
    );
    let v2 = call(&app, "GET", "/apis", Some(V2_ACCEPT)).await.json();
    let external = &v2["items"][1];
    assert_eq!(external["metadata"]["name"], "external.metrics.k8s.io");
    assert_eq!(external["versions"][0]["freshness"], "Current");
    assert_eq!(
        external["versions"][0]["resources"][0],
        json!({"resource": "cafe_brews_per_minute",
               "responseKind": {"group": "external.metrics.k8s.io", "version": "v1beta1", "kind": "ExternalMetricValueList"},
               "scope": "Namespaced", "singularResource": "", "verbs": ["get"]})
    );
}

#[tokio::test]
async fn without_the_flag_nothing_is_served_or_advertised() {
    let app = router(
        ApiState::new(Vec::new(), Arc::new(|| true), Metrics::new(crate::METRICS_NAMESPACE))
            .with_server_info(crate::kinds::server_info()),
    );
    let groups = get(&app, "/apis").await.json();
    assert_eq!(groups["groups"].as_array().unwrap().len(), 1, "{groups}");
    let v2 = call(&app, "GET", "/apis", Some(V2_ACCEPT)).await.json();
    assert_eq!(v2["items"].as_array().unwrap().len(), 1, "{v2}");
    for path in ["/apis/external.metrics.k8s.io", "/apis/external.metrics.k8s.io/v1beta1", BREWS] {
        assert_eq!(get(&app, path).await.status, StatusCode::NOT_FOUND, "{path}");
    }
}

#[tokio::test]
async fn discovery_and_serving_follow_configuration_reloads() {
    let dir = std::env::temp_dir().join(format!("percolator-external-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("config.yaml");
    let one = "externalMetrics:\n- name: queue_depth\n  query: max by (namespace, queue) (q{SCOPE})\n  labels: [queue]\n";
    std::fs::write(&file, one).unwrap();
    let live = LiveConfig::load(Some(&file), None, mk_check()).unwrap();
    let prom = mk_prom(Ok(vec![]), Duration::ZERO);
    let app = mk_app_with(prom.clone(), live.clone(), Duration::from_secs(60));

    let names = |v: Value| -> Vec<String> {
        v["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_owned()).collect()
    };
    assert_eq!(names(get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json()), ["queue_depth"]);
    let before = call(&app, "GET", "/apis", Some(V2_ACCEPT)).await;
    let etag = before.header("etag").to_owned();
    assert!(!etag.is_empty());
    let path = |m: &str| format!("/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/{m}");
    get(&app, &with_selector(&path("queue_depth"), "queue=a")).await;
    assert_eq!(prom.last_query(), r#"max by (namespace, queue) (q{namespace="shop",queue="a"})"#);

    let two = "externalMetrics:\n- name: queue_depth\n  query: sum by (namespace, queue) (q{SCOPE})\n  labels: [queue]\n- name: backlog\n  query: b{SCOPE}\n";
    std::fs::write(&file, two).unwrap();
    assert!(live.reload().unwrap());

    assert_eq!(
        names(get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json()),
        ["queue_depth", "backlog"]
    );
    let after = call(&app, "GET", "/apis", Some(V2_ACCEPT)).await;
    assert_ne!(after.header("etag"), etag, "the ETag follows the documents");
    let resources = &after.json()["items"][1]["versions"][0]["resources"];
    assert_eq!(resources[1]["resource"], "backlog");
    // The same request is not served from the old configuration's cache entry.
    get(&app, &with_selector(&path("queue_depth"), "queue=a")).await;
    assert_eq!(prom.last_query(), r#"sum by (namespace, queue) (q{namespace="shop",queue="a"})"#);
    assert_eq!(get(&app, &path("backlog")).await.status, StatusCode::OK);
    assert_eq!(prom.last_query(), r#"b{namespace="shop"}"#);

    // An invalid file (here: no metric) is rejected and the last good configuration stays.
    std::fs::write(&file, "externalMetrics: []\n").unwrap();
    assert!(live.reload().is_err());
    assert_eq!(
        names(get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json()),
        ["queue_depth", "backlog"]
    );
    let one_left = "externalMetrics:\n- name: backlog\n  query: b{SCOPE}\n";
    std::fs::write(&file, one_left).unwrap();
    assert!(live.reload().unwrap());
    assert_eq!(names(get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json()), ["backlog"]);
    let r = get(&app, &path("queue_depth")).await;
    assert_eq!(r.json()["message"], "the server could not find the metric queue_depth for namespaces/shop");
    let _ = std::fs::remove_dir_all(&dir);
}

// ---- an adapter configuration's externalRules ----

const ADAPTER: &str = r#"
externalRules:
- seriesQuery: '{__name__=~"^http_requests_total$",namespace!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
  name:
    matches: "^(.*)_total$"
    as: "${1}_rate"
  metricsQuery: 'sum by (code) (rate(<<.Series>>{<<.LabelMatchers>>}[2m]))'
"#;

/// The external API with `--config`'s defaults and the adapter configuration `yaml`, whose
/// series list holds `http_requests_total`.
async fn mk_adapter_app(yaml: &str) -> (Arc<MkProm>, Router) {
    let dir =
        std::env::temp_dir().join(format!("percolator-adapter-api-{}-{}", std::process::id(), yaml.len()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("adapter.yaml");
    std::fs::write(&path, yaml).unwrap();
    let prom = mk_prom(Ok(vec![mk_sample(&[("code", "500")], 2.5)]), Duration::ZERO);
    *prom.series.lock().unwrap() = vec![
        [("__name__", "http_requests_total"), ("namespace", "shop"), ("pod", "web-1"), ("code", "500")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect(),
    ];
    let adapter =
        crate::adapter::LiveAdapter::load(&path, prom.clone(), Duration::from_secs(600)).await.unwrap();
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let external = ExternalMetrics::new(
        prom.clone(),
        LiveConfig::fixed(mk_defaults(), None),
        &CacheSettings::new(Duration::from_secs(60), metrics.clone()),
    )
    .with_adapter(adapter);
    let app = router(
        ApiState::new(Vec::new(), Arc::new(|| true), metrics)
            .with_server_info(crate::kinds::server_info())
            .with_group(Arc::new(external)),
    );
    let _ = std::fs::remove_dir_all(&dir);
    (prom, app)
}

#[tokio::test]
async fn adapter_external_rules_are_served_with_escaped_matchers_beside_the_own_metrics() {
    let (prom, app) = mk_adapter_app(ADAPTER).await;
    assert_eq!(
        prom.queries.lock().unwrap().clone(),
        [r#"series {__name__=~"^http_requests_total$",namespace!=""}"#],
        "one listing of the rule's series query at load"
    );
    let path = "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/http_requests_rate";
    let r = get(&app, &with_selector(path, "code in (500,503)")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", String::from_utf8_lossy(&r.body));
    // The template's expansion: the selector's matchers, then the namespace's, as the adapter
    // orders them; set values escaped as literal alternatives.
    assert_eq!(
        prom.last_query(),
        r#"sum by (code) (rate(http_requests_total{code=~"500|503",namespace="shop"}[2m]))"#
    );
    assert_eq!(
        r.json(),
        json!({"kind": "ExternalMetricValueList", "apiVersion": "external.metrics.k8s.io/v1beta1", "metadata": {},
               "items": [{"metricName": "http_requests_rate", "metricLabels": {"code": "500"},
                          "timestamp": "2026-07-01T10:00:00Z", "value": "2500m"}]}),
        "no window, as the adapter writes its values"
    );
    // A single `in` value is a literal, not the raw regex the adapter passes through.
    assert_eq!(get(&app, &with_selector(path, "code in (5.0)")).await.status, StatusCode::OK);
    assert_eq!(
        prom.last_query(),
        r#"sum by (code) (rate(http_requests_total{code=~"5\\.0",namespace="shop"}[2m]))"#
    );
    assert_status(
        &get(&app, &with_selector(path, "code>5")).await,
        400,
        "BadRequest",
        "metric http_requests_rate: label selector requirement on \"code\": > and < have no Prometheus equivalent",
    );
    // Discovery lists the own metrics and the adapter's; the own ones still answer.
    let discovery = get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json();
    let names: Vec<&str> =
        discovery["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"http_requests_rate") && names.contains(&"cafe_brews_per_minute"), "{names:?}");
    assert_eq!(get(&app, BREWS).await.status, StatusCode::OK);
    let missing = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_rate").await;
    assert_eq!(missing.status, StatusCode::NOT_FOUND);
}
