"""`saorl compare` trains the supervised warm-up once per seed and every arm that shares it loads
it (`learner.sft_cache`, saorl/learner/sft.py); an arm that changes a warm-up setting gets its own.

Real training on a tiny model; the count is of warm-ups actually trained, not of time.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import saorl.learner.sft
from saorl.experiments.compare import WARMUP_DIR, run_compare

TINY = [
    *("run.total_steps=2", "run.eval_every=0", "run.trackers=[]", "run.log_samples_every=0"),
    *("learner.sft_steps=5", "learner.batch_size=8", "learner.micro_batch_size=8"),
    *("model.hidden_size=32", "model.intermediate_size=64", "model.num_layers=2"),
    *("critic.warmup_steps=1", "env.eval_size=16", "algorithm.group_size=4"),
    "run.torch_threads=1",
]


def _initial_eval(run_dir: Path) -> dict[str, Any]:
    first = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert first["step"] == 0
    return {k: v for k, v in first.items() if k.startswith("eval/")}


@pytest.mark.slow
def test_two_arms_at_one_seed_train_one_warm_up(tmp_path: Path, monkeypatch) -> None:
    trained: list[int] = []
    real = saorl.learner.sft._supervised_steps

    def counting(policy, tokenizer, spec, cfg, progress):  # the real steps, counted
        trained.append(cfg.learner.sft_steps)
        return real(policy, tokenizer, spec, cfg, progress)

    monkeypatch.setattr(saorl.learner.sft, "_supervised_steps", counting)
    out = tmp_path / "cmp"
    run_compare(None, TINY, ["sao", "grpo"], out)
    assert trained == [5]  # sao trained it, grpo loaded it
    assert len(list((out / WARMUP_DIR).glob("sft-*.pt"))) == 1
    for arm in ("sao", "grpo"):
        assert json.loads((out / arm / "summary.json").read_text())["steps"] == 2
    # grpo starts from the very weights sao's warm-up trained: the same initial evaluation.
    assert _initial_eval(out / "sao") == _initial_eval(out / "grpo")

    # An arm whose warm-up differs (its own sft_steps) trains its own; the finished arms skip.
    run_compare(None, TINY, ["sao", "grpo", "sft7:learner.sft_steps=7"], out)
    assert trained == [5, 7]
    assert len(list((out / WARMUP_DIR).glob("sft-*.pt"))) == 2
