//! The alert rules (`dashboards/percolator-alerts.yaml`): promtool accepts them and their unit
//! tests (`dashboards/percolator-alerts.test.yaml`) pass; every alert has a test case where it
//! fires and one where it does not; every alert says its severity, summary and description,
//! and links its runbook, a section of `docs/runbooks.md` saying what it means, how to confirm
//! it and how to fix it (one section per alert, none for an alert that does not exist);
//! every `percolator_*` metric the file names is one percolator exports; every selector of
//! percolator's own series is on the `job="percolator"` the file documents; and the
//! APIService alert names exactly the APIServices the deploy manifests create.
//!
//! promtool comes from Debian's `prometheus` package (`scripts/install-deps.sh`);
//! `PROMTOOL_BIN` overrides the binary, as for the end-to-end harness. promtool only reads
//! the two files, so the tests share them safely.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::Deserialize;

const RULES: &str = "dashboards/percolator-alerts.yaml";
const RULE_TESTS: &str = "dashboards/percolator-alerts.test.yaml";
/// Where every alert's `runbook_url` points: `docs/runbooks.md` on the default branch.
const RUNBOOKS_URL: &str = "https://github.com/une-tasse-de/percolator/blob/main/docs/runbooks.md";
const RUNBOOKS: &str = "docs/runbooks.md";
/// The job label the rules assume (see the header of the rules file).
const JOB_MATCHER: &str = r#"job="percolator""#;

#[derive(Debug, Deserialize)]
struct RuleFile {
    groups: Vec<Group>,
}

#[derive(Debug, Deserialize)]
struct Group {
    name: String,
    rules: Vec<Rule>,
}

#[derive(Debug, Deserialize)]
struct Rule {
    alert: Option<String>,
    expr: String,
    #[serde(rename = "for")]
    for_duration: Option<String>,
    #[serde(default)]
    labels: BTreeMap<String, String>,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
}

#[derive(Debug, Deserialize)]
struct TestFile {
    rule_files: Vec<String>,
    tests: Vec<TestGroup>,
}

#[derive(Debug, Deserialize)]
struct TestGroup {
    name: String,
    #[serde(default)]
    alert_rule_test: Vec<AlertTest>,
}

#[derive(Debug, Deserialize)]
struct AlertTest {
    eval_time: String,
    alertname: String,
    #[serde(default)]
    exp_alerts: Vec<ExpectedAlert>,
}

#[derive(Debug, Deserialize)]
struct ExpectedAlert {
    #[serde(default)]
    exp_labels: BTreeMap<String, String>,
    #[serde(default)]
    exp_annotations: BTreeMap<String, String>,
}

fn mk_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

fn mk_rules() -> RuleFile {
    serde_saphyr::from_str(&std::fs::read_to_string(mk_path(RULES)).unwrap()).unwrap()
}

fn mk_rule_tests() -> TestFile {
    serde_saphyr::from_str(&std::fs::read_to_string(mk_path(RULE_TESTS)).unwrap()).unwrap()
}

/// Every alerting rule, with its group.
fn mk_alerts() -> Vec<(String, Rule)> {
    mk_rules()
        .groups
        .into_iter()
        .flat_map(|g| {
            let group = g.name;
            g.rules.into_iter().map(move |r| (group.clone(), r))
        })
        .filter(|(_, r)| r.alert.is_some())
        .collect()
}

fn promtool(args: &[&str]) -> String {
    let bin = std::env::var("PROMTOOL_BIN").unwrap_or_else(|_| "promtool".to_owned());
    let out = std::process::Command::new(&bin)
        .args(args)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap_or_else(|e| {
            panic!("{bin}: {e} (install Debian's prometheus package: scripts/install-deps.sh; or set PROMTOOL_BIN)")
        });
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{bin} {}:\n{text}", args.join(" "));
    text
}

/// The sample names percolator's registry exports (`# TYPE` lines, with the suffixes each
/// type adds to its samples).
fn mk_exported_names() -> BTreeSet<String> {
    use apiserver::{LatencyLabels, Metrics, RequestLabels, UpstreamObserver};
    let metrics = Metrics::new(percolator::METRICS_NAMESPACE);
    // A labelled family is encoded once it has a series: give each one.
    metrics.observe("prometheus", "success", 0.1);
    metrics.config_reload(percolator::CONFIG_FILE, true);
    metrics.cache_lookup(&"pods".into(), true);
    metrics.skipped_object(&"pods".into(), "invalid_name");
    metrics.requests.get_or_create(&RequestLabels { resource: "pods".into(), verb: "list", code: 200 }).inc();
    metrics
        .request_duration
        .get_or_create(&LatencyLabels { resource: "pods".into(), verb: "list" })
        .observe(0.1);
    let text = metrics.encode();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("# TYPE ") else { continue };
        let (name, kind) = rest.split_once(' ').unwrap();
        let suffixes: &[&str] = match kind {
            "counter" => &["_total"],
            "histogram" => &["_bucket", "_sum", "_count"],
            _ => &[""],
        };
        names.extend(suffixes.iter().map(|s| format!("{name}{s}")));
    }
    names
}

