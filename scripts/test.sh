#!/usr/bin/env bash
# Checks rustfmt and clippy, then runs every test: engine unit tests, queue tests on
# PostgreSQL, SQLite and PostgreSQL behind PgBouncer, TLS, multi-process races and faults
# (kill -9, freezes, a silent or refused network), the reduced-scale fleet test, the desktop
# end-to-end test, and the Debian package.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
export PATH="$HOME/.cargo/bin:$PATH"
# Reused across runs on the same machine; a fresh machine simply builds cold.
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/devpilot-target}"
export RUST_BACKTRACE=0

# House rules first: a formatting or lint slip fails in seconds, not after the whole suite.
cargo fmt --all --check
cargo clippy --workspace --all-targets --locked -- -D warnings
# No file over 800 lines, no function over 80, no import cycle between files (README, Layout).
python3 scripts/layout_check.py
# The contrib systemd units (systemd-analyze verify; seconds, no build).
bash tests/contrib/verify-units.sh

cargo build --workspace --bins --locked
# The real agent CLIs the agents_real tests run, pinned, installed once per machine into
# ~/.cache/devpilot-agent-clis (npm and PyPI; about a minute the first time).
bash scripts/agent_clis.sh
cargo test --workspace --locked --no-fail-fast -- --test-threads="${DEVPILOT_TEST_THREADS:-2}"

# The real tray app in a headless desktop (Xvfb, D-Bus, tray host, notifications, keychain),
# built as it ships (release), so the package test below reuses that very build. All of it:
# an E2E_ONLY left in the environment (from a run of e2e.sh by hand) must not skip scripts.
unset E2E_ONLY
E2E_PROFILE=release bash tests/desktop/e2e.sh

# The Debian package of that build: its files and Depends, and the extracted tray in a desktop.
bash tests/package/test.sh
