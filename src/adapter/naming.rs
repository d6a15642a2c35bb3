//! Naming (prometheus-adapter's `metric_namer.go`): which discovered series a rule keeps
//! (`seriesFilters`, plus the implicit filter of `name.matches`) and the API name of each
//! (`name.matches` / `name.as`, expanded as Go's `Regexp.Expand` does).
//!
//! Go's `regexp` is RE2 and the `regex` crate accepts the same syntax; `MatchString` is
//! unanchored like [`Regex::is_match`]. One difference: Go's `\d`, `\w`, `\s` and `\b` are
//! ASCII while the `regex` crate's are Unicode, which only matters for names with non-ASCII
//! characters (classic Prometheus names have none).

use regex::{Captures, Regex};

/// A `seriesFilters` entry: `is` (the name must match) or `isNot` (it must not).
#[derive(Debug, Clone)]
pub(crate) struct SeriesFilter {
    regex: Regex,
    positive: bool,
}

impl SeriesFilter {
    /// An `is` filter.
    pub(crate) fn is(pattern: &str) -> Result<Self, RegexError> {
        Ok(Self { regex: compile(pattern)?, positive: true })
    }

    /// An `isNot` filter.
    pub(crate) fn is_not(pattern: &str) -> Result<Self, RegexError> {
        Ok(Self { regex: compile(pattern)?, positive: false })
    }

    /// Whether a series name passes the filter (an unanchored match, as Go's `MatchString`).
    pub(crate) fn passes(&self, series_name: &str) -> bool {
        self.regex.is_match(series_name) == self.positive
    }
}

/// A regular expression that does not compile.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid regex {pattern:?}: {reason}")]
pub(crate) struct RegexError {
    /// The expression.
    pub pattern: String,
    /// The `regex` crate's error, on one line.
    pub reason: String,
}

/// Compiles a Go (RE2) regular expression; the error is the `regex` crate's, on one line.
pub(crate) fn compile(pattern: &str) -> Result<Regex, RegexError> {
    Regex::new(pattern).map_err(|e| RegexError {
        pattern: pattern.to_owned(),
        reason: e.to_string().lines().last().unwrap_or_default().trim().to_owned(),
    })
}

/// Why a `name` section is rejected: the field (`matches` or `as`) and the reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameError {
    /// `matches` or `as`.
    pub field: &'static str,
    /// What is wrong.
    pub message: String,
}

/// A rule's `name` section, compiled: the API name of a series.
#[derive(Debug, Clone)]
pub(crate) struct NameMapping {
    matches: Regex,
    as_template: String,
}

impl NameMapping {
    /// `matches` (empty: `.*`) and `as` (empty: `$0` without capture group, `$1` with one, an
    /// error with more). An `as` that names a capture group `matches` does not have is an
    /// error too: Go would expand it to nothing, silently (`$1_per_second` names the group
    /// `1_per_second`; `${1}_per_second` is what was meant).
    pub(crate) fn new(matches: &str, as_template: &str) -> Result<Self, NameError> {
        let pattern = if matches.is_empty() { ".*" } else { matches };
        let regex = compile(pattern).map_err(|e| NameError { field: "matches", message: e.to_string() })?;
        let as_template = if as_template.is_empty() {
            match regex.captures_len() {
                1 => "$0".to_owned(),
                2 => "$1".to_owned(),
                n => {
                    return Err(NameError {
                        field: "as",
                        message: format!("required when name.matches has {} capture groups", n - 1),
                    });
                }
            }
        } else {
            as_template.to_owned()
        };
        for reference in references(&as_template) {
            let exists = match reference.number {
                Some(n) => n < regex.captures_len(),
                None => regex.capture_names().flatten().any(|name| name == reference.name),
            };
            if !exists {
                return Err(NameError {
                    field: "as",
                    message: format!(
                        "{} refers to capture group {:?}, which name.matches {:?} does not have \
                         (a $name takes every letter, digit and _ that follows: write ${{1}}_suffix, \
                         not $1_suffix)",
                        reference.written, reference.name, pattern
                    ),
                });
            }
        }
        Ok(Self { matches: regex, as_template })
    }

