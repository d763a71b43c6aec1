"""Trackers (TensorBoard, W&B offline, MLflow on a local store) and sample dumps, read back with
each tool's own reader; no training run (tests/e2e/test_tracking_cli.py has those)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from saorl.config import ConfigError, load_config
from saorl.models.tokenizer import build_char_tokenizer
from saorl.monitoring.metrics import MetricsLogger
from saorl.monitoring.samples import (
    SAMPLES_FILE,
    SampleLogger,
    pop_row_advantages,
    row_advantages,
    sample_row,
    split_turns,
)
from saorl.monitoring.tracking import (
    TRACKERS_FILE,
    check_trackers,
    open_trackers,
    render_transcript,
)
from saorl.types import Trajectory
from tests._tracker_readers import (
    mlflow_series,
    tb_scalars,
    tb_texts,
    wandb_history,
    wandb_offline_runs,
)
from tests.conftest import tiny_config

ALL = '["tensorboard", "wandb", "mlflow"]'


@pytest.fixture
def offline(monkeypatch: pytest.MonkeyPatch) -> None:
    """W&B never reaches a network; MLflow uses the run directory's own store."""
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)


def test_default_is_tensorboard_and_unknown_names_are_refused() -> None:
    cfg = load_config(None, [])
    assert cfg.run.trackers == ["tensorboard"]
    assert (cfg.run.log_samples_every, cfg.run.log_samples_count) == (50, 4)
    assert load_config(None, ["run.trackers=[]"]).run.trackers == []
    with pytest.raises(ConfigError, match=r"run.trackers\[0\].*'tensorboard', 'wandb' or 'mlflow'"):
        load_config(None, ['run.trackers=["neptune"]'])
    with pytest.raises(ConfigError, match=r"run\.trackers: names a tracker twice"):
        load_config(None, ['run.trackers=["wandb", "wandb"]'])


def _import_mlflow_first() -> None:
    # mlflow registers its sqlite store at import time only if sqlalchemy imports then: an
    # import under a blocked sqlalchemy would leave this process's mlflow without it.
    import mlflow  # noqa: F401


