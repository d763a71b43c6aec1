"""The endpoint's HTTP layer (uvicorn, `saorl.rollout.agents.asgi`) with real clients over real
sockets: keep-alive across plain, streamed and refused requests; a chunked body over the size
limit refused as a declared one is; many connections waiting on the engine served by one thread,
not one each; calls still waiting when the endpoint stops answered 503; the process's signal
handlers left alone; replies not held back by Nagle's algorithm."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import signal
import socket
import threading
import time

import httpx

from saorl.engines.protocol import Completion
from saorl.rollout.agents.server import TrainingEndpoint
from tests.integration.test_endpoint import _tok


def _chat(content: str = "hi", **extra) -> bytes:
    body = {"model": "policy", "messages": [{"role": "user", "content": content}], **extra}
    return json.dumps(body).encode()


class Engine:
    """The endpoint's `submit`: each call's future, answered "42" by `answer`."""

    def __init__(self, tok, answer_at_once: bool) -> None:
        self.tok, self.at_once, self.futures = tok, answer_at_once, []

    def __call__(self, prompt, max_tokens, stop) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self.futures.append(future)
        if self.at_once:
            self.answer(future)
        return future

    def answer(self, future: concurrent.futures.Future) -> None:
        ids = self.tok.encode("42", add_special_tokens=False)
        future.set_result(Completion(None, ids, [-0.1] * len(ids), [0] * len(ids), "eos"))  # type: ignore[arg-type]


def _wait_for(what, timeout_s: float = 120.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not what():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.01)


def test_one_connection_carries_many_requests():
    tok = _tok()
    sigterm = signal.getsignal(signal.SIGTERM)
    endpoint = TrainingEndpoint(Engine(tok, answer_at_once=True), tok, context_len=4096)
    try:
        assert signal.getsignal(signal.SIGTERM) is sigterm  # the main thread's stay its own
        key = endpoint.open({"id": 1}).key
        host, port = endpoint.http.address
        conn = http.client.HTTPConnection(host, port, timeout=60)
        path = f"/episodes/{key}/v1/chat/completions"
        requests = [
            ("GET", "/v1/models", None, 200),
            ("POST", path, _chat(), 200),
            ("POST", path, _chat(stream=True), 200),  # chunked server-sent events
            ("POST", path, b"{not json", 400),
            ("POST", "/episodes/ep-nope/v1/chat/completions", _chat(), 404),
            ("POST", path, _chat(), 200),
        ]
        first = None
        for method, url, body, status in requests:
            conn.request(method, url, body=body, headers={"Content-Type": "application/json"})
            r = conn.getresponse()
            data = r.read()
            assert r.status == status, data
            first = first or conn.sock
            assert conn.sock is first  # the same connection, kept alive
            if status != 200:
                assert json.loads(data)["error"]["message"]  # OpenAI's error shape
            elif b"stream" in (body or b""):
                assert r.getheader("Content-Type") == "text/event-stream"
                events = [e for e in data.decode().split("\n\n") if e]
                assert events[-1] == "data: [DONE]"
                deltas = [json.loads(e.removeprefix("data: ")) for e in events[:-1]]
                text = "".join(d["choices"][0]["delta"].get("content") or "" for d in deltas)
                assert text == "42"
            elif method == "POST":
                assert json.loads(data)["choices"][0]["message"]["content"] == "42"
        # Without TCP_NODELAY a reply's body would wait for the client's delayed ACK (~40 ms).
        (server_side,) = endpoint.http.server.server_state.connections
        sock = server_side.transport.get_extra_info("socket")
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
        conn.close()
    finally:
        endpoint.shutdown()


def test_a_chunked_body_over_the_limit_is_refused():
    tok = _tok()
    engine = Engine(tok, answer_at_once=True)
    endpoint = TrainingEndpoint(engine, tok, context_len=4096)
    try:
        url = f"{endpoint.base_url(endpoint.open({'id': 1}))}/chat/completions"
        piece = b" " * (64 << 10)
        chunks = iter([piece] * (endpoint.body_limit // len(piece) + 2))  # no Content-Length
        r = httpx.post(url, content=chunks, timeout=60)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert not engine.futures
        # Under the limit, a chunked body is read whole.
        r = httpx.post(url, content=iter([_chat()[:5], _chat()[5:]]), timeout=60)
        assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "42"
    finally:
        endpoint.shutdown()


def test_connections_waiting_on_the_engine_take_no_thread_each():
    tok = _tok()
    engine = Engine(tok, answer_at_once=False)
    endpoint = TrainingEndpoint(engine, tok, context_len=4096)
    n = 100
    try:
        threads = threading.active_count()
        host, port = endpoint.http.address
        conns = [http.client.HTTPConnection(host, port, timeout=120) for _ in range(n + 1)]
        for conn in conns:
            key = endpoint.open({"id": 1}).key
            conn.request("POST", f"/episodes/{key}/v1/chat/completions", body=_chat())
        _wait_for(lambda: len(engine.futures) == n + 1)  # every call is waiting on the engine
        # The standard library's server had a thread for each of these connections.
        assert threading.active_count() <= threads + 2
        for future in engine.futures[:n]:
            engine.answer(future)
        for conn in conns[:n]:
            r = conn.getresponse()
            assert r.status == 200
            assert json.loads(r.read())["choices"][0]["message"]["content"] == "42"
        # A call still waiting when the endpoint stops is answered, not dropped.
        endpoint.shutdown()
        r = conns[n].getresponse()
        assert r.status == 503 and "stopping" in json.loads(r.read())["error"]["message"]
        for conn in conns:
            conn.close()
    finally:
        endpoint.shutdown()
