//! Authorization (docs/wire.md, "Authorization"): `union(always-allow groups, always-allow paths, webhook)`.
//! Members of an always-allow group (`system:masters`) and non-resource requests for an
//! always-allow path are allowed without a call; everything else is a SubjectAccessReview,
//! cached by the spec's attributes (see [`decision_key`]): allowed answers for the authorized
//! TTL, denied ones for the unauthorized TTL, each in a cache of its own ([`Decisions`]), so
//! that a flood of unique denied requests (an anonymous client's unique paths) cannot evict
//! the allowed decisions of the identities actually served. Concurrent identical misses share
//! one review ([`super::flight`]), which is cancelled when no request waits for it any more;
//! reviews are bounded by the rate limit and the outstanding bound of [`super::limit`], one
//! identity holding at most its share (a refused review is a 429).
//!
//! Stale-if-error (issue 33): when the SubjectAccessReview cannot be made because kube-apiserver
//! is unreachable (connection refused or reset, no answer within the budget, 5xx; see
//! [`ReviewError::is_unreachable`]), the last decision reviewed for the same attributes within
//! `--authorization-webhook-stale-if-error` (5 minutes; 0 turns it off) is used instead,
//! allowed or denied alike, and counted. While the authorizer is known to be unreachable (the
//! last review failed so; a gauge says it), an expired decision that has such a last known
//! value is served at once and one review at a time is tried in the background, so cached
//! identities do not wait for the retries of a failing review on every expiry; the first
//! answered review ends it. A request with no last known decision is reviewed as usual and,
//! if kube-apiserver cannot be reached, answered 503 ([`AuthorizeError::Unavailable`]). A
//! revoked permission thus keeps working during an outage for at most that window after its
//! last successful review. A 429 from kube-apiserver is not unreachability: it asks to slow
//! down, and the request gets a 429 ([`AuthorizeError::Throttled`]).
//!
//! A list, watch or deletecollection carries its label and field selectors as the review's
//! `resourceAttributes.labelSelector` / `fieldSelector` requirements ([`SelectorAttributes`]),
//! as the webhook authorizer of k8s.io/apiserver sends them from 1.31. Older clusters drop the
//! unknown fields and decide on the rest; only the review's `status` is read.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use k8s_openapi::api::authorization::v1::{
    FieldSelectorAttributes, LabelSelectorAttributes, NonResourceAttributes, ResourceAttributes,
    SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{FieldSelectorRequirement, LabelSelectorRequirement};
use kube::core::Expression;
use moka::future::Cache;
use openmetrics::metrics::counter::Counter;
use openmetrics::metrics::family::Family;
use openmetrics::metrics::gauge::Gauge;

use super::UserInfo;
use super::flight::Flights;
use super::limit::{ClientKey, ReviewContext, ReviewGate};
use super::review::{AccessReviewer, ReviewError};
use crate::telemetry::{AuthMetrics, StaleDecisionLabels};
use k8s_wire::RequestInfo;
use k8s_wire::{FieldSelector, LabelSelector, Requirement};

/// SubjectAccessReview results kept at most, allowed and denied each
/// (`NewLRUExpireCache(8192)` in the webhook), and last known decisions each.
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
pub(crate) struct AlwaysAllowPaths {
    exact: Vec<String>,
    prefixes: Vec<String>,
}

impl AlwaysAllowPaths {
    /// Parses the flag's entries.
    pub(crate) fn new(patterns: &[String]) -> Result<Self, PathPatternError> {
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
    pub(crate) fn matches(&self, path: &str) -> bool {
        let p = path.strip_prefix('/').unwrap_or(path);
        self.exact.iter().any(|e| e == p) || self.prefixes.iter().any(|prefix| p.starts_with(prefix.as_str()))
    }
}

/// What the authorizer decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Decision {
    /// Go on.
    Allow,
    /// 403, with the authorizer's reason (possibly empty).
    Forbid(String),
}

/// The authorizer chain with its caches.
pub(crate) struct Authorizer {
    reviewer: Arc<dyn AccessReviewer>,
    gate: Arc<ReviewGate>,
    decisions: Decisions,
    flights: Flights<Vec<u8>, Reviewed>,
    stale: Stale,
    groups: Vec<String>,
    paths: AlwaysAllowPaths,
}

