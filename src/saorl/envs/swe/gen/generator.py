"""Generated coding tasks: a small Python repository with an injected bug and failing tests.

    held_out, train = generate_pool(seed=1234, num_eval=8, num_train=64)

Task `i` of a seed is a pure function of `(seed, i)`: its own `random.Random` picks a package
name, one template module (`templates.py`) that receives the bug and, half of the time, a
second, untouched module whose tests become PASS_TO_PASS; then walks the mutation sites of the
first module (`mutate.py`) in a shuffled order until one is *validated* in the sandbox:
- with the bug, at least one test fails and none hangs (runs past a budget of executed lines:
  a hanging mutant would make every grade of the task wait for the per-test timeout);
- with the gold fix (the original module) every test passes (checked once per repository).
FAIL_TO_PASS are the tests that fail with the bug, PASS_TO_PASS all the others. The agent sees
the whole repository, tests included (like a repository whose CI is red); grading restores
`tests/` so editing them cannot help. Identical repositories (same modules, same bug) are
dropped, so the held-out tasks never reappear among training tasks.

Validation results are cached as JSON records under the cache dir, keyed by (seed, index) and
a hash of the generator's code and templates, pytest's and Python's versions: a second run with
the same seed (or `saorl eval` after `saorl train`) reads them instead of running the sandbox
again.

Layout of a task's repository: `README.md`, `PKG/__init__.py`, `PKG/<module>.py` (one or two),
`tests/test_<module>.py`.
"""

from __future__ import annotations

import ast
import concurrent.futures
import difflib
import functools
import hashlib
import json
import random
import re
import sys
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.envs.swe.gen.mutate import AST_LOCK, Mutation, mutate, mutation_sites
from saorl.envs.swe.gen.templates import PACKAGES, PLACEHOLDER, Template, all_templates
from saorl.envs.swe.grading import PASSING, TestRun, check_pytest, run_tests
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.workspace import remove_tree, safe_relpath, write_files
from saorl.security.safe_io import write_atomic

MAX_SITES_TRIED = 24  # mutation sites tried per task index before the index is skipped
# A mutant whose test runs more lines than this hangs (the templates' tests run a few thousand).
# Counted, not timed, so a loaded machine validates exactly the same tasks; the clock is only
# a backstop.
VALIDATION_MAX_LINES = 300_000
VALIDATION_TEST_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class Candidate:
    """One task index before validation: the correct repository and the module to break."""

    index: int
    package: str
    modules: tuple[Template, ...]  # the first receives the bug

    def files(self, buggy_source: str | None = None) -> dict[str, bytes]:
        pkg = self.package
        names = ", ".join(f"`{pkg}.{t.name}`" for t in self.modules)
        files = {
            "README.md": f"# {pkg}\n\nSmall utilities: {names}.\nRun the tests with "
            "`python -m pytest tests`.\n",
            f"{pkg}/__init__.py": f'"""The {pkg} package."""\n',
        }
        for i, t in enumerate(self.modules):
            source = buggy_source if i == 0 and buggy_source is not None else t.source
            files[f"{pkg}/{t.name}.py"] = source
            files[f"tests/test_{t.name}.py"] = t.tests.replace(PLACEHOLDER, pkg)
        return {k: v.encode() for k, v in files.items()}

    def test_ids(self) -> list[str]:
        ids = []
        for t in self.modules:
            with AST_LOCK:
                tree = ast.parse(t.tests)
            ids += [
                f"tests/test_{t.name}.py::{n.name}"
                for n in tree.body
                if isinstance(n, ast.FunctionDef) and n.name.startswith("test")
            ]
        return ids


def candidate(seed: int, index: int) -> tuple[Candidate, list]:
    """Task `index` of `seed` before validation, and its mutation sites in trial order."""
    rng = random.Random(f"saorl-swe:{seed}:{index}")
    package = rng.choice(PACKAGES)
    templates = all_templates()
    modules = [rng.choice(templates)]
    if rng.random() < 0.5:
        modules.append(rng.choice([t for t in templates if t is not modules[0]]))
    sites = mutation_sites(modules[0].source)
    rng.shuffle(sites)
    return Candidate(index, package, tuple(modules)), sites[:MAX_SITES_TRIED]


_gold_lock = threading.Lock()
_gold_checked: set[str] = set()


