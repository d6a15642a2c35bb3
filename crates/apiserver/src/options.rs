//! The flags of the generic server, as k8s.io/apiserver's `options` package gives a Go extension
//! server: the HTTPS listener ([`ServingArgs`]) and delegated authentication and authorization
//! ([`AuthArgs`]), spelled as kube-apiserver and metrics-server spell them. A server composes
//! them into its own clap `Parser` with `#[command(flatten)]` and [`kubernetes_style`]. They
//! name no environment variable: the server gives them its own (see [`env_named`]).

use std::path::PathBuf;
use std::time::Duration;

use clap::Args as ClapArgs;
use k8s_wire::duration;

/// Flags of the HTTPS listener.
#[derive(Debug, Clone, ClapArgs)]
pub struct ServingArgs {
    /// Port of the HTTPS listener (0 picks a free port and logs it).
    #[arg(long, default_value_t = 10250)]
    pub secure_port: u16,
    /// Address of the HTTPS listener.
    #[arg(long, default_value = "0.0.0.0")]
    pub bind_address: std::net::IpAddr,
    /// Directory where the self-signed serving certificate is written when --tls-cert-file is
    /// not given.
    #[arg(long, default_value = "apiserver.local.config/certificates")]
    pub cert_dir: PathBuf,
    /// PEM serving certificate (with intermediates). Requires --tls-private-key-file.
    #[arg(long, requires = "tls_private_key_file")]
    pub tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file.
    #[arg(long, requires = "tls_cert_file")]
    pub tls_private_key_file: Option<PathBuf>,
    /// Minimum TLS version: VersionTLS12 or VersionTLS13.
    #[arg(long, default_value = "VersionTLS12", value_parser = ["VersionTLS12", "VersionTLS13"])]
    pub tls_min_version: String,
    /// Maximum concurrent HTTP/2 streams per connection (kube-apiserver multiplexes every
    /// proxied request over one connection).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(100..))]
    pub http2_max_streams_per_connection: u32,
    /// Maximum number of requests served at once (kube-apiserver's flag). Beyond it requests
    /// are answered at once with 429 TooManyRequests and Retry-After: 1 instead of queueing.
    /// Health, discovery, OpenAPI, /version and /metrics are exempt: they are precomputed,
    /// cheap, and must keep answering under overload. 0 disables the limit.
    #[arg(long, default_value_t = 400)]
    pub max_requests_inflight: u32,
    /// Longest time a request may take (kube-apiserver's flag, e.g. 60s); a request still
    /// running then is answered 504 Timeout. A request's `?timeout=` can only shorten it.
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    pub request_timeout: Duration,
    /// After SIGTERM, how long /readyz fails while requests are still served normally, so that
    /// endpoints and load balancers stop sending traffic before the listener closes
    /// (kube-apiserver's flag). In-flight requests are then drained. A second signal skips it.
    #[arg(long, default_value = "5s", value_parser = duration::parse)]
    pub shutdown_delay_duration: Duration,
    /// How often --tls-cert-file and --tls-private-key-file (or the self-signed pair in
    /// --cert-dir) are checked for changes; a changed pair is served to new connections
    /// without a restart. The CA files given as flags (--client-ca-file,
    /// --requestheader-client-ca-file, and the CA files of the server's upstreams)
    /// and the client certificates the server presents to its upstreams are checked as often:
    /// a changed, valid bundle applies to the next request or connection.
    #[arg(long, default_value = "10s", value_parser = parse_positive_duration)]
    pub tls_reload_interval: Duration,
    /// A connection with no request in progress for this long is closed (HTTP/2: GOAWAY, then
    /// closed): between HTTP/1.1 keep-alive requests, an HTTP/2 connection without an open
    /// stream, and a new connection before its first request. 90s, the generic Kubernetes API
    /// server's (Go's http.Server IdleTimeout).
    #[arg(long, default_value = "90s", value_parser = parse_positive_duration)]
    pub connection_idle_timeout: Duration,
    /// HTTP/2: a connection on which no frame has been received for this long is sent a PING
    /// (client-go's HTTP2_READ_IDLE_TIMEOUT_SECONDS is 30 as well); 0 sends none.
    #[arg(long, default_value = "30s", value_parser = duration::parse)]
    pub http2_read_idle_timeout: Duration,
    /// HTTP/2: a PING not answered within this time closes the connection (a peer that is
    /// gone, or that sent its preface and nothing more).
    #[arg(long, default_value = "15s", value_parser = parse_positive_duration)]
    pub http2_ping_timeout: Duration,
    /// Time allowed for writing to a client: a connection on which nothing could be written for
    /// this long while bytes wait is closed (a peer that stopped reading), and a response not
    /// completely written within --request-timeout plus this after its request arrived is
    /// abandoned (HTTP/2: its stream is reset, e.g. a zero flow-control window; HTTP/1.1: the
    /// connection is closed).
    #[arg(long, default_value = "60s", value_parser = parse_positive_duration)]
    pub write_timeout: Duration,
    /// Maximum open connections (TLS handshakes included); a connection beyond it is closed
    /// as soon as it is accepted, counted and logged. 0 disables the limit.
    #[arg(long, default_value_t = 4096)]
    pub max_connections: u32,
    /// Maximum open connections from one client IP address; a connection beyond it is closed
    /// as soon as it is accepted, counted and logged. 0 disables the limit.
    #[arg(long, default_value_t = 2048)]
    pub max_connections_per_ip: u32,
}

