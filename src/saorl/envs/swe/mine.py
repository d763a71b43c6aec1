"""SWE-bench-format tasks mined from a repository's history, as SWE-Gym and SWE-smith do.

    rows = mine(MineOptions(checkout=Path("~/src/attrs"), out=Path("tasks.jsonl")), swe)

Candidates are the commits on the first-parent line of `rev` (newest first; `--since`,
`--max-commits`) whose change against their first parent touches at least one Python file that
is not a test and adds or modifies at least one test file (`test_*.py`, `*_test.py`,
`conftest.py`, or a `.py` under a `test`, `tests` or `testing` directory). A merge commit counts
with everything it merges: on a project that merges pull requests that is one pull request, the
unit SWE-bench mines. For each candidate C with first parent P:
- `patch` is C's diff of the other files, `test_patch` its diff of the test files, and the task's
  environment is built (`venv.py`) at the last commit up to P that changed an install file
  (`environment_setup_commit`, so commits between two dependency changes share one environment);
- every test of the test files C adds or modifies runs twice in that environment, in the
  sandbox, as grading runs: on P with `test_patch` ("before") and with `patch` too ("after");
  FAIL_TO_PASS = the tests that pass after and not before (failing, erroring or absent then),
  PASS_TO_PASS = those that pass both times ("pass": the outcome `passed`, not xfail or skip);
- the row is then validated (`validate.py`: the gold patch resolves it, an empty patch does
  not) and only then appended to `out`.
The problem statement is C's commit message, and for a merge the messages of the commits it
merges (no issue tracker is read). The instance id is
`<repo with / as __>-<C[:12]>`; rows already in `out` are skipped, so an interrupted run
continues where it stopped, and rejected commits are remembered under
`<cache>/mined/` (except environment failures, which may be transient). Commits run on
`jobs` threads; the progress bar (tqdm) and one line per rejected commit go to stderr.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shlex
import sys
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from saorl.config import ConfigError
from saorl.config.env_families import SweConfig
from saorl.envs.swe.git import git, git_text
from saorl.envs.swe.grading import TestRun, run_task_tests
from saorl.envs.swe.swebench import changes_from_patch, check_repo_name, task_from_row
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.validate import code_hash, store_verdict, validate_task
from saorl.envs.swe.venv import INPUTS, EnvBuildError, ensure_env
from saorl.envs.swe.workspace import remove_tree
from saorl.security.safe_io import open_write, write_atomic

TEST_DIRS = frozenset({"test", "tests", "testing"})
NOT_A_CANDIDATE = "does not change both code and tests"


@dataclass(frozen=True)
class MineOptions:
    checkout: Path
    out: Path
    repo: str = ""  # the rows' `repo`; '' = the checkout directory's name
    rev: str = "HEAD"  # a revision or range (`v1.0..main`)
    since: str = ""  # git's --since (a date)
    max_commits: int = 0  # 0 = all
    jobs: int = 2


@dataclass(frozen=True)
class Outcome:
    commit: str
    row: dict[str, Any] | None
    reason: str  # why no row ('' with one)
    remember: bool = True  # whether the rejection is cached


def is_test_file(path: str) -> bool:
    parts = path.split("/")
    name = parts[-1]
    if not name.endswith(".py"):
        return False
    if name == "conftest.py" or name.startswith("test_") or name.endswith("_test.py"):
        return True
    return any(p in TEST_DIRS for p in parts[:-1])


def is_test_module(path: str) -> bool:
    """What pytest collects by default (python_files = test_*.py *_test.py)."""
    name = path.rsplit("/", 1)[-1]
    return name.endswith(".py") and (name.startswith("test_") or name.endswith("_test.py"))


def _git(repo: Path, *args: str) -> str:
    return git_text(repo, *args)  # hardened: the repository's own config runs nothing (git.py)


def commits(opts: MineOptions) -> list[str]:
    """The commits to examine, newest first."""
    args = ["rev-list", "--first-parent"]
    args += [f"--max-count={opts.max_commits}"] if opts.max_commits else []
    args += [f"--since={opts.since}"] if opts.since else []
    try:
        return _git(opts.checkout, *args, opts.rev, "--").split()
    except RuntimeError as e:
        raise ConfigError(f"swe-mine: {e}") from None


def split_changes(repo: Path, commit: str) -> tuple[list[str], list[str]] | None:
    """(code files, test files) commit changes, or None when it is no candidate."""
    parents = _git(repo, "rev-list", "--parents", "-n", "1", commit).split()[1:]
    if not parents:  # the root commit: nothing to compare with
        return None
    status = _git(
        repo,
        "diff-tree",
        "--no-commit-id",
        "-r",
        "--no-renames",
        "--name-status",
        parents[0],
        commit,
    )
    code = []
    tests = []
    touched_tests = False
    for line in status.splitlines():
        kind, _, path = line.partition("\t")
        if is_test_file(path):
            tests.append(path)
            touched_tests = touched_tests or kind in ("A", "M")
        else:
            code.append(path)
    if not touched_tests or not any(p.endswith(".py") for p in code):
        return None
    return code, tests


def _key(opts_repo: str, commit: str, swe: SweConfig, checkout: Path) -> str:
    settings = [
        code_hash(),
        swe.pip_args,
        swe.test_timeout_s,
        swe.task_envs,
        str(checkout.resolve()),
    ]  # two checkouts of one name are two repositories
    digest = hashlib.sha256(json.dumps(settings).encode()).hexdigest()[:12]
    return f"{re.sub(r'[^A-Za-z0-9_.-]', '_', opts_repo)}-{commit[:12]}-{digest}"


def _passing(run: TestRun) -> set[str]:
    # strictly "passed": an xfail or skip shows nothing about the fix (grading counts it only
    # with the outcome the gold patch gives it)
    return {t for t, s in run.statuses.items() if s == "passed" and "::" in t}


def mine_commit(
    opts: MineOptions, repo_name: str, commit: str, swe: SweConfig, cache_dir: Path
) -> Outcome:
    """The validated row of `commit`, or why there is none."""
    split = split_changes(opts.checkout, commit)
    if split is None:
        return Outcome(commit, None, NOT_A_CANDIDATE, remember=False)  # cheap to tell again
    code, tests = split
    parent = _git(opts.checkout, "rev-parse", f"{commit}^1").strip()
    diff = [
        "diff",
        "--no-ext-diff",
        "--no-textconv",
        "--binary",
        "--no-renames",
        "--full-index",
        parent,
        commit,
        "--",
    ]
    env_commit = _git(opts.checkout, "rev-list", "-n", "1", parent, "--", *INPUTS).strip()
    row = {
        "instance_id": f"{repo_name.replace('/', '__')}-{commit[:12]}",
        "repo": repo_name,
        "base_commit": parent,
        "patch": _git(opts.checkout, *diff, *code),
        "test_patch": _git(opts.checkout, *diff, *tests),
        "problem_statement": _statement(opts.checkout, commit, parent),
        "hints_text": "",
        "created_at": _git(opts.checkout, "log", "-1", "--format=%cI", commit).strip(),
        "environment_setup_commit": env_commit or parent,
        "FAIL_TO_PASS": [],
        "PASS_TO_PASS": [],
    }
    task = task_from_row(row, opts.checkout, cache_dir, f"swe-mine: {commit[:12]}")
    outcome = Outcome(commit, None, "interrupted")
    try:
        outcome = _run_and_validate(opts, commit, row, task, tests, swe, cache_dir)
    finally:
        if outcome.row is None and task.snapshot.is_dir():
            remove_tree(task.snapshot)  # a rejected commit's snapshot: no task will use it
    return outcome


def _run_and_validate(
    opts: MineOptions,
    commit: str,
    row: dict[str, Any],
    task: SweTask,
    tests: list[str],
    swe: SweConfig,
    cache_dir: Path,
) -> Outcome:
    """FAIL_TO_PASS and PASS_TO_PASS of the row, then its verdict."""
    if swe.task_envs != "none":
        assert task.source is not None
        try:
            env = ensure_env(
                task.source, cache_dir, shlex.split(swe.pip_args), swe.env_build_timeout_s
            )
        except EnvBuildError as e:
            return Outcome(commit, None, f"environment build failed: {e}", remember=False)
        task = replace(task, env=env)
    run_files = sorted(p for p in tests if is_test_module(p) and _exists(opts.checkout, commit, p))
    if not run_files:
        return Outcome(commit, None, "its test changes hold no test module to run")
    kw = {
        "test_timeout_s": swe.test_timeout_s,
        "wall_s": swe.grade_timeout_s,
        "parent": cache_dir / "work",
    }
    try:
        gold = changes_from_patch(task, row["patch"])
    except ValueError as e:
        return Outcome(commit, None, f"its code change does not apply: {e}")
    before = run_task_tests(task, {}, run_files, collect_all=True, **kw)
    after = run_task_tests(task, gold, run_files, collect_all=True, **kw)
    for run in (before, after):
        if isinstance(run, str):
            return Outcome(commit, None, f"the tests could not run: {run}")
    assert isinstance(before, TestRun) and isinstance(after, TestRun)
    passed_after = _passing(after)
    passed_before = _passing(before)
    f2p = sorted(passed_after - passed_before)
    if not f2p:
        return Outcome(
            commit,
            None,
            f"no test goes from failing to passing ({len(passed_after)} "
            f"pass after the change, {len(passed_before)} before)",
        )
    row["FAIL_TO_PASS"], row["PASS_TO_PASS"] = f2p, sorted(passed_after & passed_before)
    # The task exactly as the loader will make it from the row: its verdict, cached here, is
    # the one training then reads back.
    checked = replace(task_from_row(row, opts.checkout, cache_dir, commit[:12]), env=task.env)
    verdict, cacheable = validate_task(checked, **kw)
    if verdict.status != "valid":
        return Outcome(commit, None, f"not valid: {verdict.reason}", remember=cacheable)
    if cacheable:
        store_verdict(cache_dir, checked, verdict)
    return Outcome(commit, row, "")


def _statement(repo: Path, commit: str, parent: str, max_chars: int = 8000) -> str:
    """The commit message; a merge's is followed by those of the commits it merges."""
    text = _git(repo, "log", "-1", "--format=%B", commit).strip()
    if len(_git(repo, "rev-list", "--parents", "-n", "1", commit).split()) > 2:
        merged = _git(repo, "log", "--no-merges", "--format=%B", f"{parent}..{commit}").strip()
        text = f"{text}\n\n{merged}" if merged else text
    return text[:max_chars]


