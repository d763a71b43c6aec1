"""FSDP2 for the learner: shard policy and critic, split the batch over ranks, gather states.

The learner stays one class (`saorl.learner.Learner`); with `learner.fsdp = true` and an
initialised `torch.distributed` process group it calls the helpers here:

- `shard_module`: `fully_shard` on every decoder layer, then on the root module, with
  `MixedPrecisionPolicy` when `learner.mixed_precision = "bf16"`. Gradients are reduced by sum,
  not mean, because each rank's loss already carries its rows' share of the *global* batch (the
  whole batch reaches every rank, so the shares need no extra communication): the summed
  sharded gradient is the single-process full-batch gradient.
- `rank_bounds`: rank r takes a contiguous block of the batch rows.
- `gather_rows`: per-rank `(n_r, T)` results (critic values, old log-probs) back to `(B, T)`.
- `reduce_metrics`: sums, minima and maxima over ranks, in one collective each.
- `full_state` / `load_full_state`: full (unsharded) CPU state dicts for weight pushes and
  checkpoints, via `torch.distributed.checkpoint.state_dict`.
- `torchrun_learner`, `LeaderLearner`, `follow`: `torchrun ... -m saorl train learner.fsdp=true`
  without Ray; rank 0 runs the loop and the other ranks mirror its learner calls.

Tested against the single-process learner in `tests/parity/` (2 gloo ranks under torchrun).
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from saorl.config import Config


def fsdp_active(cfg: Config) -> bool:
    """`learner.fsdp` is set and a process group is initialised (e.g. by torchrun)."""
    return cfg.learner.fsdp and dist.is_available() and dist.is_initialized()


def rank_and_world(active: bool) -> tuple[int, int]:
    return (dist.get_rank(), dist.get_world_size()) if active else (0, 1)


def shard_module(module: nn.Module, mixed_precision: str) -> None:
    """`fully_shard` every `*DecoderLayer` of `module`, then `module` itself (the root)."""
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    if mixed_precision == "bf16":
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    elif mixed_precision == "none":
        mp = MixedPrecisionPolicy()
    else:
        raise ValueError(f"learner.mixed_precision: unknown {mixed_precision!r}; use none|bf16")
    layers = [m for m in module.modules() if type(m).__name__.endswith("DecoderLayer")]
    for layer in layers:
        fully_shard(layer, mp_policy=mp)
    fully_shard(module, mp_policy=mp)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            # Sum, not mean, over ranks: each rank's loss is already weighted by its global share.
            m.set_gradient_divide_factor(1.0)
            # A plain SUM collective (gloo has no PREMUL_SUM); with factor 1 nothing is scaled.
            m.set_force_sum_reduction_for_comms(True)


def rank_bounds(n: int, rank: int, world: int) -> tuple[int, int]:
    """Rows `[lo, hi)` of an `n`-row batch that `rank` trains on (contiguous, sizes differ <= 1)."""
    return round(rank * n / world), round((rank + 1) * n / world)


def gather_rows(local: torch.Tensor, n: int) -> torch.Tensor:
    """Concatenate every rank's `(n_r, T)` block (ranks in order) into the `(n, T)` whole."""
    world = dist.get_world_size()
    sizes = [rank_bounds(n, r, world) for r in range(world)]
    width = max(hi - lo for lo, hi in sizes)
    padded = local.new_zeros((width, *local.shape[1:]))
    padded[: local.shape[0]] = local
    parts = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([p[: hi - lo] for p, (lo, hi) in zip(parts, sizes, strict=True)])


def reduce_metrics(
    sums: dict[str, torch.Tensor], mins: dict[str, float], maxs: dict[str, float],
    device: torch.device,
) -> dict[str, float]:  # fmt: skip
    """Sum `sums`, min `mins` and max `maxs` over ranks; python floats out (one sync each).

    Every rank must hold the same keys (each rank runs the same number of micro-batches).
    """
    # gloo reduces CPU tensors, nccl device tensors.
    dev = torch.device("cpu") if dist.get_backend() == "gloo" else device
    out: dict[str, float] = {}
    if sums:
        keys = sorted(sums)
        t = torch.stack([torch.as_tensor(sums[k], dtype=torch.float64).to(dev) for k in keys])
        dist.all_reduce(t, op=dist.ReduceOp.SUM)
        out.update(zip(keys, t.tolist(), strict=True))
    for d, op in ((mins, dist.ReduceOp.MIN), (maxs, dist.ReduceOp.MAX)):
        if d:
            keys = sorted(d)
            t = torch.tensor([d[k] for k in keys], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=op)
            out.update(zip(keys, t.tolist(), strict=True))
    return out


