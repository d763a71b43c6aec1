"""A command agent's episode on a coding task (`env.name = "agent"`, `env.agent.tasks = "swe"`).

An agent program that runs its own loop (mini-swe-agent, docs/mini-swe-agent.md) gets, for one
episode, a shell over the task's repository copy served on a unix socket; saorl runs each of
its commands in the sandbox as the coding env's `bash` tool does (the copy bound at /sandbox and
linked at /testbed, the task's environment, the same limits and disk budget), and grades what
the copy holds when the program exits, with the coding env's grader and integrity rules
(`SweEnv._grade`): the grade is the episode's reward.

The protocol, one request per connection: the client sends one JSON line
`{"command": "..."}` and reads one JSON line back, `{"output": str, "returncode": int,
"exception_info": str}` (the fields mini-swe-agent's environments return): stdout then
stderr, capped at `env.swe.max_output_chars`; `exception_info` says why a command did not run
or was stopped (a timeout, the memory limit, an unusable command), else "".

The socket lives in a private folder per episode (mode 0700, `SAORL_AGENT_DIR`, also the
program's scratch folder); the folder and the copy are removed when the episode ends, however
it ends. What a program keeps (mini-swe-agent's config dir) goes in the run folder instead
(`SAORL_AGENT_HOME`, `saorl.envs.agent`).
"""

from __future__ import annotations

import asyncio
import json
import tempfile
from pathlib import Path
from typing import Any

from saorl.envs.swe.env import SweEnv
from saorl.envs.swe.task import SweTask
from saorl.envs.swe.tools import check_arguments
from saorl.sandbox import ExecResult, middle_truncate
from saorl.sandbox.bwrap import SANDBOX_WORKDIR
from saorl.sandbox.tree import remove_tree
from saorl.toolcalls import ToolCall

TESTBED = "/testbed"  # where SWE-bench harnesses (mini-swe-agent's prompts) expect the repository
MAX_REQUEST_BYTES = 1 << 20  # a command is checked against its own, smaller cap below


def reply(result: ExecResult, max_chars: int) -> dict[str, Any]:
    """What a client reads back for one command that ran."""
    streams = [s for s in (result.stdout, result.stderr) if s]
    text = middle_truncate("".join(streams), max_chars)
    stopped = result.status in ("timeout", "killed", "output_limit")
    return {
        "output": text,
        "returncode": result.returncode,
        "exception_info": f"{result.status}: {result.reason}" if stopped else "",
    }


def _refused(why: str) -> dict[str, Any]:
    return {"output": "", "returncode": -1, "exception_info": why}


class AgentWorkspace:
    """One command agent's episode on `task`: `async with` it around the program's run, with
    `env_vars` in the program's environment; `await grade()` once the program is done."""

    def __init__(self, env: SweEnv, task: SweTask) -> None:
        self.env = env
        self.task = task
        self.dir: Path | None = None
        self.server: asyncio.AbstractServer | None = None
        self.commands = 0
        self.over_budget = False

    @property
    def env_vars(self) -> dict[str, str]:
        assert self.dir is not None, "env_vars outside `async with`"
        return {"SAORL_SHELL": str(self.dir / "shell.sock"), "SAORL_AGENT_DIR": str(self.dir)}

    async def __aenter__(self) -> AgentWorkspace:
        await self.env.reset(self.task)
        # The default temp dir, not the cache: a unix socket's path must stay under ~100 bytes.
        self.dir = Path(tempfile.mkdtemp(prefix="saorl-agent-"))
        try:
            self.server = await asyncio.start_unix_server(
                self._serve, path=self.env_vars["SAORL_SHELL"], limit=MAX_REQUEST_BYTES
            )
        except BaseException:
            remove_tree(self.dir)
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.server is not None:
            self.server.close()
        if self.dir is not None:
            remove_tree(self.dir)
        await asyncio.to_thread(self.env._cleanup)  # the copy, unless grading removed it

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            try:
                request = json.loads(await reader.readline())
                command = request["command"]
            except (ValueError, KeyError, TypeError, asyncio.LimitOverrunError):
                answer = _refused('error: send one JSON line {"command": "..."}')
            else:
                answer = await self.run(command)
            writer.write(json.dumps(answer).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass  # the client went away: nothing to answer
        finally:
            writer.close()

    async def run(self, command: Any) -> dict[str, Any]:
        """Run one of the program's commands in the sandbox over the repository copy."""
        env = self.env
        if self.over_budget:
            return _refused(f"error: the repository copy grew past {env.max_growth} bytes")
        call = ToolCall("bash", {"command": command})
        if (problem := check_arguments(call)) is not None:
            return _refused(f"error: {problem}")
        self.commands += 1
        work = await asyncio.to_thread(env._workdir)
        task_env = self.task.env if self.task.env else None
        links = ((SANDBOX_WORKDIR, TESTBED),)
        result = await asyncio.to_thread(env.runner.bash, command, work, task_env, links)
        if await asyncio.to_thread(env._over_disk_budget):
            self.over_budget = True
            await asyncio.to_thread(env._cleanup)  # free the disk now; nothing is graded
        return reply(result, env.runner.max_output_chars)

    async def grade(self) -> tuple[float, dict[str, Any]]:
        """(reward, info): the coding env's grade of the copy as it is now."""
        info: dict[str, Any] = {"agent/commands": self.commands}
        if self.over_budget:
            info["grade_error"] = f"the repository copy grew past {self.env.max_growth} bytes"
            return 0.0, {**info, "submitted": "none"}
        self.env.tool_counts = {"bash": self.commands}
        result = await asyncio.to_thread(self.env._grade, "agent")
        return result.reward, {**info, **result.info}
