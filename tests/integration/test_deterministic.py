"""run.deterministic: two runs of one config are the same run (metrics and weights), with the
staleness set by learner.push_every instead of by thread timing."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from saorl.config import ConfigError
from saorl.loop import train_from_config
from tests.conftest import tiny_config
from tests.faults._common import TIMING_PREFIXES, metric_rows
from tests.integration.test_resume import TINY

RUN = [
    *TINY,
    "run.deterministic=true",
    "learner.push_every=2",
    "run.total_steps=6",
    "run.eval_every=3",
    "run.trackers=[]",
    "run.log_samples_every=0",
]


def _weights(run_dir: Path) -> dict[str, torch.Tensor]:
    files = sorted((run_dir / "final").glob("*.safetensors"))
    assert files, f"no safetensors in {run_dir / 'final'}"
    return {k: v for f in files for k, v in load_file(f).items()}


def test_two_deterministic_runs_are_identical(tmp_path: Path):
    for name in ("a", "b"):
        train_from_config(tiny_config(*RUN, f"run.output_dir={tmp_path}", f"run.name={name}"))
    rows_a, rows_b = metric_rows(tmp_path / "a"), metric_rows(tmp_path / "b")
    assert [r["step"] for r in rows_a] == [r["step"] for r in rows_b] == list(range(7))
    for a, b in zip(rows_a, rows_b, strict=True):
        for key in sorted(a.keys() | b.keys()):
            if not key.startswith(TIMING_PREFIXES):
                assert a.get(key) == b.get(key), (a["step"], key)  # exactly, not within a tol
    # Pushed every 2 versions: the second batch after a push was sampled one version back.
    assert max(r.get("async/staleness_max", 0) for r in rows_a) == 1
    wa, wb = _weights(tmp_path / "a"), _weights(tmp_path / "b")
    assert wa.keys() == wb.keys()
    assert all(torch.equal(wa[k], wb[k]) for k in wa)
    assert not torch.are_deterministic_algorithms_enabled()  # restored for the caller


def test_deterministic_sets_sync_and_refuses_threads():
    assert tiny_config("run.deterministic=true").run.concurrency == "sync"
    with pytest.raises(ConfigError, match=r"run\.deterministic"):
        tiny_config("run.deterministic=true", "run.concurrency=threads")
