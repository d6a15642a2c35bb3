//! Simulated cafes: applications that brew coffee and export the cafe metric contract
//! (docs/design.md, "API surface"), generated deterministically from the seed.
//!
//! A cafe has a type (`espresso`, `lungo`, `cappuccino`, `latte`), 1–3 serving pods
//! (`app: cafe`, `une-tasse-de.cafe/cafe: <name>`) and a known behaviour:
//! - brews at a constant rate (2–12 per minute, split evenly over its pods), fails at a
//!   constant fraction of that rate (0–12 %, reasons `grind` 70 % and `pressure` 30 %);
//! - brew durations are uniform on `[min, max]`, both histogram bucket bounds, so the
//!   histogram's buckets are exactly `count × CDF(le)` and `histogram_quantile` (linear within
//!   a bucket) gives the exact quantile `min + q × (max − min)`;
//! - its temperature is a sine curve sampled in 30 s steps of wall time (piecewise constant,
//!   rounded to 0.1 °C). In each namespace the first cafe always stays inside the 60–95 °C
//!   band; the second cafe of the first namespace always stays outside it (a cold machine at
//!   40–50 °C); the others leave the band part of the time (overheating above 95 °C or cooling
//!   below 60 °C).
//!
//! [`EXPORTER`] writes the series, one set per serving pod, linear in time from the pod's
//! counter origin like the HTTP counters.

use std::f64::consts::PI;

use super::apps::{Exporter, Family, FamilyType, SeriesSink, SeriesValue};
use super::rng::SplitMix64;
use super::workload::SimPod;

const DOMAIN_CAFE: u64 = 20;
const DOMAIN_CAFE_NAME: u64 = 21;

/// Length of one temperature step (seconds of wall time): the temperature is constant from
/// one multiple of it to the next.
pub(super) const TEMPERATURE_STEP_SECONDS: i64 = 30;

/// Failure reasons of `cafe_brew_failures_total` and their shares of the failures.
pub(super) const FAILURE_REASONS: [(&str, f64); 2] = [("grind", 0.7), ("pressure", 0.3)];

/// Label of a serving pod naming its cafe.
pub(super) const CAFE_LABEL: &str = "une-tasse-de.cafe/cafe";

/// What a cafe brews (its `type` label).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(super) enum CafeType {
    /// `espresso`
    Espresso,
    /// `lungo`
    Lungo,
    /// `cappuccino`
    Cappuccino,
    /// `latte`
    Latte,
}

impl CafeType {
    /// Every type, in the order cafes cycle through them.
    pub(super) const ALL: [CafeType; 4] =
        [CafeType::Espresso, CafeType::Lungo, CafeType::Cappuccino, CafeType::Latte];

    /// The `type` label value.
    pub(super) fn as_str(self) -> &'static str {
        match self {
            CafeType::Espresso => "espresso",
            CafeType::Lungo => "lungo",
            CafeType::Cappuccino => "cappuccino",
            CafeType::Latte => "latte",
        }
    }
}

/// A value sampled in steps of [`TEMPERATURE_STEP_SECONDS`]:
/// `base + amplitude × sin(2π × (step + phase) / period)`, rounded to 0.1, where
/// `step = floor(t / 30)` counts steps since the epoch.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct StepCurve {
    /// Centre of the curve.
    pub base: f64,
    /// Half the peak-to-peak swing.
    pub amplitude: f64,
    /// Steps per period (at least 1).
    pub period_steps: u32,
    /// Offset of the curve, in steps.
    pub phase_steps: u32,
}

impl StepCurve {
    /// The step number of unix time `t`.
    pub(super) fn step(t: f64) -> i64 {
        (t / TEMPERATURE_STEP_SECONDS as f64).floor() as i64
    }

    /// Unix time at which the step containing `t` started.
    pub(super) fn step_start(t: f64) -> i64 {
        Self::step(t) * TEMPERATURE_STEP_SECONDS
    }

    /// The value during step number `step`.
    pub(super) fn at_step(&self, step: i64) -> f64 {
        let period = i64::from(self.period_steps.max(1));
        let k = (step + i64::from(self.phase_steps)).rem_euclid(period);
        let v = self.base + self.amplitude * (2.0 * PI * k as f64 / period as f64).sin();
        (v * 10.0).round() / 10.0
    }

