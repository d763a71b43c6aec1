"""Agent programs as the environment (`env.name = "agent"`, docs/agents.md).

    env.agent.function = "my_agent.py:run" # async def run(task, client) -> float | dict
    env.agent.command = "python agent.py"  # one process per episode, any language

The program owns its loop and calls the model through the training endpoint of the worker that
runs it (`saorl.rollout.agents.server`). A function gets the task as a dict and an
`openai.AsyncOpenAI` bound to its episode; a command gets the task as JSON on stdin,
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `OPENAI_MODEL`, `SAORL_WORKER` (the rollout worker's
name) and, in a training run, `SAORL_AGENT_HOME` (`<run folder>/agents`, for the program's own
files) in its environment (of the host's environment only `COMMAND_ENV` and the names of
`env.agent.env_passthrough`: no secrets), and prints `{"reward": ...}` as JSON on its last
stdout line. Either returns the reward (a number, or a dict with "reward" and other numeric
metrics, logged as `agent/<name>`).

Without a reward: `env.reward_fns` score the episode's messages; else the task source's own
environment grades the last assistant message (the one reply a single-turn task would see).

Tasks come from `env.agent.tasks`, the name of any environment the factory builds ('math':
`env.dataset` rows; 'arithmetic'; a task source such as 'reasoning_gym'): its `task.sample`
and `task.held_out`, and its environment as the grader.

Coding tasks ('swe') run command agents only: each episode gets a sandboxed shell over the
task's repository copy (`saorl.envs.swe.agent_shell`, `SAORL_SHELL` in its environment; and
`SAORL_MINISWE_RUNNER`, the path of mini-swe-agent's runner, docs/mini-swe-agent.md), and
the coding env's grade of that copy when the program exits is the reward, whatever the program
printed (its other keys are kept: numbers as metrics, strings in the trajectory's info).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import math
import numbers
import os
import sys
import time
import weakref
from collections.abc import Callable
from fnmatch import fnmatchcase
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.envs import agent_procs
from saorl.envs.base import AgentFailure, Env, EnvSpec
from saorl.envs.rewards import RewardEnv, load_reward_fns, task_columns
from saorl.security.safe_io import make_dir

MODEL_NAME = "policy"  # the name the endpoint serves
AGENTS_DIR = "agents"  # in the run folder: SAORL_AGENT_HOME, the programs' own files
# mini-swe-agent's runner, a script for its own venv (SAORL_MINISWE_RUNNER on coding tasks)
MINISWE_RUNNER = Path(__file__).parent / "swe" / "miniswe_runner.py"


def task_dict(task: Any) -> dict[str, Any]:
    """What an agent gets: the task's own `as_dict()` (reasoning-gym items), else its columns
    (a dataset row, a mapping, a dataclass's fields), else {"prompt": str(task)}."""
    if callable(getattr(task, "as_dict", None)):
        return task.as_dict()
    return task_columns(task) or {"prompt": str(task)}


# What a command agent gets of saorl's own environment, besides what saorl sets and the names
# of env.agent.env_passthrough: a shell's basics, never the host's secrets (HF_TOKEN, keys).
COMMAND_ENV = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE", "LC_*", "TERM")
COMMAND_ENV += ("TZ", "TMPDIR", "VIRTUAL_ENV")


def command_env(passthrough: tuple[str, ...], saorl_vars: dict[str, str]) -> dict[str, str]:
    """The environment of a command agent's process: `COMMAND_ENV` and the `passthrough` names
    (or fnmatch patterns) of this process's environment, then `saorl_vars`."""
    names = (*COMMAND_ENV, *passthrough)
    kept = {k: v for k, v in os.environ.items() if any(fnmatchcase(k, n) for n in names)}
    return {**kept, **saorl_vars}


class AgentProgram:
    """The "environment" of an agent episode: it runs the program instead of stepping."""

    drives_model = True  # the rollout worker runs `run` and serves its calls
    offload = True
    metric_prefix = "agent/"  # of the metrics a program returns beside its reward

    def __init__(
        self,
        cfg: EnvConfig,
        fn: Callable[..., Any] | None,
        grader: Callable[[], Env] | None,
        scorer: RewardEnv | None,
        told: set[str] | None = None,
        run_dir: Path | None = None,
    ) -> None:
        self.fn = fn
        self.command = cfg.agent.command
        self.name = cfg.agent.function or cfg.agent.command
        self.tasks = cfg.agent.tasks
        # Notes printed once per run: the set is shared by the run's programs (one per episode)
        self.told = _TOLD if told is None else told
        self.passthrough = tuple(cfg.agent.env_passthrough)
        # Command agents' processes (capped, killed by group), for the rollout worker
        self.processes = agent_procs if self.command else None
        self.grader = grader
        self.scorer = scorer
        self.host = cfg.agent.host
        self.models = (MODEL_NAME,)
        self.tool_format = "llama3" if cfg.tool_format == "llama3" else "hermes"
        self.timeout_s = cfg.step_timeout_s
        self.workspace = cfg.agent.tasks == "swe"  # a repository copy and shell per episode
        # A command's own files (mini-swe-agent's config dir): the training run's folder
        # (`saorl train` passes it), never the user's home; None outside a run
        self.home = Path(run_dir) / AGENTS_DIR if run_dir else None

    async def run(
        self,
        task: Any,
        base_url: str,
        api_key: str,
        conversation: Callable[[], list[dict]],
        worker: str = "",
        local: Callable[[], Any] | None = None,
    ) -> tuple[float, dict[str, Any]]:
        """Run the program for one episode: `(reward, metrics)`; raises on failure. `local`
        gives the in-process HTTP client of the endpoint (`TrainingEndpoint.local_client`)."""
        if self.workspace:
            return await self._run_on_workspace(task, base_url, api_key, worker)
        if self.fn is not None:
            result = await self._call(task_dict(task), base_url, api_key, local)
        else:
            result = await self._spawn(task_dict(task), base_url, api_key, worker)
        reward, metrics = _read_result(result, self.metric_prefix)
        if reward is None:
            if result is None:
                self._tell_once("none")
            reward, metrics = await self._score(task, conversation(), metrics)
        return reward, metrics

    async def _call(
        self, task: dict[str, Any], base_url: str, api_key: str, local: Callable[[], Any] | None
    ) -> Any:
        import openai

        client = openai.AsyncOpenAI(
            base_url=base_url,
            api_key=api_key,
            max_retries=0,
            timeout=self.timeout_s,
            # In-process: the same endpoint without the socket (its base_url still serves HTTP).
            http_client=local() if local is not None else _http_client(),
        )
        result = self.fn(task, client)  # type: ignore[misc]
        return await result if inspect.isawaitable(result) else result

    async def _run_on_workspace(
        self, task: Any, base_url: str, api_key: str, worker: str
    ) -> tuple[float, dict[str, Any]]:
        from saorl.envs.swe.agent_shell import AgentWorkspace

        assert self.grader is not None
        start = time.monotonic()
        async with AgentWorkspace(self.grader(), task) as ws:  # type: ignore[arg-type]
            env_vars = {**ws.env_vars, "SAORL_MINISWE_RUNNER": str(MINISWE_RUNNER)}
            result = await self._spawn(task_dict(task), base_url, api_key, worker, env_vars)
            reward, info = await ws.grade()
        info["agent/episode_s"] = time.monotonic() - start  # the program's run and the grading
        if isinstance(result, dict):
            _, metrics = _read_result({k: v for k, v in result.items() if k != "reward"})
            texts = {f"agent/{k}": v[:200] for k, v in result.items() if isinstance(v, str)}
            info = {**info, **metrics, **texts}
        return reward, info

    async def _spawn(
        self,
        task: dict[str, Any],
        base_url: str,
        api_key: str,
        worker: str,
        extra_env: dict[str, str] | None = None,
    ) -> Any:
        env = command_env(
            self.passthrough,
            {
                "OPENAI_BASE_URL": base_url,
                "OPENAI_API_KEY": api_key,
                "OPENAI_MODEL": MODEL_NAME,
                "SAORL_WORKER": worker,  # the rollout worker (Ray actor) whose endpoint it calls
                **self.extra_env(),
                **(extra_env or {}),
            },
        )
        # At most rollout.max_agent_processes at once; its process group is killed with it.
        code, out, err = await agent_procs.run(
            self.command, json.dumps(task, default=str).encode(), env
        )
        tail = err.decode(errors="replace").strip()[-300:]
        if code != 0:
            raise AgentFailure("exit", f"{self.command!r} exited with {code}: {tail}")
        lines = [ln for ln in out.decode(errors="replace").splitlines() if ln.strip()]
        if not lines:
            raise AgentFailure("no_reward", f"{self.command!r} printed nothing on stdout: {tail}")
        try:
            return json.loads(lines[-1])
        except ValueError:
            raise AgentFailure(
                "no_reward", f"last stdout line is not JSON: {lines[-1][:200]!r}"
            ) from None

    def extra_env(self) -> dict[str, str]:
        """More environment variables of a command's process."""
        if self.home is None:  # not in a training run (`saorl eval`): nothing to keep
            return {}
        make_dir(self.home, "agent home")  # never a link planted in the run folder
        return {"SAORL_AGENT_HOME": str(self.home)}

    def _tell_once(self, note: str) -> None:
        """A program that returns None trains on another reward: said once (a forgotten
        `return` trains silently on the grader otherwise)."""
        if note in self.told:
            return
        self.told.add(note)
        scorer = "env.reward_fns" if self.scorer is not None else None
        who = scorer or f"the grader of env.agent.tasks ({self.tasks!r})"
        print(
            f"saorl: the agent {self.name!r} returned None, so {who} scores its episodes "
            "instead; if a `return` of the reward is missing, add it (docs/agents.md, "
            "Rewards). Said once.",
            file=sys.stderr,
            flush=True,
        )

    async def _score(
        self, task: Any, messages: list[dict], metrics: dict[str, Any]
    ) -> tuple[float, dict[str, Any]]:
        answers = [m for m in messages if m.get("role") == "assistant"]
        if not answers:
            raise AgentFailure("no_reward", "returned no reward and made no model call")
        if self.scorer is not None:  # env.reward_fns
            reward, info = await self.scorer.score(task, answers[-1]["content"], messages)
            return reward, {**metrics, **info}
        if self.grader is None:
            raise AgentFailure("no_reward", "returned no reward and nothing grades its tasks")
        env = self.grader()
        await env.reset(task)
        result = await env.step(answers[-1]["content"])
        return result.reward, metrics


_TOLD: set[str] = set()  # notes of programs built without their run's own set (tests)

_HTTP: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Any] = weakref.WeakKeyDictionary()


