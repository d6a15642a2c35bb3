//! CPU rates from cumulative samples: [`NodeSamples`] keeps, per container, the newest and the
//! previous *distinct* sample and computes `Δcpu / Δt` between them (metrics-server
//! `pkg/storage`). A single sample, a restart or a decreasing counter gives no CPU rate. Unlike
//! metrics-server we do not synthesize a zero sample at the start time of a fresh container: a
//! first sample is never a usage. Older kubelets send no sample timestamps: the scrape time
//! stands in, and an unchanged counter is then the same sample read again, not an idle period.

use std::sync::Arc;
use std::time::Duration;

use jiff::Timestamp;

use super::parse::{ContainerKey, ContainerSample, ParsedBatch, Sample};
use crate::sources::{ContainerUsage, Containers, NodeUsage, PodKey};

/// A time as nanoseconds since the Unix epoch: every sample time the parser accepts fits
/// (`parse` refuses times outside 1970–2262), in half a [`Timestamp`]'s bytes.
type Nanos = i64;

fn nanos(at: Timestamp) -> Nanos {
    i64::try_from(at.as_nanosecond()).unwrap_or(if at < Timestamp::UNIX_EPOCH { i64::MIN } else { i64::MAX })
}

fn time(nanos: Nanos) -> Timestamp {
    // Every i64 of nanoseconds is a valid time (1677–2262).
    Timestamp::from_nanosecond(i128::from(nanos)).unwrap_or_default()
}

/// A sample as kept: its value and when it was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Reading {
    value: f64,
    at: Nanos,
}

impl From<Sample> for Reading {
    fn from(sample: Sample) -> Self {
        Self { value: sample.value, at: nanos(sample.timestamp) }
    }
}

/// A cumulative CPU sample as kept: whole nanosecond-cores, as the kubelet counts them
/// (`UsageCoreNanoSeconds`), and when it was taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct CpuReading {
    nanos: u64,
    at: Nanos,
}

impl From<Sample> for CpuReading {
    fn from(sample: Sample) -> Self {
        Self { nanos: core_nanoseconds(sample.value), at: nanos(sample.timestamp) }
    }
}

/// A cumulative CPU value in core-seconds as the kubelet's integer core-nanoseconds. The
/// kubelet writes `float64(nanoseconds) / 1e9` in Go's shortest form, so rounding recovers its
/// integer exactly (below 2^52 ns, 52 core-days; above, to the float's own precision).
/// metrics-server truncates (`uint64(value * 1e9)`), which loses a nanosecond whenever the
/// product lands just below the integer. Parsed values are finite and above 0.
fn core_nanoseconds(seconds: f64) -> u64 {
    // `as` saturates: a value past u64 (584 core-years) is held at the maximum.
    (seconds * 1e9).round() as u64
}

/// The CPU rate in whole nanocores between two cumulative samples `window` nanoseconds apart
/// (`window` > 0), rounded to the nearest: integer arithmetic, so 0.14 core-seconds over 10 s
/// is exactly `14m`, where `f64` gives `13999999n` for three samples in ten.
fn nanocores(used: u64, window: Nanos) -> u64 {
    let window = u128::from(window.unsigned_abs());
    let rate = (u128::from(used) * 1_000_000_000 + window / 2) / window;
    u64::try_from(rate).unwrap_or(u64::MAX)
}

/// One container's point: what a fetch said about it.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Point {
    cpu: CpuReading,
    memory: Reading,
    start_time: Option<Nanos>,
    /// The CPU timestamp is the kubelet's own, not the scrape time.
    cpu_stamped: bool,
}

/// [`History::start_time`] of a container without a start time: start times are after the
/// epoch, so never this.
const NO_START: Nanos = i64::MIN;

impl From<ContainerSample> for Point {
    fn from(sample: ContainerSample) -> Self {
        Self {
            cpu: sample.cpu.into(),
            memory: sample.memory.into(),
            start_time: sample.start_time.map(nanos),
            cpu_stamped: sample.cpu_stamped,
        }
    }
}

/// How long an unchanged CPU counter without a sample timestamp is taken for the sample
/// already seen (the kubelet samples every housekeeping period, 10–15 s); past this the
/// container is idle and its rate 0. Never more than half the largest rate window, so an idle
/// container's zero rate stays within it.
const UNSTAMPED_REPEAT_WINDOW: Nanos = 30_000_000_000;

/// The rules a rate obeys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RateRules {
    /// The widest window a CPU rate may span (`--max-rate-window`): two samples further apart
    /// give no rate, rather than an average over an idle hour.
    pub max_window: Duration,
}

