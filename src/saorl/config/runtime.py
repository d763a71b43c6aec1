"""Sections of run bookkeeping and Ray placement, and the root `Config`."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section
from saorl.config.components import (
    AlgorithmConfig,
    CriticConfig,
    LearnerConfig,
    ModelConfig,
    RolloutConfig,
)
from saorl.config.env import EnvConfig


class RunConfig(_Section):
    """Run bookkeeping: where outputs go, how long, how often to evaluate and save."""

    name: str = Field("default", description="run directory name under output_dir")
    output_dir: str = Field("runs", description="directory holding run directories")
    seed: int = Field(0, description="global seed for torch, sampling and data order")
    total_steps: int = Field(
        1000, ge=1, description="policy optimizer steps, critic warm-up steps included"
    )
    eval_every: int = Field(
        100, ge=0, description="optimizer steps between evaluations; 0 = only at start and end"
    )
    eval_samples: int = Field(
        4,
        ge=1,
        description="samples per held-out problem for eval/accuracy (at rollout.temperature, "
        "like the paper's avg@k); eval/accuracy_greedy is logged too",
    )
    checkpoint_every: int = Field(
        200, ge=0, description="optimizer steps between checkpoints; 0 = only at the end"
    )
    concurrency: Literal["threads", "sync"] = Field(
        "threads",
        description="threads = rollout workers and learner run concurrently; sync = generate "
        "then train",
    )
    torch_threads: int = Field(1, ge=1, description="torch intra-op threads per thread of work")
    max_worker_restarts: int = Field(
        3,
        ge=0,
        description="times a crashed rollout worker (thread or Ray actor) is rebuilt, its "
        "episodes re-issued, before the run fails",
    )
    progress: bool = Field(True, description="show a live progress display")
    trackers: list[Literal["tensorboard", "wandb", "mlflow"]] = Field(
        default_factory=lambda: ["tensorboard"],
        description="where metrics, the config and samples also go: 'tensorboard' "
        "(run_dir/tensorboard), 'wandb', 'mlflow' (pip install 'saorl[tracking]'); [] = "
        "metrics.jsonl only",
    )
    project: str = Field(
        "saorl",
        description="W&B project and MLflow experiment of the run; the tracker run is named "
        "run.name",
    )
    log_samples_every: int = Field(
        50,
        ge=0,
        description="optimizer steps between sample dumps to run_dir/samples.jsonl and the "
        "trackers (and one at the last step); 0 = never",
    )
    log_samples_count: int = Field(
        4, ge=1, description="trajectories per sample dump (the first ones of that step's batch)"
    )

    @field_validator("trackers")
    @classmethod
    def _check_trackers(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"names a tracker twice: {value}")
        return value

    @field_validator("name")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value or value in (".", "..") or "/" in value or "\\" in value:
            raise ValueError(f"must be a directory name without path separators, got {value!r}")
        return value


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
    weight_sync: Literal["object_store", "broadcast"] = Field(
        "object_store",
        description="how pushed weights reach rollout actors: 'object_store' = one Ray object "
        "per push; 'broadcast' = a torch.distributed group (NCCL on GPU, gloo on CPU)",
    )
    start_timeout_s: float = Field(
        600.0, gt=0, description="seconds an actor may take to be placed and load its model"
    )

    @model_validator(mode="after")
    def _check_address(self) -> RayConfig:
        if self.address and not self.enabled:
            raise ValueError(
                f"ray.address={self.address!r} needs ray.enabled = true (or pass "
                "saorl train --ray-address ADDRESS)"
            )
        return self


class Config(_Section):
    """The whole run: one table per component."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="policy and critic model")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="generation")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="objective")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="value model")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="policy optimizer")
    env: EnvConfig = Field(default_factory=EnvConfig, description="task environment")
    run: RunConfig = Field(default_factory=RunConfig, description="run bookkeeping")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray placement")

    @model_validator(mode="after")
    def _check_lengths(self) -> Config:
        if self.model.max_seq_len <= self.rollout.max_new_tokens:
            raise ValueError(
                f"model.max_seq_len ({self.model.max_seq_len}) must be greater than "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}): the context holds the "
                "prompt and the generated tokens"
            )
        groups = self.algorithm.advantage == "group"
        if groups and self.learner.batch_size % self.algorithm.group_size:
            raise ValueError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"algorithm.group_size ({self.algorithm.group_size}) for "
                "algorithm.advantage='group': batches hold whole groups"
            )
        if self.algorithm.minibatches > self.learner.batch_size:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must be at most "
                f"learner.batch_size ({self.learner.batch_size})"
            )
        return self
