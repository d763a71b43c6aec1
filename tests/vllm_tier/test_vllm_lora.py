"""A LoRA policy's pushes reach vLLM, adapter-only or merged: its log-probs are the learner's
(needs vLLM).

The learner trains adapters only (tests/integration/test_lora.py). With `model.lora_push =
"adapter"` (default) vLLM is built with its LoRA support, gets the base and the adapter at
start-up and the adapter alone with every push after (`Learner.push_state`,
`saorl.engines.vllm_lora`); with `"merged"` it runs the plain model and receives
`W + (alpha / r) B A` every time (`Learner.policy_state`).
"""

from __future__ import annotations

import pytest
import torch

from saorl.engines.protocol import GenerationRequest
from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import is_adapter_key, merged_copy, state_bytes
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch
from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER

# vLLM's CPU attention needs a head size of at least 32: 64 wide, 2 heads. A large learning rate
# moves the adapters far enough in three steps that a push visibly changes the log-probs.
CFG = [
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
    "model.max_seq_len=48",
    "model.lora_rank=4",
    "model.lora_alpha=8",
    "learner.lr=0.01",
    "critic.warmup_steps=0",
    "rollout.engine=vllm",
    "rollout.vllm_enforce_eager=true",
    "rollout.vllm_kv_cache_gib=0.0625",
]
ATOL = 1e-4  # float32, vLLM's kernels against transformers' (tests/vllm_tier/test_vllm_engine.py)


def _logprobs(policy, c) -> torch.Tensor:
    ids = torch.tensor([c.request.prompt_ids + c.token_ids])
    with torch.no_grad():
        lp = sequence_logprobs(policy, ids, torch.ones_like(ids))
    return lp[0, len(c.request.prompt_ids) :]


@pytest.mark.parametrize("how", ["adapter", "merged"])
def test_lora_pushes_reach_vllm_and_match_the_learner(how):
    from saorl.engines.factory import build_engine

    cfg = tiny_config(*CFG, f"model.lora_push={how}")
    torch.manual_seed(0)
    policy, tok = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    batch = _batch(learner.policy)
    for _ in range(3):
        learner.step(batch)
    engine = build_engine(cfg, learner.policy, tok, seed=0, version=3)  # start-up push
    assert (engine._adapter is not None) == (how == "adapter")
    reqs = [GenerationRequest(tok.encode(f"{i}+{i}="), 8, request_id=i) for i in range(6)]
    try:
        for c in engine.generate(reqs):
            torch.testing.assert_close(
                torch.tensor(c.logprobs), _logprobs(learner.policy, c), atol=ATOL, rtol=0
            )
        before = {k: v.clone() for k, v in learner.policy_state().items()}
        for _ in range(3):
            learner.step(batch)
        state = learner.push_state()
        if how == "adapter":
            assert state and all(is_adapter_key(k) for k in state)
            assert state_bytes(state) < 0.2 * state_bytes(learner.policy_state())
        else:
            assert not any("lora" in k or "base_layer" in k for k in state)
        engine.update_weights(state, 6)  # a push
        previous = merged_copy(learner.policy)  # the plain model, holding the first push
        previous.load_state_dict(before)
        moved = 0.0
        for c in engine.generate(reqs):
            got = torch.tensor(c.logprobs)
            torch.testing.assert_close(got, _logprobs(learner.policy, c), atol=ATOL, rtol=0)
            assert c.versions == [6] * len(c.token_ids)
            moved = max(moved, (got - _logprobs(previous, c)).abs().max().item())
        # The pushed adapters changed what vLLM computes (not only the learner's copy).
        assert moved > 10 * ATOL
        if how == "adapter":  # merged weights would be applied twice: refused
            with pytest.raises(ValueError, match="not merged weights"):
                engine.update_weights(learner.policy_state(), 7)
    finally:
        engine.close()


def test_an_adapter_push_lands_on_requests_in_flight():
    """Requests running across an adapter push continue under the new adapter (one adapter id,
    reloaded in place): the tokens labelled with the new version have the new policy's
    log-probs given their whole prefix."""
    from saorl.engines.factory import build_engine

    cfg = tiny_config(*CFG)
    torch.manual_seed(0)
    policy, tok = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    batch = _batch(learner.policy)
    engine = build_engine(cfg, learner.policy, tok, seed=0, version=0)
    try:
        for i in range(4):
            engine.add_request(GenerationRequest(tok.encode(f"{i}+{i}="), 12, request_id=i))
        done = []
        for _ in range(3):
            done += engine.step()
        old = merged_copy(learner.policy)
        for _ in range(3):
            learner.step(batch)
        engine.update_weights(learner.push_state(), 3)
        while engine.num_unfinished():
            done += engine.step()
        spanning = [c for c in done if 0 in c.versions and 3 in c.versions]
        assert spanning
        for c in spanning:
            got = torch.tensor(c.logprobs)
            new_lp, old_lp = _logprobs(learner.policy, c), _logprobs(old, c)
            v = torch.tensor(c.versions)
            torch.testing.assert_close(got[v == 3], new_lp[v == 3], atol=ATOL, rtol=0)
            torch.testing.assert_close(got[v == 0], old_lp[v == 0], atol=ATOL, rtol=0)
    finally:
        engine.close()