/// Makes a flag read as Kubernetes components' flags (Go's `flag` package) read: a boolean
/// alone means true and takes an attached value (`--anonymous-auth=false`, never a following
/// argument), and a list is comma-separated (`--requestheader-allowed-names=a,b`).
pub fn kubernetes_style(arg: clap::Arg) -> clap::Arg {
    match arg.get_action() {
        clap::ArgAction::SetTrue => {
            let arg = if arg.get_default_values().is_empty() { arg.default_value("false") } else { arg };
            arg.num_args(0..=1)
                .require_equals(true)
                .default_missing_value("true")
                .action(clap::ArgAction::Set)
        }
        clap::ArgAction::Append => arg.value_delimiter(','),
        _ => arg,
    }
}

/// Gives a flag without an environment variable the one `prefix` names it by: `--tls-cert-file`
/// with prefix `EXAMPLE_` reads `EXAMPLE_TLS_CERT_FILE` (upper case, dashes to underscores); a
/// flag without a long name, or with its own variable, is left as it is. A server applies it
/// to all its flags with `#[command(mut_args(...))]`, choosing the prefix its users see.
pub fn env_named(prefix: &str, arg: clap::Arg) -> clap::Arg {
    match arg.get_long() {
        Some(long) if arg.get_env().is_none() => {
            let name = format!("{prefix}{}", long.to_uppercase().replace('-', "_"));
            arg.env(name)
        }
        _ => arg,
    }
}

/// Why a duration flag's value was refused (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DurationFlagError {
    /// Not a Go duration.
    #[error(transparent)]
    Invalid(#[from] duration::DurationError),
    /// Zero.
    #[error("must be greater than 0")]
    NotPositive,
}

/// A duration flag that must be greater than zero.
pub fn parse_positive_duration(text: &str) -> std::result::Result<Duration, DurationFlagError> {
    match duration::parse(text)? {
        d if d.is_zero() => Err(DurationFlagError::NotPositive),
        d => Ok(d),
    }
}

