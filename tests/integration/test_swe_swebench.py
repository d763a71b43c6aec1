"""SWE-bench-format tasks against a local git checkout built here (nothing is downloaded)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from saorl.config import ConfigError, EnvConfig
from saorl.envs.factory import build_env
from saorl.envs.swe.grading import grade
from saorl.envs.swe.swebench import changes_from_patch, load_swebench

pytestmark = pytest.mark.slow

CORE = "def area(w, h):\n    return w + h\n\n\ndef perimeter(w, h):\n    return 2 * (w + h)\n"
TESTS = (
    "from widgets.core import perimeter\n\n\ndef test_perimeter():\n"
    "    assert perimeter(2, 3) == 10\n"
)
NEW_TEST = "\n\ndef test_area():\n    from widgets.core import area\n\n    assert area(2, 3) == 6\n"


def _git(repo: Path, *args: str) -> str:
    cmd = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", *args]
    return subprocess.run(cmd, check=True, capture_output=True, text=True).stdout


def _diff_of(repo: Path, path: str, content: str) -> str:
    """The diff that writes `content` to `path`, left uncommitted and then undone."""
    target = repo / path
    old = target.read_text()
    target.write_text(content)
    diff = _git(repo, "diff")
    target.write_text(old)
    return diff


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("repos")
    repo = root / "acme__widgets"
    (repo / "widgets").mkdir(parents=True)
    (repo / "tests").mkdir()
    (repo / "widgets" / "__init__.py").write_text("")
    (repo / "widgets" / "core.py").write_text(CORE)
    (repo / "tests" / "test_core.py").write_text(TESTS)
    (repo / "README.md").write_text("widgets v1\n")
    _git(repo, "init", "-q")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "base")
    base = _git(repo, "rev-parse", "HEAD").strip()
    test_patch = _diff_of(repo, "tests/test_core.py", TESTS + NEW_TEST)
    fixed = CORE.replace("return w + h\n\n\n", "return w * h\n\n\n")
    gold = _diff_of(repo, "widgets/core.py", fixed)
    (repo / "README.md").write_text("widgets v2 (after the base commit)\n")
    _git(repo, "commit", "-q", "-am", "later")
    row = {
        "instance_id": "acme__widgets-1",
        "repo": "acme/widgets",
        "base_commit": base,
        "problem_statement": "area() adds instead of multiplying",
        "FAIL_TO_PASS": json.dumps(["tests/test_core.py::test_area"]),  # as the HF dataset has it
        "PASS_TO_PASS": ["tests/test_core.py::test_perimeter"],
        "test_patch": test_patch,
        "patch": gold,
    }
    tasks_file = root / "tasks.jsonl"
    tasks_file.write_text(json.dumps(row) + "\n")
    return {"root": root, "file": tasks_file, "row": row, "cache": root / "cache"}


def test_loader_snapshot_at_base_commit_and_grading(setup):
    (task,) = load_swebench(setup["file"], setup["root"], setup["cache"])
    assert task.key == "acme__widgets-1"
    assert task.prompt == "area() adds instead of multiplying"
    assert task.fail_to_pass == ("tests/test_core.py::test_area",)
    assert "tests/test_core.py" in task.protected and task.answer == setup["row"]["patch"]
    base = task.base_dir()
    assert (base / "README.md").read_text() == "widgets v1\n"  # not the later commit
    assert "test_area" not in (base / "tests" / "test_core.py").read_text()  # test_patch hidden
    assert not (base / ".git").exists()
    kw = {"test_timeout_s": 5.0, "parent": setup["cache"] / "grading"}
    gold = changes_from_patch(task, task.answer)
    assert list(gold) == ["widgets/core.py"]
    result = grade(task, gold, **kw)
    assert result.resolved, result.info()
    assert result.info()["tests"] == {
        "tests/test_core.py::test_area": "passed",
        "tests/test_core.py::test_perimeter": "passed",
    }
    assert not grade(task, {}, **kw).resolved
    # Writing the new test file oneself (with a trivially passing test_area) is undone.
    fake = {"tests/test_core.py": (TESTS + "\n\ndef test_area():\n    assert True\n").encode()}
    cheat = grade(task, fake, **kw)
    assert not cheat.resolved and cheat.fail_to_pass["tests/test_core.py::test_area"] == "failed"


def test_env_factory_with_a_swebench_file(setup):
    cfg = EnvConfig(
        name="swe",
        eval_size=5,
        tool_format="hermes",
        swe={
            "source": "swebench",
            "tasks": str(setup["file"]),
            "repos_root": str(setup["root"]),
            "cache_dir": str(setup["cache"]),
        },
    )
    spec = build_env(cfg)
    assert [t.key for t in spec.task.held_out] == ["acme__widgets-1"]
    assert spec.stop == ("</tool_call>",) and spec.demo is None
    with pytest.raises(ValueError, match="no training tasks"):
        spec.task.sample(None)


def test_missing_repository_names_the_repo_and_paths(setup, tmp_path: Path):
    row = {**setup["row"], "repo": "acme/gadgets"}
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError) as err:
        load_swebench(bad, setup["root"], tmp_path / "cache")
    message = str(err.value)
    assert "'acme/gadgets' is not present under env.swe.repos_root" in message
    assert str(setup["root"] / "acme__gadgets") in message and "line 1" in message


@pytest.mark.parametrize(
    ("change", "error"),
    [
        ({"base_commit": "0" * 40}, "base_commit 0000000000000000000000000000000000000000 is not"),
        ({"FAIL_TO_PASS": "not json"}, "FAIL_TO_PASS must be a list"),
        ({"test_patch": None, "drop": "test_patch"}, "missing key(s) test_patch"),
    ],
)
def test_bad_rows_are_clear_errors(setup, tmp_path: Path, change, error):
    row = {**setup["row"], **change}
    if "drop" in change:
        row.pop(row.pop("drop"))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=error.replace("(", r"\(").replace(")", r"\)")):
        load_swebench(bad, setup["root"], tmp_path / "cache")
    with pytest.raises(ConfigError, match="is not a directory"):
        load_swebench(setup["file"], tmp_path / "nowhere", tmp_path / "cache")


def test_plugins_and_config_the_submission_adds_do_not_load(setup):
    """SWE-bench tasks load the environment's pytest plugins; none the repository offers."""
    (task,) = load_swebench(setup["file"], setup["root"], setup["cache"])
    assert task.plugin_autoload
    kw = {"test_timeout_s": 5.0, "parent": setup["cache"] / "grading"}
    plug = (
        "import pytest\n\n\n@pytest.hookimpl(hookwrapper=True)\n"
        "def pytest_runtest_makereport(item, call):\n"
        "    outcome = yield\n    outcome.get_result().outcome = 'passed'\n"
    )
    meta = "Metadata-Version: 2.1\nName: evil\nVersion: 1.0\n"
    cheats = [
        {
            "evil-1.0.dist-info/METADATA": meta,
            "evil-1.0.dist-info/entry_points.txt": "[pytest11]\nevil = widgets.plug\n",
        },
        {".pytest.ini": "[pytest]\naddopts = -p widgets.plug\n"},
    ]
    for cheat in cheats:
        changes = {k: v.encode() for k, v in {"widgets/plug.py": plug, **cheat}.items()}
        result = grade(task, changes, **kw)
        assert not result.resolved, result.info()
        assert result.fail_to_pass == {"tests/test_core.py::test_area": "failed"}
