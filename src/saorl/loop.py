"""`saorl train`: asynchronous single-rollout SAO, top to bottom.

    setup -> supervised warm-up (built-in task) -> initial eval -> checkpoint 0
    rollout pool: workers fill their engines (admission control) -> decode -> trajectories
    learner, each step:
        take the first `batch_size` finished trajectories (drop and count the too-stale ones)
        -> SAO step (critic values, GAE, K critic updates, DIS policy update)
        -> push weights to the engines once `push_every` policy versions have passed since the
           last push (`perf/push_bytes`, `perf/push_s`) -> log / eval / checkpoint
        -> collapse detection on the step's metrics (`saorl.monitoring.collapse`;
        `run.stop_on_collapse`
           ends the run here, with a checkpoint)
    final eval, checkpoint, summary.json, report.png (a NaN streak writes summary.json too)

With `run.concurrency = "sync"` the same pieces run one after another (generate a batch, then
train): the baseline that asynchrony is measured against.

The loop is written against two interfaces, a learner and a rollout pool
(`saorl.interfaces`); `saorl.topology.build_topology` decides where they run (one process,
Ray actors, torchrun ranks) and this file does not change with it.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Any

import torch

from saorl.checkpoint.io import list_checkpoints, load_latest_checkpoint, save_step
from saorl.checkpoint.shards import open_sharded
from saorl.config import Config, ConfigError, config_to_toml
from saorl.envs.base import EnvSpec
from saorl.envs.factory import build_env, recorded_env
from saorl.learner.critic_updater import concurrent_critic
from saorl.learner.learner import NonFiniteError
from saorl.models.loading import resolve_device
from saorl.monitoring.collapse import CollapseDetector, detect_collapse
from saorl.monitoring.metrics import MetricsLogger, TrainProgress, read_metrics, truncate_metrics
from saorl.monitoring.samples import SAMPLES_FILE, SampleLogger, pop_row_advantages
from saorl.monitoring.tracking import check_trackers, open_trackers
from saorl.rollout.prompt_check import check_prompts
from saorl.rollout.worker import PromptFeed
from saorl.run.lock import claim_run_dir
from saorl.run.plan import critic_only_steps, policy_updates, warn_short_run, warn_tiny_model
from saorl.run.signals import StopSignals
from saorl.security.safe_io import write_atomic
from saorl.topology import Topology, build_topology
from saorl.types import Batch, Collected, PoolStats


def train_from_config(cfg: Config, resume: str | None = None) -> dict[str, Any]:
    """Train with `cfg` (continuing the run directory `resume`); the run's summary."""
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    check_trackers(cfg.run.trackers)  # a missing package stops the run before anything starts
    was_deterministic = torch.are_deterministic_algorithms_enabled()
    if cfg.run.deterministic:  # CUDA's cuBLAS needs a fixed workspace to be deterministic
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
    try:
        placed = build_topology(cfg)
        if placed is None:  # a torchrun rank > 0: it followed rank 0's learner calls to the end
            return {}
        try:
            # SIGTERM / Ctrl-C from here on: finish the step, save, stop (`saorl.run.signals`)
            with contextlib.ExitStack() as held:
                stops = held.enter_context(StopSignals(cfg.run.stop_timeout_s))
                return _train(cfg, placed, resume, stops, held)
        finally:
            placed.learner.close()
    finally:  # process-wide: an in-process caller (tests, the Python API) gets it back as it was
        torch.use_deterministic_algorithms(was_deterministic)


