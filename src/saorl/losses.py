"""Policy and value losses: pure functions of tensors and scalars.

Every loss takes ``(B, T)`` tensors and a ``(B, T)`` ``mask`` that is nonzero on action
(model-generated) tokens; bool and float masks are both accepted and any nonzero entry counts as
an action token. Each returns ``(loss, metrics)``: a scalar tensor attached to the autograd graph
and a flat dict of python floats with namespaced keys (``loss/policy``, ``dis/masked_frac``, ...).
With ``tensors=True`` the metrics stay 0-dim detached tensors and nothing waits for the device:
the learner adds them up over micro-batches and converts them once per step.

Masked-out positions may hold anything (padding garbage, ``-inf`` log-probs, ``NaN`` values):
inputs are zeroed there *before* any arithmetic, so they reach neither the loss nor a gradient.
So is an action token whose log-prob is not finite (:func:`finite_tokens`; it stays in the
denominator like a DIS-masked token). Metrics run under ``torch.no_grad``; their log-ratios are
clamped to ``+-LOG_RATIO_BOUND`` before ``exp`` (:func:`clamp_log_ratio`), so they stay finite.
"""

from __future__ import annotations

from typing import Literal

import torch
from torch import Tensor

Metrics = dict[str, float] | dict[str, Tensor]

Aggregation = Literal["token_mean", "seq_mean_token_mean"]
AGGREGATIONS: tuple[str, ...] = ("token_mean", "seq_mean_token_mean")

# Metrics clamp log-ratios to +-20 before exp (verl's rollout-correction bound): exp(20) ~ 4.9e8
# is far outside every band, and its square (an ESS) still fits float32, where exp(89) is inf.
LOG_RATIO_BOUND = 20.0


def _check_shapes(mask: Tensor, **tensors: Tensor | None) -> None:
    for name, t in tensors.items():
        if t is not None and t.shape != mask.shape:
            raise ValueError(
                f"{name} has shape {tuple(t.shape)} but mask has shape {tuple(mask.shape)}; "
                "all loss inputs must be (B, T) tensors of the same shape"
            )


def _zero_outside(x: Tensor, m: Tensor) -> Tensor:
    # torch.where (not multiplication) so that inf/NaN at padding cannot leak as 0 * inf = NaN,
    # neither in the forward value nor in the backward pass.
    return torch.where(m, x, torch.zeros((), dtype=x.dtype, device=x.device))


def finite_tokens(mask: Tensor, *logprobs: Tensor) -> Tensor:
    """``mask`` (as bool) where every one of ``logprobs`` is finite: the tokens a loss can use.

    A NaN log-prob compares False against both DIS bounds, so without this it would count as in
    band and turn the loss and the gradient NaN (and the optimizer would skip the whole step).
    """
    ok = mask.bool()
    for x in logprobs:
        ok = ok & torch.isfinite(x.detach())
    return ok


@torch.no_grad()
def nonfinite_tokens(mask: Tensor, *logprobs: Tensor) -> Tensor:
    """How many tokens of ``mask`` have a non-finite log-prob in ``logprobs`` (float64, 0-dim):
    ``mismatch/nonfinite_tokens``, the tokens :func:`finite_tokens` keeps out of the loss."""
    return (mask.bool() & ~finite_tokens(mask, *logprobs)).sum().double()


def clamp_log_ratio(log_ratio: Tensor) -> Tensor:
    """``log_ratio`` clamped to ``+-LOG_RATIO_BOUND``, for metrics that take its exp."""
    return log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)


