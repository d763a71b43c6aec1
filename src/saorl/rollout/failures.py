"""Episode failures made visible: what raised, where, and how often.

An environment's `reset`/`step` or a reward function that raises fails its episode
(`env_error`, never trained on). The rollout worker puts the message and the last frames of its
traceback in the trajectory's info (`error`, `traceback`: plain strings, so they travel back
from Ray rollout actors with the trajectory), and the batch collector (`FailureLog`) prints each
distinct message once, counts every one for `summary.json` (`errors`), and stops a run whose
first batch is mostly failures: a task that fails on most episodes is a bug in the task, and
training on the rest would hide it.
"""

from __future__ import annotations

import sys
import traceback
from typing import Any

from saorl.config import ConfigError
from saorl.types import Trajectory

TAIL_FRAMES = 4  # traceback frames kept: the user's code is at the end
MIN_FAILED = 4  # failures needed before a formed first batch can stop the run
MAX_DISTINCT = 20  # distinct messages counted by name; the rest go under one key
_MAX_LEN = 300
OTHER = "(other errors)"


def failure_info(where: str, exc: BaseException) -> dict[str, str]:
    """`{"error": "<where>: Type: message", "traceback": last frames}` for a trajectory's info.

    The frames are those of the innermost cause (`raise ... from e`): for a reward function,
    the user's own code rather than saorl's wrapper."""
    root = exc
    while root.__cause__ is not None:
        root = root.__cause__
    frames = traceback.extract_tb(root.__traceback__)[-TAIL_FRAMES:]
    tail = "".join(traceback.format_list(frames))
    tail += "".join(traceback.format_exception_only(type(root), root))
    return {"error": f"{where}: {type(exc).__name__}: {exc}"[:_MAX_LEN], "traceback": tail}


class FailureLog:
    """Counts failed episodes by message; prints each new message once, with its traceback."""

    def __init__(self, stream: Any = None) -> None:
        self.counts: dict[str, int] = {}
        self.stream = stream

    def record(self, traj: Trajectory) -> None:
        if traj.stop_reason != "env_error":
            return
        message = str(traj.info.get("error") or "env_error (no message)")[:_MAX_LEN]
        if message not in self.counts and len(self.counts) >= MAX_DISTINCT:
            message = OTHER
        if message not in self.counts:
            tail = str(traj.info.get("traceback", "")).rstrip()
            where = f" (task {traj.prompt_key})" if traj.prompt_key else ""
            print(f"saorl: episode failed{where}: {message}", file=self.stream or sys.stderr)
            if tail:
                print(_indent(tail), file=self.stream or sys.stderr, flush=True)
        self.counts[message] = self.counts.get(message, 0) + 1

    def most_common(self) -> tuple[str, int]:
        return max(self.counts.items(), key=lambda kv: kv[1], default=("", 0))

    def check_first_batch(self, failed: int, judged: int, n: int, formed: bool) -> None:
        """Stop (ConfigError, exit 2) when more than half of the episodes that reached the
        environment's verdict while the first batch formed (`judged`: failed or ended by the
        environment, not cut by a length budget) failed: checked once `n` have failed, and
        when the batch is formed if at least `min(n, MIN_FAILED)` have (one failure of one
        judged episode is no evidence). Names the most common error."""
        if failed * 2 <= judged or failed < (min(n, MIN_FAILED) if formed else n):
            return
        message, count = self.most_common()
        raise ConfigError(
            f"{failed} of the first {judged} episodes that reached the environment's verdict "
            f"failed, so the run stops before training on the rest; the most common error "
            f"({count} times): {message} (its traceback is printed above; fix the environment "
            "or the reward function)"
        )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
