"""Bring your own task, end to end: a user reward function over a verl Parquet file and over a
TRL conversational JSON-lines file, each trained by `saorl train` and evaluated by `saorl eval`,
in one process and under `--ray` (local Ray)."""

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
]
# 64 new tokens: about half of a random model's completions end with EOS within them, and only
# those reach the reward functions (a completion cut by the budget gets 0 without a call).

# Reads a column only verl rows have (data_source) and one only the TRL rows have (solution), so
# the test proves every column of the row arrives as a keyword argument.
REWARDS = """
def length_bonus(completion, messages, **row):
    assert messages and messages[-1]["role"] == "assistant", messages
    assert "data_source" in row or "solution" in row, sorted(row)
    return len(completion) / 100.0
"""


def _verl_parquet(path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (in the dev extra)")
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": f"{i}+{i}?"}],
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"index": i},
        }
        for i in range(16)
    ]
    pq.write_table(pa.Table.from_pylist(rows), path)


def _trl_conversational(path: Path) -> None:
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{i}+{i}?"},
            ],
            "answer": str(2 * i),
            "solution": f"{i}+{i}={2 * i}",
        }
        for i in range(16)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


LAYOUTS = {
    "verl_parquet": ("train.parquet", _verl_parquet),
    "trl_conversational": ("train.jsonl", _trl_conversational),
}


def _saorl(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "saorl", *args], cwd=cwd, capture_output=True, text=True, timeout=400
    )


# Each layout in one process; under Ray one layout is enough (what Ray adds is the same for
# both: the user's files resolved on the actors), and each Ray run costs about a minute of CI.
@pytest.mark.parametrize(
    "layout, ray",
    [
        ("trl_conversational", False),
        ("verl_parquet", False),
        pytest.param("verl_parquet", True, marks=pytest.mark.slow),
    ],
    ids=["trl_conversational-in-process", "verl_parquet-in-process", "verl_parquet-ray"],
)
def test_reward_function_over_a_dataset_trains_and_evaluates(tmp_path, layout, ray):
    if ray:
        pytest.importorskip("ray")
    name, write = LAYOUTS[layout]
    write(tmp_path / name)
    (tmp_path / "rewards.py").write_text(REWARDS)
    topology = ["--ray", "ray.num_cpus=2"] if ray else []
    train = _saorl(
        "train",
        *topology,
        *TINY,
        f"env.dataset={name}",
        'env.reward_fns=["rewards.py:length_bonus"]',
        "run.output_dir=runs",
        "run.name=r",
        cwd=tmp_path,
    )
    assert train.returncode == 0, train.stderr[-4000:]
    run = tmp_path / "runs" / "r"
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    trained = [r for r in rows if r.get("step", 0) > 0]
    assert len(trained) == 2
    # No episode failed in the user's function, and its mean over the scored episodes is logged.
    assert all(r["rollout/failed"] == 0 for r in trained)
    scored = [r["reward/length_bonus"] for r in trained if "reward/length_bonus" in r]
    assert scored and all(v > 0 for v in scored)
    # The run's config names the files by absolute path: eval from elsewhere finds them (its
    # reward function is code the run folder names: run only when trusted).
    out = tmp_path / "eval.jsonl"
    ev = _saorl(
        "eval",
        str(run),
        "--limit",
        "2",
        "--out",
        str(out),
        "--trust-remote-code",
        cwd=tmp_path.parent,
    )
    assert ev.returncode == 0, ev.stderr[-4000:]
    results = [json.loads(x) for x in out.read_text().splitlines()]
    assert len(results) == 2
