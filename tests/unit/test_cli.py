"""The `saorl` command line: config printing, overrides, exit codes, and no torch for --help."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path
from typing import Any

import pytest

from saorl.cli.main import main
from saorl.config import Config, ConfigError, load_config

_SRC = Path(__file__).resolve().parents[2] / "src"


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    return env


def test_print_config_reloads_to_equal_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["train", "--print-config"]) == 0
    path = tmp_path / "printed.toml"
    path.write_text(capsys.readouterr().out)
    assert load_config(path) == Config()


def test_overrides_reflected(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = tmp_path / "base.toml"
    base.write_text("[learner]\nbatch_size = 8\n")
    argv = ["train", "--config", str(base), "learner.lr=1e-5", "--print-config", "run.name=exp1"]
    assert main(argv) == 0
    path = tmp_path / "printed.toml"
    path.write_text(capsys.readouterr().out)
    cfg = load_config(path)
    assert cfg == load_config(base, ["learner.lr=1e-5", "run.name=exp1"])
    assert (cfg.learner.batch_size, cfg.learner.lr, cfg.run.name) == (8, 1e-5, "exp1")


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("algorithm.eps_low=-0.1", "algorithm.eps_low"),
        ("algorithm.eps_lo=0.1", "algorithm.eps_lo"),
        ("algorithm.name=foo", "algorithm.name"),
        ("learner.batch_size", "learner.batch_size"),
    ],
)
def test_bad_override_exits_2(override: str, key: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--print-config", override]) == 2
    captured = capsys.readouterr()
    assert key in captured.err
    assert "Traceback" not in captured.err
    assert captured.out == ""


def test_missing_config_file_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--config", str(tmp_path / "nope.toml")]) == 2
    assert "not found" in capsys.readouterr().err


def test_unknown_flag_exits_2() -> None:
    with pytest.raises(SystemExit) as info:
        main(["train", "run.name=x", "--no-such-flag"])
    assert info.value.code == 2


def test_help_config_lists_fields(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--help-config"]) == 0
    out = capsys.readouterr().out
    assert "algorithm.eps_low = 0.3" in out
    assert "critic optimizer steps per policy step" in out


def _fake_loop(monkeypatch: pytest.MonkeyPatch, result: Any) -> list[tuple[Config, str | None]]:
    """Install a stand-in `saorl.loop` (the real one trains a model)."""
    calls: list[tuple[Config, str | None]] = []

    def train_from_config(cfg: Config, resume: str | None = None) -> dict[str, Any]:
        calls.append((cfg, resume))
        if isinstance(result, Exception):
            raise result
        return result

    module = types.ModuleType("saorl.loop")
    module.train_from_config = train_from_config  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "saorl.loop", module)
    return calls


def test_train_calls_loop_and_prints_run_dir(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_loop(monkeypatch, {"run_dir": str(tmp_path / "r"), "eval/accuracy": 0.5})
    assert main(["train", "run.total_steps=3", f"run.output_dir={tmp_path}"]) == 0
    [(cfg, resume)] = calls
    assert cfg.run.total_steps == 3 and resume is None
    out = capsys.readouterr().out
    assert f"run directory: {tmp_path / 'r'}" in out
    assert "eval/accuracy: 0.5" in out


def test_printed_summary_names_a_collapse_and_failed_episodes(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    finding = {
        "signal": "eval_drop",
        "detected_step": 40,
        "step": 30,
        "reason": "eval/accuracy 0.2 < 0.5 x best 0.9",
    }
    errors = {"step: RewardFunctionError: reward function f raised KeyError: 'x'": 3}
    _fake_loop(monkeypatch, {"collapse": finding, "errors": errors, "policy_updates": 0})
    assert main(["train", "run.output_dir=out"]) == 0
    out = capsys.readouterr().out
    assert "collapse: eval_drop at step 40: eval/accuracy 0.2 < 0.5 x best 0.9" in out
    assert "failed episodes: 3 x step: RewardFunctionError: reward function f raised" in out
    assert "policy_updates: 0" in out


def test_train_without_run_dir_in_summary(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_loop(monkeypatch, {})
    assert main(["train", "run.output_dir=out", "run.name=exp"]) == 0
    assert f"run directory: {Path('out') / 'exp'}" in capsys.readouterr().out


def test_resume_uses_saved_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    calls = _fake_loop(monkeypatch, {})
    run_dir = tmp_path / "exp1"
    run_dir.mkdir()
    (run_dir / "config.toml").write_text('[run]\nname = "exp1"\ntotal_steps = 7\n')
    (run_dir / "checkpoints").mkdir()
    (run_dir / "checkpoints" / "step_00000003.pt").write_bytes(b"")  # what --resume looks for
    assert main(["train", "--resume", str(run_dir), "run.total_steps=9"]) == 0
    [(cfg, resume)] = calls
    assert (cfg.run.name, cfg.run.total_steps, resume) == ("exp1", 9, str(run_dir))


def test_resume_missing_dir_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train", "--resume", str(tmp_path / "nope")]) == 2
    assert "--resume" in capsys.readouterr().err


def test_config_error_from_loop_exits_2(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _fake_loop(monkeypatch, ConfigError("model.name_or_path: no such directory"))
    assert main(["train"]) == 2
    assert "model.name_or_path" in capsys.readouterr().err


def _printed_eval_config(capsys: pytest.CaptureFixture[str], *argv: str) -> Config:
    import tomllib

    assert main(["eval", *argv, "--print-config"]) == 0
    return Config.model_validate(tomllib.loads(capsys.readouterr().out))


def test_eval_config_is_the_runs_own(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "exp1"
    (run / "checkpoints").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "config.toml").write_text('[env]\nname = "tool_arithmetic"\neval_size = 16\n')
    ckpt = run / "checkpoints" / "step_00000002.pt"
    ckpt.write_bytes(b"")
    for model in (run, run / "final", ckpt):  # the run, its exported policy, a checkpoint
        cfg = _printed_eval_config(capsys, str(model))
        assert (cfg.env.name, cfg.env.eval_size) == ("tool_arithmetic", 16)
    cfg = _printed_eval_config(capsys, str(run), "env.eval_size=8", "run.seed=3")
    assert (cfg.env.name, cfg.env.eval_size, cfg.run.seed) == ("tool_arithmetic", 8, 3)
    other = tmp_path / "other.toml"
    other.write_text("[rollout]\ntemperature = 0.5\n")
    cfg = _printed_eval_config(capsys, str(run), "--config", str(other))  # instead of the run's
    assert (cfg.env.name, cfg.rollout.temperature) == ("arithmetic", 0.5)
    hf = tmp_path / "hf"
    hf.mkdir()
    assert _printed_eval_config(capsys, str(hf)) == Config()  # not a run: the defaults


def test_eval_bad_config_exits_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[env]\neval_size = -1\n")
    assert main(["eval", "builtin:tiny", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "saorl eval: error: env.eval_size" in err and str(bad) in err
    assert main(["eval", "builtin:tiny", "rollout.temprature=0.5"]) == 2
    assert "rollout.temperature" in capsys.readouterr().err  # the did-you-mean


def test_no_command_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main([]) == 2
    assert "train" in capsys.readouterr().err


_NO_TORCH = """
import sys
import saorl.cli.main
for argv in (["--help"], ["train", "--help"], ["eval", "--help"]):
    try:
        saorl.cli.main.main(argv)
    except SystemExit as exc:
        assert exc.code == 0, exc.code
