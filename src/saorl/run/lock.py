"""One writer per run folder: an exclusive lock for a run's lifetime, and an atomic fresh folder.

`saorl train` takes `RUN/.saorl.lock` with `fcntl.flock(LOCK_EX | LOCK_NB)` before it writes
anything in RUN and holds it until it ends. The kernel drops a flock when its process ends in any
way (exit, exception, SIGKILL, the OOM killer), so a lock is never left held by a dead process.
The file holds the holder's PID, host and start time: a second writer (`saorl train` on the same
`run.name`, `--resume` of a run still training) is refused with `RunLockedError` naming them
(exit 2), and a file whose lock is free but which still holds a holder (a clean exit empties it)
was left by a writer that died: that is reported, then the lock is taken over.

A new run claims its folder atomically (`claim_fresh`): `mkdir`, then the lock, then a check,
under the lock, that no run lives there; of two starters only one gets a folder. Readers
(`saorl eval`, `saorl report`) never lock. The lock is as reliable as the filesystem's locks
(local disks; NFS emulates flock with its byte-range locks). A child process forked without
exec holds the lock too until it ends (saorl's own children are started with exec).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import socket
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from saorl.config import Config, ConfigError, config_to_toml
from saorl.security.safe_io import check_dir, check_owned_file, refuse_link

LOCK_FILE = ".saorl.lock"

# The run folder most recently claimed by this process (for messages after a failure).
last_claimed: Path | None = None


class RunLockedError(ConfigError):
    """Another live process writes this run folder (exit code 2)."""

    keep_run = True  # the folder is the other process's: a failed start must not remove it


class RunLock:
    """The exclusive lock on a run folder (module doc)."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = Path(run_dir)
        self.path = self.run_dir / LOCK_FILE
        self._fd: int | None = None

    def acquire(self) -> str | None:
        """Take the lock or raise `RunLockedError`; a description of a dead holder it replaces
        (None if the last one released it)."""
        # Only the owner can open the lock (0600, in a 0700 folder): no other user can hold it.
        check_dir(self.run_dir)
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        except OSError:
            refuse_link(self.path, "a lock")
            raise
        try:
            check_owned_file(self.path, fd)
            os.fchmod(fd, 0o600)  # a lock file of an older saorl was 0644
        except BaseException:
            os.close(fd)
            raise
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise RunLockedError(
                f"{self.run_dir} is being written by another saorl train ({holder}); one run "
                "folder has one writer: wait for it to end, stop it (kill -TERM saves a "
                "checkpoint), or pick another run.name"
            ) from None
        stale = _read(fd)
        started = time.strftime("%Y-%m-%dT%H:%M:%S%z")
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": started}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        os.fsync(fd)
        self._fd = fd
        return _describe(stale) if stale else None

    def release(self) -> None:
        """Empty the file (a clean end) and drop the lock; safe to call twice."""
        if self._fd is None:
            return
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the only descriptor drops the flock
        self._fd = None


def _read(fd: int) -> dict | None:
    try:
        data = os.pread(fd, 4096, 0)
        return json.loads(data) if data.strip() else None
    except (OSError, ValueError):
        return {"pid": "?", "host": "?", "started": "?"}  # unreadable: still someone's


def _describe(holder: dict | None) -> str:
    if not holder:
        return "PID unknown"
    return f"PID {holder.get('pid')} on host {holder.get('host')}, since {holder.get('started')}"


def holds_run(run_dir: Path) -> bool:
    """Whether `run_dir` holds a run (metrics or checkpoints): a new run goes elsewhere."""
    return (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists()


def _took(lock: RunLock, stale: str | None) -> None:
    global last_claimed
    if stale:
        print(
            f"saorl: {lock.run_dir}: the previous writer ({stale}) ended without releasing its "
            "lock (killed or crashed); taking it over",
            file=sys.stderr,
        )
    last_claimed = lock.run_dir


@contextlib.contextmanager
def claim_run_dir(output_dir: Path, name: str, resume: str | None) -> Iterator[Path]:
    """The run folder this run writes, locked for the `with` block: `resume`, or a fresh one
    (`output_dir/name`, or `name-1`, `name-2`, ... if a run already lives there)."""
    if resume:
        lock = RunLock(check_dir(resume))
        _took(lock, lock.acquire())
    else:
        lock = claim_fresh(Path(output_dir), name)
    try:
        yield lock.run_dir
    finally:
        lock.release()


def claim_fresh(output_dir: Path, name: str) -> RunLock:
    """Lock a folder for a new run (module doc): a new run never appends to another run's
    metrics or mixes its checkpoints with them; continuing one is what `--resume` is for. A
    folder being written by a live run refuses the start (`RunLockedError`)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    i = 0
    while True:
        run_dir = output_dir / (f"{name}-{i}" if i else name)
        with contextlib.suppress(FileExistsError):
            run_dir.mkdir(0o700)  # the run's checkpoints and samples are its owner's alone
        lock = RunLock(check_dir(run_dir))  # a folder another user made in advance is refused
        stale = lock.acquire()  # raises if a live run holds it
        if not holds_run(run_dir):
            _took(lock, stale)
            break
        lock.release()
        i += 1
    if i:
        print(
            f"saorl: {output_dir / name} holds an earlier run (continue it with --resume); "
            f"this run writes to {run_dir}",
            file=sys.stderr,
        )
    return lock


def resume_hint(ray_address: str = "") -> str:
    """Where a run that failed goes on from (after a dead Ray actor, say). A run that joined
    the Ray cluster `ray_address` resumes on a cluster given again (it may be a new one: the
    saved address is not trusted on its own, `saorl.security.trust`)."""
    run = last_claimed
    again = " --ray-address ADDRESS (a running cluster's, e.g. auto)" if ray_address else ""
    go_on = f"resume with: saorl train --resume {run}{again}" if run else "start the run again"
    return f"the checkpoints written so far are intact; {go_on}"


def entries(folder: Path) -> set[str] | None:
    """The names in `folder` (None: it does not exist)."""
    try:
        return {p.name for p in folder.iterdir()}
    except OSError:
        return None


def remove_failed_run(cfg: Config, output_dir: Path, before: set[str] | None) -> None:
    """Remove the run directory a new run created before a bad input stopped it.

    A run stopped by a bad input (exit code 2) trained nothing; leaving its directory would
    make the next attempt write to `NAME-1`. Only a directory that was not there before, is
    named like this run (`NAME` or `NAME-<n>`) and holds this run's own config.toml is removed;
    so is `output_dir` itself when this run created it and it is empty again.
    """
    name = re.compile(rf"{re.escape(cfg.run.name)}(-\d+)?")
    for new in sorted((entries(output_dir) or set()) - (before or set())):
        run_dir = output_dir / new
        saved = run_dir / "config.toml"
        if not (name.fullmatch(new) and run_dir.is_dir() and not run_dir.is_symlink()):
            continue
        try:
            ours = not saved.exists() or _same_run(saved.read_text(), config_to_toml(cfg))
        except (OSError, UnicodeDecodeError):
            ours = False
        if ours:
            shutil.rmtree(run_dir, ignore_errors=True)
    if before is None and entries(output_dir) == set():
        output_dir.rmdir()


def _same_run(saved: str, ours: str) -> bool:
    """Whether a run folder's config.toml is `ours`, but for the held-out count the run
    records there (`saorl.envs.factory.recorded_env`)."""

    def drop(text: str) -> list[str]:
        return [line for line in text.splitlines() if not line.startswith("eval_size = ")]

    return drop(saved) == drop(ours)
