//! Kinds declared in the configuration file (docs/reference/kinds.md), end to end: the real percolator
//! started with a `--config` declaring a per-pod kind, a cluster-scoped kind and a cafe-like
//! kind with the pods join, a real Prometheus scraping the simulator, real kubectl (a fresh
//! discovery cache for every call) and raw requests. Values are checked against the
//! simulator's truth in every output form; the file is then edited the way a ConfigMap update
//! does (add, change, remove a kind; then eight invalid files, each rejected whole).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Output;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use common::{
    Env, Options, SCRAPE, assert_cafe_rates, assert_close, assert_usage_close, bucket_width, configmap_write,
    key, q, table,
};
use serde_json::{Value, json};

const GROUP: &str = "stats.une-tasse-de.cafe";
const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
const POM: &str = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
const AGGREGATED: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json";
const REJECTED: &str = "configuration rejected; the previous one stays in force";
/// How long a reload may take to show (the file is polled every 2 s).
const RELOAD_DEADLINE: Duration = Duration::from_secs(30);

/// Per pod, namespaced; plural and singular left to their defaults.
const APP_TRAFFIC: &str = include_str!("fixtures/declared-kinds/app-traffic.yaml");

/// [`APP_TRAFFIC`] after an edit: another field name, query, column and description.
const APP_TRAFFIC_PER_MINUTE: &str = include_str!("fixtures/declared-kinds/app-traffic-per-minute.yaml");

/// Cluster-scoped, named by the namespace, its own window and category.
const NAMESPACE_TRAFFIC: &str = include_str!("fixtures/declared-kinds/namespace-traffic.yaml");

/// A cafe-like kind: the pods join, a copied label, and the percent, seconds and timestamp
/// formats.
const CAFE_ACTIVITY: &str = include_str!("fixtures/declared-kinds/cafe-activity.yaml");

/// Added by a reload: every optional key left to its default.
const ERROR_TRAFFIC: &str = include_str!("fixtures/declared-kinds/error-traffic.yaml");

fn config(kinds: &[&str]) -> String {
    format!("kinds:\n{}", kinds.concat())
}

/// A kind named `Clash` whose entry is valid except for `fault` (keys replaced or added).
fn clash(fault: &str) -> String {
    let mut entry = BTreeMap::from([
        ("kind", "Clash".to_string()),
        ("nameLabel", "pod".to_string()),
        ("fields", "[{name: value, query: 'sum by (namespace, pod) (up{SCOPE})'}]".to_string()),
    ]);
    let fault: BTreeMap<&str, &str> =
        fault.lines().map(|l| l.split_once(": ").unwrap()).map(|(k, v)| (k.trim(), v.trim())).collect();
    for (key, value) in fault {
        entry.insert(key, value.to_string());
    }
    let mut text = String::from("- kind: Clash\n");
    for (key, value) in entry.iter().filter(|(k, _)| **k != "kind") {
        text.push_str(&format!("  {key}: {value}\n"));
    }
    text
}

/// An environment whose `--config` is a ConfigMap-style directory holding `text`.
async fn mk_env(name: &str, text: &str) -> (Env, PathBuf) {
    let dir = common::mk_dir(&format!("{name}-config"));
    configmap_write(&dir, 1, text);
    let config = dir.join("config.yaml");
    let options =
        Options { extra_args: vec!["--config".into(), config.display().to_string()], ..Options::default() };
    (Env::start(name, options).await, dir)
}

static CACHE_DIRS: AtomicU32 = AtomicU32::new(0);

/// Real kubectl with a discovery cache of its own, so every call sees the discovery in force.
fn kubectl(env: &Env, args: &[&str]) -> Output {
    let cache = env.dir.join(format!("kube-cache-{}", CACHE_DIRS.fetch_add(1, Ordering::Relaxed)));
    std::process::Command::new(common::kubectl_bin())
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--cache-dir")
        .arg(cache)
        .args(args)
        .output()
        .expect("kubectl runs")
}

#[track_caller]
fn kubectl_ok(env: &Env, args: &[&str]) -> String {
    let out = kubectl(env, args);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "kubectl {args:?} failed: {stderr}");
    assert_eq!(stderr, "", "kubectl {args:?} printed warnings");
    String::from_utf8(out.stdout).unwrap()
}

