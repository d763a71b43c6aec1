"""algorithm.correction in the learner's step, and the rollout-trainer gap it logs."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch

from saorl.corrections import lab_keys
from saorl.learner.learner import Learner
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch


def _learner(policy, *overrides: str) -> Learner:
    cfg = tiny_config("critic.warmup_steps=0", "learner.batch_size=8", *overrides)
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))


def test_a_correction_with_no_mismatch_changes_nothing(tiny_policy):
    # The batch's rollout log-probs are the policy's own: rho = 1, every weight 1 (tis, icepop).
    policy, _ = tiny_policy
    batch = _batch(policy)
    plain = _learner(policy)
    m_plain = plain.step(batch)
    for kind in ("tis", "icepop", "geo_rs"):
        corrected = _learner(policy, f"algorithm.correction={kind}")
        m = corrected.step(batch)
        for a, b in zip(plain.policy.parameters(), corrected.policy.parameters(), strict=True):
            torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
        assert abs(m["loss/policy"] - m_plain["loss/policy"]) < 1e-6
        assert m["corr/token_drop_frac"] == 0.0 and abs(m["corr/ess"] - 1.0) < 1e-6


def test_a_band_that_drops_every_token_stops_the_policy_gradient(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    learner = _learner(
        policy,
        "algorithm.correction=token_mis",
        "algorithm.correction_low=2",
        "algorithm.correction_high=3",
    )
    m = learner.step(batch)
    # Shares of micro-batch means: 1 up to float rounding.
    assert abs(m["corr/token_drop_frac"] - 1) < 1e-6 and abs(m["corr/seq_drop_frac"] - 1) < 1e-6
    assert m["policy/grad_norm"] == 0.0


def test_tis_truncates_the_tokens_the_engine_underweighted(tiny_policy):
    # Lower the recorded log-probs of every other action token by log 4: rho = 4 there, so tis
    # (cap 2) truncates exactly those tokens.
    policy, _ = tiny_policy
    batch = _batch(policy)
    shift = torch.zeros_like(batch.rollout_logprobs)
    shift[:, ::2] = torch.log(torch.tensor(4.0))
    shift = shift * batch.action_mask
    shifted = dataclasses.replace(batch, rollout_logprobs=batch.rollout_logprobs - shift)
    expected = ((shift > 0) & batch.action_mask.bool()).sum() / batch.action_mask.bool().sum()
    m = _learner(policy, "algorithm.correction=tis").step(shifted)
    assert abs(m["corr/truncated_frac"] - expected.item()) < 1e-6
    assert m["corr/token_drop_frac"] == 0.0


def test_the_gap_by_staleness_and_position_is_logged(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    learner = _learner(policy)
    m = learner.step(batch)
    assert set(lab_keys()) <= set(m)
    assert abs(m["corr/ess_raw"] - 1) < 1e-6  # logged without a correction too
    assert m["gap/tokens_stale0"] == batch.action_mask.bool().sum().item()
    assert m["gap/k3_stale0"] < 1e-6  # the policy's own log-probs: no mismatch
    assert m["gap/k3_stale1"] is None  # no token one version old
    warm = _learner(policy, "critic.warmup_steps=1").step(batch)
    assert all(warm[k] is None for k in lab_keys())  # same columns in critic-only rows


def test_the_learner_counts_nonfinite_tokens_and_still_steps(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    rollout = batch.rollout_logprobs.clone()
    first = batch.action_mask.bool().nonzero()[:2]
    rollout[first[0, 0], first[0, 1]] = math.nan
    rollout[first[1, 0], first[1, 1]] = -math.inf
    learner = _learner(policy)
    m = learner.step(dataclasses.replace(batch, rollout_logprobs=rollout))
    assert m["mismatch/nonfinite_tokens"] == 2
    assert m["learner/skipped_steps"] == 0 and math.isfinite(m["policy/grad_norm"])
    assert math.isfinite(m["loss/policy"]) and math.isfinite(m["corr/ess_raw"])
    # The critic's gradient norm in units of its clip (the collapse detector's critic_clipped).
    clip = learner.cfg.critic.grad_clip
    assert m["critic/grad_norm_over_clip"] == pytest.approx(m["critic/grad_norm"] / clip)
