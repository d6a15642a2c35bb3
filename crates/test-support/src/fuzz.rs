//! The proptest harness, request strategies and PromQL literal checkers of the fuzzing
//! (RELIABILITY.md, "Hostile input"), shared by the router fuzzing (`fuzz_tests`) and the
//! fuzzing of pure public functions (`tests/fuzz.rs`, which includes this file with `#[path]`):
//! it names nothing of the crate, so it compiles in both.
//!
//! Each property first runs a fixed seed corpus, then random cases: a CI-sized number by
//! default, `PROPTEST_CASES` for the long run documented in RELIABILITY.md. A failure prints the
//! minimal input; `PROPTEST_RNG_SEED` replays a run.

use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

// ---------------------------------------------------------------------------------------------
// Harness
// ---------------------------------------------------------------------------------------------

/// `ci` random cases unless `PROPTEST_CASES` says otherwise.
fn config(ci: u32) -> Config {
    let mut config = Config::default();
    if std::env::var_os("PROPTEST_CASES").is_none() {
        config.cases = ci;
    }
    // No regressions file: an integration test has no source file proptest could place one
    // next to, and the seed corpora hold the inputs worth replaying.
    config.failure_persistence = None;
    config
}

/// Runs the corpus, then `strategy` through `check`; panics with the minimal failing input.
pub fn run<S: Strategy>(
    ci: u32,
    corpus: impl IntoIterator<Item = S::Value>,
    strategy: S,
    check: impl Fn(S::Value) -> Result<(), TestCaseError>,
) where
    S::Value: Clone + std::fmt::Debug,
{
    for seed in corpus {
        if let Err(e) = check(seed.clone()) {
            panic!("corpus input {seed:?}: {e}");
        }
    }
    let mut runner = TestRunner::new(config(ci));
    if let Err(e) = runner.run(&strategy, check) {
        panic!("{e}");
    }
}

/// Arbitrary text: any Unicode, or printable ASCII (more likely to get past the first check).
pub fn text(max: usize) -> BoxedStrategy<String> {
    prop_oneof![
        proptest::collection::vec(any::<char>(), 0..max).prop_map(|c| c.into_iter().collect()),
        proptest::string::string_regex(&format!("[ -~]{{0,{max}}}")).unwrap(),
    ]
    .boxed()
}

/// Strings assembled from `vocabulary` and arbitrary text.
pub fn assembled(vocabulary: &'static [&'static str], parts: usize) -> BoxedStrategy<String> {
    let piece = prop_oneof![
        4 => proptest::sample::select(vocabulary).prop_map(str::to_owned),
        1 => text(8),
    ];
    proptest::collection::vec(piece, 0..parts).prop_map(|p| p.concat()).boxed()
}

// ---------------------------------------------------------------------------------------------
// Requests: selectors, paths, queries, methods
// ---------------------------------------------------------------------------------------------

pub const SELECTOR_TOKENS: &[&str] = &[
    "app",
    "tier",
    "a.b/c",
    "example.com/x",
    "-a",
    "a-",
    "_x",
    "é",
    "in",
    "notin",
    "=",
    "==",
    "!=",
    "!",
    ">",
    "<",
    "(",
    ")",
    ",",
    " ",
    "\t",
    "web",
    "db",
    "1",
    "-1",
    "9223372036854775808",
    "\"",
    "\\",
    "}",
    "{",
    "|",
    "*",
    ".",
    "..",
    "/",
    "a\"}",
    "x\\\"",
    "metadata.name",
    "metadata.namespace",
    "%",
    "\u{0}",
];

const PATH_SEGMENTS: &[&str] = &[
    "apis",
    "api",
    "v1",
    "stats.une-tasse-de.cafe",
    "v1alpha1",
    "external.metrics.k8s.io",
    "v1beta1",
    "custom.metrics.k8s.io",
    "v1beta2",
    "pods",
    "*",
    "deployments.apps",
    "services",
    "http_errors_per_second",
    "namespaces",
    "shop",
    "default",
    "widgets",
    "gadgets",
    "w1",
    "cafe_brews_per_minute",
    "http_requests_per_second",
    "watch",
    "proxy",
    "status",
    "finalize",
    "openapi",
    "v2",
    "v3",
    "healthz",
    "readyz",
    "livez",
    "metrics",
    "version",
    "..",
    ".",
    "",
    "%2F",
    "%2e%2e",
    "%00",
    "%ff",
    "%",
    "%C3%A9",
    "UPPER",
];

