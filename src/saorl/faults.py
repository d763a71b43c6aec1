"""Fault-injection points for the reliability tests (tests/faults/), off unless asked for.

`SAORL_FAULT=POINT@STEP` makes the process kill itself with SIGKILL (no cleanup, no `finally`,
like the OOM killer or a pre-empted node) when it reaches POINT while writing the checkpoint
of learner step STEP. Points, in the order a checkpoint write passes them:

    checkpoint_start     before anything is written
    checkpoint_partial   half of the temporary file written (a torn write)
    checkpoint_rename    temporary file complete and fsynced, not yet renamed
    checkpoint_cleanup   renamed into place, older checkpoints not yet deleted

The variable is read at each call: nothing happens at import time, and a run without it pays
one dictionary lookup per checkpoint.
"""

from __future__ import annotations

import os
import signal
from typing import IO

POINTS = ("checkpoint_start", "checkpoint_partial", "checkpoint_rename", "checkpoint_cleanup")


def armed(point: str, step: int) -> bool:
    """Whether `SAORL_FAULT` asks for a kill at `point` of step `step`."""
    return os.environ.get("SAORL_FAULT", "") == f"{point}@{step}"


def kill_if_armed(point: str, step: int, torn: IO[bytes] | None = None) -> None:
    """SIGKILL this process if armed; with `torn`, first cut that file to half its length."""
    if not armed(point, step):
        return
    if torn is not None:
        torn.flush()
        torn.truncate(torn.tell() // 2)
        torn.flush()
        os.fsync(torn.fileno())
    os.kill(os.getpid(), signal.SIGKILL)
