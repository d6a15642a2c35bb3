//! The bounds on the reviews sent to kube-apiserver, one [`ReviewGate`] per kind
//! (TokenReview, SubjectAccessReview), so that no client of this server can make it send
//! reviews without limit:
//!
//! - a rate limit, as k8s.io/apiserver's delegated clients have (QPS 200, burst 400): a token
//!   bucket (`--authentication-token-webhook-qps`/`-burst`,
//!   `--authorization-webhook-qps`/`-burst`), one token per request sent, retries included;
//!   waiters are served in arrival order (leaky-bucket's fair scheduler). A review waits for
//!   its first token at most [`MAX_TOKEN_WAIT`], less when the request's `?timeout=` is short
//!   ([`ReviewContext`]), so it is never what makes a request time out; then the request is
//!   answered 429 with `Retry-After`;
//! - a bound on outstanding reviews (waiting for a token or sent):
//!   `--authentication-token-webhook-max-inflight`, `--authorization-webhook-max-inflight`;
//!   beyond it the request is answered 429 at once, never queued;
//! - fairness: one client holds at most a [`CLIENT_SHARE`]th of that bound. A client is the
//!   identity for SubjectAccessReviews (`system:anonymous` is one identity, whoever sends its
//!   requests), the client address for TokenReviews (the identity is what the review says), so
//!   an anonymous flood of unique paths and random tokens from one pod leaves room for a known
//!   identity reading through the aggregator;
//! - retries ([`RetryPolicy`]): transient failures (connection errors, 5xx) are retried with
//!   a 500 ms × 1.5 backoff, at most 5 attempts within the review's 10 s budget, as the generic
//!   server's webhooks do; a 429 from kube-apiserver (its priority and fairness pushing back)
//!   means "slow down": the next attempt waits its `Retry-After`, and if kube-apiserver still
//!   refuses at the end of the budget, the request gets a 429 too, never a 503.
//!
//! Every bound is counted ([`ReviewMetrics`]): requests sent by outcome, reviews refused by
//! reason, outstanding reviews.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use leaky_bucket::RateLimiter;
use tokio::time::Instant;

use super::review::{Refusal, ReviewError};
use crate::telemetry::{ReviewMetrics, ReviewOutcomeLabels, ReviewRefusalLabels};

/// Longest wait for the rate limit's first token: a review that cannot be sent within it is
/// refused (429) rather than held, so a request is answered within about a second under
/// overload, and a known identity queued behind a flood waits at most a client's share of
/// the bound divided by the rate (100 / 200 per second with the defaults).
pub(crate) const MAX_TOKEN_WAIT: Duration = Duration::from_secs(1);
/// One client may hold at most `max-inflight / CLIENT_SHARE` outstanding reviews of a kind.
pub(crate) const CLIENT_SHARE: usize = 4;
/// `Retry-After` (seconds) of a request refused by a local bound: the rate limit has refilled
/// `qps` tokens by then.
pub(crate) const REFUSED_RETRY_AFTER: Duration = Duration::from_secs(1);

/// Budget of one review, retries included (`TokenRequestTimeout`, the SAR client timeout).
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per review (`DefaultAuthWebhookRetryBackoff`: 5 steps).
const ATTEMPTS: u32 = 5;
/// First retry delay, multiplied by 1.5 after each retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// The `outcome` label of a request sent.
mod outcome {
    pub(super) const SUCCESS: &str = "success";
    pub(super) const THROTTLED: &str = "throttled";
    pub(super) const ERROR: &str = "error";
    pub(super) const UNREACHABLE: &str = "unreachable";
}

/// Who a review is made for, as far as fairness goes.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) enum ClientKey {
    /// An identity (SubjectAccessReviews).
    User(Arc<str>),
    /// A client address (TokenReviews).
    Address(IpAddr),
    /// A client whose address the serving loop did not give (all share one share).
    Unknown,
}

/// What a request brings to its reviews: who it is for fairness (its address), and how long
/// its first review may wait for the rate limit.
#[derive(Debug, Clone)]
pub(crate) struct ReviewContext {
    /// The client's address, when the serving loop gave it ([`super::ClientAddr`]).
    pub address: Option<IpAddr>,
    /// How long the first request of a review may wait for a token.
    pub wait: Duration,
}

