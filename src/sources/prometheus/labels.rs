//! A static check that a PromQL template's result keeps a label ([`keeps_label`]), so a
//! declared kind whose query drops its `nameLabel` (or `namespace`) is rejected when the file
//! is loaded instead of serving nothing. A recursive-descent reading of PromQL over the
//! template language's tokens, just deep enough to follow one label through aggregations,
//! functions and binary operators.

use super::template::{KEYWORDS, Token, TokenKind, tokenize};

/// Aggregation operators, each followed by its arguments and an optional grouping.
const AGGREGATIONS: [&str; 14] = [
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "quantile",
    "topk",
    "bottomk",
    "limitk",
    "limit_ratio",
];

/// Aggregations that select series rather than merge them: their result keeps every label,
/// whatever their grouping (which only scopes the selection).
const SELECTING_AGGREGATIONS: [&str; 4] = ["topk", "bottomk", "limitk", "limit_ratio"];

/// Functions whose effect on labels depends on their string arguments: assumed to keep it.
const OPAQUE_FUNCTIONS: [&str; 4] = ["label_replace", "label_join", "absent", "absent_over_time"];

/// Functions that return a scalar.
const SCALAR_FUNCTIONS: [&str; 3] = ["scalar", "time", "pi"];

/// Checks statically that the result of `template` keeps the label `label`, so that every
/// series it returns can carry it. Rejected, with the reason: an aggregation that drops it
/// (`by` without it, `without` with it, or no grouping; `topk`, `bottomk`, `limitk` and
/// `limit_ratio` keep every label), `histogram_quantile` for `le`, `vector(…)` and other
/// results without labels, a scalar result, and vector matching that drops it (`on` without
/// it, `ignoring` with it, or one side without it). Functions such as `label_replace` are not
/// analysed and are assumed to keep it, as is anything this check cannot parse (Prometheus
/// reports invalid PromQL at query time). Keywords are case-insensitive, as in PromQL.
///
/// The error reads `drops the label "pod" (sum by (namespace) keeps only namespace)`.
pub fn keeps_label(template: &str, label: &str) -> std::result::Result<(), LabelCheckError> {
    let tokens = tokenize(template)?;
    let mut parser = LabelParser { template, tokens, pos: 0, label };
    let reason = match parser.expression(1) {
        Ok(_) if parser.pos < parser.tokens.len() => return Ok(()),
        Ok(Value::Vector(Ok(()))) | Err(Unparsed) => return Ok(()),
        Ok(Value::Vector(Err(reason)) | Value::Scalar(reason)) => reason,
    };
    Err(LabelCheckError::Dropped { label: label.to_owned(), reason })
}

/// Why [`keeps_label`] rejected a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelCheckError {
    /// The template does not tokenize.
    #[error(transparent)]
    Template(#[from] super::Error),
    /// The result loses the label; `reason` names the operation (`sum by (namespace) keeps
    /// only namespace`).
    #[error("drops the label {} ({reason})", k8s_wire::status::go_quote(.label))]
    Dropped {
        /// The label.
        label: String,
        /// Which part of the expression drops it.
        reason: String,
    },
}

/// What an expression evaluates to, as far as one label is concerned.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Value {
    /// A scalar or a string (no labels): why.
    Scalar(String),
    /// An instant or range vector that keeps the label, or why its series lack it.
    Vector(std::result::Result<(), String>),
}

/// The expression is outside what [`LabelParser`] understands.
#[derive(Debug)]
struct Unparsed;

/// How a binary operator matches its vector operands.
#[derive(Debug, Default)]
struct Matching {
    /// `on (…)` (true) or `ignoring (…)` (false), with its labels.
    on: Option<(bool, Vec<String>)>,
    /// `group_left (…)` (true) or `group_right (…)` (false), with its labels.
    group: Option<(bool, Vec<String>)>,
}

/// A grouping clause: `by (…)` (true) or `without (…)` (false), with its labels.
type Grouping = (bool, Vec<String>);

/// A recursive-descent reading of PromQL over the template's tokens, just deep enough to follow
/// one label through aggregations, functions and binary operators.
struct LabelParser<'a> {
    template: &'a str,
    tokens: Vec<Token>,
    pos: usize,
    label: &'a str,
}

