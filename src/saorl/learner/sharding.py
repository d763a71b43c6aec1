"""How the learner's work is spread over processes: `Sharding`, here for one process.

The learner (`saorl.learner`) is written once, for one process. Everything that changes when
policy and critic are sharded over several ranks goes through one `Sharding` object:

- `shard(module)`: wrap a module for sharded training (here: nothing);
- `micro_batches(lengths, plan)`: this process's micro-batches of a batch (here: all rows);
- `map_rows(batch, micro, fn)`: a per-row computation over this process's rows, whole `(B, T)`
  back (here: just run it);
- `grad_norm(params, clip)`: clip and return the global gradient norm;
- `optimizer_step(params, opt, clip)`: clip, and step unless the gradient is not finite
  (decided on the device: `step_unless_nonfinite`);
- `for_critic()`: a `Sharding` for a critic that updates beside the policy (sharded: over a
  process group of its own, so that the two never interleave collectives;
  `saorl.learner.critic_updater`);
- `floats(metrics)`: a step's metrics as python floats, combined over ranks, in one sync;
- `full_state` / `optimizer_state` / `load_state`: whole state dicts for weight pushes and
  checkpoints.

`saorl.distributed.fsdp.FSDPSharding` implements the same methods with FSDP2 over a
`torch.distributed` group. `StepMetrics` collects a step's metrics as detached tensors so that
nothing waits for the device until the step ends.

Whether an optimizer step was taken is a device tensor too. A fused AdamW
(`saorl.learner.optim.adamw`) is handed `found_inf`, as `torch.amp.GradScaler` does: the
kernel leaves weights and moments as they are when it is set, and the step count is undone, all
on the device. The caller learns whether the step was taken at its metrics sync. Another
optimizer (the critic's `OffloadedAdamW`, a device without the fused kernel) is stepped after a
host read of the flag, one sync per optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from saorl.types import Batch

Plan = Callable[[list[int]], list[list[int]]]  # row lengths -> micro-batches of row indices


@dataclass(frozen=True)
class MicroBatch:
    """Rows of a batch that run through one forward/backward pass together.

    `weight` scales the pass's loss and metrics: 1, or 0 for a filler pass that a sharded
    learner runs only so that every rank makes the same number of collective calls.
    """

    rows: list[int]
    weight: float = 1.0


class StepMetrics:
    """One learner step's metrics as detached tensors; `Sharding.floats` makes them floats.

    `add` sums weighted values (a micro-batch's value times its share of the batch adds up to
    the batch value, over micro-batches and over ranks); `low` and `high` keep a minimum and a
    maximum; `set` holds a value that is already the batch's (computed on the whole batch).
    """

    def __init__(self) -> None:
        self.sums: dict[str, torch.Tensor] = {}
        self.mins: dict[str, torch.Tensor] = {}
        self.maxs: dict[str, torch.Tensor] = {}
        self.values: dict[str, torch.Tensor] = {}

    def add(self, key: str, value: torch.Tensor, weight: torch.Tensor | float = 1.0) -> None:
        self.sums[key] = self.sums.get(key, 0.0) + value.detach() * weight

    def low(self, key: str, value: torch.Tensor) -> None:
        old = self.mins.get(key)
        self.mins[key] = value.detach() if old is None else torch.minimum(old, value.detach())

    def high(self, key: str, value: torch.Tensor) -> None:
        old = self.maxs.get(key)
        self.maxs[key] = value.detach() if old is None else torch.maximum(old, value.detach())

    def set(self, key: str, value: torch.Tensor) -> None:
        self.values[key] = value.detach()


@dataclass
class StepFlags:
    """A learner step's decisions, made on the device: whether each policy optimizer step not
    yet settled was taken (0-dim bools, in order) and how many critic steps were skipped for a
    non-finite gradient (0-dim, None without a critic update). Not metrics: `Sharding.read`
    returns them beside the metrics, from the same device read."""

    policy_stepped: list[torch.Tensor] = field(default_factory=list)
    critic_skipped: torch.Tensor | None = None

    def tensors(self) -> list[torch.Tensor]:
        skipped = [] if self.critic_skipped is None else [self.critic_skipped]
        return [*self.policy_stepped, *skipped]


@dataclass
class StepDecisions:
    """`StepFlags` read on the host: the policy steps taken, the critic steps skipped."""

    policy_stepped: list[bool]
    critic_skipped: int


def stacked_floats(tensors: dict[str, torch.Tensor]) -> dict[str, float]:
    """Python floats of 0-dim tensors, with one device sync for all of them."""
    if not tensors:
        return {}
    keys = list(tensors)
    dev = tensors[keys[0]].device
    vals = torch.stack([tensors[k].to(dev, torch.float64) for k in keys]).tolist()
    return dict(zip(keys, vals, strict=True))


def step_unless_nonfinite(opt: Any, ok: torch.Tensor) -> None:
    """`opt.step()` unless `ok` (a 0-dim bool tensor) is false: decided on the device for a
    fused Adam/AdamW, after a host read of `ok` for any other optimizer."""
    fused = isinstance(opt, torch.optim.Adam | torch.optim.AdamW) and all(
        g.get("fused") for g in opt.param_groups
    )
    if not fused:
        if bool(ok):
            opt.step()
        return
    # Read by the fused kernel, which skips the update when it is nonzero; removed after, so
    # that no later `step` (a checkpoint test, a tool) sees a stale flag.
    opt.found_inf = (~ok).to(torch.float32)
    try:
        opt.step()
    finally:
        del opt.found_inf


def own_fused_flags(opt: Any, opt_state: dict[str, Any]) -> dict[str, Any]:
    """`opt_state` with `opt`'s own `fused` setting: loading a state replaces the parameter
    groups' options, and a checkpoint written by an unfused AdamW would otherwise turn this
    one's on-device skipping off (its `step` counts are moved to fit by `load_state_dict`)."""
    groups = opt_state.get("param_groups")
    if not groups or len(groups) != len(opt.param_groups):
        return opt_state  # not a torch optimizer's state (the offloaded one), or a misfit
    pairs = zip(groups, opt.param_groups, strict=True)
    own = [{**saved, "fused": g.get("fused")} for saved, g in pairs]
    return {**opt_state, "param_groups": own}


