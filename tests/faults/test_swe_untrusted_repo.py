"""A repository, a task row and a cache are hostile input until built and graded in the sandbox.

Each test plants one attack (issue 26, parts 1 and 2) and checks that it has no effect on the
host: the repository's `.git/config` naming commands (fsmonitor, external diff, textconv,
filters, hooks), build code reading a secret and writing outside its venv, a row whose `repo`
leaves `env.swe.repos_root`, a directory symlink out of the repository, a cache directory or
record someone else planted. docs/reliability.md's hostile-input table lists them.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.config import ConfigError, EnvConfig
from saorl.envs.swe.build_sandbox import checked_env
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.gen.generator import _version, generate_pool
from saorl.envs.swe.mine import MineOptions, mine
from saorl.envs.swe.spec import hermes_call
from saorl.envs.swe.swebench import load_swebench
from saorl.envs.swe.task import EnvSource, SweTask
from saorl.envs.swe.venv import EnvBuildError, ensure_env
from saorl.envs.swe.workspace import (
    UnsafeCacheDir,
    default_cache_dir,
    secure_cache_dir,
    unified_diff,
    write_files,
)
from tests._swe_repos import commit, git

pytestmark = pytest.mark.faults

CODE = "def area(w, h):\n    return w + h\n"
TESTS = "from geom import area\n\n\ndef test_one():\n    assert area(1, 1) > 0\n"


def _marker_script(path: Path, marker: Path) -> str:
    path.write_text(f'#!/bin/sh\necho {path.name} >> {marker}\n[ -f "$1" ] && cat "$1" || cat\n')
    path.chmod(0o755)
    return str(path)


def test_repository_git_config_runs_no_command_on_the_host(tmp_path: Path):
    repo, bin_dir, marker = tmp_path / "repos" / "geom", tmp_path / "bin", tmp_path / "MARKER"
    bin_dir.mkdir()
    files = {
        "geom/__init__.py": CODE,
        "tests/test_geom.py": TESTS,
        ".gitattributes": "*.py diff=evil filter=evil\n",
    }
    commit(repo, files, "initial")
    fixed = {
        "geom/__init__.py": CODE.replace("w + h", "w * h"),
        "tests/test_geom.py": TESTS + "\n\ndef test_two():\n    assert area(2, 3) == 6\n",
    }
    commit(repo, fixed, "fix area")
    script = functools.partial(_marker_script, marker=marker)
    hooks = repo / ".git" / "hooks"
    for hook in ("post-checkout", "reference-transaction", "pre-auto-gc", "post-index-change"):
        script(hooks / hook)
    for key, name in (
        ("core.fsmonitor", "fsmonitor"),
        ("diff.external", "extdiff"),
        ("diff.evil.textconv", "textconv"),
        ("filter.evil.clean", "clean"),
        ("filter.evil.smudge", "smudge"),
        ("filter.evil.process", "process"),
        ("core.pager", "pager"),
        ("core.hooksPath", None),
    ):
        value = str(hooks) if name is None else script(bin_dir / name)
        git(repo, "config", key, value)
    cfg = EnvConfig(
        name="swe", swe={"source": "swebench", "task_envs": "none", "test_timeout_s": 10.0}
    )
    cache, out = tmp_path / "cache", tmp_path / "tasks.jsonl"
    counts = mine(MineOptions(repo, out, jobs=1), cfg.swe, cache, log=lambda _: None)
    assert counts["written"] == 1, counts  # mined as usual: a snapshot, diffs, two test runs
    (task,) = load_swebench(out, tmp_path / "repos", cache)
    assert (task.base_dir() / "geom" / "__init__.py").read_text() == CODE
    assert not marker.exists(), marker.read_text()


SETUP_PY = """
import os
from pathlib import Path
from setuptools import setup

if os.environ.get("SAORL_TEST_SECRET"):
    raise SystemExit("the build saw the caller's secret")
for target in {targets!r}:
    try:
        Path(target).write_text("written by setup.py")
    except OSError:
        pass
