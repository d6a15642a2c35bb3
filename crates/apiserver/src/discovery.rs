//! Discovery documents, all serialized once at startup (handlers only pick bytes):
//!
//! - `GET /api`: an empty `APIVersions` (200; docs/wire.md, "Discovery");
//! - `GET /apis`: legacy `APIGroupList`, or aggregated discovery `APIGroupDiscoveryList`
//!   (`apidiscovery.k8s.io/v2` or `v2beta1`, chosen by `Accept`) with its content type, a quoted
//!   upper-case hex SHA-512 `ETag`, `Vary: Accept`, `Cache-Control: public` and a 304 for a
//!   matching `If-None-Match` (docs/wire.md, "Discovery");
//! - `GET /apis/<group>`: `APIGroup` (§1.4);
//! - `GET /apis/<group>/<version>`: `APIResourceList` (§1.5), the availability probe;
//! - `GET /version`: `version.Info`.
//!
//! Built from the served kinds plus extra group-versions (e.g. `external.metrics.k8s.io`).
//! The documents in force are rebuilt and swapped (with new ETags) when the kinds or the
//! resources of a [`DynamicGroupVersions`] change.

use std::borrow::Cow;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use serde_json::{Value, json};

use crate::StatusResponse;
use crate::kind::LiveKinds;
use crate::kind::{GroupVersion, ServedKind};
use k8s_wire::ApiError;
use k8s_wire::{DiscoveryResource, GroupVersionResources};
use k8s_wire::{Endpoint, Representation, negotiate_headers};

/// Who the server is, as its documents say it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// `info.title` of the OpenAPI documents.
    pub title: Cow<'static, str>,
    /// Its version, `MAJOR.MINOR.PATCH`: `/version` (`gitVersion` is `v` + it) and the
    /// `info.version` of the OpenAPI v2 document.
    pub version: Cow<'static, str>,
    /// The server's own group-version: listed first in discovery even while no kind of it is
    /// served (declared kinds may come later), and the OpenAPI v3 document of a server that
    /// serves no kind.
    pub home: Option<GroupVersion>,
}

impl ServerInfo {
    /// `title` at `version` (`env!("CARGO_PKG_VERSION")`), without a home group-version.
    pub fn new(title: impl Into<Cow<'static, str>>, version: impl Into<Cow<'static, str>>) -> Self {
        Self { title: title.into(), version: version.into(), home: None }
    }

    /// The same, with `home` as its own group-version.
    pub fn with_home(self, home: GroupVersion) -> Self {
        Self { home: Some(home), ..self }
    }
}

impl Default for ServerInfo {
    /// This crate's name and version.
    fn default() -> Self {
        Self::new(env!("CARGO_PKG_NAME"), env!("CARGO_PKG_VERSION"))
    }
}

/// Group-versions whose resources change at runtime (an API group whose resources follow a
/// reloadable configuration).
pub trait DynamicGroupVersions: Send + Sync {
    /// A number that changes whenever [`DynamicGroupVersions::group_versions`] would (the
    /// configuration generation).
    fn generation(&self) -> u64;
    /// The group-versions in force, with the generation they belong to (read from one
    /// configuration snapshot, so the two agree).
    fn group_versions(&self) -> (u64, Vec<GroupVersionResources>);
}

/// The group-versions of the served kinds (`home` first when there is one, then any other the
/// kinds name, in the order they first appear), each with one read-only (`get`, `list`)
/// resource per kind.
pub(crate) fn kinds_group_versions(
    home: Option<GroupVersion>,
    kinds: &[Arc<dyn ServedKind>],
) -> Vec<GroupVersionResources> {
    let mut gvs: Vec<GroupVersion> = home.into_iter().collect();
    for kind in kinds {
        if !gvs.contains(&kind.info().gv) {
            gvs.push(kind.info().gv);
        }
    }
    gvs.into_iter().map(|gv| kinds_group_version(gv, kinds)).collect()
}