impl RateRules {
    /// metrics-server's largest sensible `--metric-resolution` (45 s) plus a kubelet
    /// housekeeping period (15 s).
    pub const DEFAULT_MAX_WINDOW: Duration = Duration::from_secs(60);

    fn max_window_nanos(self) -> Nanos {
        Nanos::try_from(self.max_window.as_nanos()).unwrap_or(Nanos::MAX)
    }

    fn unstamped_repeat_window(self) -> Nanos {
        UNSTAMPED_REPEAT_WINDOW.min(self.max_window_nanos() / 2)
    }
}

impl Default for RateRules {
    fn default() -> Self {
        Self { max_window: Self::DEFAULT_MAX_WINDOW }
    }
}

/// The newest point and the CPU reading of the previous distinct one (all a rate needs), in
/// one flat struct: 64 bytes per container.
#[derive(Debug, Clone, Copy, PartialEq)]
struct History {
    cpu: CpuReading,
    memory: Reading,
    /// Meaningful when `has_prev`.
    prev_cpu: CpuReading,
    /// [`NO_START`] when unknown (an `Option` would take 8 more bytes).
    start_time: Nanos,
    cpu_stamped: bool,
    has_prev: bool,
}

impl History {
    /// The history of a container seen once.
    fn first(point: Point) -> Self {
        Self {
            cpu: point.cpu,
            memory: point.memory,
            prev_cpu: point.cpu,
            start_time: point.start_time.unwrap_or(NO_START),
            cpu_stamped: point.cpu_stamped,
            has_prev: false,
        }
    }

    /// Moves the history forward with a new point.
    fn advance(self, new: Point, rules: RateRules) -> Self {
        let old_start = (self.start_time != NO_START).then_some(self.start_time);
        let restarted = match (old_start, new.start_time) {
            (Some(old), Some(start)) => start != old || start > self.cpu.at,
            (None, Some(start)) => start > self.cpu.at,
            _ => false,
        };
        if restarted || new.cpu.nanos < self.cpu.nanos {
            return Self::first(new);
        }
        let unstamped_repeat = !new.cpu_stamped
            && new.cpu.nanos == self.cpu.nanos
            && new.cpu.at.saturating_sub(self.cpu.at) < rules.unstamped_repeat_window();
        if new.cpu.at <= self.cpu.at || unstamped_repeat {
            // A fetch inside the same housekeeping period returns the same sample: keep the
            // pair we have (a newer memory reading is still worth taking). Without sample
            // timestamps (older kubelets) the scrape time stands in, so the same sample read
            // twice looks newer: an unchanged counter is that sample again, and it keeps the
            // time it was first seen. Taken as new it would make a zero rate.
            let mut kept = self;
            if new.memory.at > kept.memory.at {
                kept.memory = new.memory;
            }
            return kept;
        }
        Self {
            cpu: new.cpu,
            memory: new.memory,
            prev_cpu: self.cpu,
            start_time: new.start_time.unwrap_or(NO_START),
            cpu_stamped: new.cpu_stamped,
            has_prev: true,
        }
    }

    /// The usage this history supports: a CPU rate only from two samples at most
    /// `rules.max_window` apart.
    fn usage(&self, name: &Arc<str>, rules: RateRules) -> ContainerUsage {
        let window = self.cpu.at.saturating_sub(self.prev_cpu.at);
        let stale = self.has_prev && window > rules.max_window_nanos();
        let rate = self.has_prev.then_some(self.prev_cpu).and_then(|prev| {
            let used = self.cpu.nanos.checked_sub(prev.nanos)?;
            (window > 0 && !stale).then(|| (nanocores(used, window), window))
        });
        let timestamp = match rate {
            Some(_) => self.cpu.at.max(self.memory.at),
            None => self.memory.at,
        };
        ContainerUsage {
            name: name.clone(),
            cpu_nanocores: rate.map(|(cores, _)| cores),
            memory_bytes: Some(self.memory.value),
            timestamp: Some(time(timestamp)),
            window: rate.map(|(_, window)| Duration::from_nanos(window.unsigned_abs())),
            cpu_stale: stale,
        }
    }
}

/// The rate state of one node: per container, the newest and the previous distinct sample.
///
/// Pure and synchronous so that the rate rules are tested without HTTP. Containers missing from
/// a batch are forgotten (they ended, or were dropped as just started).
///
/// Memory: the containers are one vector sorted by key (no hash table slack), a container's
/// key is kept from fetch to fetch, and its strings are shared (a pod's name by its
/// containers, namespaces and container names by the node's containers).
#[derive(Debug, Default)]
pub struct NodeSamples {
    /// Sorted by key.
    containers: Vec<(ContainerKey, History)>,
    /// The namespaces and container names the keys hold, sorted: each stored once per node.
    words: Vec<Arc<str>>,
    /// The node's own series, as one more history.
    node: Option<History>,
    rules: RateRules,
    /// [`usage`](Self::usage) as of the last batch, computed once for every answer that asks
    /// before the next one.
    shared: Option<Arc<NodeUsage>>,
}

