"""The coding agent's tools, how a model turn calls them, and how they run in the sandbox.

Two call formats, the ones `saorl.toolcalls` parses (no third syntax):
- `hermes`: `<tool_call>{"name": NAME, "arguments": {...}}</tool_call>` with the tools
  `bash(command)`, `view(path, start?, end?)`, `str_replace(path, old, new)`,
  `create(path, content)` and `submit()`;
- `code`: `<bash>command</bash>`, a shell command (the file tools are reachable through it:
  `sed -n 1,40p f.py`, `python - <<'EOF' ...`); a turn without a command submits.
In both, a turn that makes no call submits (the agent loop's "a turn without a call is the
answer"). Malformed calls, unknown tools and wrong arguments come back as `error: ...`
observations; the episode goes on. Wrong arguments include what no process could be given (a NUL
byte, a lone surrogate, a command past the kernel's 128 KiB argument limit) and sizes past the
caps below.

`bash` runs `bash -c COMMAND` in the sandbox over the episode's repository copy, with a wall-clock
limit and capped output; with a per-task environment (`TaskEnv`), its venv is bound read-only and
comes first on PATH (`python`, `pytest`), and the repository's import roots are on PYTHONPATH.
The file tools run `sandbox_tools.py` in the sandbox the same way, with saorl's interpreter.
"""

from __future__ import annotations

import functools
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.envs.swe.task import TaskEnv
from saorl.sandbox import ExecResult, Limits, middle_truncate, run
from saorl.toolcalls import ToolCall, ToolCallError, ToolFormat, parse_tool_call

CODE_TAG = "bash"
MAX_COMMAND_BYTES = 100_000  # a bash command (the kernel refuses one argument over 128 KiB)
MAX_TEXT_BYTES = 1 << 20  # each string argument of the file tools
MAX_LINE_NUMBER = 1 << 31
TOOLS = ("bash", "view", "str_replace", "create", "submit")
_ARGS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {  # required str, optional int
    "bash": (("command",), ()),
    "view": (("path",), ("start", "end")),
    "str_replace": (("path", "old", "new"), ()),
    "create": (("path", "content"), ()),
    "submit": ((), ()),
}
_SIGNATURES = {
    "bash": '{"command": str}',
    "view": '{"path": str, "start": int, "end": int}',
    "str_replace": '{"path": str, "old": str, "new": str}',
    "create": '{"path": str, "content": str}',
    "submit": "{}",
}

HERMES_INSTRUCTIONS = (
    "Fix the issue below in the repository (your working directory). Call one tool per turn: "
    '<tool_call>{"name": NAME, "arguments": {...}}</tool_call>. Tools:\n'
    '- bash {"command": str}: run a shell command in the repository root\n'
    '- view {"path": str, "start": int, "end": int}: show numbered lines (start/end optional)\n'
    '- str_replace {"path": str, "old": str, "new": str}: replace text occurring exactly once\n'
    '- create {"path": str, "content": str}: create a file\n'
    "- submit {}: finish; the repository's tests then grade your changes\n"
    "Do not edit the tests.\n\nIssue:\n"
)
CODE_INSTRUCTIONS = (
    "Fix the issue below in the repository (your working directory). Run a shell command with "
    "<bash>command</bash>; its output comes back in <output></output>. Reply without a command "
    "when you are done: the repository's tests then grade your changes. Do not edit the "
    "tests.\n\nIssue:\n"
)


def instructions(fmt: ToolFormat) -> str:
    return CODE_INSTRUCTIONS if fmt == "code" else HERMES_INSTRUCTIONS


def parse(text: str, fmt: ToolFormat) -> ToolCall | ToolCallError | None:
    """The call a model turn makes; `code` calls come back as `bash(command=...)`."""
    call = parse_tool_call(text, fmt, tag=CODE_TAG)
    if fmt == "code" and isinstance(call, ToolCall):
        return ToolCall("bash", {"command": call.arguments["code"]})
    return call


