"""The policy half of the learner's step: mini-batches, micro-batches, the loss, diagnostics.

`update_policy` runs `algorithm.minibatches` policy optimizer steps on one batch, each
accumulating the micro-batches' gradients of the configured policy loss (DIS or PPO clip, with an
optional mismatch correction, entropy bonus, sampler KL penalty and VAPO's LM loss), and the
engine / learner log-prob diagnostics of the tokens it trains on (`mismatch/*`, `gap/*`,
`corr/*`). It works on a `PolicyState`, what `saorl.learner.learner.Learner` hands it for one
step: the policy, its optimizer and schedule, the learner's forward passes and counters.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from saorl.config import AlgorithmConfig, LearnerConfig
from saorl.corrections import gap_sums, policy_correction
from saorl.learner.critic_updater import share
from saorl.learner.sharding import MicroBatch, Sharding, StepFlags, StepMetrics
from saorl.losses import (
    dis_policy_loss,
    logprob_mismatch,
    masked_aggregate,
    nonfinite_tokens,
    positive_lm_loss,
    ppo_clip_policy_loss,
    reference_kl_penalty,
    sampler_kl_penalty,
)
from saorl.models.routing import RoutingReplay, replay_routing
from saorl.types import Batch


@dataclass
class PolicyState:
    """What one policy update works on: the learner's, handed over for one step."""

    algo: AlgorithmConfig
    learner: LearnerConfig
    policy: nn.Module
    opt: Any  # a torch optimizer (`saorl.learner.optim.adamw`)
    params: list[nn.Parameter]
    sched: torch.optim.lr_scheduler.LRScheduler
    sharding: Sharding
    replay: RoutingReplay | None
    version: int  # the policy version before this update (optimizer steps taken and settled)
    # The learner's forward passes: (batch, return_entropy) -> log-probs (and entropies); the
    # frozen reference's log-probs (`algorithm.kl_reference = "initial"`); a micro-batch plan.
    logprobs: Callable[..., Any]
    reference_logprobs: Callable[[Batch], torch.Tensor]
    micro_batches: Callable[[list[int]], list[MicroBatch]]
    # Counts optimizer steps whose flags were read (the version, lr schedule, skipped steps).
    settle: Callable[[list[bool]], None]


def update_policy(
    s: PolicyState,
    b: Batch,
    lengths: list[int],
    micro: list[MicroBatch],
    advantages: torch.Tensor,
    m: StepMetrics,
    flags: StepFlags,
) -> dict[str, float]:
    """`algorithm.minibatches` policy optimizer steps, one per mini-batch of rows.

    Each token's ratio is taken against a reference: for DIS the log-probs the engine
    recorded when it sampled the token; for PPO clip the old policy, i.e. these weights at
    the start of the step, recomputed here (docs/design.md section 1). Whether each
    optimizer step was taken goes into `flags.policy_stepped`, for the learner to settle.
    """
    algo = s.algo
    if algo.policy_loss == "ppo_clip":
        s.policy.eval()
        with torch.no_grad():
            reference = s.sharding.map_rows(b, micro, s.logprobs)
    else:
        reference = b.rollout_logprobs
    # Rows whose outcome counts as correct, for VAPO's positive-example LM loss.
    positive = (b.scores >= algo.lm_loss_min_reward).to(b.action_mask.dtype)
    if algo.lm_loss_coef:
        m.set("lm/positive_frac", positive.mean())
    s.policy.train()
    n_mb = min(algo.minibatches, b.size)  # a short batch gets no empty mini-batch
    bounds = [round(i * b.size / n_mb) for i in range(n_mb + 1)]
    last: dict[str, float] = {}
    pending = flags.policy_stepped  # flags of the steps taken here, not yet settled
    warm = s.learner.lr_warmup_steps
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        part = b.select(slice(lo, hi))
        part_pos = part.action_mask * positive[lo:hi, None]
        # The policy version now: a device tensor while some steps are unsettled.
        version = s.version + sum(ok.long() for ok in pending) if pending else s.version
        for mb in s.micro_batches(lengths[lo:hi]):
            adv, ref, pos = (x[lo:hi][mb.rows] for x in (advantages, reference, positive))
            pair = (pos, part_pos)
            with replay_routing(s.replay, part.select(mb.rows)):  # and layers' recompute
                _policy_micro_step(s, part, mb, adv, ref, pair, 1.0 / n_mb, m, version)
        last["policy/lr"] = s.opt.param_groups[0]["lr"]
        norm, ok = s.sharding.optimizer_step(s.params, s.opt, s.learner.grad_clip)
        pending.append(ok)
        m.set("policy/grad_norm", norm)
        if i + 1 < n_mb and warm and s.sched.last_epoch + 1 < warm:
            # In the lr warm-up the next mini-batch's lr depends on this step: read now.
            taken = bool(ok)
            s.settle([taken])
            s.version += taken  # as the learner's, which `settle` advanced
            pending.clear()
    return last


