//! Authorization (CONTRACT §5.4): `union(always-allow groups, always-allow paths, webhook)`.
//! Members of an always-allow group (`system:masters`) and non-resource requests for an
//! always-allow path are allowed without a call; everything else is a SubjectAccessReview,
//! cached by the spec's attributes (see [`decision_key`]): allowed answers for the authorized TTL, others for the
//! unauthorized TTL, concurrent identical misses sharing one call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, ResourceAttributes, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use moka::Expiry;
use moka::future::Cache;

use super::UserInfo;
use super::review::{AccessReviewer, ReviewError};
use crate::k8s::request_info::RequestInfo;

/// SubjectAccessReview results kept at most (`NewLRUExpireCache(8192)` in the webhook).
const MAX_DECISIONS: u64 = 8192;
/// Requests whose attributes are this long or longer are not cached (`shouldCache`).
const MAX_CACHEABLE_ATTRIBUTES: usize = 10_000;

/// A malformed `--authorization-always-allow-paths` entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("--authorization-always-allow-paths: only trailing * allowed in {0:?}")]
pub struct PathPatternError(pub String);

/// `--authorization-always-allow-paths` (`apiserver/pkg/authorization/path`): matched against
/// the path without its leading `/`, exactly, or as a prefix for entries ending in `*`.
#[derive(Debug, Clone, Default)]
pub struct AlwaysAllowPaths {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllowPaths {
    /// Parses the flag's entries.
    pub fn new(patterns: &[String]) -> Result<Self, PathPatternError> {
        let mut paths = Self::default();
        for pattern in patterns {
            let p = pattern.strip_prefix('/').unwrap_or(pattern);
            match p.strip_suffix('*') {
                _ if p.is_empty() => paths.exact.push(String::new()),
                Some(prefix) if !prefix.contains('*') => paths.prefixes.push(prefix.to_owned()),
                None if !p.contains('*') => paths.exact.push(p.to_owned()),
                _ => return Err(PathPatternError(pattern.clone())),
            }
        }
        Ok(paths)
    }

    /// Whether `path` is always allowed.
    pub fn matches(&self, path: &str) -> bool {
        let p = path.strip_prefix('/').unwrap_or(path);
        self.exact.iter().any(|e| e == p) || self.prefixes.iter().any(|prefix| p.starts_with(prefix.as_str()))
    }
}

/// What the authorizer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Go on.
    Allow,
    /// 403, with the authorizer's reason (possibly empty).
    Forbid(String),
}

/// The authorizer chain with its cache.
pub struct Authorizer {
    reviewer: Arc<dyn AccessReviewer>,
    cache: Cache<Vec<u8>, Arc<SubjectAccessReviewStatus>>,
    groups: Vec<String>,
    paths: AlwaysAllowPaths,
}

/// Expiry by outcome: allowed entries live for one TTL, the others for another.
struct ByOutcome {
    allowed: Duration,
    denied: Duration,
}

impl Expiry<Vec<u8>, Arc<SubjectAccessReviewStatus>> for ByOutcome {
    fn expire_after_create(
        &self,
        _key: &Vec<u8>,
        value: &Arc<SubjectAccessReviewStatus>,
        _created_at: Instant,
    ) -> Option<Duration> {
        Some(if value.allowed { self.allowed } else { self.denied })
    }
}

impl Authorizer {
    /// Builds the chain.
    pub fn new(
        reviewer: Arc<dyn AccessReviewer>,
        groups: Vec<String>,
        paths: AlwaysAllowPaths,
        authorized_ttl: Duration,
        unauthorized_ttl: Duration,
    ) -> Self {
        let cache = Cache::builder()
            .max_capacity(MAX_DECISIONS)
            .expire_after(ByOutcome { allowed: authorized_ttl, denied: unauthorized_ttl })
            .build();
        Self { reviewer, cache, groups, paths }
    }

