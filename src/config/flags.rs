//! Command-line flags, one `*Args` struct per concern composed into [`Args`], spelled as
//! metrics-server and the generic Kubernetes API server spell them. Each concern reads its own
//! struct; a bad flag fails at start with a message naming it.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args as ClapArgs, Parser};

pub use apiserver::{AuthArgs, ServingArgs};
use apiserver::{HeaderParser, env_named, kubernetes_style, parse_byte_size, parse_positive_duration};
use k8s_wire::duration;

/// All flags of the `percolator` binary.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "percolator",
    version,
    about = "Read-only Kubernetes aggregated API for live pod and cafe metrics",
    mut_args(flag_style)
)]
pub struct Args {
    /// Serving (HTTPS listener and certificates).
    #[command(flatten)]
    pub serving: ServingArgs,
    /// Cluster access.
    #[command(flatten)]
    pub cluster: ClusterArgs,
    /// Kubelet scraping.
    #[command(flatten)]
    pub kubelet: KubeletArgs,
    /// Prometheus.
    #[command(flatten)]
    pub prometheus: PrometheusArgs,
    /// The query configuration file.
    #[command(flatten)]
    pub queries: QueryArgs,
    /// A prometheus-adapter configuration file.
    #[command(flatten)]
    pub adapter: AdapterArgs,
    /// Caching.
    #[command(flatten)]
    pub cache: CacheArgs,
    /// Delegated authentication and authorization.
    #[command(flatten)]
    pub auth: AuthArgs,
    /// The opt-in external metrics API.
    #[command(flatten)]
    pub metric_apis: MetricApisArgs,
    /// Log verbosity, as Kubernetes components count it: 0 warnings and errors, 1-2 info,
    /// 3-4 debug, 5+ trace.
    #[arg(short = 'v', long = "v", default_value_t = 1, env = "PERCOLATOR_V")]
    pub verbosity: u8,
}

/// The prefix of every flag's environment variable: `--cert-dir` is `PERCOLATOR_CERT_DIR`.
const ENV_PREFIX: &str = "PERCOLATOR_";

/// Kubernetes components' flag style ([`kubernetes_style`]), except that a header value may hold
/// commas: `--prometheus-header` takes one header per flag, or per line (its own delimiter). The
/// generic server's flags (`apiserver`'s, which name no variable) get their `PERCOLATOR_<FLAG>`
/// environment variable here ([`env_named`]).
fn flag_style(arg: clap::Arg) -> clap::Arg {
    let arg = env_named(ENV_PREFIX, arg);
    if arg.get_id() == "prometheus_headers" { arg } else { kubernetes_style(arg) }
}

/// `--max-rate-window`: kubelet sample times are in milliseconds and a few apart at best, so
/// less than a second could never hold a pair.
fn parse_rate_window(text: &str) -> std::result::Result<Duration, FlagValueError> {
    match duration::parse(text) {
        Ok(d) if d < Duration::from_secs(1) => Err(FlagValueError::RateWindowTooShort),
        Ok(d) => Ok(d),
        Err(e) => Err(FlagValueError::Duration(e)),
    }
}

/// A flag value that does not parse (clap prints it after the flag's name).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub(crate) enum FlagValueError {
    /// `--max-rate-window` below a second.
    #[error("must be at least 1s")]
    RateWindowTooShort,
    /// Not a duration.
    #[error(transparent)]
    Duration(#[from] duration::DurationError),
}

/// Flags of cluster access.
#[derive(Debug, Clone, ClapArgs)]
pub struct ClusterArgs {
    /// kubeconfig used to watch pods and nodes; in-cluster configuration when unset.
    #[arg(long, env = "PERCOLATOR_KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,
}

/// Where pod, container and node CPU and memory come from (`--resource-source`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum ResourceSource {
    /// Each node's kubelet `/metrics/resource`, as metrics-server reads it.
    #[default]
    Kubelet,
    /// PromQL over the series Prometheus already has (cAdvisor's `container_*`, the kubelet's
    /// `node_*`): the `resourceRules` of --adapter-config, else the `resourceQueries` of
    /// --config; no kubelet connection at all.
    Prometheus,
}

