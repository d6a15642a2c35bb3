//! The structure checks itself against its map, `docs/architecture.md`, which is read here:
//!
//! - the crates: the map's crate table names exactly the workspace's packages (from
//!   `cargo metadata`), at their paths, each with exactly the workspace crates it depends on,
//!   and every one of those is listed below it (the compiler then refuses an upward import);
//! - the modules of every crate: each crate's module table, top to bottom, is its layering;
//!   every file of its `src/` is parsed as the compiler parses it (`syn`; test code, i.e.
//!   items under `#[cfg(test)]`, is left out) and each path it names (`use` trees, paths in
//!   code, `crate::`/`super::`/`self::` paths and paths through child modules, inside macro
//!   calls too) is resolved to the module that defines what it reaches, through every `use`
//!   binding and re-export on the way (an inline façade such as `pub mod testing { pub use … }`
//!   included): no module imports one listed above it, the modules of one row import each
//!   other without a cycle, and the files and directories under one parent too;
//! - the generic crates (`apiserver`, `k8s-wire`) name neither the server built on them nor
//!   its upstreams, in code, comments, tests or examples;
//! - every source file of every crate starts with a `//!` header.
//!
//! Each check also asserts that it had something to check (files parsed, imports found, a row
//! of several modules that import each other), so an empty scan or a vacuous row fails
//! instead of passing.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde_json::Value;
use syn::visit::Visit;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

// -------------------------------------------------------------------------------------------
// The map
// -------------------------------------------------------------------------------------------

/// The rows of the first Markdown table after the heading `heading`, each as its cells.
fn table(heading: &str) -> Vec<Vec<String>> {
    let map = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let after = map
        .split_once(&format!("\n{heading}\n"))
        .unwrap_or_else(|| panic!("docs/architecture.md has no heading {heading:?}"))
        .1;
    let rows: Vec<Vec<String>> = after
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2) // the header and the --- line
        .map(|l| l.trim().trim_matches('|').split('|').map(|c| c.trim().to_owned()).collect())
        .collect();
    assert!(!rows.is_empty(), "docs/architecture.md: no table under {heading:?}");
    rows
}

/// The names in backquotes in a cell: "`a`, `b`" → [a, b].
fn quoted(cell: &str) -> Vec<String> {
    cell.split('`').skip(1).step_by(2).map(str::to_owned).collect()
}

/// A crate of the map, top to bottom.
#[derive(Debug)]
struct MapCrate {
    name: String,
    path: String,
    uses: BTreeSet<String>,
}

fn map_crates() -> Vec<MapCrate> {
    table("## Crates")
        .into_iter()
        .map(|cells| {
            assert_eq!(
                cells.len(),
                4,
                "docs/architecture.md crate row {cells:?}: crate | path | holds | uses"
            );
            MapCrate {
                name: quoted(&cells[0]).pop().unwrap(),
                path: quoted(&cells[1]).pop().unwrap(),
                uses: quoted(&cells[3]).into_iter().collect(),
            }
        })
        .collect()
}

// -------------------------------------------------------------------------------------------
// The crates, as Cargo sees them
// -------------------------------------------------------------------------------------------

/// Each workspace package: its directory (relative to the root) and its workspace
/// dependencies (normal ones only; dev-dependencies are the tests').
fn cargo_packages() -> BTreeMap<String, (String, BTreeSet<String>)> {
    let out = std::process::Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--no-deps", "--offline", "--manifest-path"])
        .arg(root().join("Cargo.toml"))
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", String::from_utf8_lossy(&out.stderr));
    let metadata: Value = serde_json::from_slice(&out.stdout).unwrap();
    let members: BTreeSet<&str> =
        metadata["packages"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    let root = root();
    metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|package| {
            let manifest = Path::new(package["manifest_path"].as_str().unwrap());
            let dir = manifest.parent().unwrap().strip_prefix(&root).unwrap();
            let dir = if dir.as_os_str().is_empty() { ".".to_owned() } else { dir.display().to_string() };
            let uses = package["dependencies"]
                .as_array()
                .unwrap()
                .iter()
                .filter(|d| d["kind"].is_null() && members.contains(d["name"].as_str().unwrap()))
                .map(|d| d["name"].as_str().unwrap().to_owned())
                .collect();
            (package["name"].as_str().unwrap().to_owned(), (dir, uses))
        })
        .collect()
}

