//! Prometheus: the HTTP client ([`PromClient`], a [`PromSource`]) running PromQL instant vector
//! queries through `prometheus-http-query`, and the errors of the module. The PromQL template
//! language (the `SCOPE` and `WINDOW` placeholders, matchers, escaping, a [`Template`]
//! analysed once on `promql-parser`'s syntax tree) is in `template`, re-exported here; `labels` checks on that
//! tree that a template's result keeps a label.

mod connection;
mod labels;
mod template;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::future::BoxFuture;
use jiff::Timestamp;

use super::kubelet::error_chain;
use super::{JsonStr, PromError, PromSample, PromSource, SeriesLabels, UpstreamObserver, outcome};

pub(crate) use connection::ConnectionSettings;
use connection::{BodyError, Connection};
pub use labels::keeps_label;

/// Default of `--prometheus-max-response-bytes`: 128 MiB (the flag says it again).
#[cfg(test)]
pub(crate) const DEFAULT_MAX_RESPONSE_BYTES: u64 = 128 << 20;
#[cfg(test)]
use template::escape_label_value;
pub use template::{MatchOp, Matcher, Template, validate_template, validate_unscoped_template};
pub(crate) use template::{SCOPE_PLACEHOLDER, is_valid_label_name};

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
    /// A template that is not valid PromQL (placeholders replaced), with the parser's message.
    #[error("PromQL template is not valid PromQL: {0}")]
    InvalidPromql(String),
    /// A template whose vector selector (written as PromQL) lacks `SCOPE` where every one must
    /// carry it.
    #[error("PromQL template: the selector {0} has no {{SCOPE}} matchers and would read every namespace")]
    Unscoped(String),
    /// A window that is not a positive whole number of milliseconds.
    #[error("window {0:?} is not a positive number of milliseconds")]
    InvalidWindow(Duration),
    /// The client could not be built (bad URL, TLS setup).
    #[error("prometheus client: {0}")]
    Client(String),
}

/// Result alias for this module.
pub(crate) type Result<T, E = Error> = std::result::Result<T, E>;

/// Runs PromQL instant queries (and series listings) against one Prometheus HTTP API.
pub(crate) struct PromClient {
    client: prometheus_http_query::Client,
    /// TLS, credentials, headers, the answer limit and the redaction of secrets.
    connection: Connection,
    series_url: String,
    timeout: Duration,
    observer: Arc<dyn UpstreamObserver>,
}

/// A Prometheus API answer: `data` on success, the error otherwise. Plain structs with
/// borrowed raw values (no internally tagged enum, no `flatten`: both make serde buffer the
/// whole answer as an intermediate tree, several times its size).
#[derive(serde::Deserialize)]
struct Answer<'a> {
    status: &'a str,
    #[serde(borrow, default)]
    data: Option<&'a serde_json::value::RawValue>,
    #[serde(rename = "errorType", default)]
    error_type: String,
    #[serde(default)]
    error: String,
}

/// The `data` of a query answer.
#[derive(serde::Deserialize)]
struct QueryData<'a> {
    #[serde(rename = "resultType")]
    result_type: &'a str,
    #[serde(borrow)]
    result: &'a serde_json::value::RawValue,
}

/// One series of a vector answer: its labels and `[time, "value"]` (the value borrowed from
/// the answer: a number needs no string of its own).
#[derive(serde::Deserialize)]
struct VectorItem<'a> {
    metric: SeriesLabels,
    #[serde(borrow)]
    value: (f64, JsonStr<'a>),
}

impl PromClient {
    /// A client for the Prometheus at `url` (e.g. `http://prometheus:9090`) without TLS
    /// settings or credentials; every query is bounded by `timeout`.
    #[cfg(test)]
    pub(crate) fn new(url: &str, timeout: Duration, observer: Arc<dyn UpstreamObserver>) -> Result<Self> {
        let url = url::Url::parse(url).map_err(|e| Error::Client(format!("{url:?}: {e}")))?;
        let settings = ConnectionSettings::plain(url, timeout);
        Self::connect(&settings, observer)
    }

