//! Fixtures shared by the metric APIs' router tests (`custom_tests`, `external_tests`,
//! `fuzz_tests`) and the kinds' (`kinds::served_tests`): the
//! fake kinds (`widgets`, namespaced, and `gadgets`, cluster-scoped), a recording fake
//! Prometheus, the query-file check the server runs, and a request helper that collects the
//! whole reply.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicUsize, Ordering};
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

use crate::config::{Check, QueryFile};
use crate::kinds::{API_VERSION, Cell, Column, ComputeError, KindInfo, Listing, Meta, ServedKind};
use crate::sources::prometheus::Template;
use crate::sources::workloads::{PodSelection, Selection, Workload, WorkloadError, WorkloadSource};
use crate::sources::{PromError, PromSample, PromSource};
use apiserver::kind::{Item, OBJECT_META_SCHEMA};

// ---- fake kinds ----

pub(crate) static WIDGET: LazyLock<KindInfo> = LazyLock::new(|| {
    KindInfo::new(crate::kinds::STATS, "Widget", true, "Widget is a test kind.")
        .with_short_names(&["wd"])
        .with_categories(&["percolator"])
});

pub(crate) static GADGET: LazyLock<KindInfo> = LazyLock::new(|| {
    KindInfo::new(crate::kinds::STATS, "Gadget", false, "Gadget is a cluster-scoped test kind.")
});

/// The columns of a namespaced fake kind; a cluster-scoped one has none (the default table
/// convertor).
const WIDGET_COLUMNS: &[Column] = &[
    Column::object_name("Name of the widget."),
    Column::quantity("Size", "Size."),
    Column::text("Node", "Node.").wide(),
    Column::text("Age", "Time since creation."),
];

#[derive(Clone, Copy, PartialEq)]
pub(crate) enum Behavior {
    Ok,
    /// Computes fine; rendering panics (outside the computation's own catch).
    PanicInColumns,
}

/// A kind serving fixed items (filtered by namespace), or failing as `behavior` says; records
/// the namespace of every list call.
pub(crate) struct FakeKind {
    info: &'static KindInfo,
    items: Vec<Item>,
    behavior: Behavior,
    warnings: Vec<String>,
    pub(crate) calls: Mutex<Vec<Option<String>>>,
}

