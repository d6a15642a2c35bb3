//! How percolator reaches a Prometheus HTTP API (Prometheus itself, Thanos, Mimir, Cortex,
//! VictoriaMetrics, a managed service): TLS (a CA file, a client certificate, or no
//! verification), credentials (a bearer token file or basic auth files, re-read when they
//! change), extra headers (a tenant's `X-Scope-OrgID`), the bounded reading of answers, and the
//! redaction of every secret from the messages this module hands out.
//!
//! Credentials are read from files at each request when the file changed (one `stat`), so a
//! rotated projected ServiceAccount token applies to the next query. Certificates and CA files
//! are watched by the reloaders of [`apiserver::ReloadingCert`] and [`apiserver::WatchedCaFile`].

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use bytes::Bytes;
use http::HeaderValue;
use rustls::crypto::CryptoProvider;

use super::{Error, Result};
use crate::config::{PrometheusArgs, PrometheusHeader};
use apiserver::files::{CredentialError, Credentials, SecretFile};
use apiserver::{AnyServerCert, ReloadingCert};

/// What the flags say about reaching Prometheus. Its `Debug` shows the URL without its
/// password and header names only.
#[derive(Clone)]
pub(crate) struct ConnectionSettings {
    /// Base URL of the HTTP API.
    pub url: url::Url,
    /// Budget of one call.
    pub timeout: Duration,
    /// CA bundle trusted instead of the system's.
    pub ca_file: Option<PathBuf>,
    /// Client certificate and key files.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Skip the verification of Prometheus' certificate.
    pub insecure_skip_tls_verify: bool,
    /// Bearer token file.
    pub token_file: Option<PathBuf>,
    /// Basic auth user name and password files.
    pub basic_auth: Option<(PathBuf, PathBuf)>,
    /// Headers sent with every request.
    pub headers: Vec<PrometheusHeader>,
    /// Largest answer read, in bytes.
    pub max_response_bytes: u64,
    /// How often the client certificate and CA files are checked for changes.
    pub reload_interval: Duration,
}

impl ConnectionSettings {
    /// Plain access to `url`: no TLS settings, credentials or headers, the default answer limit.
    #[cfg(test)]
    pub(crate) fn plain(url: url::Url, timeout: Duration) -> Self {
        Self {
            url,
            timeout,
            ca_file: None,
            client_cert: None,
            insecure_skip_tls_verify: false,
            token_file: None,
            basic_auth: None,
            headers: Vec::new(),
            max_response_bytes: super::DEFAULT_MAX_RESPONSE_BYTES,
            reload_interval: Duration::from_secs(10),
        }
    }

    /// The settings of the `--prometheus-*` flags; `reload_interval` is how often certificate
    /// files are checked (`--tls-reload-interval`).
    pub(crate) fn from_args(args: &PrometheusArgs, reload_interval: Duration) -> Self {
        Self {
            url: args.prometheus_url.clone(),
            timeout: args.prometheus_timeout,
            ca_file: args.prometheus_ca_file.clone(),
            client_cert: args
                .prometheus_client_tls_cert_file
                .clone()
                .zip(args.prometheus_client_tls_key_file.clone()),
            insecure_skip_tls_verify: args.prometheus_insecure_skip_tls_verify,
            token_file: args.prometheus_token_file.clone(),
            basic_auth: args
                .prometheus_basic_auth_username_file
                .clone()
                .zip(args.prometheus_basic_auth_password_file.clone()),
            headers: args.prometheus_headers.clone(),
            max_response_bytes: args.prometheus_max_response_bytes,
            reload_interval,
        }
    }

    /// The URL as it may be logged (a password in it replaced).
    pub(crate) fn display_url(&self) -> String {
        let mut url = self.url.clone();
        if url.password().is_some() {
            // Angle brackets would be percent-encoded in a URL.
            let _ = url.set_password(Some("REDACTED"));
        }
        url.to_string()
    }

