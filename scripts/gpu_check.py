"""One-GPU check of the paths the CPU suite cannot run, with figures (about 5 minutes).

    python scripts/gpu_check.py [--out benchmarks/results/gpu.json]
    python scripts/gpu_check.py --cpu-smoke [--out FILE]   # the same logic: CPU, tiny, HF engine

On a Qwen3-0.6B-shaped model (hidden 1024, 28 layers, 16 query / 8 key-value heads of 128, MLP
3072, vocabulary 151,936, tied embeddings; random init, nothing is downloaded) with the
project's char tokenizer:

1. generation: `--prompts` prompts of 32 random tokens, each forced to `--new-tokens` tokens,
   through the vLLM engine (`rollout.engine = "vllm"`): start-up seconds and tokens/s. Then a
   weight push of *other* weights (a second random init with a 5x sharper output layer) and
   fresh samples, scored by the learner's own log-probs under the pushed weights and under
   the original ones: the first must be close (the push is in use, engine and learner agree),
   the second far.
2. learner: a bf16 FSDP2 learner (`learner.fsdp`, `learner.mixed_precision = "bf16"`, one rank)
   on `--rows` rows of `--seq` tokens: one SAO step (critic values, K=2 critic updates, one
   policy update) after a warm-up step; seconds, tokens/s, peak memory, model FLOPs from the
   shape and MFU against the GPU's dense bf16 peak (`--peak-tflops` for a GPU not in the table).
3. training: `saorl train` for `--sao-steps` SAO steps of the tool task (env tool_arithmetic,
   vLLM engine, bf16 autocast in one process): wall time, seconds per step, rollout tokens/s,
   the learner's idle fraction (from the run's summary.json and metrics.jsonl).
4. real model: `--real-steps` SAO steps of SmolLM2-135M-Instruct (examples/real_model.toml,
   vLLM, bf16, 64 rollouts a step, K = 2): steps/s, held-out avg@4 before and after, MFU
   (scripts/gpu_check_real.py; the model from saorl's cache, `saorl model fetch smollm2-135m`).
5. tensor parallelism: one vLLM engine over two GPUs (`rollout.vllm_tensor_parallel_size = 2`):
   start-up, tokens/s, a push landing on requests in flight (per-token versions exact, the
   engine's log-probs the learner's under the pushed weights); skipped with fewer than two GPUs
   (scripts/gpu_check_tp.py).

Each part runs in a fresh process (vLLM and a torch.distributed group do not share one) and
writes its JSON; the parent merges them into `--out`. A part that fails is recorded with its
error and the others still run; the exit code is then 1. Without CUDA or vllm the check stops
at once with exit code 2 and says what is missing. `--cpu-smoke` runs the same code on CPU with
a tiny model, the HF engine and gloo, in seconds (tests/unit/test_gpu_check.py runs it).

Model FLOPs of a step count every matmul once (forward 2 x multiply-adds; backward twice the
forward, once for frozen weights: the critic's attention), causal attention over the
actual sequence lengths; recomputation (the fused log-prob backward) is not counted.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151_936,
    "tie_word_embeddings": True,
    "rope_theta": 1_000_000.0,
}
TINY = {
    "hidden_size": 32,
    "intermediate_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 8,
    "vocab_size": 98,
    "tie_word_embeddings": True,
}
# Dense bf16 peak FLOP/s (no sparsity) by the name torch reports; the first match wins.
PEAK_BF16 = (
    ("H200", 989e12),
    ("H100 PCIe", 756e12),
    ("H100", 989e12),
    ("H800", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
)
PARTS = ("generation", "learner", "training", "real_model", "tensor_parallel")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu-smoke", action="store_true", help="CPU, tiny model, HF engine")
    p.add_argument("--out", type=Path, help="default benchmarks/results/gpu.json (GPU)")
    p.add_argument("--prompts", type=int, help="generation prompts (256; smoke 4)")
    p.add_argument("--new-tokens", type=int, help="tokens per prompt (256; smoke 8)")
    p.add_argument("--rows", type=int, help="learner rows (16; smoke 4)")
    p.add_argument("--seq", type=int, help="learner tokens per row (1024; smoke 32)")
    p.add_argument("--sao-steps", type=int, help="training steps (20; smoke 2)")
    p.add_argument("--real-steps", type=int, help="SmolLM2-135M SAO steps (200; smoke 0 = skipped)")
    p.add_argument("--peak-tflops", type=float, help="the GPU's dense bf16 peak, TFLOP/s")
    p.add_argument("--compile", action="store_true", help="vLLM with CUDA graphs (slower start)")
    p.add_argument("--part", choices=PARTS, help=argparse.SUPPRESS)  # a child process
    p.add_argument("--model-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    smoke = args.cpu_smoke
    defaults = {
        "prompts": (256, 4),
        "new_tokens": (256, 8),
        "rows": (16, 4),
        "seq": (1024, 32),
        "sao_steps": (20, 2),
        "real_steps": (200, 0),
    }
    for key, (gpu, cpu) in defaults.items():
        if getattr(args, key) is None:
            setattr(args, key, cpu if smoke else gpu)
    if args.part:
        result = {
            "generation": part_generation,
            "learner": part_learner,
            "training": part_training,
            "real_model": real_model_part,
            "tensor_parallel": tensor_parallel_part,
        }[args.part](args)
        args.part_out.write_text(json.dumps(result, indent=2))
        return 0
    missing = [] if smoke else missing_requirements()
    if missing:
        print(
            f"gpu_check: needs {' and '.join(missing)}; nothing was run. On a CPU machine, "
            "scripts/gpu_check.py --cpu-smoke checks the same logic.",
            file=sys.stderr,
        )
        return 2
    return run_all(args)


def missing_requirements() -> list[str]:
    import torch

    missing = []
    if not torch.cuda.is_available():
        missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    if importlib.util.find_spec("vllm") is None:
        missing.append("vllm (pip install 'saorl[vllm]')")
    return missing


def run_all(args: argparse.Namespace) -> int:
    out = args.out or (
        Path(tempfile.gettempdir()) / "gpu_check_cpu_smoke.json"
        if args.cpu_smoke
        else ROOT / "benchmarks" / "results" / "gpu.json"
    )
    t0 = time.perf_counter()
    report: dict[str, Any] = {
        "mode": "cpu-smoke" if args.cpu_smoke else "gpu",
        "machine": machine(),
        "parts": {},
    }
    with tempfile.TemporaryDirectory(prefix="saorl-gpu-check-") as tmp:
        model_dir = Path(tmp) / "model"
        made = time.perf_counter()
        make_model(model_dir, TINY if args.cpu_smoke else QWEN3_06B)
        report["model"] = {
            "shape": "tiny" if args.cpu_smoke else "qwen3-0.6b (random init)",
            "params": count_params(model_dir),
            "create_s": time.perf_counter() - made,
        }
        for part in PARTS:
            report["parts"][part] = run_part(part, args, model_dir, Path(tmp))
            print(f"gpu_check: {part}: {json.dumps(report['parts'][part])}", flush=True)
    report["total_s"] = time.perf_counter() - t0
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"gpu_check: wrote {out} ({report['total_s']:.0f} s)")
    failed = [k for k, v in report["parts"].items() if "error" in v]
    if failed:
        print(f"gpu_check: failed parts: {', '.join(failed)}", file=sys.stderr)
    return 1 if failed else 0


def run_part(part: str, args: argparse.Namespace, model_dir: Path, tmp: Path) -> dict[str, Any]:
    """Run one part in a fresh interpreter; its JSON, or its error and the end of its output."""
    part_out = tmp / f"{part}.json"
    cmd = [
        sys.executable,
        __file__,
        "--part",
        part,
        "--model-dir",
        str(model_dir),
        "--part-out",
        str(part_out),
        "--prompts",
        str(args.prompts),
        "--new-tokens",
        str(args.new_tokens),
        "--rows",
        str(args.rows),
        "--seq",
        str(args.seq),
        "--sao-steps",
        str(args.sao_steps),
        "--real-steps",
        str(args.real_steps),
    ]
    cmd += ["--cpu-smoke"] * args.cpu_smoke + ["--compile"] * args.compile
    if args.peak_tflops:
        cmd += ["--peak-tflops", str(args.peak_tflops)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)])}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)
    except subprocess.TimeoutExpired:
        return {"error": "timed out after 420 s"}
    if proc.returncode != 0 or not part_out.is_file():
        return {"error": f"exit code {proc.returncode}", "output": proc.stderr[-3000:]}
    return {**json.loads(part_out.read_text()), "part_s": time.perf_counter() - t0}


def machine() -> dict[str, Any]:
    import platform

    import torch

    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpus": os.cpu_count(),
    }
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
        info["cuda"] = torch.version.cuda
    if importlib.util.find_spec("vllm") is not None:
        from importlib.metadata import version

        info["vllm"] = version("vllm")
    return info


def make_model(path: Path, shape: dict[str, Any]) -> None:
    """A random-init Qwen3 of `shape` with the char tokenizer, saved as a model directory."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from saorl.models.tokenizer import build_char_tokenizer

    tokenizer = build_char_tokenizer()
    torch.manual_seed(0)
    config = Qwen3Config(
        **shape,
        max_position_embeddings=4096,
        pad_token_id=0,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    model = Qwen3ForCausalLM(config)
    if shape is QWEN3_06B:
        model.to(torch.bfloat16)  # half the bytes to write and read; learners upcast
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))


