"""`saorl compare`: arms (algorithms, ablations) x seeds under identical settings, one report.

Why: the paper's claims are comparative (SAO keeps improving where async GRPO collapses after
~160 steps and VAPO after ~90), and a comparison only means something when every arm sees the
same seed, task, step budget and asynchrony. So the arms differ *only* by their own overrides:

    base config (--config) -> shared overrides -> --steps / --push-every -> run.seed (--seeds)
    -> the arm's overrides -> run.output_dir, run.name, run.progress=false

An arm's own overrides come after the shared ones, so a custom arm may deliberately vary a
shared setting (a staleness sweep: `stale4:learner.push_every=4`). One seed of one arm ran
0.533 and 0.570 in two comparisons, so `--seeds N` runs every arm with seeds run.seed,
run.seed+1, ... into `OUT/ARM/seedS` (one seed: `OUT/ARM`), seed by seed: all arms of the
first seed finish before the second starts, so a stopped comparison is a complete one over
fewer seeds. Runs go one after another by default (the CPU default has 2 cores; two runs side
by side would each get half and measure nothing about asynchrony); `--jobs J` runs J at a time,
each in its own process (`python -m saorl.experiments.compare RUN_JSON`), for machines with cores to
spare.

Every run of a comparison keeps its supervised warm-up in `OUT/warmup` (`learner.sft_cache`):
the arms at one seed share the same model, task and warm-up settings, so the warm-up is trained
once per seed and loaded by the other arms; an arm that changes any of them gets its own.

Runs are resumable: one with `summary.json` is done and skipped; one with a checkpoint is
resumed from it; one that got no checkpoint (stopped in its warm-up) is moved aside to
`NAME.incomplete-N` and started again. A run that raises (or whose process dies) is recorded in
its `failed.json` and the next one runs; a rerun retries it.

Arms and their syntax: `saorl.experiments.arms`; the report: `saorl.experiments.compare_report`.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from saorl.config import Config, ConfigError, load_config
from saorl.config.base import leaf_values
from saorl.config.io import toml_string
from saorl.experiments.arms import (  # noqa: F401  (re-exported: the public names of compare)
    ARMS,
    DEFAULT_ARMS,
    Arm,
    parse_arm,
    parse_arms,
    split_arms,
)
from saorl.experiments.compare_report import (  # noqa: F401
    FAILED_FILE,
    MANIFEST_FILE,
    SUMMARY_FILE,
    arm_result,
    failed_runs,
    write_compare_report,
)
from saorl.monitoring.metrics import METRICS_FILE
from saorl.security.child_python import module_argv
from saorl.security.safe_io import make_dir, open_write, write_atomic

WARMUP_DIR = "warmup"  # OUT/warmup: the supervised warm-ups the arms share (saorl.learner.sft)


def train_from_config(cfg: Config, resume: str | None = None) -> dict[str, Any]:
    """`saorl.loop.train_from_config`, imported on first use.

    Importing the loop imports torch; `saorl report` and `write_compare_report` must not.
    Tests replace this module attribute with a fake trainer.
    """
    from saorl.loop import train_from_config as train

    return train(cfg, resume=resume)


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
        f"run.output_dir={toml_string(str(out_dir))}",
        f"run.name={toml_string(name)}",
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


# Where an arm writes, whether it draws a progress bar and where its warm-up is cached do not
# change what it measures.
_BOOKKEEPING = {"run.output_dir", "run.name", "run.progress", "learner.sft_cache"}


def _config_diff(saved: Path, cfg: Config) -> list[str]:
    """Keys where a finished arm's saved config.toml differs from what this call would run."""
    try:
        old = load_config(saved, [])
    except ConfigError:
        return []  # written by another version of the schema: nothing reliable to compare
    a = leaf_values(old)
    b = leaf_values(cfg)
    return [key for key in b if a.get(key) != b[key] and key not in _BOOKKEEPING]


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
    """Train (or resume) one run; exceptions propagate to the caller, which records them."""
    (run_dir / FAILED_FILE).unlink(missing_ok=True)
    resume = None
    if _has_checkpoint(run_dir):
        resume = str(run_dir)
        _log(f"{arm.name}: resuming from its latest checkpoint in {run_dir}")
    elif (run_dir / METRICS_FILE).exists() or (run_dir / "checkpoints").exists():
        moved = _move_aside(run_dir)
        _log(f"{arm.name}: no checkpoint to resume from; moved the partial run to {moved}")
    summary = train_from_config(cfg, resume=resume)
    if (summary or {}).get("stopped_by") == "signal":  # saved; the whole comparison stops
        raise KeyboardInterrupt
    if not (run_dir / SUMMARY_FILE).exists():
        make_dir(run_dir, "run folder")
        write_atomic(run_dir / SUMMARY_FILE, json.dumps(summary or {}, indent=2, default=str))


