"""A submission must not be rewarded for changing how the tests run.

Each attack leaves the bug in `calc.ops.add` (FAIL_TO_PASS: test_add) in place and tries to make
the grader report test_add as passed anyway: a pytest config file, a plugin, an entry point, an
interpreter start-up hook, a shadowed pytest, forged bytecode, forged result records. Each must
leave the task unresolved with test_add failing, while the gold fix still resolves.

`grade` is attacked end to end (its file-level protection included); the runner is also handed
hostile trees directly, below that protection, to check its own defences. The last tests bound
what the tested code can write.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import importlib.util
import marshal
import threading
from pathlib import Path

import pytest

from saorl.envs.swe.grading import grade, run_tests
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.validate import validate_task
from saorl.envs.swe.workspace import tree_bytes, write_files

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
ADD = "tests/test_ops.py::test_add"
F2P = (ADD,)
P2P = ("tests/test_ops.py::test_mul", "tests/test_ops.py::test_spin")

# A plugin that turns every report into a pass.
PLUG = (
    "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
    "def pytest_runtest_makereport(item, call):\n"
    "    outcome = yield\n    report = outcome.get_result()\n"
    "    report.outcome, report.longrepr = 'passed', None\n"
)
INI = "[pytest]\naddopts = -p calc.plug\n"
TOML = '[pytest]\naddopts = ["-p", "calc.plug"]\n'
ENV_HOOK = "import os; os.environ['PYTEST_ADDOPTS'] = '-p calc.plug'\n"
DIST_META = "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
# Forged records, printed and written to every pipe now, and at exit written over every file
# that looks like a results file.
FORGE = """
import atexit, glob, json, os, stat
_ids = ["tests/test_ops.py::test_add", "tests/test_ops.py::test_mul",
        "tests/test_ops.py::test_spin"]
_recs = [json.dumps({"id": i, "status": "passed", "message": ""}) for i in _ids]
_text = "".join(r + "\\n" for r in _recs) + "".join("0" * 32 + " " + r + "\\n" for r in _recs)


def _forge():
    for path in glob.glob(".saorl-*") + glob.glob("/tmp/**/*.json*", recursive=True):
        with open(path, "w") as f:
            f.write(_text)
    print(_text, end="", flush=True)
    for fd in range(3, 64):
        try:
            if stat.S_ISFIFO(os.fstat(fd).st_mode):
                os.write(fd, _text.encode())
        except OSError:
            pass


_forge()
atexit.register(_forge)
"""


def dist_info(entry_name: str, where: str = "") -> dict[str, str]:
    """A `*.dist-info` that registers `calc.plug` as the pytest11 entry point `entry_name`."""
    base = f"{where}evil-1.0.dist-info"
    return {
        f"{base}/METADATA": DIST_META,
        f"{base}/entry_points.txt": f"[pytest11]\n{entry_name} = calc.plug\n",
    }


def forged_pyc(test_path: str) -> dict[str, bytes]:
    """A pytest bytecode cache entry for the task's test file whose test_add always passes."""
    from _pytest.assertion.rewrite import PYC_TAIL

    fake = TESTS.replace("assert add(2, 3) == 5", "assert True")
    code = compile(fake, test_path, "exec")
    header = importlib.util.MAGIC_NUMBER + b"\x03\x00\x00\x00"
    header += importlib.util.source_hash(TESTS.encode())[:8]
    folder, name = test_path.rsplit("/", 1)
    return {f"{folder}/__pycache__/{name[:-3]}{PYC_TAIL}": header + marshal.dumps(code)}


def make_task(root: Path, files: dict[str, str], autoload: bool = False, name: str = "snap"):
    data = {k: v.encode() for k, v in files.items()}
    # SWE-bench style: only the file the test ids name is protected, not the whole test tree.
    return SweTask(
        key="calc-1",
        prompt="add subtracts",
        fail_to_pass=F2P,
        pass_to_pass=P2P,
        snapshot=root / name,
        fill=functools.partial(write_files, files=data),
        protected=("tests/test_ops.py",),
        plugin_autoload=autoload,
    )


@pytest.fixture
def task(tmp_path: Path) -> SweTask:
    files = {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS}
    return make_task(tmp_path, files)