/// What a shared review gives each of its waiters.
type Reviewed = Result<Arc<SubjectAccessReviewStatus>, Arc<ReviewError>>;

/// How long decisions are kept.
#[derive(Debug, Clone, Copy)]
pub(crate) struct DecisionTtls {
    /// Allowed decisions (`--authorization-webhook-cache-authorized-ttl`).
    pub authorized: Duration,
    /// Denied decisions (`--authorization-webhook-cache-unauthorized-ttl`).
    pub unauthorized: Duration,
    /// Last known decisions, from their last successful review
    /// (`--authorization-webhook-stale-if-error`; zero: none kept).
    pub stale_if_error: Duration,
}

/// Decisions by outcome, each outcome in a cache of its own: unique denied keys evict only
/// denied decisions.
#[derive(Clone)]
struct Decisions {
    allowed: Cache<Vec<u8>, Arc<SubjectAccessReviewStatus>>,
    denied: Cache<Vec<u8>, Arc<SubjectAccessReviewStatus>>,
}

impl Decisions {
    fn new(allowed: Duration, denied: Duration) -> Self {
        let cache = |ttl| Cache::builder().max_capacity(MAX_DECISIONS).time_to_live(ttl).build();
        Self { allowed: cache(allowed), denied: cache(denied) }
    }

    async fn get(&self, key: &Vec<u8>) -> Option<Arc<SubjectAccessReviewStatus>> {
        match self.allowed.get(key).await {
            Some(status) => Some(status),
            None => self.denied.get(key).await,
        }
    }

    async fn insert(&self, key: Vec<u8>, status: Arc<SubjectAccessReviewStatus>) {
        // A key has one decision: the other outcome's entry, if any, is older.
        let (this, other) =
            if status.allowed { (&self.allowed, &self.denied) } else { (&self.denied, &self.allowed) };
        other.invalidate(&key).await;
        this.insert(key, status).await;
    }
}

/// The stale-if-error state: the last decision of every key reviewed within the window
/// (allowed and denied each with their own budget), whether the last review failed as
/// unreachable, and whether a background review is under way.
#[derive(Clone)]
struct Stale {
    window: Duration,
    last_known: Option<Decisions>,
    unreachable: Arc<AtomicBool>,
    probing: Arc<AtomicBool>,
    served: Family<StaleDecisionLabels, Counter>,
    unreachable_gauge: Gauge,
}

impl Stale {
    fn new(window: Duration, metrics: &AuthMetrics) -> Self {
        Self {
            window,
            last_known: (!window.is_zero()).then(|| Decisions::new(window, window)),
            unreachable: Arc::new(AtomicBool::new(false)),
            probing: Arc::new(AtomicBool::new(false)),
            served: metrics.stale_decisions.clone(),
            unreachable_gauge: metrics.authorizer_unreachable.clone(),
        }
    }

    fn is_unreachable(&self) -> bool {
        self.unreachable.load(Ordering::SeqCst)
    }

    fn set_unreachable(&self, unreachable: bool) -> bool {
        self.unreachable_gauge.set(i64::from(unreachable));
        self.unreachable.swap(unreachable, Ordering::SeqCst)
    }

    /// The last known decision of `key`, counted as served stale.
    async fn last_known(&self, key: &Vec<u8>) -> Option<Arc<SubjectAccessReviewStatus>> {
        let status = self.last_known.as_ref()?.get(key).await?;
        let decision = if status.allowed { "allowed" } else { "denied" };
        self.served.get_or_create(&StaleDecisionLabels { decision }).inc();
        Some(status)
    }

    /// A review's outcome: remembered, and the authorizer's reachability updated.
    async fn record(
        &self,
        key: &[u8],
        result: Result<SubjectAccessReviewStatus, ReviewError>,
    ) -> Result<Arc<SubjectAccessReviewStatus>, ReviewError> {
        match result {
            Ok(status) => {
                let status = Arc::new(status);
                if let Some(last_known) = &self.last_known {
                    last_known.insert(key.to_vec(), Arc::clone(&status)).await;
                }
                if self.set_unreachable(false) {
                    tracing::info!("SubjectAccessReview answered again: decisions are fresh again");
                }
                Ok(status)
            }
            Err(error) if error.is_unreachable() => {
                if !self.set_unreachable(true) {
                    tracing::warn!(
                        %error,
                        stale_if_error = ?self.window,
                        "SubjectAccessReview unreachable: serving the last known decisions, 503 for the others"
                    );
                }
                Err(error)
            }
            // Not made at all: nothing is known of kube-apiserver.
            Err(error @ ReviewError::Throttled { .. }) => Err(error),
            // kube-apiserver answered (a 429, a 403 to this server itself, a malformed
            // status): it is reachable, so no decision is served stale; the request gets the
            // error.
            Err(error) => {
                if self.set_unreachable(false) {
                    tracing::info!(%error, "SubjectAccessReview answered again, with an error: no stale decisions");
                }
                Err(error)
            }
        }
    }
}

