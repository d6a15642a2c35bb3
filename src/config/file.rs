//! The query configuration file (`--config`, a ConfigMap in a cluster) and the configuration in
//! force ([`LiveConfig`]), reloaded when the file changes.
//!
//! This module owns the file's *format*: the global `window`, one section per built-in kind
//! (its query overrides, by field), `externalMetrics` and the declared `kinds`. What a section *means* (which
//! queries a kind has and their defaults, what makes an external metric valid) belongs to the
//! section's owner, which checks it through the [`Check`] given to [`LiveConfig::load`]: a
//! file is accepted whole or rejected whole, with a message naming the field.
//!
//! The file's types are generic over `Q`, the type a PromQL template deserializes into: the
//! server reads the file with the PromQL layer's compiled template
//! (`sources::prometheus::Template`, analysed once as the file is read, rendered without
//! analysis), and this layer, below it, needs not know the template language. Its own tests
//! read queries as plain `String`s.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use apiserver::files::WatchedFile;
use serde::Deserialize;

use k8s_wire::duration;

/// Errors loading the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("--config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The YAML is malformed or has fields of the wrong shape.
    #[error("--config {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What serde said (names the field and position).
        message: String,
    },
    /// A field has an invalid value.
    #[error("--config {path}: field {}: {}", .invalid.field, .invalid.message)]
    Invalid {
        /// The file.
        path: String,
        /// The field and what is wrong with it.
        invalid: Invalid,
    },
}

/// Result alias for this module.
pub(crate) type Result<T> = std::result::Result<T, ConfigError>;

/// A field with an invalid value, as a section's owner reports it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Invalid {
    /// The field path, e.g. `podMetricsSummary.requests` or `externalMetrics[0].name`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

impl Invalid {
    /// `field` is wrong because of `message`.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        Self { field: field.into(), message: message.into() }
    }
}

/// Checks a parsed file and fills the defaults of the sections its owners define; called on
/// every load and reload. The server composes it from every section owner.
pub type Check<Q> = Arc<dyn Fn(&mut QueryFile<Q>) -> std::result::Result<(), Invalid> + Send + Sync>;

/// Default range of rates.
pub const DEFAULT_WINDOW: Duration = Duration::from_secs(300);

/// The parsed query configuration file; `Q` is what each PromQL template is read as.
#[derive(Debug, Clone, PartialEq)]
pub struct QueryFile<Q> {
    /// Range the rates are computed over (Go duration); `--window` overrides it.
    pub window: Option<Duration>,
    /// Query overrides of the built-in kinds: section key (`podMetricsSummary`) → field →
    /// PromQL template. Fields left out take the kind's default.
    pub kind_queries: BTreeMap<String, BTreeMap<String, Q>>,
    /// The metrics of `external.metrics.k8s.io/v1beta1`; `None` when the file leaves the key
    /// out (the external metrics API fills its defaults in then).
    pub external_metrics: Option<Vec<ExternalMetricConfig<Q>>>,
    /// The metrics of `custom.metrics.k8s.io`; `None` when the file leaves the key out (the
    /// custom metrics API fills its defaults in then).
    pub custom_metrics: Option<Vec<CustomMetricConfig<Q>>>,
    /// Kinds declared in the file (`kinds:`), served beside the built-in ones.
    pub kinds: Vec<DeclaredKindConfig<Q>>,
    /// The queries of `--resource-source=prometheus` (`resourceQueries:`); the resource source
    /// fills in the fields left out.
    pub resource_queries: ResourceQueriesConfig<Q>,
    /// Whether the file declares `externalMetrics` and `customMetrics` itself (rather than
    /// taking the defaults): an `--adapter-config` rule may take a default metric's name, not
    /// a declared one's.
    pub declares: Declares,
}

/// Which metric lists a file declares itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Declares {
    /// `externalMetrics` is in the file.
    pub external_metrics: bool,
    /// `customMetrics` is in the file.
    pub custom_metrics: bool,
}

/// Every section left out (what an empty file is before its owners fill their defaults in).
impl<Q> Default for QueryFile<Q> {
    fn default() -> Self {
        Self {
            window: None,
            kind_queries: BTreeMap::new(),
            external_metrics: None,
            custom_metrics: None,
            kinds: Vec::new(),
            resource_queries: ResourceQueriesConfig::default(),
            declares: Declares::default(),
        }
    }
}

