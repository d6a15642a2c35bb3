#!/usr/bin/env bash
# The cluster-scale benchmarks (BENCHMARKS.md): installs what they need on a fresh machine
# (the test dependencies, and h2load from Debian's nghttp2-client), then runs
# `cargo bench --bench cluster` with the given arguments: sizes in pods (default: 1000 10000)
# and the switches documented in benches/cluster.rs and BENCHMARKS.md (--only=b1,b2,...,
# --rounds N, --duration SECS, --loadgen-check, --memory-only, --resource-source=prometheus;
# env PERCOLATOR_BIN measures another percolator binary; env PERCOLATOR_BASELINE_BIN is B9's
# baseline binary, measured after it in the same run).
# The table is printed and written to target/bench-report.md (under CARGO_TARGET_DIR if set).
set -euo pipefail
cd "$(dirname "$0")/.."
# One benchmark at a time on this machine: two would share its cores and spoil both
# (ratios are same-run, but not against a second bench's load).
exec 9>"${TMPDIR:-/tmp}/percolator-bench.lock"
if ! flock -n 9; then
  echo "another scripts/bench.sh is running; waiting for it" >&2
  flock 9
fi
scripts/install-deps.sh
if ! command -v h2load >/dev/null; then
  echo "installing Debian package nghttp2-client (h2load)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends nghttp2-client >/dev/null
fi
# The simulator is another package: Cargo builds only this package's binaries for its bench.
cargo build --release -p percolator-sim --bin percolator-sim
exec cargo bench --bench cluster -- "$@"
