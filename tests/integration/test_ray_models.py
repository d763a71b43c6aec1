"""LoRA and MoE routing replay under Ray (`ray.enabled`): a few steps, a checkpoint, a resume.

The learner and the rollout engine live in Ray actors, so what these features add crosses
process boundaries: merged LoRA weights in every push and adapters in the checkpoint; recorded
routing inside the trajectories the rollout actor sends. Same local Ray (2 CPUs) as
tests/integration/test_ray.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.checkpoint import load_state_file
from saorl.loop import train_from_config
from tests.faults._common import metric_rows
from tests.integration.test_ray import _ray_config, local_ray  # noqa: F401 (fixture)
from tests.integration.test_train_async import STOP_ON_MOST_CHARS

pytest.importorskip("ray")
pytestmark = pytest.mark.slow

# Stop strings give completions of varied length, which the module's reward (len % 2) needs.
COMMON = ("run.eval_every=0", "run.checkpoint_every=2", "learner.max_staleness=1",
          "critic.warmup_steps=1", STOP_ON_MOST_CHARS)  # fmt: skip


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
    # Pushes carried the merged adapters: the engine's log-probs are the learner's.
    measured = [r for r in rows if r["mismatch/max_abs_logprob_diff"] is not None]
    assert measured and all(r["mismatch/max_abs_logprob_diff"] < 1e-3 for r in measured)
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
    moe = ("model.arch=qwen3_moe", "model.hidden_size=32", "model.intermediate_size=16",
           "model.num_experts=4", "algorithm.routing_replay=true")  # fmt: skip
    run = _train_and_resume(tmp_path, "moe", *moe)
    rows = [r for r in metric_rows(run) if "routing/changed_frac" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    policy_rows = [r for r in rows if not r["learner/warmup"]]
    # The routing recorded in the rollout actor reached the learner actor and was replayed.
    assert policy_rows and all(r["routing/changed_frac"] is not None for r in policy_rows)
    assert all(r["routing/changed_frac"] < 0.05 for r in policy_rows)
    assert all(r["mismatch/max_abs_logprob_diff"] < 1e-3 for r in policy_rows
               if r["mismatch/max_abs_logprob_diff"] is not None)  # fmt: skip
