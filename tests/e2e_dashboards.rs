//! The Grafana dashboards of `dashboards/`: their structure (current schema, a `datasource`
//! variable used everywhere, no hard-coded datasource UID, a query on every panel) and, against
//! the real test Prometheus scraping the simulator and percolator's own `/metrics`, that every
//! panel query runs with its variables substituted (all values, then one concrete value found
//! by the variable's own query) and returns data, and that every `percolator_*` metric it names
//! is one percolator exports.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::{Env, Options};
use serde_json::{Value, json};

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";

/// The dashboards every release must ship.
const REQUIRED: &[&str] = &["cafes.json", "percolator.json"];

/// The cafe metric contract (docs/design.md, "API surface"): metric name and type.
const CAFE_CONTRACT: &[(&str, &str)] = &[
    ("cafe_brews_total", "counter"),
    ("cafe_brew_failures_total", "counter"),
    ("cafe_brew_duration_seconds", "histogram"),
    ("cafe_temperature_celsius", "gauge"),
    ("cafe_last_brew_timestamp_seconds", "gauge"),
];

/// Grafana's built-in variables, with the values a panel would typically get.
const BUILTINS: &[(&str, &str)] =
    &[("__rate_interval", "1m"), ("__interval", "15s"), ("__range", "5m"), ("__range_s", "300")];

// ---- reading dashboards ----

fn mk_dashboards() -> Vec<(String, Value)> {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    let mut out: Vec<(String, Value)> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.extension().is_some_and(|e| e == "json"))
        .map(|path| {
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(&path).unwrap();
            let value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name} is not JSON: {e}"));
            (name, value)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    let names: Vec<&str> = out.iter().map(|(n, _)| n.as_str()).collect();
    for required in REQUIRED {
        assert!(names.contains(required), "dashboards/{required} is missing (found {names:?})");
    }
    out
}

/// Every panel that shows data, rows (collapsed or not) flattened.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for panel in list.as_array().into_iter().flatten() {
            if panel["type"] == "row" {
                walk(&panel["panels"], out);
            } else {
                out.push(panel);
            }
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn variables(dashboard: &Value) -> &[Value] {
    dashboard["templating"]["list"].as_array().map(Vec::as_slice).unwrap_or_default()
}

/// A query variable's query string (Grafana stores it as a string or as an editor object).
fn variable_query(variable: &Value) -> &str {
    variable["query"]
        .as_str()
        .or_else(|| variable["query"]["query"].as_str())
        .unwrap_or_else(|| panic!("variable {} has no query: {variable}", variable["name"]))
}

/// One panel query: where it is and its expression.
struct PanelQuery {
    panel: String,
    ref_id: String,
    expr: String,
}

fn panel_queries(dashboard: &Value) -> Vec<PanelQuery> {
    panels(dashboard)
        .into_iter()
        .flat_map(|panel| {
            panel["targets"].as_array().into_iter().flatten().filter_map(move |target| {
                Some(PanelQuery {
                    panel: panel["title"].as_str().unwrap_or("?").to_string(),
                    ref_id: target["refId"].as_str().unwrap_or("?").to_string(),
                    expr: target["expr"].as_str()?.to_string(),
                })
            })
        })
        .collect()
}

// ---- PromQL text helpers ----

/// Substitutes `$name`, `${name}` and `${name:format}`; an unknown variable is an error.
fn substitute(expr: &str, values: &BTreeMap<String, String>) -> Result<String, String> {
    let mut out = String::new();
    let mut rest = expr;
    while let Some(at) = rest.find('$') {
        out.push_str(&rest[..at]);
        let after = &rest[at + 1..];
        let (name, consumed) = if let Some(braced) = after.strip_prefix('{') {
            let end = braced.find('}').ok_or_else(|| format!("unclosed ${{ in {expr}"))?;
            let inner = &braced[..end];
            (inner.split(':').next().unwrap_or(inner), end + 2)
        } else {
            let end = after.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(after.len());
            (&after[..end], end)
        };
        if name.is_empty() {
            return Err(format!("a bare $ in {expr}"));
        }
        let value = values.get(name).ok_or_else(|| format!("unknown variable ${name} in {expr}"))?;
        out.push_str(value);
        rest = &after[consumed..];
    }
    out.push_str(rest);
    Ok(out)
}

