"""Where the learner and the rollout workers run: the one place that chooses.

`build_topology(cfg)` returns a learner and a rollout pool bound to it (the two interfaces of
`saorl.interfaces`) and the tokenizer:

- default: the learner and the rollout worker threads in this process (`run.concurrency =
  "process"`: the rollout workers in child processes, `saorl.distributed.proc_pool`);
- `ray.enabled` (`saorl train --ray`): the learner as Ray actor(s), one Ray actor per rollout
  worker, this process as the driver;
- under torchrun with `learner.fsdp`: one FSDP2 learner sharded over the ranks; rank 0 runs the
  loop and the rollout workers, the other ranks follow its learner calls inside this function
  and get None once rank 0 is done.

Distributed code is imported here only when it is used, so a one-process run never imports
Ray or `torch.distributed` machinery.
"""

from __future__ import annotations

import os
from typing import Any, NamedTuple

from saorl import interfaces
from saorl.config import Config, ConfigError
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy, resolve_device
from saorl.rollout.pool import WorkerPool


class Topology(NamedTuple):
    learner: interfaces.Learner
    pool: interfaces.RolloutPool
    tokenizer: Any


def build_topology(cfg: Config) -> Topology | None:
    """The learner and rollout pool `cfg` asks for; None on a torchrun rank > 0 (finished)."""
    if cfg.ray.enabled:
        from saorl.distributed.ray_learner import RayLearner
        from saorl.distributed.ray_pool import RayWorkerPool

        ray_learner = RayLearner(cfg)
        pool = RayWorkerPool(cfg, ray_learner.tokenizer, ray_learner)
        return Topology(ray_learner, pool, ray_learner.tokenizer)
    policy, tokenizer = load_policy(cfg.model)
    device = resolve_device(cfg.model.device)
    if cfg.learner.fsdp and "LOCAL_RANK" in os.environ:  # under torchrun: FSDP2 over its ranks
        if cfg.run.concurrency == "process":
            raise ConfigError("run.concurrency = 'process' under torchrun: use 'threads'")
        from saorl.distributed.torchrun import torchrun_learner

        leader = torchrun_learner(cfg, policy, device)
        if leader is None:
            return None
        return Topology(leader, WorkerPool(cfg, tokenizer, leader), tokenizer)
    learner = Learner(cfg, policy, device)
    if cfg.run.concurrency == "process":  # rollout workers in child processes, no Ray
        from saorl.distributed.proc_pool import ProcWorkerPool

        return Topology(learner, ProcWorkerPool(cfg, tokenizer, learner), tokenizer)
    return Topology(learner, WorkerPool(cfg, tokenizer, learner), tokenizer)
