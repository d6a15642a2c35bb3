//! Tests of [`crate::devenv`], kept out of that file because the integration tests and the
//! benchmark include it by path (its tests would run again in each of them).

use std::path::PathBuf;
use std::time::Duration;

use tokio::io::AsyncWriteExt;

use crate::devenv::*;

#[test]
fn config_lists_jobs() {
    let yaml = config_yaml(&PrometheusOptions {
        dir: PathBuf::from("/tmp/x"),
        jobs: vec![ScrapeJob::http("sim-apps", "127.0.0.1:9")],
        scrape_interval: Duration::from_secs(2),
        backfill: None,
    });
    let parsed: serde_json::Value = percolator::config::yaml::from_str(&yaml).unwrap();
    assert_eq!(parsed["global"]["scrape_interval"], "2s");
    assert_eq!(parsed["scrape_configs"][0]["static_configs"][0]["targets"][0], "127.0.0.1:9");
}

/// A loopback server answering every request 200 with `content_type` and a body `body` makes.
async fn serve(content_type: &'static str, body: fn(i64) -> String, arg: i64) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                while read_request(&mut stream).await.is_ok() {
                    let body = body(arg);
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if stream.write_all(response.as_bytes()).await.is_err() {
                        break;
                    }
                }
            });
        }
    });
    address
}

#[tokio::test]
async fn fault_proxy_injects_every_fault_and_recovers() {
    apiserver::install_crypto_provider();
    let upstream = FakePrometheus::start(Duration::ZERO).await.unwrap();
    let proxy = FaultProxy::start(&upstream.address()).await.unwrap();
    let client = reqwest::Client::builder().timeout(Duration::from_millis(500)).build().unwrap();
    let url = format!("{}/api/v1/query", proxy.url());
    let get = || async {
        match client.post(&url).body("query=up").send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                match r.text().await {
                    Ok(body) => Ok((status, body)),
                    Err(e) => Err(format!("body: timeout={} {e}", e.is_timeout())),
                }
            }
            Err(e) => Err(format!("send: timeout={} connect={} {e}", e.is_timeout(), e.is_connect())),
        }
    };
    assert_eq!(get().await.unwrap(), (200, EMPTY_VECTOR.to_owned()));

    proxy.set(ProxyFault::Down);
    tokio::time::sleep(Duration::from_millis(50)).await;
    let error = get().await.unwrap_err();
    assert!(error.contains("connect=true"), "{error}");

    proxy.set(ProxyFault::Slow(Duration::from_secs(2)));
    tokio::time::sleep(Duration::from_millis(50)).await;
    let error = get().await.unwrap_err();
    assert!(error.contains("timeout=true"), "{error}");

    proxy.set(ProxyFault::HangAfterHeaders);
    let error = get().await.unwrap_err();
    assert!(error.starts_with("body: timeout=true"), "{error}");

    proxy.set(ProxyFault::Garbage);
    let (status, body) = get().await.unwrap();
    assert_eq!(status, 200);
    assert!(serde_json::from_str::<serde_json::Value>(&body).is_err());

    proxy.set(ProxyFault::Error500);
    assert_eq!(get().await.unwrap().0, 500);

    proxy.set(ProxyFault::Pass);
    assert_eq!(proxy.fault(), ProxyFault::Pass);
    assert_eq!(get().await.unwrap(), (200, EMPTY_VECTOR.to_owned()));
}

#[test]
fn victoria_metrics_config_has_the_jobs_without_the_fields_it_refuses() {
    let options = PrometheusOptions {
        dir: PathBuf::from("/tmp/x"),
        jobs: vec![ScrapeJob {
            job: "percolator".into(),
            target: String::new(),
            scheme: "https".into(),
            bearer_token: Some("t".into()),
            targets_file: Some(PathBuf::from("/tmp/x/targets.json")),
        }],
        scrape_interval: Duration::from_secs(2),
        backfill: None,
    };
    assert_eq!(
        victoria_metrics_config_yaml(&options),
        "global:\n  scrape_interval: 2s\nscrape_configs:\n  - job_name: percolator\n    honor_labels: true\n    \
         scheme: https\n    tls_config:\n      insecure_skip_verify: true\n    authorization:\n      \
         credentials: t\n    file_sd_configs:\n      - files: ['/tmp/x/targets.json']\n"
    );
    // Prometheus' own keeps them.
    let prometheus: serde_json::Value = percolator::config::yaml::from_str(&config_yaml(&options)).unwrap();
    assert_eq!(prometheus["global"]["query_log_file"], "/tmp/x/query.log");
    assert_eq!(prometheus["scrape_configs"][0]["file_sd_configs"][0]["refresh_interval"], "1s");
}

