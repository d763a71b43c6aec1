"""Unit tests for saorl.losses: hand-computed values (derivations inline) and properties."""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from saorl.losses import (
    dis_policy_loss,
    masked_aggregate,
    positive_lm_loss,
    ppo_clip_policy_loss,
    sampler_kl_penalty,
    value_loss,
)

PROPERTY = settings(max_examples=40, deadline=None)


def _logprobs_for_ratios(ratios: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """logprobs = log(r) against rollout/old logprobs = 0, so exp(lp - 0) = r (up to rounding)."""
    lp = torch.tensor(ratios, dtype=torch.float64).log().requires_grad_(True)
    return lp, torch.zeros_like(lp)


# ----------------------------------------------------------------------------- aggregation


def test_masked_aggregate_both_modes_by_hand() -> None:
    # Masked-out entries hold NaN and inf: they must reach neither mode.
    nan, inf = math.nan, math.inf
    x = torch.tensor([[1.0, 2.0, nan], [4.0, inf, 0.0], [5.0, 6.0, 0.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0]])
    # token_mean: (1 + 2 + 4) / 3 action tokens.
    assert masked_aggregate(x, mask, "token_mean").item() == pytest.approx(7 / 3)
    # seq_mean_token_mean: row 0 -> (1 + 2) / 2 = 1.5, row 1 -> 4 / 1 = 4, row 2 has no action
    # token and is left out: (1.5 + 4) / 2 = 2.75.
    assert masked_aggregate(x, mask, "seq_mean_token_mean").item() == pytest.approx(2.75)
    # Bool masks are accepted and mean the same.
    assert masked_aggregate(x, mask.bool()).item() == pytest.approx(7 / 3)


def test_masked_aggregate_empty_mask_is_zero_not_nan() -> None:
    x = torch.randn(2, 3, requires_grad=True)
    for agg in ("token_mean", "seq_mean_token_mean"):
        out = masked_aggregate(x, torch.zeros(2, 3), agg)  # type: ignore[arg-type]
        assert out.item() == 0.0
        out.backward()
    assert x.grad is not None and torch.equal(x.grad, torch.zeros(2, 3))


def test_bad_agg_raises_and_names_allowed_values() -> None:
    x = torch.ones(1, 2)
    with pytest.raises(ValueError, match="token_mean, seq_mean_token_mean"):
        masked_aggregate(x, torch.ones(1, 2), "sum")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="seq_mean_token_mean"):
        dis_policy_loss(x, x, x, x, 0.2, 0.28, agg="mean")  # type: ignore[arg-type]


def test_shape_mismatch_raises() -> None:
    with pytest.raises(ValueError, match="same shape"):
        dis_policy_loss(
            torch.ones(2, 3), torch.ones(2, 3), torch.ones(2, 2), torch.ones(2, 3), 0.2, 0.2
        )


# ----------------------------------------------------------------------------- DIS


def test_dis_by_hand_both_signs_in_below_above() -> None:
    # eps_low=0.2, eps_high=0.28: band is the open interval (0.8, 1.28).
    # Row 0, A=+2: r = 1.1 (in), 0.5 (below), 2.0 (above).
    # Row 1, A=-1: r = 0.9 (in), 0.7 (below), 1.3 (above).
    # Column 3 is padding (mask 0) with -inf log-probs and a NaN advantage.
    lp, rollout = _logprobs_for_ratios([[1.1, 0.5, 2.0, 1.0], [0.9, 0.7, 1.3, 1.0]])
    with torch.no_grad():
        lp[:, 3] = -math.inf
    adv = torch.tensor([[2.0, 2.0, 2.0, math.nan], [-1.0, -1.0, -1.0, math.nan]])
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 0]])
    loss, metrics = dis_policy_loss(lp, rollout, adv, mask, eps_low=0.2, eps_high=0.28)
    # Only in-band tokens contribute -r*A*log(r); N = 6 action tokens (out-of-band stay in N):
    #   (0,0): -1.1 * 2 * log(1.1) = -0.2096824
    #   (1,0): -0.9 * (-1) * log(0.9) = -0.0948245
    #   loss = (-0.2096824 - 0.0948245) / 6 = -0.0507512
    expected = (-1.1 * 2 * math.log(1.1) + 0.9 * math.log(0.9)) / 6
    assert loss.item() == pytest.approx(expected, rel=1e-9)
    loss.backward()
    # d loss / d lp = -r*A/N in band, exactly 0 out of band and on padding:
    #   (0,0): -1.1 * 2 / 6 = -0.3667;  (1,0): -0.9 * (-1) / 6 = +0.15
    expected_grad = torch.tensor(
        [[-1.1 * 2 / 6, 0.0, 0.0, 0.0], [0.9 / 6, 0.0, 0.0, 0.0]], dtype=torch.float64
    )
    assert lp.grad is not None
    torch.testing.assert_close(lp.grad, expected_grad)
    assert lp.grad[:, 1:].eq(0).all()  # exact zeros, not just small
    assert metrics["dis/masked_frac"] == pytest.approx(4 / 6)
    assert metrics["dis/masked_frac_below"] == pytest.approx(2 / 6)  # 0.5 and 0.7
    assert metrics["dis/masked_frac_above"] == pytest.approx(2 / 6)  # 2.0 and 1.3
    # ratio_mean = (1.1 + 0.5 + 2.0 + 0.9 + 0.7 + 1.3) / 6 = 6.5 / 6
    assert metrics["dis/ratio_mean"] == pytest.approx(6.5 / 6)
    assert metrics["dis/ratio_min"] == pytest.approx(0.5)
    assert metrics["dis/ratio_max"] == pytest.approx(2.0)
    # k3 of KL(rollout || current) = mean of r - 1 - log r over the 6 action tokens.
    ratios = [1.1, 0.5, 2.0, 0.9, 0.7, 1.3]
    k3 = sum(r - 1 - math.log(r) for r in ratios) / 6
    assert metrics["dis/kl_k3"] == pytest.approx(k3)
    assert metrics["loss/policy"] == pytest.approx(expected, rel=1e-9)
    assert all(isinstance(v, float) for v in metrics.values())


