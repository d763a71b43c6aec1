"""Agent programs through the training endpoint against the in-process agent loop.

    python benchmarks/bench_endpoint.py [--model tiny|small] [--episodes 256] [--concurrent 64]
                                        [--length 16] [--latency-episodes 100] [--repeats 3]
                                        [--out PATH] [--arms inproc,endpoint,http]

Workload: a random-init model of the built-in architecture (Qwen3-style) and the built-in
addition task; every model turn is forced to exactly `--length` tokens (EOS suppressed,
`AgentLimits.forced_length`), so the arms decode the same number of tokens from the same
prompts. `--model tiny` is the built-in model (0.5 M parameters: a decoding step of 64 rows
costs a few ms of CPU, so per-call overhead dominates); `--model small` widens it to 512 units
and 8 layers (25 M parameters, built here, nothing downloaded: a step costs ~100 ms of CPU, so
the engine's work dominates, as with any real model on CPU). One rollout worker, one HF engine:

    inproc    the worker's own agent loop: `ArithmeticEnv` episodes (reset, one turn, graded)
    endpoint  the same episodes written as an agent program: `async def run(task, client)`
              sends the task's prompt with the `openai` SDK to the worker's endpoint and grades
              the reply (the client it is given: served in-process, no HTTP; the worker's
              handover, token recording)
    http      the same program with an `openai` client of its own built from the episode's
              base URL and key (HTTP on loopback, as other SDKs and command agents call)
    http_threaded  (not run by default) `http` against the standard library's threaded server
              the endpoint had before uvicorn (`_endpoint_load.THREADED_SERVER`, from git)

Throughput: trajectories/s over `--episodes` episodes with `--concurrent` sequences decoded
together (the engine full), the median of `--repeats`; the ratio to inproc is taken within each
repeat (the arms run back to back) and its median and range are reported; and this process's
CPU time per trajectory (on a shared machine wall time mostly measures waiting for a core).
Added latency per call: the same arms with one episode at a time (`--latency-episodes`,
`max_concurrent = 1`, each episode one call): the median time between consecutive finished
episodes (robust to a burst of load that stalls a few of them), arm minus inproc, per repeat;
and the same less each turn's time in the engine (from entering it to its completion), which
takes out how fast the engine happened to decode in that run (the larger noise on a shared
machine) and leaves what an episode costs around its turn. Medians and ranges over the
repeats are reported. The arms take turns in each repeat, in
this process on the same machine; the load average before and after is recorded.

    python benchmarks/bench_endpoint.py --load 1000 [--load-calls 2] [--length 16] [--repeats 2]
                                        [--out benchmarks/results/endpoint_load.json]

The load case: `--load` agent episodes at once (the engine holds them all), each a program
making `--load-calls` calls over HTTP with an `openai` client of its own (one connection pool
as large as the load, so every call in flight has its connection, as a thousand command agents
would), served by the endpoint's uvicorn server (`asgi`) and by the standard library's threaded
server it replaced (`threaded`: `saorl/rollout/agents/server.py` as of `THREADED_SERVER`, read
from git when the benchmark runs). Each server runs in a process of its own (`--repeats` times,
the order alternating), which reports its peak thread count (sampled at every engine step),
peak RSS (and RSS before the load), failed calls, and each call's added latency: the time the
agent waited for its reply less the time its request spent in the engine (queued, prefilled,
decoded), p50 and p99, i.e. what HTTP, the server and the handover to the worker cost.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import machine, write_report  # noqa: E402
from benchmarks._endpoint_load import (  # noqa: E402
    LOAD_SERVERS,
    client_main,
    load_case,
    load_child,
    threaded_endpoint,
)
from saorl.config import EnvConfig, load_config  # noqa: E402
from saorl.engines.hf import HFEngine  # noqa: E402
from saorl.engines.protocol import EngineSettings  # noqa: E402
from saorl.envs.agent import AgentProgram  # noqa: E402
from saorl.envs.arithmetic import ArithmeticEnv, ArithmeticTask  # noqa: E402
from saorl.models.loading import load_policy  # noqa: E402
from saorl.rollout.agents import runs  # noqa: E402
from saorl.rollout.agents.server import TrainingEndpoint  # noqa: E402
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


# `--model small`: the built-in architecture widened (model config overrides, random init)
MODELS = {
    "tiny": [],
    "small": [
        "model.hidden_size=512",
        "model.num_layers=8",
        "model.num_heads=8",
        "model.num_kv_heads=4",
        "model.intermediate_size=1536",
    ],
}


class TimedEngine(HFEngine):
    """The HF engine, noting when each request entered it and when its turn came out."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.added: dict[int, float] = {}
        self.engine_s: list[float] = []  # each request's time in the engine, in finishing order

    def add_request(self, request) -> None:
        self.added[request.request_id] = time.perf_counter()
        super().add_request(request)

    def step(self):
        done = super().step()
        now = time.perf_counter()
        self.engine_s += [now - self.added.pop(c.request.request_id) for c in done]
        return done


def run_arm(arm: str, model, tok, tasks, concurrent: int, length: int):
    """`(finished, engine_s)`: seconds from the start until each episode's trajectory came
    out, in order, and each turn's time in the engine (queued, prefilled, decoded)."""
    engine = TimedEngine(
        model, tok, EngineSettings(max_seq_len=64, max_concurrent=concurrent, seed=0)
    )
    limits = AgentLimits(max_seq_len=64, max_new_tokens=length, forced_length=lambda: length)
    runs.TrainingEndpoint = threaded_endpoint() if arm == "http_threaded" else TrainingEndpoint
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
    done = []
    while len(done) < len(tasks):
        traj = out.get(timeout=600)
        assert traj.stop_reason not in ("env_error", "aborted"), traj.info
        assert len(traj.completion_ids) == length
        done.append(time.perf_counter() - t0)
    worker.stop_thread()
    return done, engine.engine_s


