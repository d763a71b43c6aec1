"""Reward functions (`env.reward_fns`): the episode reward computed by user code.

Three signatures are accepted as they are written for their library (`env.reward_signature`,
by default told apart by each function's parameters):

    def correct(completion, answer, **kwargs):          # saorl: one episode, a float or None
        return float(answer in completion)

    def accuracy(completions, answer, **kwargs):        # TRL reward_funcs: a batch, a list
        return [float(a in c) for c, a in zip(completions, answer)]

    def compute_score(data_source, solution_str, ground_truth, extra_info=None):   # verl
        return {"score": float(ground_truth in solution_str)}

- saorl (no `completions`, `prompts` or `solution_str` parameter): keyword arguments
  `completion` (the text of the model's last turn, the one that ended the episode), `messages`
  (the whole conversation: the opening messages, every model turn and every observation) and
  every column of the task's dataset row (the `math` env's rows, or a user task that is a
  mapping or a dataclass); returns a float, or None to skip itself for that episode.
- TRL (a `completions` or `prompts` parameter): called with a batch of one episode, as TRL's
  `reward_funcs` are: `prompts` and `completions` (strings; message lists when the row's
  `prompt` is a list of chat messages, TRL's conversational format) and every column as a
  list; returns a list (of one float or None).
- verl (a `solution_str` parameter): `data_source`, `solution_str` (the completion),
  `ground_truth` (the row's `reward_model.ground_truth`, else its `ground_truth`, else the
  problem's reference answer) and `extra_info`; returns a float, or a dict whose `score` is
  the reward (its other numbers are logged as `reward/<name>/<key>`).

A function that takes no `**kwargs` gets only the arguments it names; one that requires an
argument the task's row does not have is a `ConfigError` at start-up, naming the columns there
are. It may be sync (run in a thread) or async.

The episode reward is the weighted sum (`env.reward_weights`, default all 1.0) of the values
that are not None (0.0 if all are None), and replaces the environment's own reward: the
functions run when the environment ends the episode; intermediate rewards become 0, and an
episode cut short by a budget (length, turns, context) gets 0 without calling them. A function
that raises, returns something else or takes longer than `env.reward_timeout_s` fails its
episode (`env_error`: never trained on; printed once per distinct error with its traceback and
counted in `summary.json`, see `saorl.rollout.failures`). Each value is put in the
trajectory's info as `reward/<name>`, which the training loop averages into metrics.jsonl.
The wrapper forwards every other attribute of the environment (`tools`, ...).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import itertools
import math
import numbers
from collections.abc import Callable, Mapping
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import (
    Env,
    EnvSpec,
    Message,
    PassesOn,
    StepResult,
    training_list,
)
from saorl.envs.custom import load_reference


class RewardFunctionError(Exception):
    """A reward function failed on one episode (that episode becomes an env_error)."""


_TRL_MARKS = frozenset({"completions", "prompts"})
_VERL_ARGS = ("data_source", "solution_str", "ground_truth", "extra_info")


@dataclasses.dataclass(frozen=True)
class RewardFn:
    name: str  # `reward/<name>` in the metrics
    fn: Callable[..., Any]
    weight: float
    params: frozenset[str] | None  # the keyword arguments it takes; None = any (**kwargs)
    form: str = "saorl"  # "saorl", "trl" or "verl" (module docstring)
    required: frozenset[str] = frozenset()  # parameters without a default
    ref: str = ""


def load_reward_fns(cfg: EnvConfig) -> list[RewardFn]:
    """`env.reward_fns` resolved, with their weights, forms and unique metric names."""
    weights = cfg.reward_weights or [1.0] * len(cfg.reward_fns)
    out: list[RewardFn] = []
    for ref, weight in zip(cfg.reward_fns, weights, strict=True):
        fn = load_reference(ref, "env.reward_fns")
        if not callable(fn):
            raise ConfigError(
                f"env.reward_fns {ref!r}: an object of type {type(fn).__name__}, not a function"
            )
        base = ref.rpartition(":")[2].rpartition(".")[2]
        name = base
        n = 1
        while any(r.name == name for r in out):
            n += 1
            name = f"{base}_{n}"
        params, required, named = _params(fn, ref)
        form = cfg.reward_signature
        if form == "auto":
            form = "trl" if named & _TRL_MARKS else "verl" if "solution_str" in named else "saorl"
        out.append(RewardFn(name, fn, float(weight), params, form, required, ref))
    return out


def _params(
    fn: Callable[..., Any], ref: str
) -> tuple[frozenset[str] | None, frozenset[str], frozenset[str]]:
    """(keyword arguments `fn` takes, None for any; those it requires; those it names)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):  # no signature to read (some builtins): pass everything
        return None, frozenset(), frozenset()
    ps = sig.parameters.values()
    only = [p.name for p in ps if p.kind is p.POSITIONAL_ONLY and p.default is p.empty]
    if only:
        raise ConfigError(
            f"env.reward_fns {ref!r}: parameters {only} are positional-only; reward functions "
            "are called with keyword arguments"
        )
    named = [p for p in ps if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    required = frozenset(p.name for p in named if p.default is p.empty)
    names = frozenset(p.name for p in named)
    return (None if any(p.kind is p.VAR_KEYWORD for p in ps) else names), required, names


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


def _ground_truth(task: Any, columns: Mapping[str, Any]) -> Any:
    reward_model = columns.get("reward_model")
    if isinstance(reward_model, Mapping) and "ground_truth" in reward_model:
        return reward_model["ground_truth"]
    if "ground_truth" in columns:
        return columns["ground_truth"]
    return columns.get("answer", getattr(task, "answer", None))


def call_arguments(f: RewardFn, task: Any, completion: str, messages: list[Message]) -> dict:
    """The keyword arguments `f` is called with for one episode, in its own form."""
    columns = task_columns(task)
    if f.form == "verl":
        truth = _ground_truth(task, columns)
        values = [columns.get("data_source", ""), completion, truth, columns.get("extra_info")]
        kwargs = dict(zip(_VERL_ARGS, values, strict=True))
    elif f.form == "trl":
        # TRL's conversational format (the row's prompt is a message list) hands message lists.
        chat = isinstance(columns.get("prompt"), list)
        prompt = columns["prompt"] if chat else columns.get("prompt", _first_user(messages))
        done = [{"role": "assistant", "content": completion}] if chat else completion
        kwargs = {k: [v] for k, v in columns.items()}
        kwargs.update(prompts=[prompt], completions=[done])
    else:
        kwargs = {**columns, "completion": completion, "messages": list(messages)}
    if f.params is not None:
        kwargs = {k: v for k, v in kwargs.items() if k in f.params}
    return kwargs


def _first_user(messages: list[Message]) -> str:
    return next((m.get("content", "") for m in messages if m.get("role") == "user"), "")


def check_reward_fns(fns: list[RewardFn], task: Any) -> None:
    """Each function's required arguments against what it would get for `task` (a sample of the
    dataset): a missing column is a ConfigError now rather than a failed episode later."""
    columns = task_columns(task)
    for f in fns:
        given = call_arguments(f, task, "", [{"role": "user", "content": ""}])
        missing = sorted(f.required - set(given))
        if f.form == "verl" and "ground_truth" in f.required and given["ground_truth"] is None:
            missing.append("ground_truth (no reward_model.ground_truth, ground_truth or answer)")
        if not missing:
            continue
        offered = {"saorl": "completion, messages", "trl": "prompts, completions"}.get(
            f.form, ", ".join(_VERL_ARGS)
        )
        cols = ", ".join(sorted(columns)) or "none (the task is not a mapping or dataclass)"
        raise ConfigError(
            f"env.reward_fns {f.ref!r}: {f.name}() requires {', '.join(missing)}, which a "
            f"{f.form}-style reward function is not given (it gets {offered} and the task's "
            f"columns: {cols}); rename the parameter, give it a default, or take **kwargs"
        )


class RewardEnv(PassesOn):
    """Wraps an environment: its episodes end where it says, scored by the reward functions.
    The wrapped environment's optional members (`saorl.envs.base`: tools, `end_episode`,
    `room`) are declared here and passed on."""

    offload = True  # reward functions are user code of unknown cost (an LLM judge, a sandbox)

    def __init__(self, inner: Env, fns: list[RewardFn], timeout_s: float) -> None:
        self.inner = inner
        self.fns = fns
        self.timeout_s = timeout_s
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
        (`reward/<name>`, and `reward/<name>/<key>` for a verl dict's other numbers); agent
        programs without a reward of their own are scored here."""
        values = await asyncio.gather(
            *(self._score(f, task, completion, messages) for f in self.fns)
        )
        info: dict[str, float] = {}
        total = 0.0
        for f, (value, extra) in zip(self.fns, values, strict=True):
            info.update({f"reward/{f.name}/{k}": v for k, v in extra.items()})
            if value is not None:
                info[f"reward/{f.name}"] = value
                total += f.weight * value
        return total, info

    async def _score(
        self, f: RewardFn, task: Any, completion: str, messages: list[Message]
    ) -> tuple[float | None, dict]:
        kwargs = call_arguments(f, task, completion, messages)
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
        return _unpack(f, value)


def _unpack(f: RewardFn, value: Any) -> tuple[float | None, dict[str, float]]:
    """(the reward, extra numbers to log) from what a function of `f.form` returned."""
    extra: dict[str, float] = {}
    if f.form == "trl":
        if not isinstance(value, list | tuple) or len(value) != 1:
            raise RewardFunctionError(
                f"reward function {f.name} (TRL form) returned {value!r}; expected a list "
                "with one value per completion (1 here)"
            )
        value = value[0]
    elif f.form == "verl" and isinstance(value, Mapping):
        if "score" not in value:
            raise RewardFunctionError(
                f"reward function {f.name} (verl form) returned a dict without 'score': "
                f"{sorted(value)}"
            )
        extra = {str(k): float(v) for k, v in value.items() if k != "score" and _finite(v)}
        value = value["score"]
    if value is None:
        return None, extra
    if _finite(value):  # numpy floats too
        return float(value), extra
    raise RewardFunctionError(
        f"reward function {f.name} returned {value!r}; expected a finite float or None"
    )


def _finite(value: Any) -> bool:
    return isinstance(value, numbers.Real) and math.isfinite(value)


def with_reward_fns(spec: EnvSpec, cfg: EnvConfig) -> EnvSpec:
    """`spec` whose environments are scored by `env.reward_fns`, checked against a task of
    its dataset."""
    fns = load_reward_fns(cfg)
    tasks = itertools.chain(training_list(spec.task), spec.task.held_out)
    sample = next(tasks, None)
    if sample is not None:
        check_reward_fns(fns, sample)
    make_env = spec.make_env
    timeout = cfg.reward_timeout_s
    return dataclasses.replace(spec, make_env=lambda: RewardEnv(make_env(), fns, timeout))
