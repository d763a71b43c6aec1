"""Which boxes of a response make its final answer, read as math-verify reads them.

    extract_boxes("so $x = \\boxed{-2}$ and $x = \\boxed{1}$.")   # ["-2", "1"]
    extract_boxes("first \\boxed{3}. <a long check> So \\boxed{5}.")  # ["5"]
    extract_boxed("\\boxed{1}, \\boxed{2}")                          # "2": the last box only

math-verify (0.9, `parser.py` and latex2sympy2_extended's `extract_boxed_content`) finds the
answer in one of two ways, whichever match ends further right:
- the last math environment holding a box (`$...$`, `$$...$$`, `\\[...\\]`, `\\(...\\)`), with
  up to five such environments before it joined by `,`, `and` or `or` (`$\\boxed{1}$ and
  $\\boxed{2}$`; `\\text{ and }` between them does not join); every box inside those
  environments counts;
- otherwise (no environment, or text with a `}` after it), the last box and, going back, each
  earlier box while the text between the two is under 10 characters (`\\boxed{1}, \\boxed{2}`)
  or under 70 characters holding `and`, `or`, `,` or `;` and the two boxes differ
  (`\\boxed{-2} \\quad\\text{and}\\quad \\boxed{1}`). A box far from the next one (an intermediate
  result) ends the answer.
Consecutive identical boxes count once. Several boxes are then one answer, a list: the grader
joins them with ", ", so `\\boxed{(1, 2)}, \\boxed{(2, 1)}` answers `(2,1),(1,2)` in any order.

Differences kept on purpose: the last box must close (math-verify reads a truncated last box to
the end of the text: a truncated response has no final answer here), `\\fbox` counts like
`\\boxed` (math-verify's pattern sees only `\\boxed`), escaped braces are content.

All functions are pure and linear in the length of the text: each box's braces are scanned no
further than the next box, each environment's delimiters are searched once.
"""

from __future__ import annotations

import re

_BOXED_RE = re.compile(r"\\(?:boxed|fbox)\s*\{")
_BRACE_RE = re.compile(r"\\.|[{}]", re.DOTALL)  # an escaped character is content
_NEAR_CHARS = 10
_SEPARATED_CHARS = 70
_BOX_SEPARATOR_RE = re.compile(r"\b(?:and|or)\b|,|;")
# math-verify's join between two environments (`\s*(?:,?and|,?or|,)\s*`), matched backwards
# from an environment's opening: the text before it ends with this.
_ENV_JOIN_RE = re.compile(r"(?:,?and|,?or|,)\s*\Z")
_MAX_JOINED_ENVS = 5
_UNESCAPED_DOLLAR_RE = re.compile(r"(?<!\\)\$")


def _box_close(text: str, start: int, end: int) -> int | None:
    """Where the box whose content starts at `start` closes (the index of its `}`), looking no
    further than `end`; None when it does not close there."""
    depth = 1
    for brace in _BRACE_RE.finditer(text, start, end):
        if brace[0] == "{":
            depth += 1
        elif brace[0] == "}":
            depth -= 1
            if depth == 0:
                return brace.start()
    return None


def _boxes_in(text: str, start: int, end: int) -> list[str]:
    """Every closed box in `text[start:end]`, in order, consecutive repeats once."""
    boxes: list[str] = []
    position = start
    while (box := _BOXED_RE.search(text, position, end)) is not None:
        close = _box_close(text, box.end(), end)
        if close is None:
            break
        content = text[box.end() : close].strip()
        if not boxes or boxes[-1] != content:
            boxes.append(content)
        position = close + 1
    return boxes


def _enclosing_env(text: str, start: int, end: int) -> tuple[int, int] | None:
    """(opening, end of closing) of the math environment around `text[start:end]`, or None."""
    line_start = text.rfind("\n", 0, start) + 1
    line_end = text.find("\n", end)
    line_end = len(text) if line_end < 0 else line_end
    for opener, closer, one_line in (
        ("$$", "$$", False),
        ("\\[", "\\]", False),
        ("\\(", "\\)", True),
    ):
        i = text.rfind(opener, line_start if one_line else 0, start)
        if i < 0 or (i > 0 and text[i - 1] == "\\") or closer in text[i + 2 : start]:
            continue
        j = text.find(closer, end, line_end if one_line else len(text))
        if j >= 0 and opener not in text[end:j]:
            return i, j + len(closer)
    opening = text.rfind("$", line_start, start)
    while opening > 0 and text[opening - 1] == "\\":  # `\\$` is a dollar sign, not math
        opening = text.rfind("$", line_start, opening - 1)
    after = _UNESCAPED_DOLLAR_RE.search(text, end, line_end)
    if opening >= 0 and after is not None and not (opening > 0 and text[opening - 1].isdigit()):
        return opening, after.end()
    return None


def _previous_env(text: str, opening: int) -> tuple[int, int] | None:
    """The environment holding a box that `_ENV_JOIN_RE` joins to one opening at `opening`."""
    window = max(0, opening - 64)
    join = _ENV_JOIN_RE.search(text, window, opening)
    if join is None:
        return None
    close_end = window + len(text[window : join.start()].rstrip())
    for closer in ("$", "\\]", "\\)"):
        if text.endswith(closer, 0, close_end):
            last_box = text.rfind("\\boxed", 0, close_end)
            box_open = _BOXED_RE.match(text, last_box) if last_box >= 0 else None
            if box_open is None:
                return None
            close = _box_close(text, box_open.end(), close_end)
            env = None if close is None else _enclosing_env(text, last_box, close + 1)
            return env if env is not None and env[1] == close_end else None
    return None


def extract_boxes(text: str, max_chars: int | None = None, group: bool = True) -> list[str] | None:
    """The boxes of the response's final answer, in order (module doc); with `group=False` the
    last box alone. None when there is no box, the last one never closes, or the boxes add up
    to more than `max_chars` characters."""
    opens = list(_BOXED_RE.finditer(text))
    if not opens:
        return None
    last = opens[-1]
    limit = len(text) if max_chars is None else min(len(text), last.end() + max_chars + 1)
    close = _box_close(text, last.end(), limit)
    if close is None:
        return None
    if not group or len(opens) == 1:  # one box: both ways read it alone
        return [text[last.end() : close].strip()]
    env = _enclosing_env(text, last.start(), close + 1)
    if env is not None and text.rfind("}", env[1]) < 0:  # the environment match ends rightmost
        envs = [env]
        while len(envs) <= _MAX_JOINED_ENVS and (env := _previous_env(text, envs[0][0])):
            envs.insert(0, env)
        boxes = [box for start, end in envs for box in _boxes_in(text, start, end)]
        boxes = [b for i, b in enumerate(boxes) if i == 0 or boxes[i - 1] != b]
    else:
        boxes = _last_boxes(text, opens, close)
    if max_chars is not None and sum(len(b) + 1 for b in boxes) > max_chars + 1:
        return None
    return boxes


def _last_boxes(text: str, opens: list[re.Match[str]], close: int) -> list[str]:
    """The last box and the boxes before it within reach (module doc, second way)."""
    boxes = [text[opens[-1].end() : close].strip()]  # last first
    following = opens[-1].start()
    for box in reversed(opens[:-1]):
        close_at = _box_close(text, box.end(), following)
        if close_at is None:
            break
        content = text[box.end() : close_at].strip()
        between = text[close_at + 1 : following]
        near = len(between) < _NEAR_CHARS
        separated = len(between) < _SEPARATED_CHARS and _BOX_SEPARATOR_RE.search(between)
        if not (near or (content != boxes[-1] and separated)):
            break
        if content != boxes[-1]:
            boxes.append(content)
        following = box.start()
    return boxes[::-1]


def extract_boxed(text: str, max_chars: int | None = None) -> str | None:
    """The content of the last `\\boxed{...}` / `\\fbox{...}` in `text`, stripped.

    Braces are matched by depth; escaped braces (`\\{`, `\\}`) are content, not structure. Returns
    None when there is no boxed answer, when the last one never closes (a truncated response
    has no final answer; an earlier, complete box is not used in its place) or when its content
    is longer than `max_chars` (the scan stops there).
    """
    boxes = extract_boxes(text, max_chars, group=False)
    return None if boxes is None else boxes[0]