    /// The `as` template in force (with its default filled in).
    #[cfg(test)]
    pub(crate) fn as_template(&self) -> &str {
        &self.as_template
    }

    /// The API name of a series (`MetricNameForSeries`): `as` expanded with the first match of
    /// `matches` in the name; `None` when it does not match.
    pub(crate) fn api_name(&self, series_name: &str) -> Option<String> {
        let captures = self.matches.captures(series_name)?;
        Some(expand(&self.matches, &self.as_template, &captures))
    }
}

/// A `$` reference of an expansion template, as Go's `Regexp.Expand` reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Reference {
    /// As written (`$1`, `${name}`).
    pub written: String,
    /// The name between `$`/`${` and the end.
    pub name: String,
    /// The group number, when the name is one (digits, no leading zero).
    pub number: Option<usize>,
}

/// Go's `extract`: the reference at the start of `s` (just after a `$`), and the rest.
fn extract(s: &str) -> Option<(Reference, &str)> {
    let (brace, body) = match s.strip_prefix('{') {
        Some(body) => (true, body),
        None => (false, s),
    };
    // Go: unicode.IsLetter, unicode.IsDigit or '_' (the regex crate's `\w` without marks).
    let len: usize = body.chars().take_while(|c| c.is_alphanumeric() || *c == '_').map(char::len_utf8).sum();
    if len == 0 {
        return None;
    }
    let name = &body[..len];
    let mut rest = &body[len..];
    if brace {
        rest = rest.strip_prefix('}')?;
    }
    let number = if name.bytes().all(|b| b.is_ascii_digit())
        && (name.len() == 1 || !name.starts_with('0'))
        && name.len() <= 8
    {
        name.parse().ok()
    } else {
        None
    };
    let written_len = s.len() - rest.len();
    Some((Reference { written: format!("${}", &s[..written_len]), name: name.to_owned(), number }, rest))
}

/// The references of an expansion template (`$$` and malformed `$` are literal text).
pub(crate) fn references(template: &str) -> Vec<Reference> {
    let mut found = Vec::new();
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            rest = after;
            continue;
        }
        if let Some((reference, after)) = extract(rest) {
            found.push(reference);
            rest = after;
        }
    }
    found
}

