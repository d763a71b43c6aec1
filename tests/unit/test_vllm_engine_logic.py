"""The vLLM engine's own logic, without vLLM: a stand-in `LLMEngine` replays scripted steps.

What is checked here is everything `VLLMEngine` adds on top of vLLM: the mapping of vLLM's
delta outputs to `Completion`s, per-token version bookkeeping across weight updates, stop strings,
aborts, budgets, seeds and the choice of log-prob mode. `tests/vllm_tier/` runs the real thing.
"""

from __future__ import annotations

import importlib.util
from types import SimpleNamespace

import pytest
import torch

from saorl.config import ConfigError
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.engines.vllm import (
    VLLMEngine,
    choose_logprobs_mode,
    executor_args,
    finish_reason,
    request_seed,
    sampled_logprobs,
    stop_string_hit,
)
from saorl.models.tokenizer import build_char_tokenizer
from tests.conftest import tiny_config

TOK = build_char_tokenizer()
EOS = TOK.eos_token_id


def _lp(tok: int, value: float) -> dict:
    return {tok: SimpleNamespace(logprob=value)}


class FakeLLM:
    """Each step emits one token per running request: `script[request_id]` in order.

    Log-prob of the k-th token of a request is `-(k + 1) / 10`; a request finishes with vLLM's
    reason 'stop' after EOS, 'length' at its `max_tokens`.
    """

    def __init__(self, script: dict[str, list[int]]) -> None:
        self.script = script
        self.running: dict[str, dict] = {}
        self.calls: list[tuple] = []
        self.engine_core = SimpleNamespace(shutdown=lambda: self.calls.append(("shutdown",)))

    def add_request(self, rid: str, prompt: list[int], params: dict) -> None:
        self.running[rid] = {"n": 0, "params": params, "prompt": prompt}

    def step(self) -> list[SimpleNamespace]:
        outs = []
        for rid, st in list(self.running.items()):
            k = st["n"]
            tok = self.script[rid][k]
            st["n"] += 1
            reason = (
                "stop"
                if tok == EOS
                else "length"
                if st["n"] >= st["params"]["max_tokens"]
                else None
            )
            c = SimpleNamespace(
                token_ids=[tok], logprobs=[_lp(tok, -(k + 1) / 10)], finish_reason=reason
            )
            outs.append(SimpleNamespace(request_id=rid, outputs=[c], finished=reason is not None))
            if reason is not None:
                del self.running[rid]
        return outs

    def abort_request(self, rids: list[str]) -> None:
        self.calls.append(("abort", sorted(rids)))
        for r in rids:
            self.running.pop(r, None)

    def collective_rpc(self, method: str, kwargs: dict) -> list:
        self.calls.append(("rpc", method, [k for k, _ in kwargs["weights_iterator"]]))
        return [None]

    def set_weight_version(self, v: str) -> None:
        self.calls.append(("set_weight_version", v))

    def reset_prefix_cache(self, reset_running_requests: bool = False) -> bool:
        self.calls.append(("reset_prefix_cache", reset_running_requests))
        return True


def _engine(script: dict[str, list[int]], **kw) -> tuple[VLLMEngine, FakeLLM]:
    llm = FakeLLM(script)
    settings = {k: kw.pop(k) for k in ("max_concurrent", "seed", "version") if k in kw}
    eng = VLLMEngine(
        llm,
        TOK,
        EngineSettings(max_seq_len=kw.pop("max_seq_len", 32), **settings),
        make_params=lambda **p: p,
        make_prompt=lambda ids: ids,
        **kw,
    )
    return eng, llm


def _ids(text: str) -> list[int]:
    return TOK.encode(text, add_special_tokens=False)


