//! A computed listing and its objects, each object serialized once.
//!
//! [`ListingBuilder`] writes every object straight into the listing's `<Kind>List` JSON, and
//! those bytes are the only copy of it: each [`Item`] points to its object in them (shared,
//! not copied), the unfiltered list is served from them as they are, and a namespace's view of
//! an all-namespaces listing serves its part of them (the list's head, its own items, which
//! are consecutive because listings are sorted by namespace then name, and the list's tail)
//! without copying anything ([`ListBody`]). The JSON is written in chunks, so a listing's
//! buffer is never grown by copying.
//!
//! A kind whose list items are untyped (`KindInfo::typed_list_items == false`, metrics-server's
//! `PodMetricsList`) has its objects' leading `kind` and `apiVersion` left out of the list;
//! [`Item::object`] puts them back, byte for byte, for a single-object response.
//!
//! Table cells are packed beside the JSON, in the same chunk: a quantity or a count is a few
//! bytes there instead of a 24-byte cell, and the object's name is not stored twice. The
//! objects themselves are one allocation per listing ([`Items`]), not one each: a namespace's
//! view is a range of them, shared. What a listing keeps lives as long as the cached listing,
//! allocated among its refresh's short-lived blocks; the fewer such blocks, the fewer of the
//! allocator's pages they hold.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::ops::{Deref, Range};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use jiff::Timestamp;
use serde::Serialize;

use super::{Cell, KindInfo, Meta};

/// A chunk of a listing, set once it is complete; the items written in it point to it.
type Chunk = Arc<OnceLock<ChunkBytes>>;

/// The bytes of a chunk: its items' JSON, as the list writes them, and their packed cells.
#[derive(Default)]
struct ChunkBytes {
    json: Bytes,
    cells: Box<[u8]>,
}

impl std::fmt::Debug for ChunkBytes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChunkBytes")
            .field("json", &self.json.len())
            .field("cells", &self.cells.len())
            .finish()
    }
}

/// One computed object, ready to be served in any representation. 104 bytes, in its listing's
/// [`Items`]; its JSON and its packed cells are in its listing's chunk.
#[derive(Debug, Clone)]
pub struct Item {
    /// Its metadata (selectors, PartialObjectMetadata, Table row objects).
    pub meta: Meta,
    /// The chunk of its listing its object is written in: its JSON at `start`, `len` bytes
    /// long (as its list writes it), and what the list item lost of its object then its Table
    /// cells at `cells_start`, `cells_len` bytes long.
    chunk: Chunk,
    start: u32,
    len: u32,
    cells_start: u32,
    cells_len: u32,
}

/// What an untyped list item lost of its object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TypeMeta {
    /// Nothing: the item is the object.
    Kept = 0,
    /// `"kind":…,"apiVersion":…,` after the opening brace.
    KindFirst = 1,
    /// `"apiVersion":…,"kind":…,` after the opening brace.
    ApiVersionFirst = 2,
}

impl Item {
    /// An object on its own (not written into a listing), for listings assembled by hand.
    pub fn new<T: Serialize>(info: &KindInfo, meta: Meta, object: &T, cells: &[Cell]) -> Self {
        let mut json = Vec::new();
        let type_meta = write_object(&mut json, object, &TypeMetaPrefixes::of(info));
        let mut packed = Vec::new();
        Cells::pack_into(&mut packed, type_meta, cells, &meta);
        let (len, cells_len) = (as_u32(json.len()), as_u32(packed.len()));
        let chunk = ChunkBytes { json: Bytes::from(json), cells: packed.into_boxed_slice() };
        Self { meta, chunk: Arc::new(OnceLock::from(chunk)), start: 0, len, cells_start: 0, cells_len }
    }

    /// The object as its list writes it (without `kind` and `apiVersion` for a kind whose list
    /// items are untyped).
    pub fn list_json(&self) -> &[u8] {
        let (start, len) = (self.start as usize, self.len as usize);
        self.chunk.get().and_then(|chunk| chunk.json.get(start..start + len)).unwrap_or_default()
    }

    /// Its packed type byte and cells.
    fn packed_cells(&self) -> Cells<'_> {
        let (start, len) = (self.cells_start as usize, self.cells_len as usize);
        Cells(self.chunk.get().and_then(|chunk| chunk.cells.get(start..start + len)).unwrap_or_default())
    }

    /// The whole object, as a single-object response writes it; `info` is its kind's.
    pub fn object(&self, info: &KindInfo) -> Cow<'_, [u8]> {
        let json = self.list_json();
        let (first, second) = match self.packed_cells().type_meta() {
            TypeMeta::Kept => return Cow::Borrowed(json),
            TypeMeta::KindFirst => {
                (type_meta_field("kind", &info.kind), type_meta_field("apiVersion", info.gv.api_version))
            }
            TypeMeta::ApiVersionFirst => {
                (type_meta_field("apiVersion", info.gv.api_version), type_meta_field("kind", &info.kind))
            }
        };
        let rest = json.get(1..).unwrap_or_default();
        let mut out = Vec::with_capacity(json.len() + first.len() + second.len() + 2);
        out.push(b'{');
        out.extend_from_slice(&first);
        out.push(b',');
        out.extend_from_slice(&second);
        out.push(b',');
        out.extend_from_slice(rest);
        Cow::Owned(out)
    }

    /// Its Table cells, in column order.
    pub fn cells(&self) -> impl Iterator<Item = CellRef<'_>> {
        self.packed_cells().iter(&self.meta)
    }
}

