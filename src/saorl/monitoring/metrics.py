"""Metrics: a JSONL log (always), experiment trackers (`saorl.monitoring.tracking`) and a
progress display.

Every run writes `run_dir/metrics.jsonl`, one flat JSON object per `MetricsLogger.log` call with
namespaced keys (`rollout/reward_mean`, `loss/policy`, ...; docs/design.md section 4, rule 7) and
usually a `step` field. The file is opened in append mode so that a resumed run continues it; a
reader therefore sees the steps after the last checkpoint twice, and `saorl.monitoring.report`
keeps the last value per (key, step). Non-finite floats are written as `null` (JSON has no NaN).

`TrainProgress` shows a rich live display on a terminal; elsewhere (CI, a redirected log,
`enabled=False`) it prints one plain line to stderr every ~10% of the steps instead.
"""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from saorl.security.safe_io import make_dir, open_write, write_atomic

if TYPE_CHECKING:
    from rich.console import RenderableType
    from rich.progress import Progress, TaskID

METRICS_FILE = "metrics.jsonl"

JSONValue = float | int | str | bool | None


def _to_json_value(key: str, value: Any) -> JSONValue:
    """A JSON-safe scalar: numpy/torch scalars unwrapped, NaN/inf (and ints past float range)
    -> None."""
    if value is None or isinstance(value, str | bool):
        return value
    if isinstance(value, int) and value.bit_length() > 63:
        # Past int64: a float (trackers take nothing else), None past the float range; JSON
        # text could not even hold one of more than 4300 digits.
        try:
            return _to_json_value(key, float(value))
        except OverflowError:
            return None
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item"):  # numpy scalars, 0-d torch tensors: duck-typed, never imported
        try:
            item = value.item()
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"metric {key!r}: cannot convert {value!r} to a number") from exc
        if isinstance(item, int | float | bool):
            return _to_json_value(key, item)
    elif hasattr(value, "__float__"):
        return _to_json_value(key, float(value))
    raise TypeError(f"metric {key!r}: unsupported value type {type(value).__name__}")


class MetricsLogger:
    """Appends one JSON line per `log` call to `run_dir/metrics.jsonl`, and feeds trackers.

    Use as a context manager or call `close()`. Each tracker (`saorl.monitoring.tracking.Tracker`:
    TensorBoard, W&B, MLflow) gets every numeric value of every row (null ones skipped) at
    global step `metrics["step"]`, or the number of previous `log` calls when there is no
    `step` field. The logger closes them; leaving its `with` block by an exception closes them
    as failed.
    """

    def __init__(self, run_dir: Path, trackers: Sequence[Any] = ()) -> None:
        self.run_dir = Path(run_dir)
        make_dir(self.run_dir, "run folder")
        self.path = self.run_dir / METRICS_FILE
        self.trackers = list(trackers)
        _drop_partial_last_line(self.path)
        self._file = open_write(self.path, "a")
        self._calls = 0

    def log(self, metrics: Mapping[str, Any]) -> None:
        """Write `metrics` as one JSON line and flush it; NaN/inf become null."""
        if self._file.closed:
            raise RuntimeError(f"MetricsLogger for {self.path} is closed")
        row = {str(k): _to_json_value(str(k), v) for k, v in metrics.items()}
        self._file.write(json.dumps(row, allow_nan=False) + "\n")
        self._file.flush()
        if self.trackers:
            step = row.get("step")
            global_step = step if isinstance(step, int) and not isinstance(step, bool) else None
            global_step = self._calls if global_step is None else global_step
            scalars = {
                k: float(v) for k, v in row.items() if k != "step" and isinstance(v, int | float)
            }
            for tracker in self.trackers:
                tracker.log_metrics(scalars, global_step)
        self._calls += 1

    def log_samples(self, samples: Sequence[Mapping[str, Any]], step: int) -> None:
        """Hand one sample dump (`saorl.monitoring.samples`) to every tracker, as a table."""
        for tracker in self.trackers:
            tracker.log_samples(samples, step)

    def close(self, ok: bool = True) -> None:
        """Close the file and the trackers (`ok=False`: the run failed); safe to call twice."""
        if not self._file.closed:
            self._file.close()
        trackers, self.trackers = self.trackers, []
        errors = []
        for tracker in trackers:  # one tracker failing to close must not leave the others open
            try:
                tracker.close(ok)
            except Exception as exc:
                errors.append(exc)
        if errors:
            raise errors[0]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(ok=exc_type is None)


