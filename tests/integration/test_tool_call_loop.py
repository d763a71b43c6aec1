"""Python-function tools through the whole rollout worker, token in, token out, in the hermes
and Llama 3 formats: a chat template that renders the tool schemas, a scripted model turn that
calls a tool, the function's result as an observation, then the graded answer. And the same
episode against an OpenAI-compatible endpoint that parses tool calls itself."""

from __future__ import annotations

import json
import queue
import random
import threading
import time
from dataclasses import dataclass
from http.server import ThreadingHTTPServer
from typing import ClassVar

import pytest

from saorl.envs.function_tools import FunctionTools
from saorl.envs.math.tool import MathToolEnv
from saorl.evaluation.openai_client import chat_episode
from saorl.models.tokenizer import build_char_tokenizer
from saorl.rollout.worker import AgentLimits, PromptFeed, RolloutWorker
from saorl.toolcalls import render_tool_call
from tests._chat_stub import ChatStub
from tests.integration.test_agent_loop import ScriptedEngine

# A Llama-3-shaped template: tools as JSON in the first user turn, `<|eot_id|>` after each
# message, tool results under an `ipython` header. Hermes-shaped: tools in a system block,
# results inside <tool_response>.
LLAMA3_TEMPLATE = (
    "{% for m in messages %}<|start_header_id|>"
    "{{ 'ipython' if m.role == 'tool' else m.role }}<|end_header_id|>\n"
    "{% if loop.first and tools %}Functions:\n{% for t in tools %}{{ t | tojson }}\n"
    "{% endfor %}Reply with a JSON call or the answer.\n{% endif %}"
    "{{ m.content }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n{% endif %}"
)
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}\n{{ t | tojson }}"
    "{% endfor %}\n</tools><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n"
    "{{ m.content }}\n</tool_response><|im_end|>\n{% else %}<|im_start|>{{ m.role }}\n"
    "{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


@dataclass(frozen=True)
class Problem:
    prompt: str
    answer: str
    key: str = "p0"


class _Tasks:
    @staticmethod
    def sample(rng):
        return Problem("What is 20+22?", "42")


def _tokenizer(fmt: str):
    tok = build_char_tokenizer(with_newlines=True)
    if fmt == "llama3":
        specials = [
            "<|start_header_id|>",
            "<|end_header_id|>",
            "<|eot_id|>",
            "<|eom_id|>",
            "<|python_tag|>",
        ]
        tok.add_special_tokens({"additional_special_tokens": specials})
        tok.eos_token = "<|eot_id|>"
        tok.chat_template = LLAMA3_TEMPLATE
    else:
        tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
        tok.eos_token = "<|im_end|>"
        tok.chat_template = HERMES_TEMPLATE
    return tok


