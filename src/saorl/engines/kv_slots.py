"""Key/value cache slots for the HF engine's continuous batching (see `saorl.engines.hf`).

transformers' `DynamicCache` grows by concatenation, which copies the whole cache at every
token, and it has no notion of rows joining and leaving. `SlotCache` keeps one preallocated
buffer per layer and kind instead and hands the model, per forward, a `DynamicCache` whose
layers are views of those buffers (`_BufferLayer`) and write new columns in place.
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer


class _BufferLayer(DynamicLayer):
    """One layer's cache as views of preallocated buffers: `update` writes the new keys/values
    into the next columns in place, where `DynamicLayer` would concatenate (copy) the whole
    cache at every token."""

    def __init__(self, kbuf: torch.Tensor, vbuf: torch.Tensor, n: int, lo: int, end: int):
        super().__init__()
        self._kbuf = kbuf
        self._vbuf = vbuf
        self._n = n
        self._lo = lo
        self._end = end
        self.keys = kbuf[:n, :, lo:end]
        self.values = vbuf[:n, :, lo:end]
        self.is_initialized = True
        self.device = kbuf.device

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        end = self._end + key_states.shape[-2]
        self._kbuf[: self._n, :, self._end : end] = key_states
        self._vbuf[: self._n, :, self._end : end] = value_states
        self._end = end
        self.keys = self._kbuf[: self._n, :, self._lo : end]
        self.values = self._vbuf[: self._n, :, self._lo : end]
        return self.keys, self.values


class SlotCache:
    """Keys/values of the cached rows in buffers `(slots, kv heads, columns, head dim)`, one per
    layer. Live rows are slots 0..n-1; row s holds its `lens[s]` tokens right-aligned in
    columns `[end - lens[s], end)`, so the next token of every row goes to column `end` (one
    write for all rows). A freed slot is refilled by moving the last live row into it (one row
    copied, not the cache), so a forward always reads a single view `[:n, :, lo:end]`."""

    def __init__(self, slots: int, device: torch.device) -> None:
        self.slots = slots
        self.device = device
        self.k: list[torch.Tensor] = []
        self.v: list[torch.Tensor] = []
        self.end = 0
        self.lens: list[int] = []
        self.lens_dev = torch.zeros(slots, dtype=torch.long, device=device)

    @property
    def n(self) -> int:
        return len(self.lens)

    def clear(self) -> None:
        self.lens = []  # the buffers stay allocated for the next prefill
        self.end = 0

    def _reserve(self, left: int, right: int, like: list[torch.Tensor]) -> None:
        """Make columns `[end - left, end + right)` exist, moving the live window if needed."""
        width = max(self.lens, default=0)
        cols = self.k[0].shape[2] if self.k else 0
        left = max(left, width)
        if self.k and self.end >= left and self.end + right <= cols:
            return
        if self.k and not self.n and left + right <= cols:  # empty: restart at the left edge
            self.end = left
            return
        new_end = left
        new_cols = new_end + right + max(64, new_end)  # doubling: amortised O(1) per token
        k = [x.new_zeros((self.slots, x.shape[1], new_cols, x.shape[3])) for x in like]
        v = [torch.zeros_like(x) for x in k]
        if self.n and width:
            for new, old in zip(k + v, self.k + self.v, strict=True):
                new[: self.n, :, new_end - width : new_end] = old[
                    : self.n, :, self.end - width : self.end
                ]
        self.k = k
        self.v = v
        self.end = new_end

    def decode_inputs(self, additive: torch.dtype | None) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """`(cache, attention mask, position ids)` for one token per live row.

        With `additive` (a dtype) the mask is the 4-D additive one `(n, 1, 1, width + 1)`
        (0 = attend, dtype minimum = masked) that sdpa/eager attention take as is; given a 2-D
        mask instead, transformers checks whether it is all ones, a device-to-host sync at
        every token."""
        self._reserve(0, 1, self.k)
        width = max(self.lens)
        n = self.n
        cache = DynamicCache()
        cache.layers = [
            _BufferLayer(k, v, n, self.end - width, self.end)
            for k, v in zip(self.k, self.v, strict=True)
        ]
        lens = self.lens_dev[:n]
        cols = torch.arange(width + 1, device=self.device)
        keep = cols[None, :] >= (width - lens)[:, None]
        if additive is None:
            return cache, keep.long(), lens[:, None]
        mask = torch.zeros(keep.shape, dtype=additive, device=self.device)
        mask = mask.masked_fill(~keep, torch.finfo(additive).min)
        return cache, mask[:, None, None, :], lens[:, None]

    def advance(self) -> None:
        self.end += 1
        self.lens = [n + 1 for n in self.lens]
        self.lens_dev[: self.n] += 1

    def add_rows(self, prefill: Any, lens: list[int]) -> None:
        """Copy a left-padded prefill cache's rows into slots n.. (right-aligned at `end`)."""
        keys = [layer.keys for layer in prefill.layers]
        values = [layer.values for layer in prefill.layers]
        width = keys[0].shape[2]
        lo = self.n
        hi = self.n + len(lens)
        self._reserve(width, 1, keys)
        for buf, x in zip(self.k + self.v, keys + values, strict=True):
            buf[lo:hi, :, self.end - width : self.end] = x
        self.lens_dev[lo:hi] = torch.tensor(lens).to(self.device, non_blocking=True)
        self.lens = self.lens + lens

    def remove(self, slot: int) -> bool:
        """Free `slot`; returns whether the last live row was moved into it."""
        last = self.n - 1
        moved = slot != last
        if moved:
            lo = self.end - self.lens[last]
            for buf in self.k + self.v:
                buf[slot, :, lo : self.end] = buf[last, :, lo : self.end]
            self.lens[slot] = self.lens[last]
            self.lens_dev[slot] = self.lens_dev[last]
        self.lens.pop()
        return moved
