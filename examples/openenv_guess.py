"""An OpenEnv environment: guess a number from 1 to 100, with "higher"/"lower" hints.

saorl serves it in-process (examples/openenv_guess.toml: `env.openenv.app`); any OpenEnv
client or server runner can use it too, e.g. `uvicorn examples.openenv_guess:app --port 8000`
(then `env.openenv.url = "http://127.0.0.1:8000"`). Needs `pip install 'saorl[openenv]'`.
docs/openenv.md walks through it.
"""

from __future__ import annotations

import random
from typing import Any

from openenv.core.env_server import create_app
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


class GuessAction(Action):
    """Guess the hidden number; the reply says whether it is higher or lower."""

    guess: int = Field(ge=1, le=100, description="your guess, from 1 to 100")


class GuessObservation(Observation):
    message: str = Field(description="the task, or the hint after a guess")


class GuessEnvironment(Environment):
    # One instance per WebSocket session, so episodes can run concurrently.
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self) -> None:
        super().__init__()
        self._state = State()
        self.target, self.left = 0, 0

    def reset(
        self,
        seed: int | None = None,
        episode_id: str | None = None,
        max_guesses: int = 7,
        **kwargs: Any,
    ) -> GuessObservation:
        self.target = random.Random(seed).randint(1, 100)
        self.left = max_guesses
        self._state = State(episode_id=episode_id, step_count=0)
        return GuessObservation(
            message=f"I picked a number from 1 to 100. Find it in {max_guesses} guesses."
        )

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any):
        self._state.step_count += 1
        self.left -= 1
        if action.guess == self.target:
            return GuessObservation(message="Right!", reward=1.0, done=True)
        hint = "higher" if action.guess < self.target else "lower"
        return GuessObservation(
            message=f"{hint} ({self.left} guesses left)", reward=0.0, done=self.left <= 0
        )

    @property
    def state(self) -> State:
        return self._state


# max_concurrent_envs: sessions at once; at least the episodes saorl runs concurrently
# (rollout.max_concurrent per rollout worker). Fewer also train, slower (docs/openenv.md).
app = create_app(
    GuessEnvironment, GuessAction, GuessObservation, env_name="guess", max_concurrent_envs=256
)
