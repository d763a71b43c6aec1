"""saorl against TRL's `GRPOTrainer`: the same model, task, reward and CPU, one after another.

    pip install -e '.[bench]'             # TRL 1.16.0, for this benchmark only
    python benchmarks/bench_trl.py [--steps 1000] [--eval-every 50] [--budget-s 60]
                                   [--target 0.32] [--seeds 0] [--quick]

Trainers (`--trainers`), run one after another in this process for every seed:

    trl_grpo  TRL `GRPOTrainer` with the settings of saorl's `grpo` preset (below)
    sao       `saorl train` (algorithm.name = sao: single rollouts, critic, DIS; asynchronous;
              critic.concurrent at its default, "auto")
    sao_concurrent  the same with `critic.concurrent = true`: the critic's updates on a thread
              of their own beside the policy update (on 2 cores they share the rollout
              thread's core while it waits for the learner)
    grpo      `saorl train algorithm.name=grpo` (groups of 8, PPO clip-higher over 4
              mini-batches; asynchronous)
    grpo_dis  `saorl train algorithm.name=grpo_dis` (groups of 8, DIS; asynchronous)

Learning rates: `sao` and `grpo_dis` train at `learner.lr` (1e-4, the default); the two
PPO-clip GRPO arms (`trl_grpo`, `grpo`) at `--grpo-lr` (3e-5). At 1e-4 TRL's GRPO unlearns
this task (greedy held-out accuracy 0.70 -> 0.36 within 25 steps, sampled 0.257 -> 0.20 after
200 steps; saorl's `grpo` at 1e-4 ends below its start in `saorl compare`, README); at 3e-5
and 1e-5 (600 steps each) it learns, 3e-5 faster (batch reward 0.24 -> 0.33 vs 0.27 -> 0.31).

Same model: saorl's supervised warm-up of the built-in model (`learner.sft_steps` steps on the
addition task, as `saorl train` starts) runs once and is saved as a Hugging Face directory
(weights, the char tokenizer; it has no chat template, so prompts are raw text for both);
every trainer starts from it (`model.name_or_path=<dir> learner.sft_steps=0` for saorl).
`--model DIR` reuses such a directory. Same task and reward: saorl's `arithmetic` env; for TRL
a `datasets.Dataset` of training problems whose `prompt` column is the exact text saorl feeds
(`"37+58="`) and a reward function calling the env's grader (`ArithmeticTask.reward`). Same
sampling: temperature and top-p of `[rollout]`, at most `--max-new-tokens` (16) new tokens,
64 trajectories per step (a step = one batch: TRL samples 8 prompts x `num_generations` 8).

TRL settings, from the resolved `grpo` config: `num_generations` = group_size;
`steps_per_generation` = algorithm.minibatches optimizer steps of `per_device_train_batch_size`
= batch_size / minibatches rows per batch (saorl's mini-batches), old log-probs recomputed at
the start of a batch (both); `epsilon`/`epsilon_high` = clip_eps_low/high; `loss_type="bnpo"`
= token mean over the rows of one optimizer step (saorl's `loss_agg = token_mean` over a
mini-batch; TRL's default "dapo" divides by the batch's mean token count per mini-batch
instead); `scale_rewards="group"`; `beta` = kl_coef (0); learning rate, warm-up
(`constant_with_warmup`: HF's ramp starts at 0, saorl's at lr / warmup), grad clip and weight
decay of `[learner]`; AdamW with torch's defaults in both; float32, `use_vllm=False` (TRL
generates with `model.generate`, padded batches), no gradient checkpointing, no evaluation or
saving, `report_to="none"`. Differences by necessity: TRL is synchronous (generate a batch,
then train), saorl asynchronous; TRL's group std is unbiased with eps 1e-4, saorl's the
population std with eps 1e-6. Threads: saorl runs its default of one torch thread per thread
of work (the learner and the rollout thread); TRL gets `--trl-threads` (default 1). Its own
default (torch's: every core) made TRL 14x slower on the shared 2-core machine this was
written on (8.0 vs 0.6 s per batch at load average 7-9, intra-op threads spinning against
other processes); on a quiet machine compare `--trl-threads 2`.

Held-out accuracy: no trainer evaluates while it trains. Every `--eval-every` steps the policy
is snapshotted (saorl: its checkpoint, `run.checkpoint_every`; TRL: a `TrainerCallback` copies
the weights into memory), and after the run every snapshot is evaluated with
`saorl.evaluation.held_out.evaluate_policy` (what `saorl train` logs as `eval/accuracy`: avg@k
over `run.eval_samples` samples at the rollout temperature on the env's held-out problems, and
greedy accuracy), with the same seed for all, so equal weights give equal figures. (Evaluating
inside a saorl run would let its rollout thread keep generating while the learner evaluates,
which an evaluation-free run does not get.)

Time counted (training seconds, the x axis): wall time from the start of the RL steps, without
snapshot time.
- saorl: `time/wall_s` of metrics.jsonl (from the first RL step's start: rollouts, learner
  steps, weight pushes, logging), minus, for every snapshot step c, the time from the end of
  step c's metrics to the start of step c+1 (`time/wall_s[c+1] - perf/step_s[c+1] -
  time/wall_s[c]`: the checkpoint write). The critic warm-up steps of `sao` count.
- TRL: `time.perf_counter()` from `on_train_begin` (model and optimizer built) at the end of
  each batch's last optimizer step (`on_step_end`), minus the time spent copying snapshots.
Not counted for either: the shared warm-up, model loading, evaluation.

Figures per trainer and seed: trajectories/s = 64 x steps / training seconds of the whole run;
time to target = training seconds at the first snapshot whose `eval/accuracy` >= `--target`
(or the start's accuracy + `--target-gain`: the seeded warm-up ends elsewhere on other CPU
models, 0.137 on one machine and 0.305 on another, so a fixed target can lie at the start;
resolution: `--eval-every` steps; none if never); sustained: the first snapshot from which
every later one reaches it (one lucky evaluation does not count); accuracy at budget =
`eval/accuracy` of the last snapshot at or before `--budget-s` training seconds (flagged when a
run ran out of steps before the budget); with several seeds, medians. Every trainer runs
`--steps` steps, so a slower one gets more seconds; the step count is chosen so that every run
spans the budget.
Writes `benchmarks/results/trl.json` and a plot of held-out accuracy against training seconds
(`trl.png`). `--from-json PATH [PATH ...]` trains nothing and redoes the figures of saved reports
for another `--target`/`--budget-s`; several reports of the same warm-up merge (each trainer's
runs from the last report that has it), e.g. a longer run of one trainer added later.
`--trl-steps` gives TRL more steps than the others, to time its own reach of the target.
`--quick` is a smoke run of every code path (40 steps from a 100-step warm-up): too short to
show learning, which takes hundreds of steps here.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from _common import machine, write_report  # benchmarks/_common.py (run as scripts)

TRAINERS = ("trl_grpo", "sao", "sao_concurrent", "grpo", "grpo_dis")
BATCH = 64
# torch threads of the untimed parts (warm-up, evaluation): every core, or `--setup-threads`
# (1 on a loaded machine, where intra-op threads spin against other processes).
SETUP_THREADS = os.cpu_count() or 1
INSTALL_HINT = (
    "bench_trl.py needs TRL: pip install -e '.[bench]' in the checkout (or pip install trl==1.16.0)"
)


# -- time accounting and the figures read off a curve (pure; unit-tested) ----------------------
class TrainClock:
    """Seconds since `start()`, without the intervals spent inside `excluded()`."""

    def __init__(self, clock: Callable[[], float] = time.perf_counter) -> None:
        self._clock = clock
        self._t0: float | None = None
        self._excluded = 0.0

    def start(self) -> None:
        self._t0, self._excluded = self._clock(), 0.0

    @contextlib.contextmanager
    def excluded(self) -> Iterator[None]:
        t = self._clock()
        try:
            yield
        finally:
            self._excluded += self._clock() - t

    def elapsed(self) -> float:
        if self._t0 is None:
            raise RuntimeError("TrainClock.elapsed() before start()")
        return self._clock() - self._t0 - self._excluded


def saorl_train_seconds(
    rows: Sequence[dict[str, Any]], snapshot_steps: set[int]
) -> dict[int, float]:
    """Training seconds at the end of every step of a saorl run's metrics.jsonl rows.

    `time/wall_s` minus, for every snapshot step c before it, the gap between the end of step
    c's metrics and the start of step c+1 (`time/wall_s[c+1] - perf/step_s[c+1]`).
    """
    timed = {r["step"]: r for r in rows if r.get("step", 0) >= 1 and "time/wall_s" in r}
    out: dict[int, float] = {}
    excluded = 0.0
    for step in sorted(timed):
        row = timed[step]
        prev = timed.get(step - 1)
        if prev is not None and step - 1 in snapshot_steps:
            started = row["time/wall_s"] - row["perf/step_s"]
            excluded += max(started - prev["time/wall_s"], 0.0)
        out[step] = row["time/wall_s"] - excluded
    return out


def resolve_target(target: float, gain: float | None, initial: dict[str, float]) -> float:
    """`--target`, or with `--target-gain` the start's held-out accuracy plus the gain."""
    return target if gain is None else round(initial["accuracy"] + gain, 4)


