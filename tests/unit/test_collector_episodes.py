"""Agent episodes of several segments (a history rewrite) in the learner's batches: a GRPO group
counts episodes, so it holds all of each member's segments; a dropped episode frees one
admission slot however many segments it had; group advantages count each episode once."""

from __future__ import annotations

import queue
import random

import pytest
import torch

from saorl.advantages import group_normalized_advantages
from saorl.rollout.collector import BatchCollector, episodes
from saorl.rollout.worker import PromptFeed
from saorl.types import Batch, Trajectory


def _seg(group: int, name: str, segments: int = 1, version: int = 0) -> Trajectory:
    info = {"name": name}
    if segments > 1:
        info["agent/segments"] = segments
    return Trajectory(
        [1], [2], [1], [0.0], [version], reward=1.0, stop_reason="answer", group_id=group, info=info
    )


def _collector(trajs: list[Trajectory], group_size: int) -> tuple[BatchCollector, PromptFeed]:
    out: queue.Queue[Trajectory] = queue.Queue()
    for t in trajs:
        out.put(t)
    feed = PromptFeed(None, random.Random(0), batch_size=4, max_staleness=1)
    return BatchCollector([], feed, out, group_size=group_size, sync=False), feed


def test_a_group_holds_every_segment_of_its_episodes():
    # Group 0: episode a (two segments) and episode b; group 1: c and d.
    trajs = [_seg(0, "a1", 2), _seg(0, "a2", 2), _seg(1, "c"), _seg(0, "b"), _seg(1, "d")]
    c, _ = _collector(trajs, group_size=2)
    batch, *_ = c.collect(version=0, n=3, max_staleness=4)
    # Counted by trajectories, group 0 closed at a1 and a2, leaving b stranded in a new one.
    assert [t.info["name"] for t in batch] == ["a1", "a2", "b"]
    batch, *_ = c.collect(version=0, n=2, max_staleness=4)
    assert [t.info["name"] for t in batch] == ["c", "d"] and not c.partial


def test_a_dropped_episode_frees_one_admission_slot():
    assert episodes([_seg(0, "a1", 3), _seg(0, "a2", 3), _seg(0, "a3", 3), _seg(0, "b")]) == 2
    # Too stale (version 0 at learner version 9): a three-segment episode and a plain one.
    stale = [_seg(0, f"a{i}", 3) for i in range(3)] + [_seg(0, "b")]
    c, feed = _collector([*stale, _seg(1, "c", version=9)], group_size=1)
    feed.admitted = 10
    batch, dropped, *_ = c.collect(version=9, n=1, max_staleness=4)
    assert [t.info["name"] for t in batch] == ["c"] and dropped == 4
    assert feed.admitted == 8  # two episodes dropped: two replacements, not four


def test_group_advantages_count_each_episode_once():
    """Group 0: episode a (reward 1, three segments) and episode b (reward 0); group 1: c, d.
    The advantages equal those of the episodes alone: a's segments do not outweigh b."""
    trajs = [_seg(0, f"a{i}", 3) for i in range(3)] + [_seg(0, "b"), _seg(1, "c"), _seg(1, "d")]
    for t, r in zip(trajs, [1, 1, 1, 0, 1, 0], strict=True):
        t.reward = float(r)
    batch = Batch.from_trajectories(trajs, pad_id=0)
    assert batch.episode_weights.tolist() == pytest.approx([1 / 3] * 3 + [1.0] * 3)
    adv = group_normalized_advantages(batch.scores, batch.group_ids, weights=batch.episode_weights)
    hi, lo = group_normalized_advantages(torch.tensor([1.0, 0.0]), torch.tensor([0, 0])).tolist()
    assert adv.tolist() == pytest.approx([hi] * 3 + [lo, hi, lo])
    unweighted = group_normalized_advantages(batch.scores, batch.group_ids)
    assert unweighted[3].item() != pytest.approx(lo)  # segments as members: skewed
    assert Batch.from_trajectories([_seg(0, "x")], pad_id=0).episode_weights is None


def test_batched_segments_count_against_admission():
    """Admission caps rollouts at (batches taken + lookahead) x batch_size, in trajectories: a
    batched three-segment episode took three places for one admission, so two are charged."""
    trajs = [_seg(0, f"a{i}", 3) for i in range(3)] + [_seg(1, "b")]
    c, feed = _collector(trajs, group_size=1)
    feed.admitted = 2  # a and b started
    batch, *_ = c.collect(version=0, n=4, max_staleness=4)
    assert len(batch) == 4 and feed.admitted == 4
    # (0 + 1) x 4 admitted: the next start waits for the learner to take the batch (uncharged,
    # two more episodes would start and their trajectories would be a batch more stale).
    assert feed.next() is None
    feed.consume()
    assert feed.admitted < (feed.consumed + 1) * feed.batch_size
