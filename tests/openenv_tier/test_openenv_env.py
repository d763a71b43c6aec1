"""OpenEnv episodes through the whole rollout worker, token in, token out: a real OpenEnv app
(tests/openenv_tier/_guess_env.py) served in-process on loopback, a hermes chat template that
renders the action's tool schema, scripted model turns with good and bad actions; an
unreachable server fails its episodes, a full one makes them wait, and every session is
closed."""

from __future__ import annotations

import asyncio
import queue
import random
import socket
import threading
import time

import pytest

from saorl.config import EnvConfig
from saorl.envs import openenv
from saorl.envs.factory import build_env
from saorl.envs.openenv import OpenEnvEnv, SeedTask, serve_app, ws_url
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from saorl.toolcalls import render_tool_call
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_tool_call_loop import _tokenizer
from tests.openenv_tier._marks import OPENENV_TIER

pytestmark = OPENENV_TIER
APP = "tests.openenv_tier._guess_env:app"
PLAIN = "tests.openenv_tier._guess_env:plain_app"


class _One:
    """Every episode gets the same task."""

    def __init__(self, task: SeedTask) -> None:
        self.task = task

    def sample(self, rng: random.Random) -> SeedTask:
        return self.task


def _run(make_env, turns: list[str], seed: int = 3, max_turns: int = 8):
    tok = _tokenizer("hermes")
    engine = ScriptedEngine(tok, turns)
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(
        max_seq_len=4096,
        max_new_tokens=200,
        max_turns=max_turns,
        max_tool_calls=max_turns,
        stop=("</tool_call>",),
    )
    feed = PromptFeed(_One(SeedTask(seed)), random.Random(0), 1, 1)
    worker = RolloutWorker(engine, feed, tok, out, make_env, limits)
    worker.fill()
    deadline = time.monotonic() + 60  # env steps run on the worker's event-loop thread
    while out.empty() and time.monotonic() < deadline:
        worker.step()
        time.sleep(0.005)
    return out.get_nowait(), tok


def _counts():
    from tests.openenv_tier._guess_env import GuessEnvironment

    return dict(GuessEnvironment.counts)


def _wait_closed(before: int) -> None:
    deadline = time.monotonic() + 10  # the session ends on the server shortly after
    while _counts()["close"] <= before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _counts()["close"] == before + 1


def guess(n) -> str:
    return render_tool_call("guess", {"guess": n}, "hermes")


def test_good_and_bad_actions_in_one_episode():
    cfg = EnvConfig(name="openenv", args={"max_guesses": 5}, openenv={"app": APP})
    spec = build_env(cfg)  # the app starts with the first episode
    closed = _counts()["close"]
    turns = [
        '<tool_call>{"name": "guess", </tool_call>',  # not JSON
        render_tool_call("play", {"guess": 1}, "hermes"),  # another tool
        guess(0),  # the action model rejects it (ge=1)
        render_tool_call("guess", {"guess": 2, "colour": "red"}, "hermes"),  # an extra field
        guess(8),  # the environment raises on it
        guess(2),  # wrong: "higher"
        guess(4),  # right (seed 3 -> 4)
    ]
    traj, tok = _run(spec.make_env, turns)

    assert traj.stop_reason == "answer" and traj.reward == 1.0
    assert traj.info["turns"] == 7 and traj.info["tool_calls"] == 7
    assert traj.info["tool_status"] == "ok"
    prompt = tok.decode(traj.prompt_ids)
    # The action's schema reached the template as the one tool, the reset observation (with
    # env.args as reset arguments) as the first user message, after the instructions.
    assert '"name": "guess"' in prompt and '"required": ["guess"]' in prompt
    assert '"metadata"' not in prompt
    assert "by calling the tool `guess` with <tool_call>" in prompt
    assert "Guess a number from 1 to 6 in 5 tries." in prompt
    whole = tok.decode(traj.completion_ids)
    for text in (
        "error: tool call is not valid JSON",
        "error: unknown tool 'play'; the tool is 'guess'",
        "error: invalid action: guess: Input should be greater than or equal to 1",
        "error: invalid action: colour: Extra inputs are not permitted",
        "error: eight is not allowed",
        "<tool_response>\nhigher\n</tool_response>",
    ):
        assert text in whole, text
    # Observations are not trained on: mask 0 wherever the environment spoke.
    first_obs = whole.index("error: tool call")
    n = len(tok.encode(whole[:first_obs], add_special_tokens=False))
    assert traj.loss_mask[n] == 0
    _wait_closed(closed)


