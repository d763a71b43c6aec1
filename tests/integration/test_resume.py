"""Kill a training process after a checkpoint, resume it, and check nothing was lost."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, load_latest_checkpoint, save_checkpoint
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from tests._tracker_readers import metric_series, tb_scalars
from tests.conftest import tiny_config

TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=32",
    "learner.batch_size=8",
    "learner.sft_steps=0",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=6",
    "critic.warmup_steps=1",
    "env.eval_size=16",
    "run.eval_every=0",
    "run.progress=false",
]


def _saorl(*args: str) -> list[str]:
    return [sys.executable, "-m", "saorl", *args]


def test_kill_after_checkpoint_then_resume(tmp_path: Path):
    run_dir = tmp_path / "r"
    cmd = _saorl(
        "train",
        *TINY,
        f"run.output_dir={tmp_path}",
        "run.name=r",
        "run.total_steps=100000",
        "run.checkpoint_every=2",
    )
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if any(p.name == "step_00000004.pt" for p in list_checkpoints(run_dir)):
                break
            assert proc.poll() is None, proc.stderr.read().decode()
            time.sleep(0.1)
        else:
            raise AssertionError("no checkpoint at step 4 within 120 s")
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.kill()
        proc.wait()

    _path, saved = load_latest_checkpoint(run_dir)
    killed_at = saved["step"]
    assert killed_at >= 4 and killed_at % 2 == 0
    # No temporary file is ever taken for a checkpoint.
    assert all(p.name.startswith("step_") for p in list_checkpoints(run_dir))

    out = subprocess.run(
        _saorl("train", "--resume", str(run_dir), f"run.total_steps={killed_at + 3}"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    after_resume = [r["step"] for r in rows if "loss/value" in r and r["step"] > killed_at]
    assert after_resume == [killed_at + 1, killed_at + 2, killed_at + 3]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == killed_at + 3
    # TensorBoard (the default tracker) shows exactly metrics.jsonl: the steps the killed run
    # logged past its checkpoint are replaced by the resumed run's (purge_step).
    tb, want = tb_scalars(run_dir / "tensorboard"), metric_series(rows)
    assert {k: set(v) for k, v in tb.items()} == {k: set(v) for k, v in want.items()}
    assert all(tb[k][s] == pytest.approx(v, rel=1e-6) for k in want for s, v in want[k].items())


def test_restored_weights_equal_saved(tmp_path: Path):
    cfg = tiny_config()
    torch.manual_seed(0)
    policy, _ = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    for p in learner.policy.parameters():
        p.data.add_(0.5)
    learner.steps, learner.version = 7, 6
    state = {
        "step": 7,
        "version": 6,
        "policy": learner.policy.state_dict(),
        "critic": learner.critic.state_dict(),
        "policy_opt": learner.policy_opt.state_dict(),
        "critic_opt": learner.critic_opt.state_dict(),
    }
    save_checkpoint(tmp_path, 7, state)

    torch.manual_seed(1)
    fresh = Learner(cfg, load_policy(cfg.model)[0], torch.device("cpu"))
    fresh.load_state(load_latest_checkpoint(tmp_path)[1])
    assert (fresh.steps, fresh.version) == (7, 6)
    for (n, a), b in zip(
        learner.policy.state_dict().items(), fresh.policy.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), n
    for (n, a), b in zip(
        learner.critic.state_dict().items(), fresh.critic.state_dict().values(), strict=True
    ):
        assert torch.equal(a, b), n


def test_damaged_latest_checkpoint_falls_back_to_previous(tmp_path: Path):
    save_checkpoint(tmp_path, 2, {"step": 2})
    save_checkpoint(tmp_path, 4, {"step": 4})
    (tmp_path / "checkpoints" / "step_00000004.pt").write_bytes(b"truncated")
    path, state = load_latest_checkpoint(tmp_path)
    assert state["step"] == 2 and path.name == "step_00000002.pt"


def test_resume_of_a_finished_run_changes_nothing_unless_total_steps_is_raised(tmp_path: Path):
    run_dir = tmp_path / "r"
    base = [*TINY, "learner.sft_steps=2", f"run.output_dir={tmp_path}", "run.name=r"]
    first = subprocess.run(
        _saorl("train", *base, "run.total_steps=2"), capture_output=True, text=True, timeout=300
    )
    assert first.returncode == 0, first.stderr
    # It ends with a headline: held-out accuracy before -> after, steps, wall time.
    last = first.stdout.strip().splitlines()[-1]
    assert last.startswith("saorl train: held-out accuracy ") and " in 2 steps; " in last, last
    assert "warm-up" in last
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["warmup_seconds"] > 0 and summary["wall_seconds"] > 0
    files = ("summary.json", "metrics.jsonl", "config.toml")
    before = {name: (run_dir / name).read_bytes() for name in files}
    ckpts = [p.name for p in list_checkpoints(run_dir)]

    done = subprocess.run(
        _saorl("train", "--resume", str(run_dir)), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert f"{run_dir} is complete (step 2 of run.total_steps 2); nothing changed" in done.stderr
    assert "resuming" not in done.stderr
    assert {name: (run_dir / name).read_bytes() for name in files} == before
    assert [p.name for p in list_checkpoints(run_dir)] == ckpts

    more = subprocess.run(
        _saorl("train", "--resume", str(run_dir), "run.total_steps=3"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert more.returncode == 0, more.stderr
    assert f"saorl: resuming {run_dir} from step 2 (run.total_steps 3)" in more.stderr
    resumed = json.loads((run_dir / "summary.json").read_text())
    assert resumed["steps"] == 3 and resumed["final_eval_accuracy"] is not None
    # The warm-up ran once, before the first run's steps: its time is kept, beside wall_seconds.
    assert resumed["warmup_seconds"] == summary["warmup_seconds"]
    keys = list(resumed)
    assert keys.index("warmup_seconds") == keys.index("wall_seconds") + 1
