"""MoE routing replay (R3) on a tiny random-init Qwen3-MoE with the HF engine.

The engine records the experts it routed every position to; trajectories carry them through
batches, checkpoints and pickling (Ray); the learner forces them in its forward. The mismatch
test makes the learner differ from the engine as training and inference engines do (router
weights perturbed after generation, or a bfloat16 engine) and measures `mismatch/k3` and
`mismatch/max_abs_logprob_diff` with replay off and on.
"""

from __future__ import annotations

import copy
import dataclasses
import pickle
from pathlib import Path

import pytest
import torch

from saorl.checkpoint.io import load_state_file, save_checkpoint, unsafe_globals
from saorl.config import ConfigError
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.routing import RoutingRecorder, RoutingReplay
from saorl.types import Batch, Trajectory, fit_routing
from tests.conftest import tiny_config
from tests.faults._common import metric_rows

MOE = (
    "model.arch=qwen3_moe",
    "model.hidden_size=64",
    "model.intermediate_size=32",
    "model.num_experts=8",
    "model.num_experts_per_tok=2",
    "model.max_seq_len=48",
    "critic.warmup_steps=0",
    "learner.batch_size=16",
    "learner.micro_batch_size=16",
)


@pytest.fixture(scope="module")
def moe():
    torch.manual_seed(0)
    return load_policy(tiny_config(*MOE).model)


@pytest.fixture(scope="module")
def batch(moe) -> Batch:
    """16 rollouts of the float32 engine, routing recorded."""
    policy, tok = moe
    return Batch.from_trajectories(_generate(policy, tok), tok.pad_token_id)


def _generate(policy, tok, dtype=torch.float32, kv_cache=True, n=16) -> list[Trajectory]:
    engine = HFEngine(
        copy.deepcopy(policy).to(dtype),
        tok,
        EngineSettings(max_seq_len=48, seed=3),
        record_routing=True,
        kv_cache=kv_cache,
    )
    reqs = [
        GenerationRequest(prompt_ids=tok.encode(f"{i}+{2 * i}="), max_new_tokens=24)
        for i in range(n)
    ]
    trajs = []
    for c in engine.generate(reqs):
        k, total = len(c.token_ids), len(c.request.prompt_ids) + len(c.token_ids)
        trajs.append(
            Trajectory(
                c.request.prompt_ids,
                c.token_ids,
                [1] * k,
                c.logprobs,
                c.versions,
                reward=float(k % 2),
                routing=fit_routing(c.routing, total),
            )
        )
    return trajs


def _own_routing(policy, ids: list[int]) -> torch.Tensor:
    """The routing of one unbatched forward over `ids`: `(len(ids), layers, k)`."""
    rec = RoutingRecorder(policy)
    try:
        with torch.no_grad():
            policy.base_model(input_ids=torch.tensor([ids]), use_cache=False)
        return rec.take(1, len(ids))[0]
    finally:
        rec.close()


@pytest.mark.parametrize("kv_cache", [True, False], ids=["kv", "reencode"])
def test_engine_records_the_experts_of_every_fed_position(moe, kv_cache):
    policy, tok = moe
    trajs = _generate(policy, tok, kv_cache=kv_cache, n=6)
    layers, k = 2, 2
    for t in trajs:
        ids = t.prompt_ids + t.completion_ids
        assert t.routing.shape == (len(ids), layers, k) and t.routing.dtype == torch.int8
        # Every position the engine fed has its experts; the last sampled token was never fed.
        assert (t.routing[:-1] >= 0).all() and (t.routing[-1] == -1).all()
        # The same experts as one unbatched forward of the same weights (as sets per layer).
        own = _own_routing(policy, ids)[:-1]
        assert torch.equal(t.routing[:-1].long().sort(-1).values, own.sort(-1).values)