class Sharding:
    """One process: the whole batch, the whole model, nothing to combine."""

    sharded = False  # FSDP2 applies mixed precision itself; one process uses autocast

    def shard(self, module: nn.Module) -> None:
        """Prepare `module` for training (sharded learners wrap it; here it stays as it is)."""

    def micro_batches(self, lengths: list[int], plan: Plan) -> list[MicroBatch]:
        """The micro-batches this process runs for a batch whose rows have `lengths` tokens."""
        return [MicroBatch(rows) for rows in plan(lengths)]

    def map_rows(
        self, batch: Batch, micro: list[MicroBatch], fn: Callable[[Batch], torch.Tensor]
    ) -> torch.Tensor:
        """`fn(rows) -> (n, T)` over `micro` (once per micro-batch, in order), put back in place
        as the batch's `(B, T)`."""
        out = torch.zeros_like(batch.rewards)
        for mb in micro:  # packed micro-batches need not be contiguous rows
            out[mb.rows] = fn(batch.select(mb.rows))
        return out

    def grad_norm(self, params: list[nn.Parameter], clip: float) -> torch.Tensor:
        """Clip the gradients of `params` to norm `clip`; return the norm before clipping."""
        return torch.nn.utils.clip_grad_norm_(params, clip)

    def optimizer_step(
        self, params: list[nn.Parameter], opt: torch.optim.Optimizer, clip: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Clip and step unless the gradient is not finite; `(norm before clipping, stepped)`,
        both 0-dim device tensors (no host sync with a fused AdamW)."""
        norm = self.grad_norm(params, clip)
        ok = torch.isfinite(norm)
        step_unless_nonfinite(opt, ok)
        opt.zero_grad(set_to_none=True)
        return norm, ok

    def for_critic(self) -> Sharding:
        """The sharding of a critic updating concurrently: here the same (nothing to interleave)."""
        return self

    def floats(self, m: StepMetrics) -> dict[str, float]:
        """Every metric of `m` as a python float (minima and maxima under their own keys)."""
        return stacked_floats({**m.sums, **m.mins, **m.maxs, **m.values})

    def read(self, m: StepMetrics, flags: StepFlags) -> tuple[dict[str, float], StepDecisions]:
        """`floats(m)` and the step's `flags`, with one device read: the flags travel in the
        same transfer as the `set` values (every rank's already), under keys no metric has,
        and never reach the metrics returned."""
        tensors = flags.tensors()
        keys = [f"\x00flag/{i}" for i in range(len(tensors))]
        m.values.update(zip(keys, tensors, strict=True))
        try:
            metrics = self.floats(m)
        finally:
            for key in keys:
                m.values.pop(key)
        values = [metrics.pop(key) for key in keys]
        n = len(flags.policy_stepped)
        skipped = round(values[n]) if flags.critic_skipped is not None else 0
        return metrics, StepDecisions([bool(v) for v in values[:n]], skipped)

    def full_state(self, module: nn.Module, everywhere: bool = False) -> dict[str, Any]:
        """`module`'s whole state dict (detached tensors; `everywhere` matters when sharded)."""
        return module.state_dict()

    def optimizer_state(self, module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        return opt.state_dict()

    def load_state(
        self,
        module: nn.Module,
        state: dict[str, Any],
        opt: torch.optim.Optimizer | None = None,
        opt_state: dict[str, Any] | None = None,
    ) -> None:
        """Load a whole state dict (and optionally an optimizer state) into `module`."""
        module.load_state_dict(state)
        if opt is not None:
            if opt_state is None:
                raise KeyError("the optimizer state is missing")
            # Adam's 0-dim `step` tensors are kept as given when they already fit (fused
            # AdamW): cloned, so that the state loaded from stays as it was when this trains.
            if isinstance(opt_state.get("state"), dict):
                per_param = {
                    pid: {
                        k: v.clone() if isinstance(v, torch.Tensor) and v.dim() == 0 else v
                        for k, v in entry.items()
                    }
                    if isinstance(entry, dict)
                    else entry
                    for pid, entry in opt_state["state"].items()
                }
                opt_state = {**opt_state, "state": per_param}
            opt.load_state_dict(own_fused_flags(opt, opt_state))
