"""The task environment's section (`[env]`) and the references it accepts (built-in names,
`package.module:attr`, `path/to/file.py:attr`)."""

from __future__ import annotations

import os
import re
import shlex
from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section
from saorl.config.references import (  # noqa: F401 (OBJECT_PREFIX, reference_kind: re-exported)
    OBJECT_PREFIX,
    _not_toml,
    check_reference,
    reference_kind,
)


class EnvConfig(_Section):
    """The task environment."""

    name: str = Field(
        "arithmetic",
        description="'arithmetic' = built-in addition (single turn); 'tool_arithmetic' = "
        "built-in multiplication with a calculator tool; 'math' = a math dataset with the "
        "sandboxed Python tool; 'reasoning_gym' = reasoning-gym's procedural tasks "
        "(env.rg_datasets, single turn or with the Python tool; the reasoning-gym extra); "
        "'swe' = fix a repository until its tests pass (shell and edit tools, SWE-bench-style "
        "grading); 'agent' = your agent program over the OpenAI API (env.agent or "
        "env.agent_command, docs/agents.md); 'openenv' = an OpenEnv environment server "
        "(env.openenv_app or env.openenv_url, docs/openenv.md); 'verifiers' = a verifiers 0.4 "
        "taskset (env.verifiers_env, docs/verifiers.md); or your own: "
        "'package.module:attr' or "
        "'path/to/file.py:attr' (stored absolute), attr a factory returning an EnvSpec or an "
        "Env class with a `tasks(**args)` classmethod returning (train, held_out) lists",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="your own env.name: keyword arguments of its factory (or of the class's "
        "tasks()), a TOML table, e.g. {max_guesses = 4}; env 'reasoning_gym': a table per "
        "dataset of env.rg_datasets, its sampling `weight` (default 1) and the dataset's own "
        "config fields, e.g. {chain_sum = {weight = 2, min_terms = 2, max_terms = 3}}; env "
        "'openenv': arguments of each episode's reset besides the seed; env 'verifiers': "
        "verifiers' own [env] config, e.g. {taskset = {size = 50}, agent = {harness = "
        "{id = 'null'}}}",
    )
    num_digits: int = Field(2, ge=1, le=8, description="digits per operand of generated problems")
    eval_size: int = Field(256, ge=1, description="held-out evaluation problems")
    seed: int = Field(
        1234, description="task generator seed; the held-out split never overlaps training"
    )
    max_turns: int = Field(
        4,
        ge=1,
        description="model turns per episode (tool tasks and your own Env class; 'arithmetic' "
        "uses 1)",
    )
    max_tool_calls: int = Field(
        3, ge=0, description="tool calls per episode (tool tasks and your own Env class)"
    )
    step_timeout_s: float = Field(
        600.0,
        gt=0,
        description="seconds an environment reset or step (a tool call, grading) may take; a "
        "slower one fails its episode (env_error), the run goes on",
    )
    reward_fns: list[str] = Field(
        default_factory=list,
        description="reward functions 'package.module:fn' or 'path/to/file.py:fn' (stored "
        "absolute) replacing the env's own reward, written for saorl (completion=, messages= "
        "and the row's columns; a float or None), TRL (batched completions=, columns as "
        "lists; a list) or verl (compute_score(data_source, solution_str, ground_truth, "
        "extra_info); a float or a dict with 'score'): see env.reward_signature",
    )
    reward_signature: Literal["auto", "saorl", "trl", "verl"] = Field(
        "auto",
        description="how env.reward_fns are called: 'auto' = from each signature (a "
        "`completions` or `prompts` parameter: TRL; `solution_str`: verl; else saorl)",
    )
    reward_weights: list[float] = Field(
        default_factory=list,
        description="weight of each of env.reward_fns (same length); [] = all 1.0; the episode "
        "reward is the weighted sum of the values that are not None",
    )
    reward_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds one reward function may take; a slower or raising one fails its "
        "episode (env_error, not trained on), the run goes on",
    )
    use_tool: bool = Field(
        True, description="envs 'math' and 'reasoning_gym': offer the sandboxed Python tool"
    )
    tool_format: Literal["code", "hermes", "llama3"] = Field(
        "code",
        description="'code' = <python>...</python> blocks (small models; env 'swe': "
        "<bash>...</bash>); 'hermes' = <tool_call>{json}</tool_call> (Qwen3, Hermes and most "
        "chat models); 'llama3' = the whole turn is {'name': ..., 'parameters': {...}} as JSON "
        "(Llama 3.1-3.3 JSON tool calling, envs 'math' and 'reasoning_gym'); envs 'math', "
        "'reasoning_gym' and 'swe' (env 'openenv': 'llama3', else 'hermes')",
    )
    tools: list[str] = Field(
        default_factory=list,
        description="env 'math' with tool_format 'hermes' or 'llama3': Python functions "
        "'package.module:fn' or 'path/to/file.py:fn' (stored absolute) offered as tools besides "
        "the sandboxed python tool (use_tool = false: instead of it); schemas come from their "
        "type hints and docstrings; they run in-process, unsandboxed: your trusted code only",
    )
    tool_timeout_s: float = Field(
        30.0,
        gt=0,
        description="env.tools: seconds one function call may take; a slower one returns an "
        "error observation, the episode goes on",
    )
    dataset: str = Field(
        "gsm8k_test",
        description="env 'math': training problems, a preset (aime24, aime25, math500, "
        "gsm8k_test: packaged test splits, so training on one is a smoke test) or a path: "
        ".jsonl/.json/.parquet (.gz too) or a Dataset.save_to_disk directory, in plain, TRL "
        "or verl layout (docs/datasets.md)",
    )
    eval_dataset: str = Field(
        "",
        description="env 'math': held-out problems (preset or path); '' = the last eval_size "
        "rows of `dataset`, which training then never sees",
    )
    problem_key: str = Field(
        "problem",
        description="env 'math' with a path: the prompt field, text or a list of chat "
        "messages; dots name nested fields; 'problem' falls back to 'prompt' (TRL, verl)",
    )
    answer_key: str = Field(
        "answer",
        description="env 'math' with a path: the reference answer field; dots name nested "
        "fields; 'answer' falls back to 'reward_model.ground_truth' (verl)",
    )
    answer_extractor: Literal["none", "gsm8k"] = Field(
        "none", description="env 'math' with a path: 'gsm8k' takes the answer after '####'"
    )
    rg_datasets: list[str] = Field(
        default_factory=list,
        description="env 'reasoning_gym': reasoning-gym dataset names, e.g. ['chain_sum', "
        "'leg_counting']; weights and dataset settings in env.args (docs/reasoning-gym.md)",
    )
    rg_answer_format: Literal["tags", "plain", "last_number"] = Field(
        "tags",
        description="env 'reasoning_gym': 'tags' = the answer is the last <answer>...</answer> "
        "of the final turn (reasoning-gym's convention; the instructions ask for it); 'plain' "
        "= the final turn's whole text (small models such as builtin:tiny); 'last_number' = "
        "the last number in the final turn (lm-evaluation-harness' flexible extract; small "
        "chat models such as smollm2-135m, which answer in a sentence)",
    )
    system_prompt: str = Field(
        "",
        description="envs 'math', 'reasoning_gym' and 'openenv': a system message opening "
        "each episode; a row whose prompt messages have their own system message keeps that one",
    )
    instructions: bool = Field(
        True,
        description="envs 'math' and 'reasoning_gym': put saorl's instructions (the tool's "
        "syntax, how to give the answer) before each problem; false = the dataset's prompt as "
        "it is; env 'openenv': the tool's syntax before the first observation",
    )
    data_root: str = Field(
        "",
        description="where presets live; '' = $SAORL_DATA if set, else the copies packaged "
        "with saorl",
    )
    swe_source: Literal["generated", "swebench"] = Field(
        "generated",
        description="env 'swe': 'generated' = small Python repositories with a bug injected by "
        "AST mutation (deterministic by env.seed); 'swebench' = the SWE-bench-format file "
        "env.swe_tasks against checkouts under env.swe_repos_root",
    )
    swe_num_tasks: int = Field(
        64, ge=1, description="env 'swe' generated: training tasks (eval_size more are held out)"
    )
    swe_tasks: str = Field(
        "", description="env 'swe' swebench: path of the SWE-bench-format .jsonl task file"
    )
    swe_repos_root: str = Field(
        "",
        description="env 'swe' swebench: directory holding the git checkouts, as owner__name, "
        "owner/name or name",
    )
    swe_cache_dir: str = Field(
        "",
        description="env 'swe': directory for repository snapshots, environments and episode "
        "copies (must be yours, not group/world-writable); '' = $XDG_CACHE_HOME/saorl/swe, "
        "else ~/.cache/saorl/swe",
    )
    swe_command_timeout_s: float = Field(
        10.0, gt=0, description="env 'swe': wall-clock seconds per bash or file-tool call"
    )
    swe_test_timeout_s: float = Field(
        10.0, gt=0, description="env 'swe': seconds per test when grading; slower = 'timeout'"
    )
    swe_grade_timeout_s: float = Field(
        300.0, gt=0, description="env 'swe': wall-clock seconds of one whole grading run"
    )
    swe_max_output_chars: int = Field(
        2000, ge=100, description="env 'swe': characters of tool output shown per call"
    )
    swe_task_envs: Literal["auto", "venv", "none"] = Field(
        "auto",
        description="env 'swe': the interpreter tools and grading run; 'venv' = a virtual "
        "environment per repository and environment commit, with the repository installed "
        "from its own metadata (pip install -e .[test] or requirements files; built once "
        "under env.swe_cache_dir/envs, before any episode); 'none' = saorl's own interpreter "
        "and packages; 'auto' = 'venv' for swebench-format tasks, 'none' for generated ones",
    )
    swe_pip_args: str = Field(
        "",
        description="env 'swe' task environments: extra pip install arguments, split as a "
        "shell would, e.g. '--no-index --find-links /wheels --no-build-isolation' to build "
        "offline from a local wheel directory; '' = pip's own configuration (its index)",
    )
    swe_env_build_timeout_s: float = Field(
        1800.0,
        gt=0,
        description="env 'swe': seconds one task environment's pip install may take; a "
        "slower build fails and its tasks are left out",
    )
    swe_validate: bool = Field(
        True,
        description="env 'swe' swebench: check every task before use (the gold patch resolves "
        "it, an empty patch does not; verdicts cached under env.swe_cache_dir/validated); "
        "failing tasks are logged with the reason and left out",
    )

    agent: str = Field(
        "",
        description="env 'agent': your agent program 'file.py:fn' or 'package.module:fn' "
        "(stored absolute), `async def run(task, client)` with the task as a dict and an "
        "openai.AsyncOpenAI bound to its episode, returning the reward (a float, or a dict with "
        "'reward' and numeric metrics); docs/agents.md",
    )
    agent_command: str = Field(
        "",
        description="env 'agent': instead of env.agent, a shell command run once per episode "
        "(any language) with OPENAI_BASE_URL, OPENAI_API_KEY and OPENAI_MODEL set, the task as "
        'JSON on stdin, printing {"reward": ...} as JSON on its last stdout line',
    )
    agent_env_passthrough: list[str] = Field(
        default_factory=list,
        description="env.agent_command: more of this host's environment variables the command "
        "gets, by name or pattern ('MSWEA_*'); besides them it sees only PATH, HOME, USER, "
        "LOGNAME, SHELL, LANG, LC_*, TERM, TZ, TMPDIR, VIRTUAL_ENV and what saorl sets "
        "(OPENAI_BASE_URL, OPENAI_API_KEY, OPENAI_MODEL, SAORL_*): no HF_TOKEN or other secret "
        "unless listed (docs/agents.md)",
    )
    agent_tasks: str = Field(
        "math",
        description="env 'agent': the environment whose tasks agents get (and whose grader "
        "scores the last reply when neither the agent nor env.reward_fns give a reward): "
        "'math' = env.dataset rows, 'arithmetic', or any other env.name's task source",
    )
    agent_host: str = Field(
        "127.0.0.1",
        description="env 'agent': the address each rollout worker's training endpoint binds "
        "(a free port); loopback unless set",
    )

    openenv_app: str = Field(
        "",
        description="env 'openenv': an OpenEnv app 'package.module:app' or 'file.py:app' "
        "(stored absolute), served in-process on 127.0.0.1 by each process that runs episodes; "
        "docs/openenv.md",
    )
    openenv_url: str = Field(
        "",
        description="env 'openenv': instead of env.openenv_app, the URL of a running OpenEnv "
        "server (http://host:port); one WebSocket session per episode",
    )
    openenv_tool: str = Field(
        "",
        description="env 'openenv': the name of the tool the action is offered as; '' = from "
        "the action model's name (GuessAction -> 'guess')",
    )

    verifiers_env: str = Field(
        "",
        description="env 'verifiers': the taskset as verifiers' load_environment resolves it "
        "(an installed taskset package or module id) or 'path/to/taskset.py'; docs/verifiers.md",
    )
    verifiers_python: str = Field(
        "",
        description="env 'verifiers': the Python that has verifiers installed (its own venv: "
        "it pins openai<3), which runs each episode; '' = this one",
    )

    @field_validator("name")
    @classmethod
    def _check_env_name(cls, value: str) -> str:
        return check_reference(value, builtins=BUILTIN_ENVS, what="environment")

    @field_validator("args")
    @classmethod
    def _check_args(cls, value: dict[str, Any]) -> dict[str, Any]:
        bad = _not_toml(value)
        if bad is not None:  # the run's config.toml must hold them
            raise ValueError(
                f"values must be TOML data (text, numbers, booleans, lists, tables); {bad}"
            )
        return value

    @field_validator("dataset", "eval_dataset", "data_root", "swe_tasks", "swe_repos_root")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        # Stored absolute in the run's config.toml, so `--resume` and `saorl eval RUN` from
        # another directory (and Ray actors) read the same files. Preset names have no '/' or
        # '.', and a path that does not exist is left for the loader's error to name.
        if value and ("/" in value or "." in value) and os.path.exists(value):
            return os.path.abspath(value)
        return value

    @field_validator("verifiers_env")
    @classmethod
    def _absolute_taskset(cls, value: str) -> str:
        # a taskset file, stored absolute (as dataset paths are); an id stays as it is
        return os.path.abspath(value) if value.endswith(".py") and os.path.isfile(value) else value

    @field_validator("openenv_app")
    @classmethod
    def _check_openenv_app(cls, value: str) -> str:
        return check_reference(value, builtins=(), what="OpenEnv app") if value else value

    @field_validator("openenv_url")
    @classmethod
    def _check_openenv_url(cls, value: str) -> str:
        if value and not re.match(r"^(https?|wss?)://[^/\s]+", value):
            raise ValueError(f"{value!r} is not a server URL like http://127.0.0.1:8000")
        return value

    @field_validator("agent")
    @classmethod
    def _check_agent(cls, value: str) -> str:
        return check_reference(value, builtins=(), what="agent program") if value else value

    @field_validator("agent_tasks")
    @classmethod
    def _check_agent_tasks(cls, value: str) -> str:
        return check_reference(value, builtins=BUILTIN_ENVS, what="task source")

    @field_validator("reward_fns")
    @classmethod
    def _check_reward_fns(cls, value: list[str]) -> list[str]:
        return [check_reference(v, builtins=(), what="reward function") for v in value]

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[str]) -> list[str]:
        return [check_reference(v, builtins=(), what="tool function") for v in value]

    @field_validator("swe_pip_args")
    @classmethod
    def _check_pip_args(cls, value: str) -> str:
        try:
            shlex.split(value)
        except ValueError as e:  # an unclosed quote: pip would never get these arguments
            raise ValueError(f"cannot split {value!r} into arguments: {e}") from None
        return value

    @model_validator(mode="after")
    def _check_custom_fields(self) -> EnvConfig:
        if self.tools and (self.name != "math" or self.tool_format == "code"):
            raise ValueError(
                "env.tools is for env.name = 'math' with env.tool_format = 'hermes' or "
                "'llama3'; your own environment offers functions through "
                "saorl.envs.function_tools.FunctionTools"
            )
        if self.name == "swe" and self.tool_format == "llama3":
            raise ValueError(
                "env.tool_format = 'llama3' is for env 'math'; env 'swe' takes 'code' or 'hermes'"
            )
        # An agent env takes its tasks (and their settings) from env.agent_tasks.
        tasks = self.agent_tasks if self.name == "agent" else self.name
        if tasks in RG_ENVS:
            _check_rg(self.rg_datasets, self.args)
        elif self.rg_datasets:
            raise ValueError(f"env.rg_datasets is for env.name = {' or '.join(map(repr, RG_ENVS))}")
        if self.args and tasks in BUILTIN_ENVS and tasks not in (*RG_ENVS, "openenv", "verifiers"):
            raise ValueError(
                f"env.args is for your own env.name ('module:attr' or 'file.py:attr'); "
                f"the built-in {self.name!r} takes its settings from the other env fields"
            )
        if self.name == "agent" and bool(self.agent) == bool(self.agent_command):
            raise ValueError(
                "env.name = 'agent' runs an agent program: set exactly one of env.agent "
                "('file.py:fn') and env.agent_command ('python agent.py')"
            )
        if self.name == "openenv" and bool(self.openenv_app) == bool(self.openenv_url):
            raise ValueError(
                "env.name = 'openenv' talks to an OpenEnv server: set exactly one of "
                "env.openenv_app ('my_env.server:app') and env.openenv_url "
                "('http://127.0.0.1:8000')"
            )
        if self.name == "openenv" and self.reward_fns:
            raise ValueError(
                "env.reward_fns: env 'openenv' is rewarded by its server (the sum of its step "
                "rewards); compute other rewards in the environment"
            )
        if self.name == "verifiers" and not self.verifiers_env:
            raise ValueError(
                "env.name = 'verifiers' needs env.verifiers_env: a taskset id or module "
                "('my-taskset') or 'path/to/taskset.py'"
            )
        if self.agent_tasks == "agent":
            raise ValueError("env.agent_tasks names the task source, not 'agent'")
        if self.reward_weights and len(self.reward_weights) != len(self.reward_fns):
            raise ValueError(
                f"env.reward_weights has {len(self.reward_weights)} entries for "
                f"{len(self.reward_fns)} env.reward_fns; give one weight per function or []"
            )
        return self


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
# The dataset presets shipped inside the package (`saorl.envs.data.datasets.DATASET_PRESETS`
# holds how each is read; tests/unit/test_datasets.py checks the two agree). Named here so that
# the trust gate can tell a preset from a path without importing the environments.
DATASET_PRESET_NAMES = ("aime24", "aime25", "math500", "gsm8k_test")
# The envs whose tasks come from reasoning-gym (env.rg_datasets, env.args per dataset).
RG_ENVS = ("reasoning_gym",)


def _check_rg(datasets: list[str], args: dict[str, Any]) -> None:
    """The shape of env.rg_datasets and env.args (the names are checked against
    reasoning-gym's registry when the env is built: importing it here would make the extra a
    dependency of the config)."""
    if not datasets:
        raise ValueError("env.rg_datasets: name at least one dataset, e.g. ['chain_sum']")
    if len(set(datasets)) < len(datasets):
        raise ValueError(f"env.rg_datasets lists a dataset twice: {datasets}")
    for name, table in args.items():
        if name not in datasets:
            raise ValueError(
                f"env.args.{name}: not one of env.rg_datasets ({', '.join(datasets)}); "
                "env.args holds one table per listed dataset"
            )
        if not isinstance(table, dict):
            raise ValueError(
                f"env.args.{name} must be a table, e.g. {{weight = 2, ...}}, not {table!r}"
            )
        weight = table.get("weight", 1.0)
        if isinstance(weight, bool) or not isinstance(weight, int | float) or weight <= 0:
            raise ValueError(f"env.args.{name}.weight must be a number > 0, not {weight!r}")
        if "seed" in table:
            raise ValueError(
                f"env.args.{name}.seed: set env.seed instead (saorl seeds training and "
                "held-out items apart)"
            )