/// Go's `Regexp.Expand`: `$1`, `${1}`, `$name`, `${name}` become the group's text (empty when
/// the group does not exist or did not take part in the match), `$$` a `$`, and a `$` that
/// starts no reference stays as it is. A `$name` takes the longest run of letters, digits and
/// `_`, so `$1_per_second` is the group named `1_per_second`.
pub(crate) fn expand(regex: &Regex, template: &str, captures: &Captures<'_>) -> String {
    let mut out = String::with_capacity(template.len() + 16);
    let mut rest = template;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        rest = &rest[at + 1..];
        if let Some(after) = rest.strip_prefix('$') {
            out.push('$');
            rest = after;
            continue;
        }
        let Some((reference, after)) = extract(rest) else {
            out.push('$');
            continue;
        };
        rest = after;
        let group = match reference.number {
            Some(n) => captures.get(n),
            None => regex
                .capture_names()
                .enumerate()
                .find(|(_, name)| *name == Some(reference.name.as_str()))
                .and_then(|(i, _)| captures.get(i)),
        };
        if let Some(group) = group {
            out.push_str(group.as_str());
        }
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn expanded(pattern: &str, template: &str, haystack: &str) -> String {
        let regex = Regex::new(pattern).unwrap();
        let captures = regex.captures(haystack).unwrap();
        expand(&regex, template, &captures)
    }

    #[test]
    fn is_and_is_not_filters_match_unanchored() {
        // regex_matcher_test.go
        let is = SeriesFilter::is("my_.*").unwrap();
        assert!(is.passes("my_label"));
        assert!(!is.passes("your_label"));
        let is_not = SeriesFilter::is_not("my_.*").unwrap();
        assert!(!is_not.passes("my_label"));
        assert!(is_not.passes("your_label"));
        // Unanchored, as Go's MatchString.
        assert!(SeriesFilter::is("_total").unwrap().passes("http_requests_total"));
        assert!(SeriesFilter::is("[").unwrap_err().to_string().starts_with("invalid regex \"[\""));
    }

    #[test]
    fn as_defaults_follow_the_number_of_capture_groups() {
        let none = NameMapping::new("", "").unwrap();
        assert_eq!(none.as_template(), "$0");
        assert_eq!(none.api_name("anything_total").as_deref(), Some("anything_total"));
        let one = NameMapping::new("^container_(.*)_seconds_total$", "").unwrap();
        assert_eq!(one.as_template(), "$1");
        assert_eq!(one.api_name("container_cpu_usage_seconds_total").as_deref(), Some("cpu_usage"));
        assert_eq!(one.api_name("container_memory_rss"), None);
        let two = NameMapping::new("^(.*)_(.*)_total$", "").unwrap_err();
        assert_eq!(two.field, "as");
        assert_eq!(two.message, "required when name.matches has 2 capture groups");
        let named = NameMapping::new("^(?P<base>.*)_total$", "").unwrap();
        assert_eq!(named.api_name("http_requests_total").as_deref(), Some("http_requests"));
    }

    #[test]
    fn the_walkthrough_rename_to_per_second() {
        // config.md / config-walkthrough.md
        let rename = NameMapping::new("^(.*)_total$", "${1}_per_second").unwrap();
        assert_eq!(rename.api_name("http_requests_total").as_deref(), Some("http_requests_per_second"));
        // Unanchored at the start: the first match of the pattern.
        let unanchored = NameMapping::new("(.*)_total", "${1}_per_second").unwrap();
        assert_eq!(unanchored.api_name("a_total_total").as_deref(), Some("a_total_per_second"));
        // A constant name (sample-config.yaml's cheesy_goodness).
        let constant = NameMapping::new("", "cheesy_goodness").unwrap();
        assert_eq!(constant.api_name("cheddar").as_deref(), Some("cheesy_goodness"));
    }

    #[test]
    fn expand_reads_references_as_go_does() {
        let p = r"^(?P<first>[a-z]+)_(\w+)$";
        for (template, want) in [
            ("$1-$2", "ab-cd"),
            ("${1}x", "abx"),
            ("$first/${first}", "ab/ab"),
            ("$0", "ab_cd"),
            ("$$1", "$1"),
            ("cost$", "cost$"),
            ("${1", "${1"),
            ("$-", "$-"),
            // The longest name: `$1_per_second` is the group named `1_per_second`, which does
            // not exist, so Go expands it to nothing.
            ("$1_per_second", ""),
            ("$1x", ""),
            // Leading zeros make a name, not a number.
            ("$01", ""),
            // A group that does not exist, or did not take part, expands to nothing.
            ("[$9]", "[]"),
        ] {
            assert_eq!(expanded(p, template, "ab_cd"), want, "{template}");
        }
        assert_eq!(expanded("^(a)|(b)$", "[$1][$2]", "b"), "[][b]");
    }

    #[test]
    fn as_naming_a_missing_group_is_rejected_at_load() {
        let e = NameMapping::new("^(.*)_total$", "$1_per_second").unwrap_err();
        assert_eq!(e.field, "as");
        assert!(
            e.message.starts_with("$1_per_second refers to capture group \"1_per_second\""),
            "{}",
            e.message
        );
        assert!(NameMapping::new("^(.*)_total$", "$2").unwrap_err().message.contains("\"2\""));
        assert!(NameMapping::new("^(.*)_total$", "${name}").is_err());
        assert!(NameMapping::new("^(?P<name>.*)_total$", "${name}_rate").is_ok());
        assert!(NameMapping::new("^(.*)_total$", "$$1_literal").is_ok());
        let invalid = NameMapping::new("^(.*_total$", "").unwrap_err();
        assert_eq!(invalid.field, "matches");
        assert!(invalid.message.starts_with("invalid regex"));
    }

    #[test]
    fn references_lists_what_a_template_names() {
        let names: Vec<String> = references("$1 ${x}y $$ $z_ $").into_iter().map(|r| r.written).collect();
        assert_eq!(names, ["$1", "${x}", "$z_"]);
    }
}
