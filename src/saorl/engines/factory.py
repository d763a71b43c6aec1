"""`build_engine`: the one place that turns `rollout.engine` into an `Engine`.

The training loop, evaluation and the Ray rollout actors all build their engines here, so a new
backend is one branch of the `if/elif` below (docs/design.md section 4, rule 3).
"""

from __future__ import annotations

from typing import Any

from torch import nn

from saorl.config import Config
from saorl.engines.protocol import Engine, EngineSettings


def build_engine(
    cfg: Config,
    policy: nn.Module,
    tokenizer: Any,
    *,
    seed: int,
    version: int = 0,
    share_model: bool = False,
    max_concurrent: int | None = None,
) -> Engine:
    """A rollout engine sampling from (a private copy of) `policy` at policy `version`.

    `share_model`: the HF engine samples from `policy` itself (evaluation, in the thread that
    owns it); the vLLM engine always holds weights of its own. `max_concurrent`: instead of
    `rollout.max_concurrent`."""
    rc = cfg.rollout
    settings = EngineSettings(
        max_seq_len=cfg.model.max_seq_len,
        temperature=rc.temperature,
        top_p=rc.top_p,
        max_concurrent=rc.max_concurrent if max_concurrent is None else max_concurrent,
        seed=seed,
        version=version,
    )
    common = dict(  # what every backend takes besides
        record_routing=cfg.algorithm.routing_replay,
        lora_adapter=cfg.model.lora_push == "adapter",
    )
    if rc.engine == "hf":
        from saorl.engines.hf import HFEngine

        return HFEngine(
            policy,
            tokenizer,
            settings,
            kv_cache=rc.kv_cache,
            copy_model=not share_model,
            **common,
        )
    elif rc.engine == "vllm":
        from saorl.engines.vllm import VLLMEngine

        return VLLMEngine.from_policy(
            policy,
            tokenizer,
            settings,
            dtype=cfg.model.dtype,
            gpu_memory_utilization=rc.vllm_gpu_memory_utilization,
            kv_cache_gib=rc.vllm_kv_cache_gib,
            enforce_eager=rc.vllm_enforce_eager,
            recompute_kv=rc.vllm_recompute_kv_on_update,
            tensor_parallel_size=rc.vllm_tensor_parallel_size,
            trust_remote_code=cfg.model.trust_remote_code,
            **common,
        )
    raise ValueError(f"rollout.engine: unknown engine {rc.engine!r}")
