"""`saorl eval` end to end: its config (a run's own, the defaults, --config, overrides), a tiny
model on held-out sets and dataset files, and a served model over HTTP."""

from __future__ import annotations

import dataclasses
import json
import shutil
import subprocess
import sys
import threading
from http.server import HTTPServer
from pathlib import Path
from typing import ClassVar

import pytest

from saorl.cli.main import main
from saorl.config import load_config
from saorl.envs.factory import build_env
from saorl.evaluation.held_out import majority, pass_at_k, run_eval, vote
from tests._chat_stub import ChatStub

# Small enough for the default demo model on 2 cores; the problems' count is what is tested.
FAST = ["rollout.max_new_tokens=4"]


def _eval(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "saorl", "eval", *args], capture_output=True, text=True, timeout=300
    )


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
    proc = _eval(
        "builtin:tiny",
        "env.name=math",
        "env.eval_dataset=aime25",
        "--k",
        "2",
        "--limit",
        "3",
        "rollout.max_new_tokens=8",
        "model.max_seq_len=2048",
        "--prompt-template",
        "boxed",
        "--out",
        str(out),
    )
    assert proc.returncode == 0, proc.stderr
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(rows) == 3 and all(len(r["samples"]) == 2 for r in rows)
    assert {"key", "prompt", "reference", "pass@1", "avg@2", "pass@2", "maj@2"} <= set(rows[0])
    summary = _summary(out)
    # A random-init model solves nothing: the plumbing is what is tested here.
    assert summary["problems"] == 3 and summary["pass@1"] == 0.0 == summary["maj@2"]
    assert summary["prompt_template"] == "boxed"
    assert all(key in proc.stdout for key in ("avg@2", "pass@2", "maj@2", "boxed"))


def test_prompt_template_reaches_the_in_process_engine(tmp_path):
    from saorl.evaluation.held_out import run_episodes
    from saorl.evaluation.prompts import prompt_template
    from saorl.models.loading import load_policy
    from tests.conftest import tiny_config

    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"problem": "6 times 7?", "answer": "42"}) + "\n")
    cfg = load_config(None, ["env.name=math", f"env.eval_dataset={data}", "env.use_tool=false"])
    spec = build_env(cfg.env, held_out_only=True)
    # (the char-level tokenizer has no newline: it decodes as <unk>)
    for name, shown, not_shown in (
        ("boxed", "6 times 7?<unk>Please reason step by step", "Solve the problem"),
        ("saorl", "Solve the problem. Put the final answer in \\boxed{}.", "Please reason"),
    ):
        wrapped = dataclasses.replace(spec, make_env=prompt_template(name).wrap(spec.make_env))
        tiny = tiny_config("model.max_seq_len=256", "rollout.max_new_tokens=2")
        policy, tokenizer = load_policy(tiny.model)
        [episode] = run_episodes(policy, tokenizer, wrapped, list(spec.task.held_out), tiny)
        prompt = tokenizer.decode(episode.prompt_ids)
        assert shown in prompt and not_shown not in prompt


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
    assert summary["problems"] == load_config().env.held_out_count() and summary["k"] == 4
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


def test_eval_of_a_run_writes_in_the_run_folder_and_ends_with_a_headline(run_dir, tmp_path):
    # Without --out the results go to RUN/evals/, not to evals/ in the current folder: the
    # run's final policy under final/, a checkpoint under its own name.
    ckpt = sorted((run_dir / "checkpoints").glob("step_*.pt"))[-1]
    for model, which in ((run_dir, "final"), (ckpt, ckpt.stem)):
        proc = subprocess.run(
            [sys.executable, "-m", "saorl", "eval", str(model), "--limit", "2", *FAST],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp_path,
        )
        assert proc.returncode == 0, proc.stderr
        out = run_dir / "evals" / which / "arithmetic.jsonl"
        assert len(out.read_text().splitlines()) == 2 and _summary(out)["problems"] == 2
        lines = proc.stdout.strip().splitlines()
        assert lines[-2].endswith(f"per-problem results: {out}")
        assert lines[-1].startswith(f"saorl eval: {model} on arithmetic: avg@1 "), lines[-1]
        assert lines[-1].split("over 2 problems; ")[1].endswith(" s")
    assert not (tmp_path / "evals").exists()


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
    path.write_text(
        "".join(json.dumps({"q": f"{i} plus 1?", "a": str(i + 1)}) + "\n" for i in range(n))
    )
    return path


