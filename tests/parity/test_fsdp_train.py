"""`torchrun --nproc_per_node 2 -m saorl train learner.fsdp=true`: the real run, and a resume.

Rank 0 runs the loop and announces every learner call; rank 1 follows. Checks that the run
completes with the supervised warm-up (replica -> shards -> critic reset), packing, evaluation,
checkpoints and export, that the sharded checkpoint (torch.distributed.checkpoint) holds the
exported weights, and that `--resume` continues from it at one rank.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
ARGS = [
    "run.eval_every=2",
    "learner.sft_steps=5",
    "learner.batch_size=8",
    "critic.warmup_steps=1",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "env.eval_size=16",
    "learner.fsdp=true",
    "learner.micro_batch_tokens=64",
    "run.progress=false",
]


def _torchrun(*args: str, nproc: int = 2) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        str(nproc),
        "-m",
        "saorl",
        "train",
        *args,
        *ARGS,
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # the one-process read
def test_torchrun_fsdp_train_and_resume(tmp_path: Path):
    import torch.distributed.checkpoint as dcp
    from safetensors.torch import load_file

    from saorl.checkpoint.dcp import SafeReader
    from saorl.checkpoint.io import load_state_file

    _torchrun(f"run.output_dir={tmp_path}", "run.name=fsdp", "run.total_steps=3")
    run = tmp_path / "fsdp"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["policy_version"] == 2  # step 1 is critic warm-up
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "loss/value" in r] == [1, 2, 3]
    # Steps 2 and 3 pushed the replica's whole state to rank 0's engine (no LoRA with FSDP).
    pushed = [r for r in rows if "perf/push_bytes" in r]
    assert [r["step"] for r in pushed] == [2, 3] and all(r["perf/push_s"] >= 0 for r in pushed)
    ckpt = load_state_file(run / "checkpoints" / "step_00000003.pt")
    assert ckpt["sharded"] == "step_00000003.dcp" and "policy" not in ckpt
    shards = run / "checkpoints" / "step_00000003.dcp"
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    exported = load_file(run / "final" / "model.safetensors")
    # The shards, read back in one process, hold the weights the replica exported.
    tensors = {
        "policy": {k: torch.empty_like(v) for k, v in exported.items()},
        "critic": {"value_head.weight": torch.empty(1, 32)},
    }
    dcp.load(tensors, storage_reader=SafeReader(shards))
    for k, v in exported.items():
        assert torch.equal(tensors["policy"][k], v), k
    _torchrun("--resume", str(run), "run.total_steps=4", nproc=1)  # another number of ranks
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4 and summary["policy_version"] == 3


def _rank_pid(agent: int, rank: int) -> int | None:
    """The PID of torchrun worker `rank` (a child of the agent process `agent`)."""
    for entry in Path("/proc").iterdir():
        try:
            if not entry.name.isdigit() or int((entry / "stat").read_text().split()[3]) != agent:
                continue
            env = (entry / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if f"LOCAL_RANK={rank}".encode() in env:
            return int(entry.name)
    return None


@pytest.mark.slow
def test_sigterm_to_one_rank_stops_every_rank_after_the_same_step(tmp_path: Path):
    """Rank 1 alone gets SIGTERM (its node is preempted): rank 0 hears of it at its next step
    (`LeaderLearner.agree_stop`), and both ranks write the checkpoint of the step they reached."""
    import time

    from saorl.checkpoint.io import load_latest_checkpoint

    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc_per_node",
        "2",
        "-m",
        "saorl",
        "train",
        *ARGS,
        f"run.output_dir={tmp_path}",
        "run.name=t",
        "run.total_steps=100000",
        "run.checkpoint_every=0",
        "run.eval_every=0",
    ]
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    metrics = tmp_path / "t" / "metrics.jsonl"
    while proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 3:  # steps 0, 1, 2
            break
        time.sleep(0.1)
    rank1 = _rank_pid(proc.pid, 1)
    assert rank1 is not None, proc.communicate()[1][-3000:]
    os.kill(rank1, signal.SIGTERM)
    _, err = proc.communicate(timeout=300)
    run = tmp_path / "t"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stopped_by"] == "signal" and summary["signal"] == "SIGTERM", err[-3000:]
    step = summary["steps"]
    rows = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert rows[-1]["step"] == step
    _, state = load_latest_checkpoint(run)
    assert state["step"] == step
    shards = run / "checkpoints" / f"step_{step:08d}.dcp"
    assert sorted(p.name for p in shards.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    assert f"torchrun --nproc_per_node N -m saorl train --resume {run}" in err
