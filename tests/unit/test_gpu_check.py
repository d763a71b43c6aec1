"""`scripts/gpu_check.py`: its FLOP count, its refusal without a GPU, and its whole logic in
`--cpu-smoke` mode (tiny model, HF engine, gloo): every part runs and reports its figures."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_step_flops_by_hand():
    # hidden d=4, MLP 8, 1 layer, 2 query heads and 1 key-value head of 2, vocabulary 10;
    # one row of 3 tokens, K=2 critic updates. Forward FLOPs per token:
    #   projections 2*d*(2*2*2 + 2*1*2) = 96 (q, o: 4x4 each; k, v: 4x2 each), MLP 2*3*4*8 = 192,
    #   causal attention 4 * 2 * 2 * (3 + 1) / 2 = 32, output layer 2*4*10 = 80.
    # Critic values: 96 + 192 + 32 = 320. A critic update, attention weights frozen (backward
    # once, not twice): 2*96 + 3*192 + 3*32 = 864. The policy update: 3 * (320 + 80) = 1200.
    # Step: 3 tokens * (320 + 2*864 + 1200) = 9744.
    cfg = SimpleNamespace(
        hidden_size=4,
        intermediate_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=2,
        vocab_size=10,
    )
    assert _module().step_flops(cfg, rows=1, seq=3, k=2) == 9744


def test_the_flop_count_covers_every_weight_of_qwen3_06b():
    # The matmul weights step_flops counts (forward: 2 FLOPs per weight and token) are the
    # real model's parameters but the norms': checked against the model on the meta device.
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    gc = _module()
    shape = gc.QWEN3_06B
    with torch.device("meta"):
        model = Qwen3ForCausalLM(Qwen3Config(**shape))
    norms = sum(p.numel() for n, p in model.named_parameters() if "norm" in n)
    params = sum(p.numel() for p in model.parameters())
    assert params == 596_049_920  # Qwen3-0.6B
    attn, mlp, out = gc.weight_counts(SimpleNamespace(**shape))
    assert shape["num_hidden_layers"] * (attn + mlp) + out == params - norms


def test_without_cuda_it_stops_with_exit_2_and_says_why(monkeypatch, capsys):
    import torch

    gc = _module()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    assert gc.main() == 2
    err = capsys.readouterr().err
    assert "CUDA" in err and "--cpu-smoke" in err and "nothing was run" in err
    assert gc.gpu_peak(torch.device("cpu")) is None


@pytest.mark.slow
def test_cpu_smoke_runs_every_part(tmp_path: Path):
    out = tmp_path / "gpu.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--cpu-smoke", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["mode"] == "cpu-smoke"
    gen, learner, training = (report["parts"][k] for k in ("generation", "learner", "training"))
    assert gen["tokens"] == 4 * 8 and gen["tokens_per_s"] > 0
    # The pushed weights are the ones sampling: the learner's log-probs under them match the
    # engine's (same fp32 model on CPU), those of the original weights do not.
    assert gen["push_in_use"] and gen["pushed_vs_learner_max_abs_logprob_diff"] < 1e-4
    assert learner["version"] == 2 and learner["model_tflops_per_step"] > 0
    assert learner["mfu"] is None  # no GPU peak on CPU
    assert training["steps"] == 2 and training["policy_version"] == 1
    assert training["checkpoint_hf"]
    # Part 5's logic on the HF engine (no tensor parallelism on CPU): a push that lands on
    # requests in flight, every token's version exact, the pushed weights in use.
    tp = report["parts"]["tensor_parallel"]
    assert tp["tensor_parallel_size"] == 1 and tp["in_flight_across_push"] == 8
    assert tp["versions_exact"] and tp["push_in_use"]
    assert report["parts"]["real_model"] == {
        "skipped": "--real-steps 0 (the CPU smoke's default)",
        "part_s": report["parts"]["real_model"]["part_s"],
    }


def test_the_real_model_part_runs_the_real_model_config_on_the_gpu(tmp_path: Path):
    import sys as _sys

    _sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_real import CONFIG, overrides

    from saorl.config import load_config

    cfg = load_config(CONFIG, overrides(200, tmp_path, smoke=False))
    assert cfg.model.name_or_path == "smollm2-135m" and cfg.model.device == "cuda"
    assert cfg.rollout.engine == "vllm" and cfg.learner.mixed_precision == "bf16"
    assert (cfg.run.total_steps, cfg.learner.batch_size, cfg.critic.updates_per_step) == (
        200,
        64,
        2,
    )
    assert cfg.rollout.temperature == 0.7 and cfg.env.reasoning_gym.answer_format == "last_number"


def test_the_tensor_parallel_part_needs_two_gpus(monkeypatch):
    import torch

    sys.path.insert(0, str(ROOT / "scripts"))
    from gpu_check_tp import part_tensor_parallel

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    args = SimpleNamespace(cpu_smoke=False, new_tokens=8)
    assert part_tensor_parallel(args, None) == {
        "skipped": "tensor parallelism needs 2 CUDA devices, this machine has 1"
    }