def masked_aggregate(per_token: Tensor, mask: Tensor, agg: Aggregation = "token_mean") -> Tensor:
    """Reduce a ``(B, T)`` per-token loss to a scalar over the action tokens in ``mask``.

    - ``token_mean``: ``sum_{b,t} m_bt * x_bt / sum_{b,t} m_bt``, one mean over every action
      token of the batch. Tokens that a loss zeroes (e.g. DIS out-of-band tokens) are still
      action tokens, so they stay in the denominator: masking shrinks a step, it never rescales
      the rest (docs/design.md section 1).
    - ``seq_mean_token_mean``: ``mean_{b: n_b > 0} (sum_t m_bt * x_bt / n_b)`` with
      ``n_b = sum_t m_bt``; rows without any action token are left out of the outer mean.

    An all-zero mask gives ``0`` (still attached to the graph, so ``backward`` works and every
    gradient is 0), never ``NaN``.

    Args:
        per_token: ``(B, T)`` per-token values.
        mask: ``(B, T)``, nonzero on action tokens.
        agg: ``"token_mean"`` or ``"seq_mean_token_mean"``.

    Returns:
        A 0-dim tensor.
    """
    _check_shapes(mask, per_token=per_token)
    m = mask.bool()
    x = _zero_outside(per_token, m)
    if agg == "token_mean":
        return x.sum() / m.sum().clamp_min(1)
    elif agg == "seq_mean_token_mean":
        counts = m.sum(dim=-1)
        row_means = x.sum(dim=-1) / counts.clamp_min(1)
        has_tokens = counts > 0
        return _zero_outside(row_means, has_tokens).sum() / has_tokens.sum().clamp_min(1)
    raise ValueError(f"unknown agg {agg!r}; allowed values: {', '.join(AGGREGATIONS)}")


def k3(log_ratio: Tensor) -> Tensor:
    """Per-token k3 estimate of ``KL(q || p)`` from tokens sampled by ``q``.

    With ``log_ratio = log p - log q`` and ``rho = exp(log_ratio)`` the estimator (Schulman,
    "Approximating KL divergence") is ``rho - 1 - log rho``: unbiased for ``KL(q || p)``
    because the tokens were sampled by ``q``, and never negative. The mirrored form
    ``1/rho - 1 + log rho`` would need samples from ``p``. Differentiable; same shape as the
    input.
    """
    return torch.expm1(log_ratio) - log_ratio


def sampler_kl_penalty(
    logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, agg: Aggregation = "token_mean"
) -> Tensor:
    """k3 estimate of ``KL(rollout || current)`` on the tokens the rollout sampled, aggregated
    by :func:`masked_aggregate`: ``algorithm.kl_coef``'s penalty.

    The unbiased direction, as ``dis/kl_k3`` and ``mismatch/k3``: the tokens were sampled by the
    rollout policy, so :func:`k3` gets ``logprobs - rollout_logprobs``. Its gradient with
    respect to a token's log-prob is ``rho - 1`` (``rho`` the ratio current / rollout) times
    that token's weight: it pulls a token's probability back towards the sampler's.
    """
    ok = finite_tokens(mask, logprobs, rollout_logprobs)
    d = clamp_log_ratio(_zero_outside(logprobs - rollout_logprobs.detach(), ok))  # exp(89) = inf
    return masked_aggregate(k3(d), mask, agg)


def reference_kl_penalty(
    logprobs: Tensor, ref_logprobs: Tensor, mask: Tensor, agg: Aggregation = "token_mean"
) -> Tensor:
    """k3 estimate of ``KL(current || reference)`` (a frozen copy of the policy as RL started),
    aggregated by :func:`masked_aggregate`: ``algorithm.kl_coef``'s penalty with
    ``algorithm.kl_reference = "initial"`` (TRL's ``beta`` with a ``ref_model``).

    The tokens were sampled by (a recent version of) the current policy, so :func:`k3` gets
    ``ref_logprobs - logprobs``: ``exp(ref - logp) - 1 - (ref - logp)``, never negative. Its
    gradient with respect to a token's log-prob is ``1 - ref / current`` times that token's
    weight: it pulls the policy back towards the reference. ``ref_logprobs`` are constants.
    """
    ok = finite_tokens(mask, logprobs, ref_logprobs)
    d = clamp_log_ratio(_zero_outside(ref_logprobs.detach() - logprobs, ok))  # exp(89) = inf
    return masked_aggregate(k3(d), mask, agg)