def test_dis_band_is_strict() -> None:
    # r = exp(0) = 1 exactly. eps_low = 0 puts the lower edge at 1: 1 < 1 is false, so the
    # token is out of band (below); eps_high = 0 likewise puts it above.
    lp = torch.zeros(1, 1, requires_grad=True)
    rollout, adv, mask = torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1)
    _, below = dis_policy_loss(lp, rollout, adv, mask, eps_low=0.0, eps_high=0.5)
    _, above = dis_policy_loss(lp, rollout, adv, mask, eps_low=0.5, eps_high=0.0)
    assert below["dis/masked_frac_below"] == 1.0 and below["dis/masked_frac_above"] == 0.0
    assert above["dis/masked_frac_above"] == 1.0 and above["dis/masked_frac_below"] == 0.0
    loss, inside = dis_policy_loss(lp, rollout, adv, mask, eps_low=0.5, eps_high=0.5)
    assert inside["dis/masked_frac"] == 0.0
    loss.backward()
    assert lp.grad is not None and lp.grad.item() == pytest.approx(-1.0)  # -r*A/N = -1


def test_dis_all_zero_mask_gives_zeros_and_no_nan() -> None:
    lp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = dis_policy_loss(
        lp, torch.randn(2, 3), torch.randn(2, 3), torch.zeros(2, 3, dtype=torch.bool), 0.3, 5.0
    )
    assert loss.item() == 0.0
    loss.backward()
    assert lp.grad is not None and torch.equal(lp.grad, torch.zeros(2, 3))
    assert all(v == 0.0 for v in metrics.values()), metrics


def test_dis_seq_mean_token_mean_gradient() -> None:
    # Row 0 has 1 action token (in band), row 1 has 3 (one in band). Each row is averaged over
    # its own tokens, then the 2 rows are averaged: grad = -r*A / (n_b * 2).
    lp, rollout = _logprobs_for_ratios([[1.0, 1.0, 1.0], [1.0, 9.0, 9.0]])
    adv = torch.tensor([[1.0, 0.0, 0.0], [3.0, 3.0, 3.0]])
    mask = torch.tensor([[1, 0, 0], [1, 1, 1]])
    loss, _ = dis_policy_loss(lp, rollout, adv, mask, 0.2, 0.28, agg="seq_mean_token_mean")
    loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(
        lp.grad,
        torch.tensor([[-1.0 / 2, 0.0, 0.0], [-3.0 / 6, 0.0, 0.0]], dtype=torch.float64),
    )


_small = st.floats(min_value=-3.0, max_value=3.0, allow_nan=False, width=32)


