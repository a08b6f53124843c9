#!/usr/bin/env bash
# The Debian package, checked the way a user gets it. Builds it with scripts/package.sh (which
# reuses the release build in $CARGO_TARGET_DIR, e.g. the one `E2E_PROFILE=release
# tests/desktop/e2e.sh` made), extracts it into a temporary root with `dpkg-deb -x`, and checks:
#   - every file it should hold is there (and nothing else), the icons have the sizes their
#     folders say, and Depends names the runtime libraries, the dlopen'ed appindicator included,
#     and bubblewrap (the agents' sandbox);
#   - the extracted `devpilot --version` runs and matches the package's version;
#   - the desktop entry passes desktop-file-validate and names a binary and an icon it ships;
#   - the man page and the completions are real (bash's completes `devpilot en` to enqueue);
#   - in a headless desktop (tests/desktop/session.sh), the extracted devpilot-tray's icon
#     registers with the StatusNotifierWatcher;
#   - autostart: with `autostart = true` in its config the tray writes the XDG autostart entry,
#     pointing at the extracted binary; with `autostart = false` the entry goes away.
# Every check prints PASS or FAIL; the first FAIL ends the run with what was expected and seen.
# Every wait polls for its signal under a deadline.
#
# Usage:  bash tests/package/test.sh       (from anywhere)
# Env:    CARGO_TARGET_DIR (default ~/.cache/devpilot-target)
#         PKG_KEEP=1 keeps the work dir (logs, extracted root) even when every check passes
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"

if [[ "${1:-}" != "--inner" ]]; then
  export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/devpilot-target}"
  for tool in dpkg-deb desktop-file-validate identify gzip Xvfb xdpyinfo dbus-run-session gnome-keyring-daemon \
    dunst dbus-monitor xfce4-panel gdbus; do
    command -v "$tool" >/dev/null || {
      echo "package test: missing $tool (apt packages: dpkg-dev desktop-file-utils imagemagick and the desktop ones of scripts/setup.sh)" >&2
      exit 2
    }
  done
  echo "== building the package (scripts/package.sh)"
  PKG_DEB="$("$ROOT/scripts/package.sh")"
  export PKG_DEB
  echo "== package: $PKG_DEB"
  exec dbus-run-session -- bash "$0" --inner
fi

# ---- inside a private D-Bus session
WORK="$(mktemp -d /tmp/devpilot-pkg-test.XXXXXX)"
X="$WORK/root"
TRAY_PID=""
TRAY_LOG=""
CHECKS=0
# shellcheck source=../desktop/session.sh
source "$ROOT/tests/desktop/session.sh"

pass() {
  CHECKS=$((CHECKS + 1))
  echo "PASS: $*"
}
# fail WHAT EXPECTED SEEN
fail() {
  echo "FAIL: $1"
  echo "  expected: $2"
  echo "  seen:     $3"
  if [[ -n "$TRAY_LOG" && -f "$TRAY_LOG" ]]; then
    echo "  the tray's log ($TRAY_LOG), last lines:"
    tail -n 15 "$TRAY_LOG" | sed 's/^/    /'
  fi
  exit 1
}

# Alive and not a zombie (a child that exited stays in the table until it is waited for).
alive() {
  local state
  state=$(sed -E 's/^[0-9]+ \(.*\) ([A-Za-z]).*/\1/' "/proc/$1/stat" 2>/dev/null) || return 1
  [[ -n "$state" && "$state" != Z ]]
}

# wait_for SECONDS COMMAND...: polls COMMAND until it succeeds; fails early if the tray died.
wait_for() {
  local end=$((SECONDS + $1))
  shift
  until "$@"; do
    ((SECONDS < end)) || return 1
    if [[ -n "$TRAY_PID" ]] && ! alive "$TRAY_PID"; then return 2; fi
    sleep 0.2
  done
}

cleanup() {
  local rc=$?
  if [[ -n "$TRAY_PID" ]] && alive "$TRAY_PID"; then kill -KILL "$TRAY_PID" 2>/dev/null || true; fi
  for pid in ${TRAY_CHILDREN:-}; do
    if alive "$pid"; then kill -KILL "$pid" 2>/dev/null || true; fi
  done
  session_stop
  if ((rc == 0)) && [[ -z "${PKG_KEEP:-}" ]]; then
    rm -rf "$WORK"
  else
    echo "== work dir kept: $WORK"
  fi
  exit "$rc"
}
trap cleanup EXIT

# ------------------------------------------------------------------ what the package holds
DEB="$PKG_DEB"
dpkg-deb -x "$DEB" "$X" || fail "dpkg-deb -x $DEB" "the package extracts" "exit $?"
pass "extracted $(basename "$DEB") into $X"