setup(name="evil", version="0.1", py_modules=["evil"])
"""


def test_environment_build_sees_no_secret_and_writes_only_its_venv(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("SAORL_TEST_SECRET", "hunter2")
    outside = [tmp_path / "leak", tmp_path / "cache" / "leak", Path.home() / ".saorl-leak-test"]
    outside[-1].unlink(missing_ok=True)
    repo = tmp_path / "repos" / "evil"
    files = {"setup.py": SETUP_PY.format(targets=[str(p) for p in outside]), "evil.py": "X = 1\n"}
    c = commit(repo, files, "initial")
    cache = tmp_path / "cache"
    source = EnvSource("evil", str(repo), c)
    try:
        env = ensure_env(source, cache, ["--no-index", "--no-build-isolation"], 300)
    except EnvBuildError as e:
        pytest.fail(f"the build failed: {e}")
    assert Path(env.python).exists()
    for path in outside:
        assert not path.exists(), f"the build wrote {path}"


def test_a_row_whose_repo_leaves_the_repos_root_is_refused(tmp_path: Path, capsys):
    root, private = tmp_path / "repos", tmp_path / "private"
    root.mkdir()
    c = commit(private, {"a.py": "x = 1\n"}, "secret project")
    for n, repo in enumerate(["../private", f"x/{private}", "/abs", "..", "a/../../private"]):
        row = {
            "instance_id": f"i{n}",
            "repo": repo,
            "base_commit": c,
            "problem_statement": "p",
            "FAIL_TO_PASS": [],
            "PASS_TO_PASS": [],
            "test_patch": "",
        }
        path = tmp_path / f"rows{n}.jsonl"
        path.write_text(json.dumps(row) + "\n")
        with pytest.raises(ConfigError, match=r"line 1: repo .* is not a repository name"):
            load_swebench(path, root, tmp_path / "cache")
    cache = f"env.swe.cache_dir={tmp_path / 'cache'}"
    assert main(["swe-validate", str(path), "--repos-root", str(root), cache]) == 2
    assert f"{path} line 1: repo {repo!r} is not a repository name" in capsys.readouterr().err


def test_moving_names_are_refused_and_snapshots_are_per_repository(tmp_path: Path):
    root = tmp_path / "repos"
    commits = {name: commit(root / name, {"a.py": f"name = {name!r}\n"}, "one") for name in "ab"}
    row = {
        "instance_id": "same-id",
        "base_commit": "HEAD",
        "problem_statement": "p",
        "FAIL_TO_PASS": [],
        "PASS_TO_PASS": [],
        "test_patch": "",
    }
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps({**row, "repo": "a"}) + "\n")
    with pytest.raises(ConfigError, match="base_commit 'HEAD' is not a commit id"):
        load_swebench(path, root, tmp_path / "cache")
    rows = [{**row, "repo": n, "base_commit": commits[n][:12]} for n in "ab"]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    a, b = load_swebench(path, root, tmp_path / "cache")
    assert a.snapshot != b.snapshot and commits["a"] in a.snapshot.name  # the full commit id
    assert (b.base_dir() / "a.py").read_text() == "name = 'b'\n"


def _fill_with_link(dest: Path, target: str) -> None:
    write_files(
        dest, {"pkg/__init__.py": b"x = 1\n", "tests/test_x.py": b"def test_x():\n  x = 1\n"}
    )
    os.symlink(target, dest / "up")


def test_a_directory_link_out_of_the_repository_never_reaches_the_diff(tmp_path: Path):
    host = tmp_path / "host"
    host.mkdir()
    (host / "secret.txt").write_text("TOP-SECRET host file\n")
    task = SweTask(
        key="link-1",
        prompt="p",
        fail_to_pass=("tests/test_x.py::test_x",),
        pass_to_pass=(),
        snapshot=tmp_path / "cache" / "snap",
        fill=functools.partial(_fill_with_link, target=str(host)),
    )
    base = task.base_dir()
    assert (base / "up" / "secret.txt").read_text().startswith("TOP-SECRET")  # the link works
    assert "TOP-SECRET" not in unified_diff(base, {"up/secret.txt": b"changed\n"})
    # the same through an episode: the agent replaces the link by a directory of its own
    env = SweEnv("hermes", work_dir=tmp_path / "work", test_timeout_s=5.0)
    cmd = "rm up && mkdir up && echo changed > up/secret.txt"

    async def go() -> dict:
        await env.reset(task)
        await env.step(hermes_call("bash", command=cmd))
        return (await env.step(hermes_call("submit"))).info

    info = asyncio.run(go())
    assert "up/secret.txt" in info["changed_files"]
    assert "TOP-SECRET" not in info["patch"] and "+changed" in info["patch"]


def test_the_default_cache_is_per_user_and_private(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    path = secure_cache_dir(default_cache_dir())
    assert path == tmp_path / "xdg" / "saorl" / "swe"
    assert all((p.stat().st_mode & 0o777) == 0o700 for p in (path, path.parent))
    monkeypatch.delenv("XDG_CACHE_HOME")
    assert default_cache_dir() == Path.home() / ".cache" / "saorl" / "swe"
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UnsafeCacheDir, match="writable by group or others"):
        secure_cache_dir(shared)
    if os.getuid() == 0:  # another user's folder, made as root can
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 65534, 65534)
        with pytest.raises(UnsafeCacheDir, match="owned by uid 65534"):
            secure_cache_dir(theirs / "swe")


def test_planted_cache_records_choose_no_path(tmp_path: Path):
    cache = tmp_path / "cache"
    held, _ = generate_pool(21, 1, 0, cache)
    record_path = cache / "generated" / f"records-{_version()}" / "21-0.json"
    record = json.loads(record_path.read_text())
    outside = tmp_path / "outside.txt"
    record["files"]["../../../outside.txt"] = "planted\n"  # from cache/generated/<snapshot>
    record["files"][str(tmp_path / "abs.txt")] = "planted\n"
    record_path.write_text(json.dumps(record))
    again, _ = generate_pool(21, 1, 0, cache)
    again[0].base_dir()
    assert not outside.exists() and not (tmp_path / "abs.txt").exists()
    assert again[0].key == held[0].key  # the forged record was made again
    with pytest.raises(ValueError, match="not a plain relative path"):
        write_files(tmp_path / "w", {"../x": b""})


def test_a_forged_environment_record_is_not_used(tmp_path: Path):
    envdir = tmp_path / "envs" / "k"
    good = {"venv": str(envdir / "venv"), "roots": ["src", "."], "plugins": ["p"], "key": "k"}
    assert checked_env(good, envdir) is not None
    for bad in (
        {"roots": ["../../.."]},
        {"roots": ["/etc"]},
        {"venv": "/usr"},
        {"plugins": ["x y"]},
        {"roots": "src"},
    ):
        assert checked_env({**good, **bad}, envdir) is None, bad