fn segment() -> BoxedStrategy<String> {
    prop_oneof![
        6 => proptest::sample::select(PATH_SEGMENTS).prop_map(str::to_owned),
        1 => proptest::string::string_regex("[a-zA-Z0-9._~%-]{0,12}").unwrap(),
        1 => text(12).prop_map(|t| percent_encode(&t)),
    ]
    .boxed()
}

/// Mostly well-formed resource and external metric paths (so that requests reach the
/// handlers), with a random segment swapped in now and then; and free-form paths.
pub fn path() -> BoxedStrategy<String> {
    let name = || prop_oneof![3 => proptest::sample::select(&["w1", "w2", "shop", "x"][..]).prop_map(str::to_owned), 1 => segment()];
    const TARGETS: &[(&str, &str, bool)] = &[
        ("stats.une-tasse-de.cafe/v1alpha1", "widgets", true),
        ("stats.une-tasse-de.cafe/v1alpha1", "gadgets", false),
        ("external.metrics.k8s.io/v1beta1", "cafe_brews_per_minute", true),
        ("external.metrics.k8s.io/v1beta1", "http_requests_per_second", true),
        ("external.metrics.k8s.io/v1beta1", "nope", true),
        ("custom.metrics.k8s.io/v1beta2", "pods", true),
        ("custom.metrics.k8s.io/v1beta1", "deployments.apps", true),
        ("custom.metrics.k8s.io/v1beta2", "metrics", true),
    ];
    let resource = (
        proptest::sample::select(TARGETS),
        proptest::option::weighted(
            0.1,
            prop_oneof![Just("watch".to_owned()), Just("proxy".to_owned()), segment()],
        ),
        any::<bool>(),
        name(),
        proptest::option::weighted(0.1, segment()),
        proptest::option::weighted(0.4, name()),
        proptest::option::weighted(0.05, segment()),
    )
        .prop_map(|((gv, plural, namespaced), prefix, flip, ns, other_plural, name, sub)| {
            // The scope that fits the kind, mostly.
            let with_ns = namespaced != (flip && ns.len() % 5 == 0);
            let mut p = format!("/apis/{gv}");
            for part in [
                prefix,
                with_ns.then(|| format!("namespaces/{ns}")),
                Some(other_plural.unwrap_or(plural.to_owned())),
                name,
                sub,
            ]
            .into_iter()
            .flatten()
            {
                p.push('/');
                p.push_str(&part);
            }
            p
        });
    prop_oneof![
        6 => resource,
        4 => proptest::collection::vec(segment(), 0..9).prop_map(|s| format!("/{}", s.join("/"))),
        1 => proptest::string::string_regex("/[!-~]{0,40}").unwrap(),
    ]
    .boxed()
}

const QUERY_KEYS: &[&str] = &[
    "labelSelector",
    "fieldSelector",
    "watch",
    "limit",
    "timeout",
    "timeoutSeconds",
    "includeObject",
    "continue",
    "resourceVersion",
    "verbose",
    "pretty",
    "x",
];

pub fn query() -> BoxedStrategy<Option<String>> {
    let value = prop_oneof![
        assembled(SELECTOR_TOKENS, 8),
        proptest::sample::select(
            &[
                "",
                "0",
                "1",
                "true",
                "false",
                "-1",
                "5s",
                "1ms",
                "soon",
                "Object",
                "None",
                "Metadata",
                "99999999999999999999"
            ][..]
        )
        .prop_map(str::to_owned),
        text(16),
    ];
    let pair = (proptest::sample::select(QUERY_KEYS), value).prop_map(|(k, v)| {
        format!("{k}={}", url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>())
    });
    prop_oneof![
        1 => Just(None),
        4 => proptest::collection::vec(pair, 0..4).prop_map(|p| Some(p.join("&"))),
        1 => proptest::string::string_regex("[!-~]{0,40}").unwrap().prop_map(Some),
    ]
    .boxed()
}

