"""The coding agent's file tools and call parsing, called directly (the sandbox runs the same
functions; tests/integration/test_swe_env.py goes through it)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from saorl.envs.swe.sandbox_tools import ToolError, create, replace_once, str_replace, view
from saorl.envs.swe.tools import check_arguments, parse
from saorl.toolcalls import ToolCall, ToolCallError

TEXT = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g(x):\n    y = x + 1\n    return 2 * y\n"


def test_replace_once_replaces_exactly_one_occurrence_and_shows_the_region():
    new_text, message = replace_once(TEXT, "    return y\n", "    return y - 1\n", "m.py")
    assert new_text == TEXT.replace("    return y\n", "    return y - 1\n")
    assert message.startswith("Edited m.py: replaced 1 occurrence at line 3. Lines 1-6 now read:")
    assert "    3      return y - 1" in message


@pytest.mark.parametrize(
    ("old", "new", "error"),
    [
        ("    y = x + 1\n", "    y = x\n", "'old' occurs 2 times in m.py (starting on lines 2, 7)"),
        ("nope", "x", "'old' does not occur in m.py"),
        ("", "x", "'old' is empty"),
        ("def f", "def f", "'old' and 'new' are identical"),
    ],
)
def test_replace_once_errors_change_nothing(old, new, error):
    with pytest.raises(ToolError, match=error.replace("(", r"\(").replace(")", r"\)")):
        replace_once(TEXT, old, new, "m.py")


def test_file_tools_on_a_directory(tmp_path: Path):
    root = str(tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text(TEXT)
    assert view(root, "pkg/m.py", 2, 3) == "    2      y = x + 1\n    3      return y"
    assert view(root, root + "/pkg/m.py", 8, -1) == "    8      return 2 * y"  # absolute, inside
    assert view(root, ".").splitlines()[:3] == ["./", "  pkg/", "  pkg/m.py"]
    out = str_replace(root, "pkg/m.py", "return 2 * y", "return 3 * y")
    assert "replaced 1 occurrence at line 8" in out
    assert (tmp_path / "pkg" / "m.py").read_text().endswith("return 3 * y\n")
    assert create(root, "pkg/sub/new.py", "a = 1\nb = 2\n") == "Created pkg/sub/new.py (2 lines)."
    assert (tmp_path / "pkg" / "sub" / "new.py").read_text() == "a = 1\nb = 2\n"


@pytest.mark.parametrize(
    ("call", "error"),
    [
        (lambda r: view(r, "../etc/passwd"), "outside the repository"),
        (lambda r: view(r, "/etc/passwd"), "outside the repository"),
        (lambda r: view(r, "missing.py"), "does not exist"),
        (lambda r: view(r, "m.py", 5, 2), "bad line range"),
        (lambda r: view(r, "m.py", 50), "has 8 lines"),
        (lambda r: create(r, "m.py", "x"), "already exists"),
        (lambda r: str_replace(r, "link.py", "def", "fed"), "outside the repository"),
        (lambda r: view(r, "fifo"), "fifo is not a regular file"),
        (lambda r: str_replace(r, "fifo", "a", "b"), "fifo is not a regular file"),
        (lambda r: view(r, "loop"), "loop: Too many levels of symbolic links"),
        (lambda r: view(r, "m.py\0"), "NUL"),
    ],
)
def test_file_tool_errors(tmp_path: Path, call, error):
    (tmp_path / "m.py").write_text(TEXT)
    (tmp_path / "link.py").symlink_to("/etc/hostname")
    os.mkfifo(tmp_path / "fifo")  # opening it to read would block until a writer came
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(ToolError, match=error):
        call(str(tmp_path))
    assert (tmp_path / "m.py").read_text() == TEXT


def test_parse_both_formats_and_check_arguments():
    assert parse("<bash>ls -la</bash>", "code") == ToolCall("bash", {"command": "ls -la"})
    assert parse("I am done.", "code") is None
    assert isinstance(parse("<bash>ls", "code"), ToolCallError)
    call = parse('<tool_call>{"name": "view", "arguments": {"path": "a.py"}}</tool_call>', "hermes")
    assert call == ToolCall("view", {"path": "a.py"}) and check_arguments(call) is None
    assert "unknown tool 'rm'" in check_arguments(ToolCall("rm", {}))
    assert "needs the string argument 'old'" in check_arguments(
        ToolCall("str_replace", {"path": "a", "new": "b"})
    )
    assert "must be an integer" in check_arguments(ToolCall("view", {"path": "a", "start": "1"}))
    assert "unknown argument(s) 'force'" in check_arguments(
        ToolCall("create", {"path": "a", "content": "", "force": True})
    )
    assert check_arguments(ToolCall("submit", {})) is None
