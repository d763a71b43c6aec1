"""The HF engine against the learner's own log-prob computation, and its batching behaviour."""

from __future__ import annotations

import threading

import pytest
import torch
from torch.overrides import TorchFunctionMode

from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.models.logprobs import sequence_logprobs

# Every engine test runs on both decoding paths: the KV cache and the re-encode reference.
KV = pytest.mark.parametrize("kv_cache", [True, False], ids=["kv", "reencode"])


def _engine(model, tok, *, kv_cache: bool = True, **settings) -> HFEngine:
    return HFEngine(model, tok, EngineSettings(max_seq_len=32, **settings), kv_cache=kv_cache)


def _requests(tok, prompts: list[str], n: int = 6, **kw) -> list[GenerationRequest]:
    return [GenerationRequest(tok.encode(p), n, request_id=i, **kw) for i, p in enumerate(prompts)]


@KV
def test_engine_logprobs_match_learner_recomputation(tiny_policy, kv_cache):
    model, tok = tiny_policy
    for temperature in (1.0, 0.7):
        engine = _engine(
            model, tok, temperature=temperature, top_p=0.9, max_concurrent=3, kv_cache=kv_cache
        )
        outs = engine.generate(_requests(tok, ["12+34=", "7+8=", "99+1=", "5+5="]))
        for c in outs:
            ids = torch.tensor([c.request.prompt_ids + c.token_ids])
            lp = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=temperature)
            recomputed = lp[0, len(c.request.prompt_ids) :]
            # Same weights, same float32 math up to batching/padding order: 1e-4 absolute.
            # top_p truncates sampling only; recorded log-probs are of the full softmax(l/T).
            torch.testing.assert_close(recomputed, torch.tensor(c.logprobs), atol=1e-4, rtol=0)


def test_chunked_logprobs_equal_unchunked(tiny_policy):
    model, _ = tiny_policy
    ids = torch.randint(3, 90, (3, 20))
    attn = torch.ones_like(ids)
    full = sequence_logprobs(model, ids, attn, chunk_size=1000)
    chunked = sequence_logprobs(model, ids, attn, chunk_size=3)
    torch.testing.assert_close(full, chunked)
    logits = model(input_ids=ids, attention_mask=attn).logits.float()
    ref = torch.log_softmax(logits[:, :-1], -1).gather(-1, ids[:, 1:, None]).squeeze(-1)
    torch.testing.assert_close(full[:, 1:], ref, atol=1e-5, rtol=1e-5)
    assert torch.all(full[:, 0] == 0)


@KV
def test_weight_update_mid_generation_shows_in_versions(tiny_policy, kv_cache):
    model, tok = tiny_policy
    engine = _engine(model, tok, max_concurrent=4, kv_cache=kv_cache)
    for r in _requests(tok, ["1+1=", "2+2="], n=10):
        r.stop = []
        engine.add_request(r)
    # Force long generations: no early EOS so that the update lands mid-sequence.
    engine.eos_id = -1
    for _ in range(3):
        assert engine.step() == []
    new_state = {k: v + 0.01 for k, v in model.state_dict().items()}
    engine.update_weights(new_state, version=7)
    outs = []
    while engine.num_unfinished():
        outs += engine.step()
    assert len(outs) == 2
    for c in outs:
        assert c.versions == [0, 0, 0] + [7] * 7
        assert c.finish_reason == "length"
    # The engine's private copy changed; the caller's model did not.
    p = next(iter(model.state_dict()))
    assert torch.equal(engine.model.state_dict()[p], new_state[p])
    assert not torch.equal(model.state_dict()[p], new_state[p])


@KV
def test_continuous_batching_long_rollout_does_not_hold_others(tiny_policy, kv_cache):
    model, tok = tiny_policy
    engine = _engine(model, tok, max_concurrent=2, kv_cache=kv_cache)
    engine.eos_id = -1
    long = GenerationRequest(tok.encode("1+1="), 20, request_id=0)
    shorts = [GenerationRequest(tok.encode("2+2="), 2, request_id=i) for i in range(1, 5)]
    for r in [long, *shorts]:
        engine.add_request(r)
    finished_at: dict[int, int] = {}
    step = 0
    while engine.num_unfinished():
        step += 1
        for c in engine.step():
            finished_at[c.request.request_id] = step
    # Slot 2 is reused: the four short ones finish at steps 2, 4, 6, 8 while the long one runs.
    assert [finished_at[i] for i in range(1, 5)] == [2, 4, 6, 8]
    assert finished_at[0] == 20