@dataclass(frozen=True)
class Run:
    """One training run of a comparison: an arm at a seed, its directory and full overrides."""

    arm: Arm
    seed: int | None  # None: a single-seed comparison (the config's run.seed, OUT/ARM)
    run_dir: Path
    overrides: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.arm.name if self.seed is None else f"{self.arm.name}/seed{self.seed}"


def plan_runs(
    base_config: Path | None, shared: Sequence[str], arms: Sequence[Arm], out_dir: Path, seeds: int
) -> tuple[list[Run], list[int]]:
    """Every (arm, seed) run, seed-major, and the seeds; seeds start at the config's run.seed."""
    first = load_config(base_config, [*shared, *_fixed_overrides(out_dir, "compare")]).run.seed
    seed_list = [first + i for i in range(seeds)]
    # First, so a shared override (learner.sft_cache='') can switch the sharing off.
    cache = f"learner.sft_cache={toml_string(str(Path(out_dir).resolve() / WARMUP_DIR))}"
    runs = []
    for seed in seed_list if seeds > 1 else [None]:
        for arm in arms:
            if seed is None:
                where = out_dir
                name = arm.name
                own = []
            else:
                where = out_dir / arm.name
                name = f"seed{seed}"
                own = [f"run.seed={seed}"]
            overrides = (cache, *shared, *own, *arm.overrides, *_fixed_overrides(where, name))
            runs.append(Run(arm, seed, where / name, overrides))
    return runs, seed_list


def _record_failure(run_dir: Path, error: str, trace: str) -> None:
    make_dir(run_dir, "run folder")
    record = {"error": error, "traceback": trace}
    write_atomic(run_dir / FAILED_FILE, json.dumps(record, indent=2))


def run_one(run: Run, base_config: Path | None, tag: str) -> bool:
    """Train one run in this process, recording a failure instead of raising; True if it ran."""
    try:
        cfg = load_config(base_config, run.overrides)
        _log(f"{tag}: training {cfg.run.total_steps} steps -> {run.run_dir}")
        _run_arm(run.arm, cfg, run.run_dir)
        return True
    # Any failure of one run (bad config, NaN, OOM, a bug in one algorithm) must not lose the
    # runs already done or stop the ones after it; Ctrl-C still stops everything.
    except Exception as exc:
        _record_failure(run.run_dir, f"{type(exc).__name__}: {exc}", traceback.format_exc())
        _log(f"{tag}: FAILED: {type(exc).__name__}: {exc}")
        return False


def _spawn(run: Run, base_config: Path | None, tag: str) -> subprocess.Popen[bytes]:
    """`python -m saorl.experiments.compare RUN_JSON` for one run, its output appended to
    `RUN_DIR.log`."""
    run.run_dir.parent.mkdir(parents=True, exist_ok=True)
    spec = {
        "arm": run.arm.name,
        "overrides": list(run.overrides),
        "tag": tag,
        "run_dir": str(run.run_dir),
        "base_config": None if base_config is None else str(base_config),
    }
    with open_write(run.run_dir.parent / f"{run.run_dir.name}.log", "ab") as log:
        cmd = module_argv("saorl.experiments.compare", json.dumps(spec))  # isolated child
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)  # holds its own fd


