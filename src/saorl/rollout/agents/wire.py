"""The wire formats of the training endpoint (`saorl.rollout.agents.server`): OpenAI chat
completions (checking a request, parsing the model's tool calls back into `tool_calls`, the
response bodies, whole or as server-sent-event chunks) and vLLM's token-in, token-out
`/inference/v1/generate` (`check_generate`, `generate_body`).

Honoured request fields: `model` (must be a served name), `messages`, `tools`, `stream`,
`stream_options.include_usage`, `max_tokens` / `max_completion_tokens` (capped by
`rollout.max_new_tokens` and the context), `stop`, `logprobs` (`top_logprobs` gives empty
lists: the engine records only the sampled token's log-prob), `n` (1 only). Sampling fields
(`temperature`, `top_p`, `seed`, penalties, `tool_choice`, `response_format`, ...) are accepted
and ignored: the sampler is the training policy's (`rollout.temperature`, `rollout.top_p`).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from saorl.toolcalls import ToolCall, ToolCallError, call_from_payload, loads_lenient


class ApiError(Exception):
    """A request the endpoint refuses: answered with `status` and an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        kind: str = "invalid_request_error",
        code: str | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.kind = kind
        self.code = code

    def body(self) -> dict[str, Any]:
        return {
            "error": {"message": self.message, "type": self.kind, "code": self.code, "param": None}
        }


@dataclass
class ChatRequest:
    """The honoured fields of one chat-completions request."""

    model: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    stream: bool
    include_usage: bool
    max_tokens: int | None
    stop: list[str] = field(default_factory=list)
    logprobs: bool = False


# A request body over `body_limit(context_len)` bytes is refused (413) before it is read, parsed
# or tokenized: a conversation that fits the model's context is far smaller (a token is a few
# bytes of text, at most ~6 per character when JSON-escaped), and tokenizing megabytes costs
# seconds of the worker's CPU. 64 bytes per token of context, at least 1 MiB.
MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_TOKEN = 64


def body_limit(context_len: int) -> int:
    """The largest request body (bytes) the endpoint reads for a model of `context_len`."""
    return max(MIN_BODY_BYTES, BODY_BYTES_PER_TOKEN * context_len)


def check_body_size(size: int, limit: int) -> None:
    """ApiError 413 when a request body of `size` bytes is over `limit`."""
    if size > limit:
        raise ApiError(
            413,
            f"the request body is {size} bytes, over this endpoint's limit of {limit} bytes "
            f"({BODY_BYTES_PER_TOKEN} bytes per token of the model's context, at least "
            f"{MIN_BODY_BYTES >> 20} MiB): a conversation that long cannot fit the context",
            code="request_too_large",
        )


def parse_json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as e:  # UnicodeDecodeError is a ValueError
        raise ApiError(400, f"the request body is not valid JSON: {e}") from None


