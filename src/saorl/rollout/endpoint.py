"""The training endpoint: an OpenAI-compatible HTTP API served by a rollout worker, backed by its
own engine, so agent programs' calls are batched with everything else the engine decodes.

    GET  /v1/models                      the served model names and the context length
    POST /v1/chat/completions            one model turn of an episode (`endpoint_api` lists
                                         the honoured fields)

Every route also lives under `/episodes/<key>/v1/...`. A call names its episode by that path
prefix, an `X-Episode-Id` or `X-Session-ID` header, or its API key (`Authorization: Bearer
<key>`), in that order; an unknown one is answered 404 (path, header) or 401 (key).

The server is the standard library's threaded HTTP server (one thread per connection, HTTP/1.1
keep-alive, streamed replies in chunked transfer encoding). A handler thread turns the messages
into prompt ids (`AgentSession.prompt_ids`), hands the request to the worker thread
(`submit`, thread-safe) and blocks on the future the worker resolves when the engine finishes the
turn; it records the turn (`AgentSession.record`) before replying, so an agent that has its
answer has it recorded.
"""

from __future__ import annotations

import concurrent.futures
import json
import re
import secrets
import threading
import uuid
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from saorl.rollout.agent import ChatCodec
from saorl.rollout.agent_record import AgentSession
from saorl.rollout.endpoint_api import (
    ApiError,
    ChatRequest,
    Reply,
    check_chat,
    parse_json,
    parse_tool_calls,
    served_models,
    tool_call_dicts,
)
from saorl.rollout.engine import Completion

# (prompt ids, max new tokens or None, stop strings) -> the engine's completion, later
Submit = Callable[[list[int], int | None, list[str]], concurrent.futures.Future]
_ROUTE = re.compile(r"^(?:/episodes/(?P<key>[^/]+))?/v1/(?P<what>models|chat/completions)/?$")


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
        self.submit, self.tokenizer, self.context_len = submit, tokenizer, context_len
        self.codec = ChatCodec(tokenizer)
        self.models, self.tool_format, self.call_timeout_s = models, tool_format, call_timeout_s
        self.sessions: dict[str, AgentSession] = {}
        self._lock = threading.Lock()
        self.server = _Server((host, port), _handler_class(self))
        self.server.daemon_threads = True
        self._thread = threading.Thread(
            target=self.server.serve_forever, name="saorl-endpoint", daemon=True
        )
        self._thread.start()

    @property
    def root(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def open(self, task: Any, group_id: int = -1) -> AgentSession:
        """A new episode: its key is its API key and its path prefix."""
        session = AgentSession(f"ep-{secrets.token_hex(12)}", task, group_id, self.codec)
        with self._lock:
            self.sessions[session.key] = session
        return session

    def base_url(self, session: AgentSession) -> str:
        return f"{self.root}/episodes/{session.key}/v1"

    def close_session(self, session: AgentSession) -> None:
        with self._lock:
            self.sessions.pop(session.key, None)
        with session.lock:
            session.closed = True

    def shutdown(self) -> None:
        self.server.shutdown()
        self.server.server_close()

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

    def chat(self, req: ChatRequest, session: AgentSession) -> Reply:
        """Run one call of `session` through the engine and record it."""
        prompt, extends = session.prompt_ids(req.messages, req.tools)
        if len(prompt) >= self.context_len:
            raise ApiError(
                400,
                # OpenAI's wording, which clients (litellm) recognise as a context overflow
                f"This model's maximum context length is {self.context_len} tokens; the prompt "
                f"is {len(prompt)} tokens",
                code="context_length_exceeded",
            )
        future = self.submit(prompt, req.max_tokens, req.stop)
        try:
            c: Completion = future.result(timeout=self.call_timeout_s)
        except (concurrent.futures.CancelledError, concurrent.futures.TimeoutError):
            raise ApiError(
                503, "the call was cancelled (the episode or the run ended)", kind="server_error"
            ) from None
        if c.finish_reason == "aborted":
            raise ApiError(
                503, "the engine aborted the call (the run is stopping)", kind="server_error"
            )
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
        session.record(
            req.messages,
            req.tools,
            prompt,
            extends,
            c.token_ids,
            c.logprobs,
            c.versions,
            c.finish_reason,
            reply.message(),
        )
        return reply


class _Server(ThreadingHTTPServer):
    # Every episode of the worker may connect at once; the default backlog of 5 refuses
    # connections beyond it when many agents start together.
    request_queue_size = 1024


def _handler_class(endpoint: TrainingEndpoint) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive: httpx reuses connections
        # Headers and body go out as separate small writes: with Nagle's algorithm the second
        # waits for the client's delayed ACK (~40 ms a call).
        disable_nagle_algorithm = True

        def _route(self) -> tuple[str | None, str]:
            match = _ROUTE.match(self.path.split("?", 1)[0])
            if match is None:
                raise ApiError(404, f"no route {self.path!r}", code="not_found")
            return match.group("key"), match.group("what")

        def _json(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _sse(self, chunks: list[dict[str, Any]]) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Cache-Control", "no-cache")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for event in [*(f"data: {json.dumps(c)}\n\n" for c in chunks), "data: [DONE]\n\n"]:
                data = event.encode()
                self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")

        def do_GET(self) -> None:
            try:
                key, what = self._route()
                if what != "models":
                    raise ApiError(405, "use POST for chat completions")
                if key is not None:
                    endpoint.session_for(key, self.headers)
                self._json(200, served_models(endpoint.models, endpoint.context_len))
            except ApiError as e:
                self._json(e.status, e.body())

        def do_POST(self) -> None:
            try:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                key, what = self._route()
                if what != "chat/completions":
                    raise ApiError(405, "use GET for the model list")
                session = endpoint.session_for(key, self.headers)
                req = check_chat(parse_json(raw), endpoint.models)
                reply = endpoint.chat(req, session)
            except ApiError as e:
                return self._json(e.status, e.body())
            except Exception as e:  # a bug here must not take the worker down: the agent sees it
                return self._json(
                    500, ApiError(500, f"{type(e).__name__}: {e}", kind="server_error").body()
                )
            if req.stream:
                self._sse(reply.chunks(req.include_usage))
            else:
                self._json(200, reply.body())

        def log_message(self, *args: object) -> None:
            pass

    return Handler
