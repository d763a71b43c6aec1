"""In-process rollout engine over a Hugging Face causal LM, with continuous batching.

Each decoding step runs the model over the running sequences, samples one token per sequence,
and retires those that finished (EOS, a stop string, or their token budget); queued requests
join at the next step. A long rollout therefore never holds the others back.

Two ways to compute a step's logits, chosen by `kv_cache` (`rollout.kv_cache`):
- `True` (default): a key/value cache. Running sequences hold a slot of preallocated per-layer
  buffers (`saorl.engines.kv_slots`), right-aligned so that every row's next key/value goes to
  the same column: a step feeds each row its last sampled token in one forward (attention
  mask over the cache, per-sequence position ids) and writes one column in place, with no
  copy of the cache.
  Requests that join are prefilled in the same step and copied into free slots; a retired
  row's slot is refilled by moving the last row into it. Rows to prefill are grouped by length,
  one forward per group (`saorl.engines.prefill_plan`), so that a long row does not pad many
  short ones to its width; each group is right-padded with no attention mask, so the model
  runs its plain causal attention kernel rather than a masked one (`_prefill`).
- `False`: the reference. Every step re-encodes the whole of every running sequence
  (right-padded, no cache). `tests/parity/test_hf_engine_kv.py` checks that both sample the same
  tokens with the same log-probs from the same seed.

Both feed one `(running, vocab)` logits matrix, in the same row order, to one sampling call, so
the random stream is consumed identically.

Weight updates are not applied under the decoding lock: `update_weights` snapshots the state
(the learner keeps training its own tensors) and returns; the engine loads the newest snapshot
at its next step boundary, in its own thread. So the learner never waits for a decoding step,
and every token records the version it was sampled under. With the cache on, the keys/values of
in-flight sequences were computed by the old weights: the engine drops the cache and re-prefills
them under the new weights (it does not keep stale keys/values, as a partial-rollout vLLM setup
may). A token labelled version v was then sampled from exactly policy v given its whole prefix,
which is what the learner's importance ratio assumes; the price is one prefill of the running
sequences per weight update, grouped by length as above (one padded forward over rows of 10
to 1000 tokens would cost several times their own tokens).

Host-device traffic in the hot loop: inputs go up once per forward (non-blocking); one transfer per
step brings the sampled ids and log-probs back together (stop checks need them on the host).
Greedy and EOS flags are decided on the host and cache lengths are mirrored on the device, so
this module adds no other synchronisation (transformers' own mask code may add some).

With `record_routing` (MoE policies, `algorithm.routing_replay`) every forward also keeps the
experts each router chose per token (`saorl.models.routing.RoutingRecorder`): a prefill records
every position of its rows (replacing what earlier forwards recorded, as it re-routes them), a
decoding step the one position it feeds. The record stays on the device until the sequence
finishes and comes back with its completion.

A policy with LoRA adapters is copied with the adapters merged (`saorl.models.lora.merged_copy`):
decoding runs the plain model (unmerged adapters cost 40-75 % more time per token on CPU). A push
may then be merged weights, or a LoRA-layout state, adapters only (`model.lora_push =
"adapter"`) or base and adapters: the engine keeps the base weights of the adapted layers and
merges the pushed adapters into its copy when it loads them (`saorl.models.lora.AdapterMerger`).
"""

from __future__ import annotations

import copy
import inspect
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn
from transformers.cache_utils import DynamicCache

from saorl.engines.kv_slots import SlotCache
from saorl.engines.prefill_plan import plan_prefill
from saorl.engines.protocol import (
    Completion,
    EngineSettings,
    GenerationRequest,
    run_to_completion,
)
from saorl.engines.requests import Running, abort_running, check_fits, token_budget
from saorl.models.lora import AdapterMerger, has_lora, is_adapter_key, merged_copy
from saorl.models.routing import RoutingRecorder


@dataclass
class _Running(Running):
    slot: int = -1  # row of the KV cache holding this sequence; -1 = none (prefill next step)


