"""The README's "Your own task" dataset commands run as written, from an empty folder: the files
it shows (`rewards.py`, `train.jsonl`) written there, the shipped example copied there, each
command run for two steps."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FAST = [
    "run.total_steps=2",
    "run.eval_every=0",
    "learner.batch_size=4",
    "rollout.max_concurrent=4",
    "critic.warmup_steps=1",
    "run.progress=false",
]


def _section() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Your own task")
    return text[start : text.index("\n## ", start + 1)]


def _blocks(section: str, lang: str) -> list[str]:
    return re.findall(rf"```{lang}\n(.*?)```", section, flags=re.S)


def test_readme_own_dataset_commands_run_as_written(tmp_path: Path) -> None:
    section = _section()
    (rewards,) = [b for b in _blocks(section, "python") if "# rewards.py" in b]
    (rows,) = _blocks(section, "jsonl")
    (tmp_path / "rewards.py").write_text(rewards)
    (tmp_path / "train.jsonl").write_text(rows)
    shutil.copytree(ROOT / "examples/own_task", tmp_path / "examples/own_task")
    shutil.copy(ROOT / "examples/own_task.toml", tmp_path / "examples/own_task.toml")
    (block,) = [b for b in _blocks(section, "bash") if "env.dataset=train.jsonl" in b]
    commands = [shlex.split(c) for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert len(commands) == 2 and all(c[:2] == ["saorl", "train"] for c in commands)
    for i, command in enumerate(commands):
        out = f"run.output_dir=runs{i}"
        run = subprocess.run(
            [sys.executable, "-m", "saorl", *command[1:], *FAST, out],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=500,
        )
        assert run.returncode == 0, (command, run.stderr[-4000:])
        (summary_path,) = (tmp_path / f"runs{i}").glob("*/summary.json")
        summary = json.loads(summary_path.read_text())
        assert summary["steps"] == 2 and summary["errors"] == {}
        assert summary["policy_updates"] == 1 and summary["critic_only_steps"] == 1
        assert "<unk>" not in run.stderr  # no newline read as <unk> by the built-in model


def test_readme_own_environment_command_runs_as_written(tmp_path: Path) -> None:
    (block,) = [b for b in _blocks(_section(), "bash") if "custom_env.py" in b]
    (command,) = [shlex.split(c) for c in block.replace("\\\n", " ").splitlines() if c.strip()]
    assert command[:2] == ["saorl", "train"]
    (tmp_path / "examples").mkdir()
    shutil.copy(ROOT / "examples/custom_env.py", tmp_path / "examples/custom_env.py")
    # Its supervised warm-up shortened too: what runs is the command's env, model and settings.
    fast = [*FAST, "learner.sft_steps=10", "run.output_dir=runs"]
    run = subprocess.run(
        [sys.executable, "-m", "saorl", *command[1:], *fast],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=500,
    )
    assert run.returncode == 0, (command, run.stderr[-4000:])
    (summary_path,) = (tmp_path / "runs").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert summary["steps"] == 2 and summary["errors"] == {} and summary["policy_updates"] == 1