@pytest.mark.parametrize(
    ("tracker", "package"),
    [
        ("tensorboard", "tensorboardX"),
        ("wandb", "wandb"),
        ("mlflow", "mlflow"),
        ("mlflow", "sqlalchemy"),
    ],
)
def test_missing_package_names_the_extra(
    tracker: str, package: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    _import_mlflow_first()
    monkeypatch.setitem(sys.modules, package, None)  # None makes `import package` fail
    with pytest.raises(ConfigError, match=rf"{package!r}.*pip install 'saorl\[tracking\]'"):
        check_trackers([tracker])


def test_mlflow_server_needs_no_sqlalchemy(monkeypatch: pytest.MonkeyPatch) -> None:
    # Only the local sqlite store needs sqlalchemy; a tracking server does not.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:1")
    _import_mlflow_first()
    monkeypatch.setitem(sys.modules, "sqlalchemy", None)
    check_trackers(["mlflow"])


def _rows(first: int, last: int, scale: float) -> list[dict]:
    return [
        {
            "step": s,
            "loss/policy": scale * s,
            "rollout/reward_mean": s / 10,
            "loss/value": None if s == 1 else 0.5,
            "note": "text is not a scalar",
        }
        for s in range(first, last + 1)
    ]


def _sample(step: int) -> dict:
    return {
        "step": step,
        "index": 0,
        "prompt": "1+2=",
        "turns": [{"role": "model", "text": "3"}],
        "reward": 1.0,
        "staleness": 0,
        "stop_reason": "eos",
        "batch_advantage": {"mean": 0.25},
    }


@pytest.mark.slow
def test_trackers_log_every_scalar_then_resume_the_same_runs(tmp_path: Path, offline: None):
    cfg = tiny_config(f"run.trackers={ALL}", "run.name=trk", "run.project=saorl-test")
    run = tmp_path / "run"
    with MetricsLogger(run, open_trackers(cfg, run, resume_step=None)) as log:
        for row in _rows(0, 5, scale=1.0):
            log.log(row)
        log.log_samples([_sample(5)], 5)
    ids = json.loads((run / TRACKERS_FILE).read_text())

    # Resumed from a checkpoint at step 3: steps 4 and 5 are trained (and logged) again.
    with MetricsLogger(run, open_trackers(cfg, run, resume_step=3)) as log:
        for row in _rows(4, 6, scale=-1.0):
            log.log(row)
    after = json.loads((run / TRACKERS_FILE).read_text())
    assert after["wandb"]["id"] == ids["wandb"]["id"]
    assert after["mlflow"]["run_id"] == ids["mlflow"]["run_id"]

    # TensorBoard: one series, the redone steps replaced (purge_step), nulls and text skipped.
    tb = tb_scalars(run / "tensorboard")
    assert set(tb) == {"loss/policy", "rollout/reward_mean", "loss/value"}
    assert tb["loss/policy"] == {0: 0.0, 1: 1.0, 2: 2.0, 3: 3.0, 4: -4.0, 5: -5.0, 6: -6.0}
    assert sorted(tb["loss/value"]) == [0, 2, 3, 4, 5, 6]
    assert "trk" in tb_texts(run / "tensorboard", "config")[0]
    assert "[model]\n    3" in tb_texts(run / "tensorboard", "samples")[5]

    # W&B: two offline runs with the same id (the second resumes the first).
    first, second = wandb_offline_runs(run)
    run_id, history = wandb_history(first)
    assert run_id == ids["wandb"]["id"]
    assert {s: h["loss/policy"] for s, h in history.items()} == {s: float(s) for s in range(6)}
    assert history[5]["samples/nrows"] == 1 and "loss/value" not in history[1]
    run_id, history = wandb_history(second)
    assert run_id == ids["wandb"]["id"]
    assert {s: h["loss/policy"] for s, h in history.items()} == {4: -4.0, 5: -5.0, 6: -6.0}

    # MLflow: the same run; its metric history is append-only, so redone steps hold both values.
    series = mlflow_series(run, ids["mlflow"]["run_id"], "loss/policy")
    assert series == sorted([(s, float(s)) for s in range(6)] + [(4, -4.0), (5, -5.0), (6, -6.0)])
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=ids["mlflow"]["tracking_uri"])
    mlrun = client.get_run(ids["mlflow"]["run_id"])
    assert mlrun.info.status == "FINISHED" and mlrun.info.run_name == "trk"
    assert mlrun.data.params["run.trackers"] == json.dumps(["tensorboard", "wandb", "mlflow"])
    assert client.get_experiment(mlrun.info.experiment_id).name == "saorl-test"
    artifacts = run / "mlruns" / "artifacts" / ids["mlflow"]["run_id"] / "artifacts"
    dumped = json.loads((artifacts / "samples" / "step_000005.json").read_text())
    assert dumped == {"step": 5, "samples": [_sample(5)]}
    assert (artifacts / "config.toml").read_text().startswith("[model]")

    # A run that dies is closed as failed.
    with pytest.raises(RuntimeError), MetricsLogger(run, open_trackers(cfg, run, resume_step=6)):
        raise RuntimeError("the run died")
    assert client.get_run(ids["mlflow"]["run_id"]).info.status == "FAILED"


def _tool_trajectory(tok) -> Trajectory:
    enc = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    prompt, call, obs, answer = enc("6*7="), enc("<calc>6*7</calc>"), enc("[42]"), enc("42")
    completion = call + obs + answer + [tok.eos_token_id]
    mask = [1] * len(call) + [0] * len(obs) + [1] * (len(answer) + 1)
    versions = [2 if m else -1 for m in mask]
    versions[0] = 1  # the first token was sampled before a weight push
    return Trajectory(
        prompt,
        completion,
        mask,
        [0.0] * len(mask),
        versions,
        reward=1.0,
        stop_reason="answer",
        prompt_key="6*7",
        group_id=3,
        info={"turns": 2, "tool_calls": 1, "trace": [1, 2]},
    )


