#!/usr/bin/env bash
# The `openenv` test tier (tests/openenv_tier/) in its own venv, .venv-openenv: openenv-core pins
# `mcp` (through fastmcp) against other integrations' pins, so it is an optional extra outside
# `dev` and never shares the main venv. Part of the README's test command; ~1-2 min once the
# venv exists.
#
#   bash scripts/test_openenv_tier.sh      # creates .venv-openenv on first use, then runs the tier
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-openenv
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import openenv.core' 2>/dev/null; then
    python3 -m venv "$VENV"
    # the tier's tests need the extra and pytest alone: half the install time of `dev`
    "$VENV/bin/pip" install torch==2.13.0 -e '.[openenv]' 'pytest>=8' 'pytest-timeout>=2.3'
fi
"$VENV/bin/python" -m pytest -m openenv tests/openenv_tier