def _text_problem(key: str, value: str) -> str | None:
    """Why the string argument `key` cannot be passed on, or None."""
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        return f"{key!r} is not valid Unicode text (it holds a lone surrogate)"
    if "\0" in value and key in ("command", "path"):
        return f"{key!r} contains a NUL byte, which no {key} can hold"
    limit = MAX_COMMAND_BYTES if key == "command" else MAX_TEXT_BYTES
    if size > limit:
        fix = "split it into smaller commands" if key == "command" else "make smaller edits"
        return f"{key!r} is {size} bytes, over the limit of {limit} bytes; {fix}"
    return None


def check_arguments(call: ToolCall) -> str | None:
    """Why `call` cannot run (unknown tool, missing, mistyped or unusable argument), or None."""
    if call.name not in _ARGS:
        return f"unknown tool {call.name[:60]!r}; the tools are {', '.join(TOOLS)}"
    required, optional = _ARGS[call.name]
    usage = f"; usage: {call.name} {_SIGNATURES[call.name]}"
    for key in required:
        value = call.arguments.get(key)
        if not isinstance(value, str):
            return f"{call.name} needs the string argument {key!r}{usage}"
        if (problem := _text_problem(key, value)) is not None:
            return f"{call.name}: {problem}"
    for key in optional:
        value = call.arguments.get(key)
        if value is not None and (
            not isinstance(value, int)
            or isinstance(value, bool)
            or not -MAX_LINE_NUMBER < value < MAX_LINE_NUMBER
        ):
            return f"{call.name}: {key!r} must be an integer line number{usage}"
    unknown = sorted(set(call.arguments) - set(required) - set(optional))
    if unknown:
        names = ", ".join(repr(k[:60]) for k in unknown[:5])
        return f"{call.name}: unknown argument(s) {names}{usage}"
    return None


@functools.cache
def _tools_source() -> str:
    return Path(__file__).with_name("sandbox_tools.py").read_text(encoding="utf-8")


@dataclass(frozen=True)
class ToolOutcome:
    text: str  # the observation
    status: str  # the sandbox's status ("ok", "error", "timeout", ...); "error" for tool errors


@dataclass(frozen=True)
class ToolRunner:
    """Runs bash and the file tools over one work dir, with limits and an output cap."""

    command_timeout_s: float = 10.0
    max_output_chars: int = 2000
    memory_bytes: int = 1 << 30

    def _limits(self, wall_s: float) -> Limits:
        return Limits(
            wall_s=wall_s,
            cpu_s=max(int(wall_s), 1) + 1,
            memory_bytes=self.memory_bytes,
            output_bytes=max(4 * self.max_output_chars, 1 << 16),
        )

    def bash(
        self,
        command: str,
        workdir: Path,
        env: TaskEnv | None = None,
        links: tuple[tuple[str, str], ...] = (),
    ) -> ExecResult:
        """`bash -c command` in the sandbox over `workdir`, with the task's environment `env`
        when it has one (an argument-checked command; `links` as `saorl.sandbox.run` takes)."""
        return run(
            ["bash", "-c", command],
            workdir=workdir,
            limits=self._limits(self.command_timeout_s),
            ro_binds=(env.venv,) if env else (),
            env=env.sandbox_env() if env else None,
            links=links,
        )

    def run(self, call: ToolCall, workdir: Path, env: TaskEnv | None = None) -> ToolOutcome:
        """Execute an argument-checked call (not `submit`) and return its observation; `bash`
        runs with the task's environment `env` when it has one."""
        if call.name == "bash":
            result = self.bash(call.arguments["command"], workdir, env)
            return ToolOutcome(result.to_observation(self.max_output_chars), result.status)
        spec = {"tool": call.name, "args": call.arguments}
        result = run(
            [sys.executable, "-I", "-B", "-c", _tools_source()],
            workdir=workdir,
            limits=self._limits(max(self.command_timeout_s, 10.0)),
            stdin=json.dumps(spec).encode(),
        )
        if result.status != "ok":
            return ToolOutcome(result.to_observation(self.max_output_chars), result.status)
        text = middle_truncate(result.stdout, self.max_output_chars)
        return ToolOutcome(text, "error" if text.startswith("error: ") else "ok")


def describe(call: ToolCall) -> dict[str, Any]:
    """A short record of a call for the trajectory info."""
    return {"tool": call.name, **{k: str(v)[:200] for k, v in call.arguments.items()}}