#[test]
fn promtool_accepts_the_rules() {
    let out = promtool(&["check", "rules", RULES]);
    let alerts = mk_alerts().len();
    assert!(out.contains(&format!("SUCCESS: {alerts} rules found")), "{out}");
}

#[test]
fn promtool_unit_tests_pass() {
    let out = promtool(&["test", "rules", RULE_TESTS]);
    assert!(out.contains("SUCCESS"), "{out}");
}

#[test]
fn every_alert_has_a_firing_case_and_a_near_miss() {
    let alerts: BTreeMap<String, Rule> =
        mk_alerts().into_iter().map(|(_, r)| (r.alert.clone().unwrap(), r)).collect();
    let tests = mk_rule_tests();
    assert_eq!(tests.rule_files, ["percolator-alerts.yaml"]);
    let mut firing = BTreeSet::new();
    let mut quiet = BTreeSet::new();
    for group in &tests.tests {
        for case in &group.alert_rule_test {
            let at = format!("{:?} at {}", group.name, case.eval_time);
            let rule = alerts
                .get(&case.alertname)
                .unwrap_or_else(|| panic!("{at}: {} is no alert of {RULES}", case.alertname));
            if case.exp_alerts.is_empty() {
                quiet.insert(case.alertname.clone());
                continue;
            }
            firing.insert(case.alertname.clone());
            for expected in &case.exp_alerts {
                // The whole alert: labels (the rule's severity among them) and annotations.
                assert_eq!(expected.exp_labels.get("severity"), rule.labels.get("severity"), "{at}");
                let keys: Vec<&String> = expected.exp_annotations.keys().collect();
                let want: Vec<&String> = rule.annotations.keys().collect();
                assert_eq!(keys, want, "{at}: every annotation is compared");
            }
        }
    }
    let names: BTreeSet<String> = alerts.into_keys().collect();
    let never_fired: Vec<&String> = names.difference(&firing).collect();
    let never_quiet: Vec<&String> = names.difference(&quiet).collect();
    assert!(never_fired.is_empty(), "alerts without a case where they fire: {never_fired:?}");
    assert!(never_quiet.is_empty(), "alerts without a case where they stay quiet: {never_quiet:?}");
}

#[test]
fn every_alert_is_named_labelled_and_described() {
    let rules = mk_rules();
    let groups: Vec<&str> = rules.groups.iter().map(|g| g.name.as_str()).collect();
    assert_eq!(groups, ["percolator"]);
    let alerts = mk_alerts();
    assert!(alerts.len() >= 6, "{alerts:?}");
    let mut seen = BTreeSet::new();
    for (_, rule) in &alerts {
        let name = rule.alert.as_deref().unwrap();
        assert!(seen.insert(name), "{name} is defined twice");
        let camel = name.strip_prefix("Percolator").is_some_and(|rest| {
            rest.starts_with(|c: char| c.is_ascii_uppercase())
                && rest.chars().all(|c| c.is_ascii_alphanumeric())
        });
        assert!(camel, "{name}: UpperCamelCase, prefixed Percolator");
        let severity = rule.labels.get("severity").map(String::as_str);
        assert!(matches!(severity, Some("critical" | "warning")), "{name}: severity {severity:?}");
        for key in ["summary", "description"] {
            assert!(rule.annotations.get(key).is_some_and(|v| !v.trim().is_empty()), "{name}: no {key}");
        }
        assert_eq!(
            rule.annotations.get("runbook_url").map(String::as_str),
            Some(format!("{RUNBOOKS_URL}#{}", name.to_lowercase()).as_str()),
            "{name}: its runbook, by the anchor GitHub gives its heading"
        );
        assert!(rule.for_duration.is_some(), "{name}: a `for:` rides out one bad evaluation");
    }
}

/// `docs/runbooks.md` has one section per alert, headed by the alert's name (GitHub's anchor
/// for it is the lowercased name the rules link), each saying what the alert means, how to
/// confirm it and how to fix it; and no section for an alert that does not exist.
#[test]
fn every_alert_has_a_runbook_section() {
    let text = std::fs::read_to_string(mk_path(RUNBOOKS)).unwrap();
    let mut sections: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current: Option<String> = None;
    for line in text.lines() {
        if let Some(title) = line.strip_prefix("## ") {
            current = Some(title.trim().to_owned());
            sections.entry(title.trim().to_owned()).or_default();
        } else if let (Some(title), Some(sub)) = (&current, line.strip_prefix("### ")) {
            sections.get_mut(title).unwrap().push(sub.trim().to_owned());
        }
    }
    let alerts: BTreeSet<String> = mk_alerts().into_iter().map(|(_, r)| r.alert.unwrap()).collect();
    let documented: BTreeSet<String> =
        sections.keys().filter(|t| t.starts_with("Percolator")).cloned().collect();
    assert_eq!(documented, alerts, "the runbooks' alert sections are the alerts of {RULES}");
    for alert in &alerts {
        // The anchor GitHub derives from a heading: lowercased, a word of letters alone
        // stays as it is.
        assert!(alert.chars().all(|c| c.is_ascii_alphanumeric()), "{alert}");
        assert_eq!(sections[alert], ["Meaning", "Confirm", "Fix"], "{alert}: its runbook's parts");
    }
}

