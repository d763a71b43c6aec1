"""LoRA weight pushes that move only the adapter (`model.lora_push = "adapter"`, the default).

Tiny random-init Qwen3, real learner steps, the real HF engine: after an adapter-only push the
engine holds exactly the weights a merged push would have given it (its base never re-sent), so
its log-probs are those of the learner's merged model; a whole unmerged push (what a new Ray
rollout actor gets first) replaces the base the engine was built with; the loop logs
`perf/push_bytes` and `perf/push_s` with every push, and adapter-only bytes are the adapter's
parameters, not the model's.
"""

from __future__ import annotations

import pytest
import torch

from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import is_adapter_key, merged_copy, state_bytes
from tests.conftest import tiny_config
from tests.faults._common import metric_rows
from tests.integration.test_learner import _batch

LORA = ("model.lora_rank=4", "model.lora_alpha=8", "critic.warmup_steps=0", "learner.lr=0.01")


def _learner(*overrides: str, seed: int = 0) -> Learner:
    cfg = tiny_config(*LORA, *overrides)
    torch.manual_seed(seed)
    policy, _ = load_policy(cfg.model)
    return Learner(cfg, policy, torch.device("cpu"))


def _plain_numel(policy: torch.nn.Module) -> int:
    """Numbers in the plain model's state dict: what a merged push sends (a tied output head
    is in it under its own name, as the engines load it)."""
    return sum(v.numel() for v in merged_copy(policy).state_dict().values())


def _engine_weights(engine: HFEngine) -> dict[str, torch.Tensor]:
    engine.step()  # idle: loads the queued push
    return {k: v.clone() for k, v in engine.model.state_dict().items()}


def _generate_and_compare(engine: HFEngine, model: torch.nn.Module, tok, version: int) -> None:
    reqs = [
        GenerationRequest(prompt_ids=tok.encode(f"{i}+{i}="), max_new_tokens=6) for i in range(6)
    ]
    for c in engine.generate(reqs):
        ids = torch.tensor([c.request.prompt_ids + c.token_ids])
        with torch.no_grad():
            lp = sequence_logprobs(model, ids, torch.ones_like(ids))
        got = torch.tensor(c.logprobs)
        torch.testing.assert_close(got, lp[0, len(c.request.prompt_ids) :], atol=2e-5, rtol=0)
        assert c.versions == [version] * len(c.token_ids)


def test_an_adapter_push_gives_the_engine_the_merged_weights_bit_for_bit():
    learner = _learner()
    _, tok = load_policy(learner.cfg.model)
    engine = HFEngine(
        learner.policy, tok, EngineSettings(max_seq_len=32, seed=1)
    )  # copies the base once
    start = _engine_weights(engine)
    batch = _batch(learner.policy)
    for _ in range(3):
        learner.step(batch)
    pushed = learner.push_state()
    assert pushed and all(is_adapter_key(k) for k in pushed)  # no base weight travels
    engine.update_weights(pushed, version=3)
    got = _engine_weights(engine)
    merged = learner.policy_state()  # what a merged push would have sent
    assert got.keys() == merged.keys()
    for k, v in got.items():
        assert torch.equal(v, merged[k]), k  # merged in the engine == merged on the learner
    assert any(not torch.equal(start[k], got[k]) for k in got)  # and the adapters moved it
    # The engine's log-probs are the learner's merged model's (and so the learner's own).
    _generate_and_compare(engine, merged_copy(learner.policy), tok, version=3)
    _generate_and_compare(engine, learner.policy, tok, version=3)