impl<Q> QueryFile<Q> {
    /// The template of `field` in the section `section`, when the file sets it.
    pub fn kind_query(&self, section: &str, field: &str) -> Option<&Q> {
        self.kind_queries.get(section)?.get(field)
    }
}

/// One external metric: `GET /apis/external.metrics.k8s.io/v1beta1/namespaces/NS/<name>`
/// runs `query` with `SCOPE` = `namespace="NS"` plus the request's label selector, which may
/// only name the `labels` listed here.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct ExternalMetricConfig<Q> {
    /// Metric name, the resource of its URL: lowercase letters, digits, `_`, `.` and `-`.
    pub name: String,
    /// PromQL template (`SCOPE`, `WINDOW` placeholders as for the other queries). Each series
    /// of the result becomes one item; its labels are the item's `metricLabels`.
    pub query: Q,
    /// Labels a selector may constrain (Prometheus label names, never `namespace`): each
    /// requirement becomes a matcher in `SCOPE`. A selector on any other label is a 400.
    #[serde(default)]
    pub labels: Vec<String>,
    /// Range of this metric's rates (Go duration); the configuration's window when unset.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
}

/// One custom metric (docs/reference/custom-metrics.md): a per-pod PromQL vector, served for pods, for the workloads
/// that select pods and for namespaces under `custom.metrics.k8s.io`.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct CustomMetricConfig<Q> {
    /// Metric name, the last segment of its URLs: lowercase letters, digits, `_`, `.` and `-`.
    pub name: String,
    /// PromQL template whose result keeps the `namespace` and `pod` labels: one value per pod.
    pub query: Q,
    /// Labels a `metricLabelSelector` may constrain (each requirement becomes an escaped
    /// matcher in `SCOPE`); a selector on any other label is a 400.
    #[serde(default)]
    pub labels: Vec<String>,
    /// How the values of an object's pods combine into the object's value.
    #[serde(default)]
    pub aggregate: Aggregate,
    /// Range of this metric's rates (Go duration); the configuration's window when unset.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
}

/// `resourceQueries:`: where `--resource-source=prometheus` reads CPU and memory. Every query
/// is a PromQL template (`SCOPE`, `WINDOW`); fields left out take the defaults on cAdvisor's
/// and the kubelet's series.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResourceQueriesConfig<Q> {
    /// CPU cores per container: the result keeps `namespace`, `pod` and `container`.
    #[serde(rename = "containerCPU")]
    pub container_cpu: Option<Q>,
    /// Memory working set bytes per container, with the same labels.
    #[serde(rename = "containerMemory")]
    pub container_memory: Option<Q>,
    /// CPU cores per node: the result keeps `node`.
    #[serde(rename = "nodeCPU")]
    pub node_cpu: Option<Q>,
    /// Memory working set bytes per node: the result keeps `node`.
    #[serde(rename = "nodeMemory")]
    pub node_memory: Option<Q>,
    /// Range of the CPU rates (`WINDOW`), reported as the `window` of the metrics.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
}

/// Every query left out, for its owner to fill in.
impl<Q> Default for ResourceQueriesConfig<Q> {
    fn default() -> Self {
        Self { container_cpu: None, container_memory: None, node_cpu: None, node_memory: None, window: None }
    }
}

/// How pod values combine for an object (`aggregate:` of a custom metric).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Aggregate {
    /// The sum of the pods' values (requests per second of a Deployment).
    #[default]
    Sum,
    /// Their mean.
    Avg,
    /// The largest.
    Max,
}

/// A kind declared in the file (`kinds:`, docs/reference/kinds.md), as written: the kinds layer checks
/// it, fills its defaults in (plural, singular, categories) and serves it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeclaredKindConfig<Q> {
    /// `Kind` of the objects, UpperCamelCase.
    pub kind: String,
    /// Plural resource name; lowercase kind + `s` when unset.
    pub plural: Option<String>,
    /// Singular resource name; lowercase kind when unset.
    pub singular: Option<String>,
    /// Short names for kubectl.
    #[serde(default)]
    pub short_names: Vec<String>,
    /// Categories; `[percolator]` when unset.
    pub categories: Option<Vec<String>>,
    /// `Namespaced` (when unset) or `Cluster`.
    pub scope: Option<String>,
    /// The result label whose value names an object.
    pub name_label: String,
    /// Result labels copied to `metadata.labels` (label selectors select on them).
    #[serde(default)]
    pub labels: Vec<String>,
    /// `WINDOW` of this kind's queries; the configuration's window when unset.
    #[serde(default, deserialize_with = "de_duration")]
    pub window: Option<Duration>,
    /// Description of the kind (OpenAPI, `kubectl explain`).
    pub description: Option<String>,
    /// Joins the running pods whose label `label` equals the object's name.
    pub pods: Option<PodsJoinConfig>,
    /// The fields, each from one query; at least one.
    pub fields: Vec<DeclaredFieldConfig<Q>>,
}

