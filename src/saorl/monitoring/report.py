"""Plots of one training run from its `metrics.jsonl`.

`plot_run(rows, out_png)` draws a grid of panels over `step`; a panel whose keys never appear
is left out, and missing keys or `null` values in a row are simply skipped. A resumed run
appends to the same file, so the steps after the last checkpoint appear twice: per key, the
last value logged for a step wins. `report_run(run_dir)` writes `run_dir/report.png`.

`plot_compare(runs, out_png)` draws several runs on one grid, one colour per run, with each
run's collapse step (`saorl.monitoring.collapse.detect_collapse`) as a dotted vertical line;
`plot_compare_seeds` draws several seeds per arm as a mean line and a min-max band;
`report_runs(run_dirs, out)` is `saorl report A B ...`.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.monitoring.collapse import detect_collapse, metric_series, trailing_mean
from saorl.monitoring.metrics import METRICS_FILE, read_metrics

REPORT_FILE = "report.png"
COMPARE_FILE = "compare.png"


@dataclass(frozen=True)
class _Panel:
    title: str
    keys: tuple[str, ...]
    markers: bool = False  # sparse series (evaluations): markers, not a bare line
    smooth: bool = False  # add a moving average of the first key
    unit_range: bool = False  # a fraction of a whole: fix the y axis to [0, 1]
    from_zero: bool = False  # a non-negative quantity: start the y axis at 0
    floor: float | None = None  # clip the bottom of the y axis (early outliers)
    requires: str | None = None  # drawn only when this key appears (a tool-free run: no tools)


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
    _Panel(
        "tool calls per episode",
        ("rollout/tool_calls_mean", "eval/tool_calls_mean"),
        requires="rollout/tool_calls_mean",  # logged only where the env offers tools
    ),
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
    _Panel(
        "learner idle fraction (cumulative since step 1)",
        ("perf/learner_idle_frac",),
        unit_range=True,
    ),
    _Panel(
        "rollout throughput (tokens/s, cumulative mean)",
        ("perf/rollout_tokens_per_s",),
        from_zero=True,
    ),
)


def plot_run(
    metrics: list[dict[str, Any]],
    out_png: Path,
    title: str = "",
    collapse: Mapping[str, Any] | None = None,
) -> Path:
    """Draw the run's curves into `out_png` (parent directories created); return its path.

    Critic-only steps (`learner/warmup`) are shaded on every panel; a collapse finding
    (`saorl.monitoring.collapse`) is a dotted vertical line at its detected step, named in the
    title."""
    fig = run_figure(metrics, title, collapse)
    out_png = Path(out_png)
    return save_figure(fig, out_png)


def save_figure(fig: Any, out_png: Path) -> Path:
    """Write `fig` as a PNG to `out_png` (parents created) without following a link there."""
    import io

    from saorl.security.safe_io import write_atomic

    out_png = Path(out_png)
    out_png.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100)
    return write_atomic(out_png, buf.getvalue())


def run_figure(
    metrics: list[dict[str, Any]], title: str = "", collapse: Mapping[str, Any] | None = None
) -> Any:
    """The matplotlib Figure `plot_run` saves."""
    import matplotlib

    matplotlib.use("Agg")

    panels = []
    for panel in _PANELS:
        if panel.requires and not metric_series(metrics, panel.requires)[0]:
            continue
        lines = [(key, *metric_series(metrics, key)) for key in panel.keys]
        lines = [line for line in lines if line[1]]
        if lines:
            panels.append((panel, lines))

    # One step range for every panel, so that sparse evaluations line up with the rest.
    all_steps = [s for _, lines in panels for _, steps, _ in lines for s in steps]
    lo, hi = (min(all_steps), max(all_steps)) if all_steps else (0.0, 0.0)
    warm = critic_only_span(metrics)
    if collapse:
        title = (f"{title}: " if title else "") + (
            f"collapse ({collapse['signal']}) at step {collapse['detected_step']}"
        )
    fig, nrows, ncols = _grid(len(panels), title, extra_height=0.4)
    for i, (panel, lines) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        if warm:
            ax.axvspan(
                warm[0] - 0.5,
                warm[1] + 0.5,
                color="grey",
                alpha=0.15,
                label="critic only (critic.warmup_steps)",
            )
        if collapse:
            ax.axvline(
                collapse["detected_step"],
                color="red",
                linestyle=":",
                linewidth=1.2,
                label=f"collapse ({collapse['signal']})",
            )
        for key, steps, values in lines:
            if panel.smooth and len(values) > 1:
                ax.plot(steps, values, alpha=0.35, linewidth=1, label=key)
                window = max(2, min(25, len(values) // 10))
                ax.plot(steps, trailing_mean(values, window), label=f"moving avg ({window})")
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
        if len(lines) > 1 or panel.smooth or warm or collapse:
            ax.legend(fontsize=7)
    return fig


def report_run(run_dir: Path, out_png: Path | None = None) -> Path:
    """Read `run_dir/metrics.jsonl`, write `run_dir/report.png` (or `out_png`), return its path.

    Raises FileNotFoundError when the directory or its metrics file is missing and ValueError
    when the file holds no metrics rows.
    """
    run_dir = Path(run_dir)
    out_png = run_dir / REPORT_FILE if out_png is None else Path(out_png)
    rows = _read_run(run_dir)
    # The run's own verdict (its collapse settings) where it wrote one, else the defaults'.
    summary = run_dir / "summary.json"
    if summary.is_file():
        collapse = json.loads(summary.read_text()).get("collapse")
    else:
        collapse = detect_collapse(rows)
    return plot_run(rows, out_png, title=run_dir.name, collapse=collapse)


# One panel per question the comparison asks: does it learn (reward, held-out accuracy), how
# much of the gradient is cut (DIS mask or PPO clip, whichever the arm logs), is the critic any
# good, how stale is the data, does the policy stop exploring.
_COMPARE_PANELS = (
    _Panel("reward (moving avg of rollout/reward_mean)", ("rollout/reward_mean",), smooth=True),
    _Panel("held-out accuracy (eval/accuracy)", ("eval/accuracy",), markers=True, unit_range=True),
    _Panel(
        "DIS masked (solid) / PPO clip (dashed) fraction",
        ("dis/masked_frac", "ppo/clip_frac"),
        from_zero=True,
    ),
    _Panel("value/explained_variance", ("value/explained_variance",), floor=-1.0),
    _Panel("staleness (async/staleness_mean)", ("async/staleness_mean",), from_zero=True),
    _Panel("policy entropy (policy/entropy)", ("policy/entropy",), from_zero=True),
    _Panel(
        "rollout-trainer gap, k3 (solid: staleness 0 = mismatch; dashed: 2-3 versions)",
        ("gap/k3_stale0", "gap/k3_stale2-3"),
        from_zero=True,
    ),
    _Panel(
        "ESS of the IS ratios (solid: raw; dashed: after the correction)",
        ("corr/ess_raw", "corr/ess"),
        unit_range=True,
    ),
)
_LINESTYLES = ("-", "--", "-.")


def plot_compare(
    runs: Mapping[str, Sequence[dict[str, Any]]],
    out_png: Path,
    title: str = "",
    collapses: Mapping[str, dict[str, Any] | None] | None = None,
) -> Path:
    """Draw every run of `runs` (label -> metrics rows) on one grid into `out_png`.

    Each run keeps one colour on every panel; per-step curves are lightly smoothed (a moving
    average over up to 25 steps for the reward, 10 for the rest), evaluations are markers.
    A run's collapse step (from `collapses`, or computed with `detect_collapse` when not given)
    is a dotted vertical line in its colour, and the legend says at which step. A run's
    critic-only steps (`critic.warmup_steps`) are shaded lightly in its colour and named in the
    legend. Panels no run logs are left out.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.lines import Line2D

    if collapses is None:
        collapses = {label: detect_collapse(rows) for label, rows in runs.items()}
    cmap = matplotlib.colormaps["tab10" if len(runs) <= 10 else "tab20"]
    colors = {label: cmap(i % cmap.N) for i, label in enumerate(runs)}
    warm = {label: critic_only_span(rows) for label, rows in runs.items()}

    panels = []
    for panel in _COMPARE_PANELS:
        lines = [
            (label, j, *metric_series(rows, key))
            for label, rows in runs.items()
            for j, key in enumerate(panel.keys)
        ]
        lines = [line for line in lines if line[2]]
        if lines:
            panels.append((panel, lines))

    all_steps = [s for _, lines in panels for *_, steps, _ in lines for s in steps]
    lo, hi = (min(all_steps), max(all_steps)) if all_steps else (0.0, 0.0)
    fig, nrows, ncols = _grid(len(panels), title, extra_height=0.9)
    for i, (panel, lines) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _shade_critic_only(ax, warm, colors)
        for label, j, steps, values in lines:
            style = {"color": colors[label], "linestyle": _LINESTYLES[j % len(_LINESTYLES)]}
            marker = panel.markers or len(values) == 1
            width = 1.3 if panel.smooth else 1.1
            ax.plot(
                steps,
                _smoothed(panel, values),
                marker="o" if marker else None,
                markersize=3.5,
                linewidth=width,
                **style,
            )
        for label in runs:
            hit = collapses.get(label)
            if hit is not None:
                ax.axvline(hit["step"], color=colors[label], linestyle=":", linewidth=1.5)
        _finish_axes(ax, panel, lo, hi)

    handles = []
    for label in runs:
        hit = collapses.get(label)
        # The signal that fired (reward_crash, entropy_collapse, ...) and its onset step.
        why = hit.get("signal", hit["metric"]) if hit is not None else ""
        text = label if hit is None else f"{label} (collapse @ {hit['step']}: {why})"
        text += _critic_only_note(warm[label])
        handles.append(Line2D([], [], color=colors[label], linewidth=2, label=text))
    return _save_with_legend(fig, handles, out_png)


