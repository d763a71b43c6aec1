"""`saorl.collapse.detect_collapse`: fires near the collapse, never on noise or progress."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from saorl.collapse import detect_collapse, metric_series, trailing_mean

BATCH = 64  # trajectories per step, as in the default config: reward noise of a real batch


def _batch_reward(rng: random.Random, p: float) -> float:
    """Mean of BATCH Bernoulli(p) rewards: the noise `rollout/reward_mean` really has."""
    return sum(rng.random() < p for _ in range(BATCH)) / BATCH


def _run(
    accuracy: Any,
    steps: int = 300,
    eval_every: int = 10,
    seed: int = 0,
    entropy: Any = None,
    length: Any = None,
    warmup: int = 10,
) -> list[dict[str, Any]]:
    """Synthetic metrics rows; `accuracy(step)` is the success rate of the policy at `step`.

    Evaluations (256 problems x 4 samples, so binomial noise over 1024 samples) share a row
    with their step, as the loop logs them; entropy is null during critic warm-up.
    """
    rng = random.Random(seed)
    entropy = entropy or (lambda s: 0.8)
    length = length or (lambda s: 3.5)
    rows: list[dict[str, Any]] = [{"step": 0, "eval/accuracy": _eval(rng, accuracy(0))}]
    for step in range(1, steps + 1):
        row: dict[str, Any] = {
            "step": step,
            "rollout/reward_mean": _batch_reward(rng, accuracy(step)),
            "policy/entropy": None if step <= warmup else entropy(step) * rng.uniform(0.9, 1.1),
            "rollout/response_len_mean": length(step) + rng.uniform(-0.3, 0.3),
        }
        if step % eval_every == 0:
            row["eval/accuracy"] = _eval(rng, accuracy(step))
        rows.append(row)
    return rows


def _eval(rng: random.Random, p: float) -> float:
    return sum(rng.random() < p for _ in range(1024)) / 1024


def _rise_then_collapse(at: int) -> Any:
    return lambda s: 0.2 + 0.3 * min(s, at) / at if s < at else 0.02


def test_fires_on_collapsing_eval_curve_at_the_first_low_evaluation() -> None:
    hit = detect_collapse(_run(_rise_then_collapse(160)))
    assert hit is not None
    # Evaluations every 10 steps: the first one after the drop is step 160 itself.
    assert hit["step"] == 160
    assert hit["metric"] == "eval/accuracy"
    assert hit["value"] < hit["threshold"]
    assert "eval/accuracy" in hit["reason"] and "best" in hit["reason"]


def test_falls_back_to_the_reward_moving_average_without_evaluations() -> None:
    rows = _run(_rise_then_collapse(160), eval_every=10**9)  # only the step-0 evaluation
    hit = detect_collapse(rows)
    assert hit is not None
    assert hit["metric"] == "rollout/reward_mean"
    # A 20-step moving average falling from ~0.5 to ~0.02 crosses half its best about
    # 20 * (0.5 - 0.25) / (0.5 - 0.02) ~ 10 steps after the drop.
    assert 160 <= hit["step"] <= 180


@pytest.mark.parametrize("seed", range(10))
def test_does_not_fire_on_a_noisy_flat_run(seed: int) -> None:
    rows = _run(lambda s: 0.3, steps=1000, eval_every=50, seed=seed)
    assert detect_collapse(rows) is None
    # ... nor on its reward alone, where each point is one batch's noisy mean.
    assert detect_collapse(rows, key="no/such_key") is None


@pytest.mark.parametrize("seed", range(5))
def test_does_not_fire_on_a_rising_run(seed: int) -> None:
    rows = _run(lambda s: 0.2 + 0.4 * s / 1000, steps=1000, eval_every=100, seed=seed)
    assert detect_collapse(rows) is None
    assert detect_collapse(rows, key="no/such_key") is None


def test_one_bad_evaluation_that_recovers_does_not_fire() -> None:
    acc = lambda s: 0.05 if s == 100 else 0.4  # noqa: E731
    assert detect_collapse(_run(acc)) is None


def test_a_low_run_never_reaching_min_best_does_not_fire() -> None:
    # 0.03 -> 0.0 is "below half the best", but a run that never reached min_best=0.05 had
    # nothing to lose; on a small eval set such swings are pure noise.
    acc = lambda s: 0.03 if s < 150 else 0.0  # noqa: E731
    assert detect_collapse(_run(acc)) is None


def test_entropy_collapse() -> None:
    # Entropy decays by a factor e every 30 steps after the warm-up. Its initial value is the
    # mean of the first 20 logged values (~0.58), and the 20-step moving average falls below
    # 0.05 x 0.58 ~ 0.029 at about step 10 + 30 * ln(0.8 / 0.029) + 10 (the average's lag).
    rows = _run(lambda s: 0.4, entropy=lambda s: 0.8 * math.exp(-(s - 10) / 30))
    hit = detect_collapse(rows)
    assert hit is not None
    assert hit["metric"] == "policy/entropy"
    assert "entropy collapse" in hit["reason"]
    assert 100 <= hit["step"] <= 140


def test_healthy_sharpening_is_not_entropy_collapse() -> None:
    # The tool task's successful run: entropy 0.315 -> 0.044 (14 %) while accuracy rose.
    rows = _run(lambda s: 0.4 + 0.5 * s / 300, entropy=lambda s: 0.044 + 0.27 * math.exp(-s / 40))
    assert detect_collapse(rows) is None


def test_length_collapse() -> None:
    # Responses degenerate to immediate EOS at step 200; the reward stays flat (say a format
    # reward), so only the length rule can see it.
    rows = _run(lambda s: 0.4, length=lambda s: 3.5 if s < 200 else 0.2)
    hit = detect_collapse(rows)
    assert hit is not None
    assert hit["metric"] == "rollout/response_len_mean"
    assert 200 <= hit["step"] <= 220


def test_earliest_rule_wins() -> None:
    rows = _run(_rise_then_collapse(160), length=lambda s: 3.5 if s < 100 else 0.2, eval_every=10)
    hit = detect_collapse(rows)
    assert hit is not None and hit["metric"] == "rollout/response_len_mean"
    assert hit["step"] < 160


def test_short_and_empty_inputs() -> None:
    assert detect_collapse([]) is None
    assert detect_collapse([{"step": 0, "eval/accuracy": 0.3}]) is None
    short = _run(lambda s: 0.4, steps=8, eval_every=4)
    assert detect_collapse(short) is None


def test_metric_series_last_value_per_step_wins_and_nulls_skipped() -> None:
    rows = [
        {"step": 2, "x": 1.0},
        {"step": 1, "x": None},
        {"step": 2, "x": 3.0},  # a resumed run re-logs step 2
        {"step": 3, "x": float("nan")},
    ]
    assert metric_series(rows, "x") == ([2.0], [3.0])
    assert trailing_mean([1.0, 2.0, 3.0, 4.0], 2) == [1.0, 1.5, 2.5, 3.5]