@st.composite
def _dis_inputs(draw: st.DrawFn) -> tuple[torch.Tensor, ...]:
    b = draw(st.integers(1, 4))
    t = draw(st.integers(1, 8))

    def mat(elems: st.SearchStrategy) -> torch.Tensor:
        return torch.tensor(
            draw(st.lists(st.lists(elems, min_size=t, max_size=t), min_size=b, max_size=b))
        )

    lp = mat(st.floats(-4.0, 0.0, width=32))
    # rollout log-prob within +-2 nats of lp, so ratios span e^-2..e^2: both sides of the band.
    rollout = lp + mat(st.floats(-2.0, 2.0, width=32))
    adv = mat(_small)
    mask = mat(st.booleans())
    return lp, rollout, adv, mask


@PROPERTY
@given(_dis_inputs(), st.floats(0.05, 0.9), st.floats(0.05, 5.0))
def test_dis_gradient_zero_out_of_band_and_minus_r_a_over_n_in_band(
    inputs: tuple[torch.Tensor, ...], eps_low: float, eps_high: float
) -> None:
    lp, rollout, adv, mask = inputs
    lp = lp.clone().requires_grad_(True)
    loss, metrics = dis_policy_loss(lp, rollout, adv, mask, eps_low, eps_high)
    loss.backward()
    assert lp.grad is not None
    ratio = torch.exp(lp.detach() - rollout)
    in_band = (ratio > 1 - eps_low) & (ratio < 1 + eps_high) & mask
    n = max(int(mask.sum()), 1)
    # Exactly zero (not approximately) off the band and off the mask.
    assert torch.equal(lp.grad[~in_band], torch.zeros_like(lp.grad[~in_band]))
    torch.testing.assert_close(lp.grad[in_band], (-ratio * adv)[in_band] / n)
    assert metrics["dis/masked_frac"] == pytest.approx(
        float((~in_band & mask).sum()) / n if mask.any() else 0.0
    )
    assert metrics["dis/kl_k3"] >= 0.0


def test_dis_metrics_do_not_touch_gradients() -> None:
    # The loss built by hand from the documented equation must give the same gradient.
    torch.manual_seed(0)
    lp = (torch.randn(3, 5) * 0.3 - 1).requires_grad_(True)
    rollout = lp.detach() + torch.randn(3, 5) * 0.3
    adv, mask = torch.randn(3, 5), torch.rand(3, 5) > 0.3
    loss, _ = dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0)
    (grad,) = torch.autograd.grad(loss, lp)
    r = torch.exp(lp.detach() - rollout)
    f = torch.where((r > 0.7) & (r < 6.0), r, torch.zeros_like(r))
    manual = (-f * adv * lp * mask).sum() / mask.sum()
    (manual_grad,) = torch.autograd.grad(manual, lp)
    torch.testing.assert_close(grad, manual_grad)
    torch.testing.assert_close(loss, manual)


# ----------------------------------------------------------------------------- PPO


