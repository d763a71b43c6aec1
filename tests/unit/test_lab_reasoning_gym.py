"""The stability lab's experiment (benchmarks/lab_reasoning_gym.py): every arm's config is valid
and differs from the others only by the arm's own overrides (nothing is trained here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

from saorl.config import load_config
from saorl.experiments.compare import parse_arms, split_arms

ROOT = Path(__file__).resolve().parents[2]


def _lab():
    spec = importlib.util.spec_from_file_location(
        "lab", ROOT / "benchmarks" / "lab_reasoning_gym.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_lab_arm_validates_with_forced_staleness() -> None:
    lab = _lab()
    arms = parse_arms(split_arms(",".join(lab.ARMS)))
    assert [a.name for a in arms] == [
        "sao",
        "grpo",
        "grpo_dis",
        "vapo",
        "grpo+tis",
        "grpo+icepop",
        "grpo+seq_mis",
        "sao+tis",
    ]
    shared = ['model.name_or_path="runs/lab_rg/warm"', "learner.sft_steps=0"]
    corrections = {}
    for arm in arms:
        cfg = load_config(lab.CONFIG, [*shared, *arm.overrides])
        assert cfg.env.name == "reasoning_gym"
        assert cfg.env.reasoning_gym.datasets == ["chain_sum", "basic_arithmetic"]
        assert (cfg.learner.push_every, cfg.learner.max_staleness) == (4, 8)
        assert cfg.run.total_steps == 40 and cfg.learner.sft_steps == 0
        assert cfg.learner.batch_size % cfg.algorithm.samples_per_prompt == 0
        corrections[arm.name] = cfg.algorithm.correction
    assert corrections["grpo+icepop"] == "icepop" and corrections["sao+tis"] == "tis"
    assert corrections["sao"] == corrections["grpo"] == "none"
    vapo = load_config(lab.CONFIG, [*shared, *arms[3].overrides])
    assert vapo.critic.warmup_steps == 10 and vapo.algorithm.samples_per_prompt == 16
