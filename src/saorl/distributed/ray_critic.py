"""The critic in Ray actors of its own (`ray.critic_actor`): the learner's `RemoteCritic`.

SAO's learner step asks the critic for the advantages (values before any update, then GAE) and
then gives it K updates on the same batch, which are independent of the policy's update
(`saorl.learner.critic_updater`). With `ray.critic_actor` the critic, its optimizer and its updates
live in critic actors with resources of their own (`ray.critic_num_cpus`, `ray.critic_num_gpus`;
`ray.critic_placement` puts them beside the learner on one node, or apart on another; the actor
class is `saorl.distributed.ray_actors.CriticActor`). Each learner actor holds a `RemoteCritic`,
which answers the `CriticUpdater` methods the learner calls:

- `prepare(batch)`: one round trip; the batch goes to the critic actor, the advantages and two
  metrics come back; the values and targets stay there;
- `start_update()`: starts the K updates remotely and returns at once, so the learner actor
  runs its policy update meanwhile; `finish()` waits for the result.

The step therefore costs the longer of the two updates plus one batch transfer, rather than
their sum. Checkpoints (`state_dict` / `load_state`: the same `critic` and `critic_opt` entries),
the critic reset after the supervised warm-up (the policy's backbone is sent over) and
`critic.init_from` go through the same object. The actors build the critic like the learner
would (the same seed gives the same initial weights).

One learner rank: one unsharded critic actor. With `ray.learner_ranks` N > 1 there are N critic
actors, a critic group: they form a `torch.distributed` group of their own (a rendezvous apart
from the learner ranks', on critic rank 0's node) and shard the critic with FSDP2 over it
(`saorl.distributed.fsdp.FSDPSharding`). Learner rank r talks to critic rank r only. Every
learner rank holds the whole batch and makes every critic call (a step, a state gather or load,
the reset), each to its own critic rank, so the critic ranks make their collective calls
together: `prepare` gathers the values, so every critic rank returns the whole advantages;
`finish` returns the rank's share of the value loss, which the learner ranks' metric sync sums
into the batch's loss (`saorl.learner.sharding.StepMetrics.add`), as for a critic sharded over the
learner ranks. What only learner rank 0 asks for goes to every critic rank from there
(`call_group`: `critic.init_from`, whose file rank 0 reads and broadcasts, `load_into_group`).

Checkpoints of learner ranks with a critic group are whole (`save_whole`): the learner's
`state_dict` gathers the policy over the learner ranks and the critic over the critic ranks
onto rank 0, which writes one `.pt` with `critic` / `critic_opt` entries as a critic sharded
over the learner ranks gathers them (FSDP2 names the optimizer's parameters). A learner in one
process reads it as it reads its own, and sharded learners through `LeaderLearner.restore`,
which broadcasts it into the shards (tested: one process and a critic group). A sharded
checkpoint (torch.distributed.checkpoint, written by learner ranks that hold the critic) is
refused by a critic group (`check_whole`): its readers load the critic's shards into learner
ranks.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from saorl.config import Config, ConfigError, RunConfig
from saorl.learner.critic_updater import CriticUpdate
from saorl.learner.sharding import Sharding
from saorl.types import Batch


def to_cpu(tree: Any) -> Any:
    """Tensors of a nested dict/list on CPU (what crosses to another actor)."""
    if isinstance(tree, dict):
        return {k: to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, tuple) and hasattr(tree, "_fields"):  # a NamedTuple
        return type(tree)(*(to_cpu(v) for v in tree))
    if isinstance(tree, list | tuple):
        return type(tree)(to_cpu(v) for v in tree)
    return tree.detach().cpu() if isinstance(tree, torch.Tensor) else tree


def _get(ref: Any, role: str) -> Any:
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayActorError as e:
        raise RuntimeError(f"{role}: the Ray actor died: {e}") from e


def call_group(actors: Sequence[Any], method: str, *args: Any) -> Any:
    """`method(*args)` on every critic actor at once (a collective call, for a critic group);
    critic rank 0's answer (its error first, when it fails)."""
    refs = [getattr(a, method).remote(*args) for a in actors]
    first = _get(refs[0], "critic rank 0" if len(refs) > 1 else "critic")
    for r, ref in enumerate(refs[1:], 1):
        _get(ref, f"critic rank {r}")
    return first


