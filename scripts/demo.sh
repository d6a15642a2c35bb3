#!/usr/bin/env bash
# The local demo: builds percolator, starts a simulated cluster (its kube-apiserver
# aggregating percolator's API groups), a real Prometheus and percolator on loopback, waits
# for the first data and prints the kubectl commands to try. Logs go to files in the demo
# directory (.demo by default). Options: --resource-source=prometheus, --dir, --nodes,
# --pods-per-node, --port, --api-port, --v (see `percolator-sim demo --help`). Ctrl-C stops it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
exec cargo run --release -p percolator-sim -- demo "$@"