def test_routing_survives_batches_checkpoints_and_pickling(moe, tmp_path: Path):
    policy, tok = moe
    trajs = _generate(policy, tok, n=4)
    b = Batch.from_trajectories(trajs, tok.pad_token_id)
    assert b.routing.shape == (*b.input_ids.shape, 2, 2)
    for i, t in enumerate(trajs):
        n = len(t.prompt_ids) + len(t.completion_ids)
        assert torch.equal(b.routing[i, :n], t.routing) and (b.routing[i, n:] == -1).all()
    sub = b.select([2, 0])
    assert torch.equal(sub.routing[1], b.routing[0])
    assert b.select(slice(1, 3)).routing.shape[0] == 2
    # The rollout side of a checkpoint keeps trajectories as plain dicts (saorl.rollout.resume).
    plain = {"finished_untrained": [dataclasses.asdict(t) for t in trajs]}
    assert unsafe_globals(plain) == []
    save_checkpoint(tmp_path, 1, {"step": 1, **plain})
    back = load_state_file(tmp_path / "checkpoints" / "step_00000001.pt")
    for t, d in zip(trajs, back["finished_untrained"], strict=True):
        assert torch.equal(Trajectory(**d).routing, t.routing)
    assert torch.equal(pickle.loads(pickle.dumps(trajs[1])).routing, trajs[1].routing)  # Ray
    with pytest.raises(ValueError, match="routing"):
        Trajectory([1, 2], [3], [1], [0.0], [0], routing=torch.zeros(2, 2, 2, dtype=torch.int8))


def _learner(policy, replay: bool, *extra: str, perturb: float = 0.0) -> Learner:
    p = copy.deepcopy(policy)
    if perturb:  # the learner's router moved away from the engine's after generation
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, w in p.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    w.add_(torch.randn(w.shape, generator=g) * perturb)
    cfg = tiny_config(*MOE, f"algorithm.routing_replay={str(replay).lower()}", *extra)
    if cfg.model.gradient_checkpointing:
        p.activation_checkpointing_enable({"use_reentrant": False})  # as load_policy does
    return Learner(cfg, p, torch.device("cpu"))


def _step(policy, batch: Batch, replay: bool, *extra: str, perturb: float = 0.0) -> dict:
    return _learner(policy, replay, *extra, perturb=perturb).step(batch)


def test_replay_with_equal_weights_reproduces_the_engine(moe, batch):
    policy, _ = moe
    for packing in ("learner.micro_batch_tokens=0", "learner.micro_batch_tokens=200"):
        m = _step(policy, batch, True, packing, "learner.micro_batch_size=5")
        assert m["routing/changed_frac"] == 0.0
        assert m["mismatch/max_abs_logprob_diff"] < 1e-5


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_routing_replay_reduces_the_logprob_mismatch(moe, batch, packed):
    policy, _ = moe
    extra = ("learner.micro_batch_tokens=200",) if packed else ()
    off = _step(policy, batch, False, *extra, perturb=0.002)
    on = _step(policy, batch, True, *extra, perturb=0.002)
    print(
        "router perturbed: off",
        off["mismatch/k3"],
        off["mismatch/max_abs_logprob_diff"],
        "on",
        on["mismatch/k3"],
        on["mismatch/max_abs_logprob_diff"],
        "changed",
        on["routing/changed_frac"],
    )
    # The perturbation flips some experts (the replay overrode them) ...
    assert on["routing/changed_frac"] > 0.02
    # ... which off the replay costs far more than the perturbed weights alone.
    assert on["mismatch/k3"] < off["mismatch/k3"] / 20
    assert on["mismatch/max_abs_logprob_diff"] < off["mismatch/max_abs_logprob_diff"] / 5


@pytest.mark.slow
def test_routing_replay_against_a_bfloat16_engine(moe):
    policy, tok = moe
    batch = Batch.from_trajectories(_generate(policy, tok, dtype=torch.bfloat16), tok.pad_token_id)
    off, on = _step(policy, batch, False), _step(policy, batch, True)
    print(
        "bf16 engine: off",
        off["mismatch/k3"],
        off["mismatch/max_abs_logprob_diff"],
        "on",
        on["mismatch/k3"],
        on["mismatch/max_abs_logprob_diff"],
        "changed",
        on["routing/changed_frac"],
    )
    assert on["routing/changed_frac"] > 0  # bfloat16 routing flips some near-ties
    assert on["mismatch/k3"] < off["mismatch/k3"]


