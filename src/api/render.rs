//! Response bodies of the resource endpoints (`GET /apis/<g>/<v>[/namespaces/<ns>]/<plural>`
//! and `GET /apis/<g>/<v>/namespaces/<ns>/<plural>/<name>`) in every negotiated
//! representation (CONTRACT §3.3, §3.5, §3.6): the object, `<Kind>List` (`items: []`, never
//! `null`), `meta.k8s.io` `Table` (v1 or v1beta1, as requested; `includeObject`), and
//! `PartialObjectMetadata[List]`.
//!
//! Objects are written from their precomputed JSON ([`Item::object`]) without re-serializing
//! them; `PartialObjectMetadata` borrows the object's own `metadata`. Table cells are rendered
//! here, at response time, so ages move on while an object sits in the cache.

use std::borrow::Cow;
use std::sync::Arc;

use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::k8s::negotiate::{MetaVersion, Representation, not_acceptable};
use crate::k8s::status::ApiError;
use crate::kinds::{Cell, Column, Item, KindInfo, Meta};

/// `includeObject` of a Table request: what each row's `object` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum IncludeObject {
    /// `None`: `object` is `null`.
    None,
    /// `Metadata` (the default): a `PartialObjectMetadata` in the Table's version.
    #[default]
    Metadata,
    /// `Object`: the full object (kubectl asks for it with `--sort-by`).
    Object,
}

impl IncludeObject {
    /// Parses the query value; absent or empty is `Metadata`, an unknown value is a 400
    /// `unrecognized includeObject value: "x"`.
    pub fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or_default() {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(ApiError::BadRequest(format!(
                "unrecognized includeObject value: {}",
                crate::k8s::status::go_quote(other)
            ))),
        }
    }
}

/// Everything besides the items that shapes a response body.
#[derive(Debug, Clone, Copy)]
pub struct RenderContext<'a> {
    /// The kind served.
    pub info: &'a KindInfo,
    /// Its Table columns (the generic Name/Created At columns when empty).
    pub columns: &'a [Column],
    /// `metadata.resourceVersion` of lists and Tables.
    pub resource_version: &'a str,
    /// `includeObject` for Tables.
    pub include_object: IncludeObject,
    /// The response time ages are computed against.
    pub now: Timestamp,
}

/// Renders a list response.
pub fn render_list(
    ctx: &RenderContext<'_>,
    items: &[Arc<Item>],
    repr: Representation,
) -> Result<Vec<u8>, ApiError> {
    match repr {
        Representation::Json => Ok(kind_list(ctx, items)),
        Representation::Table { version } => table(ctx, items.iter().map(|i| i.as_ref()), version),
        Representation::PartialObjectMetadataList { version } => {
            let list = PartialList {
                kind: "PartialObjectMetadataList",
                api_version: version.api_version(),
                metadata: ListMeta::new(ctx.resource_version),
                items: items.iter().map(|i| partial(i, version)).collect(),
            };
            to_vec(&list)
        }
        Representation::PartialObjectMetadata { .. } => Err(ApiError::NotAcceptable(
            "you requested PartialObjectMetadata, but the requested object is a list".to_owned(),
        )),
        Representation::DiscoveryV2 | Representation::DiscoveryV2Beta1 => Err(not_acceptable()),
    }
}

/// Renders a single-object response.
pub fn render_object(
    ctx: &RenderContext<'_>,
    item: &Item,
    repr: Representation,
) -> Result<Vec<u8>, ApiError> {
    match repr {
        Representation::Json => Ok(item.object.get().as_bytes().to_vec()),
        Representation::Table { version } => table(ctx, std::iter::once(item), version),
        Representation::PartialObjectMetadata { version } => to_vec(&partial(item, version)),
        Representation::PartialObjectMetadataList { .. } => Err(ApiError::NotAcceptable(
            "you requested PartialObjectMetadataList, but the requested object is not a list".to_owned(),
        )),
        Representation::DiscoveryV2 | Representation::DiscoveryV2Beta1 => Err(not_acceptable()),
    }
}

