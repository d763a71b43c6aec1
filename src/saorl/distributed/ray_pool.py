"""Rollout workers as Ray actors (`saorl train --ray`): `RayWorkerPool` and its worker proxies.

Each rollout actor (`saorl.distributed.ray_actors.RolloutActor`, `rollout.num_workers` of them)
owns an engine from `build_engine` and a `RolloutWorker` thread (agent loop + environments) that
runs only tasks the driver admitted. In the driver, `RayRolloutWorker` stands in for a
`RolloutWorker` (`start`, `fill`, `step`, `paused`, `in_flight`, `stop_thread`, `idle_s`,
`error`, `name`, `engine.tokens_generated`), so the pool is `saorl.rollout.pool.WorkerPool`
with other workers: batches, restarts and checkpoints work unchanged.

Admission control across processes: the driver's `PromptFeed` stays the only source of tasks.
One pump thread per rollout actor repeatedly calls `exchange`: it sends the tasks admitted for
that actor's free slots and gets back the trajectories that finished and the slots now free, so
a task is admitted exactly when it is handed to an engine with room, as in one process. The
exchanges are at least `_EXCHANGE_EVERY_S` apart: each one wakes threads in the driver and the
actor (where its handler takes the GIL from the decoding thread), and one per finished
trajectory (~130 a second on the generation-bound benchmark) preempted the learner actor ~500
times a second and slowed decoding; batched, a finished row's slot is refilled at most that
much later.

Weights (`ray.weight_sync`): the learner's state as one Ray object (the return value of
`push_state`, stored once) that every rollout actor loads, or a `torch.distributed` broadcast
from the learner (`saorl.distributed.weight_sync`). A LoRA policy (`model.lora_push =
"adapter"`) sends its whole unmerged state to new actors and its adapters alone after that.
The driver waits until every engine has the new weights, except for an object-store push in
asynchronous mode: the loop goes on with the next learner step while the actors take them (in
one process the push is queued at once; the round trip cost the loop 10-14 ms a step on the
generation-bound benchmark), and each push first awaits the one before, so at most one is in
flight: an actor runs calls on several threads, and an older push landing after a newer one
would roll its weights back.

A dead rollout actor is replaced (`respawn`) by a new one with the learner's current weights and
the dead one's unfinished tasks, which the driver knows without asking the dead process, whether
it died between pushes, during one or during a checkpoint's pause (a node lost, say); the new
actor goes wherever `ray.rollout_resources` fit, and waits up to `ray.start_timeout_s` for a node
to place it on. In asynchronous mode it is placed in the background (`_Replacement`) and the run
goes on with the other actors. A broadcast group cannot swap a rank, so with `"broadcast"` a dead
rollout actor stops the run.
"""

from __future__ import annotations

import contextlib
import math
import os
import queue
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import torch

from saorl.config import Config
from saorl.distributed.ray_actors import RolloutActor
from saorl.distributed.ray_learner import ActorFailure, RayLearner, get, ray_module
from saorl.rollout.pool import WorkerPool
from saorl.rollout.worker import PromptFeed
from saorl.types import Trajectory

_POLL_S = 0.05  # longest an exchange waits for a trajectory before reporting back
_EXCHANGE_EVERY_S = 0.02  # shortest time from one exchange's start to the next one's


class _EngineStats:
    """What the pool reads from a rollout actor's engine, as of the last exchange."""

    tokens_generated = 0

    def rng_state(self) -> torch.Tensor | None:
        """The actor's sampling RNG stays in the actor: not checkpointed."""
        return None

    def set_rng_state(self, state: torch.Tensor) -> None:
        """See `rng_state`."""


