//! The deploy manifests: every kustomization renders, every object validates against the
//! Kubernetes schemas (kubernetes-validate, PyPI), every namespaced object is in kube-system (as
//! metrics-server's), the ClusterRole grants exactly the API calls percolator makes (observed
//! against the simulated cluster), and the pod spec meets the `restricted` Pod Security
//! Standard. Also the example HPAs, and the custom metrics configurations the README and the
//! prometheus-adapter migration guide show.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::manifests::{self, find, kustomize as render};
use common::{Env, Options};
use serde_json::Value;

const KUSTOMIZATIONS: &[&str] = &[
    "deploy",
    "deploy/base",
    "deploy/overlays/cert-manager",
    "deploy/overlays/dev",
    "deploy/overlays/external-metrics",
    "deploy/overlays/custom-metrics",
    "deploy/overlays/custom-metrics/with-external",
    "deploy/overlays/resource-metrics",
    "deploy/overlays/all-metrics",
];

/// The namespace of every namespaced object, as metrics-server's: the pods' priorityClassName
/// system-cluster-critical is admitted only there on GKE.
const NAMESPACE: &str = "kube-system";

/// cert-manager's CA injection annotation every APIService of a cert-manager overlay carries.
const INJECT_CA_FROM: &str = "kube-system/percolator-serving";

/// The APIServices of the custom metrics API.
const CUSTOM_APISERVICES: [&str; 2] = ["v1beta2.custom.metrics.k8s.io", "v1beta1.custom.metrics.k8s.io"];

fn read_yaml(path: &str) -> Value {
    let text = std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap();
    serde_saphyr::from_str(&text).unwrap()
}

fn args_of(objects: &[Value]) -> Vec<String> {
    find(objects, "Deployment", "percolator")["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_owned())
        .collect()
}

fn sorted(mut items: Vec<String>) -> Vec<String> {
    items.sort();
    items
}

#[test]
fn every_kustomization_renders_and_validates() {
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        assert!(objects.len() >= 12, "{dir} renders {} objects", objects.len());
        manifests::kubernetes_validate(&objects, &dir.replace('/', "_"));
        let crds = objects.iter().filter(|o| manifests::is_custom_resource(o)).count();
        assert_eq!(crds, objects.iter().filter(|o| o["apiVersion"] == "cert-manager.io/v1").count(), "{dir}");
        for cert in objects.iter().filter(|o| o["apiVersion"] == "cert-manager.io/v1") {
            assert!(["Issuer", "Certificate"].contains(&cert["kind"].as_str().unwrap()), "{cert}");
            if cert["kind"] == "Certificate" {
                assert!(
                    cert["spec"]["secretName"].is_string() && cert["spec"]["issuerRef"]["name"].is_string(),
                    "{cert}"
                );
            }
        }
    }
}

