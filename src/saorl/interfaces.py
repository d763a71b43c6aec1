"""The two interfaces the training loop (`saorl.loop`) is written against.

- `Learner`: where the policy and the critic live and train;
- `RolloutPool`: the rollout workers (an engine and the agent loop each) and the batches of
  finished trajectories they produce.

Where they run is an adapter's business, chosen once by `saorl.topology.build_topology`:

- one process (default): `saorl.learner.learner.Learner` and `saorl.rollout.pool.WorkerPool`
  (rollout worker threads);
- torchrun with `learner.fsdp`: `saorl.distributed.torchrun.LeaderLearner` (rank 0 of a sharded
  learner) and a `WorkerPool` on rank 0;
- Ray (`saorl train --ray`): `saorl.distributed.ray_learner.RayLearner` (learner actors) and
  `saorl.distributed.ray_pool.RayWorkerPool` (one rollout actor per worker).

A pool is built bound to its learner: it reads the learner's weights when it starts engines and
when `update_weights` pushes them.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from saorl.envs.base import EnvSpec
    from saorl.monitoring.metrics import TrainProgress
    from saorl.rollout.worker import PromptFeed
    from saorl.types import Batch, Collected, PoolStats


class Learner(Protocol):
    """The policy, its critic and their optimizers, wherever they are."""

    @property
    def steps(self) -> int:
        """Learner steps taken (critic warm-up steps included)."""
        ...

    @property
    def version(self) -> int:
        """Policy version: policy optimizer steps taken; engines tag tokens with it."""
        ...

    def warm_up(self, spec: EnvSpec, tokenizer: Any, progress: TrainProgress | None) -> None:
        """Supervised warm-up on the task's demonstrations, then the critic from the policy."""
        ...

    def load_critic(self, path: str) -> None:
        """Critic weights from `saorl value-pretrain` (`critic.init_from`)."""
        ...

    def evaluate(self, spec: EnvSpec, tokenizer: Any) -> dict[str, float]:
        """Held-out metrics of the current policy (`eval/accuracy`, ...)."""
        ...

    def step(self, batch: Batch) -> dict[str, Any]:
        """One learner step on a batch of finished trajectories; its metrics."""
        ...

    def save(self, run_dir: Path, rollout_state: dict[str, Any]) -> None:
        """Write a checkpoint of the learner, with the rollout side's state beside it."""
        ...

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint `save` wrote."""
        ...

    def export(self, tokenizer: Any, path: Path) -> None:
        """Write the policy in Hugging Face format."""
        ...

    def close(self) -> None:
        """Release processes, actors and process groups this learner holds."""
        ...


class RolloutPool(Protocol):
    """Rollout workers that turn admitted prompts into finished trajectories."""

    def start(
        self,
        spec: EnvSpec,
        feed: PromptFeed,
        resumed: dict[str, Any] | None,
        run_dir: Path | None = None,
    ) -> None:
        """Start the workers on tasks from `feed`, with engines at the learner's weights.

        `resumed` is a checkpoint whose rollout entries (`snapshot`) are put back first.
        `run_dir`: the run's folder, for workers that build their environments themselves
        (in other processes: `saorl.envs.factory.build_env`'s `run_dir`).
        """
        ...

    def collect(self, version: int, n: int, max_staleness: int) -> Collected:
        """The next `n` trainable trajectories in completion order (whole groups when the feed
        hands out groups), dropping those more than `max_staleness` versions behind
        `version`; then admits the next batch's prompts."""
        ...

    def update_weights(self) -> int:
        """Every engine to the learner's current weights; generations in flight continue.

        Returns the bytes of the weights one engine receives (a LoRA policy's adapters alone
        with `model.lora_push = "adapter"`): the loop logs them as `perf/push_bytes`."""
        ...

    def snapshot(self) -> dict[str, Any]:
        """The rollout side of a checkpoint: feed position, untrained and in-flight rollouts."""
        ...

    def stats(self) -> PoolStats:
        """Running totals for the step metrics."""
        ...

    def close(self) -> None:
        """Stop the workers and release their engines."""
        ...
