"""MoE routing replay (R3): the experts the engine chose for each token, forced in the learner.

An MoE policy routes every token, in every MoE layer, to the top-k experts of its router. The
engine and the learner compute the router logits with different kernels, batch shapes or dtypes
(bfloat16 inference against a float32 learner, a partial rollout under older weights), and
where two experts are close the top-k flips: the learner then evaluates a token through other
experts than the ones that sampled it, and its log-prob differs from the engine's by far more
than rounding. DIS and PPO read that difference as policy change. Routing replay (R3 in slime,
verl and prime-rl) records the engine's choice and makes the learner use it.

- Recording (`RoutingRecorder`, used by `saorl.engines.hf`; vLLM's routers are hooked
  by `saorl.engines.vllm_moe`): a forward hook on every router keeps its top-k indices.
  A trajectory carries one `(positions, moe_layers, top_k)` tensor (`Trajectory.routing`,
  int8 up to 127 experts, else int16): for every position the experts the engine routed that
  token to when it last fed it (the prefill after a weight update or at a new turn replaces
  earlier records, so one trajectory holds one consistent set).
  A position the engine never fed (the last sampled token) holds -1.
- Replay (`RoutingReplay`, used by `saorl.learner.learner.Learner`): while `forced(...)` is open, a
  forward hook on every router replaces its output `(logits, weights, indices)` by the recorded
  indices and weights recomputed from the learner's own router logits over those experts:
  `weights = softmax(logits)[recorded]`, renormalised over the k experts when the router
  renormalises (`norm_topk_prob`, Mixtral). The logits are the learner's, so the router still
  gets its gradient through the weights; only the selection is the engine's (the choice of
  verl's and slime's R3). Positions with -1 keep the learner's own top-k.

Routers whose output is `(logits, top-k weights, top-k indices)` after a softmax over all experts
are supported (`SUPPORTED_ROUTERS`); others (sigmoid or group-limited routing such as
DeepSeek-V3's) raise a `ConfigError` rather than being replayed wrongly.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from saorl.config import ConfigError

if TYPE_CHECKING:
    from saorl.types import Batch

# Router classes of transformers whose forward is softmax -> top-k (-> renormalise), returning
# (router_logits, top-k weights, top-k indices).
SUPPORTED_ROUTERS = frozenset(
    {
        "Qwen3MoeTopKRouter",
        "Qwen2MoeTopKRouter",
        "Qwen3NextTopKRouter",
        "Qwen3_5MoeTopKRouter",
        "OlmoeTopKRouter",
        "MixtralTopKRouter",
    }
)
UNKNOWN = -1  # a position without a recorded routing: the learner routes it itself


def find_routers(model: nn.Module) -> list[nn.Module]:
    """The supported top-k routers of `model`, in forward (layer) order."""
    return [m for m in model.modules() if type(m).__name__ in SUPPORTED_ROUTERS]


def routers_or_error(model: nn.Module, who: str) -> list[nn.Module]:
    """`find_routers(model)`, or a `ConfigError` naming `who` when it has none."""
    routers = find_routers(model)
    if not routers:
        others = sorted({type(m).__name__ for m in model.modules() if "Router" in type(m).__name__})
        raise ConfigError(
            f"{who}: the policy has no MoE router routing replay supports (found "
            f"{others or 'none: a dense model'}; supported: {', '.join(sorted(SUPPORTED_ROUTERS))})"
            "; set algorithm.routing_replay=false"
        )
    return routers


def routing_dtype(num_experts: int) -> torch.dtype:
    """The smallest signed integer type that holds every expert index and -1."""
    return torch.int8 if num_experts <= 127 else torch.int16


class RoutingRecorder:
    """Forward hooks that keep every router's top-k indices of one forward pass."""

    def __init__(self, model: nn.Module) -> None:
        self.routers = routers_or_error(model, "algorithm.routing_replay")
        self.dtype = routing_dtype(int(self.routers[0].num_experts))
        self._captured: list[torch.Tensor] = []
        self._handles = [r.register_forward_hook(self._hook) for r in self.routers]

    def _hook(self, module: nn.Module, args: Any, output: Any) -> None:
        self._captured.append(output[2])

    def take(self, rows: int, cols: int) -> torch.Tensor:
        """The last forward's routing as `(rows, cols, moe_layers, top_k)`, on the model's
        device; that forward's input was `(rows, cols)` tokens."""
        got, self._captured = self._captured, []
        if len(got) != len(self.routers):
            raise RuntimeError(
                f"routing recorder: {len(got)} router calls in one forward, "
                f"expected {len(self.routers)}"
            )
        idx = torch.stack(got, dim=1).to(self.dtype)
        return idx.view(rows, cols, *idx.shape[1:])

    def close(self) -> None:
        for h in self._handles:
            h.remove()


