#!/usr/bin/env bash
# Checks the systemd units in contrib/systemd with `systemd-analyze verify`, as user units,
# and fails on anything it reports about them.
#
#   tests/contrib/verify-units.sh [DIR]    # DIR: the units to check (default: contrib/systemd)
#
# Offline and in a second: no systemd needs to be running (it works in a container whose PID 1
# is not systemd, and as root with no user manager), nothing is installed, nothing is built.
#
# Why the care:
# - `systemd-analyze verify` exits 0 after most warnings ("Unknown key", "Failed to parse"):
#   systemd ignores a bad line and loads the rest, so a typo'd KillMode= would go unnoticed.
#   We pass --recursive-errors=no when this systemd-analyze has it (a warning in one of our
#   units then exits non-zero), and, whatever the exit status, fail on any output line that
#   names one of our units or the directory they are checked in.
# - verify says nothing of a timer whose unit does not exist; the test checks that itself.
# - A canary: a copy with a deliberate error must fail the same check, else this test has
#   gone blind (a systemd-analyze that no longer reports it, a broken filter) and says so.
# - verify checks that each ExecStart= program exists and is executable, and the units name
#   /usr/bin/devpilot, where a package installs it. The test checks copies whose ExecStart
#   points at a stub script in a temp dir instead. A stub, not a built devpilot: verify only
#   looks at the file (it never runs it), so the stub proves as much as the real binary,
#   and the test needs no cargo build, no install and no root. Only that one path is
#   rewritten, and the test fails if the rewrite did not take, so nothing else is masked.
# - --user, as the units are installed: user-manager semantics (%h, %E; no system units).
#   A user manager needs $XDG_RUNTIME_DIR ("Failed to lookup RuntimeDirectory path"), which
#   root in a container has not, so the test gives it a temp one, and points
#   XDG_CONFIG_HOME/XDG_DATA_HOME at it too, so the units already installed in
#   ~/.config/systemd/user cannot stand in for the ones under test.
set -euo pipefail

here="$(cd "$(dirname "$0")/../.." && pwd)"
src="${1:-$here/contrib/systemd}"
units=(devpilot.service devpilot-sweep.service devpilot-sweep.timer)

if ! command -v systemd-analyze >/dev/null 2>&1; then
  echo "verify-units: systemd-analyze not found (Debian/Ubuntu: apt-get install systemd)" >&2
  exit 1
fi
for u in "${units[@]}"; do
  [ -f "$src/$u" ] || { echo "verify-units: $src/$u is missing" >&2; exit 1; }
done

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/bin" "$tmp/runtime" "$tmp/config" "$tmp/data"
chmod 700 "$tmp/runtime"
printf '#!/bin/sh\nexit 0\n' >"$tmp/bin/devpilot"
chmod +x "$tmp/bin/devpilot"

recursive=()
if grep -q -- '--recursive-errors' <<<"$(systemd-analyze --help 2>/dev/null)"; then
  recursive=(--recursive-errors=no)
fi

# Copies the units of $1 into the new directory $2 with ExecStart rewritten to the stub.
stage() {
  mkdir -p "$2"
  for u in "${units[@]}"; do
    sed "s#^ExecStart=/usr/bin/devpilot #ExecStart=$tmp/bin/devpilot #" "$1/$u" >"$2/$u"
  done
  local want rewritten
  want=$(cat "$1"/*.service | grep -c '^ExecStart=' || true)
  rewritten=$(cat "$2"/*.service | grep -c "^ExecStart=$tmp/bin/devpilot " || true)
  if [ "$want" -eq 0 ] || [ "$want" -ne "$rewritten" ]; then
    echo "verify-units: expected every ExecStart= to start with /usr/bin/devpilot; rewrote $rewritten of $want" >&2
    return 1
  fi
}

# Verifies the units in $1; prints what verify said about them; fails on any of it.
check() {
  local dir="$1" out rc=0 ours
  out=$(cd "$dir" && XDG_RUNTIME_DIR="$tmp/runtime" XDG_CONFIG_HOME="$tmp/config" XDG_DATA_HOME="$tmp/data" \
    systemd-analyze --user "${recursive[@]}" verify "${units[@]/#/$dir/}" 2>&1) || rc=$?
  ours=$(grep -F -e "$dir" -e devpilot.service -e devpilot-sweep.service -e devpilot-sweep.timer <<<"$out" || true)
  if [ "$rc" -ne 0 ] || [ -n "$ours" ]; then
    printf '%s\n' "${out:-(no output)}" | sed "s#$tmp/[a-z]*/##g"
    echo "(systemd-analyze exit status $rc)"
    return 1
  fi
  # Lines about other units (a broken unit elsewhere on this machine) are not ours to fail on.
  [ -z "$out" ] || printf 'verify-units: note, about other units:\n%s\n' "$out" >&2
}

stage "$src" "$tmp/units"
if ! check "$tmp/units"; then
  echo "verify-units: FAIL: systemd-analyze verify reported the above for $src" >&2
  exit 1
fi

# verify accepts a timer whose unit does not exist (systemd 252 says nothing, at any
# --recursive-errors), so check that this one starts a unit that is checked here.
triggers=$(sed -n 's/^Unit=//p' "$src/devpilot-sweep.timer")
triggers="${triggers:-devpilot-sweep.service}"
if [ ! -f "$src/$triggers" ]; then
  echo "verify-units: FAIL: devpilot-sweep.timer starts $triggers, which is not in $src" >&2
  exit 1
fi

stage "$src" "$tmp/canary"
sed -i 's/^KillMode=mixed$/KillMode=mixd/' "$tmp/canary/devpilot.service"
grep -q '^KillMode=mixd$' "$tmp/canary/devpilot.service" || {
  echo "verify-units: the canary needs KillMode=mixed in devpilot.service" >&2
  exit 1
}
if check "$tmp/canary" >/dev/null; then
  echo "verify-units: FAIL: a unit with KillMode=mixd passed too; this check cannot see errors here" >&2
  exit 1
fi

echo "verify-units: ok (${units[*]}; systemd $(systemd-analyze --version | awk 'NR==1{print $2}'))"