def scalar(x: torch.Tensor) -> float:
    """A (possibly DTensor) scalar as a python float; a DTensor is made whole first."""
    from torch.distributed.tensor import DTensor

    if isinstance(x, DTensor):
        x = x.full_tensor()
    return float(x)


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
    module: nn.Module, state: dict[str, Any], opt: torch.optim.Optimizer | None = None,
    opt_state: dict[str, Any] | None = None,
) -> None:  # fmt: skip
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
        opt_state = _copy_tree(opt_state or {}, clone=True)
        set_optimizer_state_dict(module, opt, opt_state, options=_options(broadcast=True))


def _copy_tree(x: Any, clone: bool = False, clone_scalars: bool = False) -> Any:
    if isinstance(x, dict):
        return {k: _copy_tree(v, clone, clone_scalars) for k, v in x.items()}
    if isinstance(x, list):
        return [_copy_tree(v, clone, clone_scalars) for v in x]
    if isinstance(x, torch.Tensor) and (clone or (clone_scalars and x.dim() == 0)):
        return x.detach().clone()
    return x


# --- `torchrun ... saorl train learner.fsdp=true`: rank 0 leads, the other ranks follow. ---
#
# Rank 0 runs the whole loop (rollouts, evaluation, checkpoints) with a `LeaderLearner`; every
# call that needs all ranks (a learner step, a state gather, a state load) is announced first
# with `broadcast_object_list`, and the other ranks, in `follow`, make the same call. Rollouts
# and evaluation use an unsharded replica of the policy on rank 0, refreshed from the gathered
# weights whenever the policy version has moved.

_COUNTERS = ("step", "version", "policy_sched", "skipped_steps", "baseline")


def _announce(command: str, payload: Any = None) -> Any:
    msg = [command, payload]
    dist.broadcast_object_list(msg, src=0)
    return msg


class LeaderLearner:
    """Rank 0's learner under torchrun: a `Learner` whose collective calls the followers mirror.

    Attribute reads (`steps`, `version`, `cfg`, ...) go to the wrapped learner; `policy` is a
    full unsharded replica for the engines, evaluation, the supervised warm-up and the export.
    """

    def __init__(self, learner: Any, replica: nn.Module) -> None:
        self._learner = learner
        self._replica = replica
        self._replica_version = learner.version

    def __getattr__(self, name: str) -> Any:
        return getattr(self._learner, name)

    @property
    def policy(self) -> nn.Module:
        if self._replica_version != self._learner.version:
            self.policy_state()
        return self._replica

    def step(self, batch: Any) -> dict[str, Any]:
        _announce("step", batch)
        return self._learner.step(batch)

    def policy_state(self) -> dict[str, torch.Tensor]:
        _announce("policy_state")
        state = self._learner.policy_state()
        self._replica.load_state_dict(state)
        self._replica_version = self._learner.version
        return state

    def state_dict(self) -> dict[str, Any]:
        _announce("state_dict")
        return self._learner.state_dict()

    def load_state(self, state: dict[str, Any]) -> None:
        _announce("load_state", {k: state[k] for k in _COUNTERS if k in state})
        self._learner.load_state(state)
        self._replica.load_state_dict(state["policy"])
        self._replica_version = self._learner.version

    def reset_critic_from_policy(self) -> None:
        """After a supervised warm-up of the replica: replica -> shards, then a fresh critic."""
        _announce("reset_from_policy")
        load_full_state(self._learner.policy, self._replica.state_dict())
        self._learner.reset_critic_from_policy()
        self._replica_version = self._learner.version

    def close(self) -> None:
        _announce("stop")
        dist.destroy_process_group()


def follow(learner: Any) -> None:
    """A rank > 0: make the learner calls rank 0 announces, until it says stop."""
    while True:
        command, payload = _announce("", None)
        if command == "step":
            learner.step(payload)
        elif command == "policy_state":
            learner.policy_state()
        elif command == "state_dict":
            learner.state_dict()
        elif command == "load_state":
            learner.load_state(payload)
        elif command == "reset_from_policy":
            load_full_state(learner.policy, {})
            learner.reset_critic_from_policy()
        elif command == "stop":
            dist.destroy_process_group()
            return
        else:
            raise RuntimeError(f"FSDP follower: unknown command {command!r} from rank 0")


def torchrun_learner(cfg: Config, policy: nn.Module, device: torch.device) -> LeaderLearner | None:
    """Under torchrun with `learner.fsdp`: the sharded learner of this rank.

    Rank 0 gets a `LeaderLearner` to run the loop with; every other rank follows rank 0's calls
    here until the run ends and gets None. `policy` must be the same on every rank (the same
    seed builds the same random-init or loaded weights).
    """
    import os

    from saorl.config import ConfigError
    from saorl.learner import Learner

    if cfg.critic.init_from:
        raise ConfigError("critic.init_from is not supported with learner.fsdp yet; unset one")
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    # Sharding rewrites `policy` in place: rank 0 keeps an unsharded copy for the rollout side.
    replica = copy.deepcopy(policy) if dist.get_rank() == 0 else None
    learner = Learner(cfg, policy, device)
    if replica is None:
        follow(learner)
        return None
    return LeaderLearner(learner, replica.to(device))
