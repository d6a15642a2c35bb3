//! The deploy manifests: every kustomization renders, every object validates against the
//! Kubernetes schemas (kubernetes-validate, PyPI), the ClusterRole grants exactly the API calls
//! percolator makes (observed against the simulated cluster), and the pod spec meets the
//! `restricted` Pod Security Standard.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeSet;

use common::{Env, Options};
use serde::Deserialize;
use serde_json::Value;

const KUSTOMIZATIONS: &[&str] = &[
    "deploy",
    "deploy/base",
    "deploy/overlays/cert-manager",
    "deploy/overlays/dev",
    "deploy/overlays/external-metrics",
];

fn render(dir: &str) -> Vec<Value> {
    let out = std::process::Command::new(common::kubectl_bin())
        .args(["kustomize", dir])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|doc| serde_json::to_value(serde_yaml::Value::deserialize(doc).unwrap()).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name} missing"))
}

#[test]
fn every_kustomization_renders_and_validates() {
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        assert!(objects.len() >= 13, "{dir} renders {} objects", objects.len());
        let file = std::env::temp_dir().join(format!(
            "percolator-deploy-{}-{}.yaml",
            std::process::id(),
            dir.replace('/', "_")
        ));
        let yaml: String =
            objects.iter().map(|o| format!("---\n{}", serde_yaml::to_string(o).unwrap())).collect();
        std::fs::write(&file, yaml).unwrap();
        let out = std::process::Command::new("kubernetes-validate")
            .args(["--strict", "-k", "1.33.0"])
            .arg(&file)
            .output()
            .expect("kubernetes-validate (PyPI) is installed by scripts/install-deps.sh");
        let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
        for line in report.lines() {
            let fine = line.starts_with("INFO") && line.contains(" passed for resource ");
            // cert-manager's kinds are CRDs, outside the Kubernetes schemas; checked below.
            let crd = line.starts_with("WARN") && line.contains("api version cert-manager.io/v1");
            assert!(fine || crd || line.trim().is_empty(), "{dir}: {line}");
        }
        let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
        let crds = objects.iter().filter(|o| o["apiVersion"] == "cert-manager.io/v1").count();
        assert_eq!(passed + crds, objects.len(), "{dir}: every object validated\n{report}");
        for cert in objects.iter().filter(|o| o["apiVersion"] == "cert-manager.io/v1") {
            assert!(["Issuer", "Certificate"].contains(&cert["kind"].as_str().unwrap()), "{cert}");
            if cert["kind"] == "Certificate" {
                assert!(
                    cert["spec"]["secretName"].is_string() && cert["spec"]["issuerRef"]["name"].is_string(),
                    "{cert}"
                );
            }
        }
        let _ = std::fs::remove_file(file);
    }
}

