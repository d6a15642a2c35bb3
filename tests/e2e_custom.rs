//! custom.metrics.k8s.io (v1beta2 and v1beta1) for the HPA's `Pods` and `Object` metrics:
//! values against the simulator's truth for pods, named pods, every workload kind and the
//! namespace, metric label selectors, errors, independent clients (the official Python
//! `kubernetes` package and kubectl), one PromQL query for concurrent cold requests without
//! any LIST of pods, configuration reload, and the group's absence without the flag.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::{Env, Options, assert_close, configmap_write, q};
use serde_json::{Value, json};

const GROUP: &str = "/apis/custom.metrics.k8s.io";
const RPS: &str = "http_requests_per_second";
const ERRORS: &str = "http_errors_per_second";
const VERSIONS: [&str; 2] = ["v1beta2", "v1beta1"];
/// The HPA controller reads custom metrics with cluster-wide rights, as `system:masters` has
/// them here.
const ADMIN_TOKEN: &str = "admin-token";
/// Relative tolerance of rates against the truth (as in e2e_external).
const TOLERANCE: f64 = 0.05;
/// The window of every environment here (`Options::default().window`), in seconds.
const WINDOW_SECONDS: u64 = 60;

/// Which truth pods a label selector is expected to select.
type PodFilter<'a> = Box<dyn Fn(&Value) -> bool + 'a>;

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

/// `GROUP/VERSION/PATH` with the selectors given, URL-encoded.
fn url_of(version: &str, path: &str, label_selector: Option<&str>, metric_selector: Option<&str>) -> String {
    let mut query = Vec::new();
    if let Some(s) = label_selector {
        query.push(format!("labelSelector={}", enc(s)));
    }
    if let Some(s) = metric_selector {
        query.push(format!("metricLabelSelector={}", enc(s)));
    }
    let mut url = format!("{GROUP}/{version}/{path}");
    if !query.is_empty() {
        url.push('?');
        url.push_str(&query.join("&"));
    }
    url
}

/// GET as the HPA does (protobuf preferred, JSON accepted), as `admin`.
async fn get_as_hpa(env: &Env, url: &str) -> (u16, reqwest::header::HeaderMap, Value) {
    let response = env
        .client_as(Some(ADMIN_TOKEN))
        .get(format!("{}{url}", env.url))
        .header("accept", "application/vnd.kubernetes.protobuf, */*")
        .send()
        .await
        .unwrap();
    let code = response.status().as_u16();
    let headers = response.headers().clone();
    let body = response.text().await.unwrap();
    (code, headers, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

async fn custom(
    env: &Env,
    version: &str,
    path: &str,
    label_selector: Option<&str>,
    metric_selector: Option<&str>,
) -> (u16, Value) {
    let (code, _, body) = get_as_hpa(env, &url_of(version, path, label_selector, metric_selector)).await;
    (code, body)
}

/// Asks `path` of `version` without selectors for its one `RPS` item, about `described`: the
/// item's value.
async fn rps_of_one(env: &Env, version: &str, path: &str, described: Value) -> f64 {
    let (code, list) = custom(env, version, path, None, None).await;
    let items = ok_list(version, code, &list);
    assert_eq!(items.len(), 1, "{path}: {list}");
    assert_item_fields(version, &items[0], RPS, &Value::Null);
    assert_eq!(items[0]["describedObject"], described, "{path}");
    q(&items[0]["value"])
}

/// Asks `path` of `version` without selectors and asserts a 404 NotFound with `message`.
async fn assert_not_found(env: &Env, version: &str, path: &str, message: &str) {
    let (code, body) = custom(env, version, path, None, None).await;
    assert_status(code, &body, 404, "NotFound", message);
}

/// A 200 MetricValueList of `version`.
#[track_caller]
fn ok_list(version: &str, code: u16, list: &Value) -> Vec<Value> {
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "MetricValueList", "{list}");
    assert_eq!(list["apiVersion"], format!("custom.metrics.k8s.io/{version}"), "{list}");
    list["items"].as_array().unwrap().clone()
}

/// The fields of `version` on `item`, and none of the other version: v1beta2 has
/// `metric: {name, selector}` and `windowSeconds`, v1beta1 `metricName`, `selector`, `window`.
#[track_caller]
fn assert_item_fields(version: &str, item: &Value, metric: &str, selector: &Value) {
    let keys: Vec<&str> = item.as_object().unwrap().keys().map(String::as_str).collect();
    let ts = item["timestamp"].as_str().unwrap();
    assert!(ts.len() == 20 && ts.ends_with('Z'), "{item}");
    if version == "v1beta2" {
        let mut expected = ["describedObject", "metric", "timestamp", "windowSeconds", "value"];
        expected.sort_unstable();
        assert_eq!(sorted(keys), expected, "{item}");
        assert_eq!(item["metric"], json!({"name": metric, "selector": selector}), "{item}");
        assert_eq!(item["windowSeconds"], WINDOW_SECONDS, "{item}");
    } else {
        let mut expected = ["describedObject", "metricName", "timestamp", "window", "value", "selector"];
        expected.sort_unstable();
        assert_eq!(sorted(keys), expected, "{item}");
        assert_eq!(item["metricName"], metric, "{item}");
        assert_eq!(&item["selector"], selector, "{item}");
        assert_eq!(item["window"], WINDOW_SECONDS, "{item}");
    }
}

fn sorted(mut v: Vec<&str>) -> Vec<&str> {
    v.sort_unstable();
    v
}

/// A 404/400 Status with exactly `message`.
#[track_caller]
fn assert_status(code: u16, body: &Value, expected_code: u16, reason: &str, message: &str) {
    assert_eq!(code, expected_code, "{body}");
    assert_eq!(body["kind"], "Status", "{body}");
    assert_eq!(body["code"], expected_code, "{body}");
    assert_eq!(body["reason"], reason, "{body}");
    assert_eq!(body["message"], message, "{body}");
}

fn pods_of(truth: &Value) -> &Vec<Value> {
    truth["pods"].as_array().unwrap()
}

fn name(v: &Value) -> &str {
    v["name"].as_str().unwrap()
}

fn running(p: &Value) -> bool {
    p["phase"] == "Running"
}

fn rps(p: &Value) -> Option<f64> {
    p["requestsPerSecond"].as_f64()
}

fn errors(p: &Value) -> Option<f64> {
    p["errorsPerSecond"].as_f64()
}

/// The Running pods of `ns` that `keep` accepts, by name (sorted).
fn running_in<'a>(truth: &'a Value, ns: &str, keep: impl Fn(&Value) -> bool) -> BTreeMap<&'a str, &'a Value> {
    pods_of(truth)
        .iter()
        .filter(|p| p["namespace"] == ns && running(p) && keep(p))
        .map(|p| (name(p), p))
        .collect()
}

