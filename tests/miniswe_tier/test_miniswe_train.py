"""`saorl train` on examples/swe_mini_agent.toml for 2 steps with the tiny model: every episode
is a run of mini-swe-agent (in .venv-miniswe) against the training endpoint, graded by the coding
env's grader. The tiny model writes no tool call, so mini-swe-agent stops at its third format
error: each episode is a graded, zero-reward one with its exit status recorded, never a crash.
The runner is the one saorl ships, named as the example names it ($SAORL_MINISWE_RUNNER), and
mini-swe-agent's config dir is in the run folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from tests.miniswe_tier._marks import MINISWE_TIER, PYTHON, ROOT

pytestmark = MINISWE_TIER


def test_the_example_trains_two_steps_through_mini_swe_agent(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("XDG_")}
    # saorl's report plots with matplotlib, which keeps a font cache in the home: elsewhere
    env.update(HOME=str(home), MPLCONFIGDIR=str(tmp_path / "mpl"))
    args = [
        f'env.agent.command={PYTHON} "$SAORL_MINISWE_RUNNER"',  # the example's, its venv here
        f"env.swe.cache_dir={tmp_path / 'cache'}",
        f"run.output_dir={tmp_path / 'runs'}",
        "env.swe.num_tasks=1",
        "env.eval_size=1",
        "learner.batch_size=2",
        "rollout.max_concurrent=2",
        "rollout.max_new_tokens=32",
        "run.total_steps=2",
        "run.trackers=[]",
        "run.progress=false",
    ]
    config = ROOT / "examples" / "swe_mini_agent.toml"
    cmd = [sys.executable, "-m", "saorl", "train", "--config", str(config), *args]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "runs" / "swe_mini_agent"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if "loss/policy" in r or "critic/loss" in r]
    assert len(trained) == 2
    for r in trained:
        assert r["rollout/failed"] == 0  # garbage from the model is a graded episode
        assert r["agent/model_calls"] >= 1 and r["agent/calls"] == r["agent/model_calls"]
        assert r["agent/submitted"] == 0.0 and r["rollout/reward_mean"] == 0.0
        assert r["agent/episode_s"] > 0
    samples = [json.loads(x) for x in (run / "samples.jsonl").read_text().splitlines()]
    assert samples
    for s in samples:
        info = s["info"]
        assert isinstance(info, dict), info
        assert info["agent/exit_status"] == "RepeatedFormatError"  # mini-swe-agent's own end
        assert info["submitted"] == "agent" and info["resolved"] is False  # graded by saorl
        assert info["fail_to_pass_total"] >= 1 and info["patch"] == ""  # nothing changed
    assert list(home.iterdir()) == []  # nothing of mini-swe-agent (or saorl) in the home
    assert (run / "agents" / "mini-swe-agent").is_dir()  # its config dir: in the run folder
