"""Trajectory validation and the padded Batch the learner consumes."""

from __future__ import annotations

import pytest
import torch

from saorl.types import Batch, Trajectory


def _traj(prompt, completion, mask, versions, reward=1.0) -> Trajectory:
    return Trajectory(
        prompt_ids=prompt,
        completion_ids=completion,
        loss_mask=mask,
        rollout_logprobs=[-0.5] * len(completion),
        versions=versions,
        reward=reward,
    )


def test_batch_layout_with_observation_tokens():
    # Row 0: prompt [5, 6], action 7, observation 8 9, action 10 -> reward on token 10.
    a = _traj([5, 6], [7, 8, 9, 10], [1, 0, 0, 1], [3, -1, -1, 4], reward=1.0)
    b = _traj([5], [11], [1], [2], reward=0.5)
    batch = Batch.from_trajectories([a, b], pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7, 8, 9, 10], [5, 11, 0, 0, 0, 0]]
    assert batch.attention_mask.tolist() == [[1] * 6, [1, 1, 0, 0, 0, 0]]
    assert batch.action_mask.tolist() == [[0, 0, 1, 0, 0, 1], [0, 1, 0, 0, 0, 0]]
    assert batch.completion_mask.tolist() == [[0, 0, 1, 1, 1, 1], [0, 1, 0, 0, 0, 0]]
    assert batch.rewards.tolist() == [[0, 0, 0, 0, 0, 1.0], [0, 0.5, 0, 0, 0, 0]]
    assert batch.versions.tolist() == [[-1, -1, 3, -1, -1, 4], [-1, 2, -1, -1, -1, -1]]
    assert batch.rollout_logprobs[0, 2].item() == -0.5 and batch.rollout_logprobs[0, 0] == 0
    assert batch.scores.tolist() == [1.0, 0.5]
    sub = batch.select(slice(1, 2))
    assert sub.size == 1 and sub.input_ids.tolist() == [[5, 11, 0, 0, 0, 0]]
    assert torch.equal(batch.select([1]).input_ids, sub.input_ids)


def test_staleness_uses_oldest_action_token():
    t = _traj([1], [2, 3, 4], [1, 0, 1], [5, -1, 7])
    assert t.min_version == 5
    assert t.staleness(9) == 4


def test_mismatched_lengths_are_rejected():
    with pytest.raises(ValueError, match="disagree in length"):
        _traj([1], [2, 3], [1], [0, 0])


def test_empty_batch_is_rejected():
    with pytest.raises(ValueError, match="zero trajectories"):
        Batch.from_trajectories([], pad_id=0)
