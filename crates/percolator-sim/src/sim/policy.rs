//! Who is who and who may do what in the simulated cluster: bearer tokens for TokenReview
//! and RBAC-like rules for SubjectAccessReview (docs/wire.md, "Delegated authentication and authorization").
//!
//! The built-in policy ([`DEFAULT_POLICY`]) can be replaced with `--policy FILE`, a YAML
//! document of this form (every list may be omitted; unknown keys are errors):
//!
//! ```yaml
//! tokens:
//! - token: alice-token          # the bearer token (unique, non-empty)
//!   username: alice             # status.user.username
//!   uid: "1001"                 # optional; default: a UUID derived from the username
//!   groups: [devs]              # system:authenticated is always added
//!   audiences: []               # optional; default: the API audience
//!                               #   https://kubernetes.default.svc.cluster.local
//! rules:
//! - name: viewers               # binding name in status.reason (default rule-<index>)
//!   role: viewers               # ClusterRole name in status.reason (default: name)
//!   users: [alice]              # subjects: any of these users,
//!   groups: [viewers]           #   members of any of these groups,
//!   serviceAccounts: [kube-system/percolator]   # or these service accounts (ns/name)
//!   verbs: [get, list, watch]   # "*" = every verb
//!   apiGroups: [stats.une-tasse-de.cafe]        # "" = core, "*" = every group
//!   resources: ["*"]            # "pods", "pods/log", "*" (incl. subresources), "*/scale"
//!   resourceNames: []           # empty = every object
//!   namespaces: [shop]          # empty = everywhere, cluster scope included
//!                               #   (a ClusterRoleBinding); otherwise only these
//!                               #   namespaces (a RoleBinding in each)
//!   nonResourceURLs: [/metrics] # exact paths, or prefixes ending in "*"; only in rules
//!                               #   without namespaces
//! ```
//!
//! Evaluation is RBAC's: the request is allowed by the first rule (rules without namespaces
//! first, then the namespaced ones, each in file order) whose subjects include the user or
//! one of the groups given in the review and whose verbs, API groups, resources, resource
//! names and namespace (or non-resource URLs) all match. The reason then reads like
//! kube-apiserver's: `RBAC: allowed by ClusterRoleBinding "viewers" of ClusterRole "viewers"
//! to Group "viewers"` or `RBAC: allowed by RoleBinding "alice-stats-reader/shop" of
//! ClusterRole "alice-stats-reader" to User "alice"`. A denial has no reason and is not
//! `denied` (RBAC has no opinion; nothing else allows). Groups are taken as given: like
//! kube-apiserver, a SubjectAccessReview does not add `system:authenticated` itself.
//!
//! Whatever the policy, [`SERVICE_ACCOUNT_RULES`] are appended: the service account whose
//! token the simulator hands out, `system:serviceaccount:kube-system:percolator`, has the
//! rights of `system:auth-delegator`, of `extension-apiserver-authentication-reader` and to
//! read pods, nodes, services and the `apps` workloads (deployments, replicasets,
//! statefulsets, daemonsets: the objects of custom metrics). Its token also authenticates in
//! a TokenReview. (The simulated API itself lets that token do everything and the policy's
//! users read everything; these rules answer SubjectAccessReviews, which the aggregated
//! extension server asks.)

use std::collections::BTreeSet;
use std::path::Path;

use serde::{Deserialize, Serialize};

use percolator::config::yaml;

use super::rng::{SplitMix64, mix64};

