"""The field's own test numbers, reproduced through saorl's public functions.

Each case names the test it comes from (SkyRL `skyrl-train/tests/cpu/utils/test_ppo_utils.py`
and `tests/cpu/algorithms/test_off_policy_correction.py`, verl
`tests/trainer/ppo/test_core_algos_on_cpu.py` and `test_rollout_corr.py`, prime-rl
`tests/unit/train/rl/test_loss_numerics.py`, stable-baselines3 `tests/test_gae.py`). The inputs
and expected values are theirs; the code is saorl's. Where saorl differs by design the test
asserts saorl's value and says why in one line; docs/design.md section 1.6 lists those choices.
"""

from __future__ import annotations

import math

import pytest
import torch

from saorl.advantages import group_normalized_advantages, skip_observation_gae
from saorl.corrections import correction_weights, effective_sample_size
from saorl.losses import dis_policy_loss, k3, logprob_mismatch, masked_aggregate

# SkyRL test_ppo_utils.py `advantage_test_data`: one row of three tokens.
REWARDS = torch.tensor([[1.0, 2.0, 3.0]])
VALUES = torch.tensor([[0.5, 1.0, 1.5]])
ALL = torch.ones(1, 3)


@pytest.mark.parametrize(
    ("gamma", "lam", "returns"),
    [
        (1.0, 1.0, [6.0, 5.0, 3.0]),  # SkyRL test_compute_gae_advantage_return
        (0.5, 1.0, [2.75, 3.5, 3.0]),  # SkyRL test_compute_gae_advantage_return_gamma
        (1.0, 0.5, [3.625, 4.25, 3.0]),  # SkyRL test_compute_gae_advantage_return_lam
    ],
)
def test_gae_returns_of_skyrl(gamma, lam, returns):
    adv, ret = skip_observation_gae(REWARDS, VALUES, ALL, gamma, lam)
    torch.testing.assert_close(ret, torch.tensor([returns]))
    torch.testing.assert_close(adv, ret - VALUES)  # saorl does not whiten GAE advantages


def test_gae_with_a_masked_token_skips_it():
    # SkyRL test_compute_gae_advantage_return_with_masking: mask [1, 0, 1] -> returns [6, 5, 3].
    # By design: saorl's GAE skips observation tokens (the paper): the masked reward and value
    # never enter, so returns are [1 + 3, -, 3] = [4, 0, 3].
    _, ret = skip_observation_gae(REWARDS, VALUES, torch.tensor([[1.0, 0.0, 1.0]]), 1.0, 1.0)
    torch.testing.assert_close(ret, torch.tensor([[4.0, 0.0, 3.0]]))


def test_gae_ignores_the_values_of_observation_tokens():
    # verl test_multi_turn_compute_gae_advantage_return: the values at observation positions
    # are random in two copies, and advantages and returns on the action tokens are equal.
    rewards = torch.tensor([[0.0, 0.0, 0.1, 0.1, 0.1, 0.0, 0.0, 0.1, 1.0, 0.0, 0.0]])
    mask = torch.tensor([[0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0]], dtype=torch.float)
    base = torch.tensor([[0.0, 0.0, 4.0, 5.0, 6.0, 0.0, 0.0, 7.0, 9.0, 0.0, 0.0]])
    gen = torch.Generator().manual_seed(0)
    outs = []
    for _ in range(2):
        noise = (torch.rand(base.shape, generator=gen) * 200 - 100) * (1 - mask)
        outs.append(skip_observation_gae(rewards, base + noise, mask, 0.9, 0.7))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=0)
    torch.testing.assert_close(outs[0][1] * mask, outs[1][1] * mask, rtol=0, atol=0)


@pytest.mark.parametrize("episodes", [1, 3])
@pytest.mark.parametrize("gamma", [1.0, 0.99])
@pytest.mark.parametrize("lam", [1.0, 0.9])
@pytest.mark.parametrize("value", [0.0, 1.0])
def test_gae_matches_stable_baselines3s_analytic_grid(episodes, gamma, lam, value):
    # stable-baselines3 test_gae_computation: episodes of 64 steps, reward 1 on the last step
    # only, a constant value function (0, then 1). Closed form with c = gamma * lambda and the
    # step's distance to the end k = 63 - n: delta = (gamma - 1) V before the last step and
    # 1 - V on it, so A_n = c^k (1 - V) + (gamma - 1) V (1 - c^k) / (1 - c) (k V (gamma - 1)
    # when c = 1). One episode is one row here.
    steps = 64
    rewards = torch.zeros(episodes, steps, dtype=torch.float64)
    rewards[:, -1] = 1.0
    values = torch.full_like(rewards, value)
    adv, ret = skip_observation_gae(rewards, values, torch.ones_like(rewards), gamma, lam)
    k = torch.arange(steps - 1, -1, -1, dtype=torch.float64)
    c = gamma * lam
    tail = k if c == 1 else (1 - c**k) / (1 - c)
    expected = c**k * (1 - value) + (gamma - 1) * value * tail
    torch.testing.assert_close(adv, expected.expand(episodes, steps))
    torch.testing.assert_close(ret, adv + value)  # the TD(lambda) return


