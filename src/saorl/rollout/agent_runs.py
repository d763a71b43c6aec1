"""The episodes of agent programs in one rollout worker (`env.name = "agent"`, docs/agents.md).

Each episode opens a session on the worker's `TrainingEndpoint`, runs the program (`env.run`, a
coroutine on the worker's environment event loop) against that session's base URL, and, when
the program returns its reward, hands the session's recorded segments to the worker's output
queue as trajectories. A program that raises, exits non-zero, gives no reward or runs past
`env.step_timeout_s` fails its episode (`env_error`, not trained on; the reason is counted in
`failures` and put in the trajectory's info); the run goes on.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import sys
import time
from collections import Counter
from typing import Any

from saorl.envs.base import task_key
from saorl.rollout.agent import Episode
from saorl.rollout.agent_record import AgentSession
from saorl.rollout.endpoint import TrainingEndpoint


class AgentFailure(Exception):
    """An agent program failed its episode; `reason` is the counted kind."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class AgentRuns:
    """Agent episodes in flight in `worker` and the endpoint they call."""

    def __init__(self, worker: Any, env: Any) -> None:
        self.worker = worker
        limits = worker.limits
        self.endpoint = TrainingEndpoint(
            worker.submit_call,
            worker.tokenizer,
            limits.max_seq_len,
            host=getattr(env, "host", "127.0.0.1"),
            models=tuple(getattr(env, "models", ("policy",))),
            tool_format=getattr(env, "tool_format", "hermes"),
            call_timeout_s=limits.env_timeout_s,
        )
        self.env = env
        bind = getattr(env, "bind_tokenizer", None)
        if bind is not None:  # a program that renders its prompts itself (verifiers)
            bind(worker.tokenizer)
        self.pending: list[tuple[AgentSession, concurrent.futures.Future, float]] = []
        self.failures: Counter[str] = Counter()

    def start(self, env: Any, task: Any, group_id: int) -> None:
        session = self.endpoint.open(task, group_id)
        self.worker.episodes[id(session)] = session  # `.task`, `.group_id` for snapshots
        url = self.endpoint.base_url(session)
        coro = env.run(task, url, session.key, session.conversation, worker=self.worker.name)
        future = self.worker._env_call(env, coro)
        self.pending.append((session, future, time.monotonic() + self.worker.limits.env_timeout_s))

    def busy(self) -> bool:
        return bool(self.pending)

    def drain(self) -> None:
        still = []
        for session, future, deadline in self.pending:
            if not future.done():
                if time.monotonic() < deadline:
                    still.append((session, future, deadline))
                    continue
                future.cancel()  # a command agent's process is killed on cancellation
                limit = self.worker.limits.env_timeout_s
                self._fail(session, "timeout", f"agent: ran past {limit:g} s (env.step_timeout_s)")
                continue
            try:
                reward, metrics = future.result()
            except AgentFailure as e:
                self._fail(session, e.reason, f"agent: {e}")
                continue
            except Exception as e:
                self._fail(session, "raised", f"agent: {type(e).__name__}: {e}")
                continue
            trajs = session.trajectories(reward, metrics, task_key(session.task))
            if not trajs:
                self._fail(session, "no_calls", "agent: returned without calling the model")
                continue
            self._finish(session, trajs)
        self.pending = still

    def _fail(self, session: AgentSession, reason: str, message: str) -> None:
        self.failures[reason] += 1
        if self.failures[reason] == 1:  # once per kind: rollout/failed counts every one
            print(
                f"saorl: {self.worker.name}: an agent episode failed ({reason}): {message}",
                file=sys.stderr,
            )
        ep = Episode(None, session.task, [], [], group_id=session.group_id)  # type: ignore[arg-type]
        ep.info.update({"error": message, "agent/failure": reason})
        self._finish(session, [ep.finish("env_error", key=task_key(session.task))])

    def _finish(self, session: AgentSession, trajs: list[Any]) -> None:
        self.endpoint.close_session(session)
        self.worker.active -= 1
        self.worker.episodes.pop(id(session), None)
        for t in trajs:
            self.worker.out.put(t)

    def close(self) -> None:
        for _, future, _ in self.pending:
            future.cancel()
        aclose = getattr(self.env, "aclose", None)
        if aclose is not None:  # what the program keeps per worker (verifiers' runner process)
            with contextlib.suppress(Exception):
                self.worker._env_call(self.env, aclose()).result(timeout=30)
        self.endpoint.shutdown()
