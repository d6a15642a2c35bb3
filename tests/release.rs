//! The release automation, offline: the GitHub workflows (`.github/workflows/ci.yml`,
//! `release.yml`), `.github/dependabot.yml`, `scripts/release-notes.sh` and the chart's package.
//!
//! - zizmor (`--offline`) reports no finding on the workflows and dependabot's file, and
//!   actionlint none on the workflows, with shellcheck on PATH so that it checks their `run:`
//!   scripts too; both are run on a deliberately bad workflow as well and must report it, so
//!   that neither check can pass vacuously.
//! - The security posture the linters do not all enforce: no permission at the top and the least
//!   per job (`packages: write` and `id-token: write` only where a job pushes or signs), every
//!   action pinned to a full commit with its release in a comment, checkouts without persisted
//!   credentials, no `${{ }}` inside a script, a concurrency group and a timeout per job, no cache
//!   in the release workflow.
//! - The release workflow agrees with the rest of the tree: its tag filters take `vX.Y.Z` and
//!   `vX.Y.Z-PRE` only; it checks the versions before anything is published; its image is the
//!   chart's default `image.repository`, built for the platforms the Dockerfile has build stages
//!   for, with SBOM and provenance, the build arguments `scripts/build-image.sh` passes, signed by
//!   digest; its chart goes to the OCI repository the README installs from, signed by digest;
//!   the release's notes are the script's output; CI builds the same platforms and runs the same
//!   Helm as the tests' engine.
//! - `scripts/release-notes.sh vX.Y.Z` prints exactly the CHANGELOG's section of the tree's
//!   version (read here independently) and refuses, naming each file, a tag without its `v`, of
//!   another version, or a tree where one file disagrees (on temporary copies of the files).
//! - The chart packages with Helm's own engine (helm-python-sdk, `tests/python/helm_package.py`)
//!   into `percolator-<Chart version>.tgz`, the file the release workflow pushes.
//!
//! Needs the tools `scripts/install-deps.sh` installs: zizmor and actionlint in the virtual
//! environment, Debian's shellcheck.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Scratch, mk_scratch};
use serde_json::Value;

const ROOT: &str = env!("CARGO_MANIFEST_DIR");
const CI: &str = ".github/workflows/ci.yml";
const RELEASE: &str = ".github/workflows/release.yml";

fn read(name: &str) -> String {
    let path = Path::new(ROOT).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A YAML file of the repository, as JSON values.
fn mk_yaml(name: &str) -> Value {
    serde_saphyr::from_str(&read(name)).unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// stdout and stderr of `out`, for messages.
fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
}

/// `Cargo.toml`'s `[workspace.package]` version, the version every file names.
fn cargo_version() -> String {
    let manifest = read("Cargo.toml");
    let mut in_package = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_package = line == "[workspace.package]";
        } else if in_package
            && let Some(("version", value)) = line.split_once('=').map(|(k, v)| (k.trim(), v))
        {
            return value.trim().trim_matches('"').to_owned();
        }
    }
    panic!("Cargo.toml: no [workspace.package] version");
}

/// The value of `key` at the top level of `charts/percolator/Chart.yaml`.
fn chart_field(key: &str) -> String {
    mk_yaml("charts/percolator/Chart.yaml")[key]
        .as_str()
        .unwrap_or_else(|| panic!("charts/percolator/Chart.yaml: no {key}"))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// The workflows
// ---------------------------------------------------------------------------------------------

/// The steps of every job of a workflow, with the job's id.
fn steps(workflow: &Value) -> Vec<(String, &Value)> {
    workflow["jobs"]
        .as_object()
        .expect("jobs")
        .iter()
        .flat_map(|(id, job)| job["steps"].as_array().into_iter().flatten().map(move |s| (id.clone(), s)))
        .collect()
}

/// The one step of `workflow` that uses `action` (`owner/repo`), with its job's id.
fn step_using<'a>(workflow: &'a Value, action: &str, what: &str) -> (String, &'a Value) {
    let found: Vec<(String, &Value)> = steps(workflow)
        .into_iter()
        .filter(|(_, s)| s["uses"].as_str().is_some_and(|u| u.starts_with(&format!("{action}@"))))
        .collect();
    let [one] = <[_; 1]>::try_from(found)
        .unwrap_or_else(|found| panic!("{what}: one step using {action} expected, found {}", found.len()));
    one
}

/// `text` with the workflow's own `${{ env.NAME }}` replaced by the workflow-level value.
fn mk_resolved(workflow: &Value, text: &str) -> String {
    let mut out = text.to_owned();
    for (name, value) in workflow["env"].as_object().into_iter().flatten() {
        out = out.replace(&format!("${{{{ env.{name} }}}}"), value.as_str().unwrap());
    }
    out
}

/// A `run:` script with `$NAME`, `${NAME}` and `${NAME#PREFIX}` expanded from the step's, the
/// job's and the workflow's `env` (the step's first), for checks on what a command is given.
fn mk_expanded(workflow: &Value, job: &str, step: &Value) -> String {
    let mut script = step["run"].as_str().unwrap_or_default().to_owned();
    for scope in [&step["env"], &workflow["jobs"][job]["env"], &workflow["env"]] {
        for (name, value) in scope.as_object().into_iter().flatten() {
            let value = value.as_str().map(str::to_owned).unwrap_or_else(|| value.to_string());
            let stripping = format!("${{{name}#");
            while let Some(at) = script.find(&stripping) {
                let end = at + script[at..].find('}').expect("a closing brace");
                let prefix = &script[at + stripping.len()..end];
                let stripped = value.strip_prefix(prefix).unwrap_or(&value).to_owned();
                script.replace_range(at..=end, &stripped);
            }
            script = script.replace(&format!("${{{name}}}"), &value).replace(&format!("${name}"), &value);
        }
    }
    script
}

