"""`saorl train` on verifiers tasksets end to end, on the tiny built-in model: the example
(examples/verifiers_chain_sum.toml: reasoning-gym items in an in-memory taskset) and a taskset
with a tool (tests/verifiers_tier/_tool_taskset.py), 2 steps each. Every episode is a verifiers
episode scored by the taskset's rubric (its named rewards and metrics are env/*)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from saorl.cli.main import main
from tests._procs import children_of
from tests.verifiers_tier._marks import VERIFIERS_TIER

# a run's episodes each start processes that import verifiers: minutes on 2 shared cores
pytestmark = [*VERIFIERS_TIER, pytest.mark.timeout(1500)]
ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "learner.batch_size=4",
    "learner.micro_batch_size=4",
    "rollout.max_concurrent=4",
    "critic.warmup_steps=1",
    "run.progress=false",
    "run.eval_samples=1",
    "run.total_steps=2",
    "run.eval_every=0",
    "env.eval_size=2",
    "run.trackers=[]",
]


def _train(tmp_path: Path, config: Path, *more: str) -> tuple[list[dict], list[dict], dict]:
    assert main(["train", "--config", str(config), f"run.output_dir={tmp_path}", *TINY, *more]) == 0
    # each worker's runner process ended with it
    assert children_of(os.getpid(), b"verifiers_runner") == []
    run = next(p for p in tmp_path.iterdir() if p.is_dir())
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/policy" in r or "critic/loss" in r]
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    return trained, samples, json.loads((run / "summary.json").read_text())


def test_the_example_trains_two_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)  # the config names its taskset relative to the repository root
    trained, samples, summary = _train(tmp_path, ROOT / "examples" / "verifiers_chain_sum.toml")
    assert len(trained) == 2
    for r in trained:
        assert r["rollout/failed"] == 0  # every episode ran to its rubric
        assert 0.0 <= r["env/reward/correct"] <= 1.0  # the items' own scorer, averaged
        assert r["env/reply_chars"] >= 0.0
    assert samples
    for s in samples:  # the prompts verifiers rendered: the taskset's questions
        assert "State the final answer to the following arithmetic problem" in s["prompt"]
    assert summary["final_eval_accuracy"] is not None  # the held-out tasks ran too


def test_a_tool_taskset_trains_two_steps(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    config = tmp_path / "tools.toml"
    taskset = Path(__file__).parent / "_tool_taskset.py"
    config.write_text(
        "[model]\nmax_seq_len = 512\n[env]\nname = 'verifiers'\n"
        "args = { agent = { harness = { id = 'null' }, max_turns = 2 } }\n"
        f"step_timeout_s = 120\n[env.verifiers]\ntaskset = '{taskset}'\n"
        "[learner]\nsft_steps = 0\n[rollout]\nmax_new_tokens = 8\n"
        "[run]\nname = 'tools'\n"
    )
    # each of its episodes starts the tool's MCP server (a Python process importing verifiers)
    small = ["learner.batch_size=2", "learner.micro_batch_size=2", "env.eval_size=1"]
    trained, samples, _ = _train(tmp_path / "runs", config, *small)
    assert len(trained) == 2
    for r in trained:
        assert r["rollout/failed"] == 0
        assert "env/reward/correct" in r and "env/tool_calls" in r
    for s in samples:  # the tool was offered: its schema is in every rendered prompt
        assert "calc_add" in s["prompt"] and "Add two integers." in s["prompt"]
