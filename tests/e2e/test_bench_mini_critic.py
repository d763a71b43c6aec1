"""benchmarks/bench_mini_critic.py at a tiny size: its report's structure and consistency.

Timings are not checked (a shared machine); what is: every arm ran every seed for every step,
the arms alternated, the mini-critic is the smaller model, and the summary is the medians of
the runs it reports.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "learner.batch_size=8",
    "learner.sft_batch_size=8",
    "rollout.max_concurrent=8",
    "critic.warmup_steps=1",
    "env.eval_size=8",
    "run.eval_samples=1",
]


@pytest.mark.slow
def test_bench_mini_critic_reports_both_arms_for_every_seed(tmp_path: Path) -> None:
    out = tmp_path / "mini_critic.json"
    sets = [a for s in TINY for a in ("--set", s)]
    cmd = [sys.executable, "benchmarks/bench_mini_critic.py", "--steps", "3", "--seeds", "0,1"]
    cmd += ["--sft-steps", "2", "--mini-hidden", "16", "--mini-intermediate", "32"]
    cmd += [*sets, "--out", str(out)]
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=500)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())

    assert report["workload"]["seeds"] == [0, 1] and report["workload"]["steps"] == 3
    # Alternating, reversed on the second seed: neither arm always runs first.
    assert report["order"] == ["same-0", "mini-0", "mini-1", "same-1"]
    models = report["models"]
    assert models["mini"]["parameters"] < models["same"]["parameters"]
    for arm, runs in report["runs"].items():
        assert [r["seed"] for r in runs] == [0, 1]
        for r in runs:
            assert r["steps"] == 3
            assert len(r["learner_step_s_all"]) == 3  # every Learner.step timed, no other
            assert len(r["explained_variance_per_step"]) == 3
            # The figure is the median after the critic's one warm-up step.
            assert r["learner_step_s"] == pytest.approx(
                statistics.median(r["learner_step_s_all"][1:]), abs=1e-4
            )
            assert r["trajectories_per_s"] > 0 and 0.0 <= r["final_accuracy"] <= 1.0
            assert r["critic_concurrent"]["why"].startswith(("auto:", "critic.concurrent"))
        s = report["summary"][arm]
        for key in ("learner_step_s", "explained_variance", "trajectories_per_s"):
            assert s[key] == pytest.approx(statistics.median(r[key] for r in runs))
        base = report["summary"]["same"]
        assert s["step_ratio"] == pytest.approx(s["learner_step_s"] / base["learner_step_s"])
    assert report["summary"]["same"]["step_ratio"] == 1.0
    assert report["summary"]["same"]["paired_step_ratio"] == 1.0
    assert report["summary"]["same"]["paired_explained_variance_diff"] == 0.0
    # Paired: each mini run against the same run of its seed, then the median over seeds.
    same = {r["seed"]: r for r in report["runs"]["same"]}
    mini = report["runs"]["mini"]
    assert report["summary"]["mini"]["paired_step_ratio"] == pytest.approx(
        statistics.median(r["learner_step_s"] / same[r["seed"]]["learner_step_s"] for r in mini)
    )
    # The printed table has a row per arm.
    table = done.stdout.split("mini-critic vs same-size critic")[1]
    assert all(line in table for line in ("\nsame ", "\nmini "))