    /// A client for the Prometheus `settings` describe; every query is bounded by its timeout,
    /// both on our side and as Prometheus' own evaluation timeout.
    pub(crate) fn connect(
        settings: &ConnectionSettings,
        observer: Arc<dyn UpstreamObserver>,
    ) -> Result<Self> {
        let connection = Connection::new(settings)?;
        let url = settings.url.as_str();
        let client = prometheus_http_query::Client::from(connection.http.clone(), url)
            .map_err(|e| Error::Client(format!("{:?}: {e}", settings.display_url())))?;
        let series_url = format!("{}/api/v1/series", url.trim_end_matches('/'));
        Ok(Self { client, connection, series_url, timeout: settings.timeout, observer })
    }

    async fn run(&self, promql: &str) -> Result<Vec<PromSample>, (&'static str, PromError)> {
        let timeout_ms = i64::try_from(self.timeout.as_millis()).unwrap_or(i64::MAX);
        let mut request = self.client.query(promql).timeout(timeout_ms);
        if let Some(authorization) = self.authorization()? {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        // POST: a scope with many pod names can exceed URL length limits.
        let response = request.post_raw().await.map_err(classify)?;
        let body = self.answer_body(response, "POST /api/v1/query").await?;
        let data: QueryData<'_> = serde_json::from_str(body.data()).map_err(invalid)?;
        match data.result_type {
            "vector" => serde_json::from_str::<Vec<VectorItem<'_>>>(data.result.get())
                .map_err(invalid)?
                .into_iter()
                .map(|item| sample(item.metric, item.value))
                .collect(),
            "scalar" => {
                let value: (f64, JsonStr<'_>) = serde_json::from_str(data.result.get()).map_err(invalid)?;
                Ok(vec![sample(SeriesLabels::default(), value)?])
            }
            other => Err((
                outcome::ERROR,
                PromError::Query(format!("the query returned a {other}, not an instant vector")),
            )),
        }
    }

    /// The `Authorization` header of the next request (credential files read as they are now).
    fn authorization(&self) -> Result<Option<http::HeaderValue>, (&'static str, PromError)> {
        self.connection.authorization().map_err(|e| (outcome::ERROR, PromError::Unreachable(e.to_string())))
    }

    /// Reads an answer within the size limit and checks its envelope: the raw `data` of a
    /// success; a Prometheus error as [`PromError::Query`]; anything else (a proxy's page, a cut
    /// connection) as [`PromError::Unreachable`] with the HTTP status and the start of the body.
    async fn answer_body(
        &self,
        response: reqwest::Response,
        what: &str,
    ) -> Result<AnswerBody, (&'static str, PromError)> {
        let status = response.status();
        let body = match self.connection.read_body(response).await {
            Ok(body) => body,
            Err(BodyError::TooLarge) => {
                return Err((
                    outcome::ERROR,
                    PromError::TooLarge { limit: self.connection.max_response_bytes },
                ));
            }
            Err(BodyError::Read(e)) => {
                let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::ERROR };
                return Err((
                    outcome,
                    PromError::Unreachable(format!("{what}: reading the answer: {}", error_chain(&e))),
                ));
            }
        };
        let not_an_answer = |body: &[u8]| {
            // Redacted before it is cut, so no secret is left half-matched at the cut.
            let head = String::from_utf8_lossy(body.get(..4096).unwrap_or(body));
            let head = self.connection.redact(head.into_owned());
            let cut: String = head.trim().chars().take(200).collect();
            (outcome::ERROR, PromError::Unreachable(format!("{what}: HTTP {status}: {cut}")))
        };
        let Ok(text) = std::str::from_utf8(&body) else { return Err(not_an_answer(&body)) };
        let answer: Answer<'_> = match serde_json::from_str(text) {
            Ok(answer) => answer,
            Err(_) => return Err(not_an_answer(&body)),
        };
        match (answer.status, answer.data) {
            ("success", Some(data)) if status.is_success() => {
                // The raw `data` borrows from `body`; keep its place instead of the borrow.
                let start = data.get().as_ptr() as usize - text.as_ptr() as usize;
                Ok(AnswerBody { body: body.clone(), range: start..start + data.get().len() })
            }
            ("success", _) => Err((
                outcome::ERROR,
                PromError::Unreachable(format!("{what}: HTTP {status} with a success answer without data")),
            )),
            _ => {
                let outcome = if answer.error_type == "timeout" { outcome::TIMEOUT } else { outcome::ERROR };
                Err((outcome, PromError::Query(format!("{}: {}", answer.error_type, answer.error))))
            }
        }
    }