def test_eval_a_whole_dataset_file(tmp_path):
    # No training problems are needed: the training preset (env.dataset) is not even there.
    data = _math_file(tmp_path / "q.jsonl", 12)
    out = tmp_path / "e.jsonl"
    proc = _eval(
        "builtin:tiny",
        "env.name=math",
        f"env.eval_dataset={data}",
        f"env.data_root={tmp_path / 'empty'}",
        "env.problem_key=q",
        "env.answer_key=a",
        "env.use_tool=false",
        *FAST,
        "model.max_seq_len=128",
        "--out",
        str(out),
    )
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
    swe = [
        "env.name=swe",
        "env.swe.source=swebench",
        f"env.swe.tasks={tmp_path / 't.jsonl'}",
        "env.swe.task_envs=none",
        "env.swe.validate_tasks=false",
    ]  # the tasks here are stand-ins

    def held_out(*overrides: str) -> list:
        cfg = load_config(None, [*swe, *overrides]).env
        return build_env(cfg, held_out_only=True).task.held_out

    assert held_out() == list(range(10))  # a task file is evaluated whole...
    assert held_out("env.eval_size=3") == [7, 8, 9]  # ...or its held-out tail when set


class _FakeChat(ChatStub):
    """An OpenAI-compatible endpoint that calls the Python tool once, then answers."""

    def answer(self, body: dict) -> dict:
        tool_turn = len(body["messages"]) == 1
        # The API strips the matched stop string, as real servers do.
        content = "<python>print(6*7)" if tool_turn else "so \\boxed{42}"
        return {"choices": [{"message": {"content": content}, "finish_reason": "stop"}]}