/// `gv` with one read-only (`get`, `list`) resource per served kind of it.
fn kinds_group_version(gv: GroupVersion, kinds: &[Arc<dyn ServedKind>]) -> GroupVersionResources {
    let resources = kinds
        .iter()
        .filter(|k| k.info().gv == gv)
        .map(|k| {
            let info = k.info();
            DiscoveryResource {
                name: info.plural.to_string(),
                singular_name: info.singular.to_string(),
                namespaced: info.namespaced,
                kind: info.kind.to_string(),
                verbs: vec!["get".to_owned(), "list".to_owned()],
                short_names: info.short_names.iter().map(|s| s.to_string()).collect(),
                categories: info.categories.iter().map(|s| s.to_string()).collect(),
            }
        })
        .collect();
    GroupVersionResources { group: gv.group.to_owned(), version: gv.version.to_owned(), resources }
}

/// A body with its precomputed `ETag`.
#[derive(Debug, Clone)]
struct Tagged {
    body: Bytes,
    etag: HeaderValue,
}

impl Tagged {
    fn new(body: Vec<u8>) -> Self {
        let etag = HeaderValue::from_str(&format!("\"{}\"", sha512_hex(&body)))
            .unwrap_or_else(|_| HeaderValue::from_static("\"\""));
        Self { body: Bytes::from(body), etag }
    }
}

/// Upper-case hex SHA-512, as kube's discovery (`%X`) and kube-openapi compute ETags and hashes.
pub(crate) fn sha512_hex(data: &[u8]) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA512, data);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect()
}

/// Content type of aggregated discovery v2.
pub(crate) const DISCOVERY_V2_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList";
/// Content type of aggregated discovery v2beta1.
pub(crate) const DISCOVERY_V2BETA1_CONTENT_TYPE: &str =
    "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList";

/// Every discovery document, serialized.
#[derive(Debug, Clone)]
pub struct Discovery {
    api_versions: Bytes,
    group_list: Bytes,
    v2: Tagged,
    v2beta1: Tagged,
    groups: HashMap<String, Bytes>,
    group_versions: HashMap<(String, String), Bytes>,
    version: Bytes,
}