/// The `pods` join of a declared kind.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct PodsJoinConfig {
    /// Pod label whose value is the object's name.
    pub label: String,
}

/// One field of a declared kind.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub struct DeclaredFieldConfig<Q> {
    /// JSON field name, lowerCamelCase.
    pub name: String,
    /// PromQL template (`SCOPE`, `WINDOW`).
    pub query: Q,
    /// `number` (when unset), `percent`, `cores`, `bytes`, `seconds` or `timestamp`.
    pub format: Option<String>,
    /// Printer column name; no column when unset.
    pub column: Option<String>,
    /// The column only with `-o wide`.
    #[serde(default)]
    pub wide: bool,
    /// Description of the field (OpenAPI, `kubectl explain`).
    pub description: Option<String>,
}

/// The file as YAML gives it: the known keys, and every other key as a kind section.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", bound(deserialize = "Q: Deserialize<'de>"))]
struct RawFile<Q> {
    #[serde(default, deserialize_with = "de_duration")]
    window: Option<Duration>,
    #[serde(default)]
    external_metrics: Option<Vec<ExternalMetricConfig<Q>>>,
    #[serde(default)]
    custom_metrics: Option<Vec<CustomMetricConfig<Q>>>,
    #[serde(default)]
    kinds: Vec<DeclaredKindConfig<Q>>,
    #[serde(default)]
    resource_queries: ResourceQueriesConfig<Q>,
    #[serde(flatten)]
    sections: BTreeMap<String, serde_json::Value>,
}

/// An optional Go duration (`5m`). Parsed inside the visitor, so a bad value is reported at
/// its own path and position (`kinds[2].window: invalid duration …`), not its parent's.
fn de_duration<'de, D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Option<Duration>, D::Error> {
    struct OptionalDuration;

    impl<'de> serde::de::Visitor<'de> for OptionalDuration {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("a duration such as 5m or 30s")
        }

        fn visit_none<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: serde::de::Error>(self) -> std::result::Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(
            self,
            d: D2,
        ) -> std::result::Result<Self::Value, D2::Error> {
            d.deserialize_str(self)
        }

        fn visit_str<E: serde::de::Error>(self, text: &str) -> std::result::Result<Self::Value, E> {
            duration::parse(text).map(Some).map_err(E::custom)
        }
    }

    d.deserialize_option(OptionalDuration)
}

impl<Q: serde::de::DeserializeOwned> QueryFile<Q> {
    /// Parses a document (empty means every default) and runs `check` on it; `path` only names
    /// it in errors.
    pub fn from_yaml(text: &str, path: &str, check: &Check<Q>) -> Result<Self> {
        let parse_error = |message: String| ConfigError::Parse { path: path.to_owned(), message };
        let mut file = if text.trim().is_empty() {
            QueryFile::default()
        } else {
            let raw: RawFile<Q> = super::yaml::from_str::<Option<RawFile<Q>>>(text)
                .map_err(|e| parse_error(e.to_string()))?
                .unwrap_or_else(|| RawFile {
                    window: None,
                    external_metrics: None,
                    custom_metrics: None,
                    kinds: Vec::new(),
                    resource_queries: ResourceQueriesConfig::default(),
                    sections: BTreeMap::new(),
                });
            let mut kind_queries = BTreeMap::new();
            for (key, value) in raw.sections {
                let queries: BTreeMap<String, Q> = serde_json::from_value(value)
                    .map_err(|e| parse_error(format!("{key}: expected a map of field to PromQL: {e}")))?;
                kind_queries.insert(key, queries);
            }
            QueryFile {
                declares: Declares {
                    external_metrics: raw.external_metrics.is_some(),
                    custom_metrics: raw.custom_metrics.is_some(),
                },
                window: raw.window,
                kind_queries,
                external_metrics: raw.external_metrics,
                custom_metrics: raw.custom_metrics,
                kinds: raw.kinds,
                resource_queries: raw.resource_queries,
            }
        };
        let invalid = |invalid: Invalid| ConfigError::Invalid { path: path.to_owned(), invalid };
        if file.window.is_some_and(|w| w < Duration::from_secs(1)) {
            return Err(invalid(Invalid::new("window", "must be at least 1s")));
        }
        check(&mut file).map_err(invalid)?;
        Ok(file)
    }
}