impl ReviewContext {
    /// The context of a request from `address` whose `?timeout=` is `timeout`: a review waits
    /// [`MAX_TOKEN_WAIT`] at most, and at most half the request's own deadline, so that the
    /// request is answered 429 rather than timed out.
    pub(crate) fn new(address: Option<IpAddr>, timeout: Option<Duration>) -> Self {
        let wait = match timeout {
            Some(timeout) if !timeout.is_zero() => MAX_TOKEN_WAIT.min(timeout / 2),
            _ => MAX_TOKEN_WAIT,
        };
        Self { address, wait }
    }

    /// The fairness key of a TokenReview made for this request.
    pub(crate) fn client(&self) -> ClientKey {
        self.address.map_or(ClientKey::Unknown, ClientKey::Address)
    }
}

/// The rate limit and outstanding bound of one kind, from its flags.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Requests per second (> 0).
    pub qps: f64,
    /// The bucket's size (≥ 1).
    pub burst: u32,
    /// Outstanding reviews at most (≥ 1).
    pub max_in_flight: u32,
}

/// How failed attempts are retried.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RetryPolicy {
    /// The review's budget, waits included.
    pub budget: Duration,
    /// Attempts at most.
    pub attempts: u32,
    /// First backoff, × 1.5 after each retry.
    pub first_backoff: Duration,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { budget: REVIEW_TIMEOUT, attempts: ATTEMPTS, first_backoff: FIRST_BACKOFF }
    }
}

/// Outstanding reviews of a kind, in all and by client.
#[derive(Debug, Default)]
struct Outstanding {
    total: usize,
    by_client: HashMap<ClientKey, usize>,
}

/// The bounds of one kind of review (module documentation).
pub(crate) struct ReviewGate {
    bucket: RateLimiter,
    max_in_flight: usize,
    per_client: usize,
    outstanding: Mutex<Outstanding>,
    retry: RetryPolicy,
    metrics: ReviewMetrics,
}

impl std::fmt::Debug for ReviewGate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReviewGate")
            .field("max_in_flight", &self.max_in_flight)
            .field("per_client", &self.per_client)
            .field("retry", &self.retry)
            .finish_non_exhaustive()
    }
}

/// A token bucket of `burst` tokens, full at first, refilled at `qps`: in steps of at least
/// 10 ms (the timer's useful resolution; leaky-bucket counts whole milliseconds), each step's
/// interval rounded up to a whole millisecond, so the rate never exceeds `qps`.
fn token_bucket(qps: f64, burst: u32) -> RateLimiter {
    let burst = usize::try_from(burst).unwrap_or(usize::MAX).max(1);
    // At most `burst` per step (the bucket holds no more), at least one.
    let refill = ((qps / 100.0).ceil() as usize).clamp(1, burst);
    let millis = (refill as f64 * 1000.0 / qps).ceil().clamp(1.0, u64::MAX as f64) as u64;
    RateLimiter::builder()
        .max(burst)
        .initial(burst)
        .refill(refill)
        .interval(Duration::from_millis(millis))
        .fair(true)
        .build()
}

/// A review admitted: it counts as outstanding (for its client too) until dropped.
pub(crate) struct Slot {
    gate: Arc<ReviewGate>,
    client: ClientKey,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut outstanding = self.gate.outstanding.lock().unwrap_or_else(PoisonError::into_inner);
        outstanding.total = outstanding.total.saturating_sub(1);
        if let Some(n) = outstanding.by_client.get_mut(&self.client) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                outstanding.by_client.remove(&self.client);
            }
        }
        drop(outstanding);
        self.gate.metrics.in_flight.dec();
    }
}

impl ReviewGate {
    /// A gate with `limits`, retrying by `retry`, counting into `metrics`.
    pub(crate) fn new(limits: Limits, retry: RetryPolicy, metrics: ReviewMetrics) -> Arc<Self> {
        let max_in_flight = usize::try_from(limits.max_in_flight).unwrap_or(usize::MAX).max(1);
        Arc::new(Self {
            bucket: token_bucket(limits.qps, limits.burst),
            max_in_flight,
            per_client: (max_in_flight / CLIENT_SHARE).max(1),
            outstanding: Mutex::default(),
            retry,
            metrics,
        })
    }

