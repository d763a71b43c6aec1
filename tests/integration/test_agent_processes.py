"""Command agents' processes (`env.agent.command`, saorl.envs.agent_procs): at most
`rollout.max_agent_processes` run at once, and each goes with its whole process group when its
episode ends or times out: what a program leaves running does not outlive its episode."""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import sys
import textwrap
import uuid

from saorl.envs import agent_procs
from tests._procs import processes_with
from tests.integration._endpoint_harness import run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_endpoint import TASK, _tok

# Records how many programs run beside it (files in RUNNING), leaves a helper process running
# (its command line holds MARKER), calls the model once and prints its reward; "hang" mode
# sleeps past the episode's timeout instead.
AGENT = textwrap.dedent("""
    import json, os, subprocess, sys, time, urllib.request

    running, marker = sys.argv[1], sys.argv[2]
    task = json.loads(sys.stdin.read())
    mine = os.path.join(running, str(os.getpid()))
    open(mine, "w").close()
    seen = len(os.listdir(running))
    subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker],
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL)
    time.sleep(0.3)
    if task["mode"] == "hang":
        time.sleep(300)
    body = {"model": os.environ["OPENAI_MODEL"],
            "messages": [{"role": "user", "content": task["prompt"]}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(), headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    text = json.loads(urllib.request.urlopen(req).read())["choices"][0]["message"]["content"]
    os.remove(mine)
    print(json.dumps({"reward": float(text == "42"), "seen": seen}))
""")


def _agent(tmp_path) -> tuple[str, bytes]:
    script, running = tmp_path / "agent.py", tmp_path / "running"
    script.write_text(AGENT)
    running.mkdir()
    marker = f"saorl-test-{uuid.uuid4().hex}"
    return f"{sys.executable} {script} {running} {marker}", marker.encode()


def test_at_most_the_cap_run_at_once_and_nothing_they_leave_survives(tmp_path):
    command, marker = _agent(tmp_path)
    tok = _tok()
    engine = ScriptedEngine(tok, ["42"] * 6)
    engine.max_concurrent = 8  # the engine has room for all six: the cap decides

    def cap_at_two(worker):
        worker.limits.max_agent_processes = 2

    tasks = [{**TASK, "mode": "ok", "key": f"t{i}"} for i in range(6)]
    trajs, worker = run_agents(engine, tok, tasks, command=command, configure=cap_at_two)
    assert len(trajs) == 6 and all(t.reward == 1.0 for t in trajs), [t.info for t in trajs]
    assert max(t.info["agent/seen"] for t in trajs) <= 2
    assert worker.agents.cap == 2
    assert processes_with(marker) == []  # each helper went with its episode's process group


def test_a_timed_out_episode_takes_its_whole_group_with_it(tmp_path):
    command, marker = _agent(tmp_path)
    tok = _tok()
    tasks = [{**TASK, "mode": "hang", "key": "hang"}]
    trajs, worker = run_agents(ScriptedEngine(tok, []), tok, tasks, command=command, timeout_s=3)
    assert [t.info["agent/failure"] for t in trajs] == ["timeout"]
    doing = "rollout-worker: 0 episodes in flight; 0 agent processes running (at most"
    assert worker.describe().startswith(doing)  # what a run that waits long prints
    assert processes_with(marker) == []


def test_the_process_wide_cap_holds_across_event_loops(tmp_path):
    """Episodes of several rollout workers (an event loop each) share one cap."""
    running = tmp_path / "running"
    running.mkdir()
    script = (
        "import os, sys, time; p = os.path.join(sys.argv[1], str(os.getpid())); "
        "open(p, 'w').close(); n = len(os.listdir(sys.argv[1])); time.sleep(0.2); "
        "os.remove(p); print(n)"
    )
    command = f"{sys.executable} -c {json.dumps(script)} {running}"

    async def three() -> list[tuple[int, bytes, bytes]]:
        return await asyncio.gather(*(agent_procs.run(command, b"", {}) for _ in range(3)))

    agent_procs.set_max_processes(2)
    try:
        loops = [asyncio.new_event_loop() for _ in range(2)]
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            results = list(pool.map(lambda lp: lp.run_until_complete(three()), loops))
        for lp in loops:
            lp.close()
    finally:
        agent_procs.set_max_processes(0)
    counts = [int(out) for r in results for code, out, _ in r if code == 0]
    assert len(counts) == 6 and max(counts) <= 2
    assert "0 agent processes running (at most" in agent_procs.status()
