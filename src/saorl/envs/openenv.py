"""OpenEnv environment servers as the environment (`env.name = "openenv"`, docs/openenv.md).

    env.openenv.app = "my_env.server:app"      # an OpenEnv app, served in-process on loopback
    env.openenv.url = "http://127.0.0.1:8000"  # or a server that is already running

Each episode is one WebSocket session on the server's `/ws` route (the protocol openenv-core's
`EnvClient` speaks: JSON messages `reset`, `step`, `close`, answered by `observation` or
`error`). The action schema (`GET /schema`) is offered to the model as one tool; the model's
call of it is sent as the action, the observation comes back as the tool result, and the
server's reward (summed over the episode's steps) and `done` end the episode. A reply without a
call ends the episode too. Bad actions (a malformed call, another tool, arguments the server's
action model rejects, an action the environment raised on) are `error: ...` observations the
model reads. An unreachable server, a dropped connection or a reset the server fails fail the
episode (`env_error`, not trained on), the reason counted in `FAILURES` and named on stderr
once per kind; the run goes on.

A server holds at most `max_concurrent_envs` sessions (`create_app`'s argument, 1 by default).
The first `CAPACITY_REACHED` answer says how many (`Sessions`): from then on each rollout
worker starts episodes only while this process has a session free on that server (`room`), an
episode refused while this process's own episodes hold every session goes back to the feed
(`EnvBusy`), and one refused while sessions are free here (held by other clients, or not yet
released by the server) waits and tries again, with growing pauses, for up to
`env.step_timeout_s` before it fails (`capacity_reached`). One line on stderr says why the run
is slow.

An app is served by uvicorn in a daemon thread of each process that runs episodes (each Ray
rollout actor its own), started with the first episode on `127.0.0.1` and a free port. Needs
the `openenv` extra (openenv-core brings uvicorn and websockets).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import re
import socket
import sys
import threading
import time
import urllib.request
from collections import Counter
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from saorl.config import ConfigError, EnvConfig
from saorl.envs.base import EnvBusy, EnvSpec, Message, StepResult
from saorl.envs.openenv_tools import (
    action_from_call,
    action_tool,
    instructions,
    observation_text,
    read_reply,
)
from saorl.toolcalls import ToolCallError, ToolFormat, parse_tool_call, stop_strings

# Error codes the server answers a bad action with; the session goes on after them.
ACTION_ERRORS = ("VALIDATION_ERROR", "EXECUTION_ERROR")
FAILURES: Counter[str] = Counter()  # failed episodes of this process, by reason
_SERVERS: dict[str, str] = {}  # app reference -> base URL of its in-process server
_SCHEMAS: dict[str, dict[str, Any]] = {}  # base URL -> its action schema
_LOCK = threading.Lock()
RETRY_S = (0.05, 2.0)  # the first and the longest pause before a refused session tries again


class OpenEnvFailure(Exception):
    """The episode cannot go on (the server, not the model, failed); `reason` is counted."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(f"{reason}: {message}")
        self.reason = reason
        FAILURES[reason] += 1
        if FAILURES[reason] == 1:  # once per kind: rollout/failed counts every one
            print(f"saorl: an OpenEnv episode failed ({reason}): {message}", file=sys.stderr)


