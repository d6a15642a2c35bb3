//! OpenAPI documents, serialized once at startup (docs/wire.md, "OpenAPI"):
//!
//! - `GET /openapi/v2`: Swagger 2.0 with `definitions` (each carrying its
//!   `x-kubernetes-group-version-kind` list) and the list/get paths of every kind, for the
//!   aggregator's merged spec and kubectl's v2 `explain`;
//! - `GET /openapi/v3`: the root listing only our own `apis/<group>/<version>` key, with a
//!   `?hash=` of the current document;
//! - `GET /openapi/v3/apis/<group>/<version>`: the OpenAPI 3.0 document kubectl `explain` reads;
//!   the `hash` query only chooses the cache headers (never a redirect: behind the aggregator a
//!   3xx becomes a 502).
//!
//! Built from [`ServedKind::schemas`](crate::kind::ServedKind::schemas) (v3 schemas with
//! `#/components/schemas/` references; converted to `#/definitions/` for v2), a complete
//! `ObjectMeta`/`ListMeta` (and what they reference) with upstream descriptions, and one
//! `<Kind>List` schema per kind.

use std::collections::HashMap;
use std::sync::{Arc, RwLock};

use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, StatusCode, header};
use jiff::{SignedDuration, Timestamp};
use serde_json::{Map, Value, json};

use crate::StatusResponse;
use crate::discovery::{ServerInfo, if_none_match, sha512_hex};
use crate::kind::LiveKinds;
use crate::kind::{GroupVersion, KindInfo, OBJECT_META_SCHEMA, ServedKind};
use k8s_wire::QueryParams;
use k8s_wire::{accepts_json, not_acceptable};

/// Name of the shared ListMeta schema.
pub(crate) const LIST_META_SCHEMA: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ListMeta";

/// ObjectMeta, ListMeta, Time, OwnerReference, ManagedFieldsEntry and FieldsV1 in OpenAPI v3
/// form, with Kubernetes' own descriptions (from k8s-openapi's `v1_33` schemas).
const META_SCHEMAS_JSON: &str = include_str!("../data/meta_schemas.json");

const V3_REF_PREFIX: &str = "#/components/schemas/";
const V2_REF_PREFIX: &str = "#/definitions/";

const API_VERSION_DESCRIPTION: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DESCRIPTION: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const OBJECT_METADATA_DESCRIPTION: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";
const LIST_METADATA_DESCRIPTION: &str = "Standard list metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";

/// Every OpenAPI document, serialized.
#[derive(Debug, Clone)]
pub struct OpenApi {
    v2: Doc,
    v3_root: Bytes,
    v3_docs: HashMap<String, Doc>,
    undocumented: Vec<String>,
}

#[derive(Debug, Clone)]
struct Doc {
    body: Bytes,
    hash: String,
    etag: HeaderValue,
}

impl Doc {
    fn new(value: &Value) -> Self {
        let body = value.to_string().into_bytes();
        let hash = sha512_hex(&body);
        let etag = HeaderValue::from_str(&format!("\"{hash}\""))
            .unwrap_or_else(|_| HeaderValue::from_static("\"\""));
        Self { body: Bytes::from(body), hash, etag }
    }
}