/// The platforms (`linux/amd64`) of a build-push-action step.
fn platforms_of(step: &Value) -> BTreeSet<String> {
    step["with"]["platforms"].as_str().expect("platforms").split(',').map(|p| p.trim().to_owned()).collect()
}

/// The platforms the Dockerfile has a build stage for: `linux/ARCH` of each `FROM … AS build-ARCH`.
fn dockerfile_platforms() -> BTreeSet<String> {
    read("Dockerfile")
        .lines()
        .filter(|l| l.trim_start().to_uppercase().starts_with("FROM "))
        .filter_map(|l| l.split_whitespace().last()?.strip_prefix("build-").map(str::to_owned))
        .filter(|arch| !arch.contains('$'))
        .map(|arch| format!("linux/{arch}"))
        .collect()
}

/// A GitHub Actions filter pattern (branches, tags), as GitHub documents them: `*` (any run but
/// `/`), `**` (any run), `[0-9a-z]` (one of), and `+`/`?` (one or more / zero or one of what
/// precedes). A leading `!` is not supported: the release's filters have none.
fn filter_matches(pattern: &str, name: &str) -> bool {
    #[derive(Debug, Clone)]
    enum Atom {
        Char(char),
        Class(Vec<(char, char)>),
        Star,
        DoubleStar,
    }
    let mut atoms: Vec<(Atom, char)> = Vec::new();
    let mut chars = pattern.chars().peekable();
    assert!(!pattern.starts_with('!'), "filter {pattern}: negation is not supported here");
    while let Some(c) = chars.next() {
        let atom = match c {
            '*' if chars.peek() == Some(&'*') => {
                chars.next();
                Atom::DoubleStar
            }
            '*' => Atom::Star,
            '[' => {
                let mut ranges = Vec::new();
                loop {
                    match chars.next() {
                        Some(']') => break,
                        Some(from) if chars.peek() == Some(&'-') => {
                            chars.next();
                            ranges.push((from, chars.next().expect("a range's end")));
                        }
                        Some(one) => ranges.push((one, one)),
                        None => panic!("filter {pattern}: unterminated ["),
                    }
                }
                Atom::Class(ranges)
            }
            '+' | '?' => {
                let last = atoms.last_mut().unwrap_or_else(|| panic!("filter {pattern}: {c} first"));
                last.1 = c;
                continue;
            }
            c => Atom::Char(c),
        };
        atoms.push((atom, '1'));
    }
    fn one(atom: &Atom, c: char) -> bool {
        match atom {
            Atom::Char(a) => *a == c,
            Atom::Class(ranges) => ranges.iter().any(|(from, to)| (*from..=*to).contains(&c)),
            Atom::Star => c != '/',
            Atom::DoubleStar => true,
        }
    }
    fn matches(atoms: &[(Atom, char)], name: &[char]) -> bool {
        let Some(((atom, quantifier), rest)) = atoms.split_first() else { return name.is_empty() };
        let (min, max) = match (atom, quantifier) {
            (Atom::Star | Atom::DoubleStar, _) => (0, usize::MAX),
            (_, '+') => (1, usize::MAX),
            (_, '?') => (0, 1),
            _ => (1, 1),
        };
        let mut taken = 0;
        loop {
            if taken >= min && matches(rest, &name[taken..]) {
                return true;
            }
            if taken == max || taken == name.len() || !one(atom, name[taken]) {
                return false;
            }
            taken += 1;
        }
    }
    matches(&atoms, &name.chars().collect::<Vec<_>>())
}

/// The GitHub filter patterns themselves, against GitHub's documented examples.
#[test]
fn filter_patterns_match_as_github_documents_them() {
    assert!(filter_matches("v2*", "v2") && filter_matches("v2*", "v2.0") && !filter_matches("v2*", "v1.9"));
    assert!(
        filter_matches("v[12].[0-9]+.[0-9]+", "v1.10.1") && filter_matches("v[12].[0-9]+.[0-9]+", "v2.0.0")
    );
    assert!(
        !filter_matches("v[12].[0-9]+.[0-9]+", "v3.0.0") && !filter_matches("v[12].[0-9]+.[0-9]+", "v1.a.0")
    );
    assert!(
        filter_matches("feature/*", "feature/my-branch")
            && !filter_matches("feature/*", "feature/your/branch")
    );
    assert!(filter_matches("feature/**", "feature/your/branch"));
    assert!(filter_matches("feature/ab?", "feature/a") && filter_matches("feature/ab?", "feature/ab"));
}

