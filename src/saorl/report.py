"""Plots of one training run from its `metrics.jsonl`.

`plot_run(rows, out_png)` draws a grid of panels over `step`; a panel whose keys never appear
is left out, and missing keys or `null` values in a row are simply skipped. A resumed run
appends to the same file, so the steps after the last checkpoint appear twice: per key, the
last value logged for a step wins. `report_run(run_dir)` writes `run_dir/report.png`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.metrics import METRICS_FILE, read_metrics

REPORT_FILE = "report.png"


@dataclass(frozen=True)
class _Panel:
    title: str
    keys: tuple[str, ...]
    markers: bool = False  # sparse series (evaluations): markers, not a bare line
    smooth: bool = False  # add a moving average of the first key
    unit_range: bool = False  # a fraction of a whole: fix the y axis to [0, 1]
    from_zero: bool = False  # a non-negative quantity: start the y axis at 0


_PANELS = (
    _Panel("reward (rollout/reward_mean)", ("rollout/reward_mean",), smooth=True),
    _Panel(
        "held-out accuracy",
        ("eval/accuracy", "eval/accuracy_greedy"),
        markers=True,
        unit_range=True,
    ),
    _Panel("policy loss", ("loss/policy",)),
    _Panel("value loss", ("loss/value",)),
    _Panel("value/explained_variance", ("value/explained_variance",)),
    _Panel("tool calls per episode", ("rollout/tool_calls_mean", "eval/tool_calls_mean")),
    _Panel(
        "DIS masked fraction",
        ("dis/masked_frac", "dis/masked_frac_below", "dis/masked_frac_above"),
        from_zero=True,  # usually a few percent: a [0, 1] axis would hide it
    ),
    _Panel(
        "staleness (policy versions)",
        ("async/staleness_mean", "async/staleness_max"),
        from_zero=True,
    ),
    _Panel("learner idle fraction", ("perf/learner_idle_frac",), unit_range=True),
    _Panel("rollout throughput (tokens/s)", ("perf/rollout_tokens_per_s",), from_zero=True),
)


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) else None


def _series(rows: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key`, sorted by step; the last value logged for a step wins.

    Rows without a numeric `step` are skipped, unless no row has one: then the row index is
    the step.
    """
    has_step = any(_number(r.get("step")) is not None for r in rows)
    by_step: dict[float, float] = {}
    for i, row in enumerate(rows):
        step = _number(row.get("step")) if has_step else float(i)
        value = _number(row.get(key))
        if step is not None and value is not None:
            by_step[step] = value
    steps = sorted(by_step)
    return steps, [by_step[s] for s in steps]


def _moving_average(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def plot_run(metrics: list[dict[str, Any]], out_png: Path, title: str = "") -> Path:
    """Draw the run's curves into `out_png` (parent directories created); return its path."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    panels = []
    for panel in _PANELS:
        lines = [(key, *_series(metrics, key)) for key in panel.keys]
        lines = [line for line in lines if line[1]]
        if lines:
            panels.append((panel, lines))

    # One step range for every panel, so that sparse evaluations line up with the rest.
    all_steps = [s for _, lines in panels for _, steps, _ in lines for s in steps]
    lo, hi = (min(all_steps), max(all_steps)) if all_steps else (0.0, 0.0)
    ncols = min(3, max(1, len(panels)))
    nrows = max(1, math.ceil(len(panels) / ncols))
    fig = Figure(figsize=(5.0 * ncols, 3.2 * nrows + 0.4), layout="constrained")
    if title:
        fig.suptitle(title)
    if not panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.axis("off")
        ax.text(0.5, 0.5, "no plottable metrics", ha="center", va="center")
    for i, (panel, lines) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        for key, steps, values in lines:
            if panel.smooth and len(values) > 1:
                ax.plot(steps, values, alpha=0.35, linewidth=1, label=key)
                window = max(2, min(25, len(values) // 10))
                ax.plot(steps, _moving_average(values, window), label=f"moving avg ({window})")
            elif panel.markers or len(values) == 1:
                ax.plot(steps, values, marker="o", markersize=4, label=key)
            else:
                ax.plot(steps, values, linewidth=1.2, label=key)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if panel.unit_range:
            ax.set_ylim(-0.02, 1.02)
        elif panel.from_zero and ax.get_ylim()[1] > 0:
            ax.set_ylim(0, 1.05 * ax.get_ylim()[1])
        if lo < hi:
            ax.set_xlim(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))
        if len(lines) > 1 or panel.smooth:
            ax.legend(fontsize=7)

    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_png, dpi=100)
    return out_png


def report_run(run_dir: Path) -> Path:
    """Read `run_dir/metrics.jsonl`, write `run_dir/report.png`, return the PNG's path.

    Raises FileNotFoundError when the directory or its metrics file is missing and ValueError
    when the file holds no metrics rows.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir} (has this run logged a step?)")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path} is empty: nothing to plot")
    return plot_run(rows, run_dir / REPORT_FILE, title=run_dir.name)