def test_versions_follow_weight_updates_between_steps():
    a, b = _ids("12345678"), _ids("abcdefgh")
    eng, llm = _engine({"1": a, "2": [*b[:3], EOS]}, version=4)
    eng.add_request(GenerationRequest(_ids("1+1="), 8, request_id=10))
    eng.add_request(GenerationRequest(_ids("2+2="), 8, request_id=11))
    assert eng.step() == [] and eng.step() == []
    eng.update_weights({"model.embed_tokens.weight": torch.zeros(2)}, 5)
    done = eng.step() + eng.step()
    assert [c.request.request_id for c in done] == [11]
    [c2] = done
    assert c2.token_ids == [*b[:3], EOS] and c2.finish_reason == "eos"
    assert c2.versions == [4, 4, 5, 5]
    assert c2.logprobs == pytest.approx([-0.1, -0.2, -0.3, -0.4])
    eng.update_weights({"model.embed_tokens.weight": torch.zeros(2)}, 6)
    while eng.num_unfinished():
        done += eng.step()
    c1 = done[-1]
    assert c1.token_ids == a and c1.finish_reason == "length"
    assert c1.versions == [4, 4, 5, 5, 6, 6, 6, 6]
    assert eng.tokens_generated == 12
    # The weights went to vLLM's in-place reload, with Hugging Face names, then the version
    # label and (recompute_kv) a preemption of the running requests.
    assert llm.calls[:3] == [
        ("rpc", "reload_weights", ["model.embed_tokens.weight"]),
        ("set_weight_version", "5"),
        ("reset_prefix_cache", True),
    ]
    # Later pushes must carry the parameters of the first one (a tied lm_head may come or not).
    eng.update_weights(
        {"model.embed_tokens.weight": torch.zeros(2), "lm_head.weight": torch.zeros(2)}, 7
    )
    with pytest.raises(ValueError, match=r"missing=\['model.embed_tokens.weight'\]"):
        eng.update_weights({"model.norm.weight": torch.zeros(2)}, 8)
    assert eng.version == 7


def test_budget_min_tokens_greedy_and_seeds_reach_the_sampling_params():
    eng, llm = _engine({"1": [], "2": []}, max_seq_len=10, seed=3)
    eng.add_request(GenerationRequest(_ids("1+1="), 50, min_new_tokens=99))
    eng.add_request(GenerationRequest(_ids("1+1="), 2, greedy=True))
    p1, p2 = llm.running["1"]["params"], llm.running["2"]["params"]
    assert p1["max_tokens"] == 6 and p1["min_tokens"] == 6  # clamped to the context
    assert p2 == {"max_tokens": 2, "min_tokens": 0, "greedy": True, "seed": request_seed(3, 2)}
    assert p1["seed"] != p2["seed"]
    with pytest.raises(ValueError, match=r"model\.max_seq_len"):
        eng.add_request(GenerationRequest(_ids("0123456789"), 2))


def test_stop_string_ends_a_request_and_aborts_it_in_vllm():
    eng, llm = _engine({"1": _ids("ab+cd+e")})
    [c] = eng.generate([GenerationRequest(_ids("x"), 8, stop=["+"])])
    assert TOK.decode(c.token_ids) == "ab+" and c.finish_reason == "stop"
    assert ("abort", ["1"]) in llm.calls and eng.num_unfinished() == 0


def test_abort_all_returns_partial_completions_and_close_shuts_down_last(monkeypatch):
    # Engines of the other tests here were never closed: count from a clean slate.
    monkeypatch.setattr(VLLMEngine, "_live", 0)
    monkeypatch.setattr(VLLMEngine, "_retired", [])
    eng, llm = _engine({"1": _ids("abcdef"), "2": _ids("uvwxyz")})
    eng.add_request(GenerationRequest(_ids("x"), 6))
    eng.add_request(GenerationRequest(_ids("y"), 6))
    eng.step()
    out = eng.abort_all()
    assert [(c.token_ids, c.finish_reason, c.versions) for c in out] == [
        (_ids("a"), "aborted", [0]),
        (_ids("u"), "aborted", [0]),
    ]
    assert ("abort", ["1", "2"]) in llm.calls and eng.step() == []
    other, other_llm = _engine({})
    eng.close()
    assert ("shutdown",) not in llm.calls  # another engine still uses vLLM's global state
    other.close()
    assert ("shutdown",) in llm.calls and ("shutdown",) in other_llm.calls
    eng.close()  # a second close is a no-op


def test_output_mapping_helpers():
    assert sampled_logprobs([5, 7], [_lp(5, -0.5), _lp(7, -1.25)]) == [-0.5, -1.25]
    with pytest.raises(RuntimeError, match="logprobs=0"):
        sampled_logprobs([5, 7], [_lp(5, -0.5)])
    assert finish_reason("stop", EOS, EOS) == "eos"
    assert finish_reason("stop", 40, EOS) == "stop"
    assert finish_reason("length", 40, EOS) == "length"
    assert finish_reason("abort", None, EOS) == "aborted"
    with pytest.raises(RuntimeError, match="unknown reason"):
        finish_reason("error", 40, EOS)
    assert stop_string_hit(TOK, _ids("12+"), ["+"])
    assert not stop_string_hit(TOK, _ids("1+2"), ["+"])  # completed by an earlier token
    assert stop_string_hit(TOK, _ids("a<b>"), ["<b>"]) and not stop_string_hit(TOK, [], ["+"])
    assert len({request_seed(s, c) for s in range(3) for c in range(100)}) == 300


