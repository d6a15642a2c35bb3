//! The compiled configuration: [`AdapterConfig::from_yaml`] reads a file, checks every rule
//! and compiles its regexes and templates once, and the compiled rules build the queries of
//! requests (`Build`, `BuildExternal` and the resource provider's queries).
//!
//! A rejected file names the path, the rule, the field and the construct:
//! `--adapter-config a.yaml: rules[1].seriesFilters[0]: both is and isNot`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use super::file::{self, ConfigFile};
use super::naming::{NameMapping, SeriesFilter};
use super::query::{self, Part, QueryError};
use super::resources::{self, LabelError, ResourceMapping};
use super::template::{Args, Field, Template};
use crate::sources::prometheus::{self, SCOPE_PLACEHOLDER, is_valid_label_name, validate_template};
use k8s_wire::GroupResource;
use k8s_wire::LabelSelector;

/// A configuration file that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AdapterError {
    /// The YAML is malformed, or has an unknown key or a value of the wrong shape.
    #[error("--adapter-config {path}: {message}")]
    Parse {
        /// The file.
        path: String,
        /// What the YAML reader said (with the key's path and position).
        message: String,
    },
    /// A field whose value is invalid or not supported.
    #[error("--adapter-config {path}: {field}: {message}")]
    Invalid {
        /// The file.
        path: String,
        /// The field (`rules[1].seriesFilters[0]`, `resourceRules.cpu.containerQuery`).
        field: String,
        /// What is wrong.
        message: String,
    },
}

/// A field and what is wrong with it.
#[derive(Debug)]
struct Invalid {
    field: String,
    message: String,
}

fn invalid(field: impl Into<String>, message: impl Into<String>) -> Invalid {
    Invalid { field: field.into(), message: message.into() }
}

/// Whether a rule is one of `rules` or of `externalRules`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RuleKind {
    /// `rules`: `custom.metrics.k8s.io`.
    Custom,
    /// `externalRules`: `external.metrics.k8s.io`.
    External,
}

/// One compiled rule of `rules` or `externalRules` (the adapter's `MetricNamer`).
#[derive(Debug, Clone)]
pub struct Rule {
    /// Which list the rule is in.
    pub kind: RuleKind,
    /// Its position in that list.
    pub index: usize,
    /// `seriesQuery`, passed to Prometheus' series API as is.
    pub series_query: String,
    /// `seriesFilters`, then the implicit `is` filter of a non-empty `name.matches`.
    filters: Vec<SeriesFilter>,
    /// `name`.
    name: NameMapping,
    /// `resources` (overrides and template).
    pub resources: ResourceMapping,
    /// `resources.namespaced` (default true): whether an external query carries the request's
    /// namespace. Always true for custom rules.
    pub namespaced: bool,
    /// `metricsQuery`.
    pub metrics_query: Template,
}

impl Rule {
    /// The rule as the configuration names it: `rules[2]`, `externalRules[0]`.
    pub fn field(&self) -> String {
        let list = match self.kind {
            RuleKind::Custom => "rules",
            RuleKind::External => "externalRules",
        };
        format!("{list}[{}]", self.index)
    }

    /// Whether a discovered series name passes every filter (`FilterSeries`).
    pub fn keeps_series(&self, series_name: &str) -> bool {
        self.filters.iter().all(|f| f.passes(series_name))
    }

    /// The API name of a series (`MetricNameForSeries`); `None` when `name.matches` does not
    /// match it.
    pub fn api_name(&self, series_name: &str) -> Option<String> {
        self.name.api_name(series_name)
    }

    /// The query of a custom metric (`Build`): `.LabelMatchers` holds the selector's
    /// matchers, then the namespace's (`namespace`, when given), then the objects'
    /// (`names`, when given: `=` for one, `=~` for more); `.GroupBy` is the resource's label.
    /// `names: None` leaves the objects to the caller (pods are picked from the inventory).
    pub fn query<S: AsRef<str>>(
        &self,
        series: &str,
        resource: &GroupResource,
        namespace: Option<&str>,
        selector: &LabelSelector,
        names: Option<&[S]>,
    ) -> Result<String, QueryError> {
        build(&self.metrics_query, &self.resources, series, resource, namespace, selector, names, &[])
    }

    /// The query of an external metric (`BuildExternal`): `.LabelMatchers` holds the
    /// selector's matchers, then the namespace's when the rule is namespaced; `.GroupBy` is
    /// empty.
    pub fn external_query(
        &self,
        series: &str,
        namespace: &str,
        selector: &LabelSelector,
    ) -> Result<String, QueryError> {
        let mut parts = query::selector_parts(selector)?;
        if self.namespaced && !namespace.is_empty() {
            let label = self
                .resources
                .label_for_resource(&resources::namespaces())
                .map_err(|e| QueryError::NoLabel(e.to_string()))?;
            parts.push(Part::equal(&label, namespace)?);
        }
        query::render(&self.metrics_query, series, &parts, &[])
    }
}

