"""No child interpreter saorl starts imports a `./saorl/` planted in the current directory.

Each test runs in a folder holding a `saorl` package (and `torch`, `math_verify`) that writes a
marker file when imported, starts one kind of child (the process-pool worker, the math grader
worker, the isolated `python -c` / `-m` of `saorl.security.child_python` that `saorl compare` and
the verifiers runner use) and checks that the child works and the marker never appears.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import OrderedDict
from pathlib import Path

import pytest

import saorl
from saorl.distributed.proc_actor import ProcessActor
from saorl.envs.math.worker import Worker
from saorl.security.child_python import SAORL_ROOT, module_argv, python_argv


@pytest.fixture
def planted(tmp_path: Path, monkeypatch) -> Path:
    """The current directory is a folder with planted packages; returns the marker path."""
    marker = tmp_path / "MARKER"
    cwd = tmp_path / "cwd"
    for name in ("saorl", "torch", "math_verify"):
        (cwd / name).mkdir(parents=True)
        (cwd / name / "__init__.py").write_text(
            f"open({str(marker)!r}, 'a').write({name!r} + ' imported\\n')\n"
        )
    monkeypatch.chdir(cwd)
    # What a user's shell may hold: the current directory on PYTHONPATH, a startup file.
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([".", os.environ.get("PYTHONPATH", "")]))
    (cwd / "startup.py").write_text(f"open({str(marker)!r}, 'a').write('startup\\n')\n")
    monkeypatch.setenv("PYTHONSTARTUP", str(cwd / "startup.py"))
    return marker


def test_the_process_pool_worker_ignores_the_current_directory(planted: Path):
    actor = ProcessActor("probe", OrderedDict, [("a", 1)])
    try:
        actor.wait_started()
        assert actor.call("get", "a") == 1
    finally:
        actor.close()
    assert not planted.exists(), planted.read_text()


def test_the_math_grader_worker_ignores_the_current_directory(planted: Path):
    worker = Worker(startup_timeout_s=120)
    try:
        assert worker.process.poll() is None
    finally:
        worker.kill()
    assert not planted.exists(), planted.read_text()


@pytest.mark.parametrize("python", [None, "other"])
def test_isolated_python_children_import_this_saorl(planted: Path, python: str | None):
    # "other": another interpreter path (a venv of its own) keeps its path, saorl's first.
    exe = None if python is None else os.path.realpath(sys.executable)
    out = subprocess.run(
        python_argv("import saorl, sys; print(saorl.__file__)", python=exe),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.strip() == saorl.__file__
    assert Path(saorl.__file__).is_relative_to(SAORL_ROOT)
    # `-m` semantics (`saorl compare` starts `saorl.experiments.compare` so): argv passed on.
    out = subprocess.run(
        module_argv("json.tool", "--sort-keys", "--compact", python=exe),
        input='{"b": 1, "a": 2}',
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert out.strip() == '{"a":2,"b":1}'
    assert not planted.exists(), planted.read_text()
