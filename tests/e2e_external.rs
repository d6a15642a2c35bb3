//! external.metrics.k8s.io for the HPA: values against the simulator's truth for every
//! default metric and selector operator, errors, an independent client (the official Python
//! `kubernetes` package), request coalescing, and configuration reload without restart. The
//! values are checked on Prometheus and on VictoriaMetrics behind a TLS + token + tenant front
//! (token rotation, a refused tenant, no secret in the logs).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::{Engine, Env, Options, assert_close, configmap_write, q};
use serde_json::Value;

const EM: &str = "/apis/external.metrics.k8s.io/v1beta1";

fn enc(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect()
}

async fn metric(env: &Env, ns: &str, name: &str, selector: Option<&str>) -> (u16, Value) {
    let mut path = format!("{EM}/namespaces/{ns}/{name}");
    if let Some(selector) = selector {
        path.push_str(&format!("?labelSelector={}", enc(selector)));
    }
    let (code, _, body) = env.get(&path, Some("application/vnd.kubernetes.protobuf, */*")).await;
    (code, serde_json::from_str(&body).unwrap_or(Value::String(body)))
}

/// The HPA sums the items' values.
fn sum(list: &Value) -> f64 {
    list["items"].as_array().unwrap().iter().map(|i| q(&i["value"])).sum()
}

#[tokio::test(flavor = "multi_thread")]
async fn default_metrics_match_the_truth_for_every_selector_form() {
    let env = Env::start(
        "external",
        Options { extra_args: vec!["--enable-external-metrics".into()], ..Options::default() },
    )
    .await;
    default_metrics_match_the_truth(&env).await;
}

