"""Trajectories as the rollout side produces them, and the padded batch the learner consumes.

A `Trajectory` is one finished rollout: the prompt tokens followed by everything that came
after it (model tokens and, for agentic tasks, observation tokens), with one entry per
completion token for the loss mask, the rollout log-prob and the policy version that sampled it.
Observation tokens carry log-prob 0 and version -1; they are never trained on. For MoE policies
with `algorithm.routing_replay`, a trajectory also carries the experts the engine routed each
position to (`saorl.models.routing`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

import torch

StopReason = Literal[
    "eos",
    "stop",
    "answer",
    "max_turns",
    "max_tool_calls",
    "length",
    "context",
    "env_error",
    "aborted",
]


@dataclass
class Trajectory:
    """One finished single rollout.

    `completion_ids`, `loss_mask`, `rollout_logprobs` and `versions` have equal length: one entry
    per token after the prompt. `loss_mask[i]` is 1 where the model wrote token i (an action
    token) and 0 on observation tokens. `routing` (recorded MoE routing, else None) is an
    integer tensor `(prompt + completion tokens, moe_layers, top_k)`: one row per position,
    prompt included, -1 where the engine recorded nothing.
    """

    prompt_ids: list[int]
    completion_ids: list[int]
    loss_mask: list[int]
    rollout_logprobs: list[float]
    versions: list[int]
    reward: float = 0.0
    stop_reason: StopReason = "eos"
    prompt_key: str = ""
    group_id: int = -1
    info: dict[str, Any] = field(default_factory=dict)
    routing: torch.Tensor | None = None

    def __post_init__(self) -> None:
        n = len(self.completion_ids)
        lens = (len(self.loss_mask), len(self.rollout_logprobs), len(self.versions))
        if any(x != n for x in lens):
            raise ValueError(
                f"Trajectory fields disagree in length: completion_ids={n}, loss_mask, "
                f"rollout_logprobs, versions = {lens}"
            )
        total = len(self.prompt_ids) + n
        if self.routing is not None and (self.routing.dim() != 3 or len(self.routing) != total):
            raise ValueError(
                f"Trajectory.routing must be (positions={total}, moe_layers, top_k), got "
                f"{tuple(self.routing.shape)}"
            )

    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.loss_mask))

    @property
    def min_version(self) -> int:
        """Oldest policy version that sampled a token of this trajectory (-1 if none did)."""
        vs = [v for v, m in zip(self.versions, self.loss_mask, strict=True) if m]
        return min(vs) if vs else -1

    def staleness(self, current_version: int) -> int:
        """`current_version - min(token versions)`, as docs/design.md section 2 defines it."""
        return current_version - self.min_version


@dataclass
class Batch:
    """Right-padded tensors over whole sequences (prompt + completion), all `(B, T)` unless noted.

    Position t holds token t. `action_mask[b, t]` is 1 where token t was written by the policy;
    `rollout_logprobs[b, t]` is the sampling log-prob of token t (0 elsewhere); `versions[b, t]`
    the policy version that sampled it (-1 elsewhere). `rewards[b, t]` holds the scalar outcome
    reward on the last action token of each row (docs/design.md section 1). `routing[b, t]`
    `(B, T, moe_layers, top_k)` holds the experts the engine routed token t to (-1 where it
    recorded none), or the batch has none (None).
    """

    input_ids: torch.Tensor  # long
    attention_mask: torch.Tensor  # long, 1 on real tokens
    action_mask: torch.Tensor  # float
    completion_mask: torch.Tensor  # float, 1 on every token after the prompt
    rollout_logprobs: torch.Tensor  # float
    versions: torch.Tensor  # long
    rewards: torch.Tensor  # float, (B, T)
    scores: torch.Tensor  # float, (B,), the outcome reward per row
    group_ids: torch.Tensor  # long, (B,)
    stop_reasons: list[str]
    prompt_keys: list[str]
    routing: torch.Tensor | None = None
    # Each row's number of real tokens, on the host: lets a forward pass choose its attention
    # mask without reading `attention_mask` back from the device. None: not known.
    lengths: list[int] | None = None
    # float, (B,): a row's weight in its GRPO group's statistics, 1/k for each of an agent
    # episode's k segments (`agent/segments`); None when every row is a whole episode.
    episode_weights: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.input_ids.shape[0])

    def to(self, device: torch.device | str) -> Batch:
        tensors = {
            k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in vars(self).items()
        }
        return Batch(**tensors)

    def select(self, idx: slice | list[int] | torch.Tensor) -> Batch:
        """Rows `idx` of this batch (used to form micro-batches)."""
        out: dict[str, Any] = {}
        for k, v in vars(self).items():
            if v is None:
                out[k] = None
            elif isinstance(v, torch.Tensor) or isinstance(idx, slice):
                out[k] = v[idx]
            else:
                out[k] = [v[int(i)] for i in idx]
        return Batch(**out)

    @staticmethod
    def from_trajectories(trajs: list[Trajectory], pad_id: int) -> Batch:
        """Pad a list of trajectories on the right into one batch."""
        if not trajs:
            raise ValueError("cannot build a Batch from zero trajectories")
        lengths = [len(t.prompt_ids) + len(t.completion_ids) for t in trajs]
        B = len(trajs)
        T = max(lengths)
        input_ids = torch.full((B, T), pad_id, dtype=torch.long)
        attention = torch.zeros((B, T), dtype=torch.long)
        action = torch.zeros((B, T))
        completion = torch.zeros((B, T))
        logp = torch.zeros((B, T))
        versions = torch.full((B, T), -1, dtype=torch.long)
        rewards = torch.zeros((B, T))
        for b, t in enumerate(trajs):
            p = len(t.prompt_ids)
            n = len(t.completion_ids)
            input_ids[b, : p + n] = torch.tensor(t.prompt_ids + t.completion_ids)
            attention[b, : p + n] = 1
            completion[b, p : p + n] = 1
            if n:
                action[b, p : p + n] = torch.tensor(t.loss_mask, dtype=torch.float)
                logp[b, p : p + n] = torch.tensor(t.rollout_logprobs)
                versions[b, p : p + n] = torch.tensor(t.versions)
            # The outcome reward sits on the last action token (docs/design.md section 1).
            act = [i for i, m in enumerate(t.loss_mask) if m]
            if act:
                rewards[b, p + act[-1]] = t.reward
        return Batch(
            input_ids=input_ids,
            attention_mask=attention,
            action_mask=action,
            completion_mask=completion,
            rollout_logprobs=logp,
            versions=versions,
            rewards=rewards,
            scores=torch.tensor([t.reward for t in trajs], dtype=torch.float),
            group_ids=torch.tensor([t.group_id for t in trajs], dtype=torch.long),
            stop_reasons=[t.stop_reason for t in trajs],
            prompt_keys=[t.prompt_key for t in trajs],
            routing=_pad_routing(trajs, T),
            lengths=lengths,
            episode_weights=_episode_weights(trajs),
        )


def _pad_routing(trajs: list[Trajectory], T: int) -> torch.Tensor | None:
    """The trajectories' recorded routing as `(B, T, moe_layers, top_k)`, -1 where absent."""
    first = next((t.routing for t in trajs if t.routing is not None), None)
    if first is None:
        return None
    out = torch.full((len(trajs), T, *first.shape[1:]), -1, dtype=first.dtype)
    for b, t in enumerate(trajs):
        if t.routing is not None:
            out[b, : len(t.routing)] = t.routing
    return out


