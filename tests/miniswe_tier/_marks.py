"""The marks of every miniswe-tier test module (`pytestmark = MINISWE_TIER`) and what they use:
mini-swe-agent's venv, named by scripts/test_miniswe_tier.sh, and the runner saorl ships."""

import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = os.environ.get("SAORL_MINISWE_PYTHON", "")  # .venv-miniswe/bin/python
RUNNER = ROOT / "src" / "saorl" / "envs" / "swe" / "miniswe_runner.py"

MINISWE_TIER = [
    pytest.mark.miniswe,
    pytest.mark.skipif(
        not PYTHON, reason="needs .venv-miniswe (bash scripts/test_miniswe_tier.sh)"
    ),
]
