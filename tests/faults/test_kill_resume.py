"""SIGKILL a training run at every stage of a checkpoint write and at random times, resume it
each time, and check that the result is the uninterrupted run's: no step lost or repeated, the
latest checkpoint always loadable, every metric of a synchronous run equal."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest

from saorl.checkpoint.io import checkpoint_dir, list_checkpoints, load_latest_checkpoint
from saorl.faults import POINTS
from tests.faults._common import (
    TINY_SYNC,
    assert_same_metrics,
    metric_rows,
    run_saorl,
    saorl_cmd,
)

pytestmark = [pytest.mark.faults, pytest.mark.slow]

STEPS = 8


def _latest_step(run_dir: Path) -> int:
    return load_latest_checkpoint(run_dir)[1]["step"] if list_checkpoints(run_dir) else -1


def test_sigkill_during_checkpoints_and_at_random_times(tmp_path: Path):
    base = [*TINY_SYNC, f"run.output_dir={tmp_path}", f"run.total_steps={STEPS}"]
    ref = run_saorl("train", *base, "run.name=ref")
    assert ref.returncode == 0, ref.stderr

    run_dir = tmp_path / "killed"
    # Every kill point of the checkpoint writer, each at its own step, then random-time kills.
    plan: list[str | float] = [f"{p}@{s}" for s, p in zip((1, 3, 5, 7), POINTS, strict=True)]
    rng = random.Random(0)
    plan += [rng.uniform(2.0, 8.0) for _ in range(2)]
    seen = -1
    for fault in plan:
        args = ["--resume", str(run_dir)] if run_dir.exists() else ["run.name=killed"]
        env = dict(os.environ)
        if isinstance(fault, str):
            env["SAORL_FAULT"] = fault
            out = subprocess.run(
                saorl_cmd("train", *base, *args),
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            code = out.returncode
            # The run reaches the armed point unless it had already passed that step.
            assert code in (-signal.SIGKILL, 0), out.stderr
        else:
            proc = subprocess.Popen(
                saorl_cmd("train", *base, *args),
                env=env,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(fault)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        if not list_checkpoints(run_dir):
            continue  # killed before the first checkpoint: the next start begins afresh
        step = _latest_step(run_dir)  # always loadable
        assert step >= seen, f"latest checkpoint went back from {seen} to {step} after {fault}"
        seen = step
        assert not list(checkpoint_dir(run_dir).glob("*.damaged"))
        rows = metric_rows(run_dir)
        assert [r["step"] for r in rows][: step + 1] == list(range(step + 1))  # nothing lost

    final = run_saorl("train", *base, "--resume", str(run_dir))
    assert final.returncode == 0, final.stderr
    assert not list(checkpoint_dir(run_dir).glob(".step_*.tmp.*"))  # torn writes cleaned up
    # No step lost or repeated, and the same numbers as the run that was never interrupted.
    assert_same_metrics(metric_rows(run_dir), metric_rows(tmp_path / "ref"))
    assert _latest_step(run_dir) == STEPS
