"""algorithm.kl_reference = "initial": a KL penalty to a frozen copy of the policy as RL starts
(TRL's ref_model), by hand and in the learner."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from saorl.checkpoint.io import load_state_file, save_checkpoint
from saorl.config import ConfigError
from saorl.learner.learner import Learner
from saorl.losses import reference_kl_penalty
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch


def test_reference_kl_penalty_by_hand():
    # d = ref - logp = (0.2, -0.1) on two action tokens: k3 = e^d - 1 - d, mean over 2 tokens;
    # d k3 / d logp = -(e^d - 1) / 2.
    logp = torch.tensor([[-1.0, -2.0, -3.0]], requires_grad=True)
    ref = torch.tensor([[-0.8, -2.1, 9.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss = reference_kl_penalty(logp, ref, mask)
    want = sum(math.expm1(d) - d for d in (0.2, -0.1)) / 2
    assert loss.item() == pytest.approx(want, rel=1e-6)
    loss.backward()
    grads = [-math.expm1(d) / 2 for d in (0.2, -0.1)]
    assert logp.grad[0, :2].tolist() == pytest.approx(grads, rel=1e-5)
    assert logp.grad[0, 2] == 0


def _learner(policy, *overrides: str) -> Learner:
    cfg = tiny_config("critic.warmup_steps=0", "learner.batch_size=8", *overrides)
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))


def test_the_reference_is_the_policy_as_rl_starts_and_never_trains(tiny_policy, tmp_path):
    policy, _ = tiny_policy
    batch = _batch(policy)
    plain = _learner(policy)
    kl = _learner(policy, "algorithm.kl_coef=0.5", "algorithm.kl_reference=initial")
    plain.step(batch)
    kl.step(batch)
    # Step 1: the reference is the policy itself, so the penalty and its gradient are 0.
    for a, b in zip(plain.policy.parameters(), kl.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b)
    start = {k: v.clone() for k, v in kl.ref_policy.model.state_dict().items()}
    for k, v in policy.state_dict().items():
        torch.testing.assert_close(start[k], v)  # the weights RL started from
    plain.step(batch)
    kl.step(batch)  # step 2: the penalty now pulls towards the start
    assert any(
        not torch.equal(a, b)
        for a, b in zip(plain.policy.parameters(), kl.policy.parameters(), strict=True)
    )
    assert all(torch.equal(v, kl.ref_policy.model.state_dict()[k]) for k, v in start.items())
    # A checkpoint file keeps the reference; a resumed learner penalises against the same
    # weights.
    path = save_checkpoint(tmp_path, kl.steps, kl.state_dict())
    resumed = _learner(policy, "algorithm.kl_coef=0.5", "algorithm.kl_reference=initial")
    resumed.load_state(load_state_file(path))
    assert all(torch.equal(v, resumed.ref_policy.model.state_dict()[k]) for k, v in start.items())


def test_the_sampler_reference_keeps_no_copy(tiny_policy):
    learner = _learner(tiny_policy[0], "algorithm.kl_coef=0.5")
    learner.step(_batch(tiny_policy[0]))
    assert learner.ref_policy is None and "ref_policy" not in learner.state_dict()


def test_initial_reference_with_fsdp_is_refused():
    with pytest.raises(ConfigError, match="kl_reference"):
        tiny_config("learner.fsdp=true", "algorithm.kl_coef=0.1", "algorithm.kl_reference=initial")