impl Discovery {
    /// Serializes every document of `server` for the served kinds' group-versions followed by
    /// `extra` group-versions (in preference order within a group).
    pub fn new(server: &ServerInfo, kinds: &[Arc<dyn ServedKind>], extra: &[GroupVersionResources]) -> Self {
        let mut gvs = kinds_group_versions(server.home, kinds);
        gvs.extend(extra.iter().cloned());
        for gv in &mut gvs {
            for r in &mut gv.resources {
                r.verbs.sort();
            }
        }

        // Groups in first-seen order, each with its versions in order.
        let mut groups: Vec<(String, Vec<&GroupVersionResources>)> = Vec::new();
        for gv in &gvs {
            match groups.iter_mut().find(|(g, _)| *g == gv.group) {
                Some((_, versions)) => versions.push(gv),
                None => groups.push((gv.group.clone(), vec![gv])),
            }
        }

        let api_group = |name: &str, versions: &[&GroupVersionResources]| {
            let vs: Vec<Value> = versions
                .iter()
                .map(|gv| json!({"groupVersion": gv.group_version_string(), "version": gv.version}))
                .collect();
            let preferred = vs.first().cloned().unwrap_or(Value::Null);
            json!({"name": name, "versions": vs, "preferredVersion": preferred})
        };

        let group_list = json!({
            "kind": "APIGroupList",
            "apiVersion": "v1",
            "groups": groups.iter().map(|(g, vs)| api_group(g, vs)).collect::<Vec<_>>(),
        });

        let group_docs = groups
            .iter()
            .map(|(g, vs)| {
                let mut doc = json!({"kind": "APIGroup", "apiVersion": "v1"});
                if let (Value::Object(d), Value::Object(body)) = (&mut doc, api_group(g, vs)) {
                    d.extend(body);
                }
                (g.clone(), to_bytes(&doc))
            })
            .collect();

        let group_versions = gvs
            .iter()
            .map(|gv| {
                let doc = json!({
                    "kind": "APIResourceList",
                    "apiVersion": "v1",
                    "groupVersion": gv.group_version_string(),
                    "resources": gv.resources.iter().map(api_resource).collect::<Vec<_>>(),
                });
                ((gv.group.clone(), gv.version.clone()), to_bytes(&doc))
            })
            .collect();

        let aggregated = |api_version: &str| {
            json!({
                "kind": "APIGroupDiscoveryList",
                "apiVersion": api_version,
                "metadata": {},
                "items": groups.iter().map(|(g, vs)| json!({
                    "metadata": {"name": g},
                    "versions": vs.iter().map(|gv| json!({
                        "version": gv.version,
                        "resources": aggregated_resources(gv),
                        "freshness": "Current",
                    })).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })
        };

        Self {
            api_versions: Bytes::from_static(
                br#"{"kind":"APIVersions","versions":[],"serverAddressByClientCIDRs":null}"#,
            ),
            group_list: to_bytes(&group_list),
            v2: Tagged::new(aggregated("apidiscovery.k8s.io/v2").to_string().into_bytes()),
            v2beta1: Tagged::new(aggregated("apidiscovery.k8s.io/v2beta1").to_string().into_bytes()),
            groups: group_docs,
            group_versions,
            version: to_bytes(&version_info(&server.version)),
        }
    }

    /// `GET /api`.
    pub fn api(&self, headers: &HeaderMap) -> Response {
        match negotiate_headers(headers, Endpoint::Discovery) {
            // There is no core group: aggregated discovery of /api is an empty list too.
            Ok(Representation::DiscoveryV2) => {
                aggregated_empty("apidiscovery.k8s.io/v2", DISCOVERY_V2_CONTENT_TYPE)
            }
            Ok(Representation::DiscoveryV2Beta1) => {
                aggregated_empty("apidiscovery.k8s.io/v2beta1", DISCOVERY_V2BETA1_CONTENT_TYPE)
            }
            Ok(_) => json_response(self.api_versions.clone()),
            Err(e) => e.into_response(),
        }
    }

    /// `GET /apis`.
    pub fn apis(&self, headers: &HeaderMap) -> Response {
        match negotiate_headers(headers, Endpoint::Discovery) {
            Ok(Representation::DiscoveryV2) => serve_tagged(&self.v2, DISCOVERY_V2_CONTENT_TYPE, headers),
            Ok(Representation::DiscoveryV2Beta1) => {
                serve_tagged(&self.v2beta1, DISCOVERY_V2BETA1_CONTENT_TYPE, headers)
            }
            Ok(_) => json_response(self.group_list.clone()),
            Err(e) => e.into_response(),
        }
    }

    /// `GET /apis/<group>`; 404 for a group not served.
    pub fn group(&self, group: &str, headers: &HeaderMap) -> Response {
        let Some(body) = self.groups.get(group) else {
            return ApiError::PathNotFound.into_response();
        };
        match negotiate_headers(headers, Endpoint::Plain) {
            Ok(_) => json_response(body.clone()),
            Err(e) => e.into_response(),
        }
    }

    /// Whether `group/version` is served.
    pub fn has_group_version(&self, group: &str, version: &str) -> bool {
        self.group_versions.contains_key(&(group.to_owned(), version.to_owned()))
    }

    /// `GET /apis/<group>/<version>`; 404 for a group-version not served.
    pub fn group_version(&self, group: &str, version: &str, headers: &HeaderMap) -> Response {
        let Some(body) = self.group_versions.get(&(group.to_owned(), version.to_owned())) else {
            return ApiError::PathNotFound.into_response();
        };
        match negotiate_headers(headers, Endpoint::Plain) {
            Ok(_) => json_response(body.clone()),
            Err(e) => e.into_response(),
        }
    }

    /// `GET /version` (always JSON, like kube-apiserver's version handler).
    pub fn version(&self) -> Response {
        json_response(self.version.clone())
    }
}

/// The discovery documents in force. Every read compares the generations of the kinds
/// ([`LiveKinds`]: declared kinds follow the configuration) and of the [`DynamicGroupVersions`]
/// with those the documents were built for, and rebuilds them when either moved, so discovery
/// never lags the configuration that requests are served with (a rebuild is a few small JSON
/// documents and their SHA-512, well under a millisecond).
pub(crate) struct LiveDiscovery {
    server: Arc<ServerInfo>,
    kinds: Arc<LiveKinds>,
    extra: Vec<GroupVersionResources>,
    dynamic: Vec<Arc<dyn DynamicGroupVersions>>,
    built: RwLock<(Generations, Arc<Discovery>)>,
}

/// The generations of the kinds and of the dynamic group-versions (their sum: each only grows).
type Generations = (u64, u64);

impl std::fmt::Debug for LiveDiscovery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveDiscovery").field("extra", &self.extra).finish_non_exhaustive()
    }
}

impl LiveDiscovery {
    /// Documents for `kinds`, then the static `extra` group-versions, then the `dynamic` ones.
    pub(crate) fn new(
        server: Arc<ServerInfo>,
        kinds: Arc<LiveKinds>,
        extra: Vec<GroupVersionResources>,
        dynamic: Vec<Arc<dyn DynamicGroupVersions>>,
    ) -> Self {
        let (generations, built) = Self::build(&server, &kinds, &extra, &dynamic);
        Self { server, kinds, extra, dynamic, built: RwLock::new((generations, Arc::new(built))) }
    }

