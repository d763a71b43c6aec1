"""Odd input fails one episode or is shown escaped, never crashes a command.

Malformed replies of an OpenAI-compatible endpoint (served over real HTTP on localhost),
terminal control sequences in data that saorl prints, and integers too long for JSON text in a
trajectory's `info`.
"""

from __future__ import annotations

import io
import json
import subprocess
import threading
from http.server import HTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest

from saorl.cli.main import main
from saorl.monitoring.metrics import MetricsLogger
from saorl.monitoring.samples import SampleLogger
from saorl.monitoring.terminal import EscapedStream, printable
from saorl.types import Trajectory
from tests._chat_stub import ChatStub

pytestmark = pytest.mark.faults

_GOOD = {"choices": [{"message": {"content": "\\boxed{2}"}, "finish_reason": "stop"}]}
# Each is the whole reply body to one request; bytes are sent as they are.
_BAD: list[Any] = [
    {"choices": []},
    {"id": "x"},
    {"choices": ["text"]},
    {"choices": [{"message": {"content": ["a", "part"]}, "finish_reason": "stop"}]},
    {"choices": [{"message": {"content": "", "tool_calls": [{"id": "a", "function": "f(1)"}]}}]},
    {"choices": [{"message": {"content": None, "tool_calls": {"x": 1}}}]},
    {"choices": [{"message": {"content": "", "tool_calls": [{"function": {"name": 3}}]}}]},
    {"choices": [{"message": {"content": "ok"}, "finish_reason": 7}]},
    [1, 2],
    b"<html>502 Bad Gateway</html>",
    b"\xff\xfe not utf-8",
    b"[" * 100_000 + b"]" * 100_000,
]


class _OddChat(ChatStub):
    """Serves `_BAD` in turn, then good replies."""

    lock = threading.Lock()
    served: ClassVar[list[int]] = [0]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        with self.lock:
            i = self.served[0]
            self.served[0] += 1
        reply = _BAD[i] if i < len(_BAD) else _GOOD
        data = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


