"""`env.tools`: schemas from signatures and docstrings, a real chat template rendering them, and
calls through the `math` env's `step` (results and every kind of error as observations)."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Literal, Optional

import pytest

from saorl.config import ConfigError, load_config
from saorl.envs.factory import build_env
from saorl.envs.function_tools import FunctionTools, function_schema
from saorl.envs.math.tool import MathToolEnv


def scale(
    xs: list[int],
    factor: float = 2.0,
    label: Optional[str] = None,  # noqa: UP045
    mode: Literal["up", "down"] = "up",
    exact: bool = False,
) -> str:
    """Scale a list of numbers.

    Each number is multiplied; this line is not part of the first paragraph.

    Args:
        xs (list[int]): The numbers.
        factor: How much to multiply by,
            continued on a second line.
        label: A name for the result.
        mode: Which way.

    Returns:
        The scaled numbers as text.
    """
    return str([x * factor for x in xs])


def numpy_style(a: int, b: str | None) -> int:
    """Do a thing
    in two lines.

    Parameters
    ----------
    a : int
        The first.
    b : str, optional
        The second.
    """
    return a


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first.
        b: The second.
    """
    return a + b


def boom(x: int) -> int:
    """Always fails."""
    raise ValueError(f"no {x}")


def slow() -> str:
    time.sleep(0.5)
    return "late"


async def aslow() -> str:
    await asyncio.sleep(5)
    return "late"


async def ahello(name: str) -> str:
    return f"hello {name}"


def test_schema_from_hints_defaults_and_google_docstring() -> None:
    s = function_schema(scale)
    assert s["type"] == "function"
    f = s["function"]
    assert f["name"] == "scale"
    assert f["description"] == "Scale a list of numbers."
    p = f["parameters"]
    assert p["type"] == "object" and p["required"] == ["xs"]
    assert p["properties"] == {
        "xs": {"type": "array", "items": {"type": "integer"}, "description": "The numbers."},
        "factor": {
            "type": "number",
            "description": "How much to multiply by, continued on a second line.",
        },
        "label": {"type": "string", "nullable": True, "description": "A name for the result."},
        "mode": {"type": "string", "enum": ["up", "down"], "description": "Which way."},
        "exact": {"type": "boolean"},
    }
    json.dumps(s)  # the chat template gets plain JSON data


def test_schema_from_a_numpy_docstring() -> None:
    f = function_schema(numpy_style)["function"]
    assert f["description"] == "Do a thing in two lines."
    props = f["parameters"]["properties"]
    assert props["a"] == {"type": "integer", "description": "The first."}
    assert props["b"] == {"type": "string", "nullable": True, "description": "The second."}
    assert f["parameters"]["required"] == ["a", "b"]


def test_tools_reach_a_real_chat_template() -> None:
    from saorl.models.tokenizer import build_char_tokenizer
    from saorl.rollout.episode import ChatCodec

    tok = build_char_tokenizer(with_newlines=True)
    tok.chat_template = (
        "{% if tools %}Tools:{% for t in tools %}\n{{ t.function.name }} {{ t | tojson }}"
        "{% endfor %}\n{% endif %}{% for m in messages %}<{{ m.role }}>{{ m.content }}\n"
        "{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}"
    )
    codec = ChatCodec(tok)
    tools = FunctionTools([add]).schemas
    messages = [{"role": "user", "content": "1+2?"}]
    prompt = tok.decode(codec.prompt_ids(messages, tools))
    assert prompt.startswith("Tools:add {")  # the template trims newlines after tags
    assert '"description": "Add two integers."' in prompt
    assert '"required": ["a", "b"]' in prompt
    assert tok.decode(codec.prompt_ids(messages)) == "<user>1+2?\n<assistant>"
    # The observation after a turn is tokenized against the same tool-bearing prompt.
    turn = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
    conversation = [*messages, {"role": "assistant", "content": turn}]
    obs = codec.observation_ids(
        conversation,
        tok.encode(turn + "\n", add_special_tokens=False),
        [{"role": "tool", "content": "3"}],
        tools,
    )
    assert tok.decode(obs) == "<tool>3\n<assistant>"


