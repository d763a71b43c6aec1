"""The task environment's section (`[env]`) and the references it accepts (built-in names,
`package.module:attr`, `path/to/file.py:attr`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from saorl.config.base import _Section
from saorl.config.env_families import (
    BUILTIN_ENVS,
    AgentConfig,
    OpenEnvConfig,
    ReasoningGymConfig,
    SweConfig,
    VerifiersConfig,
    _absolute,
    moved_key_message,
)
from saorl.config.references import (  # noqa: F401 (OBJECT_PREFIX, reference_kind: re-exported)
    OBJECT_PREFIX,
    _not_toml,
    check_reference,
    reference_kind,
)

DEFAULT_EVAL_SIZE = 256  # held-out problems when env.eval_size is unset


class EnvConfig(_Section):
    """The task environment."""

    name: str = Field(
        "arithmetic",
        description="'arithmetic' = built-in addition (single turn); 'tool_arithmetic' = "
        "built-in multiplication with a calculator tool; 'math' = a math dataset with the "
        "sandboxed Python tool; 'reasoning_gym' = reasoning-gym's procedural tasks "
        "(env.reasoning_gym.datasets, single turn or with the Python tool; the reasoning-gym "
        "extra); "
        "'swe' = fix a repository until its tests pass (shell and edit tools, SWE-bench-style "
        "grading); 'agent' = your agent program over the OpenAI API (env.agent.function or "
        "env.agent.command, docs/agents.md); 'openenv' = an OpenEnv environment server "
        "(env.openenv.app or env.openenv.url, docs/openenv.md); 'verifiers' = a verifiers 0.4 "
        "taskset (env.verifiers.taskset, docs/verifiers.md); or your own: "
        "'package.module:attr' or "
        "'path/to/file.py:attr' (stored absolute), attr a factory returning an EnvSpec or an "
        "Env class with a `tasks(**args)` classmethod returning (train, held_out) lists",
    )
    args: dict[str, Any] = Field(
        default_factory=dict,
        description="your own env.name: keyword arguments of its factory (or of the class's "
        "tasks()), a TOML table, e.g. {max_guesses = 4}; env 'reasoning_gym': a table per "
        "dataset of env.reasoning_gym.datasets, its sampling `weight` (default 1) and the "
        "dataset's own "
        "config fields, e.g. {chain_sum = {weight = 2, min_terms = 2, max_terms = 3}}; env "
        "'openenv': arguments of each episode's reset besides the seed; env 'verifiers': "
        "verifiers' own [env] config, e.g. {taskset = {size = 50}, agent = {harness = "
        "{id = 'null'}}}",
    )
    num_digits: int = Field(2, ge=1, le=8, description="digits per operand of generated problems")
    eval_size: int | None = Field(
        None,
        ge=1,
        description="held-out evaluation problems; unset: 256, or a tenth of a small "
        "env.dataset split by the run (at least 1), or all of a task file `saorl eval` reads",
    )
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
    swe: SweConfig = Field(default_factory=SweConfig, description=SweConfig.__doc__)
    agent: AgentConfig = Field(default_factory=AgentConfig, description=AgentConfig.__doc__)
    openenv: OpenEnvConfig = Field(default_factory=OpenEnvConfig, description=OpenEnvConfig.__doc__)
    verifiers: VerifiersConfig = Field(
        default_factory=VerifiersConfig, description=VerifiersConfig.__doc__
    )
    reasoning_gym: ReasoningGymConfig = Field(
        default_factory=ReasoningGymConfig, description=ReasoningGymConfig.__doc__
    )

    def held_out_count(self, rows: int | None = None) -> int:
        """`eval_size` as set; unset, 256, or for `rows` rows split by the run a tenth of them
        (at least 1, at most 256). Resolved where used, never written back: the run's
        config.toml then omits it and `saorl eval` from it resolves the same split."""
        if self.eval_size is not None:
            return self.eval_size
        if rows is None:
            return DEFAULT_EVAL_SIZE
        return min(DEFAULT_EVAL_SIZE, max(1, rows // 10))

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

    @model_validator(mode="before")
    @classmethod
    def _refuse_moved_keys(cls, data: Any) -> Any:
        if isinstance(data, dict):
            for name, value in data.items():
                message = moved_key_message(name)
                if message and (name != "agent" or isinstance(value, str)):
                    raise ValueError(message)
        return data

    @field_validator("dataset", "eval_dataset", "data_root")
    @classmethod
    def _absolute_paths(cls, value: str) -> str:
        return _absolute(value)

    @field_validator("reward_fns")
    @classmethod
    def _check_reward_fns(cls, value: list[str]) -> list[str]:
        return [check_reference(v, builtins=(), what="reward function") for v in value]

    @field_validator("tools")
    @classmethod
    def _check_tools(cls, value: list[str]) -> list[str]:
        return [check_reference(v, builtins=(), what="tool function") for v in value]

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
        # An agent env takes its tasks (and their settings) from env.agent.tasks.
        tasks = self.agent.tasks if self.name == "agent" else self.name
        datasets = self.reasoning_gym.datasets
        if tasks in RG_ENVS:
            _check_rg(datasets, self.args)
        elif datasets:
            raise ValueError(
                f"env.reasoning_gym.datasets is for env.name = {' or '.join(map(repr, RG_ENVS))}"
            )
        if self.args and tasks in BUILTIN_ENVS and tasks not in (*RG_ENVS, "openenv", "verifiers"):
            raise ValueError(
                f"env.args is for your own env.name ('module:attr' or 'file.py:attr'); "
                f"the built-in {self.name!r} takes its settings from the other env fields"
            )
        if self.name == "agent" and bool(self.agent.function) == bool(self.agent.command):
            raise ValueError(
                "env.name = 'agent' runs an agent program: set exactly one of "
                "env.agent.function ('file.py:fn') and env.agent.command ('python agent.py')"
            )
        if self.name == "openenv" and bool(self.openenv.app) == bool(self.openenv.url):
            raise ValueError(
                "env.name = 'openenv' talks to an OpenEnv server: set exactly one of "
                "env.openenv.app ('my_env.server:app') and env.openenv.url "
                "('http://127.0.0.1:8000')"
            )
        if self.name == "openenv" and self.reward_fns:
            raise ValueError(
                "env.reward_fns: env 'openenv' is rewarded by its server (the sum of its step "
                "rewards); compute other rewards in the environment"
            )
        if self.name == "verifiers" and not self.verifiers.taskset:
            raise ValueError(
                "env.name = 'verifiers' needs env.verifiers.taskset: a taskset id or module "
                "('my-taskset') or 'path/to/taskset.py'"
            )
        if self.reward_weights and len(self.reward_weights) != len(self.reward_fns):
            raise ValueError(
                f"env.reward_weights has {len(self.reward_weights)} entries for "
                f"{len(self.reward_fns)} env.reward_fns; give one weight per function or []"
            )
        return self


# The dataset presets shipped inside the package (`saorl.envs.data.datasets.DATASET_PRESETS`
# holds how each is read; tests/unit/test_datasets.py checks the two agree). Named here so that
# the trust gate can tell a preset from a path without importing the environments.
DATASET_PRESET_NAMES = ("aime24", "aime25", "math500", "gsm8k_test")
# The envs whose tasks come from reasoning-gym (env.reasoning_gym.datasets, env.args per
# dataset).
RG_ENVS = ("reasoning_gym",)


def _check_rg(datasets: list[str], args: dict[str, Any]) -> None:
    """The shape of env.reasoning_gym.datasets and env.args (the names are checked against
    reasoning-gym's registry when the env is built: importing it here would make the extra a
    dependency of the config)."""
    if not datasets:
        raise ValueError(
            "env.reasoning_gym.datasets: name at least one dataset, e.g. ['chain_sum']"
        )
    if len(set(datasets)) < len(datasets):
        raise ValueError(f"env.reasoning_gym.datasets lists a dataset twice: {datasets}")
    for name, table in args.items():
        if name not in datasets:
            raise ValueError(
                f"env.args.{name}: not one of env.reasoning_gym.datasets ({', '.join(datasets)}); "
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
