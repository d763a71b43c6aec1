"""The critic as a Ray actor of its own (`ray.critic_actor`): the learner's `RemoteCritic`.

SAO's learner step asks the critic for the advantages (values before any update, then GAE) and
then gives it K updates on the same batch, which are independent of the policy's update
(`saorl.critic_updater`). With `ray.critic_actor` the critic, its optimizer and its updates live
in a `CriticActor` with resources of its own (`ray.critic_num_cpus`, `ray.critic_num_gpus`;
`ray.critic_placement` puts it beside the learner on one node, or apart on another; the actor
class is `saorl.distributed.ray_actors.CriticActor`). The learner actor holds a `RemoteCritic`,
which answers the `CriticUpdater` methods the learner calls:

- `prepare(batch)`: one round trip; the batch goes to the critic actor, the advantages and two
  metrics come back; the values and targets stay there;
- `start_update()`: starts the K updates remotely and returns at once, so the learner actor
  runs its policy update meanwhile; `finish()` waits for the result.

The step therefore costs the longer of the two updates plus one batch transfer, rather than
their sum. Checkpoints (`state_dict` / `load_state`: the same `critic` and `critic_opt` entries),
the critic reset after the supervised warm-up (the policy's backbone is sent over) and
`critic.init_from` go through the same object. The actor builds its critic like the learner
would (the same seed gives the same initial weights); it is one unsharded process, so it goes
with `ray.learner_ranks = 1`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from saorl.critic_updater import CriticUpdate
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


class RemoteCritic:
    """The learner actor's side: `CriticUpdater`'s methods, answered by a `CriticActor`."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor
        self._pending: Any = None

    def _get(self, ref: Any) -> Any:
        import ray

        try:
            return ray.get(ref)
        except ray.exceptions.RayActorError as e:
            raise RuntimeError(f"critic: the Ray actor died: {e}") from e

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
