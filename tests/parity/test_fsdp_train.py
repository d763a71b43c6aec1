"""`torchrun --nproc_per_node 2 -m saorl train learner.fsdp=true`: the real run, and a resume.

Rank 0 runs the loop and announces every learner call; rank 1 follows. Checks that the run
completes with the supervised warm-up (replica -> shards -> critic reset), packing, evaluation,
checkpoints and export, that the gathered checkpoint holds the exported weights, and that
`--resume` continues from the sharded checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["run.eval_every=2", "learner.sft_steps=5", "learner.batch_size=8",
        "critic.warmup_steps=1", "model.hidden_size=32", "model.intermediate_size=64",
        "env.eval_size=16", "learner.fsdp=true", "learner.micro_batch_tokens=64",
        "run.progress=false"]  # fmt: skip


def _torchrun(*args: str) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           "2", "-m", "saorl", "train", *args, *ARGS]  # fmt: skip
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
def test_torchrun_fsdp_train_and_resume(tmp_path: Path):
    from safetensors.torch import load_file

    from saorl.checkpoint import load_state_file

    _torchrun(f"run.output_dir={tmp_path}", "run.name=fsdp", "run.total_steps=3")
    run = tmp_path / "fsdp"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["policy_version"] == 2  # step 1 is critic warm-up
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/value" in r] == [1, 2, 3]
    ckpt = load_state_file(run / "checkpoints" / "step_00000003.pt")
    exported = load_file(run / "final" / "model.safetensors")
    for k, v in exported.items():  # the gathered checkpoint = the replica that was exported
        assert torch.equal(ckpt["policy"][k], v), k
    assert set(ckpt["critic"]) >= {"value_head.weight", "value_head.bias"}
    _torchrun("--resume", str(run), "run.total_steps=4")
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["policy_version"] == 3
