# Sourced (not run) by tests/desktop/e2e.sh and scripts/tray-footprint.sh, from inside a
# private D-Bus session (dbus-run-session). Starts the headless desktop the tray app needs:
# Xvfb, gnome-keyring (Secret Service, unlocked), dunst (notifications), a dbus-monitor of
# org.freedesktop.Notifications, and xfce4-panel with a systray plugin (the StatusNotifierItem
# host). Every process started is appended to PIDS; session_stop ends them by pid, newest first.
# The panel's pid is exported as SESSION_PANEL_PID, for a test that ends the tray host itself.
#
#   session_start WORK_DIR     sets XDG_* under WORK_DIR, DISPLAY, GNOME_KEYRING_CONTROL
#   session_stop

SESSION_HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PIDS=()

session_start() {
  local work="$1"
  export XDG_RUNTIME_DIR="$work/run" XDG_CONFIG_HOME="$work/config" XDG_DATA_HOME="$work/data" XDG_CACHE_HOME="$work/cache"
  mkdir -p "$XDG_RUNTIME_DIR" "$XDG_CONFIG_HOME/xfce4/xfconf/xfce-perchannel-xml" "$XDG_DATA_HOME"
  chmod 700 "$XDG_RUNTIME_DIR"
  cp "$SESSION_HERE/xfce4-panel.xml" "$XDG_CONFIG_HOME/xfce4/xfconf/xfce-perchannel-xml/"

  export DISPLAY=:$(( 90 + RANDOM % 9 ))
  # Services the bus starts on demand (xfconfd, which serves xfce4-panel its settings) get the
  # bus's environment, not ours: without this, xfconfd ignored the seeded panel above, showed
  # xfce's default panels (whose blue menu logo passes for the "working" icon) and wrote them
  # to the real ~/.config.
  dbus-update-activation-environment XDG_CONFIG_HOME XDG_DATA_HOME XDG_CACHE_HOME XDG_RUNTIME_DIR DISPLAY
  Xvfb "$DISPLAY" -screen 0 1280x800x24 -nolisten tcp >"$work/xvfb.log" 2>&1 & PIDS+=($!)
  for _ in $(seq 50); do xdpyinfo >/dev/null 2>&1 && break; sleep 0.1; done
  xdpyinfo >/dev/null 2>&1 || { echo "session: Xvfb did not start on $DISPLAY" >&2; return 1; }

  eval "$(printf 'e2e-keyring-password' | gnome-keyring-daemon --unlock --components=secrets --daemonize)"
  export GNOME_KEYRING_CONTROL
  [[ -n "${GNOME_KEYRING_PID:-}" ]] && PIDS+=("$GNOME_KEYRING_PID")
  dunst >"$work/dunst.log" 2>&1 & PIDS+=($!)
  dbus-monitor "interface='org.freedesktop.Notifications'" >"$work/notify-monitor.log" 2>&1 & PIDS+=($!)
  xfce4-panel >"$work/panel.log" 2>&1 & PIDS+=($!)
  export SESSION_PANEL_PID=$!
}

session_stop() {
  local i
  for ((i=${#PIDS[@]}-1; i>=0; i--)); do kill "${PIDS[$i]}" 2>/dev/null || true; done
}
