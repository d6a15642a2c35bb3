//! The container image's build, on every test run and without a container engine or registry:
//! the `Dockerfile`'s build of each architecture the release publishes is replayed on the context
//! Docker would send.
//!
//! The context is the repository as it is on disk (a directory walk: untracked files are sent
//! too, as Docker sends them) filtered by `.dockerignore`, read with the part of Docker's ignore
//! syntax the file uses; any other syntax fails the test, so that the replay never silently
//! differs from Docker. For each platform of the release workflow (`.github/workflows/release.yml`,
//! `linux/amd64` and `linux/arm64`), the stage the runtime stage copies from is followed as
//! BuildKit follows it: `FROM build-${TARGETARCH}` to that architecture's build stage, then `FROM
//! toolchain` to the toolchain stage. That chain's instructions are replayed in a temporary
//! directory standing for the stage's `/`: `WORKDIR`, `ENV`, `COPY` from the context (exactly the
//! files Docker would copy), and the shell commands of each `RUN`, parsed rather than hard-coded:
//! its cargo invocations run in the layout with `--offline` from the local cargo cache, stopping
//! short of compiling (a release build would cost minutes): a `cargo zigbuild --target T` (or
//! `cargo build`) becomes `cargo fetch --target T` with the same lock flags (it reads every
//! manifest and target, which `cargo metadata --no-deps` does not: a declared `[[bench]]` missing
//! from the context fails it) plus `cargo metadata`, which must show each `--bin` it names as a
//! bin target with its source in the layout. The tools the toolchain stage installs (packages,
//! pinned PyPI and crates.io tools, `rustup target add`) are not replayed: their pins are checked,
//! and a `--target` must be one the toolchain added. `cp` of a built binary is followed from the
//! path cargo writes for that target (a cache-mounted `target/` is gone after its `RUN`), and so
//! is the runtime stage's `COPY --from` of it into the `ENTRYPOINT`. Files read at compile time
//! (`include_str!`, `include_bytes!`) outside the test code must be in the layout.
//! `scripts/install-deps.sh` fetches the crates of both targets while online, so that the replay
//! finds them on a fresh machine.
//!
//! Without replaying: each architecture's stage compiles for that architecture's musl target
//! (amd64: `x86_64-unknown-linux-musl`, arm64: `aarch64-unknown-linux-musl`), and the build
//! stages' architectures are the release's platforms; the toolchain stage runs on the build
//! platform (`--platform=$BUILDPLATFORM`: cross-compiled, never emulated), its Rust is
//! `rust-toolchain.toml`'s channel and every tool it installs is pinned; no platform argument is
//! given a default; the runtime stage is of the target platform, distroless, non-root (numeric
//! `USER`), its entry point `/percolator`, its `--cert-dir` default (from the binary's `--help`)
//! resolves under `/tmp` (the Deployment's emptyDir, the root filesystem being read-only); every
//! image pulled from a registry is pinned by a digest with its tag beside it
//! (`name:tag@sha256:…`: the tag says which release, the digest fixes the bytes; Dependabot moves
//! both); every cargo invocation is `--locked`; the build stages write no hand-made files;
//! `target/` and the registry are cache mounts, one of each per target; the version label comes
//! from a build argument `scripts/build-image.sh` passes.
//!
//! What it cannot check: the base images and tools (nothing is pulled, so neither whether a
//! digest is its tag's multi-arch index), compilation with zig for musl, and the multi-arch build
//! itself; CI's image job (`.github/workflows/ci.yml`: BuildKit refuses an image whose content
//! does not match the digest) and `scripts/build-image.sh` do those where an engine runs.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::Command;

use common::{mk_scratch, repo_read, repo_root};
use serde_json::Value;

// ---------------------------------------------------------------------------------------------
// The Dockerfile
// ---------------------------------------------------------------------------------------------

#[derive(Debug)]
struct Instruction {
    line: usize,
    keyword: String,
    args: String,
}

#[derive(Debug)]
struct Stage {
    line: usize,
    image: String,
    name: Option<String>,
    /// `FROM --platform=...`'s value, as written (`$BUILDPLATFORM`).
    platform: Option<String>,
    instructions: Vec<Instruction>,
}

impl Stage {
    fn all<'a>(&'a self, keyword: &'a str) -> impl Iterator<Item = &'a Instruction> + 'a {
        self.instructions.iter().filter(move |i| i.keyword == keyword)
    }
}

/// The Dockerfile's stages, with continuation lines joined and comments dropped.
fn mk_stages(text: &str) -> Vec<Stage> {
    let mut instructions: Vec<Instruction> = Vec::new();
    let mut pending: Option<(usize, String)> = None;
    for (index, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if index == 0 && line.starts_with('#') && line.contains("escape=") {
            panic!("Dockerfile: the escape directive is not understood by tests/image.rs");
        }
        if line.starts_with('#') || (line.is_empty() && pending.is_none()) {
            continue;
        }
        let (body, continues) = match line.strip_suffix('\\') {
            Some(body) => (body, true),
            None => (line, false),
        };
        let (start, mut joined) = pending.take().unwrap_or((index + 1, String::new()));
        joined.push_str(body);
        joined.push(' ');
        if continues {
            pending = Some((start, joined));
            continue;
        }
        let joined = joined.trim();
        if joined.is_empty() {
            continue;
        }
        let (keyword, args) = joined.split_once(char::is_whitespace).unwrap_or((joined, ""));
        assert!(
            !args.contains("<<"),
            "Dockerfile line {start}: heredocs are not understood by tests/image.rs: {joined}"
        );
        instructions.push(Instruction {
            line: start,
            keyword: keyword.to_uppercase(),
            args: args.trim().to_owned(),
        });
    }
    assert!(pending.is_none(), "Dockerfile ends in a continuation line");
    let mut stages: Vec<Stage> = Vec::new();
    let mut global_args = Vec::new();
    for instruction in instructions {
        if instruction.keyword == "FROM" {
            let mut platform = None;
            for flag in instruction.args.split_whitespace().filter_map(|w| w.strip_prefix("--")) {
                match flag.split_once('=') {
                    Some(("platform", value)) => platform = Some(value.to_owned()),
                    _ => panic!(
                        "Dockerfile line {}: FROM --{flag} is not understood by tests/image.rs",
                        instruction.line
                    ),
                }
            }
            let words: Vec<&str> =
                instruction.args.split_whitespace().filter(|w| !w.starts_with("--")).collect();
            let name = match words.as_slice() {
                [_] => None,
                [_, as_, name] if as_.eq_ignore_ascii_case("as") => Some((*name).to_owned()),
                _ => panic!(
                    "Dockerfile line {}: FROM {} is not understood",
                    instruction.line, instruction.args
                ),
            };
            stages.push(Stage {
                line: instruction.line,
                image: words[0].to_owned(),
                name,
                platform,
                instructions: Vec::new(),
            });
        } else if let Some(stage) = stages.last_mut() {
            stage.instructions.push(instruction);
        } else {
            assert_eq!(
                instruction.keyword, "ARG",
                "Dockerfile line {}: before the first FROM",
                instruction.line
            );
            global_args.push(instruction.args);
        }
    }
    // BuildKit sets the platform arguments per platform; one given a default in the global scope
    // becomes an ordinary argument with that value, the same for every platform, and each
    // platform would get that one architecture's binary.
    for arg in &global_args {
        let name = arg.split('=').next().unwrap_or_default();
        assert!(
            !(PLATFORM_ARGS.contains(&name) && arg.contains('=')),
            "Dockerfile: ARG {arg}: a default for a platform argument fixes it for every platform"
        );
    }
    assert!(stages.len() >= 2, "Dockerfile: a build stage and a runtime stage expected");
    stages
}

/// BuildKit's automatic platform arguments.
const PLATFORM_ARGS: [&str; 8] = [
    "BUILDPLATFORM",
    "BUILDOS",
    "BUILDARCH",
    "BUILDVARIANT",
    "TARGETPLATFORM",
    "TARGETOS",
    "TARGETARCH",
    "TARGETVARIANT",
];

