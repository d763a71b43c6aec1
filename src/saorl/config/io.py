"""Loading (TOML + overrides), error messages that name the key and the fix, and TOML output."""

from __future__ import annotations

import difflib
import math
import tomllib
import types
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from annotated_types import Ge, Gt, Le, Lt
from pydantic import BaseModel, ValidationError
from pydantic.fields import FieldInfo

from saorl.config.base import ConfigError, leaf_fields, set_dotted
from saorl.config.env_families import moved_key_message
from saorl.config.presets import describe_presets, implied_settings
from saorl.config.root import Config

# ---------------------------------------------------------------------------------------------
# Loading


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Read a TOML config (or start from defaults when `path` is None), apply `overrides`.

    Each override is `section.field=value`; later overrides win. Raises `ConfigError`.
    """
    data: dict[str, Any] = {}
    origin: dict[tuple[str, ...], str] = {}
    if path is not None:
        data = _read_toml(Path(path))
        for section, table in data.items():
            origin[(section,)] = str(path)
            if isinstance(table, dict):
                for name in table:
                    origin[(section, name)] = str(path)
    for item in overrides:
        section, name, value = parse_override(item)
        set_dotted(data, f"{section}.{name}", value)
        origin[(section, *name.split("."))] = f"override {item!r}"
    return config_from_dict(data, origin)


def config_from_dict(
    data: dict[str, Any], origin: dict[tuple[str, ...], str] | None = None
) -> Config:
    """Validate nested `{section: {field: value}}` data; errors become one `ConfigError`."""
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        lines = [_format_error(err, origin or {}) for err in exc.errors(include_url=False)]
        if len(lines) == 1:
            raise ConfigError(lines[0]) from None
        raise ConfigError(
            f"{len(lines)} config errors:\n" + "\n".join(f"  {line}" for line in lines)
        ) from None


def parse_override(item: str) -> tuple[str, str, Any]:
    """Split `section.field=value` into (section, field, parsed value); raises `ConfigError`.
    A field in a nested table keeps its dots: `env.swe.tasks=x` is ('env', 'swe.tasks', 'x')."""
    if "=" not in item:
        raise ConfigError(
            f"override {item!r} has no '=': write section.field=value, e.g. {item.strip()}=..."
        )
    key, raw = (part.strip() for part in item.split("=", 1))
    section, _, name = key.partition(".")
    if not section or not name:
        raise ConfigError(f"override key {key!r} must be section.field, e.g. algorithm.eps_low=0.3")
    info = _lookup_field(section, name)
    return section, name, _parse_value(raw, info.annotation)


def _read_toml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ConfigError(f"config file not found: {path} (pass an existing .toml file)")
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: malformed TOML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text: {exc}") from None


def _lookup_field(section: str, name: str) -> FieldInfo:
    sections = Config.model_fields
    if section not in sections:
        raise ConfigError(_unknown_section_message(section))
    fields = leaf_fields(_section_model(section))
    if name not in fields:
        raise ConfigError(_unknown_key_message(section, name))
    return fields[name]


def _section_model(section: str) -> type[BaseModel]:
    return Config.model_fields[section].annotation  # type: ignore[return-value]


def _parse_value(raw: str, annotation: Any) -> Any:
    args = get_args(annotation)
    if type(None) in args and raw.lower() in ("none", "null"):
        return None
    try:
        doc = tomllib.loads(f"v = {raw}")
    except tomllib.TOMLDecodeError:
        return raw
    if set(doc) != {"v"}:  # e.g. a value containing a newline and a second assignment
        return raw
    value = doc["v"]
    string_field = annotation is str or (
        get_origin(annotation) is Literal and all(isinstance(a, str) for a in args)
    )
    if string_field and not isinstance(value, str):
        return raw
    return value


# ---------------------------------------------------------------------------------------------
# Error messages


def _unknown_section_message(section: str) -> str:
    sections = list(Config.model_fields)
    msg = f"unknown section {section!r}"
    close = difflib.get_close_matches(section, sections, n=1)
    owners = [s for s in sections if section in leaf_fields(_section_model(s))]
    if close:
        msg += f"; did you mean {close[0]!r}?"
    elif owners:
        keys = " or ".join(f"'{s}.{section}'" for s in owners)
        msg += f"; did you mean {keys}? (put the key under its [section] table)"
    return msg + f" Valid sections: {', '.join(sections)}"


def _unknown_key_message(section: str, name: str) -> str:
    moved = moved_key_message(name) if section == "env" else None
    if moved:
        return moved
    fields = list(leaf_fields(_section_model(section)))
    msg = f"unknown key '{section}.{name}'"
    close = difflib.get_close_matches(name, fields, n=1)
    owners = [s for s in Config.model_fields if name in leaf_fields(_section_model(s))]
    if close:
        return msg + f"; did you mean '{section}.{close[0]}'?"
    if owners:
        keys = " or ".join(f"'{s}.{name}'" for s in owners)
        return msg + f"; did you mean {keys}?"
    table, dot, _ = name.rpartition(".")
    if dot and any(f.startswith(f"{table}.") for f in fields):  # a nested table's own keys
        keys = [f.removeprefix(f"{table}.") for f in fields if f.startswith(f"{table}.")]
        return msg + f"; valid keys in [{section}.{table}]: {', '.join(keys)}"
    return msg + f"; valid keys in [{section}]: {', '.join(fields)}"


_EXPECTED = {
    "int_type": "an integer",
    "int_parsing": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "float_parsing": "a number",
    "finite_number": "a finite number",
    "bool_type": "true or false",
    "bool_parsing": "true or false",
    "string_type": 'a string (quote it in TOML: "...")',
    "list_type": 'a list, e.g. ["a", "b"]',
}
_RANGE_ERRORS = ("greater_than", "greater_than_equal", "less_than", "less_than_equal")


def _format_error(err: Any, origin: dict[tuple[str, ...], str]) -> str:
    loc: tuple[Any, ...] = tuple(err["loc"])
    key = _dotted(loc)
    kind = err["type"]
    value = err.get("input")
    info = _field_info(loc)
    if kind == "extra_forbidden" and len(loc) == 1:
        line = _unknown_section_message(str(loc[0]))
    elif kind == "extra_forbidden":
        line = _unknown_key_message(str(loc[0]), ".".join(map(str, loc[1:])))
    elif kind in _RANGE_ERRORS:
        bounds = _range_text(info) if info is not None else err["msg"].lower()
        unset = " (or unset)" if info is not None and _optional(info) else ""
        line = f"{key}: must be {bounds}{unset}, got {_show(value)}"
    elif kind == "literal_error":
        allowed = ", ".join(_show(a) for a in _literal_values(info)) or err["ctx"]["expected"]
        line = f"{key}: must be one of {allowed}; got {_show(value)}"
    elif kind in ("model_type", "dict_type", "model_attributes_type") and _is_table(loc):
        line = f"{key}: must be a table ([{key}] in TOML), got {_show(value)}"
    elif kind in _EXPECTED:
        line = f"{key}: must be {_EXPECTED[kind]}, got {_show(value)} ({type(value).__name__})"
    elif kind == "value_error":
        text = str(err["ctx"]["error"]) if "error" in err.get("ctx", {}) else err["msg"]
        line = f"{key}: {text}" if len(loc) >= 2 else text
    else:
        line = f"{key or 'config'}: {err['msg']}, got {_show(value)}"
    source = next((origin[loc[:n]] for n in range(len(loc), 0, -1) if loc[:n] in origin), None)
    return f"{line} (from {source})" if source else line


def _dotted(loc: tuple[Any, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _field_info(loc: tuple[Any, ...]) -> FieldInfo | None:
    if len(loc) < 2 or loc[0] not in Config.model_fields:
        return None
    fields = leaf_fields(_section_model(loc[0]))
    names = [str(part) for part in loc[1:]]
    return next(
        (fields[k] for n in range(len(names), 0, -1) if (k := ".".join(names[:n])) in fields), None
    )


def _is_table(loc: tuple[Any, ...]) -> bool:
    """Whether `loc` is a section or a nested table (`env.swe`), not a field."""
    if len(loc) == 1:
        return True
    return loc[0] in Config.model_fields and _field_info(loc) is None


def _optional(info: FieldInfo) -> bool:
    return type(None) in get_args(info.annotation)


def _literal_values(info: FieldInfo | None) -> tuple[Any, ...]:
    if info is None:
        return ()
    annotation = info.annotation
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def bounds_text(info: FieldInfo) -> str:
    """A field's numeric bounds: '[0, 1)', '>= 1', ... ('' when it has none)."""
    low = high = None
    low_open = high_open = False
    for meta in info.metadata:
        if isinstance(meta, Gt):
            low = meta.gt
            low_open = True
        elif isinstance(meta, Ge):
            low = meta.ge
            low_open = False
        elif isinstance(meta, Lt):
            high = meta.lt
            high_open = True
        elif isinstance(meta, Le):
            high = meta.le
            high_open = False
    if low is not None and high is not None:
        return f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {low:g}"
    if high is not None:
        return f"{'<' if high_open else '<='} {high:g}"
    return ""