    /// Decides on `info` for `user`. `path` is the decoded URL path. An error means the
    /// review could not be made (the caller answers 500).
    pub async fn authorize(
        &self,
        user: &UserInfo,
        info: &RequestInfo,
        path: &str,
    ) -> Result<Decision, String> {
        if user.groups.iter().any(|g| self.groups.contains(g)) {
            return Ok(Decision::Allow);
        }
        if !info.is_resource_request && self.paths.matches(path) {
            return Ok(Decision::Allow);
        }
        let status = if should_cache(info, path) {
            self.cache
                .try_get_with(decision_key(user, info, path), async {
                    self.reviewer.review(review_spec(user, info, path)).await.map(Arc::new)
                })
                .await
                .map_err(|e: Arc<ReviewError>| format!("SubjectAccessReview failed: {e}"))?
        } else {
            let spec = review_spec(user, info, path);
            Arc::new(
                self.reviewer.review(spec).await.map_err(|e| format!("SubjectAccessReview failed: {e}"))?,
            )
        };
        let reason = status.reason.clone().unwrap_or_default();
        match (status.allowed, status.denied == Some(true)) {
            (true, true) => {
                Err("webhook subject access review returned both allow and deny response".to_owned())
            }
            (true, false) => Ok(Decision::Allow),
            (false, _) => Ok(Decision::Forbid(reason)),
        }
    }
}

/// The decision cache's key: every attribute the review's spec is made of, each
/// length-prefixed, so two requests share a key exactly when they would send the same
/// SubjectAccessReview (k8s.io/apiserver keys by the JSON-serialized spec, which is the same
/// equivalence at the cost of a serialization per request).
fn decision_key(user: &UserInfo, info: &RequestInfo, path: &str) -> Vec<u8> {
    fn push(key: &mut Vec<u8>, s: &str) {
        key.extend_from_slice(&s.len().to_le_bytes());
        key.extend_from_slice(s.as_bytes());
    }
    let mut key = Vec::with_capacity(256);
    push(&mut key, &user.name);
    push(&mut key, &user.uid);
    key.extend_from_slice(&user.groups.len().to_le_bytes());
    for group in &user.groups {
        push(&mut key, group);
    }
    key.extend_from_slice(&user.extra.len().to_le_bytes());
    for (name, values) in &user.extra {
        push(&mut key, name);
        key.extend_from_slice(&values.len().to_le_bytes());
        for value in values {
            push(&mut key, value);
        }
    }
    if info.is_resource_request {
        key.push(b'r');
        for attribute in resource_attributes(info) {
            push(&mut key, attribute);
        }
    } else {
        key.push(b'n');
        push(&mut key, path);
        push(&mut key, &info.verb);
    }
    key
}

/// The attributes of a resource request a review carries.
fn resource_attributes(info: &RequestInfo) -> [&str; 7] {
    [
        &info.namespace,
        &info.verb,
        &info.api_group,
        &info.api_version,
        &info.resource,
        &info.subresource,
        &info.name,
    ]
}

/// `shouldCache`: the attributes together are shorter than 10000 bytes.
fn should_cache(info: &RequestInfo, path: &str) -> bool {
    let total = resource_attributes(info).iter().map(|s| s.len()).sum::<usize>() + path.len();
    total < MAX_CACHEABLE_ATTRIBUTES
}

