"""mini-swe-agent on a task mined with `saorl swe-mine` from a git repository built here (a
SWE-bench-format row, `env.swe.source = "swebench"`): the row's problem statement (the fix's
commit message) is what mini-swe-agent is asked, its commands edit the checkout's copy in the
sandbox, and the row's FAIL_TO_PASS / PASS_TO_PASS tests grade it."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

from saorl.config import EnvConfig
from saorl.envs.factory import build_env
from tests._swe_repos import build_all
from tests.miniswe_tier._marks import MINISWE_TIER, PYTHON, ROOT
from tests.miniswe_tier.test_miniswe_episode import _scripted

pytestmark = MINISWE_TIER


def test_mini_swe_agent_resolves_a_mined_task(tmp_path: Path):
    setup = build_all(tmp_path)
    settings = [f"env.swe.pip_args={setup['pip_args']}", f"env.swe.cache_dir={tmp_path / 'cache'}"]
    out = tmp_path / "tasks.jsonl"
    mine = [sys.executable, "-m", "saorl", "swe-mine", str(setup["repos"] / "geom"), "--out"]
    mined = subprocess.run(
        [*mine, str(out), *settings], cwd=ROOT, capture_output=True, text=True, timeout=900
    )
    assert mined.returncode == 0, mined.stderr[-3000:]
    (row,) = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["FAIL_TO_PASS"] == ["tests/test_core.py::test_area"]

    cfg = EnvConfig(
        name="agent",
        agent={"tasks": "swe", "command": f'{PYTHON} "$SAORL_MINISWE_RUNNER"'},
        swe={
            "source": "swebench",
            "tasks": str(out),
            "repos_root": str(setup["repos"]),
            "pip_args": setup["pip_args"],
            "cache_dir": str(tmp_path / "cache"),
            "test_timeout_s": 30.0,
        },
    )
    spec = build_env(cfg, held_out_only=True, run_dir=tmp_path / "run")  # as `saorl train` does
    (task,) = spec.task.held_out
    commands = [
        "cat src/geom/core.py",
        "sed -i 's/return w + h$/return w * h/' src/geom/core.py",  # the fix of the mined commit
        "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT",
    ]
    server, seen = _scripted(commands)
    url = f"http://127.0.0.1:{server.server_port}/v1"
    program = spec.make_env()
    try:
        reward, info = asyncio.run(program.run(task, url, "key", lambda: [], worker="w"))
    finally:
        server.shutdown()
    asked = json.dumps(seen[0]["messages"])
    assert "Fix area() for rectangles" in asked  # the row's problem statement: the commit message
    assert "def area(w, h):\n    return w + h" in seen[1]["messages"][-1]["content"]
    assert info["agent/exit_status"] == "Submitted" and info["agent/commands"] == 3
    assert reward == 1.0 and info["resolved"] and info["changed_files"] == ["src/geom/core.py"]
    assert "+    return w * h" in info["patch"]
    assert (tmp_path / "run" / "agents" / "mini-swe-agent").is_dir()