/// `n` as a `u32` offset or length (saturating: a chunk is at most a few hundred KiB).
fn as_u32(n: usize) -> u32 {
    u32::try_from(n).unwrap_or(u32::MAX)
}

/// `"<key>":<value as a JSON string>`.
fn type_meta_field(key: &str, value: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(key.len() + value.len() + 5);
    push_json_str(&mut out, key);
    out.push(b':');
    push_json_str(&mut out, value);
    out
}

/// Appends the opening of `info`'s `<Kind>List` up to its items:
/// `{"kind":…,"apiVersion":…,"metadata":{"resourceVersion":…},"items":[` (no
/// `resourceVersion` when empty).
pub(crate) fn push_list_head(out: &mut Vec<u8>, info: &KindInfo, resource_version: &str) {
    out.extend_from_slice(b"{\"kind\":");
    push_json_str(out, &info.list_kind);
    out.extend_from_slice(b",\"apiVersion\":");
    push_json_str(out, info.gv.api_version);
    out.extend_from_slice(b",\"metadata\":{");
    if !resource_version.is_empty() {
        out.extend_from_slice(b"\"resourceVersion\":");
        push_json_str(out, resource_version);
    }
    out.extend_from_slice(b"},\"items\":[");
}

fn push_json_str(out: &mut Vec<u8>, s: &str) {
    // Serializing a &str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

/// The openings an object of an untyped list item starts with: `{"kind":…,"apiVersion":…,`
/// and the other order. Empty for a kind whose list items are typed.
struct TypeMetaPrefixes(Vec<(TypeMeta, Vec<u8>)>);

impl TypeMetaPrefixes {
    fn of(info: &KindInfo) -> Self {
        if info.typed_list_items {
            return Self(Vec::new());
        }
        let kind = type_meta_field("kind", &info.kind);
        let api_version = type_meta_field("apiVersion", info.gv.api_version);
        let prefix = |first: &[u8], second: &[u8]| [b"{".as_slice(), first, b",", second, b","].concat();
        Self(vec![
            (TypeMeta::KindFirst, prefix(&kind, &api_version)),
            (TypeMeta::ApiVersionFirst, prefix(&api_version, &kind)),
        ])
    }
}

/// Appends `object`'s JSON to `out`, as a list item of its kind (`prefixes`).
fn write_object<T: Serialize>(out: &mut Vec<u8>, object: &T, prefixes: &TypeMetaPrefixes) -> TypeMeta {
    let start = out.len();
    if let Err(error) = serde_json::to_writer(&mut *out, object) {
        // Only maps with non-string keys fail, which our types do not have.
        tracing::error!(%error, "serializing a computed object");
        out.truncate(start);
        out.extend_from_slice(b"null");
        return TypeMeta::Kept;
    }
    for (type_meta, prefix) in &prefixes.0 {
        if out.get(start..).is_some_and(|written| written.starts_with(prefix)) {
            // Keep the opening brace, drop the rest of the prefix.
            out.drain(start + 1..start + prefix.len());
            return *type_meta;
        }
    }
    TypeMeta::Kept
}

/// A Table cell of a stored object, as [`Item::cells`] reads it back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CellRef<'a> {
    /// Printed as is.
    Text(&'a str),
    /// Printed as a kubectl-style age relative to the response time.
    Age(Timestamp),
    /// The field is absent: printed `<none>`.
    None,
}

impl<'a> From<&'a Cell> for CellRef<'a> {
    fn from(cell: &'a Cell) -> Self {
        match cell {
            Cell::Text(text) => Self::Text(text),
            Cell::Short(text) => Self::Text(text.as_str()),
            Cell::Age(at) => Self::Age(*at),
            Cell::None => Self::None,
        }
    }
}

/// An item's [`TypeMeta`] and Table cells, packed (in its chunk): the type byte, then per
/// cell a tag byte and a text's length and bytes or an age's time; a cell that is the object's
/// name, or its age since its creation, is the tag alone.
#[derive(Clone, Copy, PartialEq, Eq, Default)]
struct Cells<'a>(&'a [u8]);

const TAG_NONE: u8 = 0;
const TAG_NAME: u8 = 1;
const TAG_AGE: u8 = 2;
const TAG_SHORT: u8 = 3;
const TAG_LONG: u8 = 4;
const TAG_CREATED: u8 = 5;

impl<'a> Cells<'a> {
    /// Packs `type_meta` and the `cells` of the object of `meta` at the end of `out`.
    fn pack_into(out: &mut Vec<u8>, type_meta: TypeMeta, cells: &[Cell], meta: &Meta) {
        let name: &str = &meta.name;
        out.reserve(1 + cells.len() * 6);
        out.push(type_meta as u8);
        for cell in cells {
            match CellRef::from(cell) {
                CellRef::None => out.push(TAG_NONE),
                CellRef::Text(text) if text == name => out.push(TAG_NAME),
                CellRef::Text(text) => match u8::try_from(text.len()) {
                    Ok(len) => {
                        out.push(TAG_SHORT);
                        out.push(len);
                        out.extend_from_slice(text.as_bytes());
                    }
                    Err(_) => {
                        out.push(TAG_LONG);
                        let len = u32::try_from(text.len()).unwrap_or(u32::MAX);
                        out.extend_from_slice(&len.to_le_bytes());
                        out.extend_from_slice(text.as_bytes().get(..len as usize).unwrap_or_default());
                    }
                },
                CellRef::Age(at) if meta.creation_timestamp == Some(at) => out.push(TAG_CREATED),
                CellRef::Age(at) => {
                    out.push(TAG_AGE);
                    out.extend_from_slice(&at.as_second().to_le_bytes());
                    out.extend_from_slice(&at.subsec_nanosecond().to_le_bytes());
                }
            }
        }
    }