#[test]
fn examples_validate_and_the_shipped_configuration_is_the_default() {
    let example = concat!(env!("CARGO_MANIFEST_DIR"), "/deploy/examples/hpa-cafe.yaml");
    let out = std::process::Command::new("kubernetes-validate")
        .args(["--strict", "-k", "1.33.0", example])
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success()
            && report.contains("passed for resource horizontalpodautoscaler/espresso-du-matin"),
        "{report}"
    );
    let hpa: Value = serde_json::to_value(
        serde_yaml::from_str::<serde_yaml::Value>(&std::fs::read_to_string(example).unwrap()).unwrap(),
    )
    .unwrap();
    assert_eq!(hpa["spec"]["metrics"][0]["external"]["metric"]["name"], "cafe_brews_per_minute");
    assert_eq!(hpa["spec"]["metrics"][0]["external"]["target"]["type"], "AverageValue");

    // The ConfigMap ships exactly the compiled-in defaults, and they validate.
    let objects = render("deploy/base");
    let text =
        find(&objects, "ConfigMap", "percolator-config")["data"]["config.yaml"].as_str().unwrap().to_string();
    let check = percolator::server::config_check();
    let shipped = percolator::config::QueryFile::from_yaml(&text, "deploy/base/config.yaml", &check).unwrap();
    for kind in percolator::kinds::registry::BUILTIN {
        for spec in kind.queries {
            let shipped = shipped.kind_query(kind.section, spec.field);
            assert_eq!(shipped, Some(spec.default), "{}.{}", kind.section, spec.field);
        }
    }
    assert_eq!(shipped.external_metrics, Some(percolator::external::default_metrics()));

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
    assert_eq!(
        api["metadata"]["annotations"]["cert-manager.io/inject-ca-from"],
        "percolator/percolator-serving"
    );
    assert!(api["spec"].get("insecureSkipTLSVerify").is_none());
    let args =
        find(&prod, "Deployment", "percolator")["spec"]["template"]["spec"]["containers"][0]["args"].clone();
    assert!(args.as_array().unwrap().iter().any(|a| a == "--tls-cert-file=/etc/percolator/tls/tls.crt"));
    let serving = find(&prod, "Certificate", "percolator-serving");
    assert!(serving["spec"]["dnsNames"].as_array().unwrap().iter().any(|d| d == "percolator.percolator.svc"));

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
    for dir in ["deploy", "deploy/base", "deploy/overlays/dev", "deploy/overlays/cert-manager"] {
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
fn pod_spec_meets_the_restricted_pod_security_standard() {
    for dir in KUSTOMIZATIONS {
        let objects = render(dir);
        let deployment = find(&objects, "Deployment", "percolator");
        assert!(deployment["spec"]["replicas"].as_u64().unwrap() >= 2, "{dir}: highly available");
        let pdb = find(&objects, "PodDisruptionBudget", "percolator");
        assert_eq!(pdb["spec"]["minAvailable"], 1);
        let pod = &deployment["spec"]["template"]["spec"];
        assert!(pod["affinity"]["podAntiAffinity"].is_object(), "{dir}: replicas spread");
        // Baseline: no host namespaces, ports, paths or privilege.
        for field in ["hostNetwork", "hostPID", "hostIPC"] {
            assert!(pod.get(field).is_none_or(|v| v == false), "{dir}: {field}");
        }
        for volume in pod["volumes"].as_array().unwrap() {
            let kinds: Vec<&String> = volume.as_object().unwrap().keys().filter(|k| *k != "name").collect();
            let allowed = [
                "configMap",
                "csi",
                "downwardAPI",
                "emptyDir",
                "ephemeral",
                "persistentVolumeClaim",
                "projected",
                "secret",
            ];
            assert!(kinds.iter().all(|k| allowed.contains(&k.as_str())), "{dir}: volume type {kinds:?}");
        }
        let pod_sc = &pod["securityContext"];
        let containers = pod["containers"]
            .as_array()
            .unwrap()
            .iter()
            .chain(pod["initContainers"].as_array().into_iter().flatten());
        for container in containers {
            let sc = &container["securityContext"];
            let name = container["name"].as_str().unwrap();
            assert!(sc.get("privileged").is_none_or(|v| v == false), "{dir} {name}: privileged");
            assert!(
                container["ports"].as_array().into_iter().flatten().all(|p| p.get("hostPort").is_none()),
                "{dir} {name}: hostPort"
            );
            // Restricted: no privilege escalation, all capabilities dropped (only
            // NET_BIND_SERVICE may be added), non-root, RuntimeDefault or Localhost seccomp.
            assert_eq!(sc["allowPrivilegeEscalation"], false, "{dir} {name}");
            assert!(
                sc["capabilities"]["drop"].as_array().unwrap().iter().any(|c| c == "ALL"),
                "{dir} {name}"
            );
            assert!(
                sc["capabilities"]["add"].as_array().into_iter().flatten().all(|c| c == "NET_BIND_SERVICE"),
                "{dir} {name}"
            );
            let non_root = sc.get("runAsNonRoot").or(pod_sc.get("runAsNonRoot"));
            assert_eq!(non_root, Some(&Value::Bool(true)), "{dir} {name}: runAsNonRoot");
            let uid = sc.get("runAsUser").or(pod_sc.get("runAsUser"));
            assert!(uid.is_none_or(|u| u != 0), "{dir} {name}: runAsUser 0");
            let seccomp = sc["seccompProfile"]["type"].as_str().or(pod_sc["seccompProfile"]["type"].as_str());
            assert!(
                matches!(seccomp, Some("RuntimeDefault" | "Localhost")),
                "{dir} {name}: seccomp {seccomp:?}"
            );
            // Beyond the standard, as the issue asks.
            assert_eq!(sc["readOnlyRootFilesystem"], true, "{dir} {name}");
            // Probes on the real endpoints over HTTPS.
            assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez");
            assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz");
            assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
            assert!(
                container["resources"]["requests"]["memory"].is_string(),
                "{dir} {name}: resource requests"
            );
        }
        assert_eq!(
            find(&objects, "Namespace", "percolator")["metadata"]["labels"]["pod-security.kubernetes.io/enforce"],
            "restricted"
        );
    }
}

/// The reads percolator's own identity makes, observed: every Kubernetes API call the
/// simulated kube-apiserver and kubelets saw from it while it started, authenticated and
/// authorized requests, and served lists.
#[tokio::test(flavor = "multi_thread")]
async fn cluster_role_grants_exactly_the_calls_the_code_makes() {
    let env = Env::start("rbac", Options { scrape_percolator: false, ..Options::default() }).await;
    // Exercise every path: token and certificate authentication, authorization, both kinds.
    env.wait_for_cpu(Some("shop")).await;
    env.get_json("/apis/stats.une-tasse-de.cafe/v1alpha1/cafebrewstats").await;
    let stats = env.sim_stats().await;
    let mut observed: BTreeSet<(String, String)> = stats["apiRequests"]
        .as_object()
        .unwrap()
        .iter()
        .filter(|(call, n)| *call != "unauthorized" && n.as_u64().unwrap() > 0)
        .map(|(call, _)| {
            let (verb, resource) = call.split_once(' ').unwrap();
            (resource.to_string(), verb.to_string())
        })
        .collect();
    if stats["kubeletFetches"].as_object().unwrap().values().any(|n| n.as_u64().unwrap() > 0) {
        observed.insert(("nodes/metrics".into(), "get".into()));
    }

    // What the delegated-auth roles (bootstrapped by kube-apiserver) cover.
    let delegated: BTreeSet<(String, String)> = [
        ("tokenreviews", "create"),
        ("subjectaccessreviews", "create"),
        ("configmaps", "get"),
        ("configmaps", "list"),
        ("configmaps", "watch"),
    ]
    .iter()
    .map(|(r, v)| (r.to_string(), v.to_string()))
    .collect();
    let needed: BTreeSet<_> = observed.difference(&delegated).cloned().collect();

    let objects = render("deploy");
    let role = find(&objects, "ClusterRole", "system:percolator");
    let mut granted = BTreeSet::new();
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(rule["apiGroups"], serde_json::json!([""]), "core group only");
        for resource in rule["resources"].as_array().unwrap() {
            for verb in rule["verbs"].as_array().unwrap() {
                granted.insert((resource.as_str().unwrap().to_string(), verb.as_str().unwrap().to_string()));
            }
        }
    }
    assert_eq!(granted, needed, "ClusterRole system:percolator vs the calls observed ({observed:?})");
    assert!(observed.contains(&("pods".to_string(), "watch".to_string())), "{observed:?}");
}