/// `Build`: the selector's parts, the namespace's, the objects'; grouped by the resource's
/// label and `extra_group_by`.
#[allow(clippy::too_many_arguments)]
fn build<S: AsRef<str>>(
    template: &Template,
    mapping: &ResourceMapping,
    series: &str,
    resource: &GroupResource,
    namespace: Option<&str>,
    selector: &LabelSelector,
    names: Option<&[S]>,
    extra_group_by: &[String],
) -> Result<String, QueryError> {
    let mut parts = query::selector_parts(selector)?;
    if let Some(namespace) = namespace.filter(|ns| !ns.is_empty()) {
        let label = mapping
            .label_for_resource(&resources::namespaces())
            .map_err(|e| QueryError::NoLabel(e.to_string()))?;
        parts.push(Part::equal(&label, namespace)?);
    }
    let resource_label =
        mapping.label_for_resource(resource).map_err(|e| QueryError::NoLabel(e.to_string()))?;
    if let Some(names) = names {
        parts.push(Part::names(&resource_label, names)?);
    }
    let mut group_by = vec![resource_label];
    group_by.extend(extra_group_by.iter().cloned());
    query::render(template, series, &parts, &group_by)
}

/// `resourceRules`, compiled.
#[derive(Debug, Clone)]
pub struct ResourceRules {
    /// `cpu`.
    pub cpu: ResourceRule,
    /// `memory`.
    pub memory: ResourceRule,
    /// `window`: the window the API reports (`None` when the file has none; the adapter then
    /// reports `0s`).
    pub window: Option<Duration>,
}

/// `resourceRules.cpu` or `resourceRules.memory`, compiled.
#[derive(Debug, Clone)]
pub struct ResourceRule {
    /// `containerQuery`.
    pub container_query: Template,
    /// `nodeQuery`.
    pub node_query: Template,
    /// `resources`: has labels for pods, namespaces and nodes (checked at load).
    pub resources: ResourceMapping,
    /// `containerLabel`: the label of the container name, grouped by in container queries.
    pub container_label: String,
}

impl ResourceRule {
    /// The container query of pods of one namespace (the resource provider's `Build` for
    /// pods): `.Series` empty, `.LabelMatchers` the namespace's and, when given, the pods'
    /// matchers; `.GroupBy` the pod label and the container label.
    pub fn query_pods<S: AsRef<str>>(
        &self,
        namespace: &str,
        pods: Option<&[S]>,
    ) -> Result<String, QueryError> {
        if namespace.is_empty() {
            // Without it the query would read the pods of every namespace.
            return Err(QueryError::NoNamespace);
        }
        build(
            &self.container_query,
            &self.resources,
            "",
            &GroupResource::new("", "pods"),
            Some(namespace),
            &LabelSelector::everything(),
            pods,
            std::slice::from_ref(&self.container_label),
        )
    }

    /// The node query: `.LabelMatchers` the nodes' matcher when names are given (empty
    /// otherwise: a template such as `{<<.LabelMatchers>>,id="/"}` then needs names),
    /// `.GroupBy` the node label.
    pub fn query_nodes<S: AsRef<str>>(&self, nodes: Option<&[S]>) -> Result<String, QueryError> {
        build(
            &self.node_query,
            &self.resources,
            "",
            &GroupResource::new("", "nodes"),
            None,
            &LabelSelector::everything(),
            nodes,
            &[],
        )
    }

    /// The label of pods, namespaces or nodes in this rule's series.
    pub fn label_for(&self, resource: &GroupResource) -> Result<String, LabelError> {
        self.resources.label_for_resource(resource)
    }
}

/// A compiled prometheus-adapter configuration file.
#[derive(Debug, Clone, Default)]
pub struct AdapterConfig {
    /// `rules`: custom metrics.
    pub rules: Vec<Rule>,
    /// `externalRules`: external metrics.
    pub external_rules: Vec<Rule>,
    /// `resourceRules`: `metrics.k8s.io`, when the file has them.
    pub resource_rules: Option<ResourceRules>,
}

