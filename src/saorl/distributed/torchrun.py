"""`torchrun ... -m saorl train learner.fsdp=true`: one FSDP2 learner over the torchrun ranks.

Rank 0 runs the whole loop (rollouts, evaluation, checkpoints) with a `LeaderLearner`; every
learner call that needs all ranks (a step, a state gather, a state load, a critic reset) is
announced first with `broadcast_object_list`, and the other ranks, in `follow`, make the same
call on their shard. Rollouts, evaluation, the supervised warm-up and the export use an
unsharded replica of the policy on rank 0, refreshed from the gathered weights whenever the
policy version has moved. Ray learner actors with `ray.learner_ranks > 1` run the same protocol
(`saorl.distributed.ray_actors.LearnerActor`).

A SIGTERM or Ctrl-C reaches every rank (torchrun passes it on): rank 0 asks every rank once per
step (`agree_stop`, an all-reduce of the signal each got), so all stop after the same step and
save it together (`saorl.run.signals`); the other ranks only note the signal and follow rank 0.

Checkpoints are sharded: every rank writes its shards with torch.distributed.checkpoint into
`checkpoints/step_X.dcp/`, then rank 0 writes the `.pt` with the counters and the rollout side
(`saorl.checkpoint.dcp`); a resume reads them at any number of ranks.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from saorl.checkpoint.dcp import COUNTERS, counters, load_sharded, save_sharded
from saorl.checkpoint.io import save_checkpoint, sharded_checkpoint_path
from saorl.config import Config, ConfigError
from saorl.distributed.fsdp import FSDPSharding
from saorl.evaluation.held_out import evaluate_policy
from saorl.learner.learner import Learner
from saorl.learner.sft import supervised_warmup
from saorl.models.loading import replace_dir, save_pretrained
from saorl.run.signals import StopSignals
from saorl.types import Batch


def _announce(command: str, payload: Any = None) -> Any:
    msg = [command, payload]
    dist.broadcast_object_list(msg, src=0)
    return msg


class LeaderLearner:
    """Rank 0's learner: a sharded `Learner` whose collective calls the other ranks mirror.

    Implements `saorl.interfaces.Learner` for the loop, and `policy` / `policy_state` for the
    rollout pool on rank 0 (`saorl.rollout.pool.WorkerPool`): `policy` is the full unsharded
    replica the engines copy.
    """

    def __init__(self, learner: Learner, replica: nn.Module) -> None:
        self._learner = learner
        self._replica = replica
        self._replica_version = learner.version

    @property
    def steps(self) -> int:
        return self._learner.steps

    @property
    def version(self) -> int:
        return self._learner.version

    @property
    def device(self) -> torch.device:
        return self._learner.device

    @property
    def policy(self) -> nn.Module:
        """The replica, brought up to date with the shards first if the policy moved."""
        if self._replica_version != self._learner.version:
            self.policy_state()
        return self._replica

    def policy_state(self) -> dict[str, torch.Tensor]:
        _announce("policy_state")
        state = self._learner.policy_state()
        self._replica.load_state_dict(state)
        self._replica_version = self._learner.version
        return state

    def push_state(self, full: bool = False) -> dict[str, torch.Tensor]:
        """`policy_state()`: a sharded learner has no LoRA adapters (a config error)."""
        return self.policy_state()

    def agree_stop(self, signum: int) -> int:
        """The signal any rank got (0: none), the same on every rank (`saorl.run.signals`)."""
        _announce("agree_stop")
        return _agree(signum, self.device)

    def step(self, batch: Batch) -> dict[str, Any]:
        _announce("step", batch)
        return self._learner.step(batch)

    def warm_up(self, spec: Any, tokenizer: Any, progress: Any) -> None:
        """Supervised warm-up of the replica, then replica -> shards and a fresh critic."""
        supervised_warmup(self._replica, tokenizer, spec, self._learner.cfg, progress)
        _announce("reset_from_policy")
        self._learner.sharding.load_state(self._learner.policy, self._replica.state_dict())
        self._learner.reset_critic_from_policy()
        self._replica_version = self._learner.version

    def load_critic(self, path: str) -> None:
        raise ConfigError("critic.init_from is not supported with learner.fsdp yet; unset one")

    def evaluate(self, spec: Any, tokenizer: Any) -> dict[str, float]:
        seed = self._learner.cfg.run.seed + 12345
        return evaluate_policy(self.policy, tokenizer, spec, self._learner.cfg, seed=seed)

    def state_dict(self) -> dict[str, Any]:
        """The whole learner state, gathered from every rank's shards onto rank 0."""
        _announce("state_dict")
        return self._learner.state_dict()

    def save(self, run_dir: Path, rollout_state: dict[str, Any]) -> None:
        """Every rank writes its shards (nothing is gathered), then rank 0 the `.pt` that
        commits the step; the shards go to a temporary directory renamed into place first."""
        learner = self._learner
        final = sharded_checkpoint_path(run_dir, learner.steps)
        tmp = final.with_name(f".{final.name}.tmp.{os.getpid()}")
        _announce("save_sharded", str(tmp))
        groups = save_sharded(learner, tmp)  # returns once every rank's shards are written
        replace_dir(tmp, final)
        state = {
            **counters(learner),
            "sharded": final.name,
            "param_groups": groups,
            "torch_rng": torch.get_rng_state(),
            **rollout_state,
        }
        save_checkpoint(run_dir, learner.steps, state, keep=learner.cfg.run.keep_last_checkpoints)

    def restore(self, state: dict[str, Any]) -> None:
        if "sharded" in state:  # written by ranks of any number; read by as many as there are
            payload = {k: state[k] for k in (*COUNTERS, "sharded", "param_groups")}
            _announce("load_sharded", payload)
            load_sharded(self._learner, payload)
            torch.set_rng_state(state["torch_rng"])
            self.policy_state()  # the replica from the restored shards
            return
        # A checkpoint with whole state dicts: rank 0 broadcasts them into every rank's shards.
        _announce("load_state", {k: state[k] for k in COUNTERS if k in state})
        self._learner.restore(state)
        self._replica.load_state_dict(state["policy"])
        self._replica_version = self._learner.version

    def export(self, tokenizer: Any, path: Path) -> None:
        save_pretrained(self.policy, tokenizer, path)

    def close(self) -> None:
        _announce("stop")
        dist.destroy_process_group()