EXPECTED=(
  usr/bin/devpilot-tray
  usr/bin/devpilot
  usr/share/applications/dev.devpilot.tray.desktop
  usr/share/icons/hicolor/32x32/apps/devpilot.png
  usr/share/icons/hicolor/48x48/apps/devpilot.png
  usr/share/icons/hicolor/64x64/apps/devpilot.png
  usr/share/icons/hicolor/128x128/apps/devpilot.png
  usr/share/bash-completion/completions/devpilot
  usr/share/zsh/vendor-completions/_devpilot
  usr/share/fish/vendor_completions.d/devpilot.fish
  usr/share/man/man1/devpilot.1.gz
)
for u in devpilot.service devpilot-sweep.service devpilot-sweep.timer; do EXPECTED+=("usr/lib/systemd/user/$u"); done
for f in "${EXPECTED[@]}"; do
  [[ -f "$X/$f" && -s "$X/$f" ]] || fail "the package holds /$f" "a non-empty file" "$(ls -ld "$X/$f" 2>&1)"
done
pass "the package holds all ${#EXPECTED[@]} expected files, none empty"
for b in devpilot devpilot-tray; do
  [[ -x "$X/usr/bin/$b" ]] || fail "/usr/bin/$b is executable" "mode 755" "$(stat -c %A "$X/usr/bin/$b")"
