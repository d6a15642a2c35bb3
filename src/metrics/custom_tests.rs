//! Handler tests of the custom metrics API: `router(state_with_fakes).oneshot(request)` with a
//! counting fake Prometheus, a fixed inventory and fake workload objects; exact JSON for both
//! versions and exact PromQL.
//!
//! Rules from `k8s.io/metrics` and the adapter library these tests hold the server to:
//! - v1beta2 items have `metric: {name, selector}` and `windowSeconds`; v1beta1 items have
//!   `metricName`, `selector` and `window`; `selector` is never omitted (no `omitempty`);
//! - `describedObject.apiVersion` is `group + "/" + version` (`/v1` for core kinds);
//! - a single-object request returns exactly one item (the HPA refuses any other count), and
//!   a missing value is a 404 `the server could not find the metric M for R N`;
//! - the Pods form is keyed by `describedObject.name`; discovery lists `R/M` per resource.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use axum::Router;
use kube::core::Selector;
use serde_json::{Value, json};

use super::testutil::{FakeWorkloads, MkProm, Reply, call_with, mk_defaults, mk_prom, mk_sample};
use crate::config::LiveConfig;
use crate::kinds::testkit::{FakeInventory, mk_pod};
use crate::metrics::custom::CustomMetrics;
use crate::sources::PromError;
use crate::sources::workloads::{PodSelection, Workload};
use apiserver::CacheSettings;
use apiserver::Metrics;
use apiserver::{ApiState, router};
use test_support::all_at_once;

const V2: &str = "/apis/custom.metrics.k8s.io/v1beta2";
const V1: &str = "/apis/custom.metrics.k8s.io/v1beta1";
const RPS: &str = "http_requests_per_second";
const AT: &str = "2026-07-01T10:00:00Z";

fn matching(pairs: &[(&str, &str)]) -> PodSelection {
    PodSelection::Matching(
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect::<Selector>(),
    )
}

/// In `shop`: web-1 (3 req/s), web-2 (5), web-3 (no value), api-1 (2, tier back); in `other`:
/// web-9 (100, must never show up in `shop`). Objects: Deployment and Service `web`
/// (app=web), Deployment `empty` (selects nothing running), Service `headless` (no selector).
fn mk_app(prom: Arc<MkProm>, workloads: Arc<FakeWorkloads>) -> Router {
    let pods = vec![
        mk_pod("shop", "api-1", "n", &[("app", "api"), ("tier", "back")], &["c"], AT),
        mk_pod("shop", "web-1", "n", &[("app", "web")], &["c"], AT),
        mk_pod("shop", "web-2", "n", &[("app", "web")], &["c"], AT),
        mk_pod("shop", "web-3", "n", &[("app", "web")], &["c"], AT),
        mk_pod("other", "web-9", "n", &[("app", "web")], &["c"], AT),
    ];
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let custom = CustomMetrics::new(
        prom,
        FakeInventory::with(pods),
        workloads,
        LiveConfig::fixed(mk_defaults(), None),
        &CacheSettings::new(Duration::from_secs(60), metrics.clone()),
    );
    router(
        ApiState::new(Vec::new(), Arc::new(|| true), metrics)
            .with_server_info(crate::kinds::server_info())
            .with_group(Arc::new(custom)),
    )
}

fn mk_workloads() -> Arc<FakeWorkloads> {
    let mut objects = HashMap::new();
    let mut add = |w: Workload, name: &str, selection: PodSelection| {
        objects.insert((w, "shop".to_owned(), name.to_owned()), selection);
    };
    add(Workload::Deployment, "web", matching(&[("app", "web")]));
    add(Workload::Service, "web", matching(&[("app", "web")]));
    add(Workload::Deployment, "empty", matching(&[("app", "gone")]));
    add(Workload::Service, "headless", PodSelection::Nothing);
    Arc::new(FakeWorkloads { objects, ..FakeWorkloads::default() })
}

fn mk_values() -> Arc<MkProm> {
    mk_prom(Ok(values()), Duration::ZERO)
}

fn values() -> Vec<crate::sources::PromSample> {
    vec![
        mk_sample(&[("namespace", "shop"), ("pod", "web-1")], 3.0),
        mk_sample(&[("namespace", "shop"), ("pod", "web-2")], 5.000000000001),
        mk_sample(&[("namespace", "shop"), ("pod", "api-1")], 2.0),
        mk_sample(&[("namespace", "shop"), ("pod", "not-running")], 7.0),
        mk_sample(&[("namespace", "shop"), ("pod", "web-nan")], f64::NAN),
        mk_sample(&[("namespace", "other"), ("pod", "web-9")], 100.0),
    ]
}

async fn get(app: &Router, uri: &str) -> Reply {
    call_with(app, "GET", uri, &[("accept", "application/vnd.kubernetes.protobuf, */*")]).await
}