/// Every `uses:` line of the workflows: pinned to a full commit, with the release in a comment.
#[test]
fn every_action_is_pinned_to_a_commit_with_its_release() {
    for name in [CI, RELEASE] {
        let text = read(name);
        let mut seen = 0;
        for (number, line) in text.lines().enumerate() {
            let Some(uses) = line.trim_start().trim_start_matches("- ").strip_prefix("uses:") else {
                continue;
            };
            seen += 1;
            let (reference, comment) = uses.split_once('#').unwrap_or((uses, ""));
            let reference = reference.trim();
            let (action, commit) = reference
                .split_once('@')
                .unwrap_or_else(|| panic!("{name}:{}: `{reference}` names no version", number + 1));
            assert!(
                action.split('/').count() >= 2 && !action.starts_with('.'),
                "{name}:{}: {action}: owner/repository expected",
                number + 1
            );
            assert!(
                commit.len() == 40
                    && commit.chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()),
                "{name}:{}: {reference}: pin the action to a full commit (40 hex digits), not a tag or branch",
                number + 1
            );
            let release = comment.trim();
            let parts: Vec<&str> = release.strip_prefix('v').unwrap_or("").split('.').collect();
            assert!(
                parts.len() == 3
                    && parts.iter().all(|p| !p.is_empty() && p.chars().all(|c| c.is_ascii_digit())),
                "{name}:{}: {reference}: a `# vX.Y.Z` comment saying which release the commit is, not `{release}`",
                number + 1
            );
        }
        assert!(seen > 0, "{name}: no `uses:` line seen");
    }
}

/// What a job needs: `packages: write` and `id-token: write` only in the jobs that push or sign,
/// nothing at the top, a timeout everywhere, checkouts that keep no credentials, scripts that take
/// expressions through `env:` only, one run at a time per ref, and no cache in the release.
#[test]
fn workflows_grant_the_least_and_keep_nothing() {
    for name in [CI, RELEASE] {
        let workflow = mk_yaml(name);
        assert_eq!(workflow["permissions"], serde_json::json!({}), "{name}: `permissions: {{}}` at the top");
        assert!(workflow["concurrency"]["group"].is_string(), "{name}: a concurrency group");
        for (id, job) in workflow["jobs"].as_object().unwrap() {
            let minutes = job["timeout-minutes"]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: job {id}: timeout-minutes"));
            assert!((1..=120).contains(&minutes), "{name}: job {id}: timeout-minutes {minutes}");
            let permissions =
                job["permissions"].as_object().unwrap_or_else(|| panic!("{name}: job {id}: permissions"));
            let job_steps = job["steps"].as_array().unwrap();
            let scripts: String =
                job_steps.iter().filter_map(|s| s["run"].as_str()).collect::<Vec<_>>().join("\n");
            let pushes = job_steps.iter().any(|s| s["with"]["push"] == true)
                || scripts.contains("helm push")
                || scripts.contains("cosign sign");
            let signs = scripts.contains("cosign sign");
            assert_eq!(
                permissions.get("packages").and_then(Value::as_str) == Some("write"),
                pushes,
                "{name}: job {id}: packages: write exactly when the job pushes to the registry"
            );
            assert_eq!(
                permissions.get("id-token").and_then(Value::as_str) == Some("write"),
                signs,
                "{name}: job {id}: id-token: write exactly when the job signs (cosign keyless)"
            );
            for (permission, access) in permissions {
                assert!(
                    matches!(
                        (permission.as_str(), access.as_str()),
                        (_, Some("read")) | ("packages" | "id-token", _)
                    ) || (permission == "contents" && scripts.contains("gh release create")),
                    "{name}: job {id}: {permission}: {access} is more than it needs"
                );
            }
            for step in job_steps {
                if step["uses"].as_str().is_some_and(|u| u.starts_with("actions/checkout@")) {
                    assert_eq!(
                        step["with"]["persist-credentials"], false,
                        "{name}: job {id}: checkout with persist-credentials: false"
                    );
                }
                if let Some(run) = step["run"].as_str() {
                    assert!(
                        !run.contains("${{"),
                        "{name}: job {id}: an expression inside a script (pass it through env:): {run}"
                    );
                }
            }
        }
    }
    // The release builds from the tag alone: a cache written by another run could poison it.
    let release = mk_yaml(RELEASE);
    for (job, step) in steps(&release) {
        let uses = step["uses"].as_str().unwrap_or_default();
        assert!(
            !(uses.starts_with("actions/cache") || uses.contains("rust-cache")),
            "{RELEASE}: job {job}: {uses}: no cache in the release (cache poisoning)"
        );
        for (input, _) in step["with"].as_object().into_iter().flatten() {
            assert!(
                !input.contains("cache"),
                "{RELEASE}: job {job}: {uses} with {input}: no cache in the release (cache poisoning)"
            );
        }
    }
}

/// zizmor (offline: no GitHub API) reports no finding on the workflows and dependabot's file.
#[test]
fn zizmor_finds_nothing() {
    let out = Command::new(common::venv_bin("zizmor"))
        .args([
            "--offline",
            "--format",
            "json",
            "--no-progress",
            ".github/workflows",
            ".github/dependabot.yml",
        ])
        .current_dir(ROOT)
        .output()
        .unwrap();
    let findings: Vec<Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("zizmor's JSON: {e}: {}", text(&out)));
    let shown: Vec<String> = findings.iter().map(mk_zizmor_finding).collect();
    assert!(findings.is_empty(), "zizmor's findings:\n{}", shown.join("\n"));
    assert!(out.status.success(), "zizmor: {}", text(&out));
}

/// One zizmor finding, for messages: its audit, where, and what it says.
fn mk_zizmor_finding(finding: &Value) -> String {
    let locations: Vec<String> = finding["locations"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|l| {
            format!(
                "{}:{} {}",
                l["symbolic"]["key"]["Local"]["given_path"].as_str().unwrap_or("?"),
                l["concrete"]["location"]["start_point"]["row"].as_u64().map_or(0, |r| r + 1),
                l["symbolic"]["annotation"].as_str().unwrap_or("")
            )
        })
        .collect();
    format!(
        "{} ({}): {} at {}",
        finding["ident"].as_str().unwrap_or("?"),
        finding["determinations"]["severity"].as_str().unwrap_or("?"),
        finding["desc"].as_str().unwrap_or(""),
        locations.join("; ")
    )
}

