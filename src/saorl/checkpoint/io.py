"""Atomic checkpoints and resume.

A checkpoint is one file `checkpoints/step_XXXXXXXX.pt` holding everything needed to continue:
policy and critic weights, both optimizers, the learner's step and version counters, RNG states
and the data position. It is written to a temporary file in the same directory, fsynced, then
renamed over the final name, so a crash leaves either the previous checkpoint or the new one as
the latest, never half a file. Older checkpoints are deleted only after a newer one is in place;
`run.keep_last_checkpoints` of them stay.

Beside it, directories of the same step: `step_X.hf/`, the policy in Hugging Face format
(`run.save_hf`, written by `save_step` before the `.pt`, for evaluation and serving), and for
FSDP2 runs `step_X.dcp/`, the weights and optimizer states as torch.distributed.checkpoint
shards (`saorl.checkpoint.dcp`), which the `.pt` then names instead of holding them. The `.pt`
is written last and commits the step: a directory whose `.pt` is missing is left over from a
killed write and is deleted when a run resumes, or with its `.pt` when that is pruned.

Loading never runs code from the file (a pickle can call any function): every checkpoint and
`critic.init_from` file is read by `load_state_file`, which builds only tensors, plain Python data
and an explicit allow-list of types, and refuses anything else with `UnsafeCheckpointError`. A
refused file is never taken for a damaged one: resume stops instead of falling back past it.

`step_X.sha256` holds the SHA-256 of the `.pt` and of the files of its directories, written
before the `.pt` and checked when they are read (`saorl.checkpoint.digest`): a bit flipped on
storage makes the checkpoint damaged, not silently trained on. A disk that fills during a save
raises `DiskFullError` (exit 2) naming the file; the previous checkpoint is untouched.
"""

from __future__ import annotations

import errno
import io
import os
import pickle
import pickletools
import re
import shutil
import sys
import warnings
import zipfile
from pathlib import Path
from typing import Any

import torch

from saorl.checkpoint.digest import (
    CheckpointError,
    DamagedCheckpointError,
    check,
    manifest_path,
    write_manifest,
)
from saorl.faults import kill_if_armed
from saorl.security.safe_io import check_dir, make_dir, refuse_link, staged

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep` files."""
    d = checkpoint_dir(run_dir)
    make_dir(d, "checkpoint folder")
    kill_if_armed("checkpoint_start", step)
    final = d / f"step_{step:08d}.pt"
    try:
        # A fresh temporary file (never a planted link), renamed over `final` at the end.
        with staged(final, "wb") as (f, tmp):
            torch.save(state, f)
            kill_if_armed("checkpoint_partial", step, torn=f)
            f.flush()
            # A checkpoint that `load_state_file` would refuse could never be resumed: fail now.
            refused = _unsafe_in(tmp)
            if refused:
                raise TypeError(f"checkpoint state holds objects a resume may not load: {refused}")
            write_manifest(final, tmp)
            kill_if_armed("checkpoint_rename", step)
    except Exception as e:
        if disk_full(e):
            raise DiskFullError(_disk_full_message(run_dir, final)) from e
        raise
    # Make the rename itself durable before older checkpoints go away.
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    kill_if_armed("checkpoint_cleanup", step)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)  # first: from here on the step is no checkpoint
        _remove_companions(old)
    return final


def save_step(
    learner: Any, tokenizer: Any, run_dir: Path, state: dict[str, Any], save_hf: bool
) -> None:
    """The checkpoint of `learner`'s current step: its Hugging Face copy first (`save_hf`),
    then `learner.save`, whose `.pt` commits the step (`saorl.interfaces.Learner`).

    The metrics rows logged so far are synced to disk first: a crash after the checkpoint can
    never lose the row of a step it holds (a resume would skip that step for good)."""
    for name in ("metrics.jsonl", "samples.jsonl"):
        _sync_file(run_dir / name)
    make_dir(checkpoint_dir(run_dir), "checkpoint folder")  # never a planted link
    if save_hf:
        hf = hf_checkpoint_path(run_dir, learner.steps)
        try:
            learner.export(tokenizer, hf)
        except Exception as e:
            if disk_full(e):
                raise DiskFullError(_disk_full_message(run_dir, hf)) from e
            raise
    learner.save(run_dir, state)


def _sync_file(path: Path) -> None:
    """fsync `path` (its data written by another open file: fsync works on the file itself)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def disk_full(e: BaseException | None) -> bool:
    """Whether `e`, or an exception in its chain, says the disk (or the quota) is full; torch's
    writer reports it as a RuntimeError about `inline_container.cc` with the OSError inside."""
    seen = 0
    while e is not None and seen < 20:
        if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(e) or "Disk quota exceeded" in str(e):
            return True
        e, seen = e.__cause__ or e.__context__, seen + 1
    return False


def _disk_full_message(run_dir: Path, target: Path) -> str:
    ckpts = list_checkpoints(run_dir)
    previous = (
        f"the previous checkpoint {ckpts[-1]} is intact" if ckpts else "no checkpoint was saved"
    )
    return (
        f"the disk is full: no space left to write {target}; {previous}. Free space, then "
        f"resume with: saorl train --resume {run_dir}"
    )


def hf_checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` keeps the policy in Hugging Face format."""
    return checkpoint_dir(run_dir) / f"step_{step:08d}.hf"


def sharded_checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of `step` of an FSDP2 run keeps its torch.distributed shards."""
    return checkpoint_dir(run_dir) / f"step_{step:08d}.dcp"


