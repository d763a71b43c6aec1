"""bench_endpoint.py's load case (`--load N`): N agent episodes at once, every call over HTTP,
against the endpoint's uvicorn server (`asgi`) and the standard library's threaded server it
replaced (`threaded`: `saorl/rollout/agents/server.py` as of `THREADED_SERVER`, read from git
when the benchmark runs), side by side in one run.

Each server runs in a process of its own (`--repeats` times, the order alternating) that holds
what a training process holds for agent programs: the rollout worker, its engine (the tiny
built-in model, every turn forced to `--length` tokens), the endpoint. The agents' HTTP clients
(`--load-clients process`, the default) run in another process, as command agents' do: one
asyncio loop with one `openai` connection pool as large as the load, so every call in flight
has a connection of its own; each episode's program in the worker only hands its URL and key
to that process and awaits the result. `--load-clients inproc`: the programs make their calls
themselves, on the worker's agent loop (a Python agent building its own client), so the
clients' work shares the server's process and its GIL.

A server's process reports its peak thread count (sampled at every engine step), its peak RSS
(and its RSS before the load), the failed calls, and each call's added latency: the time the
client waited for its reply less the time its request spent in the engine (queued, prefilled,
decoded), p50 and p99: what HTTP, the server and the handover to the worker cost.
"""

from __future__ import annotations

import asyncio
import functools
import importlib.util
import json
import os
import queue
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from benchmarks._common import machine, write_report
from saorl.config import EnvConfig, load_config
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings
from saorl.envs.agent import AgentProgram
from saorl.envs.arithmetic import ArithmeticTask
from saorl.models.loading import load_policy
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker

ROOT = Path(__file__).resolve().parents[1]
# The last commit whose endpoint served HTTP with the standard library's ThreadingHTTPServer.
THREADED_SERVER = "cad439f83a392ce6efb0aa41aebbc33bbd68121c"
LOAD_SERVERS = ("threaded", "asgi")


def threaded_available() -> bool:
    """Whether this checkout has `THREADED_SERVER` (a shallow clone may not)."""
    probe = ["git", "-C", str(ROOT), "cat-file", "-e", f"{THREADED_SERVER}^{{commit}}"]
    return subprocess.run(probe, capture_output=True).returncode == 0