#[test]
fn the_map_names_the_crates_as_cargo_builds_them() {
    let map = map_crates();
    let cargo = cargo_packages();
    assert!(cargo.len() >= 4, "cargo metadata found too few packages: {cargo:?}");
    let named: BTreeSet<&str> = map.iter().map(|c| c.name.as_str()).collect();
    let built: BTreeSet<&str> = cargo.keys().map(String::as_str).collect();
    assert_eq!(named, built, "docs/architecture.md's crates and the workspace's packages");
    for (at, entry) in map.iter().enumerate() {
        let (dir, uses) = &cargo[&entry.name];
        assert_eq!(&entry.path, dir, "docs/architecture.md: the path of {}", entry.name);
        assert_eq!(&entry.uses, uses, "docs/architecture.md: what {} uses (its Cargo.toml)", entry.name);
        for used in uses {
            let below = map[at + 1..].iter().any(|c| &c.name == used);
            assert!(below, "{} uses {used}, which the map does not list below it", entry.name);
        }
    }
}

// -------------------------------------------------------------------------------------------
// The modules of each crate
// -------------------------------------------------------------------------------------------

/// A parsed file of a crate: its module path (`sources/prometheus/mod.rs` → sources,
/// prometheus) and the paths it names, resolved to absolute paths from the crate root (through
/// the crate's `use` bindings and re-exports, see [`Crate::resolve`]).
#[derive(Debug)]
struct SourceFile {
    file: PathBuf,
    module: Vec<String>,
    names: Vec<Vec<String>>,
}

fn module_path(file: &Path) -> Vec<String> {
    let mut parts: Vec<String> =
        file.components().map(|c| c.as_os_str().to_str().unwrap().to_owned()).collect();
    let last = parts.pop().unwrap();
    match last.as_str() {
        "lib.rs" | "mod.rs" => {}
        other => parts.push(other.trim_end_matches(".rs").to_owned()),
    }
    parts
}

/// `#[cfg(test)]` or `#[cfg(all(test, …))]`: compiled for tests only (`cfg(not(test))`,
/// `cfg(any(test, …))` and features that merely contain "test" are production code).
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    fn test_only(meta: &syn::Meta) -> bool {
        match meta {
            syn::Meta::Path(path) => path.is_ident("test"),
            syn::Meta::List(list) if list.path.is_ident("all") => list
                .parse_args_with(syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
                .is_ok_and(|metas| metas.iter().any(test_only)),
            _ => false,
        }
    }
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| test_only(&m)))
}

/// Collects the paths a file names, outside test code, made absolute against the module they
/// are written in (the file's, or an inline `mod x { … }` inside it), and the names its `use`
/// items bind in that module.
struct Names<'a> {
    /// The crate's modules with a file: a bare path whose first segment is a child module of
    /// the current one (`use listing::Listing;` in `kinds/mod.rs`) is a path into the crate.
    modules: &'a BTreeSet<Vec<String>>,
    /// The module being read: the file's, then the inline modules inside it.
    module: Vec<String>,
    found: Vec<Vec<String>>,
    /// `mod name;` declarations under `#[cfg(test)]`: their files are test code.
    test_modules: Vec<Vec<String>>,
    /// Globs of the crate root or of an ancestor module (`use super::*` in production code).
    opaque_globs: Vec<String>,
    /// What each `use` binds: the module and the name → the absolute path it stands for
    /// (`pub use crate::a::B as C` in `x` binds `x::C` → `a::B`; private uses too, which a
    /// child reaches with `super::`).
    bindings: Vec<(Vec<String>, Vec<String>)>,
}

impl<'a> Names<'a> {
    fn new(modules: &'a BTreeSet<Vec<String>>, module: &[String]) -> Self {
        Names {
            modules,
            module: module.to_vec(),
            found: Vec::new(),
            test_modules: Vec::new(),
            opaque_globs: Vec::new(),
            bindings: Vec::new(),
        }
    }

