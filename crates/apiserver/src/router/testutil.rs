//! Fixtures of the router's unit tests, and of a server's own router tests (the cargo feature
//! `testing`, for dev-dependencies): fake kinds (`widgets`, namespaced, and `gadgets`,
//! cluster-scoped; [`FakeKind`] for kinds of any group-version), and a request helper that
//! collects the whole reply.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use futures::future::BoxFuture;
use http::{HeaderMap, Request, StatusCode};
use http_body_util::BodyExt;
use jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};
use tower::ServiceExt;

use crate::kind::{
    Cell, Column, ComputeError, GroupVersion, Item, KindInfo, Listing, Meta, OBJECT_META_SCHEMA, ServedKind,
};

/// The group-version of the fake kinds.
pub const EXAMPLE: GroupVersion = GroupVersion {
    group: "stats.example.com",
    version: "v1alpha1",
    api_version: "stats.example.com/v1alpha1",
};

/// Its `apiVersion`.
pub const API_VERSION: &str = "stats.example.com/v1alpha1";

// ---- fake kinds ----

pub static WIDGET: LazyLock<KindInfo> = LazyLock::new(|| {
    KindInfo::new(EXAMPLE, "Widget", true, "Widget is a test kind.")
        .with_short_names(&["wd"])
        .with_categories(&["example"])
});

pub static GADGET: LazyLock<KindInfo> =
    LazyLock::new(|| KindInfo::new(EXAMPLE, "Gadget", false, "Gadget is a cluster-scoped test kind."));

/// The columns of a namespaced fake kind; a cluster-scoped one has none (the default table
/// convertor).
const WIDGET_COLUMNS: &[Column] = &[
    Column::object_name("Name of the widget."),
    Column::quantity("Size", "Size."),
    Column::text("Node", "Node.").wide(),
    Column::text("Age", "Time since creation."),
];

#[derive(Clone, Copy, PartialEq)]
pub enum Behavior {
    Ok,
    NotReady,
    Internal,
    Panic,
    /// Computes fine, then takes this long.
    Slow(Duration),
    /// Computes fine; rendering panics (outside `compute`'s own catch).
    PanicInColumns,
}

/// A kind serving fixed items (filtered by namespace), or failing as `behavior` says; records
/// the namespace of every list call.
pub struct FakeKind {
    info: &'static KindInfo,
    items: Vec<Item>,
    behavior: Behavior,
    warnings: Vec<String>,
    pub calls: Mutex<Vec<Option<String>>>,
}

impl FakeKind {
    pub fn new(
        info: &'static KindInfo,
        items: Vec<Item>,
        behavior: Behavior,
        warnings: &[&str],
    ) -> Arc<Self> {
        Arc::new(FakeKind {
            info,
            items,
            behavior,
            warnings: warnings.iter().map(|w| (*w).to_owned()).collect(),
            calls: Mutex::new(Vec::new()),
        })
    }
}

impl ServedKind for FakeKind {
    fn info(&self) -> &KindInfo {
        self.info
    }

    fn columns(&self) -> &[Column] {
        if self.behavior == Behavior::PanicInColumns {
            panic!("fake kind panics while rendering");
        }
        if self.info.namespaced { WIDGET_COLUMNS } else { &[] }
    }

    fn schemas(&self) -> Vec<(String, Value)> {
        let name = crate::kind::schema_name(self.info.gv, &self.info.kind);
        vec![
            (
                name,
                json!({
                    "type": "object",
                    "description": self.info.description,
                    "properties": {
                        "metadata": {"$ref": format!("#/components/schemas/{OBJECT_META_SCHEMA}"), "description": "Standard object metadata."},
                        "size": {"type": "string", "description": "Size of the widget."},
                        "parts": {"type": "array", "description": "Parts.", "items": {"$ref": format!("#/components/schemas/{}", crate::kind::schema_name(self.info.gv, "Part"))}},
                    },
                }),
            ),
            (
                crate::kind::schema_name(self.info.gv, "Part"),
                json!({"type": "object", "description": "A part.", "properties": {"name": {"type": "string", "description": "Part name."}}}),
            ),
        ]
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(namespace.map(str::to_owned));
            match self.behavior {
                Behavior::Ok | Behavior::PanicInColumns => {}
                Behavior::Slow(delay) => tokio::time::sleep(delay).await,
                Behavior::NotReady => {
                    return Err(ComputeError::NotReady("the pod inventory is not synced yet".into()));
                }
                Behavior::Internal => return Err(ComputeError::Upstream("secret detail".into())),
                Behavior::Panic => panic!("fake kind panics"),
            }
            Ok(Arc::new(Listing {
                items: self
                    .items
                    .iter()
                    .filter(|i| namespace.is_none_or(|ns| *i.meta.namespace == *ns))
                    .cloned()
                    .collect(),
                warnings: self.warnings.clone(),
                resource_version: "17".to_owned(),
                ..Listing::default()
            }))
        })
    }
}

