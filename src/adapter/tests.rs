//! Tests of the whole core: files as adapter users write them (the adapter's documentation
//! and test expectations, in percolator's terms), rejections, discovery and query building.

use std::collections::BTreeMap;
use std::time::Duration;

use super::*;
use discovery::MissingSeries;
use k8s_wire::GroupResource;
use k8s_wire::LabelSelector;

fn load(text: &str) -> AdapterConfig {
    AdapterConfig::from_yaml(text, "a.yaml").unwrap_or_else(|e| panic!("{e}"))
}

fn rejection(text: &str) -> String {
    match AdapterConfig::from_yaml(text, "a.yaml") {
        Ok(_) => panic!("accepted:\n{text}"),
        Err(e) => e.to_string(),
    }
}

fn series(name: &str, labels: &[(&str, &str)]) -> Series {
    let mut s: Series = labels.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    s.insert("__name__".to_owned(), name.to_owned());
    s
}

fn gr(group: &str, resource: &str) -> GroupResource {
    GroupResource::new(group, resource)
}

fn everything() -> LabelSelector {
    LabelSelector::everything()
}

/// A rule that is valid, to which each rejection test adds one mistake.
const RULE: &str = r#"
- seriesQuery: '{__name__=~"^http_.*",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: "namespace"}
      pod: {resource: "pod"}
  name:
    matches: "^(.*)_total$"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"#;

/// The rules of the adapter's former built-in configuration (its `config-gen` default, rate
/// interval 1m, label prefix `kube_`), as adapter users still ship them.
const DEFAULT_RULES: &str = r#"
rules:
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: "^container_(.*)_seconds_total$"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[1m])) by (<<.GroupBy>>)'
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: "^container_.*_seconds_total$"}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: "^container_(.*)_total$"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[1m])) by (<<.GroupBy>>)'
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: [{isNot: "^container_.*_total$"}]
  resources:
    overrides:
      namespace: {resource: namespace}
      pod: {resource: pod}
  name: {matches: "^container_(.*)$"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>,container!="POD"}) by (<<.GroupBy>>)'
- seriesQuery: '{kube_namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: ".*_total$"}]
  resources: {template: "kube_<<.Resource>>"}
  metricsQuery: 'sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)'
- seriesQuery: '{kube_namespace!="",__name__!~"^container_.*"}'
  seriesFilters: [{isNot: ".*_seconds_total"}]
  name: {matches: "^(.*)_total$"}
  resources: {template: "kube_<<.Resource>>"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
- seriesQuery: '{kube_namespace!="",__name__!~"^container_.*"}'
  name: {matches: "^(.*)_seconds_total$"}
  resources: {template: "kube_<<.Resource>>"}
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)'
"#;

/// What Prometheus lists for the two series queries of [`DEFAULT_RULES`] (the series of the
/// adapter's series registry test).
fn default_series() -> BTreeMap<String, Vec<Series>> {
    let container = [("pod", "somepod"), ("namespace", "somens"), ("container", "somecont")];
    BTreeMap::from([
        (
            r#"{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}"#.to_owned(),
            vec![
                series("container_some_time_seconds_total", &container),
                series("container_some_count_total", &container),
                series("container_some_usage", &container),
            ],
        ),
        (
            r#"{kube_namespace!="",__name__!~"^container_.*"}"#.to_owned(),
            vec![
                series("node_gigawatts", &[("kube_node", "somenode")]),
                series("service_proxy_packets", &[("kube_service", "somesvc"), ("kube_namespace", "somens")]),
                series(
                    "ingress_hits_total",
                    &[
                        ("kube_ingress", "someingress"),
                        ("kube_service", "somesvc"),
                        ("kube_pod", "backend1"),
                        ("kube_namespace", "somens"),
                    ],
                ),
                series(
                    "ingress_hits_total",
                    &[
                        ("kube_ingress", "someingress"),
                        ("kube_service", "somesvc"),
                        ("kube_pod", "backend2"),
                        ("kube_namespace", "somens"),
                    ],
                ),
                series("volume_claims_total", &[("kube_persistentvolume", "somepv")]),
                series(
                    "work_queue_wait_seconds_total",
                    &[("kube_deployment", "somedep"), ("kube_namespace", "somens")],
                ),
                series("node_fan_seconds_total", &[("kube_node", "somenode")]),
            ],
        ),
    ])
}

