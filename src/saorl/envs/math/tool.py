"""Math with a Python tool: the model may run code in the sandbox before it answers.

One episode: the problem (with tool instructions) -> model turns; a turn that ends in a tool
call gets the sandboxed output back as an observation; a turn without a call is the answer,
graded 1/0 on its last `\\boxed{}` (`saorl.envs.math.grader`). Malformed calls and calls to
unknown tools come back as error observations the model can read.

With `env.tools` (hermes or llama3 format) the model also has your Python functions
(`saorl.envs.function_tools.FunctionTools`), offered besides the sandboxed `python` tool or, with
`env.use_tool = false`, instead of it; their schemas (and python's) go to the chat template.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from saorl.envs.base import Message, StepResult
from saorl.envs.function_tools import FunctionTools
from saorl.sandbox import Limits, run_python
from saorl.toolcalls import ToolCallError, ToolFormat, parse_tool_call

BOXED_ANSWER = "Put the final answer in \\boxed{}."
# {answer}: how to give the final answer (env 'math': BOXED_ANSWER; env 'reasoning_gym': tags).
_CODE = (
    "Solve the problem. You may run Python code by writing <python>code</python>; the printed "
    "output comes back in <output></output>. {answer}\n\n"
)
_NO_TOOL = "Solve the problem. {answer}\n\n"
CODE_INSTRUCTIONS = _CODE.format(answer=BOXED_ANSWER)
NO_TOOL_INSTRUCTIONS = _NO_TOOL.format(answer=BOXED_ANSWER)
# How a call is written, per format, in the instructions ({name} and {args} filled in).
_CALL_SYNTAX = {
    "hermes": '<tool_call>{{"name": {name}, "arguments": {args}}}</tool_call>',
    "llama3": 'a reply that is only {{"name": {name}, "parameters": {args}}}',
}
TOOL_INSTRUCTIONS = (
    "Solve the problem. You may call the tool `python` with {call}; the printed output comes "
    "back to you. {answer}\n\n"
)
FUNCTION_INSTRUCTIONS = (
    "Solve the problem. You may call the tools {names} with {call}; the result comes back to "
    "you. {answer}\n\n"
)


def tool_instructions(
    fmt: ToolFormat, names: list[str] | None = None, answer: str = BOXED_ANSWER
) -> str:
    """The instructions for the `hermes` or `llama3` format: the python tool alone, or the
    tools `names`; `answer` says how to give the final answer."""
    if names is None:
        call = _CALL_SYNTAX[fmt].format(name='"python"', args='{"code": "..."}')
        return TOOL_INSTRUCTIONS.format(call=call, answer=answer)
    call = _CALL_SYNTAX[fmt].format(name='"..."', args="{...}")
    return FUNCTION_INSTRUCTIONS.format(names=", ".join(names), call=call, answer=answer)


PYTHON_TOOL_SCHEMA = {
    "type": "function",
    "function": {
        "name": "python",
        "description": "Run Python code in a sandbox; returns what it prints.",
        "parameters": {
            "type": "object",
            "properties": {"code": {"type": "string", "description": "the program to run"}},
            "required": ["code"],
        },
    },
}


def _default_grader(response: str, reference: str) -> float:
    from saorl.envs.math.grader import grade

    return grade(response, reference)


class MathToolEnv:
    """Tool-integrated math reasoning over problems with `.prompt` and `.answer` fields."""

    offload = True  # sandbox calls take tens of milliseconds: keep decoding meanwhile

    def __init__(
        self,
        fmt: ToolFormat = "code",
        limits: Limits | None = None,
        max_output_chars: int = 1000,
        grader: Callable[[str, str], float] = _default_grader,
        observation_role: str = "tool",
        use_tool: bool = True,
        system_prompt: str = "",
        instructions: bool = True,
        functions: FunctionTools | None = None,
        answer_instruction: str = BOXED_ANSWER,
    ) -> None:
        self.fmt = fmt
        self.answer_instruction = answer_instruction
        self.use_tool = use_tool
        self.system_prompt = system_prompt
        self.instructions = instructions
        self.limits = limits or Limits(wall_s=5.0, cpu_s=5)
        self.max_output_chars = max_output_chars
        self.grader = grader
        self.observation_role = observation_role
        self.task: Any = None
        self.functions = functions
        # Read by the rollout worker and passed to the chat template as `tools=`.
        self.tools: list[dict[str, Any]] = []
        if functions is not None:
            self.tools = ([PYTHON_TOOL_SCHEMA] if use_tool else []) + functions.schemas

    async def reset(self, task: Any) -> list[Message]:
        """The opening messages: the task's own chat messages when it has them (a
        conversational dataset row), else one user message with its prompt; the instructions
        go before the last user message's text; `system_prompt` opens the conversation unless
        the task's messages bring their own system message."""
        self.task = task
        if not self.instructions:
            instructions = ""
        elif self.tools:
            names = [t["function"]["name"] for t in self.tools]
            instructions = tool_instructions(self.fmt, names, self.answer_instruction)
        elif not self.use_tool:
            instructions = _NO_TOOL.format(answer=self.answer_instruction)
        elif self.fmt == "code":
            instructions = _CODE.format(answer=self.answer_instruction)
        else:
            instructions = tool_instructions(self.fmt, answer=self.answer_instruction)
        messages = [dict(m) for m in getattr(task, "messages", ())]
        if not messages:
            messages = [{"role": "user", "content": task.prompt}]
        messages[-1]["content"] = instructions + messages[-1]["content"]
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def grade(self, action_text: str) -> float:
        """The reward of a final answer (a turn without a tool call)."""
        return self.grader(action_text, self.task.answer)

    def _observe(self, text: str, **info: Any) -> StepResult:
        if self.fmt == "code":
            text = f"\n<output>\n{text}\n</output>\n"
        return StepResult(
            [{"role": self.observation_role, "content": text}], info={"tool_call": True, **info}
        )

    async def step(self, action_text: str) -> StepResult:
        tools_on = self.use_tool or self.functions is not None
        call = parse_tool_call(action_text, self.fmt) if tools_on else None
        if call is None:
            reward = await asyncio.to_thread(self.grade, action_text)
            return StepResult(reward=reward, done=True, info={"answer_text": action_text[-200:]})
        if isinstance(call, ToolCallError):
            return self._observe(f"error: {call.message}", tool_status="malformed")
        if self.functions is not None and (call.name != "python" or not self.use_tool):
            text, status = await self.functions.call(call)
            if status == "unknown_tool" and self.use_tool:
                text = f"{text}, python"
            return self._observe(text, tool_status=status, tool=call.name)
        if call.name != "python" or not isinstance(call.arguments.get("code"), str):
            return self._observe(
                f"error: unknown tool {call.name!r} or missing 'code'; the only tool is "
                "python(code: str)",
                tool_status="unknown_tool",
            )
        result = await asyncio.to_thread(run_python, call.arguments["code"], self.limits)
        return self._observe(
            result.to_observation(self.max_output_chars), tool_status=result.status
        )
