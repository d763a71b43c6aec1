"""Optimizer steps decided on the device: a fused AdamW skips a non-finite update without a host
sync, and the learner settles its counters at the step's metrics sync.

A device sync cannot be observed on CPU; these tests record the host reads the learner's own
code makes (each one a sync on an accelerator) and pin the semantics: a skipped update leaves
weights and optimizer state exactly as they were, counters and the lr schedule follow the steps
taken, and on normal steps the numbers equal those of a plain (foreach) AdamW stepped after a
host read, which is how every step was decided before, to rounding.
"""

from __future__ import annotations

import copy
import sys

import pytest
import torch
from torch.overrides import TorchFunctionMode

from saorl.learner.learner import Learner
from saorl.learner.optim import adamw
from saorl.learner.sharding import step_unless_nonfinite
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch


# Up to two units in the last place: float32 has 24 significant bits, bfloat16 8.
@pytest.mark.parametrize(("dtype", "rtol"), [(torch.float32, 2**-22), (torch.bfloat16, 2**-6)])
def test_fused_adamw_skips_on_the_device_and_matches_foreach(dtype, rtol):
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(64, dtype=dtype))
    q = torch.nn.Parameter(p.detach().clone())
    fused, plain = adamw([p], 0.1, 0.1), torch.optim.AdamW([q], lr=0.1, weight_decay=0.1)
    assert fused.param_groups[0]["fused"] and not plain.param_groups[0]["fused"]
    for i in range(4):
        g = torch.randn(64, dtype=dtype)
        p.grad, q.grad = g.clone(), g.clone()
        if i == 2:  # not finite: the fused step must leave everything as it was
            p.grad[0] = float("nan")
            before = p.detach().clone()
            state = {k: v.clone() for k, v in fused.state[p].items()}
            step_unless_nonfinite(fused, torch.isfinite(p.grad).all())
            assert torch.equal(p.detach(), before)
            assert all(torch.equal(v, fused.state[p][k]) for k, v in state.items())
            assert not hasattr(fused, "found_inf")  # no stale flag for a later step
            continue
        step_unless_nonfinite(fused, torch.isfinite(p.grad).all())
        step_unless_nonfinite(plain, torch.isfinite(q.grad).all())
    assert float(fused.state[p]["step"]) == float(plain.state[q]["step"]) == 3
    # The same update in a different order of operations (bfloat16: the fused kernel computes
    # in float32 and rounds once, the foreach path rounds every operation): rounding only.
    torch.testing.assert_close(p.detach(), q.detach(), rtol=rtol, atol=1e-6 * rtol)


def _plain(learner: Learner) -> Learner:
    """The same learner with plain AdamW optimizers: each step decided by a host read."""
    cfg = learner.cfg
    learner.policy_opt = torch.optim.AdamW(
        learner.policy_params, lr=cfg.learner.lr, weight_decay=cfg.learner.weight_decay
    )
    warm = cfg.learner.lr_warmup_steps
    learner.policy_sched = torch.optim.lr_scheduler.LambdaLR(
        learner.policy_opt, lambda i: min(1.0, (i + 1) / warm) if warm else 1.0
    )
    u = learner.critic_updater
    u.opt = torch.optim.AdamW(u.params, lr=cfg.critic.lr, weight_decay=cfg.critic.weight_decay)
    return learner


def _opt_state(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v.clone() for s in opt.state.values() for v in s.values()]


