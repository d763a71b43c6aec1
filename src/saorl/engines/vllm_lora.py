"""A LoRA policy's adapter in the vLLM engine: pushed alone, served through vLLM's LoRA support.

With `model.lora_rank > 0` and `model.lora_push = "adapter"` the vLLM engine is built with
`enable_lora` and holds the base weights, loaded in place (`reload_weights`) from the unmerged
state's `base_layer` tensors at start-up; every push after that carries the adapter tensors
alone. They are written in peft's format (`adapter_model.safetensors` and `adapter_config.json`,
the engine's temporary directory) and loaded with vLLM's `add_lora` under one `LoRARequest`
that every request names:

- **One adapter id, reloaded in place** (`load_inplace=True`), not a new id per version: a
  request names its adapter when it is added, so with a new id per push the requests in flight
  would go on sampling from the adapter they started with, and the version their tokens record
  would be wrong. Reloaded in place, every running request samples from the new adapter from
  the next step on, as after a full push (with `recompute_kv` they are re-prefilled too).
- vLLM drops its adapters when base weights are reloaded, so a push of both loads the base
  first, then the adapter.
- vLLM sizes its adapter buffers by `max_lora_rank`, one of a fixed list: the smallest that
  holds the policy's rank.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import torch

from saorl.models.lora import is_adapter_key

_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM's `MaxLoRARanks`


class VLLMAdapter:
    """The policy's adapter as vLLM loads it: its config written once, its tensors per push."""

    def __init__(self, policy: torch.nn.Module, workdir: Path) -> None:
        config = copy.deepcopy(policy.peft_config["default"])  # type: ignore[index]
        self.rank = int(config.r)
        fits = [r for r in _RANKS if r >= self.rank]
        if not fits:
            raise ValueError(
                f"vLLM serves LoRA ranks up to {_RANKS[-1]}; model.lora_rank = {self.rank}: "
                "set model.lora_push = 'merged'"
            )
        self.max_rank = fits[0]
        config.inference_mode = True
        config.task_type = "CAUSAL_LM"
        self.dir = workdir / "adapter"
        config.save_pretrained(str(self.dir))
        # peft writes a set of target names in the order it met them: sorted, for a stable file
        cfg_file = self.dir / "adapter_config.json"
        written = json.loads(cfg_file.read_text())
        if isinstance(written.get("target_modules"), list):
            written["target_modules"] = sorted(written["target_modules"])
        cfg_file.write_text(json.dumps(written, indent=2))
        self.keys = {k for k in policy.state_dict() if is_adapter_key(k)}
        self._request: Any = None

    def engine_args(self) -> dict[str, Any]:
        """vLLM `EngineArgs` fields that enable one adapter of this rank."""
        return {"enable_lora": True, "max_lora_rank": self.max_rank, "max_loras": 1}

    @property
    def request(self) -> Any:
        """The `LoRARequest` every generation request names (built on first use: vLLM import)."""
        if self._request is None:
            from vllm.lora.request import LoRARequest

            self._request = LoRARequest("policy", 1, str(self.dir), load_inplace=True)
        return self._request

    def load(self, llm: Any, adapters: dict[str, torch.Tensor]) -> None:
        """Write `adapters` (the policy's `...lora_A.default.weight` names) in peft's format and
        have vLLM reload the adapter in place."""
        from safetensors.torch import save_file

        if set(adapters) != self.keys:
            raise ValueError("weight update: the pushed adapters are not the engine's")
        tensors = {
            "base_model.model." + k.replace(".default.weight", ".weight"): v.detach()
            .to("cpu")
            .contiguous()
            for k, v in adapters.items()
        }
        save_file(tensors, str(self.dir / "adapter_model.safetensors"), metadata={"format": "pt"})
        llm.add_lora(self.request)


def split_push(
    state: dict[str, Any], adapter: VLLMAdapter | None
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A pushed state as `(plain-named weights to reload, adapter tensors)`: a LoRA-layout
    state's `X.base_layer.weight` is the base model's `X.weight`."""
    adapters = {k: v for k, v in state.items() if is_adapter_key(k)}
    if adapters and adapter is None:
        raise ValueError(
            "weight update: LoRA adapters pushed to a vLLM engine built without LoRA support "
            "(build it from the LoRA policy with model.lora_push = 'adapter')"
        )
    if adapter is not None and state and not adapters:
        # Merged weights would become vLLM's base, and the adapter would apply on top again.
        raise ValueError(
            "weight update: a vLLM engine serving the LoRA adapter takes the adapter tensors "
            "(with the unmerged base, or alone), not merged weights"
        )
    rest = {k.replace(".base_layer.", "."): v for k, v in state.items() if k not in adapters}
    return rest, adapters
