"""Per-call cgroup v1 (`pids` and `memory`) that bounds a sandbox's process count and total memory.

Why cgroups and not rlimits alone: processes run as root on the project's machines and
`RLIMIT_NPROC` does not bind root (the kernel exempts uid 0 even inside a user namespace, since
the sandbox's uid maps back to it), and `RLIMIT_AS` is per process, so a fork bomb once exhausted
the host (docs/design.md section 6). A cgroup bounds the whole tree, whatever it does.

Each call gets `<own cgroup>/saorl-<uuid>` in every controller, nested under the cgroup the
calling process already lives in, so limits set on the caller (a container, a job) still apply
to its sandboxes. The child joins by writing "0" to each `tasks` file between fork and exec
(`task_files()` is what the pre-exec hook writes). Only cgroup v1 is handled: that is what these
machines have; elsewhere `probe()` reports the reason and the sandbox relies on rlimits.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
import uuid
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path

CONTROLLERS = ("pids", "memory")
_MOUNT = Path("/sys/fs/cgroup")
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CgroupSupport:
    """Where per-call cgroups can be made (controller -> parent dir), and why not, if not."""

    parents: dict[str, Path] = field(default_factory=dict)
    error: str | None = None


def _own_cgroup_dir(controller: str) -> Path | None:
    """The v1 directory of this process's own cgroup for `controller`, if mounted."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, rel = line.split(":", 2)
        if controller in names.split(","):
            for mount in (_MOUNT / controller, _MOUNT / names):
                if mount.is_dir():
                    return mount / rel.lstrip("/")
    return None


def join_tasks(task_files: tuple[str, ...]) -> None:
    """Pre-exec hook body: move the calling (forked) process into each cgroup.

    Runs between fork and exec, so it uses only raw syscalls and takes no Python-level lock.
    """
    for path in task_files:
        fd = os.open(path, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)


def probe() -> CgroupSupport:
    """Try to make, limit, join and remove a cgroup in each controller; report what works."""
    parents: dict[str, Path] = {}
    errors: list[str] = []
    for controller in CONTROLLERS:
        parent = _own_cgroup_dir(controller)
        if parent is None:
            errors.append(f"no cgroup v1 '{controller}' hierarchy mounted under {_MOUNT}")
            continue
        parents[controller] = parent
    if not parents:
        return CgroupSupport(error="; ".join(errors))
    for parent in parents.values():
        _remove_stale(parent)
    try:
        with CallCgroups(CgroupSupport(parents), memory_bytes=1 << 30, max_processes=16) as cg:
            subprocess.run(
                ["true"], check=True, preexec_fn=lambda: join_tasks(cg.task_files()), timeout=10
            )
    except (OSError, subprocess.SubprocessError) as exc:
        return CgroupSupport(error=f"cannot create or join a cgroup under {parents}: {exc}")
    return CgroupSupport(parents=parents, error="; ".join(errors) or None)


def _remove_stale(parent: Path, min_age_s: float = 60.0) -> None:
    """rmdir the empty `saorl-*` cgroups that callers killed mid-call left behind.

    Safe next to live calls: a cgroup with tasks refuses rmdir, and a call's cgroup is empty
    only for the microseconds between its mkdir and the child joining it.
    """
    now = time.time()
    for path in parent.glob("saorl-*"):
        with suppress(OSError):
            if now - path.stat().st_mtime > min_age_s:
                path.rmdir()


class CallCgroups:
    """The cgroups of one sandbox call: created with limits, swept of processes, removed."""

    def __init__(self, support: CgroupSupport, memory_bytes: int, max_processes: int) -> None:
        self.dirs: dict[str, Path] = {}
        name = f"saorl-{uuid.uuid4().hex[:16]}"
        try:
            for controller, parent in support.parents.items():
                path = parent / name
                path.mkdir()
                self.dirs[controller] = path
            if "pids" in self.dirs:
                (self.dirs["pids"] / "pids.max").write_text(str(max_processes))
            if "memory" in self.dirs:
                (self.dirs["memory"] / "memory.limit_in_bytes").write_text(str(memory_bytes))
                # where swap accounting exists, forbid escaping the limit into swap
                with suppress(OSError):
                    memsw = self.dirs["memory"] / "memory.memsw.limit_in_bytes"
                    memsw.write_text(str(memory_bytes))
        except OSError:
            self.remove()
            raise

    def __enter__(self) -> CallCgroups:
        return self

    def __exit__(self, *exc: object) -> None:
        if left := self.remove():
            _log.warning("sandbox: could not remove cgroups %s (tasks still inside)", left)

    def task_files(self) -> tuple[str, ...]:
        return tuple(str(d / "tasks") for d in self.dirs.values())

    def pids(self) -> set[int]:
        found: set[int] = set()
        for path in self.dirs.values():
            try:
                found.update(int(p) for p in (path / "cgroup.procs").read_text().split())
            except (OSError, ValueError):
                continue
        return found

    def kill_all(self, attempts: int = 200) -> bool:
        """SIGKILL every process in the cgroups until none is left; True when empty.

        Repeated because a fork bomb may fork between the listing and the kill; it converges
        since killed processes fork no more and `pids.max` bounds the newcomers.
        """
        for attempt in range(attempts):
            pids = self.pids()
            if not pids:
                return True
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    continue
            time.sleep(0.001 * min(attempt + 1, 20))
        return not self.pids()

    def stats(self) -> dict[str, int]:
        """Counters that explain a death: OOM kills and refused forks."""
        out: dict[str, int] = {}
        if "memory" in self.dirs:
            out["oom_kills"] = _counter(self.dirs["memory"] / "memory.oom_control", "oom_kill")
            out["memory_peak"] = _int(self.dirs["memory"] / "memory.max_usage_in_bytes")
        if "pids" in self.dirs:
            out["fork_refusals"] = _counter(self.dirs["pids"] / "pids.events", "max")
        return out

    def remove(self) -> list[str]:
        """Kill what is left and rmdir each cgroup; returns the paths that could not be removed."""
        left: list[str] = []
        if self.dirs:
            self.kill_all()
        for path in self.dirs.values():
            for attempt in range(50):  # a just-killed task can keep the cgroup busy briefly
                try:
                    path.rmdir()
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.002 * (attempt + 1))
                    self.kill_all(attempts=5)
            else:
                left.append(str(path))
        self.dirs = {}
        return left


def _int(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return 0


def _counter(path: Path, key: str) -> int:
    """`key`'s value in a flat `key value` file such as memory.oom_control or pids.events."""
    try:
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    except (OSError, ValueError):
        pass
    return 0
