#!/usr/bin/env bash
# The soak run (RELIABILITY.md, "Soak"): the simulator with pod churn, a real Prometheus and
# percolator with every API enabled, under steady HTTP/2 clients (front-proxy certificate and
# X-Remote-* headers, as kube-aggregator sends them) and scheduled faults (Prometheus restarts,
# a kubelet flapping, --config edits valid and invalid, a serving certificate rotation, watches
# expired with 410), sampled every 30 s; then whether anything grows.
#   scripts/soak.sh [--minutes N] [--pods N] [--out DIR]     (default: 60 minutes, 10000 pods,
#                   [--faults LIST] [--churn-interval D]       target/soak, every fault,
#                                                              one pod replaced every 2s)
# Shorter runs scale the hour's fault periods and sampling down; longer ones keep the hour's.
# --faults: comma-separated among prometheus,kubelet,config,certificate,watch, or none (the
# load and the churn alone), to tell which fault a growth follows.
# Writes DIR/report.md (the tables), DIR/samples.csv and DIR/soak.svg (the picture); exits
# non-zero when a goal is missed. Installs what it needs on a fresh machine (Prometheus from
# Debian) and builds the release binaries first.
set -euo pipefail
cd "$(dirname "$0")/.."
out="target/soak"
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --minutes|--pods|--faults|--churn-interval) args+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    --out) out="${2:?--out needs a directory}"; shift 2 ;;
    -h|--help) sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "soak.sh: unknown argument $1 (--minutes N, --pods N, --faults LIST, --churn-interval D, --out DIR)" >&2; exit 2 ;;
  esac
done
# One soak or benchmark at a time: two would share the cores and spoil both.
exec 9>"${TMPDIR:-/tmp}/percolator-bench.lock"
if ! flock -n 9; then
  echo "a benchmark or soak is running; waiting for it" >&2
  flock 9
fi
scripts/install-deps.sh
cargo build --release -p percolator-sim --bin percolator-sim
cargo build --release --bin percolator
target_dir="${CARGO_TARGET_DIR:-target}"
exec "$target_dir/release/percolator-sim" soak --percolator "$target_dir/release/percolator" --out "$out" "${args[@]}"
