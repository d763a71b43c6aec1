"""Prompts checked against the model before step 1 (`saorl train`).

A few tasks (training and held-out) are reset and their opening messages tokenized as the
rollout workers will (chat template, the env's tool schemas). Prompts that leave no room in
`model.max_seq_len` for an answer are a `ConfigError` (exit 2) naming the field and the length
needed, rather than steps trained on empty rollouts; some too long, or characters the tokenizer
reads as its unknown token (newlines on the built-in char model without
`model.builtin_newlines`), are a warning. A reset that fails is left to the rollout workers,
which report it (`saorl.rollout.failures`); environments whose reset is costly (`swe`) are not
sampled.
"""

from __future__ import annotations

import asyncio
import itertools
import sys
from typing import Any

from saorl.config import Config, ConfigError
from saorl.envs.base import EndsEpisodes, EnvSpec, task_key, tool_schemas, training_list
from saorl.rollout.episode import ChatCodec

SAMPLED = 8  # tasks of each split tokenized


def _prompts(spec: EnvSpec, tokenizer: Any) -> list[tuple[str, list[int], str]]:
    """(task key, prompt ids, prompt text) of up to SAMPLED tasks of each split."""
    codec = ChatCodec(tokenizer)
    tasks = [
        *training_list(spec.task)[:SAMPLED],
        *itertools.islice(spec.task.held_out, SAMPLED),
    ]
    out = []
    for task in tasks:
        env = spec.make_env()
        try:
            messages = asyncio.run(_opening(env, task))
        except Exception:  # the workers report it, with its traceback
            continue
        tools = tool_schemas(env)
        text = "".join(str(m.get("content", "")) for m in messages)
        out.append((task_key(task), codec.prompt_ids(messages, tools), text))
    return out


async def _opening(env: Any, task: Any) -> Any:
    """The opening messages of `task`; its episode then ended as the workers end one, so what
    the reset opened (an OpenEnv server's session) is released, not dropped with the loop (the
    server logged each dropped session as an error)."""
    try:
        return await env.reset(task)
    finally:
        if isinstance(env, EndsEpisodes):
            # It schedules the release on this loop: let it run before the loop closes.
            env.end_episode()
            await asyncio.sleep(0)
            pending = asyncio.all_tasks() - {asyncio.current_task()}
            if pending:
                await asyncio.wait(pending, timeout=10)


def check_prompts(cfg: Config, spec: EnvSpec, tokenizer: Any) -> None:
    """Raise (too long for the context) or warn (some too long, unknown characters)."""
    if cfg.env.name == "swe":
        return
    prompts = _prompts(spec, tokenizer)
    if not prompts:
        return
    limit = cfg.model.max_seq_len
    new = cfg.rollout.max_new_tokens
    key, ids, _ = max(prompts, key=lambda p: len(p[1]))
    over = [p for p in prompts if len(p[1]) >= limit]
    need = f"model.max_seq_len={len(ids) + new} (the prompt + rollout.max_new_tokens={new})"
    if len(over) * 2 > len(prompts):
        raise ConfigError(
            f"model.max_seq_len={limit}: {len(over)} of {len(prompts)} sampled prompts are longer "
            f"than the context (the longest, task {key}, is {len(ids)} tokens), so they "
            f"would train on empty rollouts; set {need}, or shorten the prompts"
        )
    if over:
        print(
            f"saorl: warning: {len(over)} of {len(prompts)} sampled prompts are longer than "
            f"model.max_seq_len={limit} (the longest, task {key}: {len(ids)} tokens); they "
            f"end at once, untrained; {need} fits them",
            file=sys.stderr,
        )
    unk = getattr(tokenizer, "unk_token_id", None)
    if unk is None:
        return
    for key, ids, text in prompts:
        if unk in ids:
            chars = sorted({c for c in text if tokenizer.convert_tokens_to_ids(c) == unk})
            hint = (
                " (the built-in model: model.builtin_newlines=true adds newline and tab)"
                if cfg.model.name_or_path.startswith("builtin")
                else ""
            )
            print(
                f"saorl: warning: the prompt of task {key} has characters the tokenizer "
                f"reads as {tokenizer.unk_token} ({', '.join(map(repr, chars[:8]))}){hint}",
                file=sys.stderr,
            )
            return
