"""The config error type and the strict base model of every section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict


class ConfigError(ValueError):
    """An invalid configuration; the message names the dotted key and the fix."""


class _Section(BaseModel):
    model_config = ConfigDict(
        extra="forbid", validate_assignment=True, strict=True, allow_inf_nan=False
    )

    def implied_fields(self) -> dict[str, Any]:
        """Fields whose value follows from another field when they are left out of a file
        (`config_to_toml` writes them only where they differ)."""
        return {}
