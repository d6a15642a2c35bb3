//! `CafeBrewStats`: one object per cafe (an app that brews coffee and exports the cafe metric
//! contract), computed from its Prometheus metrics and its serving pods' kubelet usage. Its
//! type, discovery entry, OpenAPI schema, table columns and computation all live here.
//!
//! The set of cafes in a namespace is the union of the cafes Prometheus has `cafe_brews_total`
//! series for and the cafes named by running pods' `une-tasse-de.cafe/cafe` label, so a
//! Prometheus outage removes fields, not objects.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use futures::future::BoxFuture;
use jiff::Timestamp;
use serde::Serialize;
use serde_json::json;

use super::inputs::{GroupUsage, round_to};
use super::{
    API_VERSION, Builtin, Cell, Column, Computation, ComputeError, KindInfo, Listing, ListingBuilder,
    ObjectMeta, QuerySpec, SamplesBy, ServedKind, Sources, Text, Texts, index_by, kind_schema, rfc3339,
    schema_name,
};
use crate::sources::{PodInfo, PodKey, PromSample};
use apiserver::intern::ObjectStrings;
use k8s_wire::{duration, quantity};

/// Pod label naming the cafe a pod serves.
pub(crate) const CAFE_LABEL: &str = "une-tasse-de.cafe/cafe";
/// Object label carrying the cafe's type (espresso, lungo, cappuccino, latte).
pub(crate) const TYPE_LABEL: &str = "une-tasse-de.cafe/type";
/// A cafe is ready when its temperature is within this band (°C), inclusive.
pub(crate) const READY_BAND: (f64, f64) = (60.0, 95.0);

static INFO: KindInfo = KindInfo {
    gv: super::STATS,
    plural: Text::Borrowed("cafebrewstats"),
    singular: Text::Borrowed("cafebrewstats"),
    kind: Text::Borrowed("CafeBrewStats"),
    list_kind: Text::Borrowed("CafeBrewStatsList"),
    short_names: Texts::Borrowed(&[Text::Borrowed("brews")]),
    categories: Texts::Borrowed(&[Text::Borrowed("percolator")]),
    namespaced: true,
    description: Text::Borrowed(
        "CafeBrewStats is the live brewing activity of one cafe (an application that brews coffee \
                  and exports the cafe metrics), computed at request time from its Prometheus metrics and \
                  its serving pods' kubelet usage. Fields whose source has no data are omitted.",
    ),
    typed_list_items: true,
};

/// The brew-duration quantile `q` of each cafe over the window.
macro_rules! quantile {
    ($q:literal) => {
        concat!(
            "histogram_quantile(",
            $q,
            ", sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))"
        )
    };
}

/// The kind in the registry.
pub(crate) static KIND: Builtin = Builtin {
    info: &INFO,
    section: "cafeBrewStats",
    queries: &[&BREWS, &FAILURES, &P50, &P95, &P99, &TEMPERATURE, &LAST_BREWED],
    build: |sources| Arc::new(CafeBrewStatsKind::new(sources)),
};

// Results keep the `namespace` and `cafe` labels; `brews` also keeps `type`.

/// Completed brews in the window, per cafe and type.
static BREWS: QuerySpec =
    QuerySpec::new("brews", "sum by (namespace, cafe, type) (increase(cafe_brews_total{SCOPE}[WINDOW]))");
/// Failed brews in the window, per cafe.
static FAILURES: QuerySpec = QuerySpec::new(
    "failures",
    "sum by (namespace, cafe) (increase(cafe_brew_failures_total{SCOPE}[WINDOW]))",
);
/// Median brew time in seconds, per cafe.
static P50: QuerySpec = QuerySpec::new("p50", quantile!("0.5"));
/// 95th percentile brew time in seconds, per cafe.
static P95: QuerySpec = QuerySpec::new("p95", quantile!("0.95"));
/// 99th percentile brew time in seconds, per cafe.
static P99: QuerySpec = QuerySpec::new("p99", quantile!("0.99"));
/// Current temperature in °C, per cafe.
static TEMPERATURE: QuerySpec =
    QuerySpec::new("temperature", "max by (namespace, cafe) (cafe_temperature_celsius{SCOPE})");
/// Unix time of the last completed brew, per cafe.
static LAST_BREWED: QuerySpec =
    QuerySpec::new("lastBrewed", "max by (namespace, cafe) (cafe_last_brew_timestamp_seconds{SCOPE})");

