//! Delegated reviews under a hostile client (issue 53), against the real binaries: percolator
//! and the simulator playing kube-apiserver, which counts every TokenReview and
//! SubjectAccessReview it receives (`/sim/stats`).
//!
//! - A flood straight to percolator's port (thousands of anonymous GETs of unique `/apis/…` and
//!   `/openapi/…` paths and GETs with random bearer tokens, over many HTTP/1.1 and HTTP/2
//!   connections, a third of them cancelled right after being sent): kube-apiserver receives
//!   at most burst + QPS × elapsed reviews of each kind, every answered request is a 401, 403,
//!   404 or 429 within its deadline, and a known identity reading through the front proxy (as
//!   kube-aggregator proxies) is served without a failure during and after it. The bounds'
//!   metrics say what happened. The rates are lowered to a quarter of the defaults (50/s,
//!   burst 100, instead of 200/s, burst 400: 400/s sustained in all) so that the load a debug
//!   build on two cores can make (about 600 requests a second) goes well past them.
//! - A permission revoked while kube-apiserver is unreachable keeps working at most
//!   `--authorization-webhook-stale-if-error` after its last successful review, then is
//!   refused (503), and is a 403 once kube-apiserver is back; a 429 from kube-apiserver is a
//!   429 to the client (with `Retry-After`), never a 503, and no decision is served stale.
//!
//! `cargo test --test e2e_reviews -- --nocapture` prints the figures.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::{Env, Options};
use serde_json::Value;

const GV: &str = "/apis/stats.une-tasse-de.cafe/v1alpha1";
/// The rate limit, burst and outstanding bound of each kind of review in the flood's
/// environment (a quarter of the defaults; one client's share: 20).
const QPS: f64 = 50.0;
const BURST: f64 = 100.0;
const MAX_INFLIGHT: u32 = 80;
/// Requests of the flood.
const FLOOD: usize = 12_000;
/// `--request-timeout` of the flood's environment.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// The message of the 503 of an unreachable authorizer.
const UNAVAILABLE: &str = "the authorizer is unavailable: kube-apiserver cannot be reached for a SubjectAccessReview of this request; try again later";

/// The simulated kube-apiserver's count of `create tokenreviews` and `create
/// subjectaccessreviews`.
async fn mk_reviews(env: &Env) -> (u64, u64) {
    let stats = env.sim_stats().await;
    let count = |what: &str| stats["apiRequests"][what].as_u64().unwrap_or(0);
    (count("create tokenreviews"), count("create subjectaccessreviews"))
}

/// A client presenting the front proxy's certificate, as kube-aggregator does.
/// An [`Env`] whose percolator has `extra_args` (and no scraping of its `/metrics`, which
/// would be reviewed too), the front proxy's client, and the path of `shop`'s pod metrics,
/// which `dora` (group `viewers`) has read once through the front proxy.
async fn mk_reviewed_env(name: &str, extra_args: Vec<String>) -> (Env, reqwest::Client, String) {
    let env = Env::start(name, Options { scrape_percolator: false, extra_args, ..Options::default() }).await;
    let front = mk_front_proxy(&env);
    let pms = format!("{GV}/namespaces/shop/podmetricssummaries");
    let (status, body, _) = mk_get_as(&front, &env, &pms, "dora", "viewers").await;
    assert_eq!(status, 200, "{body}");
    (env, front, pms)
}

fn mk_front_proxy(env: &Env) -> reqwest::Client {
    env.client_with_cert("front-proxy-client")
}

/// GET `path` as `user` of `group` through the front proxy: status, body, how long it took.
async fn mk_get_as(
    front: &reqwest::Client,
    env: &Env,
    path: &str,
    user: &str,
    group: &str,
) -> (u16, Value, Duration) {
    let started = Instant::now();
    let response = front
        .get(format!("{}{path}", env.url))
        .header("X-Remote-User", user)
        .header("X-Remote-Group", group)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    let retry_after = response.headers().get("retry-after").map(|v| v.to_str().unwrap().to_owned());
    let text = response.text().await.unwrap();
    let mut body = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if let Some(retry_after) = retry_after {
        body["retryAfterHeader"] = Value::String(retry_after);
    }
    (status, body, started.elapsed())
}

