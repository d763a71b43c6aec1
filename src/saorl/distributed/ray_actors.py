"""The Ray actors of `saorl train --ray`: the learner and the rollout workers.

- `LearnerActor` owns policy, critic and both optimizers (a `saorl.learner.learner.Learner`, or the
  torchrun leader of `saorl.distributed.torchrun` when several actors shard one learner) and
  answers the methods of `saorl.interfaces.Learner`, each with the learner's counters; plus the
  weight-push endpoints the rollout pool uses. With `ray.critic_actor` the critic lives in
  `CriticActor`s instead, learner rank r's reached through a
  `saorl.distributed.ray_critic.RemoteCritic`.
- `CriticActor` (`ray.critic_actor`): a `saorl.learner.critic_updater.CriticUpdater` of its own;
  with several learner ranks, one rank of a critic group that shards it with FSDP2.
- `RolloutActor` owns an engine from `build_engine` and a `RolloutWorker` thread (agent loop +
  environments) that runs only tasks the driver admitted (its feed is a `_TaskInbox`).

The driver talks to them through `saorl.distributed.ray_learner.RayLearner` and the worker
proxies of `saorl.distributed.ray_pool`; neither class imports Ray, so both also run as plain
objects.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from saorl.config import Config, RunConfig
from saorl.rollout.worker import AgentLimits
from saorl.types import Batch, Trajectory


def _setup_process(run: RunConfig, cwd: str) -> None:
    import torch

    # Relative paths in the config (run directory, data, model) mean what they mean for the
    # driver, whenever this node has the driver's directory (same machine or a shared disk).
    if os.path.isdir(cwd):
        os.chdir(cwd)
    torch.set_num_threads(run.torch_threads)
    torch.manual_seed(run.seed)


class LearnerActor:
    """One learner rank in its own process, plus a weight-push endpoint.

    With one rank it holds a plain `saorl.learner.learner.Learner`. With `ray.learner_ranks` N > 1
    the N actors form a `torch.distributed` group (`learner.fsdp`: FSDP2 over them) and run the
    torchrun protocol of `saorl.distributed.torchrun`: rank 0 holds a `LeaderLearner` and answers
    the driver; the other ranks stay inside `setup`, mirroring rank 0's collective calls, until
    rank 0's learner is closed. With `ray.critic_actor` rank r's critic is critic actor r
    (`critics`, one per rank; several: a critic group, `saorl.distributed.ray_critic`).
    """

    def __init__(self, cfg: Config, cwd: str, critics: Sequence[Any] = ()) -> None:
        _setup_process(cfg.run, cwd)
        self.cfg = cfg
        self.critics = list(critics)  # CriticActor handles (`ray.critic_actor`), by rank
        self.grouped = len(self.critics) > 1  # learner ranks with a critic group
        self.learner: Any = None
        self.group: Any = None
        self.meta: Any = None
        self._spec: Any = None  # the task, built here on first use (`env_spec`)

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: where rank 0 hosts the learners' rendezvous."""
        from saorl.distributed.weight_sync import free_port, node_ip

        return node_ip(), free_port()

    def setup(self, rank: int, world: int, host: str, port: int) -> tuple[int, int] | None:
        """Build the learner; rank 0 returns its counters, the others return when it closes."""
        from saorl.learner.learner import Learner
        from saorl.models.loading import load_policy, resolve_device

        cfg = self.cfg
        device = resolve_device(self.cfg.model.device)
        policy, self.tokenizer = load_policy(cfg.model)  # same seed: same init as one process
        remote = None
        if self.critics:
            from saorl.distributed.ray_critic import RemoteCritic

            role = f"critic rank {rank}" if self.grouped else "critic"
            remote = RemoteCritic(self.critics[rank], role)
        if world == 1:
            self.learner = Learner(cfg, policy, device, critic=remote)
            return self.counters()
        import torch.distributed as dist

        from saorl.distributed.ray_critic import group_learner
        from saorl.distributed.torchrun import torchrun_learner

        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(
            backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world
        )
        # Ranks > 0 follow rank 0 in there until the run ends, then get None.
        if remote is None:
            self.learner = torchrun_learner(cfg, policy, device)
        else:
            self.learner = group_learner(cfg, policy, device, remote)
        return self.counters() if rank == 0 else None

    def close_learner(self) -> None:
        """End the followers' loop (multi-rank learners)."""
        self.learner.close()

    def get_tokenizer(self) -> Any:
        return self.tokenizer

    def counters(self) -> tuple[int, int]:
        return self.learner.steps, self.learner.version

    # -- saorl.interfaces.Learner, each answered with the counters after it ----------------------
    def env_spec(self) -> Any:
        """The task, built here from env.name (what the driver has may not unpickle here)."""
        if self._spec is None:
            from saorl.envs.factory import build_env

            self._spec = build_env(self.cfg.env)
        return self._spec

    def warm_up(self, tokenizer: Any) -> tuple[None, int, int]:
        return self.learner.warm_up(self.env_spec(), tokenizer, None), *self.counters()

    def load_critic(self, path: str) -> tuple[None, int, int]:
        if self.grouped:  # every critic rank takes part; the learner ranks hold no critic
            from saorl.distributed.ray_critic import call_group

            return call_group(self.critics, "load", path), *self.counters()
        return self.learner.load_critic(path), *self.counters()

    def evaluate(self, tokenizer: Any) -> tuple[dict[str, float], int, int]:
        return self.learner.evaluate(self.env_spec(), tokenizer), *self.counters()

    def step(self, batch: Batch) -> tuple[dict[str, Any], int, int]:
        return self.learner.step(batch), *self.counters()

    def save(self, run_dir: Path, rollout_state: dict[str, Any]) -> tuple[None, int, int]:
        if self.grouped:  # a whole checkpoint (saorl.distributed.ray_critic)
            from saorl.distributed.ray_critic import save_whole

            return save_whole(self.learner, self.cfg.run, run_dir, rollout_state), *self.counters()
        return self.learner.save(run_dir, rollout_state), *self.counters()

    def restore(self, state: dict[str, Any]) -> tuple[None, int, int]:
        if self.grouped:
            from saorl.distributed.ray_critic import check_whole

            check_whole(state)
        return self.learner.restore(state), *self.counters()

    def export(self, tokenizer: Any, path: Path) -> tuple[None, int, int]:
        return self.learner.export(tokenizer, path), *self.counters()

    def call(self, fn: Callable[..., Any], args: tuple) -> tuple[Any, int, int]:
        """`fn(learner, *args)`: for tests and tools."""
        return fn(self.learner, *args), *self.counters()

    # -- weight pushes (saorl.distributed.ray_pool) ------------------------------------------
    def policy_state(self) -> dict[str, Any]:
        """Full policy weights on CPU (LoRA merged)."""
        return {k: v.detach().cpu() for k, v in self.learner.policy_state().items()}

    def push_state(self, full: bool) -> dict[str, Any]:
        """What a push sends, on CPU: the object every rollout actor loads. `full`: also the
        base weights a LoRA policy's adapter pushes leave out (`Learner.push_state`)."""
        return {k: v.detach().cpu() for k, v in self.learner.push_state(full).items()}

    def versioned_push_state(self) -> tuple[dict[str, Any], int]:
        """A full push and the policy version it holds, read together (between two learner
        calls): what a replacement rollout actor loads while the loop goes on."""
        return self.push_state(True), self.learner.version

    def push_metas(self) -> dict[bool, Any]:
        """The weight meta of a full push (True) and of the others (False)."""
        from saorl.distributed.weight_sync import weight_meta

        return {full: weight_meta(self.learner.push_state(full)) for full in (True, False)}

    def group_address(self) -> tuple[str, int, str, Any]:
        """`(node ip, free port, backend, weight metas)` for forming the broadcast group."""
        from saorl.distributed.weight_sync import free_port, node_ip

        self.meta = self.push_metas()
        backend = "nccl" if self.learner.device.type == "cuda" else "gloo"
        return node_ip(), free_port(), backend, self.meta

    def join_group(self, host: str, port: int, world: int, backend: str, timeout: float) -> None:
        from saorl.distributed.weight_sync import BroadcastGroup

        self.group = BroadcastGroup(host, port, 0, world, backend, timeout)

    def broadcast_weights(self, full: bool = False) -> None:
        self.group.send(self.learner.push_state(full), self.meta[full])


