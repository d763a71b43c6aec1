"""Python functions as tools: JSON schemas from their signatures, calls checked and run.

    env.tools = ["my_pkg.tools:search", "tools.py:add"]   # env 'math', hermes or llama3 format

Each function's schema follows what chat templates (Qwen3, Llama 3, Hermes) expect in
`apply_chat_template(..., tools=)`: `{"type": "function", "function": {"name", "description",
"parameters"}}`, the parameters a JSON schema derived from the type hints (int, float, str,
bool, list[...], dict, Optional, Literal; anything else accepts any value), the defaults (a
parameter without one is required) and the docstring: its first paragraph describes the
function, a Google-style `Args:` or NumPy-style `Parameters` section describes the parameters.

`FunctionTools.call` never raises: an unknown tool, arguments that do not fit the schema
(nested however deep), an exception and a timeout come back as `error: ...` text for the model
to read, cut to `max_output_chars` (at least 300 characters) like any result. The functions
run in this process (sync ones in a thread, async ones awaited): they are your own trusted
code. Code the model writes belongs in the sandboxed `python` tool instead.

Your own environment can offer tools the same way: build a `FunctionTools` in its factory,
set the env instance's `tools` attribute to `FunctionTools.schemas` (the rollout worker passes
it to the chat template) and answer calls from `step` with `await tools.call(call)`.
"""

from __future__ import annotations

import asyncio
import inspect
import re
import reprlib
import types
import typing
from collections.abc import Callable, Sequence
from typing import Any, Literal, Union

from saorl.config import ConfigError
from saorl.toolcalls import ToolCall

_PRIMITIVES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean"}
_SECTION = re.compile(
    r"^(Args|Arguments|Parameters|Params|Returns?|Yields?|Raises|Examples?|Notes?|"
    r"Attributes|See Also|References|Warnings?)\s*:?\s*$"
)


