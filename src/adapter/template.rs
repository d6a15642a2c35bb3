//! The template language of prometheus-adapter's `metricsQuery`, `containerQuery`, `nodeQuery`
//! and `resources.template`: Go `text/template` with `<<` `>>` delimiters, reduced to what those
//! templates do, parsed once at load.
//!
//! Supported, with Go's semantics:
//!
//! - text, copied as is (`{{`, `}}` and a lone `>>` are text);
//! - `<<.Field>>` for the fields of [`Field`], printed as Go's `fmt` prints them: a string as
//!   is, a `[]string` as `[a b]`, a `map[string]string` as `map[k1:v1 k2:v2]` (keys sorted);
//! - `<<.LabelValuesByName.key>>`: one value of the map, `<no value>` when the key is missing
//!   (Go's `missingkey=default`);
//! - `<<index .LabelValuesByName "key">>` (or `` `key` ``): one value, empty when missing (Go's
//!   `index` returns the zero value of a missing key);
//! - trim markers `<<- ` and ` ->>` (the marker and a space: the whitespace of the adjacent text
//!   is removed) and comments `<</* … */>>` (also `<<- /* … */ ->>`).
//!
//! Everything else Go accepts (`if`, `range`, `with`, `define`, `template`, `block`, `else`,
//! `end`, `break`, `continue`, variables, pipelines, parentheses, constants, the dot, every
//! function, fields of fields, unknown fields) is rejected by [`Template::parse`], which names
//! the action: `template action <<range .GroupBySlice>> is not supported (…)`.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

/// The fields a template may reference. Which ones a given template may use depends on where
/// it stands (the configuration checks that with [`Template::fields`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Field {
    /// `.Series`: the Prometheus series name (queries).
    Series,
    /// `.LabelMatchers`: the comma-joined label matchers of the request (queries).
    LabelMatchers,
    /// `.LabelValuesByName`: label → raw values joined by `|` (queries).
    LabelValuesByName,
    /// `.GroupBy`: the comma-joined group-by labels (queries).
    GroupBy,
    /// `.GroupBySlice`: the group-by labels as a list (queries).
    GroupBySlice,
    /// `.Group`: the API group, `.` and `-` replaced by `_` (`resources.template`).
    Group,
    /// `.Resource`: the singular resource (`resources.template`).
    Resource,
}

impl Field {
    /// Every field, in declaration order.
    pub const ALL: [Field; 7] = [
        Field::Series,
        Field::LabelMatchers,
        Field::LabelValuesByName,
        Field::GroupBy,
        Field::GroupBySlice,
        Field::Group,
        Field::Resource,
    ];

    /// The Go field name (`Series`).
    pub fn name(self) -> &'static str {
        match self {
            Field::Series => "Series",
            Field::LabelMatchers => "LabelMatchers",
            Field::LabelValuesByName => "LabelValuesByName",
            Field::GroupBy => "GroupBy",
            Field::GroupBySlice => "GroupBySlice",
            Field::Group => "Group",
            Field::Resource => "Resource",
        }
    }

    fn from_name(name: &str) -> Option<Field> {
        Field::ALL.into_iter().find(|f| f.name() == name)
    }
}

impl fmt::Display for Field {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, ".{}", self.name())
    }
}

/// The values a template is rendered with (Go's `queryTemplateArgs`, and `schema.GroupResource`
/// for `resources.template`). Fields a template does not use are ignored.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Args {
    /// `.Series`.
    pub series: String,
    /// `.LabelMatchers`.
    pub label_matchers: String,
    /// `.LabelValuesByName`.
    pub label_values_by_name: BTreeMap<String, String>,
    /// `.GroupBy`.
    pub group_by: String,
    /// `.GroupBySlice`.
    pub group_by_slice: Vec<String>,
    /// `.Group`.
    pub group: String,
    /// `.Resource`.
    pub resource: String,
}

impl Args {
    fn print(&self, field: Field, out: &mut String) {
        match field {
            Field::Series => out.push_str(&self.series),
            Field::LabelMatchers => out.push_str(&self.label_matchers),
            Field::GroupBy => out.push_str(&self.group_by),
            Field::Group => out.push_str(&self.group),
            Field::Resource => out.push_str(&self.resource),
            Field::GroupBySlice => {
                out.push('[');
                out.push_str(&self.group_by_slice.join(" "));
                out.push(']');
            }
            Field::LabelValuesByName => {
                out.push_str("map[");
                let pairs: Vec<String> =
                    self.label_values_by_name.iter().map(|(k, v)| format!("{k}:{v}")).collect();
                out.push_str(&pairs.join(" "));
                out.push(']');
            }
        }
    }
}

