"""The report of `saorl compare`: read the run directories back (never train) and summarise.

One run per arm (`OUT/ARM`), or with `--seeds N` one per arm and seed (`OUT/ARM/seedS`). The
report holds, per arm, what the arm is (`saorl.experiments.arms.arm_components` of the config it
ran), and over its seeds the mean, standard deviation (sample, ddof 1) and range of the final
held-out accuracy, the fraction of seeds that collapsed
(`saorl.monitoring.collapse.detect_collapse`) and their median collapse step; per run the figures of
`arm_result`. Files: `compare.png` (with several seeds: the mean over seeds, the band their min-max
range), `summary.csv` (one row per run), `arms.csv` (one row per arm) and a self-contained
`index.html`.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from saorl.config import ConfigError, load_config
from saorl.experiments.arms import ARMS, COMPONENTS, arm_components
from saorl.monitoring.collapse import detect_collapse, metric_series
from saorl.monitoring.metrics import METRICS_FILE, read_metrics
from saorl.security.safe_io import atomic_write, write_atomic

SUMMARY_FILE = "summary.json"
FAILED_FILE = "failed.json"
MANIFEST_FILE = "compare.json"
COLUMNS = (
    "arm",
    "seed",
    "status",
    "initial_eval_accuracy",
    "final_eval_accuracy",
    "best_eval_accuracy",
    "best_eval_step",
    "collapse_step",
    "collapse_reason",
    "steps",
    "policy_updates",
    "wall_seconds",
    "staleness_mean",
    "dropped_stale",
    "error",
    "overrides",
)
ARM_COLUMNS = (
    "arm",
    "runs",
    "done",
    "final_mean",
    "final_std",
    "final_min",
    "final_max",
    "initial_mean",
    "best_mean",
    "collapsed_frac",
    "collapse_step_median",
    "wall_seconds_mean",
    "policy_updates",
    *COMPONENTS,
)
_SEED_DIR = re.compile(r"^seed(-?\d+)$")


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _last(rows: list[dict[str, Any]], key: str) -> float | None:
    values = metric_series(rows, key)[1]
    return values[-1] if values else None


def arm_result(run_dir: Path) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(one table row, the metrics rows) for the run in `run_dir`, from whatever it left.

    `summary.json` is preferred where it has a figure (it is what the run itself reported);
    a failed or unfinished run's figures come from its `metrics.jsonl` so far.
    Status: done (summary.json), failed (failed.json), incomplete (metrics only), missing.
    """
    summary = _read_json(run_dir / SUMMARY_FILE)
    failed = _read_json(run_dir / FAILED_FILE)
    row: dict[str, Any] = {"arm": run_dir.name, "error": failed.get("error", "")}
    rows: list[dict[str, Any]] = []
    if (run_dir / METRICS_FILE).is_file():
        try:
            rows = read_metrics(run_dir / METRICS_FILE)
        except ValueError as exc:
            row["error"] = (row["error"] + "; " if row["error"] else "") + str(exc)
    if failed:
        row["status"] = "failed"
    elif (run_dir / SUMMARY_FILE).is_file():
        row["status"] = "done"
    else:
        row["status"] = "incomplete" if rows else "missing"

    eval_steps, evals = metric_series(rows, "eval/accuracy")
    initial = summary.get("initial_eval_accuracy")
    if initial is None and eval_steps and eval_steps[0] == 0:
        initial = evals[0]
    final = summary.get("final_eval_accuracy")
    if final is None and eval_steps and eval_steps[-1] > 0:
        final = evals[-1]
    row["initial_eval_accuracy"], row["final_eval_accuracy"] = initial, final
    if evals:
        best = max(range(len(evals)), key=evals.__getitem__)
        row["best_eval_accuracy"], row["best_eval_step"] = evals[best], int(eval_steps[best])
    hit = detect_collapse(rows) if rows else None
    row["collapse"] = hit  # the whole finding, for the plot; not a table column
    row["collapse_step"] = None if hit is None else hit["step"]
    row["collapse_reason"] = "" if hit is None else hit["reason"]
    steps = summary.get("steps")
    if steps is None and rows:
        steps = max((s for s in (r.get("step") for r in rows) if isinstance(s, int)), default=None)
    row["steps"] = steps
    # Steps that updated the policy (critic.warmup_steps count within run.total_steps).
    warm = sum(1 for s, v in zip(*metric_series(rows, "learner/warmup"), strict=True) if s and v)
    row["policy_updates"] = summary.get("policy_updates", None if steps is None else steps - warm)
    row["wall_seconds"] = summary.get("wall_seconds", _last(rows, "time/wall_s"))
    stale = metric_series(rows, "async/staleness_mean")[1]
    row["staleness_mean"] = sum(stale) / len(stale) if stale else None
    row["dropped_stale"] = summary.get("dropped_stale", _last(rows, "async/dropped_stale"))
    return row, rows


