//! The structure checks itself against its map, `docs/architecture.md`, which is read here:
//!
//! - the crates: the map's crate table names exactly the workspace's packages (from
//!   `cargo metadata`), at their paths, each with exactly the workspace crates it depends on,
//!   and every one of those is listed below it (the compiler then refuses an upward import);
//! - the modules of the `percolator` crate: its module table, top to bottom, is the layering;
//!   every file of `src/` is parsed as the compiler parses it (`syn`; test code, i.e. items
//!   under `#[cfg(test)]`, is left out) and each path it names (`use` trees, paths in code,
//!   `crate::`/`super::`/`self::` paths inside macro calls) is resolved to the module it
//!   reaches: no module imports one listed above it, and the files and directories under one
//!   parent import each other without a cycle;
//! - every source file of every crate starts with a `//!` header.
//!
//! Each check also asserts that it saw enough to mean something (files parsed, imports found),
//! so an empty scan fails instead of passing.

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

/// The modules of the `percolator` crate by layer, top to bottom.
fn map_layers() -> Vec<Vec<String>> {
    table("## Modules of `percolator`").into_iter().map(|cells| quoted(&cells[0])).collect()
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
// The modules of the percolator crate
// -------------------------------------------------------------------------------------------

/// A parsed file of `src/`: its module path (`sources/prometheus/mod.rs` → sources,
/// prometheus) and the module paths it names (resolved to absolute paths from the crate root).
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

/// Collects the paths a file names, outside test code, resolved against its module.
struct Names<'a> {
    module: &'a [String],
    found: Vec<Vec<String>>,
    /// `mod name;` declarations under `#[cfg(test)]`: their files are test code.
    test_modules: Vec<String>,
    /// Globs of the crate root or of an ancestor module (`use super::*` in production code).
    opaque_globs: Vec<String>,
    /// `use a::b as c`: the alias and the path it stands for.
    aliases: Vec<(String, Vec<String>)>,
}

impl<'a> Names<'a> {
    fn new(module: &'a [String]) -> Self {
        Names {
            module,
            found: Vec::new(),
            test_modules: Vec::new(),
            opaque_globs: Vec::new(),
            aliases: Vec::new(),
        }
    }

