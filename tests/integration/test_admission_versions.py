"""Admission control and the staleness bound count the same unit, policy versions, also when
one batch makes several versions (`algorithm.minibatches > 1`)."""

from __future__ import annotations

import random

import pytest

from saorl.loop import admission_lookahead, train_from_config
from saorl.rollout.worker import PromptFeed
from tests.conftest import tiny_config


class _Tasks:
    def sample(self, rng: random.Random) -> int:
        return rng.randrange(1000)


def _max_staleness_in_start_order(lookahead: int, minibatches: int, batch: int = 4) -> int:
    """Run the real PromptFeed against a learner that takes batches in start order, each batch
    advancing the policy by `minibatches` versions (and the engines with it): the largest
    staleness any trained rollout has."""
    feed = PromptFeed(_Tasks(), random.Random(0), batch, lookahead)
    started: list[int] = []  # the version each admitted rollout is sampled at
    version, worst = 0, 0
    for _ in range(12):
        while feed.next() is not None:  # the workers start everything admission allows
            started.append(version)
        taken, started = started[:batch], started[batch:]  # collect, at the current version
        worst = max(worst, *(version - v for v in taken))
        feed.consume()
        while feed.next() is not None:  # started while the learner steps: the old weights
            started.append(version)
        version += minibatches  # the learner's step, then the weight push
    return worst


@pytest.mark.parametrize(("max_staleness", "minibatches"), [(4, 1), (4, 2), (2, 2), (6, 3)])
def test_admission_window_keeps_staleness_within_max_staleness(max_staleness, minibatches):
    cfg = tiny_config(
        f"learner.max_staleness={max_staleness}", f"algorithm.minibatches={minibatches}"
    )
    lookahead = admission_lookahead(cfg)
    assert lookahead == max_staleness // minibatches
    assert _max_staleness_in_start_order(lookahead, minibatches) == max_staleness
    if minibatches > 1:
        # Counting batches (the window before versions were the unit) admits rollouts that
        # are `minibatches` times too old by the time they are trained.
        old = _max_staleness_in_start_order(max_staleness, minibatches)
        assert old == max_staleness * minibatches > max_staleness


def test_synchronous_mode_admits_only_the_batch_being_collected():
    assert admission_lookahead(tiny_config("run.concurrency=sync")) == 0


def test_a_threaded_run_with_two_minibatches_drops_nothing_as_stale(tmp_path):
    # Two policy versions per batch, at most two versions of staleness: admission lets one
    # batch run ahead, whose rollouts are sampled by the version before the learner's step and
    # trained right after it (staleness exactly 2), never later.
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "run.total_steps=6",
        "run.checkpoint_every=0",
        "run.concurrency=threads",
        "algorithm.minibatches=2",
        "learner.max_staleness=2",
        "run.trackers=[]",
    )
    summary = train_from_config(cfg)
    assert summary["dropped_stale"] == 0
    assert summary["policy_version"] == 2 * (6 - cfg.critic.warmup_steps)