#[test]
fn examples_validate_and_the_shipped_configuration_is_the_default() {
    for (example, name) in [
        ("deploy/examples/hpa-cafe.yaml", "espresso-du-matin"),
        ("deploy/examples/hpa-web-pods.yaml", "web"),
        ("deploy/examples/hpa-queue-external.yaml", "order-worker"),
    ] {
        let out = std::process::Command::new(common::venv_bin("kubernetes-validate"))
            .args(["--strict", "-k", "1.33.0", example])
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .output()
            .unwrap();
        let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success()
                && report.contains(&format!("passed for resource horizontalpodautoscaler/{name}")),
            "{example}: {report}"
        );
    }
    let hpa = read_yaml("deploy/examples/hpa-cafe.yaml");
    assert_eq!(hpa["spec"]["metrics"][0]["external"]["metric"]["name"], "cafe_brews_per_minute");
    assert_eq!(hpa["spec"]["metrics"][0]["external"]["target"]["type"], "AverageValue");

    // The custom metrics example: a Pods and an Object metric on a metric the defaults serve.
    let hpa = read_yaml("deploy/examples/hpa-web-pods.yaml");
    assert_eq!(hpa["metadata"], serde_json::json!({"name": "web", "namespace": "shop"}));
    assert_eq!(
        hpa["spec"]["scaleTargetRef"],
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "name": "web"})
    );
    assert_eq!(
        hpa["spec"]["metrics"],
        serde_json::json!([
            {"type": "Pods", "pods": {
                "metric": {"name": "http_requests_per_second"},
                "target": {"type": "AverageValue", "averageValue": "50"}}},
            {"type": "Object", "object": {
                "describedObject": {"apiVersion": "v1", "kind": "Service", "name": "web"},
                "metric": {"name": "http_requests_per_second"},
                "target": {"type": "Value", "value": "500"}}},
        ])
    );
    let text =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/hpa-web-pods.yaml"))
            .unwrap();
    assert!(text.contains("# each pod serves 50 requests/s"), "the target says what it means");
    assert!(
        percolator::testing::default_custom_metrics().iter().any(|m| m.name == "http_requests_per_second"),
        "the example's metric is served by default"
    );

    // The ConfigMap ships exactly the compiled-in defaults, and they validate.
    let objects = render("deploy/base");
    let text =
        find(&objects, "ConfigMap", "percolator-config")["data"]["config.yaml"].as_str().unwrap().to_string();
    let check = percolator::config_check();
    let shipped = percolator::config::QueryFile::from_yaml(&text, "deploy/base/config.yaml", &check).unwrap();
    for kind in percolator::testing::BUILTIN {
        for spec in kind.queries {
            let shipped = shipped.kind_query(kind.section, spec.field).map(|t| t.text());
            assert_eq!(shipped, Some(spec.default), "{}.{}", kind.section, spec.field);
        }
    }
    assert_eq!(shipped.external_metrics, Some(percolator::testing::default_external_metrics()));
    assert_eq!(shipped.custom_metrics, Some(percolator::testing::default_custom_metrics()));

    // It declares no kind, and its commented example of one is valid once uncommented.
    assert!(shipped.kinds.is_empty());
    let mut example = false;
    let uncommented: String = text
        .lines()
        .map(|line| {
            example |= line == "# kinds:";
            let line = if example { line.replacen("# ", "", 1) } else { line.to_string() };
            line + "\n"
        })
        .collect();
    assert!(example, "the ConfigMap shows a commented kinds: example");
    let declared = percolator::config::QueryFile::from_yaml(&uncommented, "deploy/base/config.yaml", &check)
        .unwrap_or_else(|e| panic!("{e}\n{uncommented}"));
    let kinds: Vec<(&str, Option<&str>)> =
        declared.kinds.iter().map(|k| (k.kind.as_str(), k.plural.as_deref())).collect();
    assert_eq!(kinds, [("AppTraffic", Some("apptraffics"))]);
}

#[test]
fn overlays_wire_trust_as_documented() {
    let prod = render("deploy");
    let api = find(&prod, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    assert_eq!(api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"], INJECT_CA_FROM);
    assert_eq!(api["spec"]["insecureSkipTLSVerify"], false, "explicit: verified");
    let args =
        find(&prod, "Deployment", "percolator")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(args.as_array().unwrap().iter().any(|a| a == "--tls-cert-file=/etc/percolator/tls/tls.crt"));
    let serving = find(&prod, "Certificate", "percolator-serving");
    assert_eq!(
        serving["spec"]["dnsNames"],
        serde_json::json!(["percolator.kube-system.svc", "percolator.kube-system.svc.cluster.local"])
    );

    let dev = render("deploy/overlays/dev");
    assert_eq!(
        find(&dev, "APIService", "v1alpha1.stats.une-tasse-de.cafe")["spec"]["insecureSkipTLSVerify"],
        true
    );
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/overlays/dev/kustomization.yaml"
    ))
    .unwrap();
    assert!(text.contains("NOT FOR PRODUCTION"));

    let external = render("deploy/overlays/external-metrics");
    let api = find(&external, "APIService", "v1beta1.external.metrics.k8s.io");
    assert_eq!(api["spec"]["service"]["name"], "percolator");
    let args =
        &find(&external, "Deployment", "percolator")["spec"]["template"]["spec"]["containers"][0]["args"];
    assert!(args.as_array().unwrap().iter().any(|a| a == "--enable-external-metrics"));
    let text = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/overlays/external-metrics/kustomization.yaml"
    ))
    .unwrap();
    assert!(text.contains("only ONE server per cluster can own external.metrics.k8s.io"));
    // No other kustomization registers the external group.
    for dir in [
        "deploy",
        "deploy/base",
        "deploy/overlays/dev",
        "deploy/overlays/cert-manager",
        "deploy/overlays/custom-metrics",
    ] {
        assert!(
            !render(dir).iter().any(|o| o["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"),
            "{dir}"
        );
    }
    // Aggregated read access for view/edit/admin.
    let reader = find(&prod, "ClusterRole", "system:percolator-aggregated-reader");
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            reader["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")],
            "true"
        );
    }
    // Every resource of the group, so a kind declared in the configuration needs no RBAC edit.
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"apiGroups": ["stats.une-tasse-de.cafe"], "resources": ["*"], "verbs": ["get", "list"]}])
    );
    // Bindings to the delegated-auth roles.
    assert_eq!(
        find(&prod, "ClusterRoleBinding", "percolator:system:auth-delegator")["roleRef"]["name"],
        "system:auth-delegator"
    );
    let reader_binding = find(&prod, "RoleBinding", "percolator-auth-reader");
    assert_eq!(reader_binding["metadata"]["namespace"], "kube-system");
    assert_eq!(reader_binding["roleRef"]["name"], "extension-apiserver-authentication-reader");
}

