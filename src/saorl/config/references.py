"""References to user code in config fields (`package.module:attr`, `path/to/file.py:attr`) and
the TOML-data check of `env.args` (split from `saorl.config.env`)."""

from __future__ import annotations

import os
import re
from typing import Any, Literal

# `package.module:attr` / `path/to/file.py:attr`; attr may be dotted (`Class.factory`).
_DOTTED = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
# What `saorl.train(env=<object>)` stores: an object that lives only in this process.
OBJECT_PREFIX = "python-object:"


def _not_toml(value: Any, where: str = "") -> str | None:
    """What in `value` TOML cannot hold (None: all of it is TOML data)."""
    if isinstance(value, dict):
        for k, v in value.items():
            bad = _not_toml(v, f"{where}.{k}" if where else str(k))
            if bad is not None:
                return bad
        return None
    if isinstance(value, list | tuple):
        return next((b for i, v in enumerate(value) if (b := _not_toml(v, f"{where}[{i}]"))), None)
    if isinstance(value, str | bool | int | float):
        return None
    return f"{where} is {value!r}"


def reference_kind(value: str) -> Literal["module", "file", "object"] | None:
    """How the string `value` names user code (None: not a reference)."""
    if value.startswith(OBJECT_PREFIX):
        return "object"
    target, sep, attr = value.rpartition(":")
    if not sep or not _DOTTED.fullmatch(attr):
        return None
    if target.endswith(".py"):
        return "file"
    return "module" if _DOTTED.fullmatch(target) else None


def check_reference(value: str, builtins: tuple[str, ...], what: str) -> str:
    """`value` if it is a built-in name or a reference; a file reference made absolute
    against the current directory, so resume and Ray actors find the same file."""
    if value in builtins:
        return value
    kind = reference_kind(value)
    if kind is None:
        named = f"a built-in {what} ({', '.join(builtins)}), " if builtins else ""
        raise ValueError(
            f"{value!r} is not {named}an import path 'package.module:attr' or a file "
            "'path/to/file.py:attr'"
        )
    if kind == "file":
        path, _, attr = value.rpartition(":")
        return f"{os.path.abspath(os.path.expanduser(path))}:{attr}"
    return value
