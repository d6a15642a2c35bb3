//! Declared kinds computed from the fake sources, compared as exact JSON, cells, warnings,
//! PromQL and metrics: a namespaced kind (per-pod traffic, every format), a Cluster kind (one
//! object per namespace) and a cafe-like kind joined with its serving pods.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};

use super::{DeclaredKind, DeclaredSpec, FieldSpec, Format};
use crate::kinds::testkit::*;
use crate::kinds::{Column, KindInfo, Listing, ServedKind};
use crate::sources::{KubeletError, PromError, PromSample};
use apiserver::Metrics;

const CAFE_LABEL: &str = "une-tasse-de.cafe/cafe";

fn mk_info(kind: &str, plural: &str, namespaced: bool, description: &str) -> KindInfo {
    KindInfo {
        gv: crate::kinds::STATS,
        plural: plural.to_owned().into(),
        singular: kind.to_lowercase().into(),
        kind: kind.to_owned().into(),
        list_kind: format!("{kind}List").into(),
        short_names: Cow::Owned(Vec::new()),
        categories: Cow::Owned(vec!["percolator".into()]),
        namespaced,
        description: description.to_owned().into(),
        typed_list_items: true,
    }
}

fn mk_field(name: &str, query: &str, format: Format, column: Option<&str>, description: &str) -> FieldSpec {
    FieldSpec {
        name: name.to_owned(),
        query: query.into(),
        format,
        column: column.map(str::to_owned),
        wide: false,
        description: description.to_owned(),
    }
}

fn mk_column(name: &str, format: &str, description: &str, priority: i32) -> Column {
    Column {
        name: name.to_owned().into(),
        type_: "string".into(),
        format: format.to_owned().into(),
        description: description.to_owned().into(),
        priority,
    }
}

/// The columns the spec check builds: Name, the fields' columns, then the join's.
fn mk_columns(kind: &str, fields: &[FieldSpec], join: bool) -> Vec<Column> {
    let mut columns = vec![mk_column("Name", "name", &format!("Name of the {kind}."), 0)];
    for field in fields {
        if let Some(column) = &field.column {
            let format = match field.format {
                Format::Cores | Format::Bytes => "quantity",
                Format::Seconds => "duration",
                _ => "",
            };
            columns.push(mk_column(column, format, &field.description, i32::from(field.wide)));
        }
    }
    if join {
        columns.push(mk_column("Pods", "", "Serving pods running.", 1));
        columns.push(mk_column("CPU", "quantity", "CPU of the serving pods.", 1));
        columns.push(mk_column("Memory", "quantity", "Memory working set of the serving pods.", 1));
    }
    columns
}

/// AppTraffic (the example of docs/reference/kinds.md): per-pod traffic with a `tier` label, one field per
/// format, a 2m window; `inFlight` has no column, `workingSet`'s is wide.
fn mk_app_traffic() -> DeclaredSpec {
    let mut fields = vec![
        mk_field(
            "requestsPerSecond",
            "sum by (namespace, pod, tier) (rate(http_requests_total{SCOPE}[WINDOW]))",
            Format::Number,
            Some("REQ/S"),
            "Requests per second over the window.",
        ),
        mk_field(
            "errorRatio",
            "sum by (namespace, pod) (app_error_ratio{SCOPE})",
            Format::Percent,
            Some("ERROR%"),
            "Errors over requests.",
        ),
        mk_field(
            "cpuCores",
            "sum by (namespace, pod) (rate(app_cpu_seconds_total{SCOPE}[WINDOW]))",
            Format::Cores,
            Some("CPU"),
            "CPU the app reports.",
        ),
        mk_field(
            "workingSet",
            "sum by (namespace, pod) (app_memory_working_set_bytes{SCOPE})",
            Format::Bytes,
            Some("MEMORY"),
            "Memory the app reports.",
        ),
        mk_field(
            "p95Latency",
            "histogram_quantile(0.95, sum by (namespace, pod, le) (rate(app_latency_seconds_bucket{SCOPE}[WINDOW])))",
            Format::Seconds,
            Some("P95"),
            "95th percentile latency.",
        ),
        mk_field(
            "lastDeploy",
            "max by (namespace, pod) (app_deploy_timestamp_seconds{SCOPE})",
            Format::Timestamp,
            Some("DEPLOYED"),
            "When the app was last deployed.",
        ),
        mk_field(
            "inFlight",
            "sum by (namespace, pod, track) (app_in_flight_requests{SCOPE})",
            Format::Number,
            None,
            "",
        ),
    ];
    fields[3].wide = true;
    DeclaredSpec {
        info: mk_info("AppTraffic", "apptraffics", true, "HTTP traffic per pod, from Prometheus."),
        name_label: "pod".to_owned(),
        labels: vec!["tier".to_owned(), "track".to_owned()],
        window: Some(Duration::from_secs(120)),
        pods_label: None,
        columns: mk_columns("AppTraffic", &fields, false),
        fields,
    }
}

