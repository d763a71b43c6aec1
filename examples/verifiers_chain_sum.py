"""A verifiers 0.4 taskset built from an in-memory list of reasoning-gym items (chain_sum):
each task's prompt is the item's question; its rubric is the item's own `score_answer` (reward
`correct`, weight 1) and a metric, the length of the reply. Trained by
examples/verifiers_chain_sum.toml (docs/verifiers.md); verifiers loads it by its path
(env.verifiers.taskset), or by its module name once installed or on the import path."""

from __future__ import annotations

import reasoning_gym
import verifiers.v1 as vf
from pydantic import Field

__all__ = ["ChainSumTaskset"]


class ChainSumData(vf.TaskData):
    entry: dict = Field(default_factory=dict)  # the reasoning-gym item its scorer reads


class ChainSumTask(vf.Task[ChainSumData]):
    @vf.reward(weight=1.0)
    async def correct(self, task: ChainSumData, trace: vf.Trace) -> float:
        score = reasoning_gym.get_score_answer_fn(task.entry["metadata"]["source_dataset"])
        return float(score(trace.last_reply, task.entry))

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class ChainSumConfig(vf.TasksetConfig):
    size: int = 12
    seed: int = 7


class ChainSumTaskset(vf.Taskset[ChainSumTask, ChainSumConfig]):
    def load(self) -> list[ChainSumTask]:
        cfg = self.config
        items = reasoning_gym.create_dataset("chain_sum", size=cfg.size, seed=cfg.seed)
        return [
            ChainSumTask(ChainSumData(prompt=e["question"], entry=e), self.config.task)
            for e in items
        ]