def test_ppo_clip_higher_by_hand_both_sides() -> None:
    # eps_low=0.2, eps_high=0.28: clip range [0.8, 1.28]. loss_t = max(-A r, -A clip(r)).
    # Row 0, A=+1:
    #   r=1.5: max(-1.5, -1.28) = -1.28, clipped (high side) -> grad 0
    #   r=0.5: max(-0.5, -0.8)  = -0.5,  unclipped           -> grad -A r = -0.5
    #   r=1.0: -1.0, unclipped                                -> grad -1.0
    # Row 1, A=-1:
    #   r=0.5: max(0.5, 0.8) = 0.8, clipped (low side)        -> grad 0
    #   r=1.5: max(1.5, 1.28) = 1.5, unclipped                -> grad -A r = +1.5
    #   r=1.0: 1.0, unclipped                                 -> grad +1.0
    # token_mean over N=6: (-1.28 - 0.5 - 1.0 + 0.8 + 1.5 + 1.0) / 6 = 0.52 / 6.
    lp, old = _logprobs_for_ratios([[1.5, 0.5, 1.0], [0.5, 1.5, 1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    loss, metrics = ppo_clip_policy_loss(lp, old, adv, torch.ones(2, 3), 0.2, 0.28)
    assert loss.item() == pytest.approx(0.52 / 6)
    loss.backward()
    assert lp.grad is not None
    torch.testing.assert_close(
        lp.grad,
        torch.tensor([[0.0, -0.5, -1.0], [0.0, 1.5, 1.0]], dtype=torch.float64) / 6,
    )
    assert metrics["ppo/clip_frac"] == pytest.approx(2 / 6)
    assert metrics["ppo/clip_frac_low"] == pytest.approx(1 / 6)
    assert metrics["ppo/clip_frac_high"] == pytest.approx(1 / 6)
    assert metrics["ppo/ratio_mean"] == pytest.approx((1.5 + 0.5 + 1.0) * 2 / 6)
    k3 = 2 * sum(r - 1 - math.log(r) for r in (1.5, 0.5, 1.0)) / 6
    assert metrics["ppo/kl_k3"] == pytest.approx(k3)
    assert metrics["loss/policy"] == pytest.approx(0.52 / 6)


def test_ppo_ignores_padding_garbage() -> None:
    lp = torch.tensor([[0.0, -math.inf]], requires_grad=True)
    old = torch.tensor([[0.0, math.nan]])
    loss, metrics = ppo_clip_policy_loss(
        lp, old, torch.tensor([[2.0, math.nan]]), torch.tensor([[1, 0]]), 0.2, 0.28
    )
    # r = 1 on the single action token: loss = -A * 1 = -2, grad -2.
    assert loss.item() == pytest.approx(-2.0)
    loss.backward()
    assert lp.grad is not None and lp.grad.tolist() == [[-2.0, 0.0]]
    assert not any(math.isnan(v) for v in metrics.values())


# ----------------------------------------------------------------------------- value


def test_sampler_kl_penalty_is_k3_of_current_minus_rollout_by_hand() -> None:
    # Ratios rho = current / rollout of 2 and 1/2 on two action tokens, a padded third token.
    # The rollout sampled the tokens, so the unbiased k3 of KL(rollout || current) is
    # rho - 1 - log rho per token: 2 - 1 - log 2 = 0.3069 and 1/2 - 1 + log 2 = 0.1931, mean
    # 0.25. The mirrored form 1/rho - 1 + log rho would give 0.1931 and 0.3069 for the tokens
    # in the other order: the same mean here, so the gradients tell the two apart.
    lp, rollout = _logprobs_for_ratios([[2.0, 0.5, 1.0]])
    mask = torch.tensor([[1, 1, 0]])
    loss = sampler_kl_penalty(lp, rollout, mask)
    assert loss.item() == pytest.approx(0.25)
    loss.backward()
    # d/d logp of (rho - 1 - log rho) / 2 tokens = (rho - 1) / 2: 0.5 and -0.25, none on padding
    # (the mirrored form's gradient would be (1 - 1/rho) / 2: 0.25 and -0.5).
    assert lp.grad[0].tolist() == pytest.approx([0.5, -0.25, 0.0])
    # The sampler's log-probs are data: no gradient flows to them.
    assert not sampler_kl_penalty(lp.detach(), rollout.requires_grad_(True), mask).requires_grad
    # The learner's penalty is this function (an update that matches the sampler costs 0).
    assert sampler_kl_penalty(rollout.detach(), rollout.detach(), mask).item() == 0.0


def test_value_loss_unclipped_by_hand() -> None:
    # V = [1.0, 2.0, 0.5], R = [1.5, 1.0, 0.5]; 0.5 (V - R)^2 = [0.125, 0.5, 0.0];
    # token_mean = 0.625 / 3; grad = (V - R) / 3 = [-0.5, 1.0, 0.0] / 3.
    # The 4th token is padding with NaN value and return.
    values = torch.tensor([[1.0, 2.0, 0.5, math.nan]], requires_grad=True)
    returns = torch.tensor([[1.5, 1.0, 0.5, math.nan]])
    mask = torch.tensor([[1, 1, 1, 0]])
    loss, metrics = value_loss(values, returns, mask)
    assert loss.item() == pytest.approx(0.625 / 3)
    loss.backward()
    assert values.grad is not None
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5, 1.0, 0.0, 0.0]]) / 3)
    assert "value/clip_frac" not in metrics
    assert metrics["value/mean"] == pytest.approx(3.5 / 3)
    assert metrics["value/returns_mean"] == pytest.approx(1.0)
    # Var(R) = mean of (0.5, 0, -0.5)^2 = 1/6. R - V = [0.5, -1, 0], mean -1/6, deviations
    # [2/3, -5/6, 1/6], Var = (4/9 + 25/36 + 1/36) / 3 = (7/6) / 3 = 7/18.
    # EV = 1 - (7/18) / (1/6) = 1 - 7/3 = -4/3.
    assert metrics["value/explained_variance"] == pytest.approx(-4 / 3)
    assert metrics["loss/value"] == pytest.approx(0.625 / 3)


