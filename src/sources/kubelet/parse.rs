//! Decoding a kubelet `/metrics/resource` body: [`parse_resource_metrics`] turns one body into a
//! [`ParsedBatch`], following metrics-server's `decodeBatch`: `pod_*` series are ignored (a pod
//! is the sum of its containers), a sample without a timestamp gets the scrape time, and a
//! container whose CPU or memory is 0 or missing (it has just started) is dropped.
//! metrics-server drops the whole pod then; we drop only that container, so the pod reports
//! fewer containers instead of none (a field is omitted, never faked; the served kinds decide
//! what a partial pod means).
//!
//! # Why our own parser
//!
//! `prometheus-parse` (the usual crate) was evaluated and rejected: it splits label pairs on `,`
//! and `=` and strips quotes without unescaping, so a label value containing `,`, `=`, `}` or
//! `\"` is silently mangled; it pulls `regex`, `chrono`, `itertools` and `once_cell` for that;
//! and it allocates every label of every series, while we need three labels of five families.
//! The text format subset we read is small, so this module has a line parser that borrows from
//! the body, unescapes `\\`, `\"` and `\n`, skips (and counts) other families and malformed
//! lines, and never panics on arbitrary input.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::Arc;

use jiff::Timestamp;

use super::{Error, Result};

/// Blanks of the text format.
const BLANK: [char; 2] = [' ', '\t'];

/// Identifies a container on a node.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ContainerKey {
    /// Namespace of the pod.
    pub namespace: Arc<str>,
    /// Name of the pod.
    pub pod: Arc<str>,
    /// Name of the container.
    pub container: Arc<str>,
}

/// One sample value with the time it was taken.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// The value, in the series' unit (core-seconds or bytes).
    pub value: f64,
    /// When the kubelet took it (its sample timestamp, or the scrape time if it had none).
    pub timestamp: Timestamp,
}

/// What one fetch says about one container.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ContainerSample {
    /// `container_cpu_usage_seconds_total`: cumulative core-seconds, above 0.
    pub cpu: Sample,
    /// `container_memory_working_set_bytes`, above 0.
    pub memory: Sample,
    /// `container_start_time_seconds`, when present and sensible (after 1970).
    pub start_time: Option<Timestamp>,
    /// Whether the CPU sample carried its own timestamp (older kubelets send none: the
    /// scrape time stands in, see [`NodeSamples`](super::NodeSamples)).
    pub cpu_stamped: bool,
}

/// One decoded `/metrics/resource` body.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedBatch {
    /// Containers with both a CPU and a memory sample above 0.
    pub containers: HashMap<ContainerKey, ContainerSample>,
    /// `node_cpu_usage_seconds_total`, when present and above 0.
    pub node_cpu: Option<Sample>,
    /// `node_memory_working_set_bytes`, when present and above 0.
    pub node_memory: Option<Sample>,
    /// `resource_scrape_error` (or the older `scrape_error`) was non-zero: the kubelet could not
    /// collect its summary.
    pub scrape_error: bool,
    /// When the body was requested; samples without a timestamp carry it.
    pub scrape_time: Timestamp,
    /// Containers left out because their CPU or memory was 0 or missing.
    pub dropped_containers: usize,
    /// Lines that are not valid samples, or samples of our families with unusable values.
    pub malformed_lines: usize,
    /// Valid samples of families we do not read (`pod_*`, swap, …).
    pub unknown_lines: usize,
}

/// The families we read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    ContainerCpu,
    ContainerMemory,
    ContainerStart,
    NodeCpu,
    NodeMemory,
    ScrapeError,
}

impl Family {
    fn from_name(name: &str) -> Option<Self> {
        Some(match name {
            "container_cpu_usage_seconds_total" => Self::ContainerCpu,
            "container_memory_working_set_bytes" => Self::ContainerMemory,
            "container_start_time_seconds" => Self::ContainerStart,
            "node_cpu_usage_seconds_total" => Self::NodeCpu,
            "node_memory_working_set_bytes" => Self::NodeMemory,
            "resource_scrape_error" | "scrape_error" => Self::ScrapeError,
            _ => return None,
        })
    }
}