def _drop_partial_last_line(path: Path) -> None:
    """Cut a line left unfinished by a crash, so that appending after it stays valid JSONL."""
    if not path.is_file() or path.stat().st_size == 0:
        return
    with path.open("rb") as f:
        f.seek(-1, 2)
        if f.read(1) == b"\n":
            return  # the usual case: no need to read the whole file
    data = path.read_bytes()
    keep = data.rfind(b"\n") + 1  # 0 when the whole file is one partial line
    warnings.warn(
        f"{path}: dropping an unfinished last line ({len(data) - keep} bytes) before appending",
        stacklevel=3,
    )
    with open_write(path, "ab") as f:
        f.truncate(keep)


def read_metrics(path: Path) -> list[dict[str, Any]]:
    """The rows of a metrics JSONL file, in order; blank lines are ignored.

    A malformed *last* line is what a crash mid-write leaves: it is skipped with a warning.
    A malformed line anywhere else raises ValueError naming the file and the line number (a
    ConfigError: `saorl train --resume` reports it as a bad input, exit code 2).
    """
    from saorl.config import ConfigError

    path = Path(path)
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    last = max((i for i, line in enumerate(lines) if line.strip()), default=-1)
    rows: list[dict[str, Any]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            if i == last:
                warnings.warn(
                    f"{path}:{i + 1}: skipping a truncated last line ({exc.msg})", stacklevel=2
                )
                continue
            raise ConfigError(f"{path}:{i + 1}: malformed metrics line: {exc.msg}") from exc
        except (ValueError, RecursionError) as exc:  # nested too deeply, or a huge integer
            why = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)[:100]
            raise ConfigError(f"{path}:{i + 1}: unreadable metrics line: {why}") from None
        if not isinstance(row, dict):
            raise ConfigError(f"{path}:{i + 1}: expected a JSON object, got {type(row).__name__}")
        rows.append(row)
    return rows