def _train(
    cfg: Config, placed: Topology, resume: str | None, stops: StopSignals, held: Any
) -> dict[str, Any]:
    learner = placed.learner
    tokenizer = placed.tokenizer
    spec = build_env(cfg.env)  # a bad dataset fails before any run directory exists
    check_prompts(cfg, spec, tokenizer)  # prompts too long for model.max_seq_len: exit 2 here
    warn_short_run(cfg)  # a budget spent on critic-only steps (saorl.run.plan)
    warn_tiny_model(cfg)  # the built-in model on a task it cannot know
    # The run folder, locked against a second writer until the run ends (`saorl.run.lock`)
    run_dir = held.enter_context(claim_run_dir(Path(cfg.run.output_dir), cfg.run.name, resume))
    if cfg.env.name == "agent":  # its programs keep their own files in the run folder
        spec = build_env(cfg.env, run_dir=run_dir.resolve())
    prompt_rng = random.Random(cfg.run.seed)
    started = 0
    extra = {}
    state = None
    if resume:
        try:
            state = open_sharded(load_latest_checkpoint(run_dir, quarantine=True)[1])
        except FileNotFoundError as e:
            raise ConfigError(f"--resume: {e}") from e
    if state is not None:
        learner.restore(state)
        if learner.steps >= cfg.run.total_steps and (run_dir / "summary.json").is_file():
            return _complete(cfg, run_dir, learner.steps)  # a finished run: nothing changes
    saved = cfg.model_copy(update={"env": recorded_env(cfg.env, spec)})  # its held-out split
    write_atomic(run_dir / "config.toml", config_to_toml(saved))  # a refused resume leaves it be
    if state is not None:
        print(
            f"saorl: resuming {run_dir} from step {learner.steps} "
            f"(run.total_steps {cfg.run.total_steps})",
            file=sys.stderr,
            flush=True,
        )
        prompt_rng.setstate(state["prompt_rng"])
        started = state["data_position"]
        extra = {k: v for k, v in state.items() if k.startswith(_KEPT)}
        truncate_metrics(run_dir / "metrics.jsonl", learner.steps)
        truncate_metrics(run_dir / SAMPLES_FILE, learner.steps)
    progress = TrainProgress(
        cfg.run.total_steps, enabled=cfg.run.progress, initial_step=learner.steps
    )
    trackers = open_trackers(cfg, run_dir, learner.steps if state is not None else None)
    with progress, MetricsLogger(run_dir, trackers) as log:
        if state is None:
            t_warmup = time.perf_counter()
            if cfg.learner.sft_steps:
                learner.warm_up(spec, tokenizer, progress)
            if cfg.critic.init_from:
                learner.load_critic(cfg.critic.init_from)
            ev = learner.evaluate(spec, tokenizer)
            extra = {
                "initial_eval_accuracy": ev["eval/accuracy"],
                "initial_eval_accuracy_greedy": ev["eval/accuracy_greedy"],
                # Before the RL steps (`wall_seconds`): warm-up and initial evaluation
                "warmup_seconds": time.perf_counter() - t_warmup,
            }
            log.log({"step": 0, **ev})
            rollout_state = {"prompt_rng": prompt_rng.getstate(), "data_position": started}
            save_step(learner, tokenizer, run_dir, {**rollout_state, **extra}, cfg.run.save_hf)
        t_start = time.perf_counter()
        summary, failure = _rl_loop(
            cfg,
            placed,
            spec,
            prompt_rng,
            started,
            extra,
            run_dir,
            log,
            progress,
            resumed=state,
            stops=stops,
        )
        _write_summary(cfg, run_dir, summary, time.perf_counter() - t_start)
        if failure is not None:  # inside the `with`: the trackers close as failed
            _write_report(run_dir)
            raise failure
    if summary["stopped_by"] == "signal":  # a stop in bounded time: no final/ export, no report
        return summary
    learner.export(tokenizer, run_dir / "final")
    _write_report(run_dir)
    return summary


# Checkpointed with every step and restored on a resume: the summary's facts of the run's start
_KEPT = ("initial_eval", "warmup_seconds")


def _complete(cfg: Config, run_dir: Path, steps: int) -> dict[str, Any]:
    """`--resume` of a run that reached `run.total_steps`: said, and its summary returned as
    it is; nothing in the folder is written (raising `run.total_steps` continues it)."""
    print(
        f"saorl train: {run_dir} is complete (step {steps} of run.total_steps "
        f"{cfg.run.total_steps}); nothing changed. To train further, raise it: saorl train "
        f"--resume {run_dir} run.total_steps={steps + max(steps, 1)}",
        file=sys.stderr,
        flush=True,
    )
    summary = json.loads((run_dir / "summary.json").read_text())
    return {**summary, "run_dir": str(run_dir)} if isinstance(summary, dict) else {}


