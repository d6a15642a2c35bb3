//! The registry of kinds: the one list of built-in kinds ([`BUILTIN`]; a kind's file exports
//! its [`Builtin`], one line here registers it), the check of the query file's kind sections
//! and declared kinds ([`check_kinds`]), and the kinds in force ([`KindRegistry`], the
//! `apiserver::kind::KindSource` of the router): the built-in ones plus those the
//! configuration declares, rebuilt when it is reloaded.

use std::sync::Arc;

pub(crate) use super::Builtin;

use std::sync::RwLock;

use super::declared::{DeclaredKind, DeclaredSpec, check_declared};
use super::{Kinds, ServedKind, Sources};
use crate::config::{Invalid, LiveConfig, QueryFile};
use crate::sources::prometheus::Template;
use apiserver::CacheSettings;
use apiserver::kind::{CachedKind, Generation, KindSet, KindSource, LiveKinds};

/// Every built-in kind, in discovery order.
pub static BUILTIN: &[&Builtin] = &[&super::pod_metrics_summary::KIND, &super::cafe_brew_stats::KIND];

/// Checks the kind sections of `file`: each names a built-in kind, each field one of its
/// queries, and each template is valid (keeps `SCOPE`, parses). The built-in kinds' defaults
/// are compiled here too, once.
pub(crate) fn check_queries(file: &QueryFile<Template>) -> Result<(), Invalid> {
    for kind in BUILTIN {
        for spec in kind.queries {
            let name = format!("{}.{}", kind.section, spec.field);
            spec.default_template()
                .check_scoped()
                .map_err(|e| Invalid::new(name, format!("default: {e}")))?;
        }
    }
    for (section, queries) in &file.kind_queries {
        let Some(kind) = BUILTIN.iter().find(|k| k.section == section) else {
            let known: Vec<&str> = BUILTIN.iter().map(|k| k.section).collect();
            return Err(Invalid::new(
                section.clone(),
                format!(
                    "unknown field; expected window, externalMetrics, customMetrics, kinds, resourceQueries \
                     or a kind's section ({})",
                    known.join(", ")
                ),
            ));
        };
        for (field, template) in queries {
            let name = format!("{section}.{field}");
            if !kind.queries.iter().any(|q| q.field == field) {
                let known: Vec<&str> = kind.queries.iter().map(|q| q.field).collect();
                return Err(Invalid::new(
                    name,
                    format!("unknown query; expected one of {}", known.join(", ")),
                ));
            }
            template.check_scoped().map_err(|e| Invalid::new(name, e.to_string()))?;
        }
    }
    Ok(())
}

/// Checks the whole query file as far as kinds are concerned: the built-in kinds' sections
/// and the declared kinds.
pub(crate) fn check_kinds(file: &mut QueryFile<Template>) -> Result<(), Invalid> {
    check_queries(file)?;
    check_declared(file, BUILTIN)
}

/// What declared kinds are built from.
struct DeclaredInputs {
    sources: Sources,
    cache: CacheSettings,
}

/// The set built last and the declared kinds' specs in it, for reuse across reloads.
#[derive(Default)]
struct Built {
    set: Arc<KindSet>,
    declared: Vec<(Arc<DeclaredSpec>, Arc<dyn ServedKind>)>,
}

/// The kinds in force. The built-in kinds are built once; the declared kinds follow the
/// configuration: every read compares the configuration generation with the one the set was
/// built for and rebuilds it when it moved, so discovery, OpenAPI and the served paths never lag
/// the file. A declared kind whose spec is unchanged keeps its cache; a removed one is dropped
/// with its cache once the last request holding it ends.
pub struct KindRegistry {
    builtin: Kinds,
    declared: DeclaredInputs,
    built: RwLock<Arc<Built>>,
}

impl std::fmt::Debug for KindRegistry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KindRegistry").field("built", &self.built().set).finish_non_exhaustive()
    }
}

impl From<KindRegistry> for LiveKinds {
    fn from(registry: KindRegistry) -> Self {
        LiveKinds::live(Arc::new(registry))
    }
}

/// The cache keys' generation of the kinds computed with `config`.
fn generation_of(config: &Arc<LiveConfig<Template>>) -> Generation {
    let config = config.clone();
    Arc::new(move || config.current().generation)
}

