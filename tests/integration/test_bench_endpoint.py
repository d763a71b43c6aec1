"""benchmarks/bench_endpoint.py end to end at a toy size: the report's structure (every arm,
the paired throughput ratios and the added latency with their range over the repeats, the
machine's load), not its timings; and `--model small` is the built-in architecture, larger."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from saorl.config import load_config
from saorl.models.loading import load_policy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
import bench_endpoint  # benchmarks/ is a folder of scripts, not a package

pytest.importorskip("openai")  # the agent programs' client


def test_the_report_has_every_arm_and_the_spread_of_its_figures(tmp_path):
    out = tmp_path / "endpoint.json"
    argv = ["--episodes", "6", "--concurrent", "3", "--latency-episodes", "3", "--repeats", "2"]
    report = bench_endpoint.main([*argv, "--length", "3", "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert report["workload"]["model"] == "tiny" and report["model_parameters"] > 0
    assert set(report["arms"]) == {"inproc", "endpoint", "http"}
    for arm in report["arms"].values():
        assert len(arm["seconds"]) == len(arm["cpu_seconds"]) == 2
        assert len(arm["sequential_median_s_per_episode"]) == 2
        assert len(arm["sequential_median_s_outside_engine"]) == 2
        assert arm["trajectories_per_s"] > 0 and arm["cpu_ms_per_trajectory"] > 0
    figures_of_arms = (
        "throughput_ratio_over_inproc",
        "added_latency_ms_per_call",
        "added_latency_ms_per_call_outside_engine",
    )
    for figures in figures_of_arms:
        assert set(report[figures]) == {"endpoint", "http"}
        for s in report[figures].values():
            assert s["min"] <= s["median"] <= s["max"]
    assert {"load_average_at_start", "load_average_at_end"} <= set(report["machine"])


def test_episode_times_are_the_gaps_between_finishes():
    assert bench_endpoint.episode_seconds([0.5, 1.25, 3.0]) == [0.5, 0.75, 1.75]
    got = bench_endpoint.outside_engine([0.5, 1.25, 3.0], [0.25, 0.5, 1.5])
    assert got == pytest.approx([0.25, 0.25, 0.25])


def test_the_small_model_is_the_built_in_architecture_larger():
    tiny, _ = load_policy(load_config(None, bench_endpoint.MODELS["tiny"]).model)
    small, _ = load_policy(load_config(None, bench_endpoint.MODELS["small"]).model)
    assert type(small) is type(tiny)
    n = sum(p.numel() for p in small.parameters())
    assert n > 40 * sum(p.numel() for p in tiny.parameters()) and n > 20_000_000


def test_the_load_case_runs_both_servers_side_by_side(tmp_path):
    """`--load`: the threaded server (read from git) and the uvicorn one, each in a process of
    its own with the clients in another; the report's structure and what must hold whatever the
    timings: every call answered, and the uvicorn server's threads do not grow with the load."""
    from benchmarks._endpoint_load import threaded_available

    if not threaded_available():
        pytest.skip("the threaded server's commit is not in this checkout (a shallow clone)")
    out = tmp_path / "load.json"
    argv = ["--load", "12", "--load-calls", "2", "--length", "2", "--repeats", "1"]
    report = bench_endpoint.main([*argv, "--out", str(out)])
    assert json.loads(out.read_text()) == report
    assert set(report["runs"]) == {"threaded", "asgi"}
    for runs in report["runs"].values():
        (run,) = runs
        assert run["calls_answered"] == 24 and run["failed_calls"] == 0
        assert run["added_latency_ms"]["p50"] <= run["added_latency_ms"]["p99"]
        assert run["peak_rss_mb"] >= run["rss_before_mb"] > 0
    threaded, asgi = report["runs"]["threaded"][0], report["runs"]["asgi"][0]
    assert threaded["peak_threads"] >= threaded["threads_before"] + 12  # one per connection
    assert asgi["peak_threads"] < asgi["threads_before"] + 12
    assert set(report["median_over_repeats"]["asgi"]) >= {"added_latency_ms_p99", "peak_threads"}
