//! Kubernetes `RequestInfo` for any request (`apiserver/pkg/endpoints/request/requestinfo.go`,
//! docs/wire.md, "Resource requests"): verb (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
//! `deletecollection`, or the lower-cased method for non-resource paths), API group/version,
//! namespace, resource, subresource and name, with `fieldSelector=metadata.name=x` setting the
//! name of a list/watch for authorization, and the raw `labelSelector`/`fieldSelector` of a
//! list, watch or deletecollection (the SubjectAccessReview's selector attributes). The
//! resource endpoints dispatch on it, the authorizer turns it into SubjectAccessReview
//! attributes, and metrics use it as labels.
//!
//! Also the raw query parsing shared by every endpoint ([`QueryParams`]), so that no request
//! is ever rejected by an extractor with a plain-text body.

use std::borrow::Cow;

use http::Method;

use super::selectors::{FIELD_NAME, FieldSelector, LabelSelector};

/// A parsed query string: pairs in order, percent- and `+`-decoded
/// (`url::form_urlencoded`, the same splitting as Go's `url.ParseQuery`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueryParams {
    pairs: Vec<(String, String)>,
}

impl QueryParams {
    /// Parses the raw query (without `?`); `None` gives an empty set.
    pub fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .map(|q| {
                url::form_urlencoded::parse(q.as_bytes())
                    .map(|(k, v)| (k.into_owned(), v.into_owned()))
                    .collect()
            })
            .unwrap_or_default();
        Self { pairs }
    }

    /// The first value of `key` (how Go's `Values.Get` and kube's parameter codec read it).
    pub fn get(&self, key: &str) -> Option<&str> {
        self.pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    /// Whether `watch` is requested: present and not `0`/`false` (kube's
    /// `Convert_Slice_string_To_bool`: any other value, even empty, is true).
    pub fn watch(&self) -> bool {
        self.get("watch").is_some_and(|v| v != "0" && !v.eq_ignore_ascii_case("false"))
    }
}

/// What kube-apiserver knows about a request once its path and query are parsed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RequestInfo {
    /// Whether this is a request for a resource (as opposed to a non-resource path such as
    /// `/apis/<g>/<v>`, `/openapi/v2` or `/healthz`).
    pub is_resource_request: bool,
    /// The Kubernetes verb for resource requests, the lower-cased HTTP method otherwise
    /// (borrowed for every standard method and verb).
    pub verb: Cow<'static, str>,
    /// `api` or `apis` for resource requests.
    pub api_prefix: &'static str,
    /// API group (empty for the core group).
    pub api_group: String,
    /// API version.
    pub api_version: String,
    /// Namespace, empty for cluster-scoped requests.
    pub namespace: String,
    /// Resource (plural).
    pub resource: String,
    /// Subresource, if any.
    pub subresource: String,
    /// Object name; for list/watch the one pinned by `fieldSelector=metadata.name=...`.
    pub name: String,
    /// Whether the path names the object (`.../<resource>/<name>...`), as opposed to a name
    /// pinned by `fieldSelector=metadata.name=...`.
    pub named_in_path: bool,
    /// For `list`, `watch` and `deletecollection`: the first `labelSelector` query value as
    /// sent (decoded, not parsed), empty when absent. Read even when other list options do
    /// not decode, as k8s.io/apiserver does.
    pub label_selector: String,
    /// For `list`, `watch` and `deletecollection`: the first `fieldSelector` query value, as
    /// [`label_selector`](Self::label_selector).
    pub field_selector: String,
}

/// A path that looks like a resource request but cannot be interpreted
/// (`/apis/<g>/<v>/watch` with nothing after it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unable to determine kind and namespace from url {0}")]
pub struct RequestInfoError(pub String);

/// Splits a path like Go's `splitPath` (trim `/`, split on `/`), percent-decoding each
/// segment. An encoded `/` stays inside its segment (and then fails name validation).
pub fn split_path(path: &str) -> Vec<Cow<'_, str>> {
    let trimmed = path.trim_matches('/');
    if trimmed.is_empty() {
        return Vec::new();
    }
    trimmed.split('/').map(percent_decode).collect()
}

