"""Weight pushes over a `torch.distributed` broadcast group: learner = rank 0, engines the rest.

`ray.weight_sync = "broadcast"` sends every pushed tensor once from the learner to all rollout
actors with a collective broadcast (NCCL between GPUs, gloo on CPU) instead of one Ray object
that each actor fetches. The group is standalone (its own `TCPStore` and process-group object),
never the default group: an FSDP2 learner initialises the default group for its own ranks, and
the two must not collide.

Both sides walk the same list of `(name, shape, dtype)` entries, which the learner computes
once (`weight_meta`) and the driver hands to every receiver when the group is formed.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch
import torch.distributed as dist

WeightMeta = list[tuple[str, tuple[int, ...], str]]


def weight_meta(state: dict[str, torch.Tensor]) -> WeightMeta:
    """`(name, shape, dtype name)` of every tensor of `state`, sorted by name."""
    return [
        (k, tuple(state[k].shape), str(state[k].dtype).removeprefix("torch."))
        for k in sorted(state)
    ]


def node_ip() -> str:
    """This node's address as the Ray cluster sees it (127.0.0.1 without Ray)."""
    try:
        import ray
    except ImportError:
        return "127.0.0.1"
    return ray.util.get_node_ip_address()


def free_port() -> int:
    """A TCP port free on this node right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


class BroadcastGroup:
    """One rank of a standalone broadcast group rooted at rank 0.

    Every rank must construct its `BroadcastGroup` at about the same time (within
    `timeout_s`): rank 0 hosts the rendezvous store at `host:port`, the others connect to it.
    """

    def __init__(
        self, host: str, port: int, rank: int, world: int, backend: str, timeout_s: float = 600
    ) -> None:
        timeout = datetime.timedelta(seconds=timeout_s)
        self.rank = rank
        self.world = world
        self.backend = backend
        self.store = dist.TCPStore(host, port, world, rank == 0, timeout=timeout)
        if backend == "gloo":
            self.group: Any = dist.ProcessGroupGloo(self.store, rank, world, timeout)
            self.device = torch.device("cpu")
        elif backend == "nccl":
            self.group = dist.ProcessGroupNCCL(self.store, rank, world)
            self.device = torch.device("cuda", torch.cuda.current_device())
        else:
            raise ValueError(f"broadcast backend must be 'gloo' or 'nccl', got {backend!r}")

    def send(self, state: dict[str, torch.Tensor], meta: WeightMeta) -> None:
        """Rank 0: broadcast every tensor of `state`, in `meta` order."""
        if sorted(state) != [name for name, _, _ in meta]:
            raise ValueError("weight push: the policy's tensors changed since the group formed")
        for name, _, _ in meta:
            t = state[name].detach().to(self.device).contiguous()
            self.group.broadcast(t, 0).wait()

    def receive(self, meta: WeightMeta) -> dict[str, torch.Tensor]:
        """Ranks > 0: the tensors rank 0 sends, in fresh buffers on this rank's device."""
        out: dict[str, torch.Tensor] = {}
        for name, shape, dtype in meta:
            buf = torch.empty(shape, dtype=getattr(torch, dtype), device=self.device)
            self.group.broadcast(buf, 0).wait()
            out[name] = buf
        return out