def _digest(files: dict[str, bytes]) -> str:
    h = hashlib.sha256()
    for name in sorted(files):
        h.update(name.encode() + b"\0" + files[name] + b"\0")
    return h.hexdigest()


def _run(files: dict[str, bytes], ids: list[str], timeout_s: float) -> TestRun:
    work = Path(tempfile.mkdtemp(prefix="saorl-swe-gen-"))
    try:
        write_files(work, files)
        return run_tests(
            work, ids, test_timeout_s=timeout_s, wall_s=600.0, max_lines=VALIDATION_MAX_LINES
        )
    finally:
        remove_tree(work)


def _check_gold(cand: Candidate) -> None:
    files = cand.files()
    key = _digest(files)
    with _gold_lock:
        if key in _gold_checked:
            return
    ids = cand.test_ids()
    result = _run(files, ids, VALIDATION_TEST_TIMEOUT_S)
    bad = {t: s for t, s in result.statuses.items() if s not in PASSING}
    if bad:
        raise RuntimeError(
            f"generated task {cand.index}: the correct repository fails its own tests {bad}; "
            f"pytest said:\n{result.log}"
        )
    with _gold_lock:
        _gold_checked.add(key)


def _issue(cand: Candidate, bug: Mutation, run: TestRun, f2p: list[str]) -> str:
    module = cand.modules[0].name
    lines = [
        f"`{bug.function}` in {cand.package}/{module}.py gives wrong results: "
        f"{len(f2p)} test(s) of tests/test_{module}.py fail.",
        "",
        "Failing:",
    ]
    for test_id in f2p[:3]:
        msg = " ".join(run.messages.get(test_id, "").split("\n")[:2])
        msg = re.sub(r" at 0x[0-9a-f]+", "", msg)  # object addresses differ from run to run
        lines.append(f"- {test_id}: {msg[:160]}")
    lines += ["", f"Fix {cand.package}/{module}.py; the tests are correct."]
    return "\n".join(lines)


def _edit(path: str, buggy: str, fixed: str) -> tuple[str, str, str]:
    """The gold fix as one str_replace: the differing lines, widened until `old` is unique."""
    a = buggy.splitlines(keepends=True)
    b = fixed.splitlines(keepends=True)
    lo = 0
    while lo < min(len(a), len(b)) and a[lo] == b[lo]:
        lo += 1
    hi_a = len(a)
    hi_b = len(b)
    while hi_a > lo and hi_b > lo and a[hi_a - 1] == b[hi_b - 1]:
        hi_a, hi_b = hi_a - 1, hi_b - 1
    while True:
        old = "".join(a[lo:hi_a])
        if old and buggy.count(old) == 1:
            return path, old, "".join(b[lo:hi_b])
        if lo == 0 and hi_a == len(a):
            return path, buggy, fixed
        lo, hi_a, hi_b = max(lo - 1, 0), min(hi_a + 1, len(a)), min(hi_b + 1, len(b))


def validate(seed: int, index: int) -> dict[str, Any] | None:
    """Task `index` of `seed` as a JSON-able record, validated in the sandbox; None when no
    tried mutation validates."""
    cand, sites = candidate(seed, index)
    _check_gold(cand)
    ids = cand.test_ids()
    primary = cand.modules[0]
    for site in sites:
        bug = mutate(primary.source, site)
        if bug is None:
            continue
        files = cand.files(bug.source)
        result = _run(files, ids, VALIDATION_TEST_TIMEOUT_S)
        if result.exec_status not in ("ok", "error"):
            continue  # the sandbox killed the run (a hang past the wall limit, a memory hog)
        statuses = result.statuses
        if any(s in ("timeout", "missing") for s in statuses.values()):
            continue
        f2p = [t for t in ids if statuses[t] not in PASSING]
        if not f2p:
            continue  # an equivalent mutant: no test notices
        path = f"{cand.package}/{primary.name}.py"
        diff = difflib.unified_diff(
            bug.source.splitlines(keepends=True),
            primary.source.splitlines(keepends=True),
            f"a/{path}",
            f"b/{path}",
        )
        return {
            "key": f"gen-{seed}-{index:05d}",
            "prompt": _issue(cand, bug, result, f2p),
            "fail_to_pass": f2p,
            "pass_to_pass": [t for t in ids if t not in f2p],
            "files": {k: v.decode() for k, v in files.items()},
            "answer": f"diff --git a/{path} b/{path}\n" + "".join(diff),
            "gold": {path: primary.source},
            "edit": list(_edit(path, bug.source, primary.source)),
            "mutation": {"kind": bug.kind, "function": bug.function, "line": bug.line},
        }
    return None


