"""Learner cost: packed vs padded steps, chunked vs full-vocabulary log-probs, and gradient
checkpointing.

    python benchmarks/bench_learner.py [--rows 32] [--steps 2] [--out PATH]
    python benchmarks/bench_learner.py --part checkpointing   # part 3 only

1. One SAO learner step (critic values, K=2 critic updates, one DIS policy update) on a batch
   with long-tailed lengths (prompt 16 tokens + lognormal response, median 64, sigma 1, at most
   1024), padded (`micro_batch_size` rows per pass, padded to the batch's longest row, as
   `Batch.from_trajectories` builds it) against packed (`micro_batch_tokens`, the rows of a
   micro-batch in one row without padding). Same model, batch and seed. Reported: real tokens
   per second of step time, peak memory, the fraction of real (non-pad) tokens in the token
   slots each path computes, and how full the packed micro-batches fill their token budget.
2. Per-token log-probs of a 150k vocabulary, forward + backward: `sequence_logprobs` (chunks of
   `--chunk` positions, each under activation checkpointing) against the plain path
   (`model(...).logits` -> float32 log-softmax over the whole sequence).
3. One SAO learner step of a Qwen3-0.6B-shaped model (hidden 1024, 16 query / 8 key-value heads
   of 128, MLP 3072, vocabulary 151,936, tied embeddings; random init) with 4 of its 28 layers
   (a full step of 28 layers takes too long on a 2-core CPU), `model.gradient_checkpointing`
   off and on, `--ckpt-rows` rows of `--ckpt-seq` tokens in one micro-batch: the peak memory
   of a step on top of weights and optimizer state (the second step; the first also allocates
   Adam's state, reported as `first_step_peak_mb`) and its time. Written to
   benchmarks/results/learner_checkpointing.json.

Peak memory is measured honestly on CPU: every variant runs in a fresh subprocess, which
records its resident set size just before the measured work (`/proc/self/statm`) and the
high-water mark after it (`getrusage(RUSAGE_SELF).ru_maxrss`); the figure is the difference,
i.e. what the work added on top of the loaded model and batch. Large tensors are mmap'd by the
allocator and counted in RSS as soon as they are touched, so this captures transient peaks
that a before/after RSS reading would miss.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import torch
from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

VOCAB = 151_936  # Qwen3's vocabulary


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _lengths(rows: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    resp = torch.exp(torch.log(torch.tensor(64.0)) + torch.randn(rows, generator=g))
    return [16 + int(n) for n in resp.clamp(4, 1008).round()]


def _learner_variant(variant: str, rows: int, steps: int, seed: int) -> dict:
    from saorl.config import load_config
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy
    from saorl.models.logprobs import sequence_logprobs
    from saorl.models.packing import plan_token_micro_batches
    from saorl.types import Batch, Trajectory

    lengths = _lengths(rows, seed)
    micro_rows, budget = 8, 8 * 128  # the same ~1k real tokens per pass on average
    cfg = load_config(
        None,
        [
            "model.hidden_size=256",
            "model.intermediate_size=768",
            "model.num_layers=4",
            "model.num_heads=4",
            "model.num_kv_heads=2",
            f"model.max_seq_len={max(lengths)}",
            f"learner.batch_size={rows}",
            f"learner.micro_batch_size={micro_rows}",
            f"learner.micro_batch_tokens={budget if variant == 'packed' else 0}",
            "critic.warmup_steps=0",
            "learner.sft_steps=0",
            "run.torch_threads=1",
        ],
    )
    torch.set_num_threads(1)
    torch.manual_seed(seed)
    policy, tok = load_policy(cfg.model)
    g = torch.Generator().manual_seed(seed + 1)
    trajs = []
    for n in lengths:
        ids = torch.randint(3, len(tok), (n,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, 16:].tolist()
        trajs.append(
            Trajectory(
                ids[:16], ids[16:], [1] * (n - 16), lp, [0] * (n - 16), reward=float(len(trajs) % 2)
            )
        )
    batch = Batch.from_trajectories(trajs, pad_id=tok.pad_token_id)
    learner = Learner(cfg, policy, torch.device("cpu"))
    real = sum(lengths)
    if variant == "packed":
        plan = plan_token_micro_batches(lengths, budget)
        slots, fill = real, real / (len(plan) * budget)
    else:
        slots, fill = rows * batch.input_ids.shape[1], None
    base = _rss_mb()
    learner.step(batch)  # first step: allocations and lazy initialisation happen here
    t0 = time.perf_counter()
    for _ in range(steps):
        learner.step(batch)
    dt = (time.perf_counter() - t0) / steps
    return {
        "variant": variant,
        "rows": rows,
        "real_tokens": real,
        "max_len": max(lengths),
        "token_slots": slots,
        "real_token_frac": real / slots,
        "budget_fill": fill,
        "step_s": dt,
        "tokens_per_s": real / dt,
        "peak_mb": _peak_mb() - base,
    }


def _logprob_variant(variant: str, seq: int, chunk: int) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from saorl.models.logprobs import sequence_logprobs

    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=seq,
        tie_word_embeddings=True,
    )
    model = Qwen3ForCausalLM(config)
    ids = torch.randint(0, VOCAB, (1, seq))
    mask = torch.ones_like(ids)
    base = _rss_mb()
    t0 = time.perf_counter()
    if variant == "chunked":
        logp = sequence_logprobs(model, ids, mask, chunk_size=chunk)[:, 1:]
    else:
        logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), -1).gather(-1, ids[:, 1:, None])[..., 0]
    logp.sum().backward()
    return {
        "variant": variant,
        "vocab": VOCAB,
        "seq": seq,
        "chunk": chunk,
        "seconds": time.perf_counter() - t0,
        "peak_mb": _peak_mb() - base,
    }


QWEN3_06B = {
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": VOCAB,
    "tie_word_embeddings": True,
    "num_hidden_layers": 28,
}
CKPT_LAYERS = 4


def _checkpointing_variant(variant: str, rows: int, seq: int) -> dict:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from saorl.config import load_config
    from saorl.learner.learner import Learner
    from saorl.models.logprobs import sequence_logprobs
    from saorl.types import Batch, Trajectory

    cfg = load_config(
        None,
        [
            f"model.max_seq_len={seq}",
            f"learner.batch_size={rows}",
            f"learner.micro_batch_size={rows}",
            "critic.warmup_steps=0",
            "learner.sft_steps=0",
            f"model.gradient_checkpointing={'true' if variant == 'on' else 'false'}",
        ],
    )
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = Qwen3Config(
        **{**QWEN3_06B, "num_hidden_layers": CKPT_LAYERS}, max_position_embeddings=seq
    )
    policy = Qwen3ForCausalLM(config)
    if cfg.model.gradient_checkpointing:  # what load_policy does for a loaded model
        policy.activation_checkpointing_enable({"use_reentrant": False})
    g = torch.Generator().manual_seed(1)
    prompt = 16
    trajs = []
    for i in range(rows):
        ids = torch.randint(3, VOCAB, (seq,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids])
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, prompt:].tolist()
        n = seq - prompt
        trajs.append(
            Trajectory(ids[:prompt], ids[prompt:], [1] * n, lp, [0] * n, reward=float(i % 2))
        )
    batch = Batch.from_trajectories(trajs, pad_id=0)
    learner = Learner(cfg, policy, torch.device("cpu"))
    base = _rss_mb()
    learner.step(batch)  # the first step also allocates both optimizers' state
    first = _peak_mb() - base
    # The second step's own peak: activations and gradients on top of weights and optimizer
    # state, which is what checkpointing changes. Writing 5 to clear_refs resets VmHWM.
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base = _rss_mb()
    t0 = time.perf_counter()
    learner.step(batch)
    return {
        "variant": variant,
        "shape": f"qwen3-0.6b, {CKPT_LAYERS} of 28 layers",
        "params_policy": sum(p.numel() for p in learner.policy.parameters()),
        "rows": rows,
        "tokens": rows * seq,
        "step_s": time.perf_counter() - t0,
        "first_step_peak_mb": first,
        "peak_mb": _hwm_mb() - base,
    }


def _hwm_mb() -> float:
    """This process's resident high-water mark (VmHWM), resettable through clear_refs."""
    with open("/proc/self/status") as f:
        return next(int(x.split()[1]) for x in f if x.startswith("VmHWM")) / 1024