impl OpenApi {
    /// Builds and serializes the documents of `server` for the served kinds.
    pub fn new(server: &ServerInfo, kinds: &[Arc<dyn ServedKind>]) -> Self {
        let schemas = component_schemas(kinds);
        let mut undocumented = Vec::new();
        for (name, schema) in &schemas {
            undocumented_in(schema, name, &mut undocumented);
        }
        for path in &undocumented {
            tracing::warn!(property = %path, "OpenAPI property without a description");
        }

        // One v3 document per group-version, as kube-apiserver serves them.
        let mut gvs: Vec<GroupVersion> = Vec::new();
        for kind in kinds {
            if !gvs.contains(&kind.info().gv) {
                gvs.push(kind.info().gv);
            }
        }
        if gvs.is_empty() {
            gvs.extend(server.home);
        }
        let mut v3_docs = HashMap::new();
        let mut v3_paths = Map::new();
        for gv in gvs {
            let of_gv: Vec<Arc<dyn ServedKind>> =
                kinds.iter().filter(|k| k.info().gv == gv).cloned().collect();
            let gv_key = format!("apis/{}/{}", gv.group, gv.version);
            let v3 = json!({
                "openapi": "3.0.0",
                "info": {"title": server.title, "version": gv.version},
                "paths": paths(&of_gv, Flavor::V3),
                "components": {"schemas": Value::Object(component_schemas(&of_gv))},
            });
            let v3_doc = Doc::new(&v3);
            v3_paths.insert(
                gv_key.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{gv_key}?hash={}", v3_doc.hash)}),
            );
            v3_docs.insert(gv_key, v3_doc);
        }
        let v3_root = json!({ "paths": Value::Object(v3_paths) });

        let definitions: Map<String, Value> =
            schemas.into_iter().map(|(name, schema)| (name, to_v2_schema(schema))).collect();
        let v2 = json!({
            "swagger": "2.0",
            "info": {"title": server.title, "version": format!("v{}", server.version)},
            "paths": paths(kinds, Flavor::V2),
            "definitions": Value::Object(definitions),
        });

        Self {
            v2: Doc::new(&v2),
            v3_root: Bytes::from(v3_root.to_string().into_bytes()),
            v3_docs,
            undocumented,
        }
    }

    /// Properties (`<schema>.<path>`) that lack a `description`; empty when every field is
    /// documented, as `kubectl explain` needs.
    pub fn undocumented_properties(&self) -> &[String] {
        &self.undocumented
    }

    /// `GET /openapi/v2`.
    pub fn v2(&self, headers: &HeaderMap) -> Response {
        if !accepts_json(accept(headers).as_deref()) {
            return not_acceptable().into_response();
        }
        serve_doc(&self.v2, false, headers)
    }

    /// `GET /openapi/v3`.
    pub fn v3_root(&self, headers: &HeaderMap) -> Response {
        if !accepts_json(accept(headers).as_deref()) {
            return not_acceptable().into_response();
        }
        (
            [
                (header::CONTENT_TYPE, HeaderValue::from_static("application/json")),
                (header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private")),
            ],
            self.v3_root.clone(),
        )
            .into_response()
    }

    /// `GET /openapi/v3/<key>` (`key` = `apis/<group>/<version>`); `None` when nothing is
    /// served under that key.
    pub fn v3_doc(&self, key: &str, query: &QueryParams, headers: &HeaderMap) -> Option<Response> {
        let doc = self.v3_docs.get(key)?;
        if !accepts_json(accept(headers).as_deref()) {
            return Some(not_acceptable().into_response());
        }
        let immutable = query.get("hash") == Some(doc.hash.as_str());
        Some(serve_doc(doc, immutable, headers))
    }
}

/// The OpenAPI documents in force: rebuilt when the kinds change (a configuration reload that
/// adds, changes or removes a declared kind), on the first read after it.
pub(crate) struct LiveOpenApi {
    server: Arc<ServerInfo>,
    kinds: Arc<LiveKinds>,
    built: RwLock<(u64, Arc<OpenApi>)>,
}

impl std::fmt::Debug for LiveOpenApi {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LiveOpenApi").finish_non_exhaustive()
    }
}

impl LiveOpenApi {
    /// The documents of `kinds`, following them.
    pub(crate) fn new(server: Arc<ServerInfo>, kinds: Arc<LiveKinds>) -> Self {
        let set = kinds.current();
        let built = RwLock::new((set.generation, Arc::new(OpenApi::new(&server, set.kinds()))));
        Self { server, kinds, built }
    }

