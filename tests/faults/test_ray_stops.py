"""Under `saorl train --ray`: SIGTERM to the driver saves a checkpoint before the actors end
(exit 143, the `--resume` command printed); a learner actor killed mid-run is reported as what
died and how to resume, without Ray's chained tracebacks."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from saorl.checkpoint.io import load_latest_checkpoint
from tests.faults._common import TINY_SYNC, metric_rows, saorl_cmd
from tests.faults.test_preemption import _rows_reach

pytest.importorskip("ray")
pytestmark = [pytest.mark.faults, pytest.mark.slow]

RAY = [
    *TINY_SYNC,
    "--ray",
    "ray.rollout_num_cpus=0.5",
    "run.save_hf=false",
    "run.checkpoint_every=0",
    "run.total_steps=100000",
]


def _start(tmp_path: Path) -> tuple[subprocess.Popen, Path]:
    cmd = saorl_cmd("train", *RAY, f"run.output_dir={tmp_path}", "run.name=r")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _rows_reach(tmp_path / "r", 2, proc)
    return proc, tmp_path / "r"


def test_sigterm_to_the_ray_driver_saves_first(tmp_path: Path):
    proc, run_dir = _start(tmp_path)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 143, err
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["signal"] == "SIGTERM"
    # the learner actor was alive for the save: a checkpoint of the last step logged
    assert load_latest_checkpoint(run_dir)[1]["step"] == metric_rows(run_dir)[-1]["step"]
    assert f"resume with: saorl train --resume {run_dir}" in err and "Traceback" not in err


def _learner_pids(root: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if cmdline.startswith(b"ray::LearnerActor") and int(entry.name) != root:
                found.append(int(entry.name))
    return found


def test_a_dead_ray_learner_says_what_died_and_how_to_resume(tmp_path: Path):
    proc, run_dir = _start(tmp_path)
    pids = _learner_pids(proc.pid)
    assert len(pids) == 1, pids
    os.kill(pids[0], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 1, err
    assert "learner: the Ray actor died" in err, err
    assert f"resume with: saorl train --resume {run_dir}" in err
    assert "Traceback" not in err
