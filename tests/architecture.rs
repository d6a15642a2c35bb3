//! The structure of `src/` checks itself: the layering of `docs/architecture.md`, written once
//! here, with no upward import and no import cycle; and a `//!` header on every module file.
//!
//! Reads every `.rs` file of the library (`src/`, except the binaries: `src/main.rs` and
//! `src/bin/`, which sit above every layer) and takes each `crate::<module>` path it names
//! (in `use` lines and inline paths alike; comments are skipped) as an import of that
//! top-level module, and each `super::<item>`/`crate::<module>::<item>` path naming a sibling
//! file as an import of that file. Test code (`#[cfg(test)]` modules, inline or in their own
//! files) is not production structure and is left out: a test may wire its module with
//! anything it needs.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Top-level modules by layer, top to bottom. A module may import from its own layer (without
/// a cycle) and from the layers below it, never from a layer above.
const LAYERS: &[&[&str]] = &[
    // Wiring: builds sources, kinds, APIs, auth and TLS; serves.
    &["server"],
    // HTTP: routing, negotiation, discovery, OpenAPI, rendering; authentication and
    // authorization.
    &["api", "auth"],
    // The APIs of metrics, one module each.
    &["metrics"],
    // The served kinds, one unit each, and their registry.
    &["kinds"],
    // prometheus-adapter configuration: format, discovery, naming, query building (pure).
    &["adapter"],
    // The upstreams (inventory, kubelets, Prometheus) behind narrow traits.
    &["sources"],
    // TTL + single flight, generic over what it caches (the kubelet source caches too).
    &["cache"],
    // Leaves: flags and the query file, serving certificates, own metrics and logs.
    &["config", "tls", "telemetry"],
    // Kubernetes wire types: imports nothing else of the crate.
    &["k8s"],
];

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Every library source file, relative to `src/`.
fn library_files() -> Vec<PathBuf> {
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
    let mut files = Vec::new();
    walk(&src(), &mut files);
    let root = src();
    let mut files: Vec<PathBuf> = files
        .into_iter()
        .map(|f| f.strip_prefix(&root).unwrap().to_path_buf())
        .filter(|f| !f.starts_with("bin") && f != Path::new("main.rs"))
        .collect();
    let tests = test_module_files(&files);
    files.retain(|f| !tests.contains(f));
    files.sort();
    files
}

/// Files that hold a `#[cfg(test)] mod name;` declared by their parent.
fn test_module_files(files: &[PathBuf]) -> BTreeSet<PathBuf> {
    let mut tests = BTreeSet::new();
    for file in files {
        let stem = file.file_stem().unwrap().to_str().unwrap();
        let dir = if stem == "mod" || file == Path::new("lib.rs") {
            file.parent().unwrap().to_path_buf()
        } else {
            file.with_extension("")
        };
        let text = std::fs::read_to_string(src().join(file)).unwrap();
        let lines: Vec<&str> = text.lines().map(str::trim).collect();
        for pair in lines.windows(2) {
            if pair[0] == "#[cfg(test)]"
                && let Some(name) =
                    pair[1].strip_prefix("mod ").or_else(|| pair[1].strip_prefix("pub(crate) mod "))
                && let Some(name) = name.strip_suffix(';')
            {
                tests.insert(dir.join(format!("{name}.rs")));
                tests.insert(dir.join(name).join("mod.rs"));
            }
        }
    }
    tests
}

/// The production code of a file: without its comments (doc comments included) and without
/// its inline `#[cfg(test)] mod … { … }` blocks.
fn code(text: &str) -> String {
    let mut out = Vec::new();
    let mut lines = text.lines().map(|line| match line.find("//") {
        // A `//` inside a string literal (a URL) is rare in paths; cutting there only loses
        // the rest of that line.
        Some(at) => &line[..at],
        None => line,
    });
    while let Some(line) = lines.next() {
        if line.trim() != "#[cfg(test)]" {
            out.push(line);
            continue;
        }
        let Some(next) = lines.next() else { break };
        if !(next.trim_start().starts_with("mod ") && next.trim_end().ends_with('{')) {
            // A test-only item or `mod name;` (its file is left out by `library_files`).
            continue;
        }
        let mut depth = 1i32;
        for line in lines.by_ref() {
            depth += line.matches('{').count() as i32 - line.matches('}').count() as i32;
            if depth <= 0 {
                break;
            }
        }
    }
    out.join("\n")
}

/// Identifiers that follow `prefix` (`crate::`), including inside a `{a, b::c}` group.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    let mut found = Vec::new();
    let mut rest = code;
    while let Some(at) = rest.find(prefix) {
        let before = rest[..at].chars().last();
        rest = &rest[at + prefix.len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        collect_tree(rest, &mut Vec::new(), &mut found);
    }
    found
}

/// Parses `a::b::{c, d::e}` at the start of `text` into its paths.
fn collect_tree(text: &str, base: &mut Vec<String>, out: &mut Vec<Vec<String>>) -> usize {
    let mut i = 0;
    let bytes = text.as_bytes();
    let ident = |i: &mut usize| {
        let start = *i;
        while *i < bytes.len() && (bytes[*i].is_ascii_alphanumeric() || bytes[*i] == b'_') {
            *i += 1;
        }
        text[start..*i].to_owned()
    };
    let depth = base.len();
    loop {
        if text[i..].starts_with('{') {
            i += 1;
            loop {
                while i < bytes.len() && (bytes[i] as char).is_whitespace() {
                    i += 1;
                }
                if i >= bytes.len() || bytes[i] == b'}' {
                    i += 1;
                    break;
                }
                i += collect_tree(&text[i..], base, out);
                while i < bytes.len() && ((bytes[i] as char).is_whitespace() || bytes[i] == b',') {
                    i += 1;
                }
            }
            base.truncate(depth);
            return i;
        }
        let name = ident(&mut i);
        if name.is_empty() {
            break;
        }
        base.push(name);
        if text[i..].starts_with("::") {
            i += 2;
        } else {
            break;
        }
    }
    if base.len() > depth {
        out.push(base.clone());
    }
    base.truncate(depth);
    i
}

