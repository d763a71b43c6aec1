"""The training endpoint with real clients (the openai SDK, raw HTTP) against a real rollout
worker and server: tool calls in the hermes and Llama 3 formats, streaming, the token-level
record of multi-call episodes (observation tokens masked, sampled ids never re-tokenized),
history rewrites as new segments, and the errors a client can provoke."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from saorl.rollout.agents.records import AgentSession
from saorl.rollout.agents.wire import parse_tool_calls
from saorl.rollout.episode import ChatCodec
from tests.integration._endpoint_harness import Recording, run_agents
from tests.integration.test_agent_loop import ScriptedEngine
from tests.integration.test_tool_call_loop import _tokenizer

openai = pytest.importorskip("openai")

# Qwen-shaped: tool schemas in a system block, an assistant's tool calls rendered back as
# <tool_call> JSON (arguments through `tojson`), tool results in <tool_response>.
TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% elif m.role == 'assistant' %}"
    "<|im_start|>assistant\n{{ m.content }}{% for tc in m.tool_calls or [] %}<tool_call>"
    '{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}'
    "</tool_call>{% endfor %}<|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "add",
            "description": "Add two integers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
            },
        },
    }
]
CALL = '<tool_call>{"name": "add", "arguments": {"a": 20, "b": 22}}</tool_call>'
TASK = {"prompt": "What is 20+22?", "answer": "42", "key": "t0"}


def _tok():
    tok = _tokenizer("hermes")
    tok.chat_template = TEMPLATE
    return tok


async def _tool_agent(task, client, stream_second: bool, seen: dict):
    messages = [{"role": "user", "content": task["prompt"]}]
    first = await client.chat.completions.create(
        model="policy", messages=messages, tools=TOOLS, logprobs=True
    )
    msg = first.choices[0].message
    seen["first"] = first
    messages.append(msg.model_dump(exclude_none=True))  # the assistant message, as the SDK has it
    call = msg.tool_calls[0]
    args = json.loads(call.function.arguments)
    messages.append(
        {"role": "tool", "tool_call_id": call.id, "content": str(args["a"] + args["b"])}
    )
    if stream_second:
        stream = await client.chat.completions.create(
            model="policy",
            messages=messages,
            tools=TOOLS,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = [c async for c in stream]
        seen["text"] = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        seen["finish"] = [c.choices[0].finish_reason for c in chunks if c.choices][-1]
        seen["usage"] = chunks[-1].usage
    else:
        second = await client.chat.completions.create(
            model="policy", messages=messages, tools=TOOLS
        )
        seen["text"] = second.choices[0].message.content
        seen["finish"] = second.choices[0].finish_reason
    return {"reward": float("42" in seen["text"]), "steps": 2}


@pytest.mark.parametrize("stream_second", [False, True], ids=["whole", "stream"])
def test_openai_sdk_tool_call_episode_is_one_trajectory(stream_second):
    tok = _tok()
    engine = Recording(ScriptedEngine(tok, [CALL, "The sum is 42."]))
    seen: dict = {}
    trajs, _ = run_agents(engine, tok, [TASK], lambda t, c: _tool_agent(t, c, stream_second, seen))

    first = seen["first"].choices[0]
    assert first.finish_reason == "tool_calls" and first.message.content is None
    assert first.message.tool_calls[0].function.name == "add"
    assert json.loads(first.message.tool_calls[0].function.arguments) == {"a": 20, "b": 22}
    assert seen["text"] == "The sum is 42." and seen["finish"] == "stop"
    # The returned log-probs are the engine's, token by token.
    c1, c2 = engine.completions
    assert [t.logprob for t in first.logprobs.content] == c1.logprobs
    if stream_second:
        assert seen["usage"].completion_tokens == len(c2.token_ids)

    (traj,) = trajs
    assert traj.reward == 1.0 and traj.stop_reason == "answer" and traj.prompt_key == "t0"
    assert traj.info["agent/calls"] == 2 and traj.info["agent/segments"] == 1
    assert traj.info["agent/retokenize_mismatch"] == 0 and traj.info["agent/steps"] == 2.0
    assert traj.info["tool_calls"] == 1
    # Prompt: the chat template with the tool schema; the second call's prompt is exactly
    # the first prompt + the first call's sampled ids + observation ids.
    assert traj.prompt_ids == c1.request.prompt_ids and '"name": "add"' in tok.decode(
        traj.prompt_ids
    )
    n1, n2 = len(c1.token_ids), len(c2.token_ids)
    obs = c2.request.prompt_ids[len(c1.request.prompt_ids) + n1 :]
    assert c2.request.prompt_ids[: len(traj.prompt_ids) + n1] == traj.prompt_ids + c1.token_ids
    assert traj.completion_ids == c1.token_ids + obs + c2.token_ids
    assert traj.loss_mask == [1] * n1 + [0] * len(obs) + [1] * n2
    assert traj.rollout_logprobs == c1.logprobs + [0.0] * len(obs) + c2.logprobs
    assert traj.versions == c1.versions + [-1] * len(obs) + c2.versions
    assert tok.decode(obs) == (
        "\n<|im_start|>user\n<tool_response>\n42\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n"
    )


def test_a_call_the_template_renders_differently_keeps_the_sampled_ids():
    tok = _tok()
    odd = '<tool_call>{"name":"add","arguments":{"a":20,"b":22}}</tool_call>'  # no spaces
    engine = Recording(ScriptedEngine(tok, [odd, "The sum is 42."]))
    trajs, _ = run_agents(engine, tok, [TASK], lambda t, c: _tool_agent(t, c, False, {}))
    (traj,) = trajs
    c1, c2 = engine.completions
    assert traj.info["agent/retokenize_mismatch"] == 1 and traj.info["agent/segments"] == 1
    n1 = len(c1.token_ids)
    assert traj.completion_ids[:n1] == c1.token_ids  # as sampled, not as the template renders
    assert traj.completion_ids[-len(c2.token_ids) :] == c2.token_ids


def test_a_history_rewrite_starts_a_segment():
    tok = _tok()
    engine = Recording(ScriptedEngine(tok, ["Let me think. 42?", "Sure: 42", "42 again"]))

    async def agent(task, client):
        msgs = [{"role": "user", "content": task["prompt"]}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs += [
            {"role": "assistant", "content": r.choices[0].message.content},
            {"role": "user", "content": "Are you sure?"},
        ]
        await client.chat.completions.create(model="policy", messages=msgs)
        # Summarised history: the prompt no longer extends what the model saw.
        short = [{"role": "user", "content": "Answer 20+22 in one word."}]
        await client.chat.completions.create(model="policy", messages=short)
        return 0.5

    trajs, _ = run_agents(engine, tok, [TASK], agent)
    assert [t.info["agent/segments"] for t in trajs] == [2, 2]
    assert [t.reward for t in trajs] == [0.5, 0.5]
    first, second = trajs
    assert first.info["turns"] == 2 and second.info["turns"] == 1
    c1, _, c3 = engine.completions
    assert first.prompt_ids == c1.request.prompt_ids and second.prompt_ids == c3.request.prompt_ids
    assert second.completion_ids == c3.token_ids and second.loss_mask == [1] * len(c3.token_ids)
    assert "Answer 20+22" in tok.decode(second.prompt_ids)


def test_llama3_tool_calls_are_parsed_back():
    assert parse_tool_calls(
        '<|python_tag|>{"name": "add", "parameters": {"a": 1}}; '
        '{"name": "sub", "arguments": {"b": 2}}',
        "llama3",
    )[1] == [
        *parse_tool_calls('{"name": "add", "parameters": {"a": 1}}', "llama3")[1],
        *parse_tool_calls('{"name": "sub", "parameters": {"b": 2}}', "llama3")[1],
    ]
    assert parse_tool_calls("The answer is 3.", "llama3") == ("The answer is 3.", [])
    content, calls = parse_tool_calls(f"Calling.{CALL}<tool_call>{{bad</tool_call>", "hermes")
    assert [c.name for c in calls] == ["add"] and content == "Calling.<tool_call>{bad</tool_call>"

    tok = _tokenizer("llama3")
    engine = ScriptedEngine(tok, ['{"name": "add", "parameters": {"a": 20, "b": 22}}'])
    seen = {}

    async def agent(task, client):
        r = await client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "20+22?"}], tools=TOOLS
        )
        seen["msg"] = r.choices[0].message
        return 1.0

    run_agents(engine, tok, [TASK], agent, tool_format="llama3")
    assert seen["msg"].content is None
    assert json.loads(seen["msg"].tool_calls[0].function.arguments) == {"a": 20, "b": 22}


def test_clients_get_clear_errors_and_the_run_goes_on():
    tok = _tok()
    engine = ScriptedEngine(tok, ["fine"])
    got: dict = {}

    async def agent(task, client):
        base = str(client.base_url).rstrip("/")
        root = base.split("/episodes/")[0]
        key = client.api_key
        async with httpx.AsyncClient() as http:
            got["models"] = (await http.get(f"{root}/v1/models")).json()
            bad = await http.post(
                f"{base}/chat/completions",
                content=b"{not json",
                headers={"Content-Type": "application/json"},
            )
            got["malformed"] = bad.status_code
            body = {"model": "policy", "messages": [{"role": "user", "content": "hi"}]}
            r = await http.post(f"{root}/episodes/ep-nope/v1/chat/completions", json=body)
            got["unknown_path"] = r.status_code
            r = await http.post(
                f"{root}/v1/chat/completions", json=body, headers={"Authorization": "Bearer wrong"}
            )
            got["unknown_key"] = r.status_code
            r = await http.post(
                f"{root}/v1/chat/completions", json=body, headers={"X-Episode-Id": "ep-nope"}
            )
            got["unknown_header"] = r.status_code
            got["no_messages"] = (
                await http.post(f"{base}/chat/completions", json={"model": "policy"})
            ).status_code
            # The key alone (no path prefix) and the header alone name the episode too.
            r = await http.post(
                f"{root}/v1/chat/completions", json=body, headers={"X-Session-ID": key}
            )
            got["by_header"] = r.status_code
            long = {"model": "policy", "messages": [{"role": "user", "content": "x" * 5000}]}
            r = await http.post(f"{base}/chat/completions", json=long)
            got["too_long"] = (r.status_code, r.json()["error"])
        for kwargs, name in (({"n": 2}, "n"), ({"model": "gpt-4o"}, "model")):
            try:
                await client.chat.completions.create(
                    **{"model": "policy", "messages": [{"role": "user", "content": "x"}], **kwargs}
                )
            except openai.APIStatusError as e:
                got[name] = (e.status_code, e.message)
        return 1.0

    trajs, worker = run_agents(engine, tok, [TASK], agent)
    assert got["models"]["data"][0]["id"] == "policy"
    assert got["models"]["data"][0]["context_length"] == 4096
    assert got["malformed"] == 400 and got["no_messages"] == 400
    assert got["unknown_path"] == 404 and got["unknown_header"] == 404
    assert got["unknown_key"] == 401 and got["by_header"] == 200
    status, error = got["too_long"]  # in OpenAI's words: litellm maps it to a context overflow
    assert status == 400 and error["code"] == "context_length_exceeded"
    assert error["message"].startswith("This model's maximum context length is 4096 tokens")
    assert got["n"][0] == 400 and "one choice" in got["n"][1]
    assert got["model"][0] == 404 and "policy" in got["model"][1]
    assert len(trajs) == 1 and trajs[0].reward == 1.0 and worker.error is None


def test_a_template_free_extension_equals_plain_concatenation():
    """Without a chat template (the char-level tasks) messages are plain text: an extension is
    the previous ids, the sampled ids and the new message's text, with no mismatch."""
    tok = _tokenizer("hermes")
    tok.chat_template = None
    session = AgentSession("k", TASK, -1, ChatCodec(tok))
    msgs = [{"role": "user", "content": "12+34="}]
    ids, extends = session.prompt_ids(msgs, None)
    assert ids == tok.encode("12+34=", add_special_tokens=False) and not extends
    sampled = tok.encode("46", add_special_tokens=False)
    session.record(
        msgs,
        None,
        ids,
        extends,
        sampled,
        [-0.5, -0.5],
        [0, 0],
        "eos",
        {"role": "assistant", "content": "46"},
    )
    more = [*msgs, {"role": "assistant", "content": "46"}, {"role": "user", "content": " ok"}]
    ids2, extends2 = session.prompt_ids(more, None)
    assert extends2 and ids2 == ids + sampled + tok.encode(" ok", add_special_tokens=False)
    assert session.mismatches == 0