@pytest.mark.parametrize("warmup", [0, 4])
def test_skipped_updates_and_counters_match_host_decided_steps(tiny_policy, warmup):
    """Two mini-batches per step; a NaN in the second mini-batch's rows only: its policy step
    and the K critic steps are skipped, the first policy step is taken. With the lr warm-up the
    first mini-batch's flag is read at once (the second's lr depends on it)."""
    policy, _ = tiny_policy
    overrides = (
        "critic.warmup_steps=0",
        "algorithm.minibatches=2",
        "learner.batch_size=8",
        f"learner.lr_warmup_steps={warmup}",
        "learner.max_nonfinite_in_a_row=5",
    )
    fused = Learner(tiny_config(*overrides), copy.deepcopy(policy), torch.device("cpu"))
    assert fused.policy_opt.param_groups[0]["fused"] and fused.critic_opt.param_groups[0]["fused"]
    plain = _plain(Learner(tiny_config(*overrides), copy.deepcopy(policy), torch.device("cpu")))
    for i in range(4):
        batch = _batch(policy, seed=i)
        if i == 2:
            batch.rewards[4:][batch.rewards[4:] != 0] = float("nan")
            weights = {k: v.clone() for k, v in fused.critic.state_dict().items()}
            critic_state = _opt_state(fused.critic_opt)
        mf, mp = fused.step(batch), plain.step(batch)
        if i == 2:  # the critic's K steps were all skipped: nothing of it moved
            assert all(torch.equal(v, fused.critic.state_dict()[k]) for k, v in weights.items())
            assert all(map(torch.equal, critic_state, _opt_state(fused.critic_opt)))
            assert mf["learner/skipped_steps"] == 3 and fused.nonfinite_streak == 1
        assert (fused.version, fused.skipped_steps) == (plain.version, plain.skipped_steps)
        assert fused.policy_sched.last_epoch == plain.policy_sched.last_epoch == fused.version
        assert mf["policy/lr"] == mp["policy/lr"]
        assert not any(k.startswith("_") for k in mf)  # the step flags are not metrics
        for k in ("loss/policy", "loss/value", "policy/grad_norm", "mismatch/k3"):
            if mp[k] is None or mp[k] != mp[k]:  # no on-policy token / a NaN loss
                assert repr(mf[k]) == repr(mp[k]), k
            else:
                assert mf[k] == pytest.approx(mp[k], rel=1e-5, abs=1e-7), k
    assert fused.version == 7 and fused.skipped_steps == 3  # 8 policy steps, one skipped
    assert fused.nonfinite_streak == 0
    for a, b in zip(fused.policy.parameters(), plain.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)
    for a, b in zip(fused.critic.parameters(), plain.critic.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_a_skipped_policy_step_leaves_weights_and_optimizer_state(tiny_policy):
    policy, _ = tiny_policy
    learner = Learner(
        tiny_config("critic.warmup_steps=0"), copy.deepcopy(policy), torch.device("cpu")
    )
    learner.step(_batch(policy))  # a good step: optimizer state exists
    weights = {k: v.clone() for k, v in learner.policy.state_dict().items()}
    state, lr = _opt_state(learner.policy_opt), learner.policy_opt.param_groups[0]["lr"]
    batch = _batch(policy, seed=1)
    batch.rewards[batch.rewards != 0] = float("nan")
    m = learner.step(batch)
    assert (learner.version, learner.skipped_steps, m["learner/version"]) == (1, 3, 1)
    assert learner.policy_sched.last_epoch == 1
    assert learner.policy_opt.param_groups[0]["lr"] == lr
    assert all(torch.equal(v, learner.policy.state_dict()[k]) for k, v in weights.items())
    assert all(map(torch.equal, state, _opt_state(learner.policy_opt)))


def test_mismatch_counts_tokens_of_the_version_after_a_mini_batch_step(tiny_policy):
    """Tokens sampled by version 1 are on-policy for the second mini-batch once the first one
    stepped (the version is a device tensor then), and for none when that step was skipped."""
    policy, _ = tiny_policy
    cfg = tiny_config("critic.warmup_steps=0", "algorithm.minibatches=2", "learner.batch_size=8")
    for first_ok in (True, False):
        learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
        batch = _batch(policy)
        batch.versions[batch.action_mask.bool()] = 1
        if not first_ok:  # NaN advantages on (some of) the first mini-batch's rows
            batch.rewards[:4][batch.rewards[:4] != 0] = float("nan")
        m = learner.step(batch)
        second = int(batch.action_mask[4:].sum())
        assert m["mismatch/tokens"] == (second if first_ok else 0)
        assert (m["mismatch/k3"] is None) == (not first_ok)
        assert learner.version == (2 if first_ok else 1)


def test_a_checkpoint_of_unfused_optimizers_loads_into_fused_ones(tiny_policy):
    """Loading replaces the optimizers' options with the checkpoint's; the learner keeps its own
    `fused`, so a run resumed from an older checkpoint still skips on the device."""
    policy, _ = tiny_policy
    cfg = tiny_config("critic.warmup_steps=0")
    old = _plain(Learner(cfg, copy.deepcopy(policy), torch.device("cpu")))
    old.step(_batch(policy))
    state = old.state_dict()
    assert not state["policy_opt"]["param_groups"][0]["fused"]
    new = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    new.load_state(state)
    for opt in (new.policy_opt, new.critic_opt):
        assert opt.param_groups[0]["fused"]
    batch = _batch(policy, seed=1)
    batch.rewards[batch.rewards != 0] = float("nan")
    new.step(batch)  # skipped on the device: the loaded counts are not advanced
    assert {float(s["step"]) for s in new.policy_opt.state.values()} == {1.0}
    assert {float(s["step"]) for s in new.critic_opt.state.values()} == {2.0}  # K = 2
    new.step(_batch(policy, seed=2))
    assert {float(s["step"]) for s in new.policy_opt.state.values()} == {2.0}
    assert (new.version, new.skipped_steps) == (2, 3)


_READS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.__bool__,
        torch.Tensor.__float__,
        torch.Tensor.__int__,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
    }
)
_OWN = (
    "learner.py",
    "policy_step.py",
    "critic_updater.py",
    "sharding.py",
    "advantages.py",
    "corrections.py",
)


