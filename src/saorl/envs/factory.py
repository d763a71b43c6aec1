"""Build the task and environment that `env.name` selects (one visible if/elif): an `EnvSpec`
(`saorl.envs.base`)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import EnvSpec


class DatasetTask:
    """Training problems sampled uniformly from a list, with a separate held-out list."""

    def __init__(self, train: list[Any], held_out: list[Any]) -> None:
        if not train:
            raise ConfigError("env.dataset: no training problems left after the held-out split")
        self.train, self.held_out = train, held_out

    def sample(self, rng: random.Random) -> Any:
        return rng.choice(self.train)


def _load(cfg: EnvConfig, name_or_path: str) -> list[Any]:
    from saorl.envs.datasets import DATASET_PRESETS, load_preset, load_problems

    if name_or_path in DATASET_PRESETS:
        return load_preset(name_or_path, cfg.data_root or None)
    if not Path(name_or_path).is_file():
        raise ConfigError(
            f"env.dataset: {name_or_path!r} is neither a preset ({', '.join(DATASET_PRESETS)}) "
            "nor a file"
        )
    extractor = None if cfg.answer_extractor == "none" else cfg.answer_extractor
    return load_problems(name_or_path, cfg.problem_key, cfg.answer_key, extractor)


def build_env(cfg: EnvConfig) -> EnvSpec:
    spec = _build_env(cfg)
    spec.step_timeout_s = cfg.step_timeout_s
    return spec


def _build_env(cfg: EnvConfig) -> EnvSpec:
    if cfg.name == "arithmetic":
        from saorl.envs.arithmetic import ArithmeticEnv, ArithmeticTask

        task = ArithmeticTask(cfg.num_digits, cfg.eval_size, cfg.seed)
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

        task = ToolArithmeticTask(cfg.num_digits, cfg.eval_size, cfg.seed)
        return EnvSpec(
            task,
            ToolArithmeticEnv,
            max_turns=cfg.max_turns,
            max_tool_calls=cfg.max_tool_calls,
            stop=(STOP,),
            demo=ToolArithmeticTask.demo,
        )
    elif cfg.name == "math":
        from saorl.envs.math_tool import MathToolEnv
        from saorl.rollout.tools import stop_strings

        problems = _load(cfg, cfg.dataset)
        if cfg.eval_dataset:
            train, held_out = problems, _load(cfg, cfg.eval_dataset)[: cfg.eval_size]
        else:
            train, held_out = problems[: -cfg.eval_size], problems[-cfg.eval_size :]
        return EnvSpec(
            DatasetTask(train, held_out),
            lambda: MathToolEnv(fmt=cfg.tool_format, use_tool=cfg.use_tool),
            max_turns=cfg.max_turns if cfg.use_tool else 1,
            max_tool_calls=cfg.max_tool_calls if cfg.use_tool else 0,
            stop=tuple(stop_strings(cfg.tool_format)) if cfg.use_tool else (),
        )
    elif cfg.name == "swe":
        from saorl.envs.swe.spec import build_swe_spec

        return build_swe_spec(cfg)
    raise ConfigError(f"env.name: unknown environment {cfg.name!r}")