/// NamespaceTraffic: a Cluster kind, one object per namespace, its query without SCOPE.
fn mk_namespace_traffic() -> DeclaredSpec {
    let fields = vec![mk_field(
        "requestsPerSecond",
        "sum by (namespace) (rate(http_requests_total[WINDOW]))",
        Format::Number,
        Some("REQ/S"),
        "Requests per second in the namespace.",
    )];
    DeclaredSpec {
        info: mk_info("NamespaceTraffic", "namespacetraffics", false, "HTTP traffic per namespace."),
        name_label: "namespace".to_owned(),
        labels: Vec::new(),
        window: None,
        pods_label: None,
        columns: mk_columns("NamespaceTraffic", &fields, false),
        fields,
    }
}

/// CafeLoad: one object per cafe, joined with the pods labelled with its name.
fn mk_cafe_load() -> DeclaredSpec {
    let fields = vec![
        mk_field(
            "brewsPerSecond",
            "sum by (namespace, cafe, type) (rate(cafe_brews_total{SCOPE}[WINDOW]))",
            Format::Number,
            Some("BREWS/S"),
            "Brews per second.",
        ),
        mk_field(
            "temperature",
            "max by (namespace, cafe) (cafe_temperature_celsius{SCOPE})",
            Format::Number,
            Some("TEMP"),
            "Temperature in °C.",
        ),
    ];
    DeclaredSpec {
        info: mk_info("CafeLoad", "cafeloads", true, "Load of each cafe."),
        name_label: "cafe".to_owned(),
        labels: vec!["type".to_owned()],
        window: None,
        pods_label: Some(CAFE_LABEL.to_owned()),
        columns: mk_columns("CafeLoad", &fields, true),
        fields,
    }
}

fn mk_kind(
    spec: DeclaredSpec,
    inventory: Arc<FakeInventory>,
    kubelet: Arc<FakeKubelet>,
    prom: Arc<FakeProm>,
    metrics: Option<Arc<Metrics>>,
) -> DeclaredKind {
    DeclaredKind::new(Arc::new(spec), mk_sources(inventory, kubelet, prom), metrics)
}

/// An object as served: the kinds' `apiVersion`, then `object`'s fields (`kind`, `metadata`, …).
fn mk_object(object: Value) -> Value {
    let mut served = json!({"apiVersion": "stats.une-tasse-de.cafe/v1alpha1"});
    if let (Some(served), Value::Object(fields)) = (served.as_object_mut(), object) {
        served.extend(fields);
    }
    served
}

fn mk_objects(listing: &Listing) -> Vec<Value> {
    listing.items.iter().map(mk_json).collect()
}

fn mk_pod_sample(namespace: &str, pod: &str, extra: &[(&str, &str)], value: f64, at: &str) -> PromSample {
    let mut labels = vec![("namespace", namespace), ("pod", pod)];
    labels.extend_from_slice(extra);
    mk_sample(&labels, value, at)
}

/// Traffic of `ns`: web-1 has every field, web-2 a few (an invalid tier, a NaN ratio), Bad_Name
/// is not an object name; api-1 in `other`.
fn mk_traffic_prom() -> FakeProm {
    FakeProm::default()
        .answer(
            "http_requests_total",
            vec![
                mk_pod_sample("ns", "web-1", &[("tier", "frontend")], 12.5, "2026-07-01T10:00:10Z"),
                mk_pod_sample("ns", "web-2", &[("tier", "front end!")], 0.25, "2026-07-01T10:00:10Z"),
                mk_pod_sample("ns", "Bad_Name", &[], 1.0, AT),
                mk_sample(&[("namespace", "ns")], 5.0, AT),
                mk_pod_sample("other", "api-1", &[("tier", "backend")], 10.0, AT),
            ],
        )
        .answer(
            "app_error_ratio",
            vec![
                mk_pod_sample("ns", "web-1", &[], 0.04, "2026-07-01T10:00:10Z"),
                mk_pod_sample("ns", "web-2", &[], f64::NAN, "2026-07-01T10:00:40Z"),
            ],
        )
        .answer(
            "app_cpu_seconds_total",
            vec![mk_pod_sample("ns", "web-1", &[("tier", "not-first")], 0.250_000_4, "2026-07-01T10:00:20Z")],
        )
        .answer(
            "app_memory_working_set_bytes",
            vec![mk_pod_sample("ns", "web-1", &[], 128.0 * MI, "2026-07-01T10:00:05Z")],
        )
        .answer(
            "app_latency_seconds_bucket",
            vec![mk_pod_sample("ns", "web-1", &[], 28.04, "2026-07-01T10:00:10Z")],
        )
        // 2026-07-01T09:59:41Z and seven tenths.
        .answer("app_deploy_timestamp_seconds", vec![mk_pod_sample("ns", "web-1", &[], 1_782_899_981.7, AT)])
        .answer(
            "app_in_flight_requests",
            vec![
                mk_pod_sample("ns", "web-1", &[("track", "stable")], 3.0, "2026-07-01T10:00:15Z"),
                mk_pod_sample("ns", "web-2", &[("track", "canary")], 1.0, "2026-07-01T10:00:01Z"),
            ],
        )
}

