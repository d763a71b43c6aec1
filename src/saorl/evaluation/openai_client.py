"""Episodes against an OpenAI-compatible chat endpoint (a served model), for `saorl eval`.

A served model speaks text, not token ids, so this path is for evaluation only: the same
environments and grading as training, with the conversation kept as messages. The standard
library's HTTP client is used; nothing extra to install.

The API strips a matched stop string from the returned text; a tool call cut by its stop string
(`<python>...` without `</python>`) gets its closing tag back before the environment sees it.

An environment with tool schemas (`env.tools`, the `tools` attribute of your own env) has them
sent as the request's `tools`. A server that parses calls itself (vLLM with
`--enable-auto-tool-choice --tool-call-parser hermes|llama3_json`) answers with
`message.tool_calls`; the last of them is written back in the environment's own format
(`render_tool_call`) so the environment parses it as it would a trained model's text, and the
conversation carries it the OpenAI way: the assistant message keeps that `tool_calls` entry and
the observations answer it with its `tool_call_id`. A server that does not parse calls returns
them in the text, which reaches the environment unchanged.

A reply that is not a chat completion (not JSON, no `choices`, `content` that is not text, a
`function` that is not an object, ...) fails its episode, not the evaluation: stop reason
`bad_reply`, reward 0, the reason in `info["error"]` (`saorl eval` counts them by reason in its
summary). An endpoint that cannot be reached, or answers with an HTTP error, stops the
evaluation (`RuntimeError`): every other request would fail the same way.
"""

from __future__ import annotations

import asyncio
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Any

from saorl.envs.base import Env, HasToolFormat, task_key, tool_schemas
from saorl.toolcalls import render_tool_call

# A reply larger than this is not a chat completion saorl would use.
MAX_REPLY_BYTES = 64 * 2**20


class MalformedReply(ValueError):
    """An endpoint reply that is not a chat completion (module docstring)."""


@dataclass
class TextEpisode:
    """The outcome of one episode over the endpoint (the fields `summarize` reads)."""

    prompt_key: str
    reward: float
    stop_reason: str
    text: str
    info: dict[str, Any] = field(default_factory=dict)


def _complete(base_url: str, body: dict[str, Any], api_key: str | None, timeout: float) -> dict:
    req = urllib.request.Request(
        base_url.rstrip("/") + "/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {api_key}"} if api_key else {}),
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            raw = resp.read(MAX_REPLY_BYTES + 1)
    except urllib.error.HTTPError as e:
        raise RuntimeError(f"{base_url}: HTTP {e.code}: {e.read()[:300]!r}") from e
    except (urllib.error.URLError, TimeoutError) as e:
        raise RuntimeError(f"{base_url}: cannot reach the endpoint: {e}") from e
    if len(raw) > MAX_REPLY_BYTES:
        raise MalformedReply(f"reply over {MAX_REPLY_BYTES} bytes")
    try:
        data = json.loads(raw)
    except ValueError as e:  # not JSON, not UTF-8
        raise MalformedReply(f"not JSON ({type(e).__name__})") from None
    except RecursionError:
        raise MalformedReply("JSON nested too deeply") from None
    if not isinstance(data, dict):
        raise MalformedReply(f"a JSON {type(data).__name__}, not an object")
    return data


def _kind(value: Any) -> str:
    return "missing" if value is None else f"a {type(value).__name__}"


def _choice(reply: dict[str, Any]) -> tuple[dict[str, Any], str | None]:
    """`(message, finish_reason)` of the reply's first choice, checked to be what the chat
    completions API sends; `MalformedReply` otherwise."""
    choices = reply.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedReply("no choices" if not choices else f"choices is {_kind(choices)}")
    choice = choices[0]
    if not isinstance(choice, dict):
        raise MalformedReply(f"choices[0] is {_kind(choice)}, not an object")
    message = choice.get("message")
    if not isinstance(message, dict):
        raise MalformedReply(f"choices[0].message is {_kind(message)}, not an object")
    content = message.get("content")
    finish = choice.get("finish_reason")
    if content is not None and not isinstance(content, str):
        raise MalformedReply(f"message.content is {_kind(content)}, not text")
    if finish is not None and not isinstance(finish, str):
        raise MalformedReply(f"finish_reason is {_kind(finish)}, not text")
    return message, finish


