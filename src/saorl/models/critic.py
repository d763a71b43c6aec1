"""The critic: the policy's backbone with a scalar value head, and frozen attention.

The critic is initialised from the policy weights (a copy of the policy's base model) with a
zero-initialised value head, so at the start every value is 0 and the first value-loss gradients
flow only into the head. Frozen attention (paper section 3.2) keeps every parameter of every
token mixer fixed during RL, found by its role in the decoder layer (`token_mixers`): full
attention and the linear attention of hybrids (Qwen3.5, Qwen3-Next). `forward(...,
packed=True)` runs the rows as one packed row without padding (`saorl.models.packing`), with the
same `(B, T)` result.

With `critic.lora_rank > 0` the backbone gets LoRA adapters (`saorl.models.lora`): its base
weights are frozen and the adapters train, the value head trains fully; frozen attention then
freezes the adapters inside attention modules too (they are parameters of those modules).
"""

from __future__ import annotations

import copy
import sys
import warnings
from collections import Counter
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from saorl.config import CriticConfig, ModelConfig
from saorl.models.logprobs import pack_or_pad
from saorl.models.lora import add_lora


def critic_source(name: str, model: ModelConfig, policy: nn.Module) -> nn.Module:
    """The model the critic is built from (`name`: `critic.name_or_path`): `policy` itself, or
    the model `name` names, loaded as `model` (the policy's `[model]`) says, which must share
    the policy's tokenizer (the critic reads the policy's token ids)."""
    if name == "policy":
        return policy
    from saorl.config import ConfigError
    from saorl.models.loading import load_policy

    loaded, tokenizer = load_policy(model.model_copy(update={"name_or_path": name}))
    if tokenizer.get_vocab() != _policy_tokenizer(model).get_vocab():
        raise ConfigError(
            f"critic.name_or_path={name}: its tokenizer differs from the policy's "
            f"({model.name_or_path}); the critic reads the policy's token ids, so it needs "
            "the same vocabulary"
        )
    return loaded


def _policy_tokenizer(model: ModelConfig) -> Any:
    from saorl.models.loading import BUILTIN_PREFIX, _load_tokenizer, model_dir
    from saorl.models.tokenizer import build_char_tokenizer

    if model.name_or_path.startswith(BUILTIN_PREFIX):
        return build_char_tokenizer(with_newlines=model.builtin_newlines)
    return _load_tokenizer(model_dir(model.name_or_path))


class Critic(nn.Module):
    """`values[b, t]` estimates the state just before token t is generated.

    That is the value head applied to the hidden state at position t-1 (docs/design.md section 1);
    position 0 has no predecessor and gets value 0 (it is never an action position).
    """

    def __init__(
        self, policy: nn.Module, lora: tuple[ModelConfig, CriticConfig] | None = None
    ) -> None:
        super().__init__()
        self.backbone = copy.deepcopy(policy.base_model)
        if lora is not None:  # `critic.lora_rank` > 0: LoRA adapters on the backbone
            add_lora(self.backbone, *lora)
        hidden = policy.config.hidden_size
        param = next(self.backbone.parameters())
        self.value_head = nn.Linear(hidden, 1, dtype=param.dtype)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        packed: bool = False,
        lengths: Sequence[int] | None = None,
    ) -> torch.Tensor:
        """`(B, T)` values; `lengths` as in `sequence_logprobs` (the rows' lengths, on the host)."""
        hidden, pk = pack_or_pad(self.backbone, input_ids, attention_mask, packed, lengths)
        v = self.value_head(hidden).squeeze(-1).float()  # value of the state after each token
        # Shift right by one: values[:, t] = head(hidden[:, t-1]).
        v = torch.cat([torch.zeros_like(v[:, :1]), v[:, :-1]], dim=1)
        return pk.unpack(v) if pk is not None else v


# A decoder layer's token mixer, by role: the attribute names transformers gives the module that
# mixes information across positions (full attention, linear attention such as Qwen3.5's and
# Qwen3-Next's gated DeltaNet, state-space and convolution mixers), and class-name endings for
# models that name it otherwise. The channel mixer (MLP/MoE) and the block's own norms train.
TOKEN_MIXER_NAMES = frozenset(
    {
        "self_attn",
        "linear_attn",
        "attn",
        "attention",
        "self_attention",
        "linear_attention",
        "mixer",
        "mamba",
        "conv",
        "temporal_block",
    }
)
TOKEN_MIXER_SUFFIXES = ("Attention", "DeltaNet", "Mixer", "MambaLayer", "ShortConv")


