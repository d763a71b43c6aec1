"""An environment's optional members are declared protocols (`saorl.envs.base`: `HasOffload`,
`HasTools`, `EndsEpisodes`, `HasRoom`, `DrivesModel`), read once per environment
(`EnvTraits.of`): a user env with or without each one takes its own path through a real
rollout worker (a scripted engine, the project's tokenizer)."""

from __future__ import annotations

import queue
import threading
import time

import pytest

from saorl.envs.base import EnvTraits, StepResult, tool_schemas
from saorl.envs.rewards import RewardEnv
from saorl.evaluation.prompts import PROMPT_TEMPLATES, TemplatedEnv
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.worker import AgentLimits, FixedFeed, NoAgents, RolloutWorker
from tests.integration.test_agent_loop import TEMPLATE, Q, ScriptedEngine

# The template names the tools it is given, so a prompt shows whether they reached it.
TOOLS_TEMPLATE = "{% if tools %}<tools>{% for t in tools %}{{ t['function']['name'] }}{% endfor %}"
TOOLS_TEMPLATE += "</tools>{% endif %}" + TEMPLATE
SCHEMA = {"type": "function", "function": {"name": "calc", "parameters": {}}}


class Plain:
    """A user env with no optional member: reset and step only."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    async def reset(self, task):
        self.threads.append(threading.current_thread().name)
        return [{"role": "user", "content": task.text}]

    async def step(self, action_text: str) -> StepResult:
        self.threads.append(threading.current_thread().name)
        return StepResult(reward=1.0, done=True)


class Inline(Plain):
    offload = False


class Offloaded(Plain):
    offload = True


class WithTools(Plain):
    offload = False

    def __init__(self) -> None:
        super().__init__()
        self.tools = [SCHEMA]


class Ends(Plain):
    offload = False
    ended = 0

    def end_episode(self) -> None:
        Ends.ended += 1


class NoRoom(Plain):
    offload = False

    def room(self) -> int | None:
        return 0  # its server takes no more episodes than the one just made


class RunsButIsNoAgent(Plain):
    """A `run` method of its own does not make an env an agent program."""

    offload = False

    def run(self) -> None:  # pragma: no cover - never called: the env is stepped
        raise AssertionError


class Program:
    """An agent program: declared by `drives_model` and `run`, never reset or stepped."""

    drives_model = True
    offload = True
    host = "127.0.0.1"
    models = ("policy",)
    tool_format = "hermes"
    processes = None

    async def run(self, task, base_url, api_key, conversation, worker="", local=None):
        return 1.0, {}  # no call to the endpoint: the episode fails as `no_calls`

    async def reset(self, task):  # pragma: no cover - an agent program is not stepped
        raise AssertionError

    async def step(self, action_text):  # pragma: no cover
        raise AssertionError


@pytest.fixture
def tok():
    t = build_char_tokenizer()
    t.chat_template = TOOLS_TEMPLATE
    Ends.ended = 0
    return t


def _worker(tok, make_env, n_tasks: int = 1, turns: int = 1) -> RolloutWorker:
    engine = ScriptedEngine(tok, ["4"] * n_tasks * turns)
    limits = AgentLimits(max_seq_len=64, max_new_tokens=8)
    feed = FixedFeed([Q("2+2", key=f"q{i}") for i in range(n_tasks)])
    return RolloutWorker(engine, feed, tok, queue.Queue(), make_env, limits)


def _finish(worker: RolloutWorker, n: int = 1) -> list:
    deadline = time.monotonic() + 30  # offloaded env calls run on the worker's env thread
    while worker.out.qsize() < n and time.monotonic() < deadline:
        worker.fill()
        worker.step()
        time.sleep(0.002)
    return [worker.out.get_nowait() for _ in range(n)]


@pytest.mark.parametrize(
    ("cls", "inline", "drives", "ends", "room"),
    [
        (Plain, False, False, False, False),  # undeclared `offload`: off the decoding thread
        (Inline, True, False, False, False),
        (Offloaded, False, False, False, False),
        (Ends, True, False, True, False),
        (NoRoom, True, False, False, True),
        (RunsButIsNoAgent, True, False, False, False),
        (Program, False, True, False, False),
    ],
)
def test_traits_are_what_the_env_declares(cls, inline, drives, ends, room):
    traits = EnvTraits.of(cls())
    assert traits.inline is inline and traits.drives_model is drives
    assert (traits.end_episode is not None) is ends and (traits.room is not None) is room


def test_an_agent_program_must_say_it_drives_the_model():
    class Declined(Program):
        drives_model = False

    assert not EnvTraits.of(Declined()).drives_model


@pytest.mark.parametrize(("cls", "inline"), [(Plain, False), (Offloaded, False), (Inline, True)])
def test_offload_decides_the_thread_of_reset_and_step(tok, cls, inline):
    envs: list[Plain] = []
    worker = _worker(tok, lambda: envs.append(cls()) or envs[-1])
    (traj,) = _finish(worker)
    worker.stop_thread()
    assert traj.stop_reason == "answer" and traj.reward == 1.0
    here = threading.current_thread().name
    assert len(envs[0].threads) == 2
    assert all((t == here) is inline for t in envs[0].threads), envs[0].threads


@pytest.mark.parametrize(("cls", "shown"), [(WithTools, True), (Inline, False)])
def test_declared_tools_reach_the_chat_template(tok, cls, shown):
    worker = _worker(tok, cls)
    (traj,) = _finish(worker)
    worker.stop_thread()
    assert ("<tools>calc</tools>" in tok.decode(traj.prompt_ids)) is shown
    assert tool_schemas(cls()) == ([SCHEMA] if shown else None)


def test_end_episode_is_called_only_where_declared(tok):
    ends = _worker(tok, Ends, n_tasks=2)
    plain = _worker(tok, Inline, n_tasks=2)
    assert len(_finish(ends, 2)) == 2 and len(_finish(plain, 2)) == 2
    ends.stop_thread()
    plain.stop_thread()
    assert Ends.ended == 2 and ends.traits == {} and plain.traits == {}


def test_room_caps_the_episodes_started_only_where_declared(tok):
    capped, free = _worker(tok, NoRoom, n_tasks=3), _worker(tok, Inline, n_tasks=3)
    capped.fill()
    free.fill()
    assert capped.active == 1  # the server said no room beyond the episode it holds
    assert free.active == 3  # the engine's and the feed's limits only
    for w in (capped, free):
        w.stop_thread()


def test_only_a_declared_agent_program_goes_to_the_endpoint(tok):
    from saorl.rollout.agents.runs import AgentRuns

    stepped = _worker(tok, RunsButIsNoAgent)
    (traj,) = _finish(stepped)
    stepped.stop_thread()
    assert traj.stop_reason == "answer" and isinstance(stepped.agents, NoAgents)

    programs = _worker(tok, Program)
    (traj,) = _finish(programs)
    try:
        assert isinstance(programs.agents, AgentRuns)  # built with its first episode
        assert traj.stop_reason == "env_error" and dict(programs.agents.failures) == {"no_calls": 1}
    finally:
        programs.stop_thread()


@pytest.mark.parametrize(
    ("wrap", "inline"),
    [
        (lambda env: RewardEnv(env, [], 5.0), False),  # reward functions: always offloaded
        (lambda env: TemplatedEnv(env, PROMPT_TEMPLATES["boxed"]), True),  # as it wraps
    ],
    ids=["reward_fns", "prompt_template"],
)
def test_wrappers_declare_what_they_wrap(wrap, inline):
    class All(WithTools, Ends, NoRoom):
        pass

    Ends.ended = 0
    full, plain = wrap(All()), wrap(Plain())
    assert tool_schemas(full) == [SCHEMA] and tool_schemas(plain) is None
    assert full.room() == 0 and plain.room() is None
    full.end_episode()
    plain.end_episode()  # nothing to end: a no-op
    assert Ends.ended == 1
    assert EnvTraits.of(wrap(Inline())).inline is inline
    assert not EnvTraits.of(wrap(Plain())).inline  # undeclared: offloaded, wrapped or not


def test_an_env_class_declares_stop_and_demo_or_gets_none():
    from saorl.config import EnvConfig
    from saorl.envs.custom import register_object
    from saorl.envs.factory import build_env

    class Bare(Plain):
        @classmethod
        def tasks(cls):
            return [Q("1+1")], [Q("2+2")]

    class Full(Bare):
        stop = (";",)

        @staticmethod
        def demo(task, rng):
            return [("1+1=", False), ("2", True)]

    bare = build_env(EnvConfig(name=register_object(Bare)))
    full = build_env(EnvConfig(name=register_object(Full)))
    assert (bare.stop, bare.demo) == ((), None)
    assert full.stop == (";",) and full.demo is Full.demo
