//! Handler tests: `router(state_with_fakes).oneshot(request)` on the fake kinds of `testutil`,
//! with exact JSON comparison, covering every endpoint and the error matrix.

use std::sync::Arc;

use axum::Router;
use http::StatusCode;
use serde_json::{Value, json};

use super::testutil::API_VERSION;
use super::testutil::{
    Behavior, CREATED, FakeKind, KUBECTL_TABLE, Reply, V2_ACCEPT, WIDGET, call_with, get, get_accept,
    mk_gadgets, mk_item, mk_widgets, status_body,
};
use super::*;
use crate::kind::OBJECT_META_SCHEMA;

const G: &str = "stats.example.com";
const V: &str = "v1alpha1";

fn mk_state_with(widgets: Arc<FakeKind>, ready: bool) -> ApiState {
    let kinds: crate::kind::Kinds = vec![widgets, mk_gadgets()];
    ApiState::new(kinds, Arc::new(move || ready), Metrics::new("example"))
}

fn mk_app() -> Router {
    router(mk_state_with(mk_widgets(Behavior::Ok, &[]), true))
}

fn assert_status(r: &Reply, code: u16, reason: &str, message: &str, details: Option<Value>) {
    assert_eq!(r.status.as_u16(), code, "{}", r.text());
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(r.json(), status_body(code, reason, message, details));
}

/// A Status asking to retry after a second, in its details and in `Retry-After`.
fn assert_retry_after(r: &Reply, code: u16, reason: &str, message: &str) {
    assert_status(r, code, reason, message, Some(json!({"retryAfterSeconds": 1})));
    assert_eq!(r.header("retry-after"), "1");
}

/// `/readyz` is a 500 whose report lists `checks`, then says so.
async fn assert_readyz_fails(app: &Router, checks: &str) {
    let r = get(app, "/readyz").await;
    assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
    assert_eq!(r.text(), format!("{checks}readyz check failed\n"));
}

fn names(v: &Value) -> Vec<String> {
    v["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            format!(
                "{}/{}",
                i["metadata"]["namespace"].as_str().unwrap_or_default(),
                i["metadata"]["name"].as_str().unwrap()
            )
        })
        .collect()
}

fn widgets_path(ns: &str) -> String {
    format!("/apis/{G}/{V}/namespaces/{ns}/widgets")
}

// ---- resources: plain JSON ----