class RoutingReplay:
    """Forces recorded expert choices in the routers of the learner's policy (see module doc).

    Hooks are registered only inside `forced(...)`, so evaluation and engines built from the
    policy route freely. Replay statistics accumulate until `take_metrics`.
    """

    def __init__(self, model: nn.Module, packed: bool) -> None:
        self.routers = routers_or_error(model, "algorithm.routing_replay")
        self.packed = packed
        self._forced: torch.Tensor | None = None
        # Counts stay on the device until `take_metrics` (no sync per router call).
        self._changed: torch.Tensor | int = 0
        self._known: torch.Tensor | int = 0

    @contextlib.contextmanager
    def forced(self, routing: torch.Tensor, attention_mask: torch.Tensor) -> Iterator[None]:
        """Route the tokens of the next forward passes (and the recomputation of checkpointed
        layers in their backward) as `routing` `(B, T, L, k)` says, for input `(B, T)` with
        `attention_mask`; flattened as the MoE blocks flatten tokens, packed or padded.
        Nested calls (the same rows) leave the outer one in force."""
        if self._forced is not None:
            yield
            return
        flat = routing[attention_mask.bool()] if self.packed else routing.flatten(0, 1)
        self._forced = flat.long()
        handles = [
            r.register_forward_hook(partial(self._hook, i)) for i, r in enumerate(self.routers)
        ]
        try:
            yield
        finally:
            for h in handles:
                h.remove()
            self._forced = None

    def _hook(self, layer: int, module: nn.Module, args: Any, output: Any) -> Any:
        logits, weights, own = output
        assert self._forced is not None
        forced = self._forced[:, layer].to(own.device)
        if forced.shape[0] != own.shape[0]:
            raise RuntimeError(
                f"routing replay: {forced.shape[0]} recorded positions for a router call over "
                f"{own.shape[0]} tokens (the recorded routing does not line up with the batch)"
            )
        known = forced[:, :1] >= 0
        idx = torch.where(known, forced, own)
        chosen = torch.softmax(logits.float(), dim=-1).gather(-1, idx)
        if getattr(module, "norm_topk_prob", True):  # Mixtral-style routers always renormalise
            chosen = chosen / chosen.sum(-1, keepdim=True)
        with torch.no_grad():
            differs = (own.sort(-1).values != idx.sort(-1).values).any(-1)
            self._changed = self._changed + differs.sum()
            self._known = self._known + known.sum()
        return logits, chosen.to(weights.dtype), idx

    def take_metrics(self) -> dict[str, float | None]:
        """`routing/changed_frac`: of the (token, MoE layer) pairs replayed since the last call,
        the fraction where the learner's own top-k differed from the engine's; null if none."""
        changed = int(self._changed)
        known = int(self._known)
        self._changed = self._known = 0
        return {"routing/changed_frac": changed / known if known else None}


def replay_routing(replay: RoutingReplay | None, batch: Batch) -> Any:
    """`replay.forced(...)` for the rows of `batch`; nothing when off or nothing was recorded."""
    if replay is None or batch.routing is None:
        return contextlib.nullcontext()
    return replay.forced(batch.routing, batch.attention_mask)