def seed_dirs(arm_dir: Path, seeds: Sequence[int] | None) -> list[tuple[int | None, Path]]:
    """The runs of one arm: `(seed, run_dir)`; `(None, arm_dir)` for a single-seed comparison.

    With `seeds` given (the manifest's list) those directories, present or not; otherwise the
    `seedS` directories found, or the arm directory itself when there are none.
    """
    if seeds is not None and len(seeds) > 1:
        return [(s, arm_dir / f"seed{s}") for s in seeds]
    found = sorted(
        (int(m.group(1)), p)
        for p in (arm_dir.iterdir() if arm_dir.is_dir() else ())
        if p.is_dir() and (m := _SEED_DIR.match(p.name))
    )
    return found if (seeds is None and found) else [(None, arm_dir)]


def _components(out_dir: Path, name: str, runs: list[Path], manifest: dict[str, Any]) -> dict:
    # What the arm is: from a run's own saved config, else from the overrides it would get.
    for run_dir in runs:
        try:
            return arm_components(load_config(run_dir / "config.toml"))
        except ConfigError:
            continue
    own = {a.get("name"): a.get("overrides", []) for a in manifest.get("arms", [])}
    try:
        shared = manifest.get("shared_overrides", [])
        return arm_components(load_config(None, [*shared, *own.get(name, ARMS.get(name, ()))]))
    except ConfigError:
        return dict.fromkeys(COMPONENTS, "")


def aggregate(name: str, table: list[dict[str, Any]]) -> dict[str, Any]:
    """One arm's figures over its runs (the rows of `table` whose arm is `name`)."""
    runs = [r for r in table if r["arm"] == name]
    finals = [r["final_eval_accuracy"] for r in runs if r.get("final_eval_accuracy") is not None]
    judged = [r for r in runs if r["status"] != "missing"]
    hits = [r["collapse_step"] for r in judged if r.get("collapse_step") is not None]
    out: dict[str, Any] = {"arm": name, "runs": len(runs)}
    out["done"] = sum(r["status"] == "done" for r in runs)
    if finals:
        out["final_mean"] = statistics.fmean(finals)
        out["final_std"] = statistics.stdev(finals) if len(finals) > 1 else 0.0
        out["final_min"], out["final_max"] = min(finals), max(finals)
    for key, col in (
        ("initial_mean", "initial_eval_accuracy"),
        ("best_mean", "best_eval_accuracy"),
        ("wall_seconds_mean", "wall_seconds"),
    ):
        values = [r[col] for r in runs if isinstance(r.get(col), int | float)]
        out[key] = statistics.fmean(values) if values else None
    out["collapsed_frac"] = len(hits) / len(judged) if judged else None
    out["collapse_step_median"] = statistics.median(hits) if hits else None
    updates = sorted({r["policy_updates"] for r in runs if r.get("policy_updates") is not None})
    out["policy_updates"] = "-".join(str(u) for u in updates[:: max(1, len(updates) - 1)]) or None
    return out


def arms_text(arm_rows: Sequence[dict[str, Any]]) -> str:
    """The arms table `saorl compare` prints (arms.txt), and a note when the arms made
    different numbers of policy updates at the same step budget."""
    lines = [
        f"{'arm':<18} {'runs':>4} {'final accuracy':>16} {'collapsed':>9} {'policy updates':>14}"
    ]
    for a in arm_rows:
        final = "-" if a.get("final_mean") is None else f"{a['final_mean']:.3f}"
        if a.get("final_mean") is not None and a.get("runs", 0) > 1:
            final += f" +- {a['final_std']:.3f}"
        frac = a.get("collapsed_frac")
        cells = (
            a["arm"],
            a["runs"],
            final,
            "-" if frac is None else f"{frac:.0%}",
            a.get("policy_updates") or "-",
        )
        lines.append("{:<18} {:>4} {:>16} {:>9} {:>14}".format(*cells))
    updates = {a.get("policy_updates") for a in arm_rows if a.get("policy_updates")}
    if len(updates) > 1:
        lines.append(
            "note: the arms made different numbers of policy updates: critic-only steps "
            "(critic.warmup_steps) count within the step budget"
        )
    return "\n".join(lines) + "\n"


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