/// Identifiers of an expression that name metrics of a family we own (`percolator_`, `cafe_`),
/// skipping string literals (label values).
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    let chars: Vec<char> = expr.chars().collect();
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        if matches!(c, '"' | '\'' | '`') {
            i += 1;
            while i < chars.len() && chars[i] != c {
                if chars[i] == '\\' && c != '`' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if (c.is_ascii_alphabetic() || c == '_' || c == ':') && (i == 0 || !ident(chars[i - 1])) {
            let start = i;
            while i < chars.len() && ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            if word.starts_with("percolator_") || word.starts_with("cafe_") {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

/// Every series name a Prometheus or OpenMetrics text exposition can produce: the sample names
/// present, and for each `# TYPE` family the names its type implies (so a family without
/// samples yet still counts as exported).
fn exported_names(exposition: &str) -> BTreeSet<String> {
    let mut names = BTreeSet::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            let (Some(family), Some(kind)) = (words.next(), words.next()) else { continue };
            names.extend(series_of(family, kind));
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            names.insert(line[..end].to_string());
        }
    }
    names
}

fn series_of(family: &str, kind: &str) -> Vec<String> {
    match kind {
        "counter" => {
            let base = family.strip_suffix("_total").unwrap_or(family);
            vec![format!("{base}_total"), format!("{base}_created")]
        }
        "histogram" => {
            ["_bucket", "_sum", "_count", "_created"].iter().map(|s| format!("{family}{s}")).collect()
        }
        "summary" => ["", "_sum", "_count", "_created"].iter().map(|s| format!("{family}{s}")).collect(),
        _ => vec![family.to_string()],
    }
}

/// The names of `used` that are neither exported nor a known series suffix of an export.
fn missing(used: &BTreeSet<String>, exported: &BTreeSet<String>) -> Vec<String> {
    used.iter().filter(|name| !exported.contains(*name)).cloned().collect()
}

// ---- static structure ----

const DS_REFS: &[&str] = &["${datasource}", "$datasource"];

/// Every `datasource` in the document must point at the variable.
fn check_datasources(value: &Value, path: &str, errors: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let here = format!("{path}.{key}");
                if key == "datasource" {
                    match child {
                        Value::Object(ds) => {
                            if ds.get("uid").and_then(Value::as_str).is_none_or(|uid| !DS_REFS.contains(&uid))
                            {
                                errors.push(format!("{here} = {child} does not use the datasource variable"));
                            }
                        }
                        Value::String(s) if DS_REFS.contains(&s.as_str()) => {}
                        other => {
                            errors.push(format!("{here} = {other} does not use the datasource variable"))
                        }
                    }
                }
                check_datasources(child, &here, errors);
            }
        }
        Value::Array(items) => {
            for (i, child) in items.iter().enumerate() {
                check_datasources(child, &format!("{path}[{i}]"), errors);
            }
        }
        _ => {}
    }
}

/// Values for every variable of a dashboard that PromQL can see, all set to match everything.
fn all_values(dashboard: &Value) -> BTreeMap<String, String> {
    let mut values: BTreeMap<String, String> =
        BUILTINS.iter().map(|(k, v)| ((*k).to_string(), (*v).to_string())).collect();
    for variable in variables(dashboard) {
        if variable["type"] != "datasource" {
            let name = variable["name"].as_str().unwrap().to_string();
            let all = variable["allValue"].as_str().unwrap_or(".*").to_string();
            values.insert(name, all);
        }
    }
    values
}