def _write_summary(cfg: Config, run_dir: Path, summary: dict[str, Any], seconds: float) -> None:
    """summary.json, with the collapse verdict of the whole run (`saorl.monitoring.collapse`).
    `wall_seconds`: this process's RL steps, from the rollout pool's start to its close after
    the last step (evaluations and checkpoints during them included; the warm-up, the initial
    evaluation, the final export and report not: `warmup_seconds` is the warm-up and initial
    evaluation; a resumed run counts from its resume)."""
    summary["wall_seconds"] = seconds
    if "warmup_seconds" in summary:  # beside it (from the run's start, kept across resumes)
        summary["warmup_seconds"] = summary.pop("warmup_seconds")
    summary["run_dir"] = str(run_dir)
    rows = read_metrics(run_dir / "metrics.jsonl")
    summary["collapse"] = detect_collapse(rows, cfg.collapse)
    if cfg.algorithm.advantage == "gae":  # a critic: were its updates beside the policy's?
        on, why = concurrent_critic(cfg, resolve_device(cfg.model.device))
        summary["critic_concurrent"] = {"on": on, "why": why}
    write_atomic(run_dir / "summary.json", json.dumps(summary, indent=2))


def _rl_loop(
    cfg: Config,
    placed: Topology,
    spec: EnvSpec,
    prompt_rng: random.Random,
    started: int,
    extra: dict,
    run_dir: Path,
    log: MetricsLogger,
    progress: TrainProgress,
    resumed: dict[str, Any] | None = None,
    stops: StopSignals | None = None,
) -> tuple[dict[str, Any], NonFiniteError | None]:
    """The RL steps; `(summary, the error that stopped them if a NaN streak did)`."""
    learner, pool, tokenizer = placed
    lc = cfg.learner
    lookahead = admission_lookahead(cfg)
    group_size = cfg.algorithm.samples_per_prompt  # groups for GRPO and VAPO's group sampling
    feed = PromptFeed(
        spec.task,
        prompt_rng,
        lc.batch_size,
        lookahead,
        learner.steps,
        started,
        group_size=group_size,
    )
    totals = {"waited_s": 0.0, "dropped": 0}
    metrics: dict[str, Any] = {}
    samples = SampleLogger(
        run_dir,
        tokenizer,
        cfg.run.log_samples_every,
        cfg.run.log_samples_count,
        cfg.run.total_steps,
        log,
    )
    last_eval = None
    # The detector's state is a function of the rows logged so far: the initial evaluation,
    # and on a resume every step up to the checkpoint (so nothing of it is checkpointed).
    detector = CollapseDetector(cfg.collapse)
    detector.replay(read_metrics(run_dir / "metrics.jsonl"))
    announced = _announce(detector, progress, None)
    stopped_by = "total_steps"
    failure = None
    saved = learner.steps  # checkpoint 0, or the one resumed from
    try:
        # A resumed run's untrained rollouts come back first.
        pool.start(spec, feed, resumed, run_dir.resolve())
        pushed = learner.version  # the engines start at the learner's weights
        t0 = time.perf_counter()
        while learner.steps < cfg.run.total_steps:
            if stops is not None and stops.requested(learner):  # every rank agrees on the step
                if saved != learner.steps:
                    state = {**pool.snapshot(), **extra}
                    save_step(learner, tokenizer, run_dir, state, cfg.run.save_hf)
                stopped_by = "signal"
                break
            t_step = time.perf_counter()
            got = pool.collect(learner.version, lc.batch_size, lc.max_staleness)
            stale = [t.staleness(learner.version) for t in got.trajectories]
            batch = Batch.from_trajectories(got.trajectories, tokenizer.pad_token_id)
            try:
                metrics = learner.step(batch)
            except NonFiniteError as e:  # the summary still says what happened
                stopped_by = "nonfinite"
                failure = e
                break
            if push_due(learner.version, pushed, lc.push_every):
                t_push = time.perf_counter()
                # a generation in flight continues under the new weights
                metrics["perf/push_bytes"] = pool.update_weights()
                metrics["perf/push_s"] = time.perf_counter() - t_push
                pushed = learner.version
            totals["waited_s"] += got.waited_s
            totals["dropped"] += got.dropped
            metrics["step"] = learner.steps
            stats = pool.stats()
            tools = spec.max_tool_calls > 0
            metrics.update(
                _rollout_metrics(cfg, got, batch, stale, stats, totals, t0, t_step, tools)
            )
            ev = cfg.run.eval_every
            evaluated = learner.steps == cfg.run.total_steps or (ev and learner.steps % ev == 0)
            if evaluated:
                last_eval = learner.evaluate(spec, tokenizer)
                metrics.update(last_eval)
            metrics.update(detector.update(metrics))
            stop = cfg.run.stop_on_collapse and detector.first is not None
            if stop and not evaluated:  # the summary's final accuracy is the policy it stops at
                last_eval = learner.evaluate(spec, tokenizer)
                metrics.update(last_eval)
                scores = detector.update({"step": learner.steps, **last_eval})
                metrics["collapse/eval_drop"] = scores["collapse/eval_drop"]  # the rest judged
            announced = _announce(detector, progress, announced)
            # The metrics row goes first: a kill between the two leaves a row past the newest
            # checkpoint, which resume truncates and redoes; the other order would lose it.
            row_adv = pop_row_advantages(metrics)
            log.log(metrics)
            samples.maybe_log(learner.steps, got.trajectories, stale, metrics, row_adv, got.failed)
            ck = cfg.run.checkpoint_every
            if stop or learner.steps == cfg.run.total_steps or (ck and learner.steps % ck == 0):
                save_step(
                    learner, tokenizer, run_dir, {**pool.snapshot(), **extra}, cfg.run.save_hf
                )
                saved = learner.steps
            progress.update(learner.steps, metrics)
            if stop:
                stopped_by = "collapse"
                break
        errors = pool.stats().errors  # failed episodes by type and place (saorl.rollout.failures)
    finally:
        pool.close()
    summary = {
        **extra,
        "final_eval_accuracy": last_eval["eval/accuracy"] if last_eval else None,
        "final_eval_accuracy_greedy": last_eval["eval/accuracy_greedy"] if last_eval else None,
        "steps": learner.steps,
        "policy_version": learner.version,
        "policy_updates": policy_updates(cfg, learner.steps),
        "critic_only_steps": critic_only_steps(cfg, learner.steps),
        "dropped_stale": totals["dropped"],
        "errors": errors,
        "learner_idle_frac": metrics.get("perf/learner_idle_frac"),
        "rollout_idle_frac": metrics.get("perf/rollout_idle_frac"),
        "stopped_by": stopped_by,
        "stop_reason": _stop_reason(stopped_by, detector, failure, cfg),
    }
    if stopped_by == "signal" and stops is not None:
        newest = list_checkpoints(run_dir)
        summary["signal"], summary["total_steps"] = stops.name, cfg.run.total_steps
        summary["checkpoint"] = newest[-1].name if newest else None
        summary["stop_reason"] = f"{stops.name}: stopped after step {learner.steps}, saved"
    return summary, failure


