"""The trainer's side of the verifiers runner protocol (`saorl.envs.verifiers_env.Runner`)
against a real child process that speaks it (a stand-in for `verifiers_runner serve`, which
needs verifiers): concurrent episodes matched to their replies, an episode's error, a cancel
reaching the process, and a process that dies failing its episodes and being started again."""

from __future__ import annotations

import asyncio
import sys

import pytest

from saorl.envs.base import AgentFailure
from saorl.envs.verifiers_env import Runner

# Replies out of order; index 7 fails; index 8 never ends; index 9 kills the process; the ids
# of cancelled episodes are written to the file named by argv[1].
STAND_IN = r"""
import json, sys, threading, time
print("not a reply: a library printing to stdout", flush=True)
lock = threading.Lock()  # whole lines, as the runner's one event loop writes them: print() from
# threads writes the text and its newline apart, and two replies on one line are lost
def answer(req):
    time.sleep(0.2 if req["index"] == 1 else 0.0)
    i = req["index"]
    if i == 7:
        out = {"id": req["id"], "error": "RuntimeError: the rubric raised"}
    else:
        result = {"reward": i / 10, "env/index": i, "url": req["base_url"]}
        out = {"id": req["id"], "result": result}
    with lock:
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
for line in sys.stdin:
    req = json.loads(line)
    if "cancel" in req:
        with open(sys.argv[1], "a") as f:
            f.write(f"{req['cancel']}\n")
        continue
    if req["index"] == 9:
        sys.exit(3)
    if req["index"] == 8:
        continue  # never answers: only a cancel ends it
    threading.Thread(target=answer, args=(req,)).start()
"""


def _runner(log: str = "/dev/null") -> Runner:
    return Runner([sys.executable, "-c", STAND_IN, log], None)  # type: ignore[arg-type]


def test_concurrent_episodes_get_their_own_replies():
    async def go():
        runner = _runner()
        results = await asyncio.gather(*(runner.episode(i, f"u{i}") for i in (1, 2, 3)))
        proc = runner.proc
        await runner.close()
        return runner, results, proc.returncode

    runner, results, code = asyncio.run(go())
    assert code == 0  # close(): its stdin closed, the process ended by itself
    assert [r["env/index"] for r in results] == [1, 2, 3]
    assert [r["url"] for r in results] == ["u1", "u2", "u3"]
    assert not runner.pending


def test_an_episode_error_a_cancel_and_a_dead_process(tmp_path):
    cancelled = tmp_path / "cancelled"

    async def go():
        runner = _runner(str(cancelled))
        with pytest.raises(AgentFailure, match="the rubric raised") as failed:
            await runner.episode(7, "u")
        assert failed.value.reason == "verifiers"
        hung = asyncio.ensure_future(runner.episode(8, "u"))
        await asyncio.sleep(0.5)
        hung.cancel()  # as the worker does past env.step_timeout_s
        with pytest.raises(asyncio.CancelledError):
            await hung
        for _ in range(100):  # the process reads the cancel shortly after
            if cancelled.exists():
                break
            await asyncio.sleep(0.05)
        assert cancelled.read_text() == "1\n"  # episode ids count from 0: index 7's, then 8's
        first = runner.proc
        with pytest.raises(AgentFailure, match="exited with 3") as died:
            await runner.episode(9, "u")
        assert died.value.reason == "exit"
        again = await runner.episode(2, "u")  # a new process for the next episode
        assert runner.proc is not first and again["reward"] == 0.2
        return runner

    runner = asyncio.run(go())
    assert not runner.pending
