"""Run under torchrun: sharded checkpoints (torch.distributed.checkpoint) across world sizes.

    reshard_worker.py save DIR NAME   two learner steps, then a sharded checkpoint DIR/NAME and,
                                      beside it, the gathered whole state (NAME.ref.pt) and the
                                      next step's metrics and weights (NAME.next.pt)
    reshard_worker.py load DIR NAME OUT   a fresh sharded learner restored from DIR/NAME: its
                                      gathered state against NAME.ref.pt, then its next step
                                      against NAME.next.pt; differences as JSON in OUT

Every rank builds the same tiny policy and batch; the world size is torchrun's. Run by
`test_fsdp_reshard.py`, which holds the tolerances.
"""

from __future__ import annotations

import copy
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from saorl.checkpoint.dcp import counters, load_sharded, save_sharded
from saorl.checkpoint.io import (
    load_latest_checkpoint,
    save_checkpoint,
    sharded_checkpoint_path,
)
from saorl.distributed.fsdp import FSDPSharding
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch

OVERRIDES = (
    "critic.warmup_steps=0",
    "learner.batch_size=7",
    "learner.lr_warmup_steps=0",
    "learner.fsdp=true",
    "learner.micro_batch_size=3",
)
STEP_KEYS = ("loss/policy", "loss/value", "policy/grad_norm", "critic/grad_norm")


def _learner() -> tuple[Learner, object]:
    torch.manual_seed(0)
    policy, _ = load_policy(tiny_config().model)
    batch = _batch(policy, n=7)
    cfg = tiny_config(*OVERRIDES)
    sharding = FSDPSharding(cfg.learner.mixed_precision, torch.device("cpu"))
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu"), sharding), batch


def _flat(x: object, prefix: str = "") -> dict[str, object]:
    """Nested dicts and lists as one `path -> leaf` dict (optimizer states, counters)."""
    if isinstance(x, dict):
        return {k: v for key, val in x.items() for k, v in _flat(val, f"{prefix}{key}/").items()}
    if isinstance(x, list | tuple):
        return {k: v for i, val in enumerate(x) for k, v in _flat(val, f"{prefix}{i}/").items()}
    return {prefix.rstrip("/"): x}


def _diff(a: dict, b: dict) -> dict[str, float]:
    """Per entry: 0 when equal, the max abs difference of tensors, 1 for other mismatches."""
    fa, fb = _flat(a), _flat(b)
    out = {"keys": float(fa.keys() != fb.keys())}
    for k in fa.keys() & fb.keys():
        va, vb = fa[k], fb[k]
        if isinstance(va, torch.Tensor):
            same = va.shape == vb.shape and va.dtype == vb.dtype
            out[k] = (
                float((va.float() - vb.float()).abs().max())
                if same and va.numel()
                else (0.0 if same else 1.0)
            )
        else:
            out[k] = float(va != vb)
    return out


def save(folder: Path, name: str) -> None:
    learner, batch = _learner()
    learner.step(batch)
    learner.step(batch)
    ckpt, shards = folder / name, sharded_checkpoint_path(folder / name, learner.steps)
    groups = save_sharded(learner, shards)
    state = copy.deepcopy({**counters(learner), "param_groups": groups, "sharded": shards.name})
    # Gathered onto rank 0; copied, as at one rank the gathered tensors are the live ones.
    whole = copy.deepcopy(learner.state_dict())
    metrics = learner.step(batch)
    after = learner.state_dict()
    if dist.get_rank() == 0:
        save_checkpoint(ckpt, state["step"], state)
        torch.save(whole, folder / f"{name}.ref.pt")
        torch.save(
            {
                "metrics": {k: metrics[k] for k in STEP_KEYS},
                "policy": after["policy"],
                "critic": after["critic"],
            },
            folder / f"{name}.next.pt",
        )


def load(folder: Path, name: str, out: str) -> None:
    learner, batch = _learner()
    _, state = load_latest_checkpoint(folder / name)
    load_sharded(learner, state)
    restored = copy.deepcopy(learner.state_dict())
    metrics = learner.step(batch)
    after = learner.state_dict()
    if dist.get_rank() == 0:
        ref = torch.load(folder / f"{name}.ref.pt", weights_only=True)
        nxt = torch.load(folder / f"{name}.next.pt", weights_only=True)
        result = {
            "world": dist.get_world_size(),
            "restored": _diff(restored, ref),
            "next_metrics": {k: abs(metrics[k] - nxt["metrics"][k]) for k in STEP_KEYS},
            "next_weights": max(
                max(_diff(after[m], nxt[m]).values()) for m in ("policy", "critic")
            ),
            "moved": max(_diff(after["policy"], ref["policy"]).values()),
        }
        Path(out).write_text(json.dumps(result, indent=2))


def main() -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    mode, folder, name = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    if mode == "save":
        save(folder, name)
    else:
        load(folder, name, sys.argv[4])
    dist.destroy_process_group()
    # As in fsdp_worker.py: skip the interpreter's teardown, where torch sometimes aborts.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