/// One piece of a parsed template.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    Text(String),
    Field(Field),
    /// `.LabelValuesByName.key`: `<no value>` when missing.
    MapKey(String),
    /// `index .LabelValuesByName "key"`: empty when missing.
    Index(String),
}

/// A parsed template; see the module documentation for the language.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    source: String,
    nodes: Vec<Node>,
}

/// Go's `isSpace` in `text/template/parse`.
fn is_space(c: u8) -> bool {
    matches!(c, b' ' | b'\t' | b'\r' | b'\n')
}

fn trim_space_end(s: &str) -> &str {
    s.trim_end_matches([' ', '\t', '\r', '\n'])
}

fn trim_space_start(s: &str) -> &str {
    s.trim_start_matches([' ', '\t', '\r', '\n'])
}

/// `-` then a space, right after `<<`.
fn has_left_trim_marker(s: &[u8]) -> bool {
    s.len() >= 2 && s[0] == b'-' && is_space(s[1])
}

/// A space then `-`, right before `>>`.
fn has_right_trim_marker(s: &[u8]) -> bool {
    s.len() >= 2 && is_space(s[0]) && s[1] == b'-'
}

/// Whether `s` starts with a right delimiter: `(found, with trim marker)`.
fn at_right_delim(s: &[u8]) -> (bool, bool) {
    if has_right_trim_marker(s) && s[2..].starts_with(b">>") {
        return (true, true);
    }
    (s.starts_with(b">>"), false)
}

/// A token inside an action.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Token {
    /// `.A.B`: a chain of field names (`.` alone is an empty chain).
    Fields(Vec<String>),
    Ident(String),
    Str(String),
    Variable,
    Pipe,
    Paren,
    Assign,
    Comma,
    Constant,
}

const SUPPORTED: &str =
    "only <<.Field>>, <<.LabelValuesByName.label>> and <<index .LabelValuesByName \"label\">> are";

/// A template that does not parse, or uses a construct that is not supported; `near` is the
/// start of the template from the action or comment at fault.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TemplateError {
    /// `<</*` without `*/`.
    #[error("unclosed comment {near}")]
    UnclosedComment {
        /// The template from the comment on.
        near: String,
    },
    /// `<</* … */` not followed by `>>`.
    #[error("comment ends before closing delimiter: {near}")]
    CommentBeforeDelimiter {
        /// The template from the comment on.
        near: String,
    },
    /// `<<` without `>>`.
    #[error("unclosed action {near}")]
    UnclosedAction {
        /// The template from the action on.
        near: String,
    },
    /// A `"` string without its end, or with an escape Go rejects.
    #[error("unterminated or invalid quoted string in {near}")]
    QuotedString {
        /// The template from the action on.
        near: String,
    },
    /// A `` ` `` string without its end.
    #[error("unterminated raw quoted string in {near}")]
    RawString {
        /// The template from the action on.
        near: String,
    },
    /// `<<>>`.
    #[error("empty template action <<{action}>>")]
    EmptyAction {
        /// The action's content.
        action: String,
    },
    /// An action other than a field or `index .LabelValuesByName "label"`.
    #[error("template action <<{action}>> is not supported ({why}; {SUPPORTED})")]
    Unsupported {
        /// The action's content.
        action: String,
        /// The construct.
        why: String,
    },
}

fn unsupported(action: &str, why: impl Into<String>) -> TemplateError {
    TemplateError::Unsupported { action: action.to_owned(), why: why.into() }
}