impl std::fmt::Display for ResourceSource {
    /// The flag's spelling (`kubelet`, `prometheus`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kubelet => "kubelet",
            Self::Prometheus => "prometheus",
        })
    }
}

/// Flags of kubelet scraping.
#[derive(Debug, Clone, ClapArgs)]
pub struct KubeletArgs {
    /// Where pod, container and node CPU and memory come from, for metrics.k8s.io and
    /// PodMetricsSummary alike: `kubelet` (each node's /metrics/resource) or `prometheus` (the
    /// resourceRules of --adapter-config, else the resourceQueries of --config; the --kubelet-*
    /// flags are then unused). Default: `prometheus` when the --adapter-config file has
    /// resourceRules at start (they mean Prometheus serves metrics.k8s.io, as in
    /// prometheus-adapter), `kubelet` otherwise. Decided at start: a reload that adds or
    /// removes resourceRules does not switch it.
    // `None` when neither the flag nor its variable is given: no clap default, so that
    // "given explicitly" is known; the server resolves it once the adapter file is read.
    #[arg(long, value_enum, env = "PERCOLATOR_RESOURCE_SOURCE")]
    pub resource_source: Option<ResourceSource>,
    /// Port of the kubelets' HTTPS endpoint.
    #[arg(long, default_value_t = 10250, env = "PERCOLATOR_KUBELET_PORT")]
    pub kubelet_port: u16,
    /// Use the port in node.status.daemonEndpoints.kubeletEndpoint instead of --kubelet-port.
    #[arg(long, env = "PERCOLATOR_KUBELET_USE_NODE_STATUS_PORT")]
    pub kubelet_use_node_status_port: bool,
    /// Do not verify the kubelets' serving certificates (for clusters with self-signed kubelet
    /// certificates; prefer --kubelet-certificate-authority).
    #[arg(long, env = "PERCOLATOR_KUBELET_INSECURE_TLS")]
    pub kubelet_insecure_tls: bool,
    /// CA bundle (PEM) that signs the kubelets' serving certificates; the cluster CA of the
    /// kubeconfig when unset.
    #[arg(long, env = "PERCOLATOR_KUBELET_CERTIFICATE_AUTHORITY")]
    pub kubelet_certificate_authority: Option<PathBuf>,
    /// Node address types to try, in order.
    #[arg(
        long,
        default_value = "Hostname,InternalDNS,InternalIP,ExternalDNS,ExternalIP",
        env = "PERCOLATOR_KUBELET_PREFERRED_ADDRESS_TYPES"
    )]
    pub kubelet_preferred_address_types: Vec<String>,
    /// Timeout of one kubelet request (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_KUBELET_REQUEST_TIMEOUT")]
    pub kubelet_request_timeout: Duration,
    /// Keep each kubelet's connection open between fetches (true), or close it after each
    /// fetch (false): an idle TLS connection holds about 16 KiB per node, while closing
    /// costs one TCP and TLS handshake per node per refresh (more CPU, and a few round trips
    /// on a real network).
    #[arg(long, default_value_t = true, env = "PERCOLATOR_KUBELET_REUSE_CONNECTIONS")]
    pub kubelet_reuse_connections: bool,
    /// The widest window a CPU rate from kubelet samples may span (e.g. 60s): two samples
    /// further apart give no CPU (the answer's Warning says when it will be there) rather than
    /// an average over an idle period. It must exceed the kubelets' housekeeping period
    /// (10–15s) plus the sampling interval (--cache-ttl, at most a third of this window).
    #[arg(long, default_value = "60s", value_parser = parse_rate_window, env = "PERCOLATOR_MAX_RATE_WINDOW")]
    pub max_rate_window: Duration,
    /// How long nodes are still sampled in the background after a request last needed their
    /// kubelet data (e.g. 5m), so CPU rates stay current between requests; after that an idle
    /// percolator makes no kubelet requests. 0s: no background sampling (fetched on demand).
    #[arg(long, default_value = "5m", value_parser = duration::parse, env = "PERCOLATOR_IDLE_AFTER")]
    pub idle_after: Duration,
}

