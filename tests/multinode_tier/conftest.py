"""The multi-node tier's cluster fixture (`_cluster.Nodes`)."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator

import pytest

from tests.multinode_tier._cluster import Nodes


@pytest.fixture
def nodes() -> Iterator[Nodes]:
    """An emulated cluster, shut down (every process of every node) whatever the test did."""
    ray = pytest.importorskip("ray")
    assert not ray.is_initialized()
    cluster = Nodes()
    try:
        yield cluster
    finally:
        cluster.shutdown()


@pytest.fixture
def runs(nodes: Nodes) -> Iterator[list[subprocess.Popen]]:
    """Background `saorl train` processes of a test: killed (before its cluster goes) if a
    test left one running."""
    procs: list[subprocess.Popen] = []
    yield procs
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait(timeout=30)
