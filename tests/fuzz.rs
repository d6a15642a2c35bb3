//! Hostile input (RELIABILITY.md, "Hostile input"): property tests (proptest) of the public
//! functions that parse client or operator input.
//!
//! - the label selector and field selector parsers, `RequestInfo` and the query parser: never
//!   panic; whatever the label selector accepts is a valid key and value;
//! - PromQL: every matcher value, whatever its characters, is written as a PromQL string
//!   literal that Go's `strconv.Unquote` (what Prometheus' parser applies) reads back to
//!   exactly that value; set matches are regexes whose only alternatives are the literal
//!   values;
//! - the kubelet parser (mutations of a real `/metrics/resource` body, and arbitrary text) and
//!   the configuration loader (`QueryFile::from_yaml`, then rendering every template): never
//!   panic.
//!
//! The whole router (fake kinds, the external metrics API on a fake Prometheus: never 5xx,
//! never a panic, only well-formed PromQL sent) is fuzzed by the unit tests of
//! `src/api/fuzz_tests.rs`, since the fake kinds are not public. Both share the harness, the
//! request strategies and the PromQL literal checkers of the `test-support` crate
//! (`test_support::fuzz`).
//!
//! Each property first runs a fixed seed corpus, then random cases: a CI-sized number by
//! default (the whole file takes seconds), `PROPTEST_CASES` for the long run documented in
//! RELIABILITY.md. A failure prints the minimal input; `PROPTEST_RNG_SEED` replays a run.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_wire::{FieldSelector, LabelSelector, Requirement};
use k8s_wire::{QueryParams, RequestInfo, split_path};
use k8s_wire::{is_qualified_name, is_valid_label_value};
use kube::core::Expression;
use percolator::config::{ExternalMetricConfig, QueryFile};
use percolator::testing::DeclaredSpec;
use percolator::testing::{
    MatchOp, Matcher, Template, keeps_label, validate_template, validate_unscoped_template,
};
use proptest::prelude::*;
use test_support::fuzz::{
    SELECTOR_TOKENS, assembled, check_promql_literals, go_unquote, literal_end, method, path, query, run,
    text,
};

// ---------------------------------------------------------------------------------------------
// Selectors, RequestInfo, query parsing
// ---------------------------------------------------------------------------------------------

const LABEL_SELECTOR_CORPUS: &[&str] = &[
    "",
    "app=web",
    "app==web,tier!=front",
    "app in (web,db)",
    "app notin (,)",
    "!app",
    "app",
    "x>1,y<-3",
    "a in (((",
    "a=\"}",
    "a=b\"}),x=~\".*",
    "app in (web\"}) or vector(1) #)",
    "example.com/app=v",
    ",",
    "!",
    "a!=",
    "a in ()",
    "a in (,,)",
    "x>9223372036854775808",
];

fn check_label_selector(input: String) -> Result<(), TestCaseError> {
    if let Ok(selector) = LabelSelector::parse(&input) {
        for requirement in selector.requirements() {
            prop_assert!(is_qualified_name(requirement.key()).is_empty(), "key {:?}", requirement.key());
            let values: Vec<&String> = match requirement {
                Requirement::Expr(Expression::Equal(_, v) | Expression::NotEqual(_, v)) => vec![v],
                Requirement::Expr(Expression::In(_, vs) | Expression::NotIn(_, vs)) => vs.iter().collect(),
                _ => vec![],
            };
            for v in values {
                prop_assert!(is_valid_label_value(v).is_empty(), "value {v:?} of {input:?}");
            }
        }
        let labels = BTreeMap::from([("app".to_owned(), "web".to_owned()), ("x".to_owned(), "5".to_owned())]);
        let _ = selector.matches(&labels);
    }
    Ok(())
}

#[test]
fn label_selector_parser() {
    run(
        10000,
        LABEL_SELECTOR_CORPUS.iter().map(|s| (*s).to_owned()),
        prop_oneof![assembled(SELECTOR_TOKENS, 12), text(64)],
        check_label_selector,
    );
}