    /// The documents for the kinds in force.
    pub(crate) fn current(&self) -> Arc<OpenApi> {
        let (generation, built) = match self.built.read() {
            Ok(built) => built.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        };
        let set = self.kinds.current();
        if set.generation == generation {
            return built;
        }
        let fresh = Arc::new(OpenApi::new(&self.server, set.kinds()));
        let mut slot = match self.built.write() {
            Ok(slot) => slot,
            Err(poisoned) => poisoned.into_inner(),
        };
        if set.generation >= slot.0 {
            *slot = (set.generation, fresh.clone());
        }
        fresh
    }
}

fn accept(headers: &HeaderMap) -> Option<String> {
    headers.get(header::ACCEPT).map(|v| String::from_utf8_lossy(v.as_bytes()).into_owned())
}

fn serve_doc(doc: &Doc, immutable: bool, headers: &HeaderMap) -> Response {
    let mut response = if if_none_match(headers, &doc.etag) {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        ([(header::CONTENT_TYPE, HeaderValue::from_static("application/json"))], doc.body.clone())
            .into_response()
    };
    let h = response.headers_mut();
    h.insert(header::ETAG, doc.etag.clone());
    h.insert(header::VARY, HeaderValue::from_static("Accept"));
    if immutable {
        // kube-openapi's headers for a URL whose hash matches the content.
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("public, immutable"));
        let now = Timestamp::now();
        let expires = now.checked_add(SignedDuration::from_hours(24 * 365)).unwrap_or(now);
        if let Ok(v) = HeaderValue::from_str(&expires.strftime("%a, %d %b %Y %H:%M:%S GMT").to_string()) {
            h.insert(header::EXPIRES, v);
        }
    } else {
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache, private"));
    }
    response
}

fn meta_schemas() -> Map<String, Value> {
    match serde_json::from_str::<Map<String, Value>>(META_SCHEMAS_JSON) {
        Ok(m) => m,
        Err(e) => {
            // Covered by a unit test; never silently serve a spec without ObjectMeta.
            tracing::error!(error = %e, "embedded ObjectMeta schemas do not parse");
            Map::new()
        }
    }
}

/// The kinds' schemas (object schema normalized), their `<Kind>List` schemas, and the meta
/// schemas, all in v3 form.
fn component_schemas(kinds: &[Arc<dyn ServedKind>]) -> Map<String, Value> {
    let mut out = Map::new();
    for kind in kinds {
        let info = kind.info();
        let mut schemas = kind.schemas().into_iter();
        let Some((object_name, object_schema)) = schemas.next() else {
            tracing::warn!(kind = %info.kind, "served kind without an OpenAPI schema");
            continue;
        };
        out.insert(object_name.clone(), normalize_object_schema(info, wrap_ref_siblings(object_schema)));
        out.insert(format!("{object_name}List"), list_schema(info, &object_name));
        for (name, schema) in schemas {
            out.insert(name, wrap_ref_siblings(schema));
        }
    }
    for (name, schema) in meta_schemas() {
        out.insert(name, schema);
    }
    out
}

fn gvk(gv: GroupVersion, kind: &str) -> Value {
    json!({"group": gv.group, "version": gv.version, "kind": kind})
}

fn v3_ref(name: &str) -> Value {
    json!({"$ref": format!("{V3_REF_PREFIX}{name}")})
}