    /// `crate::a::b` → [a, b]; `super::x` and `self::x` relative to the current module, and a
    /// bare path through a child module; other paths (external crates, local names) are not
    /// paths into the crate's modules: None.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => self.module.clone(),
            child => {
                let mut path = self.module.clone();
                path.push(child.to_owned());
                if segments.len() > 1 && self.modules.contains(&path) {
                    path.extend(segments[1..].iter().cloned());
                    return Some(path);
                }
                return None;
            }
        };
        let mut rest = &segments[1..];
        if first == "super" {
            base.pop();
        }
        while rest.first().is_some_and(|s| s == "super") {
            base.pop();
            rest = &rest[1..];
        }
        base.extend(rest.iter().cloned());
        Some(base)
    }

    fn resolve(&mut self, segments: &[String]) {
        if let Some(path) = self.absolute(segments).filter(|p| !p.is_empty()) {
            self.found.push(path);
        }
    }

    fn bind(&mut self, name: &str, path: &[String]) {
        if let Some(target) = self.absolute(path).filter(|p| !p.is_empty()) {
            let mut key = self.module.clone();
            key.push(name.to_owned());
            if key != target {
                self.bindings.push((key, target));
            }
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                let name = if n.ident == "self" { prefix.last().cloned() } else { Some(n.ident.to_string()) };
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                if let Some(name) = name {
                    self.bind(&name, &path);
                }
                self.resolve(&path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                if r.ident != "self" {
                    path.push(r.ident.to_string());
                }
                self.bind(&r.rename.to_string(), &path);
                self.resolve(&path);
            }
            syn::UseTree::Glob(_) => match self.absolute(prefix) {
                // A glob of the crate root or of an ancestor brings names this scan cannot
                // follow (bare `metrics::…` paths afterwards): refused rather than unseen.
                Some(base) if self.module.starts_with(&base) => self.opaque_globs.push(prefix.join("::")),
                Some(base) => self.found.push(base),
                None => {}
            },
            syn::UseTree::Group(g) => {
                for tree in &g.items {
                    self.use_tree(prefix, tree);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Names<'_> {
    fn visit_item(&mut self, item: &'ast syn::Item) {
        let attrs = match item {
            syn::Item::Mod(m) => &m.attrs,
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return syn::visit::visit_item(self, item),
        };
        if is_cfg_test(attrs) {
            if let syn::Item::Mod(m) = item
                && m.content.is_none()
            {
                let mut child = self.module.clone();
                child.push(m.ident.to_string());
                self.test_modules.push(child);
            }
            return;
        }
        if let syn::Item::Mod(m) = item
            && let Some((_, items)) = &m.content
        {
            // An inline module (`pub mod testing { pub use … }`): its paths are relative to
            // it, and what it binds is reached as `crate::…::testing::Name`.
            self.module.push(m.ident.to_string());
            for item in items {
                self.visit_item(item);
            }
            self.module.pop();
            return;
        }
        syn::visit::visit_item(self, item);
    }

    fn visit_item_use(&mut self, item: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &item.tree);
    }

    fn visit_path(&mut self, path: &'ast syn::Path) {
        let segments: Vec<String> = path.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, path);
    }

    fn visit_macro(&mut self, mac: &'ast syn::Macro) {
        // Macro arguments are tokens, not syntax: read `crate :: a :: b` sequences in them
        // (a group's delimiter is printed against its first token: `(crate`).
        let text = mac.tokens.to_string().replace(['(', ')', '[', ']', '{', '}', ','], " ");
        let words: Vec<&str> = text.split_whitespace().collect();
        for (at, word) in words.iter().enumerate() {
            if matches!(*word, "crate" | "super" | "self") && words.get(at + 1) == Some(&"::") {
                let mut path = vec![(*word).to_owned()];
                let mut next = at + 2;
                while let Some(ident) =
                    words.get(next).filter(|w| w.chars().all(|c| c.is_alphanumeric() || c == '_'))
                {
                    path.push((*ident).to_owned());
                    if words.get(next + 1) != Some(&"::") {
                        break;
                    }
                    next += 2;
                }
                self.resolve(&path);
            }
        }
        syn::visit::visit_macro(self, mac);
    }
}

/// A library crate of the workspace, parsed: its production files (test-only files and the
/// binary's `main.rs` left out), its modules and what its `use` items bind.
#[derive(Debug)]
struct Crate {
    name: String,
    files: Vec<SourceFile>,
    modules: BTreeSet<Vec<String>>,
    bindings: BTreeMap<Vec<String>, Vec<String>>,
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

impl Crate {
    /// The crate `name` of the map, parsed from its `src/`.
    fn parse(name: &str) -> Crate {
        let path = map_crates().into_iter().find(|c| c.name == name).unwrap().path;
        let src = root().join(path).join("src");
        let mut paths = Vec::new();
        rust_files(&src, &mut paths);
        let relative = |p: &Path| p.strip_prefix(&src).unwrap().to_path_buf();
        let all: BTreeSet<Vec<String>> = paths.iter().map(|p| module_path(&relative(p))).collect();
        let mut files = Vec::new();
        let mut test_modules = BTreeSet::new();
        let mut bindings = BTreeMap::new();
        let mut opaque = Vec::new();
        for path in paths {
            let file = relative(&path);
            if file == Path::new("main.rs") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            let module = module_path(&file);
            let mut names = Names::new(&all, &module);
            names.visit_file(&parsed);
            test_modules.extend(names.test_modules);
            let globs = (!names.opaque_globs.is_empty())
                .then(|| format!("{}: {}", path.display(), names.opaque_globs.join(", ")));
            files.push((SourceFile { file, module, names: names.found }, names.bindings, globs));
        }
        // A test module's file, and everything under it, is test code.
        files.retain(|(f, _, _)| !test_modules.iter().any(|t| f.module.starts_with(t)));
        let mut out = Vec::new();
        for (file, bound, globs) in files {
            bindings.extend(bound);
            opaque.extend(globs);
            out.push(file);
        }
        assert!(
            opaque.is_empty(),
            "globs of the crate root or an ancestor hide imports from this check: {opaque:?}"
        );
        let modules = out.iter().map(|f| f.module.clone()).collect();
        Crate { name: name.to_owned(), files: out, modules, bindings }
    }

    /// `path` with every prefix a `use` binds replaced by what it stands for, until none is
    /// left: `crate::testing::ServedKind` (the façade re-exports it) → `kinds::ServedKind` →
    /// (`kinds` re-exports it from the library) … The route through a re-export is followed
    /// to the module that defines the item.
    fn resolve(&self, path: &[String]) -> Vec<String> {
        let mut path = path.to_vec();
        for _ in 0..16 {
            let bound = (1..=path.len()).rev().find_map(|i| self.bindings.get(&path[..i]).map(|t| (i, t)));
            match bound {
                Some((i, target)) => {
                    let mut next = target.clone();
                    next.extend(path[i..].iter().cloned());
                    path = next;
                }
                None => break,
            }
        }
        path
    }

    /// Edges between modules: (from, to) under their deepest common parent, with one file
    /// that makes each. A path into one's own ancestors (a child using its parent's items) is
    /// no edge, unless what the ancestor binds leads elsewhere.
    fn edges(&self) -> BTreeMap<(Vec<String>, Vec<String>), PathBuf> {
        let mut edges = BTreeMap::new();
        for file in &self.files {
            for name in &file.names {
                let name = self.resolve(name);
                let common = file.module.iter().zip(&name).take_while(|(a, b)| a == b).count();
                if common >= file.module.len() || common >= name.len() {
                    continue; // within itself, or into an ancestor
                }
                let from = file.module[..=common].to_vec();
                let to = name[..=common].to_vec();
                if self.modules.contains(&to) {
                    edges.entry((from, to)).or_insert_with(|| file.file.clone());
                }
            }
        }
        edges
    }

    /// The crate's modules by layer, top to bottom, from the map.
    fn layers(&self) -> Vec<Vec<String>> {
        table(&format!("## Modules of `{}`", self.name)).into_iter().map(|cells| quoted(&cells[0])).collect()
    }
}

/// The crate whose modules the map does not layer: helpers of tests that import none of each
/// other ([`the_flat_crate_is_flat`] holds that).
const FLAT: &str = "test-support";

/// The crates whose modules the map layers: every crate of the workspace but [`FLAT`].
fn layered_crates() -> Vec<Crate> {
    let crates: Vec<Crate> =
        map_crates().iter().filter(|c| c.name != FLAT).map(|c| Crate::parse(&c.name)).collect();
    assert!(crates.len() >= 4, "too few crates parsed: {}", crates.len());
    for c in &crates {
        assert!(!c.files.is_empty(), "crate {}: no source file parsed", c.name);
    }
    crates
}

fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    fn visit<'a>(
        node: &'a String,
        edges: &'a BTreeSet<(String, String)>,
        state: &mut BTreeMap<&'a String, u8>,
        stack: &mut Vec<&'a String>,
    ) -> Option<Vec<String>> {
        state.insert(node, 1);
        stack.push(node);
        for (_, next) in edges.iter().filter(|(a, _)| a == node) {
            match state.get(next) {
                Some(1) => {
                    let at = stack.iter().position(|n| *n == next).unwrap_or(0);
                    let mut cycle: Vec<String> = stack[at..].iter().map(|s| (*s).clone()).collect();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(cycle) = visit(next, edges, state, stack) {
                        return Some(cycle);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node, 2);
        None
    }
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
    let mut state = BTreeMap::new();
    for node in nodes {
        if !state.contains_key(node)
            && let Some(cycle) = visit(node, edges, &mut state, &mut Vec::new())
        {
            return Some(cycle);
        }
    }
    None
}

/// The top-level modules a crate's files define.
fn top_modules(c: &Crate) -> BTreeSet<String> {
    c.files.iter().filter_map(|f| f.module.first().cloned()).collect()
}

#[test]
fn every_top_level_module_is_on_the_map_once() {
    for c in layered_crates() {
        let layers = c.layers();
        let mapped: Vec<&String> = layers.iter().flatten().collect();
        let unique: BTreeSet<&String> = mapped.iter().copied().collect();
        assert_eq!(mapped.len(), unique.len(), "docs/architecture.md lists a module of {} twice", c.name);
        let top = top_modules(&c);
        assert_eq!(
            unique,
            top.iter().collect(),
            "docs/architecture.md's modules of {} and its src/'s top-level modules",
            c.name
        );
    }
}

/// Each crate's top-level modules import only modules of a lower row of its table, or of
/// their own row without a cycle. A crate of more than one row must show imports between its
/// modules (else its order is a claim nothing checks), and a row of several modules must show
/// imports among them or be split — no part of the check is left without input.
#[test]
fn no_module_of_any_crate_imports_one_above_it() {
    let mut checked = 0;
    for c in layered_crates() {
        let layers = c.layers();
        let layer = |module: &str| layers.iter().position(|l| l.iter().any(|m| m == module)).unwrap();
        let top: Vec<((String, String), PathBuf)> = c
            .edges()
            .into_iter()
            .filter(|((from, _), _)| from.len() == 1)
            .map(|((from, to), file)| ((from[0].clone(), to[0].clone()), file))
            .collect();
        if layers.len() > 1 {
            assert!(
                !top.is_empty(),
                "{}: the map orders modules between which the scan found no import",
                c.name
            );
        }
        let upward: Vec<String> = top
            .iter()
            .filter(|((from, to), _)| layer(to) < layer(from))
            .map(|((from, to), file)| format!("{}: {from} imports {to} ({})", c.name, file.display()))
            .collect();
        assert!(upward.is_empty(), "imports against docs/architecture.md's order:\n{}", upward.join("\n"));
        for (row, modules) in layers.iter().enumerate().filter(|(_, m)| m.len() > 1) {
            let same: BTreeSet<(String, String)> = top
                .iter()
                .filter(|((from, to), _)| layer(from) == row && layer(to) == row)
                .map(|(edge, _)| edge.clone())
                .collect();
            assert!(
                !same.is_empty(),
                "{}: the row {modules:?} holds modules that import none of each other: one row each, ordered",
                c.name
            );
            if let Some(cycle) = find_cycle(&same) {
                panic!("{}: import cycle between modules of one row: {}", c.name, cycle.join(" -> "));
            }
        }
        checked += top.len();
    }
    assert!(checked >= 30, "the scan found too few imports between modules in all: {checked}");
}

#[test]
fn files_under_one_parent_have_no_import_cycle() {
    let mut count = 0;
    for c in layered_crates() {
        let mut by_parent: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
        for ((from, to), _) in c.edges() {
            let parent = from[..from.len() - 1].to_vec();
            if !parent.is_empty() {
                by_parent
                    .entry(parent)
                    .or_default()
                    .insert((from.last().unwrap().clone(), to.last().unwrap().clone()));
            }
        }
        count += by_parent.values().map(BTreeSet::len).sum::<usize>();
        for (parent, edges) in &by_parent {
            let cycle = find_cycle(edges);
            let excepted = CYCLES_ALLOWED.contains(&(c.name.as_str(), parent.join("/").as_str()));
            match cycle {
                Some(cycle) if !excepted => {
                    panic!("{}: import cycle under src/{}: {}", c.name, parent.join("/"), cycle.join(" -> "))
                }
                None if excepted => panic!(
                    "{}: src/{} has no import cycle any more: drop it from CYCLES_ALLOWED and the map",
                    c.name,
                    parent.join("/")
                ),
                _ => {}
            }
        }
    }
    assert!(count >= 20, "the scan found too few imports between sibling files: {count}");
}

/// Directories whose files may import each other in a cycle, as docs/architecture.md says
/// (crate, directory under `src/`): the simulated cluster's parts, one unit. The check fails
/// once such a directory has no cycle left, so the exception cannot outlive its need.
const CYCLES_ALLOWED: &[(&str, &str)] = &[("percolator-sim", "sim")];

/// The crate the map leaves unlayered has modules that import none of each other: once one
/// does, the map must order them.
#[test]
fn the_flat_crate_is_flat() {
    let c = Crate::parse(FLAT);
    assert!(top_modules(&c).len() >= 2, "{FLAT}: {:?}", top_modules(&c));
    let edges: Vec<_> = c.edges().into_keys().collect();
    assert!(edges.is_empty(), "{FLAT}'s modules import each other: give it a module table: {edges:?}");
}

/// The generic crates name nothing of the server built on them: no `percolator`, no kubelet,
/// no Prometheus, in code, comments or tests (the map's invariants).
#[test]
fn the_generic_crates_name_no_server_and_no_upstream() {
    let words = ["percolator", "kubelet", "prometheus"];
    let mut read = 0;
    let mut found = Vec::new();
    for name in ["apiserver", "k8s-wire"] {
        let path = map_crates().into_iter().find(|c| c.name == name).unwrap().path;
        let mut files = Vec::new();
        for dir in ["src", "examples"] {
            let dir = root().join(&path).join(dir);
            if dir.is_dir() {
                rust_files(&dir, &mut files);
            }
        }
        files.push(root().join(&path).join("Cargo.toml"));
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap().to_lowercase();
            read += 1;
            for (n, line) in text.lines().enumerate() {
                if let Some(word) = words.iter().find(|w| line.contains(*w)) {
                    found.push(format!("{}:{}: {word}", file.strip_prefix(root()).unwrap().display(), n + 1));
                }
            }
        }
    }
    assert!(read >= 20, "too few files of the generic crates read: {read}");
    assert!(found.is_empty(), "the generic crates name the server or an upstream:\n{}", found.join("\n"));
}

#[test]
fn every_source_file_says_what_it_owns() {
    let mut dirs = vec![root().join("src")];
    for entry in std::fs::read_dir(root().join("crates")).unwrap() {
        dirs.push(entry.unwrap().path().join("src"));
    }
    let mut seen = 0;
    let mut missing = Vec::new();
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                seen += 1;
                if !std::fs::read_to_string(&path).unwrap().trim_start().starts_with("//!") {
                    missing.push(path.strip_prefix(root()).unwrap().display().to_string());
                }
            }
        }
    }
    assert!(seen >= 100, "too few source files found: {seen}");
    assert!(missing.is_empty(), "files without a //! header: {missing:?}");
}

