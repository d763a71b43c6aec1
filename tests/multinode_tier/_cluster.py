"""A Ray cluster of several nodes on this host, and `saorl train --ray-address` against it.

`ray.cluster_utils.Cluster` starts each node as processes of its own (a raylet and its workers;
the head also runs the GCS), as `ray start --head` and `ray start --address` do: actors on two
nodes are processes under two raylets, objects go from one node's object store to the other's,
and removing a node kills its processes as a machine that fails would (the nodes still share
this host's filesystem and loopback network). Every node carries a custom
resource naming its role (`learner_node`, `rollout_node`), which `ray.learner_resources` /
`ray.rollout_resources` ask for. Where actors ran is read back from the GCS's actor table (the
table Ray's state API serves; its HTTP front end, the dashboard, is not installed here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY_OVERRIDES

ROOT = Path(__file__).resolve().parents[2]
MULTINODE_TIER = [
    pytest.mark.multinode,
    pytest.mark.slow,
    pytest.mark.skipif(
        os.environ.get("SAORL_MULTINODE_TIER") != "1",
        reason="the multi-node tier runs from bash scripts/test_multinode_tier.sh",
    ),
]

# The tiny built-in model and a few steps: what runs where and what survives a lost node is
# the point, not what the model learns.
TINY = [
    *TINY_OVERRIDES,
    "learner.sft_steps=5",
    "env.eval_size=8",
    "run.eval_every=0",
    "run.save_hf=false",
    "run.trackers=[]",
    "run.log_samples_every=1",  # every trained trajectory's group id and versions
    "run.log_samples_count=8",
]
PINNED = [
    "ray.learner_resources={learner_node = 1}",
    "ray.rollout_resources={rollout_node = 1}",
    "ray.rollout_num_cpus=0.5",
]


class Nodes:
    """A head without CPUs (the GCS, as on a cluster's head node) and nodes added by role."""

    def __init__(self) -> None:
        from ray.cluster_utils import Cluster

        # A node that stops answering is declared dead after ~2 s (Ray's defaults wait longer).
        health = {"health_check_period_ms": 500, "health_check_failure_threshold": 4}
        self.cluster = Cluster(
            initialize_head=True,
            head_node_args={"num_cpus": 0, "include_dashboard": False, "_system_config": health},
        )
        self.address = self.cluster.address
        self.nodes: dict[str, Any] = {}

    def add(self, name: str, resources: dict[str, float], cpus: float = 1) -> str:
        """A node `name` with `cpus` CPUs and `resources`; its Ray node id."""
        node = self.cluster.add_node(num_cpus=cpus, resources=resources)
        self.nodes[name] = node
        return node.node_id

    def fresh(self) -> None:
        """This cluster shut down and a new one started (another address, no nodes)."""
        self.shutdown()
        self.__init__()  # type: ignore[misc]

    def remove(self, name: str) -> None:
        """Kill the node's processes at once, as a machine that fails."""
        self.cluster.remove_node(self.nodes.pop(name), allow_graceful=False)

    def actors(self) -> list[dict[str, Any]]:
        """Every actor the cluster has seen (alive or dead): class, node id, state."""
        table = self.cluster.global_state.actor_table(None)
        return [
            {
                "class": a["ActorClassName"],
                "node": a["Address"]["NodeID"],
                "state": a["State"],
            }
            for a in table.values()
        ]

    def shutdown(self) -> None:
        self.cluster.shutdown()


def train_cmd(address: str, run_dir: Path, *overrides: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "saorl",
        "train",
        "--ray-address",
        address,
        *TINY,
        *PINNED,
        f"run.output_dir={run_dir.parent}",
        f"run.name={run_dir.name}",
        *overrides,
    ]


def train_env() -> dict[str, str]:
    """The driver imports this checkout's saorl (the nodes' workers inherit the environment of
    the test process that started their raylets)."""
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    return {**os.environ, "PYTHONPATH": path}


def metrics(run_dir: Path) -> list[dict[str, Any]]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def train_rows(run_dir: Path) -> list[dict[str, Any]]:
    return [r for r in metrics(run_dir) if "loss/value" in r]


def samples(run_dir: Path) -> list[dict[str, Any]]:
    """Every trained trajectory (`run.log_samples_count` = the batch size): step, group id,
    the first and last policy version its tokens were sampled with."""
    path = run_dir / "samples.jsonl"
    rows = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return [r for r in rows if r["index"] is not None]


def dropped_stale(run_dir: Path) -> int:
    """Trajectories dropped as too stale over the whole run: `async/dropped_stale` counts from
    0 in each process (a resumed run starts again)."""
    total, last = 0, 0
    for r in train_rows(run_dir):
        now = r["async/dropped_stale"]
        total, last = total + (now - last if now >= last else now), now
    return total


def assert_each_task_trained_once(run_dir: Path) -> None:
    """Every task handed out (group ids 0 to the last, from the final checkpoint) was trained
    once, or is in that checkpoint as finished-untrained or in flight (a resume takes them
    up), or was dropped as too stale: tasks of lost actors ran again, once, and none is lost."""
    from saorl.checkpoint.io import list_checkpoints, load_state_file

    trained = [r["group_id"] for r in samples(run_dir)]
    assert len(trained) == len(set(trained)), sorted(i for i in trained if trained.count(i) > 1)
    state = load_state_file(list_checkpoints(run_dir)[-1])
    pending = {t["group_id"] for t in state["finished_untrained"]}
    pending |= {g for _, g in state["in_flight"]}
    assert not pending & set(trained), sorted(pending & set(trained))
    last = state["feed_group"][2]  # the last group id handed out
    missing = set(range(last + 1)) - set(trained) - pending
    assert len(missing) == dropped_stale(run_dir), sorted(missing)


def start_train(cmd: list[str], log: Path) -> subprocess.Popen:
    """`cmd` in the background, stdout and stderr into `log`."""
    with log.open("w") as f:
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=train_env(), text=True)


def wait_for(
    what: str, check: Any, proc: subprocess.Popen, log: Path, timeout: float = 300
) -> None:
    """Poll `check()` until true; fail if the run ends first or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while not check():
        if proc.poll() is not None:
            pytest.fail(
                f"the run ended (rc {proc.returncode}) before {what}:\n{log.read_text()[-4000:]}"
            )
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout:g} s")
        time.sleep(0.2)
