//! Discovery's description of served resources (`metav1.APIResource` per group-version), as
//! every API module declares what it serves; the HTTP layer turns them into the discovery
//! documents.

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
