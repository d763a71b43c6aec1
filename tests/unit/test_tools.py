"""Tool-call parsing: well-formed calls, answers without calls, and readable errors."""

from __future__ import annotations

import pytest

from saorl.toolcalls import (
    ToolCall,
    ToolCallError,
    parse_tool_call,
    render_tool_call,
    stop_strings,
)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "let me compute <python>\nprint(2**10)\n</python>",
            ToolCall("python", {"code": "print(2**10)"}),
        ),
        (
            "<python>a=1</python> then <python>print(a)</python>",
            ToolCall("python", {"code": "print(a)"}),
        ),
        ("the answer is \\boxed{4}", None),
        ("<python>print(1)", ToolCallError("unterminated <python> block: close it with </python>")),
    ],
)
def test_code_format(text, expected):
    assert parse_tool_call(text, "code") == expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>',
            ToolCall("python", {"code": "print(1)"}),
        ),
        (
            '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"x\\"}"}</tool_call>',
            ToolCall("python", {"code": "x"}),
        ),
        ("no call here", None),
    ],
)
def test_hermes_format(text, expected):
    assert parse_tool_call(text, "hermes") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ("<tool_call>{not json}</tool_call>", "not valid JSON"),
        ('<tool_call>{"arguments": {}}</tool_call>', '"name"'),
        ('<tool_call>{"name": "python", "arguments": [1]}</tool_call>', "JSON object"),
        ('<tool_call>{"name": "python"', "unterminated"),
    ],
)
def test_malformed_hermes_calls_become_readable_errors(text, fragment):
    result = parse_tool_call(text, "hermes")
    assert isinstance(result, ToolCallError) and fragment in result.message


def test_stop_strings():
    assert stop_strings("code") == ["</python>"]
    assert stop_strings("hermes") == ["</tool_call>"]
    assert stop_strings("llama3") == ["<|eom_id|>"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            '{"name": "python", "parameters": {"code": "print(1)"}}',
            ToolCall("python", {"code": "print(1)"}),
        ),
        (
            '<|python_tag|>{"name": "add", "parameters": {"a": 1, "b": 2}}\n',
            ToolCall("add", {"a": 1, "b": 2}),
        ),
        ('  {"name": "add", "arguments": {"a": 1}}', ToolCall("add", {"a": 1})),
        (
            '{"name": "f", "parameters": {}}; {"name": "g", "parameters": {"x": 1}}',
            ToolCall("g", {"x": 1}),
        ),
        ('{"name": "f", "parameters": "{\\"x\\": 2}"}', ToolCall("f", {"x": 2})),
        ('{"name": "f"}', ToolCall("f", {})),
        ("The answer is \\boxed{4}", None),
        ("so the set is \\boxed{\\{1, 2\\}}", None),
    ],
)
def test_llama3_format(text, expected):
    assert parse_tool_call(text, "llama3") == expected


@pytest.mark.parametrize(
    ("text", "fragment"),
    [
        ('{"name": "python", "parameters": {"code": "print(1)"', "not valid JSON"),
        ('{"parameters": {}}', '"name"'),
        ('{"name": "f", "parameters": [1]}', "JSON object"),
        ('{"name": "f", "parameters": {}} and then I answer', "text after the tool call"),
        ("{" * 100_000 + "}" * 100_000, "JSON"),
    ],
)
def test_malformed_llama3_calls_become_readable_errors(text, fragment):
    result = parse_tool_call(text, "llama3")
    assert isinstance(result, ToolCallError) and fragment in result.message


@pytest.mark.parametrize("fmt", ["hermes", "llama3"])
def test_a_rendered_call_parses_back(fmt):
    # (A hermes argument cannot hold "</tool_call>": generation stops there, by design.)
    args = {"code": 'print("a;{}")\nx = {"k": 1}', "n": [1, {"k": None}]}
    assert parse_tool_call(render_tool_call("python", args, fmt), fmt) == ToolCall("python", args)


@pytest.mark.parametrize(
    "payload",
    [
        "[" * 100_000 + "]" * 100_000,  # past the JSON decoder's recursion limit
        '{"name": "calc", "arguments": {"x": ' + "9" * 5000 + "}}",  # past int's digit limit
        '{"name": "calc", "arguments": "' + "[" * 100_000 + '"}',  # double-encoded, too deep
    ],
)
def test_hostile_hermes_payloads_are_error_observations_not_exceptions(payload):
    call = parse_tool_call(f"<tool_call>{payload}</tool_call>", "hermes")
    assert isinstance(call, ToolCallError)
    assert "JSON" in call.message