/// Ensures the object schema has what `kubectl explain` and the aggregator use: `type`,
/// `description`, documented `apiVersion`/`kind`/`metadata`, and its GVK list.
fn normalize_object_schema(info: &KindInfo, schema: Value) -> Value {
    let mut schema = match schema {
        Value::Object(m) => m,
        _ => Map::new(),
    };
    schema.entry("type").or_insert_with(|| Value::from("object"));
    schema.entry("description").or_insert_with(|| Value::from(info.description.as_ref()));
    let props = schema.entry("properties").or_insert_with(|| Value::Object(Map::new()));
    if let Value::Object(props) = props {
        let defaults = [
            ("apiVersion", json!({"type": "string", "description": API_VERSION_DESCRIPTION})),
            ("kind", json!({"type": "string", "description": KIND_DESCRIPTION})),
            (
                "metadata",
                json!({"allOf": [v3_ref(OBJECT_META_SCHEMA)], "description": OBJECT_METADATA_DESCRIPTION}),
            ),
        ];
        for (name, default) in defaults {
            match props.get_mut(name) {
                None => {
                    props.insert(name.to_owned(), default);
                }
                Some(Value::Object(p)) if !p.contains_key("description") => {
                    // A bare `$ref` cannot carry a description in OpenAPI 3.0: wrap it.
                    if let Some(r) = p.remove("$ref") {
                        p.insert("allOf".into(), json!([{"$ref": r}]));
                    }
                    if let Some(d) = default.get("description") {
                        p.insert("description".into(), d.clone());
                    }
                }
                Some(_) => {}
            }
        }
    }
    schema.insert("x-kubernetes-group-version-kind".into(), json!([gvk(info.gv, &info.kind)]));
    Value::Object(schema)
}

fn list_schema(info: &KindInfo, object_name: &str) -> Value {
    json!({
        "description": format!("{} is a list of {} objects.", info.list_kind, info.kind),
        "type": "object",
        "required": ["items"],
        "properties": {
            "apiVersion": {"type": "string", "description": API_VERSION_DESCRIPTION},
            "items": {
                "type": "array",
                "description": format!("List of {}.", info.plural),
                "items": v3_ref(object_name),
            },
            "kind": {"type": "string", "description": KIND_DESCRIPTION},
            "metadata": {"allOf": [v3_ref(LIST_META_SCHEMA)], "description": LIST_METADATA_DESCRIPTION},
        },
        "x-kubernetes-group-version-kind": [gvk(info.gv, &info.list_kind)],
    })
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Flavor {
    V2,
    V3,
}

/// `stats.une-tasse-de.cafe` + `v1alpha1` → `StatsUneTasseDeCafeV1alpha1` (how kube names
/// operations: `readExampleComV1alpha1NamespacedWidget`).
fn operation_prefix(gv: GroupVersion) -> String {
    let group = gv.group.strip_suffix(".k8s.io").unwrap_or(gv.group);
    let mut out: String = group.split(['.', '-']).map(capitalize).collect();
    out.push_str(&capitalize(gv.version));
    out
}

fn capitalize(s: &str) -> String {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) => c.to_uppercase().chain(chars).collect(),
        None => String::new(),
    }
}

fn tag(gv: GroupVersion) -> String {
    let prefix = operation_prefix(gv);
    let group_part = prefix.strip_suffix(&capitalize(gv.version)).unwrap_or(&prefix).to_owned();
    let mut chars = group_part.chars();
    let lower: String = match chars.next() {
        Some(c) => c.to_lowercase().chain(chars).collect(),
        None => String::new(),
    };
    format!("{lower}_{}", gv.version)
}

fn parameter(flavor: Flavor, name: &str, location: &str, description: &str) -> Value {
    let mut p = json!({"name": name, "in": location, "description": description});
    if let Value::Object(m) = &mut p {
        if location == "path" {
            m.insert("required".into(), Value::Bool(true));
        }
        match flavor {
            Flavor::V2 => {
                m.insert("type".into(), "string".into());
                m.insert("uniqueItems".into(), Value::Bool(true));
            }
            Flavor::V3 => {
                m.insert("schema".into(), json!({"type": "string", "uniqueItems": true}));
            }
        }
    }
    p
}

