"""The critic side of the learner: `CriticUpdater`, the critic, its optimizer and its updates.

For SAO (`algorithm.advantage = "gae"`, docs/design.md section 1) a learner step asks the
critic for two things, in this order:

1. `prepare(batch)`: values for every position before any critic update (a baseline must not
   have seen the outcome it is compared with), then skip-observation GAE with `lambda_policy`
   (length-adaptive by default) -> the policy's advantages, and with `lambda_critic` -> value
   targets, kept here for the updates;
2. `start_update()` ... `finish()`: K critic optimizer steps on the value loss against those
   targets.

The values of step 1 are the pre-update critic's outputs, which is what the forward pass of the
first of the K updates computes: `prepare` runs that update's forward and backward and takes
the values from it, and `start_update` begins with its optimizer step (one critic forward pass
less per step). This needs a train-mode forward equal to the eval-mode one; with dropout or
router noise in the critic (`stochastic_in_training`) the values get a forward of their own.

After step 1 the K critic updates and the policy update are independent: each reads the batch
and the pre-update values, and writes only its own weights and optimizer. With
`critic.concurrent` the K updates run on a worker thread of their own (on `critic.device`, when
that is another device) while the learner's thread runs the policy update; `finish` joins. The
step then takes the longer of the two, not the sum, and computes the same numbers: the updater
writes no state of the learner (it returns its loss, gradient norm and the number of optimizer
steps it skipped for a non-finite gradient), and autocast and grad mode, which are per thread,
are entered inside the thread. Both sides draw from torch's global random generator only through
dropout (none in SAO's defaults); with dropout on, a concurrent step draws the same distribution
in a different order.

Sharded (FSDP2), the critic gets a `Sharding` of its own (`Sharding.for_critic`): over its own
process group, so that its collectives never interleave with the policy's. Under Ray,
`saorl.distributed.ray_critic` hosts a `CriticUpdater` in an actor of its own and the learner
actor talks to it through the same four methods.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from saorl.advantages import length_adaptive_lambda, skip_observation_gae
from saorl.checkpoint.io import load_state_file
from saorl.config import AlgorithmConfig, Config, ConfigError, CriticConfig, LearnerConfig
from saorl.learner.optim import critic_optimizer
from saorl.learner.sharding import MicroBatch, Sharding
from saorl.losses import value_loss
from saorl.models.critic import Critic, critic_source, freeze_attention
from saorl.models.loading import compute_precision
from saorl.models.lora import onto_lora
from saorl.models.packing import plan_token_micro_batches
from saorl.types import Batch


class CriticUpdate(NamedTuple):
    """What the K critic updates of a step report, as 0-dim tensors (read at the learner's
    metrics sync): the last update's value loss (this rank's share when sharded) and gradient
    norm, and how many of the K steps were skipped for a non-finite gradient."""

    loss: torch.Tensor
    grad_norm: torch.Tensor
    skipped: torch.Tensor


def share(mask: torch.Tensor, total: torch.Tensor, agg: str) -> torch.Tensor:
    """A micro-batch's share of the batch loss: action tokens, or rows with action tokens."""
    if agg == "token_mean":
        return mask.sum() / total.sum().clamp(min=1)
    rows = (mask.sum(-1) > 0).sum()
    return rows / (total.sum(-1) > 0).sum().clamp(min=1)


def plan_rows(lc: LearnerConfig, lengths: list[int]) -> list[list[int]]:
    """Micro-batches of rows with these lengths: by token budget (`learner.micro_batch_tokens`),
    or by row count (`learner.micro_batch_size`)."""
    if lc.micro_batch_tokens:
        return plan_token_micro_batches(lengths, lc.micro_batch_tokens)
    n = len(lengths)
    k = lc.micro_batch_size
    return [list(range(i, min(i + k, n))) for i in range(0, n, k)]


def gae_mask(algo: AlgorithmConfig, b: Batch) -> torch.Tensor:
    """The positions GAE reads values at: action tokens, or every completion token when
    skipping observations is switched off (`algorithm.skip_observations`, an ablation)."""
    return b.action_mask if algo.skip_observations else b.completion_mask


