"""Rollout-trainer mismatch corrections: per-token weights on the policy-gradient loss.

The rollout engine and the trainer disagree on a token's probability (different kernels,
precision, MoE routing) and, in asynchronous training, the engine may also have sampled it with
older weights. With ``rho_t = pi_train(y_t) / pi_rollout(y_t)`` (the trainer's probability of
the sampled token at the start of the step, detached, over the one the engine recorded), each
correction turns ``rho`` into a weight ``w_t`` that multiplies the token's policy-gradient loss
(``loss_t -> w_t * loss_t``; the weights are constants, never differentiated):

- ``tis``, token-level truncated importance sampling: ``w_t = min(rho_t, high)``.
- ``token_mis``, token-level masked importance sampling: ``w_t = rho_t`` when
  ``low <= rho_t <= high``, else 0 (the token is dropped instead of truncated).
- ``seq_mis``, sequence-level masked importance sampling: with
  ``rho_seq = prod_t rho_t`` over the row's action tokens, every token of the row gets
  ``w = rho_seq`` when ``low <= rho_seq <= high``, else 0 (the whole sequence is dropped).
- ``icepop``, IcePop's double-sided token masking: the form of ``token_mis`` with its own
  two-sided band (tokens the engine over- *or* under-weighted beyond the band are dropped).
- ``geo_rs``, geometric-mean sequence rejection: with
  ``rho_geo = exp(mean_t log rho_t)``, a row outside ``[low, high]`` is dropped (weight 0) and
  the others keep weight 1 (rejection only, no reweighting; the geometric mean makes the band
  independent of the sequence length, which ``rho_seq`` is not).

``PRESETS`` holds each correction's default band with its source. Bands are inclusive. A
non-finite ratio (a NaN or infinite log-prob on either side) gets weight 0 under every
correction (its whole row under ``seq_mis`` and ``geo_rs``) and counts in both ESS as a token
of weight 0.
:func:`correction_weights` also returns the diagnostics the stability lab logs: the normalised
effective sample size of the raw ratios and of the applied weights, and the share of tokens and
of sequences each correction drops or truncates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal, Protocol

import torch
from torch import Tensor

from saorl.losses import Metrics, _frac, _out, _zero_outside, clamp_log_ratio, finite_tokens

Correction = Literal["none", "tis", "token_mis", "seq_mis", "icepop", "geo_rs"]
CORRECTIONS: tuple[str, ...] = ("none", "tis", "token_mis", "seq_mis", "icepop", "geo_rs")


class AlgorithmLike(Protocol):  # the fields of saorl.config's AlgorithmConfig used here
    correction: str
    correction_low: float | None
    correction_high: float | None


@dataclass(frozen=True)
class Preset:
    low: float  # lower edge of the kept band (unused by tis)
    high: float  # upper edge: the truncation cap for tis
    source: str


PRESETS: dict[str, Preset] = {
    "tis": Preset(
        0.0,
        2.0,
        "Yao, Liu et al. 2025, 'Your Efficient RL Framework Secretly Brings You Off-Policy RL "
        "Training' (token-level TIS, cap C = 2)",
    ),
    "token_mis": Preset(
        0.0,
        2.0,
        "Liu, Li et al. 2025, 'When Speed Kills Stability: Demystifying RL Collapse from the "
        "Training-Inference Mismatch' (token-level MIS; one-sided, threshold 2 as TIS's cap)",
    ),
    "seq_mis": Preset(
        0.0,
        2.0,
        "Liu, Li et al. 2025 (as token_mis), sequence-level MIS on the product of the "
        "row's ratios; one-sided, threshold 2",
    ),
    "icepop": Preset(
        0.5,
        5.0,
        "Ling Team 2025, 'Every Step Evolves: Scaling Reinforcement Learning for "
        "Trillion-Scale Thinking Model' (IcePop, band [0.5, 5])",
    ),
    "geo_rs": Preset(
        math.exp(-0.05),
        math.exp(0.05),
        "geometric-mean sequence rejection as discussed after Liu, Li et al. 2025; the band "
        "exp(+-0.05) (a 5 % mean per-token drift) is saorl's own choice, not a published value",
    ),
}


def effective_sample_size(weights: Tensor, mask: Tensor) -> Tensor:
    """Normalised effective sample size ``(sum w)^2 / (n * sum w^2)`` over ``mask``, in ``[0, 1]``.

    1 when every weight is equal; ``1/n`` when one token carries all the weight. 1.0 with no
    tokens or all-zero weights (nothing to be uneven about). ``float64``, 0-dim, no gradient.
    """
    m = mask.bool()
    w = _zero_outside(weights.detach().double(), m)
    n = m.sum().double()
    s1 = w.sum()
    s2 = (w * w).sum()
    ess = s1 * s1 / (n * s2).clamp_min(torch.finfo(torch.float64).tiny)
    return torch.where((n > 0) & (s2 > 0), ess, torch.ones_like(ess))


@torch.no_grad()
def correction_weights(
    log_ratio: Tensor,
    mask: Tensor,
    kind: str,
    low: float | None = None,
    high: float | None = None,
    *,
    tensors: bool = False,
) -> tuple[Tensor, Metrics]:
    """Per-token weights ``w`` for the policy-gradient loss under correction ``kind``.

    Args:
        log_ratio: ``(B, T)`` ``log pi_train - log pi_rollout`` of the sampled tokens (the
            trainer's log-probs at the start of the step; detached here).
        mask: ``(B, T)``, nonzero on action tokens.
        kind: one of ``CORRECTIONS``; ``"none"`` gives weight 1 on every action token.
        low, high: the band (``high`` is the cap for ``tis``); ``None`` takes the preset's.
        tensors: metrics as 0-dim tensors (no device sync) instead of python floats.

    Returns:
        ``(weights, metrics)``: weights ``(B, T)`` in ``log_ratio``'s dtype, 0 off the mask;
        metrics ``corr/ess_raw`` (ESS of ``rho``), ``corr/ess`` (ESS of the weights),
        ``corr/token_drop_frac`` (action tokens given weight 0), ``corr/seq_drop_frac`` (rows
        with action tokens all of which got weight 0) and ``corr/truncated_frac`` (tokens
        whose weight ``tis`` capped).
    """
    if kind not in CORRECTIONS:
        raise ValueError(f"unknown correction {kind!r}; allowed values: {', '.join(CORRECTIONS)}")
    preset = PRESETS.get(kind)
    lo = low if low is not None else (preset.low if preset else 0.0)
    hi = high if high is not None else (preset.high if preset else math.inf)
    if lo > hi:
        raise ValueError(f"correction band is empty: low {lo} > high {hi}")
    m = mask.bool()
    # A non-finite ratio gets weight 0 and counts in the ESS as a zero-weight token; a sequence
    # correction drops its whole row (the row's ratio is unknown).
    ok = finite_tokens(m, log_ratio)
    lr = _zero_outside(log_ratio.detach(), ok)
    rho = torch.exp(lr)
    zero = torch.zeros_like(rho)
    truncated = torch.zeros_like(m)
    if kind == "none":
        w = m.to(rho.dtype)
    elif kind == "tis":
        truncated = m & (rho > hi)
        w = torch.clamp(rho, max=hi)
    elif kind in ("token_mis", "icepop"):
        w = torch.where((rho >= lo) & (rho <= hi), rho, zero)
    else:
        n = m.sum(dim=-1, keepdim=True)
        whole = ~(m & ~ok).any(dim=-1, keepdim=True)
        total = lr.double().sum(dim=-1, keepdim=True)
        if kind == "seq_mis":
            # In float64: a product of many ratios leaves float32's range long before the band
            # is crossed by much; a row whose sum of logs overflows is dropped, not weighted inf.
            rho_seq = torch.exp(total)
            keep = (rho_seq >= lo) & (rho_seq <= hi) & whole
            w = torch.where(keep, rho_seq, torch.zeros_like(rho_seq)).to(rho.dtype).expand_as(rho)
        else:  # geo_rs
            geo = torch.exp(total / n.clamp_min(1))
            keep = (geo >= lo) & (geo <= hi) & whole
            w = keep.to(rho.dtype).expand_as(rho)
    w = _zero_outside(w, ok)
    dropped = m & (w == 0)
    rows = m.any(dim=-1)
    raw = _zero_outside(torch.exp(clamp_log_ratio(lr)), ok)  # clamped as every metric's ratio
    metrics = {
        "corr/ess_raw": effective_sample_size(raw, m),
        "corr/ess": effective_sample_size(w, m),
        "corr/token_drop_frac": _frac(dropped, m),
        "corr/seq_drop_frac": (rows & ~(m & ~dropped).any(dim=-1)).sum().double()
        / rows.sum().clamp_min(1).double(),
        "corr/truncated_frac": _frac(truncated, m),
    }
    return w, _out(metrics, tensors)


# Staleness buckets in policy versions (lower edges) and position buckets in tokens.
STALENESS_BUCKETS: tuple[int, ...] = (0, 1, 2, 4, 8)
POSITION_BUCKETS: tuple[int, ...] = (0, 64, 256, 1024)


def _bucket_names(edges: tuple[int, ...]) -> list[str]:
    """``(0, 1, 2, 4)`` -> ``["0", "1", "2-3", "4up"]`` (no "+": MLflow refuses it in a name)."""
    names = []
    for lo, hi in zip(edges, (*edges[1:], None), strict=True):
        names.append(f"{lo}up" if hi is None else (f"{lo}" if hi == lo + 1 else f"{lo}-{hi - 1}"))
    return names


@torch.no_grad()
def gap_sums(
    log_ratio: Tensor, mask: Tensor, staleness: Tensor, positions: Tensor
) -> dict[str, Tensor]:
    """Sums and counts of the rollout-trainer gap, by staleness and by position bucket.

    The gap of a token is ``k3(d_t) = exp(d_t) - 1 - d_t`` with ``d_t = log pi_train - log
    pi_rollout`` (the engine sampled the token, so its mean estimates ``KL(engine || trainer)``,
    see :func:`saorl.losses.k3`). At staleness 0 (the trainer holds the weights that sampled
    the token) it is pure mismatch; at staleness ``s`` it adds ``s`` versions of policy lag. By
    position it shows whether the gap grows along a sequence (long-context kernels, MoE routing).

    Returns ``gap/k3_sum_stale<b>``, ``gap/tokens_stale<b>``, ``gap/k3_sum_pos<b>`` and
    ``gap/tokens_pos<b>`` (float64, 0-dim) for every bucket: sums, so that micro-batches add up;
    :func:`finish_gaps` turns them into means.

    Args:
        log_ratio: ``(B, T)`` ``d_t``.
        mask: ``(B, T)``, nonzero on the tokens to measure (action tokens).
        staleness: ``(B, T)`` integer policy versions between the sampler and the trainer.
        positions: ``(B, T)`` integer token positions within each row.
    """
    m = finite_tokens(mask, log_ratio)  # clamped before exp, as every metric's log-ratio
    d = clamp_log_ratio(_zero_outside(log_ratio.double(), m))
    gap = _zero_outside(torch.expm1(d) - d, m)
    out: dict[str, Tensor] = {}
    for what, values, edges in (
        ("stale", staleness, STALENESS_BUCKETS),
        ("pos", positions, POSITION_BUCKETS),
    ):
        bucket = torch.bucketize(values.long().contiguous(), torch.tensor(edges[1:]), right=True)
        bucket = bucket.to(values.device)
        for i, name in enumerate(_bucket_names(edges)):
            sel = m & (bucket == i) & (values >= 0)
            out[f"gap/k3_sum_{what}{name}"] = _zero_outside(gap, sel).sum()
            out[f"gap/tokens_{what}{name}"] = sel.sum().double()
    return out


def finish_gaps(metrics: dict[str, float | None]) -> None:
    """Replace :func:`gap_sums`' sums (added up over a step) by means, in place:
    ``gap/k3_stale<b>`` and ``gap/k3_pos<b>``, null for a bucket without tokens."""
    for key in [k for k in metrics if k.startswith("gap/k3_sum_")]:
        total = metrics.pop(key)
        n = metrics.get(key.replace("k3_sum_", "tokens_"))
        metrics[key.replace("k3_sum_", "k3_")] = total / n if n else None


CORRECTION_KEYS = (
    "corr/ess_raw",
    "corr/ess",
    "corr/token_drop_frac",
    "corr/seq_drop_frac",
    "corr/truncated_frac",
)


def lab_keys() -> list[str]:
    """The metrics a policy step logs here (corrections and gap buckets after
    :func:`finish_gaps`), for rows without a policy update (logged as null)."""
    return [*CORRECTION_KEYS] + [
        f"gap/{kind}_{what}{name}"
        for what, edges in (("stale", STALENESS_BUCKETS), ("pos", POSITION_BUCKETS))
        for name in _bucket_names(edges)
        for kind in ("k3", "tokens")
    ]


def policy_correction(
    algo: AlgorithmLike, trainer_logprobs: Tensor, rollout_logprobs: Tensor, mask: Tensor
) -> tuple[Tensor | None, Metrics]:
    """The weights (None when `algorithm.correction` is "none": the loss is left exactly as
    it is) and the `corr/*` metrics of one micro-batch; the metrics are logged whatever the
    correction, so a run without one still shows the ESS of its raw ratios.

    `trainer_logprobs`: the trainer's log-probs at the step's start where the learner has them
    (ppo_clip's old policy), else the current forward's (the same at the first mini-batch).
    """
    weights, metrics = correction_weights(
        trainer_logprobs.detach().float() - rollout_logprobs.float(),
        mask,
        algo.correction,
        algo.correction_low,
        algo.correction_high,
        tensors=True,
    )
    return (None if algo.correction == "none" else weights), metrics
