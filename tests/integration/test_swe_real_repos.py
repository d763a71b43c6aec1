"""The coding agent on real repositories: git histories built here (a `src/` layout with a test
dependency from a local wheel, a plain layout with requirement files, a namespace package),
through the whole path: per-task environment, mining, validation, an episode, grading."""

from __future__ import annotations

import asyncio
import json
import logging
import re
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.config import ConfigError, EnvConfig
from saorl.envs.factory import build_env
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.grading import grade
from saorl.envs.swe.mine import MineOptions, mine
from saorl.envs.swe.spec import hermes_call
from saorl.envs.swe.swebench import changes_from_patch, load_swebench
from saorl.envs.swe.task import EnvSource
from saorl.envs.swe.validate import check_tasks, prepare_tasks
from saorl.envs.swe.venv import attach_envs, ensure_env
from tests._swe_repos import build_all, git

pytestmark = pytest.mark.slow

KW = {"test_timeout_s": 10.0, "wall_s": 120.0}


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("swe-real")
    s = build_all(root)
    s["cache"] = root / "cache"
    s["cfg"] = EnvConfig(
        name="swe",
        tool_format="hermes",
        eval_size=1,
        swe={
            "source": "swebench",
            "pip_args": s["pip_args"],
            "cache_dir": str(s["cache"]),
            "test_timeout_s": 10.0,
        },
    )
    return s


@pytest.fixture(scope="module")
def mined(setup: dict) -> dict:
    out = setup["root"] / "tasks.jsonl"
    logs: list[str] = []
    counts = {}
    for name in ("geom", "shapes", "acme-tools"):
        opts = MineOptions(setup["repos"] / name, out, jobs=2)
        counts[name] = mine(opts, setup["cfg"].swe, setup["cache"], log=logs.append)
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    return {"out": out, "rows": {r["repo"]: r for r in rows}, "counts": counts, "logs": logs}


def _tasks(setup: dict, path: Path) -> list:
    return load_swebench(path, setup["repos"], setup["cache"])


def _geom(setup: dict, mined: dict):
    (task,) = [t for t in _tasks(setup, mined["out"]) if t.key.startswith("geom-")]
    (task,), failed = attach_envs([task], setup["cache"], setup["pip_args"].split())
    assert not failed
    return task


def test_environment_of_a_src_layout_repository(setup: dict):
    repo = setup["repos"] / "geom"
    source = EnvSource("geom", str(repo), setup["commits"]["geom_init"])
    env = ensure_env(source, setup["cache"], setup["pip_args"].split())
    assert env.roots == ("src",)  # the editable install's path, relative to the repository
    assert env.plugins == ("approxeq",)  # the test dependency's pytest11 plugin, by name
    venv = Path(env.venv)
    envdir = venv.parent
    purelib = next(venv.glob("lib/python3*/site-packages"))
    assert (purelib / "approxeq.py").is_file()  # from the local wheel (--no-index)
    assert list(purelib.glob("geom-0.1.dist-info"))
    # Detached: nothing in the venv points at the build copy, which is gone.
    assert not list(purelib.glob("__editable__*")) and not (envdir / "build").exists()
    assert "build" not in "".join(p.read_text() for p in purelib.glob("*.pth"))
    assert (venv / "bin" / "pytest").is_file()
    ready = json.loads((envdir / "ready.json").read_text())
    assert ready["plan"]["editable"] and ready["plan"]["extras"] == ["test"]
    log_mtime = (envdir / "build.log").stat().st_mtime_ns
    again = ensure_env(source, setup["cache"], setup["pip_args"].split())
    assert again == env and (envdir / "build.log").stat().st_mtime_ns == log_mtime  # reused
    # A half-built directory (no ready marker) is never used: it is rebuilt.
    (envdir / "ready.json").unlink()
    from saorl.envs.swe import venv as venv_module

    venv_module._memo.clear()
    rebuilt = ensure_env(source, setup["cache"], setup["pip_args"].split())
    assert rebuilt == env and (envdir / "ready.json").is_file()


