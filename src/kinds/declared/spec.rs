//! What a declared kind is, once its `kinds:` entry of the file has been checked: the
//! [`DeclaredSpec`] the computation and the HTTP layer read, and the check of the whole
//! `kinds:` list ([`check_declared`]) that rejects a file naming the kind and field at fault.

use std::time::Duration;

use crate::config::{DeclaredKindConfig, Invalid, QueryFile};
use crate::kinds::{Builtin, Column, KindInfo};

/// How a field's value is published (JSON and Table cell).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// A Quantity; cell with up to two decimals.
    Number,
    /// A ratio, as a Quantity; cell a percentage with one decimal (`4.0%`).
    Percent,
    /// CPU cores, as `kubectl top` prints them (`250m`).
    Cores,
    /// Bytes, as `kubectl top` prints them (`128Mi`).
    Bytes,
    /// Seconds, as a duration (`28s`).
    Seconds,
    /// Unix seconds in the data; RFC 3339 in JSON, an age in the cell.
    Timestamp,
}

impl Format {
    /// Every format, by its name in the file.
    pub const ALL: [(&'static str, Format); 6] = [
        ("number", Format::Number),
        ("percent", Format::Percent),
        ("cores", Format::Cores),
        ("bytes", Format::Bytes),
        ("seconds", Format::Seconds),
        ("timestamp", Format::Timestamp),
    ];

    /// The format named `name` in the file.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.iter().find(|(n, _)| *n == name).map(|(_, f)| *f)
    }
}

/// One field of a declared kind.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldSpec {
    /// JSON field name (lowerCamelCase).
    pub name: String,
    /// PromQL template.
    pub query: String,
    /// How the value is published.
    pub format: Format,
    /// Printer column, if any.
    pub column: Option<String>,
    /// The column only with `-o wide`.
    pub wide: bool,
    /// Description (OpenAPI).
    pub description: String,
}

/// A checked declared kind, every default filled in.
#[derive(Debug, Clone, PartialEq)]
pub struct DeclaredSpec {
    /// Names, scope and description, as discovery and OpenAPI publish them.
    pub info: KindInfo,
    /// The result label whose value names an object.
    pub name_label: String,
    /// Result labels copied to `metadata.labels`.
    pub labels: Vec<String>,
    /// `WINDOW` of this kind's queries, when it has its own.
    pub window: Option<Duration>,
    /// Pod label of the `pods` join, if any.
    pub pods_label: Option<String>,
    /// The fields, in the file's order.
    pub fields: Vec<FieldSpec>,
    /// Table columns: Name, the fields' columns, then (with the pods join) PODS, CPU, MEMORY
    /// (wide).
    pub columns: Vec<Column>,
}

/// Field names no declared field may take: every object has them.
pub const RESERVED_FIELDS: [&str; 5] = ["apiVersion", "kind", "metadata", "timestamp", "window"];
/// Field names the `pods` join adds (reserved too when the kind has the join).
pub const POD_JOIN_FIELDS: [&str; 3] = ["pods", "cpu", "memory"];

/// Checks the `kinds:` list of `file` against itself and the built-in kinds, and fills the
/// defaults in (plural, singular, categories, scope, format). A file is rejected whole: the
/// error names the kind (`kinds[AppTraffic]`, or `kinds[2]` when it has no valid kind name),
/// the field and what is wrong.
pub fn check_declared(file: &mut QueryFile, builtin: &[&Builtin]) -> Result<(), Invalid> {
    let _ = (file, builtin);
    todo!("helper: validation")
}

impl DeclaredSpec {
    /// The spec of an entry that [`check_declared`] accepted (defaults filled in).
    pub fn from_config(config: &DeclaredKindConfig) -> Self {
        let _ = config;
        todo!("helper: conversion")
    }
}
