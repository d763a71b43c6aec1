"""SWE-bench-style grading: run FAIL_TO_PASS and PASS_TO_PASS tests on the agent's final diff.

    result = grade(task, changes)        # changes: collect_changes(snapshot, episode work dir)
    result.resolved                      # every FAIL_TO_PASS and PASS_TO_PASS test passed

A grade builds a fresh copy of the task's snapshot on the host, then:
1. applies the task's `test_patch` (SWE-bench: the tests that check the fix) with `git apply`;
2. picks the pytest config file pytest itself would use in that copy (`pytest_config_file`);
3. applies the agent's changes, except to *protected* paths: the task's own test files
   (`task.protected`: `tests/` of a generated task, the files a SWE-bench `test_patch` touches
   and those its test ids name), that config file, and, anywhere, `conftest.py` and the usual
   config names (`INFRASTRUCTURE`). Paths are normalised first (`a/../conftest.py` is
   `conftest.py`); caches and bytecode (`__pycache__`, `*.pyc`) are never applied;
4. packs the copy into a tar and deletes it; `pytest_runner.py` unpacks it inside the sandbox
   into a tmpfs sized to the repository plus `disk_bytes`, and runs the wanted ids with a
   per-test alarm and an outer wall-clock limit. A test that never reports is "timeout" when the
   run hit that limit, else "missing". A test counts as passing when its status is "passed",
   or the xfail, xpass or skip its gold run also showed (`outcomes.py`); canary tests whose
   outcomes only the grader knows run beside the task's, and a run that misreports one gets 0.

What this defends (tests/faults/test_grading_integrity.py tries each):
- Deleting, editing or shadowing a task's test, or adding/editing a `conftest.py` anywhere: the
  snapshot's files are restored, and a conftest the snapshot lacks never exists in the copy.
- Every config source pytest reads at start-up: `-c` names the task's own config file, or an
  empty one, so no other `pytest.ini`, `.pytest.ini`, `pytest.toml`, `.pytest.toml`,
  `pyproject.toml`, `tox.ini` or `setup.cfg` anywhere is read; `PYTEST_*` variables are
  cleared; plugin auto-loading is off and only the environment's plugins (SWE-bench tasks,
  `plugin_autoload`: every `pytest11` entry point in the interpreter's site-packages; with a
  per-task environment, those its build recorded, the project's own left out) load by name,
  looked up on the interpreter's own path, where no `*.dist-info` of the repository is.
- Interpreter start-up: `python -I` keeps the repository off `sys.path` until plugins are
  loaded, so its `pytest.py`, `_pytest/`, `sitecustomize.py`, `usercustomize.py` or `*.pth` do
  not run at start-up; forged bytecode is never read (an empty `sys.pycache_prefix`).
- Forged results: outcomes travel on a pipe, each line tagged with a per-run random nonce that
  only the runner's memory holds; what the tested code prints, writes to that pipe or to any
  file (now, from a subprocess, or at exit) is ignored.
- Disk: the tested code writes only into the sandbox's tmpfs mounts (the repository's, /tmp,
  /dev/shm; each sized to the repository plus `disk_bytes`, all charged to the call's memory
  cgroup), never to the host disk. A test that writes past that fails with ENOSPC (or the run
  is killed at the memory limit and its unreported tests are "missing").

What it does not defend:
- Code under test runs inside the pytest process: the package being fixed, every module the
  tests import from the repository (files of the test tree that the task does not protect, and
  modules in the repository root, which shadow installed ones of the same name once the root
  is on `sys.path`), and the modules that the task's own config or conftests load. Such code
  can monkeypatch pytest or the runner (rewrite reports, disarm the alarm), or read the nonce
  from the runner's memory (in-process, or through /proc from a process it starts) and emit
  records of its own. No check inside the process that runs the code can rule that out;
  SWE-bench's harness has the same limit. The canaries (`outcomes.py`) catch tampering that
  rewrites reports wholesale (every test passed), not one aimed at the task's own test ids.
- The task's own config file and conftests are trusted as the snapshot and `test_patch` leave
  them.
- Under the sandbox's "rlimit" fallback (no bubblewrap) nothing is isolated: the tmpfs is a
  host temporary directory and the disk bound does not hold. Without a memory cgroup the
  tmpfs mounts are bounded only by their sizes (three times the repository plus `disk_bytes`).
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import os
import secrets
import sys
import tarfile
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saorl.envs.swe.git import git
from saorl.envs.swe.outcomes import PASSING, add_canaries, check_canaries, counts_as_passing
from saorl.envs.swe.task import TaskEnv
from saorl.envs.swe.workspace import (
    SKIP_DIRS,
    SKIP_SUFFIXES,
    Changes,
    apply_changes,
    copy_tree,
    parents_are_dirs,
    remove_tree,
    safe_relpath,
)
from saorl.sandbox import ExecResult, Limits, middle_truncate, run

INFRASTRUCTURE = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})
# Where pytest looks for its config, in its order (pytest's own list is used when it has one).
CONFIG_NAMES = (
    "pytest.toml",
    ".pytest.toml",
    "pytest.ini",
    ".pytest.ini",
    "pyproject.toml",
    "tox.ini",
    "setup.cfg",
)
GRADE_DISK_BYTES = 256 << 20  # what the tests of one grade may write, beyond the repository
GRADE_MEMORY_BYTES = 1 << 30  # memory of the test process, beyond what the tmpfs mounts hold
RESULTS_BYTES = 16 << 20  # result lines kept per run (a few hundred bytes per test)
_PAGE = 4096


@dataclass(frozen=True)
class TestRun:
    """Per-test statuses and messages of one sandboxed pytest run."""

    statuses: dict[str, str]
    messages: dict[str, str]
    exec_status: str  # the sandbox's status of the whole run ("ok", "error", "timeout", ...)
    log: str  # pytest's own output, middle-truncated
    tampered: str = ""  # why the run's reports are not trusted (a canary misreported), or ''

    def passed(self, test_id: str) -> bool:
        return self.statuses.get(test_id) in PASSING


@dataclass
class GradeResult:
    resolved: bool
    fail_to_pass: dict[str, str] = field(default_factory=dict)  # id -> status
    pass_to_pass: dict[str, str] = field(default_factory=dict)
    messages: dict[str, str] = field(default_factory=dict)  # id -> failure message
    error: str = ""  # why nothing could be graded (a patch that does not apply, ...)
    log: str = ""
    gold: dict[str, str] = field(default_factory=dict)  # tolerated gold outcomes (TOLERATED)

    def passing(self, statuses: dict[str, str]) -> int:
        return sum(counts_as_passing(s, self.gold.get(t)) for t, s in statuses.items())

    def info(self) -> dict[str, Any]:
        """The flat record that goes into the trajectory's info."""
        f2p = self.fail_to_pass
        p2p = self.pass_to_pass
        return {
            "resolved": self.resolved,
            "fail_to_pass_passed": self.passing(f2p),
            "fail_to_pass_total": len(f2p),
            "pass_to_pass_passed": self.passing(p2p),
            "pass_to_pass_total": len(p2p),
            "tests": {**f2p, **p2p},
            "test_messages": {k: v for k, v in self.messages.items() if v},
            **({"grade_error": self.error} if self.error else {}),
        }


@functools.cache
def runner_source() -> str:
    return (Path(__file__).with_name("pytest_runner.py")).read_text(encoding="utf-8")


def check_pytest() -> None:
    """Raise with the fix when the interpreter the sandbox runs has no pytest."""
    import importlib.util

    if importlib.util.find_spec("pytest") is None:
        raise RuntimeError(
            f"env 'swe' runs tests with pytest, which {sys.executable} cannot import; install "
            "it in this environment (pip install pytest, or the '.[dev]' extra)"
        )


@functools.cache
def installed_plugins() -> tuple[str, ...]:
    """Names of the `pytest11` entry points installed in this interpreter's site-packages: what
    pytest's auto-loading would load, minus anything a repository on `sys.path` could add."""
    import importlib.metadata
    import site

    names = set()
    for dist in importlib.metadata.distributions(path=site.getsitepackages()):
        names.update(ep.name for ep in dist.entry_points if ep.group == "pytest11")
    return tuple(sorted(names))


def pytest_config_file(root: Path, test_ids: Iterable[str]) -> list[str]:
    """The config file pytest would use under `root` for `test_ids`, as paths relative to
    `root` ([] for none; the file, then a symlink's target): pytest's own search, from the test
    files' common directory up, stopped at `root`."""
    from _pytest.config import findpaths

    names = tuple(getattr(findpaths, "CONFIG_LOADERS_BY_NAME", None) or CONFIG_NAMES)
    dirs = [p.split("/")[:-1] for t in test_ids if (p := safe_relpath(t.split("::")[0]))]
    common = dirs[0] if dirs else []
    for parts in dirs[1:]:
        n = 0
        while n < min(len(common), len(parts)) and common[n] == parts[n]:
            n += 1
        common = common[:n]
    real_root = root.resolve()
    for depth in range(len(common), -1, -1):
        base = root.joinpath(*common[:depth])
        if depth and not parents_are_dirs(root, "/".join([*common[:depth], "x"])):
            continue  # a directory link (`up -> ../..`): never read host files through it
        for name in names:
            path = base / name
            if not path.is_file():
                continue
            try:
                found = findpaths.load_config_dict_from_file(path) is not None
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException:  # a broken file: pytest stops at it too, and so does the run
                found = True
            if found:
                rel = [path.relative_to(root).as_posix()]
                target = path.resolve()
                if path.is_symlink() and target.is_relative_to(real_root):
                    rel.append(target.relative_to(real_root).as_posix())
                return rel
    return []


