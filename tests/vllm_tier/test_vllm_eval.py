"""`saorl eval` with `rollout.engine=vllm` samples with vLLM (needs vLLM)."""

from __future__ import annotations

from tests.vllm_tier._marks import VLLM_TIER

pytestmark = VLLM_TIER

MODEL = [
    "model.hidden_size=64",
    "model.num_heads=2",
    "model.num_kv_heads=1",
    "model.intermediate_size=128",
    "model.max_seq_len=48",
]
ENGINE = [
    "rollout.engine=vllm",
    "rollout.vllm_enforce_eager=true",
    "rollout.vllm_kv_cache_gib=0.0625",
    "rollout.max_concurrent=8",
]


def test_saorl_eval_with_the_vllm_engine(monkeypatch):
    from saorl import api
    from saorl.engines.vllm import VLLMEngine

    built = []
    from_policy = VLLMEngine.from_policy.__func__

    def counted(cls, *args, **kwargs):
        engine = from_policy(cls, *args, **kwargs)
        built.append(engine)
        return engine

    monkeypatch.setattr(VLLMEngine, "from_policy", classmethod(counted))
    summary = api.evaluate(
        "builtin:tiny",
        overrides=[*MODEL, *ENGINE, "env.eval_size=4", "rollout.max_new_tokens=4"],
        k=2,
    )
    assert len(built) == 1  # the episodes came from a vLLM engine
    assert summary["problems"] == 4 and summary["k"] == 2
    assert 0.0 <= summary["avg@2"] <= 1.0
