"""verifiers episodes through the whole rollout worker: a real verifiers taskset with a tool
(tests/verifiers_tier/_tool_taskset.py, its `add` tool an MCP server verifiers starts), its
plain chat harness run as a process, verifiers' training client rendering the prompts and
calling the worker's training endpoint token-in, token-out; scripted model turns. The episode
is scored by the taskset's rubric, its metrics are env/*, and the trajectory holds the sampled
tokens exactly, the tool's result between them masked."""

from __future__ import annotations

import re
from pathlib import Path

from saorl.config import EnvConfig
from saorl.envs.factory import build_env
from saorl.toolcalls import render_tool_call
from tests.integration._endpoint_harness import Recording, run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_tool_call_loop import _tokenizer
from tests.verifiers_tier._marks import VERIFIERS_TIER

pytestmark = VERIFIERS_TIER
TOOL_TASKSET = str(Path(__file__).parent / "_tool_taskset.py")
HARNESS = {"agent": {"harness": {"id": "null"}, "max_turns": 3}}


def _tok():
    tok = _tokenizer("hermes")
    # renderers' hermes-style parser ("qwen3") finds calls by these tokens, as in Qwen's vocab
    tok.add_tokens(["<tool_call>", "</tool_call>"], special_tokens=True)
    return tok


def _spec(**args):
    cfg = EnvConfig(
        name="verifiers",
        args={**HARNESS, **args},
        eval_size=2,
        step_timeout_s=120,
        verifiers={"taskset": TOOL_TASKSET},
    )
    return build_env(cfg)


def test_a_tool_episode_is_scored_by_the_rubric_token_exact():
    spec = _spec()
    task = spec.task.held_out[0]
    a, b = map(int, re.findall(r"(\d+)\+(\d+)", task.prompt)[0])
    tok = _tok()
    call = render_tool_call("calc_add", {"a": a, "b": b}, "hermes")
    engine = Recording(ScriptedEngine(tok, [call, f"The sum is {a + b}."]))
    trajs, _ = run_agents(engine, tok, [task], make_env=spec.make_env, timeout_s=120)
    assert len(trajs) >= 1
    t = trajs[0]
    assert t.stop_reason != "env_error", t.info.get("error")
    assert t.reward == 1.0  # the rubric: `correct` (weight 1) saw the sum in the last reply
    assert t.info["env/reward/correct"] == 1.0
    assert t.info["env/tool_calls"] == 1.0  # the MCP tool ran once
    assert "calc_add" in tok.decode(t.prompt_ids)  # the tool was offered through the template
    sampled = [c.token_ids for c in engine.completions]
    assert len(sampled) == 2
    # whatever the segments, every sampled id is in them exactly as sampled, loss mask 1
    kept = [i for x in trajs for i, m in zip(x.completion_ids, x.loss_mask, strict=True) if m]
    assert kept == [i for ids in sampled for i in ids]
    if len(trajs) == 1:  # the renderer bridged the turns: the tool's result is masked between
        masked = [i for i, m in zip(t.completion_ids, t.loss_mask, strict=True) if not m]
        assert str(a + b) in tok.decode(masked)


def test_a_reply_without_the_tool_still_ends_scored():
    spec = _spec()
    task = spec.task.held_out[1]
    tok = _tok()
    engine = Recording(ScriptedEngine(tok, ["I do not know."]))
    trajs, _ = run_agents(engine, tok, [task], make_env=spec.make_env, timeout_s=120)
    assert len(trajs) == 1
    t = trajs[0]
    assert t.stop_reason != "env_error", t.info.get("error")
    assert t.reward == 0.0 and t.info["env/reward/correct"] == 0.0
    assert t.info["env/tool_calls"] == 0.0
    assert t.completion_ids == engine.completions[0].token_ids
