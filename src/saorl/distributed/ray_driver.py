"""Ray placement (`saorl train --ray`): the driver side of the learner and rollout actors.

What runs where:
- the driver (the `saorl train` process) runs the loop of `saorl.loop` unchanged: the
  `PromptFeed` (admission control), batch collection, the staleness drop, metrics and the
  evaluation / checkpoint schedule. It holds no model weights.
- the learner actor owns policy, critic and both optimizers (a `saorl.learner.Learner`; with
  `ray.learner_ranks` > 1, N actors packed on one node shard one FSDP2 learner and rank 0
  answers) and runs whatever needs the weights: supervised warm-up, evaluation, checkpoints,
  the final export. The critic lives here rather than in an actor of its own: every step
  updates it from the same batch right before the policy (values before its K updates give the
  advantages), so a separate actor would add a batch transfer and a round trip per step and
  overlap nothing.
- each rollout actor (`rollout.num_workers` of them) owns an engine from `build_engine` and a
  `RolloutWorker` thread (agent loop + environments) that runs only tasks the driver admitted.

The loop sees driver-side proxies with the vocabulary it already uses: `RayLearner` has `step`,
`steps`, `version` and `call(fn, *args)` (run `fn(learner, *args)` in the actor);
`RayRolloutWorker` has what the loop calls on a `RolloutWorker` (`start`, `fill`, `step`,
`stop_thread`, `idle_s`, `error`, `name`, `engine.tokens_generated`).

Admission control across processes: the driver's `PromptFeed` stays the only source of tasks.
One pump thread per rollout actor repeatedly calls `exchange`: it sends the tasks admitted for
that actor's free slots and gets back the trajectories that finished and the slots now free, so a
task is admitted exactly when it is handed to an engine with room, as in one process.

Weights: after a push the learner's state is one Ray object (the return value of
`policy_state`, stored once) that every rollout actor loads, or with `ray.weight_sync =
"broadcast"` a `torch.distributed` broadcast from the learner (`saorl.distributed.weight_sync`).
The driver waits until every engine has the new weights, as the in-process push does.

Failures: every remote call is awaited through `_get`, which turns a dead actor into an
`ActorFailure` naming its role; a failure in a rollout actor reaches the loop through the
worker's `error`. Restarting actors (a later issue) would hook in there.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections.abc import Callable, Iterator
from typing import Any

from saorl.config import Config, ConfigError
from saorl.distributed.ray_actors import LearnerActor, RolloutActor
from saorl.rollout.worker import AgentLimits, PromptFeed
from saorl.types import Batch, Trajectory

_POLL_S = 0.05  # longest an exchange waits for a trajectory before reporting back


class ActorFailure(RuntimeError):
    """A Ray actor died or did not answer; the message names its role."""


def _ray() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            "ray.enabled: Ray is not installed; pip install 'saorl[ray]' (or run without --ray)"
        ) from e
    return ray


def _get(refs: Any, role: str, timeout: float | None = None) -> Any:
    """`ray.get`, with a dead or silent actor reported as an `ActorFailure` naming `role`.

    Exceptions raised inside an actor method come back as themselves (Ray's task errors are
    instances of the original class), so a `ConfigError` in the learner is still one here.
    """
    ray = _ray()
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayActorError as e:
        raise ActorFailure(f"{role}: the Ray actor died: {e}") from e
    except ray.exceptions.GetTimeoutError as e:
        raise ActorFailure(
            f"{role}: no answer within {timeout:g} s (placed? the cluster may lack the CPUs/GPUs "
            "that the [ray] section asks for; raise ray.start_timeout_s for slow model loads)"
        ) from e


def init_ray(cfg: Config) -> bool:
    """Join `ray.address` or start a local Ray, unless one is up; True if this call did it."""
    ray = _ray()
    if ray.is_initialized():
        return False
    if cfg.ray.address:
        ray.init(address=cfg.ray.address)
    else:
        # "local": a new Ray even if this machine runs one (joining is what address is for).
        ray.init(address="local", num_cpus=cfg.ray.num_cpus or os.cpu_count(),
                 include_dashboard=False)  # fmt: skip
    return True


def _check_resources(cfg: Config) -> None:
    rc, n = cfg.ray, cfg.rollout.num_workers
    have = _ray().cluster_resources()
    for kind, learner, rollout in (("CPU", rc.learner_num_cpus, rc.rollout_num_cpus),
                                   ("GPU", rc.learner_num_gpus, rc.rollout_num_gpus)):  # fmt: skip
        need = rc.learner_ranks * learner + n * rollout
        if need > have.get(kind, 0.0) + 1e-9:
            key = kind.lower()
            raise ConfigError(
                f"ray: the actors need {need:g} {kind}s (ray.learner_ranks = {rc.learner_ranks} "
                f"x ray.learner_num_{key}s = {learner:g} + rollout.num_workers = {n} x "
                f"ray.rollout_num_{key}s = {rollout:g}) but the Ray cluster has "
                f"{have.get(kind, 0.0):g}; lower those fields or add nodes"
            )


class _EngineStats:
    """What the loop reads from a rollout engine, as of the last exchange."""

    tokens_generated = 0


class RayRolloutWorker:
    """Driver-side proxy of a `RolloutActor` with the `RolloutWorker` interface the loop uses."""

    def __init__(self, actor: Any, name: str, feed: PromptFeed, out: queue.Queue[Trajectory],
                 room: int) -> None:  # fmt: skip
        self.actor, self.name, self.feed, self.out = actor, name, feed, out
        self.engine = _EngineStats()
        self.idle_s = 0.0
        self.error: BaseException | None = None
        self._room, self._tasks = room, []
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

    # -- synchronous mode: the loop drives every step ---------------------------------------
    def fill(self) -> None:
        self._tasks += self._admit()

    def step(self) -> int:
        tasks, self._tasks = self._tasks, []
        return self._absorb(_get(self.actor.step_once.remote(tasks), self.name))

    # -- background mode: a pump thread exchanges tasks and trajectories ---------------------
    def start(self) -> None:
        _get(self.actor.start.remote(), self.name)
        self._thread = threading.Thread(target=self._pump, name=f"{self.name}-pump", daemon=True)
        self._thread.start()

    def _pump(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    tasks = self._admit()
                    self._absorb(_get(self.actor.exchange.remote(tasks, _POLL_S), self.name))
        except BaseException as e:  # surfaced by the loop's batch collector, which re-raises
            self.error = e

    # -- checkpoints (saorl.resume) ------------------------------------------------------------
    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """No exchange in flight and the actor's worker held; its finished work is in `out`."""
        with self._lock:
            self._deliver(_get(self.actor.pause.remote(), self.name))
            try:
                yield
            finally:
                _get(self.actor.unpause.remote(), self.name)

    def in_flight(self) -> list[tuple[Any, int]]:
        """`(task, group id)` of every task handed out and not finished (dead actor or not)."""
        return [(task, g) for g, tasks in self._outstanding.items() for task in tasks]

    def stop_thread(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.actor.stop.remote()  # not awaited: the actor may be the thing that failed


class RayLearner:
    """Driver-side handle on the Ray side of a run: the learner actor and the rollout actors.

    Starts (or joins) Ray and the learner actor on construction; `rollout_workers` starts the
    rollout actors; `close` ends every actor and the Ray session this handle started.
    """

    def __init__(self, cfg: Config) -> None:
        ray = _ray()
        self.cfg = cfg
        self._own_ray = init_ray(cfg)
        self.rollout_actors: list[Any] = []
        self.workers: list[RayRolloutWorker] = []
        self.learner_actors: list[Any] = []
        self._placement: Any = None  # placement group of the learner ranks
        self._followers: list[Any] = []  # ranks > 0: their `setup` returns only at the end
        try:
            _check_resources(cfg)
            rc, n = cfg.ray, cfg.ray.learner_ranks
            if n > 1 and not cfg.learner.fsdp:
                raise ConfigError(
                    f"ray.learner_ranks = {n} needs learner.fsdp = true (the ranks shard one "
                    "learner with FSDP2); or set ray.learner_ranks = 1"
                )
            self.learner_actors = [
                ray.remote(LearnerActor)
                .options(num_cpus=rc.learner_num_cpus, num_gpus=rc.learner_num_gpus,
                         **self._learner_placement(r))
                .remote(cfg, os.getcwd())
                for r in range(n)
            ]  # fmt: skip
            self.actor = self.learner_actors[0]
            host, port = _get(self.actor.address.remote(), "learner", rc.start_timeout_s)
            ranks = [a.setup.remote(r, n, host, port) for r, a in enumerate(self.learner_actors)]
            self._followers = ranks[1:]
            self.steps, self.version = self._learner_get(ranks[0], rc.start_timeout_s)
            self.tokenizer = _get(self.actor.get_tokenizer.remote(), "learner")
        except BaseException:
            self.close()
            raise

    def _learner_placement(self, rank: int) -> dict[str, Any]:
        """Several learner ranks go on one node (a STRICT_PACK placement group): FSDP2's
        collectives run every micro-batch, over NVLink rather than between nodes."""
        rc = self.cfg.ray
        bundle = {k: v for k, v in (("CPU", rc.learner_num_cpus), ("GPU", rc.learner_num_gpus))
                  if v > 0}  # fmt: skip
        if rc.learner_ranks == 1 or not bundle:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._placement is None:
            bundles = [bundle] * rc.learner_ranks
            self._placement = _ray().util.placement_group(bundles, "STRICT_PACK")
            _get(self._placement.ready(), "learner placement group", rc.start_timeout_s)
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(self._placement, rank)}

    def _learner_wait(self, ref: Any, timeout: float | None = None) -> None:
        """Wait for rank 0's call `ref`; a learner rank > 0 that stops first (it died) is
        reported, rather than left with rank 0 waiting for it in a collective forever."""
        if self._followers:
            ready, _ = _ray().wait([ref, *self._followers], num_returns=1, timeout=timeout)
            if ready and ready[0] is not ref:
                rank = self._followers.index(ready[0]) + 1
                _get(ready[0], f"learner rank {rank}")
                raise ActorFailure(f"learner rank {rank}: stopped while rank 0 was working")

    def _learner_get(self, ref: Any, timeout: float | None = None) -> Any:
        self._learner_wait(ref, timeout)
        return _get(ref, "learner", timeout)

    def step(self, batch: Batch) -> dict[str, Any]:
        metrics, self.steps, self.version = self._learner_get(self.actor.step.remote(batch))
        return metrics

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """`fn(learner, *args)` run in the learner actor (`fn` and `args` must pickle)."""
        result, self.steps, self.version = self._learner_get(self.actor.call.remote(fn, args))
        return result

    def rollout_workers(self, feed: PromptFeed, out: queue.Queue[Trajectory], limits: AgentLimits,
                        seeds: list[int]) -> list[RayRolloutWorker]:  # fmt: skip
        """One rollout actor per seed, holding the learner's current weights."""
        rc = self.cfg.ray
        self._feed, self._out, self._limits, self._seeds = feed, out, limits, seeds
        names = [f"rollout-{i}" for i in range(len(seeds))]
        self.rollout_actors = [self._spawn(n, s) for n, s in zip(names, seeds, strict=True)]
        rooms = _get([a.ready.remote() for a in self.rollout_actors], "rollout actors",
                     timeout=rc.start_timeout_s)  # fmt: skip
        if rc.weight_sync == "broadcast":
            self._form_group()
        self.workers = [RayRolloutWorker(a, name, feed, out, room) for a, name, room in
                        zip(self.rollout_actors, names, rooms, strict=True)]  # fmt: skip
        self.push_weights()
        return self.workers

    def _spawn(self, name: str, seed: int) -> Any:
        rc = self.cfg.ray
        remote = (
            _ray()
            .remote(RolloutActor)
            .options(num_cpus=rc.rollout_num_cpus, num_gpus=rc.rollout_num_gpus, max_concurrency=4)
        )
        return remote.remote(self.cfg, os.getcwd(), name, seed, self.tokenizer, self._limits)

    def respawn(self, i: int) -> RayRolloutWorker:
        """A new actor in place of rollout actor `i` (dead), with the learner's current weights.

        The seam for restarts (`BatchCollector.respawn`); the caller re-issues the old worker's
        `in_flight()` tasks. Object-store weight sync only: a broadcast group cannot swap a rank.
        """
        name = f"rollout-{i}"
        if self.cfg.ray.weight_sync != "object_store":
            raise ActorFailure(
                f"{name}: restarting a rollout actor needs ray.weight_sync = 'object_store' "
                "(a broadcast group cannot replace one of its ranks)"
            )
        self._restarts = getattr(self, "_restarts", 0) + 1
        actor = self._spawn(name, self._seeds[i] + 7919 * self._restarts)
        room = _get(actor.ready.remote(), name, timeout=self.cfg.ray.start_timeout_s)
        _ray().kill(self.rollout_actors[i])
        self.rollout_actors[i] = actor
        _get(actor.update_weights.remote(self.actor.policy_state.remote(), self.version), name)
        self.workers[i] = RayRolloutWorker(actor, name, self._feed, self._out, room)
        return self.workers[i]

    def _form_group(self) -> None:
        host, port, backend, meta = self._learner_get(self.actor.group_address.remote())
        world, timeout = len(self.rollout_actors) + 1, self.cfg.ray.start_timeout_s
        _get([self.actor.join_group.remote(host, port, world, backend, timeout)] + [
            a.join_group.remote(host, port, i + 1, world, backend, meta, timeout)
            for i, a in enumerate(self.rollout_actors)
        ], "broadcast group")  # fmt: skip

    def push_weights(self) -> None:
        """The learner's current weights into every rollout engine, as version `version`."""
        sync = self.cfg.ray.weight_sync
        if sync == "broadcast":
            self.push_via_broadcast()
        elif sync == "object_store":
            self.push_via_object_store()
        else:
            raise ValueError(f"ray.weight_sync: unknown {sync!r}")

    def push_via_object_store(self) -> None:
        state = self.actor.policy_state.remote()  # stored once, loaded by every actor
        self._learner_wait(state)
        _get([a.update_weights.remote(state, self.version) for a in self.rollout_actors],
             "weight push")  # fmt: skip

    def push_via_broadcast(self) -> None:
        """Needs the group that `rollout_workers` forms when `ray.weight_sync = "broadcast"`."""
        sent = self.actor.broadcast_weights.remote()
        received = [a.receive_weights.remote(self.version) for a in self.rollout_actors]
        self._learner_wait(sent)
        _get([sent, *received], "weight push")

    def close(self) -> None:
        """End every actor; shut Ray down if this handle started it."""
        ray = _ray()
        for w in self.workers:
            w.stop_thread()
        if self._followers:  # let the other learner ranks leave their loop; kill them anyway
            ray.wait([self.actor.close_learner.remote()], timeout=30)
        for a in [*self.rollout_actors, *self.learner_actors]:
            ray.kill(a)
        self.rollout_actors, self.workers, self.learner_actors = [], [], []
        if self._placement is not None:
            ray.util.remove_placement_group(self._placement)
            self._placement = None
        if self._own_ray:
            ray.shutdown()
