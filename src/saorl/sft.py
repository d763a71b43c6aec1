"""Supervised warm-up: a short cross-entropy phase on task demonstrations before RL.

The built-in task starts from random weights, so the run first teaches the output format and
some arithmetic with a few hundred supervised steps; RL then has to do the rest. The loss is the
mean negative log-likelihood of the answer tokens (and EOS), not of the prompt.
"""

from __future__ import annotations

import torch
from torch import nn

from saorl.models.logprobs import sequence_logprobs
from saorl.models.tokenizer import encode_prompt


def encode_demos(
    tokenizer: object, prompts: list[str], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `(input_ids, attention_mask, target_mask)` for prompt + answer + EOS."""
    rows, masks = [], []
    for p, a in zip(prompts, answers, strict=True):
        p_ids = encode_prompt(tokenizer, p)
        a_ids = [*tokenizer.encode(a, add_special_tokens=False), tokenizer.eos_token_id]
        rows.append(p_ids + a_ids)
        masks.append([0] * len(p_ids) + [1] * len(a_ids))
    T = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    tmask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float)
    return ids, attn, tmask


def sft_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    grad_clip: float = 1.0,
) -> float:
    """One supervised step; returns the token-mean NLL of the answer tokens."""
    device = next(model.parameters()).device
    ids, attn, tmask = (x.to(device) for x in batch)
    model.train()
    logp = sequence_logprobs(model, ids, attn)
    loss = -(logp * tmask).sum() / tmask.sum().clamp(min=1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach())