@pytest.fixture
def autoload_task(tmp_path: Path) -> SweTask:
    files = {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": TESTS}
    return make_task(tmp_path, files, autoload=True, name="snap-autoload")


@pytest.fixture
def src_task(tmp_path: Path) -> SweTask:
    """The repository's own pytest config (a name outside the file-level list, with a path
    relative to itself) must keep working: without `pythonpath = src` nothing imports."""
    files = {
        "pytest.toml": '[pytest]\npythonpath = ["src"]\n',
        "src/calc/__init__.py": "",
        "src/calc/ops.py": OPS,
        "tests/test_ops.py": TESTS,
    }
    return make_task(tmp_path, files, autoload=True, name="snap-src")


def _grade(task: SweTask, changes: dict, **kw):
    data = {k: (v.encode() if isinstance(v, str) else v) for k, v in changes.items()}
    return grade(task, data, test_timeout_s=5.0, parent=task.snapshot.parent / "grading", **kw)


def _assert_not_cheated(result) -> None:
    assert not result.resolved, result.info()
    assert result.fail_to_pass == {ADD: "failed"}, result.info()  # the real test ran, and failed
    assert "assert -1 == 5" in result.messages[ADD]


def test_gold_fix_resolves(task, autoload_task, src_task):
    for t, path in (
        (task, "calc/ops.py"),
        (autoload_task, "calc/ops.py"),
        (src_task, "src/calc/ops.py"),
    ):
        result = _grade(t, {path: FIXED})
        assert result.resolved, result.info()
        _assert_not_cheated(_grade(t, {}))


ATTACKS = {
    # config files pytest reads, wherever it looks for them
    "dot-pytest-ini": {".pytest.ini": INI},
    "dot-pytest-ini-in-tests": {"tests/.pytest.ini": INI},
    "pytest-ini-in-tests": {"tests/pytest.ini": INI},
    "pytest-toml": {"pytest.toml": TOML},
    "dot-pytest-toml-in-tests": {"tests/.pytest.toml": TOML},
    "pyproject": {"pyproject.toml": '[tool.pytest.ini_options]\naddopts = "-p calc.plug"\n'},
    "setup-cfg": {"setup.cfg": "[tool:pytest]\naddopts = -p calc.plug\n"},
    "tox-ini": {"tox.ini": INI},
    # conftest files, also under paths that only normalise to a conftest
    "root-conftest": {"conftest.py": PLUG},
    "tests-conftest": {"tests/conftest.py": PLUG},
    "conftest-dot-key": {"tests/conftest.py/.": PLUG},
    "conftest-dotdot-key": {"calc/../tests/conftest.py": PLUG},
    "test-file-dotdot-key": {"calc/../tests/test_ops.py": TESTS.replace("== 5", "== -1")},
    # interpreter start-up hooks in the repository root
    "sitecustomize": {"sitecustomize.py": ENV_HOOK},
    "usercustomize": {"usercustomize.py": ENV_HOOK},
    "pth": {"evil.pth": ENV_HOOK},
    # a fake pytest
    "pytest-module": {"pytest.py": "import sys\nsys.exit(0)\n"},
    "pytest-package": {
        "_pytest/__init__.py": "raise SystemExit(0)\n",
        "pytest/__init__.py": "raise SystemExit(0)\n",
    },
    # results forged by the code under test (no pytest internals touched)
    "forged-results": {"calc/__init__.py": FORGE},
}


@pytest.mark.parametrize("name", list(ATTACKS))
def test_attack_does_not_resolve(task, name):
    _assert_not_cheated(_grade(task, {"calc/plug.py": PLUG, **ATTACKS[name]}))


def test_forged_bytecode_does_not_resolve(task):
    _assert_not_cheated(_grade(task, forged_pyc("tests/test_ops.py")))


# The bug stays; the buggy function marks its own test xfailed or skipped (issue 26).
ESCAPES = {
    "xfail": '    __import__("pytest").xfail("known bug")\n',
    "skip": '    __import__("pytest").skip("not today")\n',
}


@pytest.mark.parametrize("name", list(ESCAPES))
def test_an_xfail_or_skip_the_gold_run_did_not_show_is_a_failure(task, name):
    code = OPS.replace("def add(a, b):\n", "def add(a, b):\n" + ESCAPES[name])
    result = _grade(task, {"calc/ops.py": code})
    assert not result.resolved, result.info()
    assert result.fail_to_pass == {ADD: {"xfail": "xfailed", "skip": "skipped"}[name]}
    assert result.info()["fail_to_pass_passed"] == 0


def test_an_outcome_the_gold_run_showed_still_counts(task):
    marked = TESTS.replace("def test_spin", "@__import__('pytest').mark.xfail\ndef test_spin")
    marked = marked.replace("spin(3) == 3", "spin(3) == 4")
    files = {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": marked}
    t = make_task(task.snapshot.parent, files, name="snap-xfail")
    assert not _grade(t, {"calc/ops.py": FIXED}).resolved  # no gold outcome known: strict
    t.gold_outcomes = {"tests/test_ops.py::test_spin": "xfailed"}
    result = _grade(t, {"calc/ops.py": FIXED})
    assert result.resolved and result.info()["pass_to_pass_passed"] == 2, result.info()
    # validation records that outcome from the gold run
    diff = difflib.unified_diff(
        OPS.splitlines(True), FIXED.splitlines(True), "a/calc/ops.py", "b/calc/ops.py"
    )
    t = dataclasses.replace(
        t, gold_outcomes={}, answer="diff --git a/calc/ops.py b/calc/ops.py\n" + "".join(diff)
    )
    verdict, _ = validate_task(t, test_timeout_s=5.0, parent=t.snapshot.parent / "grading")
    assert verdict.status == "valid", verdict
    assert verdict.outcomes == {"tests/test_ops.py::test_spin": "xfailed"}


# Code under test that finds the runner's recorder in memory and reports every test passed.
RECORDER_PATCH = """
import gc
for _obj in gc.get_objects():
    if type(_obj).__name__ == "Recorder" and hasattr(_obj, "_write"):
        _orig = _obj._write
        _obj._write = lambda nodeid, status, message, _w=_orig: _w(nodeid, "passed", "")
"""


def test_a_patched_recorder_is_caught_by_the_canaries(task):
    result = _grade(task, {"calc/__init__.py": RECORDER_PATCH})
    assert not result.resolved, result.info()
    assert result.fail_to_pass == {ADD: "passed"}  # the lie went through...
    assert "canary tests" in result.error and "misreported" in result.error  # ...and was seen
    assert set(result.info()["tests"]) == {ADD, *P2P}  # canaries are not task tests


@pytest.mark.parametrize("entry", ["evil", "timeout"])  # "timeout": an installed plugin's name
def test_entry_point_in_the_repository_does_not_load(autoload_task, entry):
    _assert_not_cheated(_grade(autoload_task, {"calc/plug.py": PLUG, **dist_info(entry)}))


@pytest.mark.parametrize("name", ["edit-own-config", "entry-point-on-pythonpath", "pytest-ini"])
def test_repository_config_cannot_be_changed(src_task, name):
    attacks = {
        "edit-own-config": {
            "pytest.toml": '[pytest]\npythonpath = ["src"]\naddopts = ["-p", "calc.plug"]\n'
        },
        "entry-point-on-pythonpath": dist_info("timeout", where="src/"),
        "pytest-ini": {"pytest.ini": INI},  # ranks after pytest.toml, yet must not count
    }
    _assert_not_cheated(_grade(src_task, {"src/calc/plug.py": PLUG, **attacks[name]}))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("pyproject.toml", '[tool.pytest.ini_options]\npythonpath = ["src"]\n'),
        ("setup.cfg", "[tool:pytest]\npythonpath = src\n"),
        ("tox.ini", "[pytest]\npythonpath = src\n"),
        ("tests/pytest.ini", "[pytest]\npythonpath = ../src\n"),
    ],
)
def test_repository_config_is_honoured(tmp_path: Path, name, text):
    files = {
        name: text,
        "src/calc/__init__.py": "",
        "src/calc/ops.py": OPS,
        "tests/test_ops.py": TESTS,
    }
    task = make_task(tmp_path, files)
    assert _grade(task, {"src/calc/ops.py": FIXED}).resolved
    _assert_not_cheated(_grade(task, {"src/calc/plug.py": PLUG, ".pytest.ini": INI}))


