//! What every kind computes from ([`Sources`]: the inventory, the resource usage, Prometheus and the
//! configuration in force) and the steps the kinds share: the start of a computation, the
//! CPU and memory of a set of pods (and its sum over the pods an object joins), a templated
//! PromQL query scoped to a namespace, and the indexing of query results by object.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use crate::config::{LiveConfig, Snapshot};
use crate::sources::prometheus::{self, Matcher, Template};
use crate::sources::{
    ContainerUsage, Containers, Inventory, PodInfo, PodKey, PromError, PromSample, PromSource, UsageSource,
};

use super::ComputeError;

/// Why one field's query gave no result. Kinds turn it into a warning and omit the field.
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueryError {
    /// The template could not be rendered for this request (checked at load, so only a
    /// window Prometheus cannot express gets here).
    #[error("{field} query: {source}")]
    Template {
        /// The field whose query it is.
        field: String,
        /// What is wrong.
        source: prometheus::Error,
    },
    /// Prometheus failed or is unreachable.
    #[error(transparent)]
    Prometheus(#[from] PromError),
}

/// The upstreams every kind computes from, with the steps kinds share.
#[derive(Clone)]
pub struct Sources {
    /// Pods and nodes.
    pub inventory: Arc<dyn Inventory>,
    /// CPU and memory of pods and nodes (kubelets or Prometheus, `--resource-source`).
    pub usage: Arc<dyn UsageSource>,
    /// PromQL.
    pub prometheus: Arc<dyn PromSource>,
    /// The query configuration in force (reloadable): kinds take one snapshot per computation.
    pub config: Arc<LiveConfig<Template>>,
}

impl std::fmt::Debug for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sources").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The start of one computation: one consistent view of the inventory and the configuration.
#[derive(Debug)]
pub struct Computation {
    /// The running pods of the namespace (or of all namespaces).
    pub pods: Vec<Arc<PodInfo>>,
    /// The inventory's resource version, the listing's `metadata.resourceVersion`.
    pub resource_version: String,
    /// The configuration in force, for every query of this computation.
    pub config: Arc<Snapshot<Template>>,
}

impl Sources {
    /// Starts computing `namespace` (all namespaces when `None`): [`ComputeError::NotReady`]
    /// until the inventory has synced.
    pub fn begin(&self, namespace: Option<&str>) -> Result<Computation, ComputeError> {
        if !self.inventory.is_synced() {
            return Err(super::not_synced());
        }
        Ok(Computation {
            resource_version: self.inventory.resource_version(),
            pods: self.inventory.running_pods(namespace),
            config: self.config.current(),
        })
    }

    /// Container usage of `pods` from the resource source in force (each source caches and
    /// shares fetches); what failed becomes one warning.
    pub async fn pod_usage(&self, pods: &[Arc<PodInfo>]) -> (HashMap<PodKey, Containers>, Option<String>) {
        let usage = self.usage.pod_usage(pods).await;
        (usage.pods, usage.warning)
    }

    /// Renders `template` (compiled when the configuration was read) for `namespace` (all
    /// namespaces when `None`) and runs it. The namespace has been validated as a DNS-1123
    /// label by the API layer and is escaped here.
    pub async fn query(
        &self,
        field: &str,
        template: &Template,
        namespace: Option<&str>,
        window: Duration,
    ) -> Result<Vec<PromSample>, QueryError> {
        let template_error = |source| QueryError::Template { field: field.to_owned(), source };
        let scope: Vec<Matcher> = match namespace {
            Some(ns) => vec![Matcher::eq("namespace", ns).map_err(template_error)?],
            None => Vec::new(),
        };
        let promql = template.render(&scope, window).map_err(template_error)?;
        Ok(self.prometheus.query(promql).await?)
    }
}

/// CPU is published to the micro-core: two cumulative samples in seconds carry no more
/// precision.
pub(crate) const CPU_STEP: f64 = 1e-6;

/// `cores` rounded to [`CPU_STEP`].
pub(crate) fn round_cpu(cores: f64) -> f64 {
    round_to(cores, CPU_STEP)
}

/// Rates are published to the milli-unit (0.001/s): finer digits are floating-point noise of
/// `rate()`, and they make Quantities unreadable (`15840230907n`).
pub(crate) const RATE_STEP: f64 = 1e-3;
/// Ratios to the micro-unit, so small error ratios keep three significant digits.
pub(crate) const RATIO_STEP: f64 = 1e-6;

/// `value` rounded to a multiple of `step`.
pub(crate) fn round_to(value: f64, step: f64) -> f64 {
    (value / step).round() * step
}

/// The kubelet usage of the pods an object joins (a cafe's serving pods), summed.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(crate) struct GroupUsage {
    /// CPU in cores, rounded by [`round_cpu`]: only when every pod has a CPU rate for every
    /// container.
    pub cpu: Option<f64>,
    /// Memory working set in bytes: only when every pod reports it for every container.
    pub memory: Option<f64>,
    /// Time of the newest kubelet sample of the pods.
    pub newest: Option<Timestamp>,
}

