"""`logprob_mismatch` (engine vs learner log-probs) and its wiring into the learner step.

DIS reads engine/learner disagreement as if it were staleness, so the learner logs it every
step, for every engine, on the tokens sampled by the policy version it holds.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

from saorl.learner.learner import Learner
from saorl.losses import logprob_mismatch
from saorl.models.logprobs import sequence_logprobs
from saorl.types import Batch, Trajectory
from tests.conftest import tiny_config


def test_hand_computed_values():
    # d = learner - engine = [0.1, -0.2] on the mask; the third token is masked out (and huge).
    lp = torch.tensor([[-1.0, -2.2, 5.0]])
    rollout = torch.tensor([[-1.1, -2.0, -50.0]])
    mask = torch.tensor([[1, 1, 0]])
    m = logprob_mismatch(lp, rollout, mask)
    # k3 = mean(exp(d) - 1 - d) = ((e^0.1 - 1.1) + (e^-0.2 - 0.8)) / 2
    k3 = ((math.exp(0.1) - 1.1) + (math.exp(-0.2) - 0.8)) / 2
    assert m["mismatch/k3"] == pytest.approx(k3, rel=1e-5)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(0.2, rel=1e-5)
    assert m["mismatch/tokens"] == 2
    # Exact agreement and an empty mask both give zeros; k3 is never negative.
    same = logprob_mismatch(lp, lp, mask)
    assert same["mismatch/k3"] == 0 and same["mismatch/max_abs_logprob_diff"] == 0
    empty = logprob_mismatch(lp, rollout, torch.zeros_like(mask))
    assert empty == {
        "mismatch/k3": 0.0,
        "mismatch/max_abs_logprob_diff": 0.0,
        "mismatch/tokens": 0.0,
    }
    d = torch.randn(4, 7) * 3
    assert logprob_mismatch(d, torch.zeros(4, 7), torch.ones(4, 7))["mismatch/k3"] >= 0
    with pytest.raises(ValueError, match="shape"):
        logprob_mismatch(lp, rollout[:, :2], mask)


def _batch(policy, versions: list[int]) -> Batch:
    """Rows whose rollout log-probs are the policy's own, except rows of version != 0, which
    are off by +0.5 (as if sampled by an older policy)."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i, v in enumerate(versions):
        p_len, c_len = 3, 2 + i % 4
        ids = torch.randint(3, 90, (p_len + c_len,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, p_len:]
        lp = (lp + (0.5 if v else 0.0)).tolist()
        trajs.append(Trajectory(ids[:p_len], ids[p_len:], [1] * c_len, lp, [v] * c_len, 1.0 * i))
    return Batch.from_trajectories(trajs, pad_id=0)


def test_learner_logs_mismatch_on_current_version_tokens_only(tiny_policy):
    policy, _ = tiny_policy
    versions = [0, -3, 0, 0, -3, 0, 0, -3]  # -3: a stale version, never the learner's
    batch = _batch(policy, versions)
    cfg = tiny_config("critic.warmup_steps=0", "learner.micro_batch_size=3")
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    m = learner.step(batch)
    on_policy = sum(2 + i % 4 for i, v in enumerate(versions) if v == 0)
    assert m["mismatch/tokens"] == on_policy
    # Same weights, same code path: only the stale rows disagree, and they are left out.
    assert m["mismatch/k3"] == pytest.approx(0.0, abs=1e-9)
    assert m["mismatch/max_abs_logprob_diff"] < 1e-5
    # After the update the batch holds no token of the learner's version: null, not 0.
    m2 = learner.step(batch)
    assert m2["mismatch/tokens"] == 0 and m2["mismatch/k3"] is None
    assert m2["mismatch/max_abs_logprob_diff"] is None


def test_learner_mismatch_sees_a_perturbed_engine(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy, [0] * 4)
    batch.rollout_logprobs = (batch.rollout_logprobs + 0.1) * batch.action_mask
    cfg = tiny_config("critic.warmup_steps=0")
    m = Learner(cfg, copy.deepcopy(policy), torch.device("cpu")).step(batch)
    # d = -0.1 on every action token: k3 = e^-0.1 - 1 + 0.1.
    assert m["mismatch/k3"] == pytest.approx(math.exp(-0.1) - 0.9, rel=1e-3)
    assert m["mismatch/max_abs_logprob_diff"] == pytest.approx(0.1, rel=1e-3)