def test_a_reply_without_a_call_and_max_turns_end_the_episode_and_its_session():
    base = serve_app(APP)
    make_env = lambda: OpenEnvEnv(base, "hermes")  # noqa: E731
    closed = _counts()["close"]
    traj, _ = _run(make_env, ["I will not play."])
    assert traj.stop_reason == "answer" and traj.reward == 0.0
    assert traj.info["tool_status"] == "no_call"
    _wait_closed(closed)
    # Two wrong guesses at max_turns=2: the worker ends the episode, which closes the session.
    traj, _ = _run(make_env, [guess(1), guess(2)], max_turns=2)
    assert traj.stop_reason == "max_turns" and traj.reward == 0.0
    _wait_closed(closed + 1)


def test_the_last_allowed_wrong_guess_ends_the_episode_through_done():
    make_env = lambda: OpenEnvEnv(serve_app(APP), "hermes", reset_args={"max_guesses": 1})  # noqa: E731
    traj, _ = _run(make_env, [guess(1)])
    assert traj.stop_reason == "answer" and traj.reward == 0.0 and traj.info["turns"] == 1


def test_an_unreachable_server_fails_the_episode_with_its_reason():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    before = openenv.FAILURES["unreachable"]
    make_env = lambda: OpenEnvEnv(f"http://127.0.0.1:{port}", "hermes", timeout_s=5)  # noqa: E731
    traj, _ = _run(make_env, [])
    assert traj.stop_reason == "env_error"
    assert traj.info["error"].startswith("reset: OpenEnvFailure: unreachable: ")
    assert openenv.FAILURES["unreachable"] == before + 1


def test_a_full_server_makes_the_episode_wait_for_a_free_session(capfd):
    from websockets.sync.client import connect

    base = serve_app("tests.openenv_tier._guess_env:small_app")  # one session at most
    make_env = lambda: OpenEnvEnv(base, "hermes", timeout_s=60)  # noqa: E731

    def leave_once_refused(held):  # the server has said how many sessions it holds: leave
        deadline = time.monotonic() + 30
        while not openenv.sessions(base).capacity and time.monotonic() < deadline:
            time.sleep(0.02)
        held.close()

    with connect(ws_url(base), proxy=None) as held:  # another client holds the only session
        held.send('{"type": "reset", "data": {"seed": 0}}')
        assert '"observation"' in held.recv(timeout=10)
        thread = threading.Thread(target=leave_once_refused, args=(held,))
        thread.start()
        traj, _ = _run(make_env, [guess(4)])
        thread.join()
    assert traj.stop_reason == "answer" and traj.reward == 1.0, traj.info
    assert openenv.sessions(base).capacity == 1
    assert "holds 1 session(s) at once" in capfd.readouterr().err


def test_a_one_session_server_written_the_plainest_way_runs_every_episode():
    """`create_app(Env, Action, Observation)`: one session. The worker has room for eight
    episodes; all of them run, one after the other, none fails."""
    spec = build_env(EnvConfig(name="openenv", args={"max_guesses": 2}, openenv={"app": PLAIN}))
    tok = _tokenizer("hermes")
    engine = ScriptedEngine(tok, [guess(1)] * 16)
    engine.max_concurrent = 8
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(4096, 200, max_turns=2, max_tool_calls=2, stop=("</tool_call>",))
    feed = PromptFeed(spec.task, random.Random(0), 8, 1)
    worker = RolloutWorker(engine, feed, tok, out, spec.make_env, limits)
    before = _counts()
    trajs: list = []
    deadline = time.monotonic() + 120
    while len(trajs) < 8 and time.monotonic() < deadline:
        worker.fill()
        worker.step()
        while not out.empty():
            trajs.append(out.get_nowait())
        time.sleep(0.005)
    worker.stop_thread()
    assert len(trajs) == 8 and not [t.info for t in trajs if t.stop_reason == "env_error"]
    assert _counts()["reset"] - before["reset"] == 8  # refused sessions never reached reset
    assert openenv.sessions(PLAIN).capacity == 1


def test_llama3_calls_become_actions():
    env = OpenEnvEnv(serve_app(APP), "llama3")

    async def episode():
        messages = await env.reset(SeedTask(0))  # target 1
        result = await env.step(render_tool_call("guess", {"guess": 1}, "llama3"))
        await env.aclose()
        return messages, result

    messages, result = asyncio.run(episode())
    assert 'a reply that is only {"name": "guess", "parameters"' in messages[0]["content"]
    assert result.done and result.reward == 1.0
    assert result.observations == [{"role": "tool", "content": "right"}]


def test_a_dropped_connection_fails_the_step():
    env = OpenEnvEnv(serve_app(APP), "hermes")
    before = openenv.FAILURES["disconnected"]

    async def episode():
        await env.reset(SeedTask(0))
        await env._ws.close()  # as when the server goes away mid-episode
        with pytest.raises(openenv.OpenEnvFailure, match=r"^disconnected: "):
            await env.step(guess(1))

    asyncio.run(episode())
    assert openenv.FAILURES["disconnected"] == before + 1
