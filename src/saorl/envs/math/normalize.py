"""String-level reading of a math answer, for the grader's fast path (`saorl.envs.math.grader`).

    normalize_answer("$\\dfrac{1}{2}$")        # "\\frac{1}{2}"
    count_alternatives("x = 1 \\text{ or } 2")  # 2

`normalize_answer` gives the canonical form for the fast equality check. `count_alternatives`
counts the alternatives a hedged answer offers ("1 or 2"), which the grader turns into a 0 when
the reference is a single item. It reads the answer after `normalize_answer`'s markup
stripping, with Unicode operators mapped to their macros and redundant `{...}` groups ignored,
so `{1 \\lor 2}`, `1 \u2228 2` and `1 \\operatorname{or} 2` are all seen. Separators:
- disjunctions, anywhere, even inside an argument (`2^{1 \\lor 2}`): the word `or` (also from
  `\\text{ or }`, `\\mathrm{or}`, "either 1 or 2", "and/or"), `\\lor`, `\\vee`, `\u2228`;
- list separators, only outside brackets, set braces, arguments and environments (where they
  are structure: `\\{x \\mid x > 0\\}`, `(1, 2]`, a matrix's `&` and `\\\\`): `,` `;` `&`
  `\\&`, the word `and`, `\\land` `\\wedge` `\u2227`, `\\mid`, `\\parallel`, the row breaks
  `\\\\` `\\newline` `\\cr`; and `\\cup` `\u222a` unless the reference is itself a set or an
  interval (`is_set_valued`; then a union can be the right answer: `[1,2) \\cup [2,3]` for
  `[1,3]`);
- bars: `|` (`\\vert`) and `\\|` come in pairs around an absolute value or a norm, so an
  odd number of them outside brackets means one separates (`1 | 2`).
- plus-minus: `\\pm`, `\\mp`, anywhere: math-verify reads `1 \\pm 2` as the set {-1, 3}, so
  such a reference has two items (an answer listing both values is not a hedge) and such an
  answer offers two.
Not separators: `/` (a fraction; math-verify grades `1/2` by its value, which no single
alternative shares), capital `OR`/`AND` (point names, as in segment `OR`), relations and other
operators (`\\to`, `\\sim`, `\\oplus`, ...: the grader's math-verify path gives them no
credit).

All functions are pure and linear in the length of their input.
"""

from __future__ import annotations

import re

_LEFT_RIGHT_RE = re.compile(r"\\(?:left|right|middle|[bB]igg?[lrm]?)(?![A-Za-z])")
# `\\` (a row break) is matched first so that its second backslash is never read as `\ `.
_SPACING_RE = re.compile(r"\\\\|\\[!,;:> ]|\\q?quad(?![A-Za-z])")
_FRAC_RE = re.compile(r"\\[dt]frac(?![A-Za-z])")
# Macros whose argument is shown as it is (text, fonts, operator names): unwrapped.
_WRAPPERS = (
    "text|textrm|textbf|textit|textsf|texttt|textup|textnormal|textmd|textsl|emph|mbox|hbox"
    "|mathrm|mathbf|mathit|mathsf|mathtt|mathnormal|operatorname|mathrel|mathbin"
)
# A wrapper's opening, an escaped character (content), or a brace.
_WRAPPER_SCAN_RE = re.compile(
    rf"(?P<wrapper>\\(?:{_WRAPPERS})(?![A-Za-z])\s*\{{)|\\.|[{{}}]", re.DOTALL
)
_WHITESPACE_RE = re.compile(r"\s+")
# Space between two digits is kept (as one space): `32 349` is not 32349 (math-verify reads a
# product), `1\,000` not 1000.
_DIGIT_GAP_RE = re.compile(r"(?<=\d)\s+(?=\d)")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")
# `32,\!348`: the typeset thousands separator (a comma pulled to the digits), as `{,}` is.
_TYPESET_SEPARATOR_RE = re.compile(r"(?<=\d),\\!\s*(?=\d)")


def _unwrap(s: str) -> str:
    """`s` without the `\\text{`-style openings in `_WRAPPERS` and their closing braces, nested
    ones too, in one pass."""
    pieces: list[str] = []
    kept_from = 0
    wrapper_braces: list[bool] = []  # per open brace: does it close a wrapper?
    for token in _WRAPPER_SCAN_RE.finditer(s):
        if token.lastgroup == "wrapper":
            pieces.append(s[kept_from : token.start()])
            kept_from = token.end()
            wrapper_braces.append(True)
        elif token[0] == "{":
            wrapper_braces.append(False)
        elif token[0] == "}" and wrapper_braces and wrapper_braces.pop():
            pieces.append(s[kept_from : token.start()])
            kept_from = token.end()
    pieces.append(s[kept_from:])
    return "".join(pieces)


def _strip_markup(s: str) -> str:
    """Drop presentation-only LaTeX, keeping whitespace (word boundaries matter for hedges)."""
    s = s.replace("\\$", "").replace("$", "")
    s = _TYPESET_SEPARATOR_RE.sub(",", s)
    s = _LEFT_RIGHT_RE.sub("", s)
    s = _SPACING_RE.sub(lambda m: m[0] if m[0] == "\\\\" else " ", s)
    s = _FRAC_RE.sub(r"\\frac", s)
    return _unwrap(s).replace("{,}", ",")