def _agree(signum: int, device: torch.device) -> int:
    on = device if dist.get_backend() == "nccl" else torch.device("cpu")
    flag = torch.tensor([signum], dtype=torch.int64, device=on)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return int(flag.item())


def follow(learner: Learner, stops: StopSignals | None = None) -> None:
    """A rank > 0: make the learner calls rank 0 announces, until it says stop; a signal this
    rank got goes to rank 0 at its next `agree_stop`."""
    while True:
        command, payload = _announce("", None)
        if command == "agree_stop":
            _agree(stops.signum or 0 if stops is not None else 0, learner.device)
        elif command == "step":
            learner.step(payload)
        elif command == "policy_state":
            learner.policy_state()
        elif command == "state_dict":
            learner.state_dict()
        elif command == "load_state":
            learner.load_state(payload)
        elif command == "save_sharded":
            save_sharded(learner, Path(payload))
        elif command == "load_sharded":
            load_sharded(learner, payload)
        elif command == "reset_from_policy":
            learner.sharding.load_state(learner.policy, {})
            learner.reset_critic_from_policy()
        elif command == "stop":
            dist.destroy_process_group()
            return
        else:
            raise RuntimeError(f"FSDP follower: unknown command {command!r} from rank 0")


def torchrun_learner(cfg: Config, policy: nn.Module, device: torch.device) -> LeaderLearner | None:
    """Under torchrun (or in Ray learner actors) with `learner.fsdp`: this rank's learner.

    Rank 0 gets a `LeaderLearner` to run the loop with; every other rank follows rank 0's calls
    here until the run ends and gets None. `policy` must be the same on every rank (the same
    seed builds the same random-init or loaded weights).
    """
    if cfg.critic.init_from:
        raise ConfigError("critic.init_from is not supported with learner.fsdp yet; unset one")
    if cfg.critic.optimizer_offload:
        raise ConfigError(
            "critic.optimizer_offload is for the single-process learner; with learner.fsdp the "
            "critic's optimizer state is sharded over the ranks already: unset one"
        )
    if cfg.critic.device:
        raise ConfigError(
            "critic.device is for the single-process learner; with learner.fsdp the critic is "
            "sharded over the ranks' devices: unset critic.device"
        )
    if not dist.is_initialized():
        if device.type == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    if device.type == "cuda":
        device = torch.device("cuda", torch.cuda.current_device())
    # Sharding rewrites `policy` in place: rank 0 keeps an unsharded copy for the rollout side.
    replica = copy.deepcopy(policy) if dist.get_rank() == 0 else None
    sharding = FSDPSharding(cfg.learner.mixed_precision, device)
    learner = Learner(cfg, policy, device, sharding)
    if replica is None:
        with StopSignals(follower=True) as stops:  # noted, passed to rank 0: it decides
            follow(learner, stops)
        return None
    return LeaderLearner(learner, replica.to(device))
