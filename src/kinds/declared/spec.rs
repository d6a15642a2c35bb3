//! What a declared kind is, once its `kinds:` entry of the file has been checked: the
//! [`DeclaredSpec`] the computation and the HTTP layer read, and the check of the whole
//! `kinds:` list ([`check_declared`]) that rejects a file naming the kind and field at fault.

use std::borrow::Cow;
use std::time::Duration;

use crate::config::{DeclaredFieldConfig, DeclaredKindConfig, Invalid, QueryFile};
use crate::kinds::{Builtin, Column, KindInfo, Text};
use crate::sources::prometheus::{Template, is_valid_label_name};
use k8s_wire::go_quote;
use k8s_wire::{is_dns1123_label, is_qualified_name};

/// How a field's value is published (JSON and Table cell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Quantity; cell with up to two decimals.
    Number,
    /// A ratio, as a Quantity; cell a percentage with one decimal (`4.0%`).
    Percent,
    /// CPU cores, as `kubectl top` prints them (`250m`).
    Cores,
    /// Bytes, as `kubectl top` prints them (`128Mi`).
    Bytes,
    /// Seconds, as a duration (`28s`).
    Seconds,
    /// Unix seconds in the data; RFC 3339 in JSON, an age in the cell.
    Timestamp,
}

impl Format {
    /// Every format, by its name in the file.
    pub const ALL: [(&'static str, Format); 6] = [
        ("number", Format::Number),
        ("percent", Format::Percent),
        ("cores", Format::Cores),
        ("bytes", Format::Bytes),
        ("seconds", Format::Seconds),
        ("timestamp", Format::Timestamp),
    ];

    /// The format named `name` in the file.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

/// One field of a declared kind.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSpec {
    /// JSON field name (lowerCamelCase).
    pub name: String,
    /// PromQL template, compiled when the file was read.
    pub query: Template,
    /// How the value is published.
    pub format: Format,
    /// Printer column, if any.
    pub column: Option<String>,
    /// The column only with `-o wide`.
    pub wide: bool,
    /// Description (OpenAPI).
    pub description: String,
}

/// A checked declared kind, every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredSpec {
    /// Names, scope and description, as discovery and OpenAPI publish them.
    pub info: KindInfo,
    /// The result label whose value names an object.
    pub name_label: String,
    /// Result labels copied to `metadata.labels`.
    pub labels: Vec<String>,
    /// `WINDOW` of this kind's queries, when it has its own.
    pub window: Option<Duration>,
    /// Pod label of the `pods` join, if any.
    pub pods_label: Option<String>,
    /// The fields, in the file's order.
    pub fields: Vec<FieldSpec>,
    /// Table columns: Name, the fields' columns, then (with the pods join) PODS, CPU, MEMORY
    /// (wide).
    pub columns: Vec<Column>,
}

/// Field names no declared field may take: every object has them.
pub(crate) const RESERVED_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "timestamp", "window"];
/// Field names the `pods` join adds (reserved too when the kind has the join).
pub(crate) const POD_JOIN_FIELDS: [&str; 3] = ["pods", "cpu", "memory"];

/// Categories of a kind that does not set `categories`.
pub(crate) const DEFAULT_CATEGORIES: [&str; 1] = ["percolator"];
/// Scope of a kind that does not set `scope`.
pub(crate) const NAMESPACED: &str = "Namespaced";
/// The other scope.
pub(crate) const CLUSTER: &str = "Cluster";
/// Longest kind name: a DNS-1123 label's, as its lowercase form is the default singular.
const MAX_KIND_LEN: usize = 63;
/// Longest column name.
const MAX_COLUMN_LEN: usize = 63;
/// The columns the `pods` join adds (after the fields' columns).
const POD_JOIN_COLUMNS: [&str; 3] = ["Pods", "CPU", "Memory"];
/// The label every Namespaced kind's results keep.
const NAMESPACE_LABEL: &str = "namespace";

/// The plural of a kind that does not set `plural`: lowercase kind + `s`.
pub(crate) fn default_plural(kind: &str) -> String {
    format!("{}s", kind.to_ascii_lowercase())
}

/// The singular of a kind that does not set `singular`: lowercase kind.
pub(crate) fn default_singular(kind: &str) -> String {
    kind.to_ascii_lowercase()
}

/// The description of a kind that does not set `description`.
pub(crate) fn default_description(kind: &str) -> String {
    format!(
        "{kind} is declared in the percolator configuration and computed at request time from Prometheus."
    )
}

/// A kind name already in use: by a built-in kind, or by the declared kind at an index.
struct KindName {
    kind: String,
    /// Index of the declared kind; `None` for a built-in one.
    declared: Option<usize>,
}

impl KindName {
    /// Who has the kind, as messages say it.
    fn owner(&self) -> String {
        match self.declared {
            Some(index) => format!("declared by kinds[{index}]"),
            None => "a built-in kind".to_owned(),
        }
    }
}

/// A name kubectl resolves (plural, singular or short name), and whose it is.
struct ResourceName {
    name: String,
    /// `plural`, `singular` or `short name`.
    role: &'static str,
    /// The plural of the kind that has it.
    of: String,
}

/// Everything the kinds checked so far (built-in, then declared in order) have claimed.
struct Claimed {
    kinds: Vec<KindName>,
    names: Vec<ResourceName>,
}

