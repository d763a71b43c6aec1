"""One contained process tree: start it, pump its output, kill it, say how it ended.

`execute` is the whole life of one call once the backend is chosen and a concurrency slot is
held (`runner.py` does both). Both backends apply rlimits in the child before exec (CPU, address
space, file size, open files, no core dumps) and, where cgroup v1 is writable, a per-call `pids`
+ `memory` cgroup (`cgroup.py`), because root ignores RLIMIT_NPROC.

Decisions:
- `status` says how the run ended, first match wins: "timeout" (wall limit; tree killed),
  "output_limit" (output flood past `Limits.flood_bytes`; tree killed), "killed" (ended by a
  signal: out of memory, CPU limit, crash), "error" (non-zero exit), "output_limit" (exited 0
  but a stream was middle-truncated), "ok". Flags and `reason` carry the rest.
- bwrap reports a child killed by signal N as exit code 128 + N (as a shell does); such codes
  are mapped back to `returncode = -N`, subprocess's convention.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import resource
import signal
import subprocess
import time
from contextlib import ExitStack, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from saorl.sandbox import cgroup
from saorl.sandbox.bwrap import bwrap_argv, sandbox_env
from saorl.sandbox.cgroup import CallCgroups, CgroupSupport
from saorl.sandbox.output import HeadTail, Outcome, Pump, middle_truncate

Status = Literal["ok", "error", "timeout", "killed", "output_limit"]


class SandboxError(RuntimeError):
    """The sandbox itself failed (not the code it ran): a missing backend, a failed setup."""


@dataclass(frozen=True)
class Limits:
    """Resource limits of one call. Defaults suit short tool calls of a math/code agent."""

    wall_s: float = 10.0  # wall-clock limit (s); the whole process tree is killed at it
    cpu_s: int = 10  # CPU time per process (s): SIGXCPU at the limit, SIGKILL 1 s later
    memory_bytes: int = 1 << 30  # per-process address space; with cgroups, the tree's memory
    max_processes: int = 64  # processes + threads of the tree, bwrap's included (pids.max)
    file_size_bytes: int = 64 << 20  # largest writable file (bytes); also each tmpfs' size
    open_files: int = 256  # file descriptors per process
    output_bytes: int = 1 << 20  # bytes kept per stream (head + tail; the middle is dropped)
    flood_bytes: int = 256 << 20  # total output (bytes) past which the tree is killed

    def __post_init__(self) -> None:
        for f in fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"Limits.{f.name} must be > 0, got {getattr(self, f.name)!r}")
        if self.flood_bytes < self.output_bytes:
            raise ValueError("Limits.flood_bytes must be >= Limits.output_bytes; raise it")


@dataclass(frozen=True)
class ExecResult:
    """How a sandboxed command ended, with its (possibly middle-truncated) output."""

    status: Status
    returncode: int  # exit code; -N when ended by signal N
    stdout: str  # decoded as UTF-8 with errors="replace"
    stderr: str
    wall_s: float
    timed_out: bool
    stdout_truncated: bool
    stderr_truncated: bool
    reason: str  # one line explaining `status`
    backend: str

    @property
    def truncated(self) -> bool:
        return self.stdout_truncated or self.stderr_truncated

    def to_observation(self, max_chars: int = 2000) -> str:
        """The text a model sees: stdout, then stderr, then a status line unless "ok"; about
        `max_chars` in all, each stream middle-truncated so both its start and its end show."""
        status = f"[{self.status}: {self.reason}]" if self.status != "ok" else ""
        out = self.stdout.rstrip("\n")
        err = self.stderr.rstrip("\n")
        budget = max(max_chars - len(status) - 12, 0)
        err_budget = min(len(err), max(budget // 2, budget - len(out)))
        parts = []
        if out:
            parts.append(middle_truncate(out, budget - err_budget))
        if err:
            parts.append("[stderr]\n" + middle_truncate(err, err_budget))
        if status:
            parts.append(status)
        return "\n".join(parts) if parts else "[no output]"


@dataclass(frozen=True)
class Probe:
    """What detection found: the bwrap to use (and its version) and the usable cgroups."""

    bwrap: str | None
    bwrap_version: tuple[int, ...]
    bwrap_error: str | None
    cgroups: CgroupSupport


def _rlimits(limits: Limits) -> tuple[tuple[int, int, int], ...]:
    """(resource, soft, hard) triples, clamped to the caller's own hard limits."""
    wanted = [
        (resource.RLIMIT_CPU, limits.cpu_s, limits.cpu_s + 1),
        (resource.RLIMIT_AS, limits.memory_bytes, limits.memory_bytes),
        (resource.RLIMIT_FSIZE, limits.file_size_bytes, limits.file_size_bytes),
        (resource.RLIMIT_NOFILE, limits.open_files, limits.open_files),
        (resource.RLIMIT_CORE, 0, 0),
    ]
    out = []
    for res, soft_f, hard_f in wanted:
        # setrlimit takes integers only; a float limit (cpu_s=2.5) rounds up.
        soft = math.ceil(soft_f)
        hard = math.ceil(hard_f)
        cur_hard = resource.getrlimit(res)[1]
        if cur_hard != resource.RLIM_INFINITY:
            soft, hard = min(soft, cur_hard), min(hard, cur_hard)
        out.append((res, soft, hard))
    return tuple(out)


