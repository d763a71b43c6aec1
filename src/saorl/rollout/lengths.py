"""Forced turn lengths for benchmarks (`rollout.forced_length`, `AgentLimits.forced_length`):
long-tailed, drawn per turn, the same in every mode whatever the policy learns."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass


def lognormal_lengths(median: int, sigma: float, seed: int) -> Callable[[], int]:
    """Turn lengths `round(median * exp(sigma * z))`, `z ~ N(0, 1)`, at least 1 (thread-safe
    enough: one `random.Random` call under the GIL per draw)."""
    return _LognormalLengths(median, sigma, random.Random(seed))


@dataclass
class _LognormalLengths:
    # A class, not a closure: `AgentLimits` pickles whole into a rollout process.
    median: int
    sigma: float
    rng: random.Random

    def __call__(self) -> int:
        return max(1, round(self.median * self.rng.lognormvariate(0.0, self.sigma)))
