//! The PromQL template language: configured queries in which two placeholders are replaced,
//! and the escaping of everything a client sends into them.
//!
//! No PromQL is built from unescaped input (docs/design.md, "Data flow"). A query is a configured template in
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
//! A [`Template`] is analysed once, when the configuration is read, and held by the
//! configuration; rendering it only splices. [`Template::check_scoped`] (at configuration load)
//! also checks that every vector selector of the template carries `SCOPE`: a selector without
//! it would read every namespace. [`Template::check`] is the same check for queries that are
//! never scoped (a cluster-scoped declared kind), where `SCOPE` may be left out.
//! [`keeps_label`](super::keeps_label) tells, statically, whether a query's result keeps a
//! label that aggregations could drop.

use std::fmt;
use std::time::Duration;

use promql_parser::parser::{Expr, VectorSelector};

use super::{Error, Result};

/// Placeholder for the request's matchers.
pub(crate) const SCOPE_PLACEHOLDER: &str = "SCOPE";

/// Placeholder for the rate window.
pub(super) const WINDOW_PLACEHOLDER: &str = "WINDOW";

// ---------------------------------------------------------------------------------------------
// Escaping and matchers
// ---------------------------------------------------------------------------------------------

/// Escapes a value for a PromQL double-quoted string (without the quotes): `\` and `"` are
/// backslash-escaped, newline, carriage return and tab become `\n`, `\r`, `\t`, and other
/// control characters `\u00XX`, as Go's string unquoting reads them.
pub(super) fn escape_label_value(value: &str) -> String {
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
pub(super) fn escape_regex(value: &str) -> String {
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
pub(crate) fn is_valid_label_name(name: &str) -> bool {
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
pub(super) fn format_duration(window: Duration) -> Result<String> {
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

/// The label of the matcher that stands for `SCOPE` while a template is parsed: no real series
/// carries it, and [`Template::parse`] refuses a template that names it itself.
const SCOPE_SENTINEL_LABEL: &str = "__percolator_scope__";

/// What `SCOPE` becomes while a template is parsed: a matcher that does not match the empty
/// string, so `{SCOPE}` alone is a valid selector as it is once rendered.
const SCOPE_SENTINEL: &str = "__percolator_scope__=\"scope\"";

/// What `WINDOW` becomes while a template is parsed (any valid duration).
const WINDOW_SENTINEL: &str = "5m";

/// A PromQL template compiled: its text as configured and its analysis, done once when the
/// template is read (the configuration file's loading, or [`Template::parse`]): where its
/// placeholders stand, the first vector selector without `SCOPE`, and its PromQL with the
/// placeholders replaced by sentinels (`SCOPE` by a matcher, `WINDOW` by a duration).
/// [`Template::render`] only splices. A template that does not analyse keeps its error: the
/// configuration's check reports it with the field's name ([`Template::check`]), and
/// rendering it returns it.
///
/// It reads from a string (`serde`, `From`); it compares, prints (`Debug`, `Display`) and
/// reports errors by its text.
#[derive(Clone)]
pub struct Template {
    text: String,
    analysis: Result<Analysis>,
}

/// What [`Template`] keeps of its analysis.
#[derive(Clone)]
struct Analysis {
    placeholders: Vec<Found>,
    /// The first vector selector without `SCOPE` (as PromQL), if any.
    unscoped_selector: Option<String>,
    expr: Expr,
}

impl Template {
    /// Analyses `text` once: `SCOPE` must appear only as an element of a label-matcher block and
    /// `WINDOW` only as a range (`[WINDOW]`, `[WINDOW:…]`), and the whole must be valid PromQL.
    /// Selectors need not carry `SCOPE` (see [`Template::check_scoped`]). An invalid template is
    /// kept with its error ([`Template::check`]).
    pub fn new(text: impl Into<String>) -> Self {
        let text = text.into();
        let analysis = analyse(&text);
        Self { text, analysis }
    }

    /// [`Template::new`], failing when the template is invalid.
    pub fn parse(text: &str) -> Result<Self> {
        let template = Self::new(text);
        template.check()?;
        Ok(template)
    }

    /// Analyses a template whose every vector selector must carry `SCOPE` (at least one does):
    /// a selector without it would read every namespace.
    pub fn scoped(text: &str) -> Result<Self> {
        let template = Self::new(text);
        template.check_scoped()?;
        Ok(template)
    }

    /// The template as configured.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// Whether the template is valid: its placeholders in place, and valid PromQL. Selectors
    /// need not carry `SCOPE` (a cluster-scoped kind's query is never scoped).
    pub fn check(&self) -> Result<()> {
        self.analysis().map(|_| ())
    }

    /// Whether the template is valid and every selector carries `SCOPE`, at least one doing so.
    pub fn check_scoped(&self) -> Result<()> {
        let analysis = self.analysis()?;
        if let Some(selector) = &analysis.unscoped_selector {
            return Err(Error::Unscoped(selector.clone()));
        }
        if !analysis.placeholders.iter().any(|p| p.kind == Placeholder::Scope) {
            return Err(Error::Template { at: 0, reason: "no SCOPE placeholder".to_owned() });
        }
        Ok(())
    }

    /// The parsed PromQL, `SCOPE` standing as a matcher on a reserved label and `WINDOW` as
    /// `5m`.
    pub(super) fn expr(&self) -> Result<&Expr> {
        self.analysis().map(|analysis| &analysis.expr)
    }

    fn analysis(&self) -> Result<&Analysis> {
        self.analysis.as_ref().map_err(Clone::clone)
    }

    /// Renders the template: `SCOPE` becomes the comma-joined matchers (with an adjacent comma
    /// removed when there are none, so `{SCOPE,code="500"}` stays valid), `WINDOW` the window.
    /// With matchers, every selector must carry `SCOPE` (as [`Template::check_scoped`] checks),
    /// so none escapes the scope; without matchers there is nothing to scope. Nothing is
    /// analysed here: the positions were found when the template was read.
    pub fn render(&self, scope: &[Matcher], window: Duration) -> Result<String> {
        let analysis = self.analysis()?;
        if !scope.is_empty() {
            self.check_scoped()?;
        }
        let placeholders = &analysis.placeholders;
        let window_text = if placeholders.iter().any(|p| p.kind == Placeholder::Window) {
            Some(format_duration(window)?)
        } else {
            None
        };
        let scope_text = scope.iter().map(ToString::to_string).collect::<Vec<_>>().join(",");
        let template = self.text.as_str();
        let mut out = String::with_capacity(template.len() + scope_text.len() * placeholders.len());
        let mut copied = 0;
        for found in placeholders {
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
}

/// Templates are equal when their texts are (the analysis follows from the text).
impl PartialEq for Template {
    fn eq(&self, other: &Self) -> bool {
        self.text == other.text
    }
}

impl Eq for Template {}

/// `Template("sum(x{SCOPE})")`: the text, not the syntax tree.
impl fmt::Debug for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Template").field(&self.text).finish()
    }
}

/// The text as configured.
impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text)
    }
}

impl From<String> for Template {
    fn from(text: String) -> Self {
        Self::new(text)
    }
}

impl From<&str> for Template {
    fn from(text: &str) -> Self {
        Self::new(text)
    }
}

/// Reads a string and analyses it; an invalid template is kept with its error, for the
/// configuration's check to report under the field's name.
impl<'de> serde::Deserialize<'de> for Template {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> std::result::Result<Self, D::Error> {
        String::deserialize(deserializer).map(Self::new)
    }
}

#[cfg(test)]
thread_local! {
    /// How many templates this thread analysed (tests count the analyses a render does: none).
    static ANALYSES: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
}

/// How many templates this thread has analysed.
#[cfg(test)]
pub(crate) fn analyses() -> usize {
    ANALYSES.with(std::cell::Cell::get)
}

/// The analysis of [`Template::new`].
fn analyse(text: &str) -> Result<Analysis> {
    #[cfg(test)]
    ANALYSES.with(|n| n.set(n.get() + 1));
    if let Some(at) = text.find(SCOPE_SENTINEL_LABEL) {
        return Err(template_error(at, format!("the label name {SCOPE_SENTINEL_LABEL} is reserved")));
    }
    let placeholders = placeholders(text)?;
    let mut probe = String::with_capacity(text.len() + SCOPE_SENTINEL.len() * placeholders.len());
    let mut copied = 0;
    for found in &placeholders {
        probe.push_str(text.get(copied..found.start).unwrap_or_default());
        probe.push_str(match found.kind {
            Placeholder::Scope => SCOPE_SENTINEL,
            Placeholder::Window => WINDOW_SENTINEL,
        });
        copied = found.end;
    }
    probe.push_str(text.get(copied..).unwrap_or_default());
    let expr = promql_parser::parser::parse(&probe).map_err(Error::InvalidPromql)?;
    let mut selectors = Vec::new();
    collect_selectors(&expr, &mut selectors);
    let unscoped_selector = selectors.iter().find(|s| !is_scoped(s)).map(ToString::to_string);
    Ok(Analysis { placeholders, unscoped_selector, expr })
}

/// Checks a template at configuration load (see [`Template::scoped`]): `SCOPE` appears at
/// least once and only as an element of a label-matcher block, every vector selector carries
/// it, `WINDOW` appears only as a range (`[WINDOW]`, `[WINDOW:…]`), and the template is valid
/// PromQL.
pub fn validate_template(template: &str) -> Result<()> {
    Template::scoped(template).map(|_| ())
}

/// Checks a template that is never scoped (a cluster-scoped kind's query) as
/// [`validate_template`] does, except that selectors need not carry `SCOPE`: where it appears it
/// must still be an element of a label-matcher block, and it renders empty.
pub fn validate_unscoped_template(template: &str) -> Result<()> {
    Template::parse(template).map(|_| ())
}

/// Every vector selector of `expr`, those of range selectors and subqueries included.
fn collect_selectors<'a>(expr: &'a Expr, out: &mut Vec<&'a VectorSelector>) {
    match expr {
        Expr::VectorSelector(selector) => out.push(selector),
        Expr::MatrixSelector(matrix) => out.push(&matrix.vs),
        Expr::Aggregate(aggregate) => {
            if let Some(param) = &aggregate.param {
                collect_selectors(param, out);
            }
            collect_selectors(&aggregate.expr, out);
        }
        Expr::Unary(unary) => collect_selectors(&unary.expr, out),
        Expr::Binary(binary) => {
            collect_selectors(&binary.lhs, out);
            collect_selectors(&binary.rhs, out);
        }
        Expr::Paren(paren) => collect_selectors(&paren.expr, out),
        Expr::Subquery(subquery) => collect_selectors(&subquery.expr, out),
        Expr::Call(call) => call.args.args.iter().for_each(|arg| collect_selectors(arg, out)),
        Expr::Extension(extension) => {
            extension.expr.children().iter().for_each(|e| collect_selectors(e, out))
        }
        Expr::NumberLiteral(_) | Expr::StringLiteral(_) => {}
    }
}

