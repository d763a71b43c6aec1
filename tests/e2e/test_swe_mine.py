"""The README's workflow on repositories built here: `saorl swe-mine` each checkout, `saorl
swe-validate` the file, then `saorl train --config examples/swe_real.toml` on the mined tasks
for 2 steps (plumbing: the tiny model fixes nothing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests._swe_repos import build_all

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _saorl(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saorl", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=900,
    )


def test_mine_validate_and_train(tmp_path: Path):
    setup = build_all(tmp_path)
    env = [f"env.swe.pip_args={setup['pip_args']}", f"env.swe.cache_dir={tmp_path / 'cache'}"]
    out = tmp_path / "tasks.jsonl"
    for name in ("geom", "shapes"):
        mined = _saorl("swe-mine", str(setup["repos"] / name), "--out", str(out), *env)
        assert mined.returncode == 0, mined.stderr[-3000:]
        assert "1 task(s) appended" in mined.stdout
        assert f"env.swe.repos_root={setup['repos']}" in mined.stdout  # the next command
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["repo"] for r in rows] == ["geom", "shapes"]
    assert rows[0]["FAIL_TO_PASS"] == ["tests/test_core.py::test_area"]

    checked = _saorl("swe-validate", str(out), "--repos-root", str(setup["repos"]), *env)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "2 of 2 task(s) valid" in checked.stdout

    train = _saorl(
        "train",
        "--config",
        "examples/swe_real.toml",
        f"env.swe.tasks={out}",
        f"env.swe.repos_root={setup['repos']}",
        *env,
        f"run.output_dir={tmp_path / 'runs'}",
        "run.name=real",
        "run.total_steps=2",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "run.progress=false",
        "learner.batch_size=2",
        "learner.micro_batch_size=2",
        "rollout.max_new_tokens=24",
        "model.hidden_size=32",
        "model.intermediate_size=64",
    )
    assert train.returncode == 0, train.stderr[-3000:]
    run = tmp_path / "runs" / "real"
    assert json.loads((run / "summary.json").read_text())["steps"] == 2
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in metrics if "eval/accuracy" in r] == [0, 2]  # the held-out task
    assert any("loss/policy" in r for r in metrics)
    assert not list((tmp_path / "cache" / "work").glob("saorl-swe-*"))  # copies cleaned up