/// shellcheck on PATH, as actionlint looks for it: without it actionlint skips the scripts
/// without a word.
fn shellcheck() -> PathBuf {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .map(|dir| dir.join("shellcheck"))
        .find(|bin| bin.is_file())
        .expect(
            "shellcheck is not on PATH: run scripts/install-deps.sh (Debian's shellcheck package); \
             actionlint checks the workflows' scripts with it",
        )
}

/// actionlint's errors on `files` (relative to `dir`), as JSON, and its exit status.
fn mk_actionlint(dir: &Path, files: &[&str]) -> (Vec<Value>, Output) {
    let out = Command::new(common::venv_bin("actionlint"))
        .arg("-shellcheck")
        .arg(shellcheck())
        .args(["-pyflakes", "", "-format", "{{json .}}"])
        .args(files)
        .current_dir(dir)
        .output()
        .unwrap();
    let errors: Vec<Value> = serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("actionlint's JSON: {e}: {}", text(&out)));
    (errors, out)
}

/// actionlint, with shellcheck for the `run:` scripts, reports nothing on the workflows.
#[test]
fn actionlint_finds_nothing() {
    let (errors, out) = mk_actionlint(Path::new(ROOT), &[CI, RELEASE]);
    let shown: Vec<String> = errors
        .iter()
        .map(|e| format!("{}:{}: [{}] {}", e["filepath"], e["line"], e["kind"], e["message"]))
        .collect();
    assert!(errors.is_empty(), "actionlint:\n{}", shown.join("\n"));
    assert!(out.status.success(), "actionlint: {}", text(&out));
}

/// Both linters, run as above on a workflow with an unpinned action, an untrusted expression
/// inside a script and an unquoted variable, report each: the checks above are not vacuous.
#[test]
fn the_linters_report_a_bad_workflow() {
    let scratch = mk_scratch("release-bad-workflow");
    let workflows = scratch.0.join(".github/workflows");
    std::fs::create_dir_all(&workflows).unwrap();
    std::fs::write(
        workflows.join("bad.yml"),
        "name: bad\non:\n  issues:\n    types: [opened]\npermissions: {}\njobs:\n  greet:\n    runs-on: ubuntu-24.04\n    \
         timeout-minutes: 5\n    steps:\n      - uses: docker/login-action@v4\n      \
         - run: echo \"${{ github.event.issue.title }}\" $GREETING\n",
    )
    .unwrap();

    let out = Command::new(common::venv_bin("zizmor"))
        .args(["--offline", "--format", "json", "--no-progress", ".github/workflows"])
        .current_dir(&scratch.0)
        .output()
        .unwrap();
    let findings: Vec<Value> =
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out)));
    let idents: BTreeSet<&str> = findings.iter().filter_map(|f| f["ident"].as_str()).collect();
    for expected in ["unpinned-uses", "template-injection"] {
        assert!(idents.contains(expected), "zizmor should report {expected} in the bad workflow: {idents:?}");
    }
    assert!(!out.status.success(), "zizmor should fail on the bad workflow");

    let (errors, out) = mk_actionlint(&scratch.0, &[".github/workflows/bad.yml"]);
    let kinds: BTreeSet<&str> = errors.iter().filter_map(|e| e["kind"].as_str()).collect();
    for expected in ["expression", "shellcheck"] {
        assert!(
            kinds.contains(expected),
            "actionlint should report a {expected} error in the bad workflow: {errors:?}"
        );
    }
    assert!(!out.status.success(), "actionlint should fail on the bad workflow");
}

