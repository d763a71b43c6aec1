"""The plumbing of the fake OpenAI-compatible endpoints the tests serve on localhost: a
subclass writes only `answer(body)`, the reply to one chat-completions request body."""

from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler
from typing import Any


class ChatStub(BaseHTTPRequestHandler):
    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        raise NotImplementedError

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        data = json.dumps(self.answer(body)).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass
