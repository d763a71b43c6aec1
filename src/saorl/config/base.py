"""The config error type and the strict base model of every section."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """An invalid configuration; the message names the dotted key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )
