#!/usr/bin/env bash
# End-to-end test of the real devpilot-tray in a headless desktop session:
# Xvfb + a private D-Bus session + gnome-keyring (unlocked) + dunst + xfce4-panel (systray)
# + a throwaway PostgreSQL (for the keychain round trip), then tests/desktop/e2e.py drives
# the app through its tray menu (xdotool), its window (WebDriver via tauri-driver) and the
# `devpilot` CLI, and asserts on what it observes; a Linear source and a GitHub source are set
# up in the window against the Linear and GitHub stand-ins (tests/src/bin/linear-standin.rs,
# github-standin.rs), which this builds too.
#
# Usage:  bash tests/desktop/e2e.sh            (from the repository root)
# Env:    CARGO_TARGET_DIR   (default /root/.cache/devpilot-target)
#         E2E_ONLY           only these of the session's scripts, e.g. "first_run_test wayland_test"
#         E2E_ARTIFACTS      (default: a new temp dir; screenshots and logs land here)
#         E2E_PROFILE        debug (default) or release
# Needs the apt packages listed in docs (xvfb dbus-x11 dunst gnome-keyring libsecret-tools
# imagemagick xdotool x11-utils xfce4-panel webkit2gtk-driver postgresql python3-gi openssl weston) and installs
# tauri-driver with `cargo install --locked` when it is missing.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/desktop"