#[test]
fn the_custom_metrics_overlay_registers_both_versions() {
    let prod = render("deploy");
    let stats = find(&prod, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    for (dir, external) in
        [("deploy/overlays/custom-metrics", false), ("deploy/overlays/custom-metrics/with-external", true)]
    {
        let objects = render(dir);
        // Same Service, CA injection and group priority as percolator's own APIService;
        // v1beta2 preferred (versionPriority 200), as prometheus-adapter ships them.
        for (name, version, version_priority) in
            [(CUSTOM_APISERVICES[0], "v1beta2", 200), (CUSTOM_APISERVICES[1], "v1beta1", 100)]
        {
            let api = find(&objects, "APIService", name);
            assert_eq!(
                api["spec"],
                serde_json::json!({
                    "group": "custom.metrics.k8s.io",
                    "version": version,
                    "groupPriorityMinimum": 100,
                    "versionPriority": version_priority,
                    "service": stats["spec"]["service"],
                    "insecureSkipTLSVerify": false,
                }),
                "{dir} {name}"
            );
            assert_eq!(
                api["metadata"]["annotations"],
                serde_json::json!({"cert-manager.io/inject-ca-from": INJECT_CA_FROM}),
                "{dir} {name}"
            );
        }
        let mut expected = args_of(&prod);
        if external {
            expected.push("--enable-external-metrics".into());
            assert_eq!(
                find(&objects, "APIService", "v1beta1.external.metrics.k8s.io")["spec"]["service"]["name"],
                "percolator"
            );
        }
        expected.push("--enable-custom-metrics".into());
        assert_eq!(
            sorted(args_of(&objects)),
            sorted(expected),
            "{dir}: the production flags plus the APIs' own"
        );
        // The HPA controller's explicit grant, as for external metrics.
        assert_eq!(
            find(&objects, "ClusterRole", "system:percolator-custom-metrics-reader")["rules"],
            serde_json::json!([{"apiGroups": ["custom.metrics.k8s.io"], "resources": ["*"], "verbs": ["get", "list"]}])
        );
        let binding = find(&objects, "ClusterRoleBinding", "percolator:hpa-controller-custom-metrics");
        assert_eq!(binding["roleRef"]["name"], "system:percolator-custom-metrics-reader");
        assert_eq!(
            binding["subjects"],
            serde_json::json!([{"kind": "ServiceAccount", "name": "horizontal-pod-autoscaler", "namespace": "kube-system"}])
        );
        // Everything of the production install is there too.
        let names = |objects: &[Value]| -> BTreeSet<(String, String)> {
            objects
                .iter()
                .map(|o| (o["kind"].as_str().unwrap().to_owned(), o["metadata"]["name"].to_string()))
                .collect()
        };
        assert!(names(&objects).is_superset(&names(&prod)), "{dir}");
    }
    for file in [
        "deploy/overlays/custom-metrics/kustomization.yaml",
        "deploy/overlays/custom-metrics/with-external/kustomization.yaml",
    ] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap();
        assert!(text.contains("only ONE server per cluster can own custom.metrics.k8s.io"), "{file}");
    }
    // No other kustomization registers the custom group.
    for dir in KUSTOMIZATIONS
        .iter()
        .filter(|d| !d.starts_with("deploy/overlays/custom-metrics") && **d != "deploy/overlays/all-metrics")
    {
        let objects = render(dir);
        for name in CUSTOM_APISERVICES {
            assert!(!objects.iter().any(|o| o["metadata"]["name"] == name), "{dir} registers {name}");
        }
        assert!(!args_of(&objects).iter().any(|a| a == "--enable-custom-metrics"), "{dir}");
    }
}