def test_replay_recomputes_weights_over_the_forced_experts(moe):
    policy, tok = moe
    p = copy.deepcopy(policy)
    router = next(m for m in p.modules() if type(m).__name__ == "Qwen3MoeTopKRouter")
    ids = torch.tensor([tok.encode("12+34=46")])
    attn = torch.ones_like(ids)
    own = _own_routing(p, ids[0].tolist()).long()
    forced = (own + 1) % 8  # other experts for every token and layer
    forced[:, :, 1] = (own[:, :, 0] + 2) % 8
    forced[3] = -1  # a position without a record keeps the learner's own choice
    seen = []
    replay = RoutingReplay(p, packed=False)
    with replay.forced(forced[None], attn):
        handle = router.register_forward_hook(lambda m, a, out: seen.append(out))
        lp = sequence_logprobs(p, ids, attn)
        handle.remove()
    logits, weights, idx = seen[0]
    want = forced[:, 0].clone()
    want[3] = own[3, 0]
    assert torch.equal(idx, want)
    probs = torch.softmax(logits.float(), -1).gather(-1, want)
    torch.testing.assert_close(weights, probs / probs.sum(-1, keepdim=True))  # norm_topk_prob
    assert not torch.allclose(lp, sequence_logprobs(p, ids, attn))  # the forced experts count
    lp.sum().backward()  # the router still learns through the recomputed weights
    assert router.weight.grad is not None and router.weight.grad.abs().sum() > 0


def test_replay_holds_through_the_recomputation_of_checkpointed_layers(moe, batch):
    policy, _ = moe
    plain = _learner(policy, True, perturb=0.002)
    ckpt = _learner(policy, True, "model.gradient_checkpointing=true", perturb=0.002)
    m_plain, m_ckpt = plain.step(batch), ckpt.step(batch)
    assert m_plain["routing/changed_frac"] > 0.02  # replay overrides the learner's routing
    assert m_ckpt["mismatch/k3"] == pytest.approx(m_plain["mismatch/k3"], rel=1e-4)
    # Gradients through the recomputed layers used the forced experts too.
    for (name, a), b in zip(plain.policy.named_parameters(), ckpt.policy.parameters(), strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5, msg=name)


def test_routing_replay_needs_a_supported_router(tiny_policy):
    policy, tok = tiny_policy
    with pytest.raises(ConfigError, match="routing_replay"):
        Learner(tiny_config("algorithm.routing_replay=true"), policy, torch.device("cpu"))
    # The vLLM engine checks the policy before it imports or builds vLLM.
    from saorl.engines.vllm import VLLMEngine

    with pytest.raises(ConfigError, match="routing_replay"):
        VLLMEngine.from_policy(policy, tok, EngineSettings(max_seq_len=32), record_routing=True)
    with pytest.raises(ConfigError, match="num_experts_per_tok"):
        tiny_config(*MOE, "model.num_experts_per_tok=9")


@pytest.mark.slow
def test_train_with_routing_replay_on_the_tool_task(tmp_path: Path):
    """The whole loop, multi-turn (observations re-routed at each turn's prefill), async,
    with a checkpoint and a resume: replay metrics are logged at every policy step."""
    moe = (
        "model.arch=qwen3_moe",
        "model.hidden_size=32",
        "model.intermediate_size=16",
        "model.num_experts=4",
        "algorithm.routing_replay=true",
        "env.name=tool_arithmetic",
        "model.max_seq_len=48",
        "rollout.max_new_tokens=12",
        "run.eval_every=0",
        "run.checkpoint_every=2",
        f"run.output_dir={tmp_path}",
        "run.name=moe",
    )
    train_from_config(tiny_config(*moe, "run.total_steps=2"))
    train_from_config(tiny_config(*moe, "run.total_steps=4"), resume=str(tmp_path / "moe"))
    rows = [r for r in metric_rows(tmp_path / "moe") if "routing/changed_frac" in r]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]
    policy_rows = [r for r in rows if not r["learner/warmup"]]
    assert policy_rows and all(r["routing/changed_frac"] is not None for r in policy_rows)
    # The learner and the engine held the same weights: routing and log-probs agree.
    assert all(r["routing/changed_frac"] < 0.05 for r in policy_rows)
    assert all(
        r["mismatch/max_abs_logprob_diff"] < 1e-3
        for r in policy_rows
        if r["mismatch/max_abs_logprob_diff"] is not None
    )