impl LabelParser<'_> {
    fn peek_at(&self, offset: usize) -> Option<&Token> {
        self.tokens.get(self.pos + offset)
    }

    fn text(&self, token: &Token) -> &str {
        self.template.get(token.start..token.end).unwrap_or_default()
    }

    /// The punctuation `offset` tokens ahead.
    fn punct_at(&self, offset: usize) -> Option<u8> {
        match self.peek_at(offset) {
            Some(Token { kind: TokenKind::Punct(p), .. }) => Some(*p),
            _ => None,
        }
    }

    /// The lower-cased identifier `offset` tokens ahead.
    fn keyword_at(&self, offset: usize) -> Option<String> {
        match self.peek_at(offset) {
            Some(t @ Token { kind: TokenKind::Ident, .. }) => Some(self.text(t).to_ascii_lowercase()),
            _ => None,
        }
    }

    fn expect(&mut self, punct: u8) -> std::result::Result<(), Unparsed> {
        if self.punct_at(0) != Some(punct) {
            return Err(Unparsed);
        }
        self.pos += 1;
        Ok(())
    }

    /// The binary operator at the cursor: its text, precedence and length in tokens.
    fn binary_operator(&self) -> Option<(String, u8, usize)> {
        let adjacent = match (self.peek_at(0), self.peek_at(1)) {
            (Some(a), Some(b)) => a.end == b.start,
            _ => false,
        };
        let second_is_eq = adjacent && self.punct_at(1) == Some(b'=');
        let (text, len) = match (self.punct_at(0), self.keyword_at(0)) {
            (Some(b'=' | b'!' | b'<' | b'>'), _) if second_is_eq => {
                (format!("{}=", char::from(self.punct_at(0)?)), 2)
            }
            (Some(p @ (b'<' | b'>' | b'+' | b'-' | b'*' | b'/' | b'%' | b'^')), _) => {
                (char::from(p).to_string(), 1)
            }
            (_, Some(word)) if matches!(word.as_str(), "and" | "or" | "unless" | "atan2") => (word, 1),
            _ => return None,
        };
        let precedence = match text.as_str() {
            "or" => 1,
            "and" | "unless" => 2,
            "==" | "!=" | "<=" | ">=" | "<" | ">" => 3,
            "+" | "-" => 4,
            "^" => 6,
            _ => 5,
        };
        Some((text, precedence, len))
    }

    /// Binary operations whose operators bind at least as tightly as `min`.
    fn expression(&mut self, min: u8) -> std::result::Result<Value, Unparsed> {
        let mut lhs = self.unary()?;
        while let Some((op, precedence, len)) = self.binary_operator() {
            if precedence < min {
                break;
            }
            self.pos += len;
            let matching = self.matching()?;
            // `^` is right-associative, every other operator left-associative.
            let rhs = self.expression(if op == "^" { precedence } else { precedence + 1 })?;
            lhs = self.combine(&op, lhs, rhs, &matching);
        }
        Ok(lhs)
    }

    /// `bool`, `on`/`ignoring (…)` and `group_left`/`group_right [(…)]` after an operator.
    fn matching(&mut self) -> std::result::Result<Matching, Unparsed> {
        let mut matching = Matching::default();
        if self.keyword_at(0).as_deref() == Some("bool") {
            self.pos += 1;
        }
        if let Some(on @ ("on" | "ignoring")) = self.keyword_at(0).as_deref() {
            let on = on == "on";
            self.pos += 1;
            matching.on = Some((on, self.label_list()?));
        }
        if let Some(side @ ("group_left" | "group_right")) = self.keyword_at(0).as_deref() {
            let left = side == "group_left";
            self.pos += 1;
            let include = if self.punct_at(0) == Some(b'(') { self.label_list()? } else { Vec::new() };
            matching.group = Some((left, include));
        }
        Ok(matching)
    }

    /// What a binary operation keeps of the label (Prometheus' `resultMetric`).
    fn combine(&self, op: &str, lhs: Value, rhs: Value, matching: &Matching) -> Value {
        let (l, r) = match (lhs, rhs) {
            (Value::Scalar(reason), Value::Scalar(_)) => return Value::Scalar(reason),
            (Value::Vector(side), Value::Scalar(_)) | (Value::Scalar(_), Value::Vector(side)) => {
                return Value::Vector(side);
            }
            (Value::Vector(l), Value::Vector(r)) => (l, r),
        };
        let has = |labels: &[String]| labels.iter().any(|l| l == self.label);
        Value::Vector(match (op, &matching.group, &matching.on) {
            // Set operators return the left side's series, `or` the right side's too.
            ("and" | "unless", _, _) => l,
            ("or", _, _) => match (l, r) {
                (Err(reason), Err(_)) => Err(reason),
                _ => Ok(()),
            },
            // Many-to-one: the "many" side's labels, plus the listed ones from the other side.
            (_, Some((true, include)), _) => {
                if has(include) {
                    r
                } else {
                    l
                }
            }
            (_, Some((false, include)), _) => {
                if has(include) {
                    l
                } else {
                    r
                }
            }
            // One-to-one: the matched labels (`on`) or all but the ignored ones.
            (_, None, Some((true, labels))) if !has(labels) => {
                Err(format!("on ({}) {}", labels.join(", "), keeps_only(labels)))
            }
            (_, None, Some((false, labels))) if has(labels) => {
                Err(format!("ignoring ({}) removes it", labels.join(", ")))
            }
            // Otherwise both sides must carry it to match at all.
            _ => l.and(r),
        })
    }

    /// A unary `-`/`+`, then a primary expression with its modifiers.
    fn unary(&mut self) -> std::result::Result<Value, Unparsed> {
        if matches!(self.punct_at(0), Some(b'-' | b'+')) {
            self.pos += 1;
            return self.unary();
        }
        let value = self.primary()?;
        self.modifiers()?;
        Ok(value)
    }

    /// Ranges and subqueries (`[…]`), `offset` and `@` after a primary expression.
    fn modifiers(&mut self) -> std::result::Result<(), Unparsed> {
        loop {
            if self.punct_at(0) == Some(b'[') {
                self.skip_block(b'[', b']')?;
            } else if self.keyword_at(0).as_deref() == Some("offset") {
                self.pos += 1;
                if matches!(self.punct_at(0), Some(b'-' | b'+')) {
                    self.pos += 1;
                }
                match self.peek_at(0) {
                    Some(Token { kind: TokenKind::Number, .. }) => self.pos += 1,
                    _ => return Err(Unparsed),
                }
            } else if self.punct_at(0) == Some(b'@') {
                self.pos += 1;
                if matches!(self.punct_at(0), Some(b'-' | b'+')) {
                    self.pos += 1;
                }
                match self.peek_at(0).map(|t| t.kind) {
                    Some(TokenKind::Number) => self.pos += 1,
                    Some(TokenKind::Ident) => {
                        self.pos += 1;
                        self.expect(b'(')?;
                        self.expect(b')')?;
                    }
                    _ => return Err(Unparsed),
                }
            } else {
                return Ok(());
            }
        }
    }

    /// Skips a bracketed block (matchers, a range) whose opening bracket is at the cursor.
    fn skip_block(&mut self, open: u8, close: u8) -> std::result::Result<(), Unparsed> {
        let mut depth = 0usize;
        while let Some(token) = self.peek_at(0).copied() {
            self.pos += 1;
            match token.kind {
                TokenKind::Punct(p) if p == open => depth += 1,
                TokenKind::Punct(p) if p == close => {
                    depth = depth.saturating_sub(1);
                    if depth == 0 {
                        return Ok(());
                    }
                }
                _ => {}
            }
        }
        Err(Unparsed)
    }

    fn primary(&mut self) -> std::result::Result<Value, Unparsed> {
        let token = *self.peek_at(0).ok_or(Unparsed)?;
        match token.kind {
            TokenKind::Number => {
                self.pos += 1;
                Ok(Value::Scalar("a number has no labels".to_owned()))
            }
            TokenKind::Str => {
                self.pos += 1;
                Ok(Value::Scalar("a string has no labels".to_owned()))
            }
            TokenKind::Punct(b'(') => {
                self.pos += 1;
                let value = self.expression(1)?;
                self.expect(b')')?;
                Ok(value)
            }
            TokenKind::Punct(b'{') => {
                self.skip_block(b'{', b'}')?;
                Ok(Value::Vector(Ok(())))
            }
            TokenKind::Ident => {
                let name = self.text(&token).to_owned();
                let lower = name.to_ascii_lowercase();
                let next = self.punct_at(1);
                let grouping_next = matches!(self.keyword_at(1).as_deref(), Some("by" | "without"));
                self.pos += 1;
                if AGGREGATIONS.contains(&lower.as_str()) && (next == Some(b'(') || grouping_next) {
                    self.aggregation(&lower)
                } else if next == Some(b'(') {
                    self.function(&name)
                } else if matches!(lower.as_str(), "inf" | "nan") {
                    Ok(Value::Scalar("a number has no labels".to_owned()))
                } else if KEYWORDS.contains(&lower.as_str()) {
                    Err(Unparsed)
                } else {
                    if next == Some(b'{') {
                        self.skip_block(b'{', b'}')?;
                    }
                    Ok(Value::Vector(Ok(())))
                }
            }
            TokenKind::Punct(_) => Err(Unparsed),
        }
    }

    /// Comma-separated expressions up to the closing parenthesis, the opening one already read.
    fn arguments(&mut self) -> std::result::Result<Vec<Value>, Unparsed> {
        let mut values = Vec::new();
        if self.punct_at(0) == Some(b')') {
            self.pos += 1;
            return Ok(values);
        }
        loop {
            values.push(self.expression(1)?);
            match self.punct_at(0) {
                Some(b',') => self.pos += 1,
                Some(b')') => {
                    self.pos += 1;
                    return Ok(values);
                }
                _ => return Err(Unparsed),
            }
        }
    }

    /// `(label, …)` (names or quoted names), with an optional trailing comma.
    fn label_list(&mut self) -> std::result::Result<Vec<String>, Unparsed> {
        self.expect(b'(')?;
        let mut labels = Vec::new();
        loop {
            let token = *self.peek_at(0).ok_or(Unparsed)?;
            self.pos += 1;
            match token.kind {
                TokenKind::Punct(b')') => return Ok(labels),
                TokenKind::Punct(b',') if !labels.is_empty() => {}
                TokenKind::Ident => labels.push(self.text(&token).to_owned()),
                TokenKind::Str => labels.push(unquote(self.text(&token))),
                _ => return Err(Unparsed),
            }
        }
    }

    /// An optional `by (…)` / `without (…)` clause.
    fn grouping(&mut self) -> std::result::Result<Option<Grouping>, Unparsed> {
        match self.keyword_at(0).as_deref() {
            Some(word @ ("by" | "without")) => {
                let by = word == "by";
                self.pos += 1;
                Ok(Some((by, self.label_list()?)))
            }
            _ => Ok(None),
        }
    }

    /// An aggregation, its name already read: grouping before or after the arguments.
    fn aggregation(&mut self, op: &str) -> std::result::Result<Value, Unparsed> {
        let mut grouping = self.grouping()?;
        self.expect(b'(')?;
        // `count_values("label", v)` writes the label named by its first argument.
        let written = match (self.peek_at(0), self.punct_at(1)) {
            (Some(t @ Token { kind: TokenKind::Str, .. }), Some(b',')) if op == "count_values" => {
                Some(unquote(self.text(t)))
            }
            _ => None,
        };
        let arguments = self.arguments()?;
        if grouping.is_none() {
            grouping = self.grouping()?;
        }
        let inner = match arguments.into_iter().last() {
            Some(Value::Vector(inner)) => inner,
            Some(Value::Scalar(reason)) => Err(reason),
            None => return Err(Unparsed),
        };
        if SELECTING_AGGREGATIONS.contains(&op) || written.as_deref() == Some(self.label) {
            return Ok(Value::Vector(inner));
        }
        // A label the argument already lacks: report where it went first.
        if inner.is_err() {
            return Ok(Value::Vector(inner));
        }
        Ok(Value::Vector(match grouping {
            None => Err(format!("{op} with no grouping keeps no labels")),
            Some((true, labels)) if !labels.iter().any(|l| l == self.label) => {
                Err(format!("{op} by ({}) {}", labels.join(", "), keeps_only(&labels)))
            }
            Some((false, labels)) if labels.iter().any(|l| l == self.label) => {
                Err(format!("{op} without ({}) removes it", labels.join(", ")))
            }
            Some(_) => inner,
        }))
    }

    /// A function call, its name already read.
    fn function(&mut self, name: &str) -> std::result::Result<Value, Unparsed> {
        self.expect(b'(')?;
        let arguments = self.arguments()?;
        let shown = if arguments.is_empty() { format!("{name}()") } else { format!("{name}(...)") };
        if OPAQUE_FUNCTIONS.contains(&name) {
            return Ok(Value::Vector(Ok(())));
        }
        if SCALAR_FUNCTIONS.contains(&name) {
            return Ok(Value::Scalar(format!("{shown} has no labels")));
        }
        if name == "vector" {
            return Ok(Value::Vector(Err(format!("{shown} has no labels"))));
        }
        if name == "histogram_quantile" && self.label == "le" {
            return Ok(Value::Vector(Err("histogram_quantile removes le".to_owned())));
        }
        // Other functions keep the labels of their vector argument (`rate`, `clamp_min`,
        // `histogram_quantile` but for `le`, ...); without one they return a bare vector.
        let vector = arguments.into_iter().find_map(|a| match a {
            Value::Vector(v) => Some(v),
            Value::Scalar(_) => None,
        });
        Ok(Value::Vector(vector.unwrap_or_else(|| Err(format!("{shown} has no labels")))))
    }
}