def test_an_extending_call_renders_the_template_once_and_gets_the_same_ids():
    """The previous call's prompt text is reused to cut the observation out (one render a
    call, not two), and the ids are those of rendering both afresh."""
    tok = _tok()
    renders = []
    real = tok.apply_chat_template
    tok.apply_chat_template = lambda *a, **k: renders.append(1) or real(*a, **k)
    session = AgentSession("k", TASK, -1, ChatCodec(tok))
    msgs = [{"role": "user", "content": "12+34="}]
    ids, _ = session.prompt_ids(msgs, TOOLS)
    sampled = tok.encode("46", add_special_tokens=False)
    reply = {"role": "assistant", "content": "46"}
    session.record(msgs, TOOLS, ids, False, sampled, [-0.5] * len(sampled), [0], "eos", reply)
    more = [*msgs, reply, {"role": "user", "content": "Sure?"}]
    renders.clear()
    ids2, extends = session.prompt_ids(more, TOOLS)
    assert extends and len(renders) == 1
    session.rendered = None  # afresh: both conversations rendered again
    assert session.prompt_ids(more, TOOLS) == (ids2, True) and len(renders) == 3
    assert tok.decode(ids2[len(ids) + len(sampled) :]).startswith("<|im_end|>")
    assert session.mismatches == 0