/// The release workflow publishes what the rest of the tree names: the chart's image for the
/// Dockerfile's platforms, the chart where the README installs it from, the notes the script
/// prints; and CI builds what the release builds, with the tests' Helm.
#[test]
fn the_release_publishes_what_the_tree_names() {
    let workflow = mk_yaml(RELEASE);

    // Tags: vX.Y.Z and vX.Y.Z-PRE, nothing else.
    let filters: Vec<&str> = workflow["on"]["push"]["tags"]
        .as_array()
        .expect("on.push.tags")
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    let released = |tag: &str| filters.iter().any(|f| filter_matches(f, tag));
    for tag in ["v0.3.0", "v1.12.100", "v1.0.0-rc.1"] {
        assert!(released(tag), "{RELEASE}: the tag filters {filters:?} should take {tag}");
    }
    for tag in ["0.3.0", "v0.3", "v0.3.0.1", "latest", "v1.x.0"] {
        assert!(!released(tag), "{RELEASE}: the tag filters {filters:?} should not take {tag}");
    }
    assert!(
        workflow["on"]["push"]["branches"].is_null() && workflow["on"].as_object().unwrap().len() == 1,
        "{RELEASE}: runs on tags alone: {}",
        workflow["on"]
    );

    // The check comes first: every other job needs it.
    let jobs = workflow["jobs"].as_object().unwrap();
    let (check_job, check) = steps(&workflow)
        .into_iter()
        .find(|(_, s)| s["run"].as_str().is_some_and(|r| r.contains("scripts/release-notes.sh")))
        .expect("a step running scripts/release-notes.sh");
    assert_eq!(
        check["env"]["TAG"], "${{ github.ref_name }}",
        "{RELEASE}: release-notes.sh checks the pushed tag"
    );
    assert!(
        check["run"].as_str().unwrap().contains("scripts/release-notes.sh \"$TAG\" >release-notes.md"),
        "{RELEASE}: the notes are the script's output: {}",
        check["run"]
    );
    for (id, job) in jobs {
        if *id == check_job {
            continue;
        }
        let needs: Vec<&str> = match &job["needs"] {
            Value::String(one) => vec![one],
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            _ => vec![],
        };
        assert!(needs.contains(&check_job.as_str()), "{RELEASE}: job {id} should need {check_job}");
    }

    // The image: the chart's default, both platforms of the Dockerfile, SBOM and provenance.
    let values = mk_yaml("charts/percolator/values.yaml");
    let repository = values["image"]["repository"].as_str().expect("values.yaml image.repository");
    let (_, meta) = step_using(&workflow, "docker/metadata-action", RELEASE);
    assert_eq!(
        mk_resolved(&workflow, meta["with"]["images"].as_str().unwrap()),
        repository,
        "{RELEASE}: the image pushed and the chart's image.repository"
    );
    let tags: BTreeSet<&str> = meta["with"]["tags"].as_str().unwrap().lines().map(str::trim).collect();
    assert_eq!(
        tags,
        BTreeSet::from(["type=semver,pattern={{version}}", "type=semver,pattern={{major}}.{{minor}}"]),
        "{RELEASE}: the image's tags X.Y.Z and X.Y"
    );
    assert_eq!(meta["with"]["flavor"], "latest=false", "{RELEASE}: no `latest` tag");
    let (image_job, build) = step_using(&workflow, "docker/build-push-action", RELEASE);
    let platforms = platforms_of(build);
    assert_eq!(
        platforms,
        dockerfile_platforms(),
        "{RELEASE}: the platforms and the Dockerfile's build stages"
    );
    assert_eq!(build["with"]["push"], true, "{RELEASE}: the image is pushed");
    assert_eq!(
        build["with"]["context"], ".",
        "{RELEASE}: the checked-out tree, as tests/image.rs replays it"
    );
    assert_eq!(
        build["with"]["tags"],
        format!("${{{{ steps.{}.outputs.tags }}}}", meta["id"].as_str().unwrap()),
        "{RELEASE}: the image's tags are metadata-action's"
    );
    assert_eq!(build["with"]["provenance"], "mode=max", "{RELEASE}: the full provenance attestation");
    assert!(build["with"]["sbom"] == true || build["with"]["sbom"] == "true", "{RELEASE}: sbom: true");
    let build_args: BTreeMap<&str, &str> = build["with"]["build-args"]
        .as_str()
        .expect("build-args")
        .lines()
        .filter_map(|l| l.trim().split_once('='))
        .collect();
    assert_eq!(build_args.get("REVISION"), Some(&"${{ github.sha }}"), "{RELEASE}: REVISION is the commit");
    assert_eq!(
        build_args.get("VERSION"),
        Some(&format!("${{{{ needs.{check_job}.outputs.version }}}}").as_str()),
        "{RELEASE}: VERSION is the checked version"
    );
    assert_eq!(
        build_args.keys().copied().collect::<BTreeSet<_>>(),
        build_image_args(),
        "{RELEASE}: the build arguments and scripts/build-image.sh's"
    );
    // Signed by the digest just pushed.
    let digest =
        format!("${{{{ steps.{}.outputs.digest }}}}", build["id"].as_str().expect("the build step's id"));
    let signs: Vec<String> = steps(&workflow)
        .into_iter()
        .filter(|(job, s)| *job == image_job && s["run"].as_str().is_some_and(|r| r.contains("cosign sign")))
        .map(|(job, s)| mk_expanded(&workflow, &job, s))
        .collect();
    assert_eq!(
        signs,
        [format!("cosign sign --yes \"{repository}@{digest}\"")],
        "{RELEASE}: the image's signature"
    );

    // The chart: packaged, pushed where the README installs from, signed by the pushed digest.
    let chart_name = chart_field("name");
    let (chart_job, chart_step) = steps(&workflow)
        .into_iter()
        .find(|(_, s)| s["run"].as_str().is_some_and(|r| r.contains("helm push")))
        .expect("a step running helm push");
    let script = mk_expanded(&workflow, &chart_job, chart_step);
    let push = script.lines().find(|l| l.contains("helm push")).unwrap();
    let pushed_to = push
        .split_whitespace()
        .map(|w| w.trim_matches('"'))
        .find(|w| w.starts_with("oci://"))
        .unwrap_or_else(|| panic!("{RELEASE}: helm push to no oci:// repository: {push}"));
    let oci = format!("{pushed_to}/{chart_name}");
    assert!(
        push.contains(&format!("dist/{chart_name}-${{{{ needs.{check_job}.outputs.version }}}}.tgz")),
        "{push}"
    );
    assert!(script.contains(&format!("helm package charts/{chart_name} --destination dist")), "{script}");
    assert!(
        script.contains(&format!(
            "cosign sign --yes \"{}/{chart_name}@$digest\"",
            pushed_to.trim_start_matches("oci://")
        )),
        "{RELEASE}: the chart signed by the digest helm push printed: {script}"
    );
    assert_eq!(
        oci,
        readme_install().0,
        "README.md installs the chart from another repository than {RELEASE} pushes it to"
    );

    // The release: the notes the check printed, of the pushed tag.
    let (_, release) = steps(&workflow)
        .into_iter()
        .find(|(_, s)| s["run"].as_str().is_some_and(|r| r.contains("gh release create")))
        .expect("a step running gh release create");
    let create = release["run"].as_str().unwrap();
    for part in ["gh release create \"$TAG\" --verify-tag", "--notes-file release-notes.md"] {
        assert!(create.contains(part), "{RELEASE}: `{part}` in {create}");
    }
    assert_eq!(release["env"]["TAG"], "${{ github.ref_name }}", "{RELEASE}: the release of the pushed tag");

    // CI builds the platforms the release builds, and runs the Helm the tests' engine embeds.
    let ci = mk_yaml(CI);
    let (_, ci_build) = step_using(&ci, "docker/build-push-action", CI);
    assert_eq!(platforms_of(ci_build), platforms, "{CI}: the image job's platforms and the release's");
    assert_eq!(ci_build["with"]["push"], false, "{CI}: the image job pushes nothing");
    let embedded = Command::new(common::python())
        .args(["-c", "import helm_python; print(helm_python.EXPECTED_HELM_SDK_VERSION)"])
        .output()
        .unwrap();
    let embedded = String::from_utf8(embedded.stdout).unwrap().trim().to_owned();
    assert!(embedded.starts_with('v'), "helm-python-sdk's Helm version: {embedded}");
    for (name, workflow) in [(CI, &ci), (RELEASE, &workflow)] {
        let (_, helm) = step_using(workflow, "azure/setup-helm", name);
        assert_eq!(
            helm["with"]["version"],
            embedded.as_str(),
            "{name}: the Helm release the tests run (helm-python-sdk)"
        );
    }
    assert!(
        steps(&ci)
            .iter()
            .any(|(_, s)| s["run"].as_str().is_some_and(|r| r.lines().any(|l| l.trim() == ".ci/run"))),
        "{CI}: the test job runs .ci/run"
    );
}

