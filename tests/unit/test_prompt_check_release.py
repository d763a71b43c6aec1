"""The prompt check before step 1 resets a few tasks: each episode it opens is ended as the
rollout workers end one (`end_episode`), so a server session (OpenEnv's) is closed, not dropped
with the check's event loop (the server logged every dropped session as an error)."""

from __future__ import annotations

import asyncio
from typing import ClassVar

from saorl.config import load_config
from saorl.envs.base import EnvSpec, StepResult, TaskList
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.prompt_check import check_prompts


class _SessionEnv:
    """Holds a session from reset on; `end_episode` closes it on the loop that owns it, later,
    as OpenEnvEnv does (the close itself awaits the server)."""

    opened: ClassVar[list[int]] = []
    closed: ClassVar[list[int]] = []

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.task = -1

    async def reset(self, task: int) -> list[dict]:
        self.loop, self.task = asyncio.get_running_loop(), task
        self.opened.append(task)
        return [{"role": "user", "content": f"task {task}"}]

    async def step(self, action_text: str) -> StepResult:
        return StepResult(done=True)

    def end_episode(self) -> None:
        loop = self.loop
        assert loop is not None
        loop.call_soon_threadsafe(lambda: loop.create_task(self._close()))

    async def _close(self) -> None:
        await asyncio.sleep(0.01)  # the server's answer to `close`
        self.closed.append(self.task)


def test_every_session_the_check_opens_is_closed() -> None:
    cfg = load_config(None, ["model.max_seq_len=256", "rollout.max_new_tokens=16"])
    spec = EnvSpec(TaskList(range(10), range(100, 103)), _SessionEnv)
    check_prompts(cfg, spec, build_char_tokenizer(with_newlines=True))
    assert len(_SessionEnv.opened) == 8 + 3  # SAMPLED training tasks and the held-out ones
    assert sorted(_SessionEnv.closed) == sorted(_SessionEnv.opened)