/// Percent-decodes a path segment (invalid escapes are kept verbatim, invalid UTF-8 is
/// replaced), never failing.
pub fn percent_decode(segment: &str) -> Cow<'_, str> {
    percent_encoding::percent_decode_str(segment).decode_utf8_lossy()
}

const SPECIAL_VERBS: &[&str] = &["proxy", "watch"];
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

impl RequestInfo {
    /// Derives the RequestInfo of `method path?query` exactly as kube-apiserver's
    /// `RequestInfoFactory` does for the prefixes `api` (groupless) and `apis`.
    pub fn new(method: &Method, path: &str, query: Option<&str>) -> Result<Self, RequestInfoError> {
        Self::with_query(method, path, &QueryParams::parse(query))
    }

    /// [`RequestInfo::new`] with the query already parsed (each request's is parsed once).
    pub fn with_query(method: &Method, path: &str, query: &QueryParams) -> Result<Self, RequestInfoError> {
        Self::from_segments(method, path, &split_path(path), query)
    }

    /// [`RequestInfo::with_query`] with the path already split ([`split_path`]).
    fn from_segments<S: AsRef<str>>(
        method: &Method,
        path: &str,
        segments: &[S],
        query: &QueryParams,
    ) -> Result<Self, RequestInfoError> {
        let mut info = RequestInfo::default();
        let non_resource = |mut info: RequestInfo| {
            info.verb = lower_case_method(method);
            Ok(info)
        };
        let mut parts: &[S] = segments;
        let prefix = match parts.first().map(AsRef::as_ref) {
            Some("api") if parts.len() >= 3 => "api",
            Some("apis") if parts.len() >= 3 => "apis",
            _ => return non_resource(info),
        };
        info.api_prefix = prefix;
        parts = &parts[1..];
        if prefix == "apis" {
            // `/apis/<g>/<v>` is discovery: a resource request needs one more segment.
            if parts.len() < 3 {
                return non_resource(info);
            }
            info.api_group = parts[0].as_ref().to_owned();
            parts = &parts[1..];
        }
        info.is_resource_request = true;
        info.api_version = parts[0].as_ref().to_owned();
        parts = &parts[1..];

        let mut via_special_verb = false;
        if let Some(verb) = parts.first().and_then(|p| SPECIAL_VERBS.iter().find(|v| **v == p.as_ref())) {
            if parts.len() < 2 {
                return Err(RequestInfoError(path.to_owned()));
            }
            info.verb = Cow::Borrowed(verb);
            parts = &parts[1..];
            via_special_verb = true;
        } else {
            info.verb = match *method {
                Method::POST => "create",
                Method::GET | Method::HEAD => "get",
                Method::PUT => "update",
                Method::PATCH => "patch",
                Method::DELETE => "delete",
                _ => "",
            }
            .into();
        }

        if parts.first().is_some_and(|p| p.as_ref() == "namespaces") && parts.len() > 1 {
            info.namespace = parts[1].as_ref().to_owned();
            if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2].as_ref()) {
                parts = &parts[2..];
            }
        }

        let proxy = via_special_verb && info.verb == "proxy";
        if parts.len() >= 3 && !proxy {
            info.subresource = parts[2].as_ref().to_owned();
        }
        if parts.len() >= 2 {
            info.name = parts[1].as_ref().to_owned();
            info.named_in_path = true;
        }
        if let Some(resource) = parts.first() {
            info.resource = resource.as_ref().to_owned();
        }

        if info.name.is_empty() && info.verb == "get" {
            match decode_list_options(query) {
                Some(opts) => {
                    info.verb = if opts.watch { "watch" } else { "list" }.into();
                    if let Some(name) = opts.field_name.filter(|n| is_valid_path_segment_name(n)) {
                        info.name = name;
                    }
                }
                // A parameter that does not decode: still a list (or a watch), without a name.
                None => info.verb = if query.watch() { "watch" } else { "list" }.into(),
            }
        }
        if info.name.is_empty() && info.verb == "delete" {
            info.verb = "deletecollection".into();
        }
        // `requestinfo.go`: the selectors of the verbs that use them, straight from the query.
        if matches!(&*info.verb, "list" | "watch" | "deletecollection") {
            if let Some(selector) = query.get("labelSelector") {
                info.label_selector = selector.to_owned();
            }
            if let Some(selector) = query.get("fieldSelector") {
                info.field_selector = selector.to_owned();
            }
        }
        Ok(info)
    }
}

