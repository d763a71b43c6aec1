"""A user's own task the first time: reward functions written for TRL and for verl train
unchanged, and a reward function that raises stops the run at once with its message and
traceback (exit 2), in one process and under `--ray`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "env.name=math",
    "env.use_tool=false",
    "env.eval_size=4",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=160",
    "learner.batch_size=8",
    "learner.sft_steps=0",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=64",
    "env.instructions=false",
    "critic.warmup_steps=1",
    "run.eval_every=0",
    "run.progress=false",
    "run.total_steps=2",
    "run.output_dir=runs",
    "run.name=r",
]

# As written for TRL's GRPOTrainer (conversational data: completions are message lists) and for
# verl's reward manager; not a line changed for saorl.
REWARDS = """
def accuracy_reward(completions, answer, **kwargs):
    contents = [completion[0]["content"] for completion in completions]
    return [float(a in c) + 0.01 * len(c) for c, a in zip(contents, answer)]


def compute_score(data_source, solution_str, ground_truth, extra_info=None):
    assert data_source == "toy" and extra_info["index"] >= 0
    return {"score": float(ground_truth in solution_str) + 0.01 * len(solution_str), "n": 1.0}


def broken(completion, **kwargs):
    return helper(completion)


def helper(text):
    raise KeyError("no_such_column")


def needs_column(completion, difficulty):
    return 1.0
"""


def _rows(verl: bool) -> list[dict]:
    rows = []
    for i in range(16):
        prompt = [{"role": "user", "content": f"{i}+{i}?"}]
        if verl:
            rows.append(
                {
                    "data_source": "toy",
                    "prompt": prompt,
                    "extra_info": {"index": i},
                    "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
                }
            )
        else:
            rows.append({"prompt": prompt, "answer": str(2 * i)})
    return rows


def _setup(tmp_path: Path, verl: bool) -> str:
    (tmp_path / "rewards.py").write_text(REWARDS)
    if verl:
        pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (in the dev extra)")
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(_rows(True)), tmp_path / "train.parquet")
        return "train.parquet"
    rows = _rows(False)
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return "train.jsonl"


def _train(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saorl", "train", *args, *TINY],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )


@pytest.mark.parametrize("fn, verl", [("accuracy_reward", False), ("compute_score", True)])
def test_trl_and_verl_reward_functions_train_unchanged(tmp_path: Path, fn: str, verl: bool):
    data = _setup(tmp_path, verl)
    run = _train(tmp_path, f"env.dataset={data}", f'env.reward_fns=["rewards.py:{fn}"]')
    assert run.returncode == 0, run.stderr[-4000:]
    rows = [json.loads(x) for x in (tmp_path / "runs/r/metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("step", 0) > 0]
    assert len(trained) == 2 and all(r["rollout/failed"] == 0 for r in trained)
    scored = [r[f"reward/{fn}"] for r in trained if f"reward/{fn}" in r]
    assert scored and all(v > 0 for v in scored)  # every scored completion has some length
    if verl:  # the dict's other numbers are logged beside the score
        assert all(
            r["reward/compute_score/n"] == 1.0 for r in trained if "reward/compute_score/n" in r
        )
    summary = json.loads((tmp_path / "runs/r/summary.json").read_text())
    assert summary["errors"] == {}


@pytest.mark.parametrize(
    "ray", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["in-process", "ray"]
)
def test_a_raising_reward_function_stops_the_run_with_its_message(tmp_path: Path, ray: bool):
    if ray:
        pytest.importorskip("ray")
    data = _setup(tmp_path, verl=False)
    topology = ["--ray", "ray.num_cpus=2"] if ray else []
    run = _train(tmp_path, *topology, f"env.dataset={data}", 'env.reward_fns=["rewards.py:broken"]')
    assert run.returncode == 2, run.stderr[-4000:]
    message = "step: RewardFunctionError: reward function broken raised KeyError: 'no_such_column'"
    # Printed once with the user's frames, then named in the error that ends the run.
    assert run.stderr.count("episode failed (task ") == 1, run.stderr[-4000:]
    assert message in run.stderr
    assert "rewards.py" in run.stderr and "in helper" in run.stderr
    last = run.stderr.strip().splitlines()[-1]
    assert "the most common error" in last and message in last
    assert not (tmp_path / "runs/r/final").exists()


def test_a_missing_column_is_reported_at_start_up(tmp_path: Path):
    data = _setup(tmp_path, verl=False)
    run = _train(tmp_path, f"env.dataset={data}", 'env.reward_fns=["rewards.py:needs_column"]')
    assert run.returncode == 2
    assert "needs_column() requires difficulty" in run.stderr
    assert "columns: answer, prompt" in run.stderr
    assert not (tmp_path / "runs").exists()  # before any run directory is made


def test_the_run_records_the_held_out_split_it_resolved(tmp_path: Path):
    # env.eval_size unset: a tenth of the 16 rows (1) is held out. The run's config is not
    # changed; its config.toml records the count, so `saorl eval RUN` splits the same way.
    from saorl.api import eval_config
    from saorl.envs.factory import build_env

    data = _setup(tmp_path, verl=False)
    unset = [a for a in TINY if not a.startswith("env.eval_size=")]
    run = subprocess.run(
        [sys.executable, "-m", "saorl", "train", f"env.dataset={data}", *unset],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    saved = (tmp_path / "runs/r/config.toml").read_text()
    assert "\neval_size = 1\n" in saved
    cfg = eval_config(tmp_path / "runs/r", trust_remote_code=True)  # it names a data file
    held_out = build_env(cfg.env, held_out_only=True).task.held_out
    assert [p.answer for p in held_out] == ["30"]  # the file's last row, as in training
