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
equals the full-batch one. Micro-batches are `micro_batch_size` padded rows, or with
`learner.micro_batch_tokens > 0` rows packed into one row without padding up to that many tokens
(`saorl.models.packing`). With `learner.fsdp` under torchrun, policy and critic are sharded with
FSDP2 and every rank trains its block of rows (`saorl.distributed.fsdp`). Metrics stay tensors
until the end of a step: no CPU-GPU sync per micro-batch in this file.
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
from saorl.config import Config, ConfigError
from saorl.distributed.fsdp import (
    fsdp_active,
    full_optimizer_state,
    full_state,
    gather_rows,
    load_full_state,
    rank_and_world,
    rank_bounds,
    reduce_metrics,
    scalar,
    shard_module,
)
from saorl.losses import (
    dis_policy_loss,
    logprob_mismatch,
    masked_aggregate,
    ppo_clip_policy_loss,
    value_loss,
)
from saorl.models.critic import Critic, freeze_attention
from saorl.models.logprobs import PolicyLogprobs
from saorl.models.packing import plan_token_micro_batches
from saorl.types import Batch


def _share(mask: torch.Tensor, total: torch.Tensor, agg: str) -> torch.Tensor:
    if agg == "token_mean":
        return mask.sum() / total.sum().clamp(min=1)
    rows = (mask.sum(-1) > 0).sum()
    return rows / (total.sum(-1) > 0).sum().clamp(min=1)


def _grad_norm_and_step(
    params: list[nn.Parameter], optimizer: torch.optim.Optimizer, clip: float
) -> tuple[float, bool]:
    """Clip, step unless the gradient is not finite; return (pre-clip norm, stepped)."""
    # One sync per optimizer step: whether to step depends on it. Under FSDP2 the norm is a
    # DTensor over the sharded gradients and `scalar` makes it whole.
    norm = scalar(torch.nn.utils.clip_grad_norm_(params, clip))
    if not math.isfinite(norm):
        optimizer.zero_grad(set_to_none=True)
        return norm, False
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return norm, True


class NonFiniteError(RuntimeError):
    """Too many learner steps in a row had a non-finite gradient."""


