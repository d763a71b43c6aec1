"""SWE-bench-style grading in the sandbox: only a real fix resolves a task.

A hand-made task: `calc.ops.add` subtracts (FAIL_TO_PASS: test_add); `mul` and `spin` work
(PASS_TO_PASS). Each case grades a different final diff of the agent.
"""

from __future__ import annotations

import functools
import time
from pathlib import Path

import pytest

from saorl.envs.swe.grading import grade
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.workspace import write_files

pytestmark = pytest.mark.slow

OPS = (
    "def add(a, b):\n    return a - b\n\n\ndef mul(a, b):\n    return a * b\n\n\n"
    "def spin(n):\n    return n\n"
)
FIXED = OPS.replace("return a - b", "return a + b")
TESTS = (
    "from calc.ops import add, mul, spin\n\n\ndef test_add():\n    assert add(2, 3) == 5\n\n\n"
    "def test_mul():\n    assert mul(2, 3) == 6\n\n\ndef test_spin():\n    assert spin(3) == 3\n"
)
F2P = ("tests/test_ops.py::test_add",)
P2P = ("tests/test_ops.py::test_mul", "tests/test_ops.py::test_spin")


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    files = {
        "calc/__init__.py": b"",
        "calc/ops.py": OPS.encode(),
        "tests/test_ops.py": TESTS.encode(),
    }
    return SweTask(
        key="calc-1",
        prompt="add subtracts",
        fail_to_pass=F2P,
        pass_to_pass=P2P,
        snapshot=tmp_path / "snap",
        fill=functools.partial(write_files, files=files),
        protected=("tests/",),
    )


def _grade(task: SweTask, changes: dict, **kw):
    return grade(
        task,
        changes,
        test_timeout_s=kw.pop("test_timeout_s", 5.0),
        parent=task.snapshot.parent / "grading",
        **kw,
    )


def test_gold_fix_resolves(task):
    result = _grade(task, {"calc/ops.py": FIXED.encode()})
    assert result.resolved
    assert result.info()["tests"] == dict.fromkeys(F2P + P2P, "passed")
    assert (result.info()["fail_to_pass_passed"], result.info()["pass_to_pass_passed"]) == (1, 2)


def test_no_op_does_not_resolve(task):
    result = _grade(task, {})
    assert not result.resolved
    assert result.fail_to_pass == {F2P[0]: "failed"}
    assert result.pass_to_pass == dict.fromkeys(P2P, "passed")
    assert "assert -1 == 5" in result.messages[F2P[0]]


@pytest.mark.parametrize(
    "cheat",
    [
        {"tests/test_ops.py": None},  # delete the failing test file
        {"tests/test_ops.py": TESTS.replace("assert add(2, 3) == 5", "assert True").encode()},
        {"tests/conftest.py": b"import calc.ops\ncalc.ops.add = lambda a, b: a + b\n"},
        {"conftest.py": b"import calc.ops\ncalc.ops.add = lambda a, b: a + b\n"},
        {"pytest.ini": b"[pytest]\naddopts = -p no:python\n"},
        {"pytest.py": b"import sys\nsys.exit(0)\n"},  # shadow pytest itself
    ],
    ids=["delete-test", "edit-test", "tests-conftest", "root-conftest", "ini", "fake-pytest"],
)
def test_tampering_with_tests_does_not_resolve(task, cheat):
    result = _grade(task, cheat)
    assert not result.resolved
    assert result.fail_to_pass == {F2P[0]: "failed"}  # the task's own test ran, and failed


def test_fix_that_breaks_a_pass_to_pass_test_does_not_resolve(task):
    broken = FIXED.replace("return a * b", "return a + b")
    result = _grade(task, {"calc/ops.py": broken.encode()})
    assert not result.resolved
    assert result.fail_to_pass == {F2P[0]: "passed"}
    assert result.pass_to_pass == {P2P[0]: "failed", P2P[1]: "passed"}


def test_hanging_test_times_out_and_the_others_still_report(task):
    hang = FIXED.replace(
        "def spin(n):\n    return n\n",
        "def spin(n):\n    while True:\n        try:\n            pass\n"
        "        except Exception:\n            pass\n",
    )
    t0 = time.monotonic()
    result = _grade(task, {"calc/ops.py": hang.encode()}, test_timeout_s=1.0)
    assert time.monotonic() - t0 < 20
    assert not result.resolved
    assert result.pass_to_pass == {P2P[0]: "passed", P2P[1]: "timeout"}
    assert result.fail_to_pass == {F2P[0]: "passed"}


def test_test_that_defeats_the_alarm_is_stopped_by_the_wall_limit(task):
    hang = FIXED.replace(
        "def spin(n):\n    return n\n",
        "def spin(n):\n    import signal\n    signal.signal(signal.SIGALRM, signal.SIG_IGN)\n"
        "    while True:\n        pass\n",
    )
    t0 = time.monotonic()
    result = _grade(task, {"calc/ops.py": hang.encode()}, test_timeout_s=1.0, wall_s=4.0)
    assert time.monotonic() - t0 < 20
    assert not result.resolved
    assert result.pass_to_pass[P2P[1]] == "timeout"
    assert result.fail_to_pass == {F2P[0]: "passed"}  # reported before the hang
