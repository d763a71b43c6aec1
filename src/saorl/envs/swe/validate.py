"""SWE-bench tasks checked before use, as SWE-bench validates its instances: the gold patch
resolves the task and an empty patch does not.

    usable = prepare_tasks(load_swebench(...), swe, cache_dir)   # what spec.py does
    results = check_tasks(tasks, swe, cache_dir)                 # what `saorl swe-validate` prints

`check_tasks` first builds each task's environment (`venv.py`, unless `env.swe.task_envs =
"none"`), then grades the gold patch and the empty patch in the sandbox, exactly as an episode
is graded. Each task gets a `Validation`: "valid", "invalid" (with the reason: the gold patch
does not apply or leaves named tests failing, an empty patch already resolves it, no gold patch)
or "env_error" (pip's error). `prepare_tasks` keeps the valid ones, logs the others, and raises a
ConfigError when none remain.

Verdicts are cached under `<cache>/validated/`, keyed by the task id and a hash of all the
verdict depends on (tests, both patches, snapshot, environment key, grading code), so a task
file is validated once and read back on later loads; a verdict that involved a timeout or a
missing result (a loaded machine) is not cached, nor is an environment that failed to build.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shlex
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from saorl.config import ConfigError
from saorl.config.env_families import SweConfig
from saorl.envs.swe.grading import GradeResult, grade
from saorl.envs.swe.outcomes import CUT_SHORT, TOLERATED, counts_as_passing
from saorl.envs.swe.swebench import changes_from_patch
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.venv import attach_envs
from saorl.security.safe_io import write_atomic

VERSION = "1"
_log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Validation:
    key: str  # the task's instance id
    status: str  # "valid", "invalid" or "env_error"
    reason: str
    seconds: float
    cached: bool = False
    outcomes: dict[str, str] = field(default_factory=dict)  # gold's xfail/xpass/skip by test id


STATUSES = ("valid", "invalid", "env_error")


def read_verdict(path: Path, key: str) -> Validation | None:
    """The cached verdict at `path` if it is one `store_verdict` wrote for task `key` (a cache
    is data: anything else, a forged or truncated file, is ignored and the task checked again)."""
    try:
        data = json.loads(path.read_text())
        v = Validation(**{**data, "cached": True})
    except (OSError, ValueError, TypeError):
        return None
    ok = (
        v.key == key
        and v.status in STATUSES
        and isinstance(v.reason, str)
        and isinstance(v.seconds, (int, float))
        and isinstance(v.outcomes, dict)
        and all(isinstance(t, str) and s in TOLERATED for t, s in v.outcomes.items())
    )
    return v if ok else None


@functools.cache
def code_hash() -> str:
    here = Path(__file__).parent
    h = hashlib.sha256(VERSION.encode())
    for name in (
        "grading.py",
        "pytest_runner.py",
        "validate.py",
        "venv.py",
        "venv_probe.py",
        "swebench.py",
        "mine.py",
        "outcomes.py",
        "git.py",
        "build_sandbox.py",
        "venv_build.py",
    ):
        h.update((here / name).read_bytes())
    return h.hexdigest()


def fingerprint(task: SweTask) -> str:
    """What a verdict depends on, hashed."""
    env = task.env.key if task.env else ""
    data = [
        task.key,
        task.fail_to_pass,
        task.pass_to_pass,
        task.test_patch,
        task.answer,
        task.protected,
        str(task.snapshot),
        env,
        code_hash(),
    ]
    return hashlib.sha256(json.dumps(data).encode()).hexdigest()


def _brief(message: str) -> str:
    """A test's message on one line: its first line and, if more, its last (the cause)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    text = lines[0] + (f" ... {lines[-1]}" if len(lines) > 1 else "") if lines else ""
    return text if len(text) <= 300 else text[:297] + "..."


def _failures(result: GradeResult, limit: int = 3) -> str:
    bad = [
        (t, s)
        for t, s in {**result.fail_to_pass, **result.pass_to_pass}.items()
        if not counts_as_passing(s, result.gold.get(t))
    ]
    # a test's own failure says more than a canary's; an error alone when nothing ran
    if result.error and all(s == "missing" for _, s in bad):
        return result.error
    shown = [
        f"{t} {s}" + (f" ({_brief(m)})" if (m := result.messages.get(t)) else "")
        for t, s in bad[:limit]
    ]
    more = f" and {len(bad) - limit} more" if len(bad) > limit else ""
    return "; ".join(shown) + more


def _definitive(*results: GradeResult) -> bool:
    statuses = [s for r in results for s in {**r.fail_to_pass, **r.pass_to_pass}.values()]
    cut = any(r.error == CUT_SHORT for r in results)
    return not cut and not any(s in ("timeout", "missing") for s in statuses)


