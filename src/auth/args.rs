//! Flags of delegated authentication and authorization, spelled as the generic Kubernetes API
//! server (`apiserver/pkg/server/options/authentication.go`, `authorization.go`) spells them.

use std::path::PathBuf;
use std::time::Duration;

use crate::duration;

/// Flags of delegated authentication (TokenReview, client certificates, the front proxy) and
/// authorization (SubjectAccessReview).
#[derive(Debug, Clone, clap::Args)]
pub struct AuthArgs {
    /// kubeconfig used to create TokenReviews and to read the ConfigMap
    /// kube-system/extension-apiserver-authentication; the cluster configuration (--kubeconfig
    /// or in-cluster) when unset.
    #[arg(long, env = "PERCOLATOR_AUTHENTICATION_KUBECONFIG")]
    pub authentication_kubeconfig: Option<PathBuf>,
    /// kubeconfig used to create SubjectAccessReviews; the cluster configuration (--kubeconfig
    /// or in-cluster) when unset.
    #[arg(long, env = "PERCOLATOR_AUTHORIZATION_KUBECONFIG")]
    pub authorization_kubeconfig: Option<PathBuf>,
    /// PEM bundle of the CAs that sign client certificates (user = CN, groups = O); read from
    /// the ConfigMap key client-ca-file when unset.
    #[arg(long, env = "PERCOLATOR_CLIENT_CA_FILE")]
    pub client_ca_file: Option<PathBuf>,
    /// PEM bundle of the CAs that sign the front proxy's (the aggregator's) client certificate.
    /// When unset, it and every other --requestheader-* setting come from the ConfigMap.
    #[arg(long, env = "PERCOLATOR_REQUESTHEADER_CLIENT_CA_FILE")]
    pub requestheader_client_ca_file: Option<PathBuf>,
    /// Common names allowed for the front proxy's certificate (comma-separated); empty allows
    /// any certificate signed by --requestheader-client-ca-file.
    #[arg(long, value_delimiter = ',', env = "PERCOLATOR_REQUESTHEADER_ALLOWED_NAMES")]
    pub requestheader_allowed_names: Vec<String>,
    /// Headers carrying the user name; the first non-empty one wins.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-User",
        env = "PERCOLATOR_REQUESTHEADER_USERNAME_HEADERS"
    )]
    pub requestheader_username_headers: Vec<String>,
    /// Headers carrying the groups; every value of every one is a group.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-Group",
        env = "PERCOLATOR_REQUESTHEADER_GROUP_HEADERS"
    )]
    pub requestheader_group_headers: Vec<String>,
    /// Prefixes of the headers carrying extra user attributes (the rest of the name is the key).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-Extra-",
        env = "PERCOLATOR_REQUESTHEADER_EXTRA_HEADERS_PREFIX"
    )]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Headers carrying the user's UID; the first non-empty one wins.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "X-Remote-Uid",
        env = "PERCOLATOR_REQUESTHEADER_UID_HEADERS"
    )]
    pub requestheader_uid_headers: Vec<String>,
    /// Do not read the ConfigMap kube-system/extension-apiserver-authentication: only the CA
    /// files given as flags are trusted.
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set,
        env = "PERCOLATOR_AUTHENTICATION_SKIP_LOOKUP"
    )]
    pub authentication_skip_lookup: bool,
    /// Start even when the ConfigMap kube-system/extension-apiserver-authentication cannot be
    /// read (requests may then all be treated as anonymous).
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = false,
        action = clap::ArgAction::Set,
        env = "PERCOLATOR_AUTHENTICATION_TOLERATE_LOOKUP_FAILURE"
    )]
    pub authentication_tolerate_lookup_failure: bool,
    /// Treat requests that no authenticator claims as user system:anonymous (group
    /// system:unauthenticated); with false they get a 401.
    #[arg(
        long,
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "true",
        default_value_t = true,
        action = clap::ArgAction::Set,
        env = "PERCOLATOR_ANONYMOUS_AUTH"
    )]
    pub anonymous_auth: bool,
    /// How long TokenReview results (authenticated or not) are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_AUTHENTICATION_TOKEN_WEBHOOK_CACHE_TTL")]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// How long allowed SubjectAccessReview results are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_AUTHORIZATION_WEBHOOK_CACHE_AUTHORIZED_TTL")]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long denied SubjectAccessReview results are cached.
    #[arg(long, default_value = "10s", value_parser = duration::parse, env = "PERCOLATOR_AUTHORIZATION_WEBHOOK_CACHE_UNAUTHORIZED_TTL")]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,
    /// Non-resource paths anyone may get without a SubjectAccessReview (comma-separated; exact
    /// match, a trailing * matches a prefix).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "/healthz,/readyz,/livez",
        env = "PERCOLATOR_AUTHORIZATION_ALWAYS_ALLOW_PATHS"
    )]
    pub authorization_always_allow_paths: Vec<String>,
    /// Groups whose members are allowed everything without a SubjectAccessReview
    /// (comma-separated).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "system:masters",
        env = "PERCOLATOR_AUTHORIZATION_ALWAYS_ALLOW_GROUPS"
    )]
    pub authorization_always_allow_groups: Vec<String>,
}

/// Drops empty entries (`--flag=` gives one empty string).
pub(crate) fn non_empty(values: &[String]) -> Vec<String> {
    values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()).map(str::to_owned).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{CommandFactory, Parser};

    #[derive(Debug, Parser)]
    struct Wrapper {
        #[command(flatten)]
        auth: AuthArgs,
    }

    fn parse(args: &[&str]) -> AuthArgs {
        Wrapper::try_parse_from(std::iter::once("percolator").chain(args.iter().copied())).unwrap().auth
    }

    #[test]
    fn flags_are_consistent() {
        Wrapper::command().debug_assert();
    }

    #[test]
    fn defaults() {
        let a = parse(&[]);
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
    fn booleans_take_an_optional_value() {
        assert!(!parse(&["--anonymous-auth=false"]).anonymous_auth);
        assert!(parse(&["--anonymous-auth"]).anonymous_auth);
        assert!(parse(&["--authentication-skip-lookup"]).authentication_skip_lookup);
        assert!(!parse(&["--authentication-skip-lookup=false"]).authentication_skip_lookup);
        assert!(
            parse(&["--authentication-tolerate-lookup-failure=true"]).authentication_tolerate_lookup_failure
        );
    }

    #[test]
    fn lists_and_durations() {
        let a = parse(&[
            "--requestheader-allowed-names=front-proxy-client,aggregator",
            "--authorization-always-allow-paths=/healthz,/metrics*",
            "--authorization-always-allow-groups=",
            "--authorization-webhook-cache-authorized-ttl=5m",
        ]);
        assert_eq!(a.requestheader_allowed_names, ["front-proxy-client", "aggregator"]);
        assert_eq!(a.authorization_always_allow_paths, ["/healthz", "/metrics*"]);
        assert!(non_empty(&a.authorization_always_allow_groups).is_empty());
        assert_eq!(a.authorization_webhook_cache_authorized_ttl, Duration::from_secs(300));
        let err =
            Wrapper::try_parse_from(["p", "--authentication-token-webhook-cache-ttl=soon"]).unwrap_err();
        assert!(err.to_string().contains("--authentication-token-webhook-cache-ttl"), "{err}");
    }
}
