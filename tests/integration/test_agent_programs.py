"""Agent programs through the endpoint: a tiny real model's record checked against its engine
and the learner's log-prob computation, the OpenAI Agents SDK with a function tool, command
agents (any language: stdin, environment variables, last stdout line), and every way an agent
can fail its episode while the run goes on: the first failure of each kind shown with the
program's own file:line, a forgotten `return` said once."""

from __future__ import annotations

import json
import sys
import textwrap

import pytest
import torch

from saorl.engines.hf import HFEngine
from saorl.engines.protocol import EngineSettings
from saorl.envs.arithmetic import ArithmeticEnv, Problem
from saorl.models.logprobs import sequence_logprobs
from tests.integration._endpoint_harness import Recording, run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_endpoint import CALL, TASK, TOOLS, _tok

openai = pytest.importorskip("openai")


def test_tiny_model_record_equals_what_the_engine_sampled(tiny_policy):
    model, tok = tiny_policy  # char tokenizer, no chat template: messages are plain text
    engine = Recording(
        HFEngine(model, tok, EngineSettings(max_seq_len=64, temperature=1.0, max_concurrent=4))
    )
    replies: list = []

    async def agent(task, client):
        msgs = [{"role": "user", "content": task["prompt"]}]
        for follow_up in ("?", "!"):
            r = await client.chat.completions.create(
                model="policy", messages=msgs, max_tokens=5, logprobs=True
            )
            replies.append(r.choices[0])
            msgs += [
                r.choices[0].message.model_dump(exclude_none=True),
                {"role": "user", "content": follow_up},
            ]
        return 0.25

    tasks = [Problem(f"{a}+{b}=", str(a + b), f"p{a}") for a, b in ((12, 34), (7, 8), (99, 1))]
    trajs, _ = run_agents(engine, tok, tasks, agent, max_seq_len=64, max_new_tokens=5)

    assert len(trajs) == 3 and len(engine.completions) == 6
    by_prompt = {tuple(c.request.prompt_ids): c for c in engine.completions}
    for traj in trajs:
        assert traj.info["agent/segments"] == 1 and traj.info["agent/calls"] == 2
        assert traj.info["agent/retokenize_mismatch"] == 0 and traj.reward == 0.25
        first = by_prompt[tuple(traj.prompt_ids)]
        n1 = len(first.token_ids)
        # The observation is exactly the text of the follow-up message ...
        obs = tok.encode("?", add_special_tokens=False)
        second = by_prompt[tuple(traj.prompt_ids + first.token_ids + obs)]
        # ... and every model token is the engine's own, with its log-prob and version.
        assert traj.completion_ids == first.token_ids + obs + second.token_ids
        assert traj.loss_mask == [1] * n1 + [0] * len(obs) + [1] * len(second.token_ids)
        assert traj.rollout_logprobs == first.logprobs + [0.0] * len(obs) + second.logprobs
        # The learner's log-probs of the same tokens under the same weights match.
        ids = torch.tensor([traj.prompt_ids + traj.completion_ids])
        lp = sequence_logprobs(model, ids, torch.ones_like(ids), temperature=1.0)[0]
        mask = torch.tensor(traj.loss_mask, dtype=torch.bool)
        recomputed = lp[len(traj.prompt_ids) :][mask]
        torch.testing.assert_close(
            recomputed, torch.tensor(traj.rollout_logprobs)[mask], atol=1e-4, rtol=0
        )
    # What the client was sent is what was recorded.
    sent = sorted(lp.logprob for r in replies for lp in r.logprobs.content)
    recorded = sorted(lp for c in engine.completions for lp in c.logprobs)
    assert sent == recorded


def test_openai_agents_sdk_with_a_function_tool(monkeypatch):
    agents = pytest.importorskip("agents")
    monkeypatch.setenv("OPENAI_AGENTS_DISABLE_TRACING", "1")
    tok = _tok()
    engine = Recording(ScriptedEngine(tok, [CALL, "The sum is 42."]))
    called: list = []

    @agents.function_tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        called.append((a, b))
        return a + b

    async def run(task, client):
        model = agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)
        agent = agents.Agent(name="adder", instructions="Use the tool.", model=model, tools=[add])
        result = await agents.Runner.run(agent, task["prompt"])
        return float(result.final_output.strip() == "The sum is 42.")

    agents.set_tracing_disabled(True)
    trajs, _ = run_agents(engine, tok, [TASK], run)
    assert called == [(20, 22)]
    (traj,) = trajs
    assert traj.reward == 1.0 and traj.info["agent/calls"] == 2
    assert traj.info["agent/segments"] == 1 and traj.info["tool_calls"] == 1
    c1, c2 = engine.completions
    assert traj.completion_ids[: len(c1.token_ids)] == c1.token_ids
    assert traj.completion_ids[-len(c2.token_ids) :] == c2.token_ids
    assert "<tool_response>\n42\n</tool_response>" in tok.decode(traj.completion_ids)
    assert '"name": "add"' in tok.decode(traj.prompt_ids)  # the SDK's tool schema, templated


