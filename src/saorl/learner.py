"""The learner: one optimizer step per call, for the policy and its critic.

For SAO (DESIGN.md section 1) one step on a batch of finished single rollouts is:
1. critic values for every position (before any critic update: a baseline must not have seen
   the outcome it is compared with);
2. skip-observation GAE with the length-adaptive `lambda_policy` -> advantages, and with
   `lambda_critic` (1 by default) -> value targets;
3. K critic optimizer steps on the value loss;
4. unless still in critic warm-up, one DIS policy step; the policy version then advances.

Micro-batches accumulate gradients; each micro-batch loss is weighted by its share of the batch
(action tokens for `token_mean`, rows for `seq_mean_token_mean`) so the accumulated gradient
equals the full-batch one.
"""

from __future__ import annotations

import itertools
import math
from typing import Any

import torch
from torch import nn

from saorl.advantages import (
    RunningMeanBaseline,
    group_normalized_advantages,
    length_adaptive_lambda,
    skip_observation_gae,
)
from saorl.config import Config
from saorl.losses import dis_policy_loss, ppo_clip_policy_loss, value_loss
from saorl.models.critic import Critic, freeze_attention
from saorl.models.logprobs import sequence_logprobs
from saorl.types import Batch


def _share(mask: torch.Tensor, total: torch.Tensor, agg: str) -> float:
    if agg == "token_mean":
        return float(mask.sum() / total.sum().clamp(min=1))
    rows = (mask.sum(-1) > 0).sum()
    return float(rows / (total.sum(-1) > 0).sum().clamp(min=1))


def _grad_norm_and_step(
    params: list[nn.Parameter], optimizer: torch.optim.Optimizer, clip: float
) -> tuple[float, bool]:
    """Clip, step unless the gradient is not finite; return (pre-clip norm, stepped)."""
    norm = float(torch.nn.utils.clip_grad_norm_(params, clip))
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, True