/// Flags of the Prometheus HTTP API. Its `Debug` leaves out a password in the URL and the
/// header values.
#[derive(Clone, ClapArgs)]
pub struct PrometheusArgs {
    /// Base URL of the Prometheus HTTP API.
    #[arg(long, default_value = "http://localhost:9090", env = "PERCOLATOR_PROMETHEUS_URL")]
    pub prometheus_url: url::Url,
    /// Timeout of one PromQL query (e.g. 10s).
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_PROMETHEUS_TIMEOUT")]
    pub prometheus_timeout: Duration,
    /// CA bundle (PEM) that signs Prometheus' serving certificate; only these CAs are trusted
    /// then (the system's otherwise). Re-read when it changes.
    #[arg(long, env = "PERCOLATOR_PROMETHEUS_CA_FILE")]
    pub prometheus_ca_file: Option<PathBuf>,
    /// Client certificate (PEM) to present to Prometheus; with
    /// --prometheus-client-tls-key-file. Re-read when it changes.
    #[arg(
        long,
        requires = "prometheus_client_tls_key_file",
        env = "PERCOLATOR_PROMETHEUS_CLIENT_TLS_CERT_FILE"
    )]
    pub prometheus_client_tls_cert_file: Option<PathBuf>,
    /// Private key (PEM) of --prometheus-client-tls-cert-file.
    #[arg(
        long,
        requires = "prometheus_client_tls_cert_file",
        env = "PERCOLATOR_PROMETHEUS_CLIENT_TLS_KEY_FILE"
    )]
    pub prometheus_client_tls_key_file: Option<PathBuf>,
    /// Do not verify Prometheus' serving certificate (testing only; prefer
    /// --prometheus-ca-file).
    #[arg(long, env = "PERCOLATOR_PROMETHEUS_INSECURE_SKIP_TLS_VERIFY")]
    pub prometheus_insecure_skip_tls_verify: bool,
    /// File holding the bearer token sent to Prometheus (`Authorization: Bearer`), re-read when
    /// it changes (a projected ServiceAccount token rotates).
    #[arg(long, env = "PERCOLATOR_PROMETHEUS_TOKEN_FILE")]
    pub prometheus_token_file: Option<PathBuf>,
    /// File holding the user name of HTTP basic authentication to Prometheus; with
    /// --prometheus-basic-auth-password-file. Re-read when it changes.
    #[arg(
        long,
        requires = "prometheus_basic_auth_password_file",
        conflicts_with = "prometheus_token_file",
        env = "PERCOLATOR_PROMETHEUS_BASIC_AUTH_USERNAME_FILE"
    )]
    pub prometheus_basic_auth_username_file: Option<PathBuf>,
    /// File holding the password of HTTP basic authentication to Prometheus. Re-read when it
    /// changes.
    #[arg(
        long,
        requires = "prometheus_basic_auth_username_file",
        env = "PERCOLATOR_PROMETHEUS_BASIC_AUTH_PASSWORD_FILE"
    )]
    pub prometheus_basic_auth_password_file: Option<PathBuf>,
    /// A header sent with every request to Prometheus, as NAME=VALUE (e.g.
    /// X-Scope-OrgID=tenant-a for Mimir, Cortex or Loki-style tenants). Repeat the flag for
    /// more headers; in PERCOLATOR_PROMETHEUS_HEADER, one NAME=VALUE per line (newline-separated,
    /// not comma-separated: a value may hold commas; no empty line). Values are never logged.
    #[arg(
        long = "prometheus-header",
        value_name = "NAME=VALUE",
        value_parser = HeaderParser,
        value_delimiter = '\n',
        env = "PERCOLATOR_PROMETHEUS_HEADER"
    )]
    pub prometheus_headers: Vec<PrometheusHeader>,
    /// Largest Prometheus answer read, in bytes (a quantity: 64Mi, 1Gi); a larger one is
    /// aborted while it streams in and the fields it would fill are omitted with a Warning.
    #[arg(long, default_value = "128Mi", value_parser = parse_byte_size, env = "PERCOLATOR_PROMETHEUS_MAX_RESPONSE_BYTES")]
    pub prometheus_max_response_bytes: u64,
}