    fn type_meta(self) -> TypeMeta {
        match self.0.first() {
            Some(1) => TypeMeta::KindFirst,
            Some(2) => TypeMeta::ApiVersionFirst,
            _ => TypeMeta::Kept,
        }
    }

    /// The cells of the object of `meta` (the one they were packed with).
    fn iter(self, meta: &'a Meta) -> impl Iterator<Item = CellRef<'a>> {
        let (name, created) = (&*meta.name, meta.creation_timestamp);
        let mut rest: &'a [u8] = self.0.get(1..).unwrap_or_default();
        std::iter::from_fn(move || {
            let (&tag, after) = rest.split_first()?;
            let (cell, after) = match tag {
                TAG_NONE => (CellRef::None, after),
                TAG_NAME => (CellRef::Text(name), after),
                TAG_CREATED => (created.map_or(CellRef::None, CellRef::Age), after),
                TAG_AGE => {
                    let (second, after) = after.split_first_chunk::<8>()?;
                    let (nanos, after) = after.split_first_chunk::<4>()?;
                    let at = Timestamp::new(i64::from_le_bytes(*second), i32::from_le_bytes(*nanos)).ok()?;
                    (CellRef::Age(at), after)
                }
                TAG_SHORT => {
                    let (&len, after) = after.split_first()?;
                    text(after, usize::from(len))?
                }
                TAG_LONG => {
                    let (len, after) = after.split_first_chunk::<4>()?;
                    text(after, usize::try_from(u32::from_le_bytes(*len)).ok()?)?
                }
                _ => return None,
            };
            rest = after;
            Some(cell)
        })
    }
}

/// A text cell of `len` bytes at the start of `bytes`, and what follows it.
fn text(bytes: &[u8], len: usize) -> Option<(CellRef<'_>, &[u8])> {
    let (text, after) = bytes.split_at_checked(len)?;
    // Packed from a &str whole, so always UTF-8.
    Some((CellRef::Text(std::str::from_utf8(text).ok()?), after))
}

/// A rendered unfiltered list, in parts sent one after the other without being joined: the
/// list's head (`{"kind":…,"items":[`), the items (the chunks of its listing's JSON, or, for a
/// namespace's view of an all-namespaces listing, the runs of them that hold its items) and
/// the tail (`]}`). Cloning shares the bytes.
#[derive(Clone, Default)]
pub struct ListBody {
    /// Empty when the list was rendered in one piece (then `items` is the whole list).
    head: Bytes,
    items: Vec<Bytes>,
    tail: Bytes,
    /// The chunks the items of a listing written by [`ListingBuilder`] point to, in order
    /// (their bytes are `items`); empty for any other body.
    chunks: Vec<Chunk>,
}

impl std::fmt::Debug for ListBody {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListBody").field("len", &self.len()).field("parts", &self.items.len()).finish()
    }
}

impl From<Vec<u8>> for ListBody {
    /// A list rendered in one piece.
    fn from(bytes: Vec<u8>) -> Self {
        Self { items: vec![Bytes::from(bytes)], ..Self::default() }
    }
}

impl ListBody {
    /// Its length in bytes.
    pub fn len(&self) -> usize {
        self.head.len() + self.items.iter().map(Bytes::len).sum::<usize>() + self.tail.len()
    }

    /// Whether it has no bytes (never, for a rendered list).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Its parts, to be written in this order (none empty).
    pub fn into_parts(self) -> Vec<Bytes> {
        let mut parts = Vec::with_capacity(self.items.len() + 2);
        parts.push(self.head);
        parts.extend(self.items);
        parts.push(self.tail);
        parts.retain(|part| !part.is_empty());
        parts
    }

    /// Its bytes in one buffer: shared when it is one already, else copied.
    pub fn to_bytes(&self) -> Bytes {
        match self.clone().into_parts().as_slice() {
            [] => Bytes::new(),
            [whole] => whole.clone(),
            parts => Bytes::from(parts.concat()),
        }
    }

