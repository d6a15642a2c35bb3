//! The PromQL template language: configured queries in which two placeholders are replaced,
//! and the escaping of everything a client sends into them.
//!
//! No PromQL is built from unescaped input (DESIGN §2). A query is a configured template in
//! which two placeholders are replaced:
//!
//! - `SCOPE`, inside a label-matcher block (`{SCOPE}`, `{code=~"5..",SCOPE}`), becomes the
//!   comma-joined [`Matcher`]s of the request (namespace, pod names, label selector). Matcher
//!   names are validated as Prometheus label names and values are always written as escaped
//!   PromQL strings, with regular-expression metacharacters escaped too for set matches, so a
//!   value can never end its string or widen a regex.
//! - `WINDOW`, as a range (`[WINDOW]`, or `[WINDOW:…]` for a subquery), becomes a Prometheus
//!   duration (`5m`, `1m30s`).
//!
//! [`validate_template`] runs at configuration load and also checks that every vector selector
//! of the template carries `SCOPE`: a selector without it would read every namespace.
//! [`validate_unscoped_template`] is the same check for queries that are never scoped (a
//! cluster-scoped declared kind), where `SCOPE` may be left out. [`keeps_label`] tells,
//! statically, whether a query's result keeps a label that aggregations could drop.

use std::fmt;
use std::time::Duration;

use super::{Error, Result};

/// Placeholder for the request's matchers.
pub const SCOPE_PLACEHOLDER: &str = "SCOPE";

/// Placeholder for the rate window.
pub const WINDOW_PLACEHOLDER: &str = "WINDOW";

/// PromQL keywords (matched case-insensitively, as PromQL does) that may stand where a bare
/// metric name could.
pub(super) const KEYWORDS: [&str; 14] = [
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "atan2",
    "inf",
    "nan",
];

/// Keywords followed by a parenthesized list of label names.
const GROUPING_KEYWORDS: [&str; 6] = ["by", "without", "on", "ignoring", "group_left", "group_right"];

// ---------------------------------------------------------------------------------------------
// Escaping and matchers
// ---------------------------------------------------------------------------------------------

/// Escapes a value for a PromQL double-quoted string (without the quotes): `\` and `"` are
/// backslash-escaped, newline, carriage return and tab become `\n`, `\r`, `\t`, and other
/// control characters `\u00XX`, as Go's string unquoting reads them.
pub fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 2);
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if c.is_control() => {
                for unit in c.encode_utf16(&mut [0; 2]) {
                    out.push_str(&format!("\\u{unit:04x}"));
                }
            }
            c => out.push(c),
        }
    }
    out
}

/// Escapes regular-expression metacharacters so the value matches itself literally in RE2 (the
/// set Go's `regexp.QuoteMeta` escapes: `\.+*?()|[]{}^$`).
pub fn escape_regex(value: &str) -> String {
    let mut out = String::with_capacity(value.len() + 4);
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// Whether `name` is a classic Prometheus label name, `[a-zA-Z_][a-zA-Z0-9_]*`.
pub fn is_valid_label_name(name: &str) -> bool {
    let mut bytes = name.bytes();
    bytes.next().is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
        && bytes.all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// A PromQL label match operator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MatchOp {
    /// `=`
    Eq,
    /// `!=`
    Ne,
    /// `=~` (the regex is anchored by Prometheus)
    Re,
    /// `!~`
    Nre,
}

impl MatchOp {
    /// The operator as written in PromQL.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Eq => "=",
            Self::Ne => "!=",
            Self::Re => "=~",
            Self::Nre => "!~",
        }
    }
}

/// One label matcher, `name op "value"`, with a validated name; its [`Display`](fmt::Display)
/// writes the value escaped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Matcher {
    name: String,
    op: MatchOp,
    value: String,
}

impl Matcher {
    /// A matcher; fails unless `name` is a valid label name. For [`MatchOp::Re`] and
    /// [`MatchOp::Nre`], `value` is a regex taken as is: build regexes from client input with
    /// [`Matcher::any_of`] / [`Matcher::none_of`].
    pub fn new(name: &str, op: MatchOp, value: &str) -> Result<Self> {
        if !is_valid_label_name(name) {
            return Err(Error::InvalidLabelName(name.to_owned()));
        }
        Ok(Self { name: name.to_owned(), op, value: value.to_owned() })
    }