_COMPANION = re.compile(r"^step_(\d{8})\.(hf|dcp|sha256)$")


def _remove_companions(ckpt: Path) -> None:
    """Delete what belongs to checkpoint file `ckpt` (`step_X.hf`, `.dcp`, `.sha256`)."""
    manifest_path(ckpt).unlink(missing_ok=True)
    for suffix in (".hf", ".dcp"):
        shutil.rmtree(ckpt.with_suffix(suffix), ignore_errors=True)


def _remove_leftovers(run_dir: Path) -> list[str]:
    """Temporary files and directories of a killed write (checkpoints and `final/`), and
    companion directories whose `.pt` is gone (written before a kill, or left by a pruning cut
    short); their names."""
    d = checkpoint_dir(run_dir)
    removed = []
    for p in [*d.iterdir(), *run_dir.glob(".final.*")]:
        orphan = _COMPANION.match(p.name) and not p.with_suffix(".pt").exists()
        temporary = p.name.startswith((".step_", ".final.")) and (
            ".tmp." in p.name or ".old." in p.name
        )
        if orphan or temporary:
            if p.is_dir():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
            removed.append(p.name)
    return removed


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoint files, oldest first (temporary files are ignored)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


class UnsafeCheckpointError(CheckpointError):
    """A state file that holds code or objects outside the allow-list: refused, never skipped."""


class DiskFullError(CheckpointError):
    """The disk filled up while a checkpoint was written (the previous one is intact)."""

    keep_run = True  # the run's folder holds its checkpoints: a failed start must keep it


def _allowed_globals() -> list[Any]:
    """The only non-tensor types a saorl state file may hold besides plain Python data.

    Rollout state is written as plain data (`saorl.rollout.resume`); what is left are the tasks of
    built-in sources that draw them without a training list: the arithmetic environments'
    `Problem` (a frozen dataclass of three strings) and OpenEnv's `SeedTask` (of one int).
    """
    from saorl.envs.arithmetic import Problem
    from saorl.envs.openenv import SeedTask

    return [Problem, SeedTask]


# What the weights-only unpickler says when a file asks for an object it may not build.
_REFUSED = re.compile(
    r"GLOBAL (\S+) was not an allowed global|GLOBAL (\S+) whose module \S+ is blocked"
    r"|call reduce for unrecognized function|Can only create new object|Can only build"
    r"|TorchScript archive"
)
# Pickle instructions that import or build an object by name and that the weights-only
# unpickler does not implement (it stops at them, or at the frames of protocol 4+ before
# them, with "unsupported operand"); `torch.save` never writes them.
_OBJECT_OPS = frozenset({"STACK_GLOBAL", "INST", "OBJ", "NEWOBJ_EX", "EXT1", "EXT2", "EXT4"})


def _object_instruction(path: str | Path) -> str | None:
    """The first instruction of `_OBJECT_OPS` in the file's pickles (a static scan), if any."""
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as z:
                name = next((n for n in z.namelist() if n.endswith("data.pkl")), None)
                data = z.read(name) if name else b""
        else:  # a bare pickle, or the legacy format: several pickles, then raw storage bytes
            data = Path(path).read_bytes()
        stream = io.BytesIO(data)
        while stream.tell() < len(data):
            for op, _arg, _pos in pickletools.genops(stream):
                if op.name in _OBJECT_OPS:
                    return op.name
    except Exception:  # not (or no longer) a well-formed pickle: damage, not code
        return None
    return None


def _unsafe_in(f: Any) -> list[str]:
    """Globals of a `torch.save` file that `load_state_file` would refuse (a static scan)."""
    with torch.serialization.safe_globals(_allowed_globals()):
        return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(f))