impl AdapterConfig {
    /// Reads, checks and compiles a configuration file; `path` names it in errors. An empty
    /// document is an empty configuration.
    pub fn from_yaml(text: &str, path: &str) -> Result<Self, AdapterError> {
        let file: Option<ConfigFile> = crate::config::yaml::from_str(text)
            .map_err(|e| AdapterError::Parse { path: path.to_owned(), message: e.to_string() })?;
        Self::compile(&file.unwrap_or_default()).map_err(|Invalid { field, message }| AdapterError::Invalid {
            path: path.to_owned(),
            field,
            message,
        })
    }

    /// Checks and compiles a parsed file; the error is the field and what is wrong with it.
    fn compile(file: &ConfigFile) -> Result<Self, Invalid> {
        let rules = file
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| compile_rule(RuleKind::Custom, i, rule))
            .collect::<Result<_, _>>()?;
        let external_rules = file
            .external_rules
            .iter()
            .enumerate()
            .map(|(i, rule)| compile_rule(RuleKind::External, i, rule))
            .collect::<Result<_, _>>()?;
        let resource_rules = file.resource_rules.as_ref().map(compile_resource_rules).transpose()?;
        Ok(Self { rules, external_rules, resource_rules })
    }

    /// The distinct `seriesQuery`s of `rules` and `externalRules`: rules that share one are
    /// discovered with one call to the series API, as in the adapter.
    pub fn series_queries(&self) -> BTreeSet<&str> {
        self.rules.iter().chain(&self.external_rules).map(|r| r.series_query.as_str()).collect()
    }
}

/// The fields of a query template.
const QUERY_FIELDS: [Field; 5] =
    [Field::Series, Field::LabelMatchers, Field::LabelValuesByName, Field::GroupBy, Field::GroupBySlice];

/// Parses a query template and checks that it uses query fields only.
fn query_template(field: &str, text: &str) -> Result<Template, Invalid> {
    if text.trim().is_empty() {
        return Err(invalid(
            field,
            "required (the adapter has no default: an empty template renders an empty query, \
             and every request fails)",
        ));
    }
    let template = Template::parse(text).map_err(|e| invalid(field, e.to_string()))?;
    if let Some(other) = template.fields().into_iter().find(|f| !QUERY_FIELDS.contains(f)) {
        let allowed: Vec<String> = QUERY_FIELDS.iter().map(ToString::to_string).collect();
        return Err(invalid(
            field,
            format!("field {other} is not available here (only {} are)", allowed.join(", ")),
        ));
    }
    Ok(template)
}

/// Stands for `.Series` in the probe of [`check_scoped`].
const PROBE_SERIES: &str = "adapter_probe_series";

/// Checks that every selector of a query template carries `<<.LabelMatchers>>`, so a request
/// cannot read another namespace: the template is rendered with `.LabelMatchers` as
/// percolator's `SCOPE` placeholder and checked as percolator's own queries are.
fn check_scoped(field: &str, template: &Template) -> Result<(), Invalid> {
    let probe = template.render(&Args {
        series: PROBE_SERIES.to_owned(),
        label_matchers: SCOPE_PLACEHOLDER.to_owned(),
        group_by: "adapter_probe_label".to_owned(),
        group_by_slice: vec!["adapter_probe_label".to_owned()],
        ..Args::default()
    });
    let unprobe = |text: &str| {
        text.replace(SCOPE_PLACEHOLDER, "<<.LabelMatchers>>").replace(PROBE_SERIES, "<<.Series>>")
    };
    validate_template(&probe).map_err(|e| {
        let detail = match e {
            prometheus::Error::Template { at, reason } => {
                let near: String = probe.get(at..).unwrap_or_default().chars().take(50).collect();
                format!("{} near {:?}", unprobe(&reason), unprobe(&near))
            }
            prometheus::Error::Unscoped(selector) => format!(
                "the selector {} has no {{<<.LabelMatchers>>}} matchers and would read every namespace",
                unprobe(&selector)
            ),
            prometheus::Error::InvalidPromql(message) => {
                return invalid(field, format!("is not valid PromQL once rendered: {}", unprobe(&message)));
            }
            other => other.to_string(),
        };
        invalid(
            field,
            format!(
                "every selector must carry <<.LabelMatchers>>, so that a request reads only what it \
                 names (its namespace, its objects): {detail}"
            ),
        )
    })
}

/// A rule's `resources` (`at` names a field of the rule).
fn compile_resources(
    raw: &file::ResourceMapping,
    at: &dyn Fn(&str) -> String,
) -> Result<ResourceMapping, Invalid> {
    let overrides: BTreeMap<String, (String, String)> = raw
        .overrides
        .iter()
        .map(|(label, gr)| (label.clone(), (gr.group.clone(), gr.resource.clone())))
        .collect();
    ResourceMapping::new(&raw.template, &overrides)
        .map_err(|e| invalid(at(&format!("resources.{}", e.field)), e.message))
}

