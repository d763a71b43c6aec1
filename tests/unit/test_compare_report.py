"""`saorl compare` and the multi-run report, with a fake trainer: no training runs here.

The fake writes what `saorl.loop.train_from_config` writes that the report reads
(`metrics.jsonl`, `summary.json`, `config.toml`), so arm bookkeeping (skip, resume, retry,
failure records) and the report files are tested in well under a second per test.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import saorl.compare
from saorl.cli import main
from saorl.compare import (
    ARMS,
    DEFAULT_ARMS,
    Arm,
    parse_arm,
    parse_arms,
    run_compare,
    split_arms,
    write_compare_report,
)
from saorl.config import Config, ConfigError, config_to_toml

_SRC = Path(__file__).resolve().parents[2] / "src"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(steps: int, collapse_at: int | None, eval_every: int = 10) -> list[dict[str, Any]]:
    """A rising run; with `collapse_at`, accuracy and reward fall to ~0 from that step."""
    rows: list[dict[str, Any]] = [{"step": 0, "eval/accuracy": 0.2}]
    for step in range(1, steps + 1):
        down = collapse_at is not None and step >= collapse_at
        acc = 0.01 if down else 0.2 + 0.3 * step / steps
        row: dict[str, Any] = {
            "step": step,
            "rollout/reward_mean": acc + (0.03 if step % 2 else -0.03),
            "dis/masked_frac": 0.05,
            "value/explained_variance": min(0.5, step / 100),
            "async/staleness_mean": 2.0,
            "async/dropped_stale": 1,
            "policy/entropy": 0.7,
            "time/wall_s": 0.5 * step,
        }
        if step % eval_every == 0:
            row["eval/accuracy"] = acc
        rows.append(row)
    return rows


def _write_run(run_dir: Path, steps: int = 100, collapse_at: int | None = None) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = _rows(steps, collapse_at)
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    summary = {
        "initial_eval_accuracy": evals[0],
        "final_eval_accuracy": evals[-1],
        "steps": steps,
        "dropped_stale": 1,
        "wall_seconds": 0.5 * steps,
    }
    (run_dir / "summary.json").write_text(json.dumps(summary))


class FakeTrainer:
    """Stands in for `train_from_config`: records calls, writes a run, or raises."""

    def __init__(self, fail: set[str] | None = None, collapse: dict[str, int] | None = None):
        self.calls: list[tuple[str, str | None, Config]] = []
        self.fail = fail or set()
        self.collapse = collapse or {}

    def __call__(self, cfg: Config, resume: str | None = None) -> dict[str, Any]:
        self.calls.append((cfg.run.name, resume, cfg))
        run_dir = Path(resume) if resume else Path(cfg.run.output_dir) / cfg.run.name
        if cfg.run.name in self.fail:
            raise RuntimeError(f"loss is NaN in {cfg.run.name}")
        (run_dir).mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(config_to_toml(cfg))
        _write_run(run_dir, cfg.run.total_steps, self.collapse.get(cfg.run.name))
        return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTrainer:
    trainer = FakeTrainer(fail={"boom"}, collapse={"sao_k1": 60})
    monkeypatch.setattr(saorl.compare, "train_from_config", trainer)
    return trainer


def _read_csv(path: Path) -> dict[str, dict[str, str]]:
    with path.open(newline="") as f:
        return {row["arm"]: row for row in csv.DictReader(f)}


def _assert_png(path: Path) -> None:
    assert path.is_file()
    assert path.read_bytes().startswith(_PNG_MAGIC)


# --- arms ---------------------------------------------------------------------------------


def test_builtin_arms() -> None:
    assert parse_arm("grpo") == Arm("grpo", ("algorithm.name=grpo",))
    assert parse_arm("sao_k1").overrides == ("algorithm.name=sao", "critic.updates_per_step=1")
    assert set(DEFAULT_ARMS) == {"sao", "grpo", "grpo_dis", "running_mean", "vapo"}
    for name in ("sao_no_freeze", "sao_k1", "sao_fixed_lambda", "sao_no_warmup"):
        assert name in ARMS


def test_custom_arm_syntax_keeps_commas_inside_values() -> None:
    arm = parse_arm('mine:learner.lr=1e-5, rollout.stop=["a","b"],critic.lr=2e-4')
    assert arm == Arm("mine", ("learner.lr=1e-5", 'rollout.stop=["a","b"]', "critic.lr=2e-4"))
    # A built-in name contributes its own overrides first.
    assert parse_arm("grpo:learner.lr=1e-5").overrides == (
        "algorithm.name=grpo",
        "learner.lr=1e-5",
    )
    specs = split_arms('sao, grpo,mine:learner.lr=1e-5,rollout.stop=["a","b"],vapo')
    assert specs == ["sao", "grpo", 'mine:learner.lr=1e-5,rollout.stop=["a","b"]', "vapo"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("gpro", "unknown arm 'gpro'"),
        ("bad/name:learner.lr=1", "letters, digits"),
        ("mine:learner.lrr=1e-5", "learner.lrr"),
        ("mine:", "no overrides"),
    ],
)
def test_bad_arms_fail_before_anything_runs(spec: str, message: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_arm(spec)


def test_arm_names_must_be_unique() -> None:
    with pytest.raises(ConfigError, match="unique"):
        parse_arms(["sao", "sao:learner.lr=1e-5"])


# --- run_compare --------------------------------------------------------------------------


def test_run_compare_shares_settings_and_resumes(fake: FakeTrainer, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    arms = ["sao", "sao_k1", "boom:learner.lr=1e-5", "lr_hi:learner.lr=3e-4"]
    index = run_compare(None, ["run.seed=7"], arms, out, push_every=2, steps=40)
    assert index == out / "index.html"
    assert [name for name, _, _ in fake.calls] == ["sao", "sao_k1", "boom", "lr_hi"]
    for name, resume, cfg in fake.calls:
        assert resume is None
        assert (cfg.run.seed, cfg.run.total_steps, cfg.learner.push_every) == (7, 40, 2)
        assert (cfg.run.output_dir, cfg.run.name, cfg.run.progress) == (str(out), name, False)
    by_name = {name: cfg for name, _, cfg in fake.calls}
    assert by_name["sao_k1"].critic.updates_per_step == 1
    assert by_name["lr_hi"].learner.lr == 3e-4
    assert by_name["sao"].learner.lr != 3e-4

    # The failing arm is recorded, and did not stop the arm after it.
    table = _read_csv(out / "summary.csv")
    assert table["boom"]["status"] == "failed"
    assert "RuntimeError: loss is NaN in boom" in table["boom"]["error"]
    assert table["lr_hi"]["status"] == "done"
    assert "Traceback" in json.loads((out / "boom" / "failed.json").read_text())["traceback"]

    # Second call: finished arms are skipped, the failed one is retried (and fails again).
    fake.calls.clear()
    run_compare(None, ["run.seed=7"], arms, out, push_every=2, steps=40)
    assert [name for name, _, _ in fake.calls] == ["boom"]

    # Once it works, the retry succeeds and its failure record is gone.
    fake.fail.clear()
    fake.calls.clear()
    run_compare(None, ["run.seed=7"], arms, out, push_every=2, steps=40)
    assert [name for name, _, _ in fake.calls] == ["boom"]
    assert not (out / "boom" / "failed.json").exists()
    assert _read_csv(out / "summary.csv")["boom"]["status"] == "done"


def test_run_compare_resumes_from_checkpoint_or_restarts(fake: FakeTrainer, tmp_path: Path) -> None:
    out = tmp_path / "cmp"
    # "sao" was interrupted after a checkpoint: resume it in place.
    (out / "sao" / "checkpoints").mkdir(parents=True)
    (out / "sao" / "checkpoints" / "step_00000020.pt").write_bytes(b"")
    (out / "sao" / "metrics.jsonl").write_text(json.dumps({"step": 0}) + "\n")
    # "sao_k1" was interrupted in its warm-up (no checkpoint): moved aside, started afresh.
    (out / "sao_k1").mkdir(parents=True)
    (out / "sao_k1" / "metrics.jsonl").write_text("")
    run_compare(None, [], ["sao", "sao_k1"], out, push_every=None, steps=30)
    calls = {name: resume for name, resume, _ in fake.calls}
    assert calls == {"sao": str(out / "sao"), "sao_k1": None}
    assert (out / "sao_k1.incomplete-1" / "metrics.jsonl").exists()
    assert (out / "sao_k1" / "summary.json").exists()


def test_run_compare_invalid_shared_override_raises_before_any_arm(
    fake: FakeTrainer, tmp_path: Path
) -> None:
    with pytest.raises(ConfigError, match=r"learner\.lrr"):
        run_compare(None, ["learner.lrr=1"], ["sao"], tmp_path / "cmp", None, None)
    with pytest.raises(ConfigError, match="total_steps"):
        run_compare(None, [], ["sao"], tmp_path / "cmp", None, 0)
    assert fake.calls == []


def test_an_arm_with_an_invalid_value_is_recorded_as_failed(
    fake: FakeTrainer, tmp_path: Path
) -> None:
    out = tmp_path / "cmp"
    run_compare(None, [], ["neg:algorithm.eps_low=-1", "sao"], out, None, 10)
    table = _read_csv(out / "summary.csv")
    assert table["neg"]["status"] == "failed"
    assert "eps_low" in table["neg"]["error"]
    assert table["sao"]["status"] == "done"
    assert [name for name, _, _ in fake.calls] == ["sao"]


# --- the report -------------------------------------------------------------------------


def test_write_compare_report_on_fixture_runs(tmp_path: Path) -> None:
    _write_run(tmp_path / "sao", steps=200)
    _write_run(tmp_path / "grpo", steps=200, collapse_at=160)
    _write_run(tmp_path / "vapo", steps=200, collapse_at=90)
    (tmp_path / "grpo_dis").mkdir()
    (tmp_path / "grpo_dis" / "failed.json").write_text(
        json.dumps({"error": "ValueError: <bad> & worse", "traceback": "Traceback ..."})
    )
    arms = ["sao", "grpo", "vapo", "grpo_dis", "running_mean"]
    index = write_compare_report(tmp_path, arms)

    _assert_png(tmp_path / "compare.png")
    table = _read_csv(tmp_path / "summary.csv")
    assert list(table) == arms
    assert table["sao"]["status"] == "done" and table["sao"]["collapse_step"] == ""
    assert table["grpo"]["collapse_step"] == "160"
    assert table["vapo"]["collapse_step"] == "90"
    assert "eval/accuracy" in table["grpo"]["collapse_reason"]
    assert float(table["sao"]["initial_eval_accuracy"]) == pytest.approx(0.2)
    assert float(table["sao"]["final_eval_accuracy"]) == pytest.approx(0.5)
    assert float(table["grpo"]["best_eval_accuracy"]) == pytest.approx(0.2 + 0.3 * 150 / 200)
    assert table["grpo"]["best_eval_step"] == "150"
    assert table["sao"]["steps"] == "200"
    assert float(table["sao"]["wall_seconds"]) == pytest.approx(100.0)
    assert float(table["sao"]["staleness_mean"]) == pytest.approx(2.0)
    assert table["sao"]["dropped_stale"] == "1"
    assert table["grpo_dis"]["status"] == "failed"
    assert table["running_mean"]["status"] == "missing"
    assert table["grpo"]["overrides"] == "algorithm.name=grpo"

    page = index.read_text()
    assert index == tmp_path / "index.html"
    assert "data:image/png;base64," in page  # compare.png is embedded: one file to share
    for arm in arms:
        assert f">{arm}<" in page
    assert ">160<" in page and ">90<" in page
    assert "ValueError: &lt;bad&gt; &amp; worse" in page  # escaped, not injected


def test_incomplete_run_is_reported_from_its_metrics(tmp_path: Path) -> None:
    _write_run(tmp_path / "sao", steps=50)
    (tmp_path / "sao" / "summary.json").unlink()  # still running, or killed
    write_compare_report(tmp_path, ["sao"])
    row = _read_csv(tmp_path / "summary.csv")["sao"]
    assert row["status"] == "incomplete"
    assert row["steps"] == "50"
    assert float(row["wall_seconds"]) == pytest.approx(25.0)
    assert float(row["final_eval_accuracy"]) == pytest.approx(0.5)


# --- CLI ----------------------------------------------------------------------------------


def test_cli_report_several_runs_writes_comparison_png(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path / "a", steps=60)
    _write_run(tmp_path / "b", steps=60, collapse_at=30)
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "compare.png")
    _assert_png(tmp_path / "compare.png")

    out = tmp_path / "figs" / "ab.png"
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "b"), "--out", str(out)]) == 0
    _assert_png(out)
    # One directory behaves as before.
    assert main(["report", str(tmp_path / "a")]) == 0
    _assert_png(tmp_path / "a" / "report.png")


def test_cli_report_several_runs_missing_one_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write_run(tmp_path / "a", steps=20)
    assert main(["report", str(tmp_path / "a"), str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err


def test_cli_compare(fake: FakeTrainer, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cmp"
    argv = ["compare", "--arms", "sao,boom:learner.lr=1e-5", "--out", str(out), "--steps", "20"]
    assert main([*argv, "run.seed=3", "--push-every", "2"]) == 1  # an arm failed
    captured = capsys.readouterr()
    assert captured.out.strip() == str(out / "index.html")
    assert "failed arms: boom" in captured.err
    assert [(n, c.run.seed, c.learner.push_every) for n, _, c in fake.calls] == [
        ("sao", 3, 2),
        ("boom", 3, 2),
    ]
    fake.fail.clear()
    assert main([*argv, "run.seed=3", "--push-every", "2"]) == 0
    assert main(["compare", "--arms", "gpro", "--out", str(out)]) == 2
    assert "unknown arm 'gpro'" in capsys.readouterr().err


def test_cli_compare_default_arms_each_get_a_row(fake: FakeTrainer, tmp_path: Path) -> None:
    # Whether a baseline validates depends on the algorithms the config knows; either way
    # every default arm gets a row (done, or failed with the reason).
    main(["compare", "--out", str(tmp_path), "--steps", "10"])
    assert list(_read_csv(tmp_path / "summary.csv")) == list(DEFAULT_ARMS)


def test_compare_and_report_modules_do_not_import_torch() -> None:
    code = (
        "import sys, saorl.cli, saorl.compare, saorl.collapse, saorl.report\n"
        "try:\n    saorl.cli.main(['compare', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "sys.exit(f'imported: {bad}' if bad else 0)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
