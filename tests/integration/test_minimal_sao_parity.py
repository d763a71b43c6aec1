"""`examples/minimal_sao.py`'s `sao_step` is the learner's SAO step: on the same batch and
weights it computes the same losses and leaves the same policy and critic weights as
`Learner.step` (critic values before any update, adaptive-lambda GAE, K critic updates, one
DIS policy update). Numerics differ only in kernels (chunked log-probs, fused AdamW)."""

from __future__ import annotations

import copy
import importlib.util
from pathlib import Path
from types import ModuleType

import pytest
import torch

from saorl.learner.learner import Learner
from saorl.models.logprobs import sequence_logprobs
from saorl.types import Batch, Trajectory
from tests.conftest import tiny_config

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "minimal_sao.py"


def _example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("minimal_sao", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _batch(policy, n: int = 8) -> Batch:
    """Single-turn rollouts whose recorded log-probs are off the policy's by up to +-1.5, so
    the DIS ratios fall inside and outside the band, with 0/1 rewards."""
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(n):
        p_len, c_len = 3 + i % 3, 2 + (i * 5) % 6
        ids = torch.randint(3, 90, (p_len + c_len,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, p_len:]
        lp = lp + (torch.rand(c_len, generator=g) * 3 - 1.5)
        trajs.append(
            Trajectory(
                ids[:p_len],
                ids[p_len:],
                [1] * c_len,
                lp.tolist(),
                [0] * c_len,
                reward=float(i % 3 == 0),
            )
        )
    return Batch.from_trajectories(trajs, pad_id=0)


@pytest.mark.parametrize("update_policy", [True, False])
def test_minimal_sao_step_is_the_learner_step(tiny_policy, update_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    warmup = 0 if update_policy else 1  # a critic warm-up step: no policy update
    cfg = tiny_config(
        f"critic.warmup_steps={warmup}",
        "learner.lr_warmup_steps=0",
        "learner.batch_size=8",
        "learner.micro_batch_size=8",
    )
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    sao = _example()
    args = sao.parse_args(
        ["--lr", str(cfg.learner.lr), "--critic-lr-mult", str(cfg.critic.lr / cfg.learner.lr)]
    )
    # The example's settings are the learner's defaults.
    algo = cfg.algorithm
    ours = (args.eps_low, args.eps_high, args.lambda_alpha, args.critic_updates)
    assert ours == (algo.eps_low, algo.eps_high, algo.lambda_alpha, cfg.critic.updates_per_step)
    assert args.temperature == cfg.rollout.temperature
    s_policy, s_critic = copy.deepcopy(learner.policy), copy.deepcopy(learner.critic)
    s_policy_opt, s_critic_opt = sao.optimizers(s_policy, s_critic, args)

    metrics = learner.step(batch)
    m = sao.sao_step(batch, s_policy, s_critic, s_policy_opt, s_critic_opt, args, update_policy)

    keys = ["value/explained_variance", "loss/value"]
    if update_policy:
        keys += ["loss/policy", "dis/masked_frac"]
        assert 0 < metrics["dis/masked_frac"] < 1  # the band masks some tokens, not all
    for key in keys:
        assert m[key] == pytest.approx(metrics[key], rel=1e-4, abs=1e-6), key
    # The updated weights: the policy moved (or not, in the warm-up) as the learner's did, and
    # the critic took the same K steps (frozen attention unchanged on both sides).
    for name, p in learner.policy.named_parameters():
        ours = dict(s_policy.named_parameters())[name]
        assert torch.allclose(p, ours, atol=1e-6, rtol=1e-4), name
        moved = not torch.equal(p, dict(policy.named_parameters())[name])
        assert moved == update_policy, name
    for name, p in learner.critic.named_parameters():
        ours = dict(s_critic.named_parameters())[name]
        assert torch.allclose(p, ours, atol=1e-6, rtol=1e-4), name
