#!/usr/bin/env bash
# Builds and starts DevPilot on the embedded SQLite default: no server needed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/devpilot-target}"
if [ -d src-tauri ]; then
  # The CLI too: it is what the tray points at when there is no display (`devpilot run`),
  # and the same package set as the tests' release build, so neither rebuilds the other's.
  cargo build --release --locked -p devpilot-tray -p devpilot-cli --bins
  exec "$CARGO_TARGET_DIR/release/devpilot-tray" "$@"
fi
cargo build --release --locked -p devpilot-cli
exec "$CARGO_TARGET_DIR/release/devpilot" "$@"