/// Why no decision could be made: the request is answered 503 when kube-apiserver is
/// unreachable, 429 when a bound refused the review or kube-apiserver asked to slow down,
/// 500 otherwise.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum AuthorizeError {
    /// kube-apiserver could not be reached for the SubjectAccessReview and no decision for
    /// these attributes is known from the stale-if-error window.
    #[error("SubjectAccessReview unreachable: {0}")]
    Unavailable(Arc<ReviewError>),
    /// The review was refused by this server's bounds, or kube-apiserver answered 429 to the
    /// end of the review's budget.
    #[error("SubjectAccessReview not made: {error}")]
    Throttled {
        /// The refusal.
        error: Arc<ReviewError>,
        /// When to try again.
        retry_after: Duration,
    },
    /// The SubjectAccessReview call failed.
    #[error("SubjectAccessReview failed: {0}")]
    Review(Arc<ReviewError>),
    /// The webhook's answer is contradictory.
    #[error("webhook subject access review returned both allow and deny response")]
    AllowedAndDenied,
}

impl AuthorizeError {
    /// A failed review that no last known decision covers.
    fn from_review(error: Arc<ReviewError>) -> Self {
        if let Some(retry_after) = error.retry_after() {
            Self::Throttled { error, retry_after }
        } else if error.is_unreachable() {
            Self::Unavailable(error)
        } else {
            Self::Review(error)
        }
    }
}

impl Authorizer {
    /// Builds the chain: reviews through `reviewer` within `gate`'s bounds, decisions kept for
    /// `ttls`, counted into `metrics`.
    pub(crate) fn new(
        reviewer: Arc<dyn AccessReviewer>,
        gate: Arc<ReviewGate>,
        groups: Vec<String>,
        paths: AlwaysAllowPaths,
        ttls: DecisionTtls,
        metrics: &AuthMetrics,
    ) -> Self {
        Self {
            reviewer,
            gate,
            decisions: Decisions::new(ttls.authorized, ttls.unauthorized),
            flights: Flights::new(metrics.access_reviews.cancelled.clone()),
            stale: Stale::new(ttls.stale_if_error, metrics),
            groups,
            paths,
        }
    }

    /// The decision for `key`: cached, else reviewed (concurrent identical misses share one
    /// review), else the last known one while kube-apiserver is unreachable (module docs).
    async fn cached_review(
        &self,
        key: Vec<u8>,
        spec: SubjectAccessReviewSpec,
        client: ClientKey,
        context: &ReviewContext,
    ) -> Result<Arc<SubjectAccessReviewStatus>, AuthorizeError> {
        if let Some(status) = self.decisions.get(&key).await {
            return Ok(status);
        }
        if self.stale.is_unreachable() {
            // While kube-apiserver is known to be unreachable, no request waits out a review's
            // retries: the last known decision, else a 503 at once; one review at a time probes
            // in the background and ends this state when it is answered.
            let last = self.stale.last_known(&key).await;
            self.review_in_background(&key, spec, client, context);
            return last.ok_or(AuthorizeError::Unavailable(Arc::new(ReviewError::Unreachable)));
        }
        let flight = self
            .flights
            .join_or_start(&key, || {
                Ok(self.review(key.clone(), spec, self.gate.admit(client)?, context.wait))
            })
            .map_err(|error| AuthorizeError::from_review(Arc::new(error)))?;
        match flight.await {
            Ok(status) => Ok(status),
            Err(error) if error.is_unreachable() => match self.stale.last_known(&key).await {
                Some(status) => Ok(status),
                None => Err(AuthorizeError::Unavailable(error)),
            },
            Err(error) => Err(AuthorizeError::from_review(error)),
        }
    }

