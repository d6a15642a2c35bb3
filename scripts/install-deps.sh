#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, and nothing that is already
# there: Debian's prometheus package (prometheus + promtool) and, for the OpenAPI validation
# test, openapi-spec-validator from PyPI. kubectl is expected at /usr/bin/kubectl (the machine
# image ships it); KUBECTL overrides.
set -euo pipefail

if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  echo "installing Debian package prometheus" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends prometheus >/dev/null
fi
# The Debian package may start a system Prometheus on :9090; the tests start their own.
if command -v systemctl >/dev/null && systemctl is-active --quiet prometheus 2>/dev/null; then
  systemctl stop prometheus || true
fi

if ! python3 -c 'import openapi_spec_validator' 2>/dev/null; then
  echo "installing openapi-spec-validator from PyPI" >&2
  python3 -m pip install --quiet --disable-pip-version-check openapi-spec-validator
fi

kubectl_bin="${KUBECTL:-/usr/bin/kubectl}"
if [ ! -x "$kubectl_bin" ]; then
  echo "kubectl not found at $kubectl_bin (set KUBECTL to its path)" >&2
  exit 1
fi