fn layer_of(module: &str) -> usize {
    LAYERS
        .iter()
        .position(|layer| layer.contains(&module))
        .unwrap_or_else(|| panic!("module `{module}` is in no layer of tests/architecture.rs: add it there"))
}

/// The top-level module of a file (`kinds/registry.rs` → `kinds`; `lib.rs` → none).
fn top_module(file: &Path) -> Option<String> {
    let first = file.components().next()?.as_os_str().to_str()?.to_owned();
    if first == "lib.rs" {
        return None;
    }
    Some(first.trim_end_matches(".rs").to_owned())
}

/// Imports between top-level modules, with one file that makes each.
fn module_imports() -> BTreeMap<(String, String), PathBuf> {
    let mut edges = BTreeMap::new();
    for file in library_files() {
        let Some(from) = top_module(&file) else { continue };
        let text = std::fs::read_to_string(src().join(&file)).unwrap();
        for path in paths_after(&code(&text), "crate::") {
            let to = &path[0];
            if *to != from && LAYERS.iter().any(|l| l.contains(&to.as_str())) {
                edges.entry((from.clone(), to.clone())).or_insert_with(|| file.clone());
            }
        }
    }
    edges
}

/// A cycle in `edges`, if any, as the list of its nodes.
fn find_cycle(edges: &BTreeSet<(String, String)>) -> Option<Vec<String>> {
    let nodes: BTreeSet<&String> = edges.iter().flat_map(|(a, b)| [a, b]).collect();
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
fn every_top_level_module_has_a_layer() {
    let lib = std::fs::read_to_string(src().join("lib.rs")).unwrap();
    let declared: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod ").or_else(|| l.trim().strip_prefix("mod ")))
        .map(|l| l.trim_end_matches(';'))
        .collect();
    assert!(!declared.is_empty());
    for module in declared {
        layer_of(module);
    }
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let upward: Vec<String> = module_imports()
        .into_iter()
        .filter(|((from, to), _)| layer_of(to) < layer_of(from))
        .map(|((from, to), file)| format!("{from} imports {to} (src/{})", file.display()))
        .collect();
    assert!(upward.is_empty(), "upward imports:\n{}", upward.join("\n"));
}

#[test]
fn top_level_modules_have_no_import_cycle() {
    let edges: BTreeSet<(String, String)> = module_imports().into_keys().collect();
    assert!(edges.len() > 10, "the import scan found too little: {edges:?}");
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle: {}", cycle.join(" -> "));
    }
}

/// Within each module, sibling files (not the module's own `mod.rs`, which declares and
/// re-exports them) import each other without a cycle.
#[test]
fn sibling_files_have_no_import_cycle() {
    let files = library_files();
    let mut edges = BTreeSet::new();
    for file in &files {
        let Some(dir) = file.parent().filter(|d| !d.as_os_str().is_empty()) else { continue };
        let stem = file.file_stem().unwrap().to_str().unwrap();
        if stem == "mod" {
            continue;
        }
        let sibling = |name: &str| {
            let candidate = dir.join(format!("{name}.rs"));
            let nested = dir.join(name).join("mod.rs");
            (name != stem && (files.contains(&candidate) || files.contains(&nested))).then(|| name.to_owned())
        };
        let module_path: Vec<String> =
            dir.components().map(|c| c.as_os_str().to_str().unwrap().to_owned()).collect();
        let text = code(&std::fs::read_to_string(src().join(file)).unwrap());
        let mut targets = Vec::new();
        for path in paths_after(&text, "super::") {
            targets.extend(path.first().and_then(|n| sibling(n)));
        }
        for path in paths_after(&text, "crate::") {
            if path.len() > module_path.len() && path[..module_path.len()] == module_path[..] {
                targets.extend(sibling(&path[module_path.len()]));
            }
        }
        for target in targets {
            edges.insert((format!("{}/{stem}", dir.display()), format!("{}/{target}", dir.display())));
        }
    }
    if let Some(cycle) = find_cycle(&edges) {
        panic!("import cycle between files: {}", cycle.join(" -> "));
    }
}

#[test]
fn every_module_file_says_what_it_owns() {
    let missing: Vec<String> = library_files()
        .into_iter()
        .filter(|f| {
            let text = std::fs::read_to_string(src().join(f)).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .map(|f| format!("src/{}", f.display()))
        .collect();
    assert!(missing.is_empty(), "files without a //! header: {missing:?}");
}

#[test]
fn the_scanner_reads_grouped_and_inline_paths() {
    let code = code(
        "use crate::{a::B, b::{c::D, e}};\nlet x = crate::f::g(); // crate::h\nnotcrate::i\n\
         #[cfg(test)]\nmod tests {\n    use crate::z;\n    fn f() {}\n}\n",
    );
    let found = paths_after(&code, "crate::");
    let firsts: Vec<&str> = found.iter().map(|p| p[0].as_str()).collect();
    assert_eq!(firsts, ["a", "b", "b", "f"]);
    assert_eq!(found[1], ["b", "c", "D"]);
    let edges: BTreeSet<(String, String)> = [("a", "b"), ("b", "c"), ("c", "a")]
        .iter()
        .map(|(x, y)| ((*x).to_owned(), (*y).to_owned()))
        .collect();
    assert_eq!(find_cycle(&edges).unwrap(), ["a", "b", "c", "a"]);
}