def _type_schema(tp: Any) -> dict[str, Any]:
    """The JSON schema of one type hint; {} (any value) for what JSON cannot say."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if tp in _PRIMITIVES:
        return {"type": _PRIMITIVES[tp]}
    if origin in (Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        schema = (
            _type_schema(rest[0]) if len(rest) == 1 else {"anyOf": [_type_schema(a) for a in rest]}
        )
        return {**schema, "nullable": True} if len(rest) < len(args) else schema
    if origin is Literal:
        kinds = {_PRIMITIVES.get(type(v)) for v in args}
        return (
            {"type": kinds.pop(), "enum": list(args)} if len(kinds) == 1 else {"enum": list(args)}
        )
    if tp in (list, tuple, set, frozenset) or origin in (list, tuple, set, frozenset, Sequence):
        one = args[0] if args and (origin is not tuple or len(args) == 1 or args[1] is ...) else Any
        return {"type": "array", **({"items": _type_schema(one)} if one is not Any else {})}
    if tp is dict or origin is dict:
        return {"type": "object"}
    return {}


_ARG_SECTIONS = ("args", "arguments", "parameters", "params")
# Values quoted in error texts: a few levels and items deep, whatever the model sent.
_SHORT = reprlib.Repr()
_SHORT.maxlevel = 3
_SHORT.maxstring = 80
_SHORT.maxother = 80
_SHORT.maxlong = 40


def _show(value: Any) -> str:
    return _SHORT.repr(value)


def _docstring_parts(doc: str) -> tuple[str, dict[str, str]]:
    """The first paragraph, and each parameter's description from an `Args:` section
    (`name (type): text` or `name: text`) or a NumPy `Parameters` section (`name : type`, the
    text indented below); deeper-indented lines continue a description."""
    lines = inspect.cleandoc(doc).splitlines()
    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION.match(line.strip()):
            break
        first.append(line.strip())
    params: dict[str, str] = {}
    in_args = False
    numpy = False
    name = ""
    base = -1
    for i, line in enumerate(lines):
        text = line.strip()
        below = lines[i + 1].strip() if i + 1 < len(lines) else ""
        underlined = bool(below) and set(below) == {"-"}
        if _SECTION.match(text) and (text.endswith(":") or underlined):
            in_args = text.rstrip(":").strip().lower() in _ARG_SECTIONS
            numpy = underlined
            name = ""
            base = -1
            continue
        if not in_args or not text or set(text) == {"-"}:
            continue
        depth = len(line) - len(line.lstrip())
        base = depth if base < 0 else base
        m = re.match(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", text)
        if depth == base and m:
            # Google puts the text after the colon; NumPy puts the type there.
            name = m.group(1)
            params[name] = "" if numpy else m.group(2)
        elif name:
            params[name] = f"{params[name]} {text}".strip()
    return " ".join(first), params


def function_schema(fn: Callable[..., Any]) -> dict[str, Any]:
    """The tool schema of `fn` (the module docstring says what goes in it)."""
    try:
        hints = typing.get_type_hints(fn)
    except Exception:  # a hint naming something undefined: use the raw annotations
        hints = getattr(fn, "__annotations__", {})
    description, docs = _docstring_parts(inspect.getdoc(fn) or "")
    properties: dict[str, Any] = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        schema = _type_schema(hints.get(p.name, Any))
        if docs.get(p.name):
            schema["description"] = docs[p.name]
        if p.default is p.empty:
            required.append(p.name)
        properties[p.name] = schema
    parameters = {"type": "object", "properties": properties, "required": required}
    return {
        "type": "function",
        "function": {"name": fn.__name__, "description": description, "parameters": parameters},
    }


def _mismatch(value: Any, schema: dict[str, Any], where: str) -> str | None:
    """Why `value` does not fit `schema` (None: it fits)."""
    if value is None:
        return None if schema.get("nullable") or not schema else f"{where} must not be null"
    if "anyOf" in schema and all(_mismatch(value, s, where) for s in schema["anyOf"]):
        return f"{where}: {_show(value)} fits none of the allowed types"
    if "enum" in schema and value not in schema["enum"]:
        return f"{where} must be one of {schema['enum']}, not {_show(value)}"
    kind = schema.get("type")
    ok = {
        "integer": isinstance(value, int) and not isinstance(value, bool),
        "number": isinstance(value, int | float) and not isinstance(value, bool),
        "string": isinstance(value, str),
        "boolean": isinstance(value, bool),
        "array": isinstance(value, list),
        "object": isinstance(value, dict),
    }.get(kind, True)
    if not ok:
        return f"{where} must be {'an' if kind in ('integer', 'array', 'object') else 'a'} {kind}"
    if kind == "array" and "items" in schema:
        return next(
            (
                m
                for i, v in enumerate(value)
                if (m := _mismatch(v, schema["items"], f"{where}[{i}]"))
            ),
            None,
        )
    return None


class FunctionTools:
    """Python functions offered to the model as tools (see the module docstring).

    `functions`: callables or references ('package.module:fn', 'path/to/file.py:fn').
    """

    def __init__(
        self,
        functions: Sequence[str | Callable[..., Any]],
        timeout_s: float = 30.0,
        max_output_chars: int = 1000,
        field: str = "env.tools",
    ) -> None:
        from saorl.envs.custom import load_reference

        self.timeout_s = timeout_s
        self.max_output_chars = max_output_chars
        self.functions: dict[str, Callable[..., Any]] = {}
        self.schemas: list[dict[str, Any]] = []
        for ref in functions:
            fn = load_reference(ref, field) if isinstance(ref, str) else ref
            name = getattr(fn, "__name__", None)
            if not callable(fn) or not isinstance(name, str) or not name.isidentifier():
                raise ConfigError(f"{field} {ref!r}: not a named function")
            if name in self.functions:
                raise ConfigError(f"{field} {ref!r}: a second tool named {name!r}")
            self.functions[name] = fn
            self.schemas.append(function_schema(fn))

    @property
    def names(self) -> list[str]:
        return list(self.functions)

    def __contains__(self, name: object) -> bool:
        return name in self.functions

    def check(self, call: ToolCall) -> str | None:
        """Why `call` cannot be made (None: it can)."""
        if call.name not in self.functions:
            return f"unknown tool {call.name!r}; the tools are: {', '.join(self.functions)}"
        params = self.schemas[self.names.index(call.name)]["function"]["parameters"]
        missing = [p for p in params["required"] if p not in call.arguments]
        if missing:
            return f"{call.name}: missing argument(s) {', '.join(missing)}"
        if not inspect.getfullargspec(self.functions[call.name]).varkw:
            extra = [a for a in call.arguments if a not in params["properties"]]
            if extra:
                return f"{call.name}: unexpected argument(s) {', '.join(extra)}"
        for arg, value in call.arguments.items():
            problem = _mismatch(value, params["properties"].get(arg, {}), f"{call.name}: {arg}")
            if problem:
                return problem
        return None

    async def call(self, call: ToolCall) -> tuple[str, str]:
        """`(text, status)`: the result as text, status `ok`, or an `error: ...` text with
        status `unknown_tool`, `bad_arguments`, `error` (it raised) or `timeout`; the text cut
        to `max_output_chars` either way (an error to at least 300 characters)."""
        text, status = await self._call(call)
        # An error keeps enough of itself to say what was wrong, however small the cap.
        cap = self.max_output_chars if status == "ok" else max(self.max_output_chars, 300)
        if len(text) > cap:
            text = f"{text[:cap]}\n... ({len(text) - cap} more characters)"
        return text, status

    async def _call(self, call: ToolCall) -> tuple[str, str]:
        try:
            problem = self.check(call)
        except RecursionError:  # arguments nested past what Python can walk
            return f"error: {_show(call.name)}: arguments nested too deeply", "bad_arguments"
        except Exception as e:  # arguments of a shape no schema check expects (not a dict)
            why = f"{type(e).__name__}: {_text(e)}"
            return (
                f"error: {_show(call.name)}: arguments cannot be checked ({why})",
                "bad_arguments",
            )
        if problem:
            status = "unknown_tool" if call.name not in self.functions else "bad_arguments"
            return f"error: {problem}", status
        fn = self.functions[call.name]
        try:
            if inspect.iscoroutinefunction(fn):
                result = await asyncio.wait_for(fn(**call.arguments), self.timeout_s)
            else:
                # A sync function that overruns keeps its thread busy until it returns (threads
                # cannot be killed); the episode goes on regardless.
                run = asyncio.to_thread(fn, **call.arguments)
                result = await asyncio.wait_for(run, self.timeout_s)
        except TimeoutError:
            return f"error: {call.name} timed out after {self.timeout_s:g} s", "timeout"
        except Exception as e:  # the tool's failure is an observation, not a crash
            return f"error: {call.name} raised {type(e).__name__}: {_text(e)}", "error"
        return _text(result), "ok"


def _text(value: Any) -> str:
    """`str(value)`; what cannot be made text (nested too deeply, a raising __str__) named."""
    try:
        return str(value)
    except Exception as e:  # RecursionError included
        return f"<{type(value).__name__} that cannot be shown: {type(e).__name__}>"
