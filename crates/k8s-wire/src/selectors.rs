//! `labelSelector` and `fieldSelector` of the resource list endpoints
//! (`GET /apis/<g>/<v>[/namespaces/<ns>]/<plural>`, docs/wire.md, "Resource requests").
//!
//! The label selector parser is a port of apimachinery's `labels.Parse` (lexer, recursive
//! descent parser and `NewRequirement` validation, with its error wording): `k=v`, `k==v`,
//! `k!=v`, `k in (a,b)`, `k notin (a)`, `k`, `!k`, `k>1`, `k<1`, comma = AND, whitespace
//! anywhere between tokens. Keys must pass `IsQualifiedName` and values `IsValidLabelValue`,
//! which keeps `"`, `\` and `}` out of every value that may later reach PromQL. Evaluation of
//! the set-based requirements is kube-core's ([`kube::core::Expression`]).
//!
//! Field selectors follow `fields.ParseSelector` (`=`, `==`, `!=`, backslash escapes, comma =
//! AND); only `metadata.name` and `metadata.namespace` are supported, anything else is
//! `field label not supported: <field>`.

use std::collections::{BTreeMap, BTreeSet};

use kube::core::{Expression, SelectorExt};

use super::status::ApiError;
use super::validation::{is_qualified_name, is_valid_label_value};

/// A selector that does not parse or names something unsupported; its message is the
/// apimachinery wording and becomes a 400 `BadRequest`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SelectorError {
    /// A label selector requirement that does not parse or whose key or values are invalid.
    #[error("unable to parse requirement: {0}")]
    Requirement(RequirementError),
    /// A label selector token where another was expected, between requirements.
    #[error(transparent)]
    Syntax(UnexpectedToken),
    /// A field selector term without an operator.
    #[error("invalid selector: '{input}'; can't understand '{term}'")]
    Term {
        /// The whole selector.
        input: String,
        /// The term.
        term: String,
    },
    /// A field selector on a field other than `metadata.name` and `metadata.namespace`.
    #[error("field label not supported: {0}")]
    UnsupportedField(String),
    /// A backslash in a field selector value followed by something other than `\`, `,` or
    /// `=` (`None`: by nothing).
    #[error(
        "invalid field selector: invalid escape sequence: \\{}",
        .0.map(String::from).unwrap_or_default()
    )]
    InvalidEscape(Option<char>),
    /// A bare `,` or `=` in a field selector value (the message gives its code point).
    #[error("invalid field selector: unescaped character in value: {}", u32::from(*.0))]
    UnescapedCharacter(char),
}

/// A label selector requirement that does not parse (`labels.Parse`'s wording).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequirementError {
    /// A token where another was expected.
    #[error(transparent)]
    Syntax(UnexpectedToken),
    /// `in` or `notin` not followed by `(` (apimachinery's wording has no comma here).
    #[error("found '{0}' expected: '('")]
    NoOpenParenthesis(String),
    /// The key or values do not validate (`NewRequirement`); several are listed in brackets,
    /// as `errors.NewAggregate` does.
    #[error("{}", aggregate(.0))]
    Invalid(Vec<InvalidValue>),
}

/// A token of a label selector where another was expected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("found '{found}', expected: {expected}")]
pub struct UnexpectedToken {
    /// The literal found.
    pub found: String,
    /// What the grammar allows there.
    pub expected: &'static str,
}

/// `field.Invalid(path, value, detail)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{path}: Invalid value: {}: {detail}", super::status::go_quote(.value))]
pub struct InvalidValue {
    /// The field path (`<nil>` for a key, `values[0][app]` for a value).
    pub path: String,
    /// The value.
    pub value: String,
    /// Why (the validation messages joined with `; `).
    pub detail: String,
}

fn unexpected(found: String, expected: &'static str) -> UnexpectedToken {
    UnexpectedToken { found, expected }
}

impl From<UnexpectedToken> for RequirementError {
    fn from(e: UnexpectedToken) -> Self {
        Self::Syntax(e)
    }
}

impl From<SelectorError> for ApiError {
    fn from(e: SelectorError) -> Self {
        ApiError::BadRequest(e.to_string())
    }
}

