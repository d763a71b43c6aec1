"""Load a policy and its tokenizer: a local Hugging Face directory or the built-in tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase

from saorl.config import ConfigError, ModelConfig
from saorl.models.tokenizer import build_char_tokenizer

BUILTIN_PREFIX = "builtin:"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"model.device={device!r} but CUDA is not available; use 'cpu'")
    return torch.device(device)


def build_tiny_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """A random-init dense Qwen3-style causal LM sized by `cfg` (no weights are downloaded)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(
            f"model.hidden_size={cfg.hidden_size} must be divisible by "
            f"model.num_heads={cfg.num_heads}"
        )
    config = Qwen3Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers,
        num_attention_heads=cfg.num_heads,
        num_key_value_heads=cfg.num_kv_heads,
        head_dim=cfg.hidden_size // cfg.num_heads,
        max_position_embeddings=cfg.max_seq_len,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
    )
    return Qwen3ForCausalLM(config)


def load_policy(cfg: ModelConfig) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)` on CPU in `cfg.dtype`; the caller moves it to its device.

    Built-in models are random-init: the seed in force when this is called fixes the weights.
    """
    dtype = DTYPES[cfg.dtype]
    if cfg.name_or_path.startswith(BUILTIN_PREFIX):
        kind = cfg.name_or_path[len(BUILTIN_PREFIX) :]
        if kind != "tiny":
            raise ConfigError(f"model.name_or_path: unknown built-in {kind!r}; allowed: 'tiny'")
        tokenizer = build_char_tokenizer(with_newlines=cfg.builtin_newlines)
        model = build_tiny_model(cfg, tokenizer)
    else:
        path = Path(cfg.name_or_path).expanduser()
        if not path.is_dir():
            raise ConfigError(
                f"model.name_or_path={cfg.name_or_path!r} is not a local directory; give a "
                "Hugging Face model directory (config.json, weights, tokenizer) or 'builtin:tiny'"
            )
        if not (path / "config.json").exists():
            raise ConfigError(f"model.name_or_path: {path} has no config.json")
        tokenizer = _load_tokenizer(path)
        try:
            model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
        except Exception as e:  # any library's failure, reported with the directory it concerns
            raise ConfigError(
                f"model.name_or_path: could not load the weights in {path} (missing or damaged "
                f"shard?): {type(e).__name__}: {e}"
            ) from e
    model.to(dtype)
    if getattr(model.config, "vocab_size", len(tokenizer)) < len(tokenizer):
        raise ConfigError(
            f"model.name_or_path={cfg.name_or_path}: tokenizer has {len(tokenizer)} tokens but "
            "the model's "
            f"vocab_size is {model.config.vocab_size}: model and tokenizer do not match"
        )
    return model, tokenizer


def _load_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer in `path`, checked to be usable: it encodes text and has an EOS token.

    transformers falls back to an empty tokenizer when the files are missing, which would only
    fail later inside the model with a shape error; this says what is wrong instead.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except Exception as e:  # any library's failure, reported with the directory it concerns
        raise ConfigError(
            f"model.name_or_path: could not load the tokenizer in {path}: {type(e).__name__}: {e}"
        ) from e
    if len(tokenizer) < 2 or not tokenizer("1 + 1 = 2").input_ids or tokenizer.eos_token is None:
        raise ConfigError(
            f"model.name_or_path: {path} has no usable tokenizer ({len(tokenizer)} tokens, EOS "
            f"{tokenizer.eos_token!r}); copy the tokenizer files (tokenizer.json, "
            "tokenizer_config.json) of the model into the directory"
        )
    if tokenizer.pad_token_id is None:
        # Pad positions are always masked out; reusing EOS is the usual choice.
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def save_pretrained(model: Any, tokenizer: PreTrainedTokenizerBase, path: Path) -> None:
    """Save model and tokenizer in Hugging Face format (loadable with `model.name_or_path`)."""
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path))
    tokenizer.save_pretrained(str(path))
