"""A stopped run saves: SIGTERM (a scheduler's preemption notice) or Ctrl-C during `saorl train`
finishes the step in flight, checkpoints it, writes summary.json (`stopped_by: signal`), prints
where it stopped and the `--resume` command and exits 143 / 130; the resumed run trains no step
twice and loses none (a synchronous run: the same numbers as one never stopped). A second signal
stops at once."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from saorl.checkpoint.io import list_checkpoints, load_latest_checkpoint
from saorl.run.signals import SignalExit, StopSignals
from tests.faults._common import TINY_SYNC, assert_same_metrics, metric_rows, run_saorl, saorl_cmd

pytestmark = pytest.mark.faults

STEPS = 30
# checkpoint_every=0: the only checkpoints are step 0, the one the signal asks for, and the end
BASE = [*TINY_SYNC, f"run.total_steps={STEPS}", "run.checkpoint_every=0", "run.save_hf=false"]


def _rows_reach(run_dir: Path, step: int, proc: subprocess.Popen) -> None:
    """Wait until metrics.jsonl holds a row of `step` (the run is mid-way)."""
    metrics = run_dir / "metrics.jsonl"
    while proc.poll() is None:
        lines = metrics.read_text().split("\n")[:-1] if metrics.exists() else []
        if any(json.loads(x).get("step") == step for x in lines):
            return
        time.sleep(0.05)
    raise AssertionError(f"the run ended before step {step}: {proc.communicate()[1][-2000:]}")


def _stop_mid_run(tmp_path: Path, sig: int) -> tuple[subprocess.CompletedProcess, Path]:
    run_dir = tmp_path / "stopped"
    cmd = saorl_cmd("train", *BASE, f"run.output_dir={tmp_path}", "run.name=stopped")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _rows_reach(run_dir, 3, proc)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), run_dir


@pytest.mark.slow
def test_sigterm_saves_and_the_resume_trains_no_step_twice(tmp_path: Path):
    done, run_dir = _stop_mid_run(tmp_path, signal.SIGTERM)
    assert done.returncode == 143, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    stopped = summary["steps"]
    assert 3 <= stopped < STEPS and summary["stopped_by"] == "signal"
    assert summary["signal"] == "SIGTERM" and "SIGTERM" in summary["stop_reason"]
    # the step in flight was finished and checkpointed: nothing since the last row is lost
    assert [r["step"] for r in metric_rows(run_dir)] == list(range(stopped + 1))
    path, state = load_latest_checkpoint(run_dir)
    assert state["step"] == stopped and path.name == f"step_{stopped:08d}.pt"
    assert f"after step {stopped} of {STEPS}" in done.stderr and path.name in done.stderr
    assert f"resume with: saorl train --resume {run_dir}" in done.stderr
    assert "Traceback" not in done.stderr and not (run_dir / "final").exists()

    resumed = run_saorl("train", "--resume", str(run_dir))
    assert resumed.returncode == 0, resumed.stderr
    ref = run_saorl("train", *BASE, f"run.output_dir={tmp_path}", "run.name=ref")
    assert ref.returncode == 0, ref.stderr
    # every step exactly once, with the numbers of the run that was never stopped
    assert_same_metrics(metric_rows(run_dir), metric_rows(tmp_path / "ref"))


def test_sigint_saves_and_exits_130(tmp_path: Path):
    done, run_dir = _stop_mid_run(tmp_path, signal.SIGINT)
    assert done.returncode == 130, done.stderr
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["signal"] == "SIGINT" and summary["stopped_by"] == "signal"
    assert int(list_checkpoints(run_dir)[-1].name[5:13]) == summary["steps"]
    assert "resume with:" in done.stderr and "Traceback" not in done.stderr


def test_a_second_signal_stops_at_once():
    with StopSignals() as stops:
        os.kill(os.getpid(), signal.SIGTERM)
        assert stops.requested() == signal.SIGTERM  # the first: only noted
        with pytest.raises(SignalExit) as got:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)  # the handler raises before this returns
    assert got.value.code == 143 and "second SIGINT" in str(got.value)
    assert signal.getsignal(signal.SIGTERM) is not stops._handle  # handlers restored


def test_the_stop_timeout_stops_at_once():
    with StopSignals(timeout_s=0.2), pytest.raises(SignalExit) as got:
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(3000):  # the watchdog interrupts this within the timeout
            time.sleep(0.01)
    assert got.value.code == 130 and "run.stop_timeout_s" in str(got.value)


def test_a_learner_that_declares_agree_stop_decides_for_every_rank():
    class Ranks:  # as torchrun's LeaderLearner: another rank got SIGTERM
        def __init__(self) -> None:
            self.asked: list[int] = []

        def agree_stop(self, signum: int) -> int:
            self.asked.append(signum)
            return int(signal.SIGTERM)

    class OneProcess:  # declares nothing: this process's own signal alone
        pass

    with StopSignals() as stops:
        assert stops.requested(OneProcess()) == 0
        ranks = Ranks()
        assert stops.requested(ranks) == signal.SIGTERM and ranks.asked == [0]
        assert stops.signum == signal.SIGTERM  # said here too, as if it came here
