#!/usr/bin/env bash
# The DevPilot dispatch benchmark: one command, one throwaway PostgreSQL, every measurement
# (a-h of issue 4, the peers and the fleet of issue 11, issue 25's alternated rounds, what a
# user feels: (w) and the hand-off under load (x)) side by side. Builds in release mode,
# then writes bench/REPORT.md, bench/report.json and the charts. Takes about 50 minutes on
# 2 cores.
#
#   scripts/bench.sh            # the full run
#   scripts/bench.sh --quick    # a short run that only checks the machinery
#
# Needs the PostgreSQL server binaries (initdb, pg_ctl, pgbench) under /usr/lib/postgresql
# (or DEVPILOT_PG_BIN), PgBouncer, git (its `git daemon` serves (x)'s remote), the agent
# CLIs (scripts/agent_clis.sh), and npm for the peers (Graphile Worker and pg-boss, and the
# node 22 they need, all pinned in bench/peers/package-lock.json); it installs what is missing. Run as root, it
# starts the cluster as the `postgres` user.
set -euo pipefail
cd "$(dirname "$0")/.."
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/devpilot-target}"

sudo_if_needed() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
missing=()
command -v node >/dev/null || missing+=(nodejs)
command -v npm >/dev/null || missing+=(npm)
command -v pgbouncer >/dev/null || [ -x /usr/sbin/pgbouncer ] || missing+=(pgbouncer)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench: installing ${missing[*]}" >&2
  sudo_if_needed apt-get update -qq
  sudo_if_needed env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"
fi
# The peers, exactly as locked; reinstalled when the lockfile changes.
if [ ! -f bench/peers/node_modules/.package-lock.json ] ||
   ! cmp -s bench/peers/package-lock.json bench/peers/node_modules/.lock-copy; then
  (cd bench/peers && npm ci --no-audit --no-fund --loglevel=error && cp package-lock.json node_modules/.lock-copy)
fi

# (x), the hand-off under load, runs the real claude CLI (pinned, with the tests' other CLIs).
bash scripts/agent_clis.sh

cargo build --release -p devpilot-bench -p devpilot-cli --bins
exec "$CARGO_TARGET_DIR/release/devpilot-bench" run --out bench "$@"
