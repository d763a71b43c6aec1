"""Sharded checkpoints of an FSDP2 learner with torch.distributed.checkpoint (DCP).

`save_sharded`: every rank writes its own shards of the policy, the critic and both optimizers'
state tensors into one directory (a file per rank, `.metadata` from rank 0); nothing is
gathered onto one rank. The rest of a checkpoint (counters, the optimizers' param_groups, RNG,
the rollout side) is small plain data in the `.pt` that rank 0 writes after it
(`saorl.distributed.torchrun.LeaderLearner.save`, `saorl.checkpoint`).

`load_sharded`: every rank takes its current sharded state as the template and DCP reads, from
whichever files hold them, the pieces its shards need. The ranks that wrote a checkpoint and the
ranks that read it need not be as many: 2 -> 1, 1 -> 2 (tests/parity/test_fsdp_reshard.py).

A single process (a learner without FSDP, `saorl eval`) reads such a checkpoint whole through
`saorl.checkpoint.shards` (`SafeReader`, `open_sharded`, `WholeEntry`), which this module's
readers share and which imports nothing of the distributed adapters.

Loading runs no code from the files. DCP reads `.metadata` with plain `pickle.load` and
non-tensor entries with `torch.load(weights_only=False)`; `SafeReader` reads the metadata
through `saorl.checkpoint.io.read_sharded_metadata` instead (an allow-list unpickler that
also refuses non-tensor entries and storage outside the directory), and only tensors are ever saved
here, whose bytes DCP reads with `weights_only=True`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from saorl.checkpoint.io import read_sharded_metadata
from saorl.checkpoint.shards import SafeReader

# Learner counters a checkpoint restores (`saorl.learner.learner.Learner.state_dict` has the same).
COUNTERS = ("step", "version", "policy_sched", "skipped_steps", "baseline")


def _modules(learner: Any) -> dict[str, tuple[Any, Any]]:
    return {
        "policy": (learner.policy, learner.policy_opt),
        "critic": (learner.critic, learner.critic_opt),
    }


def _tensor_state(learner: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """`(tensors, param_groups)`: this rank's sharded weights and optimizer-state tensors, and
    the optimizers' param_groups (plain data, the same on every rank)."""
    from torch.distributed.checkpoint.state_dict import (
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    tensors: dict[str, Any] = {}
    groups: dict[str, Any] = {}
    for name, (module, opt) in _modules(learner).items():
        tensors[name] = get_model_state_dict(module)
        # A fresh optimizer has no state yet: this initialises it (an lr-0 step on zero grads),
        # so that the template of a load holds every moment.
        opt_state = get_optimizer_state_dict(module, opt)
        tensors[f"{name}_opt"] = opt_state["state"]
        groups[name] = opt_state["param_groups"]
    return tensors, groups


def save_sharded(learner: Any, folder: Path) -> dict[str, Any]:
    """Write `learner`'s weights and optimizer tensors to `folder` (every rank calls it: a
    collective); returns the optimizers' param_groups for the checkpoint file."""
    import torch.distributed.checkpoint as dcp

    from saorl.security.safe_io import refuse_link

    # DCP opens its files by name: a link planted in (or as) the folder is refused first.
    refuse_link(folder, "a checkpoint folder")
    for entry in Path(folder).iterdir() if Path(folder).is_dir() else ():
        refuse_link(entry, "a checkpoint shard")
    tensors, groups = _tensor_state(learner)
    dcp.save(tensors, checkpoint_id=str(folder))
    return groups


def load_sharded(learner: Any, state: dict[str, Any]) -> None:
    """Restore `learner` from a sharded checkpoint (every rank calls it: a collective).

    `state` holds the counters, `sharded` (the directory) and `param_groups`, as
    `saorl.checkpoint.io.load_latest_checkpoint` returns them.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    folder = str(state["sharded"])
    read_sharded_metadata(folder)  # a refusal raised as saorl's error, before any collective
    tensors, _ = _tensor_state(learner)
    dcp.load(tensors, storage_reader=SafeReader(folder))
    for name, (module, opt) in _modules(learner).items():
        set_model_state_dict(module, tensors[name])
        groups = state["param_groups"][name]
        set_optimizer_state_dict(
            module, opt, {"state": tensors[f"{name}_opt"], "param_groups": groups}
        )
    set_counters(learner, state)


def counters(learner: Any) -> dict[str, Any]:
    """The counters of `learner` for a checkpoint file (what `set_counters` reads)."""
    return {
        "step": learner.steps,
        "version": learner.version,
        "policy_sched": learner.policy_sched.state_dict(),
        "skipped_steps": learner.skipped_steps,
        "baseline": learner.baseline.state_dict(),
    }


def set_counters(learner: Any, state: dict[str, Any]) -> None:
    """The counter part of `Learner.load_state` (whose weight part a sharded load replaces)."""
    learner.policy_sched.load_state_dict(state["policy_sched"])
    learner.steps = state["step"]
    learner.version = state["version"]
    learner.skipped_steps = state.get("skipped_steps", 0)
    learner.baseline.load_state_dict(state["baseline"])
