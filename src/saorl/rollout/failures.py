"""Episode failures made visible: what raised, where in the user's code, and how often.

An environment's `reset`/`step`, a reward function or an agent program that raises fails its
episode (`env_error`, never trained on). The rollout worker puts the message, the user's frames
of its traceback (saorl's own frames trimmed), the group it counts in and what failed in the
trajectory's info (`error`, `traceback`, `error_group`, `error_source`: plain strings, so they
travel back from Ray rollout actors with the trajectory). Failures are grouped by exception
type and location, the file:line of the innermost user frame (`step: KeyError at
rewards.py:12`), never by message text: the same bug on different inputs is one group. The
batch collector (`FailureLog`) prints the first failure of each group with its traceback,
counts every one for `summary.json` (`errors`, by group), and stops a run whose first batch is
mostly failures: a task that fails on most episodes is a bug in the task, and training on the
rest would hide it. Later failures fail their own episodes and the run goes on.
"""

from __future__ import annotations

import os
import sys
import sysconfig
import traceback
from pathlib import Path
from typing import Any

from saorl.config import ConfigError
from saorl.types import Trajectory

TAIL_FRAMES = 4  # frames kept when none is the user's (a failure inside saorl itself)
USER_FRAMES = 8  # the user's frames kept, innermost last
MIN_FAILED = 4  # failures needed before a formed first batch can stop the run
MAX_DISTINCT = 20  # distinct groups counted by name; the rest go under one key
_MAX_LEN = 300
OTHER = "(other errors)"
_SAORL = str(Path(__file__).resolve().parents[1]) + os.sep
_LIBS = tuple(
    {str(Path(p).resolve()) + os.sep for k, p in sysconfig.get_paths().items() if "lib" in k}
)
# Modules whose frames in a failure's traceback mean a tool failed (the env's tools).
_TOOL_MODULES = ("function_tools.py", "openenv_tools.py")
# What failed -> what to fix, for the message that stops a run.
ADVICE = {
    "agent": "fix the agent program (env.agent.function / env.agent.command)",
    "reward function": "fix the reward function (env.reward_fns)",
    "tool": "fix the tool (env.tools)",
    "environment": "fix the environment (env.name)",
}


def _origin(filename: str) -> str:
    """'saorl', 'library' (the standard library, installed packages) or 'user'."""
    if filename.startswith("<"):  # <frozen ...>, <string>
        return "library"
    path = str(Path(filename).resolve())
    if path.startswith(_SAORL):
        return "saorl"
    installed = f"{os.sep}site-packages{os.sep}" in path or f"{os.sep}dist-packages{os.sep}" in path
    return "library" if installed or path.startswith(_LIBS) else "user"


def _short(filename: str) -> str:
    """`filename` relative to the current folder when it is inside it."""
    try:
        return str(Path(filename).resolve().relative_to(Path.cwd()))
    except ValueError:
        return filename


def failure_info(where: str, exc: BaseException) -> dict[str, str]:
    """A failed episode's info: `error` ("<where>: Type: message"), `traceback` (the user's
    frames), `error_group` ("<where>: Type at file:line") and `error_source` (what failed:
    a key of `ADVICE`).

    The frames are those of the innermost cause (`raise ... from e`): for a reward function,
    the user's own code rather than saorl's wrapper. The location is the innermost frame of
    the user's code (neither saorl's, the standard library's nor an installed package's),
    else the innermost frame outside saorl, else the innermost one."""
    chain = [exc]
    root = exc
    while root.__cause__ is not None and len(chain) < 20:
        root = root.__cause__
        chain.append(root)
    frames = traceback.extract_tb(root.__traceback__)
    origins = [_origin(f.filename) for f in frames]
    users = [i for i, o in enumerate(origins) if o == "user"]
    outside = [i for i, o in enumerate(origins) if o != "saorl"]
    site_at = (users or outside or [len(frames) - 1])[-1]
    if users:  # the user's frames, then where a library below them raised (at most 2)
        shown = [frames[i] for i in users[-USER_FRAMES:]]
        shown += [
            f
            for f, o in zip(frames[site_at + 1 :], origins[site_at + 1 :], strict=True)
            if o != "saorl"
        ][-2:]
    else:
        shown = list(frames[-TAIL_FRAMES:])
    tail = "".join(traceback.format_list(shown))
    tail += "".join(traceback.format_exception_only(type(root), root))
    info = {"error": f"{where}: {type(exc).__name__}: {exc}"[:_MAX_LEN], "traceback": tail}
    if frames:
        site = frames[site_at]
        info["error_group"] = (
            f"{where}: {type(root).__name__} at {_short(site.filename)}:{site.lineno}"
        )
    info["error_source"] = _source(where, chain, frames)
    return info


def _source(where: str, chain: list[BaseException], frames: Any) -> str:
    if where == "agent":
        return "agent"
    if any(type(e).__name__ == "RewardFunctionError" for e in chain):
        return "reward function"
    if any(f.filename.endswith(_TOOL_MODULES) for f in frames):
        return "tool"
    return "environment"


class FailureLog:
    """Counts failed episodes by group (type and location); prints the first of each group
    with its traceback."""

    def __init__(self, stream: Any = None) -> None:
        self.counts: dict[str, int] = {}
        self.first: dict[str, tuple[str, str]] = {}  # group -> (its first message, source)
        self.stream = stream

    def record(self, traj: Trajectory) -> None:
        if traj.stop_reason != "env_error":
            return
        message = str(traj.info.get("error") or "env_error (no message)")[:_MAX_LEN]
        group = str(traj.info.get("error_group") or message)[:_MAX_LEN]
        if group not in self.counts and len(self.counts) >= MAX_DISTINCT:
            group = OTHER
        if group not in self.counts:
            source = str(traj.info.get("error_source") or "")
            if source not in ADVICE:
                source = "agent" if message.startswith("agent:") else "environment"
            self.first[group] = (message, source)
            tail = str(traj.info.get("traceback", "")).rstrip()
            out = self.stream or sys.stderr
            where = f" (task {traj.prompt_key})" if traj.prompt_key else ""
            print(f"saorl: episode failed{where}: {message}", file=out)
            if tail:
                print(_indent(tail), file=out)
            print(
                f"    (the {source} failed; later failures at the same place are counted, "
                "not printed)",
                file=out,
                flush=True,
            )
        self.counts[group] = self.counts.get(group, 0) + 1

    def most_common(self) -> tuple[str, int]:
        return max(self.counts.items(), key=lambda kv: kv[1], default=("", 0))

    def check_first_batch(self, failed: int, judged: int, n: int, formed: bool) -> None:
        """Stop (ConfigError, exit 2) when more than half of the episodes that reached the
        environment's verdict while the first batch formed (`judged`: failed or ended by the
        environment, not cut by a length budget) failed: checked once `n` have failed, and
        when the batch is formed if at least `min(n, MIN_FAILED)` have (one failure of one
        judged episode is no evidence). Names the most common group, its first message and
        what to fix."""
        if failed * 2 <= judged or failed < (min(n, MIN_FAILED) if formed else n):
            return
        group, count = self.most_common()
        message, source = self.first.get(group, (group, "environment"))
        raise ConfigError(
            f"{failed} of the first {judged} episodes that reached the environment's verdict "
            f"failed, so the run stops before training on the rest; the most common error "
            f"({count} times, {group}): {message} (its traceback is printed above; "
            f"{ADVICE[source]})"
        )


def _indent(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())
