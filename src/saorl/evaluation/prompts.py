"""Prompt templates for `saorl eval`: the prompts published math results are produced with.

    template = prompt_template("boxed")           # or "qwen_math", "saorl", "... {problem} ..."
    make_env = template.wrap(spec.make_env)        # environments that open with the template

A template replaces the environment's opening messages; the episode (tools, grading, turns) is
the environment's own, so both the in-process engine and `--base-url` (whose client sends the
messages `reset` returns) see the same prompt.

- `saorl` (default): the environment's own opening (env 'math': saorl's instructions, with the
  tool's syntax, before the problem; `env.system_prompt` if set).
- `boxed`: one user message, the problem, a newline, then "Please reason step by step, and put
  your final answer within \\boxed{}." (DeepSeek-R1's recommended prompt, used by most
  published R1-distill and Qwen math evaluations); the environment's system message if any.
- `qwen_math`: that sentence as the system message, the problem as the user message
  (Qwen2.5-Math's chain-of-thought evaluation).
- a text with `{problem}`: the user message, `{problem}` replaced by the problem; the
  environment's system message if any.

The problem is the task's `prompt` text (env 'math': the dataset's problem field; a
conversational row's last user message, whose earlier messages are kept). A template names no
tool: for a tool-free evaluation, as published, set `env.use_tool=false` too.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saorl.envs.base import PassesOn, offloaded

STEP_BY_STEP = "Please reason step by step, and put your final answer within \\boxed{}."
PLACEHOLDER = "{problem}"


@dataclass(frozen=True)
class PromptTemplate:
    """A named template: `user` (with `{problem}`) and an optional `system` message; `user`
    None keeps the environment's own opening (`saorl`)."""

    name: str
    user: str | None
    system: str | None = None

    def describe(self) -> dict[str, Any]:
        """The name and text, for the evaluation summary (so a number can be traced)."""
        if self.user is None:
            text: Any = "the environment's own opening messages (env 'math': saorl's instructions)"
        else:
            text = {"system": self.system, "user": self.user}
        return {"prompt_template": self.name, "prompt_template_text": text}

    def wrap(self, make_env: Callable[[], Any]) -> Callable[[], Any]:
        """`make_env`, its environments opening with this template (itself for `saorl`)."""
        if self.user is None:
            return make_env
        return lambda: TemplatedEnv(make_env(), self)


PROMPT_TEMPLATES: dict[str, PromptTemplate] = {
    "saorl": PromptTemplate("saorl", None),
    "boxed": PromptTemplate("boxed", PLACEHOLDER + "\n" + STEP_BY_STEP),
    "qwen_math": PromptTemplate("qwen_math", PLACEHOLDER, system=STEP_BY_STEP),
}


def prompt_template(spec: str) -> PromptTemplate:
    """The template `spec` names (`PROMPT_TEMPLATES`), or a custom one: a text with
    `{problem}`. Raises ValueError naming the choices otherwise."""
    if spec in PROMPT_TEMPLATES:
        return PROMPT_TEMPLATES[spec]
    if PLACEHOLDER in spec:
        return PromptTemplate("custom", spec)
    raise ValueError(
        f"--prompt-template {spec!r}: not a template name ({', '.join(PROMPT_TEMPLATES)}) "
        "nor a text with {problem} in it"
    )


class TemplatedEnv(PassesOn):
    """An environment whose opening messages follow a template; everything else is the
    wrapped environment's (its optional members, `saorl.envs.base`, declared here and passed
    on)."""

    def __init__(self, env: Any, template: PromptTemplate) -> None:
        self.inner = env
        self._template = template
        self.offload = offloaded(env)

    async def reset(self, task: Any) -> list[dict[str, Any]]:
        messages = [dict(m) for m in await self.inner.reset(task)]  # also readies the env
        problem = getattr(task, "prompt", None)
        if not isinstance(problem, str) or not messages or messages[-1]["role"] != "user":
            raise ValueError(
                f"prompt template {self._template.name!r} needs tasks with a text `prompt` "
                f"whose episode opens with a user message (env 'math'); got a "
                f"{type(task).__name__}"
            )
        assert self._template.user is not None  # `saorl` is never wrapped
        messages[-1]["content"] = self._template.user.replace(PLACEHOLDER, problem)
        if self._template.system is not None:
            if messages[0]["role"] == "system":
                messages[0]["content"] = self._template.system
            else:
                messages.insert(0, {"role": "system", "content": self._template.system})
        return messages

    async def step(self, action_text: str) -> Any:
        return await self.inner.step(action_text)
