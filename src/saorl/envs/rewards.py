"""Reward functions (`env.reward_fns`): the episode reward computed by user code.

    def correct(completion, answer, **kwargs):      # a column of the dataset row
        return float(answer in completion)

    async def judge(completion, messages, **kwargs):
        ...                                          # may await an HTTP call

Each function gets, as keyword arguments, `completion` (the text of the model's last turn, the
one that ended the episode), `messages` (the whole conversation: the opening messages, every
model turn and every observation) and every column of the task's dataset row (the `math`
env's rows, or a user task that is a mapping or a dataclass), as TRL's `reward_funcs` do; a
function that takes no `**kwargs` gets only the arguments it names. It may be sync (run in a
thread) or async, and returns a float, or None to skip itself for that episode.

The episode reward is the weighted sum (`env.reward_weights`, default all 1.0) of the values
that are not None (0.0 if all are None), and replaces the environment's own reward: the
functions run when the environment ends the episode; intermediate rewards become 0, and an
episode cut short by a budget (length, turns, context) gets 0 without calling them. A function
that raises, returns something else or takes longer than `env.reward_timeout_s` fails its
episode (`env_error`: counted in `rollout/failed`, never trained on). Each value is put in the
trajectory's info as `reward/<name>`, which the training loop averages into metrics.jsonl.
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import Env, EnvSpec, Message, StepResult
from saorl.envs.custom import load_reference


class RewardFunctionError(Exception):
    """A reward function failed on one episode (that episode becomes an env_error)."""


@dataclasses.dataclass(frozen=True)
class RewardFn:
    name: str  # `reward/<name>` in the metrics
    fn: Callable[..., Any]
    weight: float
    params: frozenset[str] | None  # the keyword arguments it takes; None = any (**kwargs)


def load_reward_fns(cfg: EnvConfig) -> list[RewardFn]:
    """`env.reward_fns` resolved, with their weights and unique metric names."""
    weights = cfg.reward_weights or [1.0] * len(cfg.reward_fns)
    out: list[RewardFn] = []
    for ref, weight in zip(cfg.reward_fns, weights, strict=True):
        fn = load_reference(ref, "env.reward_fns")
        if not callable(fn):
            raise ConfigError(
                f"env.reward_fns {ref!r}: an object of type {type(fn).__name__}, not a function"
            )
        base = ref.rpartition(":")[2].rpartition(".")[2]
        name, n = base, 1
        while any(r.name == name for r in out):
            n += 1
            name = f"{base}_{n}"
        out.append(RewardFn(name, fn, float(weight), _params(fn)))
    return out


def _params(fn: Callable[..., Any]) -> frozenset[str] | None:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): pass everything
        return None
    kinds = {p.kind for p in sig.parameters.values()}
    if inspect.Parameter.VAR_KEYWORD in kinds:
        return None
    return frozenset(
        p.name
        for p in sig.parameters.values()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    )


def task_columns(task: Any) -> dict[str, Any]:
    """The dataset row behind `task`: a problem's source row (`.row` / `.raw`), a mapping
    task itself, or a dataclass task's fields; else nothing."""
    for attr in ("row", "raw"):
        row = getattr(task, attr, None)
        if isinstance(row, Mapping):
            return dict(row)
    if isinstance(task, Mapping):
        return dict(task)
    if dataclasses.is_dataclass(task) and not isinstance(task, type):
        return {f.name: getattr(task, f.name) for f in dataclasses.fields(task)}
    return {}


class RewardEnv:
    """Wraps an environment: its episodes end where it says, scored by the reward functions."""

    offload = True  # reward functions are user code of unknown cost (an LLM judge, a sandbox)

    def __init__(self, inner: Env, fns: list[RewardFn], timeout_s: float) -> None:
        self.inner, self.fns, self.timeout_s = inner, fns, timeout_s
        self.task: Any = None
        self.messages: list[Message] = []

    async def reset(self, task: Any) -> list[Message]:
        self.task = task
        messages = await self.inner.reset(task)
        self.messages = list(messages)
        return messages

    async def step(self, action_text: str) -> StepResult:
        result = await self.inner.step(action_text)
        self.messages.append({"role": "assistant", "content": action_text})
        if not result.done:
            self.messages.extend(result.observations)
            return dataclasses.replace(result, reward=0.0)
        reward, info = await self.score(self.task, action_text, self.messages)
        return StepResult(result.observations, reward, True, {**result.info, **info})

    async def score(
        self, task: Any, completion: str, messages: list[Message]
    ) -> tuple[float, dict[str, float]]:
        """The weighted reward of one finished episode and each function's value
        (`reward/<name>`); agent programs without a reward of their own are scored here."""
        kwargs = {**task_columns(task), "completion": completion, "messages": list(messages)}
        values = await asyncio.gather(*(self._score(f, kwargs) for f in self.fns))
        scored = [(f, v) for f, v in zip(self.fns, values, strict=True) if v is not None]
        info = {f"reward/{f.name}": v for f, v in scored}
        return sum(f.weight * v for f, v in scored), info

    async def _score(self, f: RewardFn, kwargs: dict[str, Any]) -> float | None:
        if f.params is not None:
            kwargs = {k: v for k, v in kwargs.items() if k in f.params}
        try:
            if inspect.iscoroutinefunction(f.fn):
                value = await asyncio.wait_for(f.fn(**kwargs), self.timeout_s)
            else:
                value = await asyncio.wait_for(asyncio.to_thread(f.fn, **kwargs), self.timeout_s)
                if inspect.isawaitable(value):  # e.g. an object whose __call__ is async
                    value = await asyncio.wait_for(value, self.timeout_s)
        except TimeoutError:
            raise RewardFunctionError(
                f"reward function {f.name} took more than {self.timeout_s:g} s "
                "(env.reward_timeout_s)"
            ) from None
        except Exception as e:
            raise RewardFunctionError(
                f"reward function {f.name} raised {type(e).__name__}: {e}"
            ) from e
        if value is None:
            return None
        if isinstance(value, numbers.Real) and math.isfinite(value):  # numpy floats too
            return float(value)
        raise RewardFunctionError(
            f"reward function {f.name} returned {value!r}; expected a finite float or None"
        )


def with_reward_fns(spec: EnvSpec, cfg: EnvConfig) -> EnvSpec:
    """`spec` whose environments are scored by `env.reward_fns`."""
    fns = load_reward_fns(cfg)
    make_env, timeout = spec.make_env, cfg.reward_timeout_s
    return dataclasses.replace(spec, make_env=lambda: RewardEnv(make_env(), fns, timeout))
