"""The episodes of agent programs in one rollout worker (`env.name = "agent"`, docs/agents.md).

Each episode opens a session on the worker's `TrainingEndpoint`, runs the program (`env.run`, a
coroutine on the worker's environment event loop) against that session's base URL, and, when
the program returns its reward, hands the session's recorded segments to the worker's output
queue as trajectories. A program that raises, exits non-zero, gives no reward or runs past
`env.step_timeout_s` fails its episode (`env_error`, not trained on; the reason is counted in
`failures` and put in the trajectory's info, with the traceback of the program's own frames:
`saorl.rollout.failures`, whose log prints the first of each kind); the run goes on (unless
most of the first batch failed). Calls are counted here on their
way to the worker's engine, which holds them back while more of a wave are coming
(`admit_calls`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import threading
import time
from collections import Counter
from typing import Any

from saorl.envs.base import (
    AgentFailure,
    BindsTokenizer,
    ClosesPerWorker,
    DrivesModel,
    task_key,
)
from saorl.rollout.agents.records import AgentSession
from saorl.rollout.agents.server import TrainingEndpoint
from saorl.rollout.episode import Episode
from saorl.rollout.failures import failure_info

# The longest a call is held for others before it goes to the engine, in engine steps.
MAX_HOLD_STEPS = 8
_frozen = False


class AgentRuns:
    """Agent episodes in flight in `worker` and the endpoint they call."""

    def __init__(self, worker: Any, env: DrivesModel) -> None:
        global _frozen
        if not _frozen:
            # Agent SDKs allocate many short-lived objects per call, which makes the collector
            # run its full collections often; each would traverse the whole heap (the modules
            # of torch and transformers, the models), stopping every thread for up to a second
            # on a loaded machine. Most of what is alive now lives as long as the process, so
            # once per process it is moved out of the collector's sight (`gc.freeze`); the
            # price: what of it later becomes garbage in a reference cycle is never freed.
            gc.freeze()
            _frozen = True
        self.worker = worker
        limits = worker.limits
        self.endpoint = TrainingEndpoint(
            self._submit,
            worker.tokenizer,
            limits.max_seq_len,
            host=env.host,
            models=tuple(env.models),
            tool_format=env.tool_format,
            call_timeout_s=limits.env_timeout_s,
        )
        self.env = env
        if isinstance(env, BindsTokenizer):  # it renders its prompts itself (verifiers)
            env.bind_tokenizer(worker.tokenizer)
        self.pending: list[tuple[AgentSession, concurrent.futures.Future, float]] = []
        self.failures: Counter[str] = Counter()
        self._open = 0  # calls submitted and not answered
        self._open_lock = threading.Lock()
        self._first_queued: float | None = None  # the oldest call not yet admitted, if any
        self._last_event = 0.0  # the last call, answer, episode start or episode end
        # Command agents: at most this many episodes at once (0: no cap), as many as programs
        # may run (`rollout.max_agent_processes`, saorl.envs.agent_procs).
        self.procs = env.processes
        self.cap = 0
        if self.procs is not None:
            self.procs.set_max_processes(limits.max_agent_processes)
            self.cap = self.procs.max_processes()

    # -- calls ---------------------------------------------------------------------------------
    def _submit(
        self, prompt_ids: list[int], max_tokens: int | None, stop: list[str]
    ) -> concurrent.futures.Future:
        with self._open_lock:
            self._open += 1
            self._last_event = time.monotonic()
            if self._first_queued is None:
                self._first_queued = self._last_event
        future = self.worker.submit_call(prompt_ids, max_tokens, stop)
        future.add_done_callback(self._answered)
        return future

    def _answered(self, _: concurrent.futures.Future) -> None:
        with self._open_lock:
            self._open -= 1
            self._last_event = time.monotonic()

    def between_calls(self) -> int:
        """Live episodes with no call submitted: their programs are starting, turning a reply
        around, running a tool, or finishing."""
        return len(self.pending) - self._open

    def admit_calls(self) -> bool:
        """Whether the worker should move the calls queued for its engine into it now.

        Queued calls are held while more are on their way: programs are between calls and the
        last call, answer, episode start or episode end came less than one engine step ago
        (`worker.step_s`), for at most
        `MAX_HOLD_STEPS` steps. When a wave of episodes ends together (the engine finished
        their turns in one step), their programs turn around one after the other on the agents'
        event loop; admitted as they come, the first few would start decoding alone and each
        later one would cost a prefill forward of its own at the next steps, and the episodes
        would stay out of step with each other from then on. Held, they are prefilled and
        decoded together, as the in-process agent loop's turns are. Running rows keep decoding
        meanwhile; a held call waits about one step longer than it would have."""
        with self._open_lock:
            first = self._first_queued
            last = self._last_event
            if first is None:
                return True
            now = time.monotonic()
            step = self.worker.step_s
            if (
                self.between_calls() > 0
                and now - last < step
                and now - first < MAX_HOLD_STEPS * step
            ):
                return False
            self._first_queued = None
            return True

    def start(self, env: Any, task: Any, group_id: int) -> None:
        self._last_event = time.monotonic()
        session = self.endpoint.open(task, group_id)
        self.worker.episodes[id(session)] = session  # `.task`, `.group_id` for snapshots
        url = self.endpoint.base_url(session)
        coro = env.run(
            task,
            url,
            session.key,
            session.conversation,
            worker=self.worker.name,
            local=self.endpoint.local_client,
        )
        future = self.worker._env_call(env, coro)
        future.add_done_callback(lambda _: self.worker._wake.set())
        self.pending.append((session, future, time.monotonic() + self.worker.limits.env_timeout_s))

    def busy(self) -> bool:
        return bool(self.pending)

    def describe(self) -> str:
        """The oldest episode's age and what the programs' processes are doing."""
        limit = self.worker.limits.env_timeout_s
        now = time.monotonic()
        ages = [now - (deadline - limit) for _, _, deadline in self.pending]
        text = f", the oldest for {max(ages):.0f} s" if ages else ""
        return text + (f"; {self.procs.status(self.worker._bg_loop)}" if self.procs else "")

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
            except Exception as e:  # the program's own error: its frames name its file:line
                self._fail(session, "raised", "", failure_info("agent", e))
                continue
            trajs = session.trajectories(reward, metrics, task_key(session.task))
            if not trajs:
                self._fail(session, "no_calls", "agent: returned without calling the model")
                continue
            self._finish(session, trajs)
        self.pending = still

    def _fail(
        self, session: AgentSession, reason: str, message: str, info: dict | None = None
    ) -> None:
        """Fail the episode. `info`: `failure_info`'s, for an error the program raised; else
        the failure is grouped by its kind (`agent: timeout`, `agent: exit`, ...), whatever
        its message. Printed by the collector's `FailureLog` (and `saorl eval`'s), not here."""
        self.failures[reason] += 1
        ep = Episode(None, session.task, [], [], group_id=session.group_id)  # type: ignore[arg-type]
        group = {"error": message, "error_group": f"agent: {reason}", "error_source": "agent"}
        ep.info.update({**group, **(info or {}), "agent/failure": reason})
        self._finish(session, [ep.finish("env_error", key=task_key(session.task))])

    def _finish(self, session: AgentSession, trajs: list[Any]) -> None:
        self._last_event = time.monotonic()
        self.endpoint.close_session(session)
        self.worker.active -= 1
        self.worker.episodes.pop(id(session), None)
        for t in trajs:
            self.worker.out.put(t)

    def close(self) -> None:
        for _, future, _ in self.pending:
            future.cancel()
        # Now, not when the cancelled episodes next run on their loop (which may be stopping).
        if self.procs is not None:
            self.procs.kill_groups(self.worker._bg_loop)
        if isinstance(self.env, ClosesPerWorker):  # verifiers' runner process
            with contextlib.suppress(Exception):
                self.worker._env_call(self.env, self.env.aclose()).result(timeout=30)
        self.endpoint.shutdown()
