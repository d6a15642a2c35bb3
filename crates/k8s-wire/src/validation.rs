//! Name and label validation with apimachinery's rules and error wording
//! (`apimachinery/pkg/util/validation/validation.go`): `IsQualifiedName` for label keys,
//! `IsValidLabelValue` for label values, `IsDNS1123Label` for namespaces and
//! `IsDNS1123Subdomain` for object names. Used by the selector parser and by the resource
//! endpoints to validate path segments before anything reaches an upstream (PromQL).

/// One of apimachinery's name formats: the regex its error quotes, the error's message and
/// examples (`RegexError`), and the longest value it accepts.
struct Syntax {
    regex: &'static str,
    message: &'static str,
    examples: &'static [&'static str],
    max_len: usize,
}

const QUALIFIED_NAME: Syntax = Syntax {
    regex: "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]",
    message: "must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
    examples: &["MyName", "my.name", "123-abc"],
    max_len: 63,
};
const LABEL_VALUE: Syntax = Syntax {
    regex: "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?",
    message: "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
    examples: &["MyValue", "my_value", "12345"],
    max_len: 63,
};
const DNS1123_LABEL: Syntax = Syntax {
    regex: "[a-z0-9]([-a-z0-9]*[a-z0-9])?",
    message: "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
    examples: &["my-name", "123-abc"],
    max_len: 63,
};
const DNS1123_SUBDOMAIN: Syntax = Syntax {
    regex: "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*",
    message: "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
    examples: &["example.com"],
    max_len: 253,
};

impl Syntax {
    /// apimachinery's `RegexError` (its double space before `or` included).
    fn regex_error(&self) -> String {
        let mut out = format!("{} (e.g. ", self.message);
        for (i, example) in self.examples.iter().enumerate() {
            if i > 0 {
                out.push_str(" or ");
            }
            out.push('\'');
            out.push_str(example);
            out.push_str("', ");
        }
        out.push_str("regex used for validation is '");
        out.push_str(self.regex);
        out.push_str("')");
        out
    }

    /// The errors of a value's length: none, or that it is longer than `max_len`.
    fn length_errors(&self, value: &str) -> Vec<String> {
        if value.len() > self.max_len { vec![max_len_error(self.max_len)] } else { Vec::new() }
    }
}

fn max_len_error(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn is_alnum(b: u8) -> bool {
    b.is_ascii_alphanumeric()
}

/// `([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`, anchored.
fn matches_qualified_name(s: &str) -> bool {
    let b = s.as_bytes();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            is_alnum(first)
                && is_alnum(last)
                && b.iter().all(|&c| is_alnum(c) || c == b'-' || c == b'_' || c == b'.')
        }
        _ => false,
    }
}

/// `[a-z0-9]([-a-z0-9]*[a-z0-9])?`, anchored.
fn matches_dns1123_label(s: &str) -> bool {
    let b = s.as_bytes();
    let lower_alnum = |c: u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    match (b.first(), b.last()) {
        (Some(&first), Some(&last)) => {
            lower_alnum(first) && lower_alnum(last) && b.iter().all(|&c| lower_alnum(c) || c == b'-')
        }
        _ => false,
    }
}

fn matches_dns1123_subdomain(s: &str) -> bool {
    s.split('.').all(matches_dns1123_label)
}

/// `validation.IsQualifiedName`: a label key or field name, `[prefix/]name`.
pub fn is_qualified_name(value: &str) -> Vec<String> {
    let mut errs = Vec::new();
    let parts: Vec<&str> = value.split('/').collect();
    let name = match parts.as_slice() {
        [name] => *name,
        [prefix, name] => {
            if prefix.is_empty() {
                errs.push("prefix part must be non-empty".to_owned());
            } else {
                errs.extend(is_dns1123_subdomain(prefix).into_iter().map(|m| format!("prefix part {m}")));
            }
            *name
        }
        _ => {
            errs.push(format!(
                "a qualified name {} with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')",
                QUALIFIED_NAME.regex_error()
            ));
            return errs;
        }
    };
    if name.is_empty() {
        errs.push("name part must be non-empty".to_owned());
    } else if name.len() > QUALIFIED_NAME.max_len {
        errs.push(format!("name part {}", max_len_error(QUALIFIED_NAME.max_len)));
    }
    if !matches_qualified_name(name) {
        errs.push(format!("name part {}", QUALIFIED_NAME.regex_error()));
    }
    errs
}