def test_mining_finds_the_fix_and_its_tests(setup: dict, mined: dict):
    c = setup["commits"]
    row = mined["rows"]["geom"]
    assert row["instance_id"] == f"geom-{c['geom_fix'][:12]}"
    assert row["base_commit"] == c["geom_init"]
    assert row["environment_setup_commit"] == c["geom_init"]  # last pyproject change
    assert row["FAIL_TO_PASS"] == ["tests/test_core.py::test_area"]
    assert row["PASS_TO_PASS"] == [
        "tests/test_core.py::test_perimeter",
        "tests/test_core.py::test_warnings_are_errors",
    ]
    assert row["problem_statement"].startswith("Fix area() for rectangles\n\narea() added")
    assert "diff --git a/src/geom/core.py" in row["patch"] and "tests/" not in row["patch"]
    assert (
        "diff --git a/tests/test_core.py" in row["test_patch"] and "src/" not in row["test_patch"]
    )
    assert mined["counts"]["geom"] == {
        "examined": 4,
        "written": 1,
        "already_in_out": 0,
        "not_candidates": 2,
        "rejected": 1,
    }
    refactor = c["geom_refactor"][:12]
    assert any(
        refactor in line and "no test goes from failing to passing" in line
        for line in mined["logs"]
    )
    shapes, acme = mined["rows"]["shapes"], mined["rows"]["acme-tools"]  # plain, namespace
    assert shapes["FAIL_TO_PASS"] == ["tests/test_circle.py::test_unit"]
    assert shapes["PASS_TO_PASS"] == ["tests/test_circle.py::test_zero"]
    # A merged pull request is one task: the merge against its first parent, the merged
    # commits' messages in the problem statement.
    assert acme["instance_id"] == f"acme-tools-{c['acme_merge'][:12]}"
    statement = "Merge pull request #1 from fix-spaces\n\nslug() keeps spaces"
    assert acme["problem_statement"] == statement
    assert acme["FAIL_TO_PASS"] == ["tests/test_slug.py::test_spaces"]
    assert acme["PASS_TO_PASS"] == ["tests/test_slug.py::test_lower"]
    # Resumable: a second run appends nothing and redoes no rejected commit.
    before = mined["out"].read_text()
    logs: list[str] = []
    counts = mine(
        MineOptions(setup["repos"] / "geom", mined["out"]),
        setup["cfg"].swe,
        setup["cache"],
        log=logs.append,
    )
    assert counts["written"] == 0 and counts["already_in_out"] == 1
    assert mined["out"].read_text() == before


def test_plain_and_namespace_layouts_get_their_import_roots(setup: dict, mined: dict):
    tasks = {t.key.split("-")[0]: t for t in _tasks(setup, mined["out"])}
    ready, failed = attach_envs(list(tasks.values()), setup["cache"], setup["pip_args"].split())
    assert not failed
    envs = {t.key.split("-")[0]: t.env for t in ready}
    assert envs["shapes"].roots == (".",) and envs["shapes"].plugins == ("approxeq",)
    # acme.tools: the setuptools import hook maps it to ./acme/tools; its own pytest11 plugin
    # (which would deselect every test) is not among those grading loads.
    assert envs["acme"].roots == (".",) and envs["acme"].plugins == ()


def test_validation_gold_resolves_and_empty_does_not(setup: dict, mined: dict, tmp_path: Path):
    row = mined["rows"]["geom"]
    bad_rows = [
        {**row, "instance_id": "already-passing", "FAIL_TO_PASS": row["PASS_TO_PASS"][:1]},
        {**row, "instance_id": "no-gold", "patch": ""},
        {
            **row,
            "instance_id": "wrong-gold",
            "patch": row["patch"].replace("return w * h", "return w - h"),
        },
    ]
    path = tmp_path / "tasks.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*mined["rows"].values(), *bad_rows]))
    results = {
        v.key: v for _, v in check_tasks(_tasks(setup, path), setup["cfg"].swe, setup["cache"])
    }
    valid = {k for k, v in results.items() if v.status == "valid"}
    assert valid == {r["instance_id"] for r in mined["rows"].values()}
    assert "an empty patch resolves it" in results["already-passing"].reason
    assert "no gold patch" in results["no-gold"].reason
    wrong = results["wrong-gold"].reason
    assert "does not resolve" in wrong and "tests/test_core.py::test_area failed" in wrong
    again = check_tasks(_tasks(setup, path), setup["cfg"].swe, setup["cache"])
    assert all(v.cached for _, v in again)  # verdicts read back from the cache
    # Without the per-task environment (the symptom): the repository is not
    # installed, its test dependency is missing, so even the gold patch does not resolve.
    bare = setup["cfg"].model_copy(
        update={"swe": setup["cfg"].swe.model_copy(update={"task_envs": "none"})}
    )
    task = next(t for t in _tasks(setup, mined["out"]) if t.key == row["instance_id"])
    ((_, verdict),) = check_tasks([task], bare.swe, setup["cache"])
    assert verdict.status == "invalid"
    assert "ModuleNotFoundError: No module named 'approxeq'" in verdict.reason