/// Why a byte-count or header flag's value was refused (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlagValueError {
    /// Not a quantity.
    #[error(transparent)]
    Quantity(#[from] k8s_wire::quantity::QuantityError),
    /// A quantity, but not a whole number of bytes above zero.
    #[error("{text:?} is not a whole number of bytes above 0")]
    NotAByteCount {
        /// The value as given.
        text: String,
    },
    /// A header flag: a blank line.
    #[error("an empty header: give one NAME=VALUE per line, without empty lines")]
    EmptyHeader,
    /// A header flag: no `=`.
    #[error("expected NAME=VALUE")]
    NotAHeader,
    /// A header flag: the name is not a header name.
    #[error("{name:?} is not a valid header name")]
    InvalidHeaderName {
        /// The name as given.
        name: String,
    },
    /// A header flag: a header the HTTP client sets.
    #[error("header {name} is set by the HTTP client and cannot be overridden")]
    ReservedHeader {
        /// The header's name.
        name: String,
    },
    /// A header flag: the value has characters a header cannot carry.
    #[error("the value of header {name} has characters a header cannot carry")]
    InvalidHeaderValue {
        /// The header's name.
        name: String,
    },
}

/// A byte count written as a Kubernetes quantity (`128Mi`, `1G`, `1048576`), above zero.
pub fn parse_byte_size(text: &str) -> std::result::Result<u64, FlagValueError> {
    let bytes = k8s_wire::quantity::parse(text)?;
    if !(bytes >= 1.0 && bytes < u64::MAX as f64) || bytes.fract() != 0.0 {
        return Err(FlagValueError::NotAByteCount { text: text.to_owned() });
    }
    Ok(bytes as u64)
}

/// One `NAME=VALUE` header flag's value, sent to an upstream; its `Debug` leaves the value out
/// (it may be a secret).
#[derive(Clone, PartialEq, Eq)]
pub struct HeaderArg {
    /// The header name.
    pub name: http::HeaderName,
    /// The value, marked sensitive.
    pub value: http::HeaderValue,
}

impl std::fmt::Debug for HeaderArg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}=<redacted>", self.name)
    }
}

/// Headers the HTTP client owns: setting them would break the request.
const RESERVED_HEADERS: &[&str] =
    &["host", "content-length", "content-type", "transfer-encoding", "connection", "te", "upgrade"];

/// The value parser of a `NAME=VALUE` header flag ([`HeaderArg`]): its errors name the flag
/// and what is wrong, never the value (clap's own errors repeat the value, which may be a
/// secret).
#[derive(Debug, Clone, Copy)]
pub struct HeaderParser;

impl clap::builder::TypedValueParser for HeaderParser {
    type Value = HeaderArg;

    fn parse_ref(
        &self,
        _cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> std::result::Result<HeaderArg, clap::Error> {
        let flag = arg.and_then(clap::Arg::get_long).unwrap_or("header");
        let error = |message: String| {
            clap::Error::raw(
                clap::error::ErrorKind::ValueValidation,
                format!("invalid value for --{flag} (not shown: it may be a secret): {message}\n"),
            )
        };
        let text = value.to_str().ok_or_else(|| error("the value is not UTF-8".to_owned()))?;
        parse_header(text).map_err(|e| error(e.to_string()))
    }
}

/// Parses `NAME=VALUE` (the split at the first `=`).
fn parse_header(text: &str) -> std::result::Result<HeaderArg, FlagValueError> {
    if text.trim().is_empty() {
        // A blank line of the flag's environment variable, or a trailing newline.
        return Err(FlagValueError::EmptyHeader);
    }
    let (name, value) = text.split_once('=').ok_or(FlagValueError::NotAHeader)?;
    let name = http::HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|_| FlagValueError::InvalidHeaderName { name: name.trim().to_owned() })?;
    if RESERVED_HEADERS.contains(&name.as_str()) {
        return Err(FlagValueError::ReservedHeader { name: name.to_string() });
    }
    let mut value = http::HeaderValue::from_str(value.trim())
        .map_err(|_| FlagValueError::InvalidHeaderValue { name: name.to_string() })?;
    value.set_sensitive(true);
    Ok(HeaderArg { name, value })
}

/// Why a reviews-per-second flag's value was refused (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum RateFlagError {
    /// Not a number.
    #[error("{0:?} is not a number of reviews per second (e.g. 200 or 0.5)")]
    NotANumber(String),
    /// Zero, negative, or not finite.
    #[error("must be a finite number greater than 0 (got {0})")]
    NotPositive(String),
}