/// `<Kind>List` written around the precomputed objects.
pub fn kind_list(ctx: &RenderContext<'_>, items: &[Arc<Item>]) -> Vec<u8> {
    let size: usize = items.iter().map(|i| i.object.get().len() + 1).sum();
    let mut out = Vec::with_capacity(size + 160);
    out.extend_from_slice(b"{\"kind\":");
    push_json_str(&mut out, &ctx.info.list_kind);
    out.extend_from_slice(b",\"apiVersion\":");
    push_json_str(&mut out, ctx.info.gv.api_version);
    out.extend_from_slice(b",\"metadata\":{");
    if !ctx.resource_version.is_empty() {
        out.extend_from_slice(b"\"resourceVersion\":");
        push_json_str(&mut out, ctx.resource_version);
    }
    out.extend_from_slice(b"},\"items\":[");
    // Kinds whose list items are untyped drop the `kind` and `apiVersion` their objects start
    // with (in either order).
    let type_meta: Vec<Vec<u8>> = if ctx.info.typed_list_items {
        Vec::new()
    } else {
        let (mut kind, mut api_version) = (b"\"kind\":".to_vec(), b"\"apiVersion\":".to_vec());
        push_json_str(&mut kind, &ctx.info.kind);
        push_json_str(&mut api_version, ctx.info.gv.api_version);
        [(&kind, &api_version), (&api_version, &kind)]
            .into_iter()
            .map(|(first, second)| [b"{".as_slice(), first, b",", second, b","].concat())
            .collect()
    };
    for (i, item) in items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let object = item.object.get().as_bytes();
        match type_meta.iter().find_map(|prefix| object.strip_prefix(prefix.as_slice())) {
            Some(rest) => {
                out.push(b'{');
                out.extend_from_slice(rest);
            }
            None => out.extend_from_slice(object),
        }
    }
    out.extend_from_slice(b"]}");
    out
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn to_vec<T: Serialize>(value: &T) -> Result<Vec<u8>, ApiError> {
    serde_json::to_vec(value).map_err(|e| ApiError::Internal(format!("serializing a response: {e}")))
}

/// The columns of the generic table convertor (`apiserver/pkg/registry/rest/table.go`),
/// for a kind that declares none.
const DEFAULT_COLUMNS: &[Column] = &[
    Column::object_name(
        "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names",
    ),
    Column {
        name: Cow::Borrowed("Created At"),
        type_: Cow::Borrowed("date"),
        format: Cow::Borrowed(""),
        description: Cow::Borrowed(
            "CreationTimestamp is a timestamp representing the server time when this object was created. It is not guaranteed to be set in happens-before order across separate operations. Clients may not set this value. It is represented in RFC3339 form and is in UTC.\n\nPopulated by the system. Read-only. Null for lists. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata",
        ),
        priority: 0,
    },
];

fn table<'a>(
    ctx: &RenderContext<'_>,
    items: impl Iterator<Item = &'a Item>,
    version: MetaVersion,
) -> Result<Vec<u8>, ApiError> {
    let generic = ctx.columns.is_empty();
    let columns = if generic { DEFAULT_COLUMNS } else { ctx.columns };
    let rows = items
        .map(|item| Row {
            cells: if generic {
                vec![
                    item.meta.name.to_string(),
                    item.meta.creation_timestamp.map(format_timestamp).unwrap_or_default(),
                ]
            } else {
                item.cells.iter().map(|c| render_cell(c, ctx.now)).collect()
            },
            object: match ctx.include_object {
                IncludeObject::None => None,
                IncludeObject::Metadata => Some(RowObject::Partial(partial(item, version))),
                IncludeObject::Object => Some(RowObject::Full(&item.object)),
            },
        })
        .collect();
    to_vec(&Table {
        kind: "Table",
        api_version: version.api_version(),
        metadata: ListMeta::new(ctx.resource_version),
        column_definitions: columns
            .iter()
            .map(|c| ColumnDefinition {
                name: &c.name,
                type_: &c.type_,
                format: &c.format,
                description: &c.description,
                priority: c.priority,
            })
            .collect(),
        rows,
    })
}

/// A Table cell as text: ages are rendered against `now`, absent fields as `<none>`.
pub fn render_cell(cell: &Cell, now: Timestamp) -> String {
    match cell {
        Cell::Text(s) => s.to_string(),
        Cell::Short(s) => s.as_str().to_owned(),
        Cell::Age(ts) => human_duration(now.duration_since(*ts)),
        Cell::None => "<none>".to_owned(),
    }
}

