//! The crates the tree is built from, against the policy in `deny.toml`, with cargo-deny on every
//! test run (`cargo deny --offline --locked check licenses bans sources`):
//!
//! - the tree passes: every crate of `Cargo.lock` (all platforms, dev- and build-dependencies
//!   included) is under a licence the policy allows, comes from crates.io, no crate is banned and
//!   no dependency is a `*` wildcard; crates present in two versions are warnings, printed, and
//!   the only warnings there may be (an allowed licence that no crate uses any more is one too:
//!   `deny.toml` lists what the tree has, no more);
//! - the policy refuses what it should: the tree's own `cargo metadata`, altered in one place
//!   at a time (a crate under GPL-3.0, the CDLA licence outside the one crate it is accepted
//!   for, a git source, another registry, a `*` requirement, OpenSSL), fails the check with that
//!   error and no other;
//! - CI's workflow on GitHub checks the advisories.
//!
//! Not here: the RustSec advisories. Their database is a git repository on GitHub, which the
//! machines that run the test command cannot reach (they reach the package registries only), and
//! an offline check would be against whatever copy happens to be on disk; CI's workflow fetches
//! it and runs `cargo deny check advisories` (`.github/workflows/ci.yml`).
//!
//! cargo-deny is the one `scripts/install-deps.sh` installs (pinned); another version, or none,
//! fails with a message saying to run the script.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{repo_read, repo_root};
use serde_json::Value;

/// stdout and stderr of `out`, for messages.
fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// The cargo-deny version `scripts/install-deps.sh` installs (`cargo_deny_version=X.Y.Z`).
fn pinned_version() -> String {
    let script = repo_read("scripts/install-deps.sh");
    let version = script
        .lines()
        .find_map(|line| line.strip_prefix("cargo_deny_version="))
        .expect("scripts/install-deps.sh should pin cargo-deny (cargo_deny_version=X.Y.Z)");
    assert!(
        !version.is_empty() && version.split('.').all(|n| n.parse::<u32>().is_ok()),
        "scripts/install-deps.sh: cargo_deny_version={version} is not an exact version"
    );
    version.to_owned()
}

/// `cargo deny` run from the checkout, after checking that it is the pinned version.
fn mk_cargo_deny() -> Command {
    let pinned = pinned_version();
    let out =
        Command::new(env!("CARGO")).args(["deny", "--version"]).current_dir(repo_root()).output().unwrap();
    let said = text(&out);
    assert!(
        out.status.success() && said.trim() == format!("cargo-deny {pinned}"),
        "cargo deny {pinned} is needed (scripts/install-deps.sh installs it); `cargo deny --version` says: {}",
        said.trim()
    );
    let mut command = Command::new(env!("CARGO"));
    command.arg("deny").current_dir(repo_root());
    command
}

/// One diagnostic of cargo-deny's JSON output.
#[derive(Debug)]
struct Diagnostic {
    severity: String,
    code: String,
    message: String,
    /// The crates it is about, `name@version`.
    crates: Vec<String>,
}

/// What one `check` said: its exit status, diagnostics, log lines (a configuration it could not
/// read, or none found: cargo-deny then falls back to its defaults and says so only there) and
/// summary (errors and warnings per check).
struct Report {
    out: Output,
    diagnostics: Vec<Diagnostic>,
    logs: Vec<String>,
    summary: Value,
}

