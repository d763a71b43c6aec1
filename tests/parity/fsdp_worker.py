"""Run under `torchrun --nproc_per_node 2`: the FSDP2 learner against the single-process one.

Every rank builds the same tiny policy and batch; rank 0 also runs the plain learner. Per case:
two learner steps (each K=2 critic steps + one policy step; the second Adam step depends on the
gradient magnitudes, the first is nearly sign(g) * lr), then the sharded weights are gathered
and compared on rank 0; a sharded learner loaded from the state gathered after step 1 must take
step 2 exactly like the original. Writes `{case: {quantity: max abs difference}}` as JSON to
argv[1]; `test_fsdp_parity.py` holds the tolerances.
"""

from __future__ import annotations

import copy
import json
import os
import sys

import torch
import torch.distributed as dist

from saorl.distributed.fsdp import FSDPSharding
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch

CASES = {
    # 7 rows over 2 ranks (4 + 3) in micro-batches of 3: rank 1 runs a filler pass.
    "padded": ("learner.micro_batch_size=3",),
    "packed": ("learner.micro_batch_tokens=24",),
    # VAPO: 4 mini-batches of 1-2 rows over 2 ranks, the LM loss on the correct rows, the whole
    # critic training; group_size 7 only so that the batch of 7 holds whole groups.
    "vapo_seq_mean": (
        "algorithm.name=vapo",
        "algorithm.group_size=7",
        "algorithm.loss_agg=seq_mean_token_mean",
    ),
}
COMMON = ("critic.warmup_steps=0", "learner.batch_size=7", "learner.lr_warmup_steps=0")
COUNTERS = ("step", "version", "policy_sched", "skipped_steps", "baseline")


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _adam_rel_diff(sharded: dict, plain: torch.optim.Optimizer, names: list[str]) -> float:
    """Max relative difference of Adam's first moment (0.1 * g after one step): the gradient."""
    ref = plain.state_dict()["state"]
    worst = 0.0
    for i, name in enumerate(names):
        got, want = sharded["state"][name]["exp_avg"], ref[i]["exp_avg"]
        worst = max(worst, float((got - want).abs().max() / want.abs().max().clamp(min=1e-12)))
    return worst


def _plain(cfg):  # the single-process learner for the same config
    return cfg.model_copy(update={"learner": cfg.learner.model_copy(update={"fsdp": False})})


def _sharded(cfg, policy):  # the learner of this rank, sharded over both ranks
    sharding = FSDPSharding(cfg.learner.mixed_precision, torch.device("cpu"))
    return Learner(cfg, copy.deepcopy(policy), torch.device("cpu"), sharding)