impl GroupUsage {
    /// The usage of `pods` in `usage` (from [`Sources::pod_usage`]); no pods, no usage.
    pub(crate) fn of(pods: &[&PodInfo], usage: &HashMap<PodKey, Containers>) -> Self {
        let containers: Vec<Option<&[ContainerUsage]>> = pods
            .iter()
            .map(|p| {
                usage.get(&PodKey { namespace: p.namespace.clone(), name: p.name.clone() }).map(|c| &**c)
            })
            .collect();
        // A pod without usage (its node down, or not scraped yet) makes the sum unknown rather
        // than low.
        let sum = |get: fn(&ContainerUsage) -> Option<f64>| -> Option<f64> {
            if pods.is_empty() {
                return None;
            }
            containers
                .iter()
                .map(|containers| {
                    let containers = containers.filter(|c| !c.is_empty())?;
                    containers.iter().map(get).sum::<Option<f64>>()
                })
                .sum()
        };
        Self {
            cpu: sum(ContainerUsage::cpu_cores).map(round_cpu),
            memory: sum(|c| c.memory_bytes),
            newest: containers.iter().flatten().flat_map(|c| c.iter()).filter_map(|c| c.timestamp).max(),
        }
    }
}

/// Indexes a query result by its `namespace` and `pod` labels, or records why `field` is
/// missing.
pub(crate) fn index_by_pod(
    result: Result<Vec<PromSample>, QueryError>,
    field: &str,
    warnings: &mut Vec<String>,
) -> SamplesBy<'static> {
    index_by(result, field, "pod", warnings)
}

/// Indexes a query result by its `namespace` label and `label`, or records why `field` is
/// missing. Samples without those labels are ignored; of two with the same labels, the last
/// is kept.
pub(crate) fn index_by<'l>(
    result: Result<Vec<PromSample>, QueryError>,
    field: &str,
    label: &'l str,
    warnings: &mut Vec<String>,
) -> SamplesBy<'l> {
    match result {
        Ok(samples) => SamplesBy::new(samples, label, true, Duplicates::KeepLast).0,
        Err(error) => {
            warnings.push(format!("{field} omitted: {error}"));
            SamplesBy::new(Vec::new(), label, true, Duplicates::KeepLast).0
        }
    }
}

/// Which of several samples naming the same object [`SamplesBy`] keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Duplicates {
    KeepFirst,
    KeepLast,
}

/// A query's samples by the object their labels name: the `namespace` label (unless the
/// objects are cluster-scoped) and `label`. Sorted by those and found by binary search, so a
/// result for 10,000 pods is indexed without a key of its own per sample (a `HashMap` by
/// [`PodKey`] cost two strings per sample, each refresh).
#[derive(Debug)]
pub(crate) struct SamplesBy<'l> {
    label: &'l str,
    namespaced: bool,
    samples: Vec<PromSample>,
}

impl<'l> SamplesBy<'l> {
    /// Indexes `samples` (those without the labels are dropped), keeping one per object as
    /// `duplicates` says; also returns how many objects had more than one.
    pub(crate) fn new(
        mut samples: Vec<PromSample>,
        label: &'l str,
        namespaced: bool,
        duplicates: Duplicates,
    ) -> (Self, usize) {
        let by = Self { label, namespaced, samples: Vec::new() };
        samples.retain(|s| by.key(s).is_some());
        // Stable: samples naming the same object stay in the answer's order.
        samples.sort_by(|a, b| by.key(a).cmp(&by.key(b)));
        let mut duplicated = 0;
        let mut previous_was_duplicate = false;
        samples.dedup_by(|later, earlier| {
            if by.key(later) != by.key(earlier) {
                previous_was_duplicate = false;
                return false;
            }
            if !previous_was_duplicate {
                duplicated += 1;
                previous_was_duplicate = true;
            }
            if duplicates == Duplicates::KeepLast {
                std::mem::swap(later, earlier);
            }
            true
        });
        (Self { samples, ..by }, duplicated)
    }

