"""What both engines keep per request: the prompt checked against the context, the token budget,
and the tokens, log-probs and policy versions sampled so far, turned into a `Completion`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from saorl.engines.protocol import Completion, GenerationRequest


def check_fits(request: GenerationRequest, max_seq_len: int) -> None:
    """A prompt must leave room for one new token in the context (`model.max_seq_len`)."""
    if len(request.prompt_ids) >= max_seq_len:
        raise ValueError(
            f"prompt of {len(request.prompt_ids)} tokens does not fit the context of "
            f"{max_seq_len} tokens (model.max_seq_len)"
        )


def token_budget(request: GenerationRequest, max_seq_len: int) -> int:
    """New tokens a request may sample: its own limit, clamped to what the context has left."""
    return min(request.max_new_tokens, max_seq_len - len(request.prompt_ids))


@dataclass
class Running:
    """A request being decoded. `routing` holds what the engine recorded of the MoE routing,
    in the engine's own form (`routing_of` turns it into the completion's tensor)."""

    request: GenerationRequest
    budget: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    routing: list[Any] = field(default_factory=list)

    def ids(self) -> list[int]:
        return self.request.prompt_ids + self.tokens

    def add(self, token_id: int, logprob: float, version: int) -> None:
        """Append one sampled token (the in-process engine's per-token path)."""
        self.tokens.append(token_id)
        self.logprobs.append(logprob)
        self.versions.append(version)

    def absorb(self, token_ids: Sequence[int], logprobs: Sequence[float], version: int) -> None:
        """Append sampled tokens; all of them were sampled under `version`."""
        self.tokens.extend(int(t) for t in token_ids)
        self.logprobs.extend(logprobs)
        self.versions.extend([version] * len(token_ids))

    def routing_of(self) -> torch.Tensor | None:
        """The routing for the completion; the in-process engine's chunks are tensors."""
        return torch.cat(self.routing).cpu() if self.routing else None

    def completion(self, reason: str) -> Completion:
        return Completion(
            self.request,
            self.tokens,
            self.logprobs,
            self.versions,
            reason,  # type: ignore[arg-type]
            routing=self.routing_of(),
        )


def abort_running(running: Sequence[Running]) -> list[Completion]:
    """Every running request as an `aborted` completion with the tokens it has."""
    return [r.completion("aborted") for r in running]
