"""The processes of command agents (`env.agent.command`, docs/agents.md): bounded and never left
behind.

- At most `rollout.max_agent_processes` programs run at once in this process (0: twice its
  cores); an episode whose program has no slot waits for one. A program is often a fresh Python
  that spends a second importing its SDK: dozens started at once on a few cores take minutes
  each, time out, and are started again.
- Each runs in a process group of its own (`start_new_session`), and the whole group is killed
  when its episode ends (whatever the program left running), when it is cancelled (a timeout,
  the run stopping), when its rollout worker stops (`kill_groups`) and, for anything left, when
  this process exits (`atexit`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import os
import signal
import threading
from typing import Any

_lock = threading.Lock()
_max = 0  # 0 until set: twice the cores
_alive: dict[int, Any] = {}  # process group id -> the event loop that started it
_taken = 0  # slots held: programs alive or starting
_waiting = 0  # episodes waiting for a slot
POLL_S = 0.02  # how often a waiting episode looks for a free slot


def default_max_processes() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return 2 * (cores or 1)


def set_max_processes(n: int) -> None:
    """The cap of this process (`rollout.max_agent_processes`; 0 = twice the cores)."""
    global _max
    _max = n if n > 0 else default_max_processes()


def max_processes() -> int:
    return _max or default_max_processes()


def _take() -> bool:
    global _taken
    with _lock:
        if _taken >= max_processes():
            return False
        _taken += 1
        return True


def _give() -> None:
    global _taken
    with _lock:
        _taken -= 1


async def _acquire() -> None:
    # Polled, not an asyncio primitive: the episodes of every rollout worker of this process
    # share the slots, each worker on an event loop of its own.
    global _waiting
    with _lock:
        _waiting += 1
    try:
        while not _take():
            await asyncio.sleep(POLL_S)
    finally:
        with _lock:
            _waiting -= 1


def _kill(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def run(command: str, stdin: bytes, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run `command` (a shell command line) with `stdin`: `(exit code, stdout, stderr)`."""
    await _acquire()
    starting = asyncio.ensure_future(
        asyncio.create_subprocess_shell(
            command,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=env,
            start_new_session=True,  # its own process group: killed whole
        )
    )
    try:
        proc = await asyncio.shield(starting)
    except BaseException:
        # Cancelled while it starts (the run stops): asyncio would kill the shell alone once
        # it exists and leave the program it started; its whole group goes instead.
        starting.add_done_callback(_kill_started)
        _give()
        raise
    with _lock:
        _alive[proc.pid] = asyncio.get_running_loop()
    try:
        out, err = await proc.communicate(stdin)
    finally:
        # Ended, timed out or cancelled: what it started goes with it.
        _kill(proc.pid)
        if proc.returncode is None:
            await proc.wait()  # reaped on this loop, not by a transport's finaliser later
        with _lock:
            _alive.pop(proc.pid, None)
        _give()
    return proc.returncode, out, err


def _kill_started(starting: asyncio.Future) -> None:
    if not starting.cancelled() and starting.exception() is None:
        _kill(starting.result().pid)


def kill_groups(loop: Any = None) -> int:
    """Kill the process groups of the programs started on `loop` (None: all of them); how many.
    Their episodes' coroutines reap them when their loop next runs."""
    with _lock:
        groups = [g for g, lp in _alive.items() if loop is None or lp is loop]
    for g in groups:
        _kill(g)
    return len(groups)


def status(loop: Any = None) -> str:
    """How many programs run (started on `loop`; None: in this process), how many episodes of
    this process wait for a slot."""
    with _lock:
        running = sum(1 for lp in _alive.values() if loop is None or lp is loop)
        waiting = _waiting
        cap = max_processes()
    text = f"{running} agent processes running (at most {cap} at once)"
    return text + (f", {waiting} episodes waiting for one" if waiting else "")


atexit.register(kill_groups)