#[test]
fn every_percolator_metric_named_is_exported() {
    let exported = mk_exported_names();
    assert!(
        exported.contains("percolator_tls_serving_certificate_expiration_timestamp_seconds"),
        "{exported:?}"
    );
    let text = std::fs::read_to_string(mk_path(RULES)).unwrap();
    let named: BTreeSet<&str> =
        regex::Regex::new(r"\bpercolator_[a-z0-9_]+").unwrap().find_iter(&text).map(|m| m.as_str()).collect();
    assert!(named.len() >= 6, "{named:?}");
    // Exported only where percolator runs under a memory limit (absent when unlimited, as on
    // a test machine): apiserver's collector names it under the server's namespace
    // (crates/apiserver/src/process.rs, whose unit test reads limits from cgroup files), and
    // percolator registers that collector (src/telemetry.rs).
    let collector = std::fs::read_to_string(mk_path("crates/apiserver/src/process.rs")).unwrap();
    let registered = std::fs::read_to_string(mk_path("src/telemetry.rs")).unwrap();
    let limited = "percolator_memory_limit_bytes";
    let unprefixed = limited.trim_start_matches("percolator_");
    assert!(collector.contains(&format!("\"{unprefixed}\"")), "the collector no longer exports {limited}");
    assert!(registered.contains("MemoryLimit"), "percolator no longer registers the collector of {limited}");
    let unknown: Vec<&&str> = named.iter().filter(|n| !exported.contains(**n) && **n != limited).collect();
    assert!(unknown.is_empty(), "named in {RULES} but not exported: {unknown:?}\nexported: {exported:?}");
}

#[test]
fn every_selector_of_percolator_series_is_on_the_documented_job() {
    let selector = regex::Regex::new(r"\b(up|percolator_[a-z0-9_]+)\b(\{[^}]*\})?").unwrap();
    let mut checked = 0;
    for (_, rule) in mk_alerts() {
        for found in selector.captures_iter(&rule.expr) {
            let matchers = found.get(2).map_or("", |m| m.as_str());
            assert!(
                matchers.contains(JOB_MATCHER),
                "{}: {} without {JOB_MATCHER}",
                rule.alert.unwrap(),
                &found[0]
            );
            checked += 1;
        }
    }
    assert!(checked >= 10, "{checked}");
}

/// The names of the APIServices the deploy manifests create.
fn mk_deployed_apiservices() -> BTreeSet<String> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "yaml" || e == "yml") {
                out.push(path);
            }
        }
    }
    let mut files = Vec::new();
    walk(&mk_path("deploy"), &mut files);
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let docs: Vec<serde_json::Value> =
            serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        for value in docs {
            if value["kind"].as_str() == Some("APIService") {
                names.insert(value["metadata"]["name"].as_str().unwrap().to_owned());
            }
        }
    }
    names
}

#[test]
fn the_apiservice_alert_names_every_apiservice_percolator_serves() {
    let alerts = mk_alerts();
    let (_, rule) =
        alerts.iter().find(|(_, r)| r.alert.as_deref() == Some("PercolatorAPIServiceUnavailable")).unwrap();
    // One alternation on one line, so a template can put the enabled names in its place.
    let lines: Vec<&str> = rule.expr.lines().filter(|l| l.contains("name=~")).collect();
    assert_eq!(lines.len(), 1, "{}", rule.expr);
    let matcher = regex::Regex::new(r#"name=~"([^"]*)""#).unwrap();
    let alternation = &matcher.captures(lines[0]).unwrap()[1];
    // Dots are escaped (`\\.` in a PromQL string), so each name matches only itself.
    let names: BTreeSet<String> = alternation
        .split('|')
        .map(|n| {
            assert!(!n.replace(r"\\.", "").contains('.'), "unescaped dot in {n}");
            n.replace(r"\\.", ".")
        })
        .collect();
    let expected: BTreeSet<String> = [
        "v1alpha1.stats.une-tasse-de.cafe",
        "v1beta1.metrics.k8s.io",
        "v1beta2.custom.metrics.k8s.io",
        "v1beta1.custom.metrics.k8s.io",
        "v1beta1.external.metrics.k8s.io",
    ]
    .map(str::to_owned)
    .into();
    assert_eq!(names, expected);
    assert_eq!(mk_deployed_apiservices(), expected, "the APIServices of deploy/");
}
