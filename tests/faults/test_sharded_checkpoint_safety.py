"""Sharded checkpoints (an FSDP2 run's `step_X.dcp/`) are data, never code.

torch.distributed.checkpoint reads `.metadata` with plain `pickle.load` and non-tensor entries
with `torch.load(weights_only=False)`. saorl reads the metadata with an allow-list unpickler
and refuses non-tensor entries and storage outside the directory (`read_sharded_metadata`),
before any rank loads anything: a crafted directory stops the resume with exit code 2 and runs
nothing; a directory with a missing shard is damage, and the resume falls back past it.
"""

from __future__ import annotations

import os
import pickle
from pathlib import Path, PosixPath

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException

from saorl.checkpoint.dcp import SafeReader
from saorl.checkpoint.io import (
    DamagedCheckpointError,
    UnsafeCheckpointError,
    list_checkpoints,
    load_latest_checkpoint,
    read_sharded_metadata,
    save_checkpoint,
    sharded_checkpoint_path,
)
from tests.faults._common import TINY_SYNC, run_saorl
from tests.faults.test_checkpoint_safety import _refused, _RunsCommand, _snapshot

pytestmark = [
    pytest.mark.faults,
    pytest.mark.filterwarnings("ignore:torch.distributed is disabled"),
]

TENSORS = {"policy": {"w": torch.arange(6.0).reshape(2, 3)}, "policy_opt": {"w": torch.ones(3)}}


def _sharded(run: Path, step: int, tensors: dict | None = None) -> Path:
    """A checkpoint of `step` whose tensors are a DCP directory (written in one process)."""
    folder = sharded_checkpoint_path(run, step)
    dcp.save(tensors or TENSORS, checkpoint_id=str(folder))
    save_checkpoint(run, step, {"step": step, "sharded": folder.name}, keep=0)
    return folder


def _rewrite_metadata(folder: Path, edit) -> None:
    md = pickle.loads((folder / ".metadata").read_bytes())
    (folder / ".metadata").write_bytes(pickle.dumps(edit(md)))


def test_a_sharded_checkpoint_reads_back(tmp_path: Path):
    folder = _sharded(tmp_path, 1)
    path, state = load_latest_checkpoint(tmp_path)
    assert path.name == "step_00000001.pt" and state["sharded"] == str(folder)
    got = {"policy": {"w": torch.zeros(2, 3)}, "policy_opt": {"w": torch.zeros(3)}}
    dcp.load(got, storage_reader=SafeReader(folder))
    assert torch.equal(got["policy"]["w"], TENSORS["policy"]["w"])


def test_metadata_that_runs_code_is_refused(tmp_path: Path):
    marker = tmp_path / "MARKER"
    folder = _sharded(tmp_path, 1)
    _rewrite_metadata(folder, lambda md: {"metadata": md, "x": _RunsCommand(marker)})
    before = _snapshot(tmp_path)
    with pytest.raises(UnsafeCheckpointError, match=r"GLOBAL (posix|os)\.system"):
        load_latest_checkpoint(tmp_path, quarantine=True)
    # DCP's own load goes through the same reader (and wraps its error in its own type).
    with pytest.raises(CheckpointException, match="refused to load"):
        dcp.load({"policy": {"w": torch.zeros(2, 3)}}, storage_reader=SafeReader(folder))
    assert not marker.exists()
    assert _snapshot(tmp_path) == before  # refused, not quarantined or cleaned up


def test_non_tensor_entries_and_outside_storage_are_refused(tmp_path: Path):
    # A non-tensor value is stored as a pickle DCP would load with weights_only=False.
    folder = _sharded(tmp_path / "a", 1, {"policy": {"w": torch.ones(2)}, "note": {"x": [1, 2]}})
    with pytest.raises(UnsafeCheckpointError, match="not tensors: note"):
        read_sharded_metadata(folder)
    folder = _sharded(tmp_path / "b", 1)

    def escape(md):
        for info in md.storage_data.values():
            info.relative_path = "../../elsewhere.distcp"
        return md

    _rewrite_metadata(folder, escape)
    with pytest.raises(UnsafeCheckpointError, match="outside the shard files"):
        read_sharded_metadata(folder)