fn mk_traffic_kind(
    prom: FakeProm,
    metrics: Option<Arc<Metrics>>,
) -> (DeclaredKind, Arc<FakeKubelet>, Arc<FakeProm>) {
    let kubelet = Arc::new(FakeKubelet::default());
    let prom = Arc::new(prom);
    let inventory = FakeInventory::with(vec![mk_pod("ns", "web-1", "node-a", &[], &["app"], AT)]);
    (mk_kind(mk_app_traffic(), inventory, kubelet.clone(), prom.clone(), metrics), kubelet, prom)
}

fn mk_web_1() -> Value {
    mk_object(json!({
        "kind": "AppTraffic",
        "metadata": {"name": "web-1", "namespace": "ns", "labels": {"tier": "frontend", "track": "stable"}},
        "timestamp": "2026-07-01T10:00:20Z",
        "window": "2m0s",
        "requestsPerSecond": "12500m",
        "errorRatio": "40m",
        "cpuCores": "250m",
        "workingSet": "128Mi",
        "p95Latency": "28.04s",
        "lastDeploy": "2026-07-01T09:59:41Z",
        "inFlight": "3",
    }))
}

#[tokio::test]
async fn namespaced_kind_publishes_every_format() {
    let (kind, kubelet, _) = mk_traffic_kind(mk_traffic_prom(), None);
    let listing = kind.list(Some("ns")).await.unwrap();
    let names: Vec<&str> = listing.items.iter().map(|i| &*i.meta.name).collect();
    assert_eq!(names, ["web-1", "web-2"]);
    let web_1 = &listing.items[0];
    // The timestamp is the newest sample's (cpuCores'); the cpu sample's tier comes after
    // requestsPerSecond's, so it is not copied.
    assert_eq!(mk_json(web_1), mk_web_1());
    assert_eq!(
        std::str::from_utf8(web_1.list_json()).unwrap(),
        r#"{"apiVersion":"stats.une-tasse-de.cafe/v1alpha1","kind":"AppTraffic","metadata":{"name":"web-1","namespace":"ns","labels":{"tier":"frontend","track":"stable"}},"timestamp":"2026-07-01T10:00:20Z","window":"2m0s","requestsPerSecond":"12500m","errorRatio":"40m","cpuCores":"250m","workingSet":"128Mi","p95Latency":"28.04s","lastDeploy":"2026-07-01T09:59:41Z","inFlight":"3"}"#
    );
    assert_eq!(
        mk_cells(web_1),
        ["web-1", "12.5", "4.0%", "250m", "128Mi", "28s", "age:2026-07-01T09:59:41Z"]
    );
    assert_eq!(mk_cells(web_1).len(), kind.columns().len());
    assert_eq!(*web_1.meta.namespace, *"ns");
    assert_eq!(web_1.meta.creation_timestamp, None);
    assert_eq!(listing.warnings, Vec::<String>::new());
    assert_eq!(listing.resource_version, "42");
    assert_eq!(kubelet.called(), Vec::<String>::new(), "no join, no kubelet");
}

#[tokio::test]
async fn missing_fields_nan_and_invalid_label_values_are_left_out() {
    let (kind, _, _) = mk_traffic_kind(mk_traffic_prom(), None);
    let listing = kind.list(Some("ns")).await.unwrap();
    let web_2 = &listing.items[1];
    // errorRatio is NaN (and its newer sample does not count); tier "front end!" is not a
    // label value; the other fields have no series.
    assert_eq!(
        mk_json(web_2),
        mk_object(json!({
            "kind": "AppTraffic",
            "metadata": {"name": "web-2", "namespace": "ns", "labels": {"track": "canary"}},
            "timestamp": "2026-07-01T10:00:10Z",
            "window": "2m0s",
            "requestsPerSecond": "250m",
            "inFlight": "1",
        }))
    );
    assert_eq!(mk_cells(web_2), ["web-2", "0.25", "<none>", "<none>", "<none>", "<none>", "<none>"]);
    assert_eq!(web_2.meta.labels.get("tier"), None);
}