/// `COPY` flags and words: (`--from` stage, sources, destination).
fn mk_copy(instruction: &Instruction) -> (Option<String>, Vec<String>, String) {
    let mut from = None;
    let mut words = Vec::new();
    assert!(!instruction.args.starts_with('['), "Dockerfile line {}: COPY's JSON form", instruction.line);
    for word in instruction.args.split_whitespace() {
        if let Some(flag) = word.strip_prefix("--") {
            match flag.split_once('=') {
                Some(("from", stage)) => from = Some(stage.to_owned()),
                Some(("chown" | "chmod", _)) => {}
                None if flag == "link" => {}
                _ => panic!(
                    "Dockerfile line {}: COPY --{flag} is not understood by tests/image.rs",
                    instruction.line
                ),
            }
        } else {
            words.push(word.to_owned());
        }
    }
    let destination = words
        .pop()
        .unwrap_or_else(|| panic!("Dockerfile line {}: COPY without a destination", instruction.line));
    assert!(!words.is_empty(), "Dockerfile line {}: COPY without a source", instruction.line);
    (from, words, destination)
}

/// `RUN` flags (`--mount=...`, ...) and its shell script.
fn mk_run(instruction: &Instruction) -> (Vec<BTreeMap<String, String>>, String) {
    assert!(!instruction.args.starts_with('['), "Dockerfile line {}: RUN's JSON form", instruction.line);
    let mut rest = instruction.args.as_str();
    let mut mounts = Vec::new();
    while let Some(flag) = rest.strip_prefix("--") {
        let (flag, after) = flag.split_once(char::is_whitespace).unwrap_or((flag, ""));
        rest = after.trim_start();
        match flag.split_once('=') {
            Some(("mount", options)) => mounts.push(
                options
                    .split(',')
                    .map(|kv| {
                        kv.split_once('=')
                            .map_or((kv.to_owned(), String::new()), |(k, v)| (k.to_owned(), v.to_owned()))
                    })
                    .collect(),
            ),
            Some(("network" | "security", _)) => {}
            _ => panic!(
                "Dockerfile line {}: RUN --{flag} is not understood by tests/image.rs",
                instruction.line
            ),
        }
    }
    (mounts, rest.to_owned())
}

#[derive(Debug, PartialEq)]
enum Token {
    Word(String),
    Op(&'static str),
}

/// A RUN script as `sh` would split it, for the plain subset a build stage needs: words,
/// quotes, `&&`, `;` and `>`/`>>`. Expansions, globs, pipes and the like fail the test: the
/// replay would not be what the shell does.
fn mk_tokens(script: &str, line: usize) -> Vec<Token> {
    let unsupported = |what: &str| -> ! {
        panic!("Dockerfile line {line}: {what} in a RUN script is not replayed by tests/image.rs: {script}")
    };
    let mut tokens = Vec::new();
    let mut word: Option<String> = None;
    let mut chars = script.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            c if c.is_whitespace() => {
                if let Some(w) = word.take() {
                    tokens.push(Token::Word(w));
                }
            }
            '\'' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('\'') => break,
                        Some(c) => w.push(c),
                        None => unsupported("an unterminated quote"),
                    }
                }
            }
            '"' => {
                let w = word.get_or_insert_with(String::new);
                loop {
                    match chars.next() {
                        Some('"') => break,
                        Some('\\') => match chars.next() {
                            Some(c @ ('"' | '\\' | '$' | '`')) => w.push(c),
                            Some(c) => {
                                w.push('\\');
                                w.push(c);
                            }
                            None => unsupported("an unterminated quote"),
                        },
                        Some('$' | '`') => unsupported("an expansion"),
                        Some(c) => w.push(c),
                        None => unsupported("an unterminated quote"),
                    }
                }
            }
            '\\' => match chars.next() {
                Some(c) => word.get_or_insert_with(String::new).push(c),
                None => unsupported("a trailing backslash"),
            },
            '&' | '|' | ';' | '>' => {
                if let Some(w) = word.take() {
                    if w.chars().all(|c| c.is_ascii_digit()) && c == '>' {
                        unsupported("a file descriptor redirection");
                    }
                    tokens.push(Token::Word(w));
                }
                let doubled = chars.peek() == Some(&c);
                if doubled {
                    chars.next();
                }
                tokens.push(Token::Op(match (c, doubled) {
                    ('&', true) => "&&",
                    ('|', true) => "||",
                    ('|', false) => "|",
                    (';', false) => ";",
                    ('>', false) => ">",
                    ('>', true) => ">>",
                    _ => unsupported("this operator"),
                }));
            }
            '$' | '`' => unsupported("an expansion"),
            '*' | '?' | '[' => unsupported("a glob"),
            '<' | '(' | ')' => unsupported("redirection or a subshell"),
            '#' if word.is_none() => unsupported("a comment"),
            c => word.get_or_insert_with(String::new).push(c),
        }
    }
    tokens.extend(word.map(Token::Word));
    tokens
}

/// A simple command: its words and the file its output is redirected to, if any.
#[derive(Debug)]
struct Simple {
    words: Vec<String>,
    output: Option<String>,
}

fn mk_commands(script: &str, line: usize) -> Vec<Simple> {
    let mut commands = vec![Simple { words: Vec::new(), output: None }];
    let mut tokens = mk_tokens(script, line).into_iter();
    while let Some(token) = tokens.next() {
        let current = commands.last_mut().unwrap();
        match token {
            Token::Word(w) => current.words.push(w),
            Token::Op("&&" | ";") => commands.push(Simple { words: Vec::new(), output: None }),
            Token::Op(">" | ">>") => match tokens.next() {
                Some(Token::Word(file)) => current.output = Some(file),
                _ => panic!("Dockerfile line {line}: a redirection without a file: {script}"),
            },
            Token::Op(op) => panic!(
                "Dockerfile line {line}: `{op}` in a RUN script is not replayed by tests/image.rs: {script}"
            ),
        }
    }
    commands.retain(|c| !c.words.is_empty());
    commands
}

/// Every simple command of the stage's RUN instructions, with its line.
fn commands_of(stage: &Stage) -> Vec<(usize, Simple)> {
    stage
        .all("RUN")
        .flat_map(|run| {
            let (_, script) = mk_run(run);
            mk_commands(&script, run.line).into_iter().map(|c| (run.line, c)).collect::<Vec<_>>()
        })
        .collect()
}

/// A platform the image is built for (`linux/arm64`): its os, its architecture as BuildKit names
/// it (`TARGETARCH`) and the musl target triple its binary is compiled for.
#[derive(Debug, Clone)]
struct Platform {
    name: String,
    arch: String,
    triple: &'static str,
}

fn mk_platform(name: &str) -> Platform {
    let (os, arch) = name.split_once('/').unwrap_or_else(|| panic!("platform {name}: OS/ARCH expected"));
    assert_eq!(os, "linux", "platform {name}: the image is a Linux image");
    let triple = match arch {
        "amd64" => "x86_64-unknown-linux-musl",
        "arm64" => "aarch64-unknown-linux-musl",
        _ => panic!("platform {name}: tests/image.rs knows the musl target of amd64 and arm64 only"),
    };
    Platform { name: name.to_owned(), arch: arch.to_owned(), triple }
}

/// The platforms the release workflow builds (its build-push-action's `platforms`).
fn release_platforms() -> Vec<Platform> {
    let workflow: Value = serde_saphyr::from_str(&repo_read(".github/workflows/release.yml"))
        .unwrap_or_else(|e| panic!(".github/workflows/release.yml: {e}"));
    let platforms: Vec<&str> = workflow["jobs"]
        .as_object()
        .expect("jobs")
        .values()
        .flat_map(|job| job["steps"].as_array().into_iter().flatten())
        .filter(|step| step["uses"].as_str().is_some_and(|u| u.starts_with("docker/build-push-action@")))
        .filter_map(|step| step["with"]["platforms"].as_str())
        .collect();
    let [platforms] = platforms[..] else {
        panic!(
            ".github/workflows/release.yml: one build-push-action step with platforms expected: {platforms:?}"
        )
    };
    platforms.split(',').map(|p| mk_platform(p.trim())).collect()
}

/// `text` with BuildKit's platform arguments of `platform` expanded (`build-${TARGETARCH}`).
fn expand_platform(text: &str, platform: &Platform) -> String {
    let mut out = text.to_owned();
    for (name, value) in [
        ("TARGETPLATFORM", platform.name.as_str()),
        ("TARGETOS", "linux"),
        ("TARGETARCH", platform.arch.as_str()),
    ] {
        out = out.replace(&format!("${{{name}}}"), value).replace(&format!("${name}"), value);
    }
    assert!(!out.contains('$'), "Dockerfile: `{text}`: an argument tests/image.rs does not expand");
    out
}

