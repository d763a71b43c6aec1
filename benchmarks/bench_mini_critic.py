"""A smaller critic (`critic.name_or_path`, AsyPPO-style mini-critic) against a copy of the policy.

    python benchmarks/bench_mini_critic.py [--steps 50] [--seeds 0,1,2] [--sft-steps 500]
                                           [--mini-hidden 64] [--mini-intermediate 256]
                                           [--mini-layers 2] [--set KEY=VALUE] [--out PATH]

The tool task (`examples/tool_task.toml`: 2-digit multiplication with a calculator tool), SAO
at its defaults, through the real loop (`saorl.api.train`), in two arms that differ only in
the critic:

    same   `critic.name_or_path = "policy"` (the default): a copy of the warmed-up policy's
           backbone with a value head
    mini   `critic.name_or_path = DIR`: the built-in model narrowed to `--mini-hidden` units
           (MLP `--mini-intermediate`, `--mini-layers` layers), same char tokenizer

Both backbones get the same supervised warm-up (`--sft-steps` on the task's demonstrations,
as `saorl train` runs it), done once and saved as Hugging Face directories; the policy of
every run starts from the warmed-up policy (`learner.sft_steps = 0`). A mini-critic is a
smaller model trained on the same data, as a 0.6B model of the policy's family would be, not
random weights: its attention is frozen during RL (`critic.freeze = "attention"`) like the
default critic's. No network, no downloads: both models are built here.

The arms alternate within every seed (order reversed on every other seed), so both see the
same machine load. Per run:
- learner step seconds: the median wall time of `Learner.step` (timed by wrapping it in this
  process) over the steps after the critic's warm-up (`critic.warmup_steps`, no policy
  update), i.e. values, GAE, the K critic updates (beside the policy update when
  `critic.concurrent` resolves on, as "auto" does on a CPU with two free cores) and the
  policy update;
- explained variance: the median of `value/explained_variance` (logged every step, of the
  critic's values on the incoming batch before it trains on it: out of sample) over the
  second half of the run's steps;
- trajectories/s (batch x steps / the loop's `time/wall_s`) and the run's final
  `eval/accuracy`.
Figures per arm: medians over seeds; `x same` columns are against `same`'s medians, `paired`
ones the median over seeds of each run against the `same` run of its seed (next to it in
time: the figure to read on a machine whose load drifts between seeds). Writes
benchmarks/results/mini_critic.json (or `--out`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

CONFIG = Path(__file__).resolve().parents[1] / "examples" / "tool_task.toml"
ARMS = ("same", "mini")


def export_model(config: Path, overrides: list[str], out: Path) -> dict[str, Any]:
    """A built-in model after the supervised warm-up `saorl train` runs, saved to `out`."""
    import torch

    from saorl.config import load_config
    from saorl.envs.factory import build_env
    from saorl.learner.sft import supervised_warmup
    from saorl.models.loading import load_policy, save_pretrained

    cfg = load_config(config, overrides)
    # One thread, as the runs' threads of work use (`run.torch_threads`): on a shared machine
    # more intra-op threads spin against other processes.
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    model, tokenizer = load_policy(cfg.model)
    t0 = time.perf_counter()
    supervised_warmup(model, tokenizer, build_env(cfg.env), cfg, None)
    save_pretrained(model, tokenizer, out)
    return {
        "parameters": sum(p.numel() for p in model.parameters()),
        "sft_steps": cfg.learner.sft_steps,
        "seconds": time.perf_counter() - t0,
    }


@contextlib.contextmanager
def timed_learner_steps() -> Iterator[list[float]]:
    """Wall seconds of every `Learner.step` in this process while inside (wrapped, restored)."""
    from saorl.learner.learner import Learner

    times: list[float] = []
    step = Learner.step

    def timed(self: Any, batch: Any) -> dict[str, Any]:
        t0 = time.perf_counter()
        try:
            return step(self, batch)
        finally:
            times.append(time.perf_counter() - t0)

    Learner.step = timed  # type: ignore[method-assign]
    try:
        yield times
    finally:
        Learner.step = step  # type: ignore[method-assign]


def run_arm(overrides: list[str]) -> dict[str, Any]:
    """One training run; its learner step time, explained variance and throughput."""
    from saorl.api import make_config, train
    from saorl.monitoring.metrics import read_metrics

    cfg = make_config(CONFIG, overrides)
    with timed_learner_steps() as times:
        summary = train(cfg)
    rows = [r for r in read_metrics(Path(summary["run_dir"]) / "metrics.jsonl") if "step" in r]
    steps = [r for r in rows if r["step"] >= 1 and "value/explained_variance" in r]
    late = [r["value/explained_variance"] for r in steps if r["step"] > len(steps) // 2]
    after_warmup = times[cfg.critic.warmup_steps :] or times
    return {
        "steps": len(steps),
        "learner_step_s": statistics.median(after_warmup),
        "learner_step_s_all": [round(t, 4) for t in times],
        "explained_variance": statistics.median(late),
        "explained_variance_per_step": [round(r["value/explained_variance"], 4) for r in steps],
        "trajectories_per_s": cfg.learner.batch_size * len(steps) / steps[-1]["time/wall_s"],
        "final_accuracy": rows[-1].get("eval/accuracy"),
        "critic_concurrent": summary.get("critic_concurrent"),
    }


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per arm: medians over seeds, and the ratios against `same`: of the medians, and
    `paired_*`, the median over seeds of the ratio (difference for explained variance) to the
    `same` run of that seed, which ran next to it (less moved by load that drifts over seeds)."""
    keys = ("learner_step_s", "explained_variance", "trajectories_per_s", "final_accuracy")
    out = {arm: {k: statistics.median(r[k] for r in rs) for k in keys} for arm, rs in runs.items()}
    base = out.get("same")
    same = {r["seed"]: r for r in runs.get("same", [])}
    for arm, s in out.items():
        if base:
            s["step_ratio"] = s["learner_step_s"] / base["learner_step_s"]
            s["throughput_ratio"] = s["trajectories_per_s"] / base["trajectories_per_s"]
            pairs = [(r, same[r["seed"]]) for r in runs[arm]]
            s["paired_step_ratio"] = statistics.median(
                r["learner_step_s"] / b["learner_step_s"] for r, b in pairs
            )
            s["paired_explained_variance_diff"] = statistics.median(
                r["explained_variance"] - b["explained_variance"] for r, b in pairs
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=50, help="RL steps per run")
    p.add_argument("--seeds", default="0,1,2", help="comma-separated run.seed values")
    p.add_argument("--sft-steps", type=int, default=500, help="supervised warm-up steps")
    p.add_argument("--mini-hidden", type=int, default=64, help="mini-critic width")
    p.add_argument("--mini-intermediate", type=int, default=256, help="mini-critic MLP units")
    p.add_argument("--mini-layers", type=int, default=2, help="mini-critic layers")
    p.add_argument("--set", action="append", default=[], help="extra override (every model, run)")
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results/mini_critic.json")
    args = p.parse_args()
    load = os.getloadavg()[0]
    seeds = [int(s) for s in args.seeds.split(",")]
    shared = [*args.set, "run.progress=false"]
    mini_shape = [
        f"model.hidden_size={args.mini_hidden}",
        f"model.intermediate_size={args.mini_intermediate}",
        f"model.num_layers={args.mini_layers}",
    ]
    runs: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    order: list[str] = []  # the runs as they ran, "arm-seed"
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        warm = [*shared, f"learner.sft_steps={args.sft_steps}"]
        models = {
            "same": export_model(CONFIG, warm, Path(tmp) / "policy"),
            # The mini-critic's shape overrides the policy's; --set may size both.
            "mini": export_model(CONFIG, [*warm, *mini_shape], Path(tmp) / "mini"),
        }
        critic = {"same": "policy", "mini": str(Path(tmp) / "mini")}
        print(
            "warm-up: "
            + ", ".join(
                f"{a} {m['parameters']:,} parameters {m['seconds']:.0f} s"
                for a, m in models.items()
            ),
            flush=True,
        )
        for i, seed in enumerate(seeds):
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                overrides = [
                    *shared,
                    f"model.name_or_path={Path(tmp) / 'policy'}",
                    "learner.sft_steps=0",
                    f"critic.name_or_path={critic[arm]}",
                    f"run.total_steps={args.steps}",
                    "run.eval_every=0",
                    "run.checkpoint_every=0",
                    "run.save_hf=false",
                    f"run.seed={seed}",
                    f"run.output_dir={Path(tmp) / 'runs'}",
                    f"run.name={arm}-{seed}",
                ]
                load_now = os.getloadavg()[0]
                r = {"seed": seed, "load_average_at_start": load_now, **run_arm(overrides)}
                runs[arm].append(r)
                order.append(f"{arm}-{seed}")
                print(
                    f"  seed {seed} {arm}: learner step {r['learner_step_s']:.3f} s, explained "
                    f"variance {r['explained_variance']:.3f}, "
                    f"{r['trajectories_per_s']:.0f} trajectories/s (load {load_now:.1f})",
                    flush=True,
                )
    summary = summarize(runs)
    print(
        f"\nmini-critic vs same-size critic, tool task, {args.steps} steps, seeds {seeds}; "
        f"load average at start {load:.2f}"
    )
    print(
        f"{'arm':6} {'params':>9} {'step s':>8} {'x same':>7} {'paired':>7} {'expl var':>9} "
        f"{'paired d':>9} {'traj/s':>7} {'x same':>7} {'final acc':>10}"
    )
    for arm, s in summary.items():
        print(
            f"{arm:6} {models[arm]['parameters']:9,} {s['learner_step_s']:8.3f} "
            f"{s['step_ratio']:7.2f} {s['paired_step_ratio']:7.2f} "
            f"{s['explained_variance']:9.3f} {s['paired_explained_variance_diff']:+9.3f} "
            f"{s['trajectories_per_s']:7.0f} {s['throughput_ratio']:7.2f} "
            f"{s['final_accuracy']:10.3f}"
        )
    report = {
        "benchmark": "mini_critic",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(load),
        "command_s": time.perf_counter() - t_start,
        "workload": {
            "config": CONFIG.name,
            "steps": args.steps,
            "seeds": seeds,
            "sft_steps": args.sft_steps,
            "mini_shape": mini_shape,
            "set": args.set,
        },
        "models": models,
        "order": order,
        "runs": runs,
        "summary": summary,
    }
    write_report(args.out, report)


if __name__ == "__main__":
    main()
