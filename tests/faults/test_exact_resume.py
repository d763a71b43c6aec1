"""Resume reproduces the uninterrupted run (synchronous mode) and, in asynchronous mode, keeps
the trajectories that were finished but not trained and re-issues the ones in flight."""

from __future__ import annotations

import string
from pathlib import Path

import pytest

from saorl.checkpoint.io import load_latest_checkpoint
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from tests.conftest import tiny_config
from tests.faults._common import TINY_SYNC, assert_same_metrics, metric_rows

pytestmark = pytest.mark.faults


def test_sync_resume_matches_uninterrupted_run(tmp_path: Path):
    whole = tiny_config(
        *TINY_SYNC, f"run.output_dir={tmp_path}", "run.name=whole", "run.total_steps=6"
    )
    train_from_config(whole)
    first = tiny_config(
        *TINY_SYNC, f"run.output_dir={tmp_path}", "run.name=split", "run.total_steps=3"
    )
    train_from_config(first)
    rest = first.model_copy(update={"run": first.run.model_copy(update={"total_steps": 6})})
    train_from_config(rest, resume=str(tmp_path / "split"))
    assert_same_metrics(metric_rows(tmp_path / "split"), metric_rows(tmp_path / "whole"))


def test_async_checkpoint_keeps_untrained_and_reissues_in_flight(tmp_path: Path, monkeypatch):
    # Stop strings on most characters end turns early, so trajectories finish at varied times.
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "run.name=a",
        "run.total_steps=4",
        "run.checkpoint_every=2",
        "run.eval_every=0",
        "learner.max_staleness=3",
        "rollout.stop=" + str(list(string.ascii_letters + string.digits)),
    )
    train_from_config(cfg)
    _, state = load_latest_checkpoint(tmp_path / "a")
    assert state["step"] == 4
    pending = state["finished_untrained"] + state["in_flight"]
    # Admission lets up to max_staleness batches run ahead of the learner: some are pending.
    assert pending, "nothing pending at the checkpoint: the test would check nothing"
    for t in state["finished_untrained"]:  # trajectories are kept as plain dicts of fields
        assert t["stop_reason"] not in ("aborted",) and t["completion_ids"] is not None
    expected = {t["prompt_key"] for t in state["finished_untrained"]}
    expected |= {task.key for task, _group in state["in_flight"]}

    trained: list[str] = []
    real_step = Learner.step

    def recording_step(self, batch):
        trained.extend(batch.prompt_keys)
        return real_step(self, batch)

    monkeypatch.setattr(Learner, "step", recording_step)
    more = cfg.model_copy(update={"run": cfg.run.model_copy(update={"total_steps": 8})})
    train_from_config(more, resume=str(tmp_path / "a"))
    missing = expected - set(trained)
    assert not missing, f"pending at the checkpoint but never trained after resume: {missing}"
