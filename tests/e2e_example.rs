//! The `apiserver` library's example server (`crates/apiserver/examples/zones.rs`: one `Zone`
//! per `topology.kubernetes.io/zone` of the nodes) behind the simulated kube-apiserver's
//! aggregation layer, as an `APIService` would put it, read with the real `kubectl` as two
//! users of the cluster: discovery, the Table's columns and cells against the zones the
//! nodes' labels make (read from the simulated API, the ground truth), a label and a field
//! selector, the object's JSON, `kubectl explain` through the aggregated OpenAPI, and a user
//! the cluster's SubjectAccessReview denies.
//!
//! The example's own file is compiled into this test, so that what runs is what
//! `cargo run --example zones` runs, with its flags.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

#[path = "../crates/apiserver/examples/zones.rs"]
#[allow(dead_code)] // its `main`
mod zones;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use clap::Parser;
use serde_json::Value;

/// Nodes of the simulated cluster: three zones of unequal sizes (`node-i` in zone `i % 3`).
const NODES: u32 = 7;

/// A kubeconfig at `dir/<user>.kubeconfig` for the simulated API, with `user`'s token of its
/// built-in policy (`admin`: `system:masters`; `bob`: no rights).
fn mk_kubeconfig(dir: &Path, api: &str, ca: &Path, user: &str) -> PathBuf {
    let path = dir.join(format!("{user}.kubeconfig"));
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {api}\n    certificate-authority: {}\ncontexts:\n- name: sim\n  context: {{cluster: sim, user: {user}}}\ncurrent-context: sim\nusers:\n- name: {user}\n  user: {{token: {user}-token}}\n",
        ca.display()
    );
    std::fs::write(&path, text).unwrap();
    path
}

/// `kubectl` with `kubeconfig`; its output.
fn mk_kubectl(kubeconfig: &Path, args: &[&str]) -> Output {
    let kubectl = std::env::var("KUBECTL").unwrap_or_else(|_| "/usr/bin/kubectl".to_owned());
    std::process::Command::new(kubectl).arg("--kubeconfig").arg(kubeconfig).args(args).output().unwrap()
}