/// A sample line split into its parts, borrowing from the body.
struct RawSample<'a> {
    name: &'a str,
    labels: &'a str,
    value: &'a str,
    timestamp: Option<&'a str>,
}

/// A container's series as they are found, before the completeness check.
#[derive(Default)]
struct PartialContainer {
    cpu: Option<Sample>,
    cpu_stamped: bool,
    memory: Option<Sample>,
    start_time: Option<Timestamp>,
}

type BorrowedKey<'a> = (Cow<'a, str>, Cow<'a, str>, Cow<'a, str>);

/// Decodes a kubelet `/metrics/resource` body (Prometheus text format 0.0.4).
///
/// Unknown families and malformed lines are skipped and counted; a nonsense
/// `container_start_time_seconds` (negative, year 1) only loses that start time. Fails only when
/// no line of a family we read is usable, which means the body is not resource metrics.
pub fn parse_resource_metrics(body: &str, scrape_time: Timestamp) -> Result<ParsedBatch> {
    parse_resource_metrics_with(body, scrape_time, |_, _, _| None)
}

/// [`parse_resource_metrics`], taking the key of a container already known (`known(namespace,
/// pod, container)`, the node's rate state: [`NodeSamples::key`](super::NodeSamples::key)) instead
/// of allocating its three strings again. A fetch then allocates strings only for the
/// containers that are new on the node: the same strings allocated and freed for every container
/// on every fetch, in the middle of the long-lived ones, are what spread the heap's small pages.
pub(crate) fn parse_resource_metrics_with(
    body: &str,
    scrape_time: Timestamp,
    known: impl Fn(&str, &str, &str) -> Option<ContainerKey>,
) -> Result<ParsedBatch> {
    let mut batch = ParsedBatch {
        containers: HashMap::new(),
        node_cpu: None,
        node_memory: None,
        scrape_error: false,
        scrape_time,
        dropped_containers: 0,
        malformed_lines: 0,
        unknown_lines: 0,
    };
    let mut partial: HashMap<BorrowedKey<'_>, PartialContainer> = HashMap::new();
    let mut recognized = 0usize;

    for line in body.lines() {
        let line = line.trim_start_matches(BLANK);
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some(raw) = split_sample(line) else {
            batch.malformed_lines += 1;
            continue;
        };
        let Some(family) = Family::from_name(raw.name) else {
            batch.unknown_lines += 1;
            continue;
        };
        if apply_sample(&mut batch, &mut partial, family, &raw).is_some() {
            recognized += 1;
        } else {
            batch.malformed_lines += 1;
        }
    }

    if recognized == 0 {
        return Err(Error::NoMetrics {
            malformed_lines: batch.malformed_lines,
            unknown_lines: batch.unknown_lines,
        });
    }

    batch.containers.reserve(partial.len());
    for ((namespace, pod, container), found) in partial {
        match (found.cpu, found.memory) {
            (Some(cpu), Some(memory)) if cpu.value > 0.0 && memory.value > 0.0 => {
                let key = known(&namespace, &pod, &container).unwrap_or_else(|| ContainerKey {
                    namespace: Arc::from(&*namespace),
                    pod: Arc::from(&*pod),
                    container: Arc::from(&*container),
                });
                let sample = ContainerSample {
                    cpu,
                    memory,
                    start_time: found.start_time,
                    cpu_stamped: found.cpu_stamped,
                };
                batch.containers.insert(key, sample);
            }
            _ => batch.dropped_containers += 1,
        }
    }
    Ok(batch)
}

