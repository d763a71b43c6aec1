"""Build the task and environment that `env.name` selects (one visible if/elif): an `EnvSpec`
(`saorl.envs.base`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.config.env import BUILTIN_ENVS
from saorl.envs.base import EnvSpec
from saorl.envs.data.files import held_out_size


class DatasetTask:
    """Training problems sampled uniformly from a list, with a separate held-out list."""

    def __init__(self, train: list[Any], held_out: list[Any], need_train: bool = True) -> None:
        if need_train and not train:
            raise ConfigError("env.dataset: no training problems left after the held-out split")
        self.train = train
        self.held_out = held_out

    def sample(self, rng: random.Random) -> Any:
        return rng.choice(self.train)


def _load(cfg: EnvConfig, key: str) -> list[Any]:
    """The problems of `env.<key>` (`dataset` or `eval_dataset`): a preset or a file."""
    from saorl.envs.data.datasets import DATASET_PRESETS, load_preset, load_problems

    name_or_path = getattr(cfg, key)
    if name_or_path in DATASET_PRESETS:
        return load_preset(name_or_path, cfg.data_root or None)
    if not Path(name_or_path).exists():
        raise ConfigError(
            f"env.{key}: {name_or_path!r} is neither a preset ({', '.join(DATASET_PRESETS)}) "
            "nor a file or directory"
        )
    extractor = None if cfg.answer_extractor == "none" else cfg.answer_extractor
    # User reward functions replace the grader: rows need no reference answer then.
    return load_problems(
        name_or_path, cfg.problem_key, cfg.answer_key, extractor, require_answer=not cfg.reward_fns
    )


def _ungraded(response: str, reference: str) -> float:
    """The math grader's stand-in when `env.reward_fns` score the episode instead."""
    return 0.0


def build_env(
    cfg: EnvConfig, *, held_out_only: bool = False, run_dir: Path | None = None
) -> EnvSpec:
    """The environment of `cfg`. `held_out_only` (`saorl eval`) builds only what evaluation
    needs: no training problems are required or made, a generated task's held-out set may take
    every problem there is, and a file of evaluation problems (`env.eval_dataset`, a
    SWE-bench `env.swe.tasks`) is taken whole unless the config sets `env.eval_size` (a run's
    saved config.toml does: `recorded_env` writes its own held-out count there). `run_dir`: the
    training run's folder, where agent programs keep their own files (`saorl.envs.agent`); None
    outside a run."""
    spec = _build_env(cfg, held_out_only, run_dir)
    spec.step_timeout_s = cfg.step_timeout_s
    if cfg.reward_fns and cfg.name != "agent":  # agent programs apply them themselves
        from saorl.envs.rewards import with_reward_fns

        spec = with_reward_fns(spec, cfg)
    return spec


_SPLIT_BY_DATA = ("math", "swe", "verifiers")  # held-out counts that depend on the data


def recorded_env(cfg: EnvConfig, spec: EnvSpec) -> EnvConfig:
    """`cfg` as a run's config.toml records it: an unset `env.eval_size` of a built-in env whose
    held-out count depends on its data set to the count `spec` holds out, so `saorl eval RUN`
    and `--resume` split as the run did. A copy: the run's own config is never changed."""
    family = cfg.agent.tasks if cfg.name == "agent" else cfg.name
    if cfg.eval_size is not None or family not in _SPLIT_BY_DATA:
        return cfg
    return cfg.model_copy(update={"eval_size": len(spec.task.held_out)})


def _build_env(cfg: EnvConfig, held_out_only: bool, run_dir: Path | None = None) -> EnvSpec:
    if cfg.name == "arithmetic":
        from saorl.envs.arithmetic import ArithmeticEnv, ArithmeticTask

        task = ArithmeticTask(
            cfg.num_digits, cfg.held_out_count(), cfg.seed, train=not held_out_only
        )
        return EnvSpec(
            task,
            ArithmeticEnv,
            max_turns=1,
            max_tool_calls=0,
            stop=(),
            demo=lambda p, rng: [(p.prompt, False), (p.answer, True)],
        )
    elif cfg.name == "tool_arithmetic":
        from saorl.envs.tool_arithmetic import STOP, ToolArithmeticEnv, ToolArithmeticTask

        task = ToolArithmeticTask(
            cfg.num_digits, cfg.held_out_count(), cfg.seed, train=not held_out_only
        )
        return EnvSpec(
            task,
            ToolArithmeticEnv,
            max_turns=cfg.max_turns,
            max_tool_calls=cfg.max_tool_calls,
            stop=(STOP,),
            demo=ToolArithmeticTask.demo,
        )
    elif cfg.name == "math":
        from saorl.envs.math.tool import MathToolEnv
        from saorl.toolcalls import stop_strings

        if cfg.eval_dataset and held_out_only:
            train = []
            held_out = _load(cfg, "eval_dataset")[: cfg.eval_size]  # unset: all of it
        elif cfg.eval_dataset:
            train = _load(cfg, "dataset")
            held_out = _load(cfg, "eval_dataset")[: cfg.held_out_count()]
        else:
            problems = _load(cfg, "dataset")
            size = held_out_size(cfg, len(problems), need_train=not held_out_only)
            train = problems[:-size]
            held_out = problems[-size:]
        functions = None
        if cfg.tools:
            from saorl.envs.function_tools import FunctionTools

            functions = FunctionTools(cfg.tools, timeout_s=cfg.tool_timeout_s)
            if cfg.use_tool and "python" in functions:
                raise ConfigError(
                    "env.tools: a function named 'python' clashes with the sandboxed python "
                    "tool; rename it or set env.use_tool = false"
                )
        tools_on = cfg.use_tool or functions is not None
        return EnvSpec(
            DatasetTask(train, held_out, need_train=not held_out_only),
            lambda: MathToolEnv(
                fmt=cfg.tool_format,
                use_tool=cfg.use_tool,
                system_prompt=cfg.system_prompt,
                instructions=cfg.instructions,
                functions=functions,
                **({"grader": _ungraded} if cfg.reward_fns else {}),
            ),
            max_turns=cfg.max_turns if tools_on else 1,
            max_tool_calls=cfg.max_tool_calls if tools_on else 0,
            stop=tuple(stop_strings(cfg.tool_format)) if tools_on else (),
        )
    elif cfg.name == "agent":
        from saorl.envs.agent import build_agent_spec

        return build_agent_spec(cfg, held_out_only, _build_env, run_dir)
    elif cfg.name == "openenv":
        from saorl.envs.openenv import build_openenv_spec

        return build_openenv_spec(cfg, held_out_only)
    elif cfg.name == "verifiers":
        from saorl.envs.verifiers_env import build_verifiers_spec

        return build_verifiers_spec(cfg, held_out_only)
    elif cfg.name == "reasoning_gym":
        from saorl.envs.reasoning_gym import build_rg_spec

        return build_rg_spec(cfg, held_out_only)
    elif cfg.name == "swe":
        from saorl.envs.swe.spec import build_swe_spec

        return build_swe_spec(cfg, held_out_only)
    elif cfg.name not in BUILTIN_ENVS:  # your own: 'package.module:attr' or 'file.py:attr'
        from saorl.envs.custom import build_custom_env

        return build_custom_env(cfg, held_out_only)
    raise ConfigError(f"env.name: unknown environment {cfg.name!r}")
