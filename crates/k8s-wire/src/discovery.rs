//! Discovery's description of served resources (`metav1.APIResource` per group-version), as
//! every API module declares what it serves; the HTTP layer turns them into the discovery
//! documents. [`GroupService`] is what an API group served by its own module offers the router.

/// One resource of a group-version as discovery publishes it (`metav1.APIResource`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryResource {
    /// Plural name (`podmetricssummaries`), or `<resource>/<subresource>`.
    pub name: String,
    /// Singular name; may be empty.
    pub singular_name: String,
    /// Whether the resource is namespaced.
    pub namespaced: bool,
    /// Kind of one object (the `responseKind` of aggregated discovery).
    pub kind: String,
    /// Verbs (published sorted).
    pub verbs: Vec<String>,
    /// Short names.
    pub short_names: Vec<String>,
    /// Categories.
    pub categories: Vec<String>,
}

/// The resources of one group-version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GroupVersionResources {
    /// API group.
    pub group: String,
    /// API version.
    pub version: String,
    /// Its resources.
    pub resources: Vec<DiscoveryResource>,
}

impl GroupVersionResources {
    /// `<group>/<version>`.
    pub fn group_version_string(&self) -> String {
        format!("{}/{}", self.group, self.version)
    }
}

/// Group-versions whose resources change at runtime (the external metrics of the reloadable
/// configuration).
pub trait DynamicGroupVersions: Send + Sync {
    /// A number that changes whenever [`DynamicGroupVersions::group_versions`] would (the
    /// configuration generation).
    fn generation(&self) -> u64;
    /// The group-versions in force, with the generation they belong to (read from one
    /// configuration snapshot, so the two agree).
    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>);
}

/// An API group served by its own module beside the kinds (`external.metrics.k8s.io`,
/// `custom.metrics.k8s.io`): the router hands it every request under `/apis/<group>/`, and
/// discovery lists its group-versions.
pub trait GroupService: DynamicGroupVersions {
    /// The API group it owns.
    fn group(&self) -> &'static str;
    /// The `resource` label of the request metrics for `info` when it names something served
    /// (a bounded set, unlike arbitrary paths); `None` otherwise.
    fn metric_resource(&self, info: &super::request_info::RequestInfo) -> Option<String>;
    /// Answers a request under `/apis/<group>/` (parsed once on arrival).
    fn serve<'a>(
        &'a self,
        request: &'a super::request_info::ParsedRequest,
        method: &'a http::Method,
        headers: &'a http::HeaderMap,
    ) -> futures::future::BoxFuture<'a, axum::response::Response>;
}
