"""A sharded (FSDP, torch.distributed.checkpoint) checkpoint resumed by a single-process learner.

Two gloo ranks write the checkpoint (tests/parity/reshard_worker.py); a learner without FSDP
reads it whole (`saorl.checkpoint.shards.WholeEntry`): weights and optimizer moments exactly as
saved, and the next step as the sharded learner took it. Shards that cannot be read give an
error that says what the checkpoint is and how to resume it.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import load_latest_checkpoint
from saorl.checkpoint.shards import open_sharded
from saorl.config import ConfigError
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch
from tests.parity.reshard_worker import OVERRIDES, STEP_KEYS
from tests.parity.test_fsdp_parity import LOSS_TOL, WEIGHT_TOL
from tests.parity.test_fsdp_reshard import _torchrun

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def saved(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("sharded")
    _torchrun(2, "save", str(d), "run")
    return d


def _plain_learner() -> tuple[Learner, object]:
    """The learner of reshard_worker.py, without FSDP, and its batch."""
    torch.manual_seed(0)
    policy, _ = load_policy(tiny_config().model)
    batch = _batch(policy, n=7)
    cfg = tiny_config(*(o for o in OVERRIDES if o != "learner.fsdp=true"))
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu")), batch


def test_a_single_process_learner_resumes_a_sharded_checkpoint(saved: Path):
    learner, batch = _plain_learner()
    _, state = load_latest_checkpoint(saved / "run")
    state = open_sharded(state)  # what the loop does
    assert "sharded" in state
    learner.load_state(state)
    ref = torch.load(saved / "run.ref.pt", weights_only=True)  # the gathered state at the save
    got = learner.state_dict()
    assert (got["step"], got["version"]) == (ref["step"], ref["version"])
    for module in ("policy", "critic"):
        assert got[module].keys() == ref[module].keys()
        for k, v in ref[module].items():
            assert torch.equal(got[module][k], v), (module, k)
        # Optimizer moments: the plain optimizer numbers parameters, FSDP names them.
        names = [n for g in ref[f"{module}_opt"]["param_groups"] for n in g["params"]]
        mine = got[f"{module}_opt"]["state"]
        assert len(mine) == len(names)
        for i, name in enumerate(names):
            for moment, value in ref[f"{module}_opt"]["state"][name].items():
                assert torch.equal(mine[i][moment], value), (module, name, moment)
    # The next step is the one the sharded learner took, up to another reduction order.
    nxt = torch.load(saved / "run.next.pt", weights_only=True)
    metrics = learner.step(batch)
    for k in STEP_KEYS:
        assert abs(metrics[k] - nxt["metrics"][k]) < LOSS_TOL, k
    after = learner.state_dict()
    for module in ("policy", "critic"):
        for k, v in nxt[module].items():
            assert (after[module][k] - v).abs().max() < WEIGHT_TOL, (module, k)


def test_unreadable_shards_say_what_the_checkpoint_is_and_how_to_resume_it(saved, tmp_path):
    run = tmp_path / "run"
    import shutil

    shutil.copytree(saved / "run", run)
    state = open_sharded(load_latest_checkpoint(run)[1])
    for shard in Path(state["sharded"]).glob("*.distcp"):
        shard.write_bytes(shard.read_bytes()[:64])  # damaged after the metadata was checked
    learner, _ = _plain_learner()
    with pytest.raises(ConfigError, match=r"sharded checkpoint.*torchrun.*any number of ranks"):
        learner.load_state(state)
