"""The critic's health in the live collapse detector: its gradient norm against its clip and
its explained variance below 0 (both off by default), and a NaN value as an alarm of its own."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest

from saorl.config.collapse import CollapseConfig
from saorl.monitoring.collapse import CollapseDetector, detect_collapse


def _rows(over_clip: list[float], ev: list[float]) -> list[dict[str, Any]]:
    return [
        {"step": i + 1, "critic/grad_norm_over_clip": g, "value/explained_variance": e}
        for i, (g, e) in enumerate(zip(over_clip, ev, strict=True))
    ]


def _healthy(n: int = 60, seed: int = 0) -> list[dict[str, Any]]:
    # A critic clipped now and then (up to 3x its clip) whose explained variance wanders
    # around 0.3 with single dips below 0.
    rng = random.Random(seed)
    grads = [rng.uniform(0.2, 3.0) for _ in range(n)]
    evs = [0.3 + rng.gauss(0, 0.15) for _ in range(n)]
    for i in range(5, n, 11):
        evs[i] = -0.2  # a single dip, never two in a row
    return _rows(grads, evs)


def test_the_critic_alarms_are_off_by_default() -> None:
    rows = _rows([70.0] * 30, [-0.5] * 30)  # the post-mortem's collapsed critic
    assert detect_collapse(rows) is None
    scores = CollapseDetector().update(rows[0])
    assert scores["collapse/critic_clipped"] == scores["collapse/critic_unexplained"] == 0.0


def test_a_critic_clipped_far_past_its_clip_fires_after_patience() -> None:
    cfg = CollapseConfig(critic_clip_x=5.0)
    grads = [1.0] * 10 + [7.0, 30.0, 70.0, 70.0]  # clipped 7-70x from step 11
    first = detect_collapse(_rows(grads, [0.3] * 14), cfg)
    assert first is not None and first["signal"] == "critic_clipped"
    assert (first["step"], first["detected_step"]) == (11, 13)  # patience 3
    assert "critic/grad_norm_over_clip rose to 7" in first["reason"]
    for seed in range(5):
        assert detect_collapse(_healthy(seed=seed), cfg) is None


def test_explained_variance_below_zero_for_n_steps_fires() -> None:
    cfg = CollapseConfig(critic_ev_steps=5)
    evs = [0.3] * 10 + [-0.1, -0.3, -0.2, -0.4, -0.1]
    detector = CollapseDetector(cfg)
    scores = [detector.update(r) for r in _rows([1.0] * 15, evs)]
    first = detector.first
    assert first is not None and first["signal"] == "critic_unexplained"
    assert (first["step"], first["detected_step"]) == (11, 15)
    # The score: 0 at a perfect critic, 1 at the threshold (0), past 1 below it.
    assert scores[0]["collapse/critic_unexplained"] == pytest.approx(0.7)
    assert scores[11]["collapse/critic_unexplained"] == pytest.approx(1.3)
    assert detect_collapse(_rows([1.0] * 14, evs[:14]), cfg) is None  # four steps: not yet
    for seed in range(5):
        assert detect_collapse(_healthy(seed=seed), cfg) is None


def test_a_nan_critic_metric_fires_at_once_even_when_its_rule_is_off() -> None:
    rows = _rows([1.0, math.nan], [0.3, 0.3])
    first = detect_collapse(rows)
    assert first is not None and first["signal"] == "critic_clipped"
    assert first["detected_step"] == 2 and "not finite" in first["reason"]
