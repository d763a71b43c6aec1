"""Rollout worker: keeps an engine busy with episodes of fresh prompts.

The worker fills the engine up to `max_concurrent` running sequences, runs decoding steps, and
drives each episode (`saorl.rollout.episode`): a finished model turn goes to the environment; the
environment either ends the episode (a scored `Trajectory` goes to the output queue) or answers
with observations, which are appended before the next turn is queued on the same engine. It never
waits for a group: a trajectory is ready for the learner the moment its own episode ends.

Environment steps that do real work (a sandboxed tool call) run on an event loop in a helper
thread so decoding goes on meanwhile; cheap ones (`env.offload = False`, e.g. grading a sum)
run inline, which keeps single-turn runs deterministic.

What an environment declared of the optional protocols (`saorl.envs.base`: `HasOffload`,
`HasTools`, `EndsEpisodes`, `HasRoom`, `DrivesModel`) is read once, when the worker makes it
(`EnvTraits.of`); an agent program's episodes go to `AgentRuns`, every other one is stepped
here.

Admission control: `saorl.rollout.feed` (`PromptFeed`; `FixedFeed` for evaluation).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import queue
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from saorl.engines.protocol import Completion, Engine, GenerationRequest
from saorl.envs.base import Env, EnvBusy, EnvTraits, StepResult, task_key, tool_schemas
from saorl.rollout.episode import ChatCodec, Episode
from saorl.rollout.failures import failure_info
from saorl.rollout.feed import FixedFeed as FixedFeed  # re-exported
from saorl.rollout.feed import PromptFeed as PromptFeed
from saorl.types import Trajectory

# `tool_status` values of a tool call the env could not run as written.
BAD_CALLS = ("malformed", "unknown_tool")


@dataclass
class AgentLimits:
    """Per-episode budgets (tokens are counted on the whole sequence, prompt included)."""

    max_seq_len: int
    max_new_tokens: int  # per model turn
    max_turns: int = 1
    max_tool_calls: int = 0
    stop: tuple[str, ...] = ()
    greedy: bool = False  # evaluation: argmax decoding instead of sampling
    env_timeout_s: float = 600.0  # an environment reset/step that takes longer fails the episode
    # `rollout.score_truncated`: a turn cut at its token budget or the context still goes to
    # the env's step (its reward functions score it), then the episode ends.
    score_truncated: bool = False
    # Benchmarks (`rollout.forced_length`): each turn generates exactly this many tokens
    # (clamped to the budget and context), EOS suppressed; None = the model decides.
    forced_length: Callable[[], int] | None = None
    # `rollout.max_agent_processes`: command agents running at once (0 = twice the cores)
    max_agent_processes: int = 0


class NoAgents:
    """The agent programs' side of a worker that runs none: no endpoint, no calls held."""

    cap = 0  # no cap of its own on the episodes at once

    def admit_calls(self) -> bool:
        return True

    def drain(self) -> None:
        pass

    def busy(self) -> bool:
        return False

    def describe(self) -> str:
        return ""

    def close(self) -> None:
        pass


async def _settle(timeout_s: float) -> None:
    """Wait (at most `timeout_s`) for the other tasks of this event loop."""
    others = asyncio.all_tasks() - {asyncio.current_task()}
    if others:
        await asyncio.wait(others, timeout=timeout_s)


