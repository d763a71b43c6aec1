"""`saorl train rollout.engine=vllm` as a user runs it, with a tiny budget (needs vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from saorl.config import load_config
from saorl.models.loading import load_policy
from saorl.models.lora import add_lora
from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER


MODEL = [
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
]


@pytest.mark.parametrize(
    "lora", [[], ["model.lora_rank=4", "model.lora_alpha=8"]], ids=["full", "lora"]
)
def test_saorl_train_with_the_vllm_engine(tmp_path: Path, lora: list[str]):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            f"run.output_dir={tmp_path}",
            "run.name=v",
            "run.total_steps=4",
            "run.eval_every=0",
            "run.progress=false",
            "run.torch_threads=1",
            "learner.sft_steps=20",
            "learner.batch_size=8",
            "learner.max_staleness=1",
            "critic.warmup_steps=1",
            "env.eval_size=8",
            *MODEL,
            *lora,
            "rollout.engine=vllm",
            "rollout.vllm_enforce_eager=true",
            "rollout.vllm_kv_cache_gib=0.0625",
            "rollout.temperature=0.8",
        ],
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    run = tmp_path / "v"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["policy_version"] == 3  # one critic warm-up step
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    train = [r for r in rows if "loss/value" in r]
    assert len(train) == 4
    assert all("mismatch/k3" in r and "mismatch/max_abs_logprob_diff" in r for r in train)
    measured = [r for r in train if r["mismatch/k3"] is not None]
    # Tokens sampled by the learner's current version exist in most steps; where they do, the
    # engine's log-probs agree with the learner's (float32, different kernels).
    assert measured, "no step had tokens of the learner's current policy version"
    for r in measured:
        assert r["mismatch/tokens"] > 0
        assert 0 <= r["mismatch/k3"] < 1e-6 and r["mismatch/max_abs_logprob_diff"] < 1e-3
    assert summary["final_eval_accuracy"] is not None
    # Steps 2-4 pushed (step 1 trained the critic alone): the whole model, or the adapter alone
    cfg = load_config(None, [*MODEL, *lora])
    policy = load_policy(cfg.model)[0]
    add_lora(policy, cfg.model)
    want = sum(v.numel() for k, v in policy.state_dict().items() if not lora or ".lora_" in k)
    assert [r["step"] for r in train if "perf/push_bytes" in r] == [2, 3, 4]
    assert all(r["perf/push_bytes"] == 4 * want for r in train if "perf/push_bytes" in r)
