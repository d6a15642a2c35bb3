//! Query building (prometheus-adapter's `metrics_query.go`, `Build` and `BuildExternal`): the
//! template arguments of one request and the rendered PromQL, and the one mapping of label
//! selectors to matchers ([`requirement_matcher`]), which the metric APIs' own metrics use too.
//!
//! The label matchers come from the request (its `metricLabelSelector` or external selector,
//! its namespace, the names of the objects) and are written with
//! [`Matcher`](crate::sources::prometheus::Matcher), so every value is an escaped PromQL string
//! and a set match is a regex of literal alternatives. Here percolator differs from the adapter
//! on purpose: the adapter passes a single `in` value, and every `=~` value, through as a raw
//! regex. Selector requirements map as the adapter maps them: `=`/`==` → `=`, `!=` → `!=`,
//! `in` → `=~`, `notin` → `!~`, exists → `!=""`, `!key` → `=""`; `>` and `<` are rejected.
//! `.LabelValuesByName` holds each label's raw values joined by `|`, as in the adapter (for
//! templates that build their own matchers); a raw value that could end a PromQL string (a
//! quote, a backslash, a control character) is refused rather than passed on.

use std::collections::BTreeMap;

use kube::core::Expression;

use super::template::{Args, Field, Template};
use crate::sources::prometheus::{self, Matcher};
use k8s_wire::{LabelSelector, Requirement};

/// Errors building one query; each is about the request or the rule, never a panic.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QueryError {
    /// A `>`/`<` requirement: Prometheus has no such matcher (the adapter's
    /// `ErrUnsupportedOperator`).
    #[error("label selector requirement on {0:?}: > and < have no Prometheus equivalent")]
    UnsupportedOperator(String),
    /// A matcher that cannot be written: a key that is not a Prometheus label name.
    #[error("{0}")]
    Matcher(#[from] prometheus::Error),
    /// The rule has no label for a resource the query needs (the namespace, the object).
    #[error("{0}")]
    NoLabel(String),
    /// A pod query without a namespace.
    #[error("pod queries need a namespace")]
    NoNamespace,
    /// An empty list of object names.
    #[error("no object names to query")]
    NoNames,
    /// A raw `.LabelValuesByName` value that could end a PromQL string.
    #[error("value {value:?} of label {label:?} cannot be passed to the template raw")]
    UnsafeRawValue {
        /// The label.
        label: String,
        /// The value.
        value: String,
    },
    /// The template rendered nothing (the adapter's "empty query produced by metrics query
    /// template").
    #[error("empty query produced by metrics query template")]
    Empty,
}

/// One label constraint of a query: its matcher (escaped when printed) and its raw values
/// joined by `|` (for `.LabelValuesByName`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Part {
    /// The matcher.
    pub matcher: Matcher,
    /// The raw values, joined by `|`.
    pub raw: String,
}

impl Part {
    fn new(matcher: Matcher, raw: String) -> Self {
        Self { matcher, raw }
    }

    /// `label="value"`.
    pub(crate) fn equal(label: &str, value: &str) -> Result<Self, QueryError> {
        Ok(Self::new(Matcher::eq(label, value)?, value.to_owned()))
    }

    /// The object names of a request: `label="name"` for one name, `label=~"a|b"` (each name
    /// regex-escaped) for more, as the adapter chooses between `=` and `=~`.
    pub(crate) fn names<S: AsRef<str>>(label: &str, names: &[S]) -> Result<Self, QueryError> {
        let raw = names.iter().map(AsRef::as_ref).collect::<Vec<_>>().join("|");
        match names {
            [] => Err(QueryError::NoNames),
            [one] => Ok(Self::new(Matcher::eq(label, one.as_ref())?, raw)),
            _ => Ok(Self::new(Matcher::any_of(label, names)?, raw)),
        }
    }
}

/// The parts of a label selector, in its order (sorted by key, as apimachinery sorts them).
pub(crate) fn selector_parts(selector: &LabelSelector) -> Result<Vec<Part>, QueryError> {
    selector.requirements().iter().map(requirement_part).collect()
}

