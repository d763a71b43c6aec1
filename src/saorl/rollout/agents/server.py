"""The training endpoint: an OpenAI-compatible HTTP API served by a rollout worker, backed by its
own engine, so agent programs' calls are batched with everything else the engine decodes.

    GET  /v1/models                      the served model names and the context length
    POST /v1/chat/completions            one model turn of an episode (`wire.py` lists
                                         the honoured fields)
    POST /inference/v1/generate          one model turn as token ids in, token ids and their
                                         log-probs out (vLLM's token route; verifiers'
                                         training client renders its prompts and calls it)

Every route also lives under `/episodes/<key>/...`. A call names its episode by that path
prefix, an `X-Episode-Id` or `X-Session-ID` header, or its API key (`Authorization: Bearer
<key>`), in that order; an unknown one is answered 404 (path, header) or 401 (key).

HTTP is served by uvicorn (`saorl.rollout.agents.asgi`: an ASGI app on an event loop in a
thread of its own; keep-alive, chunked streamed replies, flow control). A request is a coroutine
on that loop: it turns the messages into prompt ids (`AgentSession.prompt_ids`), hands the
request to the worker thread (`submit`, thread-safe) and awaits the future the worker resolves
when the engine finishes the turn, holding no thread meanwhile; it records the turn
(`AgentSession.record`) before replying, so an agent that has its answer has it recorded. A
token call is recorded as it came: its prompt ids as sent (extending the episode's trajectory
when they start with its tokens), the sampled ids as sampled.

In-process clients (the `openai.AsyncOpenAI` a Python agent gets) skip the socket:
`LocalTransport` hands their requests to the same code on the agent's own event loop and awaits
the engine's future there, so a call costs no HTTP parsing and no hop to the server's thread
(each hop is a thread wake-up, slow on a loaded machine). What is served is the same either way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from saorl.engines.protocol import Completion
from saorl.rollout.agents.asgi import EndpointApp, HttpServer
from saorl.rollout.agents.records import AgentSession
from saorl.rollout.agents.wire import (
    Answer,
    ApiError,
    ChatRequest,
    GenerateRequest,
    Reply,
    body_limit,
    check_body_size,
    check_chat,
    check_generate,
    generate_body,
    parse_json,
    parse_tool_calls,
    served_models,
    tool_call_dicts,
)
from saorl.rollout.episode import ChatCodec

# (prompt ids, max new tokens or None, stop strings) -> the engine's completion, later
Submit = Callable[[list[int], int | None, list[str]], concurrent.futures.Future]
_ROUTE = re.compile(
    r"^(?:/episodes/(?P<key>[^/]+))?/"
    r"(?P<what>v1/models|v1/chat/completions|inference/v1/generate)/?$"
)


class TrainingEndpoint:
    """Serves the OpenAI API for the live episodes of one worker (see the module docstring)."""

    def __init__(
        self,
        submit: Submit,
        tokenizer: Any,
        context_len: int,
        *,
        host: str = "127.0.0.1",
        port: int = 0,
        models: tuple[str, ...] = ("policy",),
        tool_format: str = "hermes",
        call_timeout_s: float = 600.0,
    ) -> None:
        self.submit = submit
        self.tokenizer = tokenizer
        self.context_len = context_len
        self.body_limit = body_limit(context_len)  # bytes of a request body (wire.py)
        self.codec = ChatCodec(tokenizer)
        self.models = models
        self.tool_format = tool_format
        self.call_timeout_s = call_timeout_s
        self.sessions: dict[str, AgentSession] = {}
        self._lock = threading.Lock()
        self._local: Any = None
        self.http = HttpServer(EndpointApp(self), host, port)

    @property
    def root(self) -> str:
        host, port = self.http.address
        return f"http://{host}:{port}"

    def open(self, task: Any, group_id: int = -1) -> AgentSession:
        """A new episode: its key is its API key and its path prefix."""
        session = AgentSession(f"ep-{secrets.token_hex(12)}", task, group_id, self.codec)
        with self._lock:
            self.sessions[session.key] = session
        return session

    def local_client(self) -> Any:
        """The `httpx.AsyncClient` of in-process agents (`LocalTransport`), one per endpoint."""
        if self._local is None:
            self._local = _httpx().AsyncClient(transport=LocalTransport(self), trust_env=False)
        return self._local

    def base_url(self, session: AgentSession) -> str:
        return f"{self.root}/episodes/{session.key}/v1"

    def close_session(self, session: AgentSession) -> None:
        with self._lock:
            self.sessions.pop(session.key, None)
        with session.lock:
            session.closed = True

    def shutdown(self) -> None:
        self.http.shutdown()

    # -- requests ------------------------------------------------------------------------------
    def session_for(self, path_key: str | None, headers: Any) -> AgentSession:
        named = path_key or headers.get("X-Episode-Id") or headers.get("X-Session-ID")
        with self._lock:
            if named:
                if named not in self.sessions:
                    raise ApiError(
                        404,
                        f"episode {named!r} is not live on this endpoint "
                        "(it ended, or never started)",
                        code="episode_not_found",
                    )
                return self.sessions[named]
            auth = headers.get("Authorization", "")
            key = auth.removeprefix("Bearer ").strip() if auth.startswith("Bearer ") else ""
            if key in self.sessions:
                return self.sessions[key]
        raise ApiError(
            401,
            "no live episode named: use the episode's base URL, its API key, or "
            "an X-Episode-Id header",
            kind="authentication_error",
            code="invalid_api_key",
        )

    def begin(self, method: str, path: str, headers: Any, raw: bytes) -> dict[str, Any] | Call:
        """A request's answer (`GET /v1/models`) or its call, submitted to the engine; raises
        ApiError for a request the endpoint refuses."""
        match = _ROUTE.match(path.split("?", 1)[0])
        if match is None:
            raise ApiError(404, f"no route {path!r}", code="not_found")
        key = match.group("key")
        what = match.group("what")
        if what == "v1/models":
            if method != "GET":
                raise ApiError(405, "use GET for the model list")
            if key is not None:
                self.session_for(key, headers)
            return served_models(self.models, self.context_len)
        if method != "POST":
            raise ApiError(405, f"use POST for /{what}")
        check_body_size(len(raw), self.body_limit)  # an in-process client's body too
        session = self.session_for(key, headers)
        if what == "inference/v1/generate":
            token_req = check_generate(parse_json(raw), self.models, len(self.tokenizer))
            # The engine stops at the model's EOS itself; other stop ids (a chat template's
            # end-of-turn token) are matched as their text, which the engine checks as it samples.
            eos = self.tokenizer.eos_token_id
            texts = [self.tokenizer.decode([t]) for t in token_req.stop_token_ids if t != eos]
            ids = token_req.token_ids
            stop = [*token_req.stop, *filter(None, texts)]
            return self._call(token_req, session, ids, session.extends(ids), stop)
        req = check_chat(parse_json(raw), self.models)
        prompt, extends = session.prompt_ids(req.messages, req.tools)
        return self._call(req, session, prompt, extends, req.stop)

    def _call(
        self,
        req: ChatRequest | GenerateRequest,
        session: AgentSession,
        prompt: list[int],
        extends: bool,
        stop: list[str],
    ) -> Call:
        if len(prompt) >= self.context_len:
            raise ApiError(
                400,
                # OpenAI's wording, which clients (litellm) recognise as a context overflow
                f"This model's maximum context length is {self.context_len} tokens; the prompt "
                f"is {len(prompt)} tokens",
                code="context_length_exceeded",
            )
        return Call(req, session, prompt, extends, self.submit(prompt, req.max_tokens, stop))

    def finish(self, call: Call, c: Completion) -> Reply | dict[str, Any]:
        """Record the engine's turn for `call` and build its reply (a token call's: its body)."""
        req = call.req
        prompt = call.prompt
        if c.finish_reason == "aborted":
            raise ApiError(
                503, "the engine aborted the call (the run is stopping)", kind="server_error"
            )
        if isinstance(req, GenerateRequest):
            text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
            call.session.record(
                [],
                None,
                prompt,
                call.extends,
                c.token_ids,
                c.logprobs,
                c.versions,
                c.finish_reason,
                {"role": "assistant", "content": text},
            )
            return generate_body(c.token_ids, c.logprobs, c.finish_reason, len(prompt))
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        for s in req.stop:  # the API leaves out the stop string that ended the turn
            if c.finish_reason == "stop" and text.endswith(s):
                text = text[: -len(s)]
                break
        content, calls = (text, []) if not req.tools else parse_tool_calls(text, self.tool_format)
        finish = {"length": "length"}.get(c.finish_reason, "tool_calls" if calls else "stop")
        call_ids = [f"call_{uuid.uuid4().hex[:24]}" for _ in calls]
        logprobs = None
        if req.logprobs:
            logprobs = []
            for t, lp in zip(c.token_ids, c.logprobs, strict=True):
                tok = self.tokenizer.decode([t])
                logprobs.append(
                    {"token": tok, "logprob": lp, "bytes": list(tok.encode()), "top_logprobs": []}
                )
        reply = Reply(
            req.model,
            content if content or not calls else None,
            tool_call_dicts(calls, call_ids),
            finish,
            len(prompt),
            len(c.token_ids),
            logprobs,
        )
        call.session.record(
            req.messages,
            req.tools,
            prompt,
            call.extends,
            c.token_ids,
            c.logprobs,
            c.versions,
            c.finish_reason,
            reply.message(),
        )
        return reply

    async def serve_async(self, method: str, path: str, headers: Any, raw: bytes) -> Answer:
        """One request, start to end, on the caller's event loop (the HTTP server's, or an
        in-process agent's): the engine's answer is awaited, no thread blocks on it."""
        try:
            call = self.begin(method, path, headers, raw)
            if not isinstance(call, Call):
                return Answer(200, call)
            try:
                c = await asyncio.wait_for(asyncio.wrap_future(call.future), self.call_timeout_s)
            except (asyncio.CancelledError, TimeoutError):
                if asyncio.current_task().cancelling():  # type: ignore[union-attr]
                    raise  # the caller was: its episode timed out, or the HTTP server stops
                raise _CANCELLED from None
            return Answer.of(call.req, self.finish(call, c))
        except ApiError as e:
            return Answer(e.status, e.body())
        except Exception as e:  # a bug here must not take the worker down: the agent sees it
            return Answer(500, _internal(e))


@dataclass
class Call:
    """A chat or token call submitted to the engine, between `begin` and `finish`."""

    req: ChatRequest | GenerateRequest
    session: AgentSession
    prompt: list[int]
    extends: bool
    future: concurrent.futures.Future


_CANCELLED = ApiError(
    503, "the call was cancelled (the episode or the run ended)", kind="server_error"
)


def _internal(e: Exception) -> dict[str, Any]:
    return ApiError(500, f"{type(e).__name__}: {e}", kind="server_error").body()


def _httpx() -> Any:
    """The HTTP library of the installed openai SDK, whose client the in-process agents get:
    httpx2 from openai 3 on (the `agents` extra), httpx before (the verifiers venv's openai<3).
    """
    try:
        import httpx2

        return httpx2
    except ImportError:
        import httpx

        return httpx


class LocalTransport:
    """An httpx transport (duck-typed: httpx is imported only when one is built) that serves
    requests in-process through `endpoint.serve_async`, on the client's own event loop (see
    the module docstring). The URL's path routes the request as over HTTP; host and port are
    not used."""

    def __init__(self, endpoint: TrainingEndpoint) -> None:
        self.endpoint = endpoint
        self._httpx = _httpx()

    async def handle_async_request(self, request: Any) -> Any:
        raw = await request.aread()
        path = request.url.raw_path.decode()
        answer = await self.endpoint.serve_async(request.method, path, request.headers, raw)
        if answer.events is not None:
            headers = {"Content-Type": "text/event-stream"}
            content = b"".join(answer.events)
        else:
            headers = {"Content-Type": "application/json"}
            content = json.dumps(answer.body)
        return self._httpx.Response(
            answer.status, headers=headers, content=content, request=request
        )

    async def aclose(self) -> None:
        pass
