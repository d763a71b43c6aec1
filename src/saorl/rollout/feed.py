"""Where rollout workers get their tasks: `PromptFeed` (training, under admission control) and
`FixedFeed` (a fixed list, evaluation).

Admission control (docs/design.md section 2): the i-th rollout (counting from 0) may start only
while `i < (consumed + max(lookahead, 1)) * batch_size`, where `consumed` is the number of
batches the learner has taken and `lookahead` is `saorl.loop.admission_lookahead`:
`learner.max_staleness // algorithm.minibatches` batches, staleness being counted in policy
versions and one batch making `minibatches` of them. (`PromptFeed`'s `max_staleness` argument
is that lookahead in batches.) Completion order differs from start order (a long rollout
finishes after shorter ones that started later) and weight pushes may lag, so the learner still
checks staleness and drops what exceeds it.
"""

from __future__ import annotations

import random
import threading
from collections import deque
from typing import Any


class PromptFeed:
    """Training tasks (anything with a `key`, e.g. a `Problem`) for every worker; thread-safe.

    Hands them out under the admission rule above.

    `admitted` counts rollouts started under the rule (rebased to `consumed * batch_size` on
    resume); `drawn` counts prompts taken from the task stream since the run began, the data
    position a checkpoint records.
    """

    def __init__(
        self,
        task: Any,
        rng: random.Random,
        batch_size: int,
        max_staleness: int,
        consumed: int = 0,
        drawn: int = 0,
        group_size: int = 1,
    ) -> None:
        self.task = task
        self.group_size = group_size
        self._left = 0  # rollouts still to hand out for the current group
        self._current: Any = None
        self._group = drawn - 1
        self.rng = rng
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.consumed = consumed
        self.admitted = consumed * batch_size
        self.drawn = drawn
        self.cond = threading.Condition()
        self._reissue: deque[tuple[Any, int]] = deque()  # in-flight at a checkpoint: run first

    def next(self) -> tuple[Any, int] | None:
        """`(task, group id)` for a new rollout, or None while admission control says wait.

        With `group_size` n > 1 (GRPO-style algorithms) each drawn task is handed out n times
        in a row under one group id; otherwise every rollout is its own group.
        """
        with self.cond:
            if self.admitted >= (self.consumed + max(self.max_staleness, 1)) * self.batch_size:
                return None
            self.admitted += 1
            if self._reissue:
                return self._reissue.popleft()
            if self._left == 0:
                self._current = self.task.sample(self.rng)
                self.drawn += 1
                self._group += 1
                self._left = self.group_size
            self._left -= 1
            return self._current, self._group

    def release(self) -> None:
        """A started rollout will not be trained (dropped, failed): admit a replacement."""
        with self.cond:
            self.admitted -= 1
            self.cond.notify_all()

    def charge(self, n: int) -> None:
        """`n` trajectories went into batches beyond their episodes' admissions (an agent
        episode of k segments fills k places): count them as admitted, so that the rule,
        whose cap is in trajectories (`batch_size` per batch), counts them too."""
        with self.cond:
            self.admitted += n

    def consume(self) -> None:
        """The learner took a batch: admit the next one."""
        with self.cond:
            self.consumed += 1
            self.cond.notify_all()

    def reissue(self, items: list[tuple[Any, int]]) -> None:
        """Hand these started tasks out again, first (their worker died): no new admission."""
        with self.cond:
            self.admitted -= len(items)
            self._reissue.extend(items)
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        with self.cond:
            return {
                "prompt_rng": self.rng.getstate(),
                "data_position": self.drawn,
                # A group half handed out: its remaining members are still owed after a resume.
                "feed_group": (self._left, self._current, self._group),
            }

    def restore(self, state: dict[str, Any], reissue: list[tuple[Any, int]], finished: int) -> None:
        """Continue a checkpointed feed: re-issue its in-flight tasks first (same group ids),
        and count `finished` restored trajectories as already admitted."""
        with self.cond:
            if "feed_group" in state:
                self._left, self._current, self._group = state["feed_group"]
            self._reissue.extend(reissue)
            self.admitted += finished


class FixedFeed:
    """A fixed list of tasks handed out once each, with no admission control (evaluation)."""

    def __init__(self, items: list[Any]) -> None:
        self.items = deque(items)
        self.cond = threading.Condition()

    def next(self) -> tuple[Any, int] | None:
        with self.cond:
            return (self.items.popleft(), -1) if self.items else None

    def release(self) -> None:
        """Nothing to re-admit: every item is handed out exactly once."""

    def reissue(self, items: list[tuple[Any, int]]) -> None:
        """Hand these started tasks out again, first (their environment had no room)."""
        with self.cond:
            self.items.extendleft(task for task, _ in reversed(items))