/// What a `by`/`on` list keeps, as a message says it.
fn keeps_only(labels: &[String]) -> String {
    if labels.is_empty() { "keeps no labels".to_owned() } else { format!("keeps only {}", labels.join(", ")) }
}

/// The content of a quoted string token (escapes are not expected in label names).
fn unquote(text: &str) -> String {
    text.get(1..text.len().saturating_sub(1)).unwrap_or_default().to_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::prometheus::template::tests::{ERRORS, REQUESTS};

    #[test]
    fn keeps_label_follows_aggregations() {
        let drops = |label: &str, why: &str| Err(format!("drops the label {label:?} ({why})"));
        let cases: &[(&str, &str, std::result::Result<(), String>)] = &[
            // The built-in kinds' defaults.
            (REQUESTS, "pod", Ok(())),
            (REQUESTS, "namespace", Ok(())),
            (ERRORS, "pod", Ok(())),
            ("sum by (namespace, cafe, type) (increase(cafe_brews_total{SCOPE}[WINDOW]))", "type", Ok(())),
            (
                "histogram_quantile(0.5, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
                "cafe",
                Ok(()),
            ),
            (
                "histogram_quantile(0.5, sum by (namespace, cafe, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
                "le",
                drops("le", "histogram_quantile removes le"),
            ),
            (
                "histogram_quantile(0.95, sum by (namespace, le) (rate(cafe_brew_duration_seconds_bucket{SCOPE}[WINDOW])))",
                "cafe",
                drops("cafe", "sum by (namespace, le) keeps only namespace, le"),
            ),
            ("max by (namespace, cafe) (cafe_temperature_celsius{SCOPE})", "cafe", Ok(())),
            (
                "max by (namespace, cafe) (cafe_temperature_celsius{SCOPE})",
                "type",
                drops("type", "max by (namespace, cafe) keeps only namespace, cafe"),
            ),
            // No aggregation: every label of the series stays.
            ("rate(http_requests_total{SCOPE}[WINDOW])", "pod", Ok(())),
            ("irate(http_requests_total{code=~\"5..\",SCOPE}[WINDOW])", "code", Ok(())),
            ("cafe_temperature_celsius{SCOPE}", "anything", Ok(())),
            ("{__name__=\"up\",SCOPE}", "job", Ok(())),
            ("x{SCOPE} offset 5m", "pod", Ok(())),
            ("x{SCOPE} offset -5m @ 1700000000", "pod", Ok(())),
            ("x{SCOPE} @ start()", "pod", Ok(())),
            ("max_over_time(rate(x{SCOPE}[1m])[WINDOW:30s])", "pod", Ok(())),
            ("-x{SCOPE}", "pod", Ok(())),
            ("clamp_min(rate(x{SCOPE}[WINDOW]), 0)", "pod", Ok(())),
            ("round(x{SCOPE}, 0.1)", "pod", Ok(())),
            ("sort_desc(x{SCOPE})", "pod", Ok(())),
            // Grouping.
            ("sum by (namespace, pod) (rate(x{SCOPE}[WINDOW]))", "pod", Ok(())),
            (
                "sum by (namespace) (rate(x{SCOPE}[WINDOW]))",
                "pod",
                drops("pod", "sum by (namespace) keeps only namespace"),
            ),
            ("sum by () (x{SCOPE})", "pod", drops("pod", "sum by () keeps no labels")),
            ("sum without (instance) (rate(x{SCOPE}[WINDOW]))", "pod", Ok(())),
            (
                "sum without (instance, pod) (rate(x{SCOPE}[WINDOW]))",
                "pod",
                drops("pod", "sum without (instance, pod) removes it"),
            ),
            ("sum by (pod,) (x{SCOPE})", "pod", Ok(())),
            ("sum by (\"pod\") (x{SCOPE})", "pod", Ok(())),
            ("max(x{SCOPE}) by (pod)", "pod", Ok(())),
            ("max(x{SCOPE}) by (pod)", "namespace", drops("namespace", "max by (pod) keeps only pod")),
            (
                "sum(rate(x{SCOPE}[WINDOW])) without (pod)",
                "pod",
                drops("pod", "sum without (pod) removes it"),
            ),
            ("count(x{SCOPE})", "pod", drops("pod", "count with no grouping keeps no labels")),
            ("avg(x{SCOPE})", "namespace", drops("namespace", "avg with no grouping keeps no labels")),
            ("group(x{SCOPE}) by (pod)", "pod", Ok(())),
            ("stddev by (job) (x{SCOPE})", "pod", drops("pod", "stddev by (job) keeps only job")),
            ("stdvar without (pod) (x{SCOPE})", "pod", drops("pod", "stdvar without (pod) removes it")),
            ("min by (pod) (x{SCOPE})", "pod", Ok(())),
            ("quantile by (namespace, pod) (0.9, x{SCOPE})", "pod", Ok(())),
            (
                "quantile(0.9, x{SCOPE}) by (namespace)",
                "pod",
                drops("pod", "quantile by (namespace) keeps only namespace"),
            ),
            ("count_values by (namespace) (\"version\", build_info{SCOPE})", "version", Ok(())),
            (
                "count_values by (namespace) (\"version\", build_info{SCOPE})",
                "pod",
                drops("pod", "count_values by (namespace) keeps only namespace"),
            ),
            // Keywords are case-insensitive.
            ("SUM BY (namespace) (x{SCOPE})", "pod", drops("pod", "sum by (namespace) keeps only namespace")),
            ("Sum(x{SCOPE}) By (pod)", "pod", Ok(())),
            ("SUM WITHOUT (pod) (x{SCOPE})", "pod", drops("pod", "sum without (pod) removes it")),
            // Selecting aggregations keep every label.
            ("topk(3, rate(x{SCOPE}[WINDOW]))", "pod", Ok(())),
            ("topk by (namespace) (3, rate(x{SCOPE}[WINDOW]))", "pod", Ok(())),
            ("bottomk(1, x{SCOPE}) by (namespace)", "pod", Ok(())),
            ("limitk(5, x{SCOPE})", "pod", Ok(())),
            ("limit_ratio(0.5, x{SCOPE})", "pod", Ok(())),
            (
                "topk(3, sum by (namespace) (x{SCOPE}))",
                "pod",
                drops("pod", "sum by (namespace) keeps only namespace"),
            ),
            // Nested aggregations: an inner one that drops it is reported.
            (
                "sum by (namespace, pod) (max by (namespace) (x{SCOPE}))",
                "pod",
                drops("pod", "max by (namespace) keeps only namespace"),
            ),
            (
                "max by (pod) (sum without (pod) (x{SCOPE}))",
                "pod",
                drops("pod", "sum without (pod) removes it"),
            ),
            (
                "max by (namespace) (sum by (namespace, pod) (x{SCOPE}))",
                "pod",
                drops("pod", "max by (namespace) keeps only namespace"),
            ),
            (
                "avg by (namespace, pod) (sum by (namespace, pod, code) (rate(x{SCOPE}[WINDOW])))",
                "pod",
                Ok(()),
            ),
            // Functions that cannot be analysed are accepted.
            (
                "label_replace(sum by (namespace) (x{SCOPE}), \"pod\", \"$1\", \"namespace\", \"(.*)\")",
                "pod",
                Ok(()),
            ),
            ("label_join(x{SCOPE}, \"pod\", \"-\", \"a\", \"b\")", "pod", Ok(())),
            ("absent(x{SCOPE,pod=\"a\"})", "pod", Ok(())),
            // Scalars and bare vectors have no labels.
            ("vector(1)", "pod", drops("pod", "vector(...) has no labels")),
            ("vector(scalar(x{SCOPE}))", "namespace", drops("namespace", "vector(...) has no labels")),
            ("42", "pod", drops("pod", "a number has no labels")),
            ("(1 + 2) * 3", "pod", drops("pod", "a number has no labels")),
            ("NaN", "pod", drops("pod", "a number has no labels")),
            ("scalar(sum(x{SCOPE}))", "pod", drops("pod", "scalar(...) has no labels")),
            ("time() - 5", "pod", drops("pod", "time() has no labels")),
            ("hour()", "pod", drops("pod", "hour() has no labels")),
            ("\"text\"", "pod", drops("pod", "a string has no labels")),
            // Binary operators keep the labels of their vector sides.
            ("time() - max by (namespace, cafe) (cafe_last_brew_timestamp_seconds{SCOPE})", "cafe", Ok(())),
            ("sum(increase(cafe_brews_total{SCOPE}[WINDOW])) by (cafe, type) * 60", "type", Ok(())),
            (
                "sum(increase(cafe_brews_total{SCOPE}[WINDOW])) by (cafe, type) * 60",
                "namespace",
                drops("namespace", "sum by (cafe, type) keeps only cafe, type"),
            ),
            (
                "sum by (namespace, pod) (rate(x{SCOPE}[WINDOW])) / scalar(sum(rate(x{SCOPE}[WINDOW])))",
                "pod",
                Ok(()),
            ),
            (
                "sum by (namespace, pod) (rate(e{SCOPE}[WINDOW])) / sum by (namespace, pod) (rate(t{SCOPE}[WINDOW]))",
                "pod",
                Ok(()),
            ),
            (
                "sum by (namespace, pod) (a{SCOPE}) / sum by (namespace) (b{SCOPE})",
                "pod",
                drops("pod", "sum by (namespace) keeps only namespace"),
            ),
            (
                "sum by (namespace, pod) (a{SCOPE}) / on (namespace) group_left sum by (namespace) (b{SCOPE})",
                "pod",
                Ok(()),
            ),
            (
                "sum by (namespace) (b{SCOPE}) * on (namespace) group_right sum by (namespace, pod) (a{SCOPE})",
                "pod",
                Ok(()),
            ),
            (
                "a{SCOPE} * on (namespace) group_left (owner) sum by (namespace) (b{SCOPE})",
                "owner",
                drops("owner", "sum by (namespace) keeps only namespace"),
            ),
            ("a{SCOPE} * on (namespace) group_left (owner) b{SCOPE}", "owner", Ok(())),
            ("a{SCOPE} / on (namespace, pod) b{SCOPE}", "pod", Ok(())),
            ("a{SCOPE} / on (pod) b{SCOPE}", "namespace", drops("namespace", "on (pod) keeps only pod")),
            ("a{SCOPE} / ignoring (code) b{SCOPE}", "pod", Ok(())),
            ("a{SCOPE} / ignoring (code) b{SCOPE}", "code", drops("code", "ignoring (code) removes it")),
            ("a{SCOPE} > bool 0", "pod", Ok(())),
            ("a{SCOPE} >= 0.5 and b{SCOPE} != 0", "pod", Ok(())),
            ("a{SCOPE} unless sum(b{SCOPE})", "pod", Ok(())),
            ("sum by (pod) (x{SCOPE}) OR vector(0)", "pod", Ok(())),
            ("vector(0) or sum by (namespace, pod) (x{SCOPE})", "pod", Ok(())),
            ("sum(x{SCOPE}) or vector(0)", "pod", drops("pod", "sum with no grouping keeps no labels")),
            ("2 ^ a{SCOPE} ^ 2", "pod", Ok(())),
            ("a{SCOPE} atan2 b{SCOPE}", "pod", Ok(())),
            (
                "1 - sum by (namespace) (a{SCOPE}) / sum by (namespace, pod) (b{SCOPE})",
                "pod",
                drops("pod", "sum by (namespace) keeps only namespace"),
            ),
            ("sum by (namespace, pod) (rate(a{SCOPE}[WINDOW])) # sum(x)\n", "pod", Ok(())),
        ];
        for (template, label, expected) in cases {
            assert_eq!(
                &keeps_label(template, label).map_err(|e| e.to_string()),
                expected,
                "{template} keeps {label}?"
            );
        }
    }

    #[test]
    fn keeps_label_accepts_what_it_cannot_parse() {
        for template in ["sum by (namespace) (x{SCOPE}) +", "x{SCOPE} y{SCOPE}", "sum()", "by (pod)"] {
            assert_eq!(keeps_label(template, "pod"), Ok(()), "{template}");
        }
        assert_eq!(
            keeps_label("x{a=\"b}", "pod").map_err(|e| e.to_string()),
            Err("PromQL template, at byte 4: unterminated string".to_owned())
        );
    }
}