impl Template {
    /// Parses `text`; the error names the construct (`template action <<if .Series>> is not
    /// supported (…)`, `unclosed action <<.Series`).
    pub fn parse(text: &str) -> Result<Template, TemplateError> {
        let bytes = text.as_bytes();
        let mut nodes = Vec::new();
        let mut pos = 0;
        let mut trim_next = false;
        loop {
            let found = text[pos..].find("<<").map(|i| pos + i);
            let end = found.unwrap_or(text.len());
            let mut segment = &text[pos..end];
            if trim_next {
                segment = trim_space_start(segment);
            }
            let Some(open) = found else {
                push_text(&mut nodes, segment);
                break;
            };
            let mut at = open + 2;
            let left_trim = has_left_trim_marker(&bytes[at..]);
            if left_trim {
                segment = trim_space_end(segment);
                at += 2;
            }
            push_text(&mut nodes, segment);
            if bytes[at..].starts_with(b"/*") {
                let Some(close) = text[at + 2..].find("*/") else {
                    return Err(TemplateError::UnclosedComment { near: snippet(&text[open..]) });
                };
                let after = at + 2 + close + 2;
                let (delim, trim) = at_right_delim(&bytes[after..]);
                if !delim {
                    return Err(TemplateError::CommentBeforeDelimiter { near: snippet(&text[open..]) });
                }
                pos = after + if trim { 4 } else { 2 };
                trim_next = trim;
                continue;
            }
            let (tokens, action_end, inner_end, trim) = lex_action(text, at, open)?;
            let action = text[at..inner_end].trim_matches([' ', '\t', '\r', '\n']);
            nodes.push(parse_action(&tokens, action)?);
            pos = action_end;
            trim_next = trim;
        }
        Ok(Template { source: text.to_owned(), nodes })
    }

    /// The template as written.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The fields the template references (an `index` or key of `.LabelValuesByName` counts
    /// as that field).
    pub fn fields(&self) -> BTreeSet<Field> {
        self.nodes
            .iter()
            .filter_map(|n| match n {
                Node::Text(_) => None,
                Node::Field(f) => Some(*f),
                Node::MapKey(_) | Node::Index(_) => Some(Field::LabelValuesByName),
            })
            .collect()
    }

    /// Whether the template references `field`.
    pub fn uses(&self, field: Field) -> bool {
        self.fields().contains(&field)
    }

    /// Renders the template (never fails: every construct was checked at parse).
    pub fn render(&self, args: &Args) -> String {
        let mut out = String::with_capacity(self.source.len() + args.label_matchers.len());
        for node in &self.nodes {
            match node {
                Node::Text(text) => out.push_str(text),
                Node::Field(field) => args.print(*field, &mut out),
                Node::MapKey(key) => match args.label_values_by_name.get(key) {
                    Some(value) => out.push_str(value),
                    None => out.push_str("<no value>"),
                },
                Node::Index(key) => {
                    out.push_str(args.label_values_by_name.get(key).map_or("", String::as_str))
                }
            }
        }
        out
    }
}

impl fmt::Display for Template {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.source)
    }
}

fn push_text(nodes: &mut Vec<Node>, text: &str) {
    if !text.is_empty() {
        nodes.push(Node::Text(text.to_owned()));
    }
}

/// The start of `text`, for an error message.
fn snippet(text: &str) -> String {
    let cut: String = text.chars().take(40).collect();
    if cut.len() < text.len() { format!("{cut}…") } else { cut }
}

fn is_ident_char(c: char) -> bool {
    c == '_' || c.is_alphanumeric()
}

