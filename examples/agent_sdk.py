"""An agent written with the OpenAI Agents SDK (`pip install 'saorl[agents]'`), trained by saorl.

    saorl train --config examples/agent_sdk.toml

The SDK's chat-completions model is pointed at the episode's client; tracing (which would
send spans to OpenAI) is off. The agent returns no reward: the task source's own environment
(`env.agent.tasks`: reasoning-gym, with the dataset's own scorer) grades its last reply.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

set_tracing_disabled(True)


async def run(task: dict[str, Any], client: Any) -> None:
    model = OpenAIChatCompletionsModel(model="policy", openai_client=client)
    agent = Agent(name="adder", model=model)
    await Runner.run(agent, task["question"], max_turns=2)