def test_grpo_advantages_of_skyrl():
    # SkyRL test_compute_grpo_outcome_advantage_norm_std_false: sums [6, 3, 9, 12] in groups
    # [0, 0, 1, 1], no std -> [1.5, -1.5, -1.5, 1.5].
    rewards, groups = torch.tensor([6.0, 3.0, 9.0, 12.0]), torch.tensor([0, 0, 1, 1])
    got = group_normalized_advantages(rewards, groups, std_norm=False)
    torch.testing.assert_close(got, torch.tensor([1.5, -1.5, -1.5, 1.5]))
    # By design: GRPO divides by the group's population std (the paper), 1.5 here -> +-1
    # (SkyRL's default divides by the sample std, sqrt(2) * 1.5 -> +-0.7071).
    got = group_normalized_advantages(rewards, groups)
    torch.testing.assert_close(got, torch.tensor([1.0, -1.0, -1.0, 1.0]), atol=1e-5, rtol=0)


def test_loss_aggregation_of_skyrl():
    # SkyRL test_reduce_loss: token_mean 2.5, sequence_mean 3.0.
    loss = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert masked_aggregate(loss, mask, "token_mean").item() == pytest.approx(2.5)
    assert masked_aggregate(loss, mask, "seq_mean_token_mean").item() == pytest.approx(3.0)


def test_k3_of_skyrl():
    # SkyRL test_compute_approx_kl: k3 = exp(-d) - 1 + d with d = logp - logp_base; saorl's
    # k3 takes log p - log q of KL(q || p), the same estimator with the sign of d flipped.
    logp, base = torch.tensor([0.2, 0.3]), torch.tensor([0.1, 0.2])
    d = logp - base
    torch.testing.assert_close(k3(-d), torch.exp(-d) - 1 + d)
    assert k3(-d)[0].item() == pytest.approx(math.exp(-0.1) - 0.9)


def test_token_tis_of_skyrl():
    # SkyRL test_compute_tis_ratio_token_level: ratios exp([0.5, -0.5, 1]), cap 2 ->
    # [1.6487, 0.6065, 2.0], one token of three capped.
    lr = torch.tensor([[-1.0, -1.5, -0.5]]) - torch.tensor([[-1.5, -1.0, -1.5]])
    w, m = correction_weights(lr, ALL, "tis", high=2.0)
    torch.testing.assert_close(w, torch.tensor([[1.6487, 0.6065, 2.0]]), rtol=1e-3, atol=1e-4)
    assert m["corr/truncated_frac"] == pytest.approx(1 / 3)


@pytest.mark.parametrize(
    ("kind", "trainer", "rollout", "kept", "weight"),
    [
        # SkyRL test_compute_sequence_mask_geometric(_rejects): band [0.9, 1.1].
        ("geo_rs", [-1.0, -1.1, -1.0], [-1.1, -1.0, -1.0], True, 1.0),
        ("geo_rs", [-1.0, -1.0, -1.0], [-1.5, -1.5, -1.5], False, 0.0),
        # SkyRL test_compute_sequence_mask_product(_rejects_by_seq_ratio): band [0.5, 2].
        # By design: seq_mis (Liu, Li et al.) weighs a kept row by its ratio, exp(0.3), where
        # SkyRL's mask keeps it with weight 1.
        ("seq_mis", [-1.0, -1.1, -1.2], [-1.2, -1.2, -1.2], True, math.exp(0.3)),
        ("seq_mis", [-1.0, -1.0, -1.0], [-2.0, -2.0, -2.0], False, 0.0),
    ],
)
def test_sequence_rejection_of_skyrl(kind, trainer, rollout, kept, weight):
    band = (0.9, 1.1) if kind == "geo_rs" else (0.5, 2.0)
    lr = torch.tensor([trainer]) - torch.tensor([rollout])
    w, m = correction_weights(lr, ALL, kind, *band)
    torch.testing.assert_close(w, torch.full((1, 3), weight), rtol=1e-5, atol=1e-6)
    assert m["corr/seq_drop_frac"] == (0.0 if kept else 1.0)