impl std::fmt::Debug for PrometheusArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut url = self.prometheus_url.clone();
        if url.password().is_some() {
            let _ = url.set_password(Some("REDACTED"));
        }
        f.debug_struct("PrometheusArgs")
            .field("prometheus_url", &url.as_str())
            .field("prometheus_timeout", &self.prometheus_timeout)
            .field("prometheus_ca_file", &self.prometheus_ca_file)
            .field("prometheus_client_tls_cert_file", &self.prometheus_client_tls_cert_file)
            .field("prometheus_client_tls_key_file", &self.prometheus_client_tls_key_file)
            .field("prometheus_insecure_skip_tls_verify", &self.prometheus_insecure_skip_tls_verify)
            .field("prometheus_token_file", &self.prometheus_token_file)
            .field("prometheus_basic_auth_username_file", &self.prometheus_basic_auth_username_file)
            .field("prometheus_basic_auth_password_file", &self.prometheus_basic_auth_password_file)
            .field("prometheus_headers", &self.prometheus_headers)
            .field("prometheus_max_response_bytes", &self.prometheus_max_response_bytes)
            .finish()
    }
}

/// One `--prometheus-header NAME=VALUE`; its `Debug` leaves the value out (it may be a secret).
pub type PrometheusHeader = apiserver::HeaderArg;

/// Flags of the query configuration file.
#[derive(Debug, Clone, ClapArgs)]
pub struct QueryArgs {
    /// Range the Prometheus rates are computed over (e.g. 5m); overrides the file's `window`.
    #[arg(long, value_parser = duration::parse, env = "PERCOLATOR_WINDOW")]
    pub window: Option<Duration>,
    /// YAML file with the PromQL of each field and the external metrics; compiled-in defaults
    /// when unset. Reloaded when it changes.
    #[arg(long, env = "PERCOLATOR_CONFIG")]
    pub config: Option<PathBuf>,
}

/// Flags of a prometheus-adapter configuration (`--adapter-config`), named as the adapter
/// names them.
#[derive(Debug, Clone, ClapArgs)]
pub struct AdapterArgs {
    /// A prometheus-adapter configuration file (rules, externalRules, resourceRules), read as
    /// the adapter reads it and served beside --config's metrics: rules with
    /// --enable-custom-metrics, externalRules with --enable-external-metrics, resourceRules as
    /// the CPU and memory queries (with --enable-resource-metrics for metrics.k8s.io; present
    /// at start, they make `prometheus` the default --resource-source). Reloaded when it
    /// changes.
    #[arg(long, env = "PERCOLATOR_ADAPTER_CONFIG")]
    pub adapter_config: Option<PathBuf>,
    /// How often the series of the adapter configuration's rules are listed again (the
    /// adapter's flag and default).
    #[arg(long, default_value = "10m", value_parser = parse_positive_duration, env = "PERCOLATOR_METRICS_RELIST_INTERVAL")]
    pub metrics_relist_interval: Duration,
    /// How far back series are listed (the adapter's flag; --metrics-relist-interval when
    /// unset, and never less).
    #[arg(long, value_parser = parse_positive_duration, env = "PERCOLATOR_METRICS_MAX_AGE")]
    pub metrics_max_age: Option<Duration>,
}

/// Flags of caching: one TTL for every cache of computed results (served objects, external
/// metric values, kubelet samples per node), all built by [`apiserver::TtlCache`].
#[derive(Debug, Clone, ClapArgs)]
pub struct CacheArgs {
    /// How long computed objects, external metric values and kubelet samples are cached
    /// (e.g. 15s).
    #[arg(long, default_value = "15s", value_parser = duration::parse, env = "PERCOLATOR_CACHE_TTL")]
    pub cache_ttl: Duration,
}