def gae_targets(
    algo: AlgorithmConfig, b: Batch, values: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """`(advantages, value targets)` from pre-update `values` (zero off `gae_mask`): skip-
    observation GAE with `lambda_policy` (length-adaptive by default) and with
    `lambda_critic`."""
    mask = gae_mask(algo, b)
    if algo.lambda_mode == "adaptive":
        lam = length_adaptive_lambda(mask, alpha=algo.lambda_alpha)
    else:
        lam = algo.lambda_policy
    advantages, _ = skip_observation_gae(b.rewards, values, mask, algo.gamma, lam)
    _, returns = skip_observation_gae(b.rewards, values, mask, algo.gamma, algo.lambda_critic)
    return advantages, returns


def stochastic_in_training(module: nn.Module) -> bool:
    """Whether `module`'s forward in train mode may differ from eval mode's: a dropout with
    p > 0, or a config's dropout or router-jitter setting above 0."""
    if any(isinstance(m, nn.Dropout) and m.p > 0 for m in module.modules()):
        return True
    for m in module.modules():
        conf = getattr(m, "config", None)
        for key, value in (vars(conf) if conf is not None else {}).items():
            noisy = "dropout" in key or "jitter" in key
            if noisy and isinstance(value, int | float) and not isinstance(value, bool) and value:
                return True
    return False


def critic_device(critic: CriticConfig, learner_device: torch.device) -> torch.device:
    """`critic.device`, or the learner's device when it is ''."""
    if not critic.device:
        return learner_device
    from saorl.models.loading import resolve_device

    try:
        return resolve_device(critic.device)
    except RuntimeError as e:
        raise ConfigError(f"critic.device: {e}".replace("model.device", "critic.device")) from e


def concurrent_critic(cfg: Config, learner_device: torch.device) -> tuple[bool, str]:
    """Whether the critic's updates run beside the policy's (`critic.concurrent`), and why.

    'auto' turns it on where the two updates have hardware to overlap on: a device of the
    critic's own, or a CPU with cores for both (each update uses `run.torch_threads`); it stays
    off on one shared accelerator, where it would hold both updates' activations at once, under
    `run.deterministic` (one thread of work at a time) and with `learner.fsdp` (the overlap there
    needs a process group of the critic's own beside the policy's: asked for, not assumed).
    """
    setting = cfg.critic.concurrent
    if setting != "auto":
        return bool(setting), f"critic.concurrent = {str(setting).lower()}"
    if cfg.run.deterministic:
        return False, "auto: off under run.deterministic (one thread of work at a time)"
    if cfg.learner.fsdp:  # a second process group beside the policy's: opt-in only
        return False, "auto: off with learner.fsdp (set critic.concurrent = true to overlap)"
    device = critic_device(cfg.critic, learner_device)
    if device != learner_device:
        return True, f"auto: the critic has a device of its own ({device})"
    if device.type != "cpu":
        return False, (
            f"auto: policy and critic share {device}; both updates at once would hold both "
            "activations (set critic.device to a second device)"
        )
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    need = 2 * cfg.run.torch_threads
    if (cores or 1) >= need:
        return True, f"auto: {cores} CPU cores for the two updates' {need} threads"
    return False, f"auto: {cores} CPU core(s), fewer than the two updates' {need} threads"


class CriticUpdater:
    """The critic (a copy of `policy`'s backbone with a value head), its optimizer and updates.

    Build it before LoRA adapters are added to the policy (the critic copies the plain
    backbone). `sharding` is the critic's own (`Sharding.for_critic`). `concurrent`:
    `critic.concurrent` as the learner resolved it (`concurrent_critic`).
    """

    def __init__(
        self,
        cfg: Config,
        policy: nn.Module,
        device: torch.device,
        sharding: Sharding,
        concurrent: bool,
    ) -> None:
        self.cfg = cfg
        self.device = device
        self.sharding = sharding
        self._amp = compute_precision(cfg.learner.mixed_precision, device, sharding.sharded)
        # critic.lora_rank's adapters; critic.name_or_path: the policy or a model of its own
        source = critic_source(cfg.critic.name_or_path, cfg.model, policy)
        self.critic = Critic(source, (cfg.model, cfg.critic)).to(device)
        self.frozen = freeze_attention(self.critic) if cfg.critic.freeze == "attention" else []
        self.sharding.shard(self.critic)
        self.new_optimizer()
        # One worker: the K updates of one step at a time, beside the policy update.
        self._pool = ThreadPoolExecutor(1, "critic") if concurrent else None
        # Every position GAE reads a value at is trained (observations too, when not skipped).
        self._targets = "action_mask" if cfg.algorithm.skip_observations else "completion_mask"
        # The values can come from the first update's forward when nothing random or
        # mode-dependent runs in it (dropout, router noise) and there is a first update.
        self.fused = cfg.critic.updates_per_step > 0 and not stochastic_in_training(self.critic)
        self._prepared: tuple[Any, ...] | None = None
        self._pending: Future[CriticUpdate] | CriticUpdate | None = None
        self._stream: Any = None  # CUDA: the critic's own stream, made on first use

    def new_optimizer(self) -> None:
        self.params = [p for p in self.critic.parameters() if p.requires_grad]
        self.opt = critic_optimizer(self.params, self.cfg.critic)

    def micro_batches(self, b: Batch) -> list[MicroBatch]:
        """The plan from the rows' lengths: a host read, free while `b` is still on the CPU."""
        lengths = b.attention_mask.sum(-1).tolist()
        return self.sharding.micro_batches(lengths, lambda x: plan_rows(self.cfg.learner, x))

    def values(self, mb: Batch) -> torch.Tensor:
        """Values of the rows of `mb` (grad mode as the caller has it)."""
        packed = self.cfg.learner.micro_batch_tokens > 0
        with self._amp():  # learner.mixed_precision
            return self.critic(mb.input_ids, mb.attention_mask, packed=packed, lengths=mb.lengths)

    # -- one step ------------------------------------------------------------------------------
    def prepare(
        self, batch: Batch, micro: list[MicroBatch] | None = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Values before any update -> `(advantages, metrics)` on this updater's device; the
        value targets are kept for `start_update`. `micro`: the learner's micro-batches of
        `batch`, when its plan is this updater's (saves planning twice).

        Where the critic's train-mode forward equals its eval-mode one (`self.fused`), the
        values come from the forward pass of the first of the K updates, whose backward runs
        here too (its optimizer step is `start_update`'s): one critic forward less per step."""
        algo = self.cfg.algorithm
        micro = micro if micro is not None else self.micro_batches(batch)  # before it moves
        b = batch.to(self.device)
        mask = gae_mask(self.cfg.algorithm, b)  # observation tokens only in the ablation
        first = None
        if self.fused:
            self.opt.zero_grad(set_to_none=True)  # nothing left over from an aborted step
            self.critic.train()
            first = torch.zeros((), device=self.device)
            order = iter(micro)  # `map_rows` calls its function once per micro-batch, in order

            def first_pass(x: Batch) -> torch.Tensor:
                nonlocal first
                v = self.values(x)
                mask = getattr(x, self._targets)
                # A row's targets depend on that row's values only (GAE runs along a row).
                _, ret = skip_observation_gae(
                    x.rewards, v.detach() * mask, mask, algo.gamma, algo.lambda_critic
                )
                first = first + self._backward(next(order), b, x, v, ret, v.detach())
                return v.detach()

            values = self.sharding.map_rows(b, micro, first_pass) * mask
        else:
            self.critic.eval()
            with torch.no_grad():
                values = self.sharding.map_rows(b, micro, self.values) * mask
        advantages, returns = gae_targets(self.cfg.algorithm, b, values)
        _, vm = value_loss(values, returns, b.action_mask, tensors=True)  # before the updates
        self._prepared = (b, micro, values, returns, first)
        keys = ("value/explained_variance", "value/mean")
        return advantages, {k: vm[k].detach() for k in keys}

    def evaluate(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
        """`(values, value targets)` of `batch` by the critic as it is now, as `prepare`
        computes them (same GAE, same mask), without an update: for held-out measurements."""
        micro = self.micro_batches(batch)
        b = batch.to(self.device)
        self.critic.eval()
        algo = self.cfg.algorithm
        with torch.no_grad():
            values = self.sharding.map_rows(b, micro, self.values) * gae_mask(algo, b)
        return values, gae_targets(algo, b, values)[1]

    def start_update(self) -> None:
        """The K updates on the prepared batch: on the worker thread with `critic.concurrent`,
        otherwise here and now."""
        if self._prepared is None:
            raise RuntimeError("CriticUpdater.start_update before prepare")
        args, self._prepared = self._prepared, None
        if self._pool is None:
            self._pending = self.update(*args)
            return
        stream = None
        if self.device.type == "cuda":
            # A stream of its own, so the GPU can overlap it with the policy's kernels; it
            # starts after what this thread queued (the values) on the device.
            stream = self._stream = self._stream or torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
        self._pending = self._pool.submit(self._update_on, stream, *args)

    def finish(self) -> CriticUpdate:
        """The result of the K updates `start_update` began (waits for them)."""
        pending, self._pending = self._pending, None
        if pending is None:
            raise RuntimeError("CriticUpdater.finish without start_update")
        return pending.result() if isinstance(pending, Future) else pending

    def _update_on(self, stream: Any, *args: Any) -> CriticUpdate:
        """`update` on the worker thread; on a CUDA `stream`, finished on the device before it
        returns (its inputs and results can then be freed or read on any stream)."""
        if stream is None:
            return self.update(*args)
        with torch.cuda.stream(stream):
            done = self.update(*args)
        stream.synchronize()  # a sync of this thread only, off the policy's path
        return done

    def update(
        self,
        b: Batch,
        micro: list[MicroBatch],
        values: torch.Tensor,
        returns: torch.Tensor,
        first: torch.Tensor | None = None,
    ) -> CriticUpdate:
        """K critic optimizer steps on the same batch (paper 3.2: a faster critic than policy).
        `first`: the loss of the first update, whose gradients `prepare` already holds."""
        skipped = torch.zeros((), dtype=torch.long, device=self.device)
        for k in range(self.cfg.critic.updates_per_step):
            if k == 0 and first is not None:
                norm, ok = self.sharding.optimizer_step(
                    self.params, self.opt, self.cfg.critic.grad_clip
                )
                loss = first
            else:
                loss, norm, ok = self.update_once(b, micro, values, returns)
            skipped = skipped + (~ok).to(skipped.device, torch.long)
        return CriticUpdate(loss, norm, skipped)

    def update_once(
        self, b: Batch, micro: list[MicroBatch], old_values: torch.Tensor, returns: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """One critic optimizer step on the value loss: `(this rank's loss, norm, stepped)`,
        0-dim tensors (`Sharding.optimizer_step`)."""
        self.critic.train()
        total = torch.zeros((), device=self.device)
        for mb in micro:
            x = b.select(mb.rows)
            total = total + self._backward(
                mb, b, x, self.values(x), returns[mb.rows], old_values[mb.rows]
            )
        norm, ok = self.sharding.optimizer_step(self.params, self.opt, self.cfg.critic.grad_clip)
        return total, norm, ok

    def _backward(
        self,
        mb: MicroBatch,
        b: Batch,
        x: Batch,
        values: torch.Tensor,
        returns: torch.Tensor,
        old_values: torch.Tensor,
    ) -> torch.Tensor:
        """Backward of micro-batch `x`'s share of the value loss; returns that share, detached."""
        cc = self.cfg.critic
        agg = self.cfg.algorithm.loss_agg
        loss, _ = value_loss(
            values,
            returns,
            getattr(x, self._targets),
            old_values=old_values if cc.value_clip else None,
            clip=cc.value_clip,
            agg=agg,
            tensors=True,
        )
        w = share(getattr(x, self._targets), getattr(b, self._targets), agg) * mb.weight
        (loss * w).backward()
        return loss.detach() * w

    # -- weights and state ---------------------------------------------------------------------
    def reset_from_policy(self, backbone: dict[str, torch.Tensor]) -> None:
        """Critic <- `backbone` (the policy's base-model weights, LoRA merged) and a zero value
        head; a fresh optimizer. Frozen parameters stay frozen. A critic of its own
        (`critic.name_or_path`) is not the policy's shape: it keeps its weights."""
        if self.cfg.critic.name_or_path != "policy":
            return
        state = {"backbone." + k: v for k, v in backbone.items()}
        dtype = next(iter(state.values())).dtype
        head = self.critic.value_head
        state["value_head.weight"] = torch.zeros(head.weight.shape, dtype=dtype)
        state["value_head.bias"] = torch.zeros(head.bias.shape, dtype=dtype)
        self.sharding.load_state(self.critic, onto_lora(state, self.critic, self.sharding))
        self.new_optimizer()

    def state_dict(self) -> dict[str, Any]:
        """`critic` and `critic_opt`, the learner checkpoint's entries (gathered when sharded)."""
        return {
            "critic": self.sharding.full_state(self.critic),
            "critic_opt": self.sharding.optimizer_state(self.critic, self.opt),
        }

    def load_state(self, state: dict[str, Any]) -> None:
        """The inverse of `state_dict` (every rank calls it when sharded)."""
        self.sharding.load_state(
            self.critic, state.get("critic", {}), self.opt, state.get("critic_opt")
        )

    def load(self, path: str) -> None:
        """Critic weights from `saorl value-pretrain` (the optimizer starts fresh)."""
        if not Path(path).is_file():
            raise ConfigError(
                f"critic.init_from: no file {path!r} (write one with saorl value-pretrain)"
            )
        state = load_state_file(path)
        try:
            self.critic.load_state_dict(state["critic"])
        except (KeyError, RuntimeError) as e:
            raise ConfigError(f"critic.init_from: {path} does not fit this model: {e}") from e

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(updater, *args)`: for tests and tools (the Ray actor's way in)."""
        return fn(self, *args)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