#[test]
fn the_default_rules_discover_what_the_adapter_lists() {
    let config = load(DEFAULT_RULES);
    let metrics = custom_metrics(&config.rules, &default_series()).unwrap();
    let listed: Vec<(String, String, bool)> =
        metrics.iter().map(|m| (m.name.clone(), m.resource.to_string(), m.namespaced)).collect();
    let expected = [
        ("ingress_hits", "ingresses.networking.k8s.io", true),
        ("ingress_hits", "namespaces", false),
        ("ingress_hits", "pods", true),
        ("ingress_hits", "services", true),
        ("node_fan", "nodes", false),
        ("node_gigawatts", "nodes", false),
        ("service_proxy_packets", "namespaces", false),
        ("service_proxy_packets", "services", true),
        ("some_count", "namespaces", false),
        ("some_count", "pods", true),
        ("some_time", "namespaces", false),
        ("some_time", "pods", true),
        ("some_usage", "namespaces", false),
        ("some_usage", "pods", true),
        ("volume_claims", "persistentvolumes", false),
        ("work_queue_wait", "deployments.apps", true),
        ("work_queue_wait", "namespaces", false),
    ];
    let expected: Vec<(String, String, bool)> =
        expected.iter().map(|(n, r, ns)| ((*n).to_owned(), (*r).to_owned(), *ns)).collect();
    assert_eq!(listed, expected);
}

/// The query of a discovered metric, as the custom metrics API would build it.
fn custom_query(
    config: &AdapterConfig,
    metrics: &[CustomMetric],
    name: &str,
    resource: &GroupResource,
    namespace: Option<&str>,
    selector: &str,
    names: &[&str],
) -> String {
    let metric = metrics
        .iter()
        .find(|m| m.name == name && m.resource == *resource)
        .unwrap_or_else(|| panic!("{name} on {resource} not discovered"));
    config.rules[metric.rule]
        .query(
            &metric.series_name,
            resource,
            namespace,
            &LabelSelector::parse(selector).unwrap(),
            Some(names),
        )
        .unwrap()
}

#[test]
fn the_default_rules_build_the_adapters_queries() {
    let config = load(DEFAULT_RULES);
    let metrics = custom_metrics(&config.rules, &default_series()).unwrap();
    let q = |name: &str, resource: GroupResource, namespace: Option<&str>, selector: &str, names: &[&str]| {
        custom_query(&config, &metrics, name, &resource, namespace, selector, names)
    };
    let pods = || gr("", "pods");
    assert_eq!(
        q("some_usage", pods(), Some("somens"), "", &["somepod1", "somepod2"]),
        r#"sum(container_some_usage{namespace="somens",pod=~"somepod1|somepod2",container!="POD"}) by (pod)"#
    );
    assert_eq!(
        q("some_count", pods(), Some("somens"), "", &["somepod1", "somepod2"]),
        r#"sum(rate(container_some_count_total{namespace="somens",pod=~"somepod1|somepod2",container!="POD"}[1m])) by (pod)"#
    );
    assert_eq!(
        q("some_time", pods(), Some("somens"), "", &["somepod1", "somepod2"]),
        r#"sum(rate(container_some_time_seconds_total{namespace="somens",pod=~"somepod1|somepod2",container!="POD"}[1m])) by (pod)"#
    );
    assert_eq!(
        q("ingress_hits", gr("", "services"), Some("somens"), "", &["somesvc"]),
        r#"sum(rate(ingress_hits_total{kube_namespace="somens",kube_service="somesvc"}[1m])) by (kube_service)"#
    );
    assert_eq!(
        q("ingress_hits", gr("", "services"), Some("somens"), "param1=value1", &["somesvc"]),
        r#"sum(rate(ingress_hits_total{param1="value1",kube_namespace="somens",kube_service="somesvc"}[1m])) by (kube_service)"#
    );
    assert_eq!(
        q("ingress_hits", gr("networking.k8s.io", "ingresses"), Some("somens"), "", &["someingress"]),
        r#"sum(rate(ingress_hits_total{kube_namespace="somens",kube_ingress="someingress"}[1m])) by (kube_ingress)"#
    );
    assert_eq!(
        q("ingress_hits", pods(), Some("somens"), "", &["somepod"]),
        r#"sum(rate(ingress_hits_total{kube_namespace="somens",kube_pod="somepod"}[1m])) by (kube_pod)"#
    );
    assert_eq!(
        q("service_proxy_packets", gr("", "services"), Some("somens"), "", &["somesvc"]),
        r#"sum(service_proxy_packets{kube_namespace="somens",kube_service="somesvc"}) by (kube_service)"#
    );
    assert_eq!(
        q("work_queue_wait", gr("apps", "deployments"), Some("somens"), "", &["somedep"]),
        r#"sum(rate(work_queue_wait_seconds_total{kube_namespace="somens",kube_deployment="somedep"}[1m])) by (kube_deployment)"#
    );
    assert_eq!(
        q("node_gigawatts", gr("", "nodes"), None, "", &["somenode"]),
        r#"sum(node_gigawatts{kube_node="somenode"}) by (kube_node)"#
    );
    assert_eq!(
        q("volume_claims", gr("", "persistentvolumes"), None, "", &["somepv"]),
        r#"sum(rate(volume_claims_total{kube_persistentvolume="somepv"}[1m])) by (kube_persistentvolume)"#
    );
    assert_eq!(
        q("node_fan", gr("", "nodes"), None, "", &["somenode"]),
        r#"sum(rate(node_fan_seconds_total{kube_node="somenode"}[1m])) by (kube_node)"#
    );
    // A namespace's own value: the namespace is the object.
    assert_eq!(
        q("some_usage", gr("", "namespaces"), None, "", &["somens"]),
        r#"sum(container_some_usage{namespace="somens",container!="POD"}) by (namespace)"#
    );
}

