"""A run folder has one writer: a second `saorl train` on a live run's folder (the same run.name,
or `--resume` of a run still training) is refused with exit code 2 naming the PID and host that
hold it, and leaves the live run's files alone; two runs started at once never share a folder;
a lock left by a killed process is taken over and reported; `saorl eval` reads without it."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from saorl.run.lock import LOCK_FILE, RunLock, RunLockedError, claim_fresh
from tests.faults._common import TINY_SYNC, metric_rows, run_saorl, saorl_cmd

pytestmark = pytest.mark.faults


def _claim(out: str, name: str, result) -> None:
    try:
        lock = claim_fresh(Path(out), name)
        (lock.run_dir / "metrics.jsonl").write_text("")  # a run lives here now
        result.put(("ok", lock.run_dir.name))
        time.sleep(1.0)  # held while the others try
        lock.release()
    except RunLockedError as e:
        result.put(("refused", str(e)))


def test_starters_at_once_never_share_a_folder(tmp_path: Path):
    ctx = multiprocessing.get_context("fork")
    result = ctx.Queue()
    procs = [ctx.Process(target=_claim, args=(str(tmp_path), "run", result)) for _ in range(6)]
    for p in procs:
        p.start()
    got = [result.get(timeout=120) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    claimed = [name for kind, name in got if kind == "ok"]
    assert claimed and len(claimed) == len(set(claimed))  # no folder given out twice
    refused = [why for kind, why in got if kind == "refused"]
    assert all("being written by another saorl train (PID" in why for why in refused)
    assert len(claimed) + len(refused) == len(procs)


def test_a_killed_holder_leaves_a_lock_that_is_taken_over(tmp_path: Path):
    code = (
        "import os, signal; from saorl.run.lock import RunLock; "
        f"RunLock({str(tmp_path)!r}).acquire(); os.kill(os.getpid(), signal.SIGKILL)"
    )
    dead = subprocess.run([sys.executable, "-c", code], timeout=60)
    assert dead.returncode == -signal.SIGKILL
    holder = json.loads((tmp_path / LOCK_FILE).read_text())
    assert holder["host"] == socket.gethostname()
    lock = RunLock(tmp_path)
    stale = lock.acquire()  # the kernel dropped the dead process's lock
    assert stale is not None and f"PID {holder['pid']} on host {holder['host']}" in stale
    lock.release()
    assert (tmp_path / LOCK_FILE).read_text() == ""  # a clean release leaves nothing stale
    assert RunLock(tmp_path).acquire() is None


@pytest.mark.slow
def test_a_second_writer_of_a_live_run_is_refused(tmp_path: Path):
    base = [
        *TINY_SYNC,
        f"run.output_dir={tmp_path}",
        "run.save_hf=false",
        "run.keep_last_checkpoints=0",
    ]
    cmd = saorl_cmd("train", *base, "run.total_steps=100000", "run.name=live")
    live = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    run_dir = tmp_path / "live"
    try:
        while not (run_dir / "checkpoints" / "step_00000002.pt").exists():
            assert live.poll() is None, live.communicate()[1][-2000:]
            time.sleep(0.1)
        who = f"PID {live.pid} on host {socket.gethostname()}"
        for args in (["--resume", str(run_dir)], [*base, "run.name=live"]):
            second = run_saorl("train", *args)
            assert second.returncode == 2, second.stderr
            assert who in second.stderr and str(run_dir) in second.stderr, second.stderr
            assert "Traceback" not in second.stderr
        assert not (tmp_path / "live-1").exists()  # the refused start left nothing
        before = len(metric_rows(run_dir))
        # a reader needs no lock
        ckpt = run_dir / "checkpoints" / "step_00000001.pt"
        ev = run_saorl("eval", str(ckpt), "--limit", "2", "--out", str(tmp_path / "e.jsonl"))
        assert ev.returncode == 0, ev.stderr
        assert len(metric_rows(run_dir)) > before  # still training, its rows not cut away
    finally:
        live.send_signal(signal.SIGTERM)
        live.communicate(timeout=300)
    assert live.returncode == 143
    rows = metric_rows(run_dir)
    steps = [r["step"] for r in rows]
    assert steps == list(range(len(steps)))  # every row once: one writer
    again = run_saorl("train", "--resume", str(run_dir), f"run.total_steps={steps[-1] + 1}")
    assert again.returncode == 0, again.stderr  # the lock went with the process
    assert os.path.getsize(run_dir / LOCK_FILE) == 0
