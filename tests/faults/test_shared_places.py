"""A shared `run.output_dir`: run folders are their owner's alone.

New run folders are created 0700 and their lock 0600; a run folder (or lock) another user made
in advance is refused, never adopted; no other user can open, hence hold, a run's lock.
"Another user" is uid 65534 (nobody): these tests need root to chown, and skip without it.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.run.lock import LOCK_FILE, RunLock, claim_fresh
from saorl.security.safe_io import UnsafePathError
from tests.faults._common import TINY_SYNC

pytestmark = pytest.mark.faults

OTHER = 65534


def _chown_or_skip(path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to make a file of another user")
    try:
        os.chown(path, OTHER, OTHER, follow_symlinks=False)
    except OSError as e:
        pytest.skip(f"chown to uid {OTHER} failed: {e}")


def test_a_new_run_folder_and_its_lock_are_the_owners_alone(tmp_path: Path):
    lock = claim_fresh(tmp_path / "runs", "r")
    try:
        assert (lock.run_dir.stat().st_mode & 0o777) == 0o700
        assert (lock.path.stat().st_mode & 0o777) == 0o600
    finally:
        lock.release()


def test_a_run_folder_made_by_another_user_is_refused(tmp_path: Path, capsys):
    out = tmp_path / "shared"
    planted = out / "r"
    planted.mkdir(parents=True)
    planted.chmod(0o777)
    victim = tmp_path / "victim"
    victim.write_text("precious")
    (planted / LOCK_FILE).symlink_to(victim)
    _chown_or_skip(planted)
    before = sorted(p.name for p in planted.iterdir())
    code = main(["train", *TINY_SYNC, "run.total_steps=1", f"run.output_dir={out}", "run.name=r"])
    err = capsys.readouterr().err
    assert code == 2 and f"belongs to user id {OTHER}" in err and "Traceback" not in err, err
    assert sorted(p.name for p in planted.iterdir()) == before and victim.read_text() == "precious"
    assert main(["train", "--resume", str(planted)]) == 2
    assert f"belongs to user id {OTHER}" in capsys.readouterr().err


def test_a_lock_file_of_another_user_is_refused(tmp_path: Path):
    run = tmp_path / "r"
    run.mkdir(mode=0o700)
    (run / LOCK_FILE).write_text("")
    _chown_or_skip(run / LOCK_FILE)
    with pytest.raises(UnsafePathError, match=f"belongs to user id {OTHER}"):
        RunLock(run).acquire()


def _open_as_other(path: Path) -> int:
    """In a child process running as uid 65534: 0 if opening `path` read-only is refused."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        code = 1
        try:
            os.setgroups([])
            os.setgid(OTHER)
            os.setuid(OTHER)
            try:
                os.close(os.open(path, os.O_RDONLY))
            except PermissionError:
                code = 0
        finally:
            os._exit(code)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])


def test_another_user_cannot_open_hence_hold_the_lock(tmp_path: Path):
    if os.geteuid() != 0:
        pytest.skip("needs root to act as another user")
    shared = Path(tempfile.mkdtemp(prefix="saorl-shared-"))  # /tmp: reachable by everyone
    try:
        shared.chmod(0o755)
        lock = claim_fresh(shared, "r")
        try:
            assert _open_as_other(lock.path) == 0
            lock.run_dir.chmod(0o755)  # a folder an older saorl made: the lock is 0600 still
            assert _open_as_other(lock.path) == 0
        finally:
            lock.release()
    finally:
        shutil.rmtree(shared)