/// The matcher of one label-selector requirement, the one mapping of selectors to PromQL (the
/// adapter's rules and the metric APIs' own metrics both use it): `=`/`==` → `l="v"`, `!=` →
/// `l!="v"`, `in` → `l=~"v1|v2"`, `notin` → `l!~"v1|v2"` (values regex-escaped), exists →
/// `l!=""`, does-not-exist → `l=""`; `>`/`<` have no Prometheus equivalent.
pub(crate) fn requirement_matcher(requirement: &Requirement) -> Result<Matcher, QueryError> {
    let Requirement::Expr(expression) = requirement else {
        return Err(QueryError::UnsupportedOperator(requirement.key().to_owned()));
    };
    Ok(match expression {
        Expression::Equal(key, value) => Matcher::eq(key, value)?,
        Expression::NotEqual(key, value) => Matcher::ne(key, value)?,
        Expression::In(key, values) => Matcher::any_of(key, &values.iter().collect::<Vec<_>>())?,
        Expression::NotIn(key, values) => Matcher::none_of(key, &values.iter().collect::<Vec<_>>())?,
        Expression::Exists(key) => Matcher::ne(key, "")?,
        Expression::DoesNotExist(key) => Matcher::eq(key, "")?,
    })
}

fn requirement_part(requirement: &Requirement) -> Result<Part, QueryError> {
    let matcher = requirement_matcher(requirement)?;
    let raw = match requirement {
        Requirement::Expr(Expression::Equal(_, value) | Expression::NotEqual(_, value)) => value.clone(),
        Requirement::Expr(Expression::In(_, values) | Expression::NotIn(_, values)) => {
            values.iter().map(String::as_str).collect::<Vec<_>>().join("|")
        }
        _ => String::new(),
    };
    Ok(Part::new(matcher, raw))
}