class RolloutWorker:
    """Keeps one engine full of episodes from a shared `PromptFeed`.

    Several workers (one engine each) may share a feed and an output queue. `make_env` builds
    a fresh environment for each episode.
    """

    def __init__(
        self,
        engine: Engine,
        feed: PromptFeed | FixedFeed,
        tokenizer: Any,
        out: queue.Queue[Trajectory],
        make_env: Callable[[], Env],
        limits: AgentLimits,
        *,
        name: str = "rollout-worker",
    ) -> None:
        self.engine = engine
        self.feed = feed
        self.tokenizer = tokenizer
        self.codec = ChatCodec(tokenizer)
        self.out = out
        self.make_env = make_env
        self.limits = limits
        self.name = name
        self.idle_s = 0.0
        self.error: BaseException | None = None
        self.active = 0  # episodes started and not yet finished
        self.episodes: dict[int, Episode] = {}  # the same episodes, for checkpoint snapshots
        self._pause = threading.Event()
        self._parked = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._requests = 0
        self._inline_loop = asyncio.new_event_loop()
        self._bg_loop: asyncio.AbstractEventLoop | None = None
        self._pending: list[tuple[Episode, Completion, concurrent.futures.Future, float]] = []
        # Agent programs (`env.name = "agent"`): their episodes and the endpoint they call
        # (`AgentRuns`), built with the first one; their calls (from its HTTP threads or the
        # agents' event loop) wait here for this thread.
        self.agents: Any = NoAgents()
        self.traits: dict[int, EnvTraits] = {}  # of each stepped episode's env, by id(episode)
        self.room: Callable[[], int | None] | None = None  # an env's free places (`EnvBusy`)
        self._calls: queue.SimpleQueue[GenerationRequest] = queue.SimpleQueue()
        self._wake = threading.Event()  # a call queued or an agent program done
        self.step_s = 0.02  # recent engine step time (moving average): agent calls' hold

    # -- episodes ----------------------------------------------------------------------------
    def _env_call(self, env: Env, coro: Any, inline: bool = False) -> concurrent.futures.Future:
        """Run `coro`, a call of `env`'s: `inline` (its traits: `offload = False`) on this
        thread, else (undeclared, and agent programs: `AgentRuns`) on the helper loop."""
        if inline:
            fut: concurrent.futures.Future = concurrent.futures.Future()
            try:
                # An awaiting hang times out here; a CPU-bound one cannot (inline envs must be
                # cheap; anything that can hang belongs on the offload loop).
                timed = asyncio.wait_for(coro, self.limits.env_timeout_s)
                fut.set_result(self._inline_loop.run_until_complete(timed))
            except Exception as e:  # the environment's failure ends that episode, not the run
                fut.set_exception(e)
            return fut
        if self._bg_loop is None:
            self._bg_loop = asyncio.new_event_loop()
            threading.Thread(
                target=self._bg_loop.run_forever, name=f"{self.name}-env", daemon=True
            ).start()
        return asyncio.run_coroutine_threadsafe(coro, self._bg_loop)

    def _submit(self, ep: Episode) -> None:
        room = self.limits.max_seq_len - len(ep.ids)
        budget = min(self.limits.max_new_tokens, room)
        forced = 0
        if self.limits.forced_length is not None:
            budget = forced = min(self.limits.forced_length(), budget)
        self._requests += 1
        self.engine.add_request(
            GenerationRequest(
                prompt_ids=ep.ids,
                max_new_tokens=budget,
                request_id=self._requests,
                stop=list(self.limits.stop),
                greedy=self.limits.greedy,
                payload=ep,
                min_new_tokens=forced,
            )
        )

    def submit_call(
        self, prompt_ids: list[int], max_tokens: int | None, stop: list[str]
    ) -> concurrent.futures.Future:
        """An endpoint call (from any thread): queued for this worker's engine; the future
        resolves to its `Completion`. Budget: `max_tokens`, capped like a turn's."""
        room = self.limits.max_seq_len - len(prompt_ids)
        budget = min(max_tokens or self.limits.max_new_tokens, self.limits.max_new_tokens, room)
        forced = 0
        if self.limits.forced_length is not None:  # benchmarks: the same lengths as env turns
            budget = forced = min(self.limits.forced_length(), budget)
        future: concurrent.futures.Future = concurrent.futures.Future()
        request = GenerationRequest(
            prompt_ids=list(prompt_ids),
            max_new_tokens=budget,
            stop=list(stop),
            greedy=self.limits.greedy,
            payload=future,
            min_new_tokens=forced,
        )
        self._calls.put(request)
        self._wake.set()
        return future

    def _start_episode(self, task: Any, group_id: int = -1) -> None:
        env = self.make_env()
        traits = EnvTraits.of(env)
        self.room = traits.room
        self.active += 1
        if traits.drives_model:  # an agent program: it calls the endpoint
            if isinstance(self.agents, NoAgents):
                from saorl.rollout.agents.runs import AgentRuns

                self.agents = AgentRuns(self, env)
            return self.agents.start(env, task, group_id)
        try:
            fut = self._env_call(env, env.reset(task), traits.inline)
            messages = fut.result(timeout=self.limits.env_timeout_s)
        except TimeoutError:
            fut.cancel()
            ep = self._episode(env, traits, task, group_id)
            ep.info["error"] = f"reset: timed out after {self.limits.env_timeout_s:g} s"
            return self._emit(ep, "env_error")
        except EnvBusy:  # no room on its server now: the task is handed out again later
            self.active -= 1
            return self.feed.reissue([(task, group_id)])
        except Exception as e:
            ep = self._episode(env, traits, task, group_id)
            ep.info.update(failure_info("reset", e))
            return self._emit(ep, "env_error")
        tools = tool_schemas(env)  # for the template
        ids = self.codec.prompt_ids(messages, tools)
        ep = self._episode(env, traits, task, group_id, list(messages), ids, tools)
        self.episodes[id(ep)] = ep
        if len(ep.prompt_ids) >= self.limits.max_seq_len:
            ep.info["error"] = f"prompt of {len(ep.prompt_ids)} tokens fills the context"
            return self._emit(ep, "context")
        self._submit(ep)

    def _episode(
        self,
        env: Env,
        traits: EnvTraits,
        task: Any,
        group_id: int,
        messages: list | None = None,
        ids: list[int] | None = None,
        tools: list[dict] | None = None,
    ) -> Episode:
        """A stepped episode (empty: one that failed to start), its env's traits kept for its
        steps and its end."""
        ep = Episode(env, task, messages or [], ids or [], group_id=group_id, tools=tools)
        self.traits[id(ep)] = traits
        return ep

    def _emit(self, ep: Episode, reason: str) -> None:
        self.active -= 1
        self.episodes.pop(id(ep), None)
        end = self.traits.pop(id(ep)).end_episode
        if end is not None:  # e.g. an OpenEnv session: closed with its episode, however
            with contextlib.suppress(Exception):  # a failed cleanup does not end the run
                end()
        self.out.put(ep.finish(reason, key=task_key(ep.task)))

    def _on_turn(self, c: Completion) -> None:
        if isinstance(c.request.payload, concurrent.futures.Future):  # an endpoint call
            if not c.request.payload.done():  # not cancelled by its episode's end
                c.request.payload.set_result(c)
            return
        ep: Episode = c.request.payload
        ep.add_turn(list(c.token_ids), list(c.logprobs), list(c.versions), c.routing)
        if c.finish_reason == "aborted":
            return self._emit(ep, "aborted")
        if c.finish_reason == "length":
            full = len(ep.ids) >= self.limits.max_seq_len
            ep.cut = "context" if full else "length"
            if not self.limits.score_truncated:
                return self._emit(ep, ep.cut)
        text = self.tokenizer.decode(c.token_ids, skip_special_tokens=True)
        ep.conversation.append({"role": "assistant", "content": text})
        deadline = time.monotonic() + self.limits.env_timeout_s
        future = self._env_call(ep.env, ep.env.step(text), self.traits[id(ep)].inline)
        self._pending.append((ep, c, future, deadline))

    def _on_env_result(self, ep: Episode, c: Completion, result: StepResult) -> None:
        ep.reward += result.reward
        ep.info.update(result.info)
        ep.tool_calls += int(bool(result.info.get("tool_call")))
        # A call the env could not run as written (bad JSON, an unknown tool): counted, so a
        # run shows whether its model learns the call format (`rollout/tool_calls_bad_frac`).
        if result.info.get("tool_status") in BAD_CALLS:
            ep.info["tool_calls_bad"] = ep.info.get("tool_calls_bad", 0) + 1
        if ep.cut:  # scored as it stands (score_truncated); the model cannot go on
            return self._emit(ep, ep.cut)
        if result.done:
            return self._emit(ep, "answer")
        if ep.turns >= self.limits.max_turns:
            return self._emit(ep, "max_turns")
        if ep.tool_calls > self.limits.max_tool_calls:
            return self._emit(ep, "max_tool_calls")
        obs = self.codec.observation_ids(
            ep.conversation, list(c.token_ids), result.observations, ep.tools
        )
        # Room for the observation and at least one model token, or the episode ends here.
        if len(ep.ids) + len(obs) + 1 > self.limits.max_seq_len:
            return self._emit(ep, "context")
        ep.add_observation(obs)
        ep.conversation.extend(result.observations)
        self._submit(ep)

    def _drain_env_results(self) -> None:
        still = []
        for ep, c, fut, deadline in self._pending:
            if not fut.done():
                if time.monotonic() < deadline:
                    still.append((ep, c, fut, deadline))
                    continue
                # A hung tool or environment fails its own episode, not the run.
                fut.cancel()
                ep.info["error"] = f"step: timed out after {self.limits.env_timeout_s:g} s"
                self._emit(ep, "env_error")
                continue
            try:
                result = fut.result()
            except Exception as e:
                ep.info.update(failure_info("step", e))
                self._emit(ep, "env_error")
                continue
            self._on_env_result(ep, c, result)
        self._pending = still

    # -- driving the engine -------------------------------------------------------------------
    def fill(self) -> None:
        """Start as many new episodes as the engine has room for and admission allows."""
        while self.active < self.limits_concurrency():
            item = self.feed.next()
            if item is None:
                return
            self._start_episode(*item)

    def limits_concurrency(self) -> int:
        caps = [self.engine.max_concurrent]
        if self.agents.cap:  # command agents' processes
            caps.append(self.agents.cap)
        room = self.room() if self.room is not None else None
        if room is not None:  # the free places of the env's server (OpenEnv sessions)
            caps.append(self.active + room)
        return min(caps)

    def describe(self) -> str:
        """What its episodes are doing, for a run that waits long for a batch."""
        text = f"{self.name}: {self.active} episodes in flight"
        return text + self.agents.describe()

    def step(self) -> int:
        """One decoding step and any finished environment steps; returns turns finished."""
        if self.agents.admit_calls():  # endpoint calls join the batch
            while not self._calls.empty():
                self._requests += 1
                request = self._calls.get()
                request.request_id = self._requests
                self.engine.add_request(request)
        done: list[Completion] = []
        if self.engine.num_unfinished():
            t0 = time.perf_counter()
            done = self.engine.step()
            self.step_s += 0.2 * (time.perf_counter() - t0 - self.step_s)
        for c in done:
            self._on_turn(c)
        self._drain_env_results()
        self.agents.drain()
        return len(done)

    def busy(self) -> bool:
        return self.engine.num_unfinished() > 0 or bool(self._pending) or self.agents.busy()

    # -- background thread ------------------------------------------------------------------
    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._pause.is_set():
                    self._parked.set()
                    time.sleep(0.002)
                    continue
                self._parked.clear()
                self.fill()
                if not self.busy():
                    # Admission says wait: sleep until the learner consumes a batch.
                    t0 = time.perf_counter()
                    with self.feed.cond:
                        self.feed.cond.wait(timeout=0.05)
                    self.idle_s += time.perf_counter() - t0
                    continue
                held = not self.agents.admit_calls()
                if self.engine.num_unfinished() == 0 and (held or self._calls.empty()):
                    # Nothing to decode: environment steps, agent programs or held calls.
                    self._wake.wait(0.001)
                    self._wake.clear()
                self.step()
        except BaseException as e:  # surfaced to the learner thread, which re-raises
            self.error = e

    def in_flight(self) -> list[tuple[Any, int]]:
        """`(task, group id)` of every episode started and not finished (call while paused)."""
        return [(ep.task, ep.group_id) for ep in self.episodes.values()]

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Hold the worker thread between two steps (for a consistent checkpoint snapshot)."""
        if self._thread is None or not self._thread.is_alive():
            yield
            return
        self._parked.clear()
        self._pause.set()
        try:
            if not self._parked.wait(timeout=60):
                raise RuntimeError(f"{self.name} did not pause within 60 s for a checkpoint")
            yield
        finally:
            self._pause.clear()

    def stop_thread(self) -> None:
        self._stop.set()
        with self.feed.cond:
            self.feed.cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout=30)
        self.agents.close()
        if self._bg_loop is not None:
            if self._bg_loop.is_running():  # what episodes' ends scheduled (closing sessions)
                with contextlib.suppress(Exception):
                    asyncio.run_coroutine_threadsafe(_settle(5.0), self._bg_loop).result(10)
            self._bg_loop.call_soon_threadsafe(self._bg_loop.stop)