static COLUMNS: &[Column] = &[
    Column::object_name("Name of the cafe."),
    Column::text("Type", "What the cafe brews."),
    Column::text("Brews/min", "Completed brews per minute over the window."),
    Column::text("P95", "95th percentile brew time."),
    Column::text("Temp", "Current temperature in °C."),
    Column::text("Ready", "Temperature within 60–95 °C and at least one serving pod running."),
    Column::text("Last Brewed", "Time since the last brew."),
    Column::text("Failures", "Failed brews over the window.").wide(),
    Column::text("Pods", "Serving pods running.").wide(),
    Column::quantity("CPU", "CPU of the serving pods.").wide(),
    Column::quantity("Memory", "Memory working set of the serving pods.").wide(),
];

/// Computes CafeBrewStats from the sources.
#[derive(Debug)]
pub(crate) struct CafeBrewStatsKind {
    sources: Sources,
    /// The cafes' names and label sets, shared from one refresh to the next.
    shared: ObjectStrings,
}

/// Query results of one computation, indexed by (namespace, cafe).
struct Series {
    brews: SamplesBy<'static>,
    failures: SamplesBy<'static>,
    p50: SamplesBy<'static>,
    p95: SamplesBy<'static>,
    p99: SamplesBy<'static>,
    temperature: SamplesBy<'static>,
    last_brewed: SamplesBy<'static>,
}

impl CafeBrewStatsKind {
    /// Builds the kind from its sources (queries come from `sources.config`).
    pub(crate) fn new(sources: Sources) -> Self {
        Self { sources, shared: ObjectStrings::default() }
    }

    async fn compute(&self, namespace: Option<&str>) -> Result<Arc<Listing>, ComputeError> {
        let Computation { pods, resource_version, config } = self.sources.begin(namespace)?;
        let serving: Vec<Arc<PodInfo>> =
            pods.into_iter().filter(|p| p.labels.contains_key(CAFE_LABEL)).collect();
        let (s, w) = (&self.sources, config.window);
        let q = |spec: &'static QuerySpec| s.query(spec.field, KIND.query(&config, spec), namespace, w);
        let (usage, brews, failures, p50, p95, p99, temperature, last_brewed) = futures::join!(
            s.pod_usage(&serving),
            q(&BREWS),
            q(&FAILURES),
            s.query("brewDuration.p50", KIND.query(&config, &P50), namespace, w),
            s.query("brewDuration.p95", KIND.query(&config, &P95), namespace, w),
            s.query("brewDuration.p99", KIND.query(&config, &P99), namespace, w),
            q(&TEMPERATURE),
            q(&LAST_BREWED),
        );
        let (usage, usage_warning) = usage;
        let mut warnings: Vec<String> = usage_warning.into_iter().collect();
        let series = Series {
            brews: index_by(brews.map(per_cafe), "brews", "cafe", &mut warnings),
            failures: index_by(failures, "failures", "cafe", &mut warnings),
            p50: index_by(p50, "brewDuration.p50", "cafe", &mut warnings),
            p95: index_by(p95, "brewDuration.p95", "cafe", &mut warnings),
            p99: index_by(p99, "brewDuration.p99", "cafe", &mut warnings),
            temperature: index_by(temperature, "temperature", "cafe", &mut warnings),
            last_brewed: index_by(last_brewed, "lastBrewed", "cafe", &mut warnings),
        };

        // Every cafe Prometheus or the inventory knows, with its serving pods.
        let mut cafes: BTreeMap<PodKey, Vec<&PodInfo>> = BTreeMap::new();
        for (namespace, cafe) in series.brews.keys() {
            cafes
                .entry(PodKey { namespace: self.shared.name(namespace), name: self.shared.name(cafe) })
                .or_default();
        }
        for pod in &serving {
            if let Some(cafe) = pod.labels.get(CAFE_LABEL) {
                cafes
                    .entry(PodKey { namespace: pod.namespace.clone(), name: self.shared.name(cafe) })
                    .or_default()
                    .push(pod);
            }
        }
        let window = duration::go_string(w);
        let mut list = ListingBuilder::new(&INFO, resource_version);
        list.reserve(cafes.len());
        for (key, pods) in &cafes {
            // A label value that is not a valid object name cannot be served (or fetched).
            if k8s_wire::is_dns1123_subdomain(&key.name).is_empty() {
                self.item(&mut list, key, pods, &series, &usage, (&window, w));
            }
        }
        Ok(Arc::new(list.finish(warnings)))
    }