/// `validation.IsValidLabelValue`. Rejects every character PromQL would need escaped
/// (`"`, `\`, `}`, newlines), so a valid label value is safe inside a PromQL string.
pub fn is_valid_label_value(value: &str) -> Vec<String> {
    let mut errs = LABEL_VALUE.length_errors(value);
    if !value.is_empty() && !matches_qualified_name(value) {
        errs.push(LABEL_VALUE.regex_error());
    }
    errs
}

/// `validation.IsDNS1123Label`: a namespace name.
pub fn is_dns1123_label(value: &str) -> Vec<String> {
    let mut errs = DNS1123_LABEL.length_errors(value);
    if !matches_dns1123_label(value) {
        if matches_dns1123_subdomain(value) {
            errs.push("must not contain dots".to_owned());
        } else {
            errs.push(DNS1123_LABEL.regex_error());
        }
    }
    errs
}

/// `validation.IsDNS1123Subdomain`: an object (pod) name.
pub fn is_dns1123_subdomain(value: &str) -> Vec<String> {
    let mut errs = DNS1123_SUBDOMAIN.length_errors(value);
    if !matches_dns1123_subdomain(value) {
        errs.push(DNS1123_SUBDOMAIN.regex_error());
    }
    errs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qualified_names() {
        for ok in ["app", "a", "A.b-c_d", "example.com/app", "une-tasse-de.cafe/cafe", "k8s.io/x1"] {
            assert!(is_qualified_name(ok).is_empty(), "{ok}");
        }
        for bad in ["", "-a", "a-", "a b", "a\"b", "/a", "Example.com/a", "a/b/c", "a/", "a}"] {
            assert!(!is_qualified_name(bad).is_empty(), "{bad}");
        }
        assert!(!is_qualified_name(&"a".repeat(64)).is_empty());
        assert!(is_qualified_name(&"a".repeat(63)).is_empty());
    }

    #[test]
    fn qualified_name_messages() {
        assert_eq!(
            is_qualified_name("a/b/c"),
            vec!["a qualified name must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]') with an optional DNS subdomain prefix and '/' (e.g. 'example.com/MyName')".to_owned()]
        );
        assert_eq!(is_qualified_name("/a"), vec!["prefix part must be non-empty".to_owned()]);
        assert_eq!(
            is_qualified_name("a/"),
            vec![
                "name part must be non-empty".to_owned(),
                "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyName',  or 'my.name',  or '123-abc', regex used for validation is '([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]')".to_owned()
            ]
        );
    }

    #[test]
    fn label_values() {
        for ok in ["", "x", "My_value-1.2", &"a".repeat(63)] {
            assert!(is_valid_label_value(ok).is_empty(), "{ok}");
        }
        for bad in ["\"", "a\"b", "a}", "a\\b", "a\nb", "-a", "a b", "é", &"a".repeat(64)] {
            assert!(!is_valid_label_value(bad).is_empty(), "{bad:?}");
        }
        assert_eq!(
            is_valid_label_value("a\"b"),
            vec!["a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character (e.g. 'MyValue',  or 'my_value',  or '12345', regex used for validation is '(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?')".to_owned()]
        );
    }

    #[test]
    fn dns_labels_and_subdomains() {
        assert!(is_dns1123_label("kube-system").is_empty());
        assert_eq!(is_dns1123_label("a.b"), vec!["must not contain dots".to_owned()]);
        assert!(!is_dns1123_label("Foo").is_empty());
        assert!(!is_dns1123_label("").is_empty());
        assert!(!is_dns1123_label(&"a".repeat(64)).is_empty());
        assert!(is_dns1123_subdomain("web-7d4b9-x2x4z").is_empty());
        assert!(is_dns1123_subdomain("a.b.c").is_empty());
        assert!(!is_dns1123_subdomain("a..b").is_empty());
        assert!(!is_dns1123_subdomain("A").is_empty());
        assert!(!is_dns1123_subdomain("a/b").is_empty());
        assert!(!is_dns1123_subdomain("").is_empty());
    }
}