def test_rollout_correction_weights_and_band_of_verl():
    # verl test_rollout_corr.py test_mask_mode: trainer -2, engine -1 / -2.5 on rows of 5 ->
    # IS weights 0.368 and 1.649; rejection band [0.5, 2] drops row 0: half the tokens.
    trainer = torch.full((2, 5), -2.0)
    rollout = torch.tensor([[-1.0] * 5, [-2.5] * 5])
    mask = torch.ones(2, 5)
    w, _ = correction_weights(trainer - rollout, mask, "tis", high=2.0)
    torch.testing.assert_close(w[:, 0], torch.tensor([0.368, 1.649]), atol=0.01, rtol=0)
    w, m = correction_weights(trainer - rollout, mask, "token_mis", 0.5, 2.0)
    assert torch.all(w[0] == 0) and torch.allclose(w[1], torch.tensor(math.exp(0.5)))
    assert m["corr/token_drop_frac"] == pytest.approx(0.5)
    # By design: rejected tokens stay in the loss's denominator (masking shrinks a step, it
    # never rescales the rest): the kept row's loss is divided by 10 tokens, not verl's 5.
    logp = trainer.clone().requires_grad_()
    loss, _ = dis_policy_loss(logp, trainer, torch.ones(2, 5), mask, 0.3, 5.0, token_weights=w)
    loss.backward()
    torch.testing.assert_close(logp.grad[1], torch.full((5,), -math.exp(0.5) / 10))
    assert torch.all(logp.grad[0] == 0)


def test_icepop_weights_and_ess():
    # IcePop (Ling Team 2025) band [0.5, 5]: ratios 0.3, 0.8, 6 -> weights [0, 0.8, 0]; the
    # normalised ESS (sum w)^2 / (n sum w^2) = 0.64 / (3 * 0.64) = 1/3 (issue 43's comparison).
    lr = torch.log(torch.tensor([[0.3, 0.8, 6.0]]))
    w, m = correction_weights(lr, ALL, "icepop")
    torch.testing.assert_close(w, torch.tensor([[0.0, 0.8, 0.0]]))
    assert m["corr/ess"] == pytest.approx(1 / 3)
    assert effective_sample_size(w, ALL).item() == pytest.approx(1 / 3)


def _one_token(trainer: float, engine: float) -> tuple[torch.Tensor, torch.Tensor, dict]:
    logp = torch.tensor([[trainer]], requires_grad=True)
    loss, m = dis_policy_loss(logp, torch.tensor([[engine]]), torch.ones(1, 1), ALL[:, :1], 0.3, 5)
    loss.backward()
    return loss, logp.grad, m


def test_the_importance_gradient_of_prime_rl():
    # prime-rl test_default_loss_preserves_unclipped_importance_gradient: trainer -2, engine -3,
    # advantage 1 -> gradient -e. By design the loss value differs: DIS's surrogate is
    # -sg(r) A logp (paper Eq. 3) = 2e, prime-rl's -r A = -e; the gradients are the same.
    loss, grad, m = _one_token(-2.0, -3.0)
    assert grad.item() == pytest.approx(-math.e)
    assert loss.item() == pytest.approx(2 * math.e)
    assert m["dis/masked_frac"] == 0.0


def test_a_masked_overflow_has_zero_gradient_as_in_prime_rl():
    # prime-rl test_default_loss_masked_overflow_ratio_does_not_nan: trainer -1, engine -91
    # (log-ratio 90) -> finite loss and metrics, gradient 0, the token masked.
    loss, grad, m = _one_token(-1.0, -91.0)
    assert math.isfinite(loss.item()) and all(math.isfinite(v) for v in m.values())
    assert grad.item() == 0.0 and m["dis/masked_frac"] == 1.0


def test_an_overflow_is_masked_not_capped():
    # prime-rl test_default_loss_clips_unmasked_overflow_ratio: trainer -2, engine -91 with
    # importance_ratio_max 20 -> loss and gradient -20. By design: DIS has no cap-and-keep,
    # a token outside the band gets no gradient (paper Eq. 2).
    loss, grad, m = _one_token(-2.0, -91.0)
    assert loss.item() == 0.0 and grad.item() == 0.0 and m["dis/masked_frac_above"] == 1.0
    # prime-rl test_mismatch_kl_stays_finite_for_overflow_log_ratio: finite, non-negative.
    mm = logprob_mismatch(torch.tensor([[-2.0]]), torch.tensor([[-91.0]]), ALL[:, :1])
    assert math.isfinite(mm["mismatch/k3"]) and mm["mismatch/k3"] >= 0
