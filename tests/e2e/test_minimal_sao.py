"""examples/minimal_sao.py runs end to end as a user would, with a tiny budget.

The budgets only check that every stage (supervised warm-up, rollouts, critic warm-up, critic
and DIS policy updates, evaluation) runs and reports sane numbers; whether the reward rises
needs the default budget and is measured by hand, not here.
"""

from __future__ import annotations

import importlib.util
import math
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "minimal_sao.py"
TINY = ["--sft-steps", "20", "--batch-size", "16", "--critic-warmup-steps", "1"]
TINY += ["--eval-size", "32"]


def _load_example() -> ModuleType:
    # examples/ is not a package: load the file by path, as a user's `python file.py` would.
    spec = importlib.util.spec_from_file_location("minimal_sao", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_script_runs_and_prints_rewards() -> None:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--steps", "3", *TINY],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    policy_lines = re.findall(r"^step\s+\d+\s+reward (\d\.\d+)", proc.stdout, re.MULTILINE)
    warmup_lines = re.findall(r"^critic-warmup\s+reward", proc.stdout, re.MULTILINE)
    assert len(policy_lines) == 3, proc.stdout
    assert len(warmup_lines) == 1, proc.stdout
    assert "held-out greedy accuracy" in proc.stdout


def test_main_returns_summary() -> None:
    threads = torch.get_num_threads()
    try:
        summary = _load_example().main(["--steps", "2", "--seed", "1", *TINY])
    finally:
        # main() sets the process-wide thread count; later tests in this process keep theirs.
        torch.set_num_threads(threads)
    assert len(summary["rewards"]) == 2
    assert len(summary["warmup_rewards"]) == 1
    for r in [*summary["rewards"], *summary["warmup_rewards"]]:
        assert isinstance(r, float) and math.isfinite(r) and 0.0 <= r <= 1.0
    for key in ("initial_accuracy", "final_accuracy"):
        assert 0.0 <= summary[key] <= 1.0
