"""`saorl eval` end to end: its config (a run's own, the defaults, --config, overrides), a tiny
model on held-out sets and dataset files, and a served model over HTTP."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from saorl.cli import main
from saorl.config import load_config
from saorl.envs.factory import build_env
from saorl.evaluation import pass_at_k, run_eval

# Small enough for the default demo model on 2 cores; the problems' count is what is tested.
FAST = ["rollout.max_new_tokens=4"]


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "saorl", "eval", *args],
                          capture_output=True, text=True, timeout=300)  # fmt: skip


def _summary(out: Path) -> dict:
    return json.loads(out.with_suffix(".summary.json").read_text())


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    """A 2-step tiny run (env.eval_size=16): config.toml, checkpoints/ and final/."""
    from saorl.loop import train_from_config
    from tests.conftest import tiny_config

    out = tmp_path_factory.mktemp("runs")
    cfg = tiny_config(f"run.output_dir={out}", "run.total_steps=2", "run.eval_every=0")
    return Path(train_from_config(cfg)["run_dir"])


def test_saorl_eval_on_aime25_with_a_tiny_model(tmp_path):
    # aime25 ships inside the package: no data root is needed
    out = tmp_path / "aime.jsonl"
    proc = _eval("builtin:tiny", "env.name=math", "env.eval_dataset=aime25",
                 "--k", "2", "--limit", "3", "rollout.max_new_tokens=8",
                 "model.max_seq_len=2048", "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["samples"]) == 2 for r in rows)
    assert {"key", "prompt", "reference", "pass@1", "pass@2"} <= set(rows[0])
    summary = _summary(out)
    # A random-init model solves nothing: the plumbing is what is tested here.
    assert summary["problems"] == 3 and summary["pass@1"] == 0.0
    assert "pass@1" in proc.stdout


def test_saorl_eval_missing_dataset_is_a_clear_error(tmp_path):
    proc = _eval("builtin:tiny", "env.name=math", f"env.eval_dataset={tmp_path / 'nope.jsonl'}")
    assert proc.returncode == 2
    assert "env.eval_dataset" in proc.stderr and "Traceback" not in proc.stderr


def test_eval_a_model_directory_on_the_default_held_out_set(run_dir, tmp_path):
    # A Hugging Face directory outside any run: the default config, the arithmetic task's own
    # held-out set of env.eval_size problems.
    hf = Path(shutil.copytree(run_dir / "final", tmp_path / "hf"))
    out = tmp_path / "e.jsonl"
    proc = _eval(str(hf), "--k", "4", *FAST, "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    summary = _summary(out)
    assert summary["problems"] == load_config().env.eval_size and summary["k"] == 4
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert all(len(r["samples"]) == 4 for r in rows)
    assert [r["key"] for r in rows] == [p.key for p in build_env(load_config().env).task.held_out]


def test_eval_a_run_uses_its_config(run_dir, tmp_path):
    # The run trained with env.eval_size=16: its directory, final/ and a checkpoint all
    # evaluate those 16 problems.
    ckpt = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    for i, model in enumerate((run_dir, ckpt)):
        out = tmp_path / f"e{i}.jsonl"
        proc = _eval(str(model), "--k", "2", "--out", str(out))
        assert proc.returncode == 0, proc.stderr
        summary = _summary(out)
        assert summary["problems"] == 16 and summary["k"] == 2
        assert 0.0 <= summary["pass@1"] <= summary["pass@2"] <= 1.0
    assert main(["eval", str(run_dir / "final"), "--print-config"]) == 0


def test_eval_overrides_and_a_bad_one(run_dir, tmp_path, capsys):
    out = tmp_path / "e.jsonl"
    proc = _eval(str(run_dir), "env.eval_size=8", "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert _summary(out)["problems"] == 8
    for bad, key in (("env.eval_sz=8", "env.eval_sz"), ("env.eval_size=0", "env.eval_size")):
        assert main(["eval", str(run_dir), bad, "--out", str(tmp_path / "bad.jsonl")]) == 2
        err = capsys.readouterr().err
        assert key in err and "Traceback" not in err
    assert not (tmp_path / "bad.jsonl").exists()
    with pytest.raises(SystemExit) as info:  # a config field is not a flag: its key is named
        main(["eval", str(run_dir), "--max-turns", "3"])
    assert info.value.code == 2 and "env.max_turns=" in capsys.readouterr().err


def _math_file(path: Path, n: int) -> Path:
    path.write_text("".join(json.dumps({"q": f"{i} plus 1?", "a": str(i + 1)}) + "\n"
                            for i in range(n)))  # fmt: skip
    return path


def test_eval_a_whole_dataset_file(tmp_path):
    # No training problems are needed: the training preset (env.dataset) is not even there.
    data = _math_file(tmp_path / "q.jsonl", 12)
    out = tmp_path / "e.jsonl"
    proc = _eval("builtin:tiny", "env.name=math", f"env.eval_dataset={data}",
                 f"env.data_root={tmp_path / 'empty'}", "env.problem_key=q", "env.answer_key=a",
                 "env.use_tool=false", *FAST, "model.max_seq_len=128",
                 "--out", str(out))  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _summary(out)["problems"] == 12


def test_held_out_only_sets(tmp_path):
    data = _math_file(tmp_path / "q.jsonl", 300)
    math = ["env.name=math", f"env.eval_dataset={data}", "env.problem_key=q", "env.answer_key=a"]

    def held_out(*overrides: str) -> int:
        return len(build_env(load_config(None, overrides).env, held_out_only=True).task.held_out)

    assert held_out(*math) == 300  # an evaluation file is taken whole...
    assert held_out(*math, "env.eval_size=5") == 5  # ...unless the config sets env.eval_size
    assert held_out("env.num_digits=1") == 100  # every 1-digit sum, none left for training
    assert held_out("env.name=tool_arithmetic", "env.num_digits=1") == 81
    cfg = load_config(None, ["env.eval_size=40"]).env  # the very set training holds out
    assert build_env(cfg, held_out_only=True).task.held_out == build_env(cfg).task.held_out


def test_held_out_only_swebench_file(monkeypatch, tmp_path):
    import saorl.envs.swe.spec
    import saorl.envs.swe.swebench

    monkeypatch.setattr(saorl.envs.swe.spec, "check_pytest", lambda: None)
    monkeypatch.setattr(saorl.envs.swe.swebench, "load_swebench", lambda *a: list(range(10)))
    swe = ["env.name=swe", "env.swe_source=swebench", f"env.swe_tasks={tmp_path / 't.jsonl'}"]

    def held_out(*overrides: str) -> list:
        cfg = load_config(None, [*swe, *overrides]).env
        return build_env(cfg, held_out_only=True).task.held_out

    assert held_out() == list(range(10))  # a task file is evaluated whole...
    assert held_out("env.eval_size=3") == [7, 8, 9]  # ...or its held-out tail when set


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
        cfg = load_config(None, ["env.name=math", f"env.eval_dataset={data}",
                                 "env.problem_key=question"])  # fmt: skip
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