/// Records one sample of a family we read; `None` when it is unusable.
fn apply_sample<'a>(
    batch: &mut ParsedBatch,
    partial: &mut HashMap<BorrowedKey<'a>, PartialContainer>,
    family: Family,
    raw: &RawSample<'a>,
) -> Option<()> {
    let value: f64 = raw.value.parse().ok().filter(|v: &f64| v.is_finite())?;
    match family {
        Family::ScrapeError => {
            batch.scrape_error |= value != 0.0;
        }
        Family::NodeCpu | Family::NodeMemory => {
            if !raw.labels.trim_matches(BLANK).is_empty() {
                // A labelled node series is not what the kubelet sends; do not guess.
                return None;
            }
            let sample = Sample { value, timestamp: sample_time(raw.timestamp, batch.scrape_time)? };
            let slot = if family == Family::NodeCpu { &mut batch.node_cpu } else { &mut batch.node_memory };
            *slot = (value > 0.0).then_some(sample);
        }
        Family::ContainerCpu | Family::ContainerMemory | Family::ContainerStart => {
            let key = container_labels(raw.labels)?;
            if family == Family::ContainerStart {
                // The sample's own timestamp is irrelevant (and sometimes nonsense): only the
                // value, the start time in seconds, matters.
                let start_time = start_time(value);
                partial.entry(key).or_default().start_time = start_time;
                return Some(());
            }
            let sample = Sample { value, timestamp: sample_time(raw.timestamp, batch.scrape_time)? };
            let entry = partial.entry(key).or_default();
            if family == Family::ContainerCpu {
                entry.cpu = Some(sample);
                entry.cpu_stamped = raw.timestamp.is_some();
            } else {
                entry.memory = Some(sample);
            }
        }
    }
    Some(())
}

/// The latest sample time accepted, in milliseconds since the epoch (April 2262): the rate
/// state keeps times as nanoseconds in an `i64`.
const MAX_MILLIS: i64 = i64::MAX / 1_000_000;

/// The timestamp of a sample: milliseconds since the epoch, or the scrape time when absent.
/// `None` for a timestamp that is not a positive integer in range (up to [`MAX_MILLIS`]).
fn sample_time(timestamp: Option<&str>, scrape_time: Timestamp) -> Option<Timestamp> {
    match timestamp {
        None => Some(scrape_time),
        Some(text) => text
            .parse::<i64>()
            .ok()
            .filter(|ms| *ms > 0 && *ms <= MAX_MILLIS)
            .and_then(|ms| Timestamp::from_millisecond(ms).ok()),
    }
}

/// A start time from `container_start_time_seconds`; `None` when not after the epoch or after
/// [`MAX_MILLIS`].
fn start_time(seconds: f64) -> Option<Timestamp> {
    if seconds <= 0.0 || seconds * 1000.0 > MAX_MILLIS as f64 {
        return None;
    }
    Timestamp::from_millisecond((seconds * 1000.0).round() as i64).ok()
}

/// The (namespace, pod, container) labels of a container series, all non-empty.
fn container_labels(labels: &str) -> Option<BorrowedKey<'_>> {
    let (mut namespace, mut pod, mut container) = (None, None, None);
    for_each_label(labels, |name, value| match name {
        "namespace" => namespace = Some(value),
        "pod" => pod = Some(value),
        "container" => container = Some(value),
        _ => {}
    })?;
    Some((non_empty(namespace)?, non_empty(pod)?, non_empty(container)?))
}

/// A label value that is present and not empty.
fn non_empty(value: Option<Cow<'_, str>>) -> Option<Cow<'_, str>> {
    value.filter(|v| !v.is_empty())
}

/// Splits `name[{labels}] value [timestamp]`.
fn split_sample(line: &str) -> Option<RawSample<'_>> {
    let name_len = line.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b':').count();
    if name_len == 0 || line.as_bytes().first().is_some_and(u8::is_ascii_digit) {
        return None;
    }
    let (name, after_name) = line.split_at(name_len);
    let trimmed = after_name.trim_start_matches(BLANK);
    let (labels, rest) = if let Some(inner) = trimmed.strip_prefix('{') {
        let end = closing_brace(inner)?;
        (inner.get(..end)?, inner.get(end + 1..)?)
    } else if trimmed.len() == after_name.len() {
        // The name must be followed by a blank or `{`.
        return None;
    } else {
        ("", trimmed)
    };
    let mut fields = rest.split_ascii_whitespace();
    let value = fields.next()?;
    let timestamp = fields.next();
    if fields.next().is_some() {
        return None;
    }
    Some(RawSample { name, labels, value, timestamp })
}