#[tokio::test]
async fn namespaced_list_is_the_kind_list() {
    let app = mk_app();
    let r = get(&app, &format!("{}?limit=500", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/json");
    let v = r.json();
    assert_eq!(v["kind"], "WidgetList");
    assert_eq!(v["apiVersion"], API_VERSION);
    assert_eq!(v["metadata"], json!({"resourceVersion": "17"}));
    assert_eq!(names(&v), ["shop/db-0", "shop/web-1", "shop/web-2"]);
    assert_eq!(
        v["items"][1],
        json!({"kind": "Widget", "apiVersion": API_VERSION,
               "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1",
                            "creationTimestamp": CREATED, "labels": {"app": "web", "tier": "front"}},
               "size": "2"})
    );
    assert!(v.get("continue").is_none() && v["metadata"].get("continue").is_none());
}

#[tokio::test]
async fn all_namespaces_list_and_empty_namespace() {
    let app = mk_app();
    let v = get(&app, &format!("/apis/{G}/{V}/widgets")).await.json();
    assert_eq!(names(&v), ["other/web-1", "shop/db-0", "shop/web-1", "shop/web-2"]);
    let r = get(&app, &widgets_path("empty")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({"kind": "WidgetList", "apiVersion": API_VERSION, "metadata": {"resourceVersion": "17"}, "items": []})
    );
}

#[tokio::test]
async fn get_one_object_and_not_found() {
    let app = mk_app();
    let r = get(&app, &format!("{}/web-2", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["metadata"]["name"], "web-2");
    assert_eq!(r.json()["kind"], "Widget");

    let r = get(&app, &format!("{}/x", widgets_path("shop"))).await;
    assert_status(
        &r,
        404,
        "NotFound",
        "widgets.stats.example.com \"x\" not found",
        Some(json!({"name": "x", "group": G, "kind": "widgets"})),
    );
    // The same name in another namespace is not found here.
    let r = get(&app, &format!("{}/db-0", widgets_path("other"))).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn cluster_scoped_kind_routes() {
    let app = mk_app();
    let v = get(&app, &format!("/apis/{G}/{V}/gadgets")).await.json();
    assert_eq!(v["kind"], "GadgetList");
    assert_eq!(names(&v), ["/g1"]);
    let r = get(&app, &format!("/apis/{G}/{V}/gadgets/g1")).await;
    assert_eq!(r.json()["metadata"]["name"], "g1");
    let r = get(&app, &format!("/apis/{G}/{V}/gadgets/nope")).await;
    assert_eq!(r.json()["message"], "gadgets.stats.example.com \"nope\" not found");
    // A namespaced path for a cluster-scoped kind does not exist.
    let r = get(&app, &format!("/apis/{G}/{V}/namespaces/shop/gadgets")).await;
    assert_status(&r, 404, "NotFound", "the server could not find the requested resource", Some(json!({})));
    // Default table convertor for a kind without columns.
    let v = get_accept(&app, &format!("/apis/{G}/{V}/gadgets"), KUBECTL_TABLE).await.json();
    assert_eq!(v["columnDefinitions"][1]["name"], "Created At");
    assert_eq!(v["rows"][0]["cells"], json!(["g1", CREATED]));
}

// ---- selectors ----

#[tokio::test]
async fn label_selectors_filter() {
    let app = mk_app();
    let list = |sel: &str| {
        let app = app.clone();
        let uri = format!("/apis/{G}/{V}/widgets?labelSelector={}", urlencode(sel));
        async move { names(&get(&app, &uri).await.json()) }
    };
    assert_eq!(list("app=web").await, ["other/web-1", "shop/web-1", "shop/web-2"]);
    assert_eq!(list("app=web,tier").await, ["shop/web-1"]);
    assert_eq!(list("app in (db, nothing)").await, ["shop/db-0"]);
    assert_eq!(list("app notin (web)").await, ["shop/db-0"]);
    assert_eq!(list("!tier,app!=db").await, ["other/web-1", "shop/web-2"]);
    assert_eq!(list("").await.len(), 4);
}

fn urlencode(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

#[tokio::test]
async fn bad_label_selectors_are_400() {
    let app = mk_app();
    let r = get(&app, &format!("{}?labelSelector={}", widgets_path("shop"), urlencode("app=a\"b"))).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "unable to parse requirement: values[0][app]: Invalid value: \"a\\\"b\": a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')",
        None,
    );
    for sel in ["app=x}", "app in (a\\b)", "=x", "a in (b", "a b"] {
        let r = get(&app, &format!("{}?labelSelector={}", widgets_path("shop"), urlencode(sel))).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{sel}: {}", r.text());
        assert_eq!(r.json()["reason"], "BadRequest");
    }
}

#[tokio::test]
async fn field_selectors() {
    let widgets = mk_widgets(Behavior::Ok, &[]);
    let app = router(mk_state_with(widgets.clone(), true));
    let list = |q: &str| {
        let app = app.clone();
        let uri = format!("/apis/{G}/{V}/widgets?fieldSelector={}", urlencode(q));
        async move { names(&get(&app, &uri).await.json()) }
    };
    assert_eq!(list("metadata.name=web-1").await, ["other/web-1", "shop/web-1"]);
    assert_eq!(list("metadata.name==web-1,metadata.namespace=shop").await, ["shop/web-1"]);
    assert_eq!(list("metadata.namespace!=shop").await, ["other/web-1"]);
    // A cluster-wide list pinned to one namespace only computes that namespace.
    widgets.calls.lock().unwrap().clear();
    assert_eq!(list("metadata.namespace=other").await, ["other/web-1"]);
    assert_eq!(*widgets.calls.lock().unwrap(), [Some("other".to_owned())]);

    // On a namespaced path both apply: a different namespace selects nothing.
    let r = get(&app, &format!("{}?fieldSelector=metadata.namespace%3Dother", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(names(&r.json()), Vec::<String>::new());
    let r = get(&app, &format!("{}?fieldSelector=metadata.namespace%3Dshop", widgets_path("shop"))).await;
    assert_eq!(names(&r.json()).len(), 3);

    let r = get(&app, &format!("{}?fieldSelector=spec.nodeName%3Dn1", widgets_path("shop"))).await;
    assert_status(&r, 400, "BadRequest", "field label not supported: spec.nodeName", None);
    let r = get(&app, &format!("{}?fieldSelector=metadata.name", widgets_path("shop"))).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "invalid selector: 'metadata.name'; can't understand 'metadata.name'",
        None,
    );
}

// ---- representations ----

#[tokio::test]
async fn kubectl_table() {
    let app = mk_app();
    let r = get_accept(&app, &format!("{}?labelSelector=tier", widgets_path("shop")), KUBECTL_TABLE).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(
        r.json(),
        json!({
            "kind": "Table", "apiVersion": "meta.k8s.io/v1",
            "metadata": {"resourceVersion": "17"},
            "columnDefinitions": [
                {"name": "Name", "type": "string", "format": "name", "description": "Name of the widget.", "priority": 0},
                {"name": "Size", "type": "string", "format": "quantity", "description": "Size.", "priority": 0},
                {"name": "Node", "type": "string", "format": "", "description": "Node.", "priority": 1},
                {"name": "Age", "type": "string", "format": "", "description": "Time since creation.", "priority": 0}
            ],
            "rows": [{
                "cells": ["web-1", "2", "<none>", "3h"],
                "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                           "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1",
                                        "creationTimestamp": CREATED, "labels": {"app": "web", "tier": "front"}}}
            }]
        })
    );
}

#[tokio::test]
async fn table_variants_and_include_object() {
    let app = mk_app();
    let one = format!("{}/web-2", widgets_path("shop"));
    let beta = "application/json;as=Table;v=v1beta1;g=meta.k8s.io";
    let v = get_accept(&app, &one, beta).await.json();
    assert_eq!(v["apiVersion"], "meta.k8s.io/v1beta1");
    assert_eq!(v["rows"].as_array().unwrap().len(), 1);
    assert_eq!(v["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1beta1");

    let v = get_accept(&app, &format!("{one}?includeObject=Object"), KUBECTL_TABLE).await.json();
    assert_eq!(v["rows"][0]["object"]["kind"], "Widget");
    assert_eq!(v["rows"][0]["object"]["size"], "4");

    let v = get_accept(&app, &format!("{one}?includeObject=None"), KUBECTL_TABLE).await.json();
    assert_eq!(v["rows"][0]["object"], Value::Null);

    let r = get_accept(&app, &format!("{one}?includeObject=x"), KUBECTL_TABLE).await;
    assert_status(&r, 400, "BadRequest", "unrecognized includeObject value: \"x\"", None);
    // includeObject only matters for Tables.
    let r = get(&app, &format!("{one}?includeObject=x")).await;
    assert_eq!(r.status, StatusCode::OK);

    // Empty table.
    let v = get_accept(&app, &widgets_path("empty"), KUBECTL_TABLE).await.json();
    assert_eq!(v["rows"], json!([]));
}

#[tokio::test]
async fn partial_object_metadata() {
    let app = mk_app();
    let meta_client = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
    let v =
        get_accept(&app, &format!("{}?labelSelector=tier", widgets_path("shop")), meta_client).await.json();
    assert_eq!(
        v,
        json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
               "metadata": {"resourceVersion": "17"},
               "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                          "metadata": {"name": "web-1", "namespace": "shop", "uid": "uid-web-1",
                                       "creationTimestamp": CREATED, "labels": {"app": "web", "tier": "front"}}}]})
    );

    let pom = "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1";
    let r = get_accept(&app, &widgets_path("shop"), pom).await;
    assert_status(
        &r,
        406,
        "NotAcceptable",
        "you requested PartialObjectMetadata, but the requested object is a list",
        None,
    );
    let r = get_accept(&app, &format!("{}/db-0", widgets_path("shop")), pom).await;
    assert_eq!(r.json()["kind"], "PartialObjectMetadata");
    assert_eq!(r.json()["metadata"]["name"], "db-0");
    let r = get_accept(
        &app,
        &format!("{}/db-0", widgets_path("shop")),
        "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
    )
    .await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn protobuf_clients_get_json_and_protobuf_only_is_406() {
    let app = mk_app();
    let r = get_accept(&app, &widgets_path("shop"), "application/vnd.kubernetes.protobuf, */*").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(r.json()["kind"], "WidgetList");
    let r = get_accept(&app, &widgets_path("shop"), "application/vnd.kubernetes.protobuf").await;
    assert_status(
        &r,
        406,
        "NotAcceptable",
        "only the following media types are accepted: application/json",
        None,
    );
    let r = get_accept(&app, &widgets_path("shop"), "application/yaml").await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
}