    /// The review of `spec` under `key`, admitted in `slot`: its outcome is recorded
    /// ([`Stale::record`]) and its decision cached, unless every request waiting for it went
    /// away first (then it is dropped, cancelled).
    fn review(
        &self,
        key: Vec<u8>,
        spec: SubjectAccessReviewSpec,
        slot: super::limit::Slot,
        wait: Duration,
    ) -> BoxFuture<'static, Reviewed> {
        let (reviewer, gate) = (Arc::clone(&self.reviewer), Arc::clone(&self.gate));
        let (decisions, stale) = (self.decisions.clone(), self.stale.clone());
        async move {
            // A review that ended between this request's cache lookup and its flight.
            if let Some(status) = decisions.get(&key).await {
                return Ok(status);
            }
            let result = gate.send(&slot, wait, || reviewer.review(spec.clone())).await;
            drop(slot);
            let status = stale.record(&key, result).await.map_err(Arc::new)?;
            decisions.insert(key, Arc::clone(&status)).await;
            Ok(status)
        }
        .boxed()
    }

    /// Reviews `spec` in a background task, unless one is under way (or the bounds refuse
    /// it): its answer refreshes the cache and, if it comes, ends the unreachable state.
    fn review_in_background(
        &self,
        key: &Vec<u8>,
        spec: SubjectAccessReviewSpec,
        client: ClientKey,
        context: &ReviewContext,
    ) {
        if self.stale.probing.swap(true, Ordering::SeqCst) {
            return;
        }
        let probing = Arc::clone(&self.stale.probing);
        let started = self.flights.join_or_start(key, || {
            Ok(self.review(key.clone(), spec, self.gate.admit(client)?, context.wait))
        });
        match started {
            Ok(flight) => {
                tokio::spawn(async move {
                    let _ = flight.await;
                    probing.store(false, Ordering::SeqCst);
                });
            }
            Err::<_, ReviewError>(_) => probing.store(false, Ordering::SeqCst),
        }
    }

    /// Decides on `info` for `user`. `path` is the decoded URL path. An error means the
    /// review could not be made (the caller answers 503, 429 or 500).
    pub(crate) async fn authorize(
        &self,
        user: &UserInfo,
        info: &RequestInfo,
        path: &str,
        context: &ReviewContext,
    ) -> Result<Decision, AuthorizeError> {
        if user.groups.iter().any(|g| self.groups.contains(g)) {
            return Ok(Decision::Allow);
        }
        if !info.is_resource_request && self.paths.matches(path) {
            return Ok(Decision::Allow);
        }
        let selectors = SelectorAttributes::of(info);
        // One identity's reviews share its part of the bound, whoever sends them.
        let client = ClientKey::User(Arc::from(user.name.as_str()));
        let status = if should_cache(info, path) {
            let key = decision_key(user, info, path, &selectors);
            self.cached_review(key, spec_with(user, info, path, selectors), client, context).await?
        } else {
            let spec = spec_with(user, info, path, selectors);
            let to_error = |error| AuthorizeError::from_review(Arc::new(error));
            let slot = self.gate.admit(client).map_err(to_error)?;
            let reviewer = &self.reviewer;
            Arc::new(
                self.gate
                    .send(&slot, context.wait, || reviewer.review(spec.clone()))
                    .await
                    .map_err(to_error)?,
            )
        };
        let reason = status.reason.clone().unwrap_or_default();
        match (status.allowed, status.denied == Some(true)) {
            (true, true) => Err(AuthorizeError::AllowedAndDenied),
            (true, false) => Ok(Decision::Allow),
            (false, _) => Ok(Decision::Forbid(reason)),
        }
    }

    /// Reviews under way (tests).
    #[cfg(test)]
    pub(crate) fn flights(&self) -> usize {
        self.flights.len()
    }

    /// Reviews admitted and not yet over (tests).
    #[cfg(test)]
    pub(crate) fn gate_outstanding(&self) -> usize {
        self.gate.outstanding()
    }

    /// Runs the caches' pending evictions (tests).
    #[cfg(test)]
    pub(crate) async fn run_pending_tasks(&self) {
        for cache in [&self.decisions.allowed, &self.decisions.denied] {
            cache.run_pending_tasks().await;
        }
    }
}

