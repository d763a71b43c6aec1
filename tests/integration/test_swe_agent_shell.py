"""A command agent's shell on a coding task (`saorl.envs.swe.agent_shell`): commands sent over
the unix socket run in the real sandbox over the episode's repository copy, and the copy is
graded by the coding env's grader with its integrity rules."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import socket
import sys
import uuid
from pathlib import Path

import pytest

import saorl.envs.swe
from saorl.envs.swe.agent_shell import AgentWorkspace
from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.gen.generator import generate_pool
from saorl.envs.swe.task import SweTask


@pytest.fixture(scope="module")
def task(tmp_path_factory: pytest.TempPathFactory) -> SweTask:
    held, _ = generate_pool(21, 1, 0, tmp_path_factory.mktemp("swe-cache"))
    return held[0]


def _ask(path: str, payload: bytes) -> dict:
    """What a client outside saorl (mini-swe-agent's environment class) does, blocking."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(path)
        sock.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1 << 16)
            assert chunk, "the shell closed without answering"
            data += chunk
    return json.loads(data)


async def _session(task: SweTask, work: Path, commands: list[str], **env_kw) -> tuple:
    env = SweEnv("hermes", test_timeout_s=5.0, work_dir=work, **env_kw)
    async with AgentWorkspace(env, task) as ws:
        sock = ws.env_vars["SAORL_SHELL"]
        assert oct(os.stat(ws.dir).st_mode & 0o777) == "0o700"
        replies = []
        for command in commands:
            payload = json.dumps({"command": command}).encode() + b"\n"
            replies.append(await asyncio.to_thread(_ask, sock, payload))
        garbage = await asyncio.to_thread(_ask, sock, b"not json\n")
        copy = ws.env.work
        made = copy / "made_by_agent.txt" if copy else None
        made = made.read_text() if made and made.exists() else None
        reward, info = await ws.grade()
        folder = ws.dir
    assert not folder.exists(), "the episode's folder (and its socket) was not removed"
    assert not list(work.glob("saorl-swe-ws-*")), "the repository copy was not removed"
    return replies, garbage, made, reward, info


def test_commands_run_in_the_sandbox_on_the_copy_and_the_gold_fix_gets_one(task, tmp_path):
    path, old, new = task.edit
    probe = f"/tmp/saorl-agent-shell-{uuid.uuid4().hex}"
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    fix = (
        "python - <<'EOF'\nimport json, pathlib\n"
        f"p = pathlib.Path({json.dumps(path)})\n"
        f"p.write_text(p.read_text().replace({json.dumps(old)}, {json.dumps(new)}, 1))\nEOF"
    )
    commands = [
        "pwd; echo from-the-sandbox > made_by_agent.txt; cat /testbed/made_by_agent.txt",
        f"echo x > {probe}; ls {probe}; cat {secret} 2>&1; exit 3",
        "echo out; echo err >&2",
        fix,
    ]
    replies, garbage, made, reward, info = asyncio.run(_session(task, tmp_path, commands))
    assert replies[0] == {
        "output": "/sandbox\nfrom-the-sandbox\n",
        "returncode": 0,
        "exception_info": "",
    }
    assert replies[1]["returncode"] == 3 and probe in replies[1]["output"]
    assert "No such file or directory" in replies[1]["output"]  # host files are not there
    assert not os.path.exists(probe)  # the sandbox's /tmp is its own
    assert replies[2]["output"] == "out\nerr\n"
    assert garbage["returncode"] == -1 and garbage["exception_info"].startswith("error: send")
    assert made == "from-the-sandbox\n"  # a file a command wrote is in the episode's copy
    assert reward == 1.0 and info["resolved"] and info["submitted"] == "agent"
    assert info["agent/commands"] == 4
    assert sorted(info["changed_files"]) == sorted([path, "made_by_agent.txt"])