if [[ "${1:-}" != "--inner" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-/root/.cache/devpilot-target}"
  PROFILE="${E2E_PROFILE:-debug}"
  for tool in Xvfb dbus-run-session gnome-keyring-daemon dunst dunstctl dbus-monitor xfce4-panel xdotool import secret-tool WebKitWebDriver gdbus openssl weston weston-screenshooter; do
    command -v "$tool" >/dev/null || { echo "e2e: missing $tool (see docs: apt packages for the desktop tests)" >&2; exit 2; }
  done
  PGBIN="$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1)"
  [[ -x "$PGBIN/initdb" ]] || { echo "e2e: missing PostgreSQL server binaries (apt package postgresql)" >&2; exit 2; }
  echo "== building devpilot-tray and devpilot ($PROFILE)"
  flags=()
  [[ "$PROFILE" == release ]] && flags=(--release)
  (cd "$ROOT" && cargo build "${flags[@]}" -p devpilot-tray -p devpilot-cli --bins)
  # The Linear and GitHub stand-ins the Sources steps (sources_step.py, github_step.py) talk
  # to: test tools, always debug.
  echo "== building the Linear and GitHub stand-ins"
  (cd "$ROOT" && cargo build -p devpilot-tests --bin linear-standin --bin github-standin --bin model-server)
  export E2E_STANDIN_BIN="$CARGO_TARGET_DIR/debug/linear-standin"
  export E2E_GITHUB_STANDIN_BIN="$CARGO_TARGET_DIR/debug/github-standin"
  export E2E_MODEL_SERVER_BIN="$CARGO_TARGET_DIR/debug/model-server"
  # The real claude CLI of the transcript step (transcript_step.py), pinned and installed
  # once per machine; at once when it is there.
  bash "$ROOT/scripts/agent_clis.sh"
  if ! command -v tauri-driver >/dev/null; then
    echo "== installing tauri-driver"
    cargo install tauri-driver --locked
  fi
  if [[ "$PROFILE" == release ]]; then
    # The README's first command on a machine with no display (SSH, a server): it must say
    # what to do instead, with exit 1 and no panic. run.sh builds this same release build.
    echo "== ./scripts/run.sh with no display"
    rc=0
    out="$(env -u DISPLAY -u WAYLAND_DISPLAY RUST_BACKTRACE=1 "$ROOT/scripts/run.sh" 2>&1)" || rc=$?
    last="$(printf '%s\n' "$out" | tail -1)"
    if [[ $rc -ne 1 || "$last" != *"there is no graphical session here"*"devpilot run"* || "$out" == *panicked* ]]; then
      printf 'FAIL: run.sh with no display (exit %s):\n%s\n' "$rc" "$out" >&2
      exit 1
    fi
    echo "PASS: run.sh with no display exits 1 and says: $last"
  fi
  export E2E_TRAY_BIN="$CARGO_TARGET_DIR/$PROFILE/devpilot-tray"
  export E2E_CLI_BIN="$CARGO_TARGET_DIR/$PROFILE/devpilot"
  export E2E_PROFILE="$PROFILE" E2E_PGBIN="$PGBIN"
  export E2E_ARTIFACTS="${E2E_ARTIFACTS:-$(mktemp -d /tmp/devpilot-e2e-artifacts.XXXXXX)}"
  mkdir -p "$E2E_ARTIFACTS"
  echo "== artifacts: $E2E_ARTIFACTS"
  exec dbus-run-session -- bash "$0" --inner
fi

# ---- inside the private D-Bus session
WORK="$(mktemp -d /tmp/devpilot-e2e.XXXXXX)"
ART="$E2E_ARTIFACTS"
export E2E_WORK="$WORK"
# shellcheck source=session.sh
source "$HERE/session.sh"
cleanup() {
  local rc=$?
  session_stop
  if [[ -n "${PGDATA_DIR:-}" ]]; then runuser -u postgres -- "$E2E_PGBIN/pg_ctl" -D "$PGDATA_DIR" -m immediate stop >/dev/null 2>&1 || true; fi
  sleep 0.5
  cp -f "$WORK"/*.log "$ART"/ 2>/dev/null || true
  cp -rf "$XDG_DATA_HOME"/devpilot*/logs "$ART"/app-logs 2>/dev/null || true
  # What is worth keeping is in $ART now; the work dir (a cluster, worktrees) is ~40 MB a run.
  rm -rf "$WORK"
  echo "== artifacts in $ART (exit $rc)"
  exit $rc
}
trap cleanup EXIT
session_start "$WORK" || { echo "e2e: the headless session did not start"; exit 1; }

# TLS for it: a throwaway CA, a server certificate for 127.0.0.1 signed by it (so sslmode
# verify-full can pass), and a second CA that signed nothing here (so it must fail).
TLS="$WORK/tls"
mkdir -p "$TLS"
(
  cd "$TLS"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=DevPilot e2e CA" -keyout ca.key -out ca.crt
  openssl req -x509 "${ec[@]}" -days 2 -subj "/CN=Some other CA" -keyout other-ca.key -out other-ca.crt
  openssl req "${ec[@]}" -subj "/CN=127.0.0.1" -keyout server.key -out server.csr
  printf 'subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' >server.ext
  openssl x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 -extfile server.ext -out server.crt
) >"$WORK/tls.log" 2>&1 || { echo "e2e: cannot make the test certificates (see tls.log)"; exit 1; }
chown postgres "$TLS/server.key" "$TLS/server.crt" && chmod 600 "$TLS/server.key" && chmod 755 "$TLS"

# A throwaway PostgreSQL with password auth, for the keychain round trip, serving TLS.
PGDATA_DIR="$WORK/pg"
PGPORT=$(( 55000 + RANDOM % 900 ))
mkdir -p "$PGDATA_DIR" && chown postgres "$PGDATA_DIR" && chmod 755 "$WORK"
printf '%s\n' "e2e-pg-secret-$RANDOM$RANDOM" >"$WORK/.pgpw"
chmod 644 "$WORK/.pgpw"
runuser -u postgres -- "$E2E_PGBIN/initdb" -D "$PGDATA_DIR" -U postgres --auth=scram-sha-256 --pwfile="$WORK/.pgpw" >"$WORK/initdb.log" 2>&1
pgopts="-p $PGPORT -k $PGDATA_DIR -c listen_addresses=127.0.0.1 -c ssl=on -c ssl_cert_file=$TLS/server.crt -c ssl_key_file=$TLS/server.key"
runuser -u postgres -- "$E2E_PGBIN/pg_ctl" -D "$PGDATA_DIR" -o "$pgopts" -l "$PGDATA_DIR/postgres.log" -w start >/dev/null
export E2E_PGPORT="$PGPORT" E2E_PGPW_FILE="$WORK/.pgpw" E2E_CA_CERT="$TLS/ca.crt" E2E_OTHER_CA_CERT="$TLS/other-ca.crt"

SCRIPTS=" e2e sleep_test window_cycle_test theme_test job_detail_test first_run_test wayland_test "
# Run only when named: the screenshots docs/ shows (scripts/docs_shots.sh).
ON_DEMAND=" docs_shots "
for name in ${E2E_ONLY:-}; do
  [[ "$SCRIPTS$ON_DEMAND" == *" $name "* ]] || { echo "e2e: E2E_ONLY names '$name'; the scripts are:$SCRIPTS(and, when named,$ON_DEMAND)" >&2; exit 2; }
done
run() { if [[ -z "${E2E_ONLY:-}" || " $E2E_ONLY " == *" $1 "* ]]; then python3 "$HERE/$1.py"; fi; }
run e2e
# The sleep hook, against a logind test double on a private "system bus" (see sleep_test.py).
run sleep_test
# Closing the window pages its libraries out, and reopening brings it back whole.
run window_cycle_test
# The window follows the desktop's dark or light style, against a portal test double.
run theme_test
# A job's detail shows what its agent CLI reported (preset, session, cost, tokens, resumed
# from): screenshot job-detail-resumed.png, an artifact.
run job_detail_test
# The docs' screenshots, when asked for (scripts/docs_shots.sh): before the next script stops
# the panel, so they show the app with its tray.
if [[ " ${E2E_ONLY:-} " == *" docs_shots "* ]]; then python3 "$HERE/docs_shots.py"; fi
# A new user on a desktop with no tray host: the window, its notice, the first-run guide,
# closing asks; then a host arrives. It stops the session's panel, so it runs after the above.
run first_run_test
# The core checks again, the app a Wayland client of a headless Weston.
run wayland_test