fn stage_named<'a>(stages: &'a [Stage], name: &str) -> Option<&'a Stage> {
    stages.iter().find(|s| s.name.as_deref() == Some(name))
}

/// An image reference `name[:tag][@sha256:digest]` split into its parts, as Docker splits it:
/// the tag is after the last `:` that follows the last `/` (a registry's `host:port` is not one).
#[derive(Debug, PartialEq)]
struct Reference<'a> {
    name: &'a str,
    tag: Option<&'a str>,
    digest: Option<&'a str>,
}

fn mk_reference(image: &str) -> Reference<'_> {
    let (rest, digest) = match image.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (image, None),
    };
    let last_component = rest.rfind('/').map_or(0, |i| i + 1);
    match rest[last_component..].rfind(':') {
        Some(i) => Reference {
            name: &rest[..last_component + i],
            tag: Some(&rest[last_component + i + 1..]),
            digest,
        },
        None => Reference { name: rest, tag: None, digest },
    }
}

/// The stage the runtime stage copies from, by name (one for every platform: `build`).
fn copied_from(stages: &[Stage]) -> String {
    let runtime = stages.last().unwrap();
    let froms: BTreeSet<String> = runtime.all("COPY").filter_map(|c| mk_copy(c).0).collect();
    assert_eq!(froms.len(), 1, "the runtime stage should copy from exactly one build stage: {froms:?}");
    froms.first().unwrap().clone()
}

/// The stages BuildKit runs for the runtime stage's `COPY --from` on `platform`, from the one
/// that starts from an image to the one copied from (`toolchain`, `build-arm64`, `build`).
fn mk_chain<'a>(stages: &'a [Stage], platform: &Platform) -> Vec<&'a Stage> {
    let mut name = copied_from(stages);
    let mut chain = Vec::new();
    loop {
        let stage = stage_named(stages, &name)
            .unwrap_or_else(|| panic!("{}: FROM/COPY --from {name}: no stage of that name", platform.name));
        assert!(chain.len() < stages.len(), "Dockerfile: the stages' FROM lines loop");
        chain.push(stage);
        let base = expand_platform(&stage.image, platform);
        if stage_named(stages, &base).is_none() {
            // An image name BuildKit computes per platform is meant to be a stage of this file.
            assert!(
                !stage.image.contains('$'),
                "Dockerfile line {}: FROM {}: no stage {base} for {}",
                stage.line,
                stage.image,
                platform.name
            );
            break;
        }
        name = base;
    }
    chain.reverse();
    chain
}

// ---------------------------------------------------------------------------------------------
// .dockerignore and the context
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, Copy, PartialEq)]
enum Glob {
    Literal(u8),
    /// `*`: any run of characters other than `/`.
    Star,
    /// `?`: one character other than `/`.
    Question,
    /// `**/` (or `**` inside a pattern): any number of whole directories, none included.
    Directories,
    /// `**` at the end: anything.
    Rest,
}

#[derive(Debug)]
struct Pattern {
    exception: bool,
    globs: Vec<Glob>,
}

/// `.dockerignore` as Docker reads it (moby/patternmatcher): a line starting with `#` is a
/// comment, others are trimmed, `!` makes an exception, a leading `/` and trailing `/` are
/// dropped. Of the matching syntax, `*`, `**` and `?` are understood; anything else (character
/// classes, escapes, `.`/`..` path elements) fails the test rather than being read differently
/// from Docker.
fn mk_patterns(text: &str) -> Result<Vec<Pattern>, String> {
    let mut patterns = Vec::new();
    for (index, line) in text.trim_start_matches('\u{feff}').lines().enumerate() {
        if line.starts_with('#') {
            continue;
        }
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let (exception, pattern) = match line.strip_prefix('!') {
            Some(rest) => (true, rest.trim()),
            None => (false, line),
        };
        let cleaned = pattern.trim_start_matches('/').trim_end_matches('/');
        let segments: Vec<&str> = cleaned.split('/').filter(|s| !s.is_empty()).collect();
        let unsupported = segments.is_empty()
            || segments.iter().any(|s| *s == "." || *s == "..")
            || cleaned.chars().any(|c| matches!(c, '[' | ']' | '\\') || c.is_whitespace());
        if unsupported {
            return Err(format!(
                ".dockerignore line {}: `{line}` uses syntax tests/image.rs does not understand \
                 (it knows `#` comments, `!`, `*`, `**`, `?`): teach the test, or say it otherwise",
                index + 1
            ));
        }
        let cleaned = segments.join("/");
        let bytes = cleaned.as_bytes();
        let mut globs = Vec::new();
        let mut i = 0;
        while i < bytes.len() {
            match bytes[i] {
                b'*' if bytes.get(i + 1) == Some(&b'*') => {
                    i += 2;
                    if bytes.get(i) == Some(&b'/') {
                        i += 1;
                    }
                    globs.push(if i >= bytes.len() { Glob::Rest } else { Glob::Directories });
                    continue;
                }
                b'*' => globs.push(Glob::Star),
                b'?' => globs.push(Glob::Question),
                b => globs.push(Glob::Literal(b)),
            }
            i += 1;
        }
        patterns.push(Pattern { exception, globs });
    }
    Ok(patterns)
}

fn glob_matches(globs: &[Glob], path: &[u8]) -> bool {
    match globs.split_first() {
        None => path.is_empty(),
        Some((Glob::Literal(b), rest)) => path.first() == Some(b) && glob_matches(rest, &path[1..]),
        Some((Glob::Question, rest)) => {
            path.first().is_some_and(|b| *b != b'/') && glob_matches(rest, &path[1..])
        }
        Some((Glob::Star, rest)) => {
            for i in 0..=path.len() {
                if glob_matches(rest, &path[i..]) {
                    return true;
                }
                if path.get(i) == Some(&b'/') {
                    return false;
                }
            }
            false
        }
        Some((Glob::Directories, rest)) => {
            glob_matches(rest, path)
                || path.iter().enumerate().any(|(i, b)| *b == b'/' && glob_matches(rest, &path[i + 1..]))
        }
        Some((Glob::Rest, _)) => true,
    }
}

/// Whether Docker leaves `path` (relative, `/`-separated) out of the context: the last pattern
/// matching the path or one of its parent directories decides.
fn ignored(patterns: &[Pattern], path: &str) -> bool {
    let mut prefixes: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
    prefixes.push(path);
    let mut excluded = false;
    for pattern in patterns {
        if prefixes.iter().any(|p| glob_matches(&pattern.globs, p.as_bytes())) {
            excluded = !pattern.exception;
        }
    }
    excluded
}

/// Whether an exception could let something below the excluded directory `dir` back in (Docker
/// walks such a directory; others it skips whole, as `target/` and `.git`).
fn may_reinclude(patterns: &[Pattern], dir: &str) -> bool {
    patterns.iter().filter(|p| p.exception).any(|p| {
        let literal: Vec<u8> = p
            .globs
            .iter()
            .map_while(|g| match g {
                Glob::Literal(b) => Some(*b),
                _ => None,
            })
            .collect();
        let literal = String::from_utf8(literal).unwrap();
        (literal.len() < p.globs.len() && format!("{dir}/").starts_with(&literal))
            || literal.starts_with(&format!("{dir}/"))
    })
}

/// The files of the context Docker sends: the tree on disk, less what `.dockerignore` leaves
/// out. Paths are relative and `/`-separated.
fn mk_context(root: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(root.join(".dockerignore")).unwrap_or_default();
    let patterns = mk_patterns(&text).unwrap_or_else(|e| panic!("{e}"));
    let mut files = BTreeSet::new();
    let mut pending = vec![String::new()];
    while let Some(dir) = pending.pop() {
        let Ok(entries) = std::fs::read_dir(root.join(&dir)) else { continue };
        for entry in entries.flatten() {
            let name = entry.file_name().into_string().expect("a UTF-8 file name");
            let path = if dir.is_empty() { name } else { format!("{dir}/{name}") };
            let Ok(kind) = entry.file_type() else { continue };
            let excluded = ignored(&patterns, &path);
            if kind.is_dir() {
                if !excluded || may_reinclude(&patterns, &path) {
                    pending.push(path);
                }
            } else if !excluded {
                files.insert(path);
            }
        }
    }
    files
}