def _smoothed(panel: _Panel, values: list[float]) -> list[float]:
    """A compare panel's curve: the reward's moving average (up to 25 steps), evaluations
    raw, other per-step series a light moving average (several noisy curves on one axis are
    unreadable raw; up to 10 steps keeps the trend and still shows spikes)."""
    if panel.smooth and len(values) > 1:
        return trailing_mean(values, max(2, min(25, len(values) // 10)))
    if panel.markers or len(values) == 1:
        return list(values)
    return trailing_mean(values, max(1, min(10, len(values) // 50)))


def _finish_axes(ax: Any, panel: _Panel, lo: float, hi: float) -> None:
    ax.set_title(panel.title, fontsize=10)
    ax.set_xlabel("step")
    ax.grid(True, alpha=0.3)
    if panel.unit_range:
        ax.set_ylim(-0.02, 1.02)
    elif panel.from_zero and ax.get_ylim()[1] > 0:
        ax.set_ylim(0, 1.05 * ax.get_ylim()[1])
    elif panel.floor is not None and ax.get_ylim()[0] < panel.floor:
        ax.set_ylim(bottom=panel.floor)
    if lo < hi:
        ax.set_xlim(lo - 0.02 * (hi - lo), hi + 0.02 * (hi - lo))


def critic_only_span(rows: Sequence[dict[str, Any]]) -> tuple[float, float] | None:
    """The first and last critic-only step of a run (`learner/warmup`), or None."""
    warm = [s for s, v in zip(*metric_series(rows, "learner/warmup"), strict=True) if v]
    return (min(warm), max(warm)) if warm else None


def _widest(spans: Sequence[tuple[float, float] | None]) -> tuple[float, float] | None:
    got = [s for s in spans if s is not None]
    return (min(s[0] for s in got), max(s[1] for s in got)) if got else None


def _shade_critic_only(
    ax: Any, spans: Mapping[str, tuple[float, float] | None], colors: Any
) -> None:
    """Each arm's critic-only steps, lightly in its colour: its policy did not move there."""
    for label, span in spans.items():
        if span is not None:
            ax.axvspan(span[0] - 0.5, span[1] + 0.5, color=colors[label], alpha=0.08, lw=0)


def _critic_only_note(span: tuple[float, float] | None) -> str:
    return "" if span is None else f" [critic only, shaded: steps {span[0]:g}-{span[1]:g}]"


def _save_with_legend(fig: Any, handles: list[Any], out_png: Path) -> Path:
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)))
    out_png = Path(out_png)
    return save_figure(fig, out_png)


def seed_bands(
    seeds: Sequence[Sequence[dict[str, Any]]], key: str, panel: _Panel
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(steps, mean, min, max) of `key` over several seeds' metrics rows.

    Each seed's curve is smoothed as `plot_compare` draws it, then the seeds are combined step
    by step over the seeds that logged that step (a seed that stopped early leaves the rest).
    """
    by_step: dict[float, list[float]] = {}
    for rows in seeds:
        steps, values = metric_series(rows, key)
        for step, value in zip(steps, _smoothed(panel, values), strict=True):
            by_step.setdefault(step, []).append(value)
    steps = sorted(by_step)
    means = [sum(by_step[s]) / len(by_step[s]) for s in steps]
    return steps, means, [min(by_step[s]) for s in steps], [max(by_step[s]) for s in steps]


def plot_compare_seeds(
    runs: Mapping[str, Sequence[Sequence[dict[str, Any]]]],
    out_png: Path,
    title: str = "",
    collapses: Mapping[str, Sequence[dict[str, Any] | None]] | None = None,
) -> Path:
    """Like `plot_compare` for several seeds per arm (label -> each seed's metrics rows).

    Per arm and panel: the mean over seeds as a line, their min-max range as a shaded band
    (`seed_bands`). The median collapse step of the seeds that collapsed is a dotted vertical
    line, and the legend says how many seeds collapsed. Critic-only steps are shaded as in
    `plot_compare`.
    """
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.lines import Line2D

    if collapses is None:
        collapses = {label: [detect_collapse(r) for r in seeds] for label, seeds in runs.items()}
    cmap = matplotlib.colormaps["tab10" if len(runs) <= 10 else "tab20"]
    colors = {label: cmap(i % cmap.N) for i, label in enumerate(runs)}
    panels = []
    for panel in _COMPARE_PANELS:
        lines = [
            (label, j, *seed_bands(seeds, key, panel))
            for label, seeds in runs.items()
            for j, key in enumerate(panel.keys)
        ]
        lines = [line for line in lines if line[2]]
        if lines:
            panels.append((panel, lines))
    # Seeds share their settings; the widest span covers a resumed or shorter seed too.
    spans = {label: [critic_only_span(r) for r in seeds] for label, seeds in runs.items()}
    warm = {label: _widest(s) for label, s in spans.items()}
    all_steps = [s for _, lines in panels for line in lines for s in line[2]]
    lo, hi = (min(all_steps), max(all_steps)) if all_steps else (0.0, 0.0)
    fig, nrows, ncols = _grid(len(panels), title, extra_height=0.9)
    medians: dict[str, float | None] = {}
    for label, hits in collapses.items():
        steps = sorted(h["step"] for h in hits if h is not None)
        medians[label] = statistics.median(steps) if steps else None
    for i, (panel, lines) in enumerate(panels):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        _shade_critic_only(ax, warm, colors)
        for label, j, steps, mean, low, high in lines:
            color = colors[label]
            style = _LINESTYLES[j % len(_LINESTYLES)]
            marker = "o" if panel.markers or len(steps) == 1 else None
            ax.plot(
                steps,
                mean,
                color=color,
                linestyle=style,
                marker=marker,
                markersize=3.5,
                linewidth=1.3,
            )
            ax.fill_between(steps, low, high, color=color, alpha=0.15, linewidth=0)
        for label, step in medians.items():
            if step is not None:
                ax.axvline(step, color=colors[label], linestyle=":", linewidth=1.5)
        _finish_axes(ax, panel, lo, hi)
    handles = []
    for label, seeds in runs.items():
        hits = [h for h in collapses.get(label, []) if h is not None]
        text = f"{label} ({len(seeds)} seeds: mean, band min-max"
        if hits:
            text += f"; {len(hits)} collapsed, median step {medians[label]:g}"
        text += _critic_only_note(warm[label])
        handles.append(Line2D([], [], color=colors[label], linewidth=2, label=text + ")"))
    return _save_with_legend(fig, handles, out_png)


def _read_run(run_dir: Path) -> list[dict[str, Any]]:
    if not run_dir.is_dir():
        raise FileNotFoundError(f"run directory not found: {run_dir}")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no {METRICS_FILE} in {run_dir} (has this run logged a step?)")
    rows = read_metrics(path)
    if not rows:
        raise ValueError(f"{path} is empty: nothing to plot")
    return rows


def run_labels(run_dirs: Sequence[Path]) -> list[str]:
    """A short unique label per run directory: its name, or `parent/name` where names repeat."""
    names = [Path(d).resolve().name for d in run_dirs]
    labels = [
        name if names.count(name) == 1 else f"{Path(d).resolve().parent.name}/{name}"
        for d, name in zip(run_dirs, names, strict=True)
    ]
    return [
        label if labels.count(label) == 1 else f"{label} ({i})" for i, label in enumerate(labels)
    ]


def report_runs(run_dirs: Sequence[Path], out: Path | None = None) -> Path:
    """`saorl report A B ...`: one comparison PNG of several runs; return its path.

    `out` is the PNG's path when it ends in `.png`, else a directory that gets `compare.png`;
    by default `compare.png` goes next to the first run directory (its parent), where a
    sweep's runs usually live side by side. Errors as `report_run`.
    """
    dirs = [Path(d) for d in run_dirs]
    runs = {label: _read_run(d) for label, d in zip(run_labels(dirs), dirs, strict=True)}
    if out is None:
        png = dirs[0].resolve().parent / COMPARE_FILE
    else:
        out = Path(out)
        png = out if out.suffix.lower() == ".png" else out / COMPARE_FILE
    title = " vs ".join(runs) if len(runs) <= 4 else f"{len(runs)} runs"
    return plot_compare(runs, png, title=title)


def _grid(n_panels: int, title: str, extra_height: float) -> tuple[Any, int, int]:
    """A figure sized for `n_panels` panels, three to a row (a notice when there are none)."""
    from matplotlib.figure import Figure

    ncols = min(3, max(1, n_panels))
    nrows = max(1, math.ceil(n_panels / ncols))
    fig = Figure(figsize=(5.0 * ncols, 3.2 * nrows + extra_height), layout="constrained")
    if title:
        fig.suptitle(title)
    if not n_panels:
        ax = fig.add_subplot(1, 1, 1)
        ax.axis("off")
        ax.text(0.5, 0.5, "no plottable metrics", ha="center", va="center")
    return fig, nrows, ncols