    /// `crate::a::b` → [a, b]; `super::x` and `self::x` relative to the file's module; other
    /// paths (external crates, local names) are not paths into the crate's modules: None.
    fn absolute(&self, segments: &[String]) -> Option<Vec<String>> {
        let first = segments.first()?;
        let mut base: Vec<String> = match first.as_str() {
            "crate" => Vec::new(),
            "self" | "super" => self.module.to_vec(),
            _ => return None,
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

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                let mut path = prefix.clone();
                if n.ident != "self" {
                    path.push(n.ident.to_string());
                }
                self.resolve(&path);
            }
            syn::UseTree::Rename(r) => {
                let mut path = prefix.clone();
                path.push(r.ident.to_string());
                if let Some(absolute) = self.absolute(&path).filter(|p| !p.is_empty()) {
                    self.aliases.push((r.rename.to_string(), absolute));
                }
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
                self.test_modules.push(m.ident.to_string());
            }
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

/// Every file of the `percolator` library (`src/`, without the binary's `main.rs` and without
/// test-only files), parsed.
fn library() -> Vec<SourceFile> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let src = root().join("src");
    let mut paths = Vec::new();
    walk(&src, &mut paths);
    let mut files = Vec::new();
    let mut test_files = BTreeSet::new();
    for path in paths {
        let file = path.strip_prefix(&src).unwrap().to_path_buf();
        if file == Path::new("main.rs") {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let parsed = syn::parse_file(&text).unwrap_or_else(|e| panic!("src/{}: {e}", file.display()));
        let module = module_path(&file);
        let mut names = Names::new(&module);
        names.visit_file(&parsed);
        for name in &names.test_modules {
            let mut child = module.clone();
            child.push(name.clone());
            test_files.insert(child);
        }
        let opaque = names.opaque_globs;
        let found = names.found;
        files.push((SourceFile { file, module, names: found }, opaque));
    }
    // A test module's file, and everything under it, is test code.
    files.retain(|(f, _)| !test_files.iter().any(|t| f.module.starts_with(t)));
    let opaque: Vec<String> = files
        .iter()
        .filter(|(_, globs)| !globs.is_empty())
        .map(|(f, globs)| format!("src/{}: {}", f.file.display(), globs.join(", ")))
        .collect();
    assert!(
        opaque.is_empty(),
        "globs of the crate root or an ancestor hide imports from this check: {opaque:?}"
    );
    let files: Vec<SourceFile> = files.into_iter().map(|(f, _)| f).collect();
    assert!(files.len() >= 40, "the scan parsed too few files of src/: {}", files.len());
    files
}

/// The modules that have a file (`kinds/registry.rs`, `sources/prometheus/mod.rs`, …).
fn modules(files: &[SourceFile]) -> BTreeSet<Vec<String>> {
    files.iter().map(|f| f.module.clone()).collect()
}

/// Items `lib.rs` re-exports (`pub use server::run`) by name → the module they come from.
fn root_reexports(files: &[SourceFile]) -> BTreeMap<String, String> {
    let lib = files.iter().find(|f| f.module.is_empty()).unwrap();
    let text = std::fs::read_to_string(root().join("src").join(&lib.file)).unwrap();
    let parsed = syn::parse_file(&text).unwrap();
    let mut out = BTreeMap::new();
    for item in parsed.items {
        if let syn::Item::Use(u) = item {
            let mut names = Names::new(&[]);
            names.use_tree(&mut vec!["crate".to_owned()], &u.tree);
            for path in names.found {
                if path.len() >= 2 {
                    out.insert(path.last().unwrap().clone(), path[0].clone());
                }
            }
            for (alias, path) in names.aliases {
                out.insert(alias, path[0].clone());
            }
        }
    }
    out
}

/// Edges between modules: (from, to) under their deepest common parent, with one file that
/// makes each. A path into one's own ancestors (a child using its parent's items) is no edge.
fn edges(files: &[SourceFile]) -> BTreeMap<(Vec<String>, Vec<String>), PathBuf> {
    let modules = modules(files);
    let reexports = root_reexports(files);
    let mut edges = BTreeMap::new();
    for file in files {
        for name in &file.names {
            let mut name = name.clone();
            if let Some(module) = reexports.get(&name[0]) {
                name.insert(0, module.clone());
            }
            let common = file.module.iter().zip(&name).take_while(|(a, b)| a == b).count();
            if common >= file.module.len() || common >= name.len() {
                continue; // within itself, or into an ancestor
            }
            let from = file.module[..=common].to_vec();
            let to = name[..=common].to_vec();
            if modules.contains(&to) {
                edges.entry((from, to)).or_insert_with(|| file.file.clone());
            }
        }
    }
    edges
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

#[test]
fn every_top_level_module_is_on_the_map() {
    let layers = map_layers();
    let mapped: BTreeSet<&String> = layers.iter().flatten().collect();
    let files = library();
    let top: BTreeSet<&String> = files.iter().filter_map(|f| f.module.first()).collect();
    assert_eq!(mapped, top, "docs/architecture.md's modules of percolator and src/'s top-level modules");
}

#[test]
fn no_module_imports_from_a_module_above_it() {
    let layers = map_layers();
    let layer = |module: &str| layers.iter().position(|l| l.iter().any(|m| m == module)).unwrap();
    let files = library();
    let top: Vec<((String, String), PathBuf)> = edges(&files)
        .into_iter()
        .filter(|((from, _), _)| from.len() == 1)
        .map(|((from, to), file)| ((from[0].clone(), to[0].clone()), file))
        .collect();
    assert!(top.len() >= 15, "the scan found too few imports between modules: {top:?}");
    let upward: Vec<String> = top
        .iter()
        .filter(|((from, to), _)| layer(to) < layer(from))
        .map(|((from, to), file)| format!("{from} imports {to} (src/{})", file.display()))
        .collect();
    assert!(upward.is_empty(), "imports against docs/architecture.md's order:\n{}", upward.join("\n"));
    let same: BTreeSet<(String, String)> =
        top.iter().filter(|((from, to), _)| layer(from) == layer(to)).map(|(edge, _)| edge.clone()).collect();
    if let Some(cycle) = find_cycle(&same) {
        panic!("import cycle between modules of one layer: {}", cycle.join(" -> "));
    }
}

#[test]
fn files_under_one_parent_have_no_import_cycle() {
    let files = library();
    let mut by_parent: BTreeMap<Vec<String>, BTreeSet<(String, String)>> = BTreeMap::new();
    for ((from, to), _) in edges(&files) {
        let parent = from[..from.len() - 1].to_vec();
        if !parent.is_empty() {
            by_parent
                .entry(parent)
                .or_default()
                .insert((from.last().unwrap().clone(), to.last().unwrap().clone()));
        }
    }
    let count: usize = by_parent.values().map(BTreeSet::len).sum();
    assert!(count >= 20, "the scan found too few imports between sibling files: {by_parent:?}");
    for (parent, edges) in &by_parent {
        if let Some(cycle) = find_cycle(edges) {
            panic!("import cycle under src/{}: {}", parent.join("/"), cycle.join(" -> "));
        }
    }
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
    let mut names = Names::new(&module);
    names.visit_file(&syn::parse_file(text).unwrap());
    let firsts: BTreeSet<String> = names.found.iter().map(|p| p.join("::")).collect();
    for expected in
        ["a::B", "b::c::D", "b::e", "sources::sibling::Thing", "f::g", "h::i", "j::K", "q::R", "p::f"]
    {
        assert!(firsts.contains(expected), "{expected} in {firsts:?}");
    }
    assert!(!firsts.iter().any(|p| p.starts_with('z') || p.starts_with('y')), "test code read: {firsts:?}");
    let mut glob = Names::new(&module);
    glob.visit_file(&syn::parse_file("use super::*; use crate::*; use crate::kinds::*;").unwrap());
    assert_eq!(glob.opaque_globs, ["super", "crate"]);
    assert_eq!(glob.found, [vec!["kinds".to_owned()]]);
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| ((*x).to_owned(), (*y).to_owned()))
        .collect();
    assert_eq!(find_cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
}
