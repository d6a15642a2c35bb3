//! Fixtures shared by the metric APIs' router tests (`custom_tests`, `external_tests`,
//! `fuzz_tests`) and the kinds' (`kinds::served_tests`): the fake kinds of `apiserver::testing`
//! in percolator's group (`widgets`, namespaced, and `gadgets`, cluster-scoped), a recording
//! fake Prometheus, the query-file check the server runs, and its request helper.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};
use std::time::Duration;

use futures::future::BoxFuture;
use jiff::Timestamp;

use crate::config::{Check, QueryFile};
use crate::kinds::KindInfo;
use crate::sources::prometheus::Template;
use crate::sources::workloads::{PodSelection, Selection, Workload, WorkloadError, WorkloadSource};
use crate::sources::{PromError, PromSample, PromSource};

// ---- fake kinds ----

pub(crate) static WIDGET: LazyLock<KindInfo> = LazyLock::new(|| {
    KindInfo::new(crate::kinds::STATS, "Widget", true, "Widget is a test kind.")
        .with_short_names(&["wd"])
        .with_categories(&["percolator"])
});

pub(crate) static GADGET: LazyLock<KindInfo> = LazyLock::new(|| {
    KindInfo::new(crate::kinds::STATS, "Gadget", false, "Gadget is a cluster-scoped test kind.")
});

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

pub(crate) use apiserver::testing::{Behavior, FakeKind, Reply, call_with, mk_item};
