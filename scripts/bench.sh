#!/usr/bin/env bash
# The DevPilot dispatch benchmark: one command, one throwaway PostgreSQL, every measurement
# (a-h of issue 4) side by side. Builds in release mode, then writes bench/REPORT.md,
# bench/report.json and bench/throughput.png. Takes about 10 minutes on 2 cores.
#
#   scripts/bench.sh            # the full run
#   scripts/bench.sh --quick    # a short run that only checks the machinery
#
# Needs the PostgreSQL server binaries (initdb, pg_ctl, pgbench) under /usr/lib/postgresql
# (or DEVPILOT_PG_BIN); run as root it starts the cluster as the `postgres` user.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/devpilot-target}"
cargo build --release -p devpilot-bench
exec "$CARGO_TARGET_DIR/release/devpilot-bench" run --out bench "$@"