def test_tools_a_tokenizer_cannot_render_are_warned_about_once(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from saorl.models.tokenizer import build_char_tokenizer
    from saorl.rollout import episode as agent
    from saorl.rollout.episode import ChatCodec

    monkeypatch.setattr(agent, "_TOOLS_WARNED", set())
    tools = FunctionTools([add]).schemas
    messages = [{"role": "user", "content": "1+2?"}]
    plain = build_char_tokenizer(with_newlines=True)  # no chat template at all
    for _ in range(3):
        ChatCodec(plain).prompt_ids(messages, tools)
    err = capsys.readouterr().err
    assert err.count("saorl: warning: tools (add) were given") == 1, err
    assert "has no chat template: the model never sees their schemas" in err
    toolless = build_char_tokenizer(with_newlines=True)  # a template that never reads `tools`
    toolless.chat_template = "{% for m in messages %}{{ m.content }}{% endfor %}"
    toolless.name_or_path = "toolless"
    ChatCodec(toolless).prompt_ids(messages)  # no tools: nothing to say
    assert capsys.readouterr().err == ""
    for _ in range(2):
        ChatCodec(toolless).prompt_ids(messages, tools)
    err = capsys.readouterr().err
    assert err.count("'toolless' has no chat template that renders tools") == 1, err
    renders = build_char_tokenizer(with_newlines=True)
    renders.chat_template = "{{ tools | tojson }}{% for m in messages %}{{ m.content }}{% endfor %}"
    renders.name_or_path = "renders"
    ChatCodec(renders).prompt_ids(messages, tools)
    assert capsys.readouterr().err == ""


def _step(env: MathToolEnv, call: dict | str) -> tuple[str, dict]:
    text = call if isinstance(call, str) else f"<tool_call>{json.dumps(call)}</tool_call>"
    result = asyncio.run(env.step(text))
    assert not result.done and len(result.observations) == 1
    assert result.observations[0]["role"] == "tool"
    return result.observations[0]["content"], result.info


def test_math_env_runs_calls_and_reports_every_error() -> None:
    tools = FunctionTools([add, boom, slow, aslow, ahello], timeout_s=0.2, max_output_chars=10)
    env = MathToolEnv(fmt="hermes", use_tool=False, functions=tools)
    assert [t["function"]["name"] for t in env.tools] == tools.names
    opening = asyncio.run(env.reset(type("P", (), {"prompt": "1+2?", "answer": "3"})()))
    assert "add, boom, slow, aslow, ahello" in opening[-1]["content"]

    assert _step(env, {"name": "add", "arguments": {"a": 1, "b": 2}}) == (
        "3",
        {"tool_call": True, "tool_status": "ok", "tool": "add"},
    )
    assert _step(env, {"name": "ahello", "arguments": {"name": "a" * 20}})[0].startswith(
        "hello aaaa\n... (16 more characters)"
    )
    cases = {
        "unknown_tool": ({"name": "mul", "arguments": {}}, "unknown tool 'mul'"),
        "bad_arguments": ({"name": "add", "arguments": {"a": 1}}, "missing argument(s) b"),
        "error": ({"name": "boom", "arguments": {"x": 7}}, "raised ValueError: no 7"),
        "timeout": ({"name": "slow", "arguments": {}}, "timed out after 0.2 s"),
    }
    for status, (call, message) in cases.items():
        text, info = _step(env, call)
        assert text.startswith("error: ") and message in text, text
        assert info["tool_status"] == status
    assert _step(env, {"name": "aslow", "arguments": {}})[1]["tool_status"] == "timeout"
    for args, message in [
        ({"a": 1, "b": "2"}, "add: b must be an integer"),
        ({"a": True, "b": 2}, "add: a must be an integer"),
        ({"a": 1, "b": 2, "c": 3}, "unexpected argument(s) c"),
    ]:
        assert message in _step(env, {"name": "add", "arguments": args})[0]
    assert _step(env, "<tool_call>{oops</tool_call>")[1]["tool_status"] == "malformed"
    # A turn without a call is the answer.
    assert asyncio.run(env.step("\\boxed{3}")).reward == 1.0


def test_scale_arguments_are_checked_against_the_schema() -> None:
    tools = FunctionTools([scale])
    ok = {"xs": [1, 2], "factor": 3, "label": None, "mode": "down"}
    assert tools.check(_call("scale", ok)) is None
    assert "xs[1] must be an integer" in tools.check(_call("scale", {"xs": [1, 2.5]}))
    assert "must be one of ['up', 'down']" in tools.check(_call("scale", {"xs": [], "mode": "x"}))


def _call(name: str, args: dict):
    from saorl.toolcalls import ToolCall

    return ToolCall(name, args)


def test_math_env_keeps_the_sandbox_python_tool_beside_functions(tmp_path: Path) -> None:
    (tmp_path / "tools.py").write_text(
        "def add(a: int, b: int) -> int:\n    '''Add.'''\n    return a + b\n"
    )
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i}+1", "answer": i + 1}) + "\n" for i in range(4))
    )
    tools = f'env.tools=["{tmp_path}/tools.py:add"]'
    cfg = load_config(
        None,
        [
            "env.name=math",
            "env.tool_format=hermes",
            f"env.dataset={data}",
            "env.eval_size=1",
            tools,
        ],
    )
    spec = build_env(cfg.env)
    assert spec.stop == ("</tool_call>",) and spec.max_turns == cfg.env.max_turns
    env = spec.make_env()
    assert [t["function"]["name"] for t in env.tools] == ["python", "add"]
    assert _step(env, {"name": "add", "arguments": {"a": 2, "b": 2}})[0] == "4"
    text, info = _step(env, {"name": "python", "arguments": {"code": "print(6*7)"}})
    assert "42" in text and info["tool_status"] == "ok"
    assert "the tools are: add, python" in _step(env, {"name": "nope", "arguments": {}})[0]


