#!/usr/bin/env bash
# The local demo: builds percolator, starts a simulated cluster, a real Prometheus and
# percolator on loopback, and prints the kubectl commands to try. Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec cargo run --release --bin percolator-sim -- demo "$@"