done
pass "both binaries are executable"
# Nothing else, apart from cargo-deb's copyright file (and a changelog, should one be added).
# A here-string, not a pipe: under pipefail, `grep -q` leaving at the first match can break
# the pipe of a writer still writing, and a file that is expected reads as unexpected.
expected=$(printf '%s\n' "${EXPECTED[@]}")
extra=$(cd "$X" && find . -type f | sed 's|^\./||' | sort | while read -r f; do
  grep -qxF -- "$f" <<<"$expected" || [[ "$f" == usr/share/doc/devpilot/* ]] || echo "$f"
done)
[[ -z "$extra" ]] || fail "the package holds nothing unexpected" "only the files above and usr/share/doc/devpilot/*" "$extra"
pass "the package holds nothing unexpected"
# Each unit starts a program the package ships (the units' own checks are contrib's).
for unit in "$X"/usr/lib/systemd/user/*.service; do
  prog=$(sed -nE 's/^ExecStart=[-@:+!]*([^ ]+).*/\1/p' "$unit" | head -n 1)
  [[ -n "$prog" && -x "$X$prog" ]] || fail "$(basename "$unit")'s ExecStart is in the package" "an executable $prog" "$(ls -l "$X$prog" 2>&1)"
done
pass "the systemd user units start programs the package ships"

for size in 32x32 48x48 64x64 128x128; do
  seen=$(identify -format '%wx%h' "$X/usr/share/icons/hicolor/$size/apps/devpilot.png")
  [[ "$seen" == "$size" ]] || fail "the $size icon's size" "$size" "$seen"
done
pass "each hicolor icon has its folder's size"

PACKAGE=$(dpkg-deb -f "$DEB" Package)
VERSION=$(dpkg-deb -f "$DEB" Version)
ARCH=$(dpkg-deb -f "$DEB" Architecture)
DEPENDS=$(dpkg-deb -f "$DEB" Depends)
[[ "$PACKAGE" == devpilot && "$ARCH" == amd64 ]] || fail "Package and Architecture" "devpilot amd64" "$PACKAGE $ARCH"
[[ "$(basename "$DEB")" == "devpilot_${VERSION}_amd64.deb" ]] ||
  fail "the file name" "devpilot_${VERSION}_amd64.deb" "$(basename "$DEB")"
pass "package $PACKAGE $VERSION $ARCH, named $(basename "$DEB")"
# The appindicator is dlopen'ed (named by hand); the others prove dpkg-shlibdeps ran ($auto).
for dep in libayatana-appindicator3-1 libwebkit2gtk-4.1-0 libgtk-3-0 libc6 bubblewrap; do
  grep -qE "(^|, )$dep( |,|$)" <<<"$DEPENDS" || fail "Depends names $dep" "$dep in Depends" "$DEPENDS"
done
pass "Depends: $DEPENDS"

# ------------------------------------------------------------------ the files work
seen=$("$X/usr/bin/devpilot" --version 2>&1) || fail "devpilot --version" "exit 0" "exit $?: $seen"
[[ "$seen" == "devpilot ${VERSION%%-*}" ]] || fail "devpilot --version" "devpilot ${VERSION%%-*}" "$seen"
pass "the extracted devpilot --version says: $seen"

DESKTOP="$X/usr/share/applications/dev.devpilot.tray.desktop"
seen=$(desktop-file-validate "$DESKTOP" 2>&1) && [[ -z "$seen" ]] ||
  fail "desktop-file-validate $DESKTOP" "no error, warning or hint" "$seen"
pass "desktop-file-validate accepts the desktop entry"
exec_prog=$(sed -n 's/^Exec=\([^ ]*\).*/\1/p' "$DESKTOP")
icon=$(sed -n 's/^Icon=//p' "$DESKTOP")
[[ -x "$X/usr/bin/$exec_prog" ]] || fail "the entry's Exec program is in the package" "/usr/bin/$exec_prog" "Exec=$exec_prog"
[[ -f "$X/usr/share/icons/hicolor/128x128/apps/$icon.png" ]] ||
  fail "the entry's Icon is in the package" "hicolor/*/apps/$icon.png" "Icon=$icon"
pass "the entry starts /usr/bin/$exec_prog with the packaged icon '$icon'"

MAN="$X/usr/share/man/man1/devpilot.1.gz"
gzip -t "$MAN" || fail "the man page is gzip" "gzip -t passes" "it does not"
page=$(gzip -dc "$MAN")
[[ "$page" == *".TH devpilot 1"* && "$page" == *'.SS "devpilot enqueue"'* && "$page" == *'.SS "devpilot config show"'* ]] ||
  fail "the man page" "a devpilot(1) page with a section per command" "$(head -c 300 <<<"$page")"
if command -v man >/dev/null; then
  warnings=$(MANWIDTH=100 man --warnings -l "$MAN" 2>&1 >/dev/null)
  rendered=$(MANWIDTH=100 man -l "$MAN" 2>/dev/null)
  [[ -z "$warnings" && "$rendered" == *"devpilot enqueue"* && "$rendered" == *"--payload-file"* ]] ||
    fail "man -l renders the page" "no roff warning; 'devpilot enqueue' and --payload-file in the text" "${warnings:-(no warning)}"
  pass "the man page renders without a warning and documents each command's flags"
else
  pass "the man page is a gzip'ed devpilot(1) page with a section per command (man is not installed: not rendered)"
fi

BASH_C="$X/usr/share/bash-completion/completions/devpilot"
grep -qw enqueue "$BASH_C" || fail "the bash completion mentions enqueue" "the word enqueue" "$(head -c 300 "$BASH_C")"
bash -n "$BASH_C" || fail "the bash completion parses" "bash -n passes" "it does not"
# What bash-completion would run for `devpilot en<TAB>`.
offered=$(bash -c 'source "$1"; COMP_WORDS=(devpilot en); COMP_CWORD=1; COMP_LINE="devpilot en"; COMP_POINT=${#COMP_LINE}
  _devpilot devpilot en devpilot; printf "%s\n" "${COMPREPLY[@]}"' _ "$BASH_C" 2>&1)
[[ "$offered" == enqueue ]] || fail "completing 'devpilot en' in bash" "enqueue" "$offered"
pass "the bash completion parses and completes 'devpilot en' to enqueue"
ZSH_C="$X/usr/share/zsh/vendor-completions/_devpilot"
FISH_C="$X/usr/share/fish/vendor_completions.d/devpilot.fish"
[[ "$(head -n 1 "$ZSH_C")" == "#compdef devpilot" ]] || fail "the zsh completion" "#compdef devpilot first" "$(head -n 1 "$ZSH_C")"
grep -q "complete -c devpilot" "$FISH_C" && grep -q enqueue "$FISH_C" ||
  fail "the fish completion" "complete -c devpilot ... enqueue" "$(head -c 300 "$FISH_C")"
for sh in zsh fish; do
  f=$([[ $sh == zsh ]] && echo "$ZSH_C" || echo "$FISH_C")
  if command -v "$sh" >/dev/null; then "$sh" -n "$f" || fail "the $sh completion parses" "$sh -n passes" "it does not"; fi
done
pass "the zsh and fish completions are devpilot's (syntax checked where the shell is installed)"

# ------------------------------------------------------------------ the tray, in a desktop
session_start "$WORK/session" || fail "the headless desktop" "Xvfb, keyring, dunst, xfce4-panel up" "session_start failed"
# The app's own, fresh profile. HOME too: the autostart plugin (auto-launch 0.6) writes to
# $HOME/.config/autostart and ignores XDG_CONFIG_HOME, so the two must name the same place.
APP_HOME="$WORK/home"
mkdir -p "$APP_HOME"
APP_ENV=(HOME="$APP_HOME" XDG_CONFIG_HOME="$APP_HOME/.config" XDG_DATA_HOME="$APP_HOME/.local/share"
  XDG_CACHE_HOME="$APP_HOME/.cache" DEVPILOT_LOG="info,devpilot=debug,devpilot_tray=debug"
  DEVPILOT_NO_SLEEP_HOOK=1 NO_AT_BRIDGE=1)
TRAY_BIN="$X/usr/bin/devpilot-tray"
CONFIG="$APP_HOME/.config/devpilot/config.toml"
AUTOSTART_DIR="$APP_HOME/.config/autostart"
RUNS=0

# The pids of the processes whose items the StatusNotifierWatcher lists.
sni_pids() {
  local items name
  items=$(gdbus call --session --dest org.kde.StatusNotifierWatcher --object-path /StatusNotifierWatcher \
    --method org.freedesktop.DBus.Properties.Get org.kde.StatusNotifierWatcher RegisteredStatusNotifierItems 2>/dev/null) ||
    return 0
  for name in $(grep -oE "'[^']+'" <<<"$items" | tr -d "'" | cut -d/ -f1); do
    gdbus call --session --dest org.freedesktop.DBus --object-path /org/freedesktop/DBus \
      --method org.freedesktop.DBus.GetConnectionUnixProcessID "$name" 2>/dev/null | sed -nE 's/.*uint32 ([0-9]+).*/\1/p'
  done
}
tray_registered() { grep -qx -- "$TRAY_PID" <<<"$(sni_pids)"; }

start_tray() {
  RUNS=$((RUNS + 1))
  TRAY_LOG="$WORK/tray-$RUNS.log"
  env -u DEVPILOT_DATABASE_URL -u DEVPILOT_ORCHESTRATOR -u DEVPILOT_AGENT "${APP_ENV[@]}" "$TRAY_BIN" >"$TRAY_LOG" 2>&1 &
  TRAY_PID=$!
  local rc=0
  wait_for 45 tray_registered || rc=$?
  case $rc in
    0) pass "run $RUNS: the extracted tray's icon registered with the StatusNotifierWatcher (pid $TRAY_PID)" ;;
    2)
      local code=0
      wait "$TRAY_PID" || code=$?
      fail "run $RUNS: the tray starts" "a running devpilot-tray" "it exited with status $code"
      ;;
    *) fail "run $RUNS: the tray's icon registers" "pid $TRAY_PID among the items' owners" "owners: $(sni_pids | tr '\n' ' ')" ;;
  esac
}

stop_tray() {
  TRAY_CHILDREN=$(ps -o pid= --ppid "$TRAY_PID" | tr '\n' ' ' || true)
  kill -TERM "$TRAY_PID" 2>/dev/null || true
  local end=$((SECONDS + 20))
  while alive "$TRAY_PID" && ((SECONDS < end)); do sleep 0.2; done
  if alive "$TRAY_PID"; then fail "run $RUNS: the tray exits on SIGTERM" "gone within 20 s" "still running"; fi
  wait "$TRAY_PID" 2>/dev/null || true
  # WebKit's helpers can outlive the app by a moment; they are ours, ended by pid.
  for pid in $TRAY_CHILDREN; do
    if alive "$pid"; then kill -TERM "$pid" 2>/dev/null || true; fi
  done
  TRAY_PID=""
}

# The first start: no config yet (the app opens its window, as on a user's first run).
start_tray
stop_tray

write_autostart() {
  mkdir -p "$(dirname "$CONFIG")"
  printf '# written by tests/package/test.sh\nautostart = %s\n' "$1" >"$CONFIG"
}
entries() { find "$AUTOSTART_DIR" -maxdepth 1 -name '*.desktop' 2>/dev/null | sort; }
has_entry() { [[ -n "$(entries)" ]]; }
no_entry() { [[ -z "$(entries)" ]]; }

# Autostart on: the entry appears, and starts the binary that wrote it.
no_entry || fail "no autostart entry before autostart is on" "no $AUTOSTART_DIR/*.desktop" "$(entries)"
write_autostart true
start_tray
rc=0
wait_for 20 has_entry || rc=$?
((rc == 0)) || fail "autostart = true writes the autostart entry" "a .desktop file in $AUTOSTART_DIR" "none after 20 s (rc $rc)"
mapfile -t found < <(entries)
((${#found[@]} == 1)) || fail "one autostart entry" "exactly one .desktop file" "${found[*]}"
entry_exec=$(sed -n 's/^Exec=//p' "${found[0]}")
entry_prog=$(awk '{print $1}' <<<"$entry_exec")
want=$(realpath "$TRAY_BIN")
[[ "$entry_prog" == "$want" ]] || fail "the autostart entry's Exec" "$want" "$entry_exec"
pass "autostart = true: $(basename "${found[0]}") appeared under \$XDG_CONFIG_HOME/autostart with Exec=$entry_exec"
stop_tray

# Autostart off: the next start removes it.
write_autostart false
start_tray
rc=0
wait_for 20 no_entry || rc=$?
((rc == 0)) || fail "autostart = false removes the autostart entry" "no .desktop file in $AUTOSTART_DIR" "$(entries) (rc $rc)"
pass "autostart = false: the entry is gone"
stop_tray

echo "== package test: all $CHECKS checks passed ($(basename "$DEB"))"