def time_to_target(curve: Sequence[dict[str, Any]], target: float) -> float | None:
    """Training seconds of the first point whose accuracy reaches `target`; None if none."""
    for point in sorted(curve, key=lambda p: p["train_s"]):
        if point["accuracy"] >= target:
            return point["train_s"]
    return None


def time_to_sustained_target(curve: Sequence[dict[str, Any]], target: float) -> float | None:
    """Training seconds of the first point from which every later point reaches `target`.

    Less sensitive than `time_to_target` to one lucky evaluation; None if the last misses.
    """
    found = None
    for point in sorted(curve, key=lambda p: p["train_s"], reverse=True):
        if point["accuracy"] < target:
            break
        found = point["train_s"]
    return found


def accuracy_at_budget(curve: Sequence[dict[str, Any]], budget_s: float) -> float | None:
    """Accuracy of the last point at or before `budget_s` training seconds; None if none."""
    inside = [p for p in curve if p["train_s"] <= budget_s]
    return max(inside, key=lambda p: p["train_s"])["accuracy"] if inside else None


def median_or_none(values: Sequence[float | None]) -> float | None:
    """Median over seeds; None when any seed has none (the target was not reached)."""
    if not values or any(v is None for v in values):
        return None
    return statistics.median(values)  # type: ignore[type-var]