def normalize_answer(answer: str) -> str:
    """Canonical string form for the fast equality check (never used to reject an answer).

    Removes whitespace (space between two digits becomes one space: `32 349` is two numbers),
    `$` (and `\\$`), `\\left`/`\\right`/`\\big`..., `\\!`/`\\,`/`\\;`/`\\quad`,
    `\\text{...}`-style wrappers (`_WRAPPERS`) and the thousands separators of a well-formed
    number (`1,000`, `1{,}000`, `1,\\!000` -> `1000`; a comma with space around it, or not
    followed by a group of three digits, is a list: `32, 349`, `1,00`); maps `\\dfrac` and
    `\\tfrac` to `\\frac`. A trailing period stays: math-verify does not read `\\boxed{42.}` as
    42. Linear in `len(answer)`.
    """
    stripped = _strip_markup(answer).strip()
    if _THOUSANDS_RE.fullmatch(stripped):  # no space anywhere inside
        return stripped.replace(",", "")
    return _WHITESPACE_RE.sub("", _DIGIT_GAP_RE.sub("\0", stripped)).replace("\0", " ")


# One token per environment boundary, macro, escaped character, word, number, run of spaces or
# other character.
_HEDGE_TOKEN_RE = re.compile(
    r"(?P<environment>\\(?:begin|end)\s*\{[^{}]*\})|\\[A-Za-z]+|\\.|[A-Za-z]+|\d+|\s+|.",
    re.DOTALL,
)
_UNICODE_OPERATORS = str.maketrans(
    {
        "\u2228": " \\lor ",  # ∨
        "\u22c1": " \\lor ",  # ⋁
        "\u2227": " \\land ",  # ∧
        "\u22c0": " \\land ",  # ⋀
        "\u222a": " \\cup ",  # ∪
        "\u2223": " \\mid ",  # ∣
        "\u2016": " \\| ",  # ‖
    }
)
_OPENERS = frozenset({"(", "[", r"\{", r"\langle", r"\lbrace", r"\lbrack", r"\lceil", r"\lfloor"})
_CLOSERS = frozenset({")", "]", r"\}", r"\rangle", r"\rbrace", r"\rbrack", r"\rceil", r"\rfloor"})
# Separate at any depth; `a \pm b` is two values, as math-verify reads it ({a - b, a + b}).
_DISJUNCTIONS = frozenset({"or", r"\lor", r"\vee", r"\pm", r"\mp"})
_SEPARATORS = frozenset(  # separate at the top level only
    {",", ";", "&", r"\&", "and", r"\land", r"\wedge", r"\mid", r"\parallel"}
    | {r"\\", r"\newline", r"\cr"}  # row breaks
)
_BARS = frozenset({"|", r"\vert", r"\lvert", r"\rvert"})
_DOUBLE_BARS = frozenset({r"\|", r"\Vert", r"\lVert", r"\rVert"})
_BEFORE_ARGUMENT = frozenset({"^", "_", "}", "]"})  # `x^{...}`, `\frac{.}{...}`, `\sqrt[3]{...}`
_SET_MARKER_RE = re.compile(
    r"\\(?:cup|cap|setminus|emptyset|varnothing|infty|mathbb|in)(?![A-Za-z])|\\\{"
    "|[\u222a\u2229\u2205\u221e]"  # ∪ ∩ ∅ ∞
)
_THREE_DIGITS_RE = re.compile(r"\d{3}(?!\d)")
_BRACKETED_RE = re.compile(r"[(\[\]].*[)\]\[]", re.DOTALL)  # `(1,2]`, `]0, 1[`


def count_alternatives(answer: str, unions: bool = True) -> int:
    """How many alternatives `answer` offers (see the module doc). `unions`: whether
    `\\cup` separates. One pass over the tokens: linear in `len(answer)`."""
    s = _strip_markup(answer).translate(_UNICODE_OPERATORS)
    items = depth = bars = double_bars = 0
    filled = False  # the current item has content
    arguments: list[bool] = []  # per open `{`: a macro's argument (structure) or a bare group
    previous = ""
    previous_end = -1
    for match in _HEDGE_TOKEN_RE.finditer(s):
        token = match[0]
        if token.isspace():
            continue
        if (
            token == ","
            and previous.isdigit()
            and previous_end == match.start()
            and _THREE_DIGITS_RE.match(s, match.end())
        ):
            token = "0"  # `1,500`: a thousands separator, content like the digits around it
        if token == "{":
            argument = previous in _BEFORE_ARGUMENT or (
                previous[:1] == "\\" and previous[1:2].isalpha()
            )
            arguments.append(argument)
            depth += argument
        elif token == "}":
            if arguments and arguments.pop():
                depth -= 1
        elif match.lastgroup == "environment":
            depth += 1 if token.startswith("\\begin") else -1
            filled = True
        elif token in _OPENERS or token in _CLOSERS:
            depth += 1 if token in _OPENERS else -1
            filled = True
        elif token in _DISJUNCTIONS or (
            depth == 0 and (token in _SEPARATORS or (unions and token == "\\cup"))
        ):
            items += filled
            filled = False
        elif depth == 0 and token in _BARS:
            bars += 1
        elif depth == 0 and token in _DOUBLE_BARS:
            double_bars += 1
        else:
            filled = True
        previous = token
        previous_end = match.end()
    # Bars pair up around an absolute value (norm); an odd one out separates, as in `1 | 2`.
    return items + filled + bars % 2 + double_bars % 2


def is_set_valued(normalized_reference: str) -> bool:
    """Whether the reference is a set or an interval, which a union of sets may equal."""
    return bool(
        _SET_MARKER_RE.search(normalized_reference) or _BRACKETED_RE.fullmatch(normalized_reference)
    )