/// The resolver on a small file: grouped `use` trees, `super::`, inline paths, paths in macro
/// calls, a URL in a string (not a comment), and test code left out.
#[test]
fn the_scanner_resolves_what_the_compiler_would() {
    let text = r#"
        use crate::{a::B, b::{c::D, e}};
        use super::sibling::Thing;
        fn f() { let x = crate::f::g("http://example.com"); crate::h::i(); }
        fn m() { format!("{}", crate::j::K); format!("{}", f(crate::q::R)); }
        #[cfg(not(test))]
        fn n() { crate::p::f(); }
        #[cfg(test)]
        mod tests { use crate::z; }
        #[cfg(test)]
        fn t() { crate::y::f(); }
    "#;
    let module = vec!["sources".to_owned(), "prometheus".to_owned()];
    let modules = BTreeSet::new();
    let mut names = Names::new(&modules, &module);
    names.visit_file(&syn::parse_file(text).unwrap());
    let firsts: BTreeSet<String> = names.found.iter().map(|p| p.join("::")).collect();
    for expected in
        ["a::B", "b::c::D", "b::e", "sources::sibling::Thing", "f::g", "h::i", "j::K", "q::R", "p::f"]
    {
        assert!(firsts.contains(expected), "{expected} in {firsts:?}");
    }
    assert!(!firsts.iter().any(|p| p.starts_with('z') || p.starts_with('y')), "test code read: {firsts:?}");
    let mut glob = Names::new(&modules, &module);
    glob.visit_file(&syn::parse_file("use super::*; use crate::*; use crate::kinds::*;").unwrap());
    assert_eq!(glob.opaque_globs, ["super", "crate"]);
    assert_eq!(glob.found, [vec!["kinds".to_owned()]]);
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| ((*x).to_owned(), (*y).to_owned()))
        .collect();
    assert_eq!(find_cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
}