def _exists(repo: Path, commit: str, path: str) -> bool:
    return git(repo, "cat-file", "-e", f"{commit}:{path}", timeout=60).returncode == 0


def _remembered(path: Path) -> str | None:
    """A cached rejection's reason, if the file holds one (anything else is ignored)."""
    try:
        reason = json.loads(path.read_text())["reason"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return reason if isinstance(reason, str) else None


def existing_ids(out: Path) -> set[str]:
    """Instance ids already in `out` (a line that is not JSON is a ConfigError)."""
    if not out.exists():
        return set()
    ids = set()
    for n, line in enumerate(out.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                ids.add(str(json.loads(line)["instance_id"]))
            except (ValueError, KeyError, TypeError):
                raise ConfigError(f"--out: {out} line {n} is not a task row") from None
    return ids


def _progress(total: int) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm comes with transformers; without it, no bar
        return None
    return tqdm(total=total, file=sys.stderr, unit="commit", desc="swe-mine", disable=None)


def mine(
    opts: MineOptions, swe: SweConfig, cache_dir: Path, log: Callable[[str], None] | None = None
) -> dict[str, int]:
    """Mine `opts.checkout` into `opts.out` (appending); returns counts by outcome."""
    if not (opts.checkout / ".git").exists():
        raise ConfigError(f"swe-mine: {opts.checkout} is not a git checkout")
    log = log or (lambda text: print(text, file=sys.stderr))
    repo_name = opts.repo or opts.checkout.resolve().name
    check_repo_name(repo_name, "swe-mine: --repo")  # the rows' repo must name a checkout
    done = existing_ids(opts.out)
    every = commits(opts)
    todo = [c for c in every if f"{repo_name.replace('/', '__')}-{c[:12]}" not in done]
    counts = {
        "examined": 0,
        "written": 0,
        "already_in_out": len(every) - len(todo),
        "not_candidates": 0,
        "rejected": 0,
    }
    memo = cache_dir / "mined"
    memo.mkdir(parents=True, exist_ok=True)
    bar = _progress(len(todo))
    lock = threading.Lock()

    def one(commit: str) -> Outcome:
        path = memo / f"{_key(repo_name, commit, swe, opts.checkout)}.json"
        if (reason := _remembered(path)) is not None:
            return Outcome(commit, None, reason, remember=False)
        try:
            outcome = mine_commit(opts, repo_name, commit, swe, cache_dir)
        except Exception as e:  # a failing git or sandbox call costs this commit, not the run
            return Outcome(commit, None, f"error: {type(e).__name__}: {e}", remember=False)
        if outcome.row is None and outcome.remember:
            write_atomic(path, json.dumps({"reason": outcome.reason}))
        return outcome

    opts.out.parent.mkdir(parents=True, exist_ok=True)
    with open_write(opts.out, "a") as out, ThreadPoolExecutor(opts.jobs) as pool:
        futures = [pool.submit(one, c) for c in todo]
        for future in as_completed(futures):
            outcome = future.result()
            with lock:
                counts["examined"] += 1
                if outcome.row is not None:
                    out.write(json.dumps(outcome.row) + "\n")
                    out.flush()
                    os.fsync(out.fileno())
                    counts["written"] += 1
                elif outcome.reason == NOT_A_CANDIDATE:
                    counts["not_candidates"] += 1
                else:
                    counts["rejected"] += 1
                    lines = outcome.reason.splitlines()[:4]
                    log(f"swe-mine: {outcome.commit[:12]} left out: " + "\n    ".join(lines))
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    return counts


@functools.cache
def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 2))
