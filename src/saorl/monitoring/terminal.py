"""Text from data made safe to print on a terminal.

Task ids, problem text, tool names, model names and error messages quoting them come from
datasets, repositories and endpoints that saorl does not control. Printed raw, an escape
sequence in one of them (OSC: set the window title, write the clipboard, a hyperlink; CSI:
clear the screen, move the cursor over earlier lines) is obeyed by the terminal. `printable`
is the one place that neutralises them; everything saorl prints from data goes through it.
"""

from __future__ import annotations

import contextlib
import re
import sys
from collections.abc import Iterator
from typing import Any

# C0 controls (ESC, BEL, CR, BS, ...), DEL, C1 controls (U+009B is a one-character CSI,
# U+009D an OSC) and the bidirectional overrides and isolates that reorder what is shown
# ("Trojan Source"). Tab and newline stay, unless a single line is wanted.
_UNSAFE = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(value: Any, *, one_line: bool = False) -> str:
    """`str(value)` with every control character written as an escape (`\\x1b`, `\\u202e`);
    with `one_line`, tab and newline too (a table cell, an id)."""
    return (_UNSAFE_LINE if one_line else _UNSAFE).sub(_escape, str(value))


# What tqdm writes on its own (a bar on stderr: `saorl swe-mine`, hub downloads): a carriage
# return that redraws the bar's line, and cursor-up moves between its bars.
_BAR_MOVES = re.compile(r"(\x1b\[A)+")
# Colours (SGR), as Ray prefixes its actors' log lines with: they change no state beyond the
# colour of the text that follows.
_COLOUR = re.compile(r"(\x1b\[[0-9;]*m)")


class EscapedStream:
    """A text stream writing `printable(text)` to `stream` (module docstring); the rest of
    the stream (isatty, fileno, flush, encoding) is `stream`'s. Colours, a carriage return
    opening a write and a write of cursor-up moves only pass as they are: library log lines
    and progress bars are drawn so."""

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, text: str) -> int:
        if _BAR_MOVES.fullmatch(text):
            self.stream.write(text)
        else:
            body = text.lstrip("\r")
            parts = _COLOUR.split(body)  # text, colour, text, ...: the colours kept
            shown = "".join(p if i % 2 else printable(p) for i, p in enumerate(parts))
            self.stream.write(text[: len(text) - len(body)] + shown)
        return len(text)

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


@contextlib.contextmanager
def escaped_output(stdout: bool = False) -> Iterator[None]:
    """`sys.stderr` (and with `stdout`, `sys.stdout`) as `EscapedStream`s while the block runs:
    every message, warning and log line a command prints there. `stdout` is for plain-text
    commands only: rich draws tables and live progress on stdout with escape sequences of its
    own (`saorl eval` passes its data through `printable` instead)."""
    saved = sys.stdout, sys.stderr
    sys.stderr = EscapedStream(sys.stderr)  # type: ignore[assignment]
    if stdout:
        sys.stdout = EscapedStream(sys.stdout)  # type: ignore[assignment]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