/// Lexes the action that starts at `at` (after `<<` and a trim marker): its tokens, the offset
/// after its `>>`, the offset where its content ends and whether it ends with a trim marker.
fn lex_action(text: &str, at: usize, open: usize) -> Result<(Vec<Token>, usize, usize, bool), TemplateError> {
    let bytes = text.as_bytes();
    let unclosed = || TemplateError::UnclosedAction { near: snippet(&text[open..]) };
    let mut tokens = Vec::new();
    let mut i = at;
    loop {
        let rest = &bytes[i..];
        if rest.is_empty() {
            return Err(unclosed());
        }
        if rest.starts_with(b">>") {
            return Ok((tokens, i + 2, i, false));
        }
        if is_space(rest[0]) {
            if rest[1..].starts_with(b"->>") {
                return Ok((tokens, i + 4, i, true));
            }
            i += 1;
            continue;
        }
        let c = text[i..].chars().next().unwrap_or('\0');
        match c {
            '.' => {
                let mut chain = Vec::new();
                while bytes.get(i) == Some(&b'.') {
                    let name: String = text[i + 1..].chars().take_while(|c| is_ident_char(*c)).collect();
                    i += 1 + name.len();
                    if name.is_empty() {
                        if !chain.is_empty() {
                            // `.Series.`: Go rejects the trailing dot.
                            tokens.push(Token::Constant);
                        }
                        break;
                    }
                    chain.push(name);
                }
                tokens.push(Token::Fields(chain));
            }
            '"' => {
                let (value, next) = lex_quoted(text, i)
                    .ok_or_else(|| TemplateError::QuotedString { near: snippet(&text[open..]) })?;
                tokens.push(Token::Str(value));
                i = next;
            }
            '`' => {
                let close = text[i + 1..]
                    .find('`')
                    .ok_or_else(|| TemplateError::RawString { near: snippet(&text[open..]) })?;
                tokens.push(Token::Str(text[i + 1..i + 1 + close].to_owned()));
                i += close + 2;
            }
            '$' => {
                let name: String = text[i + 1..].chars().take_while(|c| is_ident_char(*c)).collect();
                tokens.push(Token::Variable);
                i += 1 + name.len();
            }
            '|' => {
                tokens.push(Token::Pipe);
                i += 1;
            }
            '(' | ')' => {
                tokens.push(Token::Paren);
                i += 1;
            }
            ':' | '=' => {
                tokens.push(Token::Assign);
                i += 1;
            }
            ',' => {
                tokens.push(Token::Comma);
                i += 1;
            }
            c if c.is_alphabetic() || c == '_' => {
                let name: String = text[i..].chars().take_while(|c| is_ident_char(*c)).collect();
                i += name.len();
                tokens.push(Token::Ident(name));
            }
            _ => {
                // Numbers, character constants, signs and anything Go would reject: taken up
                // to the next space or delimiter, as one constant.
                let mut j = i + c.len_utf8();
                while j < bytes.len() && !is_space(bytes[j]) && !bytes[j..].starts_with(b">>") {
                    j += 1;
                }
                while !text.is_char_boundary(j) {
                    j += 1;
                }
                tokens.push(Token::Constant);
                i = j;
            }
        }
    }
}

/// A Go interpreted string literal at `start` (a `"`): its value and the offset after it.
fn lex_quoted(text: &str, start: usize) -> Option<(String, usize)> {
    let mut out = String::new();
    let mut chars = text[start + 1..].char_indices();
    while let Some((offset, c)) = chars.next() {
        match c {
            '"' => return Some((out, start + 1 + offset + 1)),
            '\n' => return None,
            '\\' => {
                let (_, escaped) = chars.next()?;
                match escaped {
                    '\\' => out.push('\\'),
                    '"' => out.push('"'),
                    'a' => out.push('\u{7}'),
                    'b' => out.push('\u{8}'),
                    'f' => out.push('\u{c}'),
                    'n' => out.push('\n'),
                    'r' => out.push('\r'),
                    't' => out.push('\t'),
                    'v' => out.push('\u{b}'),
                    'x' | 'u' | 'U' => {
                        let digits = match escaped {
                            'x' => 2,
                            'u' => 4,
                            _ => 8,
                        };
                        let hex: String = (0..digits).filter_map(|_| chars.next().map(|(_, c)| c)).collect();
                        if hex.len() != digits {
                            return None;
                        }
                        let code = u32::from_str_radix(&hex, 16).ok()?;
                        if escaped == 'x' && code > 0x7f {
                            // A raw byte: only ASCII keeps the string valid UTF-8 here.
                            return None;
                        }
                        out.push(char::from_u32(code)?);
                    }
                    _ => return None,
                }
            }
            c => out.push(c),
        }
    }
    None
}

