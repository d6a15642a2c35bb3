//! Response bodies of the resource endpoints (`GET /apis/<g>/<v>[/namespaces/<ns>]/<plural>`
//! and `GET /apis/<g>/<v>/namespaces/<ns>/<plural>/<name>`) in every negotiated
//! representation (docs/wire.md, "Representations"): the object, `<Kind>List` (`items: []`, never
//! `null`), `meta.k8s.io` `Table` (v1 or v1beta1, as requested; `includeObject`), and
//! `PartialObjectMetadata[List]`.
//!
//! Objects are written from their precomputed JSON ([`Item::list_json`], [`Item::object`])
//! without re-serializing them; the unfiltered list is the listing's own rendered bytes
//! ([`list_json`]), sent as they are ([`list_body`]); `PartialObjectMetadata` borrows the
//! object's own `metadata`. Table cells are rendered here, at response time, so ages move on
//! while an object sits in the cache.

use std::borrow::Cow;
use std::convert::Infallible;
use std::fmt;
use std::pin::Pin;
use std::task::{Context, Poll};

use axum::body::Body;
use bytes::Bytes;
use http_body::{Frame, SizeHint};
use jiff::{SignedDuration, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use crate::kind::{CellRef, Column, Item, KindInfo, ListBody, Listing, Meta};
use crate::serve::fairness::{self, ConnectionSlots, SlottedBody};
use k8s_wire::ApiError;
use k8s_wire::{MetaVersion, Representation, not_acceptable};

/// `includeObject` of a Table request: what each row's `object` holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) enum IncludeObject {
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
    pub(crate) fn parse(value: Option<&str>) -> Result<Self, ApiError> {
        match value.unwrap_or_default() {
            "" | "Metadata" => Ok(Self::Metadata),
            "None" => Ok(Self::None),
            "Object" => Ok(Self::Object),
            other => Err(ApiError::BadRequest(format!(
                "unrecognized includeObject value: {}",
                k8s_wire::go_quote(other)
            ))),
        }
    }
}

/// Everything besides the items that shapes a response body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct RenderContext<'a> {
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
pub(crate) fn render_list(
    ctx: &RenderContext<'_>,
    items: &[&Item],
    repr: Representation,
) -> Result<Vec<u8>, ApiError> {
    match repr {
        Representation::Json => Ok(kind_list(ctx, items.iter().copied())),
        Representation::Table { version } => table(ctx, items.iter().copied(), version),
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
pub(crate) fn render_object(
    ctx: &RenderContext<'_>,
    item: &Item,
    repr: Representation,
) -> Result<Vec<u8>, ApiError> {
    match repr {
        Representation::Json => Ok(item.object(ctx.info).into_owned()),
        Representation::Table { version } => table(ctx, std::iter::once(item), version),
        Representation::PartialObjectMetadata { version } => to_vec(&partial(item, version)),
        Representation::PartialObjectMetadataList { .. } => Err(ApiError::NotAcceptable(
            "you requested PartialObjectMetadataList, but the requested object is not a list".to_owned(),
        )),
        Representation::DiscoveryV2 | Representation::DiscoveryV2Beta1 => Err(not_acceptable()),
    }
}

/// `<Kind>List` written around the precomputed objects (as their list writes them).
pub(crate) fn kind_list<'a>(
    ctx: &RenderContext<'_>,
    items: impl Iterator<Item = &'a Item> + Clone,
) -> Vec<u8> {
    let size: usize = items.clone().map(|i| i.list_json().len() + 1).sum();
    let mut out = Vec::with_capacity(size + 160);
    crate::kind::push_list_head(&mut out, ctx.info, ctx.resource_version);
    for (i, item) in items.enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(item.list_json());
    }
    out.extend_from_slice(b"]}");
    out
}