# -- the shared starting model and its evaluation ----------------------------------------------
def export_warm_model(overrides: list[str], out: Path) -> dict[str, Any]:
    """The built-in model after saorl's supervised warm-up, saved as a Hugging Face directory.

    Built as `saorl train` builds it (the seed set just before the policy is created), so the
    weights equal the policy a default run starts RL from.
    """
    import torch

    from saorl.config import load_config
    from saorl.envs.factory import build_env
    from saorl.learner.sft import supervised_warmup
    from saorl.models.loading import load_policy, save_pretrained

    cfg = load_config(None, overrides)
    torch.set_num_threads(SETUP_THREADS)  # not timed: the warm-up is shared
    torch.manual_seed(cfg.run.seed)
    policy, tokenizer = load_policy(cfg.model)
    t0 = time.perf_counter()
    supervised_warmup(policy, tokenizer, build_env(cfg.env), cfg, None)
    save_pretrained(policy, tokenizer, out)
    return {"sft_steps": cfg.learner.sft_steps, "seconds": time.perf_counter() - t0}


class Evaluator:
    """`saorl.evaluation.held_out.evaluate_policy` of policy weights, on one model object."""

    def __init__(self, cfg: Any) -> None:
        from saorl.envs.factory import build_env
        from saorl.models.loading import load_policy

        self.cfg = cfg
        self.model, self.tokenizer = load_policy(cfg.model)
        self.spec = build_env(cfg.env, held_out_only=True)

    def __call__(self, state: dict[str, Any] | None) -> dict[str, float]:
        import torch

        from saorl.evaluation.held_out import evaluate_policy

        if state is not None:
            self.model.load_state_dict(state)
        torch.set_num_threads(SETUP_THREADS)  # not timed
        # The seed the learner evaluates with (`Learner.evaluate`).
        ev = evaluate_policy(
            self.model, self.tokenizer, self.spec, self.cfg, seed=self.cfg.run.seed + 12345
        )
        return {"accuracy": ev["eval/accuracy"], "accuracy_greedy": ev["eval/accuracy_greedy"]}


# -- saorl ------------------------------------------------------------------------------------
def saorl_overrides(
    args: argparse.Namespace, model_dir: Path, out_dir: Path, seed: int
) -> list[str]:
    return [
        f"model.name_or_path={model_dir}",
        "learner.sft_steps=0",
        f"learner.batch_size={BATCH}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
        f"env.eval_size={args.eval_size}",
        f"run.eval_samples={args.eval_samples}",
        f"run.total_steps={args.steps}",
        "run.eval_every=0",  # only the final evaluation, after the last step's time
        f"run.checkpoint_every={args.eval_every}",  # the snapshots
        "run.keep_last_checkpoints=0",
        "run.save_hf=false",
        "run.progress=false",
        f"run.seed={seed}",
        f"run.output_dir={out_dir}",
        *args.set,
    ]


def arm_overrides(name: str, args: argparse.Namespace) -> list[str]:
    """What sets trainer `name` apart: its preset, and for the PPO-clip GRPO arms `--grpo-lr`."""
    if name == "sao_concurrent":
        return ["algorithm.name=sao", "critic.concurrent=true"]
    grpo = "grpo" if name == "trl_grpo" else name
    lr = [f"learner.lr={args.grpo_lr}"] if grpo == "grpo" and args.grpo_lr else []
    return [f"algorithm.name={grpo}", *lr]


