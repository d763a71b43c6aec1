"""The endpoint refuses a request body over its size limit (413) before reading, parsing or
tokenizing it, over HTTP and in-process alike; the endpoint then serves on."""

from __future__ import annotations

import asyncio
import json
import socket

import httpx

from saorl.rollout.agents.server import TrainingEndpoint
from saorl.rollout.agents.wire import MIN_BODY_BYTES, body_limit
from tests.integration.test_endpoint import _tok


class _Counting:
    """The tokenizer, counting every call that turns text into ids."""

    def __init__(self, tok) -> None:
        self.tok, self.encoded = tok, 0

    def __getattr__(self, name):
        attr = getattr(self.tok, name)
        if name in ("encode", "apply_chat_template", "__call__"):
            self.encoded += 1
        return attr

    def __len__(self) -> int:
        return len(self.tok)


def _never(*args):
    raise AssertionError("a refused request reached the engine")


def test_an_oversized_body_is_refused_before_it_is_read():
    tok = _Counting(_tok())
    endpoint = TrainingEndpoint(_never, tok, context_len=4096)
    try:
        session = endpoint.open({"id": 1})
        limit = endpoint.body_limit
        assert limit == body_limit(4096) == MIN_BODY_BYTES  # 64 bytes x 4096 tokens < 1 MiB
        url = f"{endpoint.base_url(session)}/chat/completions"
        big = {"model": "policy", "messages": [{"role": "user", "content": "x" * limit}]}
        tok.encoded = 0
        r = httpx.post(url, content=json.dumps(big).encode(), timeout=60)
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        assert f"limit of {limit} bytes" in r.json()["error"]["message"]
        assert tok.encoded == 0
        # Only headers: the answer comes without the server waiting for the 100 MB it declares.
        host, port = endpoint.http.address
        with socket.create_connection((host, port), timeout=60) as s:
            s.sendall(
                f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"
                f"Content-Length: {100 << 20}\r\n\r\n".encode()
            )
            head = s.recv(4096).decode()
        assert head.startswith("HTTP/1.1 413") and "connection: close" in head.lower()
        # A bad Content-Length is a 400, and the in-process path has the same limit.
        with socket.create_connection((host, port), timeout=60) as s:
            s.sendall(
                b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n"
            )
            assert s.recv(4096).decode().startswith("HTTP/1.1 400")
        big_raw = b" " * (limit + 1)
        answer = asyncio.run(endpoint.serve_async("POST", "/v1/chat/completions", {}, big_raw))
        assert answer.status == 413 and tok.encoded == 0
        # The endpoint serves on.
        assert httpx.get(f"{endpoint.root}/v1/models", timeout=60).status_code == 200
    finally:
        endpoint.shutdown()
