"""LoRA (peft) on the policy and the critic: what trains, what the engines and users load.

Real learner steps on a tiny random-init Qwen3: only adapter weights of the policy move (base
weights bit-identical), the critic's attention (its adapters included) stays frozen, pushes
carry merged weights the engine reproduces the learner's log-probs with, `final/` holds a
merged model transformers loads and a peft adapter, a resumed LoRA run continues exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from saorl.config import ConfigError
from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings, GenerationRequest
from saorl.envs.factory import build_env
from saorl.learner.learner import Learner
from saorl.loop import train_from_config
from saorl.models.loading import load_policy
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import merge_lora
from tests.conftest import tiny_config
from tests.faults._common import TINY_SYNC, assert_same_metrics, metric_rows
from tests.integration.test_learner import _batch

LORA = ("model.lora_rank=4", "model.lora_alpha=8", "critic.warmup_steps=0")


def _learner(*overrides: str) -> Learner:
    cfg = tiny_config(*LORA, *overrides)
    torch.manual_seed(0)
    policy, _ = load_policy(cfg.model)
    return Learner(cfg, policy, torch.device("cpu"))


def test_merge_lora_by_hand():
    # W = [[1, 0], [0, 1]], B A = [[1], [2]] [[3, 4]] = [[3, 4], [6, 8]]; scale 0.5:
    # W + 0.5 B A = [[2.5, 2], [3, 5]]. The bias moves to its plain name; other keys stay.
    state = {
        "l.q.base_layer.weight": torch.eye(2),
        "l.q.base_layer.bias": torch.tensor([7.0, 8.0]),
        "l.q.lora_A.default.weight": torch.tensor([[3.0, 4.0]]),
        "l.q.lora_B.default.weight": torch.tensor([[1.0], [2.0]]),
        "l.norm.weight": torch.ones(2),
    }
    merged = merge_lora(state, 0.5)
    assert merged.keys() == {"l.q.weight", "l.q.bias", "l.norm.weight"}
    assert torch.equal(merged["l.q.weight"], torch.tensor([[2.5, 2.0], [3.0, 5.0]]))
    assert torch.equal(merged["l.q.bias"], torch.tensor([7.0, 8.0]))


def _snapshot(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in module.state_dict().items()}


@pytest.mark.parametrize("critic_rank", [0, 4], ids=["critic-full", "critic-lora"])
def test_only_adapters_train_and_the_critic_attention_stays_frozen(critic_rank):
    learner = _learner(f"critic.lora_rank={critic_rank}")
    batch = _batch(learner.policy)
    policy0, critic0 = _snapshot(learner.policy), _snapshot(learner.critic)
    for _ in range(3):  # B starts at 0, so A gets its first gradient at the second step
        learner.step(batch)
    assert learner.version == 3
    for k, v in learner.policy.state_dict().items():
        if ".lora_" in k:
            assert not torch.equal(v, policy0[k]), f"adapter {k} did not train"
        else:
            assert torch.equal(v, policy0[k]), f"base weight {k} changed"
    assert {id(p) for p in learner.policy_params} == {
        id(p) for n, p in learner.policy.named_parameters() if ".lora_" in n
    }
    frozen = set(learner.frozen)
    assert frozen and any(".lora_" in n for n in frozen) == bool(critic_rank)  # attention's too
    trainable = {n for n, p in learner.critic.named_parameters() if p.requires_grad}
    assert not trainable & frozen and "value_head.weight" in trainable
    if critic_rank:  # the value head and the adapters outside attention
        assert all("value_head" in n or (".lora_" in n and ".mlp." in n) for n in trainable)
    for k, v in learner.critic.state_dict().items():
        assert torch.equal(v, critic0[k]) == (k not in trainable), f"critic {k}"


def test_pushed_weights_are_merged_and_the_engine_reproduces_the_learner():
    learner = _learner()
    batch = _batch(learner.policy)
    for _ in range(3):
        learner.step(batch)
    state = learner.policy_state()
    assert not any("lora" in k or "base_layer" in k for k in state)
    _, tok = load_policy(learner.cfg.model)
    engine = HFEngine(learner.policy, tok, EngineSettings(max_seq_len=32, seed=1))  # a merged copy
    assert not any("lora" in k for k in engine.model.state_dict())
    engine.update_weights(state, version=3)  # the push: the engine's keys, merged values
    reqs = [
        GenerationRequest(prompt_ids=tok.encode(f"{i}+{i}="), max_new_tokens=6) for i in range(6)
    ]
    for c in engine.generate(reqs):
        ids = torch.tensor([c.request.prompt_ids + c.token_ids])
        with torch.no_grad():
            lp = sequence_logprobs(learner.policy, ids, torch.ones_like(ids))
        got = torch.tensor(c.logprobs)
        torch.testing.assert_close(got, lp[0, len(c.request.prompt_ids) :], atol=2e-5, rtol=0)
        assert c.versions == [3] * len(c.token_ids)


def test_final_holds_a_merged_model_and_a_peft_adapter(tmp_path: Path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    learner = _learner("learner.sft_steps=0")
    batch = _batch(learner.policy)
    for _ in range(3):
        learner.step(batch)
    _, tok = load_policy(learner.cfg.model)
    learner.export(tok, tmp_path / "final")
    ids = batch.input_ids[:4]
    with torch.no_grad():
        want = learner.policy(input_ids=ids).logits
        merged = AutoModelForCausalLM.from_pretrained(str(tmp_path / "final"))
        torch.testing.assert_close(merged(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
        adapter = tmp_path / "final" / "adapter"
        conf = json.loads((adapter / "adapter_config.json").read_text())
        assert (adapter / "adapter_model.safetensors").is_file() and conf["r"] == 4
        assert conf["base_model_name_or_path"] == str((tmp_path / "final" / "base").resolve())
        base = AutoModelForCausalLM.from_pretrained(conf["base_model_name_or_path"])
        peft_model = PeftModel.from_pretrained(base, str(adapter))
        torch.testing.assert_close(peft_model(input_ids=ids).logits, want, atol=1e-5, rtol=1e-5)
    # The merged model is a plain one: nothing for transformers to mistake for an adapter.
    assert not (tmp_path / "final" / "adapter_config.json").exists()


def test_warm_up_trains_the_base_then_rl_trains_the_adapters(tmp_path: Path):
    learner = _learner("critic.lora_rank=4", "learner.sft_steps=3", "learner.sft_batch_size=8")
    before = _snapshot(learner.policy)
    _, tok = load_policy(learner.cfg.model)
    learner.warm_up(build_env(learner.cfg.env), tok, None)
    after = _snapshot(learner.policy)
    for k, v in after.items():  # adapters off in the warm-up: B stays 0, A untouched
        assert torch.equal(v, before[k]) == (".lora_" in k), k
    assert all(p.requires_grad == (".lora_" in n) for n, p in learner.policy.named_parameters())
    # The critic starts from the warmed-up backbone (its base weights), adapters unchanged.
    critic = learner.critic.state_dict()
    for k, v in after.items():
        if k.startswith("model.") and ".lora_" not in k:
            assert torch.equal(critic["backbone." + k[len("model.") :]], v), k
    assert learner.critic_params and all(
        ".lora_" in n or "value_head" in n
        for n, p in learner.critic.named_parameters()
        if p.requires_grad
    )
    batch = _batch(learner.policy)
    learner.step(batch)
    learner.step(batch)
    moved = {k for k, v in learner.policy.state_dict().items() if not torch.equal(v, after[k])}
    assert moved and all(".lora_" in k for k in moved)


@pytest.mark.parametrize(
    "targets, message",
    [('["nothing_here"]', "lora_target_modules"), ('["embed_tokens"]', "linear layers only")],
)
def test_bad_targets_are_config_errors(targets, message):
    with pytest.raises(ConfigError, match=message):
        _learner(f"model.lora_target_modules={targets}")


def test_missing_peft_stops_with_an_install_hint(tmp_path: Path):
    shadow = tmp_path / "shadow" / "peft"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('peft is not installed here')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "shadow")}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "saorl",
            "train",
            *LORA,
            "learner.sft_steps=0",
            "run.total_steps=1",
            f"run.output_dir={tmp_path}",
            "run.progress=false",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert out.returncode == 2, out.stderr
    assert "model.lora_rank=4 needs the peft package" in out.stderr
    assert "pip install 'saorl[lora]'" in out.stderr


@pytest.mark.slow
def test_lora_run_resumes_exactly_and_exports_merged_and_adapter(tmp_path: Path):
    args = (*TINY_SYNC, *LORA, "critic.lora_rank=4", f"run.output_dir={tmp_path}")
    train_from_config(tiny_config(*args, "run.name=whole", "run.total_steps=4"))
    first = tiny_config(*args, "run.name=split", "run.total_steps=2")
    train_from_config(first)
    rest = first.model_copy(update={"run": first.run.model_copy(update={"total_steps": 4})})
    train_from_config(rest, resume=str(tmp_path / "split"))
    assert_same_metrics(metric_rows(tmp_path / "split"), metric_rows(tmp_path / "whole"))
    for run in ("whole", "split"):
        final = tmp_path / run / "final"
        assert (final / "model.safetensors").is_file()
        assert (final / "adapter" / "adapter_model.safetensors").is_file()
        assert (final / "base" / "model.safetensors").is_file()
    from safetensors.torch import load_file

    a = load_file(str(tmp_path / "whole" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "split" / "final" / "model.safetensors"))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    # `saorl eval` of the last checkpoint (base + adapters) evaluates the merged final policy.
    summaries = []
    for model in ("checkpoints/step_00000004.pt", "final"):
        out = tmp_path / f"eval{len(summaries)}.jsonl"
        proc = subprocess.run(
            [
                sys.executable,
                "-m",
                "saorl",
                "eval",
                str(tmp_path / "split" / model),
                "env.eval_size=8",
                "--out",
                str(out),
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr
        summaries.append(out.read_text())
    assert summaries[0] == summaries[1]


def test_lora_with_fsdp_is_a_config_error():
    for rank in ("model.lora_rank=4", "critic.lora_rank=4"):
        with pytest.raises(ConfigError, match=r"learner\.fsdp"):
            tiny_config(rank, "learner.fsdp=true")