    /// The user name and password of the URL (`https://user:pass@host`), percent-decoded.
    fn url_credentials(&self) -> Option<(String, String)> {
        let password = self.url.password()?;
        // As reqwest decodes them for the basic-auth header (`+` stays `+`).
        let decode = |s: &str| percent_encoding::percent_decode_str(s).decode_utf8_lossy().into_owned();
        Some((decode(self.url.username()), decode(password)))
    }

    /// Whether any TLS setting is given.
    fn has_tls_settings(&self) -> bool {
        self.ca_file.is_some() || self.client_cert.is_some() || self.insecure_skip_tls_verify
    }
}

/// An HTTP client set up for one Prometheus, with its credentials and limits. Its `Debug`
/// holds no secret.
pub(super) struct Connection {
    /// The client: TLS, timeouts and the constant headers.
    pub http: reqwest::Client,
    credentials: Credentials,
    /// Constant secrets to redact: header values, a password in the URL.
    fixed_secrets: Vec<String>,
    /// Largest answer read.
    pub max_response_bytes: u64,
}

impl Connection {
    /// Builds the client; every unusable setting fails here, naming its flag.
    pub(super) fn new(settings: &ConnectionSettings) -> Result<Self> {
        // reqwest panics when no rustls provider is installed; main installs ring, and doing it
        // here too (idempotent) keeps that panic off every path.
        let _ = rustls::crypto::ring::default_provider().install_default();
        if settings.has_tls_settings() && settings.url.scheme() != "https" {
            return Err(Error::Client(format!(
                "--prometheus-url {}: TLS flags (--prometheus-ca-file, --prometheus-client-tls-*, \
                 --prometheus-insecure-skip-tls-verify) need an https URL",
                settings.display_url()
            )));
        }
        if settings.insecure_skip_tls_verify && settings.ca_file.is_some() {
            return Err(Error::Client(
                "--prometheus-ca-file and --prometheus-insecure-skip-tls-verify cannot be used together"
                    .to_owned(),
            ));
        }
        let url_credentials = settings.url_credentials();
        if url_credentials.is_some() && (settings.token_file.is_some() || settings.basic_auth.is_some()) {
            return Err(Error::Client(
                "--prometheus-url carries a user and password: do not combine it with --prometheus-token-file \
                 or --prometheus-basic-auth-*"
                    .to_owned(),
            ));
        }
        let credentials = match (&settings.token_file, &settings.basic_auth) {
            (Some(_), Some(_)) => {
                return Err(Error::Client(
                    "--prometheus-token-file and --prometheus-basic-auth-* cannot be used together"
                        .to_owned(),
                ));
            }
            (Some(token), None) => Credentials::Bearer(secret(token, "--prometheus-token-file")?),
            (None, Some((username, password))) => Credentials::Basic {
                username: secret(username, "--prometheus-basic-auth-username-file")?,
                password: secret(password, "--prometheus-basic-auth-password-file")?,
            },
            (None, None) => Credentials::None,
        };
        let mut headers = http::HeaderMap::new();
        let mut fixed_secrets = Vec::new();
        for header in &settings.headers {
            if header.name == http::header::AUTHORIZATION && !matches!(credentials, Credentials::None) {
                return Err(Error::Client(
                    "--prometheus-header Authorization=... cannot be combined with --prometheus-token-file \
                     or --prometheus-basic-auth-*"
                        .to_owned(),
                ));
            }
            headers.append(header.name.clone(), header.value.clone());
            if let Ok(value) = header.value.to_str()
                && !value.is_empty()
            {
                fixed_secrets.push(value.to_owned());
            }
        }
        if let (Some(raw), Some((user, password))) = (settings.url.password(), url_credentials) {
            // reqwest sends URL credentials as basic auth: the header's value is secret too.
            let pair = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            fixed_secrets.extend([raw.to_owned(), password, pair]);
        }
        let mut builder = reqwest::Client::builder()
            .timeout(settings.timeout)
            .connect_timeout(settings.timeout)
            .default_headers(headers);
        if let Some(tls) = tls_config(settings)? {
            builder = builder.tls_backend_preconfigured(tls);
        }
        let http = builder.build().map_err(|e| Error::Client(e.to_string()))?;
        Ok(Self { http, credentials, fixed_secrets, max_response_bytes: settings.max_response_bytes })
    }

