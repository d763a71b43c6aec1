"""Hostile tool calls and hostile trees in the coding environment, with the real sandbox.

Whatever a model turn asks for and whatever its commands leave in the repository copy (nests
deeper than the recursion limit or PATH_MAX, names that are not UTF-8, symlink loops, links out
of the tree, fifos, sockets, millions of empty entries), `step` answers with an observation or
a grade, never an exception, and the episode's copies are gone once it ends. The README's
reliability table lists these cases.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import tempfile
from pathlib import Path

import pytest

from saorl.envs.base import StepResult
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.gen.generator import generate_pool
from saorl.envs.swe.spec import hermes_call
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.tools import ToolRunner
from saorl.envs.swe.workspace import collect_changes, copy_tree, remove_tree, tree_bytes
from saorl.sandbox import ExecResult, run, run_python

pytestmark = pytest.mark.faults

DEEP = 1200  # deeper than Python's recursion limit, shorter than PATH_MAX
VERY_DEEP = 2500  # 'dd/' * 2500: longer than PATH_MAX (4096)


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> SweTask:
    held, _ = generate_pool(21, 1, 0, tmp_path_factory.mktemp("swe-cache"))
    return held[0]


def _episode(task: SweTask, parent: Path, turns: list[str], **env_kw) -> list[StepResult]:
    """Drive `turns` through a fresh env; assert the episode's copies are gone at its end."""
    env = SweEnv("hermes", work_dir=parent, test_timeout_s=5.0, **env_kw)
    works: list[Path] = []

    async def go() -> list[StepResult]:
        await env.reset(task)
        out = []
        for turn in turns:
            out.append(await env.step(turn))
            if env.work is not None and env.work not in works:
                works.append(env.work)
            if out[-1].done:
                break
        return out

    results = asyncio.run(go())
    assert results[-1].done, "the script must end the episode"
    for work in works:
        assert not os.path.lexists(work), f"{work} was left on the host"
    assert list(parent.glob("saorl-swe-*")) == [], "a copy of the episode was left on the host"
    return results


def _py(code: str) -> str:
    return hermes_call("bash", command=f"python3 -c {shlex.quote(code)}")


def _nest(depth: int, name: str = "d") -> str:
    """A command that nests `depth` directories (chdir by chdir, so PATH_MAX does not stop it)
    and leaves a file and a symlink loop at the bottom."""
    return _py(
        f"import os\nfor _ in range({depth}):\n    os.mkdir({name!r}); os.chdir({name!r})\n"
        "open('deep.py', 'w').write('x = 1\\n'); os.symlink('loop', 'loop')\nprint('nested')"
    )


# -- trees the agent makes --------------------------------------------------------------------
@pytest.mark.parametrize("depth", [DEEP, VERY_DEEP], ids=["recursion_limit", "path_max"])
def test_deep_nest_is_measured_graded_and_deleted(task, tmp_path: Path, depth: int):
    results = _episode(task, tmp_path, [_nest(depth, "dd"), hermes_call("submit")])
    made, graded = results
    assert not made.done and made.info["tool_status"] == "ok"
    assert made.observations[0]["content"] == "nested"
    assert graded.done and graded.reward == 0.0 and graded.info["submitted"] == "tool"
    assert "grade_error" not in graded.info, graded.info
    assert graded.info["changed_files"] == []  # a path that long is never a change


def test_deep_nest_over_the_disk_budget_ends_the_episode(task, tmp_path: Path):
    results = _episode(task, tmp_path, [_nest(VERY_DEEP)], max_growth_bytes=1 << 20)
    assert results[0].done and "grew past" in results[0].info["grade_error"]


def test_many_empty_entries_count_against_the_disk_budget(task, tmp_path: Path):
    make = _py("import os\nfor i in range(3000):\n    open(f'e{i}', 'w').close()")
    results = _episode(task, tmp_path, [make], max_growth_bytes=1 << 20)
    assert results[0].done and "grew past" in results[0].info["grade_error"]


