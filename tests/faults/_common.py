"""Helpers shared by the fault-injection tests: a tiny run as a subprocess, its metrics."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

from tests.integration.test_resume import TINY as TINY_RUN

# A tiny synchronous run: nothing is in flight at a checkpoint, so a resumed run must match an
# uninterrupted one exactly (engine RNG, prompt RNG, torch RNG and optimizers all restored).
TINY_SYNC = [*TINY_RUN, "run.concurrency=sync", "run.checkpoint_every=1"]

# Timing-dependent columns; every other column of a synchronous run is a pure function of seeds.
TIMING_PREFIXES = ("perf/", "time/", "async/group_wait_s")


def saorl_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "saorl", *args]


def run_saorl(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        saorl_cmd(*args), capture_output=True, text=True, timeout=timeout, env=env
    )


def metric_rows(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def assert_same_metrics(got: list[dict], want: list[dict], tol: float = 1e-6) -> None:
    """Row by row, every non-timing column of `want` equal in `got` (floats within `tol`,
    relative or absolute: the engine's batch shapes after a restart may differ, which moves
    float rounding by ~1e-7 in e.g. `mismatch/max_abs_logprob_diff`; sampled tokens, rewards,
    losses and weights agree).

    `got` may hold extra `eval/` columns: a run that ended early (to be resumed) evaluated at
    its last step, which the uninterrupted run did not."""
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want, strict=True):
        extra = {k for k in a.keys() - b.keys() if k.startswith("eval/")}
        keys = {k for k in a.keys() | b.keys() if not k.startswith(TIMING_PREFIXES)} - extra
        for k in sorted(keys):
            va, vb = a.get(k), b.get(k)
            if isinstance(va, float) and isinstance(vb, float):
                assert math.isclose(va, vb, rel_tol=tol, abs_tol=tol), (a["step"], k, va, vb)
            else:
                assert va == vb, (a["step"], k, va, vb)