    /// The body of the same list holding only `items`, when they are consecutive items of this
    /// one (as a namespace's are in a listing sorted by namespace), without copying: its head,
    /// the runs of its items in each chunk (a run after the first starts with the comma before
    /// it), its tail.
    fn view<'a>(&self, items: impl IntoIterator<Item = &'a Item>) -> Option<Self> {
        if self.chunks.is_empty() {
            return None;
        }
        let mut runs: Vec<Bytes> = Vec::new();
        // (chunk index, start of the run, end of its last item)
        let mut run: Option<(usize, usize, usize)> = None;
        let mut at = 0;
        for item in items {
            while !Arc::ptr_eq(self.chunks.get(at)?, &item.chunk) {
                at += 1;
            }
            let (start, end) = (item.start as usize, item.start as usize + item.len as usize);
            run = Some(match run {
                None => (at, start, end),
                // The next item of the same chunk: after the previous one and its comma.
                Some((c, from, last)) if c == at => {
                    if start != last + 1 {
                        return None;
                    }
                    (c, from, end)
                }
                // The first item of the next chunk, right after its comma, and the previous run
                // ended its own chunk.
                Some((c, from, last)) => {
                    let previous = self.items.get(c)?;
                    if at != c + 1 || last != previous.len() || start != 1 {
                        return None;
                    }
                    runs.push(previous.slice(from..last));
                    (at, 0, end)
                }
            });
        }
        if let Some((c, from, last)) = run {
            runs.push(self.items.get(c)?.slice(from..last));
        }
        Some(Self { head: self.head.clone(), items: runs, tail: self.tail.clone(), chunks: Vec::new() })
    }
}

/// A listing's objects, sorted by namespace then name, or a run of them (a namespace's view):
/// one allocation for all of them, shared by every view, never copied. Reads as a slice.
#[derive(Clone, Default)]
pub struct Items {
    all: Arc<Vec<Item>>,
    range: Range<usize>,
}

impl std::fmt::Debug for Items {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter().map(|i| (&*i.meta.namespace, &*i.meta.name))).finish()
    }
}

impl Deref for Items {
    type Target = [Item];

    fn deref(&self) -> &[Item] {
        self.all.get(self.range.clone()).unwrap_or_default()
    }
}

impl From<Vec<Item>> for Items {
    /// The objects in the order given (a listing assembled by hand; [`ListingBuilder`] sorts).
    fn from(items: Vec<Item>) -> Self {
        Self { range: 0..items.len(), all: Arc::new(items) }
    }
}

impl<'a> IntoIterator for &'a Items {
    type Item = &'a Item;
    type IntoIter = std::slice::Iter<'a, Item>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl FromIterator<Item> for Items {
    fn from_iter<I: IntoIterator<Item = Item>>(items: I) -> Self {
        Self::from(items.into_iter().collect::<Vec<_>>())
    }
}

impl Items {
    /// `run` of these (indices into them), sharing them.
    fn run(&self, run: Range<usize>) -> Self {
        let start = (self.range.start + run.start).min(self.range.end);
        let end = (self.range.start + run.end).clamp(start, self.range.end);
        Self { all: self.all.clone(), range: start..end }
    }

    /// Whether `other` shares these objects (the same allocation and run).
    pub fn same_as(&self, other: &Items) -> bool {
        Arc::ptr_eq(&self.all, &other.all) && self.range == other.range
    }
}

/// The result of computing a kind for a namespace (or all namespaces).
#[derive(Debug, Default)]
pub struct Listing {
    /// The objects, sorted by namespace then name.
    pub items: Items,
    /// Partial-failure warnings (`Warning: 299` headers): which source was missing.
    pub warnings: Vec<String>,
    /// Opaque `metadata.resourceVersion` of the list.
    pub resource_version: String,
    /// The unfiltered `<Kind>List` JSON: written by [`ListingBuilder`] (the items point into
    /// it) or shared from the listing a view was taken from; a listing assembled by hand has it
    /// rendered by the first request that asks for it.
    pub rendered_list: OnceLock<ListBody>,
}

impl Listing {
    /// The objects of `namespace`, shared with this listing (which holds several namespaces).
    pub fn namespace_view(&self, namespace: &str) -> Listing {
        let at: Vec<usize> = self
            .items
            .iter()
            .enumerate()
            .filter_map(|(i, item)| (&*item.meta.namespace == namespace).then_some(i))
            .collect();
        self.view(&at)
    }

    /// One view per namespace that has objects here, in namespace order.
    pub fn namespace_views(&self) -> Vec<(Arc<str>, Listing)> {
        let mut by_namespace: BTreeMap<Arc<str>, Vec<usize>> = BTreeMap::new();
        for (i, item) in self.items.iter().enumerate() {
            by_namespace.entry(item.meta.namespace.clone()).or_default().push(i);
        }
        by_namespace.into_iter().map(|(namespace, at)| (namespace, self.view(&at))).collect()
    }

    /// The view of the items at `at` (ascending indices): a run of these when they are
    /// consecutive, as a namespace's are in a sorted listing; copies of them otherwise (a
    /// listing assembled by hand out of order).
    fn view(&self, at: &[usize]) -> Listing {
        let items = match (at.first(), at.last()) {
            (Some(&first), Some(&last)) if last - first + 1 == at.len() => self.items.run(first..last + 1),
            (Some(_), Some(_)) => at.iter().filter_map(|&i| self.items.get(i).cloned()).collect(),
            _ => self.items.run(0..0),
        };
        let rendered_list = OnceLock::new();
        if let Some(body) = self.rendered_list.get().and_then(|body| body.view(items.iter())) {
            let _ = rendered_list.set(body);
        }
        Listing {
            items,
            warnings: self.warnings.clone(),
            resource_version: self.resource_version.clone(),
            rendered_list,
        }
    }
}