#[tokio::test]
async fn namespace_list_sends_scoped_promql_with_the_kind_window() {
    let (kind, _, prom) = mk_traffic_kind(mk_traffic_prom(), None);
    kind.list(Some("ns")).await.unwrap();
    let mut expected = [
        r#"sum by (namespace, pod, tier) (rate(http_requests_total{namespace="ns"}[2m]))"#,
        r#"sum by (namespace, pod) (app_error_ratio{namespace="ns"})"#,
        r#"sum by (namespace, pod) (rate(app_cpu_seconds_total{namespace="ns"}[2m]))"#,
        r#"sum by (namespace, pod) (app_memory_working_set_bytes{namespace="ns"})"#,
        r#"histogram_quantile(0.95, sum by (namespace, pod, le) (rate(app_latency_seconds_bucket{namespace="ns"}[2m])))"#,
        r#"max by (namespace, pod) (app_deploy_timestamp_seconds{namespace="ns"})"#,
        r#"sum by (namespace, pod, track) (app_in_flight_requests{namespace="ns"})"#,
    ];
    expected.sort();
    assert_eq!(prom.received(), expected);
}

#[tokio::test]
async fn all_namespaces_list_sends_unscoped_promql_and_sorts_by_namespace() {
    let (kind, _, prom) = mk_traffic_kind(mk_traffic_prom(), None);
    let listing = kind.list(None).await.unwrap();
    let keys: Vec<(&str, &str)> = listing.items.iter().map(|i| (&*i.meta.namespace, &*i.meta.name)).collect();
    assert_eq!(keys, [("ns", "web-1"), ("ns", "web-2"), ("other", "api-1")]);
    assert_eq!(
        mk_json(&listing.items[2]),
        mk_object(json!({
            "kind": "AppTraffic",
            "metadata": {"name": "api-1", "namespace": "other", "labels": {"tier": "backend"}},
            "timestamp": AT,
            "window": "2m0s",
            "requestsPerSecond": "10",
        }))
    );
    let received = prom.received();
    assert_eq!(received.len(), 7);
    assert!(received.contains(&"sum by (namespace, pod) (app_error_ratio{})".to_owned()), "{received:#?}");
    assert!(received.iter().all(|q| !q.contains("namespace=")), "{received:#?}");
}

#[tokio::test]
async fn invalid_object_names_are_skipped_and_counted() {
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let (kind, _, _) = mk_traffic_kind(mk_traffic_prom(), Some(metrics.clone()));
    let listing = kind.list(Some("ns")).await.unwrap();
    assert!(listing.items.iter().all(|i| &*i.meta.name != "Bad_Name"));
    assert_eq!(listing.items.len(), 2);
    kind.list(Some("ns")).await.unwrap();
    let text = metrics.encode();
    let lines: Vec<&str> = text.lines().filter(|l| l.contains("skipped_objects")).collect();
    assert_eq!(
        lines,
        [
            "# HELP percolator_skipped_objects Objects not served, by resource and reason.",
            "# TYPE percolator_skipped_objects counter",
            r#"percolator_skipped_objects_total{resource="apptraffics",reason="invalid_name"} 2"#,
        ]
    );
}

#[tokio::test]
async fn one_failed_query_omits_its_field_and_keeps_the_objects() {
    let prom = FakeProm::default()
        .fail("app_error_ratio", PromError::Query("bad_data: parse error".into()))
        .answer("http_requests_total", vec![mk_pod_sample("ns", "web-1", &[("tier", "frontend")], 2.0, AT)])
        .answer("app_in_flight_requests", vec![mk_pod_sample("ns", "web-3", &[], 4.0, AT)]);
    let (kind, _, _) = mk_traffic_kind(prom, None);
    let listing = kind.list(Some("ns")).await.unwrap();
    assert_eq!(
        mk_objects(&listing),
        [
            mk_object(json!({
                "kind": "AppTraffic",
                "metadata": {"name": "web-1", "namespace": "ns", "labels": {"tier": "frontend"}},
                "timestamp": AT,
                "window": "2m0s",
                "requestsPerSecond": "2",
            })),
            mk_object(json!({
                "kind": "AppTraffic",
                "metadata": {"name": "web-3", "namespace": "ns"},
                "timestamp": AT,
                "window": "2m0s",
                "inFlight": "4",
            })),
        ]
    );
    assert_eq!(mk_cells(&listing.items[0]), ["web-1", "2", "<none>", "<none>", "<none>", "<none>", "<none>"]);
    assert_eq!(listing.warnings, ["errorRatio omitted: prometheus query failed: bad_data: parse error"]);
}