// ---- verbs ----

#[tokio::test]
async fn watch_is_405() {
    let app = mk_app();
    let msg = "watch is not supported on resources of kind \"widgets.stats.example.com\"";
    let details = Some(json!({"group": G, "kind": "widgets"}));
    for uri in [
        format!("{}?watch=true", widgets_path("shop")),
        format!("{}?watch=1&resourceVersion=17", widgets_path("shop")),
        format!("/apis/{G}/{V}/widgets?watch=true"),
        format!("/apis/{G}/{V}/watch/namespaces/shop/widgets"),
        format!("/apis/{G}/{V}/watch/namespaces/shop/widgets/web-1"),
    ] {
        let r = get(&app, &uri).await;
        assert_status(&r, 405, "MethodNotAllowed", msg, details.clone());
    }
    let r = get(&app, &format!("{}?watch=false", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::OK);
    let r = get(&app, &format!("{}?watch=0", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn write_verbs_are_405() {
    let app = mk_app();
    let coll = widgets_path("shop");
    let one = format!("{coll}/web-1");
    let cases = [
        ("POST", coll.clone(), "create"),
        ("PUT", one.clone(), "update"),
        ("PATCH", one.clone(), "patch"),
        ("DELETE", one.clone(), "delete"),
        ("DELETE", coll.clone(), "deletecollection"),
        ("POST", format!("/apis/{G}/{V}/widgets"), "create"),
        ("OPTIONS", coll.clone(), "options"),
        ("DELETE", format!("/apis/{G}/{V}/gadgets/g1"), "delete"),
    ];
    for (method, uri, verb) in cases {
        let r = call_with(&app, method, &uri, &[]).await;
        let plural = if uri.contains("gadgets") { "gadgets" } else { "widgets" };
        assert_status(
            &r,
            405,
            "MethodNotAllowed",
            &format!("{verb} is not supported on resources of kind \"{plural}.stats.example.com\""),
            Some(json!({"group": G, "kind": plural})),
        );
    }
    // Non-resource paths.
    let r = call_with(&app, "POST", "/apis", &[]).await;
    assert_status(
        &r,
        405,
        "MethodNotAllowed",
        "the server does not allow this method on the requested resource",
        None,
    );
    assert_eq!(call_with(&app, "DELETE", "/openapi/v2", &[]).await.status, StatusCode::METHOD_NOT_ALLOWED);
}

// ---- paths and validation ----

#[tokio::test]
async fn unknown_paths_are_404_status() {
    let app = mk_app();
    for uri in [
        "/".to_owned(),
        "/nope".to_owned(),
        "/api/v1".to_owned(),
        "/api/v1/namespaces/default/pods".to_owned(),
        "/apis/example.com".to_owned(),
        "/apis/example.com/v1".to_owned(),
        format!("/apis/{G}/v9"),
        format!("/apis/{G}/v9/widgets"),
        format!("/apis/{G}/{V}/unknowns"),
        format!("/apis/{G}/{V}/namespaces/shop/unknowns"),
        format!("/apis/{G}/{V}/namespaces/shop"),
        format!("/apis/{G}/{V}/namespaces"),
        format!("/apis/{G}/{V}/namespaces/shop/widgets/web-1/status"),
        format!("/apis/{G}/{V}/widgets/web-1"),
        format!("/apis/{G}/{V}/watch"),
        format!("/apis/{G}/{V}/proxy/namespaces/shop/widgets/web-1"),
        "/openapi/v3/apis/example.com/v1".to_owned(),
        "/openapi/v4".to_owned(),
    ] {
        let r = get(&app, &uri).await;
        assert_status(
            &r,
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        );
    }
    // An unknown resource is a 404 whatever the method.
    let r = call_with(&app, "POST", &format!("/apis/{G}/{V}/unknowns"), &[]).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn invalid_namespace_and_name_are_400() {
    let app = mk_app();
    let r = get(&app, &widgets_path("Shop")).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "invalid namespace \"Shop\": a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character (e.g. 'my-name',  or '123-abc', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?')",
        None,
    );
    let r = get(&app, &widgets_path("a.b")).await;
    assert_status(&r, 400, "BadRequest", "invalid namespace \"a.b\": must not contain dots", None);
    let r = get(&app, &format!("/apis/{G}/{V}/namespaces//widgets")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    let r = get(&app, &widgets_path("a%22%7D")).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["message"].as_str().unwrap().starts_with("invalid namespace \"a\\\"}\""));

    let r = get(&app, &format!("{}/Web_1", widgets_path("shop"))).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "invalid name \"Web_1\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character (e.g. 'example.com', regex used for validation is '[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*')",
        None,
    );
    let r = get(&app, &format!("{}/a%2Fb", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    assert!(r.json()["message"].as_str().unwrap().starts_with("invalid name \"a/b\""));
}

#[tokio::test]
async fn query_parameters() {
    let app = mk_app();
    // limit, continue, resourceVersion and friends are accepted and ignored.
    let r = get(
        &app,
        &format!(
            "{}?limit=1&continue=abc&resourceVersion=0&resourceVersionMatch=NotOlderThan&timeoutSeconds=5&pretty=true",
            widgets_path("shop")
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(names(&r.json()).len(), 3);
    let r = get(&app, &format!("{}?limit=abc", widgets_path("shop"))).await;
    assert_status(&r, 400, "BadRequest", "strconv.ParseInt: parsing \"abc\": invalid syntax", None);
    // Garbage encodings never produce a plain-text rejection or a 500.
    for q in ["%", "%zz", "labelSelector=%ff", "&&=&", "labelSelector", "fieldSelector=%2C%2C", "a=b;c=d"] {
        let r = get(&app, &format!("{}?{q}", widgets_path("shop"))).await;
        assert!(r.status == StatusCode::OK || r.status == StatusCode::BAD_REQUEST, "{q}: {}", r.status);
        assert_eq!(r.header("content-type"), "application/json", "{q}");
    }
}

// ---- upstream states ----

#[tokio::test]
async fn not_ready_is_503_with_retry_after() {
    let app = router(mk_state_with(mk_widgets(Behavior::NotReady, &[]), false));
    let r = get(&app, &widgets_path("shop")).await;
    assert_retry_after(&r, 503, "ServiceUnavailable", "the pod inventory is not synced yet");
    let r = get(&app, &format!("{}/web-1", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    // Discovery and OpenAPI never depend on upstreams.
    assert_eq!(get(&app, &format!("/apis/{G}/{V}")).await.status, StatusCode::OK);
    assert_eq!(get(&app, "/openapi/v2").await.status, StatusCode::OK);
}

#[tokio::test]
async fn internal_errors_and_panics_are_generic_500s() {
    for behavior in [Behavior::Internal, Behavior::Panic] {
        let app = router(mk_state_with(mk_widgets(behavior, &[]), true));
        let r = get(&app, &widgets_path("shop")).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR);
        let v = r.json();
        assert_eq!(v["reason"], "InternalError");
        assert!(!r.text().contains("secret"), "{}", r.text());
        assert!(!r.text().contains("panic"), "{}", r.text());
    }
}

#[tokio::test]
async fn warnings_become_warning_headers() {
    let app = router(mk_state_with(
        mk_widgets(Behavior::Ok, &["node-a unreachable: cpu and memory omitted", "say \"hi\"", "say \"hi\""]),
        true,
    ));
    let r = get(&app, &widgets_path("shop")).await;
    assert_eq!(r.status, StatusCode::OK);
    let warnings: Vec<&str> = r.headers.get_all("warning").iter().map(|v| v.to_str().unwrap()).collect();
    assert_eq!(
        warnings,
        ["299 - \"node-a unreachable: cpu and memory omitted\"", "299 - \"say \\\"hi\\\"\""]
    );
    let r = get_accept(&app, &format!("{}/web-1", widgets_path("shop")), KUBECTL_TABLE).await;
    assert_eq!(r.headers.get_all("warning").iter().count(), 2);
}

// ---- discovery ----

#[tokio::test]
async fn api_is_empty_api_versions() {
    let app = mk_app();
    let r = get(&app, "/api").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.text(), r#"{"kind":"APIVersions","versions":[],"serverAddressByClientCIDRs":null}"#);
    let r = get_accept(&app, "/api", V2_ACCEPT).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.json()["items"], json!([]));
}

#[tokio::test]
async fn legacy_discovery_documents() {
    let app = mk_app();
    let gv = json!({"groupVersion": format!("{G}/{V}"), "version": V});
    let r = get_accept(&app, "/apis", "application/json, */*").await;
    assert_eq!(r.header("content-type"), "application/json");
    assert_eq!(
        r.json(),
        json!({"kind": "APIGroupList", "apiVersion": "v1",
               "groups": [{"name": G, "versions": [gv], "preferredVersion": gv}]})
    );
    let r = get(&app, &format!("/apis/{G}")).await;
    assert_eq!(
        r.json(),
        json!({"kind": "APIGroup", "apiVersion": "v1", "name": G, "versions": [gv], "preferredVersion": gv})
    );
    let r = get(&app, &format!("/apis/{G}/{V}")).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.json(),
        json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": format!("{G}/{V}"),
        "resources": [
            {"name": "widgets", "singularName": "widget", "namespaced": true, "kind": "Widget",
             "verbs": ["get", "list"], "shortNames": ["wd"], "categories": ["example"]},
            {"name": "gadgets", "singularName": "gadget", "namespaced": false, "kind": "Gadget",
             "verbs": ["get", "list"]}
        ]})
    );
    // Trailing slashes are the same documents.
    assert_eq!(get(&app, &format!("/apis/{G}/{V}/")).await.json()["kind"], "APIResourceList");
    assert_eq!(get(&app, "/apis/").await.json()["kind"], "APIGroupList");
}

#[tokio::test]
async fn aggregated_discovery_v2_with_etag() {
    let app = mk_app();
    let r = get_accept(&app, "/apis", V2_ACCEPT).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(
        r.header("content-type"),
        "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"
    );
    assert_eq!(r.header("vary"), "Accept");
    assert_eq!(r.header("cache-control"), "public");
    let etag = r.header("etag").to_owned();
    assert_eq!(etag, format!("\"{}\"", discovery::sha512_hex(&r.body)));
    assert_eq!(
        r.json(),
        json!({
            "kind": "APIGroupDiscoveryList", "apiVersion": "apidiscovery.k8s.io/v2", "metadata": {},
            "items": [{
                "metadata": {"name": G},
                "versions": [{
                    "version": V,
                    "resources": [
                        {"resource": "widgets", "responseKind": {"group": G, "version": V, "kind": "Widget"},
                         "scope": "Namespaced", "singularResource": "widget", "verbs": ["get", "list"],
                         "shortNames": ["wd"], "categories": ["example"]},
                        {"resource": "gadgets", "responseKind": {"group": G, "version": V, "kind": "Gadget"},
                         "scope": "Cluster", "singularResource": "gadget", "verbs": ["get", "list"]}
                    ],
                    "freshness": "Current"
                }]
            }]
        })
    );
    let r = call_with(&app, "GET", "/apis", &[("accept", V2_ACCEPT), ("if-none-match", &etag)]).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    assert!(r.body.is_empty());
    assert_eq!(r.header("etag"), etag);
    let r = call_with(&app, "GET", "/apis", &[("accept", V2_ACCEPT), ("if-none-match", "\"stale\"")]).await;
    assert_eq!(r.status, StatusCode::OK);
}

#[tokio::test]
async fn aggregated_discovery_v2beta1_for_old_clients() {
    let app = mk_app();
    let r = get_accept(
        &app,
        "/apis",
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList",
    )
    .await;
    assert_eq!(
        r.header("content-type"),
        "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
    );
    assert_eq!(r.json()["apiVersion"], "apidiscovery.k8s.io/v2beta1");
    assert_eq!(r.json()["items"][0]["versions"][0]["resources"][0]["resource"], "widgets");
    let r = get_accept(&app, "/apis", "application/vnd.kubernetes.protobuf").await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
}

#[tokio::test]
async fn extra_group_versions_are_discovered_and_extra_routes_merge() {
    let extra = GroupVersionResources {
        group: "external.metrics.k8s.io".into(),
        version: "v1beta1".into(),
        resources: vec![k8s_wire::DiscoveryResource {
            name: "cafe_brews_per_minute".into(),
            singular_name: String::new(),
            namespaced: true,
            kind: "ExternalMetricValueList".into(),
            verbs: vec!["get".into()],
            short_names: vec![],
            categories: vec![],
        }],
    };
    let state = mk_state_with(mk_widgets(Behavior::Ok, &[]), true).with_extra_group_versions(vec![extra]);
    let app = router(state).merge(Router::new().route(
        "/apis/external.metrics.k8s.io/v1beta1/namespaces/{namespace}/{metric}",
        axum::routing::get(|| async { "external" }),
    ));
    let v = get(&app, "/apis").await.json();
    assert_eq!(v["groups"][1]["name"], "external.metrics.k8s.io");
    let v = get(&app, "/apis/external.metrics.k8s.io/v1beta1").await.json();
    assert_eq!(v["resources"][0]["singularName"], "");
    assert_eq!(v["resources"][0]["verbs"], json!(["get"]));
    let r = get(&app, "/apis/external.metrics.k8s.io/v1beta1/namespaces/shop/cafe_brews_per_minute").await;
    assert_eq!(r.text(), "external");
    // Our own resources still route through the generic dispatcher.
    assert_eq!(get(&app, &widgets_path("shop")).await.status, StatusCode::OK);
    let v = get_accept(&app, "/apis", V2_ACCEPT).await.json();
    assert_eq!(
        v["items"][1]["versions"][0]["resources"][0]["responseKind"],
        json!({"group": "external.metrics.k8s.io", "version": "v1beta1", "kind": "ExternalMetricValueList"})
    );
}

#[tokio::test]
async fn version_info() {
    let v = get(&mk_app(), "/version").await.json();
    assert_eq!(v["gitVersion"], format!("v{}", env!("CARGO_PKG_VERSION")));
    assert_eq!(v["major"], env!("CARGO_PKG_VERSION_MAJOR"));
    assert_eq!(v["minor"], env!("CARGO_PKG_VERSION_MINOR"));
    assert_eq!(
        v["gitVersion"],
        format!(
            "v{}.{}.{}",
            v["major"].as_str().unwrap(),
            v["minor"].as_str().unwrap(),
            env!("CARGO_PKG_VERSION_PATCH")
        )
    );
    assert_eq!(v["compiler"], "rustc");
    assert!(v["platform"].as_str().unwrap().starts_with("linux/") || cfg!(not(target_os = "linux")));
}

// ---- OpenAPI ----

#[tokio::test]
async fn openapi_v3_root_and_document() {
    let app = mk_app();
    let root = get(&app, "/openapi/v3").await;
    assert_eq!(root.status, StatusCode::OK);
    let root = root.json();
    let paths = root["paths"].as_object().unwrap();
    assert_eq!(paths.keys().collect::<Vec<_>>(), [&format!("apis/{G}/{V}")]);
    let url = paths[&format!("apis/{G}/{V}")]["serverRelativeURL"].as_str().unwrap().to_owned();
    assert!(url.starts_with(&format!("/openapi/v3/apis/{G}/{V}?hash=")));

    let r = get_accept(&app, &url, "application/json").await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("cache-control"), "public, immutable");
    assert!(!r.header("expires").is_empty());
    let hash = url.split("hash=").nth(1).unwrap();
    assert_eq!(r.header("etag"), format!("\"{hash}\""));
    let doc = r.json();
    assert_eq!(doc["openapi"], "3.0.0");

    // kubectl explain: the path with an object-valued GVK on `get` ...
    let gvk = json!({"group": G, "version": V, "kind": "Widget"});
    let p = &doc["paths"][&format!("/apis/{G}/{V}/namespaces/{{namespace}}/widgets/{{name}}")];
    assert_eq!(p["get"]["x-kubernetes-group-version-kind"], gvk);
    assert_eq!(p["get"]["x-kubernetes-action"], "get");
    assert_eq!(p["get"]["operationId"], "readStatsExampleComV1alpha1NamespacedWidget");
    let list = &doc["paths"][&format!("/apis/{G}/{V}/widgets")]["get"];
    assert_eq!(list["x-kubernetes-group-version-kind"], gvk);
    assert_eq!(list["x-kubernetes-action"], "list");
    assert_eq!(
        list["responses"]["200"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/com.example.stats.v1alpha1.WidgetList"
    );
    let cluster = &doc["paths"][&format!("/apis/{G}/{V}/gadgets/{{name}}")]["get"];
    assert_eq!(cluster["operationId"], "readStatsExampleComV1alpha1Gadget");
    // ... and a schema whose GVK list contains it, with documented fields.
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    let widget = &schemas["com.example.stats.v1alpha1.Widget"];
    assert_eq!(widget["x-kubernetes-group-version-kind"], json!([gvk]));
    assert_eq!(
        widget["properties"]["metadata"],
        json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META_SCHEMA}")}], "description": "Standard object metadata."})
    );
    assert!(widget["properties"]["apiVersion"]["description"].is_string());
    assert!(widget["properties"]["kind"]["description"].is_string());
    let list_schema = &schemas["com.example.stats.v1alpha1.WidgetList"];
    assert_eq!(
        list_schema["x-kubernetes-group-version-kind"],
        json!([{"group": G, "version": V, "kind": "WidgetList"}])
    );
    assert!(schemas[OBJECT_META_SCHEMA]["properties"]["labels"]["description"].is_string());
    assert!(schemas.contains_key("io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta"));
    assert!(schemas.contains_key("com.example.stats.v1alpha1.Part"));
    let state = mk_state_with(mk_widgets(Behavior::Ok, &[]), true);
    assert!(
        state.openapi().undocumented_properties().is_empty(),
        "{:?}",
        state.openapi().undocumented_properties()
    );
}

#[tokio::test]
async fn openapi_v3_never_redirects_and_revalidates() {
    let app = mk_app();
    let path = format!("/openapi/v3/apis/{G}/{V}");
    let plain = get(&app, &path).await;
    assert_eq!(plain.status, StatusCode::OK);
    assert_eq!(plain.header("cache-control"), "no-cache, private");
    let stale = get(&app, &format!("{path}?hash=0123")).await;
    assert_eq!(stale.status, StatusCode::OK);
    assert_eq!(stale.body, plain.body);
    assert_eq!(stale.header("cache-control"), "no-cache, private");
    let etag = plain.header("etag").to_owned();
    let r = call_with(&app, "GET", &path, &[("if-none-match", &etag)]).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
}

#[tokio::test]
async fn openapi_v2_document() {
    let app = mk_app();
    let r = get_accept(&app, "/openapi/v2", "application/json").await;
    assert_eq!(r.status, StatusCode::OK);
    assert!(!r.header("etag").is_empty());
    let doc = r.json();
    assert_eq!(doc["swagger"], "2.0");
    let defs = doc["definitions"].as_object().unwrap();
    let widget = &defs["com.example.stats.v1alpha1.Widget"];
    assert_eq!(
        widget["x-kubernetes-group-version-kind"],
        json!([{"group": G, "version": V, "kind": "Widget"}])
    );
    assert_eq!(
        widget["properties"]["metadata"],
        json!({"$ref": format!("#/definitions/{OBJECT_META_SCHEMA}"), "description": "Standard object metadata."})
    );
    assert_eq!(
        widget["properties"]["parts"]["items"]["$ref"],
        "#/definitions/com.example.stats.v1alpha1.Part"
    );
    let text = r.text();
    assert!(!text.contains("#/components/"), "v2 must only use #/definitions/ refs");
    let op = &doc["paths"][&format!("/apis/{G}/{V}/namespaces/{{namespace}}/widgets")]["get"];
    assert_eq!(op["x-kubernetes-action"], "list");
    assert_eq!(op["x-kubernetes-group-version-kind"], json!({"group": G, "version": V, "kind": "Widget"}));
    assert_eq!(
        op["responses"]["200"]["schema"]["$ref"],
        "#/definitions/com.example.stats.v1alpha1.WidgetList"
    );
    assert_eq!(op["parameters"][1]["name"], "labelSelector");
    assert_eq!(op["parameters"][1]["type"], "string");
    let etag = r.header("etag").to_owned();
    let r = call_with(&app, "GET", "/openapi/v2", &[("if-none-match", &etag)]).await;
    assert_eq!(r.status, StatusCode::NOT_MODIFIED);
    // The aggregator sends Accept: application/json; protobuf-only is refused with a Status.
    let r =
        get_accept(&app, "/openapi/v2", "application/com.github.proto-openapi.spec.v2@v1.0+protobuf").await;
    assert_eq!(r.status, StatusCode::NOT_ACCEPTABLE);
}

// ---- health and metrics ----

#[tokio::test]
async fn health_endpoints() {
    let app = mk_app();
    for path in ["/healthz", "/livez", "/readyz"] {
        let r = get(&app, path).await;
        assert_eq!((r.status, r.text().as_str()), (StatusCode::OK, "ok"), "{path}");
        assert_eq!(r.header("content-type"), "text/plain; charset=utf-8");
    }
    let r = get(&app, "/readyz?verbose").await;
    assert!(r.text().contains("[+]informer-sync ok"));

    let app = router(mk_state_with(mk_widgets(Behavior::Ok, &[]), false));
    assert_readyz_fails(&app, "[+]ping ok\n[-]informer-sync failed: reason withheld\n[+]shutdown ok\n").await;
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    assert_eq!(get(&app, "/livez").await.status, StatusCode::OK);
}

#[tokio::test]
async fn requests_are_counted_with_bounded_labels() {
    let app = mk_app();
    get(&app, &widgets_path("shop")).await;
    get(&app, &format!("{}/nope", widgets_path("shop"))).await;
    get(&app, &format!("/apis/{G}/{V}/random-{}", 42)).await;
    get(&app, "/openapi/v2").await;
    get(&app, "/some/unknown/path").await;
    let r = get(&app, "/metrics").await;
    assert_eq!(r.status, StatusCode::OK);
    let text = r.text();
    assert!(
        text.contains(r#"example_http_requests_total{resource="widgets",verb="list",code="200"} 1"#),
        "{text}"
    );
    assert!(
        text.contains(r#"example_http_requests_total{resource="widgets",verb="get",code="404"} 1"#),
        "{text}"
    );
    assert!(text.contains(r#"resource="/apis/{group}/{version}/{*rest}",verb="list",code="404""#), "{text}");
    assert!(text.contains(r#"resource="/openapi/v2",verb="get",code="200""#), "{text}");
    assert!(text.contains(r#"resource="other",verb="get",code="404""#), "{text}");
    assert!(!text.contains("random-42"), "{text}");
}

// ---- robustness ----

#[tokio::test]
async fn odd_requests_never_panic_or_500() {
    let app = mk_app();
    let uris = [
        "/apis/%",
        "/apis/%ff/%fe",
        "/apis/stats.example.com/v1alpha1/namespaces/%00/widgets",
        "/apis/stats.example.com/v1alpha1/namespaces/shop/widgets/%C3%A9",
        "/apis/stats.example.com/v1alpha1/namespaces/shop/widgets?labelSelector=%00",
        "/apis/stats.example.com/v1alpha1/namespaces/shop/widgets?fieldSelector=%5C",
        "/apis/stats.example.com/v1alpha1/namespaces/shop/widgets?labelSelector=a%20in%20(((",
        "/apis/stats.example.com/v1alpha1//widgets",
        "/apis/stats.example.com/v1alpha1/namespaces/shop/widgets//",
        "/openapi/v3/%2e%2e/%2e%2e",
        "//apis//",
    ];
    for uri in uris {
        for accept in ["", KUBECTL_TABLE, "*/*;q=x", ",,,;;;", "application/json;as=;g=;v="] {
            let r = call_with(&app, "GET", uri, &[("accept", accept)]).await;
            assert!(r.status.as_u16() < 500, "{uri} [{accept}]: {} {}", r.status, r.text());
        }
    }
}

// ---- overload, deadlines, panics, oversized requests ----

#[tokio::test]
async fn in_flight_limit_answers_429_and_exempts_health_and_discovery() {
    let slow = std::time::Duration::from_millis(400);
    let app = router(
        mk_state_with(mk_widgets(Behavior::Slow(slow), &[]), true)
            .with_limits(2, std::time::Duration::from_secs(10)),
    );
    let busy: Vec<_> = (0..2)
        .map(|_| {
            let app = app.clone();
            tokio::spawn(async move { get(&app, &widgets_path("shop")).await })
        })
        .collect();
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    let r = get(&app, &widgets_path("shop")).await;
    assert_retry_after(&r, 429, "TooManyRequests", "Too many requests, please try again later.");
    // Health, discovery and OpenAPI are exempt; a not-found path is not.
    for path in
        ["/healthz", "/livez", "/readyz", "/apis", &format!("/apis/{G}/{V}"), "/openapi/v2", "/version"]
    {
        assert_eq!(get(&app, path).await.status, StatusCode::OK, "{path}");
    }
    assert_eq!(get(&app, "/nope").await.status, StatusCode::TOO_MANY_REQUESTS);
    for handle in busy {
        assert_eq!(handle.await.unwrap().status, StatusCode::OK);
    }
    // The permits are back.
    assert_eq!(get(&app, &widgets_path("shop")).await.status, StatusCode::OK);
}

/// Only the exact discovery, OpenAPI and health paths of what is served skip the limit: a
/// unique path under `/apis` or `/openapi` (each a new review to authorize) counts, as does
/// another spelling of a served path.
#[tokio::test]
async fn unique_discovery_and_openapi_paths_count_against_the_in_flight_limit() {
    let extra = GroupVersionResources {
        group: "external.metrics.k8s.io".into(),
        version: "v1beta1".into(),
        resources: Vec::new(),
    };
    let state = mk_state_with(mk_widgets(Behavior::Slow(std::time::Duration::from_millis(400)), &[]), true)
        .with_extra_group_versions(vec![extra])
        .with_limits(1, std::time::Duration::from_secs(10));
    let app = router(state);
    let busy = tokio::spawn({
        let app = app.clone();
        async move { get(&app, &widgets_path("shop")).await }
    });
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    // A random name, as each request of a flood would have.
    let unique = format!(
        "x{:016x}",
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos()
    );
    for path in [
        format!("/apis/{unique}"),
        format!("/apis/{unique}/v1"),
        format!("/openapi/v3/apis/{unique}/v1"),
        format!("/openapi/v3/apis/{G}/{unique}"),
        format!("/openapi/{unique}"),
        format!("/apis/{G}/{V}/"),
        format!("//apis/{G}"),
        format!("/readyz/{unique}"),
    ] {
        let r = get(&app, &path).await;
        assert_retry_after(&r, 429, "TooManyRequests", "Too many requests, please try again later.");
    }
    for path in [
        "/healthz".to_owned(),
        "/healthz/ping".to_owned(),
        "/livez/ping".to_owned(),
        "/readyz/ping".to_owned(),
        "/readyz/informer-sync".to_owned(),
        "/readyz/shutdown".to_owned(),
        "/api".to_owned(),
        "/apis".to_owned(),
        format!("/apis/{G}"),
        format!("/apis/{G}/{V}"),
        "/apis/external.metrics.k8s.io".to_owned(),
        "/apis/external.metrics.k8s.io/v1beta1".to_owned(),
        "/openapi/v2".to_owned(),
        "/openapi/v3".to_owned(),
        format!("/openapi/v3/apis/{G}/{V}"),
        "/version".to_owned(),
        "/metrics".to_owned(),
    ] {
        assert_eq!(get(&app, &path).await.status, StatusCode::OK, "{path}");
    }
    assert_eq!(busy.await.unwrap().status, StatusCode::OK);
    assert_eq!(
        get(&app, &format!("/apis/{unique}")).await.status,
        StatusCode::NOT_FOUND,
        "counted, then served"
    );
}

/// Each readiness check alone, as kube serves it: `ok`, a 500 naming the failed check, a
/// 404 for a check that does not exist; `/healthz` and `/livez` have `ping`.
#[tokio::test]
async fn health_checks_alone() {
    let ready = mk_app();
    for path in ["/readyz/ping", "/readyz/informer-sync", "/readyz/shutdown", "/healthz/ping", "/livez/ping"]
    {
        let r = get(&ready, path).await;
        assert_eq!((r.status, r.text()), (StatusCode::OK, "ok".to_owned()), "{path}");
    }
    let not_ready = router(mk_state_with(mk_widgets(Behavior::Ok, &[]), false));
    let r = get(&not_ready, "/readyz/informer-sync").await;
    assert_eq!(
        (r.status, r.text()),
        (
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal server error: informer-sync failed: reason withheld\n".to_owned()
        )
    );
    assert_eq!(get(&not_ready, "/readyz/ping").await.status, StatusCode::OK);
    for path in ["/readyz/nope", "/healthz/informer-sync", "/livez/shutdown", "/readyz/ping/x"] {
        assert_status(
            &get(&ready, path).await,
            404,
            "NotFound",
            "the server could not find the requested resource",
            Some(json!({})),
        );
    }
}

#[tokio::test]
async fn requests_past_the_deadline_get_504_and_timeout_shortens_it() {
    let app = router(
        mk_state_with(mk_widgets(Behavior::Slow(std::time::Duration::from_secs(30)), &[]), true)
            .with_limits(10, std::time::Duration::from_millis(300)),
    );
    let start = std::time::Instant::now();
    let r = get(&app, &widgets_path("shop")).await;
    assert!(start.elapsed() < std::time::Duration::from_secs(2), "{:?}", start.elapsed());
    assert_status(
        &r,
        504,
        "Timeout",
        "Timeout: request did not complete within requested timeout - context deadline exceeded",
        Some(json!({})),
    );
    let app = router(
        mk_state_with(mk_widgets(Behavior::Slow(std::time::Duration::from_secs(30)), &[]), true)
            .with_limits(10, std::time::Duration::from_secs(60)),
    );
    let start = std::time::Instant::now();
    let r = get(&app, &format!("{}?timeout=200ms", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::GATEWAY_TIMEOUT);
    assert!(start.elapsed() < std::time::Duration::from_secs(2), "{:?}", start.elapsed());
    let r = get(&app, &format!("{}?timeout=soon", widgets_path("shop"))).await;
    assert_status(
        &r,
        400,
        "BadRequest",
        "invalid timeout specified in the request URL - time: invalid duration \"soon\"",
        None,
    );
    // The in-flight gauge went back to zero although the handlers were dropped.
    let metrics = get(&app, "/metrics").await.text();
    assert!(metrics.contains("example_http_requests_in_flight 1\n"), "{metrics}");
}

#[tokio::test]
async fn a_panic_outside_compute_is_a_500_and_the_router_keeps_serving() {
    let app = router(mk_state_with(mk_widgets(Behavior::PanicInColumns, &[]), true));
    for _ in 0..3 {
        let r = get_accept(&app, &widgets_path("shop"), KUBECTL_TABLE).await;
        assert_eq!(r.status, StatusCode::INTERNAL_SERVER_ERROR, "{}", r.text());
        assert_eq!(r.json()["reason"], "InternalError");
        assert!(!r.text().contains("panics"), "{}", r.text());
    }
    assert_eq!(get(&app, "/healthz").await.status, StatusCode::OK);
    let metrics = get(&app, "/metrics").await.text();
    assert!(metrics.contains(r#"resource="widgets",verb="list",code="500"} 3"#), "{metrics}");
}

#[tokio::test]
async fn oversized_uris_and_selectors_are_refused_before_anything_else() {
    let app = mk_app();
    let long = "a".repeat(guard::MAX_URI_BYTES);
    let r = get(&app, &format!("{}?x={long}", widgets_path("shop"))).await;
    assert_eq!(r.status, StatusCode::URI_TOO_LONG, "{}", r.text());
    assert_eq!(r.json()["code"], 414);
    let selector = format!("a in ({})", vec!["b"; 2100].join(","));
    let r =
        get(&app, &format!("{}?labelSelector={selector}", widgets_path("shop")).replace(' ', "%20")).await;
    let message = format!("labelSelector is {} bytes long; the maximum is 4096", selector.len());
    assert_status(&r, 400, "BadRequest", &message, None);
    let r = get(&app, &format!("{}?fieldSelector=metadata.name={}", widgets_path("shop"), "x".repeat(4100)))
        .await;
    assert_eq!(r.status, StatusCode::BAD_REQUEST);
    // Just under the limits: parsed normally.
    let selector = format!("app in ({})", vec!["web"; 900].join(","));
    let r =
        get(&app, &format!("{}?labelSelector={selector}", widgets_path("shop")).replace(' ', "%20")).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text());
}

#[tokio::test]
async fn readyz_fails_once_shutting_down() {
    let flag = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let app = router(mk_state_with(mk_widgets(Behavior::Ok, &[]), true).with_shutdown_flag(flag.clone()));
    assert_eq!(get(&app, "/readyz").await.text(), "ok");
    flag.store(true, std::sync::atomic::Ordering::SeqCst);
    assert_readyz_fails(&app, "[+]ping ok\n[+]informer-sync ok\n[-]shutdown failed: reason withheld\n").await;
    assert_eq!(get(&app, "/livez").await.status, StatusCode::OK);
    assert_eq!(get(&app, &widgets_path("shop")).await.status, StatusCode::OK, "still serving");
}

/// Answers the listing in `current` (the same `Arc` until replaced), as a cached kind does
/// between two refreshes.
struct Refreshed {
    inner: Arc<FakeKind>,
    current: std::sync::Mutex<Arc<Listing>>,
}

impl ServedKind for Refreshed {
    fn info(&self) -> &crate::kind::KindInfo {
        self.inner.info()
    }
    fn columns(&self) -> &[crate::kind::Column] {
        self.inner.columns()
    }
    fn schemas(&self) -> Vec<(String, Value)> {
        self.inner.schemas()
    }
    fn list<'a>(
        &'a self,
        _: Option<&'a str>,
    ) -> futures::future::BoxFuture<'a, Result<Arc<Listing>, crate::kind::ComputeError>> {
        let listing = self.current.lock().unwrap().clone();
        Box::pin(async move { Ok(listing) })
    }
}

#[tokio::test]
async fn selected_lists_are_rendered_once_per_listing() {
    let widgets = mk_widgets(Behavior::Ok, &[]);
    let listing = |items: Vec<Item>, rv: &str| {
        Arc::new(Listing { items: items.into(), resource_version: rv.to_owned(), ..Listing::default() })
    };
    let first = vec![
        mk_item(&WIDGET, "shop", "db-0", &[("app", "db")], "3"),
        mk_item(&WIDGET, "shop", "web-1", &[("app", "web")], "2"),
    ];
    let kind = Arc::new(Refreshed { inner: widgets, current: std::sync::Mutex::new(listing(first, "1")) });
    let kinds: crate::kind::Kinds = vec![kind.clone(), mk_gadgets()];
    let app = router(ApiState::new(kinds, Arc::new(|| true), Metrics::new("example")));
    let web = format!("{}?labelSelector=app%3Dweb", widgets_path("shop"));
    let sizes = |v: &Value| -> Vec<String> {
        v["items"].as_array().unwrap().iter().map(|i| i["size"].as_str().unwrap().to_owned()).collect()
    };

    let once = get(&app, &web).await;
    assert_eq!(
        (names(&once.json()), sizes(&once.json())),
        (vec!["shop/web-1".to_owned()], vec!["2".to_owned()])
    );
    assert_eq!(get(&app, &web).await.text(), once.text(), "the same listing gives the same answer");
    // Other selectors over the same listing are their own answers.
    let db = get(&app, &format!("{}?labelSelector=app%3Ddb", widgets_path("shop"))).await;
    assert_eq!(names(&db.json()), ["shop/db-0"]);
    let by_field = get(&app, &format!("{}?fieldSelector=metadata.name%3Dweb-1", widgets_path("shop"))).await;
    assert_eq!(names(&by_field.json()), ["shop/web-1"]);

    // A refreshed listing (new values, a new pod) is filtered again, never answered from the
    // old one's rendering.
    let second = vec![
        mk_item(&WIDGET, "shop", "web-1", &[("app", "web")], "7"),
        mk_item(&WIDGET, "shop", "web-3", &[("app", "web")], "8"),
    ];
    *kind.current.lock().unwrap() = listing(second, "2");
    let v = get(&app, &web).await.json();
    assert_eq!(
        (names(&v), sizes(&v), v["metadata"]["resourceVersion"].clone()),
        (
            vec!["shop/web-1".to_owned(), "shop/web-3".to_owned()],
            vec!["7".to_owned(), "8".to_owned()],
            json!("2")
        )
    );
}