def task_from_record(record: dict[str, Any], cache_dir: Path) -> SweTask:
    files = {k: v.encode() for k, v in record["files"].items()}
    path, old, new = record["edit"]
    return SweTask(
        key=record["key"],
        prompt=record["prompt"],
        fail_to_pass=tuple(record["fail_to_pass"]),
        pass_to_pass=tuple(record["pass_to_pass"]),
        snapshot=cache_dir / "generated" / _digest(files)[:24],
        fill=functools.partial(write_files, files=files),  # picklable: checkpoints hold tasks
        answer=record["answer"],
        protected=("tests/",),
        gold={k: v.encode() for k, v in record["gold"].items()},
        edit=(path, old, new),
    )


@functools.cache
def _version() -> str:
    """Changes whenever what validation depends on changes: then cached records are redone."""
    import pytest

    h = hashlib.sha256(f"{sys.version}|{pytest.__version__}".encode())
    here = Path(__file__).parent
    for path in (
        here / "templates.py",
        here / "mutate.py",
        here / "generator.py",
        here.parent / "pytest_runner.py",
    ):
        h.update(path.read_bytes())
    for t in all_templates():
        h.update(f"{t.name}\0{t.source}\0{t.tests}\0".encode())
    return h.hexdigest()[:16]


def valid_record(record: Any) -> bool:
    """Whether a cached record is one `validate` could have written: the right types, and
    every path in it plain and relative (no `..`, nothing absolute). A cache is data: a forged
    record must never choose where a file is written."""
    try:
        paths = [*record["files"], *record["gold"], record["edit"][0]]
        texts = [
            *record["files"].values(),
            *record["gold"].values(),
            *record["edit"],
            record["key"],
            record["prompt"],
            record["answer"],
            *record["fail_to_pass"],
            *record["pass_to_pass"],
        ]
        ok = len(record["edit"]) == 3 and all(isinstance(t, str) for t in texts)
    except (KeyError, TypeError, IndexError, AttributeError):
        return False
    return ok and all(isinstance(p, str) and safe_relpath(p) == p for p in paths)


def _cached_record(path: Path) -> Any:
    """The record at `path`: a dict, None (no task for that index) or False (nothing usable
    there: absent, unreadable or invalid, so it is made again)."""
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return record if record is None or valid_record(record) else False


def build_task(seed: int, index: int, cache_dir: Path, use_cache: bool = True) -> SweTask | None:
    """Task `index` of `seed` (validated now, or read from the validation cache)."""
    record_path = cache_dir / "generated" / f"records-{_version()}" / f"{seed}-{index}.json"
    record: Any = _cached_record(record_path) if use_cache else False
    if record is False:
        record = validate(seed, index)
        if use_cache:
            record_path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(record_path, json.dumps(record))  # other processes too
    return None if record is None else task_from_record(record, cache_dir)


def generate_pool(
    seed: int,
    num_eval: int,
    num_train: int,
    cache_dir: Path,
    workers: int = 2,
    use_cache: bool = True,
) -> tuple[list[SweTask], list[SweTask]]:
    """`(held_out, train)`: the first `num_eval` distinct validated tasks of `seed`, then the
    next `num_train`. The same arguments always give the same tasks. Validation results are
    kept under `cache_dir` (keyed by seed, index and a hash of the generator's code)."""
    check_pytest()
    wanted = num_eval + num_train
    tasks: list[SweTask] = []
    seen: set[str] = set()
    next_index = 0
    with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
        while len(tasks) < wanted:
            batch = range(next_index, next_index + max(wanted - len(tasks), workers))
            next_index = batch.stop
            for task in pool.map(lambda i: build_task(seed, i, cache_dir, use_cache), batch):
                if task is None or len(tasks) == wanted:
                    continue
                signature = task.snapshot.name
                if signature not in seen:
                    seen.add(signature)
                    tasks.append(task)
            if next_index > 50 * wanted + 100:
                raise RuntimeError(f"env 'swe': could not generate {wanted} tasks (seed {seed})")
    return tasks[:num_eval], tasks[num_eval:]
