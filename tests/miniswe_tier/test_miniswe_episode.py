"""mini-swe-agent (the pinned release, unmodified, in .venv-miniswe) as saorl's agent program on
a generated coding task, one episode at a time, its model a scripted OpenAI-compatible server:
its commands run in saorl's sandbox over the task's copy, the copy is graded by the coding env's
grader, and a model that never answers ends in saorl's timeout with nothing left behind."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
import uuid
from http.server import ThreadingHTTPServer
from pathlib import Path

import pytest

from saorl.config import EnvConfig
from saorl.envs.factory import build_env
from tests._chat_stub import ChatStub
from tests.miniswe_tier._marks import MINISWE_TIER, PYTHON

pytestmark = MINISWE_TIER


def _program(tmp_path: Path, *args: str, run_dir: Path | None = None):
    cfg = EnvConfig(
        name="agent",
        eval_size=1,
        agent={"tasks": "swe", "command": " ".join([PYTHON, '"$SAORL_MINISWE_RUNNER"', *args])},
        swe={
            "source": "generated",
            "num_tasks": 1,
            "cache_dir": str(tmp_path / "cache"),
            "test_timeout_s": 5.0,
        },
    )
    spec = build_env(cfg, held_out_only=True, run_dir=run_dir)  # as `saorl train` passes it
    return spec.make_env(), spec.task.held_out[0]


def _scripted(commands: list[str]) -> tuple[ThreadingHTTPServer, list[dict]]:
    """A server whose n-th reply calls `bash` with the n-th command."""
    seen: list[dict] = []

    class Script(ChatStub):
        def answer(self, body: dict) -> dict:
            seen.append(body)
            n = len(seen) - 1
            arguments = json.dumps({"command": commands[n]})
            call = {"id": f"call_{n}", "type": "function"}
            call["function"] = {"name": "bash", "arguments": arguments}
            message = {"role": "assistant", "content": "THOUGHT: next.", "tool_calls": [call]}
            choice = {"index": 0, "message": message, "finish_reason": "tool_calls"}
            usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
            head = {"id": f"r{n}", "object": "chat.completion", "created": 0, "model": "policy"}
            return {**head, "choices": [choice], "usage": usage}

    server = ThreadingHTTPServer(("127.0.0.1", 0), Script)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_commands_run_in_the_sandbox_and_the_copy_is_graded(tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))  # mini-swe-agent must not write to the user's home
    for var in ("XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_DATA_HOME"):
        monkeypatch.delenv(var, raising=False)
    run_dir = tmp_path / "run"
    program, task = _program(tmp_path, run_dir=run_dir)
    path, old, new = task.edit
    probe = f"/tmp/saorl-miniswe-{uuid.uuid4().hex}"
    secret = tmp_path / "host-secret.txt"
    secret.write_text("host only")
    fix = (
        "python - <<'EOF'\nimport json, pathlib\n"
        f"p = pathlib.Path({json.dumps(path)})\n"
        f"p.write_text(p.read_text().replace({json.dumps(old)}, {json.dumps(new)}, 1))\nEOF"
    )
    commands = [
        "pwd > where.txt && echo made-by-mini > made.txt && cat /testbed/made.txt",
        f"touch {probe} && ls {probe}; cat {secret}",
        fix,
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ]
    server, seen = _scripted(commands)
    url = f"http://127.0.0.1:{server.server_port}/v1"
    try:
        reward, info = asyncio.run(program.run(task, url, "key", lambda: [], worker="w"))
    finally:
        server.shutdown()
    assert reward == 1.0 and info["resolved"] and info["submitted"] == "agent"
    assert info["agent/exit_status"] == "Submitted" and info["agent/submitted"] == 1.0
    assert info["agent/model_calls"] == 4.0 and info["agent/commands"] == 4
    assert {path, "made.txt", "where.txt"} <= set(info["changed_files"])
    assert "+/sandbox" in info["patch"]  # `pwd` of the commands: the sandbox's work dir
    assert not os.path.exists(probe)  # the sandbox's /tmp is not the host's
    # mini-swe-agent saw each command's output, through its own observation template
    first, second = seen[1]["messages"][-1]["content"], seen[2]["messages"][-1]["content"]
    assert "<returncode>0</returncode>" in first and "made-by-mini" in first
    assert probe in second and "No such file or directory" in second  # host files are not there
    assert seen[0]["model"] == "policy" and seen[0]["tools"][0]["function"]["name"] == "bash"
    assert list(home.iterdir()) == []
    assert (run_dir / "agents" / "mini-swe-agent").is_dir()  # its config dir: the run folder's


def test_a_model_that_never_answers_is_stopped_by_the_timeout(tmp_path):
    program, task = _program(tmp_path, "swebench.yaml", f"run.marker={uuid.uuid4().hex}")
    marker = program.command.split("run.marker=")[1]
    silent = socket.socket()  # accepts connections (the backlog) and never answers
    silent.bind(("127.0.0.1", 0))
    silent.listen(8)
    url = f"http://127.0.0.1:{silent.getsockname()[1]}/v1"

    async def run() -> None:
        await asyncio.wait_for(program.run(task, url, "key", lambda: [], worker="w"), 30)

    try:
        with pytest.raises(TimeoutError):
            asyncio.run(run())
    finally:
        silent.close()
    deadline = time.monotonic() + 10
    while _running(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _running(marker), "mini-swe-agent's process outlived its episode"
    work = tmp_path / "cache" / "work"
    assert not list(work.glob("saorl-swe-ws-*")) if work.exists() else True


def _running(marker: str) -> bool:
    for proc in Path("/proc").iterdir():
        try:
            if marker.encode() in (proc / "cmdline").read_bytes():
                return True
        except OSError:
            continue
    return False