class RayRolloutWorker:
    """Driver-side proxy of a `RolloutActor` with the `RolloutWorker` interface the pool uses."""

    live = True  # placed, with the learner's weights: takes tasks and every push

    def __init__(
        self, actor: Any, name: str, feed: PromptFeed, out: queue.Queue[Trajectory], room: int
    ) -> None:
        self.actor = actor
        self.name = name
        self.feed = feed
        self.out = out
        self.engine = _EngineStats()
        self.idle_s = 0.0
        self.error: BaseException | None = None
        self._room = room
        self._tasks = []
        self._actor_idle = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # held by one exchange at a time, or by a checkpoint
        # Tasks handed to the actor and not back as trajectories, by group id: what `in_flight`
        # reports, known here so that it survives the actor's death (restarts re-issue them).
        self._outstanding: dict[int, list[Any]] = {}

    def _admit(self) -> list[tuple[Any, int]]:
        tasks = []
        while len(tasks) < self._room and (item := self.feed.next()) is not None:
            tasks.append(item)
            self._outstanding.setdefault(item[1], []).append(item[0])
        self._room -= len(tasks)
        return tasks

    def _deliver(self, done: list[Trajectory]) -> None:
        for t in done:
            tasks = self._outstanding.get(t.group_id)
            if tasks:
                tasks.pop()
                if not tasks:
                    del self._outstanding[t.group_id]
            self.out.put(t)

    def _absorb(self, reply: tuple) -> int:
        done, self._room, actor_idle, self.engine.tokens_generated = reply
        self._deliver(done)
        self.idle_s += actor_idle - self._actor_idle
        self._actor_idle = actor_idle
        return len(done)

    def _call(self, method: str, *args: Any) -> Any:
        """`method(*args)` on the actor, awaited (a process actor overrides this)."""
        return get(getattr(self.actor, method).remote(*args), self.name)

    # -- synchronous mode: the pool drives every step -----------------------------------------
    def fill(self) -> None:
        self._tasks += self._admit()

    def step(self) -> int:
        tasks, self._tasks = self._tasks, []
        return self._absorb(self._call("step_once", tasks))

    # -- background mode: a pump thread exchanges tasks and trajectories ---------------------
    def start(self) -> None:
        self._call("start")
        self._thread = threading.Thread(target=self._pump, name=f"{self.name}-pump", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                with self._lock:
                    tasks = self._admit()
                    self._absorb(self._call("exchange", tasks, _POLL_S))
                # Outside the lock: a checkpoint's `paused` need not wait for the pause.
                self._stop.wait(max(0.0, _EXCHANGE_EVERY_S - (time.monotonic() - started)))
        except BaseException as e:  # surfaced by the pool's batch collector, which re-raises
            self.error = e

    # -- checkpoints (saorl.rollout.resume) ------------------------------------------------
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No exchange in flight and the actor's worker held; its finished work is in `out`.

        A dead actor holds nothing to pause: its unfinished tasks are `in_flight` (known here)
        and the collector replaces it after the checkpoint (`run.max_worker_restarts`)."""
        with self._lock:
            try:
                self._deliver(self._call("pause"))
            except ActorFailure as e:
                self.error = self.error or e
                yield
                return
            try:
                yield
            finally:
                self._call("unpause")

    def in_flight(self) -> list[tuple[Any, int]]:
        """`(task, group id)` of every task handed out and not finished (dead actor or not)."""
        return [(task, g) for g, tasks in self._outstanding.items() for task in tasks]

    def stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._stop_actor()

    def _stop_actor(self) -> None:
        self.actor.stop.remote()  # not awaited: the actor may be the thing that failed


class _Replacement(RayRolloutWorker):
    """A dead rollout actor's replacement in asynchronous mode, placed in the background.

    Until Ray places it (on a node with room, or one that joins within `ray.start_timeout_s`)
    and it has the learner's weights, it takes no tasks and no pushes: the run goes on with the
    other actors. It loads a full push and its version read together (`versioned_push_state`)
    under the pool's push lock, so that it then gets every later push and none older; then it
    runs as any rollout actor."""

    live = False

    def __init__(self, pool: RayWorkerPool, name: str, seed: int) -> None:
        super().__init__(None, name, pool.feed, pool.out, room=0)
        self.pool = pool
        self.seed = seed

    def start(self) -> None:
        self._thread = threading.Thread(target=self._join, name=f"{self.name}-join", daemon=True)
        self._thread.start()

    def _join(self) -> None:
        try:
            self.actor, room = self.pool._placed_anew(self.name, self.seed, self._stop)
            if self.actor is None:  # stopped meanwhile
                return
            with self.pool._push_lock:
                pushed = self.pool.learner.actor.versioned_push_state.remote()
                get(self.actor.update_weights_versioned.remote(pushed), self.name)
                self.live = True
            self._room = room
            self._call("start")
        except BaseException as e:  # surfaced by the collector, as a pump's error
            self.error = e
            return
        self._pump()

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        if not self.live:  # nothing handed to it yet: nothing to hold
            yield
            return
        with super().paused():
            yield

    def _stop_actor(self) -> None:
        if self.actor is not None:
            super()._stop_actor()


class RayWorkerPool(WorkerPool):
    """`WorkerPool` whose workers are Ray actors, fed and drained by the driver."""

    def __init__(self, cfg: Config, tokenizer: Any, learner: RayLearner) -> None:
        super().__init__(cfg, tokenizer, learner)  # type: ignore[arg-type]
        self.learner: RayLearner = learner
        self._actors: list[Any] = []  # every actor spawned and not yet killed
        self._pushing: list[tuple[Any, Any]] = []  # (actor, its update_weights call) in flight
        self._metas: dict[bool, Any] | None = None  # weight metas of full and other pushes
        self._push_lock = threading.Lock()  # a push's targets vs a replacement going live

    def _spawn_actor(self, name: str, seed: int) -> Any:
        rc = self.cfg.ray
        remote = (
            ray_module()
            .remote(RolloutActor)
            .options(
                num_cpus=rc.rollout_num_cpus,
                num_gpus=rc.rollout_num_gpus,
                resources=rc.rollout_resources or None,
                max_concurrency=4,
            )
        )
        args = (self.cfg, os.getcwd(), name, seed, self.tokenizer, self.limits, self.run_dir)
        actor = remote.remote(*args)
        self._actors.append(actor)
        return actor

    def _spawn_all(self) -> list[Any]:
        """One actor per seed, all placed at once, then the learner's current weights."""
        names = [f"rollout-{i}" for i in range(len(self.seeds))]
        actors = [self._spawn_actor(n, s) for n, s in zip(names, self.seeds, strict=True)]
        rooms = get(
            [a.ready.remote() for a in actors],
            "rollout actors",
            timeout=self.cfg.ray.start_timeout_s,
        )
        if self.cfg.ray.weight_sync == "broadcast":
            self._form_group(actors)
        self.workers = [
            RayRolloutWorker(a, name, self.feed, self.out, room)
            for a, name, room in zip(actors, names, rooms, strict=True)
        ]
        self.update_weights(full=True)  # a LoRA policy's base weights too, this once
        self._finish_push()  # no actor samples before it has the learner's weights
        return self.workers

    def _form_group(self, actors: list[Any]) -> None:
        host, port, backend, meta = self.learner.get(self.learner.actor.group_address.remote())
        world = len(actors) + 1
        timeout = self.cfg.ray.start_timeout_s
        get(
            [self.learner.actor.join_group.remote(host, port, world, backend, timeout)]
            + [
                a.join_group.remote(host, port, i + 1, world, backend, meta, timeout)
                for i, a in enumerate(actors)
            ],
            "broadcast group",
        )

    def respawn(self, i: int) -> RayRolloutWorker:
        """A new actor in place of rollout actor `i` (dead), with the learner's current weights.

        Object-store weight sync only: a broadcast group cannot swap one of its ranks.
        """
        name = f"rollout-{i}"
        if self.cfg.ray.weight_sync != "object_store":
            raise ActorFailure(
                f"{name}: restarting a rollout actor needs ray.weight_sync = 'object_store' "
                "(a broadcast group cannot replace one of its ranks)"
            )
        dead = self.workers[i].actor
        if dead is not None:  # (None: a replacement that was never placed)
            ray_module().kill(dead)
            self._actors.remove(dead)
            self._pushing = [(a, ref) for a, ref in self._pushing if a is not dead]
        if not self.sync:  # the run goes on with the other actors meanwhile
            return _Replacement(self, name, self._restart_seed(i))
        actor, room = self._placed_anew(name, self._restart_seed(i))
        get(actor.update_weights.remote(self._weights_ref(True), self.learner.version), name)
        return RayRolloutWorker(actor, name, self.feed, self.out, room)

    def _placed_anew(
        self, name: str, seed: int, stop: threading.Event | None = None
    ) -> tuple[Any, int]:
        """A new rollout actor `name`, ready, and its room; placed within `ray.start_timeout_s`
        (`(None, 0)` if `stop` is set first).

        One that dies before it is ready without an error of its own (a node lost: Ray may
        place it on a node that is failing and not yet known dead) is started again, on the
        nodes left or on one that joins meanwhile; an error of its constructor stops the run."""
        ray = ray_module()
        deadline = time.monotonic() + self.cfg.ray.start_timeout_s
        while True:
            actor = self._spawn_actor(name, seed)
            try:
                ready = actor.ready.remote()
                while not ray.wait([ready], timeout=1.0)[0]:
                    if stop is not None and stop.is_set():
                        self._actors.remove(actor)
                        ray.kill(actor)
                        return None, 0
                    if time.monotonic() > deadline:
                        break
                return actor, get(ready, name, timeout=max(deadline - time.monotonic(), 1.0))
            except ActorFailure as e:
                self._actors.remove(actor)
                ray.kill(actor)
                lost = isinstance(e.__cause__, ray.exceptions.RayActorError)
                if not lost or e.__cause__.actor_init_failed or time.monotonic() > deadline:
                    raise
                print(
                    f"saorl: {name}'s replacement died before it started ({e}); starting it again",
                    file=sys.stderr,
                )
                time.sleep(1.0)  # the scheduler learns of the lost node meanwhile

    def update_weights(self, full: bool = False) -> int:
        """Push to every actor; the bytes one receives. `full`: with a LoRA policy's base
        weights too, for engines that lack them (new actors); else its adapters only."""
        sync = self.cfg.ray.weight_sync
        if sync == "object_store":
            self.push_via_object_store(full)
        elif sync == "broadcast":
            self.push_via_broadcast(full)
        else:
            raise ValueError(f"ray.weight_sync: unknown {sync!r}")
        if self._metas is None:  # sizes and dtypes never change: asked once
            self._metas = self.learner.get(self.learner.actor.push_metas.remote())
        return sum(
            math.prod(shape) * getattr(torch, dtype).itemsize
            for _, shape, dtype in self._metas[full]
        )

    def _weights_ref(self, full: bool = False) -> Any:
        state = self.learner.actor.push_state.remote(full)  # stored once, loaded by every actor
        self.learner.wait(state)
        return state

    def push_via_object_store(self, full: bool = False) -> None:
        """Every actor gets the learner's weights; awaited in synchronous mode (the next batch
        is sampled by them), otherwise before the next push (see the module's docstring)."""
        self._finish_push()
        state = self._weights_ref(full)
        version = self.learner.version
        with self._push_lock:  # a replacement going live gets this push or a later state
            self._pushing = [
                (w.actor, w.actor.update_weights.remote(state, version))
                for w in self.workers
                if w.live
            ]
        if self.sync:
            self._finish_push()

    def _finish_push(self) -> None:
        """Await the push in flight. An actor that died meanwhile (with its node, say) is left
        to the collector, which replaces it with one that gets the current weights
        (`respawn`), as when it dies between pushes; any other error stops the run (the
        pushed state lost: the learner's node died)."""
        pushing, self._pushing = self._pushing, []
        workers = {id(w.actor): w for w in self.workers if w.actor is not None}
        for actor, ref in pushing:
            worker = workers.get(id(actor))
            try:
                get(ref, worker.name if worker else "weight push")
            except ActorFailure as e:
                if not isinstance(e.__cause__, ray_module().exceptions.RayActorError):
                    # The pushed state lived in the learner's node, which is gone.
                    raise ActorFailure(f"learner: the weights it pushed were lost: {e}") from e
                if worker is None:
                    raise
                worker.error = worker.error or e

    def push_via_broadcast(self, full: bool = False) -> None:
        """Needs the group that `start` forms when `ray.weight_sync = "broadcast"`."""
        sent = self.learner.actor.broadcast_weights.remote(full)
        version = self.learner.version
        received = [w.actor.receive_weights.remote(version, full) for w in self.workers]
        self.learner.wait(sent)
        get([sent, *received], "weight push")

    def close(self) -> None:
        """Stop the pump threads and end every rollout actor."""
        for w in self.workers:
            w.stop_thread()
        for a in self._actors:
            ray_module().kill(a)
        self.workers = []
        self._actors = []
        self._pushing = []
