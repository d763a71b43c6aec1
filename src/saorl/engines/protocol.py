"""The engine interface every rollout backend implements (in-process HF, vLLM).

Engines are token in, token out: a request carries prompt token ids and a completion returns the
sampled token ids, the log-prob of each under the sampling distribution `softmax(logits / T)`
(before top-p truncation, docs/design.md section 1) and the policy version that sampled each token.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

if TYPE_CHECKING:
    import torch

FinishReason = Literal["eos", "stop", "length", "aborted"]


@dataclass(frozen=True)
class EngineSettings:
    """What every engine is built with, whatever its backend (`build_engine` fills it from
    `model.max_seq_len` and `[rollout]`)."""

    max_seq_len: int  # the context: prompt + completion tokens
    temperature: float = 1.0  # the sampling distribution softmax(logits / T)
    top_p: float = 1.0
    max_concurrent: int = 64  # sequences decoded together
    seed: int = 0  # the sampler's seed; each request's is derived from it
    version: int = 0  # the policy version of the weights the engine starts with


@dataclass
class GenerationRequest:
    """One prompt to continue. `max_new_tokens` is clamped to the model's context by the engine."""

    prompt_ids: list[int]
    max_new_tokens: int
    request_id: int = 0
    greedy: bool = False
    stop: list[str] = field(default_factory=list)
    # EOS is not sampled before this many new tokens (recorded log-probs stay those of the
    # unmasked softmax(logits / T)); benchmarks force exact lengths with min = max_new_tokens.
    min_new_tokens: int = 0
    payload: Any = None  # carried through untouched (the task, for the caller)


@dataclass
class Completion:
    request: GenerationRequest
    token_ids: list[int]
    logprobs: list[float]
    versions: list[int]
    finish_reason: FinishReason
    # MoE routing the engine recorded (`saorl.models.routing`): (prompt + tokens fed, moe
    # layers, top_k) on the CPU, or None when the engine does not record it.
    routing: torch.Tensor | None = None


class Engine(Protocol):
    """What the rollout side needs from a generation backend."""

    version: int  # the policy version that samples the next token
    max_concurrent: int  # sequences decoded together; a rollout worker keeps this many going
    tokens_generated: int  # tokens sampled since the engine was built

    def add_request(self, request: GenerationRequest) -> None:
        """Queue a request; it joins the running batch at the next decoding step."""

    def step(self) -> list[Completion]:
        """Run one decoding step over the running batch; return the sequences that finished."""

    def num_unfinished(self) -> int:
        """Requests queued or running."""

    def generate(self, requests: list[GenerationRequest]) -> list[Completion]:
        """Run requests to completion; results in request order."""

    def abort_all(self) -> list[Completion]:
        """Stop every request; running ones return as `aborted` with the tokens they have."""

    def update_weights(self, state: dict[str, Any], version: int) -> None:
        """Load new policy weights; takes effect between decoding steps (partial rollouts)."""

    def rng_state(self) -> torch.Tensor | None:
        """The sampling RNG's state for a checkpoint; None if the engine cannot restore one."""

    def set_rng_state(self, state: torch.Tensor) -> None:
        """Continue the random stream `rng_state` recorded."""

    def close(self) -> None:
        """Release what the engine holds (processes, temporary files); unusable after."""


def run_to_completion(engine: Engine, requests: list[GenerationRequest]) -> list[Completion]:
    """`Engine.generate` for engines that have `add_request`/`step`: results in request order."""
    order = {id(r): i for i, r in enumerate(requests)}
    for r in requests:
        engine.add_request(r)
    done: list[Completion] = []
    while engine.num_unfinished():
        done.extend(engine.step())
    return sorted(done, key=lambda c: order.get(id(c.request), 0))