class _LearnerReads(TorchFunctionMode):
    """Host reads of tensor values made directly by the learner's modules and the advantage
    functions, as `(call, file)` (transformers' own reads are not the learner's step logic)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS:
            caller = sys._getframe(1).f_code.co_filename.rsplit("/", 1)[-1]
            if caller in _OWN:
                self.calls.append((func.__name__, caller))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        # The row lengths (read from the batch while it is on the CPU), then the metrics.
        ((), [("tolist", "learner.py"), ("tolist", "sharding.py")]),
        (
            ("algorithm.minibatches=2", "learner.lr_warmup_steps=0"),
            [("tolist", "learner.py"), ("tolist", "sharding.py")],
        ),
        # running_mean's scores are read on the CPU too.
        (
            ("algorithm.name=running_mean",),
            [("tolist", "learner.py"), ("tolist", "learner.py"), ("tolist", "sharding.py")],
        ),
        # GRPO's groups are found on the CPU batch (a read of a CPU tensor, not of the device).
        (
            ("algorithm.name=grpo", "learner.lr_warmup_steps=0"),
            [("tolist", "learner.py"), ("__int__", "advantages.py"), ("tolist", "sharding.py")],
        ),
        # During the lr warm-up the first mini-batch's flag is read at once.
        (
            ("algorithm.minibatches=2", "learner.lr_warmup_steps=5"),
            [("tolist", "learner.py"), ("__bool__", "policy_step.py"), ("tolist", "sharding.py")],
        ),
    ],
)
def test_the_step_reads_the_device_once_for_its_metrics(tiny_policy, overrides, expected):
    policy, _ = tiny_policy
    cfg = tiny_config("critic.warmup_steps=0", "learner.batch_size=8", *overrides)
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    batch = _batch(policy)
    learner.step(batch)  # the first step creates the optimizer state
    batch = _batch(policy, seed=1)
    with _LearnerReads() as reads:
        learner.step(batch)
    assert reads.calls == expected


class _LibraryReads(TorchFunctionMode):
    """Host reads made from transformers' and saorl's model files (`transformers/...` or
    `saorl/models/...`), as `(call, file)`: the mask code of the forwards."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _READS or func in (torch.equal, torch.Tensor.nonzero, torch.nonzero):
            frame = sys._getframe(1)
            while frame is not None and frame.f_code.co_filename == __file__:
                frame = frame.f_back
            path = frame.f_code.co_filename if frame is not None else ""
            if "/transformers/" in path or "/saorl/models/" in path:
                self.calls.append((func.__name__, path.rsplit("/", 1)[-1]))
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("layout", ["learner.micro_batch_size=3", "learner.micro_batch_tokens=10"])
def test_the_forwards_read_nothing_in_the_mask_code(tiny_policy, attn, layout):
    """Padded (rows with and without padding) and packed micro-batches (several sequences, and
    a row longer than the budget alone): the policy and critic forwards and backwards of a
    step read nothing back in transformers' mask code; packing reads the mask (`nonzero`)."""
    policy, _ = tiny_policy
    cfg = tiny_config(
        "critic.warmup_steps=0", "learner.batch_size=8", f"model.attn_implementation={attn}", layout
    )
    learner = Learner(cfg, copy.deepcopy(policy), torch.device("cpu"))
    batch = _batch(policy, seed=1)
    lengths = batch.attention_mask.sum(-1)
    assert lengths.min() < batch.attention_mask.shape[1] and lengths.max() > 10
    with _LibraryReads() as reads:
        learner.step(batch)
    packed = "tokens" in layout
    # The batch carries its rows' lengths (Batch.lengths), so the mask code reads nothing; with
    # the mask on the CPU, as here, pack_rows checks those lengths against it (host reads).
    # (On a device, pack_rows builds the layout from the host lengths and reads nothing.)
    allowed = {"equal", "tolist", "__int__"} if packed else set()
    assert {c for c, _ in reads.calls} <= allowed, reads.calls
    assert all(f == "packing.py" for _, f in reads.calls), reads.calls


def test_a_loaded_optimizer_state_does_not_count_on_with_the_loader():
    """`Sharding.load_state` copies Adam's `step` counters: training the loaded optimizer
    leaves the state dict it was given as it was (a learner restored from another's state in
    memory must not move that one's counters)."""
    import copy

    from saorl.learner.sharding import Sharding

    source = torch.nn.Linear(3, 3)
    opt = torch.optim.AdamW(source.parameters(), fused=True)
    source(torch.randn(2, 3)).sum().backward()
    opt.step()
    state = copy.deepcopy(opt.state_dict())
    target = torch.nn.Linear(3, 3)
    loaded = torch.optim.AdamW(target.parameters(), fused=True)
    Sharding().load_state(target, source.state_dict(), loaded, state)
    target(torch.randn(2, 3)).sum().backward()
    loaded.step()
    assert [s["step"].item() for s in state["state"].values()] == [1.0, 1.0]
    assert [s["step"].item() for s in loaded.state_dict()["state"].values()] == [2.0, 2.0]
