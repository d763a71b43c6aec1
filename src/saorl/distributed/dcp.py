"""Sharded checkpoints of an FSDP2 learner with torch.distributed.checkpoint (DCP).

`save_sharded`: every rank writes its own shards of the policy, the critic and both optimizers'
state tensors into one directory (a file per rank, `.metadata` from rank 0); nothing is
gathered onto one rank. The rest of a checkpoint (counters, the optimizers' param_groups, RNG,
the rollout side) is small plain data in the `.pt` that rank 0 writes after it
(`saorl.distributed.torchrun.LeaderLearner.save`, `saorl.checkpoint`).

`load_sharded`: every rank takes its current sharded state as the template and DCP reads, from
whichever files hold them, the pieces its shards need. The ranks that wrote a checkpoint and the
ranks that read it need not be as many: 2 -> 1, 1 -> 2 (tests/parity/test_fsdp_reshard.py).

A single process (a learner without FSDP, `saorl eval`) reads such a checkpoint whole:
`saorl.checkpoint.load_latest_checkpoint` puts `WholeEntry` mappings under `policy`, `critic`,
`policy_opt` and `critic_opt`, which read their tensors from the directory when first used
(whole tensors, optimizer state keyed by index as a plain optimizer's). Sharded learners read
the shards themselves and never touch them, so nothing is loaded twice.

Loading runs no code from the files. DCP reads `.metadata` with plain `pickle.load` and
non-tensor entries with `torch.load(weights_only=False)`; `SafeReader` reads the metadata
through `saorl.checkpoint.read_sharded_metadata` instead (an allow-list unpickler that also
refuses non-tensor entries and storage outside the directory), and only tensors are ever saved
here, whose bytes DCP reads with `weights_only=True`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from saorl.checkpoint import CheckpointError, read_sharded_metadata

# Learner counters a checkpoint restores (`saorl.learner.Learner.state_dict` has the same).
COUNTERS = ("step", "version", "policy_sched", "skipped_steps", "baseline")


class SafeReader(FileSystemReader):
    """DCP's file reader with the metadata read by `read_sharded_metadata`.

    `read_metadata` takes no keyword: DCP then never falls back to per-rank metadata files.
    """

    def read_metadata(self) -> Metadata:  # type: ignore[override]
        md = read_sharded_metadata(Path(self.path))
        if getattr(md, "storage_meta", None) is None:
            md.storage_meta = StorageMeta()
        md.storage_meta.load_id = self.load_id  # as FileSystemReader.read_metadata does
        return md


def _modules(learner: Any) -> dict[str, tuple[Any, Any]]:
    return {"policy": (learner.policy, learner.policy_opt),
            "critic": (learner.critic, learner.critic_opt)}  # fmt: skip


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

    tensors, groups = _tensor_state(learner)
    dcp.save(tensors, checkpoint_id=str(folder))
    return groups


def load_sharded(learner: Any, state: dict[str, Any]) -> None:
    """Restore `learner` from a sharded checkpoint (every rank calls it: a collective).

    `state` holds the counters, `sharded` (the directory) and `param_groups`, as
    `saorl.checkpoint.load_latest_checkpoint` returns them.
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
    return {"step": learner.steps, "version": learner.version,
            "policy_sched": learner.policy_sched.state_dict(),
            "skipped_steps": learner.skipped_steps,
            "baseline": learner.baseline.state_dict()}  # fmt: skip


def set_counters(learner: Any, state: dict[str, Any]) -> None:
    """The counter part of `Learner.load_state` (whose weight part a sharded load replaces)."""
    learner.policy_sched.load_state_dict(state["policy_sched"])
    learner.steps, learner.version = state["step"], state["version"]
    learner.skipped_steps = state.get("skipped_steps", 0)
    learner.baseline.load_state_dict(state["baseline"])


class WholeEntry(Mapping):
    """One entry of a sharded checkpoint (`policy`, `critic`, `policy_opt`, `critic_opt`) as
    whole tensors, read from the shard directory on first use (module doc). Pickles as its
    address (a Ray learner actor reads the files itself)."""

    def __init__(self, folder: str, key: str, param_groups: list[dict[str, Any]] | None) -> None:
        self.folder, self.key, self.param_groups = folder, key, param_groups
        self._data: dict[str, Any] | None = None

    def __getstate__(self) -> dict[str, Any]:
        return {**vars(self), "_data": None}

    def _load(self) -> dict[str, Any]:
        if self._data is None:
            self._data = read_whole(self.folder, self.key, self.param_groups)
        return self._data

    def __getitem__(self, name: str) -> Any:
        return self._load()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def copy(self) -> dict[str, Any]:  # what torch.optim.Optimizer.load_state_dict calls
        return dict(self._load())


def whole_entries(folder: str, param_groups: dict[str, Any]) -> dict[str, WholeEntry]:
    """The `WholeEntry` of each module and optimizer of the sharded checkpoint in `folder`."""
    return {name: WholeEntry(folder, name, None) for name in ("policy", "critic")} | {
        f"{name}_opt": WholeEntry(folder, f"{name}_opt", param_groups.get(name, []))
        for name in ("policy", "critic")
    }


def read_whole(folder: str, key: str, param_groups: list[dict[str, Any]] | None) -> dict:
    """Entry `key` of the sharded checkpoint in `folder`, whole, in this process (no process
    group). With `param_groups` (an optimizer's, parameters named) the state comes back as a
    plain optimizer's state dict: parameters numbered in the order the groups list them."""
    import warnings

    from torch.distributed.checkpoint.api import CheckpointException
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

    try:
        with warnings.catch_warnings():  # "assuming the intent is to load in a single process"
            warnings.simplefilter("ignore", UserWarning)
            data = _load_state_dict_from_keys({key}, storage_reader=SafeReader(folder))[key]
    except (Exception, CheckpointException) as e:  # DCP's is a BaseException
        cause = next(iter(getattr(e, "failures", {}).values()), e)  # DCP's: per rank
        why = f"{type(cause).__name__}: {(str(cause).splitlines() or [''])[0][:100]}"
        # The instruction first: a learner whose load fails wraps this, keeping 300 characters.
        raise CheckpointError(
            "a sharded checkpoint (written by FSDP ranks) could not be read whole in one process;"
            " resume it with learner.fsdp=true under torchrun, any number of ranks (torchrun "
            "--nproc_per_node N -m saorl train ... --resume RUN_DIR), or ray.learner_ranks >= 2 "
            f"({why}). Shards: {folder}"
        ) from e
    if param_groups is None:
        return data
    index: dict[str, int] = {}
    groups = []
    for group in param_groups:
        ids = [index.setdefault(fqn, len(index)) for fqn in group["params"]]
        groups.append({**group, "params": ids})
    return {"state": {index[fqn]: v for fqn, v in data.items() if fqn in index},
            "param_groups": groups}  # fmt: skip
