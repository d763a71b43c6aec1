"""`saorl train --config examples/swe_lite.toml` and `saorl eval` of that run, as a user runs
them, with tiny budgets: the coding environment's plumbing end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def test_swe_lite_trains_and_evaluates(tmp_path: Path):
    train = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            "--config",
            "examples/swe_lite.toml",
            f"run.output_dir={tmp_path}",
            "run.name=swe",
            "run.total_steps=2",
            "run.eval_every=0",
            "run.checkpoint_every=0",
            "run.progress=false",
            "learner.sft_steps=2",
            "learner.sft_batch_size=2",
            "learner.batch_size=2",
            "learner.micro_batch_size=2",
            "critic.warmup_steps=1",
            "env.swe.num_tasks=2",
            "env.eval_size=1",
            f"env.swe.cache_dir={tmp_path / 'cache'}",
            "rollout.max_new_tokens=24",
            "model.hidden_size=32",
            "model.intermediate_size=64",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert train.returncode == 0, train.stderr[-3000:]
    run = tmp_path / "swe"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]
    assert all("rollout/tool_calls_mean" in r for r in rows if "loss/policy" in r)
    config = (run / "config.toml").read_text()
    assert 'name = "swe"' in config and "eps_low = 0.8" in config and "eps_high = 3.0" in config
    vocab = json.loads((run / "final" / "tokenizer.json").read_text())["model"]["vocab"]
    assert "\n" in vocab  # the built-in tokenizer with newlines (model.builtin_newlines)
    assert not list((tmp_path / "cache" / "work").glob("saorl-swe-*"))  # copies cleaned up

    out = tmp_path / "evals" / "swe.jsonl"
    ev = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "eval",
            str(run),
            "--limit",
            "1",
            "rollout.max_new_tokens=16",
            "env.max_turns=2",
            # a folder the run folder names: used only when given again (saorl.security.trust)
            f"env.swe.cache_dir={tmp_path / 'cache'}",
            "--out",
            str(out),
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert ev.returncode == 0, ev.stderr[-3000:]
    result = json.loads(out.with_suffix(".summary.json").read_text())
    assert result["resolved_rate"] == result["accuracy"] and 0.0 <= result["accuracy"] <= 1.0
    assert "resolved_rate" in ev.stdout
    (row,) = [json.loads(x) for x in out.read_text().splitlines()]
    assert row["key"] == "gen-1234-00000" and row["reference"].startswith("diff --git")
