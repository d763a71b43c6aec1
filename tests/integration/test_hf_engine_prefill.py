"""The HF engine's grouped prefill (`saorl.engines.prefill_plan`) after a weight update.

After a push every running row is re-prefilled under the new weights, rows of very different
lengths in separate forwards. What must hold is what held with one padded forward: a token
labelled with the new version was sampled from the new weights given its whole prefix, and its
recorded log-prob is the new weights' (checked against a fresh unbatched forward of a model
holding them); tokens before the push are the old weights'.
"""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.engines.hf import HFEngine
from saorl.engines.protocol import Completion, EngineSettings, GenerationRequest
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.routing import RoutingRecorder
from tests.conftest import tiny_config

# Prompts of 4 to ~300 tokens: the re-prefill cannot pad them all to the longest for free.
PROMPTS = ["7+8=", "12+34=" * 3, "99+1=" * 12, "123+456=" * 38]
PUSH_AT = 6  # steps of decoding before the weight update


def _requests(tok, budget: int = 14) -> list[GenerationRequest]:
    # Row 1 greedy: its tokens must be the argmax of the weights that sampled them.
    return [
        GenerationRequest(tok.encode(p), budget, request_id=i, greedy=i == 1)
        for i, p in enumerate(PROMPTS)
    ]


def _new_state(model) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    return {k: v + 0.05 * torch.randn(v.shape, generator=g) for k, v in model.state_dict().items()}


def _run(model, tok, new_state, *, kv_cache: bool = True, **kw) -> tuple[HFEngine, list, list]:
    """Generate with a push after `PUSH_AT` steps; returns the engine, the completions and the
    row counts of the prefill forwards of the step that followed the push."""
    settings = EngineSettings(max_seq_len=400, temperature=0.9, max_concurrent=4, seed=7)
    engine = HFEngine(model, tok, settings, kv_cache=kv_cache, **kw)
    engine.eos_id = -1  # every row runs its whole budget, so every row spans the push
    forwards: list[int] = []
    prefill = engine._prefill

    def counting(rows):
        forwards.append(len(rows))
        return prefill(rows)

    engine._prefill = counting  # type: ignore[method-assign]
    for r in _requests(tok):
        engine.add_request(r)
    outs: list[Completion] = []
    for _ in range(PUSH_AT):
        outs += engine.step()
    engine.update_weights(new_state, version=1)
    forwards.clear()
    outs += engine.step()
    after_push = list(forwards)
    while engine.num_unfinished():
        outs += engine.step()
    return engine, sorted(outs, key=lambda c: c.request.request_id), after_push


def _fresh(model, state=None):
    m = copy.deepcopy(model)
    if state is not None:
        m.load_state_dict(state)
    return m.eval()


def test_tokens_after_a_push_are_the_new_weights_whatever_the_row_lengths(tiny_policy):
    model, tok = tiny_policy
    new_state = _new_state(model)
    _, outs, after_push = _run(model, tok, new_state)
    # The re-prefill did split: the ~300-token row is not in the short rows' forward.
    assert len(after_push) >= 2 and sum(after_push) == len(PROMPTS)
    old, new = _fresh(model), _fresh(model, new_state)
    for c in outs:
        assert c.versions == [0] * PUSH_AT + [1] * (len(c.token_ids) - PUSH_AT)
        ids = torch.tensor([c.request.prompt_ids + c.token_ids])
        p = len(c.request.prompt_ids)
        with torch.no_grad():
            for weights, span in ((old, slice(0, PUSH_AT)), (new, slice(PUSH_AT, None))):
                lp = sequence_logprobs(weights, ids, torch.ones_like(ids), temperature=0.9)
                # float32, a padded batch against an unbatched forward: 1e-4 absolute.
                torch.testing.assert_close(
                    torch.tensor(c.logprobs[span]), lp[0, p:][span], atol=1e-4, rtol=0
                )
                if c.request.greedy:
                    logits = weights(input_ids=ids).logits[0, p - 1 : -1]
                    assert c.token_ids[span] == logits.argmax(-1)[span].tolist()


def test_grouped_prefill_matches_the_reencode_reference(tiny_policy):
    """Same seed: the cache with a grouped re-prefill samples what re-encoding every step does."""
    model, tok = tiny_policy
    new_state = _new_state(model)
    _, ref, _ = _run(model, tok, new_state, kv_cache=False)
    _, kv, after_push = _run(model, tok, new_state)
    assert len(after_push) >= 2
    for a, b in zip(ref, kv, strict=True):
        assert (a.token_ids, a.versions, a.finish_reason) == (
            b.token_ids,
            b.versions,
            b.finish_reason,
        )
        torch.testing.assert_close(
            torch.tensor(b.logprobs), torch.tensor(a.logprobs), atol=1e-5, rtol=0
        )


@pytest.fixture(scope="module")
def moe():
    torch.manual_seed(0)
    cfg = tiny_config(
        "model.arch=qwen3_moe",
        "model.hidden_size=64",
        "model.num_experts=8",
        "model.intermediate_size=32",
        "model.num_experts_per_tok=2",
    )
    return load_policy(cfg.model)


def test_routing_after_a_grouped_re_prefill_is_the_new_weights(moe):
    """A push re-routes every fed position: the record is the new router's everywhere."""
    policy, tok = moe
    new_state = _new_state(policy)
    engine, outs, after_push = _run(policy, tok, new_state, record_routing=True)
    engine.close()
    assert len(after_push) >= 2
    new = _fresh(policy, new_state)
    for c in outs:
        ids = c.request.prompt_ids + c.token_ids
        rec = RoutingRecorder(new)
        try:
            with torch.no_grad():
                new.base_model(input_ids=torch.tensor([ids]), use_cache=False)
            own = rec.take(1, len(ids))[0]
        finally:
            rec.close()
        fed = len(ids) - 1  # the last sampled token was never fed
        assert c.routing.shape[0] == fed
        assert torch.equal(c.routing.long().sort(-1).values, own[:fed].sort(-1).values)