#[test]
fn openmetrics_history_becomes_prometheus_text_in_milliseconds() {
    let history = "# HELP cafe_brews Completed brews.\n# TYPE cafe_brews counter\n\
                   cafe_brews_total{cafe=\"a b}\",pod=\"p\"} 230.36 1796173245\n\
                   cafe_brews_total{cafe=\"a\"} 1.5e+09 1796173245.25\n\
                   up 1 1796173247\n\
                   cafe_temperature_celsius{cafe=\"a\"} 87.3\n# EOF\n";
    assert_eq!(
        prometheus_text_in_milliseconds(history),
        "# HELP cafe_brews Completed brews.\n# TYPE cafe_brews counter\n\
         cafe_brews_total{cafe=\"a b}\",pod=\"p\"} 230.36 1796173245000\n\
         cafe_brews_total{cafe=\"a\"} 1.5e+09 1796173245250\n\
         up 1 1796173247000\n\
         cafe_temperature_celsius{cafe=\"a\"} 87.3\n# EOF\n"
    );
}

/// A target serving one counter growing 2/s from 0 at `origin`, and `origin`'s history of it.
async fn counter_target(origin: i64) -> String {
    let ticks = |origin: i64| {
        let now = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
        format!("# TYPE ticks_total counter\nticks_total {}\n", 2.0 * (now - origin as f64))
    };
    serve("text/plain; version=0.0.4", ticks, origin).await
}

/// The value of the single series an instant query returns. Freshly imported or restarted
/// data can take a moment to become searchable: an empty answer is asked again for up to 30 s
/// (10 s was once too short for VictoriaMetrics beside the soak test on two busy cores).
async fn instant(url: &str, promql: &str) -> f64 {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let body: serde_json::Value = reqwest::Client::new()
            .post(format!("{url}/api/v1/query"))
            .form(&[("query", promql)])
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(body["status"], "success", "{promql}: {body}");
        let result = body["data"]["result"].as_array().unwrap();
        if result.is_empty() && std::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(250)).await;
            continue;
        }
        assert_eq!(result.len(), 1, "{promql}: {body}");
        return result[0]["value"][1].as_str().unwrap().parse().unwrap();
    }
}

