//! A static check that a PromQL template's result keeps a label ([`keeps_label`]), so a
//! declared kind whose query drops its `nameLabel` (or `namespace`) is rejected when the file
//! is loaded instead of serving nothing. It follows one label through `promql-parser`'s syntax
//! tree of the template: aggregations, functions and binary operators with vector matching.

use promql_parser::parser::{AggregateExpr, BinaryExpr, Call, Expr, LabelModifier, VectorMatchCardinality};

use super::template::Template;

/// Aggregations that select series rather than merge them: their result keeps every label,
/// whatever their grouping (which only scopes the selection).
const SELECTING_AGGREGATIONS: [&str; 4] = ["topk", "bottomk", "limitk", "limit_ratio"];

/// Functions whose effect on labels depends on their string arguments: assumed to keep it.
const OPAQUE_FUNCTIONS: [&str; 4] = ["label_replace", "label_join", "absent", "absent_over_time"];

/// Checks statically that the result of `template` keeps the label `label`, so that every
/// series it returns can carry it. Rejected, with the reason: an aggregation that drops it
/// (`by` without it, `without` with it, or no grouping; `topk`, `bottomk`, `limitk` and
/// `limit_ratio` keep every label), `histogram_quantile` for `le`, `vector(…)` and other
/// results without labels, a scalar result, and vector matching that drops it (`on` without
/// it, `ignoring` with it, or one side without it). Functions such as `label_replace` are not
/// analysed and are assumed to keep it. A template that is not valid PromQL (or misplaces a
/// placeholder) is rejected with [`LabelCheckError::Template`].
///
/// The error reads `drops the label "pod" (sum by (namespace) keeps only namespace)`.
pub fn keeps_label(template: &str, label: &str) -> std::result::Result<(), LabelCheckError> {
    Template::new(template).keeps_label(label)
}

impl Template {
    /// [`keeps_label`] for a compiled template: its syntax tree, kept since it was read.
    pub fn keeps_label(&self, label: &str) -> std::result::Result<(), LabelCheckError> {
        match value(self.expr()?, label) {
            Value::Vector(Ok(())) => Ok(()),
            Value::Vector(Err(reason)) | Value::Scalar(reason) => {
                Err(LabelCheckError::Dropped { label: label.to_owned(), reason })
            }
        }
    }
}