/// Whether a selector carries the `SCOPE` sentinel (in every alternative of an `or` of
/// matchers).
fn is_scoped(selector: &VectorSelector) -> bool {
    let has =
        |matchers: &[promql_parser::label::Matcher]| matchers.iter().any(|m| m.name == SCOPE_SENTINEL_LABEL);
    let matchers = &selector.matchers;
    if matchers.or_matchers.is_empty() {
        has(&matchers.matchers)
    } else {
        matchers.or_matchers.iter().all(|group| has(group))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Placeholder {
    Scope,
    Window,
}

/// A placeholder found in a template, with the commas around it (byte offsets).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Found {
    kind: Placeholder,
    start: usize,
    end: usize,
    comma_before: Option<usize>,
    comma_after: Option<usize>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TokenKind {
    Ident,
    Number,
    Str,
    Punct(u8),
}

#[derive(Debug, Clone, Copy)]
struct Token {
    kind: TokenKind,
    start: usize,
    end: usize,
}

/// What an open bracket started.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Open {
    /// `{`: a label-matcher block.
    Matchers,
    /// `[`: a range or subquery.
    Range,
    /// `(`.
    Paren,
}

fn template_error(at: usize, reason: impl Into<String>) -> Error {
    Error::Template { at, reason: reason.into() }
}

/// Splits a template into the tokens that matter (whitespace and comments dropped).
fn tokenize(template: &str) -> Result<Vec<Token>> {
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

/// Finds the placeholders and checks where they stand: `SCOPE` as an element of a
/// label-matcher block, `WINDOW` as a range; strings, comments and brackets are followed so a
/// placeholder's name inside a string or a longer name is left alone.
fn placeholders(template: &str) -> Result<Vec<Found>> {
    let tokens = tokenize(template)?;
    let text = |t: &Token| template.get(t.start..t.end).unwrap_or_default();
    let punct = |t: Option<&Token>| match t {
        Some(Token { kind: TokenKind::Punct(p), .. }) => Some(*p),
        _ => None,
    };
    let mut stack: Vec<(Open, usize)> = Vec::new();
    let mut found = Vec::new();
    for (index, token) in tokens.iter().enumerate() {
        let prev = index.checked_sub(1).and_then(|i| tokens.get(i));
        let next = tokens.get(index + 1);
        match token.kind {
            TokenKind::Punct(b'{') => stack.push((Open::Matchers, token.start)),
            TokenKind::Punct(b'[') => stack.push((Open::Range, token.start)),
            TokenKind::Punct(b'(') => stack.push((Open::Paren, token.start)),
            TokenKind::Punct(close @ (b'}' | b']' | b')')) => {
                let expected = match close {
                    b'}' => Open::Matchers,
                    b']' => Open::Range,
                    _ => Open::Paren,
                };
                if stack.pop().map(|(open, _)| open) != Some(expected) {
                    return Err(template_error(token.start, "unbalanced brackets"));
                }
            }
            TokenKind::Ident if text(token) == SCOPE_PLACEHOLDER => {
                let in_matchers = matches!(stack.last(), Some((Open::Matchers, _)));
                let before = punct(prev);
                let after = punct(next);
                if !in_matchers || !matches!(before, Some(b'{' | b',')) || !matches!(after, Some(b'}' | b','))
                {
                    return Err(template_error(
                        token.start,
                        "SCOPE must be an element of a label-matcher block, like {SCOPE} or {code=\"500\",SCOPE}",
                    ));
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
                let in_range = matches!(stack.last(), Some((Open::Range, _)));
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
            TokenKind::Ident | TokenKind::Punct(_) | TokenKind::Number | TokenKind::Str => {}
        }
    }
    if let Some((_, at)) = stack.last() {
        return Err(template_error(*at, "unbalanced brackets"));
    }
    Ok(found)
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// Renders `text` as the configuration does: analysed once (here, for this call), then
    /// spliced.
    fn render(text: &str, scope: &[Matcher], window: Duration) -> Result<String> {
        Template::new(text).render(scope, window)
    }

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
            "{SCOPE}",
            "{__name__=\"up\",SCOPE}",
            "rate(x{SCOPE}[WINDOW] @ start() offset 1h)",
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
        for (bad, error) in [
            ("sum(rate(http_requests_total[5m]))", Error::Unscoped("http_requests_total".to_owned())),
            (
                "sum(rate(http_requests_total{code=\"500\"}[5m])) / x{SCOPE}",
                Error::Unscoped("http_requests_total{code=\"500\"}".to_owned()),
            ),
            // Inside a subquery, and in an argument of an aggregation.
            ("max_over_time(rate(x[1m])[WINDOW:30s]) + y{SCOPE}", Error::Unscoped("x".to_owned())),
            ("topk(scalar(k), x{SCOPE})", Error::Unscoped("k".to_owned())),
            ("x{SCOPE} offset 5m / y offset 5m", Error::Unscoped("y offset 5m".to_owned())),
            ("vector(1)", Error::Template { at: 0, reason: "no SCOPE placeholder".to_owned() }),
            (
                "x{SCOPE,__percolator_scope__=\"a\"}",
                Error::Template {
                    at: 8,
                    reason: "the label name __percolator_scope__ is reserved".to_owned(),
                },
            ),
        ] {
            assert_eq!(validate_template(bad), Err(error), "{bad}");
        }
        assert_eq!(
            validate_template("sum(rate(http_requests_total[5m]))").unwrap_err().to_string(),
            "PromQL template: the selector http_requests_total has no {SCOPE} matchers and would read every namespace"
        );
    }

    #[test]
    fn invalid_promql_is_rejected_at_load() {
        for bad in [
            "sum by (namespace) (x{SCOPE}) +",
            "x{SCOPE} y{SCOPE}",
            "sum()",
            "by (pod)",
            "rate(x{SCOPE})",
            "rate(x{SCOPE}[WINDOW])[WINDOW]",
            "x{SCOPE}[WINDOW] + 1",
            "",
        ] {
            let error = validate_unscoped_template(bad).unwrap_err();
            assert!(matches!(error, Error::InvalidPromql(_)), "{bad}: {error}");
            assert!(error.to_string().starts_with("PromQL template is not valid PromQL: "), "{error}");
            assert_eq!(validate_template(bad), Err(error), "{bad}");
        }
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
            ("sum(rate(x[WINDOW])", 3, "unbalanced brackets"),
            ("x{SCOPE}]", 8, "unbalanced brackets"),
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
            validate_template("sum by (namespace) (rate(http_requests_total[WINDOW]))"),
            Err(Error::Unscoped("http_requests_total".to_owned()))
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
            render(unscoped, &scope, FIVE_MINUTES),
            Err(Error::Unscoped("http_requests_total".to_owned()))
        );
        assert_eq!(render("x{SCOPE} / y", &scope, FIVE_MINUTES), Err(Error::Unscoped("y".to_owned())));
    }

    #[test]
    fn a_template_is_analysed_once() {
        let before = analyses();
        let template = Template::scoped(ERRORS).unwrap();
        assert_eq!(analyses(), before + 1);
        assert_eq!(template.text(), ERRORS);
        assert_eq!(template.to_string(), ERRORS);
        assert_eq!(format!("{template:?}"), format!("Template({ERRORS:?})"));
        let scope = [Matcher::eq("namespace", "shop").unwrap()];
        for _ in 0..1000 {
            assert_eq!(
                template.render(&scope, FIVE_MINUTES).unwrap(),
                "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\",namespace=\"shop\"}[5m]))"
            );
        }
        let cloned = template.clone();
        assert_eq!(cloned.render(&[], FIVE_MINUTES).unwrap(), render(ERRORS, &[], FIVE_MINUTES).unwrap());
        // Rendering and checking a compiled template (or its clone) never analyses it again:
        // the one more is the `render` helper's own template.
        template.check_scoped().unwrap();
        assert_eq!(analyses(), before + 2);
        // A template rejected at load keeps its error, and rendering returns it.
        let invalid = Template::new("sum(x{SCOPE}) +");
        assert!(matches!(invalid.check(), Err(Error::InvalidPromql(_))));
        assert_eq!(invalid.render(&[], FIVE_MINUTES), Err(invalid.check().unwrap_err()));
        assert_eq!(invalid.text(), "sum(x{SCOPE}) +");
        assert_eq!(Template::scoped("x"), Err(Error::Unscoped("x".to_owned())));
        assert!(matches!(Template::parse("x{"), Err(Error::Template { .. })));
    }

    #[test]
    fn templates_read_from_strings_and_compare_by_text() {
        let read: Template = serde_json::from_value(serde_json::json!(REQUESTS)).unwrap();
        assert_eq!(read, Template::new(REQUESTS));
        assert_eq!(read, Template::from(REQUESTS.to_owned()));
        assert_ne!(read, Template::new(ERRORS));
        // An invalid template reads too: the configuration's check names its field.
        let invalid: Template = serde_json::from_value(serde_json::json!("sum(rate(x[WINDOW])")).unwrap();
        assert_eq!(invalid.check(), Err(Error::Template { at: 3, reason: "unbalanced brackets".to_owned() }));
        assert_eq!(invalid.text(), "sum(rate(x[WINDOW])");
        assert!(serde_json::from_value::<Template>(serde_json::json!(3)).is_err());
    }

    #[test]
    fn compiled_templates_render_what_analysis_at_each_render_did() {
        // Each case: template, scope, window, and the PromQL the previous path (analysis at
        // every render, then splicing) produced.
        let shop = [Matcher::eq("namespace", "shop").unwrap()];
        let two = [Matcher::eq("namespace", "shop").unwrap(), Matcher::any_of("pod", &["a", "b.c"]).unwrap()];
        let cases: [(&str, &[Matcher], Duration, &str); 8] = [
            (
                REQUESTS,
                &two,
                FIVE_MINUTES,
                "sum by (namespace, pod) (rate(http_requests_total{namespace=\"shop\",pod=~\"a|b\\\\.c\"}[5m]))",
            ),
            (
                ERRORS,
                &[],
                Duration::from_secs(90),
                "sum by (namespace, pod) (rate(http_requests_total{code=~\"5..\"}[1m30s]))",
            ),
            ("x{SCOPE,code=\"5\"}", &[], FIVE_MINUTES, "x{code=\"5\"}"),
            ("x{code=\"5\",SCOPE}", &shop, FIVE_MINUTES, "x{code=\"5\",namespace=\"shop\"}"),
            ("x{SCOPE} / y{SCOPE}", &shop, FIVE_MINUTES, "x{namespace=\"shop\"} / y{namespace=\"shop\"}"),
            (
                "max_over_time(rate(x{SCOPE}[1m])[WINDOW:30s])",
                &shop,
                Duration::from_millis(1500),
                "max_over_time(rate(x{namespace=\"shop\"}[1m])[1s500ms:30s])",
            ),
            (
                "sum by (node) (rate(x[WINDOW]))",
                &[],
                Duration::from_secs(3600),
                "sum by (node) (rate(x[1h]))",
            ),
            ("vector(1)", &[], FIVE_MINUTES, "vector(1)"),
        ];
        for (text, scope, window, expected) in cases {
            let template = Template::new(text);
            assert_eq!(template.render(scope, window).unwrap(), expected, "{text}");
            assert_eq!(template.render(scope, window).unwrap(), expected, "{text}, again");
        }
        // A window Prometheus cannot express is an error of the render, not of the template.
        assert_eq!(
            Template::new(REQUESTS).render(&[], Duration::from_micros(10)),
            Err(Error::InvalidWindow(Duration::from_micros(10)))
        );
    }
}
