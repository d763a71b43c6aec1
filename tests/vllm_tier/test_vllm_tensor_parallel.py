"""Tensor parallelism on vLLM's CPU build: one engine, two worker processes.

`rollout.vllm_tensor_parallel_size = 2` runs vLLM's multiprocess executor under the engine
core in saorl's process (`saorl.engines.vllm.executor_args`). Checked here in a child process
(`_tp_child.py`; the workers are spawned and vLLM's process-wide state stays out of the tier's
other engines): a push reaches both workers and lands on requests in flight, every token's
version says which weights sampled it, and the log-probs of the tokens of each version are the
learner's under that version's weights. vLLM's CPU build binds each worker's threads to a NUMA
node; with one node (this machine) the cores are given by hand, one per worker.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.vllm_tier._marks import VLLM_TIER
from tests.vllm_tier.test_vllm_engine import ATOL

pytestmark = VLLM_TIER
ROOT = Path(__file__).resolve().parents[2]


def test_two_workers_take_every_push_and_keep_versions_exact():
    env = {
        **os.environ,
        "VLLM_CPU_OMP_THREADS_BIND": "0|1",
        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), str(ROOT)]),
    }
    child = ROOT / "tests" / "vllm_tier" / "_tp_child.py"
    out = subprocess.run(
        [sys.executable, str(child), "2"], capture_output=True, text=True, env=env, timeout=400
    )
    assert out.returncode == 0, out.stderr[-4000:]
    [line] = [x for x in out.stdout.splitlines() if x.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    # Three tokens under the first weights, the rest under the pushed ones (re-prefilled).
    versions = result["versions"]
    assert all(v[:3] == [0] * min(3, len(v)) and set(v[3:]) <= {1} for v in versions)
    assert sum(1 in v for v in versions) >= 2, versions
    assert result["gaps"]["0"] < ATOL and result["gaps"]["1"] < ATOL
