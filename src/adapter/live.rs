//! The adapter configuration in force and the metrics its rules serve (`--adapter-config`):
//! loaded at start (an invalid file stops the start with the rule, field and construct named),
//! reloaded when the file changes (an invalid edit is logged and the last good configuration
//! stays), and its rules' series listed through Prometheus' series API as the adapter does: at
//! start, every `--metrics-relist-interval` over the last `--metrics-max-age`, and after a
//! reload. A failed listing keeps the metrics of the last good one.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use jiff::Timestamp;

use super::{
    AdapterConfig, AdapterError, CustomMetric, ExternalMetric, Series, custom_metrics, external_metrics,
};
use crate::sources::PromSource;
use crate::sources::resources::{ResourceQuery, ResourceQueryError, ResourceQueryPlan};

/// What the adapter configuration serves right now.
#[derive(Debug)]
pub(crate) struct Discovered {
    /// Increases whenever the configuration or the discovered metrics change.
    pub generation: u64,
    /// The configuration in force.
    pub config: Arc<AdapterConfig>,
    /// The custom metrics its `rules` serve, from the last good listing.
    pub custom: Vec<CustomMetric>,
    /// The external metrics its `externalRules` serve, from the last good listing.
    pub external: Vec<ExternalMetric>,
}

impl Discovered {
    /// The custom metric `name` on `resource`, with the rule that serves it.
    pub(crate) fn custom_metric(
        &self,
        name: &str,
        resource: &k8s_wire::GroupResource,
    ) -> Option<(&CustomMetric, &super::Rule)> {
        let metric = self.custom.iter().find(|m| m.name == name && &m.resource == resource)?;
        Some((metric, self.config.rules.get(metric.rule)?))
    }

    /// The external metric `name`, with the rule that serves it.
    pub(crate) fn external_metric(&self, name: &str) -> Option<(&ExternalMetric, &super::Rule)> {
        let metric = self.external.iter().find(|m| m.name == name)?;
        Some((metric, self.config.external_rules.get(metric.rule)?))
    }
}

/// The live adapter configuration.
pub(crate) struct LiveAdapter {
    path: PathBuf,
    prometheus: Arc<dyn PromSource>,
    max_age: Duration,
    current: RwLock<Arc<Discovered>>,
    generation: AtomicU64,
    last_text: Mutex<String>,
    /// The configuration to serve: [`LiveAdapter::current`]'s, or a reloaded one whose series
    /// have not been listed yet (served with them once they are).
    desired: Mutex<Arc<AdapterConfig>>,
}

impl std::fmt::Debug for LiveAdapter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveAdapter").field("path", &self.path).finish_non_exhaustive()
    }
}

/// Reads and checks `path` as an adapter configuration (at start, before anything else is
/// built: a bad file stops the start at once).
pub(crate) fn load(path: &Path) -> Result<(String, AdapterConfig), AdapterError> {
    let shown = path.display().to_string();
    let text = std::fs::read_to_string(path)
        .map_err(|e| AdapterError::Parse { path: shown.clone(), message: e.to_string() })?;
    let config = parse(&text, &shown)?;
    Ok((text, config))
}

/// Checks a configuration's text.
fn parse(text: &str, path: &str) -> Result<AdapterConfig, AdapterError> {
    AdapterConfig::from_yaml(text, path)
}

impl LiveAdapter {
    /// Loads `path` and lists its rules' series once (a failed listing is logged: the rules
    /// then serve nothing until a listing succeeds). `max_age` is how far back series count.
    #[cfg(test)]
    pub(crate) async fn load(
        path: &Path,
        prometheus: Arc<dyn PromSource>,
        max_age: Duration,
    ) -> Result<Arc<Self>, AdapterError> {
        Ok(Self::start(path, load(path)?, prometheus, max_age).await)
    }

    /// As [`LiveAdapter::load`], from the text and configuration [`load`] already read from
    /// `path`.
    pub(crate) async fn start(
        path: &Path,
        (text, config): (String, AdapterConfig),
        prometheus: Arc<dyn PromSource>,
        max_age: Duration,
    ) -> Arc<Self> {
        let config = Arc::new(config);
        let live = Arc::new(Self {
            path: path.to_path_buf(),
            prometheus,
            max_age,
            current: RwLock::new(Arc::new(Discovered {
                generation: 1,
                config: config.clone(),
                custom: Vec::new(),
                external: Vec::new(),
            })),
            generation: AtomicU64::new(1),
            last_text: Mutex::new(text),
            desired: Mutex::new(config),
        });
        live.relist().await;
        live
    }