/// Turns the tokens of one action into a node, or names why it is not supported.
fn parse_action(tokens: &[Token], action: &str) -> Result<Node, TemplateError> {
    let reject = |why: &str| Err(unsupported(action, why));
    if tokens.is_empty() {
        return Err(TemplateError::EmptyAction { action: action.to_owned() });
    }
    if tokens.contains(&Token::Pipe) {
        return reject("a pipeline");
    }
    if tokens.contains(&Token::Variable) {
        return reject("a variable");
    }
    if tokens.contains(&Token::Assign) || tokens.contains(&Token::Comma) {
        return reject("an assignment");
    }
    if let Some(Token::Ident(keyword)) = tokens.first()
        && matches!(
            keyword.as_str(),
            "if" | "range" | "with" | "define" | "template" | "block" | "else" | "end" | "break" | "continue"
        )
    {
        return reject(&format!("a {keyword} action"));
    }
    if tokens.contains(&Token::Paren) {
        return reject("a parenthesized expression");
    }
    match tokens {
        [Token::Fields(chain)] => field_node(chain).map_err(|why| unsupported(action, why)),
        [Token::Ident(index), Token::Fields(chain), Token::Str(key)] if index == "index" => {
            if chain.len() == 1 && chain[0] == Field::LabelValuesByName.name() {
                Ok(Node::Index(key.clone()))
            } else {
                reject("index is supported on .LabelValuesByName only")
            }
        }
        [Token::Ident(index), ..] if index == "index" => {
            reject("index takes .LabelValuesByName and one quoted label name")
        }
        [Token::Ident(word), ..] if matches!(word.as_str(), "true" | "false" | "nil") => reject("a constant"),
        [Token::Ident(function), ..] => reject(&format!("the function {function}")),
        [Token::Str(_) | Token::Constant, ..] => reject("a constant"),
        [Token::Fields(_), ..] => reject("arguments after a field"),
        _ => reject("an unexpected token"),
    }
}

