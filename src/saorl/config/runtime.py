"""Sections of run bookkeeping, collapse detection and Ray placement, and the root `Config`."""

from __future__ import annotations

from typing import Any, Literal

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
from saorl.config.presets import apply_presets


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
    keep_last_checkpoints: int = Field(
        3,
        ge=0,
        description="checkpoints kept in run_dir/checkpoints (the newest; each with its "
        "Hugging Face copy); 0 = keep every one",
    )
    save_hf: bool = Field(
        True,
        description="each checkpoint also writes the policy in Hugging Face format "
        "(safetensors, config, tokenizer, chat template) to checkpoints/step_N.hf/, loadable by "
        "transformers, vLLM and saorl eval; final/ is written either way",
    )
    stop_timeout_s: float = Field(
        300.0,
        ge=0,
        description="after SIGTERM or Ctrl-C the run finishes its step and saves a checkpoint; "
        "if that takes longer than this it exits without one (0 = no limit; a second signal "
        "always stops at once)",
    )
    concurrency: Literal["threads", "sync"] = Field(
        "threads",
        description="threads = rollout workers and learner run concurrently; sync = generate "
        "then train",
    )
    deterministic: bool = Field(
        False,
        description="bit-exact reruns: rollouts and updates in a fixed order (concurrency "
        "'sync', set by this; staleness comes from learner.push_every, not from timing), "
        "deterministic torch algorithms; two runs of one config write the same metrics "
        "(timing columns aside) and weights (docs/algorithms.md)",
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
    stop_on_collapse: bool = Field(
        False,
        description="end the run cleanly (checkpoint, summary.json, exit code 0) at the first "
        "step a [collapse] signal fires; false = log collapse/* and go on",
    )

    @model_validator(mode="before")
    @classmethod
    def _deterministic_is_sync(cls, data: Any) -> Any:
        # A fixed schedule is the synchronous one; threads interleave by timing.
        if isinstance(data, dict) and data.get("deterministic") in (True, "true"):
            if data.get("concurrency", "sync") != "sync":
                raise ValueError(
                    "run.deterministic = true runs rollouts and updates in a fixed order, which "
                    f"is run.concurrency = 'sync', not {data['concurrency']!r}: drop the "
                    "concurrency setting (deterministic sets it)"
                )
            data = {**data, "concurrency": "sync"}
        return data

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


class CollapseConfig(_Section):
    """Live collapse detection (`saorl.collapse`): thresholds of the collapse/* signals.

    Each signal must hold on `patience` consecutive steps to fire; nothing fires before a
    metric has `window` values. Spike factors of 0 switch that signal off.
    """

    window: int = Field(
        20,
        ge=1,
        description="steps in the moving averages (reward, entropy, length); the first window "
        "values of a metric set its initial level, and none of its signals fires before",
    )
    patience: int = Field(
        3, ge=1, description="consecutive steps (evaluations: 2) a signal must hold to fire"
    )
    baseline_window: int = Field(
        50,
        ge=2,
        description="steps in the trailing median a spike is measured against (or the whole "
        "run's median, when higher)",
    )
    reward_drop: float = Field(
        0.5,
        ge=0,
        description="reward crash: the moving average falls below its best by more than this x "
        "(best - initial level) and by more than reward_noise per-step noise sds",
    )
    reward_noise: float = Field(
        2.5,
        ge=0,
        description="reward crash: the smallest drop, in standard deviations of one step's "
        "reward (from the run's step-to-step differences); makes the rule scale-free",
    )
    eval_drop: float = Field(
        0.5,
        ge=0,
        le=1,
        description="eval drop: eval/accuracy below this x its best at two evaluations in a "
        "row (the last evaluation alone at the end of a run)",
    )
    eval_min_best: float = Field(
        0.05, ge=0, description="eval drop only judged once the best eval/accuracy is this high"
    )
    entropy_low: float = Field(
        0.05,
        ge=0,
        lt=1,
        description="entropy collapse: moving average of policy/entropy below this x its "
        "initial level (healthy sharpening measured down to 0.14)",
    )
    entropy_high: float = Field(
        3.0,
        ge=0,
        description="entropy explosion: policy/entropy above this x its median; 0 = off",
    )
    length_low: float = Field(
        0.3,
        ge=0,
        lt=1,
        description="length collapse: moving average of rollout/response_len_mean below this x "
        "its initial level",
    )
    length_high: float = Field(
        4.0,
        ge=0,
        description="length explosion: rollout/response_len_mean above this x its trailing "
        "median (a jump; slow growth does not fire); 0 = off",
    )
    grad_norm_spike: float = Field(
        10.0,
        ge=0,
        description="policy/grad_norm (before clipping) above this x its median; 0 = off",
    )
    kl_spike: float = Field(
        10.0,
        ge=0,
        description="dis/kl_k3 or ppo/kl_k3 (policy vs sampler) and mismatch/k3 (learner vs "
        "engine) above this x their median + kl_floor; 0 = off",
    )
    kl_floor: float = Field(
        0.05,
        ge=0,
        description="nats added to the KL spike threshold (a healthy SAO run on the tool task "
        "at staleness 8 had dis/kl_k3 of 0.01-0.04 for several steps in a row)",
    )
    mismatch_floor: float = Field(
        1e-3,
        ge=0,
        description="nats added to the mismatch spike threshold (learner vs engine on the same "
        "weights: about 1e-13 in float32 on CPU)",
    )
    spike_instant: float = Field(
        10.0,
        ge=0,
        description="a spike whose value exceeds this x its threshold fires at once, without "
        "patience (one step of 7 nats KL with a 100x gradient norm is an event, not noise); "
        "0 = off",
    )
    masked_frac_spike: float = Field(
        3.0,
        ge=0,
        description="dis/masked_frac (or ppo/clip_frac) above this x its median + "
        "masked_frac_floor; 0 = off",
    )
    masked_frac_floor: float = Field(
        0.1,
        ge=0,
        le=1,
        description="fraction of tokens added to the masked-fraction threshold (the default "
        "SAO run's dis/masked_frac swings between 0.01 and 0.12 from step to step)",
    )
    ess_low: float = Field(
        0.85,
        ge=0,
        le=1,
        description="ESS collapse: corr/ess_raw (normalised effective sample size of the "
        "importance ratios, 1 = on-policy) below this; 0 = off",
    )
    gap_rise: float = Field(
        10.0,
        ge=0,
        description="mismatch rise: moving average of gap/k3_stale0 (or mismatch/k3; learner vs "
        "engine on the same weights) above this x its initial level + mismatch_floor; 0 = off",
    )

    @field_validator(
        "entropy_high", "length_high", "grad_norm_spike", "kl_spike", "masked_frac_spike"
    )
    @classmethod
    def _check_factor(cls, value: float) -> float:
        if 0 < value <= 1:
            raise ValueError(f"must be 0 (off) or greater than 1 (a factor), got {value}")
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


def _field_default(section: str, name: str) -> Any:
    return Config.model_fields[section].annotation.model_fields[name].default  # type: ignore[union-attr]
