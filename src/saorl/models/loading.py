"""Load a policy and its tokenizer: a local directory, a hub id, or the built-in tiny model.

A hub id (`model.name_or_path = "Qwen/Qwen3-1.7B"`) resolves through the Hugging Face cache as
`transformers` does (`huggingface_hub`: HF_HOME / HF_HUB_CACHE, the `models--Org--Name/snapshots/
<rev>` layout, `refs/main`). A cached copy is used as it is, without any network request, so a
run starts the same offline and online; only an id that is not cached is downloaded, and only
when HF_HUB_OFFLINE is unset (huggingface_hub's timeouts bound each request). Otherwise the
error says how to download it (exit code 2).

The memory settings of `[model]` are applied here, so policy, critic (a copy of the policy's
backbone) and the supervised warm-up share them: `gradient_checkpointing` and
`attn_implementation`. `compute_precision` is the single-process learner's bf16 autocast.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerBase
from transformers.utils import logging as hf_logging

from saorl.config import ConfigError, ModelConfig
from saorl.models.lora import has_lora, merged_copy
from saorl.models.tokenizer import build_char_tokenizer

BUILTIN_PREFIX = "builtin:"
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# 'Org/Name' or a legacy top-level 'name' (gpt2): what the hub accepts as a model id.
_HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")
# What a download fetches: config, safetensors weights, tokenizer and chat template files
# (no pickled .bin weights, no remote code).
_HUB_FILES = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "*.tiktoken"]


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"model.device={device!r} but CUDA is not available; use 'cpu'")
    return torch.device(device)


def build_tiny_model(cfg: ModelConfig, tokenizer: PreTrainedTokenizerBase) -> torch.nn.Module:
    """A random-init Qwen3-style causal LM sized by `cfg` (no weights are downloaded): dense, or
    with `model.arch = "qwen3_moe"` a Qwen3-MoE whose experts are `intermediate_size` wide."""
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

    if cfg.hidden_size % cfg.num_heads:
        raise ValueError(
            f"model.hidden_size={cfg.hidden_size} must be divisible by "
            f"model.num_heads={cfg.num_heads}"
        )
    moe = cfg.arch == "qwen3_moe"
    extra = dict(
        num_experts=cfg.num_experts,
        num_experts_per_tok=cfg.num_experts_per_tok,
        moe_intermediate_size=cfg.intermediate_size,
        norm_topk_prob=True,
    )
    config = (Qwen3MoeConfig if moe else Qwen3Config)(
        **(extra if moe else {}),
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
    return (Qwen3MoeForCausalLM if moe else Qwen3ForCausalLM)(config)


def load_policy(cfg: ModelConfig) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Return `(model, tokenizer)` on CPU in `cfg.dtype`; the caller moves it to its device.

    Built-in models are random-init: the seed in force when this is called fixes the weights.
    """
    dtype = DTYPES[cfg.dtype]
    attn = _check_attn_implementation(cfg)
    if cfg.name_or_path.startswith(BUILTIN_PREFIX):
        kind = cfg.name_or_path[len(BUILTIN_PREFIX) :]
        if kind != "tiny":
            raise ConfigError(f"model.name_or_path: unknown built-in {kind!r}; allowed: 'tiny'")
        tokenizer = build_char_tokenizer(with_newlines=cfg.builtin_newlines)
        model = build_tiny_model(cfg, tokenizer)
        model.set_attn_implementation(attn)
    else:
        path = model_dir(cfg.name_or_path)
        if not (path / "config.json").exists():
            raise ConfigError(f"model.name_or_path: {path} has no config.json")
        trust = cfg.trust_remote_code
        tokenizer = _load_tokenizer(path, trust)
        try:
            # Always said explicitly: left unset, transformers asks [y/N] on stdin for a
            # directory with `auto_map`, and a `y` runs the directory's code.
            model = AutoModelForCausalLM.from_pretrained(
                str(path), dtype=dtype, attn_implementation=attn, trust_remote_code=trust
            )
        except Exception as e:  # any library's failure, reported with the directory it concerns
            raise ConfigError(
                f"model.name_or_path: could not load the weights in {path} (missing or damaged "
                f"shard?): {type(e).__name__}: {e}{_remote_code_hint(path, trust)}"
            ) from e
    model.to(dtype)
    if getattr(model.config, "vocab_size", len(tokenizer)) < len(tokenizer):
        raise ConfigError(
            f"model.name_or_path={cfg.name_or_path}: tokenizer has {len(tokenizer)} tokens but "
            "the model's "
            f"vocab_size is {model.config.vocab_size}: model and tokenizer do not match"
        )
    if cfg.gradient_checkpointing:
        # Non-reentrant: works with frozen parameters (the critic's attention) and FSDP2.
        model.activation_checkpointing_enable({"use_reentrant": False})
    return model, tokenizer


