"""Learner batches from finished trajectories: completion order, whole groups, staleness drop,
and the replacement of crashed rollout workers. Used by the rollout pools
(`saorl.rollout.pool`)."""

from __future__ import annotations

import queue
import sys
import time
from collections.abc import Callable
from typing import Any

from saorl.config import ConfigError
from saorl.rollout.episode import UNTRAINABLE
from saorl.rollout.failures import FailureLog
from saorl.rollout.worker import PromptFeed, RolloutWorker
from saorl.types import Trajectory

# A batch that takes this long to form (or 3x the slowest one before it): say what its
# episodes are doing, again at doubling intervals; programs that hang look like a stuck run.
QUIET_S = 60.0


def episodes(trajs: list[Trajectory]) -> float:
    """How many episodes `trajs` are: an agent episode whose history was rewritten is several
    trajectories (segments, `agent/segments` in each one's info), together one episode, so
    one member of its group (docs/agents.md)."""
    return sum(1 / max(1, int(t.info.get("agent/segments", 1))) for t in trajs)


class BatchCollector:
    """Forms learner batches from finished trajectories, in completion order.

    Single-rollout algorithms take the first `n` fresh-enough trajectories. Group algorithms
    (GRPO) take whole groups of episodes (an agent episode's segments are one member, all of
    its trajectories in the batch): a group is ready when its last member finishes (the hidden
    barrier the paper measures: `async/group_wait_s` is the time from its first member
    finishing to its last), and is dropped whole if any member failed or is too stale.
    Every dropped rollout frees its admission slot so a replacement can start.
    """

    def __init__(
        self,
        workers: list[RolloutWorker],
        feed: PromptFeed,
        out: queue.Queue[Trajectory],
        group_size: int,
        sync: bool,
    ) -> None:
        self.workers = workers
        self.feed = feed
        self.out = out
        self.group_size = group_size
        self.sync = sync
        self.partial: dict[int, list[Trajectory]] = {}
        self.first_done: dict[int, float] = {}
        self.failed = 0  # rollouts ended by an environment error or an abort (not trained)
        self.respawn: Callable[[int], Any] | None = None  # builds worker i anew after a crash
        self.max_restarts = 0
        self.restarts = 0
        self.too_long = 0  # prompts that filled the context before any token was generated
        self._too_long_streak = 0
        self.failures = FailureLog()  # env_error messages, printed once each and counted
        self.batches = 0  # batches formed; the first one is checked for mostly failures
        self.recent_failed: list[Trajectory] = []  # the current batch's failures (a few)
        self._unreleased = 0.0  # dropped episodes' shares not yet released (`_drop`)
        self._uncharged = 0.0  # batched segments' extra shares not yet charged (`_charge`)
        self.slowest = 0.0  # seconds the slowest batch so far took to form

    def _next(self) -> Trajectory | None:
        for w in self.workers:
            if self.sync:  # synchronous mode: the learner is idle for as long as generation runs
                try:
                    w.fill()
                    w.step()
                except Exception as e:  # handled like a worker thread's crash, just below
                    w.error = e
        for i, w in enumerate(self.workers):
            if w.error is not None:
                self._restart(i, w)
        try:
            return self.out.get(timeout=0.0 if self.sync else 1.0)
        except queue.Empty:
            return None

    def _restart(self, i: int, dead: Any) -> None:
        """Replace a worker whose thread (or actor) died: its episodes are re-issued to the new
        one, which samples from the current weights; past `run.max_worker_restarts`, fail."""
        if self.respawn is None or self.restarts >= self.max_restarts:
            raise RuntimeError(
                f"{dead.name} failed ({self.restarts} restarts so far, run.max_worker_restarts="
                f"{self.max_restarts}): {type(dead.error).__name__}: {dead.error}"
            ) from dead.error
        self.restarts += 1
        print(
            f"saorl: {dead.name} failed ({type(dead.error).__name__}: {dead.error}); "
            f"restarting it ({self.restarts}/{self.max_restarts})",
            file=sys.stderr,
        )
        dead.stop_thread()
        self.feed.reissue(dead.in_flight())
        self.workers[i] = self.respawn(i)
        if not self.sync:
            self.workers[i].start()

    def _say_waiting(self, waited_s: float, have: int, n: int) -> None:
        doing = [w.describe() for w in self.workers if isinstance(w, RolloutWorker)]
        last = self.recent_failed[-1].info.get("error") if self.recent_failed else None
        print(
            f"saorl: no batch for {waited_s:.0f} s ({have} of {n} trajectories)"
            + "".join(f"; {d}" for d in doing)
            + (f"; last failure: {last}" if last else ""),
            file=sys.stderr,
            flush=True,
        )

    def _check_prompt_length(self, traj: Trajectory, n: int) -> None:
        """Count prompts longer than the context (trained as empty rollouts: no gradient); a long
        run of nothing else means the data does not fit the model, which is an input error."""
        if traj.stop_reason != "context" or traj.completion_ids:
            self._too_long_streak = 0
            return
        self.too_long += 1
        self._too_long_streak += 1
        if self._too_long_streak >= max(4 * n, 64):
            raise ConfigError(
                f"the last {self._too_long_streak} prompts were all longer than the context "
                f"({traj.info.get('error', '')}): raise model.max_seq_len or drop long problems "
                "from the dataset"
            )

    def _charge(self, members: list[Trajectory]) -> None:
        # A batched episode of k segments takes k places in batches for its one admission:
        # the k - 1 extra are charged to admission (1 - 1/k a segment, in whole units).
        self._uncharged += len(members) - episodes(members)
        if self._uncharged > 1 - 1e-6:
            whole = int(self._uncharged + 1e-6)
            self._uncharged -= whole
            self.feed.charge(whole)

    def _drop(self, members: list[Trajectory]) -> None:
        # Admission counts episodes: an agent episode of k segments frees one slot, 1/k a
        # segment (`episodes`), so whole slots are released as the shares add up.
        self._unreleased += episodes(members)
        while self._unreleased > 1 - 1e-6:
            self._unreleased -= 1
            self.feed.release()

    def collect(
        self, version: int, n: int, max_staleness: int
    ) -> tuple[list[Trajectory], int, float, list[float]]:
        """`(batch, dropped as too stale, seconds waited, group waits in seconds)`."""
        batch: list[Trajectory] = []
        dropped = 0
        waited = 0.0
        group_waits = []
        judged = errored = 0
        self.recent_failed = []
        start = time.perf_counter()
        quiet = max(QUIET_S, 3 * self.slowest)
        while len(batch) < n:
            t0 = time.perf_counter()
            traj = self._next()
            waited += time.perf_counter() - t0
            if t0 - start > quiet:
                self._say_waiting(t0 - start, len(batch), n)
                quiet *= 2
            if traj is None:
                continue
            self._check_prompt_length(traj, n)
            self.failures.record(traj)
            if traj.stop_reason == "env_error":
                errored += 1
                if len(self.recent_failed) < 4:
                    self.recent_failed.append(traj)
            judged += traj.stop_reason not in ("length", "context", "aborted")
            if self.batches == 0:
                self.failures.check_first_batch(errored, judged, n, formed=False)
            members = [traj]
            if self.group_size > 1:
                g = traj.group_id
                self.first_done.setdefault(g, time.perf_counter())
                self.partial.setdefault(g, []).append(traj)
                if episodes(self.partial[g]) < self.group_size - 1e-6:
                    continue
                members = self.partial.pop(g)
                group_waits.append(time.perf_counter() - self.first_done.pop(g))
            if any(t.stop_reason in UNTRAINABLE for t in members):
                self.failed += sum(t.stop_reason in UNTRAINABLE for t in members)
                self._drop(members)  # infrastructure failure: says nothing about the policy
                continue
            if max(t.staleness(version) for t in members) > max_staleness:
                dropped += len(members)  # the safety net behind admission control
                self._drop(members)
                continue
            batch.extend(members)
            self._charge(members)
        if self.batches == 0:
            self.failures.check_first_batch(errored, judged, n, formed=True)
        self.batches += 1
        self.slowest = max(self.slowest, time.perf_counter() - start)
        return batch, dropped, waited, group_waits