    fn item(
        &self,
        list: &mut ListingBuilder,
        key: &PodKey,
        pods: &[&PodInfo],
        series: &Series,
        usage: &HashMap<PodKey, crate::sources::Containers>,
        (window, window_duration): (&str, std::time::Duration),
    ) {
        let value = |samples: &SamplesBy<'_>| samples.get(key).map(|s| s.value).filter(|v| v.is_finite());
        let window_seconds = window_duration.as_secs_f64();
        let brews = value(&series.brews).map(|v| v.max(0.0));
        let failures = value(&series.failures).map(|v| v.max(0.0));
        let brews_per_minute = brews.map(|b| round_to(b * 60.0 / window_seconds, 1e-3));
        let failure_ratio = match (brews, failures) {
            (Some(b), Some(f)) if b + f > 0.0 => Some(round_to(f / (b + f), 1e-6)),
            _ => None,
        };
        let p50 = value(&series.p50);
        let p95 = value(&series.p95);
        let p99 = value(&series.p99);
        let temperature = value(&series.temperature).map(|t| round_to(t, 1e-3));
        let last_brewed = value(&series.last_brewed)
            .filter(|t| *t > 0.0)
            .and_then(|t| Timestamp::from_second(t.floor() as i64).ok());
        let kind_type = series.brews.get(key).and_then(|s| s.labels.get("type")).map(str::to_owned);

        // Serving pods' usage: the sum over pods, only when every pod has it.
        let GroupUsage { cpu, memory, .. } = GroupUsage::of(pods, usage);
        let ready =
            temperature.is_some_and(|t| (READY_BAND.0..=READY_BAND.1).contains(&t)) && !pods.is_empty();

        let mut labels = BTreeMap::from([(CAFE_LABEL.to_string(), key.name.to_string())]);
        if let Some(t) = &kind_type {
            labels.insert(TYPE_LABEL.to_string(), t.clone());
        }
        let meta = super::meta_of_group(key, pods, self.shared.labels(&labels));
        let object = CafeBrewStats {
            api_version: API_VERSION,
            kind: &INFO.kind,
            metadata: ObjectMeta::from(&meta),
            type_: kind_type.as_deref(),
            window,
            brews: brews.map(|b| b.round() as u64),
            brews_per_minute: brews_per_minute.map(quantity::decimal_si),
            failures: failures.map(|f| f.round() as u64),
            failure_ratio: failure_ratio.map(quantity::decimal_si),
            brew_duration: BrewDuration {
                p50: p50.map(duration::seconds_string),
                p95: p95.map(duration::seconds_string),
                p99: p99.map(duration::seconds_string),
            },
            temperature: temperature.map(quantity::decimal_si),
            last_brewed: last_brewed.map(rfc3339),
            ready,
            pods: pods.len(),
            cpu: cpu.map(quantity::decimal_si),
            memory: memory.map(quantity::binary_si),
        };
        let text = |v: Option<String>| v.map_or(Cell::None, |v| Cell::text(&v));
        let cells = [
            Cell::Text(meta.name.clone()),
            text(kind_type.clone()),
            text(brews_per_minute.map(quantity::rate_cell)),
            text(p95.map(duration::seconds_cell)),
            text(temperature.map(|t| trim(format!("{t:.1}")))),
            Cell::text(&ready.to_string()),
            last_brewed.map_or(Cell::None, Cell::Age),
            text(failures.map(|f| format!("{}", f.round() as u64))),
            Cell::text(&pods.len().to_string()),
            text(cpu.map(quantity::cpu_cell)),
            text(memory.map(quantity::memory_cell)),
        ];
        list.push(&meta, &object, &cells);
    }
}

fn trim(text: String) -> String {
    if text.contains('.') { text.trim_end_matches('0').trim_end_matches('.').to_string() } else { text }
}

impl ServedKind for CafeBrewStatsKind {
    fn info(&self) -> &KindInfo {
        &INFO
    }

    fn columns(&self) -> &[Column] {
        COLUMNS
    }

