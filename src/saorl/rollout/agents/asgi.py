"""The training endpoint's HTTP layer: an ASGI app (`EndpointApp`) served by uvicorn on an event
loop in a thread of its own (`HttpServer`), as vLLM's and AReaL's OpenAI-compatible servers are.

uvicorn brings the protocol: parsing (h11, or httptools where it is installed) with a 400 for
a request it cannot parse, keep-alive (an idle connection is closed after `KEEP_ALIVE_S`),
chunked replies (the server-sent events of a streamed reply), and flow control both ways (it
stops reading a body the app has not asked for; a reply waits while its client is slow to read).
The app is a plain ASGI callable, no framework: the endpoint routes its three paths itself
(`TrainingEndpoint.begin`), so a framework's router, request objects and middleware would add
dependencies and a layer per call for nothing.

Every request is served on the loop: the declared body size is checked before a byte of the body
is read (413), the body is read under the same limit (a chunked body declares no size), and the
call is submitted and its engine future awaited (`TrainingEndpoint.serve_async`, the path of the
in-process clients too). A call waiting on the engine holds a coroutine and a socket, not a
thread: a thousand agents' connections are served by this one thread, where the standard
library's server had a thread per connection. Turning messages into prompt ids and recording a
turn run on the loop as well (CPU work, for which threads would only take turns at the GIL).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket
import threading
import time
from typing import Any

import uvicorn

from saorl.rollout.agents.wire import Answer, ApiError, check_body_size

# Longer than clients keep an idle connection (httpx 5 s, aiohttp 15 s): the client closes it
# first, so it never sends a request on a connection the server is closing.
KEEP_ALIVE_S = 75
BACKLOG = 2048  # every episode of a worker may connect at once
LINGER_S = 2.0  # the longest a refused body is read and dropped before the connection closes
_STOPPING = ApiError(503, "the endpoint is stopping (the run ended)", kind="server_error")


class Headers(dict):
    """A request's headers by lower-cased name; `get` takes any case, as the standard library's
    and httpx's headers do (`TrainingEndpoint.session_for`)."""

    def get(self, name: str, default: Any = None) -> Any:
        return super().get(name.lower(), default)


class _Gone(Exception):
    """The client disconnected before its request's body came in."""


class EndpointApp:
    """The ASGI app of a `TrainingEndpoint` (see the module docstring)."""

    def __init__(self, endpoint: Any) -> None:
        self.endpoint = endpoint
        self.waiting: set[asyncio.Task] = set()  # requests being served (on the loop only)

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":  # lifespan events are off and websockets refused
            return
        method = scope["method"]
        path = (scope.get("raw_path") or scope["path"].encode()).decode("latin-1")
        headers = Headers(
            (k.decode("latin-1").lower(), v.decode("latin-1")) for k, v in scope["headers"]
        )
        try:
            raw = await self._body(headers, receive) if method == "POST" else b""
        except ApiError as e:
            return await _refuse(e, receive, send)
        except _Gone:
            return
        task = asyncio.current_task()
        self.waiting.add(task)  # type: ignore[arg-type]
        try:
            answer = await self.endpoint.serve_async(method, path, headers, raw)
        except asyncio.CancelledError:  # the server stops (`stop_waiting`)
            answer = Answer(503, _STOPPING.body())
        finally:
            self.waiting.discard(task)  # type: ignore[arg-type]
        await _reply(answer, send)

    def stop_waiting(self) -> None:
        """Answer the calls still waiting on the engine 503 (the server stops)."""
        for task in self.waiting:
            task.cancel()

    async def _body(self, headers: Headers, receive: Any) -> bytes:
        limit = self.endpoint.body_limit
        # The declared size is checked before a byte of the body is read (or parsed, or
        # tokenized); uvicorn has refused a malformed one already.
        try:
            check_body_size(int(headers.get("content-length") or 0), limit)
        except ValueError:
            raise ApiError(400, "bad Content-Length") from None
        chunks = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] != "http.request":
                raise _Gone
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            check_body_size(size, limit)
            more = message.get("more_body", False)
        return b"".join(chunks)


async def _reply(answer: Answer, send: Any) -> None:
    """`answer`: a JSON body, or the server-sent events of a streamed reply
    (chunked: no Content-Length)."""
    if answer.events is None:
        data = json.dumps(answer.body).encode()
        await send(_start(answer.status, b"application/json", len(data)))
        await send({"type": "http.response.body", "body": data})
        return
    await send(_start(answer.status, b"text/event-stream"))
    for event in answer.events:
        await send({"type": "http.response.body", "body": event, "more_body": True})
    await send({"type": "http.response.body", "body": b""})


def _start(status: int, kind: bytes, size: int | None = None, close: bool = False) -> dict:
    headers = [(b"content-type", kind)]
    if size is None:
        headers.append((b"cache-control", b"no-cache"))
    else:
        headers.append((b"content-length", str(size).encode()))
    if close:
        headers.append((b"connection", b"close"))
    return {"type": "http.response.start", "status": status, "headers": headers}


async def _refuse(error: ApiError, receive: Any, send: Any) -> None:
    """Answer `error` and close the connection (its unread body must not be taken for the next
    request). The answer goes out at once; what the client still sends of the body is then read
    and dropped, for at most `LINGER_S`, before the close: closing a socket with unread data
    resets the connection, and the client would see that instead of the answer (a lingering
    close, as web servers do)."""
    data = json.dumps(error.body()).encode()
    await send(_start(error.status, b"application/json", len(data), close=True))
    await send({"type": "http.response.body", "body": data, "more_body": True})
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(LINGER_S):
            while (await receive()).get("more_body"):
                pass
    await send({"type": "http.response.body", "body": b""})


class HttpServer:
    """uvicorn serving `app` on `host:port` (port 0: a free one) from a daemon thread with an
    event loop of its own. uvicorn installs signal handlers only when it runs in the main thread,
    so the process's own (saorl's SIGTERM handling) stay as they are."""

    def __init__(self, app: EndpointApp, host: str, port: int) -> None:
        # Bound and listening before the loop runs: a client may connect at once. The protocol
        # is named because asyncio sets TCP_NODELAY on a connection only when its socket says
        # TCP: with Nagle's algorithm a reply's body, written after its headers, waits for the
        # client's delayed ACK (~40 ms a call).
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, port))
        self.sock.listen(BACKLOG)
        self.address: tuple[str, int] = self.sock.getsockname()[:2]
        config = uvicorn.Config(
            app,
            interface="asgi3",
            lifespan="off",
            ws="none",
            log_config=None,  # the process's logging is left alone
            log_level="warning",
            access_log=False,
            proxy_headers=False,
            server_header=False,
            backlog=BACKLOG,
            timeout_keep_alive=KEEP_ALIVE_S,
            timeout_graceful_shutdown=1,  # for a request that came in as the server stops
        )
        self.app = app
        self.server = uvicorn.Server(config)
        self.loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(),), name="saorl-endpoint", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.sock.close()
                raise RuntimeError(f"the training endpoint did not start on {host}:{port}")
            time.sleep(0.005)

    async def _serve(self) -> None:
        self.loop = asyncio.get_running_loop()
        await self.server.serve(sockets=[self.sock])

    def shutdown(self) -> None:
        """Stop: calls still waiting on the engine are answered 503, idle connections closed."""
        if self.loop is not None and self._thread.is_alive():
            self.loop.call_soon_threadsafe(self.app.stop_waiting)
        self.server.should_exit = True
        self._thread.join(timeout=30)
