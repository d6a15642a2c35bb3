//! Content negotiation for every endpoint that answers with a body chosen by `Accept`: resource
//! get/list (plain JSON, `Table`, `PartialObjectMetadata[List]`), `/apis` and `/api`
//! (legacy JSON or aggregated discovery `apidiscovery.k8s.io/v2|v2beta1`) and the plain
//! discovery documents (docs/wire.md, "Representations").
//!
//! The algorithm is kube-apiserver's (`negotiation.NegotiateMediaTypeOptions` over goautoneg's
//! `ParseAccept`): clauses are ordered by q and specificity, the first clause whose media type
//! we serve (`application/json`, `application/*`, `*/*`) **and** whose `as`/`g`/`v`
//! conversion the endpoint allows wins. Unknown parameters (`profile`, `charset`, `pretty`)
//! are ignored. Only `application/json` is served: protobuf and YAML clauses are skipped, so
//! `application/vnd.kubernetes.protobuf, */*` (kubectl top, the HPA) gets JSON and a
//! protobuf-only `Accept` gets a 406.

use std::collections::BTreeMap;

use http::HeaderMap;

use super::status::ApiError;

/// The media types served, as listed in a 406 message.
pub(crate) const ACCEPTED_MEDIA_TYPES: &[&str] = &["application/json"];

/// Group of the Table and PartialObjectMetadata conversions.
pub(crate) const META_GROUP: &str = "meta.k8s.io";
/// Group of aggregated discovery.
pub(crate) const DISCOVERY_GROUP: &str = "apidiscovery.k8s.io";

/// A `meta.k8s.io` version a conversion was requested in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetaVersion {
    /// `meta.k8s.io/v1`.
    V1,
    /// `meta.k8s.io/v1beta1`.
    V1Beta1,
}

impl MetaVersion {
    /// The `apiVersion` of the converted object (`meta.k8s.io/v1`).
    pub fn api_version(self) -> &'static str {
        match self {
            Self::V1 => "meta.k8s.io/v1",
            Self::V1Beta1 => "meta.k8s.io/v1beta1",
        }
    }

    fn parse(v: &str) -> Option<Self> {
        match v {
            "v1" => Some(Self::V1),
            "v1beta1" => Some(Self::V1Beta1),
            _ => None,
        }
    }
}

/// What the response body should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Representation {
    /// The object, the `<Kind>List`, or the legacy discovery document, as JSON.
    Json,
    /// A `meta.k8s.io` Table.
    Table {
        /// Requested Table version.
        version: MetaVersion,
    },
    /// One `PartialObjectMetadata` (406 on a list endpoint).
    PartialObjectMetadata {
        /// Requested version.
        version: MetaVersion,
    },
    /// A `PartialObjectMetadataList` (406 on a single-object endpoint).
    PartialObjectMetadataList {
        /// Requested version.
        version: MetaVersion,
    },
    /// Aggregated discovery `apidiscovery.k8s.io/v2` `APIGroupDiscoveryList`.
    DiscoveryV2,
    /// Aggregated discovery `apidiscovery.k8s.io/v2beta1` `APIGroupDiscoveryList`.
    DiscoveryV2Beta1,
}

/// Which conversions an endpoint allows (kube's `EndpointRestrictions`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// Resource get/list: JSON, Table, PartialObjectMetadata, PartialObjectMetadataList.
    Resource,
    /// `/apis` and `/api`: JSON or aggregated discovery (v2, v2beta1).
    Discovery,
    /// Everything else (`/apis/<g>`, `/apis/<g>/<v>`): JSON without any conversion.
    Plain,
}

/// One clause of an `Accept` header (goautoneg's `Accept`).
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Clause {
    /// Media type (`application`, `*`).
    pub type_: String,
    /// Media subtype (`json`, `*`).
    pub subtype: String,
    /// Quality (1.0 unless given; an unparsable q is 0 as in goautoneg).
    pub q: f32,
    /// Parameters other than `q` (a repeated name keeps its last value).
    pub params: BTreeMap<String, String>,
}

