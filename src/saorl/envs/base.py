"""The environment protocol and `EnvSpec` (docs/design.md section 3).

An environment speaks text and chat messages, never tokens: the agent loop alone owns
tokenization and the chat template. `reset(task)` returns the opening messages; `step(action)`
takes the text of one model turn and returns what the environment says back (tool output as
messages), the reward and whether the episode is over. What an environment may add (where its
steps run, tools, a hook at the episode's end, a server's room, driving the model itself) is a
declared `runtime_checkable` protocol each, read by `isinstance`, never probed by name.

An `EnvSpec` is everything the loop needs from a task: training problems (`task.sample(rng)`),
the held-out set (`task.held_out`), a fresh environment per episode, the episode budgets and
stop strings, and, for the built-in tasks, demonstrations for the supervised warm-up. It is built
from `env.name` by `saorl.envs.factory.build_env`.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

Message = dict[str, str]  # {"role": ..., "content": ...}
Segments = list[tuple[str, bool]]  # (text, trained?) pieces of one warm-up demonstration


@dataclass
class StepResult:
    observations: list[Message] = field(default_factory=list)
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)


class Env(Protocol):
    """One episode at a time; create one instance per concurrent episode.

    The optional members an environment may add are the protocols below (`HasOffload`,
    `HasTools`, `EndsEpisodes`, `HasRoom`; `DrivesModel` for an agent program, which runs
    instead of stepping): the rollout worker reads them once per environment
    (`EnvTraits.of`), by `isinstance`, and goes one way for each declared kind.
    """

    async def reset(self, task: Any) -> list[Message]:
        """The opening messages of the episode (system and user turns)."""
        ...

    async def step(self, action_text: str) -> StepResult:
        """React to one model turn (its decoded text, special tokens removed)."""
        ...


@runtime_checkable
class HasOffload(Protocol):
    """`offload = True`: `reset`/`step` do real work (tool calls, grading runs) and run on an
    event loop in a helper thread while decoding goes on; False: cheap, they run inline
    (deterministic runs). An environment that does not declare it is offloaded."""

    offload: bool


@runtime_checkable
class HasTools(Protocol):
    """`tools`: tool schemas (`saorl.envs.function_tools.FunctionTools.schemas`), read after
    `reset` and passed to the chat template as `tools=`; empty: none."""

    tools: Sequence[Mapping[str, Any]]


@runtime_checkable
class HasToolFormat(Protocol):
    """`fmt`: how the environment reads a tool call from the model's text ("code", "hermes",
    "llama3": `saorl.toolcalls`); a client that gets calls as structured replies writes them
    back in it (`saorl.evaluation.openai_client`)."""

    fmt: str


@runtime_checkable
class EndsEpisodes(Protocol):
    """`end_episode()`: called from the rollout worker's thread once when the episode ends,
    however it ends; it releases what the episode holds (a server session), without
    blocking."""

    def end_episode(self) -> None: ...


@runtime_checkable
class HasRoom(Protocol):
    """`room()`: how many more episodes the environment's server takes now (None: no limit);
    the worker starts no more than that (see `EnvBusy`)."""

    def room(self) -> int | None: ...


@runtime_checkable
class DrivesModel(Protocol):
    """An agent program (`saorl.envs.agent.AgentProgram`): it calls the model itself, through
    the rollout worker's endpoint, instead of being stepped (`drives_model = True`); `run`
    plays one episode and returns its `(reward, metrics)`. The endpoint it is served by
    listens on `host`, answers for the model names `models` and writes tool calls in
    `tool_format` ("hermes" or "llama3"); `processes` is what caps and kills command agents'
    processes (`saorl.envs.agent_procs`), or None."""

    drives_model: bool
    host: str
    models: Sequence[str]
    tool_format: str
    processes: Any

    async def run(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        conversation: Callable[[], list[dict]],
        worker: str = "",
        local: Callable[[], Any] | None = None,
    ) -> tuple[float, dict[str, Any]]: ...


@runtime_checkable
class BindsTokenizer(Protocol):
    """An agent program that renders its prompts itself (verifiers): `bind_tokenizer` gets
    the policy's tokenizer once, when its rollout worker first serves it."""

    def bind_tokenizer(self, tokenizer: Any) -> None: ...


@runtime_checkable
class ClosesPerWorker(Protocol):
    """An agent program that keeps something per rollout worker (verifiers' runner process):
    `aclose()` releases it when the worker stops."""

    async def aclose(self) -> None: ...


@runtime_checkable
class HasStop(Protocol):
    """An env class's `stop` (`env.name = "file.py:MyEnv"`): strings that end a model turn,
    its `EnvSpec.stop`."""

    stop: Sequence[str]


@runtime_checkable
class HasDemo(Protocol):
    """An env class's `demo(task, rng)` (a static method): a warm-up demonstration as
    segments, its `EnvSpec.demo`."""

    def demo(self, task: Any, rng: random.Random) -> Segments: ...