/// Index of the `}` closing a label set, skipping quoted values and their escapes.
fn closing_brace(s: &str) -> Option<usize> {
    let mut in_quotes = false;
    let mut escaped = false;
    for (i, b) in s.bytes().enumerate() {
        if escaped {
            escaped = false;
            continue;
        }
        match b {
            b'\\' if in_quotes => escaped = true,
            b'"' => in_quotes = !in_quotes,
            b'}' if !in_quotes => return Some(i),
            _ => {}
        }
    }
    None
}

/// Calls `f` with every `name="value"` pair (values unescaped); `None` if the set is malformed.
fn for_each_label<'a>(mut s: &'a str, mut f: impl FnMut(&'a str, Cow<'a, str>)) -> Option<()> {
    loop {
        s = s.trim_start_matches(BLANK);
        if s.is_empty() {
            return Some(());
        }
        let name_len = s.bytes().take_while(|b| b.is_ascii_alphanumeric() || *b == b'_').count();
        if name_len == 0 {
            return None;
        }
        let (name, rest) = s.split_at(name_len);
        let rest =
            rest.trim_start_matches(BLANK).strip_prefix('=')?.trim_start_matches(BLANK).strip_prefix('"')?;
        let (value, rest) = read_quoted(rest)?;
        f(name, value);
        let rest = rest.trim_start_matches(BLANK);
        if rest.is_empty() {
            return Some(());
        }
        s = rest.strip_prefix(',')?;
    }
}