/// Why `path` could not be read.
fn read_error(path: &Path, source: std::io::Error) -> ConfigError {
    ConfigError::Read { path: path.display().to_string(), source }
}

/// One validated configuration in force, with its effective window.
#[derive(Debug)]
pub struct Snapshot<Q> {
    /// The file, checked, with its owners' defaults filled in.
    pub file: QueryFile<Q>,
    /// Range of the rates: `--window`, else the file's `window`, else [`DEFAULT_WINDOW`].
    pub window: Duration,
    /// Increases by one at every successful reload.
    pub generation: u64,
}

/// The query configuration in force, reloaded from `--config` when the file changes
/// ([`apiserver::files::WatchedFile`]). Readers take a [`Snapshot`] per request, so a reload
/// never disturbs requests in flight; an invalid new file is rejected with a log line and a
/// metric, and the last good configuration stays in force.
#[derive(Debug)]
pub struct LiveConfig<Q>(Arc<WatchedFile<Snapshot<Q>, ConfigError>>);

impl<Q: serde::de::DeserializeOwned + Send + Sync + 'static> LiveConfig<Q> {
    /// Loads `path` (defaults when `None`) through `check`; `window_flag` is `--window`.
    pub fn load(path: Option<&Path>, window_flag: Option<Duration>, check: Check<Q>) -> Result<Arc<Self>> {
        let (file, text) = match path {
            None => (QueryFile::from_yaml("", "defaults", &check)?, None),
            Some(p) => {
                let text = std::fs::read_to_string(p).map_err(|source| read_error(p, source))?;
                (QueryFile::from_yaml(&text, &p.display().to_string(), &check)?, Some(text))
            }
        };
        Ok(Arc::new(Self::with(file, path.map(Path::to_path_buf), window_flag, check, text)))
    }

    /// A fixed configuration, already checked (tests, or no `--config`).
    pub fn fixed(file: QueryFile<Q>, window_flag: Option<Duration>) -> Arc<Self> {
        Arc::new(Self::with(file, None, window_flag, Arc::new(|_: &mut QueryFile<Q>| Ok(())), None))
    }

    fn with(
        file: QueryFile<Q>,
        path: Option<PathBuf>,
        window_flag: Option<Duration>,
        check: Check<Q>,
        text: Option<String>,
    ) -> Self {
        let snapshot = move |file: QueryFile<Q>, generation| {
            let window = window_flag.or(file.window).unwrap_or(DEFAULT_WINDOW);
            Snapshot { file, window, generation }
        };
        let shown = path.as_ref().map(|p| p.display().to_string()).unwrap_or_default();
        let first = snapshot(file, 0);
        let parse = Box::new(move |text: &str, generation| {
            QueryFile::from_yaml(text, &shown, &check).map(|file| snapshot(file, generation))
        });
        Self(Arc::new(WatchedFile::new(path, text, first, parse, read_error)))
    }

    /// The configuration in force.
    pub fn current(&self) -> Arc<Snapshot<Q>> {
        self.0.current()
    }

    /// The generation of the configuration in force (0, then one more at every reload): a
    /// lock-free way to tell whether something built from an earlier one is still current.
    pub fn generation(&self) -> u64 {
        self.0.generation()
    }

    /// Re-reads the file; `Ok(true)` when a new configuration took effect, `Ok(false)` when
    /// the content is unchanged (or there is no file), `Err` when the new file is invalid (the
    /// old configuration stays).
    pub fn reload(&self) -> Result<bool> {
        self.0.reload()
    }

    /// Polls the file every `interval` and reloads it when it changed; `observe` is told the
    /// outcome of every attempted reload (`true` = applied).
    pub fn spawn_reloader(self: &Arc<Self>, interval: Duration, observe: impl Fn(bool) + Send + 'static) {
        self.0.spawn_reloader(interval, observe);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Accepts every file, as long as its only section is `known`.
    fn mk_check() -> Check<String> {
        Arc::new(|file: &mut QueryFile<String>| match file.kind_queries.keys().find(|k| *k != "known") {
            Some(key) => Err(Invalid::new(key.clone(), "unknown section")),
            None => Ok(()),
        })
    }

    #[test]
    fn reload_applies_valid_files_and_keeps_the_last_good_one() {
        let dir = std::env::temp_dir().join(format!("percolator-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("config.yaml");
        std::fs::write(&file, "window: 2m\n").unwrap();
        let live = LiveConfig::load(Some(&file), None, mk_check()).unwrap();
        assert_eq!(live.current().window, Duration::from_secs(120));
        assert!(!live.reload().unwrap(), "unchanged content is not a reload");
        std::fs::write(&file, "window: 3m\n").unwrap();
        assert!(live.reload().unwrap());
        assert_eq!(live.current().window, Duration::from_secs(180));
        assert_eq!(live.current().generation, 1);
        std::fs::write(&file, "window: 3m\nbogus: {a: b}\n").unwrap();
        let err = live.reload().unwrap_err().to_string();
        assert!(err.contains("field bogus: unknown section"), "{err}");
        assert_eq!(live.current().window, Duration::from_secs(180), "the last good configuration stays");
        assert!(!live.reload().unwrap(), "a rejected file is reported once");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn window_flag_wins_over_the_file() {
        let file = QueryFile::from_yaml("window: 2m\n", "f", &mk_check()).unwrap();
        let live = LiveConfig::fixed(file, Some(Duration::from_secs(30)));
        assert_eq!(live.current().window, Duration::from_secs(30));
    }

    #[test]
    fn empty_file_is_defaults() {
        assert_eq!(QueryFile::from_yaml("", "f", &mk_check()).unwrap(), QueryFile::default());
    }

    #[test]
    fn sections_are_maps_of_strings_named_in_errors() {
        let file = QueryFile::from_yaml("known:\n  a: x{SCOPE}\n", "f", &mk_check()).unwrap();
        assert_eq!(file.kind_query("known", "a").map(String::as_str), Some("x{SCOPE}"));
        assert_eq!(file.kind_query("known", "b"), None);
        let err = QueryFile::from_yaml("known: 3\n", "f.yaml", &mk_check()).unwrap_err().to_string();
        assert!(err.starts_with("--config f.yaml: known: expected a map"), "{err}");
    }

    #[test]
    fn window_is_parsed_and_validated() {
        let c = QueryFile::from_yaml("window: 2m\n", "f", &mk_check()).unwrap();
        assert_eq!(c.window, Some(Duration::from_secs(120)));
        let err = QueryFile::from_yaml("window: soon\n", "f", &mk_check()).unwrap_err().to_string();
        assert!(err.contains("soon"), "{err}");
        // A nested bad duration is reported at its own path.
        let nested = "externalMetrics:\n- name: a\n  query: x\n  window: soon\n";
        let err = QueryFile::from_yaml(nested, "f", &mk_check()).unwrap_err().to_string();
        assert!(err.starts_with("--config f: externalMetrics[0].window: "), "{err}");
        let err = QueryFile::from_yaml("window: 10ms\n", "f", &mk_check()).unwrap_err().to_string();
        assert_eq!(err, "--config f: field window: must be at least 1s");
    }

    #[test]
    fn external_metrics_parse() {
        let c = QueryFile::from_yaml(
            "externalMetrics:\n- name: queue_depth\n  query: max by (namespace, queue) (q{SCOPE})\n  labels: [queue]\n  window: 1m\n",
            "f",
            &mk_check(),
        )
        .unwrap();
        assert_eq!(
            c.external_metrics,
            Some(vec![ExternalMetricConfig {
                name: "queue_depth".into(),
                query: "max by (namespace, queue) (q{SCOPE})".into(),
                labels: vec!["queue".into()],
                window: Some(Duration::from_secs(60)),
            }])
        );
        let err =
            QueryFile::from_yaml("externalMetrics:\n- name: a\n  query: x\n  label: [a]\n", "f", &mk_check())
                .unwrap_err()
                .to_string();
        assert!(err.contains("label"), "{err}");
    }
}