/// The `customMetrics:` configurations the custom metrics reference and the migration guide
/// show load as they are written (percolator's own check of the file), and the reference's
/// table of defaults is the compiled-in list.
#[test]
fn documented_custom_metrics_configurations_load() {
    let check = percolator::config_check();
    for doc in ["docs/reference/custom-metrics.md", "docs/migrating-from-prometheus-adapter.md"] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap();
        let mut blocks = Vec::new();
        let mut block: Option<String> = None;
        for line in text.lines() {
            match (&mut block, line) {
                (None, "```yaml") => block = Some(String::new()),
                (Some(yaml), "```") => {
                    blocks.push(std::mem::take(yaml));
                    block = None;
                }
                (Some(yaml), line) => {
                    yaml.push_str(line);
                    yaml.push('\n');
                }
                (None, _) => {}
            }
        }
        let custom: Vec<&String> = blocks.iter().filter(|b| b.starts_with("customMetrics:")).collect();
        assert!(!custom.is_empty(), "{doc} shows a customMetrics: configuration");
        for yaml in custom {
            let file = percolator::config::QueryFile::from_yaml(yaml, doc, &check)
                .unwrap_or_else(|e| panic!("{doc}: {e}\n{yaml}"));
            let metrics = file.custom_metrics.unwrap();
            assert_eq!(metrics[0].name, "http_requests_per_second", "{doc}");
        }
    }
    let reference =
        std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/reference/custom-metrics.md"))
            .unwrap();
    for metric in percolator::testing::default_custom_metrics() {
        let labels = if metric.labels.is_empty() {
            "none".to_owned()
        } else {
            metric.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ")
        };
        let row = format!("| `{}` | {labels} | `{}` |", metric.name, metric.query);
        assert!(reference.contains(&row), "docs/reference/custom-metrics.md lists the default {row}");
        assert_eq!(metric.aggregate, percolator::config::Aggregate::Sum);
    }
}

#[test]
fn pod_spec_meets_the_restricted_pod_security_standard() {
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        let deployment = find(&objects, "Deployment", "percolator");
        assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2, "{dir}: highly available");
        let pdb = find(&objects, "PodDisruptionBudget", "percolator");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        let pod = &deployment["spec"]["template"]["spec"];
        assert!(pod["affinity"]["podAntiAffinity"].is_object(), "{dir}: replicas spread");
        manifests::assert_restricted_pod_spec(pod, dir);
        assert_eq!(pod["priorityClassName"], "system-cluster-critical", "{dir}");
        // Installed into kube-system, which runs privileged system pods: no Namespace object,
        // so no namespace-wide Pod Security label, and every namespaced object is there (the
        // RoleBinding to extension-apiserver-authentication-reader included).
        assert!(!objects.iter().any(|o| o["kind"] == "Namespace"), "{dir}");
        for object in &objects {
            let cluster_wide = ["ClusterRole", "ClusterRoleBinding", "APIService"]
                .contains(&object["kind"].as_str().unwrap());
            let namespace = &object["metadata"]["namespace"];
            if cluster_wide {
                assert!(namespace.is_null(), "{dir}: {object}");
            } else {
                assert_eq!(namespace, NAMESPACE, "{dir}: {object}");
            }
            for subject in object["subjects"].as_array().into_iter().flatten() {
                assert_eq!(subject["namespace"], NAMESPACE, "{dir}: {object}");
            }
            if let Some(service) = object["spec"]["service"].as_object() {
                assert_eq!(service["namespace"], NAMESPACE, "{dir}: {object}");
            }
        }
    }
}

/// The API group of a resource the simulator counts calls on (its counters name the plural
/// alone: `get deployments`).
fn group_of(resource: &str) -> &'static str {
    match resource {
        "deployments" | "statefulsets" | "replicasets" | "daemonsets" => "apps",
        "tokenreviews" => "authentication.k8s.io",
        "subjectaccessreviews" => "authorization.k8s.io",
        _ => "",
    }
}

/// `(kind, apiVersion)` of `describedObject` for an object resource of the custom metrics API.
fn described_kind(resource: &str) -> (&'static str, &'static str) {
    match resource {
        "deployments.apps" => ("Deployment", "apps/v1"),
        "statefulsets.apps" => ("StatefulSet", "apps/v1"),
        "replicasets.apps" => ("ReplicaSet", "apps/v1"),
        "daemonsets.apps" => ("DaemonSet", "apps/v1"),
        "services" => ("Service", "/v1"),
        other => panic!("not an object resource of custom metrics: {other}"),
    }
}

