"""mini-swe-agent through saorl's real training endpoint and rollout worker, the engine scripted
to write hermes tool calls: its calls are recorded token by token as one trajectory (its tool
results are observation tokens, masked), its commands run in the sandbox, and the copy is
graded."""

from __future__ import annotations

import json
import queue
import time

from saorl.config import EnvConfig
from saorl.envs.factory import build_env
from saorl.envs.swe.spec import hermes_call
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_endpoint import TEMPLATE
from tests.integration.test_tool_call_loop import _tokenizer
from tests.miniswe_tier._marks import MINISWE_TIER, PYTHON, RUNNER

pytestmark = MINISWE_TIER


def test_tool_call_turns_are_one_trajectory_and_the_fix_is_graded(tmp_path):
    cfg = EnvConfig(
        name="agent",
        eval_size=1,
        step_timeout_s=300.0,
        agent={"tasks": "swe", "command": f"{PYTHON} {RUNNER}"},
        swe={
            "source": "generated",
            "num_tasks": 1,
            "cache_dir": str(tmp_path / "cache"),
            "test_timeout_s": 5.0,
        },
    )
    spec = build_env(cfg, held_out_only=True)
    task = spec.task.held_out[0]
    path, old, new = task.edit
    fix = (
        "python - <<'EOF'\nimport json, pathlib\n"
        f"p = pathlib.Path({json.dumps(path)})\n"
        f"p.write_text(p.read_text().replace({json.dumps(old)}, {json.dumps(new)}, 1))\nEOF"
    )
    submit = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"
    turns = [
        "THOUGHT: fix it." + hermes_call("bash", command=fix),
        "THOUGHT: done." + hermes_call("bash", command=submit),
    ]
    tok = _tokenizer("hermes")
    tok.chat_template = TEMPLATE
    engine = ScriptedEngine(tok, turns)
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(max_seq_len=32768, max_new_tokens=2000, env_timeout_s=300.0)
    feed = FixedFeed([task])
    worker = RolloutWorker(engine, feed, tok, out, spec.make_env, limits)
    worker.start()
    deadline = time.monotonic() + 330
    while (feed.items or worker.active) and time.monotonic() < deadline:
        assert worker.error is None, worker.error
        time.sleep(0.05)
    worker.stop_thread()
    trajs = [out.get_nowait() for _ in range(out.qsize())]
    assert len(trajs) == 1, [t.info.get("error") for t in trajs]
    traj = trajs[0]
    assert traj.stop_reason == "answer", traj.info.get("error")
    assert traj.reward == 1.0 and traj.info["resolved"]
    assert traj.info["agent/exit_status"] == "Submitted"
    assert traj.info["agent/calls"] == 2 and traj.info["agent/segments"] == 1
    assert traj.info["agent/retokenize_mismatch"] == 0
    # the sampled turns, exactly as the engine wrote them, are the trained tokens
    trained = [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if m]
    text = tok.decode(trained, skip_special_tokens=True)
    assert text == "".join(turns)
    observed = tok.decode(
        [t for t, m in zip(traj.completion_ids, traj.loss_mask, strict=True) if not m]
    )
    assert "<returncode>0</returncode>" in observed  # mini-swe-agent's tool result, masked