def test_value_loss_clipped_by_hand() -> None:
    # clip = 0.2, V_old = [1.0, 2.5, 0.0]:
    #   V_clip = V_old + clamp(V - V_old, -0.2, 0.2) = [1.0, 2.3, 0.2]
    #   clipped  0.5 (V_clip - R)^2 = [0.125, 0.5 * 1.3^2 = 0.845, 0.5 * 0.3^2 = 0.045]
    #   unclipped                   = [0.125, 0.5, 0.0]
    #   max = [0.125, 0.845, 0.045] -> token_mean = 1.015 / 3
    # Tokens 1 and 2 take the clipped branch where V_clip is clamped: grad 0. Token 0 is a tie
    # with V_clip = V, and both branches have gradient (V - R)/3 = -0.5/3.
    values = torch.tensor([[1.0, 2.0, 0.5]], requires_grad=True)
    returns = torch.tensor([[1.5, 1.0, 0.5]])
    old = torch.tensor([[1.0, 2.5, 0.0]])
    loss, metrics = value_loss(values, returns, torch.ones(1, 3), old_values=old, clip=0.2)
    assert loss.item() == pytest.approx(1.015 / 3)
    loss.backward()
    assert values.grad is not None
    torch.testing.assert_close(values.grad, torch.tensor([[-0.5 / 3, 0.0, 0.0]]))
    assert metrics["value/clip_frac"] == pytest.approx(2 / 3)


def test_value_loss_needs_old_values_and_clip_together() -> None:
    v = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="together"):
        value_loss(v, v, torch.ones(1, 2), old_values=v)
    with pytest.raises(ValueError, match="together"):
        value_loss(v, v, torch.ones(1, 2), clip=0.2)


def test_value_explained_variance_edge_cases() -> None:
    # Constant returns: Var(R) = 0, so explained variance is defined as 0.
    v = torch.tensor([[0.3, 0.9, 0.1]])
    _, metrics = value_loss(v, torch.full((1, 3), 0.7), torch.ones(1, 3))
    assert metrics["value/explained_variance"] == 0.0
    # Perfect predictions explain everything.
    r = torch.tensor([[0.0, 1.0, 2.0]])
    _, metrics = value_loss(r.clone(), r, torch.ones(1, 3))
    assert metrics["value/explained_variance"] == pytest.approx(1.0)
    # No action tokens: loss 0 and every metric 0.
    loss, metrics = value_loss(v, r, torch.zeros(1, 3), old_values=v, clip=0.1)
    assert loss.item() == 0.0 and all(m == 0.0 for m in metrics.values())


# ----------------------------------------------------------------------------- positive LM loss


def test_positive_lm_loss_by_hand() -> None:
    # Rows 0 and 2 are correct; row 1 is not and must not count. Column 3 of row 0 is padding
    # (mask 0) holding -inf; row 2 has one action token.
    nan, inf = math.nan, math.inf
    lp = torch.tensor(
        [[-0.5, -1.0, -2.0, -inf], [-3.0, -4.0, nan, 0.0], [-0.25, 0.0, 0.0, 0.0]],
        dtype=torch.float64,
        requires_grad=True,
    )
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 0, 0, 0]])
    positive = torch.tensor([True, False, True])
    loss, metrics = positive_lm_loss(lp, mask, positive)
    # token_mean over the 4 action tokens of the correct rows: (0.5 + 1 + 2 + 0.25) / 4.
    assert loss.item() == pytest.approx(3.75 / 4)
    assert metrics["loss/lm"] == pytest.approx(3.75 / 4)
    assert metrics["lm/positive_frac"] == pytest.approx(2 / 3)
    loss.backward()
    assert lp.grad is not None
    # d/dlogp of -logp / 4 on the correct rows' action tokens, 0 everywhere else (no NaN).
    expected = torch.zeros(3, 4, dtype=torch.float64)
    expected[0, :3] = -0.25
    expected[2, 0] = -0.25
    assert torch.equal(lp.grad, expected)
    # seq_mean_token_mean: row 0 -> 3.5 / 3, row 2 -> 0.25; their mean.
    seq, _ = positive_lm_loss(lp.detach(), mask, positive, "seq_mean_token_mean")
    assert seq.item() == pytest.approx((3.5 / 3 + 0.25) / 2)


def test_positive_lm_loss_without_correct_rows_is_zero() -> None:
    lp = torch.randn(2, 3, requires_grad=True)
    loss, metrics = positive_lm_loss(lp, torch.ones(2, 3), torch.zeros(2))
    assert loss.item() == 0.0 and metrics["lm/positive_frac"] == 0.0
    loss.backward()
    assert lp.grad is not None and torch.equal(lp.grad, torch.zeros(2, 3))


def test_positive_lm_loss_checks_the_row_flags_shape() -> None:
    with pytest.raises(ValueError, match=r"\(B,\) tensor"):
        positive_lm_loss(torch.zeros(2, 3), torch.ones(2, 3), torch.ones(2, 3))