/// kubectl that must fail; returns its stderr, trimmed.
#[track_caller]
fn kubectl_err(env: &Env, args: &[&str]) -> String {
    let out = kubectl(env, args);
    assert!(!out.status.success(), "kubectl {args:?} succeeded: {}", String::from_utf8_lossy(&out.stdout));
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// Runs kubectl until `done` accepts its outcome (exit status, stdout), within
/// [`RELOAD_DEADLINE`]; returns the accepted stdout.
async fn kubectl_until(env: &Env, args: &[&str], what: &str, done: impl Fn(bool, &str) -> bool) -> String {
    let deadline = Instant::now() + RELOAD_DEADLINE;
    loop {
        let out = kubectl(env, args);
        let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        if done(out.status.success(), &stdout) {
            return stdout.to_string();
        }
        assert!(Instant::now() < deadline, "{what}: kubectl {args:?} still prints\n{stdout}{stderr}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What `kubectl explain <plural>.<field>` prints for a field of a declared kind (a Quantity
/// or a date, both strings).
fn explain_field(kind: &str, field: &str, description: &str) -> String {
    format!(
        "GROUP:      {GROUP}\nKIND:       {kind}\nVERSION:    v1alpha1\n\nFIELD: {field} <string>\n\n\nDESCRIPTION:\n    {description}\n    \n\n"
    )
}

/// What `kubectl explain <plural>` prints for a declared kind without the pods join: its
/// description (as kubectl wraps it), the end of the metadata description (after "the name is
/// the ") and its fields, all in kubectl's alphabetical order.
fn explain_kind(kind: &str, description: &str, named_by: &str, fields: &[(&str, &str)]) -> String {
    let api_version = format!(
        "APIVersion defines the versioned schema of this representation of an object:\n    {GROUP}/v1alpha1."
    );
    let kind_text =
        format!("Kind is a string value representing the REST resource this object\n    represents: {kind}.");
    let metadata = format!("Standard object metadata: the name is the {named_by}");
    let mut all: Vec<(&str, &str, &str)> = vec![
        ("apiVersion", "string", &api_version),
        ("kind", "string", &kind_text),
        ("metadata", "ObjectMeta", &metadata),
        ("timestamp", "string", "When the newest input sample (Prometheus) was taken, RFC 3339."),
        ("window", "string", "Range the rates are computed over, as a duration (5m0s)."),
    ];
    all.extend(fields.iter().map(|(name, text)| (*name, "string", *text)));
    all.sort();
    let fields: String =
        all.iter().map(|(name, type_, text)| format!("  {name}\t<{type_}>\n    {text}\n\n")).collect();
    format!(
        "GROUP:      {GROUP}\nKIND:       {kind}\nVERSION:    v1alpha1\n\nDESCRIPTION:\n    {description}\n    \nFIELDS:\n{fields}\n"
    )
}

/// The keys of a JSON object, sorted (kubectl re-encodes objects, so their order is lost).
fn fields(object: &Value) -> Vec<String> {
    object.as_object().unwrap().keys().cloned().collect()
}

fn sorted(keys: &[&str]) -> Vec<String> {
    let mut keys: Vec<String> = keys.iter().map(|k| k.to_string()).collect();
    keys.sort();
    keys
}

/// Asserts that `body` (an object as served) writes its top-level `keys` in this order.
#[track_caller]
fn assert_key_order(body: &str, keys: &[&str]) {
    let at: Vec<usize> = keys
        .iter()
        .map(|k| body.find(&format!("\"{k}\":")).unwrap_or_else(|| panic!("no {k} in {body}")))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "keys not in the order {keys:?}: {body}");
}

fn names(rows: &[Vec<String>]) -> Vec<String> {
    rows.iter().map(|r| r[0].clone()).collect()
}

/// A `REQ/S`-style cell (two decimals at most) against the truth: 5%, plus the rounding.
#[track_caller]
fn assert_cell(cell: &str, expected: f64, what: &str) {
    let got: f64 = cell.parse().unwrap_or_else(|_| panic!("{what}: not a number: {cell:?}"));
    assert!((got - expected).abs() <= expected * 0.05 + 0.005, "{what}: cell {cell}, expected {expected}");
}

/// A percent cell (`4.0%`) against a ratio.
#[track_caller]
fn assert_percent_cell(cell: &str, expected: f64, what: &str) {
    let got: f64 =
        cell.strip_suffix('%').and_then(|c| c.parse().ok()).unwrap_or_else(|| panic!("{what}: {cell:?}"));
    assert!(
        (got / 100.0 - expected).abs() <= expected * 0.05 + 0.0005,
        "{what}: cell {cell}, expected {expected}"
    );
}

#[track_caller]
fn status(body: &str, code: u16, reason: &str, message: &str, details: Option<Value>) {
    let v: Value = serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"));
    let mut expected = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    if let Some(details) = details {
        expected["details"] = details;
    }
    assert_eq!(v, expected);
}

/// Sends as `admin` (system:masters): write verbs are authorized before routing, so only a
/// caller allowed every verb reaches the router's 405.
async fn send_as_admin(env: &Env, method: &str, path: &str) -> (u16, String) {
    let request =
        env.client_as(Some("admin-token")).request(method.parse().unwrap(), format!("{}{path}", env.url));
    let response = request.send().await.unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

fn running(truth: &Value) -> Vec<&Value> {
    truth["pods"].as_array().unwrap().iter().filter(|p| p["phase"] == "Running").collect()
}

/// The running pods that serve HTTP, by (namespace, name).
fn http_pods(truth: &Value) -> BTreeMap<(String, String), &Value> {
    running(truth).into_iter().filter(|p| p["requestsPerSecond"].is_f64()).map(|p| (key(p), p)).collect()
}

/// Requests per second per namespace, summed over its running pods.
fn namespace_rates(truth: &Value) -> BTreeMap<String, f64> {
    let mut rates = BTreeMap::new();
    for ((namespace, _), pod) in http_pods(truth) {
        *rates.entry(namespace).or_insert(0.0) += pod["requestsPerSecond"].as_f64().unwrap();
    }
    rates
}

/// The cafes with at least one running serving pod, by (namespace, name).
fn serving_cafes(truth: &Value) -> BTreeMap<(String, String), &Value> {
    truth["cafes"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| !c["pods"].as_array().unwrap().is_empty())
        .map(|c| (key(c), c))
        .collect()
}

/// How long before now a cafe's last brew may be as percolator reports it: one brew interval
/// of a pod, the scrape interval, the cache TTL (2 s), and kubectl's time and whole seconds.
fn last_brew_bound(cafe: &Value) -> f64 {
    let pods = cafe["pods"].as_array().unwrap().len() as f64;
    60.0 * pods / cafe["brewsPerMinute"].as_f64().unwrap() + SCRAPE.as_secs_f64() + 2.0 + 2.0
}

fn seconds(go_duration: &Value) -> f64 {
    k8s_wire::duration::parse(go_duration.as_str().unwrap()).unwrap().as_secs_f64()
}

fn unix(rfc3339: &Value) -> f64 {
    rfc3339.as_str().unwrap().parse::<jiff::Timestamp>().unwrap().as_second() as f64
}

fn resource_names(list: &Value) -> Vec<String> {
    list["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
}

/// The aggregated discovery document and its ETag.
async fn aggregated(env: &Env) -> (Value, String) {
    let (code, headers, body) = env.get("/apis", Some(AGGREGATED)).await;
    assert_eq!(code, 200, "{body}");
    (serde_json::from_str(&body).unwrap(), headers["etag"].to_str().unwrap().to_string())
}

/// The OpenAPI v3 root's URL for our group-version (it carries the document's hash) and the
/// document.
async fn openapi_v3(env: &Env) -> (String, Value) {
    let root = env.get_json("/openapi/v3").await;
    let url =
        root["paths"][&format!("apis/{GROUP}/v1alpha1")]["serverRelativeURL"].as_str().unwrap().to_string();
    let (code, _, body) = env.get(&url, Some("application/json")).await;
    assert_eq!(code, 200, "{body}");
    (url, serde_json::from_str(&body).unwrap())
}

/// Waits until every object of `path` has `field` (CPU needs two kubelet samples).
async fn wait_for_field(env: &Env, path: &str, field: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let list = env.get_json(path).await;
        let items = list["items"].as_array().unwrap();
        if !items.is_empty() && items.iter().all(|i| i.get(field).is_some()) {
            return list;
        }
        assert!(Instant::now() < deadline, "{field} never appeared: {list}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn declared_kinds_are_served_like_built_in_ones() {
    let (env, _config) = mk_env("declared", &config(&[APP_TRAFFIC, NAMESPACE_TRAFFIC, CAFE_ACTIVITY])).await;
    wait_for_field(&env, &format!("{GV}/cafeactivities"), "cpu").await;
    let truth = env.truth().await;
    let pods = http_pods(&truth);
    assert!(pods.len() >= 6, "the workload has pods serving HTTP");
    assert!(
        pods.values().any(|p| p["errorsPerSecond"].is_null())
            && pods.values().any(|p| p["errorsPerSecond"].is_f64())
    );

    // Discovery as kubectl sees it: names, short names, scope, kind, verbs, categories.
    let (header, rows) =
        table(&kubectl_ok(&env, &["api-resources", &format!("--api-group={GROUP}"), "-o", "wide"]));
    assert_eq!(header, ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND", "VERBS", "CATEGORIES"]);
    let gv = "stats.une-tasse-de.cafe/v1alpha1";
    assert_eq!(
        rows,
        [
            ["apptraffics", "atr", gv, "true", "AppTraffic", "get,list", "percolator"],
            ["cafeactivities", "cact", gv, "true", "CafeActivity", "get,list", "percolator"],
            ["cafebrewstats", "brews", gv, "true", "CafeBrewStats", "get,list", "percolator"],
            ["namespacetraffics", "nstr", gv, "false", "NamespaceTraffic", "get,list", "traffic"],
            ["podmetricssummaries", "pms", gv, "true", "PodMetricsSummary", "get,list", "percolator"],
        ]
    );
    let resources = env.get_json(GV).await;
    assert_eq!(
        resources["resources"][2],
        json!({"name": "apptraffics", "singularName": "apptraffic", "namespaced": true, "kind": "AppTraffic",
               "verbs": ["get", "list"], "shortNames": ["atr"], "categories": ["percolator"]})
    );
    assert_eq!(
        resource_names(&resources),
        ["podmetricssummaries", "cafebrewstats", "apptraffics", "namespacetraffics", "cafeactivities"]
    );

    // AppTraffic, -o json across namespaces: exactly the pods serving HTTP, values of the truth.
    let list: Value = serde_json::from_str(&kubectl_ok(&env, &["get", "atr", "-A", "-o", "json"])).unwrap();
    let items = list["items"].as_array().unwrap();
    let got: Vec<_> = items.iter().map(|i| key(&i["metadata"])).collect();
    assert_eq!(got, pods.keys().cloned().collect::<Vec<_>>(), "one object per pod serving HTTP, sorted");
    for item in items {
        let pod = pods[&key(&item["metadata"])];
        let what = format!("{}/{}", pod["namespace"], pod["name"]);
        let mut expected_keys =
            vec!["apiVersion", "kind", "metadata", "timestamp", "window", "requestsPerSecond"];
        if pod["errorsPerSecond"].is_f64() {
            expected_keys.push("errorsPerSecond");
        }
        assert_eq!(fields(item), sorted(&expected_keys), "{what}: {item}");
        assert_eq!(item["apiVersion"], "stats.une-tasse-de.cafe/v1alpha1");
        assert_eq!(item["kind"], "AppTraffic");
        assert_eq!(item["metadata"], json!({"name": pod["name"], "namespace": pod["namespace"]}), "{what}");
        assert_eq!(item["window"], "1m0s");
        assert!((unix(&item["timestamp"]) - truth["time"].as_f64().unwrap()).abs() <= 10.0, "{what}: {item}");
        assert_close(q(&item["requestsPerSecond"]), pod["requestsPerSecond"].as_f64().unwrap(), 0.05, &what);
        if let Some(errors) = pod["errorsPerSecond"].as_f64() {
            assert_close(q(&item["errorsPerSecond"]), errors, 0.05, &format!("{what} errors"));
        }
    }

    // The table of one namespace, then -o wide: the declared columns, in order.
    let shop: Vec<&Value> = pods.iter().filter(|((ns, _), _)| ns == "shop").map(|(_, p)| *p).collect();
    assert!(shop.len() >= 2);
    let (header, rows) = table(&kubectl_ok(&env, &["get", "atr", "-n", "shop"]));
    assert_eq!(header, ["NAME", "REQ/S"]);
    assert_eq!(
        names(&rows),
        shop.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    );
    for (row, pod) in rows.iter().zip(&shop) {
        assert_cell(&row[1], pod["requestsPerSecond"].as_f64().unwrap(), &format!("{} REQ/S", row[0]));
    }
    let (header, rows) = table(&kubectl_ok(&env, &["get", "apptraffics", "-n", "shop", "-o", "wide"]));
    assert_eq!(header, ["NAME", "REQ/S", "ERR/S"]);
    assert_eq!(rows.len(), shop.len());
    for (row, pod) in rows.iter().zip(&shop) {
        match pod["errorsPerSecond"].as_f64() {
            Some(errors) => assert_cell(&row[2], errors, &format!("{} ERR/S", row[0])),
            None => assert_eq!(row[2], "<none>", "{row:?}"),
        }
    }

    // The raw Table: column definitions as declared, the wide one at priority 1.
    let (code, _, body) = env.get(&format!("{GV}/namespaces/shop/apptraffics"), Some(TABLE)).await;
    assert_eq!(code, 200, "{body}");
    let t: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        t["columnDefinitions"],
        json!([
            {"name": "Name", "type": "string", "format": "name", "description": "Name of the AppTraffic.", "priority": 0},
            {"name": "REQ/S", "type": "string", "format": "", "description": "Requests per second over the window.", "priority": 0},
            {"name": "ERR/S", "type": "string", "format": "", "description": "5xx responses per second over the window.", "priority": 1},
        ])
    );
    let first = shop[0]["name"].as_str().unwrap();
    assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(t["rows"][0]["object"]["metadata"], json!({"name": first, "namespace": "shop"}));

    // Selectors, a named get through the singular, PartialObjectMetadata.
    let (_, rows) = table(&kubectl_ok(
        &env,
        &["get", "atr", "-n", "shop", "--field-selector", &format!("metadata.name={first}")],
    ));
    assert_eq!(names(&rows), [first]);
    let (_, rows) =
        table(&kubectl_ok(&env, &["get", "atr", "-A", "--field-selector", "metadata.namespace=api"]));
    let api: Vec<String> = pods.keys().filter(|(ns, _)| ns == "api").map(|(_, n)| n.clone()).collect();
    assert_eq!(rows.iter().map(|r| r[1].clone()).collect::<Vec<_>>(), api);
    assert!(rows.iter().all(|r| r[0] == "api"), "{rows:?}");
    let (header, rows) = table(&kubectl_ok(&env, &["get", "apptraffic", first, "-n", "shop"]));
    assert_eq!(header, ["NAME", "REQ/S"]);
    assert_eq!(names(&rows), [first]);
    let one: Value =
        serde_json::from_str(&kubectl_ok(&env, &["get", "atr", first, "-n", "shop", "-o", "json"])).unwrap();
    assert_eq!(one["metadata"], json!({"name": first, "namespace": "shop"}));
    assert_close(
        q(&one["requestsPerSecond"]),
        shop[0]["requestsPerSecond"].as_f64().unwrap(),
        0.05,
        "named get",
    );
    let (code, _, body) = env.get(&format!("{GV}/namespaces/shop/apptraffics/{first}"), None).await;
    assert_eq!(code, 200, "{body}");
    assert_key_order(&body, &["apiVersion", "kind", "metadata", "timestamp", "window", "requestsPerSecond"]);
    let (code, _, body) = env.get(&format!("{GV}/namespaces/shop/apptraffics/{first}"), Some(POM)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap(),
        json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": {"name": first, "namespace": "shop"}})
    );
    let (code, _, body) =
        env.get(&format!("{GV}/namespaces/shop/apptraffics?labelSelector=tier%3Dfront"), None).await;
    assert_eq!(
        (code, serde_json::from_str::<Value>(&body).unwrap()["items"].clone()),
        (200, json!([])),
        "no labels declared"
    );

    // explain reads the kind's and each field's description from OpenAPI v3.
    assert_eq!(
        kubectl_ok(&env, &["explain", "apptraffics.requestsPerSecond"]),
        explain_field("AppTraffic", "requestsPerSecond", "Requests per second over the window.")
    );
    assert_eq!(
        kubectl_ok(&env, &["explain", "cafeactivities.lastBrewed"]),
        explain_field("CafeActivity", "lastBrewed", "When the last brew completed.")
    );
    assert_eq!(
        kubectl_ok(&env, &["explain", "namespacetraffics"]),
        explain_kind(
            "NamespaceTraffic",
            "HTTP traffic per namespace, from Prometheus.",
            "namespace label of the query\n    results.",
            &[("requestsPerSecond", "Requests per second of the namespace's pods over the window.")]
        )
    );

    // Errors: an unknown name (404), write verbs and watch (405).
    let missing = format!("{GV}/namespaces/shop/apptraffics/nope");
    assert_eq!(
        kubectl_err(&env, &["get", "--raw", &missing]),
        "Error from server (NotFound): apptraffics.stats.une-tasse-de.cafe \"nope\" not found"
    );
    let (code, _, body) = env.get(&missing, Some(TABLE)).await;
    assert_eq!(code, 404);
    status(
        &body,
        404,
        "NotFound",
        "apptraffics.stats.une-tasse-de.cafe \"nope\" not found",
        Some(json!({"name": "nope", "group": GROUP, "kind": "apptraffics"})),
    );
    for (method, path, verb, resource) in [
        ("POST", format!("{GV}/namespaces/shop/apptraffics"), "create", "apptraffics"),
        ("DELETE", format!("{GV}/namespaces/shop/apptraffics/{first}"), "delete", "apptraffics"),
        ("PATCH", format!("{GV}/namespacetraffics/shop"), "patch", "namespacetraffics"),
        ("GET", format!("{GV}/namespaces/shop/apptraffics?watch=true"), "watch", "apptraffics"),
    ] {
        let (code, body) = send_as_admin(&env, method, &path).await;
        assert_eq!(code, 405, "{method} {path}: {body}");
        status(
            &body,
            405,
            "MethodNotAllowed",
            &format!("{verb} is not supported on resources of kind \"{resource}.{GROUP}\""),
            Some(json!({"group": GROUP, "kind": resource})),
        );
    }

    // NamespaceTraffic (Cluster): no namespace anywhere, its own 2m window, values summed.
    let rates = namespace_rates(&truth);
    assert!(rates.len() >= 2, "{rates:?}");
    let (header, rows) = table(&kubectl_ok(&env, &["get", "namespacetraffics"]));
    assert_eq!(header, ["NAME", "REQ/S"]);
    assert_eq!(names(&rows), rates.keys().cloned().collect::<Vec<_>>());
    for row in &rows {
        assert_cell(&row[1], rates[&row[0]], &format!("namespace {}", row[0]));
    }
    let list: Value = serde_json::from_str(&kubectl_ok(&env, &["get", "nstr", "-o", "json"])).unwrap();
    for item in list["items"].as_array().unwrap() {
        let name = item["metadata"]["name"].as_str().unwrap();
        assert_eq!(item["metadata"], json!({"name": name}), "cluster-scoped: no namespace");
        assert_eq!(item["kind"], "NamespaceTraffic");
        assert_eq!(item["window"], "2m0s");
        assert_close(q(&item["requestsPerSecond"]), rates[name], 0.05, name);
    }
    let (_, rows) = table(&kubectl_ok(&env, &["get", "namespacetraffic", "shop"]));
    assert_eq!(names(&rows), ["shop"]);
    assert_eq!(
        kubectl_err(&env, &["get", "nstr", "nope"]),
        "Error from server (NotFound): namespacetraffics.stats.une-tasse-de.cafe \"nope\" not found"
    );
    let (code, _, body) = env.get(&format!("{GV}/namespaces/shop/namespacetraffics"), None).await;
    assert_eq!(code, 404, "a cluster-scoped kind has no namespaced path: {body}");
    status(&body, 404, "NotFound", "the server could not find the requested resource", Some(json!({})));

    // Categories: `percolator` gathers the namespaced kinds, `traffic` the cluster-scoped one.
    let out = kubectl_ok(&env, &["get", "percolator", "-n", "shop", "-o", "name"]);
    let of = |prefix: &str| -> Vec<String> {
        out.lines().filter_map(|l| l.strip_prefix(prefix)).map(str::to_string).collect()
    };
    assert_eq!(
        of("apptraffic.stats.une-tasse-de.cafe/"),
        shop.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    );
    let shop_cafes: Vec<String> =
        serving_cafes(&truth).keys().filter(|(ns, _)| ns == "shop").map(|(_, n)| n.clone()).collect();
    assert_eq!(of("cafeactivity.stats.une-tasse-de.cafe/"), shop_cafes);
    assert!(
        !of("podmetricssummary.stats.une-tasse-de.cafe/").is_empty()
            && !of("cafebrewstats.stats.une-tasse-de.cafe/").is_empty(),
        "{out}"
    );
    assert!(of("namespacetraffic.stats.une-tasse-de.cafe/").is_empty(), "{out}");
    let out = kubectl_ok(&env, &["get", "traffic", "-o", "name"]);
    assert_eq!(
        out.lines().collect::<Vec<_>>(),
        rates.keys().map(|ns| format!("namespacetraffic.stats.une-tasse-de.cafe/{ns}")).collect::<Vec<_>>()
    );

    // CafeActivity: the pods join (count, creation time, CPU, memory), the copied label, and the
    // percent, seconds and timestamp formats.
    check_cafe_activity(&env).await;
}

async fn check_cafe_activity(env: &Env) {
    let (list, truth) = {
        let list: Value =
            serde_json::from_str(&kubectl_ok(env, &["get", "cact", "-A", "-o", "json"])).unwrap();
        (list, env.truth().await)
    };
    let cafes = serving_cafes(&truth);
    assert!(cafes.len() >= 4, "the workload has cafes");
    let pods: BTreeMap<(String, String), &Value> = running(&truth).into_iter().map(|p| (key(p), p)).collect();
    let items = list["items"].as_array().unwrap();
    assert_eq!(
        items.iter().map(|i| key(&i["metadata"])).collect::<Vec<_>>(),
        cafes.keys().cloned().collect::<Vec<_>>()
    );
    for item in items {
        let cafe = cafes[&key(&item["metadata"])];
        let what = format!("{}/{}", cafe["namespace"], cafe["name"]);
        let serving: Vec<&Value> = cafe["pods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                pods[&(cafe["namespace"].as_str().unwrap().to_string(), p.as_str().unwrap().to_string())]
            })
            .collect();
        let oldest = serving.iter().map(|p| p["creationTimestamp"].as_str().unwrap()).min().unwrap();
        assert_eq!(
            item["metadata"],
            json!({"name": cafe["name"], "namespace": cafe["namespace"], "labels": {"type": cafe["type"]}, "creationTimestamp": oldest}),
            "{what}"
        );
        assert_eq!(
            fields(item),
            sorted(&[
                "apiVersion",
                "kind",
                "metadata",
                "timestamp",
                "window",
                "brewsPerMinute",
                "failureRatio",
                "p95",
                "lastBrewed",
                "pods",
                "cpu",
                "memory"
            ]),
            "{what}: {item}"
        );
        assert_eq!(item["window"], "1m0s");
        assert_cafe_rates(item, cafe, &what);
        let p95 = cafe["duration"]["p95"].as_f64().unwrap();
        assert!(
            (seconds(&item["p95"]) - p95).abs() <= bucket_width(p95),
            "{what} p95 {} vs {p95}",
            item["p95"]
        );
        // The list was computed before the truth was taken: its last brew is no later than
        // the truth's, and no older than its data (cache TTL and scrape interval) allows.
        let last = unix(&item["lastBrewed"]);
        let expected = cafe["lastBrewed"].as_f64().unwrap();
        let now = truth["time"].as_f64().unwrap();
        assert!(
            last <= expected + 1.0 && last >= now - last_brew_bound(cafe),
            "{what} lastBrewed {last} vs {expected} at {now}"
        );
        assert_eq!(item["pods"], json!(serving.len()), "{what} pods");
        assert_usage_close(item, cafe, (0.05, 0.05), &what);
    }

    let (header, rows) = table(&kubectl_ok(env, &["get", "cafeactivities", "-n", "shop", "-o", "wide"]));
    assert_eq!(header, ["NAME", "BREWS/MIN", "FAILED", "P95", "LAST BREWED", "PODS", "CPU", "MEMORY"]);
    let shop: Vec<&Value> = cafes.iter().filter(|((ns, _), _)| ns == "shop").map(|(_, c)| *c).collect();
    assert_eq!(
        names(&rows),
        shop.iter().map(|c| c["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    );
    for (row, cafe) in rows.iter().zip(&shop) {
        assert_cell(&row[1], cafe["brewsPerMinute"].as_f64().unwrap(), &format!("{} BREWS/MIN", row[0]));
        assert_percent_cell(&row[2], cafe["failureRatio"].as_f64().unwrap(), &format!("{} FAILED", row[0]));
        let p95: f64 = row[3].strip_suffix('s').unwrap().parse().unwrap();
        let expected = cafe["duration"]["p95"].as_f64().unwrap();
        assert!((p95 - expected).abs() <= bucket_width(expected), "{row:?}");
        let age = k8s_wire::duration::parse(&row[4]).unwrap().as_secs_f64();
        assert!(age <= last_brew_bound(cafe), "{row:?}");
        assert_eq!(row[5], cafe["pods"].as_array().unwrap().len().to_string());
        assert!(row[6].ends_with('m') && row[7].ends_with("Mi"), "{row:?}");
    }

    // -l selects on the copied label.
    let espresso: Vec<(String, String)> =
        cafes.iter().filter(|(_, c)| c["type"] == "espresso").map(|(k, _)| k.clone()).collect();
    assert!(!espresso.is_empty());
    let list: Value =
        serde_json::from_str(&kubectl_ok(env, &["get", "cact", "-A", "-l", "type=espresso", "-o", "json"]))
            .unwrap();
    assert_eq!(
        list["items"].as_array().unwrap().iter().map(|i| key(&i["metadata"])).collect::<Vec<_>>(),
        espresso
    );
}

/// Every invalid file of the matrix: what it adds to the good file and the error percolator
/// logs (after `--config <path>: `).
fn invalid_files() -> Vec<(String, &'static str)> {
    vec![
        (
            "- kind: AppTraffic\n  plural: moretraffics\n  nameLabel: pod\n  fields: [{name: value, query: 'sum by (namespace, pod) (up{SCOPE})'}]\n".to_string(),
            "field kinds[2].kind: \"AppTraffic\" is already declared by kinds[0]",
        ),
        (clash("plural: podmetricssummaries"), "field kinds[Clash].plural: \"podmetricssummaries\" is already the plural of podmetricssummaries"),
        (clash("shortNames: [pms]"), "field kinds[Clash].shortNames[0]: \"pms\" is already the short name of podmetricssummaries"),
        (
            clash("fields: [{name: metadata, query: 'sum by (namespace, pod) (up{SCOPE})'}]"),
            "field kinds[Clash].fields[0].name: \"metadata\" is reserved: every object has it",
        ),
        (
            clash("fields: [{name: value, query: 'sum by (namespace, pod) (up{SCOPE})', format: fraction}]"),
            "field kinds[Clash].fields[value].format: \"fraction\" is not a format: expected one of number, percent, cores, bytes, seconds, timestamp",
        ),
        (
            clash("fields: [{name: value, query: 'sum by (namespace) (rate(http_requests_total{SCOPE}[WINDOW]))'}]"),
            "field kinds[Clash].fields[value].query: drops the label \"pod\" (sum by (namespace) keeps only namespace), which names the objects (nameLabel)",
        ),
        (
            clash("fields: [{name: value, query: 'sum by (namespace, pod) (rate(http_requests_total[WINDOW]))'}]"),
            "field kinds[Clash].fields[value].query: PromQL template: the selector http_requests_total has no {SCOPE} matchers and would read every namespace",
        ),
        // Not a duration: rejected while the YAML is parsed, before the kinds are checked, so
        // the entry is named by its index (and the YAML position of the value).
        (clash("window: soon"), "kinds[2].window: invalid duration \"soon\": expected a number with a unit (ms, s, m, h), e.g. 15s or 5m at line 21 column 11"),
    ]
}

/// The `error` of every "configuration rejected" line percolator has logged so far.
fn rejections(env: &Env) -> Vec<String> {
    std::fs::read_to_string(&env.stderr_log)
        .unwrap()
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["fields"]["message"] == REJECTED)
        .map(|v| v["fields"]["error"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// percolator's `/metrics` once `line` is in it (within [`RELOAD_DEADLINE`]).
async fn wait_for_metric(env: &Env, line: &str) -> String {
    let deadline = Instant::now() + RELOAD_DEADLINE;
    loop {
        let (_, _, metrics) = env.get("/metrics", None).await;
        if metrics.lines().any(|l| l == line) {
            return metrics;
        }
        assert!(Instant::now() < deadline, "{line} never appeared:\n{metrics}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn declared_kinds_follow_the_file_and_invalid_files_are_rejected_whole() {
    let (env, dir) = mk_env("declared-reload", &config(&[APP_TRAFFIC, NAMESPACE_TRAFFIC])).await;
    let path = dir.join("config.yaml").display().to_string();
    let truth = env.truth().await;
    let pods = http_pods(&truth);
    let shop = |pred: &dyn Fn(&Value) -> bool| -> Vec<&Value> {
        pods.iter().filter(|((ns, _), p)| ns == "shop" && pred(p)).map(|(_, p)| *p).collect()
    };
    let (_, etag0) = aggregated(&env).await;
    let (openapi0, _) = openapi_v3(&env).await;
    assert_eq!(
        resource_names(&env.get_json(GV).await),
        ["podmetricssummaries", "cafebrewstats", "apptraffics", "namespacetraffics"]
    );

    // (a) A kind is added: kubectl finds it by its short name, with every default filled in.
    configmap_write(&dir, 2, &config(&[APP_TRAFFIC, NAMESPACE_TRAFFIC, ERROR_TRAFFIC]));
    let out = kubectl_until(&env, &["get", "etr", "-n", "shop"], "the added kind", |ok, _| ok).await;
    let with_errors = shop(&|p| p["errorsPerSecond"].is_f64());
    assert!(!with_errors.is_empty());
    let (header, rows) = table(&out);
    assert_eq!(header, ["NAME", "ERR/S"]);
    assert_eq!(
        names(&rows),
        with_errors.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    );
    for (row, pod) in rows.iter().zip(&with_errors) {
        assert_cell(&row[1], pod["errorsPerSecond"].as_f64().unwrap(), &row[0]);
    }
    let resources = env.get_json(GV).await;
    assert_eq!(
        resources["resources"][4],
        json!({"name": "errortraffics", "singularName": "errortraffic", "namespaced": true, "kind": "ErrorTraffic",
               "verbs": ["get", "list"], "shortNames": ["etr"], "categories": ["percolator"]})
    );
    let (code, _, body) = env.get(&format!("{GV}/namespaces/shop/errortraffics"), Some(TABLE)).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        serde_json::from_str::<Value>(&body).unwrap()["columnDefinitions"],
        json!([
            {"name": "Name", "type": "string", "format": "name", "description": "Name of the ErrorTraffic.", "priority": 0},
            {"name": "ERR/S", "type": "string", "format": "", "description": "errorsPerSecond.", "priority": 0},
        ])
    );
    assert_eq!(
        kubectl_ok(&env, &["explain", "errortraffics"]),
        explain_kind(
            "ErrorTraffic",
            "ErrorTraffic is declared in the percolator configuration and computed at\n    request time from Prometheus.",
            "pod label of the query results.",
            &[("errorsPerSecond", "errorsPerSecond.")]
        )
    );
    let (aggregated1, etag1) = aggregated(&env).await;
    assert_ne!(etag1, etag0, "adding a kind changes the aggregated discovery ETag");
    let declared: Vec<&str> = aggregated1["items"][0]["versions"][0]["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["resource"].as_str().unwrap())
        .collect();
    assert_eq!(
        declared,
        ["podmetricssummaries", "cafebrewstats", "apptraffics", "namespacetraffics", "errortraffics"]
    );

    // (b) A kind is changed: another field, query, column and description.
    configmap_write(&dir, 3, &config(&[APP_TRAFFIC_PER_MINUTE, NAMESPACE_TRAFFIC, ERROR_TRAFFIC]));
    let out = kubectl_until(&env, &["get", "atr", "-n", "shop"], "the changed kind", |ok, out| {
        ok && out.starts_with("NAME") && out.lines().next().is_some_and(|l| l.contains("REQ/MIN"))
    })
    .await;
    let (header, rows) = table(&out);
    assert_eq!(header, ["NAME", "REQ/MIN"]);
    let serving = shop(&|_| true);
    assert_eq!(
        names(&rows),
        serving.iter().map(|p| p["name"].as_str().unwrap().to_string()).collect::<Vec<_>>()
    );
    for (row, pod) in rows.iter().zip(&serving) {
        assert_cell(&row[1], 60.0 * pod["requestsPerSecond"].as_f64().unwrap(), &row[0]);
    }
    let one: Value =
        serde_json::from_str(&kubectl_ok(&env, &["get", "atr", &rows[0][0], "-n", "shop", "-o", "json"]))
            .unwrap();
    assert!(one.get("requestsPerSecond").is_none(), "{one}");
    assert_close(
        q(&one["requestsPerMinute"]),
        60.0 * serving[0]["requestsPerSecond"].as_f64().unwrap(),
        0.05,
        "per minute",
    );
    assert_eq!(
        kubectl_ok(&env, &["explain", "apptraffics.requestsPerMinute"]),
        explain_field("AppTraffic", "requestsPerMinute", "Requests per minute over the window.")
    );
    assert_eq!(
        kubectl_err(&env, &["explain", "apptraffics.requestsPerSecond"]),
        "error: field \"requestsPerSecond\" does not exist"
    );
    let (_, etag2) = aggregated(&env).await;
    let (openapi2, _) = openapi_v3(&env).await;
    // Discovery names no field: its document and ETag stay; the OpenAPI document moves.
    assert_eq!(etag2, etag1, "aggregated discovery does not describe fields");
    assert_ne!(openapi2, openapi0, "a changed kind changes the OpenAPI v3 document");

    // (c) A kind is removed: it leaves discovery and OpenAPI, and its paths answer 404.
    configmap_write(&dir, 4, &config(&[APP_TRAFFIC_PER_MINUTE, ERROR_TRAFFIC]));
    kubectl_until(&env, &["get", "namespacetraffics"], "the removed kind", |ok, _| !ok).await;
    assert_eq!(
        kubectl_err(&env, &["get", "namespacetraffics"]),
        "error: the server doesn't have a resource type \"namespacetraffics\""
    );
    assert_eq!(
        kubectl_err(&env, &["get", "traffic"]),
        "error: the server doesn't have a resource type \"traffic\""
    );
    for path in [format!("{GV}/namespacetraffics"), format!("{GV}/namespacetraffics/shop")] {
        let (code, _, body) = env.get(&path, None).await;
        assert_eq!(code, 404, "{path}: {body}");
        status(&body, 404, "NotFound", "the server could not find the requested resource", Some(json!({})));
    }
    assert_eq!(
        resource_names(&env.get_json(GV).await),
        ["podmetricssummaries", "cafebrewstats", "apptraffics", "errortraffics"]
    );
    let (aggregated3, etag3) = aggregated(&env).await;
    assert_ne!(etag3, etag2, "removing a kind changes the aggregated discovery ETag");
    assert!(!aggregated3.to_string().contains("namespacetraffic"), "{aggregated3}");
    let (openapi3, v3) = openapi_v3(&env).await;
    assert_ne!(openapi3, openapi2);
    let v3_text = v3.to_string();
    assert!(!v3_text.contains("namespacetraffics") && !v3_text.contains("NamespaceTraffic"), "{v3_text}");
    assert!(v3["components"]["schemas"].get("cafe.une-tasse-de.stats.v1alpha1.ErrorTraffic").is_some());
    let v2 = env.get_json("/openapi/v2").await.to_string();
    assert!(!v2.contains("namespacetraffics") && !v2.contains("NamespaceTraffic"));
    let metrics =
        wait_for_metric(&env, "percolator_config_reloads_total{file=\"config\",result=\"success\"} 3").await;
    assert!(
        !metrics.contains("percolator_config_reloads_total{file=\"config\",result=\"failure\"}"),
        "{metrics}"
    );

    // Invalid files: each is rejected whole (counted, logged with the kind and field) and the
    // last good configuration keeps serving, unchanged.
    let good = config(&[APP_TRAFFIC_PER_MINUTE, ERROR_TRAFFIC]);
    let resources = env.get_json(GV).await;
    let invalid = invalid_files();
    for (n, (addition, _)) in invalid.iter().enumerate() {
        configmap_write(&dir, 5 + n as u32, &format!("{good}{addition}"));
        wait_for_metric(
            &env,
            &format!("percolator_config_reloads_total{{file=\"config\",result=\"failure\"}} {}", n + 1),
        )
        .await;
        assert_eq!(env.get(&format!("{GV}/namespaces/shop/apptraffics"), None).await.0, 200);
    }
    let metrics = wait_for_metric(&env, "percolator_config_last_reload_successful{file=\"config\"} 0").await;
    assert!(
        metrics.contains("percolator_config_reloads_total{file=\"config\",result=\"success\"} 3"),
        "{metrics}"
    );
    assert_eq!(env.get_json(GV).await, resources, "discovery is the last good configuration's");
    assert_eq!(aggregated(&env).await.1, etag3);
    assert_eq!(openapi_v3(&env).await.0, openapi3);
    let (header, _) = table(&kubectl_ok(&env, &["get", "atr", "-n", "shop"]));
    assert_eq!(header, ["NAME", "REQ/MIN"]);
    assert_eq!(
        kubectl_err(&env, &["get", "clash"]),
        "error: the server doesn't have a resource type \"clash\""
    );
    // The log line is written before the metric moves, but reaches the file through a pipe.
    let deadline = Instant::now() + Duration::from_secs(5);
    while rejections(&env).len() < invalid.len() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let expected: Vec<String> = invalid.iter().map(|(_, e)| format!("--config {path}: {e}")).collect();
    assert_eq!(rejections(&env), expected, "one log line per rejected file, naming the kind and field");
}
