"""`ray.critic_actor` with `ray.learner_ranks = 2`: the critic sharded over a critic group.

Two critic actors form a process group of their own and shard the critic with FSDP2 (gloo);
learner rank r talks to critic rank r. Against the same two learner ranks holding the critic
themselves: the same batches give the same metrics and weights; the checkpoint is whole (the
critic gathered from both critic ranks), restores, and a run resumes from it; the critic reset
and `critic.init_from` reach both critic ranks; a dead critic rank is reported, not waited for.
One local Ray with 2 CPUs for the module.
"""

from __future__ import annotations

import json
import sys

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, load_state_file
from saorl.config import ConfigError
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch
from tests.integration.test_train_async import STOP_ON_MOST_CHARS
from tests.parity.test_fsdp_parity import LOSS_TOL, WEIGHT_TOL

ray = pytest.importorskip("ray")

pytestmark = pytest.mark.slow

# Two learner ranks (and two critic ranks) of 0.25 CPU, a rollout actor of 0.5: 1.5 of 2 CPUs;
# the run (first) is over before the learners of the later tests are placed.
# Micro-batches of 3 rows over 7-row batches: critic rank 0 runs two passes, rank 1 one and a
# zero-weight filler pass.
RANKS = (
    "ray.learner_ranks=2",
    "learner.fsdp=true",
    "ray.learner_num_cpus=0.25",
    "ray.rollout_num_cpus=0.5",
    "learner.micro_batch_size=3",
    "ray.start_timeout_s=120",
)
GROUP = ("ray.critic_actor=true", "ray.critic_num_cpus=0.25")


def _varied_reward():
    # Rewards that depend on the sampled text (a random-init model never solves addition).
    from saorl.envs.arithmetic import ArithmeticTask

    ArithmeticTask.reward = staticmethod(lambda p, t: float(len(t) % 2))


@pytest.fixture(scope="module")
def local_ray():
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    assert not ray.is_initialized(), "another test left a Ray session running"
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        runtime_env={"worker_process_setup_hook": _varied_reward},
    )
    yield
    ray.shutdown()


def test_a_run_with_a_critic_group_resumes_from_its_checkpoint(tmp_path, local_ray):
    from saorl.models.critic import Critic

    def config(steps):
        return tiny_config(
            f"run.output_dir={tmp_path}",
            "ray.enabled=true",
            *RANKS,
            *GROUP,
            "run.eval_every=0",
            "env.eval_size=2",
            "run.checkpoint_every=1",
            "learner.sft_steps=1",
            f"run.total_steps={steps}",
            STOP_ON_MOST_CHARS,
        )

    assert train_from_config(config(2))["steps"] == 2  # with the warm-up's critic reset
    run_dir = tmp_path / "default"
    saved = load_state_file(list_checkpoints(run_dir)[-1])
    assert saved["step"] == 2 and "sharded" not in saved
    cfg = config(2)
    assert (
        saved["critic"].keys()
        == Critic(load_policy(cfg.model)[0], (cfg.model, cfg.critic)).state_dict().keys()
    )
    assert train_from_config(config(3), resume=str(run_dir))["steps"] == 3
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/value" in r] == [1, 2, 3]


def _state(learner):
    return learner.state_dict()  # collective: every learner rank and every critic rank joins


def _batches(cfg):
    torch.manual_seed(cfg.run.seed)
    policy, _ = load_policy(cfg.model)
    return [_batch(policy, n=7, seed=s) for s in range(3)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory, local_ray):
    """Metrics and gathered state of 3 steps with the critic in the two learner ranks."""
    from saorl.distributed.ray_learner import RayLearner

    cfg = tiny_config(
        f"run.output_dir={tmp_path_factory.mktemp('ref')}", "ray.enabled=true", *RANKS
    )
    learner = RayLearner(cfg)
    try:
        metrics = [learner.step(b) for b in _batches(cfg)]
        return metrics, learner.call(_state)
    finally:
        learner.close()


@pytest.fixture(scope="module")
def group(tmp_path_factory, local_ray):
    """The same 3 steps with a critic group; the learner stays up for the tests below. Placed
    `beside`: both learner ranks share bundle 0 of a STRICT_PACK group, both critic ranks bundle
    1 (the run below places them with 'any')."""
    from saorl.distributed.ray_learner import RayLearner

    cfg = tiny_config(
        f"run.output_dir={tmp_path_factory.mktemp('group')}",
        "ray.enabled=true",
        *RANKS,
        *GROUP,
        "ray.critic_placement=beside",
    )
    learner = RayLearner(cfg)
    try:
        assert len(learner.critic_actors) == 2
        yield learner, [learner.step(b) for b in _batches(cfg)]
    finally:
        learner.close()


def _assert_close(got, want, tol, what):
    assert got.keys() == want.keys(), what
    for k, v in want.items():
        assert (got[k] - v).abs().max() <= tol, (what, k)


