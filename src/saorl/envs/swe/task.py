"""A coding task: a repository snapshot, an issue text, and the tests that decide it.

Both task sources produce `SweTask`s: the generator (`generator.py`, a small Python repository
with an injected bug) and the SWE-bench loader (`swebench.py`, a local checkout at a base
commit). The environment and the grader only see this class.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from saorl.envs.swe.workspace import Changes, materialize


@dataclass(eq=False)
class SweTask:
    """One task. `key`, `prompt` and `answer` are what the loop and `saorl eval` read."""

    key: str  # instance id
    prompt: str  # the issue text (problem statement)
    fail_to_pass: tuple[str, ...]  # pytest node ids that the fix must make pass
    pass_to_pass: tuple[str, ...]  # pytest node ids that must keep passing
    snapshot: Path  # where the base repository is (or will be) materialized
    # writes the base repository into a dir; picklable (a partial), as checkpoints hold tasks
    fill: Callable[[Path], None] = field(repr=False)
    answer: str = ""  # the gold patch as a unified diff ('' when unknown); shown as reference
    test_patch: str = ""  # applied at grading (SWE-bench: the tests that check the fix)
    protected: tuple[str, ...] = ()  # paths (dirs end in '/') restored to the snapshot at grading
    plugin_autoload: bool = False  # let pytest load the venv's plugins while grading
    gold: Changes | None = field(default=None, repr=False)  # the fix as changes, when known
    # the fix as one str_replace (path, old, new), for demonstrations; generated tasks only
    edit: tuple[str, str, str] | None = field(default=None, repr=False)

    def base_dir(self) -> Path:
        """The snapshot directory, materialized on first use (read it, never write it)."""
        return materialize(self.snapshot, self.fill)


class TaskPool:
    """Training tasks sampled uniformly, and a disjoint held-out list."""

    def __init__(self, train: list[SweTask], held_out: list[SweTask]) -> None:
        self.train, self.held_out = train, held_out

    def sample(self, rng: random.Random) -> SweTask:
        if not self.train:
            raise ValueError(
                "env 'swe': no training tasks left after the held-out split; lower "
                "env.eval_size or give more tasks"
            )
        return rng.choice(self.train)
