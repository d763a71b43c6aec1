"""LoRA adapters (peft) on the policy and the critic; the merged weights engines and users load.

With `model.lora_rank > 0` the learner injects LoRA adapters into the policy in place
(`peft.inject_adapter_in_model`): the model keeps its class, so `model.base_model` and the
output head work as for full fine-tuning, every base weight has `requires_grad=False`, and
the policy optimizer holds the adapters only. `critic.lora_rank` does the same to the critic's
backbone (the value head always trains). Decisions (docs/lora.md):

- Engines sample from merged weights `W + (lora_alpha / lora_rank) * B @ A` (`merge_lora`).
  With `model.lora_push = "adapter"` (default) a push sends the adapters only (`push_state`):
  an engine gets the base weights once, when it is built or with its first push, and the HF
  engine merges each pushed adapter into its plain copy itself (`AdapterMerger`), vLLM serves
  it through its LoRA support; `"merged"` pushes the whole merged model as full fine-tuning does.
- Targets must be linear layers, whose merge is exactly that formula (peft's `all-linear`
  leaves the output head out).
- The supervised warm-up (`learner.sft_steps`, the built-in tasks' random-init models) trains
  the base weights with the adapters off (`lora_warmup`): it stands in for pretraining, and a
  random-init model whose embeddings and norms stay frozen cannot learn the output format
  through adapters alone. RL then trains the adapters only.
- Checkpoints hold the whole policy state (base and adapters) and the adapters' optimizer
  state, so `--resume` continues exactly. `final/` holds the merged model, the adapter in peft
  format under `final/adapter/`, and under `final/base/` the base it applies to when that is not
  `model.name_or_path` as loaded (built-in model, or a warm-up ran).

peft is imported only when a rank is set; without it the run stops with an install hint.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import nn

from saorl.config import ConfigError, CriticConfig, ModelConfig


class FullState(Protocol):
    """What `onto_lora` needs of the learner's sharding (`saorl.learner.sharding.Sharding`)."""

    def full_state(self, module: nn.Module, everywhere: bool = ...) -> dict[str, Any]: ...


_BASE = ".base_layer."
_A = ".lora_A.default.weight"
_B = ".lora_B.default.weight"


def _peft(field: str, rank: int) -> Any:
    try:
        import peft
    except ImportError:
        raise ConfigError(
            f"{field}.lora_rank={rank} needs the peft package: pip install 'saorl[lora]' "
            f"(or pip install peft), or set {field}.lora_rank=0"
        ) from None
    return peft


def add_lora(module: nn.Module, model: ModelConfig, critic: CriticConfig | None = None) -> None:
    """Inject LoRA adapters into `module`: the policy's (`model.lora_rank`, `model.lora_alpha`)
    or, given `critic`, the critic backbone's (`critic.lora_rank`, `critic.lora_alpha`); both
    on `model.lora_target_modules` with `model.lora_dropout`. Nothing when that rank is 0."""
    own = model if critic is None else critic
    if not own.lora_rank:
        return
    peft = _peft("model" if critic is None else "critic", own.lora_rank)
    targets: Any = model.lora_target_modules
    if targets == ["all-linear"]:
        targets = "all-linear"
    config = peft.LoraConfig(
        r=own.lora_rank,
        lora_alpha=own.lora_alpha,
        lora_dropout=model.lora_dropout,
        target_modules=targets,
    )
    try:
        peft.inject_adapter_in_model(config, module)
    except ValueError as e:  # peft's word on targets that match nothing
        raise ConfigError(f"model.lora_target_modules={model.lora_target_modules}: {e}") from e
    layers = [m for m in module.modules() if isinstance(m, peft.tuners.lora.LoraLayer)]
    wrong = sorted({type(m.get_base_layer()).__name__ for m in layers} - {"Linear"})
    if wrong:
        raise ConfigError(
            f"model.lora_target_modules={model.lora_target_modules} selects {wrong} layers; "
            "saorl merges adapters of linear layers only: name linear modules (q_proj, ...)"
        )


