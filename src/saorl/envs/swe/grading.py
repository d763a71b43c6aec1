"""SWE-bench-style grading: run FAIL_TO_PASS and PASS_TO_PASS tests on the agent's final diff.

    result = grade(task, changes)        # changes: collect_changes(snapshot, episode work dir)
    result.resolved                      # every FAIL_TO_PASS and PASS_TO_PASS test passed

A grade always runs in a fresh copy of the task's snapshot, in a fresh sandbox:
1. the agent's changes are applied, except to *protected* paths: the task's own test files
   (`task.protected`, e.g. `tests/` of a generated task, the files a SWE-bench `test_patch`
   touches and those its test ids name) and, anywhere, test infrastructure that pytest reads
   before any test runs (`conftest.py`, `pytest.ini`, `tox.ini`, `setup.cfg`, `pyproject.toml`).
   Those stay as in the snapshot, so deleting, editing or shadowing a test cannot pass it;
2. the task's `test_patch` (SWE-bench: the tests that check the fix) is applied with `git apply`;
3. the wanted ids run under `pytest_runner.py` with a per-test alarm and an outer wall-clock
   limit; a test that never reports is "timeout" when the run hit that limit, else "missing".

A test counts as passing when its status is "passed" or "xfailed" (as in SWE-bench). What grading
does not defend against: code under test that subverts the pytest process it runs in (it could
rewrite the reporter); SWE-bench's harness shares that limit.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from saorl.envs.sandbox import ExecResult, Limits, run
from saorl.envs.swe.workspace import (
    RESULTS_PREFIX,
    Changes,
    apply_changes,
    copy_tree,
    read_file,
    remove_tree,
)

PASSING = ("passed", "xfailed")
INFRASTRUCTURE = frozenset({"conftest.py", "pytest.ini", "tox.ini", "setup.cfg", "pyproject.toml"})


@dataclass(frozen=True)
class TestRun:
    """Per-test statuses and messages of one sandboxed pytest run."""

    statuses: dict[str, str]
    messages: dict[str, str]
    exec_status: str  # the sandbox's status of the whole run ("ok", "error", "timeout", ...)
    log: str  # pytest's own output, middle-truncated

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

    def info(self) -> dict[str, Any]:
        """The flat record that goes into the trajectory's info."""
        f2p = self.fail_to_pass
        p2p = self.pass_to_pass
        return {
            "resolved": self.resolved,
            "fail_to_pass_passed": sum(s in PASSING for s in f2p.values()),
            "fail_to_pass_total": len(f2p),
            "pass_to_pass_passed": sum(s in PASSING for s in p2p.values()),
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


def run_tests(
    workdir: Path,
    test_ids: list[str],
    *,
    test_timeout_s: float,
    wall_s: float,
    autoload: bool = False,
    max_lines: int = 0,
    limits: Limits | None = None,
) -> TestRun:
    """Run `test_ids` (pytest node ids relative to `workdir`) in the sandbox over `workdir`.

    `max_lines` > 0 also stops each test after that many executed lines (deterministic)."""
    out_name = f"{RESULTS_PREFIX}results-{uuid.uuid4().hex}.jsonl"
    spec = {"ids": test_ids, "out": out_name, "timeout_s": test_timeout_s, "autoload": autoload,
            "max_lines": max_lines}  # fmt: skip
    limits = limits or Limits(wall_s=wall_s, cpu_s=max(int(wall_s), 1) + 1, max_processes=64)
    result: ExecResult = run(
        [sys.executable, "-I", "-B", "-c", runner_source()],
        workdir=workdir,
        limits=limits,
        stdin=json.dumps(spec).encode(),
    )
    statuses: dict[str, str] = {}
    messages: dict[str, str] = {}
    try:
        raw = read_file(workdir / out_name, 16 << 20).decode("utf-8", errors="replace")
    except OSError:
        raw = ""
    for line in raw.splitlines():
        try:
            rec = json.loads(line)
            test_id, status = str(rec["id"]), str(rec["status"])
        except (ValueError, KeyError, TypeError):
            continue
        statuses.setdefault(test_id, status)
        messages.setdefault(test_id, str(rec.get("message", ""))[:500])
    for test_id in test_ids:
        if test_id not in statuses:
            statuses[test_id] = "timeout" if result.timed_out else "missing"
            messages[test_id] = result.reason if result.timed_out else "never reported"
    return TestRun(statuses, messages, result.status, result.to_observation(4000))


def is_protected(rel: str, protected: tuple[str, ...]) -> bool:
    """Whether grading keeps the snapshot's version of `rel` (see the module docstring)."""
    if rel.rsplit("/", 1)[-1] in INFRASTRUCTURE:
        return True
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in protected)


def apply_patch(root: Path, patch: str) -> str:
    """`git apply` `patch` inside `root`; returns '' or git's error message."""
    if not patch.strip():
        return ""
    with tempfile.NamedTemporaryFile("w", suffix=".diff", delete=False) as f:
        f.write(patch if patch.endswith("\n") else patch + "\n")
    try:
        proc = subprocess.run(
            ["git", "apply", "--whitespace=nowarn", f.name],
            cwd=root,
            # never find a repository above the copy: the patch applies to the copy alone
            env={**os.environ, "GIT_CEILING_DIRECTORIES": str(root.parent)},
            capture_output=True,
            text=True,
            timeout=120,
        )
    finally:
        os.unlink(f.name)
    return "" if proc.returncode == 0 else (proc.stderr or proc.stdout).strip()[-1000:]


def prepare(task: Any, changes: Changes, parent: Path | None = None) -> tuple[Path, str]:
    """A fresh copy of the snapshot with the agent's unprotected changes and the test patch."""
    work = copy_tree(task.base_dir(), parent, prefix="saorl-swe-grade-")
    kept = {p: c for p, c in changes.items() if not is_protected(p, task.protected)}
    apply_changes(work, kept)
    error = apply_patch(work, task.test_patch)
    return work, (f"test_patch does not apply: {error}" if error else "")


def grade(
    task: Any,
    changes: Changes,
    *,
    test_timeout_s: float = 10.0,
    wall_s: float = 300.0,
    parent: Path | None = None,
) -> GradeResult:
    """Grade `changes` against `task` (a `SweTask`); see the module docstring."""
    f2p, p2p = list(task.fail_to_pass), list(task.pass_to_pass)
    work, error = prepare(task, changes, parent)
    try:
        if error:
            return GradeResult(False, dict.fromkeys(f2p, "missing"),
                               dict.fromkeys(p2p, "missing"), error=error)  # fmt: skip
        runs = run_tests(work, f2p + p2p, test_timeout_s=test_timeout_s, wall_s=wall_s,
                         autoload=task.plugin_autoload)  # fmt: skip
    finally:
        remove_tree(work)
    f2p_status = {t: runs.statuses[t] for t in f2p}
    p2p_status = {t: runs.statuses[t] for t in p2p}
    resolved = bool(f2p) and all(runs.passed(t) for t in f2p + p2p)
    failing = {t: runs.messages.get(t, "") for t in f2p + p2p if not runs.passed(t)}
    return GradeResult(resolved, f2p_status, p2p_status, failing, log=runs.log)