class Sessions:
    """This process's sessions on one server, and how many the server holds (once it said)."""

    def __init__(self) -> None:
        self.open = 0
        self.capacity = 0  # 0: not known yet
        self.lock = threading.Lock()

    def room(self) -> int | None:
        """Sessions free for new episodes of this process; None while the capacity is unknown."""
        with self.lock:
            return max(0, self.capacity - self.open) if self.capacity else None

    def add(self, n: int) -> None:
        with self.lock:
            self.open += n

    def refused(self, reply: Any, where: str) -> bool:
        """Learn the capacity from a `CAPACITY_REACHED` reply (its `max_sessions`, else the
        sessions this process holds); whether this process's own sessions fill the server."""
        found = re.search(r"(\d+)/(\d+) sessions", reply.error)
        most = reply.max_sessions or (int(found.group(2)) if found else 0)
        with self.lock:
            first = not self.capacity
            self.capacity = most or max(1, self.open)
            full = self.open >= self.capacity
            capacity = self.capacity
        if first:
            print(
                f"saorl: the OpenEnv server {where} holds {capacity} session(s) at once "
                f"({reply.error.strip()}); episodes wait for a free one, so the run is slow: "
                "raise max_concurrent_envs in its create_app (the environment class with "
                "SUPPORTS_CONCURRENT_SESSIONS = True) to run more at once",
                file=sys.stderr,
                flush=True,
            )
        return full


_SESSIONS: dict[str, Sessions] = {}  # env.openenv.app or env.openenv.url -> its sessions


def sessions(key: str) -> Sessions:
    with _LOCK:
        return _SESSIONS.setdefault(key, Sessions())


@dataclass(frozen=True)
class SeedTask:
    """One episode: the server's `reset` gets this seed and `env.args`."""

    seed: int

    @property
    def key(self) -> str:
        return f"seed={self.seed}"


class SeedTasks:
    """Held-out seeds `env.seed`, `env.seed + 1`, ... (`env.eval_size` of them); training
    episodes draw other seeds at random."""

    def __init__(self, first: int, n_held_out: int) -> None:
        self.held_out = [SeedTask(first + i) for i in range(n_held_out)]
        self._held = {t.seed for t in self.held_out}

    def sample(self, rng: random.Random) -> SeedTask:
        while True:
            seed = rng.randrange(2**31 - 1)
            if seed not in self._held:
                return SeedTask(seed)


def serve_app(ref: str, host: str = "127.0.0.1", timeout_s: float = 60.0) -> str:
    """The base URL of the in-process server of app `ref` (started on first use)."""
    with _LOCK:
        if ref in _SERVERS:
            return _SERVERS[ref]
        import uvicorn

        from saorl.envs.custom import load_reference

        app = load_reference(ref, "env.openenv.app")
        sock = socket.create_server((host, 0))
        server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
        thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="openenv-server", daemon=True
        )
        thread.start()
        deadline = time.monotonic() + timeout_s
        while not server.started:
            if not thread.is_alive() or time.monotonic() > deadline:
                raise ConfigError(f"env.openenv.app {ref!r}: the server did not start")
            time.sleep(0.02)
        _SERVERS[ref] = f"http://{host}:{sock.getsockname()[1]}"
        return _SERVERS[ref]


def _no_proxy(url: str) -> bool:
    return urlsplit(url).hostname in ("127.0.0.1", "localhost", "::1")


