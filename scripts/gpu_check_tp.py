"""Part 5 of scripts/gpu_check.py: one vLLM engine over two GPUs (tensor parallelism).

`rollout.vllm_tensor_parallel_size = 2`: vLLM's multiprocess executor, one worker process per
GPU, the engine core in saorl's process (`saorl.engines.vllm.executor_args`). On the check's
model: start-up seconds and tokens/s; then a weight push of other weights *while requests are
running*, which must reach both workers (`collective_rpc`, each loading its shard): every
request's per-token versions are 0 up to the push and 1 after it (none sampled by both in one
token, none going back), and fresh samples scored by the learner under the pushed weights agree
with the engine's log-probs while those of the original weights do not. Runs only with two or
more CUDA devices (else it says so and is skipped); `--cpu-smoke` runs the same logic on the HF
engine (one device, no tensor parallelism) so that the code itself is tested on CPU.
"""

from __future__ import annotations

import argparse
import time
from typing import Any


def part_tensor_parallel(args: argparse.Namespace, gc: Any) -> dict[str, Any]:
    """Part 5; `gc`: scripts/gpu_check.py's module (its request, push and scoring helpers)."""
    import torch

    from saorl.engines.factory import build_engine
    from saorl.models.loading import load_policy
    from saorl.models.logprobs import sequence_logprobs

    smoke = args.cpu_smoke
    devices = 0 if smoke else torch.cuda.device_count()
    if not smoke and devices < 2:
        return {"skipped": f"tensor parallelism needs 2 CUDA devices, this machine has {devices}"}
    prompt_len, new = (4, args.new_tokens) if smoke else (32, min(args.new_tokens, 64))
    cfg = gc.engine_config(
        args,
        prompt_len + new,
        f"rollout.vllm_tensor_parallel_size={1 if smoke else 2}",
        "rollout.vllm_enforce_eager=true",
    )
    device = torch.device(cfg.model.device)
    policy, tokenizer = load_policy(cfg.model)
    policy.to(device).eval()
    g = torch.Generator().manual_seed(2)

    def requests(n: int) -> list[Any]:
        return gc.forced_requests(tokenizer, g, n, prompt_len, new)

    t0 = time.perf_counter()
    engine = build_engine(cfg, policy, tokenizer, seed=0)
    startup = time.perf_counter() - t0
    try:
        engine.generate(requests(2))  # first-call allocations stay out of the timing
        gc.sync(device)
        t0 = time.perf_counter()
        done = engine.generate(requests(args.prompts))
        gc.sync(device)
        gen_s = time.perf_counter() - t0
        pushed = gc.other_weights(cfg, device)
        for r in requests(8):
            engine.add_request(r)
        finished = []
        for _ in range(new // 2):  # half way: the push lands on requests in flight
            finished += engine.step()
        t0 = time.perf_counter()
        engine.update_weights(pushed.state_dict(), version=1)
        gc.sync(device)
        push_s = time.perf_counter() - t0
        while engine.num_unfinished():
            finished += engine.step()
        after = engine.generate(requests(8))
    finally:
        engine.close()
    versions = [c.versions for c in finished]
    exact = all(v == sorted(v) and set(v) <= {0, 1} for v in versions)
    agree = gc.logprob_gap(pushed, after, sequence_logprobs, device)
    stale = gc.logprob_gap(policy, after, sequence_logprobs, device)
    return {
        "engine": cfg.rollout.engine,
        "tensor_parallel_size": cfg.rollout.vllm_tensor_parallel_size,
        "devices": devices,
        "startup_s": startup,
        "tokens_per_s": sum(len(c.token_ids) for c in done) / gen_s,
        "push_s": push_s,
        "in_flight_across_push": len(finished),
        "versions_exact": exact and any(0 in v and 1 in v for v in versions),
        "pushed_vs_learner_max_abs_logprob_diff": agree,
        "original_vs_learner_max_abs_logprob_diff": stale,
        "push_in_use": agree < 0.1 * stale,
    }
