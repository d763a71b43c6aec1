"""`saorl train --ray-address` on a Ray cluster of three nodes on this host (`_cluster.py`).

The learner is pinned to the node with `learner_node` and the rollout actors to the node with
`rollout_node` (`ray.learner_resources` / `ray.rollout_resources`); where they ran is read from
the GCS's actor table. Weights cross nodes on every push (the object store), and the engines'
per-token versions and log-probs show they arrived: no trajectory gets staler than
`learner.max_staleness`, and tokens sampled by the learner's current version have the
learner's log-probs. Then nodes are lost mid-run: one of two rollout nodes (the run goes on
with the other's actor while the lost actor's replacement waits for room), then the other (the
run waits, and goes on when a new node joins and takes both replacements); and the learner's
node (the run stops, says how to resume, and `--resume` on a fresh cluster finishes it).
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

from tests.multinode_tier._cluster import (
    MULTINODE_TIER,
    assert_each_task_trained_once,
    samples,
    start_train,
    train_cmd,
    train_env,
    train_rows,
    wait_for,
)

pytestmark = MULTINODE_TIER


def _placed(cluster, cls: str) -> set[str]:
    return {a["node"] for a in cluster.actors() if a["class"] == cls}


def test_learner_and_rollout_actors_on_their_own_nodes(nodes, tmp_path: Path) -> None:
    learner_node = nodes.add("learner", {"learner_node": 1})
    rollout_node = nodes.add("rollout", {"rollout_node": 2})
    run = tmp_path / "placed"
    out = subprocess.run(
        train_cmd(nodes.address, run, "rollout.num_workers=2", "run.total_steps=8"),
        capture_output=True,
        text=True,
        timeout=600,
        env=train_env(),
    )
    assert out.returncode == 0, out.stderr[-4000:]
    # Both nodes had a CPU for either role: only the resources put them where they are.
    assert _placed(nodes, "LearnerActor") == {learner_node}
    rollouts = [a for a in nodes.actors() if a["class"] == "RolloutActor"]
    assert len(rollouts) == 2 and {a["node"] for a in rollouts} == {rollout_node}
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 8
    rows = train_rows(run)
    assert [r["step"] for r in rows] == list(range(1, 9))
    # Every step after the critic's warm-up step (the policy stays) pushed the whole policy to
    # the other node...
    pushed = [r for r in rows if "perf/push_bytes" in r]
    assert [r["step"] for r in pushed] == list(range(2, 9))
    assert len({r["perf/push_bytes"] for r in pushed}) == 1 and pushed[0]["perf/push_bytes"] > 0
    # ... and the engines sampled with what came: the versions their tokens carry advance.
    newest = {}
    for r in samples(run):
        newest[r["step"]] = max(newest.get(r["step"], 0), r["versions"][1])
    by_step = [newest[s] for s in sorted(newest)]
    # (step 8 trains at version 6: its tokens are of version 6 - learner.max_staleness or newer;
    # engines stuck at version 0 would have every later trajectory dropped as too stale.)
    assert by_step == sorted(by_step) and by_step[-1] >= 2, by_step
    assert all(r["async/staleness_max"] <= 4 for r in rows)  # learner.max_staleness
    assert_each_task_trained_once(run)
    # Tokens sampled by the learner's current version have the learner's log-probs.
    current = [r for r in rows if r.get("mismatch/tokens")]
    assert current, "no token of the learner's current version was trained"
    assert max(r["mismatch/max_abs_logprob_diff"] for r in current) < 1e-4


def test_lost_rollout_nodes_the_run_goes_on_then_waits_for_a_new_node(nodes, runs, tmp_path):
    learner_node = nodes.add("learner", {"learner_node": 1})
    first = nodes.add("rollout-a", {"rollout_node": 1})
    second = nodes.add("rollout-b", {"rollout_node": 1})
    run, log = tmp_path / "rollout-lost", tmp_path / "rollout-lost.log"
    cmd = train_cmd(
        nodes.address, run, "rollout.num_workers=2", "run.total_steps=40", "ray.start_timeout_s=120"
    )
    proc = start_train(cmd, log)
    runs.append(proc)
    wait_for("step 3", lambda: len(train_rows(run)) >= 3, proc, log)
    nodes.remove("rollout-a")  # one rollout actor goes with it; no node has room for another
    wait_for("the restart", lambda: "restarting it (1/3)" in log.read_text(), proc, log)
    # The run goes on with the other actor while the replacement waits for a node.
    steps = len(train_rows(run))
    wait_for("steps with one actor", lambda: len(train_rows(run)) >= steps + 3, proc, log)
    nodes.remove("rollout-b")  # now no rollout actor is left...
    wait_for("the second restart", lambda: "restarting it (2/3)" in log.read_text(), proc, log)
    time.sleep(3)  # (batches already finished may still train)
    stalled = len(train_rows(run))
    time.sleep(3)
    assert len(train_rows(run)) == stalled < 40  # ... and the run waits for a node
    new = nodes.add("rollout-c", {"rollout_node": 2})  # which joins now: both replaced there
    assert proc.wait(timeout=300) == 0, log.read_text()[-4000:]
    assert _placed(nodes, "LearnerActor") == {learner_node}
    assert _placed(nodes, "RolloutActor") == {first, second, new}
    rows = train_rows(run)
    assert [r["step"] for r in rows] == list(range(1, 41))
    assert rows[-1]["rollout/worker_restarts"] == 2
    assert_each_task_trained_once(run)
    # The replacements sampled with the learner's current weights: the versions their tokens
    # carry in the last step are recent ones.
    assert max(r["versions"][1] for r in samples(run) if r["step"] == 40) >= 34


def test_a_lost_learner_node_stops_the_run_and_resume_finishes_it(nodes, runs, tmp_path: Path):
    nodes.add("learner", {"learner_node": 1})
    nodes.add("rollout", {"rollout_node": 1})
    run, log = tmp_path / "learner-lost", tmp_path / "learner-lost.log"
    cmd = train_cmd(nodes.address, run, "run.total_steps=10", "run.checkpoint_every=3")
    proc = start_train(cmd, log)
    runs.append(proc)
    checkpoint = run / "checkpoints" / "step_00000006.pt"
    wait_for("the checkpoint of step 6", checkpoint.exists, proc, log)
    nodes.remove("learner")
    assert proc.wait(timeout=120) == 1
    err = log.read_text()
    # (Or the weights it had pushed went with its node while an engine was fetching them.)
    died = r"learner: (the Ray actor died|the weights it pushed were lost)"
    assert re.search(died, err), err[-4000:]
    hint = f"resume with: saorl train --resume {run} --ray-address ADDRESS"
    assert hint in err and "Traceback" not in err, err[-4000:]
    stopped_at = len(train_rows(run))
    assert 6 <= stopped_at < 10

    nodes.fresh()  # a new cluster: as after losing a machine, not the same processes
    learner_node = nodes.add("learner", {"learner_node": 1})
    nodes.add("rollout", {"rollout_node": 1})
    resumed = subprocess.run(
        [*cmd[:3], "train", "--resume", str(run), "--ray-address", nodes.address],
        capture_output=True,
        text=True,
        timeout=600,
        env=train_env(),
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert _placed(nodes, "LearnerActor") == {learner_node}  # the saved pins hold
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 10
    # From the checkpoint of step 6 on: rows past it were cut and trained again, once.
    rows = train_rows(run)
    assert [r["step"] for r in rows] == list(range(1, 11))
    assert_each_task_trained_once(run)
    assert all(r["async/staleness_max"] <= 4 for r in rows)
