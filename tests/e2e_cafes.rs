//! CafeBrewStats through kubectl and the raw API, checked against the simulator's truth, with
//! Prometheus and with VictoriaMetrics serving PromQL.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::{
    Engine, Env, Options, assert_cafe_rates, assert_close, assert_usage_close, bucket_width, key, q, table,
};
use serde_json::Value;

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";

fn seconds(duration: &Value) -> f64 {
    let text = duration.as_str().unwrap();
    let (minutes, rest) = match text.split_once('m') {
        Some((m, rest)) => (m.parse::<f64>().unwrap(), rest),
        None => (0.0, text),
    };
    minutes * 60.0 + rest.trim_end_matches('s').parse::<f64>().unwrap_or(0.0)
}

async fn wait_for_cafe_cpu(env: &Env) -> Value {
    let deadline = Instant::now() + Duration::from_secs(40);
    loop {
        let list = env.get_json(&format!("{GV}/cafebrewstats")).await;
        let items = list["items"].as_array().unwrap();
        if !items.is_empty()
            && items.iter().all(|i| i.get("cpu").is_some() && i.get("brewsPerMinute").is_some())
        {
            return list;
        }
        assert!(Instant::now() < deadline, "cafes never complete: {list}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn cafe_brew_stats_match_the_simulators_truth() {
    cafe_brew_stats_match_the_simulators_truth_on(Engine::Prometheus).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn cafe_brew_stats_match_the_simulators_truth_on_victoriametrics() {
    cafe_brew_stats_match_the_simulators_truth_on(Engine::VictoriaMetrics).await;
}

/// Every CafeBrewStats against the truth, its fields read from `engine` (the same truth and
/// tolerances for both).
async fn cafe_brew_stats_match_the_simulators_truth_on(engine: Engine) {
    let env_name = match engine {
        Engine::Prometheus => "cafes",
        Engine::VictoriaMetrics => "cafes-vm",
    };
    let env = Env::start(env_name, Options { engine, ..Options::default() }).await;
    wait_for_cafe_cpu(&env).await;

    // The temperature moves in 30 s steps: retry when a step boundary fell between Prometheus'
    // last scrape and now. `seen`: each cafe's last brew as the engine answered it before a
    // cache TTL (and a margin) passed, so the list below was computed from a later query.
    let (list, truth, seen) = loop {
        let seen = engine_last_brews(&env).await;
        tokio::time::sleep(Duration::from_secs_f64(CACHE_TTL + 1.5)).await;
        let truth = env.truth().await;
        let list: Value =
            serde_json::from_str(&env.kubectl_ok(&["get", "brews", "-A", "-o", "json"])).unwrap();
        let now = truth["time"].as_f64().unwrap();
        let step_start = truth["cafes"][0]["temperatureStepStart"].as_f64().unwrap();
        if now - step_start > 6.0 && now - step_start < 28.0 {
            break (list, truth, seen);
        }
    };
    let cafes: BTreeMap<_, _> = truth["cafes"].as_array().unwrap().iter().map(|c| (key(c), c)).collect();
    assert!(cafes.len() >= 6, "the workload has cafes");
    let items = list["items"].as_array().unwrap();
    let got: BTreeSet<_> = items.iter().map(|i| key(&i["metadata"])).collect();
    assert_eq!(got, cafes.keys().cloned().collect::<BTreeSet<_>>(), "exactly the simulated cafes");

    let (mut ready, mut not_ready) = (0, 0);
    for item in items {
        let cafe = cafes[&key(&item["metadata"])];
        let what = format!("{}/{}", cafe["namespace"], cafe["name"]);
        assert_eq!(item["kind"], "CafeBrewStats");
        assert_eq!(item["type"], cafe["type"], "{what}");
        assert_eq!(item["window"], "1m0s");
        assert_cafe_rates(item, cafe, &what);
        assert_close(
            item["brews"].as_f64().unwrap(),
            cafe["brewsPerMinute"].as_f64().unwrap(),
            0.05 + 1.0 / cafe["brewsPerMinute"].as_f64().unwrap(),
            &format!("{what} brews in the 1m window"),
        );
        for p in ["p50", "p95", "p99"] {
            let expected = cafe["duration"][p].as_f64().unwrap();
            let got = seconds(&item["brewDuration"][p]);
            assert!((got - expected).abs() <= bucket_width(expected), "{what} {p}: {got} vs {expected}");
        }
        // Temperature: exact to the last scrape.
        assert_close(
            q(&item["temperature"]),
            cafe["temperature"].as_f64().unwrap(),
            1e-6,
            &format!("{what} temperature"),
        );
        // lastBrewed: the last brew as of the scrape the served answer was computed from: no
        // older than what the engine answered before the list's cache entry could have been
        // filled (`seen`, whatever the engine's scrape and ingestion delays), at most one brew
        // newer than the truth read just before the list (a brew between the two), a whole
        // number of brews from the truth, and in whole seconds (truncated).
        let last =
            item["lastBrewed"].as_str().unwrap().parse::<jiff::Timestamp>().unwrap().as_second() as f64;
        let expected = cafe["lastBrewed"].as_f64().unwrap();
        let seen = seen[&key(&item["metadata"])];
        let between_brews = 60.0 / cafe["brewsPerMinute"].as_f64().unwrap().max(1e-9);
        let lag = expected - last;
        let off_brew = (lag - (lag / between_brews).round() * between_brews).abs();
        assert!(
            last >= seen.floor() && lag >= -between_brews - 1.0 && off_brew <= 1.0,
            "{what} lastBrewed {last} vs {expected} (a brew every {between_brews:.1}s; the engine \
             said {seen} before the list)"
        );
        // Serving pods and their usage.
        assert_eq!(
            item["pods"].as_u64().unwrap() as usize,
            cafe["pods"].as_array().unwrap().len(),
            "{what} pods"
        );
        assert_usage_close(item, cafe, (0.05, 0.05), &what);
        // ready: temperature within 60–95 °C and at least one serving pod.
        let t = cafe["temperature"].as_f64().unwrap();
        let expected_ready = (60.0..=95.0).contains(&t) && !cafe["pods"].as_array().unwrap().is_empty();
        assert_eq!(item["ready"], expected_ready, "{what} ready at {t} °C");
        if expected_ready { ready += 1 } else { not_ready += 1 }
    }
    assert!(
        ready > 0 && not_ready > 0,
        "one cafe inside and one outside the band ({ready} ready, {not_ready} not)"
    );

    // The human table and its wide columns.
    let (header, rows) = table(&env.kubectl_ok(&["get", "brews", "-A"]));
    assert_eq!(header, ["NAMESPACE", "NAME", "TYPE", "BREWS/MIN", "P95", "TEMP", "READY", "LAST BREWED"]);
    assert_eq!(rows.len(), cafes.len());
    for row in &rows {
        let cafe = cafes[&(row[0].clone(), row[1].clone())];
        assert_eq!(row[2], cafe["type"].as_str().unwrap());
        assert_close(
            row[3].parse().unwrap(),
            cafe["brewsPerMinute"].as_f64().unwrap(),
            0.05,
            "BREWS/MIN cell",
        );
        assert!(row[4].ends_with('s'), "P95 cell {row:?}");
        assert!(row[6] == "true" || row[6] == "false", "READY cell {row:?}");
        assert!(row[7].ends_with('s') || row[7].ends_with('m'), "LAST BREWED cell {row:?}");
    }
    let (header, rows) = table(&env.kubectl_ok(&["get", "brews", "-n", "shop", "-o", "wide"]));
    assert_eq!(
        header,
        [
            "NAME",
            "TYPE",
            "BREWS/MIN",
            "P95",
            "TEMP",
            "READY",
            "LAST BREWED",
            "FAILURES",
            "PODS",
            "CPU",
            "MEMORY"
        ]
    );
    for row in &rows {
        let cafe = cafes[&("shop".to_string(), row[0].clone())];
        assert_eq!(row[8], cafe["pods"].as_array().unwrap().len().to_string());
        assert!(row[9].ends_with('m') && row[10].ends_with("Mi"), "{row:?}");
    }

    // Label and field selectors.
    let espresso: BTreeSet<_> = cafes.values().filter(|c| c["type"] == "espresso").map(|c| key(c)).collect();
    assert!(!espresso.is_empty());
    let list: Value = serde_json::from_str(&env.kubectl_ok(&[
        "get",
        "brews",
        "-A",
        "-l",
        "une-tasse-de.cafe/type=espresso",
        "-o",
        "json",
    ]))
    .unwrap();
    let got: BTreeSet<_> = list["items"].as_array().unwrap().iter().map(|i| key(&i["metadata"])).collect();
    assert_eq!(got, espresso);
    let (ns, name) = cafes.keys().next().unwrap().clone();
    let (_, rows) = table(&env.kubectl_ok(&[
        "get",
        "brews",
        "-n",
        &ns,
        "--field-selector",
        &format!("metadata.name={name}"),
    ]));
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0][0], name);

    // explain and raw paths.
    let out = env.kubectl_ok(&["explain", "cafebrewstats.brewDuration"]);
    assert!(out.contains("p95"), "{out}");
    let out = env.kubectl_ok(&["explain", "brews"]);
    assert!(out.contains("KIND:       CafeBrewStats"), "{out}");
    let raw: Value = serde_json::from_str(&env.kubectl_ok(&[
        "get",
        "--raw",
        &format!("{GV}/namespaces/{ns}/cafebrewstats/{name}"),
    ]))
    .unwrap();
    assert_eq!(raw["metadata"]["name"], name.as_str());
    let raw: Value = serde_json::from_str(&env.kubectl_ok(&[
        "get",
        "--raw",
        &format!("{GV}/namespaces/{ns}/cafebrewstats"),
    ]))
    .unwrap();
    assert_eq!(raw["kind"], "CafeBrewStatsList");

    // The category lists both kinds.
    let out = env.kubectl_ok(&["get", "percolator", "-A", "-o", "name"]);
    assert!(out.lines().any(|l| l.starts_with("cafebrewstats.stats.une-tasse-de.cafe/")), "{out}");
    assert!(out.lines().any(|l| l.starts_with("podmetricssummary.stats.une-tasse-de.cafe/")), "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("cafebrewstats")).count(), cafes.len());
}

/// The cache TTL of [`Options::default`], in seconds.
const CACHE_TTL: f64 = 2.0;

/// Each cafe's last brew (Unix seconds) as the engine answers an instant query now, by
/// (namespace, cafe).
async fn engine_last_brews(env: &Env) -> BTreeMap<(String, String), f64> {
    let url = format!("{}/api/v1/query", env.prometheus.url());
    let query = [("query", "max by (namespace, cafe) (cafe_last_brew_timestamp_seconds)")];
    let response: Value = env.client.get(&url).query(&query).send().await.unwrap().json().await.unwrap();
    let result = response["data"]["result"].as_array().unwrap_or_else(|| panic!("last brews: {response}"));
    result
        .iter()
        .map(|series| {
            let labels = &series["metric"];
            let key = (
                labels["namespace"].as_str().unwrap().to_owned(),
                labels["cafe"].as_str().unwrap().to_owned(),
            );
            (key, series["value"][1].as_str().unwrap().parse().unwrap())
        })
        .collect()
}
