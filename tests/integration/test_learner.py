"""The SAO learner step: micro-batch parity, critic warm-up, and non-finite gradients."""

from __future__ import annotations

import copy

import torch

from saorl.learner.learner import Learner
from saorl.models.logprobs import sequence_logprobs
from saorl.types import Batch, Trajectory
from tests.conftest import tiny_config


def _batch(policy, n: int = 8, seed: int = 0) -> Batch:
    g = torch.Generator().manual_seed(seed)
    trajs = []
    for i in range(n):
        p_len, c_len = 3 + i % 3, 2 + (i * 5) % 6
        ids = torch.randint(3, 90, (p_len + c_len,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, p_len:].tolist()
        trajs.append(
            Trajectory(ids[:p_len], ids[p_len:], [1] * c_len, lp, [0] * c_len, reward=float(i % 2))
        )
    return Batch.from_trajectories(trajs, pad_id=0)


def _learner(policy, *overrides: str) -> Learner:
    return Learner(tiny_config(*overrides), copy.deepcopy(policy), torch.device("cpu"))


def test_micro_batches_accumulate_to_the_full_batch_step(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    for agg in ("token_mean", "seq_mean_token_mean"):
        common = ("critic.warmup_steps=0", f"algorithm.loss_agg={agg}", "learner.batch_size=8")
        full = _learner(policy, *common, "learner.micro_batch_size=8")
        micro = _learner(policy, *common, "learner.micro_batch_size=3")
        m_full, m_micro = full.step(batch), micro.step(batch)
        assert full.version == micro.version == 1
        for a, b in zip(full.policy.parameters(), micro.policy.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
        for a, b in zip(full.critic.parameters(), micro.critic.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=2e-6, rtol=1e-5)
        for k in ("loss/policy", "loss/value", "dis/masked_frac"):
            assert abs(m_full[k] - m_micro[k]) < 1e-5, k


def test_critic_warmup_leaves_the_policy_alone(tiny_policy):
    policy, _ = tiny_policy
    learner = _learner(policy, "critic.warmup_steps=2")
    before = copy.deepcopy(learner.policy.state_dict())
    batch = _batch(policy)
    for _ in range(2):
        m = learner.step(batch)
        assert m["learner/warmup"] == 1.0 and m["loss/policy"] is None
    assert learner.version == 0
    for k, v in learner.policy.state_dict().items():
        assert torch.equal(v, before[k]), k
    learner.step(batch)
    assert learner.version == 1


def test_non_finite_gradient_skips_the_update(tiny_policy):
    policy, _ = tiny_policy
    learner = _learner(policy, "critic.warmup_steps=0")
    batch = _batch(policy)
    batch.rewards[batch.rewards != 0] = float("nan")
    policy_before = copy.deepcopy(learner.policy.state_dict())
    critic_before = copy.deepcopy(learner.critic.state_dict())
    learner.step(batch)
    assert learner.version == 0
    assert learner.skipped_steps == 3  # K=2 critic steps and the policy step
    for k, v in learner.policy.state_dict().items():
        assert torch.equal(v, policy_before[k]), k
    for k, v in learner.critic.state_dict().items():
        assert torch.equal(v, critic_before[k]), k
