"""The file tools of the coding agent: view, str_replace, create.

Runs INSIDE the sandbox (as `python -I -B -c <this source>`, cwd = the episode's repository copy)
so every file the agent touches is reached through the sandbox's view of the world; reads a JSON
`{"tool": ..., "args": {...}}` on stdin and prints the observation. Pure text helpers
(`number_lines`, `replace_once`) are also used on the host to build demonstrations, so a
demonstrated observation is exactly what the tool prints. Standard library only.

Semantics:
- paths are relative to the repository root (`/sandbox/...` is accepted too) and must stay in it;
- `view` numbers lines from 1; `start`/`end` are inclusive, `end = -1` means the last line; a
  directory lists its entries two levels deep;
- `str_replace` replaces `old` only when it occurs exactly once, else it changes nothing and says
  how many times it occurs (and on which lines);
- `create` makes a new file (and its parent directories) and refuses to overwrite one;
- only regular files are read or edited (a fifo, socket or device is refused, never opened
  for long), and any failure, whatever the path or text, is an `error: ...` observation;
  names that are not UTF-8 are printed as `\\xNN`.
"""

from __future__ import annotations

import json
import os
import stat
import sys

MAX_VIEW_LINES = 400
SKIP = {".git", "__pycache__", ".pytest_cache", ".hypothesis"}


class ToolError(Exception):
    """A mistake in the call; its message is the observation."""


def number_lines(text: str, first: int = 1) -> str:
    return "\n".join(f"{first + i:>5}  {line}" for i, line in enumerate(text.split("\n")))


def replace_once(text: str, old: str, new: str, path: str) -> tuple[str, str]:
    """(`text` with its one occurrence of `old` replaced by `new`, the observation)."""
    if not old:
        raise ToolError("'old' is empty: give the exact text to replace")
    if old == new:
        raise ToolError("'old' and 'new' are identical: nothing would change")
    count = text.count(old)
    if count == 0:
        raise ToolError(
            f"'old' does not occur in {path}; view the file and copy the text exactly, "
            "whitespace and indentation included"
        )
    if count > 1:
        lines = []
        at = -1
        for _ in range(min(count, 10)):
            at = text.find(old, at + 1)
            lines.append(str(text.count("\n", 0, at) + 1))
        raise ToolError(
            f"'old' occurs {count} times in {path} (starting on lines {', '.join(lines)}); "
            "include more surrounding lines so that it occurs exactly once"
        )
    at = text.find(old)
    result = text[:at] + new + text[at + len(old) :]
    first = text.count("\n", 0, at) + 1
    last = first + new.rstrip("\n").count("\n")
    lo = max(first - 3, 1)
    lines = result.split("\n")
    if result.endswith("\n"):
        lines.pop()  # the empty string after the final newline is not a line
    shown = lines[lo - 1 : last + 3]
    return result, (
        f"Edited {path}: replaced 1 occurrence at line {first}. Lines {lo}-{lo + len(shown) - 1}"
        f" now read:\n{number_lines(chr(10).join(shown), lo)}"
    )


def resolve(path: object, root: str) -> tuple[str, str]:
    """(absolute path, path as shown) of `path` inside `root`, or a ToolError."""
    if not isinstance(path, str) or not path.strip():
        raise ToolError("'path' must be a non-empty string, relative to the repository root")
    if "\0" in path:
        raise ToolError("'path' contains a NUL byte, which no path can hold")
    rel = path.strip()
    if os.path.isabs(rel):
        if rel != root and not rel.startswith(root.rstrip("/") + "/"):
            raise ToolError(f"{rel} is outside the repository; paths are relative to its root")
        rel = os.path.relpath(rel, root)
    full = os.path.normpath(os.path.join(root, rel))
    real = os.path.realpath(full)
    real_root = os.path.realpath(root)
    if real != real_root and not real.startswith(real_root + "/"):
        raise ToolError(f"{path} is outside the repository")
    shown = os.path.relpath(full, root)
    return full, shown