def lora_scale(module: nn.Module) -> float | None:
    """`lora_alpha / r` of the adapters in `module` (one adapter config), None if it has none."""
    for m in module.modules():
        config = getattr(m, "peft_config", None)
        if config:
            c = config["default"]
            return c.lora_alpha / (c.r**0.5 if c.use_rslora else c.r)
    return None


def has_lora(module: nn.Module) -> bool:
    return lora_scale(module) is not None


def merge_lora(state: dict[str, torch.Tensor], scale: float) -> dict[str, torch.Tensor]:
    """A state dict with LoRA keys -> the plain one: `W + scale * B @ A` under `W`'s own name.

    Computed in float32, stored in `W`'s dtype; keys without adapters pass through unchanged.
    """
    out: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if _A[1:] in key or _B[1:] in key:
            continue
        if _BASE in key:
            prefix, _, name = key.partition(_BASE)
            a = state.get(prefix + _A)
            b = state.get(prefix + _B)
            if name == "weight" and a is not None and b is not None:
                delta = (b.float() @ a.float()) * scale
                value = (value.float() + delta.to(value.device)).to(value.dtype)
            key = f"{prefix}.{name}"
        out[key] = value
    return out


def is_adapter_key(key: str) -> bool:
    """Whether `key` names a LoRA adapter tensor (`...lora_A.default.weight` or B)."""
    return key.endswith((_A, _B))


def push_state(state: dict[str, torch.Tensor], module: nn.Module, how: str, full: bool) -> dict:
    """What a weight push sends of `module`'s `state`: without adapters, or with
    `how = "merged"`, the merged plain state; otherwise (`"adapter"`) the adapter tensors only,
    or with `full` the whole unmerged state (base and adapters, for an engine that lacks the
    base: a new Ray rollout actor)."""
    if how == "merged" or not has_lora(module):
        return merged_state(state, module)
    return state if full else {k: v for k, v in state.items() if is_adapter_key(k)}


def state_bytes(state: dict[str, torch.Tensor]) -> int:
    """Bytes of the tensors of `state` (what a push moves)."""
    return sum(v.numel() * v.element_size() for v in state.values())