def model_dir(name_or_path: str) -> Path:
    """The local directory of `model.name_or_path`: itself, or a hub id's cached snapshot."""
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        return path
    from saorl.models.fetch import KNOWN, resolve_known

    if name_or_path in KNOWN:  # a real model from a package (`saorl model fetch NAME`)
        return resolve_known(name_or_path)
    if not _HUB_ID.fullmatch(name_or_path) or name_or_path.startswith((".", "~")):
        raise ConfigError(
            f"model.name_or_path={name_or_path!r} is not a local directory; give a Hugging Face "
            "model directory (config.json, weights, tokenizer), a hub id such as "
            "'Qwen/Qwen3-1.7B', a model saorl fetches from a package (smollm2-135m), or "
            "'builtin:tiny'"
        )
    return hub_snapshot(name_or_path)


def hub_snapshot(repo_id: str) -> Path:
    """The cached snapshot of hub model `repo_id` (revision `main`), downloaded if need be.

    The cache is tried first and without network. A snapshot counts as cached when it has a
    config.json and safetensors weights (an interrupted download does not). Not cached: with
    HF_HUB_OFFLINE set, a `ConfigError` that says how to download it; otherwise a download of
    config, safetensors weights and tokenizer files, any failure again a `ConfigError`.
    """
    from huggingface_hub import constants, snapshot_download
    from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError

    with contextlib.suppress(Exception):  # not cached (or no refs/main): handled below
        cached = Path(snapshot_download(repo_id, local_files_only=True))
        if (cached / "config.json").is_file() and any(cached.glob("*.safetensors")):
            return cached
    hint = (
        f"download it first (where there is network, into the same cache): hf download "
        f"{repo_id}  (older huggingface_hub: huggingface-cli download {repo_id}); the cache is "
        f"HF_HUB_CACHE={constants.HF_HUB_CACHE} (set HF_HOME or HF_HUB_CACHE to use another), "
        "or give a local model directory"
    )
    if constants.HF_HUB_OFFLINE:
        raise ConfigError(
            f"model.name_or_path={repo_id!r}: not in the Hugging Face cache and HF_HUB_OFFLINE "
            f"is set; {hint}"
        )
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_FILES))
    except GatedRepoError as e:
        raise ConfigError(
            f"model.name_or_path={repo_id!r}: a gated model: accept its terms on "
            f"huggingface.co and log in (hf auth login), then {hint} ({e})"
        ) from None
    except RepositoryNotFoundError:
        raise ConfigError(
            f"model.name_or_path={repo_id!r}: no such model on the Hugging Face hub (or a "
            "private one: hf auth login), and no local directory of that name"
        ) from None
    except Exception as e:  # network, disk, ...: the download did not happen
        raise ConfigError(
            f"model.name_or_path={repo_id!r}: not in the Hugging Face cache and the download "
            f"failed ({type(e).__name__}: {' '.join(str(e).split())[:200]}); {hint}"
        ) from None


