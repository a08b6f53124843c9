#!/usr/bin/env bash
# Installs everything DevPilot needs on a fresh Debian/Ubuntu machine: build packages for the
# tray app, the PostgreSQL server the tests start themselves, and the headless desktop the
# end-to-end tests drive. Idempotent: installs only what is missing.
set -euo pipefail

PACKAGES=(
  # building the engine and the tray app
  build-essential pkg-config curl wget file libssl-dev
  libwebkit2gtk-4.1-dev libxdo-dev libayatana-appindicator3-dev librsvg2-dev
  libayatana-appindicator3-1
  # a git worktree per job: the engine runs git, and its tests build real repositories
  git
  # the database the tests start (initdb/pg_ctl)
  postgresql
  # the pooler and TLS tests: a real PgBouncer, certificates made with openssl
  pgbouncer openssl
  # the package test: desktop-file-validate, and systemd-analyze for the contrib units
  desktop-file-utils systemd
  # the headless desktop session for end-to-end tests
  xvfb xauth dbus-x11 dunst gnome-keyring libsecret-tools imagemagick xdotool x11-utils
  xfce4-panel webkit2gtk-driver at-spi2-core
  # the desktop tests' Wayland run: a headless compositor (and its screenshooter)
  weston
  # the logind test double of the sleep-hook e2e (tests/desktop/fake_logind.py) and the tray
  # menu reader of the e2e (tests/desktop/dbusmenu.py), both run with /usr/bin/python3
  python3-gi gir1.2-glib-2.0
  # the e2e's throwaway certificate authority for PostgreSQL over TLS (sslrootcert)
  openssl
  # the real agent CLIs of the tests (scripts/agent_clis.sh): aider in its own virtualenv
  python3-venv
  # the agents' sandbox (docs/sandbox.md)
  bubblewrap
)

missing=()
for p in "${PACKAGES[@]}"; do
  grep -q "install ok installed" <<<"$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null)" || missing+=("$p")
done

if ((${#missing[@]})); then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if ! command -v cargo >/dev/null 2>&1; then
  for c in "$HOME/.cargo/bin/cargo"; do [ -x "$c" ] && export PATH="$(dirname "$c"):$PATH"; done
fi
if ! command -v cargo >/dev/null 2>&1; then
  echo "setup: no Rust toolchain found. Install one with rustup (https://rustup.rs), then run this again." >&2
  exit 1
fi
# The house rules need rustfmt and clippy (rustup's default profile has both).
for tool in rustfmt clippy; do
  sub=$([ "$tool" = rustfmt ] && echo fmt || echo clippy)
  if ! cargo "$sub" --version >/dev/null 2>&1; then
    if command -v rustup >/dev/null 2>&1; then
      echo "setup: adding the Rust component $tool"
      rustup component add "$tool" || { echo "setup: cannot add $tool; install it with rustup, then run this again." >&2; exit 1; }
    else
      echo "setup: cargo $tool is missing; install it (rustup component add $tool), then run this again." >&2
      exit 1
    fi
  fi
done
echo "setup: ok ($(cargo --version))"