/// The unfiltered `<Kind>List` of `listing`: its own rendered bytes (shared), or, for a
/// listing assembled by hand, rendered once and kept with it.
pub(crate) fn list_json(ctx: &RenderContext<'_>, listing: &Listing) -> ListBody {
    listing.rendered_list.get_or_init(|| ListBody::from(kind_list(ctx, listing.items.iter()))).clone()
}

/// The response body of an unfiltered list, its parts sent as they are (shared, not joined);
/// on an HTTP/2 connection, one more than a frame long waits for a body slot of the connection
/// and holds it until its last part is handed over, in frames of at most [`fairness::CHUNK`]
/// ([`fairness`]).
pub(crate) async fn list_body(body: ListBody, slots: Option<&ConnectionSlots>) -> Body {
    let len = body.len();
    let mut parts = body.into_parts();
    let slotted = match slots {
        Some(slots) if len > fairness::CHUNK => match parts.pop() {
            // The slot is held by the last part, so until everything before it is written.
            Some(last) => Some(slots.body(last).await),
            None => None,
        },
        _ => None,
    };
    match (parts.len(), slotted) {
        (0, None) => Body::empty(),
        (1, None) => Body::from(parts.swap_remove(0)),
        (_, slotted) => {
            let frame = if slotted.is_some() { fairness::CHUNK } else { usize::MAX };
            Body::new(PartsBody { parts: parts.into_iter(), current: Bytes::new(), frame, last: slotted })
        }
    }
}

/// A list's parts as one body: each part in frames of at most `frame` bytes, then `last`.
struct PartsBody {
    parts: std::vec::IntoIter<Bytes>,
    current: Bytes,
    frame: usize,
    last: Option<SlottedBody>,
}

impl http_body::Body for PartsBody {
    type Data = Bytes;
    type Error = Infallible;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
        let this = &mut *self;
        if this.current.is_empty()
            && let Some(next) = this.parts.next()
        {
            this.current = next;
        }
        if !this.current.is_empty() {
            let n = this.current.len().min(this.frame);
            return Poll::Ready(Some(Ok(Frame::data(this.current.split_to(n)))));
        }
        match &mut this.last {
            Some(last) => Pin::new(last).poll_frame(cx),
            None => Poll::Ready(None),
        }
    }

    fn is_end_stream(&self) -> bool {
        self.current.is_empty()
            && self.parts.as_slice().is_empty()
            && self.last.as_ref().is_none_or(http_body::Body::is_end_stream)
    }

    fn size_hint(&self) -> SizeHint {
        let parts: usize = self.parts.as_slice().iter().map(Bytes::len).sum();
        let last = self.last.as_ref().and_then(|last| last.size_hint().exact()).unwrap_or_default();
        SizeHint::with_exact((self.current.len() + parts) as u64 + last)
    }
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
        .map(|item| {
            Ok(Row {
                cells: RowCells { item, generic, now: ctx.now },
                object: match ctx.include_object {
                    IncludeObject::None => None,
                    IncludeObject::Metadata => Some(RowObject::Partial(partial(item, version))),
                    IncludeObject::Object => Some(RowObject::Full(full_object(ctx.info, item)?)),
                },
            })
        })
        .collect::<Result<Vec<_>, ApiError>>()?;
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

/// A row's cells, written as the Table is serialized: no cell is a `String` of its own.
struct RowCells<'a> {
    item: &'a Item,
    /// The generic columns (name, creation timestamp) of a kind that declares none.
    generic: bool,
    now: Timestamp,
}

impl Serialize for RowCells<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeSeq;
        let item = self.item;
        if self.generic {
            let mut seq = serializer.serialize_seq(Some(2))?;
            seq.serialize_element(&*item.meta.name)?;
            match item.meta.creation_timestamp {
                Some(ts) => seq.serialize_element(&Rfc3339(ts))?,
                None => seq.serialize_element("")?,
            }
            return seq.end();
        }
        let mut seq = serializer.serialize_seq(None)?;
        for cell in item.cells() {
            seq.serialize_element(&CellText(cell, self.now))?;
        }
        seq.end()
    }
}

