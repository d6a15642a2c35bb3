//! Which upstream serves pod, container and node CPU and memory (`--resource-source`), decided
//! once at start ([`ResourceSourceChoice`]), and the slot its Prometheus queries are read
//! through ([`PlanSlot`]), filled once the adapter configuration is loaded.

use std::sync::Arc;

use crate::config::ResourceSource;
use crate::sources::resources::{ResourceQuery, ResourceQueryError, ResourceQueryPlan};

/// Which source serves pod, container and node CPU and memory (metrics.k8s.io and
/// PodMetricsSummary alike), and why: decided once at start, logged, never switched by a
/// reload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ResourceSourceChoice {
    /// The source.
    pub(crate) source: ResourceSource,
    /// Whether `--resource-source` (or `PERCOLATOR_RESOURCE_SOURCE`) was given.
    pub(crate) explicit: bool,
    /// Why, for the start-up log: `resource source: SOURCE (REASON)`.
    pub(crate) reason: String,
    /// What the Prometheus source falls back to without resourceRules.
    config_queries: &'static str,
}

impl ResourceSourceChoice {
    /// `--resource-source` when given; otherwise `prometheus` when the `--adapter-config` file
    /// (`adapter`: its path and whether it has `resourceRules`) has resourceRules, as in
    /// prometheus-adapter where they mean Prometheus serves metrics.k8s.io; `kubelet` else.
    /// `config_given`: whether `--config` is (only for the wording of the reason).
    pub(crate) fn resolve(
        flag: Option<ResourceSource>,
        adapter: Option<(&std::path::Path, bool)>,
        config_given: bool,
    ) -> Self {
        let config_queries = if config_given {
            "the resourceQueries of --config"
        } else {
            "the default resourceQueries (no --config)"
        };
        let rules = adapter
            .filter(|(_, has_rules)| *has_rules)
            .map(|(path, _)| format!("the resourceRules of --adapter-config {}", path.display()));
        let (source, reason) = match (flag, rules) {
            (None, None) => (ResourceSource::Kubelet, "the default".to_owned()),
            (None, Some(rules)) => {
                (ResourceSource::Prometheus, format!("{rules}; --resource-source not given"))
            }
            (Some(ResourceSource::Kubelet), None) => {
                (ResourceSource::Kubelet, "--resource-source=kubelet given explicitly".to_owned())
            }
            (Some(ResourceSource::Kubelet), Some(rules)) => (
                ResourceSource::Kubelet,
                format!("--resource-source=kubelet given explicitly; {rules} are unused"),
            ),
            (Some(ResourceSource::Prometheus), None) => (
                ResourceSource::Prometheus,
                format!("--resource-source=prometheus given explicitly; {config_queries}"),
            ),
            (Some(ResourceSource::Prometheus), Some(rules)) => (
                ResourceSource::Prometheus,
                format!("--resource-source=prometheus given explicitly; {rules}"),
            ),
        };
        Self { source, explicit: flag.is_some(), reason, config_queries }
    }

    /// What a reload that adds (`has_rules`) or removes the resourceRules of `path` means,
    /// and whether it deserves a warning: the source stays; with Prometheus the queries follow
    /// the file (`AdapterResourceQueries` falls back to `resourceQueries:` without rules).
    pub(crate) fn on_rules_change(&self, path: &std::path::Path, has_rules: bool) -> (bool, String) {
        let file = format!("--adapter-config {}", path.display());
        match (self.source, has_rules) {
            (ResourceSource::Kubelet, true) if self.explicit => (
                false,
                format!("resourceRules added to {file}: unused, --resource-source=kubelet given explicitly"),
            ),
            (ResourceSource::Kubelet, true) => (
                true,
                format!(
                    "resourceRules added to {file}: restart percolator to read CPU and memory from Prometheus with them (the resource source is decided at start: still kubelet)"
                ),
            ),
            (ResourceSource::Kubelet, false) => {
                (false, format!("resourceRules removed from {file}: unused, the resource source is kubelet"))
            }
            (ResourceSource::Prometheus, true) => {
                (false, format!("resourceRules added to {file}: CPU and memory now from them"))
            }
            (ResourceSource::Prometheus, false) => {
                let restart = if self.explicit {
                    ""
                } else {
                    "; after a restart, the kubelets (--resource-source not given)"
                };
                (
                    true,
                    format!(
                        "resourceRules removed from {file}: CPU and memory now from {}{restart}",
                        self.config_queries
                    ),
                )
            }
        }
    }
}

/// A [`ResourceQueryPlan`] set once the adapter configuration is loaded (the resource source
/// is built before it).
pub(crate) struct PlanSlot(std::sync::RwLock<Arc<dyn ResourceQueryPlan>>);

impl PlanSlot {
    pub(crate) fn new(plan: Arc<dyn ResourceQueryPlan>) -> Self {
        Self(std::sync::RwLock::new(plan))
    }