def unsafe_globals(obj: Any) -> list[str]:
    """What in `obj` a checkpoint may not hold (empty: it loads back with `load_state_file`)."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return _unsafe_in(buf)


def load_state_file(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint or `saorl value-pretrain` file without running any code from it.

    `torch.load(weights_only=True)` builds only tensors, plain Python data and the types of
    `_allowed_globals()`; a file that asks for anything else (a pickle calling a function, an
    unknown class) raises `UnsafeCheckpointError`, an unreadable one, or one whose digest
    differs from the one written at save (`saorl.checkpoint.digest`), `DamagedCheckpointError`.
    """
    check(Path(path))
    try:
        with torch.serialization.safe_globals(_allowed_globals()), warnings.catch_warnings():
            # a file in a newer pickle protocol is refused or reported below, not warned about
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:
        text = str(e)
        refused = _REFUSED.search(text)
        what = None if refused is None else refused.group(1) or refused.group(2) or refused[0]
        if what is None and isinstance(e, pickle.UnpicklingError):
            op = _object_instruction(path)
            what = None if op is None else f"pickle instruction {op}"
        if what is not None:
            # saorl's own classes: likely a checkpoint of another saorl version
            old = " (or resume it with the saorl version that wrote it)" * what.startswith("saorl.")
            raise UnsafeCheckpointError(
                f"{path}: refused to load: it contains code or objects a saorl checkpoint must "
                f"not have ({what}); nothing from it was run. Delete it unless you know where "
                f"it came from{old}"
            ) from None
        # torch wraps the unpickler's own words in advice about weights_only=False: keep them
        inner = text.rsplit("WeightsUnpickler error:", 1)[-1].strip()
        first = inner.splitlines()[0] if inner else ""
        if len(first) > 300:  # at a word boundary, marked as cut
            first = first[:300].rsplit(" ", 1)[0] + " ..."
        raise DamagedCheckpointError(f"{path}: cannot be read ({type(e).__name__}: {first})") from e
    if not isinstance(state, dict):
        raise DamagedCheckpointError(
            f"{path}: not a saorl state file (holds a {type(state).__name__}, not a dict)"
        )
    return state


# What the `.metadata` pickle of a torch.distributed.checkpoint directory may build: DCP's own
# metadata records, torch sizes, dtypes and layouts, and the path it was saved under.
_DCP = "torch.distributed.checkpoint."
_DCP_GLOBALS = {
    *(
        (_DCP + "metadata", n)
        for n in (
            "Metadata",
            "TensorStorageMetadata",
            "TensorProperties",
            "ChunkStorageMetadata",
            "MetadataIndex",
            "StorageMeta",
            "BytesStorageMetadata",
            "_MEM_FORMAT_ENCODING",
        )
    ),
    (_DCP + "filesystem", "_StorageInfo"),
    ("torch", "Size"),
    ("torch.serialization", "_get_layout"),
    ("pathlib", "PosixPath"),
    ("pathlib", "WindowsPath"),
}
_SHARD_FILE = re.compile(r"__\d+_\d+\.distcp")


class _RefusedGlobal(Exception):
    pass


class _MetadataUnpickler(pickle.Unpickler):
    """An unpickler that builds only `_DCP_GLOBALS` and torch dtypes (DCP itself uses plain
    `pickle.load`, which would run whatever a crafted file asks for)."""

    def find_class(self, module: str, name: str) -> Any:
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) in _DCP_GLOBALS or dtype:
            return super().find_class(module, name)
        raise _RefusedGlobal(f"{module}.{name}")