    fn refused(&self, reason: Refusal) -> ReviewError {
        self.metrics.refused.get_or_create(&ReviewRefusalLabels { reason: reason.label() }).inc();
        ReviewError::Throttled { reason, retry_after: REFUSED_RETRY_AFTER }
    }

    /// Admits a review for `client`, or refuses it at once (the kind's bound, or the client's
    /// share of it, is reached).
    pub(crate) fn admit(self: &Arc<Self>, client: ClientKey) -> Result<Slot, ReviewError> {
        let mut outstanding = self.outstanding.lock().unwrap_or_else(PoisonError::into_inner);
        if outstanding.total >= self.max_in_flight {
            drop(outstanding);
            return Err(self.refused(Refusal::InFlight));
        }
        let mine = outstanding.by_client.entry(client.clone()).or_default();
        if *mine >= self.per_client {
            drop(outstanding);
            return Err(self.refused(Refusal::PerClient));
        }
        *mine += 1;
        outstanding.total += 1;
        drop(outstanding);
        self.metrics.in_flight.inc();
        Ok(Slot { gate: Arc::clone(self), client })
    }

    /// Makes the admitted review: `attempt` once per request sent, each after a token of the
    /// rate limit (the first one waited for at most `first_wait`, retries within the budget),
    /// retried as the [`RetryPolicy`] says (module documentation). A local refusal is
    /// [`ReviewError::Throttled`], kube-apiserver's last 429 [`ReviewError::SlowDown`].
    pub(crate) async fn send<T, F>(
        &self,
        _slot: &Slot,
        first_wait: Duration,
        mut attempt: impl FnMut() -> F,
    ) -> Result<T, ReviewError>
    where
        F: Future<Output = Result<T, ReviewError>>,
    {
        let started = Instant::now();
        let budget = self.retry.budget;
        let remaining = || budget.saturating_sub(started.elapsed());
        let mut backoff = self.retry.first_backoff;
        let mut n = 1;
        loop {
            let wait = if n == 1 { first_wait.min(remaining()) } else { MAX_TOKEN_WAIT.min(remaining()) };
            if tokio::time::timeout(wait, self.bucket.acquire_one()).await.is_err() {
                return Err(self.refused(Refusal::Rate));
            }
            let error = match tokio::time::timeout(remaining(), attempt()).await {
                Ok(Ok(value)) => {
                    self.sent(outcome::SUCCESS);
                    return Ok(value);
                }
                Ok(Err(error)) => error,
                Err(_) => {
                    self.sent(outcome::UNREACHABLE);
                    return Err(ReviewError::Timeout(budget));
                }
            };
            let pause = match &error {
                ReviewError::SlowDown { retry_after } => {
                    self.sent(outcome::THROTTLED);
                    Some(*retry_after)
                }
                error if error.is_unreachable() => {
                    self.sent(outcome::UNREACHABLE);
                    error.is_retryable().then_some(backoff)
                }
                _ => {
                    self.sent(outcome::ERROR);
                    None
                }
            };
            match pause {
                Some(pause) if n < self.retry.attempts && started.elapsed() + pause < budget => {
                    tracing::debug!(%error, attempt = n, ?pause, "review failed; retrying");
                    tokio::time::sleep(pause).await;
                    backoff = backoff.mul_f64(1.5);
                    n += 1;
                }
                _ => {
                    if matches!(error, ReviewError::SlowDown { .. }) {
                        self.metrics
                            .refused
                            .get_or_create(&ReviewRefusalLabels { reason: Refusal::ApiServer.label() })
                            .inc();
                    }
                    return Err(error);
                }
            }
        }
    }

    fn sent(&self, outcome: &'static str) {
        self.metrics.sent.get_or_create(&ReviewOutcomeLabels { outcome }).inc();
    }

    /// Outstanding reviews now (tests).
    #[cfg(test)]
    pub(crate) fn outstanding(&self) -> usize {
        self.outstanding.lock().unwrap_or_else(PoisonError::into_inner).total
    }
}