def validate_task(task: SweTask, **grade_kw: Any) -> tuple[Validation, bool]:
    """(the verdict, whether it may be cached): gold resolves, empty does not."""
    start = time.monotonic()

    def verdict(status: str, reason: str, cacheable: bool = True) -> tuple[Validation, bool]:
        return Validation(task.key, status, reason, time.monotonic() - start), cacheable

    if not task.fail_to_pass:
        return verdict("invalid", "FAIL_TO_PASS is empty")
    if not task.answer.strip():
        return verdict("invalid", "no gold patch (`patch`) to check the task with")
    try:
        gold_changes = changes_from_patch(task, task.answer)
    except ValueError as e:
        return verdict("invalid", f"the gold patch does not apply: {str(e)[-500:]}")
    gold = grade(task, gold_changes, **grade_kw)
    statuses = {**gold.fail_to_pass, **gold.pass_to_pass}
    # the xfails, xpasses and skips of the gold run: with the fix, these are what counts
    outcomes = {t: s for t, s in statuses.items() if s in TOLERATED}
    if outcomes and not gold.error:
        task = dataclasses.replace(task, gold_outcomes=outcomes)
        gold = grade(task, gold_changes, **grade_kw)
    if not gold.resolved:
        reason = f"the gold patch does not resolve it: {_failures(gold)}"
        return verdict("invalid", reason, _definitive(gold))
    empty = grade(task, {}, **grade_kw)
    if empty.resolved:
        return verdict(
            "invalid", "an empty patch resolves it (every FAIL_TO_PASS test passes without the fix)"
        )
    result, cacheable = verdict("valid", "", _definitive(gold, empty))
    return dataclasses.replace(result, outcomes=outcomes), cacheable


def _cache_path(cache_dir: Path, task: SweTask) -> Path:
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", task.key)[:100]
    return cache_dir / "validated" / f"{safe}-{fingerprint(task)[:20]}.json"


def validate_cached(
    task: SweTask, cache_dir: Path, use_cache: bool = True, **grade_kw: Any
) -> Validation:
    path = _cache_path(cache_dir, task)
    if use_cache and (cached := read_verdict(path, task.key)) is not None:
        return cached
    result, cacheable = validate_task(task, **grade_kw)
    if cacheable:
        store_verdict(cache_dir, task, result)
    return result


def store_verdict(cache_dir: Path, task: SweTask, result: Validation) -> None:
    path = _cache_path(cache_dir, task)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, json.dumps(asdict(result)))


def default_jobs() -> int:
    return max(1, min(os.cpu_count() or 1, 2))


def check_tasks(
    tasks: list[SweTask],
    swe: SweConfig,
    cache_dir: Path,
    *,
    use_cache: bool = True,
    jobs: int | None = None,
) -> list[tuple[SweTask, Validation]]:
    """Every task, in order, with its environment attached (when built) and its verdict."""
    by_key: dict[str, Validation] = {}
    ready = tasks
    if swe.task_envs != "none":
        ready, failed = attach_envs(
            tasks, cache_dir, shlex.split(swe.pip_args), swe.env_build_timeout_s
        )
        by_key.update({f.key: Validation(f.key, "env_error", f.reason, 0.0) for f in failed})
    kw = {
        "test_timeout_s": swe.test_timeout_s,
        "wall_s": swe.grade_timeout_s,
        "parent": cache_dir / "work",
    }
    with ThreadPoolExecutor(jobs or default_jobs()) as pool:
        results = pool.map(lambda t: validate_cached(t, cache_dir, use_cache, **kw), ready)
        by_key.update((r.key, r) for r in results)
    attached = {t.key: t for t in ready}
    out = []
    for t in tasks:
        v = by_key[t.key]
        task = attached.get(t.key, t)
        out.append((dataclasses.replace(task, gold_outcomes=v.outcomes) if v.outcomes else task, v))
    return out


def table(results: list[Validation], reason_chars: int = 120) -> str:
    """The verdicts as a fixed-width text table: task, status, reason (first line, cut to
    `reason_chars`), seconds."""
    rows = [("task", "status", "reason", "seconds")]
    for r in results:
        reason = (r.reason.splitlines() or ["-"])[0]
        reason = reason if len(reason) <= reason_chars else reason[: reason_chars - 3] + "..."
        rows.append((r.key, r.status, reason, f"{r.seconds:.1f}" + (" cached" if r.cached else "")))
    width = [max(len(row[i]) for row in rows) for i in range(3)]
    return "\n".join(
        f"{a:<{width[0]}}  {b:<{width[1]}}  {c:<{width[2]}}  {d}".rstrip() for a, b, c, d in rows
    )


def prepare_tasks(
    tasks: list[SweTask], swe: SweConfig, cache_dir: Path, where: str = "env.swe.tasks"
) -> list[SweTask]:
    """The usable tasks: environments built (env.swe.task_envs) and, with env.swe.validate_tasks,
    validated; the others are logged with their reason. ConfigError when none remain."""
    if swe.task_envs == "none" and not swe.validate_tasks:
        return tasks
    if swe.validate_tasks:
        checked = check_tasks(tasks, swe, cache_dir)
    else:
        ready, failed = attach_envs(
            tasks, cache_dir, shlex.split(swe.pip_args), swe.env_build_timeout_s
        )
        bad = {f.key: Validation(f.key, "env_error", f.reason, 0.0) for f in failed}
        ok = {t.key: t for t in ready}
        checked = [
            (ok.get(t.key, t), bad.get(t.key) or Validation(t.key, "valid", "", 0.0)) for t in tasks
        ]
    kept = [t for t, v in checked if v.status == "valid"]
    dropped = [v for _, v in checked if v.status != "valid"]
    if dropped:
        details = "".join(
            f"\n{v.key}: " + "\n    ".join(v.reason.splitlines()[:6]) for v in dropped
        )
        _log.warning(
            "env 'swe': %d of %d tasks left out (not trained or evaluated on):\n%s\n%s",
            len(dropped),
            len(tasks),
            table(dropped),
            details,
        )
    if not kept:
        reasons = "; ".join(f"{v.key}: {v.status}: {v.reason[:300]}" for v in dropped[:5])
        raise ConfigError(f"{where}: none of the {len(tasks)} tasks is usable ({reasons})")
    return kept
