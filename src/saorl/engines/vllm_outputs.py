"""What the vLLM engine reads from vLLM's outputs: which log-probs vLLM records, sampled
log-probs, finish reasons, stop strings (`saorl.engines.vllm` says how the engine is
wired)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def sampled_logprobs(token_ids: Sequence[int], positions: Sequence[Any]) -> list[float]:
    """The log-prob of each sampled token from vLLM's per-position `{token_id: Logprob}` maps.

    With `SamplingParams(logprobs=0)` each position holds the sampled token (and nothing else).
    """
    if len(positions) != len(token_ids):
        raise RuntimeError(
            f"vLLM returned {len(positions)} log-probs for {len(token_ids)} tokens; "
            "SamplingParams(logprobs=0) should give one per token"
        )
    return [float(pos[tok].logprob) for pos, tok in zip(positions, token_ids, strict=True)]


def finish_reason(vllm_reason: str | None, last_token: int | None, eos_id: int | None) -> str:
    """Map vLLM's `finish_reason` ('stop', 'length', 'abort') to the engine protocol's."""
    if vllm_reason == "length":
        return "length"
    if vllm_reason == "abort":
        return "aborted"
    if vllm_reason == "stop" and last_token is not None and last_token == eos_id:
        return "eos"
    if vllm_reason == "stop":
        return "stop"
    raise RuntimeError(f"vLLM finished a request with an unknown reason {vllm_reason!r}")


def stop_string_hit(tokenizer: Any, tokens: list[int], stop: list[str]) -> bool:
    """Whether the last token completed one of `stop` (the HF engine's rule).

    A stop string can end inside a multi-character token: look for one that appears in the
    decoded tail now but did not before the last token was added.
    """
    if not stop or not tokens:
        return False
    tail = tokenizer.decode(tokens[-32:])
    before = tokenizer.decode(tokens[-32:-1])
    return any(s in tail and s not in before for s in stop)


def choose_logprobs_mode(temperature: float, top_p: float) -> str:
    """The vLLM `logprobs_mode` whose recorded value is `log softmax(logits / T)[token]`.

    vLLM's sampler records either `raw_logprobs`, `log softmax(logits)` before temperature and
    truncation, or `processed_logprobs`, the log-softmax of the logits after temperature and
    top-k/top-p (truncated tokens at -inf, so the kept ones are renormalised). So:
    top_p = 1 -> `processed_logprobs` (temperature applied, nothing truncated); T = 1 ->
    `raw_logprobs` (nothing to apply). With T != 1 and top_p < 1 neither equals it.
    Greedy requests take vLLM's greedy path, which records `log softmax(logits)` (T = 1) in both
    modes; greedy decoding serves evaluation only, whose log-probs are never trained on.
    """
    if top_p >= 1.0:
        return "processed_logprobs"
    if temperature == 1.0:
        return "raw_logprobs"
    raise ValueError(
        f"rollout.engine = 'vllm' cannot record log-probs of softmax(logits / T) with "
        f"rollout.temperature={temperature} and rollout.top_p={top_p}: vLLM records them either "
        "before temperature or after top-p truncation. Set rollout.top_p = 1 or "
        "rollout.temperature = 1 (or use rollout.engine = 'hf')"
    )
