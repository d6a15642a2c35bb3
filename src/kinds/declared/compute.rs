//! How a declared kind is computed for one list: one PromQL vector query per field (run
//! together), the objects named by the results (and by the joined pods' label), and each
//! object's JSON and Table cells, published by its fields' formats.
//!
//! The objects are the distinct (namespace, name label) pairs of every field's result (a
//! Cluster kind: the distinct name label values), plus, with the `pods` join, every running
//! pod's label value, so a Prometheus outage removes fields, not objects.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use jiff::Timestamp;
use serde::ser::{Serialize, SerializeMap, Serializer};

use super::DeclaredKind;
use super::spec::{DeclaredSpec, FieldSpec, Format};
use crate::kinds::inputs::{GroupUsage, RATE_STEP, RATIO_STEP, round_cpu, round_to};
use crate::kinds::{
    API_VERSION, Cell, Computation, ComputeError, Duplicates, Listing, ListingBuilder, ObjectMeta,
    QueryError, SamplesBy, rfc3339,
};
use crate::sources::{Containers, PodInfo, PodKey, PromSample};
use apiserver::intern::ObjectStrings;
use k8s_wire::{duration, quantity};
use k8s_wire::{is_dns1123_subdomain, is_valid_label_value};

/// The `reason` label of an object skipped because its name label value is not a valid
/// Kubernetes object name.
const INVALID_NAME: &str = "invalid_name";

impl DeclaredKind {
    /// Computes every object of `namespace` (all namespaces when `None`; a Cluster kind is
    /// always computed whole).
    pub(super) async fn compute(&self, namespace: Option<&str>) -> Result<Arc<Listing>, ComputeError> {
        let spec = &*self.spec;
        let namespace = namespace.filter(|_| spec.info.namespaced);
        let Computation { pods, resource_version, config } = self.sources.begin(namespace)?;
        let window = spec.window.unwrap_or(config.window);
        let joined: Vec<Arc<PodInfo>> = match &spec.pods_label {
            Some(label) => pods.into_iter().filter(|p| p.labels.contains_key(label)).collect(),
            None => Vec::new(),
        };
        let queries = spec.fields.iter().map(|f| self.sources.query(&f.name, &f.query, namespace, window));
        // Without the join there are no pods to fetch, so no kubelet is asked.
        let (results, (usage, usage_warning)) =
            futures::join!(futures::future::join_all(queries), self.sources.pod_usage(&joined));

        let mut warnings: Vec<String> = usage_warning.into_iter().collect();
        let by_field: Vec<SamplesBy<'_>> = spec
            .fields
            .iter()
            .zip(results)
            .map(|(field, result)| index(spec, namespace, field, result, &mut warnings))
            .collect();

        // Every object the results or the joined pods name, with its pods: (namespace, name),
        // borrowed from them.
        let mut objects: BTreeMap<(&str, &str), Vec<&PodInfo>> = BTreeMap::new();
        for key in by_field.iter().flat_map(SamplesBy::keys) {
            objects.entry(key).or_default();
        }
        if let Some(label) = &spec.pods_label {
            for pod in &joined {
                if let Some(name) = pod.labels.get(label) {
                    let namespace = if spec.info.namespaced { &*pod.namespace } else { "" };
                    objects.entry((namespace, name.as_str())).or_default().push(pod);
                }
            }
        }
        let window_text = duration::go_string(window);
        let mut list = ListingBuilder::new(&spec.info, resource_version);
        list.reserve(objects.len());
        for (&(namespace, name), pods) in &objects {
            // A value that is not a valid object name cannot be served (or fetched by name).
            let valid = is_dns1123_subdomain(name).is_empty();
            if let (false, Some(metrics)) = (valid, &self.metrics) {
                metrics.skipped_object(&spec.info.plural, INVALID_NAME);
            }
            if valid {
                // Shared with the previous refresh's objects and with this one's.
                let key = PodKey { namespace: self.shared.name(namespace), name: self.shared.name(name) };
                item(&mut list, spec, &key, pods, &by_field, &usage, (&window_text, &self.shared));
            }
        }
        Ok(Arc::new(list.finish(warnings)))
    }
}

/// Indexes one field's result by object, keeping the first sample of each, or records why the
/// field is missing. Samples without the labels naming an object (or, for a namespaced list,
/// of another namespace) are ignored.
fn index<'s>(
    spec: &'s DeclaredSpec,
    namespace: Option<&str>,
    field: &FieldSpec,
    result: Result<Vec<PromSample>, QueryError>,
    warnings: &mut Vec<String>,
) -> SamplesBy<'s> {
    let by = |samples| SamplesBy::new(samples, &spec.name_label, spec.info.namespaced, Duplicates::KeepFirst);
    let mut samples = match result {
        Ok(samples) => samples,
        Err(error) => {
            warnings.push(format!("{} omitted: {error}", field.name));
            return by(Vec::new()).0;
        }
    };
    // A query that lost its SCOPE cannot put another namespace's objects in this list.
    if let Some(namespace) = namespace.filter(|_| spec.info.namespaced) {
        samples.retain(|s| s.labels.get("namespace") == Some(namespace));
    }
    let (by_object, duplicated) = by(samples);
    match duplicated {
        0 => {}
        1 => warnings.push(format!("{}: 1 object had several samples; the first was used", field.name)),
        n => warnings.push(format!("{}: {n} objects had several samples; the first was used", field.name)),
    }
    by_object
}

/// One field's value for an object, as published.
struct Published {
    json: String,
    cell: Cell,
}