/// A reviews-per-second flag: a finite number greater than zero (`0.5` is one every 2 s).
pub(crate) fn parse_reviews_per_second(text: &str) -> std::result::Result<f64, RateFlagError> {
    let value: f64 = text.trim().parse().map_err(|_| RateFlagError::NotANumber(text.to_owned()))?;
    if value.is_finite() && value > 0.0 {
        Ok(value)
    } else {
        Err(RateFlagError::NotPositive(text.to_owned()))
    }
}

/// Flags of delegated authentication (TokenReview, client certificates, the front proxy) and
/// authorization (SubjectAccessReview).
#[derive(Debug, Clone, ClapArgs)]
pub struct AuthArgs {
    /// kubeconfig used to create TokenReviews and to read the ConfigMap
    /// kube-system/extension-apiserver-authentication; the cluster configuration (--kubeconfig
    /// or in-cluster) when unset.
    #[arg(long)]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// kubeconfig used to create SubjectAccessReviews; the cluster configuration (--kubeconfig
    /// or in-cluster) when unset.
    #[arg(long)]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// PEM bundle of the CAs that sign client certificates (user = CN, groups = O); read from
    /// the ConfigMap key client-ca-file when unset.
    #[arg(long)]
    pub client_ca_file: Option<PathBuf>,
    /// PEM bundle of the CAs that sign the front proxy's (the aggregator's) client certificate.
    /// When unset, it and every other --requestheader-* setting come from the ConfigMap.
    #[arg(long)]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names allowed for the front proxy's certificate (comma-separated); empty allows
    /// any certificate signed by --requestheader-client-ca-file.
    #[arg(long)]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name; the first non-empty one wins.
    #[arg(long, default_value = "X-Remote-User")]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying the groups; every value of every one is a group.
    #[arg(long, default_value = "X-Remote-Group")]
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of the headers carrying extra user attributes (the rest of the name is the key).
    #[arg(long, default_value = "X-Remote-Extra-")]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Headers carrying the user's UID; the first non-empty one wins.
    #[arg(long, default_value = "X-Remote-Uid")]
    pub requestheader_uid_headers: Vec<String>,
    /// Do not read the ConfigMap kube-system/extension-apiserver-authentication: only the CA
    /// files given as flags are trusted.
    #[arg(long, default_value_t = false)]
    pub authentication_skip_lookup: bool,
    /// Start even when the ConfigMap kube-system/extension-apiserver-authentication cannot be
    /// read (requests may then all be treated as anonymous).
    #[arg(long, default_value_t = false)]
    pub authentication_tolerate_lookup_failure: bool,
    /// Treat requests that no authenticator claims as user system:anonymous (group
    /// system:unauthenticated); with false they get a 401.
    #[arg(long, default_value_t = true)]
    pub anonymous_auth: bool,
    /// How long TokenReview results (authenticated or not) are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview results are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long denied SubjectAccessReview results are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse)]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    /// TokenReviews sent per second at most, on average, retries included (the rate
    /// k8s.io/apiserver's delegated clients use). A review beyond it waits its turn, in order,
    /// at most 1 s (and at most half the request's ?timeout=); then the request is answered
    /// 429 TooManyRequests with Retry-After.
    #[arg(long, default_value_t = 200.0, value_parser = parse_reviews_per_second)]
    pub authentication_token_webhook_qps: f64,
    /// TokenReviews that may be sent at once above --authentication-token-webhook-qps (the
    /// token bucket's size).
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub authentication_token_webhook_burst: u32,
    /// TokenReviews outstanding at most (waiting for the rate limit or sent); beyond it a
    /// request that needs one is answered 429 at once. One client address may hold at most a
    /// quarter of them, so a flood of unknown tokens from one pod leaves room for the others.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub authentication_token_webhook_max_inflight: u32,
    /// SubjectAccessReviews sent per second at most, on average, retries included (the rate
    /// k8s.io/apiserver's delegated clients use). A review beyond it waits its turn, in order,
    /// at most 1 s (and at most half the request's ?timeout=); then the request is answered
    /// 429 TooManyRequests with Retry-After.
    #[arg(long, default_value_t = 200.0, value_parser = parse_reviews_per_second)]
    pub authorization_webhook_qps: f64,
    /// SubjectAccessReviews that may be sent at once above --authorization-webhook-qps (the
    /// token bucket's size).
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub authorization_webhook_burst: u32,
    /// SubjectAccessReviews outstanding at most (waiting for the rate limit or sent); beyond it
    /// a request that needs one is answered 429 at once. One identity (system:anonymous
    /// included) may hold at most a quarter of them, so a flood from one identity leaves room
    /// for the others.
    #[arg(long, default_value_t = 400, value_parser = clap::value_parser!(u32).range(1..))]
    pub authorization_webhook_max_inflight: u32,
    /// How long after its last successful SubjectAccessReview a decision may still be used
    /// while kube-apiserver cannot be reached (stale-if-error); 0 turns it off (such requests
    /// get 503). It bounds how long a permission revoked during an outage keeps working; 5m
    /// rides out a kube-apiserver restart or a control-plane upgrade.
    #[arg(long, default_value = "5m", value_parser = duration::parse)]
    pub authorization_webhook_stale_if_error: Duration,
    /// Non-resource paths anyone may get without a SubjectAccessReview (comma-separated; exact
    /// match, a trailing * matches a prefix).
    #[arg(long, default_value = "/healthz,/readyz,/livez")]
    pub authorization_always_allow_paths: Vec<String>,
    /// Groups whose members are allowed everything without a SubjectAccessReview
    /// (comma-separated).
    #[arg(long, default_value = "system:masters")]
    pub authorization_always_allow_groups: Vec<String>,
}

