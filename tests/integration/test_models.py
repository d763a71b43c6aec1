"""Policy loading from a local Hugging Face directory, the critic, and frozen attention."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from saorl.config import ConfigError
from saorl.loop import train_from_config
from saorl.models.critic import Critic, freeze_attention
from saorl.models.loading import load_policy, save_pretrained
from saorl.models.tokenizer import encode_prompt
from tests.conftest import tiny_config

TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<a>{% endif %}"
)


def test_load_local_hf_directory_with_chat_template(tmp_path, tiny_policy):
    model, tok = tiny_policy
    tok.chat_template = TEMPLATE
    save_pretrained(model, tok, tmp_path / "m")
    cfg = tiny_config(f"model.name_or_path={tmp_path / 'm'}")
    loaded, ltok = load_policy(cfg.model)
    for (name, a), b in zip(model.state_dict().items(), loaded.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    assert ltok.decode(encode_prompt(ltok, "1+2=")) == "<user>1+2=<a>"
    # And a run starts from it (the template goes around every prompt).
    cfg = tiny_config(
        f"model.name_or_path={tmp_path / 'm'}",
        f"run.output_dir={tmp_path / 'runs'}",
        "run.total_steps=2",
        "model.max_seq_len=48",
    )
    assert train_from_config(cfg)["steps"] == 2


@pytest.mark.parametrize(
    ("setup", "message"),
    [
        ("missing", "is not a local directory"),
        ("no_config", "has no config.json"),
        ("builtin", "unknown built-in"),
    ],
)
def test_bad_model_paths_name_the_key(tmp_path, setup, message):
    path = {"missing": str(tmp_path / "nope"), "no_config": str(tmp_path), "builtin": "builtin:x"}
    cfg = tiny_config()
    # Bypass config validation of built-in names: the loader must refuse on its own too.
    object.__setattr__(cfg.model, "name_or_path", path[setup])
    with pytest.raises(ConfigError, match=message) as e:
        load_policy(cfg.model)
    assert "model.name_or_path" in str(e.value)


def test_mismatched_tokenizer_is_an_error(tmp_path, tiny_policy):
    model, tok = tiny_policy
    tok.add_tokens([f"<extra{i}>" for i in range(50)])
    save_pretrained(model, tok, tmp_path / "m")
    with pytest.raises(ConfigError, match="do not match"):
        load_policy(tiny_config(f"model.name_or_path={tmp_path / 'm'}").model)


def test_critic_starts_from_policy_with_zero_values(tiny_policy):
    model, _ = tiny_policy
    critic = Critic(model)
    for name, p in model.base_model.state_dict().items():
        assert torch.equal(p, critic.backbone.state_dict()[name])
    ids = torch.randint(3, 90, (2, 7))
    values = critic(ids, torch.ones_like(ids))
    assert values.shape == (2, 7) and torch.all(values == 0)
    # values[:, t] uses the hidden state at t-1: changing token t must not change values[:, t].
    nn.init.normal_(critic.value_head.weight)
    ids2 = ids.clone()
    ids2[:, 4] = (ids2[:, 4] + 1) % 90 + 3
    v1, v2 = critic(ids, torch.ones_like(ids)), critic(ids2, torch.ones_like(ids2))
    torch.testing.assert_close(v1[:, :5], v2[:, :5])
    assert not torch.allclose(v1[:, 5:], v2[:, 5:])


def test_freeze_attention_selects_attention_only(tiny_policy):
    model, _ = tiny_policy
    critic = Critic(model)
    frozen = set(freeze_attention(critic))
    assert frozen and all(".self_attn." in n for n in frozen)
    for name, p in critic.named_parameters():
        assert p.requires_grad == (name not in frozen), name


def test_freeze_attention_with_no_attention_module_is_an_error():
    with pytest.raises(ValueError, match="selected no parameters"):
        freeze_attention(nn.Sequential(nn.Linear(2, 2), nn.ReLU()))