def run_saorl(name: str, base: list[str], evaluate: Evaluator) -> dict[str, Any]:
    import shutil

    from saorl.api import make_config, train
    from saorl.checkpoint.io import list_checkpoints, load_state_file
    from saorl.monitoring.metrics import read_metrics

    cfg = make_config(None, [*base, f"run.name={name}"])
    t0 = time.perf_counter()
    summary = train(cfg)
    run_s = time.perf_counter() - t0
    run_dir = Path(summary["run_dir"])
    rows = read_metrics(run_dir / "metrics.jsonl")
    ckpts = {int(p.stem.split("_")[1]): p for p in list_checkpoints(run_dir)}
    seconds = saorl_train_seconds(rows, set(ckpts))
    curve = []
    for step, path in sorted(ckpts.items()):
        if step == 0:
            continue  # the shared starting point, evaluated once
        ev = evaluate(load_state_file(path)["policy"])
        curve.append({"step": step, "train_s": seconds[step], **ev})
    final_logged = rows[-1].get("eval/accuracy")  # the run's own final evaluation
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)
    steps = max(seconds)
    return {
        "curve": curve,
        # Mean reward of each step's batch, steps 1, 2, ... (the learning signal, per step).
        "reward_per_step": [
            round(r["rollout/reward_mean"], 4) for r in rows if "rollout/reward_mean" in r
        ],
        "train_s": seconds[steps],
        "trajectories_per_s": BATCH * steps / seconds[steps],
        "run_s": run_s,
        "final_eval_logged_by_run": final_logged,
        "learner_idle_frac": summary.get("learner_idle_frac"),
        "config": resolved_config(cfg),
    }


def learner_gflops(arm: list[str]) -> float:
    """Floating-point operations (GFLOP, torch's FlopCounterMode) of one learner step of
    config `arm` on one fixed batch of 64 rows (prompts of 6 tokens, completions of 3-16): the
    work each algorithm asks of the learner per batch, independent of the machine's speed."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from saorl.api import make_config
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy
    from saorl.types import Batch, Trajectory

    # Counted on this thread only (FlopCounterMode is per thread): the critic's updates stay
    # on it; where they run does not change how many operations they take.
    cfg = make_config(None, [*arm, "critic.warmup_steps=0", "critic.concurrent=false"])
    torch.manual_seed(0)
    policy, tokenizer = load_policy(cfg.model)
    g = torch.Generator().manual_seed(0)
    trajs = []
    for i in range(BATCH):
        n = 3 + i % 14
        ids = torch.randint(3, len(tokenizer), (6 + n,), generator=g).tolist()
        trajs.append(
            Trajectory(
                ids[:6],
                ids[6:],
                [1] * n,
                [-1.0] * n,
                [0] * n,
                reward=float(i % 2),
                prompt_key=str(i // 8),
                group_id=i // 8,
            )
        )
    batch = Batch.from_trajectories(trajs, pad_id=tokenizer.pad_token_id)
    learner = Learner(cfg, policy, torch.device("cpu"))
    with FlopCounterMode(display=False) as counter:
        learner.step(batch)
    learner.close()
    return counter.get_total_flops() / 1e9


def resolved_config(cfg: Any) -> dict[str, Any]:
    """Every field of the sections that make the arm, presets applied (a saved config.toml
    leaves out what the preset implies)."""
    sections = ("algorithm", "critic", "learner", "rollout", "run")
    return {k: getattr(cfg, k).model_dump(mode="json") for k in sections}


# -- TRL --------------------------------------------------------------------------------------
def trl_steps(args: argparse.Namespace) -> int:
    """TRL's steps: `--trl-steps` when set, so that a slower learner can reach the target."""
    return getattr(args, "trl_steps", None) or args.steps


def trl_settings(cfg: Any, args: argparse.Namespace, seed: int, out_dir: Path) -> dict[str, Any]:
    """GRPOConfig keyword arguments mirroring saorl's resolved `grpo` config `cfg`."""
    algo, lc, roll = cfg.algorithm, cfg.learner, cfg.rollout
    minibatches = args.trl_minibatches or algo.minibatches
    # TRL generates whole groups per batch and splits the batch into equal optimizer steps.
    if lc.batch_size % minibatches or lc.batch_size % algo.group_size:
        raise SystemExit(
            f"grpo: batch {lc.batch_size} must be a multiple of the {minibatches} mini-batches "
            f"and of the group size {algo.group_size} for TRL"
        )
    return {
        "output_dir": str(out_dir),
        "num_generations": algo.group_size,
        "per_device_train_batch_size": lc.batch_size // minibatches,
        "steps_per_generation": minibatches,
        "gradient_accumulation_steps": 1,
        "max_steps": trl_steps(args) * minibatches,
        "max_completion_length": roll.max_new_tokens,
        "temperature": roll.temperature,
        "top_p": roll.top_p,
        "epsilon": algo.clip_eps_low,
        "epsilon_high": algo.clip_eps_high,
        "loss_type": "bnpo" if algo.loss_agg == "token_mean" else "grpo",
        "scale_rewards": "group",
        "beta": algo.kl_coef,
        "learning_rate": lc.lr,  # `--grpo-lr` when set (in `cfg`)
        "lr_scheduler_type": "constant_with_warmup",
        "warmup_steps": lc.lr_warmup_steps,
        "max_grad_norm": lc.grad_clip,
        "weight_decay": lc.weight_decay,
        "use_vllm": False,
        "use_cpu": True,
        "bf16": False,
        "fp16": False,
        "gradient_checkpointing": False,
        "report_to": "none",
        "eval_strategy": "no",
        "save_strategy": "no",
        "logging_steps": minibatches,  # one log (reward) per batch
        "disable_tqdm": True,
        "seed": seed,
    }