def _range_text(info: FieldInfo) -> str:
    bounds = bounds_text(info)
    if not bounds:
        return "in range"
    return f"in {bounds}" if bounds[0] in "[(" else bounds


def _show(value: Any) -> str:
    try:
        return _toml_value(value)
    except TypeError:
        return repr(value)


# ---------------------------------------------------------------------------------------------
# Writing and describing


def config_to_toml(cfg: Config, comments: bool = False) -> str:
    """Render `cfg` as TOML that `load_config` reads back to an equal config.

    None values are omitted (None is every optional field's default). Fields the
    `algorithm.name` preset sets (`saorl.config.presets`, in any section) are written only
    where they differ from it, so a saved config then combined with an `algorithm.name`
    override means what it says; where they equal it they are shown commented out with the
    preset's name, so the output still shows every value in effect. With `comments`, each key
    is preceded by its description.
    """
    preset = implied_settings(cfg)
    note = f"  # algorithm.name = {_toml_value(cfg.algorithm.name)}"
    lines: list[str] = []
    for section in type(cfg).model_fields:
        sub = getattr(cfg, section)
        implied = {**sub.implied_fields(), **preset.get(section, {})}
        _write_table(lines, section, sub, implied, note, comments)
    return "\n".join(lines)


def _write_table(
    lines: list[str],
    header: str,
    obj: BaseModel,
    implied: dict[str, Any],
    note: str,
    comments: bool,
) -> None:
    """`[header]` and `obj`'s values, then its nested tables as `[header.name]`."""
    lines.append(f"[{header}]")
    tables = []
    for name, info in type(obj).model_fields.items():
        value = getattr(obj, name)
        if isinstance(value, BaseModel):
            tables.append(name)
            continue
        if value is None:
            continue
        if comments:
            lines.append(f"# {info.description}")
        if name in implied and implied[name] == value:
            lines.append(f"# {name} = {_toml_value(value)}{note}")
        else:
            lines.append(f"{name} = {_toml_value(value)}")
    lines.append("")
    for name in tables:
        if comments:
            lines.append(f"# {type(obj).model_fields[name].description}")
        _write_table(lines, f"{header}.{name}", getattr(obj, name), {}, note, comments)