/// Renders a query template with the adapter's arguments: `.Series`, `.LabelMatchers` (the
/// parts' matchers joined by `,`), `.LabelValuesByName` (label → raw values; a later part of
/// the same label replaces an earlier one, as in the adapter's map), `.GroupBy` (joined by `,`)
/// and `.GroupBySlice`.
pub(crate) fn render(
    template: &Template,
    series: &str,
    parts: &[Part],
    group_by: &[String],
) -> Result<String, QueryError> {
    let mut values = BTreeMap::new();
    for part in parts {
        values.insert(part.matcher.name().to_owned(), part.raw.clone());
    }
    if template.uses(Field::LabelValuesByName)
        && let Some((label, value)) = values
            .iter()
            .find(|(_, v)| v.chars().any(|c| c == '"' || c == '\\' || c == '`' || c.is_control()))
    {
        return Err(QueryError::UnsafeRawValue { label: label.clone(), value: value.clone() });
    }
    let args = Args {
        series: series.to_owned(),
        label_matchers: parts.iter().map(|p| p.matcher.to_string()).collect::<Vec<_>>().join(","),
        label_values_by_name: values,
        group_by: group_by.join(","),
        group_by_slice: group_by.to_vec(),
        ..Args::default()
    };
    let query = template.render(&args);
    if query.is_empty() {
        return Err(QueryError::Empty);
    }
    Ok(query)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(text: &str) -> Template {
        Template::parse(text).unwrap()
    }

    fn sel(text: &str) -> Vec<Part> {
        selector_parts(&LabelSelector::parse(text).unwrap()).unwrap()
    }

    fn matchers(parts: &[Part]) -> String {
        render(&t("<<.LabelMatchers>>"), "", parts, &[]).unwrap()
    }

    #[test]
    fn selector_requirements_map_as_in_the_adapter() {
        assert_eq!(matchers(&sel("a=x")), r#"a="x""#);
        assert_eq!(matchers(&sel("a==x")), r#"a="x""#);
        assert_eq!(matchers(&sel("a!=x")), r#"a!="x""#);
        assert_eq!(matchers(&sel("a in (y,x)")), r#"a=~"x|y""#);
        assert_eq!(matchers(&sel("a notin (x,y)")), r#"a!~"x|y""#);
        assert_eq!(matchers(&sel("a")), r#"a!="""#);
        assert_eq!(matchers(&sel("!a")), r#"a="""#);
        // Sorted by key, comma-joined (metrics_query_test.go's "multiple LabelMatchers value").
        assert_eq!(matchers(&sel("qux in (bar,baz),foo=bar")), r#"foo="bar",qux=~"bar|baz""#);
    }

    #[test]
    fn request_values_are_escaped_unlike_the_adapter() {
        // The adapter writes `a=~"x.y"`: one `in` value passes through as a regex.
        assert_eq!(matchers(&sel("a in (x.y)")), r#"a=~"x\\.y""#);
        assert_eq!(matchers(&sel("a notin (x.y,z)")), r#"a!~"x\\.y|z""#);
        assert_eq!(matchers(&[Part::names("pod", &["a.b", "c"]).unwrap()]), r#"pod=~"a\\.b|c""#);
        assert_eq!(matchers(&[Part::names("pod", &["a.b"]).unwrap()]), r#"pod="a.b""#);
        assert_eq!(matchers(&[Part::equal("namespace", "x\"}").unwrap()]), r#"namespace="x\"}""#);
    }

    #[test]
    fn greater_and_less_than_are_rejected() {
        let e = selector_parts(&LabelSelector::parse("a>1").unwrap()).unwrap_err();
        assert_eq!(e, QueryError::UnsupportedOperator("a".into()));
        assert!(selector_parts(&LabelSelector::parse("b=x,a<1").unwrap()).is_err());
    }

    #[test]
    fn keys_that_are_not_label_names_are_rejected() {
        let e = selector_parts(&LabelSelector::parse("app.kubernetes.io/name=x").unwrap()).unwrap_err();
        assert!(matches!(e, QueryError::Matcher(_)), "{e:?}");
    }

    #[test]
    fn label_values_by_name_holds_raw_values() {
        let mut parts = sel("a in (x.y,z),b");
        parts.push(Part::equal("namespace", "ns").unwrap());
        parts.push(Part::names("pod", &["p1", "p2"]).unwrap());
        assert_eq!(
            render(&t("<<.LabelValuesByName>>"), "", &parts, &[]).unwrap(),
            "map[a:x.y|z b: namespace:ns pod:p1|p2]"
        );
        assert_eq!(render(&t(r#"<<index .LabelValuesByName "pod">>"#), "", &parts, &[]).unwrap(), "p1|p2");
    }

    #[test]
    fn raw_values_that_could_end_a_string_are_refused() {
        let parts = [Part::equal("namespace", "x\"y").unwrap()];
        let e = render(&t(r#"<<index .LabelValuesByName "namespace">>"#), "", &parts, &[]).unwrap_err();
        assert!(matches!(e, QueryError::UnsafeRawValue { .. }));
        // Escaped matchers are fine.
        assert_eq!(render(&t("<<.LabelMatchers>>"), "", &parts, &[]).unwrap(), r#"namespace="x\"y""#);
    }

    #[test]
    fn group_by_and_series() {
        let group_by = ["resource".to_owned(), "extra".to_owned(), "groups".to_owned()];
        assert_eq!(render(&t("<<.GroupBy>>"), "", &[], &group_by).unwrap(), "resource,extra,groups");
        assert_eq!(render(&t("<<.GroupBySlice>>"), "", &[], &group_by).unwrap(), "[resource extra groups]");
        assert_eq!(render(&t("series <<.Series>>"), "foo", &[], &[]).unwrap(), "series foo");
        assert_eq!(render(&t("<<.LabelMatchers>>"), "", &[], &[]), Err(QueryError::Empty));
        assert_eq!(Part::names::<&str>("pod", &[]), Err(QueryError::NoNames));
    }
}
