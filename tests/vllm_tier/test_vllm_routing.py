"""MoE routing replay with the vLLM engine on a tiny random-init Qwen3-MoE (needs vLLM).

vLLM records the experts it routed every position to (`saorl.engines.vllm_moe`); the test
checks them against transformers' routing of the same weights, across a weight update that
re-prefills running requests, and then replays them in the learner: with the learner's routers
moved away from the engine's, and against a bfloat16 engine, replay must shrink the measured
log-prob mismatch (`mismatch/k3`, `mismatch/max_abs_logprob_diff`).
"""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.engines.protocol import GenerationRequest
from saorl.learner.learner import Learner
from saorl.models.logprobs import sequence_logprobs
from saorl.models.routing import RoutingRecorder
from saorl.types import Batch, Trajectory, fit_routing
from tests.conftest import tiny_config
from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER

# vLLM's CPU attention needs a head size of at least 32: 64 wide, 2 heads.
MOE = [
    "model.arch=qwen3_moe",
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=32",
    "model.num_experts=8",
    "model.num_experts_per_tok=2",
    "model.max_seq_len=48",
    "critic.warmup_steps=0",
    "learner.batch_size=16",
    "learner.micro_batch_size=16",
    "algorithm.routing_replay=true",
]
ENGINE = ["rollout.engine=vllm", "rollout.vllm_kv_cache_gib=0.0625", "rollout.max_concurrent=16"]
LAYERS, K = 2, 2
# The same prompt several times (a group): each copy is computed, none read from the cache.
PROMPTS = [f"{i}+{2 * i}=" for i in range(12)] + ["1234567890+98765432=" for _ in range(4)]


def _policy(seed: int):
    from saorl.models.loading import load_policy

    torch.manual_seed(seed)
    return load_policy(tiny_config(*MOE).model)


def _engine(policy, tok, *overrides: str):
    from saorl.engines.factory import build_engine

    return build_engine(tiny_config(*MOE, *ENGINE, *overrides), policy, tok, seed=0)


def _requests(tok, n: int = 24) -> list[GenerationRequest]:
    return [GenerationRequest(tok.encode(p), n, request_id=i) for i, p in enumerate(PROMPTS)]


def _own_routing(policy, ids: list[int]) -> torch.Tensor:
    """transformers' routing of one unbatched forward over `ids`: `(len(ids), layers, k)`."""
    rec = RoutingRecorder(policy)
    try:
        with torch.no_grad():
            policy.base_model(input_ids=torch.tensor([ids]), use_cache=False)
        return rec.take(1, len(ids))[0]
    finally:
        rec.close()


def _same_experts(recorded: torch.Tensor, own: torch.Tensor) -> bool:
    return torch.equal(recorded.long().sort(-1).values, own.sort(-1).values)


@pytest.fixture(scope="module")
def policies():
    return _policy(0), _policy(1)


@pytest.fixture(scope="module")
def engine(policies):
    (model, tok), _ = policies
    eng = _engine(model, tok)
    yield eng
    eng.close()


@pytest.fixture
def fresh(engine, policies):
    (model, _), _ = policies
    engine.abort_all()
    engine.update_weights(model.state_dict(), 0)
    return engine


def test_vllm_records_the_experts_of_every_fed_position(fresh, policies):
    (model, tok), _ = policies
    outs = fresh.generate(_requests(tok))
    for c in outs:
        ids = c.request.prompt_ids + c.token_ids
        # The pushed MoE weights are the learner's (the CPU expert repack, vllm_moe): float32
        # log-probs agree as for dense models (about 5e-7 measured).
        with torch.no_grad():
            lp = sequence_logprobs(model, torch.tensor([ids]), torch.ones(1, len(ids)))
        torch.testing.assert_close(
            torch.tensor(c.logprobs), lp[0, len(c.request.prompt_ids) :], atol=1e-4, rtol=0
        )
        assert c.routing.shape == (len(ids), LAYERS, K) and c.routing.dtype == torch.int8
        # Every position vLLM fed has its experts; the last sampled token was never fed.
        assert (c.routing[:-1] >= 0).all() and (c.routing[-1] == -1).all()
        # The experts transformers routes the same weights to (as sets per layer).
        assert _same_experts(c.routing[:-1], _own_routing(model, ids)[:-1])


def test_a_weight_update_re_routes_the_running_requests(fresh, policies):
    (model_a, tok), (model_b, _) = policies
    for r in _requests(tok):
        fresh.add_request(r)
    done = []
    for _ in range(5):
        done += fresh.step()
    fresh.update_weights(model_b.state_dict(), 1)
    while fresh.num_unfinished():
        done += fresh.step()
    assert len(done) == len(PROMPTS) and sum(1 in c.versions for c in done) >= 8
    for c in done:
        ids = c.request.prompt_ids + c.token_ids
        # A request that spanned the update was re-prefilled under B: one consistent record.
        model = model_b if 1 in c.versions else model_a
        assert _same_experts(c.routing[:-1], _own_routing(model, ids)[:-1])


def _batch(completions, tok) -> Batch:
    trajs = []
    for c in completions:
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
    return Batch.from_trajectories(trajs, tok.pad_token_id)


def _step(policy, batch: Batch, replay: bool, perturb: float = 0.0) -> dict:
    p = copy.deepcopy(policy)
    if perturb:  # the learner's routers moved away from the engine's after generation
        g = torch.Generator().manual_seed(5)
        with torch.no_grad():
            for name, w in p.named_parameters():
                if name.endswith("mlp.gate.weight"):
                    w.add_(torch.randn(w.shape, generator=g) * perturb)
    cfg = tiny_config(*MOE, f"algorithm.routing_replay={str(replay).lower()}")
    return Learner(cfg, p, torch.device("cpu")).step(batch)


def _figures(m: dict) -> str:
    return (
        f"k3={m['mismatch/k3']:.3g} max_abs={m['mismatch/max_abs_logprob_diff']:.3g} "
        f"changed={m.get('routing/changed_frac')}"
    )


def test_replay_of_vllm_routing_reduces_the_logprob_mismatch(fresh, policies):
    (model, tok), _ = policies
    batch = _batch(fresh.generate(_requests(tok)), tok)
    same = _step(model, batch, True)
    print("vllm float32, same weights, replay on:", _figures(same))
    # The learner routes as vLLM did: nothing to override, log-probs agree to float32 kernels.
    assert same["routing/changed_frac"] < 0.01 and same["mismatch/max_abs_logprob_diff"] < 1e-3
    off = _step(model, batch, False, perturb=0.002)
    on = _step(model, batch, True, perturb=0.002)
    print("vllm float32, routers perturbed: off", _figures(off), "| on", _figures(on))
    assert on["routing/changed_frac"] > 0.02  # the perturbation flips experts; replay undoes it
    assert on["mismatch/k3"] < off["mismatch/k3"] / 20
    assert on["mismatch/max_abs_logprob_diff"] < off["mismatch/max_abs_logprob_diff"] / 5


def test_replay_against_a_bfloat16_vllm_engine(policies):
    (model, tok), _ = policies
    eng = _engine(model, tok, "model.dtype=bfloat16")
    try:
        batch = _batch(eng.generate(_requests(tok)), tok)
    finally:
        eng.close()
    off, on = _step(model, batch, False), _step(model, batch, True)
    print("vllm bfloat16 engine, float32 learner: off", _figures(off), "| on", _figures(on))
    assert on["routing/changed_frac"] > 0  # bfloat16 routing flips some near-ties
    assert on["mismatch/k3"] < off["mismatch/k3"]