/// The README's `helm install` of the published chart: its `oci://` reference and `--version`.
fn readme_install() -> (String, Option<String>) {
    let readme = read("README.md");
    let install = readme
        .lines()
        .find(|l| l.contains("helm install") && l.contains("oci://"))
        .expect("README.md: no `helm install percolator oci://… --version X` command");
    let words: Vec<&str> = install.split_whitespace().collect();
    let oci = words.iter().find(|w| w.starts_with("oci://")).unwrap();
    let version = words.iter().skip_while(|w| **w != "--version").nth(1);
    ((*oci).to_owned(), version.map(|v| (*v).to_owned()))
}

/// The README installs the chart of this version (the repository is checked against the
/// release workflow above).
#[test]
fn the_readme_installs_this_version_of_the_chart() {
    let (oci, version) = readme_install();
    assert!(oci.ends_with(&format!("/{}", chart_field("name"))), "README.md: {oci}");
    assert_eq!(
        version.as_deref(),
        Some(chart_field("version").as_str()),
        "README.md: the `--version` of `helm install … {oci}` should be the chart's version"
    );
}

/// The build arguments `scripts/build-image.sh` passes (`--build-arg NAME=…`), from a dry run
/// with a stand-in docker that has buildx: the release passes the same.
fn build_image_args() -> BTreeSet<&'static str> {
    let scratch = mk_scratch("release-build-image");
    let docker = scratch.0.join("docker");
    std::fs::write(&docker, "#!/bin/sh\n# a stand-in: `docker buildx version` succeeds\nexit 0\n").unwrap();
    std::fs::set_permissions(&docker, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = format!("{}:{}", scratch.0.display(), std::env::var("PATH").unwrap_or_default());
    let out = Command::new(Path::new(ROOT).join("scripts/build-image.sh"))
        .args(["--dry-run", "--engine", "docker", "--platform", "linux/amd64,linux/arm64", "--push"])
        .env("PATH", path)
        .env_remove("TAG")
        .env_remove("IMAGE")
        .output()
        .unwrap();
    assert!(out.status.success(), "scripts/build-image.sh --dry-run: {}", text(&out));
    let stderr = String::from_utf8(out.stderr).unwrap();
    let command =
        stderr.lines().find(|l| l.starts_with("+ docker buildx build")).unwrap_or_else(|| panic!("{stderr}"));
    let words: Vec<&str> = command.split_whitespace().collect();
    let args: BTreeMap<String, String> = words
        .windows(2)
        .filter(|w| w[0] == "--build-arg")
        .filter_map(|w| w[1].split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())))
        .collect();
    assert_eq!(args.get("VERSION"), Some(&cargo_version()), "scripts/build-image.sh: {command}");
    assert!(command.contains("--platform linux/amd64,linux/arm64"), "{command}");
    let mut names = BTreeSet::new();
    for name in args.keys() {
        match name.as_str() {
            "VERSION" => names.insert("VERSION"),
            "REVISION" => names.insert("REVISION"),
            other => panic!(
                "scripts/build-image.sh passes --build-arg {other}, which the release workflow does not"
            ),
        };
    }
    names
}

// ---------------------------------------------------------------------------------------------
// scripts/release-notes.sh
// ---------------------------------------------------------------------------------------------