/// A stored Table cell as text: ages are rendered against `now`, absent fields as `<none>`.
struct CellText<'a>(CellRef<'a>, Timestamp);

impl fmt::Display for CellText<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            CellRef::Text(s) => f.write_str(s),
            CellRef::Age(ts) => HumanDuration(self.1.duration_since(ts)).fmt(f),
            CellRef::None => f.write_str("<none>"),
        }
    }
}

impl Serialize for CellText<'_> {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.0 {
            CellRef::Text(s) => serializer.serialize_str(s),
            _ => serializer.collect_str(self),
        }
    }
}

/// `metav1.Time` JSON form: RFC 3339, UTC, whole seconds (`2026-07-01T10:00:00Z`).
struct Rfc3339(Timestamp);

impl fmt::Display for Rfc3339 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.strftime("%Y-%m-%dT%H:%M:%SZ").fmt(f)
    }
}

impl Serialize for Rfc3339 {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

/// The whole object for a Table row (`includeObject=Object`).
fn full_object(info: &KindInfo, item: &Item) -> Result<Box<RawValue>, ApiError> {
    let json = String::from_utf8(item.object(info).into_owned()).map_err(|e| e.utf8_error().to_string());
    json.and_then(|json| RawValue::from_string(json).map_err(|e| e.to_string()))
        .map_err(|e| ApiError::Internal(format!("a stored object is not JSON: {e}")))
}

/// [`Rfc3339`] as a `String`, for metadata built as a JSON value.
pub(crate) fn format_timestamp(ts: Timestamp) -> String {
    Rfc3339(ts).to_string()
}

/// apimachinery's `duration.HumanDuration`, as kubectl prints ages: `119s`, `5m12s` below
/// 10 minutes, `15m` below 3 hours, `3h20m` below 8 hours, `20h` below 2 days, `2d4h` below
/// 8 days, `45d` below 2 years, `2y3d` below 8 years, then `9y`. Up to 2 s in the future is
/// clock skew (`0s`); more is `<invalid>`.
struct HumanDuration(SignedDuration);

impl fmt::Display for HumanDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let seconds = self.0.as_secs();
        if seconds < -1 {
            return f.write_str("<invalid>");
        }
        if seconds < 0 {
            return f.write_str("0s");
        }
        if seconds < 60 * 2 {
            return write!(f, "{seconds}s");
        }
        let minutes = seconds / 60;
        if minutes < 10 {
            return two_units(f, minutes, "m", seconds % 60, "s");
        }
        if minutes < 60 * 3 {
            return write!(f, "{minutes}m");
        }
        let hours = seconds / 3600;
        if hours < 8 {
            return two_units(f, hours, "h", minutes % 60, "m");
        }
        if hours < 48 {
            return write!(f, "{hours}h");
        }
        if hours < 24 * 8 {
            return two_units(f, hours / 24, "d", hours % 24, "h");
        }
        if hours < 24 * 365 * 2 {
            return write!(f, "{}d", hours / 24);
        }
        if hours < 24 * 365 * 8 {
            return two_units(f, hours / 24 / 365, "y", (hours / 24) % 365, "d");
        }
        write!(f, "{}y", hours / 24 / 365)
    }
}

