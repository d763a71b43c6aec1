"""`saorl train`: asynchronous single-rollout SAO, top to bottom.

    setup -> supervised warm-up (built-in task) -> initial eval -> checkpoint 0
    rollout worker thread: fill engine (admission control) -> decode -> trajectories -> queue
    learner (this thread), each step:
        take the first `batch_size` finished trajectories (drop and count the too-stale ones)
        -> SAO step (critic values, GAE, K critic updates, DIS policy update)
        -> push weights to the engine every `push_every` versions -> log / eval / checkpoint
    final eval, checkpoint, summary.json, report.png

With `run.concurrency = "sync"` the same pieces run one after another (generate a batch, then
train): the baseline that asynchrony is measured against.

With `ray.enabled` (`saorl train --ray`) this loop runs unchanged in the driver while the
learner and the rollout workers are Ray actors behind proxies with the same methods
(`saorl.distributed.ray_driver`); `_on_learner` runs what needs the weights where they live.
"""

from __future__ import annotations

import json
import math
import os
import queue
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from saorl.checkpoint import load_latest_checkpoint, save_checkpoint
from saorl.collapse import detect_collapse
from saorl.collector import BatchCollector
from saorl.config import Config, ConfigError, config_to_toml
from saorl.distributed.fsdp import LeaderLearner, torchrun_learner
from saorl.distributed.ray_driver import RayLearner  # imports no ray until one is built
from saorl.envs.factory import EnvSpec, build_env
from saorl.evaluation import evaluate_policy
from saorl.learner import Learner
from saorl.metrics import MetricsLogger, TrainProgress, read_metrics, truncate_metrics
from saorl.models.loading import load_policy, resolve_device, save_pretrained
from saorl.resume import restore_rollouts, snapshot_rollouts
from saorl.rollout.factory import build_engine
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker, lognormal_lengths
from saorl.sft import encode_segments, sft_step
from saorl.types import Batch, Trajectory


def evaluate(learner: Learner, tokenizer: Any, spec: EnvSpec, cfg: Config) -> dict[str, float]:
    """Held-out metrics of the learner's current policy (see `saorl.evaluation`)."""
    # A fixed seed: every evaluation draws the same random numbers, so curves are comparable.
    return evaluate_policy(learner.policy, tokenizer, spec, cfg, seed=cfg.run.seed + 12345)


def supervised_warmup(
    learner: Learner, tokenizer: Any, spec: EnvSpec, cfg: Config, progress: TrainProgress | None
) -> None:
    lc = cfg.learner
    if spec.demo is None:
        raise ConfigError(
            f"learner.sft_steps={lc.sft_steps}: env {cfg.env.name!r} has no demonstrations for "
            "a supervised warm-up; set learner.sft_steps=0 (start from a trained model)"
        )
    opt = torch.optim.AdamW(learner.policy.parameters(), lr=lc.sft_lr)
    # Cosine decay to 10% of sft_lr: the warm-up ends at a settled point, not mid-oscillation,
    # so the accuracy RL starts from does not hinge on where the last noisy step landed.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / max(lc.sft_steps, 1)))
    )
    rng = random.Random(cfg.run.seed + 1)
    bar = progress.phase("supervised warm-up", lc.sft_steps) if progress else None
    for _ in range(lc.sft_steps):
        probs = [spec.task.sample(rng) for _ in range(lc.sft_batch_size)]
        demos = encode_segments(tokenizer, [spec.demo(p, rng) for p in probs])
        sft_step(learner.policy, opt, demos)
        sched.step()
        if bar:
            bar.advance()
    # The critic starts from the policy it will judge (DESIGN.md: initialised from the policy).
    learner.reset_critic_from_policy()


def _state(learner: Learner, feed_state: dict[str, Any], extra: dict) -> dict:
    # learner.state_dict(): weights, optimizers and counters (gathered from the ranks under FSDP)
    return {**learner.state_dict(), "torch_rng": torch.get_rng_state(), **feed_state, **extra}