/// The truth of workload `resource` `ns/name`: the names of the Running pods it selects.
fn workload_pods<'a>(truth: &'a Value, resource: &str, ns: &str, object: &str) -> Vec<&'a str> {
    truth["workloads"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["resource"] == resource && w["namespace"] == ns && w["name"] == object)
        .unwrap_or_else(|| panic!("no {resource} {ns}/{object} in the truth"))["pods"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p.as_str().unwrap())
        .collect()
}

/// The truth values (`field`) of the named pods that have one.
fn values_of(truth: &Value, ns: &str, names: &[&str], field: fn(&Value) -> Option<f64>) -> Vec<f64> {
    pods_of(truth)
        .iter()
        .filter(|p| p["namespace"] == ns && names.contains(&name(p)))
        .filter_map(field)
        .collect()
}

/// `(name, value)` of each item, the name from `describedObject`.
fn named_values(items: &[Value]) -> Vec<(String, f64)> {
    items.iter().map(|i| (name(&i["describedObject"]).to_string(), q(&i["value"]))).collect()
}

/// Asserts the items are exactly the pods of `expected` (by name, in order), each within
/// tolerance of its truth value.
#[track_caller]
fn assert_pod_values(items: &[Value], expected: &BTreeMap<&str, f64>, what: &str) {
    let got = named_values(items);
    let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
    let expected_names: Vec<&str> = expected.keys().copied().collect();
    assert_eq!(names, expected_names, "{what}: the pods listed");
    for (pod, value) in &got {
        assert_close(*value, expected[pod.as_str()], TOLERANCE, &format!("{what}: {pod}"));
    }
}

fn sum(values: &[f64]) -> f64 {
    values.iter().sum()
}

/// The namespace and app the Pods-form tests use: `shop`/`web` when it has at least two pods
/// with requests, else the first namespace and app of the simulator that has.
fn pick_app(truth: &Value) -> (String, String) {
    let mut counts: BTreeMap<(String, String), usize> = BTreeMap::new();
    for p in pods_of(truth).iter().filter(|p| running(p) && rps(p).is_some()) {
        let key =
            (p["namespace"].as_str().unwrap().to_string(), p["labels"]["app"].as_str().unwrap().to_string());
        *counts.entry(key).or_default() += 1;
    }
    let preferred = ("shop".to_string(), "web".to_string());
    if counts.get(&preferred).is_some_and(|n| *n >= 2) {
        return preferred;
    }
    counts.into_iter().find(|(_, n)| *n >= 2).map(|(k, _)| k).expect("an app with two pods with requests")
}

fn list_pods(stats: &Value) -> u64 {
    stats["apiRequests"]["list pods"].as_u64().unwrap()
}

fn api_calls(stats: &Value, call: &str) -> u64 {
    stats["apiRequests"][call].as_u64().unwrap_or(0)
}

