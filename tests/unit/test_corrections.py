"""Mismatch corrections (saorl.corrections): weights and diagnostics derived by hand."""

from __future__ import annotations

import math

import pytest
import torch

from saorl.corrections import CORRECTIONS, PRESETS, correction_weights, effective_sample_size

LN = math.log


def _ratios(rows: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    """log-ratios and mask from rows of ratios; None-free rows padded with a masked slot."""
    width = max(len(r) for r in rows) + 1
    lr = torch.full((len(rows), width), float("nan"))  # garbage off the mask must not leak
    mask = torch.zeros(len(rows), width, dtype=torch.bool)
    for i, r in enumerate(rows):
        lr[i, : len(r)] = torch.tensor([LN(x) for x in r])
        mask[i, : len(r)] = True
    return lr.double(), mask


def test_tis_truncates_at_the_cap() -> None:
    lr, mask = _ratios([[0.5, 1.0, 3.0], [4.0]])
    w, m = correction_weights(lr, mask, "tis")  # preset cap 2
    assert torch.allclose(w[0, :3], torch.tensor([0.5, 1.0, 2.0], dtype=w.dtype))
    assert w[1, 0].item() == pytest.approx(2.0)
    assert (w[~mask] == 0).all()
    assert m["corr/truncated_frac"] == pytest.approx(2 / 4)
    assert m["corr/token_drop_frac"] == 0.0
    assert m["corr/seq_drop_frac"] == 0.0


def test_token_mis_drops_outside_the_band_and_keeps_rho_inside() -> None:
    lr, mask = _ratios([[0.5, 1.5, 2.5], [3.0]])
    w, m = correction_weights(lr, mask, "token_mis")  # [0, 2]
    assert w[0, :3].tolist() == pytest.approx([0.5, 1.5, 0.0])
    assert w[1, 0].item() == 0.0
    assert m["corr/token_drop_frac"] == pytest.approx(2 / 4)
    assert m["corr/seq_drop_frac"] == pytest.approx(1 / 2)  # row 1 lost its only token
    assert m["corr/truncated_frac"] == 0.0


def test_icepop_is_double_sided() -> None:
    lr, mask = _ratios([[0.49, 0.51, 1.0, 4.9, 5.1]])
    w, m = correction_weights(lr, mask, "icepop")  # [0.5, 5]
    assert w[0, :5].tolist() == pytest.approx([0.0, 0.51, 1.0, 4.9, 0.0])
    assert m["corr/token_drop_frac"] == pytest.approx(2 / 5)


def test_seq_mis_weights_every_token_by_the_product() -> None:
    # Row 0: 1.2 * 1.5 = 1.8 (kept); row 1: 1.5 * 1.5 = 2.25 (> 2: dropped whole).
    lr, mask = _ratios([[1.2, 1.5], [1.5, 1.5]])
    w, m = correction_weights(lr, mask, "seq_mis")
    assert w[0, :2].tolist() == pytest.approx([1.8, 1.8])
    assert w[1, :2].tolist() == [0.0, 0.0]
    assert m["corr/seq_drop_frac"] == pytest.approx(0.5)
    assert m["corr/token_drop_frac"] == pytest.approx(0.5)


def test_seq_mis_survives_a_product_beyond_float32() -> None:
    lr = torch.full((1, 400), 0.5)  # prod = e^200 overflows float32, not the check
    w, m = correction_weights(lr, torch.ones(1, 400, dtype=torch.bool), "seq_mis")
    assert torch.isfinite(w).all() and (w == 0).all()
    assert m["corr/seq_drop_frac"] == 1.0


def test_geo_rs_rejects_by_the_geometric_mean_without_reweighting() -> None:
    # Row 0: geometric mean of (1.02, 1/1.02) = 1 (kept, weight 1 although rho != 1);
    # row 1: (1.1, 1.1) -> 1.1 > e^0.05 = 1.0513 (dropped).
    lr, mask = _ratios([[1.02, 1 / 1.02], [1.1, 1.1]])
    w, m = correction_weights(lr, mask, "geo_rs")
    assert w[0, :2].tolist() == [1.0, 1.0]
    assert w[1, :2].tolist() == [0.0, 0.0]
    assert m["corr/seq_drop_frac"] == pytest.approx(0.5)


def test_geo_rs_band_does_not_depend_on_length() -> None:
    # The same per-token drift over 3 or 300 tokens: the same decision (seq_mis differs).
    for n in (3, 300):
        lr = torch.full((1, n), LN(1.03), dtype=torch.float64)
        ones = torch.ones(1, n, dtype=torch.bool)
        w_geo, _ = correction_weights(lr, ones, "geo_rs")
        assert (w_geo == 1).all()
    w_seq, _ = correction_weights(torch.full((1, 300), LN(1.03)), torch.ones(1, 300), "seq_mis")
    assert (w_seq == 0).all()


def test_none_is_one_on_action_tokens() -> None:
    lr, mask = _ratios([[0.1, 10.0]])
    w, m = correction_weights(lr, mask, "none")
    assert w[0, :2].tolist() == [1.0, 1.0] and w[0, 2] == 0
    assert m["corr/ess"] == pytest.approx(1.0)


def test_explicit_band_overrides_the_preset() -> None:
    lr, mask = _ratios([[1.5, 3.0]])
    w, _ = correction_weights(lr, mask, "tis", high=1.2)
    assert w[0, :2].tolist() == pytest.approx([1.2, 1.2])
    with pytest.raises(ValueError, match="empty"):
        correction_weights(lr, mask, "token_mis", low=2.0, high=1.0)
    with pytest.raises(ValueError, match="allowed values"):
        correction_weights(lr, mask, "nope")


def test_effective_sample_size_by_hand() -> None:
    mask = torch.ones(1, 4, dtype=torch.bool)
    assert effective_sample_size(torch.ones(1, 4), mask).item() == pytest.approx(1.0)
    # (1+1+2+4)^2 / (4 * (1+1+4+16)) = 64 / 88
    w = torch.tensor([[1.0, 1.0, 2.0, 4.0]])
    assert effective_sample_size(w, mask).item() == pytest.approx(64 / 88)
    assert effective_sample_size(torch.tensor([[0.0, 0.0, 0.0, 5.0]]), mask).item() == 0.25
    assert effective_sample_size(torch.zeros(1, 4), torch.zeros(1, 4)).item() == 1.0


def test_weights_are_constants_for_autograd() -> None:
    lr = torch.tensor([[0.1, -0.2]], requires_grad=True)
    w, _ = correction_weights(lr, torch.ones(1, 2), "tis")
    assert not w.requires_grad


def test_every_correction_has_a_preset_with_a_source() -> None:
    assert set(PRESETS) == set(CORRECTIONS) - {"none"}
    assert all(p.source and p.low <= p.high for p in PRESETS.values())


def test_policy_losses_scale_each_token_by_its_weight() -> None:
    # d loss / d logp_t = -w_t * r_t * A_t / N for DIS in band (token_mean, N = 3 action tokens);
    # PPO in its unclipped region: d loss / d logp_t = -w_t * r_t * A_t / N.
    from saorl.losses import dis_policy_loss, ppo_clip_policy_loss

    rollout = torch.log(torch.tensor([[0.5, 0.25, 0.2, 0.1]]))
    adv = torch.tensor([[1.0, -2.0, 0.5, 9.0]])
    mask = torch.tensor([[1, 1, 1, 0]])
    w = torch.tensor([[2.0, 0.0, 0.5, 7.0]])
    r = torch.tensor([1.1, 0.9, 1.0])
    for fn in (dis_policy_loss, ppo_clip_policy_loss):
        logp = (rollout + torch.log(torch.cat([r, torch.ones(1)]))).clone().requires_grad_(True)
        loss, _ = fn(logp, rollout, adv, mask, 0.3, 5.0, token_weights=w)
        loss.backward()
        expected = -w[0, :3] * r * adv[0, :3] / 3
        assert torch.allclose(logp.grad[0, :3], expected, atol=1e-6), fn.__name__
        assert logp.grad[0, 3] == 0  # masked: its weight of 7 never reaches a gradient


def test_gap_by_staleness_and_position_by_hand() -> None:
    from saorl.corrections import finish_gaps, gap_sums

    d = torch.tensor([[0.1, -0.2, 0.3, 0.0], [0.5, 0.0, 0.0, 0.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 0], [1, 0, 0, 0]])
    stale = torch.tensor([[0, 0, 3, 0], [9, -1, -1, -1]])
    pos = torch.tensor([[0, 1, 70, 71], [300, 301, 302, 303]])
    k3 = [math.expm1(x) - x for x in (0.1, -0.2, 0.3, 0.5)]
    sums = {k: v.item() for k, v in gap_sums(d, mask, stale, pos).items()}
    assert sums["gap/tokens_stale0"] == 2 and sums["gap/tokens_stale2-3"] == 1
    assert sums["gap/tokens_stale8up"] == 1 and sums["gap/tokens_stale1"] == 0
    assert sums["gap/k3_sum_stale0"] == pytest.approx(k3[0] + k3[1])
    assert sums["gap/tokens_pos0-63"] == 2 and sums["gap/tokens_pos64-255"] == 1
    assert sums["gap/tokens_pos256-1023"] == 1 and sums["gap/tokens_pos1024up"] == 0
    finish_gaps(sums)
    assert sums["gap/k3_stale0"] == pytest.approx((k3[0] + k3[1]) / 2)
    assert sums["gap/k3_stale8up"] == pytest.approx(k3[3])
    assert sums["gap/k3_stale1"] is None
    assert not any(k.startswith("gap/k3_sum_") for k in sums)


def test_corrections_match_the_config_field() -> None:
    from saorl.experiments.arms import CORRECTIONS as ARM_CORRECTIONS

    assert tuple(ARM_CORRECTIONS) == CORRECTIONS


def test_correction_arm_family() -> None:
    from saorl.config import ConfigError, load_config
    from saorl.experiments.arms import arm_components, parse_arm

    arm = parse_arm("grpo+tis")
    assert arm.name == "grpo+tis"
    assert arm.overrides == ("algorithm.name=grpo", "algorithm.correction=tis")
    cfg = load_config(None, list(arm.overrides))
    assert cfg.algorithm.correction == "tis" and cfg.algorithm.advantage == "group"
    assert "tis correction" in arm_components(cfg)["loss"]
    tuned = parse_arm("sao+icepop:algorithm.correction_high=3")
    assert tuned.overrides[-1] == "algorithm.correction_high=3"
    with pytest.raises(ConfigError, match="BUILTIN\\+CORRECTION"):
        parse_arm("grpo+nope")