fn operation(
    flavor: Flavor,
    info: &KindInfo,
    operation_id: String,
    description: String,
    action: &str,
    response_schema: &str,
    list: bool,
) -> Value {
    let mut op = Map::new();
    op.insert("description".into(), description.into());
    op.insert("operationId".into(), operation_id.into());
    op.insert("tags".into(), json!([tag(info.gv)]));
    if list {
        op.insert(
            "parameters".into(),
            json!([
                parameter(flavor, "fieldSelector", "query", "A selector to restrict the list of returned objects by their fields. Defaults to everything. Supported fields: metadata.name, metadata.namespace."),
                parameter(flavor, "labelSelector", "query", "A selector to restrict the list of returned objects by their labels. Defaults to everything."),
            ]),
        );
    }
    let responses = match flavor {
        Flavor::V2 => {
            op.insert("consumes".into(), json!(["*/*"]));
            op.insert("produces".into(), json!(["application/json"]));
            op.insert("schemes".into(), json!(["https"]));
            json!({
                "200": {"description": "OK", "schema": {"$ref": format!("{V2_REF_PREFIX}{response_schema}")}},
                "401": {"description": "Unauthorized"},
            })
        }
        Flavor::V3 => json!({
            "200": {"description": "OK", "content": {"application/json": {"schema": v3_ref(response_schema)}}},
            "401": {"description": "Unauthorized"},
        }),
    };
    op.insert("responses".into(), responses);
    op.insert("x-kubernetes-action".into(), action.into());
    op.insert("x-kubernetes-group-version-kind".into(), gvk(info.gv, &info.kind));
    Value::Object(op)
}

fn paths(kinds: &[Arc<dyn ServedKind>], flavor: Flavor) -> Value {
    let mut paths = Map::new();
    for kind in kinds {
        let info = kind.info();
        let prefix = operation_prefix(info.gv);
        let base = format!("/apis/{}/{}", info.gv.group, info.gv.version);
        let Some((object_name, _)) = kind.schemas().into_iter().next() else {
            continue;
        };
        let list_name = format!("{object_name}List");
        let k = &info.kind;
        let p = &info.plural;
        let name_param = parameter(flavor, "name", "path", &format!("name of the {k}"));
        let ns_param = parameter(
            flavor,
            "namespace",
            "path",
            "object name and auth scope, such as for teams and projects",
        );
        let list_desc = format!("list objects of kind {k}");
        let read_desc = format!("read the specified {k}");
        if info.namespaced {
            paths.insert(
                format!("{base}/{p}"),
                json!({"get": operation(flavor, info, format!("list{prefix}{k}ForAllNamespaces"), list_desc.clone(), "list", &list_name, true)}),
            );
            paths.insert(
                format!("{base}/namespaces/{{namespace}}/{p}"),
                json!({
                    "get": operation(flavor, info, format!("list{prefix}Namespaced{k}"), list_desc, "list", &list_name, true),
                    "parameters": [ns_param.clone()],
                }),
            );
            paths.insert(
                format!("{base}/namespaces/{{namespace}}/{p}/{{name}}"),
                json!({
                    "get": operation(flavor, info, format!("read{prefix}Namespaced{k}"), read_desc, "get", &object_name, false),
                    "parameters": [name_param, ns_param],
                }),
            );
        } else {
            paths.insert(
                format!("{base}/{p}"),
                json!({"get": operation(flavor, info, format!("list{prefix}{k}"), list_desc, "list", &list_name, true)}),
            );
            paths.insert(
                format!("{base}/{p}/{{name}}"),
                json!({
                    "get": operation(flavor, info, format!("read{prefix}{k}"), read_desc, "get", &object_name, false),
                    "parameters": [name_param],
                }),
            );
        }
    }
    Value::Object(paths)
}