def is_protected(rel: str, protected: tuple[str, ...]) -> bool:
    """Whether grading keeps the snapshot's version of `rel` (see the module docstring)."""
    if rel.rsplit("/", 1)[-1] in INFRASTRUCTURE:
        return True
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in protected)


def gradable(changes: Changes, protected: tuple[str, ...]) -> Changes:
    """The changes grading applies: normalised paths, none protected, no caches or bytecode."""
    kept: Changes = {}
    for rel, data in changes.items():
        norm = safe_relpath(rel)
        if norm is None or is_protected(norm, protected):
            continue
        parts = norm.split("/")
        if any(p in SKIP_DIRS for p in parts[:-1]) or norm.endswith(SKIP_SUFFIXES):
            continue
        kept[norm] = data
    return kept


def apply_patch(root: Path, patch: str) -> str:
    """`git apply` `patch` inside `root`; returns '' or git's error message."""
    if not patch.strip():
        return ""
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as f:
        f.write(patch if patch.endswith("\n") else patch + "\n")
    try:
        proc = git(
            None,
            "apply",
            "--whitespace=nowarn",
            f.name,
            cwd=root,
            # never find a repository above the copy: the patch applies to the copy alone
            env={"GIT_CEILING_DIRECTORIES": str(root.parent)},
            text=True,
            timeout=120,
        )
    finally:
        os.unlink(f.name)
    return "" if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[-1000:]


@dataclass(frozen=True)
class Packed:
    """A repository as the tar stream the runner unpacks, and the tmpfs space it takes."""

    data: bytes
    disk_bytes: int


