"""`saorl compare`: one run per arm (algorithm or ablation) under identical settings, one report.

Why: the paper's claims are comparative (SAO keeps improving where async GRPO collapses after
~160 steps and VAPO after ~90), and a comparison only means something when every arm sees the
same seed, task, step budget and asynchrony. So the arms differ *only* by their own overrides:

    base config (--config) -> shared overrides -> --steps / --push-every -> the arm's overrides
    -> run.output_dir=OUT, run.name=ARM, run.progress=false

An arm's own overrides come after the shared ones, so a custom arm may deliberately vary a
shared setting (a staleness sweep: `stale4:learner.push_every=4`). Arms run one after another
(the CPU default has 2 cores; two runs side by side would each get half and measure nothing
about asynchrony). Arms are resumable: one with `summary.json` is done and skipped; one with a
checkpoint is resumed from it; one that got no checkpoint (stopped in its warm-up) is moved
aside to `ARM.incomplete-N` and started again. An arm that raises is recorded in
`ARM/failed.json` and the next arm runs; a rerun retries it.

Arm syntax: a built-in name (`ARMS`), or `NAME:section.field=value,section.field=value` for a
custom arm (a built-in NAME contributes its overrides first). NAME is letters, digits, `_`, `-`.

`write_compare_report(out_dir, arms)` reads the arm directories back (it never trains) and
writes `compare.png`, `summary.csv` and a self-contained `index.html`.
"""

from __future__ import annotations

import base64
import csv
import html
import json
import re
import sys
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.collapse import detect_collapse, metric_series
from saorl.config import Config, ConfigError, load_config, parse_override
from saorl.metrics import METRICS_FILE, read_metrics

ARMS: dict[str, tuple[str, ...]] = {
    "sao": ("algorithm.name=sao",),
    "grpo": ("algorithm.name=grpo",),
    "grpo_dis": ("algorithm.name=grpo_dis",),
    "running_mean": ("algorithm.name=running_mean",),
    "vapo": ("algorithm.name=vapo",),
    # SAO ablations: each removes one ingredient of the critic recipe (docs/design.md section 1.3).
    "sao_no_freeze": ("algorithm.name=sao", "critic.freeze=none"),
    "sao_k1": ("algorithm.name=sao", "critic.updates_per_step=1"),
    "sao_fixed_lambda": ("algorithm.name=sao", "algorithm.lambda_mode=fixed"),
    "sao_no_warmup": ("algorithm.name=sao", "critic.warmup_steps=0"),
}
DEFAULT_ARMS = ("sao", "grpo", "grpo_dis", "running_mean", "vapo")
SUMMARY_FILE = "summary.json"
FAILED_FILE = "failed.json"
MANIFEST_FILE = "compare.json"

_ARM_NAME = re.compile(r"^[A-Za-z0-9_-]+$")
_ARM_START = re.compile(r"^\s*[A-Za-z0-9_-]+\s*(:|$)")  # "sao" or "name:..." starts an arm
_OVERRIDE_START = re.compile(r"^\s*[A-Za-z_]\w*\.[A-Za-z_]\w*\s*=")


@dataclass(frozen=True)
class Arm:
    """One run of a comparison: its directory name and the overrides that define it."""

    name: str
    overrides: tuple[str, ...]


def _join_pieces(pieces: Sequence[str], starts: re.Pattern[str]) -> list[str]:
    """Re-join comma-split pieces: a piece that does not match `starts` continues the last one.

    This is what lets a list value keep its commas: `rollout.stop=["a","b"]`.
    """
    out: list[str] = []
    for piece in pieces:
        if out and not starts.match(piece):
            out[-1] += "," + piece
        else:
            out.append(piece)
    return out


def split_arms(text: str) -> list[str]:
    """Split `--arms sao,grpo,mine:critic.lr=1e-3,learner.lr=1e-5` into arm specs."""
    return [s.strip() for s in _join_pieces(text.split(","), _ARM_START) if s.strip()]


