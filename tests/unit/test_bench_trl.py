"""The pure parts of benchmarks/bench_trl.py: time accounting and the figures read off curves.

The benchmark itself (TRL against saorl) takes minutes and needs the `bench` extra; it is run
by hand (docs/performance.md). Its TRL settings are checked against a resolved saorl config
only when TRL is installed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_trl  # benchmarks/ is a folder of scripts, not a package


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_train_clock_leaves_out_excluded_intervals() -> None:
    fake = FakeClock()
    clock = bench_trl.TrainClock(fake)
    with pytest.raises(RuntimeError):
        clock.elapsed()
    clock.start()
    fake.now += 2.0
    assert clock.elapsed() == pytest.approx(2.0)
    with clock.excluded():
        fake.now += 5.0  # a snapshot
    fake.now += 1.0
    assert clock.elapsed() == pytest.approx(3.0)
    with pytest.raises(ValueError), clock.excluded():
        fake.now += 4.0
        raise ValueError("a failed snapshot is still left out")
    assert clock.elapsed() == pytest.approx(3.0)
    clock.start()  # a second run starts from zero
    fake.now += 0.5
    assert clock.elapsed() == pytest.approx(0.5)


def _row(step: int, wall: float, step_s: float, **extra: float) -> dict[str, float]:
    return {"step": step, "time/wall_s": wall, "perf/step_s": step_s, **extra}


def test_saorl_seconds_drop_the_gap_after_each_snapshot_step() -> None:
    # Steps of 1 s each; after step 2 (a snapshot) a 3 s checkpoint write before step 3 starts,
    # after step 3 (no snapshot) 0.1 s of logging, which counts.
    rows = [
        {"step": 0, "eval/accuracy": 0.25},  # the initial evaluation: no timing columns
        _row(1, 1.0, 1.0),
        _row(2, 2.0, 1.0),
        _row(3, 6.0, 1.0),  # started at 5.0 = 2.0 + 3 s of checkpoint
        _row(4, 7.1, 1.0),  # started at 6.1: 0.1 s of logging after step 3
    ]
    got = bench_trl.saorl_train_seconds(rows, snapshot_steps={0, 2, 4})
    assert got == pytest.approx({1: 1.0, 2: 2.0, 3: 3.0, 4: 4.1})
    # Without snapshots nothing is taken away: the loop's own clock.
    assert bench_trl.saorl_train_seconds(rows, set()) == pytest.approx(
        {1: 1.0, 2: 2.0, 3: 6.0, 4: 7.1}
    )


def test_saorl_seconds_never_add_time_for_a_negative_gap() -> None:
    # Rounding can make a step look as if it started before the previous one ended.
    rows = [_row(1, 1.0, 1.0), _row(2, 2.0, 1.0000001)]
    assert bench_trl.saorl_train_seconds(rows, {1})[2] == pytest.approx(2.0)


CURVE = [
    {"step": 0, "train_s": 0.0, "accuracy": 0.25},
    {"step": 50, "train_s": 20.0, "accuracy": 0.31},
    {"step": 100, "train_s": 41.0, "accuracy": 0.36},
    {"step": 150, "train_s": 60.0, "accuracy": 0.34},  # noisy: below the target again
    {"step": 200, "train_s": 80.0, "accuracy": 0.40},
]


def test_time_to_target_is_the_first_point_that_reaches_it() -> None:
    assert bench_trl.time_to_target(CURVE, 0.35) == 41.0
    assert bench_trl.time_to_target(CURVE, 0.36) == 41.0  # reaching counts (>=)
    assert bench_trl.time_to_target(CURVE, 0.25) == 0.0  # the start already does
    assert bench_trl.time_to_target(CURVE, 0.5) is None
    assert bench_trl.time_to_target(list(reversed(CURVE)), 0.35) == 41.0  # order-free


def test_sustained_target_time_is_where_the_curve_stays_above_it() -> None:
    # 0.36 at 41 s, then 0.34: the curve stays at or above 0.34 from 41 s, above 0.35 from 80 s.
    assert bench_trl.time_to_sustained_target(CURVE, 0.34) == 41.0
    assert bench_trl.time_to_sustained_target(CURVE, 0.35) == 80.0
    assert bench_trl.time_to_sustained_target(CURVE, 0.25) == 0.0
    assert bench_trl.time_to_sustained_target(CURVE, 0.41) is None  # the last point misses
    assert bench_trl.time_to_sustained_target([], 0.3) is None


def test_accuracy_at_budget_is_the_last_point_inside_it() -> None:
    assert bench_trl.accuracy_at_budget(CURVE, 60.0) == 0.34  # not the best one (0.36)
    assert bench_trl.accuracy_at_budget(CURVE, 59.9) == 0.36
    assert bench_trl.accuracy_at_budget(CURVE, 1000.0) == 0.40
    assert bench_trl.accuracy_at_budget(CURVE[1:], 10.0) is None


def test_medians_over_seeds_say_none_when_a_seed_missed() -> None:
    assert bench_trl.median_or_none([3.0, 1.0, 2.0]) == 2.0
    assert bench_trl.median_or_none([3.0, None, 2.0]) is None
    assert bench_trl.median_or_none([]) is None


def test_summary_starts_every_curve_at_the_shared_start() -> None:
    initial = {"accuracy": 0.25, "accuracy_greedy": 0.7}
    runs = {
        "sao": [{"curve": CURVE[1:], "trajectories_per_s": 200.0, "train_s": 80.0}],
        "trl_grpo": [
            {
                "curve": [{"step": 50, "train_s": 30.0, "accuracy": 0.2}],
                "trajectories_per_s": 150.0,
                "train_s": 30.0,
            },
        ],
    }
    out = bench_trl.summarize(runs, initial, target=0.35, budget_s=25.0)
    assert out["sao"]["time_to_target_s"] == 41.0
    assert out["sao"]["accuracy_at_budget"] == 0.31
    assert out["trl_grpo"]["time_to_target_s"] is None
    assert out["trl_grpo"]["accuracy_at_budget"] == 0.25  # only the start is inside 25 s
    assert runs["trl_grpo"][0]["best_accuracy"] == 0.25
    assert out["sao"]["covers_budget"] and out["trl_grpo"]["covers_budget"]
    assert not bench_trl.summarize(runs, initial, 0.35, budget_s=90.0)["sao"]["covers_budget"]


def test_trl_settings_mirror_the_resolved_grpo_config(tmp_path: Path) -> None:
    pytest.importorskip("trl")
    from trl import GRPOConfig

    from saorl.api import make_config

    cfg = make_config(
        None, ["algorithm.name=grpo", "learner.batch_size=64", "rollout.max_new_tokens=16"]
    )
    args = argparse.Namespace(steps=10, trl_minibatches=None)
    settings = bench_trl.trl_settings(cfg, args, seed=3, out_dir=tmp_path)
    algo = cfg.algorithm
    rows = settings["per_device_train_batch_size"] * settings["steps_per_generation"]
    assert rows == 64
    assert settings["steps_per_generation"] == algo.minibatches
    assert settings["max_steps"] == 10 * algo.minibatches
    assert settings["num_generations"] == algo.group_size
    assert (settings["epsilon"], settings["epsilon_high"]) == (
        algo.clip_eps_low,
        algo.clip_eps_high,
    )
    assert settings["learning_rate"] == cfg.learner.lr
    assert settings["max_completion_length"] == 16
    GRPOConfig(**settings)  # TRL accepts every one of them
    args = argparse.Namespace(steps=10, trl_minibatches=1)
    settings = bench_trl.trl_settings(cfg, args, seed=3, out_dir=tmp_path)
    assert settings["per_device_train_batch_size"] == 64
    assert settings["learning_rate"] == cfg.learner.lr
    args = argparse.Namespace(steps=10, trl_steps=25, trl_minibatches=None)
    settings = bench_trl.trl_settings(cfg, args, seed=3, out_dir=tmp_path)
    assert settings["max_steps"] == 25 * algo.minibatches  # --trl-steps: TRL runs longer


def test_each_saorl_arm_resolves_to_its_algorithm() -> None:
    from saorl.api import make_config

    args = argparse.Namespace(grpo_lr=3e-5)
    resolved = {
        name: make_config(None, bench_trl.arm_overrides(name, args)) for name in bench_trl.TRAINERS
    }
    assert resolved["sao"].algorithm.name == resolved["sao_concurrent"].algorithm.name == "sao"
    # `sao` runs at the defaults (critic.concurrent = "auto"); `sao_concurrent` forces it on.
    assert resolved["sao_concurrent"].critic.concurrent is True
    assert resolved["sao"].critic.concurrent == "auto"
    assert resolved["grpo"].learner.lr == resolved["trl_grpo"].learner.lr == 3e-5
    assert resolved["grpo_dis"].learner.lr == resolved["sao"].learner.lr


def test_learner_flops_name_the_work_of_each_algorithm() -> None:
    args = argparse.Namespace(grpo_lr=3e-5)
    common = ["learner.sft_steps=0", f"learner.batch_size={bench_trl.BATCH}"]
    flops = {
        name: bench_trl.learner_gflops([*common, *bench_trl.arm_overrides(name, args)])
        for name in ("sao", "sao_concurrent", "grpo", "grpo_dis")
    }
    # The same work whether the critic runs beside the policy or after it.
    assert flops["sao"] == pytest.approx(flops["sao_concurrent"])
    # SAO's critic (K=2 updates, values from the first) costs more than GRPO's extra
    # old-policy forward pass, which costs more than nothing (grpo_dis).
    assert flops["sao"] > flops["grpo"] > flops["grpo_dis"] > 0


def test_trl_steps_default_to_the_shared_step_count() -> None:
    assert bench_trl.trl_steps(argparse.Namespace(steps=10, trl_steps=None)) == 10
    assert bench_trl.trl_steps(argparse.Namespace(steps=10, trl_steps=30)) == 30
    assert bench_trl.trl_steps(argparse.Namespace(steps=10)) == 10  # an older report's args


def test_time_to_target_ratio_is_unknown_until_trl_reaches_it() -> None:
    def summary(sao_t: float | None, trl_t: float | None) -> dict[str, dict[str, object]]:
        def arm(t: float | None) -> dict[str, object]:
            return {
                "trajectories_per_s": 100.0,
                "time_to_target_s": t,
                "time_to_sustained_target_s": t,
            }

        return {"sao": arm(sao_t), "trl_grpo": arm(trl_t)}

    met = bench_trl.issue_targets(summary(60.0, 120.0))
    assert met["sao_time_to_target_at_most_0.6x_trl_grpo"] == [0.5, True]
    assert met["sao_reaches_target_before_trl_grpo"] == [60.0, 120.0, True]
    missed = bench_trl.issue_targets(summary(90.0, 120.0))
    assert missed["sao_time_to_target_sustained_at_most_0.6x_trl_grpo"] == [0.75, False]
    # TRL never reached it: SAO is first, but the ratio is not known.
    beyond = bench_trl.issue_targets(summary(60.0, None))
    assert beyond["sao_reaches_target_before_trl_grpo"][-1] is True
    assert beyond["sao_time_to_target_at_most_0.6x_trl_grpo"] == [None, False]


def _report(initial: float, runs: dict[str, int]) -> dict[str, object]:
    def run(steps: int) -> dict[str, object]:
        return {"curve": [{"step": s, "train_s": s / 5, "accuracy": 0.3} for s in (50, steps)]}

    return {
        "time": "t",
        "initial": {"accuracy": initial, "accuracy_greedy": 0.4},
        "workload": {"steps": max(runs.values())},
        "runs": {name: [run(n)] for name, n in runs.items()},
        "learner_gflop_per_step": {name: 1.0 for name in runs if name != "trl_grpo"},
    }


def test_reports_of_one_warm_up_merge_each_trainer_from_the_last() -> None:
    a = _report(0.137, {"trl_grpo": 3000, "sao": 1000, "grpo": 1000})
    b = _report(0.137, {"sao": 2000})
    merged = bench_trl.merge_reports([a, b], [Path("a.json"), Path("b.json")])
    assert list(merged["runs"]) == ["trl_grpo", "sao", "grpo"]
    assert merged["runs"]["sao"] == b["runs"]["sao"]  # the later, longer run
    assert merged["runs"]["grpo"] == a["runs"]["grpo"]
    assert [m["trainers"] for m in merged["merged_from"]] == [["trl_grpo", "sao", "grpo"], ["sao"]]
    label = bench_trl.steps_label(merged["runs"])
    assert label == "trl_grpo 3000, sao 2000, grpo 1000 steps"
    assert bench_trl.steps_label(a["runs"] | {"trl_grpo": a["runs"]["sao"]}) == "1000 steps"
    assert bench_trl.merge_reports([a], [Path("a.json")]) is a


def test_reports_of_other_seeds_add_their_runs() -> None:
    a = _report(0.13, {"sao": 20, "trl_grpo": 10})
    b = _report(0.13, {"sao": 30, "trl_grpo": 12})
    for report, seed in ((a, 0), (b, 1)):
        for runs in report["runs"].values():
            runs[0]["seed"] = seed
    merged = bench_trl.merge_reports([a, b], [Path("a.json"), Path("b.json")])
    assert [r["seed"] for r in merged["runs"]["sao"]] == [0, 1]
    assert [r["seed"] for r in merged["runs"]["trl_grpo"]] == [0, 1]
    again = bench_trl.merge_reports([merged, b], [Path("m.json"), Path("b.json")])
    assert [r["seed"] for r in again["runs"]["sao"]] == [0, 1]  # a seed's rerun replaces it


def test_reports_from_other_weights_do_not_merge() -> None:
    a = _report(0.137, {"trl_grpo": 1000})
    b = _report(0.257, {"sao": 1000})
    with pytest.raises(SystemExit, match="other weights"):
        bench_trl.merge_reports([a, b], [Path("a.json"), Path("b.json")])


def test_trajectories_per_s_compare_only_within_one_report() -> None:
    arm = {"trajectories_per_s": 100.0, "time_to_target_s": 1.0, "time_to_sustained_target_s": 1.0}
    summary = {"sao": arm, "grpo": arm, "trl_grpo": arm}
    assert "sao_trajectories_per_s_at_least_0.9x_grpo" in bench_trl.issue_targets(summary)
    apart = bench_trl.issue_targets(summary, {"trl_grpo": 0, "grpo": 0, "sao": 1})
    assert "sao_trajectories_per_s_at_least_0.9x_grpo" not in apart
    assert apart["sao_time_to_target_at_most_0.6x_trl_grpo"] == [1.0, False]


def test_reports_name_the_cpu_model() -> None:
    # warm-up weights differ between CPU models, so a report says which one it ran on
    import _common

    model = _common.machine()["cpu_model"]
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.exists() and "model name" in cpuinfo.read_text():
        assert model and f": {model}" in cpuinfo.read_text()


def test_a_target_gain_is_counted_from_the_start() -> None:
    start = {"accuracy": 0.305, "accuracy_greedy": 0.77}
    assert bench_trl.resolve_target(0.32, None, start) == 0.32  # --target alone
    assert bench_trl.resolve_target(0.32, 0.2, start) == pytest.approx(0.505)  # start + gain