def test_concurrent_calls_of_one_episode_branch_into_segments():
    tok = _tok()
    engine = Recording(ScriptedEngine(tok, ["first", "left!", "right"]))  # equal lengths

    async def agent(task, client):
        msgs = [{"role": "user", "content": task["prompt"]}]
        r = await client.chat.completions.create(model="policy", messages=msgs)
        msgs += [
            r.choices[0].message.model_dump(exclude_none=True),
            {"role": "user", "content": "Two views?"},
        ]
        await asyncio.gather(
            *(client.chat.completions.create(model="policy", messages=msgs) for _ in range(2))
        )
        return 1.0

    trajs, _ = run_agents(engine, tok, [TASK], agent)
    c1, c2, c3 = engine.completions
    assert c2.request.prompt_ids == c3.request.prompt_ids  # both extend the first call
    grown, branch = sorted(trajs, key=lambda t: len(t.prompt_ids))
    assert [t.info["agent/segments"] for t in trajs] == [2, 2]
    # One call extends the first segment; the other, recorded after it, branches off with the
    # same prompt as a segment of its own. Each model token is trained exactly once.
    assert grown.completion_ids[: len(c1.token_ids)] == c1.token_ids
    assert branch.prompt_ids == c2.request.prompt_ids
    assert sorted([grown.completion_ids[-len(c2.token_ids) :], branch.completion_ids]) == sorted(
        [c2.token_ids, c3.token_ids]
    )


def test_many_agents_connecting_at_once_are_all_served():
    tok = _tok()
    n = 64
    engine = ScriptedEngine(tok, ["42"] * n)
    engine.max_concurrent = n  # every episode starts, and connects, at the same moment

    async def agent(task, client):
        # Over HTTP (the given client is served in-process): a client of its own, as other
        # SDKs build from the episode's base URL and key.
        http = openai.AsyncOpenAI(base_url=client.base_url, api_key=client.api_key, max_retries=0)
        r = await http.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": task["prompt"]}]
        )
        return float(r.choices[0].message.content == "42")

    trajs, worker = run_agents(engine, tok, [{**TASK, "key": str(i)} for i in range(n)], agent)
    assert len(trajs) == n and all(t.reward == 1.0 for t in trajs)
    assert not worker.agents.failures
