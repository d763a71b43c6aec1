"""The mini-swe-agent runner saorl ships (`saorl/envs/swe/miniswe_runner.py`) is a script for
mini-swe-agent's own venv, where neither saorl nor torch is installed: it imports only the
standard library and mini-swe-agent (with its litellm), and importing it does nothing. Its runs
are tested in the miniswe tier (tests/miniswe_tier/)."""

from __future__ import annotations

import ast
import importlib
import os
import sys

from saorl.envs.agent import MINISWE_RUNNER

MINI_VENV_HAS = {"minisweagent", "litellm"}


def test_the_runner_imports_only_the_standard_library_and_mini_swe_agent():
    tree = ast.parse(MINISWE_RUNNER.read_text())
    imported = set()
    for node in ast.walk(tree):  # module level and function bodies alike
        if isinstance(node, ast.Import):
            imported |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            assert node.level == 0, "a relative import needs saorl's package"
            imported.add((node.module or "").split(".")[0])
    assert {"minisweagent", "litellm", "json", "socket"} <= imported
    outside = imported - set(sys.stdlib_module_names) - MINI_VENV_HAS
    assert not outside, f"not in mini-swe-agent's venv: {sorted(outside)}"


def test_importing_the_runner_sets_nothing(monkeypatch):
    for name in list(os.environ):
        if name.startswith(("MSWEA_", "LITELLM_")):
            monkeypatch.delenv(name)
    module = importlib.import_module("saorl.envs.swe.miniswe_runner")
    assert module.__file__ == str(MINISWE_RUNNER)
    assert not [k for k in os.environ if k.startswith(("MSWEA_", "LITELLM_"))]