/// Routes through re-exports, a façade and a parent's private import are followed to the
/// module that defines the item; a bare path through a child module is a path into the crate.
#[test]
fn the_scanner_follows_reexports_to_where_an_item_is_defined() {
    let modules: BTreeSet<Vec<String>> =
        [vec![], vec!["kinds"], vec!["kinds", "listing"], vec!["api"], vec!["sources"]]
            .into_iter()
            .map(|m| m.into_iter().map(str::to_owned).collect())
            .collect();
    let parse = |module: &[&str], text: &str| {
        let module: Vec<String> = module.iter().map(|s| (*s).to_owned()).collect();
        let mut names = Names::new(&modules, &module);
        names.visit_file(&syn::parse_file(text).unwrap());
        let file = PathBuf::from(format!("{}.rs", module.join("/")));
        (SourceFile { file, module, names: names.found }, names.bindings)
    };
    let files = vec![
        parse(&[], "pub mod testing { pub use crate::kinds::Listing; pub use crate::sources::Pod as P; }"),
        parse(&["kinds"], "pub use listing::Listing; use crate::sources::Pod;"),
        parse(&["kinds", "listing"], "pub struct Listing;"),
        parse(&["api"], "use crate::testing::Listing; fn f(_: crate::testing::P) {}"),
        parse(&["sources"], "pub struct Pod;"),
    ];
    let mut c = Crate { name: "x".to_owned(), files: Vec::new(), modules, bindings: BTreeMap::new() };
    for (file, bound) in files {
        c.bindings.extend(bound);
        c.files.push(file);
    }
    let path = |s: &str| s.split("::").map(str::to_owned).collect::<Vec<_>>();
    assert_eq!(c.resolve(&path("testing::Listing")), path("kinds::listing::Listing"));
    assert_eq!(c.resolve(&path("testing::P")), path("sources::Pod"));
    let edges: BTreeSet<(String, String)> =
        c.edges().into_keys().map(|(from, to)| (from.join("::"), to.join("::"))).collect();
    assert!(edges.contains(&("api".to_owned(), "kinds".to_owned())), "{edges:?}");
    assert!(edges.contains(&("api".to_owned(), "sources".to_owned())), "{edges:?}");
    assert!(edges.contains(&("kinds".to_owned(), "sources".to_owned())), "{edges:?}");
    assert!(!edges.iter().any(|(_, to)| to == "testing"), "a façade is no module of its own: {edges:?}");
}
