#!/usr/bin/env bash
# Installs the pinned agent CLIs the real-agent tests run (tests/tests/agents_real.rs) into a
# cache directory, once per machine: claude, codex and gemini from npm (claude needs node >= 22,
# taken from the npm package `node@22`), aider from PyPI in its own virtualenv. Prints nothing
# when everything is already there. The tests find the CLIs through DEVPILOT_AGENT_CLIS.
set -euo pipefail

CLAUDE=2.1.332
CODEX=0.171.0
GEMINI=0.61.0
AIDER=0.86.2
NODE22=22

dir="${DEVPILOT_AGENT_CLIS:-$HOME/.cache/devpilot-agent-clis}"
stamp="$dir/.installed"
want="claude=$CLAUDE codex=$CODEX gemini=$GEMINI aider=$AIDER node=$NODE22"
# The stamp alone proves nothing (a cache half deleted, a venv whose python moved): each CLI
# must also still start.
runs() { for cli in claude codex gemini aider; do "$dir/bin/$cli" --version >/dev/null 2>&1 || return 1; done; }
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ] && runs; then exit 0; fi
rm -f "$stamp"

echo "agent-clis: installing $want into $dir"
# npm fetches the three node CLIs (and the node 22 claude needs). Debian's nodejs comes without
# it; a NodeSource nodejs has it already.
if ! command -v npm >/dev/null 2>&1; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null
fi
mkdir -p "$dir/npm" "$dir/bin"
# One npm prefix for the three CLIs and the newer node that claude needs.
npm install --prefix "$dir/npm" --no-audit --no-fund --loglevel=error \
  "node@$NODE22" "@anthropic-ai/claude-code@$CLAUDE" "@openai/codex@$CODEX" "@google/gemini-cli@$GEMINI"
node22="$dir/npm/node_modules/node/bin/node"
[ -x "$node22" ] || { echo "agent-clis: npm's node@$NODE22 has no bin/node" >&2; exit 1; }

# Launchers that run each CLI with node 22, whatever node the system has.
for cli in claude codex gemini; do
  bin="$dir/npm/node_modules/.bin/$cli"
  [ -e "$bin" ] || { echo "agent-clis: npm installed no $cli" >&2; exit 1; }
  target="$(readlink -f "$bin")"
  rm -f "$dir/bin/$cli"
  if head -c 4 "$target" | grep -q ELF; then
    # claude 2.x ships a native executable (its postinstall picks the platform's package).
    ln -s "$target" "$dir/bin/$cli"
  else
    printf '#!/bin/sh\nexec "%s" "%s" "$@"\n' "$node22" "$target" > "$dir/bin/$cli"
    chmod +x "$dir/bin/$cli"
  fi
done

# aider in its own virtualenv, from the system python (aider-chat supports 3.10 to 3.12).
py=/usr/bin/python3
[ -d "$dir/aider" ] || "$py" -m venv "$dir/aider"
"$dir/aider/bin/pip" install -q --disable-pip-version-check "aider-chat==$AIDER"
ln -sf "$dir/aider/bin/aider" "$dir/bin/aider"

for cli in claude codex gemini aider; do
  printf 'agent-clis: %s %s\n' "$cli" "$("$dir/bin/$cli" --version 2>&1 | head -1)"
done
echo "$want" > "$stamp"
