"""OpenEnv servers that hold few sessions (`create_app`'s default is one): saorl keeps its
episodes at or below the server's capacity, waits and tries again when a session is refused,
and says once why the run is slow (saorl.envs.openenv, no openenv-core needed: a fake server
speaks the WebSocket protocol's messages; the rollout worker and its feed are real)."""

from __future__ import annotations

import asyncio
import json
import queue
import random
import threading
import time
from collections import deque

import pytest

from saorl.envs import openenv
from saorl.envs.base import EnvBusy
from saorl.envs.openenv import OpenEnvEnv, SeedTask, SeedTasks
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_tool_call_loop import _tokenizer

SCHEMA = {"title": "GuessAction", "type": "object", "properties": {"guess": {"type": "integer"}}}


class FakeServer:
    """Sessions as openenv-core's server counts them: at most `capacity`; one more is answered
    CAPACITY_REACHED (with `max_sessions`) and closed."""

    def __init__(self, capacity: int) -> None:
        self.capacity, self.sessions, self.most = capacity, 0, 0
        self.refused = 0
        self.lock = threading.Lock()
        self.free_on_refusal: tuple[int, FakeSocket] | None = None  # another client leaves

    def connect(self) -> FakeSocket:
        with self.lock:
            if self.sessions >= self.capacity:
                self.refused += 1
                text = f"Server at capacity: {self.sessions}/{self.capacity} sessions active."
                error = {"message": text, "code": "CAPACITY_REACHED"}
                error.update(active_sessions=self.sessions, max_sessions=self.capacity)
                if self.free_on_refusal and self.free_on_refusal[0] == self.refused:
                    self.sessions -= 1
                    self.free_on_refusal[1].session = False
                return FakeSocket(self, {"type": "error", "data": error}, session=False)
            self.sessions += 1
            self.most = max(self.most, self.sessions)
            return FakeSocket(self, None, session=True)

    def end(self) -> None:
        with self.lock:
            self.sessions -= 1


class FakeSocket:
    def __init__(self, server: FakeServer, first: dict | None, session: bool) -> None:
        self.server, self.session = server, session
        self.replies: deque = deque([first] if first else [])

    async def send(self, text: str) -> None:
        message = json.loads(text)
        if message["type"] == "reset" and self.session:
            obs = {"observation": {"hint": "guess"}, "reward": None, "done": False}
            self.replies.append({"type": "observation", "data": obs})
        elif message["type"] == "close":
            self._end()

    async def recv(self) -> str:
        return json.dumps(self.replies.popleft())

    async def wait_closed(self) -> None:
        pass

    async def close(self) -> None:
        self._end()

    def _end(self) -> None:
        if self.session:
            self.session = False
            self.server.end()


@pytest.fixture
def server(monkeypatch):
    fake = FakeServer(capacity=1)

    async def connect(self, url):
        self._loop = asyncio.get_running_loop()
        self._ws = fake.connect()

    monkeypatch.setattr(OpenEnvEnv, "_connect", connect)
    monkeypatch.setattr(openenv, "fetch_schema", lambda base, timeout_s: SCHEMA)
    monkeypatch.setattr(openenv, "RETRY_S", (0.01, 0.05))
    monkeypatch.setattr(openenv, "_SESSIONS", {})
    return fake


def test_a_refused_session_waits_for_one_another_client_frees(server, capsys):
    server.free_on_refusal = (3, server.connect())  # another client's, freed at 3 refusals
    env = OpenEnvEnv("http://fake:1", timeout_s=60)
    messages = asyncio.run(env.reset(SeedTask(1)))
    assert "guess" in messages[0]["content"] and server.refused == 3
    assert env.room() == 0  # the capacity is known now, and this episode holds the session
    asyncio.run(env.aclose())
    assert env.room() == 1 and server.sessions == 0
    err = capsys.readouterr().err
    assert err.count("holds 1 session(s) at once") == 1 and "the run is slow" in err


def test_refused_while_this_process_holds_every_session_is_busy_not_failed(server):
    async def two():
        first, second = OpenEnvEnv("http://fake:1"), OpenEnvEnv("http://fake:1")
        await first.reset(SeedTask(1))
        with pytest.raises(EnvBusy, match="1/1 sessions"):
            await second.reset(SeedTask(2))
        await first.aclose()

    asyncio.run(two())
    assert server.sessions == 0


def test_a_session_never_freed_fails_after_the_step_timeout(server):
    server.connect()  # held for good by another client
    env = OpenEnvEnv("http://fake:1", timeout_s=0.5)
    with pytest.raises(openenv.OpenEnvFailure, match=r"^capacity_reached: .*for 0\.5 s"):
        asyncio.run(env.reset(SeedTask(1)))
    assert server.refused > 1 and server.sessions == 1  # tried again; took nothing


def test_a_one_session_server_runs_every_episode_one_at_a_time(server):
    """The rollout worker asks for 8 episodes at once; the server holds one: every episode
    ends (none fails), and never more than one session was open."""
    tok = _tokenizer("hermes")
    engine = ScriptedEngine(tok, ["no call"] * 8)  # a reply without a call ends the episode
    engine.max_concurrent = 8
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(max_seq_len=4096, max_new_tokens=50, max_turns=2, max_tool_calls=2)
    feed = PromptFeed(SeedTasks(0, 0), random.Random(0), 8, 1)
    make_env = lambda: OpenEnvEnv("http://fake:1", key="fake")  # noqa: E731
    worker = RolloutWorker(engine, feed, tok, out, make_env, limits)
    trajs = []
    deadline = time.monotonic() + 60
    while len(trajs) < 8 and time.monotonic() < deadline:
        worker.fill()
        worker.step()
        while not out.empty():
            trajs.append(out.get_nowait())
        time.sleep(0.002)
    worker.stop_thread()
    assert len(trajs) == 8 and {t.stop_reason for t in trajs} == {"answer"}
    assert server.most == 1 and server.refused == 1  # refused once: that told the capacity