/// The body of `changelog`'s section for `version`, read independently of the script: the lines
/// after `## [VERSION] - DATE` up to the next `## ` heading or the link references at the end,
/// without the blank lines around them.
fn mk_section(changelog: &str, version: &str) -> String {
    let heading = format!("## [{version}] - ");
    let mut lines = changelog.lines().skip_while(|l| !l.starts_with(&heading));
    let date = lines.next().unwrap_or_else(|| panic!("CHANGELOG.md: no section {heading}…"))[heading.len()..]
        .to_owned();
    assert!(
        date.len() == 10
            && date.chars().enumerate().all(|(i, c)| if i == 4 || i == 7 {
                c == '-'
            } else {
                c.is_ascii_digit()
            }),
        "CHANGELOG.md: {heading}{date}: a YYYY-MM-DD date"
    );
    let body: Vec<&str> = lines.take_while(|l| !(l.starts_with("## ") || is_link_reference(l))).collect();
    body.join("\n").trim_matches('\n').to_owned()
}

/// A Markdown link reference definition (`[0.2.0]: https://…`), which Keep a Changelog puts at
/// the end of the file.
fn is_link_reference(line: &str) -> bool {
    line.starts_with('[') && line.contains("]: ")
}

/// Runs `scripts/release-notes.sh` of `root` (the repository or a copy) with `args`.
fn release_notes(root: &Path, args: &[&str]) -> Output {
    Command::new(root.join("scripts/release-notes.sh")).args(args).output().unwrap()
}

/// The files the script reads, copied to a temporary tree where one can be made to disagree.
fn mk_tree(name: &str) -> Scratch {
    let scratch = mk_scratch(&format!("release-{name}"));
    let mut pending = vec![PathBuf::from("deploy")];
    for file in ["scripts/release-notes.sh", "Cargo.toml", "charts/percolator/Chart.yaml", "CHANGELOG.md"] {
        pending.push(PathBuf::from(file));
    }
    while let Some(relative) = pending.pop() {
        let from = Path::new(ROOT).join(&relative);
        let to = scratch.0.join(&relative);
        if from.is_dir() {
            for entry in std::fs::read_dir(&from).unwrap() {
                pending.push(relative.join(entry.unwrap().file_name()));
            }
        } else {
            std::fs::create_dir_all(to.parent().unwrap()).unwrap();
            std::fs::copy(&from, &to).unwrap();
        }
    }
    scratch
}

/// Replaces `from` by `to` in the copy's `file`, which must contain it.
fn edit(tree: &Scratch, file: &str, from: &str, to: &str) {
    let path = tree.0.join(file);
    let text = std::fs::read_to_string(&path).unwrap();
    assert!(text.contains(from), "{file} has no `{from}`");
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
}

/// With the tree's own version, the notes are exactly the CHANGELOG's section.
#[test]
fn release_notes_are_the_changelog_section_of_the_version() {
    let version = cargo_version();
    let out = release_notes(Path::new(ROOT), &[&format!("v{version}")]);
    assert!(out.status.success(), "scripts/release-notes.sh v{version}: {}", text(&out));
    let expected = mk_section(&read("CHANGELOG.md"), &version);
    assert!(!expected.is_empty(), "CHANGELOG.md's section for {version} is empty");
    assert_eq!(String::from_utf8_lossy(&out.stdout), format!("{expected}\n"));
    assert!(out.stderr.is_empty(), "{}", text(&out));
}

/// A tag of another version, or without its `v`, is refused with the reason; every file that
/// disagrees is named.
#[test]
fn release_notes_refuse_a_tag_the_tree_disagrees_with() {
    let version = cargo_version();
    let (core, _) = version.split_once('-').unwrap_or((&version, ""));
    let mut parts: Vec<u64> = core.split('.').map(|p| p.parse().unwrap()).collect();
    parts[2] += 1;
    let other = format!("{}.{}.{}", parts[0], parts[1], parts[2]);

    let out = release_notes(Path::new(ROOT), &[&format!("v{other}")]);
    assert!(!out.status.success() && out.stdout.is_empty(), "v{other}: {}", text(&out));
    let stderr = String::from_utf8(out.stderr).unwrap();
    for named in [
        format!("Cargo.toml: [workspace.package] version is {version}, not {other}"),
        format!("charts/percolator/Chart.yaml: version is {}, not {other}", chart_field("version")),
        format!("charts/percolator/Chart.yaml: appVersion is {}, not {other}", chart_field("appVersion")),
        format!("deploy/base/deployment.yaml: names ghcr.io/une-tasse-de/percolator:{version}, not"),
        format!("CHANGELOG.md: no section for {other}"),
    ] {
        assert!(stderr.contains(&named), "v{other} should be refused with `{named}`:\n{stderr}");
    }

    let out = release_notes(Path::new(ROOT), &[&version]);
    assert!(!out.status.success(), "{version}: {}", text(&out));
    assert!(text(&out).contains(&format!("the tag {version} lacks its leading v")), "{}", text(&out));
    for bad in ["v1.2", "v1.2.3+build.4", "release-1.2.3", ""] {
        let out = release_notes(Path::new(ROOT), &[bad]);
        assert!(!out.status.success(), "{bad}: {}", text(&out));
        assert!(text(&out).contains(&format!("{bad} is not a release tag")), "{bad}: {}", text(&out));
    }
}