/// Flags of the external metrics API (`external.metrics.k8s.io/v1beta1`).
#[derive(Debug, Clone, ClapArgs)]
pub struct MetricApisArgs {
    /// Serve and advertise external.metrics.k8s.io/v1beta1 (HPA external metrics) with the
    /// `externalMetrics` of --config. Only one server per cluster may own that group (KEDA and
    /// prometheus-adapter claim it too), so it is off by default.
    #[arg(long, env = "PERCOLATOR_ENABLE_EXTERNAL_METRICS")]
    pub enable_external_metrics: bool,
    /// Serve and advertise custom.metrics.k8s.io v1beta2 and v1beta1 (HPA Pods and Object
    /// metrics) with the `customMetrics` of --config. Only one server per cluster may own that
    /// group (prometheus-adapter claims it too), so it is off by default.
    #[arg(long, env = "PERCOLATOR_ENABLE_CUSTOM_METRICS")]
    pub enable_custom_metrics: bool,
    /// Serve and advertise metrics.k8s.io/v1beta1 (PodMetrics, NodeMetrics: `kubectl top`, the
    /// HPA's Resource metrics) from the kubelet samples the other kinds use, in place of
    /// metrics-server. Only one server per cluster may own that group, so it is off by default.
    #[arg(long, env = "PERCOLATOR_ENABLE_RESOURCE_METRICS")]
    pub enable_resource_metrics: bool,
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory;

