//! Reading the YAML of configuration files with `serde-saphyr`, the same way everywhere, as
//! the Go components of Kubernetes and their extension servers read theirs (`yaml.v2`):
//!
//! - YAML 1.1 booleans, as the Go readers (`yaml.v2`) take them: `yes`, `no`, `on`, `off`, `y`, `n` are booleans where a boolean is expected.
//! - A key twice in one mapping is an error (`yaml.v2`'s strict mode, which extension servers
//!   use, rejects it too), where it is, whatever the target type.
//! - The size of a document is bounded (serde-saphyr's budget: at most 250,000 nodes, 1,000,000
//!   parser events, 50,000 aliases and 50,000 anchors, nesting 64 deep), and so is alias
//!   expansion (at most 1,000,000 replayed events, aliases nested 64 deep): an alias bomb is
//!   rejected instead of expanded.
//! - Merge keys (`<<: *defaults`) are expanded, explicit keys winning over merged ones, as
//!   `yaml.v2` does; many aliases of one anchor are fine (only their expansion is bounded).
//! - `null`, `~` are the text they spell where text is expected, as in the Go readers.
//! - An error names the key path, what is wrong and where:
//!   `rules[0].resources.namespaced: invalid boolean "maybe" at line 3 column 17`.

use std::borrow::Cow;
use std::fmt::Write as _;

use serde::de::DeserializeOwned;
use serde_path_to_error::Segment;
use serde_saphyr::{
    DuplicateKeyPolicy, Localizer, Location, MessageFormatter, SnippetMode, UserMessageFormatter,
};

/// A YAML document that cannot be read into its type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct YamlError {
    /// The key path of the value at fault (`rules[0].name`), empty at the top.
    pub path: String,
    /// What is wrong, and where (`… at line 3 column 9`).
    pub message: String,
}

/// The reading options: YAML 1.1 booleans, duplicate keys rejected, the default budget and
/// alias limits (see the module's documentation), no source snippet in messages (they are
/// one line, in a log or a flag error).
fn options() -> serde_saphyr::Options {
    // Many aliases of one anchor (`resources: *podns` in every rule) are an ordinary adapter
    // file, not an attack: the expansion limits bound what aliases cost.
    let mut budget = serde_saphyr::budget::Budget::default();
    budget.enforce_alias_anchor_ratio = false;
    serde_saphyr::options! {
        strict_booleans: false,
        duplicate_keys: DuplicateKeyPolicy::Error,
        with_snippet: false,
        budget: Some(budget),
        // As the Go readers do, `name: null` is the text "null" where text is expected
        // (`Option` fields still read it as absent).
        null_as_string: true,
    }
}

/// Positions as `at line L column C`.
struct Positions;

impl Localizer for Positions {
    fn attach_location<'a>(&self, base: Cow<'a, str>, loc: Location) -> Cow<'a, str> {
        if loc == Location::UNKNOWN {
            base
        } else {
            Cow::Owned(format!("{base} at line {} column {}", loc.line(), loc.column()))
        }
    }
}

/// Reads one YAML document (an empty one is `null`: read it into an `Option` to accept it).
pub fn from_str<T: DeserializeOwned>(text: &str) -> Result<T, YamlError> {
    let mut path = String::new();
    serde_saphyr::with_deserializer_from_str_with_options(text, options(), |deserializer| {
        serde_path_to_error::deserialize(deserializer).map_err(|e| {
            let mut segments: Vec<&Segment> = e.path().iter().collect();
            // An unknown key is reported at the mapping that holds it, as a missing one is:
            // the key being read is the last segment, left out.
            if let (Some(field), Some(Segment::Map { key })) = (unknown_field(e.inner()), segments.last())
                && key == field
            {
                segments.pop();
            }
            path = key_path(segments);
            e.into_inner()
        })
    })
    .map_err(|e| {
        let formatter = UserMessageFormatter.with_localizer(&Positions);
        let message = e.render_with_options(serde_saphyr::render_options! {
            formatter: &formatter as &dyn MessageFormatter,
            snippets: SnippetMode::Off,
        });
        YamlError { path, message }
    })
}

/// The key a `deny_unknown_fields` type refused, when that is the error (under the alias and
/// snippet wrappers serde-saphyr may put around it).
fn unknown_field(mut error: &serde_saphyr::Error) -> Option<&str> {
    loop {
        match error {
            serde_saphyr::Error::AliasError { error: inner, .. }
            | serde_saphyr::Error::WithSnippet { error: inner, .. } => error = inner,
            serde_saphyr::Error::SerdeUnknownField { field, .. } => return Some(field),
            _ => return None,
        }
    }
}