fn some(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The review's spec, with Go's `omitempty` (empty strings and lists left out).
pub fn review_spec(user: &UserInfo, info: &RequestInfo, path: &str) -> SubjectAccessReviewSpec {
    let (resource_attributes, non_resource_attributes) = if info.is_resource_request {
        let attributes = ResourceAttributes {
            namespace: some(&info.namespace),
            verb: some(&info.verb),
            group: some(&info.api_group),
            version: some(&info.api_version),
            resource: some(&info.resource),
            subresource: some(&info.subresource),
            name: some(&info.name),
            ..ResourceAttributes::default()
        };
        (Some(attributes), None)
    } else {
        (None, Some(NonResourceAttributes { path: some(path), verb: some(&info.verb) }))
    };
    SubjectAccessReviewSpec {
        user: some(&user.name),
        uid: some(&user.uid),
        groups: (!user.groups.is_empty()).then(|| user.groups.clone()),
        extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
        resource_attributes,
        non_resource_attributes,
    }
}

/// The text after `is forbidden: ` (`responsewriters.forbiddenMessage`, HTML-escaped, then
/// `: <reason>` when the authorizer gave one).
pub fn forbidden_reason(user: &UserInfo, info: &RequestInfo, path: &str, reason: &str) -> String {
    use crate::k8s::status::go_quote;
    let message = if !info.is_resource_request {
        format!("User {} cannot {} path {}", go_quote(&user.name), info.verb, go_quote(path))
    } else {
        let mut resource = info.resource.clone();
        if !info.subresource.is_empty() {
            resource = format!("{resource}/{}", info.subresource);
        }
        let scope = if info.namespace.is_empty() {
            "at the cluster scope".to_owned()
        } else {
            format!("in the namespace {}", go_quote(&info.namespace))
        };
        format!(
            "User {} cannot {} resource {} in API group {} {scope}",
            go_quote(&user.name),
            info.verb,
            go_quote(&resource),
            go_quote(&info.api_group),
        )
    };
    let message = message.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;");
    if reason.is_empty() { message } else { format!("{message}: {reason}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn paths(p: &[&str]) -> AlwaysAllowPaths {
        AlwaysAllowPaths::new(&p.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap()
    }

    #[test]
    fn always_allow_paths_match_exactly_or_by_trailing_star() {
        let p = paths(&["/healthz", "/readyz", "/livez"]);
        assert!(p.matches("/healthz"));
        assert!(p.matches("/livez"));
        assert!(!p.matches("/livez/ping"));
        assert!(!p.matches("/healthz/"));
        assert!(!p.matches("/"));
        let p = paths(&["/metrics*", "/"]);
        assert!(p.matches("/metrics"));
        assert!(p.matches("/metrics/extra"));
        assert!(p.matches("/"));
        assert!(!p.matches("/healthz"));
        let err = AlwaysAllowPaths::new(&["/a*b".to_string()]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "--authorization-always-allow-paths: only trailing * allowed in \"/a*b\""
        );
    }

    #[test]
    fn spec_omits_empty_fields() {
        let user = UserInfo {
            name: "bob".into(),
            groups: vec!["system:authenticated".into()],
            ..Default::default()
        };
        let info = RequestInfo::new(&http::Method::GET, "/apis/g/v/widgets", None).unwrap();
        let spec = review_spec(&user, &info, "/apis/g/v/widgets");
        assert_eq!(
            serde_json::to_value(&spec).unwrap(),
            serde_json::json!({
                "user": "bob", "groups": ["system:authenticated"],
                "resourceAttributes": {"verb": "list", "group": "g", "version": "v", "resource": "widgets"}
            })
        );
        let info = RequestInfo::new(&http::Method::GET, "/openapi/v2", None).unwrap();
        let spec = review_spec(&user, &info, "/openapi/v2");
        assert_eq!(
            serde_json::to_value(&spec).unwrap()["nonResourceAttributes"],
            serde_json::json!({"path": "/openapi/v2", "verb": "get"})
        );
    }

    #[test]
    fn decision_keys_are_equal_exactly_when_the_reviews_are() {
        let user = |name: &str, groups: &[&str]| UserInfo {
            name: name.into(),
            groups: groups.iter().map(|g| g.to_string()).collect(),
            ..Default::default()
        };
        let info = |path: &str| RequestInfo::new(&http::Method::GET, path, None).unwrap();
        let key = |u: &UserInfo, path: &str| decision_key(u, &info(path), path);
        let spec =
            |u: &UserInfo, path: &str| serde_json::to_string(&review_spec(u, &info(path), path)).unwrap();
        let cases = [
            (user("bob", &["a", "b"]), "/apis/g/v/namespaces/ns/widgets/x"),
            (user("bob", &["ab"]), "/apis/g/v/namespaces/ns/widgets/x"),
            (user("bob", &["a", "b"]), "/apis/g/v/namespaces/nsw/idgets/x"),
            (user("bo", &["ba", "b"]), "/apis/g/v/namespaces/ns/widgets/x"),
            (user("bob", &["a", "b"]), "/apis/g/v/namespaces/ns/widgets"),
            (user("bob", &["a", "b"]), "/apis/g/v"),
            (user("bob", &["a", "b"]), "/apis/g/v/"),
            (user("bob", &[]), "/healthz"),
            (user("bob", &[]), "/healthz/"),
        ];
        for (u1, p1) in &cases {
            for (u2, p2) in &cases {
                assert_eq!(
                    key(u1, p1) == key(u2, p2),
                    spec(u1, p1) == spec(u2, p2),
                    "{u1:?} {p1} / {u2:?} {p2}"
                );
            }
        }
        let mut extra = user("bob", &[]);
        extra.extra.insert("k".into(), vec!["v1".into(), "v2".into()]);
        let mut other = user("bob", &[]);
        other.extra.insert("k".into(), vec!["v1v2".into()]);
        assert_ne!(key(&extra, "/apis"), key(&other, "/apis"));
    }

    #[test]
    fn forbidden_reason_escapes_html_but_not_the_reason() {
        let user = UserInfo { name: "<b>".into(), ..Default::default() };
        let info = RequestInfo::new(&http::Method::GET, "/x&y", None).unwrap();
        assert_eq!(
            forbidden_reason(&user, &info, "/x&y", "a<b"),
            "User \"&lt;b&gt;\" cannot get path \"/x&amp;y\": a<b"
        );
    }
}
