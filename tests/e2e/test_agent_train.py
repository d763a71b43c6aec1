"""Agent programs trained by `saorl train` end to end: the two examples by their configs (on
their reasoning-gym task), and a command agent, each for a couple of steps on the tiny model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from saorl.cli.main import main
from saorl.security.trust import FLAG

pytest.importorskip("openai")
ROOT = Path(__file__).resolve().parents[2]
TINY = [
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=48",
    "learner.batch_size=8",
    "learner.micro_batch_size=8",
    "learner.sft_steps=2",
    "rollout.max_new_tokens=6",
    "rollout.max_concurrent=8",
    "critic.warmup_steps=1",
    "run.progress=false",
    "run.eval_samples=1",
    "run.total_steps=2",
    "run.eval_every=0",
    "env.eval_size=8",
    "run.trackers=[]",
]
COMMAND = """
import json, os, sys, urllib.request
task = json.loads(sys.stdin.read())
body = {"model": os.environ["OPENAI_MODEL"], "stream": True,
        "messages": [{"role": "user", "content": task["prompt"]}]}
req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
    data=json.dumps(body).encode(), headers={"Content-Type": "application/json",
    "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
text = ""
for line in urllib.request.urlopen(req):
    line = line.decode().strip()
    if line.startswith("data: {"):
        for choice in json.loads(line[6:])["choices"]:
            text += choice["delta"].get("content") or ""
print(json.dumps({"reward": float(text.strip() == task["answer"])}))
"""


def _rows(run: Path) -> list[dict]:
    return [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("example", ["agent_openai", "agent_sdk"])
def test_example_agents_train(example, tmp_path, monkeypatch):
    pytest.importorskip("reasoning_gym")  # the examples' tasks
    if example == "agent_sdk":
        pytest.importorskip("agents")
    monkeypatch.chdir(ROOT)  # the configs name their agent relative to the repository root
    config = ROOT / "examples" / f"{example}.toml"
    assert main(["train", "--config", str(config), f"run.output_dir={tmp_path}", *TINY]) == 0
    run = tmp_path / example
    rows = [r for r in _rows(run) if "loss/policy" in r or "critic/loss" in r]
    assert len(rows) == 2
    for r in rows:
        assert r["agent/calls"] == 1.0 and r["agent/segments"] == 1.0
        assert r["agent/retokenize_mismatch"] == 0.0 and r["rollout/failed"] == 0
    if example == "agent_openai":
        assert all(r["agent/reply_chars"] >= 0 for r in rows)
    final = json.loads((run / "summary.json").read_text())
    assert final["final_eval_accuracy"] is not None  # held-out episodes ran through agents


@pytest.mark.parametrize("concurrency", ["threads", "process"])
def test_a_command_agent_trains(tmp_path, monkeypatch, concurrency):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agent.py").write_text(COMMAND)
    args = [
        f"run.concurrency={concurrency}",  # process: the children build the env themselves
        "env.name=agent",
        f"env.agent.command={sys.executable} agent.py",
        "env.agent.tasks=arithmetic",
        "run.output_dir=runs",
        "run.name=cmd",
        *TINY,
    ]
    assert main(["train", *args]) == 0
    rows = [r for r in _rows(tmp_path / "runs" / "cmd") if "rollout/reward_mean" in r]
    assert len(rows) == 2 and all(r["agent/calls"] == 1.0 for r in rows)
    assert all(r["rollout/failed"] == 0 for r in rows)
    # The run folder reached the programs as an argument (build_env's run_dir): their
    # SAORL_AGENT_HOME, made by saorl in it.
    assert (tmp_path / "runs" / "cmd" / "agents").is_dir()
    if concurrency == "process":
        return  # the evaluation below does not depend on where the training's workers ran
    # `saorl eval RUN` runs the held-out episodes through the same agent and endpoint; the
    # command the run folder names runs only when trusted (saorl.security.trust).
    out = tmp_path / "eval.jsonl"
    assert main(["eval", str(tmp_path / "runs" / "cmd"), "--out", str(out)]) == 2
    assert main(["eval", str(tmp_path / "runs" / "cmd"), "--out", str(out), FLAG]) == 0
    per_problem = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(per_problem) == 8  # env.eval_size


@pytest.mark.slow
def test_agents_under_ray_call_their_own_actors_endpoint(tmp_path):
    """`--ray` with two rollout actors: each serves its own endpoint (a port of its own) and
    the agents it runs call that one."""
    pytest.importorskip("ray")
    seen = tmp_path / "seen"
    seen.mkdir()
    agent = tmp_path / "agent.py"
    agent.write_text(
        "import os, uuid\n"
        f"SEEN = {str(seen)!r}\n"
        + COMMAND.replace(
            "print(json.dumps(",
            "open(os.path.join(SEEN, uuid.uuid4().hex), 'w').write("
            "os.environ['OPENAI_BASE_URL'].split('/episodes/')[0] + ' '"
            " + os.environ['SAORL_WORKER'])\n"
            "print(json.dumps(",
        )
    )
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            "--ray",
            "ray.num_cpus=2",
            "rollout.num_workers=2",
            "ray.rollout_num_cpus=0.5",
            "env.name=agent",
            f"env.agent.command={sys.executable} {agent}",
            "env.agent.tasks=arithmetic",
            f"run.output_dir={tmp_path}",
            "run.name=ray",
            *TINY,
        ],
        capture_output=True,
        text=True,
        timeout=400,
        cwd=tmp_path,
    )
    assert out.returncode == 0, out.stderr[-4000:]
    rows = [r for r in _rows(tmp_path / "ray") if "rollout/reward_mean" in r]
    assert len(rows) == 2 and all(r["agent/calls"] == 1.0 for r in rows)
    served = {tuple(p.read_text().split()) for p in seen.iterdir()}
    by_actor = {worker: {root for root, w in served if w == worker} for _, worker in served}
    # One endpoint per rollout actor (the final evaluation runs in the driver, on its own).
    assert len(by_actor["rollout-0"]) == len(by_actor["rollout-1"]) == 1, served
    assert by_actor["rollout-0"] != by_actor["rollout-1"]
    assert all(root.startswith("http://127.0.0.1:") for root, _ in served)
