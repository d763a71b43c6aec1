"""Per-token log-probs of the sampling distribution, computed in chunks over the sequence.

A full `(B, T, V)` float32 logits tensor is never built for the whole batch: the backbone's
hidden states are projected to the vocabulary `chunk_size` positions at a time, and each chunk
runs under activation checkpointing so its logits are rebuilt in the backward pass instead of
being stored. With a 150k vocabulary that is the difference between gigabytes and megabytes.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint


def _chunk_logprobs(
    hidden: torch.Tensor, targets: torch.Tensor, head: nn.Module, temperature: float
) -> tuple[torch.Tensor, torch.Tensor]:
    logits = head(hidden).float() / temperature
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 256,
    return_entropy: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`logprobs[b, t] = log softmax(logits_{t-1} / temperature)[input_ids[b, t]]`, `(B, T)`.

    Position 0 has no predecessor and gets 0. The distribution is the one the engine samples
    from before top-p/top-k truncation (DESIGN.md section 1). With `return_entropy`, also the
    entropy of that distribution at each position (same shape, same shift).
    """
    hidden = model.base_model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
    head = model.get_output_embeddings()
    h = hidden[:, :-1]
    targets = input_ids[:, 1:]
    outs, ents = [], []
    for s in range(0, h.shape[1], chunk_size):
        hc, tc = h[:, s : s + chunk_size], targets[:, s : s + chunk_size]
        if torch.is_grad_enabled() and hc.requires_grad:
            lp, ent = checkpoint(_chunk_logprobs, hc, tc, head, temperature, use_reentrant=False)
        else:
            lp, ent = _chunk_logprobs(hc, tc, head, temperature)
        outs.append(lp)
        ents.append(ent)
    zeros = torch.zeros_like(input_ids[:, :1], dtype=torch.float32)
    logprobs = torch.cat([zeros, *outs], dim=1)
    if return_entropy:
        return logprobs, torch.cat([zeros, *ents], dim=1)
    return logprobs