    /// The value at unix time `t`.
    pub(super) fn at(&self, t: f64) -> f64 {
        self.at_step(Self::step(t))
    }

    /// The lowest and highest values the curve ever takes.
    pub(super) fn range(&self) -> (f64, f64) {
        (0..i64::from(self.period_steps.max(1)))
            .map(|s| self.at_step(s))
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| (lo.min(v), hi.max(v)))
    }
}

/// A simulated cafe: its identity and its (constant) brewing behaviour.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Cafe {
    /// Namespace.
    pub namespace: String,
    /// DNS-1123 name, unique in the namespace (`espresso-du-matin`).
    pub name: String,
    /// What it brews.
    pub kind: CafeType,
    /// `pod-template-hash` of its serving pods.
    pub template_hash: String,
    /// Number of serving pods (1–3).
    pub pods: u32,
    /// Whether its pods run an `exporter` sidecar beside `brewer`.
    pub sidecar: bool,
    /// Completed brews per minute, all pods together.
    pub brews_per_minute: f64,
    /// Failed brews per completed brew.
    pub failure_fraction: f64,
    /// Shortest brew, seconds (a bucket bound).
    pub duration_min: f64,
    /// Longest brew, seconds (a bucket bound).
    pub duration_max: f64,
    /// Temperature, °C.
    pub temperature: StepCurve,
}

impl Cafe {
    /// Failed brews per minute, all pods together.
    pub(super) fn failures_per_minute(&self) -> f64 {
        self.brews_per_minute * self.failure_fraction
    }

    /// Failures over all attempts: `failures / (brews + failures)`.
    pub(super) fn failure_ratio(&self) -> f64 {
        self.failure_fraction / (1.0 + self.failure_fraction)
    }

    /// Completed brews per second of one serving pod.
    pub(super) fn brews_per_second_per_pod(&self) -> f64 {
        self.brews_per_minute / 60.0 / f64::from(self.pods.max(1))
    }

    /// The share of brews lasting at most `le` seconds (uniform durations).
    pub(super) fn duration_cdf(&self, le: f64) -> f64 {
        if le >= self.duration_max {
            1.0
        } else if le <= self.duration_min {
            0.0
        } else {
            (le - self.duration_min) / (self.duration_max - self.duration_min)
        }
    }

    /// The `q`-quantile of the brew duration, seconds.
    pub(super) fn duration_quantile(&self, q: f64) -> f64 {
        self.duration_min + q * (self.duration_max - self.duration_min)
    }

    /// The mean brew duration, seconds.
    pub(super) fn duration_mean(&self) -> f64 {
        (self.duration_min + self.duration_max) / 2.0
    }
}

/// Suffixes of cafe names, French-café flavoured.
const NAME_SUFFIXES: &[&str] = &[
    "du-matin",
    "de-minuit",
    "des-halles",
    "du-port",
    "de-la-gare",
    "du-marche",
    "des-artistes",
    "du-coin",
    "de-la-place",
    "du-quai",
    "des-lilas",
    "du-canal",
    "de-la-butte",
    "des-arts",
    "du-theatre",
    "de-l-opera",
];

/// The temperature behaviour of the cafe at position `j` of namespace number `ns`.
fn temperature(rng: &mut SplitMix64, ns: usize, j: u32) -> StepCurve {
    let period_steps = rng.range(8, 24) as u32;
    let phase_steps = rng.range(0, u64::from(period_steps) - 1) as u32;
    let (base, amplitude) = if j == 0 {
        // Always inside the band: 86–92 °C.
        (88.0 + rng.range(0, 2) as f64, rng.range(10, 20) as f64 / 10.0)
    } else if ns == 0 && j == 1 {
        // Always outside the band: a cold machine, 40–50 °C.
        (44.0 + rng.range(0, 2) as f64, rng.range(20, 40) as f64 / 10.0)
    } else if (ns as u64 + u64::from(j)).is_multiple_of(2) {
        // Overheats part of the time: 82–98 °C.
        (90.0, rng.range(70, 80) as f64 / 10.0)
    } else {
        // Cools down part of the time: 57–73 °C.
        (65.0, rng.range(70, 80) as f64 / 10.0)
    };
    StepCurve { base, amplitude, period_steps, phase_steps }
}