/// The configuration walkthrough's rule (per-pod HTTP requests, `_total` → `_per_second`).
const WALKTHROUGH: &str = r#"
rules:
- seriesQuery: 'http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}'
  resources:
    overrides:
      kubernetes_namespace: {resource: "namespace"}
      kubernetes_pod_name: {resource: "pod"}
  name:
    matches: "^(.*)_total"
    as: "${1}_per_second"
  metricsQuery: 'sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)'
"#;

#[test]
fn the_walkthrough_serves_pods_and_namespaces() {
    let config = load(WALKTHROUGH);
    let listed = BTreeMap::from([(
        r#"http_requests_total{kubernetes_namespace!="",kubernetes_pod_name!=""}"#.to_owned(),
        vec![
            series(
                "http_requests_total",
                &[
                    ("method", "GET"),
                    ("kubernetes_namespace", "production"),
                    ("kubernetes_pod_name", "frontend-server-abcd-0123"),
                ],
            ),
            series(
                "http_requests_total",
                &[
                    ("method", "POST"),
                    ("kubernetes_namespace", "production"),
                    ("kubernetes_pod_name", "frontend-server-abcd-4567"),
                ],
            ),
        ],
    )]);
    let metrics = custom_metrics(&config.rules, &listed).unwrap();
    assert_eq!(
        metrics,
        [
            CustomMetric {
                name: "http_requests_per_second".into(),
                resource: gr("", "namespaces"),
                namespaced: false,
                series_name: "http_requests_total".into(),
                rule: 0,
            },
            CustomMetric {
                name: "http_requests_per_second".into(),
                resource: gr("", "pods"),
                namespaced: true,
                series_name: "http_requests_total".into(),
                rule: 0,
            },
        ]
    );
    assert_eq!(
        custom_query(
            &config,
            &metrics,
            "http_requests_per_second",
            &gr("", "pods"),
            Some("production"),
            "",
            &["frontend-server-abcd-0123", "frontend-server-abcd-4567"],
        ),
        r#"sum(rate(http_requests_total{kubernetes_namespace="production",kubernetes_pod_name=~"frontend-server-abcd-0123|frontend-server-abcd-4567"}[2m])) by (kubernetes_pod_name)"#
    );
    // Pods picked from the inventory: the namespace scopes the query, no regex of names.
    let rule = &config.rules[0];
    assert_eq!(
        rule.query::<&str>("http_requests_total", &gr("", "pods"), Some("production"), &everything(), None)
            .unwrap(),
        r#"sum(rate(http_requests_total{kubernetes_namespace="production"}[2m])) by (kubernetes_pod_name)"#
    );
    // Request values are escaped, whatever they are.
    assert_eq!(
        rule.query("http_requests_total", &gr("", "pods"), Some("a\"b"), &everything(), Some(&["x.y", "z"]))
            .unwrap(),
        r#"sum(rate(http_requests_total{kubernetes_namespace="a\"b",kubernetes_pod_name=~"x\\.y|z"}[2m])) by (kubernetes_pod_name)"#
    );
    // A resource the rule has no label for.
    let e = rule.query("x", &gr("", "nodes"), None, &everything(), Some(&["n"])).unwrap_err();
    assert!(matches!(e, QueryError::NoLabel(_)), "{e}");
    // > and < have no PromQL equivalent.
    let e = rule
        .query("x", &gr("", "pods"), Some("ns"), &LabelSelector::parse("code>200").unwrap(), Some(&["p"]))
        .unwrap_err();
    assert_eq!(e, QueryError::UnsupportedOperator("code".into()));
}