/// `metav1.Time` JSON form: RFC 3339, UTC, whole seconds (`2026-07-01T10:00:00Z`).
pub fn format_timestamp(ts: Timestamp) -> String {
    ts.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

/// apimachinery's `duration.HumanDuration`, as kubectl prints ages: `119s`, `5m12s` below
/// 10 minutes, `15m` below 3 hours, `3h20m` below 8 hours, `20h` below 2 days, `2d4h` below
/// 8 days, `45d` below 2 years, `2y3d` below 8 years, then `9y`. Up to 2 s in the future is
/// clock skew (`0s`); more is `<invalid>`.
pub fn human_duration(d: SignedDuration) -> String {
    let seconds = d.as_secs();
    if seconds < -1 {
        return "<invalid>".to_owned();
    }
    if seconds < 0 {
        return "0s".to_owned();
    }
    if seconds < 60 * 2 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return two_units(minutes, "m", seconds % 60, "s");
    }
    if minutes < 60 * 3 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return two_units(hours, "h", minutes % 60, "m");
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return two_units(hours / 24, "d", hours % 24, "h");
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return two_units(hours / 24 / 365, "y", (hours / 24) % 365, "d");
    }
    format!("{}y", hours / 24 / 365)
}

/// `major` then its unit, followed by `minor` and its unit unless `minor` is 0: `5m12s`, `3h`.
fn two_units(major: i64, major_unit: &str, minor: i64, minor_unit: &str) -> String {
    if minor == 0 {
        format!("{major}{major_unit}")
    } else {
        format!("{major}{major_unit}{minor}{minor_unit}")
    }
}

#[derive(Serialize)]
struct ListMeta<'a> {
    #[serde(rename = "resourceVersion", skip_serializing_if = "str::is_empty")]
    resource_version: &'a str,
}

impl<'a> ListMeta<'a> {
    fn new(resource_version: &'a str) -> Self {
        Self { resource_version }
    }
}

#[derive(Serialize)]
struct Table<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMeta<'a>,
    #[serde(rename = "columnDefinitions")]
    column_definitions: Vec<ColumnDefinition<'a>>,
    rows: Vec<Row<'a>>,
}

#[derive(Serialize)]
struct ColumnDefinition<'a> {
    name: &'a str,
    #[serde(rename = "type")]
    type_: &'a str,
    format: &'a str,
    description: &'a str,
    priority: i32,
}

#[derive(Serialize)]
struct Row<'a> {
    cells: Vec<String>,
    // `TableRow.object` is a RawExtension: `null` (not omitted) with includeObject=None.
    object: Option<RowObject<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RowObject<'a> {
    Partial(PartialObject<'a>),
    Full(&'a RawValue),
}

#[derive(Serialize)]
struct PartialObject<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: MetaJson<'a>,
}

#[derive(Serialize)]
struct PartialList<'a> {
    kind: &'static str,
    #[serde(rename = "apiVersion")]
    api_version: &'static str,
    metadata: ListMeta<'a>,
    items: Vec<PartialObject<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum MetaJson<'a> {
    Raw(&'a RawValue),
    Built(serde_json::Value),
}

#[derive(Deserialize)]
struct MetadataOnly<'a> {
    #[serde(borrow, default)]
    metadata: Option<&'a RawValue>,
}

fn partial(item: &Item, version: MetaVersion) -> PartialObject<'_> {
    PartialObject {
        kind: "PartialObjectMetadata",
        api_version: version.api_version(),
        metadata: object_metadata(item),
    }
}

/// The object's own `metadata` (so PartialObjectMetadata carries everything the object does),
/// or one built from [`Item::meta`] if the object has none.
fn object_metadata(item: &Item) -> MetaJson<'_> {
    match serde_json::from_str::<MetadataOnly<'_>>(item.object.get()) {
        Ok(MetadataOnly { metadata: Some(raw) }) if raw.get().starts_with('{') => MetaJson::Raw(raw),
        _ => MetaJson::Built(meta_json(&item.meta)),
    }
}