def main(out_path: str) -> None:
    dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rank = dist.get_rank()
    torch.manual_seed(0)
    policy, _ = load_policy(tiny_config().model)
    batch = _batch(policy, n=7)
    results: dict[str, dict[str, float]] = {}
    for case, overrides in CASES.items():
        cfg = tiny_config(*COMMON, *overrides, "learner.fsdp=true")
        sharded = _sharded(cfg, policy)
        assert sharded.sharding.world == 2
        m1 = sharded.step(batch)
        state1 = sharded.state_dict()  # collective: gathered onto rank 0
        m2 = sharded.step(batch)
        state2, pushed = sharded.state_dict(), sharded.policy_state()
        reloaded = _sharded(cfg, policy)
        reloaded.load_state(state1 if rank == 0 else {k: state1[k] for k in COUNTERS})
        m_reload, after_reload = reloaded.step(batch), reloaded.policy_state()
        if rank != 0:
            continue
        plain = Learner(_plain(cfg), copy.deepcopy(policy), torch.device("cpu"))
        p1 = plain.step(batch)
        names = [n for n, p in plain.policy.named_parameters() if p.requires_grad]
        adam1 = _adam_rel_diff(state1["policy_opt"], plain.policy_opt, names)
        p2 = plain.step(batch)
        r = {
            f"{k}@{i}": abs(m[k] - p[k])
            for i, (m, p) in enumerate(((m1, p1), (m2, p2)), 1)
            for k in (
                "loss/policy",
                "loss/value",
                "policy/grad_norm",
                "critic/grad_norm",
                "policy/entropy",
            )
        }
        r.update(
            {
                "policy_adam_exp_avg_rel@1": adam1,
                "policy_weights@2": _max_diff(state2["policy"], plain.policy.state_dict()),
                "critic_weights@2": _max_diff(state2["critic"], plain.critic.state_dict()),
                "pushed_weights@2": _max_diff(pushed, plain.policy.state_dict()),
                "version": abs(sharded.version - plain.version),
                "reload_loss@2": abs(m_reload["loss/policy"] - m2["loss/policy"]),
                "reload_weights@2": _max_diff(after_reload, pushed),
                # The updates must be visible, or equal weights would prove nothing.
                "policy_moved@2": _max_diff(state2["policy"], policy.state_dict()),
            }
        )
        results[case] = r
    # critic.concurrent: the critic over a process group of its own, its K updates on a thread
    # beside the policy update, against the sequential sharded learner (two steps each).
    conc = (*COMMON, "learner.fsdp=true", "learner.micro_batch_size=3", "algorithm.minibatches=2")
    runs = []
    for flag in ("false", "true"):
        learner = _sharded(tiny_config(*conc, f"critic.concurrent={flag}"), policy)
        steps = [learner.step(batch) for _ in range(2)]
        runs.append((steps, learner.state_dict(), learner.critic_updater.sharding.group))
        learner.close()
    (seq_m, seq_s, seq_group), (con_m, con_s, con_group) = runs
    if rank == 0:
        results["concurrent"] = {
            "own_group": float(seq_group is None and con_group is not None),
            "metrics": max(
                abs(a[k] - b[k])
                for a, b in zip(seq_m, con_m, strict=True)
                for k in a
                if a[k] is not None
            ),
            "policy_weights@2": _max_diff(seq_s["policy"], con_s["policy"]),
            "critic_weights@2": _max_diff(seq_s["critic"], con_s["critic"]),
            "critic_adam@2": max(
                _max_diff(a, con_s["critic_opt"]["state"][n])
                for n, a in seq_s["critic_opt"]["state"].items()
            ),
            "version": float(con_m[-1]["learner/version"]),
        }
    # Re-initialising the sharded critic from the policy (after a supervised warm-up).
    cfg = tiny_config(*COMMON, "learner.fsdp=true")
    sharded = _sharded(cfg, policy)
    sharded.step(batch)
    sharded.reset_critic_from_policy()
    critic_state, policy_state = sharded.state_dict()["critic"], sharded.policy_state()
    # bf16 compute (MixedPrecisionPolicy): runs, and its losses are close to float32's.
    bf16_cfg = tiny_config(*COMMON, "learner.fsdp=true", "learner.mixed_precision=bf16")
    m_bf16 = _sharded(bf16_cfg, policy).step(batch)
    if rank == 0:
        expect = {
            "backbone." + k[len("model.") :]: v
            for k, v in policy_state.items()
            if k.startswith("model.")
        }
        head = [v for k, v in critic_state.items() if k.startswith("value_head.")]
        results["reset_critic"] = {
            "backbone": _max_diff({k: critic_state[k] for k in expect}, expect),
            "value_head_abs": max(float(v.abs().max()) for v in head),
        }
        ref = Learner(tiny_config(*COMMON), copy.deepcopy(policy), torch.device("cpu")).step(batch)
        results["bf16"] = {k: abs(m_bf16[k] - ref[k]) for k in ("loss/policy", "loss/value")}
        with open(out_path, "w") as f:
            json.dump(results, f, indent=2)
    dist.destroy_process_group()
    # Skip the interpreter's teardown: torch sometimes aborts a rank there ("terminate called
    # without an active exception") after everything is done, failing a finished job.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main(sys.argv[1])