/// percolator's metrics, read as a member of `system:masters` (no review needed).
async fn mk_metrics(env: &Env, front: &reqwest::Client) -> String {
    let response = front
        .get(format!("{}/metrics", env.url))
        .header("X-Remote-User", "scraper")
        .header("X-Remote-Group", "system:masters")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.text().await.unwrap()
}

/// The value of `series` (name and labels) in a text exposition, 0 when absent.
fn mk_value(text: &str, series: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok()).unwrap_or(0.0)
}

/// The sum of every series of `family` (a counter's `_total` included).
fn mk_sum(text: &str, family: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")) || l.starts_with(&format!("{family} ")))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum()
}

/// What one flood request got: its status (None when it was cancelled) and how long it took.
struct Answer {
    status: Option<u16>,
    took: Duration,
}

/// The flood: `FLOOD` requests from `workers` tasks; request `i` is an anonymous GET of a
/// unique path (i % 3 == 0), a GET with a random token (1), or either of them cancelled a few
/// milliseconds after being sent on an HTTP/2 connection (2, RST_STREAM).
async fn mk_flood(env: &Env, workers: usize) -> Vec<Answer> {
    let ca = std::fs::read(env.dir.join("certs/apiserver.crt")).unwrap();
    let client = |http1: bool| {
        let builder = reqwest::Client::builder()
            .add_root_certificate(reqwest::Certificate::from_pem(&ca).unwrap())
            .timeout(REQUEST_TIMEOUT + Duration::from_secs(5));
        if http1 { builder.http1_only() } else { builder }.build().unwrap()
    };
    // Many connections: a client (its pool) per four HTTP/1.1 workers, and HTTP/2 ones.
    let http1: Vec<reqwest::Client> = (0..workers.div_ceil(4)).map(|_| client(true)).collect();
    let http2: Vec<reqwest::Client> = (0..4).map(|_| client(false)).collect();
    let next = Arc::new(AtomicUsize::new(0));
    let nonce = std::process::id();
    let tasks: Vec<_> = (0..workers)
        .map(|w| {
            let (h1, h2) = (http1[w / 4].clone(), http2[w % 4].clone());
            let (next, url) = (next.clone(), env.url.clone());
            tokio::spawn(async move {
                let mut answers = Vec::new();
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= FLOOD {
                        return answers;
                    }
                    let unique = match i % 4 {
                        0 => format!("/apis/flood-{i}.example.com/v1"),
                        1 => format!("/openapi/v3/apis/flood-{i}.example.com/v1"),
                        2 => format!("/apis/flood-{i}.example.com"),
                        _ => format!("{GV}/namespaces/flood-{i}/podmetricssummaries"),
                    };
                    let (client, cancel) = match i % 3 {
                        2 => (&h2, true),
                        _ => (&h1, false),
                    };
                    let request = if i % 2 == 0 {
                        client.get(format!("{url}{unique}"))
                    } else {
                        client
                            .get(format!("{url}{GV}/podmetricssummaries"))
                            .bearer_auth(format!("random-{nonce}-{i}"))
                    };
                    let started = Instant::now();
                    if cancel {
                        // Sent, then dropped: the stream is reset.
                        let _ = tokio::time::timeout(Duration::from_millis(3), request.send()).await;
                        answers.push(Answer { status: None, took: started.elapsed() });
                    } else {
                        let response = request.send().await.unwrap_or_else(|e| panic!("request {i}: {e}"));
                        let status = response.status().as_u16();
                        let _ = response.bytes().await;
                        answers.push(Answer { status: Some(status), took: started.elapsed() });
                    }
                }
            })
        })
        .collect();
    let mut answers = Vec::new();
    for task in tasks {
        answers.extend(task.await.unwrap());
    }
    answers
}

