"""The learner as Ray actors (`saorl train --ray`): `RayLearner`, the driver's handle on them.

The driver (the `saorl train` process) runs the loop of `saorl.loop` and holds no model
weights. The learner actor (`saorl.distributed.ray_actors.LearnerActor`) owns policy, critic and
both optimizers (a `saorl.learner.learner.Learner`; with `ray.learner_ranks` > 1, N actors packed on
one node shard one FSDP2 learner and rank 0 answers) and runs everything that needs the weights:
the supervised warm-up, evaluation, checkpoints, the final export. `RayLearner` implements
`saorl.interfaces.Learner` by calling those methods remotely; each call returns the learner's
counters too, so `steps` and `version` are current here without another round trip.

The critic lives with the policy by default. With `ray.critic_actor` it gets actors of its own
(`saorl.distributed.ray_actors.CriticActor`, each with `ray.critic_num_cpus` /
`ray.critic_num_gpus`, placed per `ray.critic_placement`), one per learner rank, started here
and handed to the learner actors: a step then sends the batch there for the advantages and runs
the critic's K updates there while the learner actors update the policy, so it takes the longer
of the two updates (plus one batch transfer), not the sum. With several learner ranks the critic
actors are a critic group that shards the critic with FSDP2 over a process group of its own
(`saorl.distributed.ray_critic`). In one process `critic.concurrent` gets the same overlap from a
thread.

The rollout actors and the weight pushes to them belong to the rollout pool
(`saorl.distributed.ray_pool.RayWorkerPool`), which reads the weights through this handle.

Failures: every remote call is awaited through `get`, which turns a dead actor into an
`ActorFailure` naming its role; with several learner ranks, `wait` also reports a rank > 0
that stopped while rank 0 was waiting for it in a collective. A dead critic rank stops the call
of its learner rank (`saorl.distributed.ray_critic.RemoteCritic` names it), reported the same way;
after any failed call `close` kills the ranks without first asking rank 0 to end the others.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from saorl.config import Config, ConfigError, RayConfig
from saorl.distributed.ray_actors import LearnerActor
from saorl.types import Batch


class ActorFailure(RuntimeError):
    """A Ray actor died or did not answer; the message names its role."""


def ray_module() -> Any:
    try:
        import ray
    except ImportError as e:
        raise ConfigError(
            "ray.enabled: Ray is not installed; pip install 'saorl[ray]' (or run without --ray)"
        ) from e
    return ray


def get(refs: Any, role: str, timeout: float | None = None) -> Any:
    """`ray.get`, with a dead or silent actor, or an object lost with the node that held it,
    reported as an `ActorFailure` naming `role`.

    Exceptions raised inside an actor method come back as themselves (Ray's task errors are
    instances of the original class), so a `ConfigError` in the learner is still one here.
    """
    ray = ray_module()
    try:
        return ray.get(refs, timeout=timeout)
    except ray.exceptions.RayActorError as e:
        raise ActorFailure(f"{role}: the Ray actor died: {e}") from e
    except ray.exceptions.ObjectLostError as e:  # (also inside a task error: an argument's)
        raise ActorFailure(f"{role}: an object it needed was lost with its node: {e}") from e
    except ray.exceptions.GetTimeoutError as e:
        raise ActorFailure(
            f"{role}: no answer within {timeout:g} s (placed? the cluster may lack the CPUs/GPUs "
            "that the [ray] section asks for; raise ray.start_timeout_s for slow model loads)"
        ) from e


def init_ray(rc: RayConfig) -> bool:
    """Join `ray.address` or start a local Ray, unless one is up; True if this call did it."""
    ray = ray_module()
    if ray.is_initialized():
        return False
    if rc.address:
        ray.init(address=rc.address)
    else:
        # "local": a new Ray even if this machine runs one (joining is what address is for).
        ray.init(address="local", num_cpus=rc.num_cpus or os.cpu_count(), include_dashboard=False)
    return True


def _check_resources(rc: RayConfig, n: int) -> None:
    """Every actor of the run (learner ranks, critic ranks, `n` rollout actors:
    `rollout.num_workers`) fits the cluster."""
    ranks = rc.learner_ranks
    have = ray_module().cluster_resources()
    wanted = [
        ("CPU", "ray.{}_num_cpus", rc.learner_num_cpus, rc.rollout_num_cpus, rc.critic_num_cpus),
        ("GPU", "ray.{}_num_gpus", rc.learner_num_gpus, rc.rollout_num_gpus, rc.critic_num_gpus),
    ]
    for name in sorted({*rc.learner_resources, *rc.rollout_resources, *rc.critic_resources}):
        amounts = (rc.learner_resources, rc.rollout_resources, rc.critic_resources)
        wanted.append((name, f"ray.{{}}_resources[{name!r}]", *(a.get(name, 0.0) for a in amounts)))
    for kind, field, learner, rollout, critic in wanted:
        critic = critic if rc.critic_actor else 0.0
        need = ranks * (learner + critic) + n * rollout
        if need > have.get(kind, 0.0) + 1e-9:
            raise ConfigError(
                f"ray: the actors need {need:g} {kind} (ray.learner_ranks = {ranks} x "
                f"({field.format('learner')} = {learner:g} + {field.format('critic')} = "
                f"{critic:g} with ray.critic_actor) + rollout.num_workers = {n} x "
                f"{field.format('rollout')} = {rollout:g}) but the Ray cluster has "
                f"{have.get(kind, 0.0):g}; lower those fields or add nodes"
                + (
                    ""
                    if kind in ("CPU", "GPU")
                    else f" started with ray start --resources '{{\"{kind}\": N}}'"
                )
            )


def _bundle(
    cpus: float, gpus: float, actors: int, custom: dict[str, float] | None = None
) -> dict[str, float]:
    """A placement-group bundle that holds `actors` actors of `cpus` CPUs, `gpus` GPUs and
    `custom` resources each."""
    amounts = {"CPU": cpus, "GPU": gpus, **(custom or {})}
    return {k: v * actors for k, v in amounts.items() if v > 0}


class RayLearner:
    """Driver-side handle on the learner actor(s).

    Starts (or joins) Ray and the learner actors on construction; `close` ends them and the
    Ray session this handle started.
    """

    def __init__(self, cfg: Config) -> None:
        ray = ray_module()
        self.cfg = cfg
        self._own_ray = init_ray(cfg.ray)
        self.learner_actors: list[Any] = []
        self.critic_actors: list[Any] = []  # `ray.critic_actor`: one per learner rank
        self._placements: list[Any] = []  # placement groups of the learner and critic ranks
        self._learners_pg: Any = None  # the learner ranks' own, without ray.critic_placement
        self._followers: list[Any] = []  # ranks > 0: their `setup` returns only at the end
        self._failed = False  # a learner call failed
        try:
            _check_resources(cfg.ray, cfg.rollout.num_workers)
            rc = cfg.ray
            n = cfg.ray.learner_ranks
            if n > 1 and not cfg.learner.fsdp:
                raise ConfigError(
                    f"ray.learner_ranks = {n} needs learner.fsdp = true (the ranks shard one "
                    "learner with FSDP2); or set ray.learner_ranks = 1"
                )
            if rc.critic_actor and n > 1 and cfg.critic.optimizer_offload:
                raise ConfigError(
                    "critic.optimizer_offload is for an unsharded critic; with ray.critic_actor "
                    f"and ray.learner_ranks = {n} the critic actors shard its optimizer state "
                    "already: unset one"
                )
            learner_at = None
            critic_setup = []
            if rc.critic_actor:
                learner_at, critic_setup = self._start_critics()
            self.learner_actors = [
                ray.remote(LearnerActor)
                .options(
                    num_cpus=rc.learner_num_cpus,
                    num_gpus=rc.learner_num_gpus,
                    resources=rc.learner_resources or None,
                    **(self._learner_placement(r) if learner_at is None else learner_at),
                )
                .remote(cfg, os.getcwd(), self.critic_actors)
                for r in range(n)
            ]
            self.actor = self.learner_actors[0]
            host, port = get(self.actor.address.remote(), "learner", rc.start_timeout_s)
            ranks = [a.setup.remote(r, n, host, port) for r, a in enumerate(self.learner_actors)]
            self._followers = ranks[1:]
            for r, ref in enumerate(critic_setup):  # built meanwhile, beside the learner ranks
                get(ref, f"critic rank {r}" if n > 1 else "critic", rc.start_timeout_s)
            self.steps, self.version = self.get(ranks[0], rc.start_timeout_s)
            self.tokenizer = get(self.actor.get_tokenizer.remote(), "learner")
        except BaseException:
            self.close()
            raise

    def _start_critics(self) -> tuple[dict[str, Any] | None, list[Any]]:
        """Start the critic actors (`ray.critic_actor`), one per learner rank, and their `setup`
        (with several: a critic group's rendezvous on critic rank 0's node); the learner ranks'
        scheduling options (None: `_learner_placement`'s) and the setup calls to wait for."""
        from saorl.distributed.ray_actors import CriticActor

        ray = ray_module()
        rc = self.cfg.ray
        n = self.cfg.ray.learner_ranks
        learner_at, critic_at = self._critic_placement()
        self.critic_actors = [
            ray.remote(CriticActor)
            .options(
                num_cpus=rc.critic_num_cpus,
                num_gpus=rc.critic_num_gpus,
                resources=rc.critic_resources or None,
                **critic_at,
            )
            .remote(self.cfg, os.getcwd())
            for _ in range(n)
        ]
        host = ""
        port = 0
        if n > 1:
            host, port = get(
                self.critic_actors[0].address.remote(), "critic rank 0", rc.start_timeout_s
            )
        return learner_at, [
            c.setup.remote(r, n, host, port) for r, c in enumerate(self.critic_actors)
        ]

    def _placement_group(self, bundles: list[dict[str, float]], strategy: str, role: str) -> Any:
        pg = ray_module().util.placement_group(bundles, strategy)
        self._placements.append(pg)
        get(pg.ready(), role, self.cfg.ray.start_timeout_s)
        return pg

    def _learner_placement(self, rank: int) -> dict[str, Any]:
        """Several learner ranks go on one node (a STRICT_PACK placement group): FSDP2's
        collectives run every micro-batch, over NVLink rather than between nodes."""
        rc = self.cfg.ray
        bundle = _bundle(rc.learner_num_cpus, rc.learner_num_gpus, 1, rc.learner_resources)
        if rc.learner_ranks == 1 or not bundle:
            return {}
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        if self._learners_pg is None:
            self._learners_pg = self._placement_group(
                [bundle] * rc.learner_ranks, "STRICT_PACK", "learner placement group"
            )
        return {"scheduling_strategy": PlacementGroupSchedulingStrategy(self._learners_pg, rank)}

    def _critic_placement(self) -> tuple[dict[str, Any] | None, dict[str, Any]]:
        """Scheduling options of every learner rank (None: `_learner_placement`'s) and of every
        critic rank, per `ray.critic_placement`. Bundle 0 holds all learner ranks and bundle 1
        all critic ranks, of one STRICT_PACK (beside: one node) or STRICT_SPREAD (apart: two
        nodes) placement group; with 'any', a critic group alone still goes on one node (a
        bundle of its own: FSDP2's collectives run every micro-batch)."""
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        rc = self.cfg.ray
        n = self.cfg.ray.learner_ranks
        learner = _bundle(rc.learner_num_cpus, rc.learner_num_gpus, n, rc.learner_resources)
        critic = _bundle(rc.critic_num_cpus, rc.critic_num_gpus, n, rc.critic_resources)
        if rc.critic_placement == "any":
            if n == 1 or not critic:
                return None, {}
            pg = self._placement_group([critic], "STRICT_PACK", "critic placement group")
            return None, {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, 0)}
        if not (learner and critic):
            raise ConfigError(
                f"ray.critic_placement = {rc.critic_placement!r} needs CPUs or GPUs reserved "
                "for both the learner and the critic actors (ray.learner_num_* / critic_num_*)"
            )
        strategy = "STRICT_PACK" if rc.critic_placement == "beside" else "STRICT_SPREAD"
        pg = self._placement_group(
            [learner, critic], strategy, "learner and critic placement group"
        )
        return tuple(  # type: ignore[return-value]
            {"scheduling_strategy": PlacementGroupSchedulingStrategy(pg, i)} for i in (0, 1)
        )

    def wait(self, ref: Any, timeout: float | None = None) -> None:
        """Wait for rank 0's call `ref`; a learner rank > 0 that stops first (it died) is
        reported, rather than left with rank 0 waiting for it in a collective forever."""
        if self._followers:
            ready, _ = ray_module().wait([ref, *self._followers], num_returns=1, timeout=timeout)
            if ready and ready[0] is not ref:
                rank = self._followers.index(ready[0]) + 1
                get(ready[0], f"learner rank {rank}")
                raise ActorFailure(f"learner rank {rank}: stopped while rank 0 was working")

    def get(self, ref: Any, timeout: float | None = None) -> Any:
        """The result of rank 0's call `ref` (see `wait`)."""
        try:
            self.wait(ref, timeout)
            return get(ref, "learner", timeout)
        except BaseException:
            self._failed = True  # the ranks may be anywhere now: `close` ends them at once
            raise

    def _ask(self, ref: Any) -> Any:
        """The result of a `LearnerActor` method that also answers with the counters."""
        result, self.steps, self.version = self.get(ref)
        return result

    # -- saorl.interfaces.Learner ----------------------------------------------------------------
    # `spec` stays here: the actor builds its own from env.name (`build_env`), as rollout
    # actors do, since a user's environment may hold objects only importable through it.
    def warm_up(self, spec: Any, tokenizer: Any, progress: Any) -> None:
        """In the learner actor; its progress is not shown here."""
        self._ask(self.actor.warm_up.remote(tokenizer))

    def load_critic(self, path: str) -> None:
        self._ask(self.actor.load_critic.remote(path))

    def evaluate(self, spec: Any, tokenizer: Any) -> dict[str, float]:
        return self._ask(self.actor.evaluate.remote(tokenizer))

    def step(self, batch: Batch) -> dict[str, Any]:
        return self._ask(self.actor.step.remote(batch))

    def save(self, run_dir: Path, rollout_state: dict[str, Any]) -> None:
        self._ask(self.actor.save.remote(run_dir, rollout_state))

    def restore(self, state: dict[str, Any]) -> None:
        self._ask(self.actor.restore.remote(state))

    def export(self, tokenizer: Any, path: Path) -> None:
        self._ask(self.actor.export.remote(tokenizer, path))

    def call(self, fn: Any, *args: Any) -> Any:
        """`fn(learner, *args)` in the learner actor, for tests and tools (`fn` must pickle)."""
        return self._ask(self.actor.call.remote(fn, args))

    def call_critic(self, fn: Any, *args: Any) -> Any:
        """`fn(critic_updater, *args)` in the critic actors (`ray.critic_actor`), for tests: in
        every critic rank at once (`fn` may make collective calls); critic rank 0's answer."""
        from saorl.distributed.ray_critic import call_group

        return call_group(self.critic_actors, "call", fn, args)

    def close(self) -> None:
        """End the learner and critic actors; shut Ray down if this handle started it."""
        ray = ray_module()
        if self._followers and not self._failed:
            # Let the other learner ranks leave their loop; kill them anyway. After a failed
            # call some rank may wait in a collective (for a dead learner or critic rank) that
            # rank 0's goodbye would only join.
            ray.wait([self.actor.close_learner.remote()], timeout=30)
        for a in [*self.learner_actors, *self.critic_actors]:
            ray.kill(a)
        self.learner_actors = []
        self._followers = []
        self.critic_actors = []
        for pg in self._placements:
            ray.util.remove_placement_group(pg)
        self._placements = []
        self._learners_pg = None
        if self._own_ray:
            ray.shutdown()
