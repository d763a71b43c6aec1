"""A LoRA policy's merged-weight pushes reach vLLM: its log-probs are the learner's (needs vLLM).

The learner trains adapters only (tests/integration/test_lora.py); vLLM runs the plain model
and receives `W + (alpha / r) B A` at start-up and with every push (`Learner.policy_state`).
"""

from __future__ import annotations

import torch

from saorl.learner.learner import Learner
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import merged_copy
from saorl.rollout.engine import GenerationRequest
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch
from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER

# vLLM's CPU attention needs a head size of at least 32: 64 wide, 2 heads. A large learning rate
# moves the adapters far enough in three steps that a push visibly changes the log-probs.
CFG = ["model.hidden_size=64", "model.num_heads=2", "model.num_kv_heads=1",
       "model.intermediate_size=128", "model.max_seq_len=48", "model.lora_rank=4",
       "model.lora_alpha=8", "learner.lr=0.01", "critic.warmup_steps=0",
       "rollout.engine=vllm", "rollout.vllm_enforce_eager=true",
       "rollout.vllm_kv_cache_gib=0.0625"]  # fmt: skip
ATOL = 1e-4  # float32, vLLM's kernels against transformers' (tests/vllm_tier/test_vllm_engine.py)


def _logprobs(policy, c) -> torch.Tensor:
    ids = torch.tensor([c.request.prompt_ids + c.token_ids])
    with torch.no_grad():
        lp = sequence_logprobs(policy, ids, torch.ones_like(ids))
    return lp[0, len(c.request.prompt_ids) :]


def test_merged_lora_pushes_reach_vllm_and_match_the_learner():
    from saorl.rollout.factory import build_engine

    cfg = tiny_config(*CFG)
    torch.manual_seed(0)
    policy, tok = load_policy(cfg.model)
    learner = Learner(cfg, policy, torch.device("cpu"))
    batch = _batch(learner.policy)
    for _ in range(3):
        learner.step(batch)
    engine = build_engine(cfg, learner.policy, tok, seed=0, version=3)  # start-up push, merged
    reqs = [GenerationRequest(tok.encode(f"{i}+{i}="), 8, request_id=i) for i in range(6)]
    try:
        for c in engine.generate(reqs):
            torch.testing.assert_close(
                torch.tensor(c.logprobs), _logprobs(learner.policy, c), atol=ATOL, rtol=0
            )
        before = {k: v.clone() for k, v in learner.policy_state().items()}
        for _ in range(3):
            learner.step(batch)
        state = learner.policy_state()
        assert not any("lora" in k or "base_layer" in k for k in state)
        engine.update_weights(state, 6)  # a push: merged weights under the plain names
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
    finally:
        engine.close()