#[tokio::test(flavor = "multi_thread")]
async fn a_flood_of_unique_paths_and_random_tokens_sends_bounded_reviews() {
    let (mut env, front, pms) = mk_reviewed_env(
        "reviews-flood",
        vec![
            // The known identity's decision is reviewed again every second during the flood.
            "--authorization-webhook-cache-authorized-ttl=1s".into(),
            format!("--request-timeout={}s", REQUEST_TIMEOUT.as_secs()),
            format!("--authorization-webhook-qps={QPS}"),
            format!("--authorization-webhook-burst={BURST}"),
            format!("--authorization-webhook-max-inflight={MAX_INFLIGHT}"),
            format!("--authentication-token-webhook-qps={QPS}"),
            format!("--authentication-token-webhook-burst={BURST}"),
            format!("--authentication-token-webhook-max-inflight={MAX_INFLIGHT}"),
        ],
    )
    .await;
    let before = mk_reviews(&env).await;

    // A known identity reads through the front proxy during the flood and after it.
    let reading = Arc::new(AtomicBool::new(true));
    let readers: Vec<_> = (0..2)
        .map(|_| {
            let (front, reading, pms, url) = (front.clone(), reading.clone(), pms.clone(), env.url.clone());
            tokio::spawn(async move {
                let mut seen = Vec::new();
                while reading.load(Ordering::SeqCst) {
                    let started = Instant::now();
                    let response = front
                        .get(format!("{url}{pms}"))
                        .header("X-Remote-User", "dora")
                        .header("X-Remote-Group", "viewers")
                        .send()
                        .await
                        .unwrap();
                    let status = response.status().as_u16();
                    let body = response.text().await.unwrap();
                    seen.push((status, started.elapsed(), body));
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                seen
            })
        })
        .collect();

    let started = Instant::now();
    let answers = mk_flood(&env, 48).await;
    let flooded = started.elapsed();
    // Reviews still under way end (or are cancelled) within their wait and budget.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = mk_reviews(&env).await;
    let elapsed = started.elapsed().as_secs_f64();
    tokio::time::sleep(Duration::from_secs(1)).await;
    reading.store(false, Ordering::SeqCst);
    let mut known = Vec::new();
    for reader in readers {
        known.extend(reader.await.unwrap());
    }

    // Every answered request is a 401, 403, 404 or 429, within its deadline.
    let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
    let mut cancelled = 0;
    for answer in &answers {
        match answer.status {
            Some(status) => *statuses.entry(status).or_default() += 1,
            None => cancelled += 1,
        }
    }
    let slowest = answers.iter().filter(|a| a.status.is_some()).map(|a| a.took).max().unwrap();
    let (token_reviews, access_reviews) = (after.0 - before.0, after.1 - before.1);
    println!(
        "\nflood: {} requests in {flooded:.1?} ({:.0}/s), {cancelled} cancelled; answers {statuses:?}, slowest {slowest:.2?}\n  reviews received by kube-apiserver in {elapsed:.1} s: {token_reviews} TokenReviews, {access_reviews} SubjectAccessReviews ({:.0}/s in all; bound {:.0} each)\n  known identity: {} reads, {} failed, slowest {:.2?}\n",
        answers.len(),
        answers.len() as f64 / flooded.as_secs_f64(),
        (token_reviews + access_reviews) as f64 / elapsed,
        BURST + QPS * elapsed,
        known.len(),
        known.iter().filter(|(s, _, _)| *s != 200).count(),
        known.iter().map(|(_, t, _)| *t).max().unwrap_or_default(),
    );
    assert_eq!(answers.len(), FLOOD);
    assert!(cancelled >= FLOOD / 3, "{cancelled}");
    let unexpected: Vec<_> = statuses.keys().filter(|s| ![401, 403, 404, 429].contains(*s)).collect();
    assert!(unexpected.is_empty(), "answers other than 401/403/404/429: {statuses:?}");
    assert!(slowest < REQUEST_TIMEOUT, "an answer took {slowest:?}");
    // The flood was one: it reached the bounds (429s), and each kind used its burst.
    assert!(statuses.get(&429).copied().unwrap_or(0) > 0, "{statuses:?}");
    assert!(
        statuses.get(&401).copied().unwrap_or(0) > 0 && statuses.get(&403).copied().unwrap_or(0) > 0,
        "{statuses:?}"
    );
    // At most burst + QPS × elapsed reviews of each kind (a refill step of two tokens of slack).
    let bound = BURST + QPS * elapsed + 2.0;
    for (kind, received) in [("TokenReviews", token_reviews), ("SubjectAccessReviews", access_reviews)] {
        assert!(received as f64 <= bound, "{received} {kind} in {elapsed:.1} s: more than {bound:.0}");
        assert!(received as f64 >= BURST, "{received} {kind}: the flood did not even use the burst");
    }
    // The known identity was served every time, during the flood and after it.
    let failed: Vec<_> = known.iter().filter(|(status, _, _)| *status != 200).collect();
    assert!(
        failed.is_empty(),
        "the known identity failed {} times of {}: {:?}",
        failed.len(),
        known.len(),
        failed.first()
    );
    assert!(known.len() > 20, "{}", known.len());

    // What the metrics say: refusals by reason, nothing left outstanding, every request sent
    // counted (the simulator also counts requests a cancelled review had sent).
    let metrics = mk_metrics(&env, &front).await;
    for kind in ["authentication_token_reviews", "authorization_subject_access_reviews"] {
        let refused = mk_sum(&metrics, &format!("percolator_{kind}_refused_total"));
        assert!(refused > 0.0, "{kind}: nothing refused\n{metrics}");
        assert_eq!(mk_value(&metrics, &format!("percolator_{kind}_in_flight")), 0.0, "{kind}\n{metrics}");
        assert!(mk_value(&metrics, &format!("percolator_{kind}_cancelled_total")) > 0.0, "{kind}\n{metrics}");
    }
    let stats = env.sim_stats().await;
    for (kind, what) in [
        ("authentication_token_reviews", "create tokenreviews"),
        ("authorization_subject_access_reviews", "create subjectaccessreviews"),
    ] {
        let sent = mk_sum(&metrics, &format!("percolator_{kind}_total"));
        let cancelled = mk_value(&metrics, &format!("percolator_{kind}_cancelled_total"));
        let received = stats["apiRequests"][what].as_f64().unwrap();
        assert!(
            sent <= received && received <= sent + cancelled,
            "{kind}: {sent} sent, {cancelled} cancelled, {received} received"
        );
    }
    assert_eq!(mk_value(&metrics, "percolator_authorization_webhook_unreachable"), 0.0);
    assert!(env.percolator_alive());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revocation_during_an_outage_ends_with_the_window_and_429_is_no_outage() {
    const WINDOW: Duration = Duration::from_secs(8);
    // Allowed, then kube-apiserver goes away and dora loses her rights meanwhile.
    let (env, front, pms) = mk_reviewed_env(
        "reviews-revocation",
        vec![
            "--authorization-webhook-cache-authorized-ttl=1s".into(),
            "--authorization-webhook-cache-unauthorized-ttl=1s".into(),
            format!("--authorization-webhook-stale-if-error={}s", WINDOW.as_secs()),
        ],
    )
    .await;
    let reviewed = Instant::now();
    env.set_faults(r#"{"api": "down"}"#).await;
    let grants = mk_grants(&env, r#"{"revoke": ["dora"]}"#).await;
    assert_eq!(grants, serde_json::json!({"revoked": ["dora"]}));
    let mut seen = Vec::new();
    while reviewed.elapsed() < WINDOW + Duration::from_secs(3) {
        let (status, body, took) = mk_get_as(&front, &env, &pms, "dora", "viewers").await;
        let at = reviewed.elapsed();
        assert!([200, 503].contains(&status), "at {at:?}: {status} {body}");
        if status == 503 {
            assert_eq!(body["message"], UNAVAILABLE, "{body}");
        }
        // The last decision stands until the window ends (from the last successful review,
        // just before `reviewed`), never after.
        if at > WINDOW + Duration::from_millis(500) {
            assert_eq!(status, 503, "revoked, {at:?} after the last review: {body}");
        }
        seen.push((at, status, took));
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let stale: Vec<_> =
        seen.iter().filter(|(at, status, _)| *status == 200 && *at > Duration::from_secs(1)).collect();
    assert!(!stale.is_empty(), "no stale decision was served within the window: {seen:?}");
    let metrics = mk_metrics(&env, &front).await;
    assert_eq!(mk_value(&metrics, "percolator_authorization_webhook_unreachable"), 1.0, "{metrics}");
    assert!(
        mk_value(&metrics, "percolator_authorization_stale_decisions_total{decision=\"allowed\"}") >= 1.0
    );

    // kube-apiserver is back: the revocation is reviewed, a 403; never a 200 again.
    env.set_faults(r#"{"api": "up"}"#).await;
    let up = Instant::now();
    let forbidden = loop {
        let (status, body, _) = mk_get_as(&front, &env, &pms, "dora", "viewers").await;
        if status == 403 {
            break up.elapsed();
        }
        assert_eq!(status, 503, "{body}");
        assert!(up.elapsed() < Duration::from_secs(15), "still no 403: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let metrics = mk_metrics(&env, &front).await;
    assert_eq!(mk_value(&metrics, "percolator_authorization_webhook_unreachable"), 0.0, "{metrics}");
    println!(
        "\nrevocation during an outage (stale-if-error {WINDOW:?}): last 200 {:.1?} after the last review, first 503 {:.1?}, 403 {forbidden:.1?} after kube-apiserver came back\n",
        seen.iter().filter(|(_, s, _)| *s == 200).map(|(at, _, _)| *at).max().unwrap(),
        seen.iter().filter(|(_, s, _)| *s == 503).map(|(at, _, _)| *at).min().unwrap(),
    );

    // kube-apiserver pushing back (429): a 429 to the client with its Retry-After, after the
    // review's retries, never the 503 of an unreachable authorizer, nor a stale decision.
    mk_grants(&env, r#"{"restore": ["dora"]}"#).await;
    env.set_faults(r#"{"reviews": "too-many-requests"}"#).await;
    let (status, body, took) = mk_get_as(&front, &env, &pms, "erin", "viewers").await;
    assert_eq!(
        (status, &body["reason"], &body["retryAfterHeader"]),
        (429, &Value::from("TooManyRequests"), &Value::from("1")),
        "{body}"
    );
    assert!(took < Duration::from_secs(10), "{took:?}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let (status, body, _) = mk_get_as(&front, &env, &pms, "dora", "viewers").await;
    assert_eq!(status, 429, "dora's last decision is not served stale: {body}");
    let metrics = mk_metrics(&env, &front).await;
    assert_eq!(mk_value(&metrics, "percolator_authorization_webhook_unreachable"), 0.0, "{metrics}");
    assert!(
        mk_value(
            &metrics,
            "percolator_authorization_subject_access_reviews_refused_total{reason=\"apiserver\"}"
        ) >= 2.0,
        "{metrics}"
    );
    env.set_faults(r#"{"reviews": "ok"}"#).await;
    let (status, body, _) = mk_get_as(&front, &env, &pms, "erin", "viewers").await;
    assert_eq!(status, 200, "{body}");
}

/// `POST /sim/grants` with `body`; the revoked users.
async fn mk_grants(env: &Env, body: &str) -> Value {
    let response = env
        .client
        .post(format!("{}/sim/grants", env.sim_metrics))
        .header("content-type", "application/json")
        .body(body.to_owned())
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    response.json().await.unwrap()
}