def pack_tree(root: Path) -> Packed:
    """`root` as a tar (symlinks kept as links, nothing followed)."""
    buf = io.BytesIO()
    disk = 0
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames.sort()
            for name in dirnames + sorted(filenames):
                full = os.path.join(dirpath, name)
                info = tar.gettarinfo(full, arcname=os.path.relpath(full, root))
                if info is None:  # a socket or the like: nothing a test can use
                    continue
                if info.isreg():
                    with open(full, "rb") as f:
                        tar.addfile(info, f)
                else:
                    tar.addfile(info)
                disk += _PAGE + -(-info.size // _PAGE) * _PAGE
    return Packed(buf.getvalue(), disk)


def run_tests(
    workdir: Path,
    test_ids: list[str],
    *,
    test_timeout_s: float,
    wall_s: float,
    autoload: bool = False,
    config: str | None = None,
    max_lines: int = 0,
    disk_bytes: int = GRADE_DISK_BYTES,
    limits: Limits | None = None,
) -> TestRun:
    """Run `test_ids` (pytest node ids relative to `workdir`) on a sandboxed copy of `workdir`.

    `autoload` loads the environment's pytest plugins; `config` is the config file (relative
    to `workdir`) pytest reads, None for none; `max_lines` > 0 also stops each test after that
    many executed lines (deterministic)."""
    return run_packed(
        pack_tree(workdir),
        test_ids,
        test_timeout_s=test_timeout_s,
        wall_s=wall_s,
        plugins=installed_plugins() if autoload else (),
        config=config,
        max_lines=max_lines,
        disk_bytes=disk_bytes,
        limits=limits,
    )


def run_packed(
    packed: Packed,
    test_ids: list[str],
    *,
    test_timeout_s: float,
    wall_s: float,
    plugins: Sequence[str] = (),
    config: str | None = None,
    max_lines: int = 0,
    disk_bytes: int = GRADE_DISK_BYTES,
    limits: Limits | None = None,
    env: TaskEnv | None = None,
    collect_all: bool = False,
) -> TestRun:
    """`run_tests` on a packed repository (see the module docstring for the sandbox). With
    `env` the tests run with that per-task environment's interpreter (its venv bound read-only)
    and its import roots; `collect_all` runs every test of the files `test_ids` name."""
    nonce = secrets.token_hex(16)
    spec = {
        "ids": test_ids,
        "nonce": nonce,
        "timeout_s": test_timeout_s,
        "plugins": list(plugins),
        "config": config,
        "max_lines": max_lines,
        "paths": list(env.roots) if env else [],
        "all": collect_all,
    }
    tmpfs = packed.disk_bytes + disk_bytes
    limits = limits or Limits(
        wall_s=wall_s,
        cpu_s=max(int(wall_s), 1) + 1,
        max_processes=64,
        memory_bytes=GRADE_MEMORY_BYTES + tmpfs,
        file_size_bytes=tmpfs,
        output_bytes=RESULTS_BYTES,
    )
    result: ExecResult = run(
        [env.python if env else sys.executable, "-I", "-B", "-c", runner_source()],
        limits=limits,
        stdin=json.dumps(spec).encode() + b"\n" + packed.data,
        ro_binds=(env.venv,) if env else (),
    )
    statuses: dict[str, str] = {}
    messages: dict[str, str] = {}
    prefix = nonce + " "
    for line in result.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            rec = json.loads(line[len(prefix) :])
            test_id = str(rec["id"])
            status = str(rec["status"])
        except (ValueError, KeyError, TypeError):
            continue
        statuses.setdefault(test_id, status)
        # both ends: a collection error's cause (ModuleNotFoundError: ...) is its last line
        messages.setdefault(test_id, middle_truncate(str(rec.get("message", "")), 500))
    for test_id in [] if collect_all else test_ids:
        if test_id not in statuses:
            statuses[test_id] = "timeout" if result.timed_out else "missing"
            messages[test_id] = result.reason if result.timed_out else "never reported"
    log = dataclasses.replace(result, stdout=result.stderr, stderr="").to_observation(4000)
    return TestRun(statuses, messages, result.status, log)


@dataclass(frozen=True)
class Prepared:
    work: Path  # the host copy, to be removed by the caller
    error: str  # why it cannot be graded, or ''
    config: str | None  # the pytest config file in it, if any
    canaries: dict[str, str] = field(default_factory=dict)  # test id -> the status it must get


def prepare(
    task: Any,
    changes: Changes,
    parent: Path | None = None,
    ids: Sequence[str] | None = None,
    canaries: bool = False,
) -> Prepared:
    """A fresh copy of the snapshot with the test patch and the agent's gradable changes; the
    config file is the one pytest would pick for `ids` (default: the task's) before them;
    with `canaries`, canary tests beside the first FAIL_TO_PASS test (`add_canaries`)."""
    work = copy_tree(task.base_dir(), parent, prefix="saorl-swe-grade-")
    error = apply_patch(work, task.test_patch)
    if error:
        return Prepared(work, f"test_patch does not apply: {error}", None)
    ids = [*task.fail_to_pass, *task.pass_to_pass] if ids is None else list(ids)
    config = pytest_config_file(work, ids)
    apply_changes(work, gradable(changes, (*task.protected, *config)))
    planted = add_canaries(work, list(task.fail_to_pass)) if canaries else {}
    return Prepared(work, "", config[0] if config else None, planted)


def run_task_tests(
    task: Any,
    changes: Changes,
    ids: list[str],
    *,
    collect_all: bool = False,
    test_timeout_s: float = 10.0,
    wall_s: float = 300.0,
    parent: Path | None = None,
    disk_bytes: int = GRADE_DISK_BYTES,
    canaries: bool = False,
) -> TestRun | str:
    """Run `ids` (with `collect_all`: every test of those files) on the task's snapshot with
    its test patch and `changes`, as grading does; a str is why nothing could run. With
    `canaries`, canary tests run too: their statuses are left out of the result, and one that
    is not what it must be sets `tampered`."""
    prepared = prepare(task, changes, parent, ids, canaries)
    try:
        if prepared.error:
            return prepared.error
        packed = pack_tree(prepared.work)
    finally:
        remove_tree(prepared.work)  # the run never touches the host disk
    env = getattr(task, "env", None)
    if env is not None:
        plugins: Sequence[str] = env.plugins
    else:
        plugins = installed_plugins() if task.plugin_autoload else ()
    planted = prepared.canaries
    run = run_packed(
        packed,
        [*ids, *planted],
        test_timeout_s=test_timeout_s,
        wall_s=wall_s,
        plugins=plugins,
        config=prepared.config,
        disk_bytes=disk_bytes,
        env=env,
        collect_all=collect_all,
    )
    statuses = {t: s for t, s in run.statuses.items() if t not in planted}
    messages = {t: m for t, m in run.messages.items() if t not in planted}
    return dataclasses.replace(
        run, statuses=statuses, messages=messages, tampered=check_canaries(planted, run.statuses)
    )


def grade(
    task: Any,
    changes: Changes,
    *,
    test_timeout_s: float = 10.0,
    wall_s: float = 300.0,
    parent: Path | None = None,
    disk_bytes: int = GRADE_DISK_BYTES,
) -> GradeResult:
    """Grade `changes` against `task` (a `SweTask`); see the module docstring."""
    f2p = list(task.fail_to_pass)
    p2p = list(task.pass_to_pass)
    runs = run_task_tests(
        task,
        changes,
        f2p + p2p,
        test_timeout_s=test_timeout_s,
        wall_s=wall_s,
        parent=parent,
        disk_bytes=disk_bytes,
        canaries=True,
    )
    if isinstance(runs, str):
        return GradeResult(
            False, dict.fromkeys(f2p, "missing"), dict.fromkeys(p2p, "missing"), error=runs
        )
    f2p_status = {t: runs.statuses[t] for t in f2p}
    p2p_status = {t: runs.statuses[t] for t in p2p}
    gold = getattr(task, "gold_outcomes", None) or {}
    ok = {t: counts_as_passing(runs.statuses[t], gold.get(t)) for t in f2p + p2p}
    resolved = bool(f2p) and all(ok.values()) and not runs.tampered
    failing = {t: runs.messages.get(t, "") for t in f2p + p2p if not ok[t]}
    return GradeResult(
        resolved, f2p_status, p2p_status, failing, error=runs.tampered, log=runs.log, gold=gold
    )
