//! Where a metric API's metrics come from, behind one [`Provider`] trait with two
//! implementations: the `--config` file's metrics ([`ConfigMetrics`]) and the
//! `--adapter-config` file's rules ([`AdapterRules`]). [`Backend`] is what both APIs hold: the
//! two providers, Prometheus, and the query cache (per `--cache-ttl`, concurrent identical
//! misses share one query, errors are not cached, a failure is logged once and answered 503).

use std::marker::PhantomData;
use std::sync::Arc;
use std::time::Instant;

use apiserver::{CacheSettings, TtlCache};

use super::core::{Api, Declared, MAX_ENTRIES, Result, label_matchers, prometheus_unavailable};
use crate::adapter::{Discovered, LiveAdapter};
use crate::config::{LiveConfig, Snapshot};
use crate::sources::prometheus::{Matcher, Template};
use crate::sources::{PromSample, PromSource};
use k8s_wire::ApiError;
use k8s_wire::LabelSelector;

/// A source of the metrics one API serves.
pub(crate) trait Provider: Send + Sync {
    /// Grows whenever the metrics it serves change.
    fn generation(&self) -> u64;
    /// The names of the metrics it serves, in order.
    fn names(&self) -> Vec<String>;
    /// Whether it serves a metric of that name.
    fn serves(&self, metric: &str) -> bool;
}

/// The metrics of the reloadable `--config` file (`D`: `externalMetrics` or `customMetrics`).
pub(crate) struct ConfigMetrics<D> {
    config: Arc<LiveConfig<Template>>,
    declared: PhantomData<fn() -> D>,
}

impl<D: Declared> ConfigMetrics<D> {
    /// The configuration in force: one snapshot serves a whole request.
    pub(crate) fn current(&self) -> Arc<Snapshot<Template>> {
        self.config.current()
    }
}

impl<D: Declared> Provider for ConfigMetrics<D> {
    fn generation(&self) -> u64 {
        self.current().generation
    }

    fn names(&self) -> Vec<String> {
        D::of(&self.current()).iter().map(|m| m.name().to_owned()).collect()
    }

    fn serves(&self, metric: &str) -> bool {
        D::of(&self.current()).iter().any(|m| m.name() == metric)
    }
}

/// The `externalRules` or `rules` (as `api` says) of a prometheus-adapter configuration.
pub(crate) struct AdapterRules {
    adapter: Arc<LiveAdapter>,
    api: Api,
}

impl AdapterRules {
    /// The configuration in force and the metrics its rules found.
    pub(crate) fn current(&self) -> Arc<Discovered> {
        self.adapter.current()
    }

    /// Whether `discovered` serves `metric` in this API (custom: on any resource).
    pub(crate) fn serves_in(&self, discovered: &Discovered, metric: &str) -> bool {
        match self.api {
            Api::External => discovered.external_metric(metric).is_some(),
            Api::Custom => discovered.custom.iter().any(|m| m.name == metric),
        }
    }
}

impl Provider for AdapterRules {
    fn generation(&self) -> u64 {
        self.adapter.generation()
    }

    fn names(&self) -> Vec<String> {
        let discovered = self.current();
        match self.api {
            Api::External => discovered.external.iter().map(|m| m.name.clone()).collect(),
            Api::Custom => discovered.custom.iter().map(|m| m.name.clone()).collect(),
        }
    }

    fn serves(&self, metric: &str) -> bool {
        self.serves_in(&self.current(), metric)
    }
}

/// What a cached query result is found by.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    /// The generation of the configuration the query comes from: results of a replaced
    /// configuration are not served after a reload.
    pub generation: u64,
    /// The adapter configuration's generation, where it matters (0 otherwise).
    pub adapter_generation: u64,
    /// The metric.
    pub metric: String,
    /// The request's namespace.
    pub namespace: String,
    /// What else tells the query apart: the canonical matchers of a declared metric, the PromQL
    /// of an adapter rule's.
    pub selector: String,
}

/// The two providers of one API (`D`'s), Prometheus, and the cache of query results `V`.
pub(crate) struct Backend<D, V> {
    prometheus: Arc<dyn PromSource>,
    cache: TtlCache<CacheKey, V>,
    /// The `--config` file's metrics.
    pub config: ConfigMetrics<D>,
    /// The adapter configuration's rules, served beside the own metrics.
    pub adapter: Option<AdapterRules>,
}

impl<D, V> std::fmt::Debug for Backend<D, V> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backend").field("config", &self.config.config).finish_non_exhaustive()
    }
}

impl<D: Declared, V: Clone + Send + Sync + 'static> Backend<D, V> {
    /// Serves the metrics of `config` (checked by [`check_metrics`](super::core::check_metrics))
    /// from `prometheus`, with a cache built from `cache` and named after the API's group in
    /// `percolator_cache_requests_total`.
    pub(crate) fn new(
        prometheus: Arc<dyn PromSource>,
        config: Arc<LiveConfig<Template>>,
        cache: &CacheSettings,
    ) -> Self {
        Self {
            prometheus,
            cache: TtlCache::new(D::API.group(), cache, MAX_ENTRIES),
            config: ConfigMetrics { config, declared: PhantomData },
            adapter: None,
        }
    }

    /// Also serves the rules of `adapter`.
    pub(crate) fn set_adapter(&mut self, adapter: Arc<LiveAdapter>) {
        self.adapter = Some(AdapterRules { adapter, api: D::API });
    }

    /// Both generations only grow, so their sum changes whenever either does.
    pub(crate) fn generation(&self) -> u64 {
        self.config.generation() + self.adapter.as_ref().map_or(0, Provider::generation)
    }

    /// The declared metric that answers for `metric` in `snapshot`: none when a default metric
    /// yields its name to an adapter rule of `discovered` (a declared one keeps it).
    pub(crate) fn own<'s>(
        &self,
        snapshot: &'s Snapshot<Template>,
        discovered: Option<&Discovered>,
        metric: &str,
    ) -> Option<&'s D> {
        let yields = !D::declared(snapshot)
            && self.adapter.as_ref().zip(discovered).is_some_and(|(a, d)| a.serves_in(d, metric));
        D::of(snapshot).iter().find(|m| m.name() == metric).filter(|_| !yields)
    }

    /// The matchers of `selector` on `definition`'s labels.
    pub(crate) fn matchers(definition: &D, selector: &LabelSelector) -> Result<Vec<Matcher>, ApiError> {
        let what = format!("the {} metric {}", D::API.word(), definition.name());
        label_matchers(&what, definition.labels(), selector)
    }

    /// The result of `promql` for `key`, from the cache or from Prometheus (one query for every
    /// concurrent miss, made into `V` by `convert`), with when it expires. A failure is logged
    /// here, once per failed query, and answered 503.
    pub(crate) async fn fetch(
        &self,
        key: CacheKey,
        promql: String,
        metric: &str,
        convert: impl FnOnce(Vec<PromSample>) -> V,
    ) -> Result<(V, Instant)> {
        let namespace = key.namespace.clone();
        let word = D::API.word();
        let fetch = async {
            match self.prometheus.query(promql).await {
                Ok(samples) => Ok(convert(samples)),
                Err(error) => {
                    tracing::warn!(%error, metric, namespace, "{word} metric query failed");
                    Err(error)
                }
            }
        };
        let (value, expires_at, _) = self
            .cache
            .get_or_try_compute(key, fetch)
            .await
            .map_err(|error| prometheus_unavailable(&format!("the {word} metric {metric}"), &error))?;
        Ok((value, expires_at))
    }
}
