"""The environment protocol (DESIGN.md section 2).

An environment speaks text and chat messages, never tokens: the agent loop alone owns
tokenization and the chat template. `reset(task)` returns the opening messages; `step(action)`
takes the text of one model turn and returns what the environment says back (tool output as
messages), the reward and whether the episode is over.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

Message = dict[str, str]  # {"role": ..., "content": ...}


@dataclass
class StepResult:
    observations: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    """One episode at a time; create one instance per concurrent episode."""

    async def reset(self, task: Any) -> list[Message]:
        """The opening messages of the episode (system and user turns)."""
        ...

    async def step(self, action_text: str) -> StepResult:
        """React to one model turn (its decoded text, special tokens removed)."""
        ...
