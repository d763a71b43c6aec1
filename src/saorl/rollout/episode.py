"""The agent loop's bookkeeping: one multi-turn episode, token in, token out.

The engine's token ids are the training ids: the history is never re-tokenized. Model turns are
appended exactly as sampled (loss mask 1, their rollout log-probs and policy versions);
environment observations are tokenized here (mask 0, log-prob 0, version -1) so that the
concatenation equals what the chat template produces for the whole conversation:

    observation ids = encode(render(conversation + observations, generation prompt)
                             [len(render(conversation so far) + generated text):])

With no chat template (the built-in char-level tasks) messages are plain text: the prompt is the
concatenation of the opening contents and an observation is its content, appended as is.

Ending rules (docs/design.md section 1): the trajectory never ends on
observation tokens; it ends with `answer` (the environment said done), `max_turns`,
`max_tool_calls`, `length` (a turn used its whole token budget without finishing), `context`
(the next observation or turn would not fit), `env_error` or `aborted`. Only `aborted` and
`env_error` trajectories are not trained on (an infrastructure failure says nothing about the
policy); aborted ones are retried.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from saorl.envs.base import Env, Message
from saorl.types import Trajectory, fit_routing

UNTRAINABLE = ("aborted", "env_error")
_TOOLS_WARNED: set[str] = set()  # tokenizers already warned about tools they cannot render


class ChatCodec:
    """Turns messages into token ids for one tokenizer, consistently across turns."""

    def __init__(self, tokenizer: Any) -> None:
        self.tok = tokenizer
        template = getattr(tokenizer, "chat_template", None)
        self.templated = bool(template)
        # A template that never reads `tools` drops the schemas as surely as having none.
        self.renders_tools = self.templated and "tools" in str(template)

    def check_tools(self, tools: list[dict] | None) -> None:
        """Warn once per process and tokenizer when `tools` cannot reach the prompt: the
        model would never see their schemas, and nothing else would say so."""
        name = str(getattr(self.tok, "name_or_path", "") or type(self.tok).__name__)
        if not tools or self.renders_tools or name in _TOOLS_WARNED:
            return
        _TOOLS_WARNED.add(name)
        fns = [t.get("function") if isinstance(t, dict) else None for t in tools]
        names = ", ".join(str(f.get("name")) if isinstance(f, dict) else "?" for f in fns)[:200]
        why = "chat template that renders tools" if self.templated else "chat template"
        print(
            f"saorl: warning: tools ({names}) were given, but the tokenizer of {name!r} has no "
            f"{why}: the model never sees their schemas. Use a chat model whose template "
            "takes `tools`, or describe the tools in the prompt.",
            file=sys.stderr,
            flush=True,
        )

    def _render(
        self, messages: list[Message], generation_prompt: bool, tools: list[dict] | None = None
    ) -> str:
        # `tools=` only when there are some: a template or tokenizer that predates the
        # argument renders tool-less prompts exactly as before.
        extra = {"tools": tools} if tools else {}
        return self.tok.apply_chat_template(
            messages, add_generation_prompt=generation_prompt, tokenize=False, **extra
        )

    def _encode(self, text: str) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=False))

    def prompt_ids(self, messages: list[Message], tools: list[dict] | None = None) -> list[int]:
        """`tools`: the env's tool schemas, for the chat template (ignored without one, with
        a warning: `check_tools`)."""
        self.check_tools(tools)
        if self.templated:
            return self._encode(self._render(messages, True, tools))
        return self._encode("".join(m["content"] for m in messages))

    def observation_ids(
        self,
        conversation: list[Message],
        generated_ids: list[int],
        observations: list[Message],
        tools: list[dict] | None = None,
    ) -> list[int]:
        """Ids that follow the model's last turn: the observations and the next turn's header.

        `conversation` ends with the assistant message of the last turn (its text without
        special tokens); `generated_ids` are that turn's sampled ids.
        """
        if not self.templated:
            return self._encode("".join(m["content"] for m in observations))
        before = self._render(conversation[:-1], True, tools)
        prefix = before + self.tok.decode(generated_ids, skip_special_tokens=False)
        full = self._render(conversation + observations, True, tools)
        if full.startswith(prefix):
            return self._encode(full[len(prefix) :])
        # The template rewrites history (e.g. drops reasoning of earlier turns) or closes the
        # turn differently from what was generated: render the observations after a
        # placeholder turn instead. The ids then match how the template formats a new turn.
        stub = [{"role": "user", "content": "x"}]
        head = self._render(stub, False, tools)
        return self._encode(self._render(stub + observations, True, tools)[len(head) :])


@dataclass
class Episode:
    """One trajectory in progress."""

    env: Env
    task: Any
    conversation: list[Message]
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    turns: int = 0
    tool_calls: int = 0
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)
    group_id: int = -1
    tools: list[dict] | None = None  # the env's `tools` attribute: schemas for the template
    # Recorded MoE routing of every position fed so far: each turn's prefill re-routes the
    # whole history, so the newest turn's record replaces the older ones.
    routing: Any = None
    cut: str = ""  # "length" / "context": the last turn hit its token budget or the context

    @property
    def ids(self) -> list[int]:
        return self.prompt_ids + self.completion_ids

    def add_turn(
        self, ids: list[int], logprobs: list[float], versions: list[int], routing: Any = None
    ) -> None:
        if routing is not None:
            self.routing = routing
        self.completion_ids += ids
        self.loss_mask += [1] * len(ids)
        self.logprobs += logprobs
        self.versions += versions
        self.turns += 1

    def add_observation(self, ids: list[int]) -> None:
        self.completion_ids += ids
        self.loss_mask += [0] * len(ids)
        self.logprobs += [0.0] * len(ids)
        self.versions += [-1] * len(ids)

    def finish(self, stop_reason: str, key: str = "") -> Trajectory:
        # Drop trailing observation tokens: a trajectory never ends on them.
        n = len(self.loss_mask)
        while n and not self.loss_mask[n - 1]:
            n -= 1
        return Trajectory(
            prompt_ids=self.prompt_ids,
            completion_ids=self.completion_ids[:n],
            loss_mask=self.loss_mask[:n],
            rollout_logprobs=self.logprobs[:n],
            versions=self.versions[:n],
            reward=self.reward,
            stop_reason=stop_reason,  # type: ignore[arg-type]
            prompt_key=key,
            group_id=self.group_id,
            info={**self.info, "turns": self.turns, "tool_calls": self.tool_calls},
            routing=fit_routing(self.routing, len(self.prompt_ids) + n),
        )
