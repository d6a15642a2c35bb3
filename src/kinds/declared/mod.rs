//! Kinds declared in the configuration file (`kinds:`, docs/reference/kinds.md): served like the built-in
//! kinds (discovery, OpenAPI, Table, selectors, caching) and computed from their PromQL fields,
//! optionally joined with the running pods whose label equals the object's name.
//!
//! [`spec`] checks a file's `kinds:` list and turns each entry into a [`DeclaredSpec`];
//! [`DeclaredKind`] serves one: its OpenAPI schema here, its computation in `compute`.

mod compute;
pub(crate) mod spec;
#[cfg(test)]
mod tests;

use std::sync::Arc;

use futures::future::BoxFuture;
use serde_json::json;

pub use spec::DeclaredSpec;
pub(crate) use spec::{FieldSpec, Format, check_declared};

use super::{Column, ComputeError, KindInfo, Listing, ServedKind, Sources, kind_schema, schema_name};
use apiserver::Metrics;
use apiserver::intern::ObjectStrings;

/// A declared kind, computed at request time from its queries.
pub(crate) struct DeclaredKind {
    spec: Arc<DeclaredSpec>,
    sources: Sources,
    metrics: Option<Arc<Metrics>>,
    /// The objects' names, namespaces and label sets, shared from one refresh to the next.
    shared: ObjectStrings,
}

impl std::fmt::Debug for DeclaredKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeclaredKind").field("kind", &self.spec.info.kind).finish_non_exhaustive()
    }
}

impl DeclaredKind {
    /// The kind of `spec`, computed from `sources`; object names that are not valid Kubernetes
    /// names are skipped and counted in `metrics`.
    pub(crate) fn new(spec: Arc<DeclaredSpec>, sources: Sources, metrics: Option<Arc<Metrics>>) -> Self {
        Self { spec, sources, metrics, shared: ObjectStrings::default() }
    }
}

impl ServedKind for DeclaredKind {
    fn info(&self) -> &KindInfo {
        &self.spec.info
    }

    fn columns(&self) -> &[Column] {
        &self.spec.columns
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        let spec = &*self.spec;
        let string = |description: &str| json!({"type": "string", "description": description});
        let date_time =
            |description: &str| json!({"type": "string", "format": "date-time", "description": description});
        let mut properties = serde_json::Map::new();
        let timestamp = if spec.pods_label.is_some() {
            "When the newest input sample (kubelet or Prometheus) was taken, RFC 3339."
        } else {
            "When the newest input sample (Prometheus) was taken, RFC 3339."
        };
        properties.insert("timestamp".into(), date_time(timestamp));
        properties
            .insert("window".into(), string("Range the rates are computed over, as a duration (5m0s)."));
        for field in &spec.fields {
            let description = field_description(field);
            let schema = match field.format {
                Format::Timestamp => date_time(&description),
                Format::Number | Format::Percent | Format::Cores | Format::Bytes | Format::Seconds => {
                    string(&description)
                }
            };
            properties.insert(field.name.clone(), schema);
        }
        if let Some(label) = &spec.pods_label {
            properties.insert(
                "pods".into(),
                json!({"type": "integer", "format": "int64", "description": format!("Running pods whose {label} label is the object's name.")}),
            );
            properties.insert("cpu".into(), string("CPU usage of those pods in cores, summed (a Quantity), from the kubelets. Omitted when any pod has no CPU rate yet."));
            properties.insert(
                "memory".into(),
                string("Memory working set of those pods, summed (a Quantity), from the kubelets."),
            );
        }
        let object = kind_schema(&spec.info, &metadata_description(spec), properties.into());
        vec![(schema_name(crate::kinds::STATS, &spec.info.kind), object)]
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(self.compute(namespace))
    }
}

/// A field's description in OpenAPI (`kubectl explain`): as written, else its name.
fn field_description(field: &FieldSpec) -> String {
    if field.description.is_empty() { format!("{}.", field.name) } else { field.description.clone() }
}

/// What `metadata` holds for this kind: where its name, labels and creation time come from.
fn metadata_description(spec: &DeclaredSpec) -> String {
    let mut text =
        format!("Standard object metadata: the name is the {} label of the query results", spec.name_label);
    if !spec.labels.is_empty() {
        text.push_str(&format!("; labels copy the results' {} labels", spec.labels.join(", ")));
    }
    if spec.pods_label.is_some() {
        text.push_str("; creationTimestamp is the oldest joined pod's");
    }
    text.push('.');
    text
}