def test_names_that_are_not_utf8_are_graded(task, tmp_path: Path):
    make = hermes_call(
        "bash",
        command="printf 'x = 1\\n' > $'bad\\xff.py' && mkdir $'dir\\xfe' && "
        "printf 'y\\n' > $'dir\\xfe/f.txt' && ls | wc -l",
    )
    made, listed, graded = _episode(
        task, tmp_path, [make, hermes_call("view", path="."), hermes_call("submit")]
    )
    assert made.info["tool_status"] == "ok"
    assert "\n  bad\\xff.py\n" in listed.observations[0]["content"]
    assert graded.done and "grade_error" not in graded.info, graded.info
    assert graded.info["changed_files"] == ["bad\\xff.py", "dir\\xfe/f.txt"]
    assert "b/bad\\xff.py" in graded.info["patch"]
    json.dumps(graded.info, ensure_ascii=False).encode("utf-8")  # valid text throughout


def test_gold_fix_beside_a_non_utf8_name_still_resolves(task, tmp_path: Path):
    path, old, new = task.edit
    turns = [
        hermes_call("bash", command="printf 'junk' > $'\\x80\\x81'"),
        hermes_call("str_replace", path=path, old=old, new=new),
        hermes_call("submit"),
    ]
    *_, graded = _episode(task, tmp_path, turns)
    assert graded.reward == 1.0, graded.info


def test_links_out_loops_fifos_and_sockets(task, tmp_path: Path):
    make = _py(
        "import os, socket\nos.symlink('/etc', 'etc'); os.symlink('/etc/hostname', 'host.py')\n"
        "os.symlink('a', 'b'); os.symlink('b', 'a'); os.symlink('self', 'self')\n"
        "os.mkfifo('fifo'); os.mkdir('sub'); os.mkfifo('sub/fifo.py')\n"
        "socket.socket(socket.AF_UNIX).bind('sock')\nos.symlink('..', 'sub/up')\nprint('made')"
    )
    turns = [make]
    turns += [hermes_call("view", path=p) for p in ("etc", "host.py", "a", "self", "fifo", "sock")]
    turns += [hermes_call("view", path="."), hermes_call("view", path="sub/up/sub/up")]
    turns += [hermes_call("str_replace", path="fifo", old="a", new="b")]
    turns += [hermes_call("create", path="a/x.py", content="1")]
    turns += [hermes_call("create", path="etc/x.py", content="1"), hermes_call("submit")]
    results = _episode(task, tmp_path, turns, max_turns=30)
    made, *views, graded = results
    assert made.observations[0]["content"] == "made"
    texts = [r.observations[0]["content"] for r in views]
    assert all(t.startswith("error: ") for i, t in enumerate(texts) if i not in (6, 7)), texts
    assert "outside the repository" in texts[0] and "outside the repository" in texts[1]
    loop = "error: a: Too many levels of symbolic links"
    assert texts[2] == texts[3].replace("self", "a") == loop
    assert texts[4:6] == ["error: fifo is not a regular file", "error: sock is not a regular file"]
    assert texts[6].startswith("./") and "fifo" in texts[6]  # the listing shows, never opens
    assert texts[8] == "error: fifo is not a regular file"
    assert graded.done and "grade_error" not in graded.info, graded.info
    assert graded.info["changed_files"] == []  # links and special files are never changes


def test_tests_that_leave_a_deep_nest_in_the_grading_copy(task, tmp_path: Path):
    # The agent's module runs inside grading: what it leaves there must not outlive the grade.
    path = task.edit[0]
    payload = (
        "\nimport os as _os\n_d = _os.getcwd()\n"
        f"for _ in range({DEEP}):\n    _os.mkdir('n'); _os.chdir('n')\n_os.chdir(_d)\n"
    )
    turns = [_py(f"open({path!r}, 'a').write({payload!r})"), hermes_call("submit")]
    *_, graded = _episode(task, tmp_path, turns)
    assert graded.done and "grade_error" not in graded.info, graded.info


# -- hostile arguments ------------------------------------------------------------------------
def _raw(name: str, arguments: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {arguments}}}</tool_call>'


