//! Association (prometheus-adapter's `resource_converter.go` and `lbl_res.go`): which
//! Kubernetes resources a series' labels name, and which label names a resource in a query.
//!
//! A rule's `resources` has `overrides` (label → group-resource) and a `template`
//! (`kube_<<.Group>>_<<.Resource>>`): a resource's label is the template rendered with the
//! group (`.` and `-` replaced by `_`) and the singular resource; a label's resource is found by
//! reversing the template into a regex (`.Group` → `(?P<group>.+?)`, `.Resource` →
//! `(?P<resource>.+?)`, the text between taken as regex, as the adapter does). The adapter asks
//! the cluster's RESTMapper to normalize what it finds; percolator uses the fixed table
//! [`KNOWN_RESOURCES`] instead: a resource is named by its plural or singular, and an empty
//! group (an override without `group`, a template without `.Group`) means "whichever group has
//! it", as the RESTMapper does.

use std::collections::BTreeMap;

use regex::Regex;

use super::template::{Args, Field, Template, TemplateError};
use crate::sources::prometheus::is_valid_label_name;
use k8s_wire::GroupResource;

/// A resource of the fixed table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct KnownResource {
    /// API group; empty for the core group.
    pub group: &'static str,
    /// Plural resource name.
    pub plural: &'static str,
    /// Singular resource name (the RESTMapper's: the lowercased kind).
    pub singular: &'static str,
    /// Kind.
    pub kind: &'static str,
    /// Whether objects live in a namespace.
    pub namespaced: bool,
}

impl KnownResource {
    /// The group-resource (plural).
    pub(crate) fn group_resource(&self) -> GroupResource {
        GroupResource::new(self.group, self.plural)
    }
}

const fn known(
    group: &'static str,
    plural: &'static str,
    singular: &'static str,
    kind: &'static str,
    namespaced: bool,
) -> KnownResource {
    KnownResource { group, plural, singular, kind, namespaced }
}

/// The resources a cluster is assumed to have, in place of the adapter's RESTMapper.
pub(crate) const KNOWN_RESOURCES: &[KnownResource] = &[
    known("", "pods", "pod", "Pod", true),
    known("", "namespaces", "namespace", "Namespace", false),
    known("", "nodes", "node", "Node", false),
    known("", "services", "service", "Service", true),
    known("", "persistentvolumes", "persistentvolume", "PersistentVolume", false),
    known("", "persistentvolumeclaims", "persistentvolumeclaim", "PersistentVolumeClaim", true),
    known("", "configmaps", "configmap", "ConfigMap", true),
    known("", "secrets", "secret", "Secret", true),
    known("", "serviceaccounts", "serviceaccount", "ServiceAccount", true),
    known("", "endpoints", "endpoints", "Endpoints", true),
    known("", "replicationcontrollers", "replicationcontroller", "ReplicationController", true),
    known("apps", "deployments", "deployment", "Deployment", true),
    known("apps", "statefulsets", "statefulset", "StatefulSet", true),
    known("apps", "replicasets", "replicaset", "ReplicaSet", true),
    known("apps", "daemonsets", "daemonset", "DaemonSet", true),
    known("batch", "jobs", "job", "Job", true),
    known("batch", "cronjobs", "cronjob", "CronJob", true),
    known("networking.k8s.io", "ingresses", "ingress", "Ingress", true),
    known(
        "autoscaling",
        "horizontalpodautoscalers",
        "horizontalpodautoscaler",
        "HorizontalPodAutoscaler",
        true,
    ),
    known("policy", "poddisruptionbudgets", "poddisruptionbudget", "PodDisruptionBudget", true),
];

/// The table entry of a resource named by its plural or singular (case-insensitively); an
/// empty `group` matches any group (the RESTMapper's `ResourceFor` with a partial resource).
pub(crate) fn lookup(group: &str, resource: &str) -> Option<&'static KnownResource> {
    let resource = resource.to_ascii_lowercase();
    KNOWN_RESOURCES.iter().find(|k| {
        (group.is_empty() || k.group.eq_ignore_ascii_case(group))
            && (k.plural == resource || k.singular == resource)
    })
}

/// The normalized form of a group-resource (plural, the table's group), if the table has it.
pub(crate) fn normalize(group: &str, resource: &str) -> Option<GroupResource> {
    lookup(group, resource).map(KnownResource::group_resource)
}

/// Whether a resource is one of the three that make a metric cluster-scoped (the adapter's
/// `NsGroupResource`, `NodeGroupResource`, `PVGroupResource`).
pub(crate) fn is_root_scoped(gr: &GroupResource) -> bool {
    gr.group.is_empty() && matches!(gr.resource.as_str(), "namespaces" | "nodes" | "persistentvolumes")
}

