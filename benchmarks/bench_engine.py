"""Rollout engine throughput: the HF engine (KV cache, and the re-encode reference) against plain
`model.generate` (and vLLM where importable), on the same prompts and lengths, in one run.

    python benchmarks/bench_engine.py [--requests 128] [--length 128] [--device cpu] [--out PATH]

Two workloads over the same random-init model and the built-in addition prompts:
- `fixed`: every request generates exactly `--length` tokens;
- `longtail`: lengths drawn per request from a lognormal (median `--median`, sigma `--sigma`,
  clipped to `--cap`), the shape of reasoning rollouts.
Lengths are forced (EOS suppressed) so that every engine produces the same tokens per request.
The HF engine keeps `--concurrent` rows running (continuous batching: a finished row's slot is
refilled at the next step). `model.generate` takes the requests in batches of `--concurrent`
and must run each batch to its longest request (`min_new_tokens = max_new_tokens` = that
length), so it computes more tokens than it delivers; throughput counts delivered tokens only
(the sum of the requested lengths), for every engine. Figures are ratios to `generate`.

`--model qwen3-0.6b` builds a Qwen3-0.6B-shaped random-init config (28 layers, 1024 wide,
vocabulary 151936) for a GPU run; `--model smollm2-135m` is the real SmolLM2-135M-Instruct from
saorl's model cache (`saorl model fetch smollm2-135m`) with its own tokenizer; the default is
the built-in tiny model (2 layers, 128 wide).
"""

from __future__ import annotations

import argparse
import os
import random
import time
from pathlib import Path
from typing import Any

import torch
from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

from saorl.config import load_config
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.envs.arithmetic import ArithmeticTask
from saorl.models.loading import load_policy
from saorl.rollout.lengths import lognormal_lengths