    fn build(
        server: &ServerInfo,
        kinds: &LiveKinds,
        extra: &[GroupVersionResources],
        dynamic: &[Arc<dyn DynamicGroupVersions>],
    ) -> (Generations, Discovery) {
        let kinds = kinds.current();
        let mut all = extra.to_vec();
        let mut generation = 0;
        for d in dynamic {
            let (g, gvs) = d.group_versions();
            generation += g;
            all.extend(gvs);
        }
        ((kinds.generation, generation), Discovery::new(server, kinds.kinds(), &all))
    }

    fn built(&self) -> (Generations, Arc<Discovery>) {
        match self.built.read() {
            Ok(built) => built.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The documents for the configuration in force.
    pub(crate) fn current(&self) -> Arc<Discovery> {
        let (built_generations, built) = self.built();
        let now = (self.kinds.current().generation, self.dynamic.iter().map(|d| d.generation()).sum());
        if now == built_generations {
            return built;
        }
        let (generations, fresh) = Self::build(&self.server, &self.kinds, &self.extra, &self.dynamic);
        let fresh = Arc::new(fresh);
        let mut slot = match self.built.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        // Generations only grow: never replace newer documents built by a concurrent reader.
        if generations.0 >= slot.0.0 && generations.1 >= slot.0.1 {
            *slot = (generations, fresh.clone());
        }
        fresh
    }
}

fn to_bytes(v: &Value) -> Bytes {
    Bytes::from(v.to_string().into_bytes())
}

fn api_resource(r: &DiscoveryResource) -> Value {
    let v = json!({
        "name": r.name,
        "singularName": r.singular_name,
        "namespaced": r.namespaced,
        "kind": r.kind,
        "verbs": r.verbs,
    });
    with_names(v, r)
}

/// Adds the short names and categories a resource has (both are omitted when empty).
fn with_names(mut v: Value, r: &DiscoveryResource) -> Value {
    if let Value::Object(m) = &mut v {
        if !r.short_names.is_empty() {
            m.insert("shortNames".into(), json!(r.short_names));
        }
        if !r.categories.is_empty() {
            m.insert("categories".into(), json!(r.categories));
        }
    }
    v
}

/// The `apidiscovery.k8s.io` `APIResourceDiscovery` list of `gv`, as kube-apiserver's
/// `ConvertGroupVersionIntoToDiscovery` converts the legacy list: top-level resources first, in
/// order; then each `<resource>/<subresource>` entry (the custom metrics, `pods/<metric>`)
/// nested under its parent, which is created (scope of the subresource, empty `responseKind`,
/// no verbs) when the list has no such resource.
fn aggregated_resources(gv: &GroupVersionResources) -> Vec<Value> {
    let scope = |r: &DiscoveryResource| if r.namespaced { "Namespaced" } else { "Cluster" };
    let mut out: Vec<Value> = gv
        .resources
        .iter()
        .filter(|r| !r.name.contains('/'))
        .map(|r| {
            let v = json!({
                "resource": r.name,
                "responseKind": {"group": gv.group, "version": gv.version, "kind": r.kind},
                "scope": scope(r),
                "singularResource": r.singular_name,
                "verbs": r.verbs,
            });
            with_names(v, r)
        })
        .collect();
    for r in &gv.resources {
        let Some((parent, subresource)) = r.name.split_once('/') else { continue };
        let index = match out.iter().position(|p| p["resource"] == parent && p["scope"] == scope(r)) {
            Some(index) => index,
            None => {
                out.push(json!({
                    "resource": parent,
                    "responseKind": {"group": "", "version": "", "kind": ""},
                    "scope": scope(r),
                    "singularResource": "",
                    "verbs": null,
                }));
                out.len() - 1
            }
        };
        let entry = json!({
            "subresource": subresource,
            "responseKind": {"group": gv.group, "version": gv.version, "kind": r.kind},
            "verbs": r.verbs,
        });
        match out[index].get_mut("subresources").and_then(Value::as_array_mut) {
            Some(list) => list.push(entry),
            None => {
                if let Value::Object(parent) = &mut out[index] {
                    parent.insert("subresources".into(), json!([entry]));
                }
            }
        }
    }
    out
}

/// `version.Info` of the server at `version` (`MAJOR.MINOR.PATCH`).
fn version_info(version: &str) -> Value {
    let mut parts = version.split('.');
    let (major, minor) = (parts.next().unwrap_or_default(), parts.next().unwrap_or_default());
    json!({
        "major": major,
        "minor": minor,
        "gitVersion": format!("v{version}"),
        "gitCommit": "",
        "gitTreeState": "",
        "buildDate": "",
        "goVersion": "n/a",
        "compiler": "rustc",
        "platform": format!("{}/{}", std::env::consts::OS, go_arch(std::env::consts::ARCH)),
    })
}

/// Go's `GOARCH` spelling of a Rust target architecture.
fn go_arch(arch: &str) -> &str {
    match arch {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        "x86" => "386",
        "powerpc64" => "ppc64",
        "loongarch64" => "loong64",
        other => other,
    }
}

fn json_response(body: Bytes) -> Response {
    ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], body).into_response()
}

fn aggregated_empty(api_version: &str, content_type: &'static str) -> Response {
    let body =
        json!({"kind": "APIGroupDiscoveryList", "apiVersion": api_version, "metadata": {}, "items": []});
    ([(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], body.to_string()).into_response()
}

/// Whether `If-None-Match` names `etag` (exactly, in a list, or `*`).
pub(crate) fn if_none_match(headers: &HeaderMap, etag: &HeaderValue) -> bool {
    let Ok(etag) = etag.to_str() else {
        return false;
    };
    headers
        .get_all(header::IF_NONE_MATCH)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|t| t.trim())
        .any(|t| t == etag || t == "*" || t.strip_prefix("W/") == Some(etag))
}

fn serve_tagged(tagged: &Tagged, content_type: &'static str, headers: &HeaderMap) -> Response {
    let common = [
        (header::ETAG, tagged.etag.clone()),
        (header::VARY, HeaderValue::from_static("Accept")),
        (header::CACHE_CONTROL, HeaderValue::from_static("public")),
    ];
    if if_none_match(headers, &tagged.etag) {
        return (StatusCode::NOT_MODIFIED, common).into_response();
    }
    (common, [(header::CONTENT_TYPE, HeaderValue::from_static(content_type))], tagged.body.clone())
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha512_matches_known_vector() {
        assert_eq!(
            sha512_hex(b"abc"),
            "DDAF35A193617ABACC417349AE20413112E6FA4E89A97EA20A9EEEE64B55D39A2192992A274FC1A836BA3C23A3FEEBBD454D4423643CE80E2A9AC94FA54CA49F"
        );
    }

    #[test]
    fn go_arch_names() {
        assert_eq!(go_arch("x86_64"), "amd64");
        assert_eq!(go_arch("aarch64"), "arm64");
        assert_eq!(go_arch("riscv64"), "riscv64");
    }

    #[test]
    fn if_none_match_forms() {
        let etag = HeaderValue::from_static("\"AB\"");
        let mk = |v: &'static str| {
            let mut h = HeaderMap::new();
            h.insert(header::IF_NONE_MATCH, HeaderValue::from_static(v));
            h
        };
        assert!(if_none_match(&mk("\"AB\""), &etag));
        assert!(if_none_match(&mk("\"X\", \"AB\""), &etag));
        assert!(if_none_match(&mk("*"), &etag));
        assert!(if_none_match(&mk("W/\"AB\""), &etag));
        assert!(!if_none_match(&mk("AB"), &etag));
        assert!(!if_none_match(&HeaderMap::new(), &etag));
    }
}