/// The selector attributes of a review (`resourceAttributes.labelSelector` and
/// `fieldSelector`), as the webhook authorizer of k8s.io/apiserver derives them
/// (`resourceAttributesFrom`): from the raw selectors [`RequestInfo`] keeps for list, watch and
/// deletecollection, parsed with the crate's parsers (the handler's rules), as `requirements`
/// only (never `rawSelector`). Label operators: `=`, `==`, `in` → `In`; `!=`, `notin` →
/// `NotIn`; `key` → `Exists`; `!key` → `DoesNotExist`; `>` and `<` are dropped (requirements are
/// ANDed, so dropping one only widens the check). Field terms: `=`, `==` → `In`, `!=` →
/// `NotIn`, one value each. Requirements come in the parsers' order, which is Go's: labels
/// sorted by key with their values sorted and deduplicated (`sets.String.List()`), field terms
/// sorted as text. A selector that is empty, does not parse, or leaves no requirement gives no
/// attribute (`null`, never `{}`); each selector on its own.
#[derive(Debug, Clone, Default, PartialEq)]
pub(crate) struct SelectorAttributes {
    /// `resourceAttributes.labelSelector`.
    pub label: Option<LabelSelectorAttributes>,
    /// `resourceAttributes.fieldSelector`.
    pub field: Option<FieldSelectorAttributes>,
}

impl SelectorAttributes {
    /// The selector attributes of `info`'s request.
    pub(crate) fn of(info: &RequestInfo) -> Self {
        if !info.is_resource_request {
            return Self::default();
        }
        Self { label: label_attributes(&info.label_selector), field: field_attributes(&info.field_selector) }
    }
}

fn label_attributes(raw: &str) -> Option<LabelSelectorAttributes> {
    if raw.is_empty() {
        return None;
    }
    let selector = LabelSelector::parse(raw).ok()?;
    let requirement = |key: &String, operator: &str, values: Vec<String>| LabelSelectorRequirement {
        key: key.clone(),
        operator: operator.to_owned(),
        values: (!values.is_empty()).then_some(values),
    };
    let requirements: Vec<LabelSelectorRequirement> = selector
        .requirements()
        .iter()
        .filter_map(|r| match r {
            Requirement::Expr(Expression::Equal(key, value)) => {
                Some(requirement(key, "In", vec![value.clone()]))
            }
            Requirement::Expr(Expression::In(key, values)) => {
                Some(requirement(key, "In", values.iter().cloned().collect()))
            }
            Requirement::Expr(Expression::NotEqual(key, value)) => {
                Some(requirement(key, "NotIn", vec![value.clone()]))
            }
            Requirement::Expr(Expression::NotIn(key, values)) => {
                Some(requirement(key, "NotIn", values.iter().cloned().collect()))
            }
            Requirement::Expr(Expression::Exists(key)) => Some(requirement(key, "Exists", Vec::new())),
            Requirement::Expr(Expression::DoesNotExist(key)) => {
                Some(requirement(key, "DoesNotExist", Vec::new()))
            }
            Requirement::GreaterThan { .. } | Requirement::LessThan { .. } => None,
        })
        .collect();
    (!requirements.is_empty())
        .then_some(LabelSelectorAttributes { raw_selector: None, requirements: Some(requirements) })
}

fn field_attributes(raw: &str) -> Option<FieldSelectorAttributes> {
    if raw.is_empty() {
        return None;
    }
    let selector = FieldSelector::parse(raw).ok()?;
    let requirements: Vec<FieldSelectorRequirement> = selector
        .terms()
        .iter()
        .map(|term| FieldSelectorRequirement {
            key: term.field.clone(),
            operator: if term.equal { "In" } else { "NotIn" }.to_owned(),
            values: Some(vec![term.value.clone()]),
        })
        .collect();
    (!requirements.is_empty())
        .then_some(FieldSelectorAttributes { raw_selector: None, requirements: Some(requirements) })
}

