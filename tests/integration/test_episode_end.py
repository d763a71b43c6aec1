"""`end_episode`, an environment's optional hook: the rollout worker calls it once when an
episode ends, however it ends (the environment said done, max_turns, a failed step, a turn
cut at its token budget), and work it scheduled on the environment loop finishes before the
worker stops."""

from __future__ import annotations

import asyncio
import queue
import random
import time

import pytest

from saorl.envs.base import StepResult
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from tests.integration.test_agent_loop import TEMPLATE, ScriptedEngine, _Tasks


class HeldEnv:
    """Holds a 'session' from reset to `end_episode`, which releases it on the env loop."""

    offload = True
    ended: list[str] = []  # noqa: RUF012 (shared on purpose: one list per test)
    released: list[str] = []  # noqa: RUF012

    def __init__(self, mode: str = "done") -> None:
        self.mode, self.loop = mode, None

    async def reset(self, task):
        self.loop = asyncio.get_running_loop()
        return [{"role": "user", "content": task.text}]

    async def step(self, action_text: str) -> StepResult:
        if self.mode == "fail":
            raise RuntimeError("server down")
        if self.mode == "done":
            return StepResult(reward=1.0, done=True)
        return StepResult([{"role": "tool", "content": "more"}], info={"tool_call": True})

    def end_episode(self) -> None:
        type(self).ended.append(self.mode)

        async def release():
            await asyncio.sleep(0.05)
            type(self).released.append(self.mode)

        self.loop.call_soon_threadsafe(lambda: self.loop.create_task(release()))


@pytest.fixture
def tok():
    t = build_char_tokenizer()
    t.chat_template = TEMPLATE
    HeldEnv.ended, HeldEnv.released = [], []
    return t


def _episode(tok, turns, mode, **limits):
    engine = ScriptedEngine(tok, turns)
    out: queue.Queue = queue.Queue()
    lim = AgentLimits(
        **{"max_seq_len": 64, "max_new_tokens": 8, "max_turns": 4, "max_tool_calls": 4, **limits}
    )
    feed = PromptFeed(_Tasks(), random.Random(0), 1, 1)
    worker = RolloutWorker(engine, feed, tok, out, lambda: HeldEnv(mode), lim)
    worker.fill()
    deadline = time.monotonic() + 30  # env steps run on the worker's event-loop thread
    while out.empty() and time.monotonic() < deadline:
        worker.step()
        time.sleep(0.005)
    return out.get_nowait(), worker


@pytest.mark.parametrize(
    ("mode", "turns", "limits", "reason"),
    [
        ("done", ["4"], {}, "answer"),
        ("more", ["a", "b"], {"max_turns": 2}, "max_turns"),
        ("fail", ["4"], {}, "env_error"),
        ("more", ["a" * 20], {"max_new_tokens": 4}, "length"),
    ],
)
def test_end_episode_is_called_once_however_the_episode_ends(tok, mode, turns, limits, reason):
    traj, worker = _episode(tok, turns, mode, **limits)
    assert traj.stop_reason == reason
    assert HeldEnv.ended == [mode]
    worker.stop_thread()


def test_work_scheduled_at_the_end_finishes_before_the_worker_stops(tok):
    traj, worker = _episode(tok, ["4"], "done")
    assert traj.stop_reason == "answer" and HeldEnv.ended == ["done"]
    assert HeldEnv.released == []  # still on the env loop (50 ms)
    worker.stop_thread()  # lets it finish first
    assert HeldEnv.released == ["done"]
