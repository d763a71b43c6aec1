#!/usr/bin/env bash
# The `miniswe` test tier (tests/miniswe_tier/): mini-swe-agent, the pinned release, unmodified,
# in a venv of its own, .venv-miniswe (its litellm and openai pins are its own business: saorl
# runs it as an agent command). The tests run in the main venv (.venv, made first by the README's
# test command) and start mini-swe-agent from .venv-miniswe. ~6-8 min on 2 shared cores once
# the venv exists (building it installs ~750 MB of packages once).
#
#   bash scripts/test_miniswe_tier.sh     # creates .venv-miniswe on first use, then runs the tier
set -euo pipefail
cd "$(dirname "$0")/.."
MINISWE_VERSION=2.4.6
VENV=.venv-miniswe
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; \
sys.exit(m.version('mini-swe-agent') != '$MINISWE_VERSION')" 2>/dev/null; then
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install "mini-swe-agent==$MINISWE_VERSION"
fi
SAORL_MINISWE_PYTHON="$PWD/$VENV/bin/python" .venv/bin/python -m pytest -m miniswe tests/miniswe_tier