assert saorl.cli.main.main(["train", "--print-config"]) == 0
assert saorl.cli.main.main(["eval", "builtin:tiny", "--print-config", "env.eval_size=8"]) == 0
assert saorl.cli.main.main(["train", "--help-config"]) == 0
assert "torch" not in sys.modules, "torch was imported"
print("NO_TORCH_OK")
"""


def test_help_does_not_import_torch() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _NO_TORCH],
        env=_child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert "NO_TORCH_OK" in proc.stdout


def test_python_m_saorl(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "saorl", "train", "--print-config", "learner.lr=3e-5"]
    proc = subprocess.run(cmd, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    path = tmp_path / "printed.toml"
    path.write_text(proc.stdout)
    assert load_config(path) == load_config(overrides=["learner.lr=3e-5"])

    bad = [sys.executable, "-m", "saorl", "train", "--print-config", "algorithm.eps_low=-0.1"]
    proc = subprocess.run(bad, env=_child_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "algorithm.eps_low: must be > 0, got -0.1" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_eval_results_of_two_models_do_not_overwrite_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json

    from saorl.evaluation.held_out import model_label, write_results

    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs" / "a").mkdir(parents=True)
    cfg = load_config(None, ["env.name=math", "env.dataset=math500"])
    first = write_results("runs/a", cfg.env, {"accuracy": 0.5}, [{"key": "p1", "reward": 1}], None)
    second = write_results("Qwen/Qwen3-1.7B", cfg.env, {"accuracy": 0.25}, [], None)
    assert first == Path("evals/runs_a/math500.jsonl") and first.read_text().count("\n") == 1
    assert second == Path("evals/Qwen_Qwen3-1.7B/math500.jsonl")
    assert json.loads(first.with_suffix(".summary.json").read_text()) == {"accuracy": 0.5}
    assert model_label("builtin:tiny") == "builtin_tiny"


def test_eval_of_an_agent_names_its_task(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from saorl.evaluation.held_out import task_name, write_results

    monkeypatch.chdir(tmp_path)
    (tmp_path / "my_agent.py").write_text("async def run(task, client):\n    return 1.0\n")
    cfg = load_config(None, ["env.name=agent", "env.agent.function=my_agent.py:run"])
    name = task_name(cfg.env)  # the tasks' own name: the dataset of env.agent.tasks = 'math'
    assert name == Path(cfg.env.dataset).stem and name not in ("", "agent")
    path = write_results("builtin:tiny", cfg.env, {"accuracy": 1.0}, [], None)
    assert path == Path(f"evals/builtin_tiny/{name}.jsonl")
    assert f"saorl eval: builtin:tiny on {name} (agent " in capsys.readouterr().out
