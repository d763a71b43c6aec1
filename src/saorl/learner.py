"""The learner: the policy, its critic, their optimizers, and one SAO step per batch.

For SAO (docs/design.md section 1) one step on a batch of finished single rollouts is:
1. critic values for every position, before any critic update (a baseline must not have seen
   the outcome it is compared with);
2. skip-observation GAE with the length-adaptive `lambda_policy` -> advantages, and with
   `lambda_critic` (1 by default) -> value targets;
3. K critic optimizer steps on the value loss;
4. unless still in critic warm-up, one DIS policy step; the policy version then advances.

`algorithm.advantage` picks step 1-3 (`gae`) or a critic-free estimator (`group`: GRPO's
group-normalised outcome, `running_mean`: reward minus the prompt's running mean);
`algorithm.policy_loss` picks the ratio of step 4 (`dis`: against the engine's recorded
log-probs, `ppo_clip`: against the old policy, the weights at the start of the step).

Micro-batches accumulate gradients; each micro-batch loss is weighted by its share of the batch
(action tokens for `token_mean`, rows for `seq_mean_token_mean`), so the accumulated gradient
equals the full-batch one. Micro-batches are `micro_batch_size` padded rows, or with
`learner.micro_batch_tokens > 0` rows packed into one row without padding up to that many tokens
(`saorl.models.packing`).

Steps 1-3 belong to the critic's `saorl.critic_updater.CriticUpdater` (in this process, or in
a Ray actor of its own: `saorl.distributed.ray_critic`). With `critic.concurrent` its K updates
run while this class runs step 4, on a thread of their own; the step's numbers are the same.

This class is written for one process. Sharding over several ranks (FSDP2) changes what
`self.sharding` does (`saorl.sharding`, `saorl.distributed.fsdp.FSDPSharding`), not this code.
Nothing in a step waits for the device but its metrics, read once at its end. Losses and
metrics stay tensors until then. The micro-batch plan and `running_mean`'s scores are read from
the batch while it is still on the CPU, before it moves to the device. Whether an optimizer
step was taken (its gradient was finite) is a device flag: the fused AdamW skips a non-finite
update on the device (`saorl.sharding.step_unless_nonfinite`), and the flags travel with the
metrics sync. The counters follow from them after the sync: the policy version, the lr schedule
(stepped once per update taken) and the skipped steps, with the same values as when each step
was decided on the host. One exception keeps a sync: with `algorithm.minibatches > 1` during the
lr warm-up, the next mini-batch's lr depends on whether this one stepped, so that flag is read
at once. The critic's `OffloadedAdamW` also reads its flag on the host (its gradients go to the
CPU anyway).
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from saorl.advantages import RunningMeanBaseline, group_normalized_advantages
from saorl.checkpoint import save_checkpoint
from saorl.config import Config, ConfigError
from saorl.corrections import finish_gaps, gap_sums, lab_keys, policy_correction
from saorl.critic_updater import (
    CriticUpdater,
    concurrent_critic,
    critic_device,
    plan_rows,
    share,
)
from saorl.evaluation import evaluate_policy
from saorl.losses import (
    dis_policy_loss,
    k3,
    logprob_mismatch,
    masked_aggregate,
    positive_lm_loss,
    ppo_clip_policy_loss,
)
from saorl.models.loading import adamw, compute_precision, save_pretrained
from saorl.models.logprobs import PolicyLogprobs
from saorl.models.lora import add_lora, merged_state, save_adapter
from saorl.models.routing import RoutingReplay, replay_routing
from saorl.samples import row_advantages, samples_due
from saorl.sft import supervised_warmup
from saorl.sharding import MicroBatch, Sharding, StepMetrics
from saorl.types import Batch

if TYPE_CHECKING:
    from saorl.envs.base import EnvSpec
    from saorl.metrics import TrainProgress


class NonFiniteError(RuntimeError):
    """Too many learner steps in a row had a non-finite gradient."""


class Learner:
    """Owns the policy, the critic and their optimizers; `step(batch)` does one SAO step.

    This is the learner of one process, and also each rank's learner when sharded (pass the
    `sharding`). It implements `saorl.interfaces.Learner` for the training loop. `critic`: an
    updater hosted elsewhere (a Ray actor's handle); by default one is built here.
    """

    def __init__(
        self, cfg: Config, policy: nn.Module, device: torch.device,
        sharding: Sharding | None = None, critic: Any = None,
    ) -> None:  # fmt: skip
        # critic.concurrent = "auto" decided once, here, for everything built below.
        on, self.critic_concurrent_why = concurrent_critic(cfg, device)
        cfg = cfg.model_copy(update={"critic": cfg.critic.model_copy(update={"concurrent": on})})
        self.cfg = cfg
        self.device = device
        self.sharding = sharding or Sharding()
        self._amp = compute_precision(cfg.learner.mixed_precision, device, self.sharding.sharded)
        self.policy = policy.to(device)
        if critic is None:
            # It copies the policy's backbone: built before the policy is sharded or gets LoRA.
            sh = self.sharding.for_critic() if cfg.critic.concurrent else self.sharding
            critic = CriticUpdater(cfg, self.policy, critic_device(cfg, device), sh)
        self.critic_updater = critic
        add_lora(self.policy, cfg, "model")  # after the critic copied the plain backbone
        self.replay = RoutingReplay.of(self.policy, cfg)  # MoE routing replay, or None
        # Log-probs run through this module's forward: FSDP2's root hooks gather the head there.
        self.policy_fwd = PolicyLogprobs(self.policy)
        self.sharding.shard(self.policy_fwd)
        self.policy_params = [p for p in self.policy.parameters() if p.requires_grad]
        self.policy_opt = adamw(self.policy_params, cfg.learner.lr, cfg.learner.weight_decay)
        warm = cfg.learner.lr_warmup_steps
        # Stepped once per policy update: update i (from 0) runs at lr * min(1, (i + 1) / warm).
        self.policy_sched = torch.optim.lr_scheduler.LambdaLR(
            self.policy_opt, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0
        )
        self.version = 0  # policy version: number of policy optimizer steps taken
        self.steps = 0  # learner steps (critic warm-up steps included)
        self.skipped_steps = 0  # optimizer steps whose gradient was not finite
        self.nonfinite_streak = 0  # learner steps in a row with a skipped optimizer step
        algo = cfg.algorithm
        self.baseline = RunningMeanBaseline(window=algo.baseline_window, scope=algo.baseline_scope,
                                            global_window=algo.baseline_global_window)  # fmt: skip

    # The critic's parts, for tools and tests (in this process only).
    critic = property(lambda self: self.critic_updater.critic)
    critic_opt = property(lambda self: self.critic_updater.opt)
    critic_params = property(lambda self: self.critic_updater.params)
    frozen = property(lambda self: self.critic_updater.frozen)

    # -- one step ------------------------------------------------------------------------------
    def step(self, batch: Batch) -> dict[str, Any]:
        """One learner step on a batch: advantages (and critic updates), then the policy."""
        cfg, algo = self.cfg, self.cfg.algorithm
        # Host reads from the batch while it is on the CPU (where the loop hands it over).
        lengths = batch.attention_mask.sum(-1).tolist()
        b = batch.to(self.device)
        mask = b.action_mask
        m = StepMetrics()
        micro = self._micro_batches(lengths)
        skipped_before = self.skipped_steps
        warmup, critic = False, self.critic_updater
        gae = algo.advantage == "gae"
        if gae:
            # 1-2. Values before any critic update -> advantages (and the critic's targets).
            local = isinstance(critic, CriticUpdater) and critic.device == self.device
            advantages, vm = critic.prepare(b, micro) if local else critic.prepare(batch)
            advantages = advantages.to(self.device)
            for key, value in vm.items():
                m.set(key, value)
            # 3. K critic updates: now, or beside the policy update (`critic.concurrent`).
            critic.start_update()
            warmup = self.steps < cfg.critic.warmup_steps
        elif algo.advantage == "group":
            # GRPO: the group-normalised outcome, the same on every action token of a row.
            # On the CPU batch: finding the groups (torch.unique) would wait for the device.
            seq_adv = group_normalized_advantages(batch.scores, batch.group_ids)
            seq_adv = seq_adv.to(device=mask.device, dtype=mask.dtype)
            advantages = seq_adv[:, None] * mask
        elif algo.advantage == "running_mean":
            pairs = zip(b.prompt_keys, batch.scores.tolist(), strict=True)
            seq_adv = torch.tensor([self.baseline.advantage(k, r) for k, r in pairs],
                                   dtype=mask.dtype, device=mask.device)  # fmt: skip
            advantages = seq_adv[:, None] * mask
        else:
            raise ValueError(f"algorithm.advantage: unknown estimator {algo.advantage!r}")
        m.set("advantage/mean", (advantages * mask).sum() / mask.sum().clamp(min=1))
        run = cfg.run
        if samples_due(self.steps + 1, run.log_samples_every, run.total_steps):
            for key, value in row_advantages(advantages, mask, run.log_samples_count).items():
                m.set(key, value)  # for samples.jsonl; taken out before metrics.jsonl
        # 4. The policy update, unless the critic is still warming up.
        policy_metrics: dict[str, Any] = {}
        try:
            if not warmup:
                policy_metrics = self._update_policy(b, lengths, micro, advantages, m)
        finally:
            if gae:  # joined even when the policy update failed: no update left running
                done = critic.finish()
        if gae:
            m.add("loss/value", done.loss)  # the last of the K updates
            m.set("critic/grad_norm", done.grad_norm)
            m.set("_skipped/critic", torch.as_tensor(done.skipped))
        # The step's one sync; the step flags it carries settle the counters.
        metrics: dict[str, Any] = {**self.sharding.floats(m), **policy_metrics}
        self.skipped_steps += round(metrics.pop("_skipped/critic", 0))
        flags = sorted(k for k in metrics if k.startswith("_ok/"))
        self._settle([bool(metrics.pop(k)) for k in flags])
        metrics["learner/warmup"] = float(warmup)
        if warmup:
            # No policy update yet: the policy keys are logged as null so every row of
            # metrics.jsonl has the same columns.
            metrics.update(dict.fromkeys(("loss/policy", "dis/masked_frac", "mismatch/k3",
                                          "mismatch/max_abs_logprob_diff")))  # fmt: skip
            metrics.update(dict.fromkeys(lab_keys()))
        else:
            self._finish_mismatch(metrics)
            finish_gaps(metrics)
        self.steps += 1
        self._check_nonfinite(skipped_before)
        metrics["learner/version"] = self.version
        metrics["learner/skipped_steps"] = self.skipped_steps
        metrics.update(self.replay.take_metrics() if self.replay else {})
        return metrics

    def _micro_batches(self, lengths: list[int]) -> list[MicroBatch]:
        return self.sharding.micro_batches(lengths, lambda x: plan_rows(self.cfg, x))

    def _settle(self, stepped: list[bool]) -> None:
        """Counters after policy optimizer steps whose flags were read: the version and the lr
        schedule advance per step taken; a step not taken is counted as skipped."""
        for ok in stepped:
            self.skipped_steps += int(not ok)
            if ok:
                self.version += 1
                self.policy_sched.step()

    def _logprobs(self, mb: Batch, return_entropy: bool = False) -> Any:
        with self._amp(), replay_routing(self.replay, mb):  # mixed precision, MoE routing replay
            return self.policy_fwd(
                mb.input_ids, mb.attention_mask, temperature=self.cfg.rollout.temperature,
                chunk_size=self.cfg.model.logprob_chunk_size, return_entropy=return_entropy,
                packed=self.cfg.learner.micro_batch_tokens > 0, lengths=mb.lengths,
            )  # fmt: skip

    def _update_policy(
        self, b: Batch, lengths: list[int], micro: list[MicroBatch], advantages: torch.Tensor,
        m: StepMetrics,
    ) -> dict[str, float]:  # fmt: skip
        """`algorithm.minibatches` policy optimizer steps, one per mini-batch of rows.

        Each token's ratio is taken against a reference: for DIS the log-probs the engine
        recorded when it sampled the token; for PPO clip the old policy, i.e. these weights at
        the start of the step, recomputed here (docs/design.md section 1). Whether each
        optimizer step was taken goes into `m` as `_ok/<i>`, for `step` to settle.
        """
        algo = self.cfg.algorithm
        if algo.policy_loss == "ppo_clip":
            self.policy.eval()
            with torch.no_grad():
                reference = self.sharding.map_rows(b, micro, self._logprobs)
        else:
            reference = b.rollout_logprobs
        # Rows whose outcome counts as correct, for VAPO's positive-example LM loss.
        positive = (b.scores >= algo.lm_loss_min_reward).to(b.action_mask.dtype)
        if algo.lm_loss_coef:
            m.set("lm/positive_frac", positive.mean())
        self.policy.train()
        n_mb = min(algo.minibatches, b.size)  # a short batch gets no empty mini-batch
        bounds = [round(i * b.size / n_mb) for i in range(n_mb + 1)]
        last: dict[str, float] = {}
        pending: list[torch.Tensor] = []  # flags of the steps taken here, not yet settled
        warm = self.cfg.learner.lr_warmup_steps
        for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
            part = b.select(slice(lo, hi))
            part_pos = part.action_mask * positive[lo:hi, None]
            # The policy version now: a device tensor while some steps are unsettled.
            version = self.version + sum(ok.long() for ok in pending) if pending else self.version
            for mb in self._micro_batches(lengths[lo:hi]):
                adv, ref, pos = (x[lo:hi][mb.rows] for x in (advantages, reference, positive))
                with replay_routing(self.replay, part.select(mb.rows)):  # and layers' recompute
                    self._policy_micro_step(part, mb, adv, ref, (pos, part_pos), 1.0 / n_mb, m,
                                            version)  # fmt: skip
            last["policy/lr"] = self.policy_opt.param_groups[0]["lr"]
            norm, ok = self.sharding.optimizer_step(
                self.policy_params, self.policy_opt, self.cfg.learner.grad_clip
            )
            m.set(f"_ok/{i:04d}", ok)
            pending.append(ok)
            m.set("policy/grad_norm", norm)
            if i + 1 < n_mb and warm and self.policy_sched.last_epoch + 1 < warm:
                # In the lr warm-up the next mini-batch's lr depends on this step: read now.
                self._settle([bool(ok)])
                m.values.pop(f"_ok/{i:04d}")
                pending = []
        return last

    def _policy_micro_step(
        self, part: Batch, mb: MicroBatch, advantages: torch.Tensor, reference: torch.Tensor,
        positive: tuple[torch.Tensor, torch.Tensor], scale: float, m: StepMetrics,
        version: int | torch.Tensor,
    ) -> None:  # fmt: skip
        """Forward and backward of the policy loss on micro-batch `mb` of mini-batch `part`,
        weighted by its share of `part`; metrics weighted by that share times `scale`.
        `version`: the policy's version (a device tensor while earlier steps are unsettled)."""
        algo = self.cfg.algorithm
        x = part.select(mb.rows)
        mask = x.action_mask
        w = share(mask, part.action_mask, algo.loss_agg) * mb.weight
        logprobs, entropy = self._logprobs(x, return_entropy=True)
        # algorithm.correction: per-token weights from the trainer/engine ratio (corrections.py)
        trainer = reference if algo.policy_loss == "ppo_clip" else logprobs
        weights, cm = policy_correction(algo, trainer, x.rollout_logprobs, mask)
        if algo.policy_loss == "dis":
            loss, pm = dis_policy_loss(
                logprobs, reference, advantages, mask, eps_low=algo.eps_low,
                eps_high=algo.eps_high, agg=algo.loss_agg, tensors=True, token_weights=weights,
            )  # fmt: skip
        elif algo.policy_loss == "ppo_clip":
            loss, pm = ppo_clip_policy_loss(
                logprobs, reference, advantages, mask, eps_low=algo.clip_eps_low,
                eps_high=algo.clip_eps_high, agg=algo.loss_agg, tensors=True, token_weights=weights,
            )  # fmt: skip
        else:
            raise ValueError(f"algorithm.policy_loss: unknown loss {algo.policy_loss!r}")
        # Aggregated like the loss, so that weighting by the share sums to the batch value.
        ent = masked_aggregate(entropy, mask, algo.loss_agg)
        if algo.entropy_coef:
            loss = loss - algo.entropy_coef * ent
        if algo.kl_coef:  # optional penalty: k3 estimate of KL(current || rollout)
            loss = loss + algo.kl_coef * masked_aggregate(
                k3(x.rollout_logprobs - logprobs), mask, algo.loss_agg
            )
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
        # The gap by staleness (0: pure mismatch) and by position (corrections.gap_sums).
        positions = torch.arange(mask.shape[1], device=mask.device).expand_as(mask)
        diff = logprobs.detach() - x.rollout_logprobs
        for key, value in gap_sums(diff, mask, version - x.versions, positions).items():
            m.add(key, value * mb.weight)

    @staticmethod
    def _finish_mismatch(metrics: dict[str, Any]) -> None:
        n, k3_sum = metrics["mismatch/tokens"], metrics.pop("mismatch/k3_sum")
        metrics["mismatch/k3"] = k3_sum / n if n else None  # null when no token was on-policy
        if not n:
            metrics["mismatch/max_abs_logprob_diff"] = None

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

    # -- weights and state ---------------------------------------------------------------------
    def policy_state(self) -> dict[str, torch.Tensor]:
        """The policy weights to push to the engines (detached; on this learner's device in one
        process, gathered onto rank 0's CPU when sharded, `{}` on the other ranks); LoRA merged."""
        return merged_state(self.sharding.full_state(self.policy), self.policy)

    def reset_critic_from_policy(self) -> None:
        """Critic <- the current policy's backbone and a zero value head; a fresh optimizer.

        Called after a supervised warm-up, so that the critic starts from the policy it will
        judge (docs/design.md section 1); frozen parameters stay frozen. A critic of its own
        (`critic.name_or_path`) keeps its weights.
        """
        if self.cfg.critic.name_or_path != "policy":
            return
        prefix = self.policy.base_model_prefix + "."
        policy = merged_state(self.sharding.full_state(self.policy, everywhere=True), self.policy)
        self.critic_updater.reset_from_policy({k[len(prefix) :]: v for k, v in policy.items()
                                               if k.startswith(prefix)})  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Weights, optimizers, scheduler and counters for a checkpoint (`load_state` inverse).

        When sharded this gathers the full states (all ranks must call it); rank 0 gets them on
        CPU, the other ranks get empty weight and optimizer dicts.
        """
        sh = self.sharding
        return {
            "step": self.steps,
            "version": self.version,
            "policy": sh.full_state(self.policy),
            "policy_opt": sh.optimizer_state(self.policy, self.policy_opt),
            **self.critic_updater.state_dict(),  # "critic", "critic_opt"
            "policy_sched": self.policy_sched.state_dict(),
            "skipped_steps": self.skipped_steps,
            "baseline": self.baseline.state_dict(),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimizers and counters from a checkpoint dict.

        When sharded every rank calls it; only rank 0's weight and optimizer entries are read
        (they are broadcast), the counters must be given on every rank.
        """
        sh = self.sharding
        try:
            sh.load_state(self.policy, state.get("policy", {}), self.policy_opt,
                          state.get("policy_opt"))  # fmt: skip
            self.critic_updater.load_state(state)
        except (KeyError, RuntimeError, ValueError) as e:
            raise ConfigError(
                f"the checkpoint does not fit this run's model/learner config "
                f"({type(e).__name__}: {str(e)[:300]}); resume with the run's own config.toml"
            ) from e
        if "policy_sched" in state:
            self.policy_sched.load_state_dict(state["policy_sched"])
        self.steps = state["step"]
        self.version = state["version"]
        self.skipped_steps = state.get("skipped_steps", 0)
        if "baseline" in state:
            self.baseline.load_state_dict(state["baseline"])

    # -- what the training loop asks of a learner (`saorl.interfaces.Learner`) -----------------
    def warm_up(self, spec: EnvSpec, tokenizer: Any, progress: TrainProgress | None) -> None:
        """Supervised warm-up of the policy, then a critic initialised from it."""
        supervised_warmup(self.policy, tokenizer, spec, self.cfg, progress)
        self.reset_critic_from_policy()

    def load_critic(self, path: str) -> None:
        """Critic weights from `saorl value-pretrain` (the optimizer starts fresh)."""
        self.critic_updater.load(path)

    def evaluate(self, spec: EnvSpec, tokenizer: Any) -> dict[str, float]:
        """Held-out metrics of the current policy (`saorl.evaluation.evaluate_policy`)."""
        # A fixed seed: every evaluation draws the same random numbers, so curves compare.
        seed = self.cfg.run.seed + 12345
        return evaluate_policy(self.policy, tokenizer, spec, self.cfg, seed=seed)

    def save(self, run_dir: Path, rollout_state: dict[str, Any]) -> None:
        """A checkpoint of this learner (and this process's RNG) with the rollout side's state."""
        state = {**self.state_dict(), "torch_rng": torch.get_rng_state(), **rollout_state}
        save_checkpoint(run_dir, self.steps, state, keep=self.cfg.run.keep_last_checkpoints)

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint written by `save`."""
        self.load_state(state)
        torch.set_rng_state(state["torch_rng"])

    def export(self, tokenizer: Any, path: Path) -> None:
        """The policy in Hugging Face format (what `model.name_or_path` loads); LoRA: merged."""
        save_pretrained(self.policy, tokenizer, path)
        save_adapter(self.policy, tokenizer, path, self.cfg)

    def close(self) -> None:
        """The critic's worker thread (or actor) ends."""
        self.critic_updater.close()