_TEXT = ("arm", "status", "collapse_reason", "error", "overrides", *COMPONENTS)


def _html_value(key: str, value: Any) -> str:
    if value is None or value == "":
        return "" if key in _TEXT else "-"
    if isinstance(value, float) and "step" in key:
        text = f"{value:g}"
    elif isinstance(value, float):
        text = f"{value:.1f}" if key.startswith("wall_seconds") else f"{value:.3f}"
    else:
        text = str(value)
    return html.escape(text)


_STYLE = """
body { font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }
table { border-collapse: collapse; font-size: 0.9em; margin: 1em 0; }
th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: right; vertical-align: top; }
th { background: #f2f2f2; }
td.text { text-align: left; max-width: 28em; }
tr.failed { background: #fde8e8; }
tr.collapsed td.collapse { background: #fff3cd; }
img { max-width: 100%; }
.thumbs img { width: 32em; margin: 0.3em; border: 1px solid #ddd; }
pre { background: #f7f7f7; padding: 0.6em; overflow-x: auto; font-size: 0.8em; }
code { font-size: 0.9em; }
"""


def _run_path(row: dict[str, Any]) -> str:
    return row["arm"] if row.get("seed") is None else f"{row['arm']}/seed{row['seed']}"


def _table(rows: list[dict[str, Any]], columns: Sequence[str], out_dir: Path) -> list[str]:
    parts = ["<table>\n<tr>" + "".join(f"<th>{c}</th>" for c in columns) + "</tr>"]
    for row in rows:
        classes = [row.get("status", "")]
        classes += ["collapsed"] if row.get("collapse_step") is not None else []
        cells = []
        for col in columns:
            css = (["text"] if col in _TEXT else []) + (["collapse"] if "collapse" in col else [])
            text = _html_value(col, row.get(col))
            report = f"{_run_path(row)}/report.png"
            if col == "arm" and "status" in row and (out_dir / report).is_file():
                text = f"<a href='{html.escape(report)}'>{text}</a>"
            cells.append(f"<td class='{' '.join(css)}'>{text}</td>")
        parts.append(f"<tr class='{' '.join(classes)}'>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    return parts


def _html(
    out_dir: Path,
    table: list[dict[str, Any]],
    arms: list[dict[str, Any]],
    png: Path,
    manifest: dict[str, Any],
) -> str:
    title = f"saorl compare: {html.escape(out_dir.resolve().name)}"
    parts = [f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title>"]
    parts.append(f"<style>{_STYLE}</style></head><body>\n<h1>{title}</h1>")
    if manifest:
        base = manifest.get("base_config") or "built-in defaults"
        shared = " ".join(manifest.get("shared_overrides") or []) or "none"
        seeds = manifest.get("seeds") or []
        parts.append(
            f"<p>Base config: <code>{html.escape(base)}</code>; shared overrides: "
            f"<code>{html.escape(shared)}</code>; seeds: {html.escape(str(seeds or 'run.seed'))}."
            " Every arm shares these; the tables list each arm's own overrides.</p>"
        )
    parts.append("<h2>What each arm is</h2>")
    parts += _table(arms, ("arm", *COMPONENTS), out_dir)
    parts.append(
        "<h2>Per arm</h2><p>Final <code>eval/accuracy</code> over the arm's seeds: mean, sample "
        "standard deviation, min and max; the fraction of seeds that collapsed and their median "
        "collapse step. Collapse: the first step at which the collapse detector fires "
        "(<code>saorl.monitoring.collapse.detect_collapse</code>, the same rules for every run; "
        "the runs table says which signal). Wall seconds are the RL phase.</p>"
    )
    parts += _table(arms, ARM_COLUMNS[: -len(COMPONENTS)], out_dir)
    parts.append("<h2>Runs</h2>")
    parts += _table(table, COLUMNS, out_dir)
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    parts.append(f"<h2>Curves</h2>\n<img alt='comparison' src='data:image/png;base64,{data}'>")
    reports = [p for r in table if (out_dir / (p := f"{_run_path(r)}/report.png")).is_file()]
    if reports:
        parts.append("<h2>Per-run reports</h2>\n<div class='thumbs'>")
        for src in map(html.escape, reports):
            parts.append(f"<a href='{src}'><img alt='{src}' src='{src}'></a>")
        parts.append("</div>")
    failures = [(_run_path(r), _read_json(out_dir / _run_path(r) / FAILED_FILE)) for r in table]
    failures = [(run, f) for run, f in failures if f.get("traceback")]
    if failures:
        parts.append("<h2>Failures</h2>")
        for run, f in failures:
            parts.append(
                f"<details><summary>{html.escape(run)}: {html.escape(str(f.get('error')))}"
                f"</summary><pre>{html.escape(str(f['traceback']))}</pre></details>"
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def _write_csv(path: Path, rows: list[dict[str, Any]], columns: Sequence[str]) -> None:
    with atomic_write(path, "w") as f:
        writer = csv.DictWriter(f, fieldnames=columns)
        writer.writeheader()
        for row in rows:
            writer.writerow({c: _csv_value(row.get(c)) for c in columns})


def write_compare_report(
    out_dir: Path, arms: Sequence[str], seeds: Sequence[int] | None = None
) -> Path:
    """Write `compare.png`, `summary.csv`, `arms.csv` and `index.html` for `arms` in `out_dir`.

    `arms` are arm names (or specs: the part before ':' is the name), in table order; `seeds`
    the seeds of a multi-seed comparison (default: the manifest's, else the `seedS`
    directories found). Reads only what the run directories hold, so it works on a comparison
    still running, one that crashed, or one copied from another machine. Returns the path of
    `index.html`.
    """
    from saorl.monitoring.report import COMPARE_FILE, plot_compare, plot_compare_seeds

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _read_json(out_dir / MANIFEST_FILE)
    if seeds is None and isinstance(manifest.get("seeds"), list):
        seeds = manifest["seeds"]
    own = {a.get("name"): a.get("overrides", []) for a in manifest.get("arms", [])}
    names = [spec.partition(":")[0].strip() for spec in arms]
    table: list[dict[str, Any]] = []
    arm_rows: list[dict[str, Any]] = []
    runs: dict[str, list[list[dict[str, Any]]]] = {}
    collapses: dict[str, list[dict[str, Any] | None]] = {}
    for name in names:
        dirs = seed_dirs(out_dir / name, seeds)
        for seed, run_dir in dirs:
            row, rows = arm_result(run_dir)
            row["arm"], row["seed"] = name, seed
            row["overrides"] = " ".join(own.get(name, ARMS.get(name, ())))
            table.append(row)
            if rows:
                runs.setdefault(name, []).append(rows)
                collapses.setdefault(name, []).append(row["collapse"])
        summary = aggregate(name, table)
        summary.update(_components(out_dir, name, [d for _, d in dirs], manifest))
        arm_rows.append(summary)

    title = f"saorl compare: {out_dir.resolve().name}"
    png = out_dir / COMPARE_FILE
    if any(len(r) > 1 for r in runs.values()):
        plot_compare_seeds(runs, png, title, collapses)
    else:
        plot_compare(
            {k: v[0] for k, v in runs.items()}, png, title, {k: v[0] for k, v in collapses.items()}
        )
    _write_csv(out_dir / "summary.csv", table, COLUMNS)
    _write_csv(out_dir / "arms.csv", arm_rows, ARM_COLUMNS)
    write_atomic(out_dir / "arms.txt", arms_text(arm_rows))
    index = out_dir / "index.html"
    write_atomic(index, _html(out_dir, table, arm_rows, png, manifest))
    return index


def failed_runs(out_dir: Path) -> list[str]:
    """`ARM` or `ARM/seedS` of every failed run in `out_dir/summary.csv`."""
    with (Path(out_dir) / "summary.csv").open(newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    return [
        _run_path({**r, "seed": r.get("seed") or None}) for r in rows if r["status"] == "failed"
    ]