fn compile_rule(kind: RuleKind, index: usize, raw: &file::DiscoveryRule) -> Result<Rule, Invalid> {
    let list = match kind {
        RuleKind::Custom => "rules",
        RuleKind::External => "externalRules",
    };
    let at = |field: &str| format!("{list}[{index}].{field}");
    if raw.series_query.trim().is_empty() {
        return Err(invalid(at("seriesQuery"), "required"));
    }
    let mut filters = Vec::with_capacity(raw.series_filters.len() + 1);
    for (j, filter) in raw.series_filters.iter().enumerate() {
        let field = at(&format!("seriesFilters[{j}]"));
        let compiled = match (filter.is.is_empty(), filter.is_not.is_empty()) {
            (false, false) => return Err(invalid(field, "both is and isNot")),
            (true, true) => return Err(invalid(field, "one of is and isNot is required")),
            (false, true) => {
                SeriesFilter::is(&filter.is).map_err(|e| invalid(format!("{field}.is"), e.to_string()))?
            }
            (true, false) => SeriesFilter::is_not(&filter.is_not)
                .map_err(|e| invalid(format!("{field}.isNot"), e.to_string()))?,
        };
        filters.push(compiled);
    }
    let name = NameMapping::new(&raw.name.matches, &raw.name.as_)
        .map_err(|e| invalid(at(&format!("name.{}", e.field)), e.message))?;
    if !raw.name.matches.is_empty() {
        filters.push(
            SeriesFilter::is(&raw.name.matches).map_err(|e| invalid(at("name.matches"), e.to_string()))?,
        );
    }

    let resources = compile_resources(&raw.resources, &at)?;
    let namespaced = raw.resources.namespaced.unwrap_or(true);
    match kind {
        RuleKind::Custom => {
            if !namespaced {
                return Err(invalid(
                    at("resources.namespaced"),
                    "false has no effect in rules (the adapter applies it to externalRules only): remove it",
                ));
            }
            if resources.is_empty() {
                return Err(invalid(
                    at("resources"),
                    "overrides or template required: without them no series is associated with a \
                     resource, and the rule serves nothing",
                ));
            }
        }
        RuleKind::External => {
            if namespaced && let Err(e) = resources.label_for_resource(&resources::namespaces()) {
                return Err(invalid(
                    at("resources"),
                    format!(
                        "a namespaced external rule (the default) puts the request's namespace in the \
                         query, which needs a label for namespaces ({e}): add the override \
                         `namespace: {{resource: namespace}}`, or set namespaced: false"
                    ),
                ));
            }
        }
    }

    let metrics_query = query_template(&at("metricsQuery"), &raw.metrics_query)?;
    if kind == RuleKind::Custom || namespaced {
        check_scoped(&at("metricsQuery"), &metrics_query)?;
    }
    Ok(Rule {
        kind,
        index,
        series_query: raw.series_query.clone(),
        filters,
        name,
        resources,
        namespaced,
        metrics_query,
    })
}

fn compile_resource_rules(raw: &file::ResourceRules) -> Result<ResourceRules, Invalid> {
    Ok(ResourceRules {
        cpu: compile_resource_rule("resourceRules.cpu", &raw.cpu)?,
        memory: compile_resource_rule("resourceRules.memory", &raw.memory)?,
        window: raw.window,
    })
}

fn compile_resource_rule(field: &str, raw: &file::ResourceRule) -> Result<ResourceRule, Invalid> {
    let at = |name: &str| format!("{field}.{name}");
    let container_query = query_template(&at("containerQuery"), &raw.container_query)?;
    check_scoped(&at("containerQuery"), &container_query)?;
    let node_query = query_template(&at("nodeQuery"), &raw.node_query)?;
    let resources = compile_resources(&raw.resources, &at)?;
    if raw.resources.namespaced == Some(false) {
        return Err(invalid(
            at("resources.namespaced"),
            "false has no effect in resourceRules (the adapter applies it to externalRules only): remove it",
        ));
    }
    for needed in ["pods", "namespaces", "nodes"] {
        resources.label_for_resource(&GroupResource::new("", needed)).map_err(|e| {
            invalid(at("resources"), format!("{e} (resource rules query pods in a namespace, and nodes)"))
        })?;
    }
    if raw.container_label.is_empty() {
        return Err(invalid(at("containerLabel"), "required"));
    }
    if !is_valid_label_name(&raw.container_label) {
        return Err(invalid(at("containerLabel"), "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
    }
    Ok(ResourceRule { container_query, node_query, resources, container_label: raw.container_label.clone() })
}