/// The reads percolator's own identity makes, observed: every Kubernetes API call the
/// simulated kube-apiserver and kubelets saw from it while it started, authenticated and
/// authorized requests, served lists and, with the custom metrics API on, answered every form
/// of custom metric (an `Object` metric of each resource GETs its object).
#[tokio::test(flavor = "multi_thread")]
async fn cluster_role_grants_exactly_the_calls_the_code_makes() {
    let env = Env::start(
        "rbac",
        Options {
            scrape_percolator: false,
            extra_args: vec!["--enable-custom-metrics".into()],
            ..Options::default()
        },
    )
    .await;
    // Exercise every path: token and certificate authentication, authorization, both kinds.
    env.wait_for_cpu(Some("shop")).await;
    env.get_json("/apis/stats.une-tasse-de.cafe/v1alpha1/cafebrewstats").await;

    // Custom metrics, as the HPA controller asks (with cluster-wide rights: system:masters
    // here). The Pods and namespace forms read
    // the inventory: no LIST of pods per request.
    const METRIC: &str = "http_requests_per_second";
    let v2 = "/apis/custom.metrics.k8s.io/v1beta2/namespaces/shop";
    let admin = env.client_as(Some("admin-token"));
    let get = |path: String| {
        let admin = admin.clone();
        let url = format!("{}{path}", env.url);
        async move {
            let response = admin.get(url).send().await.unwrap();
            let status = response.status().as_u16();
            let body: Value = response.json().await.unwrap();
            (status, body)
        }
    };
    let pod_lists = |stats: &Value| stats["apiRequests"]["list pods"].as_u64().unwrap();
    let lists_before = pod_lists(&env.sim_stats().await);
    let (status, body) = get(format!("{v2}/pods/*/{METRIC}?labelSelector=app%3Dweb")).await;
    assert_eq!(status, 200, "{body}");
    assert!(!body["items"].as_array().unwrap().is_empty(), "{body}");
    let (status, body) = get(format!("{v2}/metrics/{METRIC}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body["items"][0]["describedObject"],
        serde_json::json!({"kind": "Namespace", "name": "shop", "apiVersion": "/v1"})
    );

    // One object of each resource (the simulator's truth says which pods it selects): its
    // value when one of them has requests, else the adapter library's 404.
    let truth = env.truth().await;
    let with_requests: BTreeSet<&str> = truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["namespace"] == "shop" && p["requestsPerSecond"].is_number())
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for resource in
        ["deployments.apps", "statefulsets.apps", "replicasets.apps", "daemonsets.apps", "services"]
    {
        let workloads: Vec<&Value> = truth["workloads"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["resource"] == resource && w["namespace"] == "shop")
            .collect();
        let serves = |w: &Value| {
            w["pods"].as_array().unwrap().iter().any(|p| with_requests.contains(p.as_str().unwrap()))
        };
        let workload = *workloads
            .iter()
            .find(|w| serves(w))
            .or(workloads.first())
            .unwrap_or_else(|| panic!("no {resource} in shop"));
        let name = workload["name"].as_str().unwrap();
        let (status, body) = get(format!("{v2}/{resource}/{name}/{METRIC}")).await;
        if serves(workload) {
            let (kind, api_version) = described_kind(resource);
            assert_eq!(status, 200, "{resource}/{name}: {body}");
            assert_eq!(
                body["items"][0]["describedObject"],
                serde_json::json!({"kind": kind, "namespace": "shop", "name": name, "apiVersion": api_version}),
                "{resource}/{name}"
            );
        } else {
            assert_eq!(status, 404, "{resource}/{name}: {body}");
            assert_eq!(
                body["message"],
                format!("the server could not find the metric {METRIC} for {resource} {name}")
            );
        }
    }

    let stats = env.sim_stats().await;
    assert_eq!(pod_lists(&stats), lists_before, "custom metrics list no pods");
    let mut observed: BTreeSet<(String, String, String)> = stats["apiRequests"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(call, n)| *call != "unauthorized" && n.as_u64().unwrap() > 0)
        .map(|(call, _)| {
            let (verb, resource) = call.split_once(' ').unwrap();
            (group_of(resource).to_string(), resource.to_string(), verb.to_string())
        })
        .collect();
    if stats["kubeletFetches"].as_object().unwrap().values().any(|n| n.as_u64().unwrap() > 0) {
        observed.insert((String::new(), "nodes/metrics".into(), "get".into()));
    }

    // What the delegated-auth roles (bootstrapped by kube-apiserver) cover.
    let delegated: BTreeSet<(String, String, String)> = [
        ("tokenreviews", "create"),
        ("subjectaccessreviews", "create"),
        ("configmaps", "get"),
        ("configmaps", "list"),
        ("configmaps", "watch"),
    ]
    .iter()
    .map(|(r, v)| (group_of(r).to_string(), r.to_string(), v.to_string()))
    .collect();
    let needed: BTreeSet<_> = observed.difference(&delegated).cloned().collect();

    let objects = render("deploy");
    let role = find(&objects, "ClusterRole", "system:percolator");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        for group in rule["apiGroups"].as_array().unwrap() {
            for resource in rule["resources"].as_array().unwrap() {
                for verb in rule["verbs"].as_array().unwrap() {
                    granted.insert((
                        group.as_str().unwrap().to_string(),
                        resource.as_str().unwrap().to_string(),
                        verb.as_str().unwrap().to_string(),
                    ));
                }
            }
        }
    }
    assert_eq!(granted, needed, "ClusterRole system:percolator vs the calls observed ({observed:?})");
    for (group, resource, verb) in
        [("", "pods", "watch"), ("apps", "deployments", "get"), ("", "services", "get")]
    {
        assert!(observed.contains(&(group.into(), resource.into(), verb.into())), "{observed:?}");
    }
}