    /// The `Authorization` header of the next request, from the credential files as they are
    /// now.
    pub(super) fn authorization(&self) -> std::result::Result<Option<HeaderValue>, CredentialError> {
        self.credentials.authorization()
    }

    /// `message` with every secret this connection knows replaced by `<redacted>`.
    pub(super) fn redact(&self, message: String) -> String {
        let mut secrets = self.fixed_secrets.clone();
        secrets.extend(self.credentials.secrets());
        apiserver::files::redact(message, secrets)
    }

    /// Reads `response`'s body, aborting (and dropping the connection) as soon as it would
    /// exceed [`Connection::max_response_bytes`]: an answer is never held beyond the limit.
    /// Chunks are kept as they arrive (no buffer doubling while the answer streams in) and
    /// joined once at the end.
    pub(super) async fn read_body(
        &self,
        mut response: reqwest::Response,
    ) -> std::result::Result<Bytes, BodyError> {
        let limit = self.max_response_bytes;
        if response.content_length().is_some_and(|length| length > limit) {
            return Err(BodyError::TooLarge);
        }
        let mut chunks: Vec<Bytes> = Vec::new();
        let mut total = 0u64;
        while let Some(chunk) = response.chunk().await.map_err(BodyError::Read)? {
            total += chunk.len() as u64;
            if total > limit {
                return Err(BodyError::TooLarge);
            }
            chunks.push(chunk);
        }
        Ok(match chunks.len() {
            0 => Bytes::new(),
            1 => chunks.swap_remove(0),
            _ => {
                let mut body = Vec::with_capacity(usize::try_from(total).unwrap_or(0));
                for chunk in chunks.drain(..) {
                    body.extend_from_slice(&chunk);
                }
                Bytes::from(body)
            }
        })
    }
}

/// Why an answer's body could not be read.
#[derive(Debug)]
pub(super) enum BodyError {
    /// It grew past the limit.
    TooLarge,
    /// The connection failed while reading.
    Read(reqwest::Error),
}

/// Reads a credential file once now, so a missing or empty file fails the start.
fn secret(path: &Path, flag: &'static str) -> Result<SecretFile> {
    SecretFile::load(path, flag).map_err(|e| Error::Client(e.to_string()))
}

/// The rustls configuration when a TLS flag is given; `None` leaves reqwest's default (the
/// platform's verifier and trust store).
fn tls_config(settings: &ConnectionSettings) -> Result<Option<rustls::ClientConfig>> {
    if !settings.has_tls_settings() {
        return Ok(None);
    }
    let tls_error = |e: rustls::Error| Error::Client(e.to_string());
    let provider = CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
    let builder = rustls::ClientConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(tls_error)?;
    let mut resumption = None;
    let builder = if settings.insecure_skip_tls_verify {
        tracing::warn!("--prometheus-insecure-skip-tls-verify: Prometheus' certificate is not verified");
        builder.dangerous().with_custom_certificate_verifier(Arc::new(AnyServerCert::new(&provider)))
    } else if let Some(ca_file) = &settings.ca_file {
        let file = apiserver::WatchedCaFile::load(ca_file, "--prometheus-ca-file")
            .map_err(|e| Error::Client(e.to_string()))?;
        file.spawn_reloader(settings.reload_interval);
        let verifier = apiserver::WatchedRootsVerifier::new(Arc::clone(&file), &provider)
            .map_err(|e| Error::Client(e.to_string()))?;
        // A resumed session is not verified again: forget them when the CA file changes.
        resumption = Some(apiserver::CaBoundSessions::new(file));
        builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier))
    } else {
        let verifier = rustls_platform_verifier::Verifier::new(Arc::clone(&provider)).map_err(tls_error)?;
        builder.dangerous().with_custom_certificate_verifier(Arc::new(verifier))
    };
    let mut config = match &settings.client_cert {
        Some((cert, key)) => {
            let pair = Arc::new(
                ReloadingCert::load_named(
                    cert.clone(),
                    key.clone(),
                    ("--prometheus-client-tls-cert-file", "--prometheus-client-tls-key-file"),
                )
                .map_err(|e| Error::Client(e.to_string()))?,
            );
            pair.spawn_reloader(settings.reload_interval);
            builder.with_client_cert_resolver(pair)
        }
        None => builder.with_no_client_auth(),
    };
    if let Some(sessions) = resumption {
        config.resumption = rustls::client::Resumption::store(sessions);
    }
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Some(config))
}