/// `cargo deny --offline --locked --format json [--metadata-path M] check licenses bans
/// sources`, read.
fn mk_report(metadata: Option<&Path>) -> Report {
    let mut command = mk_cargo_deny();
    command.args(["--offline", "--locked", "--format", "json", "--color", "never"]);
    if let Some(metadata) = metadata {
        command.arg("--metadata-path").arg(metadata);
    }
    command.args(["check", "licenses", "bans", "sources"]);
    let out = command.output().unwrap();
    // JSON lines on stderr, one per diagnostic, then the summary.
    let mut diagnostics = Vec::new();
    let mut logs = Vec::new();
    let mut summary = None;
    for line in String::from_utf8_lossy(&out.stderr).lines() {
        let Ok(value) = serde_json::from_str::<Value>(line) else {
            panic!("cargo deny: not a JSON line: {line}\n{}", text(&out));
        };
        let fields = &value["fields"];
        match value["type"].as_str() {
            Some("diagnostic") => diagnostics.push(Diagnostic {
                severity: fields["severity"].as_str().unwrap_or_default().to_owned(),
                code: fields["code"].as_str().unwrap_or_default().to_owned(),
                message: fields["message"].as_str().unwrap_or_default().to_owned(),
                crates: fields["graphs"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .map(|g| {
                        format!(
                            "{}@{}",
                            g["Krate"]["name"].as_str().unwrap_or("?"),
                            g["Krate"]["version"].as_str().unwrap_or("?")
                        )
                    })
                    .collect(),
            }),
            Some("summary") => summary = Some(fields.clone()),
            _ => logs.push(format!("{}: {}", fields["level"].as_str().unwrap_or("?"), fields["message"])),
        }
    }
    let summary = summary.unwrap_or_else(|| panic!("cargo deny printed no summary: {}", text(&out)));
    Report { out, diagnostics, logs, summary }
}

/// A diagnostic, for messages.
fn show(d: &Diagnostic) -> String {
    format!("{} [{}] {} ({})", d.severity, d.code, d.message, d.crates.join(", "))
}

/// The tree as it is passes; the only warnings are crates present in two versions.
#[test]
fn the_tree_passes_licences_bans_and_sources() {
    let report = mk_report(None);
    assert!(report.logs.is_empty(), "cargo deny logged:\n{}", report.logs.join("\n"));
    let shown: Vec<String> = report.diagnostics.iter().map(show).collect();
    assert!(report.out.status.success(), "cargo deny check licenses bans sources:\n{}", shown.join("\n"));
    for check in ["licenses", "bans", "sources"] {
        assert_eq!(report.summary[check]["errors"], 0, "{check}: {}", report.summary);
    }
    let (duplicates, others): (Vec<&Diagnostic>, Vec<&Diagnostic>) = report
        .diagnostics
        .iter()
        .filter(|d| d.severity != "help" && d.severity != "note")
        .partition(|d| d.code == "duplicate");
    let others: Vec<String> = others.into_iter().map(show).collect();
    assert!(
        others.is_empty(),
        "cargo deny warns about more than duplicates; fix deny.toml (an allowed licence no crate uses any \
         more is removed from `allow`):\n{}",
        others.join("\n")
    );
    // The warnings, each crate with the versions the tree holds: for whoever updates a
    // dependency and can drop an old version.
    for duplicate in duplicates {
        eprintln!(
            "two versions (warned, not denied): {} ({})",
            duplicate.message,
            duplicate.crates.join(", ")
        );
    }
}

/// The tree's `cargo metadata` (the graph cargo-deny builds: `[graph] all-features` in
/// `deny.toml`), as JSON.
fn mk_metadata() -> Value {
    let out = Command::new(env!("CARGO"))
        .args(["metadata", "--format-version", "1", "--locked", "--offline", "--all-features"])
        .current_dir(repo_root())
        .output()
        .unwrap();
    assert!(out.status.success(), "cargo metadata: {}", text(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The crate `name` from crates.io in `metadata` (the first version, if there are two).
fn package<'a>(metadata: &'a mut Value, name: &str) -> &'a mut Value {
    metadata["packages"]
        .as_array_mut()
        .unwrap()
        .iter_mut()
        .find(|p| p["name"] == name && p["source"].as_str().is_some_and(|s| s.starts_with("registry+")))
        .unwrap_or_else(|| panic!("no crate {name} from crates.io in the tree: pick another for this test"))
}

/// Each change to the tree's metadata the policy must refuse, alone, fails the check with
/// exactly the error that names it.
#[test]
fn the_policy_refuses_each_thing_it_forbids() {
    let metadata = mk_metadata();
    let scratch = std::env::temp_dir().join(format!("percolator-supply-chain-{}", std::process::id()));
    std::fs::create_dir_all(&scratch).unwrap();
    type Change = fn(&mut Value);
    // (what, the change, the error code, the crate named in it). The crates are direct
    // dependencies of percolator, so they stay in the tree.
    let cases: [(&str, Change, &str, &str); 6] = [
        (
            "a crate under a licence that is not allowed",
            |m| package(m, "bytes")["license"] = "GPL-3.0-only".into(),
            "rejected",
            "bytes",
        ),
        (
            "the CDLA licence outside webpki-root-certs",
            |m| package(m, "regex")["license"] = "CDLA-Permissive-2.0".into(),
            "rejected",
            "regex",
        ),
        (
            "a git source",
            |m| {
                package(m, "url")["source"] =
                    "git+https://example.invalid/url?rev=0123456#0123456789abcdef0123456789abcdef01234567"
                        .into();
            },
            "source-not-allowed",
            "url",
        ),
        (
            "another registry",
            |m| package(m, "jiff")["source"] = "registry+https://example.invalid/index".into(),
            "source-not-allowed",
            "jiff",
        ),
        (
            "a `*` requirement",
            |m| {
                let percolator = m["packages"]
                    .as_array_mut()
                    .unwrap()
                    .iter_mut()
                    .find(|p| p["name"] == "percolator")
                    .unwrap();
                for dependency in percolator["dependencies"].as_array_mut().unwrap() {
                    if dependency["name"] == "anyhow" {
                        dependency["req"] = "*".into();
                    }
                }
            },
            "wildcard",
            "percolator",
        ),
        (
            "OpenSSL",
            |m| package(m, "percent-encoding")["name"] = "openssl-sys".into(),
            "banned",
            "openssl-sys",
        ),
    ];
    for (what, change, code, krate) in cases {
        let mut altered = metadata.clone();
        change(&mut altered);
        let path = scratch.join("metadata.json");
        std::fs::write(&path, serde_json::to_vec(&altered).unwrap()).unwrap();
        let report = mk_report(Some(&path));
        let errors: Vec<&Diagnostic> = report.diagnostics.iter().filter(|d| d.severity == "error").collect();
        let shown: Vec<String> = errors.iter().map(|d| show(d)).collect();
        assert!(!report.out.status.success(), "{what}: cargo deny passed:\n{}", text(&report.out));
        assert!(
            errors.len() == 1
                && errors[0].code == code
                && errors[0].crates.iter().any(|c| c.starts_with(&format!("{krate}@"))),
            "{what}: expected one error [{code}] naming {krate}, got:\n{}",
            shown.join("\n")
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
}

/// The advisories this test cannot check are checked by CI's workflow on GitHub, with the
/// cargo-deny `scripts/install-deps.sh` installed (the workflow's test job runs the script).
#[test]
fn ci_checks_the_advisories() {
    let workflow = repo_read(".github/workflows/ci.yml");
    // A step's `run: cargo deny …`, or a line of a `run: |` script.
    let runs: Vec<&str> = workflow
        .lines()
        .map(|l| l.trim().trim_start_matches("run:").trim_start())
        .filter(|l| l.starts_with("cargo deny "))
        .collect();
    assert!(
        runs.iter().any(|l| l.split_whitespace().collect::<Vec<_>>().ends_with(&["check", "advisories"])),
        ".github/workflows/ci.yml should run `cargo deny … check advisories` (found: {runs:?})"
    );
    assert!(repo_read("deny.toml").contains("\n[advisories]\n"), "deny.toml should configure [advisories]");
}
