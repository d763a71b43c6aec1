"""Sequence packing: the rows of a right-padded batch laid end to end in one row, no padding.

A padded micro-batch of B rows spends `B * max_len` token slots on `sum(len_b)` real tokens; with
long-tailed lengths most of it is padding that the backbone and the vocabulary projection still
pay for. Packed, the same rows form one row of exactly `sum(len_b)` tokens, and micro-batches
are formed by a token budget instead of a row count.

Attention cannot cross sequences: for sdpa and eager, `saorl.models.logprobs.ready_mask` builds
the block-diagonal causal mask on the device from the position ids, which restart at 0 for every
sequence; for other kernels no attention mask is passed and transformers 5 detects the packed
layout from the position ids (`masking_utils.find_packed_sequence_indices`: a new sequence
starts wherever the position does not grow by one).
`tests/integration/test_packing.py` checks log-probs, entropy and values against the padded path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch


@dataclass
class PackedRows:
    """One packed row and where each of its tokens came from in the padded `(B, T)` batch."""

    input_ids: torch.Tensor  # (1, L) long, L = number of real tokens
    position_ids: torch.Tensor  # (1, L) long, restarting at 0 for every sequence
    rows: torch.Tensor  # (L,) long, padded row of each packed token
    cols: torch.Tensor  # (L,) long, padded column (= position) of each packed token
    shape: tuple[int, int]  # (B, T) of the padded batch

    def unpack(self, packed: torch.Tensor) -> torch.Tensor:
        """`(1, L)` per-token values of the shifted kind -> `(B, T)`, 0 at padding.

        Values here are shifted by one (position t is computed from the state at t-1), so the
        first token of each sequence would read the last token of the previous sequence: it is
        set to 0, as position 0 is in the padded path. Differentiable in `packed`.
        """
        first = self.position_ids[0] == 0
        vals = torch.where(first, torch.zeros((), dtype=packed.dtype), packed[0])
        out = torch.zeros(self.shape, dtype=packed.dtype, device=packed.device)
        return out.index_put((self.rows, self.cols), vals)


def pack_rows(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, lengths: Sequence[int] | None = None
) -> PackedRows:
    """Pack the real tokens of a right-padded `(B, T)` batch into one `(1, L)` row.

    `lengths`: the rows' lengths, known on the host; the layout is then built there and copied
    to the device, where finding it from the mask (`nonzero`) and checking that the mask is
    right-padded would read the device back. The check still runs on a CPU mask (free).
    """
    device = input_ids.device
    if lengths is None or attention_mask.device.type == "cpu":
        lens = attention_mask.sum(-1)
        cols_all = torch.arange(input_ids.shape[1], device=attention_mask.device)
        if not torch.equal(attention_mask.bool(), cols_all[None, :] < lens[:, None]):
            raise ValueError(
                "pack_rows: attention_mask must be right-padded (ones then zeros in every row), "
                "as Batch.from_trajectories builds it; set learner.micro_batch_tokens=0 otherwise"
            )
        if lengths is not None and lens.tolist() != list(lengths):
            raise ValueError(f"pack_rows: lengths {list(lengths)} are not the mask's")
    if lengths is None:
        # nonzero walks the mask in row-major order: sequence b's tokens, then sequence b+1's.
        rows, cols = attention_mask.nonzero(as_tuple=True)
    else:
        n = torch.tensor(list(lengths), dtype=torch.long)
        rows = torch.repeat_interleave(torch.arange(len(n)), n)
        starts = torch.cumsum(n, 0) - n  # each token's column: its index minus its row's start
        cols = torch.arange(int(n.sum())) - torch.repeat_interleave(starts, n)
        rows, cols = rows.to(device, non_blocking=True), cols.to(device, non_blocking=True)
    return PackedRows(
        input_ids=input_ids[rows, cols][None],
        position_ids=cols[None],
        rows=rows,
        cols=cols,
        shape=(int(input_ids.shape[0]), int(input_ids.shape[1])),
    )


def plan_token_micro_batches(lengths: list[int], budget: int) -> list[list[int]]:
    """Group row indices into micro-batches of at most `budget` tokens (first-fit decreasing).

    Rows are taken longest first and each goes into the first micro-batch with room for it; a
    row longer than the budget gets a micro-batch of its own (rows are never split, so a
    sequence's attention stays whole). Row order inside a micro-batch is ascending. Which rows
    share a micro-batch does not change the accumulated gradient: each micro-batch's loss is
    weighted by its share of the batch.
    """
    if budget < 1:
        raise ValueError(f"learner.micro_batch_tokens must be >= 1 to pack, got {budget}")
    bins: list[list[int]] = []
    room: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda j: (-lengths[j], j)):
        n = lengths[i]
        for k, r in enumerate(room):
            if n <= r:
                bins[k].append(i)
                room[k] -= n
                break
        else:
            bins.append([i])
            room.append(budget - n)
    return [sorted(b) for b in bins]