#[test]
fn the_resource_metrics_overlay_takes_over_metrics_server_s_apiservice() {
    let prod = render("deploy");
    let stats = find(&prod, "APIService", "v1alpha1.stats.une-tasse-de.cafe");
    let objects = render("deploy/overlays/resource-metrics");
    let api = find(&objects, "APIService", "v1beta1.metrics.k8s.io");
    assert_eq!(
        api["spec"],
        serde_json::json!({
            "group": "metrics.k8s.io",
            "version": "v1beta1",
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
            "service": stats["spec"]["service"],
            "insecureSkipTLSVerify": false,
        })
    );
    assert_eq!(
        api["metadata"]["annotations"],
        serde_json::json!({"cert-manager.io/inject-ca-from": INJECT_CA_FROM})
    );
    let mut expected = args_of(&prod);
    expected.push("--enable-resource-metrics".into());
    assert_eq!(sorted(args_of(&objects)), sorted(expected));
    // What metrics-server's aggregated reader grants, so `kubectl top` works for view/edit/admin,
    // under percolator's own name: installing or removing percolator never touches the role
    // metrics-server ships.
    let reader = find(&objects, "ClusterRole", "system:percolator-aggregated-metrics-reader");
    assert!(!objects.iter().any(|o| o["metadata"]["name"] == "system:aggregated-metrics-reader"));
    assert_eq!(
        reader["rules"],
        serde_json::json!([{"apiGroups": ["metrics.k8s.io"], "resources": ["pods", "nodes"], "verbs": ["get", "list"]}])
    );
    for role in ["view", "edit", "admin"] {
        assert_eq!(
            reader["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{role}")],
            "true"
        );
    }
    let text = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("deploy/overlays/resource-metrics/kustomization.yaml"),
    )
    .unwrap();
    assert!(text.contains("only ONE server per cluster can own metrics.k8s.io"));
    assert!(text.contains("Switch back"));
    for dir in KUSTOMIZATIONS
        .iter()
        .filter(|d| !["deploy/overlays/resource-metrics", "deploy/overlays/all-metrics"].contains(d))
    {
        let objects = render(dir);
        assert!(!objects.iter().any(|o| o["metadata"]["name"] == "v1beta1.metrics.k8s.io"), "{dir}");
        assert!(!args_of(&objects).iter().any(|a| a == "--enable-resource-metrics"), "{dir}");
    }
}

/// Every APIService percolator may register, with its group and version.
const ALL_APISERVICES: [(&str, &str, &str); 5] = [
    ("v1alpha1.stats.une-tasse-de.cafe", "stats.une-tasse-de.cafe", "v1alpha1"),
    ("v1beta1.metrics.k8s.io", "metrics.k8s.io", "v1beta1"),
    ("v1beta2.custom.metrics.k8s.io", "custom.metrics.k8s.io", "v1beta2"),
    ("v1beta1.custom.metrics.k8s.io", "custom.metrics.k8s.io", "v1beta1"),
    ("v1beta1.external.metrics.k8s.io", "external.metrics.k8s.io", "v1beta1"),
];

/// The path of `to` relative to the directory `from` (both absolute), with `..` where they part.
fn relative_path(from: &std::path::Path, to: &std::path::Path) -> String {
    let (from, to): (Vec<_>, Vec<_>) = (from.components().collect(), to.components().collect());
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let up = std::iter::repeat_n("..".to_owned(), from.len() - common);
    let down = to[common..].iter().map(|c| c.as_os_str().to_str().unwrap().to_owned());
    up.chain(down).collect::<Vec<_>>().join("/")
}

