"""The root `Config`: one table per section, and the checks that span sections."""

from __future__ import annotations

from typing import Any

from pydantic import Field, model_validator

from saorl.config.algorithm import AlgorithmConfig
from saorl.config.base import _Section
from saorl.config.collapse import CollapseConfig
from saorl.config.critic import CriticConfig
from saorl.config.env import EnvConfig
from saorl.config.learner import LearnerConfig
from saorl.config.model import ModelConfig
from saorl.config.presets import apply_presets
from saorl.config.ray import RayConfig
from saorl.config.rollout import RolloutConfig
from saorl.config.run import RunConfig


class Config(_Section):
    """The whole run: one table per component."""

    model: ModelConfig = Field(default_factory=ModelConfig, description="policy and critic model")
    rollout: RolloutConfig = Field(default_factory=RolloutConfig, description="generation")
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig, description="objective")
    critic: CriticConfig = Field(default_factory=CriticConfig, description="value model")
    learner: LearnerConfig = Field(default_factory=LearnerConfig, description="policy optimizer")
    env: EnvConfig = Field(default_factory=EnvConfig, description="task environment")
    run: RunConfig = Field(default_factory=RunConfig, description="run bookkeeping")
    collapse: CollapseConfig = Field(
        default_factory=CollapseConfig, description="live collapse detection thresholds"
    )
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray placement")

    @model_validator(mode="before")
    @classmethod
    def _apply_presets(cls, data: Any) -> Any:
        # algorithm.name's recipe spans sections; explicit settings win (saorl.config.presets).
        return apply_presets(data, _field_default)

    @model_validator(mode="after")
    def _check_lengths(self) -> Config:
        if self.model.max_seq_len <= self.rollout.max_new_tokens:
            raise ValueError(
                f"model.max_seq_len ({self.model.max_seq_len}) must be greater than "
                f"rollout.max_new_tokens ({self.rollout.max_new_tokens}): the context holds the "
                "prompt and the generated tokens"
            )
        groups = self.algorithm.samples_per_prompt > 1
        if groups and self.learner.batch_size % self.algorithm.group_size:
            raise ValueError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"algorithm.group_size ({self.algorithm.group_size}) for "
                "algorithm.advantage='group' or algorithm.group_sampling: batches hold whole "
                "groups"
            )
        if self.algorithm.minibatches > self.learner.batch_size:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must be at most "
                f"learner.batch_size ({self.learner.batch_size})"
            )
        return self

    @model_validator(mode="after")
    def _newlines_for_datasets(self) -> Config:
        # Dataset prompts have newlines (the math env's instructions do): the built-in char
        # model reads them, rather than <unk>, unless model.builtin_newlines says otherwise.
        m = self.model
        builtin_math = self.env.name == "math" and m.name_or_path == "builtin:tiny"
        if builtin_math and "builtin_newlines" not in m.model_fields_set:
            m.builtin_newlines = True
        return self

    @model_validator(mode="after")
    def _check_lora(self) -> Config:
        if self.learner.fsdp and (self.model.lora_rank or self.critic.lora_rank):
            raise ValueError(
                "model.lora_rank / critic.lora_rank with learner.fsdp=true is not supported yet "
                "(docs/lora.md); set learner.fsdp=false or the LoRA ranks to 0"
            )
        if (
            self.learner.fsdp
            and self.algorithm.kl_reference == "initial"
            and self.algorithm.kl_coef
        ):
            raise ValueError(
                "algorithm.kl_reference = 'initial' with learner.fsdp=true is not supported yet "
                "(the frozen reference copy is not sharded); use kl_reference = 'sampler'"
            )
        return self

    @model_validator(mode="after")
    def _check_process(self) -> Config:
        if self.run.concurrency == "process" and self.ray.enabled:
            raise ValueError(
                "run.concurrency = 'process' and ray.enabled both place the rollout workers in "
                "processes of their own: with Ray (--ray) use run.concurrency = 'threads'"
            )
        if self.run.concurrency == "process" and self.rollout.engine != "hf":
            raise ValueError(
                f"run.concurrency = 'process' runs the HF engine in child processes, not "
                f"rollout.engine = {self.rollout.engine!r} (vLLM has engine processes of its "
                "own): use run.concurrency = 'threads'"
            )
        return self

    @model_validator(mode="after")
    def _check_tensor_parallel(self) -> Config:
        tp = self.rollout.vllm_tensor_parallel_size
        rc = self.ray
        if tp > 1 and self.algorithm.routing_replay:
            raise ValueError(
                f"algorithm.routing_replay with rollout.vllm_tensor_parallel_size={tp}: the "
                "routing is captured inside the engine's process, and tensor-parallel workers "
                "are processes of their own; set the size to 1"
            )
        if tp > 1 and rc.enabled and 0 < rc.rollout_num_gpus < tp:
            raise ValueError(
                f"rollout.vllm_tensor_parallel_size={tp} spreads each engine over {tp} GPUs, "
                f"but ray.rollout_num_gpus={rc.rollout_num_gpus:g} reserves fewer per rollout "
                f"actor: set ray.rollout_num_gpus={tp}"
            )
        return self


def _field_default(section: str, name: str) -> Any:
    return Config.model_fields[section].annotation.model_fields[name].default  # type: ignore[union-attr]
