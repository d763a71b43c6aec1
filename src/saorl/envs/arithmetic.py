"""The built-in task: procedurally generated multi-digit addition with a verifiable 0/1 reward.

A prompt is `"a+b="` with `a, b` of up to `num_digits` digits; the answer is the decimal sum
followed by EOS. A fixed held-out set of `eval_size` problems is drawn from `seed` and never
sampled for training (nor for the supervised warm-up), so held-out accuracy measures
generalisation, not memorisation.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from saorl.envs.base import Message, StepResult


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    key: str  # identifies the problem (used by per-prompt baselines)


class ArithmeticTask:
    """Addition problems `a+b=` with `0 <= a, b < 10**num_digits`."""

    def __init__(
        self, num_digits: int = 2, eval_size: int = 256, seed: int = 1234, train: bool = True
    ) -> None:
        """`train=False`: held-out problems only (evaluation), up to every problem there is."""
        if num_digits < 1:
            raise ValueError(f"env.num_digits must be >= 1, got {num_digits}")
        self.num_digits = num_digits
        self.high = 10**num_digits
        total = self.high * self.high
        if not train:
            eval_size = min(eval_size, total)
        elif eval_size >= total // 2:
            raise ValueError(
                f"env.eval_size={eval_size} leaves too few training problems out of {total}; "
                f"use at most {total // 2 - 1} or raise env.num_digits"
            )
        rng = random.Random(seed)
        pairs = rng.sample(range(total), eval_size)
        self._held_out_ids = set(pairs)
        self.held_out = [self._problem(*divmod(i, self.high)) for i in pairs]

    def _problem(self, a: int, b: int) -> Problem:
        return Problem(prompt=f"{a}+{b}=", answer=str(a + b), key=f"{a}+{b}")

    def sample(self, rng: random.Random) -> Problem:
        """A training problem (never one of the held-out set)."""
        while True:
            a = rng.randrange(self.high)
            b = rng.randrange(self.high)
            if a * self.high + b not in self._held_out_ids:
                return self._problem(a, b)

    @staticmethod
    def reward(problem: Problem, completion_text: str) -> float:
        """1.0 when the completion (up to EOS, surrounding spaces ignored) is exactly the sum."""
        return 1.0 if completion_text.strip() == problem.answer else 0.0


class ArithmeticEnv:
    """Single-turn environment over `ArithmeticTask`: one answer, graded, done."""

    offload = False  # grading a sum is cheap: run inline, keeping runs deterministic

    def __init__(self) -> None:
        self.problem: Problem | None = None

    async def reset(self, task: Problem) -> list[Message]:
        self.problem = task
        return [{"role": "user", "content": task.prompt}]

    async def step(self, action_text: str) -> StepResult:
        assert self.problem is not None, "step() before reset()"
        return StepResult(reward=ArithmeticTask.reward(self.problem, action_text), done=True)