class Learner:
    """Owns the policy, the critic and their optimizers; `step(batch)` does one SAO step."""

    def __init__(self, cfg: Config, policy: nn.Module, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.policy = policy.to(device)
        self.policy_params = [p for p in self.policy.parameters() if p.requires_grad]
        self.policy_opt = torch.optim.AdamW(
            self.policy_params, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay
        )
        warm = cfg.learner.lr_warmup_steps
        # Stepped once per policy update: update i (from 0) runs at lr * min(1, (i + 1) / warm).
        self.policy_sched = torch.optim.lr_scheduler.LambdaLR(
            self.policy_opt, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0
        )
        self.reset_critic_from_policy()
        self.version = 0  # policy version: number of policy optimizer steps taken
        self.steps = 0  # learner steps (critic warm-up steps included)
        self.skipped_steps = 0  # steps whose gradient was not finite
        self.baseline = RunningMeanBaseline(window=cfg.algorithm.baseline_window)

    def reset_critic_from_policy(self) -> None:
        """(Re-)initialise the critic from the current policy, with a fresh optimizer.

        Called at construction and again after a supervised warm-up, so that the critic starts
        from the policy it will judge (DESIGN.md section 1).
        """
        cfg = self.cfg
        self.critic = Critic(self.policy).to(self.device)
        self.frozen: list[str] = []
        if cfg.critic.freeze == "attention":
            self.frozen = freeze_attention(self.critic)
        self.critic_params = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_opt = torch.optim.AdamW(
            self.critic_params, lr=cfg.critic.lr, weight_decay=cfg.critic.weight_decay
        )

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimizers and counters from a checkpoint dict."""
        self.policy.load_state_dict(state["policy"])
        self.critic.load_state_dict(state["critic"])
        self.policy_opt.load_state_dict(state["policy_opt"])
        if "policy_sched" in state:
            self.policy_sched.load_state_dict(state["policy_sched"])
        self.critic_opt.load_state_dict(state["critic_opt"])
        self.steps = state["step"]
        self.version = state["version"]
        self.skipped_steps = state.get("skipped_steps", 0)
        if "baseline" in state:
            self.baseline.load_state_dict(state["baseline"])

    def _micro_slices(self, batch: Batch) -> list[slice]:
        mb = self.cfg.learner.micro_batch_size
        return [slice(i, i + mb) for i in range(0, batch.size, mb)]

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The policy weights to push to the engines (detached, on the learner's device)."""
        return {k: v.detach() for k, v in self.policy.state_dict().items()}

    def step(self, batch: Batch) -> dict[str, Any]:
        """One learner step on a batch; the algorithm is chosen by `algorithm.name`."""
        cfg, name = self.cfg, self.cfg.algorithm.name
        b = batch.to(self.device)
        mask = b.action_mask
        metrics: dict[str, Any] = {}
        warmup = False
        if name in ("sao", "vapo"):
            advantages, critic_metrics = self._critic_phase(b)
            metrics.update(critic_metrics)
            warmup = self.steps < cfg.critic.warmup_steps
        elif name in ("grpo", "grpo_dis"):
            # Group-normalised outcome advantage, the same on every action token of a row.
            seq_adv = group_normalized_advantages(b.scores, b.group_ids).to(mask.dtype)
            advantages = seq_adv[:, None] * mask
        elif name == "running_mean":
            seq_adv = torch.tensor(
                [self.baseline.advantage(k, r) for k, r in zip(b.prompt_keys, b.scores.tolist(),
                                                                strict=True)],
                dtype=mask.dtype, device=mask.device,
            )  # fmt: skip
            advantages = seq_adv[:, None] * mask
        else:
            raise ValueError(f"algorithm.name: unknown algorithm {name!r}")
        metrics["advantage/mean"] = float((advantages * mask).sum() / mask.sum().clamp(min=1))
        metrics["learner/warmup"] = float(warmup)
        if warmup:
            # No policy update yet: the policy keys are logged as null so every row of
            # metrics.jsonl has the same columns.
            metrics.update({"loss/policy": None, "dis/masked_frac": None})
        else:
            ppo = name in ("grpo", "vapo")
            metrics.update(self._policy_step(b, advantages, ppo=ppo))
        self.steps += 1
        metrics["learner/version"] = self.version
        metrics["learner/skipped_steps"] = self.skipped_steps
        return metrics

    def _critic_phase(self, b: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        """Values before any update, GAE advantages and returns, then K critic updates."""
        cfg, algo = self.cfg, self.cfg.algorithm
        mask = b.action_mask
        # Advantages may also run over observation tokens when skipping is switched off
        # (an ablation); the losses always cover action tokens only.
        gae_mask = mask if algo.skip_observations else b.completion_mask
        self.critic.eval()
        with torch.no_grad():
            old_values = self.critic(b.input_ids, b.attention_mask) * gae_mask
        if algo.lambda_mode == "adaptive":
            lam = length_adaptive_lambda(gae_mask, alpha=algo.lambda_alpha)
        else:
            lam = algo.lambda_policy
        advantages, _ = skip_observation_gae(b.rewards, old_values, gae_mask, algo.gamma, lam)
        _, returns = skip_observation_gae(
            b.rewards, old_values, gae_mask, algo.gamma, algo.lambda_critic
        )
        with torch.no_grad():
            _, vm = value_loss(old_values, returns, mask)
        metrics: dict[str, Any] = {
            "value/explained_variance": vm["value/explained_variance"],
            "value/mean": vm["value/mean"],
        }
        # K critic updates on the same batch (paper 3.2: faster critic than policy).
        self.critic.train()
        for _ in range(cfg.critic.updates_per_step):
            total = 0.0
            for rows in self._micro_slices(b):
                mb = b.select(rows)
                values = self.critic(mb.input_ids, mb.attention_mask)
                loss, _ = value_loss(
                    values,
                    returns[rows],
                    mb.action_mask,
                    old_values=old_values[rows] if cfg.critic.value_clip else None,
                    clip=cfg.critic.value_clip,
                    agg=algo.loss_agg,
                )
                w = _share(mb.action_mask, mask, algo.loss_agg)
                (loss * w).backward()
                total += float(loss.detach()) * w
            norm, ok = _grad_norm_and_step(
                self.critic_params, self.critic_opt, cfg.critic.grad_clip
            )
            self.skipped_steps += int(not ok)
        metrics["loss/value"] = total
        metrics["critic/grad_norm"] = norm
        return advantages, metrics

    def _policy_step(self, b: Batch, advantages: torch.Tensor, ppo: bool) -> dict[str, Any]:
        """`algorithm.minibatches` policy optimizer steps, one per mini-batch of rows.

        DIS weighs tokens against the rollout engine's log-probs; PPO (grpo, vapo) clips the
        ratio to the old policy, the trainer's weights at the start of this step, recomputed
        here (DESIGN.md section 1).
        """
        cfg, algo = self.cfg, self.cfg.algorithm
        old_logprobs = None
        if ppo:
            with torch.no_grad():
                self.policy.eval()
                old_logprobs = torch.cat([
                    sequence_logprobs(self.policy, b.input_ids[r], b.attention_mask[r],
                                      temperature=cfg.rollout.temperature,
                                      chunk_size=cfg.model.logprob_chunk_size)
                    for r in self._micro_slices(b)
                ])  # fmt: skip
        self.policy.train()
        n_mb = algo.minibatches
        bounds = [round(i * b.size / n_mb) for i in range(n_mb + 1)]
        sums: dict[str, float] = {}
        for lo, hi in itertools.pairwise(bounds):
            part = b.select(slice(lo, hi))
            part_adv = advantages[lo:hi]
            part_old = old_logprobs[lo:hi] if old_logprobs is not None else None
            self._accumulate_policy_grad(part, part_adv, part_old, sums, 1.0 / n_mb)
            norm, ok = _grad_norm_and_step(
                self.policy_params, self.policy_opt, cfg.learner.grad_clip
            )
            self.skipped_steps += int(not ok)
            sums["policy/lr"] = self.policy_opt.param_groups[0]["lr"]
            if ok:
                self.version += 1
                self.policy_sched.step()
            sums["policy/grad_norm"] = norm
        return sums

    def _accumulate_policy_grad(
        self,
        b: Batch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        sums: dict[str, float],
        scale: float,
    ) -> None:
        cfg, algo = self.cfg, self.cfg.algorithm
        mask = b.action_mask
        for rows in self._micro_slices(b):
            mb = b.select(rows)
            logprobs, entropy = sequence_logprobs(
                self.policy,
                mb.input_ids,
                mb.attention_mask,
                temperature=cfg.rollout.temperature,
                chunk_size=cfg.model.logprob_chunk_size,
                return_entropy=True,
            )
            if old_logprobs is None:
                loss, pm = dis_policy_loss(
                    logprobs, mb.rollout_logprobs, advantages[rows], mb.action_mask,
                    eps_low=algo.eps_low, eps_high=algo.eps_high, agg=algo.loss_agg,
                )  # fmt: skip
            else:
                loss, pm = ppo_clip_policy_loss(
                    logprobs, old_logprobs[rows], advantages[rows], mb.action_mask,
                    eps_low=algo.clip_eps_low, eps_high=algo.clip_eps_high, agg=algo.loss_agg,
                )  # fmt: skip
            ent = (entropy * mb.action_mask).sum() / mb.action_mask.sum().clamp(min=1)
            if algo.entropy_coef:
                loss = loss - algo.entropy_coef * ent
            if algo.kl_coef:
                # k3 estimate of KL(current || rollout) on action tokens, as an optional penalty.
                d = mb.rollout_logprobs - logprobs
                k3 = ((d.exp() - 1 - d) * mb.action_mask).sum() / mb.action_mask.sum().clamp(min=1)
                loss = loss + algo.kl_coef * k3
            w = _share(mb.action_mask, mask, algo.loss_agg)
            (loss * w).backward()
            pm["policy/entropy"] = float(ent.detach())
            for k, v in pm.items():
                # Min/max metrics combine by min/max, everything else by the batch share.
                if k.endswith("_min"):
                    sums[k] = min(sums.get(k, math.inf), v)
                elif k.endswith("_max"):
                    sums[k] = max(sums.get(k, -math.inf), v)
                else:
                    sums[k] = sums.get(k, 0.0) + v * w * scale
