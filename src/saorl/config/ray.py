"""The `[ray]` section: the cluster, and the resources of the learner, critic and rollout actors."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section


class RayConfig(_Section):
    """Ray placement (`saorl train --ray`): rollout workers and the learner as Ray actors."""

    enabled: bool = Field(
        False, description="run rollout workers and the learner as Ray actors; false = one process"
    )
    address: str = Field(
        "",
        description="'' = start a local Ray; 'auto' or HOST:PORT = join a running cluster "
        "(ray start --head); needs enabled = true",
    )
    num_cpus: int = Field(
        0, ge=0, description="CPUs of a local Ray started by saorl; 0 = all; unused when joining"
    )
    learner_ranks: int = Field(
        1,
        ge=1,
        description="learner actors; > 1 = one FSDP2 learner sharded over them (needs "
        "learner.fsdp = true), each with the CPUs/GPUs below",
    )
    learner_num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per learner actor")
    learner_num_gpus: float = Field(
        0.0, ge=0, description="GPUs reserved per learner actor (set model.device='cuda')"
    )
    rollout_num_cpus: float = Field(
        1.0, ge=0, description="CPUs reserved per rollout actor (rollout.num_workers actors)"
    )
    rollout_num_gpus: float = Field(
        0.0, ge=0, description="GPUs reserved per rollout actor (its engine runs on them)"
    )
    learner_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources reserved per learner actor, e.g. {learner_node = 1} "
        "to pin the learner ranks to the nodes started with ray start --resources "
        "'{\"learner_node\": 1}'; {} = any node with the CPUs/GPUs",
    )
    rollout_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources reserved per rollout actor, e.g. {rollout_node = 1}; "
        "a rollout actor lost with its node is rebuilt (run.max_worker_restarts) on a node "
        "that has them, waiting up to ray.start_timeout_s for one to join",
    )
    critic_resources: dict[str, float] = Field(
        default_factory=dict,
        description="custom Ray resources reserved per critic actor (ray.critic_actor)",
    )
    critic_actor: bool = Field(
        False,
        description="run the critic in Ray actors of its own, one per learner rank: its K "
        "updates run there while the learner actors update the policy (one batch transfer per "
        "step); with ray.learner_ranks > 1 the critic actors shard it with FSDP2 over a "
        "process group of their own",
    )
    critic_num_cpus: float = Field(1.0, ge=0, description="CPUs reserved per critic actor")
    critic_num_gpus: float = Field(
        0.0, ge=0, description="GPUs reserved per critic actor (set model.device='cuda')"
    )
    critic_placement: Literal["any", "beside", "apart"] = Field(
        "any",
        description="where the critic actors go: 'any' = wherever Ray places them (several: "
        "together on one node); 'beside' = on the learners' node (a STRICT_PACK placement "
        "group); 'apart' = on another node (STRICT_SPREAD)",
    )
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store",
        description="how pushed weights reach rollout actors: 'object_store' = one Ray object "
        "per push; 'broadcast' = a torch.distributed group (NCCL on GPU, gloo on CPU)",
    )
    start_timeout_s: float = Field(
        600.0,
        gt=0,
        description="seconds an actor may take to be placed and load its model; also how long "
        "the replacement of a lost rollout actor waits for a node to place it on",
    )

    @field_validator("learner_resources", "rollout_resources", "critic_resources")
    @classmethod
    def _check_resources(cls, value: dict[str, float]) -> dict[str, float]:
        for name, amount in value.items():
            if name in ("CPU", "GPU", "memory", "object_store_memory"):
                raise ValueError(
                    f"{name!r} is not a custom resource: use ray.*_num_cpus / ray.*_num_gpus"
                )
            if not amount > 0:
                raise ValueError(f"{name!r}: the amount must be > 0, got {amount}")
        return value

    @model_validator(mode="after")
    def _check_address(self) -> RayConfig:
        if self.address and not self.enabled:
            raise ValueError(
                f"ray.address={self.address!r} needs ray.enabled = true (or pass "
                "saorl train --ray-address ADDRESS)"
            )
        return self
