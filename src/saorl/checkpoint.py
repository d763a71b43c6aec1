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
import sys
from pathlib import Path
from typing import Any

import torch

from saorl.config import ConfigError
from saorl.faults import kill_if_armed

_NAME = re.compile(r"^step_(\d{8})\.pt$")


def checkpoint_dir(run_dir: Path) -> Path:
    return run_dir / "checkpoints"


def save_checkpoint(run_dir: Path, step: int, state: dict[str, Any], keep: int = 3) -> Path:
    """Write `state` atomically as the checkpoint of `step`; keep the newest `keep` files."""
    d = checkpoint_dir(run_dir)
    d.mkdir(parents=True, exist_ok=True)
    kill_if_armed("checkpoint_start", step)
    final = d / f"step_{step:08d}.pt"
    tmp = d / f".step_{step:08d}.pt.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            torch.save(state, f)
            kill_if_armed("checkpoint_partial", step, torn=f)
            f.flush()
            os.fsync(f.fileno())
        kill_if_armed("checkpoint_rename", step)
        os.replace(tmp, final)
    finally:
        tmp.unlink(missing_ok=True)
    # Make the rename itself durable before older checkpoints go away.
    dir_fd = os.open(d, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)
    kill_if_armed("checkpoint_cleanup", step)
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


class CheckpointError(ConfigError):
    """No checkpoint of the run can be loaded (reported as a bad input, exit code 2)."""


def load_latest_checkpoint(run_dir: Path, quarantine: bool = False) -> tuple[Path, dict[str, Any]]:
    """Load the newest checkpoint that reads back; fall back to older ones if it does not.

    With `quarantine`, a damaged newer file is renamed `step_X.pt.damaged` (kept for a post
    mortem, never overwritten by the resumed run) and a warning names it.
    """
    ckpts = list_checkpoints(run_dir)
    if quarantine:  # temporary files of a process killed mid-write are never checkpoints
        for tmp in checkpoint_dir(run_dir).glob(".step_*.pt.tmp.*"):
            tmp.unlink(missing_ok=True)
    if not ckpts:
        raise FileNotFoundError(f"no checkpoint in {checkpoint_dir(run_dir)}: nothing to resume")
    errors = []
    for path in reversed(ckpts):
        try:
            state = torch.load(path, map_location="cpu", weights_only=False)
        except Exception as e:  # a damaged file: say so and try the previous one
            errors.append(f"{path.name}: {type(e).__name__}: {e}")
            state = None
        if state is not None and not (isinstance(state, dict) and "step" in state):
            errors.append(f"{path.name}: not a saorl checkpoint")
            state = None
        if state is not None:
            return path, state
        if quarantine:
            path.rename(path.with_name(path.name + ".damaged"))
            print(f"saorl: {errors[-1]}; kept as {path.name}.damaged", file=sys.stderr)
    raise CheckpointError(
        f"no loadable checkpoint in {checkpoint_dir(run_dir)}:\n  " + "\n  ".join(errors)
    )
