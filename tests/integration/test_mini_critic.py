"""critic.name_or_path: a critic of its own (a smaller model with the policy's tokenizer)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from saorl.config import ConfigError
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy, save_pretrained
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch


def _save_model(path: Path, *overrides: str) -> Path:
    torch.manual_seed(1)
    model, tokenizer = load_policy(tiny_config(*overrides).model)
    save_pretrained(model, tokenizer, path)
    return path


def test_a_smaller_critic_trains_beside_the_policy(tiny_policy, tmp_path: Path):
    policy, _ = tiny_policy
    small = _save_model(tmp_path / "mini", "model.hidden_size=16", "model.intermediate_size=32")
    cfg = tiny_config(f"critic.name_or_path={small}", "critic.warmup_steps=0")
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    critic = learner.critic_updater.critic
    assert critic.value_head.in_features == 16 < policy.config.hidden_size
    before = {k: v.clone() for k, v in critic.state_dict().items()}
    learner.reset_critic_from_policy()  # a critic of its own is not replaced by the policy
    assert all(torch.equal(v, critic.state_dict()[k]) for k, v in before.items())
    metrics = learner.step(_batch(policy))
    assert learner.version == 1 and torch.isfinite(torch.tensor(metrics["loss/value"]))
    # Only its MLPs, norms and head trained (attention frozen as for the default critic).
    changed = {k for k, v in critic.state_dict().items() if not torch.equal(v, before[k])}
    assert changed and not any("attn" in k for k in changed)


def test_a_critic_with_another_vocabulary_is_refused(tmp_path: Path):
    other = _save_model(tmp_path / "other", "model.builtin_newlines=true")
    cfg = tiny_config(f"critic.name_or_path={other}")
    torch.manual_seed(0)
    policy, _ = load_policy(cfg.model)
    with pytest.raises(ConfigError, match=r"critic\.name_or_path"):
        Learner(cfg, policy, torch.device("cpu"))