/// Parses an `Accept` header into clauses ordered like goautoneg's `ParseAccept` (by q, then
/// concrete types before wildcards, otherwise in header order).
pub(crate) fn parse_accept(header: &str) -> Vec<Clause> {
    let mut clauses = Vec::new();
    for part in header.split(',') {
        let part = part.trim_matches(' ');
        let mut pieces = part.split(';');
        let media_range = pieces.next().unwrap_or_default();
        let sp: Vec<&str> = media_range.split('/').collect();
        let type_ = sp.first().map(|t| t.trim_matches(' ')).unwrap_or_default();
        let subtype = match sp.as_slice() {
            [_] if type_ == "*" => "*",
            [_, sub] => sub.trim_matches(' '),
            _ => continue,
        };
        let mut clause = Clause {
            type_: type_.to_ascii_lowercase(),
            subtype: subtype.to_ascii_lowercase(),
            q: 1.0,
            params: BTreeMap::new(),
        };
        for param in pieces {
            let Some((name, value)) = param.split_once('=') else {
                continue;
            };
            let name = name.trim_matches(' ');
            if name == "q" {
                clause.q = value.parse::<f32>().unwrap_or(0.0);
            } else {
                clause.params.insert(name.to_owned(), value.trim_matches(' ').to_owned());
            }
        }
        clauses.push(clause);
    }
    // goautoneg sorts with `sort.Sort` and this (not strictly ordered) Less; for the handful of
    // clauses a header has, Go's sort is an insertion sort, reproduced here exactly.
    let less = |a: &Clause, b: &Clause| {
        a.q > b.q || (a.type_ != "*" && b.type_ == "*") || (a.subtype != "*" && b.subtype == "*")
    };
    for i in 1..clauses.len() {
        let mut j = i;
        while j > 0 && less(&clauses[j], &clauses[j - 1]) {
            clauses.swap(j, j - 1);
            j -= 1;
        }
    }
    clauses
}

/// Negotiates the representation from the first `Accept` header of a request.
pub fn negotiate_headers(headers: &HeaderMap, endpoint: Endpoint) -> Result<Representation, ApiError> {
    let accept =
        headers.get(http::header::ACCEPT).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned());
    negotiate(accept.as_deref(), endpoint)
}

/// Negotiates the representation for `accept` (absent or empty means JSON) on `endpoint`.
/// No acceptable clause → 406 `only the following media types are accepted: ...`.
pub(crate) fn negotiate(accept: Option<&str>, endpoint: Endpoint) -> Result<Representation, ApiError> {
    let accept = accept.unwrap_or_default();
    if accept.trim().is_empty() {
        return Ok(Representation::Json);
    }
    for clause in parse_accept(accept) {
        let json_type = matches!(
            (clause.type_.as_str(), clause.subtype.as_str()),
            ("application", "json" | "*") | ("*", "*")
        );
        if !json_type {
            continue;
        }
        if let Some(repr) = accept_clause(&clause.params, endpoint) {
            return Ok(repr);
        }
    }
    Err(not_acceptable())
}

/// The 406 of content negotiation.
pub fn not_acceptable() -> ApiError {
    ApiError::NotAcceptable(format!(
        "only the following media types are accepted: {}",
        ACCEPTED_MEDIA_TYPES.join(", ")
    ))
}

/// kube's `acceptMediaTypeOptions` + `AllowsMediaTypeTransform` for a JSON clause.
fn accept_clause(params: &BTreeMap<String, String>, endpoint: Endpoint) -> Option<Representation> {
    // We stream nothing and have no server-version override: a clause asking for either is
    // not one we can satisfy.
    if params.get("stream").is_some_and(|v| !v.is_empty()) || params.get("sv").is_some_and(|v| !v.is_empty())
    {
        return None;
    }
    let kind = params.get("as");
    let group = params.get("g");
    let version = params.get("v");
    if kind.is_none() && group.is_none() && version.is_none() {
        return Some(Representation::Json);
    }
    let (kind, group, version) = (
        kind.map(String::as_str).unwrap_or_default(),
        group.map(String::as_str).unwrap_or_default(),
        version.map(String::as_str).unwrap_or_default(),
    );
    match endpoint {
        Endpoint::Plain => None,
        Endpoint::Resource => {
            if group != META_GROUP {
                return None;
            }
            let version = MetaVersion::parse(version)?;
            match kind {
                "Table" => Some(Representation::Table { version }),
                "PartialObjectMetadata" => Some(Representation::PartialObjectMetadata { version }),
                "PartialObjectMetadataList" => Some(Representation::PartialObjectMetadataList { version }),
                _ => None,
            }
        }
        Endpoint::Discovery => match (group, version, kind) {
            (DISCOVERY_GROUP, "v2", "APIGroupDiscoveryList") => Some(Representation::DiscoveryV2),
            (DISCOVERY_GROUP, "v2beta1", "APIGroupDiscoveryList") => Some(Representation::DiscoveryV2Beta1),
            _ => None,
        },
    }
}