/// One requirement of a label selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Requirement {
    /// `=`, `==`, `!=`, `in`, `notin`, exists, does-not-exist (evaluated by kube-core).
    Expr(Expression),
    /// `key>n`: the label exists, is an integer and is greater than `n`.
    GreaterThan {
        /// Label key.
        key: String,
        /// Bound.
        value: i64,
    },
    /// `key<n`: the label exists, is an integer and is less than `n`.
    LessThan {
        /// Label key.
        key: String,
        /// Bound.
        value: i64,
    },
}

impl Requirement {
    /// The label key the requirement is about.
    pub fn key(&self) -> &str {
        match self {
            Self::Expr(
                Expression::In(k, _)
                | Expression::NotIn(k, _)
                | Expression::Equal(k, _)
                | Expression::NotEqual(k, _)
                | Expression::Exists(k)
                | Expression::DoesNotExist(k),
            ) => k,
            Self::GreaterThan { key, .. } | Self::LessThan { key, .. } => key,
        }
    }

    /// Whether `labels` satisfy the requirement (apimachinery's `Requirement.Matches`).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        match self {
            Self::Expr(e) => e.matches(labels),
            Self::GreaterThan { key, value } => {
                labels.get(key).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v > *value)
            }
            Self::LessThan { key, value } => {
                labels.get(key).and_then(|v| v.parse::<i64>().ok()).is_some_and(|v| v < *value)
            }
        }
    }
}