/// How a custom metrics path names `gr`: `pods`, `deployments.apps`.
pub(crate) fn path_name(gr: &GroupResource) -> String {
    if gr.group.is_empty() { gr.resource.clone() } else { format!("{}.{}", gr.resource, gr.group) }
}

/// The `kind` and `apiVersion` of an object reference to `gr` (`describedObject`), as the
/// adapter's `ReferenceFor` writes them (`/v1` for the core group); unknown resources get
/// an empty kind and `<group>/v1`.
pub(crate) fn kind_and_api_version(gr: &GroupResource) -> (&'static str, &'static str) {
    let kind = lookup(&gr.group, &gr.resource).map_or("", |k| k.kind);
    let api_version = match gr.group.as_str() {
        "" => "/v1",
        "apps" => "apps/v1",
        "batch" => "batch/v1",
        "networking.k8s.io" => "networking.k8s.io/v1",
        "autoscaling" => "autoscaling/v2",
        "policy" => "policy/v1",
        _ => "v1",
    };
    (kind, api_version)
}

/// The namespaces group-resource.
pub(crate) fn namespaces() -> GroupResource {
    GroupResource::new("", "namespaces")
}

/// Why a `resources` section is rejected: the field under it (`template`,
/// `overrides.microservice`) and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MappingError {
    /// The field, relative to `resources`.
    pub field: String,
    /// What is wrong.
    pub message: String,
}

fn mapping_error(field: impl Into<String>, message: impl Into<String>) -> MappingError {
    MappingError { field: field.into(), message: message.into() }
}

/// No label for a resource in a rule's series.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// Neither an override nor a template.
    #[error("no label for {0}: the rule has no override for it and no resources.template")]
    NoMapping(GroupResource),
    /// The template needs the resource's singular, and the resource is not known.
    #[error("no label for {0}: unknown resource")]
    UnknownResource(GroupResource),
    /// The template renders the empty string.
    #[error("no label for {0}: resources.template renders nothing")]
    EmptyLabel(GroupResource),
}

/// A `resources.template` that cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
enum LabelTemplateError {
    #[error(transparent)]
    Template(#[from] TemplateError),
    #[error("field {0} is not available here (only .Group and .Resource are)")]
    FieldNotAvailable(Field),
    #[error("must use <<.Resource>>")]
    NoResource,
    #[error("cannot be reversed into a label pattern: {0}")]
    NotReversible(String),
    #[error("renders {0:?} for deployments.apps, which is not a Prometheus label name")]
    NotALabelName(String),
}

/// A compiled `resources.template`.
#[derive(Debug, Clone)]
struct LabelTemplate {
    template: Template,
    /// `^<template with capture groups>$`.
    extractor: Regex,
}

/// A rule's compiled `resources` section (the adapter's `ResourceConverter`).
#[derive(Debug, Clone, Default)]
pub struct ResourceMapping {
    /// Override label → normalized group-resource.
    label_to_resource: BTreeMap<String, GroupResource>,
    /// Normalized (group, resource) → override label.
    resource_to_label: BTreeMap<(String, String), String>,
    template: Option<LabelTemplate>,
}

/// Shorthand for a `(group, resource)` map key.
fn key(gr: &GroupResource) -> (String, String) {
    (gr.group.clone(), gr.resource.clone())
}

impl ResourceMapping {
    /// Compiles `template` (empty: none) and `overrides` (label → `(group, resource)`). Unknown
    /// resources, labels that are not Prometheus label names, two labels for one resource and
    /// templates that are not reversible are errors.
    pub fn new(template: &str, overrides: &BTreeMap<String, (String, String)>) -> Result<Self, MappingError> {
        let mut mapping = ResourceMapping::default();
        for (label, (group, resource)) in overrides {
            let field = format!("overrides.{label}");
            if !is_valid_label_name(label) {
                return Err(mapping_error(field, "not a Prometheus label name ([a-zA-Z_][a-zA-Z0-9_]*)"));
            }
            if resource.is_empty() {
                return Err(mapping_error(format!("{field}.resource"), "required"));
            }
            let Some(gr) = normalize(group, resource) else {
                let named = if group.is_empty() { resource.clone() } else { format!("{resource}.{group}") };
                return Err(mapping_error(
                    field,
                    format!("unknown resource {named:?} (percolator knows {})", known_list()),
                ));
            };
            if let Some(other) = mapping.resource_to_label.get(&key(&gr)) {
                return Err(mapping_error(
                    field,
                    format!("labels {other} and {label} both name {gr}: a query could use only one"),
                ));
            }
            mapping.resource_to_label.insert(key(&gr), label.clone());
            mapping.label_to_resource.insert(label.clone(), gr);
        }
        if !template.is_empty() {
            mapping.template =
                Some(compile_label_template(template).map_err(|e| mapping_error("template", e.to_string()))?);
        }
        Ok(mapping)
    }

