//! Prometheus: the HTTP client ([`PromClient`], a [`PromSource`]) running PromQL instant vector
//! queries through `prometheus-http-query`, and the errors of the module. The PromQL template
//! language (the `SCOPE` and `WINDOW` placeholders, matchers, escaping, validation) is in
//! `template`, re-exported here; `labels` checks that a template's result keeps a label.

mod labels;
mod template;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;
use prometheus_http_query::response::Data;

use super::kubelet::error_chain;
use super::{PromError, PromSample, PromSource, UpstreamObserver, outcome};

pub use labels::keeps_label;
pub use template::{
    MatchOp, Matcher, SCOPE_PLACEHOLDER, WINDOW_PLACEHOLDER, escape_label_value, escape_regex,
    format_duration, is_valid_label_name, render, validate_template, validate_unscoped_template,
};

/// The `source` passed to the [`UpstreamObserver`].
const SOURCE: &str = "prometheus";

/// Errors of this module: invalid matchers, templates, windows, and client construction.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Error {
    /// A label name that is not `[a-zA-Z_][a-zA-Z0-9_]*`.
    #[error("invalid label name {0:?}: must match [a-zA-Z_][a-zA-Z0-9_]*")]
    InvalidLabelName(String),
    /// A set match (`in`, `notin`) without values.
    #[error("empty set of values for label {0:?}")]
    EmptySet(String),
    /// A template that is not usable; `at` is a byte offset in it.
    #[error("PromQL template, at byte {at}: {reason}")]
    Template {
        /// Byte offset of the problem.
        at: usize,
        /// What is wrong.
        reason: String,
    },
    /// A window that is not a positive whole number of milliseconds.
    #[error("window {0:?} is not a positive number of milliseconds")]
    InvalidWindow(Duration),
    /// The client could not be built (bad URL, TLS setup).
    #[error("prometheus client: {0}")]
    Client(String),
}

/// Result alias for this module.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs PromQL instant queries against one Prometheus.
pub struct PromClient {
    client: prometheus_http_query::Client,
    /// The same HTTP client, for the series API (which the query client only takes typed
    /// selectors for) at `series_url`.
    http: reqwest::Client,
    series_url: String,
    timeout: Duration,
    observer: Arc<dyn UpstreamObserver>,
}

impl PromClient {
    /// A client for the Prometheus at `url` (e.g. `http://prometheus:9090`); every query is
    /// bounded by `timeout`, both on our side and as Prometheus' own evaluation timeout.
    pub fn new(url: &str, timeout: Duration, observer: Arc<dyn UpstreamObserver>) -> Result<Self> {
        // reqwest panics when no rustls provider is installed; main installs ring, and doing it
        // here too (idempotent) keeps that panic off every path.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .build()
            .map_err(|e| Error::Client(e.to_string()))?;
        let client = prometheus_http_query::Client::from(http.clone(), url)
            .map_err(|e| Error::Client(format!("{url:?}: {e}")))?;
        let series_url = format!("{}/api/v1/series", url.trim_end_matches('/'));
        Ok(Self { client, http, series_url, timeout, observer })
    }

    async fn run(&self, promql: &str) -> Result<Vec<PromSample>, (&'static str, PromError)> {
        let timeout_ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        let result = self
            .client
            .query(promql)
            .timeout(timeout_ms)
            // POST: a scope with many pod names can exceed URL length limits.
            .post()
            .await
            .map_err(classify)?;
        let (data, _) = result.into_inner();
        match data {
            Data::Vector(vector) => vector
                .into_iter()
                .map(|series| {
                    let (labels, sample) = series.into_inner();
                    Ok(PromSample {
                        labels,
                        value: sample.value(),
                        timestamp: timestamp(sample.timestamp())?,
                    })
                })
                .collect(),
            Data::Scalar(sample) => Ok(vec![PromSample {
                labels: Default::default(),
                value: sample.value(),
                timestamp: timestamp(sample.timestamp())?,
            }]),
            Data::Matrix(_) => Err((
                outcome::ERROR,
                PromError::Query("the query returned a range vector, not an instant vector".to_owned()),
            )),
        }
    }
}

/// The body of a `/api/v1/series` answer.
#[derive(serde::Deserialize)]
struct SeriesAnswer {
    status: String,
    #[serde(default)]
    data: Vec<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    error: String,
}