def test_logprobs_mode_matches_softmax_of_logits_over_temperature():
    assert choose_logprobs_mode(0.7, 1.0) == "processed_logprobs"
    assert choose_logprobs_mode(1.0, 1.0) == "processed_logprobs"
    assert choose_logprobs_mode(1.0, 0.9) == "raw_logprobs"
    with pytest.raises(ValueError, match=r"rollout\.top_p"):
        choose_logprobs_mode(0.7, 0.9)
    with pytest.raises(ConfigError, match=r"rollout\.top_p=1 or rollout\.temperature=1"):
        tiny_config("rollout.engine=vllm", "rollout.temperature=0.7", "rollout.top_p=0.9")
    assert tiny_config("rollout.engine=vllm", "rollout.top_p=0.9").rollout.engine == "vllm"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_missing_vllm_names_the_extra_and_the_script(tiny_policy):
    from saorl.engines.factory import build_engine

    model, tok = tiny_policy
    with pytest.raises(ImportError, match=r"\[vllm\].*install_vllm_cpu\.sh"):
        build_engine(tiny_config("rollout.engine=vllm"), model, tok, seed=0)


def test_tensor_parallel_engines_run_vllms_worker_processes(monkeypatch, tiny_policy):
    from saorl.engines import vllm as vllm_module
    from saorl.engines.factory import build_engine

    # One device: vLLM's model in this process; several: its worker processes (`mp`), driven
    # by the engine core here, so a step is still one call and per-token versions stay exact.
    assert executor_args(1) == {"tensor_parallel_size": 1, "distributed_executor_backend": "uni"}
    assert executor_args(4) == {"tensor_parallel_size": 4, "distributed_executor_backend": "mp"}
    built, pushed = {}, []

    class WorkersLLM(FakeLLM):
        def collective_rpc(self, method: str, kwargs: dict) -> list:  # to every TP worker
            pushed.append({k: v.device.type for k, v in kwargs["weights_iterator"]})
            return super().collective_rpc(method, kwargs)

    llm = WorkersLLM({"1": _ids("abcd")})

    def fake_build_llm(model_dir, settings, **kw):
        built.update(kw, settings=settings)
        return llm, (lambda **p: p), (lambda ids: ids)

    def in_this_process(llm):
        raise AssertionError("the model is in the workers' processes, not this one")

    monkeypatch.setattr(vllm_module, "build_llm", fake_build_llm)
    monkeypatch.setattr(vllm_module.vllm_moe, "cpu_expert_layers", in_this_process)
    monkeypatch.setattr(VLLMEngine, "_live", 0)
    monkeypatch.setattr(VLLMEngine, "_retired", [])
    model, tok = tiny_policy
    cfg = tiny_config("rollout.engine=vllm", "rollout.vllm_tensor_parallel_size=2")
    eng = build_engine(cfg, model, tok, seed=0)
    assert built["tensor_parallel_size"] == 2 and eng.tensor_parallel_size == 2
    # The start-up push reached the workers through collective_rpc, from host memory.
    assert llm.calls[0][:2] == ("rpc", "reload_weights")
    assert set(pushed[0]) == set(model.state_dict()) and set(pushed[0].values()) == {"cpu"}
    eng.add_request(GenerationRequest(_ids("x"), 4, request_id=1))
    eng.step()
    eng.update_weights(dict(model.state_dict()), 1)
    [c] = eng.generate([])
    assert c.versions == [0, 1, 1, 1] and ("reset_prefix_cache", True) in llm.calls
    eng.close()


def test_tensor_parallel_settings_that_cannot_work_are_config_errors():
    with pytest.raises(ConfigError, match=r"vllm_tensor_parallel_size=2 needs rollout\.engine"):
        tiny_config("rollout.vllm_tensor_parallel_size=2")
    tp = ["rollout.engine=vllm", "rollout.vllm_tensor_parallel_size=2"]
    with pytest.raises(ConfigError, match=r"routing_replay.*tensor_parallel_size=2"):
        tiny_config(*tp, "algorithm.routing_replay=true")
    with pytest.raises(ConfigError, match=r"set ray\.rollout_num_gpus=2"):
        tiny_config(*tp, "ray.enabled=true", "ray.rollout_num_gpus=1")
    assert tiny_config(*tp, "ray.enabled=true", "ray.rollout_num_gpus=2").ray.rollout_num_gpus == 2
