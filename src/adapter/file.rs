//! The prometheus-adapter configuration file as written (`pkg/config/config.go`): the YAML
//! keys, their shapes and the adapter's strict unmarshalling (an unknown key is an error).
//! What the values mean, and which are valid, is [`super::config`]'s.
//!
//! Like `gopkg.in/yaml.v2`, a `null` reads as the zero value, a scalar reads as text (as
//! written) where text is expected, `namespaced` takes YAML 1.1 booleans (`yes`, `off`, …) and a
//! key twice in one mapping is an error (the file is read with [`crate::config::yaml`]).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::Deserialize;
use serde::de::{self, Visitor};

/// The whole file (`MetricsDiscoveryConfig`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ConfigFile {
    /// `rules`: custom metrics.
    #[serde(default, deserialize_with = "null_default")]
    pub rules: Vec<DiscoveryRule>,
    /// `externalRules`: external metrics.
    #[serde(default, deserialize_with = "null_default")]
    pub external_rules: Vec<DiscoveryRule>,
    /// `resourceRules`: `metrics.k8s.io` (absent: not served by the file).
    #[serde(default)]
    pub resource_rules: Option<ResourceRules>,
}

/// One of `rules` or `externalRules` (`DiscoveryRule`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct DiscoveryRule {
    /// `seriesQuery`: the selector passed to Prometheus' series API.
    #[serde(default, deserialize_with = "text")]
    pub series_query: String,
    /// `seriesFilters`: regexes on the series name.
    #[serde(default, deserialize_with = "null_default")]
    pub series_filters: Vec<RegexFilter>,
    /// `resources`: association of labels and resources.
    #[serde(default, deserialize_with = "null_default")]
    pub resources: ResourceMapping,
    /// `name`: the API name of a series.
    #[serde(default, deserialize_with = "null_default")]
    pub name: NameMapping,
    /// `metricsQuery`: the query template.
    #[serde(default, deserialize_with = "text")]
    pub metrics_query: String,
}

/// One `seriesFilters` entry (`RegexFilter`): exactly one of `is` and `isNot`.
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct RegexFilter {
    /// `is`: the name must match.
    #[serde(default, deserialize_with = "text")]
    pub is: String,
    /// `isNot`: the name must not match.
    #[serde(default, deserialize_with = "text")]
    pub is_not: String,
}

/// `resources` (`ResourceMapping`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResourceMapping {
    /// `template`: label of a group-resource (`<<.Group>>`, `<<.Resource>>`).
    #[serde(default, deserialize_with = "text")]
    pub template: String,
    /// `overrides`: label → group-resource (a label twice is an error, as in yaml.v2's strict
    /// mode: [`crate::config::yaml`] rejects a duplicate key).
    #[serde(default, deserialize_with = "null_default")]
    pub overrides: BTreeMap<String, GroupResource>,
    /// `namespaced`: whether an external query carries the request's namespace (default true).
    #[serde(default, deserialize_with = "yaml11_bool")]
    pub namespaced: Option<bool>,
}

/// A group-resource of `overrides` (`GroupResource`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct GroupResource {
    /// `group`: empty for the core group, or any group with the resource.
    #[serde(default, deserialize_with = "text")]
    pub group: String,
    /// `resource`: plural or singular.
    #[serde(default, deserialize_with = "text")]
    pub resource: String,
}

/// `name` (`NameMapping`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct NameMapping {
    /// `matches`: regex on the series name (default `.*`).
    #[serde(default, deserialize_with = "text")]
    pub matches: String,
    /// `as`: the API name, with `$` references to the groups of `matches`.
    #[serde(default, rename = "as", deserialize_with = "text")]
    pub as_: String,
}

/// `resourceRules` (`ResourceRules`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResourceRules {
    /// `cpu`.
    #[serde(default, deserialize_with = "null_default")]
    pub cpu: ResourceRule,
    /// `memory`.
    #[serde(default, deserialize_with = "null_default")]
    pub memory: ResourceRule,
    /// `window`: a Prometheus duration (`30s`, `1m`, `1h30m`, `1d`); absent: none.
    #[serde(default, deserialize_with = "prometheus_duration")]
    pub window: Option<Duration>,
}

