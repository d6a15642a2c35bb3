#!/usr/bin/env bash
# Runs every test: unit tests, handler tests and the end-to-end tests against a real
# Prometheus, the simulated cluster and real kubectl over real TLS.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
# Build every test binary once; the two runs below then only run them.
cargo test --workspace --lib --bins --tests --no-run
# The soak's four minutes (tests/soak.rs) mostly wait on a schedule of faults, and cargo runs
# test binaries one after another: it runs beside the others instead of after them, its report
# kept in a file and shown when it ends.
soak_log="$(mktemp "${TMPDIR:-/tmp}/percolator-soak-test.XXXXXX")"
cargo test --test soak -- --nocapture >"$soak_log" 2>&1 &
soak=$!
trap 'kill "$soak" 2>/dev/null || true; rm -f "$soak_log"' EXIT
# End-to-end tests mostly wait on processes; four at a time keeps two cores busy. The
# cluster benchmark (benches/) is not a test: `cargo bench --bench cluster` runs it.
status=0
cargo test --workspace --lib --bins --tests -- --test-threads "${TEST_THREADS:-4}" \
  --skip four_minutes_of_churn_load_and_faults_leave_nothing_growing || status=$?
soak_status=0
wait "$soak" || soak_status=$?
echo "--- tests/soak.rs (run beside the others) ---"
cat "$soak_log"
if [ "$soak_status" -ne 0 ]; then
  echo "tests/soak.rs failed (exit $soak_status)" >&2
  status=1
fi
exit "$status"