def test_swe_validate_cli(setup: dict, mined: dict, tmp_path: Path, capsys):
    common = [
        "--repos-root",
        str(setup["repos"]),
        f"env.swe.pip_args={setup['pip_args']}",
        f"env.swe.cache_dir={setup['cache']}",
    ]
    assert main(["swe-validate", str(mined["out"]), *common]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["task", "status", "reason", "seconds"]
    assert sum(" valid " in line for line in lines) == 3 and "3 of 3 task(s) valid" in out
    row = {**mined["rows"]["geom"], "instance_id": "no-gold", "patch": ""}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(mined["out"].read_text() + json.dumps(row) + "\n")
    assert main(["swe-validate", str(mixed), *common]) == 1
    assert re.search(r"no-gold +invalid +no gold patch", capsys.readouterr().out)
    assert main(["swe-validate", str(tmp_path / "missing.jsonl"), *common]) == 2
    assert "is not a file" in capsys.readouterr().err


def _step(env: SweEnv, name: str, **arguments: object):
    return asyncio.run(env.step(hermes_call(name, **arguments)))


def test_an_episode_runs_in_the_task_environment(setup: dict, mined: dict):
    task = _geom(setup, mined)
    env = SweEnv(
        "hermes",
        max_turns=8,
        max_tool_calls=8,
        test_timeout_s=10.0,
        work_dir=setup["cache"] / "work",
    )
    asyncio.run(env.reset(task))
    code = "import geom, approxeq, sys; print(geom.__file__); print(sys.prefix)"
    obs = _step(env, "bash", command=f'python -c "{code}"').observations[0]["content"]
    assert "/sandbox/src/geom/__init__.py" in obs and task.env.venv in obs
    # `pytest` is the venv's: the test dependency's plugin (fixture `tolerance`) and the
    # repository's config (warnings are errors) both apply.
    obs = _step(env, "bash", command="pytest -q tests 2>&1 | tail -1").observations[0]["content"]
    assert "2 passed" in obs, obs
    obs = _step(env, "bash", command='touch "$VIRTUAL_ENV/x"').observations[0]["content"]
    assert "Read-only file system" in obs
    _step(env, "str_replace", path="src/geom/core.py", old="return w + h", new="return w * h")
    result = _step(env, "submit")
    assert result.done and result.reward == 1.0, result.info
    assert set(result.info["tests"].values()) == {"passed"} and len(result.info["tests"]) == 3


def test_the_base_commit_pytest_config_applies(setup: dict, mined: dict):
    task = _geom(setup, mined)
    gold = changes_from_patch(task, task.answer)
    config = (task.base_dir() / "pyproject.toml").read_text()
    # Dropping `filterwarnings = error` would fail test_warnings_are_errors: it is ignored.
    loose = {**gold, "pyproject.toml": config.replace('["error::UserWarning"]', "[]").encode()}
    assert grade(task, loose, **KW).resolved
    # Deselecting the failing test instead of fixing it does not pass it either.
    skip = config + '\naddopts = "--deselect tests/test_core.py::test_area"\n'
    result = grade(task, {"pyproject.toml": skip.encode()}, **KW)
    assert not result.resolved and result.fail_to_pass["tests/test_core.py::test_area"] == "failed"


def test_a_task_whose_environment_fails_is_reported_and_left_out(
    setup: dict, mined: dict, tmp_path: Path, caplog
):
    c, repo = setup["commits"], setup["repos"] / "broken"
    diff = ["diff", c["broken_init"], c["broken_fix"], "--"]
    broken = {
        "instance_id": "broken-1",
        "repo": "broken",
        "base_commit": c["broken_init"],
        "problem_statement": "area() adds",
        "patch": git(repo, *diff, "src"),
        "test_patch": git(repo, *diff, "tests"),
        "FAIL_TO_PASS": ["tests/test_core.py::test_area"],
        "PASS_TO_PASS": ["tests/test_core.py::test_perimeter"],
    }
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps(broken) + "\n" + json.dumps(mined["rows"]["geom"]) + "\n")
    checked = dict(
        (t.key, v) for t, v in check_tasks(_tasks(setup, path), setup["cfg"].swe, setup["cache"])
    )
    assert checked["broken-1"].status == "env_error"
    assert "No matching distribution found for no-such-dep-xyz" in checked["broken-1"].reason
    with caplog.at_level(logging.WARNING, logger="saorl.envs.swe.validate"):
        kept = prepare_tasks(_tasks(setup, path), setup["cfg"].swe, setup["cache"])
    assert [t.key for t in kept] == [mined["rows"]["geom"]["instance_id"]] and kept[0].env
    assert "1 of 2 tasks left out" in caplog.text and "no-such-dep-xyz" in caplog.text
    only_broken = tmp_path / "broken.jsonl"
    only_broken.write_text(json.dumps(broken) + "\n")
    with pytest.raises(ConfigError, match="none of the 1 tasks is usable"):
        prepare_tasks(_tasks(setup, only_broken), setup["cfg"].swe, setup["cache"])
    # Training and evaluation see only the usable tasks, each with its environment.
    cfg = setup["cfg"].model_copy(
        update={
            "swe": setup["cfg"].swe.model_copy(
                update={"tasks": str(path), "repos_root": str(setup["repos"])}
            )
        }
    )
    spec = build_env(cfg, held_out_only=True)
    assert [t.key for t in spec.task.held_out] == [mined["rows"]["geom"]["instance_id"]]
    assert spec.task.held_out[0].env == kept[0].env