/// Generates `per_namespace` cafes in each of `namespaces` (namespace-major order). Types
/// cycle over the whole list, so every type appears once there are four cafes.
pub(crate) fn generate(seed: u64, namespaces: &[String], per_namespace: u32) -> Vec<Cafe> {
    let mut cafes = Vec::with_capacity(namespaces.len() * per_namespace as usize);
    for (ns, namespace) in namespaces.iter().enumerate() {
        let mut taken: Vec<String> = Vec::new();
        for j in 0..per_namespace {
            let c = ns as u64 * u64::from(per_namespace) + u64::from(j);
            let mut rng = SplitMix64::stream(seed, DOMAIN_CAFE, c);
            let kind = CafeType::ALL[(c % 4) as usize];
            let name = unique_name(seed, c, kind, &taken);
            taken.push(name.clone());
            let template_hash = format!("{:010x}", rng.next_u64() & 0xff_ffff_ffff);
            let duration_min = [15.0, 20.0][rng.range(0, 1) as usize];
            let duration_max = duration_min + [10.0, 15.0, 20.0][rng.range(0, 2) as usize];
            // One cafe in five never fails (its failure series stay at 0).
            let failure_fraction = if c % 5 == 2 { 0.0 } else { rng.range(1, 12) as f64 / 100.0 };
            cafes.push(Cafe {
                namespace: namespace.clone(),
                name,
                kind,
                template_hash,
                pods: 1 + ((c + seed) % 3) as u32,
                sidecar: rng.chance(0.5),
                brews_per_minute: rng.range(20, 120) as f64 / 10.0,
                failure_fraction,
                duration_min,
                duration_max,
                temperature: temperature(&mut rng, ns, j),
            });
        }
    }
    cafes
}

/// `<type>-<suffix>` not in `taken`; numbered (`-2`, `-3`, …) once the suffixes run out.
fn unique_name(seed: u64, c: u64, kind: CafeType, taken: &[String]) -> String {
    let mut rng = SplitMix64::stream(seed, DOMAIN_CAFE_NAME, c);
    let first = rng.range(0, NAME_SUFFIXES.len() as u64 - 1) as usize;
    let mut round = 1u32;
    loop {
        for k in 0..NAME_SUFFIXES.len() {
            let suffix = NAME_SUFFIXES[(first + k) % NAME_SUFFIXES.len()];
            let name = if round == 1 {
                format!("{}-{suffix}", kind.as_str())
            } else {
                format!("{}-{suffix}-{round}", kind.as_str())
            };
            if !taken.contains(&name) {
                return name;
            }
        }
        round += 1;
    }
}

/// The cafe metric contract, one series set per serving pod (labels `cafe`, `namespace`,
/// `pod`, `type`; `reason` on failures, `le` on buckets).
pub(super) const EXPORTER: Exporter = Exporter { families: FAMILIES, pod_series, node_series: None };

const FAMILIES: &[Family] = &[
    Family { name: "cafe_brews", help: "Completed brews.", kind: FamilyType::Counter },
    Family { name: "cafe_brew_failures", help: "Failed brews by reason.", kind: FamilyType::Counter },
    Family {
        name: "cafe_brew_duration_seconds",
        help: "Duration of completed brews in seconds.",
        kind: FamilyType::Histogram,
    },
    Family {
        name: "cafe_temperature_celsius",
        help: "Temperature of the machine's boiler in degrees Celsius.",
        kind: FamilyType::Gauge,
    },
    Family {
        name: "cafe_last_brew_timestamp_seconds",
        help: "Unix time of the last completed brew.",
        kind: FamilyType::Gauge,
    },
];

/// `le` label values of the duration buckets, `+Inf` last, and each bucket's bound.
const BUCKET_LABELS: [(&str, f64); 11] = [
    ("5", 5.0),
    ("10", 10.0),
    ("15", 15.0),
    ("20", 20.0),
    ("25", 25.0),
    ("30", 30.0),
    ("35", 35.0),
    ("40", 40.0),
    ("50", 50.0),
    ("60", 60.0),
    ("+Inf", f64::INFINITY),
];

