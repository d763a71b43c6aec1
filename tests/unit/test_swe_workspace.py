"""Per-episode copies and the agent's diff: what counts as a change, and safe re-application."""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace

import pytest

from saorl.envs.swe.grading import is_protected
from saorl.envs.swe.workspace import (
    ChangesTooLarge,
    apply_changes,
    collect_changes,
    copy_tree,
    materialize,
    read_file,
    remove_tree,
    unified_diff,
    write_files,
)


@pytest.fixture
def base(tmp_path: Path) -> Path:
    files = {"pkg/a.py": b"x = 1\n", "pkg/b.py": b"y = 2\n", "tests/test_a.py": b"def test(): 0\n"}
    return materialize(tmp_path / "snap", lambda d: write_files(d, files))


def test_copy_then_diff(base: Path, tmp_path: Path):
    work = copy_tree(base, tmp_path / "work")
    assert collect_changes(base, work) == {}  # a copy keeps mtimes: nothing to read or report
    (work / "pkg" / "a.py").write_text("x = 10\n")
    (work / "pkg" / "b.py").unlink()
    (work / "new.txt").write_text("hi\n")
    (work / "pkg" / "__pycache__").mkdir()
    (work / "pkg" / "__pycache__" / "a.cpython-311.pyc").write_bytes(b"\0")
    (work / "evil").symlink_to("/etc/passwd")  # never carried into grading
    os.utime(work / "pkg" / "a.py")
    changes = collect_changes(base, work)
    assert changes == {"pkg/a.py": b"x = 10\n", "pkg/b.py": None, "new.txt": b"hi\n"}
    diff = unified_diff(base, changes)
    assert "-x = 1\n+x = 10\n" in diff and "+++ /dev/null" in diff and "--- /dev/null" in diff
    remove_tree(work)
    assert not work.exists()


def test_touched_but_identical_file_is_not_a_change(base: Path, tmp_path: Path):
    work = copy_tree(base, tmp_path / "work")
    (work / "pkg" / "a.py").write_text("x = 1\n")  # same bytes, new mtime
    assert collect_changes(base, work) == {}


def test_apply_changes_refuses_escapes_and_symlinked_parents(base: Path, tmp_path: Path):
    work = copy_tree(base, tmp_path / "work")
    outside = tmp_path / "outside"
    outside.mkdir()
    (work / "linkdir").symlink_to(outside)
    skipped = apply_changes(
        work,
        {
            "../escape.py": b"1",
            "/abs.py": b"1",
            "linkdir/x.py": b"1",
            "pkg": b"1",
            "pkg/a.py": b"x = 3\n",
        },
    )
    assert sorted(skipped) == ["../escape.py", "/abs.py", "linkdir/x.py", "pkg"]
    assert list(outside.iterdir()) == [] and not (tmp_path / "escape.py").exists()
    assert (work / "pkg" / "a.py").read_text() == "x = 3\n"


def test_changes_are_capped(base: Path, tmp_path: Path):
    work = copy_tree(base, tmp_path / "work")
    (work / "big.bin").write_bytes(b"\0" * 2048)
    with pytest.raises(ChangesTooLarge):
        collect_changes(base, work, max_bytes=1024)


def test_protected_paths():
    protected = ("tests/", "src/test_only_file.py")
    assert is_protected("tests/test_a.py", protected)
    assert is_protected("src/test_only_file.py", protected)
    assert is_protected("pkg/conftest.py", ())  # pytest reads these before any test runs
    assert is_protected("pytest.ini", ()) and is_protected("setup.cfg", ())
    assert not is_protected("pkg/a.py", protected)
    assert not is_protected("testsuite/x.py", protected)


def test_grade_cache_keys_on_the_changes_grading_applies(monkeypatch: pytest.MonkeyPatch):
    from saorl.envs.swe import env

    calls: list[dict] = []
    monkeypatch.setattr(env, "_cache", OrderedDict())
    monkeypatch.setattr(env, "grade", lambda task, changes, **kw: calls.append(changes) or 1)
    task = SimpleNamespace(key="t", snapshot=Path("/nonexistent/snap"), protected=("tests/",))
    plain = {"pkg/a.py": b"x = 2\n"}
    # The same edit, plus what grading ignores: an unnormalised path, bytecode, a protected
    # test file, a path escaping the tree.
    noisy = {
        "./pkg/a.py": b"x = 2\n",
        "pkg/__pycache__/a.cpython-311.pyc": b"\0",
        "tests/test_a.py": b"",
        "../escape.py": b"",
    }
    assert env.cached_grade(task, plain) == env.cached_grade(task, noisy) == 1
    assert calls == [plain]


def test_read_file_refuses_a_fifo_without_blocking(tmp_path: Path):
    fifo = tmp_path / "results.jsonl"
    os.mkfifo(fifo)
    outcome: list[object] = []
    reader = threading.Thread(target=lambda: outcome.append(_try(read_file, fifo)), daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # blocked in open(): release it, then fail
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        reader.join(5)
    assert len(outcome) == 1 and isinstance(outcome[0], OSError), outcome


def _try(func, *args):
    try:
        return func(*args)
    except OSError as e:
        return e


def test_names_that_are_not_utf8_round_trip(base: Path, tmp_path: Path):
    work = copy_tree(base, tmp_path / "work")
    (work / os.fsdecode(b"caf\xe9.py")).write_bytes(b"1\n")
    changes = collect_changes(base, work)
    assert list(changes) == [os.fsdecode(b"caf\xe9.py")]
    assert "b/caf\\xe9.py" in unified_diff(base, changes)
    grading = copy_tree(base, tmp_path / "grading")
    assert apply_changes(grading, {**changes, "nul\0.py": b"1"}) == ["nul\0.py"]
    assert (grading / os.fsdecode(b"caf\xe9.py")).read_bytes() == b"1\n"
    assert b"caf\xe9.py" in os.listdir(os.fsencode(grading))