#[tokio::test]
async fn duplicate_samples_use_the_first_and_warn_per_field() {
    let prom = FakeProm::default()
        .answer(
            "http_requests_total",
            vec![
                mk_pod_sample("ns", "web-1", &[("tier", "frontend")], 12.5, AT),
                mk_pod_sample("ns", "web-1", &[("tier", "backend")], 99.0, AT),
                mk_pod_sample("ns", "web-2", &[], 0.25, AT),
                mk_pod_sample("ns", "web-2", &[], 7.0, AT),
                mk_pod_sample("ns", "web-2", &[], 8.0, AT),
            ],
        )
        .answer(
            "app_in_flight_requests",
            vec![
                mk_pod_sample("ns", "web-1", &[("track", "stable")], 3.0, AT),
                mk_pod_sample("ns", "web-1", &[("track", "canary")], 4.0, AT),
            ],
        );
    let (kind, _, _) = mk_traffic_kind(prom, None);
    let listing = kind.list(Some("ns")).await.unwrap();
    let objects = mk_objects(&listing);
    assert_eq!(
        objects[0],
        mk_object(json!({
            "kind": "AppTraffic",
            "metadata": {"name": "web-1", "namespace": "ns", "labels": {"tier": "frontend", "track": "stable"}},
            "timestamp": AT,
            "window": "2m0s",
            "requestsPerSecond": "12500m",
            "inFlight": "3",
        }))
    );
    assert_eq!(objects[1]["requestsPerSecond"], "250m");
    assert_eq!(
        listing.warnings,
        [
            "requestsPerSecond: 2 objects had several samples; the first was used",
            "inFlight: 1 object had several samples; the first was used",
        ]
    );
}

#[tokio::test]
async fn cluster_kind_names_objects_by_label_without_namespace() {
    let prom = Arc::new(FakeProm::default().answer(
        "http_requests_total",
        vec![
            mk_sample(&[("namespace", "shop")], 12.5, "2026-07-01T10:00:10Z"),
            mk_sample(&[("namespace", "kube-system")], 0.5, AT),
            mk_sample(&[("namespace", "Not_A_Name")], 1.0, AT),
            mk_sample(&[("job", "no-namespace")], 3.0, AT),
        ],
    ));
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let inventory = FakeInventory::with(vec![mk_pod("shop", "web-1", "node-a", &[], &["app"], AT)]);
    let kubelet = Arc::new(FakeKubelet::default());
    let kind =
        mk_kind(mk_namespace_traffic(), inventory, kubelet.clone(), prom.clone(), Some(metrics.clone()));
    let listing = kind.list(None).await.unwrap();
    assert_eq!(
        mk_objects(&listing),
        [
            mk_object(json!({
                "kind": "NamespaceTraffic",
                "metadata": {"name": "kube-system"},
                "timestamp": AT,
                "window": "5m0s",
                "requestsPerSecond": "500m",
            })),
            mk_object(json!({
                "kind": "NamespaceTraffic",
                "metadata": {"name": "shop"},
                "timestamp": "2026-07-01T10:00:10Z",
                "window": "5m0s",
                "requestsPerSecond": "12500m",
            })),
        ]
    );
    assert_eq!(mk_cells(&listing.items[1]), ["shop", "12.5"]);
    assert_eq!(*listing.items[1].meta.namespace, *"");
    assert_eq!(listing.warnings, Vec::<String>::new());
    assert_eq!(prom.received(), ["sum by (namespace) (rate(http_requests_total[5m]))"]);
    assert_eq!(kubelet.called(), Vec::<String>::new());
    assert!(
        metrics.encode().contains(
            r#"percolator_skipped_objects_total{resource="namespacetraffics",reason="invalid_name"} 1"#
        ),
        "{}",
        metrics.encode()
    );
}

fn mk_cafe(namespace: &str, cafe: &str, extra: &[(&str, &str)], value: f64, at: &str) -> PromSample {
    let mut labels = vec![("namespace", namespace), ("cafe", cafe)];
    labels.extend_from_slice(extra);
    mk_sample(&labels, value, at)
}