/// The default metrics against the truth for every selector form, errors, an independent
/// client and request coalescing, on `env`'s engine (the same truth and tolerances for every
/// engine). Coalescing is counted in Prometheus' query log, or else in the front's accepted
/// requests.
async fn default_metrics_match_the_truth(env: &Env) {
    let truth = env.truth().await;
    let cafes: Vec<&Value> =
        truth["cafes"].as_array().unwrap().iter().filter(|c| c["namespace"] == "shop").collect();
    assert!(cafes.len() >= 2, "shop has cafes");
    let (a, b) = (cafes[0], cafes[1]);
    let name = |c: &Value| c["name"].as_str().unwrap().to_string();
    let bpm = |c: &Value| c["brewsPerMinute"].as_f64().unwrap();

    // cafe_brews_per_minute with =, in and != (and the whole namespace).
    let (code, list) = metric(env, "shop", "cafe_brews_per_minute", Some(&format!("cafe={}", name(a)))).await;
    assert_eq!(code, 200, "{list}");
    assert_eq!(list["kind"], "ExternalMetricValueList");
    assert_eq!(list["items"].as_array().unwrap().len(), 1);
    let item = &list["items"][0];
    assert_eq!(item["metricName"], "cafe_brews_per_minute");
    assert_eq!(item["metricLabels"]["cafe"], name(a).as_str());
    assert_eq!(item["metricLabels"]["type"], a["type"]);
    assert_eq!(item["window"], 60);
    assert!(item["timestamp"].as_str().unwrap().ends_with('Z'));
    assert_close(q(&item["value"]), bpm(a), 0.05, "cafe_brews_per_minute cafe=a");
    let (_, list) =
        metric(env, "shop", "cafe_brews_per_minute", Some(&format!("cafe in ({},{})", name(a), name(b))))
            .await;
    assert_close(sum(&list), bpm(a) + bpm(b), 0.05, "cafe in (a,b)");
    let (_, list) = metric(env, "shop", "cafe_brews_per_minute", Some(&format!("cafe!={}", name(a)))).await;
    let others: f64 = cafes.iter().filter(|c| c["name"] != a["name"]).map(|c| bpm(c)).sum();
    assert_close(sum(&list), others, 0.05, "cafe!=a");
    let (_, list) = metric(env, "shop", "cafe_brews_per_minute", None).await;
    assert_close(sum(&list), cafes.iter().map(|c| bpm(c)).sum(), 0.05, "no selector");
    let (_, list) =
        metric(env, "shop", "cafe_brews_per_minute", Some(&format!("type={}", a["type"].as_str().unwrap())))
            .await;
    let same_type: f64 = cafes.iter().filter(|c| c["type"] == a["type"]).map(|c| bpm(c)).sum();
    assert_close(sum(&list), same_type, 0.05, "type=");

    // cafe_brew_duration_p95_seconds.
    let (_, list) =
        metric(env, "shop", "cafe_brew_duration_p95_seconds", Some(&format!("cafe={}", name(a)))).await;
    assert_close(sum(&list), a["duration"]["p95"].as_f64().unwrap(), 0.05, "p95");

    // http_requests_per_second and http_error_ratio for a pod with errors.
    let pod = truth["pods"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["namespace"] == "shop" && p["errorsPerSecond"].as_f64().is_some_and(|e| e > 0.0))
        .unwrap();
    let pod_name = pod["name"].as_str().unwrap();
    let (_, list) = metric(env, "shop", "http_requests_per_second", Some(&format!("pod={pod_name}"))).await;
    assert_close(sum(&list), pod["requestsPerSecond"].as_f64().unwrap(), 0.05, "http_requests_per_second");
    let (_, list) =
        metric(env, "shop", "http_requests_per_second", Some(&format!("pod={pod_name},code in (500,503)")))
            .await;
    assert_close(sum(&list), pod["errorsPerSecond"].as_f64().unwrap(), 0.05, "http_requests_per_second 5xx");
    let (_, list) = metric(env, "shop", "http_error_ratio", Some(&format!("pod={pod_name}"))).await;
    let ratio = pod["errorsPerSecond"].as_f64().unwrap() / pod["requestsPerSecond"].as_f64().unwrap();
    assert_close(sum(&list), ratio, 0.05, "http_error_ratio");
    // The namespace in the path bounds the query: a pod of another namespace matches nothing.
    let (code, list) = metric(env, "api", "http_requests_per_second", Some(&format!("pod={pod_name}"))).await;
    assert_eq!((code, list["items"].clone()), (200, serde_json::json!([])));

    // Errors: unknown metric 404, malformed selector 400, label not accepted 400 naming it.
    let (code, body) = metric(env, "shop", "no_such_metric", None).await;
    assert_eq!(code, 404, "{body}");
    assert_eq!(body["reason"], "NotFound");
    assert_eq!(body["message"], "the server could not find the metric no_such_metric for namespaces/shop");
    let (code, body) = metric(env, "shop", "cafe_brews_per_minute", Some("cafe in (a")).await;
    assert_eq!(code, 400, "{body}");
    assert!(body["message"].as_str().unwrap().starts_with("unable to parse requirement"), "{body}");
    let (code, body) = metric(env, "shop", "cafe_brews_per_minute", Some("pod=x")).await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["reason"], "BadRequest");
    assert!(body["message"].as_str().unwrap().contains("label \"pod\" is not accepted"), "{body}");
    let (code, body) = metric(env, "Bad_NS", "cafe_brews_per_minute", None).await;
    assert_eq!(code, 400, "{body}");

    // Discovery lists the metrics; kubectl sees the group.
    let resources = env.get_json(EM).await;
    let names: Vec<&str> =
        resources["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap()).collect();
    for expected in [
        "cafe_brews_per_minute",
        "cafe_brew_duration_p95_seconds",
        "http_requests_per_second",
        "http_error_ratio",
    ] {
        assert!(names.contains(&expected), "{names:?}");
    }
    let out = env.kubectl_ok(&[
        "get",
        "--raw",
        &format!(
            "{EM}/namespaces/shop/cafe_brews_per_minute?labelSelector={}",
            enc(&format!("cafe={}", name(a)))
        ),
    ]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["items"][0]["metricLabels"]["cafe"],
        name(a).as_str()
    );

    // An independent client: the official Python kubernetes package decodes the list and
    // parses every value as a Quantity.
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/python/external_metrics_client.py");
    let out = std::process::Command::new(common::python())
        .arg(script)
        .arg(&env.url)
        .arg(env.dir.join("certs/apiserver.crt"))
        .args([
            common::TESTER_TOKEN,
            "shop",
            "cafe_brews_per_minute",
            &format!("cafe in ({},{})", name(a), name(b)),
        ])
        .output()
        .unwrap();
    assert!(out.status.success(), "python client: {}", String::from_utf8_lossy(&out.stderr));
    let decoded: Value = serde_json::from_slice(&out.stdout).unwrap();
    let python_sum: f64 =
        decoded["items"].as_array().unwrap().iter().map(|i| i["value"].as_f64().unwrap()).sum();
    assert_eq!(decoded["items"].as_array().unwrap().len(), 2);
    assert_close(python_sum, bpm(a) + bpm(b), 0.05, "python-decoded values");

    // 100 concurrent identical cold requests: one PromQL query.
    let selector = format!("cafe={},type={}", name(b), b["type"].as_str().unwrap());
    let path =
        format!("{}{EM}/namespaces/shop/cafe_brews_per_minute?labelSelector={}", env.url, enc(&selector));
    // VictoriaMetrics keeps no query log: there, the front counts the queries.
    let logged = env.prometheus.logged_queries().map(|queries| queries.len());
    let accepted = env.front.as_ref().map(|front| front.counts().accepted);
    assert!(logged.is_some() || accepted.is_some(), "the queries are counted somewhere");
    let tasks: Vec<_> = (0..100)
        .map(|_| {
            let (client, path) = (env.client.clone(), path.clone());
            tokio::spawn(async move { client.get(path).send().await.unwrap().status().as_u16() })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap(), 200);
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    if let Some(before) = logged {
        let new: Vec<String> = env.prometheus.queries()[before..]
            .iter()
            .filter(|q| q.contains("cafe_brews_total"))
            .cloned()
            .collect();
        assert_eq!(new.len(), 1, "one query for 100 identical requests: {new:#?}");
        assert!(new[0].contains("namespace=\"shop\""), "{}", new[0]);
    }
    if let Some(before) = accepted {
        assert_eq!(env.front().counts().accepted - before, 1, "one query for 100 identical requests");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn default_metrics_match_the_truth_for_every_selector_form_on_victoriametrics() {
    let env = Env::start(
        "external-vm",
        Options {
            extra_args: vec!["--enable-external-metrics".into()],
            engine: Engine::VictoriaMetrics,
            secure_front: true,
            ..Options::default()
        },
    )
    .await;
    default_metrics_match_the_truth(&env).await;
    secure_front_passes_rotated_tokens_and_refuses_other_tenants(&env).await;
}

/// percolator behind [`common::securefront::SecureFront`]: every request it made so far was
/// accepted (certificate, token, tenant); a rotated token is used within 2 s; with a tenant the
/// front refuses, the Prometheus fields are omitted with a Warning; no token is ever logged.
async fn secure_front_passes_rotated_tokens_and_refuses_other_tenants(env: &Env) {
    let front = env.front();
    let counts = front.counts();
    assert!(counts.accepted > 10, "percolator's queries went through the front: {counts:?}");
    assert_eq!(counts.rejected(), 0, "{counts:?}");
    let first_token = std::fs::read_to_string(&front.files().token).unwrap();

    // Rotation: the front takes the new token at once; percolator re-reads the file within 2 s
    // (and the cache TTL, 2 s, has passed: the next request queries again).
    let second_token = common::front_token(2);
    front.rotate_token(&second_token).unwrap();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let truth = env.truth().await;
    let cafe = truth["cafes"].as_array().unwrap().iter().find(|c| c["namespace"] == "shop").unwrap();
    let before = front.counts();
    let (code, list) = metric(
        env,
        "shop",
        "cafe_brews_per_minute",
        Some(&format!("cafe={}", cafe["name"].as_str().unwrap())),
    )
    .await;
    assert_eq!(code, 200, "{list}");
    assert_close(sum(&list), cafe["brewsPerMinute"].as_f64().unwrap(), 0.05, "after the token rotation");
    let after = front.counts();
    assert_eq!((after.accepted - before.accepted, after.rejected()), (1, 0), "{after:?}");

    // A tenant the front refuses: the objects stay, the Prometheus fields go, each with a
    // Warning naming the failure.
    front.set_tenant("another-team");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let (code, headers, body) =
        env.get("/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries", None).await;
    assert_eq!(code, 200, "{body}");
    let list: Value = serde_json::from_str(&body).unwrap();
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), common::running_pods(&truth, "shop").len(), "{list}");
    for item in items {
        assert!(item.get("requests").is_none() && item.get("errors").is_none(), "{item}");
    }
    let mut warnings: Vec<&str> = headers.get_all("warning").iter().map(|w| w.to_str().unwrap()).collect();
    warnings.sort_unstable();
    let refused_by = "prometheus unreachable: POST /api/v1/query: HTTP 403 Forbidden: tenant not allowed";
    assert_eq!(
        warnings,
        [
            format!("299 - \"errors omitted: {refused_by}\""),
            format!("299 - \"requests omitted: {refused_by}\""),
        ]
    );
    let refused = front.counts();
    assert_eq!(
        (refused.accepted, refused.rejected_tenant, refused.rejected_token, refused.rejected_tls),
        (after.accepted, 2, 0, 0),
        "one refused query per field"
    );

    // No token in percolator's log, whatever happened.
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    for token in [first_token.trim(), second_token.as_str()] {
        assert!(!log.contains(token), "the token {token} is in the log");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn configuration_reloads_without_restart_and_rejects_bad_files() {
    let dir = common::mk_dir("reload-config");
    configmap_write(&dir, 1, "window: 1m\n");
    let env = Env::start(
        "reload",
        Options {
            extra_args: vec![
                "--enable-external-metrics".into(),
                "--config".into(),
                dir.join("config.yaml").display().to_string(),
            ],
            ..Options::default()
        },
    )
    .await;
    let names = |v: &Value| -> Vec<String> {
        v["resources"].as_array().unwrap().iter().map(|r| r["name"].as_str().unwrap().to_string()).collect()
    };
    assert!(!names(&env.get_json(EM).await).contains(&"cafe_failures_per_minute".to_string()));

    // A new metric definition, delivered as a ConfigMap symlink swap.
    let new_config = "window: 1m\nexternalMetrics:\n  - name: cafe_failures_per_minute\n    query: sum by (namespace, cafe) (rate(cafe_brew_failures_total{SCOPE}[WINDOW])) * 60\n    labels: [cafe]\n";
    configmap_write(&dir, 2, new_config);
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        if names(&env.get_json(EM).await) == ["cafe_failures_per_minute"] {
            break;
        }
        assert!(Instant::now() < deadline, "the new metric list never appeared in discovery");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let truth = env.truth().await;
    let cafe = truth["cafes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["namespace"] == "shop" && c["failuresPerMinute"].as_f64().unwrap() > 0.0)
        .unwrap();
    let (code, list) = metric(
        &env,
        "shop",
        "cafe_failures_per_minute",
        Some(&format!("cafe={}", cafe["name"].as_str().unwrap())),
    )
    .await;
    assert_eq!(code, 200, "{list}");
    assert_close(sum(&list), cafe["failuresPerMinute"].as_f64().unwrap(), 0.05, "reloaded metric");
    let (code, _) = metric(&env, "shop", "cafe_brews_per_minute", None).await;
    assert_eq!(code, 404, "the old definitions are gone");

    // An invalid file is rejected: the last good configuration stays, a metric says so.
    configmap_write(&dir, 3, "window: 1m\nexternalMetrics: []\n");
    env.wait_for_rejected_reload().await;
    assert_eq!(names(&env.get_json(EM).await), ["cafe_failures_per_minute"]);
    assert_eq!(metric(&env, "shop", "cafe_failures_per_minute", None).await.0, 200);
    let log = std::fs::read_to_string(&env.stderr_log).unwrap();
    assert!(log.contains("configuration rejected"), "a log line names the rejection");
    // The server never restarted: PodMetricsSummaries kept being served throughout.
    assert_eq!(
        env.get("/apis/stats.une-tasse-de.cafe/v1alpha1/namespaces/shop/podmetricssummaries", None).await.0,
        200
    );
}