    /// `name="value"`.
    pub fn eq(name: &str, value: &str) -> Result<Self> {
        Self::new(name, MatchOp::Eq, value)
    }

    /// `name!="value"`.
    pub fn ne(name: &str, value: &str) -> Result<Self> {
        Self::new(name, MatchOp::Ne, value)
    }

    /// `name=~"v1|v2"` matching exactly one of the literal values (label selector `in`).
    pub fn any_of<S: AsRef<str>>(name: &str, values: &[S]) -> Result<Self> {
        Self::new(name, MatchOp::Re, &literal_alternation(name, values)?)
    }

    /// `name!~"v1|v2"` matching none of the literal values (label selector `notin`).
    pub fn none_of<S: AsRef<str>>(name: &str, values: &[S]) -> Result<Self> {
        Self::new(name, MatchOp::Nre, &literal_alternation(name, values)?)
    }

    /// The label name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The operator.
    pub fn op(&self) -> MatchOp {
        self.op
    }

    /// The value (or regex), unescaped.
    pub fn value(&self) -> &str {
        &self.value
    }
}

impl fmt::Display for Matcher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}{}\"{}\"", self.name, self.op.as_str(), escape_label_value(&self.value))
    }
}

/// `v1|v2|…` with every value regex-escaped; Prometheus anchors it as `^(?:…)$`.
fn literal_alternation<S: AsRef<str>>(name: &str, values: &[S]) -> Result<String> {
    if values.is_empty() {
        return Err(Error::EmptySet(name.to_owned()));
    }
    Ok(values.iter().map(|v| escape_regex(v.as_ref())).collect::<Vec<_>>().join("|"))
}

// ---------------------------------------------------------------------------------------------
// Templates
// ---------------------------------------------------------------------------------------------

/// Formats a window as a Prometheus duration (`5m`, `30s`, `1m30s`, `1h`, `1s500ms`); fails for
/// a window under a millisecond. Sub-millisecond parts are dropped.
pub fn format_duration(window: Duration) -> Result<String> {
    let mut ms = window.as_millis();
    if ms == 0 {
        return Err(Error::InvalidWindow(window));
    }
    let mut out = String::new();
    for (unit, size) in [("h", 3_600_000u128), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= size {
            out.push_str(&format!("{}{unit}", ms / size));
            ms %= size;
        }
    }
    Ok(out)
}

/// Checks a template at configuration load: `SCOPE` appears at least once and only as an
/// element of a label-matcher block, every label-matcher block and every vector selector carries
/// it, `WINDOW` appears only as a range (`[WINDOW]`, `[WINDOW:…]`), and brackets and strings are
/// balanced. Not a full PromQL parser: Prometheus still rejects invalid PromQL at query time.
pub fn validate_template(template: &str) -> Result<()> {
    analyze(template, Scoping::Required).map(|_| ())
}

/// Checks a template that is never scoped (a cluster-scoped kind's query) as
/// [`validate_template`] does, except that selectors need not carry `SCOPE`: where it appears it
/// must still be an element of a label-matcher block, and it renders empty.
pub fn validate_unscoped_template(template: &str) -> Result<()> {
    analyze(template, Scoping::Optional).map(|_| ())
}