/// A parsed label selector: the AND of its requirements, sorted by key.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// The selector that matches everything (an absent or empty `labelSelector`).
    pub fn everything() -> Self {
        Self::default()
    }

    /// Parses a selector with apimachinery's grammar and error messages.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut requirements = Parser::new(input).parse()?;
        requirements.sort_by(|a, b| a.key().cmp(b.key()));
        Ok(Self { requirements })
    }

    /// Whether the selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    /// The requirements, sorted by key.
    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    /// Whether `labels` satisfy every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// The `metav1.LabelSelector` of the selector, as `metav1.ParseToLabelSelector` builds it
    /// (requirements sorted by key, as `labels.Parse` leaves them): `=`/`==` → `matchLabels`,
    /// `!=` → `NotIn` of one value, `in`/`notin`/exists/does-not-exist → `matchExpressions`;
    /// `null` when empty; `gt` and `lt`, which it cannot hold, are left out.
    pub fn to_metav1_json(&self) -> serde_json::Value {
        if self.is_empty() {
            return serde_json::Value::Null;
        }
        let mut requirements: Vec<&Requirement> = self.requirements().iter().collect();
        requirements.sort_by(|a, b| a.key().cmp(b.key()));
        let mut match_labels = serde_json::Map::new();
        let mut expressions = Vec::new();
        for requirement in requirements {
            let expression = |key: &str, operator: &str, values: Option<Vec<&String>>| match values {
                Some(values) => serde_json::json!({"key": key, "operator": operator, "values": values}),
                None => serde_json::json!({"key": key, "operator": operator}),
            };
            match requirement {
                Requirement::Expr(Expression::Equal(k, v)) => {
                    match_labels.insert(k.clone(), serde_json::Value::String(v.clone()));
                }
                Requirement::Expr(Expression::NotEqual(k, v)) => {
                    expressions.push(expression(k, "NotIn", Some(vec![v])))
                }
                Requirement::Expr(Expression::In(k, values)) => {
                    expressions.push(expression(k, "In", Some(values.iter().collect())));
                }
                Requirement::Expr(Expression::NotIn(k, values)) => {
                    expressions.push(expression(k, "NotIn", Some(values.iter().collect())));
                }
                Requirement::Expr(Expression::Exists(k)) => expressions.push(expression(k, "Exists", None)),
                Requirement::Expr(Expression::DoesNotExist(k)) => {
                    expressions.push(expression(k, "DoesNotExist", None))
                }
                // Not a `metav1.LabelSelector` operator: left out.
                Requirement::GreaterThan { .. } | Requirement::LessThan { .. } => {}
            }
        }
        let mut out = serde_json::Map::new();
        if !match_labels.is_empty() {
            out.insert("matchLabels".into(), serde_json::Value::Object(match_labels));
        }
        if !expressions.is_empty() {
            out.insert("matchExpressions".into(), serde_json::Value::Array(expressions));
        }
        serde_json::Value::Object(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Tok {
    EndOfString,
    ClosedPar,
    Comma,
    DoesNotExist,
    DoubleEquals,
    Equals,
    GreaterThan,
    Identifier,
    In,
    LessThan,
    NotEquals,
    NotIn,
    OpenPar,
    Error,
}

fn symbol_token(s: &str) -> Option<Tok> {
    Some(match s {
        ")" => Tok::ClosedPar,
        "," => Tok::Comma,
        "!" => Tok::DoesNotExist,
        "==" => Tok::DoubleEquals,
        "=" => Tok::Equals,
        ">" => Tok::GreaterThan,
        "<" => Tok::LessThan,
        "!=" => Tok::NotEquals,
        "(" => Tok::OpenPar,
        _ => return None,
    })
}

fn is_whitespace(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\r' | '\n')
}

fn is_special(c: char) -> bool {
    matches!(c, '=' | '!' | '(' | ')' | ',' | '>' | '<')
}

/// apimachinery's selector lexer, run to the end up front like `Parser.scan`.
fn lex(input: &str) -> Vec<(Tok, String)> {
    let chars: Vec<char> = input.chars().collect();
    let mut pos = 0;
    let mut out = Vec::new();
    loop {
        while pos < chars.len() && is_whitespace(chars[pos]) {
            pos += 1;
        }
        let Some(&c) = chars.get(pos) else {
            out.push((Tok::EndOfString, String::new()));
            return out;
        };
        if is_special(c) {
            // Longest run of special characters that is still a known symbol.
            let mut buffer = String::new();
            let mut last: Option<(Tok, String)> = None;
            while let Some(&c) = chars.get(pos) {
                if !is_special(c) {
                    break;
                }
                buffer.push(c);
                if let Some(tok) = symbol_token(&buffer) {
                    last = Some((tok, buffer.clone()));
                    pos += 1;
                } else if last.is_some() {
                    break;
                } else {
                    pos += 1;
                }
            }
            out.push(
                last.unwrap_or_else(|| (Tok::Error, format!("error expected: keyword found '{buffer}'"))),
            );
        } else {
            let start = pos;
            while pos < chars.len() && !is_whitespace(chars[pos]) && !is_special(chars[pos]) {
                pos += 1;
            }
            let word: String = chars[start..pos].iter().collect();
            let tok = match word.as_str() {
                "in" => Tok::In,
                "notin" => Tok::NotIn,
                _ => Tok::Identifier,
            };
            out.push((tok, word));
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Ctx {
    KeyAndOperator,
    Values,
}

enum Op {
    Exists,
    DoesNotExist,
    In,
    NotIn,
    Equals,
    NotEquals,
    GreaterThan,
    LessThan,
}

struct Parser {
    items: Vec<(Tok, String)>,
    pos: usize,
}

impl Parser {
    fn new(input: &str) -> Self {
        Self { items: lex(input), pos: 0 }
    }

    fn lookahead(&self, ctx: Ctx) -> (Tok, String) {
        let (tok, lit) = self.items.get(self.pos).cloned().unwrap_or((Tok::EndOfString, String::new()));
        (map_ctx(tok, ctx), lit)
    }

    fn consume(&mut self, ctx: Ctx) -> (Tok, String) {
        let item = self.lookahead(ctx);
        self.pos += 1;
        item
    }

    fn parse(&mut self) -> Result<Vec<Requirement>, SelectorError> {
        let mut requirements = Vec::new();
        loop {
            let (tok, lit) = self.lookahead(Ctx::Values);
            match tok {
                Tok::Identifier | Tok::DoesNotExist => {
                    let r = self.parse_requirement().map_err(SelectorError::Requirement)?;
                    requirements.push(r);
                    let (t, l) = self.consume(Ctx::Values);
                    match t {
                        Tok::EndOfString => return Ok(requirements),
                        Tok::Comma => {
                            let (t2, l2) = self.lookahead(Ctx::Values);
                            if t2 != Tok::Identifier && t2 != Tok::DoesNotExist {
                                return Err(SelectorError::Syntax(unexpected(l2, "identifier after ','")));
                            }
                        }
                        _ => {
                            return Err(SelectorError::Syntax(unexpected(l, "',' or 'end of string'")));
                        }
                    }
                }
                Tok::EndOfString => return Ok(requirements),
                _ => {
                    return Err(SelectorError::Syntax(unexpected(lit, "!, identifier, or 'end of string'")));
                }
            }
        }
    }

    fn parse_requirement(&mut self) -> Result<Requirement, RequirementError> {
        let (key, op) = self.parse_key_and_infer_operator()?;
        let (op, values) = match op {
            Some(op) => (op, BTreeSet::new()),
            None => {
                let op = self.parse_operator()?;
                let values = match op {
                    Op::In | Op::NotIn => self.parse_values()?,
                    _ => self.parse_exact_value()?,
                };
                (op, values)
            }
        };
        new_requirement(key, op, values)
    }

    fn parse_key_and_infer_operator(&mut self) -> Result<(String, Option<Op>), RequirementError> {
        let mut op = None;
        let (mut tok, mut lit) = self.consume(Ctx::Values);
        if tok == Tok::DoesNotExist {
            op = Some(Op::DoesNotExist);
            (tok, lit) = self.consume(Ctx::Values);
        }
        if tok != Tok::Identifier {
            return Err(unexpected(lit, "identifier").into());
        }
        let errs = is_qualified_name(&lit);
        if !errs.is_empty() {
            return Err(RequirementError::Invalid(vec![invalid("<nil>", &lit, &errs.join("; "))]));
        }
        let (next, _) = self.lookahead(Ctx::Values);
        if (next == Tok::EndOfString || next == Tok::Comma) && op.is_none() {
            op = Some(Op::Exists);
        }
        Ok((lit, op))
    }

    fn parse_operator(&mut self) -> Result<Op, UnexpectedToken> {
        let (tok, lit) = self.consume(Ctx::KeyAndOperator);
        Ok(match tok {
            Tok::In => Op::In,
            Tok::Equals | Tok::DoubleEquals => Op::Equals,
            Tok::GreaterThan => Op::GreaterThan,
            Tok::LessThan => Op::LessThan,
            Tok::NotIn => Op::NotIn,
            Tok::NotEquals => Op::NotEquals,
            _ => {
                return Err(unexpected(lit, "in, notin, =, ==, !=, gt, lt"));
            }
        })
    }

    fn parse_values(&mut self) -> Result<BTreeSet<String>, RequirementError> {
        let (tok, lit) = self.consume(Ctx::Values);
        if tok != Tok::OpenPar {
            return Err(RequirementError::NoOpenParenthesis(lit));
        }
        let (tok, lit) = self.lookahead(Ctx::Values);
        match tok {
            Tok::Identifier | Tok::Comma => {
                let values = self.parse_identifiers_list()?;
                let (tok, _) = self.consume(Ctx::Values);
                if tok != Tok::ClosedPar {
                    return Err(unexpected(lit, "')'").into());
                }
                Ok(values)
            }
            Tok::ClosedPar => {
                self.consume(Ctx::Values);
                Ok(BTreeSet::from([String::new()]))
            }
            _ => Err(unexpected(lit, "',', ')' or identifier").into()),
        }
    }

    fn parse_identifiers_list(&mut self) -> Result<BTreeSet<String>, UnexpectedToken> {
        let mut values = BTreeSet::new();
        loop {
            let (tok, lit) = self.consume(Ctx::Values);
            match tok {
                Tok::Identifier => {
                    values.insert(lit);
                    let (tok2, lit2) = self.lookahead(Ctx::Values);
                    match tok2 {
                        Tok::Comma => continue,
                        Tok::ClosedPar => return Ok(values),
                        _ => return Err(unexpected(lit2, "',' or ')'")),
                    }
                }
                Tok::Comma => {
                    // "(,", ",)" and ",," all stand for an empty value.
                    if values.is_empty() {
                        values.insert(String::new());
                    }
                    let (tok2, _) = self.lookahead(Ctx::Values);
                    if tok2 == Tok::ClosedPar {
                        values.insert(String::new());
                        return Ok(values);
                    }
                    if tok2 == Tok::Comma {
                        self.consume(Ctx::Values);
                        values.insert(String::new());
                    }
                }
                _ => return Err(unexpected(lit, "',', or identifier")),
            }
        }
    }

    fn parse_exact_value(&mut self) -> Result<BTreeSet<String>, UnexpectedToken> {
        let (tok, _) = self.lookahead(Ctx::Values);
        if tok == Tok::EndOfString || tok == Tok::Comma {
            return Ok(BTreeSet::from([String::new()]));
        }
        let (tok, lit) = self.consume(Ctx::Values);
        if tok == Tok::Identifier { Ok(BTreeSet::from([lit])) } else { Err(unexpected(lit, "identifier")) }
    }
}

fn map_ctx(tok: Tok, ctx: Ctx) -> Tok {
    match (ctx, tok) {
        (Ctx::Values, Tok::In | Tok::NotIn) => Tok::Identifier,
        _ => tok,
    }
}

/// `field.Invalid(path, value, detail)`.
fn invalid(path: &str, value: &str, detail: &str) -> InvalidValue {
    InvalidValue { path: path.to_owned(), value: value.to_owned(), detail: detail.to_owned() }
}

/// `errors.NewAggregate(errs).Error()`: one message as is, several deduplicated in brackets.
fn aggregate(errs: &[InvalidValue]) -> String {
    let mut seen: Vec<String> = Vec::new();
    for e in errs.iter().map(ToString::to_string) {
        if !seen.contains(&e) {
            seen.push(e);
        }
    }
    if seen.len() == 1 { seen.join("") } else { format!("[{}]", seen.join(", ")) }
}

/// `labels.NewRequirement`'s value validation, then conversion to our requirement type.
fn new_requirement(key: String, op: Op, values: BTreeSet<String>) -> Result<Requirement, RequirementError> {
    let mut errs = Vec::new();
    let mut bound = None;
    if matches!(op, Op::GreaterThan | Op::LessThan) {
        // The parser always supplies exactly one value here.
        for (i, v) in values.iter().enumerate() {
            match v.parse::<i64>() {
                Ok(n) => bound = Some(n),
                Err(_) => errs.push(invalid(
                    &format!("values[{i}]"),
                    v,
                    "for 'Gt', 'Lt' operators, the value must be an integer",
                )),
            }
        }
    }
    for (i, v) in values.iter().enumerate() {
        let v_errs = is_valid_label_value(v);
        if !v_errs.is_empty() {
            errs.push(invalid(&format!("values[{i}][{key}]"), v, &v_errs.join("; ")));
        }
    }
    if !errs.is_empty() {
        return Err(RequirementError::Invalid(errs));
    }
    let single = || values.iter().next().cloned().unwrap_or_default();
    Ok(match op {
        Op::Exists => Requirement::Expr(Expression::Exists(key)),
        Op::DoesNotExist => Requirement::Expr(Expression::DoesNotExist(key)),
        Op::Equals => Requirement::Expr(Expression::Equal(key, single())),
        Op::NotEquals => Requirement::Expr(Expression::NotEqual(key, single())),
        Op::In => Requirement::Expr(Expression::In(key, values)),
        Op::NotIn => Requirement::Expr(Expression::NotIn(key, values)),
        Op::GreaterThan => Requirement::GreaterThan { key, value: bound.unwrap_or_default() },
        Op::LessThan => Requirement::LessThan { key, value: bound.unwrap_or_default() },
    })
}

/// Field name of an object's name.
pub(crate) const FIELD_NAME: &str = "metadata.name";
/// Field name of an object's namespace.
pub const FIELD_NAMESPACE: &str = "metadata.namespace";

/// One term of a field selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldTerm {
    /// Field path (`metadata.name`).
    pub field: String,
    /// `true` for `=`/`==`, `false` for `!=`.
    pub equal: bool,
    /// Unescaped value.
    pub value: String,
}

/// A parsed field selector: the AND of its terms.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct FieldSelector {
    terms: Vec<FieldTerm>,
}

impl FieldSelector {
    /// Parses the syntax only (`fields.ParseSelector`): any field name is accepted. This is
    /// what RequestInfo uses to find a `metadata.name` for authorization.
    pub fn parse(input: &str) -> Result<Self, SelectorError> {
        let mut parts = split_terms(input);
        parts.sort();
        let mut terms = Vec::new();
        for part in parts.into_iter().filter(|p| !p.is_empty()) {
            let Some((lhs, op, rhs)) = split_term(part) else {
                return Err(SelectorError::Term { input: input.to_owned(), term: part.to_owned() });
            };
            terms.push(FieldTerm { field: lhs.to_owned(), equal: op != "!=", value: unescape_value(rhs)? });
        }
        Ok(Self { terms })
    }

    /// Parses and checks that only `metadata.name` and `metadata.namespace` are used
    /// (`field label not supported: <field>` otherwise).
    pub fn parse_supported(input: &str) -> Result<Self, SelectorError> {
        let selector = Self::parse(input)?;
        if let Some(t) = selector.terms.iter().find(|t| t.field != FIELD_NAME && t.field != FIELD_NAMESPACE) {
            return Err(SelectorError::UnsupportedField(t.field.clone()));
        }
        Ok(selector)
    }

    /// The terms, sorted as kube sorts them.
    pub fn terms(&self) -> &[FieldTerm] {
        &self.terms
    }

    /// Whether the selector matches everything.
    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// The value `field` must equal, if some `=` term pins it (`RequiresExactMatch`).
    pub fn requires_exact_match(&self, field: &str) -> Option<&str> {
        self.terms.iter().find(|t| t.equal && t.field == field).map(|t| t.value.as_str())
    }

    /// Whether an object with this name and namespace matches. Fields other than
    /// `metadata.name`/`metadata.namespace` are treated as empty.
    pub fn matches(&self, name: &str, namespace: &str) -> bool {
        self.terms.iter().all(|t| {
            let actual = match t.field.as_str() {
                FIELD_NAME => name,
                FIELD_NAMESPACE => namespace,
                _ => "",
            };
            (actual == t.value) == t.equal
        })
    }
}

/// Splits on commas not escaped with a backslash (`fields.splitTerms`).
fn split_terms(input: &str) -> Vec<&str> {
    if input.is_empty() {
        return Vec::new();
    }
    let mut terms = Vec::new();
    let mut start = 0;
    let mut in_slash = false;
    for (i, c) in input.char_indices() {
        if in_slash {
            in_slash = false;
        } else if c == '\\' {
            in_slash = true;
        } else if c == ',' {
            terms.push(&input[start..i]);
            start = i + 1;
        }
    }
    terms.push(&input[start..]);
    terms
}

/// Finds the first operator (`!=`, `==`, `=`, tried in that order at each position).
fn split_term(term: &str) -> Option<(&str, &'static str, &str)> {
    for (i, _) in term.char_indices() {
        let rest = &term[i..];
        for op in ["!=", "==", "="] {
            if rest.starts_with(op) {
                return Some((&term[..i], op, &term[i + op.len()..]));
            }
        }
    }
    None
}

/// `fields.UnescapeValue`: `\\`, `\,` and `\=` are the only escapes; bare `,`/`=` are errors.
fn unescape_value(s: &str) -> Result<String, SelectorError> {
    let mut out = String::with_capacity(s.len());
    let mut in_slash = false;
    for c in s.chars() {
        if in_slash {
            match c {
                '\\' | ',' | '=' => out.push(c),
                _ => {
                    return Err(SelectorError::InvalidEscape(Some(c)));
                }
            }
            in_slash = false;
            continue;
        }
        match c {
            '\\' => in_slash = true,
            ',' | '=' => {
                return Err(SelectorError::UnescapedCharacter(c));
            }
            _ => out.push(c),
        }
    }
    if in_slash {
        return Err(SelectorError::InvalidEscape(None));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    fn sel(s: &str) -> LabelSelector {
        LabelSelector::parse(s).unwrap_or_else(|e| panic!("{s:?}: {e}"))
    }

    fn err(s: &str) -> String {
        LabelSelector::parse(s).unwrap_err().to_string()
    }

    /// Asserts that every selector of `selecting` selects `l` and that none of `others` does.
    fn assert_selects(l: &BTreeMap<String, String>, selecting: &[&str], others: &[&str]) {
        for s in selecting {
            assert!(sel(s).matches(l), "{s:?} should select {l:?}");
        }
        for s in others {
            assert!(!sel(s).matches(l), "{s:?} should not select {l:?}");
        }
    }

    #[test]
    fn equality_forms() {
        let l = labels(&[("app", "web"), ("tier", "front")]);
        let selecting = ["app=web", "app==web", "app!=db", "missing!=x", "app=web,tier=front"];
        assert_selects(&l, &selecting, &["app!=web", "app=db", "app=web,tier=back"]);
    }

    #[test]
    fn set_forms() {
        let l = labels(&[("env", "prod")]);
        let selecting = ["env in (prod,staging)", "env notin (dev)", "other notin (x)", "env", "!other"];
        assert_selects(
            &l,
            &selecting,
            &["env in (dev)", "env notin (prod, dev)", "other in (x)", "!env", "other"],
        );
    }

    #[test]
    fn keywords_are_values_and_keys_in_value_position() {
        // `in` is a keyword only where an operator is expected.
        assert_selects(&labels(&[("in", "notin")]), &["in=notin", "in in (notin)"], &[]);
    }

    #[test]
    fn whitespace_is_tolerated() {
        let l = labels(&[("app", "web"), ("env", "prod")]);
        for s in [
            " app = web ",
            "app=web , env in ( prod , dev )",
            "\tapp==web,\n!missing",
            "app  !=  db",
            "env in(prod)",
        ] {
            assert!(sel(s).matches(&l), "{s:?}");
        }
    }

    #[test]
    fn empty_values() {
        let l = labels(&[("a", "")]);
        assert_selects(&l, &["a=", "a==", "a in ()", "a in (,x)", "a in (x,)"], &["a!="]);
        assert_eq!(
            sel("a in (x,,y)").requirements(),
            &[Requirement::Expr(Expression::In("a".into(), ["".to_owned(), "x".into(), "y".into()].into()))]
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(sel("").is_empty());
        assert!(sel("  ").is_empty());
        assert!(sel("").matches(&labels(&[("x", "y")])));
        assert!(LabelSelector::everything().matches(&BTreeMap::new()));
    }

    #[test]
    fn prefixed_keys() {
        let l = labels(&[("une-tasse-de.cafe/cafe", "espresso-du-matin")]);
        let selecting =
            ["une-tasse-de.cafe/cafe=espresso-du-matin", "une-tasse-de.cafe/cafe in (espresso-du-matin)"];
        assert_selects(&l, &selecting, &[]);
    }

    #[test]
    fn gt_and_lt() {
        let l = labels(&[("replicas", "3"), ("word", "x")]);
        assert_selects(&l, &["replicas>2", "replicas<4"], &["replicas>3", "word>1", "missing<1"]);
        assert_eq!(
            err("replicas>x"),
            "unable to parse requirement: values[0]: Invalid value: \"x\": for 'Gt', 'Lt' operators, the value must be an integer"
        );
    }

    #[test]
    fn requirements_are_sorted_by_key() {
        let keys: Vec<_> = sel("b=1,a=2,!c").requirements().iter().map(|r| r.key().to_owned()).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }

    const VALUE_RULE: &str = "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')";

    #[test]
    fn promql_breaking_values_are_rejected() {
        for v in ["a\"b", "a}b", "a\\b", "x\"}", "\"", "a{b", "a b", "a\nb"] {
            assert!(LabelSelector::parse(&format!("app={v}")).is_err(), "{v:?}");
            assert!(LabelSelector::parse(&format!("app in ({v})")).is_err(), "{v:?}");
        }
        assert_eq!(
            err("app=a\"b"),
            format!("unable to parse requirement: values[0][app]: Invalid value: \"a\\\"b\": {VALUE_RULE}")
        );
        assert_eq!(
            err("app in (ok, a}b)"),
            format!("unable to parse requirement: values[0][app]: Invalid value: \"a}}b\": {VALUE_RULE}")
        );
        assert!(
            err("app=a\\b")
                .starts_with("unable to parse requirement: values[0][app]: Invalid value: \"a\\\\b\"")
        );
    }

    #[test]
    fn invalid_keys() {
        assert_eq!(
            err("a/b/c=x"),
            "unable to parse requirement: <nil>: Invalid value: \"a/b/c\": a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')"
        );
        assert!(err("-app=x").starts_with(
            "unable to parse requirement: <nil>: Invalid value: \"-app\": name part must consist"
        ));
        assert!(err("Foo.com/app").contains("prefix part a lowercase RFC 1123 subdomain"));
        assert!(
            err(&format!("{}=x", "a".repeat(64))).contains("name part must be no more than 63 characters")
        );
    }

    #[test]
    fn syntax_errors_are_worded_like_apimachinery() {
        for (selector, message) in [
            ("=x", "found '=', expected: !, identifier, or 'end of string'"),
            (",", "found ',', expected: !, identifier, or 'end of string'"),
            ("a=b,", "found '', expected: identifier after ','"),
            ("a=b,,c=d", "found ',', expected: identifier after ','"),
            ("a b", "unable to parse requirement: found 'b', expected: in, notin, =, ==, !=, gt, lt"),
            ("a=b c", "found 'c', expected: ',' or 'end of string'"),
            ("!a=b", "found '=', expected: ',' or 'end of string'"),
            ("!", "unable to parse requirement: found '', expected: identifier"),
            ("!!a", "unable to parse requirement: found '!', expected: identifier"),
            ("a in b", "unable to parse requirement: found 'b' expected: '('"),
            ("a in (b", "unable to parse requirement: found '', expected: ',' or ')'"),
            ("a in (b c)", "unable to parse requirement: found 'c', expected: ',' or ')'"),
            ("a in (", "unable to parse requirement: found '', expected: ',', ')' or identifier"),
            ("a in (=)", "unable to parse requirement: found '=', expected: ',', ')' or identifier"),
            ("a in (b,=)", "unable to parse requirement: found '=', expected: ',', or identifier"),
            ("a (b)", "unable to parse requirement: found '(', expected: in, notin, =, ==, !=, gt, lt"),
            ("a=(b)", "unable to parse requirement: found '(', expected: identifier"),
            ("a>=1", "unable to parse requirement: found '=', expected: identifier"),
        ] {
            assert_eq!(err(selector), message, "{selector:?}");
        }
    }

    #[test]
    fn double_equals_with_empty_value_is_empty_equality() {
        let l = labels(&[("a", "")]);
        assert!(sel("a==").matches(&l));
        assert!(sel("a==,b").requirements().len() == 2);
    }

    #[test]
    fn lexer_longest_match() {
        assert_eq!(
            lex("a!=b").iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![Tok::Identifier, Tok::NotEquals, Tok::Identifier, Tok::EndOfString]
        );
        assert_eq!(
            lex("a==b").iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![Tok::Identifier, Tok::DoubleEquals, Tok::Identifier, Tok::EndOfString]
        );
        assert_eq!(
            lex("!a").iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![Tok::DoesNotExist, Tok::Identifier, Tok::EndOfString]
        );
        assert_eq!(
            lex("x=!y")[1..3].iter().map(|(t, _)| *t).collect::<Vec<_>>(),
            vec![Tok::Equals, Tok::DoesNotExist]
        );
    }

    #[test]
    fn unicode_and_control_input_is_rejected_not_panicking() {
        for s in ["é=x", "a=é", "a=\u{0}", "\u{feff}a", "a=\u{fffd}", "a in (\u{10ffff})"] {
            assert!(LabelSelector::parse(s).is_err(), "{s:?}");
        }
    }

    #[test]
    fn field_selectors() {
        let f = FieldSelector::parse_supported("metadata.name=web").unwrap();
        assert!(f.matches("web", "shop"));
        assert!(!f.matches("db", "shop"));
        assert_eq!(f.requires_exact_match(FIELD_NAME), Some("web"));
        assert_eq!(f.requires_exact_match(FIELD_NAMESPACE), None);

        let f = FieldSelector::parse_supported("metadata.namespace==shop,metadata.name!=db").unwrap();
        assert!(f.matches("web", "shop"));
        assert!(!f.matches("db", "shop"));
        assert!(!f.matches("web", "other"));
        assert_eq!(f.requires_exact_match(FIELD_NAMESPACE), Some("shop"));

        assert!(FieldSelector::parse_supported("").unwrap().is_empty());
        assert!(FieldSelector::parse_supported("metadata.name=a,").unwrap().terms().len() == 1);
        // empty value
        assert!(FieldSelector::parse_supported("metadata.name=").unwrap().matches("", ""));
    }

    #[test]
    fn field_selector_errors() {
        for (selector, message) in [
            ("spec.foo=x", "field label not supported: spec.foo"),
            ("metadata.name=a,status.phase=Running", "field label not supported: status.phase"),
            // Syntax is checked before field names, and terms are sorted first.
            (
                "zzz=1,metadata.name",
                "invalid selector: 'zzz=1,metadata.name'; can't understand 'metadata.name'",
            ),
            ("metadata.name = x", "field label not supported: metadata.name "),
            ("metadata.name=a=b", "invalid field selector: unescaped character in value: 61"),
            ("metadata.name=a\\x", "invalid field selector: invalid escape sequence: \\x"),
            ("metadata.name=a\\", "invalid field selector: invalid escape sequence: \\"),
            ("metadata.name<a", "invalid selector: 'metadata.name<a'; can't understand 'metadata.name<a'"),
        ] {
            assert_eq!(
                FieldSelector::parse_supported(selector).unwrap_err().to_string(),
                message,
                "{selector:?}"
            );
        }
    }

    #[test]
    fn field_selector_escapes() {
        let f = FieldSelector::parse("metadata.name=a\\,b\\=c\\\\d").unwrap();
        assert_eq!(f.requires_exact_match(FIELD_NAME), Some("a,b=c\\d"));
        // Unsupported fields parse syntactically (what RequestInfo needs).
        assert!(FieldSelector::parse("spec.nodeName=n1").is_ok());
    }
}