impl KindRegistry {
    /// Every built-in kind and the declared kinds of `sources.config`, each behind its cache.
    pub fn new(sources: &Sources, cache: &CacheSettings) -> Self {
        let builtin: Kinds = BUILTIN
            .iter()
            .map(|kind| {
                let generation = generation_of(&sources.config);
                let cached = CachedKind::new((kind.build)(sources.clone()), cache, generation);
                Arc::new(cached) as Arc<dyn ServedKind>
            })
            .collect();
        let declared = DeclaredInputs { sources: sources.clone(), cache: cache.clone() };
        let live = Self { builtin, declared, built: RwLock::default() };
        live.rebuild(&Built::default());
        live
    }

    /// Also serves `metrics.k8s.io` (`PodMetrics`, `NodeMetrics`) from the same sources, each
    /// behind its cache.
    pub fn with_resource_metrics(mut self, sources: &Sources, cache: &CacheSettings) -> Self {
        for kind in super::resource_metrics::kinds(sources) {
            let cached = CachedKind::new(kind, cache, generation_of(&sources.config));
            self.builtin.push(Arc::new(cached));
        }
        let previous = self.built();
        self.rebuild(&previous);
        self
    }

    fn built(&self) -> Arc<Built> {
        match self.built.read() {
            Ok(built) => built.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Builds the set for the configuration in force, reusing `previous`' unchanged kinds.
    fn rebuild(&self, previous: &Built) -> Arc<KindSet> {
        let inputs = &self.declared;
        let snapshot = inputs.sources.config.current();
        let mut kinds = self.builtin.clone();
        let mut declared = Vec::with_capacity(snapshot.file.kinds.len());
        for config in &snapshot.file.kinds {
            let spec = DeclaredSpec::from_config(config);
            let kind = match previous.declared.iter().find(|(s, _)| **s == spec) {
                Some((spec, kind)) => (spec.clone(), kind.clone()),
                None => {
                    let spec = Arc::new(spec);
                    let metrics = inputs.cache.metrics.clone();
                    let inner = DeclaredKind::new(spec.clone(), inputs.sources.clone(), metrics);
                    let generation = generation_of(&inputs.sources.config);
                    let cached = CachedKind::new(Arc::new(inner), &inputs.cache, generation);
                    (spec, Arc::new(cached) as Arc<dyn ServedKind>)
                }
            };
            kinds.push(kind.1.clone());
            declared.push(kind);
        }
        let set = Arc::new(KindSet::new(snapshot.generation, kinds));
        let fresh = Arc::new(Built { set: set.clone(), declared });
        let mut slot = match self.built.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Generations only grow: never replace a newer set built by a concurrent reader.
        if set.generation >= slot.set.generation {
            *slot = fresh;
        }
        set
    }
}

impl KindSource for KindRegistry {
    /// The kinds of the configuration in force.
    fn current(&self) -> Arc<KindSet> {
        let built = self.built();
        if self.declared.sources.config.generation() != built.set.generation {
            return self.rebuild(&built);
        }
        built.set.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::{GROUP, VERSION};

    fn check(yaml: &str) -> Result<(), String> {
        let check: crate::config::Check<Template> =
            Arc::new(|file: &mut QueryFile<Template>| check_queries(file));
        QueryFile::from_yaml(yaml, "f.yaml", &check).map(|_| ()).map_err(|e| e.to_string())
    }

    /// Live kinds over a configuration file `dir/config.yaml` holding `yaml`.
    fn mk_live(
        dir: &std::path::Path,
        yaml: &str,
    ) -> (KindRegistry, Arc<crate::config::LiveConfig<Template>>) {
        use crate::kinds::testkit::{FakeInventory, FakeKubelet, FakeProm};
        use crate::sources::resources::KubeletUsage;
        std::fs::create_dir_all(dir).unwrap();
        let path = dir.join("config.yaml");
        std::fs::write(&path, yaml).unwrap();
        let check: crate::config::Check<Template> = Arc::new(check_kinds);
        let config = crate::config::LiveConfig::load(Some(&path), None, check).unwrap();
        let sources = Sources {
            inventory: FakeInventory::with(Vec::new()),
            usage: Arc::new(KubeletUsage::new(Arc::new(FakeKubelet::default()))),
            prometheus: Arc::new(FakeProm::default()),
            config: config.clone(),
        };
        let cache = CacheSettings::uncounted(std::time::Duration::from_secs(10));
        (KindRegistry::new(&sources, &cache), config)
    }

    fn declared(kind: &str, column: &str) -> String {
        format!(
            "kinds:\n- kind: {kind}\n  nameLabel: pod\n  fields:\n  - name: rps\n    column: {column}\n    \
             query: sum by (namespace, pod) (rate(x{{SCOPE}}[WINDOW]))\n"
        )
    }

    fn plurals(set: &KindSet) -> Vec<String> {
        set.kinds().iter().map(|k| k.info().plural.to_string()).collect()
    }

    #[test]
    fn declared_kinds_follow_reloads_and_unchanged_ones_are_kept() {
        let dir = std::env::temp_dir().join(format!("percolator-live-kinds-{}", std::process::id()));
        let (live, config) = mk_live(&dir, &declared("AppTraffic", "RPS"));
        let first = live.current();
        assert_eq!(plurals(&first), ["podmetricssummaries", "cafebrewstats", "apptraffics"]);
        assert!(Arc::ptr_eq(&first, &live.current()), "no reload, no rebuild");
        let app = Arc::downgrade(first.find(GROUP, VERSION, "apptraffics").unwrap());

        // Another kind added: the unchanged one is the same object (its cache survives).
        let two = format!("{}{}", declared("AppTraffic", "RPS"), &declared("Queue", "DEPTH")[7..]);
        std::fs::write(dir.join("config.yaml"), &two).unwrap();
        assert!(config.reload().unwrap());
        let second = live.current();
        assert_eq!(second.generation, 1);
        assert_eq!(plurals(&second), ["podmetricssummaries", "cafebrewstats", "apptraffics", "queues"]);
        assert!(Arc::ptr_eq(&app.upgrade().unwrap(), second.find(GROUP, VERSION, "apptraffics").unwrap()));
        assert!(Arc::ptr_eq(
            first.find(GROUP, VERSION, "podmetricssummaries").unwrap(),
            second.find(GROUP, VERSION, "podmetricssummaries").unwrap()
        ));

        // Changed: a new kind object; removed: gone, and dropped once nobody holds it.
        std::fs::write(dir.join("config.yaml"), declared("AppTraffic", "REQ/S")).unwrap();
        assert!(config.reload().unwrap());
        let third = live.current();
        assert_eq!(plurals(&third), ["podmetricssummaries", "cafebrewstats", "apptraffics"]);
        assert_eq!(third.find(GROUP, VERSION, "apptraffics").unwrap().columns()[1].name, "REQ/S");
        let queue = Arc::downgrade(second.find(GROUP, VERSION, "queues").unwrap());
        drop((first, second));
        assert!(app.upgrade().is_none(), "the changed kind's old object is dropped");
        assert!(queue.upgrade().is_none(), "the removed kind is dropped with its cache");
        assert!(third.find(GROUP, VERSION, "queues").is_none());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn default_templates_are_valid() {
        for kind in BUILTIN {
            for spec in kind.queries {
                spec.default_template()
                    .check_scoped()
                    .unwrap_or_else(|e| panic!("{}.{}: {e}", kind.section, spec.field));
            }
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, kind) in BUILTIN.iter().enumerate() {
            for other in &BUILTIN[..i] {
                assert_ne!(kind.info.plural, other.info.plural);
                assert_ne!(kind.info.kind, other.info.kind);
                assert_ne!(kind.section, other.section);
            }
        }
    }

    #[test]
    fn overrides_are_checked_with_the_field_named() {
        check("podMetricsSummary:\n  requests: sum by (namespace, pod) (x{SCOPE})\n").unwrap();
        check("cafeBrewStats:\n  lastBrewed: max by (namespace, cafe) (y{SCOPE})\n").unwrap();
        let err = check("podMetricsSummary:\n  request: x{SCOPE}\n").unwrap_err();
        assert_eq!(
            err,
            "--config f.yaml: field podMetricsSummary.request: unknown query; expected one of requests, errors"
        );
        let err = check("podMetricsSummary:\n  requests: sum(rate(x[5m]))\n").unwrap_err();
        assert!(err.starts_with("--config f.yaml: field podMetricsSummary.requests: "), "{err}");
        assert!(err.contains("would read every namespace"), "{err}");
        let err = check("bogus:\n  a: b\n").unwrap_err();
        assert_eq!(
            err,
            "--config f.yaml: field bogus: unknown field; expected window, externalMetrics, customMetrics, \
             kinds, resourceQueries or a kind's section (podMetricsSummary, cafeBrewStats)"
        );
    }
}
