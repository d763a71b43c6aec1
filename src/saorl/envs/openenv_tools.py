"""The pure logic of OpenEnv environments (`env.name = "openenv"`): no openenv-core needed.

An OpenEnv server publishes its action type as a JSON schema (`GET /schema`, key `action`: a
pydantic model's `model_json_schema()`). `action_tool` turns it into one tool schema for the
chat template; `action_from_call` turns the model's call of that tool into the action payload
the server validates; `read_reply` reads a server message (`{"type": "observation", "data":
{"observation": {...}, "reward": ..., "done": ...}}` or `{"type": "error", "data": {...}}`);
`observation_text` is what the model reads back.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from saorl.toolcalls import ToolCall, ToolCallError, ToolFormat

# Every OpenEnv action has it (the base class's free-form dict); not for the model to fill.
HIDDEN_FIELDS = ("metadata",)
DEFAULT_DESCRIPTION = "Take one action in the environment; its observation comes back."
_CALL_SYNTAX = {
    "hermes": '<tool_call>{{"name": "{name}", "arguments": {{...}}}}</tool_call>',
    "llama3": 'a reply that is only {{"name": "{name}", "parameters": {{...}}}}',
}
INSTRUCTIONS = (
    "You act in an environment by calling the tool `{name}` with {call}; each call's "
    "observation comes back to you. A reply without a call ends the episode.\n\n"
)


def tool_name(schema: dict[str, Any]) -> str:
    """The tool's name from the action model's title: `GuessAction` -> `guess`."""
    title = str(schema.get("title") or "")
    title = re.sub(r"Action$", "", title) or title
    snake = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", title).lower()
    snake = re.sub(r"[^a-z0-9_]+", "_", snake).strip("_")
    return snake if snake and not snake[0].isdigit() else "act"


def _untitled(schema: Any) -> Any:
    """`schema` without pydantic's `title` keys (noise in the prompt), recursively; a property
    that happens to be named `title` stays."""
    if isinstance(schema, list):
        return [_untitled(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out: dict[str, Any] = {}
    for key, value in schema.items():
        if key == "title" and isinstance(value, str):
            continue
        if key in ("properties", "$defs", "definitions") and isinstance(value, dict):
            out[key] = {k: _untitled(v) for k, v in value.items()}
        else:
            out[key] = _untitled(value)
    return out


def action_tool(schema: dict[str, Any], name: str = "") -> dict[str, Any]:
    """The tool schema (`{"type": "function", "function": {...}}`, as `apply_chat_template(...,
    tools=)` takes it) of an OpenEnv action schema; `name` overrides the derived name."""
    params = _untitled(schema)
    description = params.pop("description", "") or DEFAULT_DESCRIPTION
    props = {k: v for k, v in params.get("properties", {}).items() if k not in HIDDEN_FIELDS}
    required = [r for r in params.get("required", []) if r not in HIDDEN_FIELDS]
    params = {**params, "type": "object", "properties": props, "required": required}
    params.pop("additionalProperties", None)  # the server says so if the model adds fields
    return {
        "type": "function",
        "function": {
            "name": name or tool_name(schema),
            "description": " ".join(str(description).split()),
            "parameters": params,
        },
    }


def instructions(fmt: ToolFormat, name: str) -> str:
    """How to act, put before the first observation (`hermes` or `llama3` call syntax)."""
    return INSTRUCTIONS.format(name=name, call=_CALL_SYNTAX[fmt].format(name=name))


def action_from_call(call: ToolCall | ToolCallError, name: str) -> dict[str, Any] | str:
    """The action payload of a parsed call of tool `name`, or why there is none (the text of
    an `error:` observation)."""
    if isinstance(call, ToolCallError):
        return call.message
    if call.name != name:
        return f"unknown tool {call.name!r}; the tool is {name!r}"
    hidden = [k for k in call.arguments if k in HIDDEN_FIELDS]
    if hidden:
        return f"{name}: {', '.join(hidden)} is not an argument"
    return dict(call.arguments)


@dataclass
class Reply:
    """A server message read: an observation (`error` empty) or an error."""

    observation: dict[str, Any] = field(default_factory=dict)
    reward: float = 0.0
    done: bool = False
    error: str = ""  # the text for the model; empty: an observation
    code: str = ""  # the server's error code (VALIDATION_ERROR, EXECUTION_ERROR, ...)
    max_sessions: int = 0  # CAPACITY_REACHED: the sessions the server holds at once (0: unsaid)


def _validation_text(errors: Any) -> str:
    parts = []
    for e in errors if isinstance(errors, list) else []:
        if not isinstance(e, dict):
            continue
        loc = ".".join(str(x) for x in e.get("loc", ()) if x != "body")
        parts.append(f"{loc}: {e.get('msg', '')}" if loc else str(e.get("msg", "")))
    return "; ".join(parts)


def read_reply(message: Any) -> Reply:
    """A server message as a `Reply`; a message of any other shape is an error with code
    `BAD_REPLY`."""
    if not isinstance(message, dict) or not isinstance(message.get("data"), dict):
        return Reply(error=f"the server sent {str(message)[:200]!r}", code="BAD_REPLY")
    data = message["data"]
    if message.get("type") == "error":
        code = str(data.get("code", ""))
        detail = _validation_text(data.get("errors"))
        text = str(data.get("message", "")) if not detail else f"invalid action: {detail}"
        most = data.get("max_sessions")
        most = most if isinstance(most, int) and not isinstance(most, bool) and most > 0 else 0
        return Reply(error=text or code or "unknown error", code=code, max_sessions=most)
    observation = data.get("observation")
    reward = data.get("reward")
    if message.get("type") != "observation" or not isinstance(observation, dict):
        return Reply(error=f"the server sent {str(message)[:200]!r}", code="BAD_REPLY")
    if isinstance(reward, bool) or not isinstance(reward, int | float) or reward != reward:
        reward = 0.0  # None (no reward yet), or nothing a number can be made of
    return Reply(observation, float(reward), bool(data.get("done", False)))


def observation_text(observation: dict[str, Any], max_chars: int = 4000) -> str:
    """What the model reads: the one field's value as text, else the fields as JSON."""
    if len(observation) == 1:
        (value,) = observation.values()
        text = value if isinstance(value, str) else json.dumps(value, default=str)
    else:
        text = json.dumps(observation, default=str)
    if len(text) > max_chars:
        text = f"{text[:max_chars]}\n... ({len(text) - max_chars} more characters)"
    return text