#[tokio::test]
async fn victoria_metrics_serves_imported_history_and_live_scrapes() {
    let dir = std::env::temp_dir().join(format!("percolator-devenv-vm-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let now = jiff::Timestamp::now().as_second();
    let origin = now - 600;
    let target = counter_target(origin).await;
    // Ten minutes of history at 2 s, ending 2 s ago, with the labels the live scrape gets.
    let mut history = String::from("# TYPE ticks counter\n");
    for t in (now - 300..=now - 2).step_by(2) {
        history.push_str(&format!(
            "ticks_total{{instance=\"{target}\",job=\"ticks\"}} {} {t}\n",
            2.0 * (t - origin) as f64
        ));
    }
    history.push_str("# EOF\n");
    let mut vm = MetricsEngine::start(
        Engine::VictoriaMetrics,
        PrometheusOptions {
            dir: dir.clone(),
            jobs: vec![ScrapeJob::http("ticks", target.clone())],
            scrape_interval: Duration::from_secs(2),
            backfill: Some(history),
        },
    )
    .await
    .unwrap();
    assert_eq!(vm.engine(), Engine::VictoriaMetrics);
    assert_eq!(vm.logged_queries(), None, "VictoriaMetrics keeps no query log");
    // The imported history alone: a rate over 4 minutes ending a minute ago.
    let old_rate = instant(&vm.url(), "rate(ticks_total[4m] offset 1m)").await;
    assert!((old_rate - 2.0).abs() < 1e-6, "{old_rate}");
    vm.wait_for_targets(Duration::from_secs(20)).await.unwrap();
    // History and live samples form one series: the rate over the last 5 minutes is exact.
    let rate = instant(&vm.url(), "rate(ticks_total[5m])").await;
    assert!((rate - 2.0).abs() < 1e-3, "{rate}");
    let count = instant(&vm.url(), "count_over_time(ticks_total[10m])").await;
    assert!(count >= 149.0, "the history's 150 samples and the live ones: {count}");

    vm.restart().await.unwrap();
    vm.wait_for_job("ticks", Duration::from_secs(20)).await.unwrap();
    let rate = instant(&vm.url(), "rate(ticks_total[4m] offset 1m)").await;
    assert!((rate - 2.0).abs() < 1e-6, "the data survives a restart: {rate}");
    vm.stop().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// An upstream answering every request with a chunked JSON echo of what it received (method,
/// path and query, body, credentials and tenant headers), or at `/big` with `n` chunks of 4 KiB.
async fn echo_upstream() -> String {
    use http_body_util::BodyExt as _;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let service =
                hyper::service::service_fn(|request: http::Request<hyper::body::Incoming>| async move {
                    let (parts, body) = request.into_parts();
                    let body = body.collect().await.unwrap().to_bytes();
                    let path = parts.uri.path_and_query().unwrap().as_str().to_owned();
                    let chunks: Vec<bytes::Bytes> = if path == "/big" {
                        (0..256u32).map(|i| bytes::Bytes::from(vec![b'a' + (i % 26) as u8; 4096])).collect()
                    } else {
                        let header =
                            |name: &str| parts.headers.get(name).map(|v| v.to_str().unwrap().to_owned());
                        let echo = serde_json::json!({
                            "method": parts.method.as_str(),
                            "path": path,
                            "body": String::from_utf8_lossy(&body),
                            "authorization": header("authorization"),
                            "tenant": header("x-scope-orgid"),
                        })
                        .to_string();
                        let (a, b) = echo.split_at(echo.len() / 2);
                        vec![bytes::Bytes::from(a.to_owned()), bytes::Bytes::from(b.to_owned())]
                    };
                    let frames = futures::stream::iter(
                        chunks
                            .into_iter()
                            .map(|c| Ok::<_, std::convert::Infallible>(hyper::body::Frame::data(c))),
                    );
                    let mut response = http::Response::new(http_body_util::StreamBody::new(frames));
                    response.headers_mut().insert("content-type", "application/json".parse().unwrap());
                    Ok::<_, std::convert::Infallible>(response)
                });
            tokio::spawn(async move {
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(hyper_util::rt::TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    address
}

#[tokio::test]
async fn secure_front_checks_certificate_token_and_tenant_and_forwards_the_rest() {
    use crate::securefront::{FrontCounts, SecureFront};
    apiserver::install_crypto_provider();
    let dir = std::env::temp_dir().join(format!("percolator-devenv-front-{}", std::process::id()));
    let front = SecureFront::start(&dir, &echo_upstream().await, "token-1", "team-a").await.unwrap();
    assert!(front.url().starts_with("https://127.0.0.1:"));
    let files = front.files().clone();
    assert_eq!(std::fs::read_to_string(&files.token).unwrap(), "token-1");
    let ca = reqwest::Certificate::from_pem(&std::fs::read(&files.ca).unwrap()).unwrap();
    let mut identity = std::fs::read(&files.client_cert).unwrap();
    identity.extend(std::fs::read(&files.client_key).unwrap());
    let identity = reqwest::Identity::from_pem(&identity).unwrap();
    let client = reqwest::Client::builder()
        .add_root_certificate(ca.clone())
        .identity(identity.clone())
        .build()
        .unwrap();
    let url = format!("{}/api/v1/query?x=1", front.url());
    let send = |token: Option<&str>, tenant: Option<&str>| {
        let mut request = client.post(&url).header("content-type", "application/x-www-form-urlencoded");
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(tenant) = tenant {
            request = request.header("X-Scope-OrgID", tenant);
        }
        async move {
            let response = request.body("query=up%7Bjob%3D%22a%22%7D").send().await.unwrap();
            (response.status().as_u16(), response.version(), response.text().await.unwrap())
        }
    };

    // Without a client certificate: no TLS session.
    let anonymous = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    assert!(anonymous.post(&url).bearer_auth("token-1").send().await.is_err());

    // Everything right: forwarded over HTTP/2 with the body; the credentials stay at the front.
    let (status, version, body) = send(Some("token-1"), Some("team-a")).await;
    assert_eq!((status, version), (200, reqwest::Version::HTTP_2), "{body}");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap(),
        serde_json::json!({
            "method": "POST",
            "path": "/api/v1/query?x=1",
            "body": "query=up%7Bjob%3D%22a%22%7D",
            "authorization": null,
            "tenant": "team-a",
        })
    );
    // A long chunked answer streams back whole, over HTTP/1.1 too.
    let http1 = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&std::fs::read(&files.ca).unwrap()).unwrap())
        .identity(identity)
        .http1_only()
        .build()
        .unwrap();
    let response = http1
        .get(format!("{}/big", front.url()))
        .bearer_auth("token-1")
        .header("X-Scope-OrgID", "team-a")
        .send()
        .await
        .unwrap();
    assert_eq!((response.status().as_u16(), response.version()), (200, reqwest::Version::HTTP_11));
    let big = response.bytes().await.unwrap();
    let expected: Vec<u8> = (0..256u32).flat_map(|i| vec![b'a' + (i % 26) as u8; 4096]).collect();
    assert!(big.as_ref() == expected.as_slice(), "{} bytes", big.len());

    // Rejections, each with its plain answer.
    assert_eq!(send(None, Some("team-a")).await.2, "invalid bearer token\n");
    assert_eq!(send(Some("token-2"), Some("team-a")).await.0, 401);
    assert_eq!(send(Some("token-1"), None).await.2, "no org id\n");
    let (status, _, body) = send(Some("token-1"), Some("team-b")).await;
    assert_eq!((status, body.as_str()), (403, "tenant not allowed\n"));

    // The token file is read on every request: a rotation applies at once.
    front.rotate_token("token-2").unwrap();
    assert_eq!(std::fs::read_to_string(&files.token).unwrap(), "token-2");
    assert_eq!(send(Some("token-1"), Some("team-a")).await.0, 401);
    assert_eq!(send(Some("token-2"), Some("team-a")).await.0, 200);
    // And the tenant can change.
    front.set_tenant("team-b");
    assert_eq!(front.tenant(), "team-b");
    assert_eq!(send(Some("token-2"), Some("team-a")).await.0, 403);

    let counts = front.counts();
    assert_eq!(counts, FrontCounts { accepted: 3, rejected_tls: 1, rejected_token: 3, rejected_tenant: 3 });
    assert_eq!(counts.rejected(), 7);
    drop(front);
    let _ = std::fs::remove_dir_all(&dir);
}
