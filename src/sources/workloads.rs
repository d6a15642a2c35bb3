//! The workload objects whose pods an object metric aggregates (`custom.metrics.k8s.io`'s
//! `deployments.apps/NAME/METRIC`): Deployments, StatefulSets, ReplicaSets, DaemonSets and
//! Services, read one by one from kube-apiserver (a GET, never a LIST) and cached for the TTL
//! with single flight, so N HPAs asking about one Deployment cost one read per TTL.
//!
//! What an object contributes is its pod selection: `spec.selector` evaluated as apimachinery's
//! `LabelSelectorAsSelector` does (matchLabels and matchExpressions, ANDed; an empty selector
//! selects everything), and for a Service its `spec.selector` map (absent or empty: a Service
//! without selector, which selects no pod).

use std::collections::BTreeMap;
use std::sync::Arc;

use futures::future::BoxFuture;
use k8s_openapi::api::apps::v1::{DaemonSet, Deployment, ReplicaSet, StatefulSet};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use kube::Api;
use kube::core::{ParseExpressionError, Selector, SelectorExt};

use super::Labels;
use apiserver::{CacheSettings, TtlCache};

/// A resource whose objects select pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum Workload {
    /// `deployments.apps`.
    Deployment,
    /// `statefulsets.apps`.
    StatefulSet,
    /// `replicasets.apps`.
    ReplicaSet,
    /// `daemonsets.apps`.
    DaemonSet,
    /// `services`.
    Service,
}

impl Workload {
    /// Every workload resource, in discovery order.
    pub(crate) const ALL: [Workload; 5] =
        [Self::Deployment, Self::StatefulSet, Self::ReplicaSet, Self::DaemonSet, Self::Service];

    /// The resource as a RESTMapper group-resource string (`deployments.apps`, `services`):
    /// how the HPA names it in custom metrics paths.
    pub(crate) fn resource(self) -> &'static str {
        match self {
            Self::Deployment => "deployments.apps",
            Self::StatefulSet => "statefulsets.apps",
            Self::ReplicaSet => "replicasets.apps",
            Self::DaemonSet => "daemonsets.apps",
            Self::Service => "services",
        }
    }

    /// The workload named by a group-resource string.
    pub(crate) fn from_resource(resource: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|w| w.resource() == resource)
    }

    /// Kind of its objects.
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::Deployment => "Deployment",
            Self::StatefulSet => "StatefulSet",
            Self::ReplicaSet => "ReplicaSet",
            Self::DaemonSet => "DaemonSet",
            Self::Service => "Service",
        }
    }

    /// `apiVersion` of an object reference to it, as the custom metrics adapter library writes
    /// it (`group + "/" + version`, so `/v1` for the core group).
    pub(crate) fn api_version(self) -> &'static str {
        match self {
            Self::Service => "/v1",
            _ => "apps/v1",
        }
    }
}

/// The pods an object selects.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum PodSelection {
    /// None (a Service without selector).
    Nothing,
    /// Those whose labels match.
    Matching(Selector),
}

impl PodSelection {
    /// Whether a pod with `labels` is selected.
    pub(crate) fn selects(&self, labels: &Labels) -> bool {
        match self {
            Self::Nothing => false,
            Self::Matching(selector) => selector.matches(labels),
        }
    }

    fn of_label_selector(selector: LabelSelector) -> Result<Self, ParseExpressionError> {
        Selector::try_from(selector).map(Self::Matching)
    }

    fn of_map(selector: Option<BTreeMap<String, String>>) -> Self {
        match selector {
            Some(map) if !map.is_empty() => Self::Matching(map.into_iter().collect()),
            _ => Self::Nothing,
        }
    }
}

/// Errors reading a workload object.
#[derive(Debug, Clone, thiserror::Error)]
pub(crate) enum WorkloadError {
    /// kube-apiserver could not be reached or refused the read.
    #[error("reading {resource} {namespace}/{name}: {reason}")]
    Unavailable {
        /// The group-resource.
        resource: &'static str,
        /// Namespace of the object.
        namespace: String,
        /// Its name.
        name: String,
        /// What went wrong.
        reason: String,
    },
    /// The object's selector has an operator apimachinery does not know.
    #[error("{resource} {namespace}/{name}: its selector cannot be evaluated: {reason}")]
    BadSelector {
        /// The group-resource.
        resource: &'static str,
        /// Namespace of the object.
        namespace: String,
        /// Its name.
        name: String,
        /// What is wrong with it.
        reason: String,
    },
}

/// What [`WorkloadSource::selection`] answers.
pub(crate) type Selection<'a> = BoxFuture<'a, Result<Option<Arc<PodSelection>>, WorkloadError>>;

/// Reads workload objects' pod selections.
pub(crate) trait WorkloadSource: Send + Sync {
    /// The pods the object `namespace/name` of `workload` selects; `None` when there is no such
    /// object. Implementations cache and make concurrent reads of one object share one call.
    fn selection<'a>(&'a self, workload: Workload, namespace: &'a str, name: &'a str) -> Selection<'a>;
}

/// Name of the cache in `percolator_cache_requests_total`.
const CACHE_NAME: &str = "workloads";

/// Objects kept at most.
const MAX_ENTRIES: u64 = 10_000;

type Key = (Workload, String, String);

/// [`WorkloadSource`] over kube-apiserver.
pub(crate) struct KubeWorkloads {
    client: kube::Client,
    cache: TtlCache<Key, Option<Arc<PodSelection>>>,
}