@KV
def test_stop_strings_greedy_and_context_clamp(tiny_policy, kv_cache):
    model, tok = tiny_policy
    engine = _engine(model, tok, max_concurrent=4, kv_cache=kv_cache)
    greedy = engine.generate(_requests(tok, ["3+4="] * 2, n=8, greedy=True))
    assert greedy[0].token_ids == greedy[1].token_ids  # greedy is deterministic
    # A stop string that the greedy continuation contains ends the sequence right there.
    text = tok.decode(greedy[0].token_ids, skip_special_tokens=True)
    if len(text) >= 2:
        stop = text[1]
        out = engine.generate(_requests(tok, ["3+4="], n=8, greedy=True, stop=[stop]))[0]
        assert out.finish_reason == "stop"
        assert tok.decode(out.token_ids).endswith(stop)
    # max_new_tokens is clamped to the context: prompt 30 + 2 tokens fills max_seq_len 32.
    engine.eos_id = -1
    out = engine.generate([GenerationRequest([5] * 30, 10)])[0]
    assert len(out.token_ids) == 2 and out.finish_reason == "length"


def test_update_weights_does_not_wait_for_a_decoding_step(tiny_policy):
    model, tok = tiny_policy
    engine = _engine(model, tok)
    state = {k: v + 0.01 for k, v in model.state_dict().items()}
    # Hold the decoding lock as a step in progress would: the push must still return at once.
    with engine._lock:
        pusher = threading.Thread(target=engine.update_weights, args=(state, 3))
        pusher.start()
        pusher.join(timeout=10)
        assert not pusher.is_alive()
        assert engine.version == 0  # not applied mid-step
    engine.step()  # the next step boundary applies it
    assert engine.version == 3


def test_update_weights_snapshots_the_callers_tensors(tiny_policy):
    model, tok = tiny_policy
    engine = _engine(model, tok)
    state = {k: v.clone() + 0.01 for k, v in model.state_dict().items()}
    expected = {k: v.clone() for k, v in state.items()}
    engine.update_weights(state, 1)
    for v in state.values():  # the learner goes on training its own tensors in place
        v.add_(1.0)
    newer = {k: v + 0.02 for k, v in expected.items()}
    engine.update_weights(newer, 2)  # a newer push replaces the queued one
    engine.update_weights(state, 1)  # an older one arriving late does not
    engine.generate([GenerationRequest(tok.encode("1+1="), 2)])
    assert engine.version == 2
    got = engine.model.state_dict()
    for k, v in newer.items():
        assert torch.equal(got[k], v), k


def test_update_weights_with_wrong_keys_fails_in_the_callers_thread(tiny_policy):
    model, tok = tiny_policy
    engine = _engine(model, tok)
    state = dict(model.state_dict())
    state["not.a.weight"] = torch.zeros(1)
    with pytest.raises(ValueError, match=r"not\.a\.weight"):
        engine.update_weights(state, 1)


@KV
def test_min_new_tokens_suppresses_eos(tiny_policy, kv_cache):
    model, tok = tiny_policy
    engine = _engine(model, tok, kv_cache=kv_cache)
    head = engine._head
    # Make EOS overwhelmingly likely: unforced requests stop at once, forced ones may not.
    bias = torch.zeros(len(tok))
    bias[tok.eos_token_id] = 30.0
    engine._head = lambda h: head(h) + bias
    free, forced, forced_greedy = engine.generate(
        [
            GenerationRequest(tok.encode("1+1="), 6, request_id=0),
            GenerationRequest(tok.encode("1+1="), 6, request_id=1, min_new_tokens=6),
            GenerationRequest(tok.encode("1+1="), 6, request_id=2, min_new_tokens=4, greedy=True),
        ]
    )
    assert free.token_ids == [tok.eos_token_id] and free.finish_reason == "eos"
    assert len(forced.token_ids) == 6 and tok.eos_token_id not in forced.token_ids
    assert forced.finish_reason == "length"
    # Greedy rows honour it too: argmax over everything but EOS, then EOS once allowed.
    assert len(forced_greedy.token_ids) == 5 and forced_greedy.token_ids[-1] == tok.eos_token_id
    assert tok.eos_token_id not in forced_greedy.token_ids[:4]
    # Recorded log-probs are of the unmasked softmax: EOS holds almost all the mass.
    assert max(forced.logprobs) < -20


_SYNCS = frozenset(
    {
        torch.Tensor.item,
        torch.Tensor.tolist,
        torch.Tensor.__bool__,
        torch.Tensor.cpu,
        torch.Tensor.numpy,
    }
)


class _HostSyncs(TorchFunctionMode):
    """Records tensor calls that read device memory from the host (a sync on a GPU)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _SYNCS:
            self.calls.append(func.__name__)
        return func(*args, **(kwargs or {}))


def test_a_decoding_step_reads_the_device_once(tiny_policy):
    """The KV-cache hot loop: one `.cpu()` per step (ids and log-probs together), then only
    host lists; nothing in the engine or in transformers' mask code reads device values."""
    model, tok = tiny_policy
    engine = _engine(model, tok, max_concurrent=4)
    for i, kw in enumerate([{"greedy": True}, {"min_new_tokens": 5}, {}]):
        engine.add_request(GenerationRequest(tok.encode("1+1="), 5 if i < 2 else 2, **kw))
    engine.eos_id = -1
    engine.step()  # prefill (joins may sync: once per request, not per token)
    with _HostSyncs() as rec:
        finished = engine.step()  # decode; the third request retires here
    assert len(finished) == 1
    assert rec.calls == ["cpu", "tolist", "tolist"]
