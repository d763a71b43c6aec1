"""The rules of the collapse detector (`saorl.monitoring.collapse`), one class per kind of rule:
a patience counter over one metric's values, its reference, threshold and finding."""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from typing import Any

from saorl.config.collapse import CollapseConfig

Finding = dict[str, Any]

# A signal's score when its metric was NaN or infinite: an alarm at once. metrics.jsonl holds
# the score in place of the value (JSON has no NaN), so a replay of the file fires it too.
NONFINITE = -1.0


def number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def as_step(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _score(value: float, reference: float, threshold: float) -> float:
    """0 at the reference, 1 at the threshold, on the side of the threshold; never negative."""
    span = threshold - reference
    return max(0.0, (value - reference) / span) if span else 0.0


class Rule:
    """One signal: a patience counter over the values of one metric and its finding."""

    def __init__(self, name: str, keys: tuple[str, ...], patience: int) -> None:
        self.name = name
        self.keys = keys
        self.patience = patience
        self.streak = 0  # consecutive values over the threshold, up to now
        self.onset: tuple[float, float, float] | None = None  # (step, value, threshold)
        self.finding: Finding | None = None
        self.instant: float | None = None  # this many times over a (positive) threshold: at once

    def value(self, row: dict[str, Any]) -> tuple[str, float] | None:
        for key in self.keys:
            raw = row.get(key)
            v = number(raw)
            if v is not None:
                return key, v
            if isinstance(raw, float):  # NaN or inf
                return key, raw
        if row.get(f"collapse/{self.name}") == NONFINITE:  # a logged row: it was NaN or inf
            return next((k for k in self.keys if k in row), self.keys[0]), math.nan
        return None

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        """`(score, over the threshold, threshold, judged value)`; updates the rule's state.

        The judged value is `value` itself, or the moving average that includes it."""
        raise NotImplementedError

    def describe(self, metric: str, value: float, threshold: float) -> str:
        raise NotImplementedError

    def update(self, step: float, row: dict[str, Any]) -> float | None:
        got = self.value(row)
        if got is None:
            return None
        metric, value = got
        if not math.isfinite(value):  # kept out of the rule's history: it would poison it
            self.streak += 1
            if self.finding is None:
                self.onset = (step, value, math.nan)
                self._fire(metric, step, f"{metric} is not finite (NaN or inf)")
                self.finding = {**(self.finding or {}), "value": None, "threshold": None}  # JSON
            return NONFINITE
        score, over, threshold, judged = self.judge(value)
        self.streak = self.streak + 1 if over else 0
        if self.streak == 1:
            self.onset = (step, judged, threshold)
        at_once = over and self.instant is not None and judged > self.instant * threshold > 0
        if over and self.finding is None and (self.streak >= self.patience or at_once):
            self._fire(metric, step)
        return score

    def _fire(self, metric: str, detected: float, reason: str | None = None) -> None:
        onset, value, threshold = self.onset or (detected, math.nan, math.nan)
        self.finding = {
            "step": as_step(onset),
            "detected_step": as_step(detected),
            "signal": self.name,
            "metric": metric,
            "value": value,
            "threshold": threshold,
            "reason": f"{self.name}: {reason or self.describe(metric, value, threshold)}",
        }


class Smoothed(Rule):
    """Keeps the moving average over `window` values and the initial level (first window)."""

    def __init__(self, name: str, keys: tuple[str, ...], cfg: CollapseConfig) -> None:
        super().__init__(name, keys, cfg.patience)
        self.window = cfg.window
        self.recent: deque[float] = deque(maxlen=cfg.window)
        self.n = 0
        self.initial: float | None = None

    def smooth(self, value: float) -> float | None:
        """The moving average including `value`, or None before the first full window."""
        self.recent.append(value)
        self.n += 1
        if self.n < self.window:
            return None
        mean = sum(self.recent) / len(self.recent)
        if self.initial is None:
            self.initial = mean
        return mean


class Shrink(Smoothed):
    """Moving average below `frac` x the initial level (entropy and length collapse)."""

    def __init__(self, name: str, key: str, frac: float, cfg: CollapseConfig) -> None:
        super().__init__(name, (key,), cfg)
        self.frac = frac

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        mean = self.smooth(value)
        if mean is None or self.initial is None or self.initial <= 0 or self.frac <= 0:
            return None, False, math.nan, value
        threshold = self.frac * self.initial
        return _score(mean, self.initial, threshold), mean < threshold, threshold, mean

    def describe(self, metric: str, value: float, threshold: float) -> str:
        return (
            f"{metric} (moving avg {self.window}) fell to {value:.3g}, below {self.frac:g} x "
            f"its initial {self.initial:.3g} ({threshold:.3g})"
        )


class Grow(Smoothed):
    """Moving average above `factor` x the initial level + `floor` (a slow rise, not a spike)."""

    def __init__(
        self, name: str, keys: tuple[str, ...], factor: float, floor: float, cfg: CollapseConfig
    ) -> None:
        super().__init__(name, keys, cfg)
        self.factor = factor
        self.floor = floor

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        mean = self.smooth(value)
        if mean is None or self.initial is None or self.factor <= 0:
            return None, False, math.nan, value
        threshold = self.factor * max(self.initial, 0.0) + self.floor
        if threshold <= self.initial:  # no floor and a level of 0: no scale to judge by
            return 0.0, False, threshold, mean
        return _score(mean, self.initial, threshold), mean > threshold, threshold, mean

    def describe(self, metric: str, value: float, threshold: float) -> str:
        floor = f" + {self.floor:g}" if self.floor else ""
        return (
            f"{metric} (moving avg {self.window}) rose to {value:.4g}, above {self.factor:g} x "
            f"its initial {self.initial:.4g}{floor}"
        )


class Below(Rule):
    """Raw value below a fixed bound, 1 being the ideal (a normalised effective sample size,
    an explained variance); off when `on` is false (by default: a bound of 0)."""

    def __init__(
        self,
        name: str,
        keys: tuple[str, ...],
        bound: float,
        patience: int,
        on: bool | None = None,
    ) -> None:
        super().__init__(name, keys, max(patience, 1))
        self.bound = bound
        self.on = bound > 0 if on is None else on

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        if not self.on:
            return None, False, math.nan, value
        return _score(value, 1.0, self.bound), value < self.bound, self.bound, value

    def describe(self, metric: str, value: float, threshold: float) -> str:
        return f"{metric} fell to {value:.3g}, below {threshold:g} for {self.patience} steps"


class Above(Rule):
    """Raw value above a fixed bound, 1 being where it starts to matter (a gradient norm in
    units of its clip); a bound of 0 is off."""

    def __init__(self, name: str, keys: tuple[str, ...], bound: float, patience: int) -> None:
        super().__init__(name, keys, patience)
        self.bound = bound

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        if self.bound <= 0:
            return None, False, math.nan, value
        return _score(value, 1.0, self.bound), value > self.bound, self.bound, value

    def describe(self, metric: str, value: float, threshold: float) -> str:
        return f"{metric} rose to {value:.3g}, above {threshold:g} for {self.patience} steps"


class RewardCrash(Smoothed):
    """Moving average below its running best by more than the gain- and noise-based gap."""

    def __init__(self, cfg: CollapseConfig, key: str) -> None:
        super().__init__("reward_crash", (key,), cfg)
        self.drop = cfg.reward_drop
        self.noise = cfg.reward_noise
        self.abs_diff = 0.0  # sum of |r_t - r_(t-1)| over the whole run
        self.last: float | None = None
        self.best = -math.inf

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        if self.last is not None:
            self.abs_diff += abs(value - self.last)
        self.last = value
        mean = self.smooth(value)
        if mean is None or self.initial is None:
            return None, False, math.nan, value
        self.best = max(self.best, mean)
        # Mean absolute difference of consecutive steps = 2 sigma / sqrt(pi) for iid noise.
        sigma = math.sqrt(math.pi) / 2 * self.abs_diff / max(self.n - 1, 1)
        gap = max(self.drop * (self.best - self.initial), self.noise * sigma)
        if gap <= 0:  # a reward that never moved: nothing to measure a drop against
            return 0.0, False, self.best, mean
        threshold = self.best - gap
        return _score(mean, self.best, threshold), mean < threshold, threshold, mean

    def describe(self, metric: str, value: float, threshold: float) -> str:
        return (
            f"{metric} (moving avg {self.window}) fell to {value:.4g}, below {threshold:.4g}: "
            f"its best {self.best:.4g} minus max({self.drop:g} x its gain over the initial "
            f"{self.initial:.4g}, {self.noise:g} per-step noise sd)"
        )


class EvalDrop(Rule):
    """Held-out accuracy below `eval_drop` x its best, at two evaluations in a row."""

    def __init__(self, cfg: CollapseConfig, key: str) -> None:
        super().__init__("eval_drop", (key,), 2)
        self.frac = cfg.eval_drop
        self.min_best = cfg.eval_min_best
        self.best = -math.inf

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        best = self.best
        self.best = max(self.best, value)
        if best < self.min_best or self.frac <= 0:
            return None, False, math.nan, value
        threshold = self.frac * best
        return _score(value, best, threshold), value < threshold, threshold, value

    def finish(self) -> None:
        """The run ended: a last low evaluation stands without a confirmation."""
        if self.finding is None and self.streak and self.onset is not None:
            self._fire(self.keys[0], self.onset[0])  # detected at its onset: nothing came after

    def describe(self, metric: str, value: float, threshold: float) -> str:
        best = threshold / self.frac
        return f"{metric} fell to {value:.3f}, below {self.frac:g} x its best {best:.3f}"


class Spike(Rule):
    """Raw value above `factor` x the median of the values before it + `floor`."""

    def __init__(
        self,
        name: str,
        keys: tuple[str, ...],
        factor: float,
        floor: float,
        cfg: CollapseConfig,
        quantile: float | None = None,
    ) -> None:
        super().__init__(name, keys, cfg.patience)
        self.quantile = quantile  # the reference is at least this quantile of the history
        # Judged once it has `window` values of history (at most the whole baseline window).
        self.factor = factor
        self.floor = floor
        self.instant = cfg.spike_instant or None
        self.min_history = min(cfg.window, cfg.baseline_window)
        self.history: deque[float] = deque(maxlen=cfg.baseline_window)
        self.everything: list[float] = []  # every value so far, sorted
        self.median = math.nan

    def judge(self, value: float) -> tuple[float | None, bool, float, float]:
        out: tuple[float | None, bool, float, float] = (None, False, math.nan, value)
        if self.factor > 0 and len(self.history) >= self.min_history:
            # The run's median too: once a task is solved, most batches carry almost no
            # gradient, and the ordinary ones would look like spikes against the recent median.
            run = self.everything
            self.median = max(statistics.median(self.history), run[len(run) // 2])
            if self.quantile is not None:  # heavy-tailed k3: the run's own excursions
                recent = sorted(self.history)
                self.median = max(self.median, recent[int(self.quantile * (len(recent) - 1))])
            threshold = self.factor * self.median + self.floor
            if threshold > self.median:  # a median of 0 without a floor: no scale to judge by
                score = _score(value, self.median, threshold)
                out = (score, value > threshold, threshold, value)
        self.history.append(value)
        bisect.insort(self.everything, value)
        return out

    def describe(self, metric: str, value: float, threshold: float) -> str:
        floor = f" + {self.floor:g}" if self.floor else ""
        level = "median" if self.quantile is None else "level (median or upper decile)"
        return (
            f"{metric} rose to {value:.4g}, above {self.factor:g} x its {level} "
            f"{self.median:.4g}{floor}"
        )
