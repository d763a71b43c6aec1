"""FSDP2 for the learner: `FSDPSharding`, the learner's `Sharding` over a process group.

The learner stays one class (`saorl.learner.learner.Learner`); given an `FSDPSharding` (by
`saorl.distributed.torchrun.torchrun_learner`, under torchrun or in Ray learner actors) it
shards policy and critic over the ranks of the initialised `torch.distributed` group:

- `shard`: `fully_shard` on every decoder layer, then on the root module, with
  `MixedPrecisionPolicy` when `learner.mixed_precision = "bf16"`. Gradients are reduced by sum,
  not mean, because each rank's loss already carries its rows' share of the *global* batch (the
  whole batch reaches every rank, so the shares need no extra communication): the summed
  sharded gradient is the single-process full-batch gradient.
- `micro_batches`: rank r trains a contiguous block of rows (`rank_bounds`); a rank with fewer
  micro-batches than another adds zero-weight filler passes, since every pass gathers
  parameters collectively.
- `map_rows`: per-rank `(n_r, T)` results (critic values, old log-probs) gathered to `(B, T)`.
- `floats`: sums, minima and maxima reduced over ranks, one collective each.
- `for_critic` (used with `critic.concurrent`): an `FSDPSharding` over a process group of its own
  (the same ranks): the critic's all-gathers, reduce-scatters and norms then never interleave
  with the policy's, so the two can run at once on every rank (`saorl.learner.critic_updater`).
- `full_state` / `optimizer_state` / `load_state`: full (unsharded) CPU state dicts for weight
  pushes and checkpoints, via `torch.distributed.checkpoint.state_dict`.

Tested against the single-process learner in `tests/parity/` (2 gloo ranks under torchrun).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from saorl.learner.sharding import (
    MicroBatch,
    Plan,
    Sharding,
    StepMetrics,
    own_fused_flags,
    stacked_floats,
)
from saorl.types import Batch


class FSDPSharding(Sharding):
    """Modules sharded with FSDP2 over every rank of `group` (None: the default group)."""

    sharded = True

    def __init__(self, mixed_precision: str, device: torch.device, group: Any = None) -> None:
        self.mixed_precision = mixed_precision
        self.device = device
        self.group = group
        self.rank = dist.get_rank(group)
        self.world = dist.get_world_size(group)

    def shard(self, module: nn.Module) -> None:
        mesh = None
        if self.group is not None:
            from torch.distributed.device_mesh import DeviceMesh

            mesh = DeviceMesh.from_group(self.group, self.device.type)
        shard_module(module, self.mixed_precision, mesh)

    def for_critic(self) -> Sharding:
        """Over a new group of the same ranks (every rank creates it, in the same order:
        `new_group` is collective)."""
        group = dist.new_group(backend=dist.get_backend())
        return FSDPSharding(self.mixed_precision, self.device, group)

    def micro_batches(self, lengths: list[int], plan: Plan) -> list[MicroBatch]:
        # Every rank sees the whole batch, so each computes all ranks' plans and the ranks
        # agree on the number of passes without communicating.
        plans = []
        for r in range(self.world):
            lo, hi = rank_bounds(len(lengths), r, self.world)
            plans.append([[lo + i for i in rows] for rows in plan(lengths[lo:hi])])
        mine = [MicroBatch(rows) for rows in plans[self.rank]]
        filler = mine[0].rows[:1] if mine else [0]
        return mine + [MicroBatch(filler, weight=0.0)] * (max(map(len, plans)) - len(mine))

    def map_rows(
        self, batch: Batch, micro: list[MicroBatch], fn: Callable[[Batch], torch.Tensor]
    ) -> torch.Tensor:
        # `fn` runs once per micro-batch, in order, filler passes included (as in `Sharding`).
        lo, hi = rank_bounds(batch.size, self.rank, self.world)
        local = torch.zeros_like(batch.rewards[lo:hi])
        for mb in micro:
            out = fn(batch.select(mb.rows))
            if mb.weight:  # a filler pass runs for the collectives only
                local[torch.tensor(mb.rows) - lo] = out
        return gather_rows(local, batch.size, self.group)

    def grad_norm(self, params: list[nn.Parameter], clip: float) -> torch.Tensor:
        from torch.distributed.tensor import DTensor

        if self.group is None:
            # The norm over sharded gradients is a DTensor: made whole (a collective) here.
            norm = torch.nn.utils.clip_grad_norm_(params, clip)
            return norm.full_tensor() if isinstance(norm, DTensor) else norm
        # A critic updating on its own thread: the same clipping with one plain all-reduce of
        # the shards' squared norms. DTensor's norm (a functional all-reduce, waited on inside
        # a torch op) hung there against the policy's thread on gloo; this one does not.
        grads = [p.grad for p in params if p.grad is not None]
        local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
        sq = torch.zeros((), device=self.device, dtype=torch.float32)
        for g in local:
            sq = sq + g.detach().float().pow(2).sum()
        dist.all_reduce(sq, group=self.group)
        norm = sq.sqrt()
        coef = (clip / (norm + 1e-6)).clamp(max=1.0)  # as clip_grad_norm_ computes it
        for g in local:
            g.mul_(coef.to(g.dtype))
        return norm

    def floats(self, m: StepMetrics) -> dict[str, float]:
        """Sums, minima and maxima reduced over ranks (every rank holds the same keys: each
        runs the same number of micro-batches); `set` values are every rank's already."""
        # gloo reduces CPU tensors, nccl device tensors.
        dev = torch.device("cpu") if dist.get_backend(self.group) == "gloo" else self.device
        out: dict[str, float] = {}
        for d, op in (
            (m.sums, dist.ReduceOp.SUM),
            (m.mins, dist.ReduceOp.MIN),
            (m.maxs, dist.ReduceOp.MAX),
        ):
            if d:
                keys = sorted(d)
                t = torch.stack([d[k].to(dev, torch.float64) for k in keys])
                dist.all_reduce(t, op=op, group=self.group)
                out.update(zip(keys, t.tolist(), strict=True))
        return {**out, **stacked_floats(m.values)}

    def full_state(self, module: nn.Module, everywhere: bool = False) -> dict[str, Any]:
        """The unsharded state dict on CPU: on rank 0 only (`{}` elsewhere), or on every rank."""
        return full_state(module, everywhere)

    def optimizer_state(self, module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
        return full_optimizer_state(module, opt)

    def load_state(
        self,
        module: nn.Module,
        state: dict[str, Any],
        opt: torch.optim.Optimizer | None = None,
        opt_state: dict[str, Any] | None = None,
    ) -> None:
        """Rank 0's whole state (and optimizer state) broadcast into every rank's shards."""
        if self.rank != 0:
            state = {}
            opt_state = None
        load_full_state(module, state, opt, opt_state)


def shard_module(module: nn.Module, mixed_precision: str, mesh: Any = None) -> None:
    """`fully_shard` every `*DecoderLayer` of `module`, then `module` itself (the root), over
    `mesh` (None: the default group)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if mixed_precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif mixed_precision == "none":
        mp = MixedPrecisionPolicy()
    else:
        raise ValueError(f"learner.mixed_precision: unknown {mixed_precision!r}; use none|bf16")
    layers = [m for m in module.modules() if type(m).__name__.endswith("DecoderLayer")]
    for layer in layers:
        fully_shard(layer, mesh=mesh, mp_policy=mp)
    fully_shard(module, mesh=mesh, mp_policy=mp)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            # Sum, not mean, over ranks: each rank's loss is already weighted by its global share.
            m.set_gradient_divide_factor(1.0)
            # A plain SUM collective (gloo has no PREMUL_SUM); with factor 1 nothing is scaled.
            m.set_force_sum_reduction_for_comms(True)


def rank_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows `[lo, hi)` of an `n`-row batch that `rank` trains on (contiguous, sizes differ <= 1)."""
    return round(rank * n / world), round((rank + 1) * n / world)


def gather_rows(local: torch.Tensor, n: int, group: Any = None) -> torch.Tensor:
    """Concatenate every rank's `(n_r, T)` block (ranks in order) into the `(n, T)` whole."""
    world = dist.get_world_size(group)
    sizes = [rank_bounds(n, r, world) for r in range(world)]
    width = max(hi - lo for lo, hi in sizes)
    padded = local.new_zeros((width, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous(), group=group)
    return torch.cat([p[: hi - lo] for p, (lo, hi) in zip(parts, sizes, strict=True)])


def _options(broadcast: bool = False, cpu_offload: bool = True) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(
        full_state_dict=True, cpu_offload=cpu_offload, broadcast_from_rank0=broadcast
    )


def full_state(module: nn.Module, everywhere: bool = False) -> dict[str, torch.Tensor]:
    """The unsharded state dict of `module` on CPU: on rank 0 only, or on every rank."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module, options=_options(cpu_offload=not everywhere))


def full_optimizer_state(module: nn.Module, opt: torch.optim.Optimizer) -> dict[str, Any]:
    """The unsharded optimizer state (keyed by parameter name) on rank 0's CPU."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(module, opt, options=_options())
    # Unsharded entries (Adam's 0-dim `step`) come back as the optimizer's own tensors: copy
    # them so the returned state does not keep counting with the live optimizer.
    return _copy_tree(state, clone_scalars=True)


def load_full_state(
    module: nn.Module,
    state: dict[str, Any],
    opt: torch.optim.Optimizer | None = None,
    opt_state: dict[str, Any] | None = None,
) -> None:
    """Load full state dicts held by rank 0 (other ranks pass `{}`) into the sharded modules."""
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    # Copies of the containers (not the tensors): the setters replace entries in place.
    set_model_state_dict(module, _copy_tree(state), options=_options(broadcast=True))
    if opt is not None:
        # Cloned: non-sharded entries such as Adam's `step` would otherwise stay shared with
        # the optimizer the state came from (two learners stepping one counter).
        opt_state = own_fused_flags(opt, _copy_tree(opt_state or {}, clone=True))
        set_optimizer_state_dict(module, opt, opt_state, options=_options(broadcast=True))


def _copy_tree(x: Any, clone: bool = False, clone_scalars: bool = False) -> Any:
    if isinstance(x, dict):
        return {k: _copy_tree(v, clone, clone_scalars) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy_tree(v, clone, clone_scalars) for v in x]
    if isinstance(x, torch.Tensor) and (clone or (clone_scalars and x.dim() == 0)):
        return x.detach().clone()
    return x
