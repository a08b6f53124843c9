#!/usr/bin/env bash
# Builds and starts DevPilot on the embedded SQLite default: no server needed.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/devpilot-target}"
if [ -d src-tauri ]; then
  cargo build --release --locked -p devpilot-tray
  exec "$CARGO_TARGET_DIR/release/devpilot-tray" "$@"
fi
cargo build --release --locked -p devpilot-orchestrator
exec "$CARGO_TARGET_DIR/release/devpilot" "$@"