def episode_seconds(done: list[float]) -> list[float]:
    """One episode at a time: each one's time is the gap since the one before."""
    return [b - a for a, b in zip([0.0, *done], done, strict=False)]


def outside_engine(done: list[float], engine_s: list[float]) -> list[float]:
    """One episode (one turn) at a time: each one's time less its turn's time in the engine,
    i.e. what the episode cost besides decoding (starting it, the call, grading, handing on)."""
    return [gap - e for gap, e in zip(episode_seconds(done), engine_s, strict=True)]


def spread(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), default="tiny")
    ap.add_argument("--episodes", type=int, default=256)
    ap.add_argument("--concurrent", type=int, default=64)
    ap.add_argument("--length", type=int, default=16)
    ap.add_argument("--latency-episodes", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/endpoint.json")
    ap.add_argument("--arms", default="inproc,endpoint,http", help="inproc first")
    ap.add_argument("--load", type=int, default=0, help="the load case: episodes at once")
    ap.add_argument("--load-calls", type=int, default=2, help="calls per load episode")
    ap.add_argument(
        "--load-clients",
        choices=("process", "inproc"),
        default="process",
        help="the load's HTTP clients: in a process of their own, or the agents' own loop",
    )
    ap.add_argument("--load-child", choices=LOAD_SERVERS, help=argparse.SUPPRESS)
    ap.add_argument("--load-client", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    args.argv = list(argv if argv is not None else sys.argv[1:])
    args.bench = Path(__file__).resolve()  # the load case runs it in processes of their own
    load = os.getloadavg()[0]
    if args.load_client:
        return client_main(args)
    if args.load_child:
        result = load_child(args.load_child, args, MODELS[args.model])
        args.out.write_text(json.dumps(result))
        return result
    if args.load:
        if args.out == ap.get_default("out"):
            args.out = ROOT / "benchmarks/results/endpoint_load.json"
        return load_case(args, load)
    import torch

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_policy(load_config(None, MODELS[args.model]).model)
    task = ArithmeticTask(2, 16, 1234)
    rng = random.Random(0)
    tasks = [task.sample(rng) for _ in range(args.episodes)]
    arms = args.arms.split(",")
    assert arms[0] == "inproc", "the ratios are to the first arm: inproc"
    # Warm-up: first calls pay imports (openai) and allocator growth.
    for arm in arms:
        run_arm(arm, model, tok, tasks[:8], min(8, args.concurrent), args.length)
    times: dict[str, list[float]] = {a: [] for a in arms}
    cpu: dict[str, list[float]] = {a: [] for a in arms}
    per_episode: dict[str, list[float]] = {a: [] for a in arms}  # median of each repeat
    outside: dict[str, list[float]] = {a: [] for a in arms}  # the same, less the engine time
    for _ in range(args.repeats):  # the arms take turns: a change of load hits them alike
        for arm in arms:
            c0 = time.process_time()  # this process's CPU: less swayed by others' load
            done, _ = run_arm(arm, model, tok, tasks, args.concurrent, args.length)
            times[arm].append(done[-1])
            cpu[arm].append(time.process_time() - c0)
            sub = tasks[: args.latency_episodes]
            done, engine_s = run_arm(arm, model, tok, sub, 1, args.length)
            per_episode[arm].append(statistics.median(episode_seconds(done)))
            outside[arm].append(statistics.median(outside_engine(done, engine_s)))
    result = {
        arm: {
            "seconds": times[arm],
            "trajectories_per_s": len(tasks) / statistics.median(times[arm]),
            "cpu_seconds": cpu[arm],
            "cpu_ms_per_trajectory": statistics.median(cpu[arm]) / len(tasks) * 1000,
            "sequential_median_s_per_episode": per_episode[arm],
            "sequential_median_s_outside_engine": outside[arm],
        }
        for arm in arms
    }
    ratios, added, added_outside = {}, {}, {}
    for arm in arms[1:]:
        paired = [b / a for a, b in zip(times[arm], times["inproc"], strict=True)]
        ratios[arm] = spread(paired)
        gaps = [
            (a - b) * 1000 for a, b in zip(per_episode[arm], per_episode["inproc"], strict=True)
        ]
        added[arm] = spread(gaps)
        gaps = [(a - b) * 1000 for a, b in zip(outside[arm], outside["inproc"], strict=True)]
        added_outside[arm] = spread(gaps)
        r, d, o = ratios[arm], added[arm], added_outside[arm]
        print(
            f"{args.model} {arm}: throughput ratio {r['median']:.3f} ({r['min']:.3f}-"
            f"{r['max']:.3f}); added latency per call {d['median']:.2f} ms ({d['min']:.2f} to "
            f"{d['max']:.2f}), outside the engine {o['median']:.2f} ms ({o['min']:.2f} to "
            f"{o['max']:.2f})"
        )
    report = {
        "workload": {k: v for k, v in vars(args).items() if k not in ("argv", "bench")}
        | {"out": str(args.out)},
        "model_parameters": sum(p.numel() for p in model.parameters()),
        "arms": result,
        "throughput_ratio_over_inproc": ratios,
        "added_latency_ms_per_call": added,
        "added_latency_ms_per_call_outside_engine": added_outside,
        "machine": machine(load, load_average_at_end=os.getloadavg()[0]),
    }
    write_report(args.out, report)
    return report


if __name__ == "__main__":
    main()