/// `major` then its unit, followed by `minor` and its unit unless `minor` is 0: `5m12s`, `3h`.
fn two_units(
    f: &mut fmt::Formatter<'_>,
    major: i64,
    major_unit: &str,
    minor: i64,
    minor_unit: &str,
) -> fmt::Result {
    if minor == 0 {
        write!(f, "{major}{major_unit}")
    } else {
        write!(f, "{major}{major_unit}{minor}{minor_unit}")
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
    cells: RowCells<'a>,
    // `TableRow.object` is a RawExtension: `null` (not omitted) with includeObject=None.
    object: Option<RowObject<'a>>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum RowObject<'a> {
    Partial(PartialObject<'a>),
    Full(Box<RawValue>),
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
    match serde_json::from_slice::<MetadataOnly<'_>>(item.list_json()) {
        Ok(MetadataOnly { metadata: Some(raw) }) if raw.get().starts_with('{') => MetaJson::Raw(raw),
        _ => MetaJson::Built(meta_json(&item.meta)),
    }
}

/// `metadata` JSON for a [`Meta`].
pub(crate) fn meta_json(meta: &Meta) -> serde_json::Value {
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
    use crate::kind::Cell;
    use crate::router::testutil::API_VERSION;
    use serde_json::{Value, json};
    use std::collections::BTreeMap;

    /// A Table cell as text, as a row writes it.
    fn render_cell(cell: &Cell, now: Timestamp) -> String {
        CellText(CellRef::from(cell), now).to_string()
    }

    fn human_duration(d: SignedDuration) -> String {
        HumanDuration(d).to_string()
    }

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

    fn item(name: &str, object_metadata: bool) -> Item {
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
        let cells = [Cell::Text(name.into()), Cell::Age(ts("2026-07-01T10:00:00Z"))];
        Item::new(&crate::router::testutil::WIDGET, meta, &object, &cells)
    }

    fn refs(items: &[Item]) -> Vec<&Item> {
        items.iter().collect()
    }

    fn ctx(include_object: IncludeObject) -> RenderContext<'static> {
        RenderContext {
            info: &crate::router::testutil::WIDGET,
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
        let v =
            parse(render_list(&ctx(IncludeObject::Metadata), &refs(&items), Representation::Json).unwrap());
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
        let info =
            crate::kind::KindInfo { typed_list_items: false, ..crate::router::testutil::WIDGET.clone() };
        let untyped = RenderContext { info: &info, ..ctx(IncludeObject::Metadata) };
        let kind_first = r#"{"kind":"Widget","apiVersion":"stats.example.com/v1alpha1","size":4}"#;
        // Items of this kind, made as its listings make them.
        let untyped_item = |item: Item, json: &str| {
            let object: &RawValue = serde_json::from_str(json).unwrap();
            Item::new(&info, item.meta.clone(), &object, &[])
        };
        let (a, b) = (item("a", true), item("b", false));
        let items = vec![
            untyped_item(a.clone(), std::str::from_utf8(a.list_json()).unwrap()),
            untyped_item(b.clone(), std::str::from_utf8(b.list_json()).unwrap()),
            untyped_item(item("c", false), kind_first),
        ];
        let list = render_list(&untyped, &refs(&items), Representation::Json).unwrap();
        assert_eq!(
            parse(list),
            json!({"kind": "WidgetList", "apiVersion": API_VERSION, "metadata": {"resourceVersion": "17"}, "items": [
                {"metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}, "size": 3},
                {"size": 3},
                {"size": 4},
            ]})
        );
        let one = render_object(&untyped, &items[0], Representation::Json).unwrap();
        assert_eq!(one, a.list_json(), "the single object is as it was made, byte for byte");
        let one = render_object(&untyped, &items[2], Representation::Json).unwrap();
        assert_eq!(std::str::from_utf8(&one).unwrap(), kind_first);
        // A Table row's whole object too.
        let ctx = RenderContext { include_object: IncludeObject::Object, ..untyped };
        let table = render_list(&ctx, &refs(&items[2..]), Representation::Table { version: MetaVersion::V1 });
        assert_eq!(parse(table.unwrap())["rows"][0]["object"], parse(kind_first.as_bytes().to_vec()));
    }

    #[test]
    fn table_with_metadata_objects() {
        let items = vec![item("a", true)];
        let v = parse(
            render_list(
                &ctx(IncludeObject::Metadata),
                &refs(&items),
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
        let v = parse(render_list(&ctx(IncludeObject::Metadata), &refs(&items), beta).unwrap());
        assert_eq!(v["apiVersion"], "meta.k8s.io/v1beta1");
        assert_eq!(v["rows"][0]["object"]["apiVersion"], "meta.k8s.io/v1beta1");
        // Built from Meta when the object has no metadata.
        assert_eq!(
            v["rows"][0]["object"]["metadata"],
            json!({"name": "a", "namespace": "ns1", "uid": "uid-a",
                   "creationTimestamp": "2026-07-01T10:00:00Z", "labels": {"app": "x"}})
        );
        let v = parse(render_list(&ctx(IncludeObject::Object), &refs(&items), beta).unwrap());
        assert_eq!(v["rows"][0]["object"], json!({"kind": "Widget", "apiVersion": API_VERSION, "size": 3}));
        let v = parse(render_list(&ctx(IncludeObject::None), &refs(&items), beta).unwrap());
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

    /// 1,000 objects shaped like PodMetricsSummaries (10 cells each), for the timing below.
    fn mk_pms_items() -> Vec<Item> {
        (0..1000)
            .map(|i| {
                let name = format!("web-7d4b9c6f5-{i:05}");
                let meta = Meta {
                    name: name.as_str().into(),
                    namespace: "ns-3".into(),
                    uid: Some(format!("6f1c2a9e-0000-4000-8000-{i:012}").into()),
                    creation_timestamp: Some(ts("2026-07-01T10:00:00Z")),
                    labels: BTreeMap::from([("app".to_owned(), "web".to_owned())]).into(),
                };
                let object = json!({"kind": "Widget", "apiVersion": API_VERSION, "metadata": {"name": name},
                                    "cpu": "250m", "memory": "128Mi", "containers": [{"name": "app"}]});
                let cells = [
                    Cell::Text(name.as_str().into()),
                    Cell::text("250m"),
                    Cell::text("128Mi"),
                    Cell::text("12.5"),
                    Cell::text("0.5"),
                    Cell::text("4%"),
                    Cell::Age(ts("2026-07-01T10:00:00Z")),
                    Cell::text("5m0s"),
                    Cell::text("2"),
                    Cell::Text("node-0123".into()),
                ];
                Item::new(&crate::router::testutil::WIDGET, meta, &object, &cells)
            })
            .collect()
    }

    /// Table cells packed per object instead of 10 stored 24-byte cells (issue 18):
    /// `cargo test --release --lib -- --ignored table_of_1000 --nocapture`.
    #[test]
    #[ignore = "a timing, run by hand"]
    fn table_of_1000_objects_timing() {
        const COLUMNS: &[Column] = &[
            Column::object_name("Name."),
            Column::text("A", "A."),
            Column::text("B", "B."),
            Column::text("C", "C."),
            Column::text("D", "D."),
            Column::text("E", "E."),
            Column::text("Age", "Age."),
            Column::text("F", "F.").wide(),
            Column::text("G", "G.").wide(),
            Column::text("H", "H.").wide(),
        ];
        let items = mk_pms_items();
        let ctx = RenderContext { columns: COLUMNS, ..ctx(IncludeObject::Metadata) };
        let table = Representation::Table { version: MetaVersion::V1 };
        let mut bytes = 0;
        for _ in 0..20 {
            bytes = render_list(&ctx, &refs(&items), table).unwrap().len();
        }
        let mut times = Vec::new();
        for _ in 0..7 {
            let started = std::time::Instant::now();
            for _ in 0..50 {
                bytes = render_list(&ctx, &refs(&items), table).unwrap().len();
            }
            times.push(started.elapsed().as_secs_f64() * 1000.0 / 50.0);
        }
        times.sort_by(f64::total_cmp);
        eprintln!("Table of 1000 objects ({bytes} B): median {:.3} ms, min {:.3} ms", times[3], times[0]);
    }

    /// A listing of 2,000 objects in 2 namespaces, written in several chunks.
    fn mk_chunked_listing() -> crate::kind::Listing {
        let mut list = crate::kind::ListingBuilder::new(&crate::router::testutil::WIDGET, "9".to_owned());
        for i in 0..2000 {
            let meta = Meta {
                name: format!("pod-{i:04}").into(),
                namespace: format!("ns-{}", i / 1000).into(),
                ..Meta::default()
            };
            let object = json!({"kind": "Widget", "apiVersion": API_VERSION,
                                "metadata": {"name": &*meta.name, "namespace": &*meta.namespace},
                                "padding": "p".repeat(i % 50)});
            list.push(&meta, &object, &[]);
        }
        list.finish(Vec::new())
    }

    async fn collect_frames(mut body: Body) -> (Vec<u8>, Vec<usize>) {
        use http_body_util::BodyExt;
        let (mut bytes, mut frames) = (Vec::new(), Vec::new());
        while let Some(frame) = body.frame().await {
            let data = frame.unwrap().into_data().unwrap();
            frames.push(data.len());
            bytes.extend_from_slice(&data);
        }
        (bytes, frames)
    }

    #[tokio::test]
    async fn a_list_body_is_its_parts_and_holds_its_slot_until_written() {
        let listing = mk_chunked_listing();
        let ctx = RenderContext { resource_version: "9", ..ctx(IncludeObject::Metadata) };
        let view = listing.namespace_view("ns-1");
        for (body, items) in
            [(list_json(&ctx, &listing), &listing.items), (list_json(&ctx, &view), &view.items)]
        {
            let expected = kind_list(&ctx, items.iter());
            let parts = body.clone().into_parts().len();
            assert!(parts > 3, "{parts} parts");
            // HTTP/1.1: the parts as they are.
            let (bytes, frames) = collect_frames(list_body(body.clone(), None).await).await;
            assert_eq!(bytes, expected);
            assert_eq!(frames.len(), parts);
            // HTTP/2: frames of at most CHUNK, the connection's slot held until the last one.
            let slots = ConnectionSlots::default();
            let mut others = Vec::new();
            for _ in 1..fairness::BODY_SLOTS_PER_CONNECTION {
                others.push(slots.body(Bytes::from_static(b"other")).await);
            }
            let mut slotted = list_body(body, Some(&slots)).await;
            assert_eq!(http_body::Body::size_hint(&slotted).exact(), Some(expected.len() as u64));
            // Whether a slot is free now (taken and given back at once).
            let free = || futures::FutureExt::now_or_never(slots.body(Bytes::new())).is_some();
            let mut got = Vec::new();
            while let Some(frame) = http_body_util::BodyExt::frame(&mut slotted).await {
                let data = frame.unwrap().into_data().unwrap();
                assert!(data.len() <= fairness::CHUNK);
                got.extend_from_slice(&data);
                assert_eq!(free(), got.len() == expected.len(), "at {} of {}", got.len(), expected.len());
            }
            assert_eq!(got, expected);
            assert!(free());
        }
        // A small list on HTTP/2 takes no slot; a list rendered in one piece is one frame.
        let small = ListBody::from(b"{}".to_vec());
        let slots = ConnectionSlots::default();
        let (bytes, frames) = collect_frames(list_body(small, Some(&slots)).await).await;
        assert_eq!((bytes.as_slice(), frames.as_slice()), (b"{}".as_slice(), [2].as_slice()));
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
        assert_eq!(render_object(&c, &it, Representation::Json).unwrap(), it.list_json());
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
            render_list(
                &c,
                &refs(&items),
                Representation::PartialObjectMetadataList { version: MetaVersion::V1 },
            )
            .unwrap(),
        );
        assert_eq!(
            v,
            json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1",
                   "metadata": {"resourceVersion": "17"},
                   "items": [{"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1",
                              "metadata": {"name": "a", "namespace": "ns1", "resourceVersion": "7"}}]})
        );
        let err = render_list(
            &c,
            &refs(&items),
            Representation::PartialObjectMetadata { version: MetaVersion::V1 },
        )
        .unwrap_err();
        assert_eq!(
            err,
            ApiError::NotAcceptable(
                "you requested PartialObjectMetadata, but the requested object is a list".into()
            )
        );
    }
}