const FIELD_SELECTOR_CORPUS: &[&str] = &[
    "",
    "metadata.name=x",
    "metadata.name==x,metadata.namespace!=y",
    "metadata.name=a\\,b",
    "metadata.name=\\",
    "metadata.name=\\x",
    "spec.nodeName=n",
    "=",
    ",,,",
    "metadata.name",
];

#[test]
fn field_selector_parser() {
    run(
        10000,
        FIELD_SELECTOR_CORPUS.iter().map(|s| (*s).to_owned()),
        prop_oneof![
            assembled(
                &["metadata.name", "metadata.namespace", "=", "==", "!=", ",", "\\", "x", "é", " "],
                10
            ),
            text(64)
        ],
        |input| {
            if let Ok(selector) = FieldSelector::parse(&input) {
                let _ = selector.matches("x", "y");
                let _ = selector.requires_exact_match("metadata.namespace");
            }
            let _ = FieldSelector::parse_supported(&input);
            Ok(())
        },
    );
}

#[test]
fn request_info_and_query_parsing() {
    let http_methods = ["GET", "POST", "DELETE", "PATCH", "PUT", "HEAD"];
    run(
        10000,
        [
            ("GET".to_owned(), "/apis/g/v/watch".to_owned(), None),
            ("GET".to_owned(), "/".to_owned(), Some("%".to_owned())),
        ],
        (method(), prop_oneof![path(), text(64)], query()),
        |(method, path, query)| {
            let method = http::Method::from_bytes(method.as_bytes()).unwrap_or(http::Method::GET);
            let _ = RequestInfo::new(&method, &path, query.as_deref());
            let params = QueryParams::parse(query.as_deref());
            let _ = params.watch();
            let _ = split_path(&path);
            for m in http_methods {
                let _ = RequestInfo::new(
                    &http::Method::from_bytes(m.as_bytes()).unwrap(),
                    &path,
                    query.as_deref(),
                );
            }
            Ok(())
        },
    );
}

// ---------------------------------------------------------------------------------------------
// PromQL escaping
// ---------------------------------------------------------------------------------------------

/// Parses `name op "literal"` as PromQL's lexer would: the literal ends at the first
/// unescaped quote, which must be the last character.
fn parse_matcher(text: &str) -> Result<(String, &'static str, Vec<u8>), String> {
    let name_end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).ok_or("no operator")?;
    let (name, rest) = text.split_at(name_end);
    let op = ["=~", "!~", "!=", "="].into_iter().find(|op| rest.starts_with(op)).ok_or("no operator")?;
    let literal = &rest[op.len()..];
    let end = literal_end(literal)?;
    if end != literal.len() {
        return Err(format!("text after the literal: {:?}", &literal[end..]));
    }
    Ok((name.to_owned(), op, go_unquote(literal)?))
}

/// The alternatives of an RE2 pattern made only of literals (`a|b\.c`), or why it is not one.
fn literal_alternatives(pattern: &str) -> Result<Vec<String>, String> {
    use regex_syntax::ast::{Ast, LiteralKind};
    fn literal(ast: &Ast) -> Result<String, String> {
        match ast {
            Ast::Empty(_) => Ok(String::new()),
            Ast::Literal(l) if matches!(l.kind, LiteralKind::Verbatim | LiteralKind::Meta) => {
                Ok(l.c.to_string())
            }
            Ast::Concat(c) => c.asts.iter().map(literal).collect(),
            other => Err(format!("not a literal: {other:?}")),
        }
    }
    let ast = regex_syntax::ast::parse::Parser::new().parse(pattern).map_err(|e| e.to_string())?;
    match &ast {
        Ast::Alternation(a) => a.asts.iter().map(literal).collect(),
        other => Ok(vec![literal(other)?]),
    }
}