impl FakeKind {
    pub(crate) fn new(
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
        let name = format!("cafe.une-tasse-de.stats.v1alpha1.{}", self.info.kind);
        vec![
            (
                name,
                json!({
                    "type": "object",
                    "description": self.info.description,
                    "properties": {
                        "metadata": {"$ref": format!("#/components/schemas/{OBJECT_META_SCHEMA}"), "description": "Standard object metadata."},
                        "size": {"type": "string", "description": "Size of the widget."},
                        "parts": {"type": "array", "description": "Parts.", "items": {"$ref": "#/components/schemas/cafe.une-tasse-de.stats.v1alpha1.Part"}},
                    },
                }),
            ),
            (
                "cafe.une-tasse-de.stats.v1alpha1.Part".to_owned(),
                json!({"type": "object", "description": "A part.", "properties": {"name": {"type": "string", "description": "Part name."}}}),
            ),
        ]
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(async move {
            self.calls.lock().unwrap().push(namespace.map(str::to_owned));
            match self.behavior {
                Behavior::Ok | Behavior::PanicInColumns => {}
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
pub(crate) const CREATED: &str = "2026-07-01T10:00:00Z";

/// An item of `info` (`ns` empty for a cluster-scoped kind), with cells for [`WIDGET_COLUMNS`].
pub(crate) fn mk_item(info: &KindInfo, ns: &str, name: &str, labels: &[(&str, &str)], size: &str) -> Item {
    let labels: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    let mut metadata =
        json!({"name": name, "uid": format!("uid-{name}"), "creationTimestamp": CREATED, "labels": labels});
    if !ns.is_empty() {
        metadata["namespace"] = json!(ns);
    }
    let object = json!({"kind": info.kind, "apiVersion": API_VERSION, "metadata": metadata, "size": size});
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

// ---- fake Prometheus ----

/// A fake Prometheus: records every query, answers with `reply` after `delay`.
pub(crate) struct MkProm {
    pub(crate) queries: Mutex<Vec<String>>,
    pub(crate) calls: AtomicUsize,
    reply: Mutex<Result<Vec<PromSample>, PromError>>,
    delay: Duration,
    /// What the series API lists, for every selector.
    pub(crate) series: Mutex<Vec<std::collections::BTreeMap<String, String>>>,
}

impl PromSource for MkProm {
    fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            self.queries.lock().unwrap().push(promql);
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            self.reply.lock().unwrap().clone()
        })
    }

    fn series(
        &self,
        selector: String,
        _start: jiff::Timestamp,
        _end: jiff::Timestamp,
    ) -> BoxFuture<'_, Result<Vec<std::collections::BTreeMap<String, String>>, PromError>> {
        Box::pin(async move {
            self.queries.lock().unwrap().push(format!("series {selector}"));
            Ok(self.series.lock().unwrap().clone())
        })
    }
}

impl MkProm {
    pub(crate) fn last_query(&self) -> String {
        self.queries.lock().unwrap().last().cloned().unwrap_or_default()
    }

    pub(crate) fn set_reply(&self, reply: Result<Vec<PromSample>, PromError>) {
        *self.reply.lock().unwrap() = reply;
    }
}

pub(crate) fn mk_prom(reply: Result<Vec<PromSample>, PromError>, delay: Duration) -> Arc<MkProm> {
    Arc::new(MkProm {
        queries: Mutex::new(Vec::new()),
        calls: AtomicUsize::new(0),
        reply: Mutex::new(reply),
        delay,
        series: Mutex::new(Vec::new()),
    })
}

/// The timestamp of every [`mk_sample`].
const SAMPLE_TIME: &str = "2026-07-01T10:00:00.250Z";

pub(crate) fn mk_sample(labels: &[(&str, &str)], value: f64) -> PromSample {
    PromSample {
        labels: labels.iter().copied().collect(),
        value,
        timestamp: SAMPLE_TIME.parse::<Timestamp>().unwrap(),
    }
}

// ---- workload objects ----

/// Workload objects by (resource, namespace, name), counting reads.
#[derive(Default)]
pub(crate) struct FakeWorkloads {
    pub(crate) objects: HashMap<(Workload, String, String), PodSelection>,
    pub(crate) reads: AtomicUsize,
    pub(crate) down: Mutex<bool>,
}

impl WorkloadSource for FakeWorkloads {
    /// The object, or `None`; every read counted; `down` fails them all.
    fn selection<'a>(&'a self, workload: Workload, namespace: &'a str, name: &'a str) -> Selection<'a> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        let found = self.objects.get(&(workload, namespace.to_owned(), name.to_owned())).cloned();
        let answer = if *self.down.lock().unwrap() {
            Err(WorkloadError::Unavailable {
                resource: workload.resource(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: "connection refused".to_owned(),
            })
        } else {
            Ok(found.map(Arc::new))
        };
        Box::pin(std::future::ready(answer))
    }
}

// ---- configuration ----

/// The check the server runs on the query file (`server::config_check`, which `metrics` may
/// not import).
pub(crate) fn mk_check() -> Check<Template> {
    Arc::new(|file: &mut QueryFile<Template>| {
        crate::kinds::registry::check_queries(file)?;
        crate::metrics::external::check_metrics(file)?;
        crate::metrics::custom::check_metrics(file)
    })
}

/// The default configuration, checked.
pub(crate) fn mk_defaults() -> QueryFile<Template> {
    QueryFile::from_yaml("", "defaults", &mk_check()).unwrap()
}

// ---- requests ----

pub(crate) struct Reply {
    pub(crate) status: StatusCode,
    pub(crate) headers: HeaderMap,
    pub(crate) body: Vec<u8>,
}

impl Reply {
    pub(crate) fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub(crate) fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    pub(crate) fn header(&self, name: &str) -> &str {
        self.headers.get(name).map(|v| v.to_str().unwrap()).unwrap_or_default()
    }
}

/// Sends `method uri` with `headers` through `app`; the reply with its whole body.
pub(crate) async fn call_with(app: &Router, method: &str, uri: &str, headers: &[(&str, &str)]) -> Reply {
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