@torch.no_grad()
def _masked_stats(x: Tensor, m: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Mean, min and max of ``x`` over ``m`` (float64, 0-dim); all 0 when ``m`` is empty."""
    n = m.sum()
    x = x.double()
    zero = torch.zeros((), dtype=torch.float64, device=x.device)
    mean = _zero_outside(x, m).sum() / n.clamp_min(1)
    lo = torch.where(m, x, torch.full_like(x, torch.inf)).amin()
    hi = torch.where(m, x, torch.full_like(x, -torch.inf)).amax()
    return mean, torch.where(n > 0, lo, zero), torch.where(n > 0, hi, zero)


@torch.no_grad()
def _frac(selected: Tensor, m: Tensor) -> Tensor:
    """Fraction of action tokens (``m``) where ``selected`` holds; 0 with no action tokens."""
    return (selected & m).sum().double() / m.sum().clamp_min(1).double()


def _out(metrics: dict[str, Tensor], tensors: bool) -> Metrics:
    """The metrics as 0-dim tensors, or as python floats with one device sync for all."""
    if tensors or not metrics:
        return metrics
    keys = list(metrics)
    dev = metrics[keys[0]].device
    vals = torch.stack([metrics[k].to(dev, torch.float64) for k in keys]).tolist()
    return dict(zip(keys, vals, strict=True))


def _weights(token_weights: Tensor | None, m: Tensor) -> Tensor | float:
    """A mismatch correction's per-token weights (saorl.corrections), detached and zeroed off
    the mask; 1.0 without a correction."""
    if token_weights is None:
        return 1.0
    _check_shapes(m, token_weights=token_weights)
    return _zero_outside(token_weights.detach(), m)


def dis_policy_loss(
    logprobs: Tensor,
    rollout_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    agg: Aggregation = "token_mean",
    *,
    tensors: bool = False,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """Direct double-sided importance sampling (DIS) policy loss, paper Eqs. 1-3.

    With ``r_t = exp(logp_t - rollout_logp_t)`` (ratio of the current policy to the policy that
    sampled token t, as the rollout engine recorded it)::

        f(r) = r   if 1 - eps_low < r < 1 + eps_high   (strict, docs/design.md section 1)
               0   otherwise
        loss_t = -sg(f(r_t)) * A_t * logp_t

    aggregated over action tokens by :func:`masked_aggregate`. Because ``f`` is detached, the
    in-band gradient is ``d loss_t / d logp_t = -r_t * A_t`` and out-of-band tokens get exactly
    zero gradient whatever the sign of ``A_t`` (unlike PPO's one-sided clip). With
    ``token_mean`` an in-band token's gradient is ``-r_t * A_t / N`` where ``N`` counts all
    action tokens, out-of-band ones included. ``advantages`` and ``rollout_logprobs`` are
    treated as constants (detached).

    Args:
        logprobs: ``(B, T)`` current-policy log-probs of the sampled tokens (requires grad).
        rollout_logprobs: ``(B, T)`` log-probs recorded by the rollout engine.
        advantages: ``(B, T)`` per-token advantages.
        mask: ``(B, T)``, nonzero on action tokens.
        eps_low, eps_high: band half-widths (paper: 0.3/5.0 for math, 0.8/3.0 for coding).
        agg: see :func:`masked_aggregate`.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.
        token_weights: ``(B, T)`` per-token weights of a mismatch correction
            (:func:`saorl.corrections.correction_weights`), multiplying each token's loss;
            detached; ``None`` = 1.

    Returns:
        ``(loss, metrics)`` with metrics ``loss/policy``, ``dis/masked_frac``,
        ``dis/masked_frac_below`` (``r <= 1 - eps_low``), ``dis/masked_frac_above``
        (``r >= 1 + eps_high``), ``dis/ratio_mean``, ``dis/ratio_min``, ``dis/ratio_max`` and
        ``dis/kl_k3`` (k3 estimate of ``KL(rollout || current)``, see :func:`k3`); fractions are
        over action tokens and every metric is 0.0 when there are none.
    """
    _check_shapes(mask, logprobs=logprobs, rollout_logprobs=rollout_logprobs, advantages=advantages)
    m = mask.bool()
    ok = finite_tokens(m, logprobs, rollout_logprobs)  # the others: no loss, no gradient
    logp = _zero_outside(logprobs, ok)
    log_ratio = _zero_outside(logprobs.detach() - rollout_logprobs.detach(), ok)
    ratio = torch.exp(log_ratio)
    below = ok & (ratio <= 1.0 - eps_low)
    above = ok & (ratio >= 1.0 + eps_high)
    in_band = ~below & ~above & ok
    f = _zero_outside(ratio, in_band)
    adv = _zero_outside(advantages.detach(), m)
    loss = masked_aggregate(-f * adv * logp * _weights(token_weights, m), m, agg)

    with torch.no_grad():
        shown = clamp_log_ratio(log_ratio)
        ratio_mean, ratio_min, ratio_max = _masked_stats(torch.exp(shown), ok)
        metrics = {
            "loss/policy": loss.detach(),
            "dis/masked_frac": _frac(~in_band, m),
            "dis/masked_frac_below": _frac(below, m),
            "dis/masked_frac_above": _frac(above, m),
            "dis/ratio_mean": ratio_mean,
            "dis/ratio_min": ratio_min,
            "dis/ratio_max": ratio_max,
            "dis/kl_k3": _masked_stats(k3(shown), ok)[0],
        }
    return loss, _out(metrics, tensors)


def ppo_clip_policy_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    eps_low: float,
    eps_high: float,
    agg: Aggregation = "token_mean",
    *,
    tensors: bool = False,
    token_weights: Tensor | None = None,
) -> tuple[Tensor, Metrics]:
    """PPO clipped surrogate with asymmetric ("clip-higher", DAPO) bounds.

    With ``r_t = exp(logp_t - old_logp_t)``::

        loss_t = max(-A_t * r_t, -A_t * clip(r_t, 1 - eps_low, 1 + eps_high))

    aggregated over action tokens by :func:`masked_aggregate`. This is the baseline the paper
    compares DIS against (vanilla GRPO and VAPO, ``eps_low=0.2, eps_high=0.28``); it is not one
    of the paper's numbered equations. ``old_logprobs`` and ``advantages`` are detached.

    Args:
        logprobs: ``(B, T)`` current-policy log-probs (requires grad).
        old_logprobs: ``(B, T)`` log-probs under the old policy (trainer weights at step start).
        advantages: ``(B, T)`` per-token advantages.
        mask: ``(B, T)``, nonzero on action tokens.
        eps_low, eps_high: clip range ``[1 - eps_low, 1 + eps_high]``.
        agg: see :func:`masked_aggregate`.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.
        token_weights: ``(B, T)`` per-token weights of a mismatch correction
            (:func:`saorl.corrections.correction_weights`), multiplying each token's loss;
            detached; ``None`` = 1.

    Returns:
        ``(loss, metrics)`` with ``loss/policy``, ``ppo/clip_frac`` (fraction of action tokens
        where the clipped term is strictly larger, i.e. the clip zeroes the gradient),
        ``ppo/clip_frac_low`` (of those, ``r < 1 - eps_low`` with ``A < 0``),
        ``ppo/clip_frac_high`` (``r > 1 + eps_high`` with ``A > 0``), ``ppo/ratio_mean`` and
        ``ppo/kl_k3`` (k3 estimate of ``KL(old || current)``, unbiased when the old policy
        sampled the tokens; with stale async rollouts it is an approximation).
    """
    _check_shapes(mask, logprobs=logprobs, old_logprobs=old_logprobs, advantages=advantages)
    m = mask.bool()
    ok = finite_tokens(m, logprobs, old_logprobs)  # the others: no loss, no gradient
    # Clamped (as verl does): exp(89) = inf would backpropagate 0 * inf = NaN when clipped.
    log_ratio = clamp_log_ratio(_zero_outside(logprobs - old_logprobs.detach(), ok))
    ratio = torch.exp(log_ratio)
    adv = _zero_outside(advantages.detach(), m)
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(unclipped, clipped) * _weights(token_weights, m)
    loss = masked_aggregate(_zero_outside(per_token, ok), m, agg)

    with torch.no_grad():
        clip_active = ok & (clipped > unclipped)
        ratio_mean, _, _ = _masked_stats(ratio, ok)
        metrics = {
            "loss/policy": loss.detach(),
            "ppo/clip_frac": _frac(clip_active, m),
            "ppo/clip_frac_low": _frac(clip_active & (ratio < 1.0 - eps_low), m),
            "ppo/clip_frac_high": _frac(clip_active & (ratio > 1.0 + eps_high), m),
            "ppo/ratio_mean": ratio_mean,
            "ppo/kl_k3": _masked_stats(k3(log_ratio.detach()), ok)[0],
        }
    return loss, _out(metrics, tensors)


def positive_lm_loss(
    logprobs: Tensor,
    mask: Tensor,
    positive: Tensor,
    agg: Aggregation = "token_mean",
    *,
    tensors: bool = False,
) -> tuple[Tensor, Metrics]:
    """VAPO's positive-example LM loss: negative log-likelihood of the correct samples.

    With ``P`` the rows where ``positive`` holds (outcome judged correct) and ``o_i`` the
    action tokens of row i (VAPO, arXiv 2504.05118, "Positive Example LM Loss")::

        L_NLL = -(1 / sum_{i in P} |o_i|) * sum_{i in P} sum_{t in o_i} logp_{i,t}

    i.e. :func:`masked_aggregate` of ``-logp`` over the action tokens of positive rows
    (``token_mean``; ``seq_mean_token_mean`` averages the positive rows' means). It is added to
    the policy loss with a weight (VAPO: 0.1) and imitates the policy's own successes, which
    matters when rewards are sparse. No positive row gives 0 (attached to the graph).

    Args:
        logprobs: ``(B, T)`` current-policy log-probs of the sampled tokens (requires grad).
        mask: ``(B, T)``, nonzero on action tokens.
        positive: ``(B,)``, nonzero on the rows that count as correct.
        agg: see :func:`masked_aggregate`.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.

    Returns:
        ``(loss, metrics)`` with ``loss/lm`` and ``lm/positive_frac`` (the fraction of rows with
        action tokens that are positive).
    """
    _check_shapes(mask, logprobs=logprobs)
    if positive.shape != mask.shape[:1]:
        raise ValueError(
            f"positive has shape {tuple(positive.shape)} but mask has {mask.shape[0]} rows; "
            "positive must be a (B,) tensor, one flag per row"
        )
    m = mask.bool()
    pos = m & positive.bool()[:, None]
    loss = masked_aggregate(-_zero_outside(logprobs, finite_tokens(pos, logprobs)), pos, agg)
    with torch.no_grad():
        rows = m.any(dim=-1)
        metrics = {
            "loss/lm": loss.detach(),
            "lm/positive_frac": _frac(pos.any(dim=-1), rows),
        }
    return loss, _out(metrics, tensors)


def value_loss(
    values: Tensor,
    returns: Tensor,
    mask: Tensor,
    old_values: Tensor | None = None,
    clip: float | None = None,
    agg: Aggregation = "token_mean",
    *,
    tensors: bool = False,
) -> tuple[Tensor, Metrics]:
    """Critic regression loss, optionally PPO-style clipped to the old values.

    Unclipped: ``loss_t = 0.5 * (V_t - R_t)^2``. With ``old_values`` and ``clip``::

        V_clip_t = V_old_t + clamp(V_t - V_old_t, -clip, clip)
        loss_t   = max(0.5 * (V_t - R_t)^2, 0.5 * (V_clip_t - R_t)^2)

    aggregated over action tokens by :func:`masked_aggregate` (docs/design.md section 1; the paper
    trains the critic on the skip-observation GAE returns, no numbered equation). ``returns``
    and ``old_values`` are detached.

    Args:
        values: ``(B, T)`` critic predictions (requires grad).
        returns: ``(B, T)`` regression targets.
        mask: ``(B, T)``, nonzero on action tokens.
        old_values: ``(B, T)`` predictions before this update; needed together with ``clip``.
        clip: clip half-width in value units; needed together with ``old_values``.
        agg: see :func:`masked_aggregate`.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.

    Returns:
        ``(loss, metrics)`` with ``loss/value``, ``value/mean``, ``value/returns_mean``,
        ``value/explained_variance`` and, when clipping, ``value/clip_frac`` (fraction of action
        tokens where the clipped error is strictly larger). Explained variance is
        ``1 - Var(R - V) / Var(R)`` with population variances over action tokens; it is 0.0 when
        there are no action tokens or ``Var(R)`` is numerically zero (below ``1e-12``), since
        no prediction can explain a constant target.
    """
    if (old_values is None) != (clip is None):
        raise ValueError(
            "value_loss: pass old_values and clip together (both to clip, neither to not clip)"
        )
    _check_shapes(mask, values=values, returns=returns, old_values=old_values)
    m = mask.bool()
    v = _zero_outside(values, m)
    ret = _zero_outside(returns.detach(), m)
    per_token = 0.5 * (v - ret) ** 2
    clip_active: Tensor | None = None
    if old_values is not None and clip is not None:
        old = _zero_outside(old_values.detach(), m)
        v_clip = old + torch.clamp(v - old, -clip, clip)
        clipped = 0.5 * (v_clip - ret) ** 2
        clip_active = clipped > per_token
        per_token = torch.maximum(per_token, clipped)
    loss = masked_aggregate(per_token, m, agg)

    with torch.no_grad():
        value_mean, _, _ = _masked_stats(v, m)
        returns_mean, _, _ = _masked_stats(ret, m)
        metrics = {
            "loss/value": loss.detach(),
            "value/mean": value_mean,
            "value/returns_mean": returns_mean,
            "value/explained_variance": _explained_variance(v.detach(), ret, m),
        }
        if clip_active is not None:
            metrics["value/clip_frac"] = _frac(clip_active, m)
    return loss, _out(metrics, tensors)


@torch.no_grad()
def _explained_variance(values: Tensor, returns: Tensor, m: Tensor) -> Tensor:
    n = m.sum().clamp_min(1)
    r = returns.double()
    v = values.double()
    var_r = _zero_outside((r - _zero_outside(r, m).sum() / n) ** 2, m).sum() / n
    err = _zero_outside(r - v, m)
    var_err = _zero_outside((err - err.sum() / n) ** 2, m).sum() / n
    zero = torch.zeros((), dtype=torch.float64, device=r.device)
    # No prediction can explain a constant target (or an empty one): 0 then.
    return torch.where(var_r < 1e-12, zero, 1.0 - var_err / var_r.clamp_min(1e-12))


@torch.no_grad()
def logprob_mismatch(
    logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor, *, tensors: bool = False
) -> Metrics:
    """How far the engine's recorded log-probs are from the learner's, on the tokens in ``mask``.

    DIS weighs every token by ``r_t = exp(logp_t - rollout_logp_t)`` (paper Eq. 2), so any
    disagreement between the two computations of the *same* policy (kernels, precision, batch
    shape) shows up in ``r_t`` as if it were staleness. With ``d_t = logp_t - rollout_logp_t``
    over the ``n`` tokens of ``mask`` (meant to be those sampled by the policy the learner
    holds, so that ``d_t`` is pure mismatch)::

        mismatch/k3                    = (1/n) * sum_t k3(d_t),  k3(d) = exp(d) - 1 - d
        mismatch/max_abs_logprob_diff  = max_t |d_t|
        mismatch/tokens                = n

    ``k3`` is the non-negative, unbiased estimator of ``KL(engine || learner)`` from tokens
    sampled by the engine (Schulman's k3); both are 0 when the two agree exactly and when
    ``mask`` is empty. Tokens with a non-finite log-prob are left out (:func:`nonfinite_tokens`
    counts them) and ``d`` is clamped to ``+-LOG_RATIO_BOUND`` inside ``k3``.

    Args:
        logprobs: ``(B, T)`` learner log-probs of the sampled tokens.
        rollout_logprobs: ``(B, T)`` the engine's recorded log-probs of the same tokens.
        mask: ``(B, T)``, nonzero on the tokens to compare.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.
    """
    _check_shapes(mask, logprobs=logprobs, rollout_logprobs=rollout_logprobs)
    m = finite_tokens(mask, logprobs, rollout_logprobs)  # counted apart: nonfinite_tokens
    d = _zero_outside(logprobs.float() - rollout_logprobs.float(), m)
    metrics = {
        "mismatch/k3": _masked_stats(k3(clamp_log_ratio(d)), m)[0],
        "mismatch/max_abs_logprob_diff": _masked_stats(d.abs(), m)[2],
        "mismatch/tokens": m.sum().double(),
    }
    return _out(metrics, tensors)
