"""`saorl train` and `saorl eval` on reasoning-gym's chain_sum with the built-in tiny model
(warm-up included), and the exit status and message of every refused reasoning-gym config."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

TINY = [
    "env.name=reasoning_gym",
    'env.reasoning_gym.datasets=["chain_sum"]',
    "env.use_tool=false",
    "env.reasoning_gym.answer_format=plain",
    "env.instructions=false",
    "env.eval_size=8",
    "env.args={chain_sum={min_terms=2, max_terms=2, min_digits=1, max_digits=1, size=1000}}",
    "model.hidden_size=32",
    "model.intermediate_size=64",
    "model.max_seq_len=96",
    "learner.batch_size=8",
    "learner.sft_steps=3",
    "learner.sft_batch_size=8",
    "rollout.max_concurrent=8",
    "rollout.max_new_tokens=4",
    "critic.warmup_steps=1",
    "run.eval_every=0",
    "run.eval_samples=1",
    "run.progress=false",
    "run.total_steps=2",
]


def _saorl(*args: str, pre: str = "pass") -> subprocess.CompletedProcess[str]:
    code = f"import sys; {pre}; from saorl.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )


def test_train_then_eval_on_chain_sum(tmp_path: Path) -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (the dev extra)")
    out = _saorl("train", *TINY, f"run.output_dir={tmp_path}", "run.name=rg")
    assert out.returncode == 0, out.stderr[-3000:]
    # In-flight tasks are kept by their index in the training list, so a resume loses none.
    assert "checkpoint without" not in out.stderr
    run = tmp_path / "rg"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2
    assert 0.0 <= summary["final_eval_accuracy"] <= 1.0
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows if "eval/accuracy" in r] == [0, 2]
    # The run's config.toml holds everything `saorl eval` needs to rebuild the held-out set.
    out = _saorl("eval", str(run), "--out", str(tmp_path / "eval.jsonl"))
    assert out.returncode == 0, out.stderr[-3000:]
    rows = [json.loads(x) for x in (tmp_path / "eval.jsonl").read_text().splitlines()]
    assert len(rows) == 8 and all(r["key"].startswith("chain_sum/") for r in rows)
    assert all(r["prompt"].startswith("State the final answer") for r in rows)
    summary = json.loads((tmp_path / "eval.summary.json").read_text())
    assert summary["problems"] == 8 and 0.0 <= summary["pass@1"] <= 1.0


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (['env.reasoning_gym.datasets=["chain_summ"]'], "did you mean chain_sum"),
        (["env.args={leg_counting={weight=2}}"], "env.args.leg_counting: not one of"),
        (["env.args={chain_sum={min_term=2}}"], "chain_sum's settings: min_terms"),
    ],
)
def test_refused_configs_exit_2(tmp_path: Path, overrides: list[str], message: str) -> None:
    pytest.importorskip("reasoning_gym", reason="reasoning-gym not installed (the dev extra)")
    args = [a for a in TINY if not a.startswith("env.args")]
    out = _saorl("train", *args, *overrides, f"run.output_dir={tmp_path}")
    assert out.returncode == 2, out.stderr[-3000:]
    assert message in out.stderr


def test_without_the_package_it_names_the_extra(tmp_path: Path) -> None:
    # None in sys.modules makes `import reasoning_gym` fail as if it were not installed.
    out = _saorl(
        "train", *TINY, f"run.output_dir={tmp_path}", pre="sys.modules['reasoning_gym'] = None"
    )
    assert out.returncode == 2, out.stderr[-3000:]
    assert "pip install 'saorl[reasoning-gym]'" in out.stderr
    assert not list(tmp_path.iterdir())  # no run directory left behind