/// OpenAPI 3.0 ignores the siblings of a `$ref` (a property's `description`): rewrites
/// `{"$ref": r, ...}` as `{"allOf": [{"$ref": r}], ...}`, the form kube's own v3 specs use.
pub(crate) fn wrap_ref_siblings(schema: Value) -> Value {
    let Value::Object(mut m) = schema else {
        return schema;
    };
    if m.len() > 1
        && let Some(r) = m.remove("$ref")
    {
        m.insert("allOf".into(), json!([{"$ref": r}]));
    }
    let out = m
        .into_iter()
        .map(|(k, v)| {
            let v = match (k.as_str(), v) {
                ("properties" | "patternProperties", Value::Object(props)) => {
                    Value::Object(props.into_iter().map(|(n, s)| (n, wrap_ref_siblings(s))).collect())
                }
                ("items" | "additionalProperties" | "not", s @ Value::Object(_)) => wrap_ref_siblings(s),
                ("allOf" | "oneOf" | "anyOf", Value::Array(all)) => {
                    Value::Array(all.into_iter().map(wrap_ref_siblings).collect())
                }
                (_, v) => v,
            };
            (k, v)
        })
        .collect();
    Value::Object(out)
}

/// Converts a v3 schema to Swagger 2.0: `#/components/schemas/` → `#/definitions/`, a lone
/// `allOf: [{$ref}]` back to a `$ref` with siblings (as kube's v2 spec writes it), `nullable`
/// dropped, and `oneOf`/`anyOf` (absent from 2.0) replaced by their first alternative.
pub(crate) fn to_v2_schema(schema: Value) -> Value {
    let Value::Object(mut m) = schema else {
        return schema;
    };
    m.remove("nullable");
    for key in ["oneOf", "anyOf"] {
        if let Some(Value::Array(alternatives)) = m.remove(key)
            && let Some(Value::Object(first)) = alternatives.into_iter().next()
        {
            for (k, v) in first {
                m.entry(k).or_insert(v);
            }
        }
    }
    if let Some(Value::Array(all)) = m.get("allOf")
        && let [Value::Object(only)] = all.as_slice()
        && only.len() == 1
        && let Some(r) = only.get("$ref").cloned()
    {
        m.remove("allOf");
        m.insert("$ref".into(), r);
    }
    let mut out = Map::new();
    for (k, v) in m {
        let v = match (k.as_str(), v) {
            ("$ref", Value::String(r)) => Value::String(match r.strip_prefix(V3_REF_PREFIX) {
                Some(name) => format!("{V2_REF_PREFIX}{name}"),
                None => r,
            }),
            ("properties" | "patternProperties" | "definitions", Value::Object(props)) => {
                Value::Object(props.into_iter().map(|(n, s)| (n, to_v2_schema(s))).collect())
            }
            ("items" | "additionalProperties" | "not", s @ Value::Object(_)) => to_v2_schema(s),
            ("allOf", Value::Array(all)) => Value::Array(all.into_iter().map(to_v2_schema).collect()),
            (_, v) => v,
        };
        out.insert(k, v);
    }
    Value::Object(out)
}