class AdapterMerger:
    """An engine's plain copy of a LoRA model, kept merged as pushed adapters arrive.

    Holds the base weights of the adapted layers (a copy beside the merged ones: the price of
    exact merges, `W + scale * B @ A` from the base each time, rather than accumulating deltas
    in the engine's dtype). `merge(state)` turns a pushed LoRA-layout state (adapters only, or
    the whole unmerged state whose base weights replace the held ones) into the plain tensors to
    load: bit-identical to merging on the learner (`merge_lora`)."""

    def __init__(self, module: nn.Module, device: torch.device) -> None:
        scale = lora_scale(module)
        assert scale is not None, "AdapterMerger needs a module with LoRA adapters"
        self.scale = scale
        state = module.state_dict()
        self.adapter_keys = {k for k in state if is_adapter_key(k)}
        self.bases = {
            f"{k.removesuffix(_A)}{_BASE}weight": state[f"{k.removesuffix(_A)}{_BASE}weight"]
            .detach()
            .to(device, copy=True)
            for k in self.adapter_keys
            if k.endswith(_A)
        }

    def merge(self, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        for key in self.bases.keys() & state.keys():  # a full push: the base it brings
            self.bases[key] = state[key].to(self.bases[key].device, copy=True)
        return merge_lora({**self.bases, **state}, self.scale)


def merged_state(state: dict[str, torch.Tensor], module: nn.Module) -> dict[str, torch.Tensor]:
    """`module`'s `state` with its adapters merged (the state itself when it has none)."""
    scale = lora_scale(module)
    return state if scale is None else merge_lora(state, scale)


def merged_checkpoint_policy(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict:
    """A checkpoint's policy state (written under `cfg`, the run's `[model]`) as the plain
    model's: a LoRA run's adapters merged with its `lora_alpha / lora_rank`."""
    return merge_lora(state, cfg.lora_alpha / cfg.lora_rank) if cfg.lora_rank else state


def merged_copy(module: nn.Module, merge: bool = True) -> nn.Module:
    """A plain copy of a LoRA model: adapters merged into the base weights (`merge`) or left out
    (the base alone); the class and every other module as in `module`."""
    scale = lora_scale(module)
    state = module.state_dict()
    plain = copy.deepcopy(module)
    for name, sub in list(plain.named_modules()):
        if hasattr(sub, "base_layer") and hasattr(sub, "lora_A"):
            parent, _, attr = name.rpartition(".")
            setattr(plain.get_submodule(parent), attr, sub.get_base_layer())
    for m in plain.modules():
        vars(m).pop("peft_config", None)
    plain.load_state_dict(merge_lora(state, scale if merge and scale is not None else 0.0))
    return plain


def onto_lora(
    state: dict[str, torch.Tensor], module: nn.Module, sharding: FullState
) -> dict[str, torch.Tensor]:
    """A plain-key `state` for `module` renamed onto its LoRA layout (`X.weight` ->
    `X.base_layer.weight`), its adapters' current values added; as is without LoRA."""
    if not has_lora(module):
        return state
    current = sharding.full_state(module, everywhere=True)
    out = {k: v for k, v in current.items() if _A[1:] in k or _B[1:] in k}
    for key, value in state.items():
        prefix, _, name = key.rpartition(".")
        base = f"{prefix}{_BASE}{name}"
        out[base if base in current else key] = value
    return out


@contextlib.contextmanager
def lora_warmup(model: nn.Module) -> Iterator[None]:
    """Adapters off and every base weight trainable (the supervised warm-up trains the base,
    docs/lora.md); on exit the adapters are back on and the base frozen again."""
    if not has_lora(model):
        yield
        return
    from peft.tuners.lora import LoraLayer

    layers = [m for m in model.modules() if isinstance(m, LoraLayer)]
    adapter_ids = {id(p) for m in layers for d in (m.lora_A, m.lora_B) for p in d.parameters()}
    base = [p for p in model.parameters() if id(p) not in adapter_ids]
    flags = [p.requires_grad for p in base]
    for m in layers:
        m.enable_adapters(False)
    for p in base:
        p.requires_grad_(True)
    try:
        yield
    finally:
        for p, flag in zip(base, flags, strict=True):
            p.requires_grad_(flag)
        for m in layers:
            m.enable_adapters(True)


def save_adapter(
    model: nn.Module, tokenizer: Any, path: Path, name_or_path: str, warmed_up: bool
) -> None:
    """`path/adapter/`: the policy's adapter in peft format (adapter_model.safetensors and
    adapter_config.json, loadable with `peft.PeftModel.from_pretrained`), and `path/base/`, the
    base model it applies to, unless that is `name_or_path` (`model.name_or_path`) as loaded:
    not the built-in model, nor one the supervised warm-up changed (`warmed_up`). Nothing
    without LoRA."""
    if not has_lora(model):
        return
    import peft
    from safetensors.torch import save_file

    base_name = name_or_path
    if base_name.startswith("builtin:") or warmed_up:
        merged_copy(model, merge=False).save_pretrained(str(path / "base"))
        tokenizer.save_pretrained(str(path / "base"))
        base_name = str((path / "base").resolve())
    out = path / "adapter"
    out.mkdir(parents=True, exist_ok=True)
    weights = peft.get_peft_model_state_dict(model)
    save_file(
        {f"base_model.model.{k}": v.detach().cpu().contiguous() for k, v in weights.items()},
        str(out / "adapter_model.safetensors"),
        metadata={"format": "pt"},
    )
    config = copy.deepcopy(model.peft_config["default"])  # type: ignore[index]
    config.base_model_name_or_path = base_name
    config.inference_mode = True
    config.task_type = "CAUSAL_LM"  # what PeftModel.from_pretrained wraps it as
    config.save_pretrained(str(out))
