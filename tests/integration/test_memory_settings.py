"""Memory settings: gradient checkpointing, the attention kernel, bf16 compute in one process and
the critic's optimizer in CPU memory. Each must leave the learner's step what it was (within
float rounding) while doing what it says: recomputing layers, running another kernel, computing
in bfloat16, keeping the optimizer state on the CPU in float32."""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.checkpoint.io import load_state_file, save_checkpoint
from saorl.config import ConfigError
from saorl.learner.learner import Learner
from saorl.learner.optim import OffloadedAdamW
from saorl.models.loading import load_policy
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch

COMMON = ("critic.warmup_steps=0", "learner.lr_warmup_steps=0", "algorithm.entropy_coef=0.01")


def _learner(*overrides: str) -> Learner:
    cfg = tiny_config(*COMMON, *overrides)
    torch.manual_seed(0)  # the same random init for every variant
    policy, _ = load_policy(cfg.model)
    return Learner(cfg, policy, torch.device("cpu"))


def _two_steps(learner: Learner, batch) -> list[dict]:
    return [learner.step(batch), learner.step(batch)]


def _assert_same(a: Learner, b: Learner, ma: list[dict], mb: list[dict], atol: float) -> None:
    for x, y in zip(ma, mb, strict=True):
        for k in ("loss/policy", "loss/value", "policy/grad_norm", "critic/grad_norm"):
            assert abs(x[k] - y[k]) <= atol, (k, x[k], y[k])
    for mod in ("policy", "critic"):
        sa, sb = getattr(a, mod).state_dict(), getattr(b, mod).state_dict()
        for k in sa:
            torch.testing.assert_close(sa[k], sb[k], atol=atol, rtol=0, msg=f"{mod}.{k}")


def _moved(learner: Learner, before: dict[str, torch.Tensor]) -> float:
    now = learner.policy.state_dict()
    return max(float((now[k] - v).abs().max()) for k, v in before.items())


def _attention_calls(module: torch.nn.Module) -> list[int]:
    """A counter of calls of the first decoder layer's attention (recomputation calls it again;
    the layer's own hooks stay outside the checkpoint and would not see it)."""
    calls = [0]
    attn = next(m for m in module.modules() if type(m).__name__.endswith("Attention"))
    attn.register_forward_hook(lambda *_: calls.__setitem__(0, calls[0] + 1))
    return calls


def test_gradient_checkpointing_recomputes_and_changes_nothing():
    plain, ckpt = _learner(), _learner("model.gradient_checkpointing=true")
    batch = _batch(plain.policy)
    for learner in (ckpt,):
        for mod in (learner.policy, learner.critic):
            layers = [m for m in mod.modules() if type(m).__name__.endswith("DecoderLayer")]
            assert layers and all(m.gradient_checkpointing for m in layers)
    counts = {}
    for name, learner in (("plain", plain), ("ckpt", ckpt)):
        policy_calls, critic_calls = (_attention_calls(m) for m in (learner.policy, learner.critic))
        learner.step(batch)
        counts[name] = (policy_calls[0], critic_calls[0])
    # One step: the critic's values (no grad), K=2 critic updates (forward + recompute with
    # checkpointing), one policy update; nothing is recomputed without it.
    (p0, c0), (p1, c1) = counts["plain"], counts["ckpt"]
    assert c1 - c0 == 2 * 2 and p1 - p0 == 2  # 2 micro-batches of 4 rows per pass
    before = copy.deepcopy(plain.policy.state_dict())
    _assert_same(plain, ckpt, [plain.step(batch)], [ckpt.step(batch)], atol=1e-6)
    assert _moved(plain, before) > 1e-5  # real updates were compared


def test_attention_kernels_agree_and_flash_attention_is_refused_without_it():
    sdpa, eager = _learner(), _learner("model.attn_implementation=eager")
    assert eager.policy.config._attn_implementation == "eager"
    assert eager.critic.backbone.config._attn_implementation == "eager"
    batch = _batch(sdpa.policy)
    _assert_same(sdpa, eager, _two_steps(sdpa, batch), _two_steps(eager, batch), atol=1e-5)
    from transformers.utils import is_flash_attn_2_available

    if not is_flash_attn_2_available():
        cfg = tiny_config("model.attn_implementation=flash_attention_2", "model.dtype=bfloat16")
        with pytest.raises(ConfigError, match="flash-attn"):
            load_policy(cfg.model)
    with pytest.raises(ConfigError, match="bfloat16"):
        load_policy(tiny_config("model.attn_implementation=flash_attention_2").model)


def test_bf16_mixed_precision_in_one_process_computes_in_bfloat16():
    fp32, bf16 = _learner(), _learner("learner.mixed_precision=bf16")
    batch = _batch(fp32.policy)
    dtypes: set[torch.dtype] = set()
    proj = bf16.policy.model.layers[0].mlp.down_proj
    proj.register_forward_hook(lambda _m, _i, out: dtypes.add(out.dtype))
    m32, m16 = fp32.step(batch), bf16.step(batch)
    assert dtypes == {torch.bfloat16}  # the learner's passes ran under autocast
    assert all(p.dtype == torch.float32 for p in bf16.policy.parameters())  # weights stay fp32
    for k in ("loss/policy", "loss/value"):  # bf16 keeps ~3 significant digits
        assert abs(m32[k] - m16[k]) < 1e-2, (k, m32[k], m16[k])
    assert bf16.version == 1


def test_critic_optimizer_offload_steps_like_adamw_and_checkpoints(tmp_path):
    plain, off = _learner(), _learner("critic.optimizer_offload=true")
    assert isinstance(off.critic_opt, OffloadedAdamW)
    batch = _batch(plain.policy)
    _assert_same(plain, off, _two_steps(plain, batch), _two_steps(off, batch), atol=1e-7)
    # Adam's moments and the master weights are CPU float32 tensors of their own: the module's
    # weights are copies of the masters, not the same storage.
    for p, master in zip(off.critic_params, off.critic_opt.master, strict=True):
        state = off.critic_opt.state[master]
        assert master.device.type == "cpu" and master.dtype == torch.float32
        assert state["exp_avg"].device.type == "cpu" and state["exp_avg"].abs().sum() > 0
        assert master.data_ptr() != p.data_ptr() and torch.equal(master, p.detach())
    # Through a checkpoint file (weights-only load) into a fresh learner: the same next step.
    save_checkpoint(tmp_path, off.steps, {**off.state_dict(), "torch_rng": torch.get_rng_state()})
    state = load_state_file(tmp_path / "checkpoints" / f"step_{off.steps:08d}.pt")
    resumed = _learner("critic.optimizer_offload=true")
    resumed.load_state(state)
    _assert_same(off, resumed, [off.step(batch)], [resumed.step(batch)], atol=0)
    with pytest.raises(ConfigError, match="does not fit"):  # a run without the option
        _learner().load_state(state)


def test_critic_optimizer_offload_keeps_float32_masters_of_bfloat16_weights():
    off = _learner("critic.optimizer_offload=true", "model.dtype=bfloat16")
    batch = _batch(off.policy)
    off.step(batch)
    for p, master in zip(off.critic_params, off.critic_opt.master, strict=True):
        assert p.dtype == torch.bfloat16 and master.dtype == torch.float32
        assert torch.equal(p.detach(), master.to(torch.bfloat16))
    # An update smaller than bfloat16's resolution survives in the masters.
    head = off.critic_opt.master[-1]
    assert head.abs().sum() > 0