/// `kubectl` that must succeed; its standard output.
fn mk_kubectl_ok(kubeconfig: &Path, args: &[&str]) -> String {
    let out = mk_kubectl(kubeconfig, args);
    assert!(out.status.success(), "kubectl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// A loopback port free now.
fn mk_free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_server_serves_zones_through_the_aggregator() {
    apiserver::install_crypto_provider();
    let dir = std::env::temp_dir().join(format!("percolator-e2e-example-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let mut config = percolator_sim::sim::SimConfig::with_state_dir(dir.join("sim"));
    config.nodes = NODES;
    let sim = percolator_sim::sim::start(config).await.unwrap();

    let port = mk_free_port().to_string();
    let certs = dir.join("certs");
    let flags = ["zones", "--bind-address", "127.0.0.1", "--secure-port", &port, "--cert-dir"];
    let mut flags: Vec<String> = flags.iter().map(|f| (*f).to_owned()).collect();
    flags.extend([certs.display().to_string(), "--kubeconfig".into(), sim.kubeconfig.display().to_string()]);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(zones::run(zones::Args::parse_from(flags), async move {
        let _ = stopped.await;
    }));

    // As kube-apiserver does once the APIService exists: discovery read, groups proxied.
    let url = format!("https://127.0.0.1:{port}");
    let mut groups = None;
    for _ in 0..100 {
        if let Ok(ca) = std::fs::read(certs.join("apiserver.crt"))
            && let Ok(registered) = sim.register_api_service(&url, &ca).await
        {
            groups = Some(registered);
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(groups.expect("the example server never served discovery"), ["topology.example.com"]);

    let ca = sim.ready.state_dir.join("ca.crt");
    let admin = mk_kubeconfig(&dir, &sim.ready.api, &ca, "admin");
    let bob = mk_kubeconfig(&dir, &sim.ready.api, &ca, "bob");

    // The ground truth: the nodes' zone labels and allocatable CPU, from the simulated API.
    let nodes: Value = serde_json::from_str(&mk_kubectl_ok(&admin, &["get", "nodes", "-o", "json"])).unwrap();
    let mut truth: BTreeMap<String, (String, u32, f64)> = BTreeMap::new();
    for node in nodes["items"].as_array().unwrap() {
        let labels = &node["metadata"]["labels"];
        let zone = labels["topology.kubernetes.io/zone"].as_str().unwrap().to_owned();
        let entry = truth.entry(zone).or_default();
        entry.0 = labels["topology.kubernetes.io/region"].as_str().unwrap().to_owned();
        entry.1 += 1;
        entry.2 += k8s_wire::quantity::parse(node["status"]["allocatable"]["cpu"].as_str().unwrap()).unwrap();
    }
    assert_eq!(truth.len(), 3, "the simulated nodes' zones: {truth:?}");
    assert_eq!(truth.values().map(|z| z.1).sum::<u32>(), NODES);

    // Discovery through the aggregator: the resource, its short name, scope and verbs.
    let resources =
        mk_kubectl_ok(&admin, &["api-resources", "--api-group=topology.example.com", "-o", "wide"]);
    let row: Vec<&str> = resources.lines().nth(1).unwrap().split_whitespace().collect();
    assert_eq!(
        row,
        ["zones", "zn", "topology.example.com/v1alpha1", "false", "Zone", "get,list"],
        "{resources}"
    );

    // The Table: its columns, and a row per zone with the truth's values.
    let table = mk_kubectl_ok(&admin, &["get", "zones"]);
    let mut lines = table.lines();
    assert_eq!(
        lines.next().unwrap().split_whitespace().collect::<Vec<_>>(),
        ["NAME", "REGION", "NODES", "CPU"]
    );
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), truth.len(), "{table}");
    for (row, (zone, (region, count, cpu))) in rows.iter().zip(&truth) {
        assert_eq!(row[..3], [zone.as_str(), region.as_str(), &count.to_string()], "{table}");
        assert_eq!(k8s_wire::quantity::parse(row[3]).unwrap(), *cpu, "{table}");
    }

    // One object as JSON, by its short name.
    let (zone, (region, count, cpu)) = truth.iter().next().unwrap();
    let object: Value =
        serde_json::from_str(&mk_kubectl_ok(&admin, &["get", "zn", zone, "-o", "json"])).unwrap();
    assert_eq!(object["kind"], "Zone");
    assert_eq!(object["metadata"]["labels"]["topology.kubernetes.io/region"], region.as_str());
    assert_eq!(object["nodes"], *count);
    assert_eq!(k8s_wire::quantity::parse(object["cpu"].as_str().unwrap()).unwrap(), *cpu);

    // Selectors: a label selector on the region the truth gives one zone, a field selector.
    let lonely: Vec<(&String, &String)> = truth
        .iter()
        .filter(|(_, z)| truth.values().filter(|o| o.0 == z.0).count() == 1)
        .map(|(name, z)| (name, &z.0))
        .collect();
    let (lonely_zone, lonely_region) = lonely[0];
    let selector = format!("topology.kubernetes.io/region={lonely_region}");
    let named = mk_kubectl_ok(&admin, &["get", "zones", "-l", &selector, "-o", "name"]);
    assert_eq!(named.trim(), format!("zone.topology.example.com/{lonely_zone}"));
    let field = format!("metadata.name={zone}");
    let named = mk_kubectl_ok(&admin, &["get", "zones", "--field-selector", &field, "-o", "name"]);
    assert_eq!(named.trim(), format!("zone.topology.example.com/{zone}"));

    // OpenAPI v3, aggregated: kubectl explain reads the field's description.
    let explained = mk_kubectl_ok(&admin, &["explain", "zones.cpu"]);
    assert!(explained.contains("Allocatable CPU of the zone's nodes"), "{explained}");

    // A user the cluster's RBAC grants nothing: the server's SubjectAccessReview says no.
    let denied = mk_kubectl(&bob, &["get", "zones"]);
    assert!(!denied.status.success());
    let message = String::from_utf8_lossy(&denied.stderr);
    assert!(
        message.contains(r#"zones.topology.example.com is forbidden: User "bob" cannot list resource "zones" in API group "topology.example.com" at the cluster scope"#),
        "{message}"
    );

    let _ = stop.send(());
    tokio::time::timeout(Duration::from_secs(30), server).await.unwrap().unwrap().unwrap();
    sim.shutdown().await;
    let _ = std::fs::remove_dir_all(&dir);
}