def fetch_schema(base_url: str, timeout_s: float) -> dict[str, Any]:
    """The server's action schema (`GET /schema`), cached per server."""
    with _LOCK:
        if base_url in _SCHEMAS:
            return _SCHEMAS[base_url]
    handlers = [urllib.request.ProxyHandler({})] if _no_proxy(base_url) else []
    try:
        with urllib.request.build_opener(*handlers).open(
            f"{base_url}/schema", timeout=timeout_s
        ) as r:
            schema = json.loads(r.read())["action"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise OpenEnvFailure("unreachable", f"GET {base_url}/schema: {e}") from None
    with _LOCK:
        _SCHEMAS[base_url] = schema
    return schema


def ws_url(base_url: str) -> str:
    """`http(s)://host:port[/path]` -> `ws(s)://host:port[/path]/ws`."""
    scheme, rest = base_url.rstrip("/").split("://", 1)
    scheme = {"http": "ws", "https": "wss"}.get(scheme, scheme)
    return f"{scheme}://{rest}/ws"


class OpenEnvEnv:
    """One episode: one WebSocket session on an OpenEnv server."""

    offload = True  # network round trips: keep decoding meanwhile

    def __init__(
        self,
        base_url: Any,
        fmt: ToolFormat = "hermes",
        reset_args: dict[str, Any] | None = None,
        timeout_s: float = 600.0,
        system_prompt: str = "",
        with_instructions: bool = True,
        tool: str = "",
        key: str = "",
    ) -> None:
        """`base_url`: the server's URL, or a callable returning it (starts an app lazily);
        `key` names the server among this process's (`Sessions`): its URL if empty."""
        self._base_url = base_url
        self.sessions = sessions(key or str(base_url))
        self._held = False  # this episode counts in `sessions.open`
        self.fmt = fmt
        self.reset_args = dict(reset_args or {})
        self.timeout_s = timeout_s
        self.system_prompt = system_prompt
        self.with_instructions = with_instructions
        self.tool_override = tool
        self.tools: list[dict[str, Any]] = []  # read by the rollout worker after reset
        self.name = ""
        self._ws: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def reset(self, task: SeedTask) -> list[Message]:
        base = self._base_url
        if callable(base):  # starting an app blocks: not on the event loop
            base = await asyncio.to_thread(base)
        schema = await asyncio.to_thread(fetch_schema, base, self.timeout_s)
        self.tools = [action_tool(schema, self.tool_override)]
        self.name = self.tools[0]["function"]["name"]
        reply = await self._open(base, {**self.reset_args, "seed": task.seed})
        text = observation_text(reply.observation)
        if self.with_instructions:
            text = instructions(self.fmt, self.name) + text
        messages: list[Message] = [{"role": "user", "content": text}]
        if self.system_prompt:
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        return messages

    def room(self) -> int | None:
        """Sessions free on this episode's server for new episodes of this process (None:
        unknown, no limit); the rollout worker starts no more than that."""
        return self.sessions.room()

    async def _open(self, base: str, reset: dict[str, Any]) -> Any:
        """Connect and reset; a session refused for capacity waits and tries again (above)."""
        deadline = time.monotonic() + self.timeout_s
        pause = RETRY_S[0]
        while True:
            await self._connect(ws_url(base))
            self._held = True
            self.sessions.add(1)
            reply = await self._send({"type": "reset", "data": reset})
            if not reply.error:
                return reply
            await self.aclose()
            if reply.code != "CAPACITY_REACHED":
                raise OpenEnvFailure(_reason(reply.code, "reset_error"), reply.error)
            if self.sessions.refused(reply, base):
                raise EnvBusy(reply.error)  # this process's episodes hold every session
            if time.monotonic() + pause > deadline:
                raise OpenEnvFailure(
                    "capacity_reached", f"{reply.error} (for {self.timeout_s:g} s)"
                )
            await asyncio.sleep(pause * (0.5 + random.random()))
            pause = min(2 * pause, RETRY_S[1])

    async def step(self, action_text: str) -> StepResult:
        call = parse_tool_call(action_text, self.fmt)
        if call is None:  # a reply, not an action: the episode ends
            await self.aclose()
            return StepResult(done=True, info={"tool_status": "no_call"})
        action = action_from_call(call, self.name)
        if isinstance(action, str):
            status = "malformed" if isinstance(call, ToolCallError) else "unknown_tool"
            return self._observe(f"error: {action}", status)
        reply = await self._send({"type": "step", "data": action})
        if reply.error and reply.code in ACTION_ERRORS:
            status = "invalid" if reply.code == "VALIDATION_ERROR" else "server_error"
            return self._observe(f"error: {reply.error}", status)
        if reply.error:
            await self.aclose()
            raise OpenEnvFailure(_reason(reply.code, "server_error"), reply.error)
        if reply.done:
            await self.aclose()
        result = self._observe(observation_text(reply.observation), "ok")
        result.reward = reply.reward
        result.done = reply.done
        return result

    def _observe(self, text: str, status: str) -> StepResult:
        return StepResult(
            [{"role": "tool", "content": text}], info={"tool_call": True, "tool_status": status}
        )

    async def _connect(self, url: str) -> None:
        from websockets.asyncio.client import connect

        self._loop = asyncio.get_running_loop()
        extra = {"proxy": None} if _no_proxy(url) else {}
        try:
            self._ws = await connect(
                url, open_timeout=self.timeout_s, max_size=2**26, ping_interval=None, **extra
            )
        except Exception as e:  # refused, unresolvable, not a WebSocket server, timed out
            raise OpenEnvFailure("unreachable", f"{url}: {type(e).__name__}: {e}") from None

    async def _send(self, message: dict[str, Any]) -> Any:
        if self._ws is None:
            raise OpenEnvFailure("disconnected", "the session is closed")
        # Closed already: a server that refused the session said why before closing, read on.
        with contextlib.suppress(Exception):
            await self._ws.send(json.dumps(message))
        try:
            raw = await asyncio.wait_for(self._ws.recv(), self.timeout_s)
        except TimeoutError:
            await self.aclose()
            raise OpenEnvFailure("timeout", f"no reply in {self.timeout_s:g} s") from None
        except Exception as e:  # the connection dropped (server gone, session reaped)
            self._ws = None
            self._release()
            raise OpenEnvFailure("disconnected", f"{type(e).__name__}: {e}") from None
        try:
            return read_reply(json.loads(raw))
        except ValueError:
            return read_reply(raw)

    def end_episode(self) -> None:
        """Close the session on the event loop that owns it (the rollout worker calls this
        from its thread when the episode ends, however it ends); a no-op once closed."""
        loop = self._loop
        if self._ws is not None and loop is not None and not loop.is_closed():
            # The coroutine is made on the loop: one that stops first (the run is ending)
            # leaves nothing unawaited behind.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(lambda: loop.create_task(self.aclose()))

    async def aclose(self) -> None:
        """End the session: `close`, then the server closes the connection (closing it from
        this side first races the server's own close, which it logs as an error)."""
        ws, self._ws = self._ws, None
        if ws is None:
            return self._release()
        with contextlib.suppress(Exception):  # already gone: nothing to end
            await ws.send(json.dumps({"type": "close"}))
            await asyncio.wait_for(ws.wait_closed(), 5.0)
        with contextlib.suppress(Exception):
            await ws.close()
        self._release()  # once the server has let the session go

    def _release(self) -> None:
        if self._held:
            self._held = False
            self.sessions.add(-1)


def _reason(code: str, default: str) -> str:
    """A failure reason from a server error code (`CAPACITY_REACHED` -> `capacity_reached`)."""
    return code.lower() if code and code not in ACTION_ERRORS else default


def build_openenv_spec(cfg: EnvConfig, held_out_only: bool) -> EnvSpec:
    """The spec of `env.name = "openenv"`: seeds as tasks; no server is contacted here (the
    first episode of each process starts the app or connects)."""
    fmt: ToolFormat = "llama3" if cfg.tool_format == "llama3" else "hermes"
    if cfg.openenv.app:
        ref = cfg.openenv.app
        timeout = cfg.step_timeout_s
        base: Any = lambda: serve_app(ref, timeout_s=timeout)  # noqa: E731
    else:
        base = cfg.openenv.url.rstrip("/")
    return EnvSpec(
        SeedTasks(cfg.seed, cfg.held_out_count()),
        lambda: OpenEnvEnv(
            base,
            fmt,
            reset_args=cfg.args,
            timeout_s=cfg.step_timeout_s,
            system_prompt=cfg.system_prompt,
            with_instructions=cfg.instructions,
            tool=cfg.openenv.tool,
            key=cfg.openenv.app or cfg.openenv.url,
        ),
        max_turns=cfg.max_turns,
        max_tool_calls=cfg.max_turns,  # every turn is an action: env.max_turns bounds them
        stop=tuple(stop_strings(fmt)),
    )
