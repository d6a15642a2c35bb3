//! The kinds of the registry served through the router (`apiserver::router`), over fake
//! sources: declared kinds follow reloads of the query file in discovery, OpenAPI, Tables and
//! paths, and the exempt paths the router was built with still cover what discovery lists.

use std::sync::Arc;

use apiserver::serve::guard;
use apiserver::{ApiState, Metrics, router};
use axum::Router;
use http::StatusCode;
use serde_json::{Value, json};

use apiserver::testing::{KUBECTL_TABLE, V2_ACCEPT, get, get_accept, status_body};

const G: &str = "stats.une-tasse-de.cafe";
const V: &str = "v1alpha1";

// ---- declared kinds follow the configuration ----

/// A router over the built-in and declared kinds of the file `dir/config.yaml` (`yaml`), with
/// fake sources whose Prometheus answers `x` with one pod's rate.
fn mk_live_app(
    dir: &std::path::Path,
    yaml: &str,
) -> (Router, Arc<crate::config::LiveConfig<crate::sources::prometheus::Template>>) {
    let (state, config) = mk_live_state(dir, yaml);
    (router(state), config)
}

/// The state [`mk_live_app`] serves.
fn mk_live_state(
    dir: &std::path::Path,
    yaml: &str,
) -> (ApiState, Arc<crate::config::LiveConfig<crate::sources::prometheus::Template>>) {
    use crate::kinds::testkit::{AT, FakeInventory, FakeKubelet, FakeProm, mk_sample};
    std::fs::create_dir_all(dir).unwrap();
    std::fs::write(dir.join("config.yaml"), yaml).unwrap();
    let check: crate::config::Check<crate::sources::prometheus::Template> =
        Arc::new(crate::kinds::registry::check_kinds);
    let config = crate::config::LiveConfig::load(Some(&dir.join("config.yaml")), None, check).unwrap();
    let sample = mk_sample(&[("namespace", "shop"), ("pod", "web-1")], 2.5, AT);
    let sources = crate::kinds::Sources {
        inventory: FakeInventory::with(Vec::new()),
        usage: Arc::new(crate::sources::resources::KubeletUsage::new(Arc::new(FakeKubelet::default()))),
        prometheus: Arc::new(FakeProm::default().answer("x{", vec![sample])),
        config: config.clone(),
    };
    let cache = apiserver::CacheSettings::uncounted(std::time::Duration::from_secs(60));
    let kinds = crate::kinds::registry::KindRegistry::new(&sources, &cache);
    let state = ApiState::new(kinds, Arc::new(|| true), Metrics::new(crate::METRICS_NAMESPACE));
    (state.with_server_info(crate::kinds::server_info()), config)
}

/// Every `/apis/<g>` and `/apis/<g>/<v>` the legacy `/apis` document lists.
async fn mk_discovered_paths(app: &Router) -> Vec<String> {
    let list = get(app, "/apis").await.json();
    let mut paths = Vec::new();
    for group in list["groups"].as_array().unwrap() {
        paths.push(format!("/apis/{}", group["name"].as_str().unwrap()));
        for version in group["versions"].as_array().unwrap() {
            paths.push(format!("/apis/{}", version["groupVersion"].as_str().unwrap()));
        }
    }
    paths
}

/// A reload that declares a kind changes the kinds, never the group-versions served: the
/// exempt paths set when the router was built still cover everything discovery lists.
#[tokio::test]
async fn the_exempt_paths_cover_what_discovery_lists_across_reloads() {
    let dir = std::env::temp_dir().join(format!("percolator-api-exempt-{}", std::process::id()));
    let (state, config) = mk_live_state(&dir, "window: 2m\n");
    let exempt = state.exempt_paths();
    let app = router(state.clone());
    let before = mk_discovered_paths(&app).await;
    assert_eq!(before, [format!("/apis/{G}"), format!("/apis/{G}/{V}")]);
    std::fs::write(dir.join("config.yaml"), TRAFFIC).unwrap();
    assert!(config.reload().unwrap());
    assert!(get(&app, &format!("/apis/{G}/{V}")).await.text().contains("apptraffics"), "reloaded");
    assert_eq!(mk_discovered_paths(&app).await, before);
    assert_eq!(state.exempt_paths(), exempt);
    for path in &before {
        assert!(guard::is_exempt(&exempt, &http::Method::GET, path), "{path}");
    }
    assert!(guard::is_exempt(&exempt, &http::Method::GET, &format!("/openapi/v3/apis/{G}/{V}")));
    let _ = std::fs::remove_dir_all(&dir);
}