/// Why [`keeps_label`] rejected a template.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelCheckError {
    /// The template is not valid (a misplaced placeholder, invalid PromQL).
    #[error(transparent)]
    Template(#[from] super::Error),
    /// The result loses the label; `reason` names the operation (`sum by (namespace) keeps
    /// only namespace`).
    #[error("drops the label {} ({reason})", k8s_wire::go_quote(.label))]
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

/// What `expr` keeps of `label`.
fn value(expr: &Expr, label: &str) -> Value {
    match expr {
        Expr::NumberLiteral(_) => Value::Scalar("a number has no labels".to_owned()),
        Expr::StringLiteral(_) => Value::Scalar("a string has no labels".to_owned()),
        // Selectors keep every label of their series; extensions are never parsed from text.
        Expr::VectorSelector(_) | Expr::MatrixSelector(_) | Expr::Extension(_) => Value::Vector(Ok(())),
        Expr::Paren(paren) => value(&paren.expr, label),
        Expr::Unary(unary) => value(&unary.expr, label),
        Expr::Subquery(subquery) => value(&subquery.expr, label),
        Expr::Aggregate(aggregate) => Value::Vector(aggregation(aggregate, label)),
        Expr::Binary(binary) => combine(binary, label),
        Expr::Call(call) => function(call, label),
    }
}

/// What an aggregation keeps of the label.
fn aggregation(aggregate: &AggregateExpr, label: &str) -> std::result::Result<(), String> {
    let op = aggregate.op.to_string();
    let inner = match value(&aggregate.expr, label) {
        Value::Vector(inner) => inner,
        Value::Scalar(reason) => Err(reason),
    };
    // `count_values("label", v)` writes the label named by its parameter.
    let written = match aggregate.param.as_deref() {
        Some(Expr::StringLiteral(name)) if op == "count_values" => name.val == label,
        _ => false,
    };
    // A label the argument already lacks: report where it went first.
    if SELECTING_AGGREGATIONS.contains(&op.as_str()) || written || inner.is_err() {
        return inner;
    }
    match &aggregate.modifier {
        None => Err(format!("{op} with no grouping keeps no labels")),
        Some(LabelModifier::Include(labels)) if !has(&labels.labels, label) => {
            Err(format!("{op} by ({}) {}", labels.labels.join(", "), keeps_only(&labels.labels)))
        }
        Some(LabelModifier::Exclude(labels)) if has(&labels.labels, label) => {
            Err(format!("{op} without ({}) removes it", labels.labels.join(", ")))
        }
        Some(_) => inner,
    }
}

/// What a binary operation keeps of the label (Prometheus' `resultMetric`).
fn combine(binary: &BinaryExpr, label: &str) -> Value {
    let (l, r) = match (value(&binary.lhs, label), value(&binary.rhs, label)) {
        (Value::Scalar(reason), Value::Scalar(_)) => return Value::Scalar(reason),
        (Value::Vector(side), Value::Scalar(_)) | (Value::Scalar(_), Value::Vector(side)) => {
            return Value::Vector(side);
        }
        (Value::Vector(l), Value::Vector(r)) => (l, r),
    };
    let op = binary.op.to_string();
    let card = binary.modifier.as_ref().map(|m| &m.card);
    let matching = binary.modifier.as_ref().and_then(|m| m.matching.as_ref());
    Value::Vector(match (op.as_str(), card, matching) {
        // Set operators return the left side's series, `or` the right side's too.
        ("and" | "unless", _, _) => l,
        ("or", _, _) => match (l, r) {
            (Err(reason), Err(_)) => Err(reason),
            _ => Ok(()),
        },
        // Many-to-one: the "many" side's labels, plus the listed ones from the other side.
        (_, Some(VectorMatchCardinality::ManyToOne(include)), _) => {
            if has(&include.labels, label) {
                r
            } else {
                l
            }
        }
        (_, Some(VectorMatchCardinality::OneToMany(include)), _) => {
            if has(&include.labels, label) {
                l
            } else {
                r
            }
        }
        // One-to-one: the matched labels (`on`) or all but the ignored ones.
        (_, _, Some(LabelModifier::Include(labels))) if !has(&labels.labels, label) => {
            Err(format!("on ({}) {}", labels.labels.join(", "), keeps_only(&labels.labels)))
        }
        (_, _, Some(LabelModifier::Exclude(labels))) if has(&labels.labels, label) => {
            Err(format!("ignoring ({}) removes it", labels.labels.join(", ")))
        }
        // Otherwise both sides must carry it to match at all.
        _ => l.and(r),
    })
}

/// What a function call keeps of the label.
fn function(call: &Call, label: &str) -> Value {
    let name = call.func.name;
    let arguments: Vec<Value> = call.args.args.iter().map(|arg| value(arg, label)).collect();
    let shown = if arguments.is_empty() { format!("{name}()") } else { format!("{name}(...)") };
    if OPAQUE_FUNCTIONS.contains(&name) {
        return Value::Vector(Ok(()));
    }
    if name == "vector" {
        return Value::Vector(Err(format!("{shown} has no labels")));
    }
    if name == "histogram_quantile" && label == "le" {
        return Value::Vector(Err("histogram_quantile removes le".to_owned()));
    }
    if call.func.return_type == promql_parser::parser::value::ValueType::Scalar {
        return Value::Scalar(format!("{shown} has no labels"));
    }
    // Other functions keep the labels of their vector argument (`rate`, `clamp_min`,
    // `histogram_quantile` but for `le`, ...); without one they return a bare vector.
    let vector = arguments.into_iter().find_map(|a| match a {
        Value::Vector(v) => Some(v),
        Value::Scalar(_) => None,
    });
    Value::Vector(vector.unwrap_or_else(|| Err(format!("{shown} has no labels"))))
}

/// Whether `labels` lists `label`.
fn has(labels: &[String], label: &str) -> bool {
    labels.iter().any(|l| l == label)
}

/// What a `by`/`on` list keeps, as a message says it.
fn keeps_only(labels: &[String]) -> String {
    if labels.is_empty() { "keeps no labels".to_owned() } else { format!("keeps only {}", labels.join(", ")) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::prometheus::Error;
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
    fn keeps_label_rejects_what_is_not_promql() {
        for template in ["sum by (namespace) (x{SCOPE}) +", "x{SCOPE} y{SCOPE}", "sum()", "by (pod)"] {
            let error = keeps_label(template, "pod").unwrap_err();
            assert!(
                matches!(error, LabelCheckError::Template(Error::InvalidPromql(_))),
                "{template}: {error}"
            );
        }
        assert_eq!(
            keeps_label("x{a=\"b}", "pod").map_err(|e| e.to_string()),
            Err("PromQL template, at byte 4: unterminated string".to_owned())
        );
    }
}