    /// The (namespace, name) a sample names: the namespace is empty for cluster-scoped objects.
    fn key<'s>(&self, sample: &'s PromSample) -> Option<(&'s str, &'s str)> {
        let namespace = if self.namespaced { sample.labels.get("namespace")? } else { "" };
        Some((namespace, sample.labels.get(self.label)?))
    }

    /// The sample of the object `key` names.
    pub(crate) fn get(&self, key: &PodKey) -> Option<&PromSample> {
        let wanted = (&*key.namespace, &*key.name);
        let at = self.samples.binary_search_by(|s| self.key(s).cmp(&Some(wanted))).ok()?;
        self.samples.get(at)
    }

    /// The objects named, in order: (namespace, name).
    pub(crate) fn keys(&self) -> impl Iterator<Item = (&str, &str)> + '_ {
        self.samples.iter().filter_map(|s| self.key(s))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::testkit::mk_sample;

    const AT: &str = "2026-01-01T00:00:00Z";

    fn key(namespace: &str, name: &str) -> PodKey {
        PodKey { namespace: namespace.into(), name: name.into() }
    }

    fn value(by: &SamplesBy<'_>, namespace: &str, name: &str) -> Option<f64> {
        by.get(&key(namespace, name)).map(|s| s.value)
    }

    #[test]
    fn samples_are_found_by_namespace_and_label_whatever_their_order() {
        let samples = vec![
            mk_sample(&[("namespace", "shop"), ("pod", "web-2")], 2.0, AT),
            mk_sample(&[("namespace", "bank"), ("pod", "web-1")], 3.0, AT),
            mk_sample(&[("namespace", "shop"), ("pod", "web-1")], 1.0, AT),
            mk_sample(&[("pod", "no-namespace")], 4.0, AT),
            mk_sample(&[("namespace", "shop")], 5.0, AT),
        ];
        let (by, duplicated) = SamplesBy::new(samples, "pod", true, Duplicates::KeepLast);
        assert_eq!(duplicated, 0);
        assert_eq!(value(&by, "shop", "web-1"), Some(1.0));
        assert_eq!(value(&by, "shop", "web-2"), Some(2.0));
        assert_eq!(value(&by, "bank", "web-1"), Some(3.0));
        assert_eq!(value(&by, "bank", "web-2"), None);
        assert_eq!(value(&by, "", "no-namespace"), None, "a sample without the labels is dropped");
        assert_eq!(by.keys().collect::<Vec<_>>(), [("bank", "web-1"), ("shop", "web-1"), ("shop", "web-2")]);
    }

    #[test]
    fn of_samples_naming_the_same_object_one_is_kept_and_counted() {
        let samples = || {
            vec![
                mk_sample(&[("namespace", "shop"), ("pod", "a")], 1.0, AT),
                mk_sample(&[("namespace", "shop"), ("pod", "b")], 10.0, AT),
                mk_sample(&[("namespace", "shop"), ("pod", "a")], 2.0, AT),
                mk_sample(&[("namespace", "shop"), ("pod", "a")], 3.0, AT),
                mk_sample(&[("namespace", "shop"), ("pod", "c")], 20.0, AT),
                mk_sample(&[("namespace", "shop"), ("pod", "c")], 30.0, AT),
            ]
        };
        let (last, duplicated) = SamplesBy::new(samples(), "pod", true, Duplicates::KeepLast);
        assert_eq!(duplicated, 2, "a and c");
        assert_eq!((value(&last, "shop", "a"), value(&last, "shop", "c")), (Some(3.0), Some(30.0)));
        let (first, duplicated) = SamplesBy::new(samples(), "pod", true, Duplicates::KeepFirst);
        assert_eq!(duplicated, 2);
        assert_eq!((value(&first, "shop", "a"), value(&first, "shop", "c")), (Some(1.0), Some(20.0)));
        assert_eq!(value(&first, "shop", "b"), Some(10.0));
        assert_eq!(first.keys().count(), 3);
    }

    #[test]
    fn cluster_scoped_objects_are_named_by_the_label_alone() {
        let samples = vec![
            mk_sample(&[("node", "n1")], 1.0, AT),
            mk_sample(&[("node", "n2"), ("namespace", "shop")], 2.0, AT),
        ];
        let (by, _) = SamplesBy::new(samples, "node", false, Duplicates::KeepFirst);
        assert_eq!(value(&by, "", "n1"), Some(1.0));
        assert_eq!(value(&by, "", "n2"), Some(2.0), "a namespace label does not matter");
        assert_eq!(value(&by, "shop", "n2"), None);
    }

    #[test]
    fn a_failed_query_indexes_nothing_and_says_why() {
        let mut warnings = Vec::new();
        let failed = Err(QueryError::Prometheus(PromError::Unreachable("connection refused".into())));
        let by = index_by_pod(failed, "requests", &mut warnings);
        assert_eq!(by.keys().count(), 0);
        assert_eq!(warnings, ["requests omitted: prometheus unreachable: connection refused"]);
    }
}
