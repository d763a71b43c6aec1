"""How agent programs' calls reach the engine: the `openai` client a Python agent gets is served
in-process (no HTTP), with the same record as over HTTP; calls of a wave of programs still
turning around are held and decoded together; a held call is not held for a program that does
not call."""

from __future__ import annotations

import asyncio

import pytest

from saorl.rollout.agents.asgi import EndpointApp
from tests.integration._endpoint_harness import run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_endpoint import TASK, _tok

openai = pytest.importorskip("openai")


class StepSizes:
    """Wraps an engine: how many requests each of its steps had."""

    def __init__(self, engine) -> None:
        self.engine, self.sizes = engine, []

    def __getattr__(self, name):
        return getattr(self.engine, name)

    def step(self):
        self.sizes.append(self.engine.num_unfinished())
        return self.engine.step()


def test_python_agents_are_served_in_process_with_the_record_of_http(monkeypatch):
    served_over_http = []
    serve = EndpointApp.__call__

    async def counting(self, scope, receive, send):
        served_over_http.append(scope["path"])
        return await serve(self, scope, receive, send)

    monkeypatch.setattr(EndpointApp, "__call__", counting)

    def agent(over_http: bool):
        async def run(task, client):
            if over_http:
                client = openai.AsyncOpenAI(
                    base_url=client.base_url, api_key=client.api_key, max_retries=0
                )
            msgs = [{"role": "user", "content": task["prompt"]}]
            r = await client.chat.completions.create(model="policy", messages=msgs)
            msgs += [r.choices[0].message.model_dump(exclude_none=True)]
            msgs += [{"role": "user", "content": "Sure?"}]
            r = await client.chat.completions.create(model="policy", messages=msgs, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in r if c.choices])
            return float(text == "42")

        return run

    tok = _tok()
    runs = {}
    for over_http in (False, True):
        engine = ScriptedEngine(tok, ["41", "42"])
        runs[over_http], _ = run_agents(engine, tok, [TASK], agent(over_http))
        assert len(served_over_http) == (2 if over_http else 0)
    (local,), (http,) = runs[False], runs[True]
    assert local.reward == http.reward == 1.0
    assert local.prompt_ids == http.prompt_ids
    assert local.completion_ids == http.completion_ids and local.loss_mask == http.loss_mask


def test_calls_of_a_wave_of_programs_start_in_one_engine_step():
    """The programs call one after the other (as a wave turning around on one event loop
    does); each call is held while the others are still on their way, so the engine prefills
    them together instead of starting the first alone."""
    tok, n = _tok(), 6
    engine = StepSizes(ScriptedEngine(tok, ["42"] * n))
    engine.max_concurrent = n

    async def agent(task, client):
        await asyncio.sleep(0.02 * int(task["key"]))
        r = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}]
        )
        return float(r.choices[0].message.content == "42")

    def slow_steps(worker):  # the hold ends on quiet only after a step's time: make it long
        worker.step_s = 30.0

    tasks = [{**TASK, "key": str(i)} for i in range(n)]
    trajs, _ = run_agents(engine, tok, tasks, agent, configure=slow_steps)
    assert len(trajs) == n and all(t.reward == 1.0 for t in trajs)
    assert engine.sizes == [n]


def test_a_call_is_not_held_for_a_program_that_waits_on_it():
    """One program calls; the other makes no call until the first has its answer. The first
    call is held at most about a step, then decoded: nothing deadlocks."""
    tok = _tok()
    engine = StepSizes(ScriptedEngine(tok, ["42", "43"]))
    answered = asyncio.Event()

    async def agent(task, client):
        if task["key"] == "1":
            await answered.wait()
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}]
        )
        answered.set()
        return 1.0

    tasks = [{**TASK, "key": str(i)} for i in range(2)]
    trajs, _ = run_agents(engine, tok, tasks, agent, timeout_s=20)
    assert len(trajs) == 2 and all(t.stop_reason != "env_error" for t in trajs)
    assert engine.sizes == [1, 1]
