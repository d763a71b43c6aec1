"""`saorl train` with every tracker, read back with each tool's own reader; a missing tracker
package stops the run before it starts."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.monitoring.metrics import read_metrics
from saorl.monitoring.samples import SAMPLES_FILE
from saorl.monitoring.tracking import TRACKERS_FILE
from tests._tracker_readers import (
    metric_series,
    mlflow_series,
    tb_scalars,
    tb_texts,
    wandb_history,
    wandb_offline_runs,
)

TINY = [
    "run.total_steps=3",
    "run.eval_every=2",
    "learner.sft_steps=0",
    "learner.batch_size=8",
    "critic.warmup_steps=1",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "env.eval_size=16",
    "run.progress=false",
]
SAMPLE_FIELDS = {
    "step",
    "index",
    "prompt",
    "turns",
    "reward",
    "staleness",
    "stop_reason",
    "prompt_key",
    "group_id",
    "action_tokens",
    "observation_tokens",
    "versions",
    "info",
    "advantage",
    "batch_advantage",
}


def assert_same_series(got: dict, want: dict, rel: float = 0.0) -> None:
    """Same keys, same steps, same values (`rel`: TensorBoard stores float32)."""
    assert set(got) == set(want), set(got) ^ set(want)
    for key, steps in want.items():
        assert set(got[key]) == set(steps), key
        for step, value in steps.items():
            assert got[key][step] == pytest.approx(value, rel=rel, abs=rel), (key, step)


@pytest.mark.slow
def test_train_with_every_tracker(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("WANDB_", "MLFLOW_"))}
    env.update(WANDB_MODE="offline", WANDB_SILENT="true")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            f"run.output_dir={tmp_path}",
            "run.name=trk",
            *TINY,
            'run.trackers=["tensorboard", "wandb", "mlflow"]',
            "run.log_samples_every=2",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    run = tmp_path / "trk"
    metrics = read_metrics(run / "metrics.jsonl")
    want = metric_series(metrics)
    assert len({r["step"] for r in metrics}) == 4 and "loss/policy" in want  # steps 0..3
    ids = json.loads((run / TRACKERS_FILE).read_text())

    # Every numeric value of every metrics.jsonl row, at its step, in each tracker.
    assert_same_series(tb_scalars(run / "tensorboard"), want, rel=1e-6)
    (wandb_file,) = wandb_offline_runs(run)
    run_id, history = wandb_history(wandb_file)
    assert run_id == ids["wandb"]["id"]
    got: dict[str, dict[int, float]] = {}
    for step, items in history.items():
        for key, value in items.items():
            if not key.startswith(("_", "samples/")):
                got.setdefault(key, {})[step] = value
    assert_same_series(got, want)
    mlflow = {k: dict(mlflow_series(run, ids["mlflow"]["run_id"], k)) for k in want}
    assert_same_series(mlflow, want)

    # Samples: the first 4 trajectories at step 2 (a multiple of 2) and 3 (the last step).
    rows = [json.loads(x) for x in (run / SAMPLES_FILE).read_text().splitlines()]
    assert [(r["step"], r["index"]) for r in rows] == [(s, i) for s in (2, 3) for i in range(4)]
    for row in rows:
        assert set(row) == SAMPLE_FIELDS
        assert row["prompt"].endswith("=") and row["turns"][0]["role"] == "model"
        assert row["batch_advantage"]["mean"] == pytest.approx(
            next(r["advantage/mean"] for r in metrics if r["step"] == row["step"])
        )
    texts = tb_texts(run / "tensorboard", "samples")
    assert sorted(texts) == [2, 3] and rows[0]["prompt"] in texts[2]
    assert [history[s]["samples/nrows"] for s in (2, 3)] == [4, 4]
    artifacts = run / "mlruns" / "artifacts" / ids["mlflow"]["run_id"] / "artifacts" / "samples"
    dumped = json.loads((artifacts / "step_000003.json").read_text())
    assert dumped["samples"] == rows[4:]


def test_missing_tracker_package_exits_2_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # None makes `import wandb` fail
    out_dir = tmp_path / "runs"
    rc = main(["train", f"run.output_dir={out_dir}", *TINY, 'run.trackers=["wandb"]'])
    assert rc == 2
    err = capsys.readouterr().err
    assert "run.trackers names 'wandb'" in err and "pip install 'saorl[tracking]'" in err
    assert "Traceback" not in err
    assert not out_dir.exists()  # stopped before any run directory was made
