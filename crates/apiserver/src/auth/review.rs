//! The two upstream calls of delegated auth, behind narrow traits so the middleware is tested
//! with fakes: [`TokenReviewer`] (`POST /apis/authentication.k8s.io/v1/tokenreviews`) and
//! [`AccessReviewer`] (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`), with their
//! kube-rs implementations. Each call is one request: the budget, the retries and the rate
//! limit around it are [`super::limit`]'s, and the kube-rs client's own retries are turned off
//! ([`review_client_config`]) so that every request sent goes through them.

use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Api;
use kube::api::PostParams;

/// Why a review was not made (the `reason` label; the request is answered 429).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The kind's outstanding reviews are at `--…-max-inflight`.
    InFlight,
    /// The client holds its share of them.
    PerClient,
    /// No token of the rate limit within the wait allowed.
    Rate,
    /// kube-apiserver still answered 429 at the end of the review's budget.
    ApiServer,
}

impl Refusal {
    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::InFlight => "inflight",
            Self::PerClient => "per_client",
            Self::Rate => "rate",
            Self::ApiServer => "apiserver",
        }
    }
}

/// A failed review (never a negative answer: that is a successful call).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API server did not answer within the budget.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error or could not be reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// kube-apiserver answered 429 (its priority and fairness pushing back): slow down, and
    /// try again after `retry_after`. Not a sign that it is unreachable.
    #[error("kube-apiserver asked to slow down (429, retry after {retry_after:?})")]
    SlowDown {
        /// Its `Retry-After` (at least 1 s).
        retry_after: Duration,
    },
    /// The review was not made: one of this server's own bounds refused it
    /// (`super::limit`); the request is answered 429.
    #[error("review not made: {} (retry after {retry_after:?})", .reason.label())]
    Throttled {
        /// Which bound.
        reason: Refusal,
        /// When to try again.
        retry_after: Duration,
    },
    /// The answer had no `status`.
    #[error("the review came back without a status")]
    NoStatus,
    /// The last review found kube-apiserver unreachable and none has been answered since:
    /// this one was not sent (a background review probes).
    #[error("kube-apiserver was unreachable at the last review and has not answered since")]
    Unreachable,
    /// Any other failure (fakes use it).
    #[error("{0}")]
    Other(String),
}

impl ReviewError {
    /// Whether the failure says kube-apiserver could not be reached (no answer within the
    /// budget, a connection error or 5xx) rather than a malformed exchange, an answer asking
    /// to slow down (429), or a review this server did not make.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::Unreachable => true,
            Self::Kube(error) => is_transient(error),
            Self::SlowDown { .. } | Self::Throttled { .. } | Self::NoStatus | Self::Other(_) => false,
        }
    }

    /// Whether another attempt may succeed at once (after the backoff): a connection error
    /// or a 5xx, not the end of the budget.
    pub(crate) fn is_retryable(&self) -> bool {
        matches!(self, Self::Kube(error) if is_transient(error))
    }

    /// For a review refused here or by kube-apiserver's 429: when the request may try again
    /// (it is answered 429 with that `Retry-After`).
    pub(crate) fn retry_after(&self) -> Option<Duration> {
        match self {
            Self::SlowDown { retry_after } | Self::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// One request's error: a 429 is [`ReviewError::SlowDown`] with the Status'
    /// `details.retryAfterSeconds` (what kube-apiserver sends beside `Retry-After`; at least
    /// 1 s), anything else as it is.
    pub(crate) fn from_kube(error: kube::Error) -> Self {
        match error {
            kube::Error::Api(status) if status.code == 429 => {
                let seconds = status.details.as_ref().map_or(0, |d| d.retry_after_seconds);
                Self::SlowDown { retry_after: Duration::from_secs(u64::from(seconds.max(1))) }
            }
            error => Self::Kube(error),
        }
    }
}

/// The configuration of a client that creates reviews: `config` without kube-rs' own retry
/// layer (which retries 429 and 5xx up to 15 times, out of sight of the rate limit).
pub(crate) fn review_client_config(mut config: kube::Config) -> kube::Config {
    config.default_retry = false;
    config
}

/// Creates TokenReviews.
pub trait TokenReviewer: Send + Sync {
    /// Reviews `token` and returns the review's status.
    fn review(&self, token: String) -> BoxFuture<'_, Result<TokenReviewStatus, ReviewError>>;
}

/// Creates SubjectAccessReviews.
pub trait AccessReviewer: Send + Sync {
    /// Reviews `spec` and returns the review's status.
    fn review(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> BoxFuture<'_, Result<SubjectAccessReviewStatus, ReviewError>>;
}

/// Creates review objects through the Kubernetes API, one request per call.
#[derive(Clone)]
pub(crate) struct KubeReviewer<K> {
    api: Api<K>,
}

/// [`TokenReviewer`] through the Kubernetes API.
pub(crate) type KubeTokenReviewer = KubeReviewer<TokenReview>;
/// [`AccessReviewer`] through the Kubernetes API.
pub(crate) type KubeAccessReviewer = KubeReviewer<SubjectAccessReview>;

impl<K> std::fmt::Debug for KubeReviewer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer").finish_non_exhaustive()
    }
}

impl<K> KubeReviewer<K>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + serde::Serialize
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
{
    /// Reviews with `client` (made from [`review_client_config`]).
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { api: Api::all(client) }
    }

    /// Creates `review` and returns what the API server made of it.
    async fn create(&self, review: &K) -> Result<K, ReviewError> {
        self.api.create(&PostParams::default(), review).await.map_err(ReviewError::from_kube)
    }
}

impl TokenReviewer for KubeTokenReviewer {
    fn review(&self, token: String) -> BoxFuture<'_, Result<TokenReviewStatus, ReviewError>> {
        Box::pin(async move {
            let spec = TokenReviewSpec { token: Some(token), audiences: None };
            let review = TokenReview { metadata: Default::default(), spec, status: None };
            self.create(&review).await?.status.ok_or(ReviewError::NoStatus)
        })
    }
}

impl AccessReviewer for KubeAccessReviewer {
    fn review(
        &self,
        spec: SubjectAccessReviewSpec,
    ) -> BoxFuture<'_, Result<SubjectAccessReviewStatus, ReviewError>> {
        Box::pin(async move {
            let review = SubjectAccessReview { metadata: Default::default(), spec, status: None };
            self.create(&review).await?.status.ok_or(ReviewError::NoStatus)
        })
    }
}

/// A connection error or a 5xx: kube-apiserver could not be reached or could not answer.
fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}