def parse_arm(spec: str) -> Arm:
    """`NAME` (built-in) or `NAME:key=value,key=value`; raises ConfigError naming the problem.

    Override keys are checked here, so a typo fails before the first arm trains for an hour;
    values are checked when the arm's config is built.
    """
    name, sep, rest = (part.strip() for part in spec.partition(":"))
    if not _ARM_NAME.match(name):
        raise ConfigError(
            f"arm {spec!r}: the name must be letters, digits, '_' or '-' (it names a directory)"
        )
    if not sep and name not in ARMS:
        raise ConfigError(
            f"unknown arm {name!r}: built-in arms are {', '.join(ARMS)}; "
            "a custom arm is NAME:section.field=value,section.field=value"
        )
    own = [s.strip() for s in _join_pieces(rest.split(","), _OVERRIDE_START) if s.strip()]
    for item in own:
        parse_override(item)
    if sep and not own:
        raise ConfigError(f"arm {spec!r}: no overrides after ':'")
    return Arm(name, (*ARMS.get(name, ()), *own))


def parse_arms(specs: Sequence[str]) -> list[Arm]:
    """Parse every spec; names must be unique because each names a run directory."""
    arms = [parse_arm(s) for s in specs]
    names = [a.name for a in arms]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise ConfigError(f"arm names must be unique, repeated: {', '.join(dupes)}")
    if not arms:
        raise ConfigError("no arms to compare")
    return arms


def train_from_config(cfg: Config, resume: str | None = None) -> dict[str, Any]:
    """`saorl.loop.train_from_config`, imported on first use.

    Importing the loop imports torch; `saorl report` and `write_compare_report` must not.
    Tests replace this module attribute with a fake trainer.
    """
    from saorl.loop import train_from_config as train

    return train(cfg, resume=resume)


def _toml_string(text: str) -> str:
    # A JSON string literal is a valid TOML basic string: paths with spaces or quotes survive.
    return json.dumps(text)


def _shared_overrides(
    overrides: Sequence[str], push_every: int | None, steps: int | None
) -> list[str]:
    shared = list(overrides)
    if steps is not None:
        shared.append(f"run.total_steps={int(steps)}")
    if push_every is not None:
        shared.append(f"learner.push_every={int(push_every)}")
    return shared


def _fixed_overrides(out_dir: Path, name: str) -> list[str]:
    return [
        f"run.output_dir={_toml_string(str(out_dir))}",
        f"run.name={_toml_string(name)}",
        "run.progress=false",
    ]


def _has_checkpoint(run_dir: Path) -> bool:
    # saorl.checkpoint's file-name pattern; that module imports torch, this one must not.
    ckpt = run_dir / "checkpoints"
    return ckpt.is_dir() and any(re.match(r"^step_\d{8}\.pt$", p.name) for p in ckpt.iterdir())


def _move_aside(run_dir: Path) -> Path:
    i = 1
    while (target := run_dir.with_name(f"{run_dir.name}.incomplete-{i}")).exists():
        i += 1
    run_dir.rename(target)
    return target


# Where an arm writes and whether it draws a progress bar do not change what it measures.
_BOOKKEEPING = {("run", "output_dir"), ("run", "name"), ("run", "progress")}


def _config_diff(saved: Path, cfg: Config) -> list[str]:
    """Keys where a finished arm's saved config.toml differs from what this call would run."""
    try:
        old = load_config(saved, [])
    except ConfigError:
        return []  # written by another version of the schema: nothing reliable to compare
    a, b = old.model_dump(), cfg.model_dump()
    return [
        f"{section}.{key}"
        for section in b
        for key in b[section]
        if a.get(section, {}).get(key) != b[section][key] and (section, key) not in _BOOKKEEPING
    ]


def _warn_if_changed(
    tag: str, run_dir: Path, base_config: Path | None, overrides: Sequence[str]
) -> None:
    """Say so when a finished arm was run with settings other than this call's.

    Its results would not be comparable with arms run now (say, after `--steps` changed); it
    is still skipped, because silently throwing away a finished run is worse.
    """
    try:
        changed = _config_diff(run_dir / "config.toml", load_config(base_config, overrides))
    except ConfigError:
        return
    if changed:
        _log(f"{tag}: NOTE it was run with different {', '.join(changed)}")


def _log(message: str) -> None:
    print(f"saorl compare: {message}", file=sys.stderr, flush=True)


def _run_arm(arm: Arm, cfg: Config, run_dir: Path) -> None:
    """Train (or resume) one arm; exceptions propagate to the caller, which records them."""
    (run_dir / FAILED_FILE).unlink(missing_ok=True)
    resume = None
    if _has_checkpoint(run_dir):
        resume = str(run_dir)
        _log(f"{arm.name}: resuming from its latest checkpoint in {run_dir}")
    elif (run_dir / METRICS_FILE).exists() or (run_dir / "checkpoints").exists():
        moved = _move_aside(run_dir)
        _log(f"{arm.name}: no checkpoint to resume from; moved the partial run to {moved}")
    summary = train_from_config(cfg, resume=resume)
    if not (run_dir / SUMMARY_FILE).exists():
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / SUMMARY_FILE).write_text(json.dumps(summary or {}, indent=2, default=str))