/// A field chain as a node: `.Field`, or `.LabelValuesByName.key`; the error is the construct
/// that is not supported.
fn field_node(chain: &[String]) -> Result<Node, String> {
    let Some(first) = chain.first() else {
        return Err("the dot, the whole argument".to_owned());
    };
    let Some(field) = Field::from_name(first) else {
        let known: Vec<String> = Field::ALL.iter().map(ToString::to_string).collect();
        return Err(format!("unknown field .{first}; the fields are {}", known.join(", ")));
    };
    match (field, &chain[1..]) {
        (_, []) => Ok(Node::Field(field)),
        (Field::LabelValuesByName, [key]) => Ok(Node::MapKey(key.clone())),
        _ => Err(format!("a field of {field}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> Args {
        Args {
            series: "http_requests_total".into(),
            label_matchers: r#"namespace="ns",pod=~"a|b""#.into(),
            label_values_by_name: [("namespace", "ns"), ("pod", "a|b")]
                .into_iter()
                .map(|(k, v)| (k.to_owned(), v.to_owned()))
                .collect(),
            group_by: "pod,container".into(),
            group_by_slice: vec!["pod".into(), "container".into()],
            group: "apps".into(),
            resource: "deployment".into(),
        }
    }

    fn render(text: &str) -> String {
        Template::parse(text).unwrap().render(&args())
    }

    fn rejection(text: &str) -> String {
        Template::parse(text).unwrap_err().to_string()
    }

    #[test]
    fn fields_render_as_go_prints_them() {
        assert_eq!(
            render("sum(rate(<<.Series>>{<<.LabelMatchers>>,container!=\"POD\"}[2m])) by (<<.GroupBy>>)"),
            r#"sum(rate(http_requests_total{namespace="ns",pod=~"a|b",container!="POD"}[2m])) by (pod,container)"#
        );
        assert_eq!(render("<<.GroupBySlice>>"), "[pod container]");
        assert_eq!(render("<<.LabelValuesByName>>"), "map[namespace:ns pod:a|b]");
        assert_eq!(render("kube_<<.Group>>_<<.Resource>>"), "kube_apps_deployment");
        assert_eq!(render("<< .Series >>"), "http_requests_total");
    }

    #[test]
    fn empty_values_print_as_go_prints_them() {
        let t = Template::parse("<<.GroupBySlice>> <<.LabelValuesByName>> [<<.GroupBy>>]").unwrap();
        assert_eq!(t.render(&Args::default()), "[] map[] []");
    }

    #[test]
    fn index_of_a_missing_key_is_empty_and_a_missing_map_key_is_no_value() {
        assert_eq!(render(r#"<<index .LabelValuesByName "pod">>"#), "a|b");
        assert_eq!(render("<<index .LabelValuesByName `namespace`>>"), "ns");
        assert_eq!(render(r#"[<<index .LabelValuesByName "missing">>]"#), "[]");
        assert_eq!(render("<<.LabelValuesByName.pod>>"), "a|b");
        assert_eq!(render("<<.LabelValuesByName.missing>>"), "<no value>");
        assert_eq!(render(r#"<<index .LabelValuesByName "a\"b">>"#), "");
    }

    #[test]
    fn trim_markers_remove_adjacent_whitespace() {
        assert_eq!(render("sum(\n  <<- .Series ->>\n  )"), "sum(http_requests_total)");
        assert_eq!(render("a \t\n<<- .Series>> b"), "ahttp_requests_total b");
        assert_eq!(render("a <<.Series ->> \n b"), "a http_requests_totalb");
        // A minus without a space is not a trim marker (Go reads a number).
        assert!(rejection("a <<-.Series>>").contains("is not supported"));
        assert!(rejection("<<.Series->>").contains("is not supported"));
    }

    #[test]
    fn comments_render_nothing_and_may_trim() {
        assert_eq!(render("a<</* a comment >> with delimiters */>>b"), "ab");
        assert_eq!(render("a  <<- /* c\n spanning lines */ ->>  b"), "ab");
        assert!(rejection("<</* c */ .Series>>").starts_with("comment ends before closing delimiter"));
        assert!(rejection("<</* c").starts_with("unclosed comment"));
        // A comment must follow the delimiter directly, as in Go.
        assert!(rejection("<< /* c */>>").contains("is not supported"));
    }

    #[test]
    fn text_outside_actions_is_kept_verbatim() {
        assert_eq!(render("{{.Series}} >> x"), "{{.Series}} >> x");
        assert_eq!(render(""), "");
    }

    #[test]
    fn a_delimiter_inside_a_string_does_not_close_the_action() {
        assert_eq!(render(r#"<<index .LabelValuesByName ">>">>x"#), "x");
    }

    #[test]
    fn fields_reports_what_the_template_uses() {
        let t =
            Template::parse("<<.Series>>{<<.LabelMatchers>>} <<index .LabelValuesByName \"x\">>").unwrap();
        assert_eq!(
            t.fields().into_iter().collect::<Vec<_>>(),
            [Field::Series, Field::LabelMatchers, Field::LabelValuesByName]
        );
        assert!(t.uses(Field::Series));
        assert!(!t.uses(Field::GroupBy));
        assert!(Template::parse("x").unwrap().fields().is_empty());
    }

    #[test]
    fn control_actions_are_rejected_naming_the_action() {
        assert_eq!(
            rejection("sum(x) by (<<range .GroupBySlice>><<.>>,<<end>>)"),
            format!("template action <<range .GroupBySlice>> is not supported (a range action; {SUPPORTED})")
        );
        for (text, why) in [
            ("<<if .Series>>x<<end>>", "a if action"),
            ("<<with .Series>>x<<end>>", "a with action"),
            ("<<define \"x\">>y<<end>>", "a define action"),
            ("<<template \"x\">>", "a template action"),
            ("<<block \"x\" .>>y<<end>>", "a block action"),
            ("<<end>>", "a end action"),
            ("<<$x := .Series>>", "a variable"),
            ("<<.Series | printf \"%s\">>", "a pipeline"),
            ("<<printf \"%s\" .Series>>", "the function printf"),
            ("<<len .GroupBySlice>>", "the function len"),
            ("<<(.Series)>>", "a parenthesized expression"),
            ("<<.>>", "the dot, the whole argument"),
            ("<<.Foo>>", "unknown field .Foo"),
            ("<<.Series.Name>>", "a field of .Series"),
            ("<<.LabelValuesByName.a.b>>", "a field of .LabelValuesByName"),
            ("<<\"text\">>", "a constant"),
            ("<<3>>", "a constant"),
            ("<<true>>", "a constant"),
            ("<<index .GroupBySlice 0>>", "index takes .LabelValuesByName"),
            ("<<index .LabelValuesByName>>", "index takes .LabelValuesByName"),
            ("<<index .Series \"x\">>", "index is supported on .LabelValuesByName only"),
            ("<<.Series .GroupBy>>", "arguments after a field"),
        ] {
            let message = rejection(text);
            assert!(message.contains("is not supported"), "{text}: {message}");
            assert!(message.contains(why), "{text}: {message}");
        }
    }

    #[test]
    fn malformed_actions_are_rejected() {
        assert!(rejection("sum(<<.Series").starts_with("unclosed action <<.Series"));
        assert!(rejection("<<>>").starts_with("empty template action"));
        assert!(rejection("<<  >>").starts_with("empty template action"));
        assert!(rejection("<<.Series.>>").contains("is not supported"));
        assert!(rejection("<<index .LabelValuesByName \"x>>").contains("quoted string"));
        assert!(rejection("<<index .LabelValuesByName \"\\q\">>").contains("quoted string"));
    }
}