    /// Whether the section maps nothing (no override, no template).
    pub fn is_empty(&self) -> bool {
        self.label_to_resource.is_empty() && self.template.is_none()
    }

    /// The label of a (normalized) resource (`LabelForResource`): its override, else the
    /// template rendered with the group (`.`, `-` → `_`) and the singular resource.
    pub fn label_for_resource(&self, gr: &GroupResource) -> Result<String, LabelError> {
        if let Some(label) = self.resource_to_label.get(&key(gr)) {
            return Ok(label.clone());
        }
        let Some(template) = &self.template else {
            return Err(LabelError::NoMapping(gr.clone()));
        };
        let known = lookup(&gr.group, &gr.resource).filter(|k| k.group == gr.group);
        let Some(known) = known else {
            return Err(LabelError::UnknownResource(gr.clone()));
        };
        let label = template.template.render(&Args {
            group: gr.group.replace(['.', '-'], "_"),
            resource: known.singular.to_owned(),
            ..Args::default()
        });
        if label.is_empty() {
            return Err(LabelError::EmptyLabel(gr.clone()));
        }
        Ok(label)
    }

    /// The resource a label names, if any: its override, else the template reversed and the
    /// result normalized through the table (labels of unknown resources name none).
    pub fn resource_for_label(&self, label: &str) -> Option<GroupResource> {
        self.resolve(label).ok().flatten()
    }

    /// `Ok(Some)`: the label names a resource; `Ok(None)`: it is not a resource label;
    /// `Err`: the template matched but the table has no such resource (the adapter skips
    /// those labels, even for the namespaced flag).
    fn resolve(&self, label: &str) -> Result<Option<GroupResource>, ()> {
        if let Some(gr) = self.label_to_resource.get(label) {
            return Ok(Some(gr.clone()));
        }
        let Some(template) = &self.template else { return Ok(None) };
        let Some(captures) = template.extractor.captures(label) else { return Ok(None) };
        let group = captures.name("group").map_or("", |m| m.as_str());
        let resource = captures.name("resource").map_or("", |m| m.as_str());
        normalize(group, resource).map(Some).ok_or(())
    }

    /// The resources a series' labels name and whether the series is namespaced, as the
    /// adapter's `ResourcesForSeries`: `__name__` is not a label here; every other label that
    /// names no resource, or names one other than namespaces, nodes and persistentvolumes,
    /// makes the series namespaced (so only a series whose labels all name those three is
    /// not); a label the template matches but the table does not know is skipped. Resources
    /// come in label order, each once.
    pub fn resources_for_series<'a>(
        &self,
        labels: impl IntoIterator<Item = &'a str>,
    ) -> (Vec<GroupResource>, bool) {
        let mut resources: Vec<GroupResource> = Vec::new();
        let mut namespaced = false;
        for label in labels {
            if label == "__name__" {
                continue;
            }
            match self.resolve(label) {
                Err(()) => continue,
                Ok(None) => namespaced = true,
                Ok(Some(gr)) => {
                    if !is_root_scoped(&gr) {
                        namespaced = true;
                    }
                    if !resources.contains(&gr) {
                        resources.push(gr);
                    }
                }
            }
        }
        (resources, namespaced)
    }
}

fn known_list() -> String {
    KNOWN_RESOURCES.iter().map(|k| k.group_resource().to_string()).collect::<Vec<_>>().join(", ")
}