fn custom_env_options() -> Options {
    Options { extra_args: vec!["--enable-custom-metrics".into()], ..Options::default() }
}

/// Runs `tests/python/custom_metrics_client.py` (the official `kubernetes` client) and returns
/// its decoded items.
fn python_items(
    env: &Env,
    version: &str,
    path: &str,
    label_selector: &str,
    metric_selector: &str,
) -> Vec<Value> {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/custom_metrics_client.py");
    let out = std::process::Command::new(common::python())
        .arg(script)
        .arg(&env.url)
        .arg(env.dir.join("certs/apiserver.crt"))
        .args([ADMIN_TOKEN, version, path, label_selector, metric_selector])
        .output()
        .unwrap();
    assert!(out.status.success(), "python client {version} {path}: {}", String::from_utf8_lossy(&out.stderr));
    let decoded: Value = serde_json::from_slice(&out.stdout).unwrap();
    decoded["items"].as_array().unwrap().clone()
}

#[tokio::test(flavor = "multi_thread")]
async fn pods_objects_and_namespaces_match_the_truth_in_both_versions() {
    let env = Env::start("custom", custom_env_options()).await;
    let lists_before = list_pods(&env.sim_stats().await);
    let truth = env.truth().await;
    let (ns, app) = pick_app(&truth);
    let (ns, app) = (ns.as_str(), app.as_str());
    let app_selector = format!("app={app}");
    let selected = running_in(&truth, ns, |p| p["labels"]["app"] == app && rps(p).is_some());
    let expected_app: BTreeMap<&str, f64> = selected.iter().map(|(n, p)| (*n, rps(p).unwrap())).collect();
    let expected_ns: BTreeMap<&str, f64> =
        running_in(&truth, ns, |p| rps(p).is_some()).iter().map(|(n, p)| (*n, rps(p).unwrap())).collect();
    // The namespace has a running pod without HTTP series (a worker, a cache or a cafe's pod).
    let silent = running_in(&truth, ns, |p| rps(p).is_none());
    let silent_pod =
        *silent.keys().next().unwrap_or_else(|| panic!("{ns} has a running pod without requests"));
    assert!(expected_app.len() >= 2 && expected_ns.len() > expected_app.len(), "{expected_ns:?}");

    // 1. The Pods form: exactly the running pods with a value that the selector selects.
    for version in VERSIONS {
        let path = format!("namespaces/{ns}/pods/*/{RPS}");
        let (code, list) = custom(&env, version, &path, Some(&app_selector), None).await;
        let items = ok_list(version, code, &list);
        assert_pod_values(&items, &expected_app, &format!("{version} pods/* {app_selector}"));
        for item in &items {
            assert_item_fields(version, item, RPS, &Value::Null);
            assert_eq!(
                item["describedObject"],
                json!({"kind": "Pod", "namespace": ns, "name": name(&item["describedObject"]), "apiVersion": "/v1"})
            );
        }
        let (code, list) = custom(&env, version, &path, None, None).await;
        let items = ok_list(version, code, &list);
        assert_pod_values(&items, &expected_ns, &format!("{version} pods/* without selector"));
        assert!(named_values(&items).iter().all(|(n, _)| !silent.contains_key(n.as_str())));
        // Other selector forms, against the truth's labels.
        let app_of = |p: &Value| p["labels"]["app"].as_str().unwrap().to_string();
        let cases: [(String, PodFilter<'_>); 3] = [
            ("app=web".to_string(), Box::new(|p| app_of(p) == "web")),
            (format!("app!={app}"), Box::new(|p| app_of(p) != app)),
            (
                "app in (web,api),tier".to_string(),
                Box::new(|p| {
                    ["web", "api"].contains(&app_of(p).as_str()) && p["labels"].get("tier").is_some()
                }),
            ),
        ];
        for (selector, selects) in &cases {
            let expected: BTreeMap<&str, f64> = running_in(&truth, ns, |p| rps(p).is_some() && selects(p))
                .iter()
                .map(|(n, p)| (*n, rps(p).unwrap()))
                .collect();
            let (code, list) = custom(&env, version, &path, Some(selector), None).await;
            let items = ok_list(version, code, &list);
            assert_pod_values(&items, &expected, &format!("{version} pods/* {selector}"));
        }
        // A selector matching no pod with a value: an empty list, not an error.
        let (code, list) = custom(&env, version, &path, Some("app=no-such-app"), None).await;
        assert!(ok_list(version, code, &list).is_empty(), "{list}");
    }

    // 2. Named pods: a value; no value, or a pod of another namespace: the adapter's 404.
    let (one, one_pod) = selected.iter().next().map(|(n, p)| (*n, *p)).unwrap();
    for version in VERSIONS {
        let path = format!("namespaces/{ns}/pods/{one}/{RPS}");
        let pod = json!({"kind": "Pod", "namespace": ns, "name": one, "apiVersion": "/v1"});
        let value = rps_of_one(&env, version, &path, pod).await;
        assert_close(value, rps(one_pod).unwrap(), TOLERANCE, "named pod");
    }
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/pods/{silent_pod}/{RPS}"),
        &format!("the server could not find the metric {RPS} for pods {silent_pod}"),
    )
    .await;
    let elsewhere = pods_of(&truth)
        .iter()
        .find(|p| p["namespace"] != ns && running(p) && rps(p).is_some())
        .map(name)
        .expect("a pod with requests in another namespace");
    assert_not_found(
        &env,
        "v1beta1",
        &format!("namespaces/{ns}/pods/{elsewhere}/{RPS}"),
        &format!("the server could not find the metric {RPS} for pods {elsewhere}"),
    )
    .await;
    // A pod that is not running (Pending or Succeeded; the simulator always has some) has no
    // value, in its own namespace.
    let stopped = pods_of(&truth).iter().find(|p| !running(p)).expect("a pod that is not running");
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{}/pods/{}/{RPS}", stopped["namespace"].as_str().unwrap(), name(stopped)),
        &format!("the server could not find the metric {RPS} for pods {}", name(stopped)),
    )
    .await;

    // 3. Objects: the sum over the running pods the object's selector selects (the truth says
    // which), in both versions; the ReplicaSet of one selected pod; the StatefulSet `tiered`
    // selects with matchExpressions.
    let replica_set = {
        let pod = name(one_pod);
        // `<app>-<hash>-<suffix>`: the ReplicaSet is `<app>-<hash>`.
        pod[..pod.rfind('-').unwrap()].to_string()
    };
    let mut object_values = BTreeMap::new();
    for (resource, object, kind, api_version) in [
        ("deployments.apps", app, "Deployment", "apps/v1"),
        ("services", app, "Service", "/v1"),
        ("replicasets.apps", replica_set.as_str(), "ReplicaSet", "apps/v1"),
        ("statefulsets.apps", "tiered", "StatefulSet", "apps/v1"),
    ] {
        let pods = workload_pods(&truth, resource, ns, object);
        let values = values_of(&truth, ns, &pods, rps);
        assert!(!values.is_empty(), "{resource}/{object} selects pods with requests: {pods:?}");
        if resource == "statefulsets.apps" {
            // The truth is not simply the app's pods: matchExpressions (tier exists, app in
            // (web, api)) select across apps and leave out untiered pods.
            assert_ne!(pods, workload_pods(&truth, "deployments.apps", ns, app), "tiered vs {app}");
        }
        for version in VERSIONS {
            let path = format!("namespaces/{ns}/{resource}/{object}/{RPS}");
            let described = json!({"kind": kind, "namespace": ns, "name": object, "apiVersion": api_version});
            let value = rps_of_one(&env, version, &path, described).await;
            assert_close(value, sum(&values), TOLERANCE, &format!("{version} {resource}/{object}"));
            object_values.insert(resource, value);
        }
    }
    for (resource, object) in [("daemonsets.apps", "node-agent"), ("services", "headless-external")] {
        assert!(workload_pods(&truth, resource, ns, object).is_empty());
        assert_not_found(
            &env,
            "v1beta2",
            &format!("namespaces/{ns}/{resource}/{object}/{RPS}"),
            &format!("the server could not find the metric {RPS} for {resource} {object}"),
        )
        .await;
    }
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/deployments.apps/nope/{RPS}"),
        r#"deployments.apps "nope" not found"#,
    )
    .await;
    assert_not_found(
        &env,
        "v1beta1",
        &format!("namespaces/{ns}/services/nope/{RPS}"),
        r#"services "nope" not found"#,
    )
    .await;

    // The namespace: the sum over its running pods, in both path forms and versions.
    let namespace_total = sum(&expected_ns.values().copied().collect::<Vec<_>>());
    for version in VERSIONS {
        for path in [format!("namespaces/{ns}/metrics/{RPS}"), format!("namespaces/{ns}/{RPS}")] {
            let namespace = json!({"kind": "Namespace", "name": ns, "apiVersion": "/v1"});
            let value = rps_of_one(&env, version, &path, namespace).await;
            assert_close(value, namespace_total, TOLERANCE, &format!("{version} {path}"));
        }
    }

    // 4. metricLabelSelector on the declared label `code` (the simulator emits 200, 404, 500
    // and 503; pods without 5xx series have none of the last two): 5xx is errorsPerSecond,
    // the rest requestsPerSecond minus it; `selector` is the metav1.LabelSelector form.
    let expected_errors: BTreeMap<&str, f64> = running_in(&truth, ns, |p| errors(p).is_some())
        .iter()
        .map(|(n, p)| (*n, errors(p).unwrap()))
        .collect();
    let no_errors = running_in(&truth, ns, |p| rps(p).is_some() && errors(p).is_none());
    assert!(
        expected_errors.values().any(|e| *e > 0.0) && !no_errors.is_empty(),
        "{ns} has pods with and without 5xx series"
    );
    let expected_ok: BTreeMap<&str, f64> =
        expected_ns.iter().map(|(n, r)| (*n, r - expected_errors.get(n).copied().unwrap_or(0.0))).collect();
    let pods_path = format!("namespaces/{ns}/pods/*/{RPS}");
    for (selector, expected, json_selector) in [
        (
            "code in (500,503)",
            &expected_errors,
            json!({"matchExpressions": [{"key": "code", "operator": "In", "values": ["500", "503"]}]}),
        ),
        (
            "code notin (500,503)",
            &expected_ok,
            json!({"matchExpressions": [{"key": "code", "operator": "NotIn", "values": ["500", "503"]}]}),
        ),
    ] {
        for version in VERSIONS {
            let (code, list) = custom(&env, version, &pods_path, None, Some(selector)).await;
            let items = ok_list(version, code, &list);
            assert_pod_values(&items, expected, &format!("{version} metricLabelSelector {selector}"));
            for item in &items {
                assert_item_fields(version, item, RPS, &json_selector);
            }
        }
    }
    // `=` is matchLabels; no pod has a 418.
    let (code, list) = custom(&env, "v1beta2", &pods_path, Some(&app_selector), Some("code=418")).await;
    assert_eq!(ok_list("v1beta2", code, &list), Vec::<Value>::new());
    // On an object, and the default 5xx metric.
    let deployment_errors =
        values_of(&truth, ns, &workload_pods(&truth, "deployments.apps", ns, app), errors);
    let (code, list) = custom(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/deployments.apps/{app}/{RPS}"),
        None,
        Some("code in (500,503)"),
    )
    .await;
    let items = ok_list("v1beta2", code, &list);
    if deployment_errors.is_empty() {
        assert!(items.is_empty(), "{list}");
    } else {
        assert_close(q(&items[0]["value"]), sum(&deployment_errors), TOLERANCE, "deployment 5xx");
    }
    let (code, list) = custom(&env, "v1beta1", &format!("namespaces/{ns}/pods/*/{ERRORS}"), None, None).await;
    let items = ok_list("v1beta1", code, &list);
    assert_pod_values(&items, &expected_errors, ERRORS);
    // Errors: an undeclared label, a malformed selector, an unknown metric or resource.
    let (code, body) = custom(&env, "v1beta2", &pods_path, None, Some("pod=x")).await;
    assert_status(
        code,
        &body,
        400,
        "BadRequest",
        &format!("label \"pod\" is not accepted by the custom metric {RPS}; it accepts: code"),
    );
    let (code, body) = custom(&env, "v1beta2", &pods_path, Some("app in (web"), None).await;
    assert_eq!((code, &body["reason"]), (400, &json!("BadRequest")), "{body}");
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/pods/*/nope"),
        "the server could not find the metric nope for pods",
    )
    .await;
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/ingresses.networking.k8s.io/{app}/{RPS}"),
        &format!("the server could not find the metric {RPS} for ingresses.networking.k8s.io"),
    )
    .await;

    // 5. An independent client: the official Python kubernetes package decodes both versions
    // and parses every value as a Quantity.
    for version in VERSIONS {
        let items = python_items(&env, version, &pods_path, &app_selector, "");
        let got: Vec<(String, f64)> = items
            .iter()
            .map(|i| (name(&i["describedObject"]).to_string(), i["value"].as_f64().unwrap()))
            .collect();
        assert_eq!(
            got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            expected_app.keys().copied().collect::<Vec<_>>(),
            "python {version}"
        );
        for (pod, value) in &got {
            assert_close(*value, expected_app[pod.as_str()], TOLERANCE, &format!("python {version} {pod}"));
        }
        assert!(
            items
                .iter()
                .all(|i| i["window"] == WINDOW_SECONDS && i["selector"].is_null() && i["metric"] == RPS)
        );

        let items =
            python_items(&env, version, &format!("namespaces/{ns}/deployments.apps/{app}/{RPS}"), "", "");
        assert_eq!(items.len(), 1);
        assert_eq!(items[0]["describedObject"]["kind"], "Deployment");
        let deployment = values_of(&truth, ns, &workload_pods(&truth, "deployments.apps", ns, app), rps);
        assert_close(items[0]["value"].as_f64().unwrap(), sum(&deployment), TOLERANCE, "python deployment");

        let items = python_items(&env, version, &pods_path, "", "code in (500,503)");
        assert_eq!(items.len(), expected_errors.len(), "python 5xx {version}");
        for item in &items {
            assert_close(
                item["value"].as_f64().unwrap(),
                expected_errors[name(&item["describedObject"])],
                TOLERANCE,
                "python 5xx",
            );
            assert_eq!(item["selector"]["matchExpressions"][0]["operator"], "In");
        }
    }

    // 6. kubectl: the same value through `get --raw`; discovery prefers v1beta2.
    let kubectl_raw = |path: &str| -> Value {
        let out = env.kubectl_ok(&["--token", ADMIN_TOKEN, "get", "--raw", path]);
        serde_json::from_str(&out).unwrap()
    };
    let deployment_path = format!("{GROUP}/v1beta2/namespaces/{ns}/deployments.apps/{app}/{RPS}");
    let raw = kubectl_raw(&deployment_path);
    assert_eq!(raw["items"][0]["describedObject"]["name"], app);
    // The cache (TTL 2s) may have expired since: Prometheus evaluates the rate again, at a
    // slightly different instant, so "the same" is within 1%, far inside the truth tolerance.
    assert_close(q(&raw["items"][0]["value"]), object_values["deployments.apps"], 0.01, "kubectl vs HTTP");
    assert_close(
        q(&raw["items"][0]["value"]),
        sum(&values_of(&truth, ns, &workload_pods(&truth, "deployments.apps", ns, app), rps)),
        TOLERANCE,
        "kubectl vs truth",
    );
    let raw = kubectl_raw(&url_of("v1beta1", &pods_path, Some(&app_selector), None));
    let items = ok_list("v1beta1", 200, &raw);
    assert_pod_values(&items, &expected_app, "kubectl v1beta1 pods/*");
    let group = kubectl_raw(GROUP);
    assert_eq!(group["kind"], "APIGroup");
    assert_eq!(group["preferredVersion"]["version"], "v1beta2");
    let versions: Vec<&str> =
        group["versions"].as_array().unwrap().iter().map(|v| v["version"].as_str().unwrap()).collect();
    assert_eq!(versions, VERSIONS);
    let listed = kubectl_raw("/apis");
    let entry = listed["groups"]
        .as_array()
        .unwrap()
        .iter()
        .find(|g| g["name"] == "custom.metrics.k8s.io")
        .unwrap_or_else(|| panic!("{listed}"));
    assert_eq!(entry["preferredVersion"]["groupVersion"], "custom.metrics.k8s.io/v1beta2");
    // kubectl's discovery reads the group without complaint. Every resource is a
    // subresource (`pods/M`), which api-resources leaves out, as with prometheus-adapter;
    // whatever it lists is of the preferred version.
    let out = env.kubectl(&["--token", ADMIN_TOKEN, "api-resources", "--api-group=custom.metrics.k8s.io"]);
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && stderr.trim().is_empty(), "{stderr}");
    let (header, rows) = common::table(&stdout);
    let column = header.iter().position(|h| h == "APIVERSION").unwrap_or_else(|| panic!("{stdout}"));
    assert!(rows.iter().all(|r| r[column] == "custom.metrics.k8s.io/v1beta2"), "{stdout}");
    // Discovery documents list the metric per served resource.
    for version in VERSIONS {
        let resources = env.get_json(&format!("{GROUP}/{version}")).await;
        let names: Vec<&str> =
            resources["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
        for resource in [
            "pods",
            "deployments.apps",
            "statefulsets.apps",
            "replicasets.apps",
            "daemonsets.apps",
            "services",
            "namespaces",
        ] {
            for metric in [RPS, ERRORS] {
                assert!(names.contains(&format!("{resource}/{metric}").as_str()), "{version}: {names:?}");
            }
        }
    }

    // No request above listed pods: values are placed on pods from the watched inventory.
    assert_eq!(list_pods(&env.sim_stats().await), lists_before, "custom metrics requests listed pods");
}

#[tokio::test(flavor = "multi_thread")]
async fn concurrent_cold_requests_share_one_query_and_list_no_pods() {
    let env = Env::start("custom-coalesce", Options { cache_ttl: "4s", ..custom_env_options() }).await;
    let stats = env.sim_stats().await;
    let lists_before = list_pods(&stats);
    let truth = env.truth().await;
    let (ns, app) = pick_app(&truth);
    let (ns, app) = (ns.as_str(), app.as_str());
    let expected_app: BTreeMap<&str, f64> =
        running_in(&truth, ns, |p| p["labels"]["app"] == app && rps(p).is_some())
            .iter()
            .map(|(n, p)| (*n, rps(p).unwrap()))
            .collect();
    let deployment = sum(&values_of(&truth, ns, &workload_pods(&truth, "deployments.apps", ns, app), rps));
    let namespace: f64 = running_in(&truth, ns, |p| rps(p).is_some()).values().filter_map(|p| rps(p)).sum();
    let forms = [
        (
            "v1beta2",
            url_of("v1beta2", &format!("namespaces/{ns}/pods/*/{RPS}"), Some(&format!("app={app}")), None),
        ),
        ("v1beta1", url_of("v1beta1", &format!("namespaces/{ns}/deployments.apps/{app}/{RPS}"), None, None)),
        ("v1beta2", url_of("v1beta2", &format!("namespaces/{ns}/metrics/{RPS}"), None, None)),
    ];
    let admin = env.client_as(Some(ADMIN_TOKEN));

    // 50 concurrent cold requests mixing the three forms. A round where Prometheus failed
    // transiently (a 503) says nothing about coalescing: wait for the caches to expire and
    // measure again, at most three times.
    let mut attempts = 0;
    let (before_queries, before_gets, results) = loop {
        if attempts > 0 {
            tokio::time::sleep(Duration::from_secs(5)).await; // the caches expire (TTL 4s)
        }
        let before_queries = env.prometheus.queries().len();
        let before_gets = api_calls(&env.sim_stats().await, "get deployments");
        let tasks: Vec<_> = (0..50)
            .map(|i| {
                let (version, path) = forms[i % forms.len()].clone();
                let (client, url) = (admin.clone(), format!("{}{path}", env.url));
                tokio::spawn(async move {
                    let response = client
                        .get(url)
                        .header("accept", "application/vnd.kubernetes.protobuf, */*")
                        .send()
                        .await
                        .unwrap();
                    let code = response.status().as_u16();
                    (i % 3, version, code, response.text().await.unwrap())
                })
            })
            .collect();
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        attempts += 1;
        let unavailable = results.iter().filter(|r| r.2 == 503).count();
        if unavailable == 0 {
            break (before_queries, before_gets, results);
        }
        assert!(attempts < 3, "every round had 503s: {:?}", results.iter().find(|r| r.2 == 503));
        eprintln!("round {attempts} had {unavailable} 503s, measuring again");
    };
    tokio::time::sleep(Duration::from_millis(500)).await;

    // Every answer is right.
    for (form, version, code, body) in &results {
        let list: Value = serde_json::from_str(body).unwrap_or_else(|_| panic!("{code}: {body}"));
        let items = ok_list(version, *code, &list);
        match form {
            0 => assert_pod_values(&items, &expected_app, "burst pods/*"),
            1 => assert_close(q(&items[0]["value"]), deployment, TOLERANCE, "burst deployment"),
            _ => assert_close(q(&items[0]["value"]), namespace, TOLERANCE, "burst namespace"),
        }
    }
    // One vector query for the metric and namespace, without any regex of pod names.
    let new: Vec<String> = env.prometheus.queries()[before_queries..]
        .iter()
        .filter(|q| q.contains("http_requests_total"))
        .cloned()
        .collect();
    assert_eq!(
        new,
        [format!(r#"sum by (namespace, pod) (rate(http_requests_total{{namespace="{ns}"}}[1m]))"#)],
        "one query for 50 requests of three forms"
    );
    assert!(!new[0].contains("pod=~"), "{}", new[0]);
    // The Deployment was read once for its 17 requests (single flight on the object cache).
    let stats = env.sim_stats().await;
    assert_eq!(api_calls(&stats, "get deployments") - before_gets, 1, "{stats}");
    assert_eq!(list_pods(&stats), lists_before, "custom metrics requests listed pods: {stats}");
}

#[tokio::test(flavor = "multi_thread")]
async fn reload_adds_an_avg_metric_and_keeps_the_last_good_configuration() {
    let dir = common::mk_dir("custom-reload-config");
    configmap_write(&dir, 1, "window: 1m\n");
    let mut options = custom_env_options();
    options.extra_args.extend(["--config".to_string(), dir.join("config.yaml").display().to_string()]);
    let env = Env::start("custom-reload", options).await;
    let names = |v: &Value| -> Vec<String> {
        v["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
    };
    let discovery = format!("{GROUP}/v1beta2");
    assert!(!names(&env.get_json(&discovery).await).contains(&"pods/web_rps_avg".to_string()));
    let truth = env.truth().await;
    let (ns, app) = pick_app(&truth);
    let (ns, app) = (ns.as_str(), app.as_str());
    let deployment_path = format!("namespaces/{ns}/deployments.apps/{app}");
    assert_not_found(
        &env,
        "v1beta2",
        &format!("{deployment_path}/web_rps_avg"),
        "the server could not find the metric web_rps_avg for deployments.apps",
    )
    .await;

    // A new metric definition (and the defaults replaced), delivered as a ConfigMap swap.
    let query = "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))";
    let config = format!(
        "window: 1m\ncustomMetrics:\n  - name: {RPS}\n    query: {query}\n    labels: [code]\n  - name: web_rps_avg\n    query: {query}\n    aggregate: avg\n"
    );
    configmap_write(&dir, 2, &config);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if names(&env.get_json(&discovery).await).contains(&"pods/web_rps_avg".to_string()) {
            break;
        }
        assert!(Instant::now() < deadline, "pods/web_rps_avg never appeared in discovery");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let listed = names(&env.get_json(&format!("{GROUP}/v1beta1")).await);
    assert!(listed.contains(&"deployments.apps/web_rps_avg".to_string()), "{listed:?}");
    assert!(!listed.iter().any(|n| n.ends_with(ERRORS)), "the defaults are replaced: {listed:?}");

    let pods = workload_pods(&truth, "deployments.apps", ns, app);
    let values = values_of(&truth, ns, &pods, rps);
    assert!(values.len() >= 2, "an average differs from the sum: {pods:?}");
    let mean = sum(&values) / values.len() as f64;
    let check = |when: &'static str| {
        let env = &env;
        let deployment_path = &deployment_path;
        let values = &values;
        async move {
            for version in VERSIONS {
                let (code, list) =
                    custom(env, version, &format!("{deployment_path}/web_rps_avg"), None, None).await;
                let items = ok_list(version, code, &list);
                assert_item_fields(version, &items[0], "web_rps_avg", &Value::Null);
                assert_close(
                    q(&items[0]["value"]),
                    mean,
                    TOLERANCE,
                    &format!("{when}: {version} web_rps_avg"),
                );
                let (code, list) =
                    custom(env, version, &format!("{deployment_path}/{RPS}"), None, None).await;
                let items = ok_list(version, code, &list);
                assert_close(
                    q(&items[0]["value"]),
                    sum(values),
                    TOLERANCE,
                    &format!("{when}: {version} {RPS}"),
                );
            }
        }
    };
    check("after the reload").await;
    // The namespace average, too.
    let ns_values: Vec<f64> =
        running_in(&truth, ns, |p| rps(p).is_some()).values().filter_map(|p| rps(p)).collect();
    let (code, list) =
        custom(&env, "v1beta2", &format!("namespaces/{ns}/metrics/web_rps_avg"), None, None).await;
    let items = ok_list("v1beta2", code, &list);
    assert_close(q(&items[0]["value"]), sum(&ns_values) / ns_values.len() as f64, TOLERANCE, "namespace avg");
    assert_not_found(
        &env,
        "v1beta2",
        &format!("namespaces/{ns}/pods/*/{ERRORS}"),
        &format!("the server could not find the metric {ERRORS} for pods"),
    )
    .await;

    // An invalid file is rejected: the last good configuration stays, a metric says so.
    configmap_write(&dir, 3, "window: 1m\ncustomMetrics: []\n");
    env.wait_for_rejected_reload().await;
    assert!(names(&env.get_json(&discovery).await).contains(&"pods/web_rps_avg".to_string()));
    check("after the rejected file").await;
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    assert!(log.contains("configuration rejected"), "a log line names the rejection");
}

#[tokio::test(flavor = "multi_thread")]
async fn without_the_flag_the_group_is_absent() {
    let env = Env::start("custom-off", Options::default()).await;
    let groups = env.get_json("/apis").await;
    let names: Vec<&str> =
        groups["groups"].as_array().unwrap().iter().map(|g| g["name"].as_str().unwrap()).collect();
    assert!(names.contains(&"stats.une-tasse-de.cafe"), "{names:?}");
    assert!(!names.contains(&"custom.metrics.k8s.io"), "{names:?}");
    let (code, _, body) =
        env.get("/apis", Some("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList")).await;
    assert_eq!(code, 200);
    let aggregated: Value = serde_json::from_str(&body).unwrap();
    let names: Vec<&str> = aggregated["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["metadata"]["name"].as_str().unwrap())
        .collect();
    assert!(
        names.contains(&"stats.une-tasse-de.cafe") && !names.contains(&"custom.metrics.k8s.io"),
        "{names:?}"
    );
    let truth = env.truth().await;
    let pod = pods_of(&truth).iter().find(|p| running(p) && rps(p).is_some()).unwrap();
    let ns = pod["namespace"].as_str().unwrap();
    for path in [
        GROUP.to_string(),
        format!("{GROUP}/v1beta2"),
        format!("{GROUP}/v1beta1"),
        format!("{GROUP}/v1beta2/namespaces/{ns}/pods/*/{RPS}"),
        format!("{GROUP}/v1beta2/namespaces/{ns}/pods/{}/{RPS}", name(pod)),
        format!("{GROUP}/v1beta1/namespaces/{ns}/metrics/{RPS}"),
    ] {
        let (code, _, body) = get_as_hpa(&env, &path).await;
        assert_eq!(code, 404, "{path}: {body}");
        assert_eq!(body["kind"], "Status", "{path}: {body}");
    }
    let out = env.kubectl(&["--token", ADMIN_TOKEN, "get", "--raw", &format!("{GROUP}/v1beta2")]);
    assert!(!out.status.success(), "kubectl found the group");
}