def test_sample_rows_decode_every_turn() -> None:
    tok = build_char_tokenizer()
    traj = _tool_trajectory(tok)
    assert split_turns(tok, traj) == [
        {"role": "model", "text": "<calc>6*7</calc>"},
        {"role": "observation", "text": "[42]"},
        {"role": "model", "text": "42<eos>"},
    ]
    row = sample_row(
        tok,
        traj,
        step=7,
        index=1,
        staleness=2,
        batch_metrics={"advantage/mean": 0.5, "loss/policy": 1.0},
        advantage={"mean": 0.25, "min": -1.0, "max": 2.0},
    )
    assert row == {
        "step": 7,
        "index": 1,
        "prompt": "6*7=",
        "turns": split_turns(tok, traj),
        "reward": 1.0,
        "staleness": 2,
        "stop_reason": "answer",
        "prompt_key": "6*7",
        "group_id": 3,
        "action_tokens": 19,
        "observation_tokens": 4,
        "versions": [1, 2],
        "info": {"turns": 2, "tool_calls": 1},
        "advantage": {"mean": 0.25, "min": -1.0, "max": 2.0},
        "batch_advantage": {"mean": 0.5},
    }
    assert render_transcript(row) == (
        "[prompt]\n6*7=\n[model]\n<calc>6*7</calc>\n[observation]\n[42]\n[model]\n42<eos>"
    )


def test_sample_logger_dumps_at_multiples_and_the_last_step(tmp_path: Path) -> None:
    tok = build_char_tokenizer()
    trajs = [_tool_trajectory(tok) for _ in range(5)]
    with MetricsLogger(tmp_path) as log:
        samples = SampleLogger(tmp_path, tok, every=2, count=3, last_step=5, log=log)
        for step in range(1, 6):
            samples.maybe_log(step, trajs, [0, 1, 2, 3, 4], {"advantage/mean": float("nan")})
        off = SampleLogger(tmp_path, tok, every=0, count=3, last_step=5, log=log)
        assert not any(off.due(s) for s in range(1, 6))
    rows = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert [(r["step"], r["index"], r["staleness"]) for r in rows] == [
        (s, i, i) for s in (2, 4, 5) for i in range(3)
    ]
    assert rows[0]["batch_advantage"] == {"mean": None}  # NaN is not JSON


def test_per_row_advantages_travel_in_the_metrics_and_come_out_before_logging() -> None:
    import torch

    adv = torch.tensor([[0.5, -1.0, 2.0, 9.0], [3.0, 3.0, 0.0, 0.0], [7.0, 7.0, 7.0, 7.0]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [0, 0, 0, 0]])
    stats = row_advantages(adv, mask, rows=5)  # more rows asked for than there are
    metrics = {"loss/policy": 0.1, **{k: float(v) for k, v in stats.items()}}
    rows = pop_row_advantages(metrics)
    assert metrics == {"loss/policy": 0.1}
    # Observation tokens (mask 0) never count; a row with no action tokens reports nothing.
    assert rows == {
        0: {"mean": 0.5, "min": -1.0, "max": 2.0},
        1: {"mean": 3.0, "min": 3.0, "max": 3.0},
    }
    assert row_advantages(adv, mask, rows=1).keys() == {
        "sample/advantage_mean/0",
        "sample/advantage_min/0",
        "sample/advantage_max/0",
    }


def test_mlflow_metric_names_are_made_acceptable():
    from saorl.monitoring.tracking import mlflow_key

    assert mlflow_key("gap/k3_stale2-3") == "gap/k3_stale2-3"
    assert mlflow_key("reward/fn/acc@k+1 é") == "reward/fn/acc_k_1 _"