COMMAND_AGENT = textwrap.dedent("""
    import json, os, sys, time, urllib.request

    task = json.loads(sys.stdin.read())
    mode = task["mode"]
    if mode == "hang":
        time.sleep(60)
    body = {"model": os.environ["OPENAI_MODEL"],
            "messages": [{"role": "user", "content": task["prompt"]}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(), headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    reply = json.loads(urllib.request.urlopen(req).read())
    text = reply["choices"][0]["message"]["content"]
    print("chatter before the result")
    if mode == "exit":
        sys.exit(3)
    if mode == "silent":
        print("no reward here")
    elif mode == "graded":
        print(json.dumps({"steps": 1}))
    else:
        print(json.dumps({"reward": float(text == "42"), "len": len(text)}))
""")


def test_command_agents_and_failed_episodes(tmp_path):
    script = tmp_path / "agent.py"
    script.write_text(COMMAND_AGENT)
    tok = _tok()
    modes = ["ok", "exit", "silent", "hang", "graded"]
    engine = ScriptedEngine(tok, ["42"] * len(modes))
    tasks = [{**TASK, "mode": m, "key": m} for m in modes]

    def grader():  # the task source's env grades the last reply of "graded"
        env = ArithmeticEnv()
        reset = env.reset
        env.reset = lambda task: reset(Problem(task["prompt"], task["answer"], task["key"]))
        return env

    trajs, worker = run_agents(
        engine, tok, tasks, command=f"{sys.executable} {script}", grader=grader, timeout_s=8.0
    )
    by_key = {t.prompt_key: t for t in trajs}
    assert sorted(by_key) == sorted(modes) and len(trajs) == len(modes)
    ok = by_key["ok"]
    assert ok.stop_reason == "answer" and ok.reward == 1.0 and ok.info["agent/len"] == 2.0
    assert tok.decode(ok.completion_ids, skip_special_tokens=True) == "42"
    graded = by_key["graded"]  # ArithmeticEnv grades "42" against the answer "42"
    assert graded.stop_reason == "answer" and graded.reward == 1.0
    for mode, reason in (("exit", "exit"), ("silent", "no_reward"), ("hang", "timeout")):
        t = by_key[mode]
        assert t.stop_reason == "env_error" and t.info["agent/failure"] == reason, t.info
    assert "exited with 3" in by_key["exit"].info["error"]
    assert dict(worker.agents.failures) == {"exit": 1, "no_reward": 1, "timeout": 1}


def test_python_agents_that_raise_or_never_call_fail_their_episode():
    tok = _tok()
    engine = ScriptedEngine(tok, ["hi"] * 4)

    async def agent(task, client):
        if task["mode"] == "raise":
            raise KeyError("tool missing")
        if task["mode"] == "nocall":
            return 1.0
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "x"}], tools=TOOLS
        )
        return {"reward": 0.5, "label": "not a number", "n": 3}

    tasks = [{**TASK, "mode": m, "key": m} for m in ("raise", "nocall", "ok")]
    trajs, worker = run_agents(engine, tok, tasks, agent)
    by_key = {t.prompt_key: t for t in trajs}
    assert by_key["raise"].info["agent/failure"] == "raised"
    assert "KeyError" in by_key["raise"].info["error"]
    assert by_key["nocall"].info["agent/failure"] == "no_calls"
    ok = by_key["ok"]
    assert ok.reward == 0.5 and ok.info["agent/n"] == 3.0 and "agent/label" not in ok.info
    assert json.dumps(ok.info)  # only plain values reach the metrics
    assert dict(worker.agents.failures) == {"raised": 1, "no_calls": 1}


def test_agents_on_reasoning_gym_tasks_are_graded_by_the_dataset():
    pytest.importorskip("reasoning_gym")
    from saorl.config import EnvConfig
    from saorl.envs.factory import build_env

    cfg = EnvConfig(
        name="agent",
        eval_size=2,
        agent={"function": f"{__file__}:_rg_agent", "tasks": "reasoning_gym"},
        reasoning_gym={"datasets": ["chain_sum"]},
    )
    spec = build_env(cfg)
    right, wrong = spec.task.held_out
    tok = _tok()
    engine = ScriptedEngine(tok, [f"<answer>{right.answer}</answer>", "<answer>nope</answer>"])
    program = spec.make_env()
    trajs, _ = run_agents(engine, tok, [right], program.fn, grader=program.grader)
    trajs += run_agents(
        ScriptedEngine(tok, ["<answer>nope</answer>"]),
        tok,
        [wrong],
        program.fn,
        grader=program.grader,
    )[0]
    assert [t.reward for t in trajs] == [1.0, 0.0]
    assert trajs[0].prompt_key == right.key and "chain_sum" in right.key