/// Publishes `value` in `format`; a non-finite value (or a time out of range) is no value.
fn publish(format: Format, value: f64) -> Option<Published> {
    if !value.is_finite() {
        return None;
    }
    let text = |json: String, cell: String| Published { json, cell: Cell::text(&cell) };
    Some(match format {
        Format::Number => {
            let value = round_to(value, RATE_STEP);
            text(quantity::decimal_si(value), quantity::rate_cell(value))
        }
        Format::Percent => {
            let ratio = round_to(value, RATIO_STEP);
            text(quantity::decimal_si(ratio), quantity::percent_cell(ratio))
        }
        Format::Cores => {
            let cores = round_cpu(value);
            text(quantity::decimal_si(cores), quantity::cpu_cell(cores))
        }
        Format::Bytes => text(quantity::binary_si(value), quantity::memory_cell(value)),
        Format::Seconds => text(duration::seconds_string(value), duration::seconds_cell(value)),
        Format::Timestamp => {
            let at = unix_time(value)?;
            Published { json: rfc3339(at), cell: Cell::Age(at) }
        }
    })
}

/// A Unix time in seconds (a PromQL value) as a timestamp, to the second; 0 or less means
/// never (a gauge not set yet).
fn unix_time(seconds: f64) -> Option<Timestamp> {
    Some(seconds).filter(|s| *s > 0.0).and_then(|s| Timestamp::from_second(s.floor() as i64).ok())
}

/// The object `key`, joined with `pods` (empty without the join).
fn item(
    list: &mut ListingBuilder,
    spec: &DeclaredSpec,
    key: &PodKey,
    pods: &[&PodInfo],
    by_field: &[SamplesBy<'_>],
    usage: &HashMap<PodKey, Containers>,
    (window, shared): (&str, &ObjectStrings),
) {
    let samples: Vec<Option<&PromSample>> = by_field.iter().map(|m| m.get(key)).collect();
    let values: Vec<Option<Published>> = spec
        .fields
        .iter()
        .zip(&samples)
        .map(|(field, sample)| sample.and_then(|s| publish(field.format, s.value)))
        .collect();
    let joined = spec.pods_label.as_ref().map(|_| GroupUsage::of(pods, usage));
    let newest = samples
        .iter()
        .zip(&values)
        .filter_map(|(sample, value)| value.as_ref().and(sample.map(|s| s.timestamp)))
        .chain(joined.and_then(|u| u.newest))
        .max();

    // Each label from the first field whose sample carries it; a value Kubernetes would
    // refuse as a label value is left out (selectors could not name it).
    let labels = spec
        .labels
        .iter()
        .filter_map(|label| {
            let value = samples.iter().flatten().find_map(|s| s.labels.get(label))?;
            is_valid_label_value(value).is_empty().then(|| (label.clone(), value.to_owned()))
        })
        .collect();
    let meta = crate::kinds::meta_of_group(key, pods, shared.labels(&labels));
    let object = Object {
        kind: &spec.info.kind,
        metadata: ObjectMeta::from(&meta),
        timestamp: newest.map(rfc3339),
        window,
        fields: spec
            .fields
            .iter()
            .zip(&values)
            .filter_map(|(field, value)| Some((field.name.as_str(), value.as_ref()?.json.as_str())))
            .collect(),
        joined: joined.map(|usage| Joined {
            pods: pods.len(),
            cpu: usage.cpu.map(quantity::decimal_si),
            memory: usage.memory.map(quantity::binary_si),
        }),
    };

    let mut cells = Vec::with_capacity(spec.columns.len());
    cells.push(Cell::Text(meta.name.clone()));
    for (field, value) in spec.fields.iter().zip(&values) {
        if field.column.is_some() {
            cells.push(value.as_ref().map_or(Cell::None, |v| v.cell.clone()));
        }
    }
    if let Some(usage) = joined {
        let text = |v: Option<String>| v.map_or(Cell::None, |v| Cell::text(&v));
        cells.push(Cell::text(&pods.len().to_string()));
        cells.push(text(usage.cpu.map(quantity::cpu_cell)));
        cells.push(text(usage.memory.map(quantity::memory_cell)));
    }
    list.push(&meta, &object, &cells);
}

/// A declared object as served: its keys in this order, fields without a value left out.
struct Object<'a> {
    kind: &'a str,
    metadata: ObjectMeta<'a>,
    timestamp: Option<String>,
    window: &'a str,
    /// The fields that have a value, in the spec's order.
    fields: Vec<(&'a str, &'a str)>,
    /// With the `pods` join.
    joined: Option<Joined>,
}

/// What the `pods` join adds to an object.
struct Joined {
    pods: usize,
    cpu: Option<String>,
    memory: Option<String>,
}

impl Serialize for Object<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("apiVersion", API_VERSION)?;
        map.serialize_entry("kind", self.kind)?;
        map.serialize_entry("metadata", &self.metadata)?;
        if let Some(timestamp) = &self.timestamp {
            map.serialize_entry("timestamp", timestamp)?;
        }
        map.serialize_entry("window", self.window)?;
        for (name, value) in &self.fields {
            map.serialize_entry(name, value)?;
        }
        if let Some(joined) = &self.joined {
            map.serialize_entry("pods", &joined.pods)?;
            if let Some(cpu) = &joined.cpu {
                map.serialize_entry("cpu", cpu)?;
            }
            if let Some(memory) = &joined.memory {
                map.serialize_entry("memory", memory)?;
            }
        }
        map.end()
    }
}