/// The first chunk of a listing's items; each next one is twice as large, up to
/// [`MAX_CHUNK`]: a small listing wastes little, a large one is a few dozen allocations.
const FIRST_CHUNK: usize = 4 * 1024;
/// The largest chunk (an object larger than this gets a chunk of its own size).
const MAX_CHUNK: usize = 256 * 1024;

/// Writes a [`Listing`]'s objects straight into its `<Kind>List` JSON (module documentation),
/// in chunks: the buffer never grows by copying, so computing a listing takes its size once,
/// not up to three times.
pub struct ListingBuilder {
    resource_version: String,
    prefixes: TypeMetaPrefixes,
    head: Bytes,
    /// The chunks written: each its items separated by commas (a chunk after the first starts
    /// with the comma before its first item), set when complete.
    chunks: Vec<Chunk>,
    /// The bytes of the chunk being written (the last of `chunks`): never grown past its
    /// capacity.
    current: Vec<u8>,
    /// The packed cells of the chunk being written.
    current_cells: Vec<u8>,
    /// One object at a time, serialized here and then copied whole into `current`.
    scratch: Vec<u8>,
    /// One object's packed cells at a time, then copied into `current_cells`.
    cells_scratch: Vec<u8>,
    items: Vec<Item>,
    /// Whether the items came in (namespace, name) order, as every kind computes them.
    sorted: bool,
}

impl std::fmt::Debug for ListingBuilder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ListingBuilder").field("items", &self.items.len()).finish_non_exhaustive()
    }
}

impl ListingBuilder {
    /// A listing of `info`'s objects at `resource_version` (empty: none in the list).
    pub fn new(info: &KindInfo, resource_version: String) -> Self {
        let mut head = Vec::with_capacity(160);
        push_list_head(&mut head, info, &resource_version);
        Self {
            resource_version,
            prefixes: TypeMetaPrefixes::of(info),
            head: Bytes::from(head),
            chunks: Vec::new(),
            current: Vec::new(),
            current_cells: Vec::new(),
            scratch: Vec::new(),
            cells_scratch: Vec::new(),
            items: Vec::new(),
            sorted: true,
        }
    }

    /// Room for `additional` more objects (when their number is known, the list of them is not
    /// grown by copying).
    pub fn reserve(&mut self, additional: usize) {
        self.items.reserve_exact(additional);
    }

    /// Adds an object: `object` serialized (with its `kind` and `apiVersion`) straight into
    /// the list, with its metadata (`object` borrows it, so it is shared here) and its Table
    /// cells.
    pub fn push<T: Serialize>(&mut self, meta: &Meta, object: &T, cells: &[Cell]) {
        self.scratch.clear();
        let type_meta = write_object(&mut self.scratch, object, &self.prefixes);
        self.cells_scratch.clear();
        Cells::pack_into(&mut self.cells_scratch, type_meta, cells, meta);
        let item = self.add(meta.clone());
        self.items.push(item);
    }

    /// Copies the object in `scratch` and its cells in `cells_scratch` into the current chunk
    /// (a new one when the object does not fit).
    fn add(&mut self, meta: Meta) -> Item {
        let first = self.items.is_empty();
        if let Some(last) = self.items.last() {
            self.sorted &= (&*last.meta.namespace, &*last.meta.name) <= (&*meta.namespace, &*meta.name);
        }
        let needed = self.scratch.len() + usize::from(!first);
        if self.chunks.is_empty() || self.current.capacity() - self.current.len() < needed {
            let size = (self.current.capacity() * 2).clamp(FIRST_CHUNK, MAX_CHUNK).max(needed);
            let full = std::mem::replace(&mut self.current, Vec::with_capacity(size));
            let cells = std::mem::take(&mut self.current_cells);
            self.seal(full, cells);
            self.chunks.push(Arc::new(OnceLock::new()));
        }
        if !first {
            self.current.push(b',');
        }
        let (start, cells_start) = (self.current.len(), self.current_cells.len());
        self.current.extend_from_slice(&self.scratch);
        self.current_cells.extend_from_slice(&self.cells_scratch);
        let chunk = self.chunks.last().cloned().unwrap_or_default();
        Item {
            meta,
            chunk,
            start: as_u32(start),
            len: as_u32(self.scratch.len()),
            cells_start: as_u32(cells_start),
            cells_len: as_u32(self.cells_scratch.len()),
        }
    }

    /// Sets the last chunk to `json` and `cells`, when there is one.
    fn seal(&mut self, json: Vec<u8>, cells: Vec<u8>) {
        if let Some(chunk) = self.chunks.last() {
            let _ = chunk.set(ChunkBytes { json: Bytes::from(json), cells: cells.into_boxed_slice() });
        }
    }

    /// The listing, with `warnings`.
    pub fn finish(mut self, warnings: Vec<String>) -> Listing {
        if !self.sorted {
            self.reorder();
        }
        // The last chunk exactly as long as what it holds.
        let last = std::mem::take(&mut self.current);
        let last =
            if last.capacity() - last.len() > last.len() / 16 { last.as_slice().to_vec() } else { last };
        let cells = std::mem::take(&mut self.current_cells);
        self.seal(last, cells);
        let items: Vec<Bytes> =
            self.chunks.iter().filter_map(|chunk| Some(chunk.get()?.json.clone())).collect();
        let body = ListBody { head: self.head, items, tail: Bytes::from_static(b"]}"), chunks: self.chunks };
        // Exactly as long as it is: the listing keeps it.
        if self.items.capacity() - self.items.len() > self.items.len() / 16 {
            self.items.shrink_to_fit();
        }
        Listing {
            items: Items::from(self.items),
            warnings,
            resource_version: self.resource_version,
            rendered_list: OnceLock::from(body),
        }
    }