def run_trl(
    cfg: Any,
    args: argparse.Namespace,
    model_dir: Path,
    seed: int,
    out_dir: Path,
    evaluate: Evaluator,
) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, PrinterCallback, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from saorl.envs.arithmetic import ArithmeticTask, Problem
    from saorl.envs.factory import build_env

    task = build_env(cfg.env).task
    assert isinstance(task, ArithmeticTask)
    rng = random.Random(seed)
    last = trl_steps(args)
    n_problems = 2 * last * BATCH // cfg.algorithm.group_size
    problems = [task.sample(rng) for _ in range(n_problems)]
    data = Dataset.from_dict(
        {"prompt": [p.prompt for p in problems], "answer": [p.answer for p in problems]}
    )

    def addition_reward(
        prompts: list[str], completions: list[str], answer: list[str], **_: Any
    ) -> list[float]:
        return [
            ArithmeticTask.reward(Problem(p, a, p), c)
            for p, c, a in zip(prompts, completions, answer, strict=True)
        ]

    settings = trl_settings(cfg, args, seed, out_dir)
    per_batch = settings["steps_per_generation"]
    clock = TrainClock()
    times: dict[int, float] = {}
    snapshots: dict[int, dict[str, Any]] = {}
    rewards: list[float] = []  # TRL's logged mean reward of each batch

    class Recorder(TrainerCallback):  # type: ignore[misc]
        def on_train_begin(self, *_: Any, **__: Any) -> None:
            clock.start()

        def on_step_end(
            self, _args: Any, state: Any, _control: Any, model: Any = None, **__: Any
        ) -> None:
            if state.global_step % per_batch:
                return
            batch = state.global_step // per_batch
            times[batch] = clock.elapsed()
            if batch % args.eval_every == 0 or batch == last:
                with clock.excluded():
                    snapshots[batch] = {
                        k: v.detach().clone() for k, v in model.state_dict().items()
                    }

        def on_log(
            self, _args: Any, state: Any, _control: Any, logs: Any = None, **__: Any
        ) -> None:
            if logs and "reward" in logs:
                rewards.append(round(float(logs["reward"]), 4))

    torch.set_num_threads(args.trl_threads)
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if "activation_checkpointing" in GRPOConfig.__dataclass_fields__:  # transformers >= 5
        settings["activation_checkpointing"] = settings.pop("gradient_checkpointing")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=addition_reward,
        args=GRPOConfig(**settings),
        train_dataset=data,
        processing_class=tokenizer,
        callbacks=[Recorder()],
    )
    trainer.remove_callback(PrinterCallback)  # a printed dict per batch; rewards are recorded
    t0 = time.perf_counter()
    trainer.train()
    run_s = time.perf_counter() - t0
    curve = [{"step": b, "train_s": times[b], **evaluate(s)} for b, s in sorted(snapshots.items())]
    steps = max(times)
    return {
        "curve": curve,
        "reward_per_step": rewards,
        "train_s": times[steps],
        "trajectories_per_s": BATCH * steps / times[steps],
        "run_s": run_s,
        "config": {k: v for k, v in settings.items() if k not in ("output_dir", "disable_tqdm")},
        "trl_threads": args.trl_threads,
    }


