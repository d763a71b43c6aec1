"""`run.concurrency = "process"`: each rollout worker in a child process of its own, no Ray.

With the rollout worker as a thread, the learner's step runs 1.35-1.57x slower beside it: the
two share the interpreter lock, which the engine's decoding loop holds about a third of its time
(docs/performance.md, generation-bound section). Here each worker is the Ray path's
`RolloutActor` (an engine and a `RolloutWorker` thread fed with admitted tasks) in a
`ProcessActor` child, driven by the Ray path's proxy (`RayRolloutWorker`: one pump thread per
child exchanges admitted tasks for finished trajectories, at least 20 ms apart), so the pool is
`saorl.rollout.pool.WorkerPool` with other workers: batches, restarts, checkpoints (the pending
rollouts a checkpoint keeps, `saorl.rollout.resume`) work as with threads.

Weights: one `SharedWeights` file holds the learner's whole push state (a LoRA policy's base
weights and adapters); `update_weights` writes a push into it in place, a memory copy, and
returns. Each child takes the newer weights at its next exchange, before new tasks join its
engine, and the engine loads them between two decoding steps, tokens labelled with the version.

A child that dies fails its next exchange with an `ActorFailure` naming it and how it ended; the
batch collector replaces it with a new child at the learner's current weights, its unfinished
tasks re-issued (`run.max_worker_restarts`), or stops the run saying which worker died. The
engines' sampling RNG stays in the children and is not checkpointed (as with Ray).
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

from saorl.config import Config
from saorl.distributed.proc_actor import ProcessActor, SharedWeights
from saorl.distributed.ray_actors import RolloutActor
from saorl.distributed.ray_pool import RayRolloutWorker
from saorl.models.lora import state_bytes
from saorl.rollout.pool import PolicySource, WorkerPool
from saorl.rollout.worker import AgentLimits


class ProcRolloutActor(RolloutActor):
    """A `RolloutActor` in a child process, taking the learner's weights from shared memory."""

    def __init__(
        self,
        cfg: Config,
        cwd: str,
        name: str,
        seed: int,
        tokenizer: Any,
        limits: AgentLimits,
        weights: SharedWeights,
        push_names: list[str],
        run_dir: Path | None = None,
    ) -> None:
        super().__init__(cfg, cwd, name, seed, tokenizer, limits, run_dir)
        self.weights = weights
        self.push_names = push_names
        self.loaded = -1  # the version the engine has; the first read takes every tensor
        self.pull_weights()

    def pull_weights(self) -> None:
        """Queue the shared weights on the engine if they are newer than its own."""
        names = list(self.weights.tensors) if self.loaded < 0 else self.push_names
        got = self.weights.read(names, self.loaded)
        if got is not None:
            state, self.loaded = got
            self.engine.update_weights(state, self.loaded)

    def exchange(self, tasks: list[tuple[Any, int]], wait_s: float) -> tuple:
        self.pull_weights()  # before the new tasks start: they sample the newest weights
        return super().exchange(tasks, wait_s)

    def engine_state(self) -> dict[str, Any]:
        self.pull_weights()
        return super().engine_state()


class ProcRolloutWorker(RayRolloutWorker):
    """The driver's proxy of a `ProcRolloutActor` (the Ray proxy over a `ProcessActor`)."""

    def _call(self, method: str, *args: Any) -> Any:
        return self.actor.call(method, *args)

    def _stop_actor(self) -> None:
        with contextlib.suppress(Exception):  # the child may be the thing that failed
            self.actor.call("stop")
        self.actor.close()


class ProcWorkerPool(WorkerPool):
    """`WorkerPool` whose workers run in child processes, weights shared through memory."""

    def __init__(self, cfg: Config, tokenizer: Any, learner: PolicySource) -> None:
        super().__init__(cfg, tokenizer, learner)
        self.weights: SharedWeights | None = None
        self._actors: list[ProcessActor] = []

    def _spawn(self, i: int, seed: int) -> ProcessActor:
        assert self.weights is not None
        name = f"rollout-{i}"
        actor = ProcessActor(
            name,
            ProcRolloutActor,
            self.cfg,
            os.getcwd(),
            name,
            seed,
            self.tokenizer,
            self.limits,
            self.weights,
            self._push_names,
            self.run_dir,
            pass_fds=self.weights.fds,
        )
        self._actors.append(actor)
        return actor

    def _proxy(self, actor: ProcessActor) -> ProcRolloutWorker:
        actor.wait_started()
        room = actor.call("ready")
        return ProcRolloutWorker(actor, actor.name, self.feed, self.out, room)

    def _spawn_all(self) -> list[Any]:
        """One child per seed, started together, all at the learner's current weights."""
        self.weights = SharedWeights(self.learner.push_state(full=True), self.learner.version)
        self._push_names = sorted(self.learner.push_state())
        actors = [self._spawn(i, seed) for i, seed in enumerate(self.seeds)]
        return [self._proxy(a) for a in actors]

    def respawn(self, i: int) -> ProcRolloutWorker:
        """A new child in place of worker `i` (dead), at the learner's current weights."""
        assert self.weights is not None
        self.weights.write(self.learner.push_state(full=True), self.learner.version)
        self._actors = [a for a in self._actors if a.proc.poll() is None]
        return self._proxy(self._spawn(i, self._restart_seed(i)))

    def update_weights(self) -> int:
        """Write the push into shared memory; each child takes it at its next exchange."""
        assert self.weights is not None
        state = self.learner.push_state()
        self.weights.write(state, self.learner.version)
        return state_bytes(state)

    def close(self) -> None:
        """Stop the pump threads and end every child."""
        for w in self.workers:
            w.stop_thread()
        for a in self._actors:
            a.close()
        if self.weights is not None:
            self.weights.close()
        self.workers = []
        self._actors = []
