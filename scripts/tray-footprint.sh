#!/usr/bin/env bash
# Idle footprint of the tray app (issue 4, section 5), one command:
#   bash scripts/tray-footprint.sh
# Builds `cargo build --release -p devpilot-tray`, starts the same headless desktop session
# as the desktop e2e (tests/desktop/session.sh: Xvfb, D-Bus session, gnome-keyring, dunst,
# xfce4-panel tray host), runs the release tray on a temp SQLite profile, and measures PSS,
# RSS, CPU and wakeups from /proc for 60 s with the window closed, then 60 s with it open.
# Results: bench/TRAY_FOOTPRINT.md and bench/TRAY_FOOTPRINT.json.
# Env: CARGO_TARGET_DIR (default /root/.cache/devpilot-target), FOOTPRINT_RUNS (default 3),
#      FOOTPRINT_SECS (default 60), FOOTPRINT_OPEN_SECS (the open window's, default the same),
#      FOOTPRINT_SETTLE (default 10), FOOTPRINT_OUT (path stem),
#      FOOTPRINT_NO_BUILD=1 to measure the binary already built, FOOTPRINT_SOURCES=1 for a GitHub
#      and a Linear source on the harness's stand-ins, FOOTPRINT_BASELINE (a former .json) to
#      compare with (FOOTPRINT_BASELINE_AS: the name the report gives it), FOOTPRINT_TRACE_SECS=N
#      for an `strace -f` of the closed tray after its
#      measurement (WORK/strace-runK.txt). Issue 43's run:
#        FOOTPRINT_SOURCES=1 FOOTPRINT_RUNS=1 FOOTPRINT_SECS=600 FOOTPRINT_SETTLE=140 \
#        FOOTPRINT_OUT=bench/TRAY_FOOTPRINT_SOURCES FOOTPRINT_BASELINE=bench/TRAY_FOOTPRINT_SETTLED.json \
#        bash scripts/tray-footprint.sh
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"

if [[ "${1:-}" != "--inner" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/devpilot-target}"
  for tool in Xvfb dbus-run-session gnome-keyring-daemon dunst dbus-monitor xfce4-panel xdotool gdbus import; do
    command -v "$tool" >/dev/null || { echo "footprint: missing $tool (run scripts/setup.sh)" >&2; exit 2; }
  done
  if [[ -z "${FOOTPRINT_NO_BUILD:-}" ]]; then
    echo "== cargo build --release -p devpilot-tray"
    (cd "$ROOT" && cargo build --release -p devpilot-tray)
  fi
  if [[ "${FOOTPRINT_SOURCES:-}" == 1 ]]; then
    echo "== cargo build -p devpilot-tests --bin github-standin --bin linear-standin"
    (cd "$ROOT" && cargo build -p devpilot-tests --bin github-standin --bin linear-standin)
  fi
  export FOOTPRINT_TRAY_BIN="${FOOTPRINT_TRAY_BIN:-$CARGO_TARGET_DIR/release/devpilot-tray}"
  [[ -x "$FOOTPRINT_TRAY_BIN" ]] || { echo "footprint: no $FOOTPRINT_TRAY_BIN" >&2; exit 2; }
  export FOOTPRINT_OUT="${FOOTPRINT_OUT:-$ROOT/bench/TRAY_FOOTPRINT}"
  exec dbus-run-session -- bash "$0" --inner
fi

# ---- inside the private D-Bus session
WORK="$(mktemp -d /tmp/devpilot-footprint.XXXXXX)"
export FOOTPRINT_WORK="$WORK"
# shellcheck source=../tests/desktop/session.sh
source "$ROOT/tests/desktop/session.sh"
cleanup() {
  local rc=$?
  session_stop
  echo "== logs and screenshots in $WORK (exit $rc)"
  exit $rc
}
trap cleanup EXIT
session_start "$WORK" || { echo "footprint: the headless session did not start" >&2; exit 1; }
for _ in $(seq 50); do
  gdbus introspect --session --dest org.kde.StatusNotifierWatcher --object-path /StatusNotifierWatcher >/dev/null 2>&1 && break
  sleep 0.2
done
python3 "$ROOT/scripts/tray_footprint.py"