/// Renders a kustomization written for the test under cargo's temporary directory, whose
/// `resources` and `components` name directories of `deploy/` (kustomize refuses absolute
/// roots, so they are given relative to the temporary kustomization).
fn mk_kustomization(name: &str, components: &[&str]) -> Vec<Value> {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join(format!("percolator-kustomize-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let deploy = relative_path(&dir, &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy"));
    let components: String = components.iter().map(|c| format!("  - {deploy}/components/{c}\n")).collect();
    std::fs::write(
        dir.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {deploy}/base\ncomponents:\n{components}"
        ),
    )
    .unwrap();
    assert!(
        dir.join(deploy).join("base/kustomization.yaml").exists(),
        "the temporary kustomization reaches deploy/ ({})",
        dir.display()
    );
    let objects = render(dir.to_str().unwrap());
    std::fs::remove_dir_all(&dir).unwrap();
    objects
}

/// The trust components (cert-manager, dev) reach every APIService of the install, whichever
/// API components come before them: `all-metrics` registers the five APIServices, each trusting
/// cert-manager's CA, and the dev component composes with every API component.
#[test]
fn trust_components_reach_every_apiservice() {
    let stats_service = serde_json::json!({"name": "percolator", "namespace": NAMESPACE, "port": 443});
    let all = render("deploy/overlays/all-metrics");
    let args = args_of(&all);
    for flag in ["--enable-resource-metrics", "--enable-custom-metrics", "--enable-external-metrics"] {
        assert!(args.iter().any(|a| a == flag), "all-metrics: {flag} in {args:?}");
    }
    for (name, group, version) in ALL_APISERVICES {
        let api = find(&all, "APIService", name);
        assert_eq!(api["spec"]["group"], group, "{name}");
        assert_eq!(api["spec"]["version"], version, "{name}");
        assert_eq!(api["spec"]["service"], stats_service, "{name}");
        assert_eq!(api["spec"]["insecureSkipTLSVerify"], false, "{name}");
        assert_eq!(
            api["metadata"]["annotations"],
            serde_json::json!({"cert-manager.io/inject-ca-from": INJECT_CA_FROM}),
            "{name}"
        );
    }

    for (api_component, names) in [
        ("resource-metrics", &["v1beta1.metrics.k8s.io"][..]),
        ("custom-metrics", &CUSTOM_APISERVICES[..]),
        ("external-metrics", &["v1beta1.external.metrics.k8s.io"][..]),
    ] {
        let objects = mk_kustomization(api_component, &[api_component, "dev"]);
        let apiservices: Vec<&Value> = objects.iter().filter(|o| o["kind"] == "APIService").collect();
        let mut expected: Vec<&str> = names.to_vec();
        expected.push("v1alpha1.stats.une-tasse-de.cafe");
        expected.sort_unstable();
        let mut registered: Vec<&str> =
            apiservices.iter().map(|a| a["metadata"]["name"].as_str().unwrap()).collect();
        registered.sort_unstable();
        assert_eq!(registered, expected, "dev + {api_component}");
        for api in apiservices {
            assert_eq!(api["spec"]["insecureSkipTLSVerify"], true, "dev + {api_component}: {api}");
            assert!(api["metadata"].get("annotations").is_none(), "dev + {api_component}: {api}");
        }
        let args = args_of(&objects);
        assert!(args.iter().any(|a| a == "--kubelet-insecure-tls"), "dev + {api_component}: {args:?}");
        assert!(!args.iter().any(|a| a.starts_with("--tls-cert-file")), "dev + {api_component}: {args:?}");
        assert!(
            !objects.iter().any(|o| o["apiVersion"] == "cert-manager.io/v1"),
            "dev + {api_component} needs no cert-manager"
        );
    }
}