async def _rg_agent(task, client):
    """Sends the question; returns no reward (the dataset's scorer grades the reply)."""
    assert task["dataset"] == "chain_sum" and "metadata" in task
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["question"]}]
    )


RAISING_AGENT = """\
async def run(task, client):
    await client.chat.completions.create(
        model="policy", messages=[{"role": "user", "content": task["prompt"]}]
    )
    return lookup(task)


def lookup(task):
    return {}[task["key"]]  # the user's bug: the message differs by task
"""


def test_an_agent_that_raises_is_shown_once_by_its_file_and_line(tmp_path):
    import io

    from saorl.envs.custom import load_reference
    from saorl.rollout.failures import FailureLog

    path = tmp_path / "my_agent.py"
    path.write_text(RAISING_AGENT)
    tok = _tok()
    tasks = [{**TASK, "key": k} for k in ("a", "b", "c")]
    trajs, _ = run_agents(
        ScriptedEngine(tok, ["hi"] * 3), tok, tasks, load_reference(f"{path}:run", "env.agent")
    )
    assert {t.info["error"] for t in trajs} == {f"agent: KeyError: '{k}'" for k in "abc"}
    out = io.StringIO()
    log = FailureLog(out)
    for t in trajs:
        log.record(t)
    # Three messages, one place: one group, counted three times, printed once.
    (group,) = log.counts
    assert group.startswith("agent: KeyError at ") and group.endswith("my_agent.py:9"), group
    assert log.counts[group] == 3
    text = out.getvalue()
    assert text.count("saorl: episode failed") == 1, text
    assert f'File "{path}", line 9, in lookup' in text and "return lookup(task)" in text
    assert "saorl/" not in text  # saorl's own frames are trimmed
    assert "the agent failed" in text


def test_an_agent_that_returns_none_is_told_once(capfd):
    from saorl.config import EnvConfig
    from saorl.envs.agent import AgentProgram

    tok = _tok()

    async def forgot_return(task, client):
        await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}]
        )

    told: set[str] = set()  # one run's notes, as build_agent_spec shares them
    cfg = EnvConfig(step_timeout_s=60.0, agent={"function": "my_agent.py:run"})
    tasks = [{**TASK, "key": k} for k in ("a", "b", "c")]
    trajs, _ = run_agents(
        ScriptedEngine(tok, ["42"] * 3),
        tok,
        tasks,
        make_env=lambda: AgentProgram(cfg, forgot_return, _grader, None, told),
    )
    assert [t.reward for t in trajs] == [1.0] * 3  # the grader scored each one
    err = capfd.readouterr().err
    assert err.count("returned None") == 1, err
    assert "my_agent.py:run' returned None, so the grader of env.agent.tasks ('math')" in err


def _grader():
    env = ArithmeticEnv()
    reset = env.reset
    env.reset = lambda task: reset(Problem(task["prompt"], task["answer"], task["key"]))
    return env


ENV_AGENT = textwrap.dedent("""\
    import json, os, sys, urllib.request
    task = json.loads(sys.stdin.read())
    body = {"model": os.environ["OPENAI_MODEL"], "messages": [{"role": "user", "content": "x"}]}
    req = urllib.request.Request(os.environ["OPENAI_BASE_URL"] + "/chat/completions",
        data=json.dumps(body).encode(), headers={
            "Content-Type": "application/json",
            "Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]})
    urllib.request.urlopen(req).read()
    seen = {n: float(n in os.environ) for n in ("HF_TOKEN", "MY_SETTING", "OPENAI_BASE_URL")}
    print(json.dumps({"reward": 1.0, **seen, "path": float("PATH" in os.environ)}))
""")


def test_a_command_agent_sees_only_the_environment_it_is_given(tmp_path, monkeypatch):
    from saorl.config import EnvConfig
    from saorl.envs.agent import AgentProgram

    script = tmp_path / "agent.py"
    script.write_text(ENV_AGENT)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")  # a host secret: never passed on
    monkeypatch.setenv("MY_SETTING", "x")  # listed in env.agent.env_passthrough: passed on
    cfg = EnvConfig(agent={"command": f"{sys.executable} {script}", "env_passthrough": ["MY_*"]})
    tok = _tok()
    [traj], _ = run_agents(
        ScriptedEngine(tok, ["42"]),
        tok,
        [TASK],
        make_env=lambda: AgentProgram(cfg, None, None, None),
    )
    assert traj.reward == 1.0, traj.info
    assert traj.info["agent/HF_TOKEN"] == 0.0 and traj.info["agent/MY_SETTING"] == 1.0
    assert traj.info["agent/OPENAI_BASE_URL"] == 1.0 and traj.info["agent/path"] == 1.0