def read_sharded_metadata(folder: str | Path) -> Any:
    """The `.metadata` of the torch.distributed.checkpoint directory `folder`, read without
    running code from it, and checked to describe tensors only, stored in shard files of
    `folder` that exist.

    DCP would read a non-tensor entry with `torch.load(weights_only=False)`; saorl never writes
    one (`saorl.checkpoint.dcp`), so such an entry, like a disallowed global or a storage path
    outside the directory, raises `UnsafeCheckpointError`. An unreadable file, or a shard file
    that is missing, raises `DamagedCheckpointError`.
    """
    from torch.distributed.checkpoint.metadata import Metadata, TensorStorageMetadata

    path = Path(folder) / ".metadata"

    def unsafe(what: str) -> UnsafeCheckpointError:
        return UnsafeCheckpointError(
            f"{path}: refused to load: it contains code or objects a saorl checkpoint must not "
            f"have ({what}); nothing from it was run. Delete {folder} unless you know where it "
            "came from"
        )

    try:
        with open(path, "rb") as f:
            md = _MetadataUnpickler(f).load()
        if not isinstance(md, Metadata):
            raise TypeError(f"holds a {type(md).__name__}, not DCP metadata")
        entries = dict(md.state_dict_metadata)
        storage = dict(md.storage_data or {})
    except _RefusedGlobal as e:
        raise unsafe(f"GLOBAL {e}") from None
    except Exception as e:
        raise DamagedCheckpointError(f"{path}: cannot be read ({type(e).__name__}: {e})") from e
    other = sorted(str(k) for k, v in entries.items() if not isinstance(v, TensorStorageMetadata))
    if other:
        raise unsafe(f"entries that are not tensors: {', '.join(other)[:200]}")
    from torch.distributed.checkpoint.filesystem import _StorageInfo

    files = set()
    checked = {}
    for index, info in storage.items():
        # What DCP joins to the directory is the object itself, not its str(): a forged path
        # object can print as a shard file while its parts name another folder. So only plain
        # strings pass, and DCP gets records rebuilt from the checked values.
        name = getattr(info, "relative_path", None)
        offset = getattr(info, "offset", None)
        length = getattr(info, "length", None)
        if (
            type(name) is not str
            or not _SHARD_FILE.fullmatch(name)
            or getattr(info, "transform_descriptors", None)
        ):
            raise unsafe(f"storage {str(name)[:100]!r} outside the shard files of the directory")
        if type(offset) is not int or type(length) is not int or offset < 0 or length < 0:
            raise unsafe(f"storage {name!r} with offset {offset!r} and length {length!r}")
        files.add(name)
        checked[index] = _StorageInfo(relative_path=name, offset=offset, length=length)
    md.storage_data = checked
    missing = sorted(f for f in files if not (Path(folder) / f).is_file())
    if missing:
        raise DamagedCheckpointError(f"{folder}: shard files missing: {', '.join(missing)}")
    return md


def load_latest_checkpoint(run_dir: Path, quarantine: bool = False) -> tuple[Path, dict[str, Any]]:
    """Load the newest checkpoint that reads back; fall back to older ones if it does not.

    With `quarantine`, damaged newer files are renamed `step_X.pt.damaged` (kept for a post
    mortem, never overwritten by the resumed run), a warning names each, and temporary files of
    a process killed mid-write are deleted. A file holding code or disallowed objects is never
    skipped: `UnsafeCheckpointError` stops the resume before any file is renamed or deleted.
    """
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"no checkpoint in {checkpoint_dir(run_dir)}: nothing to resume")
    if quarantine:  # it renames and deletes there, and the run goes on writing: no links
        check_dir(checkpoint_dir(run_dir), "checkpoint folder")
        for path in ckpts:
            refuse_link(path, "a checkpoint")
    errors: list[tuple[Path, str]] = []
    found: tuple[Path, dict[str, Any]] | None = None
    for path in reversed(ckpts):
        try:
            state = load_state_file(path)
        except DamagedCheckpointError as e:  # say so and try the previous one
            errors.append((path, str(e).removeprefix(f"{path}: ")))
            continue
        if "step" not in state:
            errors.append((path, "not a saorl checkpoint"))
            continue
        if "sharded" in state:  # an FSDP2 run's: the tensors are in the directory it names
            # Only its own step's directory beside it: never one a crafted file points to.
            own = path.with_suffix(".dcp").name
            if not isinstance(state["sharded"], str) or state["sharded"] != own:
                raise UnsafeCheckpointError(
                    f"{path}: refused to load: it names the shard directory "
                    f"{str(state['sharded'])[:200]!r}, not its own {own}"
                )
            shards = path.parent / str(state["sharded"])
            try:
                read_sharded_metadata(shards)
                check(shards)
            except DamagedCheckpointError as e:
                errors.append((path, f"its shards: {str(e).removeprefix(str(shards))}"))
                continue
            state["sharded"] = str(shards)  # read by saorl.checkpoint.shards.open_sharded
        found = (path, state)
        break
    if quarantine:
        for path, why in errors:
            path.rename(path.with_name(path.name + ".damaged"))
            manifest = manifest_path(path)
            if manifest.exists():  # kept with it: it says what the file should have held
                manifest.rename(manifest.with_name(manifest.name + ".damaged"))
            print(f"saorl: {path.name}: {why}; kept as {path.name}.damaged", file=sys.stderr)
        if errors and found is not None:
            step = found[1]["step"]
            why = "the newest checkpoint that reads back"
            print(f"saorl: resuming from {found[0].name} (step {step}), {why}", file=sys.stderr)
        # Temporary files of a process killed mid-write are never checkpoints, nor are the
        # directories of a step whose .pt was never written.
        _remove_leftovers(run_dir)
    if found is None:
        lines = "\n  ".join(f"{p.name}: {why}" for p, why in errors)
        raise CheckpointError(f"no loadable checkpoint in {checkpoint_dir(run_dir)}:\n  {lines}")
    return found