/// The method in lower case, as Go's `strings.ToLower(req.Method)` (borrowed for the standard
/// methods).
pub fn lower_case_method(method: &Method) -> Cow<'static, str> {
    const STANDARD: &[(Method, &str)] = &[
        (Method::GET, "get"),
        (Method::HEAD, "head"),
        (Method::POST, "post"),
        (Method::PUT, "put"),
        (Method::PATCH, "patch"),
        (Method::DELETE, "delete"),
        (Method::OPTIONS, "options"),
        (Method::CONNECT, "connect"),
        (Method::TRACE, "trace"),
    ];
    match STANDARD.iter().find(|(m, _)| m == method) {
        Some((_, lower)) => Cow::Borrowed(lower),
        None => Cow::Owned(method.as_str().to_ascii_lowercase()),
    }
}

struct ListOptionsLite {
    watch: bool,
    field_name: Option<String>,
}

/// The part of `ListOptions` decoding that can fail or matters for RequestInfo.
fn decode_list_options(query: &QueryParams) -> Option<ListOptionsLite> {
    if let Some(selector) = query.get("labelSelector") {
        LabelSelector::parse(selector).ok()?;
    }
    for int_param in ["limit", "timeoutSeconds"] {
        if let Some(v) = query.get(int_param) {
            v.parse::<i64>().ok()?;
        }
    }
    let field_name = match query.get("fieldSelector") {
        Some(s) => FieldSelector::parse(s).ok()?.requires_exact_match(FIELD_NAME).map(str::to_owned),
        None => None,
    };
    Some(ListOptionsLite { watch: query.watch(), field_name })
}

/// `path.IsValidPathSegmentName`: not `.`/`..`, no `/` or `%`.
fn is_valid_path_segment_name(name: &str) -> bool {
    name != "." && name != ".." && !name.contains('/') && !name.contains('%')
}

/// A request as every stage after its arrival reads it: parsed once, when it arrives (the
/// router's outermost layer stores it in the request's extensions), then read by metrics,
/// authentication, authorization, dispatch and the API handlers.
#[derive(Debug, Clone)]
pub struct ParsedRequest {
    /// Its RequestInfo; `None` when the path cannot be interpreted (then a 404).
    pub info: Option<RequestInfo>,
    /// The path segments, percent-decoded ([`split_path`]), one after the other ...
    decoded: String,
    /// ... and where each ends in `decoded`.
    ends: Vec<usize>,
    /// The query parameters.
    pub query: QueryParams,
}

impl ParsedRequest {
    /// Parses `method path?query`.
    pub fn new(method: &Method, path: &str, query: Option<&str>) -> Self {
        let query = QueryParams::parse(query);
        let segments = split_path(path);
        let info = RequestInfo::from_segments(method, path, &segments, &query).ok();
        let mut decoded = String::with_capacity(path.len());
        let mut ends = Vec::with_capacity(segments.len());
        for segment in &segments {
            decoded.push_str(segment);
            ends.push(decoded.len());
        }
        Self { info, decoded, ends, query }
    }