#[test]
fn dashboards_follow_the_current_schema() {
    let mut errors = Vec::new();
    let mut uids = BTreeSet::new();
    for (file, d) in mk_dashboards() {
        let mut err = |m: String| errors.push(format!("{file}: {m}"));
        if d.get("__inputs").is_some() || d.get("__requires").is_some() {
            err("has __inputs/__requires (an export for sharing, not for provisioning)".into());
        }
        if d["schemaVersion"].as_u64().is_none_or(|v| v < 39) {
            err(format!("schemaVersion {} < 39", d["schemaVersion"]));
        }
        match d["uid"].as_str() {
            Some(uid) if !uid.is_empty() && uid.len() <= 40 => {
                if !uids.insert(uid.to_string()) {
                    err(format!("uid {uid} is used twice"));
                }
            }
            _ => err(format!("bad uid {}", d["uid"])),
        }
        if d["title"].as_str().is_none_or(str::is_empty) {
            err("no title".into());
        }
        if !d["id"].is_null() {
            err(format!("id {} must be null so imports never overwrite another dashboard", d["id"]));
        }
        if !d["tags"].as_array().is_some_and(|t| t.contains(&json!("percolator"))) {
            err("not tagged percolator".into());
        }

        // The datasource variable, and every datasource reference going through it.
        let vars = variables(&d);
        let ds = vars.iter().find(|v| v["name"] == "datasource");
        match ds {
            Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
            _ => err(format!("no datasource variable of type datasource for prometheus: {ds:?}")),
        }
        let mut ds_errors = Vec::new();
        check_datasources(&d, "", &mut ds_errors);
        for e in ds_errors {
            err(e);
        }
        for v in vars.iter().filter(|v| v["type"] == "query") {
            if v["datasource"]["uid"] != "${datasource}" {
                err(format!("variable {} does not query ${{datasource}}", v["name"]));
            }
            let query = variable_query(v);
            if !query.starts_with("label_values(") {
                err(format!("variable {}: only label_values() queries are tested: {query}", v["name"]));
            }
            if v["multi"] == true && v["includeAll"] == true && v["allValue"] != ".*" {
                err(format!("variable {}: a multi-value All must be allValue .*", v["name"]));
            }
        }

        // Panels: one query at least, each on the variable, with a description and a unit.
        let values = all_values(&d);
        let mut ids = BTreeSet::new();
        for panel in panels(&d) {
            let title = panel["title"].as_str().unwrap_or("?");
            if !ids.insert(panel["id"].as_u64().unwrap_or(0)) || panel["id"].as_u64().is_none() {
                err(format!("panel {title}: missing or duplicate id {}", panel["id"]));
            }
            if panel["description"].as_str().is_none_or(str::is_empty) {
                err(format!("panel {title}: no description"));
            }
            if panel["fieldConfig"]["defaults"]["unit"].as_str().is_none_or(str::is_empty) {
                err(format!("panel {title}: no unit"));
            }
            if panel["gridPos"]["w"].as_u64().is_none() || panel["gridPos"]["h"].as_u64().is_none() {
                err(format!("panel {title}: no gridPos"));
            }
            let targets = panel["targets"].as_array().map(Vec::as_slice).unwrap_or_default();
            if !targets.iter().any(|t| t["expr"].as_str().is_some_and(|e| !e.trim().is_empty())) {
                err(format!("panel {title}: no target with an expr"));
            }
            for target in targets {
                if let Some(expr) = target["expr"].as_str() {
                    if let Err(e) = substitute(expr, &values) {
                        err(format!("panel {title}: {e}"));
                    }
                    if expr.contains("[[") {
                        err(format!("panel {title}: deprecated [[var]] syntax in {expr}"));
                    }
                }
            }
        }

        // Metric names: cafe_* must be in the contract, with a series name its type allows.
        let contract: BTreeSet<String> = CAFE_CONTRACT.iter().flat_map(|(n, k)| series_of(n, k)).collect();
        for q in panel_queries(&d) {
            for name in metric_names(&q.expr).into_iter().filter(|n| n.starts_with("cafe_")) {
                if !contract.contains(&name) {
                    err(format!("panel {}: {name} is not in the cafe metric contract", q.panel));
                }
            }
        }
    }

    // The cafes dashboard filters by namespace and cafe.
    let (_, cafes) = mk_dashboards().into_iter().find(|(n, _)| n == "cafes.json").unwrap();
    for name in ["namespace", "cafe"] {
        let v = variables(&cafes).iter().find(|v| v["name"] == name);
        assert!(
            v.is_some_and(|v| v["multi"] == true && v["includeAll"] == true && v["allValue"] == ".*"),
            "cafes.json: variable {name} must be multi, includeAll, allValue .*: {v:?}"
        );
    }
    assert!(errors.is_empty(), "dashboard problems:\n{}", errors.join("\n"));
}

