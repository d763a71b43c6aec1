"""Ray placement on a local Ray with 2 CPUs: the async loop, both weight syncs, dead actors.

One Ray session serves the whole module (starting one takes ~5 s here); `train_from_config`
joins it instead of starting its own and leaves it running.
"""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch

from saorl.checkpoint.io import load_state_file
from saorl.envs.factory import build_env
from saorl.loop import train_from_config
from saorl.rollout.collector import BatchCollector
from saorl.rollout.worker import PromptFeed
from tests.conftest import tiny_config
from tests.integration.test_train_async import STOP_ON_MOST_CHARS

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow


def _varied_reward():
    # A random-init model never solves addition, so every reward, value and gradient would be
    # 0. This reward depends on the sampled text, so weights move. Installed in every actor.
    from saorl.envs.arithmetic import ArithmeticTask

    ArithmeticTask.reward = staticmethod(lambda p, t: float(len(t) % 2))


@pytest.fixture(scope="module")
def local_ray():
    # Functions of this module (not importable by Ray workers) travel by value.
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert not ray.is_initialized(), "another test left a Ray session running"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": _varied_reward},
    )
    yield
    ray.shutdown()


def _ray_config(tmp_path, *overrides):
    # Learner (1 CPU) and rollout actors (0.5 CPU each) fit the 2 CPUs of the local Ray.
    return tiny_config(
        f"run.output_dir={tmp_path}", "ray.enabled=true", "ray.rollout_num_cpus=0.5", *overrides
    )


def test_async_training_with_ray_actors(tmp_path, local_ray):
    # Two learner ranks (FSDP2 over gloo) and two rollout actors: 4 actors, 0.5 CPU each.
    cfg = _ray_config(
        tmp_path,
        "rollout.num_workers=2",
        "run.total_steps=3",
        "run.eval_every=0",
        "learner.max_staleness=1",
        "ray.learner_ranks=2",
        "learner.fsdp=true",
        "ray.learner_num_cpus=0.5",
        STOP_ON_MOST_CHARS,
    )
    summary = train_from_config(cfg)
    assert summary["steps"] == 3 and summary["policy_version"] == 2  # 1 critic warm-up step
    run_dir = tmp_path / "default"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "loss/value" in r]
    assert [r["step"] for r in steps] == [1, 2, 3]
    for r in steps:  # admission control held across processes
        assert r["async/staleness_max"] <= 1
        assert r["perf/rollout_tokens_per_s"] > 0
    # The learner ranks wrote sharded checkpoints: the policy moved, frozen attention did not.
    first, last = (
        _read_sharded(p, cfg) for p in sorted((run_dir / "checkpoints").glob("step_*.pt"))
    )
    assert (first["step"], last["step"]) == (0, 3)
    # FSDP2 optimizer state is keyed by parameter name, not by index.
    assert all(isinstance(k, str) for k in last["param_groups"]["policy"][0]["params"])
    assert any(not torch.equal(v, last["policy"][k]) for k, v in first["policy"].items())
    attn = [k for k in first["critic"] if ".self_attn." in k]
    assert attn and all(torch.equal(first["critic"][k], last["critic"][k]) for k in attn)
    assert (run_dir / "final" / "config.json").exists()
    assert ray.is_initialized()  # the session this module started is still there


