"""A sharded (FSDP2, torch distributed checkpoint) checkpoint read whole in one process.

`saorl.checkpoint.dcp` writes and reads these checkpoints across ranks; this module is the
part a single process needs, and imports nothing of the distributed adapters: `SafeReader`
(DCP's file reader with the metadata read by the allow-list unpickler of
`saorl.checkpoint.io.read_sharded_metadata`), and `open_sharded`, which the loop calls on
what `saorl.checkpoint.io.load_latest_checkpoint` returns: for a sharded checkpoint it puts
`WholeEntry` mappings under `policy`, `critic`, `policy_opt` and `critic_opt`, which read their
tensors from the directory when first used (whole tensors, optimizer state keyed by index as a plain
optimizer's). Sharded learners read the shards themselves and never touch them.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from torch.distributed.checkpoint import FileSystemReader
from torch.distributed.checkpoint.metadata import Metadata, StorageMeta

from saorl.checkpoint.io import CheckpointError, read_sharded_metadata


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


class WholeEntry(Mapping):
    """One entry of a sharded checkpoint (`policy`, `critic`, `policy_opt`, `critic_opt`) as
    whole tensors, read from the shard directory on first use (module doc). Pickles as its
    address (a Ray learner actor reads the files itself)."""

    def __init__(self, folder: str, key: str, param_groups: list[dict[str, Any]] | None) -> None:
        self.folder = folder
        self.key = key
        self.param_groups = param_groups
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


def open_sharded(state: dict[str, Any]) -> dict[str, Any]:
    """`state` from `load_latest_checkpoint`; for a sharded checkpoint, with the `WholeEntry` of
    each module and optimizer added (read whole, on first use, by a learner not sharded)."""
    if "sharded" in state:
        state.update(whole_entries(str(state["sharded"]), state.get("param_groups", {})))
    return state


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
    return {
        "state": {index[fqn]: v for fqn, v in data.items() if fqn in index},
        "param_groups": groups,
    }