def push_due(version: int, pushed: int, push_every: int) -> bool:
    """Whether the engines, at policy version `pushed`, are due the learner's `version`.

    Counted in policy versions since the last push, not as multiples of `push_every`: one step
    adds `algorithm.minibatches` versions (fewer when a mini-step is skipped for a non-finite
    gradient), so a version that is a multiple of `push_every` may never come, and engines that
    are never updated make every rollout too stale to train (a livelock).
    """
    return version - pushed >= push_every


def admission_lookahead(cfg: Config) -> int:
    """Batches admission control lets rollouts start ahead of the learner.

    `learner.max_staleness` is in policy versions and one batch makes `algorithm.minibatches`
    versions, so the window is `max_staleness // minibatches` batches (the prompt feed admits
    at least the batch being collected): in start order, a rollout admitted that far ahead is
    at most `max_staleness` versions old when it is trained. Counting batches instead would
    admit `minibatches` times too far ahead, and the staleness check would drop the excess.
    Synchronous mode admits exactly the batch being collected: nothing generates in the
    background, so every trajectory is sampled by the policy it trains.
    """
    if cfg.run.concurrency == "sync":
        return 0
    return cfg.learner.max_staleness // cfg.algorithm.minibatches


def _announce(detector: CollapseDetector, progress: TrainProgress, done: Any) -> Any:
    """Tell the log (stderr) and the progress line about the first finding, once."""
    first = detector.first
    if first is None or first is done:
        return done
    print(
        f"saorl: collapse detected at step {first['detected_step']} (onset {first['step']}): "
        f"{first['reason']}",
        file=sys.stderr,
        flush=True,
    )
    progress.alert(f"collapse: {first['signal']} @ {first['detected_step']}")
    return first


