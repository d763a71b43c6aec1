"""`saorl compare --seeds 2 --jobs 2` as a user runs it: two arms, two seeds, real training.

Tiny budgets (3 steps of a 32-wide model), so it shows the plumbing works end to end (seed
directories, runs in their own processes, the per-arm report over seeds, the band plot), not
anything about the algorithms.
"""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = (
    "run.total_steps=3",
    "run.eval_every=0",
    "learner.sft_steps=5",
    "learner.batch_size=8",
    "learner.micro_batch_size=8",
    "critic.warmup_steps=1",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "env.eval_size=16",
    "run.trackers=[]",
    "run.log_samples_every=0",
    "algorithm.group_size=4",
)


@pytest.mark.slow
def test_compare_two_arms_two_seeds_in_parallel(tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    cmd = [
        sys.executable,
        "-m",
        "saorl",
        "compare",
        "--arms",
        "sao,grpo",
        "--seeds",
        "2",
        "--jobs",
        "2",
        "--out",
        str(out),
        "run.seed=3",
        *TINY,
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    # The arms table (one row per arm, each with its seeds), then the report's path.
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == str(out / "index.html")
    assert [r.split()[:2] for r in lines[1:3]] == [["sao", "2"], ["grpo", "2"]]
    for arm in ("sao", "grpo"):
        for seed in (3, 4):
            run = out / arm / f"seed{seed}"
            summary = json.loads((run / "summary.json").read_text())
            assert summary["steps"] == 3
            assert f"seed = {seed}" in (run / "config.toml").read_text()
            assert (out / arm / f"seed{seed}.log").is_file()  # the run process's output
    with (out / "arms.csv").open(newline="") as f:
        arms = {row["arm"]: row for row in csv.DictReader(f)}
    assert set(arms) == {"sao", "grpo"}
    for row in arms.values():
        assert row["runs"] == "2" and row["done"] == "2"
        assert 0.0 <= float(row["final_min"]) <= float(row["final_mean"]) <= float(row["final_max"])
        assert float(row["final_std"]) >= 0.0 and row["collapsed_frac"] != ""
    assert arms["grpo"]["groups"] == "4 per prompt"
    assert (out / "compare.png").read_bytes().startswith(b"\x89PNG")
    # Rerunning the same command trains nothing more.
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and again.stderr.count("skipped") == 4