    async fn list_series(
        &self,
        selector: &str,
        start: Timestamp,
        end: Timestamp,
    ) -> Result<Vec<std::collections::BTreeMap<String, String>>, (&'static str, PromError)> {
        let seconds = |t: Timestamp| format!("{:.3}", t.as_millisecond() as f64 / 1000.0);
        // POST: selectors can be long.
        let mut request = self.connection.http.post(&self.series_url).form(&[
            ("match[]", selector),
            ("start", &seconds(start)),
            ("end", &seconds(end)),
        ]);
        if let Some(authorization) = self.authorization()? {
            request = request.header(http::header::AUTHORIZATION, authorization);
        }
        let response = request.send().await.map_err(|e| {
            let outcome = if e.is_timeout() { outcome::TIMEOUT } else { outcome::UNREACHABLE };
            (outcome, PromError::Unreachable(error_chain(&e)))
        })?;
        let body = self.answer_body(response, "POST /api/v1/series").await?;
        serde_json::from_str(body.data()).map_err(invalid)
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
    /// Runs one call, reports its outcome and duration to the observer, and keeps every
    /// secret out of the error it returns.
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
                Err(match error {
                    PromError::Unreachable(message) => {
                        PromError::Unreachable(self.connection.redact(message))
                    }
                    PromError::Query(message) => PromError::Query(self.connection.redact(message)),
                    too_large @ PromError::TooLarge { .. } => too_large,
                })
            }
        }
    }
}

/// A checked answer's body and where its `data` lies in it.
struct AnswerBody {
    body: bytes::Bytes,
    range: std::ops::Range<usize>,
}

impl AnswerBody {
    /// The raw JSON of `data` (checked UTF-8 when the answer was read).
    fn data(&self) -> &str {
        self.body.get(self.range.clone()).and_then(|d| std::str::from_utf8(d).ok()).unwrap_or_default()
    }
}

/// A success answer whose `data` is not what its type promises.
fn invalid(error: serde_json::Error) -> (&'static str, PromError) {
    (outcome::ERROR, PromError::Query(format!("unexpected answer: {error}")))
}

/// A sample from a series' labels and its `[time, "value"]` pair (`NaN`, `+Inf`, `-Inf`
/// included).
fn sample(
    labels: SeriesLabels,
    (time, JsonStr(value)): (f64, JsonStr<'_>),
) -> Result<PromSample, (&'static str, PromError)> {
    let value = value
        .parse::<f64>()
        .map_err(|_| (outcome::ERROR, PromError::Query(format!("invalid sample value {value:?}"))))?;
    Ok(PromSample { labels, value, timestamp: timestamp(time)? })
}

/// A Prometheus sample time (float seconds, millisecond precision) as a timestamp, rounded to
/// the millisecond (nanoseconds of an f64 this large are off by hundreds).
fn timestamp(seconds: f64) -> Result<Timestamp, (&'static str, PromError)> {
    Timestamp::from_millisecond((seconds * 1e3).round() as i64)
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
            assert_eq!(got[0].labels.get("l"), Some(value), "{value:?}");
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
                let query = Template::new(template).render(&scope, Duration::from_secs(90)).unwrap();
                assert_eq!(client.query(query.clone()).await.unwrap(), vec![], "{query}");
            }
        }
        for template in [REQUESTS, ERRORS, "x{SCOPE,code=\"500\"}", "max_over_time(x{SCOPE}[WINDOW:1m])"] {
            let query = Template::new(template).render(&[], FIVE_MINUTES).unwrap();
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
