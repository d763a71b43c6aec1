"""The config error type and the strict base model of every section."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic.fields import FieldInfo


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


def leaf_fields(model: type[BaseModel], prefix: str = "") -> dict[str, FieldInfo]:
    """Every setting of `model` by dotted name, the fields of nested tables included
    (`EnvConfig`: `name`, ..., `swe.tasks`; `Config`: `env.swe.tasks`)."""
    out: dict[str, FieldInfo] = {}
    for name, info in model.model_fields.items():
        sub = info.annotation
        if isinstance(sub, type) and issubclass(sub, _Section):
            out.update(leaf_fields(sub, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = info
    return out


def set_dotted(data: dict[str, Any], path: str, value: Any) -> None:
    """`data[a][b][c] = value` for `path` 'a.b.c', making the tables on the way; a value on
    the way that is not a table is a `ConfigError`."""
    *tables, last = path.split(".")
    where = ""
    for name in tables:
        where = f"{where}.{name}" if where else name
        table = data.setdefault(name, {})
        if not isinstance(table, dict):
            raise ConfigError(f"{where}: must be a table ([{where}] in TOML), got {table!r}")
        data = table
    data[last] = value


def leaf_values(obj: BaseModel, prefix: str = "") -> dict[str, Any]:
    """Every setting of `obj` by dotted name, as `leaf_fields` names them."""
    out: dict[str, Any] = {}
    for name in type(obj).model_fields:
        value = getattr(obj, name)
        if isinstance(value, _Section):
            out.update(leaf_values(value, f"{prefix}{name}."))
        else:
            out[f"{prefix}{name}"] = value
    return out
