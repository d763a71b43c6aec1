"""The module names of before the role folders (issue 28) still import, as the new modules."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from saorl._moved import FORWARDED, MOVED

SRC = Path(__file__).resolve().parents[2] / "src"


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_name_is_the_new_module(old: str) -> None:
    new = importlib.import_module(MOVED[old])
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED[old]}"):
        module = importlib.import_module(old)
    assert module is new
    assert module.__name__ == module.__spec__.name == MOVED[old]  # its own spec, not the alias's
    parent, _, leaf = old.rpartition(".")
    assert getattr(sys.modules[parent], leaf) is new
    assert not (SRC / (old.replace(".", "/") + ".py")).exists()


@pytest.mark.parametrize("package", sorted(FORWARDED))
def test_a_module_that_became_a_package_forwards_its_names(package: str) -> None:
    pkg = importlib.import_module(package)
    module = importlib.import_module(FORWARDED[package])
    public = [n for n in vars(module) if not n.startswith("_")]
    assert public
    for name in public:
        assert getattr(pkg, name) is getattr(module, name), name
    assert set(public) <= set(dir(pkg))
    with pytest.raises(AttributeError):
        pkg.no_such_name  # noqa: B018


def test_the_public_names_users_are_shown_import() -> None:
    """README/docs/examples' imports from the old paths, and the old `saorl.X.attr` patch paths."""
    shown = {  # old module -> a name imported from it, and the module defining that name now
        "saorl.checkpoint": ("save_checkpoint", "saorl.checkpoint.checkpoint"),
        "saorl.compare": ("run_compare", "saorl.experiments.compare"),
        "saorl.envs.base": ("EnvSpec", "saorl.envs.base"),
        "saorl.envs.datasets": ("load_problems", "saorl.envs.data.datasets"),
        "saorl.evaluation": ("run_eval", "saorl.evaluation.evaluation"),
        "saorl.learner": ("Learner", "saorl.learner.learner"),
        "saorl.losses": ("dis_policy_loss", "saorl.losses"),
        "saorl.rollout.tools": ("parse_tool_call", "saorl.toolcalls"),
        "saorl.config.components": ("AlgorithmConfig", "saorl.config.algorithm"),
        "saorl.config.runtime": ("CollapseConfig", "saorl.config.collapse"),
    }
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        for old, (name, home) in shown.items():
            assert getattr(importlib.import_module(old), name).__module__ == home, old


def test_old_names_and_package_submodules_stay_light() -> None:
    """Importing saorl installs the finder and loads nothing; a package's submodule does not load
    the module its package forwards to (`saorl.checkpoint.digest` without torch)."""
    code = (
        "import sys, saorl\n"
        "from saorl.checkpoint import digest\n"
        "import saorl.evaluation.prompts, saorl.learner\n"
        "import saorl.eval_prompts\n"
        "assert saorl.eval_prompts is saorl.evaluation.prompts\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'torch' or m in "
        "('saorl.checkpoint.checkpoint', 'saorl.learner.learner')))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "[]"