impl NodeSamples {
    /// An empty state with the default rules.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty state whose rates obey `rules`.
    pub fn with_rules(rules: RateRules) -> Self {
        Self { rules, ..Self::default() }
    }

    /// Number of containers tracked.
    pub fn len(&self) -> usize {
        self.containers.len()
    }

    /// Whether no container is tracked.
    pub fn is_empty(&self) -> bool {
        self.containers.is_empty()
    }

    /// The key held for a container, its strings shared (no allocation); `None` for a container
    /// not tracked.
    pub fn key(&self, namespace: &str, pod: &str, container: &str) -> Option<ContainerKey> {
        let wanted = (namespace, pod, container);
        let at = self
            .containers
            .binary_search_by(|(k, _)| (&*k.namespace, &*k.pod, &*k.container).cmp(&wanted))
            .ok()?;
        self.containers.get(at).map(|(k, _)| k.clone())
    }

    /// Takes a new batch and returns the node's usage ([`take`](Self::take), then
    /// [`usage`](Self::usage)).
    pub fn update(&mut self, batch: ParsedBatch) -> NodeUsage {
        self.take(batch);
        self.usage()
    }

    /// Takes a new batch: each container's history moves on; containers missing from it are
    /// forgotten.
    pub fn take(&mut self, batch: ParsedBatch) {
        let mut incoming: Vec<(ContainerKey, ContainerSample)> = batch.containers.into_iter().collect();
        incoming.sort_unstable_by(|a, b| a.0.cmp(&b.0));
        let mut held = std::mem::take(&mut self.containers).into_iter().peekable();
        let mut next: Vec<(ContainerKey, History)> = Vec::with_capacity(incoming.len());
        for (key, sample) in incoming {
            while held.next_if(|(old, _)| *old < key).is_some() {}
            let point = Point::from(sample);
            // The key already held keeps its strings (shared with the usage), so the state of a
            // container does not move in memory from fetch to fetch.
            let entry = match held.next_if(|(old, _)| *old == key) {
                Some((old, history)) => (old, history.advance(point, self.rules)),
                None => {
                    let key = self.share(key, next.last().map(|(k, _)| k), held.peek().map(|(k, _)| k));
                    (key, History::first(point))
                }
            };
            next.push(entry);
        }
        drop(held);
        self.containers = next;
        self.shared = None;
        // Words no key holds any more.
        self.words.retain(|word| Arc::strong_count(word) > 1);
        self.node = match (batch.node_cpu, batch.node_memory) {
            (Some(cpu), Some(memory)) => {
                let point =
                    Point { cpu: cpu.into(), memory: memory.into(), start_time: None, cpu_stamped: true };
                Some(match self.node.take() {
                    Some(old) => old.advance(point, self.rules),
                    None => History::first(point),
                })
            }
            _ => None,
        };
    }

    /// The node's usage as of the last batch: CPU is the rate between the previous and the
    /// newest distinct sample (absent after a single sample, a restart, a decreasing counter,
    /// or two samples further apart than the rules' largest window), memory the newest
    /// working set. Containers are sorted by name within a pod.
    pub fn usage(&self) -> NodeUsage {
        let pods = self.containers.chunk_by(|(a, _), (b, _)| a.namespace == b.namespace && a.pod == b.pod);
        let mut ranges = Vec::with_capacity(pods.clone().count());
        let mut at = 0;
        for containers in pods {
            let Some((key, _)) = containers.first() else { continue };
            let pod = PodKey { namespace: key.namespace.clone(), name: key.pod.clone() };
            ranges.push((pod, at..at + containers.len()));
            at += containers.len();
        }
        // Every pod's containers in one allocation, each pod a range of it.
        let all =
            self.containers.iter().map(|(key, history)| history.usage(&key.container, self.rules)).collect();
        let mut usage = NodeUsage { pods: Containers::of_node(all, ranges).collect(), node: None };
        usage.node =
            self.node.as_ref().map(|history| history.usage(&apiserver::intern::empty_str(), self.rules));
        usage
    }

