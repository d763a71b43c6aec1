"""Which reported test outcomes count, and canary tests that tell whether the reports can be
trusted at all.

- `passed` counts. `xfailed`, `xpassed` and `skipped` count only for a test whose gold run had
  that same outcome (`SweTask.gold_outcomes`, recorded by validation): a buggy function that
  calls `pytest.xfail()` or `pytest.skip()` does not resolve a task.
- Canaries: code under test runs in the pytest process and can rewrite the runner's recorder
  or pytest's reports. Grading therefore appends a few tests to the first FAIL_TO_PASS test's
  file in the grading copy, named like that test, half of them failing, whose outcomes only the
  grader knows; a run that misreports any of them (or never reports one) is graded 0. What
  stays open: tampering that targets the task's own test ids by name and leaves every other
  report alone (it has to know them: they are in the repository), or that reads the canaries'
  source and evaluates their assertions; see docs/reliability.md.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from pathlib import Path

from saorl.envs.swe.workspace import parents_are_dirs, safe_relpath

PASSING = ("passed",)
# Outcomes that count as passing only when the gold patch gave the test that same outcome.
TOLERATED = ("xfailed", "xpassed", "skipped")
CANARY_WORDS = ("basic", "edge", "empty", "large", "mixed", "order", "repeat", "simple", "zero")
CUT_SHORT = "canary tests did not report (the run was cut short)"


def counts_as_passing(status: str | None, gold: str | None = None) -> bool:
    """`passed`, or the xfail/xpass/skip that the gold patch gave this test too."""
    return status in PASSING or (status in TOLERATED and status == gold)


def add_canaries(work: Path, ids: Sequence[str], n: int = 4) -> dict[str, str]:
    """Append `n` tests to the test file of `ids[0]` in the grading copy, half of them failing,
    named like that test (`test_add_edge_3`); returns id -> the status each must report.

    Code under test that rewrites the runner's reports (every test "passed") misreports the
    failing ones; one that fails everything, the passing ones. None when the file is not a
    plain regular file of the copy (a symlink in the repository): nothing is written there."""
    rel = safe_relpath(ids[0].split("::")[0]) if ids else None
    if rel is None or not rel.endswith(".py"):
        return {}
    path = work / rel
    if not parents_are_dirs(work, rel) or path.is_symlink() or not path.is_file():
        return {}
    base = ids[0].split("::")[-1].split("[")[0]
    text = path.read_bytes()
    rng = secrets.SystemRandom()
    out: dict[str, str] = {}
    code = ""
    for i in range(n):
        name = f"{base}_{rng.choice(CANARY_WORDS)}_{rng.randrange(2, 99)}"
        if name.encode() in text or f"{rel}::{name}" in out:
            continue
        a = rng.randrange(1, 1000)
        b = rng.randrange(1, 1000)
        fails = i % 2 == 1
        code += f"\n\ndef {name}():\n    assert {a} + {b} == {a + b + fails}\n"
        out[f"{rel}::{name}"] = "failed" if fails else "passed"
    if "passed" not in out.values() or "failed" not in out.values():
        return {}
    from saorl.security.safe_io import open_write

    with open_write(path, "ab") as f:  # checked above; O_NOFOLLOW closes the race too
        f.write(b"\n" + code.encode())
    return dict(rng.sample(list(out.items()), len(out)))  # ids in no telling order


def check_canaries(planted: dict[str, str], statuses: dict[str, str]) -> str:
    """'' when every canary reported what it must (or the file failed to collect: every one an
    error, as the task's tests there); else why the run is not trusted."""
    got = {t: statuses.get(t) for t in planted}
    if any(s in (None, "timeout", "missing") for s in got.values()):
        return CUT_SHORT
    if all(s == "error" for s in got.values()):
        return ""
    wrong = [t for t, want in planted.items() if got[t] != want]
    if not wrong:
        return ""
    return (
        f"{len(wrong)} of {len(planted)} canary tests (outcomes known in advance) were "
        "misreported: the run's reports are not trusted"
    )
