"""The learner: the policy, its critic, their optimizers, and one SAO step per batch.

For SAO (docs/design.md section 1) one step on a batch of finished single rollouts is:
1. critic values for every position, before any critic update (a baseline must not have seen
   the outcome it is compared with);
2. skip-observation GAE with the length-adaptive `lambda_policy` -> advantages, and with
   `lambda_critic` (1 by default) -> value targets;
3. K critic optimizer steps on the value loss;
4. unless still in critic warm-up, one DIS policy step; the policy version then advances.

The same step written flat, in one function to read first: `sao_step` in
examples/minimal_sao.py; tests/integration/test_minimal_sao_parity.py holds the two equal
(losses, updated policy and critic weights) on the same batch and weights.

`algorithm.advantage` picks step 1-3 (`gae`) or a critic-free estimator (`group`: GRPO's
group-normalised outcome, `running_mean`: reward minus the prompt's running mean);
`algorithm.policy_loss` picks the ratio of step 4 (`dis`: against the engine's recorded
log-probs, `ppo_clip`: against the old policy, the weights at the start of the step).

Micro-batches accumulate gradients; each micro-batch loss is weighted by its share of the batch
(action tokens for `token_mean`, rows for `seq_mean_token_mean`), so the accumulated gradient
equals the full-batch one. Micro-batches are `micro_batch_size` padded rows, or with
`learner.micro_batch_tokens > 0` rows packed into one row without padding up to that many tokens
(`saorl.models.packing`).

Step 4 is `saorl.learner.policy_step.update_policy` (mini-batches, micro-batches, the loss and
its log-prob diagnostics), a function of the `PolicyState` this class hands it each step.
Steps 1-3 belong to the critic's `saorl.learner.critic_updater.CriticUpdater` (in this process,
or in a Ray actor of its own: `saorl.distributed.ray_critic`). With `critic.concurrent` its K
updates run while this class runs step 4, on a thread of their own; the step's numbers are the
same.

This class is written for one process. Sharding over several ranks (FSDP2) changes what
`self.sharding` does (`saorl.learner.sharding`, `saorl.distributed.fsdp.FSDPSharding`), not this
code. Nothing in a step waits for the device but its metrics, read once at its end. Losses and
metrics stay tensors until then. The micro-batch plan and `running_mean`'s scores are read from
the batch while it is still on the CPU, before it moves to the device. Whether an optimizer
step was taken (its gradient was finite) is a device flag: the fused AdamW skips a non-finite
update on the device (`saorl.learner.sharding.step_unless_nonfinite`), and the flags, typed fields
of a `saorl.learner.sharding.StepFlags` (not metrics), are read with the metrics, in the same sync
(`Sharding.read`). The counters follow from them: the policy version, the lr schedule
(stepped once per update taken) and the skipped steps, with the same values as when each step
was decided on the host. One exception keeps a sync: with `algorithm.minibatches > 1` during the
lr warm-up, the next mini-batch's lr depends on whether this one stepped, so that flag is read
at once. The critic's `OffloadedAdamW` also reads its flag on the host (its gradients go to the
CPU anyway).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from saorl.advantages import RunningMeanBaseline, group_normalized_advantages
from saorl.checkpoint.io import save_checkpoint
from saorl.config import Config, ConfigError
from saorl.corrections import finish_gaps, lab_keys
from saorl.evaluation.held_out import evaluate_policy
from saorl.learner.critic_updater import (
    CriticUpdater,
    concurrent_critic,
    critic_device,
    plan_rows,
)
from saorl.learner.optim import adamw
from saorl.learner.policy_step import PolicyState, finish_mismatch, update_policy
from saorl.learner.sft import supervised_warmup
from saorl.learner.sharding import MicroBatch, Sharding, StepFlags, StepMetrics
from saorl.models.loading import compute_precision, save_pretrained
from saorl.models.logprobs import PolicyLogprobs
from saorl.models.lora import add_lora, merged_state, push_state, save_adapter
from saorl.models.routing import RoutingReplay, replay_routing
from saorl.monitoring.samples import row_advantages, samples_due
from saorl.types import Batch

if TYPE_CHECKING:
    from saorl.envs.base import EnvSpec
    from saorl.monitoring.metrics import TrainProgress


class NonFiniteError(RuntimeError):
    """Too many learner steps in a row had a non-finite gradient."""


class Learner:
    """Owns the policy, the critic and their optimizers; `step(batch)` does one SAO step.

    This is the learner of one process, and also each rank's learner when sharded (pass the
    `sharding`). It implements `saorl.interfaces.Learner` for the training loop. `critic`: an
    updater hosted elsewhere (a Ray actor's handle); by default one is built here.
    """

    def __init__(
        self,
        cfg: Config,
        policy: nn.Module,
        device: torch.device,
        sharding: Sharding | None = None,
        critic: Any = None,
    ) -> None:
        # critic.concurrent = "auto" decided once, here, for everything built below; the
        # decision and its reason are reported (the run's summary), the config keeps "auto".
        self.critic_concurrent, self.critic_concurrent_why = concurrent_critic(cfg, device)
        self.cfg = cfg
        self.device = device
        self.sharding = sharding or Sharding()
        self._amp = compute_precision(cfg.learner.mixed_precision, device, self.sharding.sharded)
        self.policy = policy.to(device)
        if critic is None:
            # It copies the policy's backbone: built before the policy is sharded or gets LoRA.
            on = self.critic_concurrent
            sh = self.sharding.for_critic() if on else self.sharding
            critic = CriticUpdater(cfg, self.policy, critic_device(cfg.critic, device), sh, on)
        self.critic_updater = critic
        add_lora(self.policy, cfg.model)  # after the critic copied the plain backbone
        # MoE routing replay (algorithm.routing_replay), or None
        packed = cfg.learner.micro_batch_tokens > 0
        replay = cfg.algorithm.routing_replay
        self.replay = RoutingReplay(self.policy, packed=packed) if replay else None
        # Log-probs run through this module's forward: FSDP2's root hooks gather the head there.
        self.policy_fwd = PolicyLogprobs(self.policy)
        # algorithm.kl_reference = "initial": made at the first policy update (or from a
        # checkpoint), never trained.
        self.ref_policy: PolicyLogprobs | None = None
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
        self.baseline = RunningMeanBaseline(
            window=algo.baseline_window,
            scope=algo.baseline_scope,
            global_window=algo.baseline_global_window,
        )

    # The critic's parts, for tools and tests (in this process only).
    critic = property(lambda self: self.critic_updater.critic)
    critic_opt = property(lambda self: self.critic_updater.opt)
    critic_params = property(lambda self: self.critic_updater.params)
    frozen = property(lambda self: self.critic_updater.frozen)

    # -- one step ------------------------------------------------------------------------------
    def step(self, batch: Batch) -> dict[str, Any]:
        """One learner step on a batch: advantages (and critic updates), then the policy."""
        cfg = self.cfg
        algo = self.cfg.algorithm
        # Host reads from the batch while it is on the CPU (where the loop hands it over).
        lengths = batch.attention_mask.sum(-1).tolist()
        b = batch.to(self.device)
        mask = b.action_mask
        m = StepMetrics()
        flags = StepFlags()
        micro = self._micro_batches(lengths)
        skipped_before = self.skipped_steps
        warmup = False
        critic = self.critic_updater
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
            seq_adv = group_normalized_advantages(
                batch.scores,
                batch.group_ids,
                weights=batch.episode_weights,
                std_norm=algo.group_std_norm,
            )
            seq_adv = seq_adv.to(device=mask.device, dtype=mask.dtype)
            advantages = seq_adv[:, None] * mask
        elif algo.advantage == "running_mean":
            pairs = zip(b.prompt_keys, batch.scores.tolist(), strict=True)
            seq_adv = torch.tensor(
                [self.baseline.advantage(k, r) for k, r in pairs],
                dtype=mask.dtype,
                device=mask.device,
            )
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
                policy_metrics = update_policy(
                    self._policy_state(), b, lengths, micro, advantages, m, flags
                )
        finally:
            if gae:  # joined even when the policy update failed: no update left running
                done = critic.finish()
        if gae:
            m.add("loss/value", done.loss)  # the last of the K updates
            m.set("critic/grad_norm", done.grad_norm)
            # In units of its clip: how hard the clip acts (a collapse signal, `[collapse]`).
            m.set("critic/grad_norm_over_clip", done.grad_norm / cfg.critic.grad_clip)
            flags.critic_skipped = torch.as_tensor(done.skipped)
        # The step's one sync: its metrics, and the flags that settle the counters.
        floats, decided = self.sharding.read(m, flags)
        metrics: dict[str, Any] = {**floats, **policy_metrics}
        self.skipped_steps += decided.critic_skipped
        self._settle(decided.policy_stepped)
        metrics["learner/warmup"] = float(warmup)
        if warmup:
            # No policy update yet: the policy keys are logged as null so every row of
            # metrics.jsonl has the same columns.
            policy_keys = ("loss/policy", "dis/masked_frac", "mismatch/k3")
            mismatch = ("mismatch/max_abs_logprob_diff", "mismatch/nonfinite_tokens")
            metrics.update(dict.fromkeys((*policy_keys, *mismatch)))
            metrics.update(dict.fromkeys(lab_keys()))
        else:
            finish_mismatch(metrics)
            finish_gaps(metrics)
        self.steps += 1
        self._check_nonfinite(skipped_before)
        metrics["learner/version"] = self.version
        metrics["learner/skipped_steps"] = self.skipped_steps
        metrics.update(self.replay.take_metrics() if self.replay else {})
        return metrics

    def _policy_state(self) -> PolicyState:
        """What the policy update works on this step (`saorl.learner.policy_step`)."""
        return PolicyState(
            algo=self.cfg.algorithm,
            learner=self.cfg.learner,
            policy=self.policy,
            opt=self.policy_opt,
            params=self.policy_params,
            sched=self.policy_sched,
            sharding=self.sharding,
            replay=self.replay,
            version=self.version,
            logprobs=self._logprobs,
            reference_logprobs=self._reference_logprobs,
            micro_batches=self._micro_batches,
            settle=self._settle,
        )

    def _micro_batches(self, lengths: list[int]) -> list[MicroBatch]:
        return self.sharding.micro_batches(lengths, lambda x: plan_rows(self.cfg.learner, x))

    def _settle(self, stepped: list[bool]) -> None:
        """Counters after policy optimizer steps whose flags were read: the version and the lr
        schedule advance per step taken; a step not taken is counted as skipped."""
        for ok in stepped:
            self.skipped_steps += int(not ok)
            if ok:
                self.version += 1
                self.policy_sched.step()

    def _reference_logprobs(self, mb: Batch) -> torch.Tensor:
        """Log-probs of `mb`'s tokens under the frozen reference (`algorithm.kl_reference =
        "initial"`): the policy as it was at the first policy update, copied then."""
        if self.ref_policy is None:
            self.ref_policy = frozen_copy(self.policy)
        with torch.no_grad(), self._amp(), replay_routing(self.replay, mb):
            return self.ref_policy(
                mb.input_ids,
                mb.attention_mask,
                temperature=self.cfg.rollout.temperature,
                chunk_size=self.cfg.model.logprob_chunk_size,
                packed=self.cfg.learner.micro_batch_tokens > 0,
                lengths=mb.lengths,
            )

    def _logprobs(self, mb: Batch, return_entropy: bool = False) -> Any:
        with self._amp(), replay_routing(self.replay, mb):  # mixed precision, MoE routing replay
            return self.policy_fwd(
                mb.input_ids,
                mb.attention_mask,
                temperature=self.cfg.rollout.temperature,
                chunk_size=self.cfg.model.logprob_chunk_size,
                return_entropy=return_entropy,
                packed=self.cfg.learner.micro_batch_tokens > 0,
                lengths=mb.lengths,
            )

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

    def push_state(self, full: bool = False) -> dict[str, torch.Tensor]:
        """What a weight push sends (`saorl.models.lora.push_state`): `policy_state()`, or with
        LoRA adapters and `model.lora_push = "adapter"` the adapters only (`full`: the whole
        unmerged state, for an engine without the base weights)."""
        state = self.sharding.full_state(self.policy)
        return push_state(state, self.policy, self.cfg.model.lora_push, full)

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
        self.critic_updater.reset_from_policy(
            {k[len(prefix) :]: v for k, v in policy.items() if k.startswith(prefix)}
        )

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
            **({"ref_policy": self.ref_policy.state_dict()} if self.ref_policy else {}),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """Restore weights, optimizers and counters from a checkpoint dict.

        When sharded every rank calls it; only rank 0's weight and optimizer entries are read
        (they are broadcast), the counters must be given on every rank.
        """
        sh = self.sharding
        try:
            sh.load_state(
                self.policy, state.get("policy", {}), self.policy_opt, state.get("policy_opt")
            )
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
        if "ref_policy" in state:  # the reference of kl_reference = "initial"
            self.ref_policy = frozen_copy(self.policy)
            self.ref_policy.load_state_dict(state["ref_policy"])

    # -- what the training loop asks of a learner (`saorl.interfaces.Learner`) -----------------
    def warm_up(self, spec: EnvSpec, tokenizer: Any, progress: TrainProgress | None) -> None:
        """Supervised warm-up of the policy, then a critic initialised from it."""
        supervised_warmup(self.policy, tokenizer, spec, self.cfg, progress)
        self.reset_critic_from_policy()

    def load_critic(self, path: str) -> None:
        """Critic weights from `saorl value-pretrain` (the optimizer starts fresh)."""
        self.critic_updater.load(path)

    def evaluate(self, spec: EnvSpec, tokenizer: Any) -> dict[str, float]:
        """Held-out metrics of the current policy
        (`saorl.evaluation.held_out.evaluate_policy`)."""
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
        model = self.cfg.model
        warmed_up = bool(self.cfg.learner.sft_steps)
        save_adapter(self.policy, tokenizer, path, model.name_or_path, warmed_up)

    def close(self) -> None:
        """The critic's worker thread (or actor) ends."""
        self.critic_updater.close()


def frozen_copy(policy: nn.Module) -> PolicyLogprobs:
    """A copy of `policy` that never trains (eval mode, no gradients), wrapped for log-probs."""
    import copy

    ref = copy.deepcopy(policy).eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return PolicyLogprobs(ref)
