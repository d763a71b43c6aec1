"""The rollout pool of one process: `rollout.num_workers` rollout workers, one engine each.

Each `RolloutWorker` thread keeps its engine full of episodes (agent loop + environment) from the
shared `PromptFeed`, under admission control, and puts finished trajectories on one queue; a
`BatchCollector` forms the learner's batches from it (completion order, whole groups, the
staleness drop) and has crashed workers replaced (`respawn`). With `run.concurrency = "sync"`
no thread runs: `collect` drives the workers itself, so nothing generates while the learner
trains. A checkpoint pauses the workers and records what they hold (`saorl.rollout.resume`).

`WorkerPool` implements `saorl.interfaces.RolloutPool` for a learner in the same process
(`saorl.learner.learner.Learner`, or the torchrun leader's replica). `RayWorkerPool`
(`saorl.distributed.ray_pool`) is the same pool with workers that are proxies of Ray actors,
and `ProcWorkerPool` (`saorl.distributed.proc_pool`, `run.concurrency = "process"`) with
proxies of child processes: they change how workers are built and how weights reach them.
"""

from __future__ import annotations

import queue
import time
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from saorl.config import Config
from saorl.engines.factory import build_engine
from saorl.envs.base import EnvSpec
from saorl.models.lora import state_bytes
from saorl.rollout.collector import BatchCollector
from saorl.rollout.lengths import lognormal_lengths
from saorl.rollout.resume import restore_rollouts, snapshot_rollouts
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from saorl.types import Collected, PoolStats, Trajectory


class PolicySource(Protocol):
    """What a pool in the learner's process reads from the learner."""

    @property
    def policy(self) -> nn.Module:
        """The whole (unsharded) policy: what new engines copy."""
        ...

    @property
    def version(self) -> int: ...

    def push_state(self, full: bool = False) -> dict[str, torch.Tensor]:
        """What a push sends: the current policy weights, or a LoRA policy's adapters
        (`saorl.learner.learner.Learner.push_state`)."""
        ...


def agent_limits(cfg: Config, spec: EnvSpec) -> AgentLimits:
    """Per-episode budgets of training rollouts."""
    rc = cfg.rollout
    limits = AgentLimits(
        cfg.model.max_seq_len,
        rc.max_new_tokens,
        spec.max_turns,
        spec.max_tool_calls,
        (*spec.stop, *rc.stop),
        env_timeout_s=spec.step_timeout_s,
        score_truncated=rc.score_truncated,
        max_agent_processes=rc.max_agent_processes,
    )
    if rc.forced_length == "lognormal":  # benchmarks: long-tailed lengths, same in every mode
        limits.forced_length = lognormal_lengths(
            rc.forced_length_median, rc.forced_length_sigma, cfg.run.seed + 7
        )
    return limits


class WorkerPool:
    """Rollout workers in this process (threads), with engines built from the learner's policy."""

    def __init__(self, cfg: Config, tokenizer: Any, learner: PolicySource) -> None:
        self.cfg = cfg
        self.tokenizer = tokenizer
        self.learner = learner
        self.sync = cfg.run.concurrency == "sync"
        self.workers: list[Any] = []
        self.out: queue.Queue[Trajectory] = queue.Queue()
        # Synchronous mode: engines are idle from the end of one `collect` to the next.
        self._sync_idle_s = 0.0
        self._since_collect = None

    def start(
        self,
        spec: EnvSpec,
        feed: PromptFeed,
        resumed: dict[str, Any] | None,
        run_dir: Path | None = None,
    ) -> None:
        self.spec = spec
        self.feed = feed
        self.run_dir = run_dir
        self.limits = agent_limits(self.cfg, spec)
        # Seeded by the step the run starts at, so a resumed run does not replay the streams
        # of the first one.
        n = self.cfg.rollout.num_workers
        self.seeds = [self.cfg.run.seed + 1000 * i + feed.consumed for i in range(n)]
        self.workers = self._spawn_all()
        self.collector = BatchCollector(self.workers, feed, self.out, feed.group_size, self.sync)
        self.collector.max_restarts = self.cfg.run.max_worker_restarts
        self.collector.respawn = self.respawn
        if resumed is not None:  # finished-but-untrained trajectories back, in-flight re-issued
            restore_rollouts(resumed, self.workers, feed, self.out)
        if not self.sync:
            for w in self.workers:
                w.start()

    def _spawn_all(self) -> list[Any]:
        return [self._worker(i, seed) for i, seed in enumerate(self.seeds)]

    def _worker(self, i: int, seed: int) -> Any:
        engine = build_engine(
            self.cfg, self.learner.policy, self.tokenizer, seed=seed, version=self.learner.version
        )
        return RolloutWorker(
            engine,
            self.feed,
            self.tokenizer,
            self.out,
            self.spec.make_env,
            self.limits,
            name=f"rollout-{i}",
        )

    def respawn(self, i: int) -> Any:
        """Worker `i` anew, at the learner's current weights, after a crash (the collector's
        hook; it re-issues the dead worker's episodes and counts the restart)."""
        return self._worker(i, self._restart_seed(i))

    def _restart_seed(self, i: int) -> int:
        return self.seeds[i] + 7919 * (self.collector.restarts + 1)

    def collect(self, version: int, n: int, max_staleness: int) -> Collected:
        if self.sync and self._since_collect is not None:
            self._sync_idle_s += time.perf_counter() - self._since_collect
        trajs, dropped, waited, group_waits = self.collector.collect(version, n, max_staleness)
        self.feed.consume()  # the learner took a batch: admit the next one
        self._since_collect = time.perf_counter()
        return Collected(trajs, dropped, waited, group_waits, self.collector.recent_failed)

    def update_weights(self) -> int:
        """Push to every engine; the bytes one engine receives. Engines here were copied from
        the learner's policy, so a LoRA policy's pushes are its adapters alone."""
        state = self.learner.push_state()
        for w in self.workers:
            w.engine.update_weights(state, self.learner.version)
        return state_bytes(state)

    def snapshot(self) -> dict[str, Any]:
        return snapshot_rollouts(self.workers, self.feed, self.out, self.collector.partial)

    def stats(self) -> PoolStats:
        idle = sum(w.idle_s for w in self.workers) / len(self.workers)
        if self.sync and self._since_collect is not None:
            idle += self._sync_idle_s + time.perf_counter() - self._since_collect
        c = self.collector
        tokens = sum(w.engine.tokens_generated for w in self.workers)
        return PoolStats(c.failed, c.restarts, c.too_long, idle, tokens, dict(c.failures.counts))

    def close(self) -> None:
        for w in self.workers:
            w.stop_thread()
            w.engine.close()  # vLLM: abort what runs, shut down, remove temporary files