/// The creation time of every fake item.
pub const CREATED: &str = "2026-07-01T10:00:00Z";

/// An item of `info` (`ns` empty for a cluster-scoped kind), with cells for [`WIDGET_COLUMNS`].
pub fn mk_item(info: &KindInfo, ns: &str, name: &str, labels: &[(&str, &str)], size: &str) -> Item {
    let labels: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let mut metadata =
        json!({"name": name, "uid": format!("uid-{name}"), "creationTimestamp": CREATED, "labels": labels});
    if !ns.is_empty() {
        metadata["namespace"] = json!(ns);
    }
    let object =
        json!({"kind": info.kind, "apiVersion": info.gv.api_version, "metadata": metadata, "size": size});
    let created: Timestamp = CREATED.parse().unwrap();
    let meta = Meta {
        name: name.into(),
        namespace: ns.into(),
        uid: Some(format!("uid-{name}").into()),
        creation_timestamp: Some(created),
        labels: Arc::new(labels),
    };
    let cells = [
        Cell::Text(name.into()),
        Cell::Text(size.into()),
        Cell::None,
        Cell::Age(Timestamp::now() - SignedDuration::from_hours(3)),
    ];
    Item::new(info, meta, &object, &cells)
}

/// Widgets in the namespaces `other` and `shop`.
pub fn mk_widgets(behavior: Behavior, warnings: &[&str]) -> Arc<FakeKind> {
    let items = vec![
        mk_item(&WIDGET, "other", "web-1", &[("app", "web")], "1"),
        mk_item(&WIDGET, "shop", "db-0", &[("app", "db")], "3"),
        mk_item(&WIDGET, "shop", "web-1", &[("app", "web"), ("tier", "front")], "2"),
        mk_item(&WIDGET, "shop", "web-2", &[("app", "web")], "4"),
    ];
    FakeKind::new(&WIDGET, items, behavior, warnings)
}

/// One gadget, `g1`.
pub fn mk_gadgets() -> Arc<FakeKind> {
    FakeKind::new(&GADGET, vec![mk_item(&GADGET, "", "g1", &[], "9")], Behavior::Ok, &[])
}

// ---- requests ----

pub struct Reply {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Reply {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or_default()
    }
}

/// Sends `method uri` with `headers` through `app`; the reply with its whole body.
pub async fn call_with(app: &Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> Reply {
    let mut req = Request::builder().method(method).uri(uri);
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    let resp = app.clone().oneshot(req.body(Body::empty()).unwrap()).await.unwrap();
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.into_body().collect().await.unwrap().to_bytes().to_vec();
    Reply { status, headers, body }
}

/// The `Accept` kubectl sends for `kubectl get`: a Table, or JSON.
pub const KUBECTL_TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
/// The `Accept` of aggregated discovery (v2, then v2beta1, then JSON).
pub const V2_ACCEPT: &str = "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json";

/// `GET uri` through `app`.
pub async fn get(app: &Router, uri: &str) -> Reply {
    call_with(app, "GET", uri, &[]).await
}

/// `GET uri` through `app` with `Accept: accept`.
pub async fn get_accept(app: &Router, uri: &str, accept: &str) -> Reply {
    call_with(app, "GET", uri, &[("accept", accept)]).await
}

/// The `metav1.Status` body of a failure.
pub fn status_body(code: u16, reason: &str, message: &str, details: Option<Value>) -> Value {
    let mut v = json!({
        "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
        "message": message, "reason": reason, "code": code,
    });
    if let Some(d) = details {
        v["details"] = d;
    }
    v
}