def _episode(fmt: str, turns: list[str]):
    tok = _tokenizer(fmt)
    tools = FunctionTools([add])
    engine = ScriptedEngine(tok, turns)
    out: queue.Queue = queue.Queue()
    limits = AgentLimits(max_seq_len=4096, max_new_tokens=200, max_turns=4, max_tool_calls=3)
    feed = PromptFeed(_Tasks(), random.Random(0), 1, 1)
    make_env = lambda: MathToolEnv(fmt=fmt, use_tool=False, functions=tools)  # noqa: E731
    worker = RolloutWorker(engine, feed, tok, out, make_env, limits)
    worker.fill()
    deadline = time.monotonic() + 30  # env steps run on the worker's event-loop thread
    while out.empty() and time.monotonic() < deadline:
        worker.step()
        time.sleep(0.005)
    return out.get_nowait(), engine, tok


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_a_model_turn_calls_a_function_and_then_answers(fmt):
    call = render_tool_call("add", {"a": 20, "b": 22}, fmt)
    if fmt == "llama3":
        call = "<|python_tag|>" + call  # some Llama 3 checkpoints open calls with it
    traj, engine, tok = _episode(fmt, [call, "So the sum is \\boxed{42}."])

    assert traj.stop_reason == "answer" and traj.reward == 1.0
    assert traj.info["turns"] == 2 and traj.info["tool_calls"] == 1
    assert traj.info["tool_status"] == "ok" and traj.info["tool"] == "add"
    # The prompt carries the function's schema through the chat template ...
    prompt = tok.decode(traj.prompt_ids)
    assert '"name": "add"' in prompt and '"required": ["a", "b"]' in prompt
    instructions = "a reply that is only {" if fmt == "llama3" else "<tool_call>{"
    assert instructions in prompt
    # ... the function ran and its result is the observation, rendered by the template as a
    # tool message, with loss mask 0 and log-prob 0.
    whole = tok.decode(traj.completion_ids)
    header = "<|start_header_id|>ipython<|end_header_id|>\n42<|eot_id|>"
    assert (header if fmt == "llama3" else "<tool_response>\n42\n</tool_response>") in whole
    first = len(tok.encode(call, add_special_tokens=False)) + 1  # + the turn's EOS
    second = len(tok.encode("So the sum is \\boxed{42}.", add_special_tokens=False)) + 1
    obs = len(traj.completion_ids) - first - second
    assert traj.loss_mask == [1] * first + [0] * obs + [1] * second
    assert traj.rollout_logprobs[first : first + obs] == [0.0] * obs
    # The second turn was asked for the whole history, token in.
    assert engine.requests[1].prompt_ids == traj.prompt_ids + traj.completion_ids[: first + obs]


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_a_bad_call_is_an_observation_the_model_recovers_from(fmt):
    bad = (
        '{"name": "add", "parameters": {"a": 20}}'
        if fmt == "llama3"
        else '<tool_call>{"name": "add", "arguments": {"a": 20}}</tool_call>'
    )
    good = render_tool_call("add", {"a": 20, "b": 22}, fmt)
    traj, _, tok = _episode(fmt, [bad, good, "\\boxed{42}"])
    assert traj.stop_reason == "answer" and traj.reward == 1.0
    assert traj.info["tool_calls"] == 2
    assert "error: add: missing argument(s) b" in tok.decode(traj.completion_ids)


class _ToolParsingServer(ChatStub):
    """An OpenAI-compatible endpoint that parses tool calls (as vLLM does with
    `--enable-auto-tool-choice`): first a call to `add`, then the answer."""

    bodies: ClassVar[list[dict]] = []

    def answer(self, body: dict) -> dict:
        type(self).bodies.append(body)
        if len(body["messages"]) <= 1:
            message = {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_7",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 20, "b": 22}'},
                    }
                ],
            }
            reason = "tool_calls"
        else:
            message, reason = {"role": "assistant", "content": "\\boxed{42}"}, "stop"
        return {"choices": [{"message": message, "finish_reason": reason}]}


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_the_openai_client_sends_tools_and_answers_parsed_calls(fmt):
    _ToolParsingServer.bodies = []
    server = ThreadingHTTPServer(("127.0.0.1", 0), _ToolParsingServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        env = MathToolEnv(fmt=fmt, use_tool=False, functions=FunctionTools([add]))
        ep = chat_episode(
            f"http://127.0.0.1:{server.server_port}/v1",
            "m",
            env,
            Problem("What is 20+22?", "42"),
            max_turns=4,
            max_tool_calls=3,
        )
    finally:
        server.shutdown()
    assert ep.reward == 1.0 and ep.stop_reason == "answer"
    assert ep.info["tool"] == "add" and ep.info["tool_status"] == "ok"
    first, second = _ToolParsingServer.bodies
    assert [t["function"]["name"] for t in first["tools"]] == ["add"]
    # The call went back the OpenAI way: the assistant's tool_calls, answered by id.
    assistant, result = second["messages"][-2:]
    assert assistant["tool_calls"][0]["id"] == "call_7"
    assert json.loads(assistant["tool_calls"][0]["function"]["arguments"]) == {"a": 20, "b": 22}
    assert result == {"role": "tool", "content": "42", "tool_call_id": "call_7"}
