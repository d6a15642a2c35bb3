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
        jobs: vec![ScrapeJob {
            job: "sim-apps".into(),
            target: "127.0.0.1:9".into(),
            scheme: "http".into(),
            bearer_token: None,
            targets_file: None,
        }],
        scrape_interval: Duration::from_secs(2),
        backfill: None,
    });
    let parsed: serde_yaml::Value = serde_yaml::from_str(&yaml).unwrap();
    assert_eq!(parsed["global"]["scrape_interval"], "2s");
    assert_eq!(parsed["scrape_configs"][0]["static_configs"][0]["targets"][0], "127.0.0.1:9");
}

/// A tiny upstream answering every request with `{"ok":true}`.
async fn upstream() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap().to_string();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                while read_request(&mut stream).await.is_ok() {
                    let body = "{\"ok\":true}";
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
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
    percolator::install_crypto_provider();
    let proxy = FaultProxy::start(&upstream().await).await.unwrap();
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
    assert_eq!(get().await.unwrap(), (200, "{\"ok\":true}".to_owned()));

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
    assert_eq!(get().await.unwrap(), (200, "{\"ok\":true}".to_owned()));
}
