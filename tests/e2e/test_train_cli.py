"""`saorl train` as a user runs it, through the console script, with a tiny budget."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests._tracker_readers import metric_series, tb_scalars

REQUIRED_KEYS = {
    "step",
    "rollout/reward_mean",
    "loss/policy",
    "loss/value",
    "dis/masked_frac",
    "value/explained_variance",
    "critic/grad_norm",
    "async/staleness_mean",
    "async/staleness_max",
    "async/dropped_stale",
    "perf/learner_idle_frac",
    "perf/rollout_tokens_per_s",
    "time/wall_s",
}


def test_saorl_train_console_script(tmp_path: Path):
    exe = shutil.which("saorl", path=str(Path(sys.executable).parent)) or shutil.which("saorl")
    cmd = [exe] if exe else [sys.executable, "-m", "saorl"]
    out = subprocess.run(
        [
            *cmd,
            "train",
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
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "e2e"
    assert "run directory" in out.stdout
    summary = json.loads((run / "summary.json").read_text())
    for k in ("initial_eval_accuracy", "final_eval_accuracy", "steps", "wall_seconds"):
        assert k in summary
    assert summary["steps"] == 3
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train_rows = [r for r in rows if "loss/value" in r]
    assert len(train_rows) == 3
    for row in train_rows:  # every optimizer step, critic warm-up steps included
        assert set(row) >= REQUIRED_KEYS, REQUIRED_KEYS - set(row)
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2, 3]
    assert (run / "config.toml").exists() and (run / "report.png").exists()
    assert list((run / "checkpoints").glob("step_*.pt"))
    # Default trackers: TensorBoard holds every metrics.jsonl scalar; samples at the last step.
    tb, want = tb_scalars(run / "tensorboard"), metric_series(rows)
    assert {k: set(v) for k, v in tb.items()} == {k: set(v) for k, v in want.items()}
    assert all(tb[k][s] == pytest.approx(v, rel=1e-6) for k in want for s, v in want[k].items())
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert [(r["step"], r["index"]) for r in samples] == [(3, i) for i in range(4)]
    # Each sample carries its own advantages from the learner; metrics.jsonl does not.
    for r in samples:
        adv = r["advantage"]
        assert adv["min"] <= adv["mean"] <= adv["max"], adv
    assert not [k for r in rows for k in r if k.startswith("sample/")]


def test_saorl_train_bad_override_is_a_clear_error(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "saorl", "train", "learner.batch_size=0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2
    assert "learner.batch_size" in out.stderr
    assert "Traceback" not in out.stderr


def test_missing_model_path_is_a_clear_error(tmp_path: Path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            f"run.output_dir={tmp_path}",
            f"model.name_or_path={tmp_path / 'nope'}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode != 0
    assert "model.name_or_path" in out.stderr
    assert "Traceback" not in out.stderr