def decoder_layers(module: nn.Module) -> list[tuple[str, nn.Module]]:
    """The elements of `module`'s layer lists (`nn.ModuleList`s of `*Layer` / `*Block`)."""
    out = []
    for name, mod in module.named_modules():
        if isinstance(mod, nn.ModuleList):
            for i, layer in enumerate(mod):
                if type(layer).__name__.endswith(("Layer", "Block")):
                    out.append((f"{name}.{i}" if name else str(i), layer))
    return out


def token_mixers(module: nn.Module) -> tuple[dict[str, nn.Module], list[str]]:
    """`({name: token mixer}, [layers without a recognised one])` of `module`.

    A mixer is a direct child of a decoder layer named as in `TOKEN_MIXER_NAMES` or whose class
    name ends in one of `TOKEN_MIXER_SUFFIXES`; any other module whose class name ends in
    `Attention` counts too (models without `*Layer` lists). Nested mixers are not repeated.
    """
    mixers: dict[str, nn.Module] = {}
    missing = []
    for lname, layer in decoder_layers(module):
        found = [
            (f"{lname}.{n}", c)
            for n, c in layer.named_children()
            if n in TOKEN_MIXER_NAMES or type(c).__name__.endswith(TOKEN_MIXER_SUFFIXES)
        ]
        mixers.update((n, c) for n, c in found if any(True for _ in c.parameters()))
        if not found:
            children = ", ".join(f"{n} ({type(c).__name__})" for n, c in layer.named_children())
            missing.append(f"{lname} ({type(layer).__name__}: {children})")
    for name, mod in module.named_modules():
        if type(mod).__name__.endswith("Attention") and not any(
            name == m or name.startswith(m + ".") for m in mixers
        ):
            mixers[name] = mod
    return mixers, missing


def freeze_attention(module: nn.Module) -> list[str]:
    """Set `requires_grad=False` on every parameter of every token mixer (`token_mixers`): full
    and linear attention with the norms the model puts inside them (Qwen3's q/k norms, the gated
    DeltaNet's output norm); the block's pre-mixer norm is the block's and trains, as the MLP.

    Returns the frozen parameter names. Prints the frozen share of tensors and parameters, and
    warns about decoder layers whose token mixer was not recognised (they train whole).
    Selecting nothing is an error: a critic that silently trains everything is a different
    algorithm (docs/design.md section 1).
    """
    mixers, missing = token_mixers(module)
    frozen: list[str] = []
    for mod_name, mod in mixers.items():
        for p_name, p in mod.named_parameters():
            p.requires_grad_(False)
            frozen.append(f"{mod_name}.{p_name}" if mod_name else p_name)
    if not frozen:
        classes = sorted({type(m).__name__ for m in module.modules()})
        raise ValueError(
            "critic.freeze='attention' selected no parameters: no token mixer (attention or "
            f"linear attention) was recognised (found: {', '.join(classes[:12])}...). Use "
            "critic.freeze='none' to train the whole critic."
        )
    if missing:
        warnings.warn(
            f"critic.freeze='attention': no token mixer recognised in {len(missing)} decoder "
            f"layer(s), which train whole: {'; '.join(missing[:4])}. Name its attribute in "
            "saorl.models.critic.TOKEN_MIXER_NAMES or use critic.freeze='none'.",
            stacklevel=2,
        )
    print(f"saorl: critic.freeze=attention: {frozen_share(module, mixers)}", file=sys.stderr)
    return frozen


def frozen_share(module: nn.Module, mixers: dict[str, nn.Module]) -> str:
    """One line: the frozen share of `module`'s tensors and parameters, and the mixer classes."""
    params = dict(module.named_parameters())
    frozen = [p for p in params.values() if not p.requires_grad]
    n_all = sum(p.numel() for p in params.values())
    n_frozen = sum(p.numel() for p in frozen)
    kinds = Counter(type(m).__name__ for m in mixers.values())
    return (
        f"{len(frozen)} of {len(params)} tensors, {n_frozen} of {n_all} parameters "
        f"({100 * n_frozen / max(n_all, 1):.1f} %) frozen, in "
        + ", ".join(f"{k} x{n}" for k, n in sorted(kinds.items()))
    )