// ---------------------------------------------------------------------------------------------
// The replay
// ---------------------------------------------------------------------------------------------

/// `path` made absolute against `cwd` and normalised, as the image sees it (`/src/target`).
fn absolute(cwd: &str, path: &str) -> String {
    let joined = if path.starts_with('/') { path.to_owned() } else { format!("{cwd}/{path}") };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

fn cargo() -> Command {
    Command::new(env!("CARGO"))
}

fn run(mut command: Command, what: &str) -> String {
    let out = command.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "the Dockerfile's build fails in the context Docker would send:\n  {what}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn host_triple() -> String {
    let out = run(
        {
            let mut c = cargo();
            c.arg("-vV");
            c
        },
        "cargo -vV",
    );
    out.lines().find_map(|l| l.strip_prefix("host: ")).expect("cargo -vV names the host").to_owned()
}

/// The targets `cargo fetch` resolves for a cargo command without `--target`: the host, and its
/// musl triple. Both resolve from a cache filled on this machine.
fn fetch_targets() -> Vec<String> {
    let host = host_triple();
    let mut targets = vec![host.clone()];
    if host.contains("-linux-gnu") {
        targets.push(host.replace("-linux-gnu", "-linux-musl"));
    }
    targets
}

/// A cargo invocation of the Dockerfile, as far as the replay needs it.
#[derive(Debug, Default)]
struct CargoCall {
    subcommand: String,
    lock: Vec<String>,
    release: bool,
    bins: Vec<String>,
    features: Vec<String>,
    target: Option<String>,
    /// `cargo install`'s crate, `NAME@VERSION` when pinned.
    installs: Vec<String>,
}

impl CargoCall {
    /// `cargo build` or `cargo zigbuild` (cargo-zigbuild's `cargo build` with zig as the C
    /// compiler and linker): builds the tree.
    fn builds(&self) -> bool {
        matches!(self.subcommand.as_str(), "build" | "zigbuild")
    }
}

fn mk_cargo_call(words: &[String], line: usize) -> CargoCall {
    let mut call =
        CargoCall { subcommand: words.get(1).cloned().unwrap_or_default(), ..CargoCall::default() };
    assert!(
        matches!(call.subcommand.as_str(), "fetch" | "build" | "zigbuild" | "install"),
        "Dockerfile line {line}: `cargo {}` is not replayed by tests/image.rs (fetch, build, zigbuild \
         and install are)",
        call.subcommand
    );
    let builds = call.builds();
    let mut rest = words.iter().skip(2);
    while let Some(word) = rest.next() {
        let (flag, inline) = match word.split_once('=') {
            Some((flag, value)) if flag.starts_with('-') => (flag, Some(value.to_owned())),
            _ => (word.as_str(), None),
        };
        let mut value = || inline.clone().or_else(|| rest.next().cloned()).unwrap();
        match flag {
            "--locked" | "--frozen" => call.lock.push(flag.to_owned()),
            "--offline" | "-q" | "--quiet" | "-v" | "--verbose" => {}
            "-j" | "--jobs" => {
                value();
            }
            "--release" if builds => call.release = true,
            "--bin" if builds => call.bins.push(value()),
            "--features" | "-F" if builds => call.features.extend(["--features".into(), value()]),
            "--no-default-features" | "--all-features" if builds => {
                call.features.push(flag.to_owned());
            }
            "--target" if call.subcommand != "install" => {
                assert!(call.target.is_none(), "Dockerfile line {line}: one --target per cargo command");
                call.target = Some(value());
            }
            crate_ if call.subcommand == "install" && !crate_.starts_with('-') => {
                call.installs.push(crate_.to_owned());
            }
            _ => panic!(
                "Dockerfile line {line}: `{word}` of `cargo {}` is not understood by tests/image.rs",
                call.subcommand
            ),
        }
    }
    call
}

/// What the replay of the build stage leaves: the files it produced outside the context
/// (absolute image paths, e.g. `/percolator`), each with the bin it is, and the context's files.
struct Built {
    produced: BTreeMap<String, String>,
    context: BTreeSet<String>,
    commands: Vec<String>,
    /// The `--target` of each cargo build replayed.
    targets: Vec<String>,
}

/// Replays `chain` (the stages BuildKit runs for one platform, each from the one before) in one
/// layout: a stage from another continues its file system, working directory and environment.
fn replay(chain: &[&Stage], root: &Path, scratch: &Path) -> Built {
    let layout = scratch.join("stage");
    std::fs::create_dir_all(&layout).unwrap();
    let host = |image_path: &str| layout.join(image_path.trim_start_matches('/'));
    let context = mk_context(root);
    let mut cwd = "/".to_owned();
    let mut env: Vec<(String, String)> = Vec::new();
    let mut persistent: BTreeMap<String, String> = BTreeMap::new();
    let mut produced: BTreeMap<String, String> = BTreeMap::new();
    let mut commands = Vec::new();
    let mut targets = Vec::new();
    // The standard libraries the toolchain has besides the host's (`rustup target add`).
    let mut std_targets: BTreeSet<String> = BTreeSet::new();
    for instruction in chain.iter().flat_map(|stage| &stage.instructions) {
        let line = instruction.line;
        match instruction.keyword.as_str() {
            "WORKDIR" => {
                cwd = absolute(&cwd, &instruction.args);
                std::fs::create_dir_all(host(&cwd)).unwrap();
            }
            "ENV" => {
                for assignment in instruction.args.split_whitespace() {
                    let (name, value) = assignment.split_once('=').unwrap_or_else(|| {
                        panic!("Dockerfile line {line}: ENV {}: NAME=value expected", instruction.args)
                    });
                    assert!(
                        !value.contains('$'),
                        "Dockerfile line {line}: ENV {assignment}: an expansion tests/image.rs does not replay"
                    );
                    env.push((name.to_owned(), value.trim_matches('"').to_owned()));
                }
            }
            "ARG" | "LABEL" | "USER" | "EXPOSE" => {}
            "COPY" => {
                let (from, sources, destination) = mk_copy(instruction);
                assert!(from.is_none(), "Dockerfile line {line}: the build stage copies from another stage");
                let several = sources.len() > 1 || destination.ends_with('/');
                let destination = absolute(&cwd, &destination);
                let into = several || host(&destination).is_dir();
                for source in sources {
                    let source = absolute("/", &source).trim_start_matches('/').to_owned();
                    let below = if source.is_empty() { String::new() } else { format!("{source}/") };
                    let files: Vec<&String> = context.iter().filter(|f| f.starts_with(&below)).collect();
                    if context.contains(&source) {
                        let name = source.rsplit('/').next().unwrap();
                        let to = if into { format!("{destination}/{name}") } else { destination.clone() };
                        copy_in(root, &source, &host(&to));
                    } else if !files.is_empty() {
                        // A directory: its contents go into the destination.
                        for file in files {
                            copy_in(root, file, &host(&format!("{destination}/{}", &file[below.len()..])));
                        }
                    } else {
                        panic!(
                            "Dockerfile line {line}: COPY {source}: not in the context Docker would send \
                             (missing, or left out by .dockerignore)"
                        );
                    }
                }
            }
            "RUN" => {
                let (mounts, script) = mk_run(instruction);
                let cached: Vec<String> = mounts
                    .iter()
                    .filter(|m| m.get("type").map(String::as_str) == Some("cache"))
                    .filter_map(|m| m.get("target").or_else(|| m.get("dst")).or_else(|| m.get("destination")))
                    .map(|t| absolute(&cwd, t))
                    .collect();
                // Binaries built under a cache mount are gone once this RUN ends.
                let mut transient: BTreeMap<String, String> = BTreeMap::new();
                for command in mk_commands(&script, line) {
                    let words = &command.words;
                    let program = words[0].as_str();
                    let path_arg = |word: &String| absolute(&cwd, word);
                    match program {
                        // Tools of the toolchain stage, not replayed (nothing is downloaded
                        // here): `build_stages_run_cargo_and_pinned_tools` checks their pins.
                        "apk" | "apt-get" | "pip" | "pip3" => {}
                        "rustup" => {
                            let [_, target, add, added @ ..] = words.as_slice() else {
                                panic!(
                                    "Dockerfile line {line}: `{}`: rustup target add expected",
                                    words.join(" ")
                                )
                            };
                            assert_eq!(
                                (target.as_str(), add.as_str()),
                                ("target", "add"),
                                "Dockerfile line {line}: rustup {target} {add} is not replayed by tests/image.rs"
                            );
                            std_targets.extend(added.iter().cloned());
                        }
                        "cargo" if words.get(1).map(String::as_str) == Some("install") => {
                            mk_cargo_call(words, line);
                        }
                        "cargo" => {
                            let call = mk_cargo_call(words, line);
                            let dir = host(&cwd);
                            let mut fetch = cargo();
                            fetch.current_dir(&dir).envs(env.iter().map(|(k, v)| (k, v)));
                            fetch.env("CARGO_TARGET_DIR", scratch.join("cargo-target"));
                            fetch.arg("fetch").args(&call.lock).arg("--offline");
                            match &call.target {
                                Some(target) => {
                                    assert!(
                                        std_targets.contains(target),
                                        "Dockerfile line {line}: --target {target}: the toolchain stage adds no \
                                         standard library for it (`rustup target add`; added: {std_targets:?})"
                                    );
                                    fetch.args(["--target", target]);
                                }
                                None => {
                                    for target in fetch_targets() {
                                        fetch.args(["--target", &target]);
                                    }
                                }
                            }
                            let shown = format!(
                                "{} (in {cwd}; Dockerfile line {line}: {}; scripts/install-deps.sh fetches \
                                 the crates of the image's targets into the local cache)",
                                show(&fetch),
                                words.join(" ")
                            );
                            run(fetch, &shown);
                            commands.push(shown);
                            if call.builds() {
                                let built = check_bins(&call, &dir, &env, scratch, &cwd, line);
                                let target_dir = env
                                    .iter()
                                    .find(|(k, _)| k == "CARGO_TARGET_DIR")
                                    .map_or_else(|| absolute(&cwd, "target"), |(_, v)| absolute(&cwd, v));
                                // Where cargo writes: target/PROFILE/, under target/TRIPLE/ with --target.
                                let out_dir = match &call.target {
                                    Some(target) => format!("{target_dir}/{target}"),
                                    None => target_dir.clone(),
                                };
                                let profile = if call.release { "release" } else { "debug" };
                                let under_cache = cached.iter().any(|c| target_dir.starts_with(c.as_str()));
                                for bin in built {
                                    let path = format!("{out_dir}/{profile}/{bin}");
                                    if under_cache {
                                        transient.insert(path, bin);
                                    } else {
                                        persistent.insert(path, bin);
                                    }
                                }
                                targets.extend(call.target.clone());
                            }
                        }
                        "cp" => {
                            let [_, from, to] = words.as_slice() else {
                                panic!("Dockerfile line {line}: `{}`: cp FROM TO expected", words.join(" "))
                            };
                            let from = path_arg(from);
                            let what = transient.get(&from).or_else(|| persistent.get(&from)).unwrap_or_else(|| {
                                panic!(
                                    "Dockerfile line {line}: `cp {from} …`: the build has no such binary here \
                                     (built binaries: {:?}; one under a cache mount is gone after its RUN)",
                                    transient.keys().chain(persistent.keys()).collect::<Vec<_>>()
                                )
                            });
                            produced.insert(path_arg(to), what.clone());
                        }
                        // Hand-made files, as the shell would make them, so that cargo sees
                        // what it would see in the image (`build_stages_run_cargo_and_pinned_tools`
                        // rejects them).
                        "mkdir" => {
                            for dir in words[1..].iter().filter(|w| !w.starts_with('-')) {
                                std::fs::create_dir_all(host(&path_arg(dir))).unwrap();
                            }
                        }
                        "touch" => {
                            for file in words[1..].iter().filter(|w| !w.starts_with('-')) {
                                std::fs::OpenOptions::new()
                                    .create(true)
                                    .append(true)
                                    .open(host(&path_arg(file)))
                                    .unwrap();
                            }
                        }
                        "echo" if command.output.is_some() => {
                            let file = path_arg(command.output.as_ref().unwrap());
                            std::fs::write(host(&file), format!("{}\n", words[1..].join(" "))).unwrap();
                        }
                        _ => panic!(
                            "Dockerfile line {line}: `{}` is not replayed by tests/image.rs \
                             (it runs cargo, follows cp of built binaries and skips the toolchain's installs)",
                            words.join(" ")
                        ),
                    }
                    if program != "echo" {
                        assert!(
                            command.output.is_none(),
                            "Dockerfile line {line}: `{}` redirects its output",
                            words.join(" ")
                        );
                    }
                }
            }
            other => {
                panic!("Dockerfile line {line}: {other} in the build stage is not replayed by tests/image.rs")
            }
        }
    }
    check_includes(&layout, &cwd);
    Built { produced, context, commands, targets }
}

fn copy_in(root: &Path, source: &str, to: &Path) {
    std::fs::create_dir_all(to.parent().unwrap()).unwrap();
    let from = root.join(source);
    let meta = std::fs::symlink_metadata(&from).unwrap_or_else(|e| panic!("{}: {e}", from.display()));
    if meta.file_type().is_symlink() {
        std::os::unix::fs::symlink(std::fs::read_link(&from).unwrap(), to).unwrap();
    } else {
        std::fs::copy(&from, to).unwrap_or_else(|e| panic!("{} -> {}: {e}", from.display(), to.display()));
    }
}

fn show(command: &Command) -> String {
    let args: Vec<String> = command.get_args().map(|a| a.to_string_lossy().into_owned()).collect();
    format!("cargo {}", args.join(" "))
}

/// `cargo metadata` in the layout: each `--bin` (every bin without one) is a bin target of the
/// package whose source is in the layout. Returns the bins built.
fn check_bins(
    call: &CargoCall,
    dir: &Path,
    env: &[(String, String)],
    scratch: &Path,
    cwd: &str,
    line: usize,
) -> Vec<String> {
    let mut metadata = cargo();
    metadata.current_dir(dir).envs(env.iter().map(|(k, v)| (k, v)));
    metadata.env("CARGO_TARGET_DIR", scratch.join("cargo-target"));
    metadata
        .args(["metadata", "--offline", "--no-deps", "--format-version", "1"])
        .args(&call.lock)
        .args(&call.features);
    let shown = format!("{} (in {cwd}; Dockerfile line {line})", show(&metadata));
    let metadata: Value = serde_json::from_str(&run(metadata, &shown)).unwrap();
    // A workspace: `cargo build` in its root builds the root package (the default member).
    let root_manifest = dir.join("Cargo.toml");
    let package = metadata["packages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| Path::new(p["manifest_path"].as_str().unwrap()) == root_manifest)
        .unwrap_or_else(|| panic!("{shown}: no package at the layout's root"));
    let bins: BTreeMap<&str, &str> = package["targets"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["kind"].as_array().unwrap().iter().any(|k| k == "bin"))
        .map(|t| (t["name"].as_str().unwrap(), t["src_path"].as_str().unwrap()))
        .collect();
    let wanted: Vec<String> =
        if call.bins.is_empty() { bins.keys().map(|b| (*b).to_owned()).collect() } else { call.bins.clone() };
    for bin in &wanted {
        let source = bins.get(bin.as_str()).unwrap_or_else(|| {
            panic!(
                "Dockerfile line {line}: --bin {bin}: not a bin target of the package (bins: {:?})",
                bins.keys()
            )
        });
        let source = Path::new(source);
        assert!(
            source.starts_with(dir) && source.is_file(),
            "Dockerfile line {line}: --bin {bin}: its source {} is not in the layout",
            source.display()
        );
    }
    wanted
}

/// Files the compiler reads (`include_str!`/`include_bytes!` with a literal path) from the
/// sources of every crate of the workspace, outside test code, must be in the layout.
fn check_includes(layout: &Path, cwd: &str) {
    let workdir = layout.join(cwd.trim_start_matches('/'));
    let mut pending = vec![workdir.join("src")];
    for member in std::fs::read_dir(repo_root().join("crates")).unwrap().flatten() {
        pending.push(workdir.join("crates").join(member.file_name()).join("src"));
    }
    let mut missing = Vec::new();
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let name = entry.file_name().to_string_lossy().into_owned();
            if path.is_dir() {
                pending.push(path);
                continue;
            }
            if !name.ends_with(".rs")
                || name == "tests.rs"
                || name.ends_with("_tests.rs")
                || name == "testkit.rs"
            {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let production = text.split("\n#[cfg(test)]").next().unwrap();
            for macro_ in ["include_str!(\"", "include_bytes!(\""] {
                for (at, _) in production.match_indices(macro_) {
                    let literal = &production[at + macro_.len()..];
                    let included = &literal[..literal.find('"').unwrap()];
                    if !path.parent().unwrap().join(included).is_file() {
                        missing
                            .push(format!("{}: {included}", path.strip_prefix(&workdir).unwrap().display()));
                    }
                }
            }
        }
    }
    assert!(
        missing.is_empty(),
        "files the compiler reads are not in the context Docker would send: {missing:?}"
    );
}

// ---------------------------------------------------------------------------------------------
// Cargo.toml, rust-toolchain.toml
// ---------------------------------------------------------------------------------------------

/// A `key = "value"` of a TOML table, read line by line.
fn toml_value(text: &str, table: &str, key: &str) -> String {
    let mut in_table = false;
    for line in text.lines().map(str::trim) {
        if line.starts_with('[') {
            in_table = line == format!("[{table}]");
        } else if in_table
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            return v.trim().trim_matches('"').to_owned();
        }
    }
    panic!("[{table}] {key} not found");
}

