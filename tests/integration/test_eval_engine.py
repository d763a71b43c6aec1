"""Evaluation builds its engines through `saorl.engines.factory.build_engine`, so the config's
`rollout.engine` is the engine `saorl eval` and in-training evaluation sample with."""

from __future__ import annotations

import pytest
import torch

import saorl.evaluation.held_out
from saorl import api
from saorl.engines.factory import build_engine
from saorl.envs.factory import build_env
from tests.conftest import tiny_config


@pytest.fixture
def engines_asked(monkeypatch):
    """The `rollout.engine` of every engine evaluation builds; an HF engine stands in for
    vLLM (not installed in this tier: tests/vllm_tier/test_vllm_eval.py runs the real one)."""
    asked: list[tuple[str, bool]] = []

    def spy(cfg, policy, tokenizer, **kw):
        asked.append((cfg.rollout.engine, kw.get("share_model", False)))
        hf = cfg.model_copy(update={"rollout": cfg.rollout.model_copy(update={"engine": "hf"})})
        return build_engine(hf, policy, tokenizer, **kw)

    monkeypatch.setattr(saorl.evaluation.held_out, "build_engine", spy)
    return asked


def test_saorl_eval_samples_with_the_configured_engine(engines_asked):
    summary = api.evaluate(
        "builtin:tiny",
        overrides=[
            "rollout.engine=vllm",
            "env.eval_size=4",
            "rollout.max_new_tokens=2",
            "model.max_seq_len=32",
        ],
    )
    assert summary["problems"] == 4
    assert engines_asked == [("vllm", True)]


def test_in_training_evaluation_samples_with_the_configured_engine(engines_asked):
    from saorl.learner.learner import Learner
    from saorl.models.loading import load_policy

    cfg = tiny_config("rollout.engine=vllm", "env.eval_size=4", "run.eval_samples=2")
    torch.manual_seed(0)
    policy, tokenizer = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    metrics = learner.evaluate(build_env(cfg.env), tokenizer)
    assert 0.0 <= metrics["eval/accuracy"] <= 1.0
    assert engines_asked == [("vllm", True), ("vllm", True)]  # greedy, then sampled


def test_the_python_api_evaluates_greedily_as_the_command_does():
    # `saorl.evaluate(..., greedy=True)` is `saorl eval --greedy`: argmax, so k samples of a
    # problem are one text, and the summary says so.
    over = ["env.eval_size=4", "rollout.max_new_tokens=3", "model.max_seq_len=32"]
    summary = api.evaluate("builtin:tiny", overrides=over, k=3, greedy=True)
    assert summary["greedy"] is True
    assert api.evaluate("builtin:tiny", overrides=over, k=1)["greedy"] is False