/// In `ns`: espresso-du-matin (two pods on node-a, both series), lungo-froid (one pod on
/// node-b, a temperature), prom-only (series, no pod), Bad_Name (a pod and a series) and web-1
/// (serving no cafe, on node-c); in `other`: espresso-du-soir.
fn mk_cafes() -> (Arc<FakeInventory>, FakeKubelet, FakeProm) {
    let inventory = mk_cafe_inventory();
    let usage = |cpu: f64, memory: f64, at: &str| vec![mk_container("app", Some(cpu), Some(memory), at)];
    let kubelet = FakeKubelet::default()
        .node(
            "node-a",
            vec![
                ("ns", "brew-1", usage(0.02, 30.0 * MI, "2026-07-01T10:00:30Z")),
                ("ns", "brew-2", usage(0.015, 18.0 * MI, AT)),
                ("ns", "bad-1", usage(0.3, 300.0 * MI, AT)),
            ],
        )
        .node("node-b", vec![("ns", "cold-1", usage(0.005, 10.0 * MI, AT))])
        .node("node-c", vec![("ns", "web-1", usage(0.7, 700.0 * MI, AT))])
        .node("node-d", vec![("other", "brew-9", usage(0.001, MI, AT))]);
    let prom = FakeProm::default()
        .answer(
            "cafe_brews_total",
            vec![
                mk_cafe("ns", "espresso-du-matin", &[("type", "espresso")], 0.14, "2026-07-01T10:00:10Z"),
                mk_cafe("ns", "prom-only", &[("type", "cappuccino")], 0.04, AT),
                mk_cafe("ns", "Bad_Name", &[("type", "latte")], 0.01, AT),
            ],
        )
        .answer(
            "cafe_temperature_celsius",
            vec![
                mk_cafe("ns", "espresso-du-matin", &[], 90.5, AT),
                mk_cafe("ns", "lungo-froid", &[], 45.5, "2026-07-01T09:59:00Z"),
            ],
        );
    (inventory, kubelet, prom)
}