/// `resourceRules.cpu` or `resourceRules.memory` (`ResourceRule`).
#[derive(Debug, Clone, PartialEq, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
pub(crate) struct ResourceRule {
    /// `containerQuery`: the containers of pods of one namespace.
    #[serde(default, deserialize_with = "text")]
    pub container_query: String,
    /// `nodeQuery`: nodes.
    #[serde(default, deserialize_with = "text")]
    pub node_query: String,
    /// `resources`: labels of pods, namespaces and nodes.
    #[serde(default, deserialize_with = "null_default")]
    pub resources: ResourceMapping,
    /// `containerLabel`: the label of the container name.
    #[serde(default, deserialize_with = "text")]
    pub container_label: String,
}

/// `null` reads as the default, as yaml.v2 reads it into Go's zero value.
fn null_default<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Deserialize<'de> + Default,
{
    Option::<T>::deserialize(d).map(Option::unwrap_or_default)
}

/// Text, or any scalar as its text as written (yaml.v2 reads `5`, `yes` or `0x1F` into a string
/// field as they are spelled); `null` is empty. A visitor, so that an error is reported at the
/// field's own path.
fn text<'de, D: serde::Deserializer<'de>>(d: D) -> Result<String, D::Error> {
    struct Text;

    impl<'de> Visitor<'de> for Text {
        type Value = String;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("text")
        }

        fn visit_none<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }

        fn visit_unit<E: de::Error>(self) -> Result<String, E> {
            Ok(String::new())
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<String, D2::Error> {
            d.deserialize_str(self)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
            Ok(v.to_owned())
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<String, E> {
            Ok(v.to_string())
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<String, E> {
            Ok(v.to_string())
        }
    }

    d.deserialize_option(Text)
}

/// A YAML 1.1 boolean, as yaml.v2 reads one (`true`, `yes`, `on`, `y` and their opposites, in
/// yaml.v2's spellings): the scalar's text is matched here, whatever YAML schema the reader
/// resolves plain scalars with.
fn yaml11_bool<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<bool>, D::Error> {
    struct Yaml11Bool;

    impl<'de> Visitor<'de> for Yaml11Bool {
        type Value = Option<bool>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a boolean")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_str(self)
        }

        fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
            Ok(Some(v))
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            match v {
                "y" | "Y" | "yes" | "Yes" | "YES" | "true" | "True" | "TRUE" | "on" | "On" | "ON" => {
                    Ok(Some(true))
                }
                "n" | "N" | "no" | "No" | "NO" | "false" | "False" | "FALSE" | "off" | "Off" | "OFF" => {
                    Ok(Some(false))
                }
                _ => Err(E::custom(format!("invalid boolean {v:?}"))),
            }
        }
    }

    d.deserialize_option(Yaml11Bool)
}

/// An optional Prometheus duration, parsed in the visitor so that an error is reported at the
/// field's own path.
fn prometheus_duration<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
    struct PromDuration;

    impl<'de> Visitor<'de> for PromDuration {
        type Value = Option<Duration>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration such as 30s, 1m or 1h30m")
        }

        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }

        fn visit_some<D2: serde::Deserializer<'de>>(self, d: D2) -> Result<Self::Value, D2::Error> {
            d.deserialize_any(self)
        }

        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            parse_prometheus_duration(v).map(Some).map_err(E::custom)
        }

        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            self.visit_str(&v.to_string())
        }

        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            self.visit_str(&v.to_string())
        }
    }

    d.deserialize_option(PromDuration)
}

/// A Prometheus duration that does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum DurationError {
    /// The empty string.
    #[error("empty duration string")]
    Empty,
    /// Not numbers with units, largest first, each once.
    #[error("not a valid duration string: {text:?} (e.g. 30s, 5m, 1h30m, 1d)")]
    Invalid {
        /// The duration as written.
        text: String,
    },
    /// A unit other than `y`, `w`, `d`, `h`, `m`, `s` and `ms`.
    #[error("unknown unit {unit:?} in duration {text:?}")]
    UnknownUnit {
        /// The unit.
        unit: String,
        /// The duration as written.
        text: String,
    },
    /// Longer than Go's `time.Duration` holds.
    #[error("duration out of range")]
    OutOfRange,
}

