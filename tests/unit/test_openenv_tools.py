"""The pure logic of `env.name = "openenv"` (no openenv-core needed): an action schema as a
tool, a model's call as the action, server messages read, observations as text; the config's
rules; the spec built without contacting a server."""

from __future__ import annotations

import random

import pytest
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from saorl.config import EnvConfig
from saorl.envs.factory import build_env
from saorl.envs.openenv import SeedTasks, ws_url
from saorl.envs.openenv_tools import (
    action_from_call,
    action_tool,
    instructions,
    observation_text,
    read_reply,
    tool_name,
)
from saorl.toolcalls import ToolCall, parse_tool_call, render_tool_call


class Move(BaseModel):
    """A chess move."""

    model_config = ConfigDict(extra="forbid")
    title: str = Field(description="the move in UCI notation")


class GuessAction(BaseModel):
    """Guess the hidden number.

    The environment says whether it is higher or lower."""

    model_config = ConfigDict(extra="forbid")
    metadata: dict = Field(default_factory=dict)  # as on OpenEnv's Action base class
    guess: int = Field(description="your guess, 1 to 100")
    note: str | None = None
    move: Move | None = None


def test_an_action_schema_becomes_one_tool_without_metadata_or_titles():
    tool = action_tool(GuessAction.model_json_schema())
    fn = tool["function"]
    assert tool["type"] == "function" and fn["name"] == "guess"
    assert fn["description"] == (
        "Guess the hidden number. The environment says whether it is higher or lower."
    )
    params = fn["parameters"]
    assert params["type"] == "object" and params["required"] == ["guess"]
    assert set(params["properties"]) == {"guess", "note", "move"}  # metadata is not offered
    guess = {"type": "integer", "description": "your guess, 1 to 100"}
    assert params["properties"]["guess"] == guess
    assert "title" not in params and "additionalProperties" not in params
    # Nested models keep their definitions; a property that is named `title` stays.
    assert params["$defs"]["Move"]["properties"]["title"]["type"] == "string"
    assert "title" not in params["$defs"]["Move"]


def test_tool_names_come_from_the_model_name_or_the_override():
    assert tool_name({"title": "EchoAction"}) == "echo"
    assert tool_name({"title": "TextArenaMoveAction"}) == "text_arena_move"
    assert tool_name({"title": "Action"}) == "action"
    assert tool_name({}) == "act" and tool_name({"title": "9Lives"}) == "act"
    assert action_tool({"title": "X", "properties": {}}, "play")["function"]["name"] == "play"
    assert action_tool({"properties": {}})["function"]["description"].startswith("Take one")


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_a_rendered_call_becomes_the_action_payload(fmt):
    call = parse_tool_call(render_tool_call("guess", {"guess": 50}, fmt), fmt)
    assert action_from_call(call, "guess") == {"guess": 50}
    assert '"name": "guess"' in instructions(fmt, "guess")


def test_bad_calls_are_error_texts_not_actions():
    broken = parse_tool_call('<tool_call>{"name": "guess", </tool_call>', "hermes")
    assert action_from_call(broken, "guess").startswith("tool call is not valid JSON")
    assert action_from_call(ToolCall("play", {}), "guess") == (
        "unknown tool 'play'; the tool is 'guess'"
    )
    assert action_from_call(ToolCall("guess", {"metadata": {}}), "guess") == (
        "guess: metadata is not an argument"
    )


def test_server_messages_are_read_as_observations_or_errors():
    data = {"observation": {"hint": "higher"}, "reward": 1, "done": True}
    ok = read_reply({"type": "observation", "data": data})
    assert (ok.observation, ok.reward, ok.done, ok.error) == ({"hint": "higher"}, 1.0, True, "")
    first = read_reply({"type": "observation", "data": {"observation": {}, "reward": None}})
    assert first.reward == 0.0 and not first.done and not first.error
    # A validation error names each bad field the way pydantic reports it.
    try:
        GuessAction.model_validate({"guess": "fifty", "colour": 1})
    except ValidationError as e:
        errors = e.errors(include_url=False, include_input=False)
    data = {"message": "Invalid message", "code": "VALIDATION_ERROR", "errors": errors}
    bad = read_reply({"type": "error", "data": data})
    assert bad.code == "VALIDATION_ERROR" and bad.error.startswith("invalid action: guess: ")
    assert "colour: Extra inputs are not permitted" in bad.error
    raised = read_reply({"type": "error", "data": {"message": "boom", "code": "EXECUTION_ERROR"}})
    assert (raised.error, raised.code) == ("boom", "EXECUTION_ERROR")
    for junk in ("hello", {"type": "observation", "data": {"observation": 3}}, {"data": 1}):
        assert read_reply(junk).code == "BAD_REPLY"


def test_observations_read_as_text():
    assert observation_text({"hint": "higher"}) == "higher"
    assert observation_text({"board": [[1, 2]]}) == "[[1, 2]]"
    assert observation_text({"a": 1, "b": "x"}) == '{"a": 1, "b": "x"}'
    long = observation_text({"text": "y" * 50}, max_chars=10)
    assert long == "yyyyyyyyyy\n... (40 more characters)"


def test_the_config_takes_exactly_one_server_and_reset_args():
    cfg = EnvConfig(name="openenv", args={"level": 2}, openenv={"url": "http://127.0.0.1:9"})
    assert cfg.args == {"level": 2}
    with pytest.raises(ValidationError, match=r"exactly one of env\.openenv\.app"):
        EnvConfig(name="openenv")
    with pytest.raises(ValidationError, match=r"exactly one of env\.openenv\.app"):
        EnvConfig(name="openenv", openenv={"url": "http://x:1", "app": "m:app"})
    with pytest.raises(ValidationError, match="rewarded by its server"):
        EnvConfig(name="openenv", reward_fns=["m:f"], openenv={"url": "http://x:1"})
    with pytest.raises(ValidationError, match="not a server URL"):
        EnvConfig(name="openenv", openenv={"url": "127.0.0.1:8000"})
    with pytest.raises(ValidationError, match="import path"):
        EnvConfig(name="openenv", openenv={"app": "server"})
    assert ws_url("http://127.0.0.1:8000/") == "ws://127.0.0.1:8000/ws"
    assert ws_url("https://h.example/env") == "wss://h.example/env/ws"


def test_the_spec_uses_seeds_as_tasks_and_contacts_no_server():
    cfg = EnvConfig(name="openenv", eval_size=4, seed=10, openenv={"url": "http://127.0.0.1:9"})
    spec = build_env(cfg)  # nothing listens on port 9: building does not connect
    assert [t.seed for t in spec.task.held_out] == [10, 11, 12, 13]
    assert spec.task.held_out[0].key == "seed=10"
    rng = random.Random(0)
    assert all(spec.task.sample(rng).seed not in range(10, 14) for _ in range(100))
    assert spec.stop == ("</tool_call>",) and spec.max_tool_calls == spec.max_turns
    env = spec.make_env()
    assert env.fmt == "hermes" and env.timeout_s == cfg.step_timeout_s
    llama = build_env(cfg.model_copy(update={"tool_format": "llama3"}))
    assert llama.make_env().fmt == "llama3"
    assert isinstance(SeedTasks(0, 2).sample(rng).seed, int)