def test_malformed_endpoint_replies_fail_their_episodes_only(tmp_path: Path, capsys):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"problem": "1 plus 1?", "answer": "2"}) + "\n")
    _OddChat.served = [0]
    server = HTTPServer(("127.0.0.1", 0), _OddChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "e.jsonl"
    k = len(_BAD) + 3
    try:
        code = main(
            [
                "eval",
                "served",
                "--base-url",
                f"http://127.0.0.1:{server.server_port}/v1",
                "--k",
                str(k),
                "--out",
                str(out),
                "env.name=math",
                f"env.eval_dataset={data}",
                "env.use_tool=false",
            ]
        )
    finally:
        server.shutdown()
    assert code == 0, capsys.readouterr().err
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    bad = summary["bad_replies"]
    assert sum(bad.values()) == len(_BAD) and summary["stop/bad_reply"] == len(_BAD) / k
    assert summary[f"avg@{k}"] == pytest.approx(3 / k)  # the good replies still count
    reasons = " | ".join(bad)
    for words in (
        "no choices",
        "choices[0] is a str",
        "message.content is a list",
        "function is a str",
        "tool_calls is a dict",
        "function.name is a int",
        "finish_reason is",
        "a JSON list",
        "not JSON",
        "nested too deeply",
    ):
        assert words in reasons, (words, reasons)
    samples = json.loads(out.read_text())["samples"]
    assert sum(s["stop_reason"] == "bad_reply" and "error" in s for s in samples) == len(_BAD)


_OSC = "\x1b]0;pwned\x07\x1b]52;c;ZWNobyBoaQ==\x07\x1b[2J\x9b31m\u202e"


def test_printable_escapes_every_control_sequence():
    shown = printable(f"task{_OSC}\tid\nnext")
    assert not any(c in shown for c in "\x1b\x07\x9b\u202e")
    assert "\\x1b]0;pwned\\x07" in shown and "\\u202e" in shown and "\tid\nnext" in shown
    assert printable("a\tb\nc", one_line=True) == "a\\x09b\\x0ac"


def test_the_stderr_stream_keeps_colours_and_progress_bars_only():
    out = io.StringIO()
    stream = EscapedStream(out)
    stream.write(f"\x1b[36m(actor pid=1)\x1b[0m task {_OSC}\n")
    stream.write("\r50%|#####     |")
    stream.write("\x1b[A\x1b[A")
    written = out.getvalue()
    assert written.startswith("\x1b[36m(actor pid=1)\x1b[0m task \\x1b]0;pwned\\x07")
    assert "\\x1b[2J" in written and "\n\r50%" in written and written.endswith("\x1b[A\x1b[A")
    assert "\x07" not in written and "\x9b" not in written


def test_data_in_errors_and_eval_tables_reaches_the_terminal_escaped(tmp_path: Path, capsys):
    missing = tmp_path / f"data{_OSC}.jsonl"
    assert main(["eval", "builtin:tiny", "env.name=math", f"env.eval_dataset={missing}"]) == 2
    err = capsys.readouterr().err
    assert "\\x1b]0;pwned" in err and "\x1b" not in err and "\x07" not in err
    out = tmp_path / "e.jsonl"
    code = main(
        [
            "eval",
            "builtin:tiny",
            "--limit",
            "1",
            "--out",
            str(out),
            "rollout.max_new_tokens=1",
            f"run.name=x{_OSC}",
        ]
    )
    assert code == 0
    from saorl.config import load_config
    from saorl.evaluation.held_out import write_results

    capsys.readouterr()
    write_results(f"served[link=http://x]{_OSC}", load_config().env, {"k": 1}, [], str(out))
    table = capsys.readouterr().out
    # Shown as text, not taken as rich markup.
    assert "\x1b]" not in table and "\x07" not in table and "served[link=http:/" in table


def test_swe_commands_print_task_data_escaped(tmp_path: Path, capsys):
    checkout = tmp_path / "repos" / "o__r"
    checkout.mkdir(parents=True)
    (checkout / "m.py").write_text("x = 1\n")
    git = ["git", "-C", str(checkout), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git[:3], "init", "-q"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "one"], check=True)
    head = subprocess.run([*git[:3], "rev-parse", "HEAD"], capture_output=True, text=True)
    row = {
        "instance_id": f"evil{_OSC}",
        "repo": "o/r",
        "base_commit": head.stdout.strip(),
        "patch": "",
        "test_patch": "",
        "FAIL_TO_PASS": "[]",
        "PASS_TO_PASS": "[]",
        "problem_statement": f"fix it{_OSC}",
    }
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps(row) + "\n")
    code = main(
        [
            "swe-validate",
            str(tasks),
            "--repos-root",
            str(tmp_path / "repos"),
            f"env.swe.cache_dir={tmp_path / 'cache'}",
            "env.swe.task_envs=none",
        ]
    )
    captured = capsys.readouterr()
    assert code != 0, captured.err
    assert "evil\\x1b]0;pwned" in captured.out  # the table and the reason, escaped
    for stream in (captured.out, captured.err):
        assert "\x1b" not in stream and "\x07" not in stream and "\u202e" not in stream


class _Tok:
    def decode(self, ids, skip_special_tokens=False):
        return "".join(chr(97 + i % 26) for i in ids)


def test_sample_logger_and_metrics_take_integers_too_long_for_json(tmp_path: Path):
    huge = 10**5000
    traj = Trajectory(
        prompt_ids=[1, 2],
        completion_ids=[3, 4],
        rollout_logprobs=[0.0, 0.0],
        loss_mask=[1, 1],
        versions=[0, 0],
        reward=1.0,
        stop_reason="answer",
        prompt_key="k",
        info={"n": huge, "m": -huge, "ok": 3, 7: "int key", huge: "huge key"},
    )
    with MetricsLogger(tmp_path) as log:
        rows = SampleLogger(tmp_path, _Tok(), 1, 4, 1, log).maybe_log(1, [traj], [0], {})
        log.log({"step": 1, "big": huge, "wide": 2**80})
    assert rows and rows[0]["info"]["ok"] == 3
    written = json.loads((tmp_path / "samples.jsonl").read_text())
    assert written["info"]["n"] == "<integer of 16610 bits>" and written["info"]["7"] == "int key"
    assert written["info"]["<integer of 16610 bits>"] == "huge key"
    metrics = json.loads((tmp_path / "metrics.jsonl").read_text())
    assert metrics["big"] is None and metrics["wide"] == float(2**80)