/// The external rules of the adapter's external metrics documentation.
const EXTERNAL: &str = r#"
externalRules:
- seriesQuery: '{__name__="queue_consumer_lag",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    overrides: { namespace: {resource: "namespace"} }
- seriesQuery: '{__name__="queue_depth",name!=""}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)
  resources:
    namespaced: false
"#;

#[test]
fn external_rules_discover_names_and_scope_by_namespace() {
    let config = load(EXTERNAL);
    let listed = BTreeMap::from([
        (
            r#"{__name__="queue_consumer_lag",name!=""}"#.to_owned(),
            vec![
                series("queue_consumer_lag", &[("name", "q1"), ("namespace", "default")]),
                series("queue_consumer_lag", &[("name", "q2"), ("namespace", "other")]),
            ],
        ),
        (r#"{__name__="queue_depth",name!=""}"#.to_owned(), vec![series("queue_depth", &[("name", "q1")])]),
    ]);
    let metrics = external_metrics(&config.external_rules, &listed).unwrap();
    assert_eq!(
        metrics,
        [
            ExternalMetric {
                name: "queue_consumer_lag".into(),
                series_name: "queue_consumer_lag".into(),
                rule: 0
            },
            ExternalMetric { name: "queue_depth".into(), series_name: "queue_depth".into(), rule: 1 },
        ]
    );
    let lag = &config.external_rules[0];
    assert!(lag.namespaced);
    assert_eq!(
        lag.external_query("queue_consumer_lag", "default", &everything()).unwrap(),
        r#"sum(queue_consumer_lag{namespace="default"}) by (name)"#
    );
    assert_eq!(
        lag.external_query("queue_consumer_lag", "default", &LabelSelector::parse("name=q1").unwrap())
            .unwrap(),
        r#"sum(queue_consumer_lag{name="q1",namespace="default"}) by (name)"#
    );
    // A selector on `namespace` cannot widen the request's namespace: both matchers apply.
    assert_eq!(
        lag.external_query(
            "queue_consumer_lag",
            "default",
            &LabelSelector::parse("namespace=other").unwrap()
        )
        .unwrap(),
        r#"sum(queue_consumer_lag{namespace="other",namespace="default"}) by (name)"#
    );
    // `namespaced: false`: the HPA's namespace is left out, a selector may name another.
    let depth = &config.external_rules[1];
    assert!(!depth.namespaced);
    assert_eq!(
        depth
            .external_query(
                "queue_depth",
                "default",
                &LabelSelector::parse("namespace=queue,name=my-sample-queue").unwrap()
            )
            .unwrap(),
        r#"sum(queue_depth{name="my-sample-queue",namespace="queue"}) by (name)"#
    );
    assert_eq!(
        depth.external_query("queue_depth", "default", &everything()).unwrap(),
        "sum(queue_depth{}) by (name)"
    );
}

#[test]
fn external_label_values_by_name_as_in_the_adapters_tests() {
    let config = load(
        r#"
externalRules:
- seriesQuery: 'x'
  metricsQuery: '<<index .LabelValuesByName "namespace">> <<.GroupBySlice>> <<.LabelValuesByName>>'
  resources: {namespaced: false}
"#,
    );
    let rule = &config.external_rules[0];
    assert_eq!(rule.external_query("x", "default", &everything()).unwrap(), " [] map[]");
    assert_eq!(
        rule.external_query("x", "default", &LabelSelector::parse("foo in (bar,baz)").unwrap()).unwrap(),
        " [] map[foo:bar|baz]"
    );
}

/// Resource rules as adapter users write them over cAdvisor series (the adapter's former
/// built-in ones, without label prefix).
const RESOURCE_RULES: &str = r#"
resourceRules:
  cpu:
    containerQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[1m])) by (<<.GroupBy>>)
    nodeQuery: sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>, id='/'}[1m])) by (<<.GroupBy>>)
    resources:
      overrides:
        instance: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  memory:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        container_memory_working_set_bytes{<<.LabelMatchers>>,container!="",pod!=""}
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        node_memory_MemTotal_bytes{job="node-exporter",<<.LabelMatchers>>}
        -
        node_memory_MemAvailable_bytes{job="node-exporter"}
      )
    resources:
      overrides:
        node: {resource: node}
        namespace: {resource: namespace}
        pod: {resource: pod}
    containerLabel: container
  window: 1m
