//! The two upstream calls of delegated auth, behind narrow traits so the middleware is tested
//! with fakes: [`TokenReviewer`] (`POST /apis/authentication.k8s.io/v1/tokenreviews`) and
//! [`AccessReviewer`] (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`), with their
//! kube-rs implementations. Like the generic server's webhooks, each call has a 10 s budget and
//! retries transient failures (connection errors, 429, 5xx) with a 500 ms × 1.5 backoff, at
//! most 5 attempts, within that budget.

use std::future::Future;
use std::time::Duration;

use futures::future::BoxFuture;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, TokenReviewStatus};
use k8s_openapi::api::authorization::v1::{
    SubjectAccessReview, SubjectAccessReviewSpec, SubjectAccessReviewStatus,
};
use kube::Api;
use kube::api::PostParams;

/// Budget of one review, retries included (`TokenRequestTimeout`, the SAR client timeout).
pub(crate) const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);
/// Attempts per review (`DefaultAuthWebhookRetryBackoff`: 5 steps).
const ATTEMPTS: u32 = 5;
/// First retry delay, multiplied by 1.5 after each retry.
const FIRST_BACKOFF: Duration = Duration::from_millis(500);

/// A failed review call (never a negative answer: that is a successful call).
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    /// The API server did not answer within the budget.
    #[error("no answer within {0:?}")]
    Timeout(Duration),
    /// The API server answered with an error or could not be reached.
    #[error(transparent)]
    Kube(#[from] kube::Error),
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
    /// budget, a connection error, 429 or 5xx) rather than a malformed exchange.
    pub fn is_unreachable(&self) -> bool {
        match self {
            Self::Timeout(_) | Self::Unreachable => true,
            Self::Kube(error) => is_transient(error),
            Self::NoStatus | Self::Other(_) => false,
        }
    }
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

/// Creates review objects through the Kubernetes API, with the budget and retries above.
#[derive(Clone)]
pub(crate) struct KubeReviewer<K> {
    api: Api<K>,
    timeout: Duration,
}

/// [`TokenReviewer`] through the Kubernetes API.
pub(crate) type KubeTokenReviewer = KubeReviewer<TokenReview>;
/// [`AccessReviewer`] through the Kubernetes API.
pub(crate) type KubeAccessReviewer = KubeReviewer<SubjectAccessReview>;

impl<K> std::fmt::Debug for KubeReviewer<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeReviewer").field("timeout", &self.timeout).finish_non_exhaustive()
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
    /// Reviews with `client`.
    pub(crate) fn new(client: kube::Client) -> Self {
        Self { api: Api::all(client), timeout: REVIEW_TIMEOUT }
    }

    /// Creates `review` and returns what the API server made of it.
    async fn create(&self, review: &K) -> Result<K, ReviewError> {
        let params = PostParams::default();
        with_retries(self.timeout, || self.api.create(&params, review)).await
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

/// Calls `call` until it succeeds, fails for good, or the budget is spent.
async fn with_retries<T, F, Fut>(budget: Duration, mut call: F) -> Result<T, ReviewError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, kube::Error>>,
{
    let attempts = async {
        let mut delay = FIRST_BACKOFF;
        let mut attempt = 1;
        loop {
            match call().await {
                Ok(value) => return Ok(value),
                Err(error) if attempt < ATTEMPTS && is_transient(&error) => {
                    tracing::debug!(%error, attempt, "review failed; retrying");
                    tokio::time::sleep(delay).await;
                    delay = delay.mul_f64(1.5);
                    attempt += 1;
                }
                Err(error) => return Err(ReviewError::Kube(error)),
            }
        }
    };
    tokio::time::timeout(budget, attempts).await.map_err(|_| ReviewError::Timeout(budget))?
}

fn is_transient(error: &kube::Error) -> bool {
    match error {
        kube::Error::Api(status) => status.code == 429 || status.code >= 500,
        kube::Error::HyperError(_) | kube::Error::Service(_) => true,
        _ => false,
    }
}