def _read(full: str, shown: str) -> str:
    try:
        mode = os.stat(full).st_mode
    except FileNotFoundError:
        raise ToolError(f"{shown} does not exist") from None
    except OSError as e:  # a symlink loop, a path too long, ...
        raise ToolError(f"{shown}: {e.strerror or e}") from None
    if stat.S_ISDIR(mode):
        raise ToolError(f"{shown} is a directory")
    if not stat.S_ISREG(mode):
        raise ToolError(f"{shown} is not a regular file")
    # O_NONBLOCK: a fifo put in the file's place since the check cannot hang the open
    with os.fdopen(os.open(full, os.O_RDONLY | os.O_NONBLOCK), "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise ToolError(f"{shown} is not a regular file")
        os.set_blocking(f.fileno(), True)
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ToolError(f"{shown} is not a UTF-8 text file") from None


def _listing(full: str, shown: str) -> str:
    lines = [f"{shown}/" if shown != "." else "./"]
    for dirpath, dirnames, filenames in os.walk(full):
        dirnames[:] = sorted(d for d in dirnames if d not in SKIP and not d.startswith("."))
        depth = os.path.relpath(dirpath, full).count(os.sep) + (dirpath != full)
        if depth >= 2:
            dirnames[:] = []
        rel = os.path.relpath(dirpath, full)
        prefix = "" if rel == "." else rel + "/"
        lines += [f"  {prefix}{d}/" for d in dirnames]
        lines += [f"  {prefix}{n}" for n in sorted(filenames) if not n.endswith(".pyc")]
    return "\n".join(lines[:MAX_VIEW_LINES])


def view(root: str, path: object, start: object = None, end: object = None) -> str:
    full, shown = resolve(path, root)
    if os.path.isdir(full):
        return _listing(full, shown)
    text = _read(full, shown)
    lines = text.split("\n")
    if text.endswith("\n"):
        lines.pop()
    lo = 1 if start is None else start
    hi = len(lines) if end is None or end == -1 else end
    if not isinstance(lo, int) or not isinstance(hi, int) or lo < 1:
        raise ToolError(f"bad line range start={start!r} end={end!r}: use 1 <= start <= end")
    if lo > max(len(lines), 1):
        raise ToolError(f"{shown} has {len(lines)} lines; start={lo} is past the end")
    if hi < lo:
        raise ToolError(f"bad line range start={start!r} end={end!r}: use 1 <= start <= end")
    hi = min(hi, len(lines), lo + MAX_VIEW_LINES - 1)
    return number_lines("\n".join(lines[lo - 1 : hi]), lo)


def str_replace(root: str, path: object, old: object, new: object) -> str:
    if not isinstance(old, str) or not isinstance(new, str):
        raise ToolError("'old' and 'new' must be strings")
    full, shown = resolve(path, root)
    result, message = replace_once(_read(full, shown), old, new, shown)
    with open(full, "w", encoding="utf-8", newline="") as f:
        f.write(result)
    return message


def create(root: str, path: object, content: object) -> str:
    if not isinstance(content, str):
        raise ToolError("'content' must be a string")
    full, shown = resolve(path, root)
    if os.path.lexists(full):
        raise ToolError(f"{shown} already exists; edit it with str_replace")
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "x", encoding="utf-8", newline="") as f:
        f.write(content)
    return f"Created {shown} ({len(content.splitlines())} lines)."


def main() -> int:
    spec = json.loads(sys.stdin.read())
    tool = spec["tool"]
    args = spec["args"]
    root = os.getcwd()
    try:
        if tool == "view":
            out = view(root, args.get("path"), args.get("start"), args.get("end"))
        elif tool == "str_replace":
            out = str_replace(root, args.get("path"), args.get("old"), args.get("new"))
        elif tool == "create":
            out = create(root, args.get("path"), args.get("content"))
        else:
            out = f"error: unknown file tool {tool!r}"
    except ToolError as e:
        out = f"error: {e}"
    except OSError as e:
        out = f"error: {e.strerror or e}"
    except (ValueError, RecursionError) as e:  # text no file can hold, a path too deep, ...
        out = f"error: {type(e).__name__}: {e}"
    sys.stdout.buffer.write(_encode(out))
    return 0


def _encode(text: str) -> bytes:
    """`text` as UTF-8, a name's bytes that are not UTF-8 written `\\xNN`."""
    try:
        raw = text.encode("utf-8", errors="surrogateescape")
    except UnicodeEncodeError:  # a surrogate that is no escaped byte
        return text.encode("utf-8", errors="backslashreplace")
    return raw.decode("utf-8", errors="backslashreplace").encode("utf-8")


if __name__ == "__main__":
    sys.exit(main())