#[test]
fn the_checkers_reject_what_prometheus_rejects() {
    assert_eq!(go_unquote(r#""a\"b\\""#).unwrap(), b"a\"b\\");
    assert!(go_unquote(r#""a"b""#).is_err());
    assert!(go_unquote(r#""a\'""#).is_err());
    assert!(go_unquote("\"a\nb\"").is_err());
    assert!(go_unquote(r#""\ud800""#).is_err());
    assert_eq!(go_unquote(r#""\x41\101\u00e9""#).unwrap(), "AAé".as_bytes());
    assert!(parse_matcher(r#"l="a"} or vector(1) #""#).is_err());
    assert!(parse_matcher(r#"l="a\""#).is_err());
    assert_eq!(literal_alternatives(r"a\.b|c").unwrap(), ["a.b", "c"]);
    assert!(literal_alternatives("a.b").is_err());
    assert!(literal_alternatives("(a)").is_err());
    assert!(check_promql_literals(r#"x{a="\q"}"#).is_err());
}

fn op() -> impl Strategy<Value = MatchOp> {
    proptest::sample::select(vec![MatchOp::Eq, MatchOp::Ne, MatchOp::Re, MatchOp::Nre])
}

const HOSTILE_VALUES: &[&str] = &[
    "",
    "\"",
    "\\",
    "\\\"",
    "\"}",
    "\"} or vector(1) #",
    "a\nb",
    "\r\t\u{0}\u{7f}\u{85}\u{2028}",
    "\u{1b}[31m",
    "é😀",
    "\u{feff}",
    "\\x41",
    "\\u0041",
    "'",
    "`",
    ".*|x",
    "${SCOPE}",
    "SCOPE",
];

#[test]
fn matcher_values_round_trip_through_promql_literals() {
    let corpus: Vec<(String, MatchOp)> = HOSTILE_VALUES
        .iter()
        .flat_map(|v| [MatchOp::Eq, MatchOp::Ne, MatchOp::Re, MatchOp::Nre].map(|op| ((*v).to_owned(), op)))
        .collect();
    let values = prop_oneof![
        text(48),
        proptest::collection::vec(proptest::sample::select(HOSTILE_VALUES), 0..6).prop_map(|v| v.concat()),
    ];
    run(10000, corpus, (values, op()), |(value, op)| {
        let matcher = Matcher::new("label_x", op, &value).unwrap();
        let written = matcher.to_string();
        let (name, written_op, unquoted) = parse_matcher(&written).map_err(TestCaseError::fail)?;
        prop_assert_eq!(name, "label_x");
        prop_assert_eq!(written_op, op.as_str());
        prop_assert_eq!(unquoted, value.as_bytes().to_vec(), "{}", written);
        Ok(())
    });
}

#[test]
fn set_matchers_are_exactly_their_literal_values() {
    let corpus = vec![
        HOSTILE_VALUES.iter().map(|v| (*v).to_owned()).collect::<Vec<_>>(),
        vec![String::new()],
        vec!["a|b".into()],
    ];
    run(
        5000,
        corpus,
        proptest::collection::vec(
            prop_oneof![text(16), proptest::sample::select(HOSTILE_VALUES).prop_map(str::to_owned)],
            1..6,
        ),
        |values| {
            for matcher in [Matcher::any_of("l", &values).unwrap(), Matcher::none_of("l", &values).unwrap()] {
                let (_, _, unquoted) = parse_matcher(&matcher.to_string()).map_err(TestCaseError::fail)?;
                let pattern = String::from_utf8(unquoted).unwrap();
                prop_assert_eq!(&pattern, matcher.value());
                let alternatives = literal_alternatives(&pattern).map_err(TestCaseError::fail)?;
                prop_assert_eq!(&alternatives, &values, "{}", pattern);
            }
            Ok(())
        },
    );
}

/// The label selector of an external metric request, as the router turns it into PromQL:
/// whatever passes the parser and reaches `render` comes out as matchers that unquote to
/// exactly the selector's values.
#[test]
fn selectors_reaching_render_yield_exact_promql_literals() {
    let corpus = [
        "cafe=a,type!=b",
        "cafe in (a,b.c,-x_),!type",
        "cafe notin (,)",
        "type",
        "cafe=\"}",
        "cafe in (a|b)",
    ]
    .map(str::to_owned);
    let value = prop_oneof![
        proptest::string::string_regex("[A-Za-z0-9_.-]{0,10}").unwrap(),
        proptest::sample::select(HOSTILE_VALUES).prop_map(str::to_owned),
    ];
    let requirement = (
        proptest::sample::select(&["cafe", "type", "pod", "code"][..]),
        proptest::sample::select(&["=", "==", "!=", " in ", " notin ", "exists", "!"][..]),
        proptest::collection::vec(value, 1..4),
    )
        .prop_map(|(key, op, values)| match op {
            "exists" => key.to_owned(),
            "!" => format!("!{key}"),
            " in " | " notin " => format!("{key}{op}({})", values.join(",")),
            _ => format!("{key}{op}{}", values[0]),
        });
    let selector = prop_oneof![
        4 => proptest::collection::vec(requirement, 1..4).prop_map(|r| r.join(",")),
        1 => assembled(SELECTOR_TOKENS, 10),
    ];
    let definition = ExternalMetricConfig {
        name: "m".to_owned(),
        query: Template::new("sum(rate(m{SCOPE}[WINDOW]))"),
        labels: ["cafe", "type", "pod", "code"].map(str::to_owned).to_vec(),
        window: None,
    };
    let reached = std::cell::Cell::new(0usize);
    run(5000, corpus, selector, |input| {
        let Ok(selector) = LabelSelector::parse(&input) else { return Ok(()) };
        let Ok(matchers) = percolator::testing::selector_matchers(&definition, &selector) else {
            return Ok(());
        };
        let promql = definition.query.render(&matchers, Duration::from_secs(60)).unwrap();
        let block = promql
            .strip_prefix("sum(rate(m{")
            .and_then(|s| s.strip_suffix("}[1m]))"))
            .ok_or_else(|| TestCaseError::fail(format!("shape: {promql}")))?;
        // Split the block on the commas between matchers (outside literals).
        let mut written = Vec::new();
        let mut rest = block;
        while !rest.is_empty() {
            let quote = rest.find('"').ok_or_else(|| TestCaseError::fail(format!("no literal: {promql}")))?;
            let end = quote + literal_end(&rest[quote..]).map_err(TestCaseError::fail)?;
            written.push(parse_matcher(&rest[..end]).map_err(TestCaseError::fail)?);
            rest = rest[end..].strip_prefix(',').unwrap_or(&rest[end..]);
            prop_assert!(rest.is_empty() || !rest.starts_with(','), "{promql}");
        }
        let mut expected: Vec<(String, &str, Vec<u8>)> = Vec::new();
        for requirement in selector.requirements() {
            let (key, op, value) = match requirement {
                Requirement::Expr(Expression::Equal(k, v)) => (k, "=", v.clone()),
                Requirement::Expr(Expression::NotEqual(k, v)) => (k, "!=", v.clone()),
                Requirement::Expr(Expression::In(k, vs)) => (k, "=~", regex_of(vs)),
                Requirement::Expr(Expression::NotIn(k, vs)) => (k, "!~", regex_of(vs)),
                Requirement::Expr(Expression::Exists(k)) => (k, "!=", String::new()),
                Requirement::Expr(Expression::DoesNotExist(k)) => (k, "=", String::new()),
                _ => return Ok(()),
            };
            expected.push((key.clone(), op, value.into_bytes()));
        }
        prop_assert_eq!(written, expected, "{} -> {}", input, promql);
        reached.set(reached.get() + 1);
        Ok(())
    });
    assert!(reached.get() > 100, "too few selectors reached render: {}", reached.get());
}

/// The regex a set of values must become: the values, regex-escaped, joined with `|`.
fn regex_of(values: &BTreeSet<String>) -> String {
    values
        .iter()
        .map(|v| {
            v.chars()
                .flat_map(|c| if "\\.+*?()|[]{}^$".contains(c) { vec!['\\', c] } else { vec![c] })
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("|")
}

// ---------------------------------------------------------------------------------------------
// Kubelet parser
// ---------------------------------------------------------------------------------------------

const KUBELET_TOKENS: &[&str] = &[
    "{",
    "}",
    "\"",
    "\\",
    ",",
    "=",
    "\n",
    " ",
    "NaN",
    "+Inf",
    "-Inf",
    "1e999",
    "-1",
    "0x10",
    "1_000",
    "99999999999999999999999",
    "# TYPE x counter\n",
    "# HELP\n",
    "container=\"\"",
    "namespace=",
    "pod=\"p\"",
    "\u{0}",
    "é",
    "container_cpu_usage_seconds_total",
    "container_memory_working_set_bytes",
    "container_start_time_seconds",
    "scrape_error 1\n",
    "node_cpu_usage_seconds_total 1 1\n",
];

#[derive(Debug, Clone)]
enum Mutation {
    Truncate(usize),
    Delete(usize, usize),
    Insert(usize, String),
    DuplicateLine(usize),
}

fn mutate(base: &str, mutations: &[Mutation]) -> String {
    let mut bytes = base.as_bytes().to_vec();
    for m in mutations {
        let at = |p: usize| if bytes.is_empty() { 0 } else { p % (bytes.len() + 1) };
        match m {
            Mutation::Truncate(p) => {
                let p = at(*p);
                bytes.truncate(p);
            }
            Mutation::Delete(p, n) => {
                let p = at(*p);
                let end = (p + n).min(bytes.len());
                bytes.drain(p..end);
            }
            Mutation::Insert(p, s) => {
                let p = at(*p);
                bytes.splice(p..p, s.bytes());
            }
            Mutation::DuplicateLine(p) => {
                let text = String::from_utf8_lossy(&bytes).into_owned();
                let lines: Vec<&str> = text.lines().collect();
                if !lines.is_empty() {
                    let line = lines[p % lines.len()].to_owned();
                    bytes.extend_from_slice(b"\n");
                    bytes.extend_from_slice(line.as_bytes());
                }
            }
        }
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        1 => any::<usize>().prop_map(Mutation::Truncate),
        3 => (any::<usize>(), 1usize..40).prop_map(|(p, n)| Mutation::Delete(p, n)),
        5 => (any::<usize>(), prop_oneof![proptest::sample::select(KUBELET_TOKENS).prop_map(str::to_owned), text(12)])
            .prop_map(|(p, s)| Mutation::Insert(p, s)),
        2 => any::<usize>().prop_map(Mutation::DuplicateLine),
    ]
}

#[test]
fn kubelet_parser() {
    let fixture = include_str!("fixtures/kubelet-metrics-resource.txt");
    let corpus = [
        String::new(),
        fixture.to_owned(),
        "scrape_error 1\n".to_owned(),
        // The old format: no timestamps.
        fixture
            .lines()
            .map(|l| l.rsplit_once(' ').map_or(l, |(head, _)| head))
            .collect::<Vec<_>>()
            .join("\n"),
        "container_cpu_usage_seconds_total{container=\"a\",namespace=\"n\",pod=\"p\"} NaN 1\n".to_owned(),
        "container_cpu_usage_seconds_total{container=\"a\\\"\",namespace=\"n\",pod=\"p\"} 1e999 -1\n"
            .to_owned(),
    ]
    .map(|s| (s.clone(), s));
    let body = || {
        prop_oneof![
            4 => proptest::collection::vec(mutation(), 1..8).prop_map(move |m| mutate(fixture, &m)),
            1 => text(200),
            1 => assembled(KUBELET_TOKENS, 30),
        ]
    };
    let scrape = jiff::Timestamp::from_second(1_764_496_812).unwrap();
    run(3000, corpus, (body(), body()), |(first, second)| {
        let mut node = percolator::NodeSamples::new();
        for (i, body) in [first, second].iter().enumerate() {
            let at = scrape + jiff::SignedDuration::from_secs(i as i64 * 10);
            if let Ok(batch) = percolator::parse_resource_metrics(body, at) {
                let _ = node.update(batch);
            }
        }
        Ok(())
    });
}

// ---------------------------------------------------------------------------------------------
// Configuration loader
// ---------------------------------------------------------------------------------------------

const YAML_TOKENS: &[&str] = &[
    "window: ",
    "podMetricsSummary:\n",
    "  requests: ",
    "  errors: ",
    "cafeBrewStats:\n",
    "  brews: ",
    "  p95: ",
    "  temperature: ",
    "externalMetrics:\n",
    "kinds:\n",
    "- kind: ",
    "  nameLabel: ",
    "  scope: ",
    "Cluster",
    "  shortNames: [",
    "  pods: {label: ",
    "  fields:\n",
    "  - name: ",
    "    query: ",
    "    format: ",
    "    column: ",
    "    wide: true",
    "AppTraffic",
    "pms",
    "pod",
    "sum by (namespace) (x)",
    "topk(3, x{SCOPE}) or vector(0)",
    "histogram_quantile(0.9, sum by (le, pod) (rate(x{SCOPE}[WINDOW])))",
    "- name: ",
    "  query: ",
    "  labels: [",
    "]",
    "  window: ",
    "\n",
    "5m",
    "1s",
    "0s",
    "10ms",
    "-1m",
    "99999999h",
    "sum(rate(x{SCOPE}[WINDOW]))",
    "x{SCOPE}",
    "{SCOPE}",
    "SCOPE",
    "WINDOW",
    "[WINDOW:1m]",
    "by (namespace, pod)",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "(",
    ")",
    "#",
    "&a",
    "*a",
    "!!str",
    "~",
    "null",
    "- ",
    ": ",
    "cafe",
    "namespace",
    "__name__",
    "status",
    "é",
    "\t",
    "---\n",
];

#[test]
fn configuration_loader() {
    let corpus = [
        String::new(),
        "window: 2m\n".to_owned(),
        "externalMetrics: []\n".to_owned(),
        "externalMetrics:\n- name: a\n  query: x{SCOPE}\n  labels: [cafe, cafe]\n".to_owned(),
        "podMetricsSummary:\n  requests: 'sum(x{SCOPE}[WINDOW]'\n".to_owned(),
        "a: &a [*a, *a]\n".to_owned(),
        "window: 99999999999999999999h\n".to_owned(),
        "kinds:\n- kind: AppTraffic\n  nameLabel: pod\n  fields:\n  - name: rps\n    query: sum by (namespace, pod) (x{SCOPE})\n".to_owned(),
        "kinds:\n- kind: T\n  scope: Cluster\n  nameLabel: namespace\n  pods: {label: app}\n  fields:\n  - {name: a, query: x, format: bytes, column: A, wide: true}\n".to_owned(),
    ];
    let window = Duration::from_secs(300);
    let check = percolator::config_check();
    run(5000, corpus, prop_oneof![assembled(YAML_TOKENS, 24), text(120)], |yaml| {
        if let Ok(config) = QueryFile::from_yaml(&yaml, "fuzz.yaml", &check) {
            let scope = [Matcher::eq("namespace", "shop\"}").unwrap()];
            let window = config.window.unwrap_or(window);
            let templates = config
                .kind_queries
                .values()
                .flat_map(|queries| queries.values())
                .chain(config.external_metrics.iter().flatten().map(|m| &m.query))
                .chain(config.kinds.iter().flat_map(|k| k.fields.iter().map(|f| &f.query)));
            for kind in &config.kinds {
                let spec = DeclaredSpec::from_config(kind);
                assert_eq!(spec.columns[0].name, "Name", "{yaml}");
            }
            for template in templates {
                let _ = template.render(&scope, window);
                let _ = template.render(&[], window);
            }
        }
        Ok(())
    });
}

#[test]
fn promql_templates() {
    run(
        5000,
        [
            "x{SCOPE}".to_owned(),
            "{SCOPE,}".to_owned(),
            "x{SCOPE}[WINDOW:WINDOW]".to_owned(),
            "\"SCOPE\"{SCOPE}".to_owned(),
        ],
        prop_oneof![assembled(YAML_TOKENS, 12), text(60)],
        |template| {
            // The declared kinds' checks read any text without panicking.
            let _ = (validate_unscoped_template(&template), keeps_label(&template, "pod"));
            if validate_template(&template).is_ok() {
                let scope =
                    [Matcher::eq("namespace", "a\"b").unwrap(), Matcher::any_of("pod", &["x|y"]).unwrap()];
                let _ = Template::new(template.as_str()).render(&scope, Duration::from_millis(1500));
            }
            // Any text reads as a template; an invalid one renders its error, never a panic.
            let _ = Template::new(template.as_str()).render(&[], Duration::from_secs(60));
            Ok(())
        },
    );
}