"#;

#[test]
fn resource_rules_build_pod_and_node_queries() {
    let config = load(RESOURCE_RULES);
    let rules = config.resource_rules.unwrap();
    assert_eq!(rules.window, Some(Duration::from_secs(60)));
    assert_eq!(
        rules.cpu.query_pods("ns", Some(&["a", "b"])).unwrap(),
        r#"sum(rate(container_cpu_usage_seconds_total{namespace="ns",pod=~"a|b"}[1m])) by (pod,container)"#
    );
    assert_eq!(
        rules.cpu.query_pods::<&str>("ns", None).unwrap(),
        r#"sum(rate(container_cpu_usage_seconds_total{namespace="ns"}[1m])) by (pod,container)"#
    );
    assert_eq!(
        rules.cpu.query_nodes(Some(&["n1"])).unwrap(),
        r#"sum(rate(container_cpu_usage_seconds_total{instance="n1", id='/'}[1m])) by (instance)"#
    );
    assert_eq!(
        rules.memory.query_pods("ns", Some(&["a"])).unwrap(),
        "sum by (pod,container) (\n  container_memory_working_set_bytes{namespace=\"ns\",pod=\"a\",container!=\"\",pod!=\"\"}\n)\n"
    );
    assert!(
        rules
            .memory
            .query_nodes(Some(&["n1", "n2"]))
            .unwrap()
            .contains(r#"{job="node-exporter",node=~"n1|n2"}"#)
    );
    assert_eq!(rules.cpu.query_pods::<&str>("", None), Err(QueryError::NoNamespace));
    assert_eq!(rules.cpu.label_for(&gr("", "nodes")).unwrap(), "instance");
    assert_eq!(rules.memory.label_for(&gr("", "nodes")).unwrap(), "node");
}

#[test]
fn an_empty_document_is_an_empty_configuration() {
    for text in
        ["", "\n", "# only a comment\n", "rules: []\n", "rules: ~\nexternalRules: ~\nresourceRules: ~\n"]
    {
        let config = load(text);
        assert!(
            config.rules.is_empty() && config.external_rules.is_empty() && config.resource_rules.is_none()
        );
    }
}

#[test]
fn rules_sharing_a_series_query_are_listed_once() {
    let config = load(DEFAULT_RULES);
    assert_eq!(
        config.series_queries().into_iter().collect::<Vec<_>>(),
        [
            r#"{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}"#,
            r#"{kube_namespace!="",__name__!~"^container_.*"}"#
        ]
    );
    assert_eq!(config.rules[2].field(), "rules[2]");
    let missing = custom_metrics(&config.rules, &BTreeMap::new()).unwrap_err();
    assert_eq!(
        missing,
        MissingSeries(r#"{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}"#.into())
    );
}

#[test]
fn the_later_rule_wins_when_two_serve_the_same_metric() {
    let config = load(&format!("rules:{RULE}{}", RULE.replace("[2m]", "[5m]")));
    let query = r#"{__name__=~"^http_.*",namespace!="",pod!=""}"#;
    let listed = BTreeMap::from([(
        query.to_owned(),
        vec![series("http_requests_total", &[("namespace", "a"), ("pod", "p")])],
    )]);
    let metrics = custom_metrics(&config.rules, &listed).unwrap();
    assert_eq!(metrics.len(), 2);
    assert!(metrics.iter().all(|m| m.rule == 1), "{metrics:?}");
    let external = load(&format!("externalRules:{}{}", EXTERNAL_RULE, EXTERNAL_RULE.replace("sum(", "max(")));
    let listed =
        BTreeMap::from([("{__name__=\"queue_depth\"}".to_owned(), vec![series("queue_depth", &[])])]);
    let metrics = external_metrics(&external.external_rules, &listed).unwrap();
    assert_eq!(
        metrics,
        [ExternalMetric { name: "queue_depth".into(), series_name: "queue_depth".into(), rule: 1 }]
    );
}

const EXTERNAL_RULE: &str = r#"
- seriesQuery: '{__name__="queue_depth"}'
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>})
  resources: {namespaced: false}
"#;