def _child_setup(task_files: tuple[str, ...], rlimits: tuple[tuple[int, int, int], ...]) -> None:
    """Between fork and exec: join the call's cgroups, then lower the rlimits.

    Only raw syscalls (no logging, no locks), so it is safe in a multi-threaded caller. If it
    raises, Popen raises in the parent and nothing runs uncontained.
    """
    cgroup.join_tasks(task_files)
    for res, soft, hard in rlimits:
        resource.setrlimit(res, (soft, hard))


def _kill_tree(proc: subprocess.Popen[bytes], cgroups: CallCgroups | None) -> None:
    """SIGKILL the process group (bwrap and its pid-namespace init: the kernel then kills every
    process in the namespace) and sweep the cgroups (setsid'd escapees of the fallback)."""
    if proc.returncode is None:  # not reaped yet, so the pid (and group) cannot be reused
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if cgroups is not None:
        cgroups.kill_all()


def _memfd(name: str, data: bytes) -> int:
    """An anonymous in-memory file holding `data`, rewound, for bwrap's `--file FD DEST`."""
    fd = os.memfd_create(f"saorl-{name}")
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def execute(
    argv: list[str],
    host_dir: Path | None,
    limits: Limits,
    stdin: bytes | None,
    backend: Literal["bwrap", "rlimit"],
    probe: Probe,
    files: dict[str, bytes] | None = None,
    ro_binds: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    rw_binds: tuple[str, ...] = (),
    network: bool = False,
    cwd: str | None = None,
    links: tuple[tuple[str, str], ...] = (),
) -> ExecResult:
    """Start, pump, kill and classify one sandboxed process tree (the slot is already held).

    `ro_binds`, `env`, `rw_binds`, `network`, `cwd` and `links` are `bwrap_argv`'s (the
    fallback sees every host path and the network anyway; it runs in `cwd` when given and
    makes no links).

    Cleanup runs in reverse order of setup whatever happens (timeouts, KeyboardInterrupt):
    kill the tree, reap bwrap, remove the cgroups, close the memfds.
    """
    out = HeadTail(limits.output_bytes)
    err = HeadTail(limits.output_bytes)
    with ExitStack() as cleanup:
        fds = {name: _memfd(name, data) for name, data in (files or {}).items()}
        for fd in fds.values():
            cleanup.callback(os.close, fd)
        if backend == "bwrap":
            assert probe.bwrap is not None
            size = limits.file_size_bytes
            cmd = bwrap_argv(
                probe.bwrap,
                probe.bwrap_version,
                argv,
                host_dir,
                size,
                fds,
                ro_binds,
                env,
                rw_binds,
                network,
                cwd,
                links,
            )
            cwd = None
            env = {}
        else:
            assert host_dir is not None, "the fallback needs a host work dir"
            env = {**sandbox_env(str(host_dir), str(host_dir)), **(env or {})}
            cmd, cwd = argv, cwd or str(host_dir)
        cgroups = None
        if probe.cgroups.parents:
            try:
                cgroups = CallCgroups(probe.cgroups, limits.memory_bytes, limits.max_processes)
            except OSError as exc:
                raise SandboxError(f"cannot create the call's cgroups: {exc}") from exc
            cleanup.enter_context(cgroups)
        tasks = cgroups.task_files() if cgroups else ()
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                cmd,
                stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=env,
                close_fds=True,
                pass_fds=tuple(fds.values()),
                start_new_session=True,
                preexec_fn=functools.partial(_child_setup, tasks, _rlimits(limits)),
            )
        except subprocess.SubprocessError as exc:
            raise SandboxError(f"sandbox child setup (cgroup join, rlimits) failed: {exc}") from exc
        except OSError as exc:  # only the fallback execs the command itself
            # E2BIG: the command line is too long (a model's 200 KB command), not bwrap's fault
            if backend == "bwrap" and exc.errno != errno.E2BIG:
                raise SandboxError(f"cannot start bwrap: {exc}") from exc
            reason = exc.strerror if exc.errno == errno.E2BIG else exc
            err.feed(f"cannot execute {argv[0][:100]!r}: {reason}\n".encode(errors="replace"))
            return exec_result(
                "error", 127, f"cannot execute: {reason}", out, err, 0.0, False, backend
            )
        cleanup.callback(proc.wait)
        cleanup.callback(_kill_tree, proc, cgroups)
        pump = Pump(proc, stdin, out, err, limits.flood_bytes)
        cleanup.callback(pump.close)
        outcome = pump.run(start + limits.wall_s)
        _kill_tree(proc, cgroups)
        pump.drain(0.5)  # the tree is dead: what is left in the pipes are its last words
        rc = proc.wait()
        wall_s = time.monotonic() - start
        stats = cgroups.stats() if cgroups else {}
    if backend == "bwrap" and 128 < rc < 128 + 65:
        rc = 128 - rc  # bwrap's 128+N for "killed by signal N"
    status, reason = _classify(outcome, rc, out.truncated or err.truncated, limits, stats)
    return exec_result(status, rc, reason, out, err, wall_s, outcome == "timeout", backend)