/// `metadata` JSON for a [`Meta`].
pub fn meta_json(meta: &Meta) -> serde_json::Value {
    let mut m = serde_json::Map::new();
    m.insert("name".into(), (*meta.name).into());
    if !meta.namespace.is_empty() {
        m.insert("namespace".into(), (*meta.namespace).into());
    }
    if let Some(uid) = &meta.uid {
        m.insert("uid".into(), (**uid).into());
    }
    if let Some(ts) = meta.creation_timestamp {
        m.insert("creationTimestamp".into(), format_timestamp(ts).into());
    }
    if !meta.labels.is_empty() {
        let labels =
            meta.labels.iter().map(|(k, v)| (k.clone(), serde_json::Value::from(v.clone()))).collect();
        m.insert("labels".into(), serde_json::Value::Object(labels));
    }
    serde_json::Value::Object(m)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kinds::API_VERSION;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    fn d(secs: i64) -> SignedDuration {
        SignedDuration::from_secs(secs)
    }

    #[test]
    fn human_durations_like_apimachinery() {
        let m = 60;
        let h = 3600;
        let day = 24 * h;
        let cases: &[(i64, &str)] = &[
            (-5, "<invalid>"),
            (-2, "<invalid>"),
            (-1, "0s"),
            (0, "0s"),
            (59, "59s"),
            (60, "60s"),
            (119, "119s"),
            (2 * m, "2m"),
            (5 * m + 12, "5m12s"),
            (9 * m + 59, "9m59s"),
            (10 * m, "10m"),
            (15 * m + 30, "15m"),
            (179 * m, "179m"),
            (3 * h, "3h"),
            (3 * h + 20 * m, "3h20m"),
            (7 * h + 59 * m, "7h59m"),
            (8 * h, "8h"),
            (47 * h, "47h"),
            (2 * day, "2d"),
            (2 * day + 4 * h, "2d4h"),
            (7 * day + 23 * h, "7d23h"),
            (8 * day, "8d"),
            (45 * day, "45d"),
            (729 * day, "729d"),
            (730 * day, "2y"),
            (733 * day, "2y3d"),
            (8 * 365 * day, "8y"),
            (20 * 365 * day, "20y"),
        ];
        for (secs, want) in cases {
            assert_eq!(human_duration(d(*secs)), *want, "{secs}s");
        }
        // Sub-second parts truncate like Go's int(d.Seconds()).
        assert_eq!(human_duration(SignedDuration::from_millis(-1999)), "0s");
        assert_eq!(human_duration(SignedDuration::from_millis(1999)), "1s");
    }

    #[test]
    fn include_object_values() {
        assert_eq!(IncludeObject::parse(None), Ok(IncludeObject::Metadata));
        assert_eq!(IncludeObject::parse(Some("")), Ok(IncludeObject::Metadata));
        assert_eq!(IncludeObject::parse(Some("None")), Ok(IncludeObject::None));
        assert_eq!(IncludeObject::parse(Some("Object")), Ok(IncludeObject::Object));
        assert_eq!(
            IncludeObject::parse(Some("x")),
            Err(ApiError::BadRequest("unrecognized includeObject value: \"x\"".into()))
        );
        assert!(IncludeObject::parse(Some("object")).is_err());
    }

    const COLUMNS: &[Column] = &[Column::object_name("Name."), Column::text("Age", "Age.").wide()];

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn item(name: &str, object_metadata: bool) -> Arc<Item> {
        let meta = Meta {
            name: name.into(),
            namespace: "ns1".into(),
            uid: Some(format!("uid-{name}").into()),
            creation_timestamp: Some(ts("2026-07-01T10:00:00Z")),
            labels: BTreeMap::from([("app".to_owned(), "x".to_owned())]).into(),
        };
        let object = if object_metadata {
            json!({"kind": "Widget", "apiVersion": API_VERSION,
                   "metadata": {"name": name, "namespace": "ns1", "resourceVersion": "7"},
                   "size": 3})
        } else {
            json!({"kind": "Widget", "apiVersion": API_VERSION, "size": 3})
        };
        Arc::new(Item {
            meta,
            object: RawValue::from_string(object.to_string()).unwrap(),
            cells: vec![Cell::Text(name.into()), Cell::Age(ts("2026-07-01T10:00:00Z"))],
        })
    }

    fn ctx(include_object: IncludeObject) -> RenderContext<'static> {
        RenderContext {
            info: &crate::api::testutil::WIDGET,
            columns: COLUMNS,
            resource_version: "17",
            include_object,
            now: ts("2026-07-01T10:05:12Z"),
        }
    }

    fn parse(bytes: Vec<u8>) -> Value {
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn kind_list_json() {
        let items = vec![item("a", true), item("b", true)];
        let v = parse(render_list(&ctx(IncludeObject::Metadata), &items, Representation::Json).unwrap());
        assert_eq!(v["kind"], "WidgetList");
        assert_eq!(v["apiVersion"], API_VERSION);
        assert_eq!(v["metadata"], json!({"resourceVersion": "17"}));
        assert_eq!(v["items"][1]["metadata"]["name"], "b");
        assert_eq!(v["items"][0]["size"], 3);

        let empty = render_list(&ctx(IncludeObject::Metadata), &[], Representation::Json).unwrap();
        assert_eq!(
            parse(empty),
            json!({"kind": "WidgetList", "apiVersion": API_VERSION, "metadata": {"resourceVersion": "17"}, "items": []})
        );
        let no_rv = RenderContext { resource_version: "", ..ctx(IncludeObject::Metadata) };
        assert_eq!(parse(render_list(&no_rv, &[], Representation::Json).unwrap())["metadata"], json!({}));
    }

    #[test]
    fn untyped_list_items_lose_kind_and_api_version_and_single_objects_keep_them() {
        let info = crate::kinds::KindInfo { typed_list_items: false, ..crate::api::testutil::WIDGET.clone() };
        let untyped = RenderContext { info: &info, ..ctx(IncludeObject::Metadata) };
        let kind_first = r#"{"kind":"Widget","apiVersion":"stats.une-tasse-de.cafe/v1alpha1","size":4}"#;
        let c = item("c", false);
        let c = Arc::new(Item {
            meta: c.meta.clone(),
            object: RawValue::from_string(kind_first.to_owned()).unwrap(),
            cells: c.cells.clone(),
        });
        let items = vec![item("a", true), item("b", false), c];
        let list = render_list(&untyped, &items, Representation::Json).unwrap();
        assert_eq!(
            parse(list),
            json!({"kind": "WidgetList", "apiVersion": API_VERSION, "metadata": {"resourceVersion": "17"}, "items": [
                {"metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}, "size": 3},
                {"size": 3},
                {"size": 4},
            ]})
        );
        let one = parse(render_object(&untyped, &items[0], Representation::Json).unwrap());
        assert_eq!((one["kind"].as_str(), one["apiVersion"].as_str()), (Some("Widget"), Some(API_VERSION)));
    }

    #[test]
    fn table_with_metadata_objects() {
        let items = vec![item("a", true)];
        let v = parse(
            render_list(
                &ctx(IncludeObject::Metadata),
                &items,
                Representation::Table { version: MetaVersion::V1 },
            )
            .unwrap(),
        );
        assert_eq!(
            v,
            json!({
                "kind": "Table", "apiVersion": "meta.k8s.io/v1",
                "metadata": {"resourceVersion": "17"},
                "columnDefinitions": [
                    {"name": "Name", "type": "string", "format": "name", "description": "Name.", "priority": 0},
                    {"name": "Age", "type": "string", "format": "", "description": "Age.", "priority": 1}
                ],
                "rows": [{
                    "cells": ["a", "5m12s"],
                    "object": {"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                               "metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}}
                }]
            })
        );
    }

    #[test]
    fn table_v1beta1_object_and_none() {
        let items = vec![item("a", false)];
        let beta = Representation::Table { version: MetaVersion::V1Beta1 };
        let v = parse(render_list(&ctx(IncludeObject::Metadata), &items, beta).unwrap());
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1beta1");
        assert_eq!(v["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1beta1");
        // Built from Meta when the object has no metadata.
        assert_eq!(
            v["rows"][0]["object"]["metadata"],
            json!({"name": "a", "namespace": "ns1", "uid": "uid-a",
                   "creationTimestamp": "2026-07-01T10:00:00Z", "labels": {"app": "x"}})
        );
        let v = parse(render_list(&ctx(IncludeObject::Object), &items, beta).unwrap());
        assert_eq!(v["rows"][0]["object"], json!({"kind": "Widget", "apiVersion": API_VERSION, "size": 3}));
        let v = parse(render_list(&ctx(IncludeObject::None), &items, beta).unwrap());
        assert_eq!(v["rows"][0]["object"], Value::Null);
        assert!(v["rows"][0].as_object().unwrap().contains_key("object"));
    }

    #[test]
    fn cells_none_and_mismatch() {
        let now = ts("2026-07-01T10:00:00Z");
        assert_eq!(render_cell(&Cell::None, now), "<none>");
        assert_eq!(render_cell(&Cell::Text("12.5".into()), now), "12.5");
        assert_eq!(render_cell(&Cell::text("219Mi"), now), "219Mi");
        assert!(matches!(Cell::text("a-twenty-two-byte-text"), Cell::Short(_)));
        let long = "a-twenty-three-byte-txt";
        assert!(matches!(Cell::text(long), Cell::Text(_)));
        assert_eq!(render_cell(&Cell::text(long), now), long);
        assert_eq!(render_cell(&Cell::text("é"), now), "é");
        assert_eq!(std::mem::size_of::<Cell>(), 24);
        assert_eq!(render_cell(&Cell::Age(ts("2026-07-01T10:00:01Z")), now), "0s");
        assert_eq!(render_cell(&Cell::Age(ts("2026-07-01T10:00:05Z")), now), "<invalid>");
    }

    #[test]
    fn empty_table_has_empty_rows() {
        let v = parse(
            render_list(
                &ctx(IncludeObject::Metadata),
                &[],
                Representation::Table { version: MetaVersion::V1 },
            )
            .unwrap(),
        );
        assert_eq!(v["rows"], json!([]));
    }

    #[test]
    fn generic_columns_when_a_kind_declares_none() {
        let c = RenderContext { columns: &[], ..ctx(IncludeObject::None) };
        let v = parse(
            render_object(&c, &item("a", true), Representation::Table { version: MetaVersion::V1 }).unwrap(),
        );
        assert_eq!(v["columnDefinitions"][0]["format"], "name");
        assert_eq!(v["columnDefinitions"][1]["type"], "date");
        assert_eq!(v["rows"][0]["cells"], json!(["a", "2026-07-01T10:00:00Z"]));
    }

    #[test]
    fn single_object_representations() {
        let it = item("a", true);
        let c = ctx(IncludeObject::Metadata);
        assert_eq!(render_object(&c, &it, Representation::Json).unwrap(), it.object.get().as_bytes());
        let v = parse(render_object(&c, &it, Representation::Table { version: MetaVersion::V1 }).unwrap());
        assert_eq!(v["rows"].as_array().unwrap().len(), 1);
        let v = parse(
            render_object(&c, &it, Representation::PartialObjectMetadata { version: MetaVersion::V1 })
                .unwrap(),
        );
        assert_eq!(
            v,
            json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}})
        );
        let err =
            render_object(&c, &it, Representation::PartialObjectMetadataList { version: MetaVersion::V1 })
                .unwrap_err();
        assert_eq!(
            err,
            ApiError::NotAcceptable(
                "you requested PartialObjectMetadataList, but the requested object is not a list".into()
            )
        );
    }

    #[test]
    fn partial_object_metadata_list_and_its_406() {
        let items = vec![item("a", true)];
        let c = ctx(IncludeObject::Metadata);
        let v = parse(
            render_list(&c, &items, Representation::PartialObjectMetadataList { version: MetaVersion::V1 })
                .unwrap(),
        );
        assert_eq!(
            v,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"resourceVersion": "17"},
                   "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                              "metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}}]})
        );
        let err = render_list(&c, &items, Representation::PartialObjectMetadata { version: MetaVersion::V1 })
            .unwrap_err();
        assert_eq!(
            err,
            ApiError::NotAcceptable(
                "you requested PartialObjectMetadata, but the requested object is a list".into()
            )
        );
    }
}
