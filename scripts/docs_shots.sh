#!/usr/bin/env bash
# The screenshots docs/ and the README show, taken anew with realistic data
# (tests/desktop/docs_shots.py: a laptop and a desktop, a GitHub repository, the real claude
# CLI against a scripted model), then copied into docs/. Look at each before committing it.
#
# Usage: scripts/docs_shots.sh
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
export E2E_ARTIFACTS="${E2E_ARTIFACTS:-$(mktemp -d /tmp/devpilot-docs-shots.XXXXXX)}"
E2E_ONLY=docs_shots E2E_PROFILE=release bash "$ROOT/tests/desktop/e2e.sh"
shopt -s nullglob
shots=("$E2E_ARTIFACTS"/docs-*.png)
(( ${#shots[@]} )) || { echo "docs_shots: no screenshots were taken (see $E2E_ARTIFACTS)" >&2; exit 1; }
for f in "${shots[@]}"; do
  name="$(basename "$f")"
  cp -f "$f" "$ROOT/docs/${name#docs-}"
  echo "docs/${name#docs-}"
done
