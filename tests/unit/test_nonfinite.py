"""Non-finite inputs contained: a NaN/inf log-prob masks its token and is counted, every
correction gives a non-finite ratio weight 0, metrics of an extreme log-ratio stay finite, and
the collapse detector alarms on a NaN or infinite signal (live and replayed from the file)."""

from __future__ import annotations

import math

import pytest
import torch

from saorl.corrections import CORRECTIONS, correction_weights, gap_sums
from saorl.losses import (
    dis_policy_loss,
    logprob_mismatch,
    nonfinite_tokens,
    ppo_clip_policy_loss,
    reference_kl_penalty,
    sampler_kl_penalty,
)
from saorl.monitoring.collapse import CollapseDetector, detect_collapse
from saorl.monitoring.metrics import MetricsLogger, read_metrics

MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]], dtype=torch.bool)
ADV = torch.tensor([[1.0, -1.0, 0.5, 0.0], [2.0, 1.0, -0.5, 1.0]])


def _logprobs() -> tuple[torch.Tensor, torch.Tensor]:
    lp = torch.tensor([[-1.0, -2.0, -0.5, -9.0], [-0.3, -1.2, -2.0, -0.7]], requires_grad=True)
    return lp, lp.detach() + 0.05  # the engine's: ratio exp(-0.05), inside every band


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf])
@pytest.mark.parametrize("side", ["rollout", "policy"])
def test_a_nonfinite_logprob_on_an_action_token_is_masked_and_counted(bad, side):
    lp, rollout = _logprobs()
    ref_loss, _ = dis_policy_loss(lp, rollout, ADV, MASK, 0.3, 5.0)
    ref_loss.backward()
    ref_grad = lp.grad.clone()
    lp.grad = None
    offset = torch.zeros(2, 4)
    offset[0, 1] = bad
    if side == "rollout":
        rollout, policy = rollout + offset, lp
    else:  # the learner's own log-prob, in the graph: its gradient would reach `lp`
        policy = lp + offset
    loss, m = dis_policy_loss(policy, rollout, ADV, MASK, 0.3, 5.0)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()
    assert lp.grad[0, 1] == 0  # the token gets nothing...
    # ... and the others exactly what they got before: it stays in the denominator.
    keep = torch.ones_like(MASK)
    keep[0, 1] = False
    torch.testing.assert_close(lp.grad[keep], ref_grad[keep])
    assert all(math.isfinite(v) for v in m.values())
    assert m["dis/masked_frac"] == pytest.approx(1 / 7)  # counted as masked
    assert nonfinite_tokens(MASK, policy, rollout).item() == 1
    assert logprob_mismatch(policy, rollout, MASK)["mismatch/tokens"] == 6
    # PPO clip and the KL penalty alike.
    lp.grad = None
    ppo, pm = ppo_clip_policy_loss(policy, rollout, ADV, MASK, 0.2, 0.28)
    (ppo + sampler_kl_penalty(policy, rollout, MASK)).backward()
    assert math.isfinite(ppo.item()) and torch.isfinite(lp.grad).all() and lp.grad[0, 1] == 0
    assert all(math.isfinite(v) for v in pm.values())


@pytest.mark.parametrize("kind", CORRECTIONS)
def test_every_correction_gives_a_nonfinite_ratio_weight_zero_and_counts_it(kind):
    log_ratio = torch.zeros(2, 4)
    log_ratio[0, 1] = math.nan
    w, m = correction_weights(log_ratio, MASK, kind)
    assert torch.isfinite(w).all() and w[0, 1] == 0
    # Its row is dropped whole by the sequence corrections; the other row keeps weight 1.
    row_dropped = kind in ("seq_mis", "geo_rs")
    assert bool((w[0][MASK[0]] == 0).all()) == row_dropped
    assert torch.all(w[1] == 1)
    kept = 4 + (0 if row_dropped else 2)
    # ESS over all 7 action tokens, the NaN one (and a dropped row) with weight 0: kept / 7.
    assert m["corr/ess"] == pytest.approx(kept / 7)
    assert m["corr/ess_raw"] == pytest.approx(6 / 7)
    assert m["corr/token_drop_frac"] == pytest.approx((7 - kept) / 7)


def test_an_extreme_log_ratio_keeps_every_logged_metric_finite():
    lp, rollout = _logprobs()
    rollout = rollout.clone()
    rollout[1, 2] = lp[1, 2].item() - 89.0  # log-ratio 89: exp(89) is inf in float32
    loss, m = dis_policy_loss(lp, rollout, ADV, MASK, 0.3, 5.0)
    loss.backward()
    assert math.isfinite(loss.item()) and torch.isfinite(lp.grad).all()
    for key in ("dis/ratio_mean", "dis/ratio_max", "dis/kl_k3"):
        assert math.isfinite(m[key]) and m[key] > 1e6, key  # clamped at exp(20), still huge
    assert m["dis/ratio_max"] == pytest.approx(math.exp(20))
    mm = logprob_mismatch(lp, rollout, MASK)
    assert math.isfinite(mm["mismatch/k3"]) and mm["mismatch/k3"] > 1e6
    for kind in CORRECTIONS:
        _, cm = correction_weights(lp.detach() - rollout, MASK, kind)
        assert all(math.isfinite(v) for v in cm.values()), kind
        assert cm["corr/ess_raw"] == pytest.approx(1 / 7, rel=1e-3)  # one token carries it all
    gaps = gap_sums(lp.detach() - rollout, MASK, torch.zeros(2, 4), torch.zeros(2, 4))
    assert all(math.isfinite(v.item()) for v in gaps.values())
    # The KL penalties too: finite, and no pull from the clamped token (a step kept, not lost).
    lp.grad = None
    kl = sampler_kl_penalty(lp, rollout, MASK) + reference_kl_penalty(lp, rollout, MASK)
    kl.backward()
    assert math.isfinite(kl.item()) and torch.isfinite(lp.grad).all() and lp.grad[1, 2] == 0
    # And the log-ratio -89 (the engine's probability far above the trainer's).
    _, m = dis_policy_loss(lp, lp.detach() + 89.0, ADV, MASK, 0.3, 5.0)
    assert all(math.isfinite(v) for v in m.values())


def _rows(n: int, bad: float | None = None) -> list[dict]:
    rows = [{"step": s, "policy/grad_norm": 1.0 + 0.01 * (s % 3)} for s in range(1, n + 1)]
    if bad is not None:
        rows[-1]["policy/grad_norm"] = bad
    return rows


@pytest.mark.parametrize("bad", [math.nan, math.inf])
def test_the_collapse_detector_alarms_on_a_nonfinite_signal(bad, tmp_path):
    detector = CollapseDetector()
    for row in _rows(5, bad):
        scores = detector.update(row)
    assert detector.first is not None and detector.first["signal"] == "grad_norm_spike"
    assert detector.first["step"] == detector.first["detected_step"] == 5
    assert "not finite" in detector.first["reason"] and scores["collapse/detected"] == 1.0
    # metrics.jsonl writes the NaN as null; the signal's score (-1) keeps it: a replay agrees.
    with MetricsLogger(tmp_path) as log:
        live = CollapseDetector()
        for row in _rows(5, bad):
            log.log({**row, **live.update(row)})
    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert rows[-1]["policy/grad_norm"] is None and rows[-1]["collapse/grad_norm_spike"] == -1
    replayed = detect_collapse(rows)
    assert replayed == {**live.first, "value": None, "threshold": None}
    assert detect_collapse(rows[:-1]) is None  # the finite steps alone: nothing