def check_chat(body: Any, served: tuple[str, ...]) -> ChatRequest:
    """The request in `body`, or an ApiError naming what is wrong with it."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model not in served:
        raise ApiError(
            404,
            f"model {model!r} is not served here; use one of {list(served)} "
            "(also in $OPENAI_MODEL for command agents)",
            code="model_not_found",
        )
    n = body.get("n", 1)
    if n not in (1, None):
        raise ApiError(
            400,
            f"n = {n!r}: the training endpoint samples one choice per request "
            "(each is one step of the episode); send separate requests",
        )
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError(400, "messages must be a non-empty list")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(400, f"messages[{i}] must be an object with a string 'role'")
    tools = body.get("tools") or None
    if tools is not None and (
        not isinstance(tools, list) or not all(isinstance(t, dict) for t in tools)
    ):
        raise ApiError(400, "tools must be a list of objects")
    limit = body.get("max_completion_tokens", body.get("max_tokens"))
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ApiError(400, f"max_tokens must be a positive integer, got {limit!r}")
    stop = body.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a string or a list of non-empty strings")
    options = body.get("stream_options") or {}
    return ChatRequest(
        model=model,
        messages=messages,
        tools=tools,
        stream=bool(body.get("stream", False)),
        include_usage=bool(isinstance(options, dict) and options.get("include_usage")),
        max_tokens=limit,
        stop=stop,
        logprobs=bool(body.get("logprobs", False)),
    )


def parse_tool_calls(text: str, fmt: str) -> tuple[str, list[ToolCall]]:
    """`(content, calls)` of one model turn: the well-formed calls in `fmt` ('hermes' or
    'llama3') taken out of the text. A malformed call stays in the content, where the agent
    sees what the model wrote."""
    if fmt == "llama3":
        body = text.strip().removeprefix("<|python_tag|>").strip()
        if not body.startswith("{"):
            return text, []
        decoder = json.JSONDecoder()
        calls = []
        pos = 0
        while pos < len(body):
            try:
                payload, pos = decoder.raw_decode(body, pos)
            except (ValueError, RecursionError):
                return text, []
            key = (
                "parameters"
                if isinstance(payload, dict) and "parameters" in payload
                else "arguments"
            )
            call = call_from_payload(payload, key)
            if isinstance(call, ToolCallError):
                return text, []
            calls.append(call)
            while pos < len(body) and body[pos] in " \t\r\n;":
                pos += 1
        return "", calls
    calls = []
    kept = []
    last = 0
    for match in re.finditer(r"<tool_call>(.*?)</tool_call>", text, flags=re.S):
        call = call_from_payload(loads_lenient(match.group(1).strip()), "arguments")
        if isinstance(call, ToolCall):
            calls.append(call)
            kept.append(text[last : match.start()])
            last = match.end()
    kept.append(text[last:])
    return ("".join(kept).strip() if calls else text), calls


def tool_call_dicts(calls: list[ToolCall], call_ids: list[str]) -> list[dict[str, Any]]:
    return [
        {
            "id": i,
            "type": "function",
            "function": {"name": c.name, "arguments": json.dumps(c.arguments)},
        }
        for c, i in zip(calls, call_ids, strict=True)
    ]


@dataclass
class Reply:
    """One finished call, ready to be written either way."""

    model: str
    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_tokens: int
    completion_tokens: int
    logprobs: list[dict[str, Any]] | None  # OpenAI `logprobs.content`, when asked for
    id: str = field(default_factory=lambda: f"chatcmpl-{uuid.uuid4().hex[:24]}")
    created: int = field(default_factory=lambda: int(time.time()))

    def message(self) -> dict[str, Any]:
        msg: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            msg["tool_calls"] = self.tool_calls
        return msg

    def usage(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
        }

    def body(self) -> dict[str, Any]:
        choice = {
            "index": 0,
            "message": self.message(),
            "finish_reason": self.finish_reason,
            "logprobs": {"content": self.logprobs} if self.logprobs is not None else None,
        }
        return {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": [choice],
            "usage": self.usage(),
        }

    def chunks(self, include_usage: bool) -> list[dict[str, Any]]:
        """The reply as `chat.completion.chunk`s: the role, the content, each tool call, the
        finish reason (and the usage when asked). The engine hands back whole turns, so they
        are written together once the turn is done."""
        head = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }

        def chunk(delta: dict[str, Any], finish: str | None = None, **extra: Any) -> dict:
            return {
                **head,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish, **extra}],
            }

        lp = {"logprobs": {"content": self.logprobs}} if self.logprobs is not None else {}
        out = [chunk({"role": "assistant", "content": ""})]
        if self.content:
            out.append(chunk({"content": self.content}, **lp))
        elif lp:
            out.append(chunk({}, **lp))
        for i, call in enumerate(self.tool_calls):
            out.append(chunk({"tool_calls": [{"index": i, **call}]}))
        out.append(chunk({}, self.finish_reason))
        if include_usage:
            out.append({**head, "choices": [], "usage": self.usage()})
        return out


def served_models(names: tuple[str, ...], context_len: int) -> dict[str, Any]:
    """`GET /v1/models`."""
    data = [
        {
            "id": n,
            "object": "model",
            "created": 0,
            "owned_by": "saorl",
            "context_length": context_len,
            "max_model_len": context_len,
        }
        for n in names
    ]
    return {"object": "list", "data": data}


@dataclass
class GenerateRequest:
    """The honoured fields of one `POST /inference/v1/generate`: vLLM's token route, as
    clients that render prompts themselves (verifiers' training client) call it. Of
    `sampling_params`, `max_tokens`, `stop` and `stop_token_ids` are honoured; `n` must be 1;
    log-probs of the sampled tokens always come back; the sampling fields are the training
    policy's, as for chat."""

    model: str
    token_ids: list[int]
    max_tokens: int | None
    stop: list[str]
    stop_token_ids: list[int]


def _int_list(value: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(t, int) and not isinstance(t, bool) for t in value
    )


def check_generate(body: Any, served: tuple[str, ...], vocab_size: int) -> GenerateRequest:
    """The token request in `body`, or an ApiError naming what is wrong with it."""
    if not isinstance(body, dict):
        raise ApiError(400, "the request body must be a JSON object")
    model = body.get("model")
    if model not in served:
        raise ApiError(
            404,
            f"model {model!r} is not served here; use one of {list(served)}",
            code="model_not_found",
        )
    ids = body.get("token_ids")
    if not _int_list(ids) or not ids:
        raise ApiError(400, "token_ids must be a non-empty list of integers")
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(
            400, f"token_ids: {bad[:5]} are outside the vocabulary (0..{vocab_size - 1})"
        )
    if body.get("content_parts") or body.get("features"):
        raise ApiError(400, "multimodal inputs (content_parts, features) are not served here")
    params = body.get("sampling_params") or {}
    if not isinstance(params, dict):
        raise ApiError(400, "sampling_params must be an object")
    if params.get("n", 1) not in (1, None):
        raise ApiError(400, f"sampling_params.n = {params['n']!r}: one sample per request")
    limit = params.get("max_tokens")
    if limit is not None and (not isinstance(limit, int) or isinstance(limit, bool) or limit < 1):
        raise ApiError(400, f"max_tokens must be a positive integer, got {limit!r}")
    stop = params.get("stop") or []
    stop = [stop] if isinstance(stop, str) else stop
    if not isinstance(stop, list) or not all(isinstance(s, str) and s for s in stop):
        raise ApiError(400, "stop must be a string or a list of non-empty strings")
    stop_ids = params.get("stop_token_ids") or []
    if not _int_list(stop_ids):
        raise ApiError(400, "stop_token_ids must be a list of integers")
    return GenerateRequest(model, list(ids), limit, stop, list(stop_ids))


def generate_body(
    ids: list[int], logprobs: list[float], finish_reason: str, prompt_len: int
) -> dict[str, Any]:
    """The reply to `/inference/v1/generate`: the sampled ids, each one's log-prob keyed by
    `token_id:<id>` (vLLM's form for token requests), `stop` or `length`."""
    content = [
        {"token": f"token_id:{t}", "logprob": lp} for t, lp in zip(ids, logprobs, strict=True)
    ]
    choice = {
        "index": 0,
        "token_ids": list(ids),
        "logprobs": {"content": content},
        "finish_reason": "length" if finish_reason == "length" else "stop",
    }
    return {
        "request_id": f"gen-{uuid.uuid4().hex[:24]}",
        "choices": [choice],
        "usage": {
            "prompt_tokens": prompt_len,
            "completion_tokens": len(ids),
            "total_tokens": prompt_len + len(ids),
        },
    }


@dataclass
class Answer:
    """A response: a JSON body, or (`events`) the server-sent events of a streamed reply."""

    status: int
    body: dict[str, Any] | None = None
    events: list[bytes] | None = None

    @classmethod
    def of(cls, req: ChatRequest | GenerateRequest, reply: Reply | dict[str, Any]) -> Answer:
        if isinstance(reply, dict):  # a token call's body
            return cls(200, reply)
        if not req.stream:
            return cls(200, reply.body())
        chunks = [f"data: {json.dumps(c)}\n\n" for c in reply.chunks(req.include_usage)]
        return cls(200, events=[e.encode() for e in [*chunks, "data: [DONE]\n\n"]])
