"""Sequence packing by token budget against the padded path it replaces (issue 8).

Packed rows run as one row with position ids restarting per sequence and no attention mask;
transformers 5 then builds a block-diagonal causal mask (sdpa and eager). Tolerance: float32
rounding only, 1e-5 absolute on log-probs/entropy/values (magnitudes ~1-5) and on weights after
two learner steps (each step moves weights by ~1e-4).
"""

from __future__ import annotations

import copy

import pytest
import torch

from saorl.learner.learner import Learner
from saorl.models.critic import Critic
from saorl.models.logprobs import sequence_logprobs
from saorl.models.packing import pack_rows, plan_token_micro_batches
from tests.conftest import tiny_config
from tests.integration.test_learner import _batch

TOL = dict(atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_logprobs_entropy_values_equal_padded(tiny_policy, attn):
    policy, _ = tiny_policy
    policy = copy.deepcopy(policy)
    policy.set_attn_implementation(attn)
    b = _batch(policy, n=6, seed=3)
    assert (b.attention_mask == 0).any()  # there is padding to remove
    lp_pad, ent_pad = sequence_logprobs(
        policy, b.input_ids, b.attention_mask, temperature=0.7, chunk_size=5, return_entropy=True
    )
    lp_pk, ent_pk = sequence_logprobs(
        policy,
        b.input_ids,
        b.attention_mask,
        temperature=0.7,
        chunk_size=5,
        return_entropy=True,
        packed=True,
    )
    real = b.attention_mask.bool()
    torch.testing.assert_close(lp_pk[real], lp_pad[real], **TOL)
    torch.testing.assert_close(ent_pk[real], ent_pad[real], **TOL)
    assert (lp_pk[~real] == 0).all() and (lp_pk[:, 0] == 0).all()
    critic = Critic(policy)
    torch.nn.init.normal_(critic.value_head.weight)  # a zero head would hide any difference
    v_pad = critic(b.input_ids, b.attention_mask)
    v_pk = critic(b.input_ids, b.attention_mask, packed=True)
    torch.testing.assert_close(v_pk[real], v_pad[real], **TOL)
    assert (v_pk[:, 0] == 0).all()


def test_packed_gradients_equal_padded(tiny_policy):
    policy, _ = tiny_policy
    b = _batch(policy, n=5, seed=4)
    grads = []
    for packed in (False, True):
        model = copy.deepcopy(policy)
        lp = sequence_logprobs(model, b.input_ids, b.attention_mask, packed=packed)
        (lp * b.action_mask).sum().backward()
        grads.append([p.grad for p in model.parameters()])
    for g_pad, g_pk in zip(*grads, strict=True):
        torch.testing.assert_close(g_pk, g_pad, atol=1e-5, rtol=1e-4)


def test_attention_does_not_cross_packed_sequences(tiny_policy):
    """Changing sequence 0 must leave sequence 1's log-probs untouched when packed."""
    policy, _ = tiny_policy
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    mask = torch.ones_like(ids)
    base = sequence_logprobs(policy, ids, mask, packed=True)
    other = ids.clone()
    other[0] = torch.tensor([40, 41, 42, 43])
    changed = sequence_logprobs(policy, other, mask, packed=True)
    assert torch.equal(changed[1], base[1])
    assert not torch.equal(changed[0], base[0])


def test_pack_rows_layout_and_left_padding_error():
    ids = torch.tensor([[1, 2, 3, 0], [4, 5, 0, 0]])
    mask = (ids != 0).long()
    pk = pack_rows(ids, mask)
    assert pk.input_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert pk.position_ids.tolist() == [[0, 1, 2, 0, 1]]
    # unpack: shifted values, so each sequence's first token reads 0.
    out = pk.unpack(torch.tensor([[10.0, 11.0, 12.0, 13.0, 14.0]]))
    assert out.tolist() == [[0.0, 11.0, 12.0, 0.0], [0.0, 14.0, 0.0, 0.0]]
    with pytest.raises(ValueError, match="right-padded"):
        pack_rows(ids, torch.tensor([[0, 1, 1, 1], [1, 1, 0, 0]]))
    # From the host lengths: the same layout without reading the mask (checked on a CPU mask).
    pk2 = pack_rows(ids, mask, [3, 2])
    assert torch.equal(pk2.rows, pk.rows) and torch.equal(pk2.cols, pk.cols)
    with pytest.raises(ValueError, match="not the mask's"):
        pack_rows(ids, mask, [2, 3])


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_host_lengths_change_nothing(tiny_policy, attn):
    """With the rows' lengths the forwards drop masks that mask nothing (rows without padding,
    one packed sequence): the same log-probs, entropies and values as without them."""
    policy, _ = tiny_policy
    policy = copy.deepcopy(policy)
    policy.set_attn_implementation(attn)
    b = _batch(policy, n=6, seed=3)
    critic = Critic(policy)
    torch.nn.init.normal_(critic.value_head.weight)
    full = torch.ones_like(b.attention_mask)
    for ids, mask in (
        (b.input_ids, b.attention_mask),
        (b.input_ids, full),
        (b.input_ids[:1], full[:1]),
    ):
        lengths = mask.sum(-1).tolist()
        for packed in (False, True):
            ref = sequence_logprobs(policy, ids, mask, return_entropy=True, packed=packed)
            out = sequence_logprobs(
                policy, ids, mask, return_entropy=True, packed=packed, lengths=lengths
            )
            for x, y in zip(out, ref, strict=True):
                torch.testing.assert_close(x, y, **TOL)
            v = critic(ids, mask, packed=packed, lengths=lengths)
            torch.testing.assert_close(v, critic(ids, mask, packed=packed), **TOL)


def test_token_budget_plan():
    lengths = [9, 3, 7, 2, 12, 5, 1]
    plan = plan_token_micro_batches(lengths, budget=10)
    assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
    for mb in plan:  # within budget, except a row longer than the budget, alone
        assert sum(lengths[i] for i in mb) <= 10 or len(mb) == 1
    # First-fit decreasing: 12 | 9+1 | 7+3 | 5+2 -> 4 micro-batches, 39 tokens in 40 slots.
    assert sorted(sorted(lengths[i] for i in mb) for mb in plan) == [[1, 9], [2, 5], [3, 7], [12]]


@pytest.mark.slow
def test_packed_learner_step_equals_padded(tiny_policy):
    policy, _ = tiny_policy
    batch = _batch(policy)
    for agg in ("token_mean", "seq_mean_token_mean"):
        common = ("critic.warmup_steps=0", f"algorithm.loss_agg={agg}", "learner.lr_warmup_steps=0")
        cfg_pad = tiny_config(*common, "learner.micro_batch_size=3")
        cfg_pk = tiny_config(*common, "learner.micro_batch_tokens=20")
        pad = Learner(cfg_pad, copy.deepcopy(policy), torch.device("cpu"))
        pk = Learner(cfg_pk, copy.deepcopy(policy), torch.device("cpu"))
        for _ in range(2):  # the second Adam step depends on gradient magnitudes, not signs
            m_pad, m_pk = pad.step(batch), pk.step(batch)
            for k in (
                "loss/policy",
                "loss/value",
                "policy/entropy",
                "critic/grad_norm",
                "policy/grad_norm",
                "value/explained_variance",
            ):
                assert abs(m_pad[k] - m_pk[k]) < 1e-5, (agg, k, m_pad[k], m_pk[k])
        assert pad.version == pk.version == 2
        for a, b in zip(pad.policy.parameters(), pk.policy.parameters(), strict=True):
            torch.testing.assert_close(a, b, **TOL)
        for a, b in zip(pad.critic.parameters(), pk.critic.parameters(), strict=True):
            torch.testing.assert_close(a, b, **TOL)


@pytest.mark.parametrize("entropy_grad", [False, True])
def test_fused_logprobs_equal_the_autograd_path(tiny_policy, entropy_grad):
    """The hand-written chunk backward against autograd through log_softmax (the reference)."""
    policy, _ = tiny_policy
    b = _batch(policy, n=5, seed=5)
    g = torch.Generator().manual_seed(0)
    w_lp, w_ent = torch.randn(b.input_ids.shape, generator=g), torch.randn(b.input_ids.shape)
    outs, grads = [], []
    for impl in ("checkpoint", "fused"):
        model = copy.deepcopy(policy)
        lp, ent = sequence_logprobs(
            model,
            b.input_ids,
            b.attention_mask,
            temperature=0.7,
            chunk_size=4,
            return_entropy=True,
            impl=impl,
        )
        loss = (lp * w_lp * b.attention_mask).sum()
        if entropy_grad:
            loss = loss + (ent * w_ent * b.attention_mask).sum()
        loss.backward()
        outs.append((lp.detach(), ent.detach()))
        grads.append([p.grad for p in model.parameters()])
    torch.testing.assert_close(outs[1][0], outs[0][0], **TOL)
    torch.testing.assert_close(outs[1][1], outs[0][1], **TOL)
    for g_ref, g_fused in zip(*grads, strict=True):
        torch.testing.assert_close(g_fused, g_ref, atol=1e-5, rtol=1e-4)
