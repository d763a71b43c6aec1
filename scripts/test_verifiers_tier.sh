#!/usr/bin/env bash
# The `verifiers` test tier (tests/verifiers_tier/) in its own venv, .venv-verifiers: verifiers
# 0.4 pins `openai<3` (the Agents SDK in `dev` needs >=3) and `mcp`, so it is an optional extra
# outside `dev` and never shares the main venv. Part of the README's test command. The first run
# also builds verifiers' harness runtime with uv (packages from the package index, cached under
# ~/.cache/verifiers and uv's cache); later runs are offline.
#
#   bash scripts/test_verifiers_tier.sh    # creates .venv-verifiers on first use, then runs the tier
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-verifiers
if [ ! -x "$VENV/bin/uv" ] || ! "$VENV/bin/python" -c 'import verifiers.v1, reasoning_gym' 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install torch==2.13.0 -e '.[verifiers,reasoning-gym]' 'pytest>=8' 'pytest-timeout>=2.3'
fi
"$VENV/bin/python" -m pytest -m verifiers tests/verifiers_tier