class CriticActor:
    """A `CriticUpdater` in its own process; every answer is on CPU.

    Built by `setup`: for one learner rank alone (`world` 1), or as rank `rank` of a critic group
    of `world` actors, which form a `torch.distributed` group of their own (rendezvous at
    `host:port`, critic rank 0's) and shard the critic with FSDP2 over it. In a group every
    method but `call` is collective: each learner rank calls its own critic rank.
    """

    def __init__(self, cfg: Config, cwd: str) -> None:
        _setup_process(cfg.run, cwd)
        self.cfg = cfg
        self.updater: Any = None

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port: where critic rank 0 hosts the group's rendezvous."""
        from saorl.distributed.weight_sync import free_port, node_ip

        return node_ip(), free_port()

    def setup(self, rank: int, world: int, host: str, port: int) -> None:
        from saorl.learner.critic_updater import CriticUpdater
        from saorl.learner.sharding import Sharding
        from saorl.models.loading import load_policy, resolve_device

        cfg = self.cfg
        # Built like the learner builds its critic: from the same seeded policy.
        policy, _ = load_policy(cfg.model)
        device = resolve_device(cfg.critic.device or cfg.model.device)
        sharding = Sharding()
        if world > 1:
            from saorl.distributed.ray_critic import join_critic_group

            device, sharding = join_critic_group(
                cfg.learner.mixed_precision, device, rank, world, host, port
            )
        # Its updates are already beside the policy's: no thread of its own here.
        self.updater = CriticUpdater(cfg, policy.to(device), device, sharding, concurrent=False)

    @staticmethod
    def _cpu(tree: Any) -> Any:
        from saorl.distributed.ray_critic import to_cpu

        return to_cpu(tree)

    def prepare(self, batch: Batch) -> tuple[Any, dict[str, Any]]:
        return self._cpu(self.updater.prepare(batch))

    def update(self) -> Any:
        self.updater.start_update()
        return self._cpu(self.updater.finish())

    def reset_from_policy(self, backbone: dict[str, Any]) -> None:
        self.updater.reset_from_policy(backbone)

    def state_dict(self) -> dict[str, Any]:
        return self._cpu(self.updater.state_dict())

    def load_state(self, state: dict[str, Any]) -> None:
        self.updater.load_state(state)

    def load(self, path: str) -> None:
        if self.updater.sharding.sharded:
            from saorl.distributed.ray_critic import load_into_group

            load_into_group(self.updater, path)
        else:
            self.updater.load(path)

    def call(self, fn: Callable[..., Any], args: tuple) -> Any:
        """`fn(updater, *args)`: for tests and tools (in a group, on every rank at once if `fn`
        makes a collective call: `saorl.distributed.ray_critic.call_group`)."""
        return fn(self.updater, *args)