def truncate_metrics(path: Path, max_step: int) -> int:
    """Drop rows with `step > max_step` (logged after the checkpoint a run resumes from).

    Those steps are trained again after a resume; keeping both copies would log them twice.
    The file is rewritten atomically (temp file + rename). Returns the number of rows dropped.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    _drop_partial_last_line(path)
    rows = read_metrics(path)
    keep = [r for r in rows if not isinstance(r.get("step"), int) or r["step"] <= max_step]
    if len(keep) == len(rows):
        return 0
    write_atomic(path, "".join(json.dumps(r) + "\n" for r in keep))
    return len(rows) - len(keep)


def _fmt(value: Any, spec: str = ".3f") -> str:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return format(value, spec)
    return "-"


def _fmt_rate(value: Any) -> str:
    if not isinstance(value, int | float) or not math.isfinite(value):
        return "-"
    return f"{value / 1000:.1f}k" if abs(value) >= 1000 else f"{value:.0f}"


def _fmt_time(seconds: float | None) -> str:
    if seconds is None or not math.isfinite(seconds):
        return "-:--:--"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


class TrainProgress:
    """Training progress: rich live display on a terminal, sparse plain lines elsewhere.

    On a terminal (stdout is a tty and `enabled`): a bar with step/total, elapsed and ETA and the
    latest reward (`rollout/reward_mean`), held-out accuracy (`eval/accuracy`), rollout
    throughput (`perf/rollout_tokens_per_s`) and staleness (`async/staleness_mean`); each field
    keeps the latest value seen, so an evaluation every N steps stays visible in between.
    `phase(description, total)` adds a second bar (warm-up, evaluation) advanced with
    `advance()`. `alert(text)` (a detected collapse) stays at the end of the info line.

    Otherwise (`enabled=False`, CI, output redirected to a file) nothing is drawn; instead one
    plain line goes to stderr, through `print(..., file=sys.stderr)`, each time the step
    crosses a multiple of ~10% of `total_steps` (so at most ~11 lines per run), plus one line
    when a phase starts and ends. stderr because stdout is for results (`saorl train`'s summary).
    """

    _FIELDS = (
        ("reward", "rollout/reward_mean", ".3f"),
        ("eval acc", "eval/accuracy", ".3f"),
        ("tok/s", "perf/rollout_tokens_per_s", "rate"),
        ("staleness", "async/staleness_mean", ".2f"),
    )

    def __init__(self, total_steps: int, enabled: bool = True, initial_step: int = 0) -> None:
        self.total_steps = max(0, int(total_steps))
        self.initial_step = int(initial_step)
        self.step = self.initial_step
        self.live = enabled and sys.stdout.isatty()
        self._latest: dict[str, Any] = {}
        self._alert: str | None = None
        self._interval = max(1, math.ceil(self.total_steps / 10))
        self._next_print = (self.initial_step // self._interval + 1) * self._interval
        self._last_printed: int | None = None
        self._start: float | None = None
        self._progress: Progress | None = None
        self._task: TaskID | None = None
        self._phase: Phase | None = None

    def start(self) -> None:
        """Start the clock (and the live display); `update` calls it if needed."""
        if self._start is not None:
            return
        self._start = time.monotonic()
        if not self.live:
            return
        self._progress = _rich_progress(self)
        self._task = self._progress.add_task(
            "train", total=self.total_steps, completed=self.initial_step
        )
        self._progress.start()

    def close(self) -> None:
        """Stop the display; in plain mode print the last step if it was not printed yet."""
        if self._start is None:
            return
        if self._phase is not None:
            self._phase.close()
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        elif self.step != self._last_printed and self.step != self.initial_step:
            self._print_line()
        self._start = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def info_line(self) -> str:
        """The latest reward, held-out accuracy, throughput and staleness, on one line."""
        parts = []
        for label, key, spec in self._FIELDS:
            value = self._latest.get(key)
            shown = _fmt_rate(value) if spec == "rate" else _fmt(value, spec)
            parts.append(f"{label} {shown}")
        if self._alert:
            parts.append(self._alert)
        return " | ".join(parts)

    def alert(self, text: str) -> None:
        """Show `text` at the end of the info line from now on (the caller logs it once)."""
        self._alert = text

    def update(self, step: int, metrics: Mapping[str, Any]) -> None:
        """Record that `step` steps are done, with that step's metrics (keys may be missing)."""
        self.start()
        self.step = int(step)
        for _, key, _ in self._FIELDS:
            value = metrics.get(key)
            if isinstance(value, int | float) and not isinstance(value, bool):
                self._latest[key] = value
        if self._progress is not None and self._task is not None:
            self._progress.update(self._task, completed=self.step)
            return
        if self.step >= self._next_print or self.step == self.total_steps:
            self._print_line()
            self._next_print = (self.step // self._interval + 1) * self._interval

    def _print_line(self) -> None:
        elapsed = time.monotonic() - (self._start or time.monotonic())
        done = self.step - self.initial_step
        eta = (self.total_steps - self.step) * elapsed / done if done > 0 else None
        pct = 100 * self.step / self.total_steps if self.total_steps else 100.0
        print(
            f"step {self.step}/{self.total_steps} ({pct:.0f}%) | elapsed {_fmt_time(elapsed)}"
            f" | eta {_fmt_time(eta)} | {self.info_line()}",
            file=sys.stderr,
            flush=True,
        )
        self._last_printed = self.step

    def phase(self, description: str, total: int) -> Phase:
        """Show a second bar for a phase (warm-up, evaluation).

        `advance()` on the returned object (or on this one) moves it. The bar goes away when the
        phase reaches `total`, when a `with` block around it ends, when the next phase starts,
        or when this display closes, whichever comes first.
        """
        self.start()
        if self._phase is not None:
            self._phase.close()
        self._phase = Phase(self, description, total)
        return self._phase

    def advance(self, n: int = 1) -> None:
        """Advance the current phase by `n`; a no-op when there is none."""
        if self._phase is not None:
            self._phase.advance(n)


def _rich_progress(owner: TrainProgress) -> Progress:
    """The bars (train, then the current phase) with `owner.info_line()` on a line below.

    The metrics get their own line so that the bars keep their width on an 80-column terminal.
    """
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )
    from rich.text import Text

    class _Bars(Progress):
        def get_renderables(self) -> Iterable[RenderableType]:
            yield self.make_tasks_table(self.tasks)
            if owner.step != owner.initial_step or owner._latest:
                yield Text(owner.info_line(), overflow="fold")

    return _Bars(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )


class Phase:
    """One phase bar of a `TrainProgress`; made by `TrainProgress.phase`."""

    def __init__(self, owner: TrainProgress, description: str, total: int) -> None:
        self._owner = owner
        self.description = description
        self.total = max(0, int(total))
        self.completed = 0
        self._start = time.monotonic()
        self._closed = False
        self._task: TaskID | None = None
        progress = owner._progress
        if progress is not None:
            self._task = progress.add_task(description, total=self.total)
        else:
            print(f"{description}: started ({self.total} to do)", file=sys.stderr, flush=True)

    def advance(self, n: int = 1) -> None:
        """Count `n` more units of this phase as done."""
        if self._closed:
            return
        self.completed += n
        progress = self._owner._progress
        if progress is not None and self._task is not None:
            progress.update(self._task, advance=n)
        if self.completed >= self.total:
            self.close()

    def close(self) -> None:
        """Remove the bar (plain mode: print how far the phase got and how long it took)."""
        if self._closed:
            return
        self._closed = True
        progress = self._owner._progress
        if progress is not None and self._task is not None:
            progress.remove_task(self._task)
        else:
            took = _fmt_time(time.monotonic() - self._start)
            print(
                f"{self.description}: done {self.completed}/{self.total} in {took}",
                file=sys.stderr,
                flush=True,
            )
        if self._owner._phase is self:
            self._owner._phase = None

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