/// Whether a JSON answer is acceptable at all for `accept`, ignoring conversion parameters
/// (how kube-openapi negotiates `/openapi/*`).
pub fn accepts_json(accept: Option<&str>) -> bool {
    let accept = accept.unwrap_or_default();
    accept.trim().is_empty()
        || parse_accept(accept).iter().any(|c| {
            matches!((c.type_.as_str(), c.subtype.as_str()), ("application", "json" | "*") | ("*", "*"))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use Representation::*;

    const TABLE_V1: Representation = Table { version: MetaVersion::V1 };

    fn res(accept: &str) -> Result<Representation, ApiError> {
        negotiate(Some(accept), Endpoint::Resource)
    }

    fn disc(accept: &str) -> Result<Representation, ApiError> {
        negotiate(Some(accept), Endpoint::Discovery)
    }

    #[test]
    fn kubectl_get_human_output_gets_table_v1() {
        let accept = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";
        assert_eq!(res(accept), Ok(TABLE_V1));
    }

    #[test]
    fn table_v1beta1_only() {
        assert_eq!(
            res("application/json;as=Table;v=v1beta1;g=meta.k8s.io"),
            Ok(Table { version: MetaVersion::V1Beta1 })
        );
    }

    #[test]
    fn plain_json_and_client_go_default() {
        assert_eq!(res("application/json"), Ok(Json));
        assert_eq!(res("application/json, */*"), Ok(Json));
        assert_eq!(res("*/*"), Ok(Json));
        assert_eq!(res("application/*"), Ok(Json));
        assert_eq!(res("application/json;charset=utf-8"), Ok(Json));
    }

    #[test]
    fn kubectl_top_and_hpa_protobuf_first_get_json() {
        assert_eq!(res("application/vnd.kubernetes.protobuf, */*"), Ok(Json));
        assert_eq!(res("application/vnd.kubernetes.protobuf,*/*"), Ok(Json));
    }

    #[test]
    fn protobuf_only_and_yaml_only_are_406() {
        let err = res("application/vnd.kubernetes.protobuf").unwrap_err();
        assert_eq!(
            err,
            ApiError::NotAcceptable("only the following media types are accepted: application/json".into())
        );
        assert!(res("application/yaml").is_err());
        assert!(res("text/html").is_err());
    }

    #[test]
    fn empty_accept_is_json() {
        assert_eq!(negotiate(None, Endpoint::Resource), Ok(Json));
        assert_eq!(res(""), Ok(Json));
        assert_eq!(res("  "), Ok(Json));
    }

    #[test]
    fn metadata_client_gets_partial_object_metadata_list() {
        let accept = "application/vnd.kubernetes.protobuf;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json";
        assert_eq!(res(accept), Ok(PartialObjectMetadataList { version: MetaVersion::V1 }));
    }

    #[test]
    fn partial_object_metadata_is_negotiated_then_checked_by_the_caller() {
        assert_eq!(
            res("application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1"),
            Ok(PartialObjectMetadata { version: MetaVersion::V1 })
        );
    }

    #[test]
    fn conversions_need_the_meta_group_and_a_known_version() {
        // `as` without g/v is not a meta.k8s.io conversion: the clause is skipped.
        assert!(res("application/json;as=Table").is_err());
        assert_eq!(res("application/json;as=Table,application/json"), Ok(Json));
        assert!(res("application/json;as=Table;g=meta.k8s.io;v=v2").is_err());
        assert!(res("application/json;as=Widget;g=meta.k8s.io;v=v1").is_err());
        // Aggregated discovery is not a resource conversion.
        assert_eq!(
            res("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            Ok(Json)
        );
    }

    #[test]
    fn stream_and_sv_clauses_are_skipped() {
        assert!(res("application/json;stream=watch").is_err());
        assert_eq!(res("application/json;stream=watch, application/json"), Ok(Json));
        assert!(res("application/json;sv=v1").is_err());
    }

    #[test]
    fn q_values_order_clauses() {
        assert_eq!(res("application/json;q=0.5, application/json;as=Table;g=meta.k8s.io;v=v1"), Ok(TABLE_V1));
        assert_eq!(
            res("application/json;as=Table;g=meta.k8s.io;v=v1;q=0.1, application/json;q=0.9"),
            Ok(Json)
        );
        // A wildcard sorts after a concrete type of equal q.
        assert_eq!(res("*/*;as=Table;g=meta.k8s.io;v=v1, application/json"), Ok(Json));
    }

    #[test]
    fn discovery_clients_of_each_version() {
        // client-go 1.26–1.29
        assert_eq!(
            disc(
                "application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Ok(DiscoveryV2Beta1)
        );
        // client-go 1.30–1.36
        assert_eq!(
            disc(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList,application/json"
            ),
            Ok(DiscoveryV2)
        );
        // client-go master, with and without the nopeer profile clause in front
        assert_eq!(
            disc("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"),
            Ok(DiscoveryV2)
        );
        assert_eq!(
            disc(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList;profile=nopeer,application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json"
            ),
            Ok(DiscoveryV2)
        );
        // legacy clients
        assert_eq!(disc("application/json"), Ok(Json));
        assert_eq!(disc("application/json, */*"), Ok(Json));
    }

    #[test]
    fn aggregator_of_each_version() {
        // ≤1.29
        assert_eq!(
            disc("application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"),
            Ok(DiscoveryV2Beta1)
        );
        // 1.30–1.36
        assert_eq!(
            disc(
                "application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList,application/json;g=apidiscovery.k8s.io;v=v2beta1;as=APIGroupDiscoveryList"
            ),
            Ok(DiscoveryV2)
        );
        // master
        assert_eq!(
            disc("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList"),
            Ok(DiscoveryV2)
        );
        // An unknown discovery version alone is not acceptable.
        assert!(disc("application/json;g=apidiscovery.k8s.io;v=v3;as=APIGroupDiscoveryList").is_err());
    }

    #[test]
    fn discovery_does_not_allow_table() {
        assert!(disc("application/json;as=Table;g=meta.k8s.io;v=v1").is_err());
        assert_eq!(disc("application/json;as=Table;g=meta.k8s.io;v=v1,application/json"), Ok(Json));
    }

    #[test]
    fn plain_endpoints_allow_no_conversion() {
        let plain = |a: &str| negotiate(Some(a), Endpoint::Plain);
        assert_eq!(plain("application/json"), Ok(Json));
        assert_eq!(plain("application/json, */*"), Ok(Json));
        assert!(plain("application/json;as=Table;g=meta.k8s.io;v=v1").is_err());
        assert!(plain("application/json;g=apidiscovery.k8s.io;v=v2;as=APIGroupDiscoveryList").is_err());
    }

    #[test]
    fn parse_accept_details() {
        let c = parse_accept(" application/json ; as = Table;g=meta.k8s.io;v=v1;q=0.8 ,*,bogus, text/plain");
        assert_eq!(c.len(), 3);
        // q first, then concrete before wildcard: text/plain, */*, then the q=0.8 clause.
        assert_eq!(c[0].type_, "text");
        assert_eq!((c[1].type_.as_str(), c[1].subtype.as_str()), ("*", "*"));
        assert_eq!(c[2].type_, "application");
        assert_eq!(c[2].params.get("as").map(String::as_str), Some("Table"));
        assert!((c[2].q - 0.8).abs() < 1e-6);
        // unparsable q is 0
        assert_eq!(parse_accept("application/json;q=x")[0].q, 0.0);
    }

    #[test]
    fn openapi_json_check() {
        assert!(accepts_json(None));
        assert!(accepts_json(Some("application/json")));
        assert!(accepts_json(Some("application/com.github.proto-openapi.spec.v2@v1.0+protobuf, */*")));
        assert!(!accepts_json(Some("application/com.github.proto-openapi.spec.v2@v1.0+protobuf")));
    }
}