class Learner:
    """Owns the policy, the critic and their optimizers; `step(batch)` does one SAO step."""

    def __init__(self, cfg: Config, policy: nn.Module, device: torch.device) -> None:
        self.cfg = cfg
        self.device = device
        self.fsdp = fsdp_active(cfg)
        self.rank, self.world = rank_and_world(self.fsdp)
        self.policy = policy.to(device)
        # The critic is copied from the unsharded policy, before the policy is sharded.
        self.critic: Critic | None = None
        self.reset_critic_from_policy()
        # Log-probs run through this module's forward: FSDP2's root hooks gather the head there.
        self.policy_fwd = PolicyLogprobs(self.policy)
        if self.fsdp:
            shard_module(self.policy_fwd, cfg.learner.mixed_precision)
        self.policy_params = [p for p in self.policy.parameters() if p.requires_grad]
        self.policy_opt = torch.optim.AdamW(
            self.policy_params, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay
        )
        warm = cfg.learner.lr_warmup_steps
        # Stepped once per policy update: update i (from 0) runs at lr * min(1, (i + 1) / warm).
        self.policy_sched = torch.optim.lr_scheduler.LambdaLR(
            self.policy_opt, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0
        )
        self.version = 0  # policy version: number of policy optimizer steps taken
        self.steps = 0  # learner steps (critic warm-up steps included)
        self.skipped_steps = 0  # optimizer steps whose gradient was not finite
        self.nonfinite_streak = 0  # learner steps in a row with a skipped optimizer step
        self.baseline = RunningMeanBaseline(window=cfg.algorithm.baseline_window)

    def reset_critic_from_policy(self) -> None:
        """(Re-)initialise the critic from the current policy, with a fresh optimizer.

        Called at construction and again after a supervised warm-up, so that the critic starts
        from the policy it will judge (DESIGN.md section 1).
        """
        cfg = self.cfg
        if self.fsdp and self.critic is not None:
            self._reset_sharded_critic()
        else:
            self.critic = Critic(self.policy).to(self.device)
            self.frozen: list[str] = []
            if cfg.critic.freeze == "attention":
                self.frozen = freeze_attention(self.critic)
            if self.fsdp:
                shard_module(self.critic, cfg.learner.mixed_precision)
        self.critic_params = [p for p in self.critic.parameters() if p.requires_grad]
        self.critic_opt = torch.optim.AdamW(
            self.critic_params, lr=cfg.critic.lr, weight_decay=cfg.critic.weight_decay
        )

    def _reset_sharded_critic(self) -> None:
        """Sharded critic <- gathered policy backbone and a zero value head (FSDP mode)."""
        prefix = self.policy.base_model_prefix + "."
        policy = full_state(self.policy, everywhere=True)
        state = {
            "backbone." + k[len(prefix) :]: v for k, v in policy.items() if k.startswith(prefix)
        }
        dtype = next(iter(state.values())).dtype
        head = self.critic.value_head
        state["value_head.weight"] = torch.zeros(head.weight.shape, dtype=dtype)
        state["value_head.bias"] = torch.zeros(head.bias.shape, dtype=dtype)
        load_full_state(self.critic, state if self.rank == 0 else {})

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizers, scheduler and counters for a checkpoint (`load_state` inverse).

        Under FSDP this gathers the full states (all ranks must call it); rank 0 gets them on
        CPU, the other ranks get empty weight and optimizer dicts.
        """
        if self.fsdp:
            weights = {
                "policy": full_state(self.policy),
                "critic": full_state(self.critic),
                "policy_opt": full_optimizer_state(self.policy, self.policy_opt),
                "critic_opt": full_optimizer_state(self.critic, self.critic_opt),
            }
        else:
            weights = {
                "policy": self.policy.state_dict(),
                "critic": self.critic.state_dict(),
                "policy_opt": self.policy_opt.state_dict(),
                "critic_opt": self.critic_opt.state_dict(),
            }
        return {
            "step": self.steps,
            "version": self.version,
            **weights,
            "policy_sched": self.policy_sched.state_dict(),
            "skipped_steps": self.skipped_steps,
            "baseline": self.baseline.state_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimizers and counters from a checkpoint dict.

        Under FSDP every rank calls it; only rank 0's weight and optimizer entries are read
        (they are broadcast), the counters must be given on every rank.
        """
        if self.fsdp:
            load_full_state(self.policy, state.get("policy", {}), self.policy_opt,
                            state.get("policy_opt"))  # fmt: skip
            load_full_state(self.critic, state.get("critic", {}), self.critic_opt,
                            state.get("critic_opt"))  # fmt: skip
        else:
            try:
                self.policy.load_state_dict(state["policy"])
                self.critic.load_state_dict(state["critic"])
                self.policy_opt.load_state_dict(state["policy_opt"])
            except (KeyError, RuntimeError, ValueError) as e:
                raise ConfigError(
                    f"the checkpoint does not fit this run's model/learner config "
                    f"({type(e).__name__}: {str(e)[:300]}); resume with the run's own config.toml"
                ) from e
            self.critic_opt.load_state_dict(state["critic_opt"])
        if "policy_sched" in state:
            self.policy_sched.load_state_dict(state["policy_sched"])
        self.steps = state["step"]
        self.version = state["version"]
        self.skipped_steps = state.get("skipped_steps", 0)
        if "baseline" in state:
            self.baseline.load_state_dict(state["baseline"])

    def _micro_batches(self, batch: Batch) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches as `(row indices, live)`.

        `micro_batch_size` rows at a time, or rows grouped by the `micro_batch_tokens` budget.
        Under FSDP every rank must run as many forward/backward passes as the others (each one
        gathers parameters collectively), so a rank with fewer micro-batches adds passes over
        one of its rows with `live=False`, weighted 0. Every rank sees the whole batch, so each
        computes all ranks' plans and no communication is needed to agree on the count.
        """
        lc = self.cfg.learner
        lengths = batch.attention_mask.sum(-1).tolist()
        plans: list[list[list[int]]] = []
        for r in range(self.world):
            lo, hi = rank_bounds(batch.size, r, self.world)
            if lc.micro_batch_tokens:
                plan = plan_token_micro_batches(lengths[lo:hi], lc.micro_batch_tokens)
                plans.append([[lo + i for i in mb] for mb in plan])
            else:
                step = lc.micro_batch_size
                plans.append([list(range(i, min(i + step, hi))) for i in range(lo, hi, step)])
        mine = [(mb, True) for mb in plans[self.rank]]
        filler = mine[0][0][:1] if mine else [0]
        return mine + [(filler, False)] * (max(map(len, plans)) - len(mine))

    def _rows_forward(self, b: Batch, fn: Any) -> torch.Tensor:
        """`fn(micro_batch) -> (n, T)` over this rank's rows, gathered to `(B, T)` under FSDP."""
        lo, hi = rank_bounds(b.size, self.rank, self.world)
        local = torch.zeros_like(b.rewards[lo:hi])
        for rows, live in self._micro_batches(b):
            out = fn(b.select(rows))
            if live:  # packed micro-batches need not be contiguous: put rows back in place
                local[torch.tensor(rows) - lo] = out
        return gather_rows(local, b.size) if self.fsdp else local

    def _logprobs(self, mb: Batch, return_entropy: bool = False) -> Any:
        cfg = self.cfg
        return self.policy_fwd(
            mb.input_ids, mb.attention_mask, temperature=cfg.rollout.temperature,
            chunk_size=cfg.model.logprob_chunk_size, return_entropy=return_entropy,
            packed=cfg.learner.micro_batch_tokens > 0,
        )  # fmt: skip

    def _values(self, mb: Batch) -> torch.Tensor:
        packed = self.cfg.learner.micro_batch_tokens > 0
        return self.critic(mb.input_ids, mb.attention_mask, packed=packed)

    def _finish_metrics(
        self, sums: dict[str, torch.Tensor], mins: dict[str, float], maxs: dict[str, float]
    ) -> dict[str, float]:
        """Per-step metrics to python floats, reduced over ranks under FSDP: one sync."""
        if self.fsdp:
            return reduce_metrics(sums, mins, maxs, self.device)
        out: dict[str, float] = {**mins, **maxs}
        if sums:
            keys = list(sums)
            dev = self.device
            vals = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64, device=dev)
                                for k in keys])  # fmt: skip
            out.update(zip(keys, vals.tolist(), strict=True))
        return out

    def policy_state(self) -> dict[str, torch.Tensor]:
        """The policy weights to push to the engines (detached, on the learner's device).

        Under FSDP the full weights are gathered (all ranks must call it) onto rank 0's CPU;
        the other ranks get `{}`.
        """
        if self.fsdp:
            return full_state(self.policy)
        return {k: v.detach() for k, v in self.policy.state_dict().items()}

    def step(self, batch: Batch) -> dict[str, Any]:
        """One learner step on a batch; the algorithm is chosen by `algorithm.name`."""
        cfg, name = self.cfg, self.cfg.algorithm.name
        skipped_before = self.skipped_steps
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
            metrics.update({"loss/policy": None, "dis/masked_frac": None, "mismatch/k3": None,
                            "mismatch/max_abs_logprob_diff": None})  # fmt: skip
        else:
            ppo = name in ("grpo", "vapo")
            metrics.update(self._policy_step(b, advantages, ppo=ppo))
        self.steps += 1
        self._check_nonfinite(skipped_before)
        metrics["learner/version"] = self.version
        metrics["learner/skipped_steps"] = self.skipped_steps
        return metrics

    def _check_nonfinite(self, skipped_before: int) -> None:
        """Count learner steps in a row that skipped an update; stop after too many.

        A skipped update leaves the weights and optimizer state as they were, so one bad batch
        costs nothing; a streak means the weights or the data went bad and more steps would only
        burn compute.
        """
        if self.skipped_steps == skipped_before:
            self.nonfinite_streak = 0
            return
        self.nonfinite_streak += 1
        limit = self.cfg.learner.max_nonfinite_in_a_row
        if self.nonfinite_streak >= limit:
            raise NonFiniteError(
                f"{self.nonfinite_streak} learner steps in a row had a NaN/Inf gradient (step "
                f"{self.steps}); each was skipped with the weights unchanged. The last checkpoint "
                "holds the last good weights: lower learner.lr / critic.lr, check rewards for "
                f"NaN, or raise learner.max_nonfinite_in_a_row (now {limit})"
            )

    def _critic_phase(self, b: Batch) -> tuple[torch.Tensor, dict[str, Any]]:
        """Values before any update, GAE advantages and returns, then K critic updates."""
        cfg, algo = self.cfg, self.cfg.algorithm
        mask = b.action_mask
        # Advantages may also run over observation tokens when skipping is switched off
        # (an ablation); the losses always cover action tokens only.
        gae_mask = mask if algo.skip_observations else b.completion_mask
        self.critic.eval()
        with torch.no_grad():
            old_values = self._rows_forward(b, self._values) * gae_mask
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
        micro = self._micro_batches(b)
        for _ in range(cfg.critic.updates_per_step):
            total = torch.zeros((), device=self.device)
            for rows, live in micro:
                mb = b.select(rows)
                values = self._values(mb)
                loss, _ = value_loss(
                    values,
                    returns[rows],
                    mb.action_mask,
                    old_values=old_values[rows] if cfg.critic.value_clip else None,
                    clip=cfg.critic.value_clip,
                    agg=algo.loss_agg,
                )
                w = _share(mb.action_mask, mask, algo.loss_agg) * live
                (loss * w).backward()
                total = total + loss.detach() * w
            norm, ok = _grad_norm_and_step(
                self.critic_params, self.critic_opt, cfg.critic.grad_clip
            )
            self.skipped_steps += int(not ok)
        metrics.update(self._finish_metrics({"loss/value": total}, {}, {}))
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
                old_logprobs = self._rows_forward(b, self._logprobs)
        self.policy.train()
        n_mb = algo.minibatches
        bounds = [round(i * b.size / n_mb) for i in range(n_mb + 1)]
        sums: dict[str, torch.Tensor] = {}
        mins: dict[str, float] = {}
        maxs: dict[str, float] = {}
        last: dict[str, float] = {}
        for lo, hi in itertools.pairwise(bounds):
            part = b.select(slice(lo, hi))
            part_adv = advantages[lo:hi]
            part_old = old_logprobs[lo:hi] if old_logprobs is not None else None
            self._accumulate_policy_grad(part, part_adv, part_old, (sums, mins, maxs), 1.0 / n_mb)
            norm, ok = _grad_norm_and_step(
                self.policy_params, self.policy_opt, cfg.learner.grad_clip
            )
            self.skipped_steps += int(not ok)
            last["policy/lr"] = self.policy_opt.param_groups[0]["lr"]
            if ok:
                self.version += 1
                self.policy_sched.step()
            last["policy/grad_norm"] = norm
        out = {**self._finish_metrics(sums, mins, maxs), **last}
        n, k3_sum = out["mismatch/tokens"], out.pop("mismatch/k3_sum")
        out["mismatch/k3"] = k3_sum / n if n else None  # null when no token was on-policy
        if not n:
            out["mismatch/max_abs_logprob_diff"] = None
        return out

    def _accumulate_policy_grad(
        self,
        b: Batch,
        advantages: torch.Tensor,
        old_logprobs: torch.Tensor | None,
        acc: tuple[dict[str, torch.Tensor], dict[str, float], dict[str, float]],
        scale: float,
    ) -> None:
        algo = self.cfg.algorithm
        sums, mins, maxs = acc
        mask = b.action_mask
        for rows, live in self._micro_batches(b):
            mb = b.select(rows)
            logprobs, entropy = self._logprobs(mb, return_entropy=True)
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
            # Aggregated like the loss, so that weighting by the share sums to the batch value.
            ent = masked_aggregate(entropy, mb.action_mask, algo.loss_agg)
            if algo.entropy_coef:
                loss = loss - algo.entropy_coef * ent
            if algo.kl_coef:
                # k3 estimate of KL(current || rollout) on action tokens, as an optional penalty.
                d = mb.rollout_logprobs - logprobs
                k3 = masked_aggregate(d.exp() - 1 - d, mb.action_mask, algo.loss_agg)
                loss = loss + algo.kl_coef * k3
            w = _share(mb.action_mask, mask, algo.loss_agg) * live
            (loss * w).backward()
            pm["policy/entropy"] = ent.detach()
            for k, v in pm.items():
                # Min/max metrics combine by min/max, everything else by the batch share. A
                # filler pass (live=False) reruns a row of this batch: harmless for min/max.
                if k.endswith("_min"):
                    mins[k] = min(mins.get(k, math.inf), v)
                elif k.endswith("_max"):
                    maxs[k] = max(maxs.get(k, -math.inf), v)
                else:
                    sums[k] = sums.get(k, 0.0) + v * w * scale
            # Engine/learner log-prob agreement, which DIS relies on, on the tokens the policy
            # held here sampled (older ones would measure staleness); finished in _policy_step.
            cur = mb.action_mask.bool() & (mb.versions == self.version) & bool(live)
            mm = logprob_mismatch(logprobs.detach(), mb.rollout_logprobs, cur)
            n = mm["mismatch/tokens"]
            sums["mismatch/tokens"] = sums.get("mismatch/tokens", 0.0) + n
            sums["mismatch/k3_sum"] = sums.get("mismatch/k3_sum", 0.0) + mm["mismatch/k3"] * n
            key = "mismatch/max_abs_logprob_diff"
            maxs[key] = max(maxs.get(key, 0.0), mm[key])