def _stop_reason(
    stopped_by: str, detector: CollapseDetector, failure: Exception | None, cfg: Config
) -> str:
    first = detector.first
    if stopped_by == "collapse" and first is not None:
        return (
            f"run.stop_on_collapse: {first['signal']} fired at step {first['detected_step']} "
            f"(onset {first['step']}): {first['reason']}"
        )
    if stopped_by == "nonfinite":
        return f"learner.max_nonfinite_in_a_row: {failure}"
    return f"run.total_steps ({cfg.run.total_steps}) reached"


def _rollout_metrics(
    cfg: Config,
    got: Collected,
    batch: Batch,
    stale: list[int],
    stats: PoolStats,
    totals: dict[str, Any],
    t0: float,
    t_step: float,
    tools: bool,
) -> dict[str, Any]:
    """The rollout, asynchrony and throughput columns of one step's metrics row."""
    now = time.perf_counter()
    elapsed = max(now - t0, 1e-9)
    out = {
        "rollout/reward_mean": float(batch.scores.mean()),
        "rollout/response_len_mean": float(batch.action_mask.sum(-1).mean()),
        "async/staleness_mean": sum(stale) / len(stale),
        "async/staleness_max": max(stale),
        **{
            f"async/staleness_frac_{k}": stale.count(k) / len(stale)
            for k in range(cfg.learner.max_staleness + 1)
        },  # histogram, one key per version
        "async/dropped_stale": totals["dropped"],
        "rollout/failed": stats.failed,
        "rollout/worker_restarts": stats.restarts,
        "rollout/prompt_too_long": stats.prompt_too_long,
        "perf/learner_idle_frac": totals["waited_s"] / elapsed,
        "perf/rollout_idle_frac": stats.idle_s / elapsed,
        "perf/rollout_tokens_per_s": stats.tokens_generated / elapsed,
        "perf/step_s": now - t_step,
        "time/wall_s": now - t0,
    }
    if got.group_waits:
        out["async/group_wait_s"] = sum(got.group_waits) / len(got.group_waits)
    if tools:
        calls = [t.info.get("tool_calls", 0) for t in got.trajectories]
        out["rollout/tool_calls_mean"] = sum(calls) / len(calls)
        bad = sum(t.info.get("tool_calls_bad", 0) for t in got.trajectories)
        out["rollout/tool_calls_bad_frac"] = bad / max(sum(calls), 1)
    # `env.reward_fns`: each function's mean over the trajectories it scored (not None);
    # agent programs' `agent/*` counts and metrics alike, verifiers' `env/*` metrics
    scored: dict[str, list[float]] = {}
    for t in got.trajectories:
        for key, value in t.info.items():
            if key.startswith(("reward/", "agent/", "env/")) and isinstance(value, int | float):
                scored.setdefault(key, []).append(value)
    out.update({key: sum(vs) / len(vs) for key, vs in scored.items()})
    return out


def _write_report(run_dir: Path) -> None:
    from saorl.monitoring.report import report_run

    report_run(run_dir)