/// The series of family number `family` of [`FAMILIES`] for a cafe's serving pod.
fn pod_series(family: usize, pod: &SimPod, start: f64, sink: &mut SeriesSink<'_>) {
    let Some(cafe) = &pod.cafe else { return };
    let rate = cafe.brews_per_second_per_pod();
    let (c, ns, p, ty) = (cafe.name.as_str(), pod.namespace.as_str(), pod.name.as_str(), cafe.kind.as_str());
    let base = [("cafe", c), ("namespace", ns), ("pod", p), ("type", ty)];
    match family {
        0 => sink("", &base, SeriesValue::Linear { rate, start }),
        1 => {
            for (reason, share) in FAILURE_REASONS {
                sink(
                    "",
                    &[("cafe", c), ("namespace", ns), ("pod", p), ("reason", reason), ("type", ty)],
                    SeriesValue::Linear { rate: rate * cafe.failure_fraction * share, start },
                );
            }
        }
        2 => {
            for (le, bound) in BUCKET_LABELS {
                sink(
                    "_bucket",
                    &[("cafe", c), ("le", le), ("namespace", ns), ("pod", p), ("type", ty)],
                    SeriesValue::Linear { rate: rate * cafe.duration_cdf(bound), start },
                );
            }
            sink("_sum", &base, SeriesValue::Linear { rate: rate * cafe.duration_mean(), start });
            sink("_count", &base, SeriesValue::Linear { rate, start });
        }
        3 => sink("", &base, SeriesValue::Steps(cafe.temperature)),
        4 => sink("", &base, SeriesValue::LastEvent { rate, start }),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use super::*;
    use crate::sim::testutil::{self, START};
    use crate::sim::workload::{Workload, WorkloadParams};

    /// The temperature band of a ready cafe (°C, inclusive).
    const READY_BAND: (f64, f64) = (60.0, 95.0);

    /// The default workload with `seed` and `pods_per_node`.
    fn params(seed: u64, pods_per_node: u32) -> WorkloadParams {
        WorkloadParams { seed, pods_per_node, ..testutil::params() }
    }

    fn dns1123(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 63
            && s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !s.starts_with('-')
            && !s.ends_with('-')
    }

    #[test]
    fn cafes_are_spread_named_and_served() {
        let start = START;
        let w = Workload::generate(&params(1, 4), start);
        assert_eq!(w.cafes.len(), 6);
        let types: HashSet<_> = w.cafes.iter().map(|c| c.kind).collect();
        assert_eq!(types.len(), 4);
        let mut names = HashSet::new();
        for cafe in &w.cafes {
            assert!(dns1123(&cafe.name), "{}", cafe.name);
            assert!(cafe.name.starts_with(cafe.kind.as_str()));
            assert!(names.insert((cafe.namespace.clone(), cafe.name.clone())), "{} twice", cafe.name);
            assert!((1..=3).contains(&cafe.pods));
            assert!((2.0..=12.0).contains(&cafe.brews_per_minute));
            assert!((0.0..=0.12).contains(&cafe.failure_fraction));
            for bound in [cafe.duration_min, cafe.duration_max] {
                assert!(BUCKET_LABELS.iter().any(|(_, b)| *b == bound), "{bound} is not a bucket bound");
            }
            assert!(cafe.duration_min < cafe.duration_max);
        }
        let per_ns: BTreeMap<_, usize> = w.cafes.iter().fold(BTreeMap::new(), |mut m, c| {
            *m.entry(c.namespace.as_str()).or_default() += 1;
            m
        });
        assert_eq!(per_ns.values().copied().collect::<Vec<_>>(), [2, 2, 2]);
        assert!(w.cafes.iter().any(|c| c.failure_fraction == 0.0));
        assert!(w.cafes.iter().any(|c| c.pods > 1));

        // Serving pods: in addition to the 12 regular pods, Running, labelled, no HTTP series.
        let serving: Vec<&SimPod> = w.pods.iter().filter(|p| p.cafe.is_some()).collect();
        let expected: u32 = w.cafes.iter().map(|c| c.pods).sum();
        assert_eq!(serving.len(), expected as usize);
        assert_eq!(w.pods.len(), 12 + serving.len());
        let mut per_node = [0usize; 3];
        for pod in &serving {
            let cafe = pod.cafe.as_ref().unwrap();
            assert!(pod.is_running());
            assert!(pod.http.is_none());
            assert_eq!(pod.namespace, cafe.namespace);
            assert_eq!(pod.label("app"), Some("cafe"));
            assert_eq!(pod.label(CAFE_LABEL), Some(cafe.name.as_str()));
            assert_eq!(pod.label("pod-template-hash"), Some(cafe.template_hash.as_str()));
            let labels = pod.labels();
            assert!(labels.windows(2).all(|w| w[0].0 < w[1].0), "{labels:?}");
            assert!(labels.contains(&(CAFE_LABEL, cafe.name.as_str())));
            assert!(pod.name.starts_with(&format!("{}-{}-", cafe.name, cafe.template_hash)));
            assert_eq!(pod.containers[0].name, "brewer");
            assert_eq!(pod.containers.len(), if cafe.sidecar { 2 } else { 1 });
            for c in &pod.containers {
                assert!(c.started < start - 3600);
            }
            per_node[pod.node as usize] += 1;
        }
        // Round-robin over the nodes.
        assert!(per_node.iter().max().unwrap() - per_node.iter().min().unwrap() <= 1, "{per_node:?}");
        let unique: HashSet<_> = w.pods.iter().map(|p| (&p.namespace, &p.name)).collect();
        assert_eq!(unique.len(), w.pods.len());
        let ips: HashSet<_> = w.pods.iter().map(|p| p.ip).collect();
        assert_eq!(ips.len(), w.pods.len());
        // No cafes when asked for none.
        let none = Workload::generate(&WorkloadParams { cafes_per_namespace: 0, ..params(1, 4) }, start);
        assert!(none.cafes.is_empty());
        assert_eq!(none.pods.len(), 12);
    }

    #[test]
    fn names_stay_unique_with_many_cafes() {
        let cafes = generate(3, &["a".to_owned()], 100);
        let names: HashSet<_> = cafes.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names.len(), 100);
        assert!(cafes.iter().all(|c| dns1123(&c.name)));
    }

    #[test]
    fn temperature_is_constant_within_a_step() {
        let w = Workload::generate(&params(1, 4), START);
        for cafe in &w.cafes {
            let curve = cafe.temperature;
            for step in 58_800_000..58_800_000 + 2 * i64::from(curve.period_steps) {
                let t0 = (step * TEMPERATURE_STEP_SECONDS) as f64;
                let v = curve.at(t0);
                assert_eq!(StepCurve::step_start(t0 + 29.999), step * TEMPERATURE_STEP_SECONDS);
                for dt in [0.001, 7.5, 15.0, 29.999] {
                    assert_eq!(curve.at(t0 + dt), v, "{} at {t0}+{dt}", cafe.name);
                }
                assert_eq!(v, (v * 10.0).round() / 10.0);
            }
        }
    }

    fn check_bands(w: &Workload) {
        let (lo, hi) = READY_BAND;
        let inside = |(a, b): (f64, f64)| lo <= a && b <= hi;
        let outside = |(a, b): (f64, f64)| b < lo || a > hi;
        let mut always_in = 0;
        let mut always_out = 0;
        let mut sometimes = 0;
        for (k, cafe) in w.cafes.iter().enumerate() {
            let range = cafe.temperature.range();
            if inside(range) {
                always_in += 1;
            } else if outside(range) {
                always_out += 1;
            } else {
                sometimes += 1;
            }
            if k % 2 == 0 {
                assert!(
                    inside(range),
                    "first cafe of its namespace {} leaves the band: {range:?}",
                    cafe.name
                );
            }
        }
        assert!(always_in >= 1 && always_out >= 1 && sometimes >= 1, "{always_in} {always_out} {sometimes}");
    }

    #[test]
    fn a_cafe_inside_and_one_outside_the_band() {
        check_bands(&Workload::generate(&params(1, 4), START));
        check_bands(&Workload::generate(&params(7, 6), START));
    }

    #[test]
    fn quantiles_and_cdf_are_uniform() {
        let cafe = &generate(1, &["a".to_owned()], 1)[0];
        for q in [0.5, 0.95, 0.99] {
            let v = cafe.duration_quantile(q);
            assert!((cafe.duration_cdf(v) - q).abs() < 1e-12);
        }
        assert_eq!(cafe.duration_cdf(f64::INFINITY), 1.0);
        assert_eq!(cafe.duration_cdf(5.0), 0.0);
    }
}
