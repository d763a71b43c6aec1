"""`saorl train --ray` as a user runs it: a local Ray with 2 CPUs, learner and rollout actors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_train_cli import REQUIRED_KEYS

pytest.importorskip("ray")


@pytest.mark.slow
def test_saorl_train_with_ray(tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            "--ray",
            "ray.num_cpus=2",
            f"run.output_dir={tmp_path}",
            "run.name=e2e",
            "run.total_steps=3",
            "run.eval_every=2",
            "learner.sft_steps=5",
            "learner.batch_size=8",
            "critic.warmup_steps=1",
            "model.hidden_size=32",
            "model.intermediate_size=64",
            "env.eval_size=16",
            "run.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "e2e"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["policy_version"] == 2
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss/value" in r]
    assert len(train_rows) == 3
    for row in train_rows:
        assert set(row) >= REQUIRED_KEYS, REQUIRED_KEYS - set(row)
        assert row["async/staleness_max"] <= 4  # learner.max_staleness
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 3]
    assert len(list((run / "checkpoints").glob("step_*.pt"))) >= 2  # written by the learner actor
    assert (run / "final" / "config.json").exists() and (run / "report.png").exists()
    assert "Started a local Ray instance" in out.stderr
