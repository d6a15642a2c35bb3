//! Kubernetes manifests in tests, shared by the kustomize (`tests/deploy.rs`) and Helm
//! (`tests/chart.rs`, `tests/convert_values.rs`) checks: rendering a kustomization with
//! `kubectl kustomize`, running Helm's engine on a chart (`tests/python/helm_chart.py`), parsing
//! a YAML stream, validating objects with `kubernetes-validate` (PyPI) against the Kubernetes
//! schemas, and the `restricted` Pod Security Standard checks of a pod spec.

#![allow(dead_code, clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};

use serde_json::Value;

/// The Kubernetes version the objects are validated against.
pub(crate) const KUBERNETES_VERSION: &str = "1.33.0";

/// API groups of the custom resources the manifests may hold (cert-manager's, the Prometheus
/// Operator's): outside the Kubernetes schemas, so [`kubernetes_validate`] leaves them to the
/// caller's own checks.
pub(crate) const CRD_GROUPS: &[&str] = &["cert-manager.io", "monitoring.coreos.com"];

/// A path of the repository.
pub(crate) fn repo_path(relative: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(relative)
}

/// The Python that has helm-python-sdk and PyYAML: `$PERCOLATOR_PYTHON`, or the venv's
/// (scripts/install-deps.sh installs them there).
pub(crate) fn helm_python() -> PathBuf {
    std::env::var_os("PERCOLATOR_PYTHON").map_or_else(super::python, Into::into)
}

/// Runs `tests/python/helm_chart.py COMMAND CHART` (render, lint, validate, command: see its
/// docstring) with `request` on its standard input: its JSON answer, or its error message.
pub(crate) fn helm_chart(command: &str, chart: &Path, request: &Value) -> Result<Value, String> {
    use std::io::Write;
    let mut child = std::process::Command::new(helm_python())
        .arg(repo_path("tests/python/helm_chart.py"))
        .arg(command)
        .arg(chart)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect(
            "the venv's python with helm-python-sdk (scripts/install-deps.sh; PERCOLATOR_PYTHON overrides)",
        );
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    if out.status.success() {
        Ok(serde_json::from_slice(&out.stdout).unwrap())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The objects of a multi-document YAML stream, empty documents left out.
pub(crate) fn parse_stream(text: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(text).unwrap().into_iter().filter(|v| !v.is_null()).collect()
}

/// `kubectl kustomize DIR` (DIR relative to the repository, or absolute), as objects.
pub(crate) fn kustomize(dir: &str) -> Vec<Value> {
    let out = std::process::Command::new(super::kubectl_bin())
        .args(["kustomize", dir])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("kubectl runs");
    assert!(out.status.success(), "kubectl kustomize {dir}: {}", String::from_utf8_lossy(&out.stderr));
    parse_stream(&String::from_utf8(out.stdout).unwrap())
}

/// The object of `kind` named `name`.
pub(crate) fn find<'a>(objects: &'a [Value], kind: &str, name: &str) -> &'a Value {
    objects
        .iter()
        .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("{kind}/{name} missing"))
}

/// Whether `object` is a custom resource of [`CRD_GROUPS`].
pub(crate) fn is_custom_resource(object: &Value) -> bool {
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    CRD_GROUPS.iter().any(|group| api_version.starts_with(&format!("{group}/")))
}

/// Validates every object but the custom resources with `kubernetes-validate --strict`
/// against [`KUBERNETES_VERSION`] (one run for all of them): each must pass, with no warning.
/// `what` names the objects in messages and the temporary file (unique per process and call).
pub(crate) fn kubernetes_validate(objects: &[Value], what: &str) {
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let checked: Vec<&Value> = objects.iter().filter(|o| !is_custom_resource(o)).collect();
    let slug: String =
        what.chars().map(|c| if c.is_ascii_alphanumeric() { c } else { '_' }).take(60).collect();
    let file = std::env::temp_dir().join(format!(
        "percolator-manifests-{}-{}-{slug}.yaml",
        std::process::id(),
        NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
    ));
    let yaml: String =
        checked.iter().map(|o| format!("---\n{}", serde_saphyr::to_string(o).unwrap())).collect();
    std::fs::write(&file, yaml).unwrap();
    let out = std::process::Command::new(super::venv_bin("kubernetes-validate"))
        .args(["--strict", "-k", KUBERNETES_VERSION])
        .arg(&file)
        .output()
        .expect("kubernetes-validate runs");
    let _ = std::fs::remove_file(&file);
    let report = String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr);
    for line in report.lines() {
        let fine = line.starts_with("INFO") && line.contains(" passed for resource ");
        assert!(fine || line.trim().is_empty(), "{what}: {line}");
    }
    let passed = report.lines().filter(|l| l.contains(" passed for resource ")).count();
    assert_eq!(passed, checked.len(), "{what}: every object validated\n{report}");
    assert!(out.status.success(), "{what}: kubernetes-validate failed\n{report}");
}

/// The `restricted` Pod Security Standard (and the baseline it includes) for a pod spec, plus
/// what percolator's manifests promise beyond it: a read-only root filesystem, probes on
/// `/livez` and `/readyz` over HTTPS, and resource requests. `what` names it in messages.
pub(crate) fn assert_restricted_pod_spec(pod: &Value, what: &str) {
    // Baseline: no host namespaces, ports, paths or privilege.
    for field in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(pod.get(field).is_none_or(|v| v == false), "{what}: {field}");
    }
    for volume in pod["volumes"].as_array().into_iter().flatten() {
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
        assert!(kinds.iter().all(|k| allowed.contains(&k.as_str())), "{what}: volume type {kinds:?}");
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
        assert!(sc.get("privileged").is_none_or(|v| v == false), "{what} {name}: privileged");
        assert!(
            container["ports"].as_array().into_iter().flatten().all(|p| p.get("hostPort").is_none()),
            "{what} {name}: hostPort"
        );
        // Restricted: no privilege escalation, all capabilities dropped (only NET_BIND_SERVICE
        // may be added), non-root, RuntimeDefault or Localhost seccomp.
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{what} {name}");
        assert!(sc["capabilities"]["drop"].as_array().unwrap().iter().any(|c| c == "ALL"), "{what} {name}");
        assert!(
            sc["capabilities"]["add"].as_array().into_iter().flatten().all(|c| c == "NET_BIND_SERVICE"),
            "{what} {name}"
        );
        let non_root = sc.get("runAsNonRoot").or(pod_sc.get("runAsNonRoot"));
        assert_eq!(non_root, Some(&Value::Bool(true)), "{what} {name}: runAsNonRoot");
        let uid = sc.get("runAsUser").or(pod_sc.get("runAsUser"));
        assert!(uid.is_none_or(|u| u != 0), "{what} {name}: runAsUser 0");
        let seccomp = sc["seccompProfile"]["type"].as_str().or(pod_sc["seccompProfile"]["type"].as_str());
        assert!(
            matches!(seccomp, Some("RuntimeDefault" | "Localhost")),
            "{what} {name}: seccomp {seccomp:?}"
        );
        // Beyond the standard.
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{what} {name}");
        assert_eq!(container["livenessProbe"]["httpGet"]["path"], "/livez", "{what} {name}");
        assert_eq!(container["readinessProbe"]["httpGet"]["path"], "/readyz", "{what} {name}");
        assert_eq!(container["readinessProbe"]["httpGet"]["scheme"], "HTTPS", "{what} {name}");
        assert!(container["resources"]["requests"]["memory"].is_string(), "{what} {name}: resource requests");
    }
}
