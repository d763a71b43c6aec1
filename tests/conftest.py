"""Shared fixtures: a tiny random-init model and its char tokenizer (nothing is downloaded)."""

from __future__ import annotations

import pytest
import torch

from saorl.config import Config, load_config

# The overrides of `tiny_config` (a later override of the same field wins).
TINY_OVERRIDES = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.num_layers=2",
    "model.num_heads=4",
    "model.num_kv_heads=2",
    "model.max_seq_len=32",
    "learner.batch_size=8",
    "learner.micro_batch_size=4",
    "learner.sft_steps=0",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=6",
    "critic.warmup_steps=1",
    "env.eval_size=16",
    "run.progress=false",
    "run.torch_threads=1",
]


def tiny_config(*overrides: str) -> Config:
    """A config small enough for a few learner steps in well under a second on 2 cores."""
    return load_config(None, [*TINY_OVERRIDES, *overrides])


@pytest.fixture
def tiny_policy():
    from saorl.models.loading import load_policy

    torch.manual_seed(0)
    return load_policy(tiny_config().model)
