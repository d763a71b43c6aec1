"""`saorl eval` end to end: a tiny model on a shared dataset, and a served model over HTTP."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from saorl.config import EnvConfig
from saorl.evaluation import pass_at_k, run_eval

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "data"
needs_data = pytest.mark.skipif(not DATA.is_dir(), reason=f"no shared data at {DATA}")


@needs_data
def test_saorl_eval_on_aime25_with_a_tiny_model(tmp_path):
    out = tmp_path / "aime.jsonl"
    proc = subprocess.run(
        [sys.executable, "-m", "saorl", "eval", "builtin:tiny", "--dataset", "aime25",
         "--k", "2", "--limit", "3", "--max-new-tokens", "8", "--data-root", str(DATA),
         "--out", str(out)],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["samples"]) == 2 for r in rows)
    assert {"key", "prompt", "reference", "pass@1", "pass@2"} <= set(rows[0])
    summary = json.loads(out.with_suffix(".summary.json").read_text())
    # A random-init model solves nothing: the plumbing is what is tested here.
    assert summary["problems"] == 3 and summary["pass@1"] == 0.0
    assert "pass@1" in proc.stdout


def test_saorl_eval_missing_dataset_is_a_clear_error(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "saorl", "eval", "builtin:tiny", "--dataset",
         str(tmp_path / "nope.jsonl")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 2
    assert "env.dataset" in proc.stderr and "Traceback" not in proc.stderr


class _FakeChat(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint that calls the Python tool once, then answers."""

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        tool_turn = len(body["messages"]) == 1
        # The API strips the matched stop string, as real servers do.
        content = "<python>print(6*7)" if tool_turn else "so \\boxed{42}"
        reply = {"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}
        data = json.dumps(reply).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


def test_eval_against_an_openai_compatible_endpoint(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "6 times 7?", "answer": "42"}) + "\n")
    server = HTTPServer(("127.0.0.1", 0), _FakeChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = EnvConfig(name="math", dataset=str(data), eval_dataset=str(data), eval_size=10,
                        problem_key="question")  # fmt: skip
        summary, rows = run_eval(
            "served", cfg, k=2, progress=False, base_url=f"http://127.0.0.1:{server.server_port}/v1"
        )
    finally:
        server.shutdown()
    assert summary["pass@1"] == 1.0 and summary["tool_calls_mean"] == 1.0
    sample = rows[0]["samples"][0]
    assert sample["stop_reason"] == "answer" and "</python>" in sample["text"]


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [(4, 0, 1, 0.0), (4, 4, 2, 1.0), (4, 1, 1, 0.25), (4, 1, 2, 0.5), (5, 2, 3, 0.9)],
)
def test_pass_at_k(n, c, k, expected):
    # pass@k = 1 - C(n-c, k)/C(n, k); n=4, c=1, k=2: 1 - C(3,2)/C(4,2) = 1 - 3/6 = 0.5;
    # n=5, c=2, k=3: 1 - C(3,3)/C(5,3) = 1 - 1/10 = 0.9.
    assert pass_at_k(n, c, k) == pytest.approx(expected)


def test_eval_a_run_directory_and_one_of_its_checkpoints(tmp_path):
    from saorl.loop import train_from_config
    from tests.conftest import tiny_config

    cfg = tiny_config(f"run.output_dir={tmp_path}", "run.total_steps=2", "run.eval_every=0")
    run = Path(train_from_config(cfg)["run_dir"])
    env = EnvConfig(name="arithmetic", eval_size=8)
    for model in (run, sorted((run / "checkpoints").glob("step_*.pt"))[-1]):
        summary, rows = run_eval(str(model), env, k=2, max_new_tokens=6, max_seq_len=32,
                                 progress=False)  # fmt: skip
        assert summary["problems"] == 8 and len(rows[0]["samples"]) == 2
        assert 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