    fn schemas(&self) -> Vec<(String, serde_json::Value)> {
        let string = |description: &str| json!({"type": "string", "description": description});
        let integer =
            |description: &str| json!({"type": "integer", "format": "int64", "description": description});
        let durations = json!({
            "type": "object",
            "description": "Brew time percentiles over the window, from the cafe_brew_duration_seconds histogram (histogram_quantile), as durations (21.5s). A percentile is omitted when the histogram has no observations in the window.",
            "properties": {
                "p50": string("Median brew time."),
                "p95": string("95th percentile brew time."),
                "p99": string("99th percentile brew time."),
            }
        });
        let object = kind_schema(
            &INFO,
            "Standard object metadata: the name is the cafe's name (its pods' une-tasse-de.cafe/cafe label); labels carry the cafe and its type.",
            json!({
                "type": string("What the cafe brews: espresso, lungo, cappuccino or latte (the type label of its metrics)."),
                "window": string("Range the counts and rates are computed over, as a duration (5m0s)."),
                "brews": integer("Completed brews in the window (increase of cafe_brews_total)."),
                "brewsPerMinute": string("Completed brews per minute over the window, a Quantity (8400m for 8.4/min)."),
                "failures": integer("Failed brews in the window (increase of cafe_brew_failures_total)."),
                "failureRatio": string("failures / (brews + failures) over the window, a Quantity (23m for 2.3%). Omitted when nothing was brewed."),
                "brewDuration": {"$ref": format!("#/components/schemas/{}", schema_name(super::STATS, "CafeBrewDuration")), "description": "Brew time percentiles over the window."},
                "temperature": string("Current temperature of the cafe's machine in °C, a Quantity (the latest cafe_temperature_celsius sample)."),
                "lastBrewed": {"type": "string", "format": "date-time", "description": "When the cafe last completed a brew (cafe_last_brew_timestamp_seconds), RFC 3339."},
                "ready": {"type": "boolean", "description": "True when the temperature is within 60–95 °C and at least one serving pod is running."},
                "pods": integer("Running pods serving the cafe (pods labelled une-tasse-de.cafe/cafe=<name>)."),
                "cpu": string("CPU usage of the serving pods in cores, summed (a Quantity), from the kubelets. Omitted when any pod has no CPU rate yet."),
                "memory": string("Memory working set of the serving pods, summed (a Quantity), from the kubelets."),
            }),
        );
        vec![
            (schema_name(super::STATS, &INFO.kind), object),
            (schema_name(super::STATS, "CafeBrewDuration"), durations),
        ]
    }

    fn list<'a>(&'a self, namespace: Option<&'a str>) -> BoxFuture<'a, Result<Arc<Listing>, ComputeError>> {
        Box::pin(self.compute(namespace))
    }
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct CafeBrewStats<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: ObjectMeta<'a>,
    #[serde(rename = "type", skip_serializing_if = "Option::is_none")]
    type_: Option<&'a str>,
    window: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    brews: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    brews_per_minute: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failures: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    failure_ratio: Option<String>,
    brew_duration: BrewDuration,
    #[serde(skip_serializing_if = "Option::is_none")]
    temperature: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    last_brewed: Option<String>,
    ready: bool,
    pods: usize,
    #[serde(skip_serializing_if = "Option::is_none")]
    cpu: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    memory: Option<String>,
}

#[derive(Serialize)]
struct BrewDuration {
    #[serde(skip_serializing_if = "Option::is_none")]
    p50: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p95: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    p99: Option<String>,
}