def test_a_critic_group_steps_like_the_learner_ranks(reference, group):
    want, want_state = reference
    learner, got = group
    for a, b in zip(got, want, strict=True):
        assert a.keys() == b.keys()
        for key, value in b.items():  # the warm-up step's policy keys are None in both
            if isinstance(value, float):
                assert abs(a[key] - value) <= LOSS_TOL * max(1.0, abs(value)), key
            else:
                assert a[key] == value, key
    assert got[-1]["loss/value"] > 0 and learner.version == 2  # 1 critic warm-up step
    state = learner.call(_state)
    for key in ("policy", "critic"):
        _assert_close(state[key], want_state[key], WEIGHT_TOL, key)
    # The critic's Adam state, gathered from both critic ranks: named and complete as the
    # learner ranks' own (3 steps x K = 2).
    opt, want_opt = state["critic_opt"], want_state["critic_opt"]
    assert opt["param_groups"] == want_opt["param_groups"]
    for name, moments in want_opt["state"].items():
        assert float(opt["state"][name]["step"]) == float(moments["step"]) == 6.0
        _assert_close(opt["state"][name], moments, WEIGHT_TOL, f"critic_opt.{name}")


def test_its_checkpoint_is_whole_and_restores(group, tmp_path):
    learner, _ = group
    before = learner.call(_state)
    learner.save(tmp_path, {"rollout": "side"})
    (path,) = list_checkpoints(tmp_path)
    saved = load_state_file(path)
    assert "sharded" not in saved and saved["rollout"] == "side"
    for key in ("policy", "critic"):  # every weight, gathered from both ranks
        _assert_close(saved[key], before[key], 0.0, key)
    batch = _batches(learner.cfg)[0]
    nxt = learner.step(batch)  # moves policy and critic
    moved = learner.call(_state)
    assert any(not torch.equal(v, before["critic"][k]) for k, v in moved["critic"].items())
    # A single-process learner resumes it (optimizer state keyed by name) and takes that step.
    plain = Learner(learner.cfg, load_policy(learner.cfg.model)[0], torch.device("cpu"))
    plain.load_state(load_state_file(path))  # its own copy: it steps Adam's `step` in place
    got = plain.step(batch)
    for key in ("loss/value", "loss/policy", "advantage/mean", "critic/grad_norm"):
        assert abs(got[key] - nxt[key]) <= LOSS_TOL, key
    learner.restore(saved)
    after = learner.call(_state)
    assert (learner.steps, learner.version) == (before["step"], before["version"])
    for key in ("policy", "critic"):
        _assert_close(after[key], before[key], 0.0, key)
    for name, moments in before["critic_opt"]["state"].items():
        _assert_close(after["critic_opt"]["state"][name], moments, 0.0, name)


def _head_max(updater):
    return float(updater.critic.value_head.weight.detach().full_tensor().abs().max())


def test_init_from_and_the_reset_reach_every_critic_rank(group, reference, tmp_path):
    learner, _ = group
    want = reference[1]["critic"]  # the learner ranks' critic after 3 steps
    path = tmp_path / "value.pt"
    torch.save({"critic": want}, path)
    learner.load_critic(str(path))
    _assert_close(learner.call(_state)["critic"], want, 0.0, "critic")
    # A file that does not fit stops every critic rank with rank 0's error (none waits).
    torch.save({"critic": {"value_head.weight": torch.zeros(3)}}, tmp_path / "bad.pt")
    with pytest.raises(ConfigError, match="does not fit this model"):
        learner.load_critic(str(tmp_path / "bad.pt"))
    with pytest.raises(ConfigError, match="no file"):
        learner.load_critic(str(tmp_path / "missing.pt"))
    # The reset after a supervised warm-up (learner.sft_steps = 0 here: the reset alone).
    learner.warm_up(None, learner.tokenizer, None)
    assert learner.call_critic(_head_max) == 0.0
    state = learner.call(_state)
    prefix = "backbone."
    backbone = {k[len(prefix) :]: v for k, v in state["critic"].items() if k.startswith(prefix)}
    policy = {k.split(".", 1)[1]: v for k, v in state["policy"].items() if k.startswith("model.")}
    assert backbone and backbone.keys() <= policy.keys()
    _assert_close(backbone, {k: policy[k] for k in backbone}, 0.0, "backbone")


def test_a_critic_group_refuses_an_offloaded_critic_optimizer(tmp_path, local_ray):
    from saorl.distributed.ray_learner import RayLearner

    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "ray.enabled=true",
        *RANKS,
        *GROUP,
        "critic.optimizer_offload=true",
    )
    with pytest.raises(ConfigError, match=r"critic\.optimizer_offload is for an unsharded critic"):
        RayLearner(cfg)


def test_a_dead_critic_rank_is_reported(group):
    # Last: it breaks the group. The step stops at once with the dead rank named, and `close`
    # (the fixture's) ends every rank without waiting for the ones left in a collective.
    learner, _ = group
    ray.kill(learner.critic_actors[1])
    with pytest.raises(RuntimeError, match="critic rank 1: the Ray actor died"):
        learner.step(_batches(learner.cfg)[0])
