"""The env families' own tables, nested in `[env]`: `env.swe`, `env.agent`, `env.openenv`,
`env.verifiers` and `env.reasoning_gym` (split from `saorl.config.env`), and the flat keys they
replaced, which are refused with the new key's name (pre-1.0: no silent aliases)."""

from __future__ import annotations

import os
import re
import shlex
from typing import Literal

from pydantic import Field, field_validator

from saorl.config.base import _Section
from saorl.config.references import check_reference

BUILTIN_ENVS = (
    "arithmetic",
    "tool_arithmetic",
    "math",
    "reasoning_gym",
    "swe",
    "agent",
    "openenv",
    "verifiers",
)


def _absolute(value: str) -> str:
    # Stored absolute in the run's config.toml, so `--resume` and `saorl eval RUN` from another
    # directory (and Ray actors) read the same files. Preset names have no '/' or '.', and a
    # path that does not exist is left for the loader's error to name.
    if value and ("/" in value or "." in value) and os.path.exists(value):
        return os.path.abspath(value)
    return value


class SweConfig(_Section):
    """env 'swe': repositories to fix until their tests pass."""

    source: Literal["generated", "swebench"] = Field(
        "generated",
        description="'generated' = small Python repositories with a bug injected by AST "
        "mutation (deterministic by env.seed); 'swebench' = the SWE-bench-format file "
        "env.swe.tasks against checkouts under env.swe.repos_root",
    )
    num_tasks: int = Field(
        64, ge=1, description="generated: training tasks (env.eval_size more are held out)"
    )
    tasks: str = Field("", description="swebench: path of the SWE-bench-format .jsonl task file")
    repos_root: str = Field(
        "",
        description="swebench: directory holding the git checkouts, as owner__name, owner/name "
        "or name",
    )
    cache_dir: str = Field(
        "",
        description="directory for repository snapshots, environments and episode copies (must "
        "be yours, not group/world-writable); '' = $XDG_CACHE_HOME/saorl/swe, else "
        "~/.cache/saorl/swe",
    )
    command_timeout_s: float = Field(
        10.0, gt=0, description="wall-clock seconds per bash or file-tool call"
    )
    test_timeout_s: float = Field(
        10.0, gt=0, description="seconds per test when grading; slower = 'timeout'"
    )
    grade_timeout_s: float = Field(
        300.0, gt=0, description="wall-clock seconds of one whole grading run"
    )
    max_output_chars: int = Field(
        2000, ge=100, description="characters of tool output shown per call"
    )
    task_envs: Literal["auto", "venv", "none"] = Field(
        "auto",
        description="the interpreter tools and grading run; 'venv' = a virtual environment per "
        "repository and environment commit, with the repository installed from its own "
        "metadata (pip install -e .[test] or requirements files; built once under "
        "env.swe.cache_dir/envs, before any episode); 'none' = saorl's own interpreter and "
        "packages; 'auto' = 'venv' for swebench-format tasks, 'none' for generated ones",
    )
    pip_args: str = Field(
        "",
        description="task environments: extra pip install arguments, split as a shell would, "
        "e.g. '--no-index --find-links /wheels --no-build-isolation' to build offline from a "
        "local wheel directory; '' = pip's own configuration (its index)",
    )
    env_build_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="seconds one task environment's pip install may take; a slower build "
        "fails and its tasks are left out",
    )
    validate_tasks: bool = Field(
        True,
        description="swebench: check every task before use (the gold patch resolves it, an "
        "empty patch does not; verdicts cached under env.swe.cache_dir/validated); failing "
        "tasks are logged with the reason and left out",
    )

    @field_validator("tasks", "repos_root")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        return _absolute(value)

    @field_validator("pip_args")
    @classmethod
    def _check_pip_args(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as e:  # an unclosed quote: pip would never get these arguments
            raise ValueError(f"cannot split {value!r} into arguments: {e}") from None
        return value


class AgentConfig(_Section):
    """env 'agent': your agent program over the OpenAI API (docs/agents.md)."""

    function: str = Field(
        "",
        description="your agent program 'file.py:fn' or 'package.module:fn' (stored "
        "absolute), `async def run(task, client)` with the task as a dict and an "
        "openai.AsyncOpenAI bound to its episode, returning the reward (a float, or a dict with "
        "'reward' and numeric metrics); docs/agents.md",
    )
    command: str = Field(
        "",
        description="instead of env.agent.function, a shell command run once per episode (any "
        "language) with OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL set, the task as JSON "
        'on stdin, printing {"reward": ...} as JSON on its last stdout line',
    )
    env_passthrough: list[str] = Field(
        default_factory=list,
        description="env.agent.command: more of this host's environment variables the command "
        "gets, by name or pattern ('MSWEA_*'); besides them it sees only PATH, HOME, USER, "
        "LOGNAME, SHELL, LANG, LC_*, TERM, TZ, TMPDIR, VIRTUAL_ENV and what saorl sets "
        "(OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL, SAORL_*): no HF_TOKEN or other secret "
        "unless listed (docs/agents.md)",
    )
    tasks: str = Field(
        "math",
        description="the environment whose tasks agents get (and whose grader scores the last "
        "reply when neither the agent nor env.reward_fns give a reward): 'math' = env.dataset "
        "rows, 'arithmetic', or any other env.name's task source",
    )
    host: str = Field(
        "127.0.0.1",
        description="the address each rollout worker's training endpoint binds (a free port); "
        "loopback unless set",
    )

    @field_validator("function")
    @classmethod
    def _check_function(cls, value: str) -> str:
        return check_reference(value, builtins=(), what="agent program") if value else value

    @field_validator("tasks")
    @classmethod
    def _check_tasks(cls, value: str) -> str:
        if value == "agent":
            raise ValueError("names the task source, not 'agent'")
        return check_reference(value, builtins=BUILTIN_ENVS, what="task source")


class OpenEnvConfig(_Section):
    """env 'openenv': an OpenEnv environment server (docs/openenv.md)."""

    app: str = Field(
        "",
        description="an OpenEnv app 'package.module:app' or 'file.py:app' (stored absolute), "
        "served in-process on 127.0.0.1 by each process that runs episodes; docs/openenv.md",
    )
    url: str = Field(
        "",
        description="instead of env.openenv.app, the URL of a running OpenEnv server "
        "(http://host:port); one WebSocket session per episode",
    )
    tool: str = Field(
        "",
        description="the name of the tool the action is offered as; '' = from the action "
        "model's name (GuessAction -> 'guess')",
    )

    @field_validator("app")
    @classmethod
    def _check_app(cls, value: str) -> str:
        return check_reference(value, builtins=(), what="OpenEnv app") if value else value

    @field_validator("url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if value and not re.match(r"^(https?|wss?)://[^/\s]+", value):
            raise ValueError(f"{value!r} is not a server URL like http://127.0.0.1:8000")
        return value


class VerifiersConfig(_Section):
    """env 'verifiers': a verifiers 0.4 taskset (docs/verifiers.md)."""

    taskset: str = Field(
        "",
        description="the taskset as verifiers' load_environment resolves it (an installed "
        "taskset package or module id) or 'path/to/taskset.py'; docs/verifiers.md",
    )
    python: str = Field(
        "",
        description="the Python that has verifiers installed (its own venv: it pins "
        "openai<3), which runs each episode; '' = this one",
    )

    @field_validator("taskset")
    @classmethod
    def _absolute_taskset(cls, value: str) -> str:
        # a taskset file, stored absolute (as dataset paths are); an id stays as it is
        return os.path.abspath(value) if value.endswith(".py") and os.path.isfile(value) else value


class ReasoningGymConfig(_Section):
    """env 'reasoning_gym': reasoning-gym's procedural tasks (docs/reasoning-gym.md)."""

    datasets: list[str] = Field(
        default_factory=list,
        description="reasoning-gym dataset names, e.g. ['chain_sum', 'leg_counting']; weights "
        "and dataset settings in env.args (docs/reasoning-gym.md)",
    )
    answer_format: Literal["tags", "plain", "last_number"] = Field(
        "tags",
        description="'tags' = the answer is the last <answer>...</answer> of the final turn "
        "(reasoning-gym's convention; the instructions ask for it); 'plain' = the final turn's "
        "whole text (small models such as builtin:tiny); 'last_number' = the last number in the "
        "final turn (lm-evaluation-harness' flexible extract; small chat models such as "
        "smollm2-135m, which answer in a sentence)",
    )


# The flat `[env]` keys the families replaced (before issue 44), and their keys now.
MOVED_ENV_KEYS = {
    **{f"swe_{name}": f"swe.{name}" for name in SweConfig.model_fields if name != "validate_tasks"},
    "swe_validate": "swe.validate_tasks",
    "agent": "agent.function",  # a string then; the table [env.agent] now
    "agent_command": "agent.command",
    "agent_env_passthrough": "agent.env_passthrough",
    "agent_tasks": "agent.tasks",
    "agent_host": "agent.host",
    "openenv_app": "openenv.app",
    "openenv_url": "openenv.url",
    "openenv_tool": "openenv.tool",
    "verifiers_env": "verifiers.taskset",
    "verifiers_python": "verifiers.python",
    "rg_datasets": "reasoning_gym.datasets",
    "rg_answer_format": "reasoning_gym.answer_format",
}


def moved_key_message(name: str) -> str | None:
    """The error for an old flat `[env]` key (None: `name` is not one); `env.agent` is one when
    given a string."""
    new = MOVED_ENV_KEYS.get(name)
    if new is None:
        return None
    family, _, field = new.partition(".")
    return (
        f"env.{name} is now env.{new}: write env.{new}=... on the command line, or "
        f"`{field} = ...` under [env.{family}] in TOML"
    )