class RemoteCritic:
    """The learner actor's side: `CriticUpdater`'s methods, answered by a `CriticActor`."""

    def __init__(self, actor: Any, role: str = "critic") -> None:
        self.actor = actor  # role: "critic", or "critic rank R" in a group
        self.role = role
        self._pending: Any = None

    def _get(self, ref: Any) -> Any:
        return _get(ref, self.role)

    def prepare(
        self, batch: Batch, micro: Any = None
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return self._get(self.actor.prepare.remote(batch.to(torch.device("cpu"))))

    def start_update(self) -> None:
        self._pending = self.actor.update.remote()

    def finish(self) -> CriticUpdate:
        ref, self._pending = self._pending, None
        if ref is None:
            raise RuntimeError("RemoteCritic.finish without start_update")
        return self._get(ref)

    def reset_from_policy(self, backbone: dict[str, torch.Tensor]) -> None:
        self._get(self.actor.reset_from_policy.remote(to_cpu(backbone)))

    def state_dict(self) -> dict[str, Any]:
        return self._get(self.actor.state_dict.remote())

    def load_state(self, state: dict[str, Any]) -> None:
        critic = {k: state[k] for k in ("critic", "critic_opt") if k in state}
        self._get(self.actor.load_state.remote(critic))

    def load(self, path: str) -> None:
        self._get(self.actor.load.remote(path))

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self._get(self.actor.call.remote(fn, args))

    def close(self) -> None:
        """The driver's `RayLearner` ends the actor."""


# -- a critic group (ray.learner_ranks > 1) ----------------------------------------------------
def join_critic_group(
    mixed_precision: str, device: torch.device, rank: int, world: int, host: str, port: int
) -> tuple[torch.device, Sharding]:
    """This critic rank's device and sharding: FSDP2 over the critic actors' process group
    (this process's default group; the learner ranks' group lives in other processes), in
    `learner.mixed_precision`."""
    import torch.distributed as dist

    from saorl.distributed.fsdp import FSDPSharding

    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(
        backend, init_method=f"tcp://{host}:{port}", rank=rank, world_size=world
    )
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    return device, FSDPSharding(mixed_precision, device)


def read_critic_file(path: str, critic: nn.Module) -> dict[str, torch.Tensor]:
    """The `critic` weights of a `saorl value-pretrain` file, checked against `critic`'s names
    and whole shapes (what `CriticUpdater.load` finds out by loading them)."""
    from saorl.checkpoint.io import load_state_file

    if not Path(path).is_file():
        raise ConfigError(
            f"critic.init_from: no file {path!r} (write one with saorl value-pretrain)"
        )
    state = load_state_file(path).get("critic")
    want = {k: tuple(v.shape) for k, v in critic.state_dict().items()}  # DTensors: whole shapes
    got = {k: tuple(v.shape) for k, v in state.items()} if isinstance(state, dict) else {}
    if got != want:
        misfit = sorted(set(want) ^ set(got)) or sorted(k for k in want if want[k] != got[k])
        raise ConfigError(
            f"critic.init_from: {path} does not fit this model (a 'critic' entry with other "
            f"weights: {', '.join(misfit[:3]) or 'none'}{' ...' if len(misfit) > 3 else ''})"
        )
    return state


def load_into_group(updater: Any, path: str) -> None:
    """`CriticUpdater.load` for a critic sharded over a critic group (every rank calls it).

    Rank 0 reads and checks the file and tells the others whether it could, before the weights
    are broadcast into every rank's shards: no rank is left waiting in a broadcast for a rank
    that failed. The optimizer stays as it is (fresh: this runs before the first step).
    """
    import torch.distributed as dist

    state: dict[str, Any] = {}
    error: Exception | None = None
    if dist.get_rank() == 0:
        try:
            state = read_critic_file(path, updater.critic)
        except Exception as e:  # reported to every rank first
            error = e
    msg = [None if error is None else f"{type(error).__name__}: {error}"]
    dist.broadcast_object_list(msg, src=0)
    if error is not None:
        raise error
    if msg[0] is not None:
        raise ConfigError(f"critic.init_from: critic rank 0 could not load {path} ({msg[0]})")
    updater.sharding.load_state(updater.critic, state)


def group_learner(
    cfg: Config, policy: nn.Module, device: torch.device, critic: RemoteCritic
) -> Any:
    """`saorl.distributed.torchrun.torchrun_learner` for learner ranks with a critic group: the
    policy sharded over the learner ranks (whose process group is up), the critic `critic`.

    Rank 0 gets a `LeaderLearner`; every other rank follows rank 0's calls here until the run
    ends and gets None. The refusals of `torchrun_learner` are about a critic sharded over the
    learner ranks; the critic actors read `critic.init_from` and `critic.device` themselves.
    """
    import torch.distributed as dist

    from saorl.distributed.fsdp import FSDPSharding
    from saorl.distributed.torchrun import LeaderLearner, follow
    from saorl.learner.learner import Learner

    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    # Sharding rewrites `policy` in place: rank 0 keeps an unsharded copy for the rollout side.
    replica = copy.deepcopy(policy) if dist.get_rank() == 0 else None
    sharding = FSDPSharding(cfg.learner.mixed_precision, device)
    learner = Learner(cfg, policy, device, sharding, critic=critic)
    if replica is None:
        follow(learner)
        return None
    return LeaderLearner(learner, replica.to(device))


def save_whole(leader: Any, run: RunConfig, run_dir: Path, rollout_state: dict[str, Any]) -> None:
    """`Learner.save` for learner ranks with a critic group: the whole state, gathered by every
    learner rank and every critic rank (`LeaderLearner.state_dict` announces it), in one `.pt`."""
    from saorl.checkpoint.io import save_checkpoint

    state = {**leader.state_dict(), "torch_rng": torch.get_rng_state(), **rollout_state}
    save_checkpoint(run_dir, leader.steps, state, keep=run.keep_last_checkpoints)


def check_whole(state: dict[str, Any]) -> None:
    """A critic group resumes whole checkpoints only (module doc)."""
    if "sharded" in state:
        raise ConfigError(
            f"this checkpoint holds the critic as shards of the learner ranks ({state['sharded']}"
            ", written with ray.critic_actor = false); ray.critic_actor = true with "
            "ray.learner_ranks > 1 resumes whole checkpoints only (the ones it writes): resume "
            "it with ray.critic_actor = false"
        )