def test_missing_shards_are_damage_and_resume_falls_back(tmp_path: Path):
    _sharded(tmp_path, 1)
    newest = _sharded(tmp_path, 2)
    (newest / "__0_0.distcp").unlink()
    with pytest.raises(DamagedCheckpointError, match="shard files missing"):
        read_sharded_metadata(newest)
    path, state = load_latest_checkpoint(tmp_path, quarantine=True)
    assert path.name == "step_00000001.pt" and state["step"] == 1
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    # The damaged .pt (and its digests) are kept for a post mortem; its shards, no longer a
    # checkpoint's, go.
    assert names == [
        "step_00000001.dcp",
        "step_00000001.pt",
        "step_00000001.sha256",
        "step_00000002.pt.damaged",
        "step_00000002.sha256.damaged",
    ]


def test_saorl_train_resume_refuses_a_malicious_sharded_checkpoint(tmp_path: Path):
    out = tmp_path / "runs"
    made = run_saorl(
        "train", *TINY_SYNC, "run.total_steps=1", f"run.output_dir={out}", "run.name=r"
    )
    assert made.returncode == 0, made.stderr
    run = out / "r"
    marker = tmp_path / "MARKER"
    folder = _sharded(run, 2)
    _rewrite_metadata(folder, lambda md: _RunsCommand(marker))
    before = _snapshot(run)
    proc = run_saorl("train", "--resume", str(run), "run.total_steps=3")
    _refused(proc, str(folder / ".metadata"), marker)
    assert _snapshot(run) == before
    assert [p.name for p in list_checkpoints(run)][-1] == "step_00000002.pt"


class _ForgedPath:
    """Pickles as a PosixPath whose cached str() is `shown` while its parts are `parts`."""

    def __init__(self, shown: str, *parts: str) -> None:
        self.shown, self.parts = shown, parts

    def __reduce__(self):
        return PosixPath, self.parts, (None, {"_str": self.shown})


def test_a_forged_path_object_cannot_point_at_another_folders_shards(tmp_path: Path):
    other = {"policy": {"w": torch.full((2, 3), 7.0)}, "policy_opt": {"w": torch.ones(3)}}
    victim = _sharded(tmp_path / "victim", 1, other)
    folder = _sharded(tmp_path / "run", 1)
    shard = "__0_0.distcp"
    escape = os.path.relpath(victim / shard, folder)
    forged = pickle.loads(pickle.dumps(_ForgedPath(shard, *Path(escape).parts)))
    # What makes it an attack: it prints as a shard file while a join goes elsewhere.
    assert str(forged) == shard and (folder / forged).resolve() == (victim / shard).resolve()

    def swap(md):
        for info in md.storage_data.values():
            info.relative_path = _ForgedPath(shard, *Path(escape).parts)
        return md

    _rewrite_metadata(folder, swap)
    with pytest.raises(UnsafeCheckpointError, match="outside the shard files"):
        read_sharded_metadata(folder)
    with pytest.raises(CheckpointException, match="refused to load"):
        dcp.load({"policy": {"w": torch.zeros(2, 3)}}, storage_reader=SafeReader(folder))


def test_a_checkpoint_naming_another_folders_shards_is_refused(tmp_path: Path):
    _sharded(tmp_path / "victim", 1)
    run = tmp_path / "run"
    _sharded(run, 1)
    for name in (
        "../../victim/checkpoints/step_00000001.dcp",
        str(tmp_path / "victim" / "checkpoints" / "step_00000001.dcp"),
        "step_00000002.dcp",
    ):
        save_checkpoint(run, 1, {"step": 1, "sharded": name}, keep=0)
        with pytest.raises(UnsafeCheckpointError, match="names the shard directory"):
            load_latest_checkpoint(run)