/// Renders a template: `SCOPE` becomes the comma-joined matchers (with an adjacent comma
/// removed when there are none, so `{SCOPE,code="500"}` stays valid), `WINDOW` the window.
/// With matchers, every selector must carry `SCOPE` (as [`validate_template`] checks), so none
/// escapes the scope; without matchers there is nothing to scope, so a template valid for
/// [`validate_unscoped_template`] renders too.
pub fn render(template: &str, scope: &[Matcher], window: Duration) -> Result<String> {
    let scoping = if scope.is_empty() { Scoping::Optional } else { Scoping::Required };
    let placeholders = analyze(template, scoping)?;
    let window_text = if placeholders.iter().any(|p| p.kind == Placeholder::Window) {
        Some(format_duration(window)?)
    } else {
        None
    };
    let scope_text = scope.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");

    let mut out = String::with_capacity(template.len() + scope_text.len() * placeholders.len());
    let mut copied = 0;
    for found in &placeholders {
        let (start, end, replacement) = match found.kind {
            Placeholder::Window => (found.start, found.end, window_text.as_deref().unwrap_or_default()),
            Placeholder::Scope if !scope_text.is_empty() => (found.start, found.end, scope_text.as_str()),
            Placeholder::Scope => match (found.comma_after, found.comma_before) {
                (Some(comma), _) => (found.start, comma + 1, ""),
                (None, Some(comma)) => (comma, found.end, ""),
                (None, None) => (found.start, found.end, ""),
            },
        };
        out.push_str(template.get(copied..start).unwrap_or_default());
        out.push_str(replacement);
        copied = end;
    }
    out.push_str(template.get(copied..).unwrap_or_default());
    Ok(out)
}

/// Whether every selector of a template must carry `SCOPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scoping {
    /// Every selector and label-matcher block carries `SCOPE`, and it appears at least once.
    Required,
    /// `SCOPE` may be absent (where present, it is still checked).
    Optional,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholder {
    Scope,
    Window,
}

/// A placeholder found in a template, with the commas around it (byte offsets).
#[derive(Debug)]
struct Found {
    kind: Placeholder,
    start: usize,
    end: usize,
    comma_before: Option<usize>,
    comma_after: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum TokenKind {
    Ident,
    Number,
    Str,
    Punct(u8),
}

#[derive(Debug, Clone, Copy)]
pub(super) struct Token {
    pub(super) kind: TokenKind,
    pub(super) start: usize,
    pub(super) end: usize,
}

/// What an open bracket started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// `{`: a label-matcher block, and whether it holds `SCOPE`.
    Matchers { scoped: bool, at: usize },
    /// `[`: a range or subquery.
    Range,
    /// `(` after a grouping keyword: a list of label names.
    LabelList,
    /// Any other `(`.
    Paren,
}

fn template_error(at: usize, reason: impl Into<String>) -> Error {
    Error::Template { at, reason: reason.into() }
}

/// Splits a template into the tokens that matter (whitespace and comments dropped).
pub(super) fn tokenize(template: &str) -> Result<Vec<Token>> {
    let bytes = template.as_bytes();
    let mut tokens = Vec::new();
    let mut in_range = false;
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        let start = i;
        let kind = match b {
            b' ' | b'\t' | b'\r' | b'\n' => {
                i += 1;
                continue;
            }
            b'#' => {
                while bytes.get(i).is_some_and(|b| *b != b'\n') {
                    i += 1;
                }
                continue;
            }
            b'"' | b'\'' | b'`' => {
                i += 1;
                loop {
                    match bytes.get(i) {
                        None => return Err(template_error(start, "unterminated string")),
                        Some(b'\\') if b != b'`' => i += 2,
                        Some(c) if *c == b => {
                            i += 1;
                            break;
                        }
                        Some(_) => i += 1,
                    }
                }
                TokenKind::Str
            }
            // Inside a range `:` separates a subquery step (`[WINDOW:1m]`); elsewhere it is
            // part of recording-rule names (`job:requests:rate5m`).
            b if b.is_ascii_alphabetic() || b == b'_' || (b == b':' && !in_range) => {
                while bytes
                    .get(i)
                    .is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || (*b == b':' && !in_range))
                {
                    i += 1;
                }
                TokenKind::Ident
            }
            b if b.is_ascii_digit() || b == b'.' => {
                while bytes.get(i).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_' || *b == b'.') {
                    i += 1;
                }
                TokenKind::Number
            }
            b if b.is_ascii() => {
                i += 1;
                match b {
                    b'[' => in_range = true,
                    b']' => in_range = false,
                    _ => {}
                }
                TokenKind::Punct(b)
            }
            _ => {
                // Non-ASCII outside a string: never valid PromQL syntax around our placeholders;
                // skip the whole character.
                i += template.get(i..).and_then(|rest| rest.chars().next()).map_or(1, char::len_utf8);
                continue;
            }
        };
        tokens.push(Token { kind, start, end: i.min(template.len()) });
    }
    Ok(tokens)
}

