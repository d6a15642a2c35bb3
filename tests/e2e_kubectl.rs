//! kubectl against percolator, values checked against the simulator's ground truth, with
//! Prometheus and with VictoriaMetrics serving PromQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};

use common::{Engine, Env, Options, assert_close, q};
use serde_json::Value;

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";

fn running(truth: &Value) -> Vec<&Value> {
    truth["pods"].as_array().unwrap().iter().filter(|p| p["phase"] == "Running").collect()
}

fn key(v: &Value) -> (String, String) {
    (v["namespace"].as_str().unwrap().to_string(), v["name"].as_str().unwrap().to_string())
}

/// Splits kubectl's table output into a header and rows of cells.
fn table(out: &str) -> (Vec<String>, Vec<Vec<String>>) {
    let mut lines = out.lines().filter(|l| !l.trim().is_empty());
    let header = lines.next().unwrap_or_default().split_whitespace().map(str::to_string).collect();
    let rows = lines.map(|l| l.split_whitespace().map(str::to_string).collect()).collect();
    (header, rows)
}

fn check_against_truth(item: &Value, pod: &Value) {
    let what = format!("{}/{}", pod["namespace"], pod["name"]);
    let containers = pod["containers"].as_array().unwrap();
    let cpu: f64 = containers.iter().map(|c| c["cpuCores"].as_f64().unwrap()).sum();
    let memory: f64 = containers.iter().map(|c| c["memoryBytes"].as_f64().unwrap()).sum();
    assert_close(q(&item["cpu"]), cpu, 0.05, &format!("{what} cpu"));
    assert_close(q(&item["memory"]), memory, 0.05, &format!("{what} memory"));
    let items = item["containers"].as_array().unwrap();
    assert_eq!(items.len(), containers.len(), "{what} containers");
    for c in containers {
        let got = items
            .iter()
            .find(|i| i["name"] == c["name"])
            .unwrap_or_else(|| panic!("{what} lacks {}", c["name"]));
        assert_close(
            q(&got["cpu"]),
            c["cpuCores"].as_f64().unwrap(),
            0.05,
            &format!("{what} {} cpu", c["name"]),
        );
        assert_close(
            q(&got["memory"]),
            c["memoryBytes"].as_f64().unwrap(),
            0.05,
            &format!("{what} {} memory", c["name"]),
        );
    }
    match pod["requestsPerSecond"].as_f64() {
        Some(r) => assert_close(q(&item["requests"]), r, 0.05, &format!("{what} requests")),
        None => assert!(item.get("requests").is_none(), "{what}: requests must be omitted: {item}"),
    }
    match pod["errorsPerSecond"].as_f64() {
        Some(e) => {
            assert_close(q(&item["errors"]), e, 0.05, &format!("{what} errors"));
            let r = pod["requestsPerSecond"].as_f64().unwrap();
            assert_close(q(&item["errorRatio"]), e / r, 0.05, &format!("{what} errorRatio"));
        }
        None => {
            assert!(item.get("errors").is_none(), "{what}: errors must be omitted: {item}");
            assert!(item.get("errorRatio").is_none(), "{what}: errorRatio must be omitted: {item}");
        }
    }
    assert_eq!(item["window"], "1m0s");
    assert_eq!(item["kind"], "PodMetricsSummary");
    assert_eq!(item["apiVersion"], "stats.une-tasse-de.cafe/v1alpha1");
    assert_eq!(item["metadata"]["labels"], pod["labels"], "{what} labels");
    assert_eq!(item["metadata"]["creationTimestamp"], pod["creationTimestamp"], "{what} creationTimestamp");
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_lists_match_the_simulators_truth() {
    kubectl_lists_match_the_simulators_truth_on(Engine::Prometheus).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn kubectl_lists_match_the_simulators_truth_on_victoriametrics() {
    kubectl_lists_match_the_simulators_truth_on(Engine::VictoriaMetrics).await;
}

/// Every PodMetricsSummary through kubectl against the truth, the requests and errors read
/// from `engine` (the same truth and tolerances for both).
async fn kubectl_lists_match_the_simulators_truth_on(engine: Engine) {
    let env_name = match engine {
        Engine::Prometheus => "kubectl",
        Engine::VictoriaMetrics => "kubectl-vm",
    };
    let env = Env::start(env_name, Options { engine, ..Options::default() }).await;
    env.wait_for_cpu(None).await;
    let truth = env.truth().await;
    let running = running(&truth);
    assert!(running.len() >= 12, "the workload has running pods");
    assert!(running.iter().any(|p| p["errorsPerSecond"].is_null() && !p["requestsPerSecond"].is_null()));
    assert!(running.iter().any(|p| p["requestsPerSecond"].is_null()));
    let by_key: BTreeMap<_, _> = running.iter().map(|p| (key(p), *p)).collect();

    // api-resources: name, short name, namespaced, kind, verbs.
    let out = env.kubectl_ok(&["api-resources", "--api-group=stats.une-tasse-de.cafe", "-o", "wide"]);
    let (header, rows) = table(&out);
    assert_eq!(header, ["NAME", "SHORTNAMES", "APIVERSION", "NAMESPACED", "KIND", "VERBS", "CATEGORIES"]);
    let expected = [
        [
            "cafebrewstats",
            "brews",
            "stats.une-tasse-de.cafe/v1alpha1",
            "true",
            "CafeBrewStats",
            "get,list",
            "percolator",
        ],
        [
            "podmetricssummaries",
            "pms",
            "stats.une-tasse-de.cafe/v1alpha1",
            "true",
            "PodMetricsSummary",
            "get,list",
            "percolator",
        ],
    ];
    assert_eq!(rows, expected);

    // -o json across all namespaces: every running pod, values within 5% of the truth.
    let list: Value = serde_json::from_str(&env.kubectl_ok(&["get", "pms", "-A", "-o", "json"])).unwrap();
    let items = list["items"].as_array().unwrap();
    let got: BTreeSet<_> = items.iter().map(|i| key(&i["metadata"])).collect();
    assert_eq!(got, by_key.keys().cloned().collect::<BTreeSet<_>>(), "exactly the running pods");
    for item in items {
        check_against_truth(item, by_key[&key(&item["metadata"])]);
    }

    // The human table: columns of docs/design.md, one row per running pod.
    let (header, rows) = table(&env.kubectl_ok(&["get", "pms", "-A"]));
    assert_eq!(header, ["NAMESPACE", "NAME", "CPU", "MEMORY", "REQ/S", "ERR/S", "ERROR%", "AGE"]);
    assert_eq!(rows.len(), running.len());
    for row in &rows {
        let pod = by_key[&(row[0].clone(), row[1].clone())];
        let cpu: f64 =
            pod["containers"].as_array().unwrap().iter().map(|c| c["cpuCores"].as_f64().unwrap()).sum();
        assert!(row[2].ends_with('m'), "cpu cell {row:?}");
        assert_close(k8s_wire::quantity::parse(&row[2]).unwrap(), cpu, 0.05, "cpu cell");
        assert!(row[3].ends_with("Mi"), "memory cell {row:?}");
        match pod["requestsPerSecond"].as_f64() {
            Some(r) => assert_close(row[4].parse().unwrap(), r, 0.05, "req/s cell"),
            None => assert_eq!(row[4], "<none>"),
        }
        match pod["errorsPerSecond"].as_f64() {
            Some(e) => {
                assert_close(row[5].parse().unwrap(), e, 0.05, "err/s cell");
                assert!(row[6].ends_with('%'), "{row:?}");
            }
            None => assert_eq!((row[5].as_str(), row[6].as_str()), ("<none>", "<none>")),
        }
    }

    // -o wide adds WINDOW, CONTAINERS, NODE.
    let (header, rows) = table(&env.kubectl_ok(&["get", "pms", "-n", "shop", "-o", "wide"]));
    assert_eq!(
        header,
        ["NAME", "CPU", "MEMORY", "REQ/S", "ERR/S", "ERROR%", "AGE", "WINDOW", "CONTAINERS", "NODE"]
    );
    for row in &rows {
        let pod = by_key[&("shop".to_string(), row[0].clone())];
        assert_eq!(row[7], "1m0s");
        assert_eq!(row[8], pod["containers"].as_array().unwrap().len().to_string());
        assert_eq!(row[9], pod["node"].as_str().unwrap());
    }

    // Label selector with set syntax.
    let (_, rows) = table(&env.kubectl_ok(&["get", "pms", "-n", "shop", "-l", "app in (web,api)"]));
    let expected: BTreeSet<String> = running
        .iter()
        .filter(|p| p["namespace"] == "shop" && (p["labels"]["app"] == "web" || p["labels"]["app"] == "api"))
        .map(|p| p["name"].as_str().unwrap().to_string())
        .collect();
    assert!(!expected.is_empty());
    assert_eq!(rows.iter().map(|r| r[0].clone()).collect::<BTreeSet<_>>(), expected);

    // notin, !key, key.
    for (selector, pred) in [
        ("app notin (web)", &(|p: &Value| p["labels"]["app"] != "web") as &dyn Fn(&Value) -> bool),
        ("!tier", &|p: &Value| p["labels"].get("tier").is_none()),
        ("tier", &|p: &Value| p["labels"].get("tier").is_some()),
        ("app!=cache,app==web", &|p: &Value| p["labels"]["app"] == "web"),
    ] {
        let list: Value =
            serde_json::from_str(&env.kubectl_ok(&["get", "pms", "-A", "-l", selector, "-o", "json"]))
                .unwrap();
        let got: BTreeSet<_> =
            list["items"].as_array().unwrap().iter().map(|i| key(&i["metadata"])).collect();
        let want: BTreeSet<_> = running.iter().filter(|p| pred(p)).map(|p| key(p)).collect();
        assert_eq!(got, want, "selector {selector}");
    }

    // Field selector on the name.
    let target = running[0];
    let name = target["name"].as_str().unwrap();
    let ns = target["namespace"].as_str().unwrap();
    let (_, rows) = table(&env.kubectl_ok(&[
        "get",
        "pms",
        "-n",
        ns,
        "--field-selector",
        &format!("metadata.name={name}"),
    ]));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], name);

    // A single get, as YAML.
    let item: Value =
        serde_saphyr::from_str(&env.kubectl_ok(&["get", "pms", "-n", ns, name, "-o", "yaml"])).unwrap();
    check_against_truth(&item, target);
    // -o yaml of a list is the v1 List kubectl builds.
    let yaml: Value =
        serde_saphyr::from_str(&env.kubectl_ok(&["get", "pms", "-n", "api", "-o", "yaml"])).unwrap();
    assert_eq!(yaml["kind"], "List");

    // Not found and empty namespaces, as kubectl prints them. (`kubectl get pms NAME` would
    // then look the namespace up in the core API, which only kube-apiserver serves, so the
    // message is checked on the raw path.)
    let out = env.kubectl(&["get", "--raw", &format!("{GV}/namespaces/{ns}/podmetricssummaries/nope")]);
    assert!(!out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "Error from server (NotFound): podmetricssummaries.stats.une-tasse-de.cafe \"nope\" not found"
    );
    let out = env.kubectl(&["get", "pms", "-n", ns, "nope"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("(NotFound)"));
    let out = env.kubectl(&["get", "pms", "-n", "empty-namespace"]);
    assert!(out.status.success());
    assert_eq!(
        String::from_utf8_lossy(&out.stderr).trim(),
        "No resources found in empty-namespace namespace."
    );

    // explain prints the field documentation from OpenAPI v3.
    let out = env.kubectl_ok(&["explain", "podmetricssummaries"]);
    assert!(out.contains("KIND:       PodMetricsSummary"), "{out}");
    assert!(out.contains("errorRatio"), "{out}");
    let out = env.kubectl_ok(&["explain", "podmetricssummaries.containers"]);
    assert!(out.contains("FIELD: containers <[]PodMetricsSummaryContainer>"), "{out}");
    assert!(out.contains("Usage of each container"), "{out}");
    assert!(out.contains("memory\t<string>") || out.contains("memory"), "{out}");
    let out = env.kubectl_ok(&["explain", "pms.cpu"]);
    let squashed = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(squashed.contains("the sum of its containers' CPU"), "{out}");

    // get --raw on the discovery paths.
    for path in
        ["/api", "/apis", "/apis/stats.une-tasse-de.cafe", GV, "/version", "/openapi/v2", "/openapi/v3"]
    {
        let out = env.kubectl_ok(&["get", "--raw", path]);
        serde_json::from_str::<Value>(&out).unwrap_or_else(|e| panic!("{path}: {e}: {out}"));
    }
    let resources: Value = serde_json::from_str(&env.kubectl_ok(&["get", "--raw", GV])).unwrap();
    assert_eq!(resources["resources"][0]["name"], "podmetricssummaries");
    let raw: Value = serde_json::from_str(&env.kubectl_ok(&[
        "get",
        "--raw",
        &format!("{GV}/namespaces/{ns}/podmetricssummaries/{name}"),
    ]))
    .unwrap();
    check_against_truth(&raw, target);
}
