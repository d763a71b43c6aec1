"""Sandbox cost: start-up overhead per call and calls per second, bwrap vs rlimit fallback vs
a plain `subprocess.run` baseline, measured side by side in one run.

    python benchmarks/bench_sandbox.py [--calls 40] [--seconds 3] [--out PATH]

Two programs: `python -c pass` (what a tool call pays end to end, interpreter start included)
and `true` (the sandbox's own cost, with almost nothing to start). Latency runs interleave the
three variants call by call, so background load (this machine is shared with training runs)
hits all of them alike. Throughput runs each variant for `--seconds` with `--concurrency`
threads (default: the sandbox's own concurrency bound). Reported as ratios to the baseline.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

from saorl.sandbox import run, run_python, sandbox_info

Call = Callable[[], object]


def _variants(program: str) -> dict[str, Call]:
    if program == "python":
        return {
            "baseline": lambda: subprocess.run([sys.executable, "-c", "pass"], check=True),
            "rlimit": lambda: _ok(run_python("pass", backend="rlimit")),
            "bwrap": lambda: _ok(run_python("pass", backend="bwrap")),
        }
    return {
        "baseline": lambda: subprocess.run(["true"], check=True),
        "rlimit": lambda: _ok(run(["true"], backend="rlimit")),
        "bwrap": lambda: _ok(run(["true"], backend="bwrap")),
    }


def _ok(result: object) -> None:
    if getattr(result, "status", None) != "ok":
        raise RuntimeError(f"benchmark call failed: {result}")


def _latencies(variants: dict[str, Call], calls: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in variants}
    for _ in range(calls):
        for name, call in variants.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return times


def _throughput(call: Call, seconds: float, threads: int) -> float:
    """Calls completed per second by `threads` threads calling back to back."""
    stop = time.monotonic() + seconds
    counts = [0] * threads

    def worker(i: int) -> None:
        while time.monotonic() < stop:
            call()
            counts[i] += 1

    start = time.monotonic()
    pool = [threading.Thread(target=worker, args=(i,)) for i in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return sum(counts) / (time.monotonic() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=40, help="latency samples per variant")
    parser.add_argument("--seconds", type=float, default=3.0, help="throughput run per variant")
    parser.add_argument("--concurrency", type=int, default=0, help="0: the sandbox's bound")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/sandbox.json"))
    args = parser.parse_args()

    load = os.getloadavg()[0]  # recorded: this machine is often shared with training runs
    info = sandbox_info()
    if info.backend != "bwrap":
        sys.exit(f"bubblewrap unusable here ({info.bwrap_error}); nothing to compare")
    threads = args.concurrency or info.max_concurrency
    rows = []
    for program in ("python", "true"):
        variants = _variants(program)
        _latencies(variants, 3)  # warm-up: page cache, first-call detection
        times = _latencies(variants, args.calls)
        base = statistics.median(times["baseline"])
        for name, call in variants.items():
            median = statistics.median(times[name])
            rows.append(
                {
                    "program": program,
                    "variant": name,
                    "median_ms": 1e3 * median,
                    "p90_ms": 1e3 * statistics.quantiles(times[name], n=10)[-1],
                    "overhead_ms": 1e3 * (median - base),
                    "latency_ratio": median / base,
                    "calls_per_s_sequential": 1 / median,
                    "calls_per_s_concurrent": _throughput(call, args.seconds, threads),
                }
            )

    print(
        f"sandbox benchmark: {args.calls} calls per variant, {threads} threads for throughput, "
        f"load average at start {load:.2f}"
    )
    header = f"{'program':8} {'variant':9} {'median ms':>10} {'p90 ms':>8} {'overhead ms':>12}"
    header += f" {'x base':>7} {'calls/s seq':>12} {'calls/s conc':>13}"
    print(header)
    for r in rows:
        print(
            f"{r['program']:8} {r['variant']:9} {r['median_ms']:10.1f} {r['p90_ms']:8.1f} "
            f"{r['overhead_ms']:12.1f} {r['latency_ratio']:7.2f} "
            f"{r['calls_per_s_sequential']:12.1f} {r['calls_per_s_concurrent']:13.1f}"
        )
    report = {
        "benchmark": "sandbox",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(load),
        "sandbox": {
            "bwrap_version": info.bwrap_version,
            "cgroups": list(info.cgroup_controllers),
            "max_concurrency": info.max_concurrency,
        },
        "calls": args.calls,
        "throughput_threads": threads,
        "rows": rows,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