    fn parse(args: &[&str]) -> Args {
        Args::try_parse_from(std::iter::once("percolator").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn flags_are_consistent() {
        Args::command().debug_assert();
    }

    /// Every flag can be set from `PERCOLATOR_<FLAG>` (upper case, dashes to underscores), as
    /// the README promises: the generic server's flags included (they get theirs from
    /// `flag_style`), and a variable spelled by hand that breaks the rule fails here. `-v` is
    /// `--v`, so `PERCOLATOR_V`.
    #[test]
    fn every_flag_has_its_environment_variable() {
        let mut command = Args::command();
        command.build();
        let mut checked = 0;
        for arg in command.get_arguments() {
            let id = arg.get_id().as_str();
            if id == "help" || id == "version" {
                continue;
            }
            let long = arg.get_long().unwrap_or_else(|| panic!("{id} has no long name"));
            let expected = format!("PERCOLATOR_{}", long.to_uppercase().replace('-', "_"));
            assert_eq!(
                arg.get_env().and_then(|e| e.to_str()),
                Some(expected.as_str()),
                "--{long} needs env = \"{expected}\""
            );
            checked += 1;
        }
        assert!(checked > 50, "only {checked} flags walked");
    }

    #[test]
    fn defaults_parse() {
        let args = parse(&[]);
        assert_eq!(args.cache.cache_ttl, Duration::from_secs(15));
        assert_eq!(args.serving.http2_max_streams_per_connection, 1000);
        assert_eq!(args.serving.max_requests_inflight, 400);
        assert_eq!(args.serving.request_timeout, Duration::from_secs(60));
        assert_eq!(args.serving.shutdown_delay_duration, Duration::from_secs(5));
        assert_eq!(args.serving.tls_reload_interval, Duration::from_secs(10));
        assert_eq!(args.kubelet.kubelet_preferred_address_types[0], "Hostname");
        assert!(!args.metric_apis.enable_external_metrics);
        assert!(parse(&["--enable-external-metrics"]).metric_apis.enable_external_metrics);
    }

    #[test]
    fn prometheus_connection_flags() {
        let a = parse(&[
            "--prometheus-header",
            "X-Scope-OrgID=tenant-a",
            "--prometheus-header=X-Extra= a,b=c ",
            "--prometheus-max-response-bytes=64Mi",
            "--prometheus-insecure-skip-tls-verify",
        ])
        .prometheus;
        let headers: Vec<_> =
            a.prometheus_headers.iter().map(|h| (h.name.as_str(), h.value.to_str().unwrap())).collect();
        assert_eq!(headers, [("x-scope-orgid", "tenant-a"), ("x-extra", "a,b=c")]);
        assert!(a.prometheus_headers.iter().all(|h| h.value.is_sensitive()));
        assert_eq!(format!("{:?}", a.prometheus_headers[0]), "x-scope-orgid=<redacted>");
        let with_password =
            parse(&["--prometheus-url=https://u:pw-SECRET@p:9090", "--prometheus-header=A=h-SECRET"]);
        let debug = format!("{with_password:?}");
        assert!(!debug.contains("SECRET") && debug.contains("https://u:REDACTED@p:9090/"), "{debug}");
        assert_eq!(a.prometheus_max_response_bytes, 64 << 20);
        assert!(a.prometheus_insecure_skip_tls_verify);
        assert_eq!(parse(&[]).prometheus.prometheus_max_response_bytes, 128 << 20);
        assert_eq!(
            parse(&["--prometheus-max-response-bytes=1G"]).prometheus.prometheus_max_response_bytes,
            1_000_000_000
        );

        let error = |args: &[&str]| {
            Args::try_parse_from(std::iter::once("percolator").chain(args.iter().copied()))
                .unwrap_err()
                .to_string()
        };
        // A bad header is named, its value never shown.
        let message = error(&["--prometheus-header", "Authorization: Bearer eyJsecret"]);
        assert_eq!(
            message,
            "error: invalid value for --prometheus-header (not shown: it may be a secret): expected NAME=VALUE\n"
        );
        let message = error(&["--prometheus-header", "X-A=eyJsecret\rmore"]);
        assert!(!message.contains("eyJsecret"), "{message}");
        // One header per line (PERCOLATOR_PROMETHEUS_HEADER's form; clap splits the variable
        // and the flag's value alike): commas stay in the value.
        let lines = parse(&["--prometheus-header", "X-Scope-OrgID=a,b\r\nX-Extra=c"]).prometheus;
        let headers: Vec<_> =
            lines.prometheus_headers.iter().map(|h| (h.name.as_str(), h.value.to_str().unwrap())).collect();
        assert_eq!(headers, [("x-scope-orgid", "a,b"), ("x-extra", "c")]);
        // An explicit false does not conflict with a CA file.
        let a =
            parse(&["--prometheus-ca-file=ca.crt", "--prometheus-insecure-skip-tls-verify=false"]).prometheus;
        assert!(!a.prometheus_insecure_skip_tls_verify);
        for (args, needle) in [
            (&["--prometheus-header", "X-Scope-OrgID"][..], "expected NAME=VALUE"),
            (&["--prometheus-header", "Bad Name=x"], "\"Bad Name\" is not a valid header name"),
            (&["--prometheus-header", "Host=evil"], "header host is set by the HTTP client"),
            (&["--prometheus-header", "X-A=line\rbreak"], "the value of header x-a has characters"),
            (&["--prometheus-header", "X-A=a\n"], "an empty header: give one NAME=VALUE per line"),
            (&["--prometheus-max-response-bytes=0"], "\"0\" is not a whole number of bytes above 0"),
            (&["--prometheus-max-response-bytes=1.5"], "\"1.5\" is not a whole number of bytes above 0"),
            (&["--prometheus-max-response-bytes=lots"], "--prometheus-max-response-bytes"),
            (&["--prometheus-client-tls-cert-file=c"], "--prometheus-client-tls-key-file"),
            (&["--prometheus-basic-auth-username-file=u"], "--prometheus-basic-auth-password-file"),
            (
                &[
                    "--prometheus-token-file=t",
                    "--prometheus-basic-auth-username-file=u",
                    "--prometheus-basic-auth-password-file=p",
                ],
                "cannot be used with",
            ),
        ] {
            let message = error(args);
            assert!(message.contains(needle), "{args:?}: {message}");
        }
    }

    #[test]
    fn bad_flags_are_named() {
        let err = Args::try_parse_from(["percolator", "--cache-ttl", "fast"]).unwrap_err().to_string();
        assert!(err.contains("--cache-ttl"), "{err}");
        let err = Args::try_parse_from(["percolator", "--request-timeout", "0s"]).unwrap_err().to_string();
        assert!(err.contains("--request-timeout") && err.contains("greater than 0"), "{err}");
        let err = Args::try_parse_from(["percolator", "--tls-cert-file", "x"]).unwrap_err().to_string();
        assert!(err.contains("--tls-private-key-file"), "{err}");
    }

    #[test]
    fn auth_defaults() {
        let a = parse(&[]).auth;
        assert!(a.anonymous_auth);
        assert!(!a.authentication_skip_lookup);
        assert!(!a.authentication_tolerate_lookup_failure);
        assert_eq!(a.requestheader_username_headers, ["X-Remote-User"]);
        assert_eq!(a.requestheader_group_headers, ["X-Remote-Group"]);
        assert_eq!(a.requestheader_extra_headers_prefix, ["X-Remote-Extra-"]);
        assert_eq!(a.requestheader_uid_headers, ["X-Remote-Uid"]);
        assert!(a.requestheader_allowed_names.is_empty());
        assert_eq!(a.authorization_always_allow_paths, ["/healthz", "/readyz", "/livez"]);
        assert_eq!(a.authorization_always_allow_groups, ["system:masters"]);
        assert_eq!(a.authentication_token_webhook_cache_ttl, Duration::from_secs(10));
        assert_eq!(a.authorization_webhook_cache_authorized_ttl, Duration::from_secs(10));
        assert_eq!(a.authorization_webhook_cache_unauthorized_ttl, Duration::from_secs(10));
    }

    #[test]
    fn auth_booleans_take_an_optional_value() {
        assert!(!parse(&["--anonymous-auth=false"]).auth.anonymous_auth);
        assert!(parse(&["--anonymous-auth"]).auth.anonymous_auth);
        assert!(parse(&["--authentication-skip-lookup"]).auth.authentication_skip_lookup);
        assert!(!parse(&["--authentication-skip-lookup=false"]).auth.authentication_skip_lookup);
        // Every boolean flag reads so, as in Go.
        assert!(parse(&["--kubelet-insecure-tls"]).kubelet.kubelet_insecure_tls);
        // No default: whether it was given is known (the server resolves it).
        assert_eq!(parse(&[]).kubelet.resource_source, None);
        assert_eq!(
            parse(&["--resource-source", "prometheus"]).kubelet.resource_source,
            Some(ResourceSource::Prometheus)
        );
        assert_eq!(
            parse(&["--resource-source=kubelet"]).kubelet.resource_source,
            Some(ResourceSource::Kubelet)
        );
        let help = Args::command().render_long_help().to_string();
        assert!(
            help.contains("Default: `prometheus` when the --adapter-config file has resourceRules")
                && help.contains("PERCOLATOR_RESOURCE_SOURCE"),
            "{help}"
        );
        let error =
            Args::try_parse_from(["percolator", "--resource-source=cadvisor"]).unwrap_err().to_string();
        assert!(error.contains("--resource-source") && error.contains("kubelet, prometheus"), "{error}");
        assert!(!parse(&["--kubelet-insecure-tls=false"]).kubelet.kubelet_insecure_tls);
        assert!(!parse(&[]).kubelet.kubelet_insecure_tls);
        assert!(parse(&[]).kubelet.kubelet_reuse_connections);
        assert!(!parse(&["--kubelet-reuse-connections=false"]).kubelet.kubelet_reuse_connections);
        assert!(parse(&["--kubelet-reuse-connections"]).kubelet.kubelet_reuse_connections);
        assert!(parse(&["--enable-external-metrics=true"]).metric_apis.enable_external_metrics);
        let err = Args::try_parse_from(["p", "--kubelet-insecure-tls", "false"]).unwrap_err().to_string();
        assert!(err.contains("false"), "a following argument is not the flag's value: {err}");
        assert!(
            parse(&["--authentication-tolerate-lookup-failure=true"])
                .auth
                .authentication_tolerate_lookup_failure
        );
    }

    #[test]
    fn auth_lists_and_durations() {
        let a = parse(&[
            "--requestheader-allowed-names=front-proxy-client,aggregator",
            "--authorization-always-allow-paths=/healthz,/metrics*",
            "--authorization-always-allow-groups=",
            "--authorization-webhook-cache-authorized-ttl=5m",
        ])
        .auth;
        assert_eq!(a.requestheader_allowed_names, ["front-proxy-client", "aggregator"]);
        assert_eq!(a.authorization_always_allow_paths, ["/healthz", "/metrics*"]);
        assert_eq!(a.authorization_always_allow_groups, [""]);
        let kubelet = parse(&["--kubelet-preferred-address-types=InternalIP,Hostname"]).kubelet;
        assert_eq!(kubelet.kubelet_preferred_address_types, ["InternalIP", "Hostname"]);
        assert_eq!(a.authorization_webhook_cache_authorized_ttl, Duration::from_secs(300));
        let err = Args::try_parse_from(["p", "--authentication-token-webhook-cache-ttl=soon"]).unwrap_err();
        assert!(err.to_string().contains("--authentication-token-webhook-cache-ttl"), "{err}");
    }
}
