"""`saorl train` on datasets in the layouts people already have: a TRL conversational JSON-lines
file and a verl Parquet file, a tiny model, two steps each."""

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
    "model.max_seq_len=96",
    "learner.batch_size=8",
    "learner.sft_steps=0",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=6",
    "critic.warmup_steps=1",
    "run.eval_every=0",
    "run.progress=false",
    "run.total_steps=2",
]


def _train(tmp_path: Path, dataset: Path, *overrides: str) -> dict:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            *TINY,
            f"env.dataset={dataset}",
            f"run.output_dir={tmp_path / 'runs'}",
            "run.name=r",
            *overrides,
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads((tmp_path / "runs" / "r" / "summary.json").read_text())


def test_train_on_a_trl_conversational_file(tmp_path: Path) -> None:
    path = tmp_path / "conv.jsonl"
    rows = [
        {
            "prompt": [
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": f"{i}+{i}?"},
            ],
            "answer": str(2 * i),
            "solution": f"{i}+{i}={2 * i}",
        }
        for i in range(12)
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    summary = _train(tmp_path, path, "env.system_prompt=ignored: the rows have their own")
    assert summary["steps"] == 2


def test_train_on_a_verl_parquet_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow", reason="pyarrow not installed (in the dev extra)")
    import pyarrow.parquet as pq

    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": f"{i}+{i}? Answer after ####."}],
            "ability": "math",
            "reward_model": {"style": "rule", "ground_truth": str(2 * i)},
            "extra_info": {"split": "train", "index": i},
        }
        for i in range(12)
    ]
    path = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows), path)
    summary = _train(tmp_path, path, "env.instructions=false", "env.system_prompt=Be brief.")
    assert summary["steps"] == 2


def test_train_math_with_python_function_tools(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(
        "def add(a: int, b: int) -> int:\n    '''Add two integers.'''\n    return a + b\n"
    )
    path = tmp_path / "plain.jsonl"
    path.write_text(
        "".join(
            json.dumps({"problem": f"{i}+{i}?", "answer": str(2 * i)}) + "\n" for i in range(12)
        )
    )
    # The tool instructions and schemas make a 190-token prompt: 96 would leave no room (stopped
    # before step 1 since issue 27; it used to train on empty rollouts).
    summary = _train(
        tmp_path,
        path,
        "env.use_tool=true",
        "env.tool_format=hermes",
        f'env.tools=["{tmp_path / "tools.py"}:add"]',
        "model.max_seq_len=256",
    )
    assert summary["steps"] == 2