pub fn method() -> BoxedStrategy<String> {
    prop_oneof![
        6 => Just("GET".to_owned()),
        4 => proptest::sample::select(&["HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT", "get"][..])
            .prop_map(str::to_owned),
        1 => proptest::string::string_regex("[A-Z]{1,10}").unwrap(),
    ]
    .boxed()
}

fn percent_encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-._~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

// ---------------------------------------------------------------------------------------------
// PromQL literals
// ---------------------------------------------------------------------------------------------

/// Go's `strconv.Unquote` for a double-quoted literal (what Prometheus' parser applies to a
/// string token): the bytes it stands for, or why Go would reject it.
pub fn go_unquote(literal: &str) -> Result<Vec<u8>, String> {
    let inner = literal
        .strip_prefix('"')
        .and_then(|s| s.strip_suffix('"'))
        .ok_or_else(|| format!("not a double-quoted literal: {literal:?}"))?;
    if inner.contains('\n') {
        return Err("raw newline".into());
    }
    let mut out = Vec::new();
    let mut chars = inner.chars().peekable();
    let hex = |chars: &mut std::iter::Peekable<std::str::Chars<'_>>, n: usize| -> Result<u32, String> {
        let mut v = 0u32;
        for _ in 0..n {
            let c = chars.next().ok_or("short escape")?;
            v = v * 16 + c.to_digit(16).ok_or_else(|| format!("bad hex digit {c:?}"))?;
        }
        Ok(v)
    };
    while let Some(c) = chars.next() {
        match c {
            '"' => return Err("unescaped quote inside the literal".into()),
            '\\' => {
                let e = chars.next().ok_or("trailing backslash")?;
                let simple = match e {
                    'a' => Some(0x07u8),
                    'b' => Some(0x08),
                    'f' => Some(0x0c),
                    'n' => Some(b'\n'),
                    'r' => Some(b'\r'),
                    't' => Some(b'\t'),
                    'v' => Some(0x0b),
                    '\\' => Some(b'\\'),
                    '"' => Some(b'"'),
                    _ => None,
                };
                if let Some(b) = simple {
                    out.push(b);
                    continue;
                }
                match e {
                    'x' => out.push(u8::try_from(hex(&mut chars, 2)?).unwrap()),
                    'u' | 'U' => {
                        let v = hex(&mut chars, if e == 'u' { 4 } else { 8 })?;
                        let c = char::from_u32(v).ok_or_else(|| format!("invalid rune {v:#x}"))?;
                        out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes());
                    }
                    '0'..='7' => {
                        let mut v = e.to_digit(8).unwrap();
                        for _ in 0..2 {
                            let d = chars.next().and_then(|c| c.to_digit(8)).ok_or("bad octal escape")?;
                            v = v * 8 + d;
                        }
                        out.push(u8::try_from(v).map_err(|_| "octal escape > 255")?);
                    }
                    other => return Err(format!("unknown escape \\{other}")),
                }
            }
            c => out.extend_from_slice(c.encode_utf8(&mut [0; 4]).as_bytes()),
        }
    }
    Ok(out)
}

/// Byte length of the string literal at the start of `s` (quotes included).
pub fn literal_end(s: &str) -> Result<usize, String> {
    let mut chars = s.char_indices();
    if chars.next().map(|(_, c)| c) != Some('"') {
        return Err(format!("no literal at {s:?}"));
    }
    let mut escaped = false;
    for (i, c) in chars {
        match c {
            _ if escaped => escaped = false,
            '\\' => escaped = true,
            '"' => return Ok(i + 1),
            _ => {}
        }
    }
    Err("unterminated literal".into())
}

/// Every string literal of a rendered query (outside comments, which templates do not have)
/// must unquote.
pub fn check_promql_literals(promql: &str) -> Result<(), String> {
    let mut rest = promql;
    while let Some(start) = rest.find('"') {
        let end = literal_end(&rest[start..])?;
        go_unquote(&rest[start..start + end])?;
        rest = &rest[start + end..];
    }
    Ok(())
}