// ---------------------------------------------------------------------------------------------
// Tests
// ---------------------------------------------------------------------------------------------

/// The build of each platform the release publishes, replayed on the context Docker would send:
/// its cargo commands succeed offline, and the runtime stage's entry point is the binary they
/// build for that platform's target.
#[test]
fn build_stage_builds_in_the_context_docker_sends() {
    let started = std::time::Instant::now();
    let root = repo_root();
    let stages = mk_stages(&repo_read("Dockerfile"));
    let platforms = release_platforms();
    assert!(!platforms.is_empty(), "the release workflow builds no platform");
    for platform in &platforms {
        let chain = mk_chain(&stages, platform);
        let scratch = mk_scratch(&format!("image-build-{}", platform.arch));
        let built = replay(&chain, &root, &scratch.0);
        assert!(!built.commands.is_empty(), "{}: the build stages run no cargo command", platform.name);
        assert_eq!(
            built.targets,
            [platform.triple],
            "{}: the build should compile for {} alone (stages {:?})",
            platform.name,
            platform.triple,
            chain.iter().map(|s| s.name.as_deref().unwrap_or(&s.image)).collect::<Vec<_>>()
        );

        // Files cargo reads implicitly must not be left behind.
        for implicit in [".cargo/config.toml", ".cargo/config", "build.rs"] {
            assert!(
                !root.join(implicit).exists() || built.context.contains(implicit),
                "{implicit} exists but .dockerignore leaves it out of the image's build"
            );
        }

        // The runtime stage: COPY --from the build of a binary it built, which is the entry point.
        let runtime = stages.last().unwrap();
        let mut copied = BTreeMap::new();
        for copy in runtime.all("COPY") {
            let (from, sources, destination) = mk_copy(copy);
            assert!(
                from.is_some(),
                "Dockerfile line {}: the runtime stage copies from the context",
                copy.line
            );
            for source in sources {
                let bin = built.produced.get(&absolute("/", &source)).unwrap_or_else(|| {
                    panic!(
                        "Dockerfile line {}: COPY --from: the build for {} does not produce {source} (it \
                         produces {:?})",
                        copy.line, platform.name, built.produced
                    )
                });
                copied.insert(absolute("/", &destination), bin.clone());
            }
        }
        let entrypoint = entrypoint(runtime);
        assert_eq!(
            copied.get(&entrypoint[0]).map(String::as_str),
            Some("percolator"),
            "{}: ENTRYPOINT {entrypoint:?}",
            platform.name
        );
        eprintln!(
            "{}: context: {} files; replayed: {}",
            platform.name,
            built.context.len(),
            built.commands.join("; ")
        );
    }
    eprintln!("in {:.1?}", started.elapsed());
}