fn encoded(selector: &str) -> String {
    url::form_urlencoded::byte_serialize(selector.as_bytes()).collect()
}

fn assert_status(r: &Reply, code: u16, reason: &str, message: &str) {
    assert_eq!(r.status.as_u16(), code, "{}", r.text());
    let v = r.json();
    assert_eq!(
        (v["kind"].as_str(), v["reason"].as_str(), v["code"].as_u64()),
        (Some("Status"), Some(reason), Some(u64::from(code)))
    );
    assert_eq!(v["message"], message);
}

fn pod(name: &str, value: &str) -> Value {
    json!({
        "describedObject": {"kind": "Pod", "namespace": "shop", "name": name, "apiVersion": "/v1"},
        "metric": {"name": RPS, "selector": null},
        "timestamp": "2026-07-01T10:00:00Z",
        "windowSeconds": 300,
        "value": value,
    })
}

#[tokio::test]
async fn pods_are_selected_from_the_inventory_with_one_namespace_query() {
    let prom = mk_values();
    let app = mk_app(prom.clone(), mk_workloads());
    let r =
        get(&app, &format!("{V2}/namespaces/shop/pods/*/{RPS}?labelSelector={}", encoded("app=web"))).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(
        r.json(),
        json!({
            "kind": "MetricValueList",
            "apiVersion": "custom.metrics.k8s.io/v1beta2",
            "metadata": {},
            // web-3 has no value, web-9 is in another namespace: absent, never 0.
            "items": [pod("web-1", "3"), pod("web-2", "5")],
        })
    );
    assert_eq!(
        prom.last_query(),
        r#"sum by (namespace, pod) (rate(http_requests_total{namespace="shop"}[5m]))"#,
        "one vector query for the namespace: no regex of pod names"
    );

    // Every pod of the namespace without a selector; the same query, from the cache.
    let r = get(&app, &format!("{V2}/namespaces/shop/pods/*/{RPS}")).await;
    let names: Vec<String> = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["describedObject"]["name"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(names, ["api-1", "web-1", "web-2"]);
    assert_eq!(prom.calls.load(Ordering::SeqCst), 1);
}

#[tokio::test]
async fn v1beta1_has_its_own_field_names() {
    let app = mk_app(mk_values(), mk_workloads());
    let r = get(&app, &format!("{V1}/namespaces/shop/pods/web-1/{RPS}")).await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json(),
        json!({
            "kind": "MetricValueList",
            "apiVersion": "custom.metrics.k8s.io/v1beta1",
            "metadata": {},
            "items": [{
                "describedObject": {"kind": "Pod", "namespace": "shop", "name": "web-1", "apiVersion": "/v1"},
                "metricName": RPS,
                "timestamp": "2026-07-01T10:00:00Z",
                "window": 300,
                "value": "3",
                "selector": null,
            }],
        })
    );
}

#[tokio::test]
async fn a_named_pod_without_a_value_or_not_running_is_a_404() {
    let app = mk_app(mk_values(), mk_workloads());
    let r = get(&app, &format!("{V2}/namespaces/shop/pods/web-3/{RPS}")).await;
    assert_status(&r, 404, "NotFound", &format!("the server could not find the metric {RPS} for pods web-3"));
    let r = get(&app, &format!("{V2}/namespaces/shop/pods/not-running/{RPS}")).await;
    assert_status(
        &r,
        404,
        "NotFound",
        &format!("the server could not find the metric {RPS} for pods not-running"),
    );
}