# -- report -----------------------------------------------------------------------------------
def summarize(
    runs: dict[str, list[dict[str, Any]]], initial: dict[str, float], target: float, budget_s: float
) -> dict[str, dict[str, Any]]:
    """Per trainer: medians over seeds of the headline figures (the start point included)."""
    out = {}
    for name, seeds in runs.items():
        per_seed = []
        for r in seeds:
            curve = [{"step": 0, "train_s": 0.0, **initial}, *r["curve"]]
            r["time_to_target_s"] = time_to_target(curve, target)
            r["time_to_sustained_target_s"] = time_to_sustained_target(curve, target)
            r["accuracy_at_budget"] = accuracy_at_budget(curve, budget_s)
            r["final_accuracy"] = curve[-1]["accuracy"]
            r["covers_budget"] = r["train_s"] >= budget_s  # else: out of steps before it
            r["best_accuracy"] = max(p["accuracy"] for p in curve)
            per_seed.append(r)
        out[name] = {
            "trajectories_per_s": statistics.median(r["trajectories_per_s"] for r in per_seed),
            "time_to_target_s": median_or_none([r["time_to_target_s"] for r in per_seed]),
            "time_to_sustained_target_s": median_or_none(
                [r["time_to_sustained_target_s"] for r in per_seed]
            ),
            "accuracy_at_budget": median_or_none([r["accuracy_at_budget"] for r in per_seed]),
            "final_accuracy": statistics.median(r["final_accuracy"] for r in per_seed),
            "train_s": statistics.median(r["train_s"] for r in per_seed),
            "covers_budget": all(r["covers_budget"] for r in per_seed),
        }
    return out


