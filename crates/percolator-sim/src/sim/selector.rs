//! Label and field selectors of list and watch requests (`labelSelector`, `fieldSelector`).
//!
//! Label selectors support the whole set-based grammar (`k=v`, `k==v`, `k!=v`, `k`, `!k`,
//! `k in (a,b)`, `k notin (a,b)`). Field selectors support `metadata.name`,
//! `metadata.namespace`, `spec.nodeName` and `status.phase` with `=`, `==`, `!=`; other
//! fields are ignored.
//!
//! The same [`LabelSelector`] evaluates the selectors of objects: a `metav1.LabelSelector`
//! (`matchLabels` and `matchExpressions`, [`LabelSelector::from_k8s`]) and a Service's
//! `spec.selector` map ([`LabelSelector::from_map`]).

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1 as metav1;

/// An invalid selector, with a message for the 400 Status.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(super) struct SelectorError(String);

#[derive(Debug, Clone, PartialEq, Eq)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct LabelSelector(Vec<LabelReq>);

/// Splits on commas outside parentheses.
fn split_top(s: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&s[start..]);
    parts
}

fn valid_key(k: &str) -> bool {
    !k.is_empty()
        && k.len() <= 253
        && k.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | '/'))
}

fn valid_value(v: &str) -> bool {
    v.len() <= 63 && v.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

impl LabelSelector {
    /// Parses `s`.
    ///
    /// # Errors
    /// A [`SelectorError`] naming the bad requirement.
    pub(super) fn parse(s: &str) -> Result<Self, SelectorError> {
        let mut reqs = Vec::new();
        if s.trim().is_empty() {
            return Ok(Self(reqs));
        }
        for part in split_top(s) {
            let p = part.trim();
            let bad = || SelectorError(format!("unable to parse requirement: {p:?}"));
            let req = if let Some(key) = p.strip_prefix('!') {
                LabelReq::NotExists(key.trim().to_owned())
            } else if let Some((k, v)) = p.split_once("!=") {
                LabelReq::NotEq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = p.split_once("==") {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, v)) = p.split_once('=') {
                LabelReq::Eq(k.trim().to_owned(), v.trim().to_owned())
            } else if let Some((k, rest)) = p.split_once(' ') {
                let rest = rest.trim();
                let (op, list) = rest.split_once(' ').map_or((rest, ""), |(a, b)| (a, b.trim()));
                let values = list
                    .strip_prefix('(')
                    .and_then(|l| l.strip_suffix(')'))
                    .ok_or_else(bad)?
                    .split(',')
                    .map(|v| v.trim().to_owned())
                    .collect::<Vec<_>>();
                if values.iter().any(|v| !valid_value(v)) {
                    return Err(bad());
                }
                match op {
                    "in" => LabelReq::In(k.trim().to_owned(), values),
                    "notin" => LabelReq::NotIn(k.trim().to_owned(), values),
                    _ => return Err(bad()),
                }
            } else {
                LabelReq::Exists(p.to_owned())
            };
            let (key, value) = match &req {
                LabelReq::Eq(k, v) | LabelReq::NotEq(k, v) => (k, Some(v)),
                LabelReq::In(k, _) | LabelReq::NotIn(k, _) | LabelReq::Exists(k) | LabelReq::NotExists(k) => {
                    (k, None)
                }
            };
            if !valid_key(key) || value.is_some_and(|v| !valid_value(v)) {
                return Err(bad());
            }
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// The selector of a `metav1.LabelSelector`: every `matchLabels` pair and every
    /// `matchExpressions` requirement (`In`, `NotIn`, `Exists`, `DoesNotExist`) must hold.
    /// The empty selector matches everything, as for a workload's `spec.selector`.
    ///
    /// # Errors
    /// A [`SelectorError`] for an unknown operator, or values where the operator takes none
    /// (or none where it needs some), as kube-apiserver's validation would reject them.
    pub(super) fn from_k8s(selector: &metav1::LabelSelector) -> Result<Self, SelectorError> {
        let mut reqs: Vec<LabelReq> =
            selector.match_labels.iter().flatten().map(|(k, v)| LabelReq::Eq(k.clone(), v.clone())).collect();
        for e in selector.match_expressions.iter().flatten() {
            let values = e.values.clone().unwrap_or_default();
            let bad = |m: &str| SelectorError(format!("matchExpressions key {:?}: {m}", e.key));
            let req = match e.operator.as_str() {
                "In" | "NotIn" if values.is_empty() => return Err(bad("In and NotIn need values")),
                "In" => LabelReq::In(e.key.clone(), values),
                "NotIn" => LabelReq::NotIn(e.key.clone(), values),
                "Exists" | "DoesNotExist" if !values.is_empty() => {
                    return Err(bad("Exists and DoesNotExist take no values"));
                }
                "Exists" => LabelReq::Exists(e.key.clone()),
                "DoesNotExist" => LabelReq::NotExists(e.key.clone()),
                other => return Err(bad(&format!("unknown operator {other:?}"))),
            };
            reqs.push(req);
        }
        Ok(Self(reqs))
    }

    /// The selector of a Service's `spec.selector`: every pair must hold. `None` for an
    /// absent or empty map, which selects no pod (the endpoints are managed elsewhere).
    pub(super) fn from_map(selector: Option<&BTreeMap<String, String>>) -> Option<Self> {
        let map = selector.filter(|m| !m.is_empty())?;
        Some(Self(map.iter().map(|(k, v)| LabelReq::Eq(k.clone(), v.clone())).collect()))
    }

    /// The requirements that pin a key to a few values (`k=v`, `k in (a,b)`): a matching
    /// object has one of them, so a caller may look candidates up by them.
    pub(super) fn pinned(&self) -> impl Iterator<Item = (&str, &[String])> {
        self.0.iter().filter_map(|req| match req {
            LabelReq::Eq(k, v) => Some((k.as_str(), std::slice::from_ref(v))),
            LabelReq::In(k, vs) => Some((k.as_str(), vs.as_slice())),
            _ => None,
        })
    }

    /// Whether an object whose labels are looked up by `label` matches.
    pub(super) fn matches<'a>(&self, label: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, vs) => label(k).is_some_and(|l| vs.iter().any(|v| v == l)),
            LabelReq::NotIn(k, vs) => label(k).is_none_or(|l| vs.iter().all(|v| v != l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        })
    }
}

/// A parsed field selector: `(field, value, equal?)` terms, unknown fields dropped.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct FieldSelector(Vec<(String, String, bool)>);

impl FieldSelector {
    /// Parses `s`, keeping only the fields in `known`.
    ///
    /// # Errors
    /// A [`SelectorError`] for a term without an operator.
    pub(super) fn parse(s: &str, known: &[&str]) -> Result<Self, SelectorError> {
        let mut terms = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (field, value, eq) = if let Some((f, v)) = part.split_once("!=") {
                (f, v, false)
            } else if let Some((f, v)) = part.split_once("==") {
                (f, v, true)
            } else if let Some((f, v)) = part.split_once('=') {
                (f, v, true)
            } else {
                return Err(SelectorError(format!("invalid selector: '{part}'; can't understand '{part}'")));
            };
            if known.contains(&field.trim()) {
                terms.push((field.trim().to_owned(), value.trim().to_owned(), eq));
            }
        }
        Ok(Self(terms))
    }

    /// Whether an object whose fields are looked up by `field` matches.
    pub(super) fn matches<'a>(&self, field: impl Fn(&str) -> Option<&'a str>) -> bool {
        self.0.iter().all(|(f, v, eq)| (field(f) == Some(v.as_str())) == *eq)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(key: &str) -> Option<&'static str> {
        match key {
            "app" => Some("web"),
            "tier" => Some("frontend"),
            _ => None,
        }
    }

    #[test]
    fn label_selectors() {
        let ok = |s: &str| LabelSelector::parse(s).unwrap().matches(labels);
        assert!(ok(""));
        assert!(ok("app=web"));
        assert!(ok("app==web,tier"));
        assert!(!ok("app=api"));
        assert!(ok("app!=api"));
        assert!(!ok("!tier"));
        assert!(ok("!cafe"));
        assert!(ok("app in (api, web)"));
        assert!(!ok("app notin (web)"));
        assert!(ok("cafe notin (x)"));
        assert!(LabelSelector::parse("app in web").is_err());
        assert!(LabelSelector::parse("a=b=c").is_err());
    }

    #[test]
    fn object_selectors() {
        use metav1::LabelSelectorRequirement as Req;
        let expr = |key: &str, operator: &str, values: &[&str]| Req {
            key: key.into(),
            operator: operator.into(),
            values: (!values.is_empty()).then(|| values.iter().map(|v| (*v).to_owned()).collect()),
        };
        let sel = |labels: &[(&str, &str)], exprs: Vec<Req>| metav1::LabelSelector {
            match_labels: (!labels.is_empty())
                .then(|| labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()),
            match_expressions: (!exprs.is_empty()).then_some(exprs),
        };
        let ok = |s: metav1::LabelSelector| LabelSelector::from_k8s(&s).unwrap().matches(labels);
        assert!(ok(sel(&[], vec![])));
        assert!(ok(sel(&[("app", "web")], vec![expr("tier", "Exists", &[])])));
        assert!(!ok(sel(&[("app", "web")], vec![expr("tier", "DoesNotExist", &[])])));
        assert!(ok(sel(&[], vec![expr("app", "In", &["web", "api"]), expr("cafe", "DoesNotExist", &[])])));
        assert!(!ok(sel(&[], vec![expr("app", "NotIn", &["web"])])));
        assert!(ok(sel(&[], vec![expr("cafe", "NotIn", &["x"])])));
        assert!(!ok(sel(&[("app", "web"), ("tier", "backend")], vec![])));
        for bad in [expr("app", "in", &["web"]), expr("app", "In", &[]), expr("app", "Exists", &["web"])] {
            assert!(LabelSelector::from_k8s(&sel(&[], vec![bad])).is_err());
        }
        let pinned = LabelSelector::from_k8s(&sel(
            &[("app", "web")],
            vec![expr("tier", "Exists", &[]), expr("x", "In", &["a", "b"])],
        ))
        .unwrap();
        let pins: Vec<(&str, &[String])> = pinned.pinned().collect();
        assert_eq!(pins, [("app", &["web".to_owned()][..]), ("x", &["a".to_owned(), "b".to_owned()][..])]);

        let map = BTreeMap::from([("app".to_owned(), "web".to_owned())]);
        assert!(LabelSelector::from_map(Some(&map)).unwrap().matches(labels));
        assert!(LabelSelector::from_map(Some(&BTreeMap::new())).is_none());
        assert!(LabelSelector::from_map(None).is_none());
    }

    #[test]
    fn field_selectors() {
        let known = ["metadata.name", "spec.nodeName"];
        let f = FieldSelector::parse("spec.nodeName=node-1,foo.bar=x", &known).unwrap();
        assert!(f.matches(|k| (k == "spec.nodeName").then_some("node-1")));
        assert!(!f.matches(|k| (k == "spec.nodeName").then_some("node-2")));
        let f = FieldSelector::parse("metadata.name!=a", &known).unwrap();
        assert!(f.matches(|_| Some("b")));
        assert!(FieldSelector::parse("metadata.name", &known).is_err());
    }
}