    /// What is served now.
    pub(crate) fn current(&self) -> Arc<Discovered> {
        self.current.read().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// The generation of [`LiveAdapter::current`], without a lock.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// Lists the series of the desired configuration's rules and, when every listing
    /// succeeded, serves that configuration with what they name. Returns whether it did.
    pub(crate) async fn relist(&self) -> bool {
        let config = self.desired.lock().unwrap_or_else(PoisonError::into_inner).clone();
        let end = Timestamp::now();
        let start = end
            .checked_sub(jiff::SignedDuration::try_from(self.max_age).unwrap_or(jiff::SignedDuration::MAX))
            .unwrap_or(Timestamp::MIN);
        let queries: Vec<String> = config.series_queries().into_iter().map(str::to_owned).collect();
        let listings =
            futures::future::join_all(queries.iter().map(|q| self.prometheus.series(q.clone(), start, end)))
                .await;
        let mut series: BTreeMap<String, Vec<Series>> = BTreeMap::new();
        for (query, listing) in queries.into_iter().zip(listings) {
            match listing {
                Ok(found) => {
                    series.insert(query, found);
                }
                Err(error) => {
                    tracing::warn!(%error, series_query = %query, "adapter rules: listing series failed; keeping the metrics listed before");
                    return false;
                }
            }
        }
        let (custom, external) = match (
            custom_metrics(&config.rules, &series),
            external_metrics(&config.external_rules, &series),
        ) {
            (Ok(custom), Ok(external)) => (custom, external),
            (Err(missing), _) | (_, Err(missing)) => {
                tracing::error!(series_query = %missing.0, "adapter rules: a series query was not listed");
                return false;
            }
        };
        tracing::info!(custom = custom.len(), external = external.len(), "adapter rules: series listed");
        self.publish(config, custom, external);
        true
    }

    fn publish(&self, config: Arc<AdapterConfig>, custom: Vec<CustomMetric>, external: Vec<ExternalMetric>) {
        let mut current = self.current.write().unwrap_or_else(PoisonError::into_inner);
        let unchanged =
            Arc::ptr_eq(&current.config, &config) && current.custom == custom && current.external == external;
        if unchanged {
            return;
        }
        let generation = current.generation + 1;
        *current = Arc::new(Discovered { generation, config, custom, external });
        self.generation.store(generation, Ordering::Release);
    }

    /// Re-reads the file when its content changed: a valid new configuration is listed and
    /// served, an invalid one is logged and the last good one stays. Returns `Some(valid)`
    /// when the content changed.
    pub(crate) async fn reload(&self) -> Option<bool> {
        let text = std::fs::read_to_string(&self.path).ok()?;
        {
            let mut last = self.last_text.lock().unwrap_or_else(PoisonError::into_inner);
            if *last == text {
                return None;
            }
            last.clone_from(&text);
        }
        match parse(&text, &self.path.display().to_string()) {
            Ok(config) => {
                *self.desired.lock().unwrap_or_else(PoisonError::into_inner) = Arc::new(config);
                // Until the new rules' series are listed, the old rules keep serving; the next
                // relist retries.
                let listed = self.relist().await;
                tracing::info!(path = %self.path.display(), listed, "adapter configuration reloaded");
                Some(true)
            }
            Err(error) => {
                tracing::error!(%error, "adapter configuration rejected; the last good one stays");
                Some(false)
            }
        }
    }

    /// Polls the file every `poll` and relists every `relist`, for as long as the process runs;
    /// `on_reload` hears whether each changed content was applied.
    pub(crate) fn spawn(
        self: &Arc<Self>,
        poll: Duration,
        relist: Duration,
        on_reload: impl Fn(bool) + Send + Sync + 'static,
    ) {
        let live = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut since_relist = Duration::ZERO;
            loop {
                tokio::time::sleep(poll).await;
                let Some(live) = live.upgrade() else { return };
                since_relist += poll;
                if let Some(applied) = live.reload().await {
                    on_reload(applied);
                    since_relist = Duration::ZERO;
                } else if since_relist >= relist {
                    live.relist().await;
                    since_relist = Duration::ZERO;
                }
            }
        });
    }
}