def _policy_micro_step(
    s: PolicyState,
    part: Batch,
    mb: MicroBatch,
    advantages: torch.Tensor,
    reference: torch.Tensor,
    positive: tuple[torch.Tensor, torch.Tensor],
    scale: float,
    m: StepMetrics,
    version: int | torch.Tensor,
) -> None:
    """Forward and backward of the policy loss on micro-batch `mb` of mini-batch `part`,
    weighted by its share of `part`; metrics weighted by that share times `scale`.
    `version`: the policy's version (a device tensor while earlier steps are unsettled)."""
    algo = s.algo
    x = part.select(mb.rows)
    mask = x.action_mask
    w = share(mask, part.action_mask, algo.loss_agg) * mb.weight
    logprobs, entropy = s.logprobs(x, return_entropy=True)
    # algorithm.correction: per-token weights from the trainer/engine ratio (corrections.py)
    trainer = reference if algo.policy_loss == "ppo_clip" else logprobs
    weights, cm = policy_correction(algo, trainer, x.rollout_logprobs, mask)
    # DIS's band against the engine, or PPO clip's against the old policy (`reference`).
    losses = {
        "dis": (dis_policy_loss, algo.eps_low, algo.eps_high),
        "ppo_clip": (ppo_clip_policy_loss, algo.clip_eps_low, algo.clip_eps_high),
    }
    if algo.policy_loss not in losses:
        raise ValueError(f"algorithm.policy_loss: unknown loss {algo.policy_loss!r}")
    loss_fn, eps_low, eps_high = losses[algo.policy_loss]
    loss, pm = loss_fn(
        logprobs,
        reference,
        advantages,
        mask,
        eps_low=eps_low,
        eps_high=eps_high,
        agg=algo.loss_agg,
        tensors=True,
        token_weights=weights,
    )
    # Aggregated like the loss, so that weighting by the share sums to the batch value.
    ent = masked_aggregate(entropy, mask, algo.loss_agg)
    if algo.entropy_coef:
        loss = loss - algo.entropy_coef * ent
    if algo.kl_coef and algo.kl_reference == "initial":  # KL(current || policy at RL start)
        ref = s.reference_logprobs(x)
        loss = loss + algo.kl_coef * reference_kl_penalty(logprobs, ref, mask, algo.loss_agg)
    elif algo.kl_coef:  # k3 estimate of KL(rollout || current)
        kl = sampler_kl_penalty(logprobs, x.rollout_logprobs, mask, algo.loss_agg)
        loss = loss + algo.kl_coef * kl
    total = loss * w
    if algo.lm_loss_coef:  # weighted by mb's share of the correct rows' tokens of `part`
        lm, _ = positive_lm_loss(logprobs, mask, positive[0], algo.loss_agg, tensors=True)
        w_lm = share(mask * positive[0][:, None], positive[1], algo.loss_agg) * mb.weight
        total = total + algo.lm_loss_coef * lm * w_lm
        m.add("loss/lm", lm.detach() * w_lm, scale)
    total.backward()
    pm["policy/entropy"] = ent.detach()
    pm.update(cm)
    for key, value in pm.items():
        # A filler pass (weight 0) reruns a row of this batch: harmless for min and max.
        if key == "dis/ratio_min":
            m.low(key, value)
        elif key == "dis/ratio_max":
            m.high(key, value)
        else:
            m.add(key, value * w, scale)
    # Engine/learner log-prob agreement, which DIS relies on, on the tokens the policy held
    # here sampled (older ones would measure staleness); finished by `_finish_mismatch`.
    current = mask.bool() & (x.versions == version)
    mm = logprob_mismatch(logprobs.detach(), x.rollout_logprobs, current, tensors=True)
    n = mm["mismatch/tokens"] * mb.weight
    m.add("mismatch/tokens", n)
    m.add("mismatch/k3_sum", mm["mismatch/k3"] * n)
    m.high("mismatch/max_abs_logprob_diff", mm["mismatch/max_abs_logprob_diff"])
    # Action tokens with a NaN/inf log-prob (learner, engine or old policy): the losses and
    # corrections gave them nothing (saorl.losses.finite_tokens); how many, per step.
    bad = nonfinite_tokens(mask, logprobs, x.rollout_logprobs, reference)
    m.add("mismatch/nonfinite_tokens", bad * mb.weight)
    # The gap by staleness (0: pure mismatch) and by position (corrections.gap_sums).
    positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
    diff = logprobs.detach() - x.rollout_logprobs
    for key, value in gap_sums(diff, mask, version - x.versions, positions).items():
        m.add(key, value * mb.weight)


def finish_mismatch(metrics: dict[str, Any]) -> None:
    n = metrics["mismatch/tokens"]
    k3_sum = metrics.pop("mismatch/k3_sum")
    metrics["mismatch/k3"] = k3_sum / n if n else None  # null when no token was on-policy
    if not n:
        metrics["mismatch/max_abs_logprob_diff"] = None