const TRAFFIC: &str = "kinds:
- kind: AppTraffic
  shortNames: [atr]
  nameLabel: pod
  fields:
  - name: requestsPerSecond
    query: sum by (namespace, pod) (rate(x{SCOPE}[WINDOW]))
    column: REQ/S
    description: Requests per second over the window.
";

#[tokio::test]
async fn declared_kinds_are_served_and_follow_reloads() {
    let dir = std::env::temp_dir().join(format!("percolator-api-declared-{}", std::process::id()));
    let (app, config) = mk_live_app(&dir, TRAFFIC);
    let gv = format!("/apis/{G}/{V}");

    let r = get(&app, &gv).await;
    let resources = r.json()["resources"].clone();
    let traffic = resources.as_array().unwrap().iter().find(|r| r["name"] == "apptraffics").unwrap();
    assert_eq!(
        traffic,
        &json!({"name": "apptraffics", "singularName": "apptraffic", "namespaced": true, "kind": "AppTraffic",
                "verbs": ["get", "list"], "shortNames": ["atr"], "categories": ["percolator"]})
    );
    let etag = get_accept(&app, "/apis", V2_ACCEPT).await.header("etag").to_owned();
    let r = get_accept(&app, &format!("{gv}/namespaces/shop/apptraffics"), KUBECTL_TABLE).await;
    assert_eq!(r.status, StatusCode::OK);
    let table = r.json();
    let names: Vec<&Value> =
        table["columnDefinitions"].as_array().unwrap().iter().map(|c| &c["name"]).collect();
    assert_eq!(names, ["Name", "REQ/S"]);
    assert_eq!(table["rows"][0]["cells"], json!(["web-1", "2.5"]));
    let v3 = get(&app, &format!("/openapi/v3/apis/{G}/{V}")).await.json();
    let schema = &v3["components"]["schemas"]["cafe.une-tasse-de.stats.v1alpha1.AppTraffic"];
    assert_eq!(
        schema["properties"]["requestsPerSecond"]["description"],
        "Requests per second over the window."
    );

    // Removed by a reload: 404, gone from discovery and OpenAPI, a new ETag.
    std::fs::write(dir.join("config.yaml"), "window: 2m\n").unwrap();
    assert!(config.reload().unwrap());
    let r = get(&app, &format!("{gv}/namespaces/shop/apptraffics")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND);
    assert_eq!(
        r.json(),
        status_body(404, "NotFound", "the server could not find the requested resource", Some(json!({})))
    );
    assert!(!get(&app, &gv).await.text().contains("apptraffics"));
    assert!(!get(&app, &format!("/openapi/v3/apis/{G}/{V}")).await.text().contains("AppTraffic"));
    assert!(!get(&app, "/openapi/v2").await.text().contains("AppTraffic"));
    assert_ne!(get_accept(&app, "/apis", V2_ACCEPT).await.header("etag"), etag);

    // Added back with another column.
    std::fs::write(dir.join("config.yaml"), TRAFFIC.replace("REQ/S", "RPS")).unwrap();
    assert!(config.reload().unwrap());
    let table = get_accept(&app, &format!("{gv}/namespaces/shop/apptraffics"), KUBECTL_TABLE).await.json();
    assert_eq!(table["columnDefinitions"][1]["name"], "RPS");
    assert_eq!(get_accept(&app, "/apis", V2_ACCEPT).await.header("etag"), etag, "same kinds, same documents");
    let _ = std::fs::remove_dir_all(&dir);
}