def test_critic_actor_steps_like_the_in_process_learner(tmp_path, local_ray):
    # ray.critic_actor: the critic and its K updates in an actor of their own, beside the
    # learner actor; the same batches give the in-process learner's metrics and weights.
    from saorl.distributed.ray_learner import RayLearner
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy
    from tests.integration.test_learner import _batch

    over = (
        "ray.critic_actor=true",
        "ray.critic_num_cpus=0.5",
        "ray.learner_num_cpus=0.5",
        "ray.critic_placement=beside",
        "critic.warmup_steps=1",
        "learner.batch_size=8",
    )
    cfg = _ray_config(tmp_path, *over)
    remote = RayLearner(cfg)
    try:
        torch.manual_seed(cfg.run.seed)  # as the actors do: the same initial weights
        policy, _ = load_policy(cfg.model)
        local = Learner(tiny_config(*over[4:]), policy, torch.device("cpu"))
        for seed in range(3):
            batch = _batch(policy, seed=seed)
            want, got = local.step(batch), remote.step(batch)
            assert got.keys() == want.keys()
            for key, value in want.items():  # warm-up: the policy's keys are None
                assert got[key] == (value if value is None else pytest.approx(value, 1e-5)), key
        assert remote.version == local.version == 2 and got["loss/value"] > 0
        state, want = remote.call(lambda learner: learner.state_dict()), local.state_dict()
        for key in ("policy", "critic"):
            for name, value in want[key].items():
                torch.testing.assert_close(state[key][name], value, msg=f"{key}.{name}")
        assert state["critic_opt"]["state"][0]["step"] == 6  # 3 steps x K=2, kept remotely
        # The critic reset after a supervised warm-up reaches the critic actor.
        remote.call(lambda learner: learner.reset_critic_from_policy())
        head = remote.call_critic(lambda u: float(u.critic.value_head.weight.abs().max()))
        assert head == 0.0
    finally:
        remote.close()


def _read_sharded(path, cfg) -> dict:
    """A sharded checkpoint with its policy and critic weights read back in this process."""
    import torch.distributed.checkpoint as dcp

    from saorl.checkpoint.dcp import SafeReader
    from saorl.models.critic import Critic
    from saorl.models.loading import load_policy

    state = load_state_file(path)
    policy = load_policy(cfg.model)[0]
    tensors = {"policy": policy.state_dict(), "critic": Critic(policy).state_dict()}
    dcp.load(tensors, storage_reader=SafeReader(path.parent / state["sharded"]))
    return {**state, **tensors}


@pytest.fixture(scope="module")
def placed(tmp_path_factory, local_ray):
    """A learner actor and a pool of one rollout actor (object-store sync, and a broadcast group
    formed as well, to test both pushes on the same actors; synchronous mode, so that no pump
    runs until a test starts one); the last test kills them."""
    from saorl.distributed.ray_learner import RayLearner
    from saorl.distributed.ray_pool import RayWorkerPool

    cfg = _ray_config(
        tmp_path_factory.mktemp("placed"), "ray.weight_sync=object_store", "run.concurrency=sync"
    )
    learner = RayLearner(cfg)
    pool = RayWorkerPool(cfg, learner.tokenizer, learner)
    spec = build_env(cfg.env)
    feed = PromptFeed(spec.task, random.Random(0), cfg.learner.batch_size, 1)
    pool.start(spec, feed, None)
    pool._form_group([w.actor for w in pool.workers])
    yield cfg, learner, pool, feed
    pool.close()
    learner.close()


def _perturb(learner):
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(0.01 * torch.randn_like(p))


@pytest.mark.parametrize("via", ["object_store", "broadcast"])
def test_weight_push_reaches_the_rollout_actor(placed, via):
    _, learner, pool, _ = placed
    actor = pool.workers[0].actor
    before = ray.get(actor.engine_state.remote())
    learner.call(_perturb)
    pool.push_via_broadcast() if via == "broadcast" else pool.push_via_object_store()
    got = ray.get(actor.engine_state.remote())
    want = ray.get(learner.actor.policy_state.remote())
    assert set(got) <= set(want)
    for k, v in got.items():
        assert torch.equal(v, want[k]), k  # the learner's weights, bit for bit
    assert all(not torch.equal(before[k], got[k]) for k in got)  # and every tensor moved


