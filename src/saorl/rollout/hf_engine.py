"""In-process rollout engine over a Hugging Face causal LM, with continuous batching.

Each decoding step runs the model once over the running sequences (right-padded), samples one
token per sequence, and retires those that finished (EOS, a stop string, or their token budget);
queued requests join at the next step. A long rollout therefore never holds the others back.

Departure from a production engine, on purpose: there is no KV cache, every step re-encodes the
running sequences. For the short sequences of the CPU demo this costs little and keeps joining
and leaving the batch trivial; the vLLM engine is the one for long sequences on GPUs.

Weight updates (`update_weights`) are applied under the same lock as a decoding step, so they
take effect between two steps; every sampled token records the version it was sampled under.
"""

from __future__ import annotations

import copy
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from saorl.rollout.engine import Completion, GenerationRequest


@dataclass
class _Running:
    request: GenerationRequest
    budget: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)


class HFEngine:
    """Continuous-batching sampler over an HF causal LM.

    By default the engine owns a private copy of `model` (the learner trains its own); pass
    `copy_model=False` to sample from `model` itself, e.g. for evaluation in the learner thread.
    """

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Any,
        *,
        max_seq_len: int,
        temperature: float = 1.0,
        top_p: float = 1.0,
        max_concurrent: int = 64,
        seed: int = 0,
        version: int = 0,
        copy_model: bool = True,
    ) -> None:
        self.model = copy.deepcopy(model) if copy_model else model
        if copy_model:
            self.model.eval()
            for p in self.model.parameters():
                p.requires_grad_(False)
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.max_seq_len = max_seq_len
        self.temperature = temperature
        self.top_p = top_p
        self.max_concurrent = max_concurrent
        self.version = version
        self.device = next(self.model.parameters()).device
        self.generator = torch.Generator(device=self.device).manual_seed(seed)
        self._queue: deque[GenerationRequest] = deque()
        self._running: list[_Running] = []
        self._lock = threading.Lock()
        self.tokens_generated = 0

    # -- requests ---------------------------------------------------------------------------
    def add_request(self, request: GenerationRequest) -> None:
        if len(request.prompt_ids) >= self.max_seq_len:
            raise ValueError(
                f"prompt of {len(request.prompt_ids)} tokens does not fit the context of "
                f"{self.max_seq_len} tokens (model.max_seq_len)"
            )
        with self._lock:
            self._queue.append(request)

    def num_unfinished(self) -> int:
        return len(self._queue) + len(self._running)

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        order = {id(r): i for i, r in enumerate(requests)}
        for r in requests:
            self.add_request(r)
        done: list[Completion] = []
        while self.num_unfinished():
            done.extend(self.step())
        return sorted(done, key=lambda c: order.get(id(c.request), 0))

    def abort_all(self) -> list[Completion]:
        """Stop every queued and running request; running ones return as `aborted`."""
        with self._lock:
            out = [
                Completion(r.request, r.tokens, r.logprobs, r.versions, "aborted")
                for r in self._running
            ]
            self._running.clear()
            self._queue.clear()
        return out

    # -- weights ----------------------------------------------------------------------------
    def update_weights(self, state: dict[str, Any], version: int) -> None:
        with self._lock, torch.no_grad():
            missing, unexpected = self.model.load_state_dict(state, strict=False)
            if unexpected or any(not k.endswith("lm_head.weight") for k in missing):
                raise ValueError(
                    f"weight update does not match the engine's model: missing={missing[:5]}, "
                    f"unexpected={unexpected[:5]}"
                )
            self.version = version

    # -- decoding ---------------------------------------------------------------------------
    def step(self) -> list[Completion]:
        with self._lock:
            while self._queue and len(self._running) < self.max_concurrent:
                req = self._queue.popleft()
                budget = min(req.max_new_tokens, self.max_seq_len - len(req.prompt_ids))
                self._running.append(_Running(req, budget))
            if not self._running:
                return []
            return self._decode_one()

    @torch.inference_mode()
    def _decode_one(self) -> list[Completion]:
        seqs = [r.request.prompt_ids + r.tokens for r in self._running]
        lengths = torch.tensor([len(s) for s in seqs], device=self.device)
        B, T = len(seqs), int(lengths.max())
        ids = torch.full((B, T), self.pad_id, dtype=torch.long)
        for i, s in enumerate(seqs):
            ids[i, : len(s)] = torch.tensor(s)
        ids = ids.to(self.device)
        attn = (torch.arange(T, device=self.device)[None, :] < lengths[:, None]).long()
        hidden = self.model.base_model(input_ids=ids, attention_mask=attn).last_hidden_state
        last = hidden[torch.arange(B, device=self.device), lengths - 1]
        logits = self.model.get_output_embeddings()(last).float()
        next_ids, next_logp = self._sample(logits)
        greedy = torch.tensor([r.request.greedy for r in self._running], device=self.device)
        if greedy.any():
            g_ids = logits.argmax(-1)
            # Recorded log-probs are always of softmax(logits / T), greedy or not (DESIGN 1).
            g_logp = torch.log_softmax(logits / self.temperature, -1)
            g_logp = g_logp.gather(-1, g_ids[:, None]).squeeze(-1)
            next_ids = torch.where(greedy, g_ids, next_ids)
            next_logp = torch.where(greedy, g_logp, next_logp)
        ids_l, logp_l = next_ids.tolist(), next_logp.tolist()
        self.tokens_generated += B

        finished: list[Completion] = []
        still: list[_Running] = []
        for r, tok, lp in zip(self._running, ids_l, logp_l, strict=True):
            r.tokens.append(tok)
            r.logprobs.append(lp)
            r.versions.append(self.version)
            reason = self._finish_reason(r, tok)
            if reason is None:
                still.append(r)
            else:
                finished.append(Completion(r.request, r.tokens, r.logprobs, r.versions, reason))
        self._running = still
        return finished

    def _sample(self, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample from softmax(logits/T), top-p truncated; return ids and untruncated log-probs."""
        logp = torch.log_softmax(logits / self.temperature, dim=-1)
        probs = logp.exp()
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