/// Each architecture has a build stage of its own, cross-compiling on the build platform for that
/// architecture's musl target, and the stages the Dockerfile has are the release's platforms.
#[test]
fn each_architecture_cross_compiles_its_own_target() {
    let stages = mk_stages(&repo_read("Dockerfile"));
    let platforms = release_platforms();
    let archs: BTreeSet<&str> = platforms.iter().map(|p| p.arch.as_str()).collect();
    // The stage copied from picks one per architecture by TARGETARCH.
    let copied = stage_named(&stages, &copied_from(&stages)).unwrap();
    let prefix = copied.image.split("${TARGETARCH}").next().unwrap();
    assert!(
        copied.image.ends_with("${TARGETARCH}") && copied.instructions.is_empty(),
        "Dockerfile line {}: the runtime stage should copy from `FROM <prefix>${{TARGETARCH}}`, a stage \
         of each architecture (BuildKit builds only the one a platform needs), not {}",
        copied.line,
        copied.image
    );
    let built: BTreeSet<&str> =
        stages.iter().filter_map(|s| s.name.as_deref()?.strip_prefix(prefix)).collect();
    assert_eq!(built, archs, "the Dockerfile's {prefix}* stages and the release workflow's platforms");

    for platform in &platforms {
        let chain = mk_chain(&stages, platform);
        let toolchain = chain[0];
        assert_eq!(
            toolchain.platform.as_deref(),
            Some("$BUILDPLATFORM"),
            "Dockerfile line {}: the stages building for {} should run on the build platform \
             (FROM --platform=$BUILDPLATFORM): cross-compiled, not emulated",
            toolchain.line,
            platform.name
        );
        // A stage from another stage takes its platform (a --platform there is ignored).
        for stage in &chain[1..] {
            assert!(
                stage.platform.is_none(),
                "Dockerfile line {}: --platform on a FROM of a stage",
                stage.line
            );
        }
        let arch_stage = stage_named(&stages, &format!("{prefix}{}", platform.arch)).unwrap();
        let mut targets = Vec::new();
        let mut copies = Vec::new();
        for (line, command) in commands_of(arch_stage) {
            match command.words[0].as_str() {
                "cargo" => {
                    let call = mk_cargo_call(&command.words, line);
                    if call.builds() {
                        targets.push(call.target.clone().unwrap_or_else(|| {
                            panic!("Dockerfile line {line}: the {} build names no --target", platform.arch)
                        }));
                    }
                }
                "cp" => copies.push(command.words[1].clone()),
                _ => {}
            }
        }
        assert_eq!(
            targets,
            [platform.triple],
            "{}: the {prefix}{} stage's targets",
            platform.name,
            platform.arch
        );
        assert_eq!(
            copies,
            [format!("target/{}/release/percolator", platform.triple)],
            "{}: the binary copied out should be the one cargo writes for {}",
            platform.name,
            platform.triple
        );
    }

    // The runtime stage is of the target platform.
    let runtime = stages.last().unwrap();
    assert!(
        runtime.platform.is_none(),
        "Dockerfile line {}: the runtime stage should be of the target platform (no --platform)",
        runtime.line
    );
}

fn entrypoint(runtime: &Stage) -> Vec<String> {
    let entrypoint = runtime.all("ENTRYPOINT").last().expect("an ENTRYPOINT");
    serde_json::from_str(&entrypoint.args).unwrap_or_else(|_| {
        panic!("Dockerfile line {}: ENTRYPOINT in exec (JSON) form expected", entrypoint.line)
    })
}

/// The context holds what the build reads and nothing the build does not: no target/, .git,
/// editor files, tests/ (the crates' too) or deploy/.
#[test]
fn context_is_the_sources_and_the_manifest() {
    let context = mk_context(&repo_root());
    for needed in [
        "Cargo.toml",
        "Cargo.lock",
        "src/main.rs",
        "src/lib.rs",
        "benches/cluster.rs",
        "crates/k8s-wire/Cargo.toml",
        "crates/apiserver/src/lib.rs",
    ] {
        assert!(context.contains(needed), "{needed} is not in the context");
    }
    for file in &context {
        let top = file.split('/').next().unwrap();
        assert!(
            matches!(top, "Cargo.toml" | "Cargo.lock" | "src" | "benches" | "crates"),
            "{file} is in the context, which the build does not read"
        );
        assert!(!file.contains("/tests/"), "{file}: a test in the context");
        let name = file.rsplit('/').next().unwrap();
        assert!(
            !(name.ends_with('~') || name.ends_with(".swp") || name.starts_with(".#")),
            "{file}: an editor file in the context"
        );
    }
}

