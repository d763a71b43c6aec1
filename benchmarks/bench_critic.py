"""The critic off the critical path: an SAO learner step with `critic.concurrent` off and on.

    python benchmarks/bench_critic.py [--rows 16] [--steps 6] [--threads 1] [--out PATH]
    python benchmarks/bench_critic.py --device cuda --hidden 1024 --layers 8 --rows 64
    python benchmarks/bench_critic.py --device cuda:0 --critic-device cuda:1   # two GPUs

One SAO learner step (critic values, K=2 critic updates, one DIS policy update over
`--minibatches`) on one batch of long-tailed lengths (prompt 16 tokens + lognormal response,
median 48, sigma 1, at most 384; packed micro-batches), by learners built from the same
weights: `sequential` (the K critic updates, then the policy update) and `concurrent` (the K
updates on the critic's thread, beside the policy update). Their steps alternate, after one
warm-up step each, so all see the same machine load; the figure is the median step time.

A third learner, `separate_values`, runs the sequential step with the critic's values from a
forward pass of their own (`CriticUpdater.fused` off), as a critic with dropout does; the
sequential learner takes them from the first update's forward (`fused_values_speedup`).

The sequential learner also times its parts: `prepare` (the first critic update's forward and
backward, which yield the values, and GAE), `critic_update` (the first update's optimizer step
and the K-1 other updates) and the rest of the step (`policy`: the policy update and the
metrics). The ideal
concurrent step is `step - min(critic_update, policy)`, the step with the shorter of the two
hidden behind the longer. On CPU both threads compete for the same cores: with `--threads 1`
(saorl's default `run.torch_threads`) each side runs on one core, so on an idle 2-core
machine the two can overlap; under other load, or with every core already used by one side,
there is nothing to gain. Written to benchmarks/results/critic.json (or `--out`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from pathlib import Path

import torch
from _common import machine, write_report  # benchmarks/_common.py (run as scripts)


def _batch(tok, policy, rows: int, seed: int):
    from saorl.models.logprobs import sequence_logprobs
    from saorl.types import Batch, Trajectory

    g = torch.Generator().manual_seed(seed)
    resp = torch.exp(torch.log(torch.tensor(48.0)) + torch.randn(rows, generator=g))
    trajs = []
    for i, n in enumerate(resp.clamp(4, 384).round().int().tolist()):
        ids = torch.randint(3, len(tok), (16 + n,), generator=g).tolist()
        with torch.no_grad():
            t = torch.tensor([ids], device=policy.device)
            lp = sequence_logprobs(policy, t, torch.ones_like(t))[0, 16:].tolist()
        trajs.append(Trajectory(ids[:16], ids[16:], [1] * n, lp, [0] * n, reward=float(i % 2)))
    return Batch.from_trajectories(trajs, pad_id=tok.pad_token_id)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=16)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--critic-device", default="")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--minibatches", type=int, default=1)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results/critic.json")
    args = ap.parse_args()

    from saorl.config import load_config
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy

    torch.set_num_threads(args.threads)
    heads = max(4, args.hidden // 64)
    common = [
        f"model.hidden_size={args.hidden}",
        f"model.intermediate_size={3 * args.hidden}",
        f"model.num_layers={args.layers}",
        f"model.num_heads={heads}",
        f"model.num_kv_heads={heads // 2}",
        "model.max_seq_len=512",
        f"model.device={args.device}",
        f"critic.device={args.critic_device}",
        f"learner.batch_size={args.rows}",
        "learner.micro_batch_tokens=1024",
        f"algorithm.minibatches={args.minibatches}",
        "critic.warmup_steps=0",
        "learner.sft_steps=0",
        f"run.torch_threads={args.threads}",
    ]
    device = torch.device(args.device)
    torch.manual_seed(0)
    policy, tok = load_policy(load_config(None, common).model)
    policy.to(device)
    batch = _batch(tok, policy, args.rows, seed=1)
    arms = {}
    for name, flag in (
        ("separate_values", "false"),
        ("sequential", "false"),
        ("concurrent", "true"),
    ):
        cfg = load_config(None, [*common, f"critic.concurrent={flag}"])
        torch.manual_seed(0)
        arms[name] = Learner(cfg, load_policy(cfg.model)[0], device)
    arms["separate_values"].critic_updater.fused = False  # a values forward of their own

    # Parts of the sequential step, timed by wrapping the critic's two calls.
    seq = arms["sequential"].critic_updater
    parts: dict[str, list[float]] = {"prepare": [], "critic_update": []}
    for part, attr in (("prepare", "prepare"), ("critic_update", "update")):
        inner = getattr(seq, attr)

        def timed(*a, _inner=inner, _part=part, **k):
            _sync(device)
            t0 = time.perf_counter()
            out = _inner(*a, **k)
            _sync(device)
            parts[_part].append(time.perf_counter() - t0)
            return out

        setattr(seq, attr, timed)

    times: dict[str, list[float]] = {name: [] for name in arms}
    load = os.getloadavg()[0]
    for i in range(args.steps + 1):
        for name, learner in arms.items():
            _sync(device)
            t0 = time.perf_counter()
            learner.step(batch)
            _sync(device)
            if i:  # the first step of each allocates optimizer state
                times[name].append(time.perf_counter() - t0)
    for learner in arms.values():
        learner.close()
    med = {name: statistics.median(ts) for name, ts in times.items()}
    p = {part: statistics.median(ts[1:]) for part, ts in parts.items()}
    policy_s = med["sequential"] - p["prepare"] - p["critic_update"]
    ideal = med["sequential"] - min(p["critic_update"], policy_s)
    report = {
        "config": vars(args) | {"out": args.out.name},
        "real_tokens": int(batch.attention_mask.sum()),
        "step_s": med,
        "step_s_all": times,
        "sequential_parts_s": {**p, "policy": policy_s},
        "ideal_concurrent_step_s": ideal,
        "speedup": med["sequential"] / med["concurrent"],
        "fused_values_speedup": med["separate_values"] / med["sequential"],
        "ideal_speedup": med["sequential"] / ideal,
        "machine": machine(load, load_average_at_end=os.getloadavg()[0]),
    }
    print(f"{'arm':<16}{'median step s':>14}")
    for name, t in med.items():
        print(f"{name:<16}{t:>14.3f}")
    print(f"parts of the sequential step: {report['sequential_parts_s']}")
    print(
        f"speedup {report['speedup']:.2f}x, ideal {report['ideal_speedup']:.2f}x "
        f"(load average {load:.2f} at start)"
    )
    write_report(args.out, report)


if __name__ == "__main__":
    main()
