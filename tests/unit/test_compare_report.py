"""`saorl compare` and the multi-run report, with a fake trainer: no training runs here.

The fake writes what `saorl.loop.train_from_config` writes that the report reads
(`metrics.jsonl`, `summary.json`, `config.toml`), so arm bookkeeping (skip, resume, retry,
failure records, seeds) and the report files (per run, per arm over seeds, the band plot) are
tested in well under a second per test. A real tiny `saorl compare --seeds 2 --jobs 2` run is
in tests/e2e/test_compare_seeds.py.
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

import saorl.experiments.compare
from saorl.cli.main import main
from saorl.config import Config, ConfigError, config_to_toml, load_config
from saorl.experiments.arms import ABLATIONS, arm_components, components_table
from saorl.experiments.compare import (
    ARMS,
    DEFAULT_ARMS,
    Arm,
    failed_runs,
    parse_arm,
    parse_arms,
    plan_runs,
    run_compare,
    split_arms,
    write_compare_report,
)
from saorl.monitoring.collapse import detect_collapse
from saorl.monitoring.report import _COMPARE_PANELS, seed_bands

_SRC = Path(__file__).resolve().parents[2] / "src"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _rows(
    steps: int, collapse_at: int | None, eval_every: int = 10, gain: float = 0.3
) -> list[dict[str, Any]]:
    """A rising run (by `gain`); with `collapse_at`, accuracy and reward fall to ~0 from there."""
    rows: list[dict[str, Any]] = [{"step": 0, "eval/accuracy": 0.2}]
    for step in range(1, steps + 1):
        down = collapse_at is not None and step >= collapse_at
        acc = 0.01 if down else 0.2 + gain * step / steps
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


def _write_run(
    run_dir: Path, steps: int = 100, collapse_at: int | None = None, gain: float = 0.3
) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    rows = _rows(steps, collapse_at, gain=gain)
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
        # The arm: the run's name, or with several seeds (OUT/ARM/seedS) its directory's.
        arm = Path(cfg.run.output_dir).name if cfg.run.name.startswith("seed") else cfg.run.name
        if arm in self.fail:
            raise RuntimeError(f"loss is NaN in {arm}")
        (run_dir).mkdir(parents=True, exist_ok=True)
        (run_dir / "config.toml").write_text(config_to_toml(cfg))
        _write_run(run_dir, cfg.run.total_steps, self.collapse.get(arm))
        return json.loads((run_dir / "summary.json").read_text())


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeTrainer:
    trainer = FakeTrainer(fail={"boom"}, collapse={"sao_k1": 60})
    monkeypatch.setattr(saorl.experiments.compare, "train_from_config", trainer)
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
    for name in ("sao_no_freeze", "sao_k1", "sao_fixed_lambda", "sao_no_warmup", "sao_ppo_clip"):
        assert name in ARMS


def test_the_arms_of_the_choices_the_paper_leaves_open() -> None:
    # Reef's per-sample loss aggregation beside saorl's token_mean; GRPO without the std.
    seq = load_config(None, list(parse_arm("sao_seq_mean").overrides))
    assert seq.algorithm.loss_agg == "seq_mean_token_mean"
    assert arm_components(seq)["loss"] == "dis (band 0.3/5), seq_mean_token_mean"
    no_std = load_config(None, list(parse_arm("grpo_no_std").overrides))
    assert no_std.algorithm.name == "grpo" and not no_std.algorithm.group_std_norm
    assert arm_components(no_std)["advantage"] == "group (R - mean within the group, no std)"
    assert load_config(None, list(ARMS["grpo"])).algorithm.group_std_norm  # GRPO's default


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
    # The report's collapse step is the detector's on the run's rows (saorl.monitoring.collapse,
    # tested there): at or shortly after the step the fixture collapses.
    for arm, at in (("grpo", 160), ("vapo", 90)):
        expected = detect_collapse(_rows(200, at))
        assert expected is not None and at <= expected["step"] <= at + 10
        assert table[arm]["collapse_step"] == str(expected["step"])
        assert table[arm]["collapse_reason"] == expected["reason"]
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
    assert f">{table['grpo']['collapse_step']}<" in page
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
    table, *_, index = captured.out.strip().splitlines()  # the arms table, then the report
    assert table.split() == ["arm", "runs", "final", "accuracy", "collapsed", "policy", "updates"]
    assert index == str(out / "index.html") and "\nsao " in captured.out
    assert "failed runs: boom" in captured.err
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
        "import sys, saorl.cli.main, saorl.experiments.compare, saorl.monitoring.collapse\n"
        "import saorl.monitoring.report\n"
        "try:\n    saorl.cli.main.main(['compare', '--help'])\nexcept SystemExit:\n    pass\n"
        "bad = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "sys.exit(f'imported: {bad}' if bad else 0)\n"
    )
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_SRC), env.get("PYTHONPATH")) if p)
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr


# --- seeds ----------------------------------------------------------------------------------


def _write_seeds(out: Path) -> None:
    """sao: three seeds ending at 0.5, 0.44, 0.38; grpo: two of three seeds collapse."""
    for seed, gain in ((0, 0.3), (1, 0.24), (2, 0.18)):
        _write_run(out / "sao" / f"seed{seed}", steps=120, gain=gain)
    _write_run(out / "grpo" / "seed0", steps=120, collapse_at=60)
    _write_run(out / "grpo" / "seed1", steps=120, collapse_at=80)
    _write_run(out / "grpo" / "seed2", steps=120)


def test_report_over_seeds_gives_mean_spread_and_collapse_fraction(tmp_path: Path) -> None:
    _write_seeds(tmp_path)
    index = write_compare_report(tmp_path, ["sao", "grpo"], seeds=[0, 1, 2])
    arms = _read_csv(tmp_path / "arms.csv")
    sao, grpo = arms["sao"], arms["grpo"]
    assert (sao["runs"], sao["done"]) == ("3", "3")
    assert float(sao["final_mean"]) == pytest.approx(0.44)
    assert float(sao["final_std"]) == pytest.approx(0.06)  # sample std of 0.5, 0.44, 0.38
    assert (float(sao["final_min"]), float(sao["final_max"])) == pytest.approx((0.38, 0.5))
    assert float(sao["collapsed_frac"]) == 0.0 and sao["collapse_step_median"] == ""
    assert float(grpo["final_mean"]) == pytest.approx((0.01 + 0.01 + 0.5) / 3, rel=1e-5)
    assert float(grpo["collapsed_frac"]) == pytest.approx(2 / 3, rel=1e-5)
    steps = [detect_collapse(_rows(120, at))["step"] for at in (60, 80)]  # type: ignore[index]
    assert float(grpo["collapse_step_median"]) == pytest.approx(sum(steps) / 2)
    # What each arm is, from the settings it runs with, is in the table and the page.
    assert grpo["loss"] == "ppo_clip (0.2/0.28)" and grpo["minibatches"] == "4"
    assert sao["critic"].startswith("lr 5x policy, K=2, attention frozen")
    runs = _read_csv_rows(tmp_path / "summary.csv")
    assert [(r["arm"], r["seed"]) for r in runs] == [
        ("sao", "0"),
        ("sao", "1"),
        ("sao", "2"),
        ("grpo", "0"),
        ("grpo", "1"),
        ("grpo", "2"),
    ]
    page = index.read_text()
    assert "What each arm is" in page and "group sampling" not in page
    assert "sao/seed1/report.png" not in page  # no report.png was written for the fixtures
    _assert_png(tmp_path / "compare.png")
    # Without the seeds given, the seedS directories are found.
    write_compare_report(tmp_path, ["sao", "grpo"])
    assert _read_csv(tmp_path / "arms.csv")["grpo"]["runs"] == "3"


def _read_csv_rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as f:
        return list(csv.DictReader(f))


def test_seed_bands_are_mean_min_and_max_per_step() -> None:
    seeds = [_rows(40, None, gain=g) for g in (0.3, 0.2, 0.1)]
    seeds[2] = seeds[2][:21]  # the third seed stopped at step 20
    panel = next(p for p in _COMPARE_PANELS if p.keys == ("eval/accuracy",))
    steps, mean, low, high = seed_bands(seeds, "eval/accuracy", panel)
    assert steps == [0, 10, 20, 30, 40]
    at20 = [0.2 + g * 20 / 40 for g in (0.3, 0.2, 0.1)]
    i = steps.index(20)
    assert mean[i] == pytest.approx(sum(at20) / 3)
    assert (low[i], high[i]) == pytest.approx((min(at20), max(at20)))
    # Step 40: only the two seeds that got there.
    assert mean[-1] == pytest.approx((0.5 + 0.4) / 2) and low[-1] == pytest.approx(0.4)


def test_run_compare_with_seeds_runs_every_arm_at_every_seed(
    fake: FakeTrainer, tmp_path: Path
) -> None:
    out = tmp_path / "cmp"
    index = run_compare(None, ["run.seed=5"], ["sao", "sao_k1"], out, steps=100, seeds=2)
    assert [(n, c.run.seed, c.run.output_dir) for n, _, c in fake.calls] == [
        ("seed5", 5, str(out / "sao")),
        ("seed5", 5, str(out / "sao_k1")),
        ("seed6", 6, str(out / "sao")),
        ("seed6", 6, str(out / "sao_k1")),
    ]
    assert json.loads((out / "compare.json").read_text())["seeds"] == [5, 6]
    arms = _read_csv(out / "arms.csv")
    assert arms["sao_k1"]["runs"] == "2" and float(arms["sao_k1"]["collapsed_frac"]) == 1.0
    assert arms["sao_k1"]["critic"].startswith("lr 5x policy, K=1")  # from its config.toml
    assert index.is_file()
    # A rerun skips every finished run.
    fake.calls.clear()
    run_compare(None, ["run.seed=5"], ["sao", "sao_k1"], out, steps=100, seeds=2)
    assert fake.calls == []
    with pytest.raises(ConfigError, match="--seeds"):
        run_compare(None, [], ["sao"], out, seeds=0)


def test_arm_components_say_what_each_arm_is() -> None:
    vapo = arm_components(load_config(None, ["algorithm.name=vapo"]))
    assert vapo == {
        "advantage": "gae (adaptive lambda, alpha 0.05; critic lambda 1)",
        "loss": "ppo_clip (0.2/0.28) + LM loss 0.1 on correct samples",
        "critic": "lr 2x policy, K=1, all trains, 50 warm-up steps",
        "minibatches": "4",
        "groups": "16 per prompt (group sampling)",
    }
    old = arm_components(load_config(None, ["algorithm.name=sao_ppo_clip"]))
    assert old["loss"] == "ppo_clip (0.2/0.28)" and old["minibatches"] == "1"
    assert old["critic"] == "lr 5x policy, K=2, attention frozen, 10 warm-up steps"


def test_readme_and_docs_tables_of_arms_match_the_presets() -> None:
    # The tables say what each arm runs; they must be the presets' own words, not a memory.
    root = Path(__file__).resolve().parents[2]
    table = components_table([*DEFAULT_ARMS, "sao_ppo_clip", *ABLATIONS])
    for doc in ("docs/results.md", "docs/algorithms.md"):
        text = (root / doc).read_text(encoding="utf-8")
        assert components_table([*DEFAULT_ARMS, "sao_ppo_clip"]) in text or table in text, doc


def test_the_multi_seed_tool_preset_validates_for_every_arm() -> None:
    # examples/compare_tool.toml with --push-every 4, for every arm its docs command runs.
    path = Path(__file__).resolve().parents[2] / "examples" / "compare_tool.toml"
    for arm in ("sao", "grpo", "grpo_dis", "vapo", *ABLATIONS):
        cfg = load_config(path, [*ARMS[arm], "learner.push_every=4"])
        assert cfg.env.name == "tool_arithmetic" and cfg.run.total_steps == 200
        assert cfg.learner.batch_size % cfg.algorithm.samples_per_prompt == 0


def test_parallel_runs_record_the_failures_of_their_processes(tmp_path: Path) -> None:
    # --jobs 2: each run in its own `python -m saorl.experiments.compare` process. Invalid values
    # fail in the child before any training; the parent sees the exit codes and the failure records.
    out = tmp_path / "cmp"
    arms = ["neg:algorithm.eps_low=-1", "bad:critic.lr=-1"]
    run_compare(None, [], arms, out, steps=10, seeds=2, jobs=2)
    table = _read_csv_rows(out / "summary.csv")
    assert [(r["arm"], r["seed"], r["status"]) for r in table] == [
        ("neg", "0", "failed"),
        ("neg", "1", "failed"),
        ("bad", "0", "failed"),
        ("bad", "1", "failed"),
    ]
    assert all("eps_low" in r["error"] for r in table[:2])
    assert all("critic.lr" in r["error"] for r in table[2:])
    assert "FAILED" in (out / "neg" / "seed0.log").read_text()
    assert failed_runs(out) == ["neg/seed0", "neg/seed1", "bad/seed0", "bad/seed1"]


def test_arm_paths_outside_the_bmp_round_trip(tmp_path):
    # A run directory with an emoji, quotes and a backslash: the override is a TOML string
    # that reads back as written (JSON's surrogate escapes are not TOML and read back wrong).
    out = tmp_path / 'runs \U0001f600 "q" \\ x'
    runs, _ = plan_runs(None, [], [parse_arm("sao")], out, seeds=1)
    (run,) = runs
    cfg = load_config(None, run.overrides)
    assert cfg.run.output_dir == str(out)
    assert cfg.run.name == "sao"


def test_arms_table_states_unequal_policy_updates(tmp_path: Path) -> None:
    from saorl.experiments.compare_report import write_compare_report

    _write_run(tmp_path / "grpo", steps=100)
    _write_run(tmp_path / "sao", steps=100)
    rows = [json.loads(x) for x in (tmp_path / "sao/metrics.jsonl").read_text().splitlines()]
    for row in rows:  # the first 10 steps trained the critic only
        row["learner/warmup"] = float(row["step"] <= 10)
    (tmp_path / "sao/metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    write_compare_report(tmp_path, ["sao", "grpo"])
    text = (tmp_path / "arms.txt").read_text().splitlines()
    assert text[1].split()[0] == "sao" and text[1].split()[-1] == "90"
    assert text[2].split()[0] == "grpo" and text[2].split()[-1] == "100"
    assert text[3].startswith("note: the arms made different numbers of policy updates")
    assert _read_csv(tmp_path / "summary.csv")["sao"]["policy_updates"] == "90"
    _write_run(tmp_path / "sao", steps=100)  # equal now: no note
    write_compare_report(tmp_path, ["sao", "grpo"])
    assert "note:" not in (tmp_path / "arms.txt").read_text()