def _load_pretrained_critic(learner: Learner, path: str) -> None:
    """Critic weights from `saorl value-pretrain` (the optimizer starts fresh)."""
    if not Path(path).is_file():
        raise ConfigError(
            f"critic.init_from: no file {path!r} (write one with saorl value-pretrain)"
        )
    state = torch.load(path, map_location="cpu", weights_only=False)
    try:
        learner.critic.load_state_dict(state["critic"])
    except (KeyError, RuntimeError) as e:
        raise ConfigError(f"critic.init_from: {path} does not fit this model: {e}") from e


def _make_learner(cfg: Config) -> tuple[Learner | RayLearner | LeaderLearner | None, Any]:
    """`(learner, tokenizer)`: here, or with `ray.enabled` the proxy of a Ray learner actor."""
    if cfg.ray.enabled:
        learner = RayLearner(cfg)
        return learner, learner.tokenizer
    policy, tokenizer = load_policy(cfg.model)
    if cfg.learner.fsdp and "LOCAL_RANK" in os.environ:  # under torchrun: FSDP2 over its ranks
        return torchrun_learner(cfg, policy, resolve_device(cfg.model.device)), tokenizer
    return Learner(cfg, policy, resolve_device(cfg.model.device)), tokenizer


def _on_learner(learner: Learner | RayLearner, fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(learner, *args)` where the learner lives: this process or its Ray actor."""
    return learner.call(fn, *args) if isinstance(learner, RayLearner) else fn(learner, *args)


def _checkpoint(learner: Learner, run_dir: Path, feed_state: dict[str, Any], extra: dict) -> None:
    save_checkpoint(run_dir, learner.steps, _state(learner, feed_state, extra))


def _restore(learner: Learner, state: dict[str, Any]) -> None:
    learner.load_state(state)
    torch.set_rng_state(state["torch_rng"])


def _export(learner: Learner, tokenizer: Any, path: Path) -> None:
    save_pretrained(learner.policy, tokenizer, path)


def _push_weights(learner: Learner | RayLearner, workers: list[Any]) -> None:
    """The learner's new weights into every engine; a partial rollout continues under them."""
    if isinstance(learner, RayLearner):
        return learner.push_weights()  # object store or broadcast group (ray.weight_sync)
    state = learner.policy_state()
    for w in workers:
        w.engine.update_weights(state, learner.version)


def _fresh_run_dir(output_dir: Path, name: str) -> Path:
    """`output_dir/name`, or `name-1`, `name-2`, ... if a run already lives there.

    A new run never appends to another run's metrics or mixes its checkpoints with them
    (resuming picks the newest checkpoint); continuing a run is what `--resume` is for.
    """
    run_dir = output_dir / name
    i = 0
    while (run_dir / "metrics.jsonl").exists() or (run_dir / "checkpoints").exists():
        i += 1
        run_dir = output_dir / f"{name}-{i}"
    if i:
        print(
            f"saorl: {output_dir / name} holds an earlier run (continue it with --resume); "
            f"this run writes to {run_dir}",
            file=sys.stderr,
        )
    return run_dir


def train_from_config(cfg: Config, resume: str | None = None) -> dict[str, Any]:
    torch.set_num_threads(cfg.run.torch_threads)
    torch.manual_seed(cfg.run.seed)
    learner, tokenizer = _make_learner(cfg)
    if learner is None:  # an FSDP rank > 0: it followed rank 0's learner calls to the end
        return {}
    try:
        return _train(cfg, learner, tokenizer, resume)
    finally:
        if isinstance(learner, RayLearner | LeaderLearner):
            learner.close()


def _train(
    cfg: Config, learner: Learner | RayLearner, tokenizer: Any, resume: str | None
) -> dict[str, Any]:
    run_dir = Path(resume) if resume else _fresh_run_dir(Path(cfg.run.output_dir), cfg.run.name)
    run_dir.mkdir(parents=True, exist_ok=True)
    spec = build_env(cfg.env)
    prompt_rng = random.Random(cfg.run.seed)
    started, extra = 0, {}
    (run_dir / "config.toml").write_text(config_to_toml(cfg))
    state = None
    if resume:
        try:
            state = load_latest_checkpoint(run_dir, quarantine=True)[1]
        except FileNotFoundError as e:
            raise ConfigError(f"--resume: {e}") from e
    if state is not None:
        _on_learner(learner, _restore, state)
        prompt_rng.setstate(state["prompt_rng"])
        started = state["data_position"]
        extra = {k: v for k, v in state.items() if k.startswith("initial_eval")}
        truncate_metrics(run_dir / "metrics.jsonl", learner.steps)
    progress = TrainProgress(
        cfg.run.total_steps, enabled=cfg.run.progress, initial_step=learner.steps
    )
    with progress, MetricsLogger(run_dir) as log:
        if state is None:
            if cfg.learner.sft_steps:
                bar = None if isinstance(learner, RayLearner) else progress  # display: here
                _on_learner(learner, supervised_warmup, tokenizer, spec, cfg, bar)
            if cfg.critic.init_from:
                _on_learner(learner, _load_pretrained_critic, cfg.critic.init_from)
            ev = _on_learner(learner, evaluate, tokenizer, spec, cfg)
            extra = {
                "initial_eval_accuracy": ev["eval/accuracy"],
                "initial_eval_accuracy_greedy": ev["eval/accuracy_greedy"],
            }
            log.log({"step": 0, **ev})
            feed0 = {"prompt_rng": prompt_rng.getstate(), "data_position": started}
            _on_learner(learner, _checkpoint, run_dir, feed0, extra)
        t_start = time.perf_counter()
        summary = _rl_loop(cfg, learner, tokenizer, spec, prompt_rng, started, extra, run_dir,
                           log, progress, resumed=state)  # fmt: skip
    summary["wall_seconds"] = time.perf_counter() - t_start
    summary["run_dir"] = str(run_dir)
    summary["collapse"] = detect_collapse(read_metrics(run_dir / "metrics.jsonl"))
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    _on_learner(learner, _export, tokenizer, run_dir / "final")
    _write_report(run_dir)
    return summary


def _rl_loop(
    cfg: Config,
    learner: Learner | RayLearner,
    tokenizer: Any,
    spec: EnvSpec,
    prompt_rng: random.Random,
    started: int,
    extra: dict,
    run_dir: Path,
    log: MetricsLogger,
    progress: TrainProgress,
    resumed: dict[str, Any] | None = None,
) -> dict[str, Any]:
    rc, lc, sync = cfg.rollout, cfg.learner, cfg.run.concurrency == "sync"
    # Synchronous mode admits exactly the batch being collected: nothing generates in the
    # background, so every trajectory is sampled by the policy it trains.
    lookahead = 0 if sync else lc.max_staleness
    group_size = cfg.algorithm.group_size if cfg.algorithm.name in ("grpo", "grpo_dis") else 1
    feed = PromptFeed(spec.task, prompt_rng, lc.batch_size, lookahead, learner.steps, started,
                      group_size=group_size)  # fmt: skip
    out: queue.Queue[Trajectory] = queue.Queue()
    limits = AgentLimits(cfg.model.max_seq_len, rc.max_new_tokens, spec.max_turns,
                         spec.max_tool_calls, (*spec.stop, *rc.stop),
                         env_timeout_s=spec.step_timeout_s)  # fmt: skip
    if rc.forced_length == "lognormal":  # benchmarks: long-tailed lengths, same in every mode
        limits.forced_length = lognormal_lengths(
            rc.forced_length_median, rc.forced_length_sigma, cfg.run.seed + 7
        )
    seeds = [cfg.run.seed + 1000 * i + learner.steps for i in range(rc.num_workers)]
    if isinstance(learner, RayLearner):  # rollout actors fed by this process's PromptFeed
        workers: list[Any] = learner.rollout_workers(feed, out, limits, seeds)
    else:

        def _worker(i: int, seed: int) -> RolloutWorker:
            engine = build_engine(cfg, learner.policy, tokenizer, seed=seed,
                                  version=learner.version)  # fmt: skip
            return RolloutWorker(engine, feed, tokenizer, out, spec.make_env, limits,
                                 name=f"rollout-{i}")  # fmt: skip

        workers = [_worker(i, s) for i, s in enumerate(seeds)]
    collector = BatchCollector(workers, feed, out, group_size, sync)
    collector.max_restarts = cfg.run.max_worker_restarts
    if isinstance(learner, RayLearner):
        collector.respawn = learner.respawn  # a new rollout actor (object-store weight sync)
    else:
        collector.respawn = lambda i: _worker(i, seeds[i] + 7919 * (collector.restarts + 1))
    if resumed is not None:  # finished-but-untrained trajectories back, in-flight re-issued
        restore_rollouts(resumed, workers, feed, out)
    if not sync:
        for w in workers:
            w.start()
    t0 = time.perf_counter()
    waited_total, dropped_total, last_eval = 0.0, 0, None
    metrics: dict[str, Any] = {}
    tok0 = sum(w.engine.tokens_generated for w in workers)
    try:
        while learner.steps < cfg.run.total_steps:
            t_step = time.perf_counter()
            trajs, dropped, waited, group_waits = collector.collect(
                learner.version, lc.batch_size, lc.max_staleness
            )
            feed.consume()
            waited_total += waited
            dropped_total += dropped
            stale = [t.staleness(learner.version) for t in trajs]
            batch = Batch.from_trajectories(trajs, tokenizer.pad_token_id)
            version_before = learner.version
            t_learn = time.perf_counter()
            metrics = learner.step(batch)
            if learner.version != version_before and learner.version % lc.push_every == 0:
                _push_weights(learner, workers)
            now = time.perf_counter()
            if sync:  # nothing generates while the learner trains
                for w in workers:
                    w.idle_s += now - t_learn
            elapsed = max(now - t0, 1e-9)
            rollout_idle = sum(w.idle_s for w in workers) / len(workers) / elapsed
            metrics.update({
                "step": learner.steps,
                "rollout/reward_mean": float(batch.scores.mean()),
                "rollout/response_len_mean": float(batch.action_mask.sum(-1).mean()),

                "async/staleness_mean": sum(stale) / len(stale),
                "async/staleness_max": max(stale),
                **{f"async/staleness_frac_{k}": stale.count(k) / len(stale)
                   for k in range(lc.max_staleness + 1)},  # histogram, one key per version
                "async/dropped_stale": dropped_total,
                "rollout/failed": collector.failed,
                "rollout/worker_restarts": collector.restarts,
                "rollout/prompt_too_long": collector.too_long,
                "perf/learner_idle_frac": waited_total / elapsed,
                "perf/rollout_idle_frac": rollout_idle,
                "perf/rollout_tokens_per_s":
                    (sum(w.engine.tokens_generated for w in workers) - tok0) / elapsed,
                "perf/step_s": now - t_step,
                "time/wall_s": now - t0,
            })  # fmt: skip
            if group_waits:
                metrics["async/group_wait_s"] = sum(group_waits) / len(group_waits)
            if spec.max_tool_calls:
                calls = [t.info.get("tool_calls", 0) for t in trajs]
                metrics["rollout/tool_calls_mean"] = sum(calls) / len(calls)
            ev = cfg.run.eval_every
            if learner.steps == cfg.run.total_steps or (ev and learner.steps % ev == 0):
                last_eval = _on_learner(learner, evaluate, tokenizer, spec, cfg)
                metrics.update(last_eval)
            # The metrics row goes first: a kill between the two leaves a row past the newest
            # checkpoint, which resume truncates and redoes; the other order would lose it.
            log.log(metrics)
            ck = cfg.run.checkpoint_every
            if learner.steps == cfg.run.total_steps or (ck and learner.steps % ck == 0):
                snap = snapshot_rollouts(workers, feed, out, collector.partial)
                _on_learner(learner, _checkpoint, run_dir, snap, extra)
            progress.update(learner.steps, metrics)
    finally:
        for w in workers:
            w.stop_thread()
            close = getattr(w.engine, "close", None)  # vLLM: abort, shut down, temp files
            if close is not None:
                close()
    return {
        **extra,
        "final_eval_accuracy": last_eval["eval/accuracy"] if last_eval else None,
        "final_eval_accuracy_greedy": last_eval["eval/accuracy_greedy"] if last_eval else None,
        "steps": learner.steps,
        "policy_version": learner.version,
        "dropped_stale": dropped_total,
        "learner_idle_frac": metrics.get("perf/learner_idle_frac"),
        "rollout_idle_frac": metrics.get("perf/rollout_idle_frac"),
    }


def _write_report(run_dir: Path) -> None:
    from saorl.report import report_run

    report_run(run_dir)
