"""`saorl train` with a command agent leaves no process behind: not at a normal end, not after
SIGTERM; and episodes whose programs time out are failures the first-batch check counts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid

from saorl.cli.main import main
from saorl.rollout import collector
from tests._procs import processes_with
from tests.e2e.test_agent_train import COMMAND, TINY

# COMMAND (plain HTTP to the endpoint), after leaving a helper process running and sleeping
# `SAORL_TEST_SLEEP` seconds; the marker is in both command lines.
AGENT = (
    "import subprocess, sys, time, os\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[1]],"
    " stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
    "time.sleep(float(os.environ.get('SAORL_TEST_SLEEP', '0')))\n" + COMMAND
)


def _args(tmp_path, name: str) -> tuple[list[str], bytes]:
    (tmp_path / "agent.py").write_text(AGENT)
    marker = f"saorl-test-{uuid.uuid4().hex}"
    args = [
        "env.name=agent",
        f"env.agent.command={sys.executable} {tmp_path / 'agent.py'} {marker}",
        "env.agent.tasks=arithmetic",
        # Command agents get only the variables listed (docs/security.md): the test's sleep too.
        "env.agent.env_passthrough=['SAORL_TEST_SLEEP']",
        f"run.output_dir={tmp_path}",
        f"run.name={name}",
        *TINY,
        "run.total_steps=3",
    ]
    return args, marker.encode()


def test_a_command_agent_run_leaves_no_process(tmp_path):
    args, marker = _args(tmp_path, "ends")
    assert main(["train", *args]) == 0
    rows = [json.loads(x) for x in (tmp_path / "ends" / "metrics.jsonl").read_text().splitlines()]
    assert [r["rollout/failed"] for r in rows if "rollout/failed" in r] == [0, 0, 0]
    assert processes_with(marker) == []


def test_sigterm_to_saorl_train_leaves_no_agent_process(tmp_path):
    args, marker = _args(tmp_path, "term")
    proc = subprocess.Popen(
        [sys.executable, "-m", "saorl", "train", *args, "run.stop_timeout_s=60"],
        env={**os.environ, "SAORL_TEST_SLEEP": "3"},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )

    def agents() -> list[int]:  # saorl's own command line names the agent command too
        return [p for p in processes_with(marker) if p != proc.pid]

    try:
        deadline = time.monotonic() + 240
        while not agents() and time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode()[-3000:]
            time.sleep(0.2)
        assert agents(), "no agent started"
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, out.decode()[-3000:]
    assert processes_with(marker) == []


def test_timed_out_episodes_stop_the_first_batch(tmp_path, capsys, monkeypatch):
    """And a batch that takes long to form says what its episodes are doing."""
    monkeypatch.setattr(collector, "QUIET_S", 1.0)
    monkeypatch.setenv("SAORL_TEST_SLEEP", "300")
    args, marker = _args(tmp_path, "hang")
    assert main(["train", *args, "env.step_timeout_s=3", "rollout.max_agent_processes=8"]) == 2
    err = capsys.readouterr().err
    assert "of the first" in err and "ran past 3 s" in err, err[-3000:]
    waiting = [x for x in err.splitlines() if x.startswith("saorl: no batch for")]
    assert waiting and "agent processes running (at most 8 at once" in waiting[0], err[-3000:]
    assert processes_with(marker) == []