#[cfg(test)]
/// The generic flags alone, parsed as a server parses them, for this crate's tests.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "apiserver", mut_args(kubernetes_style))]
pub(crate) struct TestFlags {
    #[command(flatten)]
    pub serving: ServingArgs,
    #[command(flatten)]
    pub auth: AuthArgs,
}

#[cfg(test)]
mod tests {
    use clap::{CommandFactory, Parser};

    use super::*;

    /// The generic flags under a server that names their variables `EXAMPLE_<FLAG>`.
    #[derive(Debug, Parser)]
    #[command(name = "example", mut_args(|arg| kubernetes_style(env_named("EXAMPLE_", arg))))]
    struct Named {
        #[command(flatten)]
        serving: ServingArgs,
        #[command(flatten)]
        auth: AuthArgs,
        /// A flag with its own variable, which `env_named` leaves alone.
        #[arg(long, env = "OWN_NAME")]
        own: Option<String>,
    }

    fn env_of(long: &str) -> Option<String> {
        let command = Named::command();
        let arg = command.get_arguments().find(|a| a.get_long() == Some(long));
        arg.and_then(|a| a.get_env()).map(|e| e.to_string_lossy().into_owned())
    }

    #[test]
    fn the_generic_flags_name_no_variable_of_their_own() {
        let mut command = TestFlags::command();
        command.build();
        let named: Vec<_> =
            command.get_arguments().filter(|a| a.get_env().is_some()).map(|a| a.get_id()).collect();
        assert!(named.is_empty(), "{named:?}");
    }

    #[test]
    fn env_named_derives_the_server_s_variables_from_the_long_names() {
        assert_eq!(env_of("secure-port").as_deref(), Some("EXAMPLE_SECURE_PORT"));
        assert_eq!(env_of("tls-cert-file").as_deref(), Some("EXAMPLE_TLS_CERT_FILE"));
        assert_eq!(
            env_of("requestheader-extra-headers-prefix").as_deref(),
            Some("EXAMPLE_REQUESTHEADER_EXTRA_HEADERS_PREFIX")
        );
        assert_eq!(env_of("own").as_deref(), Some("OWN_NAME"));
    }
}
