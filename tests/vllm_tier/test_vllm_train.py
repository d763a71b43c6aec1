"""`saorl train rollout.engine=vllm` as a user runs it, with a tiny budget (needs vLLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER


def test_saorl_train_with_the_vllm_engine(tmp_path: Path):
    out = subprocess.run(
        [sys.executable, "-m", "saorl", "train", f"run.output_dir={tmp_path}", "run.name=v",
         "run.total_steps=4", "run.eval_every=0", "run.progress=false", "run.torch_threads=1",
         "learner.sft_steps=20", "learner.batch_size=8", "learner.max_staleness=1",
         "critic.warmup_steps=1", "env.eval_size=8",
         "model.hidden_size=64", "model.num_heads=2", "model.num_kv_heads=1",
         "model.intermediate_size=128",
         "rollout.engine=vllm", "rollout.vllm_enforce_eager=true",
         "rollout.vllm_kv_cache_gib=0.0625", "rollout.temperature=0.8"],
        capture_output=True, text=True, timeout=400,
    )  # fmt: skip
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