def chat_episode(
    base_url: str,
    model: str,
    env: Env,
    task: Any,
    *,
    max_turns: int,
    max_tool_calls: int,
    stop: tuple[str, ...] = (),
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_tokens: int = 1024,
    api_key: str | None = None,
    timeout: float = 300.0,
) -> TextEpisode:
    """Run one episode: model turns over HTTP, environment steps in between."""
    loop = asyncio.new_event_loop()
    try:
        messages = list(loop.run_until_complete(env.reset(task)))
        schemas = tool_schemas(env) or []
        turns = 0
        tool_calls = 0
        reward = 0.0
        texts = []
        info = {}
        while True:
            body = {
                "model": model,
                "messages": messages,
                "temperature": temperature,
                "top_p": top_p,
                "max_tokens": max_tokens,
            }
            if stop:
                body["stop"] = list(stop)
            if schemas:
                body["tools"] = schemas
            try:
                message, finish = _choice(_complete(base_url, body, api_key, timeout))
                call = _last_tool_call(message)
            except MalformedReply as e:  # this episode fails; the evaluation goes on
                info["error"] = f"malformed reply: {e}"
                reason = "bad_reply"
                break
            text = message.get("content") or ""
            for s in stop:  # give a call cut by its stop string its closing tag back
                opener = s.replace("</", "<", 1)
                if finish == "stop" and text.rfind(opener) > text.rfind(s):
                    text += s
            assistant: dict[str, Any] = {"role": "assistant", "content": text}
            if call is not None:
                call_id, name, arguments = call
                fmt = env.fmt if isinstance(env, HasToolFormat) else "hermes"
                # A Llama 3 call is the whole turn: text beside it would make it an answer.
                rendered = render_tool_call(name, arguments, fmt)
                text = rendered if fmt == "llama3" else f"{text}{rendered}"
                function = {"name": name, "arguments": _dumps(arguments)}
                assistant["tool_calls"] = [
                    {"id": call_id, "type": "function", "function": function}
                ]
            turns += 1
            texts.append(text)
            if finish == "length":
                reason = "length"
                break
            messages.append(assistant)
            result = loop.run_until_complete(env.step(text))
            reward += result.reward
            info.update(result.info)
            tool_calls += int(bool(result.info.get("tool_call")))
            if result.done:
                reason = "answer"
                break
            if turns >= max_turns:
                reason = "max_turns"
                break
            if tool_calls > max_tool_calls:
                reason = "max_tool_calls"
                break
            answer = {"tool_call_id": call[0]} if call is not None else {}
            messages.extend(
                {**m, **answer} if m.get("role") == "tool" else m for m in result.observations
            )
    finally:
        loop.close()
    info.update({"turns": turns, "tool_calls": tool_calls})
    return TextEpisode(task_key(task), reward, reason, "\n".join(texts), info)


def _last_tool_call(message: dict[str, Any]) -> tuple[str, str, dict[str, Any]] | None:
    """`(id, name, arguments)` of the last of `message.tool_calls`, the arguments decoded from
    the JSON string the API sends; None when there is none. Arguments that are not a JSON
    object are passed on as `{"arguments": <text>}` so the environment's own checks report
    them to the model. `MalformedReply` when the calls are not shaped as the API sends them."""
    calls = message.get("tool_calls") or []
    if not isinstance(calls, list):
        raise MalformedReply(f"message.tool_calls is {_kind(calls)}, not a list")
    if not calls:
        return None
    call = calls[-1]
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict):
        raise MalformedReply(f"tool_calls[-1].function is {_kind(function)}, not an object")
    name = function.get("name")
    call_id = call.get("id")
    if not isinstance(name, str):
        raise MalformedReply(f"tool_calls[-1].function.name is {_kind(name)}, not text")
    call_id = call_id if isinstance(call_id, str) and call_id else f"call_{len(calls) - 1}"
    arguments: Any = function.get("arguments") or {}
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except (ValueError, RecursionError):
            arguments = {"arguments": arguments}
    if not isinstance(arguments, dict):
        arguments = {"arguments": arguments}
    return call_id, name, arguments


def _dumps(arguments: dict[str, Any]) -> str:
    """The arguments as the JSON text the API carries; `{}` for ones nested too deeply to
    write back (the environment still got them)."""
    try:
        return json.dumps(arguments)
    except (ValueError, TypeError, RecursionError):
        return "{}"
