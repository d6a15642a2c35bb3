//! The registry of built-in kinds: the one list the server builds the served kinds from, and
//! the check of the query file's kind sections (each kind's overridable queries, by field).
//! A kind's file exports its [`Builtin`]; one line of [`BUILTIN`] registers it.

use std::sync::Arc;

pub use super::{Builtin, QuerySpec};

use super::cached::CachedKind;
use super::{Kinds, ServedKind, Sources};
use crate::cache::CacheSettings;
use crate::config::{Invalid, QueryFile};
use crate::sources::prometheus::validate_template;

/// Every built-in kind, in discovery order.
pub static BUILTIN: &[&Builtin] = &[&super::pod_metrics_summary::KIND, &super::cafe_brew_stats::KIND];

/// Checks the kind sections of `file`: each names a built-in kind, each field one of its
/// queries, and each template is valid (keeps `SCOPE`, parses).
pub fn check_queries(file: &QueryFile) -> Result<(), Invalid> {
    for (section, queries) in &file.kind_queries {
        let Some(kind) = BUILTIN.iter().find(|k| k.section == section) else {
            let known: Vec<&str> = BUILTIN.iter().map(|k| k.section).collect();
            return Err(Invalid::new(
                section.clone(),
                format!(
                    "unknown field; expected window, externalMetrics or a kind's section ({})",
                    known.join(", ")
                ),
            ));
        };
        for (field, template) in queries {
            let name = format!("{section}.{field}");
            if !kind.queries.iter().any(|q| q.field == field) {
                let known: Vec<&str> = kind.queries.iter().map(|q| q.field).collect();
                return Err(Invalid::new(
                    name,
                    format!("unknown query; expected one of {}", known.join(", ")),
                ));
            }
            validate_template(template).map_err(|e| Invalid::new(name, e.to_string()))?;
        }
    }
    Ok(())
}

/// Builds every built-in kind from `sources`, each behind its cache.
pub fn build(sources: &Sources, cache: &CacheSettings) -> Kinds {
    BUILTIN
        .iter()
        .map(|kind| {
            let cached = CachedKind::new((kind.build)(sources.clone()), cache, sources.config.clone());
            Arc::new(cached) as Arc<dyn ServedKind>
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(yaml: &str) -> Result<(), String> {
        let check: crate::config::Check = Arc::new(|file: &mut QueryFile| check_queries(file));
        QueryFile::from_yaml(yaml, "f.yaml", &check).map(|_| ()).map_err(|e| e.to_string())
    }

    #[test]
    fn default_templates_are_valid() {
        for kind in BUILTIN {
            for spec in kind.queries {
                validate_template(spec.default)
                    .unwrap_or_else(|e| panic!("{}.{}: {e}", kind.section, spec.field));
            }
        }
    }

    #[test]
    fn names_are_unique() {
        for (i, kind) in BUILTIN.iter().enumerate() {
            for other in &BUILTIN[..i] {
                assert_ne!(kind.info.plural, other.info.plural);
                assert_ne!(kind.info.kind, other.info.kind);
                assert_ne!(kind.section, other.section);
            }
        }
    }

    #[test]
    fn overrides_are_checked_with_the_field_named() {
        check("podMetricsSummary:\n  requests: sum by (namespace, pod) (x{SCOPE})\n").unwrap();
        check("cafeBrewStats:\n  lastBrewed: max by (namespace, cafe) (y{SCOPE})\n").unwrap();
        let err = check("podMetricsSummary:\n  request: x{SCOPE}\n").unwrap_err();
        assert_eq!(
            err,
            "--config f.yaml: field podMetricsSummary.request: unknown query; expected one of requests, errors"
        );
        let err = check("podMetricsSummary:\n  requests: sum(rate(x[5m]))\n").unwrap_err();
        assert!(err.starts_with("--config f.yaml: field podMetricsSummary.requests: "), "{err}");
        assert!(err.contains("would read every namespace"), "{err}");
        let err = check("bogus:\n  a: b\n").unwrap_err();
        assert!(err.starts_with("--config f.yaml: field bogus: unknown field"), "{err}");
    }
}