def _http_client() -> Any:
    """One HTTP connection pool per event loop, shared by the episodes' clients: building one
    loads the system's certificates (~0.2 s of CPU), which per episode would cost more than the
    calls themselves. Episodes' clients are therefore never closed; the pool lives with the loop.
    """
    import openai

    loop = asyncio.get_running_loop()
    if loop not in _HTTP:
        _HTTP[loop] = openai.DefaultAsyncHttpxClient()
    return _HTTP[loop]


def _read_result(result: Any, prefix: str = "agent/") -> tuple[float | None, dict[str, Any]]:
    """`(reward or None, metrics)` from what a program returned."""
    metrics: dict[str, Any] = {}
    if isinstance(result, dict):
        metrics = {
            f"{prefix}{k}": float(v) for k, v in result.items() if k != "reward" and _finite(v)
        }
        result = result.get("reward")
    if result is None:
        return None, metrics
    if not _finite(result):
        raise AgentFailure("bad_reward", f"the reward must be a finite number, got {result!r}")
    return float(result), metrics


def _finite(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(v)


def build_agent_spec(
    cfg: EnvConfig,
    held_out_only: bool,
    build_source: Callable[[EnvConfig, bool], EnvSpec],
    run_dir: Path | None = None,
) -> EnvSpec:
    """The spec of `env.name = "agent"`: the tasks (and grader) of `env.agent.tasks`."""
    from saorl.envs.custom import load_reference

    if cfg.agent.tasks == "swe" and cfg.agent.function:
        raise ConfigError(
            "env.agent.tasks = 'swe' runs command agents (env.agent.command): each gets a "
            "sandboxed shell over its repository copy (docs/mini-swe-agent.md)"
        )
    source = build_source(cfg.model_copy(update={"name": cfg.agent.tasks}), held_out_only)
    program = cfg.agent.function
    fn = load_reference(program, "env.agent.function") if program else None
    if fn is not None and not callable(fn):
        raise ConfigError(f"env.agent.function {program!r}: {type(fn).__name__} is not callable")
    scorer = None
    if cfg.reward_fns:
        scorer = RewardEnv(None, load_reward_fns(cfg), cfg.reward_timeout_s)  # type: ignore[arg-type]
    told: set[str] = set()  # the run's notes said once (`AgentProgram._tell_once`)
    return EnvSpec(
        source.task,
        lambda: AgentProgram(cfg, fn, source.make_env, scorer, told, run_dir),  # type: ignore[arg-type,return-value]
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_tool_calls,
        demo=source.demo,  # the warm-up; it helps when the agent's prompt is the task's own
    )