/// Logs, as reloads and relists publish new adapter configurations, when the resourceRules of
/// `path` appear or disappear (`had_rules`: at start), with what that means for the resource
/// source (which stays what start decided). It keeps the adapter, and so its reloads, alive for
/// the process's life even when no API serves from it (the kubelet source without custom or
/// external metrics): a reload adding resourceRules is then still heard of. `poll`: how often
/// it looks.
pub(crate) fn watch_resource_rules(
    adapter: Arc<LiveAdapter>,
    path: std::path::PathBuf,
    choice: crate::sources::resource_source::ResourceSourceChoice,
    poll: Duration,
    mut had_rules: bool,
) {
    tokio::spawn(async move {
        // 0: the first look compares too (a reload may have come before this task runs).
        let mut seen = 0;
        loop {
            let generation = adapter.generation();
            if generation != seen {
                seen = generation;
                let has_rules = adapter.current().config.resource_rules.is_some();
                if has_rules != had_rules {
                    had_rules = has_rules;
                    match choice.on_rules_change(&path, has_rules) {
                        (true, message) => tracing::warn!("{message}"),
                        (false, message) => tracing::info!("{message}"),
                    }
                }
            }
            tokio::time::sleep(poll).await;
        }
    });
}

/// The queries of `--resource-source=prometheus` from the adapter configuration's
/// `resourceRules` (the resource provider's: `.LabelMatchers` the namespace's matcher, or the
/// nodes' names; `.GroupBy` the pod and container labels, or the node label), and from
/// `fallback` (the `resourceQueries:` of `--config`) while the file has none.
pub(crate) struct AdapterResourceQueries {
    /// The adapter configuration.
    pub adapter: Arc<LiveAdapter>,
    /// The queries used while it has no `resourceRules`.
    pub fallback: Arc<dyn ResourceQueryPlan>,
}

/// Used when `resourceRules.window` is unset.
const DEFAULT_WINDOW: Duration = Duration::from_secs(60);

impl AdapterResourceQueries {
    fn rules(&self) -> Option<(Arc<AdapterConfig>, Duration)> {
        let config = self.adapter.current().config.clone();
        let window = config.resource_rules.as_ref()?.window.unwrap_or(DEFAULT_WINDOW);
        Some((config, window))
    }
}

impl ResourceQueryPlan for AdapterResourceQueries {
    fn generation(&self) -> u64 {
        self.adapter.generation() + self.fallback.generation()
    }

    fn pods(&self, namespace: &str) -> Result<ResourceQuery, ResourceQueryError> {
        let Some((config, window)) = self.rules() else { return self.fallback.pods(namespace) };
        let Some(rules) = &config.resource_rules else { return self.fallback.pods(namespace) };
        let pods = k8s_wire::GroupResource::new("", "pods");
        Ok(ResourceQuery {
            cpu: rules
                .cpu
                .query_pods::<&str>(namespace, None)
                .map_err(|e| format!("resourceRules.cpu: {e}"))?,
            memory: rules
                .memory
                .query_pods::<&str>(namespace, None)
                .map_err(|e| format!("resourceRules.memory: {e}"))?,
            window,
            // Both rules group by their own labels; CPU's name the objects of both.
            object_label: rules.cpu.label_for(&pods).map_err(|e| e.to_string())?,
            container_label: rules.cpu.container_label.clone(),
        })
    }

    fn nodes(&self, nodes: &[&str]) -> Result<ResourceQuery, ResourceQueryError> {
        let Some((config, window)) = self.rules() else { return self.fallback.nodes(nodes) };
        let Some(rules) = &config.resource_rules else { return self.fallback.nodes(nodes) };
        let node = k8s_wire::GroupResource::new("", "nodes");
        // The names, as the adapter passes them: templates such as `{<<.LabelMatchers>>,id='/'}`
        // need a matcher.
        let names = (!nodes.is_empty()).then_some(nodes);
        Ok(ResourceQuery {
            cpu: rules.cpu.query_nodes(names).map_err(|e| format!("resourceRules.cpu: {e}"))?,
            memory: rules.memory.query_nodes(names).map_err(|e| format!("resourceRules.memory: {e}"))?,
            window,
            object_label: rules.cpu.label_for(&node).map_err(|e| e.to_string())?,
            container_label: String::new(),
        })
    }
}