def test_eval_against_an_openai_compatible_endpoint(tmp_path):
    data = tmp_path / "q.jsonl"
    data.write_text(json.dumps({"question": "6 times 7?", "answer": "42"}) + "\n")
    server = HTTPServer(("127.0.0.1", 0), _FakeChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        cfg = load_config(
            None, ["env.name=math", f"env.eval_dataset={data}", "env.problem_key=question"]
        )
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


class _VotingChat(ChatStub):
    """Answers each question with its next reply from `REPLIES` (a fixed multiset per question,
    whatever order the concurrent requests arrive in) and records the messages it was sent."""

    REPLIES: ClassVar[dict[str, list[str]]] = {
        "6 times 7?": ["\\boxed{42}", "\\boxed{41}", "so \\boxed{42}.", "\\boxed{7}"],
        "2 plus 2?": ["\\boxed{5}", "\\boxed{5}", "\\boxed{4}", "no box"],
        "1 plus 1?": ["\\boxed{3}", "\\boxed{2}", "\\boxed{\\dfrac{4}{2}}", "\\boxed{3}"],
    }
    lock = threading.Lock()
    served: ClassVar[dict[str, int]] = {}
    seen: ClassVar[list[list[dict]]] = []

    def answer(self, body: dict) -> dict:
        question = next(q for q in self.REPLIES if q in body["messages"][-1]["content"])
        with self.lock:
            i = self.served.get(question, 0)
            self.served[question] = i + 1
            self.seen.append(body["messages"])
        return {
            "choices": [
                {"message": {"content": self.REPLIES[question][i]}, "finish_reason": "stop"}
            ]
        }


def _served_eval(tmp_path: Path, *flags: str) -> tuple[dict, list[dict], list[list[dict]]]:
    """`saorl eval` (in this process) of a served model on the three `_VotingChat` questions,
    k=4, no tool; the summary, the per-problem rows and the messages the server got."""
    data = tmp_path / "q.jsonl"
    data.write_text(
        "".join(
            json.dumps({"problem": q, "answer": a}) + "\n"
            for q, a in (("6 times 7?", "42"), ("2 plus 2?", "4"), ("1 plus 1?", "2"))
        )
    )
    _VotingChat.served, _VotingChat.seen = {}, []
    server = HTTPServer(("127.0.0.1", 0), _VotingChat)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    out = tmp_path / "e.jsonl"
    try:
        code = main(
            [
                "eval",
                "served",
                "--base-url",
                f"http://127.0.0.1:{server.server_port}/v1",
                "--k",
                "4",
                "--out",
                str(out),
                *flags,
                "env.name=math",
                f"env.eval_dataset={data}",
                "env.use_tool=false",
            ]
        )
    finally:
        server.shutdown()
    assert code == 0
    rows = [json.loads(x) for x in out.read_text().splitlines()]
    return _summary(out), rows, _VotingChat.seen


def test_eval_reports_maj_at_k_beside_avg_and_pass(tmp_path, capsys):
    summary, rows, _ = _served_eval(tmp_path)
    # 6*7: 42 twice (once in a sentence), 41, 7 -> majority 42, right.
    # 2+2: 5 twice, 4, a reply without a box (votes with its text) -> majority 5, wrong.
    # 1+1: 3 twice, 2 and `\dfrac{4}{2}` (both graded right, but different answers) -> 3, wrong.
    by_key = {r["prompt"]: r for r in rows}
    assert [by_key[q]["maj@4"] for q in ("6 times 7?", "2 plus 2?", "1 plus 1?")] == [1, 0, 0]
    assert by_key["6 times 7?"]["majority_answer"] == "42"
    assert by_key["2 plus 2?"]["majority_answer"] == "5"
    assert [s["answer"] for s in by_key["2 plus 2?"]["samples"]].count("nobox") == 1
    assert by_key["6 times 7?"]["avg@4"] == 0.5 and by_key["6 times 7?"]["pass@4"] == 1.0
    # avg@4 = (2/4 + 1/4 + 2/4) / 3; pass@4 = 1 on every problem; maj@4 = 1/3
    assert summary["avg@4"] == pytest.approx(5 / 12) == summary["pass@1"]
    assert summary["pass@4"] == 1.0 and summary["maj@4"] == pytest.approx(1 / 3)
    assert summary["prompt_template"] == "saorl"
    table = capsys.readouterr().out
    assert all(key in table for key in ("avg@4", "pass@4", "maj@4", "prompt_template"))


@pytest.mark.parametrize(
    ("flag", "expected"),
    [
        (
            "boxed",
            [
                {
                    "role": "user",
                    "content": "6 times 7?\nPlease reason step by step, and put "
                    "your final answer within \\boxed{}.",
                }
            ],
        ),
        (
            "qwen_math",
            [
                {
                    "role": "system",
                    "content": "Please reason step by step, and put your "
                    "final answer within \\boxed{}.",
                },
                {"role": "user", "content": "6 times 7?"},
            ],
        ),
        ("Q: {problem}\nA:", [{"role": "user", "content": "Q: 6 times 7?\nA:"}]),
    ],
)
def test_prompt_templates_reach_the_served_model(tmp_path, flag, expected):
    summary, _, seen = _served_eval(tmp_path, "--prompt-template", flag)
    assert next(m for m in seen if "6 times 7?" in m[-1]["content"]) == expected
    assert summary["prompt_template"] == ("custom" if "{problem}" in flag else flag)
    text = summary["prompt_template_text"]
    assert text["user"].replace("{problem}", "6 times 7?") == expected[-1]["content"]
    assert summary["maj@4"] == pytest.approx(1 / 3)  # the same replies, whatever the prompt


def test_bad_prompt_template_is_a_clear_error(capsys):
    assert main(["eval", "builtin:tiny", "--prompt-template", "deepseek"]) == 2
    err = capsys.readouterr().err
    assert "--prompt-template 'deepseek'" in err and "boxed" in err and "{problem}" in err


@pytest.mark.parametrize(
    ("votes", "rewards", "expected"),
    [
        (["42", "41", "42", "7"], [1, 0, 1, 0], ("42", 1.0)),
        (["5", "4", None, None], [0, 1, 0, 0], ("4", 1.0)),  # a tie: "4" < "5" in string order
        (["5", "4"], [0, 1], ("4", 1.0)),
        (["b", "a", "b", "a"], [1, 0, 1, 0], ("a", 0.0)),  # order of the samples does not matter
        (["a", "b", "a", "b"], [0, 1, 0, 1], ("a", 0.0)),
        ([None, None], [0, 0], (None, 0.0)),
    ],
)
def test_majority_vote_and_its_tie_rule(votes, rewards, expected):
    assert majority(votes, rewards) == expected


def test_votes_are_normalised_final_answers():
    assert vote("so $\\boxed{\\dfrac{1}{2}}$.") == vote("\\boxed{ \\frac{1}{2} }") == "\\frac{1}{2}"
    assert vote("$x = \\boxed{-2}$ and $x = \\boxed{1}$") == "-2,1"  # one answer, two boxes
    assert vote("\\boxed{1,000}") == vote("\\boxed{1000}") == "1000"
    assert vote(" 579\n") == "579"  # no box: the text itself (env 'arithmetic')
    assert vote("  ") is None


def test_the_python_api_takes_a_prompt_template(tmp_path):
    import saorl

    data = _math_file(tmp_path / "m.jsonl", 2)
    summary = saorl.evaluate(
        "builtin:tiny",
        overrides=[
            "env.name=math",
            "env.use_tool=false",
            f"env.eval_dataset={data}",
            "env.problem_key=q",
            "env.answer_key=a",
            *FAST,
            "model.max_seq_len=128",
        ],
        limit=1,
        prompt_template="boxed",
    )
    assert summary["prompt_template"] == "boxed" and "maj@1" in summary


@pytest.mark.parametrize("greedy", [True, False])
def test_greedy_eval_gives_every_sample_the_same_text(greedy):
    from tests.conftest import tiny_config

    cfg = tiny_config("rollout.max_new_tokens=6", "rollout.temperature=1.0")
    summary, rows = run_eval("builtin:tiny", cfg, k=4, limit=6, progress=False, greedy=greedy)
    assert summary["greedy"] is greedy
    distinct = [len({s["text"] for s in r["samples"]}) for r in rows]
    if greedy:
        assert distinct == [1] * 6
    else:  # sampling from a random model: some problem's samples differ
        assert max(distinct) > 1
