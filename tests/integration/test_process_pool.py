"""`run.concurrency = "process"`: rollout workers in child processes, weights in shared memory.

Real children (a fresh interpreter each, ~10 s to import torch and transformers on 2 busy
cores), the tiny built-in model, the real learner.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import list_checkpoints, load_latest_checkpoint, load_state_file
from saorl.config import ConfigError, load_config
from saorl.envs.factory import build_env
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from saorl.rollout.worker import PromptFeed
from saorl.types import Batch
from tests._procs import children_of
from tests.conftest import tiny_config
from tests.faults._common import metric_rows, saorl_cmd
from tests.faults.test_preemption import _rows_reach
from tests.integration.test_resume import TINY
from tests.integration.test_train_async import STOP_ON_MOST_CHARS

pytestmark = pytest.mark.slow

# A random-init model never solves addition: rewards, advantages and gradients would all be 0.
# This reward depends on the sampled text; the children import it by name (a monkeypatch in
# this process would not reach them).
REWARD = "env.reward_fns=['tests.integration.test_process_pool:odd_length']"


def odd_length(completion: str, **_: object) -> float:
    return float(len(completion) % 2)


@pytest.mark.timeout(240)
def test_saorl_train_with_rollout_processes_stops_on_sigterm_and_resumes(tmp_path: Path):
    run_dir = tmp_path / "r"
    args = [
        *TINY,
        "run.concurrency=process",
        "learner.max_staleness=2",
        "run.checkpoint_every=0",
        "run.save_hf=false",
        "run.trackers=[]",
        "run.eval_samples=1",
        "env.eval_size=8",
        REWARD,
        STOP_ON_MOST_CHARS,
        f"run.output_dir={tmp_path}",
        "run.name=r",
    ]
    cmd = saorl_cmd("train", *args, "run.total_steps=100000")
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _rows_reach(run_dir, 3, proc)
        kids = children_of(proc.pid, b"saorl.distributed.proc_actor")
        assert len(kids) == 1, kids  # rollout.num_workers = 1: one child
        proc.send_signal(signal.SIGTERM)  # finish the step, save with the child alive, stop
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err
    saved = load_latest_checkpoint(run_dir)[1]
    assert saved["step"] == metric_rows(run_dir)[-1]["step"] >= 3
    # The rollout side's pending work, as with threads: in-flight tasks (known to the driver
    # without asking the child) and finished ones not trained yet.
    assert "in_flight" in saved and "finished_untrained" in saved
    assert saved["in_flight"] or saved["finished_untrained"]
    deadline = time.monotonic() + 10
    while any(Path(f"/proc/{k}").exists() for k in kids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(Path(f"/proc/{k}").exists() for k in kids), "the rollout process outlived it"
    assert not list(Path("/dev/shm").glob("saorl-weights-*"))  # nothing left in memory files

    # Resume in this process, two more steps, and evaluate at the end.
    end = saved["step"] + 2
    cfg = load_config(None, [*args, f"run.total_steps={end}"])
    summary = train_from_config(cfg, resume=str(run_dir))
    assert summary["steps"] == end and summary["stopped_by"] == "total_steps"
    assert summary["final_eval_accuracy"] is not None
    rows = metric_rows(run_dir)
    assert [r["step"] for r in rows if r["step"] > saved["step"]] == [end - 1, end]
    assert all(r["perf/push_bytes"] > 0 for r in rows if r["step"] > 1)
    first, last = (
        load_state_file(p) for p in (list_checkpoints(run_dir)[0], list_checkpoints(run_dir)[-1])
    )
    assert (first["step"], last["step"]) == (0, end)
    assert all(not torch.equal(v, last["policy"][k]) for k, v in first["policy"].items())


@pytest.fixture(scope="module")
def placed(tmp_path_factory):
    """A learner and a pool of one rollout child, pumps running; the last test kills it."""
    from saorl.distributed.proc_pool import ProcWorkerPool

    cfg = tiny_config(
        f"run.output_dir={tmp_path_factory.mktemp('placed')}",
        "run.concurrency=process",
        "critic.warmup_steps=0",
        "learner.max_staleness=1",
        STOP_ON_MOST_CHARS,
    )
    torch.manual_seed(cfg.run.seed)
    policy, tokenizer = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    pool = ProcWorkerPool(cfg, tokenizer, learner)
    spec = build_env(cfg.env)
    feed = PromptFeed(spec.task, random.Random(0), cfg.learner.batch_size, 1)
    pool.start(spec, feed, None)
    try:
        yield cfg, learner, pool, tokenizer
    finally:
        pool.close()


def _engine_state(pool) -> dict[str, torch.Tensor]:
    return pool.workers[0].actor.call("engine_state")


def _perturb(learner: Learner) -> None:
    with torch.no_grad():
        for p in learner.policy.parameters():
            p.add_(0.01 * torch.randn_like(p))


@pytest.mark.timeout(120)
def test_a_push_reaches_the_child_and_labels_its_tokens(placed):
    cfg, learner, pool, tokenizer = placed
    n = cfg.learner.batch_size
    got = pool.collect(learner.version, n, cfg.learner.max_staleness)
    assert len(got.trajectories) == n and all(set(t.versions) == {0} for t in got.trajectories)
    before = _engine_state(pool)
    learner.step(Batch.from_trajectories(got.trajectories, tokenizer.pad_token_id))
    _perturb(learner)  # zero rewards move no weight: make sure every tensor differs
    assert learner.version == 1
    assert pool.update_weights() > 0
    for _ in range(20):  # tokens sampled under version 1 once the child has taken the push
        got = pool.collect(learner.version, n, cfg.learner.max_staleness)
        if any(1 in t.versions for t in got.trajectories):
            break
    else:
        raise AssertionError("no token sampled under the pushed weights")
    assert all(set(t.versions) <= {0, 1} for t in got.trajectories)
    after, want = _engine_state(pool), learner.policy_state()
    assert set(after) <= set(want)
    for k, v in after.items():
        assert torch.equal(v, want[k]), k  # the learner's weights, bit for bit
    assert all(not torch.equal(before[k], after[k]) for k in after)


@pytest.mark.timeout(120)
def test_a_killed_child_is_reported_then_replaced(placed):
    cfg, learner, pool, _ = placed
    n = cfg.learner.batch_size
    dead = pool.workers[0]
    os.kill(dead.actor.proc.pid, signal.SIGKILL)
    pool.collector.max_restarts = 0
    with pytest.raises(RuntimeError) as failed:
        for _ in range(50):  # trajectories already delivered come out first
            pool.collect(learner.version, n, cfg.learner.max_staleness)
    message = str(failed.value)
    assert "rollout-0 failed" in message and "run.max_worker_restarts=0" in message
    assert f"its process (pid {dead.actor.proc.pid}) died (killed by SIGKILL)" in message
    # With a restart allowed, a new child at the learner's current weights takes the dead
    # one's tasks and a batch forms.
    pool.collector.max_restarts = 1
    got = pool.collect(learner.version, n, cfg.learner.max_staleness)
    assert len(got.trajectories) == n and pool.collector.restarts == 1
    assert pool.workers[0] is not dead and pool.workers[0].error is None
    state, want = _engine_state(pool), learner.policy_state()
    assert all(torch.equal(v, want[k]) for k, v in state.items())


def test_unsupported_combinations_are_config_errors():
    with pytest.raises(ConfigError, match=r"with Ray \(--ray\) use run.concurrency = 'threads'"):
        tiny_config("run.concurrency=process", "ray.enabled=true")
    with pytest.raises(ConfigError, match=r"not rollout.engine = 'vllm'"):
        tiny_config("run.concurrency=process", "rollout.engine=vllm")


def test_shared_weights_skip_a_write_in_progress_and_what_is_not_newer():
    import pickle

    from saorl.distributed.proc_actor import SharedWeights

    state = {"a": torch.arange(6, dtype=torch.float32).view(2, 3), "b": torch.ones(3).half()}
    writer = SharedWeights(state, version=0)
    try:
        reader = pickle.loads(pickle.dumps(writer))  # maps the same memory, as a child does
        got, version = reader.read(["a", "b"], newer_than=-1)
        assert version == 0 and all(torch.equal(got[k], state[k]) for k in state)
        assert got["b"].dtype == torch.float16
        assert reader.read(["a"], newer_than=0) is None  # nothing newer
        writer.write({"a": state["a"] * 2}, version=3)  # a push of some of the tensors
        got, version = reader.read(["a"], newer_than=0)
        assert version == 3 and torch.equal(got["a"], state["a"] * 2)
        writer.header[0] += 1  # a write under way: the reader waits for the next look
        writer.header[1] = 4
        assert reader.read(["a"], newer_than=3) is None
    finally:
        writer.close()
