"""A verifiers taskset with a tool: sums to work out with an `add` tool served by a
`vf.Toolset` (an MCP server verifiers starts per episode with this module as its program).
Rubric: reward `correct` (the sum is in the reply, weight 1); metric `tool_calls`."""

from __future__ import annotations

import random

import verifiers.v1 as vf

__all__ = ["AddTaskset"]


class AddToolset(vf.Toolset[vf.ToolsetConfig]):
    TOOL_PREFIX = "calc"

    @vf.tool
    def add(self, a: int, b: int) -> str:
        """Add two integers."""
        return str(a + b)


class AddData(vf.TaskData):
    answer: int = 0


class AddTaskConfig(vf.TaskConfig):
    tools: vf.ToolsetConfig = vf.ToolsetConfig()


class AddTask(vf.Task[AddData, vf.State, AddTaskConfig]):
    @classmethod
    def toolsets(cls, config: AddTaskConfig) -> list[vf.Toolset]:
        return [AddToolset(config.tools)]

    @vf.reward(weight=1.0)
    async def correct(self, task: AddData, trace: vf.Trace) -> float:
        return float(str(task.answer) in trace.last_reply)

    @vf.metric
    async def tool_calls(self, trace: vf.Trace) -> float:
        return float(len(trace.tool_messages))


class AddConfig(vf.TasksetConfig):
    task: AddTaskConfig = AddTaskConfig()
    size: int = 8


class AddTaskset(vf.Taskset[AddTask, AddConfig]):
    def load(self) -> list[AddTask]:
        rng = random.Random(0)
        pairs = [(rng.randint(10, 99), rng.randint(10, 99)) for _ in range(self.config.size)]
        return [
            AddTask(AddData(prompt=f"Use the add tool: {a}+{b}?", answer=a + b), self.config.task)
            for a, b in pairs
        ]


if __name__ == "__main__":  # the tool server's program
    AddToolset.run()