#[test]
fn metric_name_checks_catch_a_metric_percolator_does_not_export() {
    let exposition = "# TYPE percolator_http_requests counter\n\
        percolator_http_requests_total{code=\"200\"} 1\n\
        # TYPE percolator_upstream_request_duration_seconds histogram\n\
        # TYPE percolator_ready gauge\npercolator_ready 1\n# EOF\n";
    let exported = exported_names(exposition);
    let used = metric_names(
        "sum(rate(percolator_http_requests_total{cache=\"percolator_fake\"}[1m])) \
         / histogram_quantile(0.9, rate(percolator_upstream_request_duration_seconds_bucket[1m])) \
         + percolator_ready + on() percolator_bogus_total",
    );
    assert_eq!(
        used,
        [
            "percolator_bogus_total",
            "percolator_http_requests_total",
            "percolator_ready",
            "percolator_upstream_request_duration_seconds_bucket"
        ]
        .into_iter()
        .map(String::from)
        .collect()
    );
    assert_eq!(missing(&used, &exported), vec!["percolator_bogus_total".to_string()]);

    let values: BTreeMap<String, String> =
        [("cafe", "x"), ("__rate_interval", "1m")].into_iter().map(|(k, v)| (k.into(), v.into())).collect();
    assert_eq!(substitute("a{c=~\"$cafe\"}[${__rate_interval}]", &values).unwrap(), "a{c=~\"x\"}[1m]");
    assert_eq!(substitute("${cafe:regex}", &values).unwrap(), "x");
    assert!(substitute("$nope", &values).is_err());
}

// ---- against the test Prometheus ----

async fn prom_get(env: &Env, path: &str, params: &[(&str, &str)]) -> Value {
    let response = reqwest::Client::new()
        .get(format!("{}{path}", env.prometheus.url()))
        .query(params)
        .send()
        .await
        .unwrap_or_else(|e| panic!("prometheus {path}: {e}"));
    response.json().await.unwrap()
}

/// Result of an instant query: the number of samples, or Prometheus' error.
async fn instant(env: &Env, query: &str) -> Result<usize, String> {
    let body = prom_get(env, "/api/v1/query", &[("query", query)]).await;
    if body["status"] != "success" {
        return Err(format!("{}: {}", body["errorType"], body["error"]));
    }
    Ok(body["data"]["result"].as_array().map_or(0, Vec::len))
}

/// What a Grafana `label_values(...)` variable query returns, through the same Prometheus API
/// Grafana uses.
async fn label_values(env: &Env, query: &str, values: &BTreeMap<String, String>) -> Vec<String> {
    let query = substitute(query, values).unwrap();
    let args = query
        .trim()
        .strip_prefix("label_values(")
        .and_then(|q| q.strip_suffix(')'))
        .unwrap_or_else(|| panic!("not label_values(): {query}"));
    let (selector, label) = match args.rsplit_once(',') {
        Some((selector, label)) => (Some(selector.trim()), label.trim()),
        None => (None, args.trim()),
    };
    let mut params = Vec::new();
    if let Some(selector) = selector {
        params.push(("match[]", selector));
    }
    let body = prom_get(env, &format!("/api/v1/label/{label}/values"), &params).await;
    assert_eq!(body["status"], "success", "{query}: {body}");
    body["data"].as_array().unwrap().iter().map(|v| v.as_str().unwrap().to_string()).collect()
}