def exec_result(
    status: Status,
    rc: int,
    reason: str,
    out: HeadTail,
    err: HeadTail,
    wall_s: float,
    timed_out: bool,
    backend: str,
) -> ExecResult:
    return ExecResult(
        status=status,
        returncode=rc,
        stdout=out.getvalue().decode("utf-8", errors="replace"),
        stderr=err.getvalue().decode("utf-8", errors="replace"),
        wall_s=wall_s,
        timed_out=timed_out,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        reason=reason,
        backend=backend,
    )


def _classify(
    outcome: Outcome, rc: int, truncated: bool, limits: Limits, stats: dict[str, int]
) -> tuple[Status, str]:
    """(status, reason) with the precedence documented in the module docstring."""
    notes = ""
    if stats.get("oom_kills"):
        notes += f"; {stats['oom_kills']} process(es) killed at the memory limit"
        notes += f" of {limits.memory_bytes} bytes"
    if stats.get("fork_refusals"):
        notes += f"; {stats['fork_refusals']} fork(s) refused at {limits.max_processes} processes"
    if outcome == "timeout":
        return "timeout", f"wall-clock limit of {limits.wall_s:g} s reached; tree killed{notes}"
    if outcome == "flood":
        return "output_limit", f"output passed {limits.flood_bytes} bytes; tree killed{notes}"
    if rc < 0:
        try:
            name = signal.Signals(-rc).name
        except ValueError:
            name = f"signal {-rc}"
        if -rc == signal.SIGXCPU:
            name += f" (CPU time limit of {limits.cpu_s} s)"
        return "killed", f"killed by {name}{notes}"
    if rc != 0:
        return "error", f"exit code {rc}{notes}"
    if truncated:
        return "output_limit", f"output over {limits.output_bytes} bytes per stream truncated"
    return "ok", f"exit code 0{notes}"