/// Collects `<path>.<property>` for every property (at any depth) without a description.
fn undocumented_in(schema: &Value, path: &str, out: &mut Vec<String>) {
    let Value::Object(m) = schema else {
        return;
    };
    if let Some(Value::Object(props)) = m.get("properties") {
        for (name, prop) in props {
            let p = format!("{path}.{name}");
            if prop.get("description").is_none() {
                out.push(p.clone());
            }
            undocumented_in(prop, &p, out);
        }
    }
    for key in ["items", "additionalProperties"] {
        if let Some(inner) = m.get(key) {
            undocumented_in(inner, path, out);
        }
    }
    for key in ["allOf", "oneOf", "anyOf"] {
        if let Some(Value::Array(all)) = m.get(key) {
            for inner in all {
                undocumented_in(inner, path, out);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn embedded_meta_schemas_parse_and_are_documented() {
        let m = meta_schemas();
        for name in [
            OBJECT_META_SCHEMA,
            LIST_META_SCHEMA,
            "io.k8s.apimachinery.pkg.apis.meta.v1.Time",
            "io.k8s.apimachinery.pkg.apis.meta.v1.OwnerReference",
            "io.k8s.apimachinery.pkg.apis.meta.v1.ManagedFieldsEntry",
            "io.k8s.apimachinery.pkg.apis.meta.v1.FieldsV1",
        ] {
            assert!(m.contains_key(name), "{name}");
        }
        let mut missing = Vec::new();
        for (name, s) in &m {
            undocumented_in(s, name, &mut missing);
        }
        assert!(missing.is_empty(), "{missing:?}");
        let props = m[OBJECT_META_SCHEMA]["properties"].as_object().unwrap();
        for field in [
            "annotations",
            "creationTimestamp",
            "deletionGracePeriodSeconds",
            "deletionTimestamp",
            "finalizers",
            "generateName",
            "generation",
            "labels",
            "managedFields",
            "name",
            "namespace",
            "ownerReferences",
            "resourceVersion",
            "selfLink",
            "uid",
        ] {
            assert!(props.contains_key(field), "{field}");
        }
    }

    #[test]
    fn operation_names() {
        let gv = GroupVersion { group: "stats.une-tasse-de.cafe", version: "v1alpha1", api_version: "" };
        assert_eq!(operation_prefix(gv), "StatsUneTasseDeCafeV1alpha1");
        assert_eq!(tag(gv), "statsUneTasseDeCafe_v1alpha1");
        let metrics = GroupVersion { group: "metrics.k8s.io", version: "v1beta1", api_version: "" };
        assert_eq!(operation_prefix(metrics), "MetricsV1beta1");
    }

    #[test]
    fn v2_conversion() {
        let v3 = json!({
            "type": "object",
            "properties": {
                "metadata": {"allOf": [{"$ref": "#/components/schemas/X"}], "description": "d"},
                "nullable": {"type": "string", "nullable": true, "description": "a property named nullable"},
                "q": {"oneOf": [{"type": "string"}, {"type": "number"}], "description": "q"},
                "list": {"type": "array", "items": {"$ref": "#/components/schemas/Y"}, "description": "l"},
                "map": {"type": "object", "additionalProperties": {"$ref": "#/components/schemas/Z"}, "description": "m"},
                "two": {"allOf": [{"$ref": "#/components/schemas/A"}, {"$ref": "#/components/schemas/B"}]}
            }
        });
        assert_eq!(
            to_v2_schema(v3),
            json!({
                "type": "object",
                "properties": {
                    "metadata": {"$ref": "#/definitions/X", "description": "d"},
                    "nullable": {"type": "string", "description": "a property named nullable"},
                    "q": {"type": "string", "description": "q"},
                    "list": {"type": "array", "items": {"$ref": "#/definitions/Y"}, "description": "l"},
                    "map": {"type": "object", "additionalProperties": {"$ref": "#/definitions/Z"}, "description": "m"},
                    "two": {"allOf": [{"$ref": "#/definitions/A"}, {"$ref": "#/definitions/B"}]}
                }
            })
        );
    }

    #[test]
    fn ref_siblings_are_wrapped_for_v3() {
        let s = json!({"properties": {
            "metadata": {"$ref": "#/components/schemas/M", "description": "d"},
            "bare": {"$ref": "#/components/schemas/B"},
            "list": {"type": "array", "description": "l", "items": {"$ref": "#/components/schemas/C"}},
        }});
        assert_eq!(
            wrap_ref_siblings(s),
            json!({"properties": {
                "metadata": {"allOf": [{"$ref": "#/components/schemas/M"}], "description": "d"},
                "bare": {"$ref": "#/components/schemas/B"},
                "list": {"type": "array", "description": "l", "items": {"$ref": "#/components/schemas/C"}},
            }})
        );
    }

    #[test]
    fn undocumented_detection() {
        let s = json!({"properties": {
            "a": {"type": "string"},
            "b": {"description": "b", "type": "array", "items": {"properties": {"c": {"type": "string"}}}},
        }});
        let mut out = Vec::new();
        undocumented_in(&s, "S", &mut out);
        assert_eq!(out, ["S.a", "S.b.c"]);
    }
}
