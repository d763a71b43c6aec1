"""Tool-call formats: how a model turn asks for a tool, and how the call is parsed.

Three formats, chosen by one field:
- `code`: a code block in a tag, e.g. `<python>print(2**100)</python>`; the closing tag is a stop
  string, so the turn ends right after the call (good for small models).
- `hermes`: `<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>` JSON, as
  chat models such as Qwen3 and Hermes are trained to emit; `</tool_call>` is the stop string.
- `llama3`: Llama 3.1-3.3's JSON tool calling: the whole turn is one JSON object
  `{"name": "python", "parameters": {"code": "..."}}` (optionally after `<|python_tag|>`; several
  calls separated by `;`), ended by the model's end-of-turn token (`<|eot_id|>`, or `<|eom_id|>`,
  which is a stop string here because only `<|eot_id|>` is the tokenizer's EOS). A turn that
  does not start with `{` is an answer. `"arguments"` is accepted in place of `"parameters"`.

`parse_tool_call` returns a `ToolCall`, `None` (the turn makes no call: it is an answer) or a
`ToolCallError` whose message is shown to the model as an observation: a malformed call is
something the policy did, and it can read the error and try again; it never crashes the run.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

ToolFormat = Literal["code", "hermes", "llama3"]
TOOL_FORMATS: tuple[str, ...] = ("code", "hermes", "llama3")
# Llama 3 ends a turn that waits for a tool result with this token; the worker decodes turns
# without special tokens, so the parser never sees it.
LLAMA3_EOM = "<|eom_id|>"


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolCallError:
    message: str


def stop_strings(fmt: ToolFormat, tag: str = "python") -> list[str]:
    """Strings that end a model turn that makes a call."""
    if fmt == "llama3":
        return [LLAMA3_EOM]
    return [f"</{tag}>"] if fmt == "code" else ["</tool_call>"]


def render_tool_call(name: str, arguments: dict[str, Any], fmt: ToolFormat) -> str:
    """The text of a call in format `fmt` (what `parse_tool_call` reads back); `code` renders
    the `code` (or `command`) argument in a <python> block."""
    if fmt == "code":
        code = arguments.get("code", arguments.get("command", ""))
        return f"<python>{code}</python>"
    if fmt == "llama3":
        return json.dumps({"name": name, "parameters": arguments})
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments})}</tool_call>"


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
    if fmt == "llama3":
        return _parse_llama3(text)
    matches = list(re.finditer(r"<tool_call>(.*?)(</tool_call>|$)", text, flags=re.S))
    if not matches:
        return None
    match = matches[-1]
    if not match.group(2):
        return ToolCallError("unterminated <tool_call>: close it with </tool_call>")
    return call_from_payload(loads_lenient(match.group(1)), "arguments")


def _parse_llama3(text: str) -> ToolCall | ToolCallError | None:
    body = text.strip()
    body = body.removeprefix("<|python_tag|>").strip()
    if not body.startswith("{"):
        return None
    # Several calls are `;`-separated; as in the other formats only the last one counts.
    decoder = json.JSONDecoder()
    payload = None
    pos = 0
    while pos < len(body):
        try:
            payload, end = decoder.raw_decode(body, pos)
        except (json.JSONDecodeError, RecursionError, ValueError):
            # The same message the strict parser gives, for the part that failed.
            return _as_error(loads_lenient(body[pos:]))
        pos = end
        while pos < len(body) and body[pos] in " \t\r\n;":
            pos += 1
        if pos < len(body) and body[pos] != "{":
            return ToolCallError(
                "text after the tool call: a Llama 3 tool call is the whole turn, one JSON "
                'object {"name": ..., "parameters": {...}}'
            )
    key = "parameters" if isinstance(payload, dict) and "parameters" in payload else "arguments"
    return call_from_payload(payload, key)


def _as_error(value: Any) -> ToolCallError:
    return value if isinstance(value, ToolCallError) else ToolCallError("tool call is not JSON")


def call_from_payload(payload: Any, key: str) -> ToolCall | ToolCallError:
    """A tool call from decoded JSON `{"name": ..., key: {...}}` (the arguments under `key`,
    possibly double-encoded), or the error that says what is wrong with it."""
    if isinstance(payload, ToolCallError):
        return payload
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ToolCallError(f'tool call must be {{"name": <string>, "{key}": {{...}}}}')
    args = payload.get(key, {})
    if isinstance(args, str):  # some models double-encode the arguments
        args = loads_lenient(args)
        if isinstance(args, ToolCallError):
            return ToolCallError("tool call arguments must be a JSON object")
    if not isinstance(args, dict):
        return ToolCallError("tool call arguments must be a JSON object")
    return ToolCall(payload["name"], args)


def loads_lenient(text: str) -> Any:
    """`json.loads`, with every way model text can fail it as a ToolCallError, never a raise."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        return ToolCallError(f"tool call is not valid JSON: {e.msg} at char {e.pos}")
    except RecursionError:
        return ToolCallError("tool call is not valid JSON: it is nested too deeply")
    except ValueError as e:  # e.g. an integer of more than 4300 digits
        return ToolCallError(f"tool call is not valid JSON: {str(e).split(';')[0][:200]}")
