"""Metrics JSONL logging and reading, the progress display, run plots and `saorl report`."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from saorl.cli.main import main
from saorl.monitoring.metrics import MetricsLogger, TrainProgress, read_metrics
from saorl.monitoring.report import plot_run, report_run

_SRC = Path(__file__).resolve().parents[2] / "src"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _synthetic_rows(n: int = 40, eval_every: int | None = 10) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    for step in range(1, n + 1):
        rows.append(
            {
                "step": step,
                "rollout/reward_mean": 0.2 + 0.5 * step / n + 0.05 * math.sin(step),
                "loss/policy": 0.1 / step,
                "loss/value": 1.0 / step,
                "value/explained_variance": 1 - 1 / step,
                "dis/masked_frac": 0.02,
                "dis/masked_frac_below": 0.015,
                "dis/masked_frac_above": 0.005,
                "async/staleness_mean": 1.5,
                "async/staleness_max": 3,
                "perf/learner_idle_frac": 0.1,
                "perf/rollout_tokens_per_s": 25_000.0 + step,
            }
        )
        if eval_every and step % eval_every == 0:
            rows.append({"step": step, "eval/accuracy": step / (2 * n)})
    return rows


def _assert_png(path: Path) -> None:
    assert path.is_file()
    data = path.read_bytes()
    assert data.startswith(_PNG_MAGIC)
    assert len(data) > 1000


def test_logger_round_trip_nan_null_and_numpy(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path / "run") as log:
        log.log({"step": 1, "loss/policy": float("nan"), "rollout/reward_mean": np.float32(0.5)})
        log.log({"step": np.int64(2), "loss/value": float("inf"), "perf/tokens_per_s": 3})
    path = tmp_path / "run" / "metrics.jsonl"
    lines = path.read_text().splitlines()
    assert len(lines) == 2
    assert "NaN" not in lines[0] and "Infinity" not in lines[1]
    rows = read_metrics(path)
    assert rows == [
        {"step": 1, "loss/policy": None, "rollout/reward_mean": 0.5},
        {"step": 2, "loss/value": None, "perf/tokens_per_s": 3},
    ]
    assert isinstance(rows[1]["step"], int)


def test_logger_resume_appends(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log:
        log.log({"step": 1, "x": 1.0})
    with MetricsLogger(tmp_path) as log:  # a resumed run continues the same file
        log.log({"step": 2, "x": 2.0})
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [1, 2]


def test_logger_resume_after_crash_drops_partial_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1, "x": 1.0}\n{"step": 2, "x"')  # crashed mid-write
    with pytest.warns(UserWarning, match="unfinished"), MetricsLogger(tmp_path) as log:
        log.log({"step": 2, "x": 2.0})
    assert read_metrics(path) == [{"step": 1, "x": 1.0}, {"step": 2, "x": 2.0}]


def test_logger_rejects_non_scalar(tmp_path: Path) -> None:
    with MetricsLogger(tmp_path) as log, pytest.raises(TypeError, match="bad"):
        log.log({"bad": [1, 2]})


def test_read_metrics_skips_truncated_last_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "loss/po')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:3"):
        rows = read_metrics(path)
    assert rows == [{"step": 1}, {"step": 2}]


def test_read_metrics_raises_on_bad_middle_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    path.write_text('{"step": 1}\n{"step": 2, oops}\n{"step": 3}\n')
    with pytest.raises(ValueError, match=r"metrics.jsonl:2"):
        read_metrics(path)


@pytest.mark.parametrize("eval_every", [10, None])
def test_plot_run_writes_png(tmp_path: Path, eval_every: int | None) -> None:
    out = plot_run(_synthetic_rows(eval_every=eval_every), tmp_path / "r.png", title="demo")
    assert out == tmp_path / "r.png"
    _assert_png(out)


def test_plot_run_tolerates_missing_keys_and_nulls(tmp_path: Path) -> None:
    rows: list[dict[str, Any]] = [
        {"step": 1, "rollout/reward_mean": None},
        {"step": 2, "rollout/reward_mean": 0.5, "loss/policy": None},
        {"rollout/reward_mean": 0.7},  # no step: skipped
        {"step": 3, "eval/accuracy": 0.25, "other": "text"},
        {"step": 3, "rollout/reward_mean": 0.6},
    ]
    _assert_png(plot_run(rows, tmp_path / "a.png"))
    _assert_png(plot_run([{"foo": 1}], tmp_path / "b.png"))  # nothing plottable
    _assert_png(plot_run([], tmp_path / "c.png"))


def test_report_cli_writes_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "exp1"
    with MetricsLogger(run) as log:
        for row in _synthetic_rows(n=20, eval_every=5):
            log.log(row)
    assert main(["report", str(run)]) == 0
    assert capsys.readouterr().out.strip() == str(run / "report.png")
    _assert_png(run / "report.png")


def test_report_cli_missing_dir_or_metrics_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert main(["report", str(tmp_path)]) == 2  # exists, no metrics.jsonl
    assert "metrics.jsonl" in capsys.readouterr().err
    (tmp_path / "metrics.jsonl").write_text("")
    assert main(["report", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert "empty" in captured.err and "Traceback" not in captured.err


def test_report_run_raises_on_empty(tmp_path: Path) -> None:
    (tmp_path / "metrics.jsonl").write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        report_run(tmp_path)


def test_cli_import_is_light() -> None:
    code = (
        "import sys, saorl.cli.main, saorl.monitoring.metrics, saorl.monitoring.report; "
        "bad = [m for m in ('torch', 'matplotlib', 'rich') if m in sys.modules]; "
        "sys.exit(f'imported at module level: {bad}' if bad else 0)"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


def test_train_progress_disabled_prints_sparse_lines(capsys: pytest.CaptureFixture[str]) -> None:
    with TrainProgress(total_steps=100, enabled=False) as progress:
        for step in range(1, 101):
            metrics: dict[str, Any] = {
                "rollout/reward_mean": step / 100,
                "perf/rollout_tokens_per_s": 12_345.0,
                "async/staleness_mean": float("nan"),
            }
            if step % 25 == 0:
                metrics["eval/accuracy"] = step / 200
            progress.update(step, metrics)
    captured = capsys.readouterr()
    lines = (captured.out + captured.err).splitlines()
    assert 1 <= len(lines) <= 11
    assert lines[-1].startswith("step 100/100")
    assert "eval acc 0.500" in lines[-1] and "12.3k" in lines[-1]
    # the accuracy of step 25 is still shown at step 30, where no evaluation ran
    assert any(line.startswith("step 30/100") and "eval acc 0.125" in line for line in lines)


def test_train_progress_resume_and_phase(capsys: pytest.CaptureFixture[str]) -> None:
    with TrainProgress(total_steps=50, enabled=False, initial_step=20) as progress:
        with progress.phase("warm-up", total=3) as phase:
            for _ in range(3):
                phase.advance()
        for step in range(21, 38):  # stopped at 37: the last step is still reported on exit
            progress.update(step, {})
    lines = capsys.readouterr().err.splitlines()
    assert lines[0].startswith("warm-up: started")
    assert lines[1].startswith("warm-up: done 3/3")
    assert [line.split()[1] for line in lines[2:]] == ["25/50", "30/50", "35/50", "37/50"]


def test_train_progress_phase_without_with_block(capsys: pytest.CaptureFixture[str]) -> None:
    with TrainProgress(total_steps=10, enabled=False) as progress:
        bar = progress.phase("warm-up", 2)
        bar.advance()
        bar.advance()  # reaching the total ends the phase
        bar.advance()  # ignored
        progress.phase("eval", 5).advance(2)  # still open when the display closes
    lines = capsys.readouterr().err.splitlines()
    assert [line for line in lines if "done" in line] == [
        "warm-up: done 2/2 in 0:00:00",
        "eval: done 2/5 in 0:00:00",
    ]


def test_train_progress_live_display_runs(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(sys.stdout, "isatty", lambda: True)  # pretend to be a terminal
    with TrainProgress(total_steps=5, initial_step=1) as progress:
        assert progress.live
        with progress.phase("eval", total=2):
            progress.advance()
            progress.advance()
        for step in range(2, 6):
            progress.update(step, {"rollout/reward_mean": 0.5, "eval/accuracy": 0.25})
    captured = capsys.readouterr()
    assert "eval acc 0.250" in captured.out
    assert "step " not in captured.err  # no plain lines in live mode


def test_run_figure_shades_critic_only_steps_marks_collapse_and_skips_tool_calls() -> None:
    from saorl.monitoring.report import run_figure

    rows = _synthetic_rows()
    for row in rows[:8]:
        row["learner/warmup"] = 1.0
    for row in rows:  # a tool-free env logs eval/tool_calls_mean (0) but no rollout one
        row["eval/tool_calls_mean"] = 0.0
    finding = {"signal": "eval_drop", "detected_step": 30, "step": 20, "reason": "r"}
    fig = run_figure(rows, "demo", collapse=finding)
    titles = [ax.get_title() for ax in fig.axes]
    assert "tool calls per episode" not in titles
    assert "learner idle fraction (cumulative since step 1)" in titles
    assert "rollout throughput (tokens/s, cumulative mean)" in titles
    assert fig._suptitle.get_text() == "demo: collapse (eval_drop) at step 30"
    for ax in fig.axes:
        (span,) = ax.patches  # the critic-only phase, steps 1-8
        assert span.get_label() == "critic only (critic.warmup_steps)"
        assert (span.get_x(), span.get_x() + span.get_width()) == (0.5, 8.5)
        marks = [ln for ln in ax.lines if ln.get_label() == "collapse (eval_drop)"]
        assert len(marks) == 1 and list(marks[0].get_xdata()) == [30, 30]
    rows = _synthetic_rows()
    rows[0]["rollout/tool_calls_mean"] = 1.0
    assert "tool calls per episode" in [ax.get_title() for ax in run_figure(rows).axes]


def test_compare_plots_shade_each_arm_s_critic_only_steps(tmp_path: Path, monkeypatch) -> None:
    import saorl.monitoring.report as report

    drawn: list[tuple[Any, list[Any]]] = []
    save = report._save_with_legend

    def keep(fig: Any, handles: list[Any], out_png: Path) -> Path:
        drawn.append((fig, handles))
        return save(fig, handles, out_png)

    monkeypatch.setattr(report, "_save_with_legend", keep)
    sao, grpo = _synthetic_rows(), _synthetic_rows()
    for row in sao[:10]:  # sao's first 10 steps update only its critic; grpo has none
        row["learner/warmup"] = 1.0
    report.plot_compare({"sao": sao, "grpo": grpo}, tmp_path / "c.png")
    report.plot_compare_seeds({"sao": [sao, sao], "grpo": [grpo]}, tmp_path / "s.png")
    assert (tmp_path / "c.png").is_file() and (tmp_path / "s.png").is_file()
    for fig, handles in drawn:
        labels = [h.get_label() for h in handles]
        assert "[critic only, shaded: steps 1-10]" in labels[0] and "critic only" not in labels[1]
        for ax in fig.axes:
            spans = [p for p in ax.patches if p.get_width() == 10]  # steps 0.5-10.5
            assert len(spans) == 1 and spans[0].get_x() == 0.5