impl PromClient {
    async fn list_series(
        &self,
        selector: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> Result<Vec<std::collections::BTreeMap<String, String>>, (&'static str, PromError)> {
        let seconds = |t: Timestamp| format!("{:.3}", t.as_millisecond() as f64 / 1000.0);
        // POST: selectors can be long.
        let response = self
            .http
            .post(&self.series_url)
            .form(&[("match[]", selector), ("start", &seconds(start)), ("end", &seconds(end))])
            .send()
            .await
            .map_err(|e| {
                let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::UNREACHABLE };
                (outcome, PromError::Unreachable(error_chain(&e)))
            })?;
        let status = response.status();
        let body =
            response.bytes().await.map_err(|e| (outcome::ERROR, PromError::Unreachable(error_chain(&e))))?;
        match serde_json::from_slice::<SeriesAnswer>(&body) {
            Ok(answer) if answer.status == "success" => Ok(answer.data),
            Ok(answer) => Err((outcome::ERROR, PromError::Query(answer.error))),
            Err(_) => Err((
                outcome::ERROR,
                PromError::Unreachable(format!(
                    "POST {}: HTTP {status}: {}",
                    self.series_url,
                    String::from_utf8_lossy(body.get(..200).unwrap_or(&body)).trim()
                )),
            )),
        }
    }
}

impl PromSource for PromClient {
    fn series(
        &self,
        selector: String,
        start: Timestamp,
        end: Timestamp,
    ) -> BoxFuture<'_, Result<Vec<std::collections::BTreeMap<String, String>>, PromError>> {
        Box::pin(self.observed(async move { self.list_series(&selector, start, end).await }))
    }

    fn query(&self, promql: String) -> BoxFuture<'_, Result<Vec<PromSample>, PromError>> {
        Box::pin(self.observed(async move { self.run(&promql).await }))
    }
}