def test_sync_mode_drives_the_actor_from_the_driver(placed):
    cfg, _, pool, feed = placed
    workers = pool.workers
    collector = BatchCollector(workers, feed, pool.out, group_size=1, sync=True)
    n = cfg.learner.batch_size
    batch, dropped, _, _ = collector.collect(0, n, 1)  # fill + one decoding step per call
    assert len(batch) == n and dropped == 0 and feed.admitted == n  # admission held
    assert all(t.completion_ids and t.staleness(0) == 0 for t in batch)
    assert workers[0].in_flight() == []
    feed.consume()


def test_dead_actors_are_reported_by_role_and_can_be_replaced(placed):
    from saorl.distributed.ray_learner import ActorFailure

    cfg, learner, pool, feed = placed
    workers, out = pool.workers, pool.out
    n = cfg.learner.batch_size
    for w in workers:
        w.start()
    dead = workers[0]
    ray.kill(dead.actor)
    # A push or a checkpoint's pause that meets the dead actor leaves it to the collector's
    # restart policy (below) instead of stopping the run.
    pool.push_via_object_store()
    with dead.paused():
        pass
    assert isinstance(dead.error, ActorFailure) and "rollout-0" in str(dead.error)
    collector = BatchCollector(workers, feed, out, group_size=1, sync=False)
    with pytest.raises(RuntimeError, match=r"rollout-0 failed.*the Ray actor died"):
        for _ in range(30):  # trajectories already in the queue come out first
            collector.collect(0, n, 1)
    # The driver knows what the dead actor held: every admitted rollout not yet delivered.
    assert 0 < len(dead.in_flight()) <= feed.admitted
    # With restarts allowed the collector replaces it through `RayWorkerPool.respawn`: a fresh
    # actor with the learner's weights takes the dead one's tasks, and a batch forms. In
    # asynchronous mode it is placed in the background (the other actors, none here, go on).
    pool.sync = False
    collector.respawn, collector.max_restarts = pool.respawn, 1
    batch, _, _, _ = collector.collect(0, n, 1)
    assert len(batch) == n and collector.restarts == 1
    assert workers[0] is not dead and workers[0].error is None and workers[0].live
    assert all(t.versions and set(t.versions) == {learner.version} for t in batch)
    got = ray.get(workers[0].actor.engine_state.remote())
    want = ray.get(learner.actor.policy_state.remote())
    assert all(torch.equal(v, want[k]) for k, v in got.items())
    ray.kill(learner.actor)
    with pytest.raises(ActorFailure, match="learner: the Ray actor died"):
        learner.call(_perturb)


def test_missing_resources_are_a_config_error(tmp_path, local_ray):
    from saorl.config import ConfigError
    from saorl.distributed.ray_learner import RayLearner

    with pytest.raises(ConfigError, match=r"ray\.learner_num_gpus"):
        RayLearner(_ray_config(tmp_path, "ray.learner_num_gpus=1"))
    # A custom resource no node has (the nodes are started with ray start --resources).
    with pytest.raises(
        ConfigError,
        match=r"ray\.rollout_resources\['rollout_node'\] = 1.*"
        r"ray start --resources",
    ):
        RayLearner(_ray_config(tmp_path, "ray.rollout_resources={rollout_node = 1}"))
    with pytest.raises(ConfigError, match=r"ray\.learner_ranks = 2 needs learner\.fsdp"):
        RayLearner(_ray_config(tmp_path, "ray.learner_ranks=2", "ray.learner_num_cpus=0.5"))


def _gather_state(learner):
    return len(learner.state_dict()["policy"])  # a collective call under FSDP: every rank joins


def test_a_dead_learner_rank_is_reported(tmp_path, local_ray):
    from saorl.distributed.ray_learner import ActorFailure, RayLearner

    cfg = _ray_config(
        tmp_path, "ray.learner_ranks=2", "learner.fsdp=true", "ray.learner_num_cpus=0.5"
    )
    learner = RayLearner(cfg)
    try:
        assert learner.call(_gather_state) > 0  # both ranks answer
        ray.kill(learner.learner_actors[1])
        with pytest.raises(ActorFailure, match="learner rank 1"):
            learner.call(_gather_state)
    finally:
        learner.close()