/// On a copy of the files, each kind of disagreement fails naming the file that disagrees, and
/// only that one.
#[test]
fn release_notes_name_the_file_that_disagrees() {
    let version = cargo_version();
    let tag = format!("v{version}");
    let heading = mk_heading(&version);
    let cases: Vec<(&str, &str, String, String, String)> = vec![
        (
            "no-changelog-section",
            "CHANGELOG.md",
            heading.clone(),
            format!("## [{version}-not] - 2026-01-01"),
            format!("CHANGELOG.md: no section for {version} (a heading `## [{version}] - YYYY-MM-DD`)"),
        ),
        (
            "undated-section",
            "CHANGELOG.md",
            heading.clone(),
            format!("## [{version}]"),
            format!("CHANGELOG.md: the heading `## [{version}]` is not `## [{version}] - YYYY-MM-DD`"),
        ),
        (
            "empty-section",
            "CHANGELOG.md",
            heading.clone(),
            format!("{heading}\n\n## [{version}-previous] - 2026-01-01"),
            format!("CHANGELOG.md: the section for {version} is empty"),
        ),
        (
            "chart-version",
            "charts/percolator/Chart.yaml",
            format!("\nversion: {version}\n"),
            "\nversion: 9.9.9\n".to_owned(),
            format!("charts/percolator/Chart.yaml: version is 9.9.9, not {version}"),
        ),
        (
            "chart-app-version",
            "charts/percolator/Chart.yaml",
            format!("appVersion: \"{version}\""),
            "appVersion: \"9.9.9\"".to_owned(),
            format!("charts/percolator/Chart.yaml: appVersion is 9.9.9, not {version}"),
        ),
        (
            "cargo",
            "Cargo.toml",
            format!("[workspace.package]\nversion = \"{version}\""),
            "[workspace.package]\nversion = \"9.9.9\"".to_owned(),
            format!("Cargo.toml: [workspace.package] version is 9.9.9, not {version}"),
        ),
        (
            "deploy",
            "deploy/base/deployment.yaml",
            format!("ghcr.io/une-tasse-de/percolator:{version}"),
            "ghcr.io/une-tasse-de/percolator:9.9.9".to_owned(),
            format!(
                "deploy/base/deployment.yaml: names ghcr.io/une-tasse-de/percolator:9.9.9, not ghcr.io/une-tasse-de/percolator:{version}"
            ),
        ),
    ];
    for (name, file, from, to, expected) in cases {
        let tree = mk_tree(name);
        assert!(release_notes(&tree.0, &[&tag]).status.success(), "{name}: the copy agrees before the edit");
        edit(&tree, file, &from, &to);
        let out = release_notes(&tree.0, &[&tag]);
        let stderr = String::from_utf8(out.stderr.clone()).unwrap();
        assert!(!out.status.success() && out.stdout.is_empty(), "{name}: {}", text(&out));
        let problems: Vec<&str> = stderr.lines().filter_map(|l| l.strip_prefix("  - ")).collect();
        assert_eq!(problems, [expected.as_str()], "{name}: {stderr}");
    }

    // The chart's Artifact Hub image, when Chart.yaml has the annotation.
    let chart = read("charts/percolator/Chart.yaml");
    let annotated = format!("image: ghcr.io/une-tasse-de/percolator:{version}");
    if chart.contains("artifacthub.io/images") && chart.contains(&annotated) {
        let tree = mk_tree("artifacthub");
        edit(
            &tree,
            "charts/percolator/Chart.yaml",
            &annotated,
            "image: ghcr.io/une-tasse-de/percolator:9.9.9",
        );
        let out = release_notes(&tree.0, &[&tag]);
        assert!(!out.status.success(), "{}", text(&out));
        assert!(
            text(&out).contains("charts/percolator/Chart.yaml: artifacthub.io/images names ghcr.io/une-tasse-de/percolator:9.9.9"),
            "{}",
            text(&out)
        );
    }
}

/// The heading of `version`'s section in CHANGELOG.md, as written there.
fn mk_heading(version: &str) -> String {
    read("CHANGELOG.md")
        .lines()
        .find(|l| l.starts_with(&format!("## [{version}] - ")))
        .unwrap_or_else(|| panic!("CHANGELOG.md: no section for {version}"))
        .to_owned()
}

// ---------------------------------------------------------------------------------------------
// The chart's package
// ---------------------------------------------------------------------------------------------

/// `helm package` (Helm's engine) writes `percolator-<Chart version>.tgz`, the file the release
/// workflow pushes, holding the chart at that version with its schema and templates.
#[test]
fn the_chart_packages_into_the_file_the_release_pushes() {
    let scratch = mk_scratch("release-package");
    let out = Command::new(common::python())
        .arg(Path::new(ROOT).join("tests/python/helm_package.py"))
        .arg(Path::new(ROOT).join("charts/percolator"))
        .arg(&scratch.0)
        .output()
        .unwrap();
    assert!(out.status.success(), "helm package: {}", text(&out));
    let packaged: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (name, version) = (chart_field("name"), chart_field("version"));
    let path = PathBuf::from(packaged["path"].as_str().unwrap());
    assert_eq!(path, scratch.0.join(format!("{name}-{version}.tgz")));
    assert!(path.is_file(), "{}", path.display());
    assert_eq!(packaged["chart"]["version"], version.as_str());
    assert_eq!(packaged["chart"]["appVersion"], chart_field("appVersion").as_str());
    let files: BTreeSet<&str> =
        packaged["files"].as_array().unwrap().iter().filter_map(Value::as_str).collect();
    for needed in
        ["Chart.yaml", "values.yaml", "values.schema.json", "templates/deployment.yaml", "README.md"]
    {
        assert!(files.contains(format!("{name}/{needed}").as_str()), "the package lacks {needed}: {files:?}");
    }
}
