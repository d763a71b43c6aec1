"""The marks of every openenv-tier test module: `pytestmark = OPENENV_TIER`."""

import importlib.util

import pytest

OPENENV_TIER = [
    pytest.mark.openenv,
    pytest.mark.skipif(
        importlib.util.find_spec("openenv") is None,
        reason="openenv-core not installed (bash scripts/test_openenv_tier.sh)",
    ),
]