def test_plugins_named_by_the_repository_config_come_from_the_environment(tmp_path: Path):
    # The task's own config loads an installed plugin by name and puts src/ on sys.path; a
    # dist-info there claiming that name must not be what loads.
    config = '[pytest]\npythonpath = ["src"]\naddopts = ["-p", "timeout"]\n'
    files = {
        "pytest.toml": config,
        "src/calc/__init__.py": "",
        "src/calc/ops.py": OPS,
        "tests/test_ops.py": TESTS,
    }
    task = make_task(tmp_path, files)
    assert _grade(task, {"src/calc/ops.py": FIXED}).resolved
    _assert_not_cheated(_grade(task, {"src/calc/plug.py": PLUG, **dist_info("timeout", "src/")}))


def test_installed_plugins_still_load_under_autoload(tmp_path: Path):
    tests = TESTS + (
        "\n\ndef test_plugins(pytestconfig):\n"
        "    assert pytestconfig.pluginmanager.hasplugin('timeout')\n"  # pytest-timeout
    )
    files = {"calc/__init__.py": "", "calc/ops.py": OPS, "tests/test_ops.py": tests}
    task = make_task(tmp_path, files, autoload=True)
    task.pass_to_pass = (*P2P, "tests/test_ops.py::test_plugins")
    result = _grade(task, {"calc/ops.py": FIXED})
    assert result.resolved, result.info()