BAD_CALLS = {
    "nul_in_command": (hermes_call("bash", command="echo a\0b"), "NUL"),
    "huge_command": (hermes_call("bash", command="echo " + "x" * 200_000), "bytes"),
    "lone_surrogate": (_raw("bash", '{"command": "echo \\ud800"}'), "not valid Unicode"),
    "nul_in_path": (hermes_call("view", path="setup\0.py"), "NUL"),
    "surrogate_path": (_raw("create", '{"path": "\\udfff.py", "content": "x"}'), "Unicode"),
    "huge_content": (hermes_call("create", path="big.txt", content="x" * (3 << 20)), "bytes"),
    "huge_old": (hermes_call("str_replace", path="a", old="x" * (3 << 20), new=""), "bytes"),
    "huge_line_number": (_raw("view", '{"path": "a", "start": ' + "9" * 5000 + "}"), "digits"),
    "big_line_number": (_raw("view", '{"path": "a", "end": ' + "9" * 40 + "}"), "end"),
    "float_line_number": (_raw("view", '{"path": "a", "start": 1.5}'), "integer"),
    "deep_json": (_raw("bash", "[" * 100_000 + "]" * 100_000), "JSON"),
    "list_argument": (_raw("bash", '{"command": ["ls"]}'), "string"),
    "null_name": ('<tool_call>{"name": null, "arguments": {}}</tool_call>', "name"),
}


@pytest.mark.parametrize("turn,message", list(BAD_CALLS.values()), ids=list(BAD_CALLS))
def test_bad_calls_are_error_observations(task, tmp_path: Path, turn: str, message: str):
    turns = [hermes_call("bash", command="echo ok > made.txt"), turn, hermes_call("submit")]
    made, bad, graded = _episode(task, tmp_path, turns)
    assert made.info["tool_status"] == "ok" and not bad.done
    text = bad.observations[0]["content"]
    assert text.startswith("error: ") and message in text, text
    text.encode("utf-8")  # an observation is always valid text for the tokenizer
    assert graded.info["changed_files"] == ["made.txt"]


def test_a_step_that_fails_still_deletes_the_copy(task, tmp_path: Path):
    class Broken(ToolRunner):
        def run(self, call, workdir):  # the sandbox itself failing mid-episode
            (workdir / "partial.txt").write_text("x")
            raise RuntimeError("sandbox broke")

    env = SweEnv("hermes", runner=Broken(), work_dir=tmp_path)

    async def go() -> Path | None:
        await env.reset(task)
        with pytest.raises(RuntimeError, match="sandbox broke"):
            await env.step(hermes_call("bash", command="true"))
        return env.work

    assert asyncio.run(go()) is None
    assert list(tmp_path.glob("saorl-swe-*")) == []


# -- the tree helpers and the sandbox, directly ------------------------------------------------
def _deep_tree(root: Path, depth: int) -> None:
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(depth):
            os.mkdir("d", dir_fd=fd)
            nxt = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = nxt
        os.close(os.open("f", os.O_WRONLY | os.O_CREAT, dir_fd=fd))
        os.symlink("/", "root", dir_fd=fd)
        os.mkfifo("fifo", dir_fd=fd)
    finally:
        os.close(fd)


def test_tree_helpers_on_a_tree_deeper_than_path_max(tmp_path: Path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "a.py").write_text("a\n")
    work = copy_tree(base, tmp_path)
    _deep_tree(work, 3000)
    assert tree_bytes(work) - tree_bytes(base) >= 3000 * 512  # every directory is charged
    assert collect_changes(base, work) == {}  # past PATH_MAX: not a change
    remove_tree(work)
    assert not os.path.lexists(work)


def test_sandbox_refuses_unrunnable_argv_with_a_result():
    for argv in (["bash", "-c", "echo a\0b"], ["bash", "-c", "echo " + "x" * 200_000]):
        result = run(argv)
        assert isinstance(result, ExecResult) and result.status == "error", result
        assert "cannot execute" in result.reason


def test_fallback_sandbox_removes_a_deep_tree_it_was_left(tmp_path: Path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # where the call's dir is made
    code = f"import os\nfor _ in range({DEEP}):\n    os.mkdir('d'); os.chdir('d')\nprint('ok')"
    result = run_python(code, backend="rlimit")
    assert (result.status, result.stdout) == ("ok", "ok\n"), result
    assert list(tmp_path.iterdir()) == []