    /// Sorts the items by namespace then name, and writes them again in that order.
    fn reorder(&mut self) {
        let last = std::mem::take(&mut self.current);
        let cells = std::mem::take(&mut self.current_cells);
        self.seal(last, cells);
        let mut items = std::mem::take(&mut self.items);
        items.sort_by(|a, b| (&*a.meta.namespace, &*a.meta.name).cmp(&(&*b.meta.namespace, &*b.meta.name)));
        self.chunks.clear();
        self.sorted = true;
        for item in items {
            self.scratch.clear();
            self.scratch.extend_from_slice(item.list_json());
            self.cells_scratch.clear();
            self.cells_scratch.extend_from_slice(item.packed_cells().0);
            let moved = self.add(item.meta);
            self.items.push(moved);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kind::{GroupVersion, Text, Texts};
    use serde_json::json;

    static TYPED: std::sync::LazyLock<KindInfo> =
        std::sync::LazyLock::new(|| KindInfo::new(crate::kind::tests::EXAMPLE, "Widget", true, "Widgets."));

    static UNTYPED: KindInfo = KindInfo {
        gv: GroupVersion {
            group: "metrics.k8s.io",
            version: "v1beta1",
            api_version: "metrics.k8s.io/v1beta1",
        },
        plural: Text::Borrowed("pods"),
        singular: Text::Borrowed(""),
        kind: Text::Borrowed("PodMetrics"),
        list_kind: Text::Borrowed("PodMetricsList"),
        short_names: Texts::Borrowed(&[]),
        categories: Texts::Borrowed(&[]),
        namespaced: true,
        description: Text::Borrowed("Pod metrics."),
        typed_list_items: false,
    };

    fn mk_meta(namespace: &str, name: &str) -> Meta {
        Meta { name: name.into(), namespace: namespace.into(), ..Meta::default() }
    }

    fn text(bytes: &[u8]) -> &str {
        std::str::from_utf8(bytes).unwrap()
    }

    /// Where `part` starts in `chunk`, when it is a slice of it.
    fn offset_in(chunk: &[u8], part: &[u8]) -> Option<usize> {
        let start = (part.as_ptr() as usize).checked_sub(chunk.as_ptr() as usize)?;
        (start + part.len() <= chunk.len()).then_some(start)
    }

    fn mk_listing(info: &KindInfo, objects: &[(&str, &str)]) -> Listing {
        let mut list = ListingBuilder::new(info, "42".to_owned());
        for (namespace, name) in objects {
            let object = json!({"kind": &*info.kind, "apiVersion": info.gv.api_version,
                                "metadata": {"name": name, "namespace": namespace}, "n": name.len()});
            list.push(&mk_meta(namespace, name), &object, &[Cell::Text((*name).into()), Cell::text("1m")]);
        }
        list.finish(vec!["a warning".to_owned()])
    }

    #[test]
    fn items_point_into_the_one_rendered_list() {
        let listing = mk_listing(&TYPED, &[("a", "x"), ("b", "y"), ("b", "zz")]);
        let body = listing.rendered_list.get().unwrap().to_bytes();
        let parts = listing.rendered_list.get().unwrap().clone().into_parts();
        assert_eq!(parts.len(), 3, "head, one chunk of items, tail");
        let want = concat!(
            r#"{"kind":"WidgetList","apiVersion":"stats.example.com/v1alpha1","metadata":{"resourceVersion":"42"},"items":["#,
            r#"{"apiVersion":"stats.example.com/v1alpha1","kind":"Widget","metadata":{"name":"x","namespace":"a"},"n":1},"#,
            r#"{"apiVersion":"stats.example.com/v1alpha1","kind":"Widget","metadata":{"name":"y","namespace":"b"},"n":1},"#,
            r#"{"apiVersion":"stats.example.com/v1alpha1","kind":"Widget","metadata":{"name":"zz","namespace":"b"},"n":2}]}"#,
        );
        assert_eq!(text(&body), want);
        assert_eq!(listing.warnings, ["a warning"]);
        assert_eq!(listing.resource_version, "42");
        for item in &listing.items {
            let at = offset_in(&parts[1], item.list_json()).expect("a slice of the list");
            assert_eq!(&parts[1][at..at + item.list_json().len()], item.list_json());
            assert_eq!(item.object(&TYPED), item.list_json(), "typed items are the objects");
        }
        assert_eq!(
            text(listing.items[2].list_json()),
            r#"{"apiVersion":"stats.example.com/v1alpha1","kind":"Widget","metadata":{"name":"zz","namespace":"b"},"n":2}"#
        );
        // 104 bytes, in the listing's one allocation of objects: none per object.
        assert_eq!(std::mem::size_of::<Item>(), 104);
    }

    #[test]
    fn a_namespace_view_shares_its_part_of_the_list() {
        let listing = mk_listing(&TYPED, &[("a", "x"), ("b", "y"), ("b", "zz"), ("c", "w")]);
        let views = listing.namespace_views();
        assert_eq!(views.iter().map(|(ns, _)| &**ns).collect::<Vec<_>>(), ["a", "b", "c"]);
        let b = &views[1].1;
        let body = b.rendered_list.get().expect("set when the view is taken").clone();
        let head = r#"{"kind":"WidgetList","apiVersion":"stats.example.com/v1alpha1","metadata":{"resourceVersion":"42"},"items":["#;
        let items = [b.items[0].list_json(), b.items[1].list_json()].join(&b',');
        assert_eq!(text(&body.to_bytes()), format!("{head}{}]}}", text(&items)));
        // Every part is a slice of the listing's: nothing was copied.
        let parts = body.clone().into_parts();
        let all = listing.rendered_list.get().unwrap().clone().into_parts();
        assert!(parts.iter().all(|part| all.iter().any(|chunk| offset_in(chunk, part).is_some())));
        assert_eq!(parts.iter().map(Bytes::len).collect::<Vec<_>>(), [head.len(), items.len(), 2]);
        assert!(std::ptr::eq(&b.items[0], &listing.items[1]), "a range of the listing's objects");
        assert!(b.items.same_as(&listing.items.run(1..3)));
        assert_eq!(b.warnings, ["a warning"]);
        assert_eq!(b.resource_version, "42");
        // The same body as the namespace's own listing would have.
        let own = mk_listing(&TYPED, &[("b", "y"), ("b", "zz")]);
        assert_eq!(body.to_bytes(), own.rendered_list.get().unwrap().to_bytes());
        // A namespace without objects is the empty list.
        let none = listing.namespace_view("d");
        let empty = none.rendered_list.get().unwrap().to_bytes();
        assert_eq!(text(&empty), format!("{head}]}}"));
        assert_eq!(listing.namespace_view("c").items.len(), 1);
    }

    #[test]
    fn a_large_listing_is_written_in_chunks_and_its_views_span_them() {
        // 3 namespaces of 700 objects, about 130 bytes each: chunks of 4, 8, 16, … KiB.
        let objects: Vec<(String, String)> = (0..2100)
            .map(|i| (format!("ns-{}", i / 700), format!("pod-{:04}-{}", i % 700, "x".repeat(i % 7))))
            .collect();
        let refs: Vec<(&str, &str)> = objects.iter().map(|(ns, n)| (ns.as_str(), n.as_str())).collect();
        let listing = mk_listing(&TYPED, &refs);
        let all = listing.rendered_list.get().unwrap().clone();
        let chunks = all.clone().into_parts();
        assert!(chunks.len() > 6, "{} parts", chunks.len());
        assert!(chunks[1..chunks.len() - 1].iter().all(|c| c.len() <= MAX_CHUNK));
        let whole: serde_json::Value = serde_json::from_slice(&all.to_bytes()).unwrap();
        assert_eq!(whole["items"].as_array().unwrap().len(), 2100);
        for (namespace, view) in listing.namespace_views() {
            let body = view.rendered_list.get().expect("shared, not rendered").clone();
            let own: Vec<(&str, &str)> = refs.iter().copied().filter(|(ns, _)| *ns == &*namespace).collect();
            let own = mk_listing(&TYPED, &own);
            assert_eq!(body.to_bytes(), own.rendered_list.get().unwrap().to_bytes(), "{namespace}");
            for part in body.into_parts() {
                assert!(chunks.iter().any(|c| offset_in(c, &part).is_some()), "{namespace}: a copied part");
            }
        }
        // Any run of consecutive items is a view; a run with a gap is not.
        let body = listing.rendered_list.get().unwrap();
        let run = body.view(&listing.items[10..1500]).unwrap().to_bytes();
        let run: serde_json::Value = serde_json::from_slice(&run).unwrap();
        assert_eq!(run["items"].as_array().unwrap().len(), 1490);
        assert_eq!(run["items"][0]["metadata"]["name"], listing.items[10].meta.name.as_ref());
        let gap = [&listing.items[10], &listing.items[12]];
        assert!(body.view(gap).is_none());
    }

    #[test]
    fn a_listing_assembled_by_hand_has_no_body_until_rendered() {
        let listing = mk_listing(&TYPED, &[("a", "x"), ("b", "y")]);
        let by_hand = Listing { items: listing.items.iter().rev().cloned().collect(), ..Listing::default() };
        assert!(by_hand.rendered_list.get().is_none());
        // Not consecutive in the list they point into: a view cannot share it.
        assert!(listing.rendered_list.get().unwrap().view(&by_hand.items).is_none());
        let twice = [&listing.items[0], &listing.items[0]];
        assert!(listing.rendered_list.get().unwrap().view(twice).is_none());
        assert!(listing.rendered_list.get().unwrap().view(&listing.items).is_some());
        // Nor can a list rendered in one piece.
        assert!(ListBody::from(b"{}".to_vec()).view(&listing.items).is_none());
    }

    #[test]
    fn items_pushed_out_of_order_are_sorted_with_the_list() {
        let sorted = mk_listing(&TYPED, &[("a", "x"), ("a", "y"), ("b", "a")]);
        let shuffled = mk_listing(&TYPED, &[("b", "a"), ("a", "y"), ("a", "x")]);
        let names = |l: &Listing| l.items.iter().map(|i| i.meta.name.to_string()).collect::<Vec<_>>();
        assert_eq!(names(&shuffled), ["x", "y", "a"]);
        let body = |l: &Listing| l.rendered_list.get().unwrap().to_bytes();
        assert_eq!(body(&shuffled), body(&sorted));
        for (a, b) in shuffled.items.iter().zip(&sorted.items) {
            assert_eq!(a.list_json(), b.list_json());
            assert_eq!(a.cells().collect::<Vec<_>>(), b.cells().collect::<Vec<_>>());
        }
        assert!(shuffled.namespace_view("a").rendered_list.get().is_some());
    }

    #[test]
    fn untyped_list_items_leave_out_kind_and_api_version_and_objects_get_them_back() {
        let mut list = ListingBuilder::new(&UNTYPED, String::new());
        let kind_first =
            r#"{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1","metadata":{"name":"a"},"x":1}"#;
        let version_first =
            r#"{"apiVersion":"metrics.k8s.io/v1beta1","kind":"PodMetrics","metadata":{"name":"b"}}"#;
        // Nothing follows the type fields, or another kind: kept whole, as before.
        let bare = r#"{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1"}"#;
        let other = r#"{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1beta1","metadata":{"name":"d"}}"#;
        for (name, object) in [("a", kind_first), ("b", version_first), ("c", bare), ("d", other)] {
            let object: &serde_json::value::RawValue = serde_json::from_str(object).unwrap();
            list.push(&mk_meta("ns", name), &object, &[]);
        }
        let listing = list.finish(Vec::new());
        assert_eq!(
            text(&listing.rendered_list.get().unwrap().to_bytes()),
            concat!(
                r#"{"kind":"PodMetricsList","apiVersion":"metrics.k8s.io/v1beta1","metadata":{},"items":["#,
                r#"{"metadata":{"name":"a"},"x":1},{"metadata":{"name":"b"}},"#,
                r#"{"kind":"PodMetrics","apiVersion":"metrics.k8s.io/v1beta1"},"#,
                r#"{"kind":"NodeMetrics","apiVersion":"metrics.k8s.io/v1beta1","metadata":{"name":"d"}}]}"#,
            )
        );
        let objects: Vec<String> =
            listing.items.iter().map(|i| text(&i.object(&UNTYPED)).to_owned()).collect();
        assert_eq!(objects, [kind_first, version_first, bare, other]);
        // An item made on its own follows the same rule.
        let one: &serde_json::value::RawValue = serde_json::from_str(kind_first).unwrap();
        let item = Item::new(&UNTYPED, mk_meta("ns", "a"), &one, &[]);
        assert_eq!(text(item.list_json()), r#"{"metadata":{"name":"a"},"x":1}"#);
        assert_eq!(text(&item.object(&UNTYPED)), kind_first);
    }

    #[test]
    fn cells_pack_and_read_back_every_kind_of_cell() {
        let at: Timestamp = "2026-07-01T10:00:00.123456789Z".parse().unwrap();
        let long = "x".repeat(300);
        let cells = [
            Cell::Text("web-1".into()),
            Cell::text("250m"),
            Cell::None,
            Cell::Age(at),
            Cell::Text(long.as_str().into()),
            Cell::text(""),
            Cell::text("é"),
        ];
        let meta = mk_meta("ns", "web-1");
        let mut bytes = Vec::new();
        Cells::pack_into(&mut bytes, TypeMeta::ApiVersionFirst, &cells, &meta);
        let packed = Cells(&bytes);
        assert_eq!(packed.type_meta(), TypeMeta::ApiVersionFirst);
        let read: Vec<CellRef<'_>> = packed.iter(&meta).collect();
        assert_eq!(
            read,
            [
                CellRef::Text("web-1"),
                CellRef::Text("250m"),
                CellRef::None,
                CellRef::Age(at),
                CellRef::Text(&long),
                CellRef::Text(""),
                CellRef::Text("é"),
            ]
        );
        // The type byte; the name is one tag byte; a short text its length and bytes; an age
        // 12 bytes.
        assert_eq!(packed.0.len(), 1 + 1 + (2 + 4) + 1 + 13 + (5 + 300) + 2 + (2 + 2));
        let mut empty = Vec::new();
        Cells::pack_into(&mut empty, TypeMeta::Kept, &[], &meta);
        let empty = Cells(&empty);
        assert_eq!((empty.iter(&meta).count(), empty.type_meta()), (0, TypeMeta::Kept));
        assert_eq!(Cells::default().type_meta(), TypeMeta::Kept);
        // A damaged buffer ends the cells instead of panicking.
        let cut = Cells(&packed.0[..packed.0.len() - 1]);
        assert_eq!(cut.iter(&meta).count(), 6);
        // The age since the object's creation is the tag alone; another age is stored.
        let created = Meta { creation_timestamp: Some(at), ..meta.clone() };
        let mut ages = Vec::new();
        Cells::pack_into(
            &mut ages,
            TypeMeta::Kept,
            &[Cell::Age(at), Cell::Age(at + jiff::SignedDuration::from_secs(1))],
            &created,
        );
        let ages = Cells(&ages);
        assert_eq!(ages.0.len(), 1 + 1 + 13);
        let read: Vec<CellRef<'_>> = ages.iter(&created).collect();
        assert_eq!(read, [CellRef::Age(at), CellRef::Age(at + jiff::SignedDuration::from_secs(1))]);
    }
}
