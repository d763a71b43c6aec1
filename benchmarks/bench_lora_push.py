"""LoRA weight pushes: the merged model against the adapter alone (`model.lora_push`), bytes and
seconds per push, on the same engine and model in one run.

    python benchmarks/bench_lora_push.py [--engine hf|vllm] [--model builtin|qwen3-0.6b]
        [--layers N] [--rank 16] [--pushes 5] [--out PATH]

For each push the adapters move (as a learner step moves them), then:
- `merged`: the learner merges `W + (alpha / r) B A` into the plain state (`policy_state`) and
  the engine loads all of it;
- `adapter`: the learner sends the adapter tensors (`push_state`) and the engine applies them
  (the HF engine merges them into its copy from the base it holds; vLLM reloads its LoRA
  adapter in place).
`bytes` is what one engine receives per push; `learner_s` the learner's part (merging or
picking tensors), `send_s` the engine's `update_weights` call (the HF engine snapshots the
tensors; vLLM loads them), `apply_s` the HF engine loading its queued push at its next step
(0 for vLLM), `total_s` their sum; medians over `--pushes` pushes. After the last push of each
arm the engine's log-probs for fixed prompts are checked against the merged model's.

`--model qwen3-0.6b` is a Qwen3-0.6B-shaped random-init model (1024 wide, vocabulary 151936)
with `--layers` of its 28 layers; the JSON also holds the bytes of both pushes for the whole
28-layer shape, counted from the tensor shapes on the meta device (no push run).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch
from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

from saorl.config import load_config
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import add_lora, merged_copy, merged_state, push_state, state_bytes


def qwen3_06b(layers: int, tok: Any, device: str = "cpu") -> torch.nn.Module:
    from transformers import Qwen3Config, Qwen3ForCausalLM

    config = Qwen3Config(
        vocab_size=151936,
        hidden_size=1024,
        intermediate_size=3072,
        num_hidden_layers=layers,
        num_attention_heads=16,
        num_key_value_heads=8,
        head_dim=128,
        max_position_embeddings=64,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    with torch.device(device):
        return Qwen3ForCausalLM(config)


def build(args: argparse.Namespace) -> tuple[torch.nn.Module, Any, Any]:
    torch.manual_seed(0)
    cfg = load_config(
        None,
        [
            f"model.lora_rank={args.rank}",
            f"model.lora_alpha={2 * args.rank}",
            "model.max_seq_len=64",
        ],
    )
    policy, tok = load_policy(cfg.model)
    if args.model == "qwen3-0.6b":
        policy = qwen3_06b(args.layers, tok)
    add_lora(policy, cfg.model)
    return policy, tok, cfg


def move_adapters(policy: torch.nn.Module) -> None:
    with torch.no_grad():
        for name, p in policy.named_parameters():
            if ".lora_" in name:
                p.add_(0.01 * torch.randn_like(p))


def build_engine(args: argparse.Namespace, policy: torch.nn.Module, tok: Any, how: str) -> Any:
    if args.engine == "hf":
        from saorl.engines.hf import HFEngine

        return HFEngine(policy, tok, EngineSettings(max_seq_len=64, seed=0))
    from saorl.engines.vllm import VLLMEngine

    return VLLMEngine.from_policy(
        policy,
        tok,
        EngineSettings(max_seq_len=64, seed=0),
        enforce_eager=True,
        kv_cache_gib=0.25,
        lora_adapter=how == "adapter",
    )


def check(engine: Any, policy: torch.nn.Module, tok: Any, version: int) -> float:
    """Largest |engine log-prob - merged model's| over a few sampled completions."""
    plain = merged_copy(policy)
    reqs = [GenerationRequest(tok.encode(f"{i}+{i}="), 8, request_id=i) for i in range(4)]
    worst = 0.0
    for c in engine.generate(reqs):
        assert c.versions == [version] * len(c.token_ids)
        ids = torch.tensor([c.request.prompt_ids + c.token_ids])
        with torch.no_grad():
            lp = sequence_logprobs(plain, ids, torch.ones_like(ids))[0, len(c.request.prompt_ids) :]
        worst = max(worst, (torch.tensor(c.logprobs) - lp).abs().max().item())
    return worst