/// The ignore syntax the test implements, against Docker's documented examples.
#[test]
fn dockerignore_patterns_read_as_docker_reads_them() {
    let patterns =
        mk_patterns("# comment\n*/temp*\n*/*/temp*\ntemp?\n/target/\n**/*.swp\n!keep/**\n").unwrap();
    let is_ignored = |p: &str| ignored(&patterns, p);
    assert!(is_ignored("somedir/temporary.txt"));
    assert!(is_ignored("somedir/temp"));
    assert!(is_ignored("somedir/subdir/temporary.txt"));
    assert!(!is_ignored("temporary.txt"));
    assert!(is_ignored("tempa") && !is_ignored("tempab"));
    assert!(is_ignored("target") && is_ignored("target/release/percolator"));
    assert!(is_ignored("a.swp") && is_ignored("src/deep/x.swp"));
    assert!(!is_ignored("keep/temp1/x") && !is_ignored("src/main.rs"));
    assert!(!is_ignored("# comment"));
    for unsupported in ["[abc]", "a\\*b", "../x", "./"] {
        assert!(mk_patterns(unsupported).is_err(), "{unsupported} should be refused");
    }
}

/// The toolchain stage installs packages and tools at pinned versions (PyPI `NAME==VERSION`,
/// crates.io `NAME@VERSION --locked`) and standard libraries; the build stages run cargo
/// (`--locked`) and `cp` of what cargo built: no hand-made files (the tree builds as it is).
/// cargo's registry and `target/` are cache mounts, with ids of each target's own (the builds of a
/// multi-arch run go on at once).
#[test]
fn build_stages_run_cargo_and_pinned_tools() {
    let stages = mk_stages(&repo_read("Dockerfile"));
    let mut mount_ids: BTreeMap<String, String> = BTreeMap::new();
    let mut tools = BTreeSet::new();
    for platform in release_platforms() {
        let chain = mk_chain(&stages, &platform);
        let mut builds = 0;
        for stage in &chain {
            let is_toolchain = std::ptr::eq(*stage, chain[0]);
            for (line, command) in commands_of(stage) {
                let text = command.words.join(" ");
                let words = &command.words;
                match (words[0].as_str(), is_toolchain) {
                    ("apk", true) => {
                        assert_eq!(words.get(1).map(String::as_str), Some("add"), "line {line}: {text}")
                    }
                    ("apt-get", true) => assert!(
                        matches!(words.get(1).map(String::as_str), Some("update" | "install")),
                        "Dockerfile line {line}: {text}"
                    ),
                    ("pip" | "pip3", true) => {
                        assert_eq!(words.get(1).map(String::as_str), Some("install"), "line {line}: {text}");
                        for requirement in words[2..].iter().filter(|w| !w.starts_with('-')) {
                            let (name, version) = requirement.split_once("==").unwrap_or_else(|| {
                                panic!(
                                    "Dockerfile line {line}: `{requirement}` is not pinned (NAME==VERSION)"
                                )
                            });
                            assert!(
                                version
                                    .split('.')
                                    .all(|n| !n.is_empty() && n.chars().all(|c| c.is_ascii_digit())),
                                "Dockerfile line {line}: {name}=={version}: an exact release expected"
                            );
                            tools.insert(name.to_owned());
                        }
                    }
                    ("rustup", true) => {}
                    ("cargo", _) => {
                        let call = mk_cargo_call(words, line);
                        assert!(!call.lock.is_empty(), "Dockerfile line {line}: `{text}` without --locked");
                        if call.subcommand == "install" {
                            assert!(
                                is_toolchain,
                                "Dockerfile line {line}: `{text}` outside the toolchain stage"
                            );
                            for crate_ in &call.installs {
                                let (name, version) = crate_.split_once('@').unwrap_or_else(|| {
                                    panic!("Dockerfile line {line}: `cargo install {crate_}` is not pinned (NAME@VERSION)")
                                });
                                assert!(!version.is_empty(), "Dockerfile line {line}: {crate_}");
                                tools.insert(name.to_owned());
                            }
                        } else {
                            assert!(
                                !is_toolchain,
                                "Dockerfile line {line}: the toolchain stage builds the tree"
                            );
                            builds += usize::from(call.builds());
                        }
                    }
                    ("cp", false) => {}
                    _ => panic!(
                        "Dockerfile line {line}: `{text}`: the toolchain stage installs pinned tools and the \
                         build stages build the tree as it is, without hand-made files"
                    ),
                }
                assert!(command.output.is_none(), "Dockerfile line {line}: `{text}` writes a file");
            }
        }
        assert_eq!(builds, 1, "{}: one cargo build expected", platform.name);

        let build = chain.iter().rev().find(|s| s.all("RUN").any(|r| r.args.contains("cargo "))).unwrap();
        let run = build.all("RUN").find(|r| r.args.contains("cargo ")).unwrap();
        let (mounts, _) = mk_run(run);
        let workdir =
            chain.iter().flat_map(|s| s.all("WORKDIR")).last().map(|w| w.args.clone()).expect("a WORKDIR");
        let mut cached = BTreeMap::new();
        for mount in mounts.iter().filter(|m| m.get("type").map(String::as_str) == Some("cache")) {
            let target = mount.get("target").cloned().unwrap_or_default();
            let id = mount.get("id").cloned().unwrap_or_else(|| target.clone());
            assert!(
                id.contains(platform.triple),
                "Dockerfile line {}: the cache mount {target} should have an id of {}'s own, not {id}",
                run.line,
                platform.triple
            );
            if let Some(other) = mount_ids.insert(id.clone(), platform.name.clone()) {
                panic!(
                    "Dockerfile line {}: the cache id {id} is shared by {other} and {}",
                    run.line, platform.name
                );
            }
            cached.insert(target, id);
        }
        assert!(
            cached.contains_key(&format!("{workdir}/target")),
            "{}: target/ should be a cache mount: {cached:?}",
            platform.name
        );
        assert!(
            cached.keys().any(|c| c.ends_with("/registry")),
            "{}: cargo's registry should be a cache mount: {cached:?}",
            platform.name
        );
    }
    // cargo zigbuild needs cargo-zigbuild and zig.
    for tool in ["cargo-zigbuild", "ziglang"] {
        assert!(
            tools.contains(tool),
            "the toolchain stage should install {tool}, pinned (installed: {tools:?})"
        );
    }
}

/// The toolchain stage's Rust is the toolchain the tree pins, so rustup downloads none other.
#[test]
fn build_image_is_the_pinned_toolchain() {
    let text = repo_read("Dockerfile");
    assert_eq!(text.lines().next(), Some("# syntax=docker/dockerfile:1"));
    let channel = toml_value(&repo_read("rust-toolchain.toml"), "toolchain", "channel");
    let stages = mk_stages(&text);
    for platform in release_platforms() {
        let toolchain = mk_chain(&stages, &platform)[0];
        let reference = mk_reference(&toolchain.image);
        assert_eq!(
            reference.name, "rust",
            "Dockerfile line {}: the toolchain stage should start from a rust image",
            toolchain.line
        );
        let tag = reference.tag.unwrap_or_default();
        assert!(
            tag == channel || tag.starts_with(&format!("{channel}-")),
            "Dockerfile line {}: the toolchain image {} should be rust-toolchain.toml's channel {channel}",
            toolchain.line,
            toolchain.image
        );
    }
}

