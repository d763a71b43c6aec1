"""An agent written against the plain `openai` SDK, trained by saorl through its endpoint.

    saorl train --config examples/agent_openai.toml

saorl calls `run` once per episode with the task (a dict: here a reasoning-gym item's
`question`, `answer`, `key`, `dataset` and `metadata`) and an `openai.AsyncOpenAI` bound to
that episode. The agent does what it would do against any OpenAI-compatible server; every call
is sampled by the policy being trained, and the tokens are recorded for training
(docs/agents.md). It returns the reward, here with one extra metric (logged as
`agent/reply_chars`).
"""

from __future__ import annotations

from typing import Any


async def run(task: dict[str, Any], client: Any) -> dict[str, float]:
    reply = await client.chat.completions.create(
        model="policy",  # the name the training endpoint serves
        messages=[{"role": "user", "content": task["question"]}],
    )
    text = reply.choices[0].message.content or ""
    return {"reward": float(text.strip() == task["answer"]), "reply_chars": len(text)}