#[tokio::test]
async fn objects_aggregate_the_running_pods_their_selector_selects() {
    let workloads = mk_workloads();
    let app = mk_app(mk_values(), workloads.clone());
    for (path, kind, api_version) in
        [("deployments.apps/web", "Deployment", "apps/v1"), ("services/web", "Service", "/v1")]
    {
        let r = get(&app, &format!("{V2}/namespaces/shop/{path}/{RPS}")).await;
        assert_eq!(r.status, 200, "{path}: {}", r.text());
        let items = r.json()["items"].clone();
        assert_eq!(
            items,
            json!([{
                "describedObject": {"kind": kind, "namespace": "shop", "name": "web", "apiVersion": api_version},
                "metric": {"name": RPS, "selector": null},
                "timestamp": "2026-07-01T10:00:00Z",
                "windowSeconds": 300,
                "value": "8",
            }]),
            "{path}: web-1 + web-2 (web-3 has no value, web-9 is elsewhere)"
        );
    }
    // The namespace: every running pod with a value.
    let r = get(&app, &format!("{V2}/namespaces/shop/metrics/{RPS}")).await;
    assert_eq!(
        r.json()["items"][0]["describedObject"],
        json!({"kind": "Namespace", "name": "shop", "apiVersion": "/v1"})
    );
    assert_eq!(r.json()["items"][0]["value"], "10");
    let root = get(&app, &format!("{V1}/namespaces/shop/{RPS}")).await;
    assert_eq!(root.json()["items"][0]["value"], "10", "the root-scoped namespace form");

    // Objects that select nothing with a value, and objects that do not exist.
    let r = get(&app, &format!("{V2}/namespaces/shop/deployments.apps/empty/{RPS}")).await;
    assert_status(
        &r,
        404,
        "NotFound",
        &format!("the server could not find the metric {RPS} for deployments.apps empty"),
    );
    let r = get(&app, &format!("{V2}/namespaces/shop/services/headless/{RPS}")).await;
    assert_status(
        &r,
        404,
        "NotFound",
        &format!("the server could not find the metric {RPS} for services headless"),
    );
    let r = get(&app, &format!("{V2}/namespaces/shop/statefulsets.apps/db/{RPS}")).await;
    assert_status(&r, 404, "NotFound", r#"statefulsets.apps "db" not found"#);

    // kube-apiserver failing: 503 with Retry-After, never a 500.
    *workloads.down.lock().unwrap() = true;
    let r = get(&app, &format!("{V2}/namespaces/shop/daemonsets.apps/agent/{RPS}")).await;
    assert_eq!(r.status, 503, "{}", r.text());
    assert_eq!(r.header("retry-after"), "1");
}

#[tokio::test]
async fn aggregate_avg_and_max_follow_the_configuration() {
    let yaml = "customMetrics:\n- name: rps_avg\n  query: sum by (namespace, pod) (x{SCOPE})\n  aggregate: avg\n- name: rps_max\n  query: sum by (namespace, pod) (x{SCOPE})\n  aggregate: max\n";
    let file = crate::config::QueryFile::from_yaml(yaml, "f", &super::testutil::mk_check()).unwrap();
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let pods = vec![
        mk_pod("shop", "web-1", "n", &[("app", "web")], &["c"], AT),
        mk_pod("shop", "web-2", "n", &[("app", "web")], &["c"], AT),
    ];
    let custom = CustomMetrics::new(
        mk_values(),
        FakeInventory::with(pods),
        mk_workloads(),
        LiveConfig::fixed(file, None),
        &CacheSettings::new(Duration::from_secs(60), metrics.clone()),
    );
    let app = router(
        ApiState::new(Vec::new(), Arc::new(|| true), metrics)
            .with_server_info(crate::kinds::server_info())
            .with_group(Arc::new(custom)),
    );
    let value = |metric: &'static str| {
        let app = app.clone();
        async move {
            get(&app, &format!("{V2}/namespaces/shop/deployments.apps/web/{metric}")).await.json()["items"][0]
                ["value"]
                .clone()
        }
    };
    assert_eq!(value("rps_avg").await, "4");
    assert_eq!(value("rps_max").await, "5");
}

#[tokio::test]
async fn metric_label_selectors_become_escaped_matchers_on_declared_labels_only() {
    let prom = mk_values();
    let app = mk_app(prom.clone(), mk_workloads());
    let r = get(
        &app,
        &format!("{V2}/namespaces/shop/pods/*/{RPS}?metricLabelSelector={}", encoded("code in (500,503)")),
    )
    .await;
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(
        r.json()["items"][0]["metric"]["selector"],
        json!({"matchExpressions": [{"key": "code", "operator": "In", "values": ["500", "503"]}]})
    );
    assert_eq!(
        prom.last_query(),
        r#"sum by (namespace, pod) (rate(http_requests_total{namespace="shop",code=~"500|503"}[5m]))"#
    );
    let r =
        get(&app, &format!("{V2}/namespaces/shop/pods/*/{RPS}?metricLabelSelector={}", encoded("pod=web-1")))
            .await;
    assert_status(
        &r,
        400,
        "BadRequest",
        &format!("label \"pod\" is not accepted by the custom metric {RPS}; it accepts: code"),
    );
}