impl std::fmt::Debug for KubeWorkloads {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeWorkloads").finish_non_exhaustive()
    }
}

impl KubeWorkloads {
    /// Reads with `client`, caching each object's selection for the TTL of `cache`.
    pub(crate) fn new(client: kube::Client, cache: &CacheSettings) -> Self {
        Self { client, cache: TtlCache::new(CACHE_NAME, cache, MAX_ENTRIES) }
    }

    async fn read(
        &self,
        workload: Workload,
        namespace: &str,
        name: &str,
    ) -> Result<Option<Arc<PodSelection>>, WorkloadError> {
        let client = self.client.clone();
        let unavailable = |e: kube::Error| WorkloadError::Unavailable {
            resource: workload.resource(),
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            reason: e.to_string(),
        };
        let selection = match workload {
            Workload::Service => Api::<Service>::namespaced(client, namespace)
                .get_opt(name)
                .await
                .map(|found| found.map(|s| Ok(PodSelection::of_map(s.spec.and_then(|spec| spec.selector))))),
            Workload::Deployment => {
                selector_of::<Deployment>(client, namespace, name, |d| d.spec.map(|s| s.selector)).await
            }
            Workload::StatefulSet => {
                selector_of::<StatefulSet>(client, namespace, name, |s| s.spec.map(|s| s.selector)).await
            }
            Workload::ReplicaSet => {
                selector_of::<ReplicaSet>(client, namespace, name, |r| r.spec.map(|s| s.selector)).await
            }
            Workload::DaemonSet => {
                selector_of::<DaemonSet>(client, namespace, name, |d| d.spec.map(|s| s.selector)).await
            }
        };
        let selection = match selection {
            Ok(selection) => selection,
            Err(e) => return Err(unavailable(e)),
        };
        match selection {
            None => Ok(None),
            Some(Ok(selection)) => Ok(Some(Arc::new(selection))),
            Some(Err(reason)) => Err(WorkloadError::BadSelector {
                resource: workload.resource(),
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                reason: reason.to_string(),
            }),
        }
    }
}

/// The pod selection of the apps object `namespace/name` (its `spec.selector`), `None` when it
/// does not exist.
async fn selector_of<K>(
    client: kube::Client,
    namespace: &str,
    name: &str,
    selector: fn(K) -> Option<LabelSelector>,
) -> Result<Option<Result<PodSelection, ParseExpressionError>>, kube::Error>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + serde::de::DeserializeOwned
        + std::fmt::Debug,
    K::DynamicType: Default,
{
    let object = Api::<K>::namespaced(client, namespace).get_opt(name).await?;
    Ok(object.map(|o| PodSelection::of_label_selector(selector(o).unwrap_or_default())))
}

impl WorkloadSource for KubeWorkloads {
    fn selection<'a>(&'a self, workload: Workload, namespace: &'a str, name: &'a str) -> Selection<'a> {
        Box::pin(async move {
            let key = (workload, namespace.to_owned(), name.to_owned());
            self.cache
                .get_or_try_compute(key, self.read(workload, namespace, name))
                .await
                .map(|(selection, _, _)| selection)
                .map_err(|e| (*e).clone())
        })
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelectorRequirement;

    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> Labels {
        pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
    }

    #[test]
    fn resources_round_trip_and_name_their_kinds() {
        for workload in Workload::ALL {
            assert_eq!(Workload::from_resource(workload.resource()), Some(workload));
        }
        assert_eq!(Workload::from_resource("deployments"), None, "the group is part of the name");
        assert_eq!(Workload::from_resource("pods"), None);
        assert_eq!(Workload::Deployment.api_version(), "apps/v1");
        assert_eq!(Workload::Service.api_version(), "/v1");
    }

    #[test]
    fn selectors_follow_apimachinery() {
        let web_tiered = labels(&[("app", "web"), ("tier", "front")]);
        let worker = labels(&[("app", "worker")]);
        let selector = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![
                LabelSelectorRequirement {
                    key: "app".into(),
                    operator: "In".into(),
                    values: Some(vec!["web".into(), "api".into()]),
                },
                LabelSelectorRequirement { key: "tier".into(), operator: "Exists".into(), values: None },
            ]),
        };
        let selection = PodSelection::of_label_selector(selector).unwrap();
        assert!(selection.selects(&web_tiered));
        assert!(!selection.selects(&labels(&[("app", "web")])));
        assert!(!selection.selects(&worker));

        let empty = PodSelection::of_label_selector(LabelSelector::default()).unwrap();
        assert!(empty.selects(&worker), "an empty LabelSelector selects everything");

        let bad = LabelSelector {
            match_labels: None,
            match_expressions: Some(vec![LabelSelectorRequirement {
                key: "app".into(),
                operator: "Near".into(),
                values: None,
            }]),
        };
        assert!(PodSelection::of_label_selector(bad).is_err());

        assert_eq!(PodSelection::of_map(None), PodSelection::Nothing);
        assert_eq!(PodSelection::of_map(Some(BTreeMap::new())), PodSelection::Nothing);
        let service = PodSelection::of_map(Some([("app".to_owned(), "worker".to_owned())].into()));
        assert!(service.selects(&worker));
        assert!(!service.selects(&web_tiered));
        assert!(!PodSelection::Nothing.selects(&worker));
    }
}