def run_compare(
    base_config: Path | None,
    overrides: Sequence[str],
    arms: Sequence[str],
    out_dir: Path,
    push_every: int | None = None,
    steps: int | None = None,
) -> Path:
    """Run every arm into `out_dir/<arm>` (skipping finished ones), then write the report.

    Returns the path of `out_dir/index.html`. Raises ConfigError when the arm list or the
    shared settings are invalid (nothing has run then); an arm whose own config is invalid or
    whose training raises is recorded as failed and the next arm runs.
    """
    out_dir = Path(out_dir)
    parsed = parse_arms(list(arms) or list(DEFAULT_ARMS))
    shared = _shared_overrides(overrides, push_every, steps)
    # Validates the shared part once, so a typo there is one error, not one failure per arm.
    load_config(base_config, [*shared, *_fixed_overrides(out_dir, "compare")])
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "base_config": None if base_config is None else str(base_config),
        "shared_overrides": shared,
        "arms": [{"name": a.name, "overrides": list(a.overrides)} for a in parsed],
    }
    (out_dir / MANIFEST_FILE).write_text(json.dumps(manifest, indent=2))

    for i, arm in enumerate(parsed, 1):
        run_dir = out_dir / arm.name
        tag = f"arm {i}/{len(parsed)} {arm.name}"
        arm_overrides = [*shared, *arm.overrides, *_fixed_overrides(out_dir, arm.name)]
        if (run_dir / SUMMARY_FILE).exists():
            _log(f"{tag}: finished earlier, skipped (delete {run_dir} to rerun it)")
            _warn_if_changed(tag, run_dir, base_config, arm_overrides)
            continue
        try:
            cfg = load_config(base_config, arm_overrides)
            _log(f"{tag}: training {cfg.run.total_steps} steps -> {run_dir}")
            _run_arm(arm, cfg, run_dir)
        # Any failure of one arm (bad config, NaN, OOM, a bug in one algorithm) must not lose
        # the arms already run or stop the ones after it; Ctrl-C still stops everything.
        except Exception as exc:
            run_dir.mkdir(parents=True, exist_ok=True)
            record = {"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
            (run_dir / FAILED_FILE).write_text(json.dumps(record, indent=2))
            _log(f"{tag}: FAILED: {record['error']}")
    return write_compare_report(out_dir, [a.name for a in parsed])


# ---------------------------------------------------------------------------------------------
# The report: read back, never train


COLUMNS = (
    "arm",
    "status",
    "initial_eval_accuracy",
    "final_eval_accuracy",
    "best_eval_accuracy",
    "best_eval_step",
    "collapse_step",
    "collapse_reason",
    "steps",
    "wall_seconds",
    "staleness_mean",
    "dropped_stale",
    "error",
    "overrides",
)


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
    """(one table row, the metrics rows) for the arm in `run_dir`, from whatever it left.

    `summary.json` is preferred where it has a figure (it is what the run itself reported);
    a failed or unfinished arm's figures come from its `metrics.jsonl` so far.
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
    row["wall_seconds"] = summary.get("wall_seconds", _last(rows, "time/wall_s"))
    stale = metric_series(rows, "async/staleness_mean")[1]
    row["staleness_mean"] = sum(stale) / len(stale) if stale else None
    row["dropped_stale"] = summary.get("dropped_stale", _last(rows, "async/dropped_stale"))
    return row, rows


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:.6g}"
    return value


def _html_value(key: str, value: Any) -> str:
    if value is None or value == "":
        return "-" if key not in ("error", "collapse_reason", "overrides") else ""
    if isinstance(value, float):
        text = f"{value:.1f}" if key == "wall_seconds" else f"{value:.3f}"
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
_TEXT_COLUMNS = ("arm", "status", "collapse_reason", "error", "overrides")


def _html(out_dir: Path, table: list[dict[str, Any]], png: Path, manifest: dict[str, Any]) -> str:
    title = f"saorl compare: {html.escape(out_dir.resolve().name)}"
    parts = [f"<!doctype html>\n<html><head><meta charset='utf-8'><title>{title}</title>"]
    parts.append(f"<style>{_STYLE}</style></head><body>\n<h1>{title}</h1>")
    if manifest:
        base = manifest.get("base_config") or "built-in defaults"
        shared = " ".join(manifest.get("shared_overrides") or []) or "none"
        parts.append(
            f"<p>Base config: <code>{html.escape(base)}</code>; shared overrides: "
            f"<code>{html.escape(shared)}</code>. Every arm shares these; the table lists "
            "each arm's own overrides.</p>"
        )
    parts.append(
        "<p>Collapse: first step where held-out accuracy (else the reward moving average) "
        "falls below half its best, or entropy / response length collapses "
        "(<code>saorl.collapse.detect_collapse</code>). Wall seconds are the RL phase.</p>"
    )
    parts.append("<table>\n<tr>" + "".join(f"<th>{c}</th>" for c in COLUMNS) + "</tr>")
    for row in table:
        classes = [row["status"]] + (["collapsed"] if row.get("collapse_step") is not None else [])
        cells = []
        for col in COLUMNS:
            css = ["text"] if col in _TEXT_COLUMNS else []
            if col == "collapse_step":
                css.append("collapse")
            text = _html_value(col, row.get(col))
            if col == "arm" and (out_dir / row["arm"] / "report.png").is_file():
                text = f"<a href='{html.escape(row['arm'])}/report.png'>{text}</a>"
            cells.append(f"<td class='{' '.join(css)}'>{text}</td>")
        parts.append(f"<tr class='{' '.join(classes)}'>" + "".join(cells) + "</tr>")
    parts.append("</table>")
    data = base64.b64encode(png.read_bytes()).decode("ascii")
    parts.append(f"<h2>Curves</h2>\n<img alt='comparison' src='data:image/png;base64,{data}'>")
    reports = [r["arm"] for r in table if (out_dir / r["arm"] / "report.png").is_file()]
    if reports:
        parts.append("<h2>Per-arm reports</h2>\n<div class='thumbs'>")
        for arm in reports:
            src = html.escape(f"{arm}/report.png")
            parts.append(f"<a href='{src}'><img alt='{html.escape(arm)}' src='{src}'></a>")
        parts.append("</div>")
    failures = [(r["arm"], _read_json(out_dir / r["arm"] / FAILED_FILE)) for r in table]
    failures = [(arm, f) for arm, f in failures if f.get("traceback")]
    if failures:
        parts.append("<h2>Failures</h2>")
        for arm, f in failures:
            parts.append(
                f"<details><summary>{html.escape(arm)}: {html.escape(str(f.get('error')))}"
                f"</summary><pre>{html.escape(str(f['traceback']))}</pre></details>"
            )
    parts.append("</body></html>\n")
    return "\n".join(parts)


def write_compare_report(out_dir: Path, arms: Sequence[str]) -> Path:
    """Write `compare.png`, `summary.csv` and `index.html` for `arms` in `out_dir`.

    `arms` are arm names (or specs: the part before ':' is the name), in table order. Reads
    only what the arm directories hold, so it works on a comparison still running, one that
    crashed, or one copied from another machine. Returns the path of `index.html`.
    """
    from saorl.report import COMPARE_FILE, plot_compare

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = _read_json(out_dir / MANIFEST_FILE)
    own = {a.get("name"): a.get("overrides", []) for a in manifest.get("arms", [])}
    names = [spec.partition(":")[0].strip() for spec in arms]
    table: list[dict[str, Any]] = []
    runs: dict[str, list[dict[str, Any]]] = {}
    collapses: dict[str, dict[str, Any] | None] = {}
    for name in names:
        row, rows = arm_result(out_dir / name)
        row["overrides"] = " ".join(own.get(name, ARMS.get(name, ())))
        table.append(row)
        if rows:
            runs[name] = rows
            collapses[name] = row["collapse"]

    png = plot_compare(
        runs, out_dir / COMPARE_FILE, f"saorl compare: {out_dir.resolve().name}", collapses
    )
    with (out_dir / "summary.csv").open("w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=COLUMNS)
        writer.writeheader()
        for row in table:
            writer.writerow({c: _csv_value(row.get(c)) for c in COLUMNS})
    index = out_dir / "index.html"
    index.write_text(_html(out_dir, table, png, manifest), encoding="utf-8")
    return index