/// One number names a release: `Cargo.toml`'s version, the image tag every kustomization
/// deploys, the Helm chart's `appVersion` (the chart's default image tag) and a section of
/// `CHANGELOG.md`.
#[test]
fn one_version_everywhere() {
    let version = env!("CARGO_PKG_VERSION");
    let image = format!("ghcr.io/une-tasse-de/percolator:{version}");
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        let deployment = find(&objects, "Deployment", "percolator");
        assert_eq!(deployment["spec"]["template"]["spec"]["containers"][0]["image"], image.as_str(), "{dir}");
    }
    let chart = read_yaml("charts/percolator/Chart.yaml");
    assert_eq!(chart["appVersion"], version, "charts/percolator/Chart.yaml appVersion");
    let changelog = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/CHANGELOG.md")).unwrap();
    assert!(
        changelog.lines().any(|l| l.starts_with(&format!("## [{version}] - "))),
        "CHANGELOG.md has a section for {version}"
    );
    for doc in ["README.md", "docs/deploy.md"] {
        let text =
            std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(doc)).unwrap();
        for tag in text.match_indices("percolator:").map(|(i, _)| &text[i + "percolator:".len()..]) {
            let tag: String = tag.chars().take_while(|c| c.is_ascii_digit() || *c == '.').collect();
            assert!(tag.is_empty() || tag == version, "{doc} names image tag {tag}, not {version}");
        }
    }
}

/// This repository as kustomize names it remotely: `REMOTE` + `deploy?ref=v0.2.0`.
const REMOTE: &str = "https://github.com/une-tasse-de/percolator//";

/// Every `kubectl apply -k`/`delete -k` the documents and the kustomizations' comments show
/// names a kustomization of this repository that renders (locally, or remotely at this
/// version's tag), and the uninstall commands of
/// docs/operations.md delete every APIService an install can register (an unavailable one
/// left behind blocks namespace deletion cluster-wide).
#[test]
fn documented_kustomize_commands_name_real_kustomizations() {
    let mut docs = vec!["README.md".to_owned(), "docs/deploy.md".to_owned(), "docs/operations.md".to_owned()];
    let mut stack = vec![std::path::PathBuf::from("deploy")];
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(root.join(&dir)).unwrap() {
            let entry = entry.unwrap();
            let relative = dir.join(entry.file_name());
            if entry.file_type().unwrap().is_dir() {
                stack.push(relative);
            } else if entry.file_name() == "kustomization.yaml" {
                docs.push(relative.to_str().unwrap().to_owned());
            }
        }
    }
    let mut named = BTreeSet::new();
    for doc in &docs {
        let text = std::fs::read_to_string(root.join(doc)).unwrap();
        for line in text.lines() {
            for verb in ["kubectl apply -k ", "kubectl delete -k "] {
                for (at, _) in line.match_indices(verb) {
                    let target = line[at + verb.len()..].split_whitespace().next().unwrap();
                    let target = target.trim_end_matches(['`', ')', ',', ';']).trim_matches(['\'', '"']);
                    if target.starts_with('<') {
                        continue; // a placeholder: "<the overlay you applied>"
                    }
                    // This repository's kustomization at a release tag (kustomize's remote form):
                    // the same directory, at the tag of this version.
                    let target = match target.strip_prefix(REMOTE) {
                        Some(remote) => {
                            let (path, tag) = remote.split_once("?ref=").unwrap_or((remote, ""));
                            let version = env!("CARGO_PKG_VERSION");
                            assert_eq!(
                                tag,
                                format!("v{version}"),
                                "{doc}: `{verb}{target}` names the tag of {version}"
                            );
                            path
                        }
                        None => target,
                    };
                    let target = target.trim_end_matches('/');
                    assert!(
                        KUSTOMIZATIONS.contains(&target),
                        "{doc}: `{verb}{target}` is not one of the kustomizations tested here"
                    );
                    named.insert(target.to_owned());
                }
            }
        }
    }
    for overlay in
        ["deploy", "deploy/overlays/dev", "deploy/overlays/all-metrics", "deploy/overlays/resource-metrics"]
    {
        assert!(named.contains(overlay), "the documents show how to apply {overlay}");
    }

    let operations = std::fs::read_to_string(root.join("docs/operations.md")).unwrap();
    let uninstall = &operations[operations.find("## Uninstall").unwrap()..];
    let uninstall = &uninstall[..uninstall[3..].find("\n## ").unwrap()];
    for (name, _, _) in ALL_APISERVICES {
        assert!(uninstall.contains(name), "docs/operations.md's uninstall deletes {name}");
    }
    let registered: BTreeSet<String> = KUSTOMIZATIONS
        .iter()
        .flat_map(|dir| render(dir))
        .filter(|o| o["kind"] == "APIService")
        .map(|o| o["metadata"]["name"].as_str().unwrap().to_owned())
        .collect();
    let known: BTreeSet<String> = ALL_APISERVICES.iter().map(|(name, _, _)| (*name).to_owned()).collect();
    assert_eq!(registered, known, "the APIServices the kustomizations register");
}