    /// [`usage`](Self::usage), computed once per batch and shared: every list and `kubectl
    /// top` between two fetches of the node reads the same one instead of building its own
    /// copy of every pod's containers.
    pub fn shared_usage(&mut self) -> Arc<NodeUsage> {
        match &self.shared {
            Some(usage) => Arc::clone(usage),
            None => Arc::clone(self.shared.insert(Arc::new(self.usage()))),
        }
    }

    /// A new container's key with its strings shared: the pod's name and namespace with a
    /// neighbouring container of the same pod (`before` or `after` it in key order), else the
    /// namespace and container name with the node's other containers.
    fn share(
        &mut self,
        key: ContainerKey,
        before: Option<&ContainerKey>,
        after: Option<&ContainerKey>,
    ) -> ContainerKey {
        let container = self.word(&key.container);
        let same_pod =
            [before, after].into_iter().flatten().find(|k| k.namespace == key.namespace && k.pod == key.pod);
        match same_pod {
            Some(neighbour) => {
                ContainerKey { namespace: neighbour.namespace.clone(), pod: neighbour.pod.clone(), container }
            }
            None => ContainerKey { namespace: self.word(&key.namespace), pod: key.pod, container },
        }
    }

    /// The node's shared copy of `word`.
    fn word(&mut self, word: &Arc<str>) -> Arc<str> {
        match self.words.binary_search_by(|w| (**w).cmp(&**word)) {
            Ok(at) => self.words.get(at).cloned().unwrap_or_else(|| word.clone()),
            Err(at) => {
                self.words.insert(at, word.clone());
                word.clone()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::parse::tests::{FIXTURE, key, mk_container, ts};
    use super::super::{parse_resource_metrics, parse_resource_metrics_with};
    use super::*;

    fn mk_batch(containers: &[(&str, f64, i64, f64, f64)]) -> ParsedBatch {
        ParsedBatch {
            containers: containers
                .iter()
                .map(|(name, cpu, ms, memory, start)| {
                    (key("ns", "p", name), mk_container(*cpu, *ms, *memory, *ms, *start))
                })
                .collect(),
            node_cpu: None,
            node_memory: None,
            scrape_error: false,
            scrape_time: ts(1),
            dropped_containers: 0,
            malformed_lines: 0,
            unknown_lines: 0,
        }
    }

    fn usage_of(usage: &NodeUsage, container: &str) -> ContainerUsage {
        let pod = PodKey { namespace: "ns".into(), name: "p".into() };
        usage.pods[&pod].iter().find(|c| &*c.name == container).unwrap().clone()
    }

    const T0: i64 = 1_764_496_800_000;
    const START: f64 = 1_764_490_000.0;

    #[test]
    fn a_containers_strings_are_kept_from_fetch_to_fetch_and_shared_with_its_usage() {
        let mut state = NodeSamples::new();
        let first = usage_of(&state.update(mk_batch(&[("app", 1.0, T0, 10.0, START)])), "app");
        let usage = state.update(mk_batch(&[("app", 2.0, T0 + 10_000, 10.0, START)]));
        let (pod, containers) = usage.pods.iter().next().unwrap();
        assert!(Arc::ptr_eq(&containers[0].name, &first.name), "the held key's name is reused");
        let (held, _) = state.containers.first().unwrap();
        assert!(Arc::ptr_eq(&pod.namespace, &held.namespace) && Arc::ptr_eq(&pod.name, &held.pod));
    }

    #[test]
    fn a_nodes_containers_share_their_pod_names_namespaces_and_container_names() {
        let mut state = NodeSamples::new();
        let mut batch = mk_batch(&[("app", 1.0, T0, 10.0, START), ("side", 1.0, T0, 10.0, START)]);
        batch.containers.insert(key("ns", "q", "app"), mk_container(1.0, T0, 10.0, T0, START));
        batch.containers.insert(key("other", "r", "app"), mk_container(1.0, T0, 10.0, T0, START));
        let usage = state.update(batch);
        let keys: Vec<&ContainerKey> = state.containers.iter().map(|(k, _)| k).collect();
        let names: Vec<(&str, &str, &str)> =
            keys.iter().map(|k| (&*k.namespace, &*k.pod, &*k.container)).collect();
        assert_eq!(
            names,
            [("ns", "p", "app"), ("ns", "p", "side"), ("ns", "q", "app"), ("other", "r", "app")]
        );
        assert!(Arc::ptr_eq(&keys[0].pod, &keys[1].pod), "one pod name per pod");
        assert!(Arc::ptr_eq(&keys[0].namespace, &keys[2].namespace), "one namespace per node");
        assert!(
            Arc::ptr_eq(&keys[0].container, &keys[2].container)
                && Arc::ptr_eq(&keys[2].container, &keys[3].container)
        );
        let p = &usage.pods[&PodKey { namespace: "ns".into(), name: "p".into() }];
        // A shared slice: exactly its containers, no spare capacity.
        assert_eq!(p.len(), 2);
        assert!(Arc::ptr_eq(&p[1].name, &keys[1].container));
        // The node's pods are ranges of one allocation, in key order: q's container follows p's.
        let q = &usage.pods[&PodKey { namespace: "ns".into(), name: "q".into() }];
        assert_eq!(q.len(), 1);
        assert!(std::ptr::eq(p.as_ptr().wrapping_add(2), q.as_ptr()), "one allocation per node, not per pod");
        // Words nobody holds any more (the old usage gone too) are forgotten.
        drop(usage);
        state.update(mk_batch(&[("app", 2.0, T0 + 10_000, 10.0, START)]));
        let words: Vec<&str> = state.words.iter().map(|w| &**w).collect();
        assert_eq!(words, ["app", "ns"]);
        assert_eq!(std::mem::size_of::<History>(), 64);
        assert_eq!(std::mem::size_of::<(ContainerKey, History)>(), 112);
    }

    #[test]
    fn the_usage_is_read_from_the_state_as_often_as_asked() {
        let mut state = NodeSamples::new();
        state.take(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        state.take(mk_batch(&[("app", 102.5, T0 + 10_000, 6e6, START)]));
        let (first, second) = (state.usage(), state.usage());
        assert_eq!(first, second);
        assert_eq!(usage_of(&first, "app").cpu_nanocores, Some(250_000_000));
        assert_eq!(usage_of(&first, "app").timestamp, Some(ts(T0 + 10_000)));
    }

    #[test]
    fn the_node_series_follow_the_container_rules() {
        let mut state = NodeSamples::new();
        let node = |cpu: f64, ms: i64, memory: f64| {
            let mut batch = mk_batch(&[]);
            batch.node_cpu = Some(Sample { value: cpu, timestamp: ts(ms) });
            batch.node_memory = Some(Sample { value: memory, timestamp: ts(ms) });
            batch
        };
        let first = state.update(node(100.0, T0, 4e9)).node.unwrap();
        assert_eq!((first.cpu_nanocores, first.memory_bytes), (None, Some(4e9)), "one sample is no rate");
        let second = state.update(node(105.0, T0 + 10_000, 5e9)).node.unwrap();
        assert_eq!(second.cpu_nanocores, Some(500_000_000));
        assert_eq!(second.window, Some(Duration::from_secs(10)));
        assert_eq!(second.memory_bytes, Some(5e9));
        assert_eq!(second.timestamp, Some(ts(T0 + 10_000)));
        assert_eq!(state.update(mk_batch(&[])).node, None, "a kubelet without node series");
    }

    #[test]
    fn a_single_sample_is_not_a_usage() {
        let mut samples = NodeSamples::new();
        let usage = samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_nanocores, None);
        assert_eq!(app.window, None);
        assert_eq!(app.memory_bytes, Some(5e6));
        assert_eq!(app.timestamp, Some(ts(T0)));
        assert!(!app.cpu_stale, "one sample is not a stale pair");
    }

    #[test]
    fn rate_between_distinct_samples_and_same_period_refetch() {
        let mut samples = NodeSamples::new();
        samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let second = mk_batch(&[("app", 102.5, T0 + 10_000, 6e6, START)]);
        let usage = samples.update(second.clone());
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_nanocores, Some(250_000_000));
        assert_eq!(app.window, Some(Duration::from_secs(10)));
        assert_eq!(app.memory_bytes, Some(6e6));
        assert_eq!(app.timestamp, Some(ts(T0 + 10_000)));

        // A fetch inside the same housekeeping period returns the same sample: same answer.
        let usage = samples.update(second);
        assert_eq!(usage_of(&usage, "app"), app);

        let usage = samples.update(mk_batch(&[("app", 107.5, T0 + 20_000, 7e6, START)]));
        let app = usage_of(&usage, "app");
        assert_eq!(app.cpu_nanocores, Some(500_000_000));
        assert_eq!(app.window, Some(Duration::from_secs(10)));
    }

    /// An older kubelet's body: no sample timestamps, `scrape_error`.
    fn unstamped(cpu: f64, memory: f64) -> String {
        format!(
            "# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds\n\
             # TYPE container_cpu_usage_seconds_total counter\n\
             container_cpu_usage_seconds_total{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {cpu}\n\
             # HELP container_memory_working_set_bytes [ALPHA] Current working set of the container in bytes\n\
             # TYPE container_memory_working_set_bytes gauge\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {memory}\n\
             # HELP scrape_error [ALPHA] 1 if there was an error while getting container metrics, 0 otherwise\n\
             # TYPE scrape_error gauge\nscrape_error 0\n"
        )
    }

    #[test]
    fn unstamped_samples_rate_on_first_sight_and_a_repeat_is_not_idle() {
        let mut samples = NodeSamples::new();
        let mut fetch = |body: String, ms: i64| {
            let batch = parse_resource_metrics(&body, ts(ms)).unwrap();
            assert!(batch.containers.values().all(|c| !c.cpu_stamped && c.cpu.timestamp == ts(ms)));
            usage_of(&samples.update(batch), "app")
        };
        assert_eq!(fetch(unstamped(100.0, 5e6), T0).cpu_nanocores, None);
        // The kubelet has not sampled again: same counter, later scrape. Not a zero rate.
        let again = fetch(unstamped(100.0, 5e6), T0 + 4_000);
        assert_eq!(again.cpu_nanocores, None);
        assert_eq!(again.memory_bytes, Some(5e6));
        // A new sample: the rate runs from when each value was first seen.
        let app = fetch(unstamped(102.5, 6e6), T0 + 10_000);
        assert_eq!(app.cpu_nanocores, Some(250_000_000));
        assert_eq!(app.window, Some(Duration::from_secs(10)));
        // Read again within the housekeeping period: the same rate, not 0.
        let app = fetch(unstamped(102.5, 6e6), T0 + 13_000);
        assert_eq!(app.cpu_nanocores, Some(250_000_000));
        assert_eq!(app.memory_bytes, Some(6e6));
        assert_eq!(app.timestamp, Some(ts(T0 + 13_000)));
        // Unchanged for more than 30 s (two housekeeping periods): the container is idle.
        let app = fetch(unstamped(102.5, 6e6), T0 + 45_000);
        assert_eq!(app.cpu_nanocores, Some(0));
        // Stamped samples keep their meaning: the same value at a later time is idle time.
        let mut stamped = NodeSamples::new();
        stamped.update(mk_batch(&[("app", 100.0, T0, 5e6, START)]));
        let usage = stamped.update(mk_batch(&[("app", 100.0, T0 + 10_000, 5e6, START)]));
        assert_eq!(usage_of(&usage, "app").cpu_nanocores, Some(0));
    }

    #[test]
    fn restart_and_counter_decrease_reset_the_rate() {
        let mut samples = NodeSamples::new();
        samples.update(mk_batch(&[("app", 100.0, T0, 5e6, START), ("side", 50.0, T0, 1e6, START)]));
        samples.update(mk_batch(&[
            ("app", 101.0, T0 + 10_000, 5e6, START),
            ("side", 51.0, T0 + 10_000, 1e6, START),
        ]));
        // `app` restarted (new start time, counter from zero); `side`'s counter went down.
        let restarted = (T0 + 15_000) as f64 / 1000.0;
        let usage = samples.update(mk_batch(&[
            ("app", 0.5, T0 + 20_000, 5e6, restarted),
            ("side", 40.0, T0 + 20_000, 1e6, START),
        ]));
        assert_eq!(usage_of(&usage, "app").cpu_nanocores, None);
        assert_eq!(usage_of(&usage, "side").cpu_nanocores, None);
        // The next samples rate from the new baseline.
        let usage = samples.update(mk_batch(&[
            ("app", 1.5, T0 + 30_000, 5e6, restarted),
            ("side", 42.0, T0 + 30_000, 1e6, START),
        ]));
        assert_eq!(usage_of(&usage, "app").cpu_nanocores, Some(100_000_000));
        assert_eq!(usage_of(&usage, "side").cpu_nanocores, Some(200_000_000));
        // A restart whose counter happens to be higher is caught by the start time alone.
        let usage =
            samples.update(mk_batch(&[("app", 9.0, T0 + 40_000, 5e6, (T0 + 35_000) as f64 / 1000.0)]));
        assert_eq!(usage_of(&usage, "app").cpu_nanocores, None);
        // `side` vanished from the batch, so it is forgotten.
        assert_eq!(samples.len(), 1);
    }

    #[test]
    fn update_groups_containers_by_pod_sorted_by_name() {
        let mut samples = NodeSamples::new();
        let batch = parse_resource_metrics(FIXTURE, ts(1)).unwrap();
        let usage = samples.update(batch);
        assert_eq!(usage.pods.len(), 3);
        let web = PodKey { namespace: "shop".into(), name: "web-7d4b9c6f5-x2x4z".into() };
        let names: Vec<_> = usage.pods[&web].iter().map(|c| &*c.name).collect();
        assert_eq!(names, ["app", "envoy"]);
    }

    #[test]
    fn the_shared_usage_is_computed_once_per_batch() {
        let mut samples = NodeSamples::new();
        samples.take(parse_resource_metrics(FIXTURE, ts(1)).unwrap());
        let first = samples.shared_usage();
        assert!(Arc::ptr_eq(&first, &samples.shared_usage()), "one usage between two batches");
        assert_eq!(*first, samples.usage());
        samples.take(mk_batch(&[("app", 2.0, T0 + 10_000, 10.0, START)]));
        let next = samples.shared_usage();
        assert!(!Arc::ptr_eq(&first, &next), "a new batch, a new usage");
        assert_eq!(*next, samples.usage());
        assert_eq!(next.pods.len(), 1);
    }

    #[test]
    fn a_batch_parsed_against_the_state_takes_its_keys_and_allocates_only_new_ones() {
        let mut samples = NodeSamples::new();
        samples.take(parse_resource_metrics(FIXTURE, ts(1)).unwrap());
        let held: Vec<ContainerKey> = samples.containers.iter().map(|(k, _)| k.clone()).collect();
        assert!(!held.is_empty());
        for key in &held {
            let found = samples.key(&key.namespace, &key.pod, &key.container).unwrap();
            assert!(Arc::ptr_eq(&found.pod, &key.pod) && Arc::ptr_eq(&found.container, &key.container));
        }
        assert_eq!(samples.key("shop", "web-7d4b9c6f5-x2x4z", "nope"), None);
        assert_eq!(samples.key("nope", "web-7d4b9c6f5-x2x4z", "app"), None);

        // The next fetch's body, one container more: every known container comes back with the
        // held strings; only the new one is allocated, and the batch's values are those of the
        // body (the lookup changes where the strings live, not what is parsed).
        let extra = "container_cpu_usage_seconds_total{container=\"new\",namespace=\"shop\",pod=\"fresh\"} 3 2000\n\
                     container_memory_working_set_bytes{container=\"new\",namespace=\"shop\",pod=\"fresh\"} 7 2000\n";
        let body = format!("{FIXTURE}{extra}");
        let batch = parse_resource_metrics_with(&body, ts(2), |ns, pod, c| samples.key(ns, pod, c)).unwrap();
        assert_eq!(batch, parse_resource_metrics(&body, ts(2)).unwrap());
        for key in &held {
            let (taken, _) = batch.containers.get_key_value(key).unwrap();
            assert!(Arc::ptr_eq(&taken.pod, &key.pod) && Arc::ptr_eq(&taken.namespace, &key.namespace));
        }
        let fresh = ContainerKey { namespace: "shop".into(), pod: "fresh".into(), container: "new".into() };
        let (taken, sample) = batch.containers.get_key_value(&fresh).unwrap();
        assert!(held.iter().all(|k| !Arc::ptr_eq(&k.pod, &taken.pod)));
        assert_eq!((sample.cpu.value, sample.memory.value), (3.0, 7.0));
    }

    /// A kubelet body with one container's stamped samples, as a kubelet writes them (Go's
    /// shortest float form, millisecond timestamps).
    fn stamped(cpu: &str, memory: &str, ms: i64) -> ParsedBatch {
        let body = format!(
            "container_cpu_usage_seconds_total{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {cpu} {ms}\n\
             container_memory_working_set_bytes{{container=\"app\",namespace=\"ns\",pod=\"p\"}} {memory} {ms}\n"
        );
        parse_resource_metrics(&body, ts(ms)).unwrap()
    }

    #[test]
    fn samples_further_apart_than_the_largest_window_give_no_rate() {
        let rules = RateRules { max_window: Duration::from_secs(60) };
        let mut samples = NodeSamples::with_rules(rules);
        samples.update(stamped("100", "5e+06", T0));
        // Exactly the largest window: a rate.
        let app = usage_of(&samples.update(stamped("115", "5e+06", T0 + 60_000)), "app");
        assert_eq!((app.cpu_nanocores, app.window), (Some(250_000_000), Some(Duration::from_secs(60))));
        // An hour of quiet, then a busy container: no average over the hour, memory still.
        let app = usage_of(&samples.update(stamped("1015", "6e+06", T0 + 3_660_000)), "app");
        assert_eq!((app.cpu_nanocores, app.window, app.memory_bytes), (None, None, Some(6e6)));
        assert!(app.cpu_stale, "withheld, not missing");
        assert_eq!(app.timestamp, Some(ts(T0 + 3_660_000)));
        // The same sample read again keeps the stale pair: still nothing.
        let app = usage_of(&samples.update(stamped("1015", "6e+06", T0 + 3_660_000)), "app");
        assert_eq!(app.cpu_nanocores, None);
        // One housekeeping period later the pair is fresh: the rate of now.
        let app = usage_of(&samples.update(stamped("1025", "6e+06", T0 + 3_670_000)), "app");
        assert_eq!((app.cpu_nanocores, app.window), (Some(1_000_000_000), Some(Duration::from_secs(10))));
        assert!(!app.cpu_stale);
        // The node's own series obey the same window.
        let mut batch = mk_batch(&[]);
        batch.node_cpu = Some(Sample { value: 10.0, timestamp: ts(T0) });
        batch.node_memory = Some(Sample { value: 1e9, timestamp: ts(T0) });
        samples.update(batch.clone());
        batch.node_cpu = Some(Sample { value: 20.0, timestamp: ts(T0 + 61_000) });
        batch.node_memory = Some(Sample { value: 1e9, timestamp: ts(T0 + 61_000) });
        assert_eq!(samples.update(batch).node.unwrap().cpu_nanocores, None);
        // Unstamped repeats never stretch a pair past a small window either.
        let small = RateRules { max_window: Duration::from_secs(20) };
        assert_eq!(small.unstamped_repeat_window(), 10_000_000_000);
    }

    /// metrics-server `pkg/storage` `resourceUsage`, with Go's conversions: `uint64(value *
    /// 1e9)` at decoding, then `uint64(float64(Δ) / window.Seconds())`.
    fn metrics_server_nanocores(prev: f64, last: f64, window_ms: i64) -> u64 {
        let (prev, last) = ((prev * 1e9) as u64, (last * 1e9) as u64);
        ((last - prev) as f64 / (window_ms as f64 / 1e3)) as u64
    }

    #[test]
    fn a_rate_is_whole_nanocores_rounded_as_metrics_server_gives_them() {
        // Two samples of a container of namespace `shop` at exactly 14 millicores, which the
        // floating-point rate wrote `13999999n`.
        let (prev, last) = ("71055.92436474", "71056.06436474");
        let float_rate = (last.parse::<f64>().unwrap() - prev.parse::<f64>().unwrap()) / 10.0;
        assert_eq!((float_rate * 1e9).floor(), 13_999_999.0, "the float artefact this guards against");
        let mut samples = NodeSamples::new();
        samples.update(stamped(prev, "1.2e+07", T0));
        let app = usage_of(&samples.update(stamped(last, "1.2e+07", T0 + 10_000)), "app");
        assert_eq!(app.cpu_nanocores, Some(14_000_000));
        assert_eq!(metrics_server_nanocores(71055.92436474, 71056.06436474, 10_000), 14_000_000);

        // Counters and windows as kubelets have them: integer core-nanoseconds written as
        // `float64(ns) / 1e9` in the shortest form, millisecond timestamps. Where the rate is a
        // whole number of nanocores, metrics-server's value and ours are that number; where it
        // is not, ours is the nearest and metrics-server's the one below.
        let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = |below: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % below
        };
        for _ in 0..20_000 {
            let window_ms = 1_000 + next(59_000) as i64;
            let start = 1_000_000_000 + next(1 << 50);
            let whole = next(4) == 0;
            let used = if whole {
                // A whole rate: nanocores × seconds, in nanoseconds of CPU.
                next(8_000_000_000) * window_ms as u64 / 1_000 / 1_000 * 1_000
            } else {
                next(80_000_000_000)
            };
            let exact = (u128::from(used) * 1_000_000_000) as f64 / (window_ms as f64 * 1e6);
            let (prev, last) = (start as f64 / 1e9, (start + used) as f64 / 1e9);
            let mut samples = NodeSamples::with_rules(RateRules { max_window: Duration::from_secs(60) });
            samples.update(stamped(&prev.to_string(), "1", T0));
            let app = usage_of(&samples.update(stamped(&last.to_string(), "1", T0 + window_ms)), "app");
            let ours = app.cpu_nanocores.unwrap();
            assert!((ours as f64 - exact).abs() <= 0.5 + 1e-6, "{ours} vs {exact} ({prev} → {last})");
            if whole && (u128::from(used) * 1_000) % window_ms as u128 == 0 {
                assert_eq!(ours as f64, exact, "{prev} → {last} over {window_ms} ms");
                let theirs = metrics_server_nanocores(prev, last, window_ms);
                // metrics-server's own truncation of `value * 1e9` may lose one nanosecond of
                // CPU, which over a window is at most one nanocore less.
                assert!(theirs == ours || theirs + 1 == ours, "{theirs} vs {ours} ({prev} → {last})");
            }
        }
    }
}
