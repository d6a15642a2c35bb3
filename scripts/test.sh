#!/usr/bin/env bash
# Runs every test: unit tests, handler tests and the end-to-end tests against a real
# Prometheus, the simulated cluster and real kubectl over real TLS.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# End-to-end tests mostly wait on processes; four at a time keeps two cores busy. The
# cluster benchmark (benches/) is not a test: `cargo bench --bench cluster` runs it.
exec cargo test --workspace --lib --bins --tests -- --test-threads "${TEST_THREADS:-4}"