def _fresh(kind: str, variant: str, args: argparse.Namespace) -> dict:
    """Run one variant in a new interpreter, so its peak memory is its own."""
    cmd = [
        sys.executable,
        __file__,
        "--child",
        kind,
        variant,
        "--rows",
        str(args.rows),
        "--steps",
        str(args.steps),
        "--seq",
        str(args.seq),
        "--chunk",
        str(args.chunk),
        "--ckpt-rows",
        str(args.ckpt_rows),
        "--ckpt-seq",
        str(args.ckpt_seq),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=32, help="trajectories per learner batch")
    parser.add_argument("--steps", type=int, default=2, help="timed learner steps per variant")
    parser.add_argument("--seq", type=int, default=1024, help="positions for the log-prob test")
    parser.add_argument("--chunk", type=int, default=256, help="chunk size of chunked log-probs")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--ckpt-rows", type=int, default=2, help="rows of the checkpointing step")
    parser.add_argument("--ckpt-seq", type=int, default=512, help="tokens per row there")
    parser.add_argument("--part", choices=("all", "checkpointing"), default="all")
    parser.add_argument("--out", type=Path, help="default benchmarks/results/learner.json")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "VARIANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        kind, variant = args.child
        if kind == "learner":
            res = _learner_variant(variant, args.rows, args.steps, args.seed)
        elif kind == "checkpointing":
            res = _checkpointing_variant(variant, args.ckpt_rows, args.ckpt_seq)
        else:
            res = _logprob_variant(variant, args.seq, args.chunk)
        print(json.dumps(res))
        return
    checkpointing = _checkpointing(args)
    if args.part == "checkpointing":
        return
    learner = {v: _fresh("learner", v, args) for v in ("padded", "packed")}
    logprobs = {v: _fresh("logprobs", v, args) for v in ("full", "chunked")}
    pad, pk = learner["padded"], learner["packed"]
    full, ch = logprobs["full"], logprobs["chunked"]
    ratios = {
        "packed_over_padded_tokens_per_s": pk["tokens_per_s"] / pad["tokens_per_s"],
        "packed_over_padded_peak_mem": pk["peak_mb"] / pad["peak_mb"],
        "chunked_over_full_peak_mem": ch["peak_mb"] / full["peak_mb"],
    }
    targets = {
        "packed_real_token_frac>=0.95": pk["real_token_frac"] >= 0.95,
        "chunked_over_full_peak_mem<=0.25": ratios["chunked_over_full_peak_mem"] <= 0.25,
    }
    print(
        f"learner step: {args.rows} rows, lengths median ~80, max {pad['max_len']} tokens; "
        f"log-probs: vocab {VOCAB}, {args.seq} positions, fwd+bwd"
    )
    print(
        f"{'variant':<22}{'tokens/s':>10}{'step s':>9}{'peak MB':>10}{'real frac':>11}"
        f"{'budget fill':>13}"
    )
    for name, r in (("padded step", pad), ("packed step", pk)):
        fill = f"{r['budget_fill']:.3f}" if r["budget_fill"] is not None else "-"
        print(
            f"{name:<22}{r['tokens_per_s']:>10.0f}{r['step_s']:>9.2f}{r['peak_mb']:>10.0f}"
            f"{r['real_token_frac']:>11.3f}{fill:>13}"
        )
    for name, r in (("full-vocab logits", full), ("chunked log-probs", ch)):
        print(f"{name:<22}{'-':>10}{r['seconds']:>9.2f}{r['peak_mb']:>10.0f}{'-':>11}{'-':>13}")
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    for k, ok in targets.items():
        print(f"target {k}: {'met' if ok else 'MISSED'}")
    report = {
        "learner": learner,
        "logprobs": logprobs,
        "checkpointing": checkpointing,
        "ratios": ratios,
        "targets": targets,
        "machine": machine(),
    }
    write_report(args.out or Path("benchmarks/results/learner.json"), report)