    pub(crate) fn set(&self, plan: Arc<dyn ResourceQueryPlan>) {
        *self.0.write().unwrap_or_else(std::sync::PoisonError::into_inner) = plan;
    }

    fn get(&self) -> Arc<dyn ResourceQueryPlan> {
        self.0.read().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
    }
}

impl ResourceQueryPlan for PlanSlot {
    fn generation(&self) -> u64 {
        self.get().generation()
    }

    fn pods(&self, namespace: &str) -> Result<ResourceQuery, ResourceQueryError> {
        self.get().pods(namespace)
    }

    fn nodes(&self, nodes: &[&str]) -> Result<ResourceQuery, ResourceQueryError> {
        self.get().nodes(nodes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--resource-source` given or not × the adapter file absent, without or with
    /// resourceRules: the source and the reason the start-up log gives.
    #[test]
    fn the_resource_source_is_the_flag_else_prometheus_for_resource_rules_else_kubelet() {
        use ResourceSource::{Kubelet, Prometheus};
        let file = std::path::Path::new("/etc/adapter/config.yaml");
        let rules = "the resourceRules of --adapter-config /etc/adapter/config.yaml";
        for (flag, adapter, source, reason) in [
            (None, None, Kubelet, "the default".to_owned()),
            (None, Some((file, false)), Kubelet, "the default".to_owned()),
            (None, Some((file, true)), Prometheus, format!("{rules}; --resource-source not given")),
            (Some(Kubelet), None, Kubelet, "--resource-source=kubelet given explicitly".to_owned()),
            (
                Some(Kubelet),
                Some((file, false)),
                Kubelet,
                "--resource-source=kubelet given explicitly".to_owned(),
            ),
            (
                Some(Kubelet),
                Some((file, true)),
                Kubelet,
                format!("--resource-source=kubelet given explicitly; {rules} are unused"),
            ),
            (
                Some(Prometheus),
                None,
                Prometheus,
                "--resource-source=prometheus given explicitly; the resourceQueries of --config".to_owned(),
            ),
            (
                Some(Prometheus),
                Some((file, false)),
                Prometheus,
                "--resource-source=prometheus given explicitly; the resourceQueries of --config".to_owned(),
            ),
            (
                Some(Prometheus),
                Some((file, true)),
                Prometheus,
                format!("--resource-source=prometheus given explicitly; {rules}"),
            ),
        ] {
            let choice = ResourceSourceChoice::resolve(flag, adapter, true);
            assert_eq!(
                (choice.source, choice.reason.as_str()),
                (source, reason.as_str()),
                "{flag:?} {adapter:?}"
            );
            assert_eq!(choice.explicit, flag.is_some());
        }
        let without_config = ResourceSourceChoice::resolve(Some(Prometheus), None, false);
        assert_eq!(
            without_config.reason,
            "--resource-source=prometheus given explicitly; the default resourceQueries (no --config)"
        );
    }

    /// A reload never switches the source; what it changes is logged (a warning when a
    /// restart would change something, or the queries left are the fallback).
    #[test]
    fn a_reload_adding_or_removing_resource_rules_says_what_it_changes() {
        use ResourceSource::{Kubelet, Prometheus};
        let file = std::path::Path::new("a.yaml");
        let change = |flag, at_start, has_rules| {
            ResourceSourceChoice::resolve(flag, Some((file, at_start)), true).on_rules_change(file, has_rules)
        };
        let m = |warn: bool, text: &str| (warn, text.to_owned());
        for (flag, at_start, has_rules, expected) in [
            (
                None,
                false,
                true,
                m(
                    true,
                    "resourceRules added to --adapter-config a.yaml: restart percolator to read CPU and memory from Prometheus with them (the resource source is decided at start: still kubelet)",
                ),
            ),
            (
                Some(Kubelet),
                true,
                true,
                m(
                    false,
                    "resourceRules added to --adapter-config a.yaml: unused, --resource-source=kubelet given explicitly",
                ),
            ),
            (
                Some(Kubelet),
                true,
                false,
                m(
                    false,
                    "resourceRules removed from --adapter-config a.yaml: unused, the resource source is kubelet",
                ),
            ),
            (
                None,
                true,
                false,
                m(
                    true,
                    "resourceRules removed from --adapter-config a.yaml: CPU and memory now from the resourceQueries of --config; after a restart, the kubelets (--resource-source not given)",
                ),
            ),
            (
                Some(Prometheus),
                true,
                false,
                m(
                    true,
                    "resourceRules removed from --adapter-config a.yaml: CPU and memory now from the resourceQueries of --config",
                ),
            ),
            (
                Some(Prometheus),
                false,
                true,
                m(false, "resourceRules added to --adapter-config a.yaml: CPU and memory now from them"),
            ),
        ] {
            assert_eq!(change(flag, at_start, has_rules), expected, "{flag:?} {at_start} {has_rules}");
        }
    }
}
