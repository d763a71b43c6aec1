"""Rollout worker: keeps an engine busy with single rollouts of fresh prompts.

The worker fills the engine up to `max_concurrent` running sequences, runs decoding steps, and
turns each finished completion into a scored `Trajectory` on the output queue. It never waits
for a group: a trajectory is ready for the learner the moment its own sequence finishes.

Admission control (DESIGN.md section 2): the i-th rollout (counting from 0) may start only
while `i < (consumed + max(max_staleness, 1)) * batch_size`, where `consumed` is the number of
batches the learner has taken. If the learner trained on trajectories in start order, rollout i
would be trained in batch `i // batch_size`, at most `max_staleness - 1` batches after it
started: one batch of slack, because completion order differs from start order (a long rollout
finishes after shorter ones that started later). Weight pushes may lag too, so the learner still
checks staleness and drops what exceeds it.
"""

from __future__ import annotations

import queue
import random
import threading
import time
from typing import Any

from saorl.envs.arithmetic import ArithmeticTask, Problem
from saorl.models.tokenizer import encode_prompt
from saorl.rollout.engine import Completion, Engine, GenerationRequest
from saorl.types import Trajectory


class PromptFeed:
    """Training prompts for every worker, under the admission rule above; thread-safe.

    `admitted` counts rollouts started under the rule (rebased to `consumed * batch_size` on
    resume); `drawn` counts prompts taken from the task stream since the run began, the data
    position a checkpoint records.
    """

    def __init__(
        self,
        task: ArithmeticTask,
        rng: random.Random,
        batch_size: int,
        max_staleness: int,
        consumed: int = 0,
        drawn: int = 0,
    ) -> None:
        self.task = task
        self.rng = rng
        self.batch_size = batch_size
        self.max_staleness = max_staleness
        self.consumed = consumed
        self.admitted = consumed * batch_size
        self.drawn = drawn
        self.cond = threading.Condition()

    def next(self) -> Problem | None:
        """A fresh training problem, or None while admission control says wait."""
        with self.cond:
            if self.admitted >= (self.consumed + max(self.max_staleness, 1)) * self.batch_size:
                return None
            self.admitted += 1
            self.drawn += 1
            return self.task.sample(self.rng)

    def consume(self) -> None:
        """The learner took a batch: admit the next one."""
        with self.cond:
            self.consumed += 1
            self.cond.notify_all()

    def state(self) -> dict[str, Any]:
        with self.cond:
            return {"prompt_rng": self.rng.getstate(), "data_position": self.drawn}


def completion_to_trajectory(c: Completion, tokenizer: Any, task: ArithmeticTask) -> Trajectory:
    problem: Problem = c.request.payload
    text = tokenizer.decode(c.token_ids, skip_special_tokens=True)
    reward = task.reward(problem, text) if c.finish_reason != "aborted" else 0.0
    return Trajectory(
        prompt_ids=list(c.request.prompt_ids),
        completion_ids=list(c.token_ids),
        loss_mask=[1] * len(c.token_ids),
        rollout_logprobs=list(c.logprobs),
        versions=list(c.versions),
        reward=reward,
        stop_reason=c.finish_reason,
        prompt_key=problem.key,
        info={"text": text},
    )


class RolloutWorker:
    """Keeps one engine full of single rollouts from a shared `PromptFeed`.

    Several workers (one engine each) may share a feed and an output queue.
    """

    def __init__(
        self,
        engine: Engine,
        feed: PromptFeed,
        tokenizer: Any,
        out: queue.Queue[Trajectory],
        *,
        max_new_tokens: int,
        max_concurrent: int,
        stop: list[str] | None = None,
        name: str = "rollout-worker",
    ) -> None:
        self.engine = engine
        self.feed = feed
        self.tokenizer = tokenizer
        self.out = out
        self.max_new_tokens = max_new_tokens
        self.max_concurrent = max_concurrent
        self.stop = stop or []
        self.name = name
        self.idle_s = 0.0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._requests = 0

    def fill(self) -> None:
        """Start as many new rollouts as the engine has room for and admission allows."""
        while self.engine.num_unfinished() < self.max_concurrent:
            problem = self.feed.next()
            if problem is None:
                return
            self._requests += 1
            self.engine.add_request(
                GenerationRequest(
                    prompt_ids=encode_prompt(self.tokenizer, problem.prompt),
                    max_new_tokens=self.max_new_tokens,
                    request_id=self._requests,
                    stop=self.stop,
                    payload=problem,
                )
            )

    def step(self) -> int:
        """One decoding step; finished trajectories go to `out`. Returns how many finished."""
        done = self.engine.step()
        for c in done:
            self.out.put(completion_to_trajectory(c, self.tokenizer, self.feed.task))
        return len(done)

    # -- background thread ------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                self.fill()
                if self.engine.num_unfinished() == 0:
                    # Admission says wait: sleep until the learner consumes a batch.
                    t0 = time.perf_counter()
                    with self.feed.cond:
                        self.feed.cond.wait(timeout=0.05)
                    self.idle_s += time.perf_counter() - t0
                    continue
                self.step()
        except BaseException as e:  # surfaced to the learner thread, which re-raises
            self.error = e

    def stop_thread(self) -> None:
        self._stop.set()
        with self.feed.cond:
            self.feed.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