#[tokio::test]
async fn client_mistakes_are_precise_statuses() {
    let app = mk_app(mk_values(), mk_workloads());
    let cases: Vec<(String, u16, &str)> = vec![
        (
            format!("{V2}/namespaces/shop/pods/*/nope"),
            404,
            "the server could not find the metric nope for pods",
        ),
        (
            format!("{V2}/namespaces/shop/ingresses.networking.k8s.io/web/{RPS}"),
            404,
            "the server could not find the metric http_requests_per_second for ingresses.networking.k8s.io",
        ),
        (
            format!("{V2}/nodes/n1/{RPS}"),
            404,
            "the server could not find the metric http_requests_per_second for nodes",
        ),
        (format!("{V2}/namespaces/shop/pods/*/{RPS}?labelSelector=a%3D%3D%3D"), 400, ""),
        (format!("{V2}/namespaces/Shop/pods/*/{RPS}"), 400, ""),
        (format!("{V2}/namespaces/shop/pods/Web_1/{RPS}"), 400, ""),
        (format!("{V2}/namespaces/shop/deployments.apps/*/{RPS}"), 400, ""),
        (
            format!("/apis/custom.metrics.k8s.io/v1/namespaces/shop/pods/*/{RPS}"),
            404,
            "the server could not find the requested resource",
        ),
        (format!("{V2}/namespaces/shop"), 404, "the server could not find the requested resource"),
    ];
    for (uri, code, message) in cases {
        let r = get(&app, &uri).await;
        assert_eq!(r.status.as_u16(), code, "{uri}: {}", r.text());
        assert_eq!(r.json()["kind"], "Status", "{uri}");
        if !message.is_empty() {
            assert_eq!(r.json()["message"], message, "{uri}");
        }
    }
    let r = call_with(&app, "DELETE", &format!("{V2}/namespaces/shop/pods/web-1/{RPS}"), &[]).await;
    assert_eq!(r.status, 405, "{}", r.text());
    // `?watch=true` on a named path stays a `get` (apimachinery's RequestInfo).
    let r = get(&app, &format!("{V2}/namespaces/shop/pods/*/{RPS}?watch=true")).await;
    assert_eq!(r.status, 200, "{}", r.text());
}

#[tokio::test]
async fn prometheus_failing_is_a_503_and_concurrent_misses_share_one_query() {
    let prom = mk_prom(Err(PromError::Unreachable("refused".into())), Duration::from_millis(50));
    let app = mk_app(prom.clone(), mk_workloads());
    let r = get(&app, &format!("{V2}/namespaces/shop/pods/*/{RPS}")).await;
    assert_status(
        &r,
        503,
        "ServiceUnavailable",
        &format!("unable to fetch the custom metric {RPS}: Prometheus is unreachable"),
    );
    assert_eq!(r.header("retry-after"), "1");

    let prom = mk_prom(Ok(values()), Duration::from_millis(50));
    let app = mk_app(prom.clone(), mk_workloads());
    let statuses = all_at_once(20, |i| {
        let app = app.clone();
        let uri = if i % 2 == 0 {
            format!("{V2}/namespaces/shop/pods/*/{RPS}")
        } else {
            format!("{V1}/namespaces/shop/deployments.apps/web/{RPS}")
        };
        async move { get(&app, &uri).await.status.as_u16() }
    })
    .await;
    assert!(statuses.iter().all(|s| *s == 200), "{statuses:?}");
    assert_eq!(prom.calls.load(Ordering::SeqCst), 1, "one query for the metric and namespace");
}

#[tokio::test]
async fn discovery_lists_each_metric_per_resource_in_both_versions() {
    let app = mk_app(mk_values(), mk_workloads());
    let r = get(&app, "/apis/custom.metrics.k8s.io").await;
    assert_eq!(r.json()["preferredVersion"]["version"], "v1beta2");
    let versions: Vec<String> = r.json()["versions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v["version"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(versions, ["v1beta2", "v1beta1"]);
    for version in ["v1beta2", "v1beta1"] {
        let r = get(&app, &format!("/apis/custom.metrics.k8s.io/{version}")).await;
        let resources = r.json()["resources"].clone();
        let names: Vec<String> =
            resources.as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_owned()).collect();
        assert_eq!(names.len(), 14, "{names:?}");
        assert!(names.contains(&format!("pods/{RPS}")) && names.contains(&format!("deployments.apps/{RPS}")));
        let ns =
            resources.as_array().unwrap().iter().find(|r| r["name"] == format!("namespaces/{RPS}")).unwrap();
        assert_eq!(
            ns,
            &json!({"name": format!("namespaces/{RPS}"), "singularName": "", "namespaced": false, "kind": "MetricValueList", "verbs": ["get"]})
        );
    }
    // Aggregated discovery nests the metrics under their parents, as kube-apiserver converts them.
    let r = call_with(
        &app,
        "GET",
        "/apis",
        &[("accept", "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")],
    )
    .await;
    let group = r.json()["items"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["metadata"]["name"] == "custom.metrics.k8s.io")
        .unwrap()
        .clone();
    let pods = group["versions"][0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["resource"] == "pods")
        .unwrap()
        .clone();
    assert_eq!(pods["scope"], "Namespaced");
    assert_eq!(pods["verbs"], Value::Null);
    let subresources: Vec<&str> =
        pods["subresources"].as_array().unwrap().iter().map(|s| s["subresource"].as_str().unwrap()).collect();
    assert_eq!(subresources, [RPS, "http_errors_per_second"]);
    assert_eq!(pods["subresources"][0]["responseKind"]["kind"], "MetricValueList");
}
