"""The critic's values taken from the forward pass of its first update (`CriticUpdater.fused`).

A fused step must compute what a step with a separate values forward computes (same values,
advantages, targets, updates), with one critic forward pass less; a critic whose train-mode
forward is random (dropout) keeps the separate forward.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from saorl.learner.critic_updater import stochastic_in_training
from saorl.learner.learner import Learner
from tests.conftest import tiny_config
from tests.integration.test_critic_concurrent import _assert_same_metrics, _assert_same_state
from tests.integration.test_learner import _batch


def _run(policy, fused: bool, *overrides: str, steps: int = 3):
    torch.manual_seed(0)
    learner = Learner(tiny_config(*overrides), copy.deepcopy(policy), torch.device("cpu"))
    assert learner.critic_updater.fused  # the tiny critic has no dropout
    learner.critic_updater.fused = fused
    forwards = []
    learner.critic.register_forward_hook(lambda *_: forwards.append(1))
    metrics = []
    for s in range(steps):
        before = len(forwards)
        metrics.append(learner.step(_batch(policy, seed=s)))
        metrics[-1]["_forwards"] = len(forwards) - before
    learner.close()
    return learner, metrics


@pytest.mark.parametrize(
    "overrides",
    [
        ("critic.updates_per_step=2", "critic.warmup_steps=1", "learner.micro_batch_size=8"),
        (
            "critic.updates_per_step=1",
            "critic.warmup_steps=0",
            "learner.micro_batch_size=3",
            "critic.value_clip=0.2",
        ),
        (
            "critic.updates_per_step=3",
            "critic.warmup_steps=0",
            "learner.micro_batch_tokens=40",
            "algorithm.skip_observations=false",
            "critic.concurrent=true",
        ),
    ],
    ids=["k2-warmup", "k1-micro-clip", "k3-packed-concurrent"],
)
def test_fused_step_equals_a_separate_values_forward(tiny_policy, overrides):
    policy, _ = tiny_policy
    plain, m_plain = _run(policy, False, *overrides)
    fused, m_fused = _run(policy, True, *overrides)
    k = plain.cfg.critic.updates_per_step
    for a, b in zip(m_plain, m_fused, strict=True):
        n_micro = a.pop("_forwards") // (k + 1)  # values + K updates, each over every micro
        assert n_micro >= 1 and b.pop("_forwards") == k * n_micro  # one pass over rows less
    _assert_same_metrics(m_plain, m_fused, rel=1e-5)
    assert plain.version == fused.version >= 1
    _assert_same_state(plain, fused)


def test_a_critic_with_dropout_keeps_a_separate_values_forward(tiny_policy):
    policy, _ = tiny_policy
    assert not stochastic_in_training(policy)
    assert stochastic_in_training(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))
    assert not stochastic_in_training(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.0)))
    noisy = copy.deepcopy(policy)
    noisy.config.attention_dropout = 0.1  # read by the attention in train mode
    assert stochastic_in_training(noisy)
    learner = Learner(tiny_config("critic.warmup_steps=0"), noisy, torch.device("cpu"))
    assert not learner.critic_updater.fused
    m = learner.step(_batch(policy))
    assert learner.version == 1 and m["loss/value"] > 0
    learner.close()