impl Claimed {
    fn new(builtin: &[&Builtin]) -> Self {
        let mut claimed = Self { kinds: Vec::new(), names: Vec::new() };
        for kind in builtin {
            let info = kind.info;
            claimed.kinds.push(KindName { kind: info.kind.to_string(), declared: None });
            let of = info.plural.to_string();
            claimed.names.push(ResourceName { name: of.clone(), role: "plural", of: of.clone() });
            if info.singular != info.plural {
                claimed.names.push(ResourceName {
                    name: info.singular.to_string(),
                    role: "singular",
                    of: of.clone(),
                });
            }
            for short in info.short_names.iter() {
                claimed.names.push(ResourceName {
                    name: short.to_string(),
                    role: "short name",
                    of: of.clone(),
                });
            }
        }
        claimed
    }

    /// Why `kind` cannot be declared, if it cannot.
    fn check_kind(&self, kind: &str) -> Result<(), NameError> {
        if kind.is_empty() {
            return Err(NameError::Empty);
        }
        let mut bytes = kind.bytes();
        let camel =
            bytes.next().is_some_and(|b| b.is_ascii_uppercase()) && bytes.all(|b| b.is_ascii_alphanumeric());
        if !camel {
            return Err(NameError::NotUpperCamelCase(kind.to_owned()));
        }
        if kind.len() > MAX_KIND_LEN {
            return Err(NameError::TooLong(kind.to_owned()));
        }
        for other in &self.kinds {
            if other.kind == kind {
                return Err(NameError::KindTaken { kind: kind.to_owned(), owner: other.owner() });
            }
            if format!("{}List", other.kind) == kind {
                return Err(NameError::ListKindOf {
                    kind: kind.to_owned(),
                    other: other.kind.clone(),
                    owner: other.owner(),
                });
            }
            if format!("{kind}List") == other.kind {
                return Err(NameError::WouldListAs {
                    kind: kind.to_owned(),
                    other: other.kind.clone(),
                    owner: other.owner(),
                });
            }
        }
        Ok(())
    }

    /// Claims `name` as the `role` of the kind `of`, unless another kind (or this one, in
    /// another role) already has it.
    fn claim(&mut self, name: &str, role: &'static str, of: &str) -> Result<(), NameError> {
        if let Some(taken) = self.names.iter().find(|n| n.name == name) {
            return Err(NameError::NameTaken {
                name: name.to_owned(),
                role: taken.role,
                of: taken.of.clone(),
            });
        }
        self.names.push(ResourceName { name: name.to_owned(), role, of: of.to_owned() });
        Ok(())
    }
}