class HFEngine:
    """Continuous-batching sampler over an HF causal LM.

    By default the engine owns a private copy of `model` (the learner trains its own); pass
    `copy_model=False` to sample from `model` itself, e.g. for evaluation in the learner thread.
    `lora_adapter=False`: a LoRA `model`'s pushes will be merged weights (`model.lora_push`), so
    no copy of its base is kept for adapter pushes.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        settings: EngineSettings,
        *,
        copy_model: bool = True,
        kv_cache: bool = True,
        record_routing: bool = False,
        lora_adapter: bool = True,
    ) -> None:
        self._merger: AdapterMerger | None = None
        if copy_model and has_lora(model):
            self.model = merged_copy(model)
            if lora_adapter:  # adapter pushes will come: keep the base to merge them onto
                self._merger = AdapterMerger(model, next(model.parameters()).device)
        elif copy_model:
            self.model = copy.deepcopy(model)
        else:
            self.model = model
        if copy_model:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_seq_len = settings.max_seq_len
        self.temperature = settings.temperature
        self.top_p = settings.top_p
        self.max_concurrent = settings.max_concurrent
        self.version = settings.version
        self.kv_cache = kv_cache
        self.device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(settings.seed)
        self._queue: deque[GenerationRequest] = deque()
        self._running: list[_Running] = []
        self._lock = threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: tuple[dict[str, torch.Tensor], int] | None = None
        self._keys = set(self.model.state_dict())
        # Rows with a cache live in slots 0..n-1 of `_kv`; `_slot_rows[s]` is the row in slot s.
        self._kv = SlotCache(settings.max_concurrent, self.device)
        self._slot_rows: list[_Running] = []
        # sdpa and eager attention take a ready 4-D mask; other kernels get the 2-D one.
        attn = getattr(self.model.config, "_attn_implementation", None)
        self._additive_mask = self.model.dtype if attn in ("sdpa", "eager") else None
        params = inspect.signature(self.model.base_model.forward).parameters
        self._cache_kwarg = "cache" if "cache" in params else "past_key_values"
        self.tokens_generated = 0
        self._routing = RoutingRecorder(self.model) if record_routing else None

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        check_fits(request, self.max_seq_len)
        with self._lock:
            self._queue.append(request)

    def num_unfinished(self) -> int:
        return len(self._queue) + len(self._running)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        return run_to_completion(self, requests)

    def abort_all(self) -> list[Completion]:
        """Stop every queued and running request; running ones return as `aborted`."""
        with self._lock:
            out = abort_running(self._running)
            self._running.clear()
            self._queue.clear()
            self._drop_cache()
        return out

    def close(self) -> None:
        """Nothing to release but the routing hooks: the model and its cache go with it."""
        if self._routing is not None:
            self._routing.close()

    def rng_state(self) -> torch.Tensor:
        return self.generator.get_state()

    def set_rng_state(self, state: torch.Tensor) -> None:
        self.generator.set_state(state)

    # -- weights ----------------------------------------------------------------------------
    def update_weights(self, state: dict[str, Any], version: int) -> None:
        """Queue `state` to load at the next step boundary; returns without waiting for a step.

        `state` holds the engine's plain keys (full or merged weights), or, for an engine built
        from a LoRA policy, its LoRA layout: every adapter tensor, alone or with the rest of the
        unmerged state. The tensors are copied here, so the caller may go on changing its own in
        place. A newer update is laid over one still queued (the newest value of each tensor
        wins, and the base weights a queued full push brings are kept); an older one arriving
        late only fills what the queued one lacks.
        """
        self._check_keys(state)
        with torch.no_grad():
            snapshot = {k: v.detach().clone() for k, v in state.items()}
        with self._pending_lock:
            if self._pending is None:
                self._pending = (snapshot, version)
            elif version >= self._pending[1]:
                self._pending = ({**self._pending[0], **snapshot}, version)
            else:
                self._pending = ({**snapshot, **self._pending[0]}, self._pending[1])

    def _check_keys(self, state: dict[str, Any]) -> None:
        adapters = {k for k in state if is_adapter_key(k)}
        rest = {k.replace(".base_layer.", ".") for k in state if k not in adapters}
        if adapters and self._merger is None:
            raise ValueError(
                "weight update: LoRA adapters pushed to an engine built from a model without "
                f"them ({sorted(adapters)[:2]})"
            )
        if adapters and adapters != self._merger.adapter_keys:  # type: ignore[union-attr]
            raise ValueError("weight update: the pushed adapters are not the engine's")
        unexpected = sorted(rest - self._keys)
        missing = sorted(k for k in self._keys - rest if not k.endswith("lm_head.weight"))
        if unexpected or (missing and not (adapters and not rest)):  # adapters alone: no base
            raise ValueError(
                f"weight update does not match the engine's model: missing={missing[:5]}, "
                f"unexpected={unexpected[:5]}"
            )

    def _apply_pending_weights(self) -> None:
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        state = pending[0]
        with torch.no_grad():
            if self._merger is not None and any(is_adapter_key(k) for k in state):
                state = self._merger.merge(state)  # LoRA layout -> the plain model's tensors
            self.model.load_state_dict(state, strict=False)
        self.version = pending[1]
        self._drop_cache()  # keys/values of the old weights: re-prefill under the new ones

    # -- decoding ---------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        with self._lock:
            self._apply_pending_weights()
            while self._queue and len(self._running) < self.max_concurrent:
                req = self._queue.popleft()
                self._running.append(_Running(req, token_budget(req, self.max_seq_len)))
            if not self._running:
                return []
            with torch.inference_mode():
                logits = self._logits_cached() if self.kv_cache else self._logits_reencode()
                return self._sample_and_retire(logits)

    def _logits_reencode(self) -> torch.Tensor:
        """Next-token logits of every running row, re-encoding whole sequences (reference)."""
        seqs = [r.ids() for r in self._running]
        B = len(seqs)
        T = max(len(s) for s in seqs)
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        attn = torch.zeros((B, T), dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
            attn[i, : len(s)] = 1
        last = torch.tensor([len(s) - 1 for s in seqs])
        ids, attn, last = (self._up(x) for x in (ids, attn, last))
        hidden = self.model.base_model(
            input_ids=ids, attention_mask=attn, use_cache=False
        ).last_hidden_state
        if self._routing is not None:
            routing = self._routing.take(B, T)
            for i, (r, s) in enumerate(zip(self._running, seqs, strict=True)):
                r.routing = [routing[i, : len(s)]]
        return self._head(hidden[torch.arange(B, device=self.device), last])

    def _logits_cached(self) -> torch.Tensor:
        """Next-token logits of every running row: one decode forward over the cached rows,
        prefill forwards over the rows without a cache (joined, or after a weight update).
        All come out in slot order; a permutation puts them in `_running` order."""
        parts = []
        if self._kv.n:
            parts.append(self._decode())
        new = [r for r in self._running if r.slot < 0]
        # Grouped by length (`saorl.engines.prefill_plan`), longest first: one padded forward
        # per group, each group's rows taking the next slots, so logits stay in slot order.
        for group in plan_prefill([len(r.request.prompt_ids) + len(r.tokens) for r in new]):
            parts.append(self._prefill([new[i] for i in group]))
        logits = torch.cat(parts) if len(parts) > 1 else parts[0]
        perm = [r.slot for r in self._running]
        if perm != list(range(len(perm))):
            logits = logits[self._up(torch.tensor(perm))]
        return logits

    def _decode(self) -> torch.Tensor:
        kv = self._kv
        ids = self._up(torch.tensor([[r.tokens[-1]] for r in self._slot_rows]))
        cache, mask, pos = kv.decode_inputs(self._additive_mask)
        hidden = self._forward(ids, mask, pos, cache)
        kv.advance()
        if self._routing is not None:
            routing = self._routing.take(len(self._slot_rows), 1)
            for r, chunk in zip(self._slot_rows, routing, strict=True):
                r.routing.append(chunk)
        return self._head(hidden[:, -1])

    def _prefill(self, rows: list[_Running]) -> torch.Tensor:
        """Run `rows` (no cache yet) in one forward, copy their keys/values into the next slots
        and return their next-token logits.

        Right padding and no attention mask: under causal attention no real token sees the pads
        after it, so the model runs its plain causal kernel (sdpa's `is_causal`); a padding
        mask would have transformers build a `rows x width x width` mask (on CPU as costly as
        the attention itself) and the kernel apply it. The cache wants each row right-aligned,
        so each row's keys/values are rotated right by its padding."""
        seqs = [r.ids() for r in rows]
        lens = torch.tensor([len(s) for s in seqs])
        N = len(seqs)
        T = max(len(s) for s in seqs)
        ids = torch.full((N, T), self.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        pos = torch.arange(T).repeat(N, 1)
        ids, pos, last = (self._up(x) for x in (ids, pos, lens - 1))
        cache = DynamicCache()
        hidden = self._forward(ids, None, pos, cache)
        if self._routing is not None:
            routing = self._routing.take(N, T)
            for i, (r, s) in enumerate(zip(rows, seqs, strict=True)):
                r.routing = [routing[i, : len(s)]]
        if int(lens.min()) < T:
            # Column j of row i takes column (j - pad_i) mod T: its tokens end at column T-1.
            src = self._up((torch.arange(T)[None, :] - (T - lens)[:, None]) % T)
            for layer in cache.layers:
                at = src[:, None, :, None].expand_as(layer.keys)
                layer.keys, layer.values = layer.keys.gather(2, at), layer.values.gather(2, at)
        for r in rows:
            r.slot = len(self._slot_rows)
            self._slot_rows.append(r)
        self._kv.add_rows(cache, lens.tolist())
        return self._head(hidden[torch.arange(N, device=self.device), last])

    def _forward(
        self, ids: torch.Tensor, mask: torch.Tensor | None, pos: torch.Tensor, cache: Any
    ) -> torch.Tensor:
        out = self.model.base_model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{self._cache_kwarg: cache},
        )
        return out.last_hidden_state

    def _up(self, x: torch.Tensor) -> torch.Tensor:
        # Non-blocking: a blocking host-to-device copy waits for the device's queue to drain.
        # Safe from pageable memory (the driver stages the source before returning).
        return x.to(self.device, non_blocking=True)

    def _head(self, last_hidden: torch.Tensor) -> torch.Tensor:
        return self.model.get_output_embeddings()(last_hidden).float()

    # -- the cache ----------------------------------------------------------------------------
    def _drop_cache(self) -> None:
        self._kv.clear()
        self._slot_rows = []
        for r in self._running:
            r.slot = -1

    def _retire_slots(self, slots: list[int]) -> None:
        """Free the slots of finished rows; the last live row moves into each freed slot."""
        for slot in sorted(slots, reverse=True):
            moved = self._kv.remove(slot)
            last = self._slot_rows.pop()
            if moved:
                self._slot_rows[slot] = last
                last.slot = slot

    # -- sampling -----------------------------------------------------------------------------
    def _sample_and_retire(self, logits: torch.Tensor) -> list[Completion]:
        blocked = self._eos_blocked()
        next_ids, next_logp = self._sample(logits, blocked)
        greedy = [r.request.greedy for r in self._running]
        if any(greedy):
            g_logits = logits
            if any(blocked) and self.eos_id is not None:
                rows = self._up(torch.tensor(blocked))
                g_logits = logits.clone()
                g_logits[:, self.eos_id] = logits[:, self.eos_id].masked_fill(rows, -torch.inf)
            g_ids = g_logits.argmax(-1)
            # Recorded log-probs are always of softmax(logits / T), greedy or not
            # (docs/design.md section 1).
            g_logp = torch.log_softmax(logits / self.temperature, -1)
            g_logp = g_logp.gather(-1, g_ids[:, None]).squeeze(-1)
            flags = self._up(torch.tensor(greedy))
            next_ids = torch.where(flags, g_ids, next_ids)
            next_logp = torch.where(flags, g_logp, next_logp)
        # The step's one device-to-host transfer: ids and log-probs together.
        host = torch.stack([next_ids.to(next_logp.dtype), next_logp]).cpu()
        ids_l = [int(x) for x in host[0].tolist()]
        logp_l = host[1].tolist()
        self.tokens_generated += len(ids_l)

        finished: list[Completion] = []
        still: list[_Running] = []
        done_slots: list[int] = []
        for r, tok, lp in zip(self._running, ids_l, logp_l, strict=True):
            r.add(tok, lp, self.version)
            reason = self._finish_reason(r, tok)
            if reason is None:
                still.append(r)
            else:
                if r.slot >= 0:
                    done_slots.append(r.slot)
                finished.append(r.completion(reason))
        self._running = still
        if done_slots:
            self._retire_slots(done_slots)
        return finished

    def _eos_blocked(self) -> list[bool]:
        return [len(r.tokens) < r.request.min_new_tokens for r in self._running]

    def _sample(
        self, logits: torch.Tensor, eos_blocked: list[bool] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample from softmax(logits/T), top-p truncated and EOS masked in rows that have not
        reached `min_new_tokens`; return ids and the log-probs of the untruncated,
        unmasked softmax(logits/T) (truncation is not applied to recorded log-probs)."""
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        probs = logp.exp()
        if eos_blocked and any(eos_blocked) and self.eos_id is not None:
            rows = self._up(torch.tensor(eos_blocked))
            probs[:, self.eos_id] = torch.where(rows, 0.0, probs[:, self.eos_id])
            probs = probs / probs.sum(-1, keepdim=True)
        if self.top_p < 1.0:
            sorted_p, order = probs.sort(dim=-1, descending=True)
            # Keep the smallest prefix whose mass reaches top_p (always at least one token).
            keep = (sorted_p.cumsum(-1) - sorted_p) < self.top_p
            sorted_p = sorted_p * keep
            probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        ids = torch.multinomial(probs, 1, generator=self.generator).squeeze(-1)
        return ids, logp.gather(-1, ids[:, None]).squeeze(-1)

    def _finish_reason(self, r: _Running, tok: int) -> str | None:
        if tok == self.eos_id:
            return "eos"
        if r.request.stop:
            # A stop string can end inside a multi-character token: look for one that appears
            # in the decoded tail now but did not before this token was added.
            tail = self.tokenizer.decode(r.tokens[-32:])
            before = self.tokenizer.decode(r.tokens[-32:-1])
            if any(s in tail and s not in before for s in r.request.stop):
                return "stop"
        if len(r.tokens) >= r.budget:
            return "length"
        return None
