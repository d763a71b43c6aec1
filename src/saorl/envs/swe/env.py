"""The coding-agent environment: fix a repository until its tests pass.

One episode: the issue text (with the tool instructions) -> model turns. A turn that calls a tool
gets the tool's output back as an observation (a turn of the trajectory, loss mask 0); a turn
that calls `submit`, or makes no call, ends the episode and the agent's changes are graded
(`grading.grade`: reward 1 only when every FAIL_TO_PASS and PASS_TO_PASS test passes).

The repository copy is made on the first tool call (an episode that never calls a tool never
touches the disk) and removed after grading, or when the environment is garbage-collected if
the agent loop ended the episode first (context or token budget).

Decisions (the issue is silent on these):
- Auto-submit: on the turn after which the agent loop would stop the episode for `max_turns`
  or `max_tool_calls`, the environment runs the call, then grades what the agent has done, as
  SWE-agent does when a budget runs out (info `submitted = "auto"`). Episodes cut by the
  context or a turn's token budget are not graded (reward 0).
- Disk: after each tool call the copy's size is checked; one that grew more than
  `max_growth_bytes` past the snapshot ends the episode (reward 0) and is deleted at once.
- Whatever the agent's calls and commands are (a NUL byte, a 200 KB command, a nest of 3000
  directories, a name that is not UTF-8, a symlink loop, a fifo), a step answers with an
  observation or a grade. A step that raises all the same (the sandbox itself failing) first
  deletes the copy.
- Grades are memoised per (task, effective changes) in this process: the same diff of the
  same task always gets the same tests run, so an episode that changed nothing, the commonest
  one for a weak policy, costs no second pytest run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from typing import Any

from saorl.envs.base import Message, StepResult
from saorl.envs.swe.grading import GradeResult, gradable, grade
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.tools import ToolRunner, check_arguments, describe, instructions, parse
from saorl.envs.swe.workspace import (
    Changes,
    ChangesTooLarge,
    collect_changes,
    copy_tree,
    display_path,
    remove_tree,
    tree_bytes,
    unified_diff,
)
from saorl.toolcalls import ToolCallError, ToolFormat

_CACHE_SIZE = 4096
_cache: OrderedDict[tuple[str, str, str, str], GradeResult] = OrderedDict()
_cache_lock = threading.Lock()
_log = logging.getLogger(__name__)


def _digest(changes: Changes) -> str:
    h = hashlib.sha256()
    for path, data in sorted(changes.items()):
        h.update(os.fsencode(path) + b"\0" + (b"-" if data is None else b"+" + data) + b"\0")
    return h.hexdigest()


def cached_grade(task: SweTask, changes: Changes, **kwargs: Any) -> GradeResult:
    """`grade`, memoised on the changes grading applies (normalised paths, protected ones, caches
    and bytecode left out), so changes that differ only in what grading ignores share a grade."""
    kept = gradable(changes, task.protected)
    env = getattr(task, "env", None)
    key = (task.key, str(task.snapshot), env.key if env else "", _digest(kept))
    with _cache_lock:
        if key in _cache:
            _cache.move_to_end(key)
            return _cache[key]
    result = grade(task, kept, **kwargs)
    with _cache_lock:
        _cache[key] = result
        while len(_cache) > _CACHE_SIZE:
            _cache.popitem(last=False)
    return result


class SweEnv:
    """One coding episode over a `SweTask`."""

    offload = True  # tool calls and grading take from 20 ms to minutes: keep decoding meanwhile

    def __init__(
        self,
        fmt: ToolFormat = "hermes",
        runner: ToolRunner | None = None,
        *,
        max_turns: int = 30,
        max_tool_calls: int = 30,
        test_timeout_s: float = 10.0,
        grade_timeout_s: float = 300.0,
        work_dir: Path | None = None,
        observation_role: str = "tool",
        max_growth_bytes: int = 1 << 30,
    ) -> None:
        self.fmt = fmt
        self.runner = runner or ToolRunner()
        self.max_turns = max_turns
        self.max_tool_calls = max_tool_calls
        self.test_timeout_s = test_timeout_s
        self.grade_timeout_s = grade_timeout_s
        self.work_parent = work_dir
        self.observation_role = observation_role
        self.task: SweTask | None = None
        self.work: Path | None = None
        self.turns = 0
        self.calls = 0
        self.tool_counts: dict[str, int] = {}
        self._finalizer: weakref.finalize | None = None
        self.max_growth = max_growth_bytes
        self._base_bytes: int | None = None

    async def reset(self, task: SweTask) -> list[Message]:
        self.task = task
        self.turns = 0
        self.calls = 0
        self.tool_counts = {}
        return [{"role": "user", "content": instructions(self.fmt) + task.prompt}]

    def _workdir(self) -> Path:
        assert self.task is not None, "step() before reset()"
        if self.work is None:
            self.work = copy_tree(self.task.base_dir(), self.work_parent)
            self._finalizer = weakref.finalize(self, remove_tree, self.work)
        return self.work

    def _over_disk_budget(self) -> bool:
        """Whether the agent's copy outgrew the snapshot by more than `max_growth` bytes (a
        shell loop writing files would otherwise fill the host's disk, one file at a time)."""
        assert self.task is not None and self.work is not None
        if self._base_bytes is None:
            self._base_bytes = tree_bytes(self.task.base_dir())
        return tree_bytes(self.work) - self._base_bytes > self.max_growth

    def _observe(self, text: str, **info: Any) -> StepResult:
        # Valid text whatever reached it (a lone surrogate would fail the tokenizer).
        text = text.encode("utf-8", errors="backslashreplace").decode("utf-8")
        if self.fmt == "code":
            text = f"\n<output>\n{text}\n</output>\n"
        obs = [{"role": self.observation_role, "content": text}]
        return StepResult(obs, info={"tool_call": True, **info})

    async def step(self, action_text: str) -> StepResult:
        try:
            return await self._step(action_text)
        except Exception:
            await asyncio.to_thread(self._cleanup)  # the episode ends here: free the disk
            raise

    async def _step(self, action_text: str) -> StepResult:
        assert self.task is not None, "step() before reset()"
        self.turns += 1
        call = parse(action_text, self.fmt)
        if call is None:
            return await self._submit("implicit")
        if isinstance(call, ToolCallError):
            result = self._observe(f"error: {call.message}", tool_status="malformed")
        elif call.name == "submit":
            return await self._submit("tool")
        elif (problem := check_arguments(call)) is not None:
            result = self._observe(f"error: {problem}", tool_status="bad_arguments")
        else:
            self.tool_counts[call.name] = self.tool_counts.get(call.name, 0) + 1
            work = await asyncio.to_thread(self._workdir)
            task_env = (self.task.env,) if self.task.env else ()  # a runner of 2 arguments too
            outcome = await asyncio.to_thread(self.runner.run, call, work, *task_env)
            result = self._observe(outcome.text, tool_status=outcome.status, **describe(call))
            if await asyncio.to_thread(self._over_disk_budget):
                await asyncio.to_thread(self._cleanup)  # free the disk now; nothing to grade
                info = {"grade_error": f"the repository copy grew past {self.max_growth} bytes"}
                return StepResult(reward=0.0, done=True, info={"submitted": "none", **info})
        self.calls += 1
        if self.turns >= self.max_turns or self.calls > self.max_tool_calls:
            return await self._submit("auto")
        return result

    async def _submit(self, how: str) -> StepResult:
        return await asyncio.to_thread(self._grade, how)

    def _grade(self, how: str) -> StepResult:
        assert self.task is not None
        task = self.task
        info: dict[str, Any] = {"submitted": how, "tool_counts": dict(self.tool_counts)}
        try:
            try:
                changes = collect_changes(task.base_dir(), self.work) if self.work else {}
            except ChangesTooLarge as e:
                return StepResult(reward=0.0, done=True, info={**info, "grade_error": str(e)})
            info["patch"] = unified_diff(task.base_dir(), changes, max_chars=8000)
            info["changed_files"] = sorted(map(display_path, changes))
            result = cached_grade(
                task,
                changes,
                test_timeout_s=self.test_timeout_s,
                wall_s=self.grade_timeout_s,
                parent=self.work_parent,
            )
        finally:
            self._cleanup()
        return StepResult(reward=float(result.resolved), done=True, info={**info, **result.info()})

    def _cleanup(self) -> None:
        work, self.work = self.work, None
        if self._finalizer is not None:
            try:
                self._finalizer()  # removes the work dir once, now
            except OSError as e:  # what could be deleted is gone; the rest is named
                _log.warning("swe env: could not fully delete %s: %s", work, e)
