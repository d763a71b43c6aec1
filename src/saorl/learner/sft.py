"""Supervised warm-up: a short cross-entropy phase on task demonstrations before RL.

The built-in task starts from random weights, so the run first teaches the output format and
some arithmetic with a few hundred supervised steps; RL then has to do the rest. The loss is the
mean negative log-likelihood of the answer tokens (and EOS), not of the prompt.

With `learner.sft_cache` set (`saorl compare` sets it), the warmed-up policy weights are stored
there under a key of every setting that shapes them (`warmup_key`), and a later run with the
same key loads them instead of training again: the arms of a comparison at one seed share one
warm-up. It is deterministic given those settings (no dropout; its own example RNG), so a
loaded warm-up is the one the run would have computed.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from saorl.config import Config, ConfigError
from saorl.envs.base import Segments
from saorl.models.logprobs import sequence_logprobs
from saorl.models.lora import lora_warmup
from saorl.models.tokenizer import encode_prompt
from saorl.security.safe_io import atomic_write, make_dir

if TYPE_CHECKING:
    from saorl.envs.base import EnvSpec
    from saorl.monitoring.metrics import TrainProgress


def encode_segments(
    tokenizer: object, demos: list[Segments]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `(input_ids, attention_mask, target_mask)`; EOS (trained) ends each demo.

    The first segment is the prompt, encoded as the rollout side encodes prompts (through the
    chat template when there is one); later segments are encoded as plain text, as the agent
    loop appends them. `target_mask` is 1 on the tokens of trained segments and on EOS.
    """
    rows = []
    masks = []
    for segments in demos:
        ids: list[int] = []
        mask: list[int] = []
        for i, (text, trained) in enumerate(segments):
            piece = (
                encode_prompt(tokenizer, text)
                if i == 0
                else list(tokenizer.encode(text, add_special_tokens=False))
            )
            ids += piece
            mask += [int(trained)] * len(piece)
        rows.append([*ids, tokenizer.eos_token_id])
        masks.append([*mask, 1])
    T = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids_t = torch.tensor([r + [pad] * (T - len(r)) for r in rows])
    attn = torch.tensor([[1] * len(r) + [0] * (T - len(r)) for r in rows])
    tmask = torch.tensor([m + [0] * (T - len(m)) for m in masks], dtype=torch.float)
    return ids_t, attn, tmask


def encode_demos(
    tokenizer: object, prompts: list[str], answers: list[str]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded `(input_ids, attention_mask, target_mask)` for prompt + answer + EOS."""
    demos = [[(p, False), (a, True)] for p, a in zip(prompts, answers, strict=True)]
    return encode_segments(tokenizer, demos)


def sft_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    grad_clip: float = 1.0,
) -> float:
    """One supervised step; returns the token-mean NLL of the answer tokens."""
    device = next(model.parameters()).device
    ids, attn, tmask = (x.to(device) for x in batch)
    model.train()
    logp = sequence_logprobs(model, ids, attn)
    loss = -(logp * tmask).sum() / tmask.sum().clamp(min=1)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    return float(loss.detach())


def supervised_warmup(
    policy: nn.Module, tokenizer: Any, spec: EnvSpec, cfg: Config, progress: TrainProgress | None
) -> None:
    """`learner.sft_steps` supervised steps of `policy` on the task's demonstrations.

    A LoRA policy trains its base weights here, adapters off (docs/lora.md: the warm-up stands
    in for pretraining); RL then trains the adapters."""
    cached = _cache_file(cfg)
    if cached is not None and cached.is_file():
        policy.load_state_dict(torch.load(cached, map_location="cpu", weights_only=True))
        print(f"saorl: supervised warm-up reused from {cached}", file=sys.stderr, flush=True)
        return
    with lora_warmup(policy):
        trained = _supervised_steps(policy, tokenizer, spec, cfg, progress)
    if cached is not None and trained:
        make_dir(cached.parent, "warm-up cache")
        with atomic_write(cached) as f:  # parallel arms: each its own, one atomic rename wins
            torch.save({k: v.detach().cpu() for k, v in policy.state_dict().items()}, f)


# What the warm-up's result depends on besides the model, env and sft_* settings. The torch and
# saorl versions: a cache kept across an upgrade must not hand back another version's numbers.
def warmup_key(cfg: Config) -> str:
    """A hash of every setting the supervised warm-up's weights depend on.

    The model (architecture, weights, LoRA, dtype, device: its random init is drawn from
    run.seed), the env (its demonstrations), `learner.sft_*`, `run.seed` and
    `run.deterministic`; not the algorithm, critic or RL settings, which act only after it."""
    from saorl import __version__

    lc = cfg.learner
    parts = {
        "model": cfg.model.model_dump(mode="json"),
        "env": cfg.env.model_dump(mode="json"),
        "sft": [lc.sft_steps, lc.sft_lr, lc.sft_batch_size],
        "seed": cfg.run.seed,
        "deterministic": cfg.run.deterministic,
        "versions": [__version__, torch.__version__],
    }
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _cache_file(cfg: Config) -> Path | None:
    where = cfg.learner.sft_cache
    return Path(where) / f"sft-{warmup_key(cfg)}.pt" if where else None


def _supervised_steps(
    policy: nn.Module, tokenizer: Any, spec: EnvSpec, cfg: Config, progress: TrainProgress | None
) -> bool:
    """The warm-up's steps; False when there were none to take."""
    lc = cfg.learner
    if spec.demo is None and "sft_steps" not in lc.model_fields_set:
        # Left at its default (made for the built-in tasks): start RL from the model as it is.
        print(
            f"saorl: env {cfg.env.name!r} has no demonstrations: no supervised warm-up "
            "(learner.sft_steps applies to the built-in tasks)",
            file=sys.stderr,
        )
        return False
    if spec.demo is None:
        raise ConfigError(
            f"learner.sft_steps={lc.sft_steps}: env {cfg.env.name!r} has no demonstrations for "
            "a supervised warm-up; set learner.sft_steps=0 (start from a trained model)"
        )
    opt = torch.optim.AdamW(policy.parameters(), lr=lc.sft_lr)
    # Cosine decay to 10% of sft_lr: the warm-up ends at a settled point, not mid-oscillation,
    # so the accuracy RL starts from does not hinge on where the last noisy step landed.
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda i: 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * i / max(lc.sft_steps, 1)))
    )
    rng = random.Random(cfg.run.seed + 1)
    bar = progress.phase("supervised warm-up", lc.sft_steps) if progress else None
    for _ in range(lc.sft_steps):
        problems = [spec.task.sample(rng) for _ in range(lc.sft_batch_size)]
        demos = encode_segments(tokenizer, [spec.demo(p, rng) for p in problems])
        sft_step(policy, opt, demos)
        sched.step()
        if bar:
            bar.advance()
    return True
