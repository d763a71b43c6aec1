"""Agent programs through the training endpoint against the in-process agent loop.

    python benchmarks/bench_endpoint.py [--episodes 256] [--concurrent 64] [--length 16]
                                        [--latency-episodes 40] [--repeats 3] [--out PATH]

Workload: the built-in model (random init) and the built-in addition task; every model turn is
forced to exactly `--length` tokens (EOS suppressed, `AgentLimits.forced_length`), so both arms
decode the same number of tokens and the same prompts. One rollout worker, one HF engine:

    inproc    the worker's own agent loop: `ArithmeticEnv` episodes (reset, one turn, graded)
    endpoint  the same episodes written as an agent program: `async def run(task, client)`
              sends the task's prompt with the `openai` SDK to the worker's endpoint and grades
              the reply (HTTP on loopback, the worker's handover, token recording)

Throughput: trajectories/s over `--episodes` episodes with `--concurrent` sequences decoded
together (the engine full), best of `--repeats`; ratio = endpoint / inproc. Added latency per
call: the same arms with one episode at a time (`--latency-episodes`, `max_concurrent = 1`),
(endpoint time - inproc time) / episodes, each episode being one call. Both arms run one after
the other in this process on the same machine; the load average at the start is recorded.
"""

from __future__ import annotations

import argparse
import os
import queue
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, write_report  # noqa: E402
from saorl.config import EnvConfig, load_config  # noqa: E402
from saorl.envs.agent import AgentProgram  # noqa: E402
from saorl.envs.arithmetic import ArithmeticEnv, ArithmeticTask  # noqa: E402
from saorl.models.loading import load_policy  # noqa: E402
from saorl.rollout.hf_engine import HFEngine  # noqa: E402
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker  # noqa: E402


async def agent(task, client):
    reply = await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}]
    )
    return float((reply.choices[0].message.content or "").strip() == task["answer"])


def run_arm(arm: str, model, tok, tasks, concurrent: int, length: int) -> float:
    """Seconds to finish one episode per task."""
    engine = HFEngine(model, tok, max_seq_len=64, max_concurrent=concurrent, seed=0)
    limits = AgentLimits(max_seq_len=64, max_new_tokens=length, forced_length=lambda: length)
    if arm == "inproc":
        make_env = ArithmeticEnv
    else:
        cfg = EnvConfig()
        make_env = lambda: AgentProgram(cfg, agent, None, None)  # noqa: E731
    out: queue.Queue = queue.Queue()
    feed = FixedFeed(list(tasks))
    worker = RolloutWorker(engine, feed, tok, out, make_env, limits)
    t0 = time.perf_counter()
    worker.start()
    got = 0
    while got < len(tasks):
        traj = out.get(timeout=600)
        assert traj.stop_reason not in ("env_error", "aborted"), traj.info
        assert len(traj.completion_ids) == length
        got += 1
    elapsed = time.perf_counter() - t0
    worker.stop_thread()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--latency-episodes", type=int, default=40)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/endpoint.json")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_policy(load_config(None, []).model)
    task = ArithmeticTask(2, 16, 1234)
    rng = random.Random(0)
    tasks = [task.sample(rng) for _ in range(args.episodes)]
    # Warm-up: first calls pay imports (openai) and allocator growth.
    for arm in ("inproc", "endpoint"):
        run_arm(arm, model, tok, tasks[:8], 8, args.length)
    result = {}
    for arm in ("inproc", "endpoint"):
        times = [
            run_arm(arm, model, tok, tasks, args.concurrent, args.length)
            for _ in range(args.repeats)
        ]
        lat = [
            run_arm(arm, model, tok, tasks[: args.latency_episodes], 1, args.length)
            for _ in range(args.repeats)
        ]
        result[arm] = {
            "seconds": times,
            "trajectories_per_s": len(tasks) / min(times),
            "sequential_seconds": lat,
            "sequential_s_per_episode": min(lat) / args.latency_episodes,
        }
        print(arm, result[arm], flush=True)
    ratio = result["endpoint"]["trajectories_per_s"] / result["inproc"]["trajectories_per_s"]
    added = (
        result["endpoint"]["sequential_s_per_episode"]
        - result["inproc"]["sequential_s_per_episode"]
    )
    report = {
        "workload": vars(args) | {"out": str(args.out)},
        "arms": result,
        "throughput_ratio_endpoint_over_inproc": ratio,
        "added_latency_ms_per_call": added * 1000,
        "machine": machine(load),
    }
    print(f"throughput ratio {ratio:.3f}, added latency {added * 1000:.2f} ms per call")
    write_report(args.out, report)


if __name__ == "__main__":
    main()
