"""Frozen attention by role on the architectures people post-train: full and linear attention.

Tiny random configs (hidden 32, 4 layers, vocab 64) of each transformers architecture saorl
lists as supported (Llama is SmolLM2's); the hybrids (Qwen3-Next, Qwen3.5) put a gated
DeltaNet in 3 of 4 layers, which a class-name rule (`*Attention`) left trainable.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import transformers
from torch import nn

from saorl.models.critic import Critic, freeze_attention

_LINEAR = dict(
    linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=8, linear_value_head_dim=8
)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
# name: (config class, model class, extra config, token mixer attribute names)
ARCHS = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}, {"self_attn"}),  # SmolLM2's architecture
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", {}, {"self_attn"}),
    "qwen3_moe": ("Qwen3MoeConfig", "Qwen3MoeForCausalLM", _MOE, {"self_attn"}),
    # The other MoE routers saorl replays (docs/scale-out.md).
    "qwen2_moe": (
        "Qwen2MoeConfig",
        "Qwen2MoeForCausalLM",
        {**_MOE, "shared_expert_intermediate_size": 16},
        {"self_attn"},
    ),
    "olmoe": ("OlmoeConfig", "OlmoeForCausalLM", {**_MOE, "pad_token_id": 0}, {"self_attn"}),
    "mixtral": (
        "MixtralConfig",
        "MixtralForCausalLM",
        {"num_local_experts": 4, "num_experts_per_tok": 2},
        {"self_attn"},
    ),
    "qwen3_next": (
        "Qwen3NextConfig",
        "Qwen3NextForCausalLM",
        {**_LINEAR, **_MOE, "shared_expert_intermediate_size": 16},
        {"self_attn", "linear_attn"},
    ),
    "qwen3_5": ("Qwen3_5TextConfig", "Qwen3_5ForCausalLM", _LINEAR, {"self_attn", "linear_attn"}),
    "qwen3_5_moe": (
        "Qwen3_5MoeTextConfig",
        "Qwen3_5MoeForCausalLM",
        {**_LINEAR, **_MOE, "shared_expert_intermediate_size": 16},
        {"self_attn", "linear_attn"},
    ),
}


def _tiny(arch: str) -> nn.Module:
    config_cls, model_cls, extra, _ = ARCHS[arch]
    if not hasattr(transformers, model_cls):
        pytest.skip(f"transformers {transformers.__version__} has no {model_cls}")
    torch.manual_seed(0)
    config = getattr(transformers, config_cls)(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        **extra,
    )
    return getattr(transformers, model_cls)(config)


@pytest.mark.parametrize("arch", list(ARCHS))
def test_every_token_mixer_is_frozen_and_the_rest_trains(arch, capsys):
    critic = Critic(_tiny(arch))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every layer's token mixer recognised: no warning
        frozen = set(freeze_attention(critic))
    mixer_names = ARCHS[arch][3]
    layers = critic.backbone.layers
    for i, layer in enumerate(layers):
        mixers = [n for n, _ in layer.named_children() if n in mixer_names]
        assert len(mixers) == 1, (i, [n for n, _ in layer.named_children()])
    for name, p in critic.named_parameters():
        in_mixer = any(f".{m}." in name for m in mixer_names)
        assert p.requires_grad == (not in_mixer), name
        assert (name in frozen) == in_mixer, name
    # The hybrids: linear attention in 3 of 4 layers, all of it frozen with its gated norm.
    if "linear_attn" in mixer_names:
        assert sum(hasattr(layer, "linear_attn") for layer in layers) == 3
        assert any(".linear_attn.norm." in n for n in frozen)
    # One backward: gradients reach the MLP/MoE, the norms and the value head, not the mixers.
    nn.init.normal_(critic.value_head.weight)
    ids = torch.randint(0, 64, (2, 6))
    critic(ids, torch.ones_like(ids)).pow(2).sum().backward()
    for name, p in critic.named_parameters():
        if name in frozen:
            assert p.grad is None, name
    grads = {n for n, p in critic.named_parameters() if p.grad is not None}
    assert "value_head.weight" in grads and any(".mlp." in n for n in grads)
    assert any("post_attention_layernorm" in n for n in grads)
    # The share is logged at start, with the mixer classes.
    err = capsys.readouterr().err
    tensors = sum(1 for _ in critic.parameters())
    assert f"{len(frozen)} of {tensors} tensors" in err
    assert ("GatedDeltaNet x3" in err) == ("linear_attn" in mixer_names)


class _TokenShift(nn.Module):  # a token mixer saorl does not know, under a name it does not know
    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Linear(4, 4)


class _Attention(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.q = nn.Linear(4, 4)


class _DecoderLayer(nn.Module):
    def __init__(self, known: bool) -> None:
        super().__init__()
        if known:
            self.self_attn = _Attention()
        else:
            self.shift = _TokenShift()
        self.mlp = nn.Linear(4, 4)


def test_an_unrecognised_token_mixer_is_warned_about_and_trains():
    model = nn.Module()
    model.layers = nn.ModuleList([_DecoderLayer(True), _DecoderLayer(False)])
    with pytest.warns(UserWarning, match=r"no token mixer recognised in 1 decoder layer.*shift"):
        frozen = freeze_attention(model)
    assert frozen == ["layers.0.self_attn.q.weight", "layers.0.self_attn.q.bias"]
    assert model.layers[1].shift.mix.weight.requires_grad