def fit_routing(routing: torch.Tensor | None, length: int) -> torch.Tensor | None:
    """`routing` cut or padded with -1 rows to `length` positions (None stays None)."""
    if routing is None or len(routing) == length:
        return routing
    if len(routing) > length:
        return routing[:length]
    pad = routing.new_full((length - len(routing), *routing.shape[1:]), -1)
    return torch.cat([routing, pad])


def _episode_weights(trajs: list[Trajectory]) -> torch.Tensor | None:
    segments = [max(1, int(t.info.get("agent/segments", 1))) for t in trajs]
    if all(k == 1 for k in segments):
        return None
    return torch.tensor([1.0 / k for k in segments], dtype=torch.float)


@dataclass
class Collected:
    """One learner batch's worth of finished trajectories, and what forming it took."""

    trajectories: list[Trajectory]
    dropped: int = 0  # trajectories dropped as too stale while this batch formed
    waited_s: float = 0.0  # seconds the caller waited for trajectories
    group_waits: list[float] = field(default_factory=list)  # first to last member, per group
    failed: list[Trajectory] = field(default_factory=list)  # a few env_error ones, for samples


@dataclass
class PoolStats:
    """Running totals of a rollout pool since it started."""

    failed: int  # rollouts ended by an environment error or an abort (not trained)
    restarts: int  # crashed workers replaced
    prompt_too_long: int  # prompts that filled the context before a token was generated
    idle_s: float  # seconds an engine had nothing to generate, mean over workers
    tokens_generated: int  # tokens sampled by every engine together
    errors: dict[str, int] = field(default_factory=dict)  # env_error episodes by group
