"""Weight pushes counted in policy versions since the last push (`saorl.loop.push_due`)."""

from __future__ import annotations

import json

import pytest

from saorl.loop import push_due, train_from_config
from saorl.rollout.pool import WorkerPool
from tests.conftest import tiny_config


def _pushes(versions: list[int], push_every: int) -> list[int]:
    """The versions the loop pushes at, given the version after each step."""
    pushed, out = 0, []
    for v in versions:
        if push_due(v, pushed, push_every):
            pushed = v
            out.append(v)
    return out


def test_push_every_that_does_not_divide_the_versions_a_step_adds():
    # 4 mini-batches a step: versions 4, 8, 12, ...; `version % 3 == 0` pushed only at 12.
    assert _pushes([4, 8, 12, 16], 3) == [4, 8, 12, 16]
    assert _pushes([4, 8, 12, 16], 5) == [8, 16]


def test_a_skipped_mini_step_does_not_stop_the_pushes():
    # One mini-step skipped in step 1 (version 3, not 4): `version % 4 == 0` never holds again.
    assert _pushes([3, 7, 11, 15], 4) == [7, 11, 15]
    assert _pushes([3, 7, 11, 15], 1) == [3, 7, 11, 15]
    assert _pushes([0, 0, 2], 1) == [2]  # no new version (critic warm-up): no push


def _rows(run_dir):
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [r for r in map(json.loads, lines) if "async/staleness_max" in r]


@pytest.mark.parametrize("concurrency", ["sync", "threads"])
def test_grpo_push_every_3_with_4_minibatches_keeps_training(tmp_path, monkeypatch, concurrency):
    """The measured livelock: GRPO (4 mini-batches a step) with `push_every = 3` never pushed,
    every rollout went stale and was regenerated from the same weights. Synchronous rollouts
    are sampled by the weights last pushed, so their staleness is the versions since then."""
    pushed_at: list[int] = []
    push = WorkerPool.update_weights

    def counted(pool):
        pushed_at.append(pool.learner.version)
        return push(pool)

    monkeypatch.setattr(WorkerPool, "update_weights", counted)
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "algorithm.name=grpo",
        "algorithm.group_size=4",
        "learner.push_every=3",
        "learner.max_staleness=4",
        "run.total_steps=3",
        "run.checkpoint_every=0",
        "run.eval_every=0",
        f"run.concurrency={concurrency}",
    )
    assert cfg.algorithm.minibatches == 4
    summary = train_from_config(cfg)
    assert summary["steps"] == 3 and summary["policy_version"] == 12
    assert [v for v in pushed_at if v] == [4, 8, 12]  # after each step (0: the engines' start)
    rows = _rows(tmp_path / "default")
    assert len(rows) == 3
    if concurrency == "sync":
        assert [r["async/staleness_max"] for r in rows] == [0, 0, 0]
    assert all(r["async/staleness_max"] <= 4 for r in rows)