def test_editing_the_tests_is_graded_by_the_integrity_rules(task, tmp_path):
    tests = sorted({t.split("::")[0] for t in task.fail_to_pass})
    cheat = "; ".join(f"printf 'def test_ok():\\n    pass\\n' > {t}" for t in tests)
    replies, _, _, reward, info = asyncio.run(_session(task, tmp_path, [cheat]))
    assert replies[0]["returncode"] == 0
    assert reward == 0.0 and not info["resolved"]  # the task's tests were restored


def test_a_timeout_and_an_unusable_command_are_answers(task, tmp_path):
    from saorl.envs.swe.tools import ToolRunner

    async def run() -> tuple:
        env = SweEnv("hermes", ToolRunner(command_timeout_s=1.0), work_dir=tmp_path)
        async with AgentWorkspace(env, task) as ws:
            slow = await ws.run("sleep 30")
            nul = await ws.run("echo \0")
            not_text = await ws.run(["ls"])
            return slow, nul, not_text

    slow, nul, not_text = asyncio.run(run())
    assert slow["exception_info"].startswith("timeout")
    assert "NUL byte" in nul["exception_info"] and nul["returncode"] == -1
    assert "string argument 'command'" in not_text["exception_info"]


def test_a_copy_past_its_disk_budget_stops_commands_and_gets_zero(task, tmp_path):
    big = "head -c 3000000 /dev/zero > big.bin"
    replies, _, _, reward, info = asyncio.run(
        _session(task, tmp_path, [big, "ls"], max_growth_bytes=1 << 20)
    )
    assert "grew past" in replies[1]["exception_info"]
    assert reward == 0.0 and "grew past" in info["grade_error"]


def test_agents_get_the_issue_and_never_the_fix(task):
    from saorl.envs.agent import task_dict

    given = task_dict(task)
    assert given == {"instance_id": task.key, "problem_statement": task.prompt, "repo": ""}


def test_swe_tasks_take_command_agents_only(tmp_path):
    from saorl.config import ConfigError, EnvConfig
    from saorl.envs.factory import build_env

    cfg = EnvConfig(name="agent", agent={"tasks": "swe", "function": "my_agent.py:run"})
    with pytest.raises(ConfigError, match="runs command agents"):
        build_env(cfg)


SHOW_ENV = (
    "import json, os; print(json.dumps({'home': os.environ.get('SAORL_AGENT_HOME', ''), "
    "'runner': os.environ['SAORL_MINISWE_RUNNER']}))"
)


@pytest.mark.parametrize("in_run", [True, False], ids=["training-run", "no-run"])
def test_a_command_gets_the_runner_and_a_folder_in_the_run(task, tmp_path, in_run):
    from saorl.config import EnvConfig
    from saorl.envs.agent import AgentProgram

    command = f"{sys.executable} -c {shlex.quote(SHOW_ENV)}"
    cfg = EnvConfig(name="agent", agent={"tasks": "swe", "command": command})
    run_dir = tmp_path / "run"
    work = tmp_path / "work"
    # the run folder as `saorl train` passes it (saorl.loop -> build_env(run_dir=...))
    home = run_dir if in_run else None
    program = AgentProgram(cfg, None, lambda: SweEnv("hermes", work_dir=work), None, None, home)
    reward, info = asyncio.run(program.run(task, "http://127.0.0.1:9/v1", "key", lambda: []))
    assert reward == 0.0 and info["submitted"] == "agent"  # graded: the copy is unchanged
    runner = Path(info["agent/runner"])  # shipped in the package, a script for mini's venv
    assert runner.is_file() and runner.name == "miniswe_runner.py"
    assert runner.parent == Path(saorl.envs.swe.__file__).parent
    if in_run:  # mini-swe-agent's config dir goes in the run folder, kept after the episode
        assert info["agent/home"] == str(run_dir / "agents") and (run_dir / "agents").is_dir()
    else:  # `saorl eval`: no run folder; the runner uses the episode's private folder
        assert info["agent/home"] == "" and not run_dir.exists()