#[test]
fn series_that_fail_the_filters_or_name_to_nothing_serve_nothing() {
    let config = load(
        r#"
rules:
- seriesQuery: '{namespace!=""}'
  seriesFilters: [{isNot: "^go_"}]
  resources: {overrides: {namespace: {resource: namespace}}}
  name: {matches: "^(.*)_total$"}
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
"#,
    );
    let listed = BTreeMap::from([(
        r#"{namespace!=""}"#.to_owned(),
        vec![
            series("go_gc_total", &[("namespace", "a")]),
            series("up", &[("namespace", "a")]),
            series("_total", &[("namespace", "a")]),
            series("jobs_total", &[("namespace", "a")]),
        ],
    )]);
    let names: Vec<String> =
        custom_metrics(&config.rules, &listed).unwrap().into_iter().map(|m| m.name).collect();
    assert_eq!(names, ["jobs"]);
}

#[test]
fn rejections_name_the_path_the_rule_the_field_and_the_construct() {
    assert_eq!(
        rejection(&format!(
            "rules:{RULE}{}",
            RULE.replace("  resources:", "  seriesFilters: [{is: a, isNot: b}]\n  resources:")
        )),
        "--adapter-config a.yaml: rules[1].seriesFilters[0]: both is and isNot"
    );
    assert_eq!(
        rejection(&format!("rules:{}", RULE.replace("  resources:", "  seriesFilters: [{}]\n  resources:"))),
        "--adapter-config a.yaml: rules[0].seriesFilters[0]: one of is and isNot is required"
    );
    assert!(
        rejection(&format!(
            "rules:{}",
            RULE.replace("  resources:", "  seriesFilters: [{isNot: '('}]\n  resources:")
        ))
        .starts_with("--adapter-config a.yaml: rules[0].seriesFilters[0].isNot: invalid regex \"(\"")
    );
    assert_eq!(
        rejection(&format!(
            "rules:{}",
            RULE.replace(r#"as: "${1}_per_second""#, "as: ''").replace("^(.*)_total$", "^(.*)_(.*)_total$")
        )),
        "--adapter-config a.yaml: rules[0].name.as: required when name.matches has 2 capture groups"
    );
    assert!(
        rejection(&format!("rules:{}", RULE.replace("^(.*)_total$", "^(.*_total$")))
            .starts_with("--adapter-config a.yaml: rules[0].name.matches: invalid regex \"^(.*_total$\"")
    );
    assert!(rejection(&format!("rules:{}", RULE.replace("${1}_per_second", "$1_per_second"))).starts_with(
        "--adapter-config a.yaml: rules[0].name.as: $1_per_second refers to capture group \"1_per_second\""
    ));
    let range = RULE.replace("by (<<.GroupBy>>)", "by (<<range .GroupBySlice>><<.>>,<<end>>)");
    assert!(
        rejection(&format!("rules:{RULE}{RULE}{RULE}{range}")).starts_with(
            "--adapter-config a.yaml: rules[3].metricsQuery: template action <<range .GroupBySlice>> is not supported"
        )
    );
    assert!(rejection(&format!("rules:{}", RULE.replace("<<.GroupBy>>", "<<.Resource>>"))).starts_with(
        "--adapter-config a.yaml: rules[0].metricsQuery: field .Resource is not available here"
    ));
    let e = rejection(&format!(
        "rules:{}",
        RULE.replace("<<.GroupBy>>)'\n", "<<.GroupBy>>)'\n  metricsQuery: x\n")
    ));
    assert_eq!(
        e,
        "--adapter-config a.yaml: rules[0]: duplicate mapping key `metricsQuery` is not allowed here at line 11 \
         column 3"
    );
}

#[test]
fn unknown_keys_are_rejected_with_their_path() {
    let e = rejection(&format!("rules:{}", RULE.replace("  name:", "  nmae:")));
    assert!(e.starts_with("--adapter-config a.yaml: rules[0]: unknown field `nmae`"), "{e}");
    let e = rejection("resourceRules:\n  cpu: {containerQueries: x}\n");
    assert!(
        e.starts_with("--adapter-config a.yaml: resourceRules.cpu: unknown field `containerQueries`"),
        "{e}"
    );
    let e = rejection("rules: {}\n");
    assert_eq!(e, "--adapter-config a.yaml: rules: expected sequence start at line 1 column 8");
}

#[test]
fn rules_that_would_serve_nothing_or_fail_every_request_are_rejected() {
    let e = rejection(&format!(
        "rules:{}",
        RULE.replace("sum(rate(<<.Series>>{<<.LabelMatchers>>}[2m])) by (<<.GroupBy>>)", "")
    ));
    assert!(e.starts_with("--adapter-config a.yaml: rules[0].metricsQuery: required"), "{e}");
    let e = rejection("rules:\n- seriesQuery: x\n  metricsQuery: 'sum(x{<<.LabelMatchers>>})'\n");
    assert!(
        e.starts_with("--adapter-config a.yaml: rules[0].resources: overrides or template required"),
        "{e}"
    );
    let e = rejection(
        "rules:\n- metricsQuery: 'sum(x{<<.LabelMatchers>>})'\n  resources: {template: '<<.Resource>>'}\n",
    );
    assert_eq!(e, "--adapter-config a.yaml: rules[0].seriesQuery: required");
    let e =
        rejection(&format!("rules:{}", RULE.replace("  resources:", "  resources:\n    namespaced: false")));
    assert!(
        e.starts_with("--adapter-config a.yaml: rules[0].resources.namespaced: false has no effect in rules"),
        "{e}"
    );
    // The first external rule of the adapter's sample configuration: no label for namespaces.
    let e = rejection(
        "externalRules:\n- seriesQuery: '{__name__=\"queue_consumer_lag\",name!=\"\"}'\n  \
         metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (name)\n",
    );
    assert!(
        e.starts_with("--adapter-config a.yaml: externalRules[0].resources: a namespaced external rule"),
        "{e}"
    );
}

#[test]
fn resources_are_checked_at_load() {
    let e = rejection(&format!(
        "rules:{}",
        RULE.replace(r#"pod: {resource: "pod"}"#, r#"brand: {group: "cheese.io", resource: "brand"}"#)
    ));
    assert!(
        e.starts_with("--adapter-config a.yaml: rules[0].resources.overrides.brand: unknown resource \"brand.cheese.io\""),
        "{e}"
    );
    let e = rejection(&format!(
        "rules:{}",
        RULE.replace("  resources:", "  resources:\n    template: kube_<<.Group>>")
    ));
    assert_eq!(e, "--adapter-config a.yaml: rules[0].resources.template: must use <<.Resource>>");
}

#[test]
fn queries_that_could_read_another_namespace_are_rejected() {
    // The sample configuration's `count(cheddar{sharp="true"})`: no <<.LabelMatchers>>.
    let e = rejection(
        "rules:\n- seriesQuery: 'cheddar{sharp=\"true\"}'\n  name: {as: cheesy_goodness}\n  \
         resources: {overrides: {pod: {resource: pod}}}\n  metricsQuery: 'count(cheddar{sharp=\"true\"})'\n",
    );
    assert!(
        e.starts_with(
            "--adapter-config a.yaml: rules[0].metricsQuery: every selector must carry <<.LabelMatchers>>"
        ),
        "{e}"
    );
    // One selector of two.
    let e = rejection(&format!("rules:{}", RULE.replace("[2m]))", "[2m])) / sum(up)")));
    assert!(e.contains("the selector up has no {<<.LabelMatchers>>} matchers"), "{e}");
    // A namespaced external rule too; not one with `namespaced: false`.
    let e = rejection(
        "externalRules:\n- seriesQuery: x\n  metricsQuery: sum(x)\n  resources: {template: '<<.Resource>>'}\n",
    );
    assert!(e.starts_with("--adapter-config a.yaml: externalRules[0].metricsQuery: every selector"), "{e}");
    load("externalRules:\n- seriesQuery: x\n  metricsQuery: sum(x)\n  resources: {namespaced: false}\n");
    // A node query may read what it needs (kube-prometheus joins node-exporter series).
    let containers_unscoped = RESOURCE_RULES.replace(
        "sum(rate(container_cpu_usage_seconds_total{<<.LabelMatchers>>}[1m]))",
        "sum(rate(container_cpu_usage_seconds_total[1m]))",
    );
    let e = rejection(&containers_unscoped);
    assert!(
        e.starts_with("--adapter-config a.yaml: resourceRules.cpu.containerQuery: every selector"),
        "{e}"
    );
}

#[test]
fn resource_rules_are_checked_at_load() {
    let e = rejection(&RESOURCE_RULES.replace("        instance: {resource: node}\n", ""));
    assert!(e.starts_with("--adapter-config a.yaml: resourceRules.cpu.resources: no label for nodes"), "{e}");
    let e = rejection(&RESOURCE_RULES.replacen("    containerLabel: container\n", "", 1));
    assert_eq!(e, "--adapter-config a.yaml: resourceRules.cpu.containerLabel: required");
    let e = rejection(&RESOURCE_RULES.replace("window: 1m", "window: 90"));
    assert!(
        e.starts_with("--adapter-config a.yaml: resourceRules.window: not a valid duration string"),
        "{e}"
    );
    let e = rejection(&RESOURCE_RULES.replace("window: 1m", "window: 1.5m"));
    assert!(
        e.starts_with("--adapter-config a.yaml: resourceRules.window: unknown unit \".\" in duration"),
        "{e}"
    );
    let e = rejection("resourceRules: {}\n");
    assert!(e.starts_with("--adapter-config a.yaml: resourceRules.cpu.containerQuery: required"), "{e}");
    let e = rejection(&RESOURCE_RULES.replace("nodeQuery: sum(rate(", "nodeQuery: <<.Group>>sum(rate("));
    assert!(e.starts_with("--adapter-config a.yaml: resourceRules.cpu.nodeQuery: field .Group"), "{e}");
    assert!(load(&RESOURCE_RULES.replace("  window: 1m\n", "")).resource_rules.unwrap().window.is_none());
}

#[test]
fn errors_keep_their_parts() {
    let e = AdapterConfig::from_yaml("rules:\n- seriesQuery: ''\n", "/etc/adapter/config.yaml").unwrap_err();
    assert_eq!(
        e,
        AdapterError::Invalid {
            path: "/etc/adapter/config.yaml".into(),
            field: "rules[0].seriesQuery".into(),
            message: "required".into(),
        }
    );
    assert!(matches!(AdapterConfig::from_yaml("rules: [", "p").unwrap_err(), AdapterError::Parse { .. }));
}

#[test]
fn rules_as_helm_renders_them_load() {
    // Empty lists and strings spelled out, plain scalars folded over lines.
    let config = load(
        r#"
rules:
- seriesQuery: '{__name__=~"^container_.*",container!="POD",namespace!="",pod!=""}'
  seriesFilters: []
  resources:
    overrides:
      namespace:
        resource: namespace
      pod:
        resource: pod
  name:
    matches: ^container_(.*)_seconds_total$
    as: ""
  metricsQuery: sum(rate(<<.Series>>{<<.LabelMatchers>>,container!="POD"}[5m]))
    by (<<.GroupBy>>)
- seriesQuery: '{namespace!="",__name__!~"^container_.*"}'
  seriesFilters:
  - isNot: .*_total$
  resources:
    template: <<.Resource>>
  name:
    matches: ""
    as: ""
  metricsQuery: sum(<<.Series>>{<<.LabelMatchers>>}) by (<<.GroupBy>>)
resourceRules:
  cpu:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        rate(container_cpu_usage_seconds_total{container!="",<<.LabelMatchers>>}[3m])
      )
    nodeQuery: |
      sum  by (<<.GroupBy>>) (
        rate(node_cpu_seconds_total{mode!="idle",mode!="iowait",mode!="steal",<<.LabelMatchers>>}[3m])
      )
    resources:
      overrides:
        node:
          resource: node
        namespace:
          resource: namespace
        pod:
          resource: pod
    containerLabel: container
  memory:
    containerQuery: |
      sum by (<<.GroupBy>>) (
        avg_over_time(container_memory_working_set_bytes{container!="",<<.LabelMatchers>>}[3m])
      )
    nodeQuery: |
      sum by (<<.GroupBy>>) (
        avg_over_time(node_memory_MemTotal_bytes{<<.LabelMatchers>>}[3m])
        -
        avg_over_time(node_memory_MemAvailable_bytes{<<.LabelMatchers>>}[3m])
      )
    resources:
      overrides:
        node:
          resource: node
        namespace:
          resource: namespace
        pod:
          resource: pod
    containerLabel: container
  window: 3m
"#,
    );
    let rule = &config.rules[0];
    assert_eq!(
        rule.query(
            "container_cpu_usage_seconds_total",
            &gr("", "pods"),
            Some("ns"),
            &everything(),
            Some(&["p"])
        )
        .unwrap(),
        r#"sum(rate(container_cpu_usage_seconds_total{namespace="ns",pod="p",container!="POD"}[5m])) by (pod)"#
    );
    assert_eq!(rule.api_name("container_cpu_usage_seconds_total").as_deref(), Some("cpu_usage"));
    assert!(config.rules[1].keeps_series("up") && !config.rules[1].keeps_series("http_requests_total"));
    assert_eq!(config.rules[1].api_name("up").as_deref(), Some("up"));
    let resource_rules = config.resource_rules.unwrap();
    assert_eq!(resource_rules.window, Some(Duration::from_secs(180)));
    assert_eq!(
        resource_rules.cpu.query_pods("ns", Some(&["a", "b"])).unwrap(),
        "sum by (pod,container) (\n  rate(container_cpu_usage_seconds_total{container!=\"\",namespace=\"ns\",pod=~\"a|b\"}[3m])\n)\n"
    );
}
