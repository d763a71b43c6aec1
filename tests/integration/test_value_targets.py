"""The critic is trained on every position GAE reads a value at: action tokens only by default,
observation tokens too in the `algorithm.skip_observations=false` ablation (which would
otherwise bootstrap through values the critic never learns)."""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.learner.learner import Learner
from saorl.models.logprobs import sequence_logprobs
from saorl.types import Batch, Trajectory
from tests.conftest import tiny_config

# action, observation, action: the tool-call shape of a multi-turn episode
LOSS_MASK = [1, 1, 1, 0, 0, 0, 0, 1, 1]


def _obs_batch(policy, n: int = 8) -> Batch:
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(n):
        p_len, c_len = 3 + i % 2, len(LOSS_MASK)
        ids = torch.randint(3, 90, (p_len + c_len,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, p_len:].tolist()
        # Rewards are never 0, so the zero-initialised value head is wrong on every row.
        trajs.append(
            Trajectory(
                ids[:p_len], ids[p_len:], LOSS_MASK, lp, [0] * c_len, reward=0.25 + 0.5 * (i % 2)
            )
        )
    return Batch.from_trajectories(trajs, pad_id=0)


def _learner(policy, skip: bool) -> Learner:
    cfg = tiny_config(
        f"algorithm.skip_observations={str(skip).lower()}",
        "critic.warmup_steps=100",
        "critic.updates_per_step=1",
        "learner.micro_batch_size=8",
    )
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))


@pytest.mark.parametrize("skip", [True, False])
def test_the_value_loss_covers_the_positions_gae_reads(tiny_policy, skip):
    policy, _ = tiny_policy
    batch = _obs_batch(policy)
    learner = _learner(policy, skip)
    outputs: list[torch.Tensor] = []

    def keep(module, args, out):
        if out.requires_grad:  # the training forward of the critic update
            out.retain_grad()
            outputs.append(out)

    learner.critic.register_forward_hook(keep)
    learner.step(batch)  # a critic warm-up step: one value-loss update, no policy update
    (values,) = outputs  # one micro-batch of all 8 rows
    action = batch.action_mask.bool()
    observation = batch.completion_mask.bool() & ~action
    assert observation.any()
    assert values.grad[action].abs().sum() > 0
    if skip:
        assert torch.count_nonzero(values.grad[observation]) == 0
    else:
        assert values.grad[observation].abs().min() > 0  # every observation token is a target


@pytest.mark.parametrize(
    "overrides",
    [
        ("algorithm.gamma=0.9",),  # discounted targets, not the row's outcome
        ("algorithm.lambda_critic=0.5",),  # bootstrapped targets
        ("algorithm.skip_observations=false", "algorithm.lambda_critic=0.9"),  # observations too
    ],
)
def test_value_pretrain_explained_variance_is_the_training_steps(tiny_policy, overrides):
    """`saorl value-pretrain` reports explained variance against the targets the training
    step fits (its GAE), so the two numbers agree on the same batch and critic."""
    from saorl.learner import value_pretrain

    policy, _ = tiny_policy
    batch = _obs_batch(policy)
    cfg = tiny_config(*overrides, "critic.updates_per_step=1", "learner.micro_batch_size=8")
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    torch.manual_seed(1)  # a value head that is not zero, so the values vary
    with torch.no_grad():
        learner.critic.value_head.weight.normal_(0.0, 0.5)
    ev = value_pretrain._explained_variance(learner, [batch])
    _, vm = learner.critic_updater.prepare(batch)
    assert ev == pytest.approx(float(vm["value/explained_variance"]), rel=1e-5)
    # The statuses it drops are the collector's, not a copy.
    from saorl.rollout import collector

    assert value_pretrain.UNTRAINABLE is collector.UNTRAINABLE