impl PromClient {
    /// Runs one call and reports its outcome and duration to the observer.
    async fn observed<T>(
        &self,
        call: impl Future<Output = Result<T, (&'static str, PromError)>>,
    ) -> Result<T, PromError> {
        let started = Instant::now();
        let result = call.await;
        let seconds = started.elapsed().as_secs_f64();
        match result {
            Ok(value) => {
                self.observer.observe(SOURCE, outcome::SUCCESS, seconds);
                Ok(value)
            }
            Err((outcome, error)) => {
                self.observer.observe(SOURCE, outcome, seconds);
                Err(error)
            }
        }
    }
}

/// A Prometheus sample time (float seconds) as a timestamp.
fn timestamp(seconds: f64) -> Result<Timestamp, (&'static str, PromError)> {
    Timestamp::from_nanosecond((seconds * 1e9).round() as i128)
        .map_err(|_| (outcome::ERROR, PromError::Query(format!("invalid sample timestamp {seconds}"))))
}

/// Maps a client error to the outcome to record and the error to return.
fn classify(error: prometheus_http_query::Error) -> (&'static str, PromError) {
    match &error {
        prometheus_http_query::Error::Prometheus(e) => {
            let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::ERROR };
            (outcome, PromError::Query(e.to_string()))
        }
        prometheus_http_query::Error::Client(e) => {
            let message = error_chain(&error);
            match e.inner() {
                Some(inner) if inner.is_timeout() => (outcome::TIMEOUT, PromError::Unreachable(message)),
                Some(inner) if inner.is_connect() || inner.is_request() => {
                    (outcome::UNREACHABLE, PromError::Unreachable(message))
                }
                // A non-JSON error status: a proxy in front of Prometheus, or Prometheus down.
                Some(inner) if inner.is_status() => (outcome::ERROR, PromError::Unreachable(message)),
                _ => (outcome::ERROR, PromError::Query(message)),
            }
        }
        _ => (outcome::ERROR, PromError::Query(error.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;

    use super::template::tests::{ERRORS, FIVE_MINUTES, NASTY, REQUESTS};
    use super::*;
    use crate::sources::kubelet::tests::MkObserver;

    struct MkPrometheus {
        child: tokio::process::Child,
        dir: PathBuf,
        url: String,
    }

    impl Drop for MkPrometheus {
        fn drop(&mut self) {
            let _ = self.child.start_kill();
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Starts the Debian `prometheus` binary on a free loopback port. Prometheus cannot report
    /// a port it picked itself, so a port is probed and released first; if another process
    /// takes it meanwhile, Prometheus exits and we retry with another.
    async fn mk_prometheus() -> MkPrometheus {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let http = reqwest::Client::new();
        for attempt in 0..5 {
            let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
            let dir =
                std::env::temp_dir().join(format!("percolator-prom-{}-{port}-{attempt}", std::process::id()));
            std::fs::create_dir_all(&dir).unwrap();
            let config = dir.join("p.yml");
            // Prometheus resolves the relative query log path from the configuration's directory.
            std::fs::write(&config, "global:\n  query_log_file: queries.log\nscrape_configs: []\n").unwrap();
            let child = tokio::process::Command::new("/usr/bin/prometheus")
                .arg(format!("--config.file={}", config.display()))
                .arg(format!("--storage.tsdb.path={}", dir.join("data").display()))
                .arg(format!("--web.listen-address=127.0.0.1:{port}"))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut prometheus = MkPrometheus { child, dir, url: format!("http://127.0.0.1:{port}") };
            let deadline = Instant::now() + Duration::from_secs(10);
            while Instant::now() < deadline {
                if prometheus.child.try_wait().unwrap().is_some() {
                    break;
                }
                let ready = http.get(format!("{}/-/ready", prometheus.url)).send().await;
                if ready.is_ok_and(|r| r.status().is_success()) {
                    return prometheus;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        panic!("prometheus did not start");
    }

    #[tokio::test]
    async fn queries_a_real_prometheus() {
        let prometheus = mk_prometheus().await;
        let observer = Arc::new(MkObserver::default());
        let client = PromClient::new(&prometheus.url, Duration::from_secs(5), observer.clone()).unwrap();

        let one = client.query("vector(1)".to_owned()).await.unwrap();
        assert_eq!(one.len(), 1);
        assert_eq!(one[0].value, 1.0);
        assert!(one[0].labels.is_empty());
        let scalar = client.query("scalar(vector(2))".to_owned()).await.unwrap();
        assert_eq!(scalar.len(), 1);
        assert_eq!(scalar[0].value, 2.0);

        for value in NASTY {
            // Prometheus reads our escaped string back as exactly the literal...
            let query =
                format!("label_replace(vector(1), \"l\", \"{}\", \"\", \"\")", escape_label_value(value));
            let got = client.query(query).await.unwrap();
            assert_eq!(got[0].labels.get("l").map(String::as_str), Some(value), "{value:?}");
            // ...our set regex matches that literal (anchored) and nothing longer...
            let regex = Matcher::any_of("l", &[value, "other"]).unwrap();
            for (candidate, matches) in [(value.to_owned(), true), (format!("{value}x"), false)] {
                let query = format!(
                    "label_replace(label_replace(vector(1), \"l\", \"{}\", \"\", \"\"), \"m\", \"yes\", \"l\", \"{}\")",
                    escape_label_value(&candidate),
                    escape_label_value(regex.value())
                );
                let got = client.query(query).await.unwrap();
                assert_eq!(got[0].labels.contains_key("m"), matches, "{candidate:?} against {regex}");
            }
            // ...and a rendered query stays one selector: an injected `or vector(1)` would
            // return a sample from this empty Prometheus.
            let scope =
                [Matcher::eq("namespace", value).unwrap(), Matcher::none_of("pod", &[value]).unwrap()];
            for template in [REQUESTS, ERRORS] {
                let query = render(template, &scope, Duration::from_secs(90)).unwrap();
                assert_eq!(client.query(query.clone()).await.unwrap(), vec![], "{query}");
            }
        }
        for template in [REQUESTS, ERRORS, "x{SCOPE,code=\"500\"}", "max_over_time(x{SCOPE}[WINDOW:1m])"] {
            let query = render(template, &[], FIVE_MINUTES).unwrap();
            assert_eq!(client.query(query.clone()).await.unwrap(), vec![], "{query}");
        }

        let err = client.query("sum(".to_owned()).await.unwrap_err();
        assert!(matches!(err, PromError::Query(_)), "{err}");
        let err = client.query("rate(x{a=\"b\"}[5m])[10m]".to_owned()).await.unwrap_err();
        assert!(matches!(err, PromError::Query(_)), "{err}");

        // The exact PromQL reached Prometheus.
        let log = std::fs::read_to_string(prometheus.dir.join("queries.log")).unwrap();
        assert!(
            log.contains(r#"rate(http_requests_total{namespace=\"x\\\"} or vector(1) or {a=\\\"\""#),
            "{log}"
        );

        let calls = observer.calls.lock().unwrap();
        assert!(calls.iter().all(|(source, _)| *source == "prometheus"));
        assert_eq!(calls.iter().filter(|(_, outcome)| *outcome == "error").count(), 2);
    }

    #[tokio::test]
    async fn an_unreachable_prometheus_is_reported() {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let observer = Arc::new(MkObserver::default());
        let client =
            PromClient::new(&format!("http://127.0.0.1:{port}"), Duration::from_secs(2), observer.clone())
                .unwrap();
        let err = client.query("vector(1)".to_owned()).await.unwrap_err();
        assert!(matches!(err, PromError::Unreachable(_)), "{err}");
        assert_eq!(*observer.calls.lock().unwrap(), vec![("prometheus", "unreachable")]);
        assert!(PromClient::new("not a url", Duration::from_secs(1), observer).is_err());
    }
}
