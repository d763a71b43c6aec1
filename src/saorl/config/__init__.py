"""Typed configuration: one pydantic model per component under a root `Config`.

Defaults are the built-in CPU demo (what `saorl train` with no arguments runs); each field's
description names its unit and, where the paper (arXiv 2607.07508) gives one, the paper's value.
A config is a TOML file with one table per component (`[algorithm]`, `[learner]`, ...), then
command-line overrides `section.field=value` applied on top. `[env]` nests a table per env family
(`[env.swe]`, `[env.agent]`, ...; overrides `env.swe.tasks=...`). Every problem is reported as a
`ConfigError` naming the dotted key and what would fix it.

Decisions:
- Models are strict: a TOML `batch_size = 2.0` or `progress = 1` is an error, not a silent cast
  (an int is still accepted where a float is expected). NaN and infinity are rejected.
- An override value is parsed as a TOML value when it parses (`1e-4`, `true`, `["a"]`, `"x"`)
  and is otherwise a plain string, so `run.name=exp1` works. For a string field a non-string
  TOML value is kept as written (`run.name=123` is the name "123"). For an optional field,
  `none` or `null` unsets it (TOML has no null).

This module must not import torch: `saorl --help` and `saorl train --print-config` stay instant.
"""

from __future__ import annotations

from saorl.config.algorithm import AlgorithmConfig
from saorl.config.base import ConfigError
from saorl.config.critic import CriticConfig
from saorl.config.env import EnvConfig
from saorl.config.io import (
    config_from_dict,
    config_to_toml,
    describe_config,
    load_config,
    parse_override,
)
from saorl.config.learner import LearnerConfig
from saorl.config.model import ModelConfig
from saorl.config.ray import RayConfig
from saorl.config.rollout import RolloutConfig
from saorl.config.root import Config
from saorl.config.run import RunConfig

__all__ = [
    "AlgorithmConfig",
    "Config",
    "ConfigError",
    "CriticConfig",
    "EnvConfig",
    "LearnerConfig",
    "ModelConfig",
    "RayConfig",
    "RolloutConfig",
    "RunConfig",
    "config_from_dict",
    "config_to_toml",
    "describe_config",
    "load_config",
    "parse_override",
]
