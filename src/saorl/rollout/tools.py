"""Tool-call formats: how a model turn asks for a tool, and how the call is parsed.

Two formats, chosen by one field:
- `code`: a code block in a tag, e.g. `<python>print(2**100)</python>`; the closing tag is a stop
  string, so the turn ends right after the call (good for small models).
- `hermes`: `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>` JSON, as
  chat models such as Qwen3 are trained to emit; `</tool_call>` is the stop string.

`parse_tool_call` returns a `ToolCall`, `None` (the turn makes no call: it is an answer) or a
`ToolCallError` whose message is shown to the model as an observation: a malformed call is
something the policy did, and it can read the error and try again; it never crashes the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

ToolFormat = Literal["code", "hermes"]


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    message: str


def stop_strings(fmt: ToolFormat, tag: str = "python") -> list[str]:
    """Strings that end a model turn that makes a call."""
    return [f"</{tag}>"] if fmt == "code" else ["</tool_call>"]


def parse_tool_call(
    text: str, fmt: ToolFormat, tag: str = "python"
) -> ToolCall | ToolCallError | None:
    """The tool call at the end of one model turn, if any (only the last one counts)."""
    if fmt == "code":
        opened = text.rfind(f"<{tag}>")
        if opened < 0:
            return None
        body = text[opened + len(tag) + 2 :]
        end = body.find(f"</{tag}>")
        if end < 0:
            return ToolCallError(f"unterminated <{tag}> block: close it with </{tag}>")
        return ToolCall("python", {"code": body[:end].strip("\n")})
    matches = list(re.finditer(r"<tool_call>(.*?)(</tool_call>|$)", text, flags=re.S))
    if not matches:
        return None
    match = matches[-1]
    if not match.group(2):
        return ToolCallError("unterminated <tool_call>: close it with </tool_call>")
    payload = _loads(match.group(1))
    if isinstance(payload, ToolCallError):
        return payload
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCallError('tool call must be {"name": <string>, "arguments": {...}}')
    args = payload.get("arguments", {})
    if isinstance(args, str):  # some models double-encode the arguments
        args = _loads(args)
        if isinstance(args, ToolCallError):
            return ToolCallError("tool call arguments must be a JSON object")
    if not isinstance(args, dict):
        return ToolCallError("tool call arguments must be a JSON object")
    return ToolCall(payload["name"], args)


def _loads(text: str) -> Any:
    """`json.loads`, with every way model text can fail it as a ToolCallError, never a raise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return ToolCallError(f"tool call is not valid JSON: {e.msg} at char {e.pos}")
    except RecursionError:
        return ToolCallError("tool call is not valid JSON: it is nested too deeply")
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return ToolCallError(f"tool call is not valid JSON: {str(e).split(';')[0][:200]}")