def test_a_whole_unmerged_push_replaces_the_base_and_later_adapters_merge_onto_it():
    """A Ray rollout actor builds its engine from its own seeded policy, then gets the
    learner's whole unmerged state once (a warm-up or a resume may have moved the base), then
    adapters; a newer adapter push laid over a still-queued whole push keeps its base."""
    learner = _learner()
    other = _learner(seed=1)  # another base: what the actor's engine starts from
    _, tok = load_policy(learner.cfg.model)
    engine = HFEngine(other.policy, tok, EngineSettings(max_seq_len=32, seed=1))
    batch = _batch(learner.policy)
    learner.step(batch)
    full = learner.push_state(full=True)
    assert any(".base_layer." in k for k in full) and any(is_adapter_key(k) for k in full)
    engine.update_weights(full, version=1)
    for _ in range(2):
        learner.step(batch)
    engine.update_weights(learner.push_state(), version=3)  # queued over the whole push
    got = _engine_weights(engine)
    for k, v in learner.policy_state().items():
        assert torch.equal(got[k], v), k
    assert engine.version == 3
    learner.step(batch)
    engine.update_weights(learner.push_state(), version=4)  # onto the base it was given
    got = _engine_weights(engine)
    for k, v in learner.policy_state().items():
        assert torch.equal(got[k], v), k
    _generate_and_compare(engine, learner.policy, tok, version=4)


def test_adapter_pushes_are_checked():
    learner = _learner()
    _, tok = load_policy(learner.cfg.model)
    engine = HFEngine(learner.policy, tok, EngineSettings(max_seq_len=32, seed=1))
    adapters = learner.push_state()
    with pytest.raises(ValueError, match="not the engine's"):
        engine.update_weights(dict(list(adapters.items())[1:]), version=1)
    plain = HFEngine(merged_copy(learner.policy), tok, EngineSettings(max_seq_len=32, seed=1))
    with pytest.raises(ValueError, match="without them"):
        plain.update_weights(adapters, version=1)


def test_push_bytes_are_the_adapters_against_the_whole_model():
    learner = _learner()
    policy = learner.policy
    adapter_params = sum(p.numel() for n, p in policy.named_parameters() if ".lora_" in n)
    plain_params = _plain_numel(policy)
    assert state_bytes(learner.push_state()) == 4 * adapter_params  # float32
    assert state_bytes(learner.policy_state()) == 4 * plain_params
    merged = _learner("model.lora_push=merged")
    assert state_bytes(merged.push_state()) == 4 * plain_params
    assert not any(is_adapter_key(k) for k in merged.push_state())


@pytest.mark.parametrize("concurrency", ["sync", "threads"])
def test_every_push_logs_its_bytes_and_seconds(tmp_path, concurrency):
    """Two runs, adapter-only and merged pushes of the same LoRA model: every step pushes
    (`push_every = 1`) and its row says how many bytes and seconds; the adapter's bytes are
    its parameters' share of the model's."""
    common = (
        *LORA,
        f"run.output_dir={tmp_path}",
        "run.total_steps=2",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        f"run.concurrency={concurrency}",
    )
    rows = {}
    for how in ("adapter", "merged"):
        train_from_config(tiny_config(*common, f"run.name={how}", f"model.lora_push={how}"))
        rows[how] = [r for r in metric_rows(tmp_path / how) if "loss/value" in r]
        assert [r["step"] for r in rows[how]] == [1, 2]
        assert all(r["perf/push_s"] >= 0 for r in rows[how])
    learner = _learner()
    adapter_params = sum(p.numel() for n, p in learner.policy.named_parameters() if ".lora_" in n)
    plain_params = _plain_numel(learner.policy)
    assert {r["perf/push_bytes"] for r in rows["adapter"]} == {4 * adapter_params}
    assert {r["perf/push_bytes"] for r in rows["merged"]} == {4 * plain_params}
    assert adapter_params / plain_params < 0.2
    # Either way the engines sampled from the learner's weights.
    for how in rows:
        diffs = [r["mismatch/max_abs_logprob_diff"] for r in rows[how]]
        measured = [d for d in diffs if d is not None]  # (None: no fresh tokens that step)
        assert measured and all(d < 1e-4 for d in measured), (how, diffs)


def test_full_fine_tuning_pushes_log_the_whole_model(tmp_path):
    cfg = tiny_config(
        f"run.output_dir={tmp_path}",
        "run.total_steps=2",
        "run.eval_every=0",
        "run.checkpoint_every=0",
        "critic.warmup_steps=0",
    )
    train_from_config(cfg)
    rows = [r for r in metric_rows(tmp_path / "default") if "loss/value" in r]
    torch.manual_seed(0)
    params = sum(v.numel() for v in load_policy(cfg.model)[0].state_dict().values())
    assert [r["perf/push_bytes"] for r in rows] == [4 * params, 4 * params]