/// Folds the per-type brew counts into one sample per cafe: the sum of the finite counts, the
/// type that brewed the most (the first by name on a tie) and the newest time. A cafe whose
/// counts are all non-finite keeps one of them, so it is still listed, without `brews`.
fn per_cafe(mut samples: Vec<PromSample>) -> Vec<PromSample> {
    use std::collections::btree_map::Entry;
    samples.sort_by(|a, b| a.labels.get("type").cmp(&b.labels.get("type")));
    let mut cafes: BTreeMap<(String, String), (PromSample, f64)> = BTreeMap::new();
    for sample in samples {
        let (Some(namespace), Some(cafe)) = (sample.labels.get("namespace"), sample.labels.get("cafe"))
        else {
            continue;
        };
        let value = sample.value;
        match cafes.entry((namespace.to_owned(), cafe.to_owned())) {
            Entry::Vacant(slot) => {
                slot.insert((sample, value));
            }
            Entry::Occupied(mut slot) if value.is_finite() => {
                let (total, most) = slot.get_mut();
                if !total.value.is_finite() {
                    *total = sample;
                    *most = value;
                    continue;
                }
                total.value += value;
                total.timestamp = total.timestamp.max(sample.timestamp);
                if value > *most {
                    *most = value;
                    if let Some(kind) = sample.labels.get("type") {
                        total.labels = total.labels.with("type", kind);
                    }
                }
            }
            Entry::Occupied(_) => {}
        }
    }
    cafes.into_values().map(|(sample, _)| sample).collect()
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;
    use crate::kinds::testkit::*;
    use crate::sources::PromError;

    #[test]
    fn trims_temperature_cells() {
        assert_eq!(trim(format!("{:.1}", 90.0)), "90");
        assert_eq!(trim(format!("{:.1}", 45.5)), "45.5");
    }

    fn mk_kind(
        inventory: Arc<FakeInventory>,
        kubelet: Arc<FakeKubelet>,
        prom: Arc<FakeProm>,
    ) -> Arc<dyn ServedKind> {
        (KIND.build)(mk_sources(inventory, kubelet, prom))
    }

    fn mk_serving(namespace: &str, name: &str, node: &str, cafe: &str, created: &str) -> Arc<PodInfo> {
        mk_pod(namespace, name, node, &[(CAFE_LABEL, cafe), ("app", "brew")], &["app"], created)
    }

    fn mk_cafe(namespace: &str, cafe: &str, value: f64) -> PromSample {
        mk_sample(&[("namespace", namespace), ("cafe", cafe)], value, AT)
    }

    fn mk_brews(namespace: &str, cafe: &str, kind: &str, value: f64) -> PromSample {
        mk_sample(&[("namespace", namespace), ("cafe", cafe), ("type", kind), ("pod", "ignored")], value, AT)
    }

    /// In `ns`: espresso-du-matin (two pods on node-a, every series), lungo-froid (one pod on
    /// node-b, too cold), prom-only (series, no pod), Bad_Name (a pod and a series, not a valid
    /// name) and web-1 (on node-c, serving no cafe); in `other`: espresso-du-soir.
    fn mk_cafes() -> (Arc<FakeInventory>, Arc<FakeKubelet>, Arc<FakeProm>) {
        let inventory = FakeInventory::with(vec![
            mk_serving("ns", "brew-1", "node-a", "espresso-du-matin", "2026-07-01T09:00:00Z"),
            mk_serving("ns", "brew-2", "node-a", "espresso-du-matin", "2026-07-01T08:00:00Z"),
            mk_serving("ns", "cold-1", "node-b", "lungo-froid", "2026-07-01T07:00:00Z"),
            mk_serving("ns", "bad-1", "node-a", "Bad_Name", "2026-07-01T07:00:00Z"),
            mk_pod("ns", "web-1", "node-c", &[("app", "web")], &["app"], "2026-07-01T07:00:00Z"),
            mk_serving("other", "brew-9", "node-d", "espresso-du-soir", "2026-07-01T06:00:00Z"),
        ]);
        let usage = |cpu: f64, memory: f64| vec![mk_container("app", Some(cpu), Some(memory), AT)];
        let kubelet = FakeKubelet::default()
            .node(
                "node-a",
                vec![
                    ("ns", "brew-1", usage(0.02, 30.0 * MI)),
                    ("ns", "brew-2", usage(0.015, 18.0 * MI)),
                    ("ns", "bad-1", usage(0.3, 300.0 * MI)),
                ],
            )
            .node("node-b", vec![("ns", "cold-1", usage(0.005, 10.0 * MI))])
            .node("node-c", vec![("ns", "web-1", usage(0.7, 700.0 * MI))])
            .node("node-d", vec![("other", "brew-9", usage(0.001, MI))]);
        let prom = FakeProm::default()
            .answer(
                "cafe_brews_total",
                vec![
                    mk_brews("ns", "espresso-du-matin", "espresso", 42.4),
                    mk_brews("ns", "lungo-froid", "lungo", 0.0),
                    mk_brews("ns", "prom-only", "cappuccino", 12.0),
                    mk_brews("ns", "Bad_Name", "latte", 3.0),
                    mk_brews("other", "espresso-du-soir", "espresso", 5.0),
                ],
            )
            .answer("cafe_brew_failures_total", vec![mk_cafe("ns", "espresso-du-matin", 1.0)])
            .answer("histogram_quantile(0.5,", vec![mk_cafe("ns", "espresso-du-matin", 21.5)])
            .answer("histogram_quantile(0.95,", vec![mk_cafe("ns", "espresso-du-matin", 28.04)])
            .answer("histogram_quantile(0.99,", vec![mk_cafe("ns", "espresso-du-matin", 75.25)])
            .answer(
                "cafe_temperature_celsius",
                vec![
                    mk_cafe("ns", "espresso-du-matin", 90.0004),
                    mk_cafe("ns", "lungo-froid", 45.5),
                    mk_cafe("ns", "prom-only", 80.0),
                ],
            )
            // 2026-07-01T09:59:41Z and seven tenths.
            .answer(
                "cafe_last_brew_timestamp_seconds",
                vec![mk_cafe("ns", "espresso-du-matin", 1_782_899_981.7)],
            );
        (inventory, Arc::new(kubelet), Arc::new(prom))
    }

    fn mk_objects(listing: &Listing) -> Vec<Value> {
        listing.items.iter().map(mk_json).collect()
    }

    /// The metadata of `mk_cafes`' espresso cafe, with the labels it carries.
    fn espresso_metadata(labels: Value) -> Value {
        json!({
            "name": "espresso-du-matin",
            "namespace": "ns",
            "creationTimestamp": "2026-07-01T08:00:00Z",
            "labels": labels,
        })
    }

    #[test]
    fn a_cafe_brewing_several_types_is_one_object_with_the_sum_and_its_main_type() {
        let later =
            mk_sample(&[("namespace", "ns"), ("cafe", "a"), ("type", "lungo")], 30.0, "2026-07-01T10:00:05Z");
        let samples = vec![
            mk_brews("ns", "a", "latte", 12.0),
            later,
            mk_brews("ns", "a", "espresso", 30.0),
            mk_brews("ns", "a", "mocha", f64::NAN),
            mk_brews("ns", "b", "espresso", f64::NAN),
            mk_brews("other", "a", "latte", 1.0),
        ];
        let folded = per_cafe(samples);
        let summary: Vec<(String, String, String, String, String)> = folded
            .iter()
            .map(|s| {
                let label = |name: &str| s.labels.get(name).unwrap_or_default().to_owned();
                (
                    label("namespace"),
                    label("cafe"),
                    label("type"),
                    s.value.to_string(),
                    s.timestamp.to_string(),
                )
            })
            .collect();
        let row = |ns: &str, cafe: &str, kind: &str, value: &str, at: &str| {
            (ns.to_owned(), cafe.to_owned(), kind.to_owned(), value.to_owned(), at.to_owned())
        };
        assert_eq!(
            summary,
            [
                // 12 + 30 + 30; espresso and lungo tie at 30: the first by name wins.
                row("ns", "a", "espresso", "72", "2026-07-01T10:00:05Z"),
                row("ns", "b", "espresso", "NaN", AT),
                row("other", "a", "latte", "1", AT),
            ]
        );
    }

    #[tokio::test]
    async fn normal_cafe_joins_its_series_and_serving_pods() {
        let (inventory, kubelet, prom) = mk_cafes();
        let listing = mk_kind(inventory, kubelet.clone(), prom).list(Some("ns")).await.unwrap();
        let cafe = &listing.items[0];
        // 42.4 brews in 5m = 8.48/min; failures 1 / (42.4 + 1); cpu 0.02 + 0.015; memory 30Mi + 18Mi.
        assert_eq!(
            mk_json(cafe),
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "CafeBrewStats",
                "metadata": espresso_metadata(json!({"une-tasse-de.cafe/cafe": "espresso-du-matin", "une-tasse-de.cafe/type": "espresso"})),
                "type": "espresso",
                "window": "5m0s",
                "brews": 42,
                "brewsPerMinute": "8480m",
                "failures": 1,
                "failureRatio": "23041u",
                "brewDuration": {"p50": "21.5s", "p95": "28.04s", "p99": "1m15.25s"},
                "temperature": "90",
                "lastBrewed": "2026-07-01T09:59:41Z",
                "ready": true,
                "pods": 2,
                "cpu": "35m",
                "memory": "48Mi",
            })
        );
        assert_eq!(
            mk_cells(cafe),
            [
                "espresso-du-matin",
                "espresso",
                "8.48",
                "28s",
                "90",
                "true",
                "age:2026-07-01T09:59:41Z",
                "1",
                "2",
                "35m",
                "48Mi"
            ]
        );
        assert_eq!(listing.warnings, Vec::<String>::new());
        assert_eq!(listing.resource_version, "42");
        assert_eq!(kubelet.called(), ["node-a", "node-b"], "only the nodes of serving pods of the namespace");
    }

    #[tokio::test]
    async fn a_refresh_shares_the_cafes_names_and_label_sets_of_the_one_before() {
        let (inventory, kubelet, prom) = mk_cafes();
        let kind = mk_kind(inventory, kubelet, prom);
        let (first, second) = (kind.list(None).await.unwrap(), kind.list(None).await.unwrap());
        assert!(!first.items.is_empty());
        assert_eq!(first.items.len(), second.items.len());
        for (a, b) in first.items.iter().zip(&second.items) {
            assert!(Arc::ptr_eq(&a.meta.name, &b.meta.name), "{}", a.meta.name);
            assert!(Arc::ptr_eq(&a.meta.labels, &b.meta.labels), "{:?}", a.meta.labels);
        }
    }

    #[tokio::test]
    async fn cafe_too_cold_is_not_ready_and_cafe_without_pods_neither() {
        let (inventory, kubelet, prom) = mk_cafes();
        let listing = mk_kind(inventory, kubelet, prom).list(Some("ns")).await.unwrap();
        let objects = mk_objects(&listing);
        let names: Vec<&Value> = objects.iter().map(|o| &o["metadata"]["name"]).collect();
        assert_eq!(names, ["espresso-du-matin", "lungo-froid", "prom-only"]);
        assert_eq!(
            objects[1],
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "CafeBrewStats",
                "metadata": {
                    "name": "lungo-froid",
                    "namespace": "ns",
                    "creationTimestamp": "2026-07-01T07:00:00Z",
                    "labels": {"une-tasse-de.cafe/cafe": "lungo-froid", "une-tasse-de.cafe/type": "lungo"},
                },
                "type": "lungo",
                "window": "5m0s",
                "brews": 0,
                "brewsPerMinute": "0",
                "brewDuration": {},
                "temperature": "45500m",
                "ready": false,
                "pods": 1,
                "cpu": "5m",
                "memory": "10Mi",
            })
        );
        assert_eq!(
            mk_cells(&listing.items[1]),
            ["lungo-froid", "lungo", "0", "<none>", "45.5", "false", "<none>", "<none>", "1", "5m", "10Mi"]
        );
        // Within the band but served by no pod.
        assert_eq!(
            objects[2],
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "CafeBrewStats",
                "metadata": {
                    "name": "prom-only",
                    "namespace": "ns",
                    "labels": {"une-tasse-de.cafe/cafe": "prom-only", "une-tasse-de.cafe/type": "cappuccino"},
                },
                "type": "cappuccino",
                "window": "5m0s",
                "brews": 12,
                "brewsPerMinute": "2400m",
                "brewDuration": {},
                "temperature": "80",
                "ready": false,
                "pods": 0,
            })
        );
        assert_eq!(
            mk_cells(&listing.items[2]),
            [
                "prom-only",
                "cappuccino",
                "2.4",
                "<none>",
                "80",
                "false",
                "<none>",
                "<none>",
                "0",
                "<none>",
                "<none>"
            ]
        );
    }

    #[tokio::test]
    async fn ready_band_is_inclusive() {
        let temperatures = [("a", 59.9), ("b", 60.0), ("c", 95.0), ("d", 95.1), ("e", 95.0004)];
        let pods = temperatures.iter().map(|(c, _)| mk_serving("ns", c, "node-a", c, AT)).collect();
        let prom = FakeProm::default().answer(
            "cafe_temperature_celsius",
            temperatures.iter().map(|(c, t)| mk_cafe("ns", c, *t)).collect(),
        );
        let kubelet = FakeKubelet::default().node("node-a", vec![]);
        let listing = mk_kind(FakeInventory::with(pods), Arc::new(kubelet), Arc::new(prom))
            .list(Some("ns"))
            .await
            .unwrap();
        let ready: Vec<(Value, Value)> =
            mk_objects(&listing).iter().map(|o| (o["temperature"].clone(), o["ready"].clone())).collect();
        assert_eq!(
            ready,
            [
                (json!("59900m"), json!(false)),
                (json!("60"), json!(true)),
                (json!("95"), json!(true)),
                (json!("95100m"), json!(false)),
                (json!("95"), json!(true)),
            ]
        );
    }

    #[tokio::test]
    async fn prometheus_down_keeps_cafes_known_from_pod_labels() {
        let (inventory, kubelet, _) = mk_cafes();
        let prom = Arc::new(FakeProm::down(PromError::Unreachable("timeout".into())));
        let listing = mk_kind(inventory, kubelet, prom).list(Some("ns")).await.unwrap();
        let objects = mk_objects(&listing);
        assert_eq!(objects.len(), 2, "{objects:?}");
        assert_eq!(
            objects[0],
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "CafeBrewStats",
                "metadata": espresso_metadata(json!({"une-tasse-de.cafe/cafe": "espresso-du-matin"})),
                "window": "5m0s",
                "brewDuration": {},
                "ready": false,
                "pods": 2,
                "cpu": "35m",
                "memory": "48Mi",
            })
        );
        assert_eq!(
            mk_cells(&listing.items[0]),
            [
                "espresso-du-matin",
                "<none>",
                "<none>",
                "<none>",
                "<none>",
                "false",
                "<none>",
                "<none>",
                "2",
                "35m",
                "48Mi"
            ]
        );
        assert_eq!(objects[1]["metadata"]["name"], "lungo-froid");
        let warning = |field: &str| format!("{field} omitted: prometheus unreachable: timeout");
        assert_eq!(
            listing.warnings,
            [
                "brews",
                "failures",
                "brewDuration.p50",
                "brewDuration.p95",
                "brewDuration.p99",
                "temperature",
                "lastBrewed"
            ]
            .map(warning)
        );
    }

    #[tokio::test]
    async fn cafe_usage_is_omitted_when_a_serving_pod_has_none() {
        let inventory = FakeInventory::with(vec![
            mk_serving("ns", "brew-1", "node-a", "moka", AT),
            mk_serving("ns", "brew-2", "node-b", "moka", AT),
        ]);
        let kubelet = FakeKubelet::default()
            .node("node-a", vec![("ns", "brew-1", vec![mk_container("app", Some(0.02), Some(MI), AT)])])
            .down("node-b", crate::sources::KubeletError::ScrapeError { node: "node-b".into() });
        let listing = mk_kind(inventory, Arc::new(kubelet), Arc::default()).list(Some("ns")).await.unwrap();
        let object = mk_json(&listing.items[0]);
        assert_eq!((object.get("cpu"), object.get("memory"), &object["pods"]), (None, None, &json!(2)));
        assert_eq!(
            listing.warnings,
            ["cpu and memory omitted for pods on 1 node: kubelet on node node-b reported a scrape error"]
        );
    }

    #[tokio::test]
    async fn cafe_label_value_that_is_not_an_object_name_is_skipped() {
        let (inventory, kubelet, prom) = mk_cafes();
        let listing = mk_kind(inventory, kubelet, prom).list(None).await.unwrap();
        let keys: Vec<(String, String)> =
            listing.items.iter().map(|i| (i.meta.namespace.to_string(), i.meta.name.to_string())).collect();
        let expected = [
            ("ns", "espresso-du-matin"),
            ("ns", "lungo-froid"),
            ("ns", "prom-only"),
            ("other", "espresso-du-soir"),
        ];
        assert_eq!(keys, expected.map(|(ns, name)| (ns.to_owned(), name.to_owned())));
        assert_eq!(listing.warnings, Vec::<String>::new());
    }

    #[tokio::test]
    async fn namespace_list_sends_scoped_promql() {
        let (inventory, kubelet, prom) = mk_cafes();
        mk_kind(inventory, kubelet, prom.clone()).list(Some("ns")).await.unwrap();
        let mut expected = [
            r#"sum by (namespace, cafe, type) (increase(cafe_brews_total{namespace="ns"}[5m]))"#,
            r#"sum by (namespace, cafe) (increase(cafe_brew_failures_total{namespace="ns"}[5m]))"#,
            r#"histogram_quantile(0.5, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{namespace="ns"}[5m])))"#,
            r#"histogram_quantile(0.95, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{namespace="ns"}[5m])))"#,
            r#"histogram_quantile(0.99, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{namespace="ns"}[5m])))"#,
            r#"max by (namespace, cafe) (cafe_temperature_celsius{namespace="ns"})"#,
            r#"max by (namespace, cafe) (cafe_last_brew_timestamp_seconds{namespace="ns"})"#,
        ];
        expected.sort();
        assert_eq!(prom.received(), expected);
    }

    #[tokio::test]
    async fn all_namespaces_list_sends_unscoped_promql() {
        let (inventory, kubelet, prom) = mk_cafes();
        let listing = mk_kind(inventory, kubelet.clone(), prom.clone()).list(None).await.unwrap();
        assert_eq!(
            mk_json(&listing.items[3]),
            json!({
                "apiVersion": "stats.une-tasse-de.cafe/v1alpha1",
                "kind": "CafeBrewStats",
                "metadata": {
                    "name": "espresso-du-soir",
                    "namespace": "other",
                    "creationTimestamp": "2026-07-01T06:00:00Z",
                    "labels": {"une-tasse-de.cafe/cafe": "espresso-du-soir", "une-tasse-de.cafe/type": "espresso"},
                },
                "type": "espresso",
                "window": "5m0s",
                "brews": 5,
                "brewsPerMinute": "1",
                "brewDuration": {},
                "ready": false,
                "pods": 1,
                "cpu": "1m",
                "memory": "1Mi",
            })
        );
        assert_eq!(kubelet.called(), ["node-a", "node-b", "node-d"]);
        let received = prom.received();
        assert_eq!(received.len(), 7);
        assert!(received.iter().all(|q| !q.contains("namespace=")), "{received:#?}");
        assert!(
            received.contains(&"max by (namespace, cafe) (cafe_temperature_celsius{})".to_owned()),
            "{received:#?}"
        );
    }
}