/// `rules[0].resources.overrides`: keys joined by dots, indexes in brackets; the key being
/// read when a mapping's key was at fault (a duplicate) is left out.
fn key_path<'a>(segments: impl IntoIterator<Item = &'a Segment>) -> String {
    let mut text = String::new();
    for segment in segments {
        match segment {
            Segment::Seq { index } => {
                let _ = write!(text, "[{index}]");
            }
            Segment::Map { key } | Segment::Enum { variant: key } => {
                if !text.is_empty() {
                    text.push('.');
                }
                text.push_str(key);
            }
            Segment::Unknown => {}
        }
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde::Deserialize;

    use super::*;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Item {
        name: String,
        #[serde(default)]
        on: Option<bool>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Doc {
        items: Vec<Item>,
        #[serde(default)]
        labels: BTreeMap<String, String>,
    }

    fn error(text: &str) -> String {
        from_str::<Doc>(text).unwrap_err().to_string()
    }

    #[test]
    fn yaml_1_1_booleans_are_booleans() {
        let doc: Doc =
            from_str("items:\n- {name: a, on: yes}\n- {name: b, on: off}\n- {name: c, on: N}\n").unwrap();
        let on: Vec<Option<bool>> = doc.items.iter().map(|i| i.on).collect();
        assert_eq!(on, [Some(true), Some(false), Some(false)]);
    }

    #[test]
    fn errors_name_the_key_path_what_and_where() {
        assert_eq!(
            error("items:\n- name: a\n  on: maybe\n"),
            "items[0].on: invalid boolean at line 3 column 7"
        );
        assert_eq!(
            error("items:\n- {name: a, nmae: b}\n"),
            "items[0]: unknown field `nmae`, expected one of name, on at line 2 column 13"
        );
        // The unknown key is left out of the path by what the error is, not by its text: a key
        // with a dot (which the old text match cut at the dot) or at the top.
        assert_eq!(
            error("items:\n- {name: a, x.y: b}\n"),
            "items[0]: unknown field `x.y`, expected one of name, on at line 2 column 13"
        );
        assert_eq!(
            error("items: []\nitem: 1\n"),
            "unknown field `item`, expected one of items, labels at line 2 column 1"
        );
        assert_eq!(error("items:\n- {}\n"), "items[0]: missing field `name` at line 2 column 3");
        assert_eq!(error("items: 5\n"), "items: expected sequence start at line 1 column 8");
        assert_eq!(error("items: [\n"), "items: unclosed bracket '[' at line 1 column 8");
    }

    #[test]
    fn duplicate_keys_are_rejected_where_they_are() {
        assert_eq!(
            error("items: []\nlabels:\n  a: x\n  a: y\n"),
            "labels: duplicate mapping key `a` is not allowed here at line 4 column 3"
        );
        assert_eq!(
            error("items: []\nitems: []\n"),
            "duplicate mapping key `items` is not allowed here at line 2 column 1"
        );
    }

    #[test]
    fn alias_expansion_is_bounded() {
        let mut text = "a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n".to_owned();
        for i in 1..9 {
            let aliases = vec![format!("*a{}", i - 1); 10].join(", ");
            text.push_str(&format!("a{i}: &a{i} [{aliases}]\n"));
        }
        let e = from_str::<BTreeMap<String, serde_json::Value>>(&text).unwrap_err().to_string();
        assert!(e.contains("YAML document too large or too complex"), "{e}");
    }

    /// An adapter file that names one anchor in every rule (150 aliases of one anchor) and
    /// merges defaults with `<<` reads as `yaml.v2` reads it.
    #[test]
    fn many_aliases_of_one_anchor_and_merge_keys_are_ordinary_yaml() {
        let mut text = "defaults: &defaults {name: d, on: yes}
items:
"
        .to_owned();
        for i in 0..150 {
            text.push_str(&format!(
                "- {{<<: *defaults, name: n{i}}}
"
            ));
        }
        let doc = from_str::<BTreeMap<String, serde_json::Value>>(&text).unwrap();
        let items = doc["items"].as_array().unwrap();
        assert_eq!(items.len(), 150);
        assert_eq!(items[149], serde_json::json!({"name": "n149", "on": true}));
        let typed: Doc = from_str(
            &text
                .replacen("defaults: &defaults {name: d, on: yes}\n", "", 1)
                .replace("items:\n", "items:\n- &defaults {name: d, on: yes}\n"),
        )
        .unwrap();
        assert_eq!(typed.items[150], Item { name: "n149".to_owned(), on: Some(true) });
    }

    #[test]
    fn null_is_text_where_text_is_expected() {
        let doc: Doc = from_str("items:\n- {name: null}\n- {name: ~, on: null}\n").unwrap();
        assert_eq!(doc.items[0], Item { name: "null".to_owned(), on: None });
        assert_eq!(doc.items[1], Item { name: "~".to_owned(), on: None });
    }

    #[test]
    fn an_empty_document_is_null() {
        assert_eq!(from_str::<Option<Doc>>("").unwrap(), None);
        assert_eq!(from_str::<Option<Doc>>("# nothing\n").unwrap(), None);
    }
}
