"""The marks of every verifiers-tier test module: `pytestmark = VERIFIERS_TIER`."""

import importlib.util

import pytest

VERIFIERS_TIER = [
    pytest.mark.verifiers,
    pytest.mark.skipif(
        importlib.util.find_spec("verifiers") is None,
        reason="verifiers not installed (bash scripts/test_verifiers_tier.sh)",
    ),
]