/// Every stage that starts from a registry's image (not from a stage of this file) names it by
/// tag and digest, `name:tag@sha256:<64 hex digits>`: the digest fixes what is pulled (a tag can
/// be pushed again), the tag beside it says which release it is, for the reader, for the checks
/// above (the toolchain's tag is rust-toolchain.toml's channel) and for Dependabot, which moves
/// both.
#[test]
fn every_base_image_is_pinned_by_digest_beside_its_tag() {
    let stages = mk_stages(&repo_read("Dockerfile"));
    let mut external = 0;
    for stage in &stages {
        // `build-${TARGETARCH}` is a stage of this file on every platform (mk_chain checks it).
        if stage.image.contains('$') || stage_named(&stages, &stage.image).is_some() {
            continue;
        }
        external += 1;
        let reference = mk_reference(&stage.image);
        assert!(
            reference.tag.is_some_and(|t| !t.is_empty()),
            "Dockerfile line {}: FROM {}: the tag should stand beside the digest",
            stage.line,
            stage.image
        );
        let digest = reference.digest.unwrap_or_else(|| {
            panic!(
                "Dockerfile line {}: FROM {}: not pinned; write {}@sha256:<the digest of its multi-arch index>",
                stage.line, stage.image, stage.image
            )
        });
        let hex = digest.strip_prefix("sha256:").unwrap_or_default();
        assert!(
            hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b)),
            "Dockerfile line {}: FROM {}: the digest should be sha256: and 64 lowercase hex digits",
            stage.line,
            stage.image
        );
    }
    // The toolchain and the runtime base at least: a Dockerfile whose FROM lines this test cannot
    // tell apart from stages would otherwise pass with nothing checked.
    assert!(
        external >= 2,
        "Dockerfile: {external} base image(s) found, the toolchain and the runtime expected"
    );
}

/// How image references are split: a registry's port is not a tag, a digest is not either.
#[test]
fn image_references_split_as_docker_splits_them() {
    let digest = "sha256:e14e87345b4d5964ddcc3491d27ee046a0f23820f340c3c1e24da6880141f7c0";
    let cases = [
        ("rust", Reference { name: "rust", tag: None, digest: None }),
        (
            "rust:1.95.0-slim-trixie",
            Reference { name: "rust", tag: Some("1.95.0-slim-trixie"), digest: None },
        ),
        (
            "gcr.io/distroless/static-debian12:nonroot",
            Reference { name: "gcr.io/distroless/static-debian12", tag: Some("nonroot"), digest: None },
        ),
        ("localhost:5000/rust", Reference { name: "localhost:5000/rust", tag: None, digest: None }),
    ];
    for (image, expected) in cases {
        assert_eq!(mk_reference(image), expected, "{image}");
    }
    let pinned = format!("localhost:5000/rust:1.95.0@{digest}");
    assert_eq!(
        mk_reference(&pinned),
        Reference { name: "localhost:5000/rust", tag: Some("1.95.0"), digest: Some(digest) }
    );
    let digest_only = format!("rust@{digest}");
    assert_eq!(mk_reference(&digest_only), Reference { name: "rust", tag: None, digest: Some(digest) });
}

/// The crates of every target the Dockerfile builds are fetched by `scripts/install-deps.sh`
/// while online: the replay above finds them in the local cache on a fresh machine.
#[test]
fn install_deps_fetches_every_target_of_the_image() {
    let script = repo_read("scripts/install-deps.sh");
    for platform in release_platforms() {
        assert!(
            script.contains(&format!("--target {}", platform.triple)),
            "scripts/install-deps.sh should `cargo fetch --locked --target {}` for the image's replay",
            platform.triple
        );
    }
}

/// The runtime stage names no architecture: one stage serves every platform.
#[test]
fn runtime_stage_names_no_architecture() {
    let stages = mk_stages(&repo_read("Dockerfile"));
    let runtime = stages.last().unwrap();
    for instruction in std::iter::once(&runtime.image).chain(runtime.instructions.iter().map(|i| &i.args)) {
        for arch in ["x86_64", "amd64", "aarch64", "arm64", "i686", "armv7"] {
            assert!(
                !instruction.contains(arch),
                "Dockerfile: the runtime stage's `{instruction}` names {arch}"
            );
        }
    }
}

/// The runtime stage: distroless, non-root by number, `/percolator` its entry point, labels
/// from Cargo.toml and a build argument.
#[test]
fn runtime_stage_is_distroless_and_non_root() {
    let stages = mk_stages(&repo_read("Dockerfile"));
    let runtime = stages.last().unwrap();
    let base = mk_reference(&runtime.image);
    assert!(base.name.starts_with("gcr.io/distroless/"), "runtime base {}", runtime.image);
    assert_eq!(base.tag, Some("nonroot"), "runtime base {} should be a nonroot tag", runtime.image);
    let user = runtime.all("USER").last().expect("a USER").args.clone();
    let ids: Vec<u32> = user
        .split(':')
        .map(|id| {
            id.parse().unwrap_or_else(|_| panic!("USER {user}: numeric uid:gid expected (runAsNonRoot)"))
        })
        .collect();
    assert!(ids.iter().all(|id| *id != 0), "USER {user} is root");
    assert_eq!(entrypoint(runtime), ["/percolator"]);

    let manifest = repo_read("Cargo.toml");
    let labels: BTreeMap<String, String> = runtime
        .all("LABEL")
        .flat_map(|l| {
            mk_tokens(&l.args.replace('$', "\\$"), l.line)
                .into_iter()
                .filter_map(|t| match t {
                    Token::Word(w) => w.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())),
                    Token::Op(_) => None,
                })
                .collect::<Vec<_>>()
        })
        .collect();
    let label = |name: &str| {
        labels.get(&format!("org.opencontainers.image.{name}")).unwrap_or_else(|| {
            panic!("the runtime stage has no LABEL org.opencontainers.image.{name} (labels: {labels:?})")
        })
    };
    assert_eq!(label("licenses"), &toml_value(&manifest, "workspace.package", "license"));
    let version = label("version");
    let arg = version.trim_start_matches("${").trim_start_matches('$').trim_end_matches('}');
    assert!(version.starts_with('$'), "the version label should come from a build argument, not {version}");
    let default = runtime
        .all("ARG")
        .find_map(|a| a.args.strip_prefix(arg).map(|d| d.trim_start_matches('=').to_owned()))
        .unwrap_or_else(|| panic!("ARG {arg} missing from the runtime stage"));
    let cargo_version = toml_value(&manifest, "workspace.package", "version");
    assert!(
        default == cargo_version || !default.starts_with(|c: char| c.is_ascii_digit()),
        "ARG {arg}={default} disagrees with Cargo.toml's version {cargo_version}"
    );
    assert!(
        repo_read("scripts/build-image.sh").contains(&format!("--build-arg \"{arg}=")),
        "scripts/build-image.sh should pass --build-arg {arg}=<Cargo.toml's version>"
    );
}

/// With a read-only root filesystem the only writable place is the Deployment's emptyDir on
/// /tmp: the self-signed pair's default --cert-dir (the one file percolator writes) must resolve
/// there in the image.
#[test]
fn cert_dir_default_is_under_tmp() {
    let out = Command::new(env!("CARGO_BIN_EXE_percolator"))
        .arg("--help")
        .env_remove("PERCOLATOR_CERT_DIR")
        .output()
        .expect("percolator --help runs");
    let help = String::from_utf8(out.stdout).unwrap();
    let flag = help.split("--cert-dir <").nth(1).expect("--cert-dir in --help");
    let default = flag
        .split("[default: ")
        .nth(1)
        .and_then(|d| d.split(']').next())
        .expect("--cert-dir has a default")
        .to_owned();
    let stages = mk_stages(&repo_read("Dockerfile"));
    let runtime = stages.last().unwrap();
    let from_env = runtime
        .all("ENV")
        .find_map(|e| e.args.strip_prefix("PERCOLATOR_CERT_DIR=").map(|v| v.trim_matches('"').to_owned()));
    let workdir = runtime
        .all("WORKDIR")
        .fold(None::<String>, |cwd, w| Some(absolute(cwd.as_deref().unwrap_or("/"), &w.args)));
    let configured = from_env.unwrap_or_else(|| default.clone());
    let cert_dir = if configured.starts_with('/') {
        configured
    } else {
        let cwd = workdir.unwrap_or_else(|| {
            panic!(
                "--cert-dir's default {default} is relative to the base image's working directory, \
                 read-only in the Deployment: set WORKDIR (or PERCOLATOR_CERT_DIR) under /tmp"
            )
        });
        absolute(&cwd, &configured)
    };
    assert!(
        cert_dir.starts_with("/tmp/"),
        "the image writes the self-signed pair to {cert_dir}, outside /tmp"
    );
}