/// Why a declared kind's name, one of its resource names or a label is refused: the message
/// of the field's [`Invalid`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum NameError {
    /// An empty kind.
    #[error("must not be empty")]
    Empty,
    /// A kind that is not `[A-Z][A-Za-z0-9]*`.
    #[error("{} is not UpperCamelCase ([A-Z][A-Za-z0-9]*)", go_quote(.0))]
    NotUpperCamelCase(String),
    /// A kind longer than [`MAX_KIND_LEN`].
    #[error("{} is longer than {MAX_KIND_LEN} characters", go_quote(.0))]
    TooLong(String),
    /// A kind another kind has.
    #[error("{} is already {owner}", go_quote(.kind))]
    KindTaken { kind: String, owner: String },
    /// The list kind of another kind.
    #[error("{} is the list kind of {other}, {owner}", go_quote(.kind))]
    ListKindOf { kind: String, other: String, owner: String },
    /// A kind whose list kind another kind has.
    #[error("{} would list as {other}, already {owner}", go_quote(.kind))]
    WouldListAs { kind: String, other: String, owner: String },
    /// A resource name (plural, singular, short name) another kind has, or this one in
    /// another role.
    #[error("{} is already the {role} of {of}", go_quote(.name))]
    NameTaken { name: String, role: &'static str, of: String },
    /// Not a DNS-1123 label.
    #[error("{} is not a valid {what}: {}", go_quote(.value), .errors.join("; "))]
    DnsLabel { value: String, what: &'static str, errors: Vec<String> },
    /// Not a Kubernetes label key.
    #[error("{} is not a valid Kubernetes label key: {}", go_quote(.value), .errors.join("; "))]
    LabelKey { value: String, errors: Vec<String> },
    /// Not a Prometheus label name.
    #[error("{} is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)", go_quote(.0))]
    PrometheusLabel(String),
}

/// `value` as a DNS-1123 label, the `what` of a kind.
fn check_dns_label(value: &str, what: &'static str) -> Result<(), NameError> {
    let errors = is_dns1123_label(value);
    if errors.is_empty() {
        return Ok(());
    }
    Err(NameError::DnsLabel { value: value.to_owned(), what, errors })
}

/// `value` as a Kubernetes label key.
fn check_label_key(value: &str) -> Result<(), NameError> {
    let errors = is_qualified_name(value);
    if errors.is_empty() {
        return Ok(());
    }
    Err(NameError::LabelKey { value: value.to_owned(), errors })
}

/// `value` as a Prometheus label name.
fn check_prometheus_label(value: &str) -> Result<(), NameError> {
    if is_valid_label_name(value) {
        return Ok(());
    }
    Err(NameError::PrometheusLabel(value.to_owned()))
}

/// Checks the `kinds:` list of `file` against itself and the built-in kinds, and fills the
/// defaults in (plural, singular, categories, scope, description; each field's format and
/// description). A file is rejected whole: the error names the kind (`kinds[AppTraffic]`, or
/// `kinds[2]` when it has no valid kind name), the field and what is wrong.
pub(crate) fn check_declared(file: &mut QueryFile<Template>, builtin: &[&Builtin]) -> Result<(), Invalid> {
    let mut claimed = Claimed::new(builtin);
    for (index, config) in file.kinds.iter_mut().enumerate() {
        check_kind(index, config, &mut claimed)?;
    }
    Ok(())
}

/// Checks one declared kind (the one at `index`) and fills its defaults in.
fn check_kind(
    index: usize,
    config: &mut DeclaredKindConfig<Template>,
    claimed: &mut Claimed,
) -> Result<(), Invalid> {
    let kind = config.kind.clone();
    claimed.check_kind(&kind).map_err(|e| Invalid::new(format!("kinds[{index}].kind"), e.to_string()))?;
    claimed.kinds.push(KindName { kind: kind.clone(), declared: Some(index) });
    let at = |field: &str| format!("kinds[{kind}].{field}");
    let invalid = |field: &str| {
        let path = at(field);
        move |e: NameError| Invalid::new(path, e.to_string())
    };

    let plural = config.plural.get_or_insert_with(|| default_plural(&kind)).clone();
    check_dns_label(&plural, "plural").map_err(invalid("plural"))?;
    claimed.claim(&plural, "plural", &plural).map_err(invalid("plural"))?;
    let singular = config.singular.get_or_insert_with(|| default_singular(&kind)).clone();
    check_dns_label(&singular, "singular").map_err(invalid("singular"))?;
    // Like `endpoints`, a singular may equal its own plural (`cafebrewstats`).
    if singular != plural {
        claimed.claim(&singular, "singular", &plural).map_err(invalid("singular"))?;
    }
    for (i, short) in config.short_names.iter().enumerate() {
        let field = format!("shortNames[{i}]");
        check_dns_label(short, "short name").map_err(invalid(&field))?;
        claimed.claim(short, "short name", &plural).map_err(invalid(&field))?;
    }
    let categories =
        config.categories.get_or_insert_with(|| DEFAULT_CATEGORIES.iter().map(|c| (*c).to_owned()).collect());
    for (i, category) in categories.iter().enumerate() {
        check_dns_label(category, "category").map_err(invalid(&format!("categories[{i}]")))?;
    }

    let scope = config.scope.get_or_insert_with(|| NAMESPACED.to_owned());
    let namespaced = match scope.as_str() {
        NAMESPACED => true,
        CLUSTER => false,
        other => {
            return Err(Invalid::new(
                at("scope"),
                format!("{} is not a scope: expected {NAMESPACED} or {CLUSTER}", go_quote(other)),
            ));
        }
    };

    let name_label = config.name_label.clone();
    check_prometheus_label(&name_label).map_err(invalid("nameLabel"))?;
    if name_label == "__name__" {
        return Err(Invalid::new(
            at("nameLabel"),
            "\"__name__\" is the metric name, not a label that can name objects",
        ));
    }
    if namespaced && name_label == NAMESPACE_LABEL {
        return Err(Invalid::new(
            at("nameLabel"),
            "\"namespace\" places the objects of a Namespaced kind and cannot also name them; \
             use scope: Cluster for one object per namespace",
        ));
    }

    for (i, label) in config.labels.iter().enumerate() {
        let field = format!("labels[{i}]");
        check_prometheus_label(label).map_err(invalid(&field))?;
        check_label_key(label).map_err(invalid(&field))?;
        if let Some(first) = config.labels[..i].iter().position(|l| l == label) {
            return Err(Invalid::new(
                at(&field),
                format!("duplicate label {} (also labels[{first}])", go_quote(label)),
            ));
        }
    }
    if config.window.is_some_and(|w| w < Duration::from_secs(1)) {
        return Err(Invalid::new(at("window"), "must be at least 1s"));
    }
    config.description.get_or_insert_with(|| default_description(&kind));
    if let Some(pods) = &config.pods {
        check_label_key(&pods.label).map_err(invalid("pods.label"))?;
    }

    if config.fields.is_empty() {
        return Err(Invalid::new(at("fields"), "must list at least one field"));
    }
    let joined = config.pods.is_some();
    for i in 0..config.fields.len() {
        let (earlier, rest) = config.fields.split_at_mut(i);
        let Some(field) = rest.first_mut() else { break };
        check_field(i, field, earlier, joined).map_err(|(path, message)| Invalid::new(at(&path), message))?;
        let query_at = format!("fields[{}].query", field.name);
        let query = &field.query;
        let scoped = if namespaced { query.check_scoped() } else { query.check() };
        scoped.map_err(|e| Invalid::new(at(&query_at), e.to_string()))?;
        query.keeps_label(&name_label).map_err(|message| {
            Invalid::new(at(&query_at), format!("{message}, which names the objects (nameLabel)"))
        })?;
        if namespaced {
            query.keeps_label(NAMESPACE_LABEL).map_err(|message| {
                Invalid::new(
                    at(&query_at),
                    format!("{message}, which places the objects of a Namespaced kind"),
                )
            })?;
        }
    }
    Ok(())
}

/// Checks one field (at `index`, after `earlier`) but its query, and fills its defaults in; the
/// error is the field path under the kind and the message.
fn check_field(
    index: usize,
    field: &mut DeclaredFieldConfig<Template>,
    earlier: &[DeclaredFieldConfig<Template>],
    joined: bool,
) -> Result<(), (String, String)> {
    let name = field.name.clone();
    let name_error = |message: String| (format!("fields[{index}].name"), message);
    let quoted = go_quote(&name);
    let mut bytes = name.bytes();
    let camel =
        bytes.next().is_some_and(|b| b.is_ascii_lowercase()) && bytes.all(|b| b.is_ascii_alphanumeric());
    if !camel {
        return Err(name_error(format!("{quoted} is not lowerCamelCase ([a-z][A-Za-z0-9]*)")));
    }
    if RESERVED_FIELDS.contains(&name.as_str()) {
        return Err(name_error(format!("{quoted} is reserved: every object has it")));
    }
    if joined && POD_JOIN_FIELDS.contains(&name.as_str()) {
        return Err(name_error(format!("{quoted} is reserved: the pods join adds it")));
    }
    if let Some(first) = earlier.iter().position(|f| f.name == name) {
        return Err(name_error(format!("duplicate field {quoted} (also fields[{first}])")));
    }
    let at = |what: &str| format!("fields[{name}].{what}");

    let format = field.format.get_or_insert_with(|| "number".to_owned());
    if Format::parse(format).is_none() {
        let names: Vec<&str> = Format::ALL.iter().map(|(n, _)| *n).collect();
        return Err((
            at("format"),
            format!("{} is not a format: expected one of {}", go_quote(format), names.join(", ")),
        ));
    }

    if let Some(column) = &field.column {
        let quoted = go_quote(column);
        let message = if column.is_empty() {
            Some("must not be empty; leave column out for no column".to_owned())
        } else if column.len() > MAX_COLUMN_LEN {
            Some(format!("{quoted} is longer than {MAX_COLUMN_LEN} characters"))
        } else if column.eq_ignore_ascii_case("Name") {
            Some(format!("{quoted} is the first column of every kind, the object's name"))
        } else if joined && POD_JOIN_COLUMNS.iter().any(|c| c.eq_ignore_ascii_case(column)) {
            Some(format!("{quoted} is a column of the pods join ({})", POD_JOIN_COLUMNS.join(", ")))
        } else {
            earlier.iter().find_map(|other| {
                let theirs = other.column.as_deref().filter(|c| c.eq_ignore_ascii_case(column))?;
                Some(format!(
                    "duplicate column {quoted}: field {} has {} (kubectl prints column names in upper case)",
                    other.name,
                    go_quote(theirs)
                ))
            })
        };
        if let Some(message) = message {
            return Err((at("column"), message));
        }
    } else if field.wide {
        return Err((at("wide"), "has no column to show: set column too, or leave wide out".to_owned()));
    }
    field.description.get_or_insert_with(String::new);
    Ok(())
}

impl DeclaredSpec {
    /// The spec of an entry that [`check_declared`] accepted (defaults filled in; an unset one
    /// takes its default here too).
    pub fn from_config(config: &DeclaredKindConfig<Template>) -> Self {
        let kind = config.kind.clone();
        let owned = |texts: &[String]| -> Cow<'static, [Text]> {
            Cow::Owned(texts.iter().map(|t| Text::Owned(t.clone())).collect())
        };
        let categories = match &config.categories {
            Some(categories) => owned(categories),
            None => Cow::Owned(DEFAULT_CATEGORIES.iter().map(|c| Text::Borrowed(*c)).collect()),
        };
        let info = KindInfo {
            gv: crate::kinds::STATS,
            plural: Text::Owned(config.plural.clone().unwrap_or_else(|| default_plural(&kind))),
            singular: Text::Owned(config.singular.clone().unwrap_or_else(|| default_singular(&kind))),
            list_kind: Text::Owned(format!("{kind}List")),
            short_names: owned(&config.short_names),
            categories,
            namespaced: config.scope.as_deref() != Some(CLUSTER),
            description: Text::Owned(
                config.description.clone().unwrap_or_else(|| default_description(&kind)),
            ),
            typed_list_items: true,
            kind: Text::Owned(kind.clone()),
        };
        let fields: Vec<FieldSpec> = config
            .fields
            .iter()
            .map(|field| FieldSpec {
                name: field.name.clone(),
                query: field.query.clone(),
                format: field.format.as_deref().and_then(Format::parse).unwrap_or(Format::Number),
                column: field.column.clone(),
                wide: field.wide,
                description: field.description.clone().unwrap_or_default(),
            })
            .collect();

        let mut columns = vec![Column {
            description: Text::Owned(format!("Name of the {kind}.")),
            ..Column::object_name("")
        }];
        for field in &fields {
            let Some(name) = &field.column else { continue };
            let format = match field.format {
                Format::Cores | Format::Bytes => "quantity",
                Format::Seconds => "duration",
                Format::Number | Format::Percent | Format::Timestamp => "",
            };
            let description = if field.description.is_empty() {
                format!("{}.", field.name)
            } else {
                field.description.clone()
            };
            columns.push(Column {
                name: Text::Owned(name.clone()),
                type_: Text::Borrowed("string"),
                format: Text::Borrowed(format),
                description: Text::Owned(description),
                priority: i32::from(field.wide),
            });
        }
        if config.pods.is_some() {
            // As CafeBrewStats' serving pods.
            columns.extend([
                Column::text("Pods", "Serving pods running.").wide(),
                Column::quantity("CPU", "CPU of the serving pods.").wide(),
                Column::quantity("Memory", "Memory working set of the serving pods.").wide(),
            ]);
        }

        Self {
            info,
            name_label: config.name_label.clone(),
            labels: config.labels.clone(),
            window: config.window,
            pods_label: config.pods.as_ref().map(|p| p.label.clone()),
            fields,
            columns,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::config::{Check, PodsJoinConfig};
    use crate::kinds::registry::BUILTIN;

    /// The example of docs/reference/kinds.md.
    const EXAMPLE: &str = r#"
kinds:
- kind: AppTraffic                 # required, UpperCamelCase, unique, not a built-in kind
  plural: apptraffics              # default: lowercase kind + "s"
  singular: apptraffic             # default: lowercase kind
  shortNames: [atr]                # default: none
  categories: [percolator]         # default: [percolator]
  scope: Namespaced                # Namespaced (default) | Cluster
  nameLabel: pod                   # required: the result label whose value names an object
  labels: [tier]                   # optional: result labels copied to metadata.labels (-l selects on them)
  window: 2m                       # optional: WINDOW for this kind
  description: HTTP traffic per pod, from Prometheus.
  pods:                            # optional: join running pods whose label equals the object's name
    label: une-tasse-de.cafe/cafe  #   adds pods (count), cpu, memory (kubelet sums): wide columns PODS, CPU, MEMORY
  fields:                          # required, at least one
  - name: requestsPerSecond        # lowerCamel JSON field; not apiVersion, kind, metadata, timestamp, window
    query: sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))
    format: number                 # number | percent | cores | bytes | seconds | timestamp
    column: REQ/S                  # optional printer column
    wide: false                    # optional: column only with -o wide
    description: Requests per second over the window.
"#;

    /// A field whose query keeps every label.
    const FIELD: &str = "fields: [{name: rps, query: 'x{SCOPE}'}]";

    fn load(yaml: &str) -> Result<QueryFile<Template>, String> {
        let check: Check<Template> = Arc::new(|file: &mut QueryFile<Template>| check_declared(file, BUILTIN));
        QueryFile::from_yaml(yaml, "f.yaml", &check).map_err(|e| e.to_string())
    }

    /// A file declaring `entries` (YAML flow mappings, one per kind).
    fn mk_file(entries: &[String]) -> String {
        let mut yaml = "kinds:\n".to_owned();
        for entry in entries {
            yaml.push_str(&format!("- {entry}\n"));
        }
        yaml
    }

    /// One `AppTraffic` kind named by `pod`, with `extra` keys.
    fn mk_kind(extra: &str) -> String {
        format!("{{kind: AppTraffic, nameLabel: pod, {extra}}}")
    }

    fn dns_label_error(value: &str) -> String {
        is_dns1123_label(value).join("; ")
    }

    fn config_error(field: &str, message: &str) -> Result<QueryFile<Template>, String> {
        Err(format!("--config f.yaml: field {field}: {message}"))
    }

    #[test]
    fn kind_names() {
        let long = format!("A{}", "b".repeat(63));
        let too_long = format!("\"{long}\" is longer than 63 characters");
        for (kind, message) in [
            ("''", "must not be empty"),
            ("appTraffic", "\"appTraffic\" is not UpperCamelCase ([A-Z][A-Za-z0-9]*)"),
            ("App_Traffic", "\"App_Traffic\" is not UpperCamelCase ([A-Z][A-Za-z0-9]*)"),
            (long.as_str(), too_long.as_str()),
            ("PodMetricsSummary", "\"PodMetricsSummary\" is already a built-in kind"),
            ("CafeBrewStatsList", "\"CafeBrewStatsList\" is the list kind of CafeBrewStats, a built-in kind"),
        ] {
            let entry = format!("{{kind: {kind}, nameLabel: pod, {FIELD}}}");
            assert_eq!(load(&mk_file(&[entry])), config_error("kinds[0].kind", message), "{kind}");
        }
        // A second AppTraffic, after one that already took its name.
        for (first, message) in [
            (mk_kind(FIELD), "\"AppTraffic\" is already declared by kinds[0]"),
            (
                format!("{{kind: AppTrafficList, plural: atl, nameLabel: pod, {FIELD}}}"),
                "\"AppTraffic\" would list as AppTrafficList, already declared by kinds[0]",
            ),
        ] {
            let entries = [first, mk_kind(FIELD)];
            assert_eq!(load(&mk_file(&entries)), config_error("kinds[1].kind", message), "{entries:?}");
        }
        let err = load(&mk_file(&[format!("{{nameLabel: pod, {FIELD}}}")])).unwrap_err();
        assert_eq!(err, "--config f.yaml: kinds[0]: missing field `kind` at line 2 column 20");
    }

    #[test]
    fn resource_names_are_dns_labels_and_unique() {
        const PMS: &str = "podmetricssummaries";
        let app = |extra: &str| mk_kind(&format!("{extra} {FIELD}"));
        let other = |extra: &str| format!("{{kind: Other, nameLabel: pod, {extra} {FIELD}}}");
        let not_dns_label = |value: &str, what: &str| {
            format!("\"{value}\" is not a valid {what}: {}", dns_label_error(value))
        };
        let taken = |name: &str, role: &str, of: &str| format!("\"{name}\" is already the {role} of {of}");
        for (extra, field, message) in [
            ("plural: App,", "plural", not_dns_label("App", "plural")),
            (
                "singular: app.traffic,",
                "singular",
                "\"app.traffic\" is not a valid singular: must not contain dots".to_owned(),
            ),
            ("shortNames: [at-],", "shortNames[0]", not_dns_label("at-", "short name")),
            ("categories: [percolator, Web],", "categories[1]", not_dns_label("Web", "category")),
            // Names of the built-in kinds.
            ("plural: podmetricssummaries,", "plural", taken(PMS, "plural", PMS)),
            ("singular: podmetricssummary,", "singular", taken("podmetricssummary", "singular", PMS)),
            ("singular: pms,", "singular", taken("pms", "short name", PMS)),
            ("singular: cafebrewstats,", "singular", taken("cafebrewstats", "plural", "cafebrewstats")),
            ("shortNames: [atr, brews],", "shortNames[1]", taken("brews", "short name", "cafebrewstats")),
            // Within one kind.
            ("shortNames: [atr, atr],", "shortNames[1]", taken("atr", "short name", "apptraffics")),
            ("shortNames: [apptraffic],", "shortNames[0]", taken("apptraffic", "singular", "apptraffics")),
        ] {
            let want = config_error(&format!("kinds[AppTraffic].{field}"), &message);
            assert_eq!(load(&mk_file(&[app(extra)])), want, "{extra}");
        }
        // A default plural can collide too.
        let entry = format!("{{kind: Podmetricssummarie, nameLabel: pod, {FIELD}}}");
        assert_eq!(
            load(&mk_file(&[entry])),
            config_error("kinds[Podmetricssummarie].plural", &taken(PMS, "plural", PMS))
        );
        // Across declared kinds: Other takes a name of AppTraffic's.
        for (first, second, field, name, role) in [
            ("shortNames: [atr],", "singular: atr,", "singular", "atr", "short name"),
            ("", "shortNames: [apptraffic],", "shortNames[0]", "apptraffic", "singular"),
            ("", "plural: apptraffics,", "plural", "apptraffics", "plural"),
        ] {
            let want = config_error(&format!("kinds[Other].{field}"), &taken(name, role, "apptraffics"));
            assert_eq!(load(&mk_file(&[app(first), other(second)])), want, "{second}");
        }
        // A singular equal to its own plural (like cafebrewstats), and no categories at all.
        let file = load(&mk_file(&[mk_kind(&format!(
            "plural: apptraffic, singular: apptraffic, categories: [], {FIELD}"
        ))]))
        .unwrap();
        let spec = DeclaredSpec::from_config(&file.kinds[0]);
        assert_eq!((&*spec.info.plural, &*spec.info.singular), ("apptraffic", "apptraffic"));
        assert_eq!(spec.info.categories.len(), 0);
    }

    #[test]
    fn scope_and_labels() {
        let not_label_key = |value: &str| {
            format!(
                "\"{value}\" is not a valid Kubernetes label key: {}",
                is_qualified_name(value).join("; ")
            )
        };
        for (extra, field, message) in [
            (
                "scope: namespaced,",
                "scope",
                "\"namespaced\" is not a scope: expected Namespaced or Cluster".to_owned(),
            ),
            (
                "labels: [app.kubernetes.io/name],",
                "labels[0]",
                "\"app.kubernetes.io/name\" is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"
                    .to_owned(),
            ),
            ("labels: [tier, tier_],", "labels[1]", not_label_key("tier_")),
            (
                "labels: [tier, version, tier],",
                "labels[2]",
                "duplicate label \"tier\" (also labels[0])".to_owned(),
            ),
            ("window: 500ms,", "window", "must be at least 1s".to_owned()),
            ("pods: {label: a/b/c},", "pods.label", not_label_key("a/b/c")),
            ("fields: []", "fields", "must list at least one field".to_owned()),
        ] {
            let extra =
                if extra.starts_with("fields") { extra.to_owned() } else { format!("{extra} {FIELD}") };
            let want = config_error(&format!("kinds[AppTraffic].{field}"), &message);
            assert_eq!(load(&mk_file(&[mk_kind(&extra)])), want, "{extra}");
        }
        for (name_label, scope, message) in [
            (
                "app.kubernetes.io/name",
                "Namespaced",
                "\"app.kubernetes.io/name\" is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)",
            ),
            ("''", "Namespaced", "\"\" is not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"),
            ("__name__", "Cluster", "\"__name__\" is the metric name, not a label that can name objects"),
            (
                "namespace",
                "Namespaced",
                "\"namespace\" places the objects of a Namespaced kind and cannot also name them; use \
                 scope: Cluster for one object per namespace",
            ),
        ] {
            let entry = format!("{{kind: AppTraffic, scope: {scope}, nameLabel: {name_label}, {FIELD}}}");
            assert_eq!(
                load(&mk_file(&[entry])),
                config_error("kinds[AppTraffic].nameLabel", message),
                "{name_label}"
            );
        }
        // A Cluster kind may be named by namespace, and its queries need no SCOPE.
        let entry = "{kind: NamespaceTraffic, scope: Cluster, nameLabel: namespace, \
                     fields: [{name: rps, query: 'sum by (namespace) (rate(x[WINDOW]))'}]}";
        let file = load(&mk_file(&[entry.to_owned()])).unwrap();
        assert!(!DeclaredSpec::from_config(&file.kinds[0]).info.namespaced);
        let err = load("window: soon\n").unwrap_err();
        assert!(err.contains("soon"), "{err}");
        let err = load(&mk_file(&[mk_kind(&format!("window: soon, {FIELD}"))])).unwrap_err();
        assert_eq!(
            err,
            "--config f.yaml: kinds[0].window: invalid duration \"soon\": expected a number with a unit (ms, s, m, h), e.g. 15s or 5m at line 2 column 46"
        );
    }

    #[test]
    fn fields() {
        let field: fn(&str) -> String = |yaml| mk_kind(&format!("fields: [{yaml}]"));
        let joined: fn(&str) -> String =
            |yaml| mk_kind(&format!("pods: {{label: une-tasse-de.cafe/cafe}}, fields: [{yaml}]"));
        let rejected = |entry: String, path: &str, message: &str| {
            let want = config_error(&format!("kinds[AppTraffic].{path}"), message);
            assert_eq!(load(&mk_file(std::slice::from_ref(&entry))), want, "{entry}");
        };
        // One field, with or without the pods join.
        for (kind, name, message) in [
            (field, "RequestsPerSecond", "\"RequestsPerSecond\" is not lowerCamelCase ([a-z][A-Za-z0-9]*)"),
            (field, "''", "\"\" is not lowerCamelCase ([a-z][A-Za-z0-9]*)"),
            (field, "metadata", "\"metadata\" is reserved: every object has it"),
            (field, "window", "\"window\" is reserved: every object has it"),
            (joined, "cpu", "\"cpu\" is reserved: the pods join adds it"),
        ] {
            rejected(kind(&format!("{{name: {name}, query: 'x{{SCOPE}}'}}")), "fields[0].name", message);
        }
        // One field `rps`, with `extra` keys.
        let long = "C".repeat(64);
        let (long_column, too_long) =
            (format!("column: {long}"), format!("\"{long}\" is longer than 63 characters"));
        for (extra, key, message) in [
            (
                "format: percentage",
                "format",
                "\"percentage\" is not a format: expected one of number, percent, cores, bytes, seconds, \
                 timestamp",
            ),
            ("column: ''", "column", "must not be empty; leave column out for no column"),
            (&long_column, "column", &too_long),
            ("column: NAME", "column", "\"NAME\" is the first column of every kind, the object's name"),
            ("wide: true", "wide", "has no column to show: set column too, or leave wide out"),
        ] {
            rejected(
                field(&format!("{{name: rps, query: 'x{{SCOPE}}', {extra}}}")),
                &format!("fields[rps].{key}"),
                message,
            );
        }
        rejected(
            joined("{name: usage, query: 'x{SCOPE}', column: cpu}"),
            "fields[usage].column",
            "\"cpu\" is a column of the pods join (Pods, CPU, Memory)",
        );
        // Several fields.
        for (fields, path, message) in [
            (
                "{name: rps, query: 'x{SCOPE}'}, {name: req_s, query: 'x{SCOPE}'}",
                "fields[1].name",
                "\"req_s\" is not lowerCamelCase ([a-z][A-Za-z0-9]*)",
            ),
            (
                "{name: rps, query: 'x{SCOPE}'}, {name: rps, query: 'y{SCOPE}'}",
                "fields[1].name",
                "duplicate field \"rps\" (also fields[0])",
            ),
            (
                "{name: a, query: 'x{SCOPE}', column: REQ/S}, {name: b, query: 'x{SCOPE}'}, \
                 {name: c, query: 'x{SCOPE}', column: req/s}",
                "fields[c].column",
                "duplicate column \"req/s\": field a has \"REQ/S\" (kubectl prints column names in upper \
                 case)",
            ),
        ] {
            rejected(field(fields), path, message);
        }
        // Without the join, its names are free.
        let file = load(&mk_file(&[field("{name: cpu, query: 'x{SCOPE}', column: CPU}")])).unwrap();
        assert_eq!(DeclaredSpec::from_config(&file.kinds[0]).fields[0].name, "cpu");
    }

    #[test]
    fn queries_are_checked_and_keep_the_labels_that_place_objects() {
        let query = |scope: &str, name_label: &str, query: &str| {
            let entry = format!(
                "{{kind: AppTraffic, scope: {scope}, nameLabel: {name_label}, \
                 fields: [{{name: ok, query: 'x{{SCOPE}}'}}, {{name: rps, query: '{query}'}}]}}"
            );
            load(&mk_file(&[entry]))
        };
        let at = "kinds[AppTraffic].fields[rps].query";
        // A Namespaced kind named by pod.
        for (template, message) in [
            (
                "sum by (namespace, pod) (rate(x[WINDOW]))",
                "PromQL template: the selector x has no {SCOPE} matchers and would read every namespace",
            ),
            (
                "sum by (namespace, pod) (rate(x{code=\"500\"}[WINDOW]))",
                "PromQL template: the selector x{code=\"500\"} has no {SCOPE} matchers and would read every namespace",
            ),
            (
                "sum by (namespace) (rate(x{SCOPE}[WINDOW]))",
                "drops the label \"pod\" (sum by (namespace) keeps only namespace), which names the objects (nameLabel)",
            ),
            (
                "sum by (pod) (rate(x{SCOPE}[WINDOW]))",
                "drops the label \"namespace\" (sum by (pod) keeps only pod), which places the objects of a Namespaced kind",
            ),
            ("vector(1)", "PromQL template, at byte 0: no SCOPE placeholder"),
        ] {
            assert_eq!(query("Namespaced", "pod", template), config_error(at, message), "{template}");
        }
        assert_eq!(
            query("Cluster", "pod", "x{namespace=SCOPE}"),
            config_error(
                at,
                "PromQL template, at byte 12: SCOPE must be an element of a label-matcher block, like {SCOPE} or {code=\"500\",SCOPE}"
            )
        );
        assert_eq!(
            query("Cluster", "node", "count(kube_node_info)"),
            config_error(
                at,
                "drops the label \"node\" (count with no grouping keeps no labels), which names the objects (nameLabel)"
            )
        );
        // A Cluster kind's results need not keep namespace.
        query("Cluster", "pod", "sum by (pod) (rate(x[WINDOW]))").unwrap();
        query("Cluster", "node", "count by (node) (kube_pod_info{SCOPE})").unwrap();
        query("Namespaced", "pod", "sum without (instance) (rate(x{SCOPE}[WINDOW]))").unwrap();
    }

    #[test]
    fn the_builtin_default_queries_pass_the_same_label_analysis() {
        for kind in BUILTIN {
            for spec in kind.queries {
                let template = spec.default_template();
                assert_eq!(template.keeps_label("namespace"), Ok(()), "{}.{}", kind.section, spec.field);
                let name_label = if kind.section == "cafeBrewStats" { "cafe" } else { "pod" };
                assert_eq!(template.keeps_label(name_label), Ok(()), "{}.{}", kind.section, spec.field);
            }
        }
    }

    #[test]
    fn defaults_are_filled_in() {
        let yaml = mk_file(&[mk_kind(
            "fields: [{name: rps, query: 'x{SCOPE}'}, \
             {name: age, query: 'y{SCOPE}', format: timestamp, column: Age, wide: true}]",
        )]);
        let file = load(&yaml).unwrap();
        let field = |name: &str, query: &str, format: &str| DeclaredFieldConfig {
            name: name.into(),
            query: query.into(),
            format: Some(format.into()),
            column: None,
            wide: false,
            description: Some(String::new()),
        };
        let age = DeclaredFieldConfig {
            column: Some("Age".into()),
            wide: true,
            ..field("age", "y{SCOPE}", "timestamp")
        };
        assert_eq!(
            file.kinds,
            vec![DeclaredKindConfig {
                kind: "AppTraffic".into(),
                plural: Some("apptraffics".into()),
                singular: Some("apptraffic".into()),
                short_names: vec![],
                categories: Some(vec!["percolator".into()]),
                scope: Some("Namespaced".into()),
                name_label: "pod".into(),
                labels: vec![],
                window: None,
                description: Some(
                    "AppTraffic is declared in the percolator configuration and computed at request time \
                     from Prometheus."
                        .into()
                ),
                pods: None,
                fields: vec![field("rps", "x{SCOPE}", "number"), age],
            }]
        );
        // Checking again changes nothing, and an entry as written (unchecked) gets the same spec.
        let mut again = file.clone();
        check_declared(&mut again, BUILTIN).unwrap();
        assert_eq!(again, file);
        let accept_all: Check<Template> = Arc::new(|_: &mut QueryFile<Template>| Ok(()));
        let unchecked = QueryFile::from_yaml(&yaml, "f.yaml", &accept_all).unwrap();
        assert_eq!(unchecked.kinds[0].plural, None);
        assert_eq!(unchecked.kinds[0].fields[0].format, None);
        assert_eq!(DeclaredSpec::from_config(&unchecked.kinds[0]), DeclaredSpec::from_config(&file.kinds[0]));
    }

    #[test]
    fn the_design_example() {
        let file = load(EXAMPLE).unwrap();
        assert_eq!(file.kinds[0].pods, Some(PodsJoinConfig { label: "une-tasse-de.cafe/cafe".into() }));
        let owned = |texts: &[&str]| -> Cow<'static, [Text]> {
            Cow::Owned(texts.iter().map(|t| Text::Owned((*t).to_owned())).collect())
        };
        let column = |name: &str, format: &str, description: &str, priority| Column {
            name: Text::Owned(name.into()),
            type_: Text::Borrowed("string"),
            format: Text::Owned(format.into()),
            description: Text::Owned(description.into()),
            priority,
        };
        assert_eq!(
            DeclaredSpec::from_config(&file.kinds[0]),
            DeclaredSpec {
                info: KindInfo {
                    gv: crate::kinds::STATS,
                    plural: Text::Owned("apptraffics".into()),
                    singular: Text::Owned("apptraffic".into()),
                    kind: Text::Owned("AppTraffic".into()),
                    list_kind: Text::Owned("AppTrafficList".into()),
                    short_names: owned(&["atr"]),
                    categories: owned(&["percolator"]),
                    namespaced: true,
                    description: Text::Owned("HTTP traffic per pod, from Prometheus.".into()),
                    typed_list_items: true,
                },
                name_label: "pod".into(),
                labels: vec!["tier".into()],
                window: Some(Duration::from_secs(120)),
                pods_label: Some("une-tasse-de.cafe/cafe".into()),
                fields: vec![FieldSpec {
                    name: "requestsPerSecond".into(),
                    query: "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))".into(),
                    format: Format::Number,
                    column: Some("REQ/S".into()),
                    wide: false,
                    description: "Requests per second over the window.".into(),
                }],
                columns: vec![
                    column("Name", "name", "Name of the AppTraffic.", 0),
                    column("REQ/S", "", "Requests per second over the window.", 0),
                    column("Pods", "", "Serving pods running.", 1),
                    column("CPU", "quantity", "CPU of the serving pods.", 1),
                    column("Memory", "quantity", "Memory working set of the serving pods.", 1),
                ],
            }
        );
    }

    #[test]
    fn columns_follow_the_fields_formats_and_order() {
        let file = load(&mk_file(&[mk_kind(
            "scope: Cluster, fields: [\
             {name: cpu, query: 'x', format: cores, column: CPU},\
             {name: memory, query: 'x', format: bytes, column: Mem, wide: true, description: Working set.},\
             {name: hidden, query: 'x', format: percent},\
             {name: latency, query: 'x', format: seconds, column: P95},\
             {name: ratio, query: 'x', format: percent, column: Ratio, wide: true},\
             {name: last, query: 'x', format: timestamp, column: Last Seen}]",
        )]))
        .unwrap();
        let spec = DeclaredSpec::from_config(&file.kinds[0]);
        let formats: Vec<Format> = spec.fields.iter().map(|f| f.format).collect();
        assert_eq!(
            formats,
            [
                Format::Cores,
                Format::Bytes,
                Format::Percent,
                Format::Seconds,
                Format::Percent,
                Format::Timestamp
            ]
        );
        let columns: Vec<(&str, &str, &str, &str, i32)> = spec
            .columns
            .iter()
            .map(|c| (&*c.name, &*c.type_, &*c.format, &*c.description, c.priority))
            .collect();
        assert_eq!(
            columns,
            [
                ("Name", "string", "name", "Name of the AppTraffic.", 0),
                ("CPU", "string", "quantity", "cpu.", 0),
                ("Mem", "string", "quantity", "Working set.", 1),
                ("P95", "string", "duration", "latency.", 0),
                ("Ratio", "string", "", "ratio.", 1),
                ("Last Seen", "string", "", "last.", 0),
            ]
        );
    }
}
