"""The environment protocol and `EnvSpec` (docs/design.md section 3).

An environment speaks text and chat messages, never tokens: the agent loop alone owns
tokenization and the chat template. `reset(task)` returns the opening messages; `step(action)`
takes the text of one model turn and returns what the environment says back (tool output as
messages), the reward and whether the episode is over.

An `EnvSpec` is everything the loop needs from a task: training problems (`task.sample(rng)`),
the held-out set (`task.held_out`), a fresh environment per episode, the episode budgets and
stop strings, and, for the built-in tasks, demonstrations for the supervised warm-up. It is built
from `env.name` by `saorl.envs.factory.build_env`.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from saorl.sft import Segments  # a type only: saorl.sft imports torch

Message = dict[str, str]  # {"role": ..., "content": ...}


@dataclass
class StepResult:
    observations: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    """One episode at a time; create one instance per concurrent episode."""

    # True: `reset`/`step` do real work (tool calls, grading runs) and run on an event loop in a
    # helper thread while decoding goes on; False: cheap, run inline (deterministic runs).
    offload: bool

    async def reset(self, task: Any) -> list[Message]:
        """The opening messages of the episode (system and user turns)."""
        ...

    async def step(self, action_text: str) -> StepResult:
        """React to one model turn (its decoded text, special tokens removed)."""
        ...


@dataclass
class EnvSpec:
    task: Any  # .sample(rng) -> problem; .held_out -> list of problems (.prompt/.answer/.key)
    make_env: Callable[[], Env]
    max_turns: int
    max_tool_calls: int
    stop: tuple[str, ...]
    demo: Callable[[Any, random.Random], Segments] | None = None
    step_timeout_s: float = 600.0  # env.step_timeout_s