#[tokio::test]
async fn pods_join_counts_pods_and_sums_their_usage() {
    let (inventory, kubelet, prom) = mk_cafes();
    let metrics = Metrics::new(crate::METRICS_NAMESPACE);
    let kubelet = Arc::new(kubelet);
    let kind = mk_kind(mk_cafe_load(), inventory, kubelet.clone(), Arc::new(prom), Some(metrics.clone()));
    let listing = kind.list(Some("ns")).await.unwrap();
    // espresso-du-matin: the oldest pod's creation time; brew-1's kubelet sample is the newest.
    assert_eq!(
        mk_objects(&listing),
        [
            mk_object(json!({
                "kind": "CafeLoad",
                "metadata": {
                    "name": "espresso-du-matin",
                    "namespace": "ns",
                    "creationTimestamp": "2026-07-01T08:00:00Z",
                    "labels": {"type": "espresso"},
                },
                "timestamp": "2026-07-01T10:00:30Z",
                "window": "5m0s",
                "brewsPerSecond": "140m",
                "temperature": "90500m",
                "pods": 2,
                "cpu": "35m",
                "memory": "48Mi",
            })),
            mk_object(json!({
                "kind": "CafeLoad",
                "metadata": {"name": "lungo-froid", "namespace": "ns", "creationTimestamp": "2026-07-01T07:00:00Z"},
                "timestamp": AT,
                "window": "5m0s",
                "temperature": "45500m",
                "pods": 1,
                "cpu": "5m",
                "memory": "10Mi",
            })),
            mk_object(json!({
                "kind": "CafeLoad",
                "metadata": {"name": "prom-only", "namespace": "ns", "labels": {"type": "cappuccino"}},
                "timestamp": AT,
                "window": "5m0s",
                "brewsPerSecond": "40m",
                "pods": 0,
            })),
        ]
    );
    assert_eq!(
        std::str::from_utf8(listing.items[0].list_json()).unwrap(),
        r#"{"apiVersion":"stats.une-tasse-de.cafe/v1alpha1","kind":"CafeLoad","metadata":{"name":"espresso-du-matin","namespace":"ns","creationTimestamp":"2026-07-01T08:00:00Z","labels":{"type":"espresso"}},"timestamp":"2026-07-01T10:00:30Z","window":"5m0s","brewsPerSecond":"140m","temperature":"90500m","pods":2,"cpu":"35m","memory":"48Mi"}"#
    );
    let cells: Vec<Vec<String>> = listing.items.iter().map(mk_cells).collect();
    assert_eq!(
        cells,
        [
            ["espresso-du-matin", "0.14", "90.5", "2", "35m", "48Mi"],
            ["lungo-froid", "<none>", "45.5", "1", "5m", "10Mi"],
            ["prom-only", "0.04", "<none>", "0", "<none>", "<none>"],
        ]
    );
    assert_eq!(cells[0].len(), kind.columns().len());
    assert_eq!(listing.warnings, Vec::<String>::new());
    assert_eq!(kubelet.called(), ["node-a", "node-b"], "only the nodes of the namespace's serving pods");
    // Bad_Name is named by a pod and by a series: one object skipped.
    assert!(
        metrics
            .encode()
            .contains(r#"percolator_skipped_objects_total{resource="cafeloads",reason="invalid_name"} 1"#),
        "{}",
        metrics.encode()
    );
}

#[tokio::test]
async fn everything_down_keeps_the_objects_of_the_joined_pods() {
    let (inventory, _, _) = mk_cafes();
    let kubelet = FakeKubelet::default()
        .down("node-a", KubeletError::Request { node: "node-a".into(), reason: "connection refused".into() })
        .down("node-b", KubeletError::ScrapeError { node: "node-b".into() });
    let prom = FakeProm::down(PromError::Unreachable("timeout".into()));
    let kind = mk_kind(mk_cafe_load(), inventory, Arc::new(kubelet), Arc::new(prom), None);
    let listing = kind.list(Some("ns")).await.unwrap();
    assert_eq!(
        mk_objects(&listing),
        [
            mk_object(json!({
                "kind": "CafeLoad",
                "metadata": {"name": "espresso-du-matin", "namespace": "ns", "creationTimestamp": "2026-07-01T08:00:00Z"},
                "window": "5m0s",
                "pods": 2,
            })),
            mk_object(json!({
                "kind": "CafeLoad",
                "metadata": {"name": "lungo-froid", "namespace": "ns", "creationTimestamp": "2026-07-01T07:00:00Z"},
                "window": "5m0s",
                "pods": 1,
            })),
        ]
    );
    assert_eq!(
        mk_cells(&listing.items[0]),
        ["espresso-du-matin", "<none>", "<none>", "2", "<none>", "<none>"]
    );
    assert_eq!(
        listing.warnings,
        [
            "cpu and memory omitted for pods on 2 nodes: kubelet on node node-a: connection refused; \
             kubelet on node node-b reported a scrape error",
            "brewsPerSecond omitted: prometheus unreachable: timeout",
            "temperature omitted: prometheus unreachable: timeout",
        ]
    );
}

#[tokio::test]
async fn pods_join_across_namespaces() {
    let (inventory, kubelet, prom) = mk_cafes();
    let kubelet = Arc::new(kubelet);
    let prom = Arc::new(prom);
    let kind = mk_kind(mk_cafe_load(), inventory, kubelet.clone(), prom.clone(), None);
    let listing = kind.list(None).await.unwrap();
    let keys: Vec<(&str, &str)> = listing.items.iter().map(|i| (&*i.meta.namespace, &*i.meta.name)).collect();
    assert_eq!(
        keys,
        [
            ("ns", "espresso-du-matin"),
            ("ns", "lungo-froid"),
            ("ns", "prom-only"),
            ("other", "espresso-du-soir")
        ]
    );
    assert_eq!(
        mk_json(&listing.items[3]),
        mk_object(json!({
            "kind": "CafeLoad",
            "metadata": {"name": "espresso-du-soir", "namespace": "other", "creationTimestamp": "2026-07-01T06:00:00Z"},
            "timestamp": AT,
            "window": "5m0s",
            "pods": 1,
            "cpu": "1m",
            "memory": "1Mi",
        }))
    );
    assert_eq!(kubelet.called(), ["node-a", "node-b", "node-d"]);
    assert_eq!(
        prom.received(),
        [
            "max by (namespace, cafe) (cafe_temperature_celsius{})",
            "sum by (namespace, cafe, type) (rate(cafe_brews_total{}[5m]))",
        ]
    );
}

#[test]
fn schema_describes_every_field_by_format() {
    let kind = mk_traffic_kind(FakeProm::default(), None).0;
    let schemas = kind.schemas();
    let names: Vec<&str> = schemas.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["cafe.une-tasse-de.stats.v1alpha1.AppTraffic"]);
    let string = |description: &str| json!({"type": "string", "description": description});
    assert_eq!(
        schemas[0].1,
        json!({
            "type": "object",
            "description": "HTTP traffic per pod, from Prometheus.",
            "properties": {
                "apiVersion": string("APIVersion defines the versioned schema of this representation of an object: stats.une-tasse-de.cafe/v1alpha1."),
                "kind": string("Kind is a string value representing the REST resource this object represents: AppTraffic."),
                "metadata": {
                    "$ref": "#/components/schemas/io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta",
                    "description": "Standard object metadata: the name is the pod label of the query results; labels copy the results' tier, track labels.",
                },
                "timestamp": {"type": "string", "format": "date-time", "description": "When the newest input sample (Prometheus) was taken, RFC 3339."},
                "window": string("Range the rates are computed over, as a duration (5m0s)."),
                "requestsPerSecond": string("Requests per second over the window."),
                "errorRatio": string("Errors over requests."),
                "cpuCores": string("CPU the app reports."),
                "workingSet": string("Memory the app reports."),
                "p95Latency": string("95th percentile latency."),
                "lastDeploy": {"type": "string", "format": "date-time", "description": "When the app was last deployed."},
                "inFlight": string("inFlight."),
            },
            "x-kubernetes-group-version-kind": [{"group": "stats.une-tasse-de.cafe", "version": "v1alpha1", "kind": "AppTraffic"}],
        })
    );
}