@functools.cache
def threaded_endpoint() -> type:
    """The `TrainingEndpoint` of `THREADED_SERVER`, loaded from git into this process."""
    source = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{THREADED_SERVER}:src/saorl/rollout/agents/server.py"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    path = Path(tempfile.mkdtemp()) / "threaded_server.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("threaded_server", path)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    sys.modules["threaded_server"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module.TrainingEndpoint


class LoadEngine(HFEngine):
    """The HF engine, writing each request's time in it onto its future (before the worker
    resolves it, so before the reply goes out) and sampling the process's thread count."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.added: dict[int, float] = {}
        self.peak_threads = threading.active_count()

    def add_request(self, request) -> None:
        self.added[request.request_id] = time.perf_counter()
        super().add_request(request)

    def step(self):
        self.peak_threads = max(self.peak_threads, threading.active_count())
        done = super().step()
        now = time.perf_counter()
        for c in done:
            c.request.payload.engine_s = now - self.added.pop(c.request.request_id)
        return done


def pool(size: int) -> Any:
    """An `openai` connection pool with room for `size` connections, all kept alive."""
    import httpx2
    import openai

    limits = httpx2.Limits(max_connections=size, max_keepalive_connections=size)
    return openai.DefaultAsyncHttpxClient(limits=limits)


async def http_episode(http: Any, job: dict) -> dict:
    """One episode's calls over HTTP: `{"calls": [[tag, seconds waited], ...], "failed": kind
    or None}`. Each call is tagged (`X-Bench-Call`) so the server's side finds its engine time."""
    import openai

    client = openai.AsyncOpenAI(
        base_url=job["base_url"], api_key=job["key"], max_retries=0, http_client=http
    )
    messages = [{"role": "user", "content": job["prompt"]}]
    calls = []
    for i in range(job["calls"]):
        tag = f"{job['key']}-{i}"
        t0 = time.perf_counter()
        try:
            reply = await client.chat.completions.create(
                model="policy", messages=messages, extra_headers={"X-Bench-Call": tag}
            )
        except Exception as e:
            return {"calls": calls, "failed": type(e).__name__}
        calls.append([tag, time.perf_counter() - t0])
        messages += [reply.choices[0].message.model_dump(exclude_none=True)]
        messages += [{"role": "user", "content": "Sure?"}]
    return {"calls": calls, "failed": None}


def client_main(args) -> None:
    """The clients' process: episodes in as JSON lines on stdin, their results out on stdout."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader()
        await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
        http, tasks = pool(args.load + 100), set()

        async def episode(job: dict) -> None:
            result = await http_episode(http, job)
            sys.stdout.write(json.dumps({"id": job["id"], **result}) + "\n")
            sys.stdout.flush()

        while line := await reader.readline():
            task = asyncio.create_task(episode(json.loads(line)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await asyncio.gather(*tasks)

    asyncio.run(main())


class Clients:
    """The clients' process, seen from the server's: `run(job)` awaits an episode's result."""

    def __init__(self, argv: list[str], bench: Path) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(bench), *argv, "--load-client"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        self.pending: dict[str, tuple[asyncio.AbstractEventLoop, asyncio.Future]] = {}
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            result = json.loads(line)
            loop, future = self.pending.pop(result["id"])
            loop.call_soon_threadsafe(future.set_result, result)

    async def run(self, job: dict) -> dict:
        future = asyncio.get_running_loop().create_future()
        self.pending[job["id"]] = (asyncio.get_running_loop(), future)
        with self.lock:
            self.proc.stdin.write(json.dumps(job) + "\n")  # type: ignore[union-attr]
        return await future

    def close(self) -> None:
        self.proc.stdin.close()  # type: ignore[union-attr]
        self.proc.wait(timeout=60)


def _rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _pct(values: list[float], q: float) -> float | None:
    return values[min(len(values) - 1, int(q * len(values)))] if values else None


def load_child(server: str, args, overrides: list[str]) -> dict:
    """One server under `--load` episodes, in this process (see the module docstring)."""
    import torch

    from saorl.rollout.agents import runs

    endpoint = threaded_endpoint() if server == "threaded" else runs.TrainingEndpoint
    futures: dict[str, Any] = {}  # a call's tag -> its engine future
    begin = endpoint.begin

    def tagged(self, method, path, headers, raw):
        call = begin(self, method, path, headers, raw)
        if headers.get("X-Bench-Call") and hasattr(call, "future"):
            futures[headers.get("X-Bench-Call")] = call.future
        return call

    endpoint.begin = tagged
    runs.TrainingEndpoint = endpoint
    clients = Clients(args.argv, args.bench) if args.load_clients == "process" else None
    pools: dict = {}
    calls: list[tuple[float, float]] = []  # (the client's wait, the engine's time), seconds
    failed: list[str] = []

    async def load_agent(task, client):
        job = {"id": client.api_key, "base_url": str(client.base_url), "key": client.api_key}
        job |= {"prompt": task["prompt"], "calls": args.load_calls}
        if clients is not None:
            result = await clients.run(job)
        else:
            loop = asyncio.get_running_loop()
            if loop not in pools:
                pools[loop] = pool(args.load + 100)
            result = await http_episode(pools[loop], job)
        calls.extend((wait, futures.pop(tag).engine_s) for tag, wait in result["calls"])
        if result["failed"]:
            failed.append(result["failed"])
        return 0.0 if result["failed"] else 1.0

    torch.set_num_threads(1)
    torch.manual_seed(0)
    model, tok = load_policy(load_config(None, overrides).model)
    task = ArithmeticTask(2, 16, 1234)
    rng = random.Random(0)
    peak_threads = [0]

    def run(n: int) -> float:
        tasks = [task.sample(rng) for _ in range(n)]
        engine = LoadEngine(model, tok, EngineSettings(max_seq_len=128, max_concurrent=n, seed=0))
        limits = AgentLimits(
            max_seq_len=128, max_new_tokens=args.length, forced_length=lambda: args.length
        )
        cfg = EnvConfig()
        make_env = lambda: AgentProgram(cfg, load_agent, None, None)  # noqa: E731
        out: queue.Queue = queue.Queue()
        worker = RolloutWorker(engine, FixedFeed(tasks), tok, out, make_env, limits)
        t0 = time.perf_counter()
        worker.start()
        for _ in tasks:
            out.get(timeout=1800)
        seconds = time.perf_counter() - t0
        worker.stop_thread()
        peak_threads[0] = engine.peak_threads
        return seconds

    run(8)  # warm-up: imports, the pool, allocator growth
    calls.clear(), failed.clear()
    rss_before, threads_before = _rss_mb(), threading.active_count()
    c0 = time.process_time()
    seconds = run(args.load)
    cpu = time.process_time() - c0
    if clients is not None:
        clients.close()
    added = sorted((wait - engine_s) * 1000 for wait, engine_s in calls)
    waits = sorted(wait * 1000 for wait, _ in calls)
    return {
        "server": server,
        "clients": args.load_clients,
        "episodes": args.load,
        "calls_answered": len(calls),
        "failed_calls": len(failed),
        "failures": {k: failed.count(k) for k in set(failed)},
        "seconds": seconds,
        "calls_per_s": len(calls) / seconds,
        "server_process_cpu_ms_per_call": cpu / max(1, len(calls)) * 1000,
        "threads_before": threads_before,
        "peak_threads": peak_threads[0],
        "rss_before_mb": rss_before,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "added_latency_ms": {"p50": _pct(added, 0.5), "p99": _pct(added, 0.99)},
        "call_latency_ms": {"p50": _pct(waits, 0.5), "p99": _pct(waits, 0.99)},
    }


def load_case(args, load: float) -> dict:
    """Each server in a process of its own, `--repeats` times, the order alternating."""
    runs: dict[str, list[dict]] = {s: [] for s in LOAD_SERVERS}
    for r in range(args.repeats):
        for server in LOAD_SERVERS if r % 2 == 0 else LOAD_SERVERS[::-1]:
            with tempfile.TemporaryDirectory() as tmp:
                out = Path(tmp) / "child.json"
                argv = [*args.argv, "--load-child", server, "--out", str(out)]
                subprocess.run([sys.executable, str(args.bench), *argv], check=True)
                runs[server].append(json.loads(out.read_text()))
            print(json.dumps(runs[server][-1]))
    keys = ("peak_threads", "peak_rss_mb", "failed_calls", "calls_per_s")
    summary = {
        server: {k: statistics.median(r[k] for r in results) for k in keys}
        | {
            f"added_latency_ms_{q}": statistics.median(r["added_latency_ms"][q] for r in results)
            for q in ("p50", "p99")
        }
        for server, results in runs.items()
    }
    workload = {k: v for k, v in vars(args).items() if k not in ("argv", "bench")}
    report = {
        "workload": workload | {"out": str(args.out)},
        "threaded_server_commit": THREADED_SERVER,
        "median_over_repeats": summary,
        "runs": runs,
        "machine": machine(load, load_average_at_end=os.getloadavg()[0]),
    }
    write_report(args.out, report)
    return report