def _check_attn_implementation(cfg: ModelConfig) -> str:
    """`model.attn_implementation`, refused with the reason when this machine cannot run it."""
    attn = cfg.attn_implementation
    if attn == "flash_attention_2":
        from transformers.utils import is_flash_attn_2_available

        if cfg.dtype == "float32":
            raise ConfigError(
                "model.attn_implementation='flash_attention_2' runs in bfloat16/float16 only: "
                "set model.dtype='bfloat16' (or use 'sdpa')"
            )
        if not is_flash_attn_2_available():
            raise ConfigError(
                "model.attn_implementation='flash_attention_2' needs CUDA and the flash-attn "
                "package (pip install flash-attn --no-build-isolation), which this machine "
                "lacks; use 'sdpa'"
            )
    return attn


def compute_precision(
    mixed_precision: str, device: torch.device, sharded: bool = False
) -> Callable[[], Any]:
    """The learner's compute precision around its forward passes, a context-manager factory.

    `learner.mixed_precision = "bf16"` in one process: forward passes (and so their backward)
    run under `torch.autocast(bfloat16)`: matmuls in bfloat16, while weights, gradients and
    optimizer state stay in `model.dtype`. On CPU autocast runs too (slowly; the tests use it).
    A `sharded` (FSDP2) learner gets a no-op here: its `MixedPrecisionPolicy` applies the
    setting (`saorl.distributed.fsdp`).
    """
    if mixed_precision == "none" or sharded:
        return contextlib.nullcontext
    if mixed_precision != "bf16":
        raise ConfigError(f"learner.mixed_precision: unknown {mixed_precision!r}; use none|bf16")
    return functools.partial(torch.autocast, device_type=device.type, dtype=torch.bfloat16)


def _remote_code_hint(path: Path, trust: bool) -> str:
    """Why loading may have failed when `path`'s config.json names code saorl did not run."""
    try:
        names_code = not trust and "auto_map" in json.loads((path / "config.json").read_text())
    except (OSError, ValueError, TypeError):
        names_code = False
    if not names_code:
        return ""
    return (
        f"; {path}/config.json names Python code of its own (auto_map), which saorl runs only "
        "with --trust-remote-code (model.trust_remote_code = true): for directories you trust"
    )


def _load_tokenizer(path: Path, trust: bool = False) -> PreTrainedTokenizerBase:
    """The tokenizer in `path`, checked to be usable: it encodes text and has an EOS token.

    transformers falls back to an empty tokenizer when the files are missing, which would only
    fail later inside the model with a shape error; this says what is wrong instead.
    """
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path), trust_remote_code=trust)
    except Exception as e:  # any library's failure, reported with the directory it concerns
        raise ConfigError(
            f"model.name_or_path: could not load the tokenizer in {path}: {type(e).__name__}: "
            f"{e}{_remote_code_hint(path, trust)}"
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
    """Save model and tokenizer in Hugging Face format (loadable with `model.name_or_path`).

    Safetensors weights, config.json, generation config, the tokenizer and its chat template.
    Written into a temporary sibling directory and renamed into place, so `path` only ever holds
    a whole model (the previous one until the new one is complete).
    """
    path = Path(path)
    from saorl.security.safe_io import refuse_link, temp_dir

    path.parent.mkdir(parents=True, exist_ok=True)
    refuse_link(path, "a model folder")
    tmp = temp_dir(path)  # fresh and 0700: nothing planted in it for the writes to follow
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one bar per checkpoint would scroll past the progress
    try:
        # LoRA: the merged weights, a plain model for transformers and vLLM (docs/lora.md)
        (merged_copy(model) if has_lora(model) else model).save_pretrained(str(tmp))
        tokenizer.save_pretrained(str(tmp))
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    replace_dir(tmp, path)


def replace_dir(src: Path, dst: Path) -> None:
    """Move directory `src` to `dst`, replacing what is there (a directory cannot be renamed
    over a non-empty one: the old one steps aside first and is deleted after)."""
    old = dst.with_name(f".{dst.name}.old.{os.getpid()}")
    if dst.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(dst, old)
    os.replace(src, dst)
    shutil.rmtree(old, ignore_errors=True)