/// Finds the placeholders and checks where they stand (see [`validate_template`] and, with
/// [`Scoping::Optional`], [`validate_unscoped_template`]).
fn analyze(template: &str, scoping: Scoping) -> Result<Vec<Found>> {
    let required = scoping == Scoping::Required;
    let tokens = tokenize(template)?;
    let text = |t: &Token| template.get(t.start..t.end).unwrap_or_default();
    let punct = |t: Option<&Token>| match t {
        Some(Token { kind: TokenKind::Punct(p), .. }) => Some(*p),
        _ => None,
    };

    let mut stack: Vec<Open> = Vec::new();
    let mut found = Vec::new();
    let mut grouping_pending = false;

    for (index, token) in tokens.iter().enumerate() {
        let prev = index.checked_sub(1).and_then(|i| tokens.get(i));
        let next = tokens.get(index + 1);
        let was_grouping_pending = std::mem::take(&mut grouping_pending);
        match token.kind {
            TokenKind::Punct(b'{') => stack.push(Open::Matchers { scoped: false, at: token.start }),
            TokenKind::Punct(b'[') => stack.push(Open::Range),
            TokenKind::Punct(b'(') => {
                stack.push(if was_grouping_pending { Open::LabelList } else { Open::Paren })
            }
            TokenKind::Punct(close @ (b'}' | b']' | b')')) => {
                let matches = match (stack.pop(), close) {
                    (Some(Open::Matchers { scoped, at }), b'}') => {
                        if !scoped && required {
                            return Err(template_error(
                                at,
                                "label matchers without SCOPE would read every namespace",
                            ));
                        }
                        true
                    }
                    (Some(Open::Range), b']') => true,
                    (Some(Open::Paren | Open::LabelList), b')') => true,
                    _ => false,
                };
                if !matches {
                    return Err(template_error(token.start, "unbalanced brackets"));
                }
            }
            TokenKind::Ident if text(token) == SCOPE_PLACEHOLDER => {
                let in_matchers = matches!(stack.last(), Some(Open::Matchers { .. }));
                let before = punct(prev);
                let after = punct(next);
                if !in_matchers || !matches!(before, Some(b'{' | b',')) || !matches!(after, Some(b'}' | b','))
                {
                    return Err(template_error(
                        token.start,
                        "SCOPE must be an element of a label-matcher block, like {SCOPE} or {code=\"500\",SCOPE}",
                    ));
                }
                if let Some(Open::Matchers { scoped, .. }) = stack.last_mut() {
                    *scoped = true;
                }
                found.push(Found {
                    kind: Placeholder::Scope,
                    start: token.start,
                    end: token.end,
                    comma_before: (before == Some(b',')).then(|| prev.map(|t| t.start)).flatten(),
                    comma_after: (after == Some(b',')).then(|| next.map(|t| t.start)).flatten(),
                });
            }
            TokenKind::Ident if text(token) == WINDOW_PLACEHOLDER => {
                let in_range = stack.last() == Some(&Open::Range);
                if !in_range || punct(prev) != Some(b'[') || !matches!(punct(next), Some(b']' | b':')) {
                    return Err(template_error(
                        token.start,
                        "WINDOW must be a range, like [WINDOW] or [WINDOW:1m]",
                    ));
                }
                found.push(Found {
                    kind: Placeholder::Window,
                    start: token.start,
                    end: token.end,
                    comma_before: None,
                    comma_after: None,
                });
            }
            TokenKind::Ident => {
                let name = text(token);
                let lower = name.to_ascii_lowercase();
                let in_expression = matches!(stack.last(), None | Some(Open::Paren));
                if GROUPING_KEYWORDS.contains(&lower.as_str()) {
                    grouping_pending = true;
                } else if required
                    && in_expression
                    && !KEYWORDS.contains(&lower.as_str())
                    && !matches!(punct(next), Some(b'(' | b'{'))
                    && !next
                        .is_some_and(|t| matches!(text(t).to_ascii_lowercase().as_str(), "by" | "without"))
                {
                    return Err(template_error(
                        token.start,
                        format!("metric {name} has no {{SCOPE}} matchers and would read every namespace"),
                    ));
                }
            }
            TokenKind::Punct(_) | TokenKind::Number | TokenKind::Str => {}
        }
    }
    if let Some(open) = stack.last() {
        let at = match open {
            Open::Matchers { at, .. } => *at,
            _ => template.len(),
        };
        return Err(template_error(at, "unbalanced brackets"));
    }
    if required && !found.iter().any(|f| f.kind == Placeholder::Scope) {
        return Err(template_error(0, "no SCOPE placeholder"));
    }
    Ok(found)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    pub(in crate::sources::prometheus) const REQUESTS: &str =
        "sum by (namespace, pod) (rate(http_requests_total{SCOPE}[WINDOW]))";
    pub(in crate::sources::prometheus) const ERRORS: &str =
        "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW]))";
    pub(in crate::sources::prometheus) const FIVE_MINUTES: Duration = Duration::from_secs(300);

    /// Values a client could send to break out of a string or widen a match.
    pub(in crate::sources::prometheus) const NASTY: [&str; 7] = [
        "a\"b",
        "}",
        "back\\slash",
        "new\nline",
        "x\"} or vector(1) or {a=\"",
        "tab\there, carriage\rreturn, bell\u{7} and é",
        "regex.*+?()[]{}|^",
    ];

    #[test]
    fn escapes_promql_strings() {
        for (value, escaped) in [
            ("plain", "plain"),
            ("a\"b", "a\\\"b"),
            ("}", "}"),
            ("back\\slash", "back\\\\slash"),
            ("new\nline", "new\\nline"),
            ("\r\t\u{7}", "\\r\\t\\u0007"),
            ("x\"} or vector(1) or {a=\"", "x\\\"} or vector(1) or {a=\\\""),
            ("é", "é"),
        ] {
            assert_eq!(escape_label_value(value), escaped, "{value:?}");
        }
    }

    #[test]
    fn escapes_regex_metacharacters() {
        assert_eq!(escape_regex("web-1.shop"), "web-1\\.shop");
        assert_eq!(escape_regex("a.*+?()[]{}|^$\\z"), "a\\.\\*\\+\\?\\(\\)\\[\\]\\{\\}\\|\\^\\$\\\\z");
    }

    #[test]
    fn matchers_validate_names_and_escape_values() {
        assert_eq!(Matcher::eq("namespace", "shop").unwrap().to_string(), "namespace=\"shop\"");
        assert_eq!(Matcher::ne("app", "a\"b").unwrap().to_string(), "app!=\"a\\\"b\"");
        assert_eq!(Matcher::any_of("pod", &["web-1", "a.b"]).unwrap().to_string(), "pod=~\"web-1|a\\\\.b\"");
        assert_eq!(Matcher::none_of("tier", &["x|y"]).unwrap().to_string(), "tier!~\"x\\\\|y\"");
        assert_eq!(Matcher::new("_x9", MatchOp::Re, "5..").unwrap().to_string(), "_x9=~\"5..\"");
        for bad in ["", "9a", "a-b", "a.b", "a\"", "app.kubernetes.io/name", "é", "a b", "a}"] {
            assert_eq!(Matcher::eq(bad, "v"), Err(Error::InvalidLabelName(bad.to_owned())), "{bad:?}");
        }
        assert_eq!(Matcher::any_of::<&str>("pod", &[]), Err(Error::EmptySet("pod".to_owned())));
    }

    #[test]
    fn durations() {
        assert_eq!(format_duration(FIVE_MINUTES).unwrap(), "5m");
        assert_eq!(format_duration(Duration::from_secs(30)).unwrap(), "30s");
        assert_eq!(format_duration(Duration::from_secs(90)).unwrap(), "1m30s");
        assert_eq!(format_duration(Duration::from_secs(3600)).unwrap(), "1h");
        assert_eq!(format_duration(Duration::from_secs(5430)).unwrap(), "1h30m30s");
        assert_eq!(format_duration(Duration::from_millis(1500)).unwrap(), "1s500ms");
        assert!(format_duration(Duration::from_micros(999)).is_err());
    }

    #[test]
    fn renders_scope_and_window() {
        let scope =
            [Matcher::eq("namespace", "shop").unwrap(), Matcher::any_of("pod", &["web-1", "web-2"]).unwrap()];
        assert_eq!(
            render(REQUESTS, &scope, FIVE_MINUTES).unwrap(),
            "sum by (namespace, pod) (rate(http_requests_total{namespace=\"shop\",pod=~\"web-1|web-2\"}[5m]))"
        );
        assert_eq!(
            render(ERRORS, &scope[..1], Duration::from_secs(90)).unwrap(),
            "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",namespace=\"shop\"}[1m30s]))"
        );
        // No matchers: the block is left empty, and never with a dangling leading comma.
        assert_eq!(
            render(REQUESTS, &[], FIVE_MINUTES).unwrap(),
            "sum by (namespace, pod) (rate(http_requests_total{}[5m]))"
        );
        assert_eq!(
            render(ERRORS, &[], FIVE_MINUTES).unwrap(),
            "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\"}[5m]))"
        );
        assert_eq!(render("x{SCOPE , code=\"5\"}", &[], FIVE_MINUTES).unwrap(), "x{ code=\"5\"}");
        assert_eq!(
            render("max_over_time(rate(x{SCOPE}[1m])[WINDOW:30s])", &scope[..1], FIVE_MINUTES).unwrap(),
            "max_over_time(rate(x{namespace=\"shop\"}[1m])[5m:30s])"
        );
        // Placeholders inside strings and longer identifiers are left alone.
        assert_eq!(
            render(
                "label_replace(x{SCOPE}, \"SCOPE\", \"WINDOW\", \"SCOPE_X\", \"\")",
                &scope[..1],
                FIVE_MINUTES
            )
            .unwrap(),
            "label_replace(x{namespace=\"shop\"}, \"SCOPE\", \"WINDOW\", \"SCOPE_X\", \"\")"
        );
    }

    #[test]
    fn injection_attempts_stay_inside_the_string() {
        for value in NASTY {
            let scope = [Matcher::eq("namespace", value).unwrap()];
            let query = render(REQUESTS, &scope, FIVE_MINUTES).unwrap();
            let inner = query
                .strip_prefix("sum by (namespace, pod) (rate(http_requests_total{namespace=\"")
                .and_then(|rest| rest.strip_suffix("\"}[5m]))"))
                .unwrap();
            assert_eq!(inner, escape_label_value(value));
            // Every quote inside is escaped, so the string cannot end early.
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                assert_ne!(c, '"', "unescaped quote in {inner:?}");
                assert_ne!(c, '\n', "raw newline in {inner:?}");
                if c == '\\' {
                    chars.next();
                }
            }
        }
    }

    #[test]
    fn templates_are_validated() {
        for good in [
            REQUESTS,
            ERRORS,
            "cafe_temperature_celsius{SCOPE}",
            "histogram_quantile(0.95, sum by (le, namespace, cafe) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
            "sum(increase(cafe_brews_total{SCOPE}[WINDOW])) by (cafe, type) * 60",
            "time() - max by (cafe) (cafe_last_brew_timestamp_seconds{SCOPE})",
            "sum by (pod) (rate(a{SCOPE}[WINDOW])) / on(pod) group_left sum by (pod) (rate(b{SCOPE}[WINDOW])) > bool 0",
            "SUM BY (pod) (x{SCOPE}) OR vector(0)",
            "x{SCOPE} offset 5m # a comment mentioning y",
            "sum(job:http_requests:rate5m{SCOPE})",
            "max_over_time(rate(x{SCOPE}[1m])[WINDOW:30s])",
        ] {
            assert_eq!(validate_template(good), Ok(()), "{good}");
        }
        for (bad, why) in [
            ("sum(rate(http_requests_total[5m]))", "bare metric"),
            ("sum(rate(http_requests_total{code=\"500\"}[5m])) / x{SCOPE}", "unscoped block"),
            ("rate(x{SCOPE}[5m]) / rate(y[WINDOW])", "bare metric"),
            ("x{namespace=SCOPE}", "SCOPE as a value"),
            ("x{SCOPE=\"a\"}", "SCOPE as a name"),
            ("x{SCOPE}[WINDOW] + SCOPE", "SCOPE outside braces"),
            ("x{SCOPE} offset WINDOW", "WINDOW outside a range"),
            ("x{SCOPE", "unbalanced"),
            ("x{SCOPE}]", "unbalanced"),
            ("x{SCOPE,a=\"}", "unterminated string"),
            ("vector(1)", "no SCOPE"),
            ("", "no SCOPE"),
        ] {
            assert!(validate_template(bad).is_err(), "{bad} should fail: {why}");
        }
        let err = validate_template("sum(rate(http_requests_total[5m]))").unwrap_err();
        assert_eq!(
            err.to_string(),
            "PromQL template, at byte 9: metric http_requests_total has no {SCOPE} matchers and would read every namespace"
        );
    }

    #[test]
    fn unscoped_templates_may_leave_scope_out() {
        for good in [
            "sum by (namespace) (rate(http_requests_total[WINDOW]))",
            "sum by (namespace) (rate(http_requests_total{code=~\"5..\"}[WINDOW]))",
            "count by (node) (kube_pod_info)",
            "sum by (namespace) (rate(http_requests_total{SCOPE}[WINDOW]))",
            "sum(rate(a{SCOPE}[WINDOW])) by (namespace) / sum(rate(b[WINDOW])) by (namespace)",
            "vector(1)",
        ] {
            assert_eq!(validate_unscoped_template(good), Ok(()), "{good}");
        }
        for (bad, at, reason) in [
            (
                "x{namespace=SCOPE}",
                12,
                "SCOPE must be an element of a label-matcher block, like {SCOPE} or {code=\"500\",SCOPE}",
            ),
            (
                "x + SCOPE",
                4,
                "SCOPE must be an element of a label-matcher block, like {SCOPE} or {code=\"500\",SCOPE}",
            ),
            ("rate(x[5m]) offset WINDOW", 19, "WINDOW must be a range, like [WINDOW] or [WINDOW:1m]"),
            ("sum(rate(x[WINDOW])", 19, "unbalanced brackets"),
            ("x{a=\"b}", 4, "unterminated string"),
        ] {
            assert_eq!(
                validate_unscoped_template(bad),
                Err(Error::Template { at, reason: reason.to_owned() }),
                "{bad}"
            );
        }
        // The scoped check still refuses what the unscoped one lets through.
        assert_eq!(
            validate_template("sum by (namespace) (rate(http_requests_total[WINDOW]))")
                .unwrap_err()
                .to_string(),
            "PromQL template, at byte 25: metric http_requests_total has no {SCOPE} matchers and would read every namespace"
        );
    }

    #[test]
    fn templates_without_scope_render_only_without_matchers() {
        let unscoped = "sum by (namespace) (rate(http_requests_total[WINDOW]))";
        assert_eq!(
            render(unscoped, &[], FIVE_MINUTES).unwrap(),
            "sum by (namespace) (rate(http_requests_total[5m]))"
        );
        assert_eq!(render("x{SCOPE} / y", &[], FIVE_MINUTES).unwrap(), "x{} / y");
        // With matchers, a selector without SCOPE would escape them.
        let scope = [Matcher::eq("namespace", "shop").unwrap()];
        assert_eq!(
            render(unscoped, &scope, FIVE_MINUTES).unwrap_err().to_string(),
            "PromQL template, at byte 25: metric http_requests_total has no {SCOPE} matchers and would read every namespace"
        );
        assert_eq!(
            render("x{SCOPE} / y", &scope, FIVE_MINUTES).unwrap_err().to_string(),
            "PromQL template, at byte 11: metric y has no {SCOPE} matchers and would read every namespace"
        );
    }
}