#[test]
fn schema_of_a_joined_kind_has_pods_cpu_and_memory() {
    let (inventory, kubelet, prom) = mk_cafes();
    let kind = mk_kind(mk_cafe_load(), inventory, Arc::new(kubelet), Arc::new(prom), None);
    let schema = &kind.schemas()[0].1;
    let properties = &schema["properties"];
    assert_eq!(
        [&properties["metadata"]["description"], &properties["timestamp"]["description"]],
        [
            "Standard object metadata: the name is the cafe label of the query results; labels copy the results' type labels; creationTimestamp is the oldest joined pod's.",
            "When the newest input sample (kubelet or Prometheus) was taken, RFC 3339.",
        ]
    );
    assert_eq!(
        [properties["pods"].clone(), properties["cpu"].clone(), properties["memory"].clone()],
        [
            json!({"type": "integer", "format": "int64", "description": "Running pods whose une-tasse-de.cafe/cafe label is the object's name."}),
            json!({"type": "string", "description": "CPU usage of those pods in cores, summed (a Quantity), from the kubelets. Omitted when any pod has no CPU rate yet."}),
            json!({"type": "string", "description": "Memory working set of those pods, summed (a Quantity), from the kubelets."}),
        ]
    );
}

#[tokio::test]
async fn cluster_kind_joins_the_pods_of_every_namespace() {
    let (inventory, kubelet, _) = mk_cafes();
    let mut spec = mk_cafe_load();
    spec.info.namespaced = false;
    spec.fields.truncate(1);
    spec.fields[0].query = "sum by (cafe) (rate(cafe_brews_total[WINDOW]))".into();
    spec.columns = mk_columns("CafeLoad", &spec.fields, true);
    let prom = Arc::new(FakeProm::default().answer(
        "cafe_brews_total",
        vec![
            mk_sample(&[("cafe", "espresso-du-soir")], 0.5, AT),
            mk_sample(&[("cafe", "prom-only")], 0.04, AT),
        ],
    ));
    let kind = mk_kind(spec, inventory, Arc::new(kubelet), prom.clone(), None);
    let listing = kind.list(None).await.unwrap();
    let keys: Vec<(&str, &str)> = listing.items.iter().map(|i| (&*i.meta.namespace, &*i.meta.name)).collect();
    assert_eq!(
        keys,
        [("", "espresso-du-matin"), ("", "espresso-du-soir"), ("", "lungo-froid"), ("", "prom-only")]
    );
    assert_eq!(
        mk_json(&listing.items[1]),
        mk_object(json!({
            "kind": "CafeLoad",
            "metadata": {"name": "espresso-du-soir", "creationTimestamp": "2026-07-01T06:00:00Z"},
            "timestamp": AT,
            "window": "5m0s",
            "brewsPerSecond": "500m",
            "pods": 1,
            "cpu": "1m",
            "memory": "1Mi",
        }))
    );
    assert_eq!(mk_cells(&listing.items[0]), ["espresso-du-matin", "<none>", "2", "35m", "48Mi"]);
    assert_eq!(prom.received(), ["sum by (cafe) (rate(cafe_brews_total[5m]))"]);
}

#[tokio::test]
async fn a_refresh_shares_the_names_and_label_sets_of_the_one_before() {
    // What a listing keeps for its lifetime is not allocated again by every refresh
    // (RELIABILITY.md, "Soak": such blocks hold the allocator's pages).
    let (kind, _, _) = mk_traffic_kind(mk_traffic_prom(), None);
    let (first, second) = (kind.list(None).await.unwrap(), kind.list(None).await.unwrap());
    assert_eq!(first.items.len(), 3);
    for (a, b) in first.items.iter().zip(&second.items) {
        assert!(!std::ptr::eq(a, b), "two computations, not one cached");
        assert!(Arc::ptr_eq(&a.meta.name, &b.meta.name), "{}", a.meta.name);
        assert!(Arc::ptr_eq(&a.meta.namespace, &b.meta.namespace), "{}", a.meta.namespace);
        assert!(Arc::ptr_eq(&a.meta.labels, &b.meta.labels), "{:?}", a.meta.labels);
    }
}