def plot(
    runs: dict[str, list[dict[str, Any]]],
    initial: dict[str, float],
    target: float,
    budget_s: float,
    path: Path,
    title: str,
    panels: Sequence[tuple[str, str]] = (
        ("accuracy", "held-out eval/accuracy (avg@k, sampled)"),
        ("accuracy_greedy", "held-out accuracy, greedy"),
    ),
) -> None:
    """Held-out accuracy against training seconds, one panel per (key, title) of `panels`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.5), squeeze=False)
    axes = axes[0]
    for ax, (key, label) in zip(axes, panels, strict=True):
        for i, (name, seeds) in enumerate(runs.items()):
            for j, r in enumerate(seeds):
                pts = [{"train_s": 0.0, **initial}, *r["curve"]]
                ax.plot(
                    [p["train_s"] for p in pts],
                    [p[key] for p in pts],
                    marker=".",
                    color=f"C{i}",
                    alpha=1.0 if j == 0 else 0.5,
                    label=name if j == 0 else None,
                )
        if key == "accuracy":
            ax.axhline(target, color="grey", ls="--", lw=1, label=f"target {target}")
        ax.axvline(budget_s, color="grey", ls=":", lw=1, label=f"budget {budget_s:g} s")
        ax.set_xlabel("training seconds (evaluation excluded)")
        ax.set_title(label)
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main() -> None:
    global SETUP_THREADS
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=1000, help="steps (batches of 64) per trainer")
    p.add_argument(
        "--trl-steps",
        type=int,
        help="steps of trl_grpo (default: --steps); more, to time TRL's own reach of the target",
    )
    p.add_argument("--eval-every", type=int, default=50, help="steps between snapshots")
    p.add_argument("--budget-s", type=float, default=60.0, help="training-seconds budget")
    p.add_argument("--target", type=float, default=0.32, help="held-out eval/accuracy target")
    p.add_argument(
        "--target-gain",
        type=float,
        help="target = the start's held-out accuracy + this (replaces --target)",
    )
    p.add_argument("--seeds", default="0", help="comma-separated RL seeds (warm-up: run.seed 0)")
    p.add_argument("--trainers", default=",".join(TRAINERS), help="comma-separated subset")
    p.add_argument("--max-new-tokens", type=int, default=16, help="max tokens per completion")
    p.add_argument("--sft-steps", type=int, default=500, help="supervised warm-up steps")
    p.add_argument("--eval-size", type=int, default=256, help="held-out problems (env.eval_size)")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per held-out problem")
    p.add_argument("--model", type=Path, help="reuse this exported warm-up model directory")
    p.add_argument("--trl-threads", type=int, default=1, help="TRL's torch threads")
    p.add_argument(
        "--setup-threads",
        type=int,
        default=SETUP_THREADS,
        help="torch threads of the untimed warm-up and evaluations (default: every core)",
    )
    p.add_argument(
        "--grpo-lr",
        type=float,
        default=3e-5,
        help="learning rate of trl_grpo and saorl's grpo (0 = learner.lr)",
    )
    p.add_argument(
        "--trl-minibatches",
        type=int,
        help="TRL optimizer steps per batch (default: grpo's algorithm.minibatches)",
    )
    p.add_argument("--set", action="append", default=[], help="extra saorl override (all arms)")
    p.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 40 steps, 100 warm-up steps, 64 held-out problems",
    )
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/trl.json"))
    p.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        help="train nothing: redo the figures of saved reports with this --target and --budget-s "
        "(several: from the same warm-up, each trainer from the last report that ran it)",
    )
    args = p.parse_args()
    SETUP_THREADS = args.setup_threads
    if args.from_json:
        import json

        reports = [json.loads(path.read_text()) for path in args.from_json]
        report = merge_reports(reports, args.from_json)
        target = resolve_target(args.target, args.target_gain, report["initial"])
        finish(report, target, args.budget_s, args.out)
        return
    if args.quick:
        args.steps, args.eval_every, args.sft_steps = 40, 20, 100
        args.eval_size, args.eval_samples, args.budget_s = 64, 1, 4.0
    trainers = args.trainers.split(",")
    unknown = set(trainers) - set(TRAINERS)
    if unknown:
        p.error(f"--trainers: unknown {sorted(unknown)}; choose from {', '.join(TRAINERS)}")
    if "trl_grpo" in trainers:
        try:
            import trl  # noqa: F401
        except ImportError:
            raise SystemExit(INSTALL_HINT) from None
    from saorl.api import make_config

    load = os.getloadavg()[0]
    seeds = [int(s) for s in args.seeds.split(",")]
    env_overrides = [
        f"env.eval_size={args.eval_size}",
        f"run.eval_samples={args.eval_samples}",
        f"rollout.max_new_tokens={args.max_new_tokens}",
    ]
    runs: dict[str, list[dict[str, Any]]] = {t: [] for t in trainers}
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir, warm = args.model, None
        if model_dir is None:
            model_dir = Path(tmp) / "warm"
            warm = export_warm_model(
                [*env_overrides, f"learner.sft_steps={args.sft_steps}"], model_dir
            )
            print(f"warm-up: {warm['sft_steps']} steps in {warm['seconds']:.0f} s", flush=True)
        # One evaluation seed for every run (`run.seed` 0's), so that curves compare.
        evaluate = Evaluator(make_config(None, saorl_overrides(args, model_dir, Path(tmp), 0)))
        initial = evaluate(None)
        for seed in seeds:
            base = saorl_overrides(args, model_dir, Path(tmp) / f"runs-{seed}", seed)
            for name in trainers:
                arm = [*base, *arm_overrides(name, args)]
                load_now = os.getloadavg()[0]
                if name == "trl_grpo":
                    r = run_trl(
                        make_config(None, arm), args, model_dir, seed, Path(tmp) / "trl", evaluate
                    )
                else:
                    r = run_saorl(name, arm, evaluate)
                r["seed"], r["load_average_at_start"] = seed, load_now
                runs[name].append(r)
                print(
                    f"  seed {seed} {name}: {r['trajectories_per_s']:.0f} trajectories/s, "
                    f"accuracy {initial['accuracy']:.3f} -> {r['curve'][-1]['accuracy']:.3f} "
                    f"in {r['train_s']:.0f} s",
                    flush=True,
                )
        # Why the arms differ in trajectories/s on a learner-bound machine: their learner's work.
        flops = {
            name: learner_gflops([*base, *arm_overrides(name, args)])
            for name in trainers
            if name != "trl_grpo"
        }
    report = {
        "benchmark": "saorl_vs_trl",
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine(load, trl=_version("trl"), transformers=_version("transformers")),
        "command_s": time.perf_counter() - t_start,
        "workload": {
            k: getattr(args, k)
            for k in (
                "steps",
                "trl_steps",
                "eval_every",
                "max_new_tokens",
                "sft_steps",
                "eval_size",
                "eval_samples",
                "trl_threads",
                "grpo_lr",
                "trl_minibatches",
                "set",
                "quick",
            )
        }
        | {"seeds": seeds, "batch": BATCH},
        "warm_up": warm,
        "learner_gflop_per_step": flops,
        "initial": initial,
        "runs": runs,
    }
    finish(report, resolve_target(args.target, args.target_gain, initial), args.budget_s, args.out)


def issue_targets(
    summary: dict[str, dict[str, Any]], origin: dict[str, int] | None = None
) -> dict[str, Any]:
    """Each target's figures and, last, whether it is met (from a `summarize` of the runs).

    `origin`: which merged report each trainer came from. Trajectories/s compare only within
    one run (the machine's speed moves between runs); times to the target are the point of a
    merge (a longer run of one trainer), so they compare across.
    """
    origin = origin or {}
    targets: dict[str, Any] = {}
    for sao in ("sao", "sao_concurrent"):
        if sao in summary and "grpo" in summary and origin.get(sao) == origin.get("grpo"):
            ratio = summary[sao]["trajectories_per_s"] / summary["grpo"]["trajectories_per_s"]
            targets[f"{sao}_trajectories_per_s_at_least_0.9x_grpo"] = [ratio, ratio >= 0.9]
        if sao in summary and "trl_grpo" in summary:
            for key, suffix in (
                ("time_to_target_s", ""),
                ("time_to_sustained_target_s", "_sustained"),
            ):
                sao_t, trl_t = (summary[n][key] for n in (sao, "trl_grpo"))
                met = sao_t is not None and (trl_t is None or sao_t < trl_t)
                targets[f"{sao}_reaches_target_before_trl_grpo{suffix}"] = [sao_t, trl_t, met]
                # Issue 33's target: SAO's time to the target at most 0.6x TRL's. Unknown (None)
                # when TRL never reached it: its time lies beyond its run (give it --trl-steps).
                ratio = None if sao_t is None or trl_t is None else sao_t / trl_t
                targets[f"{sao}_time_to_target{suffix}_at_most_0.6x_trl_grpo"] = [
                    ratio,
                    ratio is not None and ratio <= 0.6,
                ]
    return targets


def merge_reports(reports: list[dict[str, Any]], paths: Sequence[Path]) -> dict[str, Any]:
    """One report of several runs' trainers, e.g. a longer run of one trainer added later, or
    more seeds of the same trainers: a trainer's runs are kept per seed, a later report's run
    of a seed replacing an earlier one.

    Their curves compare only from the same weights: every report's evaluation of its start
    must be the same (the warm-up is seeded, its evaluation too), else this refuses.
    """
    first = reports[0]
    if len(reports) == 1:
        return first
    for path, report in zip(paths, reports, strict=True):
        if report["initial"] != first["initial"]:
            raise SystemExit(
                f"{path}: its runs start from other weights (start {report['initial']}, "
                f"{paths[0]}'s {first['initial']}); only reports of the same warm-up merge"
            )
    by_seed: dict[str, dict[Any, dict[str, Any]]] = {}
    flops: dict[str, float] = {}
    for report in reports:
        for name, seeds in report["runs"].items():
            by_seed.setdefault(name, {}).update({r.get("seed"): r for r in seeds})
        flops.update(report.get("learner_gflop_per_step") or {})
    return {
        **first,
        "runs": {name: list(seeds.values()) for name, seeds in by_seed.items()},
        "learner_gflop_per_step": flops,
        "merged_from": [
            {"path": str(path), "time": r["time"], "trainers": list(r["runs"]), **r["workload"]}
            for path, r in zip(paths, reports, strict=True)
        ],
    }


def steps_label(runs: dict[str, list[dict[str, Any]]]) -> str:
    """`1000 steps`, or each trainer's count where they differ."""
    steps = {name: max(p["step"] for p in rs[0]["curve"]) for name, rs in runs.items() if rs}
    if len(set(steps.values())) == 1:
        return f"{next(iter(steps.values()))} steps"
    return ", ".join(f"{name} {n}" for name, n in steps.items()) + " steps"


def finish(report: dict[str, Any], target: float, budget_s: float, out: Path) -> None:
    """Summary, targets, table, JSON and plot of a report's runs (also `--from-json`)."""
    runs, initial, w = report["runs"], report["initial"], report["workload"]
    summary = summarize(runs, initial, target, budget_s)
    load = report["machine"].get("load_average_at_start", float("nan"))
    steps = steps_label(runs)
    print(
        f"\nsaorl vs TRL, {steps} x {BATCH} trajectories, seeds {w['seeds']}, "
        f"target {target}, budget {budget_s:g} s; load average at start {load:.2f}"
    )
    print(
        f"start: eval/accuracy {initial['accuracy']:.3f}, greedy {initial['accuracy_greedy']:.3f}"
    )
    print(
        f"{'trainer':15} {'traj/s':>7} {'train s':>8} {'to target s':>12} "
        f"{'sustained s':>12} {'acc @ budget':>13} {'final acc':>10}"
    )
    for name, s in summary.items():
        first, held = (
            "-" if s[k] is None else f"{s[k]:.0f}"
            for k in ("time_to_target_s", "time_to_sustained_target_s")
        )
        acc = "-" if s["accuracy_at_budget"] is None else f"{s['accuracy_at_budget']:.3f}"
        acc += "" if s["covers_budget"] else " (ran out of steps)"
        print(
            f"{name:15} {s['trajectories_per_s']:7.0f} {s['train_s']:8.0f} {first:>12} "
            f"{held:>12} {acc:>13} {s['final_accuracy']:10.3f}"
        )
    origin = {n: i for i, m in enumerate(report.get("merged_from", [])) for n in m["trainers"]}
    targets = issue_targets(summary, origin)
    for name, value in targets.items():
        print(f"target {name}: {value[:-1]} -> {'met' if value[-1] else 'MISSED'}")
    flops = report.get("learner_gflop_per_step") or {}
    if flops:
        print("learner GFLOP per step: " + ", ".join(f"{k} {v:.2f}" for k, v in flops.items()))
    report = {
        **report,
        "target": target,
        "budget_s": budget_s,
        "summary": summary,
        "targets": targets,
    }
    write_report(out, report)
    title = (
        f"saorl vs TRL GRPOTrainer: {steps} x {BATCH}, seeds {w['seeds']} (load average {load:.1f})"
    )
    plot(runs, initial, target, budget_s, out.with_suffix(".png"), title)


def _version(package: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(package)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    main()
