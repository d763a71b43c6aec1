"""`saorl value-pretrain` fits and saves a critic that `saorl train` starts from."""

from __future__ import annotations

import math
import string

import pytest
import torch

from saorl.checkpoint.io import load_state_file
from saorl.config import ConfigError
from saorl.envs.arithmetic import ArithmeticTask
from saorl.learner.value_pretrain import value_pretrain
from saorl.loop import train_from_config
from tests.conftest import tiny_config


def test_pretrained_critic_is_what_training_starts_from(tmp_path, monkeypatch):
    # Outcomes that vary with the sampled text (a random-init model never solves addition),
    # and stop strings so that turns end early and get graded.
    monkeypatch.setattr(ArithmeticTask, "reward", staticmethod(lambda p, t: float(len(t) % 2)))
    stop = "rollout.stop=" + str(list(string.ascii_letters + string.digits))
    cfg = tiny_config(
        f"run.output_dir={tmp_path}", "learner.sft_steps=2", "run.total_steps=1", stop
    )
    out = tmp_path / "critic.pt"
    result = value_pretrain(cfg, out, rollouts=24, epochs=2)
    assert out.is_file() and result["rollouts"] == 24 and result["heldout"] == 4
    assert math.isfinite(result["explained_variance_after"])
    saved = load_state_file(out)["critic"]
    # The value head left zero: the critic was fitted (frozen attention stays as initialised).
    assert saved["value_head.bias"].abs().sum() > 0

    run_cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "learner.sft_steps=2",
        "run.total_steps=1",
        f"critic.init_from={out}",
    )
    run = train_from_config(run_cfg)["run_dir"]
    step0 = load_state_file(f"{run}/checkpoints/step_00000000.pt")["critic"]
    for name, value in saved.items():
        assert torch.equal(value, step0[name]), name


def test_missing_pretrained_critic_is_a_clear_error(tmp_path):
    cfg = tiny_config(f"run.output_dir={tmp_path}", f"critic.init_from={tmp_path / 'nope.pt'}")
    with pytest.raises(ConfigError, match=r"critic\.init_from"):
        train_from_config(cfg)
