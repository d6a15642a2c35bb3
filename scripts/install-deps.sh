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

# Independent validators and clients used by the tests: OpenAPI documents, Kubernetes
# manifests, and the official Kubernetes Python client.
missing=()
python3 -c 'import openapi_spec_validator' 2>/dev/null || missing+=(openapi-spec-validator)
command -v kubernetes-validate >/dev/null || missing+=(kubernetes-validate)
python3 -c 'import kubernetes' 2>/dev/null || missing+=(kubernetes)
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing from PyPI: ${missing[*]}" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${missing[@]}"
fi

kubectl_bin="${KUBECTL:-/usr/bin/kubectl}"
if [ ! -x "$kubectl_bin" ]; then
  echo "kubectl not found at $kubectl_bin (set KUBECTL to its path)" >&2
  exit 1
fi