/// The decision cache's key: every attribute the review's spec is made of, each
/// length-prefixed, so two requests share a key exactly when they would send the same
/// SubjectAccessReview (k8s.io/apiserver keys by the JSON-serialized spec, which is the same
/// equivalence at the cost of a serialization per request).
fn decision_key(user: &UserInfo, info: &RequestInfo, path: &str, selectors: &SelectorAttributes) -> Vec<u8> {
    fn push(key: &mut Vec<u8>, s: &str) {
        key.extend_from_slice(&s.len().to_le_bytes());
        key.extend_from_slice(s.as_bytes());
    }
    /// One requirement: key, operator, then the values (absent and empty told apart).
    fn push_requirement(key: &mut Vec<u8>, name: &str, operator: &str, values: Option<&Vec<String>>) {
        push(key, name);
        push(key, operator);
        match values {
            None => key.push(0),
            Some(values) => {
                key.push(1);
                key.extend_from_slice(&values.len().to_le_bytes());
                for value in values {
                    push(key, value);
                }
            }
        }
    }
    /// A selector's requirements (absent and empty told apart), each as (key, operator, values).
    fn push_requirements<'r>(
        key: &mut Vec<u8>,
        requirements: Option<impl ExactSizeIterator<Item = (&'r str, &'r str, Option<&'r Vec<String>>)>>,
    ) {
        match requirements {
            None => key.push(0),
            Some(requirements) => {
                key.push(1);
                key.extend_from_slice(&requirements.len().to_le_bytes());
                for (name, operator, values) in requirements {
                    push_requirement(key, name, operator, values);
                }
            }
        }
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
        let label = selectors.label.as_ref().and_then(|l| l.requirements.as_ref());
        push_requirements(
            &mut key,
            label.map(|rs| rs.iter().map(|r| (&*r.key, &*r.operator, r.values.as_ref()))),
        );
        let field = selectors.field.as_ref().and_then(|f| f.requirements.as_ref());
        push_requirements(
            &mut key,
            field.map(|rs| rs.iter().map(|r| (&*r.key, &*r.operator, r.values.as_ref()))),
        );
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

/// `shouldCache`: the attributes together are shorter than 10000 bytes. Unlike Go, the raw
/// selectors count too: they are part of the key, and a cache of 8192 keys must stay small
/// whatever selectors clients send.
fn should_cache(info: &RequestInfo, path: &str) -> bool {
    let total = resource_attributes(info).iter().map(|s| s.len()).sum::<usize>()
        + path.len()
        + info.label_selector.len()
        + info.field_selector.len();
    total < MAX_CACHEABLE_ATTRIBUTES
}

fn some(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_owned())
}

/// The review's spec, with Go's `omitempty` (empty strings and lists left out), and the
/// request's [`SelectorAttributes`] (the tests' shorthand for [`spec_with`]).
#[cfg(test)]
pub(crate) fn review_spec(user: &UserInfo, info: &RequestInfo, path: &str) -> SubjectAccessReviewSpec {
    spec_with(user, info, path, SelectorAttributes::of(info))
}

/// The review's spec, with the selector attributes already derived.
fn spec_with(
    user: &UserInfo,
    info: &RequestInfo,
    path: &str,
    selectors: SelectorAttributes,
) -> SubjectAccessReviewSpec {
    let (resource_attributes, non_resource_attributes) = if info.is_resource_request {
        let attributes = ResourceAttributes {
            namespace: some(&info.namespace),
            verb: some(&info.verb),
            group: some(&info.api_group),
            version: some(&info.api_version),
            resource: some(&info.resource),
            subresource: some(&info.subresource),
            name: some(&info.name),
            label_selector: selectors.label,
            field_selector: selectors.field,
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
pub(crate) fn forbidden_reason(user: &UserInfo, info: &RequestInfo, path: &str, reason: &str) -> String {
    use k8s_wire::go_quote;
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
        let info = |uri: &str| {
            let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
            (RequestInfo::new(&http::Method::GET, path, query).unwrap(), path.to_owned())
        };
        let key = |u: &UserInfo, uri: &str| {
            let (info, path) = info(uri);
            decision_key(u, &info, &path, &SelectorAttributes::of(&info))
        };
        let spec = |u: &UserInfo, uri: &str| {
            let (info, path) = info(uri);
            serde_json::to_string(&review_spec(u, &info, &path)).unwrap()
        };
        let bob = || user("bob", &["a", "b"]);
        let list = "/apis/g/v/namespaces/ns/widgets";
        let mut cases = vec![
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
        // Selectors: spellings of one requirement share a spec; dropped or unparsable ones are
        // the plain list's.
        for query in [
            "labelSelector=app%3Dx",
            "labelSelector=app%3D%3Dx",
            "labelSelector=app+in+(x)",
            "labelSelector=app+in+(x,x)",
            "labelSelector=app!%3Dx",
            "labelSelector=app+notin+(x)",
            "labelSelector=app",
            "labelSelector=!app",
            "labelSelector=app+in+(x,y)",
            "labelSelector=app+in+(y,x)",
            "labelSelector=app+in+(xy)",
            "labelSelector=a%3Db,c%3Dd",
            "labelSelector=c%3Dd,a%3Db",
            "labelSelector=app%3E1",
            "labelSelector=app%3D%22",
            "labelSelector=",
            "fieldSelector=metadata.namespace%3Dx",
            "fieldSelector=metadata.namespace%3D%3Dx",
            "fieldSelector=metadata.namespace!%3Dx",
            "fieldSelector=metadata.namespace%3Dx,",
            "fieldSelector=metadata.name%3Dw",
            "fieldSelector=x%3D",
            "fieldSelector=x%3D%3D",
            "fieldSelector=%3Dx",
            "fieldSelector=metadata.namespace%3Dx&labelSelector=app%3Dx",
            "labelSelector=app%3Dx&fieldSelector=metadata.namespace%3Dx",
            "labelSelector=app%3Dx&fieldSelector=metadata.namespace%3Dx&limit=500",
        ] {
            cases.push((bob(), &*Box::leak(format!("{list}?{query}").into_boxed_str())));
        }
        cases.push((bob(), list));
        for (u1, p1) in &cases {
            for (u2, p2) in &cases {
                assert_eq!(
                    key(u1, p1) == key(u2, p2),
                    spec(u1, p1) == spec(u2, p2),
                    "{u1:?} {p1} / {u2:?} {p2}"
                );
            }
        }
        // The equivalence above is not vacuous: these share a key, those do not.
        let same =
            |a: &str, b: &str| key(&bob(), &format!("{list}?{a}")) == key(&bob(), &format!("{list}?{b}"));
        assert!(same("labelSelector=app%3Dx", "labelSelector=app+in+(x,x)"));
        assert!(same("labelSelector=app+in+(x,y)", "labelSelector=app+in+(y,x)"));
        assert!(same("labelSelector=app%3E1", "labelSelector=app%3D%22"));
        assert!(same("labelSelector=app%3E1", "limit=500"));
        assert!(same(
            "fieldSelector=metadata.namespace%3Dx&labelSelector=app%3Dx",
            "labelSelector=app%3Dx&fieldSelector=metadata.namespace%3Dx"
        ));
        assert!(!same("labelSelector=app%3Dx", "labelSelector=app!%3Dx"));
        assert!(!same("labelSelector=app", "labelSelector=!app"));
        assert!(!same("labelSelector=app+in+(xy)", "labelSelector=app+in+(x,y)"));
        assert!(!same("labelSelector=app%3Dx", "fieldSelector=app%3Dx"));
        assert!(!same("labelSelector=app%3Dx", "limit=500"));
        let mut extra = user("bob", &[]);
        extra.extra.insert("k".into(), vec!["v1".into(), "v2".into()]);
        let mut other = user("bob", &[]);
        other.extra.insert("k".into(), vec!["v1v2".into()]);
        assert_ne!(key(&extra, "/apis"), key(&other, "/apis"));
    }

    fn spec_of(method: http::Method, uri: &str) -> serde_json::Value {
        let (path, query) = uri.split_once('?').map_or((uri, None), |(p, q)| (p, Some(q)));
        let info = RequestInfo::new(&method, path, query).unwrap();
        let user = UserInfo { name: "bob".into(), ..Default::default() };
        serde_json::to_value(review_spec(&user, &info, path)).unwrap()
    }

    #[test]
    fn selectors_become_requirements_for_each_operator() {
        // kubectl get widgets -n ns -l 'a=1,b==2,c in (z,y,y),d!=3,e notin (4),f,!g,h>5,i<6'
        //   --field-selector 'metadata.name=n,metadata.namespace!=m,metadata.name==o'
        let uri = "/apis/g/v/namespaces/ns/widgets?labelSelector=a%3D1,b%3D%3D2,c+in+(z,y,y),d!%3D3,e+notin+(4),f,!g,h%3E5,i%3C6&fieldSelector=metadata.name%3Dn,metadata.namespace!%3Dm,metadata.name%3D%3Do";
        assert_eq!(
            spec_of(http::Method::GET, uri),
            serde_json::json!({
                "user": "bob",
                "resourceAttributes": {
                    "namespace": "ns", "verb": "list", "group": "g", "version": "v", "resource": "widgets",
                    "name": "o",
                    "labelSelector": {"requirements": [
                        {"key": "a", "operator": "In", "values": ["1"]},
                        {"key": "b", "operator": "In", "values": ["2"]},
                        {"key": "c", "operator": "In", "values": ["y", "z"]},
                        {"key": "d", "operator": "NotIn", "values": ["3"]},
                        {"key": "e", "operator": "NotIn", "values": ["4"]},
                        {"key": "f", "operator": "Exists"},
                        {"key": "g", "operator": "DoesNotExist"}
                    ]},
                    "fieldSelector": {"requirements": [
                        {"key": "metadata.name", "operator": "In", "values": ["o"]},
                        {"key": "metadata.name", "operator": "In", "values": ["n"]},
                        {"key": "metadata.namespace", "operator": "NotIn", "values": ["m"]}
                    ]}
                }
            })
        );
        let attributes = |method: http::Method, uri: &str| spec_of(method, uri)["resourceAttributes"].clone();
        let list = "/apis/g/v/namespaces/ns/widgets";
        let plain = serde_json::json!({"namespace": "ns", "verb": "list", "group": "g", "version": "v", "resource": "widgets"});
        // Nothing left, nothing parsed, nothing given: no attribute at all (not `{}`).
        for query in [
            "labelSelector=h%3E5,i%3C6",
            "labelSelector=a%3D%22",
            "labelSelector=",
            "fieldSelector=",
            "fieldSelector=,",
            "fieldSelector=a%3Db%3Dc",
            "labelSelector=a+in+(b&fieldSelector=metadata.name%3Db%3Dc",
        ] {
            assert_eq!(attributes(http::Method::GET, &format!("{list}?{query}")), plain, "{query}");
        }
        // Each selector on its own: an unparsable label selector leaves the field selector.
        assert_eq!(
            attributes(
                http::Method::GET,
                &format!("{list}?labelSelector=a%3D%22&fieldSelector=metadata.namespace%3Dns,x%3D")
            ),
            serde_json::json!({
                "namespace": "ns", "verb": "list", "group": "g", "version": "v", "resource": "widgets",
                "fieldSelector": {"requirements": [
                    {"key": "metadata.namespace", "operator": "In", "values": ["ns"]},
                    {"key": "x", "operator": "In", "values": [""]}
                ]}
            })
        );
        // Empty values are values; watch and deletecollection carry them too.
        let empty = serde_json::json!({"requirements": [{"key": "a", "operator": "In", "values": [""]}]});
        assert_eq!(
            attributes(http::Method::GET, &format!("{list}?labelSelector=a%3D"))["labelSelector"],
            empty
        );
        assert_eq!(
            attributes(http::Method::GET, &format!("{list}?labelSelector=a+in+()"))["labelSelector"],
            empty
        );
        let watch = attributes(http::Method::GET, &format!("{list}?watch=true&labelSelector=a%3D"));
        assert_eq!((&watch["verb"], &watch["labelSelector"]), (&serde_json::json!("watch"), &empty));
        let delete = attributes(http::Method::DELETE, &format!("{list}?labelSelector=a%3D"));
        assert_eq!(
            (&delete["verb"], &delete["labelSelector"]),
            (&serde_json::json!("deletecollection"), &empty)
        );
        // Not for a get, nor for a non-resource request.
        assert_eq!(
            attributes(http::Method::GET, &format!("{list}/w?labelSelector=a%3D1&fieldSelector=x%3D1")),
            serde_json::json!({"namespace": "ns", "verb": "get", "group": "g", "version": "v", "resource": "widgets", "name": "w"})
        );
        assert_eq!(
            spec_of(http::Method::GET, "/apis/g/v?labelSelector=a%3D1"),
            serde_json::json!({"user": "bob", "nonResourceAttributes": {"path": "/apis/g/v", "verb": "get"}})
        );
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
