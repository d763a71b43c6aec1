"""Agent programs through the training endpoint against the in-process agent loop.

    python benchmarks/bench_endpoint.py [--episodes 256] [--concurrent 64] [--length 16]
                                        [--latency-episodes 40] [--repeats 3] [--out PATH]
                                        [--arms inproc,endpoint,http]

Workload: the built-in model (random init) and the built-in addition task; every model turn is
forced to exactly `--length` tokens (EOS suppressed, `AgentLimits.forced_length`), so both arms
decode the same number of tokens and the same prompts. One rollout worker, one HF engine:

    inproc    the worker's own agent loop: `ArithmeticEnv` episodes (reset, one turn, graded)
    endpoint  the same episodes written as an agent program: `async def run(task, client)`
              sends the task's prompt with the `openai` SDK to the worker's endpoint and grades
              the reply (the client it is given: served in-process, no HTTP; the worker's
              handover, token recording)
    http      the same program with an `openai` client of its own built from the episode's
              base URL and key (HTTP on loopback, as other SDKs and command agents call)

Throughput: trajectories/s over `--episodes` episodes with `--concurrent` sequences decoded
together (the engine full), best of `--repeats`; ratio = arm / inproc; and this process's CPU
time per trajectory (on a shared machine wall time mostly measures waiting for a core). Added
latency per call: the same arms with one episode at a time (`--latency-episodes`,
`max_concurrent = 1`), (arm time - inproc time) / episodes, each episode being one call. The
arms take turns in each repeat, in this process on the same machine; the load average at the
start is recorded.
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


_POOLS: dict = {}


async def http_agent(task, client):
    """`agent` over HTTP: its own client from the episode's URL and key (one connection pool
    per event loop, as `saorl.envs.agent` keeps: building one costs ~0.2 s)."""
    import asyncio

    import openai

    loop = asyncio.get_running_loop()
    if loop not in _POOLS:
        _POOLS[loop] = openai.DefaultAsyncHttpxClient()
    own = openai.AsyncOpenAI(
        base_url=client.base_url, api_key=client.api_key, max_retries=0, http_client=_POOLS[loop]
    )
    return await agent(task, own)


def run_arm(arm: str, model, tok, tasks, concurrent: int, length: int) -> float:
    """Seconds to finish one episode per task."""
    engine = HFEngine(model, tok, max_seq_len=64, max_concurrent=concurrent, seed=0)
    limits = AgentLimits(max_seq_len=64, max_new_tokens=length, forced_length=lambda: length)
    if arm == "inproc":
        make_env = ArithmeticEnv
    else:
        cfg, fn = EnvConfig(), agent if arm == "endpoint" else http_agent
        make_env = lambda: AgentProgram(cfg, fn, None, None)  # noqa: E731
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
    ap.add_argument("--arms", default="inproc,endpoint,http", help="inproc first")
    args = ap.parse_args()
    load = os.getloadavg()[0]
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_policy(load_config(None, []).model)
    task = ArithmeticTask(2, 16, 1234)
    rng = random.Random(0)
    tasks = [task.sample(rng) for _ in range(args.episodes)]
    arms = args.arms.split(",")
    # Warm-up: first calls pay imports (openai) and allocator growth.
    for arm in arms:
        run_arm(arm, model, tok, tasks[:8], 8, args.length)
    times: dict[str, list[float]] = {a: [] for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    lat: dict[str, list[float]] = {a: [] for a in arms}
    for _ in range(args.repeats):  # the arms take turns: a change of load hits them alike
        for arm in arms:
            c0 = time.process_time()  # this process's CPU: less swayed by others' load
            times[arm].append(run_arm(arm, model, tok, tasks, args.concurrent, args.length))
            cpu[arm].append(time.process_time() - c0)
            sub = tasks[: args.latency_episodes]
            lat[arm].append(run_arm(arm, model, tok, sub, 1, args.length))
    result = {
        arm: {
            "seconds": times[arm],
            "trajectories_per_s": len(tasks) / min(times[arm]),
            "cpu_seconds": cpu[arm],
            "cpu_ms_per_trajectory": min(cpu[arm]) / len(tasks) * 1000,
            "sequential_seconds": lat[arm],
            "sequential_s_per_episode": min(lat[arm]) / args.latency_episodes,
        }
        for arm in arms
    }
    base = result["inproc"]
    ratios, added = {}, {}
    for arm in arms[1:]:
        ratios[arm] = result[arm]["trajectories_per_s"] / base["trajectories_per_s"]
        gap = result[arm]["sequential_s_per_episode"] - base["sequential_s_per_episode"]
        added[arm] = gap * 1000
        print(f"{arm}: throughput ratio {ratios[arm]:.3f}, added latency {added[arm]:.2f} ms/call")
    report = {
        "workload": vars(args) | {"out": str(args.out)},
        "arms": result,
        "throughput_ratio_over_inproc": ratios,
        "added_latency_ms_per_call": added,
        "machine": machine(load),
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
