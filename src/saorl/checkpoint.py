"""Atomic checkpoints and resume.

A checkpoint is one file `checkpoints/step_XXXXXXXX.pt` holding everything needed to continue:
policy and critic weights, both optimizers, the learner's step and version counters, RNG states
and the data position. It is written to a temporary file in the same directory, fsynced, then
renamed over the final name, so a crash leaves either the previous checkpoint or the new one as
the latest, never half a file. Older checkpoints are deleted only after a newer one is in place.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep` files."""
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    final = d / f"step_{step:08d}.pt"
    tmp = d / f".step_{step:08d}.pt.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    # Make the rename itself durable before older checkpoints go away.
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    for old in list_checkpoints(run_dir)[:-keep] if keep > 0 else []:
        old.unlink(missing_ok=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Finished checkpoint files, oldest first (temporary files are ignored)."""
    d = checkpoint_dir(run_dir)
    if not d.is_dir():
        return []
    found = [p for p in d.iterdir() if _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


def load_latest_checkpoint(run_dir: Path) -> tuple[Path, dict[str, Any]]:
    """Load the newest checkpoint that reads back; fall back to older ones if it does not."""
    ckpts = list_checkpoints(run_dir)
    if not ckpts:
        raise FileNotFoundError(f"no checkpoint in {checkpoint_dir(run_dir)}: nothing to resume")
    errors = []
    for path in reversed(ckpts):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a damaged file: say so and try the previous one
            errors.append(f"{path.name}: {type(e).__name__}: {e}")
            continue
        if not isinstance(state, dict) or "step" not in state:
            errors.append(f"{path.name}: not a saorl checkpoint")
            continue
        return path, state
    raise RuntimeError(
        f"no loadable checkpoint in {checkpoint_dir(run_dir)}:\n  " + "\n  ".join(errors)
    )
