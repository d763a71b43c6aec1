"""A small OpenEnv environment for the tests: guess a number from 1 to 6.

The target is `seed % 6 + 1`, so a test knows it. A wrong guess gets a hint and reward 0; the
right one reward 1 and `done`; `max_guesses` (a reset argument) wrong guesses end the episode.
The schema admits 7 and 8, but a guess of 8 makes the environment raise (a server error).
"""

from __future__ import annotations

import threading
from typing import Any

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """Guess the hidden number."""

    guess: int = Field(ge=1, le=8, description="your guess")


class GuessObservation(Observation):
    hint: str = Field(description="what the environment says")


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True
    counts: dict[str, int] = {"reset": 0, "step": 0, "close": 0}  # noqa: RUF012 (shared on purpose)
    lock = threading.Lock()

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target, self.left = 0, 0

    def _count(self, what: str) -> None:
        with self.lock:
            self.counts[what] += 1

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any):
        self._count("reset")
        self.target, self.left = (seed or 0) % 6 + 1, int(kwargs.get("max_guesses", 3))
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(hint=f"Guess a number from 1 to 6 in {self.left} tries.")

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any):
        self._count("step")
        if action.guess == 8:
            raise RuntimeError("eight is not allowed")
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(hint="right", reward=1.0, done=True)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(hint=hint, reward=0.0, done=self.left <= 0)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self._count("close")


app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=64)
# At most one session: the second concurrent episode finds the server full.
small_app = create_app(GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=1)
# Written the plainest way: create_app's default, one session.
plain_app = create_app(GuessEnvironment, GuessAction, GuessObservation)