/// Requests that make every percolator series a panel reads exist: lists of both kinds (twice,
/// so the second is a cache hit), which call Prometheus and the kubelets, and a 404.
async fn mk_traffic(env: &Env) {
    for path in [
        format!("{GV}/podmetricssummaries"),
        format!("{GV}/namespaces/shop/podmetricssummaries"),
        format!("{GV}/cafebrewstats"),
        format!("{GV}/namespaces/default/cafebrewstats"),
    ] {
        for _ in 0..2 {
            let (code, _, body) = env.get(&path, None).await;
            assert_eq!(code, 200, "GET {path}: {body}");
        }
    }
    let path = format!("{GV}/namespaces/shop/podmetricssummaries/no-such-pod");
    let (code, _, body) = env.get(&path, None).await;
    assert_eq!(code, 404, "GET {path}: {body}");
}

/// Polls `query` until it returns data.
async fn wait_for(env: &Env, query: &str, what: &str, timeout: Duration) {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(n) = instant(env, query).await
            && n > 0
        {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: `{query}` returned no data within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_panel_query_returns_data_and_names_exported_metrics() {
    let dashboards = mk_dashboards();
    let env = Env::start("dashboards", Options::default()).await;

    wait_for(
        &env,
        "up{job=\"percolator\"} == 1",
        "Prometheus scrapes percolator (job percolator)",
        Duration::from_secs(30),
    )
    .await;
    wait_for(
        &env,
        "cafe_brews_total",
        "Prometheus has the simulator's cafe metrics",
        Duration::from_secs(30),
    )
    .await;
    mk_traffic(&env).await;
    // Two scrapes after the traffic, so that rate() over the new series has two samples.
    wait_for(
        &env,
        "count_over_time(percolator_http_requests_total{code=\"404\"}[1m]) >= 2",
        "two scrapes of percolator after the traffic",
        Duration::from_secs(30),
    )
    .await;

    // What percolator exports, from its own /metrics.
    let (code, _, exposition) = env.get("/metrics", None).await;
    assert_eq!(code, 200, "GET /metrics: {exposition}");
    let exported = exported_names(&exposition);

    let mut problems = Vec::new();
    for (file, dashboard) in &dashboards {
        let queries = panel_queries(dashboard);

        let used: BTreeSet<String> = queries
            .iter()
            .flat_map(|q| metric_names(&q.expr))
            .filter(|n| n.starts_with("percolator_") || n.starts_with("process_"))
            .collect();
        for name in missing(&used, &exported) {
            problems.push(format!("{file}: {name} is not exported by percolator's /metrics"));
        }

        // Two substitutions: every variable at All, then each at one value its query returns.
        let all = all_values(dashboard);
        let mut one = all.clone();
        for variable in variables(dashboard).iter().filter(|v| v["type"] == "query") {
            let name = variable["name"].as_str().unwrap();
            let found = label_values(&env, variable_query(variable), &one).await;
            match found.first() {
                Some(first) => {
                    one.insert(name.to_string(), regex_escape(first));
                }
                None => problems.push(format!("{file}: variable {name} has no values")),
            }
        }

        let deadline = Instant::now() + Duration::from_secs(20);
        for (label, values) in [("all", &all), ("one", &one)] {
            for q in &queries {
                let expr = substitute(&q.expr, values).unwrap();
                loop {
                    match instant(&env, &expr).await {
                        Ok(n) if n > 0 => break,
                        // A series can lag by a scrape: retry empties for a while.
                        Ok(_) if Instant::now() < deadline => {
                            tokio::time::sleep(Duration::from_millis(500)).await
                        }
                        Ok(_) => {
                            problems.push(format!(
                                "{file} / {} / {} ({label}): no data for {expr}",
                                q.panel, q.ref_id
                            ));
                            break;
                        }
                        Err(e) => {
                            problems.push(format!(
                                "{file} / {} / {} ({label}): {e} for {expr}",
                                q.panel, q.ref_id
                            ));
                            break;
                        }
                    }
                }
            }
        }
    }
    assert!(problems.is_empty(), "dashboard queries:\n{}", problems.join("\n"));
}

/// Grafana regex-escapes a single value substituted into `=~`.
fn regex_escape(value: &str) -> String {
    let mut out = String::new();
    for c in value.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
            // PromQL string literal: the backslash itself must be escaped.
            out.push('\\');
        }
        out.push(c);
    }
    out
}