impl std::fmt::Debug for ConnectionSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionSettings")
            .field("url", &self.display_url())
            .field("timeout", &self.timeout)
            .field("ca_file", &self.ca_file)
            .field("client_cert", &self.client_cert)
            .field("insecure_skip_tls_verify", &self.insecure_skip_tls_verify)
            .field("token_file", &self.token_file)
            .field("basic_auth", &self.basic_auth)
            .field("headers", &self.headers)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish()
    }
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("credentials", &self.credentials)
            .field("max_response_bytes", &self.max_response_bytes)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex as StdMutex;

    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;
    use crate::sources::kubelet::tests::MkObserver;
    use crate::sources::prometheus::PromClient;
    use crate::sources::{PromError, PromSource};

    /// What the fake Prometheus answers.
    #[derive(Clone)]
    enum Reply {
        /// `200` with this JSON.
        Json(&'static str),
        /// `status` with this body, echoing the request's Authorization header in it.
        EchoAuthorization(u16),
        /// A vector answer that never ends (chunked), until the client hangs up.
        Endless,
    }

    /// A one-route HTTP/1.1 server recording each request's head.
    struct MkServer {
        url: String,
        heads: Arc<StdMutex<Vec<String>>>,
        sent: Arc<std::sync::atomic::AtomicU64>,
    }

    async fn mk_server(reply: Reply) -> MkServer {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let heads = Arc::new(StdMutex::new(Vec::new()));
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (h, n) = (heads.clone(), sent.clone());
        tokio::spawn(async move {
            loop {
                let (mut stream, _) = listener.accept().await.unwrap();
                let (heads, sent, reply) = (h.clone(), n.clone(), reply.clone());
                tokio::spawn(async move {
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    // Head, then the body by Content-Length.
                    let head_end = loop {
                        let read = stream.read(&mut chunk).await.unwrap_or(0);
                        if read == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..read]);
                        if let Some(at) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                            break at + 4;
                        }
                    };
                    let head = String::from_utf8_lossy(&buf[..head_end]).to_string();
                    let length: usize = head
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse().unwrap())
                        })
                        .unwrap_or(0);
                    while buf.len() < head_end + length {
                        let read = stream.read(&mut chunk).await.unwrap_or(0);
                        if read == 0 {
                            return;
                        }
                        buf.extend_from_slice(&chunk[..read]);
                    }
                    heads.lock().unwrap().push(head.clone());
                    let respond = |status: u16, body: String| {
                        format!(
                            "HTTP/1.1 {status} X\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                            body.len()
                        )
                    };
                    match reply {
                        Reply::Json(body) => {
                            let _ = stream.write_all(respond(200, body.to_owned()).as_bytes()).await;
                        }
                        Reply::EchoAuthorization(status) => {
                            let authorization = head
                                .lines()
                                .find_map(|l| l.strip_prefix("authorization: "))
                                .unwrap_or("none")
                                .to_owned();
                            let tenant = head
                                .lines()
                                .find_map(|l| l.strip_prefix("x-scope-orgid: "))
                                .unwrap_or("none");
                            let body = format!("denied: {authorization} tenant {tenant}");
                            let _ = stream.write_all(respond(status, body).as_bytes()).await;
                        }
                        Reply::Endless => {
                            let start = "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n";
                            if stream.write_all(start.as_bytes()).await.is_err() {
                                return;
                            }
                            let open = r#"{"status":"success","data":{"resultType":"vector","result":["#;
                            let series =
                                r#"{"metric":{"namespace":"shop","pod":"web-0"},"value":[1700000000,"1"]},"#;
                            let mut first = open.to_owned();
                            loop {
                                let mut payload = std::mem::take(&mut first);
                                while payload.len() < 64 * 1024 {
                                    payload.push_str(series);
                                }
                                let frame = format!("{:x}\r\n{payload}\r\n", payload.len());
                                if stream.write_all(frame.as_bytes()).await.is_err() {
                                    return;
                                }
                                sent.fetch_add(payload.len() as u64, std::sync::atomic::Ordering::Relaxed);
                                if sent.load(std::sync::atomic::Ordering::Relaxed) > 8 << 30 {
                                    return;
                                }
                            }
                        }
                    }
                });
            }
        });
        MkServer { url, heads, sent }
    }

    const ONE: &str = r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"pod":"a"},"value":[1700000000.5,"2"]}]}}"#;

    fn settings(url: &str) -> ConnectionSettings {
        ConnectionSettings {
            timeout: Duration::from_secs(5),
            max_response_bytes: 1 << 20,
            ..ConnectionSettings::plain(url::Url::parse(url).unwrap(), Duration::ZERO)
        }
    }

    fn header(text: &str) -> PrometheusHeader {
        let (name, value) = text.split_once('=').unwrap();
        PrometheusHeader { name: name.parse().unwrap(), value: value.parse().unwrap() }
    }

    fn client(settings: &ConnectionSettings) -> PromClient {
        PromClient::connect(settings, Arc::new(MkObserver::default())).unwrap()
    }

    fn temp(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("percolator-conn-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    fn authorization_of(head: &str) -> Option<&str> {
        head.lines().find_map(|l| l.strip_prefix("authorization: "))
    }

    #[tokio::test]
    async fn a_rotated_token_file_applies_to_the_next_query_and_headers_go_along() {
        let server = mk_server(Reply::Json(ONE)).await;
        let dir = temp("token");
        let token = dir.join("token");
        std::fs::write(&token, "first-token-1234\n").unwrap();
        let mut settings = settings(&server.url);
        settings.token_file = Some(token.clone());
        settings.headers = vec![header("X-Scope-OrgID=tenant-a"), header("X-Extra=a,b")];
        let client = client(&settings);

        let samples = client.query("up".to_owned()).await.unwrap();
        assert_eq!(samples[0].value, 2.0);
        // A projected token is swapped through a symlink: write a new file and rename over.
        std::fs::write(dir.join("next"), "second-token-5678").unwrap();
        std::fs::rename(dir.join("next"), &token).unwrap();
        client.query("up".to_owned()).await.unwrap();
        // A file that disappears keeps the last good value.
        std::fs::remove_file(&token).unwrap();
        client.query("up".to_owned()).await.unwrap();

        let heads = server.heads.lock().unwrap().clone();
        let sent: Vec<_> = heads.iter().map(|h| authorization_of(h)).collect();
        assert_eq!(
            sent,
            [
                Some("Bearer first-token-1234"),
                Some("Bearer second-token-5678"),
                Some("Bearer second-token-5678")
            ]
        );
        for head in &heads {
            assert!(head.contains("x-scope-orgid: tenant-a\r\n"), "{head}");
            assert!(head.contains("x-extra: a,b\r\n"), "{head}");
            assert!(head.starts_with("POST /api/v1/query HTTP/1.1"), "{head}");
        }
    }

    #[tokio::test]
    async fn basic_auth_comes_from_its_files() {
        let server = mk_server(Reply::Json(ONE)).await;
        let dir = temp("basic");
        std::fs::write(dir.join("user"), "alice\n").unwrap();
        std::fs::write(dir.join("password"), "s3cret-pass").unwrap();
        let mut settings = settings(&server.url);
        settings.basic_auth = Some((dir.join("user"), dir.join("password")));
        client(&settings).query("up".to_owned()).await.unwrap();
        let heads = server.heads.lock().unwrap().clone();
        // base64("alice:s3cret-pass")
        assert_eq!(authorization_of(&heads[0]), Some("Basic YWxpY2U6czNjcmV0LXBhc3M="));
    }

    #[tokio::test]
    async fn secrets_never_reach_an_error() {
        let server = mk_server(Reply::EchoAuthorization(401)).await;
        let dir = temp("redact");
        std::fs::write(dir.join("token"), "tok-SECRET-9").unwrap();
        let mut settings = settings(&server.url);
        settings.token_file = Some(dir.join("token"));
        settings.headers = vec![header("X-Scope-OrgID=tenant-SECRET")];
        let error = client(&settings).query("up".to_owned()).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "prometheus unreachable: POST /api/v1/query: HTTP 401 Unauthorized: denied: Bearer <redacted> tenant <redacted>"
        );

        let dir = temp("redact-basic");
        std::fs::write(dir.join("user"), "bob").unwrap();
        std::fs::write(dir.join("password"), "pw-SECRET").unwrap();
        let mut settings = self::settings(&server.url);
        settings.basic_auth = Some((dir.join("user"), dir.join("password")));
        let error = client(&settings).query("up".to_owned()).await.unwrap_err().to_string();
        assert!(!error.contains("SECRET") && !error.contains("Ym9iOnB3LVNFQ1JFVA"), "{error}");
        assert!(error.ends_with("denied: Basic <redacted> tenant none"), "{error}");

        // A password in the URL is redacted where the URL is shown.
        let url = server.url.replace("http://", "http://user:url-SECRET@");
        assert_eq!(self::settings(&url).display_url(), url.replace("url-SECRET", "REDACTED") + "/");
    }

    #[tokio::test]
    async fn an_answer_over_the_limit_is_aborted_while_streaming() {
        let server = mk_server(Reply::Endless).await;
        let mut settings = settings(&server.url);
        settings.max_response_bytes = 4 << 20;
        let observer = Arc::new(MkObserver::default());
        let client = PromClient::connect(&settings, observer.clone()).unwrap();
        let error = client.query("up".to_owned()).await.unwrap_err();
        assert_eq!(error, PromError::TooLarge { limit: 4 << 20 });
        assert_eq!(
            error.to_string(),
            "prometheus answer larger than 4194304 bytes (--prometheus-max-response-bytes): aborted"
        );
        // The client hung up: the server stopped well short of what it would have sent.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let sent = server.sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 64 << 20, "{sent} bytes sent");
        assert_eq!(*observer.calls.lock().unwrap(), vec![("prometheus", "error")]);

        // Within the limit the same client reads an answer whole.
        let small = mk_server(Reply::Json(ONE)).await;
        let mut settings = self::settings(&small.url);
        settings.max_response_bytes = ONE.len() as u64;
        assert_eq!(self::client(&settings).query("up".to_owned()).await.unwrap().len(), 1);
        settings.max_response_bytes = ONE.len() as u64 - 1;
        assert_eq!(
            self::client(&settings).query("up".to_owned()).await.unwrap_err(),
            PromError::TooLarge { limit: ONE.len() as u64 - 1 }
        );
    }

    #[test]
    fn unusable_settings_fail_naming_the_flag() {
        let dir = temp("bad");
        std::fs::write(dir.join("empty"), "\n").unwrap();
        std::fs::write(dir.join("token"), "t").unwrap();
        let fail = |settings: ConnectionSettings| Connection::new(&settings).unwrap_err().to_string();

        let mut s = settings("http://prometheus:9090");
        s.insecure_skip_tls_verify = true;
        assert_eq!(
            fail(s),
            "prometheus client: --prometheus-url http://prometheus:9090/: TLS flags (--prometheus-ca-file, \
             --prometheus-client-tls-*, --prometheus-insecure-skip-tls-verify) need an https URL"
        );
        let mut s = settings("http://p:9090");
        s.token_file = Some(dir.join("empty"));
        assert_eq!(
            fail(s),
            format!("prometheus client: --prometheus-token-file {} is empty", dir.join("empty").display())
        );
        let mut s = settings("http://p:9090");
        s.token_file = Some(dir.join("missing"));
        assert!(fail(s).starts_with(&format!(
            "prometheus client: --prometheus-token-file {}: ",
            dir.join("missing").display()
        )));
        let mut s = settings("http://p:9090");
        s.token_file = Some(dir.join("token"));
        s.headers = vec![header("Authorization=Bearer x")];
        assert!(fail(s).contains("--prometheus-header Authorization=... cannot be combined"));
        let mut s = settings("https://p:9090");
        s.ca_file = Some(dir.join("token"));
        assert!(fail(s).contains("--prometheus-ca-file"));
    }

    /// An HTTPS server (certificate for 127.0.0.1 from `server_ca`) that requires a client
    /// certificate from `client_ca` and answers [`ONE`] to each request.
    async fn mk_tls_server(server_ca: &test_support::MkCa, client_ca: &test_support::MkCa) -> String {
        use rustls::pki_types::{PrivateKeyDer, PrivatePkcs8KeyDer};
        let leaf = test_support::mk_cert(server_ca, |params| {
            params.subject_alt_names = vec![rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap())];
            params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        });
        let mut roots = rustls::RootCertStore::empty();
        roots.add(client_ca.der.clone()).unwrap();
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let verifier =
            rustls::server::WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
                .build()
                .unwrap();
        let config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(vec![leaf.der], PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(leaf.key_der)))
            .unwrap();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        tokio::spawn(async move {
            loop {
                let (tcp, _) = listener.accept().await.unwrap();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                    let mut buf = Vec::new();
                    let mut chunk = [0u8; 4096];
                    while !buf.windows(4).any(|w| w == b"\r\n\r\n") {
                        match tls.read(&mut chunk).await {
                            Ok(0) | Err(_) => return,
                            Ok(n) => buf.extend_from_slice(&chunk[..n]),
                        }
                    }
                    let response = format!(
                        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{ONE}",
                        ONE.len()
                    );
                    let _ = tls.write_all(response.as_bytes()).await;
                    let _ = tls.shutdown().await;
                });
            }
        });
        url
    }

    #[tokio::test]
    async fn tls_with_a_ca_file_and_a_client_certificate() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let server_ca = test_support::mk_ca("prometheus-ca");
        let client_ca = test_support::mk_ca("client-ca");
        let other_ca = test_support::mk_ca("other-ca");
        let url = mk_tls_server(&server_ca, &client_ca).await;
        let dir = temp("tls");
        std::fs::write(dir.join("ca.crt"), &server_ca.pem).unwrap();
        std::fs::write(dir.join("other.crt"), &other_ca.pem).unwrap();
        let write_client = |ca: &test_support::MkCa, name: &str| {
            let leaf = test_support::mk_cert(ca, |params| {
                params.distinguished_name.push(rcgen::DnType::CommonName, "percolator");
                params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
            });
            let pem = |label: &str, der: &[u8]| {
                use base64::Engine as _;
                let body = base64::engine::general_purpose::STANDARD.encode(der);
                let lines: Vec<&str> =
                    body.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap()).collect();
                format!("-----BEGIN {label}-----\n{}\n-----END {label}-----\n", lines.join("\n"))
            };
            std::fs::write(dir.join(format!("{name}.crt")), pem("CERTIFICATE", &leaf.der)).unwrap();
            std::fs::write(dir.join(format!("{name}.key")), pem("PRIVATE KEY", &leaf.key_der)).unwrap();
            (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")))
        };
        let good_client = write_client(&client_ca, "good");
        let bad_client = write_client(&other_ca, "bad");

        let mut ok = settings(&url);
        ok.ca_file = Some(dir.join("ca.crt"));
        ok.client_cert = Some(good_client.clone());
        assert_eq!(client(&ok).query("up".to_owned()).await.unwrap()[0].value, 2.0);

        // The server's CA is not trusted: a verification error, not an answer.
        let mut s = ok.clone();
        s.ca_file = Some(dir.join("other.crt"));
        let error = client(&s).query("up".to_owned()).await.unwrap_err().to_string();
        assert!(error.starts_with("prometheus unreachable:") && error.contains("UnknownIssuer"), "{error}");
        // Without verification the same server answers.
        let mut s = ok.clone();
        s.ca_file = None;
        s.insecure_skip_tls_verify = true;
        assert_eq!(client(&s).query("up".to_owned()).await.unwrap().len(), 1);
        // A client certificate the server does not trust, or none: refused.
        for client_cert in [Some(bad_client), None] {
            let mut s = ok.clone();
            s.client_cert = client_cert;
            let error = client(&s).query("up".to_owned()).await.unwrap_err().to_string();
            assert!(error.starts_with("prometheus unreachable:"), "{error}");
        }
    }

    #[tokio::test]
    async fn answers_decode_special_values_and_reject_other_types() {
        let server = mk_server(Reply::Json(
            r#"{"status":"success","data":{"resultType":"vector","result":[{"metric":{"a":"1"},"value":[1700000000,"NaN"]},{"metric":{},"value":[1700000000.25,"+Inf"]},{"metric":{},"value":[1,"-Inf"]}]},"isPartial":false}"#,
        ))
        .await;
        let samples = client(&settings(&server.url)).query("up".to_owned()).await.unwrap();
        assert!(samples[0].value.is_nan());
        assert_eq!(samples[0].labels.get("a"), Some("1"));
        assert_eq!((samples[1].value, samples[2].value), (f64::INFINITY, f64::NEG_INFINITY));
        assert_eq!(samples[1].timestamp.as_millisecond(), 1_700_000_000_250);
        let matrix =
            mk_server(Reply::Json(r#"{"status":"success","data":{"resultType":"matrix","result":[]}}"#))
                .await;
        assert_eq!(
            client(&settings(&matrix.url)).query("up[5m]".to_owned()).await.unwrap_err(),
            PromError::Query("the query returned a matrix, not an instant vector".to_owned())
        );
        let error =
            mk_server(Reply::Json(r#"{"status":"error","errorType":"bad_data","error":"parse error"}"#))
                .await;
        assert_eq!(
            client(&settings(&error.url)).query("sum(".to_owned()).await.unwrap_err(),
            PromError::Query("bad_data: parse error".to_owned())
        );
    }

    #[tokio::test]
    async fn url_credentials_are_secret_and_exclusive() {
        let server = mk_server(Reply::EchoAuthorization(401)).await;
        let url = server.url.replace("http://", "http://carol:p%40ss+SECRET@");
        let error = client(&settings(&url)).query("up".to_owned()).await.unwrap_err().to_string();
        // reqwest sends them as basic auth; the echoed header is redacted.
        assert!(error.ends_with("denied: Basic <redacted> tenant none"), "{error}");
        let dir = temp("url-creds");
        std::fs::write(dir.join("token"), "t-SECRET").unwrap();
        let mut s = settings(&url);
        s.token_file = Some(dir.join("token"));
        s.headers = vec![header("X-Scope-OrgID=h-SECRET")];
        assert!(
            Connection::new(&s)
                .unwrap_err()
                .to_string()
                .contains("--prometheus-url carries a user and password")
        );
        s.url = url::Url::parse(&server.url).unwrap();
        let connection = Connection::new(&s).unwrap();
        connection.authorization().unwrap();
        for debug in [format!("{connection:?}"), format!("{:?}", settings(&url)), format!("{s:?}")] {
            assert!(!debug.contains("SECRET"), "{debug}");
        }
    }
}