def tool_schemas(env: Any) -> list[dict] | None:
    """The tool schemas `env` declares now (`HasTools`; read after `reset`), or None."""
    return (list(env.tools) or None) if isinstance(env, HasTools) else None


def offloaded(env: Any) -> bool:
    """Whether `env`'s calls run off the decoding thread (`HasOffload`; undeclared: yes)."""
    return not isinstance(env, HasOffload) or bool(env.offload)


def end_episode_of(env: Any) -> None:
    """`env.end_episode()` where it declares one (`EndsEpisodes`); for wrappers."""
    if isinstance(env, EndsEpisodes):
        env.end_episode()


def room_of(env: Any) -> int | None:
    """`env.room()` where it declares one (`HasRoom`), else None (no limit); for wrappers."""
    return env.room() if isinstance(env, HasRoom) else None


class PassesOn:
    """For an environment that wraps another (`inner`): declares the optional members a wrapper
    passes on, each answering as `inner` does (no tools, no hook, no room limit where it
    declares none)."""

    inner: Any

    @property
    def tools(self) -> list[dict]:
        return tool_schemas(self.inner) or []

    def end_episode(self) -> None:
        end_episode_of(self.inner)

    def room(self) -> int | None:
        return room_of(self.inner)


@runtime_checkable
class TaskSource(Protocol):
    """`EnvSpec.task`: training tasks drawn by `sample(rng)` and the held-out ones."""

    held_out: Sequence[Any]

    def sample(self, rng: random.Random) -> Any: ...


def is_task_source(obj: Any) -> bool:
    """Whether `obj` has a callable `sample` and a `held_out` (`TaskSource`)."""
    return isinstance(obj, TaskSource) and callable(obj.sample)


@runtime_checkable
class ListsTraining(Protocol):
    """A task source whose training tasks are a list (`TaskList`, the built-in tasks): prompts
    are checked and rewards matched against them, and a resumed run finds its tasks by index."""

    train: list[Any]


def training_list(task_source: Any) -> list[Any]:
    """`task_source.train` where it declares one (`ListsTraining`), else []."""
    if isinstance(task_source, ListsTraining) and isinstance(task_source.train, list):
        return task_source.train
    return []


@dataclass(frozen=True)
class EnvTraits:
    """What an environment declared of the optional protocols, read once where it is made."""

    inline: bool  # `HasOffload` with `offload = False`
    drives_model: bool  # `DrivesModel` with `drives_model = True`
    end_episode: Callable[[], None] | None = None  # `EndsEpisodes`
    room: Callable[[], int | None] | None = None  # `HasRoom`

    @classmethod
    def of(cls, env: Any) -> EnvTraits:
        return cls(
            inline=not offloaded(env),
            drives_model=isinstance(env, DrivesModel) and env.drives_model is True,
            end_episode=env.end_episode if isinstance(env, EndsEpisodes) else None,
            room=env.room if isinstance(env, HasRoom) else None,
        )


@dataclass
class EnvSpec:
    """What the loop needs from a task; your own `env.name` factory returns one.

    `task`: `.sample(rng)` -> a training task, `.held_out` -> the evaluation tasks (a
    `TaskList` of two lists will do). A task is whatever `reset` takes; a `.key` (a stable id)
    lets per-prompt baselines and per-problem evaluation tell tasks apart. `demo(task, rng)`:
    a supervised demonstration as `(text, trained)` segments, the first one the prompt, for
    `learner.sft_steps` (EOS follows the last segment).
    """

    task: Any
    make_env: Callable[[], Env]
    max_turns: int = 1
    max_tool_calls: int = 0
    stop: tuple[str, ...] = ()  # strings that end a model turn (kept in the turn's text)
    demo: Callable[[Any, random.Random], Segments] | None = None
    step_timeout_s: float = 600.0  # env.step_timeout_s


def task_key(task: Any) -> str:
    """A task's stable id: its `.key`, else a mapping's "key" or "id", else the task itself
    (a `str` or `int` task) or its repr."""
    key = getattr(task, "key", None)
    if key is None and isinstance(task, Mapping):
        key = task.get("key", task.get("id"))
    if key is None:
        key = task if isinstance(task, str | int) else repr(task)
    return str(key)


class TaskList:
    """Training tasks sampled uniformly from a list, and a separate held-out list."""

    def __init__(self, train: Sequence[Any], held_out: Sequence[Any]) -> None:
        self.train = list(train)
        self.held_out = list(held_out)

    def sample(self, rng: random.Random) -> Any:
        if not self.train:
            raise ValueError("TaskList: no training tasks to sample")
        return rng.choice(self.train)


class AgentFailure(Exception):
    """An agent program failed its episode; `reason` is the counted kind. Raised by agent
    programs (envs/) and by the runs that serve them (rollout/), so it lives with the protocol."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class EnvBusy(Exception):
    """Raised by an environment's `reset` that has no room for another episode now (a server
    whose sessions are all taken, by this process's own episodes): not a failure. The rollout
    worker hands the task out again and starts no more episodes than the environment's
    `room()` (free places, or None: no limit) says."""