def build_model(args: argparse.Namespace) -> tuple[Any, Any]:
    torch.manual_seed(0)
    dtype = "bfloat16" if args.device.startswith("cuda") else "float32"
    overrides = [f"model.max_seq_len={args.cap + 32}", f"model.dtype={dtype}"]
    if args.model == "smollm2-135m":  # the real model and its tokenizer
        overrides.append("model.name_or_path=smollm2-135m")
    model, tok = load_policy(load_config(None, overrides).model)
    if args.model == "qwen3-0.6b":
        from transformers import Qwen3Config, Qwen3ForCausalLM

        config = Qwen3Config(
            vocab_size=151936,
            hidden_size=1024,
            intermediate_size=3072,
            num_hidden_layers=28,
            num_attention_heads=16,
            num_key_value_heads=8,
            head_dim=128,
            max_position_embeddings=args.cap + 32,
            tie_word_embeddings=True,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
        model = Qwen3ForCausalLM(config).to(getattr(torch, dtype))
    return model.to(args.device).eval(), tok


def workloads(args: argparse.Namespace, tok: Any) -> dict[str, list[tuple[list[int], int]]]:
    task, rng = ArithmeticTask(), random.Random(0)
    prompts = [tok.encode(task.sample(rng).prompt) for _ in range(args.requests)]
    draw = lognormal_lengths(args.median, args.sigma, seed=1)
    return {
        "fixed": [(p, args.length) for p in prompts],
        "longtail": [(p, min(draw(), args.cap)) for p in prompts],
    }


def run_hf_engine(model: Any, tok: Any, work: list, args: argparse.Namespace, kv: bool) -> int:
    engine = HFEngine(
        model,
        tok,
        EngineSettings(max_seq_len=args.cap + 32, max_concurrent=args.concurrent, seed=0),
        copy_model=False,
        kv_cache=kv,
    )
    reqs = [
        GenerationRequest(p, n, request_id=i, min_new_tokens=n) for i, (p, n) in enumerate(work)
    ]
    outs = engine.generate(reqs)
    return sum(len(c.token_ids) for c in outs)


@torch.inference_mode()
def run_generate(model: Any, tok: Any, work: list, args: argparse.Namespace) -> int:
    delivered = 0
    for start in range(0, len(work), args.concurrent):
        chunk = work[start : start + args.concurrent]
        width = max(len(p) for p, _ in chunk)
        ids = torch.full((len(chunk), width), tok.pad_token_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (p, _) in enumerate(chunk):  # left padding, as generate expects
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        longest = max(n for _, n in chunk)
        out = model.generate(
            input_ids=ids.to(args.device),
            attention_mask=mask.to(args.device),
            do_sample=True,
            temperature=1.0,
            top_k=0,
            top_p=1.0,
            max_new_tokens=longest,
            min_new_tokens=longest,
            pad_token_id=tok.pad_token_id,
        )
        assert out.shape[1] == width + longest
        delivered += sum(n for _, n in chunk)
    return delivered


def run_vllm(model: Any, tok: Any, work: list, args: argparse.Namespace) -> int:
    import tempfile

    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        llm = LLM(
            model=tmp,
            gpu_memory_utilization=0.5 if args.device != "cpu" else 0.2,
            max_num_seqs=args.concurrent,
            max_model_len=args.cap + 32,
        )
        params = [SamplingParams(temperature=1.0, max_tokens=n, min_tokens=n) for _, n in work]
        # Warm-up outside the timing (compilation, CUDA graphs).
        llm.generate([{"prompt_token_ids": work[0][0]}], params[:1], use_tqdm=False)
        t0 = time.perf_counter()
        outs = llm.generate([{"prompt_token_ids": p} for p, _ in work], params, use_tqdm=False)
        run_vllm.elapsed = time.perf_counter() - t0  # type: ignore[attr-defined]
        return sum(len(o.outputs[0].token_ids) for o in outs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, default=128, help="requests per workload")
    p.add_argument("--length", type=int, default=128, help="tokens per request, fixed workload")
    p.add_argument("--median", type=int, default=48, help="median length, longtail workload")
    p.add_argument("--sigma", type=float, default=1.0, help="sigma of log(length), longtail")
    p.add_argument("--cap", type=int, default=384, help="max length, longtail workload")
    p.add_argument("--concurrent", type=int, default=64, help="rows decoded together")
    p.add_argument("--model", choices=["tiny", "qwen3-0.6b", "smollm2-135m"], default="tiny")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--threads", type=int, default=1, help="torch threads (CPU)")
    p.add_argument("--skip-reencode", action="store_true", help="leave out the slow reference")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/engine.json"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    model, tok = build_model(args)
    try:
        import vllm  # noqa: F401

        vllm_note = ""
    except ImportError as e:
        vllm_note = f"vllm not importable ({e}); install the 'vllm' extra to compare"

    rows = []
    for name, work in workloads(args, tok).items():
        variants = {
            "generate": lambda w=work: run_generate(model, tok, w, args),
            "hf_kv": lambda w=work: run_hf_engine(model, tok, w, args, kv=True),
        }
        if not args.skip_reencode:
            variants["hf_reencode"] = lambda w=work: run_hf_engine(model, tok, w, args, kv=False)
        if not vllm_note:
            variants["vllm"] = lambda w=work: run_vllm(model, tok, w, args)
        # Warm-up outside the timing: allocator, kernels, first-call paths.
        run_generate(model, tok, work[:4], args)
        run_hf_engine(model, tok, work[:4], args, kv=True)
        for variant, fn in variants.items():
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            tokens = fn()
            if args.device.startswith("cuda"):
                torch.cuda.synchronize()
            elapsed = getattr(run_vllm, "elapsed", None) if variant == "vllm" else None
            elapsed = elapsed or time.perf_counter() - t0
            rows.append(
                {
                    "workload": name,
                    "engine": variant,
                    "tokens": tokens,
                    "seconds": elapsed,
                    "tokens_per_s": tokens / elapsed,
                }
            )
            print(f"  {name:8} {variant:12} {tokens / elapsed:10.0f} tokens/s", flush=True)
    for r in rows:
        base = next(x for x in rows if x["workload"] == r["workload"] and x["engine"] == "generate")
        r["vs_generate"] = r["tokens_per_s"] / base["tokens_per_s"]

    print(
        f"\nengine throughput: model {args.model} on {args.device}, {args.requests} requests per "
        f"workload, {args.concurrent} rows at a time, load average at start {load:.2f}"
    )
    print(
        f"{'workload':9} {'engine':12} {'tokens':>8} {'seconds':>8} {'tokens/s':>10} {'x gen':>6}"
    )
    for r in rows:
        print(
            f"{r['workload']:9} {r['engine']:12} {r['tokens']:8d} {r['seconds']:8.2f} "
            f"{r['tokens_per_s']:10.0f} {r['vs_generate']:6.2f}"
        )
    if vllm_note:
        print(f"vllm: skipped, {vllm_note}")
    report = {
        "benchmark": "engine",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(load, device=args.device, threads=args.threads),
        "workload": {
            k: getattr(args, k)
            for k in ("model", "requests", "length", "median", "sigma", "cap", "concurrent")
        },
        "vllm": vllm_note or "compared",
        "rows": rows,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
