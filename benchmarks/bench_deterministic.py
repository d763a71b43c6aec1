"""The cost of `run.deterministic = true` against the asynchronous default, side by side.

    .venv/bin/python benchmarks/bench_deterministic.py            # ~5 min on 2 quiet cores

Three modes of one config (the built-in addition task, SAO, a short warm-up), each through the
real loop (`saorl.loop.train_from_config`), in alternating rounds so that a change in the
machine's load falls on every mode alike:

- `threads`: the default, rollout worker and learner concurrent;
- `sync`: generate a batch, then train (the schedule `deterministic` uses), torch as usual;
- `deterministic`: `run.deterministic = true` (sync, seeded sampling, deterministic torch).

Per run: the RL wall time (`summary.json`'s `wall_seconds`: evaluations included, the same in
every mode), the CPU seconds of the whole run (every thread; warm-up included, the same work in
every mode: on a shared machine the wall time follows the load, the CPU time much less),
trajectories per second, the staleness trained on and the final held-out accuracy. `sync`
against `threads` is the price of giving up asynchrony; `deterministic` against `sync` the
price of deterministic kernels and seeded sampling. Writes `results/deterministic.json`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _common import machine, write_report

MODES: dict[str, list[str]] = {
    "threads": [],
    "sync": ["run.concurrency=sync"],
    "deterministic": ["run.deterministic=true"],
}


def run_mode(mode: str, shared: list[str], out: Path) -> dict[str, Any]:
    from saorl.config import load_config
    from saorl.loop import train_from_config
    from saorl.monitoring.metrics import read_metrics

    cfg = load_config(None, [*shared, *MODES[mode], f"run.output_dir={str(out)!r}"])
    load = os.getloadavg()[0]
    cpu = time.process_time()
    summary = train_from_config(cfg)
    cpu = time.process_time() - cpu
    rows = read_metrics(Path(summary["run_dir"]) / "metrics.jsonl")
    stale = [r["async/staleness_mean"] for r in rows if r.get("async/staleness_mean") is not None]
    wall = summary["wall_seconds"]
    return {
        "mode": mode,
        "rl_seconds": wall,
        "cpu_seconds": cpu,
        "trajectories_per_s": summary["steps"] * cfg.learner.batch_size / wall,
        "staleness_mean": statistics.fmean(stale) if stale else None,
        "final_eval_accuracy": summary["final_eval_accuracy"],
        "load_average_at_start": load,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--sft-steps", type=int, default=20)  # speed only: the model need not learn
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    args = p.parse_args()

    shared = [
        f"run.total_steps={args.steps}",
        f"learner.sft_steps={args.sft_steps}",
        f"run.eval_every={args.steps}",
        "env.eval_size=64",  # the final evaluation is inside the RL wall time: keep it small
        "run.eval_samples=1",
        "run.progress=false",
        "run.trackers=[]",
        "run.log_samples_every=0",
        "run.checkpoint_every=0",
    ]
    load = os.getloadavg()[0]
    runs: list[dict[str, Any]] = []
    order = list(MODES)
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            for mode in order if r % 2 == 0 else order[::-1]:
                res = run_mode(mode, [*shared, f"run.name={mode}-{r}"], Path(tmp))
                runs.append(res)
                print(f"round {r}: {res}", flush=True)
    median = {m: statistics.median(x["rl_seconds"] for x in runs if x["mode"] == m) for m in MODES}
    cpu = {m: statistics.median(x["cpu_seconds"] for x in runs if x["mode"] == m) for m in MODES}
    ratios: dict[str, float] = {}
    for what, values in (("rl_seconds", median), ("cpu_seconds", cpu)):
        for a, b in (("deterministic", "threads"), ("sync", "threads"), ("deterministic", "sync")):
            ratios[f"{a}_over_{b}_{what}"] = values[a] / values[b]
    for name, value in ratios.items():
        print(f"{name}: {value:.2f}x (medians over {args.rounds} rounds)")
    write_report(
        args.out / "deterministic.json",
        {
            "machine": machine(load),
            "settings": {"shared_overrides": shared, "rounds": args.rounds},
            "median_rl_seconds": median,
            "median_cpu_seconds": cpu,
            "ratios": ratios,
            "runs": runs,
        },
    )


if __name__ == "__main__":
    main()