/// Parses a `resources.template` and builds its reverse regex (`newLabelGroupResExtractor`).
fn compile_label_template(text: &str) -> Result<LabelTemplate, LabelTemplateError> {
    let template = Template::parse(text)?;
    let fields = template.fields();
    if let Some(other) = fields.iter().find(|f| !matches!(f, Field::Group | Field::Resource)) {
        return Err(LabelTemplateError::FieldNotAvailable(*other));
    }
    if !fields.contains(&Field::Resource) {
        return Err(LabelTemplateError::NoResource);
    }
    let pattern = template.render(&Args {
        group: "(?P<group>.+?)".to_owned(),
        resource: "(?P<resource>.+?)".to_owned(),
        ..Args::default()
    });
    let extractor = Regex::new(&format!("^{pattern}$")).map_err(|e| {
        LabelTemplateError::NotReversible(e.to_string().lines().last().unwrap_or_default().trim().to_owned())
    })?;
    let example =
        template.render(&Args { group: "apps".into(), resource: "deployment".into(), ..Args::default() });
    if !is_valid_label_name(&example) {
        return Err(LabelTemplateError::NotALabelName(example));
    }
    Ok(LabelTemplate { template, extractor })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn overrides(pairs: &[(&str, &str, &str)]) -> BTreeMap<String, (String, String)> {
        pairs.iter().map(|(l, g, r)| ((*l).to_owned(), ((*g).to_owned(), (*r).to_owned()))).collect()
    }

    fn gr(group: &str, resource: &str) -> GroupResource {
        GroupResource::new(group, resource)
    }

    #[test]
    fn overrides_are_normalized_through_the_table() {
        let m = ResourceMapping::new(
            "",
            &overrides(&[
                ("namespace", "", "namespace"),
                ("pod", "", "pods"),
                ("microservice", "apps", "deployment"),
                ("kubernetes_ingress", "", "Ingress"),
            ]),
        )
        .unwrap();
        assert_eq!(m.resource_for_label("namespace"), Some(gr("", "namespaces")));
        assert_eq!(m.resource_for_label("pod"), Some(gr("", "pods")));
        assert_eq!(m.resource_for_label("microservice"), Some(gr("apps", "deployments")));
        // No group: whichever group has it.
        assert_eq!(m.resource_for_label("kubernetes_ingress"), Some(gr("networking.k8s.io", "ingresses")));
        assert_eq!(m.label_for_resource(&gr("apps", "deployments")).unwrap(), "microservice");
        assert_eq!(m.label_for_resource(&gr("", "pods")).unwrap(), "pod");
        assert!(
            m.label_for_resource(&gr("", "nodes")).unwrap_err().to_string().contains("no resources.template")
        );
    }

    #[test]
    fn bad_overrides_are_rejected_naming_the_label() {
        let e = ResourceMapping::new("", &overrides(&[("brand", "cheese.io", "brand")])).unwrap_err();
        assert_eq!(e.field, "overrides.brand");
        assert!(e.message.starts_with("unknown resource \"brand.cheese.io\""), "{}", e.message);
        let e = ResourceMapping::new("", &overrides(&[("pod", "apps", "pod")])).unwrap_err();
        assert!(e.message.starts_with("unknown resource \"pod.apps\""));
        let e = ResourceMapping::new("", &overrides(&[("kube-pod", "", "pod")])).unwrap_err();
        assert_eq!(e.field, "overrides.kube-pod");
        let e = ResourceMapping::new("", &overrides(&[("pod", "", "")])).unwrap_err();
        assert_eq!(e.field, "overrides.pod.resource");
        let e =
            ResourceMapping::new("", &overrides(&[("a_pod", "", "pod"), ("b_pod", "", "pods")])).unwrap_err();
        assert_eq!(e.field, "overrides.b_pod");
        assert!(e.message.contains("labels a_pod and b_pod both name pods"));
    }

    #[test]
    fn the_template_renders_group_and_singular_resource() {
        let m = ResourceMapping::new("kube_<<.Group>>_<<.Resource>>", &BTreeMap::new()).unwrap();
        assert_eq!(m.label_for_resource(&gr("apps", "deployments")).unwrap(), "kube_apps_deployment");
        assert_eq!(
            m.label_for_resource(&gr("networking.k8s.io", "ingresses")).unwrap(),
            "kube_networking_k8s_io_ingress"
        );
        assert_eq!(m.label_for_resource(&gr("", "pods")).unwrap(), "kube__pod");
        assert!(
            m.label_for_resource(&gr("cheese.io", "brands"))
                .unwrap_err()
                .to_string()
                .contains("unknown resource")
        );
        let prefix = ResourceMapping::new("kube_<<.Resource>>", &BTreeMap::new()).unwrap();
        assert_eq!(prefix.label_for_resource(&gr("", "namespaces")).unwrap(), "kube_namespace");
        assert_eq!(prefix.label_for_resource(&gr("", "endpoints")).unwrap(), "kube_endpoints");
    }

    #[test]
    fn the_template_is_reversed_into_resources() {
        let m = ResourceMapping::new("kube_<<.Group>>_<<.Resource>>", &BTreeMap::new()).unwrap();
        assert_eq!(m.resource_for_label("kube_apps_deployment"), Some(gr("apps", "deployments")));
        assert_eq!(m.resource_for_label("kube_batch_jobs"), Some(gr("batch", "jobs")));
        // The group is matched lazily and never un-sanitized, as in the adapter: dotted groups
        // and the core group are not found from labels.
        assert_eq!(m.resource_for_label("kube_networking_k8s_io_ingress"), None);
        assert_eq!(m.resource_for_label("kube__pod"), None);
        assert_eq!(m.resource_for_label("instance"), None);
    }

    #[test]
    fn a_template_without_group_guesses_the_group() {
        let m = ResourceMapping::new("kube_<<.Resource>>", &BTreeMap::new()).unwrap();
        assert_eq!(m.resource_for_label("kube_deployment"), Some(gr("apps", "deployments")));
        assert_eq!(m.resource_for_label("kube_pod"), Some(gr("", "pods")));
        assert_eq!(m.resource_for_label("kube_ingress"), Some(gr("networking.k8s.io", "ingresses")));
        assert_eq!(m.resource_for_label("kube_brand"), None);
        // `<<.Resource>>` alone reads every label as a resource: `job` is batch's jobs.
        let bare = ResourceMapping::new("<<.Resource>>", &BTreeMap::new()).unwrap();
        assert_eq!(bare.resource_for_label("job"), Some(gr("batch", "jobs")));
        assert_eq!(bare.resource_for_label("service"), Some(gr("", "services")));
        assert_eq!(bare.resource_for_label("instance"), None);
    }

    #[test]
    fn overrides_win_over_the_template() {
        let m = ResourceMapping::new("kube_<<.Resource>>", &overrides(&[("instance", "", "node")])).unwrap();
        assert_eq!(m.label_for_resource(&gr("", "nodes")).unwrap(), "instance");
        assert_eq!(m.label_for_resource(&gr("", "pods")).unwrap(), "kube_pod");
        assert_eq!(m.resource_for_label("kube_node"), Some(gr("", "nodes")));
        assert_eq!(m.resource_for_label("instance"), Some(gr("", "nodes")));
    }

    #[test]
    fn bad_templates_are_rejected() {
        let e = |t: &str| ResourceMapping::new(t, &BTreeMap::new()).unwrap_err();
        assert_eq!(e("kube_<<.Group>>").message, "must use <<.Resource>>");
        assert_eq!(e("kube_<<.Group>>").field, "template");
        assert!(e("<<.Series>>_<<.Resource>>").message.starts_with("field .Series is not available here"));
        assert!(e("<<.Resource>>_<<.Resource>>").message.starts_with("cannot be reversed"));
        assert!(e("kube-<<.Resource>>").message.contains("not a Prometheus label name"));
        assert!(e("<<if .Resource>>x<<end>>").message.contains("is not supported"));
    }

    #[test]
    fn resources_for_series_follows_the_adapter() {
        let m = ResourceMapping::new(
            "kube_<<.Resource>>",
            &overrides(&[("namespace", "", "namespace"), ("pod", "", "pod")]),
        )
        .unwrap();
        // series_registry_test.go's series.
        assert_eq!(
            m.resources_for_series(["__name__", "container", "namespace", "pod"]),
            (vec![gr("", "namespaces"), gr("", "pods")], true)
        );
        assert_eq!(m.resources_for_series(["__name__", "kube_node"]), (vec![gr("", "nodes")], false));
        assert_eq!(
            m.resources_for_series(["kube_persistentvolume"]),
            (vec![gr("", "persistentvolumes")], false)
        );
        // A label naming no resource makes the series namespaced...
        assert_eq!(m.resources_for_series(["kube_node", "instance"]), (vec![gr("", "nodes")], true));
        // ...but one the template matches for an unknown resource is skipped.
        assert_eq!(m.resources_for_series(["kube_node", "kube_brand"]), (vec![gr("", "nodes")], false));
        assert_eq!(m.resources_for_series([]), (vec![], false));
        assert_eq!(
            m.resources_for_series(["kube_deployment", "kube_namespace", "namespace"]),
            (vec![gr("apps", "deployments"), gr("", "namespaces")], true)
        );
    }

    #[test]
    fn the_table_is_consistent() {
        for k in KNOWN_RESOURCES {
            assert_eq!(lookup(k.group, k.plural), Some(k));
            assert_eq!(lookup("", k.singular), Some(k));
            assert_eq!(is_root_scoped(&k.group_resource()), !k.namespaced, "{}", k.plural);
        }
        assert_eq!(normalize("", "PODS"), Some(gr("", "pods")));
        assert_eq!(normalize("extensions", "deployments"), None);
    }
}