def count_params(path: Path) -> int:
    import math

    from safetensors import safe_open

    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = f.keys()
        return sum(math.prod(f.get_slice(k).get_shape()) for k in names)


# -- part 1: vLLM generation and a weight push ---------------------------------------------------
def part_generation(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from saorl.engines.factory import build_engine
    from saorl.engines.protocol import GenerationRequest
    from saorl.models.loading import load_policy
    from saorl.models.logprobs import sequence_logprobs

    smoke = args.cpu_smoke
    prompt_len = 32 if not smoke else 4
    cfg = engine_config(
        args,
        prompt_len + args.new_tokens,
        "rollout.max_new_tokens=1",
        f"rollout.vllm_enforce_eager={'false' if args.compile else 'true'}",
    )
    device = torch.device(cfg.model.device)
    policy, tokenizer = load_policy(cfg.model)
    policy.to(device).eval()
    g = torch.Generator().manual_seed(1)

    def requests(n: int, new: int) -> list[GenerationRequest]:
        return forced_requests(tokenizer, g, n, prompt_len, new)

    t0 = time.perf_counter()
    engine = build_engine(cfg, policy, tokenizer, seed=0)
    startup = time.perf_counter() - t0
    try:
        engine.generate(requests(2, 4))  # first-call allocations stay out of the timing
        sync(device)
        t0 = time.perf_counter()
        done = engine.generate(requests(args.prompts, args.new_tokens))
        sync(device)
        gen_s = time.perf_counter() - t0
        tokens = sum(len(c.token_ids) for c in done)
        pushed = other_weights(cfg, device)
        state = pushed.state_dict()
        sync(device)
        t0 = time.perf_counter()
        engine.update_weights(state, version=1)
        sync(device)
        push_s = time.perf_counter() - t0
        after = engine.generate(requests(8, min(args.new_tokens, 32)))
    finally:
        engine.close()
    agree = logprob_gap(pushed, after, sequence_logprobs, device)
    stale = logprob_gap(policy, after, sequence_logprobs, device)
    return {
        "engine": cfg.rollout.engine,
        "startup_s": startup,
        "prompts": args.prompts,
        "tokens": tokens,
        "generate_s": gen_s,
        "tokens_per_s": tokens / gen_s,
        "push_s": push_s,
        "push_mb": sum(v.numel() * v.element_size() for v in state.values()) / 2**20,
        "pushed_vs_learner_max_abs_logprob_diff": agree,
        "original_vs_learner_max_abs_logprob_diff": stale,
        "push_in_use": agree < 0.1 * stale,
    }


def engine_config(args: argparse.Namespace, max_seq_len: int, *extra: str) -> Any:
    """The generation parts' config: the check's model, its device and dtype, the vLLM engine
    (the HF engine in the CPU smoke), `args.prompts` sequences at once; then `extra`."""
    from saorl.config import load_config

    smoke = args.cpu_smoke
    return load_config(
        None,
        [
            f"model.name_or_path={args.model_dir}",
            f"model.device={'cpu' if smoke else 'cuda'}",
            f"model.dtype={'float32' if smoke else 'bfloat16'}",
            f"rollout.engine={'hf' if smoke else 'vllm'}",
            f"model.max_seq_len={max_seq_len}",
            f"rollout.max_concurrent={args.prompts}",
            "rollout.vllm_gpu_memory_utilization=0.3",
            *extra,
        ],
    )


def forced_requests(tokenizer: Any, g: Any, n: int, prompt_len: int, new: int) -> list[Any]:
    """`n` requests of `prompt_len` random tokens, each forced to exactly `new` tokens."""
    import torch

    from saorl.engines.protocol import GenerationRequest

    ids = torch.randint(3, len(tokenizer), (n, prompt_len), generator=g).tolist()
    return [
        GenerationRequest(prompt_ids=x, max_new_tokens=new, min_new_tokens=new, request_id=i)
        for i, x in enumerate(ids)
    ]


def other_weights(cfg: Any, device: Any) -> Any:
    """The policy a push sends: other weights, with a sharper output distribution than a
    random init has (so that samples tell the two apart)."""
    import torch

    from saorl.models.loading import load_policy

    torch.manual_seed(7)
    pushed, _ = load_policy(cfg.model)
    with torch.no_grad():
        for p in pushed.parameters():
            p.normal_(0, 0.02)
        pushed.get_output_embeddings().weight.mul_(5.0)
    return pushed.to(device).eval()


def logprob_gap(model: Any, completions: list[Any], sequence_logprobs: Any, device: Any) -> float:
    """Max |engine log-prob - `model`'s log-prob| over the sampled tokens of `completions`."""
    import torch

    worst = 0.0
    for c in completions:
        ids = torch.tensor([c.request.prompt_ids + c.token_ids], device=device)
        with torch.no_grad():
            lp = sequence_logprobs(model, ids, torch.ones_like(ids))[0, -len(c.token_ids) :]
        diff = (lp.float().cpu() - torch.tensor(c.logprobs)).abs().max()
        worst = max(worst, float(diff))
    return worst


def sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


# -- part 2: one bf16 FSDP2 learner step, MFU ----------------------------------------------------
def part_learner(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import torch.distributed as dist

    from saorl.config import load_config
    from saorl.distributed.fsdp import FSDPSharding
    from saorl.distributed.weight_sync import free_port
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy
    from saorl.models.logprobs import sequence_logprobs
    from saorl.types import Batch, Trajectory

    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda", 0 if not smoke else None)
    if not smoke:
        torch.cuda.set_device(device)
    dist.init_process_group(
        "gloo" if smoke else "nccl",
        init_method=f"tcp://127.0.0.1:{free_port()}",
        rank=0,
        world_size=1,
    )
    cfg = load_config(
        None,
        [
            f"model.name_or_path={args.model_dir}",
            f"model.device={device.type}",
            f"model.max_seq_len={args.seq}",
            f"learner.batch_size={args.rows}",
            f"learner.micro_batch_size={max(1, args.rows // 4)}",
            "learner.fsdp=true",
            "learner.mixed_precision=bf16",
            "critic.warmup_steps=0",
            "learner.lr_warmup_steps=0",
            "learner.sft_steps=0",
        ],
    )
    policy, tokenizer = load_policy(cfg.model)
    policy.to(device)
    g = torch.Generator().manual_seed(0)
    prompt = args.seq // 8
    trajs = []
    for i in range(args.rows):
        ids = torch.randint(3, len(tokenizer), (args.seq,), generator=g).tolist()
        with torch.no_grad(), torch.autocast(device.type, torch.bfloat16):
            t = torch.tensor([ids], device=device)
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, prompt:].float().tolist()
        n = args.seq - prompt
        trajs.append(
            Trajectory(ids[:prompt], ids[prompt:], [1] * n, lp, [0] * n, reward=float(i % 2))
        )
    batch = Batch.from_trajectories(trajs, pad_id=tokenizer.pad_token_id)
    learner = Learner(cfg, policy, device, FSDPSharding("bf16", device))
    learner.step(batch)  # warm-up: lazy state, kernels
    sync(device)
    if not smoke:
        torch.cuda.reset_peak_memory_stats()
    t0 = time.perf_counter()
    metrics = learner.step(batch)
    sync(device)
    step_s = time.perf_counter() - t0
    flops = step_flops(policy.config, args.rows, args.seq, cfg.critic.updates_per_step)
    peak = args.peak_tflops * 1e12 if args.peak_tflops else gpu_peak(device)
    result = {
        "rows": args.rows,
        "seq": args.seq,
        "tokens": args.rows * args.seq,
        "step_s": step_s,
        "tokens_per_s": args.rows * args.seq / step_s,
        "model_tflops_per_step": flops / 1e12,
        "achieved_tflops": flops / step_s / 1e12,
        "peak_tflops": peak / 1e12 if peak else None,
        "mfu": flops / step_s / peak if peak else None,
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if not smoke else None,
        "loss_policy": metrics["loss/policy"],
        "loss_value": metrics["loss/value"],
        "version": learner.version,
    }
    dist.destroy_process_group()
    return result


def step_flops(config: Any, rows: int, seq: int, k: int) -> float:
    """Model FLOPs of one SAO learner step on `rows` full rows of `seq` tokens.

    Per token and layer a matmul with an `a x b` weight costs `2ab` forward; causal attention
    costs `4 * heads * head_dim * (seq + 1) / 2` (QK^T and AV over the positions before it).
    Backward is twice the forward, except for frozen weights (the critic's attention
    projections), whose weight gradient is not computed: once. A step is: critic values
    (forward), K critic updates (forward + backward), one policy update (forward + backward,
    plus the output layer `hidden x vocab`, which the critic lacks).
    """
    attn, mlp, out = weight_counts(config)
    attn_w, mlp_w, head = 2 * attn, 2 * mlp, 2 * out
    scores = 4 * config.num_attention_heads * config.head_dim * (seq + 1) / 2
    layers, tokens = config.num_hidden_layers, rows * seq
    fwd_critic = layers * (attn_w + mlp_w + scores)
    critic_update = layers * (2 * attn_w + 3 * mlp_w + 3 * scores)  # attention weights frozen
    policy_update = 3 * (layers * (attn_w + mlp_w + scores) + head)
    return tokens * (fwd_critic + k * critic_update + policy_update)


def weight_counts(config: Any) -> tuple[int, int, int]:
    """Matmul weights: of one layer's attention projections (q, k, v, o), of one layer's MLP
    (gate, up, down), and of the output layer."""
    d, hd = config.hidden_size, config.head_dim
    attn = d * hd * (2 * config.num_attention_heads + 2 * config.num_key_value_heads)
    return attn, 3 * d * config.intermediate_size, d * config.vocab_size


def gpu_peak(device: Any) -> float | None:
    import torch

    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((flops for key, flops in PEAK_BF16 if key in name), None)


# -- part 3: 20 SAO steps of the tool task -------------------------------------------------------
def part_training(args: argparse.Namespace) -> dict[str, Any]:
    smoke = args.cpu_smoke
    out = args.part_out.parent / "runs"
    overrides = [
        f"model.name_or_path={args.model_dir}",
        f"model.device={'cpu' if smoke else 'cuda'}",
        "env.name=tool_arithmetic",
        "env.max_turns=3",
        "env.max_tool_calls=2",
        "rollout.max_new_tokens=20",
        "model.max_seq_len=64",
        f"rollout.engine={'hf' if smoke else 'vllm'}",
        "rollout.vllm_gpu_memory_utilization=0.3",
        f"rollout.vllm_enforce_eager={'false' if args.compile else 'true'}",
        "learner.mixed_precision=bf16",
        f"run.total_steps={args.sao_steps}",
        "critic.warmup_steps=1",
        "learner.sft_steps=0",
        "run.eval_every=0",
        f"env.eval_size={4 if smoke else 64}",
        f"learner.batch_size={8 if smoke else 64}",
        f"learner.micro_batch_size={8 if smoke else 64}",
        f"rollout.max_concurrent={8 if smoke else 256}",
        "run.checkpoint_every=0",
        "run.trackers=[]",
        "run.progress=false",
        f"run.output_dir={out}",
        "run.name=tool",
    ]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "saorl", "train", *overrides],
        capture_output=True,
        text=True,
        env=env,
    )
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise RuntimeError(f"saorl train exited {proc.returncode}: {proc.stderr[-3000:]}")
    run = out / "tool"
    summary = json.loads((run / "summary.json").read_text())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    steps = [r for r in rows if "perf/step_s" in r]
    return {
        "steps": summary["steps"],
        "policy_version": summary["policy_version"],
        "process_wall_s": wall,
        "rl_wall_s": summary["wall_seconds"],
        "step_s_mean": sum(r["perf/step_s"] for r in steps) / len(steps),
        "rollout_tokens_per_s": steps[-1]["perf/rollout_tokens_per_s"],
        "learner_idle_frac": summary["learner_idle_frac"],
        "reward_mean_last": steps[-1]["rollout/reward_mean"],
        "checkpoint_hf": (run / "checkpoints" / f"step_{summary['steps']:08d}.hf").is_dir(),
    }


# -- part 4: the real model (scripts/gpu_check_real.py) -----------------------------------------
def real_model_part(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check_real import part_real_model

    return part_real_model(args, step_flops, gpu_peak)


# -- part 5: tensor parallelism, two GPUs (scripts/gpu_check_tp.py) ------------------------------
def tensor_parallel_part(args: argparse.Namespace) -> dict[str, Any]:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from gpu_check_tp import part_tensor_parallel

    return part_tensor_parallel(args, sys.modules[__name__])


if __name__ == "__main__":
    sys.exit(main())