# --------------------------------------------------------------------------- the runner alone


RUNNER_ATTACKS = {
    name: files
    for name, files in ATTACKS.items()
    if any(k.endswith(("ini", "toml", ".cfg")) for k in files)
}
RUNNER_ATTACKS["root-pytest-ini"] = {"pytest.ini": INI}


def _run_tree(tmp_path: Path, extra: dict, **kw):
    files = {
        "calc/__init__.py": "",
        "calc/ops.py": OPS,
        "tests/test_ops.py": TESTS,
        "calc/plug.py": PLUG,
        **extra,
    }
    work = tmp_path / "tree"
    write_files(work, {k: (v.encode() if isinstance(v, str) else v) for k, v in files.items()})
    return run_tests(work, [*F2P, *P2P], test_timeout_s=5.0, wall_s=60.0, **kw)


@pytest.mark.parametrize("name", list(RUNNER_ATTACKS))
def test_runner_ignores_config_files_in_the_tree(tmp_path, name):
    run = _run_tree(tmp_path, RUNNER_ATTACKS[name])
    assert run.statuses[ADD] == "failed", run.log
    assert run.statuses[P2P[0]] == "passed", run.log


def test_runner_ignores_bytecode_in_the_tree(tmp_path):
    run = _run_tree(tmp_path, forged_pyc("tests/test_ops.py"))
    assert run.statuses[ADD] == "failed", run.log


def test_runner_ignores_entry_points_in_the_tree(tmp_path):
    run = _run_tree(tmp_path, dist_info("evil"), autoload=True)
    assert run.statuses[ADD] == "failed", run.log


# --------------------------------------------------------------------------- disk


def _grade_watching_host(task: SweTask, changes: dict) -> tuple[object, int]:
    """Grade while sampling how much the grading dir holds on the host disk; (result, peak)."""
    parent = task.snapshot.parent / "grading"
    peak, done = [0], threading.Event()

    def watch() -> None:
        while not done.is_set():
            if parent.exists():
                peak[0] = max(peak[0], tree_bytes(parent))
            done.wait(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        result = _grade(task, changes)
    finally:
        done.set()
        watcher.join()
    return result, peak[0]


def test_tests_that_fill_the_disk_are_contained(task):
    # 40 x 16 MiB = 640 MiB into the repository copy, from inside the graded code.
    filler = FIXED.replace(
        "def add(a, b):\n    return a + b\n",
        "def add(a, b):\n    for i in range(40):\n        with open(f'fill-{i}.bin', 'wb') as f:\n"
        "            f.write(b'x' * (16 << 20))\n    return a + b\n",
    )
    result, peak = _grade_watching_host(task, {"calc/ops.py": filler})
    assert not result.resolved
    assert result.fail_to_pass == {ADD: "failed"}
    message = result.messages[ADD]
    assert "No space left on device" in message or "File too large" in message, message
    assert result.pass_to_pass == dict.fromkeys(P2P, "passed")  # the others still ran
    assert peak < 16 << 20, f"the grading dir reached {peak} bytes on the host disk"
    assert not any((task.snapshot.parent / "grading").iterdir())  # grading copy removed
