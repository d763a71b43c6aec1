"""Digests that catch a damaged checkpoint: `checkpoints/step_X.sha256` beside each checkpoint.

torch does not check a `.pt` archive's CRCs when it loads one, so a bit flipped on storage would
load silently and be trained on. At save, `saorl.checkpoint.io.save_checkpoint` writes the
SHA-256 of the `.pt` and of every file of its `step_X.hf/` and `step_X.dcp/` directories into
`step_X.sha256` (the `sha256sum` format: `cd checkpoints && sha256sum -c step_X.sha256` checks
them by hand), after the directories are in place and before the `.pt` is renamed into place.
At load, `check` compares what is about to be read: the `.pt` (`load_state_file`), the shards
(`load_latest_checkpoint`), the Hugging Face copy (`saorl eval`). A mismatch, or a listed file
that is missing, raises `DamagedCheckpointError`, which a resume handles as it does a torn file:
set aside as `.damaged`, the previous checkpoint used. Checkpoints written before saorl wrote
digests have none and are read unchecked.
"""

from __future__ import annotations

import hashlib
import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from saorl.config import ConfigError


class CheckpointError(ConfigError):
    """A checkpoint or saved state file that cannot be used (a bad input, exit code 2)."""


class DamagedCheckpointError(CheckpointError):
    """A state file that does not read back (torn write, truncated, garbage, not a dict, a
    digest that differs from the one written at save)."""


SUFFIX = ".sha256"


def manifest_path(ckpt: Path) -> Path:
    """The digest file of checkpoint `ckpt` (`step_X.pt`, or its `.hf` / `.dcp` directory)."""
    return Path(ckpt).with_suffix(SUFFIX)


def file_digest(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def _digests(root: Path, names: list[str]) -> dict[str, str]:
    # hashlib releases the GIL on large buffers: shard files hash in parallel
    with ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1)) as ex:
        return dict(zip(names, ex.map(lambda n: file_digest(root / n), names), strict=True))


def write_manifest(ckpt: Path, pt_file: Path) -> Path:
    """Write the digest file of checkpoint `ckpt`, whose `.pt` is still at `pt_file` (its
    temporary name), covering the `.pt` and the files of its companion directories."""
    root = ckpt.parent
    names = [
        str(p.relative_to(root))
        for suffix in (".hf", ".dcp")
        for p in sorted(ckpt.with_suffix(suffix).rglob("*"))
        if p.is_file()
    ]
    entries = {ckpt.name: file_digest(pt_file), **_digests(root, names)}
    out = manifest_path(ckpt)
    from saorl.security.safe_io import write_atomic

    write_atomic(out, "".join(f"{digest}  {name}\n" for name, digest in entries.items()))
    return out


def _read_manifest(path: Path) -> dict[str, str]:
    entries = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        digest, _, name = line.partition("  ")
        if name:
            entries[name] = digest
    return entries


def check(path: Path) -> None:
    """Compare checkpoint file or directory `path` with the digests written at save (nothing
    to compare if there are none); `DamagedCheckpointError` naming the first file that differs."""

    path = Path(path)
    manifest = manifest_path(path)
    if not manifest.is_file():
        return
    try:
        entries = _read_manifest(manifest)
    except (OSError, UnicodeDecodeError) as e:
        why = f"its digest file {manifest.name} cannot be read ({e})"
        raise DamagedCheckpointError(f"{path}: {why}") from e
    root = path.parent
    prefix = path.name + "/"
    wanted = {n: d for n, d in entries.items() if n == path.name or n.startswith(prefix)}
    missing = [n for n in wanted if not (root / n).is_file()]
    if missing:
        why = f"files listed in {manifest.name} are missing: {', '.join(missing)[:200]}"
        raise DamagedCheckpointError(f"{path}: {why}")
    got = _digests(root, list(wanted))
    for name, digest in wanted.items():
        if got[name] != digest:
            raise DamagedCheckpointError(
                f"{root / name}: damaged: its SHA-256 ({got[name][:16]}...) differs from the "
                f"one written at save ({digest[:16]}..., in {manifest.name})"
            )