/// The built-in policy (used without `--policy`).
pub(super) const DEFAULT_POLICY: &str = r#"tokens:
- {token: alice-token, username: alice, groups: [devs]}
- {token: carol-token, username: carol, groups: [viewers]}
- {token: bob-token, username: bob}
- {token: admin-token, username: admin, groups: ["system:masters"]}
- {token: tester-token, username: tester, groups: [viewers]}
rules:
# kube-apiserver's bootstrap system:discovery and system:public-info-viewer.
- name: "system:discovery"
  groups: ["system:authenticated"]
  verbs: [get]
  nonResourceURLs: [/api, /api/*, /apis, /apis/*, /openapi, /openapi/*, /version, /version/,
                    /healthz, /livez, /readyz]
- name: "system:public-info-viewer"
  groups: ["system:authenticated", "system:unauthenticated"]
  verbs: [get]
  nonResourceURLs: [/healthz, /livez, /readyz, /version, /version/]
# kube-apiserver's cluster-admin binding for system:masters.
- name: cluster-admin
  groups: ["system:masters"]
  verbs: ["*"]
  apiGroups: ["*"]
  resources: ["*"]
  nonResourceURLs: ["*"]
- name: viewers
  groups: [viewers]
  verbs: [get, list, watch]
  apiGroups: [stats.une-tasse-de.cafe, external.metrics.k8s.io, custom.metrics.k8s.io, metrics.k8s.io]
  resources: ["*"]
- name: viewers-metrics
  groups: [viewers]
  verbs: [get]
  nonResourceURLs: [/metrics]
- name: alice-stats-reader
  users: [alice]
  verbs: [get, list]
  apiGroups: [stats.une-tasse-de.cafe]
  resources: ["*"]
  namespaces: [shop]
"#;

/// Rules appended to every policy: the simulator's own service account.
pub(super) const SERVICE_ACCOUNT_RULES: &str = r#"rules:
- name: "percolator:system:auth-delegator"
  role: "system:auth-delegator"
  serviceAccounts: [kube-system/percolator]
  verbs: [create]
  apiGroups: [authentication.k8s.io, authorization.k8s.io]
  resources: [tokenreviews, subjectaccessreviews]
- name: percolator-auth-reader
  role: extension-apiserver-authentication-reader
  serviceAccounts: [kube-system/percolator]
  verbs: [get, list, watch]
  apiGroups: [""]
  resources: [configmaps]
  resourceNames: [extension-apiserver-authentication]
  namespaces: [kube-system]
- name: percolator
  serviceAccounts: [kube-system/percolator]
  verbs: [get, list, watch]
  apiGroups: [""]
  resources: [pods, nodes, nodes/metrics, nodes/stats, services]
- name: percolator-workloads
  serviceAccounts: [kube-system/percolator]
  verbs: [get, list, watch]
  apiGroups: [apps]
  resources: [deployments, replicasets, statefulsets, daemonsets]
"#;

/// Namespace of the simulator's service account.
pub(crate) const SA_NAMESPACE: &str = "kube-system";
/// Name of the simulator's service account.
pub(crate) const SA_NAME: &str = "percolator";

/// The API audiences tokens are valid for unless a token entry says otherwise.
pub(crate) const API_AUDIENCES: &[&str] = &["https://kubernetes.default.svc.cluster.local"];

const DOMAIN_USER_UID: u64 = 12;

/// The policy: tokens and rules (each list may be omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Policy {
    /// Bearer tokens a TokenReview accepts.
    pub tokens: Vec<TokenEntry>,
    /// Authorization rules.
    pub rules: Vec<Rule>,
}

/// One bearer token and the user it authenticates.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TokenEntry {
    /// The token.
    pub token: String,
    /// The user name.
    pub username: String,
    /// The user's uid (default: derived from the user name).
    pub uid: Option<String>,
    /// The user's groups (`system:authenticated` is added).
    #[serde(default)]
    pub groups: Vec<String>,
    /// Audiences the token is valid for (default [`API_AUDIENCES`]).
    #[serde(default)]
    pub audiences: Vec<String>,
}

/// One binding of one rule to its subjects (every field may be omitted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields, default)]
pub struct Rule {
    /// The binding's name (default `rule-<index>`).
    pub name: String,
    /// The role's name (default: the binding's).
    pub role: String,
    /// Users the rule applies to.
    pub users: Vec<String>,
    /// Groups the rule applies to.
    pub groups: Vec<String>,
    /// Service accounts (`namespace/name`) the rule applies to.
    pub service_accounts: Vec<String>,
    /// Verbs (`*`: all).
    pub verbs: Vec<String>,
    /// API groups (`""`: core, `*`: all).
    pub api_groups: Vec<String>,
    /// Resources, `resource/subresource`, `*` or `*/subresource`.
    pub resources: Vec<String>,
    /// Object names (empty: all).
    pub resource_names: Vec<String>,
    /// Namespaces (empty: everywhere, cluster scope included).
    pub namespaces: Vec<String>,
    /// Non-resource URLs (exact, or a prefix ending in `*`).
    #[serde(rename = "nonResourceURLs")]
    pub non_resource_urls: Vec<String>,
}

/// What is asked: a resource or a non-resource request (SubjectAccessReview attributes).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) enum Request {
    /// `spec.resourceAttributes`.
    Resource {
        /// Namespace (empty: cluster scope).
        namespace: String,
        /// Verb.
        verb: String,
        /// API group (empty: core).
        group: String,
        /// Resource (plural).
        resource: String,
        /// Subresource.
        subresource: String,
        /// Object name.
        name: String,
    },
    /// `spec.nonResourceAttributes`.
    NonResource {
        /// Path.
        path: String,
        /// Verb.
        verb: String,
    },
    /// Neither (matches nothing).
    #[default]
    Nothing,
}

/// The outcome of an authorization.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Decision {
    /// Whether some rule allows the request.
    pub(crate) allowed: bool,
    /// `RBAC: allowed by …` when allowed, empty otherwise.
    pub(crate) reason: String,
}

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Identity {
    pub(crate) username: String,
    pub(crate) uid: String,
    /// Groups, `system:authenticated` included.
    pub(crate) groups: Vec<String>,
    /// Audiences the credential is valid for.
    pub(crate) audiences: Vec<String>,
}

/// A policy error (invalid YAML or an inconsistent entry).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct PolicyError(String);

fn matches_list(list: &[String], value: &str) -> bool {
    list.iter().any(|v| v == "*" || v == value)
}

/// A UUID-shaped uid derived from `name` (stable across runs).
pub(crate) fn derived_uid(name: &str) -> String {
    let hash = name.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| mix64(h ^ u64::from(b)));
    super::workload::uuid(&mut SplitMix64::stream(hash, DOMAIN_USER_UID, 0))
}

fn with_authenticated(groups: &[String]) -> Vec<String> {
    let mut out = groups.to_vec();
    if !out.iter().any(|g| g == "system:authenticated") {
        out.push("system:authenticated".to_owned());
    }
    out
}

impl Rule {
    fn is_cluster_wide(&self) -> bool {
        self.namespaces.is_empty()
    }

    /// The subject of the rule that `user`/`groups` is, described as RBAC does.
    fn subject(&self, user: &str, groups: &[String]) -> Option<String> {
        if self.users.iter().any(|u| u == user) {
            return Some(format!("User {user:?}"));
        }
        for sa in &self.service_accounts {
            if let Some((ns, name)) = sa.split_once('/')
                && user == format!("system:serviceaccount:{ns}:{name}")
            {
                return Some(format!("ServiceAccount {:?}", format!("{name}/{ns}")));
            }
        }
        self.groups.iter().find(|g| groups.contains(g)).map(|g| format!("Group {g:?}"))
    }

    /// Whether the rule's permissions cover `request` (namespaces aside).
    fn permits(&self, request: &Request) -> bool {
        match request {
            Request::Resource { verb, group, resource, subresource, name, .. } => {
                let combined = if subresource.is_empty() {
                    resource.clone()
                } else {
                    format!("{resource}/{subresource}")
                };
                matches_list(&self.verbs, verb)
                    && matches_list(&self.api_groups, group)
                    && self.resources.iter().any(|r| {
                        r == "*"
                            || *r == combined
                            || (!subresource.is_empty() && r.strip_prefix("*/") == Some(subresource.as_str()))
                    })
                    && (self.resource_names.is_empty() || self.resource_names.iter().any(|n| n == name))
            }
            Request::NonResource { path, verb } => {
                matches_list(&self.verbs, verb)
                    && self.non_resource_urls.iter().any(|u| {
                        u == "*"
                            || u == path
                            || u.strip_suffix('*').is_some_and(|prefix| path.starts_with(prefix))
                    })
            }
            Request::Nothing => false,
        }
    }

    fn validate(&mut self, index: usize) -> Result<(), PolicyError> {
        if self.name.is_empty() {
            self.name = format!("rule-{index}");
        }
        if self.role.is_empty() {
            self.role = self.name.clone();
        }
        let at = |m: &str| PolicyError(format!("rules[{index}] ({}): {m}", self.name));
        if self.users.is_empty() && self.groups.is_empty() && self.service_accounts.is_empty() {
            return Err(at("needs at least one of users, groups, serviceAccounts"));
        }
        if self.verbs.is_empty() {
            return Err(at("needs verbs"));
        }
        if self.resources.is_empty() && self.non_resource_urls.is_empty() {
            return Err(at("needs resources or nonResourceURLs"));
        }
        if !self.resources.is_empty() && self.api_groups.is_empty() {
            return Err(at("resources need apiGroups (\"\" is the core group)"));
        }
        if !self.non_resource_urls.is_empty() && !self.namespaces.is_empty() {
            return Err(at("nonResourceURLs cannot be granted in namespaces"));
        }
        if let Some(u) = self.non_resource_urls.iter().find(|u| *u != "*" && !u.starts_with('/')) {
            return Err(at(&format!("nonResourceURL {u:?} must start with / (or be *)")));
        }
        if let Some(sa) = self.service_accounts.iter().find(|s| {
            s.split_once('/').is_none_or(|(ns, name)| ns.is_empty() || name.is_empty() || name.contains('/'))
        }) {
            return Err(at(&format!("serviceAccount {sa:?} is not namespace/name")));
        }
        Ok(())
    }
}

impl Policy {
    /// Parses a policy document and appends [`SERVICE_ACCOUNT_RULES`].
    ///
    /// # Errors
    /// Invalid YAML, unknown keys, or an inconsistent token or rule.
    pub fn from_yaml(text: &str) -> Result<Self, PolicyError> {
        let mut policy: Policy = yaml::from_str(text).map_err(|e| PolicyError(e.to_string()))?;
        let builtin: Policy =
            yaml::from_str(SERVICE_ACCOUNT_RULES).map_err(|e| PolicyError(e.to_string()))?;
        policy.rules.extend(builtin.rules);
        let mut seen = BTreeSet::new();
        for (i, t) in policy.tokens.iter().enumerate() {
            if t.token.is_empty() || t.username.is_empty() {
                return Err(PolicyError(format!("tokens[{i}]: token and username must not be empty")));
            }
            if !seen.insert(t.token.as_str()) {
                return Err(PolicyError(format!("tokens[{i}] ({}): token listed twice", t.username)));
            }
        }
        for (i, rule) in policy.rules.iter_mut().enumerate() {
            rule.validate(i)?;
        }
        Ok(policy)
    }

    /// The built-in policy.
    pub fn builtin() -> Self {
        // DEFAULT_POLICY is checked by a test; fall back to the service-account rules only.
        Self::from_yaml(DEFAULT_POLICY).or_else(|_| Self::from_yaml("{}")).unwrap_or_default()
    }

    /// The policy in `path` (`None`: the built-in one).
    ///
    /// # Errors
    /// The file cannot be read or is not a valid policy.
    pub fn load(path: Option<&Path>) -> Result<Self, PolicyError> {
        match path {
            None => Ok(Self::builtin()),
            Some(path) => {
                let text = std::fs::read_to_string(path)
                    .map_err(|e| PolicyError(format!("{}: {e}", path.display())))?;
                Self::from_yaml(&text).map_err(|e| PolicyError(format!("{}: {e}", path.display())))
            }
        }
    }

    /// The user `token` authenticates as, if any (the service-account token aside).
    pub(crate) fn authenticate(&self, token: &str) -> Option<Identity> {
        let entry = self.tokens.iter().find(|t| t.token == token)?;
        Some(Identity {
            username: entry.username.clone(),
            uid: entry.uid.clone().unwrap_or_else(|| derived_uid(&entry.username)),
            groups: with_authenticated(&entry.groups),
            audiences: if entry.audiences.is_empty() {
                API_AUDIENCES.iter().map(|s| (*s).to_owned()).collect()
            } else {
                entry.audiences.clone()
            },
        })
    }

    /// Whether `user` with `groups` may do `request`.
    pub(crate) fn authorize(&self, user: &str, groups: &[String], request: &Request) -> Decision {
        let namespace = match request {
            Request::Resource { namespace, .. } => namespace.as_str(),
            _ => "",
        };
        let cluster_wide = self.rules.iter().filter(|r| r.is_cluster_wide());
        for rule in cluster_wide {
            if let Some(subject) = rule.subject(user, groups)
                && rule.permits(request)
            {
                let reason = format!(
                    "RBAC: allowed by ClusterRoleBinding {:?} of ClusterRole {:?} to {subject}",
                    rule.name, rule.role
                );
                return Decision { allowed: true, reason };
            }
        }
        if matches!(request, Request::Resource { .. }) && !namespace.is_empty() {
            let namespaced = self.rules.iter().filter(|r| r.namespaces.iter().any(|n| n == namespace));
            for rule in namespaced {
                if let Some(subject) = rule.subject(user, groups)
                    && rule.permits(request)
                {
                    let reason = format!(
                        "RBAC: allowed by RoleBinding {:?} of ClusterRole {:?} to {subject}",
                        format!("{}/{namespace}", rule.name),
                        rule.role
                    );
                    return Decision { allowed: true, reason };
                }
            }
        }
        Decision { allowed: false, reason: String::new() }
    }
}

/// The identity of the simulator's service account (whose token is the API token).
pub(crate) fn service_account(uid: String) -> Identity {
    Identity {
        username: format!("system:serviceaccount:{SA_NAMESPACE}:{SA_NAME}"),
        uid,
        groups: vec![
            "system:serviceaccounts".to_owned(),
            format!("system:serviceaccounts:{SA_NAMESPACE}"),
            "system:authenticated".to_owned(),
        ],
        audiences: API_AUDIENCES.iter().map(|s| (*s).to_owned()).collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn res(ns: &str, verb: &str, group: &str, resource: &str) -> Request {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Request::Resource {
            namespace: ns.into(),
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: String::new(),
        }
    }

    fn path(verb: &str, p: &str) -> Request {
        Request::NonResource { path: p.into(), verb: verb.into() }
    }

    const STATS: &str = "stats.une-tasse-de.cafe";
    const EXT: &str = "external.metrics.k8s.io";
    const PMS: &str = "podmetricssummaries";
    const SA: &str = "system:serviceaccount:kube-system:percolator";

    #[test]
    fn default_policy_parses() {
        let p = Policy::from_yaml(DEFAULT_POLICY).unwrap();
        assert_eq!(p, Policy::builtin());
        assert_eq!(p.tokens.len(), 5);
        assert!(p.rules.iter().any(|r| r.name == "percolator:system:auth-delegator"));
        let alice = p.authenticate("alice-token").unwrap();
        assert_eq!(alice.username, "alice");
        assert_eq!(alice.groups, ["devs", "system:authenticated"]);
        assert_eq!(alice.uid, derived_uid("alice"));
        assert_eq!(alice.uid.len(), 36);
        assert_eq!(p.authenticate("bob-token").unwrap().groups, ["system:authenticated"]);
        assert_eq!(p.authenticate("tester-token").unwrap().groups, ["viewers", "system:authenticated"]);
        assert_eq!(p.authenticate("admin-token").unwrap().groups, ["system:masters", "system:authenticated"]);
        assert!(p.authenticate("nope").is_none());
    }

    #[test]
    fn sar_table() {
        let p = Policy::builtin();
        let authd = |gs: &[&str]| -> Vec<String> {
            gs.iter().map(|s| (*s).to_owned()).chain(["system:authenticated".to_owned()]).collect()
        };
        let anon = vec!["system:unauthenticated".to_owned()];
        let crb = |b: &str, subject: &str| {
            format!("RBAC: allowed by ClusterRoleBinding \"{b}\" of ClusterRole \"{b}\" to {subject}")
        };
        #[rustfmt::skip]
        let cases: Vec<(&str, Vec<String>, Request, Option<String>)> = vec![
            // alice: get/list in shop only.
            ("alice", authd(&["devs"]), res("shop", "list", STATS, PMS),
             Some("RBAC: allowed by RoleBinding \"alice-stats-reader/shop\" of ClusterRole \"alice-stats-reader\" to User \"alice\"".into())),
            ("alice", authd(&["devs"]), res("shop", "get", STATS, PMS), Some(String::new())),
            ("alice", authd(&["devs"]), res("shop", "watch", STATS, PMS), None),
            ("alice", authd(&["devs"]), res("api", "list", STATS, PMS), None),
            ("alice", authd(&["devs"]), res("", "list", STATS, PMS), None),
            ("alice", authd(&["devs"]), res("shop", "list", EXT, "cafe_orders"), None),
            ("alice", authd(&["devs"]), res("shop", "list", "", "pods"), None),
            ("alice", authd(&["devs"]), path("get", "/metrics"), None),
            // discovery for everybody authenticated, public info for anonymous.
            ("alice", authd(&["devs"]), path("get", "/apis/stats.une-tasse-de.cafe/v1alpha1"), Some(crb("system:discovery", "Group \"system:authenticated\""))),
            ("bob", authd(&[]), path("get", "/openapi/v3/apis/x/v1"), Some(String::new())),
            ("bob", authd(&[]), path("get", "/openapi"), Some(String::new())),
            ("bob", authd(&[]), path("get", "/version/"), Some(String::new())),
            ("bob", authd(&[]), path("post", "/apis"), None),
            ("bob", authd(&[]), path("get", "/apisx"), None),
            ("bob", authd(&[]), path("get", "/livez/ping"), None),
            ("bob", authd(&[]), path("get", "/metrics"), None),
            ("bob", authd(&[]), res("shop", "get", STATS, PMS), None),
            ("system:anonymous", anon.clone(), path("get", "/healthz"), Some(crb("system:public-info-viewer", "Group \"system:unauthenticated\""))),
            ("system:anonymous", anon.clone(), path("get", "/version"), Some(String::new())),
            ("system:anonymous", anon.clone(), path("get", "/apis"), None),
            ("system:anonymous", anon.clone(), res("shop", "list", STATS, PMS), None),
            // no groups at all: only what is bound to the user.
            ("alice", vec![], path("get", "/api"), None),
            // viewers everywhere, both groups, plus /metrics.
            ("carol", authd(&["viewers"]), res("", "list", STATS, PMS), Some(crb("viewers", "Group \"viewers\""))),
            ("carol", authd(&["viewers"]), res("api", "watch", STATS, PMS), Some(String::new())),
            ("carol", authd(&["viewers"]), res("default", "get", EXT, "cafe_orders"), Some(String::new())),
            ("carol", authd(&["viewers"]), res("shop", "get", STATS, "podmetricssummaries/status"), Some(String::new())),
            ("carol", authd(&["viewers"]), res("shop", "create", STATS, PMS), None),
            ("carol", authd(&["viewers"]), res("shop", "list", "apps", "deployments"), None),
            ("carol", authd(&["viewers"]), path("get", "/metrics"), Some(crb("viewers-metrics", "Group \"viewers\""))),
            ("tester", authd(&["viewers"]), res("shop", "list", STATS, PMS), Some(String::new())),
            // masters: everything.
            ("admin", authd(&["system:masters"]), res("", "delete", "", "nodes"), Some(crb("cluster-admin", "Group \"system:masters\""))),
            ("admin", authd(&["system:masters"]), path("put", "/anything"), Some(String::new())),
            ("someone", vec!["system:masters".to_owned()], res("x", "get", STATS, PMS), Some(String::new())),
            // the service account.
            (SA, authd(&["system:serviceaccounts"]), res("", "create", "authorization.k8s.io", "subjectaccessreviews"),
             Some("RBAC: allowed by ClusterRoleBinding \"percolator:system:auth-delegator\" of ClusterRole \"system:auth-delegator\" to ServiceAccount \"percolator/kube-system\"".into())),
            (SA, vec![], res("", "create", "authentication.k8s.io", "tokenreviews"), Some(String::new())),
            (SA, vec![], res("", "list", "", "pods"), Some(String::new())),
            (SA, vec![], res("kube-system", "watch", "", "configmaps"), None),
            (SA, vec![], res("shop", "get", "", "services"), Some(String::new())),
            (SA, vec![], res("shop", "get", "apps", "deployments"),
             Some("RBAC: allowed by ClusterRoleBinding \"percolator-workloads\" of ClusterRole \"percolator-workloads\" to ServiceAccount \"percolator/kube-system\"".into())),
            (SA, vec![], res("", "watch", "apps", "statefulsets"), Some(String::new())),
            (SA, vec![], res("api", "list", "apps", "daemonsets"), Some(String::new())),
            (SA, vec![], res("api", "list", "apps", "replicasets"), Some(String::new())),
            (SA, vec![], res("api", "update", "apps", "deployments"), None),
            (SA, vec![], res("api", "get", "apps", "pods"), None),
            (SA, vec![], res("api", "get", "apps", "deployments/scale"), None),
        ];
        for (i, (user, groups, request, want)) in cases.iter().enumerate() {
            let got = p.authorize(user, groups, request);
            match want {
                None => assert_eq!(
                    got,
                    Decision { allowed: false, reason: String::new() },
                    "case {i}: {user} {request:?}"
                ),
                Some(reason) => {
                    assert!(got.allowed, "case {i}: {user} {request:?}");
                    assert!(got.reason.starts_with("RBAC: allowed by "), "case {i}");
                    if !reason.is_empty() {
                        assert_eq!(&got.reason, reason, "case {i}");
                    }
                }
            }
        }
        // resourceNames: only the trust ConfigMap.
        let mut cm = res("kube-system", "watch", "", "configmaps");
        if let Request::Resource { name, .. } = &mut cm {
            *name = "extension-apiserver-authentication".into();
        }
        let d = p.authorize(SA, &[], &cm);
        assert_eq!(
            d.reason,
            "RBAC: allowed by RoleBinding \"percolator-auth-reader/kube-system\" of ClusterRole \
             \"extension-apiserver-authentication-reader\" to ServiceAccount \"percolator/kube-system\""
        );
        assert!(!p.authorize("x", &[], &Request::Nothing).allowed);
    }

    #[test]
    fn custom_policies_and_errors() {
        let p = Policy::from_yaml(
            "tokens: [{token: t, username: u, uid: '7', audiences: [a]}]\n\
             rules:\n- {users: [u], verbs: ['*'], apiGroups: [''], resources: ['*/scale']}\n",
        )
        .unwrap();
        let u = p.authenticate("t").unwrap();
        assert_eq!((u.uid.as_str(), u.audiences.as_slice()), ("7", ["a".to_owned()].as_slice()));
        assert_eq!(p.rules[0].name, "rule-0");
        assert!(p.authorize("u", &[], &res("", "update", "", "deployments/scale")).allowed);
        assert!(!p.authorize("u", &[], &res("", "update", "", "deployments")).allowed);
        assert!(!p.authorize("u", &[], &path("get", "/api")).allowed);

        for bad in [
            "tokenz: []",
            "rules: [{verbs: [get], nonResourceURLs: [/x]}]",
            "rules: [{users: [u], nonResourceURLs: [/x]}]",
            "rules: [{users: [u], verbs: [get]}]",
            "rules: [{users: [u], verbs: [get], resources: [pods]}]",
            "rules: [{users: [u], verbs: [get], nonResourceURLs: [/x], namespaces: [a]}]",
            "rules: [{users: [u], verbs: [get], nonResourceURLs: [x]}]",
            "rules: [{serviceAccounts: [nope], verbs: [get], nonResourceURLs: [/x]}]",
            "tokens: [{token: a, username: u}, {token: a, username: v}]",
            "tokens: [{token: '', username: u}]",
        ] {
            assert!(Policy::from_yaml(bad).is_err(), "{bad}");
        }
        assert!(Policy::load(Some(Path::new("/nonexistent/policy.yaml"))).is_err());
        assert_eq!(Policy::load(None).unwrap(), Policy::builtin());
    }
}