def arm(args: argparse.Namespace, policy: torch.nn.Module, tok: Any, how: str) -> dict[str, Any]:
    engine = build_engine(args, policy, tok, how)
    rows = []
    try:
        for version in range(1, args.pushes + 1):
            move_adapters(policy)
            t0 = time.perf_counter()
            state = policy.state_dict()
            state = (
                merged_state(state, policy)
                if how == "merged"
                else push_state(state, policy, "adapter", full=False)
            )
            t1 = time.perf_counter()
            engine.update_weights(state, version)
            t2 = time.perf_counter()
            if args.engine == "hf":
                engine.step()  # idle: loads the queued push, as at the next decoding step
            t3 = time.perf_counter()
            rows.append(
                {
                    "bytes": state_bytes(state),
                    "learner_s": t1 - t0,
                    "send_s": t2 - t1,
                    "apply_s": t3 - t2,
                    "total_s": t3 - t0,
                }
            )
        worst = check(engine, policy, tok, args.pushes)
    finally:
        engine.close()
    out = {k: statistics.median(r[k] for r in rows) for k in rows[0]}
    return {**out, "max_abs_logprob_diff": worst, "pushes": rows}


def whole_shape_bytes(tok: Any, rank: int) -> dict[str, int]:
    """Both pushes' bytes for the whole 28-layer Qwen3-0.6B shape (float32), from shapes."""
    cfg = load_config(None, [f"model.lora_rank={rank}", f"model.lora_alpha={2 * rank}"])
    model = qwen3_06b(28, tok, device="meta")
    add_lora(model, cfg.model)
    state = model.state_dict()
    return {
        "merged": state_bytes(merged_state(state, model)),
        "adapter": state_bytes(push_state(state, model, "adapter", full=False)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engine", choices=["hf", "vllm"], default="hf")
    ap.add_argument("--model", choices=["builtin", "qwen3-0.6b"], default="builtin")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--pushes", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    load = os.getloadavg()[0]
    policy, tok, _ = build(args)
    arms = {how: arm(args, policy, tok, how) for how in ("merged", "adapter")}
    m, a = arms["merged"], arms["adapter"]
    shape = f"{args.model} ({args.layers} layers)" if args.model != "builtin" else args.model
    print(f"{args.engine} engine, {shape}, rank {args.rank}, medians of {args.pushes} pushes")
    print("| push | bytes | learner s | send s | apply s | total s | max |dlogp| |")
    print("|---|---|---|---|---|---|---|")
    for how, r in arms.items():
        print(
            f"| {how} | {r['bytes']:,} | {r['learner_s']:.4f} | {r['send_s']:.4f} | "
            f"{r['apply_s']:.4f} | {r['total_s']:.4f} | {r['max_abs_logprob_diff']:.1e} |"
        )
    print(
        f"adapter / merged: bytes {a['bytes'] / m['bytes']:.4f}, "
        f"seconds {a['total_s'] / m['total_s']:.3f}"
    )
    report: dict[str, Any] = {
        "machine": machine(load),
        "args": vars(args) | {"out": None},
        "arms": arms,
        "bytes_ratio": a["bytes"] / m["bytes"],
        "seconds_ratio": a["total_s"] / m["total_s"],
    }
    if args.model == "qwen3-0.6b":
        report["whole_28_layer_bytes"] = whole_shape_bytes(tok, args.rank)
        print(f"whole 28-layer shape: {report['whole_28_layer_bytes']}")
    name = f"lora_push_{args.engine}_{args.model}.json"
    write_report(args.out or Path(__file__).parent / "results" / name, report)


if __name__ == "__main__":
    main()