    /// The path segments as string slices, for matching.
    pub fn segs(&self) -> Vec<&str> {
        let mut start = 0;
        self.ends
            .iter()
            .map(|&end| {
                let segment = self.decoded.get(start..end).unwrap_or_default();
                start = end;
                segment
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ri(method: Method, path_and_query: &str) -> RequestInfo {
        let (path, query) = match path_and_query.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (path_and_query, None),
        };
        RequestInfo::new(&method, path, query).unwrap()
    }

    /// `kind verb group version namespace resource name subresource`, `-` for an empty field.
    fn summary(i: &RequestInfo) -> String {
        let kind = if i.is_resource_request { "resource" } else { "non-resource" };
        let fields =
            [&*i.verb, &i.api_group, &i.api_version, &i.namespace, &i.resource, &i.name, &i.subresource];
        format!("{kind} {}", fields.map(|f| if f.is_empty() { "-" } else { f }).join(" "))
    }

    const G: &str = "stats.une-tasse-de.cafe";

    /// The table of k8s.io/apiserver's request_info_test.go that applies to a read-only server:
    /// `METHOD PATH  kind verb group version namespace resource name subresource`, `-` for empty.
    const CONTRACT_TABLE: &str = "
        GET     /apis/g/v/widgets                                           resource list g v - widgets - -
        GET     /apis/g/v/namespaces/ns1/widgets                            resource list g v ns1 widgets - -
        GET     /apis/g/v/namespaces/ns1/widgets/w1                         resource get g v ns1 widgets w1 -
        GET     /apis/g/v/widgets/w1                                        resource get g v - widgets w1 -
        GET     /apis/g/v/namespaces/ns1/widgets/w1/status                  resource get g v ns1 widgets w1 status
        GET     /apis/g/v/widgets?watch=true                                resource watch g v - widgets - -
        GET     /apis/g/v/widgets?watch=1                                   resource watch g v - widgets - -
        GET     /apis/g/v/widgets?watch=false                               resource list g v - widgets - -
        GET     /apis/g/v/widgets?watch=0                                   resource list g v - widgets - -
        GET     /apis/g/v/widgets?fieldSelector=metadata.name%3Dw1          resource list g v - widgets w1 -
        GET     /apis/g/v/widgets?watch=true&fieldSelector=metadata.name=w1 resource watch g v - widgets w1 -
        GET     /apis/g/v/watch/namespaces/ns1/widgets                      resource watch g v ns1 widgets - -
        GET     /apis/g/v/watch/namespaces/ns1/widgets/w1                   resource watch g v ns1 widgets w1 -
        DELETE  /apis/g/v/namespaces/ns1/widgets                            resource deletecollection g v ns1 widgets - -
        DELETE  /apis/g/v/namespaces/ns1/widgets/w1                         resource delete g v ns1 widgets w1 -
        POST    /apis/g/v/namespaces/ns1/widgets                            resource create g v ns1 widgets - -
        PUT     /apis/g/v/namespaces/ns1/widgets/w1                         resource update g v ns1 widgets w1 -
        PATCH   /apis/g/v/namespaces/ns1/widgets/w1                         resource patch g v ns1 widgets w1 -
        HEAD    /apis/g/v/namespaces/ns1/widgets/w1                         resource get g v ns1 widgets w1 -
        GET     /apis/g/v                                                   non-resource get - - - - - -
        GET     /apis/g                                                     non-resource get - - - - - -
        GET     /apis                                                       non-resource get - - - - - -
        GET     /apis/g/v/namespaces/ns1                                    resource get g v ns1 namespaces ns1 -
        GET     /apis/g/v/namespaces                                        resource list g v - namespaces - -
        GET     /apis/g/v/namespaces/ns1/status                             resource get g v ns1 namespaces ns1 status
        GET     /api/v1/namespaces/ns1/pods                                 resource list - v1 ns1 pods - -
        GET     /api/v1                                                     non-resource get - - - - - -
        GET     /healthz                                                    non-resource get - - - - - -
        POST    /openapi/v2                                                 non-resource post - - - - - -
        OPTIONS /apis/g/v/widgets                                           resource - g v - widgets - -
    ";

    #[test]
    fn the_contract_table() {
        for case in CONTRACT_TABLE.lines().map(str::trim).filter(|l| !l.is_empty()) {
            let (method, rest) = case.split_once(' ').unwrap();
            let (path, want) = rest.trim_start().split_once(' ').unwrap();
            assert_eq!(summary(&ri(method.parse().unwrap(), path)), want.trim(), "{case}");
        }
    }

    #[test]
    fn field_selector_name_only_when_everything_decodes() {
        // An invalid label selector makes ListOptions decoding fail: list, no name.
        let i = ri(Method::GET, "/apis/g/v/widgets?fieldSelector=metadata.name=w1&labelSelector=a%3D%22");
        assert_eq!((&*i.verb, i.name.as_str()), ("list", ""));
        let i = ri(Method::GET, "/apis/g/v/widgets?fieldSelector=metadata.name=w1&limit=x&watch=true");
        assert_eq!((&*i.verb, i.name.as_str()), ("watch", ""));
        // A name that is not a valid path segment is not used.
        let i = ri(Method::GET, "/apis/g/v/widgets?fieldSelector=metadata.name=a%2Fb");
        assert_eq!(i.name, "");
        let i = ri(Method::GET, "/apis/g/v/widgets?fieldSelector=metadata.name!=w1");
        assert_eq!(i.name, "");
        // The first value wins.
        let i = ri(Method::GET, "/apis/g/v/widgets?watch=false&watch=true");
        assert_eq!(i.verb, "list");
        let i = ri(Method::GET, "/apis/g/v/widgets?watch=");
        assert_eq!(i.verb, "watch");
    }

    #[test]
    fn selectors_are_kept_for_list_watch_and_deletecollection_only() {
        let selectors = |method: Method, path: &str| {
            let i = ri(method, path);
            (i.verb.into_owned(), i.label_selector, i.field_selector)
        };
        let s = |v: &str, l: &str, f: &str| (v.to_owned(), l.to_owned(), f.to_owned());
        let q = "labelSelector=app%3Dx%2Ctier%21%3Dy&fieldSelector=metadata.name%3Dz";
        assert_eq!(
            selectors(Method::GET, &format!("/apis/g/v/widgets?{q}")),
            s("list", "app=x,tier!=y", "metadata.name=z")
        );
        assert_eq!(
            selectors(Method::GET, &format!("/apis/g/v/widgets?watch=1&{q}")),
            s("watch", "app=x,tier!=y", "metadata.name=z")
        );
        assert_eq!(
            selectors(Method::DELETE, &format!("/apis/g/v/namespaces/ns/widgets?{q}")),
            s("deletecollection", "app=x,tier!=y", "metadata.name=z")
        );
        assert_eq!(selectors(Method::GET, &format!("/apis/g/v/widgets/w1?{q}")), s("get", "", ""));
        assert_eq!(selectors(Method::DELETE, &format!("/apis/g/v/widgets/w1?{q}")), s("delete", "", ""));
        assert_eq!(selectors(Method::GET, &format!("/apis/g/v?{q}")), s("get", "", ""));
        // The first value; kept raw even when it (or another list option) does not decode.
        assert_eq!(
            selectors(
                Method::GET,
                "/apis/g/v/widgets?labelSelector=a%3D%22&labelSelector=b&limit=x&fieldSelector="
            ),
            s("list", "a=\"", "")
        );
        let i = ri(Method::GET, &format!("/apis/g/v/widgets?{q}"));
        assert_eq!(i.name, "z");
        let parsed = ParsedRequest::new(&Method::GET, "/apis/g/v/widgets", Some(q));
        assert_eq!(parsed.info, Some(i));
        assert_eq!(parsed.query.get("labelSelector"), Some("app=x,tier!=y"));
    }

    #[test]
    fn our_group() {
        let i = ri(Method::GET, &format!("/apis/{G}/v1alpha1/namespaces/shop/podmetricssummaries/web-1"));
        assert_eq!(summary(&i), format!("resource get {G} v1alpha1 shop podmetricssummaries web-1 -"));
        assert!(i.named_in_path);
    }

    #[test]
    fn bare_watch_prefix_is_an_error() {
        assert!(RequestInfo::new(&Method::GET, "/apis/g/v/watch", None).is_err());
    }

    #[test]
    fn segments_are_decoded() {
        let i = ri(Method::GET, "/apis/g/v/namespaces/a%2Fb/widgets/x%20y");
        assert_eq!(i.namespace, "a/b");
        assert_eq!(i.name, "x y");
        assert_eq!(percent_decode("%zz%4"), "%zz%4");
        assert_eq!(percent_decode("%C3%A9"), "é");
        assert_eq!(percent_decode("%FF"), "\u{fffd}");
        assert_eq!(split_path("//a//b/"), ["a", "", "b"]);
        assert!(split_path("/").is_empty());
    }

    #[test]
    fn query_params() {
        let q = QueryParams::parse(Some("labelSelector=app%3Dweb&a=1&a=2&x+y=z+w"));
        assert_eq!(q.get("labelSelector"), Some("app=web"));
        assert_eq!(q.get("a"), Some("1"));
        assert_eq!(q.get("x y"), Some("z w"));
        assert_eq!(q.get("missing"), None);
        assert!(!QueryParams::parse(None).watch());
        assert!(QueryParams::parse(Some("watch=TRUE")).watch());
        assert!(!QueryParams::parse(Some("watch=False")).watch());
        assert!(QueryParams::parse(Some("watch")).watch());
    }
}
