"""Run agent programs through a real rollout worker and its real training endpoint, and collect
what the worker emitted (shared by the endpoint and agent-program tests)."""

from __future__ import annotations

import queue
import time
from typing import Any

from saorl.config import EnvConfig
from saorl.engines.protocol import Completion
from saorl.envs.agent import AgentProgram
from saorl.rollout.worker import AgentLimits, FixedFeed, RolloutWorker


class Recording:
    """Wraps an engine: every completion it hands back is kept, to compare with the record."""

    def __init__(self, engine: Any) -> None:
        self.engine, self.completions = engine, []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def step(self) -> list[Completion]:
        done = self.engine.step()
        self.completions.extend(done)
        return done


def run_agents(
    engine: Any,
    tok: Any,
    tasks: list[Any],
    fn: Any = None,
    *,
    command: str = "",
    grader: Any = None,
    scorer: Any = None,
    max_seq_len: int = 4096,
    max_new_tokens: int = 200,
    timeout_s: float = 60.0,
    tool_format: str = "hermes",
    make_env: Any = None,
    configure: Any = None,
) -> tuple[list[Any], RolloutWorker]:
    """Every trajectory the worker emits for `tasks` (one episode each), and the worker.
    `make_env`: the programs' factory (an EnvSpec's), instead of an AgentProgram of `fn` or
    `command`; `configure(worker)` runs before it starts."""
    cfg = EnvConfig(tool_format=tool_format, step_timeout_s=timeout_s, agent={"command": command})
    feed = FixedFeed(list(tasks))
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(
        max_seq_len=max_seq_len, max_new_tokens=max_new_tokens, env_timeout_s=timeout_s
    )
    make_env = make_env or (lambda: AgentProgram(cfg, fn, grader, scorer))
    worker = RolloutWorker(engine, feed, tok, out, make_env, limits)
    if configure is not None:
        configure(worker)
    worker.start()
    deadline = time.monotonic() + timeout_s + 30
    while (feed.items or worker.active) and time.monotonic() < deadline:
        if worker.error is not None:
            raise worker.error
        time.sleep(0.01)
    worker.stop_thread()
    assert not feed.items and worker.active == 0, "episodes did not finish"
    trajs = []
    while not out.empty():
        trajs.append(out.get_nowait())
    return trajs, worker
