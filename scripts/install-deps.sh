#!/usr/bin/env bash
# Installs what the tests and the demo need on a fresh machine, and nothing that is already
# there: Debian's prometheus package (prometheus + promtool), Debian's victoria-metrics package
# (the second engine the end-to-end tests run against) and, from PyPI, the validators and
# clients the tests use (openapi-spec-validator, kubernetes-validate, kubernetes,
# helm-python-sdk). kubectl is expected at /usr/bin/kubectl (the machine image ships it);
# KUBECTL overrides.
set -euo pipefail

packages=()
if ! command -v prometheus >/dev/null || ! command -v promtool >/dev/null; then
  packages+=(prometheus)
fi
if [ ! -x /usr/bin/victoria-metrics ]; then
  packages+=(victoria-metrics)
fi
if [ ${#packages[@]} -gt 0 ]; then
  echo "installing Debian packages: ${packages[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${packages[@]}" >/dev/null
fi
# The Debian packages may start a system Prometheus on :9090 and a system VictoriaMetrics on
# :8428; the tests start their own.
for service in prometheus victoria-metrics; do
  if command -v systemctl >/dev/null && systemctl is-active --quiet "$service" 2>/dev/null; then
    systemctl stop "$service" || true
  fi
done

# Independent validators and clients used by the tests: OpenAPI documents, Kubernetes
# manifests, the official Kubernetes Python client, and Helm's engine for the chart.
missing=()
python3 -c 'import openapi_spec_validator' 2>/dev/null || missing+=(openapi-spec-validator)
command -v kubernetes-validate >/dev/null || missing+=(kubernetes-validate)
python3 -c 'import kubernetes' 2>/dev/null || missing+=(kubernetes)
# Helm v4 as a library (no helm binary, no cluster): the chart tests render and lint with it.
helm_sdk=helm-python-sdk==0.2.2
python3 -c 'import importlib.metadata as m; assert m.version("helm-python-sdk") == "0.2.2"' 2>/dev/null \
  || missing+=("$helm_sdk")
if [ ${#missing[@]} -gt 0 ]; then
  echo "installing from PyPI: ${missing[*]}" >&2
  python3 -m pip install --quiet --disable-pip-version-check --root-user-action=ignore "${missing[@]}"
fi

kubectl_bin="${KUBECTL:-/usr/bin/kubectl}"
if [ ! -x "$kubectl_bin" ]; then
  echo "kubectl not found at $kubectl_bin (set KUBECTL to its path)" >&2
  exit 1
fi