def describe_config() -> str:
    """Every field as `section.field = default  (type, range)` and its description."""
    lines: list[str] = []
    for section, section_info in Config.model_fields.items():
        model = _section_model(section)
        lines.append(f"[{section}]  {section_info.description}")
        for name, info in leaf_fields(model).items():
            default = info.get_default(call_default_factory=True)
            shown = "(unset)" if default is None else _toml_value(default)
            kind = _type_text(info.annotation)
            bounds = _range_text(info)
            extra = "" if bounds == "in range" else f", {bounds}"
            lines.append(f"  {section}.{name} = {shown}  ({kind}{extra})")
            lines.append(f"      {info.description}")
        lines.append("")
    return "\n".join(lines) + "\n" + describe_presets()


def _type_text(annotation: Any) -> str:
    origin = get_origin(annotation)
    args = get_args(annotation)
    if origin is Literal:
        return " | ".join(_toml_value(a) for a in args)
    if origin in (Union, types.UnionType):
        return " | ".join(_type_text(a) for a in args)
    if origin is list:
        return f"list[{_type_text(args[0])}]"
    if origin is dict:
        return "table"
    if annotation is type(None):
        return "None"
    return getattr(annotation, "__name__", str(annotation))


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        if math.isinf(value):
            return "inf" if value > 0 else "-inf"
        return repr(value)
    if isinstance(value, str):
        return toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):  # an inline table (`env.args`)
        items = (f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items())
        return "{" + ", ".join(items) + "}"
    raise TypeError(f"cannot write {type(value).__name__} as TOML: {value!r}")


def _toml_key(key: str) -> str:
    bare = key and all(c.isascii() and (c.isalnum() or c in "_-") for c in key)
    return key if bare else toml_string(key)


_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\b": "\\b",
    "\t": "\\t",
    "\n": "\\n",
    "\f": "\\f",
    "\r": "\\r",
}


def toml_string(text: str) -> str:
    """`text` as a TOML basic string (a value or a key); characters outside the BMP are
    written as themselves: TOML has no surrogate escapes."""
    out = []
    for ch in text:
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'