def _checkpointing(args: argparse.Namespace) -> dict:
    """Part 3: the step with gradient checkpointing off and on, each in a fresh process."""
    load = os.getloadavg()[0]
    runs = {v: _fresh("checkpointing", v, args) for v in ("off", "on")}
    off, on = runs["off"], runs["on"]
    ratios = {
        "on_over_off_peak_mem": on["peak_mb"] / off["peak_mb"],
        "on_over_off_step_s": on["step_s"] / off["step_s"],
    }
    print(
        f"gradient checkpointing, {off['shape']}: {off['rows']} rows x "
        f"{off['tokens'] // off['rows']} tokens, one SAO step (K=2 critic updates + policy)"
    )
    for name, r in runs.items():
        print(
            f"  {name:<4} step peak {r['peak_mb']:>7.0f} MB (first step "
            f"{r['first_step_peak_mb']:.0f} MB)   step {r['step_s']:>7.1f} s"
        )
    for k, v in ratios.items():
        print(f"{k}: {v:.3f}")
    report = {"runs": runs, "ratios": ratios, "machine": machine(load_average_at_start=load)}
    if args.part == "checkpointing":
        write_report(args.out or Path("benchmarks/results/learner_checkpointing.json"), report)
    return report


if __name__ == "__main__":
    main()
