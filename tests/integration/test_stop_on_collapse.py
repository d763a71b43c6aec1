"""Collapse detection inside a real `saorl train`: the collapse/* columns, the log line,
`run.stop_on_collapse` ending the run with a checkpoint, and a NaN streak's summary.json."""

from __future__ import annotations

import json
import math
import string
from pathlib import Path

import pytest

from saorl.checkpoint.io import list_checkpoints, load_state_file
from saorl.cli.main import main
from saorl.envs.arithmetic import ArithmeticTask

# A random-init model rarely emits EOS; stop strings covering most characters end turns early.
STOP_ON_MOST_CHARS = "rollout.stop=" + str(list(string.ascii_letters + string.digits))
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=32",
    "learner.batch_size=8",
    "learner.micro_batch_size=4",
    "learner.sft_steps=0",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=6",
    "critic.warmup_steps=1",
    "env.eval_size=16",
    "run.eval_every=0",
    "run.progress=false",
    "run.torch_threads=1",
    "run.concurrency=sync",
    "run.trackers=[]",
    "run.log_samples_every=0",
    STOP_ON_MOST_CHARS,
]
# lr 0.1 without a ramp: the tiny policy turns deterministic within ~10 steps (its entropy
# falls from ~4.6 nats to ~0), an entropy collapse; a 5-step window lets the detector see it
# in a short run.
COLLAPSING = ["learner.lr=0.1", "learner.lr_warmup_steps=0", "collapse.window=5"]


@pytest.fixture
def varied_reward(monkeypatch):
    # A random-init model never solves addition, so every reward would be 0 and so would every
    # gradient; a reward that depends on the sampled text gives the policy something to chase.
    monkeypatch.setattr(ArithmeticTask, "reward", staticmethod(lambda p, t: float(len(t) % 2)))


def _rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_stop_on_collapse_ends_the_run_cleanly_with_a_checkpoint(tmp_path, varied_reward, capsys):
    code = main(
        [
            "train",
            *TINY,
            *COLLAPSING,
            f"run.output_dir={tmp_path}",
            "run.name=c",
            "run.total_steps=60",
            "run.checkpoint_every=0",
            "run.stop_on_collapse=true",
        ]
    )
    assert code == 0
    run_dir = tmp_path / "c"
    summary = json.loads((run_dir / "summary.json").read_text())
    found = summary["collapse"]
    assert summary["stopped_by"] == "collapse" and found is not None
    stop = found["detected_step"]
    assert summary["steps"] == stop < 60  # stopped early, at the step the signal fired
    assert found["signal"] in summary["stop_reason"] and str(stop) in summary["stop_reason"]
    assert summary["final_eval_accuracy"] is not None  # the policy it stopped at, evaluated
    # A checkpoint of the step it stopped at (checkpoint_every=0: only the start and the end).
    last = load_state_file(list_checkpoints(run_dir)[-1])
    assert last["step"] == stop
    # The collapse/* columns are on every RL row; the flag turns on at the stopping step.
    rows = [r for r in _rows(run_dir) if "rollout/reward_mean" in r]
    assert [r["step"] for r in rows] == list(range(1, stop + 1))
    assert all(f"collapse/{found['signal']}" in r and "collapse/detected" in r for r in rows)
    assert [r["collapse/detected"] for r in rows[-2:]] == [0.0, 1.0]
    assert "eval/accuracy" in rows[-1]
    # The log line and the progress line name the signal and the step.
    err = capsys.readouterr().err
    assert f"collapse detected at step {stop}" in err and found["signal"] in err
    assert f"collapse: {found['signal']} @ {stop}" in err


def test_without_stop_on_collapse_the_run_goes_on_and_reports_it(tmp_path, varied_reward):
    code = main(
        [
            "train",
            *TINY,
            *COLLAPSING,
            f"run.output_dir={tmp_path}",
            "run.name=g",
            "run.total_steps=25",
            "run.checkpoint_every=0",
        ]
    )
    assert code == 0
    summary = json.loads((tmp_path / "g" / "summary.json").read_text())
    assert summary["stopped_by"] == "total_steps" and summary["steps"] == 25
    assert summary["collapse"] is not None and summary["collapse"]["detected_step"] < 25
    rows = [r for r in _rows(tmp_path / "g") if "rollout/reward_mean" in r]
    assert rows[-1]["collapse/detected"] == 1.0


def test_a_nan_streak_writes_the_summary_before_exit_3(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(ArithmeticTask, "reward", staticmethod(lambda p, t: math.nan))
    code = main(
        [
            "train",
            *TINY,
            f"run.output_dir={tmp_path}",
            "run.name=nan",
            "run.total_steps=10",
            "run.checkpoint_every=1",
            "learner.max_nonfinite_in_a_row=2",
        ]
    )
    assert code == 3
    assert "2 learner steps in a row had a NaN/Inf gradient" in capsys.readouterr().err
    summary = json.loads((tmp_path / "nan" / "summary.json").read_text())
    assert summary["stopped_by"] == "nonfinite"
    assert "max_nonfinite_in_a_row" in summary["stop_reason"]
    assert "2 learner steps in a row" in summary["stop_reason"]
    # Critic warm-up step 1, then one skipped policy step (2) is logged; step 3's raises.
    assert summary["steps"] == 2
    assert not (tmp_path / "nan" / "final").exists()  # no exported policy from a failed run
