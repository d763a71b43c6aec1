"""LoRA and MoE routing replay under Ray (`ray.enabled`): a few steps, a checkpoint, a resume.

The learner and the rollout engine live in Ray actors, so what these features add crosses
process boundaries: LoRA adapters in every push and in the checkpoint; recorded
routing inside the trajectories the rollout actor sends. Same local Ray (2 CPUs) as
tests/integration/test_ray.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import load_state_file
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from tests.faults._common import metric_rows
from tests.integration.test_ray import _ray_config, local_ray  # noqa: F401 (fixture)
from tests.integration.test_train_async import STOP_ON_MOST_CHARS

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

# Stop strings give completions of varied length, which the module's reward (len % 2) needs.
COMMON = (
    "run.eval_every=0",
    "run.checkpoint_every=2",
    "learner.max_staleness=1",
    "critic.warmup_steps=1",
    STOP_ON_MOST_CHARS,
)


def _train_and_resume(tmp_path: Path, name: str, *overrides: str) -> Path:
    """Two steps with a checkpoint at step 2, then a resume to step 4; the run directory."""
    over = (*COMMON, f"run.name={name}", *overrides)
    first = train_from_config(_ray_config(tmp_path, *over, "run.total_steps=2"))
    assert first["steps"] == 2
    resumed = train_from_config(
        _ray_config(tmp_path, *over, "run.total_steps=4"), resume=str(tmp_path / name)
    )
    assert resumed["steps"] == 4 and resumed["policy_version"] == 3  # one critic warm-up step
    return tmp_path / name


def test_lora_under_ray_trains_checkpoints_and_resumes(tmp_path, local_ray):  # noqa: F811
    run = _train_and_resume(tmp_path, "lora", "model.lora_rank=4", "model.lora_alpha=8")
    rows = [r for r in metric_rows(run) if "loss/value" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    # The pushed adapters reached the engine: its log-probs are the learner's.
    measured = [r for r in rows if r["mismatch/max_abs_logprob_diff"] is not None]
    assert measured and all(r["mismatch/max_abs_logprob_diff"] < 1e-3 for r in measured)
    # Each push after the first carried the adapters alone (bytes: their float32 numbers).
    cfg = _ray_config(tmp_path, "model.lora_rank=4", "model.lora_alpha=8")
    torch.manual_seed(0)
    learner = Learner(cfg, load_policy(cfg.model)[0], torch.device("cpu"))
    adapter = sum(p.numel() for n, p in learner.policy.named_parameters() if ".lora_" in n)
    pushes = [r for r in rows if "perf/push_bytes" in r]
    assert pushes and all(r["perf/push_bytes"] == 4 * adapter for r in pushes)
    assert all(r["perf/push_s"] >= 0 for r in pushes)
    ckpts = sorted((run / "checkpoints").glob("step_*.pt"))
    steps = {load_state_file(p)["step"]: load_state_file(p) for p in ckpts}
    assert {2, 4} <= steps.keys()
    before, after = steps[2]["policy"], steps[4]["policy"]
    adapters = [k for k in after if ".lora_" in k]
    assert adapters and all(k in before for k in adapters)
    # Between the two checkpoints (across the resume) only adapter weights moved.
    assert any(not torch.equal(before[k], after[k]) for k in adapters)
    assert all(torch.equal(before[k], v) for k, v in after.items() if ".lora_" not in k)
    assert (run / "final" / "adapter" / "adapter_config.json").exists()
    config = json.loads((run / "final" / "config.json").read_text())
    assert config["model_type"] == "qwen3"


def test_routing_replay_under_ray_trains_checkpoints_and_resumes(tmp_path, local_ray):  # noqa: F811
    moe = (
        "model.arch=qwen3_moe",
        "model.hidden_size=32",
        "model.intermediate_size=16",
        "model.num_experts=4",
        "algorithm.routing_replay=true",
    )
    run = _train_and_resume(tmp_path, "moe", *moe)
    rows = [r for r in metric_rows(run) if "routing/changed_frac" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    policy_rows = [r for r in rows if not r["learner/warmup"]]
    # The routing recorded in the rollout actor reached the learner actor and was replayed.
    assert policy_rows and all(r["routing/changed_frac"] is not None for r in policy_rows)
    assert all(r["routing/changed_frac"] < 0.05 for r in policy_rows)
    assert all(
        r["mismatch/max_abs_logprob_diff"] < 1e-3
        for r in policy_rows
        if r["mismatch/max_abs_logprob_diff"] is not None
    )


def _move(learner, base: bool) -> None:
    """Every adapter weight, and with `base` every base weight too (as a warm-up would)."""
    with torch.no_grad():
        for name, p in learner.policy.named_parameters():
            if base or ".lora_" in name:
                p.add_(0.01 * torch.randn_like(p))


@pytest.mark.parametrize("via", ["object_store", "broadcast"])
def test_lora_pushes_to_rollout_actors_send_the_adapters_alone(tmp_path, local_ray, via):  # noqa: F811
    """A rollout actor gets the learner's whole unmerged state once (its own seeded base is not
    the learner's after a warm-up), then adapters alone; its engine holds the merged weights
    bit for bit either way."""
    import random
    import sys

    import ray

    from saorl.distributed.ray_learner import RayLearner
    from saorl.distributed.ray_pool import RayWorkerPool
    from saorl.envs.factory import build_env
    from saorl.rollout.worker import PromptFeed

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    cfg = _ray_config(
        tmp_path,
        "model.lora_rank=4",
        "model.lora_alpha=8",
        f"ray.weight_sync={via}",
        "run.concurrency=sync",
    )
    learner = RayLearner(cfg)
    pool = RayWorkerPool(cfg, learner.tokenizer, learner)
    try:
        learner.call(_move, True)  # the base moved before the engines start
        spec = build_env(cfg.env)
        pool.start(spec, PromptFeed(spec.task, random.Random(0), 8, 1), None)
        actor = pool.workers[0].actor
        for push in range(2):
            got = ray.get(actor.engine_state.remote())
            want = ray.get(learner.actor.policy_state.remote())  # merged
            assert got.keys() == want.keys()
            assert all(torch.equal(v, want[k]) for k, v in got.items()), push
            learner.call(_move, False)
            sent = pool.update_weights()
            adapters = ray.get(learner.actor.push_state.remote(False))
            assert adapters and all(".lora_" in k for k in adapters)
            assert sent == sum(v.numel() * v.element_size() for v in adapters.values())
    finally:
        pool.close()
        learner.close()