/// Parses a Prometheus duration as `model.ParseDuration` does: `0`, or whole numbers with
/// units from largest to smallest, each at most once (`y`, `w`, `d`, `h`, `m`, `s`, `ms`; a year
/// is 365 days): `30s`, `1h30m`, `1d`, `500ms`.
pub(crate) fn parse_prometheus_duration(text: &str) -> Result<Duration, DurationError> {
    const UNITS: [(&str, u64); 7] = [
        ("y", 365 * 24 * 3_600_000),
        ("w", 7 * 24 * 3_600_000),
        ("d", 24 * 3_600_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
        ("ms", 1),
    ];
    let invalid = || DurationError::Invalid { text: text.to_owned() };
    match text {
        "0" => return Ok(Duration::ZERO),
        "" => return Err(DurationError::Empty),
        _ => {}
    }
    let mut rest = text;
    let mut millis: u64 = 0;
    let mut last_unit = None;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(invalid());
        }
        let value: u64 = rest[..digits].parse().map_err(|_| invalid())?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(|b| !b.is_ascii_digit()).count();
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let Some(position) = UNITS.iter().position(|(name, _)| *name == unit) else {
            return Err(if unit.is_empty() {
                invalid()
            } else {
                DurationError::UnknownUnit { unit: unit.to_owned(), text: text.to_owned() }
            });
        };
        if last_unit.is_some_and(|last| position <= last) {
            return Err(invalid());
        }
        last_unit = Some(position);
        millis = value
            .checked_mul(UNITS[position].1)
            .and_then(|ms| millis.checked_add(ms))
            .filter(|ms| *ms <= i64::MAX as u64 / 1_000_000)
            .ok_or(DurationError::OutOfRange)?;
    }
    Ok(Duration::from_millis(millis))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<ConfigFile, String> {
        crate::config::yaml::from_str(text).map_err(|e| e.to_string())
    }

    #[test]
    fn prometheus_durations_parse_as_model_parse_duration() {
        let ok = |s: &str| parse_prometheus_duration(s).unwrap();
        assert_eq!(ok("30s"), Duration::from_secs(30));
        assert_eq!(ok("2m"), Duration::from_secs(120));
        assert_eq!(ok("1h30m"), Duration::from_secs(5400));
        assert_eq!(ok("1d"), Duration::from_secs(86_400));
        assert_eq!(ok("1w"), Duration::from_secs(7 * 86_400));
        assert_eq!(ok("1y"), Duration::from_secs(365 * 86_400));
        assert_eq!(ok("500ms"), Duration::from_millis(500));
        assert_eq!(ok("1m30s500ms"), Duration::from_millis(90_500));
        assert_eq!(ok("0"), Duration::ZERO);
        assert_eq!(ok("0s"), Duration::ZERO);
        for bad in
            ["", "30", "1.5m", "30m1h", "1m1m", "-1m", "1 m", "1M", "m", "5x", "1h 30m", "999999999999y"]
        {
            assert!(parse_prometheus_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            parse_prometheus_duration("5x").unwrap_err().to_string(),
            "unknown unit \"x\" in duration \"5x\""
        );
    }

    #[test]
    fn the_documented_keys_parse() {
        let file = parse(
            r#"
rules:
- seriesQuery: 'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}'
  seriesFilters:
  - isNot: "^container_.*_seconds_total$"
  - is: "^http_"
  resources:
    template: "kube_<<.Resource>>"
    overrides:
      kubernetes_namespace: {resource: "namespace"}
      microservice: {group: "apps", resource: "deployment"}
  name:
    matches: "^(.*)_total"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
externalRules:
- seriesQuery: '{__name__="queue_depth",topic!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    namespaced: false
resourceRules:
  cpu:
    containerQuery: cq
    nodeQuery: nq
    resources:
      overrides:
        instance: {resource: node}
    containerLabel: container
  memory:
    containerQuery: mq
  window: 1m
"#,
        )
        .unwrap();
        let rule = &file.rules[0];
        assert_eq!(rule.series_filters[0].is_not, "^container_.*_seconds_total$");
        assert_eq!(rule.series_filters[1].is, "^http_");
        assert_eq!(rule.resources.template, "kube_<<.Resource>>");
        assert_eq!(rule.resources.overrides["microservice"].group, "apps");
        assert_eq!(rule.name.as_, "${1}_per_second");
        assert_eq!(file.external_rules[0].resources.namespaced, Some(false));
        let resource_rules = file.resource_rules.unwrap();
        assert_eq!(resource_rules.window, Some(Duration::from_secs(60)));
        assert_eq!(resource_rules.cpu.container_label, "container");
        assert_eq!(resource_rules.memory.node_query, "");
    }

    #[test]
    fn unknown_keys_are_errors_naming_their_path() {
        let e = parse("rules:\n- seriesQuery: x\n  name: {matches: a, mathces: b}\n").unwrap_err();
        assert!(e.starts_with("rules[0].name: unknown field `mathces`"), "{e}");
        let e = parse("rules: []\nresourceRule: {}\n").unwrap_err();
        assert!(e.contains("unknown field `resourceRule`"), "{e}");
        let e = parse("rules:\n- resources: {overrides: {pod: {resource: pod, version: v1}}}\n").unwrap_err();
        assert!(e.contains("unknown field `version`"), "{e}");
        let e = parse("resourceRules: {window: 1.5m}").unwrap_err();
        assert!(e.starts_with("resourceRules.window: unknown unit \".\" in duration \"1.5m\""), "{e}");
        let e = parse("rules: [{resources: {namespaced: maybe}}]").unwrap_err();
        assert!(e.starts_with("rules[0].resources.namespaced: invalid boolean \"maybe\""), "{e}");
        let e = parse("rules: [{resources: {overrides: {pod: {resource: pod}, pod: {resource: node}}}}]")
            .unwrap_err();
        assert_eq!(
            e,
            "rules[0].resources.overrides: duplicate mapping key `pod` is not allowed here at line 1 column 56"
        );
        let e = parse("rules:\n- seriesQuery: a\n  metricsQuery: b\n  seriesQuery: c\n").unwrap_err();
        assert_eq!(e, "rules[0]: duplicate mapping key `seriesQuery` is not allowed here at line 4 column 3");
        let e = parse("rules: [{seriesQuery: [a]}]").unwrap_err();
        assert_eq!(e, "rules[0].seriesQuery: expected string scalar at line 1 column 23");
    }

    #[test]
    fn yaml11_booleans_are_booleans() {
        for (value, namespaced) in [
            ("yes", true),
            ("off", false),
            ("on", true),
            ("no", false),
            ("Y", true),
            ("n", false),
            ("TRUE", true),
            ("False", false),
            ("'yes'", true),
        ] {
            let file = parse(&format!("externalRules:\n- resources:\n    namespaced: {value}\n")).unwrap();
            assert_eq!(file.external_rules[0].resources.namespaced, Some(namespaced), "{value}");
        }
        for value in ["1", "yEs", "maybe", "[yes]"] {
            let e = parse(&format!("externalRules: [{{resources: {{namespaced: {value}}}}}]")).unwrap_err();
            assert!(e.starts_with("externalRules[0].resources.namespaced: "), "{value}: {e}");
        }
    }

    #[test]
    fn scalars_read_as_text_as_written() {
        let file =
            parse("rules:\n- seriesQuery: yes\n  name: {matches: 0x1F, as: 1.50}\n  metricsQuery: off\n")
                .unwrap();
        assert_eq!(file.rules[0].series_query, "yes");
        assert_eq!(file.rules[0].name.matches, "0x1F");
        assert_eq!(file.rules[0].name.as_, "1.50");
        assert_eq!(file.rules[0].metrics_query, "off");
    }

    #[test]
    fn nulls_scalars_and_yaml11_booleans_read_as_yaml_v2_reads_them() {
        let file = parse(
            "rules:\n- seriesQuery: ~\n  seriesFilters: ~\n  resources: {namespaced: yes}\n  name: {as: 5}\n\
             externalRules: ~\nresourceRules: ~\n",
        )
        .unwrap();
        assert_eq!(file.rules[0].series_query, "");
        assert!(file.rules[0].series_filters.is_empty());
        assert_eq!(file.rules[0].resources.namespaced, Some(true));
        assert_eq!(file.rules[0].name.as_, "5");
        assert!(file.external_rules.is_empty());
        assert!(file.resource_rules.is_none());
    }
}
