"""Per-token log-probs of the sampling distribution, computed in chunks over the sequence.

A full `(B, T, V)` float32 logits tensor is never built for the whole batch: the backbone's
hidden states are projected to the vocabulary `chunk_size` positions at a time, and each chunk's
logits are rebuilt in the backward pass instead of being stored, either by a hand-written
backward that works in one `(chunk, V)` buffer (`impl="fused"`, the default) or by activation
checkpointing around plain autograd (`impl="checkpoint"`, the reference it is tested against).
At a 150k vocabulary and 1024 positions the peak is ~0.2x that of full logits
(`benchmarks/bench_learner.py` measures it).

With `packed=True` the rows are packed into one row without padding (`saorl.models.packing`)
and the results are scattered back to the padded `(B, T)` layout, so callers cannot tell.

Attention masks are built here, on the device, for the sdpa and eager kernels (`ready_mask`):
given a 2-D mask or packed position ids, transformers 5 reads the device back to decide whether
the mask can be dropped for sdpa's `is_causal` (`masking_utils._ignore_causal_mask_sdpa`,
`find_packed_sequence_indices`), a host sync in every forward. A ready 4-D mask is passed
through untouched, as the HF engine does in decoding. The mask is the one transformers would
build: `(B, 1, T, T)` boolean (sdpa) or additive in the embeddings' dtype (eager), and a packed
row of L tokens gets an `(1, 1, L, L)` block-diagonal causal mask, L^2 bytes for sdpa (eager
materialises `(H, L, L)` scores anyway). When it is known on the host that there is nothing to
mask (a packed micro-batch of one row; or from `lengths`: every row full, one sequence packed),
no mask is passed and sdpa keeps `is_causal` (no T x T memory, the flash kernel); without
`lengths` a padded micro-batch always gets its mask, even when no row is padded. Models whose
forward takes a per-layer-type mapping get `{"full_attention": None}`, which skips the mask
code and its read too; others run it (one read) to keep `is_causal`. flash_attention_2, other
kernels and models with sliding-window layers (one 4-D mask would serve every layer) keep
transformers' own path.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from saorl.models.packing import PackedRows, pack_rows


def _chunk_logprobs(
    hidden: torch.Tensor,
    targets: torch.Tensor,
    head: nn.Module,
    temperature: float,
    with_entropy: bool,
) -> tuple[torch.Tensor, torch.Tensor]:
    # In place: one fewer (chunk, V) float32 tensor; the head's backward does not need its output.
    logits = head(hidden).float().div_(temperature)
    logp = torch.log_softmax(logits, dim=-1)
    chosen = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if not with_entropy:  # the entropy costs two more (chunk, V) tensors: skip it if unused
        return chosen, chosen.new_zeros(())
    entropy = -(logp.exp() * logp).sum(-1)
    return chosen, entropy


class _FusedChunkLogprobs(torch.autograd.Function):
    """Log-probs (and entropy) of one chunk with a hand-written, in-place backward.

    Forward: `z = (h W^T + b) / tau`, `lse = logsumexp(z)`, `chosen = z[y] - lse`,
    `entropy = lse - sum_j p_j z_j` with `p = softmax(z)`. Only `h`, `lse` and `entropy` are
    saved. Backward recomputes `z` into one float32 (chunk, V) buffer and turns it in place
    into `dL/dz = g_c * (onehot(y) - p) - g_e * p * (log p + entropy)`, so one (chunk, V)
    buffer is live where autograd through `log_softmax` + `gather` keeps three (two more when
    the entropy needs a gradient). `bench_learner.py` measures the peak; the test
    `test_fused_logprobs_equal_the_autograd_path` checks values and gradients against
    `_chunk_logprobs`.
    """

    @staticmethod
    def forward(
        ctx: Any,
        hidden: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        targets: torch.Tensor,
        temperature: float,
        with_entropy: bool,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = F.linear(hidden, weight, bias).float().div_(temperature)
        lse = torch.logsumexp(z, dim=-1)
        chosen = z.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - lse
        if with_entropy:
            entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
        else:
            entropy = chosen.new_zeros(())
        ctx.save_for_backward(hidden, weight, bias, targets, lse, entropy)
        ctx.temperature = temperature
        ctx.with_entropy = with_entropy
        ctx.set_materialize_grads(False)
        return chosen, entropy

    @staticmethod
    def backward(
        ctx: Any, g_chosen: torch.Tensor | None, g_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, ...]:
        hidden, weight, bias, targets, lse, entropy = ctx.saved_tensors
        z = F.linear(hidden, weight, bias).float().div_(ctx.temperature)
        logp = z.sub_(lse.unsqueeze(-1))  # in place: the buffer now holds log p
        g_c = g_chosen if g_chosen is not None else torch.zeros_like(lse)
        if ctx.with_entropy and g_entropy is not None:
            p = logp.exp()
            # -p * (g_c + g_e * (log p + H)), built in the log p buffer
            grad = logp.add_(entropy.unsqueeze(-1)).mul_(g_entropy.unsqueeze(-1))
            grad = grad.add_(g_c.unsqueeze(-1)).mul_(p).neg_()
            del p
        else:
            grad = logp.exp_().mul_(-g_c.unsqueeze(-1))
        grad.scatter_add_(-1, targets.unsqueeze(-1), g_c.unsqueeze(-1))
        grad = grad.div_(ctx.temperature).to(weight.dtype)
        grad_hidden = grad @ weight if ctx.needs_input_grad[0] else None
        flat = grad.reshape(-1, grad.shape[-1])
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = flat.t() @ hidden.reshape(-1, hidden.shape[-1])
        grad_bias = flat.sum(0) if bias is not None and ctx.needs_input_grad[2] else None
        return grad_hidden, grad_weight, grad_bias, None, None, None


def _full_attention_only(config: Any) -> bool:
    """No sliding-window layer: one causal mask serves every layer."""
    types = getattr(config, "layer_types", None) or []
    no_window = getattr(config, "sliding_window", None) is None
    return no_window and all(t == "full_attention" for t in types)


@functools.cache
def _takes_mask_mapping(cls: type) -> bool:
    """Whether `cls.forward` takes a ready per-layer-type mask mapping (most transformers 5
    decoders: Qwen2/3, Mistral, ...), which skips the mask code; Llama and Qwen3-MoE do not."""
    try:
        src = inspect.getsource(cls.forward)
    except (OSError, TypeError):
        return False
    return "causal_mask_mapping := attention_mask, dict" in src


def ready_mask(
    backbone: nn.Module, attention_mask: torch.Tensor | None, position_ids: torch.Tensor | None
) -> torch.Tensor:
    """The 4-D mask transformers would build, built on the device without reading it back.

    Padded rows (`attention_mask` `(B, T)`, position ids None): causal and not a padding key.
    A packed row (`attention_mask` None, position ids `(1, L)` restarting at 0 per sequence):
    causal within each sequence. Boolean (True = attend) for sdpa; for eager, 0 / the dtype's
    minimum in the embeddings' dtype (the dtype of transformers' own eager mask).
    """
    ref = attention_mask if attention_mask is not None else position_ids
    assert ref is not None
    n = ref.shape[-1]
    causal = torch.ones(n, n, dtype=torch.bool, device=ref.device).tril_()  # [q, kv]: kv <= q
    if attention_mask is not None:
        mask = causal[None] & attention_mask.bool()[:, None, :]
    else:
        seq = (position_ids == 0).cumsum(-1)  # which sequence of the packed row a token is in
        mask = causal[None] & (seq[:, :, None] == seq[:, None, :])
    mask = mask[:, None]
    if backbone.config._attn_implementation == "eager":
        emb = backbone.get_input_embeddings()
        dtype = emb.weight.dtype if emb is not None else next(backbone.parameters()).dtype
        zero = torch.zeros((), dtype=dtype, device=mask.device)
        mask = torch.where(mask, zero, torch.finfo(dtype).min)
    return mask


def backbone_hidden(
    backbone: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor | None,
    position_ids: torch.Tensor | None = None,
    nothing_masked: bool = False,
) -> torch.Tensor:
    """Last hidden states of padded rows (`attention_mask`) or a packed row (`position_ids`).

    sdpa/eager get a ready mask (`ready_mask`): no host read. `nothing_masked`: the caller
    knows on the host that no row has padding (or the packed row holds one sequence), so sdpa
    gets no mask and keeps `is_causal`. `use_cache=False`: a KV cache also disables
    transformers' packing detection (the path other kernels take).
    """
    config = backbone.config
    attn = config._attn_implementation
    if attn not in ("sdpa", "eager") or not _full_attention_only(config):
        mask: Any = attention_mask  # transformers' own mask code
    elif attn == "eager" or not nothing_masked:  # eager has no is_causal: always a mask
        mask = ready_mask(backbone, attention_mask, position_ids)
    else:
        # Positions 0.. are the default (full rows, or one packed sequence). Without a mapping
        # the model runs transformers' mask code: one read, and is_causal.
        position_ids = None
        mask = {"full_attention": None} if _takes_mask_mapping(type(backbone)) else None
    out = backbone(
        input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False
    )
    return out.last_hidden_state


def pack_or_pad(
    backbone: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    packed: bool,
    lengths: Sequence[int] | None,
) -> tuple[torch.Tensor, PackedRows | None]:
    """`(hidden, packing)` of the rows: packed into one row, or padded as they are."""
    if packed:
        pk = pack_rows(input_ids, attention_mask, lengths)
        # One row packs into one sequence: known from the shape, without `lengths`.
        single = input_ids.shape[0] == 1 or (lengths is not None and sum(map(bool, lengths)) == 1)
        return backbone_hidden(backbone, pk.input_ids, None, pk.position_ids, single), pk
    full = lengths is not None and all(n == input_ids.shape[1] for n in lengths)
    return backbone_hidden(backbone, input_ids, attention_mask, None, full), None


def sequence_logprobs(
    model: nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    temperature: float = 1.0,
    chunk_size: int = 256,
    return_entropy: bool = False,
    packed: bool = False,
    impl: str = "fused",
    lengths: Sequence[int] | None = None,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """`logprobs[b, t] = log softmax(logits_{t-1} / temperature)[input_ids[b, t]]`, `(B, T)`.

    Position 0 has no predecessor and gets 0. The distribution is the one the engine samples
    from before top-p/top-k truncation (docs/design.md section 1). With `return_entropy`, also the
    entropy of that distribution at each position (same shape, same shift). With `packed`, the
    right-padded rows run as one packed row (no padding tokens); padding positions get 0.
    With gradients, `impl="fused"` (a linear head) backpropagates each chunk by hand in one
    (chunk, V) buffer; `"checkpoint"` recomputes it under autograd (the reference path).
    `lengths`: the rows' lengths when the caller has them on the host (same results; no mask
    where none is needed, and packing without reading the mask back).
    """
    hidden, pk = pack_or_pad(model.base_model, input_ids, attention_mask, packed, lengths)
    ids = pk.input_ids if pk is not None else input_ids
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        impl = "checkpoint"  # the fused backward needs a plain linear head
    h = hidden[:, :-1]
    targets = ids[:, 1:]
    outs = []
    ents = []
    for s in range(0, h.shape[1], chunk_size):
        hc = h[:, s : s + chunk_size]
        tc = targets[:, s : s + chunk_size]
        if not (torch.is_grad_enabled() and hc.requires_grad):
            lp, ent = _chunk_logprobs(hc, tc, head, temperature, return_entropy)
        elif impl == "fused":
            lp, ent = _FusedChunkLogprobs.apply(
                hc, head.weight, head.bias, tc, temperature, return_entropy
            )
        elif impl == "checkpoint":
            lp, ent = checkpoint(
                _chunk_logprobs, hc, tc, head, temperature, return_entropy, use_reentrant=False
            )
        else:
            raise ValueError(
                f"sequence_logprobs: impl must be 'fused' or 'checkpoint', not {impl!r}"
            )
        outs.append(lp)
        ents.append(ent)
    zeros = torch.zeros_like(ids[:, :1], dtype=torch.float32)
    logprobs = torch.cat([zeros, *outs], dim=1)
    entropy = torch.cat([zeros, *ents], dim=1) if return_entropy else None
    if pk is not None:
        logprobs = pk.unpack(logprobs)
        entropy = pk.unpack(entropy) if entropy is not None else None
    if entropy is not None:
        return logprobs, entropy
    return logprobs


class PolicyLogprobs(nn.Module):
    """`sequence_logprobs` of a causal LM as a module's forward.

    FSDP2 gathers a root module's own parameters (embeddings, final norm, output head) in that
    module's forward hooks; `sequence_logprobs` calls the backbone and the head separately, so
    under `fully_shard` it must run inside a module's forward, which is this one.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        temperature: float = 1.0,
        chunk_size: int = 256,
        return_entropy: bool = False,
        packed: bool = False,
        lengths: Sequence[int] | None = None,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        return sequence_logprobs(
            self.model,
            input_ids,
            attention_mask,
            temperature=temperature,
            chunk_size=chunk_size,
            return_entropy=return_entropy,
            packed=packed,
            lengths=lengths,
        )