/// Reads a label value up to its closing quote (`s` starts after the opening one), unescaping
/// `\\`, `\"` and `\n`; borrows when there is nothing to unescape.
fn read_quoted(s: &str) -> Option<(Cow<'_, str>, &str)> {
    let bytes = s.as_bytes();
    let mut owned: Option<String> = None;
    let mut run_start = 0;
    let mut i = 0;
    // Only ASCII bytes are matched, and those never occur inside a multi-byte character, so
    // every slice below is on a character boundary.
    while let Some(&b) = bytes.get(i) {
        match b {
            b'"' => {
                let run = s.get(run_start..i)?;
                let value = match owned {
                    Some(mut text) => {
                        text.push_str(run);
                        Cow::Owned(text)
                    }
                    None => Cow::Borrowed(run),
                };
                return Some((value, s.get(i + 1..)?));
            }
            b'\\' => {
                let text = owned.get_or_insert_with(String::new);
                text.push_str(s.get(run_start..i)?);
                text.push(match bytes.get(i + 1)? {
                    b'\\' => '\\',
                    b'"' => '"',
                    b'n' => '\n',
                    _ => return None,
                });
                i += 2;
                run_start = i;
            }
            _ => i += 1,
        }
    }
    None
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// The body the simulator and these tests share.
    pub(in crate::sources::kubelet) const FIXTURE: &str =
        include_str!("../../../tests/fixtures/kubelet-metrics-resource.txt");

    pub(in crate::sources::kubelet) fn ts(ms: i64) -> Timestamp {
        Timestamp::from_millisecond(ms).unwrap()
    }

    pub(in crate::sources::kubelet) fn key(namespace: &str, pod: &str, container: &str) -> ContainerKey {
        ContainerKey { namespace: namespace.into(), pod: pod.into(), container: container.into() }
    }

    pub(in crate::sources::kubelet) fn mk_container(
        cpu: f64,
        cpu_ms: i64,
        memory: f64,
        mem_ms: i64,
        start_s: f64,
    ) -> ContainerSample {
        ContainerSample {
            cpu: Sample { value: cpu, timestamp: ts(cpu_ms) },
            memory: Sample { value: memory, timestamp: ts(mem_ms) },
            start_time: start_time(start_s),
            cpu_stamped: true,
        }
    }

    #[test]
    fn shared_fixture_parses_to_exact_values() {
        let scrape = ts(1_764_496_815_000);
        let batch = parse_resource_metrics(FIXTURE, scrape).unwrap();
        // Each container's CPU and memory samples carry one timestamp.
        let sampled_at = |cpu, memory, ms, start_s| mk_container(cpu, ms, memory, ms, start_s);
        let want = HashMap::from([
            (
                key("kube-system", "coredns-76f75df574-8xk2p", "coredns"),
                sampled_at(812.403127, 17_223_680.0, 1_764_496_812_125, 1_764_401_112.0),
            ),
            (
                key("shop", "web-7d4b9c6f5-x2x4z", "app"),
                sampled_at(15234.998811, 134_217_728.0, 1_764_496_810_460, 1_764_452_100.0),
            ),
            (
                key("shop", "web-7d4b9c6f5-x2x4z", "envoy"),
                sampled_at(2210.117302, 41_943_040.0, 1_764_496_811_983, 1_764_452_101.0),
            ),
            (
                key("default", "espresso-du-matin-5c9f8-qq7tn", "brewer"),
                sampled_at(98.551009, 25_165_824.0, 1_764_496_809_876, 1_764_491_100.0),
            ),
        ]);
        assert_eq!(batch.containers, want);
        assert_eq!(batch.node_cpu, Some(Sample { value: 357_354.910_27, timestamp: ts(1_764_496_809_720) }));
        assert_eq!(
            batch.node_memory,
            Some(Sample { value: 6_616_273_408.0, timestamp: ts(1_764_496_809_720) })
        );
        assert!(!batch.scrape_error);
        assert_eq!(batch.scrape_time, scrape);
        assert_eq!(batch.dropped_containers, 0);
        assert_eq!(batch.malformed_lines, 0);
        // 4 container swap + 1 node swap + 9 pod_* samples.
        assert_eq!(batch.unknown_lines, 14);
        let start = batch.containers[&key("shop", "web-7d4b9c6f5-x2x4z", "app")].start_time;
        assert_eq!(start.unwrap().to_string(), "2025-11-29T21:35:00Z");
    }

    #[test]
    fn survives_what_real_kubelets_send() {
        let body = "\
# HELP container_cpu_usage_seconds_total [ALPHA] Cumulative cpu time consumed by the container in core-seconds\r
# TYPE container_cpu_usage_seconds_total counter\r
container_cpu_usage_seconds_total{container=\"a\",namespace=\"ns\",pod=\"p\"} 4.710169\r
container_cpu_usage_seconds_total{pod=\"p\",namespace=\"ns\",container=\"b\",extra=\"x,y=}\"} 1.5e+01 1633253812125
container_cpu_usage_seconds_total{container=\"new\",namespace=\"ns\",pod=\"p\"} 0 1633253812125
container_cpu_usage_seconds_total{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\",} 2 1633253812125
container_cpu_usage_seconds_total{container=\"nan\",namespace=\"ns\",pod=\"p\"} NaN 1633253812125
container_cpu_usage_seconds_total{container=\"badts\",namespace=\"ns\",pod=\"p\"} 3 -5
container_memory_working_set_bytes{container=\"a\",namespace=\"ns\",pod=\"p\"} 1.253376e+07
container_memory_working_set_bytes{container=\"b\",namespace=\"ns\",pod=\"p\"} 1000 1633253812000
container_memory_working_set_bytes{container=\"new\",namespace=\"ns\",pod=\"p\"} 5 1633253812125
container_memory_working_set_bytes{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_memory_working_set_bytes{container=\"nan\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_memory_working_set_bytes{container=\"badts\",namespace=\"ns\",pod=\"p\"} 7 1633253812125
container_start_time_seconds{container=\"a\",namespace=\"ns\",pod=\"p\"} -6.21355968e+10 -62135596800000
container_start_time_seconds{container=\"b\",namespace=\"ns\",pod=\"p\"} -1
container_start_time_seconds{container=\"q\\\"uo\\\\te\\nd\",namespace=\"ns\",pod=\"p\"} 1.633252712e+09
container_start_time_seconds{container=\"gone\",namespace=\"ns\",pod=\"p\"} 1.633252712e+09
container_cpu_usage_seconds_total{container=\"\",namespace=\"ns\",pod=\"p\"} 2
container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\"
container_cpu_usage_seconds_total{container=\"c\",namespace=\"ns\",pod=\"p\"} 1 2 3
container_cpu_usage_seconds_total{container=\"c\\t\",namespace=\"ns\",pod=\"p\"} 1
pod_cpu_usage_seconds_total{namespace=\"ns\",pod=\"p\"} 99 1633253803935
node_cpu_usage_seconds_total 357.35491 1633253809720
node_memory_working_set_bytes 0 1633253809720
scrape_error 0
resource_scrape_error 1

   \t
garbage line
";
        let scrape = ts(1_633_253_815_000);
        let batch = parse_resource_metrics(body, scrape).unwrap();
        let want_a = ContainerSample {
            cpu_stamped: false,
            ..mk_container(4.710169, 1_633_253_815_000, 12_533_760.0, 1_633_253_815_000, 0.0)
        };
        assert_eq!(want_a.start_time, None);
        assert_eq!(batch.containers[&key("ns", "p", "a")], want_a);
        let want_b = mk_container(15.0, 1_633_253_812_125, 1000.0, 1_633_253_812_000, -1.0);
        assert_eq!(batch.containers[&key("ns", "p", "b")], want_b);
        let quoted = &batch.containers[&key("ns", "p", "q\"uo\\te\nd")];
        assert_eq!(quoted.start_time, Some(ts(1_633_252_712_000)));
        // `new` has CPU 0, `nan` and `badts` have no usable CPU, `gone` only a start time.
        assert_eq!(batch.containers.len(), 3);
        assert_eq!(batch.dropped_containers, 4);
        assert_eq!(batch.node_cpu, Some(Sample { value: 357.35491, timestamp: ts(1_633_253_809_720) }));
        assert_eq!(batch.node_memory, None);
        assert!(batch.scrape_error);
        // `pod_*`, and `garbage line`, which is a well-formed sample of an unknown family.
        assert_eq!(batch.unknown_lines, 2);
        // NaN, bad timestamp, empty container, unterminated labels, extra field, bad escape.
        assert_eq!(batch.malformed_lines, 6);
    }

    #[test]
    fn a_body_without_resource_metrics_is_an_error() {
        for body in ["", "<html><body>502 Bad Gateway</body></html>", "# only comments\n", "up 1\n"] {
            let err = parse_resource_metrics(body, ts(1)).unwrap_err();
            assert!(matches!(err, Error::NoMetrics { .. }), "{body:?}: {err}");
        }
        // A node with no pods is fine.
        let batch = parse_resource_metrics("resource_scrape_error 0\n", ts(1)).unwrap();
        assert!(batch.containers.is_empty());
    }

    #[test]
    fn garbage_and_truncation_never_panic() {
        for end in 0..=FIXTURE.len() {
            if let Some(prefix) = FIXTURE.get(..end) {
                let _ = parse_resource_metrics(prefix, ts(1));
            }
        }
        // A deterministic pseudo-random mix of the characters that matter to the grammar.
        let alphabet = b"a_{}=\",\\n \t#\n0123456789.e+-:\xc3\xa9";
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        for _ in 0..2000 {
            let mut bytes = b"container_cpu_usage_seconds_total{".to_vec();
            for _ in 0..64 {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                bytes.push(alphabet[(state % alphabet.len() as u64) as usize]);
            }
            let text = String::from_utf8_lossy(&bytes);
            let _ = parse_resource_metrics(&text, ts(1));
        }
    }
}