class _TaskInbox:
    """The rollout actor's side of admission control: tasks the driver already admitted."""

    def __init__(self) -> None:
        self.items: deque[tuple[Any, int]] = deque()
        self.cond = threading.Condition()

    def put(self, tasks: Sequence[tuple[Any, int]]) -> None:
        with self.cond:
            self.items.extend(tasks)
            self.cond.notify_all()

    def next(self) -> tuple[Any, int] | None:
        with self.cond:
            return self.items.popleft() if self.items else None

    def release(self) -> None:
        """Re-admission is the driver's business (its `PromptFeed`)."""


class RolloutActor:
    """One engine and one `RolloutWorker`, fed with tasks by the driver's pump thread."""

    def __init__(
        self,
        cfg: Config,
        cwd: str,
        name: str,
        seed: int,
        tokenizer: Any,
        limits: AgentLimits,
        run_dir: Path | None = None,
    ) -> None:
        from saorl.engines.factory import build_engine
        from saorl.envs.factory import build_env
        from saorl.models.loading import load_policy, resolve_device
        from saorl.rollout.worker import RolloutWorker

        _setup_process(cfg.run, cwd)
        # The initial weights do not matter: the driver pushes the learner's before any work.
        policy, _ = load_policy(cfg.model)
        if cfg.model.lora_push == "adapter":  # the learner's layout: its pushes are adapters
            from saorl.models.lora import add_lora

            add_lora(policy, cfg.model)
        if cfg.rollout.engine == "hf":  # it samples from a copy of this module, on its device;
            policy.to(resolve_device(cfg.model.device))  # vLLM only reads config and weights
        self.engine = build_engine(cfg, policy, tokenizer, seed=seed, version=0)
        del policy
        spec = build_env(cfg.env, run_dir=run_dir)  # the run's folder: agent programs' files
        self.inbox = _TaskInbox()
        self.out: queue.Queue[Trajectory] = queue.Queue()
        self.worker = RolloutWorker(
            self.engine,
            self.inbox,
            tokenizer,
            self.out,  # type: ignore[arg-type]
            spec.make_env,
            limits,
            name=name,
        )
        self.group: Any = None

    def _room(self) -> int:
        return max(0, self.worker.limits_concurrency() - self.worker.active - len(self.inbox.items))

    def _report(self) -> tuple[list[Trajectory], int, float, int]:
        if self.worker.error is not None:
            raise RuntimeError(f"{self.worker.name} failed: {self.worker.error!r}") from (
                self.worker.error
            )
        done = []
        while True:
            try:
                done.append(self.out.get_nowait())
            except queue.Empty:
                break
        return done, self._room(), self.worker.idle_s, self.engine.tokens_generated

    def ready(self) -> int:
        return self._room()

    def start(self) -> None:
        self.worker.start()

    def stop(self) -> None:
        self.worker.stop_thread()

    def exchange(self, tasks: list[tuple[Any, int]], wait_s: float) -> tuple:
        """Take admitted tasks; return what finished (waiting up to `wait_s` for one)."""
        self.inbox.put(tasks)
        try:
            first = [self.out.get(timeout=wait_s)]
        except queue.Empty:
            first = []
        done, *rest = self._report()
        return first + done, *rest

    def step_once(self, tasks: list[tuple[Any, int]]) -> tuple:
        """Synchronous mode: start the tasks, run one decoding step, report."""
        self.inbox.put(tasks)
        self.worker.fill()
        self.worker.step()
        return self._report()

    def pause(self) -> list[Trajectory]:
        """Hold the worker between two steps (checkpoint); return what finished meanwhile."""
        self._paused = contextlib.ExitStack()
        self._paused.enter_context(self.worker.paused())
        return self._report()[0]

    def unpause(self) -> None:
        self._paused.close()

    def update_weights(self, state: dict[str, Any], version: int) -> None:
        self.engine.update_weights(state, version)

    def update_weights_versioned(self, pushed: tuple[dict[str, Any], int]) -> int:
        """Load `LearnerActor.versioned_push_state`'s answer; the version loaded."""
        state, version = pushed
        self.engine.update_weights(state, version)
        return version

    def join_group(
        self, host: str, port: int, rank: int, world: int, backend: str, meta: Any, timeout: float
    ) -> None:
        from saorl.distributed.weight_sync import BroadcastGroup

        self.group = BroadcastGroup(host, port, rank, world, backend, timeout)
        self.meta = meta

    def receive_weights(self, version: int, full: bool = False) -> None:
        self.engine.update_weights(self.group.receive(self.meta[full]), version)

    def engine_state(self) -> dict[str, Any]:
        """The weights the engine samples with next, on CPU (engines with a torch `model`).

        For checks, with the worker idle: an empty step first loads a queued weight update.
        """
        if self.engine.num_unfinished() == 0:
            self.engine.step()
        return {k: v.detach().cpu() for k, v in self.engine.model.state_dict().items()}
