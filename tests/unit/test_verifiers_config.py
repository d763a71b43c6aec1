"""env.name = "verifiers" on the trainer's side, without verifiers installed (the main venv):
its config, the clear error when the interpreter named to run episodes has no verifiers, and
the tokenizer verifiers' renderer is built from. Episodes themselves run in the verifiers tier
(tests/verifiers_tier/, scripts/test_verifiers_tier.sh)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest
from pydantic import ValidationError
from transformers import AutoTokenizer

from saorl.config import ConfigError, EnvConfig
from saorl.envs.factory import build_env
from saorl.envs.verifiers_env import PLAIN_TEMPLATE, Renderer
from saorl.models.tokenizer import build_char_tokenizer

ROOT = Path(__file__).resolve().parents[2]


def test_the_config_names_a_taskset():
    with pytest.raises(ValidationError, match=r"env\.verifiers\.taskset"):
        EnvConfig(name="verifiers")
    args = {"taskset": {"size": 8}, "agent": {"harness": {"id": "null"}}}
    cfg = EnvConfig(name="verifiers", args=args, verifiers={"taskset": "my-taskset"})
    assert cfg.verifiers.taskset == "my-taskset" and cfg.args == args  # an id stays as it is


def test_a_taskset_file_is_stored_absolute(monkeypatch):
    monkeypatch.chdir(ROOT)
    cfg = EnvConfig(name="verifiers", verifiers={"taskset": "examples/verifiers_chain_sum.py"})
    assert cfg.verifiers.taskset == str(ROOT / "examples" / "verifiers_chain_sum.py")


@pytest.mark.skipif(importlib.util.find_spec("verifiers") is not None, reason="has verifiers")
def test_an_interpreter_without_verifiers_is_a_clear_config_error():
    cfg = EnvConfig(name="verifiers", verifiers={"taskset": "my-taskset", "python": sys.executable})
    with pytest.raises(ConfigError, match="is verifiers installed there"):
        build_env(cfg)


def test_the_renderer_gets_a_saved_tokenizer_with_a_chat_template():
    tok = build_char_tokenizer()
    renderer = Renderer(None)
    renderer.bind(tok)
    assert tok.chat_template is None  # the worker's own tokenizer is left as it was
    saved = AutoTokenizer.from_pretrained(renderer.model)
    assert saved.chat_template == PLAIN_TEMPLATE
    assert saved.encode("2+2") == tok.encode("2+2")
    assert renderer.config == {"name": "default", "tool_parser": "qwen3"}
    msgs = [{"role": "user", "content": "2+2?"}]
    text = saved.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert text == "user: 2+2? assistant: "
    first = renderer.model
    renderer.bind(tok)  # once per process
    assert renderer.model == first


def test_a_tokenizer_directory_with_a_template_is_used_as_it_is(tmp_path):
    tok = build_char_tokenizer()
    tok.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    tok.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    renderer = Renderer({"name": "qwen3"})
    renderer.bind(loaded)
    assert renderer.model == str(tmp_path) and renderer.config == {"name": "qwen3"}
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())