def _run_parallel(pending: list[tuple[Run, str]], base_config: Path | None, jobs: int) -> None:
    running: list[tuple[Run, str, subprocess.Popen[bytes]]] = []
    try:
        while pending or running:
            while pending and len(running) < jobs:
                run, tag = pending.pop(0)
                running.append((run, tag, _spawn(run, base_config, tag)))
            time.sleep(0.2)
            for item in [r for r in running if r[2].poll() is not None]:
                running.remove(item)
                run, tag, proc = item
                done = finished(run.run_dir)
                if not done and not (run.run_dir / FAILED_FILE).exists():
                    # The process died without recording why (killed, out of memory).
                    log = run.run_dir.parent / f"{run.run_dir.name}.log"
                    _record_failure(
                        run.run_dir,
                        f"run process exited with code {proc.returncode}",
                        f"last output ({log}):\n{_tail(log)}",
                    )
                _log(f"{tag}: {'done' if done else 'FAILED'} (exit code {proc.returncode})")
    finally:
        for _, _, proc in running:  # Ctrl-C or an error here: stop the runs this call started
            proc.terminate()
        for _, _, proc in running:
            proc.wait()


def finished(run_dir: Path) -> bool:
    """Whether the run in `run_dir` ended: a summary.json, unless a signal's stop wrote it (that
    run has a checkpoint of where it stopped, and is resumed)."""
    try:
        summary = json.loads((run_dir / SUMMARY_FILE).read_text())
    except FileNotFoundError:
        return False
    except (OSError, ValueError):
        return True
    return not (isinstance(summary, dict) and summary.get("stopped_by") == "signal")


def _tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")[-chars:]
    except OSError:
        return ""


def run_compare(
    base_config: Path | None,
    overrides: Sequence[str],
    arms: Sequence[str],
    out_dir: Path,
    push_every: int | None = None,
    steps: int | None = None,
    seeds: int = 1,
    jobs: int = 1,
) -> Path:
    """Run every arm at every seed into `out_dir` (skipping finished runs), then the report.

    Returns the path of `out_dir/index.html`. Raises ConfigError when the arm list or the
    shared settings are invalid (nothing has run then); a run whose own config is invalid or
    whose training raises is recorded as failed and the next one runs.
    """
    if seeds < 1 or jobs < 1:
        raise ConfigError(f"--seeds and --jobs must be >= 1, got {seeds} and {jobs}")
    out_dir = Path(out_dir)
    parsed = parse_arms(list(arms) or list(DEFAULT_ARMS))
    shared = _shared_overrides(overrides, push_every, steps)
    # Validates the shared part once, so a typo there is one error, not one failure per run.
    runs, seed_list = plan_runs(base_config, shared, parsed, out_dir, seeds)
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest = {
        "base_config": None if base_config is None else str(base_config),
        "shared_overrides": shared,
        "seeds": seed_list if seeds > 1 else None,
        "arms": [{"name": a.name, "overrides": list(a.overrides)} for a in parsed],
    }
    write_atomic(out_dir / MANIFEST_FILE, json.dumps(manifest, indent=2))

    pending = []
    for i, run in enumerate(runs, 1):
        tag = f"run {i}/{len(runs)} {run.label}"
        if finished(run.run_dir):
            _log(f"{tag}: finished earlier, skipped (delete {run.run_dir} to rerun it)")
            _warn_if_changed(tag, run.run_dir, base_config, run.overrides)
        elif jobs == 1:
            run_one(run, base_config, tag)
        else:
            pending.append((run, tag))
    if pending:
        _run_parallel(pending, base_config, jobs)
    return write_compare_report(out_dir, [a.name for a in parsed], seed_list if seeds > 1 else None)


def _main(argv: Sequence[str]) -> int:
    """`python -m saorl.experiments.compare RUN_JSON`: one run of `saorl compare --jobs J`
    (J > 1)."""
    spec = json.loads(argv[0])
    base = None if spec["base_config"] is None else Path(spec["base_config"])
    overrides = tuple(spec["overrides"])
    run = Run(Arm(spec["arm"], overrides), None, Path(spec["run_dir"]), overrides)
    return 0 if run_one(run, base, spec["tag"]) else 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