def test_config_checks_the_tools(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"env.tools is for env.name = 'math'"):
        load_config(None, ['env.tools=["m:f"]'])
    with pytest.raises(ConfigError, match=r"env.tools is for env.name = 'math'"):
        load_config(None, ["env.name=math", 'env.tools=["m:f"]'])
    with pytest.raises(ConfigError, match="not an import path"):
        load_config(None, ["env.name=math", "env.tool_format=hermes", 'env.tools=["nope"]'])
    cfg = load_config(None, ["env.name=math", "env.tool_format=hermes", 'env.tools=["t.py:f"]'])
    assert cfg.env.tools == [f"{Path.cwd()}/t.py:f"]
    with pytest.raises(ConfigError, match="file not found"):
        FunctionTools(cfg.env.tools)
    with pytest.raises(ConfigError, match="a second tool named 'add'"):
        FunctionTools([add, add])
    llama = load_config(None, ["env.name=math", "env.tool_format=llama3", 'env.tools=["t.py:f"]'])
    assert llama.env.tool_format == "llama3"
    with pytest.raises(ConfigError, match="env 'swe' takes 'code' or 'hermes'"):
        load_config(None, ["env.name=swe", "env.tool_format=llama3"])


def test_math_env_in_llama3_format_from_the_config(tmp_path: Path) -> None:
    data = tmp_path / "d.jsonl"
    data.write_text(
        "".join(json.dumps({"problem": f"{i}+1", "answer": i + 1}) + "\n" for i in range(4))
    )
    cfg = load_config(
        None, ["env.name=math", "env.tool_format=llama3", f"env.dataset={data}", "env.eval_size=1"]
    )
    spec = build_env(cfg.env)
    assert spec.stop == ("<|eom_id|>",)
    env = spec.make_env()
    opening = asyncio.run(env.reset(type("P", (), {"prompt": "1+2?", "answer": "3"})()))
    assert 'a reply that is only {"name": "python", "parameters"' in opening[-1]["content"]
    result = asyncio.run(env.step('{"name": "python", "parameters": {"code": "print(6*7)"}}'))
    assert result.observations[0]["content"].strip() == "42"
    assert asyncio.run(env.step("\\boxed{3}")).reward == 1.0


def echo(x):
    """Return what it got."""
    return x


def fail(x):
    """Raise with what it got."""
    raise ValueError(x)


def test_call_never_raises_on_deeply_nested_arguments() -> None:
    deep: list = []
    for _ in range(5000):
        deep = [deep]
    tools = FunctionTools([scale, echo, fail], max_output_chars=300)
    for name, args, status in [
        ("scale", {"xs": [], "mode": deep}, "bad_arguments"),
        ("scale", {"xs": [deep]}, "bad_arguments"),
        ("echo", {"x": deep}, "ok"),
        ("fail", {"x": deep}, "error"),
    ]:
        text, got = asyncio.run(tools.call(_call(name, args)))
        assert got == status and len(text) <= 400, (name, text[:200])
    assert "ValueError" in asyncio.run(tools.call(_call("fail", {"x": deep})))[0]
    text, status = asyncio.run(tools.call(_call("scale", 5)))  # type: ignore[arg-type]
    assert status == "bad_arguments" and "cannot be checked" in text


def test_error_observations_are_capped_like_results() -> None:
    tools = FunctionTools([scale, fail], max_output_chars=500)
    huge = "x" * 5_000_000
    for call in [
        _call("scale", {"xs": [], "mode": huge}),
        _call(huge, {}),
        _call("scale", {"xs": [], huge: 1}),
        _call("fail", {"x": huge}),
    ]:
        text, status = asyncio.run(tools.call(call))
        assert text.startswith("error: ") and len(text) < 600, status
        assert text.endswith("more characters)") or len(text) <= 500
