"""What a task environment installs, read from the repository's own files, and the pieces of
task mining and validation that need no sandbox (the whole path: tests/integration/
test_swe_real_repos.py)."""

from __future__ import annotations

import pytest

from saorl.config import ConfigError, load_config
from saorl.envs.swe.mine import is_test_file, is_test_module
from saorl.envs.swe.task import EnvSource, TaskEnv
from saorl.envs.swe.validate import Validation, table
from saorl.envs.swe.venv import InstallPlan, env_key, install_plan

BUILD = b'[build-system]\nrequires = ["setuptools"]\nbuild-backend = "setuptools.build_meta"\n'


@pytest.mark.parametrize(
    ("files", "plan", "targets"),
    [
        # pyproject metadata with a test extra (among others): -e .[test]
        (
            {
                "pyproject.toml": BUILD
                + b'[project]\nname = "a"\n[project.optional-dependencies]\n'
                b'docs = ["x"]\ntest = ["pytest"]\ndev = ["y"]\n'
            },
            InstallPlan(True, ("test",), ()),
            ["-e", ".[test]"],
        ),
        # extras from setup.cfg; requirement files for tests come along
        (
            {
                "setup.py": b"from setuptools import setup\nsetup()\n",
                "setup.cfg": b"[metadata]\nname = a\n[options.extras_require]\ntesting = pytest\n",
                "requirements-test.txt": b"hypothesis\n",
            },
            InstallPlan(True, ("testing",), ("requirements-test.txt",)),
            ["-e", ".[testing]", "-r", "requirements-test.txt"],
        ),
        # setup.py is never run to read extras: its dict keys are found by their text
        (
            {"setup.py": b"setup(extras_require={'tests': ['pytest'], 'dev': ['tox']})\n"},
            InstallPlan(True, ("tests",), ()),
            ["-e", ".[tests]"],
        ),
        # neither test extras nor test files: the dev extra and dev requirements
        (
            {
                "pyproject.toml": BUILD
                + b'[project]\nname = "a"\n[project.optional-dependencies]\n'
                b'dev = ["pytest"]\n',
                "requirements-dev.txt": b"tox\n",
            },
            InstallPlan(True, ("dev",), ("requirements-dev.txt",)),
            ["-e", ".[dev]", "-r", "requirements-dev.txt"],
        ),
        # no project metadata (a pyproject.toml of tool settings only): requirement files
        (
            {
                "pyproject.toml": b"[tool.black]\nline-length = 99\n",
                "requirements.txt": b"numpy\n",
                "test-requirements.txt": b"pytest\n",
            },
            InstallPlan(False, (), ("requirements.txt", "test-requirements.txt")),
            ["-r", "requirements.txt", "-r", "test-requirements.txt"],
        ),
        # PEP 735 dependency groups (uv projects): their requirements, includes resolved
        (
            {
                "pyproject.toml": BUILD + b'[project]\nname = "a"\n[dependency-groups]\n'
                b'base = ["freezegun"]\ntests = ["pytest", {include-group = "base"}]\n'
                b'docs = ["sphinx"]\n'
            },
            InstallPlan(True, (), (), ("pytest", "freezegun")),
            ["-e", ".", "pytest", "freezegun"],
        ),
        # older projects: tox.ini's [testenv] deps (no factor lines, options or substitutions)
        (
            {
                "setup.py": b"setup()\n",
                "tox.ini": b"[tox]\nenvlist = py3\n[testenv]\ndeps =\n"
                b"    pytest-cov\n    freezegun  # time\n    py27: mock\n    -r{toxinidir}/x.txt\n",
            },
            InstallPlan(True, (), (), ("pytest-cov", "freezegun")),
            ["-e", ".", "pytest-cov", "freezegun"],
        ),
        ({}, InstallPlan(False, (), ()), []),  # a plain repository: nothing to install
    ],
)
def test_install_plan_follows_the_repository_metadata(files, plan, targets):
    assert install_plan(files) == plan
    assert plan.pip_targets() == targets


def test_env_key_changes_with_every_install_input():
    source = EnvSource("acme/geom", "/repos/acme__geom", "a" * 40)
    files = {"pyproject.toml": BUILD}
    plan = install_plan(files)
    key = env_key(source, files, plan, [])
    assert key.startswith("acme__geom-aaaaaaaaaaaa-") and len(key.rsplit("-", 1)[1]) == 16
    assert env_key(source, files, plan, []) == key  # deterministic
    others = [
        env_key(source, {"pyproject.toml": BUILD + b"\n"}, plan, []),
        env_key(source, files, plan, ["--no-index"]),
        env_key(EnvSource("acme/geom", "/elsewhere", "b" * 40), files, plan, []),
    ]
    assert len({key, *others}) == 4


def test_task_env_puts_the_venv_and_import_roots_first():
    env = TaskEnv("/cache/envs/k/venv", ("src", "."), (), "k")
    assert env.python == "/cache/envs/k/venv/bin/python"
    assert env.sandbox_env() == {
        "PATH": "/cache/envs/k/venv/bin:/usr/local/bin:/usr/bin:/bin",
        "VIRTUAL_ENV": "/cache/envs/k/venv",
        "PYTHONPATH": "/sandbox/src:/sandbox",
    }


@pytest.mark.parametrize(
    ("path", "test_file", "module"),
    [
        ("tests/test_core.py", True, True),
        ("src/pkg/core_test.py", True, True),
        ("tests/helpers.py", True, False),
        ("testing/conftest.py", True, False),
        ("src/pkg/testing.py", False, False),
        ("src/pkg/core.py", False, False),
        ("tests/data.json", False, False),
    ],
)
def test_test_files_are_told_from_code(path, test_file, module):
    assert is_test_file(path) is test_file
    assert is_test_module(path) is module


def test_validation_table():
    rows = [
        Validation("acme__geom-1", "valid", "", 2.25),
        Validation("b-2", "env_error", "environment build failed: x\nERROR: y", 0.0),
        Validation("c-3", "invalid", "r" * 200, 1.0, cached=True),
    ]
    lines = table(rows).splitlines()
    assert lines[0].split() == ["task", "status", "reason", "seconds"]
    assert lines[1].split() == ["acme__geom-1", "valid", "-", "2.2"]
    assert lines[2].split()[:4] == ["b-2", "env_error", "environment", "build"]  # first line
    assert lines[3].endswith("...  1.0 cached") and len(lines[3].split()[2]) == 120


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match=r"env\.swe\.pip_args"):
        load_config(None, ["env.swe.pip_args=--find-links 'unclosed"])
    with pytest.raises(ConfigError, match=r"env\.swe\.task_envs"):
        load_config(None, ["env.swe.task_envs=conda"])
